"""Lazy package exports: a package's public names, imported on first use.

Use it in a package ``__init__`` whose names live in submodules that are costly or
unrelated to each other, so that importing one name does not load the rest::

    __getattr__, __dir__ = lazy_exports(__name__, {"Manager": "training.manager", ...})

Each entry maps a public name to the submodule (relative to the package) that defines
it under the same name; an entry whose value ends in ``:`` maps the name to the
submodule itself. The value is cached in the package after the first lookup, so later
reads are plain attribute reads.

What not to assume: static tools do not run ``__getattr__``; a package that wants its
names typed lists them again under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` for the names in ``table``."""
    for name, where in table.items():
        if not where or where.startswith("."):
            raise ValueError(
                f"lazy_exports({package!r}): {name!r} -> {where!r}; give the submodule "
                "relative to the package, without a leading dot (e.g. 'group.work')"
            )

    def __getattr__(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if where.endswith(":"):
            value: Any = importlib.import_module(f"{package}.{where[:-1]}")
        else:
            value = getattr(importlib.import_module(f"{package}.{where}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
