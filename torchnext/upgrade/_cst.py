"""Small LibCST helpers shared by the fixers: names, literals, argument binding, calls.

Imported only when libcst is installed (the package's ``__init__`` never imports it).
Builders produce compact code (``f(a, k=v)``); editors that only drop, rename or add a
keyword keep the layout of the other arguments, so multi-line calls stay multi-line.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

__all__ = [
    "Unbindable",
    "bind",
    "bool_literal",
    "int_literal",
    "str_literal",
    "dotted",
    "dotted_name",
    "kwarg",
    "make_call",
    "drop_kwargs",
    "set_kwarg",
    "paren_if_needed",
    "negate",
    "has_star_args",
    "find_kwarg",
]

_NO_SPACE = cst.SimpleWhitespace("")


class Unbindable(Exception):
    """The call's arguments cannot be matched to parameters statically."""


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a chain of Names/Attributes; None for anything else."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def dotted(path: str) -> cst.BaseExpression:
    """``"torch.linalg.qr"`` -> the Attribute chain."""
    head, *rest = path.split(".")
    node: cst.BaseExpression = cst.Name(head)
    for part in rest:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def bool_literal(node: cst.BaseExpression | None) -> bool | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def int_literal(node: cst.BaseExpression | None) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        return -int(node.expression.evaluated_value)
    return None


def str_literal(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def has_star_args(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


def find_kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def bind(
    call: cst.Call,
    positional: Sequence[str],
    keyword_only: Sequence[str] = (),
    receiver: cst.BaseExpression | None = None,
) -> dict[str, cst.BaseExpression]:
    """Map parameter names to argument expressions (the receiver fills the first one).

    Raises :class:`Unbindable` for ``*args``/``**kwargs``, unknown keywords, too many
    positionals or a parameter given twice.
    """
    bound: dict[str, cst.BaseExpression] = {}
    slots = list(positional)
    if receiver is not None:
        if not slots:
            raise Unbindable("no parameter for the receiver")
        bound[slots.pop(0)] = receiver
    index = 0
    for arg in call.args:
        if arg.star:
            raise Unbindable("starred argument")
        if arg.keyword is None:
            if index >= len(slots):
                raise Unbindable("too many positional arguments")
            name = slots[index]
            index += 1
        else:
            name = arg.keyword.value
            if name not in positional and name not in keyword_only:
                raise Unbindable(f"unknown keyword {name!r}")
        if name in bound:
            raise Unbindable(f"{name!r} given twice")
        bound[name] = arg.value
    return bound


def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE),
    )


def make_call(
    func: cst.BaseExpression,
    positional: Sequence[cst.BaseExpression] = (),
    keywords: Sequence[tuple[str, cst.BaseExpression | None]] = (),
) -> cst.Call:
    """``func(p0, p1, k=v, ...)``; keywords whose value is None are left out."""
    args = [cst.Arg(value=p) for p in positional]
    args += [kwarg(k, v) for k, v in keywords if v is not None]
    return cst.Call(func=func, args=args)


def drop_kwargs(call: cst.Call, names: Sequence[str]) -> cst.Call:
    """Remove keyword arguments, keeping the others' layout (and a trailing comma).

    A comment after an argument's comma lives in that comma's whitespace, so a removed
    argument takes its own comment with it and its neighbours keep theirs.
    """
    args = list(call.args)
    for i in range(len(args) - 1, -1, -1):
        arg = args[i]
        if arg.keyword is not None and arg.keyword.value in names:
            if i == len(args) - 1 and i > 0:
                args[i - 1] = _take_over_end(args[i - 1], arg)
            del args[i]
    return call.with_changes(args=args)


def _take_over_end(prev: cst.Arg, last: cst.Arg) -> cst.Arg:
    """``prev`` becomes the last argument: it keeps its own comment and takes the removed
    last argument's trailing comma (or none) and the line break before the ``)``."""
    own = prev.comma.whitespace_after if isinstance(prev.comma, cst.Comma) else None
    if isinstance(last.comma, cst.Comma):
        end = _keep_comment(own, last.comma.whitespace_after)
        before = prev.comma.whitespace_before if isinstance(prev.comma, cst.Comma) else None
        comma = last.comma.with_changes(whitespace_after=end)
        if before is not None:
            comma = comma.with_changes(whitespace_before=before)
        return prev.with_changes(comma=comma)
    end = _keep_comment(own, last.whitespace_after_arg)
    return prev.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=end)


def _keep_comment(
    own: cst.BaseParenthesizableWhitespace | None, end: cst.BaseParenthesizableWhitespace
) -> cst.BaseParenthesizableWhitespace:
    """The line break before the ``)`` (``end``), carrying the comment of ``own``'s line."""
    if not isinstance(own, cst.ParenthesizedWhitespace):
        return end
    if isinstance(end, cst.ParenthesizedWhitespace):
        # Own-line comments above the removed argument are kept: only its trailing one goes.
        return end.with_changes(
            first_line=own.first_line, empty_lines=[*own.empty_lines, *end.empty_lines]
        )
    return own


def set_kwarg(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """Replace the value of keyword ``name``, or append ``name=value`` keeping the layout."""
    args = list(call.args)
    for i, arg in enumerate(args):
        if arg.keyword is not None and arg.keyword.value == name:
            args[i] = arg.with_changes(value=value)
            return call.with_changes(args=args)
    new = kwarg(name, value)
    if args:
        last = args[-1]
        if isinstance(last.comma, cst.Comma):
            # Trailing comma: the new argument goes on its own line, like the others.
            ws = call.whitespace_before_args
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=ws))
            new = new.with_changes(comma=last.comma)
    args.append(new)
    return call.with_changes(args=args)


_ATOMS = (
    cst.Name,
    cst.Attribute,
    cst.Call,
    cst.Subscript,
    cst.Integer,
    cst.Float,
    cst.SimpleString,
    cst.List,
    cst.Tuple,
)


def paren_if_needed(node: cst.BaseExpression) -> cst.BaseExpression:
    """Wrap ``node`` in parentheses unless it is an atom (safe as ``node.attr`` / operand)."""
    if isinstance(node, _ATOMS) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def negate(node: cst.BaseExpression) -> cst.BaseExpression:
    """``not node``, folding a boolean literal."""
    lit = bool_literal(node)
    if lit is not None:
        return cst.Name("False" if lit else "True")
    return cst.UnaryOperation(operator=cst.Not(), expression=paren_if_needed(node))
