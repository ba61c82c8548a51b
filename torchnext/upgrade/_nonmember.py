"""Calls whose result is ``GroupMember.NON_GROUP_MEMBER`` (not None) on ranks outside it.

torch 2.14 returns the sentinel where 2.13 returned None in two places: ``split_group``
on ranks in no split, and ``new_group(..., use_local_synchronization=True)`` on ranks
not in ``ranks`` (2.13 returned None early there; the synchronizing path already gave
the sentinel). TNU004 rewrites None checks on names bound to such a call.
"""

from __future__ import annotations

import libcst as cst

from torchnext.upgrade._cst import bool_literal, find_kwarg

__all__ = ["NEW_GROUP_CALLS", "SPLIT_GROUP_CALLS", "local_sync_new_group"]

SPLIT_GROUP_CALLS = frozenset(
    {"torch.distributed.split_group", "torch.distributed.distributed_c10d.split_group"}
)
NEW_GROUP_CALLS = frozenset(
    {"torch.distributed.new_group", "torch.distributed.distributed_c10d.new_group"}
)

# new_group(ranks, timeout, backend, pg_options, use_local_synchronization, ...)
_LOCAL_SYNC_POSITION = 4


def local_sync_new_group(call: cst.Call) -> bool:
    """The ``new_group`` call may use local synchronization: the flag is passed and is
    not the literal False (a non-literal flag may be True; the rewritten check is right
    either way, since the sentinel was already what the synchronizing path returned)."""
    arg = find_kwarg(call, "use_local_synchronization")
    if arg is None:
        if any(a.star for a in call.args):
            return False  # *args / **kwargs: the flag cannot be read statically
        positional = [a for a in call.args if a.keyword is None]
        if len(positional) <= _LOCAL_SYNC_POSITION:
            return False
        arg = positional[_LOCAL_SYNC_POSITION]
    return bool_literal(arg.value) is not False
