"""while_loop: 2.14 results, early checks, errors naming the carry (torch's types)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import UncapturedHigherOrderOpError

from torchnext.control_flow import while_loop
from torchnext.errors import ControlFlowError, TorchnextError


def test_matches_python_loop_and_torch_while_loop() -> None:
    i, x = torch.tensor(0), torch.zeros(3)
    out = while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x + i), (i, x))
    ref = torch.while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x + i), (i, x))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(out[1], torch.full((3,), 10.0))


def test_nested_carries_and_list_input() -> None:
    carry = [torch.tensor(0), {"acc": torch.ones(2)}]
    i, d = while_loop(lambda i, d: i < 3, lambda i, d: (i + 1, {"acc": d["acc"] * 2}), carry)
    assert int(i) == 3
    torch.testing.assert_close(d["acc"], torch.full((2,), 8.0))


def test_compiled_matches_eager() -> None:
    torch._dynamo.reset()

    def f(n: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return while_loop(lambda i, x: i < n, lambda i, x: (i + 1, x * 2), (torch.tensor(0), x))

    x = torch.ones(2)
    torch.testing.assert_close(
        torch.compile(f, backend="eager", fullgraph=True)(torch.tensor(4), x), f(torch.tensor(4), x)
    )


@pytest.mark.parametrize(
    ("cond_fn", "body_fn", "carry", "match"),
    [
        (1, lambda x: x, (torch.ones(1),), "cond_fn"),
        (lambda x: x.sum() > 0, "body", (torch.ones(1),), "body_fn"),
        (lambda x: x.sum() > 0, lambda x: x, torch.ones(1), "wrap a single carry"),
        (lambda x: x > 0, lambda x: x, (1.5,), r"carried_inputs\[0\] is a float"),
    ],
)
def test_bad_arguments_fail_before_running(
    cond_fn: object, body_fn: object, carry: object, match: str
) -> None:
    with pytest.raises(ControlFlowError, match=match):
        while_loop(cond_fn, body_fn, carry)  # type: ignore[arg-type]


def test_carry_changing_shape_names_the_carry() -> None:
    with pytest.raises(
        UncapturedHigherOrderOpError, match=r"carried_inputs\[1\].*\(3,\).*\(6,\)"
    ) as info:
        while_loop(
            lambda i, x: i < 3,
            lambda i, x: (i + 1, torch.cat([x, x])),
            (torch.tensor(0), torch.zeros(3)),
        )
    assert isinstance(info.value, TorchnextError)


def test_carry_changing_dtype_names_the_carry() -> None:
    with pytest.raises(UncapturedHigherOrderOpError, match=r"carried_inputs\[1\].*float64"):
        while_loop(
            lambda i, x: i < 3, lambda i, x: (i + 1, x.double()), (torch.tensor(0), torch.zeros(3))
        )


def test_non_bool_cond_is_named() -> None:
    with pytest.raises(UncapturedHigherOrderOpError, match="cond_fn must return a bool"):
        while_loop(
            lambda i, x: x.sum(), lambda i, x: (i + 1, x + 1), (torch.tensor(0), torch.zeros(3))
        )


def test_wrong_number_of_outputs_is_named() -> None:
    with pytest.raises(UncapturedHigherOrderOpError, match="body_fn returns 1 leaves"):
        while_loop(lambda i, x: i < 3, lambda i, x: (i + 1,), (torch.tensor(0), torch.zeros(3)))
