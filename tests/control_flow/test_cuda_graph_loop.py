"""capture_while_loop: clear errors without CUDA; real capture tests on a GPU."""

from __future__ import annotations

import pytest
import torch

from torchnext.control_flow import WhileLoopCaptureConfig, capture_while_loop
from torchnext.control_flow.cuda_graph_loop import capture_support
from torchnext.errors import CudaGraphCaptureError


def test_config_validates_unroll() -> None:
    with pytest.raises(ValueError, match="unroll"):
        WhileLoopCaptureConfig(unroll=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_without_cuda_the_error_says_why_and_what_to_do() -> None:
    kind, reason = capture_support()
    assert kind is None and "CUDA" in reason
    with pytest.raises(CudaGraphCaptureError, match="no CUDA device.*while_loop instead"):
        capture_while_loop(lambda x: x.sum() < 10, lambda x: x + 1, (torch.zeros(2),))


def _collatz_cond(n: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    return n != 1


def _collatz_body(n: torch.Tensor, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.where(n % 2 == 0, n // 2, 3 * n + 1), steps + 1


@pytest.mark.gpu
@pytest.mark.parametrize("prefer_while_node", [True, False])
def test_data_dependent_trip_count_is_exact(prefer_while_node: bool) -> None:
    if capture_support()[0] is None:
        pytest.skip(capture_support()[1])
    n0 = torch.tensor(27, device="cuda")
    steps0 = torch.tensor(0, device="cuda")
    loop = capture_while_loop(
        _collatz_cond,
        _collatz_body,
        (n0, steps0),
        config=WhileLoopCaptureConfig(unroll=8, prefer_while_node=prefer_while_node),
    )
    for start, expected_steps in ((27, 111), (6, 8), (1, 0)):
        n, steps = loop(torch.tensor(start, device="cuda"), torch.tensor(0, device="cuda"))
        assert int(n) == 1 and int(steps) == expected_steps
    if loop.kind == "if":
        assert loop.replays_last_call >= 1


@pytest.mark.gpu
def test_non_tensor_carry_and_bad_cond_are_rejected() -> None:
    if capture_support()[0] is None:
        pytest.skip(capture_support()[1])
    with pytest.raises(CudaGraphCaptureError, match="only support tensor carried_inputs"):
        capture_while_loop(lambda i: i < 3, lambda i: i + 1, (3,))
    with pytest.raises(CudaGraphCaptureError, match="boolean scalar CUDA tensor"):
        capture_while_loop(lambda x: x.sum(), lambda x: x + 1, (torch.zeros(2, device="cuda"),))
    with pytest.raises(CudaGraphCaptureError, match="changes carry 0"):
        capture_while_loop(
            lambda x: x.sum() < 3, lambda x: torch.cat([x, x]), (torch.zeros(2, device="cuda"),)
        )


@pytest.mark.gpu
def test_rng_in_body_gives_a_clear_error() -> None:
    if capture_support()[0] != "while":
        pytest.skip("the RNG restriction is checked by torch's WHILE-node capture (2.14)")
    with pytest.raises(CudaGraphCaptureError):
        capture_while_loop(
            lambda x: x.sum() < 3,
            lambda x: x + torch.rand_like(x),
            (torch.zeros(2, device="cuda"),),
        )
