"""compat shims on 2.13 reproduce what torch 2.14.1 does natively."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

CLAMP_PROGRAM = """
import itertools, json, torch
from torchnext.compat import clamp, clamp_min, clamp_max
rows = []
vals = [0.0, 1.0, 2.0]
for x, lo, hi in itertools.product(vals, vals, vals):
    X, L, H = (torch.tensor([v], requires_grad=True) for v in (x, lo, hi))
    clamp(X, L, H).sum().backward()
    Xs = torch.tensor([x], requires_grad=True)
    clamp(Xs, lo, hi).sum().backward()
    Xm, Lm = torch.tensor([x], requires_grad=True), torch.tensor([lo], requires_grad=True)
    clamp_min(Xm, Lm).sum().backward()
    XM, HM = torch.tensor([x], requires_grad=True), torch.tensor([hi], requires_grad=True)
    clamp_max(XM, HM).sum().backward()
    rows.append([X.grad.item(), L.grad.item(), H.grad.item(), Xs.grad.item(),
                 Xm.grad.item(), Lm.grad.item(), XM.grad.item(), HM.grad.item()])
x, lo = torch.tensor([-1, 0, 0.5, 1, 2.0]), torch.zeros(5)
_, t = torch.func.jvp(lambda x, lo: clamp(x, lo, torch.ones(5)), (x, lo), (torch.ones(5), 10 * torch.ones(5)))
rows.append(t.tolist())
print(json.dumps(rows))
"""


# Forward AD imports torch's jvp decompositions, which call torch.jit.script (2.14 warns).
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_clamp_gradients_match_native_214(run_on_torch213: Callable[[str], Any]) -> None:
    ours = run_on_torch213(CLAMP_PROGRAM)
    # Native side: plain torch.clamp on 2.14.1 (compat.clamp is torch.clamp there, but
    # compute it with torch directly so the comparison does not depend on torchnext).
    native = []
    vals = [0.0, 1.0, 2.0]
    for x, lo, hi in itertools.product(vals, vals, vals):
        X, L, H = (torch.tensor([v], requires_grad=True) for v in (x, lo, hi))
        torch.clamp(X, L, H).sum().backward()
        Xs = torch.tensor([x], requires_grad=True)
        torch.clamp(Xs, lo, hi).sum().backward()
        Xm, Lm = torch.tensor([x], requires_grad=True), torch.tensor([lo], requires_grad=True)
        torch.clamp_min(Xm, Lm).sum().backward()
        XM, HM = torch.tensor([x], requires_grad=True), torch.tensor([hi], requires_grad=True)
        torch.clamp_max(XM, HM).sum().backward()
        native.append(
            [g.grad.item() for g in (X, L, H, Xs, Xm, Lm, XM, HM)]  # type: ignore[union-attr]
        )
    x, lo = torch.tensor([-1, 0, 0.5, 1, 2.0]), torch.zeros(5)
    _, t = torch.func.jvp(
        lambda x, lo: torch.clamp(x, lo, torch.ones(5)),
        (x, lo),
        (torch.ones(5), 10 * torch.ones(5)),
    )
    native.append(t.tolist())
    assert json.loads(json.dumps(native)) == ours


def test_removed_cholesky_qr_raise_natively_and_compat_keeps_old_conventions(
    run_on_torch213: Callable[[str], Any],
) -> None:
    a = torch.randn(4, 4, dtype=torch.double)
    with pytest.raises(RuntimeError, match="removed"):
        torch.cholesky(a @ a.mT + torch.eye(4, dtype=torch.double))
    program = """
    import json, torch
    from torchnext.compat import cholesky, qr
    torch.manual_seed(0)
    a = torch.randn(4, 4, dtype=torch.double)
    spd = a @ a.mT + torch.eye(4, dtype=torch.double)
    q, r = qr(a[:, :3], some=False)
    print(json.dumps({"U": cholesky(spd, upper=True).tolist(), "q": list(q.shape), "r": list(r.shape)}))
    """
    ours = run_on_torch213(program)
    torch.manual_seed(0)
    a = torch.randn(4, 4, dtype=torch.double)
    spd = a @ a.mT + torch.eye(4, dtype=torch.double)
    torch.testing.assert_close(
        torch.tensor(ours["U"], dtype=torch.double), torch.linalg.cholesky(spd).mH
    )
    assert ours["q"] == [4, 4] and ours["r"] == [4, 3]


def test_profiler_use_cuda_is_a_type_error_natively_and_compat_maps_it() -> None:
    from torchnext.compat import autograd_profile

    with pytest.raises(TypeError, match="use_cuda"):
        torch.autograd.profiler.profile(use_cuda=False)
    with pytest.warns(FutureWarning):
        prof = autograd_profile(use_cuda=False)
    assert prof.use_device is None
