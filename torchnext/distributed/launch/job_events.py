"""Training events that cross from the workers to the agents: faults, shrinks, heals, recoveries.

Use it on both sides of ``torchnext run``: a worker's training manager
:func:`publish`\\ es each event that matters to whoever watches the job (a failure
detected, a shrink, a grow, a heal, a recovery, a divergence) into the job's store; each
agent reads them with a :class:`JobEventReader` and prints one line per fault, shrink,
grow, heal and recovery, with its timings (``--events FILE`` also writes every record as
a JSON line).

What not to assume: publishing is best effort (a lost store loses the event, never the
step); every survivor reports a fault and a shrink, and the reader prints each once per
epoch; on a multi-node job every agent prints the events of the whole job.
"""

from __future__ import annotations

import json
from typing import Any

from torchnext.distributed.launch.keys import EVENT_COUNT_KEY, EVENT_KEY_PREFIX

__all__ = ["JobEventReader", "describe", "publish"]

PUBLISHED_KINDS = frozenset(
    {"failure_detected", "shrink", "grow", "healed", "recovered", "replica_mismatch"}
)
"""The manager events worth a line in the launcher's output."""

_ONCE_PER_EPOCH = {"failure_detected", "shrink", "grow", "recovered"}


def publish(store: Any, record: dict[str, Any]) -> None:
    """Append ``record`` (JSON-serialisable) to the job's events; failures are ignored."""
    try:
        index = int(store.add(EVENT_COUNT_KEY, 1))
        store.set(f"{EVENT_KEY_PREFIX}{index}", json.dumps(record, default=str))
    except Exception:  # noqa: BLE001 - reporting must never break training
        pass


def describe(record: dict[str, Any]) -> str | None:
    """One line for the launcher's output, or None for a kind it does not print."""
    kind, d = record.get("kind"), record.get("detail", {})
    who, epoch = record.get("member_id", "?"), record.get("epoch", "?")
    if kind == "failure_detected":
        return f"fault: {who} saw the group fail in epoch {d.get('revoked_epoch', '?')}: {d.get('reason', '')}"
    if kind == "shrink":
        removed = ", ".join(d.get("removed", [])) or "nobody"
        return (
            f"shrink: removed {removed}; {len(d.get('members', []))} members left "
            f"(epoch {epoch}, agreed in {d.get('seconds', 0.0):.2f} s)"
        )
    if kind == "grow":
        return (
            f"grow: admitted {', '.join(d.get('added', [])) or 'nobody'}; "
            f"{len(d.get('members', []))} members (epoch {epoch}, {d.get('seconds', 0.0):.2f} s)"
        )
    if kind == "healed":
        mb = d.get("bytes", 0) / 1e6
        return (
            f"heal: {who} received {mb:.1f} MB from {d.get('source', '?')} in "
            f"{d.get('seconds', 0.0):.2f} s ({d.get('mb_per_s', 0.0):.0f} MB/s)"
        )
    if kind == "recovered":
        return (
            f"recovered: step {record.get('step', '?')} committed on {record.get('world_size', '?')} "
            f"members {d.get('seconds', 0.0):.2f} s after the failure"
        )
    if kind == "replica_mismatch":
        return f"replicas diverged: {', '.join(d.get('entries', []))} differ on {', '.join(d.get('members', []))}"
    return None


class JobEventReader:
    """Reads the events published since the last :meth:`poll` (agent side)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._next = 1
        self._seen: set[tuple[str, Any]] = set()

    def poll(self) -> list[tuple[dict[str, Any], str | None]]:
        """New ``(record, line)`` pairs; ``line`` is None for a repeat within its epoch."""
        try:
            count = int(self.store.add(EVENT_COUNT_KEY, 0))
        except Exception:  # noqa: BLE001 - the store may be gone at the end of a job
            return []
        out = []
        while self._next <= count:
            key = f"{EVENT_KEY_PREFIX}{self._next}"
            try:
                if not self.store.check([key]):
                    break  # counted but not written yet: read it next time
                record = json.loads(self.store.get(key))
            except Exception:  # noqa: BLE001
                break
            self._next += 1
            line = describe(record)
            if record.get("kind") in _ONCE_PER_EPOCH:
                mark = (str(record.get("kind")), record.get("epoch"))
                if mark in self._seen:
                    line = None
                self._seen.add(mark)
            out.append((record, line))
        return out
