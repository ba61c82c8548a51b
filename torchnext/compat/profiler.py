"""Profiler construction without ``use_cuda`` (removed in torch 2.14).

torch 2.14 removed the ``use_cuda`` keyword of ``torch.autograd.profiler.profile``
and ``torch.profiler.profile`` (``TypeError``). :func:`autograd_profile` and
:func:`profile` take the 2.14 arguments (``use_device=`` / ``activities=``) on any
torch, and translate a legacy ``use_cuda=`` for you (with a ``FutureWarning``) so old
call sites keep working while you migrate them.

What not to assume: ``use_cuda=True`` on a machine without CUDA is passed through as
``use_device="cuda"``; torch then decides whether that is an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

__all__ = ["profile", "autograd_profile"]

_SENTINEL: Any = object()


def autograd_profile(
    *, use_device: str | None = None, use_cuda: Any = _SENTINEL, **kwargs: Any
) -> Any:
    """``torch.autograd.profiler.profile(use_device=..., **kwargs)``; maps ``use_cuda``.

    Raises:
        ValueError: both ``use_cuda`` and ``use_device`` given and they disagree.
    """
    import torch.autograd.profiler as autograd_profiler

    if use_cuda is not _SENTINEL:
        warnings.warn(
            "autograd_profile(use_cuda=...) is removed in torch 2.14; pass use_device='cuda' instead",
            FutureWarning,
            stacklevel=2,
        )
        wanted = "cuda" if use_cuda else None
        if use_device is not None and wanted is not None and use_device != wanted:
            raise ValueError(
                f"autograd_profile: use_cuda={use_cuda!r} conflicts with use_device={use_device!r}; "
                "pass only use_device"
            )
        use_device = use_device if use_device is not None else wanted
    return autograd_profiler.profile(use_device=use_device, **kwargs)


def profile(
    *, activities: Iterable[Any] | None = None, use_cuda: Any = _SENTINEL, **kwargs: Any
) -> Any:
    """``torch.profiler.profile(activities=..., **kwargs)``; maps a legacy ``use_cuda``.

    ``use_cuda=True`` becomes ``activities=[CPU, CUDA]`` (added to ``activities`` if given);
    ``use_cuda=False`` leaves ``activities`` as given.
    """
    import torch.profiler as torch_profiler

    acts = list(activities) if activities is not None else None
    if use_cuda is not _SENTINEL:
        warnings.warn(
            "profile(use_cuda=...) is removed in torch 2.14; pass "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] instead",
            FutureWarning,
            stacklevel=2,
        )
        if use_cuda:
            acts = acts if acts is not None else [torch_profiler.ProfilerActivity.CPU]
            if torch_profiler.ProfilerActivity.CUDA not in acts:
                acts.append(torch_profiler.ProfilerActivity.CUDA)
    return torch_profiler.profile(activities=acts, **kwargs)
