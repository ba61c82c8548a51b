"""keep_fx_order on stand-in scheduler nodes: which order it keeps, and when it steps aside.

Inductor's scheduler nodes are replaced by small stand-ins (one per FX node, with the FX
node as origin and its inputs as dependencies), and Inductor's peak estimate by a function
of the order, so each rule is checked on its own; the compiled program in
``test_overlap.py`` checks the whole with Inductor's real scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_overlap import names, short, tp_backward_like

from torchnext.compile import is_collective, is_wait, keep_fx_order, simple_overlap
from torchnext.compile import schedule as schedule_module


class StandIn:
    """What keep_fx_order reads of an Inductor scheduler node."""

    def __init__(self, fx: torch.fx.Node) -> None:
        self.fx = fx
        self.node = SimpleNamespace(origins={fx})
        self.unmet_dependencies = [
            SimpleNamespace(name=i.name) for i in fx.all_input_nodes if i.op == "call_function"
        ]

    def get_nodes(self) -> list[StandIn]:
        return [self]

    def get_buffer_names(self) -> set[str]:
        return {self.fx.name}


def stand_ins(graph: torch.fx.Graph) -> list[StandIn]:
    return [StandIn(n) for n in graph.nodes if n.op == "call_function"]


def fx_names(order: list[Any]) -> list[str]:
    return [s.fx.name for s in order]


@pytest.fixture
def peak(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[list[str]], int]], None]:
    """Install a stand-in for Inductor's peak estimate (a function of the node names)."""
    monkeypatch.setattr(
        schedule_module, "scheduler_node_is_collective", lambda s: is_collective(s.fx)
    )
    monkeypatch.setattr(schedule_module, "scheduler_node_is_wait", lambda s: is_wait(s.fx))

    def use(estimate: Callable[[list[str]], int]) -> None:
        monkeypatch.setattr(
            schedule_module, "scheduler_peak_bytes", lambda o: estimate(fx_names(o))
        )

    return use


def test_the_fx_order_comes_back_when_the_peak_allows(peak: Any) -> None:
    g = tp_backward_like()
    inductor_order = stand_ins(g)  # the order before the pass, as Inductor's re-sort left it
    report = simple_overlap(g)
    peak(lambda order: 0)
    kept = keep_fx_order(inductor_order)
    assert fx_names(kept) == names(g) != fx_names(inductor_order)
    assert report.scheduled is True


def test_within_the_peak_only_what_fits_moves_after_the_collective(peak: Any) -> None:
    g = tp_backward_like()
    inductor_order = stand_ins(g)
    report = simple_overlap(g)
    dw2 = short(["mm_1"])[0]
    ar = short(["ar"])[0]
    # Running dw2 while the all-reduce is in flight raises the peak; dw1 does not.
    peak(lambda order: 1 if order.index(dw2) > order.index(ar) else 0)
    kept = keep_fx_order(inductor_order)
    assert fx_names(kept) == short(["mm", "mm_1", "mm_2", "ar", "mm_3", "wait", "relu", "add"])
    assert report.scheduled is False
    assert "1 node(s) moved after their collective" in report.notes[-1]


def test_inductors_order_stays_when_nothing_fits(peak: Any) -> None:
    g = tp_backward_like()
    inductor_order = stand_ins(g)
    simple_overlap(g)
    ar = short(["ar"])[0]
    peak(lambda order: len(order) - order.index(ar))  # compute after the all-reduce costs
    assert fx_names(keep_fx_order(inductor_order)) == fx_names(inductor_order)


def test_a_failure_inside_keeps_inductors_order_and_says_so(peak: Any) -> None:
    g = tp_backward_like()
    inductor_order = stand_ins(g)
    report = simple_overlap(g)

    def broken(order: list[str]) -> int:
        raise RuntimeError("estimate failed")

    peak(broken)
    assert keep_fx_order(inductor_order) is inductor_order
    assert report.scheduled is False and "estimate failed" in report.notes[-1]


def test_a_graph_the_pass_did_not_see_is_left_alone(peak: Any) -> None:
    g = tp_backward_like()
    order = stand_ins(g)

    def not_called(order: list[str]) -> int:
        raise AssertionError("a graph the overlap pass never saw was scheduled")

    peak(not_called)
    assert keep_fx_order(order) is order
