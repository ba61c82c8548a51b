"""Translate a 2.14 ``ShapesSpec`` for torch 2.13's export (``Dim``) and ``make_fx``.

torch 2.13 has the spec types but its exporter only understands ``torch.export.Dim``
and its ``make_fx`` has no ``dynamic_shapes=``. This module maps one onto the other:
each ``ShapeVar``/``IntVar`` becomes one ``Dim`` (or one symbol), shared wherever the
spec shares it; ``a*V + b`` becomes a derived ``Dim`` (or an equality check); an int
pins the dim; ``STATIC`` leaves it static. What cannot be expressed fails with
:class:`~torchnext.errors.DynamicSpecError` rather than being dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch.fx.experimental.dynamic_spec import IntVar, ShapesSpec, TensorSpec

from torchnext.compat import control_flow_internals as internals
from torchnext.errors import DynamicSpecError

__all__ = ["spec_to_dims", "symbolic_make_fx"]


def _leaves(spec: ShapesSpec) -> dict[str, Any]:
    params = internals.spec_params(spec)
    named = internals.spec_named_args(params)
    if internals.spec_has_var_args(params):
        raise DynamicSpecError(
            "on torch 2.13 the '*args'/'**kwargs' entries of a ParamsSpec cannot be "
            "translated for export/make_fx; name the parameters explicitly."
        )
    if spec.assumptions:
        raise DynamicSpecError(
            f"ShapesSpec assumptions {spec.assumptions} cannot be expressed with "
            "torch 2.13's export/make_fx; drop them (check them in the model with "
            "torch._check) or use torch >= 2.14."
        )
    return named


def _bind(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    return dict(inspect.signature(fn).bind(*args, **kwargs).arguments)


def _unknown_keys(named: dict[str, Any], bound: dict[str, Any]) -> None:
    unknown = sorted(set(named) - set(bound))
    if unknown:
        raise DynamicSpecError(
            f"ParamsSpec has entries {unknown} that do not match any argument passed to "
            "export(). Spec keys must be forward parameter names that were actually "
            f"passed. Inputs received: {sorted(bound)}."
        )


def _var_of(entry: Any) -> tuple[IntVar | None, sympy.Expr | None]:
    """(base variable, expression) for a dim entry that is a var or an expression in one."""
    if isinstance(entry, IntVar):
        return entry, None
    expr = entry.node.expr
    return None, expr


def _linear(expr: sympy.Expr, where: str) -> tuple[sympy.Symbol, int, int]:
    free = list(expr.free_symbols)
    if len(free) != 1:
        raise DynamicSpecError(
            f"{where}: expression {expr} must use exactly one ShapeVar to be expressed as a "
            "torch.export.Dim on torch 2.13"
        )
    sym = free[0]
    poly = sympy.Poly(expr, sym)
    if poly.degree() != 1:
        raise DynamicSpecError(
            f"{where}: expression {expr} is not linear (a*V + b); torch 2.13's Dim cannot "
            "express it"
        )
    a, b = (int(c) for c in poly.all_coeffs())
    return sym, a, b


def spec_to_dims(
    spec: ShapesSpec, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """``dynamic_shapes`` for ``torch.export.export`` (2.13) equivalent to ``spec``."""
    from torch.export import Dim

    named = _leaves(spec)
    bound = _bind(fn, args, kwargs)
    _unknown_keys(named, bound)
    by_symbol: dict[sympy.Symbol, Any] = {}
    vars_by_symbol: dict[sympy.Symbol, IntVar] = {}

    def dim_for(var: IntVar) -> Any:
        sym = var.node.expr
        if sym not in by_symbol:
            lo = var.min if var.min is not None else 0
            name = f"{var.name or 'v'}_{len(by_symbol)}"
            by_symbol[sym] = (
                Dim(name, min=max(lo, 0), max=var.max) if var.max else Dim(name, min=max(lo, 0))
            )
            vars_by_symbol[sym] = var
        return by_symbol[sym]

    result: dict[str, Any] = {name: None for name in bound}
    # Base variables first, so derived dims find their root.
    for leaf in named.values():
        if isinstance(leaf, TensorSpec):
            for entry in internals.spec_dims(leaf):
                if isinstance(entry, IntVar):
                    dim_for(entry)
    for name, leaf in named.items():
        value = bound[name]
        if isinstance(leaf, IntVar) or not isinstance(leaf, TensorSpec):
            raise DynamicSpecError(
                f"spec for argument {name!r} is {type(leaf).__name__}; torch 2.13's export "
                "only takes TensorSpec entries (ints are specialised)."
            )
        if not isinstance(value, torch.Tensor):
            raise DynamicSpecError(
                f"{name}: spec is TensorSpec but the actual arg is {type(value).__name__}, "
                "not a Tensor."
            )
        dims = internals.spec_dims(leaf)
        if len(dims) != value.dim():
            raise DynamicSpecError(
                f"TensorSpec has {len(dims)} dims but tensor {name!r} has {value.dim()} dims"
            )
        per_dim: dict[int, Any] = {}
        for d, entry in enumerate(dims):
            if entry is None:
                continue
            if isinstance(entry, int) and not isinstance(entry, torch.SymInt):
                if int(value.shape[d]) != entry:
                    raise DynamicSpecError(
                        f"shapes_spec declares dim {d} as static with value {entry}, but got "
                        f"{int(value.shape[d])} (argument {name!r})"
                    )
                continue
            var, expr = _var_of(entry)
            if var is not None:
                per_dim[d] = dim_for(var)
                continue
            assert_expr = expr
            sym, a, b = _linear(assert_expr, f"argument {name!r} dim {d}")  # type: ignore[arg-type]
            if sym not in by_symbol:
                raise DynamicSpecError(
                    f"argument {name!r} dim {d}: {expr} uses a variable no other dim "
                    "declares directly; torch 2.13's Dim needs the root dim declared too."
                )
            per_dim[d] = a * by_symbol[sym] + b
        result[name] = per_dim or None
    return result


def symbolic_make_fx(
    f: Callable[..., Any], spec: ShapesSpec, **make_fx_kwargs: Any
) -> Callable[..., torch.fx.GraphModule]:
    """A tracer: given example args, trace ``f`` with the spec's dims symbolic (2.13)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
        StrictMinMaxConstraint,
    )

    ValueRanges = internals.value_ranges_type()

    named = _leaves(spec)

    def trace(*args: Any, **kwargs: Any) -> torch.fx.GraphModule:
        bound = _bind(f, args, kwargs)
        _unknown_keys(named, bound)
        shape_env = ShapeEnv()
        fake_mode = internals.FakeTensorMode(shape_env=shape_env)
        roots: dict[sympy.Symbol, Any] = {}
        derived: list[tuple[Any, sympy.Expr, str]] = []
        fakes: dict[str, Any] = {}
        for name, value in bound.items():
            leaf = named.get(name)
            if not isinstance(value, torch.Tensor):
                fakes[name] = value
                continue
            if not isinstance(leaf, TensorSpec):
                fakes[name] = fake_mode.from_tensor(value, static_shapes=True)
                continue
            dims = internals.spec_dims(leaf)
            if len(dims) != value.dim():
                raise DynamicSpecError(
                    f"TensorSpec has {len(dims)} dims but tensor {name!r} has {value.dim()} dims"
                )
            dynamic: list[Any] = []
            constraints: list[Any] = []
            for d, entry in enumerate(dims):
                if entry is None or (
                    isinstance(entry, int) and not isinstance(entry, torch.SymInt)
                ):
                    if entry is not None and int(value.shape[d]) != entry:
                        raise DynamicSpecError(
                            f"shapes_spec declares dim {d} as static with value {entry}, but "
                            f"got {int(value.shape[d])} (argument {name!r})"
                        )
                    dynamic.append(DimDynamic.STATIC)
                    constraints.append(None)
                    continue
                dynamic.append(DimDynamic.DYNAMIC)
                if isinstance(entry, IntVar):
                    lo = entry.min if entry.min is not None else 0
                    hi = entry.max if entry.max is not None else sympy.oo
                    constraints.append(
                        StrictMinMaxConstraint(warn_only=False, vr=ValueRanges(lo, hi))
                    )
                else:
                    constraints.append(None)
            ctx: Any = StatelessSymbolicContext(dynamic_sizes=dynamic, constraint_sizes=constraints)
            fake = fake_mode.from_tensor(value, symbolic_context=ctx)
            fakes[name] = fake
            for d, entry in enumerate(dims):
                if isinstance(entry, IntVar):
                    sym = entry.node.expr
                    if sym in roots:
                        torch._check(fake.size(d) == roots[sym])
                    else:
                        roots[sym] = fake.size(d)
                elif isinstance(entry, torch.SymInt):
                    derived.append((fake.size(d), entry.node.expr, f"{name} dim {d}"))
        for size, expr, where in derived:
            missing = [s for s in expr.free_symbols if s not in roots]
            if missing:
                raise DynamicSpecError(
                    f"{where}: {expr} uses {missing}, which no dim declares directly"
                )
            value_expr = expr.subs({s: roots[s].node.expr for s in expr.free_symbols})
            torch._check(size.node.expr == value_expr or size == _to_symint(value_expr, roots))
        ordered = [fakes[n] for n in bound]

        def flat_call(*flat: Any) -> Any:
            # make_fx counts a bound method's `self`; a plain *args function avoids that.
            return f(*flat)

        with fake_mode:
            raw = getattr(make_fx, "__torchnext_original__", make_fx)
            return raw(flat_call, tracing_mode="fake", **make_fx_kwargs)(*ordered)

    return trace


def _to_symint(expr: sympy.Expr, roots: dict[sympy.Symbol, Any]) -> Any:
    """Evaluate a linear sympy expression over root SymInts as a SymInt."""
    sym, a, b = _linear(expr, "derived dim")
    base = next(v for v in roots.values() if v.node.expr == sym)
    return a * base + b
