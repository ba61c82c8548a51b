"""``torchnext demo``: fault-tolerant training you can watch, with faults injected.

Runs :mod:`torchnext.demo.trainer` on N workers under the agent, SIGKILLs one worker
and SIGSTOPs another mid-run (by default), shows step, loss, world size and events
live, then prints a summary next to a failure-free reference run of the same seed and
writes a PNG of loss against step. ``--json`` prints the summary as JSON instead.

Faults are ``KIND:SLOT@STEP``: ``kill:1@80`` sends SIGKILL to the worker in slot 1
(whatever member currently runs there) once step 80 has committed; ``stop:2@170``
sends SIGSTOP (a hang: the survivors evict it by heartbeat timeout and the agent
replaces it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

__all__ = ["add_arguments", "main", "parse_fault"]


def parse_fault(text: str) -> tuple[str, int, int]:
    """``"kill:1@80"`` -> ``("kill", 1, 80)``; ``ValueError`` naming the format otherwise."""
    try:
        kind, rest = text.split(":", 1)
        slot, step = rest.split("@", 1)
        parsed = (kind.strip().lower(), int(slot), int(step))
    except ValueError:
        raise ValueError(
            f"--fault {text!r}: expected KIND:SLOT@STEP, e.g. kill:1@80 or stop:2@170"
        ) from None
    if parsed[0] not in ("kill", "stop"):
        raise ValueError(f"--fault {text!r}: KIND must be kill (SIGKILL) or stop (SIGSTOP)")
    return parsed


def _finite(obj: Any) -> Any:
    """NaN/inf (a run that did not finish) become null, so the output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=4, help="data-parallel workers (default 4)")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument(
        "--fault",
        action="append",
        default=None,
        metavar="KIND:SLOT@STEP",
        help="inject a fault (repeatable); default: kill:1@80 and stop:2@170",
    )
    parser.add_argument("--no-faults", action="store_true", help="run without faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=40.0,
        help="minimum step time, so the run is watchable (default 40)",
    )
    parser.add_argument(
        "--max-restarts", type=int, default=4, help="replacements the agent may start"
    )
    parser.add_argument(
        "--plot", default="torchnext-demo.png", help="PNG path (default ./torchnext-demo.png)"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=240.0, help="give up after this many seconds"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--generated-data", action="store_true", help="use the generated dataset")


def main(args: argparse.Namespace) -> int:
    from torchnext.demo.driver import DemoConfig, run_demo
    from torchnext.demo.view import format_summary

    try:
        faults = (
            []
            if args.no_faults
            else [parse_fault(f) for f in (args.fault or ["kill:1@80", "stop:2@170"])]
        )
        config = DemoConfig(
            workers=args.workers,
            steps=args.steps,
            faults=tuple(faults),
            seed=args.seed,
            batch=args.batch,
            lr=args.lr,
            pace_ms=args.pace_ms,
            max_restarts=args.max_restarts,
            plot=args.plot,
            timeout_s=args.timeout_s,
            generated_data=args.generated_data,
        )
    except ValueError as exc:
        print(f"torchnext demo: {exc}", file=sys.stderr)
        return 2
    summary: dict[str, Any] = run_demo(config, live=not args.json)
    if args.json:
        print(json.dumps(_finite(summary), indent=2))
    else:
        print(format_summary(summary))
    return 0 if summary["ok"] else 1
