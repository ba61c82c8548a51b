"""FaultTolerantDDP: a DDP-shaped loop, with real processes and real faults.

The promises: a plain DDP loop becomes fault tolerant with at most ten changed lines of
code; it trains to the same parameters and learning rate as one process over the same
global batches, a kill included (the aborted attempt's scheduler step is undone);
replicas stay bit-identical; bad input is named before a step runs.
"""

from __future__ import annotations

import ast
import difflib
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import tiny_task
import torch

from torchnext.distributed.sampler import ElasticSampler, SamplerConfig
from torchnext.testing import Fault, MultiProcessHarness, WorkerContext, run_workers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
N_SAMPLES, BATCH, STEPS, CLIP = 192, 24, 10, 0.05


def _code_lines(path: Path) -> list[str]:
    """The file's lines without its module docstring and blank lines."""
    text = path.read_text()
    doc = ast.get_docstring(ast.parse(text), clean=False)
    if doc is not None:
        text = text.replace(doc, "", 1)
    return [line for line in text.splitlines() if line.strip() and line.strip() != '""""""']


def test_the_fault_tolerant_example_changes_at_most_ten_lines_of_the_ddp_one() -> None:
    plain = _code_lines(EXAMPLES / "ddp_plain.py")
    ft = _code_lines(EXAMPLES / "ddp_fault_tolerant.py")
    changed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=plain, b=ft).get_opcodes():
        if tag != "equal":
            changed += max(i2 - i1, j2 - j1)
    assert 0 < changed <= 10, changed
    assert any("DistributedDataParallel" in line for line in plain)
    assert not any("torch.distributed" in line for line in ft)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    return tiny_task.data(N_SAMPLES)


def _model() -> torch.nn.Module:
    return tiny_task.model()


def _sampler() -> ElasticSampler:
    return ElasticSampler(SamplerConfig(dataset_size=N_SAMPLES, global_batch_size=BATCH, seed=5))


def _optim(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


def _reference() -> tuple[dict[str, torch.Tensor], float]:
    x, y = _data()
    model = _model()
    opt, sched = _optim(model)
    sampler = _sampler()
    for _ in range(STEPS):
        opt.zero_grad()
        idx = torch.tensor(sampler.global_batch())
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        sampler.commit()
    return {k: v.clone() for k, v in model.state_dict().items()}, sched.get_last_lr()[0]


def _train(ctx: WorkerContext) -> dict[str, Any]:
    from torchnext.distributed import FaultTolerantDDP, FaultTolerantGroup

    x, y = _data()
    model = FaultTolerantDDP(_model(), group=FaultTolerantGroup.from_env())
    opt, sched = _optim(model)
    sampler = _sampler()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_sampler=sampler, num_workers=2
    )
    attempts: dict[int, int] = {}
    crcs: dict[int, int] = {}
    for step, (xb, yb) in model.steps(loader, opt, STEPS, state={"lr": sched}):
        attempts[step] = attempts.get(step, 0) + 1
        opt.zero_grad()
        ctx.checkpoint(f"forward:{step}")
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        model.backward(loss)  # the body goes on after an abort, as a plain loop would
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        if model.manager is not None and model.last_result is not None:
            if model.last_result.committed:
                crcs[step] = model.manager.checksum()
    state = {k: v.detach().numpy().copy() for k, v in model.module.state_dict().items()}
    out = {
        "state": state,
        "lr": sched.get_last_lr()[0],
        "attempts": attempts,
        "crcs": crcs,
        "world": model.world_size,
        "step": model.step,
    }
    model.manager.group.shutdown()  # type: ignore[union-attr]
    return out


def test_a_ddp_shaped_loop_survives_a_kill_and_matches_one_process() -> None:
    env = {"TORCHNEXT_HEARTBEAT_TIMEOUT": "3"}
    with MultiProcessHarness(3, faults=[Fault(rank=1, at="forward:5", kind="kill")], env=env) as h:
        result = h.run(_train, timeout=timedelta(seconds=90))
    assert result[1].outcome == "killed", result.describe()
    result.raise_if_failed([0, 2])
    ref_state, ref_lr = _reference()
    values = [result[0].value, result[2].value]
    for v in values:
        assert v["step"] == STEPS and v["world"] == 2
        # Step 5 ran twice (aborted, then redone); its first scheduler step was undone.
        assert v["attempts"][5] == 2 and all(n == 1 for s, n in v["attempts"].items() if s != 5)
        assert v["lr"] == ref_lr, (v["lr"], ref_lr)
        for k, ref in ref_state.items():
            torch.testing.assert_close(torch.from_numpy(v["state"][k]), ref, rtol=1e-4, atol=1e-5)
    assert values[0]["crcs"] == values[1]["crcs"]
    for k in values[0]["state"]:
        assert (values[0]["state"][k] == values[1]["state"][k]).all()


def _bad_input(ctx: WorkerContext) -> dict[str, str]:
    from torchnext.distributed import FaultTolerantDDP, FaultTolerantGroup

    x, y = _data()
    seen: dict[str, str] = {}
    data = torch.utils.data.TensorDataset(x, y)
    model = FaultTolerantDDP(_model(), group=FaultTolerantGroup.from_env())
    opt, _ = _optim(model)
    other_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    loader = torch.utils.data.DataLoader(data, batch_sampler=_sampler())
    attempts = {
        "module": lambda: FaultTolerantDDP("net"),  # type: ignore[arg-type]
        "plain_loader": lambda: next(
            model.steps(torch.utils.data.DataLoader(data, batch_size=4), opt, 3)
        ),
        "optimizer": lambda: next(model.steps(loader, "adam", 3)),  # type: ignore[arg-type]
        "foreign_params": lambda: next(model.steps(loader, other_opt, 3)),
        "total_steps": lambda: next(model.steps(loader, opt, -1)),
        "reduction": lambda: next(model.steps(loader, opt, 3, loss_reduction="avg")),
        "backward_outside": lambda: model.backward(torch.zeros(())),
        "rank_early": lambda: model.rank,
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except Exception as exc:  # noqa: BLE001 - the message is what the test reads
            seen[name] = f"{type(exc).__name__}: {exc}"
    steps = model.steps(loader, opt, 3)
    next(steps)
    try:
        next(steps)  # the body did not call model.backward
    except RuntimeError as exc:
        seen["no_backward"] = str(exc)
    model.manager.group.shutdown()  # type: ignore[union-attr]
    return seen


def test_bad_input_is_named_before_a_step_runs() -> None:
    result = run_workers(_bad_input, world_size=1, timeout=timedelta(seconds=60))
    result.raise_if_failed()
    seen = result[0].value
    assert seen["module"].startswith("TypeError: FaultTolerantDDP(module=str)")
    assert "batch_sampler=ElasticSampler" in seen["plain_loader"]
    assert seen["optimizer"].startswith("TypeError: FaultTolerantDDP.steps(optimizer=str)")
    assert "not this model's parameters" in seen["foreign_params"]
    assert "total_steps=-1" in seen["total_steps"]
    assert "loss_reduction='avg'" in seen["reduction"]
    assert "inside `for batch in model.steps" in seen["backward_outside"]
    assert "not known before the first step" in seen["rank_early"]
    assert "did not call model.backward(loss) in step 1" in seen["no_backward"]


def test_the_fault_tolerant_example_runs_under_the_launcher(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torchnext", "run", "--nproc", "2"]
    cmd += [str(EXAMPLES / "ddp_fault_tolerant.py"), "--steps", "20"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step   20  loss" in proc.stdout, proc.stdout
