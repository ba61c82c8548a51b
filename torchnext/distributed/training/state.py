"""The training state a :class:`~torchnext.distributed.training.manager.Manager` keeps
identical on every replica: what it heals, checkpoints and checks.

Use it through the manager. Besides the model, the optimizer and the sampler, anything
with ``state_dict()`` and ``load_state_dict()`` can be registered under a name: LR
schedulers, an AMP ``GradScaler``, EMA weights, a data loader's state, user objects::

    manager = Manager.from_env(model, opt, sampler, state={"lr": scheduler, "ema": ema})
    manager.register("scaler", scaler)          # or one at a time, before the first step

Registered entries travel with every heal (a replacement gets the live replicas'
values) and with :meth:`Manager.state_dict`, and the replica check
(``ManagerConfig.check_replicas``) fingerprints each one, so a divergence names the
entry that differs.

What not to assume: an entry's ``state_dict()`` must hold tensors, numpy arrays,
numbers, strings, None and dict/list/tuple of those (the heal transport carries
nothing else; registration checks it once). An entry registered with
``replicated=False`` (say, a per-member counter) is still carried to a replacement,
from its healer, but is left out of the replica check. Every member, replacements
included, must register the same names; a member that does not is refused with an
error naming the difference.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from torchnext.distributed.training.healing import rng_state, set_rng_state
from torchnext.distributed.training.sampler import ElasticSampler
from torchnext.errors import TrainingStateError

__all__ = [
    "RESERVED_NAMES",
    "Stateful",
    "TrainingState",
    "capture_rng",
    "fingerprint",
    "restore_rng",
]

RESERVED_NAMES = frozenset(
    {"model", "optimizer", "sampler", "rng", "step", "steps_redone", "extra"}
)
"""Names the manager's own state uses; a registered entry cannot take them."""


@runtime_checkable
class Stateful(Protocol):
    """What can be registered: the ``state_dict`` / ``load_state_dict`` pair."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class _Entry:
    obj: Stateful
    replicated: bool


def _feed(crc: int, obj: Any) -> int:
    """Fold ``obj`` into a CRC32, bit-exactly for tensors, canonically for containers."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        crc = zlib.crc32(f"T{t.dtype}{tuple(t.shape)}".encode(), crc)
        return zlib.crc32(t.reshape(-1).view(torch.uint8).numpy().data, crc)
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        crc = zlib.crc32(f"N{a.dtype.str}{a.shape}".encode(), crc)
        return zlib.crc32(a.reshape(-1).view(np.uint8).data, crc)
    if isinstance(obj, dict):
        crc = zlib.crc32(b"{", crc)
        for key in sorted(obj, key=repr):
            crc = _feed(_feed(crc, key), obj[key])
        return zlib.crc32(b"}", crc)
    if isinstance(obj, (list, tuple)):
        crc = zlib.crc32(b"[" if isinstance(obj, list) else b"(", crc)
        for item in obj:
            crc = _feed(crc, item)
        return zlib.crc32(b"]", crc)
    return zlib.crc32(f"{type(obj).__name__}:{obj!r};".encode(), crc)


def fingerprint(obj: Any) -> int:
    """CRC32 of a state tree: equal when tensors match bit for bit and the rest by ``repr``."""
    return _feed(0, obj)


_LEAVES = (bool, int, float, str, torch.Tensor, np.ndarray, np.generic)


def _check_carriable(obj: Any, path: str) -> None:
    if obj is None or isinstance(obj, _LEAVES):
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            _check_carriable(value, f"{path}[{key!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _check_carriable(value, f"{path}[{i}]")
        return
    raise TrainingStateError(
        f"{path} is a {type(obj).__name__}, which healing cannot carry to a replacement; "
        "make state_dict() return tensors, numpy arrays, numbers, strings, None and "
        "dict/list/tuple of those."
    )


def capture_rng() -> dict[str, Any]:
    """This process's random states (torch, NumPy, Python, CUDA), ``weights_only``-safe.

    NumPy's state becomes a tensor and plain numbers, so a checkpoint holding it loads
    with ``torch.load(path, weights_only=True)``.
    """
    out = rng_state()
    name, key, pos, has_gauss, cached = out["numpy"]
    out["numpy"] = {
        "bit_generator": str(name),
        "key": torch.from_numpy(np.asarray(key).astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return out


def restore_rng(state: Mapping[str, Any]) -> None:
    """Restore what :func:`capture_rng` (or an older manager's ``rng_state``) captured."""
    native = dict(state)
    numpy_state = native.get("numpy")
    if isinstance(numpy_state, Mapping):
        key = numpy_state["key"]
        key_np = key.numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
        native["numpy"] = (
            str(numpy_state["bit_generator"]),
            key_np.astype(np.uint32),
            int(numpy_state["pos"]),
            int(numpy_state["has_gauss"]),
            float(numpy_state["cached_gaussian"]),
        )
    set_rng_state(native)


class TrainingState:
    """The model, optimizer, sampler and the registered entries of one replica."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        extra: Mapping[str, Stateful] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self._entries: dict[str, _Entry] = {}
        if extra is not None and not isinstance(extra, Mapping):
            raise TypeError(
                f"state={extra!r} must map names to objects with state_dict() and "
                'load_state_dict(), e.g. state={"lr": scheduler}.'
            )
        for name, obj in (extra or {}).items():
            self.register(name, obj)

    def register(self, name: str, obj: Stateful, *, replicated: bool = True) -> None:
        """Add ``obj`` under ``name``: it heals, checkpoints and (if ``replicated``) is checked."""
        if not isinstance(name, str) or not name.isidentifier():
            raise TrainingStateError(
                f"register(name={name!r}): give an identifier such as 'lr_scheduler'."
            )
        if name in RESERVED_NAMES:
            raise TrainingStateError(
                f"register(name={name!r}): the manager uses that name for its own state; "
                f"choose another (reserved: {', '.join(sorted(RESERVED_NAMES))})."
            )
        if name in self._entries:
            raise TrainingStateError(
                f"register(name={name!r}): already registered "
                f"({type(self._entries[name].obj).__name__}); give each object its own name."
            )
        missing = [
            m for m in ("state_dict", "load_state_dict") if not callable(getattr(obj, m, None))
        ]
        if missing:
            raise TypeError(
                f"register({name!r}, obj=<{type(obj).__name__} object>): it has no "
                f"{' and no '.join(m + '()' for m in missing)}; register objects that save "
                "and load their state (schedulers, GradScaler, EMA), or wrap the value in a "
                "small class with both methods."
            )
        if not isinstance(replicated, bool):
            raise TypeError(f"register({name!r}, replicated={replicated!r}): give True or False.")
        _check_carriable(obj.state_dict(), f"{name}.state_dict()")
        self._entries[name] = _Entry(obj, replicated)

    @property
    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def spec(self) -> dict[str, bool]:
        """Registered name -> replicated: what another member must have registered too."""
        return {name: e.replicated for name, e in self._entries.items()}

    def spec_crc(self) -> int:
        """A fingerprint of :meth:`spec` (compared across members at every sync)."""
        return fingerprint(sorted(self.spec().items()))

    def spec_problems(self, theirs: Any, who: str) -> list[str]:
        """How ``who``'s registered entries (name -> replicated) differ from these."""
        if not isinstance(theirs, Mapping):
            return [f"{who} sent no list of registered entries"]
        mine = self.spec()
        problems = []
        for name in sorted(set(mine) | set(theirs)):
            if name not in theirs:
                problems.append(f"{who} did not register {name!r}")
            elif name not in mine:
                problems.append(f"{who} registered {name!r}, which the group does not have")
            elif mine[name] != bool(theirs[name]):
                problems.append(
                    f"{who} registered {name!r} with replicated={theirs[name]}, "
                    f"the group with replicated={mine[name]}"
                )
        return problems

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, sampler, the registered entries and the RNG states."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "extra": self.entries_state_dict(),
            "rng": capture_rng(),
        }

    def entries_state_dict(self) -> dict[str, Any]:
        """The registered entries' states only, by name (what a redone step rolls back)."""
        return {name: e.obj.state_dict() for name, e in self._entries.items()}

    def entry(self, name: str) -> Stateful:
        """The object registered as ``name``."""
        if name not in self._entries:
            raise TrainingStateError(
                f"entry {name!r} is not registered (registered: {list(self._entries)}); "
                "register it under the same name as the run that saved the state."
            )
        return self._entries[name].obj

    def load_entries_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`entries_state_dict`'s output into the same registered entries."""
        for name, value in state.items():
            self._entries[name].obj.load_state_dict(value)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load what :meth:`state_dict` returned; the registered names must match."""
        extra = dict(state.get("extra") or {})
        saved, mine = set(extra), set(self._entries)
        problems = [f"it holds {n!r}, which is not registered here" for n in sorted(saved - mine)]
        problems += [f"{n!r} is registered here but not in it" for n in sorted(mine - saved)]
        if problems:
            raise TrainingStateError(
                "cannot load this state: " + "; ".join(problems) + ". Register the same "
                "entries under the same names as the run that saved it."
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        for name, value in extra.items():
            self._entries[name].obj.load_state_dict(value)
        restore_rng(state["rng"])

    def fingerprints(self) -> dict[str, int]:
        """Per entry that must be identical on every replica: its :func:`fingerprint`."""
        out = {
            "model": fingerprint(self.model.state_dict()),
            "optimizer": fingerprint(self.optimizer.state_dict()),
            "sampler": fingerprint(self.sampler.state_dict()),
        }
        for name, e in self._entries.items():
            if e.replicated:
                out[name] = fingerprint(e.obj.state_dict())
        return out
