"""The Triton Jacobi kernels, run on the CPU through Triton's interpreter.

``TRITON_INTERPRET`` must be set before Triton is first imported, so the kernels run
in a child process; this module never imports Triton itself.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from triton_interpreter import SKIP_REASON, run_child

from torchnext.linalg._triton_jacobi import triton_available
from torchnext.linalg.dispatch import Problem, choose

pytestmark = pytest.mark.skipif(not triton_available(), reason=SKIP_REASON)

_CHILD = textwrap.dedent(
    """
    import json, torch
    from torchnext.linalg._triton_jacobi import eigh_triton, svd_triton
    def neps(x, n, dt): return float(x) / (max(n, 1) * torch.finfo(dt).eps)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for dt in (torch.float32, torch.float64):
        for (m, n) in ((1, 1), (3, 3), (4, 4), (8, 8), (6, 3), (9, 9)):
            a = torch.randn(6, m, n, dtype=dt, generator=gen)
            a[5] = 0
            if m == n:
                h = a + a.mT
                h[4] = torch.diag(torch.tensor([2.0] * (n // 2) + [-1.0] * (n - n // 2), dtype=dt))
                L, V, info = eigh_triton(h)
                hd, Vd = h.double(), V.double()
                eye = torch.eye(n, dtype=torch.float64)
                rows.append(dict(op="eigh", m=m, n=n, dtype=str(dt),
                    orth=neps(torch.linalg.matrix_norm(Vd.mT @ Vd - eye).max(), n, dt),
                    recon=neps((torch.linalg.matrix_norm((Vd * L.double()[:, None, :]) @ Vd.mT - hd)
                                / torch.linalg.matrix_norm(hd).clamp_min(1)).max(), n, dt),
                    sorted=bool((L[:, 1:] >= L[:, :-1]).all()), sweeps=int(info.iters.max())))
            U, S, Vh, info = svd_triton(a)
            Ud, Vhd, ad = U.double(), Vh.double(), a.double()
            rows.append(dict(op="svd", m=m, n=n, dtype=str(dt),
                orth=max(neps(torch.linalg.matrix_norm(Ud.mT @ Ud - torch.eye(n, dtype=torch.float64)).max(), n, dt),
                         neps(torch.linalg.matrix_norm(Vhd @ Vhd.mT - torch.eye(n, dtype=torch.float64)).max(), n, dt)),
                recon=neps((torch.linalg.matrix_norm((Ud * S.double()[:, None, :]) @ Vhd - ad)
                            / torch.linalg.matrix_norm(ad).clamp_min(1)).max(), max(m, n), dt),
                sorted=bool((S[:, :-1] >= S[:, 1:]).all()), sweeps=int(info.iters.max())))
    print(json.dumps(rows))
    """
)


@pytest.fixture(scope="module")
def interpreted_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = run_child(_CHILD)
    return rows


def test_kernels_meet_the_accuracy_gates(interpreted_rows: list[dict[str, object]]) -> None:
    assert len(interpreted_rows) == 22
    for row in interpreted_rows:
        assert row["sorted"], row
        assert float(row["orth"]) <= 10.0, row  # type: ignore[arg-type]
        assert float(row["recon"]) <= 10.0, row  # type: ignore[arg-type]
        assert int(row["sweeps"]) < 20, row  # type: ignore[call-overload]


def test_dispatcher_routes_small_cuda_problems_to_triton() -> None:
    cuda = torch.device("cuda")
    for op in ("eigh", "svd"):
        small = Problem(op=op, device=cuda, dtype=torch.float32, n=16, batch=4096)
        assert choose(small) == "triton"
        assert (
            choose(Problem(op=op, device=cuda, dtype=torch.float32, n=64, batch=4096)) == "lapack"
        )
        assert choose(small, "jacobi") == "triton"


def test_dispatcher_keeps_complex_and_tall_problems_off_the_kernel() -> None:
    cuda = torch.device("cuda")
    assert (
        choose(Problem(op="eigh", device=cuda, dtype=torch.complex64, n=8, batch=4096)) == "lapack"
    )
    assert (
        choose(Problem(op="svd", device=cuda, dtype=torch.complex64, n=8, batch=9), "jacobi")
        == "jacobi"
    )
