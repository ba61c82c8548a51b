"""Membership helpers: member ordering, process probes, decision encoding."""

from __future__ import annotations

import os
import subprocess
import sys

from torchnext.distributed.membership import Membership, ProcessRecord, natural_key, probe_process


def test_natural_order_of_member_ids() -> None:
    assert sorted(["w10", "w2", "w1", "a"], key=natural_key) == ["a", "w1", "w2", "w10"]


def test_membership_round_trips_json() -> None:
    m = Membership(epoch=3, members=("w0", "r1"), failed=("w1",), joined=("r1",), kind="grow")
    assert Membership.from_json(m.to_json()) == m


def test_probe_sees_alive_dead_and_reused_pid() -> None:
    me = ProcessRecord.current()
    assert probe_process(me) == "alive"
    assert ProcessRecord.decode(me.encode()) == me
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = ProcessRecord(me.host, child.pid, 0)
    child.wait()
    assert probe_process(record) == "dead"
    # Same pid, different start time: the pid was reused, the member is gone.
    assert probe_process(ProcessRecord(me.host, os.getpid(), me.start_ticks + 1)) == "dead"
    assert probe_process(ProcessRecord("another-host", os.getpid(), 0)) == "unknown"
