"""Settings of ``torchnext upgrade``: ``[tool.torchnext.upgrade]`` in pyproject.toml.

Keys (all optional; command-line flags win over the file, the file over defaults)::

    [tool.torchnext.upgrade]
    select = ["TNU"]            # codes or prefixes; "ALL" includes the noisy TNU4xx rules
    extend-select = ["TNU401"]
    ignore = ["TNU101"]
    exclude = ["third_party/**"] # glob patterns, matched against paths relative to the project
    unsafe-fixes = false

The file is found by walking up from the current directory to the first
``pyproject.toml``; ``--config PATH`` names one explicitly. An unknown key or a bad
value is an error (exit 2), never ignored.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchnext.errors import UpgradeError

__all__ = ["UpgradeSettings", "find_pyproject", "load_settings", "DEFAULT_EXCLUDE"]

DEFAULT_EXCLUDE: tuple[str, ...] = (
    ".git",
    ".hg",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    "__pycache__",
    "build",
    "dist",
    "node_modules",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "site-packages",
)
"""Folder names never entered while walking a directory (a file named explicitly is checked)."""

_KEYS = {"select", "extend-select", "ignore", "exclude", "unsafe-fixes"}


@dataclass(frozen=True, kw_only=True)
class UpgradeSettings:
    """Settings read from pyproject.toml."""

    select: tuple[str, ...] = ()
    """Rule selectors; empty means every rule on by default."""
    extend_select: tuple[str, ...] = ()
    """Selectors added to ``select``."""
    ignore: tuple[str, ...] = ()
    """Selectors removed."""
    exclude: tuple[str, ...] = ()
    """Glob patterns of paths to skip (relative to ``root``)."""
    unsafe_fixes: bool = False
    """Apply unsafe fixes with ``--fix`` even without ``--unsafe-fixes``."""
    root: Path | None = None
    """Folder of the pyproject.toml the settings came from."""

    def __post_init__(self) -> None:
        for name in ("select", "extend_select", "ignore", "exclude"):
            value = getattr(self, name)
            if not all(isinstance(v, str) for v in value):
                raise UpgradeError(
                    f"[tool.torchnext.upgrade] {name.replace('_', '-')}={list(value)!r}: "
                    "expected a list of strings"
                )


def find_pyproject(start: Path) -> Path | None:
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError as exc:
            raise UpgradeError(
                f"reading {path} on Python 3.10 needs the 'tomli' package; pip install tomli"
            ) from exc
    try:
        with path.open("rb") as fh:
            return dict(tomllib.load(fh))
    except (OSError, ValueError) as exc:
        raise UpgradeError(f"cannot read settings from {path}: {exc}") from exc


def _strings(value: Any, key: str, path: Path) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise UpgradeError(
        f"{path}: [tool.torchnext.upgrade] {key}={value!r}: expected a list of strings"
    )


def load_settings(config: Path | None = None, start: Path | None = None) -> UpgradeSettings:
    """Settings from ``config``, else from the nearest pyproject.toml above ``start``."""
    path = config if config is not None else find_pyproject((start or Path.cwd()).resolve())
    if path is None:
        return UpgradeSettings()
    if not path.is_file():
        raise UpgradeError(f"--config {path}: no such file")
    table = _load_toml(path).get("tool", {}).get("torchnext", {}).get("upgrade", {})
    if not isinstance(table, dict):
        raise UpgradeError(f"{path}: [tool.torchnext.upgrade] must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise UpgradeError(
            f"{path}: unknown key(s) {unknown} in [tool.torchnext.upgrade]; valid: {sorted(_KEYS)}"
        )
    unsafe = table.get("unsafe-fixes", False)
    if not isinstance(unsafe, bool):
        raise UpgradeError(
            f"{path}: [tool.torchnext.upgrade] unsafe-fixes={unsafe!r}: expected true/false"
        )
    return UpgradeSettings(
        select=_strings(table.get("select", []), "select", path),
        extend_select=_strings(table.get("extend-select", []), "extend-select", path),
        ignore=_strings(table.get("ignore", []), "ignore", path),
        exclude=_strings(table.get("exclude", []), "exclude", path),
        unsafe_fixes=unsafe,
        root=path.parent,
    )
