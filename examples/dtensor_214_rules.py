"""A tensor-parallel classifier whose step code uses operators only 2.14's DTensor shards.

The model is a column-parallel/row-parallel MLP over a 1-D mesh (``ColwiseParallel`` and
``RowwiseParallel``). The step code is what people write when they keep buffers around:
a causal mask built in place (``tril_``), running statistics written with ``out=``
(``sum``, ``cumsum``, ``topk``), and the update ``p - lr * m / (sqrt(v) + eps)`` done with
``torch._foreach_addcdiv``. On torch 2.13 each of these raises "does not have a sharding
strategy registered" on a DTensor; ``torchnext.backport.install()`` registers 2.14's
rules. Every step is checked against the same model run on plain tensors on one rank.

Run: ``python examples/dtensor_214_rules.py [--world 2] [--steps 5] [--no-backport]``.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from torchnext.testing import WorkerContext, run_workers

FEATURES, HIDDEN, CLASSES, BATCH = 16, 32, 8, 12


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES)
    )


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randint(
        0, CLASSES, (BATCH,), generator=g
    )


def train(model: torch.nn.Module, steps: int, to_mesh: object | None) -> list[dict[str, float]]:
    """Run ``steps`` steps; with ``to_mesh``, tensors the step creates become DTensors."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    def place(t: torch.Tensor) -> torch.Tensor:
        return t if to_mesh is None else distribute_tensor(t, to_mesh, [Replicate()])

    params = [p for p in model.parameters()]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.ones_like(p) for p in params]
    seen = place(torch.zeros(CLASSES))
    history = []
    for step in range(steps):
        x, y = batch(step)
        logits = model(place(x))
        loss = torch.nn.functional.cross_entropy(logits, place(y))
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            grads = [p.grad for p in params]
            m = [0.9 * mi + 0.1 * gi for mi, gi in zip(m, grads, strict=True)]
            v = [0.99 * vi + 0.01 * gi * gi for vi, gi in zip(v, grads, strict=True)]
            denom = [vi.sqrt() + 1e-8 for vi in v]
            new = torch._foreach_addcdiv(params, m, denom, -0.05)
            for p, n in zip(params, new, strict=True):
                p.copy_(n)
            probs = logits.softmax(-1)
            top = (place(torch.empty(BATCH, 2)), place(torch.empty(BATCH, 2, dtype=torch.long)))
            torch.topk(probs, 2, dim=-1, out=top)
            torch.sum(probs, dim=0, out=seen)
            running = place(torch.empty(CLASSES))
            torch.cumsum(seen, dim=0, out=running)
            mask = place(torch.ones(BATCH, BATCH)).tril_()
        full = (lambda t: t.full_tensor()) if isinstance(loss, DTensor) else (lambda t: t)
        history.append(
            {
                "loss": float(full(loss.detach())),
                "top1": float(full(top[0])[:, 0].sum()),
                "running": float(full(running)[-1]),
                "mask": float(full(mask).sum()),
                "w0": float(full(params[0].detach()).sum()),
            }
        )
    return history


def worker(ctx: WorkerContext, steps: int, backport: bool) -> dict[str, object]:
    """One rank: the tensor-parallel run, and the plain reference."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("tp", ctx.store), rank=ctx.rank, world_size=ctx.world_size
    )
    if backport:
        import torchnext.backport

        torchnext.backport.install()
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    tp = parallelize_module(
        make_model(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(use_local_output=False)}
    )
    try:
        got = train(tp, steps, mesh)
    except NotImplementedError as exc:
        return {"error": str(exc).splitlines()[0]}
    want = train(make_model(), steps, None)
    worst = max(abs(g[k] - w[k]) for g, w in zip(got, want, strict=True) for k in g)
    return {"history": got, "max_abs_diff": worst}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-backport", action="store_true", help="show what plain torch does")
    args = parser.parse_args(argv)
    result = run_workers(
        worker,
        args.steps,
        not args.no_backport,
        world_size=args.world,
        timeout=timedelta(seconds=120),
    )
    result.raise_if_failed(list(range(args.world)))
    values = result.values()
    if "error" in values[0]:
        print(f"torch {torch.__version__}: {values[0]['error']}")
        return 1
    for step, h in enumerate(values[0]["history"]):
        print(
            f"step {step}: loss {h['loss']:.5f}  top-1 mass {h['top1']:.4f}  w0 sum {h['w0']:.5f}"
        )
    worst = max(float(v["max_abs_diff"]) for v in values)
    ok = worst <= 1e-4
    print(
        f"tensor-parallel vs one-rank plain run: max |difference| {worst:.2e} ({'ok' if ok else 'MISMATCH'})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
