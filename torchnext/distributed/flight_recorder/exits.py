"""Exit records: how ``torchnext fr analyze`` learns that a rank's process died.

A process that dies (gloo aborts one on some size mismatches, the OOM killer, a
segfault) writes no dump, and its peers only see it stop answering: alone, the dumps
make it a *hang*, something to wait for. The launcher knows better, so the two talk
through two small files:

1. A worker's recorder, on its first recorded op, writes a *note* beside the error
   file the launcher gave it (``TORCHNEXT_ERROR_FILE`` + ``.fr.json``): its rank, its
   pid and the folder it dumps into. Nothing is written outside ``torchnext run``.
2. When that worker dies (killed by a signal, or any exit code but 0, a traceback or
   :data:`EXIT_EVICTED`), the launcher writes an *exit record*
   (``torchnext_fr_exit_rank<R>_pid<P>.json``) into that folder.

:func:`load_exit_records` reads them back for the analyzer, which then reports the
rank as crashed. What not to assume: a worker that recorded nothing, or dumps into
a folder the analyzer is not given, leaves no record; the rank is the process's rank
at its first recorded op (for fault-tolerant groups, the rank of that epoch).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_RECORD_PREFIX",
    "ExitRecord",
    "is_exit_record",
    "load_exit_records",
    "note_path",
    "write_exit_record",
    "write_note",
]

logger: logging.Logger = logging.getLogger(__name__)

EXIT_RECORD_PREFIX = "torchnext_fr_exit_"
_KEY = "torchnext_exit"


def note_path(error_file: str | Path) -> Path:
    """Where a worker with this error file leaves its recorder note for the launcher."""
    return Path(f"{error_file}.fr.json")


def write_note(error_file: str | Path, *, rank: int, dump_dir: Path) -> None:
    """The worker's side: tell the launcher where this process dumps (best effort)."""
    path = note_path(error_file)
    doc = {"rank": rank, "pid": os.getpid(), "dump_dir": str(dump_dir.resolve())}
    try:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:  # a missing note costs only the crash diagnosis
        logger.debug("flight recorder: cannot write the launcher note %s: %s", path, exc)


class ExitRecord:
    """One dead worker process: its rank, pid, how it ended, and when."""

    __slots__ = ("rank", "pid", "returncode", "how", "time_ns")

    def __init__(self, rank: int, pid: int, returncode: int, how: str, time_ns: int) -> None:
        self.rank = rank
        self.pid = pid
        self.returncode = returncode
        self.how = how
        self.time_ns = time_ns

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def write_exit_record(error_file: str | Path, *, pid: int, returncode: int) -> Path | None:
    """The launcher's side: record a worker's death where its dumps go; None without a note."""
    note = note_path(error_file)
    try:
        doc = json.loads(note.read_text(encoding="utf-8"))
        rank, folder = int(doc["rank"]), Path(str(doc["dump_dir"]))
        if int(doc["pid"]) != pid:
            return None  # the note of an earlier process in this slot
    except (OSError, ValueError, KeyError, TypeError):
        return None
    record = ExitRecord(rank, pid, returncode, _how(returncode), time.time_ns())
    path = folder / f"{EXIT_RECORD_PREFIX}rank{rank:05d}_pid{pid}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({_KEY: record.to_json()}), encoding="utf-8")
    except OSError as exc:
        logger.warning("cannot write the exit record %s of rank %d: %s", path, rank, exc)
        return None
    return path


def is_exit_record(path: Path) -> bool:
    return path.name.startswith(EXIT_RECORD_PREFIX)


def load_exit_records(folder: Path) -> dict[int, ExitRecord]:
    """Rank -> the latest exit record under ``folder``; unreadable records are skipped."""
    out: dict[int, ExitRecord] = {}
    for path in sorted(folder.rglob(f"{EXIT_RECORD_PREFIX}*.json")):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))[_KEY]
            rec = ExitRecord(
                int(d["rank"]),
                int(d["pid"]),
                int(d["returncode"]),
                str(d["how"]),
                int(d["time_ns"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("skipping unreadable exit record %s: %s", path, exc)
            continue
        old = out.get(rec.rank)
        if old is None or rec.time_ns >= old.time_ns:
            out[rec.rank] = rec
    return out
