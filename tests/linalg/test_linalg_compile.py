"""torch.compile: every public function traces in one graph and matches eager."""

from __future__ import annotations

import torch

import torchnext.linalg as tl


def _program(a: torch.Tensor) -> torch.Tensor:
    U, H = tl.polar(a)
    X = tl.matrix_sqrth(H + torch.eye(3))
    L, V = tl.eigh(X)
    _, R = tl.qr(a)
    S = tl.svd(a).S
    C = tl.cholesky(X)
    return U.sum() + X.sum() + L.sum() + (V @ V.mT).sum() + R.abs().sum() + S.sum() + C.sum()


def test_fullgraph_compile_matches_eager() -> None:
    torch._dynamo.reset()
    a = torch.randn(4, 3, 3, dtype=torch.float64)
    compiled = torch.compile(_program, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(a), _program(a))
    # Gradients flow through the compiled graph too.
    b = a.clone().requires_grad_()
    compiled(b).backward()
    assert b.grad is not None and bool(torch.isfinite(b.grad).all())


def test_functorch_vmap_and_grad_take_the_traceable_route() -> None:
    A = torch.randn(3, 4, 4, dtype=torch.float64)
    U = torch.func.vmap(lambda a: tl.polar(a)[0])(A)
    torch.testing.assert_close(U, tl.polar(A)[0])
    S = A @ A.mT + torch.eye(4, dtype=torch.float64)
    torch.testing.assert_close(torch.func.vmap(tl.matrix_sqrth)(S), tl.matrix_sqrth(S))
    L = torch.func.vmap(lambda a: tl.eigh(a).eigenvalues)(S)
    torch.testing.assert_close(L, torch.linalg.eigvalsh(S))
    g = torch.func.grad(lambda a: tl.polar(a)[0].sum())(A[0])
    assert g.shape == (4, 4) and bool(torch.isfinite(g).all())
