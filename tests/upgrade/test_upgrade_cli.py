"""``torchnext upgrade``: flags, exit codes, settings, writes, parallel runs (ruff's conventions)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

pytest.importorskip("libcst")

from torchnext.cli import main  # noqa: E402
from torchnext.upgrade import check_paths  # noqa: E402

OLD = "import torch\n\n\ndef f(A):\n    return torch.cholesky(A, upper=True)\n"
NEW = "import torch\n\n\ndef f(A):\n    return torch.linalg.cholesky(A, upper=True)\n"
REPORT_ONLY = "import torch\n\n\ndef f(A):\n    return torch.eig(A)\n"
# Only an unsafe fix (a None check on a split_group result); a method call on an
# unknown receiver is no longer reported at all.
UNSAFE_ONLY = (
    "import torch.distributed as dist\n\n\n"
    "def f(r):\n    g = dist.split_group(split_ranks=r)\n    return g is None\n"
)


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _upgrade(*args: str) -> int:
    return main(["upgrade", "--no-progress", *args])


def test_check_reports_and_exits_1(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "a.py").write_text(OLD)
    assert _upgrade("a.py") == 1
    out = capsys.readouterr().out
    assert "a.py:5:12: TNU001 [*]" in out
    assert "[*] 1 fixable with the `--fix` option." in out
    assert (project / "a.py").read_text() == OLD


def test_clean_tree_exits_0(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "a.py").write_text(NEW)
    assert _upgrade(".") == 0
    assert "All checks passed!" in capsys.readouterr().out


def test_fix_writes_and_exit_codes(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = project / "a.py"
    path.write_text(OLD)
    path.chmod(0o754)
    assert _upgrade("--fix", "a.py") == 0
    assert path.read_text() == NEW
    assert stat.S_IMODE(path.stat().st_mode) == 0o754
    assert "(1 fixed, 0 remaining)" in capsys.readouterr().out
    assert not [p for p in project.iterdir() if p.name.endswith(".tnu")]
    path.write_text(OLD)
    assert _upgrade("--fix", "--exit-non-zero-on-fix", "a.py") == 1
    assert _upgrade("--fix", "--exit-non-zero-on-fix", "a.py") == 0  # nothing left to fix


def test_fix_with_remaining_findings_exits_1(project: Path) -> None:
    (project / "a.py").write_text(
        OLD + REPORT_ONLY.replace("import torch\n", "").replace("f(", "g(")
    )
    assert _upgrade("--fix", "a.py") == 1
    assert "torch.linalg.cholesky" in (project / "a.py").read_text()
    assert _upgrade("--fix", "--exit-zero", "a.py") == 0


def test_unsafe_fixes_need_the_flag(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "b.py").write_text(UNSAFE_ONLY)
    assert _upgrade("b.py") == 1
    out = capsys.readouterr().out
    assert "TNU004 " in out and "TNU004 [*]" not in out
    assert "1 hidden fixes can be enabled with the `--unsafe-fixes` option." in out
    assert _upgrade("--fix", "b.py") == 1
    assert (project / "b.py").read_text() == UNSAFE_ONLY
    assert _upgrade("--fix", "--unsafe-fixes", "b.py") == 0
    assert "g == dist.GroupMember.NON_GROUP_MEMBER" in (project / "b.py").read_text()


def test_diff_writes_nothing(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "a.py").write_text(OLD)
    assert _upgrade("--diff", "a.py") == 1
    out = capsys.readouterr().out
    assert "-    return torch.cholesky(A, upper=True)" in out
    assert "+    return torch.linalg.cholesky(A, upper=True)" in out
    assert (project / "a.py").read_text() == OLD
    (project / "a.py").write_text(NEW)
    assert _upgrade("--diff", "a.py") == 0


def test_select_and_ignore(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "a.py").write_text(OLD)
    assert _upgrade("--ignore", "TNU001", "a.py") == 0
    assert _upgrade("--select", "TNU2", "a.py") == 0
    assert _upgrade("--select", "TNU0", "a.py") == 1
    capsys.readouterr()
    assert _upgrade("--select", "NOPE1", "a.py") == 2
    assert "unknown rule selector" in capsys.readouterr().err


def test_pyproject_settings(project: Path) -> None:
    (project / "a.py").write_text(OLD)
    (project / "pyproject.toml").write_text('[tool.torchnext.upgrade]\nignore = ["TNU001"]\n')
    assert _upgrade("a.py") == 0
    (project / "pyproject.toml").write_text('[tool.torchnext.upgrade]\nexclude = ["skip/**"]\n')
    (project / "skip").mkdir()
    (project / "skip" / "c.py").write_text(OLD)
    (project / "a.py").write_text(NEW)
    assert _upgrade(".") == 0
    (project / "b.py").write_text(UNSAFE_ONLY)
    (project / "pyproject.toml").write_text("[tool.torchnext.upgrade]\nunsafe-fixes = true\n")
    assert _upgrade("--fix", "b.py") == 0
    (project / "pyproject.toml").write_text("[tool.torchnext.upgrade]\nselct = []\n")
    assert _upgrade("a.py") == 2


def test_empty_file_list_and_missing_path(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "empty").mkdir()
    assert _upgrade("empty") == 0
    assert "no Python files" in capsys.readouterr().err
    assert _upgrade("does_not_exist.py") == 2


def test_output_formats(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "a.py").write_text(OLD)
    capsys.readouterr()
    assert _upgrade("--output-format", "json", "a.py") == 1
    items = json.loads(capsys.readouterr().out)
    assert items[0]["code"] == "TNU001"
    assert items[0]["fix"] == {"applicability": "safe"}
    assert items[0]["location"] == {"row": 5, "column": 12}
    assert items[0]["filename"] == "a.py"
    assert _upgrade("--output-format", "github", "a.py") == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("::error title=torchnext upgrade (TNU001),file=a.py,line=5,col=12")


def test_noqa_is_honoured_when_fixing(project: Path) -> None:
    text = OLD.replace("upper=True)", "upper=True)  # noqa: TNU001")
    (project / "a.py").write_text(text)
    assert _upgrade("--fix", "a.py") == 0
    assert (project / "a.py").read_text() == text


def test_syntax_error_is_reported_and_run_continues(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "bad.py").write_text("import torch\ndef f(:\n    torch.qr(x)\n")
    (project / "good.py").write_text(OLD)
    assert _upgrade("--fix", ".") == 1
    assert "bad.py:" in capsys.readouterr().out
    assert (project / "good.py").read_text() == NEW


def test_rule_that_throws_is_contained(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchnext.upgrade import _site

    def boom(site: object) -> None:
        raise RuntimeError("kaput")

    fixers = _site.CALL_FIXERS["torch.qr"]
    monkeypatch.setitem(_site.CALL_FIXERS, "torch.qr", [_site.Fixer("TNU002", boom)] + fixers[1:])
    (project / "a.py").write_text(OLD + "\n\ndef g(A):\n    return torch.qr(A)\n")
    results = check_paths(["a.py"], fix="safe", write=True, jobs=1)
    codes = [f.code for f in results[0].findings]
    assert "TNU902" in codes and "TNU001" in codes
    assert "torch.linalg.cholesky" in (project / "a.py").read_text()
    assert "torch.qr(A)" in (project / "a.py").read_text()


def test_parallel_run_matches_serial(project: Path) -> None:
    for i in range(60):
        (project / f"m{i:02d}.py").write_text(OLD if i % 2 else NEW)
    serial = check_paths(["."], jobs=1)
    parallel = check_paths(["."], jobs=2)
    assert [(r.path, len(r.findings)) for r in serial] == [
        (r.path, len(r.findings)) for r in parallel
    ]
    assert sum(len(r.findings) for r in parallel) == 30


def test_missing_libcst_says_how_to_install(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "a.py").write_text(OLD)
    monkeypatch.setitem(sys.modules, "libcst", None)
    assert _upgrade("a.py") == 2
    assert "install torchnext[upgrade]" in capsys.readouterr().err


def test_package_imports_without_libcst() -> None:
    import subprocess

    code = (
        "import sys; sys.modules['libcst'] = None\n"
        "import torchnext.upgrade as u\n"
        "assert callable(u.check_paths) and len(u.RULES) > 30\n"
        "try:\n    u.check_paths(['.'])\nexcept RuntimeError as e:\n    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "install torchnext[upgrade]" in proc.stdout


def test_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert _upgrade("--explain", "TNU003") == 0
    assert "## Fix safety" in capsys.readouterr().out
    assert _upgrade("--explain", "TNU999") == 2


def test_pre_commit_hook_definition() -> None:
    root = Path(__file__).resolve().parents[2]
    text = (root / ".pre-commit-hooks.yaml").read_text()
    assert "id: torchnext-upgrade" in text and "entry: torchnext upgrade" in text
    assert os.path.isfile(root / "torchnext" / "upgrade" / "flake8.py")


def test_fix_that_breaks_syntax_is_withdrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    import libcst as cst

    from torchnext.upgrade import _site
    from torchnext.upgrade.engine import EngineOptions, process_source
    from torchnext.upgrade.registry import resolve_selection

    def bad_fix(site: _site.Site) -> _site.Diagnosis:
        # A node whose code is not valid Python: "torch.linalg.qr(" with no closing paren
        # (set past LibCST's validation, as a buggy fixer might build it).
        node = cst.Name("x")
        object.__setattr__(node, "value", "torch.linalg.qr(")
        return _site.Diagnosis("TNU002", fix=node)

    monkeypatch.setitem(_site.CALL_FIXERS, "torch.qr", [_site.Fixer("TNU002", bad_fix)])
    findings, new = process_source(
        "import torch\nQ, R = torch.qr(A)\n",
        EngineOptions(active=resolve_selection(), fix_level="safe"),
    )
    assert new is None
    assert [f.code for f in findings] == ["TNU002", "TNU902"]
    assert not any(f.fixed for f in findings)
