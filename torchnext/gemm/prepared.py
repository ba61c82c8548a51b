"""Prepared calls: what :func:`torchnext.gemm.linear` resolved for a call it has seen before.

What it is: a bounded per-process table from a call's signature (shapes and dtypes of ``x``,
the weight and the bias, ``x``'s contiguity, the weight's strides, the devices, the epilogue
object, ``out_dtype`` and the thread count) to the route the tuner chose for it. A model's
layers make the same calls every step, so after the first call of each the argument checks,
the problem class key and the route lookup are skipped: one dict lookup, the per-call
autograd test, and the route itself.

Why: measured on a CPU, ``linear`` spent about 11 us of Python around a 6 us GEMM, and
twice that right after a large GEMM had evicted the interpreter's data from the caches; on
a 0.4 ms call that is 5 %. A prepared call spends about 5 us.

When to use: :func:`torchnext.gemm.linear` uses it; :func:`clear` empties it
(:func:`torchnext.gemm.autotune.clear` calls it).

What not to assume:

* Only plain tensors and ``nn.Parameter`` weights (no other subclass, nothing under
  ``torch.compile`` tracing), calls not taken by the GEMV path, epilogues without N-D
  operands (those are reshaped per call), and choices the tuner remembers are kept. A call
  whose inputs or epilogue tensors require grad (with grad mode on) takes the full path.
* The table holds no tensor and no epilogue: an entry refers to its epilogue weakly and is
  found only while that same object lives, so an epilogue built per call (a new residual each
  step) never hits and costs one dead entry, purged when the table fills.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch

from torchnext.gemm.epilogue import Epilogue
from torchnext.gemm.routes import Route

__all__ = ["MAX_CALLS", "Prepared", "clear", "get", "put", "signature"]

MAX_CALLS = 1024
"""Signatures kept (a model has a few per layer); when full, dead entries are dropped, and if
none are, the table is emptied and refills."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a signature resolved to."""

    route: Route
    epilogue: weakref.ref[Epilogue] | None
    """The call's epilogue, weakly (its id is in the signature; a dead one never matches)."""
    out_dtype: torch.dtype


_calls: dict[tuple[object, ...], Prepared] = {}
_lock = threading.Lock()


def signature(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    epilogue: Epilogue | None,
    out_dtype: torch.dtype | None,
) -> tuple[object, ...]:
    """The key of a call to ``linear`` with tensor ``x``, ``weight`` and ``bias`` (or None)."""
    head = (x.shape, x.dtype, x.device, x.is_contiguous())
    w = (weight.shape, weight.dtype, weight.stride(), weight.device)
    b = None if bias is None else (bias.shape, bias.dtype, bias.device)
    return (*head, *w, b, id(epilogue), out_dtype, torch.get_num_threads())


def get(key: tuple[object, ...], epilogue: Epilogue | None) -> Prepared | None:
    """The prepared call for ``key``, or None (also when the epilogue's id was reused)."""
    hit = _calls.get(key)
    if hit is None:
        return None
    ref = hit.epilogue
    if ref is None:
        return hit if epilogue is None else None
    return hit if ref() is epilogue else None


def put(key: tuple[object, ...], prepared: Prepared) -> None:
    """Remember ``prepared`` for ``key`` (see :data:`MAX_CALLS` for a full table)."""
    with _lock:
        if len(_calls) >= MAX_CALLS:
            for k in [
                k for k, v in _calls.items() if v.epilogue is not None and v.epilogue() is None
            ]:
                del _calls[k]
        if len(_calls) >= MAX_CALLS:
            _calls.clear()
        _calls[key] = prepared


def clear() -> None:
    """Forget every prepared call."""
    with _lock:
        _calls.clear()
