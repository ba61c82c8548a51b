"""torch 2.14's simple compute/communication overlap, as a pass over a post-grad FX graph.

In a compiled graph that holds functional collectives (tensor parallel or FSDP2 under
``torch.compile``), each collective is issued where its result was first needed and
waited on right away, so the compute around it cannot hide it. 2.14 turns on
``aten_distributed_optimizations.enable_simple_overlap``; :func:`simple_overlap` does
the same reordering on 2.13, on the FX graph, through adjacent swaps:

* a collective moves earlier, one node at a time, until the node before it produces
  one of its inputs, is another collective or wait, or has side effects;
* a wait moves later until the node after it uses its result (or an alias of it), is
  another collective or wait, or has side effects;
* a swap is refused when it would raise the estimated peak memory of the graph;
* beyond 2.14 (``hoist_inputs=True``, the default): where a collective meets its own
  inputs, the nodes between it and the previous collective, wait or side effect that it
  does not depend on move after it, so they run while it is in flight (2.14 leaves
  them before it, with nothing left to hide the collective).

So collectives keep their order against each other, no value changes (only the order
of independent nodes), and the peak memory estimate never grows. Equivalent Python::

    for node in collectives(graph):
        while can_swap(previous(node), node) and peak_after_swap <= peak:
            swap(previous(node), node)
    for node in reversed(waits(graph)):
        while can_swap(node, following(node)) and peak_after_swap <= peak:
            swap(node, following(node))

What not to assume: the memory estimate is this module's own (tensor sizes from
``node.meta["val"]``, views alias their base, graph inputs are never freed); a graph
it cannot size is left unchanged, and the reason is logged at debug level. It does no
runtime estimation: it moves as far as is safe, not as far as is useful.
"""

from __future__ import annotations

import logging
import operator
import weakref
from dataclasses import dataclass, field

import torch
import torch.fx

from torchnext.compat.inductor_passes import op_namespace, op_schema

__all__ = ["OverlapReport", "simple_overlap", "is_collective", "is_wait", "report_for"]

log = logging.getLogger(__name__)

_FUNCTIONAL_COLLECTIVES = "_c10d_functional"


@dataclass(slots=True)
class OverlapReport:
    """What one run of :func:`simple_overlap` did to a graph."""

    collectives: int = 0
    """Collectives found."""
    waits: int = 0
    """Waits found."""
    collective_swaps: int = 0
    """Adjacent swaps that moved a collective earlier."""
    wait_swaps: int = 0
    """Adjacent swaps that moved a wait later."""
    hoisted: int = 0
    """Positions collectives moved up by computing their own inputs first (beyond 2.14)."""
    refused_for_memory: int = 0
    """Swaps refused because they would raise the peak memory estimate."""
    peak_bytes: int = 0
    """The graph's estimated peak memory (unchanged by the pass)."""
    skipped: str = ""
    """Why the graph was left as it is; empty when the pass ran."""
    order: list[str] = field(default_factory=list)
    """The collectives' names in the order they run (the same before and after)."""
    notes: list[str] = field(default_factory=list)
    """Per-collective remarks (why one did not move further)."""
    scheduled: bool | None = None
    """Whether Inductor's scheduler runs this order (``torchnext.compile.schedule``): None
    until the graph is scheduled, False where keeping it would raise Inductor's own
    peak-memory estimate (then Inductor's memory order runs, and ``notes`` says so)."""


# The graphs this pass ran on, with what it did: the scheduler pass acts only on these
# (every other graph keeps Inductor's own order).
_reports: weakref.WeakKeyDictionary[torch.fx.Graph, OverlapReport] = weakref.WeakKeyDictionary()


def report_for(graph: torch.fx.Graph) -> OverlapReport | None:
    """What :func:`simple_overlap` did to ``graph``; None when it did not run on it (no
    collectives, no memory estimate, or the pass was off)."""
    return _reports.get(graph)


def _namespace(node: torch.fx.Node) -> str:
    return op_namespace(node.target)


def is_wait(node: torch.fx.Node) -> bool:
    """A ``_c10d_functional.wait_tensor`` call."""
    return (
        node.op == "call_function" and node.target is torch.ops._c10d_functional.wait_tensor.default
    )


def is_collective(node: torch.fx.Node) -> bool:
    """A functional collective (``all_reduce``, ``all_gather_into_tensor``...), not a wait."""
    return (
        node.op == "call_function"
        and _namespace(node) == _FUNCTIONAL_COLLECTIVES
        and not is_wait(node)
    )


def _has_side_effects(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return node.op != "get_attr"
    schema = op_schema(node.target)
    if schema is not None:
        return bool(schema.is_mutable) and not is_collective(node)
    return bool(node.is_impure())


def _is_view(node: torch.fx.Node) -> bool:
    if is_wait(node) or node.target is operator.getitem:
        return True  # a wait returns the collective's buffer; getitem picks one output
    schema = op_schema(node.target) if node.op == "call_function" else None
    if schema is None:
        return False
    return any(r.alias_info is not None for r in schema.returns)


def _nbytes(node: torch.fx.Node) -> int | None:
    if "val" not in node.meta:
        return None
    val = node.meta["val"]
    values = val if isinstance(val, (list, tuple)) else [val]
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            numel = v.numel()
            if not isinstance(numel, int):
                return None  # a symbolic size: no estimate
            total += numel * v.element_size()
        elif v is not None and not isinstance(v, (int, float, bool, torch.SymInt)):
            return None
    return total


class _Memory:
    """Live bytes along one node order; answers "does swapping i and i+1 raise the peak?"."""

    def __init__(self, order: list[torch.fx.Node]) -> None:
        self.order = order
        self.root: dict[torch.fx.Node, torch.fx.Node] = {}
        self.size: dict[torch.fx.Node, int] = {}
        self.uses: dict[torch.fx.Node, set[torch.fx.Node]] = {}
        self.pinned: set[torch.fx.Node] = set()
        for node in order:
            if _is_view(node) and node.all_input_nodes:
                self.root[node] = self.root.get(node.all_input_nodes[0], node.all_input_nodes[0])
                self.size[node] = 0
            else:
                self.root[node] = node
                nbytes = (
                    _nbytes(node) if node.op not in ("output", "placeholder", "get_attr") else 0
                )
                if nbytes is None:
                    raise ValueError(f"cannot size {node.format_node()}")
                self.size[node] = nbytes
            self.uses.setdefault(self.root[node], set())
            for inp in node.all_input_nodes:
                self.uses.setdefault(self.root[inp], set()).add(node)
            if node.op in ("placeholder", "get_attr"):
                self.pinned.add(node)
            if node.op == "output":
                self.pinned.update(self.root[i] for i in node.all_input_nodes)
        self.position = {n: i for i, n in enumerate(order)}
        self.after = self._timeline()
        self.peak = max(self.after, default=0)

    def _freed_at(self, node: torch.fx.Node, position: dict[torch.fx.Node, int]) -> int:
        """Bytes freed right after ``node`` runs (buffers whose last use it is)."""
        freed = 0
        here = position[node]
        for buf in {self.root[i] for i in node.all_input_nodes} | {self.root[node]}:
            if buf in self.pinned:
                continue
            last = max((position[u] for u in self.uses[buf]), default=position[buf])
            if last == here and position[buf] <= here:
                freed += self.size[buf]
        return freed

    def _timeline(self) -> list[int]:
        live, after = 0, []
        for node in self.order:
            live += self.size[node] - self._freed_at(node, self.position)
            after.append(live)
        return after

    def swap_keeps_peak(self, i: int) -> bool:
        """Would running ``order[i + 1]`` before ``order[i]`` keep the peak?"""
        a, b = self.order[i], self.order[i + 1]
        position = dict(self.position)
        position[a], position[b] = i + 1, i
        before = self.after[i - 1] if i > 0 else 0
        middle = before + self.size[b] - self._freed_at(b, position)
        return middle <= self.peak

    def swap(self, i: int) -> None:
        a, b = self.order[i], self.order[i + 1]
        self.order[i], self.order[i + 1] = b, a
        self.position[a], self.position[b] = i + 1, i
        before = self.after[i - 1] if i > 0 else 0
        self.after[i] = before + self.size[b] - self._freed_at(b, self.position)


def _barrier(node: torch.fx.Node) -> bool:
    return (
        node.op in ("placeholder", "output")
        or is_collective(node)
        or is_wait(node)
        or _has_side_effects(node)
    )


def _hoist_inputs(memory: _Memory, coll: torch.fx.Node, bound: int) -> _Memory | None:
    """The order with ``coll``'s own inputs computed first in its segment, or None.

    The segment runs back from ``coll`` to the previous barrier. Nodes in it that
    ``coll`` does not depend on move, in their order, to right after ``coll``; those it
    depends on stay before it, in their order. None when nothing moves or the peak grows.
    """
    i = memory.position[coll]
    start = i
    while start > 0 and not _barrier(memory.order[start - 1]):
        start -= 1
    segment = memory.order[start:i]
    needed: set[torch.fx.Node] = set(coll.all_input_nodes)
    for node in reversed(segment):
        if node in needed:
            needed.update(node.all_input_nodes)
    before = [n for n in segment if n in needed]
    after = [n for n in segment if n not in needed]
    if not after or not before:
        return None  # nothing independent to move, or nothing left to compute first
    order = [*memory.order[:start], *before, coll, *after, *memory.order[i + 1 :]]
    candidate = _Memory(order)
    if candidate.peak > bound:
        return None
    candidate.peak = bound
    return candidate


def simple_overlap(graph: torch.fx.Graph, *, hoist_inputs: bool = True) -> OverlapReport:
    """Move collectives earlier and waits later in ``graph`` (in place); see the module doc.

    Args:
        hoist_inputs: also compute each collective's own inputs first within its segment
            (the nodes back to the previous collective, wait or side effect), so compute
            that does not feed it runs while it is in flight. 2.14's pass stops where a
            collective meets its inputs; this goes one step further, with the same
            guarantees (order of collectives, peak memory estimate, values).
    """
    report = OverlapReport()
    order = list(graph.nodes)
    report.collectives = sum(map(is_collective, order))
    report.waits = sum(map(is_wait, order))
    if not report.collectives and not report.waits:
        report.skipped = "no collectives"
        return report
    try:
        memory = _Memory(order)
    except ValueError as exc:
        report.skipped = f"left unchanged: {exc} (no tensor metadata for the memory estimate)"
        log.debug("simple_overlap: %s", report.skipped)
        return report
    report.peak_bytes = memory.peak
    report.order = [n.name for n in order if is_collective(n)]
    for coll in [n for n in order if is_collective(n)]:
        i = memory.position[coll]
        inputs = set(coll.all_input_nodes)
        while i > 0:
            prev = memory.order[i - 1]
            if prev in inputs or _barrier(prev):
                break
            if not memory.swap_keeps_peak(i - 1):
                report.refused_for_memory += 1
                break
            memory.swap(i - 1)
            report.collective_swaps += 1
            i -= 1
        if hoist_inputs:
            hoisted = _hoist_inputs(memory, coll, report.peak_bytes)
            if hoisted is not None:
                report.hoisted += memory.position[coll] - hoisted.position[coll]
                memory = hoisted
            else:
                report.notes.append(f"{coll.name}: no independent compute moved after it")
    for wait in reversed([n for n in order if is_wait(n)]):
        i = memory.position[wait]
        aliases = {n for n in memory.order if memory.root[n] is memory.root[wait]}
        while i + 1 < len(memory.order):
            nxt = memory.order[i + 1]
            if _barrier(nxt) or any(a in nxt.all_input_nodes for a in aliases | {wait}):
                break
            if not memory.swap_keeps_peak(i):
                report.refused_for_memory += 1
                break
            memory.swap(i)
            report.wait_swaps += 1
            i += 1
    if [n.name for n in memory.order if is_collective(n)] != report.order:
        raise RuntimeError(f"simple_overlap reordered collectives: {report.order}")  # a bug
    if report.collective_swaps or report.wait_swaps or report.hoisted:
        _reorder(graph, memory.order)
    _reports[graph] = report
    log.debug("simple_overlap: %s", report)
    return report


def _reorder(graph: torch.fx.Graph, order: list[torch.fx.Node]) -> None:
    cursor = order[0]
    for node in order[1:]:
        if cursor.next is not node:
            cursor.append(node)
        cursor = node
    graph.lint()
