"""A character-level transformer trained fault-tolerantly: the script the training guide walks through.

Run it on 3 workers of this machine, kill one while it trains, and watch it go on::

    torchnext run --nproc 3 examples/fault_tolerant_transformer.py --steps 200
    kill -9 <pid of a worker>        # the agent prints the pids; a replacement heals in

Everything a real job carries heals into a replacement: the model, AdamW's moments, the
warmup-then-cosine LR schedule, the data position (a DataLoader with 2 workers feeding
each member's share) and the random state. Gradients are clipped after the all-reduce,
in the optimizer step the script owns. Every ``--ckpt-every`` steps the lowest-ranked
member writes a ``torch.distributed.checkpoint`` checkpoint under ``--ckpt`` (atomically,
the last 3 kept); a job started again, after all of its processes stopped, resumes from
the latest one on every member::

    torchnext run --nproc 2 examples/fault_tolerant_transformer.py --steps 40 --ckpt-every 10
    # Ctrl-C after step 20, run the same command again: "resumed from ... at step 20"
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchnext.distributed import (
    ElasticSampler,
    Manager,
    ManagerConfig,
    SamplerConfig,
    load_checkpoint,
    save_checkpoint,
)

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly box".split()


def corpus(n_chars: int, seed: int = 0) -> str:
    """A deterministic text with some structure to learn (every member builds the same one)."""
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(WORDS), (n_chars // 4,), generator=gen).tolist()
    return " ".join(WORDS[i] for i in picks)[:n_chars]


class CharWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i: the ``seq`` characters from offset i, and the same shifted by one."""

    def __init__(self, text: str, seq: int) -> None:
        self.vocab = sorted(set(text))
        self.ids = torch.tensor([self.vocab.index(c) for c in text], dtype=torch.long)
        self.seq = seq

    def __len__(self) -> int:
        return len(self.ids) - self.seq - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i : i + self.seq + 1]
        return chunk[:-1], chunk[1:]


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq, d_model))
        block = nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.1, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x_BT: torch.Tensor) -> torch.Tensor:
        h_BTD = self.embed(x_BT) + self.pos[: x_BT.shape[1]]
        h_BTD = self.blocks(h_BTD, mask=self.mask[: x_BT.shape[1], : x_BT.shape[1]], is_causal=True)
        return self.head(h_BTD)


def warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--global-batch", type=int, default=48)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument(
        "--ckpt", default="transformer_ckpt", help="checkpoint directory (one member writes)"
    )
    p.add_argument("--ckpt-every", type=int, default=50)
    args = p.parse_args()

    torch.manual_seed(0)  # every member builds the same model; the manager checks it
    data = CharWindows(corpus(20_000), args.seq)
    model = CharTransformer(len(data.vocab), args.d_model, args.layers, 4, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(20, args.steps))
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=len(data), global_batch_size=args.global_batch)
    )
    # Its own generator: starting the loader's iterator (a resumed job does it at another
    # step) then leaves the global random state, and so dropout, as it was.
    loader = DataLoader(
        data,
        batch_sampler=sampler,
        num_workers=2,
        prefetch_factor=2,
        generator=torch.Generator(),
    )

    def optimizer_step() -> None:  # runs once every member voted to commit the step
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()

    manager = Manager.from_env(
        model,
        opt,
        sampler,
        state={"lr_schedule": schedule},  # heals and checkpoints with the model
        optimizer_step=optimizer_step,
        config=ManagerConfig(check_replicas=True),  # a divergence stops the job, named
    )
    # Every member loads the latest checkpoint before the first step; a replacement
    # started while the job runs loads nothing and heals from the live members instead.
    resumed = load_checkpoint(manager, args.ckpt)
    if resumed is not None:
        print(f"{manager.member_id}: resumed from {resumed} at step {manager.step}", flush=True)

    def loss_of(batch: list[torch.Tensor]) -> torch.Tensor:
        x_BT, y_BT = batch
        logits_BTV = model(x_BT)
        return nn.functional.cross_entropy(
            logits_BTV.flatten(0, 1), y_BT.flatten(), reduction="mean"
        )

    while manager.step < args.steps:
        result = manager.run_step(loss_of, batches=loader, loss_reduction="mean")
        if manager.rank == 0 and result.step % 10 == 0:
            lr = schedule.get_last_lr()[0]
            print(
                f"step {result.step:4d}  loss {result.loss:.3f}  lr {lr:.2e}  "
                f"members {result.world_size}",
                flush=True,
            )
        if result.step % args.ckpt_every == 0:
            save_checkpoint(manager, args.ckpt, keep=3)  # every member calls; one writes
    manager.finish()


if __name__ == "__main__":
    main()
