"""Healing transport: exact round trip of training state, refusals, bounded waits."""

from __future__ import annotations

import random
import threading
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import torch

from torchnext.distributed.healing import StateServer, describe_tensors, fetch_state
from torchnext.errors import CommTimeoutError, HealingError


def _trained_state(width: int = 8) -> dict[str, Any]:
    model = torch.nn.Sequential(
        torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, 3)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "sampler": {"epoch": 1, "cursor": 40, "seed": 0},
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": np.random.RandomState(3).get_state(),
            "python": random.Random(4).getstate(),
        },
        "step": 17,
        "extras": [
            torch.tensor(2.5, dtype=torch.bfloat16),
            torch.zeros(0, 3),
            (None, True, float("inf")),
        ],
    }


def _serve_in_thread(server: StateServer, state: Any, joiners: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["stats"] = server.serve(state, joiners=joiners, timeout=timedelta(seconds=20))
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    out["thread"] = t
    return out


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(
            a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b
        )
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b and type(a) is type(b)


def test_state_round_trip_is_exact_and_loads() -> None:
    state = _trained_state()
    with StateServer() as server:
        job = _serve_in_thread(server, state, ["joiner-1"])
        got, stats = fetch_state(
            server.address,
            member_id="joiner-1",
            token=server.token,
            model_spec=describe_tensors(state["model"]),
            timeout=timedelta(seconds=20),
        )
        job["thread"].join(20)
    assert "error" not in job
    _assert_same(state, got)
    assert stats.total_bytes > 0 and job["stats"][0].peer == "joiner-1"
    # What arrived is directly loadable into a fresh model/optimizer.
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.load_state_dict(got["model"])
    opt.load_state_dict(got["optimizer"])
    assert (
        opt.state_dict()["param_groups"][0]["betas"]
        == state["optimizer"]["param_groups"][0]["betas"]
    )


def test_different_model_shape_is_refused_clearly() -> None:
    state = _trained_state(width=8)
    other = _trained_state(width=16)
    with StateServer() as server:
        job = _serve_in_thread(server, state, ["bad"])
        with pytest.raises(HealingError, match=r"refusing to heal joiner 'bad'.*0.weight"):
            fetch_state(
                server.address,
                member_id="bad",
                token=server.token,
                model_spec=describe_tensors(other["model"]),
                timeout=timedelta(seconds=20),
            )
        job["thread"].join(20)
    assert isinstance(job.get("error"), HealingError)


def test_wrong_token_is_rejected_and_server_keeps_waiting() -> None:
    state = {"model": {"w": torch.ones(3)}, "step": 1}
    with StateServer() as server:
        job = _serve_in_thread(server, state, ["j"])
        spec = describe_tensors(state["model"])
        with pytest.raises(HealingError, match="bad token"):
            fetch_state(
                server.address,
                member_id="j",
                token="nope",
                model_spec=spec,
                timeout=timedelta(seconds=5),
            )
        got, _ = fetch_state(
            server.address,
            member_id="j",
            token=server.token,
            model_spec=spec,
            timeout=timedelta(seconds=5),
        )
        job["thread"].join(20)
    assert got["step"] == 1


def test_waits_are_bounded() -> None:
    with StateServer() as server:
        with pytest.raises(CommTimeoutError, match="did not connect"):
            server.serve({"model": {}}, joiners=["ghost"], timeout=timedelta(milliseconds=200))


def test_unreachable_healer_raises_healing_error() -> None:
    with StateServer() as server:
        address = server.address
    with pytest.raises(HealingError, match="cannot connect"):
        fetch_state(address, member_id="j", token="t", model_spec=[], timeout=timedelta(seconds=2))


def test_unsupported_object_is_named() -> None:
    with StateServer() as server:
        with pytest.raises(HealingError, match=r"optimizer.*object"):
            server.serve({"optimizer": object()}, joiners=["j"], timeout=timedelta(seconds=1))
