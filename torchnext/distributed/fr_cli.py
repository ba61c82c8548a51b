"""``torchnext fr``: analyse flight-recorder dumps, or hand them to PyTorch's analyzer.

* ``torchnext fr analyze DIR [--json] [--timeline FILE]``: merge the per-rank dumps in
  ``DIR`` and report, per group, missing ranks, mismatched collectives (culprit and both
  values), the first divergence and ranks stuck in an op; ``--timeline`` writes a
  self-contained HTML page with a per-rank timeline. Exit 0: no problem; 1: problems
  (or unreadable dumps); 2: usage error (no such folder, no dump at all).
* ``torchnext fr export DIR OUT``: write the dumps in the pickle layout PyTorch's
  ``torchfrtrace`` loads (``OUT/torchnext_fr_rank<R>``), so the stock analyzer can be
  run on them. The reverse is never done: torchnext does not unpickle dumps.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_arguments", "main"]

_TORCHFRTRACE_OPS = frozenset(
    {
        "broadcast", "reduce", "all_gather", "all_reduce", "_all_gather_base", "reduce_scatter",
        "_reduce_scatter_base", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
        "send", "recv", "coalesced", "all_gather_single", "reduce_scatter_single", "split", "new_window",
    }
)  # fmt: skip
_EXPORT_PREFIX = "torchnext_fr_rank"


def _torchfrtrace_can_read(profiling_name: str) -> bool:
    """torchfrtrace asserts on ops it does not know and on send/recv without their peers."""
    name = profiling_name.split(":", 1)[-1]
    op, _, peers = name.partition(" ")
    if op in ("send", "recv"):
        return ("->" in peers) if op == "send" else ("<-" in peers)
    return op in _TORCHFRTRACE_OPS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="fr_command", metavar="ACTION")
    an = sub.add_parser("analyze", help="merge per-rank dumps and report problems per group")
    an.add_argument("directory", help="folder holding one dump per rank (searched recursively)")
    an.add_argument("--json", action="store_true", help="print the report as JSON")
    an.add_argument("--timeline", metavar="FILE", help="also write a per-rank timeline (HTML)")
    ex = sub.add_parser("export", help="write dumps in the layout PyTorch's torchfrtrace reads")
    ex.add_argument("directory", help="folder holding the dumps")
    ex.add_argument("output", help="folder to write <prefix><rank> files into")


def main(args: argparse.Namespace) -> int:
    command = getattr(args, "fr_command", None)
    if command == "analyze":
        return _analyze(args)
    if command == "export":
        return _export(args)
    print("torchnext fr: give an action: analyze DIR, or export DIR OUT", file=sys.stderr)
    return 2


def _analyze(args: argparse.Namespace) -> int:
    from torchnext.distributed.fr_analyze import analyze

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
        from torchnext.distributed._fr_timeline import write_html

        path = write_html(analysis, args.timeline)
        print(f"timeline written to {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(analysis.to_json(), indent=2))
    else:
        print(analysis.format_text())
    for _, err in analysis.bad_files:
        print(f"torchnext fr analyze: {err}", file=sys.stderr)
    return 0 if analysis.ok else 1


def _export(args: argparse.Namespace) -> int:
    import pickle
    from pathlib import Path

    from torchnext.distributed.fr_analyze import load_dumps

    try:
        dumps, bad, _ = load_dumps(args.directory)
    except FileNotFoundError as exc:
        print(f"torchnext fr export: {exc}", file=sys.stderr)
        return 2
    for _, err in bad:
        print(f"torchnext fr export: skipped: {err}", file=sys.stderr)
    if not dumps:
        print(f"torchnext fr export: no readable dump in {args.directory}", file=sys.stderr)
        return 2
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for rank, dump in sorted(dumps.items()):
        doc = dict(dump.doc)
        kept = [e for e in doc["entries"] if _torchfrtrace_can_read(str(e["profiling_name"]))]
        skipped = len(doc["entries"]) - len(kept)
        if skipped:
            print(
                f"torchnext fr export: rank {rank}: {skipped} entries with ops torchfrtrace does not know were left out",
                file=sys.stderr,
            )
        doc["entries"] = kept
        doc.pop("torchnext", None)
        with open(out / f"{_EXPORT_PREFIX}{rank}", "wb") as f:
            pickle.dump(doc, f)
    print(f"wrote {len(dumps)} file(s) to {out}; run: torchfrtrace {out} -p {_EXPORT_PREFIX}")
    return 1 if bad else 0
