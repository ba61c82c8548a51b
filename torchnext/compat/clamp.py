"""``clamp``, ``clamp_min`` and ``clamp_max`` with torch 2.14's boundary gradients.

Use these to get 2.14's gradients on an older torch (or to write code whose gradients
do not change when you upgrade). The values are exactly ``torch.clamp``'s; only the
derivatives at ties differ from torch <= 2.13:

* a **scalar** bound passes no gradient at equality: only the open interval
  ``(min, max)`` passes gradient to ``input`` (like ``hardtanh``);
* a **tensor** bound shares a tie equally, 0.5 to ``input`` and 0.5 to the bound (like
  ``torch.maximum``/``minimum``); when ``min == max`` the side the input lies on takes
  the whole gradient (``input`` itself when all three are equal); when ``min > max`` the
  output is ``max`` and all gradient goes to it.

Reverse mode, forward mode (``torch.func.jvp``) and ``vmap`` are supported. On torch
>= 2.14 the functions are ``torch.clamp`` itself. What not to assume: a ``NaN`` input
gets zero gradient here (the comparisons are false), as in 2.14.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["clamp", "clamp_min", "clamp_max", "NATIVE_214"]

Bound = torch.Tensor | float | int | None


def _version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


NATIVE_214: bool = _version() >= (2, 14)
"""True when the running torch already has 2.14's clamp gradients."""


def _forward_value(x: torch.Tensor, lo: Bound, hi: Bound) -> torch.Tensor:
    if isinstance(lo, torch.Tensor) == isinstance(hi, torch.Tensor) or lo is None or hi is None:
        if lo is None and hi is None:
            raise ValueError(
                "clamp: at least one of min or max must not be None; pass min=... or max=..."
            )
        return torch.clamp(x, lo, hi)  # type: ignore[arg-type]
    # torch.clamp rejects a tensor bound mixed with a number; compose instead.
    return torch.clamp_max(torch.clamp_min(x, lo), hi)


def _weights(
    x: torch.Tensor, lo: Bound, hi: Bound
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Per-element share of the output's derivative owed to ``x``, ``lo`` and ``hi``."""
    one = torch.ones_like(x)
    zero = torch.zeros_like(x)
    half = 0.5 * one
    if isinstance(lo, torch.Tensor) and isinstance(hi, torch.Tensor):
        lo_b, hi_b = torch.broadcast_tensors(lo.to(x.dtype), hi.to(x.dtype))
        ordered, equal = lo_b < hi_b, lo_b == hi_b
        w_x = torch.where(
            ordered,
            ((x > lo_b) & (x < hi_b)).to(x.dtype) + half * (x == lo_b) + half * (x == hi_b),
            torch.where(equal, (x == lo_b).to(x.dtype), zero),
        )
        w_lo = torch.where(
            ordered,
            (x < lo_b).to(x.dtype) + half * (x == lo_b),
            torch.where(equal, (x < lo_b).to(x.dtype), zero),
        )
        w_hi = torch.where(
            ordered,
            (x > hi_b).to(x.dtype) + half * (x == hi_b),
            torch.where(equal, (x > hi_b).to(x.dtype), one),
        )
        return w_x, w_lo, w_hi
    # At most one tensor bound: clamp_max(clamp_min(x, lo), hi), chained.
    w_x = one
    w_lo_opt: torch.Tensor | None = None
    w_hi_opt: torch.Tensor | None = None
    mid = x
    if lo is not None:
        if isinstance(lo, torch.Tensor):
            lo_t = lo.to(x.dtype)
            w_x = (x > lo_t) + half * (x == lo_t)
            w_lo_opt = (x < lo_t) + half * (x == lo_t)
        else:
            w_x = (x > lo).to(x.dtype)
        mid = torch.clamp_min(x, lo)
    if hi is not None:
        if isinstance(hi, torch.Tensor):
            hi_t = hi.to(x.dtype)
            through = (mid < hi_t) + half * (mid == hi_t)
            w_hi_opt = (mid > hi_t) + half * (mid == hi_t)
        else:
            through = (mid < hi).to(x.dtype)
        w_x = w_x * through
        if w_lo_opt is not None:
            w_lo_opt = w_lo_opt * through
    return w_x, w_lo_opt, w_hi_opt


def _sum_to(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if grad.shape == like.shape:
        return grad.to(like.dtype)
    return grad.sum_to_size(like.shape).to(like.dtype)


class _Clamp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, lo: Bound, hi: Bound) -> torch.Tensor:  # type: ignore[override]
        return _forward_value(x, lo, hi)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, lo, hi = inputs
        ctx.lo_scalar = None if isinstance(lo, torch.Tensor) else lo
        ctx.hi_scalar = None if isinstance(hi, torch.Tensor) else hi
        lo_t = lo if isinstance(lo, torch.Tensor) else None
        hi_t = hi if isinstance(hi, torch.Tensor) else None
        ctx.save_for_backward(x, lo_t, hi_t)
        ctx.save_for_forward(x, lo_t, hi_t)

    @staticmethod
    def _bounds(ctx: Any) -> tuple[torch.Tensor, Bound, Bound]:
        x, lo_t, hi_t = ctx.saved_tensors
        lo = lo_t if lo_t is not None else ctx.lo_scalar
        hi = hi_t if hi_t is not None else ctx.hi_scalar
        return x, lo, hi

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, lo, hi = _Clamp._bounds(ctx)
        w_x, w_lo, w_hi = _weights(x, lo, hi)
        g_x = _sum_to(grad_out * w_x, x)
        g_lo = (
            _sum_to(grad_out * w_lo, lo)
            if isinstance(lo, torch.Tensor) and w_lo is not None
            else None
        )
        g_hi = (
            _sum_to(grad_out * w_hi, hi)
            if isinstance(hi, torch.Tensor) and w_hi is not None
            else None
        )
        return g_x, g_lo, g_hi

    @staticmethod
    def jvp(ctx: Any, t_x: torch.Tensor | None, t_lo: Any, t_hi: Any) -> torch.Tensor:
        x, lo, hi = _Clamp._bounds(ctx)
        w_x, w_lo, w_hi = _weights(x, lo, hi)
        out = torch.zeros_like(w_x)
        for weight, tangent in ((w_x, t_x), (w_lo, t_lo), (w_hi, t_hi)):
            if weight is not None and isinstance(tangent, torch.Tensor):
                out = out + weight * tangent
        return out


def _check_input(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: input must be a Tensor, got {type(x).__name__}: {x!r}")
    return x


def clamp(input: torch.Tensor, min: Bound = None, max: Bound = None) -> torch.Tensor:
    """``torch.clamp(input, min, max)`` with 2.14's gradients at the boundaries."""
    x = _check_input("clamp", input)
    if min is None and max is None:
        raise ValueError(
            "clamp: at least one of min or max must not be None; pass min=... or max=..."
        )
    if NATIVE_214 or not (x.is_floating_point() or x.is_complex()):
        return _forward_value(x, min, max)
    return _Clamp.apply(x, min, max)


def clamp_min(input: torch.Tensor, min: torch.Tensor | float | int) -> torch.Tensor:
    """``torch.clamp_min(input, min)`` with 2.14's gradients at the boundary."""
    if min is None:
        raise ValueError("clamp_min: min must not be None; pass a number or a tensor")
    return clamp(input, min, None)


def clamp_max(input: torch.Tensor, max: torch.Tensor | float | int) -> torch.Tensor:
    """``torch.clamp_max(input, max)`` with 2.14's gradients at the boundary."""
    if max is None:
        raise ValueError("clamp_max: max must not be None; pass a number or a tensor")
    return clamp(input, None, max)
