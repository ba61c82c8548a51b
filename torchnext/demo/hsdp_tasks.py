"""What :mod:`torchnext.demo.hsdp_trainer` trains: a small MLP, or the transformer example.

Use :func:`mlp_task` for tests (its failure-free losses have a one-process reference,
:func:`torchnext.demo.hsdp_trainer.reference_losses`) and :func:`transformer_task` for
the benchmark, which pins the character transformer of
``examples/fault_tolerant_transformer.py`` (loaded from the given file, as the DiLoCo
half of the benchmark loads it). A :class:`Task` says which modules FSDP2 shards, how a
list of sample indices becomes a loss, and what the held-out loss is.

What not to assume: the model is built unsharded and identical in every process (one
seed); shard it with :meth:`Task.shard` before making the optimizer.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SAMPLES",
    "Task",
    "build_model",
    "heldout_data",
    "load_example",
    "make_data",
    "mlp_task",
    "transformer_task",
]

SAMPLES = 960
"""The MLP's training samples."""
_HELDOUT = 240
_HELDOUT_WINDOWS = 64


def build_model(width: int, seed: int) -> torch.nn.Sequential:
    """The MLP every process builds identically (before sharding)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, 4),
    )


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` training samples: 16 features, 4 classes (a random linear labelling)."""
    gen = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(n, 16, generator=gen)
    w = torch.randn(16, 4, generator=gen)
    return x, (x @ w).argmax(dim=1)


def heldout_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Held-out samples labelled as :func:`make_data`'s, never trained on."""
    gen = torch.Generator().manual_seed(seed + 1000)
    torch.randn(SAMPLES, 16, generator=gen)  # the training features, skipped
    w = torch.randn(16, 4, generator=gen)
    x = torch.randn(_HELDOUT, 16, generator=gen)
    return x, (x @ w).argmax(dim=1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """A model, its data and its loss, as the trainer needs them."""

    model: torch.nn.Module
    """Built unsharded, identical in every process."""
    blocks: list[torch.nn.Module]
    """The modules to shard one by one (then the root)."""
    dataset_size: int
    """Training samples (indices ``0 .. dataset_size - 1``)."""
    loss: Callable[[list[int], str], torch.Tensor]
    """``loss(indices, reduction)``: the loss of those samples ("sum" or "mean")."""
    heldout_loss: Callable[[], float]
    """The held-out loss of the model as it is now (a collective inside a replica group)."""
    fault_module: torch.nn.Module
    """Where a "backward" fault hooks (the last layer: backward reaches it first)."""

    def shard(self, mesh: Any) -> None:
        """``fully_shard`` every block, then the root, over ``mesh``."""
        from torch.distributed.fsdp import fully_shard

        for block in self.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


def mlp_task(width: int, seed: int) -> Task:
    """The trainer's MLP on its synthetic classification data."""
    model = build_model(width, seed)
    x, y = make_data(SAMPLES, seed)
    xh, yh = heldout_data(seed)

    def loss(idx: list[int], reduction: str) -> torch.Tensor:
        i = torch.tensor(idx, dtype=torch.int64)
        return torch.nn.functional.cross_entropy(model(x[i]), y[i], reduction=reduction)

    def heldout() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(model(xh), yh))

    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    return Task(
        model=model,
        blocks=list(linears),
        dataset_size=SAMPLES,
        loss=loss,
        heldout_loss=heldout,
        fault_module=linears[-1],
    )


def load_example(path: Path) -> Any:
    """The module ``examples/fault_tolerant_transformer.py`` at ``path`` (not a package:
    loaded by path, as a script's sibling would import it)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file; give the path of examples/fault_tolerant_transformer.py"
        )
    spec = importlib.util.spec_from_file_location("fault_tolerant_transformer", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fault_tolerant_transformer", module)
    spec.loader.exec_module(module)
    return module


def transformer_task(
    example: Path, *, d_model: int, layers: int, heads: int, seq: int, seed: int
) -> Task:
    """The character transformer of the example file ``example``, on its corpus; the
    last windows (never trained on) are held out."""
    ex = load_example(example)
    torch.manual_seed(seed)
    data = ex.CharWindows(ex.corpus(20_000, seed=seed), seq)
    n_train = len(data) - _HELDOUT_WINDOWS - seq  # held-out windows overlap no training one
    heldout_idx = list(range(len(data) - _HELDOUT_WINDOWS, len(data)))
    model = ex.CharTransformer(len(data.vocab), d_model, layers, heads, seq)

    def loss_of(indices: list[int], reduction: str) -> torch.Tensor:
        x_BT = torch.stack([data[i][0] for i in indices])
        y_BT = torch.stack([data[i][1] for i in indices])
        logits_BTV = model(x_BT)
        flat = torch.nn.functional.cross_entropy(
            logits_BTV.flatten(0, 1), y_BT.flatten(), reduction="none"
        ).view(len(indices), -1)
        per_window = flat.mean(dim=1)  # a window is one sample
        return per_window.sum() if reduction == "sum" else per_window.mean()

    def heldout() -> float:
        with torch.no_grad():
            return float(loss_of(heldout_idx, "mean"))

    return Task(
        model=model,
        blocks=list(model.blocks.layers),
        dataset_size=n_train,
        loss=loss_of,
        heldout_loss=heldout,
        fault_module=model.head,
    )
