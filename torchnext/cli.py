"""The ``torchnext`` command.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``main(args) -> int``; :data:`SUBCOMMANDS` maps names to those modules. Modules are
imported only when their subcommand runs (``--help`` of the top level stays fast), so
a subcommand whose optional dependency is missing fails alone, with its own message.

Exit codes: 0 success, 1 the command ran and found a problem, 2 usage or tool error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["SUBCOMMANDS", "main", "build_parser"]

# name -> (module, one-line help). Keep sorted by how often people use them.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("torchnext.demo.cli", "fault-tolerant training, workers killed and healed live"),
    "run": ("torchnext.distributed.launch.cli", "launch a fault-tolerant training script (agent)"),
    "doctor": ("torchnext._doctor", "what this torch has natively and what torchnext adds"),
    "bench": ("torchnext._bench_cli", "run a benchmark script and write its JSON results"),
    "upgrade": (
        "torchnext.upgrade.cli",
        "find and fix torch 2.14 breaking changes (--fix to apply)",
    ),
    "fr": ("torchnext.distributed.flight_recorder.cli", "flight recorder: analyze dumps"),
}


class _LazySubparsers:
    """Adds each subcommand's parser, importing its module only when asked for."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        self.parsers: dict[str, argparse.ArgumentParser] = {}
        for name, (_module, help_text) in SUBCOMMANDS.items():
            self.parsers[name] = self.sub.add_parser(
                name, help=help_text, description=help_text, add_help=False
            )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; with ``command``, that subcommand's arguments are filled in."""
    from torchnext import __version__

    parser = argparse.ArgumentParser(
        prog="torchnext",
        description="PyTorch 2.14's capabilities on the torch you run, and an upgrade tool.",
    )
    parser.add_argument("--version", action="version", version=f"torchnext {__version__}")
    lazy = _LazySubparsers(parser)
    if command in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[command][0])
        sub = lazy.parsers[command]
        sub.add_argument("-h", "--help", action="help", help="show this help and exit")
        module.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command)
    if not args_list:
        parser.print_help()
        return 2
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.main(args))
    except KeyboardInterrupt:
        print("torchnext: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
