"""A mixture-of-experts layer whose experts run as two grouped GEMMs (torchnext.gemm.grouped_mm).

The layer: a linear router scores every token against every expert; each token goes to
its top-2 experts, weighted by the renormalised router probabilities. Instead of looping
over the experts, the routed copies of the tokens are sorted by expert, so each expert's
rows are contiguous, and ``offs`` (the running count of rows per expert) tells
``grouped_mm`` where each expert's rows end:

    rows sorted by expert --grouped_mm(up, offs)--> silu --grouped_mm(down, offs)-->
    scale by router weight --index_add--> back to token order

The expert weights are 3-D parameters in ``nn.Linear`` layout, ``(E, out, in)``, passed as
``w.transpose(-2, -1)`` (a view; nothing is copied), with one bias row per expert.
``grouped_mm`` has a backward, so gradients reach the router, both expert weights and their
biases. The script checks the layer once against a plain loop over experts, then trains
it for a few steps on random data (a fixed random "teacher" MoE gives the targets) and
prints the loss.

Run: ``python examples/moe_grouped.py [--steps 30] [--tokens 512] [--dim 64] [--experts 8]``.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn

from torchnext.gemm.grouped import grouped_mm

# Shape legend: T tokens, R = T * top_k routed rows, D model dim, H expert hidden dim,
# E experts.


class GroupedMoE(nn.Module):
    """Top-k routed experts (``silu(x W_up^T + b_up) W_down^T + b_down``) on grouped GEMMs."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int = 2) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.w_up_EHD = nn.Parameter(torch.randn(experts, hidden, dim) / dim**0.5)
        self.b_up_EH = nn.Parameter(torch.zeros(experts, hidden))
        self.w_down_EDH = nn.Parameter(torch.randn(experts, dim, hidden) / hidden**0.5)
        self.b_down_ED = nn.Parameter(torch.zeros(experts, dim))

    def route(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(token of each routed row, its router weight, offs), rows sorted by expert."""
        probs_TE = self.router(x_TD).softmax(-1)
        weight_TK, expert_TK = probs_TE.topk(self.top_k, dim=-1)
        weight_TK = weight_TK / weight_TK.sum(-1, keepdim=True)
        order_R = torch.argsort(expert_TK.flatten(), stable=True)
        counts_E = torch.bincount(expert_TK.flatten(), minlength=self.w_up_EHD.shape[0])
        offs_E = torch.cumsum(counts_E, 0).to(torch.int32)
        return order_R // self.top_k, weight_TK.flatten()[order_R], offs_E

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        token_R, weight_R, offs_E = self.route(x_TD)
        x_RD = x_TD[token_R]
        up_EDH = self.w_up_EHD.transpose(-2, -1)
        down_EHD = self.w_down_EDH.transpose(-2, -1)
        h_RH = F.silu(grouped_mm(x_RD, up_EDH, offs=offs_E, bias=self.b_up_EH))
        y_RD = grouped_mm(h_RH, down_EHD, offs=offs_E, bias=self.b_down_ED)
        return torch.zeros_like(x_TD).index_add(0, token_R, y_RD * weight_R[:, None])

    def forward_loop(self, x_TD: torch.Tensor) -> torch.Tensor:
        """The same layer as a Python loop over experts (the reference)."""
        token_R, weight_R, offs_E = self.route(x_TD)
        x_RD, out_RD, start = x_TD[token_R], [], 0
        for e, end in enumerate(offs_E.tolist()):
            h = F.silu(x_RD[start:end] @ self.w_up_EHD[e].T + self.b_up_EH[e])
            out_RD.append(h @ self.w_down_EDH[e].T + self.b_down_ED[e])
            start = end
        y_RD = torch.cat(out_RD) * weight_R[:, None]
        return torch.zeros_like(x_TD).index_add(0, token_R, y_RD)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    teacher = GroupedMoE(args.dim, args.hidden, args.experts)
    model = GroupedMoE(args.dim, args.hidden, args.experts)

    x = torch.randn(args.tokens, args.dim)
    diff = (model(x) - model.forward_loop(x)).abs().max().item()
    print(f"grouped_mm layer vs loop over experts: max |difference| = {diff:.2e}")
    if diff > 1e-4:
        print("the grouped layer disagrees with the loop", file=sys.stderr)
        return 1

    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        x = torch.randn(args.tokens, args.dim)
        with torch.no_grad():
            target = teacher(x)
        loss = F.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        if step == 0:
            silent = [n for n, q in model.named_parameters() if q.grad is None or not q.grad.any()]
            if silent:
                print(f"no gradient reached {silent}", file=sys.stderr)
                return 1
            print(f"gradients reach all {len(list(model.parameters()))} parameters")
        opt.step()
        print(f"step {step:3d}  loss {loss.item():.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
