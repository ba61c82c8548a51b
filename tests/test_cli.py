"""The ``torchnext`` command: help, version, doctor, bench discovery, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchnext import __version__
from torchnext.cli import SUBCOMMANDS, main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchnext", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version_is_from_metadata() -> None:
    proc = _run("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"torchnext {__version__}"
    assert __version__ != "0.0.0+unknown"


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"torchnext {command}" in out


def test_no_arguments_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_doctor_json_lists_every_capability_once() -> None:
    from torchnext._capabilities import CAPABILITIES

    proc = _run("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    names = [c["name"] for c in info["capabilities"]]
    assert names == [c.name for c in CAPABILITIES]
    for cap in info["capabilities"]:
        assert cap["status"] in ("native", "torchnext", "unavailable")
        assert cap["detail"]
    assert set(info["backends"]) == {"gloo", "nccl", "mpi"}
    assert info["backends"]["gloo"] is True


def test_doctor_table_is_readable() -> None:
    proc = _run("doctor")
    assert proc.returncode == 0, proc.stderr
    assert "capability" in proc.stdout and "linalg.polar" in proc.stdout


def test_bench_unknown_name_exits_2_and_lists_available() -> None:
    proc = _run("bench", "no-such-benchmark")
    assert proc.returncode == 2
    assert "no benchmark named 'no-such-benchmark'" in proc.stderr


def test_readme_feature_table_lists_every_capability() -> None:
    from pathlib import Path

    from torchnext._capabilities import CAPABILITIES

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for cap in CAPABILITIES:
        assert f"| `{cap.name}` |" in readme, f"README feature table lacks {cap.name}"
