"""``torchnext demo``: fault-tolerant training healed in place, shown live.

Modules: :mod:`.cli` (the command), :mod:`.driver` (runs it), :mod:`.trainer` (the
worker script, also an example for ``torchnext run``), :mod:`.data` (dataset),
:mod:`.view` (terminal output, drawn with ``rich``), :mod:`.plot` (the PNG figure,
drawn with ``matplotlib``). Both libraries come with the ``[demo]`` extra; without
them the demo prints plain lines and says how to get the picture.
"""

from __future__ import annotations

__all__: list[str] = []
