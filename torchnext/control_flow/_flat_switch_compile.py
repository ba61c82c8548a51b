"""Teach Dynamo and Inductor the flat switch op: capture it in one node, dispatch it once.

``register()`` installs two things into the running torch, once (``register_dynamo()``
only the first, for eager calls, which Dynamo captures but Inductor never sees):

* a Dynamo variable for ``flat_switch`` that speculates each branch into its own
  subgraph (once per branch, so capture is linear in K), gives all branches one merged
  input signature, and records a single ``flat_switch`` node;
* an Inductor lowering (and the one line Inductor's fake-tensor updater needs to know
  which arguments feed which subgraph) that compiles every branch subgraph and emits, in the Python
  wrapper, one read of the index followed by an ``if``/``elif`` chain over the
  branches: dispatch costs one ``.item()`` and at most K integer comparisons on the
  host, not a kernel launch and a sync per tree level.

When to use: ``switch`` calls ``register()`` itself; nothing else should. What not to
assume: both hooks reach into torch internals (Dynamo's higher-order-op table, Inductor's
lowering table and IR) that change between releases. ``supported()`` checks that the
pieces exist; where they do not, ``switch`` keeps its ``torch.cond`` tree. Inductor's
C++ wrapper (``cpp_wrapper``, AOTInductor) has no code path for this node and fails
with a ``ControlFlowError`` that says to set ``TORCHNEXT_SWITCH_FLAT=0``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from torchnext.control_flow._flat_switch import flat_switch
from torchnext.errors import ControlFlowError

__all__ = ["register", "register_dynamo", "supported"]

_HOP_DESCRIPTION = "torchnext.switch"


@functools.cache
def supported() -> bool:
    """Whether this torch has the internals the flat path is built on."""
    try:
        from torch._dynamo.variables import higher_order_ops as hops
        from torch._inductor import fx_utils, graph, ir
        from torch._inductor.codegen import wrapper
        from torch.fx.experimental import symbolic_shapes

        needed = [
            (hops, "_hop_name_to_variable_class"),
            (hops, "speculate_subgraph"),
            (hops, "_call_function_and_unflatten_output"),
            (hops, "make_attr"),
            (hops, "_make_inlined"),
            (hops, "TorchHigherOrderOperatorVariable"),
            (hops, "LazyVariableTracker"),
            (hops, "only_consist_of"),
            (hops, "unpack_iterable"),
            (ir, "ExternKernel"),
            (ir, "MultiOutput"),
            (ir, "MultiOutputLayout"),
            (ir, "FixedLayout"),
            (ir, "ShapeAsConstantBuffer"),
            (ir, "TensorBox"),
            (ir, "is_triton"),
            (ir, "_split_by_sym_type"),
            (graph.GraphLowering, "make_subgraph"),
            (symbolic_shapes, "resolve_unbacked_bindings"),
            (wrapper, "EnterSubgraphLine"),
            (wrapper.PythonWrapperCodegen, "codegen_subgraph"),
            (fx_utils, "_extract_subgraphs_and_args"),
        ]
    except ImportError:
        return False
    return all(hasattr(mod, name) for mod, name in needed)


@functools.cache
def register_dynamo() -> None:
    """Install the Dynamo variable (idempotent); enough for eager and non-Inductor backends."""
    from torch._dynamo.variables import higher_order_ops as hops

    hops._hop_name_to_variable_class[flat_switch.__name__] = _variable_class()


@functools.cache
def register() -> None:
    """Install the Dynamo variable and the Inductor lowering (idempotent)."""
    register_dynamo()
    from torch._inductor.lowering import register_lowering

    register_lowering(flat_switch, type_promotion_kind=None)(_lower)
    from torch._inductor import fx_utils

    # Inductor's fake-tensor updater asks which arguments feed each subgraph of a node;
    # for a HOP it does not know it warns and guesses. Every branch takes the operands.
    known = fx_utils._extract_subgraphs_and_args

    def extract(node: Any, valid: Any, *args: Any, **kwargs: Any) -> Any:
        if node.target is flat_switch:
            return ((branch, tuple(args[2])) for branch in args[1])
        return known(node, valid, *args, **kwargs)

    fx_utils._extract_subgraphs_and_args = extract  # type: ignore[assignment]


def _merge_lifted(graphs: list[torch.fx.Graph], lifted: list[dict[Any, Any]]) -> list[Any]:
    """Give every branch graph the same inputs: the union of what any branch lifted.

    Dynamo lifts each branch's free tensors (operands included) into placeholders; a
    switch node passes one argument list to whichever branch runs, so each graph gets a
    placeholder for every outer value, unused where the branch does not read it. Two
    ``get_attr`` proxies with the same target are the same module attribute.
    """
    by_target: dict[str, Any] = {}
    canonical: dict[Any, Any] = {}
    for mapping in lifted:
        for outer in mapping:
            if outer.node.op == "get_attr":
                canonical[outer] = by_target.setdefault(outer.node.target, outer)
            else:
                canonical[outer] = outer
    union = sorted(set(canonical.values()), key=lambda p: p.node.name)
    for graph, mapping in zip(graphs, lifted, strict=True):
        mine = {canonical[outer]: inner for outer, inner in mapping.items()}
        first_body = next(n for n in graph.nodes if n.op != "placeholder")
        with graph.inserting_before(first_body):
            for outer in union:
                placeholder = graph.placeholder(outer.node.name)
                placeholder.meta = outer.node.meta
                if outer in mine:
                    old = mine[outer].node
                    old.replace_all_uses_with(placeholder)
                    old.users = {}
                    graph.erase_node(old)
    return union


@functools.cache
def _variable_class() -> Any:
    from torch._dynamo import graph_break_hints
    from torch._dynamo.exc import unimplemented
    from torch._dynamo.variables import higher_order_ops as hops
    from torch._dynamo.variables.lists import ListVariable, TupleVariable
    from torch._dynamo.variables.tensor import SymNodeVariable, TensorVariable
    from torch.utils import _pytree as pytree

    def unsupported(what: str, context: object) -> None:
        unimplemented(
            gb_type=f"torchnext.switch: {what}",
            context=str(context),
            explanation=f"torchnext.switch could not capture this call: {what}.",
            hints=[*graph_break_hints.USER_ERROR],
        )

    class FlatSwitchVariable(hops.TorchHigherOrderOperatorVariable):  # type: ignore[misc]
        _HOP_NAME = _HOP_DESCRIPTION
        _ALLOW_FALLBACK_TO_EAGER = False

        def _call_function(self, tx: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
            args, kwargs = hops.LazyVariableTracker.realize_all((args, kwargs))
            if len(args) != 3 or kwargs:
                unsupported("expected (index, branches, operands)", (args, kwargs))
            index, branches, operands = args
            if not isinstance(index, (TensorVariable, SymNodeVariable)):
                unsupported("index must be a tensor or a SymInt", index)
            if not isinstance(branches, (TupleVariable, ListVariable)):
                unsupported("branches must be a tuple", branches)
            if not isinstance(operands, (TupleVariable, ListVariable)):
                unsupported("operands must be a tuple", operands)
            operand_vts = hops.unpack_iterable(tx, operands)
            results = []
            for i, branch in enumerate(hops.unpack_iterable(tx, branches)):
                (ret, spec), graph, lifted = hops.speculate_subgraph(
                    tx,
                    branch,
                    operand_vts,
                    {},
                    f"{_HOP_DESCRIPTION} branch{i}",
                    source_target=self.value,
                    should_flatten_outputs=True,
                    remove_consts_from_outputs=False,
                    supports_input_mutation=False,
                    supports_aliasing=False,
                )
                # A new epoch per branch keeps unbacked bindings of one branch from being
                # memoised into the next (as Dynamo does for cond).
                tx.fake_mode.epoch += 1
                if not hops.only_consist_of(ret, (TensorVariable,)):
                    unsupported(f"branch{i} must return only tensors", ret)
                results.append((ret, spec, graph, lifted, dict(tx.output.nn_modules)))
            spec0 = results[0][1]
            for i, (_, spec, *_rest) in enumerate(results):
                same = hops._make_inlined(tx, pytree.TreeSpec.__eq__)(
                    spec0.treespec, spec.treespec
                ).as_python_constant()
                if same is not NotImplemented and not same:
                    unsupported(f"branch{i} returns a different structure than branch0", spec)
            union = _merge_lifted([r[2] for r in results], [r[3] for r in results])
            attrs = []
            for i, (_, _, graph, _, modules) in enumerate(results):
                name = tx.output.install_subgraph(
                    f"switch_branch{i}", torch.fx.GraphModule(modules, graph)
                )
                attrs.append(hops.make_attr(tx, name))
            proxy_args = (index.as_proxy(), tuple(attrs), tuple(union))
            return hops._call_function_and_unflatten_output(
                tx, flat_switch, proxy_args, {}, None, spec0, results[0][0]
            )

    return FlatSwitchVariable


def _lower(index: Any, branches: Any, operands: Any) -> list[Any]:
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if any(isinstance(x, ir.IRNode) and ir.is_triton(x) for x in [index, *operands]):
        V.graph.disable_cudagraphs_reason = "control flow operator: torchnext switch."
    return [ir.TensorBox.create(out) for out in _kernel_class().create(index, branches, operands)]


@functools.cache
def _kernel_class() -> Any:
    from torch._inductor import ir
    from torch._inductor.codegen.wrapper import EnterSubgraphLine, ExitSubgraphLine
    from torch._inductor.virtualized import V
    from torch.fx.experimental.symbolic_shapes import resolve_unbacked_bindings
    from torch.utils._ordered_set import OrderedSet

    def maybe_expr(s: int | torch.SymInt) -> Any:
        return s if isinstance(s, int) else s.node.expr

    class SwitchKernel(ir.ExternKernel):  # type: ignore[misc]
        """K subgraphs behind one index: ``outputs = branches[clamp(index)](*operands)``."""

        outputs: list[Any]

        def __init__(
            self,
            index: Any,
            operands: list[Any],
            subgraphs: list[Any],
            layout: Any,
            unbacked_bindings: Any,
        ) -> None:
            self.index = index
            self.operands = operands
            self.subgraphs = subgraphs
            sym_args, tensor_args = ir._split_by_sym_type([index, *operands])
            super().__init__(name=None, layout=layout, inputs=tensor_args, constant_args=sym_args)
            if unbacked_bindings is not None:
                self.unbacked_bindings = unbacked_bindings
            self.name = V.graph.register_buffer(self)
            V.graph.register_operation(self)

        def get_subgraphs(self) -> list[Any]:
            return list(self.subgraphs)

        def get_unbacked_symbol_defs(self) -> Any:
            bindings = getattr(self, "unbacked_bindings", None)
            if not bindings:
                return OrderedSet()
            resolved = resolve_unbacked_bindings(V.graph.sizevars.shape_env, bindings)
            return OrderedSet(resolved.keys()) if resolved else OrderedSet()

        @classmethod
        def create(cls, index: Any, subgraphs: Any, operands: Any) -> list[Any]:
            if V.graph.cpp_wrapper or V.graph.aot_mode:
                raise ControlFlowError(
                    "torchnext switch: Inductor's C++ wrapper (cpp_wrapper / AOTInductor) "
                    "cannot compile the flat switch node; set TORCHNEXT_SWITCH_FLAT=0 to "
                    "compile switch as a tree of torch.cond instead."
                )
            index = cls.realize_input(index)
            operands = [cls.realize_input(x) for x in operands]
            node = V.graph.current_node
            fx_operands: Any = node.args[-1]
            fake_operands: Any = [
                a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in fx_operands
            ]
            fake_outputs = node.meta["val"]
            for sub in subgraphs:
                if sub.graph is None:
                    sub.graph = V.graph.make_subgraph(
                        gm=sub.graph_module, example_inputs=fake_operands, subgraph_name=sub.name
                    )
                    with V.set_graph_handler(sub.graph):
                        sub.graph.run(*fake_operands)
                        # Every branch must hand back the strides the traced output promised.
                        sub.graph.graph_outputs = [
                            out
                            if isinstance(out, ir.ShapeAsConstantBuffer)
                            else ir.ExternKernel.require_exact_strides(
                                ir.TensorBox(out), fake.stride(), allow_padding=False
                            )
                            for out, fake in zip(sub.graph.graph_outputs, fake_outputs, strict=True)
                        ]
            first = subgraphs[0].graph.graph_outputs
            for sub in subgraphs[1:]:
                outs = sub.graph.graph_outputs
                if len(outs) != len(first) or any(
                    a.get_dtype() != b.get_dtype() or a.get_device() != b.get_device()
                    for a, b in zip(first, outs, strict=True)
                ):
                    raise ControlFlowError(
                        f"torchnext switch: {sub.name} outputs {outs} do not match the first "
                        f"branch's {first} in number, dtype or device."
                    )
            device = next(
                o.get_device()
                for o in [*operands, index]
                if not isinstance(o, ir.ShapeAsConstantBuffer)
            )
            bindings = resolve_unbacked_bindings(
                V.graph.sizevars.shape_env, node.meta.get("unbacked_bindings", None)
            )
            kernel = SwitchKernel(
                index, operands, list(subgraphs), ir.MultiOutputLayout(device=device), bindings
            )
            kernel.outputs = [
                ir.MultiOutput(
                    ir.FixedLayout(
                        device=out.get_device() if out.get_device() is not None else device,
                        dtype=out.get_dtype(),
                        size=[maybe_expr(s) for s in fake.size()],
                        stride=[maybe_expr(s) for s in fake.stride()],
                        offset=out.get_layout().offset,
                    ),
                    kernel,
                    [(list, i)],
                )
                for i, (out, fake) in enumerate(zip(first, fake_outputs, strict=True))
            ]
            return kernel.outputs

        def codegen(self, wrapper: Any) -> None:
            name = self.get_name()
            outer_inputs = [buf.codegen_reference() for buf in self.operands]
            ref = self.index.codegen_reference()
            if isinstance(self.index, ir.ShapeAsConstantBuffer):
                value = ref
            else:
                value = f"{ref}.item()"
            last = len(self.subgraphs) - 1
            # int() truncates a float index toward zero, then the clamp: 2.14's semantics.
            wrapper.writeline(f"{name}_index = min(max(int({value}), 0), {last})")
            wrapper.writeline(f"{name} = [None] * {len(self.outputs)}")
            for i, sub in enumerate(self.subgraphs):
                if i == 0:
                    wrapper.writeline(f"if {name}_index == 0:")
                elif i < last:
                    wrapper.writeline(f"elif {name}_index == {i}:")
                else:
                    wrapper.writeline("else:")
                wrapper.writeline(EnterSubgraphLine(wrapper, sub.graph))
                wrapper.codegen_subgraph(sub, outer_inputs, name)
                wrapper.writeline(ExitSubgraphLine(wrapper))
            wrapper.codegen_unbacked_symbol_defs_for_outputs(
                name, self.outputs, getattr(self, "unbacked_bindings", {})
            )

    return SwitchKernel
