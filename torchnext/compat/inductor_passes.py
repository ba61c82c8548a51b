"""Where torchnext's compile passes meet torch internals: Inductor's configuration, op schemas.

:func:`install_overlap_pass` puts a graph pass (``torchnext.compile.simple_overlap``) into
``torch._inductor.config.post_grad_custom_post_pass``, after any pass already there (it
is chained, not replaced). On a torch that has 2.14's own pass
(``aten_distributed_optimizations.enable_simple_overlap``), it flips that flag instead.
What not to assume: Inductor reads the config when it compiles, so the switch applies to
graphs compiled after it, not to ones already in the cache of a running ``torch.compile``.

The graph passes read an FX node's op through :func:`op_schema` and :func:`op_namespace`
instead of touching ``torch._ops.OpOverload`` themselves.

==================================================  ===================================  ==============
access                                              what for                             tested on
==================================================  ===================================  ==============
``torch._inductor.config.post_grad_custom_post_pass``  install the overlap pass          2.13.0, 2.14.1
``torch._inductor.config.aten_distributed_optimizations``  2.14's own overlap switch     2.14.1
``torch._ops.OpOverload`` and its ``_schema``       an aten op's namespace, aliasing,    2.13.0, 2.14.1
                                                    mutation
==================================================  ===================================  ==============
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

GraphPass = Callable[[Any], Any]

__all__ = [
    "op_namespace",
    "op_schema",
    "native_overlap",
    "install_overlap_pass",
    "uninstall_overlap_pass",
    "overlap_pass_installed",
    "last_overlap_report",
]

_PASS_VERSION = 1
_lock = threading.Lock()


def op_schema(target: object) -> Any | None:
    """The ``torch.FunctionSchema`` of an FX ``call_function`` target that is an aten-style op."""
    import torch

    return target._schema if isinstance(target, torch._ops.OpOverload) else None


def op_namespace(target: object) -> str:
    """The op's namespace (``"aten"``, ``"_c10d_functional"``), or ``""`` for a plain callable."""
    import torch

    return str(target.namespace) if isinstance(target, torch._ops.OpOverload) else ""


def _config() -> Any:
    import torch._inductor.config as config

    return config


def native_overlap() -> bool:
    """True when this torch has 2.14's own simple overlap pass."""
    try:
        return hasattr(_config().aten_distributed_optimizations, "enable_simple_overlap")
    except ImportError:
        return False


def _pass_class() -> Any:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class OverlapPass(CustomGraphPass):  # type: ignore[misc]
        """simple_overlap after the pass that was configured before it (if any)."""

        def __init__(self, chained: Any, overlap: GraphPass) -> None:
            self.chained = chained
            self.overlap = overlap
            self.last_report: Any = None

        def __call__(self, graph: Any) -> None:
            if self.chained is not None:
                self.chained(graph)
            self.last_report = self.overlap(graph)

        def uuid(self) -> Any:
            # Part of Inductor's cache key: a graph compiled without the pass is not reused.
            inner = getattr(self.chained, "uuid", lambda: repr(self.chained))()
            return ("torchnext.simple_overlap", _PASS_VERSION, inner)

    return OverlapPass


def _ours(value: Any) -> bool:
    return type(value).__name__ == "OverlapPass" and hasattr(value, "chained")


def overlap_pass_installed() -> bool:
    """True when graphs compiled from now on get the overlap pass (native or torchnext's)."""
    config = _config()
    if native_overlap():
        return bool(config.aten_distributed_optimizations.enable_simple_overlap)
    return _ours(config.post_grad_custom_post_pass)


def install_overlap_pass(overlap: GraphPass) -> bool:
    """Turn the pass on; False when it already was. Raises ``ImportError`` without Inductor.

    ``overlap`` is the FX pass to run (used only where torch lacks a native one).
    """
    config = _config()
    with _lock:
        if native_overlap():
            was = bool(config.aten_distributed_optimizations.enable_simple_overlap)
            config.aten_distributed_optimizations.enable_simple_overlap = True
            return not was
        if _ours(config.post_grad_custom_post_pass):
            return False
        config.post_grad_custom_post_pass = _pass_class()(
            config.post_grad_custom_post_pass, overlap
        )
        return True


def uninstall_overlap_pass() -> bool:
    """Turn the pass off (restoring a chained pass); False when it was not on."""
    config = _config()
    with _lock:
        if native_overlap():
            was = bool(config.aten_distributed_optimizations.enable_simple_overlap)
            config.aten_distributed_optimizations.enable_simple_overlap = False
            return was
        current = config.post_grad_custom_post_pass
        if not _ours(current):
            return False
        config.post_grad_custom_post_pass = current.chained
        return True


def last_overlap_report() -> Any:
    """What the pass did to the last graph it saw in this process (torchnext's pass only)."""
    current = _config().post_grad_custom_post_pass
    return current.last_report if _ours(current) else None
