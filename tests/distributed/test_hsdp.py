"""Fault-tolerant HSDP: replica groups of processes sharding the model with FSDP2.

The integration test runs the real launcher (an :class:`Agent` with ``group_size=2``)
over 3 groups of 2 processes (:mod:`torchnext.demo.hsdp_trainer`) and fails one
process of a different group three times: SIGKILL inside backward, SIGKILL during the
replicate all-reduce, SIGSTOP. Each time the launcher restarts the whole group, which
heals shard by shard. The run must finish; after every committed step the processes of
one shard index (one per group, the restarted groups included) hold bit-identical
shards; and every step's loss equals a failure-free single-process run's (within 2 %).
The unit tests cover the layout's pure functions and every bad input.
"""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from torchnext.demo.hsdp_job import read_records, run_job
from torchnext.demo.hsdp_trainer import reference_losses
from torchnext.distributed.launch.agent import Agent, AgentConfig, AgentEvent
from torchnext.distributed.launch.replica_slots import ReplicaSlots, check_group_size
from torchnext.distributed.training.hsdp import check_sharding, sharding_spec_crc
from torchnext.distributed.training.replica_groups import (
    ReplicaGroup,
    ReplicaGroupConfig,
    ReplicaSlot,
    plan_replicas,
)
from torchnext.distributed.training.shard_reduce import slot_all_reduce, slot_length
from torchnext.errors import (
    HealingRefusedError,
    ReplicaIncompleteError,
    ReplicaLayoutError,
    StaleEpochError,
)

# --------------------------------------------------------------------------- layout


def _slots(layout: dict[str, tuple[str, int]], g: int = 2) -> dict[str, ReplicaSlot]:
    return {m: ReplicaSlot(hash(r) & 0xFFFF, shard, g) for m, (r, shard) in layout.items()}


def test_plan_orders_replicas_by_rank_and_members_by_shard() -> None:
    members = ("a1", "a0", "b0", "b1", "c1", "c0")
    layout = {m: (m[0], int(m[1])) for m in members}
    plan = plan_replicas(members, _slots(layout))
    assert plan.replicas == (("a0", "a1"), ("b0", "b1"), ("c0", "c1"))
    assert plan.incomplete == ()
    assert plan.data_position("a0") == (0, 6)
    assert plan.data_position("b1") == (3, 6)
    assert plan.data_position("c1") == (5, 6)
    assert plan.shard_peers(1) == ("a1", "b1", "c1")


def test_plan_finds_incomplete_replicas_and_the_data_world_shrinks() -> None:
    members = ("a0", "a1", "b0", "c0", "c1")
    plan = plan_replicas(members, _slots({m: (m[0], int(m[1])) for m in members}))
    assert plan.incomplete == ("b0",)
    assert plan.replicas == (("a0", "a1"), ("c0", "c1"))
    assert plan.data_position("c0") == (2, 4)  # the same global batch, re-split over 4


def test_two_claims_on_one_shard_are_incomplete() -> None:
    members = ("a0", "a1", "x")
    slots = _slots({"a0": ("a", 0), "a1": ("a", 1), "x": ("a", 1)})
    assert plan_replicas(members, slots).incomplete == ("x",)


def test_heal_sources_pair_shard_i_with_shard_i() -> None:
    members = ("a0", "a1", "b0", "b1", "c0", "c1")
    plan = plan_replicas(members, _slots({m: (m[0], int(m[1])) for m in members}))
    steps = {"a0": 7, "a1": 7, "b0": 7, "b1": 7, "c0": -1, "c1": -1}
    assert plan.heal_sources(steps) == {"c0": "a0", "c1": "a1"}


def test_replica_groups_of_different_sizes_are_refused() -> None:
    slots = {"a0": ReplicaSlot(1, 0, 2), "a1": ReplicaSlot(1, 1, 2), "b0": ReplicaSlot(2, 0, 1)}
    with pytest.raises(ReplicaLayoutError, match="different sizes.*--group-size"):
        plan_replicas(("a0", "a1", "b0"), slots)


@pytest.mark.parametrize(
    ("group_size", "world", "match"),
    [(0, 4, "--group-size=0.*at least 1"), (2, 5, "--group-size=2 does not divide.*5")],
)
def test_bad_group_sizes_name_the_argument_and_the_fix(
    group_size: int, world: int, match: str
) -> None:
    with pytest.raises(ReplicaLayoutError, match=match):
        check_group_size(group_size, world)
    with pytest.raises(ValueError, match="--group-size"):
        AgentConfig(nproc=world, group_size=group_size)


def test_torchnext_run_refuses_a_world_not_divisible_by_the_group_size(tmp_path: Path) -> None:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('must not start')\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchnext",
            "run",
            "--nproc",
            "5",
            "--group-size",
            "2",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--group-size=2 does not divide the world size 5" in proc.stderr
    assert "--nproc 4" in proc.stderr


def test_replica_group_config_checks_its_fields() -> None:
    ok: dict[str, Any] = dict(
        group_size=2, replica_id="n0g0", shard=1, timeout=timedelta(seconds=3)
    )
    ReplicaGroupConfig(**ok)
    with pytest.raises(ReplicaLayoutError, match="shard=2"):
        ReplicaGroupConfig(**{**ok, "shard": 2})
    with pytest.raises(ReplicaLayoutError, match="replica_id"):
        ReplicaGroupConfig(**{**ok, "replica_id": ""})
    with pytest.raises(ValueError, match="timeout"):
        ReplicaGroupConfig(**{**ok, "timeout": 3})


def test_replica_slots_name_restarted_groups_and_set_the_environment() -> None:
    slots = ReplicaSlots(group_size=2, node_rank=0, nproc=6)
    assert slots.slots(3) == [2, 3]
    assert slots.name(3) == "n0g1"
    assert slots.restart(2) == "n0g1.r1"
    env = slots.env(3)
    assert env == {
        "TORCHNEXT_GROUP_SIZE": "2",
        "TORCHNEXT_REPLICA_ID": "n0g1.r1",
        "TORCHNEXT_SHARD_INDEX": "1",
    }
    assert slots.name(0) == "n0g0"


def test_slot_all_reduce_sums_shard_i_with_shard_i() -> None:
    # Two groups of two processes; the "all-reduce" sums the four buffers.
    locals_ = {
        (g, s): [torch.full((2 if s == 0 else 1,), float(10 * g + s))]
        for g in (0, 1)
        for s in (0, 1)
    }
    buffers: list[torch.Tensor] = []
    lengths = [slot_length(torch.zeros(3, 1), 2)]  # plain tensor: its whole size
    for (_g, s), tensors in locals_.items():

        def keep(flat: torch.Tensor) -> None:
            buffers.append(flat)

        slot_all_reduce(
            keep, tensors, lengths, shard=s, group_size=2, contribute=True, dtype=torch.float32
        )
    total = torch.stack(buffers).sum(0).view(2, -1)
    assert total[0, :2].tolist() == [10.0, 10.0]  # 0 + 10
    assert total[1, :1].tolist() == [12.0]  # 1 + 11


def test_errors_are_typed_and_picklable() -> None:
    for exc in (ReplicaLayoutError("x"), ReplicaIncompleteError("y")):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)
    assert issubclass(ReplicaLayoutError, ValueError)
    assert issubclass(ReplicaIncompleteError, StaleEpochError)


def test_a_model_sharded_differently_is_refused_before_training() -> None:
    from torch.distributed.fsdp import fully_shard

    store = dist.HashStore()
    config = ReplicaGroupConfig(
        group_size=1, replica_id="u0", shard=0, timeout=timedelta(seconds=3)
    )
    replica = ReplicaGroup(store, config)
    sharded = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    fully_shard(sharded, mesh=replica.mesh)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    a, b = sharding_spec_crc(sharded, 1), sharding_spec_crc(plain, 1)
    assert a != b
    specs, steps = {"m0": a, "m1": a, "m2": b}, {"m0": 3, "m1": 3, "m2": 3}
    with pytest.raises(ReplicaLayoutError, match="sharded differently in \\['m2'\\]"):
        check_sharding("m0", specs, steps)
    with pytest.raises(HealingRefusedError, match="refused joiners"):
        check_sharding("m0", specs, {**steps, "m2": -1})
    check_sharding("m0", {"m0": a, "m1": a}, steps)


# --------------------------------------------------------------------------- faults

STEPS, WIDTH, SEED, BATCH = 14, 64, 0, 48
FAULTS = ["backward:n0w2:3", "sync:n0w4:6", "stop:n0w1:9"]


@pytest.mark.timeout(300)  # six processes, then three restarted pairs, import torch on 2 cores
def test_three_groups_survive_kill_in_backward_kill_in_sync_and_sigstop(tmp_path: Path) -> None:
    job = run_job(
        [
            f"--steps={STEPS}",
            f"--width={WIDTH}",
            f"--seed={SEED}",
            f"--batch={BATCH}",
            "--deadline-s=240",
            *(f"--fault={f}" for f in FAULTS),
        ],
        folder=tmp_path,
        nproc=6,
        group_size=2,
        max_restarts=3,
        deadline=timedelta(seconds=280),
    )
    assert job.exit_code == 0, "\n".join(job.messages)
    assert len(job.restarts) == 3, job.messages
    recs = read_records(tmp_path / "records")
    fired = sorted(r["fault"] for r in recs if r["kind"] == "fault")
    assert fired == ["backward", "stop", "sync"]
    steps = [r for r in recs if r["kind"] == "step"]
    assert max(r["step"] for r in steps) == STEPS
    # Shards stay identical across groups after every committed step, healed ones included.
    crcs: dict[tuple[int, int], set[int]] = {}
    for r in steps:
        crcs.setdefault((r["step"], r["shard"]), set()).add(r["crc"])
    assert all(len(v) == 1 for v in crcs.values()), crcs
    healed = {r["member"] for r in steps if ".r" in r["member"]}
    assert len(healed) == 6, healed  # three restarted groups of two trained after healing
    # Every step's loss is a failure-free run's (the same global batch, re-split).
    reference = reference_losses(steps=STEPS, width=WIDTH, seed=SEED, batch=BATCH)
    for r in steps:
        want = reference[r["step"] - 1]
        assert abs(r["loss"] - want) <= 0.02 * abs(want), (r, want)


# --------------------------------------------------------------------------- launcher

_ENV_SCRIPT = """
import json, os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
env = {k: v for k, v in os.environ.items() if k.startswith("TORCHNEXT_")}
(out / (env["TORCHNEXT_MEMBER_ID"] + ".json")).write_text(json.dumps(env))
deadline = time.monotonic() + 60
while not (out / "stop").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def _wait_for(path: Path, names: list[str], agent: Agent) -> None:
    deadline = time.monotonic() + 60
    while not all((path / f"{n}.json").exists() for n in names):
        assert time.monotonic() < deadline, f"{names} did not start"
        agent.poll()
        time.sleep(0.05)


def test_the_agent_restarts_a_whole_group_when_one_process_dies(tmp_path: Path) -> None:
    script = tmp_path / "env_script.py"
    script.write_text(_ENV_SCRIPT)
    events: list[AgentEvent] = []
    config = AgentConfig(nproc=4, group_size=2, max_restarts=1, term_grace=timedelta(seconds=2))
    with Agent([str(script), str(tmp_path)], config, on_event=events.append) as agent:
        agent.start()
        _wait_for(tmp_path, ["n0w0", "n0w1", "n0w2", "n0w3"], agent)
        first = json.loads((tmp_path / "n0w3.json").read_text())
        assert first["TORCHNEXT_REPLICA_ID"] == "n0g1"
        assert first["TORCHNEXT_SHARD_INDEX"] == "1"
        assert first["TORCHNEXT_GROUP_SIZE"] == "2"
        agent.signal_worker(2, signal.SIGKILL)
        _wait_for(tmp_path, ["n0w2.r1", "n0w3.r1"], agent)
        for member, shard in (("n0w2.r1", "0"), ("n0w3.r1", "1")):
            env = json.loads((tmp_path / f"{member}.json").read_text())
            assert env["TORCHNEXT_REPLICA_ID"] == "n0g1.r1"
            assert env["TORCHNEXT_SHARD_INDEX"] == shard
            assert env["TORCHNEXT_JOIN"] == "1"
        (tmp_path / "stop").write_text("")
        deadline = time.monotonic() + 60
        while agent.poll():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    messages = [e.message for e in events]
    assert any("restarting replica group n0g1 as n0g1.r1 (restart 1/1)" in m for m in messages)
    killed = [e.exit for e in events if e.exit is not None and e.member_id in ("n0w2", "n0w3")]
    assert {x.member_id for x in killed} == {"n0w2", "n0w3"}
    assert agent.restarts == 1  # one restart for the whole group
    assert agent.exit_code() == 0
