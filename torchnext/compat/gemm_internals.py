"""The private parts of torch that :mod:`torchnext.gemm` uses, asked in one place.

torchnext's GEMM routes compare themselves against, and sometimes call, torch's own kernels
that have no public name on 2.13: the native grouped and scaled GEMMs, oneDNN's fused
linear-pointwise, the int4 weight-only CPU kernel, and Inductor's configuration. Each access
is a small function here, listed in its section's table with what it is for and the torch
versions it is tested on (the unit suite runs 2.13.0, the conformance suite 2.14.1).

What not to assume: none of this is public API. A torch release may rename any of it; then
only this module changes, and each function says what it returns when the access is missing
(``None`` or ``False``, never an exception at import time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "compile_fx_with_post_grad_pass",
    "inductor_available",
    "inductor_config",
    "int4pack_convert_for_cpu",
    "int4pack_mm_for_cpu",
    "native_grouped_mm",
    "native_grouped_mm_accepts_layout",
    "native_grouped_mm_is_kernel",
    "native_scaled_mm",
    "onednn_has_bf16",
    "onednn_linear_pointwise_binary",
    "onednn_linear_pointwise",
    "onednn_pack_linear_weight",
    "register_backend",
    "torch_version_key",
]


def torch_version_key() -> str:
    """The torch build a tuned choice belongs to (version and git revision)."""
    return f"{torch.__version__}+{getattr(torch.version, 'git_version', '')[:12]}"


# --------------------------------------------------------------------------- fused GEMM
# ======================================================  ===============================  ==============
# access                                                  what for                         tested on
# ======================================================  ===============================  ==============
# ``torch.ops.mkldnn._linear_pointwise``                  oneDNN GEMM + activation post-op  2.13.0
# ``torch.ops.mkldnn._linear_pointwise.binary``           oneDNN GEMM + add post-op          2.13.0
# ``torch.ops.mkldnn._reorder_linear_weight``             the weight in oneDNN's layout      2.13.0
# ``torch._inductor.codecache`` (import only)             is the Inductor route possible    2.13.0
# ``torch._inductor.compile_fx.compile_fx``               the epilogue backend's compiler   2.13.0
# ``torch._inductor.custom_graph_pass.CustomGraphPass``   a cache-keyed post-grad pass      2.13.0
# ``torch._dynamo.register_backend`` / ``list_backends``  ``backend="torchnext_gemm"``       2.13.0
# ``torch._inductor.config``                              Inductor knobs for the route       2.13.0
# ======================================================  ===============================  ==============


def onednn_linear_pointwise() -> Callable[..., torch.Tensor] | None:
    """oneDNN's fused ``linear + post-op`` CPU kernel, or ``None`` where this build lacks it.

    Called as ``f(x_MK, w_NK, bias_N | None, attr, scalars, algorithm)`` with ``attr`` one of
    ``"none" "relu" "gelu" "swish" "tanh" "sigmoid"`` (oneDNN's names).
    """
    if not torch.backends.mkldnn.is_available():
        return None
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    return None if op is None else op.default


def onednn_has_bf16() -> bool:
    """Whether oneDNN runs bfloat16 natively on this CPU (AVX-512 BF16 or AMX), so its fused
    linear-pointwise takes bfloat16 inputs at full speed; False where it would emulate."""
    if not torch.backends.mkldnn.is_available():
        return False
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


def onednn_linear_pointwise_binary() -> Callable[..., torch.Tensor] | None:
    """oneDNN's fused ``linear + binary`` CPU kernel, or ``None`` where this build lacks it.

    Called as ``f(x_MK, other_MN, w_NK, bias_N | None, attr)`` with ``attr`` one of
    ``"add" "sub" "mul"``: ``linear(x) <attr> other`` in one kernel.
    """
    if not torch.backends.mkldnn.is_available():
        return None
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    return None if op is None else getattr(op, "binary", None)


def inductor_available() -> bool:
    """True when Inductor (torch.compile's default backend) imports here."""
    try:
        import torch._inductor.codecache  # noqa: F401  (import cost only)
    except ImportError:
        return False
    return True


def onednn_pack_linear_weight() -> Callable[..., torch.Tensor] | None:
    """oneDNN's weight reorder for ``_linear_pointwise`` (``None`` where missing)."""
    if not torch.backends.mkldnn.is_available():
        return None
    op = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    return None if op is None else op.default


def inductor_config() -> Any:
    """``torch._inductor.config`` (imported on first use: it pulls in Inductor)."""
    import torch._inductor.config as config

    return config


def compile_fx_with_post_grad_pass(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    graph_pass: Callable[[torch.fx.Graph], object],
    pass_id: tuple[object, ...],
) -> Callable[..., Any]:
    """Inductor's ``compile_fx`` with ``graph_pass`` run after the configured post-grad pass.

    ``pass_id`` goes into Inductor's FX-graph cache key, so a graph compiled without the
    pass is never reused for one compiled with it (and the reverse).
    """
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.custom_graph_pass import CustomGraphPass

    config = inductor_config()
    chained = config.post_grad_custom_post_pass

    class ChainedPass(CustomGraphPass):  # type: ignore[misc]
        def __call__(self, graph: torch.fx.Graph) -> None:
            if chained is not None:
                chained(graph)
            graph_pass(graph)

        def uuid(self) -> Any:
            inner = getattr(chained, "uuid", lambda: repr(chained))()
            return (pass_id, inner)

    with config.patch(post_grad_custom_post_pass=ChainedPass()):
        compiled: Callable[..., Any] = compile_fx(gm, example_inputs)  # type: ignore[assignment]
    return compiled


def register_backend(name: str, backend: Callable[..., Any]) -> None:
    """Make ``torch.compile(backend=name)`` find ``backend`` (idempotent)."""
    from torch._dynamo import list_backends
    from torch._dynamo import register_backend as register

    if name not in list_backends(exclude_tags=()):
        register(compiler_fn=backend, name=name)


# --------------------------------------------------------------------------- scaled GEMM
# (owned by torchnext/gemm/scaled.py; its routes use only the public F.scaled_mm)
# ======================================================  ===============================  ==============
# access                                                  what for                         tested on
# ======================================================  ===============================  ==============
# ``torch._scaled_mm``                                    the FP8 baseline of the GPU bar  2.13.0, 2.14.1
# ======================================================  ===============================  ==============


def native_scaled_mm() -> Callable[..., torch.Tensor] | None:
    """``torch._scaled_mm`` (``a, b, scale_a, scale_b, bias=None, scale_result=None,
    out_dtype=None, use_fast_accum=False``), or ``None`` where this build lacks it."""
    return getattr(torch, "_scaled_mm", None)


# --------------------------------------------------------------------------- grouped GEMM
# (owned by torchnext/gemm/grouped.py and grouped_cpu.py)
# ======================================================  ===============================  ==============
# access                                                  what for                         tested on
# ======================================================  ===============================  ==============
# ``torch._grouped_mm``                                   torch's own grouped GEMM: the    2.13.0, 2.14.1
#                                                         CPU route for small problems,
#                                                         the sm90/sm100 bf16 CUDA route,
#                                                         and the benchmark's baseline
# its CUDA fast-path rule (cc 9.x/10.x, bf16 in and out)  where it is a real grouped        2.13.0 (source)
#                                                         kernel, not a loop of ``mm``
# its layout rule (16-byte strides and data pointers)     when it accepts the operands      2.13.0, 2.14.1
# ======================================================  ===============================  ==============


def native_grouped_mm() -> Callable[..., torch.Tensor] | None:
    """``torch._grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None)``, or ``None``.

    On the CPU it is a C++ loop of ``mm`` over the groups that leaves the rows (columns)
    past ``offs[-1]`` uninitialised and does not check the offsets' values.
    """
    op = getattr(torch, "_grouped_mm", None)
    return op if callable(op) else None


def native_grouped_mm_is_kernel(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs a real grouped kernel here rather than its loop.

    torch 2.13 takes its CUTLASS path only on CUDA (not ROCm) devices of compute capability
    9.0 or 10.x with bfloat16 operands and output; everywhere else it loops over ``mm``.
    """
    if device.type != "cuda" or torch.version.hip is not None or dtype != torch.bfloat16:
        return False
    if native_grouped_mm() is None or not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability(device)
    return (major, minor) == (9, 0) or major == 10


def native_grouped_mm_accepts_layout(t: torch.Tensor) -> bool:
    """Whether ``t`` meets ``torch._grouped_mm``'s layout rule (else it raises).

    The last two dims must be row- or column-major with the leading stride a multiple of
    16 bytes, and the data pointer 16-byte aligned.
    """
    if t.dim() < 2 or t.data_ptr() % 16:
        return False
    align = max(1, 16 // t.element_size())
    s_row, s_col = t.stride(-2), t.stride(-1)
    rows, cols = t.shape[-2], t.shape[-1]
    if s_col == 1 and s_row >= max(1, cols):
        return s_row % align == 0
    if s_row == 1 and s_col >= max(1, rows):
        return s_col % align == 0
    return False


# --------------------------------------------------------------------------- decode GEMV
# (owned by torchnext/gemm/gemv.py and quantized_weight.py)
# ======================================================  ===============================  ==============
# access                                                  what for                         tested on
# ======================================================  ===============================  ==============
# ``torch.ops.aten._convert_weight_to_int4pack_for_cpu``  int4 weights in the layout of      2.13.0
#                                                         torch's int4 CPU kernel
# ``torch.ops.aten._weight_int4pack_mm_for_cpu``          that kernel: the baseline int4     2.13.0
#                                                         GEMV is measured against
# ======================================================  ===============================  ==============


def int4pack_convert_for_cpu() -> Callable[..., torch.Tensor] | None:
    """``f(codes_NK int32 0..15, inner_k_tiles=1) -> packed uint8 [N, K/2]``, or ``None``."""
    op = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)
    return None if op is None else op.default


def int4pack_mm_for_cpu() -> Callable[..., torch.Tensor] | None:
    """``f(x_MK, packed, group_size, scales_and_zeros_GN2) -> [M, N]``, or ``None``.

    Computes ``x @ ((code - 8) * scale + zero).T`` per group of ``group_size`` along K; ``x``
    and the scale table in bfloat16, float16 or float32 (float32 has no vectorised path).
    """
    op = getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)
    return None if op is None else op.default
