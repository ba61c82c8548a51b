"""Streaming DiLoCo's fragments: which parameters sync in which round, and their outer state.

Use it through :class:`~torchnext.distributed.training.semisync.DiLoCo` with
``SyncConfig(fragments=F)`` (F > 1): the model's trainable parameters are cut into F
contiguous fragments of about equal element count (:func:`fragment_plan`); round ``r``
syncs fragment ``r % F`` after ``H / F`` inner steps, so fragment ``f`` syncs at inner
steps ``t`` with ``(t - (f + 1) H / F) % H == 0``: every H inner steps, at offsets
spread evenly over H (streaming DiLoCo, Douillard et al., 2025). Each sync moves 1/F of
the model, and the peak bandwidth drops by F.

:class:`FragmentedOuter` holds what the members agree on: the global copy of every
parameter (at its fragment's last sync) and the outer Nesterov SGD over them. Its
:attr:`FragmentedOuter.holder` is the module the training manager sees as "the model":
it heals, checkpoints and fingerprints the global copies, and its one trainable
parameter, ``pseudo_grad`` (as long as the largest fragment), carries the fragment's
pseudo-gradient through the manager's gradient all-reduce, so a sync is exactly one
all-reduce of one fragment, with the manager's vote and failure handling. The outer
SGD skips parameters without a gradient, so its momentum is kept per fragment.

With replica groups (FSDP2 inside a group, parameters are ``DTensor`` shards) the
fragments are planned on the global sizes, so every process cuts the model the same
way, and the carrier holds this process's local shards of the fragment: it is summed
with the same shard index of the other groups (the holder says so through
``holds_local_shards``).

What not to assume: between two syncs of a fragment the members' local copies of it
differ by design; only the global copies (``manager.checksum()``) are identical after
every committed round. All trainable parameters must share one dtype (the
pseudo-gradient is one flat tensor). This module never communicates itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchnext.compat.fsdp_internals import local_tensor, wrap_like

__all__ = ["fragment_plan", "FragmentedOuter"]


def fragment_plan(numels: Sequence[int], fragments: int) -> list[list[int]]:
    """Cut parameters (given by their element counts, in order) into ``fragments``
    contiguous, non-empty runs of about equal element count; the indices of each run."""
    n = len(numels)
    if not isinstance(fragments, int) or isinstance(fragments, bool) or fragments < 1:
        raise ValueError(f"fragment_plan(fragments={fragments!r}): give an int >= 1.")
    if fragments > n:
        raise ValueError(
            f"SyncConfig(fragments={fragments}): the model has only {n} trainable parameter "
            f"tensors, and a fragment holds at least one; give fragments <= {n}."
        )
    total = sum(numels)
    cum = [0]
    for k in numels:
        cum.append(cum[-1] + k)
    bounds = [0]
    for k in range(1, fragments):
        target = total * k / fragments
        # First cut where the running size reaches the target, kept so that every
        # fragment (this one and the ones still to come) gets at least one tensor.
        cut = next((i for i in range(1, n + 1) if cum[i] >= target), n)
        cut = max(bounds[-1] + 1, min(cut, n - (fragments - k)))
        bounds.append(cut)
    bounds.append(n)
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class _Holder(torch.nn.Module):
    """The manager's "model": the global copies (buffers) and the pseudo-gradient carrier."""

    holds_local_shards = True
    """Its one parameter, the carrier, holds this process's local shards (replica groups
    sum it shard index by shard index, as they do a sharded gradient)."""

    def __init__(self, global_params: Sequence[torch.Tensor], carrier_numel: int) -> None:
        super().__init__()
        for i, g in enumerate(global_params):
            self.register_buffer(f"g{i}", g)
        dtype = global_params[0].dtype
        self.pseudo_grad = torch.nn.Parameter(torch.zeros(carrier_numel, dtype=dtype))


class FragmentedOuter:
    """Global copies, fragment plan and outer optimizer of streaming DiLoCo (module docstring)."""

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        *,
        fragments: int,
        outer_lr: float,
        outer_momentum: float,
        nesterov: bool,
    ) -> None:
        self.params = list(params)
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(
                f"DiLoCo(config=SyncConfig(fragments={fragments})): the trainable parameters "
                f"have dtypes {sorted(str(d) for d in dtypes)}; streaming syncs one flat "
                "tensor per fragment, so give them one dtype (or use fragments=1)."
            )
        self.plan = fragment_plan([p.numel() for p in self.params], fragments)
        self.global_params = [p.detach().clone() for p in self.params]
        """Every parameter as of its fragment's last sync (what the outer optimizer steps)."""
        carrier = max(sum(local_tensor(self.params[i]).numel() for i in frag) for frag in self.plan)
        self.holder = _Holder(self.global_params, carrier)
        self.outer_optimizer = torch.optim.SGD(
            self.global_params, lr=outer_lr, momentum=outer_momentum, nesterov=nesterov
        )

    @property
    def fragments(self) -> int:
        return len(self.plan)

    def fragment_of(self, round_index: int) -> int:
        """The fragment round ``round_index`` (0-based, committed rounds before it) syncs."""
        return round_index % len(self.plan)

    def fragment_bytes(self, fragment: int) -> int:
        """Bytes of the fragment's parameters on this process (its local shards with
        replica groups), without the carrier's padding."""
        locals_ = [local_tensor(self.params[i]) for i in self.plan[fragment]]
        return sum(t.numel() * t.element_size() for t in locals_)

    def start_local(self) -> None:
        """Set the local parameters to the global copies (the first round's start)."""
        with torch.no_grad():
            for g, p in zip(self.global_params, self.params, strict=True):
                p.copy_(g)

    def set_pseudo_gradient(self, fragment: int, world_size: int) -> None:
        """Put ``(global - local) / world_size`` of ``fragment`` into the carrier's grad;
        summed over the members by the manager, it is the mean pseudo-gradient."""
        carrier = self.holder.pseudo_grad
        flat = torch.zeros_like(carrier)
        offset = 0
        with torch.no_grad():
            for i in self.plan[fragment]:
                g, p = local_tensor(self.global_params[i]), local_tensor(self.params[i])
                n = g.numel()
                flat[offset : offset + n].copy_(((g - p) / world_size).reshape(-1))
                offset += n
        carrier.grad = flat

    def outer_step(self, fragment: int) -> None:
        """The committed sync: outer SGD on the fragment's global copies, which the local
        copies then take; the other fragments (and their momentum) are untouched."""
        carrier = self.holder.pseudo_grad
        summed = carrier.grad
        if summed is None:
            raise RuntimeError("internal error: the fragment sync left no pseudo-gradient")
        offset = 0
        with torch.no_grad():
            for i in self.plan[fragment]:
                g = self.global_params[i]
                local = local_tensor(g)
                n = local.numel()
                g.grad = wrap_like(summed[offset : offset + n].view_as(local).clone(), g)
                offset += n
            self.outer_optimizer.step()  # SGD skips the tensors whose grad is None
            for i in self.plan[fragment]:
                self.params[i].copy_(self.global_params[i])
                self.global_params[i].grad = None
        carrier.grad = None
