"""``torch.compile(model, backend="torchnext_gemm")``: GEMMs and their epilogues as one call.

Use it for inference (``torch.no_grad()``/``inference_mode``) of models built from
``nn.Linear`` and pointwise code: the backend is Inductor plus one post-grad graph pass that
finds ``mm``/``addmm`` followed by a chain of epilogue steps (relu, exact gelu as Inductor
decomposes it, silu, tanh, sigmoid, add/mul of a row, column or full tensor, a constant
scale) whose intermediate results nobody else reads, and replaces the chain by one call of
the custom op ``torchnext::gemm_epilogue``, which runs :func:`torchnext.gemm.gemm` (tuned
route). The user's model changes nothing beyond the backend's name.

What not to assume: in training graphs the pass sees the forward partition; a chain whose
intermediate results are saved for the backward pass (the input of a gelu, say) has a
second reader and is left as it is, so no extra memory and no custom backward are needed;
chains that nothing saves (a projection plus its residual) are fused there too. Graphs the
pass cannot match compile exactly as with Inductor alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Graph, Node

from torchnext.compat.gemm_internals import compile_fx_with_post_grad_pass, register_backend
from torchnext.gemm.epilogue import Epilogue, Step, StepOp
from torchnext.gemm.fused import gemm

__all__ = ["BACKEND", "backend", "fuse_gemm_epilogues", "gemm_epilogue", "register"]

log = logging.getLogger(__name__)

BACKEND = "torchnext_gemm"
_PASS_ID = ("torchnext.gemm.epilogue_pass", 1)
_SQRT_HALF = 0.7071067811865476
aten = torch.ops.aten


@torch.library.custom_op("torchnext::gemm_epilogue", mutates_args=())
def gemm_epilogue(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    ops: str,
    operands: list[torch.Tensor],
    scalars: list[float],
) -> torch.Tensor:
    """``gemm(a, b, bias=bias, epilogue=...)`` with the epilogue spelled as data.

    ``ops`` is the step names joined by commas; steps ``add``/``mul`` take the next tensor of
    ``operands``, ``scale`` the next value of ``scalars``.
    """
    tensors, values = iter(operands), iter(scalars)
    steps = []
    for op in ops.split(","):
        if op in ("add", "mul"):
            steps.append(Step(_op(op), next(tensors)))
        elif op == "scale":
            steps.append(Step("scale", next(values)))
        else:
            steps.append(Step(_op(op)))
    return gemm(a, b, bias=bias, epilogue=Epilogue(*steps))


def _op(name: str) -> StepOp:
    return name  # type: ignore[return-value]  # names come from _Chain, a closed set


@gemm_epilogue.register_fake
def _(a, b, bias, ops, operands, scalars):  # type: ignore[no-untyped-def]
    return a.new_empty((a.shape[0], b.shape[1]))


@dataclass
class _Chain:
    gemm_node: Node
    last: Node
    ops: list[str] = field(default_factory=list)
    operands: list[Node] = field(default_factory=list)
    scalars: list[float] = field(default_factory=list)


def _val(node: object) -> torch.Tensor | None:
    if isinstance(node, Node):
        value = node.meta.get("val")
        return value if isinstance(value, torch.Tensor) else None
    return None


def _single_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _gelu_end(x: Node) -> Node | None:
    """Inductor's exact-gelu decomposition rooted at ``x``: 0.5x * (erf(x/sqrt2) + 1)."""
    users = list(x.users)
    if len(users) != 2:
        return None
    half = next((u for u in users if u.target == aten.mul.Tensor and 0.5 in u.args), None)
    scaled = next((u for u in users if u.target == aten.mul.Tensor and _SQRT_HALF in u.args), None)
    if half is None or scaled is None:
        return None
    erf = _single_user(scaled)
    if erf is None or erf.target != aten.erf.default:
        return None
    plus = _single_user(erf)
    if plus is None or plus.target != aten.add.Tensor or 1 not in plus.args:
        return None
    end = _single_user(plus)
    if end is None or end.target != aten.mul.Tensor or set(end.args) != {half, plus}:
        return None
    return end if _single_user(half) is end else None


def _silu_end(x: Node) -> Node | None:
    """SiLU as Inductor decomposes it, x / (1 + exp(-x)), or as x * sigmoid(x)."""
    users = list(x.users)
    if len(users) != 2:
        return None
    sig = next((u for u in users if u.target == aten.sigmoid.default), None)
    if sig is not None:
        end = next((u for u in users if u.target == aten.mul.Tensor), None)
        ok = end is not None and set(end.args) == {x, sig} and _single_user(sig) is end
        return end if ok else None
    neg = next((u for u in users if u.target == aten.neg.default), None)
    end = next((u for u in users if u.target == aten.div.Tensor), None)
    if neg is None or end is None or end.args[0] is not x:
        return None
    exp = _single_user(neg)
    plus = None if exp is None or exp.target != aten.exp.default else _single_user(exp)
    if plus is None or plus.target != aten.add.Tensor or 1 not in plus.args:
        return None
    return end if end.args[1] is plus and _single_user(plus) is end else None


_UNARY = {aten.relu.default: "relu", aten.tanh.default: "tanh", aten.sigmoid.default: "sigmoid"}


def _extend(chain: _Chain, out_shape: tuple[int, ...]) -> bool:
    """Add the next step after ``chain.last``; False when the chain ends here."""
    x = chain.last
    for name, finder in (("gelu", _gelu_end), ("silu", _silu_end)):
        end = finder(x)
        if end is not None:
            chain.ops.append(name)
            chain.last = end
            return True
    user = _single_user(x)
    if user is None or user.kwargs:
        return False
    if user.target in _UNARY:
        chain.ops.append(_UNARY[user.target])
        chain.last = user
        return True
    if user.target not in (aten.add.Tensor, aten.mul.Tensor) or len(user.args) != 2:
        return False
    other = user.args[1] if user.args[0] is x else user.args[0]
    op = "add" if user.target == aten.add.Tensor else "mul"
    if isinstance(other, (int, float)) and not isinstance(other, bool):
        if op == "add":
            return False  # adding a constant is not in 2.14's epilogue set
        chain.ops.append("scale")
        chain.scalars.append(float(other))
    else:
        value, mine = _val(other), _val(x)
        if value is None or mine is None or value.dtype != mine.dtype:
            return False
        shape = tuple(value.shape)
        rows = out_shape[:-1]
        if shape not in ((out_shape[-1],), out_shape, (*rows, 1)):
            return False
        if len(chain.operands) >= 4:
            return False
        chain.ops.append(op)
        chain.operands.append(other)  # type: ignore[arg-type]
    chain.last = user
    return True


def _find_chain(node: Node) -> _Chain | None:
    chain = _Chain(gemm_node=node, last=node)
    view = _single_user(node)
    if view is not None and view.target in (aten.reshape.default, aten.view.default):
        chain.last = view  # rows split into [..., N]: pointwise steps commute with it
    start = chain.last
    out = _val(start)
    if out is None:
        return None
    while _extend(chain, tuple(out.shape)):
        pass
    return chain if chain.last is not start else None


def fuse_gemm_epilogues(graph: Graph) -> int:
    """The post-grad pass: rewrite each matched chain; the number rewritten."""
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        chain = _find_chain(node)
        if chain is None:
            continue
        if node.target == aten.addmm.default:
            if node.kwargs or _val(node.args[0]) is None or _val(node.args[0]).dim() != 1:  # type: ignore[union-attr]
                continue
            bias, a, b = node.args
        else:
            bias, (a, b) = None, node.args
        m, n = _val(node).shape  # type: ignore[union-attr]
        with graph.inserting_before(chain.last):
            flat = [_as_2d(graph, operand, m, n) for operand in chain.operands]
            fused = graph.call_function(
                torch.ops.torchnext.gemm_epilogue.default,
                (a, b, bias, ",".join(chain.ops), flat, chain.scalars),
            )
            fused.meta["val"] = _val(node)
            result = fused
            final = _val(chain.last)
            if final is not None and tuple(final.shape) != (m, n):
                result = graph.call_function(aten.reshape.default, (fused, list(final.shape)))
                result.meta["val"] = final
        chain.last.replace_all_uses_with(result)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
        log.debug("torchnext.gemm: fused %d GEMM epilogue(s)", rewritten)
    return rewritten


def _as_2d(graph: Graph, operand: Node, m: int, n: int) -> Node:
    """An operand of the ``[..., N]`` view as the ``[M, N]``/``[M, 1]``/``[N]`` the op takes."""
    shape = tuple(_val(operand).shape)  # type: ignore[union-attr]
    if shape in ((n,), (m, n), (m, 1)):
        return operand
    target = [m, n] if shape[-1] == n and shape != (n,) else [m, 1]
    return graph.call_function(aten.reshape.default, (operand, target))


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Inductor with :func:`fuse_gemm_epilogues` after its post-grad passes."""
    return compile_fx_with_post_grad_pass(gm, example_inputs, fuse_gemm_epilogues, _PASS_ID)


def register() -> None:
    """Register ``backend="torchnext_gemm"`` by hand, for a torchnext not installed with pip
    (an installed one is found through its ``torch_dynamo_backends`` entry point)."""
    register_backend(BACKEND, backend)
