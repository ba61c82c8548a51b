"""Configuration of a :class:`~torchnext.distributed.FaultTolerantGroup`.

Every timing knob of failure detection and recovery lives here, as ``timedelta``.
Defaults come from the ``TORCHNEXT_*`` environment (see :mod:`torchnext._env`) when a
field is left unset, so a job template can tune them without code changes; an
explicit value always wins.

What not to assume: recovery time does not depend on ``collective_timeout`` (a failure
revokes the epoch, which wakes every waiter within ``poll_interval`` plus a wait
slice), but hang detection does depend on ``heartbeat_timeout``: a SIGSTOPped peer on
another host, or a host that lost power or its network, is only suspected once its
heartbeat is that old.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch

from torchnext import _env

__all__ = [
    "ETCD_HEARTBEAT_INTERVAL",
    "GroupConfig",
    "check_group_args",
    "defaults_for",
    "group_device",
    "on_etcd",
]


def _collective_timeout() -> timedelta:
    return _env.TORCHNEXT_COLLECTIVE_TIMEOUT.get()


def _heartbeat_interval() -> timedelta:
    return _env.TORCHNEXT_HEARTBEAT_INTERVAL.get()


def _heartbeat_timeout() -> timedelta:
    return _env.TORCHNEXT_HEARTBEAT_TIMEOUT.get()


def _beacons() -> bool:
    return _env.TORCHNEXT_BEACONS.get()


def _store_timeout() -> timedelta:
    return _env.TORCHNEXT_STORE_TIMEOUT.get()


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """Timing and behaviour of a fault-tolerant group (all fields keyword-only)."""

    collective_timeout: timedelta = field(default_factory=_collective_timeout)
    """Default per-op timeout (``TORCHNEXT_COLLECTIVE_TIMEOUT``, 60 s). An op past it
    raises :class:`~torchnext.errors.CommTimeoutError` and revokes the epoch."""
    heartbeat_interval: timedelta = field(default_factory=_heartbeat_interval)
    """How often a member writes its heartbeat to the store (``TORCHNEXT_HEARTBEAT_INTERVAL``,
    0.1 s; a group made without a config on an etcd store uses 0.2 s, see
    :func:`defaults_for`)."""
    heartbeat_timeout: timedelta = field(default_factory=_heartbeat_timeout)
    """A member whose heartbeat has not advanced for this long is suspected failed
    (``TORCHNEXT_HEARTBEAT_TIMEOUT``, 1.5 s): a silent host is seen within about this
    plus two heartbeat intervals. Silence counts only while this member's monitor
    watches (its own stalls and store outages are credited), so load delays detection
    rather than causing false suspicions."""
    poll_interval: timedelta = timedelta(milliseconds=20)
    """How often each member checks the store for a revoke of its epoch."""
    wait_slice: timedelta = timedelta(milliseconds=50)
    """A blocked op re-checks for a revoke at least this often."""
    store_timeout: timedelta = field(default_factory=_store_timeout)
    """Bound on creating the group and on each store wait (``TORCHNEXT_STORE_TIMEOUT``)."""
    agreement_grace: timedelta = timedelta(seconds=30)
    """In an agreement, a member that is alive (fresh heartbeat) but has not joined the
    agreement is waited for this long, then left out."""
    probe_local_pids: bool = True
    """Members on the same host check each other's process state (``/proc``), so a
    SIGKILLed local peer is detected at once rather than after ``heartbeat_timeout``."""
    beacons: bool = field(default_factory=_beacons)
    """Members also send each other a UDP heartbeat datagram every ``heartbeat_interval``
    (:mod:`~torchnext.distributed.group.beacon`), judged only while the store does not
    answer: a host that went down with the store (the etcd leader's) is then suspected a
    heartbeat timeout after it fell silent, not after the store's recovery. Needs UDP
    between hosts on any port; where it is blocked nothing changes but that case.
    Default: ``TORCHNEXT_BEACONS`` (on)."""
    validate: bool = False
    """Debug mode: before each collective, members exchange the op name, shapes and
    dtypes and raise :class:`~torchnext.errors.CollectiveMismatchError` on a mismatch
    instead of hanging or returning garbage (gloo itself may abort the whole process on
    a size mismatch: "Received data size doesn't match expected size"). Costs one extra
    small collective per op; use it while developing."""

    native_reconfigure: bool = False
    """torch >= 2.14 with gloo only: keep one gloo group (``enable_reconfigure=True``)
    and move it between epochs with its native ``reconfigure`` instead of building a
    fresh gloo group per epoch. Best for planned changes (grow, reconfigure): after a
    crash, an op still blocked in the old communicator occupies one of the group's
    worker threads until its timeout, so the default (fresh groups) recovers faster."""

    def __post_init__(self) -> None:
        positive = {
            "collective_timeout": self.collective_timeout,
            "heartbeat_interval": self.heartbeat_interval,
            "heartbeat_timeout": self.heartbeat_timeout,
            "poll_interval": self.poll_interval,
            "wait_slice": self.wait_slice,
            "store_timeout": self.store_timeout,
            "agreement_grace": self.agreement_grace,
        }
        for name, value in positive.items():
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ValueError(
                    f"GroupConfig.{name}={value!r}: pass a positive datetime.timedelta"
                )
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"GroupConfig.heartbeat_timeout={self.heartbeat_timeout} must exceed "
                f"heartbeat_interval={self.heartbeat_interval} (use at least 3x), or every "
                "member would be suspected between two heartbeats"
            )


ETCD_HEARTBEAT_INTERVAL = timedelta(milliseconds=200)
"""The default heartbeat interval on an etcd store (see :func:`defaults_for`)."""


def on_etcd(store: object) -> bool:
    """Whether ``store`` keeps the group's keys on an etcd cluster (an ``etcd://`` store)."""
    return str(getattr(store, "url", "") or "").startswith("etcd://")


def defaults_for(store: object) -> GroupConfig:
    """The default :class:`GroupConfig` for a group on ``store``.

    On an etcd store (``etcd://``) members beat every :data:`ETCD_HEARTBEAT_INTERVAL`
    (0.2 s) instead of 0.1 s, unless ``TORCHNEXT_HEARTBEAT_INTERVAL`` is set: there each
    beat is a write the cluster replicates to a quorum of members, and at 0.1 s the beats
    of eight workers took about as much CPU as the cluster itself. The heartbeat timeout
    is unchanged, so a silent host is still suspected within the timeout plus an interval
    (1.7 s by default). Any other store gets ``GroupConfig()``."""
    if on_etcd(store) and not _env.TORCHNEXT_HEARTBEAT_INTERVAL.is_set():
        return GroupConfig(heartbeat_interval=ETCD_HEARTBEAT_INTERVAL)
    return GroupConfig()


def check_group_args(*, member_id: str, backend: str) -> None:
    """Raise with the fix unless ``member_id`` and ``backend`` can make a group here."""
    if not member_id or not isinstance(member_id, str) or "/" in member_id:
        raise ValueError(
            f"member_id={member_id!r}: pass a non-empty string without '/', unique in the job"
        )
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}: use 'gloo' (CPU) or 'nccl' (CUDA)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA, and none is available; use 'gloo'")


def group_device(backend: str) -> torch.device:
    """Where a group on ``backend`` communicates: the CPU for gloo, the current GPU for NCCL."""
    if backend == "gloo":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
