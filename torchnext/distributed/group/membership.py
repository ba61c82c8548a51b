"""Membership of a fault-tolerant group: store keys, agreement, joiners, liveness probes.

Everything membership-related goes through the store, which lives outside the workers
(a launcher, an agent, or the test process). That makes the store a reliable third
party, and the agreement simple and split-brain free:

1. Every participant of epoch ``E`` writes ``e<E>/ack/<member>`` and keeps
   heartbeating.
2. A participant proposes once its view is complete: every member of ``E`` has
   either acked or is known failed (its process is gone, or its heartbeat is older
   than ``heartbeat_timeout``); a live member that does not ack within
   ``agreement_grace`` is left out.
3. The proposal is written with ``compare_set(e<E>/decision, "", proposal)``: the
   first proposal wins, everyone reads the same decision. A rank that dies during
   the agreement either acked before dying (it is in the decision, the next epoch
   fails to open without it, and that epoch is revoked and agreed on again) or did
   not (it is out). Two groups can never form.

Members of the new epoch are the surviving members in their old rank order, then the
admitted joiners in registration order (deterministic renumbering). A member that is
not in the decision is *evicted*: it gets :class:`~torchnext.errors.StaleEpochError`.

Do not assume agreement is fast when a failed peer is on another host: without a
local process probe, it is known failed only after ``heartbeat_timeout``.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from typing import Any

__all__ = ["Membership", "Keys", "natural_key", "ProcessRecord", "probe_process"]


@dataclass(frozen=True, kw_only=True)
class Membership:
    """An agreed membership change of a fault-tolerant group."""

    epoch: int
    """The epoch the decision was taken in (the new epoch is ``epoch + 1``)."""
    members: tuple[str, ...]
    """Members of the new epoch, in rank order."""
    failed: tuple[str, ...] = ()
    """Members of ``epoch`` left out (failed, unresponsive, or removed)."""
    joined: tuple[str, ...] = ()
    """Joiners admitted into the new epoch."""
    kind: str = "shrink"
    """What asked for the change: ``"shrink"``, ``"grow"`` or ``"reconfigure"``."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "epoch": self.epoch,
                "members": list(self.members),
                "failed": list(self.failed),
                "joined": list(self.joined),
                "kind": self.kind,
            }
        )

    @staticmethod
    def from_json(raw: bytes | str) -> Membership:
        data = json.loads(raw)
        return Membership(
            epoch=int(data["epoch"]),
            members=tuple(data["members"]),
            failed=tuple(data["failed"]),
            joined=tuple(data["joined"]),
            kind=str(data["kind"]),
        )


class Keys:
    """Names of every store key of group ``name`` (one place, so fencing is auditable)."""

    def __init__(self, name: str) -> None:
        self.root = f"torchnext/ft/{name}"

    # creation of epoch 0
    def init_count(self) -> str:
        return f"{self.root}/init/count"

    def init_slot(self, i: int) -> str:
        return f"{self.root}/init/{i}"

    def init_done(self) -> str:
        return f"{self.root}/init/done"

    # liveness
    def heartbeat(self, member: str) -> str:
        return f"{self.root}/hb/{member}"

    def process(self, member: str) -> str:
        return f"{self.root}/proc/{member}"

    # epochs
    def latest_epoch(self) -> str:
        return f"{self.root}/epoch"

    def revoked(self, epoch: int, sub: str = "") -> str:
        return f"{self.root}/e{epoch}{sub}/revoked"

    def ack(self, epoch: int, member: str) -> str:
        return f"{self.root}/e{epoch}/ack/{member}"

    def decision(self, epoch: int) -> str:
        return f"{self.root}/e{epoch}/decision"

    def pg_prefix(self, epoch: int, sub: str = "") -> str:
        return f"{self.root}/e{epoch}{sub}/pg"

    def validate_prefix(self, epoch: int, sub: str = "") -> str:
        return f"{self.root}/e{epoch}{sub}/validate"

    def handle(self, epoch: int, member: str) -> str:
        return f"{self.root}/e{epoch}/handle/{member}"

    # joiners
    def joiner_count(self) -> str:
        return f"{self.root}/joiners/count"

    def joiner_slot(self, i: int) -> str:
        return f"{self.root}/joiners/{i}"

    def admitted(self, member: str) -> str:
        return f"{self.root}/admitted/{member}"


_DIGITS = re.compile(r"(\d+)")


def natural_key(member: str) -> tuple[Any, ...]:
    """Sort key that orders ``w2`` before ``w10`` (initial rank order of member ids)."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(member))


@dataclass(frozen=True)
class ProcessRecord:
    """Where a member runs, so same-host peers can probe it without the network, and where
    its heartbeat datagrams are heard (``beacon``, ``ip:port``; empty without them)."""

    host: str
    pid: int
    start_ticks: int
    beacon: str = ""

    @staticmethod
    def current(beacon: str = "") -> ProcessRecord:
        pid = os.getpid()
        return ProcessRecord(socket.gethostname(), pid, _start_ticks(pid), beacon)

    def encode(self) -> str:
        # Host names hold neither '|' nor '@'; a record without a beacon reads as before.
        return f"{self.host}|{self.pid}|{self.start_ticks}" + (
            f"@{self.beacon}" if self.beacon else ""
        )

    @staticmethod
    def decode(raw: bytes | str) -> ProcessRecord:
        text = raw.decode() if isinstance(raw, bytes) else raw
        text, _, beacon = text.partition("@")
        host, pid, ticks = text.rsplit("|", 2)
        return ProcessRecord(host, int(pid), int(ticks), beacon)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields follow the last ')'.
    return raw.rsplit(")", 1)[1].split()


def _start_ticks(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else 0


def probe_process(record: ProcessRecord) -> str:
    """``"dead"``, ``"stopped"``, ``"alive"`` or ``"unknown"`` (other host, no /proc).

    A pid that exists but started at another time is a reused pid: the member is dead.
    """
    if record.host != socket.gethostname() or not os.path.isdir("/proc"):
        return "unknown"
    fields = _stat_fields(record.pid)
    if fields is None:
        return "dead"
    if record.start_ticks and len(fields) > 19 and int(fields[19]) != record.start_ticks:
        return "dead"
    state = fields[0]
    if state in ("Z", "X", "x"):
        return "dead"
    if state in ("T", "t"):
        return "stopped"
    return "alive"
