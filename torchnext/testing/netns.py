"""The machinery under the test hosts: ``ip``, the subnet, a namespace's processes, leftovers.

Use :mod:`torchnext.testing.hosts` (:class:`~torchnext.testing.hosts.TestHosts`); this
module holds what it is built from, each piece small enough to check by itself:

* :func:`unavailable_reason` says why test hosts cannot be made here (not root, no
  ``ip``, no network namespaces or bridges), or ``None``; the answer is cached.
* :func:`pick_subnet` picks a ``/24`` of the benchmarking range ``198.18.0.0/15``
  (RFC 2544: reserved for testing network gear, never routed) that no address or
  route of this machine overlaps, under a machine-wide lock so two concurrent
  harnesses never pick the same one.
* :func:`pids_in` lists every process of a network namespace by its namespace
  inode, which also finds the grandchildren a host's agent started (they are the
  host's processes as much as the agent is); :func:`kill_all` and :func:`stop_all`
  signal them until none is left running.
* Every name this harness gives a namespace, link or ``/etc/netns`` folder starts with
  :data:`PREFIX` and carries its owner's pid (:func:`resource_name`), so
  :func:`remove_leftovers` can find what a crashed owner left and remove it.
* :func:`take_serial` registers a live harness, whose ``close`` then also runs at the
  interpreter's exit and on SIGTERM or SIGHUP (:func:`close_all`).

What not to assume: the names carry the owner's pid, not its start time; a leftover
whose owner's pid was reused by a live process stays until that process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import cache
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from torchnext.errors import HostNetworkError

__all__ = [
    "PREFIX",
    "ETC_NETNS",
    "unavailable_reason",
    "ip",
    "ip_path",
    "ip_batch",
    "resource_name",
    "owner_of",
    "resource_kind",
    "pick_subnet",
    "netns_inode",
    "pids_in",
    "process_state",
    "send_signal",
    "kill_all",
    "stop_all",
    "remove_leftovers",
    "leftovers",
    "take_serial",
    "release_serial",
    "close_all",
]

PREFIX = "tnxh"
"""Start of every namespace, link and ``/etc/netns`` folder name the harness makes."""

ETC_NETNS = Path("/etc/netns")
"""``ip netns exec NS`` bind-mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts``."""

TEST_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
"""RFC 2544's benchmarking range: private, never routed, made for tests like these."""

_IP_TIMEOUT = timedelta(seconds=20)
_ROUTE_TYPES = {
    *("local", "broadcast", "unicast", "anycast", "multicast"),
    *("blackhole", "unreachable", "prohibit", "throw", "nat"),
}
_NAME = re.compile(rf"^{PREFIX}([0-9a-z]+)-([0-9a-z])([bhv])(\d*)$")
_DIGITS36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(value: int) -> str:
    out = ""
    while True:
        value, digit = divmod(value, 36)
        out = _DIGITS36[digit] + out
        if value == 0:
            return out


def resource_name(owner_pid: int, serial: int, kind: str, index: int | None = None) -> str:
    """``tnxh<pid36>-<serial36><kind><index>``: at most 15 characters, an interface name's limit.

    ``kind`` is ``b`` (bridge), ``v`` (a host's link on the bridge) or ``h`` (a host's
    namespace and ``/etc/netns`` folder).
    """
    if kind not in ("b", "h", "v"):
        raise ValueError(f"resource_name: kind={kind!r}; use 'b', 'h' or 'v'")
    if not 0 <= serial < 36:
        raise ValueError(f"resource_name: serial={serial}; use 0..35")
    if index is not None and not 0 <= index < 100:
        raise ValueError(f"resource_name: index={index}; use 0..99")
    return f"{PREFIX}{_base36(owner_pid)}-{_DIGITS36[serial]}{kind}{'' if index is None else index}"


def resource_kind(name: str) -> str:
    """``b``, ``h`` or ``v`` for a harness name (see :func:`resource_name`), else ``""``."""
    match = _NAME.match(name)
    return match.group(3) if match else ""


def owner_of(name: str) -> int | None:
    """The owner pid a harness name carries, or None for a name that is not one."""
    match = _NAME.match(name)
    return int(match.group(1), 36) if match else None


def ip_path() -> str:
    """Where ``ip`` is (an absolute path, so a process given a bare environment finds it)."""
    return shutil.which("ip") or "ip"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (bounded); with ``check``, a failure raises naming the command."""
    try:
        done = subprocess.run(
            [ip_path(), *args],
            capture_output=True,
            text=True,
            timeout=_IP_TIMEOUT.total_seconds(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostNetworkError(f"`ip {' '.join(args)}` could not run: {exc}") from None
    if check and done.returncode != 0:
        raise HostNetworkError(
            f"`ip {' '.join(args)}` failed (exit {done.returncode}): {done.stderr.strip()}"
        )
    return done


def ip_batch(
    commands: list[str], *, force: bool = False, netns: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run several ``ip`` commands in one process (in ``netns`` if given); ``force`` goes
    on past failures."""
    flags = (["-n", netns] if netns else []) + (["-force"] if force else [])
    try:
        done = subprocess.run(
            [ip_path(), *flags, "-batch", "-"],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=_IP_TIMEOUT.total_seconds(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostNetworkError(f"`ip -batch` could not run: {exc}") from None
    if not force and done.returncode != 0:
        raise HostNetworkError(
            f"`ip -batch` failed (exit {done.returncode}): {done.stderr.strip()}; "
            f"commands: {commands}"
        )
    return done


@cache
def unavailable_reason() -> str | None:
    """Why test hosts cannot be made on this machine, or None when they can (cached)."""
    if not hasattr(os, "geteuid") or not os.path.isdir("/proc"):
        return "test hosts need Linux (network namespaces and /proc)"
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, veth links, a bridge); run as root"
    if shutil.which("ip") is None:
        return "test hosts need the `ip` command (iproute2); install iproute2"
    probe = resource_name(os.getpid(), 35, "h", 99)
    try:
        ip("netns", "add", probe)
    except HostNetworkError as exc:
        return f"cannot make a network namespace here ({exc}); run as root with CAP_SYS_ADMIN"
    try:
        # Inside the probe namespace, so nothing shows in this machine's links meanwhile.
        done = ip("-n", probe, "link", "add", "b0", "type", "bridge", check=False)
        if done.returncode == 0:
            done = ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "v1", check=False)
    finally:
        ip("netns", "del", probe, check=False)
    if done.returncode != 0:
        return (
            f"cannot make bridges or veth links here: {done.stderr.strip()}; load the "
            "bridge and veth kernel modules"
        )
    return None


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    folder = "/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()
    with open(os.path.join(folder, "torchnext-test-hosts.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _used_networks() -> list[ipaddress.IPv4Network]:
    used: list[ipaddress.IPv4Network] = []
    for line in ip("-4", "-o", "addr", "show").stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            used.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    for line in ip("-4", "route", "show", "table", "all").stdout.splitlines():
        fields = line.split()
        dest = fields[1] if len(fields) > 1 and fields[0] in _ROUTE_TYPES else ""
        dest = dest or (fields[0] if fields else "")
        with contextlib.suppress(ValueError):
            net = ipaddress.IPv4Network(dest, strict=False)
            if net.prefixlen > 0:
                used.append(net)  # a default route (prefix 0) overlaps everything: skip it
    return used


@contextlib.contextmanager
def pick_subnet() -> Iterator[ipaddress.IPv4Network]:
    """A free ``/24`` of the test range, held under the machine lock while the block runs.

    Assign the subnet's address to the bridge inside the block: the next harness sees
    it as used from then on.
    """
    with _machine_lock():
        used = _used_networks()
        subnets: list[ipaddress.IPv4Network] = list(TEST_RANGE.subnets(new_prefix=24))
        start = os.getpid() % len(subnets)  # spread owners over the range
        for k in range(len(subnets)):
            subnet = subnets[(start + k) % len(subnets)]
            if not any(subnet.overlaps(u) for u in used):
                yield subnet
                return
    raise HostNetworkError(
        f"no free /24 left in {TEST_RANGE}: every one overlaps an address or route of this "
        "machine; remove stale test networks (`ip -4 route`) and retry"
    )


def netns_inode(name: str) -> int | None:
    """The inode of network namespace ``name`` (what ``/proc/PID/ns/net`` names), or None."""
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def pids_in(inode: int) -> list[int]:
    """Every process whose network namespace is ``inode`` (zombies have none and are left out)."""
    wanted = f"net:[{inode}]"
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/net") == wanted:
                found.append(int(entry))
        except OSError:
            continue  # gone meanwhile, or a zombie
    return found


def process_state(pid: int) -> str:
    """The state letter of ``/proc/PID/stat`` (``R``, ``S``, ``T``...), ``""`` when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def send_signal(pid: int, sig: signal.Signals) -> None:
    """``kill(pid, sig)``; a process already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def kill_all(inode: int, timeout: timedelta = timedelta(seconds=10)) -> list[int]:
    """SIGKILL every process of the namespace until none is left; returns those still there.

    Repeated, because a process may fork between the listing and the signal.
    """
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        pids = pids_in(inode)
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            send_signal(pid, signal.SIGKILL)
        time.sleep(0.005)


def stop_all(inode: int, timeout: timedelta = timedelta(seconds=10)) -> list[int]:
    """SIGSTOP every process of the namespace until all are stopped; returns the stopped."""
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        pids = pids_in(inode)
        running = [p for p in pids if process_state(p) not in ("T", "t", "")]
        if not running:
            return pids
        if time.monotonic() > deadline:
            raise HostNetworkError(
                f"could not stop processes {running} of namespace inode {inode} within "
                f"{timeout}; they may be in uninterruptible sleep (state D)"
            )
        for pid in running:
            send_signal(pid, signal.SIGSTOP)
        time.sleep(0.005)


def leftovers(owner_pid: int | None = None) -> list[str]:
    """Harness namespaces, links and ``/etc/netns`` folders (of ``owner_pid``, or of anyone)."""
    names: list[str] = []
    names += [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line]
    for line in ip("-o", "link", "show").stdout.splitlines():
        fields = line.split(":", 2)
        if len(fields) > 1:
            names.append(fields[1].strip().split("@", 1)[0])
    if ETC_NETNS.is_dir():
        names += [p.name for p in ETC_NETNS.iterdir()]
    mine = {n for n in names if owner_of(n) is not None}
    if owner_pid is not None:
        mine = {n for n in mine if owner_of(n) == owner_pid}
    return sorted(mine)


def _alive(pid: int) -> bool:
    return process_state(pid) not in ("", "Z", "X")


def remove_leftovers() -> list[str]:
    """Remove what harnesses whose owner process is gone left behind; returns the names.

    Processes still running in such a namespace are killed first (a namespace lives
    as long as one of its processes does, whatever ``ip netns del`` says).
    """
    removed: list[str] = []
    for name in leftovers():
        owner = owner_of(name)
        if owner is None or owner == os.getpid() or _alive(owner):
            continue
        inode = netns_inode(name)
        if inode is not None:
            kill_all(inode)
        if resource_kind(name) == "h":
            ip("netns", "del", name, check=False)
            shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
        else:
            ip("link", "del", name, check=False)
        removed.append(name)
    return removed


# ---------------------------------------------------------------------- process-wide cleanup


class Closable(Protocol):
    def close(self) -> None: ...


_LIVE: dict[int, Closable] = {}
"""Serial (0..34; 35 is the probe's) -> the live harness of this process that holds it."""
_PREVIOUS: dict[int, Any] = {}
_INSTALLED = False


def take_serial(owner: Closable) -> int:
    """A serial for ``owner``'s names; from now on ``owner.close()`` also runs at exit and
    on SIGTERM or SIGHUP (handlers installed once, from the main thread only)."""
    global _INSTALLED
    free = [s for s in range(35) if s not in _LIVE]
    if not free:
        raise HostNetworkError(
            "TestHosts: 35 are open in this process already; close some before making more"
        )
    _LIVE[free[0]] = owner
    if not _INSTALLED:
        _INSTALLED = True
        atexit.register(close_all)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                previous = signal.getsignal(sig)
                if previous is signal.SIG_IGN:
                    continue  # the process chose to ignore it: so do we
                _PREVIOUS[sig] = previous
                signal.signal(sig, _on_signal)
    return free[0]


def release_serial(owner: Closable) -> None:
    """``owner`` is closed: forget it (its serial may be taken again)."""
    for serial, live in list(_LIVE.items()):
        if live is owner:
            del _LIVE[serial]


def close_all() -> None:
    """Close every live harness of this process (at exit, on a signal)."""
    for owner in list(_LIVE.values()):
        try:
            owner.close()
        except Exception:  # noqa: BLE001 - clean up the others regardless
            pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Python runs this in the main thread between bytecodes, so the cleanup may run
    # subprocesses; a close it interrupted is idempotent and simply runs again. Then
    # the signal does what it did before: the earlier handler, or the default (exit).
    close_all()
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
