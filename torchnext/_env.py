"""Every ``TORCHNEXT_*`` environment variable, typed and documented in one place.

Precedence, everywhere in torchnext: an explicit argument to a function or config
wins; else the environment variable; else the default below. (torchft lets the
environment win over arguments; we do not, because a stray variable in a job
template should never silently override what the code says.)

Read a variable with ``ENV_NAME.get()``; never call ``os.environ`` for a
``TORCHNEXT_*`` name elsewhere. ``torchnext doctor`` lists them all with their values.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

__all__ = ["EnvVar", "ALL_VARS", "describe"]

T = TypeVar("T")


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected one of 1/0, true/false, yes/no, on/off; got {raw!r}")


def _parse_seconds(raw: str) -> timedelta:
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"expected a number of seconds, e.g. 0.2; got {raw!r}") from None
    # float() accepts "nan" and "inf"; neither is an interval or a timeout.
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a finite, non-negative number of seconds; got {raw!r}")
    return timedelta(seconds=seconds)


def _parse_seconds_or_off(raw: str) -> timedelta | None:
    """A positive number of seconds, or 0 for "off" (None)."""
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"expected a number of seconds (0 turns it off); got {raw!r}") from None
    # float() accepts "nan" and "inf"; neither is a delay a watchdog can wait for.
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"expected a finite, non-negative number of seconds (0 turns it off); got {raw!r}"
        )
    if seconds == 0:
        return None
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        limit = int(timedelta.max.total_seconds())
        raise ValueError(f"expected fewer than {limit} seconds; got {raw!r}") from None


def _parse_int(raw: str) -> int:
    return int(raw.strip())


def _parse_str(raw: str) -> str:
    return raw


@dataclass(frozen=True, kw_only=True)
class EnvVar(Generic[T]):
    """One environment variable: its name, type (via ``parse``), default and meaning."""

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def get(self) -> T:
        """The typed value; the default when unset; ``ValueError`` naming the variable if bad."""
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(
                f"environment variable {self.name}={raw!r} is invalid: {exc}. "
                f"Fix the value or unset it (default: {_shown(self.default)})."
            ) from None

    def is_set(self) -> bool:
        return self.name in os.environ


ALL_VARS: list[EnvVar[object]] = []


def _shown(value: object) -> str:
    """A default as a user would write it in the variable (seconds for a timedelta)."""
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}"
    return repr(value)


def _var(name: str, default: T, parse: Callable[[str], T], doc: str) -> EnvVar[T]:
    var = EnvVar(name=name, default=default, parse=parse, doc=doc)
    ALL_VARS.append(var)  # type: ignore[arg-type]
    return var


# --------------------------------------------------------------------------- distributed

TORCHNEXT_COLLECTIVE_TIMEOUT = _var(
    "TORCHNEXT_COLLECTIVE_TIMEOUT",
    timedelta(seconds=60),
    _parse_seconds,
    "Per-op timeout of fault-tolerant collectives, in seconds, when the call gives none.",
)
TORCHNEXT_HEARTBEAT_INTERVAL = _var(
    "TORCHNEXT_HEARTBEAT_INTERVAL",
    timedelta(milliseconds=100),
    _parse_seconds,
    "Interval between liveness heartbeats written to the store, in seconds (default 0.1; "
    "0.2 on an etcd store, where each beat is a replicated write).",
)
TORCHNEXT_HEARTBEAT_TIMEOUT = _var(
    "TORCHNEXT_HEARTBEAT_TIMEOUT",
    # 1.5 s: a host that lost power or its network is seen within about 1.7 s (this plus
    # up to two heartbeat intervals). The monitor counts a peer's silence only while it
    # watches (its own stalls and store outages are credited, see group/heartbeat.py),
    # so a loaded machine no longer needs the 3 s this was: on a 2-core machine at a
    # load average of 13 to 19, live peers' longest silence stayed under 0.25 s.
    timedelta(milliseconds=1500),
    _parse_seconds,
    "A peer whose heartbeat has not advanced for this many seconds is suspected failed "
    "(a hung process, a silent host; crashed local peers are detected sooner).",
)
TORCHNEXT_BEACONS = _var(
    "TORCHNEXT_BEACONS",
    True,
    _parse_bool,
    "Members also send each other UDP heartbeat datagrams (GroupConfig.beacons); set 0 where "
    "UDP between hosts is blocked or unwanted: only a host lost together with the store "
    "is then detected later (after the store recovers).",
)
TORCHNEXT_STORE_TIMEOUT = _var(
    "TORCHNEXT_STORE_TIMEOUT",
    timedelta(seconds=30),
    _parse_seconds,
    "Bound on connecting to and waiting on the rendezvous store, in seconds; a store that "
    "answers nothing for this long is lost (workers exit, agents say so).",
)
TORCHNEXT_ETCD_REQUEST_TIMEOUT = _var(
    "TORCHNEXT_ETCD_REQUEST_TIMEOUT",
    # 0.3 s: a member that went silent (its host lost power) holds a request this long
    # before the next member is tried, and a follower that still waits for a dead leader
    # as long; etcd answers a live member's request in milliseconds, and a slow answer
    # only moves the request to another member.
    timedelta(milliseconds=300),
    _parse_seconds,
    "With an etcd store (etcd://...): bound on one request to one etcd member, in seconds, "
    "before the next member is tried; keep it below the heartbeat timeout, so a member "
    "that went silent delays a worker's heartbeat by less than a peer would suspect.",
)
TORCHNEXT_JOIN = _var(
    "TORCHNEXT_JOIN",
    False,
    _parse_bool,
    "Set by `torchnext run` on a replacement worker: join the running group and heal "
    "from a live peer instead of creating the group.",
)
TORCHNEXT_SPARE = _var(
    "TORCHNEXT_SPARE",
    "",
    _parse_str,
    "Set by `torchnext run --spares` on a warm spare: its name (n0s0). The process runs "
    "the script up to Manager.from_env, waits there for the agent to give it the member "
    "id of a dead worker, then joins like a replacement (see torchnext.distributed.is_spare).",
)
TORCHNEXT_ERROR_FILE = _var(
    "TORCHNEXT_ERROR_FILE",
    "",
    _parse_str,
    "Set by `torchnext run`: file where a worker writes the traceback of an uncaught "
    "exception, so the agent reports it and does not restart the worker.",
)
TORCHNEXT_STORE_ADDR = _var(
    "TORCHNEXT_STORE_ADDR",
    "",
    _parse_str,
    "host:port of the TCPStore that fault-tolerant groups rendezvous through "
    "(FaultTolerantGroup.from_env); it must live outside the workers.",
)
TORCHNEXT_MEMBER_ID = _var(
    "TORCHNEXT_MEMBER_ID",
    "",
    _parse_str,
    "This process's stable member id in a fault-tolerant group (FaultTolerantGroup.from_env).",
)
TORCHNEXT_WORLD_SIZE = _var(
    "TORCHNEXT_WORLD_SIZE",
    0,
    _parse_int,
    "Number of initial members of a fault-tolerant group (FaultTolerantGroup.from_env).",
)
TORCHNEXT_GROUP_SIZE = _var(
    "TORCHNEXT_GROUP_SIZE",
    1,
    _parse_int,
    "Set by `torchnext run --group-size G`: processes per replica group (HSDP); 1 means "
    "every process is a whole replica (DDP-style).",
)
TORCHNEXT_REPLICA_ID = _var(
    "TORCHNEXT_REPLICA_ID",
    "",
    _parse_str,
    "Set by `torchnext run --group-size G`: this incarnation of this process's replica "
    "group (n0g1, n0g1.r2); its G processes share it and form the replica's shard group.",
)
TORCHNEXT_SHARD_INDEX = _var(
    "TORCHNEXT_SHARD_INDEX",
    0,
    _parse_int,
    "Set by `torchnext run --group-size G`: this process's shard index (0..G-1) inside "
    "its replica group.",
)
TORCHNEXT_FR_ENABLE = _var(
    "TORCHNEXT_FR_ENABLE",
    False,
    _parse_bool,
    "Enable the flight recorder for plain torch.distributed calls at import of "
    "torchnext.distributed.",
)
TORCHNEXT_FR_BUFFER_SIZE = _var(
    "TORCHNEXT_FR_BUFFER_SIZE",
    2000,
    _parse_int,
    "Entries kept in the flight recorder's ring buffer.",
)
TORCHNEXT_FR_DUMP_DIR = _var(
    "TORCHNEXT_FR_DUMP_DIR",
    "",
    _parse_str,
    "Directory for flight-recorder dumps; empty means the current directory's "
    "'torchnext-fr' folder.",
)
TORCHNEXT_FR_STACKS = _var(
    "TORCHNEXT_FR_STACKS",
    False,
    _parse_bool,
    "Record a Python stack with each flight-recorder entry (costs more per call).",
)
TORCHNEXT_FR_STUCK_DUMP_S: EnvVar[timedelta | None] = _var(
    "TORCHNEXT_FR_STUCK_DUMP_S",
    timedelta(seconds=60),
    _parse_seconds_or_off,
    "Seconds an op may run before the flight recorder dumps it as stuck; 0 turns the "
    "watchdog off. Unset, it is 60 when TORCHNEXT_FR_ENABLE turns the recorder on, and "
    "off for recorders configured in code.",
)
TORCHNEXT_RMA_ADDR = _var(
    "TORCHNEXT_RMA_ADDR",
    "",
    _parse_str,
    "Address the progress server of RMA windows listens on for members on other hosts; "
    "empty means 127.0.0.1 when all members share this host, else this host name's address.",
)

# --------------------------------------------------------------------------- linalg

TORCHNEXT_LINALG_THREADS = _var(
    "TORCHNEXT_LINALG_THREADS",
    0,
    _parse_int,
    "Threads the linalg dispatcher splits large CPU batches over; 0 means torch's "
    "intra-op thread count.",
)

# --------------------------------------------------------------------------- control flow

TORCHNEXT_SWITCH_FLAT = _var(
    "TORCHNEXT_SWITCH_FLAT",
    True,
    _parse_bool,
    "Under torch.compile, capture `switch` as one flat K-way node (one host-side index "
    "read, linear tracing); 0 keeps the balanced tree of torch.cond.",
)

# --------------------------------------------------------------------------- gemm

TORCHNEXT_GEMM_AUTOTUNE = _var(
    "TORCHNEXT_GEMM_AUTOTUNE",
    "on",
    _parse_str,
    "How torchnext.gemm picks a route: 'on' times the candidates once per problem and keeps "
    "the choice on disk; 'cached' uses stored choices and ATen otherwise; 'off' always ATen.",
)

TORCHNEXT_GEMM_CACHE_DIR = _var(
    "TORCHNEXT_GEMM_CACHE_DIR",
    "",
    _parse_str,
    "Folder of torchnext.gemm's tuned choices (shared safely by concurrent processes); empty "
    "means $XDG_CACHE_HOME/torchnext/gemm, else ~/.cache/torchnext/gemm.",
)

# --------------------------------------------------------------------------- bench / cli

TORCHNEXT_BENCH_DIR = _var(
    "TORCHNEXT_BENCH_DIR",
    "",
    _parse_str,
    "Folder holding benchmark scripts for `torchnext bench`; empty means ./benchmarks, "
    "then the source checkout's benchmarks/.",
)

TORCHNEXT_TORCH214_PYTHON = _var(
    "TORCHNEXT_TORCH214_PYTHON",
    "",
    _parse_str,
    "Python with torch 2.14 that benchmarks run native 2.14 in; empty means the "
    "checkout's .venv-214/bin/python.",
)


def describe() -> list[dict[str, str]]:
    """One record per variable: name, value (as text), default, whether set, doc."""
    rows = []
    for var in ALL_VARS:
        try:
            value = repr(var.get())
        except ValueError as exc:
            value = f"<invalid: {exc}>"
        rows.append(
            {
                "name": var.name,
                "value": value,
                "default": repr(var.default),
                "set": str(var.is_set()),
                "doc": var.doc,
            }
        )
    return rows
