"""The monitor's bounds: what a stall is credited, how long a store call may take, and
what a member says when its store is lost.

What it is: the rules :class:`~torchnext.distributed.group.heartbeat.Monitor` (and its
:class:`~torchnext.distributed.group.beacon.Beacon`) apply so that a loaded machine or a
store that paused delays failure detection instead of causing a false suspicion, and so
that no store call of the monitor waits long.

When to use: inside the group's monitor; the numbers follow from a :class:`GroupConfig`.

What not to assume: these are allowances against ``heartbeat_timeout``; they do not make
detection faster than the timeout, only keep live members from being suspected.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from torchnext.distributed.group.config import GroupConfig, on_etcd
from torchnext.errors import StoreLostError

__all__ = [
    "gap_allowance_s",
    "monitor_call_timeout",
    "normal_gap_s",
    "store_lost_error",
    "waits_cheaply",
]

_READ_SLACK_S = 0.1
"""Scheduling slack on top of a heartbeat interval and a poll, in a normal gap between reads."""


def waits_cheaply(store: Any) -> bool:
    """Whether waiting on ``store`` costs the server little (etcd watches), so a revoke is
    better waited for than polled."""
    return on_etcd(store)


def normal_gap_s(config: GroupConfig) -> float:
    """The longest gap between two reads of the counters on a machine that is not stalled:
    a heartbeat interval, a poll and scheduling slack."""
    return (
        config.heartbeat_interval.total_seconds()
        + config.poll_interval.total_seconds()
        + _READ_SLACK_S
    )


def gap_allowance_s(config: GroupConfig) -> float:
    """How long a gap between two reads of the counters counts in full; the rest is credit.

    At least a heartbeat interval and a poll (a normal gap), and half the heartbeat
    timeout: a stall that every member shared (a store that paused, an etcd member that
    died and had its clients fail over) delays live peers' beats as much as this
    monitor's reads, so after it a live peer shows at most this much silence plus an
    interval, well under the timeout; while a peer that died when the stall began is
    still suspected half a timeout after it ends, not a whole one.
    """
    return max(normal_gap_s(config), config.heartbeat_timeout.total_seconds() * 0.5)


def monitor_call_timeout(config: GroupConfig) -> timedelta:
    """The bound on each of the monitor's store calls: about one heartbeat timeout.

    Short, so a silent store is noticed (and its outage timed) while heartbeats still
    matter; never above ``store_timeout``, nor below a second (a loaded store host may
    take that long to answer, and a call that fails only starts an outage).
    """
    return min(config.store_timeout, max(config.heartbeat_timeout, timedelta(seconds=1)))


def store_lost_error(
    store: Any, silent_for: timedelta, last_error: BaseException
) -> StoreLostError:
    """The error of a member whose store has not answered for ``silent_for``."""
    if on_etcd(store):
        where = f"the etcd cluster {store.url}"
        fix = (
            "No member with quorum answered: bring a majority of the cluster's members "
            "back (a 3-member cluster survives losing one)."
        )
    else:
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        where = f"the TCP store at {host}:{port}" if host is not None else type(store).__name__
        fix = (
            "A TCP store lives on one host (node 0's agent): if that host is down the job "
            "is lost. To survive losing any one host, keep the store on an etcd cluster: "
            "torchnext run --store etcd://h1:2379,h2:2379,h3:2379/JOB."
        )
    first = str(last_error).splitlines()[0] if str(last_error) else type(last_error).__name__
    return StoreLostError(
        f"{where} has not answered for over {silent_for} (last error: {first}); its host "
        f"may be down, or this host cut off from it. {fix}"
    )
