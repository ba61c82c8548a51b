"""Goodput of fault-tolerant training, and healing throughput over loopback.

Three ways to run the same 4-worker data-parallel job (MLP on synthetic data, real
processes under the agent):

* ``fault_free``: no faults.
* ``heal_in_place``: SIGKILL of a random worker every ``--fault-every-s`` seconds; the
  survivors shrink and go on, the agent starts a replacement that heals from a peer.
* ``restart_from_checkpoint``: same faults, handled the classic way: the whole job is
  stopped and restarted, every worker loads the latest on-disk checkpoint (saved every
  ``--ckpt-every`` steps), and the steps since that checkpoint are lost.

Side by side: the three run in *interleaved windows* of ``--fault-every-s`` seconds
(one fault in the middle of each faulty window), the order rotating every round, so
load drift on a shared machine hits all three alike. Goodput = committed steps that
survive to the end of a window per second, from the window's first committed step
(process start-up is common to all modes and not compared).
Then the time to heal 10 MB, 100 MB and 1 GB of state from one process to another over
loopback with :mod:`torchnext.distributed.training.healing` (median of 3).

Usage: ``torchnext bench ft-goodput [--quick] [--rounds 3] [--fault-every-s 30]``.
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
    from torchnext.distributed.launch.exits import EXIT_EVICTED
    from torchnext.distributed.training.manager import Manager, ManagerConfig
    from torchnext.distributed.training.sampler import ElasticSampler, SamplerConfig

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
    from torchnext.distributed.launch.agent import Agent, AgentConfig

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


def _run_window(
    mode: str, args: argparse.Namespace, script: str, tmp: str, rnd: int
) -> dict[str, Any]:
    """One window of ``mode``; returns committed steps, wall time and faults injected."""
    rng = random.Random(rnd)
    ckpt_dir = str(Path(tmp) / f"ckpt-{mode}-{rnd}")
    Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    extra = [f"--hidden={args.hidden}", f"--ckpt-every={args.ckpt_every}"]
    if mode == "restart_from_checkpoint":
        extra.append(f"--ckpt-dir={ckpt_dir}")
    log_dir = str(Path(tmp) / f"logs-{mode}-{rnd}")
    agent = _agent(script, extra, args.nproc, log_dir)
    faults = 0
    window = args.fault_every_s
    try:
        _wait_first_step(agent)
        t0 = time.monotonic()
        base = _latest(agent.store)
        next_fault = t0 + window / 2 if mode != "fault_free" else float("inf")
        while time.monotonic() - t0 < window:
            agent.poll()
            if time.monotonic() >= next_fault:
                faults += 1
                next_fault += window
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
    return {"mode": mode, "round": rnd, "committed_steps": steps, "wall_s": wall, "faults": faults}


# ----------------------------------------------------------------------------- healing


def _heal_server(nbytes: int) -> int:
    """Child-process side: serve ``nbytes`` of state once; prints ``address token`` first."""
    from torchnext.distributed.training.healing import StateServer

    state = {"model": {"w": torch.ones(nbytes // 4, dtype=torch.float32)}, "step": 1}
    with StateServer() as server:
        print(server.address, server.token, flush=True)
        server.serve(state, joiners=["bench"], timeout=timedelta(seconds=120))
    return 0


def _heal_rate(script: str, nbytes: int) -> tuple[float, float]:
    """Seconds and MB/s to receive ``nbytes`` of state from another process over loopback."""
    from torchnext.distributed.training.healing import fetch_state

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
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--fault-every-s", type=float, default=30.0, help="window length; one fault per window"
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of 20 s windows, skip the 1 GB heal"
    )
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.heal_server:
        return _heal_server(args.heal_server)
    if args.quick:
        args.rounds, args.fault_every_s = 2, 20.0

    from torchnext.benchmarking import Report

    script = str(Path(__file__).resolve())
    report = Report(
        name="ft-goodput",
        columns=["case", "committed_steps", "wall_s", "faults", "steps_per_s", "ratio"],
    )
    modes = ["fault_free", "heal_in_place", "restart_from_checkpoint"]
    windows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="ft-goodput-") as tmp:
        for rnd in range(args.rounds):
            order = modes[rnd % 3 :] + modes[: rnd % 3]
            for m in order:
                w = _run_window(m, args, script, tmp, rnd)
                windows[m].append(w)
                print(f"ft-goodput: {w}", file=sys.stderr, flush=True)

    def pooled(m: str) -> float:
        return sum(w["committed_steps"] for w in windows[m]) / sum(w["wall_s"] for w in windows[m])

    free = pooled("fault_free")
    for m in modes:
        report.add(
            case=m,
            committed_steps=sum(w["committed_steps"] for w in windows[m]),
            wall_s=sum(w["wall_s"] for w in windows[m]),
            faults=sum(w["faults"] for w in windows[m]),
            steps_per_s=pooled(m),
            ratio=pooled(m) / free if free else float("nan"),
        )
    per_round = [
        windows["heal_in_place"][r]["committed_steps"]
        / max(1, windows["fault_free"][r]["committed_steps"])
        for r in range(args.rounds)
    ]
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
    restart = pooled("restart_from_checkpoint")
    report.summary = {
        "goodput_ratio_with_faults": pooled("heal_in_place") / free if free else float("nan"),
        "goodput_ratio_per_round": per_round,
        "speedup_vs_restart": pooled("heal_in_place") / restart if restart else float("inf"),
        "restart_goodput_ratio": restart / free if free else float("nan"),
        "heal_mb_per_s": heal,
        "fault_every_s": args.fault_every_s,
        "rounds": args.rounds,
        "workers": args.nproc,
    }
    report.notes.append(
        "modes run in interleaved windows (order rotating per round), one fault mid-window; "
        "goodput counts committed steps that survive to the end of each window"
    )
    report.write()
    print(
        json.dumps({k: v for k, v in report.summary.items() if k != "heal_mb_per_s"}),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
