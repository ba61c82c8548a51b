"""The demo's parts that need no processes: PNG writer, plot, view, data, reference run."""

from __future__ import annotations

import io
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from torchnext.demo.cli import parse_fault
from torchnext.demo.data import load_dataset
from torchnext.demo.driver import DemoConfig
from torchnext.demo.plot import Marker, write_plot
from torchnext.demo.png import Canvas
from torchnext.demo.trainer import reference_run
from torchnext.demo.view import LiveState, LiveView, format_summary


def _decode_png(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(tag + body), f"bad CRC in {tag!r}"
        if tag == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert (depth, color) == (8, 2)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + width * 3)
    assert (rows[:, 0] == 0).all()  # filter type "none" on every row
    return rows[:, 1:].reshape(height, width, 3)


def test_png_round_trips_pixels() -> None:
    c = Canvas(40, 20, background=(10, 20, 30))
    c.rect(5, 5, 9, 7, (255, 0, 0))
    c.line(0, 19, 39, 19, (0, 255, 0))
    img = _decode_png(c.to_png())
    assert img.shape == (20, 40, 3)
    assert tuple(img[0, 0]) == (10, 20, 30)
    assert tuple(img[6, 7]) == (255, 0, 0)
    assert (img[19, :, 1] == 255).all()


def test_text_draws_glyph_pixels_and_clips() -> None:
    c = Canvas(30, 10)
    end = c.text(1, 1, "a1", (0, 0, 0))
    assert end == 13
    assert (c.img_HW3[1:8, 1:12] == 0).any()
    c.text(25, 5, "WWW", (0, 0, 0), scale=3)  # runs off the edge: clipped, no error


def test_write_plot_makes_a_png(tmp_path: Path) -> None:
    steps = list(range(1, 51))
    out = write_plot(
        tmp_path / "p.png",
        title="t",
        steps=steps,
        losses=[math.exp(-s / 10) for s in steps],
        world_sizes=[4 if s < 20 else 3 for s in steps],
        reference_steps=steps,
        reference_losses=[math.exp(-s / 10) for s in steps],
        markers=[Marker(step=20, kind="kill", label="SIGKILL N0W1")],
    )
    img = _decode_png(out.read_bytes())
    assert img.shape == (560, 960, 3)
    assert ((img == (214, 39, 40)).all(axis=2)).any()  # the red fault marker is there
    with pytest.raises(ValueError, match="same length"):
        write_plot(tmp_path / "q.png", title="t", steps=[1], losses=[], world_sizes=[1])


def test_plain_view_prints_events_once() -> None:
    out = io.StringIO()
    view = LiveView(out, interactive=False)
    state = LiveState(total_steps=10, step=3, loss=1.5, world_size=4)
    state.events.append("n0w1: failure detected")
    view.render(state)
    view.render(state)
    text = out.getvalue()
    assert text.count("failure detected") == 1
    assert "step     3/10" in text


def test_interactive_view_redraws_in_place() -> None:
    out = io.StringIO()
    view = LiveView(out, interactive=True, max_events=3)
    state = LiveState(total_steps=10)
    view.render(state)
    view.render(state)
    assert "\x1b[7F" in out.getvalue()  # moved up over the 7 lines drawn before


def test_summary_text_has_the_issue_fields() -> None:
    summary = {
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
    text = format_summary(summary)
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
