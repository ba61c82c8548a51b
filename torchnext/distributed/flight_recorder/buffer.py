"""The flight recorder's ring buffer: record ops cheaply, snapshot and dump them safely.

A :class:`FlightRecorder` is an :class:`~torchnext.distributed._hooks.OpObserver`. Its
buffer is a set of parallel Python lists allocated once (``buffer_size`` slots) and
reused slot by slot: recording an op stores references and integers into existing
slots, so the steady state allocates nothing but the timestamp ints Python makes
anyway. The :class:`~torchnext.distributed._hooks.OpInfo` a group built for the op is
kept by reference (it is frozen and describes tensors without holding them).

Dumping never blocks on a hung thread: the buffer is copied under the recorder's lock,
taken with a short bound (a thread cannot hang *inside* the lock: its critical sections
are a few list stores, but a signal handler can interrupt the thread that holds it); if
the bound runs out the copy is taken without the lock and the dump says so
(``torchnext.consistent = false``). Formatting and writing happen outside the lock.

What not to assume: entries are process-wide (all groups in one buffer, as in PyTorch);
``record_id`` counts every op this process recorded, so gaps mean the ring wrapped.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed

from torchnext.distributed.flight_recorder.exits import write_note
from torchnext.distributed.flight_recorder.format import (
    ACCEPTED_BACKENDS,
    DUMP_VERSION,
    c10_dtype_name,
    dump_file_name,
    fr_op_name,
)
from torchnext.distributed.group.hooks import OpInfo, OpState

__all__ = ["FlightRecorderConfig", "FlightRecorder"]

logger: logging.Logger = logging.getLogger(__name__)

_STARTED = "started"
# Frames inside torchnext.distributed (this file sits one level below it) and
# torch.distributed are ours, not the user's: the recorded stack starts below them.
_INTERNAL_PREFIXES = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(torch.distributed.__file__)) + os.sep,
)
_FAILURE_STATES = frozenset({"failed", "timed_out", "revoked"})


@dataclass(frozen=True, kw_only=True)
class FlightRecorderConfig:
    """How a :class:`FlightRecorder` records and when it dumps by itself."""

    buffer_size: int = 2000
    """Entries kept; older ones are overwritten (PyTorch's tutorial default is 2000 too)."""
    stacks: bool = False
    """Record the Python stack of each op (about 10x the cost of a plain record)."""
    stack_depth: int = 16
    """Frames kept per stack, innermost first, when ``stacks`` is on."""
    dump_dir: str = ""
    """Folder for dumps; empty means ``TORCHNEXT_FR_DUMP_DIR`` or ``./torchnext-fr``."""
    dump_on_failure: bool = True
    """Dump when an op ends failed, timed out or revoked (once per epoch and reason)."""
    max_auto_dumps: int = 8
    """Bound on automatic dumps per process, so a failure storm cannot fill a disk."""
    lock_timeout: timedelta = timedelta(milliseconds=50)
    """Bound on waiting for the buffer lock while dumping; past it the copy is lock-free."""
    backend: str = "gloo"
    """Backend written in ``profiling_name`` for groups that did not name theirs."""
    stuck_dump_after: timedelta | None = None
    """If set, a watchdog thread dumps (once per epoch) when an op has been running this
    long: a hang is captured even when the backend's own timeout is far away (gloo's
    default is 30 minutes). ``TORCHNEXT_FR_STUCK_DUMP_S`` sets it for recorders configured
    from the environment (60 s when ``TORCHNEXT_FR_ENABLE`` turned the recorder on)."""

    def __post_init__(self) -> None:
        if self.buffer_size < 1:
            raise ValueError(
                f"FlightRecorderConfig.buffer_size={self.buffer_size}; need >= 1 (default 2000)"
            )
        if self.stack_depth < 1:
            raise ValueError(f"FlightRecorderConfig.stack_depth={self.stack_depth}; need >= 1")
        if self.max_auto_dumps < 0:
            raise ValueError(
                f"FlightRecorderConfig.max_auto_dumps={self.max_auto_dumps}; need >= 0"
            )
        if self.stuck_dump_after is not None and self.stuck_dump_after <= timedelta(0):
            raise ValueError(
                f"FlightRecorderConfig.stuck_dump_after={self.stuck_dump_after}; pass a positive "
                "timedelta or None"
            )
        if self.lock_timeout < timedelta(0):
            raise ValueError(f"FlightRecorderConfig.lock_timeout={self.lock_timeout}; need >= 0")


_Frames = tuple[tuple[str, str, int], ...]


def _names(cache: dict[tuple[str, ...], list[str]], dtypes: tuple[str, ...]) -> list[str]:
    names = cache.get(dtypes)
    if names is None:
        names = [c10_dtype_name(d) for d in dtypes]
        cache[dtypes] = names
    return names


class FlightRecorder:
    """Bounded ring buffer of communication ops, dumpable to PyTorch-style JSON.

    Register it with :func:`torchnext.distributed._hooks.register_observer` (the
    public :func:`torchnext.distributed.flight_recorder.enable` does it), or call
    :meth:`on_start`/:meth:`on_finish` yourself.
    """

    def __init__(self, config: FlightRecorderConfig | None = None) -> None:
        self.config = config if config is not None else FlightRecorderConfig()
        n = self.config.buffer_size
        self._n = n
        self._lock = threading.Lock()
        self._next_id = 0
        # Parallel slot arrays, allocated once; slot = record_id % n.
        self._ids: list[int] = [-1] * n
        self._infos: list[OpInfo | None] = [None] * n
        self._states: list[str] = [""] * n
        self._t_start: list[int] = [0] * n
        self._t_end: list[int] = [0] * n
        self._tids: list[int] = [0] * n
        self._frames: list[_Frames | None] = [None] * n
        self._errors: list[str | None] = [None] * n
        self._stacks = self.config.stacks
        self._backends: dict[str, str] = {}
        self._descs: dict[str, str] = {}
        self._rank: int | None = None
        self._dump_seq = 0
        self._auto_dumps = 0
        self._auto_dumped: set[tuple[str, int]] = set()
        self._dump_lock = threading.Lock()
        self._meta: dict[str, Any] = {}
        self.last_dump_path: Path | None = None
        self.dump_listeners: list[Callable[[Path], None]] = []
        self._closed = threading.Event()
        if self.config.stuck_dump_after is not None:
            threading.Thread(
                target=self._watchdog, name="torchnext-fr-watchdog", daemon=True
            ).start()

    def close(self) -> None:
        """Stop the watchdog thread, if any (the buffer stays readable)."""
        self._closed.set()

    def _watchdog(self) -> None:
        after = self.config.stuck_dump_after
        if after is None:
            return
        after_ns = int(after.total_seconds() * 1e9)
        period = min(1.0, after.total_seconds() / 4)
        while not self._closed.wait(period):
            now = time.time_ns()
            # Lock-free scan of list copies: the watchdog must never stall recording.
            for state, t0, info in zip(
                list(self._states), list(self._t_start), list(self._infos), strict=True
            ):
                if state == _STARTED and info is not None and now - t0 > after_ns:
                    self.auto_dump(
                        "stuck",
                        info.epoch,
                        stuck={
                            "group": info.group_name,
                            "seq": info.seq,
                            "op": info.op,
                            "running_s": (now - t0) / 1e9,
                        },
                    )
                    break

    # ----------------------------------------------------------------- recording

    def on_start(self, info: OpInfo) -> int:
        """Record ``info`` as started; returns the record id (the token for :meth:`on_finish`)."""
        frames = self._capture_stack() if self._stacks else None
        now = time.time_ns()
        tid = threading.get_ident()
        with self._lock:
            rid = self._next_id
            self._next_id = rid + 1
            s = rid % self._n
            # Seqlock order: invalidate, fill, publish; a lock-free reader keeps a slot
            # only if it saw the same id before and after copying the fields.
            self._ids[s] = -1
            self._infos[s] = info
            self._states[s] = _STARTED
            self._t_start[s] = now
            self._t_end[s] = 0
            self._tids[s] = tid
            self._frames[s] = frames
            self._errors[s] = None
            self._ids[s] = rid
        if rid == 0:
            self._note_for_launcher()
        return rid

    def _note_for_launcher(self) -> None:
        # Under `torchnext run`, tell the launcher where this process dumps, so that
        # if it dies without a dump the launcher can leave an exit record there.
        from torchnext._env import TORCHNEXT_ERROR_FILE

        error_file = TORCHNEXT_ERROR_FILE.get()
        if error_file:
            write_note(error_file, rank=self.rank, dump_dir=self.dump_dir())

    def on_finish(self, token: int, state: OpState, error: str | None = None) -> None:
        """Mark record ``token`` as ended in ``state`` (a no-op if the ring overwrote it)."""
        now = time.time_ns()
        info = None
        with self._lock:
            s = token % self._n
            if self._ids[s] == token:
                self._states[s] = state
                self._t_end[s] = now
                if error is not None:
                    self._errors[s] = error[:500]
                info = self._infos[s]
        if state in _FAILURE_STATES and self.config.dump_on_failure and info is not None:
            self.auto_dump(state, info.epoch)

    def _capture_stack(self) -> _Frames:
        frames: list[tuple[str, str, int]] = []
        frame: FrameType | None = sys._getframe(2)  # skip this and on_start
        # Skip the communication layers (hook dispatch, groups, torch.distributed
        # wrappers): the stack starts at the code that issued the op.
        while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_PREFIXES):
            frame = frame.f_back
        depth = self.config.stack_depth
        while frame is not None and len(frames) < depth:
            code = frame.f_code
            frames.append((code.co_name, code.co_filename, frame.f_lineno))
            frame = frame.f_back
        return tuple(frames)

    def set_group_info(
        self, group_name: str, *, backend: str | None = None, desc: str | None = None
    ) -> None:
        """Name the backend (written in ``profiling_name``) and description of a group."""
        if backend is not None:
            self._backends[group_name] = backend
        if desc is not None:
            self._descs[group_name] = desc

    def set_rank(self, rank: int) -> None:
        """This process's global rank, written in dump names; else taken from the first op."""
        self._rank = rank

    def set_metadata(self, **meta: Any) -> None:
        """Extra JSON-serialisable facts written in every dump's ``torchnext`` object."""
        self._meta.update(meta)

    @property
    def rank(self) -> int:
        if self._rank is not None:
            return self._rank
        # Lock-free on purpose: dumps read it, and a dump must not wait on the lock.
        for info in list(self._infos):
            if info is not None:
                return info.ranks[info.rank] if info.rank < len(info.ranks) else info.rank
        return 0

    def __len__(self) -> int:
        return min(self._next_id, self._n)

    def reset(self) -> None:
        """Forget every entry (the counters keep counting, as record ids must stay unique)."""
        with self._lock:
            for s in range(self._n):
                self._ids[s] = -1
                self._infos[s] = None
                self._frames[s] = None
                self._errors[s] = None

    # ----------------------------------------------------------------- snapshot / dump

    def _snapshot(self) -> tuple[list[tuple[Any, ...]], int, bool]:
        """Copy of the live slots, oldest first; (rows, total recorded, consistent)."""
        bound = self.config.lock_timeout.total_seconds()
        locked = (
            self._lock.acquire(timeout=bound) if bound > 0 else self._lock.acquire(blocking=False)
        )
        try:
            total = self._next_id
            # list() copies are atomic per list under the GIL; rows are checked below.
            ids = list(self._ids)
            infos = list(self._infos)
            states = list(self._states)
            t0 = list(self._t_start)
            t1 = list(self._t_end)
            tids = list(self._tids)
            frames = list(self._frames)
            errors = list(self._errors)
            ids_after = list(self._ids) if not locked else ids
        finally:
            if locked:
                self._lock.release()
        rows = []
        for s in range(self._n):
            if ids[s] < 0 or infos[s] is None or ids[s] != ids_after[s]:
                continue
            rows.append((ids[s], infos[s], states[s], t0[s], t1[s], tids[s], frames[s], errors[s]))
        rows.sort(key=lambda r: r[0])
        return rows, total, locked

    def to_dict(self, *, reason: str = "on_demand", only_active: bool = False) -> dict[str, Any]:
        """The dump as a JSON-ready dict (PyTorch's layout plus a ``torchnext`` object)."""
        t_begin = time.perf_counter()
        rows, total, consistent = self._snapshot()
        names = {t.ident: t.name for t in threading.enumerate()}
        pg_ids: dict[str, int] = {}
        pg_config: dict[str, dict[str, str]] = {}
        status: dict[str, dict[str, int]] = {}
        entries = []
        dtype_names: dict[tuple[str, ...], list[str]] = {}
        frame_dicts: dict[_Frames, list[dict[str, Any]]] = {}
        for rid, info, state, t0, t1, tid, frames, error in rows:
            if only_active and state != _STARTED:
                continue
            pg_name = info.group_name if info.epoch == 0 else f"{info.group_name}@e{info.epoch}"
            if pg_name not in pg_ids:
                pg_ids[pg_name] = len(pg_ids)
                pg_config[pg_name] = {
                    "name": pg_name,
                    "desc": self._descs.get(info.group_name, info.group_name),
                    "ranks": str(list(info.ranks)),
                }
            pg_id = pg_ids[pg_name]
            op = fr_op_name(info.op.split(" ", 1)[0])
            backend = self._backends.get(info.group_name, self.config.backend)
            if backend not in ACCEPTED_BACKENDS:
                backend = self.config.backend
            peer = info.op.split(" ", 1)[1] if " " in info.op else ""
            profiling = f"{backend}:{op}" + (f" {peer}" if peer else "")
            st = status.setdefault(
                str(pg_id),
                {
                    "last_enqueued_collective": -1,
                    "last_started_collective": -1,
                    "last_completed_collective": -1,
                },
            )
            if not info.is_p2p:
                st["last_enqueued_collective"] = max(st["last_enqueued_collective"], info.seq)
                st["last_started_collective"] = max(st["last_started_collective"], info.seq)
                if state == "completed":
                    st["last_completed_collective"] = max(st["last_completed_collective"], info.seq)
            entry: dict[str, Any] = {
                "record_id": rid,
                "pg_id": pg_id,
                "process_group": [pg_name, pg_config[pg_name]["desc"]],
                "collective_seq_id": 0 if info.is_p2p else info.seq,
                "p2p_seq_id": info.seq if info.is_p2p else 0,
                "op_id": info.seq,
                "profiling_name": profiling,
                "time_created_ns": t0,
                "time_discovered_started_ns": t0,
                "time_discovered_completed_ns": t1,
                "input_sizes": [list(s) for s in info.input_sizes],
                "input_dtypes": _names(dtype_names, info.input_dtypes),
                "output_sizes": [list(s) for s in info.output_sizes],
                "output_dtypes": _names(dtype_names, info.output_dtypes),
                "state": state,
                "retired": state != _STARTED,
                "timeout_ms": info.timeout_ms,
                "is_p2p": info.is_p2p,
                "thread_id": str(tid),
                "thread_name": names.get(tid, ""),
                "epoch": info.epoch,
                "group_name": info.group_name,
                "group_rank": info.rank,
                "op": info.op,
            }
            if t1:
                entry["duration_ms"] = (t1 - t0) / 1e6
            if frames:
                # Stacks repeat (ops issued from loops): build each distinct one once.
                fd = frame_dicts.get(frames)
                if fd is None:
                    fd = [{"name": n, "filename": f, "line": ln} for n, f, ln in frames]
                    frame_dicts[frames] = fd
                entry["frames"] = fd
            if error:
                entry["error"] = error
            entries.append(entry)
        dropped = max(0, total - self._n)
        return {
            "version": DUMP_VERSION,
            "pg_config": pg_config,
            "pg_status": status,
            "comm_lib_version": "",
            "nccl_comm_state": {},
            "entries": entries,
            "torchnext": {
                "rank": self.rank,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "reason": reason,
                "time_ns": time.time_ns(),
                "recorded": total,
                "dropped_entries": dropped,
                "buffer_size": self._n,
                "consistent": consistent,
                "snapshot_ms": (time.perf_counter() - t_begin) * 1e3,
                **self._meta,
            },
        }

    def dump_dir(self) -> Path:
        if self.config.dump_dir:
            return Path(self.config.dump_dir)
        from torchnext._env import TORCHNEXT_FR_DUMP_DIR

        configured = TORCHNEXT_FR_DUMP_DIR.get()
        return Path(configured) if configured else Path.cwd() / "torchnext-fr"

    def dump(
        self, directory: str | Path | None = None, *, reason: str = "on_demand", **meta: Any
    ) -> Path:
        """Write one dump file; returns its path. Never overwrites an earlier dump."""
        doc = self.to_dict(reason=reason)
        if meta:
            doc["torchnext"].update(meta)
        folder = Path(directory) if directory is not None else self.dump_dir()
        folder.mkdir(parents=True, exist_ok=True)
        with self._dump_lock:
            self._dump_seq += 1
            seq = self._dump_seq
        name = dump_file_name(
            rank=doc["torchnext"]["rank"], reason=reason, time_ns=time.time_ns(), seq=seq
        )
        path = folder / name
        tmp = folder / f".{name}.tmp"
        # Write then rename: a reader never sees a half-written file under the final name.
        tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, path)
        self.last_dump_path = path
        for listener in list(self.dump_listeners):
            try:
                listener(path)
            except Exception:  # noqa: BLE001 - a listener must not break a dump
                logger.exception("flight-recorder dump listener %r raised", listener)
        return path

    def auto_dump(self, reason: str, epoch: int, **meta: Any) -> Path | None:
        """Dump once per (reason, epoch), at most ``max_auto_dumps`` times; never raises."""
        key = (reason, epoch)
        with self._dump_lock:
            if key in self._auto_dumped or self._auto_dumps >= self.config.max_auto_dumps:
                return None
            self._auto_dumped.add(key)
            self._auto_dumps += 1
        try:
            path = self.dump(reason=reason, **meta)
        except Exception:  # noqa: BLE001 - dumping must never turn a failure into another
            logger.exception("flight recorder: automatic dump (%s) failed", reason)
            return None
        logger.warning("flight recorder: %s in epoch %d; dumped %s", reason, epoch, path)
        return path
