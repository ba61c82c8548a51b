"""Prepared calls: a repeated ``torchnext.gemm.linear`` call skips to its remembered route,
and nothing that would change the answer or the autograd graph is skipped with it."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torchnext.errors import GemmInputError
from torchnext.gemm import autotune, gemv, prepared
from torchnext.gemm.epilogue import Epilogue, add, gelu, mul, silu
from torchnext.gemm.fused import linear

# Shape legend: M rows, K contracted, N columns.


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHNEXT_GEMM_CACHE_DIR", str(tmp_path / "gemm-cache"))
    monkeypatch.setenv("TORCHNEXT_GEMM_AUTOTUNE", "on")
    autotune.clear()


@pytest.fixture
def hits(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per prepared.get: whether it found the call."""
    seen: list[bool] = []
    real = prepared.get

    def spy(key: tuple[object, ...], epilogue: Epilogue | None) -> prepared.Prepared | None:
        found = real(key, epilogue)
        seen.append(found is not None)
        return found

    monkeypatch.setattr(prepared, "get", spy)
    return seen


def _operands(m: int = 32, k: int = 24, n: int = 40, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x_MK = torch.randn(m, k, generator=gen)
    w_NK = torch.randn(n, k, generator=gen)
    bias_N = torch.randn(n, generator=gen)
    full_MN = torch.randn(m, n, generator=gen)
    return x_MK, w_NK, bias_N, full_MN


def test_a_repeated_call_takes_the_prepared_route_and_gives_the_same_values(
    hits: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    x_MK, w_NK, bias_N, full_MN = _operands()
    ep = Epilogue(silu(), mul(full_MN))
    first = linear(x_MK, w_NK, bias_N, epilogue=ep)
    second = linear(x_MK, w_NK, bias_N, epilogue=ep)
    assert hits == [False, True]
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(first, F.silu(F.linear(x_MK, w_NK, bias_N)) * full_MN)
    x_MK.mul_(2)  # new values, same signature: computed again, not replayed
    torch.testing.assert_close(
        linear(x_MK, w_NK, bias_N, epilogue=ep), F.silu(F.linear(x_MK, w_NK, bias_N)) * full_MN
    )


def test_leading_dimensions_are_kept_on_the_prepared_route(
    hits: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    x_BTK = torch.randn(3, 11, 24)
    w_NK = torch.randn(40, 24)
    ep = Epilogue(gelu())
    outs = [linear(x_BTK, w_NK, epilogue=ep) for _ in range(2)]
    assert hits == [False, True] and outs[1].shape == (3, 11, 40)
    torch.testing.assert_close(outs[1], F.gelu(F.linear(x_BTK, w_NK)))


def test_inputs_that_require_grad_take_the_full_path_and_get_gradients(
    hits: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    x_MK, w_NK, bias_N, full_MN = _operands()
    ep = Epilogue(gelu(), add(full_MN))
    linear(x_MK, w_NK, bias_N, epilogue=ep)
    w = w_NK.clone().requires_grad_()
    out = linear(x_MK, w, bias_N, epilogue=ep)
    assert out.grad_fn is not None
    out.sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0
    full_MN.requires_grad_()  # a captured tensor that starts requiring grad
    out = linear(x_MK, w_NK, bias_N, epilogue=ep)
    assert out.grad_fn is not None
    assert hits == [False, True, True]  # found, but autograd recorded: the full path ran


def test_each_epilogue_object_keeps_its_own_call(
    hits: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    x_MK, w_NK, bias_N, full_MN = _operands()
    for _ in range(2):
        got_mul = linear(x_MK, w_NK, bias_N, epilogue=Epilogue(silu(), mul(full_MN)))
        got_add = linear(x_MK, w_NK, bias_N, epilogue=Epilogue(silu(), add(full_MN)))
    y = F.silu(F.linear(x_MK, w_NK, bias_N))
    torch.testing.assert_close(got_mul, y * full_MN)
    torch.testing.assert_close(got_add, y + full_MN)


def test_a_new_thread_count_or_dtype_is_a_new_call(
    hits: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    x_MK, w_NK, bias_N, _ = _operands()
    before = torch.get_num_threads()
    linear(x_MK, w_NK, bias_N)
    torch.set_num_threads(1 if before != 1 else 2)
    try:
        linear(x_MK, w_NK, bias_N)
    finally:
        torch.set_num_threads(before)
    out = linear(x_MK.double(), w_NK.double(), bias_N.double())
    assert hits == [False, False, False]
    assert out.dtype == torch.float64


def test_only_remembered_choices_are_prepared(
    hits: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Autotuning off: the fallback is computed per call and nothing is kept.
    monkeypatch.setenv("TORCHNEXT_GEMM_AUTOTUNE", "off")
    x_MK, w_NK, bias_N, _ = _operands()
    linear(x_MK, w_NK, bias_N, epilogue=Epilogue(gelu()))
    linear(x_MK, w_NK, bias_N, epilogue=Epilogue(gelu()))
    assert hits == [False, False]


def test_clearing_the_tuner_forgets_prepared_calls(
    hits: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    x_MK, w_NK, bias_N, _ = _operands()
    linear(x_MK, w_NK, bias_N)
    autotune.clear()
    linear(x_MK, w_NK, bias_N)
    assert hits == [False, False]


def test_the_table_is_bounded(hits: list[bool], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepared, "MAX_CALLS", 3)
    w_NK = torch.randn(8, 4)
    for m in range(9, 14):  # five signatures into a table of three
        linear(torch.randn(m, 4), w_NK)
    linear(torch.randn(9, 4), w_NK)  # the first was dropped when the table filled
    assert hits == [False] * 6


@pytest.mark.parametrize("k", [24, 1024])
def test_decode_calls_the_gemv_path_takes_are_not_prepared(k: int, hits: list[bool]) -> None:
    # The GEMV path decides per call; a decode call it declines is a GEMM like any other.
    x_1K, w_NK = torch.randn(1, k), torch.randn(1024, k) / k**0.5
    for _ in range(2):
        torch.testing.assert_close(linear(x_1K, w_NK), F.linear(x_1K, w_NK))
    assert hits == [False, gemv.route(x_1K, w_NK) == "aten"]


def test_the_table_keeps_no_tensor_alive(hits: list[bool]) -> None:
    # An epilogue per call (a new residual each step) never hits and holds nothing.
    x_MK, w_NK, bias_N, _ = _operands()
    refs = []
    for _ in range(3):
        residual_MN = torch.randn(32, 40)
        refs.append(weakref.ref(residual_MN))
        linear(x_MK, w_NK, bias_N, epilogue=Epilogue(add(residual_MN)))
        del residual_MN
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert hits == [False, False, False]


def test_an_nd_operand_is_read_afresh_every_call(hits: list[bool]) -> None:
    # A non-contiguous N-D operand is copied when flattened: such calls are never prepared,
    # so a later change to it (values or requires_grad) is seen.
    x_BTK, w_NK = torch.randn(2, 5, 24), torch.randn(40, 24)
    base_BNT = torch.randn(2, 40, 5)
    residual_BTN = base_BNT.transpose(1, 2)
    ep = Epilogue(add(residual_BTN))
    linear(x_BTK, w_NK, epilogue=ep)
    base_BNT.add_(100)
    torch.testing.assert_close(
        linear(x_BTK, w_NK, epilogue=ep), F.linear(x_BTK, w_NK) + residual_BTN
    )
    base_BNT.requires_grad_()
    assert linear(x_BTK, w_NK, epilogue=Epilogue(add(base_BNT.transpose(1, 2)))).requires_grad
    assert not any(hits)


def test_parameters_of_a_module_take_the_prepared_route(hits: list[bool]) -> None:
    layer = torch.nn.Linear(24, 40)
    x_MK = torch.randn(32, 24)
    ep = Epilogue(gelu())
    with torch.no_grad():
        outs = [linear(x_MK, layer.weight, layer.bias, epilogue=ep) for _ in range(2)]
    assert hits == [False, True]
    torch.testing.assert_close(outs[1], F.gelu(layer(x_MK)).detach())
    out = linear(x_MK, layer.weight, layer.bias, epilogue=ep)  # grad mode: autograd records
    assert out.grad_fn is not None


def test_a_bias_that_is_not_a_tensor_is_a_clear_error() -> None:
    with pytest.raises(GemmInputError, match=r"gemm\(bias=\.\.\.\): got \[0\.0"):
        linear(torch.randn(32, 8), torch.randn(12, 8), [0.0] * 12)  # type: ignore[arg-type]
