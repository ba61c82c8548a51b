"""compile.overlap: 2.14's simple compute/communication overlap pass, on 2.13."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx

from torchnext.compat import inductor_passes
from torchnext.compile import (
    enable_simple_overlap,
    is_collective,
    keep_fx_order,
    simple_overlap,
    simple_overlap_enabled,
)

aten = torch.ops.aten
c10d = torch.ops._c10d_functional
PROGRAM = Path(__file__).with_name("overlap_program.py")


def _call(graph: torch.fx.Graph, target: Any, *args: Any, val: Any) -> torch.fx.Node:
    node = graph.call_function(target, args)
    node.meta["val"] = val
    return node


def tp_backward_like(independent_rows: int = 8) -> torch.fx.Graph:
    """x -> mm -> all_reduce -> wait -> add; plus compute that does not feed the collective."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(8, 8)
    w = g.placeholder("w")
    w.meta["val"] = torch.empty(8, 8)
    dh = _call(g, aten.mm.default, x, w, val=torch.empty(8, 8))
    dw2 = _call(g, aten.mm.default, x, x, val=torch.empty(independent_rows, 8))
    dx = _call(g, aten.mm.default, dh, w, val=torch.empty(8, 8))
    dw1 = _call(g, aten.mm.default, dh, x, val=torch.empty(8, 8))
    ar = _call(g, c10d.all_reduce.default, dx, "sum", "0", val=torch.empty(8, 8))
    wt = _call(g, c10d.wait_tensor.default, ar, val=torch.empty(8, 8))
    last = _call(g, aten.relu.default, dw1, val=torch.empty(8, 8))
    out = _call(g, aten.add.Tensor, wt, last, val=torch.empty(8, 8))
    g.output((out, dw2))
    return g


def names(graph: torch.fx.Graph) -> list[str]:
    return [n.name for n in graph.nodes if n.op == "call_function"]


def short(labels: list[str]) -> list[str]:
    """The FX names of :func:`tp_backward_like`'s nodes (``mm_3`` is the 4th mm)."""
    full = {"ar": "all_reduce_default", "wait": "wait_tensor_default", "add": "add_tensor"}
    full["relu"] = "relu_default"
    return [full.get(x, x.replace("mm", "mm_default")) for x in labels]


def test_collective_rises_to_its_input_and_its_wait_sinks_to_its_user() -> None:
    g = tp_backward_like()
    report = simple_overlap(g, hoist_inputs=False)
    # 2.14's moves: the all-reduce passes dw1 (mm 3), the wait passes relu; dw2 (mm 1) stays.
    assert names(g) == short(["mm", "mm_1", "mm_2", "ar", "mm_3", "relu", "wait", "add"])
    assert (report.collective_swaps, report.wait_swaps, report.hoisted) == (1, 1, 0)


def test_hoisting_computes_the_collectives_inputs_first() -> None:
    g = tp_backward_like()
    report = simple_overlap(g)
    assert names(g) == short(["mm", "mm_2", "ar", "mm_1", "mm_3", "relu", "wait", "add"])
    assert report.hoisted == 1 and not report.skipped


def test_values_are_unchanged_and_collectives_keep_their_order() -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4)
    a = _call(g, aten.relu.default, x, val=torch.empty(4))
    ar1 = _call(g, c10d.all_reduce.default, a, "sum", "0", val=torch.empty(4))
    b = _call(g, aten.neg.default, x, val=torch.empty(4))
    ar2 = _call(g, c10d.all_reduce.default, b, "sum", "0", val=torch.empty(4))
    w1 = _call(g, c10d.wait_tensor.default, ar1, val=torch.empty(4))
    w2 = _call(g, c10d.wait_tensor.default, ar2, val=torch.empty(4))
    g.output((_call(g, aten.add.Tensor, w1, w2, val=torch.empty(4)),))
    simple_overlap(g)
    order = [n.name for n in g.nodes if is_collective(n)]
    assert order == ["all_reduce_default", "all_reduce_default_1"]  # ar2 never passes ar1


def test_a_swap_that_raises_the_peak_memory_estimate_is_refused() -> None:
    # dw2 is huge and dies right away (an output of nothing but itself), so running the
    # collective before it would hold the collective's buffer at dw2's peak.
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(8, 8)
    small = _call(g, aten.relu.default, x, val=torch.empty(8, 8))
    big = _call(g, aten.mm.default, x, x, val=torch.empty(4096, 8))
    tiny = _call(g, aten.sum.default, big, val=torch.empty(()))
    ar = _call(g, c10d.all_reduce.default, small, "sum", "0", val=torch.empty(8, 8))
    wt = _call(g, c10d.wait_tensor.default, ar, val=torch.empty(8, 8))
    g.output((wt, tiny, small))  # small stays alive: the all-reduce frees nothing
    report = simple_overlap(g, hoist_inputs=False)
    assert report.refused_for_memory >= 1
    assert names(g).index("all_reduce_default") > names(g).index("mm_default")


def test_side_effects_are_barriers() -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4)
    a = _call(g, aten.relu.default, x, val=torch.empty(4))
    _call(g, aten.add_.Tensor, x, x, val=torch.empty(4))
    ar = _call(g, c10d.all_reduce.default, a, "sum", "0", val=torch.empty(4))
    g.output((_call(g, c10d.wait_tensor.default, ar, val=torch.empty(4)),))
    before = names(g)
    simple_overlap(g)
    assert names(g) == before


def test_a_graph_it_cannot_size_is_left_as_it_is_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g = tp_backward_like()
    next(n for n in g.nodes if n.name == "mm_default_3").meta.pop("val")
    before = names(g)
    with caplog.at_level(logging.DEBUG, logger="torchnext.compile.overlap"):
        report = simple_overlap(g)
    assert names(g) == before
    assert "left unchanged" in report.skipped and "mm_default_3" in report.skipped
    assert "left unchanged" in caplog.text


def test_a_graph_without_collectives_is_untouched() -> None:
    gm = torch.fx.symbolic_trace(lambda x: (x + 1).relu())
    assert simple_overlap(gm.graph).skipped == "no collectives"


def test_the_switch_chains_a_users_pass_and_restores_it() -> None:
    import torch._inductor.config as config

    seen: list[str] = []
    user_pass = seen.append
    user_scheduler_pass = list
    with config.patch(
        post_grad_custom_post_pass=user_pass,
        reorder_for_compute_comm_overlap_passes=[user_scheduler_pass],
    ):
        with simple_overlap_enabled():
            assert inductor_passes.overlap_pass_installed()
            installed = config.post_grad_custom_post_pass
            g = tp_backward_like()
            installed(g)
            assert seen == [g] and installed.last_report.collective_swaps == 1
            assert installed.uuid()[0] == "torchnext.simple_overlap"
            # The order keeper runs after the user's scheduler passes, and runs at all.
            assert config.reorder_for_compute_comm_overlap
            assert config.reorder_for_compute_comm_overlap_passes == [
                user_scheduler_pass,
                keep_fx_order,
            ]
        assert config.post_grad_custom_post_pass is user_pass
        assert config.reorder_for_compute_comm_overlap_passes == [user_scheduler_pass]
        assert not config.reorder_for_compute_comm_overlap
    with pytest.raises(TypeError, match="enabled='yes'"):
        enable_simple_overlap("yes")  # type: ignore[arg-type]


def test_compiled_tensor_parallel_mlp_keeps_214s_guarantees(tmp_path: Path) -> None:
    out = tmp_path / "graphs.json"
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), str(out)],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(out.read_text())
    off, on = data["graphs"]["False"], data["graphs"]["True"]
    assert len(off) == len(on) == 2  # forward and backward, each compiled under its flag
    assert data["bit_identical"]
    assert sum(g["swaps"] for g in on) > 0  # the pass did move things
    for g_off, g_on in zip(off, on, strict=True):
        assert g_on["scheduled_order"] == g_off["scheduled_order"] == g_off["order"]
        assert g_on["inductor_peak_bytes"] <= g_off["inductor_peak_bytes"]
    # Inductor runs the overlap: compute runs while a collective is in flight, where
    # without the pass every collective is waited on at once (its peak-memory re-sort
    # must not undo the order).
    assert sum(g["compute_in_flight"] for g in on) > sum(g["compute_in_flight"] for g in off)
