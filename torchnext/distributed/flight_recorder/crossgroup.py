"""Deadlocks across process groups: ranks that entered collectives of two groups in different orders.

Use it through :func:`torchnext.distributed.fr_analyze.analyze`, which calls
:func:`find_deadlocks` after the per-group analysis. Each group alone only shows that
some of its members never arrived; merged, the groups show why. In the classic case
ranks 0 and 1 call ``A.all_reduce`` then ``B.all_reduce`` while rank 2 calls them the
other way round: 0 and 1 wait in A for rank 2, which waits in B for them.

The analysis, as equivalent Python::

    blocked = {r: first op r did not complete}            # (group, seq) per rank
    waits_for = {r: {q for q in members(blocked[r].group)
                     if blocked[r] not in entered(q)}}   # q never joined r's op
    for cycle in strongly_connected(waits_for):
        if len({blocked[r].group for r in cycle}) >= 2:  # a wait that crosses groups
            order = Counter(blocked[r] for r in cycle)   # each rank's first op
            culprits = [r for r in cycle if blocked[r] != majority(order)]

One ``deadlock`` finding per cycle names the groups and sequence numbers and, as
culprits, the ranks whose cross-group order differs from the majority's; with no
majority (as many ranks on each side) the lowest rank's order is taken and the
finding says ``ambiguous``. The per-group ``missing`` findings that the deadlock
explains are dropped by the caller.

What not to assume: ranks here are the processes' own ranks (the keys of the dumps);
a rank that left no dump cannot be placed in a cycle, and an op the ring buffer
dropped counts as not entered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Deadlock", "find_deadlocks"]

_DONE_STATES = frozenset({"completed"})


class Deadlock:
    """One cycle of ranks waiting on each other across groups."""

    __slots__ = ("ops", "ranks", "blocked", "culprits", "expected", "ambiguous")

    def __init__(
        self,
        ops: tuple[tuple[str, int], ...],
        ranks: tuple[int, ...],
        blocked: dict[int, tuple[str, int]],
        culprits: tuple[int, ...],
        expected: tuple[str, int],
        ambiguous: bool,
    ) -> None:
        self.ops = ops
        self.ranks = ranks
        self.blocked = blocked
        self.culprits = culprits
        self.expected = expected
        self.ambiguous = ambiguous

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(sorted({g for g, _ in self.ops}))

    def message(self, op_names: Mapping[tuple[str, int], str]) -> str:
        def where(op: tuple[str, int]) -> str:
            return f"group {op[0]} collective {op[1]} ({op_names.get(op, '?')})"

        sides: dict[tuple[str, int], list[int]] = {}
        for r, op in sorted(self.blocked.items()):
            sides.setdefault(op, []).append(r)
        waits = "; ".join(
            f"rank(s) {', '.join(map(str, rs))} wait in {where(op)}"
            for op, rs in sorted(sides.items())
        )
        blame = ", ".join(map(str, self.culprits))
        text = (
            f"deadlock across groups {' and '.join(self.groups)}: {waits}, each for ranks "
            f"that are waiting in the other; rank(s) {blame} entered the groups in another "
            f"order than the others, who entered {where(self.expected)} first"
        )
        if self.ambiguous:
            text += " (ambiguous: as many ranks in each order)"
        return text


def _blocked_op(entries: Iterable[dict[str, Any]]) -> tuple[str, int] | None:
    """The first collective (by record order) that this rank entered and did not complete."""
    first: tuple[int, tuple[str, int]] | None = None
    for e in entries:
        if e["is_p2p"] or e["state"] in _DONE_STATES:
            continue
        key = (int(e["record_id"]), (str(e["process_group"][0]), int(e["collective_seq_id"])))
        if first is None or key[0] < first[0]:
            first = key
    return None if first is None else first[1]


def _strongly_connected(graph: dict[int, set[int]]) -> list[list[int]]:
    """Tarjan's components, iteratively (no recursion limit on big jobs)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[int, list[int]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(sorted(comp))
    return out


def find_deadlocks(
    entries_of: Mapping[int, list[dict[str, Any]]], members_of: Mapping[str, Iterable[int]]
) -> list[Deadlock]:
    """Cycles of cross-group waits.

    ``entries_of`` maps each rank that dumped to its recorded entries; ``members_of``
    maps each group name to the ranks (same numbering) that belong to it.
    """
    members = {g: set(rs) for g, rs in members_of.items()}
    entered = {
        r: {
            (str(e["process_group"][0]), int(e["collective_seq_id"])) for e in es if not e["is_p2p"]
        }
        for r, es in entries_of.items()
    }
    blocked = {r: op for r, es in entries_of.items() if (op := _blocked_op(es)) is not None}
    graph: dict[int, set[int]] = {}
    for r, (group, seq) in blocked.items():
        graph[r] = {
            q
            for q in members.get(group, ())
            if q != r and q in blocked and (group, seq) not in entered[q]
        }
    found = []
    for comp in _strongly_connected(graph):
        if len(comp) < 2 or len({blocked[r][0] for r in comp}) < 2:
            continue
        order = Counter(blocked[r] for r in comp)
        top = max(order.values())
        leaders = [op for op, n in order.items() if n == top]
        ambiguous = len(leaders) > 1
        expected = leaders[0] if not ambiguous else blocked[min(comp)]
        culprits = tuple(r for r in comp if blocked[r] != expected)
        found.append(
            Deadlock(
                ops=tuple(sorted(set(order))),
                ranks=tuple(comp),
                blocked={r: blocked[r] for r in comp},
                culprits=culprits,
                expected=expected,
                ambiguous=ambiguous,
            )
        )
    return found
