"""The shared benchmark runner: interleaving, statistics, report JSON, `torchnext bench`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchnext.benchmarking import Report, Timing, compare, percentile


def test_compare_interleaves_and_rotates_order() -> None:
    calls: list[str] = []
    timings = compare(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=4, warmup=1
    )
    # warm-up a,b then rotated pairs: ab, ba, ab, ba
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert set(timings) == {"a", "b"}
    assert all(len(t.samples_s) == 4 for t in timings.values())


def test_compare_runs_each_before_step_untimed_right_before_its_candidate() -> None:
    import time

    calls: list[str] = []
    timings = compare(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
        reps=2,
        warmup=1,
        before={"b": lambda: (calls.append("pre-b"), time.sleep(0.05))},
    )
    assert calls == ["a", "pre-b", "b", "a", "pre-b", "b", "pre-b", "b", "a"]
    # The 50 ms step is not in b's samples.
    assert max(timings["b"].samples_s) < 0.04


def test_compare_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"before names \['c'\]"):
        compare({"a": lambda: None}, before={"c": lambda: None})
    with pytest.raises(ValueError, match="candidates is empty"):
        compare({})
    with pytest.raises(ValueError, match="reps=0"):
        compare({"a": lambda: None}, reps=0)


def test_percentile_and_timing_statistics() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    t = Timing("x", (1.0, 2.0, 3.0, 4.0, 5.0))
    assert t.median_s == 3.0
    assert t.spread == pytest.approx((4.6 - 1.4) / 3.0)


def test_report_prints_table_and_writes_summary_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = Report(name="demo-bench", columns=["size", "ratio"])
    report.add(size="1kb", ratio=1.5)
    with pytest.raises(ValueError, match="missing columns"):
        report.add(size="2kb")
    report.summary["speedup"] = 1.5
    target = report.write(tmp_path / "demo-bench.json")
    out = capsys.readouterr().out
    assert "size" in out and "1.500" in out
    payload = json.loads(target.read_text())
    assert payload["speedup"] == 1.5
    assert payload["summary"] == {"speedup": 1.5}
    assert payload["rows"] == [{"size": "1kb", "ratio": 1.5}]


def test_bench_cli_runs_a_script_with_its_arguments(tmp_path: Path) -> None:
    (tmp_path / "toy_bench.py").write_text(
        textwrap.dedent(
            """
            from torchnext.benchmarking import Report

            def main(argv):
                report = Report(name="toy-bench", columns=["arg"])
                report.add(arg=" ".join(argv))
                report.summary["n_args"] = len(argv)
                report.write()
                return 0
            """
        )
    )
    env_cmd = [sys.executable, "-m", "torchnext", "bench", "toy-bench", "--quick", "x"]
    proc = subprocess.run(
        env_cmd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**_env(), "TORCHNEXT_BENCH_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((tmp_path / "results" / "toy-bench.json").read_text())
    assert payload["n_args"] == 2
    assert payload["rows"][0]["arg"] == "--quick x"

    listing = subprocess.run(
        [sys.executable, "-m", "torchnext", "bench"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**_env(), "TORCHNEXT_BENCH_DIR": str(tmp_path)},
    )
    assert listing.stdout.split() == ["toy-bench"]


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_paired_difference_cancels_drift_and_brackets_the_shift() -> None:
    from torchnext.benchmarking import paired_difference

    # A slow drift shared by both sides plus a constant shift of 0.05.
    base = [1.0 + 0.01 * i + (0.002 if i % 3 else -0.002) for i in range(400)]
    other = [b + 0.05 + (0.001 if i % 2 else -0.001) for i, b in enumerate(base)]
    d = paired_difference(base, other)
    assert d.pairs == 400
    assert d.lo <= d.median <= d.hi
    assert d.lo <= 0.05 <= d.hi
    assert d.hi - d.lo < 0.005  # the drift (4.0 over the run) is gone
    rel = d.relative_to(2.0)
    assert rel.median == pytest.approx(d.median / 2.0)


def test_paired_difference_rejects_unpaired_samples() -> None:
    from torchnext.benchmarking import paired_difference

    with pytest.raises(ValueError, match="same non-zero number"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="same non-zero number"):
        paired_difference([], [])
    with pytest.raises(ValueError, match="resamples=0"):
        paired_difference([1.0], [2.0], resamples=0)
