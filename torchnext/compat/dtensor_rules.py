"""Register torch 2.14's extra DTensor sharding rules on torch 2.13.

On 2.13, ``torch.sum(x, out=o)`` or ``x.cumsum_(0)`` with DTensors fails with
"Operator ... does not have a sharding strategy registered"; 2.14 shards them. The 77
operators of :data:`torchnext.compat.dtensor_rule_table.RULES` are each a variant of
an operator 2.13 already shards, so :func:`install_rules` registers them with 2.13's
own strategy for the base operator, wrapped for what the variant adds:

* ``out=`` variants: the base strategy, keeping only the candidates whose output
  placements equal the ``out=`` tensors' (DTensor never redistributes an ``out=``
  tensor, in either version). When no candidate keeps them, the base strategy is asked
  again with the input placed like the ``out=`` tensor or replicated, and the input is
  redistributed, as 2.14 does.
* in-place variants: the base strategy, keeping only the candidates that leave ``self``
  where it is; otherwise the same error 2.14 raises.
* functional ``_foreach`` forms and ``prims.amax``/``amin``: the base rule unchanged.

It runs through :func:`torchnext.backport.install` (or call :func:`install_rules`).
What not to assume: this is the only torchnext module that reads DTensor's private
registries (they moved between 2.13 and 2.14); an operator 2.14 does not shard stays
unregistered and fails with torch's own error.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchnext.compat.dtensor_rule_table import RULES, TORCH214_RULE_COUNT, ShardingRule

__all__ = ["install_rules", "uninstall_rules", "rule_counts", "missing_rules"]

_lock = threading.Lock()
_added: dict[Any, ShardingRule] = {}  # op overload -> the rule torchnext registered

StrategyFn = Callable[[Any], Any]
_MAX_CHOICES = 64  # placements tried per input when out= forces a redistribution


def _tensor_modules() -> tuple[Any, Any, Any]:
    """(propagator, op_schema module, ops.utils module); ImportError without DTensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import _op_schema as op_schema
    from torch.distributed.tensor._ops import utils as ops_utils

    return DTensor._op_dispatcher.sharding_propagator, op_schema, ops_utils


def _clear_caches() -> None:
    # Both the Python LRU cache and the C++ fast path remember "no rule" answers.
    from torch.distributed.tensor import debug

    clear = getattr(debug, "_clear_sharding_prop_cache", None)
    if clear is not None:
        clear()


def _resolve(name: str) -> Any:
    namespace, op_name, overload = name.split(".")
    packet = getattr(getattr(torch.ops, namespace), op_name)
    return getattr(packet, overload)


def _registered(propagator: Any) -> set[Any]:
    return (
        set(propagator.op_strategy_funcs)
        | set(getattr(propagator, "op_single_dim_strategy_funcs", {}))
        | set(propagator.op_to_rules)
    )


def _out_names(op: Any) -> tuple[str, ...]:
    return tuple(a.name for a in op._schema.arguments if a.is_out)


def _output_specs(spec: Any, count: int) -> list[Any]:
    out = spec.output_specs
    if isinstance(out, tuple):
        return list(out)
    return [out] * count


class _Rules:
    """The strategy wrappers, bound to one torch's DTensor internals."""

    def __init__(self, op_schema: Any, ops_utils: Any) -> None:
        from torch.distributed.tensor import Partial, Replicate

        self.schema = op_schema
        self.utils = ops_utils
        self.partial_type = Partial
        self.replicate_type = Replicate

    def placements(self, strategy: Any) -> tuple[Any, ...] | None:
        if isinstance(strategy, self.schema.OpStrategy):
            return tuple(strategy.strategies[0].output_spec.placements)
        return None

    def leaves(self, args: Sequence[Any]) -> list[Any]:
        """The tensor inputs' strategies, in the order a strategy lists its input specs."""
        found: list[Any] = []
        for arg in args:
            if isinstance(arg, self.schema.OpStrategy):
                found.append(arg)
            elif isinstance(arg, self.schema.TupleStrategy):
                found.extend(self.leaves(arg.children))
            elif isinstance(arg, (list, tuple)):
                found.extend(self.leaves(arg))
        return found

    def make_schema(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any], info: Any) -> Any:
        return self.schema.OpSchema(op, tuple(args), kwargs, schema_info=info)

    def passthrough(self, rule: ShardingRule, base_schema: Any, n_outputs: int) -> list[Any]:
        """The zero-cost candidate that keeps ``Partial`` inputs partial (linear ops)."""
        inputs = [s.strategies[0].output_spec for s in self.leaves(base_schema.args_schema)]
        if not rule.partial or not inputs:
            return []
        first = tuple(inputs[0].placements)
        linear = all(
            isinstance(p, self.partial_type) and p.reduce_op in rule.partial for p in first
        )
        if not linear or any(tuple(i.placements) != first for i in inputs):
            return []
        out = self.schema.DTensorSpec(inputs[0].mesh, first, tensor_meta=None)
        return [
            self.schema.OpSpec(
                output_specs=out if n_outputs == 1 else tuple([out] * n_outputs),
                input_specs=inputs,
                redistribute_cost=[[0.0] for _ in inputs],
            )
        ]

    def out_variant(
        self, rule: ShardingRule, base_op: Any, base_fn: StrategyFn, out_names: tuple[str, ...]
    ) -> StrategyFn:
        def strategy(op_schema: Any) -> Any:
            kwargs = {k: v for k, v in op_schema.kwargs_schema.items() if k not in out_names}
            wanted = [self.placements(op_schema.kwargs_schema.get(n)) for n in out_names]
            base_schema = self.make_schema(
                base_op, op_schema.args_schema, kwargs, op_schema.schema_info
            )
            candidates = [
                *self.passthrough(rule, base_schema, len(out_names)),
                *base_fn(base_schema).strategies,
            ]
            specs = self.keep_out_placements(candidates, wanted)
            if not specs:
                specs = self.redistributed_candidates(base_schema, base_fn, wanted)
            if not specs:
                raise RuntimeError(
                    f"{op_schema.op}: no valid sharding strategy for the input placements."
                )
            return self.schema.OpStrategy(specs)

        return strategy

    def keep_out_placements(self, specs: Sequence[Any], wanted: list[Any]) -> list[Any]:
        kept = []
        for spec in specs:
            outputs = _output_specs(spec, len(wanted))
            if all(
                w is None or (o is not None and tuple(o.placements) == w)
                for o, w in zip(outputs, wanted, strict=True)
            ):
                kept.append(spec)
        return kept

    def choices(self, spec: Any) -> list[tuple[Any, ...]]:
        """Every placement of ``spec``'s tensor: replicated or sharded on any dim, per mesh dim."""
        from torch.distributed.tensor import Shard

        ndim = len(spec.tensor_meta.shape) if spec.tensor_meta is not None else 0
        per_mesh_dim = [self.replicate_type(), *(Shard(d) for d in range(ndim))]
        options: list[tuple[Any, ...]] = [tuple(spec.placements)]
        for combo in itertools.islice(
            itertools.product(per_mesh_dim, repeat=len(spec.placements)), _MAX_CHOICES
        ):
            if combo not in options:
                options.append(combo)
        return options

    def moved(self, args: Sequence[Any], which: int, placements: tuple[Any, ...]) -> list[Any]:
        """``args`` with tensor argument ``which`` (a tensor or a tensor list) at ``placements``."""
        placed: list[Any] = []
        for i, arg in enumerate(args):
            if i == which and isinstance(arg, self.schema.OpStrategy):
                current = arg.strategies[0].output_spec
                spec = self.schema.DTensorSpec(
                    current.mesh, placements, tensor_meta=current.tensor_meta
                )
                placed.append(self.schema.OpStrategy([self.schema.OpSpec(spec)]))
            elif i == which and isinstance(arg, self.schema.TupleStrategy):
                children = [self.moved([c], 0, placements)[0] for c in arg.children]
                placed.append(self.schema.TupleStrategy(children))
            else:
                placed.append(arg)
        return placed

    def redistributed_candidates(
        self, base_schema: Any, base_fn: StrategyFn, wanted: list[Any]
    ) -> list[Any]:
        """Ask the base strategy again with one tensor argument moved; keep what fits ``wanted``.

        One argument moves at a time because 2.13's strategies pair the inputs' candidate
        lists by position; the base strategy places the other inputs to match.
        """
        originals = self.leaves(base_schema.args_schema)
        specs: list[Any] = []
        for which, arg in enumerate(base_schema.args_schema):
            leaves = self.leaves([arg])
            if not leaves:
                continue
            for placements in self.choices(leaves[0].strategies[0].output_spec)[1:]:
                retry = self.make_schema(
                    base_schema.op,
                    self.moved(base_schema.args_schema, which, placements),
                    base_schema.kwargs_schema,
                    base_schema.schema_info,
                )
                specs.extend(self.keep_out_placements(base_fn(retry).strategies, wanted))
        for spec in specs:
            # Costs were computed against the moved input; the real inputs are the originals.
            inputs = spec.input_specs or [spec.output_specs] * len(originals)
            spec.redistribute_cost = [
                self.utils.generate_redistribute_costs(orig, target)
                for orig, target in zip(originals, inputs, strict=True)
            ]
        return specs

    def inplace_variant(self, rule: ShardingRule, base_op: Any, base_fn: StrategyFn) -> StrategyFn:
        def strategy(op_schema: Any) -> Any:
            self_placements = self.placements(op_schema.args_schema[0])
            base_schema = self.make_schema(
                base_op, op_schema.args_schema, op_schema.kwargs_schema, op_schema.schema_info
            )
            kept = []
            for spec in [*self.passthrough(rule, base_schema, 1), *base_fn(base_schema).strategies]:
                first_input = spec.input_specs[0] if spec.input_specs else spec.output_specs
                output = _output_specs(spec, 1)[0]
                if (
                    tuple(first_input.placements) == self_placements
                    and output is not None
                    and tuple(output.placements) == self_placements
                ):
                    kept.append(spec)
            if not kept:
                # 2.14's words for the same refusal.
                raise RuntimeError(
                    f"{op_schema.op}: in-place operations that require placement changes "
                    f"are not supported. The input has placement {self_placements}, "
                    "but no valid strategy preserves this placement. "
                    "Please use the out-of-place version of this operation instead."
                )
            return self.schema.OpStrategy(kept)

        return strategy

    def alias(self, base_op: Any, base_fn: StrategyFn) -> StrategyFn:
        def strategy(op_schema: Any) -> Any:
            # prims.amax(inp, dims) is aten.amax(inp, dims or all, keepdim=False).
            args = list(op_schema.args_schema)
            dims = args[1] if len(args) > 1 and args[1] is not None else []
            base_schema = self.make_schema(
                base_op, [args[0], dims, False], {}, op_schema.schema_info
            )
            return base_fn(base_schema)

        return strategy


def install_rules() -> list[str]:
    """Register every rule of :data:`RULES` this torch lacks; return the ops added.

    Idempotent. Raises ``ImportError`` when this torch has no DTensor.
    """
    propagator, op_schema, ops_utils = _tensor_modules()
    rules = _Rules(op_schema, ops_utils)
    added = []
    with _lock:
        registered = _registered(propagator)
        for rule in RULES:
            op = _resolve(rule.op)
            if op in registered:
                continue
            base = _resolve(rule.base)
            if rule.kind == "functional":
                info = propagator.op_single_dim_strategy_funcs.get(base)
                if info is None:
                    continue
                schema_info = propagator.op_to_schema_info_for_single_dim_strategy.get(base)
                propagator.register_single_dim_op_strategy(op, info, schema_info)
            else:
                base_fn = propagator.op_strategy_funcs.get(base)
                if base_fn is None:
                    continue
                if rule.kind == "out":
                    fn = rules.out_variant(rule, base, base_fn, _out_names(op))
                elif rule.kind == "inplace":
                    fn = rules.inplace_variant(rule, base, base_fn)
                else:
                    fn = rules.alias(base, base_fn)
                propagator.register_op_strategy(op, fn, propagator.op_to_schema_info.get(base))
            _added[op] = rule
            added.append(rule.op)
        if added:
            _clear_caches()
    return added


def uninstall_rules() -> list[str]:
    """Remove the rules :func:`install_rules` registered; return the ops removed."""
    propagator, _, _ = _tensor_modules()
    removed = []
    with _lock:
        for op, rule in list(_added.items()):
            for registry in (
                propagator.op_strategy_funcs,
                propagator.op_to_schema_info,
                propagator.op_single_dim_strategy_funcs,
                propagator.op_to_schema_info_for_single_dim_strategy,
            ):
                registry.pop(op, None)
            del _added[op]
            removed.append(rule.op)
        if removed:
            _clear_caches()
    return removed


def missing_rules() -> list[str]:
    """The ops of :data:`RULES` this torch does not shard right now."""
    propagator, _, _ = _tensor_modules()
    registered = _registered(propagator)
    return [rule.op for rule in RULES if _resolve(rule.op) not in registered]


def rule_counts() -> dict[str, int]:
    """How many operator overloads DTensor can shard: by torch, by torchnext, in total."""
    propagator, _, _ = _tensor_modules()
    with _lock:
        total = len(_registered(propagator))
        ours = len(_added)
    return {
        "torch": total - ours,
        "torchnext": ours,
        "total": total,
        "torch_2_14": TORCH214_RULE_COUNT,
    }
