"""torchnext: PyTorch 2.14's new capabilities on the PyTorch you already run.

The subpackages are the API: :mod:`torchnext.distributed` (fault-tolerant groups,
training manager, flight recorder, RMA windows), :mod:`torchnext.linalg`,
:mod:`torchnext.control_flow`, :mod:`torchnext.compat`, :mod:`torchnext.upgrade`,
:mod:`torchnext.backport` and :mod:`torchnext.testing`. Importing ``torchnext`` itself
imports none of them and changes nothing in ``torch``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__: str = version("torchnext")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
