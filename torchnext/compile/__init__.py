"""Passes for ``torch.compile`` graphs that torch 2.14 runs and 2.13 lacks.

* :func:`enable_simple_overlap`: 2.14's compute/communication overlap for graphs with
  functional collectives (on by default in 2.14; ``torchnext.backport.install()`` turns
  it on here too). :func:`simple_overlap` is the pass itself, on an FX graph;
  :func:`keep_fx_order` keeps its order through Inductor's scheduler on 2.13.
"""

from __future__ import annotations

from torchnext.compile.overlap import OverlapReport, is_collective, is_wait, simple_overlap
from torchnext.compile.schedule import keep_fx_order
from torchnext.compile.switch import enable_simple_overlap, simple_overlap_enabled

__all__ = [
    "enable_simple_overlap",
    "simple_overlap_enabled",
    "simple_overlap",
    "keep_fx_order",
    "OverlapReport",
    "is_collective",
    "is_wait",
]
