"""Registered training state: bad registrations, round trips, weights_only, fingerprints."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from torchnext.distributed.sampler import ElasticSampler, SamplerConfig
from torchnext.distributed.training.state import TrainingState, capture_rng, restore_rng
from torchnext.errors import ReplicaDivergenceError, TrainingStateError


def _parts() -> tuple[torch.nn.Module, torch.optim.Optimizer, ElasticSampler]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = ElasticSampler(SamplerConfig(dataset_size=64, global_batch_size=8, seed=1))
    return model, opt, sampler


def _train_a_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.n = int(state["n"])


class _Unportable(_Counter):
    def state_dict(self) -> dict[str, object]:  # type: ignore[override]
        return {"n": self.n, "callback": print}


def test_bad_registrations_name_the_argument_and_the_fix() -> None:
    model, opt, sampler = _parts()
    state = TrainingState(model, opt, sampler)
    state.register("counter", _Counter())
    with pytest.raises(
        TrainingStateError, match=r"name='counter'.*already registered \(_Counter\)"
    ):
        state.register("counter", _Counter())
    with pytest.raises(TrainingStateError, match=r"name='model'.*manager uses that name"):
        state.register("model", _Counter())
    with pytest.raises(TrainingStateError, match=r"name='has space'"):
        state.register("has space", _Counter())
    with pytest.raises(
        TypeError, match=r"obj=<int object>.*no state_dict\(\) and no load_state_dict"
    ):
        state.register("lr", 3)  # type: ignore[arg-type]
    with pytest.raises(TrainingStateError, match=r"cb\.state_dict\(\)\['callback'\] is a builtin"):
        state.register("cb", _Unportable())
    with pytest.raises(TypeError, match=r"replicated='yes'"):
        state.register("other", _Counter(), replicated="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"state=\[.*must map names"):
        TrainingState(model, opt, sampler, [_Counter()])  # type: ignore[arg-type]
    assert state.names == ("counter",)


def test_state_round_trips_through_torch_load_weights_only(tmp_path: Path) -> None:
    model, opt, sampler = _parts()
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ema = torch.optim.swa_utils.AveragedModel(model)
    counter = _Counter()
    state = TrainingState(model, opt, sampler, {"lr": sched, "scaler": scaler, "ema": ema})
    state.register("seen", counter, replicated=False)
    for _ in range(3):
        _train_a_step(model, opt)
        sched.step()
        ema.update_parameters(model)
        counter.n += 5
    sampler.commit()
    path = tmp_path / "ckpt.pt"
    torch.save(state.state_dict(), path)
    expected = (torch.rand(3), np.random.rand(3), random.random())

    loaded = torch.load(path, weights_only=True)  # the default of torch.load since 2.6
    model2, opt2, sampler2 = _parts()
    sched2 = torch.optim.lr_scheduler.CosineAnnealingLR(opt2, T_max=10)
    ema2 = torch.optim.swa_utils.AveragedModel(model2)
    counter2 = _Counter()
    state2 = TrainingState(
        model2, opt2, sampler2, {"lr": sched2, "scaler": torch.amp.GradScaler("cpu"), "ema": ema2}
    )
    state2.register("seen", counter2, replicated=False)
    state2.load_state_dict(loaded)
    # Loading put the random generators back where the save left them.
    again = (torch.rand(3), np.random.rand(3), random.random())
    torch.testing.assert_close(again[0], expected[0])
    np.testing.assert_array_equal(again[1], expected[1])
    assert again[2] == expected[2]
    assert sched2.last_epoch == 3 and sched2.get_last_lr() == sched.get_last_lr()
    assert counter2.n == 15 and sampler2.state_dict() == sampler.state_dict()
    assert state2.fingerprints() == state.fingerprints()
    assert set(state.fingerprints()) == {"model", "optimizer", "sampler", "lr", "scaler", "ema"}


def test_fingerprints_name_what_changed() -> None:
    model, opt, sampler = _parts()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    state = TrainingState(model, opt, sampler, {"lr": sched})
    _train_a_step(model, opt)
    before = state.fingerprints()
    sched.step()  # changes the scheduler and the optimizer's lr, nothing else
    after = state.fingerprints()
    assert {k for k in before if before[k] != after[k]} == {"lr", "optimizer"}
    with torch.no_grad():
        model.weight[0, 0] = torch.nextafter(model.weight[0, 0], torch.tensor(2.0))
    assert state.fingerprints()["model"] != after["model"]  # one ulp is a difference


def test_loading_with_other_entries_is_refused_before_anything_changes() -> None:
    model, opt, sampler = _parts()
    saved = TrainingState(model, opt, sampler, {"lr": _Counter()}).state_dict()
    model2, opt2, sampler2 = _parts()
    with torch.no_grad():
        model2.weight.zero_()
    target = TrainingState(model2, opt2, sampler2, {"ema": _Counter()})
    with pytest.raises(TrainingStateError, match=r"holds 'lr'.*'ema' is registered here"):
        target.load_state_dict(saved)
    assert float(model2.weight.detach().abs().sum()) == 0.0  # nothing was loaded


def test_spec_problems_and_rng_capture() -> None:
    model, opt, sampler = _parts()
    state = TrainingState(model, opt, sampler, {"lr": _Counter()})
    assert state.spec_problems({"lr": True}, "joiner 'w3'") == []
    assert state.spec_problems({}, "joiner 'w3'") == ["joiner 'w3' did not register 'lr'"]
    assert state.spec_problems({"lr": False, "ema": True}, "j") == [
        "j registered 'ema', which the group does not have",
        "j registered 'lr' with replicated=False, the group with replicated=True",
    ]
    snapshot = capture_rng()
    first = torch.rand(2)
    restore_rng(snapshot)
    torch.testing.assert_close(torch.rand(2), first)


def test_divergence_error_pickles_with_its_fields() -> None:
    err = ReplicaDivergenceError("x", entries=("lr",), members=("w1",), step=4)
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, RuntimeError)
    assert (back.entries, back.members, back.step, str(back)) == (("lr",), ("w1",), 4, "x")
