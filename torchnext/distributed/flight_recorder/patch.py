"""Flight recording of plain ``torch.distributed`` calls, on any backend and torch version.

:func:`patch` replaces the collective and point-to-point functions of
``torch.distributed`` (and of ``torch.distributed.distributed_c10d``, where they live)
with thin wrappers that describe each call to the recorder (an
:class:`~torchnext.distributed._hooks.OpInfo`: group name and ranks, per-group sequence
number, sizes, dtypes) and report how it ended. Synchronous calls end when they return
or raise; asynchronous ones when their ``Work``'s future completes. A call made while
another wrapped call is running on the same thread (``send`` calls ``isend``) is
recorded once, as the outer call.

Wrapping the Python functions works the same on torch 2.13 and 2.14 and whatever the
backend; 2.14's native per-group pre/post hooks would need attaching to every group as
it is created, and do not see the group's name and member ranks.

What not to assume: a function imported *by name* before :func:`patch` ran
(``from torch.distributed import all_reduce``) keeps the unwrapped function; call
:func:`torchnext.distributed.flight_recorder.enable` early, or use ``dist.all_reduce``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed import distributed_c10d as _c10d

from torchnext.compat.distributed_internals import (
    c10d_world,
    default_group,
    process_group_name,
)
from torchnext.distributed.group.hooks import OpInfo, OpState

__all__ = ["patch", "unpatch", "is_patched", "original"]

logger: logging.Logger = logging.getLogger(__name__)

# function name -> (FR op name, input param, output param, is_p2p, peer param, peer-is-src)
_SPECS: dict[str, tuple[str, str | None, str | None, bool, str | None, bool]] = {
    "all_reduce": ("allreduce", "tensor", "tensor", False, None, False),
    "broadcast": ("broadcast", "tensor", "tensor", False, None, False),
    "reduce": ("reduce", "tensor", "tensor", False, None, False),
    "all_gather": ("allgather", "tensor", "tensor_list", False, None, False),
    "all_gather_into_tensor": (
        "allgather_into_tensor",
        "input_tensor",
        "output_tensor",
        False,
        None,
        False,
    ),
    "all_gather_single": (
        "allgather_into_tensor",
        "input_tensor",
        "output_tensor",
        False,
        None,
        False,
    ),
    "reduce_scatter": ("reducescatter", "input_list", "output", False, None, False),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "input", "output", False, None, False),
    "reduce_scatter_single": ("reduce_scatter_tensor", "input", "output", False, None, False),
    "all_to_all": ("alltoall", "input_tensor_list", "output_tensor_list", False, None, False),
    "all_to_all_single": ("alltoall", "input", "output", False, None, False),
    "gather": ("gather", "tensor", "gather_list", False, None, False),
    "scatter": ("scatter", "scatter_list", "tensor", False, None, False),
    "barrier": ("barrier", None, None, False, None, False),
    "send": ("send", "tensor", None, True, "dst", False),
    "isend": ("send", "tensor", None, True, "dst", False),
    "recv": ("recv", None, "tensor", True, "src", True),
    "irecv": ("recv", None, "tensor", True, "src", True),
}

_ASYNC_ALWAYS = frozenset({"isend", "irecv"})
_originals: dict[str, Callable[..., Any]] = {}
_state = threading.local()
# id(group) -> (weak reference to the group, facts). A WeakKeyDictionary would build a
# weak reference on every lookup; this builds one per group.
_groups: dict[int, tuple[weakref.ref[Any], list[Any]]] = {}
_Observer = Any  # the FlightRecorder; typed loosely to avoid an import cycle


def is_patched() -> bool:
    return bool(_originals)


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def original(fn_name: str) -> Callable[..., Any]:
    """The unwrapped ``torch.distributed`` function ``fn_name`` while patched.

    For measuring what the wrapper costs against the function it wraps.
    """
    fn = _originals.get(fn_name)
    if fn is None:
        raise KeyError(
            f"original(fn_name={fn_name!r}): not patched; call patch() first "
            f"(patched names: {sorted(_originals)})"
        )
    return fn


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _describe(value: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """Sizes/dtypes as PyTorch's recorder writes them: a list of tensors becomes one stacked size."""
    if value is None:
        return (), ()
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape),), (_dtype_name(value.dtype),)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        first = value[0]
        return ((len(value), *first.shape),), (_dtype_name(first.dtype),)
    return (), ()


def _group_facts(group: Any, recorder: _Observer) -> list[Any]:
    """[name, desc, ranks, rank, backend, counters[coll, p2p], recorder] of a group, cached."""
    c10d = _c10d
    pg = group if group is not None else c10d_world().default_pg
    hit = _groups.get(id(pg)) if pg is not None else None
    facts = hit[1] if hit is not None and hit[0]() is pg else None
    if facts is None:
        if pg is None:
            pg = default_group()  # raises torch's own "not initialized" error
        try:
            name = process_group_name(pg)
        except Exception:  # noqa: BLE001 - names are best effort; the id still separates groups
            name = f"pg{id(pg):x}"
        desc = getattr(pg, "group_desc", "") or name
        ranks = tuple(c10d.get_process_group_ranks(pg))
        rank = c10d.get_rank(pg)
        backend = str(c10d.get_backend(pg)).split(":")[-1].split(",")[0]
        facts = [name, desc, ranks, rank, backend, [0, 0], None]
        _groups[id(pg)] = (weakref.ref(pg), facts)
    if facts[6] is not recorder:  # tell each recorder once about the group
        recorder.set_group_info(facts[0], backend=facts[4], desc=facts[1])
        facts[6] = recorder
    return facts


def _wrap(
    fn_name: str, fn: Callable[..., Any], recorder_ref: Callable[[], _Observer | None]
) -> Callable[..., Any]:
    op, in_param, out_param, is_p2p, peer_param, peer_is_src = _SPECS[fn_name]
    params = list(inspect.signature(fn).parameters)
    index = {p: i for i, p in enumerate(params)}
    group_dst_param = "group_src" if peer_is_src else "group_dst"
    always_async = fn_name in _ASYNC_ALWAYS

    def arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> Any:
        if name is None:
            return None
        if name in kwargs:
            return kwargs[name]
        i = index.get(name, -1)
        return args[i] if 0 <= i < len(args) else None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recorder = recorder_ref()
        if recorder is None or getattr(_state, "depth", False):
            return fn(*args, **kwargs)
        try:
            info = _make_info(args, kwargs, recorder)
            token = recorder.on_start(info)
        except Exception:  # noqa: BLE001 - recording must never break the call
            logger.debug("flight recorder: cannot describe %s call", fn_name, exc_info=True)
            return fn(*args, **kwargs)
        _state.depth = True
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            recorder.on_finish(token, _classify(exc), error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            _state.depth = False
        if result is None or not (always_async or arg(args, kwargs, "async_op")):
            recorder.on_finish(token, "completed")
        else:
            _on_work_done(result, recorder, token)
        return result

    def _make_info(args: tuple[Any, ...], kwargs: dict[str, Any], recorder: _Observer) -> OpInfo:
        name, _desc, ranks, rank, _backend, counters, _ = _group_facts(
            arg(args, kwargs, "group"), recorder
        )
        in_sizes, in_dtypes = _describe(arg(args, kwargs, in_param))
        out_sizes, out_dtypes = _describe(arg(args, kwargs, out_param))
        op_text = op
        if is_p2p:
            counters[1] += 1
            seq = counters[1]
            peer_group = arg(args, kwargs, group_dst_param)
            if peer_group is None:
                peer_global = arg(args, kwargs, peer_param)
                peer_group = ranks.index(peer_global) if peer_global in ranks else -1
            src, dst = (peer_group, rank) if peer_is_src else (rank, peer_group)
            op_text = f"{op} {src}->{dst}" if op == "send" else f"{op} {dst}<-{src}"
        else:
            counters[0] += 1
            seq = counters[0]
        return OpInfo(
            group_name=name,
            epoch=0,
            seq=seq,
            op=op_text,
            rank=rank,
            ranks=ranks,
            input_sizes=in_sizes,
            input_dtypes=in_dtypes,
            output_sizes=out_sizes,
            output_dtypes=out_dtypes,
            is_p2p=is_p2p,
        )

    wrapper.__torchnext_fr_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _classify(exc: BaseException) -> OpState:
    text = str(exc).lower()
    if isinstance(exc, TimeoutError) or "timed out" in text or "timeout" in text:
        return "timed_out"
    return "failed"


def _on_work_done(work: Any, recorder: _Observer, token: int) -> None:
    try:
        future = work.get_future()
    except Exception:  # noqa: BLE001 - some Works have no future; the entry stays "started"
        return

    def done(fut: Any) -> None:
        try:
            fut.value()
        except BaseException as exc:  # noqa: BLE001
            recorder.on_finish(token, _classify(exc), error=f"{type(exc).__name__}: {exc}")
            return
        recorder.on_finish(token, "completed")

    future.add_done_callback(done)


def patch(recorder_ref: Callable[[], _Observer | None]) -> None:
    """Wrap the ``torch.distributed`` functions; ``recorder_ref()`` gives the recorder (or None)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if _originals:
        return
    for fn_name in _SPECS:
        fn = getattr(c10d, fn_name, None)
        if fn is None:
            continue
        _originals[fn_name] = fn
        wrapped = _wrap(fn_name, fn, recorder_ref)
        setattr(c10d, fn_name, wrapped)
        if getattr(dist, fn_name, None) is fn:
            setattr(dist, fn_name, wrapped)


def unpatch() -> None:
    """Restore the original ``torch.distributed`` functions."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for fn_name, fn in _originals.items():
        if getattr(getattr(c10d, fn_name, None), "__torchnext_fr_wrapped__", None) is fn:
            setattr(c10d, fn_name, fn)
        if getattr(getattr(dist, fn_name, None), "__torchnext_fr_wrapped__", None) is fn:
            setattr(dist, fn_name, fn)
    _originals.clear()
