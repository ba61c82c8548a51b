"""``torchnext run`` as users run it: a script's bug reported once; two agents end cleanly."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torchnext

PACKAGE_DIR = str(Path(torchnext.__file__).resolve().parent)
CPP_NOISE = (
    "recvValue failed",
    "Broken pipe",
    "Exception raised from",
    "frame #",
    "terminate called",
    "SIGABRT",
)


def _torchnext_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "torchnext", "run", *args]


def _write(path: Path, body: str) -> str:
    path.write_text(textwrap.dedent(body))
    return str(path)


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


BUGGY = """
import os, time

def helper(x):
    return x / 0

raisers = os.environ["RAISERS"].split(",")
if os.environ["TORCHNEXT_MEMBER_ID"] in raisers:
    # The raisers meet first (bounded), so a slow start cannot let the agent stop one of
    # them before it raised.
    here = os.path.dirname(os.path.abspath(__file__))
    open(os.path.join(here, os.environ["TORCHNEXT_MEMBER_ID"] + ".ready"), "w").close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(here, r + ".ready")) for r in raisers):
            break
        time.sleep(0.01)
    helper(1)
time.sleep(60)  # a worker that does not raise is stopped by the agent
"""


def _run_buggy(tmp_path: Path, raisers: str) -> tuple[int, str, str]:
    script = _write(tmp_path / "train_step.py", BUGGY)
    proc = subprocess.run(
        _torchnext_run("--nproc", "2", script),
        env={**os.environ, "RAISERS": raisers},
        capture_output=True,
        text=True,
        timeout=90,
    )
    return proc.returncode, proc.stdout + proc.stderr, script


def _check_one_user_traceback(out: str, script: str) -> None:
    assert "KeyError" not in out, out
    assert out.count("Traceback (most recent call last):") == 1, out
    assert out.count("ZeroDivisionError: division by zero") == 1, out
    lines = out.splitlines()
    start = lines.index("Traceback (most recent call last):")
    frames = [ln for ln in lines[start:] if ln.startswith('  File "')]
    assert frames and frames[0].startswith(f'  File "{script}", line '), frames
    assert frames[-1].endswith(", in helper"), frames
    assert not [f for f in frames if PACKAGE_DIR in f or "runpy" in f], frames


def test_raising_worker_ends_the_run_with_its_traceback_once(tmp_path: Path) -> None:
    # n0w0 raises: the agent stops n0w1 while it still walks its workers.
    rc, out, script = _run_buggy(tmp_path, "n0w0")
    assert rc == 1, out
    _check_one_user_traceback(out, script)
    assert re.search(r"worker n0w0 \(pid \d+\) raised an exception", out), out
    assert re.search(r"worker n0w1 \(pid \d+\) was stopped by the agent", out), out


def test_same_bug_in_every_worker_is_printed_once(tmp_path: Path) -> None:
    rc, out, script = _run_buggy(tmp_path, "n0w0,n0w1")
    assert rc == 1, out
    _check_one_user_traceback(out, script)
    assert len(re.findall(r"raised an exception \(a bug; not restarted\)", out)) == 2, out


ALL_REDUCE = """
import os, time
import torch
from torchnext.distributed import FaultTolerantGroup

group = FaultTolerantGroup.from_env()
t = torch.ones(4)
for _ in range(3):
    group.all_reduce(t)
if t[0].item() != 64.0:
    raise RuntimeError(f"all_reduce of 4 members gave {t[0].item()}, expected 64")
if os.environ["TORCHNEXT_MEMBER_ID"].startswith("n1"):
    # Outlive node 0's agent if it leaves first, as a slower node does: wait (bounded)
    # for it to exit, then keep running a moment while this node still uses the store.
    host = int(os.environ["TEST_HOST_AGENT_PID"])
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        try:
            os.kill(host, 0)
        except ProcessLookupError:
            time.sleep(0.5)
            break
        time.sleep(0.05)
os.write(1, f"done {os.environ['TORCHNEXT_MEMBER_ID']}\\n".encode())  # one write: no interleaving
"""


def test_two_agents_end_cleanly_when_node0_finishes_first(tmp_path: Path) -> None:
    script = _write(tmp_path / "reduce_job.py", ALL_REDUCE)
    addr = f"127.0.0.1:{_free_port()}"
    common = ["--nproc", "2", "--nnodes", "2", "--store-addr", addr]
    procs: list[subprocess.Popen[bytes]] = []
    outputs = [tmp_path / "agent0.txt", tmp_path / "agent1.txt"]
    env = dict(os.environ)
    try:
        for rank, out_path in enumerate(outputs):
            with open(out_path, "wb") as out:
                procs.append(
                    subprocess.Popen(
                        _torchnext_run(*common, "--node-rank", str(rank), script),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
            env = {**os.environ, "TEST_HOST_AGENT_PID": str(procs[0].pid)}
        # Reaped as soon as it exits, so node 1's workers see it gone.
        codes = [p.wait(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = [p.read_text(errors="replace") for p in outputs]
    assert codes == [0, 0], texts
    for text in texts:
        assert not [n for n in CPP_NOISE if n in text], text
    members = sorted(m for text in texts for m in re.findall(r"^done (\S+)$", text, re.M))
    assert members == ["n0w0", "n0w1", "n1w0", "n1w1"], texts


SLEEPER = """
import os, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, os.environ["TORCHNEXT_MEMBER_ID"] + ".pid"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_stops_the_workers_and_says_so(tmp_path: Path) -> None:
    """A scheduler cancelling the job sends the agent SIGTERM: its workers must not be
    left running without it (they were, before the agent handled the signal)."""
    script = _write(tmp_path / "sleeper.py", SLEEPER)
    pid_files = [tmp_path / "n0w0.pid", tmp_path / "n0w1.pid"]
    with subprocess.Popen(
        _torchnext_run("--nproc", "2", script), stderr=subprocess.PIPE, text=True
    ) as agent:
        try:
            deadline = time.monotonic() + 60
            while not all(p.exists() and p.read_text() for p in pid_files):
                assert agent.poll() is None, "the agent ended before its workers started"
                assert time.monotonic() < deadline, "workers did not start within 60 s"
                time.sleep(0.05)
            pids = [int(p.read_text()) for p in pid_files]
            agent.send_signal(signal.SIGTERM)
            _, err = agent.communicate(timeout=30)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    assert agent.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM; its workers were stopped" in err, err
    assert not [pid for pid in pids if _alive(pid)], err
