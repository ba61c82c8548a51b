"""Keeps :func:`~torchnext.compile.overlap.simple_overlap`'s order through Inductor's scheduler.

On 2.13 the overlap pass reorders the post-grad FX graph, and then Inductor's scheduler
re-sorts the lowered nodes for peak memory (``reorder_for_peak_memory``, on by default):
it picks the order with the lowest peak among a few topological sorts, which puts a
collective back after all the compute and its wait right after it, undoing the overlap.
2.14 avoids this by running its pass inside the scheduler, after that re-sort. This module
is the 2.13 equivalent: a scheduler pass that Inductor runs after its re-sort
(``torchnext.compat.inductor_passes`` registers it with the FX pass) and that puts the
scheduler nodes back into the FX pass's order. Equivalent Python::

    if graph_was_reordered_by_simple_overlap:
        kept = topological_sort(nodes, priority=position_of_origin_in_fx_graph)
        if collectives_in(kept) == collectives_in(nodes) and peak(kept) <= peak(nodes):
            nodes = kept

where ``peak`` is Inductor's own estimate (the one its re-sort minimises), so the 2.14
guarantee holds by Inductor's measure: the kept order never raises the scheduled peak.

What not to assume: it acts only on graphs the FX pass reordered (others keep Inductor's
order untouched); a node lowered without an FX origin stays right after the node it
followed; where keeping the order would raise the peak it keeps Inductor's order whole
(no partial keep) and says so in the graph's ``OverlapReport``.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any

from torchnext.compat.inductor_passes import (
    scheduler_node_inputs,
    scheduler_node_is_collective,
    scheduler_node_is_wait,
    scheduler_node_origins,
    scheduler_peak_bytes,
)
from torchnext.compile.overlap import report_for

__all__ = ["keep_fx_order"]

log = logging.getLogger(__name__)

# Each try costs one peak estimate over the whole graph; this bounds the pass on graphs
# with long runs of compute between collectives.
_MAX_TRIES_PER_COLLECTIVE = 32


def _fx_priorities(snodes: list[Any]) -> tuple[Any, list[float]] | None:
    """The reordered FX graph these nodes come from, and each node's position in it."""
    graph = None
    for snode in snodes:
        for origin in scheduler_node_origins(snode):
            if report_for(origin.graph) is not None:
                graph = origin.graph
                break
        if graph is not None:
            break
    if graph is None:
        return None
    position = {node: i for i, node in enumerate(graph.nodes)}
    priorities: list[float] = []
    previous = -1.0
    for snode in snodes:
        found = [position[o] for o in scheduler_node_origins(snode) if o in position]
        # No origin (a buffer Inductor made up): keep it right after the node it followed.
        previous = float(min(found)) if found else previous + 1e-6
        priorities.append(previous)
    return graph, priorities


def _topological(snodes: list[Any], priorities: list[float]) -> list[Any]:
    """Kahn's sort of ``snodes`` taking, among the nodes whose inputs ran, the lowest priority."""
    inputs = scheduler_node_inputs(snodes)
    index = {n: i for i, n in enumerate(snodes)}
    users: dict[Any, list[Any]] = {n: [] for n in snodes}
    waiting = {n: len(inputs[n]) for n in snodes}
    for node, deps in inputs.items():
        for dep in deps:
            users[dep].append(node)
    ready = [(priorities[i], i) for i, n in enumerate(snodes) if waiting[n] == 0]
    heapq.heapify(ready)
    order: list[Any] = []
    while ready:
        _, i = heapq.heappop(ready)
        node = snodes[i]
        order.append(node)
        for user in users[node]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (priorities[index[user]], index[user]))
    if len(order) != len(snodes):
        raise RuntimeError(f"keep_fx_order: a dependency cycle among {len(snodes)} nodes")  # a bug
    return order


def _segment_start(order: list[Any], i: int) -> int:
    """Where the run of compute before ``order[i]`` begins (after a collective or wait)."""
    start = i
    while start > 0 and not (
        scheduler_node_is_collective(order[start - 1]) or scheduler_node_is_wait(order[start - 1])
    ):
        start -= 1
    return start


def _hoist_in_budget(order: list[Any], peak_bound: int, inputs: dict[Any, set[Any]]) -> int:
    """For each collective, move compute it does not need from before it to after it, one
    node at a time (the latest first), keeping each move whose order stays within
    ``peak_bound`` by Inductor's estimate. Edits ``order``; returns the nodes moved."""
    moved_total = 0
    for coll in [n for n in order if scheduler_node_is_collective(n)]:
        i = order.index(coll)
        start = _segment_start(order, i)
        head, segment, tail = order[:start], order[start:i], order[i + 1 :]
        needed: set[Any] = set(inputs[coll])
        for node in reversed(segment):
            if node in needed:
                needed.update(inputs[node])
        moved: list[Any] = []
        for tries, node in enumerate(reversed(segment)):
            if tries >= _MAX_TRIES_PER_COLLECTIVE:
                break
            users_here = [u for u in segment if node in inputs[u]]
            if node in needed or any(u not in moved for u in users_here):
                continue  # it feeds the collective, or a user of it stays before
            trial = [node, *moved]
            stay = [n for n in segment if n not in trial]
            after = [n for n in segment if n in trial]
            candidate = [*head, *stay, coll, *after, *tail]
            if scheduler_peak_bytes(candidate) <= peak_bound:
                moved = trial
                order[:] = candidate
        moved_total += len(moved)
    return moved_total


def keep_fx_order(snodes: list[Any]) -> list[Any]:
    """Inductor scheduler pass: ``snodes`` in the overlap pass's order; see the module doc.

    Registered in ``torch._inductor.config.reorder_for_compute_comm_overlap_passes`` by
    ``enable_simple_overlap()`` on torch without a native pass. Where the FX pass's whole
    order would raise Inductor's peak estimate, it starts from Inductor's order and moves
    the compute each collective does not need after it, one node at a time, as far as
    the estimate allows.
    """
    found = _fx_priorities(snodes)
    if found is None:
        return snodes  # not a graph the overlap pass ran on
    graph, priorities = found
    report = report_for(graph)
    if report is None:
        return snodes
    try:
        order, why = _keep(snodes, priorities)
    except Exception as exc:  # never break a compile: Inductor's own order is always safe
        log.warning("keep_fx_order: Inductor's order kept: %r (a torchnext bug)", exc)
        report.scheduled = False
        report.notes.append(f"Inductor's order kept: {exc!r}")
        return snodes
    report.scheduled = why == ""
    if why:
        report.notes.append(why)
    log.debug("keep_fx_order: %s", why or "the FX order runs")
    return order


def _keep(snodes: list[Any], priorities: list[float]) -> tuple[list[Any], str]:
    """The order to run and, when it is not the FX pass's, why."""
    collectives = [n for n in snodes if scheduler_node_is_collective(n)]
    peak_inductor = scheduler_peak_bytes(snodes)
    kept = _topological(snodes, priorities)
    if [n for n in kept if scheduler_node_is_collective(n)] != collectives:
        raise RuntimeError("the FX order reorders collectives")
    peak_kept = scheduler_peak_bytes(kept)
    if peak_kept <= peak_inductor:
        return kept, ""
    order = list(snodes)
    moved = _hoist_in_budget(order, peak_inductor, scheduler_node_inputs(order))
    if [n for n in order if scheduler_node_is_collective(n)] != collectives:
        raise RuntimeError("moving compute after collectives reordered them")
    scheduler_peak_bytes(order)  # leave the planning info matching the order returned
    return order, (
        f"the FX order's peak estimate {peak_kept} B exceeds Inductor's {peak_inductor} B: "
        f"Inductor's order runs, with {moved} node(s) moved after their collective within it"
    )
