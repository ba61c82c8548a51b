"""Progress reporting on stderr for long command-line runs (``torchnext bench``, ``upgrade``).

Use :func:`progress` around a loop whose length is known up front::

    with progress(len(files), "upgrade") as bar:
        for f in files:
            work(f)
            bar.advance()

What it shows depends on where stderr goes:

* a terminal, with ``rich`` installed (the ``[upgrade]`` and ``[demo]`` extras): a
  ``rich`` progress bar;
* anything else (a pipe, a log file, a terminal without ``rich``): a plain line each
  time another tenth of the work is done, and one at the end;
* the environment variable ``CI`` set to a non-empty value: nothing at all.

``CI`` is not a ``TORCHNEXT_*`` setting and so is not declared in :mod:`torchnext._env`:
it is the convention CI services (GitHub Actions, GitLab, Travis, ...) set themselves,
and reading it directly is the point, since a job template would not know to set a
variable of ours.

Do not assume the output can be parsed, or that it appears at all: it only ever goes
to stderr (never stdout, which callers may parse), its format may change, and the bar
redraws at most about ten times a second, so a fast loop shows fewer steps than it has.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ProgressBar", "progress", "progress_mode"]

# A redraw costs more than a benchmark repetition or a small file; at 10 per second the
# bar still looks live and never slows the loop it reports on.
_MIN_REDRAW_S = 0.1


class ProgressBar(Protocol):
    """What :func:`progress` yields."""

    def advance(self, n: int = 1) -> None:
        """Record that ``n`` more units of work are done."""


def _in_ci() -> bool:
    return bool(os.environ.get("CI", ""))


def _rich_available() -> bool:
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


def progress_mode(stream: TextIO | None = None, console: Console | None = None) -> str:
    """``"none"``, ``"rich"`` or ``"plain"``: what :func:`progress` would show (see above)."""
    if _in_ci():
        return "none"
    if console is not None:
        return "rich" if console.is_terminal and _rich_available() else "plain"
    out = stream if stream is not None else sys.stderr
    is_tty = bool(getattr(out, "isatty", lambda: False)())
    return "rich" if is_tty and _rich_available() else "plain"


class _Silent:
    def advance(self, n: int = 1) -> None:
        return None


class _Plain:
    """One line per tenth of the work (each unit when there are fewer than ten)."""

    def __init__(self, total: int, description: str, unit: str, out: TextIO) -> None:
        self.total = total  # > 0: progress() shows nothing for an empty loop
        self.description = description
        self.unit = f" {unit}" if unit else ""
        self.out = out
        self.done = 0
        self._tenth = 0

    def advance(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        tenth = 10 * self.done // self.total
        if tenth > self._tenth or (self.total < 10 and n > 0):
            self._tenth = tenth
            pct = 100 * self.done // self.total
            self.out.write(f"{self.description}: {self.done}/{self.total}{self.unit} ({pct} %)\n")
            self.out.flush()


class _Rich:
    def __init__(self, bar: Any, task: Any) -> None:
        self.bar = bar
        self.task = task
        self._last = 0.0

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)
        now = time.monotonic()
        if now - self._last >= _MIN_REDRAW_S:
            self._last = now
            self.bar.refresh()


@contextmanager
def progress(
    total: int,
    description: str,
    *,
    unit: str = "",
    stream: TextIO | None = None,
    console: Console | None = None,
    transient: bool = False,
) -> Iterator[ProgressBar]:
    """Report ``total`` units of work labelled ``description`` on stderr (module docstring).

    ``unit`` names what is counted (``"files"``) after the count. ``stream`` replaces stderr; ``console`` is a ``rich`` console to draw on (tests pass
    one with ``force_terminal=True``). ``transient=True`` clears the bar when done.
    """
    if total < 0:
        raise ValueError(f"progress: total={total}; expected a count of zero or more")
    mode = progress_mode(stream, console) if total > 0 else "none"
    if mode == "none":
        yield _Silent()
        return
    out = stream if stream is not None else sys.stderr
    if mode == "plain":
        yield _Plain(total, description, unit, out)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console if console is not None else Console(file=out),
        # No refresh thread: on a small machine it competes with the work it reports
        # on (benchmarks time that work); advance() redraws instead.
        auto_refresh=False,
        transient=transient,
    )
    task = bar.add_task(description, total=total)
    with bar:
        yield _Rich(bar, task)
        bar.refresh()
