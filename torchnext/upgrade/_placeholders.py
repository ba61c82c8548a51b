"""Tuple results unpacked with ``_`` placeholders: ``e, _ = torch.symeig(A)``.

Some removed ops returned a tuple whose replacement returns only one of its results
(``symeig`` -> ``linalg.eigvalsh``, ``solve`` -> ``linalg.solve``, ``svd`` ->
``linalg.svdvals``). When every other result of the unpacking is a ``_`` placeholder,
the rewrite is mechanical: the call becomes the single-result replacement and the
assignment keeps only the one target (``e = torch.linalg.eigvalsh(A, UPLO="U")``).
Any other unpacking (two names kept, a starred target, another arity) is left to the
op's usual handling.
"""

from __future__ import annotations

import libcst as cst

__all__ = ["KEEP_ONE", "kept_result", "keep_only"]

KEEP_ONE: dict[str, tuple[int, int]] = {
    "symeig": (2, 0),  # (eigenvalues, eigenvectors) -> linalg.eigvalsh
    "solve": (2, 0),  # (solution, LU) -> linalg.solve
    "triangular_solve": (2, 0),  # (solution, cloned A) -> linalg.solve_triangular
    "svd": (3, 1),  # (U, S, V) -> linalg.svdvals
}
"""Op name -> (number of results, index of the one result its replacement returns)."""


def _is_placeholder(element: cst.BaseElement) -> bool:
    return isinstance(element.value, cst.Name) and element.value.value == "_"


def kept_result(node: cst.Assign, op: str) -> int | None:
    """The index of the one result ``node`` keeps from ``op``'s tuple, when the others are
    ``_`` placeholders and that index is the one the replacement returns; else None."""
    if op not in KEEP_ONE or len(node.targets) != 1:
        return None
    target = node.targets[0].target
    if not isinstance(target, cst.Tuple | cst.List):
        return None
    arity, index = KEEP_ONE[op]
    elements = target.elements
    if len(elements) != arity or any(isinstance(e, cst.StarredElement) for e in elements):
        return None
    kept = [i for i, e in enumerate(elements) if not _is_placeholder(e)]
    return index if kept == [index] else None


def keep_only(node: cst.Assign, index: int) -> cst.Assign:
    """``a, _ = value`` -> ``a = value`` (the target at ``index`` alone)."""
    first = node.targets[0]
    target = first.target
    if not isinstance(target, cst.Tuple | cst.List):
        return node
    kept = target.elements[index].value
    return node.with_changes(targets=[first.with_changes(target=kept)])
