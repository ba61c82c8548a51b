"""The private parts of torch that :mod:`torchnext.control_flow` uses, in one place.

``switch``, ``while_loop``, ``dynamic_spec`` and ``complex_compile`` are built on torch's
higher-order-op machinery, its fake tensors, functorch's batching rules, Dynamo's
``comptime`` and the complex-tensor decomposition, none of which is public API. Every
access from :mod:`torchnext.control_flow` goes through this module, so a torch release
that moves one breaks one place, and the table says what was checked. The one
exception is :mod:`torchnext.control_flow._flat_switch_compile`, which registers the
flat switch op with Dynamo's and Inductor's tables; its ``supported()`` checks every
piece it uses before it registers anything, and without them ``switch`` keeps its
``torch.cond`` tree.

========================================================  ==================================  ==============
access                                                    what for                            tested on
========================================================  ==================================  ==============
``torch.utils._pytree``                                   flatten operands and outputs        2.13.0, 2.14.1
``torch._ops.HigherOrderOperator``, ``torch._C.DispatchKey``  the flat switch op and its keys  2.13.0, 2.14.1
``torch._higher_order_ops.utils`` (``create_bw_fn`` ...)  trace branches, their backward      2.13.0, 2.14.1
``torch._higher_order_ops.cond._merge_output``            merge branch outputs under vmap     2.13.0, 2.14.1
``torch._higher_order_ops.utils._maybe_compile_and_run_fn``  compile an eager switch call      2.13.0, 2.14.1
``torch._C._dispatch_tls_local_{include,exclude}_set``    keys the backward is traced under   2.13.0, 2.14.1
``torch._C._AutoDispatchBelowAutograd``                   run the op below autograd           2.13.0, 2.14.1
``torch._C._functorch`` (``TransformType``, batch dims)   the op's vmap rule; "in a transform"  2.13.0, 2.14.1
``torch.utils._python_dispatch._get_current_dispatch_mode``  "plain eager" test                2.13.0, 2.14.1
``torch._subclasses.fake_tensor.FakeTensorMode``          check branches and bodies on fakes  2.13.0, 2.14.1
``torch._dynamo.comptime``, ``torch._dynamo.exc``         trace-time hooks; errors to explain  2.13.0, 2.14.1
``torch._subclasses.complex_tensor`` and its op table     complex tensors in torch.compile    2.13.0, 2.14.1
``torch._functorch.config.enable_complex_wrapper``        switch the decomposition on         2.13.0, 2.14.1
``torch._inductor.decomposition``                         hide its complex ``add`` rewrite    2.13.0, 2.14.1
``torch.ops.aten._fft_c2c``                               the complex FFT rule added          2.13.0, 2.14.1
``ShapesSpec._params``, ``TensorSpec._specs``             read a 2.14-style dynamic spec      2.13.0, 2.14.1
``torch.utils._sympy.value_ranges.ValueRanges``           a declared dim's range              2.13.0, 2.14.1
========================================================  ==================================  ==============

The unit suite runs the control-flow tests on 2.13.0, the conformance suite on 2.14.1.
What not to assume: these are not torch's public API. The names imported at the top
are loaded by ``import torch`` anyway; Dynamo, Inductor and the complex tensor are
imported only when a function here is called, so importing torchnext never loads them.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._C import DispatchKey
from torch._C import _AutoDispatchBelowAutograd as AutoDispatchBelowAutograd
from torch._C._functorch import (
    TransformType,
    _add_batch_dim,
    get_unwrapped,
    is_batchedtensor,
    maybe_current_level,
    maybe_get_bdim,
)
from torch._higher_order_ops.cond import _merge_output
from torch._higher_order_ops.utils import (
    _check_alias_and_mutation,
    _maybe_run_with_interpreter,
    create_bw_fn,
    fill_none_with_masks,
    materialize_as_graph,
    reenter_make_fx,
    save_values_for_backward,
    saved_values,
    unique_graph_id,
)
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = [
    "AutoDispatchBelowAutograd",
    "DispatchKey",
    "FakeTensorMode",
    "HigherOrderOperator",
    "VMAP",
    "add_batch_dim",
    "check_alias_and_mutation",
    "comptime",
    "complex_ops_table",
    "complex_tensor_type",
    "create_bw_fn",
    "current_dispatch_mode",
    "dispatch_exclude_set",
    "dispatch_include_set",
    "dynamo_exception",
    "fft_c2c_op",
    "fill_none_with_masks",
    "functorch_config",
    "functorch_level_active",
    "get_unwrapped",
    "inductor_decomposition",
    "is_batchedtensor",
    "materialize_as_graph",
    "maybe_compile_and_run",
    "maybe_get_bdim",
    "maybe_run_with_interpreter",
    "merge_output",
    "pytree",
    "reenter_make_fx",
    "save_values_for_backward",
    "saved_values",
    "spec_dims",
    "spec_has_var_args",
    "spec_named_args",
    "spec_params",
    "unique_graph_id",
    "value_ranges_type",
]

VMAP: Any = TransformType.Vmap
"""The functorch transform key the flat switch's vmap rule is registered under."""

add_batch_dim = _add_batch_dim
check_alias_and_mutation = _check_alias_and_mutation
maybe_run_with_interpreter = _maybe_run_with_interpreter
merge_output = _merge_output

maybe_compile_and_run: Callable[..., Any] | None
try:
    from torch._higher_order_ops.utils import _maybe_compile_and_run_fn as maybe_compile_and_run
except ImportError:  # older torch: the top-level cond compiles the whole tree itself
    maybe_compile_and_run = None


def dispatch_include_set() -> Any:
    """The dispatch keys included on this thread now (the backward is traced under them)."""
    return torch._C._dispatch_tls_local_include_set()


def dispatch_exclude_set() -> Any:
    """The dispatch keys excluded on this thread now."""
    return torch._C._dispatch_tls_local_exclude_set()


def functorch_level_active() -> bool:
    """True inside a functorch transform (vmap, grad, ...)."""
    return maybe_current_level() is not None


def current_dispatch_mode() -> Any:
    """The innermost ``TorchDispatchMode`` in force, or None in plain eager."""
    return _get_current_dispatch_mode()


def comptime() -> Any:
    """Dynamo's ``comptime``: run a function once, while Dynamo traces."""
    from torch._dynamo.comptime import comptime as dynamo_comptime

    return dynamo_comptime


def dynamo_exception() -> type[BaseException]:
    """The base class of Dynamo's errors (``TorchDynamoException``)."""
    from torch._dynamo.exc import TorchDynamoException

    return TorchDynamoException


def complex_tensor_type() -> type:
    """torch's ``ComplexTensor`` subclass (a complex tensor as a real/imaginary pair)."""
    from torch._subclasses.complex_tensor import ComplexTensor

    return ComplexTensor


def complex_ops_table() -> dict[Any, Any] | None:
    """The complex decomposition's op rule table, or None on a torch without it."""
    try:
        from torch._subclasses.complex_tensor._ops.common import COMPLEX_OPS_TABLE
    except ImportError:
        return None
    return COMPLEX_OPS_TABLE


def functorch_config() -> ModuleType:
    """``torch._functorch.config`` (its ``patch`` switches the complex wrapper on)."""
    import torch._functorch.config as config

    return config


def inductor_decomposition() -> ModuleType | None:
    """``torch._inductor.decomposition``, or None where Inductor cannot be imported."""
    try:
        import torch._inductor.decomposition as decomposition
    except ImportError:
        return None
    return decomposition


def fft_c2c_op() -> Any:
    """``aten._fft_c2c.default``, the op ``torch.fft.fft`` of a complex tensor lowers to."""
    return torch.ops.aten._fft_c2c.default


def spec_params(spec: Any) -> Any:
    """The ``ParamsSpec`` inside a ``ShapesSpec`` (None when this torch stores none)."""
    return getattr(spec, "_params", None)


def spec_dims(leaf: Any) -> list[Any]:
    """The per-dimension entries of a ``TensorSpec``."""
    return list(leaf._specs)


def value_ranges_type() -> type:
    """``ValueRanges``, the range type of a symbolic size's constraint."""
    from torch.utils._sympy.value_ranges import ValueRanges

    return ValueRanges


def spec_named_args(params: Any) -> dict[str, Any]:
    """A ``ParamsSpec``'s entries for named parameters (empty when it has none)."""
    named = getattr(params, "_named_args", None)
    return dict(named) if isinstance(named, dict) else {}


def spec_has_var_args(params: Any) -> bool:
    """Whether a ``ParamsSpec`` has ``*args`` or ``**kwargs`` entries."""
    return bool(getattr(params, "_varargs", None) or getattr(params, "_varkw", None))
