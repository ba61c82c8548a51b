"""compat.clamp: torch 2.14's boundary gradients (reverse, forward, vmap), exact values."""

from __future__ import annotations

import itertools

import pytest
import torch

from torchnext.compat import clamp, clamp_max, clamp_min

X = [-1.0, 0.0, 0.5, 1.0, 2.0]


def _grad(fn, *tensors: torch.Tensor) -> list[list[float]]:  # type: ignore[no-untyped-def]
    leaves = [t.clone().requires_grad_(True) for t in tensors]
    fn(*leaves).sum().backward()
    return [leaf.grad.tolist() for leaf in leaves]  # type: ignore[union-attr]


def test_scalar_bounds_pass_no_gradient_at_equality() -> None:
    x = torch.tensor(X)
    assert _grad(lambda x: clamp(x, 0.0, 1.0), x) == [[0, 0, 1, 0, 0]]
    assert _grad(lambda x: clamp_min(x, 0.0), x) == [[0, 0, 1, 1, 1]]
    assert _grad(lambda x: clamp_max(x, 1.0), x) == [[1, 1, 1, 0, 0]]
    assert _grad(lambda x: clamp(x, 1.0, 1.0), torch.tensor([1.0])) == [[0.0]]


def test_tensor_bounds_split_ties_equally() -> None:
    x, lo, hi = torch.tensor(X), torch.zeros(5), torch.ones(5)
    dx, dlo, dhi = _grad(clamp, x, lo, hi)
    assert dx == [0, 0.5, 1, 0.5, 0]
    assert dlo == [1, 0.5, 0, 0, 0]
    assert dhi == [0, 0, 0, 0.5, 1]
    assert _grad(clamp_min, x, lo) == [[0, 0.5, 1, 1, 1], [1, 0.5, 0, 0, 0]]
    assert _grad(clamp_max, x, hi) == [[1, 1, 1, 0.5, 0], [0, 0, 0, 0.5, 1]]


def _reference_weights(x: float, lo: float, hi: float) -> tuple[float, float, float]:
    """2.14's rule for tensor bounds, measured on torch 2.14.1 over a 3x3x3 grid."""
    if lo > hi:
        return 0.0, 0.0, 1.0
    if lo == hi:
        return (1.0, 0.0, 0.0) if x == lo else ((0.0, 1.0, 0.0) if x < lo else (0.0, 0.0, 1.0))
    if x < lo:
        return 0.0, 1.0, 0.0
    if x > hi:
        return 0.0, 0.0, 1.0
    return (0.5 * (x == lo) + 0.5 * (x == hi) + (lo < x < hi), 0.5 * (x == lo), 0.5 * (x == hi))


@pytest.mark.parametrize(("x", "lo", "hi"), list(itertools.product([0.0, 1.0, 2.0], repeat=3)))
def test_degenerate_and_crossed_tensor_bounds(x: float, lo: float, hi: float) -> None:
    got = _grad(clamp, torch.tensor([x]), torch.tensor([lo]), torch.tensor([hi]))
    assert tuple(g[0] for g in got) == _reference_weights(x, lo, hi)


def test_values_equal_torch_clamp_including_broadcast_and_mixed_bounds() -> None:
    x = torch.randn(4, 5)
    lo = torch.full((5,), -0.3)
    torch.testing.assert_close(
        clamp(x, lo, torch.tensor(0.4)), torch.clamp(x, lo, torch.tensor(0.4))
    )
    torch.testing.assert_close(clamp(x, lo, 0.4), torch.clamp(torch.clamp_min(x, lo), max=0.4))
    torch.testing.assert_close(clamp(x, -0.2, None), torch.clamp(x, min=-0.2))


def test_broadcast_bound_gradient_is_reduced_to_its_shape() -> None:
    x = torch.tensor([[0.0, 2.0], [0.0, -1.0]])
    lo = torch.zeros(2, requires_grad=True)
    clamp_min(x, lo).sum().backward()
    assert lo.grad.tolist() == [1.0, 1.0]  # type: ignore[union-attr]  # two ties of 0.5; one clamp


# The first forward-AD call imports torch's jvp decompositions, which script with
# torch.jit and warn (DeprecationWarning in 2.13, FutureWarning in 2.14).
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_forward_mode_matches_214() -> None:
    x, lo = torch.tensor(X), torch.zeros(5)
    _, tangent = torch.func.jvp(
        lambda x, lo: clamp(x, lo, torch.ones(5)), (x, lo), (torch.ones(5), 10 * torch.ones(5))
    )
    assert tangent.tolist() == [10.0, 5.5, 1.0, 0.5, 0.0]
    _, t_scalar = torch.func.jvp(lambda x: clamp(x, 0.0, 1.0), (x,), (torch.ones(5),))
    assert t_scalar.tolist() == [0, 0, 1, 0, 0]


def test_vmap_and_gradcheck() -> None:
    xs = torch.randn(3, 4, dtype=torch.double)
    out = torch.vmap(lambda x: clamp(x, -0.5, 0.5))(xs)
    torch.testing.assert_close(out, xs.clamp(-0.5, 0.5))
    lo = torch.full((4,), -0.5, dtype=torch.double, requires_grad=True)
    x = (torch.randn(4, dtype=torch.double) * 2).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, lo: clamp(x, lo, lo + 1.0), (x, lo))


def test_integer_input_and_missing_bounds() -> None:
    assert clamp(torch.arange(5), 1, 3).tolist() == [1, 1, 2, 3, 3]
    with pytest.raises(ValueError, match="at least one of min or max"):
        clamp(torch.ones(1))
    with pytest.raises(TypeError, match="input must be a Tensor"):
        clamp([1.0], 0.0, 1.0)  # type: ignore[arg-type]
