"""The training guide's example runs under ``torchnext run``, checkpoints and resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fault_tolerant_transformer.py"
SMALL = ["--layers", "1", "--d-model", "32", "--seq", "16", "--global-batch", "8"]


def _run(tmp_path: Path, steps: int) -> str:
    cmd = [sys.executable, "-m", "torchnext", "run", "--nproc", "2", str(EXAMPLE)]
    cmd += ["--steps", str(steps), "--ckpt-every", "5", "--ckpt", str(tmp_path / "t.ckpt"), *SMALL]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEXT_")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


def test_example_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    first = _run(tmp_path, 10)
    assert "step   10" in first and "members 2" in first
    assert (tmp_path / "t.ckpt").exists()
    again = _run(tmp_path, 20)
    assert again.count("resumed from") == 2 and "at step 10" in again
    assert "step   20" in again
