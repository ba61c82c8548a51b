"""One job of ``torchnext bench ft-hosts``: its test hosts, its store, its agents, its records.

A :class:`Job` is a fault-tolerant training job on test hosts of its own
(:class:`~torchnext.testing.TestHosts`: network namespaces on a bridge, real TCP between
them): one ``torchnext run`` agent per host, ``nproc`` workers each
(``_ft_hosts_worker.py``), and the job's store: the TCP store hosted by ``h0``'s agent
(``--store-addr h0:29600``), or a 3-member etcd cluster on ``h1``, ``h2`` and ``h3``
(``--store etcd://h1:2379,h2:2379,h3:2379/JOB``), both with the command lines the README
shows. A job starts *parked*: its workers import torch and build the model, then wait
for the job's go file; :meth:`Job.go` starts training. The benchmark parks the next
jobs while it waits for a lost one, so no measurement shares the machine with
interpreter start-ups.

What the workers did comes from :class:`Records`, their JSON lines on the shared file
system, never from the store (which a fault may take away).

What not to assume: a job's hosts exist only inside it (each has its own bridge and
subnet), and :meth:`Job.close` removes them with every process on them.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from torchnext.testing import TestHosts
from torchnext.testing.etcd import EtcdCluster

__all__ = ["BenchTimeout", "Job", "JobSpec", "Records", "node_of", "process_gone", "wait_until"]

WORKER = Path(__file__).resolve().with_name("_ft_hosts_worker.py")
STORE_PORT = 29600
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ETCD_HOSTS = (1, 2, 3)
"""The hosts that run an etcd member (``h1``..``h3``); ``h0`` runs workers only."""

_MEMBER = re.compile(r"^n(\d+)w\d+")
_READ_SLACK_S = 5.0


class BenchTimeout(TimeoutError):
    """A bounded wait of the benchmark ran out (the message says what it waited for)."""


def wait_until(
    done: Callable[[], bool], timeout: timedelta, what: str, *, poll_s: float = 0.02
) -> float:
    """Poll ``done`` until true; returns ``time.time()`` then. Raises :class:`BenchTimeout`."""
    deadline = time.monotonic() + timeout.total_seconds()
    while not done():
        if time.monotonic() > deadline:
            raise BenchTimeout(f"ft-hosts: {what} did not happen within {timeout}")
        time.sleep(poll_s)
    return time.time()


def node_of(member: str) -> int:
    """The node (= host index) of a member id ``n<node>w<slot>[.r<k>]``."""
    found = _MEMBER.match(member)
    if found is None:
        raise ValueError(f"member id {member!r} is not n<node>w<slot>; the agent names them so")
    return int(found.group(1))


@dataclass(frozen=True)
class JobSpec:
    """What to start: ``hosts`` hosts of ``nproc`` workers on a ``store`` of this kind."""

    name: str
    store: Literal["tcp", "etcd"]
    nproc: int = 2
    hosts: int = 4
    restarts: dict[int, int] = field(default_factory=dict)
    """``--max-restarts`` per host index (0 where not given: a fenced worker is not
    replaced, so no cold start lands inside a later measurement)."""
    pace_ms: float = 40.0

    @property
    def workers(self) -> int:
        return self.nproc * self.hosts


class Records:
    """Incremental reader of the workers' JSON lines (``<member>.jsonl`` in a folder)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.by_kind: dict[str, list[dict[str, Any]]] = {}
        """Every record read so far, by kind, in the order read (about time order)."""
        self._offsets: dict[Path, int] = {}

    def poll(self) -> None:
        """Read what was appended since the last call."""
        for path in sorted(self.folder.glob("*.jsonl")):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(start)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # a line still being written is read next time
            for line in chunk[:end].splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line torn by SIGKILL
                self.by_kind.setdefault(record["kind"], []).append(record)
            self._offsets[path] = start + end

    def select(self, kind: str, *, since: float = 0.0, event: str = "") -> list[dict[str, Any]]:
        """Records of ``kind`` (and manager ``event``) written at or after ``since``.

        Only the tail is scanned: records are read within a poll of being written, so
        one older than ``since`` by more than :data:`_READ_SLACK_S` ends the scan.
        """
        self.poll()
        out = []
        for r in reversed(self.by_kind.get(kind, [])):
            if r["t"] < since - _READ_SLACK_S:
                break
            if r["t"] >= since and (not event or r.get("event") == event):
                out.append(r)
        out.reverse()
        return out


class Job:
    """A parked job on its own test hosts (see the module docstring)."""

    def __init__(self, spec: JobSpec, root: Path) -> None:
        self.spec = spec
        self.dir = root / spec.name
        self.records_dir = self.dir / "records"
        self.records_dir.mkdir(parents=True)
        self.go_file = self.dir / "go"
        self.records = Records(self.records_dir)
        self.etcd: EtcdCluster | None = None
        self.go_time = 0.0
        self.hosts = TestHosts(spec.hosts)
        self._outputs: list[Any] = []
        try:
            if spec.store == "etcd":
                self._start_etcd()
            for host in self.hosts:
                self._start_agent(host.index)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start

    @property
    def store_url(self) -> str:
        """The store as every agent is given it (host names, as a cluster's DNS gives them)."""
        if self.spec.store == "tcp":
            return f"h0:{STORE_PORT}"
        members = ",".join(f"h{i}:{ETCD_CLIENT_PORT}" for i in ETCD_HOSTS)
        return f"etcd://{members}/{self.spec.name}"

    @property
    def gateway_store_url(self) -> str:
        """The same store as this process (outside every host) reaches it, by address."""
        if self.spec.store == "tcp":
            return f"{self.hosts[0].address}:{STORE_PORT}"
        members = ",".join(f"{self.hosts[i].address}:{ETCD_CLIENT_PORT}" for i in ETCD_HOSTS)
        return f"etcd://{members}/{self.spec.name}"

    def _start_etcd(self) -> None:
        if self.spec.hosts <= max(ETCD_HOSTS):
            raise ValueError(
                f"JobSpec(hosts={self.spec.hosts}) with an etcd store: the members run on "
                f"hosts {list(ETCD_HOSTS)}; give at least {max(ETCD_HOSTS) + 1} hosts"
            )
        on = [self.hosts[i] for i in ETCD_HOSTS]
        self.etcd = EtcdCluster(
            len(on),
            hosts=[h.address for h in on],
            client_port=ETCD_CLIENT_PORT,
            peer_port=ETCD_PEER_PORT,
            wrap=lambda i, argv: on[i].command(argv),
        )
        self.etcd.start()

    def _start_agent(self, index: int) -> None:
        spec = self.spec
        store = (
            [f"--store-addr={self.store_url}", "--store-host=0.0.0.0"]
            if spec.store == "tcp"
            else [f"--store={self.store_url}"]
        )
        argv = [
            sys.executable,
            "-m",
            "torchnext",
            "run",
            f"--nproc={spec.nproc}",
            f"--nnodes={spec.hosts}",
            f"--node-rank={index}",
            *store,
            f"--max-restarts={spec.restarts.get(index, 0)}",
            f"--log-dir={self.dir / 'logs'}",
            f"--events={self.dir / f'events-h{index}.jsonl'}",
            str(WORKER),
            f"--records={self.records_dir}",
            f"--wait-for={self.go_file}",
            f"--pace-ms={spec.pace_ms}",
        ]
        out = open(self.dir / f"agent-h{index}.txt", "wb")  # noqa: SIM115 - closed in close()
        self._outputs.append(out)
        self.hosts[index].run(argv, role="agent", stdout=out, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        """Every worker has built its model and waits for the go file."""
        return len({r["member"] for r in self.records.select("ready")}) >= self.spec.workers

    def wait_ready(self, timeout: timedelta) -> None:
        try:
            wait_until(self.ready, timeout, f"{self.spec.name}: every worker ready", poll_s=0.2)
        except BenchTimeout as exc:
            raise BenchTimeout(f"{exc}\n{self.log_tail()}") from None

    def go(self, timeout: timedelta) -> None:
        """Start training; returns once every worker committed a step."""
        self.go_file.write_text("go\n")
        self.go_time = time.time()

        def all_stepped() -> bool:
            return len({r["member"] for r in self.records.select("step")}) >= self.spec.workers

        try:
            wait_until(all_stepped, timeout, f"{self.spec.name}: a first step on every worker")
        except BenchTimeout as exc:
            raise BenchTimeout(f"{exc}\n{self.log_tail()}") from None

    # ------------------------------------------------------------------ queries

    def pids(self, host: int) -> list[int]:
        """The worker processes started on ``host`` (from their ``ready`` records)."""
        return [int(r["pid"]) for r in self.records.select("ready") if node_of(r["member"]) == host]

    def store_pids(self) -> list[int]:
        """The processes that serve the store: h0's agent, or the etcd members."""
        if self.etcd is not None:
            return [m.proc.pid for m in self.etcd.members if m.proc is not None]
        agents = [p.pid for role, p in self.hosts[0].processes if role == "agent"]
        return agents[:1]

    def etcd_leader_host(self) -> int:
        """The host index of the etcd member that is the cluster's leader now."""
        for i in ETCD_HOSTS:
            conn = http.client.HTTPConnection(self.hosts[i].address, ETCD_CLIENT_PORT, timeout=2)
            try:
                conn.request("POST", "/v3/maintenance/status", body="{}")
                status = json.loads(conn.getresponse().read())
            except (OSError, http.client.HTTPException, ValueError):
                continue
            finally:
                conn.close()
            if status.get("leader") == status.get("header", {}).get("member_id"):
                return i
        raise BenchTimeout(f"{self.spec.name}: no etcd member says it is the leader")

    def log_tail(self, chars: int = 1500) -> str:
        """The end of every agent's and worker's output, to show with a failure."""
        parts = []
        for path in sorted(self.dir.glob("agent-h*.txt")) + sorted(self.dir.glob("logs/*.log")):
            try:
                text = path.read_text(errors="replace")[-chars:]
            except OSError:
                continue
            parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ end

    def close(self) -> None:
        """Kill every process of every host and remove the hosts; idempotent."""
        self.hosts.close()
        if self.etcd is not None:
            self.etcd.stop()
        for out in self._outputs:
            out.close()
        self._outputs.clear()


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts: it runs no code any more)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")
