"""Run the upgrade check over files and folders: discovery, parallelism, atomic writes.

:func:`check_paths` is the library entry point (``torchnext upgrade`` is a thin CLI
over :func:`run`). Folders are walked for ``*.py`` and ``*.ipynb`` files, skipping
VCS, virtual-environment and build folders and the ``exclude`` globs; files named
explicitly are always processed. Large runs use a process pool; each worker reads,
fixes and (when asked) writes its files, so a failure on one file becomes that file's
error and never stops the run.

With ``progress`` on and at least 50 files, the run reports files done on stderr
through :mod:`torchnext._progress` (a bar on a terminal, plain lines otherwise, nothing
under ``CI``); stdout, which ``--output-format json`` and ``--diff`` fill, never sees it.

Writes are atomic (a temporary file in the same folder, then ``os.replace``) and keep
the file's permission bits; a file is only written if its new text parsed and a
second pass changed nothing.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from torchnext._progress import ProgressBar, progress
from torchnext.errors import UpgradeError
from torchnext.upgrade.config import DEFAULT_EXCLUDE
from torchnext.upgrade.findings import FileResult, Finding

__all__ = ["RunOptions", "discover", "process_file", "run", "check_paths"]

_SUFFIXES = (".py", ".ipynb")
_PARALLEL_MIN_FILES = 48
_BATCH = 24
# Below this a run takes about a second: a bar would only flicker.
_PROGRESS_MIN_FILES = 50


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How to run over a set of files."""

    active: frozenset[str]
    """Active rule codes."""
    fix_level: str = "none"
    """``none`` (check), ``safe`` or ``unsafe``."""
    write: bool = False
    """Write fixed files back (``--fix``); False with fixes computes them only (``--diff``)."""
    jobs: int = 0
    """Worker processes; 0 picks ``min(cpu_count, 8)``; 1 runs in this process."""
    progress: bool = False
    """Report progress on stderr when there are at least 50 files (module docstring)."""

    def __post_init__(self) -> None:
        if self.jobs < 0:
            raise UpgradeError(f"jobs={self.jobs}: expected 0 (auto) or a positive count")
        if self.fix_level not in ("none", "safe", "unsafe"):
            raise UpgradeError(f"fix_level={self.fix_level!r}: use none, safe or unsafe")
        if self.write and self.fix_level == "none":
            raise UpgradeError("write=True needs fix_level 'safe' or 'unsafe'")


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    return any(
        fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.rstrip("/") + "/*") for p in patterns
    )


def discover(
    paths: Iterable[str | os.PathLike[str]],
    exclude: Sequence[str] = (),
    root: Path | None = None,
) -> list[Path]:
    """Files to process, sorted and de-duplicated; :class:`UpgradeError` for a missing path."""
    base = (root or Path.cwd()).resolve()
    found: dict[str, Path] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise UpgradeError(f"{path}: no such file or directory")
        if path.is_file():
            found.setdefault(str(path), path)
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(
                d for d in dirnames if d not in DEFAULT_EXCLUDE and not d.startswith(".")
            )
            for name in filenames:
                if not name.endswith(_SUFFIXES):
                    continue
                file = Path(dirpath) / name
                try:
                    rel = file.resolve().relative_to(base).as_posix()
                except ValueError:
                    rel = file.as_posix()
                if exclude and _excluded(rel, exclude):
                    continue
                found.setdefault(str(file), file)
    return [found[k] for k in sorted(found)]


def _atomic_write(path: Path, text: str) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tnu", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def process_file(path: str, options: RunOptions) -> FileResult:
    """Check (and fix, and write) one file; every failure is folded into the result."""
    from torchnext.upgrade.engine import EngineOptions, process_source
    from torchnext.upgrade.notebook import process_notebook

    result = FileResult(path=path)
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            source = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        result.error = f"cannot read: {exc}"
        return result
    engine = EngineOptions(active=options.active, fix_level=options.fix_level)
    try:
        if path.endswith(".ipynb"):
            findings, new_source = process_notebook(source, engine)
        else:
            findings, new_source = process_source(source, engine)
    except RecursionError:
        result.error = "too deeply nested to process"
        return result
    except Exception as exc:  # a bug in a rule must not stop the run over other files
        result.error = f"internal error: {type(exc).__name__}: {exc}"
        return result
    result.findings = sorted(findings, key=lambda f: (f.cell or 0, f.line, f.column, f.code))
    if new_source is not None and new_source != source:
        result.original = source
        result.fixed_source = new_source
        if options.write:
            try:
                _atomic_write(Path(path), new_source)
            except OSError as exc:
                result.error = f"cannot write: {exc}"
                result.findings = [f if not f.fixed else _unfixed(f) for f in result.findings]
                result.fixed_source = None
    return result


def _unfixed(f: Finding) -> Finding:
    return dataclasses.replace(f, fixed=False)


def _process_batch(paths: list[str], options: RunOptions) -> list[FileResult]:
    return [process_file(p, options) for p in paths]


def run(
    files: Sequence[Path],
    options: RunOptions,
    on_result: Callable[[FileResult], None] | None = None,
) -> list[FileResult]:
    """Process ``files`` (in parallel when there are many); results in input order."""
    names = [str(f) for f in files]
    shown = len(names) if options.progress and len(names) >= _PROGRESS_MIN_FILES else 0
    results: dict[str, FileResult] = {}
    with progress(shown, "torchnext upgrade", unit="files", transient=True) as bar:
        _run_all(names, options, results, bar)
    ordered = [results[n] for n in names]
    if on_result is not None:
        for r in ordered:
            on_result(r)
    return ordered


def _run_all(
    names: list[str], options: RunOptions, results: dict[str, FileResult], bar: ProgressBar
) -> None:
    jobs = options.jobs or min(os.cpu_count() or 1, 8)
    if jobs <= 1 or len(names) < _PARALLEL_MIN_FILES:
        for name in names:
            results[name] = process_file(name, options)
            bar.advance()
        return
    batches = [names[i : i + _BATCH] for i in range(0, len(names), _BATCH)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_process_batch, b, options): b for b in batches}
        for future in as_completed(futures):
            batch = futures[future]
            try:
                batch_results = future.result()
            except Exception as exc:  # a crashed worker: mark its files, go on
                batch_results = [
                    FileResult(path=p, error=f"worker failed: {type(exc).__name__}: {exc}")
                    for p in batch
                ]
            for r in batch_results:
                results[r.path] = r
            bar.advance(len(batch))


def check_paths(
    paths: Iterable[str | os.PathLike[str]],
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    extend_select: Sequence[str] = (),
    fix: str = "none",
    write: bool = False,
    jobs: int = 0,
    exclude: Sequence[str] = (),
) -> list[FileResult]:
    """Check (and optionally fix) every Python file and notebook under ``paths``.

    ``fix`` is ``"none"``, ``"safe"`` or ``"unsafe"``; with ``write=True`` fixed files
    are written back atomically. Returns one :class:`FileResult` per file. Needs libcst
    (the ``[upgrade]`` extra); raises :class:`UpgradeError` for a bad selector or path.
    """
    from torchnext.upgrade.registry import resolve_selection

    _require_libcst()
    active = resolve_selection(select, ignore, extend_select)
    options = RunOptions(active=active, fix_level=fix, write=write, jobs=jobs)
    return run(discover(paths, exclude), options)


def _require_libcst() -> None:
    try:
        import libcst  # noqa: F401
    except ImportError as exc:
        raise UpgradeError("torchnext upgrade needs libcst: install torchnext[upgrade]") from exc
