"""Gradient buckets: launched during backward, in order, summed results written back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch

from torchnext.distributed.bucketing import GradBucketer
from torchnext.errors import CommRevokedError


class _Done:
    def wait(self, timeout: timedelta | None = None) -> bool:
        return True


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )


def test_buckets_launch_during_backward_in_order_and_sum() -> None:
    model = _model()
    reference = _model()
    launches: list[tuple[int, bool]] = []
    in_backward = {"flag": False}

    def all_reduce(t: torch.Tensor) -> Any:
        launches.append((t.numel(), in_backward["flag"]))
        t.mul_(3)  # as if three identical members summed
        return _Done()

    bucketer = GradBucketer(list(model.parameters()), all_reduce, bucket_cap_bytes=32 * 33 * 4)
    assert len(bucketer.buckets) >= 2
    x = torch.randn(8, 16)
    loss = model(x).sum()
    in_backward["flag"] = True
    loss.backward()
    in_backward["flag"] = False
    bucketer.finish(timedelta(seconds=5))
    reference(x).sum().backward()
    # Every bucket was issued from a backward hook, last layers first.
    assert [n for n, _ in launches] == [b.flat_F.numel() for b in bucketer.buckets]
    assert all(during for _, during in launches)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, 3 * q.grad)


def test_unused_parameters_contribute_zeros_at_finish() -> None:
    model = _model()
    extra = torch.nn.Parameter(torch.ones(5))
    calls: list[torch.Tensor] = []

    def all_reduce(t: torch.Tensor) -> Any:
        calls.append(t.clone())
        return _Done()

    bucketer = GradBucketer([extra, *model.parameters()], all_reduce, bucket_cap_bytes=1 << 30)
    model(torch.randn(2, 16)).sum().backward()
    assert not calls  # the single bucket waits for `extra`, which gets no gradient
    bucketer.finish(timedelta(seconds=5))
    assert len(calls) == 1
    assert torch.equal(extra.grad, torch.zeros(5))


def test_issue_error_is_raised_from_finish_not_backward() -> None:
    model = _model()

    def all_reduce(t: torch.Tensor) -> Any:
        raise CommRevokedError("revoked", epoch=1)

    bucketer = GradBucketer(list(model.parameters()), all_reduce)
    model(torch.randn(2, 16)).sum().backward()  # must not raise
    with pytest.raises(CommRevokedError):
        bucketer.finish(timedelta(seconds=1))
    # The next step starts clean.
    assert bucketer.error is None and bucketer._next_launch == 0


def test_validation() -> None:
    with pytest.raises(ValueError, match="bucket_cap_bytes"):
        GradBucketer(list(_model().parameters()), lambda t: _Done(), bucket_cap_bytes=0)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="requires grad"):
        GradBucketer(list(frozen.parameters()), lambda t: _Done())


@pytest.mark.parametrize("fails_in", ["forward", "backward"])
def test_a_failure_noticed_mid_step_cuts_its_compute_short(fails_in: str) -> None:
    model = _model()
    failed = {"now": False}
    ran: list[str] = []
    for name, module in model.named_children():
        module.register_forward_hook(lambda m, a, o, name=name: ran.append(f"fwd{name}"))
    grads: list[int] = []
    for i, p in enumerate(model.parameters()):
        p.register_post_accumulate_grad_hook(lambda p, i=i: grads.append(i))

    def all_reduce(t: torch.Tensor) -> Any:
        return _Done()

    bucketer = GradBucketer(
        list(model.parameters()),
        all_reduce,
        bucket_cap_bytes=64,  # one bucket per parameter
        failed=lambda: failed["now"],
        modules=model.modules(),
    )
    x = torch.randn(8, 16)
    completed = False
    with bucketer.interruptible():
        h = model[0](x)
        if fails_in == "forward":
            failed["now"] = True  # noticed by the heartbeat thread, say
        loss = model[4](model[3](model[2](model[1](h)))).sum()
        if fails_in == "backward":
            grads.clear()
            failed["now"] = True
        loss.backward()
        completed = True
    assert not completed  # the block was cut short, silently
    if fails_in == "forward":
        assert ran == ["fwd0"] and grads == []  # stopped at the next module
    else:
        assert len(grads) == 1  # stopped at the first gradient after the failure
    with pytest.raises(Exception, match="the group failed during this step's compute"):
        bucketer.finish(timedelta(seconds=5))
    # Outside interruptible(), nothing is checked: a plain backward runs through.
    model.zero_grad()
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
