"""Mixture-of-experts token exchange with one-sided RMA windows, checked against all_to_all.

Each rank routes its tokens to experts; expert ``e`` lives on rank ``e % world``. The
number of rows a rank sends to each other rank varies (that is what makes MoE
dispatch irregular). With windows the exchange needs no matching receives:

1. every rank writes how many rows it will send into each destination's *count window*
   (one slot per source), and a fence makes the counts visible;
2. every rank reads its destinations' counts and computes where its rows go (after the
   rows of lower-ranked sources), writes them straight into the destinations' *row
   windows* with ``put``, and a fence completes the exchange.

The reference is ``all_to_all_single`` with the same split sizes; the rows must match
exactly, in the same order (by source rank, then token order).

Run: ``python examples/moe_exchange.py [--world 4] [--tokens 256] [--hidden 64]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from torchnext.distributed.rma import StoreGroup, Window
from torchnext.testing import WorkerContext, run_workers


def route(
    rank: int, tokens: int, hidden: int, experts: int, world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's tokens (rows sorted by destination rank) and rows per destination."""
    gen = torch.Generator().manual_seed(1234 + rank)
    x_TH = torch.randn(tokens, hidden, generator=gen)
    expert_T = torch.randint(0, experts, (tokens,), generator=gen)
    dest_T = expert_T % world
    order = torch.argsort(dest_T, stable=True)
    counts_W = torch.bincount(dest_T, minlength=world)
    return x_TH[order].contiguous(), counts_W


def exchange_with_windows(
    group: StoreGroup, rows_RH: torch.Tensor, counts_W: torch.Tensor, capacity: int
) -> torch.Tensor:
    """Dispatch ``rows_RH`` (sorted by destination, ``counts_W`` per destination) one-sidedly."""
    world, rank, hidden = group.size, group.rank, rows_RH.shape[1]
    with (
        Window.allocate(group, (world,), torch.int64) as count_win,
        Window.allocate(group, (capacity, hidden), rows_RH.dtype) as row_win,
    ):
        for dst in range(world):
            count_win.put(counts_W[dst : dst + 1], dst, rank)
        count_win.fence()
        start = 0
        for dst in range(world):
            n = int(counts_W[dst])
            if n:
                incoming_W = count_win.get(dst, 0, world)  # rows each source sends to dst
                row_offset = int(incoming_W[:rank].sum())
                row_win.put(rows_RH[start : start + n], dst, row_offset * hidden)
            start += n
        row_win.fence()
        total = int(count_win.tensor.sum())
        received = row_win.tensor[:total].clone()
        row_win.fence()  # nobody closes before everyone has read
    return received


def exchange_with_all_to_all(rows_RH: torch.Tensor, counts_W: torch.Tensor) -> torch.Tensor:
    """The two-sided reference: exchange counts, then ``all_to_all_single`` the rows."""
    incoming_W = torch.empty_like(counts_W)
    dist.all_to_all_single(incoming_W, counts_W)
    out = torch.empty(int(incoming_W.sum()), rows_RH.shape[1], dtype=rows_RH.dtype)
    dist.all_to_all_single(
        out, rows_RH, output_split_sizes=incoming_W.tolist(), input_split_sizes=counts_W.tolist()
    )
    return out


def worker(ctx: WorkerContext, tokens: int, hidden: int) -> dict[str, float | bool]:
    """One rank of the example (run by :func:`main` in its own process)."""
    world, experts = ctx.world_size, 2 * ctx.world_size
    store = dist.PrefixStore("moe", ctx.store)
    dist.init_process_group("gloo", store=store, rank=ctx.rank, world_size=world)
    group = StoreGroup(dist.PrefixStore("moe-rma", ctx.store), ctx.rank, world, name="moe")
    rows_RH, counts_W = route(ctx.rank, tokens, hidden, experts, world)
    t0 = time.perf_counter()
    got = exchange_with_windows(group, rows_RH, counts_W, capacity=tokens * world)
    t1 = time.perf_counter()
    ref = exchange_with_all_to_all(rows_RH, counts_W)
    t2 = time.perf_counter()
    dist.destroy_process_group()
    return {
        "match": bool(torch.equal(got, ref)),
        "rows": float(got.shape[0]),
        "rma_s": t1 - t0,
        "a2a_s": t2 - t1,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args(argv)
    result = run_workers(
        worker, args.tokens, args.hidden, world_size=args.world, timeout=timedelta(seconds=120)
    )
    result.raise_if_failed(list(range(args.world)))
    for r, v in enumerate(result.values()):
        print(f"rank {r}: received {int(v['rows'])} rows; matches all_to_all: {v['match']}")
    return 0 if all(v["match"] for v in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
