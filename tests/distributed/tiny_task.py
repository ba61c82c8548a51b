"""The small classification task the training tests share: data, model, a replacement's join.

Every member builds the same data and model from fixed seeds, so a test can compare a
fault-tolerant run with a one-process reference over the same global batches.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch


def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples of 12 features and 3 classes."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 12, generator=gen)
    y = (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long()
    return x, y


def model(width: int = 32) -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Linear(12, width), torch.nn.Tanh(), torch.nn.Linear(width, 3)
    )


def join_after_eviction(ctx: Any, replaces: str) -> Any:
    """A replacement's group: once the survivors evicted ``replaces`` (if given), join."""
    from torchnext.distributed import FaultTolerantGroup
    from torchnext.distributed.launch.keys import EVICTED_KEY_PREFIX

    victim_key = EVICTED_KEY_PREFIX + replaces
    deadline = time.monotonic() + 60
    while replaces and not ctx.store.check([victim_key]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{victim_key} never appeared")
        time.sleep(0.02)  # polling the store: it offers no wait for a key
    return FaultTolerantGroup.join(
        ctx.store, member_id=ctx.member_id, timeout=timedelta(seconds=60)
    )
