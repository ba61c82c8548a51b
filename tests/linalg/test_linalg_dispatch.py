"""Dispatcher: route choice per device/dtype/size/batch, thread splitting, info records."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from linalg_gates import GATE_ORTH, GATE_RECON, hermitian_families, orth_neps, recon_neps

import torchnext.linalg as tl
from torchnext.linalg.dispatch import Problem, choose, run_batch_split, threads_for
from torchnext.linalg.jacobi import eigh_jacobi, svd_jacobi
from torchnext.linalg.unrolled import eigh_unrolled, svd_unrolled

CPU = torch.device("cpu")


def test_cpu_routes() -> None:
    assert (
        choose(Problem(op="eigh", device=CPU, dtype=torch.float32, n=4, batch=16384)) == "unrolled"
    )
    assert (
        choose(Problem(op="svd", device=CPU, dtype=torch.float64, n=4, batch=16384)) == "unrolled"
    )
    assert (
        choose(Problem(op="eigh", device=CPU, dtype=torch.float32, n=16, batch=16384)) == "lapack"
    )
    assert choose(Problem(op="eigh", device=CPU, dtype=torch.float32, n=4, batch=100)) == "lapack"
    assert (
        choose(Problem(op="eigh", device=CPU, dtype=torch.complex64, n=4, batch=16384)) == "lapack"
    )
    assert choose(Problem(op="qr", device=CPU, dtype=torch.float32, n=4, batch=16384)) == "lapack"
    assert (
        choose(Problem(op="eigh", device=CPU, dtype=torch.complex64, n=4, batch=9), "jacobi")
        == "jacobi"
    )
    mps = torch.device("mps")
    assert choose(Problem(op="svd", device=mps, dtype=torch.float32, n=16, batch=512)) == "jacobi"
    assert choose(Problem(op="svd", device=mps, dtype=torch.float32, n=64, batch=512)) == "lapack"
    with pytest.raises(ValueError, match="only offered for eigh and svd"):
        choose(Problem(op="qr", device=CPU, dtype=torch.float32, n=4, batch=9), "jacobi")


def test_thread_count_follows_env_and_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHNEXT_LINALG_THREADS", "1")
    assert threads_for(CPU, 100000) == 1
    monkeypatch.setenv("TORCHNEXT_LINALG_THREADS", "4")
    assert threads_for(CPU, 100000) == 4
    assert threads_for(CPU, 1000) == 1  # too small to be worth a hand-off
    assert threads_for(torch.device("cuda"), 100000) == 1


def test_batch_split_equals_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHNEXT_LINALG_THREADS", "3")
    A = torch.randn(3001, 6, 6, dtype=torch.float64)
    H = A + A.mT
    split = run_batch_split(lambda x: tuple(torch.linalg.eigh(x)), [H], chunks=3)
    serial = torch.linalg.eigh(H)
    torch.testing.assert_close(split[0], serial.eigenvalues)
    L, V = tl.eigh(H)  # lapack route, split over 3 threads
    torch.testing.assert_close(L, serial.eigenvalues)
    assert recon_neps(H, (V * L[..., None, :]) @ V.mT, torch.float64) <= GATE_RECON
    for mode in ("reduced", "complete", "r"):  # QR chunks write into preallocated outputs
        G = torch.randn(3001, 7, 5, dtype=torch.float64)
        Q, R = tl.qr(G, mode=mode)
        ref = torch.linalg.qr(G, mode=mode)
        torch.testing.assert_close(R, ref.R)
        torch.testing.assert_close(Q, ref.Q)


def test_only_lapack_batches_are_split_over_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    # The unrolled route is Python-dispatch bound: split over threads it only contends
    # for the GIL (slower than one thread), so it must run as one chunk.
    import torchnext.linalg.spectral as spectral

    seen: list[int] = []
    real = spectral.run_batch_split

    def spy(fn: Any, inputs: Any, *, chunks: int) -> Any:
        seen.append(chunks)
        return real(fn, inputs, chunks=chunks)

    monkeypatch.setattr(spectral, "run_batch_split", spy)
    monkeypatch.setenv("TORCHNEXT_LINALG_THREADS", "2")
    A = torch.randn(4096, 4, 4)
    tl.eigh(A + A.mT)  # unrolled route
    assert seen == [1]
    seen.clear()
    B = torch.randn(4096, 12, 12, dtype=torch.float64)
    tl.eigh(B + B.mT)  # lapack route
    assert seen == [2]


def test_matmul_iterations_split_at_one_thread_each(monkeypatch: pytest.MonkeyPatch) -> None:
    # Newton-Schulz and QDWH run as chunks at one intra-op thread each (torch's own
    # 2-thread batched GEMM of small matrices was measured slower than that); every
    # matrix iterates on its own, so the split result equals the unsplit one.
    import torchnext.linalg.dispatch as dispatch

    seen: list[tuple[int, int]] = []
    real = dispatch.run_batch_split

    def spy(fn: Any, inputs: Any, *, chunks: int) -> Any:
        seen.append((chunks, torch.get_num_threads()))
        return real(fn, inputs, chunks=chunks)

    monkeypatch.setattr(dispatch, "run_batch_split", spy)
    before = torch.get_num_threads()
    A = torch.randn(2048, 8, 8, dtype=torch.float64)
    S = A @ A.mT + 8 * torch.eye(8, dtype=torch.float64)
    monkeypatch.setenv("TORCHNEXT_LINALG_THREADS", "1")
    U1, H1 = tl.polar(A, method="newton_schulz")
    X1 = tl.matrix_sqrth(S, method="newton_schulz")
    assert seen == []
    monkeypatch.setenv("TORCHNEXT_LINALG_THREADS", "2")
    U2, H2 = tl.polar(A, method="newton_schulz")
    X2 = tl.matrix_sqrth(S, method="newton_schulz")
    tl.polar(A, method="qdwh")
    assert seen == [(2, 1)] * 3
    assert torch.get_num_threads() == before
    torch.testing.assert_close(U2, U1, rtol=0, atol=0)
    torch.testing.assert_close(H2, H1, rtol=0, atol=0)
    torch.testing.assert_close(X2, X1, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("n", [9, 16])
def test_vectorised_jacobi_larger_orders(dtype: torch.dtype, n: int) -> None:
    for name, A in hermitian_families(8, n, dtype).items():
        L, V, info = eigh_jacobi(A)
        assert orth_neps(V, dtype) <= GATE_ORTH, name
        assert recon_neps(A, (V * L[..., None, :].to(V.dtype)) @ V.mH, dtype) <= GATE_RECON, name
        assert bool(info.converged.all()), name
    G = torch.randn(8, n + 2, n, dtype=dtype)
    U, S, Vh, sinfo = svd_jacobi(G)
    assert orth_neps(U, dtype) <= GATE_ORTH and orth_neps(Vh, dtype) <= GATE_ORTH
    assert recon_neps(G, (U * S[..., None, :].to(U.dtype)) @ Vh, dtype) <= GATE_RECON
    assert int(sinfo.iters.max()) < 20


def test_unrolled_info_and_rank_deficient_completion() -> None:
    A = torch.randn(64, 4, 4)
    A[:, :, 3] = A[:, :, 2]  # rank 3: one singular value at the rounding floor
    A[0] = 0
    U, S, Vh, info = svd_unrolled(A)
    assert orth_neps(U, torch.float32) <= GATE_ORTH
    assert recon_neps(A, (U * S[..., None, :]) @ Vh, torch.float32) <= GATE_RECON
    assert info.iters.dtype == torch.int32 and bool(info.converged.all())
    L, V, einfo = eigh_unrolled(A + A.mT)
    assert bool(einfo.converged.all())


def test_divide_and_conquer_orders_run_unsplit_at_one_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # From n = 26 LAPACK's eigh/svd use divide and conquer, which MKL threads inside each
    # call: split over 2 threads (or left at torch's 2 threads) they were measured slower
    # than one call at one thread, so that is the plan; n = 16 keeps the split.
    from torchnext.linalg.dispatch import LAPACK_DC_MIN_N, lapack_plan

    monkeypatch.setenv("TORCHNEXT_LINALG_THREADS", "2")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for op in ("eigh", "svd"):
            plan = lapack_plan(Problem(op=op, device=CPU, dtype=torch.float32, n=32, batch=16384))
            assert (plan.chunks, plan.intra_op_threads) == (1, 1)
            edge = Problem(op=op, device=CPU, dtype=torch.float32, n=LAPACK_DC_MIN_N, batch=4096)
            assert lapack_plan(edge).chunks == 1
            small = Problem(op=op, device=CPU, dtype=torch.float32, n=16, batch=16384)
            assert lapack_plan(small).chunks == 2
        qr = lapack_plan(Problem(op="qr", device=CPU, dtype=torch.float32, n=32, batch=16384))
        assert qr.chunks == 2
    finally:
        torch.set_num_threads(before)


def test_eigh_svd_at_32_call_torch_once_at_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchnext.linalg.spectral as spectral

    seen: list[int] = []
    real = spectral.run_batch_split

    def spy(fn: Any, inputs: Any, *, chunks: int) -> Any:
        seen.append(chunks)
        return real(fn, inputs, chunks=chunks)

    threads_in_call: list[int] = []
    real_eigh, real_svd = torch.linalg.eigh, torch.linalg.svd

    def eigh_spy(*args: Any, **kwargs: Any) -> Any:
        threads_in_call.append(torch.get_num_threads())
        return real_eigh(*args, **kwargs)

    def svd_spy(*args: Any, **kwargs: Any) -> Any:
        threads_in_call.append(torch.get_num_threads())
        return real_svd(*args, **kwargs)

    monkeypatch.setattr(spectral, "run_batch_split", spy)
    monkeypatch.setattr(torch.linalg, "eigh", eigh_spy)
    monkeypatch.setattr(torch.linalg, "svd", svd_spy)
    monkeypatch.setenv("TORCHNEXT_LINALG_THREADS", "2")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        A = torch.randn(1024, 32, 32)
        L, V = tl.eigh(A + A.mT)
        U, S, Vh = tl.svd(A)
        assert torch.get_num_threads() == 2  # restored after each call
    finally:
        torch.set_num_threads(before)
    assert seen == []
    assert threads_in_call == [1, 1]
    assert recon_neps(A + A.mT, (V * L[..., None, :]) @ V.mT, torch.float32) <= GATE_RECON
    assert recon_neps(A, (U * S[..., None, :]) @ Vh, torch.float32) <= GATE_RECON
