"""Progress on stderr: a rich bar on a terminal, plain lines elsewhere, nothing under CI."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from torchnext._progress import progress, progress_mode


@pytest.fixture(autouse=True)
def _not_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite itself may run under CI; each test sets CI where it wants it.
    monkeypatch.delenv("CI", raising=False)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_with_rich_draws_a_rich_bar() -> None:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    assert progress_mode(console=console) == "rich"
    with progress(40, "checking", unit="files", console=console) as bar:
        for _ in range(40):
            bar.advance()
    text = out.getvalue()
    assert "checking" in text and "40/40" in text and "files" in text
    assert "━" in text  # rich's bar glyph: the bar was drawn, not plain lines
    assert "(100 %)" not in text


def test_a_terminal_stream_picks_rich_and_a_pipe_picks_plain() -> None:
    pytest.importorskip("rich")
    assert progress_mode(_Tty()) == "rich"
    assert progress_mode(io.StringIO()) == "plain"


def test_not_a_terminal_prints_a_line_per_tenth() -> None:
    out = io.StringIO()
    with progress(200, "bench a vs b", unit="rounds", stream=out) as bar:
        for _ in range(200):
            bar.advance()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0] == "bench a vs b: 20/200 rounds (10 %)"
    assert lines[-1] == "bench a vs b: 200/200 rounds (100 %)"
    assert "\x1b" not in out.getvalue()


def test_few_items_print_a_line_each() -> None:
    out = io.StringIO()
    with progress(3, "bench x", stream=out) as bar:
        bar.advance()
        bar.advance(2)
    assert out.getvalue().splitlines() == ["bench x: 1/3 (33 %)", "bench x: 3/3 (100 %)"]


def test_terminal_without_rich_prints_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    out = _Tty()
    assert progress_mode(out) == "plain"
    with progress(10, "upgrade", stream=out) as bar:
        bar.advance(10)
    assert out.getvalue() == "upgrade: 10/10 (100 %)\n"


def test_ci_prints_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setenv("CI", "true")
    out, rich_out = _Tty(), io.StringIO()
    console = Console(file=rich_out, force_terminal=True)
    assert progress_mode(out) == "none" and progress_mode(console=console) == "none"
    with progress(5, "x", stream=out) as bar, progress(5, "y", console=console) as bar2:
        bar.advance(5)
        bar2.advance(5)
    assert out.getvalue() == "" and rich_out.getvalue() == ""


def test_empty_loop_prints_nothing_and_negative_total_is_refused() -> None:
    out = io.StringIO()
    with progress(0, "x", stream=out) as bar:
        bar.advance(0)
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="total=-1"), progress(-1, "x"):
        pass


def test_bench_compare_reports_rounds_on_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    from torchnext.benchmarking import compare

    compare({"a": lambda: None, "b": lambda: None}, reps=8, warmup=2)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == "bench a vs b: 10/10 rounds (100 %)"


def _tree(root: Path, count: int) -> list[Path]:
    files = []
    for i in range(count):
        f = root / f"m{i:03d}.py"
        f.write_text("x = 1\n")
        files.append(f)
    return files


@pytest.mark.parametrize(("count", "lines"), [(49, 0), (50, 10)])
def test_upgrade_run_reports_files_only_for_a_large_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], count: int, lines: int
) -> None:
    pytest.importorskip("libcst")
    from torchnext.upgrade.registry import resolve_selection
    from torchnext.upgrade.runner import RunOptions, run

    files = _tree(tmp_path, count)
    options = RunOptions(active=resolve_selection([], [], []), jobs=1, progress=True)
    results = run(files, options)
    assert len(results) == count
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.splitlines()
    assert len(err) == lines
    if lines:
        assert err[-1] == f"torchnext upgrade: {count}/{count} files (100 %)"


def test_upgrade_json_output_is_unchanged_by_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("libcst")
    from torchnext.cli import main

    _tree(tmp_path, 60)
    main(["upgrade", "--output-format=json", "-j1", str(tmp_path)])
    with_progress = capsys.readouterr()
    main(["upgrade", "--output-format=json", "-j1", "--no-progress", str(tmp_path)])
    without = capsys.readouterr()
    assert with_progress.out == without.out
    assert "torchnext upgrade: 60/60 files (100 %)" in with_progress.err
    assert "60/60 files" not in without.err
