"""The character-level transformer of ``fault_tolerant_transformer.py``, sharded with FSDP2
in fault-tolerant replica groups (HSDP).

Run it as 2 replica groups of 2 processes; each group holds one copy of the model,
sharded over its 2 processes. Kill any process and watch its group restart and heal::

    torchnext run --nproc 4 --group-size 2 examples/hsdp_transformer.py --steps 200
    kill -9 <pid of a worker>     # its group-mate is stopped too; the group restarts

The other group trains on alone meanwhile, with the same global batch (twice the
samples per process), and the restarted group's processes heal shard i from shard i
of the live group: model shard, AdamW's moments, the LR schedule, the data position
and the random state.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from torchnext.distributed import ElasticSampler, Manager, SamplerConfig
from torchnext.distributed.launch.exits import EXIT_EVICTED
from torchnext.distributed.training.replica_groups import ReplicaGroup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_tolerant_transformer import (  # noqa: E402 - the sibling example, by path
    CharTransformer,
    CharWindows,
    corpus,
    warmup_cosine,
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--global-batch", type=int, default=48)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    # FSDP2 warns that the model's output (the head's reshaped logits) is a view; nothing
    # here changes it in place, which is what the warning is about.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    # This process's group: a gloo group of its group-mates and the mesh FSDP2 shards over.
    replica = ReplicaGroup.from_env()
    torch.manual_seed(0)  # every process builds the same model; step 0 syncs it anyway
    data = CharWindows(corpus(20_000), args.seq)
    model = CharTransformer(len(data.vocab), args.d_model, args.layers, 4, args.seq)
    for block in model.blocks.layers:
        fully_shard(block, mesh=replica.mesh)
    fully_shard(model, mesh=replica.mesh)
    # The optimizer comes after fully_shard: it holds the sharded parameters.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(20, args.steps))
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=len(data), global_batch_size=args.global_batch)
    )

    def optimizer_step() -> None:  # runs once every process of every group voted to commit
        opt.step()
        schedule.step()

    manager = Manager.from_env(
        model,
        opt,
        sampler,
        state={"lr_schedule": schedule},
        optimizer_step=optimizer_step,
        replica=replica,
    )

    def loss_of(idx: list[int]) -> torch.Tensor:
        x_BT = torch.stack([data[i][0] for i in idx])
        y_BT = torch.stack([data[i][1] for i in idx])
        logits_BTV = model(x_BT)
        return nn.functional.cross_entropy(
            logits_BTV.flatten(0, 1), y_BT.flatten(), reduction="mean"
        )

    try:
        while manager.step < args.steps:
            result = manager.run_step(loss_of, loss_reduction="mean")
            if manager.rank == 0 and result.step % 10 == 0:
                print(
                    f"step {result.step:4d}  loss {result.loss:.3f}  "
                    f"processes {result.world_size} ({result.world_size // replica.group_size} "
                    f"groups of {replica.group_size})",
                    flush=True,
                )
    except Exception as exc:
        if manager.evicted(exc):  # this group lost a process: the launcher restarts it
            print(f"{manager.member_id}: {exc}", flush=True)
            return EXIT_EVICTED
        raise
    manager.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
