"""Run :mod:`torchnext.demo.hsdp_trainer` as one job under the launcher, and read its records.

Use :func:`run_job` in tests and benchmarks that need a real replica-group job: an
in-process :class:`~torchnext.distributed.launch.agent.Agent` starts ``nproc`` workers
in groups of ``group_size``, restarts failed groups, and the call returns once every
worker ended (or raises when the job outlives its deadline, with what the agent said).
:func:`read_records` reads the JSON lines the workers wrote.

What not to assume: the job's exit code is returned, not checked; the agent's messages
are the launcher's own lines, for assertions and for the error of a failed check.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["JobResult", "read_records", "run_job"]


@dataclass(frozen=True, kw_only=True, slots=True)
class JobResult:
    """How a job ended."""

    exit_code: int
    """The launcher's exit code (0: every worker finished)."""
    messages: list[str]
    """What the launcher reported, in order (starts, exits, restarts, recoveries...)."""

    @property
    def restarts(self) -> list[str]:
        """The messages that restarted a replica group."""
        return [m for m in self.messages if "restarting replica group" in m]


def read_records(folder: Path) -> list[dict[str, Any]]:
    """Every JSON line the workers wrote under ``folder`` (one file per member)."""
    return [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def run_job(
    trainer_args: list[str],
    *,
    folder: Path,
    nproc: int,
    group_size: int,
    max_restarts: int,
    deadline: timedelta,
) -> JobResult:
    """Run the trainer with ``trainer_args`` (its records in ``folder / "records"``, the
    workers' output in ``folder / "logs"``) until every worker ended; raises
    :class:`TimeoutError` if that takes longer than ``deadline``."""
    from torchnext.distributed.launch.agent import Agent, AgentConfig, AgentEvent

    command = [
        "-m",
        "torchnext.demo.hsdp_trainer",
        f"--records={folder / 'records'}",
        *trainer_args,
    ]
    events: list[AgentEvent] = []
    config = AgentConfig(
        nproc=nproc,
        group_size=group_size,
        max_restarts=max_restarts,
        log_dir=str(folder / "logs"),
        term_grace=timedelta(seconds=2),
    )
    end = time.monotonic() + deadline.total_seconds()
    with Agent(command, config, on_event=events.append) as agent:
        agent.start()
        while agent.poll():
            if time.monotonic() > end:
                said = "\n".join(e.message for e in events)
                raise TimeoutError(f"the HSDP job did not end within {deadline}:\n{said}")
            time.sleep(0.1)
        code = agent.exit_code()
    return JobResult(exit_code=code, messages=[e.message for e in events])
