"""The switch for 2.14's simple compute/communication overlap, on any torch.

``enable_simple_overlap()`` (or ``torchnext.backport.install()``) turns the pass on for
graphs compiled afterwards; ``enable_simple_overlap(False)`` turns it off (2.14's
``torch._inductor.config.patch({"aten_distributed_optimizations.enable_simple_overlap":
False})``). On 2.14 it flips 2.14's own flag. Compile after switching: what
``torch.compile`` already compiled keeps the order it was compiled with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torchnext.compat import inductor_passes
from torchnext.compile.overlap import simple_overlap
from torchnext.compile.schedule import keep_fx_order

__all__ = ["enable_simple_overlap", "simple_overlap_enabled"]


def enable_simple_overlap(enabled: bool = True) -> bool:
    """Turn the overlap pass on (or off); return whether it was on before.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enable_simple_overlap(enabled={enabled!r}): pass True or False")
    was = inductor_passes.overlap_pass_installed()
    if enabled:
        # The FX pass reorders; keep_fx_order keeps that order through Inductor's
        # peak-memory re-sort of the scheduled nodes (see torchnext.compile.schedule).
        inductor_passes.install_overlap_pass(simple_overlap, keep_fx_order)
    else:
        inductor_passes.uninstall_overlap_pass()
    return was


@contextlib.contextmanager
def simple_overlap_enabled(enabled: bool = True) -> Iterator[None]:
    """:func:`enable_simple_overlap` for a ``with`` block; the previous state comes back."""
    was = enable_simple_overlap(enabled)
    try:
        yield
    finally:
        enable_simple_overlap(was)
