"""``torchnext fr``: analyse flight-recorder dumps, or hand them to PyTorch's analyzer.

* ``torchnext fr analyze DIR [--json] [--timeline FILE] [--trace FILE]``: merge the
  per-rank dumps in ``DIR`` and report, per group, missing ranks, mismatched collectives
  (culprit and both values), the first divergence and ranks stuck in an op;
  ``--timeline`` writes a self-contained HTML page with a per-rank timeline, ``--trace``
  the same ops as Chrome trace-event JSON for Perfetto or chrome://tracing. Exit 0: no problem; 1: problems
  (or unreadable dumps); 2: usage error (no such folder, no dump at all).
* ``torchnext fr export DIR OUT``: write the dumps in the pickle layout PyTorch's
  ``torchfrtrace`` loads (``OUT/torchnext_fr_rank<R>``, see
  :mod:`torchnext.distributed.flight_recorder.export`) and print the ``torchfrtrace`` command that
  reads them. Exit 0: written; 1: written, some dumps unreadable; 2: usage error.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_arguments", "main"]

_DESCRIPTION = """flight recorder: analyze dumps (culprit ranks, mismatches, cross-group
deadlocks, crashed ranks), or export them for PyTorch's own analyzer, torchfrtrace"""
_EPILOG = """examples:
  torchnext fr analyze DUMPS --json         report per group, exit 1 on a problem
  torchnext fr analyze DUMPS --timeline t.html
  torchnext fr analyze DUMPS --trace t.json open t.json in ui.perfetto.dev
  torchnext fr export DUMPS OUT             write OUT/torchnext_fr_rank<R> and print the
                                            torchfrtrace command that reads them"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = _DESCRIPTION
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="fr_command", metavar="ACTION")
    an = sub.add_parser("analyze", help="merge per-rank dumps and report problems per group")
    an.add_argument("directory", help="folder holding one dump per rank (searched recursively)")
    an.add_argument("--json", action="store_true", help="print the report as JSON")
    an.add_argument("--timeline", metavar="FILE", help="also write a per-rank timeline (HTML)")
    an.add_argument(
        "--trace",
        metavar="FILE",
        help="also write the ops as Chrome trace-event JSON (Perfetto, chrome://tracing)",
    )
    ex = sub.add_parser(
        "export",
        help="write dumps in the layout PyTorch's torchfrtrace reads; prints its command",
        description="Write the latest dump of each rank as OUT/torchnext_fr_rank<R>, the "
        "pickle layout PyTorch's torchfrtrace reads, and print the torchfrtrace command to "
        "run (with --allow-incomplete-ranks when a member's dump is missing).",
    )
    ex.add_argument("directory", help="folder holding the dumps (searched recursively)")
    ex.add_argument("output", help="empty folder to write torchnext_fr_rank<R> files into")


def main(args: argparse.Namespace) -> int:
    command = getattr(args, "fr_command", None)
    if command == "analyze":
        return _analyze(args)
    if command == "export":
        return _export(args)
    print("torchnext fr: give an action: analyze DIR, or export DIR OUT", file=sys.stderr)
    return 2


def _analyze(args: argparse.Namespace) -> int:
    from torchnext.distributed.flight_recorder.analyzer import analyze

    try:
        analysis = analyze(args.directory)
    except FileNotFoundError as exc:
        print(f"torchnext fr analyze: {exc}", file=sys.stderr)
        return 2
    if not analysis.dumps:
        for _, err in analysis.bad_files:
            print(f"torchnext fr analyze: {err}", file=sys.stderr)
        print(
            f"torchnext fr analyze: no readable flight-recorder dump in {args.directory}",
            file=sys.stderr,
        )
        return 2
    if args.timeline:
        from torchnext.distributed.flight_recorder.timeline import write_html

        path = write_html(analysis, args.timeline)
        print(f"timeline written to {path}", file=sys.stderr)
    if args.trace:
        from torchnext.distributed.flight_recorder.chrome_trace import write_chrome_trace

        path = write_chrome_trace(analysis, args.trace)
        print(
            f"trace written to {path} (open it in ui.perfetto.dev or chrome://tracing)",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(analysis.to_json(), indent=2))
    else:
        print(analysis.format_text())
    for _, err in analysis.bad_files:
        print(f"torchnext fr analyze: {err}", file=sys.stderr)
    return 0 if analysis.ok else 1


def _export(args: argparse.Namespace) -> int:
    from torchnext.distributed.flight_recorder.export import export_torchfrtrace
    from torchnext.errors import FlightRecorderExportError

    try:
        result = export_torchfrtrace(args.directory, args.output)
    except (FileNotFoundError, FlightRecorderExportError) as exc:
        print(f"torchnext fr export: {exc}", file=sys.stderr)
        return 2
    for _, err in result.unreadable:
        print(f"torchnext fr export: skipped: {err}", file=sys.stderr)
    for rank, n in sorted(result.left_out.items()):
        print(
            f"torchnext fr export: rank {rank}: {n} entries with ops torchfrtrace does not "
            "read were left out",
            file=sys.stderr,
        )
    if result.missing_ranks:
        print(
            f"torchnext fr export: no dump from rank(s) {list(result.missing_ranks)}, "
            "members of a group: torchfrtrace needs --allow-incomplete-ranks",
            file=sys.stderr,
        )
    print(f"wrote {len(result.written)} file(s) to {result.output}; run:")
    print(result.command_line)
    return 1 if result.unreadable else 0
