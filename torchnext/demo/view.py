"""Terminal output of ``torchnext demo``: the live view while it runs, the summary after.

On a terminal the live view redraws a small block in place (ANSI cursor movement):
step and progress bar, loss, world size and members, and the most recent events. When
the output is not a terminal (a log file, CI) it prints one line per event and a
progress line every few seconds instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["LiveState", "LiveView", "format_summary"]


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


class LiveView:
    """Renders :class:`LiveState` to ``out`` (see the module docstring)."""

    def __init__(
        self, out: TextIO | None = None, *, interactive: bool | None = None, max_events: int = 9
    ) -> None:
        self.out = out or sys.stdout
        self.interactive = self.out.isatty() if interactive is None else interactive
        self.max_events = max_events
        self._lines_drawn = 0
        self._events_printed = 0
        self._last_plain = 0.0
        self._printed_final = False
        self._t0 = time.monotonic()

    def render(self, state: LiveState) -> None:
        if self.interactive:
            self._render_block(state)
        else:
            self._render_plain(state)

    def _bar(self, state: LiveState, width: int = 30) -> str:
        frac = min(1.0, state.step / max(1, state.total_steps))
        filled = int(frac * width)
        return "[" + "#" * filled + "." * (width - filled) + "]"

    def _status_line(self, state: LiveState) -> str:
        elapsed = time.monotonic() - self._t0
        return (
            f"step {state.step:>5}/{state.total_steps} {self._bar(state)} loss {state.loss:7.4f}  "
            f"world {state.world_size}  {elapsed:6.1f}s  {state.phase}"
        )

    def _render_block(self, state: LiveState) -> None:
        lines = [
            "torchnext demo - fault-tolerant data-parallel training, healed in place",
            self._status_line(state),
            "members: " + (" ".join(state.members) if state.members else "-"),
            "events:",
        ]
        recent = state.events[-self.max_events :]
        lines += [f"  {e}" for e in recent] + [""] * (self.max_events - len(recent))
        if self._lines_drawn:
            self.out.write(f"\x1b[{self._lines_drawn}F")
        for line in lines:
            self.out.write("\x1b[2K" + line + "\n")
        self.out.flush()
        self._lines_drawn = len(lines)

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
        f"  plot               {summary['plot']}",
    ]
    return "\n".join(lines)
