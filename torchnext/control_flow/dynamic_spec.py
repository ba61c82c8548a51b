"""``@dynamic_spec``: one declared shape spec for ``torch.compile``, ``torch.export``, ``make_fx``.

Use it to say once which dims of which arguments are dynamic (and their ranges)::

    B = ShapeVar("B", min=2, max=64)

    @dynamic_spec({"x": TensorSpec([B, STATIC])})
    def f(x): ...

    compile(f)(x)            # one compile for every B in [2, 64]
    export(M(), (x,))        # for a module whose forward is decorated
    make_fx(f)(x)            # symbolic trace, B symbolic, dim 1 static

The decorator and spec types are torch 2.14's (``torch.fx.experimental.dynamic_spec``;
on 2.13 the types exist and torchnext adds the decorator). :func:`compile`,
:func:`export` and :func:`make_fx` are the three entry points with 2.14's
``dynamic_shapes=`` keyword and 2.14's errors (stacked decorators, a spec given twice,
``dynamic`` with ``dynamic_shapes``). Beyond 2.14: a spec naming an argument the
function does not have fails at decoration time, and a runtime size outside a declared
range raises :class:`~torchnext.errors.DynamicSpecError` naming the argument, dim and
range before the compiled code runs (2.14.1 crashes with an internal assertion).

What not to assume: on torch 2.13, ``export`` maps the spec to ``torch.export.Dim``
(backed symbols, linear derived dims only) and rejects ``assumptions``; ``make_fx``
maps it to symbolic fake inputs. On 2.14 the native machinery is used throughout.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.dynamic_spec import (
    STATIC,
    IntVar,
    ParamsSpec,
    ShapesSpec,
    ShapeVar,
    TensorSpec,
)

from torchnext.compat import control_flow_internals as internals
from torchnext.errors import DynamicSpecError

__all__ = [
    "dynamic_spec",
    "compile",
    "export",
    "make_fx",
    "resolve_dynamic_shapes",
    "check_ranges",
    "ShapeVar",
    "IntVar",
    "STATIC",
    "TensorSpec",
    "ParamsSpec",
    "ShapesSpec",
    "NATIVE_DECORATOR",
]

_ATTR = "_dynamic_spec"  # the attribute 2.14's consumers read


def _native_module() -> Any:
    import torch.fx.experimental.dynamic_spec as mod

    return mod


NATIVE_DECORATOR: bool = hasattr(_native_module(), "dynamic_spec")
"""True when the running torch has ``torch.fx.experimental.dynamic_spec.dynamic_spec``."""


def _version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _raw(fn: Any) -> Any:
    """The torch function under a backport wrapper (the function itself if none)."""
    return getattr(fn, "__torchnext_original__", fn)


def _coerce(spec: Any) -> ShapesSpec:
    if isinstance(spec, ShapesSpec):
        return spec
    if isinstance(spec, (dict, ParamsSpec)):
        return ShapesSpec(spec)
    raise TypeError(
        f"dynamic spec expects a dict, ShapesSpec, or ParamsSpec, got {type(spec).__name__}"
    )


def _params(spec: ShapesSpec) -> ParamsSpec:
    params = internals.spec_params(spec)
    if not isinstance(params, ParamsSpec):
        raise DynamicSpecError(
            f"ShapesSpec {spec!r} has no ParamsSpec this version of torchnext can read"
        )
    return params


def _named(params: ParamsSpec) -> dict[str, Any]:
    return internals.spec_named_args(params)


def _dims(leaf: Any) -> list[Any] | None:
    if isinstance(leaf, TensorSpec):
        return internals.spec_dims(leaf)
    return None


def _target(fn_or_module: Any) -> Any:
    return fn_or_module.forward if isinstance(fn_or_module, torch.nn.Module) else fn_or_module


def _signature_names(fn: Callable[..., Any]) -> tuple[set[str], bool]:
    """Parameter names of ``fn`` (without ``self``) and whether it takes ``**kwargs``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return set(), True
    names = {
        p.name
        for p in sig.parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"
    }
    has_varkw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    return names, has_varkw


def _check_names(fn: Callable[..., Any], spec: ShapesSpec) -> None:
    names, has_varkw = _signature_names(fn)
    if has_varkw or not names and not inspect.isfunction(fn) and not inspect.ismethod(fn):
        return
    unknown = sorted(set(_named(_params(spec))) - names)
    if unknown:
        qual = getattr(fn, "__qualname__", repr(fn))
        raise DynamicSpecError(
            f"@dynamic_spec names argument(s) {unknown} that {qual} does not have; its "
            f"parameters are {sorted(names)}. Fix the spec's keys (for a module, the "
            "names of forward's parameters, without self)."
        )


def dynamic_spec(spec: Any) -> Callable[[Any], Any]:
    """Attach ``spec`` (dict, ``ParamsSpec`` or ``ShapesSpec``) to a function or ``forward``.

    Raises:
        TypeError: ``spec`` is not a dict, ``ParamsSpec`` or ``ShapesSpec``.
        ValueError: the function already carries a spec (stacked decorators).
        DynamicSpecError: (a ``ValueError``) the spec names an argument the function
            does not have.
    """
    resolved = _coerce(spec)

    def decorator(fn: Any) -> Any:
        if hasattr(fn, _ATTR):
            raise ValueError(
                "@dynamic_spec(...) is already attached to "
                f"{getattr(fn, '__qualname__', repr(fn))}. Stacking multiple "
                "@dynamic_spec decorators on the same function is not allowed; merge "
                "them into a single spec."
            )
        _check_names(fn, resolved)
        setattr(fn, _ATTR, resolved)
        return fn

    return decorator


def resolve_dynamic_shapes(fn_or_module: Any, dynamic_shapes: Any) -> Any:
    """The spec in force: the decorator's, else ``dynamic_shapes``; ValueError if both."""
    attached = getattr(_target(fn_or_module), _ATTR, None)
    if attached is None:
        return dynamic_shapes
    if dynamic_shapes is not None:
        raise ValueError(
            "Both `@dynamic_spec(...)` is attached to the function/forward AND a "
            "`dynamic_shapes=` argument was passed. Provide only one."
        )
    return attached


def _bind(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {}
    return dict(bound.arguments)


def _var_range(var: IntVar) -> tuple[int | None, int | None]:
    return getattr(var, "min", None), getattr(var, "max", None)


def check_ranges(
    spec: ShapesSpec, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Raise :class:`DynamicSpecError` if an argument's size is outside its declared range."""
    values = _bind(fn, args, kwargs)
    for name, leaf in _named(_params(spec)).items():
        if name not in values:
            continue
        value = values[name]
        dims = _dims(leaf)
        if dims is not None and isinstance(value, torch.Tensor):
            if len(dims) != value.dim():
                raise DynamicSpecError(
                    f"TensorSpec has {len(dims)} dims but tensor {name!r} has "
                    f"{value.dim()} dims (shape {tuple(value.shape)}); fix the spec or the input."
                )
            for d, entry in enumerate(dims):
                size = int(value.shape[d])
                if isinstance(entry, IntVar) and type(entry).__name__ in ("IntVar", "ShapeVar"):
                    lo, hi = _var_range(entry)
                    if (lo is not None and size < lo) or (hi is not None and size > hi):
                        raise DynamicSpecError(
                            f"argument {name!r} dim {d} has size {size}, outside the range "
                            f"[{lo}, {hi}] declared by {entry.name or 'its ShapeVar'}; pass "
                            "an input in range or widen the ShapeVar's min/max."
                        )
                elif isinstance(entry, int) and not isinstance(entry, torch.SymInt):
                    if size != entry:
                        raise DynamicSpecError(
                            f"argument {name!r} dim {d} has size {size}, but the spec pins it "
                            f"to {entry}; pass a matching input or make the dim dynamic."
                        )
        elif isinstance(leaf, IntVar) and isinstance(value, int):
            lo, hi = _var_range(leaf)
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                raise DynamicSpecError(
                    f"argument {name!r} is {value}, outside the range [{lo}, {hi}] declared "
                    f"by {leaf.name or 'its IntVar'}."
                )


def compile(
    model: Any = None, *, dynamic_shapes: Any = None, dynamic: bool | None = None, **kwargs: Any
) -> Any:
    """``torch.compile(model, dynamic_shapes=..., **kwargs)`` on any torch with spec support.

    The decorator on ``model`` (or ``model.forward``) is honoured. Calls whose sizes fall
    outside a declared range raise :class:`DynamicSpecError` before the compiled code runs.

    Raises:
        ValueError: both ``dynamic`` and ``dynamic_shapes``, or both the decorator and
            ``dynamic_shapes``.
    """
    if model is None:
        return functools.partial(compile, dynamic_shapes=dynamic_shapes, dynamic=dynamic, **kwargs)
    spec_in = resolve_dynamic_shapes(model, dynamic_shapes)
    if spec_in is None:
        return _raw(torch.compile)(model, dynamic=dynamic, **kwargs)
    if dynamic is not None:
        raise ValueError(
            "`dynamic` and `dynamic_shapes` cannot both be set. `dynamic_shapes` controls "
            "dynamic behavior."
        )
    spec = _coerce(spec_in)
    # 2.14 silently ignores unknown names here; a typo would leave a dim static unseen.
    _check_names(_target(model), spec)
    raw_compile: Callable[..., Any] = getattr(
        torch.compile, "__torchnext_original__", torch.compile
    )
    keyword = (
        "dynamic_shapes"
        if "dynamic_shapes" in inspect.signature(raw_compile).parameters
        else "shapes_spec"
    )
    if getattr(_target(model), _ATTR, None) is not None and keyword == "dynamic_shapes":
        compiled = raw_compile(model, **kwargs)  # the native consumer reads the decorator
    else:
        compiled = raw_compile(model, **{keyword: spec}, **kwargs)
    target = _target(model)
    if isinstance(compiled, torch.nn.Module):

        def pre_hook(_mod: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
            check_ranges(spec, target, args, kw)

        compiled.register_forward_pre_hook(pre_hook, with_kwargs=True)
        return compiled

    @functools.wraps(model)
    def checked(*args: Any, **kw: Any) -> Any:
        check_ranges(spec, target, args, kw)
        return compiled(*args, **kw)

    return checked


def export(
    mod: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
    **export_kwargs: Any,
) -> Any:
    """``torch.export.export`` accepting a ``ShapesSpec``/``ParamsSpec`` (or the decorator).

    A plain dict is the legacy ``Dim`` spec, as in 2.14. On torch 2.13 the spec is
    translated to ``torch.export.Dim`` objects (one per ``ShapeVar``, shared where the
    spec shares it; ``a*B + b`` becomes a derived ``Dim``).

    Raises:
        ValueError: spec keys that match no argument; a pinned dim that disagrees with
            the example input; the decorator and ``dynamic_shapes`` both given.
        DynamicSpecError: (a ``ValueError``) on torch 2.13, a spec feature ``Dim`` cannot
            express (assumptions, non-linear expressions, ``IntVar`` on an int argument).
    """
    spec_in = resolve_dynamic_shapes(mod, dynamic_shapes)
    native = _version() >= (2, 14)
    if native or not isinstance(spec_in, (ShapesSpec, ParamsSpec)):
        if native and getattr(_target(mod), _ATTR, None) is not None:
            spec_in = None  # the native exporter reads the decorator itself
        return _raw(torch.export.export)(
            mod, args, kwargs, dynamic_shapes=spec_in, strict=strict, **export_kwargs
        )
    if export_kwargs.get("prefer_deferred_runtime_asserts_over_guards"):
        raise ValueError(
            "`prefer_deferred_runtime_asserts_over_guards=True` cannot be combined with "
            "`dynamic_shapes=ShapesSpec(...)`. ShapesSpec currently uses unbacked symbols "
            "only, which already emit runtime assertions; the flag has no effect."
        )
    from torchnext.control_flow._spec_to_dims import spec_to_dims

    dims = spec_to_dims(_coerce(spec_in), _target(mod), args, kwargs or {})
    return _raw(torch.export.export)(
        mod, args, kwargs, dynamic_shapes=dims, strict=strict, **export_kwargs
    )


def make_fx(
    f: Callable[..., Any],
    *,
    dynamic_shapes: Any = None,
    tracing_mode: str = "fake",
    **make_fx_kwargs: Any,
) -> Callable[..., torch.fx.GraphModule]:
    """``make_fx(f, tracing_mode="fake", dynamic_shapes=spec)``: trace with the spec's dims symbolic.

    Raises:
        ValueError: a spec with ``tracing_mode`` other than ``"fake"`` (as 2.14), or the
            decorator and ``dynamic_shapes`` both given.
    """
    from torch.fx.experimental import proxy_tensor

    raw_make_fx = _raw(proxy_tensor.make_fx)
    spec_in = resolve_dynamic_shapes(f, dynamic_shapes)
    if spec_in is None:
        return raw_make_fx(f, tracing_mode=tracing_mode, **make_fx_kwargs)
    if tracing_mode != "fake":
        raise ValueError(
            f"make_fx(dynamic_shapes=...) requires tracing_mode='fake' (got "
            f"tracing_mode={tracing_mode!r}). 'real' would silently ignore the spec; "
            "'symbolic' conflicts with the spec's unbacked-by-default semantics."
        )
    if "dynamic_shapes" in inspect.signature(raw_make_fx).parameters:
        if getattr(f, _ATTR, None) is not None:
            return raw_make_fx(f, tracing_mode="fake", **make_fx_kwargs)
        return raw_make_fx(f, tracing_mode="fake", dynamic_shapes=spec_in, **make_fx_kwargs)
    from torchnext.control_flow._spec_to_dims import symbolic_make_fx

    return symbolic_make_fx(f, _coerce(spec_in), **make_fx_kwargs)
