"""The demo's PNG: loss against step, world size below it, faults and heals marked.

Top panel: the fault-injected run's loss (blue) over the failure-free reference run of
the same seed (wide, pale grey), on a log axis; dashed vertical lines mark faults
(red: SIGKILL, orange: SIGSTOP) and heals (green), in both panels, each kind once in
the legend below the panels. Bottom panel: world size per committed step, sharing the
step axis.

Drawn with ``matplotlib`` (the ``[demo]`` extra) through its object API (a
:class:`~matplotlib.figure.Figure` on an Agg canvas), so no global backend is chosen
and nothing needs a display; it is imported only when a plot is drawn, and
:func:`draw_plot` / :func:`write_plot` raise ``ImportError`` without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Marker", "draw_plot", "write_plot", "MARKER_GID"]

BLUE = "#1f77b4"
GREY = "#c8c8c8"
KIND_COLORS: dict[str, str] = {"kill": "#d62728", "stop": "#ff7f0e", "heal": "#2ca02c"}
KIND_LABELS: dict[str, str] = {"kill": "sigkill", "stop": "sigstop", "heal": "healed"}
MARKER_GID = "torchnext-demo-marker"
"""The ``gid`` of every fault/heal line, so a test can count them on the figure."""


@dataclass(frozen=True, kw_only=True)
class Marker:
    step: float
    kind: str
    """``kill``, ``stop`` or ``heal`` (sets the colour and the legend entry)."""
    label: str


def draw_plot(
    *,
    title: str,
    steps: Sequence[int],
    losses: Sequence[float],
    world_sizes: Sequence[int],
    reference_steps: Sequence[int] = (),
    reference_losses: Sequence[float] = (),
    markers: Sequence[Marker] = (),
    width: int = 960,
    height: int = 600,
) -> Figure:
    """The figure (two axes: loss, world size); ``ValueError`` when the series differ in length."""
    if len(steps) != len(losses) or len(steps) != len(world_sizes):
        raise ValueError(
            f"write_plot: steps ({len(steps)}), losses ({len(losses)}) and world_sizes "
            f"({len(world_sizes)}) must have the same length."
        )
    if len(reference_steps) != len(reference_losses):
        raise ValueError(
            f"write_plot: reference_steps ({len(reference_steps)}) and reference_losses "
            f"({len(reference_losses)}) must have the same length."
        )
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    dpi = 100
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, world_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    fig.suptitle(title)

    if reference_steps:
        # Wide and pale, under the faulty run's line: where they coincide it shows as a halo.
        loss_ax.plot(
            reference_steps,
            reference_losses,
            color=GREY,
            linewidth=6,
            solid_capstyle="round",
            label="reference (no faults)",
            zorder=1,
        )
    loss_ax.plot(steps, losses, color=BLUE, linewidth=1.6, label="with faults", zorder=2)
    positive = [v for v in list(losses) + list(reference_losses) if math.isfinite(v) and v > 0]
    # A log axis needs a positive value to show; otherwise matplotlib warns and draws nothing.
    if positive:
        loss_ax.set_yscale("log")
    loss_ax.set_ylabel("loss")
    loss_ax.grid(True, which="major", color="#e6e6e6")

    world_ax.step(steps, world_sizes, where="post", color=BLUE, linewidth=1.6)
    top = max(list(world_sizes) + [1])
    world_ax.set_ylim(0, top + 0.6)
    world_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    world_ax.set_ylabel("world size")
    world_ax.set_xlabel("step")
    world_ax.grid(True, color="#e6e6e6")

    in_legend: set[str] = set()
    for i, m in enumerate(sorted(markers, key=lambda m: m.step)):
        color = KIND_COLORS.get(m.kind, "black")
        legend = KIND_LABELS.get(m.kind, m.kind)
        for ax in (loss_ax, world_ax):
            line = ax.axvline(
                m.step,
                color=color,
                linestyle="--",
                linewidth=1.2,
                label=legend if ax is loss_ax and legend not in in_legend else "_nolegend_",
                zorder=3,
            )
            line.set_gid(MARKER_GID)
        in_legend.add(legend)
        # Staggered down the panel so labels of close markers do not overlap.
        loss_ax.annotate(
            m.label,
            xy=(m.step, 1.0 - 0.07 * (i % 4)),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            va="top",
            fontsize=8,
            color=color,
        )
    # Below the panels, in a fixed order: inside them it would cover a marker's label.
    handles, labels = loss_ax.get_legend_handles_labels()
    order = ["reference (no faults)", "with faults", *KIND_LABELS.values()]
    ranked = sorted(
        zip(handles, labels, strict=True),
        key=lambda hl: order.index(hl[1]) if hl[1] in order else len(order),
    )
    fig.legend(
        [h for h, _ in ranked],
        [lab for _, lab in ranked],
        loc="outside lower center",
        ncols=len(ranked),
        fontsize=9,
        frameon=False,
    )
    x_max = max(list(steps) + list(reference_steps) + [1])
    loss_ax.set_xlim(0, x_max)
    return fig


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
    height: int = 600,
) -> Path:
    """Draw the figure (:func:`draw_plot`) and write it to ``path`` as PNG; returns the path."""
    fig = draw_plot(
        title=title,
        steps=steps,
        losses=losses,
        world_sizes=world_sizes,
        reference_steps=reference_steps,
        reference_losses=reference_losses,
        markers=markers,
        width=width,
        height=height,
    )
    target = Path(path)
    fig.savefig(target, format="png")
    return target
