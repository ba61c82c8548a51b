"""examples/moe_grouped.py runs: its grouped layer equals the loop, gradients flow, loss falls."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "moe_grouped.py"


def test_the_moe_example_trains_a_few_steps() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--steps",
            "8",
            "--tokens",
            "128",
            "--dim",
            "32",
            "--hidden",
            "48",
            "--experts",
            "6",
            "--lr",
            "1e-2",
        ],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    diff = float(re.search(r"max \|difference\| = (\S+)", out).group(1))  # type: ignore[union-attr]
    assert diff <= 1e-5
    assert "gradients reach all 5 parameters" in out
    losses = [float(x) for x in re.findall(r"loss (\S+)", out)]
    assert len(losses) == 8
    assert losses[-1] < losses[0]
