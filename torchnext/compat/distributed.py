"""``split_group`` with torch 2.14's return value for ranks outside every split.

torch 2.14's ``torch.distributed.split_group`` returns ``GroupMember.NON_GROUP_MEMBER``
(the sentinel ``-100``) on a rank that belongs to none of ``split_ranks``; 2.13
returned ``None``. Use :func:`split_group` to write code that checks
``group is GroupMember.NON_GROUP_MEMBER`` (or ``== -100``) on either version.

What not to assume: 2.14 also keeps the order of the ranks inside each split (the
position becomes the group rank); on 2.13 the split's ranks are still sorted by the
backend, so on 2.13 pass each split's ranks in ascending order if group ranks matter.
Splitting needs a backend that supports it (NCCL/XCCL or a custom plugin).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

__all__ = ["split_group", "NON_GROUP_MEMBER"]

NON_GROUP_MEMBER: int = -100
"""The value of ``torch.distributed.GroupMember.NON_GROUP_MEMBER``."""


def split_group(
    parent_pg: Any = None,
    split_ranks: list[list[int]] | None = None,
    timeout: timedelta | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: Any = None,
) -> Any:
    """``torch.distributed.split_group``, returning the non-member sentinel, not ``None``.

    Arguments are those of ``torch.distributed.split_group``. ``timeout`` is a
    ``datetime.timedelta``.

    Raises:
        TypeError: ``split_ranks`` is not a list of lists of ints, or ``timeout`` is not
            a ``timedelta``.
        RuntimeError: torch.distributed is unavailable in this build.
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(
            "split_group: torch.distributed is not available in this torch build; "
            "install a build with distributed support"
        )
    if split_ranks is not None:
        if not isinstance(split_ranks, list) or not all(
            isinstance(group, (list, tuple)) and all(isinstance(r, int) for r in group)
            for group in split_ranks
        ):
            raise TypeError(
                f"split_group: split_ranks must be a list of lists of ints, got {split_ranks!r}"
            )
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(
            f"split_group: timeout must be a datetime.timedelta, got {type(timeout).__name__}"
        )
    group = dist.split_group(
        parent_pg=parent_pg,
        split_ranks=split_ranks,
        timeout=timeout,
        pg_options=pg_options,
        group_desc=group_desc,
        backend=backend,
    )
    if group is None:
        return dist.GroupMember.NON_GROUP_MEMBER
    return group
