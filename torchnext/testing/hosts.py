"""Test hosts: several machines on one Linux box, and the faults whole machines have.

Use :class:`TestHosts` to test code that must survive the loss of a *machine*, not of a
process: a machine that loses power or its network sends nothing (no FIN, no RST),
takes all its processes at once, and may come back. Each host is a network namespace
with one link (``eth0``) on a bridge, an address of a private test subnet, its own
host name (``h0``, ``h1``...) that every host resolves (``/etc/hosts``), and real TCP
between hosts::

    with TestHosts(3) as hosts:
        for h in hosts:                     # one agent per host; h0 hosts the store
            h.run(["torchnext", "run", "--nnodes=3", f"--node-rank={h.index}",
                   "--store-addr=h0:29600", "--store-host=0.0.0.0", ...], role="agent")
        ...
        fault = hosts.power_off(hosts[1])   # link down, then SIGKILL of all its processes

Faults: :meth:`~TestHosts.power_off` (the link goes down first, then every process of
the host is SIGKILLed, so peers get silence), :meth:`~TestHosts.freeze` and
:meth:`~TestHosts.thaw` (SIGSTOP / SIGCONT of every process of the host),
:meth:`~TestHosts.partition` and :meth:`~TestHosts.reconnect` (the link goes down and
up while its processes run on), :meth:`~TestHosts.kill_agent` (SIGKILL of the processes
started with ``role="agent"``, leaving their children). "Every process of the host" is
every process in its namespace, the children of what :meth:`TestHost.run` started too.

Cleanup: leaving the ``with`` block, :meth:`~TestHosts.close`, the end of the
interpreter (``atexit``) and SIGTERM or SIGHUP of the test process all kill every
process of every host and remove the namespaces, links, bridge and ``/etc/netns``
files; SIGINT raises ``KeyboardInterrupt``, which leaves the ``with`` block. What a
SIGKILLed owner left is removed by the next :class:`TestHosts` made on the machine
(names carry the owner's pid; see :mod:`torchnext.testing.netns`).

Needs root and ``ip`` (iproute2); elsewhere :class:`TestHosts` raises
:class:`~torchnext.errors.HostNetworkError` with the reason, and
:func:`requires_test_hosts` skips a pytest test with it. What not to assume: the
hosts share this machine's CPUs, clock, file system and process ids; only the network
and host names are separate. A process a host started can still read files the test
wrote, and ``time.time()`` is the same everywhere.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, TYPE_CHECKING, Any, Literal

from torchnext.errors import HostNetworkError
from torchnext.testing.netns import (
    ETC_NETNS,
    ip,
    ip_batch,
    ip_path,
    kill_all,
    netns_inode,
    pick_subnet,
    pids_in,
    release_serial,
    remove_leftovers,
    resource_kind,
    resource_name,
    send_signal,
    stop_all,
    take_serial,
    unavailable_reason,
)

if TYPE_CHECKING:
    import pytest

__all__ = [
    "TestHost",
    "TestHosts",
    "HostFault",
    "FaultName",
    "GATEWAY_NAME",
    "hosts_unavailable_reason",
    "requires_test_hosts",
]

FaultName = Literal["power_off", "freeze", "thaw", "partition", "reconnect", "kill_agent"]

GATEWAY_NAME = "gateway"
"""The name every host knows this machine by (the test process, outside every host)."""

_MAX_HOSTS = 100
_RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
_REAP_TIMEOUT = timedelta(seconds=5)

# Runs first in every process a host starts: a host name of its own (a UTS namespace),
# then the command. Without it every host would share this machine's name, and
# same-host shortcuts (a /proc probe of a "local" peer) would see other hosts' processes.
_ENTER = (
    "import ctypes, os, socket, sys\n"
    "if ctypes.CDLL(None, use_errno=True).unshare(0x04000000) != 0:\n"
    "    raise OSError(ctypes.get_errno(), 'unshare(CLONE_NEWUTS) failed')\n"
    "socket.sethostname(sys.argv[1])\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def hosts_unavailable_reason() -> str | None:
    """Why :class:`TestHosts` cannot be made here (not root, no ``ip``...), or None."""
    return unavailable_reason()


def requires_test_hosts() -> pytest.MarkDecorator:
    """A pytest mark that skips the test, with the reason, where test hosts cannot be made."""
    import pytest

    reason = unavailable_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


@dataclass(frozen=True)
class HostFault:
    """One fault a :class:`TestHosts` injected, and when."""

    kind: FaultName
    host: str
    time_s: float
    """``time.time()`` when the fault began (the link went down, the first signal left)."""
    monotonic_s: float
    """``time.monotonic()`` at the same moment (one clock for every process here)."""
    pids: tuple[int, ...] = ()
    """The processes signalled."""


@dataclass(eq=False)
class TestHost:
    """One host of a :class:`TestHosts`: a namespace, an address, a name, its processes."""

    __test__ = False  # a helper, not a pytest test class

    index: int
    name: str
    """Its host name, resolvable on every host (``h0``, ``h1``...)."""
    address: str
    """Its IPv4 address on the test subnet."""
    netns: str
    """Its network namespace (``ip netns exec NETNS ...``)."""
    link: str
    """Its link's end on the bridge (what :meth:`TestHosts.partition` takes down)."""
    processes: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    """``(role, process)`` of everything :meth:`run` started, in order."""
    powered: bool = True
    linked: bool = True
    frozen: bool = False

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        inherit_env: bool = True,
        role: str = "process",
        cwd: str | os.PathLike[str] | None = None,
        stdin: int | IO[Any] | None = subprocess.DEVNULL,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host; ``env`` is added to this process's environment.

        ``inherit_env=False`` gives the process exactly ``env``. ``role="agent"`` marks
        what :meth:`TestHosts.kill_agent` kills. The process starts in a session of its
        own, so a Ctrl-C of the test reaches it only through the cleanup.
        """
        if not argv:
            raise ValueError(f"{self.name}.run: argv is empty; pass the command to run")
        if not self.powered:
            raise ValueError(f"{self.name}.run: the host is powered off; use another host")
        if self.frozen:
            raise ValueError(f"{self.name}.run: the host is frozen; thaw it first")
        full_env = dict(os.environ) if inherit_env else {}
        full_env.update(env or {})
        proc = subprocess.Popen(
            self.command(argv),
            env=full_env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        self.processes.append((role, proc))
        return proc

    def command(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on this host, for code that starts its own
        processes (they are this host's too: faults and cleanup find them by namespace)."""
        enter = [sys.executable, "-I", "-S", "-c", _ENTER, self.name]
        return [ip_path(), "netns", "exec", self.netns, *enter, *argv]

    def pids(self) -> list[int]:
        """Every process now running on this host (its namespace), started here or not."""
        inode = netns_inode(self.netns)
        return [] if inode is None else pids_in(inode)

    @property
    def state(self) -> str:
        """``"off"``, ``"frozen"``, ``"partitioned"``, ``"frozen+partitioned"`` or ``"up"``."""
        if not self.powered:
            return "off"
        parts = [p for p, on in (("frozen", self.frozen), ("partitioned", not self.linked)) if on]
        return "+".join(parts) or "up"


class TestHosts:
    """``count`` hosts on one bridge, and their faults (see the module docstring).

    Args:
        count: hosts to make (1 to 99), named ``h0``.. ``h<count-1>``.
    """

    __test__ = False  # a helper, not a pytest test class

    def __init__(self, count: int) -> None:
        if not 1 <= count < _MAX_HOSTS:
            raise ValueError(f"TestHosts: count={count}; pass 1 to {_MAX_HOSTS - 1} hosts")
        reason = unavailable_reason()
        if reason is not None:
            raise HostNetworkError(f"TestHosts cannot be made here: {reason}")
        self.removed_leftovers = remove_leftovers()
        """Names of what earlier, crashed owners left behind and this one removed."""
        self.hosts: list[TestHost] = []
        self.faults: list[HostFault] = []
        self.gateway = ""
        """This machine's own address on the test subnet (the bridge's), known to every
        host as :data:`GATEWAY_NAME`: the test process stays outside every host and
        reaches a host's server from this address."""
        self._serial = take_serial(self)
        self._bridge = resource_name(os.getpid(), self._serial, "b")
        self._planned: list[str] = []  # every name made or about to be, for the cleanup
        self._closed = False
        try:
            self._build(count)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ set-up

    def _build(self, count: int) -> None:
        pid = os.getpid()
        names = [f"h{i}" for i in range(count)]
        nets = [resource_name(pid, self._serial, "h", i) for i in range(count)]
        links = [resource_name(pid, self._serial, "v", i) for i in range(count)]
        self._planned = [self._bridge, *links, *nets]
        with pick_subnet() as subnet:
            first = subnet.network_address
            self.gateway = str(first + 1)
            addresses = [str(first + 10 + i) for i in range(count)]
            # Every host resolves every host's name (and the gateway's) from its own
            # /etc/hosts; the test network has no DNS server, so any other lookup is
            # refused at once rather than timing out (a TCPStore server looks up each
            # client's address on its event loop).
            table = [*zip(addresses, names, strict=True), (self.gateway, GATEWAY_NAME)]
            hosts_file = "127.0.0.1 localhost\n::1 localhost\n"
            hosts_file += "".join(f"{a} {n}\n" for a, n in table)
            for net in nets:
                (ETC_NETNS / net).mkdir(parents=True, exist_ok=True)
                (ETC_NETNS / net / "hosts").write_text(hosts_file)
                (ETC_NETNS / net / "resolv.conf").write_text(_RESOLV_CONF)
            commands = [
                f"link add {self._bridge} type bridge",
                f"addr add {self.gateway}/{subnet.prefixlen} dev {self._bridge}",
                f"link set {self._bridge} up",
            ]
            for net, link in zip(nets, links, strict=True):
                commands += [
                    f"netns add {net}",
                    f"link add {link} type veth peer name eth0 netns {net}",
                    f"link set {link} master {self._bridge} up",
                ]
            ip_batch(commands)
        for i, (name, net, link, addr) in enumerate(
            zip(names, nets, links, addresses, strict=True)
        ):
            inside = [f"addr add {addr}/{subnet.prefixlen} dev eth0", "link set eth0 up"]
            ip_batch([*inside, "link set lo up"], netns=net)
            self.hosts.append(TestHost(index=i, name=name, address=addr, netns=net, link=link))

    # ------------------------------------------------------------------ access

    def __getitem__(self, index: int) -> TestHost:
        return self.hosts[index]

    def __iter__(self) -> Iterator[TestHost]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> TestHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _host(self, host: TestHost | int, fault: str) -> TestHost:
        found = self.hosts[host] if isinstance(host, int) else host
        if found not in self.hosts:
            raise ValueError(f"TestHosts.{fault}: {found.name} is not a host of this TestHosts")
        if self._closed:
            raise ValueError(f"TestHosts.{fault}: the hosts are closed; make new ones")
        if not found.powered:
            raise ValueError(f"TestHosts.{fault}: {found.name} is powered off already")
        return found

    def _record(
        self, kind: FaultName, host: TestHost, wall: float, mono: float, pids: list[int]
    ) -> HostFault:
        fault = HostFault(kind, host.name, wall, mono, tuple(pids))
        self.faults.append(fault)
        return fault

    # ------------------------------------------------------------------ faults

    def power_off(self, host: TestHost | int) -> HostFault:
        """The host loses power: its link goes down, then every process of it is SIGKILLed.

        The link goes first, so what the dying processes' sockets send (FIN, RST) never
        leaves the host: peers get silence. The host stays off.
        """
        h = self._host(host, "power_off")
        wall, mono = time.time(), time.monotonic()
        ip("link", "set", h.link, "down")
        h.linked = False
        pids = self._kill_host(h)
        h.powered = False
        h.frozen = False
        return self._record("power_off", h, wall, mono, pids)

    def freeze(self, host: TestHost | int) -> HostFault:
        """Every process of the host is SIGSTOPped (sockets stay open, nothing answers)."""
        h = self._host(host, "freeze")
        wall, mono = time.time(), time.monotonic()
        inode = netns_inode(h.netns)
        pids = [] if inode is None else stop_all(inode)
        h.frozen = True
        return self._record("freeze", h, wall, mono, pids)

    def thaw(self, host: TestHost | int) -> HostFault:
        """SIGCONT to every process of a frozen host."""
        h = self._host(host, "thaw")
        if not h.frozen:
            raise ValueError(f"TestHosts.thaw: {h.name} is not frozen (state {h.state})")
        wall, mono = time.time(), time.monotonic()
        pids = h.pids()
        for pid in pids:
            send_signal(pid, signal.SIGCONT)
        h.frozen = False
        return self._record("thaw", h, wall, mono, pids)

    def partition(self, host: TestHost | int) -> HostFault:
        """The host's link goes down while its processes run on: silence both ways."""
        h = self._host(host, "partition")
        if not h.linked:
            raise ValueError(f"TestHosts.partition: {h.name} is partitioned already")
        wall, mono = time.time(), time.monotonic()
        ip("link", "set", h.link, "down")
        h.linked = False
        return self._record("partition", h, wall, mono, [])

    def reconnect(self, host: TestHost | int) -> HostFault:
        """A partitioned host's link comes back up (TCP retransmits what was held)."""
        h = self._host(host, "reconnect")
        if h.linked:
            raise ValueError(f"TestHosts.reconnect: {h.name} is not partitioned")
        wall, mono = time.time(), time.monotonic()
        ip("link", "set", h.link, "up")
        h.linked = True
        return self._record("reconnect", h, wall, mono, [])

    def kill_agent(self, host: TestHost | int) -> HostFault:
        """SIGKILL the host's live processes started with ``role="agent"`` (not their children)."""
        h = self._host(host, "kill_agent")
        agents = [p for role, p in h.processes if role == "agent" and p.poll() is None]
        if not agents:
            raise ValueError(
                f"TestHosts.kill_agent: {h.name} runs no agent; start one with "
                "run(..., role='agent')"
            )
        wall, mono = time.time(), time.monotonic()
        for proc in agents:
            send_signal(proc.pid, signal.SIGKILL)
        for proc in agents:
            _reap(proc)
        return self._record("kill_agent", h, wall, mono, [p.pid for p in agents])

    def _kill_host(self, h: TestHost) -> list[int]:
        inode = netns_inode(h.netns)
        pids = [] if inode is None else pids_in(inode)
        for _, proc in h.processes:
            send_signal(proc.pid, signal.SIGKILL)  # also one still entering the namespace
        if inode is not None:
            left = kill_all(inode)
            if left:
                raise HostNetworkError(
                    f"processes {left} of host {h.name} survived SIGKILL for 10 s (state D?)"
                )
        for _, proc in h.processes:
            _reap(proc)
        return pids

    # ------------------------------------------------------------------ cleanup

    def close(self) -> None:
        """Kill every process of every host, remove everything made; idempotent, bounded.

        The pipes of the processes :meth:`TestHost.run` started are closed too.

        Each step tolerates what an interrupted earlier call already removed, so a
        signal arriving during a close may run it again from the top.
        """
        for h in self.hosts:
            inode = netns_inode(h.netns)
            for _, proc in h.processes:
                send_signal(proc.pid, signal.SIGKILL)
            if inode is not None:
                kill_all(inode)
            for _, proc in h.processes:
                _reap(proc)
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
        planned = self._planned
        commands = [f"netns del {n}" for n in planned if resource_kind(n) == "h"]
        commands += [f"link del {n}" for n in planned if resource_kind(n) == "v"]
        commands += [f"link del {self._bridge}"]
        if planned:
            ip_batch(commands, force=True)
        for n in planned:
            if resource_kind(n) == "h":
                shutil.rmtree(ETC_NETNS / n, ignore_errors=True)
        self._closed = True
        release_serial(self)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(_REAP_TIMEOUT.total_seconds())
    except subprocess.TimeoutExpired:
        pass  # in uninterruptible sleep: the kernel reaps it later, we do not wait forever
