"""The picture of ``torchnext bench ft-scale-model``: recovery and store load against ranks, goodput.

:func:`plot` draws three panels into one PNG: the whole-job time lost per host failure
against the number of ranks (torchnext on the TCP store: detection plus t3; torchft at
its defaults, and its quorum alone); the fault-free load of the store (TCP and etcd) and
of torchft's Lighthouse, with the saturation line at 1; the goodput of each way to run
the 1,000-host job. It needs matplotlib (the ``[demo]``
extra) and returns None without it.

What not to assume: where the store cannot keep the heartbeats inside the timeout the
model has no recovery time, so torchnext's curve stops there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot"]


def plot(scale: list[dict[str, Any]], goodput: list[dict[str, Any]], path: Path) -> Path | None:
    """Draw the three panels into ``path``; None (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ranks = [r["ranks"] for r in scale]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.8))
    lost = [(r["ranks"], r["lost_s"]) for r in scale if isinstance(r["lost_s"], float)]
    if lost:
        a.plot([x for x, _ in lost], [y for _, y in lost], "o-", label="torchnext (TCP store)")
    a.plot(ranks, [r["torchft_lost_s"] for r in scale], "s-", label="torchft (defaults)")
    a.plot(ranks, [r["torchft_quorum_s"] for r in scale], "s:", label="torchft quorum alone")
    a.set(xscale="log", yscale="log", xlabel="ranks (8 per host)", ylabel="seconds")
    a.set_title("whole-job time lost per host failure")
    a.legend(fontsize=8)
    b.plot(ranks, [r["load_tcp"] for r in scale], "o-", label="TCP store")
    b.plot(ranks, [r["load_etcd"] for r in scale], "^-", label="etcd")
    b.plot(ranks, [r["lighthouse_load"] for r in scale], "s--", label="torchft Lighthouse")
    b.axhline(1.0, color="red", linewidth=1)
    b.set(xscale="log", yscale="log", xlabel="ranks (8 per host)", ylabel="offered load (1 = full)")
    b.set_title("fault-free control-plane load")
    b.legend(fontsize=8)
    names = [g["design"] for g in goodput]
    values = [float(g["goodput"]) for g in goodput]
    c.barh(range(len(names)), values)
    for i, g in enumerate(goodput):
        text = (
            "control plane saturated"
            if g["lost_s_per_failure"] == "saturated"
            else f"{values[i]:.3f}"
        )
        c.text(
            0.01 if text.startswith("control") else values[i] - 0.01,
            i,
            text,
            va="center",
            ha="left" if text.startswith("control") else "right",
            fontsize=8,
            color="black" if text.startswith("control") else "white",
        )
    c.set_yticks(range(len(names)), [n[:44] for n in names], fontsize=7)
    c.set(xlim=(0, 1), xlabel="goodput")
    c.set_title("the 1,000-host job")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
