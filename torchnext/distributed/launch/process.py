"""The processes an agent starts: their environment, their start, their traceback at exit.

Use :func:`start_worker` to start one process of the job (a worker, a replacement or a
warm spare) the way ``torchnext run`` does: through :mod:`.worker_entry`, with the
``TORCHNEXT_*`` variables that tell it who it is, its output in ``DIR/<name>.log`` when
the agent has a log folder. :func:`collect_traceback` reads what an exited process left
for the agent (the traceback of an uncaught exception) and closes its log.

What not to assume: a :class:`WorkerProcess` is the agent's record of a child process,
not a handle to a member of the group: a warm spare's record becomes a worker's when the
agent assigns it a member id, and keeps its pid, log file and error file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from torchnext._env import (
    TORCHNEXT_ERROR_FILE,
    TORCHNEXT_JOIN,
    TORCHNEXT_MEMBER_ID,
    TORCHNEXT_SPARE,
    TORCHNEXT_STORE_ADDR,
    TORCHNEXT_WORLD_SIZE,
)
from torchnext.distributed.launch.torchrun import PER_PROCESS_VARIABLES

__all__ = [
    "WorkerProcess",
    "collect_traceback",
    "is_stopped",
    "signal_process",
    "start_worker",
]


@dataclass
class WorkerProcess:
    """One child process of the agent."""

    slot: int
    """The worker slot it fills; -1 for a warm spare not assigned yet."""
    member_id: str
    """Its member id (``n0w1``, ``n0w1.r1``); a spare's name (``n0s0``) until assigned."""
    proc: subprocess.Popen[bytes]
    error_file: Path
    started: float
    """``time.monotonic()`` when it was started."""
    log: IO[bytes] | None
    replacement: bool
    """Started (or assigned) to replace a dead worker; a spare is one in waiting."""


def start_worker(
    command: Sequence[str],
    *,
    name: str,
    store_addr: str,
    world_size: int,
    error_file: Path,
    extra_env: Mapping[str, str],
    log_dir: str,
    slot: int,
    join: bool,
    spare: bool = False,
) -> WorkerProcess:
    """Start ``command`` (a script and its arguments, or ``-m module ...``) as ``name``.

    A worker gets ``name`` as its member id; a spare (``spare=True``) gets it as its
    spare name and no member id: it waits in ``Manager.from_env`` to be given one.
    """
    env = dict(os.environ)
    for var in PER_PROCESS_VARIABLES:  # torchrun's values are the agent's, not the worker's
        env.pop(var, None)
    env.update(extra_env)
    env[TORCHNEXT_STORE_ADDR.name] = store_addr
    env[TORCHNEXT_WORLD_SIZE.name] = str(world_size)
    env[TORCHNEXT_JOIN.name] = "1" if join or spare else "0"
    env[TORCHNEXT_ERROR_FILE.name] = str(error_file)
    if spare:
        env.pop(TORCHNEXT_MEMBER_ID.name, None)
        env[TORCHNEXT_SPARE.name] = name
    else:
        env[TORCHNEXT_MEMBER_ID.name] = name
        env.pop(TORCHNEXT_SPARE.name, None)
    argv = [sys.executable, str(Path(__file__).with_name("worker_entry.py")), *command]
    log: IO[bytes] | None = None
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        log = open(Path(log_dir) / f"{name}.log", "ab")  # noqa: SIM115 - closed at its exit
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT if log else None)
    return WorkerProcess(
        slot=slot,
        member_id=name,
        proc=proc,
        error_file=error_file,
        started=time.monotonic(),
        log=log,
        replacement=join,
    )


def collect_traceback(worker: WorkerProcess) -> str:
    """The traceback an exited process left for the agent ('' if none); closes its log."""
    tb = ""
    if worker.error_file.exists():
        tb = worker.error_file.read_text(encoding="utf-8", errors="replace")
    if worker.log is not None:
        if tb:
            # The process left its traceback to the agent (printed once, there); its
            # log keeps a copy so that it reads whole.
            worker.log.write(tb.encode("utf-8", errors="replace"))
        worker.log.close()
    return tb


def signal_process(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send ``sig`` to ``proc``; a process already gone is not an error."""
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def is_stopped(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` is stopped (SIGSTOP, a debugger): it cannot act until continued."""
    try:
        with open(f"/proc/{proc.pid}/stat") as fh:
            raw = fh.read()
    except OSError:
        return False
    # The command name may hold spaces and parentheses; the state follows the last ')'.
    fields = raw.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] in ("T", "t")
