"""``torchnext bench NAME``: run ``benchmarks/NAME.py`` (dashes become underscores).

Each benchmark script defines ``main(argv: list[str]) -> int``; the arguments after
``NAME`` are passed to it unchanged (``torchnext bench linalg --quick``). The scripts
are found in ``$TORCHNEXT_BENCH_DIR``, else ``./benchmarks``, else the ``benchmarks``
folder of the source checkout torchnext was installed from.

Scripts that time with :func:`torchnext.benchmarking.compare` show its repetitions as
a progress bar on stderr (plain lines when stderr is not a terminal, nothing when
``CI`` is set); their tables and ``--json`` output on stdout are unchanged by it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from torchnext.errors import BenchmarkNotFoundError

__all__ = ["benchmarks_dir", "available", "run", "add_arguments", "main"]


def benchmarks_dir() -> Path:
    from torchnext._env import TORCHNEXT_BENCH_DIR

    configured = TORCHNEXT_BENCH_DIR.get()
    candidates = [Path(configured)] if configured else []
    candidates += [Path.cwd() / "benchmarks", Path(__file__).resolve().parent.parent / "benchmarks"]
    for path in dict.fromkeys(candidates):  # ordered, without duplicates
        if path.is_dir():
            return path
    raise BenchmarkNotFoundError(
        f"no benchmarks folder found (looked in {', '.join(str(p) for p in dict.fromkeys(candidates))}); "
        "run from a torchnext source checkout or set TORCHNEXT_BENCH_DIR"
    )


def available() -> list[str]:
    return sorted(
        p.stem.replace("_", "-")
        for p in benchmarks_dir().glob("*.py")
        if not p.stem.startswith("_")
    )


def run(name: str, argv: list[str]) -> int:
    folder = benchmarks_dir()
    path = folder / f"{name.replace('-', '_')}.py"
    if not path.is_file() or path.stem.startswith("_"):
        raise BenchmarkNotFoundError(
            f"no benchmark named {name!r}; available: {', '.join(available()) or 'none'}"
        )
    spec = importlib.util.spec_from_file_location(f"torchnext_bench_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise BenchmarkNotFoundError(f"cannot load benchmark script {path}")
    module = importlib.util.module_from_spec(spec)
    # Registered like an imported module: pickling (worker processes) and torch.compile
    # look benchmark functions up by their module name.
    sys.modules[spec.name] = module
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
        return int(module.main(argv))
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(spec.name, None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="benchmark to run; omit to list them")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")


def main(args: argparse.Namespace) -> int:
    try:
        if args.name is None:
            for name in available():
                print(name)
            return 0
        return run(args.name, list(args.args))
    except BenchmarkNotFoundError as exc:
        print(f"torchnext bench: {exc}", file=sys.stderr)
        return 2
