"""A plain DDP training loop: the script that examples/ddp_fault_tolerant.py makes fault tolerant.

Run it with torchrun (a worker that dies ends the job)::

    torchrun --nproc-per-node 3 examples/ddp_plain.py --steps 60

``diff examples/ddp_plain.py examples/ddp_fault_tolerant.py`` shows every change.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


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
    torch.distributed.init_process_group("gloo")
    net = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 4))
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    sampler = DistributedSampler(data, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch // sampler.num_replicas, sampler=sampler)
    for step, (x, y) in zip(range(1, args.steps + 1), loader, strict=False):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if torch.distributed.get_rank() == 0 and step % 10 == 0:
            print(
                f"step {step:4d}  loss {loss.item():.3f}  lr {sched.get_last_lr()[0]:.2e}",
                flush=True,
            )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
