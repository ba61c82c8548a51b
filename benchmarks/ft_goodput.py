"""Goodput of fault-tolerant training, and healing throughput over loopback.

Three runs of the same 4-worker data-parallel job (MLP on synthetic data, real
processes under the agent), one after the other in this process:

* ``fault_free``: no faults.
* ``heal_in_place``: SIGKILL of a random worker every ``--fault-every-s`` seconds; the
  survivors shrink and go on, the agent starts a replacement that heals from a peer.
* ``restart_from_checkpoint``: same faults, but handled the classic way: the whole job
  is stopped and restarted, every worker loads the latest on-disk checkpoint (saved
  every ``--ckpt-every`` steps), and the steps since that checkpoint are lost.

Goodput = committed steps (that survive to the end) per second of wall time.
Then the time to heal 10 MB, 100 MB and 1 GB of state from one process to another
over loopback with :mod:`torchnext.distributed.healing`.

Usage: ``torchnext bench ft-goodput [--quick] [--duration-s 90] [--fault-every-s 30]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

STOP_KEY = "bench/stop"
LATEST_KEY = "bench/latest"


# ----------------------------------------------------------------------------- worker


def _worker(args: argparse.Namespace) -> int:
    from torchnext.distributed.launcher import EXIT_EVICTED
    from torchnext.distributed.manager import Manager, ManagerConfig
    from torchnext.distributed.sampler import ElasticSampler, SamplerConfig

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=gen)
    y = (x[:, :8].sum(dim=1) > 0).long()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 2),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = ElasticSampler(SamplerConfig(dataset_size=4096, global_batch_size=128, seed=0))
    ckpt = Path(args.ckpt_dir) / "ckpt.pt" if args.ckpt_dir else None
    start_step = 0
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])
        start_step = int(state["step"])
    try:
        manager = Manager.from_env(
            model,
            opt,
            sampler,
            config=ManagerConfig(step_timeout=timedelta(seconds=20)),
            join_timeout=timedelta(seconds=60),
        )
    except TimeoutError:
        return EXIT_EVICTED
    if manager.step == 0:
        manager.step = start_step
    store = manager.group.store

    def closure(idx: list[int]) -> torch.Tensor:
        i = torch.tensor(idx, dtype=torch.int64)
        return torch.nn.functional.cross_entropy(model(x[i]), y[i], reduction="sum")

    try:
        while not store.check([STOP_KEY]):
            result = manager.run_step(closure)
            if manager.rank == 0:
                store.set(LATEST_KEY, str(result.step))
                if ckpt is not None and result.step % args.ckpt_every == 0:
                    tmp = ckpt.with_suffix(".tmp")
                    torch.save(
                        {
                            "model": model.state_dict(),
                            "optimizer": opt.state_dict(),
                            "sampler": sampler.state_dict(),
                            "step": result.step,
                        },
                        tmp,
                    )
                    os.replace(tmp, ckpt)
    except Exception as exc:
        if manager.evicted(exc):
            return EXIT_EVICTED
        raise
    manager.finish()
    manager.group.shutdown()
    return 0


# ----------------------------------------------------------------------------- driver


def _latest(store: Any) -> int:
    return int(store.get(LATEST_KEY)) if store.check([LATEST_KEY]) else 0


def _ckpt_step(ckpt_dir: str) -> int:
    path = Path(ckpt_dir) / "ckpt.pt"
    return int(torch.load(path)["step"]) if path.exists() else 0


def _agent(script: str, extra: list[str], nproc: int, log_dir: str) -> Any:
    from torchnext.distributed.launcher import Agent, AgentConfig

    cfg = AgentConfig(
        nproc=nproc, max_restarts=1000, log_dir=log_dir, term_grace=timedelta(seconds=2)
    )
    agent = Agent([script, "--worker", *extra], cfg, on_event=lambda e: None)
    agent.start()
    return agent


def _wait_first_step(agent: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _latest(agent.store) < 1:
        agent.poll()
        if time.monotonic() > deadline:
            raise TimeoutError("workers never committed a step; see the worker logs")
        time.sleep(0.05)


def _run_mode(mode: str, args: argparse.Namespace, script: str, tmp: str) -> dict[str, Any]:
    """One run; returns committed steps, wall time and faults injected."""
    rng = random.Random(1)
    ckpt_dir = str(Path(tmp) / f"ckpt-{mode}")
    Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    extra = [f"--hidden={args.hidden}", f"--ckpt-every={args.ckpt_every}"]
    if mode == "restart_from_checkpoint":
        extra.append(f"--ckpt-dir={ckpt_dir}")
    log_dir = str(Path(tmp) / f"logs-{mode}")
    agent = _agent(script, extra, args.nproc, log_dir)
    faults = 0
    try:
        # Goodput is measured from the first committed step: process start-up and the
        # first rendezvous are the same in every mode and not what is compared.
        _wait_first_step(agent)
        t0 = time.monotonic()
        base = _latest(agent.store)
        next_fault = t0 + args.fault_every_s if mode != "fault_free" else float("inf")
        while time.monotonic() - t0 < args.duration_s:
            agent.poll()
            if time.monotonic() >= next_fault:
                faults += 1
                next_fault += args.fault_every_s
                slot = rng.choice(sorted(agent.workers))
                agent.signal_worker(slot, signal.SIGKILL)
                if mode == "restart_from_checkpoint":
                    # A job without in-place recovery: stop everything, start again from disk.
                    agent.close()
                    agent = _agent(script, extra, args.nproc, log_dir)
            time.sleep(0.05)
        # Progress that survives: the last committed step, or (restart mode, if the new
        # job has not committed yet) the step of the checkpoint it will resume from.
        steps = max(_latest(agent.store), _ckpt_step(ckpt_dir)) - base
        wall = time.monotonic() - t0
        agent.store.set(STOP_KEY, "1")
        deadline = time.monotonic() + 15
        while agent.poll() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        agent.close()
    return {
        "mode": mode,
        "committed_steps": steps,
        "wall_s": wall,
        "faults": faults,
        "goodput": steps / wall,
    }


# ----------------------------------------------------------------------------- healing


def _heal_server(nbytes: int) -> int:
    """Child-process side: serve ``nbytes`` of state once; prints ``address token`` first."""
    from torchnext.distributed.healing import StateServer

    state = {"model": {"w": torch.ones(nbytes // 4, dtype=torch.float32)}, "step": 1}
    with StateServer() as server:
        print(server.address, server.token, flush=True)
        server.serve(state, joiners=["bench"], timeout=timedelta(seconds=120))
    return 0


def _heal_rate(script: str, nbytes: int) -> tuple[float, float]:
    """Seconds and MB/s to receive ``nbytes`` of state from another process over loopback."""
    from torchnext.distributed.healing import fetch_state

    proc = subprocess.Popen(
        [sys.executable, script, "--heal-server", str(nbytes)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        address, token = proc.stdout.readline().split()
        spec = [("w", "float32", (nbytes // 4,))]
        t0 = time.perf_counter()
        state, stats = fetch_state(
            address, member_id="bench", token=token, model_spec=spec, timeout=timedelta(seconds=120)
        )
        seconds = time.perf_counter() - t0
        if int(state["model"]["w"].numel()) != nbytes // 4:
            raise RuntimeError("healing benchmark received the wrong amount of state")
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return seconds, stats.total_bytes / 1e6 / seconds


# ----------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench ft-goodput")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--heal-server", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ckpt-dir", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--ckpt-every",
        type=int,
        default=50,
        help="checkpoint period (steps) of the restart baseline",
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--duration-s", type=float, default=90.0)
    parser.add_argument("--fault-every-s", type=float, default=30.0)
    parser.add_argument(
        "--quick", action="store_true", help="45 s runs, a fault every 15 s, skip 1 GB heal"
    )
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.heal_server:
        return _heal_server(args.heal_server)
    if args.quick:
        args.duration_s, args.fault_every_s = 45.0, 15.0

    from torchnext.benchmarking import Report

    script = str(Path(__file__).resolve())
    report = Report(
        name="ft-goodput",
        columns=["case", "committed_steps", "wall_s", "faults", "steps_per_s", "ratio"],
    )
    with tempfile.TemporaryDirectory(prefix="ft-goodput-") as tmp:
        runs = {}
        for m in ("fault_free", "heal_in_place", "restart_from_checkpoint"):
            runs[m] = _run_mode(m, args, script, tmp)
            print(f"ft-goodput: {runs[m]}", file=sys.stderr, flush=True)
    free = runs["fault_free"]["goodput"]
    for mode, r in runs.items():
        report.add(
            case=mode,
            committed_steps=r["committed_steps"],
            wall_s=r["wall_s"],
            faults=r["faults"],
            steps_per_s=r["goodput"],
            ratio=r["goodput"] / free if free else float("nan"),
        )
    heal = {}
    sizes = [("10MB", 10_000_000), ("100MB", 100_000_000)] + (
        [] if args.quick else [("1GB", 1_000_000_000)]
    )
    for label, nbytes in sizes:
        # Median of 3 transfers, each to a fresh server process.
        trials = sorted(_heal_rate(script, nbytes) for _ in range(3))
        seconds, rate = trials[1]
        heal[label] = rate
        report.add(
            case=f"heal {label}",
            committed_steps="",
            wall_s=seconds,
            faults="",
            steps_per_s="",
            ratio=f"{rate:.0f} MB/s",
        )
    ratio = runs["heal_in_place"]["goodput"] / free if free else float("nan")
    restart = runs["restart_from_checkpoint"]["goodput"]
    report.summary = {
        "goodput_ratio_with_faults": ratio,
        "speedup_vs_restart": runs["heal_in_place"]["goodput"] / restart
        if restart
        else float("inf"),
        "restart_goodput_ratio": restart / free if free else float("nan"),
        "heal_mb_per_s": heal,
        "fault_every_s": args.fault_every_s,
        "duration_s": args.duration_s,
        "workers": args.nproc,
    }
    report.notes.append(
        "runs are sequential in one process (fault_free, heal_in_place, restart_from_checkpoint); "
        "goodput counts committed steps that survive to the end of the run"
    )
    report.write()
    print(
        json.dumps({k: v for k, v in report.summary.items() if k != "heal_mb_per_s"}),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
