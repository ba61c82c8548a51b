"""examples/ddp_plain.py made fault tolerant: ten changed lines (see the README).

Run it on 3 workers, kill one while it trains, and watch it go on::

    torchnext run --nproc 3 examples/ddp_fault_tolerant.py --steps 60
    kill -9 <pid of a worker>        # the agent prints the pids; a replacement heals in

``diff examples/ddp_plain.py examples/ddp_fault_tolerant.py`` shows every change.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchnext.distributed import ElasticSampler, FaultTolerantDDP, SamplerConfig


def dataset(n: int = 6144, features: int = 32, classes: int = 4) -> TensorDataset:
    """Gaussian clusters, the same on every worker."""
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(classes, features, generator=gen) * 0.3
    y = torch.randint(classes, (n,), generator=gen)
    x = centers[y] + torch.randn(n, features, generator=gen)
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--global-batch", dest="batch", type=int, default=48, help="samples per step")
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    data = dataset()
    net = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 4))
    model = FaultTolerantDDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    sampler = ElasticSampler(SamplerConfig(dataset_size=len(data), global_batch_size=args.batch))
    loader = DataLoader(data, batch_sampler=sampler)
    for step, (x, y) in model.steps(loader, opt, args.steps, state={"lr": sched}):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        model.backward(loss)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if model.rank == 0 and step % 10 == 0:
            print(
                f"step {step:4d}  loss {loss.item():.3f}  lr {sched.get_last_lr()[0]:.2e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
