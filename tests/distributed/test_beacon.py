"""Heartbeat datagrams (``torchnext.distributed.group.beacon``): who is heard, who is silent.

Real UDP sockets on the loopback interface, real threads; a stalled process is a real
child stopped with SIGSTOP. Host names are the ones the records would carry.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from torchnext.distributed.group.beacon import Beacon, advertised_ip

INTERVAL = timedelta(milliseconds=50)
TIMEOUT = timedelta(milliseconds=600)


def beacon(member: str) -> Beacon:
    return Beacon(
        tag="torchnext/ft/test", member=member, interval=INTERVAL,
        stall_allowance=timedelta(milliseconds=300), ip="127.0.0.1",
    )  # fmt: skip


def until(condition: Callable[[], bool], bound_s: float = 5.0) -> bool:
    """Poll ``condition`` every 20 ms for at most ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_silent_host_is_named_only_while_another_host_is_heard() -> None:
    a, b, c = beacon("a"), beacon("b"), beacon("c")
    assert a.address == ""  # no socket before start
    for x in (a, b, c):
        x.start()
    a.set_peers({"b": ("hostB", b.address), "c": ("hostC", c.address)})
    for other in (b, c):
        other.set_peers({"a": ("hostA", a.address)})
    try:
        assert a.silence_s("never") is None
        assert until(lambda: a.silence_s("b") is not None and a.silence_s("c") is not None)
        assert a.silent(["a", "b", "c"], TIMEOUT, "hostA") == []
        c.stop()  # host C goes silent; host B is still heard
        assert until(lambda: a.silent(["b", "c"], TIMEOUT, "hostA") == ["c"])
        reason = Beacon.reason(["c"], TIMEOUT)
        assert reason.startswith("c: unresponsive: no heartbeat datagram") and "store" in reason
        b.stop()  # now no other host is heard: this member may be the one cut off
        assert until(lambda: (a.silence_s("b") or 0) > TIMEOUT.total_seconds())
        assert a.silent(["b", "c"], TIMEOUT, "hostA") == []
        # A witness on the silent member's own host does not count either.
        a.set_peers({"b": ("hostC", b.address), "c": ("hostC", c.address)})
        assert a.silent(["b", "c"], TIMEOUT, "hostA") == []
    finally:
        for x in (a, b, c):
            x.stop()


def test_datagrams_of_another_group_are_ignored() -> None:
    a = beacon("a")
    other = Beacon(
        tag="torchnext/ft/other", member="b", interval=INTERVAL,
        stall_allowance=timedelta(milliseconds=300), ip="127.0.0.1",
    )  # fmt: skip
    a.start()
    other.start()
    other.set_peers({"a": ("hostA", a.address)})
    try:
        time.sleep(0.3)  # six intervals of datagrams from the other group
        assert a.silence_s("b") is None
    finally:
        a.stop()
        other.stop()


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="interval"):
        Beacon(
            tag="t", member="a", interval=timedelta(0),
            stall_allowance=timedelta(seconds=1), ip="127.0.0.1",
        )  # fmt: skip

    class LocalStore:
        host = "127.0.0.1"

    class EtcdOnThisHost:
        url = "etcd://127.0.0.1:2379,127.0.0.2:2379/job"

    # The address traffic to the store leaves from: loopback for a store on this host.
    assert advertised_ip(LocalStore()) == "127.0.0.1"
    assert advertised_ip(EtcdOnThisHost()) == "127.0.0.1"
    socket.inet_aton(advertised_ip(object()))  # no store host known: still an IPv4 address


_CHILD = """
import sys
from datetime import timedelta
from torchnext.distributed.group.beacon import Beacon
me, target = sys.argv[1], sys.argv[2]
b = Beacon(tag="torchnext/ft/test", member=me, interval=timedelta(milliseconds=50),
           stall_allowance=timedelta(milliseconds=300), ip="127.0.0.1")
worst = [0.0]

def look():  # where the monitor's judge runs: right after each look
    silence = b.silence_s("P")
    if silence is not None:
        worst[0] = max(worst[0], silence)

b.on_look = look
b.start()
if target != "-":
    b.set_peers({"C": ("hostC", target)})
print(b.address, flush=True)
for line in sys.stdin:
    print(b.silence_s("P"), worst[0], flush=True)
"""


def spawn(member: str, target: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, member, target],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )  # fmt: skip


def ask(child: subprocess.Popen[str]) -> tuple[float | None, float]:
    """The child's current silence of P (None: never heard) and the worst its judge saw."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("?\n")
    child.stdin.flush()
    now, worst = child.stdout.readline().split()
    return (None if now == "None" else float(now)), float(worst)


@pytest.mark.skipif(sys.platform != "linux", reason="SIGSTOP of child processes (Linux)")
def test_a_machine_wide_stall_is_credited_not_judged() -> None:
    """Both processes stopped for 2 s (a paused VM), then resumed, the observer 0.1 s before
    its peer (whose datagrams are then still on their way): the observer's judge, which
    looks right after each look of the beacon, sees the peer silent for the allowance
    (0.3 s) plus those 0.1 s, not for the 2 s of the stall."""
    observer = spawn("C", "-")
    peer: subprocess.Popen[str] | None = None
    try:
        assert observer.stdout is not None
        peer = spawn("P", observer.stdout.readline().strip())
        assert until(lambda: ask(observer)[0] is not None)
        for child in (peer, observer):
            os.kill(child.pid, signal.SIGSTOP)
        time.sleep(2.0)  # the stall itself
        os.kill(observer.pid, signal.SIGCONT)
        time.sleep(0.1)  # the peer's first datagram after the stall is still in flight
        os.kill(peer.pid, signal.SIGCONT)
        assert until(lambda: (ask(observer)[0] or 1.0) < 0.2)  # P is heard again
        worst = ask(observer)[1]
        assert 0.3 <= worst < 1.0, worst
    finally:
        for started in (observer, peer):
            if started is not None:
                started.kill()
                started.communicate(timeout=10)  # reaps it and closes the pipes
