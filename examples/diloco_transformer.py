"""The character-level transformer trained with DiLoCo: members synchronise every H steps.

Run it on 3 workers, kill one while it trains, and watch it go on::

    torchnext run --nproc 3 examples/diloco_transformer.py --rounds 20 --sync-every 10
    kill -9 <pid of a worker>        # its contribution to that round is dropped

Each member takes ``--sync-every`` AdamW steps on its own share of the data without
communicating; then the members average how far their parameters moved (the
pseudo-gradient) and an outer Nesterov SGD applies it: one all-reduce of the model per
round instead of one per step. ``--local-sgd`` averages the parameters instead.
"""

from __future__ import annotations

import argparse

import torch
from fault_tolerant_transformer import CharTransformer, CharWindows, corpus
from torch import nn

from torchnext.distributed import DiLoCo, ElasticSampler, SamplerConfig, SyncConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--sync-every", type=int, default=10, help="H: inner steps per round")
    p.add_argument("--batch", type=int, default=48, help="samples per inner step, all members")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3, help="inner AdamW learning rate")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--local-sgd", action="store_true", help="average parameters (LocalSGD)")
    args = p.parse_args()

    torch.manual_seed(0)  # every member builds the same model
    data = CharWindows(corpus(20_000), args.seq)
    model = CharTransformer(len(data.vocab), args.d_model, args.layers, 4, args.seq)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    # The sampler hands out a whole round: sync_every inner steps of `batch` samples.
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=len(data), global_batch_size=args.batch * args.sync_every)
    )
    if args.local_sgd:
        config = SyncConfig.local_sgd(sync_every=args.sync_every)
    else:
        config = SyncConfig(sync_every=args.sync_every, outer_lr=args.outer_lr)
    diloco = DiLoCo(model, inner, sampler, config=config)

    def loss_of(indices: list[int]) -> torch.Tensor:
        x_BT, y_BT = (torch.stack(t) for t in zip(*(data[i] for i in indices), strict=True))
        logits_BTV = model(x_BT)
        return nn.functional.cross_entropy(logits_BTV.flatten(0, 1), y_BT.flatten())

    while diloco.rounds < args.rounds:
        result = diloco.run_round(loss_of)
        if diloco.manager.rank == 0:
            print(
                f"round {result.step:3d}  loss {result.loss:.3f}  members {result.world_size}  "
                f"sync {diloco.sync_s * 1e3:.0f} ms",
                flush=True,
            )
    diloco.finish()


if __name__ == "__main__":
    main()
