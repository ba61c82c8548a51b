"""Terminal output of ``torchnext demo``: the live view while it runs, the summary after.

On a terminal, with ``rich`` installed (the ``[demo]`` extra), the live view is a
``rich.live.Live`` block redrawn in place: a table of the ranks (member, committed
step, loss) titled with the world size, a progress bar of steps, and the event log
with faults in red and heals in green. Otherwise (a log file, CI, or no ``rich``) it
prints one line per event and a progress line every few seconds, so logs stay
readable; :func:`missing_extras` and :func:`extras_hint` tell the user what the
``[demo]`` extra would add.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

__all__ = ["LiveState", "LiveView", "extras_hint", "format_summary", "missing_extras"]

# The live block redraws at most this often; the driver polls every 50 ms, and a
# redraw per poll would spend a worker's share of a small machine on the terminal.
_REDRAW_S = 0.125

_FAULT_WORDS = ("sigkill", "sigstop", "failure", "shrink", "differ", "timed out", "gave up")
_HEAL_WORDS = ("healed", "grow", "admitted", "replacing")


def _has_rich() -> bool:
    try:
        import rich.live  # noqa: F401
    except ImportError:
        return False
    return True


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def missing_extras() -> list[str]:
    """Which of the ``[demo]`` extra's libraries (``rich``, ``matplotlib``) cannot be imported."""
    return [
        name
        for name, present in (("rich", _has_rich()), ("matplotlib", _has_matplotlib()))
        if not present
    ]


def extras_hint(missing: Sequence[str]) -> str:
    """The one line printed when ``missing`` (from :func:`missing_extras`) is not empty."""
    wants = []
    if "rich" in missing:
        wants.append("the live view")
    if "matplotlib" in missing:
        wants.append("the loss plot")
    verb = "need" if len(wants) > 1 else "needs"
    return (
        f"torchnext demo: {' and '.join(wants)} {verb} {' and '.join(missing)}: "
        "pip install 'torchnext[demo]'"
    )


@dataclass
class LiveState:
    """What the view shows; the demo's driver updates it."""

    total_steps: int
    step: int = 0
    loss: float = float("nan")
    world_size: int = 0
    members: tuple[str, ...] = ()
    events: list[str] = field(default_factory=list)
    phase: str = "starting"


def _event_style(event: str) -> str:
    low = event.lower()
    if any(w in low for w in _FAULT_WORDS):
        return "red"
    if any(w in low for w in _HEAL_WORDS):
        return "green"
    return ""


class LiveView:
    """Renders :class:`LiveState` (see the module docstring); call :meth:`close` at the end.

    ``console`` draws the rich view on that console (tests pass a recording one);
    ``interactive=False`` forces the plain lines, ``True`` the rich view (when ``rich``
    is importable); by default the rich view is used when ``out`` is a terminal.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        interactive: bool | None = None,
        max_events: int = 9,
        console: Console | None = None,
    ) -> None:
        if max_events < 1:
            raise ValueError(f"LiveView: max_events={max_events}; show at least one event")
        self.out = out or sys.stdout
        self.max_events = max_events
        self._events_printed = 0
        self._last_plain = 0.0
        self._printed_final = False
        self._t0 = time.monotonic()
        self._live: Any = None
        self._bar: Any = None
        self._task: Any = None
        self._last_draw = 0.0
        self._drawn_events = -1
        wanted = (console is not None or self.out.isatty()) if interactive is None else interactive
        if wanted and _has_rich():
            self._start_rich(console)

    @property
    def interactive(self) -> bool:
        """True when the rich live view draws; False for plain lines."""
        return self._live is not None

    def _start_rich(self, console: Console | None) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._bar = Progress(
            TextColumn("step"),
            BarColumn(bar_width=40),
            MofNCompleteColumn(),
            TextColumn("{task.fields[phase]}"),
        )
        self._task = self._bar.add_task("steps", total=None, phase="starting")
        self._live = Live(
            console=console if console is not None else Console(file=self.out),
            auto_refresh=False,  # redrawn from render(), so no thread competes with workers
            transient=False,
        )
        self._live.start()

    def render(self, state: LiveState) -> None:
        if self._live is not None:
            self._render_rich(state)
        else:
            self._render_plain(state)

    def close(self) -> None:
        """Stop the live block (leaving its last frame on screen); idempotent."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def renderable(self, state: LiveState) -> RenderableType:
        """The rich view of ``state``: title, ranks table, step bar, event log."""
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        elapsed = time.monotonic() - self._t0
        table = Table(
            title=f"world size {state.world_size}",
            title_justify="left",
            caption=f"{elapsed:.1f} s",
            caption_justify="right",
            expand=False,
        )
        table.add_column("rank", justify="right")
        table.add_column("member")
        table.add_column("step", justify="right")
        table.add_column("loss", justify="right")
        for rank, member in enumerate(state.members):
            table.add_row(str(rank), member, str(state.step), f"{state.loss:.4f}")
        if not state.members:
            table.add_row("-", "-", str(state.step), f"{state.loss:.4f}")
        if self._bar is not None:
            self._bar.update(
                self._task, total=state.total_steps, completed=state.step, phase=state.phase
            )
        log = Text()
        recent = state.events[-self.max_events :]
        for i, event in enumerate(recent):
            log.append(event, style=_event_style(event))
            if i < len(recent) - 1:
                log.append("\n")
        if not recent:
            log.append("none yet", style="dim")
        parts: list[RenderableType] = [
            Text("torchnext demo - fault-tolerant data-parallel training, healed in place", "bold"),
            table,
        ]
        if self._bar is not None:
            parts.append(self._bar)
        parts.append(Panel(log, title="events", title_align="left"))
        return Group(*parts)

    def _render_rich(self, state: LiveState) -> None:
        now = time.monotonic()
        finished = state.step >= state.total_steps
        if (
            now - self._last_draw < _REDRAW_S
            and len(state.events) == self._drawn_events
            and not finished
        ):
            return
        self._last_draw = now
        self._drawn_events = len(state.events)
        self._live.update(self.renderable(state), refresh=True)

    def _bar_text(self, state: LiveState, width: int = 30) -> str:
        frac = min(1.0, state.step / max(1, state.total_steps))
        filled = int(frac * width)
        return "[" + "#" * filled + "." * (width - filled) + "]"

    def _status_line(self, state: LiveState) -> str:
        elapsed = time.monotonic() - self._t0
        return (
            f"step {state.step:>5}/{state.total_steps} {self._bar_text(state)} "
            f"loss {state.loss:7.4f}  world {state.world_size}  {elapsed:6.1f}s  {state.phase}"
        )

    def _render_plain(self, state: LiveState) -> None:
        for event in state.events[self._events_printed :]:
            self.out.write(f"  event: {event}\n")
        self._events_printed = len(state.events)
        now = time.monotonic()
        finished = state.step >= state.total_steps
        if (now - self._last_plain >= 2.0 and not self._printed_final) or (
            finished and not self._printed_final
        ):
            self.out.write(self._status_line(state) + "\n")
            self._last_plain = now
            self._printed_final = finished
        self.out.flush()


def _fmt_list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values) if values else "-"


def format_summary(summary: dict[str, Any]) -> str:
    """The human-readable summary printed at the end of ``torchnext demo``."""
    plot = summary["plot"]
    if not plot:
        plot = (
            "not drawn (no step committed)"
            if _has_matplotlib()
            else "not drawn (needs matplotlib: pip install 'torchnext[demo]')"
        )
    lines = [
        "",
        "torchnext demo - summary",
        f"  dataset            {summary['dataset']}",
        f"  model              {summary['model']}",
        f"  workers            {summary['workers']}  steps {summary['steps']}  wall {summary['wall_s']:.1f} s",
        f"  failures           {summary['failures']}  ({', '.join(summary['fault_kinds']) or 'none'})",
        f"  detection (s)      {_fmt_list(summary['detection_s'])}",
        f"  recovery (s)       {_fmt_list(summary['recovery_s'])}   (fault -> first step committed without it)",
        f"  healing (s)        {_fmt_list(summary['heal_s'])}   (replacement started -> healed and training)",
        f"  replacements       {summary['replacements']}",
        f"  steps redone       {summary['steps_redone']}",
        f"  final loss         {summary['final_loss']:.6f}",
        f"  reference loss     {summary['reference_final_loss']:.6f}   (same seed, no faults)",
        f"  max |param diff|   {summary['max_param_diff_vs_reference']:.3g}   vs the reference run",
        f"  replicas identical {summary['replicas_identical']}   (checked after every committed step)",
        f"  plot               {plot}",
    ]
    return "\n".join(lines)
