"""torchft's DiLoCo in ``ft-sharded``: the same model, data and H as torchnext's DiLoCo case.

torchft runs as its README describes: a Lighthouse (in the harness process), and per
replica one process with its own TCPStore, a ``torchft.Manager`` (synchronous quorum,
as its DiLoCo requires), ``ProcessGroupGloo`` and ``torchft.local_sgd.DiLoCo`` wrapping
the inner AdamW (the sync runs from the inner optimizer's step hook every H steps; outer
Nesterov SGD, lr 0.7, momentum 0.9, as torchnext's). Each replica takes the same
samples torchnext's member of the same rank takes: the round's global batch from
torchnext's :class:`~torchnext.distributed.ElasticSampler`, split by rank, cut into H
pieces. Fault-free only (torchnext's fault case has no torchft counterpart here).

Figures: the held-out loss of replica 0 at the end; the median inner step (the steps
that do not sync) and the median sync (the syncing step less the median inner step),
from times the workers log. torchft keeps no wire counters, so no bytes are reported.

What not to assume: the workers run ``python _ft_sharded_torchft.py --worker ...``
from this folder; torchft's first quorum and process-group setup are not in the times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from _ft_sharded_diloco import (
    LR,
    NPROC,
    OUTER_LR,
    OUTER_MOMENTUM,
    SEED,
    STEP_BATCH,
    CaseResult,
    batch_loss,
    build,
    heldout_loss,
)


def run_torchft(
    *, rounds: int, sync_every: int, root: Path, timeout: timedelta
) -> tuple[CaseResult, str]:
    """Run torchft's DiLoCo on NPROC replicas; its figures and a note ("" when all ran)."""
    out = CaseResult(case="torchft diloco")
    log_dir = root / "torchft"
    log_dir.mkdir(parents=True, exist_ok=True)
    script = str(Path(__file__).resolve())
    # Its own process, its log lines (one per quorum) kept out of the benchmark's output.
    lighthouse = subprocess.Popen(
        [sys.executable, script, "--serve-lighthouse"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.monotonic()
    errors: list[str] = []
    try:
        address = lighthouse.stdout.readline().decode().strip() if lighthouse.stdout else ""
        if not address:
            raise RuntimeError("the torchft Lighthouse did not start")
        for slot in range(NPROC):
            cmd = [sys.executable, script, "--slot", str(slot)]
            cmd += ["--rounds", str(rounds), "--sync-every", str(sync_every)]
            cmd += ["--lighthouse", address, "--log", str(log_dir / f"r{slot}.jsonl")]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            )
        deadline = time.monotonic() + timeout.total_seconds()
        for slot, proc in enumerate(procs):
            try:
                _out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                _out, err = proc.communicate()
                errors.append(f"replica {slot} did not finish within {timeout}")
                continue
            if proc.returncode != 0:
                tail = err.decode(errors="replace").strip().splitlines()[-3:]
                errors.append(f"replica {slot} exited {proc.returncode}: {' | '.join(tail)}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lighthouse.communicate()  # closes its stdin: it shuts down and exits
    out.wall_s = time.monotonic() - t0
    out.steps = rounds * sync_every
    out.error = "; ".join(errors)
    _read(log_dir / "r0.jsonl", out)
    return out, out.error


def _read(path: Path, out: CaseResult) -> None:
    if not path.is_file():
        return
    rows = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    inner = [r["dt"] for r in rows if r.get("kind") == "step" and not r["synced"]]
    synced = [r["dt"] for r in rows if r.get("kind") == "step" and r["synced"]]
    if inner:
        out.step_s = statistics.median(inner)
        if synced:
            out.sync_s = max(0.0, statistics.median(synced[1:] or synced) - out.step_s)
    final = [r for r in rows if r.get("kind") == "final"]
    if final:
        out.heldout_loss = final[-1]["heldout_loss"]


# ----------------------------------------------------------------------------- worker


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    from torchnext.distributed import ElasticSampler, SamplerConfig
    from torchnext.distributed.training.sampler import split_range

    torch.set_num_threads(1)
    data, n_train, heldout, model = build()
    inner = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    outer = torch.optim.SGD(model.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
    h = args.sync_every
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=n_train, global_batch_size=STEP_BATCH * h, seed=SEED)
    )
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=60)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=NPROC,
        use_async_quorum=False,
        timeout=timedelta(seconds=60),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=args.lighthouse,
        replica_id=f"r{args.slot}",
    )
    with Path(args.log).open("a") as log, DiLoCo(manager, [model], inner, outer, sync_every=h):
        for _round in range(args.rounds):
            batch = sampler.global_batch()
            a, b = split_range(len(batch), args.slot, NPROC)
            share = batch[a:b]
            for i in range(h):
                lo, hi = split_range(len(share), i, h)
                t = time.monotonic()
                inner.zero_grad(set_to_none=True)
                batch_loss(model, data, share[lo:hi]).backward()
                inner.step()  # DiLoCo's hook syncs on the H-th step
                dt = time.monotonic() - t
                log.write(json.dumps({"kind": "step", "dt": dt, "synced": i == h - 1}) + "\n")
            sampler.commit()
        if args.slot == 0:
            log.write(
                json.dumps({"kind": "final", "heldout_loss": heldout_loss(model, data, heldout)})
                + "\n"
            )
    manager.shutdown(wait=False)
    return 0


def _serve_lighthouse() -> int:
    """A Lighthouse for the replicas: prints its address, runs until stdin closes."""
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind="[::]:0",
        min_replicas=NPROC,
        join_timeout_ms=10_000,
        quorum_tick_ms=100,
        heartbeat_timeout_ms=5_000,
    )
    print(server.address(), flush=True)
    try:
        sys.stdin.read()
    finally:
        server.shutdown()
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="one torchft DiLoCo replica of ft-sharded")
    p.add_argument("--serve-lighthouse", action="store_true")
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--sync-every", type=int, default=1)
    p.add_argument("--lighthouse", default="")
    p.add_argument("--log", default="")
    args = p.parse_args(argv)
    if args.serve_lighthouse:
        return _serve_lighthouse()
    return _worker(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
