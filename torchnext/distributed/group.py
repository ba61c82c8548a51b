"""A process group that survives the loss of members in place: revoke, agree, shrink, grow.

Use :class:`FaultTolerantGroup` instead of ``torch.distributed`` collectives when a job
must keep going after a process dies or hangs, without restarting the survivors: the
survivors' Python processes, tensors and state stay as they were; only the group's
membership (its *epoch*) changes.

Design (gloo cannot abort an op in flight, so the group never needs it to):

* **Epochs.** Every membership opens a new epoch ``E`` with its own backend group built
  from a fresh store namespace (``.../e<E>/pg``); ranks are renumbered
  deterministically. An epoch's backend group is never reused: when the epoch ends
  (revoked, or superseded) it is *abandoned*. A gloo op still blocked in it ends on its
  own when its timeout passes; the abandoned group is kept referenced until then (so its
  destructor, which joins gloo's threads, never runs on a caller's thread), then
  dropped by the monitor; at interpreter exit any still-blocked group is deliberately
  leaked so the process exits at once.
* **Ops** are issued to the backend asynchronously from the caller's thread and waited
  on in slices (:mod:`torchnext.distributed.work`): the fast path adds a few Python
  attribute reads to a plain gloo call, and no store round trip.
* **Failure detection** (:mod:`torchnext.distributed.heartbeat`): a backend error on
  any member (gloo reports a closed connection to the dead rank's neighbours at once),
  an op past its timeout, a peer whose store heartbeat stopped advancing (a SIGSTOPped
  process), or a same-host peer whose process is gone.
* **Revoke** (ULFM semantics): the first member that sees a failure writes the
  epoch's revoke key with ``compare_set`` (first reason wins); every member's monitor
  polls that key every ``poll_interval``, so every survivor's pending and future ops in
  the epoch raise :class:`~torchnext.errors.CommRevokedError` (epoch, suspects, reason)
  within about ``poll_interval + wait_slice`` whatever the collective timeout.
* **Agreement and reconfiguration** (:mod:`torchnext.distributed.membership`): one
  decision per epoch through ``compare_set`` on the store, which lives outside the
  workers; ``shrink``/``grow``/``reconfigure`` open epoch ``E + 1`` with the decided
  members. Processes left out, or still in an older epoch, get
  :class:`~torchnext.errors.StaleEpochError` (fencing).
* **Split** sub-groups live inside the parent's epoch and are revoked with it.

What not to assume: output tensors of an op that failed or was revoked hold undefined
values; a revoked epoch never recovers (call :meth:`agree` then :meth:`shrink`); with
``backend="nccl"`` revoke also calls the backend's ``abort``.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchnext import _env
from torchnext.distributed.backend import (
    BuildConnection,
    build_backend,
    clone_store,
    connect_store,
)
from torchnext.distributed.collectives import CollectivesMixin
from torchnext.distributed.group_config import GroupConfig
from torchnext.distributed.heartbeat import Monitor, Watch
from torchnext.distributed.membership import Keys, Membership, ProcessRecord, natural_key
from torchnext.errors import (
    AgreementError,
    CommRevokedError,
    CommTimeoutError,
    GroupShutdownError,
    MembershipError,
    StaleEpochError,
    StoreUnreachableError,
)

__all__ = ["FaultTolerantGroup", "connect_store", "live_groups"]

logger = logging.getLogger(__name__)

_LIVE_GROUPS: weakref.WeakSet[FaultTolerantGroup] = weakref.WeakSet()


def live_groups() -> list[FaultTolerantGroup]:
    """Every group of this process not yet garbage-collected (shut down or not)."""
    return list(_LIVE_GROUPS)


class _Epoch:
    """One membership of a group (or of a split sub-group) and its backend group."""

    __slots__ = (
        "number",
        "members",
        "rank",
        "size",
        "pg",
        "revoked",
        "sub",
        "children",
        "pending",
        "lock",
        "callbacks_done",
        "retired_at",
    )

    def __init__(self, number: int, members: tuple[str, ...], rank: int, sub: str = "") -> None:
        self.number = number
        self.members = members
        self.rank = rank
        self.size = len(members)
        self.pg: Any = None
        self.revoked: CommRevokedError | None = None
        self.sub = sub
        self.children: list[FaultTolerantGroup] = []
        self.pending: set[Any] = set()
        self.lock = threading.Lock()
        self.callbacks_done = False
        self.retired_at: float | None = None


class FaultTolerantGroup(CollectivesMixin):
    """A group of processes whose membership can change in place; see the module docstring.

    Create it collectively on every initial member::

        group = FaultTolerantGroup(store, member_id="w0", world_size=4)

    or with :meth:`from_env`; a replacement process uses :meth:`join` and is admitted
    when the members call :meth:`grow`. Initial ranks follow the natural order of the
    member ids (``w2`` before ``w10``).
    """

    def __init__(
        self,
        store: Any,
        *,
        member_id: str,
        world_size: int,
        backend: str = "gloo",
        config: GroupConfig | None = None,
        name: str = "default",
    ) -> None:
        self._setup(store, member_id=member_id, backend=backend, config=config, name=name)
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(
                f"world_size={world_size!r}: pass the number of initial members (>= 1)"
            )
        members = self._register_initial(world_size)
        self._monitor.start()
        self._open_epoch(0, members)

    # ------------------------------------------------------------------ construction

    def _setup(
        self,
        store: Any,
        *,
        member_id: str,
        backend: str,
        config: GroupConfig | None,
        name: str,
        parent: FaultTolerantGroup | None = None,
    ) -> None:
        if not member_id or not isinstance(member_id, str) or "/" in member_id:
            raise ValueError(
                f"member_id={member_id!r}: pass a non-empty string without '/', unique in the job"
            )
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r}: use 'gloo' (CPU) or 'nccl' (CUDA)")
        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("backend='nccl' needs CUDA, and none is available; use 'gloo'")
        self.store = store
        self.member_id = member_id
        self.backend = backend
        self.config = config if config is not None else GroupConfig()
        self.name = name
        self._keys = Keys(name)
        self._parent = parent
        self._lock = threading.RLock()
        self._shutdown = False
        self._evicted: StaleEpochError | None = None
        self._last_error: BaseException | None = None
        self._callbacks: list[Callable[[CommRevokedError], None]] = []
        self._decided: dict[int, Membership] = {}
        self._retired: list[_Epoch] = []
        self._coll_seq = 0
        self._p2p_seq = 0
        self._split_count = 0
        self._native_pg: Any = None
        if self.config.native_reconfigure and (
            backend != "gloo" or not hasattr(dist.ProcessGroupGloo, "reconfigure")
        ):
            raise ValueError(
                "GroupConfig.native_reconfigure=True needs backend='gloo' on torch >= 2.14 "
                f"(this is torch {torch.__version__}, backend={backend!r}); leave it False to "
                "use fresh gloo groups per epoch, which works on every version"
            )
        self._device = (
            torch.device("cpu")
            if backend == "gloo"
            else torch.device("cuda", torch.cuda.current_device())
        )
        self._on_cpu = self._device.type == "cpu"
        if parent is None:
            self._publish_self()
            # Own connections: gloo's rendezvous blocks its store client while it waits
            # for peers, which must never delay the monitor's revoke polling.
            self._monitor = Monitor(
                clone_store(store, self.config.store_timeout), self._keys, member_id, self.config
            )
            self._monitor.add_housekeeping(self._prune_retired)
            self._build_connection = BuildConnection(store, self.config.store_timeout)
        else:
            self._monitor = parent._monitor
            self._build_connection = parent._build_connection
        _LIVE_GROUPS.add(self)

    def _publish_self(self) -> None:
        try:
            self.store.set(self._keys.process(self.member_id), ProcessRecord.current().encode())
        except (RuntimeError, OSError) as exc:
            raise StoreUnreachableError(
                f"member {self.member_id}: the store {_store_addr(self.store)} did not answer: {exc}"
            ) from exc

    def _register_initial(self, world_size: int) -> tuple[str, ...]:
        keys, store = self._keys, self.store
        slot = int(store.add(keys.init_count(), 1)) - 1
        if slot >= world_size:
            raise MembershipError(
                f"member {self.member_id} is member #{slot + 1} to create group {self.name!r} "
                f"of world_size={world_size}; use join() for a replacement, or a new group name"
            )
        store.set(keys.init_slot(slot), self.member_id)
        if slot == world_size - 1:
            store.set(keys.init_done(), "1")
        try:
            store.wait([keys.init_done()], self.config.store_timeout)
        except (RuntimeError, OSError) as exc:
            got = int(store.add(keys.init_count(), 0))
            raise CommTimeoutError(
                f"group {self.name!r}: only {got} of world_size={world_size} members registered "
                f"within store_timeout={self.config.store_timeout}; start them all, or lower "
                "world_size"
            ) from exc
        ids = [v.decode() for v in store.multi_get([keys.init_slot(i) for i in range(world_size)])]
        if len(set(ids)) != len(ids):
            dup = sorted({m for m in ids if ids.count(m) > 1})
            raise MembershipError(
                f"group {self.name!r}: member ids {dup} were used by more than one process; "
                "give every process a unique member_id"
            )
        return tuple(sorted(ids, key=natural_key))

    @classmethod
    def from_env(
        cls, *, config: GroupConfig | None = None, backend: str = "gloo", name: str = "default"
    ) -> FaultTolerantGroup:
        """Create the group from ``TORCHNEXT_STORE_ADDR``, ``TORCHNEXT_MEMBER_ID`` and
        ``TORCHNEXT_WORLD_SIZE`` (as set by the launcher or the test harness)."""
        cfg = config if config is not None else GroupConfig()
        addr = _env.TORCHNEXT_STORE_ADDR.get()
        member = _env.TORCHNEXT_MEMBER_ID.get()
        size = _env.TORCHNEXT_WORLD_SIZE.get()
        missing = [
            v.name
            for v, val in (
                (_env.TORCHNEXT_STORE_ADDR, addr),
                (_env.TORCHNEXT_MEMBER_ID, member),
                (_env.TORCHNEXT_WORLD_SIZE, size),
            )
            if not val
        ]
        if missing:
            raise ValueError(
                f"FaultTolerantGroup.from_env: {', '.join(missing)} unset; start the process "
                "with `torchnext run` or set them (store host:port, member id, world size)"
            )
        store = connect_store(addr, cfg.store_timeout)
        return cls(store, member_id=member, world_size=size, backend=backend, config=cfg, name=name)

    @classmethod
    def join(
        cls,
        store: Any,
        *,
        member_id: str,
        timeout: timedelta = timedelta(seconds=120),
        backend: str = "gloo",
        config: GroupConfig | None = None,
        name: str = "default",
    ) -> FaultTolerantGroup:
        """Join a running group as a new or replacement member; blocks (at most
        ``timeout``) until the members admit it with :meth:`grow`."""
        self = cls.__new__(cls)
        self._setup(store, member_id=member_id, backend=backend, config=config, name=name)
        keys = self._keys
        self._monitor.start()
        slot = int(store.add(keys.joiner_count(), 1)) - 1
        store.set(keys.joiner_slot(slot), member_id)
        deadline = time.monotonic() + timeout.total_seconds()
        poll_s = self.config.poll_interval.total_seconds()
        while not store.check([keys.admitted(member_id)]):
            if time.monotonic() >= deadline:
                self._monitor.stop()
                raise CommTimeoutError(
                    f"{member_id} was not admitted into group {name!r} within timeout={timeout}; "
                    "the members admit joiners when they call grow()"
                )
            time.sleep(poll_s)
        epoch = int(store.get(keys.admitted(member_id)))
        decision = Membership.from_json(store.get(keys.decision(epoch - 1)))
        self._open_epoch(epoch, decision.members)
        return self

    # ------------------------------------------------------------------ attributes

    @property
    def rank(self) -> int:
        """This process's rank in the current epoch."""
        return self._epoch.rank

    @property
    def size(self) -> int:
        return self._epoch.size

    @property
    def epoch(self) -> int:
        return self._epoch.number

    @property
    def members(self) -> tuple[str, ...]:
        """Member ids in rank order."""
        return self._epoch.members

    @property
    def is_revoked(self) -> bool:
        return self._epoch.revoked is not None

    @property
    def process_group(self) -> Any:
        """The current epoch's backend group (see :mod:`torchnext.distributed.interop`)."""
        return self._epoch.pg

    def errored(self) -> BaseException | None:
        """The error that broke the current epoch (revoke, timeout, eviction), or None."""
        if self._evicted is not None:
            return self._evicted
        return self._epoch.revoked or self._last_error

    def __repr__(self) -> str:
        return (
            f"FaultTolerantGroup(name={self.name!r}, member_id={self.member_id!r}, "
            f"epoch={self.epoch}, rank={self.rank}, size={self.size})"
        )

    # ------------------------------------------------------------------ epochs

    def _open_epoch(self, number: int, members: tuple[str, ...]) -> None:
        if self.member_id not in members:
            raise MembershipError(
                f"{self.member_id} is not in the members {list(members)} of epoch {number}"
            )
        epoch = _Epoch(number, members, members.index(self.member_id))
        self._epoch = epoch
        self._monitor.set_watch(
            Watch(
                epoch=number,
                members=members,
                revoke_keys={
                    self._keys.revoked(number): lambda raw: self._mark_revoked(epoch, raw)
                },
                on_suspects=lambda failed, why: self._suspected(epoch, failed, why),
                on_stale=lambda latest: self._superseded(epoch, latest),
            )
        )
        epoch.pg = self._build_backend(epoch, self._keys.pg_prefix(number))
        if self._parent is None:
            self.store.set(self._keys.latest_epoch(), str(number))

    def _build_backend(self, epoch: _Epoch, prefix: str) -> Any:
        return build_backend(self, epoch, prefix)

    def _retire(self, epoch: _Epoch, reason: str) -> None:
        self._mark_revoked(epoch, _revoke_payload(reason, [], self.member_id), local=True)
        epoch.retired_at = time.monotonic()
        self._retired.append(epoch)

    def _prune_retired(self) -> None:
        # Runs on the monitor thread. A backend group is released only once no op is
        # blocked in it (gloo ops end by their timeout), and on a throwaway thread: its
        # destructor joins the backend's threads and must never stall the heartbeats.
        keep: list[_Epoch] = []
        drop: list[_Epoch] = []
        for epoch in self._retired:
            epoch.pending = {w for w in list(epoch.pending) if not w.is_completed()}
            (keep if epoch.pending else drop).append(epoch)
        self._retired = keep
        if drop:
            threading.Thread(target=drop.clear, name="torchnext-ft-release", daemon=True).start()

    # ------------------------------------------------------------------ revoke

    def revoke(self, reason: str = "revoked by the application") -> None:
        """Revoke the current epoch on every member (not collective; idempotent)."""
        self._check_usable(allow_revoked=True)
        self._revoke_epoch(self._epoch, reason, ())

    def add_revoke_callback(self, fn: Callable[[CommRevokedError], None]) -> None:
        """Call ``fn(error)`` once per revoked epoch, from whichever thread saw the revoke."""
        self._callbacks.append(fn)

    def _suspected(self, epoch: _Epoch, failed: list[str], why: str) -> None:
        if epoch.revoked is None and epoch is self._epoch:
            self._revoke_epoch(epoch, f"failure detected by {self.member_id}: {why}", failed)

    def _superseded(self, epoch: _Epoch, latest: int) -> None:
        if epoch is self._epoch and epoch.revoked is None:
            self._revoke_epoch(
                epoch,
                f"epoch {epoch.number} was superseded by epoch {latest} without this member",
                (),
            )

    def _on_op_failure(
        self, epoch: _Epoch, reason: str, exc: BaseException | None
    ) -> CommRevokedError:
        """An op of ``epoch`` failed locally: revoke the epoch, naming likely culprits."""
        self._last_error = exc
        suspects = self._monitor.failed_members(epoch.members) if exc is not None else []
        return self._revoke_epoch(epoch, f"{self.member_id}: {reason}", suspects)

    def _revoke_epoch(
        self, epoch: _Epoch, reason: str, suspects: Sequence[str]
    ) -> CommRevokedError:
        if epoch.revoked is not None:
            return epoch.revoked
        payload = _revoke_payload(reason, list(suspects), self.member_id)
        key = self._keys.revoked(epoch.number, epoch.sub)
        try:
            winner = self.store.compare_set(key, "", payload)
        except (RuntimeError, OSError) as exc:
            logger.warning("could not publish the revoke of %s (store error: %s)", key, exc)
            winner = payload
        self._mark_revoked(epoch, winner)
        assert_revoked = epoch.revoked
        if assert_revoked is None:  # pragma: no cover - _mark_revoked always sets it
            raise RuntimeError("internal error: epoch not revoked after _mark_revoked")
        return assert_revoked

    def _mark_revoked(self, epoch: _Epoch, raw: bytes | str, local: bool = False) -> None:
        with epoch.lock:
            if epoch.revoked is not None:
                return
            data = json.loads(raw)
            suspects = [m for m in data.get("suspects", []) if m in epoch.members]
            ranks = tuple(epoch.members.index(m) for m in suspects)
            where = f"{self.name}{epoch.sub}"
            epoch.revoked = CommRevokedError(
                f"group {where!r} epoch {epoch.number} was revoked by {data.get('by', '?')}: "
                f"{data.get('reason', '')}. Suspected failed: {suspects or 'unknown'} "
                f"(ranks {list(ranks)}). Call agree() and shrink() to continue without them.",
                epoch=epoch.number,
                suspects=ranks,
                reason=str(data.get("reason", "")),
            )
            children = list(epoch.children)
        if self.backend == "nccl" and epoch.pg is not None:
            try:
                epoch.pg.abort()
            except RuntimeError:
                pass
        for child in children:
            child._mark_revoked(child._epoch, raw, local=True)
        if not epoch.callbacks_done:
            epoch.callbacks_done = True
            for fn in list(self._callbacks):
                try:
                    fn(epoch.revoked)
                except Exception:  # noqa: BLE001 - a callback must not break the revoke
                    logger.exception("revoke callback %r raised", fn)

    # ------------------------------------------------------------------ agreement

    def agree(self, timeout: timedelta | None = None) -> Membership:
        """Agree with the other survivors on who failed and who continues (collective).

        Fault tolerant: members that die during the agreement are left out or, if they
        acked first, make the next epoch fail to open (and be agreed on again). Raises
        :class:`~torchnext.errors.StaleEpochError` in a member the others left out.
        """
        return self._agree("shrink", timeout)

    def shrink(self, timeout: timedelta | None = None) -> Membership:
        """Open the next epoch without the failed members (agreeing first if needed)."""
        decision = self._agree("shrink", timeout)
        self._transition(decision)
        return decision

    def grow(self, timeout: timedelta | None = None) -> Membership:
        """Admit the pending joiners (and drop failed members) at a safe point (collective)."""
        decision = self._agree("grow", timeout)
        self._transition(decision)
        return decision

    def pending_joiners(self) -> tuple[str, ...]:
        """Member ids that called :meth:`join` and wait for :meth:`grow` (and look alive)."""
        self._check_usable(allow_revoked=True)
        self._monitor.refresh_joiners()
        return tuple(self._monitor.pending_joiners())

    def reconfigure(self, members: Sequence[str], timeout: timedelta | None = None) -> Membership:
        """Move to exactly ``members`` (rank order as given): current members and pending
        joiners. Collective over the current members; the first proposal wins. A member
        left out is released (its group shuts down) and gets the Membership back."""
        wanted = tuple(members)
        if not wanted or len(set(wanted)) != len(wanted):
            raise MembershipError(f"reconfigure(members={list(wanted)}): pass unique member ids")
        allowed = set(self.members) | set(self.pending_joiners())
        unknown = [m for m in wanted if m not in allowed]
        if unknown:
            raise MembershipError(
                f"reconfigure: {unknown} are neither members of epoch {self.epoch} "
                f"({list(self.members)}) nor pending joiners; start them with join() first"
            )
        decision = self._agree("reconfigure", timeout, proposal=wanted)
        if self.member_id not in decision.members:
            self.shutdown()
            return decision
        self._transition(decision)
        if decision.members != wanted:
            raise MembershipError(
                f"reconfigure: asked for {list(wanted)} but another member's proposal "
                f"{list(decision.members)} was decided first; the group now uses it"
            )
        return decision

    def _agree(
        self, kind: str, timeout: timedelta | None, proposal: tuple[str, ...] | None = None
    ) -> Membership:
        self._check_usable(allow_revoked=True)
        if self._parent is not None:
            raise MembershipError(
                f"{self.name!r} is a split sub-group: it follows its parent's membership; "
                "shrink or grow the parent, then split again"
            )
        epoch = self._epoch
        number = epoch.number
        if number in self._decided:
            return self._decided[number]
        keys, store = self._keys, self.store
        bound = timeout if timeout is not None else self.config.store_timeout
        start = time.monotonic()
        deadline = start + bound.total_seconds()
        grace_end = start + self.config.agreement_grace.total_seconds()
        poll_s = self.config.poll_interval.total_seconds() / 2
        store.set(keys.ack(number, self.member_id), "1")
        if kind in ("grow", "reconfigure"):
            self._monitor.refresh_joiners()
        raw: bytes | None = None
        while raw is None:
            if store.check([keys.decision(number)]):
                raw = store.get(keys.decision(number))
                break
            acked = {m for m in epoch.members if store.check([keys.ack(number, m)])}
            failed = {m for m in epoch.members if m not in acked and self._monitor.failure_of(m)}
            waiting = [m for m in epoch.members if m not in acked and m not in failed]
            now = time.monotonic()
            if not waiting or now >= grace_end:
                mine = self._proposal(kind, epoch, acked, proposal)
                raw = store.compare_set(keys.decision(number), "", mine.to_json())
                break
            if now >= deadline:
                raise AgreementError(
                    f"group {self.name!r} epoch {number}: no agreement within {bound}; still "
                    f"waiting for {waiting} (alive but not in agree/shrink/grow). Call it on "
                    "every member, or raise the timeout"
                )
            time.sleep(poll_s)
        decision = Membership.from_json(raw)
        self._decided[number] = decision
        for joiner in decision.joined:
            store.set(keys.admitted(joiner), str(number + 1))
        if self.member_id not in decision.members and decision.kind != "reconfigure":
            self._evict(decision)
        return decision

    def _proposal(
        self, kind: str, epoch: _Epoch, acked: set[str], proposal: tuple[str, ...] | None
    ) -> Membership:
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
        alive = tuple(m for m in epoch.members if m in acked and not self._monitor.is_dead(m))
        joiners: tuple[str, ...] = ()
        if kind == "grow":
            joiners = tuple(j for j in self._monitor.pending_joiners() if j not in alive)
        return Membership(
            epoch=epoch.number,
            members=alive + joiners,
            failed=tuple(m for m in epoch.members if m not in alive),
            joined=joiners,
            kind=kind,
        )

    def _evict(self, decision: Membership) -> None:
        err = StaleEpochError(
            f"member {self.member_id} was left out of epoch {decision.epoch + 1} of group "
            f"{self.name!r} (members {list(decision.members)}): the others found it failed or "
            "unresponsive. This process cannot act in the group any more; exit and let a "
            "replacement join()."
        )
        self._evicted = err
        self._retire(self._epoch, "this member was evicted")
        raise err

    def _transition(self, decision: Membership) -> None:
        old = self._epoch
        if old.number != decision.epoch:
            raise StaleEpochError(
                f"decision for epoch {decision.epoch} applied in epoch {old.number}"
            )
        self._retire(old, f"superseded by epoch {decision.epoch + 1}")
        try:
            self.store.compare_set(
                self._keys.revoked(old.number),
                "",
                _revoke_payload(f"superseded by epoch {decision.epoch + 1}", [], self.member_id),
            )
        except (RuntimeError, OSError):
            pass
        self._open_epoch(decision.epoch + 1, decision.members)

    # ------------------------------------------------------------------ split

    def split(
        self,
        ranks: Sequence[int] | None = None,
        *,
        color: int | None = None,
        key: int = 0,
        timeout: timedelta | None = None,
    ) -> FaultTolerantGroup | int:
        """A sub-group of this epoch (collective over every member), revoked with it.

        ``split(ranks)``: the members at those ranks, in the given order (2.14 order
        semantics); ``split(color=c, key=k)``: members with the same color, ordered by
        ``(key, rank)``; ``color=None`` opts out. Non-members get
        ``torch.distributed.GroupMember.NON_GROUP_MEMBER`` (-100).
        """
        self._check_usable()
        bound = timeout if timeout is not None else self.config.collective_timeout
        self._split_count += 1
        k = self._split_count
        if ranks is not None:
            if color is not None:
                raise ValueError("split: pass either ranks or color/key, not both")
            chosen = [int(r) for r in ranks]
            bad = [r for r in chosen if not 0 <= r < self.size]
            if bad or len(set(chosen)) != len(chosen) or not chosen:
                raise MembershipError(
                    f"split(ranks={list(ranks)}): ranks must be unique, non-empty, and within "
                    f"0..{self.size - 1} (group size {self.size})"
                )
            mine = torch.tensor([_crc(str(chosen)), 0, 0], dtype=torch.int64)
            table = self._exchange(mine, bound)
            if len(set(table[:, 0].tolist())) != 1:
                raise MembershipError(
                    "split(ranks=...): members passed different rank lists; pass the same list "
                    "on every member"
                )
            groups = {0: chosen}
        else:
            c = -1 if color is None else int(color)
            if color is not None and c < 0:
                raise ValueError(f"split: color={color} must be >= 0 (None opts out)")
            table = self._exchange(torch.tensor([c, int(key), self.rank], dtype=torch.int64), bound)
            groups = {}
            for c_i, _k_i, r_i in sorted(table.tolist(), key=lambda row: (row[1], row[2])):
                if c_i >= 0:
                    groups.setdefault(c_i, []).append(r_i)
        mine_group = next((g for g in groups.values() if self.rank in g), None)
        if mine_group is None:
            return int(dist.GroupMember.NON_GROUP_MEMBER)
        color_of = next(c for c, g in groups.items() if g is mine_group)
        return self._make_child(tuple(self.members[r] for r in mine_group), f"/s{k}c{color_of}")

    def _exchange(self, row: torch.Tensor, timeout: timedelta) -> torch.Tensor:
        out = torch.zeros(self.size, row.numel(), dtype=row.dtype)
        self.all_gather_into_tensor(out.view(-1), row, timeout=timeout)
        return out

    def _make_child(self, members: tuple[str, ...], sub: str) -> FaultTolerantGroup:
        parent_epoch = self._epoch
        child = type(self).__new__(type(self))
        child._setup(
            self.store,
            member_id=self.member_id,
            backend=self.backend,
            config=self.config,
            name=self.name,
            parent=self,
        )
        epoch = _Epoch(parent_epoch.number, members, members.index(self.member_id), sub=sub)
        child._epoch = epoch
        child._callbacks = []
        with parent_epoch.lock:
            parent_epoch.children.append(child)
            revoked = parent_epoch.revoked
        self._monitor.add_revoke_key(
            self._keys.revoked(epoch.number, sub), lambda raw: child._mark_revoked(epoch, raw)
        )
        if revoked is not None:
            child._mark_revoked(epoch, _revoke_payload(revoked.reason, [], self.member_id))
            raise revoked
        epoch.pg = child._build_backend(epoch, self._keys.pg_prefix(epoch.number, sub))
        return child

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self) -> None:
        """Leave: stop the monitor and drop the backend group; later ops raise
        :class:`~torchnext.errors.GroupShutdownError`. Idempotent, bounded."""
        if self._shutdown:
            return
        self._shutdown = True
        epoch = self._epoch
        if epoch.pending:
            self._retired.append(epoch)
        if self._parent is None:
            self._monitor.set_watch(None)
            self._monitor.stop()

    def _check_usable(self, allow_revoked: bool = False) -> None:
        if self._shutdown:
            raise GroupShutdownError(
                f"group {self.name!r} of {self.member_id} was shut down; create or join a new one"
            )
        if self._evicted is not None:
            raise self._evicted
        if self._parent is not None and self._parent._shutdown:
            raise GroupShutdownError(f"the parent of split group {self.name!r} was shut down")
        if not allow_revoked and self._epoch.revoked is not None:
            raise self._epoch.revoked


def _revoke_payload(reason: str, suspects: list[str], by: str) -> str:
    return json.dumps({"reason": reason, "suspects": suspects, "by": by})


def _crc(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())


def _store_addr(store: Any) -> str:
    host = getattr(store, "host", None)
    port = getattr(store, "port", None)
    return f"{host}:{port}" if host is not None else type(store).__name__


@atexit.register
def _leak_blocked_groups() -> None:
    # A gloo group with an op still blocked would hold up interpreter exit in its
    # destructor (it joins its threads) until the op's timeout; leak those instead.
    for group in list(_LIVE_GROUPS):
        epochs = list(group._retired)
        current = getattr(group, "_epoch", None)
        if current is not None:
            epochs.append(current)
        for epoch in epochs:
            if epoch.pg is not None and any(not w.is_completed() for w in list(epoch.pending)):
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(epoch.pg))
