"""Side-by-side benchmark runner shared by every script in ``benchmarks/``.

Use it when a claim is "A is X times faster than B": :func:`compare` runs the
candidates *interleaved* in one process (A, B, A, B, ... after a warm-up), so drift of
the machine (frequency, other load) hits all of them alike, and reports the median and
spread of each plus the ratio of medians. :class:`Report` prints a fixed-width table
and writes ``benchmarks/results/NAME.json``. While :func:`compare` runs, its
repetitions show as a progress bar on stderr (see :mod:`torchnext._progress`; nothing
under ``CI``), never on stdout, which holds the table.

Do not assume the absolute times transfer between machines; the ratios are the claim.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchnext._progress import progress

__all__ = [
    "PairedDifference",
    "Report",
    "Timing",
    "compare",
    "paired_difference",
    "percentile",
    "results_dir",
    "time_once",
]


@dataclass(frozen=True)
class Timing:
    """Per-repetition times of one candidate, in seconds."""

    name: str
    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def p10_s(self) -> float:
        return percentile(self.samples_s, 10)

    @property
    def p90_s(self) -> float:
        return percentile(self.samples_s, 90)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the measurement was."""
        med = self.median_s
        return (self.p90_s - self.p10_s) / med if med > 0 else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; ``ValueError`` if empty."""
    if not values:
        raise ValueError("percentile: values is empty; measure at least one sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q={q} is outside [0, 100]")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(frozen=True)
class PairedDifference:
    """The median of paired differences ``other - base`` and its 95 % bootstrap interval."""

    median: float
    lo: float
    """2.5th percentile of the bootstrapped medians."""
    hi: float
    """97.5th percentile of the bootstrapped medians."""
    pairs: int

    def relative_to(self, base: float) -> PairedDifference:
        """The same difference as a fraction of ``base`` (e.g. the baseline's median)."""
        if base <= 0:
            raise ValueError(f"relative_to: base={base} must be positive")
        return PairedDifference(self.median / base, self.lo / base, self.hi / base, self.pairs)


def paired_difference(
    base: Sequence[float], other: Sequence[float], *, resamples: int = 1000, seed: int = 0
) -> PairedDifference:
    """Median of ``other[i] - base[i]`` with a 95 % bootstrap interval of that median.

    Use it on samples measured in adjacent pairs (interleaved candidates, as
    :func:`compare` takes them): the difference of neighbours cancels slow drift of
    the machine, so its interval is far narrower than the two spreads suggest.
    Equivalent to::

        d = other - base
        boot = [median(choice(d, len(d))) for _ in range(resamples)]
        PairedDifference(median(d), percentile(boot, 2.5), percentile(boot, 97.5), len(d))
    """
    import numpy as np

    if len(base) != len(other) or not base:
        raise ValueError(
            f"paired_difference: base has {len(base)} samples and other {len(other)}; pass "
            "the same non-zero number, measured in pairs"
        )
    if resamples < 1:
        raise ValueError(f"paired_difference: resamples={resamples} must be >= 1")
    d = np.asarray(other, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boot = np.median(d[rng.integers(0, d.size, size=(resamples, d.size))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return PairedDifference(float(np.median(d)), float(lo), float(hi), int(d.size))


def time_once(fn: Callable[[], object], inner: int = 1) -> float:
    """Seconds per call of ``fn``, averaged over ``inner`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def compare(
    candidates: Mapping[str, Callable[[], object]],
    *,
    reps: int = 15,
    warmup: int = 2,
    inner: int = 1,
    setup: Callable[[], None] | None = None,
    before: Mapping[str, Callable[[], None]] | None = None,
) -> dict[str, Timing]:
    """Time each candidate ``reps`` times, interleaved, after ``warmup`` untimed rounds.

    Equivalent to::

        for _ in range(warmup): [fn() for fn in candidates.values()]
        for r in range(reps):
            for name, fn in rotated(candidates, r):   # order rotates every repetition
                setup(); before[name]()                # untimed
                samples[name].append(time_once(fn, inner))

    ``before`` maps some candidates to an untimed step run right before each of their
    calls (for example ``torch.set_num_threads(t)``, so that one run compares thread
    counts side by side).
    """
    if not candidates:
        raise ValueError("compare: candidates is empty; pass at least one name -> callable")
    if reps < 1 or warmup < 0 or inner < 1:
        raise ValueError(
            f"compare: reps={reps}, warmup={warmup}, inner={inner}; need reps>=1, warmup>=0, inner>=1"
        )
    names = list(candidates)
    prepare = dict(before or {})
    unknown = sorted(set(prepare) - set(names))
    if unknown:
        raise ValueError(
            f"compare: before names {unknown}, which are not candidates {names}; "
            "key before by candidate name"
        )

    def ready(name: str) -> None:
        if setup is not None:
            setup()
        if name in prepare:
            prepare[name]()

    samples: dict[str, list[float]] = {n: [] for n in names}
    # One unit per round of all candidates; the bar advances between rounds, never
    # inside a timed call.
    with progress(warmup + reps, f"bench {' vs '.join(names)}", unit="rounds") as bar:
        for _ in range(warmup):
            for name in names:
                ready(name)
                candidates[name]()
            bar.advance()
        for r in range(reps):
            # Rotate the order so no candidate always runs right after the same other one.
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                ready(name)
                samples[name].append(time_once(candidates[name], inner))
            bar.advance()
    return {n: Timing(n, tuple(s)) for n, s in samples.items()}


def results_dir() -> Path:
    """``benchmarks/results`` beside the running benchmark scripts (created if missing)."""
    from torchnext._bench_cli import benchmarks_dir

    path = benchmarks_dir() / "results"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000 or abs(value) < 0.01:
            return f"{value:.3g}"
        return f"{value:.3f}"
    return str(value)


@dataclass
class Report:
    """A benchmark's table and its JSON record.

    ``rows`` are the table's records (dicts with the same keys); ``summary`` holds the
    headline keys the issue names (``speedup_vs_restart``...). ``write()`` prints the
    table and writes ``results/NAME.json`` with ``{"name", "machine", "summary", "rows"}``.
    """

    name: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, **row: Any) -> None:
        missing = [c for c in self.columns if c not in row]
        if missing:
            raise ValueError(f"Report.add: row is missing columns {missing}; got {sorted(row)}")
        self.rows.append(row)

    def table(self) -> str:
        cells = [[_fmt(r.get(c, "")) for c in self.columns] for r in self.rows]
        widths = [
            max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(self.columns)
        ]
        lines = ["  ".join(c.rjust(w) for c, w in zip(self.columns, widths, strict=True))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
        return "\n".join(lines)

    def write(self, path: Path | None = None) -> Path:
        print(f"== {self.name} ==")
        print(self.table())
        if self.summary:
            print()
            for key, value in self.summary.items():
                print(f"{key}: {_fmt(value)}")
        for note in self.notes:
            print(f"note: {note}")
        target = path if path is not None else results_dir() / f"{self.name}.json"
        payload = {
            "name": self.name,
            "machine": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "torch": _torch_version(),
            },
            "summary": self.summary,
            "rows": self.rows,
            "notes": self.notes,
        }
        payload.update(self.summary)  # the keys also sit at the top level
        target.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"wrote {target}", file=sys.stderr)
        return target


def _torch_version() -> str:
    try:
        import torch
    except ImportError:
        return "absent"
    return str(torch.__version__)
