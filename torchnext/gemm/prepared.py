"""Prepared calls: what :func:`torchnext.gemm.linear` resolved for a call it has seen before.

What it is: a bounded per-process table from a call's signature (shapes, dtypes, strides and
devices of ``x``, the weight and the bias, the epilogue object, ``out_dtype`` and the thread
count) to the route the tuner chose and the epilogue flattened for that output shape. A
model's layers make the same calls every step, so after the first call of each the argument
checks, the problem class key and the route lookup are skipped: one dict lookup, the
per-call autograd test, and the route itself.

Why: measured on a CPU, ``linear`` spent about 11 us of Python around a 6 us GEMM, and
twice that right after a large GEMM had evicted the interpreter's data from the caches; on
a 0.4 ms call that is 5 %.

When to use: :func:`torchnext.gemm.linear` uses it; :func:`clear` empties it
(:func:`torchnext.gemm.autotune.clear` calls it).

What not to assume: only plain tensors (no subclasses, so nothing under ``torch.compile``
tracing), more than ``GEMV_MAX_ROWS`` rows, and choices the tuner remembers are kept; a call
whose inputs require grad (with grad mode on) takes the full path every time. A signature
holds its epilogue object (and the tensors it captured) until :func:`clear` or until the
table's :data:`MAX_CALLS` entries are dropped together.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from torchnext.gemm.epilogue import Epilogue
from torchnext.gemm.routes import Route

__all__ = ["MAX_CALLS", "Prepared", "clear", "get", "put", "signature"]

MAX_CALLS = 1024
"""Signatures kept; past this the table is emptied and refills (a model has a few per layer)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a signature resolved to."""

    route: Route
    epilogue: Epilogue | None
    """The caller's epilogue object (held, so its id in the signature cannot be reused)."""
    flat: Epilogue
    """The epilogue with its operands flattened to the 2-D output."""
    out_dtype: torch.dtype
    captured: tuple[torch.Tensor, ...]
    """The epilogue's tensors, tested for ``requires_grad`` on every call."""


_calls: dict[tuple[object, ...], Prepared] = {}
_lock = threading.Lock()


def signature(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    epilogue: Epilogue | None,
    out_dtype: torch.dtype | None,
) -> tuple[object, ...]:
    """The key of a call to ``linear`` with plain-tensor ``x`` and ``weight``."""
    head = (x.shape, x.dtype, x.is_cpu, x.get_device(), x.is_contiguous())
    w = (weight.shape, weight.dtype, weight.stride(), weight.is_cpu, weight.get_device())
    b = None if bias is None else (bias.shape, bias.dtype, bias.is_cpu, bias.get_device())
    return (*head, *w, b, id(epilogue), out_dtype, torch.get_num_threads())


def get(key: tuple[object, ...], epilogue: Epilogue | None) -> Prepared | None:
    """The prepared call for ``key``, or None (also when the epilogue's id was reused)."""
    hit = _calls.get(key)
    return hit if hit is not None and hit.epilogue is epilogue else None


def put(key: tuple[object, ...], prepared: Prepared) -> None:
    """Remember ``prepared`` for ``key`` (the table is emptied when full)."""
    with _lock:
        if len(_calls) >= MAX_CALLS:
            _calls.clear()
        _calls[key] = prepared


def clear() -> None:
    """Forget every prepared call."""
    with _lock:
        _calls.clear()
