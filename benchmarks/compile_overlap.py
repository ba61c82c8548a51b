"""Compiled tensor-parallel MLP on 2 gloo ranks: step time with the overlap pass on and off.

The model is ``Linear(H, F)`` (``ColwiseParallel``), ``ReLU``, ``Linear(F, H)``
(``RowwiseParallel``), compiled with ``torch.compile``; a step is forward, ``sum()``,
backward. Each rank runs one intra-op thread; gloo runs collectives on its own threads,
so a collective issued early can proceed while the rank computes. In the backward graph
the all-reduce of the input gradient can overlap the first layer's weight gradient;
the pass moves it there (the forward all-reduce ends the graph and cannot move).

Measured side by side in one run per torch build (interleaved, rotating repetitions):

* ``step_off_ms`` / ``step_on_ms``: the compiled step, pass off / on (two compiled copies
  of the same model, each compiled under its setting);
* ``compute_ms``: the same local shapes with no communication (one rank's share);
* ``comm_ms``: the step's two all-reduces alone; ``overlappable_ms``: the backward work
  the input-gradient all-reduce does not feed (both weight and bias gradients);
* ``ideal_speedup``: ``step_off / (step_off - min(all_reduce, overlappable))``, the most
  any schedule gains by hiding that all-reduce (the forward one ends its graph: the
  loss needs it). ``ideal_speedup_all`` hides every collective behind all compute,
  ``(compute + comm) / max(compute, comm)``, a bound no schedule of this graph reaches.

2.14's pass can only move the all-reduce past the first layer's weight gradient (the
rest of the backward comes before the all-reduce's input). torchnext's FX pass also
computes that input first; on 2.13 Inductor's scheduler then keeps as much of that order
as its own peak-memory estimate allows (``torchnext.compile.keep_fx_order``): here the
first layer's weight gradient and both bias gradients run while the all-reduce is in
flight, and the second layer's weight gradient stays before it (moving it would keep the
incoming gradient alive beside the all-reduce's buffer, a higher peak).

torchnext runs on this torch (2.13) through ``torchnext.compile.enable_simple_overlap``;
native 2.14.1 runs the same program with its own pass on and off, in the python of
``TORCHNEXT_TORCH214_PYTHON`` (else the checkout's ``.venv-214``).

Keys (issue): ``overlap_speedup`` (>= 1.05 and at least half the ideal gain) and
``overlap_vs_native_214`` (>= 0.95).

Usage: ``torchnext bench compile-overlap [--reps N] [--batch B] [--no-native]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

HIDDEN, FFN = 1024, 512


def _own_code(fn: Any, name: str) -> Any:
    """``fn`` with a code object of its own: Dynamo caches compiled graphs per code object,
    so without this the second model (same shapes) would run the first one's graph."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _worker(rank: int, port: int, out: str, batch: int, reps: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from torchnext.benchmarking import compare
    from torchnext.compile import simple_overlap_enabled

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))

    def mlp(hidden: int, ffn: int) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(hidden, ffn), torch.nn.ReLU(), torch.nn.Linear(ffn, hidden)
        )

    def tensor_parallel(name: str) -> Any:
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        model = parallelize_module(mlp(HIDDEN, FFN), mesh, plan)
        return torch.compile(_own_code(lambda t: model(t), name))

    x = torch.randn(batch, HIDDEN, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def step(model: Any) -> None:
        model(x).sum().backward()

    models: dict[str, Any] = {}
    for name, flag in (("off", False), ("on", True)):
        with simple_overlap_enabled(flag):  # compiles forward and backward under the flag
            models[name] = tensor_parallel(f"step_{name}")
            step(models[name])
    local_model = mlp(HIDDEN, FFN // 2)
    local = torch.compile(_own_code(lambda t: local_model(t), "step_local"))
    step(local)
    grad = torch.randn(batch, HIDDEN)
    dh = torch.randn(batch, FFN // 2)
    hidden_act = torch.randn(batch, FFN // 2)

    candidates = {
        "off": lambda: step(models["off"]),
        "on": lambda: step(models["on"]),
        "compute": lambda: step(local),
        "comm": lambda: (dist.all_reduce(grad.clone()), dist.all_reduce(grad.clone())),
        "all_reduce": lambda: dist.all_reduce(grad.clone()),
        # The backward work the input-gradient all-reduce does not feed: both weight
        # gradients and both bias gradients.
        "overlappable": lambda: (
            dh.t() @ x.detach(),
            dh.sum(0),
            grad.t() @ hidden_act,
            grad.sum(0),
        ),
    }
    timings = compare(candidates, reps=reps, warmup=3)
    with torch.no_grad():
        y_on, y_off = models["on"](x), models["off"](x)
    same = bool(torch.equal(y_on, y_off))
    if rank == 0:
        result = {n: t.median_s * 1e3 for n, t in timings.items()}
        result.update({f"{n}_spread": t.spread for n, t in timings.items()})
        result["bit_identical"] = same
        result["torch"] = torch.__version__
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _run_here(batch: int, reps: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"  # every graph compiled fresh
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        mp.start_processes(_worker, args=(port, out, batch, reps), nprocs=2, start_method="spawn")
        data: dict[str, Any] = json.loads(Path(out).read_text())
    return data


def _native_python() -> Path | None:
    from torchnext._env import TORCHNEXT_TORCH214_PYTHON

    configured = TORCHNEXT_TORCH214_PYTHON.get()
    if configured:
        return Path(configured)
    candidate = Path(__file__).resolve().parent.parent / ".venv-214" / "bin" / "python"
    return candidate if candidate.exists() else None


def _run_script(python: Path, batch: int, reps: int) -> dict[str, Any]:
    cmd = [str(python), str(Path(__file__).resolve()), "--here-only", "--batch", str(batch)]
    proc = subprocess.run(
        [*cmd, "--reps", str(reps)], capture_output=True, text=True, timeout=540, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{python} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def _derived(r: dict[str, Any]) -> dict[str, float]:
    hidden = min(r["all_reduce"], r["overlappable"])
    ideal = r["off"] / (r["off"] - hidden)
    ideal_all = (r["compute"] + r["comm"]) / max(r["compute"], r["comm"])
    return {"speedup": r["off"] / r["on"], "ideal": ideal, "ideal_all": ideal_all}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench compile-overlap", description=__doc__)
    parser.add_argument("--reps", type=int, default=21, help="timed repetitions per candidate")
    parser.add_argument("--batch", type=int, default=2048, help="rows per step")
    parser.add_argument("--no-native", action="store_true", help="skip the native 2.14 run")
    parser.add_argument("--here-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps < 3 or args.batch < 1:
        parser.error(f"--reps {args.reps} --batch {args.batch}: need reps >= 3 and batch >= 1")
    if args.here_only:
        print(json.dumps(_run_here(args.batch, args.reps)))
        return 0

    from torchnext.benchmarking import Report

    # Each build runs as its own script process: the ranks are spawned from a real
    # __main__ (``torchnext bench`` loads this file without a module entry).
    runs = {"torchnext": _run_script(Path(sys.executable), args.batch, args.reps)}
    python = None if args.no_native else _native_python()
    if python is not None:
        runs["native_214"] = _run_script(python, args.batch, args.reps)
    columns = ["build", "torch", "step_off_ms", "step_on_ms", "speedup", "compute_ms", "comm_ms"]
    columns += ["all_reduce_ms", "overlappable_ms", "ideal_speedup", "ideal_speedup_all"]
    columns += ["spread_off", "spread_on", "bit_identical"]
    report = Report(name="compile-overlap", columns=columns)
    derived = {}
    for build, r in runs.items():
        d = derived[build] = _derived(r)
        report.add(
            build=build,
            torch=r["torch"],
            step_off_ms=r["off"],
            step_on_ms=r["on"],
            speedup=d["speedup"],
            compute_ms=r["compute"],
            comm_ms=r["comm"],
            all_reduce_ms=r["all_reduce"],
            overlappable_ms=r["overlappable"],
            ideal_speedup=d["ideal"],
            ideal_speedup_all=d["ideal_all"],
            spread_off=r["off_spread"],
            spread_on=r["on_spread"],
            bit_identical=r["bit_identical"],
        )
    ours = derived["torchnext"]
    half_ideal = 1 + (ours["ideal"] - 1) / 2
    report.summary["overlap_speedup"] = ours["speedup"]
    report.summary["ideal_speedup"] = ours["ideal"]
    report.summary["half_ideal_speedup"] = half_ideal
    report.summary["overlap_speedup_pass"] = ours["speedup"] >= max(1.05, half_ideal)
    if "native_214" in derived:
        report.summary["overlap_vs_native_214"] = ours["speedup"] / derived["native_214"]["speedup"]
        report.summary["overlap_vs_native_214_pass"] = (
            report.summary["overlap_vs_native_214"] >= 0.95
        )
    else:
        report.notes.append("no torch 2.14 python found: overlap_vs_native_214 not measured")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
