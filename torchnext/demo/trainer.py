"""The demo's worker: fault-tolerant data-parallel training of a small MLP on the digits.

Started by ``torchnext demo`` through the agent (``python -m torchnext.demo.trainer``);
it is also a complete example of a training script for ``torchnext run``. It reports
progress and the manager's events to the store under ``torchnext/demo/`` so the demo's
driver can show them live, and writes its final state fingerprint there at the end.

The same functions build the model, the data order and the loss for the failure-free
reference run (:func:`reference_run`), which is what makes "the faulty run ends where
the reference run ends" a meaningful comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from torchnext.demo.data import Dataset, load_dataset
from torchnext.distributed.training.sampler import ElasticSampler, SamplerConfig

__all__ = ["build_model", "build_optimizer", "summed_loss", "reference_run", "main", "KEY"]

KEY = "torchnext/demo"
"""Store prefix of everything the demo's workers report."""


def build_model(
    seed: int, in_features: int, num_classes: int, hidden: int = 128
) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(in_features, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, num_classes),
    )


def build_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def summed_loss(model: torch.nn.Module, data: Dataset, indices: list[int]) -> torch.Tensor:
    """Cross-entropy *summed* over ``indices`` (an empty share gives a zero that still has a graph)."""
    idx = torch.tensor(indices, dtype=torch.int64)
    logits = model(data.x_ND[idx])
    return torch.nn.functional.cross_entropy(logits, data.y_N[idx], reduction="sum")


def sampler_for(data: Dataset, *, batch: int, seed: int) -> ElasticSampler:
    return ElasticSampler(
        SamplerConfig(dataset_size=int(data.y_N.numel()), global_batch_size=batch, seed=seed)
    )


def reference_run(
    *, steps: int, batch: int, seed: int, lr: float, data: Dataset
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The failure-free run in one process: per-step global-batch losses and final weights."""
    model = build_model(seed, data.x_ND.shape[1], data.num_classes)
    opt = build_optimizer(model, lr)
    sampler = sampler_for(data, batch=batch, seed=seed)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = summed_loss(model, data, sampler.global_batch()) * sampler.loss_scale()
        loss.backward()
        opt.step()
        sampler.commit()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


class _Reporter:
    """Forwards manager events and committed steps to the store for the demo's driver."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def event(self, kind: str, member: str, detail: dict[str, Any], when: float) -> None:
        n = int(self.store.add(f"{KEY}/events/count", 1))
        record = {"kind": kind, "member": member, "time": when, "detail": detail}
        self.store.set(f"{KEY}/events/{n}", json.dumps(record, default=str))

    def step(self, step: int, loss: float, world_size: int, members: list[str]) -> None:
        record = {"loss": loss, "world": world_size, "members": members, "time": time.time()}
        self.store.set(f"{KEY}/step/{step}", json.dumps(record))
        self.store.set(f"{KEY}/latest", str(step))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchnext.demo.trainer")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--pace-ms", type=float, default=0.0, help="make each step last at least this long"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    parser.add_argument("--result-dir", default="", help="rank 0 saves final weights here")
    parser.add_argument("--generated-data", action="store_true", help="use the generated dataset")
    args = parser.parse_args(argv)

    from torchnext.distributed.launch.agent import EXIT_EVICTED
    from torchnext.distributed.training.manager import Manager, ManagerConfig, ManagerEvent

    torch.set_num_threads(args.threads)
    data = load_dataset(prefer_real=not args.generated_data, seed=args.seed)
    model = build_model(args.seed, data.x_ND.shape[1], data.num_classes)
    optimizer = build_optimizer(model, args.lr)
    sampler = sampler_for(data, batch=args.batch, seed=args.seed)

    reporter: list[_Reporter] = []

    def on_event(e: ManagerEvent) -> None:
        if reporter:
            reporter[0].event(
                e.kind, e.member_id, {**e.detail, "step": e.step, "world": e.world_size}, e.time
            )

    config = ManagerConfig(check_replicas=True, step_timeout=timedelta(seconds=20))
    try:
        manager = Manager.from_env(model, optimizer, sampler, config=config, on_event=on_event)
    except Exception as exc:
        from torchnext.errors import CommTimeoutError

        if isinstance(exc, CommTimeoutError):
            print(f"demo worker: could not join the running job: {exc}", file=sys.stderr)
            return EXIT_EVICTED
        raise
    reporter.append(_Reporter(manager.group.store))
    if manager.step < 0:
        reporter[0].event("joined", manager.member_id, {"world": manager.world_size}, time.time())
    pace_s = args.pace_ms / 1000.0

    def closure(indices: list[int]) -> torch.Tensor:
        t0 = time.monotonic()
        loss = summed_loss(model, data, indices)
        left = pace_s - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
        return loss

    step_fn: Callable[[Callable[[list[int]], torch.Tensor]], Any] = manager.run_step
    try:
        while manager.step < args.steps:
            result = step_fn(closure)
            if manager.rank == 0:
                reporter[0].step(
                    result.step, result.loss, result.world_size, list(manager.group.members)
                )
    except Exception as exc:
        if manager.evicted(exc):
            print(
                f"demo worker {manager.member_id}: evicted by the group ({exc}); exiting",
                file=sys.stderr,
            )
            return EXIT_EVICTED
        raise
    final = {
        "checksum": manager.checksum(),
        "steps_redone": manager.steps_redone,
        "replica_checks": manager.replica_checks,
        "replica_mismatches": manager.replica_mismatches,
        "step": manager.step,
    }
    manager.group.store.set(f"{KEY}/final/{manager.member_id}", json.dumps(final))
    if manager.rank == 0 and args.result_dir:
        path = Path(args.result_dir) / "final_state.pt"
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, path)
    manager.finish()
    manager.group.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
