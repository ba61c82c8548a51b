"""The demo's parts that need no processes: plot, live view, fallback, data, reference run."""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from torchnext.demo.cli import parse_fault
from torchnext.demo.data import load_dataset
from torchnext.demo.driver import DemoConfig
from torchnext.demo.plot import MARKER_GID, Marker, draw_plot, write_plot
from torchnext.demo.trainer import reference_run
from torchnext.demo.view import (
    LiveState,
    LiveView,
    extras_hint,
    format_summary,
    missing_extras,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _plot_args() -> dict[str, Any]:
    steps = list(range(1, 51))
    return {
        "title": "torchnext demo: 4 workers, 2 faults, healed in place",
        "steps": steps,
        "losses": [math.exp(-s / 10) for s in steps],
        "world_sizes": [4 if s < 20 else 3 if s < 30 else 4 for s in steps],
        "reference_steps": steps,
        "reference_losses": [math.exp(-s / 10) for s in steps],
        "markers": [
            Marker(step=20, kind="kill", label="sigkill n0w1"),
            Marker(step=24, kind="heal", label="healed n0w1.r1"),
            Marker(step=30, kind="stop", label="sigstop n0w2"),
            Marker(step=33, kind="heal", label="healed n0w2.r1"),
        ],
    }


def test_plot_draws_loss_on_log_axis_world_size_below_and_markers() -> None:
    pytest.importorskip("matplotlib")
    fig = draw_plot(**_plot_args())
    loss_ax, world_ax = fig.axes
    assert len(fig.axes) == 2
    assert loss_ax.get_yscale() == "log" and world_ax.get_yscale() == "linear"
    assert loss_ax.get_shared_x_axes().joined(loss_ax, world_ax)
    assert loss_ax.get_position().y0 > world_ax.get_position().y1  # world size is below
    assert (loss_ax.get_ylabel(), world_ax.get_ylabel(), world_ax.get_xlabel()) == (
        "loss",
        "world size",
        "step",
    )
    assert fig.get_suptitle() == "torchnext demo: 4 workers, 2 faults, healed in place"
    # Four markers, a dashed line in each panel for each.
    for ax in (loss_ax, world_ax):
        lines = [ln for ln in ax.get_lines() if ln.get_gid() == MARKER_GID]
        assert len(lines) == 4
        assert sorted(float(np.asarray(ln.get_xdata())[0]) for ln in lines) == [20, 24, 30, 33]
    notes = sorted(t.get_text() for t in loss_ax.texts)
    assert notes == ["healed n0w1.r1", "healed n0w2.r1", "sigkill n0w1", "sigstop n0w2"]
    (legend,) = fig.legends
    # Each kind once, in a fixed order, labels lower-case.
    assert [t.get_text() for t in legend.get_texts()] == [
        "reference (no faults)",
        "with faults",
        "sigkill",
        "sigstop",
        "healed",
    ]
    world_line = world_ax.get_lines()[0]
    assert np.asarray(world_line.get_ydata())[:20].tolist() == [4] * 19 + [3]


def test_plot_of_a_loss_that_is_never_positive_stays_linear() -> None:
    pytest.importorskip("matplotlib")
    fig = draw_plot(title="t", steps=[1, 2], losses=[0.0, float("nan")], world_sizes=[2, 2])
    assert fig.axes[0].get_yscale() == "linear"


def test_write_plot_makes_a_png(tmp_path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    out = write_plot(tmp_path / "p.png", **_plot_args())
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    pixels = image.imread(out)
    assert pixels.shape[:2] == (600, 960)
    rgb = (pixels[..., :3] * 255).round()
    red = (abs(rgb - np.array([214, 39, 40])) <= 12).all(axis=2)
    assert red.any()  # the fault marker was drawn in its colour
    with pytest.raises(ValueError, match="same length"):
        write_plot(tmp_path / "q.png", title="t", steps=[1], losses=[], world_sizes=[1])
    with pytest.raises(ValueError, match="same length"):
        write_plot(
            tmp_path / "q.png",
            title="t",
            steps=[1],
            losses=[1.0],
            world_sizes=[1],
            reference_steps=[1, 2],
            reference_losses=[1.0],
        )


def test_plain_view_prints_events_once() -> None:
    out = io.StringIO()
    view = LiveView(out, interactive=False)
    state = LiveState(total_steps=10, step=3, loss=1.5, world_size=4)
    state.events.append("n0w1: failure detected")
    view.render(state)
    view.render(state)
    view.close()
    text = out.getvalue()
    assert text.count("failure detected") == 1
    assert "step     3/10" in text
    assert "\x1b" not in text


def _record(width: int = 110) -> Any:
    from rich.console import Console

    return Console(record=True, width=width, file=io.StringIO(), color_system=None)


def test_live_view_shows_ranks_steps_and_events_on_a_rich_console() -> None:
    pytest.importorskip("rich")
    console = _record()
    view = LiveView(console=console, max_events=3)
    assert view.interactive
    state = LiveState(total_steps=300, world_size=4, members=("n0w0", "n0w1", "n0w2", "n0w3"))
    view.render(state)
    state.step, state.loss, state.world_size, state.phase = 120, 0.1234, 3, "training"
    state.members = ("n0w0", "n0w2", "n0w3")
    state.events += [
        "demo: SIGKILL -> n0w1 (pid 42) after step 80",
        "failure detected, epoch 1 revoked: peer n0w1 closed",
        "shrink: removed ['n0w1'] -> world 3 ['n0w0', 'n0w2', 'n0w3']",
        "n0w1.r1 healed from n0w0 over the network (0.10 MB in 0.05 s), at step 95",
    ]
    view.render(state)
    view.close()
    view.close()  # idempotent
    text = console.export_text()
    assert "world size 3" in text
    rows = [line for line in text.splitlines() if "n0w" in line and "0.1234" in line]
    assert len(rows) == 3
    assert any(r.split()[:4] == ["│", "0", "│", "n0w0"] for r in rows)
    assert any("2" in r.split() and "n0w3" in r and "120" in r for r in rows)
    assert "120/300" in text and "training" in text
    # The log keeps the last three events.
    assert "SIGKILL -> n0w1" not in text
    assert "failure detected" in text and "healed from n0w0" in text
    assert "events" in text


def test_live_view_colours_faults_red_and_heals_green() -> None:
    pytest.importorskip("rich")
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=110, color_system="standard")
    view = LiveView(console=console)
    state = LiveState(total_steps=10, step=10, loss=0.5, world_size=2, members=("a", "b"))
    state.events += ["demo: SIGSTOP -> b (pid 7) after step 5", "b.r1 healed from a"]
    view.render(state)
    view.close()
    text = out.getvalue()
    assert "\x1b[31mdemo: SIGSTOP" in text  # red
    assert "\x1b[32mb.r1 healed" in text  # green


def test_without_the_extra_the_view_is_plain_and_a_hint_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("rich", "rich.live", "matplotlib"):
        monkeypatch.setitem(sys.modules, name, None)
    assert missing_extras() == ["rich", "matplotlib"]
    hint = extras_hint(missing_extras())
    assert hint == (
        "torchnext demo: the live view and the loss plot need rich and matplotlib: "
        "pip install 'torchnext[demo]'"
    )
    with pytest.raises(ImportError):
        draw_plot(title="t", steps=[1], losses=[1.0], world_sizes=[1])

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    view = LiveView(out)  # a terminal, but no rich: plain lines
    assert not view.interactive
    state = LiveState(total_steps=5, step=5, loss=0.25, world_size=2)
    state.events.append("shrink: removed ['n0w1'] -> world 1 ['n0w0']")
    view.render(state)
    view.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "  event: shrink: removed ['n0w1'] -> world 1 ['n0w0']"
    assert lines[1].startswith("step     5/5 [##############################] loss  0.2500")


def test_hint_names_only_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert extras_hint(["matplotlib"]) == (
        "torchnext demo: the loss plot needs matplotlib: pip install 'torchnext[demo]'"
    )
    assert "not drawn (needs matplotlib: pip install 'torchnext[demo]')" in format_summary(
        _summary(plot="")
    )


def _summary(**overrides: Any) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "dataset": "d",
        "model": "m",
        "workers": 4,
        "steps": 10,
        "wall_s": 1.0,
        "failures": 2,
        "fault_kinds": ["kill n0w1 @ step 3"],
        "detection_s": [0.1],
        "recovery_s": [0.5],
        "heal_s": [2.0],
        "replacements": 2,
        "steps_redone": 1,
        "final_loss": 0.1,
        "reference_final_loss": 0.1,
        "max_param_diff_vs_reference": 1e-7,
        "replicas_identical": True,
        "plot": "x.png",
    }
    summary.update(overrides)
    return summary


def test_summary_text_has_the_issue_fields() -> None:
    text = format_summary(_summary())
    for word in (
        "failures",
        "recovery",
        "steps redone",
        "reference loss",
        "replicas identical",
        "x.png",
    ):
        assert word in text


def test_parse_fault_and_config_validation() -> None:
    assert parse_fault("kill:1@80") == ("kill", 1, 80)
    assert parse_fault("STOP:2@5") == ("stop", 2, 5)
    with pytest.raises(ValueError, match="KIND:SLOT@STEP"):
        parse_fault("kill-1-80")
    with pytest.raises(ValueError, match="kill \\(SIGKILL\\) or stop"):
        parse_fault("term:1@3")
    with pytest.raises(ValueError, match="slot"):
        DemoConfig(workers=2, faults=(("kill", 5, 10),))
    with pytest.raises(ValueError, match="step"):
        DemoConfig(steps=10, faults=(("kill", 1, 10),))
    with pytest.raises(ValueError, match="every worker"):
        DemoConfig(workers=2, faults=(("kill", 0, 3), ("stop", 1, 4)))


def test_generated_data_is_deterministic_and_reference_learns() -> None:
    a, b = load_dataset(prefer_real=False, seed=1), load_dataset(prefer_real=False, seed=1)
    assert a.x_ND.equal(b.x_ND) and a.y_N.equal(b.y_N) and a.num_classes == 10
    losses, state = reference_run(steps=40, batch=64, seed=0, lr=2e-3, data=a)
    again, state2 = reference_run(steps=40, batch=64, seed=0, lr=2e-3, data=a)
    assert losses == again and all(state[k].equal(state2[k]) for k in state)
    assert losses[-1] < 0.5 * losses[0]


def test_real_digits_when_scikit_learn_is_installed() -> None:
    pytest.importorskip("sklearn")
    d = load_dataset()
    assert d.x_ND.shape == (1797, 64) and "digits" in d.name
    assert float(d.x_ND.max()) == 1.0
