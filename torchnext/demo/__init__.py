"""``torchnext demo``: fault-tolerant training healed in place, shown live.

Modules: :mod:`.cli` (the command), :mod:`.driver` (runs it), :mod:`.trainer` (the
worker script, also an example for ``torchnext run``), :mod:`.data` (dataset),
:mod:`.view` (terminal output), :mod:`.plot` and :mod:`.png` (the PNG figure).
"""

from __future__ import annotations

__all__: list[str] = []
