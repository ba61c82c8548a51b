"""The character-level transformer trained with DiLoCo: members synchronise every H steps.

Run it on 3 workers, kill one while it trains, and watch it go on::

    torchnext run --nproc 3 examples/diloco_transformer.py --rounds 20 --sync-every 10
    kill -9 <pid of a worker>        # its contribution to that round is dropped

Each member takes ``--sync-every`` AdamW steps on its own share of the data without
communicating; then the members average how far their parameters moved (the
pseudo-gradient) and an outer Nesterov SGD applies it: one all-reduce of the model per
round instead of one per step. ``--local-sgd`` averages the parameters instead;
``--fragments F`` (streaming DiLoCo) syncs one of F fragments every sync_every / F steps.

With replica groups, each replica is a group of processes sharding the model with
FSDP2; a sync then moves each process's shard only::

    torchnext run --nproc 4 --group-size 2 examples/diloco_transformer.py --rounds 20
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch
from fault_tolerant_transformer import CharTransformer, CharWindows, corpus
from torch import nn
from torch.distributed.fsdp import fully_shard

from torchnext.distributed import DiLoCo, ElasticSampler, SamplerConfig, SyncConfig
from torchnext.distributed.launch.exits import EXIT_EVICTED
from torchnext.distributed.training.replica_groups import ReplicaGroup


def main() -> int:
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
    p.add_argument(
        "--fragments", type=int, default=1, help="streaming DiLoCo: sync 1/F of the model per round"
    )
    args = p.parse_args()

    torch.manual_seed(0)  # every member builds the same model
    data = CharWindows(corpus(20_000), args.seq)
    model = CharTransformer(len(data.vocab), args.d_model, args.layers, 4, args.seq)
    replica = None
    if ReplicaGroup.requested():  # torchnext run --group-size G: shard inside each group
        # FSDP2 warns that the head's reshaped logits are a view; nothing changes them.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        replica = ReplicaGroup.from_env()
        for block in model.blocks.layers:
            fully_shard(block, mesh=replica.mesh)
        fully_shard(model, mesh=replica.mesh)
    # The inner optimizer comes after fully_shard: it holds the sharded parameters.
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    # The sampler hands out a whole round: sync_every / fragments inner steps of `batch`.
    steps_per_round = args.sync_every // max(1, args.fragments)
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=len(data), global_batch_size=args.batch * steps_per_round)
    )
    if args.local_sgd:
        config = SyncConfig.local_sgd(sync_every=args.sync_every, fragments=args.fragments)
    else:
        config = SyncConfig(
            sync_every=args.sync_every, outer_lr=args.outer_lr, fragments=args.fragments
        )
    diloco = DiLoCo(model, inner, sampler, config=config, replica=replica)

    def loss_of(indices: list[int]) -> torch.Tensor:
        x_BT, y_BT = (torch.stack(t) for t in zip(*(data[i] for i in indices), strict=True))
        logits_BTV = model(x_BT)
        return nn.functional.cross_entropy(logits_BTV.flatten(0, 1), y_BT.flatten())

    try:
        while diloco.rounds < args.rounds:
            result = diloco.run_round(loss_of)
            if diloco.manager.rank == 0:
                print(
                    f"round {result.step:3d}  loss {result.loss:.3f}  processes "
                    f"{result.world_size}  sync {diloco.sync_s * 1e3:.0f} ms",
                    flush=True,
                )
    except Exception as exc:
        if diloco.manager.evicted(exc):  # its group lost a process: the launcher restarts it
            print(f"{diloco.manager.member_id}: {exc}", flush=True)
            return EXIT_EVICTED
        raise
    diloco.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
