"""Test hosts: real TCP between namespaces, silence on power-off, partitions, freezes, cleanup.

Every check drives small real programs in the hosts (an echo server, a client that
reports each exchange as one line) and waits on their lines with a bound; no sleeps.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from torchnext.errors import HostNetworkError
from torchnext.testing import TestHost, TestHosts, netns, requires_test_hosts

# An echo server (``serve``), a client of it (``client HOST``) that runs one exchange
# per stdin line and prints its outcome, and an "agent" that starts a server child.
PEER = textwrap.dedent(
    """
    import os, socket, subprocess, sys, threading, time

    def serve():
        srv = socket.create_server(("0.0.0.0", 7000))
        print("listening", flush=True)
        def echo(conn):
            with conn, conn.makefile("rb") as lines:
                for line in lines:
                    conn.sendall(line)
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def client(host):
        conn = socket.create_connection((host, 7000), timeout=10)
        print("connected", socket.gethostname(), flush=True)
        buffered = b""
        for seq, line in enumerate(sys.stdin):
            cmd, timeout = line.split()
            t0 = time.monotonic()
            try:
                if cmd == "fresh":
                    conn, buffered = socket.create_connection((host, 7000), float(timeout)), b""
                conn.settimeout(float(timeout))
                conn.sendall(b"%d\\n" % seq)
                while (b"%d\\n" % seq) not in buffered:  # late echoes of earlier lines first
                    data = conn.recv(100)
                    if not data:
                        raise EOFError("the peer closed the connection")
                    buffered += data
                outcome = "reply"
            except socket.timeout:
                outcome = "timeout"
            except (OSError, EOFError) as exc:
                outcome = f"error:{type(exc).__name__}"
            print(outcome, f"{time.monotonic() - t0:.3f}", flush=True)

    if sys.argv[1] == "serve":
        serve()
    elif sys.argv[1] == "agent":
        child = subprocess.Popen([sys.executable, __file__, "serve"], stdout=subprocess.PIPE)
        child.stdout.readline()  # "listening"
        print("child", child.pid, flush=True)
        child.wait()
    else:
        client(sys.argv[2])
    """
)

OWNER = textwrap.dedent(
    """
    import time
    from torchnext.testing import TestHosts

    hosts = TestHosts(2)  # no `with`: the process-wide cleanup has to act
    print(hosts[0].run(["sleep", "600"]).pid, flush=True)
    time.sleep(600)
    """
)

WAIT_S = 20.0  # bound on every line we wait for; far above what any exchange needs


class Lines:
    """A process's stdout as a queue of lines, read by a thread, each wait bounded."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                self._lines.put(raw.decode().strip())
            self.proc.stdout.close()
        except ValueError:
            pass  # the hosts' cleanup closed the pipe
        self._lines.put("<eof>")

    def join(self) -> None:
        """Wait (bounded) until every process holding the pipe is gone and it is closed."""
        self._reader.join(WAIT_S)
        assert not self._reader.is_alive(), f"pid {self.proc.pid}'s output never ended"

    def next(self) -> str:
        try:
            return self._lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no line from pid {self.proc.pid} within {WAIT_S} s") from None

    def ask(self, command: str) -> tuple[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\n".encode())
        self.proc.stdin.flush()
        outcome, seconds = self.next().split()
        return outcome, float(seconds)


def _peer(tmp_path: Path) -> str:
    path = tmp_path / "peer.py"
    path.write_text(PEER)
    return str(path)


def _start(host: TestHost, *argv: str, role: str = "process") -> Lines:
    proc = host.run(
        [sys.executable, *argv], role=role, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    return Lines(proc)


def _gone(pid: int) -> bool:
    return netns.process_state(pid) in ("", "Z")


@requires_test_hosts()
def test_hosts_talk_tcp_by_name_and_each_has_its_own_host_name(tmp_path: Path) -> None:
    peer = _peer(tmp_path)
    with TestHosts(2) as hosts:
        server = _start(hosts[0], peer, "serve")
        assert server.next() == "listening"
        client = _start(hosts[1], peer, "client", "h0")
        assert client.next() == "connected h1"
        assert client.ask("ping 10")[0] == "reply"
        assert server.proc.pid in hosts[0].pids() and client.proc.pid in hosts[1].pids()
        # The test process stays outside every host and reaches them through the bridge.
        with socket.create_connection((hosts[0].address, 7000), timeout=WAIT_S) as conn:
            conn.sendall(b"hello\n")
            assert conn.recv(100) == b"hello\n"
        # A process started by other code, through the host's command line.
        probe = "import socket; print(socket.gethostname(), socket.gethostbyname('gateway'))"
        argv = hosts[1].command([sys.executable, "-c", probe])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, check=True)
        assert done.stdout.split() == ["h1", hosts.gateway]


@requires_test_hosts()
def test_kill_agent_spares_its_children_and_power_off_is_silence(tmp_path: Path) -> None:
    peer = _peer(tmp_path)
    with TestHosts(2) as hosts:
        agent = _start(hosts[0], peer, "agent", role="agent")
        child = int(agent.next().split()[1])
        client = _start(hosts[1], peer, "client", "h0")
        assert client.next() == "connected h1"
        hosts.kill_agent(hosts[0])
        assert agent.proc.returncode == -signal.SIGKILL
        assert child in hosts[0].pids()
        assert client.ask("ping 10")[0] == "reply"  # the server child runs on
        fault = hosts.power_off(hosts[0])
        assert child in fault.pids and hosts[0].pids() == [] and _gone(child)
        # No FIN, no RST left the host: the connected peer hears nothing, and a new
        # connection gets no answer either (not a refusal).
        outcome, seconds = client.ask("ping 1.5")
        assert outcome == "timeout" and seconds >= 1.4, (outcome, seconds)
        assert client.ask("fresh 1.5")[0] in ("timeout", "error:OSError"), "expected silence"
        with pytest.raises(ValueError, match="powered off"):
            hosts.partition(hosts[0])
        with pytest.raises(ValueError, match="powered off"):
            hosts[0].run(["true"])


@requires_test_hosts()
def test_partition_reconnect_freeze_thaw(tmp_path: Path) -> None:
    peer = _peer(tmp_path)
    with TestHosts(2) as hosts:
        server = _start(hosts[0], peer, "serve")
        assert server.next() == "listening"
        client = _start(hosts[1], peer, "client", "h0")
        assert client.next() == "connected h1"

        hosts.partition(hosts[0])
        assert client.ask("ping 1")[0] == "timeout"
        assert server.proc.poll() is None and netns.process_state(server.proc.pid) != "T"
        hosts.reconnect(hosts[0])
        # TCP retransmits what the partition held; the old connection and a new one work.
        assert client.ask("ping 10")[0] == "reply"
        assert client.ask("fresh 10")[0] == "reply"

        hosts.freeze(hosts[0])
        assert netns.process_state(server.proc.pid) == "T"
        assert client.ask("ping 1")[0] == "timeout"
        hosts.thaw(hosts[0])
        assert client.ask("ping 10")[0] == "reply"
        kinds = [f.kind for f in hosts.faults]
        assert kinds == ["partition", "reconnect", "freeze", "thaw"]
        with pytest.raises(ValueError, match="not frozen"):
            hosts.thaw(hosts[0])


def _owner(tmp_path: Path) -> tuple[Lines, int]:
    """A process that makes hosts and starts a sleeper on one; returns it and the sleeper."""
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    lines = Lines(subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE))
    return lines, int(lines.next())


@requires_test_hosts()
def test_nothing_is_left_behind_on_error_on_signals_and_after_sigkill(tmp_path: Path) -> None:
    with pytest.raises(KeyError), TestHosts(1) as hosts:
        sleeper = hosts[0].run(["sleep", "600"])
        raise KeyError("a failing test")
    assert netns.leftovers(os.getpid()) == [] and _gone(sleeper.pid)

    # SIGTERM: the handler cleans up, then the process dies of the signal as before;
    # SIGINT: KeyboardInterrupt ends the interpreter, and atexit cleans up.
    for sig in (signal.SIGTERM, signal.SIGINT):
        lines, sleeper_pid = _owner(tmp_path)
        owner = lines.proc
        assert len(netns.leftovers(owner.pid)) == 5  # bridge, two links, two namespaces
        owner.send_signal(sig)
        assert owner.wait(timeout=WAIT_S) in (-sig, 1)
        assert netns.leftovers(owner.pid) == [] and _gone(sleeper_pid), sig
        lines.join()

    lines, sleeper_pid = _owner(tmp_path)
    owner = lines.proc
    owner.kill()
    owner.wait(timeout=WAIT_S)
    left = netns.leftovers(owner.pid)
    assert len(left) == 5 and not _gone(sleeper_pid)  # a SIGKILL leaves all of it
    with TestHosts(1) as hosts:
        assert sorted(hosts.removed_leftovers) == left
    assert netns.leftovers(owner.pid) == [] and _gone(sleeper_pid)
    lines.join()


def test_without_root_or_ip_it_raises_the_reason_and_the_mark_skips(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchnext.testing.hosts import requires_test_hosts as mark

    netns.unavailable_reason.cache_clear()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    try:
        with pytest.raises(HostNetworkError, match="need root"):
            TestHosts(2)
        skip = mark()
        assert skip.args == (True,) and "need root" in skip.kwargs["reason"]
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        monkeypatch.setattr(netns.shutil, "which", lambda name: None)
        netns.unavailable_reason.cache_clear()
        with pytest.raises(HostNetworkError, match="install iproute2"):
            TestHosts(2)
    finally:
        netns.unavailable_reason.cache_clear()
    with pytest.raises(ValueError, match="count=0"):
        TestHosts(0)
