"""``torchnext fr export``: PyTorch's own ``torchfrtrace`` reads what it writes.

Dumps come from real gloo processes with the recorder enabled (a clean run, one with a
size mismatch, one whose rank 2 is SIGKILLed so its dump is missing), or from the
recorder's own writer where the end states must be exact. The test then runs the very
command the export printed, with this environment's ``torchfrtrace`` first on ``PATH``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from torchnext.cli import main as cli_main
from torchnext.testing import Fault, MultiProcessHarness, WorkerContext

WORLD = 3
BAD_RANK = 2
BAD_STEP = 3
_BIN = str(Path(sys.executable).parent)


def _worker(ctx: WorkerContext, scenario: str, dump_dir: str) -> str:
    import torch
    import torch.distributed as dist

    from torchnext.distributed import flight_recorder as fr

    fr.enable(fr.FlightRecorderConfig(dump_dir=dump_dir))
    store = dist.PrefixStore("fr-export", ctx.store)
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timedelta(seconds=3)
    )
    outcome = "completed"
    try:
        for i in range(5):
            ctx.checkpoint(f"step:{i}")
            # The odd rank's buffer is larger, never smaller: gloo aborts a process that
            # receives more bytes than its buffer holds.
            n = 64 if (scenario == "size" and ctx.rank == BAD_RANK and i == BAD_STEP) else 16 + i
            dist.broadcast(torch.ones(n), 0)
    except Exception as exc:  # noqa: BLE001 - the failure is what the test looks at
        outcome = f"{type(exc).__name__}: {exc}"[:200]
    fr.dump(reason="end")
    return outcome


def _dumps(tmp_path: Path, scenario: str) -> Path:
    dump_dir = tmp_path / "dumps"
    faults = (
        [Fault(rank=BAD_RANK, at=f"step:{BAD_STEP}", kind="kill")] if scenario == "kill" else []
    )
    with MultiProcessHarness(WORLD, faults=faults) as harness:
        result = harness.run(_worker, scenario, str(dump_dir), timeout=timedelta(seconds=60))
    assert not result.unfired_faults, result.describe()
    assert all(r.outcome == "returned" for r in result if r.rank != BAD_RANK), result.describe()
    return dump_dir


def _export(
    dump_dir: Path, out: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[str], str]:
    """Run the export with this environment's scripts first on PATH; (exit, command, stderr)."""
    monkeypatch.setenv("PATH", _BIN + os.pathsep + os.environ.get("PATH", ""))
    code = cli_main(["fr", "export", str(dump_dir), str(out)])
    captured = capsys.readouterr()
    lines = [ln for ln in captured.out.splitlines() if ln.strip()]
    assert lines, captured
    return code, shlex.split(lines[-1]), captured.err


def _torchfrtrace(command: list[str]) -> subprocess.CompletedProcess[str]:
    assert command[0] == "torchfrtrace", command
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": _BIN + os.pathsep + os.environ.get("PATH", "")},
    )


@pytest.mark.parametrize("scenario", ["clean", "size", "kill"])
def test_torchfrtrace_reads_the_export_of_complete_and_incomplete_sets(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    scenario: str,
) -> None:
    dump_dir = _dumps(tmp_path, scenario)
    out = tmp_path / "export"
    code, command, err = _export(dump_dir, out, capsys, monkeypatch)
    assert code == 0, err
    incomplete = scenario == "kill"
    assert command == ["torchfrtrace", str(out), "-p", "torchnext_fr_rank"] + (
        ["--allow-incomplete-ranks"] if incomplete else []
    )
    dumped = [0, 1] if incomplete else [0, 1, 2]
    assert sorted(p.name for p in out.iterdir()) == [f"torchnext_fr_rank{r}" for r in dumped]
    proc = _torchfrtrace(command)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in text, text
    if scenario == "size":  # torchfrtrace finds the odd rank from our dumps
        assert f"Culprit rank {BAD_RANK}; Error type: SIZE_OR_SYNTAX_MISMATCH" in text, text
    if incomplete:
        assert f"missed FR dumps from ranks ({{{BAD_RANK}}})" in text, text
        assert f"no dump from rank(s) [{BAD_RANK}]" in err


def test_ops_that_ended_failed_or_timed_out_are_no_state_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    from torchnext.distributed.flight_recorder import FlightRecorder, FlightRecorderConfig
    from torchnext.distributed.group.hooks import OpInfo

    def op(seq: int, rank: int) -> OpInfo:
        return OpInfo(
            group_name="0", epoch=0, seq=seq, op="allreduce", rank=rank, ranks=(0, 1, 2),
            input_sizes=((4,),), input_dtypes=("float32",),
            output_sizes=((4,),), output_dtypes=("float32",),
        )  # fmt: skip

    # Collective 2 never finished: ranks 0 and 2 timed out in it, rank 1 saw its
    # connection close first. PyTorch's recorder would show it "started" on all three.
    ends = {0: ("timed_out", "wait timed out"), 1: ("failed", "Connection closed by peer")}
    for rank in range(WORLD):
        rec = FlightRecorder(FlightRecorderConfig(dump_dir=str(tmp_path / "dumps")))
        rec.on_finish(rec.on_start(op(1, rank)), "completed")
        state, error = ends.get(rank, ends[0])
        rec.on_finish(rec.on_start(op(2, rank)), state, error)  # type: ignore[arg-type]
        rec.dump()
    out = tmp_path / "export"
    code, command, err = _export(tmp_path / "dumps", out, capsys, monkeypatch)
    assert code == 0, err
    proc = _torchfrtrace(command)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in text, text
    assert "MISMATCH" not in text and "has errors" not in text, text
    with open(out / "torchnext_fr_rank1", "rb") as f:
        entry = pickle.load(f)["entries"][-1]
    assert (entry["state"], entry["torchnext_state"]) == ("started", "failed")


def test_export_refuses_a_folder_torchfrtrace_would_misread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dump_dir = _dumps(tmp_path, "clean")
    # Into the dump folder: torchfrtrace would read the JSON dumps as well, and fail.
    assert cli_main(["fr", "export", str(dump_dir), str(dump_dir)]) == 2
    assert "export into an empty folder" in capsys.readouterr().err
    # An earlier export's file for a rank this set lacks is removed, not read as this one's.
    out = tmp_path / "export"
    out.mkdir()
    (out / "torchnext_fr_rank7").write_bytes(b"stale")
    code, command, err = _export(dump_dir, out, capsys, monkeypatch)
    assert code == 0 and "--allow-incomplete-ranks" not in command, err
    assert sorted(p.name for p in out.iterdir()) == [f"torchnext_fr_rank{r}" for r in range(3)]


def test_export_is_in_the_help_and_the_readme(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["fr", "--help"])
    help_text = capsys.readouterr().out
    assert "export" in help_text and "torchfrtrace" in help_text
    assert "torchnext fr export DUMPS OUT" in help_text
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    assert "torchnext fr export" in readme and "--allow-incomplete-ranks" in readme
