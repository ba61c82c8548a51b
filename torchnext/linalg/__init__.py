"""Batched linear algebra for small matrices on any device: polar, matrix_sqrth, svd,
eigh, qr, cholesky.

Drop-in for ``torch.linalg`` (same signatures, output conventions and ``out=``) plus
torch 2.14's ``polar`` and ``matrix_sqrth`` on older torch, with extra options
(``method=``, ``side=``, ``check_pd=``, ``return_info=``). A dispatcher picks the
fastest correct route per device, dtype, size and batch: unrolled Jacobi for tiny
real CPU matrices, the Triton Jacobi kernel on CUDA (n <= 32), vectorised Jacobi on
MPS, LAPACK/cuSOLVER otherwise, with large CPU batches split across threads.

Import cost: importing this package imports neither Triton nor any kernel; routes
load lazily. ``compat214`` holds the exact torch 2.14 contracts of ``polar`` and
``matrix_sqrth`` for installing into ``torch.linalg``.
"""

from __future__ import annotations

from torchnext.linalg._info import IterInfo
from torchnext.linalg.cholesky import cholesky
from torchnext.linalg.polar import PolarInfoResult, PolarResult, polar
from torchnext.linalg.qr import qr
from torchnext.linalg.spectral import eigh, svd
from torchnext.linalg.sqrth import SqrthInfoResult, matrix_sqrth

__all__ = [
    "polar",
    "matrix_sqrth",
    "svd",
    "eigh",
    "qr",
    "cholesky",
    "IterInfo",
    "PolarResult",
    "PolarInfoResult",
    "SqrthInfoResult",
]
