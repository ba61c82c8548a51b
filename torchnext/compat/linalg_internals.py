"""The one private part of torch that :mod:`torchnext.linalg` uses: "is functorch tracing?".

The linear-algebra routines take a fast path (batches split over threads, data-dependent
convergence loops, input checks that read values) only in plain eager mode. Under
``torch.func`` transforms (``vmap``, ``grad``, ``jacrev``) they must run traceable
``torch.linalg`` compositions instead, and torch has no public way to ask whether such a
transform is active. This module is that question, asked in one place.

=================================================  =================================  ==============
access                                             what for                           tested on
=================================================  =================================  ==============
``torch._C._are_functorch_transforms_active()``    vmap/grad active on this thread    2.13.0, 2.14.1
=================================================  =================================  ==============

The conformance suite runs the linear-algebra tests, vmap and gradcheck included, on
2.14.1 and the unit suite on 2.13.0. What not to assume: this is not public API; a torch
release may rename it, and then only this module changes. ``torch.compiler.is_compiling``
is public and is asked directly where needed.
"""

from __future__ import annotations

import torch

__all__ = ["functorch_transforms_active", "traced"]


def functorch_transforms_active() -> bool:
    """True while a ``torch.func`` transform (vmap, grad, jacrev, ...) is active."""
    return bool(torch._C._are_functorch_transforms_active())


def traced() -> bool:
    """True under ``torch.compile`` or a ``torch.func`` transform: only traceable ops may run."""
    return torch.compiler.is_compiling() or functorch_transforms_active()
