"""Capture a ``while_loop`` in a CUDA graph, data-dependent trip count included.

Use :func:`capture_while_loop` when a loop whose trip count depends on device data
(a solver iterating to tolerance, decoding until EOS) should run as one CUDA-graph
replay with no host round trip per iteration. The loop is recorded with CUDA
**conditional nodes** (CUDA >= 12.4):

* where torch has ``CUDAGraph.begin_capture_to_while_node`` (torch 2.14), as one WHILE
  node: one replay runs the whole loop;
* on torch 2.13, which only has IF nodes, as ``unroll`` IF nodes in sequence, each
  running one iteration while the predicate holds; if the predicate still holds after
  a replay the graph is replayed again, so one host sync costs ``unroll`` iterations and
  the results are exact for any trip count.

What not to assume: carries must be CUDA tensors (no Python ints); the body must not
draw random numbers (CUDA does not allow RNG in conditional nodes); shapes and dtypes
are fixed at capture. Inputs are copied into the graph's static buffers on every call,
and outputs are fresh tensors unless ``clone_outputs=False``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from torchnext.compat.control_flow_internals import pytree
from torchnext.errors import CudaGraphCaptureError

__all__ = ["WhileLoopCaptureConfig", "CapturedWhileLoop", "capture_while_loop", "capture_support"]

_MIN_CUDA = (12, 4)


@dataclass(frozen=True, kw_only=True)
class WhileLoopCaptureConfig:
    """How :func:`capture_while_loop` records the loop."""

    unroll: int = 32
    """Iterations recorded per replay when only IF nodes exist (torch 2.13); >= 1."""
    pool: Any = None
    """Memory pool handle shared with other graphs (``torch.cuda.graph_pool_handle()``)."""
    clone_outputs: bool = True
    """Return copies of the static output buffers (False: the buffers themselves, which
    the next call overwrites)."""
    prefer_while_node: bool = True
    """Use a WHILE node where torch offers one; False forces the IF-node unrolling."""

    def __post_init__(self) -> None:
        if not isinstance(self.unroll, int) or self.unroll < 1:
            raise ValueError(
                f"WhileLoopCaptureConfig.unroll must be an int >= 1, got {self.unroll!r}"
            )


def capture_support() -> tuple[str | None, str]:
    """``(kind, reason)``: kind is ``"while"``, ``"if"`` or ``None`` (with the reason)."""
    if not torch.cuda.is_available():
        return None, "no CUDA device is available"
    cuda = torch.version.cuda
    if cuda is None:
        return None, "this torch build has no CUDA runtime"
    version = tuple(int(p) for p in cuda.split(".")[:2])
    if version < _MIN_CUDA:
        return None, f"CUDA {cuda} lacks conditional graph nodes (needs >= 12.4)"
    graph_cls = torch.cuda.CUDAGraph
    if hasattr(graph_cls, "begin_capture_to_while_node"):
        return "while", "torch has CUDA graph WHILE nodes"
    if hasattr(graph_cls, "begin_capture_to_if_node"):
        return "if", "torch has CUDA graph IF nodes only; the loop is unrolled per replay"
    return None, f"torch {torch.__version__} has no CUDA graph conditional-node capture"


def _is_bool_scalar_cuda(pred: object) -> bool:
    return (
        isinstance(pred, torch.Tensor)
        and pred.dim() == 0
        and pred.dtype == torch.bool
        and pred.is_cuda
    )


def _check_pred(pred: object, where: str) -> torch.Tensor:
    if not _is_bool_scalar_cuda(pred):
        got = (
            f"Tensor(shape={tuple(pred.shape)}, dtype={pred.dtype}, device={pred.device})"
            if isinstance(pred, torch.Tensor)
            else f"{type(pred).__name__}: {pred!r}"
        )
        raise CudaGraphCaptureError(
            f"cond_fn must return a boolean scalar CUDA tensor but got {got} ({where}); "
            "return e.g. `(err > tol).all()` computed on the device, not a Python bool."
        )
    return cast(torch.Tensor, pred)


class CapturedWhileLoop:
    """A recorded loop: call it with carries shaped like the captured ones."""

    def __init__(
        self,
        *,
        graph: torch.cuda.CUDAGraph,
        static_carry: list[torch.Tensor],
        spec: pytree.TreeSpec,
        pred_buf: torch.Tensor | None,
        kind: str,
        config: WhileLoopCaptureConfig,
    ) -> None:
        self.graph = graph
        self.kind = kind
        """``"while"`` (one WHILE node) or ``"if"`` (``unroll`` IF nodes per replay)."""
        self._static = static_carry
        self._spec = spec
        self._pred = pred_buf
        self._config = config
        self.replays_last_call = 0
        """Graph replays the last call needed (always 1 for a WHILE node)."""

    def __call__(self, *carried_inputs: Any) -> Any:
        leaves, spec = pytree.tree_flatten(tuple(carried_inputs))
        if spec != self._spec:
            raise CudaGraphCaptureError(
                f"captured loop called with carries structured as {spec}, but it was "
                f"captured with {self._spec}; pass the same structure."
            )
        for i, (new, static) in enumerate(zip(leaves, self._static, strict=True)):
            if (
                not isinstance(new, torch.Tensor)
                or new.shape != static.shape
                or (new.dtype != static.dtype)
            ):
                raise CudaGraphCaptureError(
                    f"captured loop: carry {i} is {new!r:.80}, but the graph was captured "
                    f"for Tensor(shape={tuple(static.shape)}, dtype={static.dtype}); "
                    "capture again for new shapes."
                )
            static.copy_(new)
        self.graph.replay()
        replays = 1
        if self._pred is not None:
            # IF-node unrolling: the predicate still holding means the trip count
            # exceeded `unroll`; replaying continues from the carried state.
            while bool(self._pred.item()):
                self.graph.replay()
                replays += 1
        self.replays_last_call = replays
        outs = [s.clone() for s in self._static] if self._config.clone_outputs else self._static
        return pytree.tree_unflatten(outs, self._spec)


def _copy_body_outputs(body_out: Any, static: list[torch.Tensor], spec: pytree.TreeSpec) -> None:
    out_t = body_out if isinstance(body_out, tuple) else (body_out,)
    flat, out_spec = pytree.tree_flatten(out_t)
    if out_spec != spec:
        raise CudaGraphCaptureError(
            f"body_fn should return the same pytree structure as carried_inputs: got "
            f"{out_spec}, expected {spec}."
        )
    for i, (out, dst) in enumerate(zip(flat, static, strict=True)):
        if not isinstance(out, torch.Tensor):
            raise CudaGraphCaptureError(
                f"CUDA graph while_loop conditional nodes only support tensor body_fn "
                f"outputs; output {i} is {type(out).__name__}."
            )
        if out.shape != dst.shape or out.dtype != dst.dtype:
            raise CudaGraphCaptureError(
                f"body_fn changes carry {i} from Tensor(shape={tuple(dst.shape)}, "
                f"dtype={dst.dtype}) to Tensor(shape={tuple(out.shape)}, dtype={out.dtype}); "
                "carries must keep shape and dtype."
            )
        if out.data_ptr() != dst.data_ptr():
            dst.copy_(out)


def capture_while_loop(
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    carried_inputs: tuple[Any, ...] | list[Any],
    *,
    config: WhileLoopCaptureConfig | None = None,
) -> CapturedWhileLoop:
    """Record ``while cond_fn(*c): c = body_fn(*c)`` in a CUDA graph; return the replayer.

    ``carried_inputs`` gives the shapes, dtypes and devices (and is the warm-up input);
    the returned object runs the loop for any carries of the same metadata.

    Raises:
        CudaGraphCaptureError: no CUDA, CUDA < 12.4 or a torch without conditional
            nodes; a non-tensor or non-CUDA carry; ``cond_fn`` not returning a bool
            scalar CUDA tensor; a body changing a carry; or capture failing (for
            example RNG in the body), with torch's message attached.
    """
    cfg = config if config is not None else WhileLoopCaptureConfig()
    kind, reason = capture_support()
    if kind is None:
        raise CudaGraphCaptureError(
            f"cannot capture while_loop in a CUDA graph: {reason}. Run the loop with "
            "torchnext.control_flow.while_loop instead."
        )
    if kind == "while" and not cfg.prefer_while_node:
        kind = "if"
    for name, fn in (("cond_fn", cond_fn), ("body_fn", body_fn)):
        if not callable(fn):
            raise CudaGraphCaptureError(f"capture_while_loop({name}=...) is not callable: {fn!r}")
    if not isinstance(carried_inputs, (tuple, list)):
        raise CudaGraphCaptureError(
            "capture_while_loop(carried_inputs=...) must be a tuple of CUDA tensors, got "
            f"{type(carried_inputs).__name__}"
        )
    leaves, spec = pytree.tree_flatten(tuple(carried_inputs))
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            raise CudaGraphCaptureError(
                "CUDA graph while_loop conditional nodes only support tensor carried_inputs; "
                f"carry {i} is {type(leaf).__name__} {leaf!r}. Wrap it: "
                "torch.tensor(value, device='cuda')."
            )
        if not leaf.is_cuda:
            raise CudaGraphCaptureError(
                f"carry {i} is on {leaf.device}; every carry must be a CUDA tensor."
            )

    static = [leaf.detach().clone() for leaf in leaves]

    def carries() -> tuple[Any, ...]:
        result: tuple[Any, ...] = pytree.tree_unflatten(static, spec)
        return result

    # Warm up on a side stream: lazy initialisation (cuBLAS handles, autotuning) must
    # not happen inside the capture, and bad bodies fail here with a clear message.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        warm = [s.clone() for s in static]
        _check_pred(cond_fn(*pytree.tree_unflatten(warm, spec)), "warm-up")
        _copy_body_outputs(body_fn(*pytree.tree_unflatten(warm, spec)), warm, spec)
        _check_pred(cond_fn(*pytree.tree_unflatten(warm, spec)), "warm-up, after one body")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    pred_buf: torch.Tensor | None = None
    try:
        with torch.cuda.graph(graph, pool=cfg.pool), torch.no_grad():
            if kind == "while":
                pred = _check_pred(cond_fn(*carries()), "before the loop")
                graph.begin_capture_to_while_node(pred)  # type: ignore[attr-defined]
                try:
                    _copy_body_outputs(body_fn(*carries()), static, spec)
                    pred = _check_pred(cond_fn(*carries()), "after the body")
                    graph.set_conditional_handle_for_current_node(pred)  # type: ignore[attr-defined]
                finally:
                    graph.end_capture_to_conditional_node()
            else:
                pred_buf = _check_pred(cond_fn(*carries()), "before the loop").clone()
                for _ in range(cfg.unroll):
                    graph.begin_capture_to_if_node(pred_buf)
                    try:
                        _copy_body_outputs(body_fn(*carries()), static, spec)
                        pred_buf.copy_(_check_pred(cond_fn(*carries()), "after the body"))
                    finally:
                        graph.end_capture_to_conditional_node()
    except CudaGraphCaptureError:
        raise
    except RuntimeError as exc:
        hint = ""
        if "RNG" in str(exc) or "random" in str(exc).lower():
            hint = " The body draws random numbers, which conditional nodes do not allow."
        raise CudaGraphCaptureError(
            f"capturing the while_loop in a CUDA graph failed: {str(exc).splitlines()[0]}."
            f"{hint} Run it uncaptured with torchnext.control_flow.while_loop."
        ) from exc
    return CapturedWhileLoop(
        graph=graph, static_carry=static, spec=spec, pred_buf=pred_buf, kind=kind, config=cfg
    )
