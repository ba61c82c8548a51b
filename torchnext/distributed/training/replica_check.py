"""Checks that the replicas of a training job hold what they must: the same entries, the
same values.

Use it through the :class:`~torchnext.distributed.training.manager.Manager`, which calls
:func:`check_same_entries` on every membership sync (before the first step, and after
each shrink or grow) and, with ``ManagerConfig.check_replicas``, :func:`check_replicas`
in every step before the commit vote. Both raise on every member at once, because every
member sees the same gathered values: an error here stops the job with a message that
names the state entry and the members that differ, instead of letting replicas drift
apart while the job goes on.

What not to assume: :func:`check_replicas` compares each entry's fingerprint (a CRC32
of its ``state_dict()``, see :func:`~torchnext.distributed.training.state.fingerprint`),
so two replicas that differ only in the last bit of one weight are reported too; it
costs one pass over the state and one small all-gather per step.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import timedelta

import torch

from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.training.state import TrainingState
from torchnext.errors import CommTimeoutError, ReplicaDivergenceError, TrainingStateError

__all__ = ["check_replicas", "check_same_entries"]

_ENTRIES_KEY = "torchnext/state-entries"


def _wait_keys(group: FaultTolerantGroup, keys: list[str], timeout: timedelta) -> None:
    deadline = time.monotonic() + timeout.total_seconds()
    while not group.store.check(keys):
        if time.monotonic() > deadline:
            raise CommTimeoutError(f"members did not publish {keys} within {timeout}")
        time.sleep(0.005)


def check_same_entries(
    group: FaultTolerantGroup,
    state: TrainingState,
    *,
    steps: list[int],
    crcs: list[int],
    timeout: timedelta,
) -> None:
    """Raise :class:`TrainingStateError` if live members registered different entries.

    ``steps`` and ``crcs`` are every member's committed step and
    :meth:`TrainingState.spec_crc`, gathered in one collective by the caller. Joiners
    (step < 0) are left to their healer, which refuses one that differs.
    """
    live = [r for r, s in enumerate(steps) if s >= 0]
    if len({crcs[r] for r in live}) <= 1:
        return
    members = tuple(group.members)
    base = f"{_ENTRIES_KEY}/{group.epoch}"
    group.store.set(f"{base}/{group.member_id}", json.dumps(state.spec()))
    keys = [f"{base}/{members[r]}" for r in live]
    _wait_keys(group, keys, timeout)
    listed = []
    for r in live:
        spec = json.loads(group.store.get(f"{base}/{members[r]}"))
        listed.append(f"{members[r]}: {sorted(spec) or 'nothing'}")
    raise TrainingStateError(
        "members registered different state entries: "
        + "; ".join(listed)
        + ". Register the same entries under the same names on every member "
        "(Manager.register(name, obj) or Manager(..., state={...})) before the first step."
    )


def check_replicas(
    group: FaultTolerantGroup, state: TrainingState, *, step: int, timeout: timedelta
) -> None:
    """Raise :class:`ReplicaDivergenceError` if any replicated entry differs between members.

    Collective: every member calls it at the same point of the same step.
    """
    fingerprints = state.fingerprints()
    names = list(fingerprints)
    mine = torch.tensor([fingerprints[n] for n in names], dtype=torch.int64)
    size = int(group.size)
    everyone = torch.zeros(size * len(names), dtype=torch.int64)
    group.all_gather_into_tensor(everyone, mine, timeout=timeout)
    table = everyone.view(size, len(names)).tolist()
    members = tuple(group.members)
    differing: list[str] = []
    culprits: set[str] = set()
    details = []
    for j, name in enumerate(names):
        column = [row[j] for row in table]
        if len(set(column)) == 1:
            continue
        differing.append(name)
        majority, count = Counter(column).most_common(1)[0]
        odd = [members[r] for r, v in enumerate(column) if v != majority]
        if count * 2 <= size:  # no majority: every member is suspect
            odd = list(members)
        culprits.update(odd)
        details.append(f"{name!r} differs on {', '.join(odd)}")
    if not differing:
        return
    raise ReplicaDivergenceError(
        f"replicas diverged before committing step {step + 1}: " + "; ".join(details) + ". "
        "The step was not committed. Usual causes: state the manager does not know about "
        "(an LR scheduler, a GradScaler, EMA weights: register it with "
        "Manager.register(name, obj)), code that changes state on one member only, or a "
        "non-deterministic op in the optimizer step.",
        entries=tuple(differing),
        members=tuple(sorted(culprits)),
        step=step,
    )
