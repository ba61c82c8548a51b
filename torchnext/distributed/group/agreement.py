"""Deciding who is in the next epoch: initial registration, admission, agreement.

Everything here is a store protocol between the members of one group, with every
wait bounded:

* :func:`register_initial` -- the initial members count themselves in and learn each
  other's ids (rank order: the natural order of the ids);
* :func:`await_admission` -- a :meth:`~torchnext.distributed.FaultTolerantGroup.join`
  waits until a ``grow`` admits it, and learns the epoch it joins;
* :func:`agree_on_next` -- one decision per epoch: each survivor acks, waits for the
  others (or for ``agreement_grace`` to pass, or for the failure detector to rule a
  silent member out) and proposes; the first ``compare_set`` of the decision key wins
  and everyone adopts it.

The store lives outside the workers, so a member that dies mid-protocol cannot block
it. What not to assume: an agreement decides membership only; applying it (opening
the next epoch) is the group's job, and may itself fail if a decided member dies.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from torchnext.distributed.group.config import GroupConfig
from torchnext.distributed.group.epoch import Epoch
from torchnext.distributed.group.heartbeat import Monitor
from torchnext.distributed.group.membership import Keys, Membership, natural_key
from torchnext.errors import AgreementError, CommTimeoutError, MembershipError, StaleEpochError

__all__ = [
    "agree_on_next",
    "await_admission",
    "check_reconfigure",
    "eviction_error",
    "propose",
    "register_initial",
]


def register_initial(
    store: Any, keys: Keys, *, member_id: str, world_size: int, config: GroupConfig, name: str
) -> tuple[str, ...]:
    """Count this member into group ``name``'s first epoch; every initial member's id."""
    slot = int(store.add(keys.init_count(), 1)) - 1
    if slot >= world_size:
        raise MembershipError(
            f"member {member_id} is member #{slot + 1} to create group {name!r} "
            f"of world_size={world_size}; use join() for a replacement, or a new group name"
        )
    store.set(keys.init_slot(slot), member_id)
    if slot == world_size - 1:
        store.set(keys.init_done(), "1")
    try:
        store.wait([keys.init_done()], config.store_timeout)
    except (RuntimeError, OSError) as exc:
        got = int(store.add(keys.init_count(), 0))
        raise CommTimeoutError(
            f"group {name!r}: only {got} of world_size={world_size} members registered "
            f"within store_timeout={config.store_timeout}; start them all, or lower "
            "world_size"
        ) from exc
    ids = [v.decode() for v in store.multi_get([keys.init_slot(i) for i in range(world_size)])]
    if len(set(ids)) != len(ids):
        dup = sorted({m for m in ids if ids.count(m) > 1})
        raise MembershipError(
            f"group {name!r}: member ids {dup} were used by more than one process; "
            "give every process a unique member_id"
        )
    return tuple(sorted(ids, key=natural_key))


def await_admission(
    store: Any, keys: Keys, *, member_id: str, timeout: timedelta, config: GroupConfig, name: str
) -> tuple[int, tuple[str, ...]]:
    """Ask to join group ``name`` and wait (at most ``timeout``) for a ``grow`` to admit
    this member; the epoch it joins and that epoch's members."""
    slot = int(store.add(keys.joiner_count(), 1)) - 1
    store.set(keys.joiner_slot(slot), member_id)
    deadline = time.monotonic() + timeout.total_seconds()
    poll_s = config.poll_interval.total_seconds()
    while not store.check([keys.admitted(member_id)]):
        if time.monotonic() >= deadline:
            raise CommTimeoutError(
                f"{member_id} was not admitted into group {name!r} within timeout={timeout}; "
                "the members admit joiners when they call grow()"
            )
        time.sleep(poll_s)
    epoch = int(store.get(keys.admitted(member_id)))
    decision = Membership.from_json(store.get(keys.decision(epoch - 1)))
    return epoch, decision.members


def propose(
    kind: str,
    epoch: Epoch,
    acked: set[str],
    monitor: Monitor,
    proposal: tuple[str, ...] | None,
) -> Membership:
    """This member's proposal for the epoch after ``epoch``."""
    if proposal is not None:
        return Membership(
            epoch=epoch.number,
            members=proposal,
            failed=tuple(m for m in epoch.members if m not in proposal),
            joined=tuple(m for m in proposal if m not in epoch.members),
            kind=kind,
        )
    # An ack is fresher evidence of life than a heartbeat a loaded host delayed: an
    # acked member stays in unless its process is known to be gone.
    alive = tuple(m for m in epoch.members if m in acked and not monitor.is_dead(m))
    joiners: tuple[str, ...] = ()
    if kind == "grow":
        # Read the registry now: members ask whether joiners wait from the monitor's
        # last heartbeat, and this member's view may be a heartbeat older than theirs.
        monitor.refresh_joiners()
        joiners = tuple(j for j in monitor.pending_joiners() if j not in alive)
    return Membership(
        epoch=epoch.number,
        members=alive + joiners,
        failed=tuple(m for m in epoch.members if m not in alive),
        joined=joiners,
        kind=kind,
    )


def agree_on_next(
    store: Any,
    keys: Keys,
    monitor: Monitor,
    epoch: Epoch,
    *,
    member_id: str,
    kind: str,
    bound: timedelta,
    config: GroupConfig,
    name: str,
    proposal: tuple[str, ...] | None = None,
) -> Membership:
    """The decided membership after ``epoch`` (collective over its live members).

    ``kind`` is ``"shrink"``, ``"grow"`` (also admits pending joiners) or
    ``"reconfigure"`` (``proposal`` is the wanted member list). Marks the admitted
    joiners in the store. Raises :class:`~torchnext.errors.AgreementError` when a live
    member does not take part within ``bound``.
    """
    number = epoch.number
    start = time.monotonic()
    deadline = start + bound.total_seconds()
    grace_end = start + config.agreement_grace.total_seconds()
    poll_s = config.poll_interval.total_seconds() / 2
    store.set(keys.ack(number, member_id), "1")
    if kind in ("grow", "reconfigure"):
        monitor.refresh_joiners()
    raw: bytes | None = None
    while raw is None:
        raw, acked = _poll(store, keys, number, epoch.members)
        if raw is not None:
            break
        failed = {m for m in epoch.members if m not in acked and monitor.failure_of(m)}
        waiting = [m for m in epoch.members if m not in acked and m not in failed]
        now = time.monotonic()
        if not waiting or now >= grace_end:
            mine = propose(kind, epoch, acked, monitor, proposal)
            raw = store.compare_set(keys.decision(number), "", mine.to_json())
            break
        if now >= deadline:
            raise AgreementError(
                f"group {name!r} epoch {number}: no agreement within {bound}; still "
                f"waiting for {waiting} (alive but not in agree/shrink/grow). Call it on "
                "every member, or raise the timeout"
            )
        time.sleep(poll_s)
    decision = Membership.from_json(raw)
    for joiner in decision.joined:
        store.set(keys.admitted(joiner), str(number + 1))
    return decision


def _poll(
    store: Any, keys: Keys, number: int, members: tuple[str, ...]
) -> tuple[bytes | None, set[str]]:
    """Epoch ``number``'s decision (None: none yet) and the members that acked it.

    One request on a store with ``read_many`` (etcd, where a request per member and
    poll would load the cluster); else a ``check`` each (cheap on a ``TCPStore``)."""
    read_many = getattr(store, "read_many", None)
    if read_many is not None:
        values = read_many([keys.decision(number), *(keys.ack(number, m) for m in members)])
        acked = {m for m, v in zip(members, values[1:], strict=True) if v is not None}
        return values[0], acked
    if store.check([keys.decision(number)]):
        return bytes(store.get(keys.decision(number))), set()
    return None, {m for m in members if store.check([keys.ack(number, m)])}


def check_reconfigure(
    wanted: tuple[str, ...],
    *,
    epoch: int,
    members: tuple[str, ...],
    joiners: tuple[str, ...],
) -> None:
    """Raise unless ``wanted`` is a list of unique current members and pending joiners."""
    if not wanted or len(set(wanted)) != len(wanted):
        raise MembershipError(f"reconfigure(members={list(wanted)}): pass unique member ids")
    allowed = set(members) | set(joiners)
    unknown = [m for m in wanted if m not in allowed]
    if unknown:
        raise MembershipError(
            f"reconfigure: {unknown} are neither members of epoch {epoch} "
            f"({list(members)}) nor pending joiners; start them with join() first"
        )


def eviction_error(decision: Membership, *, member_id: str, name: str) -> StaleEpochError:
    """The error of a member that ``decision`` left out of the next epoch."""
    return StaleEpochError(
        f"member {member_id} was left out of epoch {decision.epoch + 1} of group "
        f"{name!r} (members {list(decision.members)}): the others found it failed or "
        "unresponsive. This process cannot act in the group any more; exit and let a "
        "replacement join()."
    )
