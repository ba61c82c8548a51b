"""Autotuned GEMM with fused epilogues, block-scaled and grouped GEMM, and decode GEMV, on the
torch people run (2.13 and older, CPU or any GPU): torch 2.14's NVGEMM calls, everywhere.

- :func:`gemm` / :func:`linear`: ``epilogue(a @ b + bias)`` in one call, with 2.14's epilogue
  set (:class:`Epilogue` of :func:`relu`, :func:`gelu`, :func:`silu`, :func:`tanh`,
  :func:`sigmoid`, :func:`add`, :func:`mul`, :func:`scale`, an amax, the output cast), on
  the route an autotuner picked for this machine (:mod:`torchnext.gemm.autotune`).
  :func:`linear` also takes a quantized weight (:class:`NVFP4Weight`, :class:`MXFP4Weight`,
  :class:`Int4Weight`) and sends decode shapes (M <= 8) to a GEMV path.
- ``torch.compile(model, backend="torchnext_gemm")``: the same fusion for unchanged models.
- :func:`scaled_mm`: 2.14's ``F.scaled_mm`` with every recipe (TensorWise, RowWise,
  BlockWise1x16/1x32/1x128/128x128, swizzled scales, FP8/MX/NVFP4) on any device;
  :func:`mm_quantized` for torchao's ``NVFP4Tensor``/``MXTensor``; the formats bit for bit as
  torchao in :mod:`torchnext.gemm.formats`.
- :func:`grouped_mm`: 2.14's ``F.grouped_mm`` on any device, for mixture-of-experts.

Importing this package imports neither Triton, torchao nor Inductor; each route loads what it
needs on first use. ``torchnext doctor`` lists the routes this machine has.

Modules (one concept each; import the public names from this package):

- ``fused``, ``epilogue``, ``routes``, ``autotune``, ``prepared``, ``compile_pass``:
  :func:`gemm` / :func:`linear`, the epilogue, its routes, the route autotuner, repeated calls,
  the ``torch.compile`` backend.
- ``triton_gemm`` (the fused-epilogue Triton template) and ``triton_gemm_checks`` (its
  argument checks, run before Triton is imported).
- ``scaled`` (:func:`scaled_mm`'s routes, CPU emulation, :func:`mm_quantized`) and
  ``scaled_plan`` (its argument checks and plan); ``triton_scaled`` (the Triton kernel).
- ``formats`` (NVFP4/MX quantizers, scale swizzle, torchao interop) and ``elements`` (FP4/FP8
  element codes and ``ScaledOperand``, re-exported by ``formats``).
- ``grouped`` (:func:`grouped_mm`: checks, op, backward, routes), ``grouped_cpu`` (the CPU
  routes), ``grouped_avx512_source`` (the small-group kernels' C), ``triton_grouped``.
- ``gemv`` (the decode GEMV path), ``gemv_cpu`` (building and loading the C kernels),
  ``cpu_kernel_checks`` (what they trust), ``gemv_cpu_source``, ``gemv_avx512_source`` and
  ``decode8_source`` (their C source), ``triton_gemv`` (the Triton kernel).
- ``quantized_weight`` (:class:`NVFP4Weight`, :class:`MXFP4Weight`, :class:`Int4Weight`) and
  ``quantized_base`` (their base :class:`QuantizedWeight` and storage layout, re-exported by
  ``quantized_weight``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchnext._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "gemm": "fused",
        "linear": "fused",
        "Epilogue": "epilogue",
        "Step": "epilogue",
        "relu": "epilogue",
        "gelu": "epilogue",
        "silu": "epilogue",
        "tanh": "epilogue",
        "sigmoid": "epilogue",
        "add": "epilogue",
        "mul": "epilogue",
        "scale": "epilogue",
        "scaled_mm": "scaled",
        "mm_quantized": "scaled",
        "ScalingType": "scaled",
        "SwizzleType": "scaled",
        "grouped_mm": "grouped",
        "QuantizedWeight": "quantized_weight",
        "NVFP4Weight": "quantized_weight",
        "MXFP4Weight": "quantized_weight",
        "Int4Weight": "quantized_weight",
        "autotune": "autotune:",
        "formats": "formats:",
        "prepared": "prepared:",
    },
)

__all__ = [
    "Epilogue",
    "Int4Weight",
    "MXFP4Weight",
    "NVFP4Weight",
    "QuantizedWeight",
    "ScalingType",
    "Step",
    "SwizzleType",
    "add",
    "autotune",
    "formats",
    "gelu",
    "gemm",
    "grouped_mm",
    "linear",
    "mm_quantized",
    "mul",
    "prepared",
    "relu",
    "scale",
    "scaled_mm",
    "sigmoid",
    "silu",
    "tanh",
]

if TYPE_CHECKING:
    from torchnext.gemm import autotune, formats, prepared
    from torchnext.gemm.epilogue import (
        Epilogue,
        Step,
        add,
        gelu,
        mul,
        relu,
        scale,
        sigmoid,
        silu,
        tanh,
    )
    from torchnext.gemm.fused import gemm, linear
    from torchnext.gemm.grouped import grouped_mm
    from torchnext.gemm.quantized_weight import (
        Int4Weight,
        MXFP4Weight,
        NVFP4Weight,
        QuantizedWeight,
    )
    from torchnext.gemm.scaled import ScalingType, SwizzleType, mm_quantized, scaled_mm
