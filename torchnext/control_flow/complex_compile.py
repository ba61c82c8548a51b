"""``torch.compile`` for functions with complex inputs, intermediates and outputs.

Use :func:`complex_compile` in place of ``torch.compile`` when a function works on
complex tensors and should compile with Inductor on the CPU. It switches on torch's
complex decomposition (``torch._functorch.config.enable_complex_wrapper``, present in
2.13 and 2.14), which rewrites every complex op into real-arithmetic ops on real and
imaginary parts, and fixes what that flag leaves broken in both versions:

* **complex outputs** (2.13 and 2.14 fail re-packing them): the compiled region returns
  each complex output as a real ``(..., 2)`` tensor and the wrapper views it back as
  complex, outside the graph;
* **FFT** (no decomposition in torch): complex-to-complex FFTs (``fft``, ``ifft``,
  ``fftn``/``fft2`` on complex input) are decomposed into real matmuls with the DFT
  matrix, which is exact and fast for the small and moderate sizes typical of compiled
  blocks (cost O(n^2) per transformed dim);
* **unsupported ops** fail with :class:`~torchnext.errors.UnsupportedComplexOpError`
  naming the op, instead of a backend traceback.

What not to assume: real-input FFTs (``rfft``, ``fft`` of a real tensor) are not
decomposed (cast the input to complex first); results equal eager within float
tolerance, not bitwise; the option is process-global while a call runs.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchnext.compat import control_flow_internals as internals
from torchnext.compat.control_flow_internals import pytree
from torchnext.errors import UnsupportedComplexOpError

__all__ = ["complex_compile"]

_UNSUPPORTED = re.compile(r"Multiple dispatch failed for '(?:torch\._ops\.)?([\w.]+)'")


def _dft_last(
    re_part: torch.Tensor, im_part: torch.Tensor, forward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalised DFT along the last dim, on (real, imag) parts."""
    n = re_part.shape[-1]
    k = torch.arange(n, device=re_part.device, dtype=re_part.dtype)
    angle = (2.0 * math.pi / n) * torch.outer(k, k)
    w_re = torch.cos(angle)
    w_im = -torch.sin(angle) if forward else torch.sin(angle)
    out_re = re_part @ w_re - im_part @ w_im
    out_im = re_part @ w_im + im_part @ w_re
    return out_re, out_im


def _fft_c2c_rule(self: Any, dim: list[int], normalization: int, forward: bool) -> Any:
    ComplexTensor = internals.complex_tensor_type()
    re_part, im_part = self.re, self.im
    scale = 1
    for d in dim:
        d = d % re_part.dim()
        re_part, im_part = re_part.movedim(d, -1), im_part.movedim(d, -1)
        re_part, im_part = _dft_last(re_part, im_part, forward)
        re_part, im_part = re_part.movedim(-1, d), im_part.movedim(-1, d)
        scale *= self.shape[d]
    # normalization: 0 none, 1 by 1/sqrt(n), 2 by 1/n (aten's fft_norm_mode).
    if normalization == 1:
        re_part, im_part = re_part / math.sqrt(scale), im_part / math.sqrt(scale)
    elif normalization == 2:
        re_part, im_part = re_part / scale, im_part / scale
    return ComplexTensor(re_part.contiguous(), im_part.contiguous())


@contextlib.contextmanager
def _complex_rules() -> Iterator[None]:
    """Enable the decomposition and torchnext's extra op rules for the duration."""
    table = internals.complex_ops_table()
    if table is None:
        raise UnsupportedComplexOpError(
            f"torch {torch.__version__} has no complex decomposition for torch.compile "
            "(torch._subclasses.complex_tensor); complex_compile needs torch >= 2.13"
        )
    added = []
    for op, rule in ((internals.fft_c2c_op(), _fft_c2c_rule),):
        if op not in table:
            table[op] = rule
            added.append(op)
    try:
        with (
            internals.functorch_config().patch(enable_complex_wrapper=True),
            _without_inductor_complex_add(),
            warnings.catch_warnings(),
        ):
            # The decomposed graph splits each complex *input* with view_as_real, which
            # Inductor lowers as a fallback and reports with this warning although all
            # arithmetic after it is real; it is noise here, not a slow path.
            warnings.filterwarnings(
                "ignore", message="Torchinductor does not support code generation for complex"
            )
            yield
    finally:
        for op in added:
            table.pop(op, None)


@contextlib.contextmanager
def _without_inductor_complex_add() -> Iterator[None]:
    """Hide Inductor's complex ``add`` decomposition while compiling.

    It rewrites complex + complex into ``view(dtype)`` tricks on the interleaved
    storage before the complex decomposition runs, which then views a real/imaginary
    pair with the complex element count and fails ("shape [.., 2] is invalid").
    """
    inductor_decomp = internals.inductor_decomposition()
    if inductor_decomp is None:
        yield
        return
    target = getattr(inductor_decomp, "add", None)
    tables = [inductor_decomp.decompositions, inductor_decomp.fast_random_decomps()]
    removed: list[tuple[dict[Any, Any], Any, Any]] = []
    for table in tables:
        for key, value in list(table.items()):
            if target is not None and value is target:
                removed.append((table, key, table.pop(key)))
    try:
        yield
    finally:
        for table, key, value in removed:
            table[key] = value


def _pack(out: Any) -> tuple[Any, tuple[bool, ...]]:
    leaves, spec = pytree.tree_flatten(out)
    flags = tuple(isinstance(t, torch.Tensor) and t.is_complex() for t in leaves)
    # A fresh real tensor, not a view of the complex result: torch's decomposition
    # cannot re-create a view of a complex intermediate as a graph output.
    packed = [torch.view_as_real(t).clone() if f else t for t, f in zip(leaves, flags, strict=True)]
    return pytree.tree_unflatten(packed, spec), flags


def _unpack(packed: Any, flags: tuple[bool, ...]) -> Any:
    leaves, spec = pytree.tree_flatten(packed)
    out = [
        torch.view_as_complex(t.contiguous()) if f else t
        for t, f in zip(leaves, flags, strict=True)
    ]
    return pytree.tree_unflatten(out, spec)


def _unsupported_op(exc: BaseException) -> str | None:
    seen: BaseException | None = exc
    while seen is not None:
        match = _UNSUPPORTED.search(str(seen))
        if match and "ComplexTensor" in str(seen):
            return match.group(1)
        seen = seen.__cause__ or seen.__context__
    return None


def complex_compile(fn: Callable[..., Any] | None = None, **compile_kwargs: Any) -> Any:
    """``torch.compile(fn, **compile_kwargs)`` that also compiles complex-tensor code.

    Usable as ``complex_compile(fn)``, ``complex_compile(fn, fullgraph=True)`` or as a
    decorator (``@complex_compile`` / ``@complex_compile(dynamic=False)``).

    Raises:
        UnsupportedComplexOpError: (a ``NotImplementedError``) at the first call, when
            ``fn`` uses an op with no real-arithmetic decomposition; the message names
            the op.
    """
    if fn is None:
        return functools.partial(complex_compile, **compile_kwargs)
    if not callable(fn):
        raise TypeError(f"complex_compile: fn must be callable, got {type(fn).__name__}")

    def packed_fn(*args: Any, **kwargs: Any) -> tuple[Any, tuple[bool, ...]]:
        return _pack(fn(*args, **kwargs))

    compiled = torch.compile(packed_fn, **compile_kwargs)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _complex_rules():
            try:
                packed, flags = compiled(*args, **kwargs)
            except Exception as exc:
                op = _unsupported_op(exc)
                if op is None:
                    raise
                raise UnsupportedComplexOpError(
                    f"complex_compile: {op} has no real-arithmetic decomposition for complex "
                    f"tensors, so {getattr(fn, '__qualname__', 'the function')} cannot "
                    "compile with complex support. Move that op out of the compiled "
                    "function, or compile without complex_compile (torch then falls back "
                    "to eager kernels for complex ops)."
                ) from exc
        return _unpack(packed, flags)

    return run
