"""Files per second of ``torchnext upgrade`` against TorchFix 0.7.0 on the same tree.

The tree is the installed torch package's own Python sources, read only (both tools
run in check mode: nothing is written). Each tool runs as its own command line, as a
user would run it, with the same number of worker processes, interleaved by
:func:`torchnext.benchmarking.compare`; a run's wall time includes start-up.
torchnext runs with every rule enabled (``--select ALL``); TorchFix with
``--select ALL`` too.

TorchFix pins ``libcst<1.6``, so it is installed into its own cached virtual
environment under ``benchmarks/.cache/`` (self-gitignored) with
``pip install torchfix==0.7.0`` (it depends on nothing torch-related). Peak RSS is
the largest resident set of any process of a run (``wait4``), in MiB.

Usage: ``torchnext bench upgrade [--quick | --full] [--reps N] [--jobs N]``.
``--quick`` checks ``torch/nn``; the default a ~500-file subset (nn, optim, autograd,
profiler, utils, fx, cuda, jit, linalg); ``--full`` the whole package (TorchFix
takes several minutes per pass there on two cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

from torchnext.benchmarking import Report, compare

TORCHFIX_VERSION = "0.7.0"
DEFAULT_SUBDIRS = ("nn", "optim", "autograd", "profiler", "utils", "fx", "cuda", "jit", "linalg")


def _torch_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise SystemExit("torch is not installed in this environment")
    return Path(spec.origin).parent


def _torchfix_python(cache: Path) -> Path:
    env = cache / f"torchfix-{TORCHFIX_VERSION}"
    python = env / "bin" / "python"
    stamp = env / ".installed"
    if stamp.is_file():
        return python
    cache.mkdir(parents=True, exist_ok=True)
    (cache / ".gitignore").write_text("*\n")
    print(f"creating {env} with torchfix=={TORCHFIX_VERSION} ...", file=sys.stderr)
    venv.create(env, with_pip=True, clear=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"torchfix=={TORCHFIX_VERSION}",
        ],
        check=True,
    )
    stamp.write_text(TORCHFIX_VERSION + "\n")
    return python


class _Runner:
    """Runs one command per call; remembers its wall times and peak RSS."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.peak_rss_kib = 0
        self.returncodes: list[int] = []

    def __call__(self) -> None:
        proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        self.peak_rss_kib = max(self.peak_rss_kib, usage.ru_maxrss)
        self.returncodes.append(proc.returncode)
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{self.argv[:3]} failed ({proc.returncode}):\n{err[-2000:]}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench upgrade")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="torch/nn only, one repetition")
    size.add_argument("--full", action="store_true", help="the whole torch package")
    parser.add_argument("--reps", type=int, default=0, help="repetitions (default 2, quick 1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(__file__).resolve().parent / ".cache",
        help="folder for TorchFix's virtual environment",
    )
    args = parser.parse_args(argv)
    root = _torch_root()
    if args.full:
        paths = [root]
    elif args.quick:
        paths = [root / "nn"]
    else:
        paths = [root / d for d in DEFAULT_SUBDIRS if (root / d).is_dir()]
    reps = args.reps or (1 if args.quick else 2)

    from torchnext.upgrade.runner import discover

    files = len(discover(paths))
    tf_python = _torchfix_python(args.cache)
    jobs = str(args.jobs)
    ours = _Runner(
        [
            sys.executable,
            "-m",
            "torchnext",
            "upgrade",
            "--select",
            "ALL",
            "--no-progress",
            "--exit-zero",
            "-j",
            jobs,
            *map(str, paths),
        ]
    )
    theirs = _Runner(
        [str(tf_python), "-m", "torchfix", "--select", "ALL", "-j", jobs, *map(str, paths)]
    )
    started = time.perf_counter()
    timings = compare({"torchnext": ours, "torchfix": theirs}, reps=reps, warmup=0)
    wall_s = time.perf_counter() - started

    report = Report(
        name="upgrade",
        columns=["tool", "files", "median_s", "p10_s", "p90_s", "files_per_s", "peak_rss_mb"],
    )
    per_s = {}
    for name, runner in (("torchnext", ours), ("torchfix", theirs)):
        t = timings[name]
        per_s[name] = files / t.median_s
        report.add(
            tool=name if name == "torchnext" else f"torchfix {TORCHFIX_VERSION}",
            files=files,
            median_s=t.median_s,
            p10_s=t.p10_s,
            p90_s=t.p90_s,
            files_per_s=per_s[name],
            peak_rss_mb=runner.peak_rss_kib / 1024,
        )
    report.summary = {
        "files": files,
        "files_per_s": per_s["torchnext"],
        "torchfix_files_per_s": per_s["torchfix"],
        "speedup_vs_torchfix": per_s["torchnext"] / per_s["torchfix"],
        "peak_rss_mb": ours.peak_rss_kib / 1024,
        "torchfix_peak_rss_mb": theirs.peak_rss_kib / 1024,
        "jobs": args.jobs,
        "reps": reps,
        "tree": "torch/{" + ",".join(p.name for p in paths) + "}" if not args.full else "torch/",
    }
    report.notes.append(
        f"check mode, same {args.jobs} worker processes each, commands interleaved; "
        f"bench wall {wall_s:.0f} s; peak RSS = largest single process of a run"
    )
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
