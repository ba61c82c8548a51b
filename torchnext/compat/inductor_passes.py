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
``config.reorder_for_compute_comm_overlap(_passes)``  run the order keeper after         2.13.0
                                                    Inductor's peak-memory reordering
scheduler nodes: ``get_nodes``, ``node.origins``,   the keeper's view of the scheduled   2.13.0
``unmet_dependencies``, ``get_buffer_names``,       graph (FX origins, dependencies,
``utils.contains_collective``                       collectives)
``memory.prepare_planning_info``,                   Inductor's own peak-memory estimate  2.13.0
``memory.estimate_peak_memory``, ``V.graph``        of a scheduled order
==================================================  ===================================  ==============

Why a scheduler hook too: on 2.13, Inductor's scheduler re-sorts the nodes for peak memory
(``reorder_for_peak_memory``, on by default) after the post-grad passes, which undoes the
FX pass's order. :func:`install_overlap_pass` therefore also registers a scheduler pass
(``torchnext.compile.schedule.keep_fx_order``) that runs after that re-sort and restores
the FX pass's order where Inductor's own estimate says the peak does not grow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

GraphPass = Callable[[Any], Any]
SchedulerPass = Callable[[list[Any]], list[Any]]

__all__ = [
    "op_namespace",
    "op_schema",
    "native_overlap",
    "install_overlap_pass",
    "uninstall_overlap_pass",
    "overlap_pass_installed",
    "last_overlap_report",
    "scheduler_node_origins",
    "scheduler_node_inputs",
    "scheduler_node_is_collective",
    "scheduler_node_is_wait",
    "scheduler_peak_bytes",
]

_PASS_VERSION = 2
_lock = threading.Lock()
# The scheduler pass install_overlap_pass added, and whether it switched Inductor's
# reorder_for_compute_comm_overlap on (to be switched off again by uninstall).
_scheduler_hook: dict[str, Any] = {}


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


def install_overlap_pass(overlap: GraphPass, keep_order: SchedulerPass | None = None) -> bool:
    """Turn the pass on; False when it already was. Raises ``ImportError`` without Inductor.

    ``overlap`` is the FX pass to run and ``keep_order`` the scheduler pass that keeps its
    order through Inductor's peak-memory re-sort (both used only where torch lacks a
    native pass); ``keep_order`` runs after any scheduler pass the user configured.
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
        if keep_order is not None:
            _scheduler_hook["pass"] = keep_order
            _scheduler_hook["switched_on"] = not config.reorder_for_compute_comm_overlap
            config.reorder_for_compute_comm_overlap = True
            config.reorder_for_compute_comm_overlap_passes = [
                *config.reorder_for_compute_comm_overlap_passes,
                keep_order,
            ]
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
        keep_order = _scheduler_hook.pop("pass", None)
        if keep_order is not None:
            config.reorder_for_compute_comm_overlap_passes = [
                p for p in config.reorder_for_compute_comm_overlap_passes if p is not keep_order
            ]
            if _scheduler_hook.pop("switched_on", False):
                config.reorder_for_compute_comm_overlap = False
        return True


def last_overlap_report() -> Any:
    """What the pass did to the last graph it saw in this process (torchnext's pass only)."""
    current = _config().post_grad_custom_post_pass
    return current.last_report if _ours(current) else None


def scheduler_node_origins(snode: Any) -> list[Any]:
    """The FX nodes an Inductor scheduler node was lowered from (all of a fused node's)."""
    origins: list[Any] = []
    for inner in snode.get_nodes():
        origins.extend(getattr(getattr(inner, "node", None), "origins", ()) or ())
    return origins


def scheduler_node_inputs(snodes: list[Any]) -> dict[Any, set[Any]]:
    """For each scheduler node, the nodes of ``snodes`` it must run after (data and the
    ordering-only dependencies Inductor records for mutations and collectives)."""
    producer = {name: n for n in snodes for name in n.get_buffer_names()}
    return {
        n: {producer[d.name] for d in n.unmet_dependencies if d.name in producer} - {n}
        for n in snodes
    }


def scheduler_node_is_collective(snode: Any) -> bool:
    """True for a scheduler node that issues a collective (not its wait)."""
    from torch._inductor.utils import contains_collective

    return bool(contains_collective(snode))


def scheduler_node_is_wait(snode: Any) -> bool:
    """True for a scheduler node that waits on a collective."""
    from torch._inductor.utils import contains_wait

    return bool(contains_wait(snode))


def scheduler_peak_bytes(snodes: list[Any]) -> int:
    """Inductor's own peak-memory estimate of running ``snodes`` in this order (the one
    its ``reorder_for_peak_memory`` minimises). Call only while Inductor schedules."""
    from torch._inductor.memory import estimate_peak_memory, prepare_planning_info
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    scheduler = V.graph.scheduler
    _, freeable = prepare_planning_info(
        snodes,
        scheduler.name_to_buf,
        scheduler.name_to_fused_node,
        OrderedSet(V.graph.graph_inputs.keys()),
        OrderedSet(V.graph.get_output_names()),
    )
    peak, _ = estimate_peak_memory(snodes, freeable, OrderedSet(V.graph.get_output_names()))
    return int(peak)
