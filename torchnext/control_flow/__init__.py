"""Compiler control flow and declarative dynamic shapes, with torch 2.14's contracts.

* :func:`switch`: multi-way branch for eager, ``torch.compile``, ``torch.export``
  (saveable) and ``make_fx``.
* :func:`while_loop`: 2.14's ``torch.while_loop`` with early, named errors, and
  :func:`capture_while_loop` to record a data-dependent loop in a CUDA graph.
* :func:`dynamic_spec`: one shape spec for ``torch.compile``, ``torch.export`` and
  ``make_fx`` (entry points :func:`compile`, :func:`export`, :func:`make_fx`).
* :func:`complex_compile`: ``torch.compile`` for graphs with complex tensors.

Importing this package does not change ``torch``; :mod:`torchnext.backport` does that.
"""

from __future__ import annotations

from torchnext.control_flow.complex_compile import complex_compile
from torchnext.control_flow.cuda_graph_loop import (
    CapturedWhileLoop,
    WhileLoopCaptureConfig,
    capture_while_loop,
)
from torchnext.control_flow.dynamic_spec import (
    STATIC,
    IntVar,
    ParamsSpec,
    ShapesSpec,
    ShapeVar,
    TensorSpec,
    compile,
    dynamic_spec,
    export,
    make_fx,
)
from torchnext.control_flow.switch import switch
from torchnext.control_flow.while_loop import while_loop

__all__ = [
    "switch",
    "while_loop",
    "capture_while_loop",
    "CapturedWhileLoop",
    "WhileLoopCaptureConfig",
    "dynamic_spec",
    "compile",
    "export",
    "make_fx",
    "ShapeVar",
    "IntVar",
    "STATIC",
    "TensorSpec",
    "ParamsSpec",
    "ShapesSpec",
    "complex_compile",
]
