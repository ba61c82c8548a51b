"""The agent: exits classified, crashes replaced, bugs reported once, stores cleaned up."""

from __future__ import annotations

import socket
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from torchnext.distributed import run_cli
from torchnext.distributed.agent_store import await_goodbyes, say_goodbye
from torchnext.distributed.launcher import (
    EVICTED_KEY_PREFIX,
    Agent,
    AgentConfig,
    AgentEvent,
    connect_store,
    host_store,
)
from torchnext.errors import StoreUnreachableError


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run(script: str, config: AgentConfig) -> tuple[int, list[AgentEvent], Agent]:
    events: list[AgentEvent] = []
    with Agent([script], config, on_event=events.append) as agent:
        rc = agent.run(poll_interval=timedelta(milliseconds=20))
    return rc, events, agent


def test_clean_run_reports_each_exit(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os
        assert os.environ["TORCHNEXT_WORLD_SIZE"] == "3"
        assert os.environ["TORCHNEXT_STORE_ADDR"].startswith("127.0.0.1:")
        assert os.environ["TORCHNEXT_JOIN"] == "0"
        """,
    )
    rc, events, agent = _run(script, AgentConfig(nproc=3, max_restarts=0))
    assert rc == 0
    assert sorted(e.member_id for e in agent.exits) == ["n0w0", "n0w1", "n0w2"]
    assert all(e.kind == "finished" for e in agent.exits)
    assert sum(e.kind == "started" for e in events) == 3


def test_crash_is_replaced_by_a_joiner(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os, signal, time
        me = os.environ["TORCHNEXT_MEMBER_ID"]
        if me == "n0w1":
            os.kill(os.getpid(), signal.SIGKILL)
        if me.endswith(".r1"):
            assert os.environ["TORCHNEXT_JOIN"] == "1"
        if me == "n0w0":
            time.sleep(1.5)  # still training when n0w1 dies: the agent replaces it
        """,
    )
    rc, events, agent = _run(script, AgentConfig(nproc=2, max_restarts=2))
    assert rc == 0
    kinds = {e.member_id: e.kind for e in agent.exits}
    assert kinds == {"n0w0": "finished", "n0w1": "crashed", "n0w1.r1": "finished"}
    assert any("killed by SIGKILL" in e.message for e in events)
    assert agent.restarts == 1


def test_restart_budget_is_respected(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os, signal, time
        if os.environ["TORCHNEXT_MEMBER_ID"] != "n0w0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3)  # outlives the replacements' start-ups
        """,
    )
    rc, events, agent = _run(script, AgentConfig(nproc=2, max_restarts=2))
    assert agent.restarts == 2
    assert [e.kind for e in events].count("gave_up") == 1
    assert rc == 0  # n0w0 finished; the job went on without the lost slot


def test_bug_is_reported_with_traceback_and_not_restarted(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os, time
        if os.environ["TORCHNEXT_MEMBER_ID"] == "n0w1":
            raise ZeroDivisionError("the bug in the user's script")
        time.sleep(30)
        """,
    )
    rc, events, agent = _run(
        script, AgentConfig(nproc=2, max_restarts=5, term_grace=timedelta(seconds=2))
    )
    assert rc == 1
    assert agent.restarts == 0
    raised = [e for e in agent.exits if e.kind == "raised"]
    assert len(raised) == 1 and "ZeroDivisionError: the bug" in raised[0].traceback
    assert any("Traceback" in e.message for e in events)
    # The other worker was stopped rather than left sleeping.
    assert {e.member_id for e in agent.exits} == {"n0w0", "n0w1"}


def test_bug_in_the_first_slot_stops_the_job_without_an_agent_error(tmp_path: Path) -> None:
    # Stopping the job while poll() walks the workers must not trip over the ones
    # that shutdown() already reaped (it raised KeyError).
    script = _script(
        tmp_path,
        """
        import os, time
        if os.environ["TORCHNEXT_MEMBER_ID"] == "n0w0":
            raise ZeroDivisionError("the bug in slot 0")
        time.sleep(30)
        """,
    )
    rc, events, agent = _run(
        script, AgentConfig(nproc=3, max_restarts=5, term_grace=timedelta(seconds=2))
    )
    assert rc == 1
    kinds = {e.member_id: e.kind for e in agent.exits}
    assert kinds == {"n0w0": "raised", "n0w1": "terminated", "n0w2": "terminated"}
    assert sum("Traceback" in e.message for e in events) == 1


def test_evicted_worker_is_killed_and_replaced(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os, time
        from datetime import timedelta
        from torchnext.distributed.launcher import connect_store, EVICTED_KEY_PREFIX
        me = os.environ["TORCHNEXT_MEMBER_ID"]
        store = connect_store(os.environ["TORCHNEXT_STORE_ADDR"], timedelta(seconds=60))
        if me == "n0w1":
            store.set(EVICTED_KEY_PREFIX + me, "1")
            time.sleep(60)  # hung: only the agent's SIGKILL ends this
        if me == "n0w1.r1":
            store.set("replaced", "1")
        if me == "n0w0":
            store.wait(["replaced"])  # finish only once the replacement runs
        """,
    )
    config = AgentConfig(nproc=2, max_restarts=1, evict_grace=timedelta(milliseconds=500))
    rc, events, agent = _run(script, config)
    assert rc == 0
    kinds = {e.member_id: e.kind for e in agent.exits}
    # Killed after the grace it had to leave by itself: an eviction, not a crash.
    assert kinds["n0w1"] == "evicted" and kinds["n0w1.r1"] == "finished"
    assert any("did not exit within 0:00:00.500000; killing it" in e.message for e in events)


def test_store_port_in_use_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path, "pass\n")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        parser = __import__("argparse").ArgumentParser()
        run_cli.add_arguments(parser)
        args = parser.parse_args(["--nproc", "1", "--store-port", str(port), script])
        assert run_cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "already in use" in err and "--store-port" in err


def _listening_families(port: int) -> set[str]:
    found = set()
    for family, table in (("ipv4", "/proc/net/tcp"), ("ipv6", "/proc/net/tcp6")):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # LISTEN
                    found.add(family)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net")
def test_store_listens_ipv4_only_so_peers_resolve_without_dns() -> None:
    # A dual-stack listener sees clients as ::ffff:127.0.0.1, whose reverse lookup on
    # the store's event loop goes to DNS; an IPv4 listener sees 127.0.0.1 (/etc/hosts).
    store = host_store("127.0.0.1", 0, timedelta(seconds=5))
    assert _listening_families(store.port) == {"ipv4"}
    client = connect_store(f"127.0.0.1:{store.port}", timedelta(seconds=5))
    client.set("k", "v")
    assert store.get("k") == b"v"


def test_unreachable_store_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(StoreUnreachableError, match=f"127.0.0.1:{port}"):
        connect_store(f"127.0.0.1:{port}", timedelta(seconds=1))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="nproc"):
        AgentConfig(nproc=0)
    with pytest.raises(ValueError, match="store_addr"):
        AgentConfig(nproc=1, store_addr="nohostport")
    assert EVICTED_KEY_PREFIX.endswith("/")
    assert sys.executable


def test_script_folder_is_on_sys_path_like_python_script(tmp_path: Path) -> None:
    (tmp_path / "helper_mod_for_agent.py").write_text("VALUE = 42\n")
    script = _script(
        tmp_path,
        """
        import helper_mod_for_agent
        assert helper_mod_for_agent.VALUE == 42
        assert __name__ == "__main__"
        """,
    )
    rc, _, agent = _run(script, AgentConfig(nproc=1, max_restarts=0))
    assert rc == 0, [e.traceback for e in agent.exits]


def test_two_agents_share_one_store_like_two_nodes(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import os
        assert os.environ["TORCHNEXT_WORLD_SIZE"] == "4"
        print("member", os.environ["TORCHNEXT_MEMBER_ID"], os.environ["TORCHNEXT_STORE_ADDR"])
        """,
    )
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    addr = f"127.0.0.1:{port}"
    node0 = Agent(
        [script],
        AgentConfig(nproc=2, world_size=4, node_rank=0, store_addr=addr),
        on_event=lambda e: None,
    )
    node1 = Agent(
        [script],
        AgentConfig(nproc=2, world_size=4, node_rank=1, store_addr=addr),
        on_event=lambda e: None,
    )
    with node0, node1:
        node0.start()
        node1.start()
        assert node0.run(poll_interval=timedelta(milliseconds=20)) == 0
        assert node1.run(poll_interval=timedelta(milliseconds=20)) == 0
    ids = sorted(e.member_id for e in node0.exits + node1.exits)
    assert ids == ["n0w0", "n0w1", "n1w0", "n1w1"]


def test_multi_node_cli_needs_a_store_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = __import__("argparse").ArgumentParser()
    run_cli.add_arguments(parser)
    args = parser.parse_args(["--nproc", "1", "--nnodes", "2", _script(tmp_path, "pass\n")])
    assert run_cli.main(args) == 2
    assert "--store-addr" in capsys.readouterr().err


def test_host_waits_for_goodbyes_or_silence() -> None:
    store = host_store("127.0.0.1", 0, timedelta(seconds=5))
    say_goodbye(store, 1)
    assert await_goodbyes(store, [1], silence=timedelta(seconds=30)) == []
    # Node 2 never says goodbye nor shows life: given up on after the silence bound.
    assert await_goodbyes(store, [1, 2], silence=timedelta(milliseconds=300)) == [2]
    with pytest.raises(ValueError, match="silence"):
        await_goodbyes(store, [1], silence=timedelta(seconds=-1))


def test_hosting_agent_keeps_the_store_until_the_other_agent_left(tmp_path: Path) -> None:
    script = _script(tmp_path, "pass\n")
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    addr = f"127.0.0.1:{port}"
    events0: list[AgentEvent] = []
    node0 = Agent(
        [script],
        AgentConfig(nproc=1, nnodes=2, node_rank=0, store_addr=addr),
        on_event=events0.append,
    )
    node1 = Agent(
        [script],
        AgentConfig(nproc=1, nnodes=2, node_rank=1, store_addr=addr),
        on_event=lambda e: None,
    )
    try:
        node0.start()
        node1.start()
        assert node0.run(poll_interval=timedelta(milliseconds=20)) == 0
        assert node1.run(poll_interval=timedelta(milliseconds=20)) == 0
        closing = threading.Thread(target=node0.close)
        closing.start()
        closing.join(timeout=1.0)
        assert closing.is_alive(), "node 0 closed the store while node 1 still held it"
        assert any(e.kind == "detach" and "[1]" in e.message for e in events0)
        node1.close()  # says goodbye: node 0 may close now
        closing.join(timeout=10)
        assert not closing.is_alive()
        assert node0.store is None and node1.store is None
    finally:
        node1.close()
        node0.close()


def test_agent_stops_using_a_store_that_went_away(tmp_path: Path) -> None:
    script = _script(tmp_path, "import time\ntime.sleep(30)\n")
    server = host_store("127.0.0.1", 0, timedelta(seconds=5))
    events: list[AgentEvent] = []
    config = AgentConfig(
        nproc=1,
        nnodes=2,
        node_rank=1,
        store_addr=f"127.0.0.1:{server.port}",
        term_grace=timedelta(seconds=1),
    )
    with Agent([script], config, on_event=events.append) as agent:
        agent.start()
        assert agent.poll()
        del server  # the hosting node is gone
        # The agent reads the store twice a second: poll (bounded) until it noticed, then
        # some more, and it still says so once.
        deadline = time.monotonic() + 10
        while not any("does not answer" in e.message for e in events):
            assert agent.poll() and time.monotonic() < deadline, [e.message for e in events]
            time.sleep(0.05)
        for _ in range(20):
            assert agent.poll()
            time.sleep(0.05)
    lost = [e for e in events if "does not answer" in e.message]
    assert len(lost) == 1 and config.store_addr in lost[0].message
