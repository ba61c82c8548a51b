"""The monitor's list of pending joiners, as the steps read it (no store request).

Steps ask whether joiners wait from the monitor's last read of the registry. A joiner the
last grow admitted is a member at once, although the monitor reads its admission key only
at its next heartbeat: listed as still pending, it made the next step grow again, admit
nobody, and open an epoch for nothing (and then processes aborted at exit).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from torchnext.distributed.group.config import GroupConfig
from torchnext.distributed.group.heartbeat import Monitor, Watch
from torchnext.distributed.group.membership import Keys

CONFIG = GroupConfig(heartbeat_interval=timedelta(milliseconds=50), probe_local_pids=False)


def test_a_joiner_admitted_into_the_epoch_is_no_longer_pending() -> None:
    store, keys = dist.HashStore(), Keys("joiners")
    monitor = Monitor(store, keys, "w0", CONFIG)  # not started: the test drives the reads
    store.set(keys.heartbeat("w1"), "1")
    store.set(keys.heartbeat("w1.r1"), "1")
    store.add(keys.joiner_count(), 1)
    store.set(keys.joiner_slot(0), "w1.r1")
    monitor.set_watch(Watch(0, ("w0", "w1"), {}, lambda members, why: None, lambda e: None))
    monitor.refresh_joiners()
    assert monitor.pending_joiners() == ["w1.r1"]
    # The grow admitted it: the next epoch's watch has it, its admission key is unread.
    monitor.set_watch(Watch(1, ("w0", "w1.r1"), {}, lambda members, why: None, lambda e: None))
    assert monitor.pending_joiners() == []
