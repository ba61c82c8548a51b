"""torch 2.14 semantics on any torch: the behaviour changes you may need to reproduce.

* :func:`clamp`, :func:`clamp_min`, :func:`clamp_max`: 2.14's boundary gradients.
* :func:`split_group`: returns ``GroupMember.NON_GROUP_MEMBER`` on non-members.
* :func:`profile`, :func:`autograd_profile`: profilers built without ``use_cuda``.
* :func:`cholesky`, :func:`qr`: the removed functions, old conventions, via ``linalg``.
"""

from __future__ import annotations

from torchnext.compat.clamp import clamp, clamp_max, clamp_min
from torchnext.compat.distributed import NON_GROUP_MEMBER, split_group
from torchnext.compat.linalg_removed import QRResult, cholesky, qr
from torchnext.compat.profiler import autograd_profile, profile

__all__ = [
    "clamp",
    "clamp_min",
    "clamp_max",
    "split_group",
    "NON_GROUP_MEMBER",
    "profile",
    "autograd_profile",
    "cholesky",
    "qr",
    "QRResult",
]
