"""compat: split_group sentinel, profiler without use_cuda, removed cholesky/qr."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from torchnext.compat import NON_GROUP_MEMBER, autograd_profile, cholesky, profile, qr, split_group


def test_split_group_maps_none_to_the_non_member_sentinel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "split_group", lambda **kwargs: None)
    assert split_group(split_ranks=[[0, 1]]) is dist.GroupMember.NON_GROUP_MEMBER
    assert NON_GROUP_MEMBER == dist.GroupMember.NON_GROUP_MEMBER == -100
    sentinel = object()
    monkeypatch.setattr(dist, "split_group", lambda **kwargs: sentinel)
    assert split_group(split_ranks=[[0]], timeout=timedelta(seconds=5)) is sentinel


def test_split_group_validates_arguments() -> None:
    with pytest.raises(TypeError, match="list of lists of ints"):
        split_group(split_ranks=[0, 1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="timedelta"):
        split_group(split_ranks=[[0]], timeout=5)  # type: ignore[arg-type]


def test_profilers_accept_214_arguments_and_map_legacy_use_cuda() -> None:
    with autograd_profile(use_device=None) as prof:
        torch.ones(2).sum()
    assert prof.function_events is not None
    with pytest.warns(FutureWarning, match="use_device='cuda'"):
        p = autograd_profile(use_cuda=False)
    assert p.use_device is None
    with pytest.raises(ValueError, match="conflicts"):
        with pytest.warns(FutureWarning):
            autograd_profile(use_cuda=True, use_device="xpu")
    with pytest.warns(FutureWarning, match="activities"):
        tp = profile(use_cuda=True)
    assert torch.profiler.ProfilerActivity.CUDA in tp.activities


def test_cholesky_old_convention() -> None:
    a = torch.randn(3, 3, dtype=torch.double)
    spd = a @ a.mT + 3 * torch.eye(3, dtype=torch.double)
    lower = cholesky(spd)
    upper = cholesky(spd, upper=True)
    torch.testing.assert_close(lower @ lower.mT, spd)
    torch.testing.assert_close(upper.mT @ upper, spd)
    out = torch.empty(0, dtype=torch.double)
    assert cholesky(spd, out=out) is out
    with pytest.raises(torch.linalg.LinAlgError):
        cholesky(-spd)


def test_qr_some_maps_to_mode() -> None:
    a = torch.randn(5, 3)
    q, r = qr(a)
    assert q.shape == (5, 3) and r.shape == (3, 3)
    q_full, r_full = qr(a, some=False)
    assert q_full.shape == (5, 5) and r_full.shape == (5, 3)
    torch.testing.assert_close(q_full @ r_full, a, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        qr(torch.ones(3))
