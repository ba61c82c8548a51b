"""Retired epochs: a native group with a blocked op is kept until no op blocks in it."""

from __future__ import annotations

import gc
import threading

from torchnext.distributed.group.epoch import Epoch, RetiredEpochs, revoke_payload


class _Work:
    def __init__(self) -> None:
        self.done = False

    def is_completed(self) -> bool:
        return self.done


class _NativeGroup:
    """Stands in for a gloo group: records when (on which thread) its destructor runs."""

    freed_on: list[str] = []

    def __del__(self) -> None:
        _NativeGroup.freed_on.append(threading.current_thread().name)


def test_a_revoked_sub_group_epoch_is_kept_while_an_op_blocks_in_it() -> None:
    retired = RetiredEpochs()
    epoch = Epoch(3, ("w0", "w1"), 0, sub="/s1c0")
    epoch.pg = _NativeGroup()
    work = _Work()
    epoch.pending = {work}
    marked: list[bytes | str] = []
    end = retired.on_revoke(lambda e, raw: marked.append(raw), epoch)
    payload = revoke_payload("parent retired", [], "w0")
    end(payload)
    end(payload)  # revoked twice (the parent, then its own key): kept once
    assert marked == [payload, payload]
    assert retired.epochs == [epoch]
    _NativeGroup.freed_on.clear()
    del epoch, end
    gc.collect()
    retired.prune()
    assert _NativeGroup.freed_on == []  # its op still blocks: kept, no destructor runs
    work.done = True
    retired.prune()  # no op blocks any more: released (its destructor no longer waits)
    assert retired.epochs == []
    for thread in threading.enumerate():
        if thread.name == "torchnext-ft-release":
            thread.join(5)
    gc.collect()
    assert len(_NativeGroup.freed_on) == 1, _NativeGroup.freed_on
