"""The DTensor sharding rules torch 2.14 has and 2.13 lacks, as data.

torch 2.14.1 registers sharding strategies for 1,239 operator overloads, 2.13.0 for
1,164: 2.14 adds the 77 below and drops ``aten.cholesky.default``/``.out`` (the op was
removed). Every one of the 77 is a mechanical variant of an operator 2.13 already
shards: an ``out=`` overload, an in-place overload with the same schema, the functional
form of an in-place ``_foreach`` op, or a ``prims`` op with an ``aten`` twin.
:mod:`torchnext.compat.dtensor_rules` registers them on 2.13 by reusing 2.13's own
strategy for :attr:`ShardingRule.base`, so the placements follow the same math.

Use :data:`RULES` to see what is covered; what not to assume: 2.14 also rewrote many
base strategies (they became "single-dim" strategies); where 2.13's base strategy
differs from 2.14's, the variant follows 2.13's base, exactly as 2.13's own base op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ShardingRule", "RULES", "RuleKind", "TORCH214_RULE_COUNT", "TORCH213_RULE_COUNT"]

RuleKind = Literal["out", "inplace", "functional", "alias"]

TORCH214_RULE_COUNT = 1239
"""Operator overloads with a sharding strategy in torch 2.14.1."""
TORCH213_RULE_COUNT = 1164
"""Operator overloads with a sharding strategy in torch 2.13.0."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardingRule:
    """One operator overload 2.14 shards and 2.13 does not."""

    op: str
    """The overload, spelled ``namespace.name.overload`` (``aten.sum.out``)."""
    base: str
    """The overload whose 2.13 strategy supplies the placements."""
    kind: RuleKind
    """``out``: ``op`` is ``base`` plus ``out=`` tensors, whose placements the output must
    keep (DTensor never redistributes an ``out=`` tensor). ``inplace``: ``op`` is the
    in-place form of ``base``; the result is ``self`` and keeps its placement.
    ``functional``: ``op`` is the out-of-place form of the in-place single-dim
    ``base``. ``alias``: ``op`` computes ``base`` with its arguments renamed."""
    partial: tuple[str, ...] = ()
    """Reductions whose ``Partial`` inputs pass straight through to the output (the op
    is linear in them, so 2.14 keeps them partial); empty for most ops."""


def _out(op: str, base: str, partial: tuple[str, ...] = ()) -> ShardingRule:
    return ShardingRule(op=op, base=base, kind="out", partial=partial)


_SUM_AVG = ("sum", "avg")
_ELEMENTWISE = ("sum", "avg", "min", "max")


RULES: tuple[ShardingRule, ...] = (
    # Pooling.
    _out("aten._adaptive_avg_pool2d.out", "aten._adaptive_avg_pool2d.default"),
    _out("aten._adaptive_avg_pool3d.out", "aten._adaptive_avg_pool3d.default"),
    _out("aten.adaptive_avg_pool1d.out", "aten.adaptive_avg_pool1d.default"),
    _out("aten.adaptive_max_pool2d.out", "aten.adaptive_max_pool2d.default"),
    _out("aten.adaptive_max_pool3d.out", "aten.adaptive_max_pool3d.default"),
    _out("aten.avg_pool1d.out", "aten.avg_pool1d.default"),
    _out("aten.avg_pool2d.out", "aten.avg_pool2d.default"),
    _out("aten.avg_pool3d.out", "aten.avg_pool3d.default"),
    _out("aten.fractional_max_pool2d.output", "aten.fractional_max_pool2d.default"),
    _out("aten.fractional_max_pool3d.output", "aten.fractional_max_pool3d.default"),
    _out("aten.max_pool2d_with_indices.out", "aten.max_pool2d_with_indices.default"),
    _out("aten.max_pool3d_with_indices.out", "aten.max_pool3d_with_indices.default"),
    # Softmax and losses.
    _out("aten._log_softmax.out", "aten._log_softmax.default"),
    _out("aten._log_softmax_backward_data.out", "aten._log_softmax_backward_data.default"),
    _out("aten._softmax.out", "aten._softmax.default"),
    _out("aten._softmax_backward_data.out", "aten._softmax_backward_data.default"),
    _out("aten.nll_loss_forward.output", "aten.nll_loss_forward.default"),
    _out("aten.nll_loss_backward.grad_input", "aten.nll_loss_backward.default"),
    _out("aten.nll_loss2d_forward.output", "aten.nll_loss2d_forward.default"),
    _out("aten.nll_loss2d_backward.grad_input", "aten.nll_loss2d_backward.default"),
    # Reductions.
    _out("aten.all.all_out", "aten.all.default"),
    _out("aten.all.out", "aten.all.dim"),
    _out("aten.any.all_out", "aten.any.default"),
    _out("aten.any.dims_out", "aten.any.dims"),
    _out("aten.argmax.out", "aten.argmax.default"),
    _out("aten.argmin.out", "aten.argmin.default"),
    _out("aten.max.unary_out", "aten.max.default"),
    _out("aten.min.unary_out", "aten.min.default"),
    _out("aten.mean.dtype_out", "aten.mean.default"),
    _out("aten.median.out", "aten.median.default"),
    _out("aten.nanmedian.out", "aten.nanmedian.default"),
    _out("aten.nansum.out", "aten.nansum.default"),
    _out("aten.prod.out", "aten.prod.default"),
    _out("aten.sum.out", "aten.sum.default"),
    _out("aten.sum.IntList_out", "aten.sum.dim_IntList"),
    _out("aten.logsumexp.out", "aten.logsumexp.default"),
    _out("aten.linalg_vector_norm.out", "aten.linalg_vector_norm.default"),
    _out("aten.norm.Scalar_out", "aten.norm.Scalar"),
    _out("aten.histc.out", "aten.histc.default"),
    ShardingRule(op="prims.amax.default", base="aten.amax.default", kind="alias"),
    ShardingRule(op="prims.amin.default", base="aten.amin.default", kind="alias"),
    # Scans.
    _out("aten.cummax.out", "aten.cummax.default"),
    _out("aten.cummin.out", "aten.cummin.default"),
    _out("aten.cumprod.out", "aten.cumprod.default"),
    _out("aten.cumsum.out", "aten.cumsum.default", _SUM_AVG),
    _out("aten.logcumsumexp.out", "aten.logcumsumexp.default"),
    ShardingRule(op="aten.cumprod_.default", base="aten.cumprod.default", kind="inplace"),
    ShardingRule(
        op="aten.cumsum_.default", base="aten.cumsum.default", kind="inplace", partial=_SUM_AVG
    ),
    # Sorting.
    _out("aten.sort.values", "aten.sort.default"),
    _out("aten.sort.values_stable", "aten.sort.stable"),
    _out("aten.topk.values", "aten.topk.default"),
    # Linear algebra (replicated, as in both versions).
    _out("aten._linalg_eigh.eigenvalues", "aten._linalg_eigh.default"),
    _out("aten._linalg_svd.U", "aten._linalg_svd.default"),
    _out("aten.linalg_qr.out", "aten.linalg_qr.default"),
    _out("aten.diag.out", "aten.diag.default"),
    _out("aten.diag_embed.out", "aten.diag_embed.default"),
    _out("aten.diagonal_copy.out", "aten.diagonal_copy.default"),
    _out("aten.tril.out", "aten.tril.default"),
    _out("aten.triu.out", "aten.triu.default"),
    ShardingRule(op="aten.tril_.default", base="aten.tril.default", kind="inplace"),
    ShardingRule(op="aten.triu_.default", base="aten.triu.default", kind="inplace"),
    _out("aten.dot.out", "aten.dot.default"),
    # Indexing, scatter and slicing.
    _out("aten.cat.out", "aten.cat.default"),
    _out("aten.gather.out", "aten.gather.default"),
    _out("aten.scatter.src_out", "aten.scatter.src"),
    _out("aten.scatter.value_out", "aten.scatter.value"),
    _out("aten.scatter_add.out", "aten.scatter_add.default"),
    ShardingRule(op="aten.scatter_add_.default", base="aten.scatter_add.default", kind="inplace"),
    _out("aten.select_backward.out", "aten.select_backward.default"),
    _out("aten.slice_backward.out", "aten.slice_backward.default"),
    _out("aten.slice_scatter.out", "aten.slice_scatter.default", _ELEMENTWISE),
    ShardingRule(op="aten.t_.default", base="aten.t.default", kind="inplace"),
    # Filling.
    _out("aten.fill.Scalar_out", "aten.fill_.Scalar"),
    _out("aten.zero.out", "aten.zero_.default"),
    # Optimizer arithmetic (_foreach): the out-of-place forms of 2.13's in-place rules.
    ShardingRule(
        op="aten._foreach_addcdiv.Scalar", base="aten._foreach_addcdiv_.Scalar", kind="functional"
    ),
    ShardingRule(
        op="aten._foreach_addcdiv.ScalarList",
        base="aten._foreach_addcdiv_.ScalarList",
        kind="functional",
    ),
    ShardingRule(
        op="aten._foreach_addcmul.ScalarList",
        base="aten._foreach_addcmul_.ScalarList",
        kind="functional",
    ),
)
