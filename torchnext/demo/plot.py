"""The demo's PNG: loss against step, world size below it, failures marked.

Top panel: the fault-injected run's loss (blue) over the failure-free reference run
of the same seed (grey); dashed vertical lines mark faults (red: SIGKILL, orange:
SIGSTOP) and heals (green). Bottom strip: world size per committed step. Drawn with
:class:`torchnext.demo.png.Canvas`, so no plotting library is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchnext.demo.png import Canvas, Color

__all__ = ["Marker", "write_plot"]

BLUE: Color = (31, 119, 180)
GREY: Color = (200, 200, 200)
RED: Color = (214, 39, 40)
ORANGE: Color = (255, 127, 14)
GREEN: Color = (44, 160, 44)
BLACK: Color = (0, 0, 0)
LIGHT: Color = (230, 230, 230)

_KIND_COLORS: dict[str, Color] = {"kill": RED, "stop": ORANGE, "heal": GREEN}


@dataclass(frozen=True, kw_only=True)
class Marker:
    step: float
    kind: str
    """``kill``, ``stop`` or ``heal`` (sets the colour)."""
    label: str


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def write_plot(
    path: str | Path,
    *,
    title: str,
    steps: Sequence[int],
    losses: Sequence[float],
    world_sizes: Sequence[int],
    reference_steps: Sequence[int] = (),
    reference_losses: Sequence[float] = (),
    markers: Sequence[Marker] = (),
    width: int = 960,
    height: int = 560,
) -> Path:
    """Draw the figure and write it to ``path``; returns the path."""
    if len(steps) != len(losses) or len(steps) != len(world_sizes):
        raise ValueError(
            f"write_plot: steps ({len(steps)}), losses ({len(losses)}) and world_sizes "
            f"({len(world_sizes)}) must have the same length."
        )
    c = Canvas(width, height)
    left, right, top = 70, width - 20, 40
    loss_bottom = int(height * 0.68)
    ws_top, ws_bottom = loss_bottom + 40, height - 40
    c.text(left, 12, title, BLACK, scale=2)

    all_steps = list(steps) + list(reference_steps)
    x_max = max(all_steps, default=1) or 1
    finite = [v for v in list(losses) + list(reference_losses) if math.isfinite(v)]
    y_lo, y_hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if y_hi - y_lo < 1e-9:
        y_hi = y_lo + 1.0

    def sx(step: float) -> float:
        return left + (right - left) * step / x_max

    def sy(v: float) -> float:
        return loss_bottom - (loss_bottom - top) * (v - y_lo) / (y_hi - y_lo)

    # Axes, grid and tick labels.
    for i in range(5):
        v = y_lo + (y_hi - y_lo) * i / 4
        y = sy(v)
        c.line(left, y, right, y, LIGHT)
        label = _fmt(v)
        c.text(left - 6 - c.text_width(label), int(y) - 3, label, BLACK)
    for i in range(6):
        s = x_max * i / 5
        x = sx(s)
        c.line(x, loss_bottom, x, loss_bottom + 4, BLACK)
        c.line(x, ws_bottom, x, ws_bottom + 4, BLACK)
        label = f"{s:.0f}"
        c.text(int(x) - c.text_width(label) // 2, ws_bottom + 8, label, BLACK)
    c.line(left, top, left, loss_bottom, BLACK)
    c.line(left, loss_bottom, right, loss_bottom, BLACK)
    c.text(8, top, "LOSS", BLACK)
    c.text(right - c.text_width("STEP"), height - 14, "STEP", BLACK)

    for m in markers:
        color = _KIND_COLORS.get(m.kind, BLACK)
        x = sx(m.step)
        c.dashed_vline(x, top, ws_bottom, color)
        c.text(int(x) + 3, top + 2 + 10 * (markers.index(m) % 4), m.label, color)

    if reference_steps:
        # Wide and pale, under the faulty run's line: where they coincide it shows as a halo.
        c.polyline([sx(s) for s in reference_steps], [sy(v) for v in reference_losses], GREY, 6)
    c.polyline([sx(s) for s in steps], [sy(v) for v in losses], BLUE, 2)

    # World-size strip.
    ws_max = max(world_sizes, default=1) or 1
    c.line(left, ws_top, left, ws_bottom, BLACK)
    c.line(left, ws_bottom, right, ws_bottom, BLACK)
    c.text(8, ws_top, "WORLD", BLACK)
    for k in range(ws_max + 1):
        y = ws_bottom - (ws_bottom - ws_top) * k / ws_max
        c.text(left - 14, int(y) - 3, str(k), BLACK)

    def wy(k: int) -> float:
        return ws_bottom - (ws_bottom - ws_top) * k / ws_max

    for i in range(1, len(steps)):
        c.line(
            sx(steps[i - 1]), wy(world_sizes[i - 1]), sx(steps[i]), wy(world_sizes[i - 1]), BLUE, 2
        )
        if world_sizes[i] != world_sizes[i - 1]:
            c.line(sx(steps[i]), wy(world_sizes[i - 1]), sx(steps[i]), wy(world_sizes[i]), BLUE, 2)

    # Legend.
    lx = right - 260
    c.line(lx, top + 6, lx + 20, top + 6, BLUE, 2)
    c.text(lx + 26, top + 3, "WITH FAULTS", BLACK)
    c.line(lx, top + 20, lx + 20, top + 20, GREY, 6)
    c.text(lx + 26, top + 17, "REFERENCE (NO FAULTS)", BLACK)
    return c.save(path)
