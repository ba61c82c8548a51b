"""``backend="torchnext_gemm"``: the post-grad pass fuses GEMM epilogues in inference graphs
of unchanged models, leaves training graphs alone, and keeps the results."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchnext.gemm.compile_pass as compile_pass
from torchnext.compat.gemm_internals import compile_fx_with_post_grad_pass, inductor_config
from torchnext.gemm import autotune


@pytest.fixture(autouse=True)
def _counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    monkeypatch.setenv("TORCHNEXT_GEMM_CACHE_DIR", str(tmp_path / "cache"))
    autotune.clear()
    torch._dynamo.reset()
    calls: list[str] = []
    real = compile_pass.gemm

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(repr(kwargs.get("epilogue")))
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_pass, "gemm", counting)
    # Inductor's on-disk graph cache would skip the passes on a hit from an earlier run.
    with inductor_config().patch(fx_graph_cache=False):
        yield calls


class MLP(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Block(nn.Module):
    """A pre-norm transformer block: attention, then a SiLU-gated-free MLP."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(
            nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(x)


@pytest.mark.parametrize("model_cls", [MLP, Block])
def test_inference_graphs_get_fused_calls_and_the_same_result(
    model_cls: type[nn.Module], _counted: list[str]
) -> None:
    model = model_cls().eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="torchnext_gemm")(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert any("gelu" in c or "silu" in c for c in _counted), _counted
    assert any("add" in c for c in _counted), _counted  # the residual joined its GEMM


def test_training_fuses_only_chains_whose_intermediates_are_not_saved(
    _counted: list[str],
) -> None:
    model = MLP()
    twin = MLP()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 32)
    torch.compile(model, backend="torchnext_gemm")(x).sum().backward()
    twin(x).sum().backward()
    # gelu's input is saved for its backward: that chain stays; the residual add joins.
    assert _counted and not any("gelu" in c for c in _counted), _counted
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_the_pass_counts_what_it_rewrote() -> None:
    def f(a: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.relu(a @ w) * 0.5) + r

    graphs: list[int] = []
    real = compile_pass.fuse_gemm_epilogues

    def spy(graph: torch.fx.Graph) -> int:
        graphs.append(real(graph))
        return graphs[-1]

    a, w, r = torch.randn(5, 6), torch.randn(6, 7), torch.randn(5, 7)
    with torch.no_grad():
        compiled = torch.compile(
            f, backend=lambda gm, ex: compile_fx_with_post_grad_pass(gm, ex, spy, ("spy",))
        )
        torch.testing.assert_close(compiled(a, w, r), f(a, w, r))
    assert graphs == [1]
