"""The flight-recorder dump format: names, dtype spellings, file naming and safe loading.

Dumps are JSON documents laid out like PyTorch's own flight-recorder dumps (version
``"2.10"``: ``version``, ``pg_config``, ``pg_status``, ``comm_lib_version``,
``nccl_comm_state``, ``entries``), so PyTorch's analyzer logic applies to them, plus one
``torchnext`` object with what PyTorch's format lacks: the dumping process's rank, host,
pid, the reason of the dump and how many entries the ring buffer dropped. Entries carry
PyTorch's keys and a few extra ones (``epoch``, ``group_rank``, ``op``, ``error``).

Used by the writer (:mod:`torchnext.distributed.flight_recorder.buffer`) and the reader
(:mod:`torchnext.distributed.flight_recorder.analyzer`). Loading never unpickles: a dump is data.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

from torchnext.errors import FlightRecorderDumpError

__all__ = [
    "DUMP_VERSION",
    "ACCEPTED_BACKENDS",
    "FR_OP_NAMES",
    "fr_op_name",
    "c10_dtype_name",
    "dump_file_name",
    "load_dump",
]

DUMP_VERSION = "2.10"
"""PyTorch's flight-recorder dump version that our layout follows (torch 2.13 and 2.14)."""

ACCEPTED_BACKENDS = frozenset({"nccl", "ncclx", "xccl", "gloo", "rccl", "rcclx", "mccl", "hccl"})
"""Backend prefixes of ``profiling_name`` that PyTorch's analyzer accepts."""

# Our hook vocabulary (and torch.distributed function names) -> PyTorch's analyzer
# vocabulary. Anything absent is passed through unchanged.
FR_OP_NAMES: dict[str, str] = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "allgather_into_tensor": "_all_gather_base",
    "all_gather_into_tensor": "_all_gather_base",
    "_allgather_base": "_all_gather_base",
    "reducescatter": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "_reduce_scatter_base": "_reduce_scatter_base",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
}


def fr_op_name(op: str) -> str:
    """PyTorch's analyzer name of ``op`` (``allreduce`` -> ``all_reduce``); unknown names pass."""
    return FR_OP_NAMES.get(op, op)


_C10_DTYPES: dict[str, str] = {
    "float32": "Float",
    "float": "Float",
    "float64": "Double",
    "double": "Double",
    "float16": "Half",
    "half": "Half",
    "bfloat16": "BFloat16",
    "int8": "Char",
    "uint8": "Byte",
    "int16": "Short",
    "int32": "Int",
    "int64": "Long",
    "long": "Long",
    "bool": "Bool",
    "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
    "float8_e4m3fn": "Float8_e4m3fn",
    "float8_e5m2": "Float8_e5m2",
}


def c10_dtype_name(name: str) -> str:
    """``"float32"`` -> ``"Float"``: the spelling PyTorch's recorder writes; unknown names pass."""
    return _C10_DTYPES.get(name.removeprefix("torch."), name)


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def dump_file_name(*, rank: int, reason: str, time_ns: int, seq: int) -> str:
    """A file name no other dump can take: rank, host, pid, time and a per-process counter.

    Two processes never share (host, pid) at one instant, and one process never reuses
    ``seq``; the rank comes first so a directory listing sorts by rank.
    """
    host = _SAFE.sub("-", socket.gethostname())[:40] or "host"
    why = _SAFE.sub("-", reason)[:24] or "dump"
    return f"torchnext_fr_rank{rank:05d}_{host}_{os.getpid()}_{time_ns}_{seq:03d}_{why}.json"


_REQUIRED_TOP = ("version", "pg_config", "entries")
_REQUIRED_ENTRY = (
    "record_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "profiling_name",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "is_p2p",
)


def load_dump(path: str | Path) -> dict[str, Any]:
    """Read and validate one dump; :class:`FlightRecorderDumpError` naming ``path`` if bad.

    Validation covers what the analyzer relies on (top-level keys, entry keys and their
    types), so a truncated or hand-edited file fails here with its name, not later with
    a ``KeyError`` deep in the analysis.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FlightRecorderDumpError(
            f"flight-recorder dump {path}: cannot read it ({exc})"
        ) from None
    if not text.strip():
        raise FlightRecorderDumpError(f"flight-recorder dump {path}: the file is empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FlightRecorderDumpError(
            f"flight-recorder dump {path}: not valid JSON at line {exc.lineno} column {exc.colno} "
            f"({exc.msg}); the file is truncated or corrupt — re-dump it or remove it"
        ) from None
    if not isinstance(doc, dict):
        raise FlightRecorderDumpError(
            f"flight-recorder dump {path}: top level is a {type(doc).__name__}, expected an object"
        )
    missing = [k for k in _REQUIRED_TOP if k not in doc]
    if missing:
        raise FlightRecorderDumpError(
            f"flight-recorder dump {path}: missing top-level keys {missing}; "
            "is this a flight-recorder dump?"
        )
    if not isinstance(doc["entries"], list) or not isinstance(doc["pg_config"], dict):
        raise FlightRecorderDumpError(
            f"flight-recorder dump {path}: 'entries' must be a list and 'pg_config' an object"
        )
    for i, entry in enumerate(doc["entries"]):
        if not isinstance(entry, dict):
            raise FlightRecorderDumpError(
                f"flight-recorder dump {path}: entry {i} is not an object"
            )
        lacking = [k for k in _REQUIRED_ENTRY if k not in entry]
        if lacking:
            raise FlightRecorderDumpError(
                f"flight-recorder dump {path}: entry {i} lacks keys {lacking}"
            )
        pg = entry["process_group"]
        if not (isinstance(pg, list) and len(pg) == 2 and all(isinstance(p, str) for p in pg)):
            raise FlightRecorderDumpError(
                f"flight-recorder dump {path}: entry {i} has process_group={pg!r}, "
                "expected [name, desc]"
            )
        if not isinstance(entry["collective_seq_id"], int) or not isinstance(
            entry["record_id"], int
        ):
            raise FlightRecorderDumpError(
                f"flight-recorder dump {path}: entry {i} has non-integer record_id/collective_seq_id"
            )
    meta = doc.get("torchnext")
    if meta is not None and not isinstance(meta, dict):
        raise FlightRecorderDumpError(f"flight-recorder dump {path}: 'torchnext' must be an object")
    return doc
