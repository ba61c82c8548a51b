"""`torchnext demo --json` end to end: real workers, a SIGKILL and a SIGSTOP, healed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_json_survives_kill_and_stop(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchnext.cli",
            "demo",
            "--json",
            "--workers=3",
            "--steps=110",
            "--fault=kill:1@25",
            "--fault=stop:2@60",
            "--pace-ms=30",
            "--generated-data",
            f"--plot={plot}",
            "--timeout-s=100",
        ],
        capture_output=True,
        text=True,
        timeout=115,
        # Loaded CI machines can deschedule a live worker for over the 1 s default.
        env={**os.environ, "TORCHNEXT_HEARTBEAT_TIMEOUT": "3"},
    )
    summary = json.loads(proc.stdout)
    assert proc.returncode == 0, (
        summary.get("worker_exits"),
        summary.get("worker_log_tails"),
        proc.stderr[-3000:],
    )
    for key in (
        "failures",
        "recovery_s",
        "final_loss",
        "reference_final_loss",
        "replicas_identical",
        "plot",
    ):
        assert key in summary
    assert summary["failures"] == 2
    assert len(summary["recovery_s"]) == 2 and all(0 < r < 30 for r in summary["recovery_s"])
    assert summary["replicas_identical"] is True
    assert abs(summary["final_loss"] - summary["reference_final_loss"]) < 1e-4
    # Adam divides by sqrt(v): where gradients are ~0, summation-order noise of ~1e-7
    # can move a weight by up to lr per step; losses agree to 1e-4 regardless.
    assert summary["max_param_diff_vs_reference"] < 1e-2
    assert summary["replacements"] >= 1
    assert Path(summary["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


_WITHOUT_EXTRA = (
    "import sys\n"
    "sys.modules['rich'] = None\n"  # what an import of a missing package raises: ImportError
    "sys.modules['matplotlib'] = None\n"
    "from torchnext.cli import main\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)


@pytest.mark.slow
def test_demo_without_the_extra_prints_plain_lines_and_the_hint(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_EXTRA,
            "demo",
            "--workers=2",
            "--steps=30",
            "--no-faults",
            "--pace-ms=0",
            "--generated-data",
            f"--plot={plot}",
            "--timeout-s=100",
        ],
        capture_output=True,
        text=True,
        timeout=115,
        env={**os.environ, "TORCHNEXT_HEARTBEAT_TIMEOUT": "3"},
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    hint = "pip install 'torchnext[demo]'"
    assert [line for line in proc.stderr.splitlines() if hint in line] == [
        "torchnext demo: the live view and the loss plot need rich and matplotlib: " + hint
    ]
    assert "\x1b" not in proc.stdout
    assert "step    30/30 [##############################]" in proc.stdout
    assert "not drawn (needs matplotlib" in proc.stdout
    assert not plot.exists()
