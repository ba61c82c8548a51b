"""Result records of the iterative linalg routes (Jacobi, QDWH, Newton-Schulz).

``IterInfo`` is what ``return_info=True`` adds to a result: per matrix of the
flattened batch, how many iterations (sweeps for Jacobi) ran, whether the method's
stopping test passed, and the final value of the quantity it tested. Do not compare
``residual`` across methods: each reports its own stopping quantity (documented on
the function that returns it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["IterInfo"]


class IterInfo(NamedTuple):
    """Convergence record of an iterative method, one entry per matrix.

    Shapes follow the input's batch dimensions (``()`` for a single matrix).
    """

    iters: torch.Tensor
    """int32: iterations or sweeps run for this matrix."""
    converged: torch.Tensor
    """bool: the stopping test passed (False means a fallback or the cap was used)."""
    residual: torch.Tensor
    """real: the final value of the method's stopping quantity."""

    def reshape(self, batch_shape: tuple[int, ...]) -> IterInfo:
        """The same record with its flat batch reshaped to ``batch_shape``."""
        return IterInfo(
            iters=self.iters.reshape(batch_shape),
            converged=self.converged.reshape(batch_shape),
            residual=self.residual.reshape(batch_shape),
        )
