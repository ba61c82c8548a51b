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
  on in slices (:mod:`torchnext.distributed.group.work`): the fast path adds a few Python
  attribute reads to a plain gloo call, and no store round trip.
* **Failure detection** (:mod:`torchnext.distributed.group.heartbeat`): a backend error on
  any member (gloo reports a closed connection to the dead rank's neighbours at once),
  an op past its timeout, a peer whose store heartbeat stopped advancing (a SIGSTOPped
  process), or a same-host peer whose process is gone.
* **Revoke** (ULFM semantics): the first member that sees a failure writes the
  epoch's revoke key with ``compare_set`` (first reason wins); every member's monitor
  polls that key every ``poll_interval``, so every survivor's pending and future ops in
  the epoch raise :class:`~torchnext.errors.CommRevokedError` (epoch, suspects, reason)
  within about ``poll_interval + wait_slice`` whatever the collective timeout.
* **Agreement and reconfiguration** (:mod:`torchnext.distributed.group.membership`): one
  decision per epoch through ``compare_set`` on the store, which lives outside the
  workers; ``shrink``/``grow``/``reconfigure`` open epoch ``E + 1`` with the decided
  members. Processes left out, or still in an older epoch, get
  :class:`~torchnext.errors.StaleEpochError` (fencing).
* **Split** sub-groups live inside the parent's epoch and are revoked with it
  (:mod:`torchnext.distributed.group.split`).

The group is assembled from parts with declared seams: the ops
(:class:`~torchnext.distributed.group.collectives.Collectives`,
:class:`~torchnext.distributed.group.p2p.PointToPoint`) see only an
:class:`~torchnext.distributed.group.issue.OpIssuer`; the backend builders
(:mod:`torchnext.distributed.group.backend`) get an epoch and a failure callback;
the agreement protocol (:mod:`torchnext.distributed.group.agreement`) gets the store,
the keys and the failure detector.

What not to assume: output tensors of an op that failed or was revoked hold undefined
values; a revoked epoch never recovers (call :meth:`agree` then :meth:`shrink`); with
``backend="nccl"`` revoke also calls the backend's ``abort``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchnext.distributed.group.agreement import (
    agree_on_next,
    await_admission,
    check_reconfigure,
    register_initial,
)
from torchnext.distributed.group.backend import (
    EpochBuilder,
    clone_store,
    connect_from_env,
    connect_store,
)
from torchnext.distributed.group.collectives import Collectives
from torchnext.distributed.group.config import (
    GroupConfig,
    check_group_args,
    defaults_for,
    group_device,
)
from torchnext.distributed.group.epoch import Epoch, RetiredEpochs
from torchnext.distributed.group.fencing import Fence
from torchnext.distributed.group.heartbeat import Monitor, Watch
from torchnext.distributed.group.issue import OpIssuer
from torchnext.distributed.group.membership import Keys, Membership, ProcessRecord
from torchnext.distributed.group.p2p import PointToPoint
from torchnext.distributed.group.revoke import Revoker
from torchnext.distributed.group.split import plan_split
from torchnext.errors import (
    CommRevokedError,
    CommTimeoutError,
    GroupShutdownError,
    MembershipError,
    StaleEpochError,
    StoreUnreachableError,
)

__all__ = ["FaultTolerantGroup", "connect_store", "live_groups"]

_LIVE_GROUPS: weakref.WeakSet[FaultTolerantGroup] = weakref.WeakSet()


def live_groups() -> list[FaultTolerantGroup]:
    """Every group of this process not yet garbage-collected (shut down or not), less those
    whose constructor raised before opening an epoch (a worker's error handler asks each
    group here what broke; a half-built one has nothing to say)."""
    return [g for g in list(_LIVE_GROUPS) if hasattr(g, "_epoch")]


class FaultTolerantGroup(Collectives, PointToPoint):
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
        members = register_initial(
            store,
            self._keys,
            member_id=member_id,
            world_size=world_size,
            config=self.config,
            name=name,
        )
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
        check_group_args(member_id=member_id, backend=backend)
        self.store = store
        self.member_id = member_id
        self.backend = backend
        self.config = cfg = config if config is not None else defaults_for(store)
        self.name = name
        self._keys = Keys(name)
        self._parent = parent
        self._shutdown = False
        self._decided: dict[int, Membership] = {}
        self._split_count = 0
        if parent is None:
            self._publish_self()
            # Own connections: gloo's rendezvous blocks its store client while it waits
            # for peers, which must never delay the monitor's revoke polling.
            self._monitor = Monitor(
                clone_store(store, cfg.store_timeout), self._keys, member_id, cfg
            )
            self._retired = RetiredEpochs()
            self._fence = Fence(store, member_id=member_id, name=name)
            self._monitor.add_housekeeping(self._retired.prune)
            self._builder = EpochBuilder(
                store, self._keys, member_id=member_id, backend=backend, config=cfg, group_name=name
            )
        else:
            self._monitor, self._retired = parent._monitor, parent._retired
            self._fence = parent._fence
            self._builder = parent._builder
        self._revoker = Revoker(
            store, self._keys, self._monitor, member_id=member_id, name=name, backend=backend
        )
        self._ops: OpIssuer = OpIssuer(
            name=name,
            config=cfg,
            device=group_device(backend),
            check_usable=self._check_usable,
            on_failure=self._revoker.on_op_failure,
            wire=parent._ops.wire if parent is not None else None,  # a split counts in its parent
        )
        Collectives.__init__(self, self._ops)
        PointToPoint.__init__(self, self._ops)
        _LIVE_GROUPS.add(self)

    def _publish_self(self) -> None:
        try:
            self.store.set(self._keys.process(self.member_id), ProcessRecord.current().encode())
        except (RuntimeError, OSError) as exc:
            raise StoreUnreachableError(
                f"member {self.member_id}: the store {_store_addr(self.store)} did not answer: {exc}"
            ) from exc

    @classmethod
    def from_env(
        cls, *, config: GroupConfig | None = None, backend: str = "gloo", name: str = "default"
    ) -> FaultTolerantGroup:
        """Create the group from ``TORCHNEXT_STORE_ADDR``, ``TORCHNEXT_MEMBER_ID`` and
        ``TORCHNEXT_WORLD_SIZE`` (as set by the launcher or the test harness)."""
        store, member, size = connect_from_env((config or GroupConfig()).store_timeout)
        cfg = config  # None: the defaults for the store (defaults_for)
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
        self._monitor.start()
        keys, cfg = self._keys, self.config
        try:
            admitted = await_admission(
                store, keys, member_id=member_id, timeout=timeout, config=cfg, name=name
            )
        except CommTimeoutError:
            self._monitor.stop()
            raise
        # A member dying while this one connects revokes the epoch: this process is a
        # member all the same, and recovers (agree, shrink) with the others at its first op.
        with contextlib.suppress(CommRevokedError):
            self._open_epoch(*admitted)
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
        """The current epoch's backend group (see :mod:`torchnext.distributed.group.interop`)."""
        return self._epoch.pg

    def errored(self) -> BaseException | None:
        """Why the current epoch broke (store lost, eviction, revoke, timeout), or None."""
        return self._fence.error or self._epoch.revoked or self._revoker.last_error

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
        epoch = Epoch(number, members, members.index(self.member_id))
        self._epoch = self._ops.epoch = epoch
        self._split_count = 0  # per epoch, so a joiner names sub-groups as its peers do
        revoker = self._revoker
        self._monitor.set_watch(
            Watch(
                epoch=number,
                members=members,
                revoke_keys={self._keys.revoked(number): lambda raw: revoker.mark(epoch, raw)},
                on_suspects=lambda failed, why: revoker.suspected(epoch, self._epoch, failed, why),
                on_stale=lambda latest: revoker.superseded(epoch, self._epoch, latest),
                on_evicted=lambda d: self._fence.evicted_by(epoch, self._epoch, d, self._retire),
                on_store_lost=lambda e: self._fence.lose_store(self._epoch, e, self._revoker.mark),
            )
        )
        epoch.pg = self._build_backend(epoch, self._keys.pg_prefix(number))
        if self._parent is None:
            self.store.set(self._keys.latest_epoch(), str(number))

    def _build_backend(self, epoch: Epoch, prefix: str) -> Any:
        return self._builder.build(epoch, prefix, lambda why: self._revoker.revoke(epoch, why, ()))

    def _retire(self, epoch: Epoch, reason: str, *, publish: bool = False) -> None:
        self._revoker.retire(epoch, reason, publish=publish)
        epoch.retired_at = time.monotonic()
        self._retired.add(epoch)

    # ------------------------------------------------------------------ revoke

    def revoke(self, reason: str = "revoked by the application") -> None:
        """Revoke the current epoch on every member (not collective; idempotent)."""
        self._check_usable(allow_revoked=True)
        self._revoker.revoke(self._epoch, reason, ())

    def add_revoke_callback(self, fn: Callable[[CommRevokedError], None]) -> None:
        """Call ``fn(error)`` once per revoked epoch, from whichever thread saw the revoke."""
        self._revoker.callbacks.append(fn)

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

    def pending_joiners(self, *, fresh: bool = True) -> tuple[str, ...]:
        """Member ids that called :meth:`join` and wait for :meth:`grow` (and look alive);
        ``fresh=False``: as the monitor last read them (every heartbeat), no store request."""
        self._check_usable(allow_revoked=True)
        if fresh:
            self._monitor.refresh_joiners()
        return tuple(self._monitor.pending_joiners())

    def reconfigure(self, members: Sequence[str], timeout: timedelta | None = None) -> Membership:
        """Move to exactly ``members`` (rank order as given): current members and pending
        joiners. Collective over the current members; the first proposal wins. A member
        left out is released (its group shuts down) and gets the Membership back."""
        wanted = tuple(members)
        check_reconfigure(
            wanted, epoch=self.epoch, members=self.members, joiners=self.pending_joiners()
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
        if epoch.number in self._decided:
            return self._decided[epoch.number]
        decision = agree_on_next(
            self.store,
            self._keys,
            self._monitor,
            epoch,
            member_id=self.member_id,
            kind=kind,
            bound=timeout if timeout is not None else self.config.store_timeout,
            config=self.config,
            name=self.name,
            proposal=proposal,
        )
        self._decided[epoch.number] = decision
        if self.member_id not in decision.members and decision.kind != "reconfigure":
            self._evict(decision)
        return decision

    def _evict(self, decision: Membership) -> None:
        raise self._fence.evict(decision, self._epoch, self._retire)

    def _transition(self, decision: Membership) -> None:
        old = self._epoch
        if old.number != decision.epoch:
            raise StaleEpochError(
                f"decision for epoch {decision.epoch} applied in epoch {old.number}"
            )
        self._retire(old, f"superseded by epoch {decision.epoch + 1}", publish=True)
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
        ``(key, rank)``; ``color=None`` opts out and gets ``NON_GROUP_MEMBER`` (-100).
        Semantics as Python: :mod:`torchnext.distributed.group.split`.
        """
        self._check_usable()
        bound = timeout if timeout is not None else self.config.collective_timeout
        self._split_count += 1

        def exchange(row: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(self.size, row.numel(), dtype=row.dtype)
            self.all_gather_into_tensor(out.view(-1), row, timeout=bound)
            return out

        plan = plan_split(ranks, color, key, rank=self.rank, size=self.size, exchange=exchange)
        if plan is None:
            return int(dist.GroupMember.NON_GROUP_MEMBER)
        sub_ranks, color_of = plan
        sub = f"/s{self._split_count}c{color_of}"
        return self._make_child(tuple(self.members[r] for r in sub_ranks), sub)

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
        epoch = Epoch(parent_epoch.number, members, members.index(self.member_id), sub=sub)
        child._epoch = child._ops.epoch = epoch
        end = self._retired.on_revoke(child._revoker.mark, epoch)  # kept while ops block
        with parent_epoch.lock:
            parent_epoch.children.append(end)
            revoked = parent_epoch.revoked
        self._monitor.add_revoke_key(self._keys.revoked(epoch.number, sub), end)
        if revoked is not None:
            child._revoker.retire(epoch, revoked.reason)
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
            self._retired.add(epoch)
        if self._parent is None:
            self._monitor.set_watch(None)
            self._monitor.stop()

    def _check_usable(self, allow_revoked: bool = False) -> None:
        if self._shutdown:
            raise GroupShutdownError(
                f"group {self.name!r} of {self.member_id} was shut down; create or join a new one"
            )
        self._fence.check()
        if self._parent is not None and self._parent._shutdown:
            raise GroupShutdownError(f"the parent of split group {self.name!r} was shut down")
        if not allow_revoked and self._epoch.revoked is not None:
            raise self._epoch.revoked


def _store_addr(store: Any) -> str:
    host = getattr(store, "host", None)
    port = getattr(store, "port", None)
    return f"{host}:{port}" if host is not None else type(store).__name__


@atexit.register
def _leak_blocked_groups() -> None:
    # A gloo group with an op still blocked would hold up interpreter exit in its
    # destructor (it joins its threads) until the op's timeout; leak those instead.
    for group in list(_LIVE_GROUPS):
        epochs = list(group._retired.epochs)
        current = getattr(group, "_epoch", None)
        if current is not None:
            epochs.append(current)
        for epoch in epochs:
            if epoch.has_blocked_ops():
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(epoch.pg))
