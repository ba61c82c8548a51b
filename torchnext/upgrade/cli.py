"""``torchnext upgrade``: find and fix torch 2.14 breaking changes, with ruff's conventions.

Checks by default; ``--fix`` applies safe fixes, ``--unsafe-fixes`` the others too;
``--diff`` prints the changes instead of writing them. Exit codes: 0 when nothing
remains, 1 when findings remain (or, with ``--diff``, when there is a diff; with
``--exit-non-zero-on-fix``, when something was fixed), 2 for a usage or tool error
(bad option or setting, unreadable path, libcst missing). ``--exit-zero`` turns 1 into 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "main", "explain"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or folders (default: .)")
    parser.add_argument("--fix", action="store_true", help="apply safe fixes")
    parser.add_argument(
        "--unsafe-fixes",
        action="store_true",
        default=None,
        help="also apply (or show) fixes that may change behavior",
    )
    parser.add_argument(
        "--diff", action="store_true", help="print the fixes as a diff; write nothing"
    )
    parser.add_argument(
        "--select",
        action="append",
        default=None,
        metavar="CODES",
        help="rule codes or prefixes to enable (comma separated; ALL for every rule)",
    )
    parser.add_argument(
        "--extend-select",
        action="append",
        default=None,
        metavar="CODES",
        help="codes or prefixes to enable on top of the selection",
    )
    parser.add_argument(
        "--ignore",
        action="append",
        default=None,
        metavar="CODES",
        help="codes or prefixes to disable",
    )
    parser.add_argument("--output-format", choices=("text", "json", "github"), default="text")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even if findings remain")
    parser.add_argument(
        "--exit-non-zero-on-fix",
        action="store_true",
        help="exit 1 if any fix was applied, even if nothing remains",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="pyproject.toml to read [tool.torchnext.upgrade] from",
    )
    parser.add_argument(
        "-j", "--jobs", type=int, default=0, help="worker processes (0: automatic, 1: no pool)"
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="never report progress on stderr (shown for 50 files or more, never when CI is set)",
    )
    parser.add_argument(
        "--explain", metavar="CODE", default=None, help="print a rule's documentation"
    )


def explain(code: str) -> str:
    from torchnext.upgrade.docs import rule_markdown
    from torchnext.upgrade.rules import RULES_BY_CODE

    rule = RULES_BY_CODE.get(code.upper())
    if rule is None:
        raise KeyError(code)
    return rule_markdown(rule)


def _err(message: str) -> None:
    print(f"torchnext upgrade: error: {message}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    from torchnext.errors import UpgradeError

    if args.explain:
        try:
            print(explain(args.explain))
        except KeyError:
            _err(f"no rule {args.explain!r}; codes look like TNU001")
            return 2
        return 0
    try:
        import libcst  # noqa: F401
    except ImportError:
        _err("libcst is missing: install torchnext[upgrade]")
        return 2
    try:
        return _run(args)
    except UpgradeError as exc:
        _err(str(exc))
        return 2


def _run(args: argparse.Namespace) -> int:
    from torchnext.upgrade.config import load_settings
    from torchnext.upgrade.output import render, render_diff, summary_lines
    from torchnext.upgrade.registry import resolve_selection, split_codes
    from torchnext.upgrade.runner import RunOptions, discover, run

    settings = load_settings(args.config)
    select = split_codes(args.select) if args.select is not None else list(settings.select)
    ignore = list(settings.ignore) + split_codes(args.ignore)
    extend = list(settings.extend_select) + split_codes(args.extend_select)
    active = resolve_selection(select, ignore, extend)
    unsafe = settings.unsafe_fixes if args.unsafe_fixes is None else bool(args.unsafe_fixes)
    fixing = args.fix or args.diff
    fix_level = ("unsafe" if unsafe else "safe") if fixing else "none"
    files = discover(args.paths or ["."], settings.exclude, settings.root)
    if not files:
        print("torchnext upgrade: no Python files or notebooks found", file=sys.stderr)
        return 0
    options = RunOptions(
        active=active,
        fix_level=fix_level,
        write=bool(args.fix and not args.diff),
        jobs=args.jobs,
        # Whether it is a bar, plain lines or nothing is _progress's call (terminal, CI).
        progress=not args.no_progress,
    )
    results = run(files, options)
    tool_error = any(r.error for r in results)
    if args.diff:
        diff = render_diff(results)
        if diff:
            sys.stdout.write(diff)
        for r in results:
            if r.error:
                _err(f"{r.path}: {r.error}")
        if tool_error:
            return 2
        return 0 if args.exit_zero or not diff else 1
    body = render(results, args.output_format, unsafe=unsafe)
    if body:
        print(body)
    summary = summary_lines(results, unsafe=unsafe, fixing=bool(args.fix))
    print("\n".join(summary), file=sys.stdout if args.output_format == "text" else sys.stderr)
    if tool_error:
        return 2
    remaining = any(r.remaining for r in results)
    fixed_any = any(f.fixed for r in results for f in r.findings)
    if args.exit_zero:
        return 0
    if remaining or (args.exit_non_zero_on_fix and fixed_any):
        return 1
    return 0
