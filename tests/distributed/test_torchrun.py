"""torchrun's environment: agents started by torchrun use its store; workers it started
directly are told, once, how to launch them. Real torchrun processes, real kills."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchnext.distributed.launch.torchrun import torchrun_env

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

SCRIPT = textwrap.dedent(
    """
    import os, signal, time, torch
    from torchnext.distributed import Manager, ElasticSampler, SamplerConfig

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = ElasticSampler(SamplerConfig(dataset_size=64, global_batch_size=8))
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    manager = Manager.from_env(model, opt, sampler)
    victim = os.environ.get("VICTIM", "")
    world = int(os.environ["TORCHNEXT_WORLD_SIZE"])
    # With a victim, train on until its replacement has joined (bounded in time).
    deadline = time.monotonic() + 90
    result = None
    while manager.step < 8 or (
        victim and result.world_size < world and time.monotonic() < deadline
    ):
        if manager.member_id == victim and manager.step == 3 and os.environ["TORCHNEXT_JOIN"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        result = manager.run_step(lambda idx: ((model(x[idx]) - y[idx]) ** 2).sum())
    print(f"{manager.member_id} finished in a world of {result.world_size}", flush=True)
    manager.finish()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHNEXT_", "TORCHELASTIC_"))}
    env.update(extra)
    return env


def test_torchrun_environment_is_read() -> None:
    assert torchrun_env({}) is None
    assert torchrun_env({"RANK": "0"}) is None  # a plain env:// job, not torchrun
    env = torchrun_env(
        {
            "TORCHELASTIC_RUN_ID": "job7",
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "3",
            "GROUP_WORLD_SIZE": "4",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        }
    )
    assert env is not None and env.store_addr == "node0:29400" and env.group_rank == 3
    with pytest.raises(ValueError, match="WORLD_SIZE='four'"):
        torchrun_env({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "four"})


def test_agent_under_torchrun_uses_its_store_and_replaces_a_killed_worker(tmp_path: Path) -> None:
    port = _free_port()
    cmd = [*TORCHRUN, "--nnodes", "1", "--nproc-per-node", "1", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(port), "-m", "torchnext", "--", "run", "--nproc", "2"]
    cmd += [str(_script(tmp_path))]
    done = subprocess.run(
        cmd, env=_env(VICTIM="n0w1"), capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"under torchrun (run none): node 0 of 1, store 127.0.0.1:{port}" in out
    assert "killed by SIGKILL" in out and "replac" in out, out
    assert out.count("finished in a world of 2") == 2, out  # the survivor and the replacement


def test_two_nodes_of_torchrun_share_its_store(tmp_path: Path) -> None:
    port = _free_port()
    script = str(_script(tmp_path))
    procs = []
    for node in range(2):
        cmd = [*TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1"]
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
        cmd += ["-m", "torchnext", "--", "run", "--nproc", "1", script]
        procs.append(
            subprocess.Popen(
                cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for node, (proc, out) in enumerate(zip(procs, outs, strict=True)):
        assert proc.returncode == 0, out
        assert f"node {node} of 2, store 127.0.0.1:{port}" in out, out
        assert f"n{node}w0 finished in a world of 2" in out, out


def test_a_worker_torchrun_started_directly_is_told_once_how_to_launch(tmp_path: Path) -> None:
    cmd = [*TORCHRUN, "--nnodes", "1", "--nproc-per-node", "3", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(_free_port()), str(_script(tmp_path))]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert out.count("was started by torchrun directly") == 1, out
    assert "torchrun --nnodes 1 --nproc-per-node 1 ... -m torchnext -- run --nproc 3" in out
