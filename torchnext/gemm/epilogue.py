"""The closed set of GEMM epilogues: what may follow ``a @ b + bias`` inside one fused call.

Use it to describe the pointwise work after a GEMM so that :func:`torchnext.gemm.gemm` can
run it inside the GEMM's route (in place on the fresh output, as an oneDNN post-op, in the
Triton template's registers, or in Inductor's generated loop) instead of as separate eager
passes over memory. The set is 2.14's NVGEMM set: extra inputs shaped as a row ``[N]`` /
``[1, N]``, a column ``[M, 1]`` or a full matrix ``[M, N]``; the activations relu, gelu
(exact or tanh), silu, tanh and sigmoid; a residual add; scaling by a constant; the output
cast; and an amax reduction for delayed FP8 scaling. At most four tensors are captured.

Semantics, as equivalent Python (every route computes this, up to rounding)::

    acc_MN = a_MK.float() @ b_KN.float() + (bias_N.float() if bias is not None else 0)
    for step in epilogue.steps:
        acc_MN = step.apply(acc_MN)        # in order; operands broadcast as row/column/full
    if epilogue.amax_into is not None:
        epilogue.amax_into.copy_(acc_MN.abs().amax())   # before the cast
    return acc_MN.to(out_dtype or a.dtype)

What not to assume: routes may apply the steps in a wider dtype than the output (float32
for bfloat16 inputs) and then round once, so results match the eager chain within the
output dtype's rounding, not bit for bit.

Shape legend: M rows of the output, N columns, K the contracted dimension.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from torchnext.errors import GemmInputError

__all__ = [
    "ACTIVATIONS",
    "MAX_CAPTURED",
    "Epilogue",
    "Step",
    "add",
    "gelu",
    "mul",
    "relu",
    "scale",
    "sigmoid",
    "silu",
    "tanh",
]

# 2.14's NVGEMM epilogues capture at most four tensors (cutlass EVT's load set).
MAX_CAPTURED = 4

ActivationName = Literal["relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid"]
StepOp = Literal["relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "add", "mul", "scale"]
OperandKind = Literal["row", "column", "full", "scalar", "none"]

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}

# In-place forms, used on a GEMM's fresh output (nobody else holds it yet).
_INPLACE: dict[str, Callable[[torch.Tensor], object]] = {
    "relu": torch.relu_,
    "gelu": torch.ops.aten.gelu_.default,
    "gelu_tanh": lambda t: torch.ops.aten.gelu_.default(t, approximate="tanh"),
    "silu": lambda t: F.silu(t, inplace=True),
    "tanh": torch.tanh_,
    "sigmoid": torch.sigmoid_,
}


@dataclass(frozen=True, slots=True)
class Step:
    """One epilogue step. Build it with :func:`relu`, :func:`add`, :func:`scale` and friends."""

    op: StepOp
    operand: torch.Tensor | float | None = None

    def kind(self, rows: int, cols: int) -> OperandKind:
        """How the operand broadcasts over an ``[rows, cols]`` output (validated)."""
        t = self.operand
        if t is None:
            return "none"
        if not isinstance(t, torch.Tensor):
            return "scalar"
        shape = tuple(t.shape)
        if shape in ((cols,), (1, cols)):
            return "row"
        if shape == (rows, 1):
            return "column"
        if shape == (rows, cols):
            return "full"
        raise GemmInputError(
            f"epilogue {self.op}(operand): shape {list(shape)} does not fit the output "
            f"[{rows}, {cols}]; expected a row [{cols}] or [1, {cols}], a column [{rows}, 1] or a "
            f"full matrix [{rows}, {cols}] (2.14's epilogue load set); broadcast it yourself to one "
            "of these"
        )

    def apply(self, acc: torch.Tensor) -> torch.Tensor:
        """Out of place, as eager code would write it."""
        if self.op in ACTIVATIONS:
            return ACTIVATIONS[self.op](acc)
        operand = self.operand
        if isinstance(operand, torch.Tensor):
            operand = operand.reshape(acc.shape[-1]) if operand.dim() == 1 else operand
        if self.op == "add":
            return acc + operand  # type: ignore[operator]
        return acc * operand  # type: ignore[operator]  # mul and scale

    def apply_(self, acc: torch.Tensor, rows: slice | None = None) -> None:
        """In place on ``acc``; ``rows`` picks the operand rows when ``acc`` is a row chunk."""
        if self.op in _INPLACE:
            _INPLACE[self.op](acc)
            return
        operand = self.operand
        if isinstance(operand, torch.Tensor):
            if operand.dim() == 1:
                operand = operand.view(1, -1)
            elif rows is not None and operand.shape[0] != 1:
                operand = operand[rows]
        if self.op == "add":
            acc.add_(operand)  # type: ignore[arg-type]
        else:
            acc.mul_(operand)  # type: ignore[arg-type]


def relu() -> Step:
    return Step("relu")


def gelu(approximate: Literal["none", "tanh"] = "none") -> Step:
    """GELU; ``approximate`` as in :func:`torch.nn.functional.gelu`."""
    if approximate not in ("none", "tanh"):
        raise GemmInputError(
            f"gelu(approximate={approximate!r}): expected 'none' or 'tanh' (as F.gelu)"
        )
    return Step("gelu" if approximate == "none" else "gelu_tanh")


def silu() -> Step:
    return Step("silu")


def tanh() -> Step:
    return Step("tanh")


def sigmoid() -> Step:
    return Step("sigmoid")


def add(operand: torch.Tensor) -> Step:
    """Add a row ``[N]``, a column ``[M, 1]`` or a full ``[M, N]`` tensor (residual add)."""
    if not isinstance(operand, torch.Tensor):
        raise GemmInputError(
            f"add(operand): got {type(operand).__name__}; expected a tensor (row, column or "
            "full). For a constant use scale() after the GEMM or fold it into the bias"
        )
    return Step("add", operand)


def mul(operand: torch.Tensor) -> Step:
    """Multiply by a row ``[N]``, a column ``[M, 1]`` or a full ``[M, N]`` tensor."""
    if not isinstance(operand, torch.Tensor):
        raise GemmInputError(
            f"mul(operand): got {type(operand).__name__}; expected a tensor; for a constant "
            "use scale(value)"
        )
    return Step("mul", operand)


def scale(value: float) -> Step:
    """Multiply by a constant (finite)."""
    if isinstance(value, torch.Tensor) or not math.isfinite(float(value)):
        raise GemmInputError(
            f"scale(value): got {value!r}; expected a finite Python float (use mul() for a tensor)"
        )
    return Step("scale", float(value))


class Epilogue:
    """An ordered tuple of :class:`Step` plus an optional amax output.

    ``Epilogue(gelu(), add(residual_MN))`` computes ``gelu(acc) + residual``;
    ``Epilogue(scale(0.5), amax_into=amax)`` also writes ``max|acc|`` (float32, before the
    output cast) into the 0-d tensor ``amax``, as delayed FP8 scaling needs.
    """

    # __weakref__: torchnext.gemm.prepared refers to epilogues without keeping them alive.
    __slots__ = ("steps", "amax_into", "_captured", "_signatures", "_nd", "__weakref__")

    def __init__(self, *steps: Step, amax_into: torch.Tensor | None = None) -> None:
        for i, step in enumerate(steps):
            if not isinstance(step, Step):
                raise GemmInputError(
                    f"Epilogue(steps[{i}]): got {type(step).__name__}; expected a Step built "
                    "with torchnext.gemm.relu(), gelu(), silu(), tanh(), sigmoid(), add(t), "
                    "mul(t) or scale(x)"
                )
        captured = [s.operand for s in steps if isinstance(s.operand, torch.Tensor)]
        if amax_into is not None:
            if (
                not isinstance(amax_into, torch.Tensor)
                or amax_into.numel() != 1
                or amax_into.dtype != torch.float32
            ):
                raise GemmInputError(
                    f"Epilogue(amax_into=...): got {_describe(amax_into)}; expected a float32 "
                    "tensor with one element, e.g. torch.zeros((), dtype=torch.float32)"
                )
            captured.append(amax_into)
        if len(captured) > MAX_CAPTURED:
            raise GemmInputError(
                f"Epilogue: {len(captured)} captured tensors; at most {MAX_CAPTURED} (2.14's "
                "limit); fold row operands together or apply the rest after the call"
            )
        self.steps: tuple[Step, ...] = steps
        self.amax_into = amax_into
        self._captured = tuple(captured)
        self._nd = any(isinstance(s.operand, torch.Tensor) and s.operand.dim() > 2 for s in steps)
        # signature() runs on every gemm() call (it is part of the tuner's key): memoised.
        self._signatures: dict[tuple[int, int], tuple[tuple[str, str, str], ...]] = {}

    @property
    def captured(self) -> tuple[torch.Tensor, ...]:
        return self._captured

    @property
    def has_nd_operand(self) -> bool:
        """Whether a step's operand has more than two dimensions (shaped like an N-D output)."""
        return self._nd

    def signature(self, rows: int, cols: int) -> tuple[tuple[str, str, str], ...]:
        """What a tuned choice depends on: each step's op, operand kind and dtype (validated)."""
        known = self._signatures.get((rows, cols))
        if known is not None:
            return known
        sig: tuple[tuple[str, str, str], ...] = tuple(
            (
                str(s.op),
                s.kind(rows, cols),
                str(s.operand.dtype) if isinstance(s.operand, torch.Tensor) else "",
            )
            for s in self.steps
        )
        sig += (("amax", "none", ""),) if self.amax_into is not None else ()
        self._signatures[(rows, cols)] = sig
        return sig

    def apply(self, acc: torch.Tensor) -> torch.Tensor:
        """The eager chain, out of place (the reference every route is checked against)."""
        for step in self.steps:
            acc = step.apply(acc)
        if self.amax_into is not None:
            self.amax_into.copy_(acc.detach().abs().amax().float())
        return acc

    def apply_(self, acc: torch.Tensor, rows: slice | None = None) -> None:
        """In place on a fresh output (or a row chunk of it); amax is left to the caller."""
        for step in self.steps:
            step.apply_(acc, rows)

    def __repr__(self) -> str:
        parts = [f"{s.op}" + ("" if s.operand is None else "(...)") for s in self.steps]
        if self.amax_into is not None:
            parts.append("amax")
        return f"Epilogue({', '.join(parts)})"


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return repr(value)
