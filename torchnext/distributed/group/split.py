"""Planning a split: which members form which sub-group, from ranks or colors.

:func:`plan_split` is the pure part of
:meth:`~torchnext.distributed.FaultTolerantGroup.split`: given what every member
passed (exchanged by one all-gather), it returns the sub-group this member is in.
The group then builds that sub-group inside its current epoch.

Semantics, as equivalent Python (``table`` holds one row per rank)::

    # split(ranks=r): one sub-group, the members at ranks r, in the order given
    groups = {0: list(r)}
    # split(color=c, key=k): members of equal color, ordered by (key, rank)
    for c, k, rank in sorted(table, key=lambda row: (row[1], row[2])):
        if c >= 0:                       # color=None is sent as -1: opted out
            groups.setdefault(c, []).append(rank)

What not to assume: every member must call split with the same kind of arguments
(ranks on all, or color/key on all); mismatched rank lists are detected and raise.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import torch

from torchnext.errors import MembershipError

__all__ = ["SplitPlan", "plan_split"]

SplitPlan = tuple[list[int], int]
"""The ranks (in the parent's epoch, in sub-group order) of this member's sub-group,
and the sub-group's color (0 for ``split(ranks)``)."""


def plan_split(
    ranks: Sequence[int] | None,
    color: int | None,
    key: int,
    *,
    rank: int,
    size: int,
    exchange: Callable[[torch.Tensor], torch.Tensor],
) -> SplitPlan | None:
    """This member's sub-group, or ``None`` when it is in none.

    ``exchange(row)`` all-gathers one int64 row per rank into a ``(size, 3)`` table.
    """
    if ranks is not None:
        if color is not None:
            raise ValueError("split: pass either ranks or color/key, not both")
        chosen = [int(r) for r in ranks]
        bad = [r for r in chosen if not 0 <= r < size]
        if bad or len(set(chosen)) != len(chosen) or not chosen:
            raise MembershipError(
                f"split(ranks={list(ranks)}): ranks must be unique, non-empty, and within "
                f"0..{size - 1} (group size {size})"
            )
        crc = zlib.crc32(str(chosen).encode())
        table = exchange(torch.tensor([crc, 0, 0], dtype=torch.int64))
        if len(set(table[:, 0].tolist())) != 1:
            raise MembershipError(
                "split(ranks=...): members passed different rank lists; pass the same list "
                "on every member"
            )
        groups = {0: chosen}
    else:
        c = -1 if color is None else int(color)
        if color is not None and c < 0:
            raise ValueError(f"split: color={color} must be >= 0 (None opts out)")
        table = exchange(torch.tensor([c, int(key), rank], dtype=torch.int64))
        groups = {}
        for c_i, _k_i, r_i in sorted(table.tolist(), key=lambda row: (row[1], row[2])):
            if c_i >= 0:
                groups.setdefault(c_i, []).append(r_i)
    for c_i, members in groups.items():
        if rank in members:
            return members, c_i
    return None
