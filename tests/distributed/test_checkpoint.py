"""Checkpoints of the training Manager through torch.distributed.checkpoint, with real processes.

One job trains without stopping (the reference); a second is stopped whole (every
process killed, the writer in the middle of writing a checkpoint); a fresh job resumes
from the last complete checkpoint and must end bit-identical to the reference: model,
optimizer, LR schedule, sampler, and the random draws of every step after the resume.
"""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from torchnext.distributed.sampler import ElasticSampler, SamplerConfig
from torchnext.errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    TorchnextError,
)
from torchnext.testing import Fault, MultiProcessHarness, WorkerContext

N_SAMPLES, BATCH, STEPS, EVERY, STOP = 192, 24, 9, 3, 6
ENV = {"TORCHNEXT_HEARTBEAT_TIMEOUT": "3"}  # a loaded 2-core machine can deschedule a member


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(N_SAMPLES, 12, generator=gen)
    return x, (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long()


def _model(width: int = 32) -> torch.nn.Module:
    torch.manual_seed(7)  # dropout below makes every step depend on the random state
    return torch.nn.Sequential(
        torch.nn.Linear(12, width),
        torch.nn.Tanh(),
        torch.nn.Dropout(0.3),
        torch.nn.Linear(width, 3),
    )


class _Counter:
    """A registered entry; with ``as_numpy`` its state holds what weights_only refuses."""

    def __init__(self, as_numpy: bool = False) -> None:
        self.count = 0
        self.as_numpy = as_numpy

    def state_dict(self) -> dict[str, Any]:
        return {"count": np.int64(self.count) if self.as_numpy else self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])


def _train(ctx: WorkerContext, cfg: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint import FileSystemWriter

    from torchnext.distributed import (
        FaultTolerantGroup,
        Manager,
        ManagerConfig,
        load_checkpoint,
        save_checkpoint,
    )

    group = FaultTolerantGroup.from_env()
    x, y = _data()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    sampler = ElasticSampler(SamplerConfig(dataset_size=N_SAMPLES, global_batch_size=BATCH, seed=5))

    def optimizer_step() -> None:
        opt.step()
        sched.step()

    manager = Manager(
        group,
        model,
        opt,
        sampler,
        config=ManagerConfig(check_replicas=True, step_timeout=timedelta(seconds=20)),
        state={"lr": sched},
        optimizer_step=optimizer_step,
    )
    if ctx.rank == 0:  # a fault point inside the write, after the data, before .metadata
        original = FileSystemWriter.finish

        def finish(self: FileSystemWriter, *args: Any, **kwargs: Any) -> None:
            ctx.checkpoint(f"writing:{manager.step}")
            original(self, *args, **kwargs)

        FileSystemWriter.finish = finish  # type: ignore[method-assign]
    resumed = load_checkpoint(manager, cfg["dir"])
    draws: dict[int, float] = {}
    while manager.step < STEPS:
        ctx.checkpoint(f"step:{manager.step}")

        def closure(idx: list[int]) -> torch.Tensor:
            draws[manager.step] = float(torch.rand(()))
            i = torch.tensor(idx, dtype=torch.int64)
            return torch.nn.functional.cross_entropy(model(x[i]), y[i], reduction="sum")

        manager.run_step(closure)
        if manager.step % EVERY == 0:
            save_checkpoint(manager, cfg["dir"], keep=2)
    manager.finish()
    out = {
        "resumed": str(resumed) if resumed else None,
        "model": {k: v.numpy().copy() for k, v in model.state_dict().items()},
        "optimizer": {
            f"{p}.{k}": v.numpy().copy()
            for p, st in opt.state_dict()["state"].items()
            for k, v in st.items()
        },
        "sched": sched.state_dict(),
        "sampler": sampler.state_dict(),
        "draws": draws,
        "after": torch.rand(4).numpy(),  # the random stream goes on identically too
    }
    group.shutdown()
    return out


def _job(directory: Path, faults: Sequence[Fault] = ()) -> Any:
    with MultiProcessHarness(2, faults=faults, env=ENV) as h:
        result = h.run(_train, {"dir": str(directory)}, timeout=timedelta(seconds=60))
    assert not result.unfired_faults, result.describe()
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ckpt")
    reference = _job(root / "reference")
    reference.raise_if_failed()
    # The whole job stops after step 6: the writer dies while writing step-6's checkpoint.
    stopped = _job(
        root / "job", [Fault(rank=0, at=f"writing:{STOP}"), Fault(rank=1, at=f"step:{STOP}")]
    )
    assert [r.outcome for r in stopped] == ["killed", "killed"], stopped.describe()
    left = sorted(p.name for p in (root / "job").iterdir())
    resumed = _job(root / "job")
    resumed.raise_if_failed()
    return {
        "root": root,
        "reference": reference.values(),
        "resumed": resumed.values(),
        "left": left,
    }


def test_a_stopped_job_resumes_bit_identically(runs: dict[str, Any]) -> None:
    reference, resumed = runs["reference"], runs["resumed"]
    assert [v["resumed"] for v in reference] == [None, None]
    assert all(v["resumed"].endswith("step-00000003") for v in resumed)
    for ref, got in zip(reference, resumed, strict=True):
        for part in ("model", "optimizer"):
            assert ref[part].keys() == got[part].keys()
            for k in ref[part]:
                assert torch.equal(
                    torch.from_numpy(ref[part][k]), torch.from_numpy(got[part][k])
                ), k
        assert ref["sched"] == got["sched"] and ref["sampler"] == got["sampler"]
        assert got["draws"] == {s: d for s, d in ref["draws"].items() if s >= 3}
        assert (ref["after"] == got["after"]).all()


def test_a_write_cut_short_leaves_the_previous_checkpoint(runs: dict[str, Any]) -> None:
    # After the stop: step-3 complete, step-6 only as a temporary without .metadata.
    assert runs["left"][-1] == "step-00000003" and len(runs["left"]) == 2
    assert runs["left"][0].startswith(".tmp-step-00000006-")
    # The resumed job's saves removed the temporary and kept the last two.
    assert sorted(p.name for p in (runs["root"] / "job").iterdir()) == [
        "step-00000006",
        "step-00000009",
    ]


def test_checkpoints_load_with_weights_only(runs: dict[str, Any], tmp_path: Path) -> None:
    from torchnext.distributed import export_checkpoint, latest_checkpoint, read_checkpoint

    job = runs["root"] / "job"
    assert latest_checkpoint(job) == job / "step-00000009"
    state = read_checkpoint(job)
    assert state["step"] == STEPS and set(state) >= {"model", "optimizer", "extra", "rng"}
    assert isinstance(next(iter(state["optimizer"]["state"])), int)  # not dcp's str keys
    file = export_checkpoint(job, tmp_path / "one.pt", step=6)
    plain = torch.load(file, weights_only=True)
    assert plain["step"] == 6 and plain["extra"]["lr"]["last_epoch"] == 6
    # The same trajectory: the reference's step-9 checkpoint equals the resumed job's.
    ref = read_checkpoint(runs["root"] / "reference", step=9)
    for k, v in ref["model"].items():
        assert torch.equal(v, state["model"][k])
    assert torch.equal(ref["rng"]["torch"], state["rng"]["torch"])


def _damaged_copy(runs: dict[str, Any], tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(runs["root"] / "job", copy)
    return copy


def test_damaged_missing_and_unsafe_checkpoints_are_named(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    from torchnext.distributed import read_checkpoint

    with pytest.raises(CheckpointNotFoundError, match="no complete checkpoint"):
        read_checkpoint(tmp_path / "nothing")
    copy = _damaged_copy(runs, tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="step-00000004"):
        read_checkpoint(copy, step=4)
    data = copy / "step-00000009" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="damaged or incomplete.*step-00000006"):
        read_checkpoint(copy)

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("ran code from a checkpoint",))

    (copy / "step-00000006" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match="refused.*builtins.print"):
        read_checkpoint(copy, step=6)
    with pytest.raises(CheckpointError, match="is a file"):
        read_checkpoint(data)
    # A value that only an unrestricted unpickler would build (dcp itself loads it so).
    manifest = json.dumps({"format": 1, "layout": {"d": [["value", 0]]}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp's "assuming a single process"
        dcp.save({"torchnext": manifest, "value": np.arange(3)}, checkpoint_id=tmp_path / "np")
    with pytest.raises(CheckpointError, match=r"refused: 'value' does not load with weights_only"):
        read_checkpoint(tmp_path / "np")


def test_errors_are_builtins_and_pickle() -> None:
    for cls, base in [
        (CheckpointError, ValueError),
        (CheckpointNotFoundError, FileNotFoundError),
        (CheckpointMismatchError, ValueError),
    ]:
        err = pickle.loads(pickle.dumps(cls("what and the fix", path="/ckpt/step-1")))
        assert type(err) is cls and isinstance(err, (base, TorchnextError))
        assert str(err) == "what and the fix" and err.path == "/ckpt/step-1"


def _misuse(ctx: WorkerContext, cfg: dict[str, Any]) -> dict[str, str]:
    from torchnext.distributed import FaultTolerantGroup, Manager, load_checkpoint, save_checkpoint

    group = FaultTolerantGroup.from_env()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    sampler = ElasticSampler(SamplerConfig(dataset_size=N_SAMPLES, global_batch_size=BATCH, seed=5))
    counter = _Counter(as_numpy=True)
    manager = Manager(group, model, opt, sampler, state={"lr": sched, "counter": counter})
    seen: dict[str, str] = {}
    for name, call in [
        ("mismatch", lambda: load_checkpoint(manager, cfg["dir"])),
        ("numpy", lambda: save_checkpoint(manager, cfg["out"])),
    ]:
        try:
            call()
        except CheckpointError as exc:
            seen[name] = f"{type(exc).__name__}: {exc}"
    x, y = _data()
    manager.run_step(
        lambda idx: torch.nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum")
    )
    try:
        load_checkpoint(manager, cfg["dir"])
    except CheckpointError as exc:
        seen["late"] = str(exc)
    manager.finish()
    group.shutdown()
    return seen


def test_a_checkpoint_that_does_not_fit_is_refused_by_name(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    with MultiProcessHarness(1, env=ENV) as h:
        result = h.run(_misuse, {"dir": str(runs["root"] / "job"), "out": str(tmp_path / "out")})
    result.raise_if_failed()
    seen = result[0].value
    assert seen["mismatch"].startswith("CheckpointMismatchError")
    assert "'counter' is here, not in the checkpoint" in seen["mismatch"]
    assert "register" in seen["mismatch"]  # the fix
    assert "state['extra']['counter']['count'] is a numpy.int64" in seen["numpy"]
    assert "after step 1 committed" in seen["late"]
    assert not (tmp_path / "out").exists()  # refused before anything was written
