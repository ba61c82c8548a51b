"""Runs a Triton check in a child process, under Triton's CPU interpreter or not.

``TRITON_INTERPRET`` must be set before Triton is first imported, and a test process may
already have imported it, so the kernel tests run their checks in a fresh interpreter. The
child prints one JSON document on its last line of stdout; :func:`run_child` returns it.

Shared by the Triton kernel tests of ``tests/gemm`` and ``tests/linalg`` (pytest puts
``tests/`` on ``sys.path`` because ``tests/conftest.py`` lives there, so ``import
triton_interpreter`` works from any test directory). :data:`needs_triton` skips a test, with
the reason, where Triton is not installed; nothing here imports Triton itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest

HAS_TRITON = importlib.util.find_spec("triton") is not None
SKIP_REASON = "Triton is not installed (pip install torchnext[gpu])"
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason=SKIP_REASON)

# Under the per-test timeout of 120 s (pyproject.toml), so a stuck child fails with its
# own output instead of being cut off by the signal timeout.
CHILD_TIMEOUT_S = 110
_TAIL = 3000  # characters of the child's output shown on failure


def _tail(text: str | bytes | None) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-_TAIL:]


def run_child(program: str, *, interpret: bool = True, timeout: float = CHILD_TIMEOUT_S) -> Any:
    """Run ``program`` with ``python -c`` and return the JSON on its last stdout line.

    ``interpret`` sets ``TRITON_INTERPRET=1`` in the child's environment (the kernels then
    run on the CPU). The wait is bounded by ``timeout`` seconds; a timeout, a non-zero exit
    or missing output fails the calling test with the tail of the child's stderr and stdout.
    """
    env = dict(os.environ)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", program],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"the Triton child ran past {timeout} s\n"
            f"--- stderr ---\n{_tail(exc.stderr)}\n--- stdout ---\n{_tail(exc.stdout)}"
        )
    assert proc.returncode == 0, proc.stderr[-_TAIL:] + proc.stdout[-_TAIL:]
    lines = proc.stdout.strip().splitlines()
    assert lines, "the Triton child printed nothing\n" + proc.stderr[-_TAIL:]
    return json.loads(lines[-1])
