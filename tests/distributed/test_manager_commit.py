"""The commit vote: every member adopts the same outcome, whatever fails."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch.distributed as dist

from torchnext.distributed.commit import CommitVote, Decision


def _store() -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


def _client(master: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=10))


def _vote_all(
    oks: list[bool | None], *, failed_after: threading.Event | None = None, joiners: bool = False
) -> list[Decision | None]:
    master = _store()
    out: list[Decision | None] = [None] * len(oks)

    def member(i: int, ok: bool | None) -> None:
        if ok is None:
            return  # this member died before voting
        vote = CommitVote(_client(master))
        out[i] = vote.decide(
            epoch=3,
            step=7,
            rank=i,
            size=len(oks),
            ok=ok,
            timeout=timedelta(seconds=5),
            failed=lambda: (
                "peer gone" if failed_after is not None and failed_after.is_set() else ""
            ),
            joiners_pending=lambda: joiners,
            local_reason="" if ok else f"member {i} saw an error",
        )

    threads = [threading.Thread(target=member, args=(i, ok)) for i, ok in enumerate(oks)]
    for t in threads:
        t.start()
    if failed_after is not None:
        threading.Timer(0.2, failed_after.set).start()
    for t in threads:
        t.join(15)
    return out


def test_all_ok_commits_everywhere_with_grow_flag() -> None:
    out = _vote_all([True, True, True, True], joiners=True)
    assert all(d is not None and d.commit and d.grow for d in out)


def test_one_error_aborts_everywhere() -> None:
    out = _vote_all([True, False, True, True])
    assert all(d is not None and not d.commit for d in out)
    assert all("member 1" in d.reason for d in out if d is not None)


def test_missing_voter_aborts_once_failure_is_known() -> None:
    out = _vote_all([True, None, True], failed_after=threading.Event())
    decided = [d for d in out if d is not None]
    assert len(decided) == 2 and all(not d.commit and d.reason == "peer gone" for d in decided)


def test_bound_runs_out_without_failure_signal() -> None:
    master = _store()
    vote = CommitVote(_client(master))
    d = vote.decide(
        epoch=0,
        step=0,
        rank=0,
        size=2,
        ok=True,
        timeout=timedelta(milliseconds=100),
        failed=lambda: "",
        joiners_pending=lambda: False,
    )
    assert not d.commit and "within" in d.reason
    # A late voter adopts the same abort.
    late = CommitVote(_client(master)).decide(
        epoch=0,
        step=0,
        rank=1,
        size=2,
        ok=True,
        timeout=timedelta(seconds=1),
        failed=lambda: "",
        joiners_pending=lambda: False,
    )
    assert not late.commit and late.reason == d.reason
