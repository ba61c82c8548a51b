"""The HSDP half of ``ft-sharded``: recovery and heal rate of fault-tolerant replica groups.

One job of 2 replica groups of 2 processes (``torchnext run --nproc 4 --group-size 2``,
an in-process :class:`~torchnext.distributed.launch.agent.Agent`) trains the character
transformer of ``examples/fault_tolerant_transformer.py`` (the model the DiLoCo half
pins, at d_model 128 here so that a heal moves megabytes) with
:mod:`torchnext.demo.hsdp_trainer`, sharded with FSDP2 inside each group; process
``n0w2`` (group 1, shard 0) is killed with SIGKILL inside the backward pass of step
``KILL_STEP``. The launcher kills its group-mate and restarts the group, which heals
from group 0 shard by shard. Every process logs JSON lines (see the trainer), and the
figures come from those logs:

* ``hsdp_recovery_s``: from the victim's last record (written just before it kills
  itself) to the moment the last process of the surviving group completes its first
  collective in the new membership (the sync all-gather after the shrink). The step's
  compute is not in it: the survivors' compute of the step in flight is a few ms.
* ``hsdp_heal_mb_per_s``: the restarted group's shard transfer: the bytes its
  processes received, over the longest of their transfers (they run in parallel).
* ``hsdp_step_s``: the median time between committed steps of a full job.

What not to assume: times are wall-clock on one host, noisy on a shared machine.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["measure"]

KILL_STEP = 3
VICTIM = "n0w2"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fault_tolerant_transformer.py"


def _run_job(folder: Path, *, steps: int, width: int, deadline_s: float) -> list[str]:
    from torchnext.demo.hsdp_job import run_job

    job = run_job(
        [
            f"--steps={steps}",
            f"--width={width}",
            f"--transformer={EXAMPLE}",
            "--batch=64",
            f"--deadline-s={deadline_s}",
            f"--fault=backward:{VICTIM}:{KILL_STEP}",
        ],
        folder=folder,
        nproc=4,
        group_size=2,
        max_restarts=1,
        deadline=timedelta(seconds=deadline_s + 60),
    )
    if job.exit_code != 0:
        raise RuntimeError("HSDP job failed:\n" + "\n".join(job.messages))
    return job.messages


def measure(*, quick: bool) -> dict[str, Any]:
    """Run the 2x2 job once with one kill; return the figures and the table's rows."""
    from torchnext.demo.hsdp_job import read_records

    steps, width = (8, 64) if quick else (30, 128)  # width: the transformer's d_model
    with tempfile.TemporaryDirectory(prefix="ft-sharded-hsdp-") as tmp:
        folder = Path(tmp)
        _run_job(folder, steps=steps, width=width, deadline_s=240.0)
        recs = read_records(folder / "records")
    kill = next(r for r in recs if r["kind"] == "fault" and r["member"] == VICTIM)
    finals = {r["member"]: r for r in recs if r["kind"] == "final"}
    survivors = [f for m, f in finals.items() if m in ("n0w0", "n0w1")]
    new_epoch = min(
        int(e)
        for f in survivors
        for e in f["first_op_done"]
        if float(f["first_op_done"][e]) > kill["t"]
    )
    recovered = max(float(f["first_op_done"][str(new_epoch)]) for f in survivors)
    heals = [h for m, f in finals.items() if ".r" in m for h in f["heals"]]
    heal_bytes = sum(h["bytes"] for h in heals)
    heal_s = max((h["seconds"] for h in heals), default=0.0)
    full = sorted(
        r["t"] for r in recs if r["kind"] == "step" and r["member"] == "n0w0" and r["world"] == 4
    )
    gaps = [b - a for a, b in zip(full, full[1:], strict=False)]
    out: dict[str, Any] = {
        "hsdp_recovery_s": round(recovered - kill["t"], 4),
        "hsdp_heal_mb_per_s": round(heal_bytes / 1e6 / heal_s, 2) if heal_s > 0 else 0.0,
        "hsdp_heal_mb": round(heal_bytes / 1e6, 3),
        "hsdp_step_s": round(statistics.median(gaps), 4) if gaps else float("nan"),
    }
    out["rows"] = [
        ("HSDP 2x2: recovery after kill -9 (s, bar <= 1.0)", out["hsdp_recovery_s"]),
        ("HSDP 2x2: restarted group's heal (MB/s)", out["hsdp_heal_mb_per_s"]),
        ("HSDP 2x2: bytes healed into the group (MB)", out["hsdp_heal_mb"]),
        ("HSDP 2x2: step time, full job (s)", out["hsdp_step_s"]),
    ]
    return out


if __name__ == "__main__":
    print(json.dumps(measure(quick=True), indent=2, default=str))
