"""DiLoCo inside replica groups: streaming DiLoCo over 2 groups of 2 processes with FSDP2.

The run (the real launcher, :mod:`torchnext.demo.hsdp_trainer` with ``--diloco``) loses
one process during a sync (SIGKILL in the pseudo-gradient's all-reduce) and one inside
an inner step's backward. Each time the launcher restarts the whole group, which heals
shard by shard: global parameters, outer optimizer with its momentum, its healer's
inner optimizer and local parameters. The run must finish; after every committed round
the processes of one shard index hold bit-identical global parameters and outer state;
the rounds before the first failure equal a one-process simulation of the failure-free
run (:mod:`torchnext.demo.diloco_reference`); and every round, and the final held-out
loss, equal the simulation replaying the failures from the records: the dead group's
contribution to the round it died in dropped, the survivors alone until the restarted
group is admitted, which starts as a copy of its healer.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from torchnext.demo.diloco_reference import RoundRecord, reference_diloco
from torchnext.demo.hsdp_job import read_records, run_job
from torchnext.distributed.training.semisync import SyncConfig

ROUNDS, WIDTH, SEED, BATCH, H, F, LR = 16, 64, 0, 48, 4, 2, 3e-3
FAULTS = ["sync:n0w2:4", "backward:n0w1:9"]


@pytest.mark.timeout(240)  # four processes, then two restarted pairs, on 2 cores
def test_streaming_diloco_in_replica_groups_survives_kills_in_sync_and_backward(
    tmp_path: Path,
) -> None:
    job = run_job(
        [
            f"--steps={ROUNDS}",
            f"--width={WIDTH}",
            f"--seed={SEED}",
            f"--batch={BATCH}",
            f"--diloco={H}",
            f"--fragments={F}",
            f"--lr={LR}",
            "--deadline-s=180",
            *(f"--fault={f}" for f in FAULTS),
        ],
        folder=tmp_path,
        nproc=4,
        group_size=2,
        max_restarts=2,
        deadline=timedelta(seconds=220),
    )
    assert job.exit_code == 0, "\n".join(job.messages)
    assert len(job.restarts) == 2, job.messages
    recs = read_records(tmp_path / "records")
    faults = sorted((r["fault"], r["step"]) for r in recs if r["kind"] == "fault")
    assert [f for f, _ in faults] == ["backward", "sync"], faults
    first_fault = min(step for _, step in faults)
    rounds = [r for r in recs if r["kind"] == "step"]
    assert max(r["step"] for r in rounds) == ROUNDS
    # Global parameters and outer state agree across groups after every committed round.
    crcs: dict[tuple[int, int], set[int]] = {}
    for r in rounds:
        crcs.setdefault((r["step"], r["shard"]), set()).add(r["crc"])
    assert all(len(v) == 1 for v in crcs.values()), crcs
    healed = {r["member"] for r in rounds if ".r" in r["member"]}
    assert len(healed) == 4, healed  # both restarted groups trained after healing
    sync = SyncConfig(sync_every=H, fragments=F)
    common = dict(width=WIDTH, seed=SEED, batch=BATCH, groups=2, group_size=2, sync=sync)
    failure_free = reference_diloco(rounds=ROUNDS, inner_lr=LR, **common)  # type: ignore[arg-type]
    # Before any failure the run is the failure-free simulation's, up to float rounding.
    for r in rounds:
        if r["step"] <= first_fault:
            want = failure_free.round_losses[r["step"] - 1]
            assert r["loss"] == pytest.approx(want, rel=1e-4), (r, want)
    # With its failures replayed, every round is the simulation's.
    history = []
    for step in range(1, ROUNDS + 1):
        mine = [r for r in rounds if r["step"] == step]
        assert len({r["position"][1] for r in mine}) == 1, mine
        first_ranks = {r["replica"]: r["position"][0] - r["shard"] for r in mine}
        history.append(RoundRecord(groups=first_ranks, world=mine[0]["position"][1]))
    assert any(len(h.groups) == 1 for h in history), history  # the survivors went on alone
    replay = reference_diloco(rounds=ROUNDS, inner_lr=LR, history=history, **common)  # type: ignore[arg-type]
    for r in rounds:
        want = replay.round_losses[r["step"] - 1]
        assert r["loss"] == pytest.approx(want, rel=1e-3), (r, want)
    finals = [r for r in recs if r["kind"] == "final"]
    assert len(finals) == 4, finals
    heldout = {round(r["heldout"], 6) for r in finals}
    assert len(heldout) == 1, finals  # every process evaluates the same global parameters
    assert finals[0]["heldout"] == pytest.approx(replay.heldout_loss, rel=1e-3)
