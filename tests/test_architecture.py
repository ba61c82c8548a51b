"""The package's shape: no import cycle, no borrowed private names, small files, lazy exports.

How the cycle test works: every ``.py`` file under ``torchnext/`` is parsed with
``ast`` (nothing is imported). Every ``import`` and ``from ... import`` in the file
is an edge, wherever it sits: at the top, inside a function, or under
``if TYPE_CHECKING:``; relative imports are resolved against the file's package, and
``from pkg import name`` points at ``pkg.name`` when that is a module, else at
``pkg``. Python's implicit import of a parent package is not an edge (every module
would otherwise "import" its own ``__init__``, which is not a dependency the code
chose). The graph's strongly connected components (Tarjan) must all be single
modules; a failure prints each cycle's modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "torchnext"
MAX_LINES = 600


@dataclass(frozen=True)
class Source:
    name: str
    path: Path
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def _sources() -> dict[str, Source]:
    found: dict[str, Source] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        found[name] = Source(name, path, ast.parse(path.read_text(), str(path)))
    return found


SOURCES = _sources()


@dataclass(frozen=True)
class Imported:
    module: str
    """The module the statement imports from (absolute)."""
    names: tuple[str, ...]
    """The names taken from it (``()`` for a plain ``import``)."""
    line: int


def _imports(src: Source) -> Iterator[Imported]:
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Imported(alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = src.package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield Imported(module, tuple(a.name for a in node.names), node.lineno)


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in SOURCES}
    for src in SOURCES.values():
        for imp in _imports(src):
            if not imp.module.startswith("torchnext"):
                continue
            targets = [f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in SOURCES]
            if len(targets) < len(imp.names) or not imp.names:
                targets.append(imp.module)
            graph[src.name].update(t for t in targets if t in SOURCES and t != src.name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_edges_see_type_checking_and_function_level_imports() -> None:
    graph = _edges()
    # torchnext.distributed imports its group only under TYPE_CHECKING and lazily.
    assert "torchnext.distributed.group.fault_tolerant_group" in graph["torchnext.distributed"]


def test_no_import_cycle() -> None:
    cycles = _cycles(_edges())
    assert not cycles, "import cycles (each line one cycle):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def _may_use_private_module(importer: str, module: str) -> bool:
    # An underscore module is private to the package that holds it (and that
    # package's subpackages): torchnext._env is everybody's, rma._shm is rma's.
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:i])
            if not (importer == owner or importer.startswith(owner + ".")):
                return False
    return True


def test_no_module_imports_another_modules_private_name() -> None:
    offenders = []
    for src in SOURCES.values():
        for imp in _imports(src):
            if not imp.module.startswith("torchnext"):
                continue
            if not _may_use_private_module(src.name, imp.module):
                offenders.append(f"{src.path}:{imp.line}: imports private module {imp.module}")
            for name in imp.names:
                full = f"{imp.module}.{name}"
                if name.startswith("_") and not name.startswith("__"):
                    if full in SOURCES and _may_use_private_module(src.name, full):
                        continue
                    offenders.append(f"{src.path}:{imp.line}: imports {name} from {imp.module}")
    assert not offenders, "\n".join(offenders)


def _defined_private_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


# Private attributes of torch's own objects are read in the compatibility modules,
# which list the torch versions each access is tested on.
COMPAT = "torchnext.compat"


# Documented underscore names: the standard library's, and torch._check (torch's
# documented way to state a fact about a symbolic size).
STDLIB_PRIVATE = {"_getframe", "_exit", "_replace", "_asdict", "_fields", "_check"}

CHECKED = ("torchnext",)


def test_private_attributes_are_touched_only_in_their_own_module() -> None:
    offenders = []
    for src in SOURCES.values():
        if src.name == COMPAT or src.name.startswith(COMPAT + "."):
            continue
        if not any(src.name == p or src.name.startswith(p + ".") for p in CHECKED):
            continue
        own = _defined_private_names(src.tree)
        for node in ast.walk(src.tree):
            if not isinstance(node, ast.Attribute):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__") or attr in own:
                continue
            if attr in STDLIB_PRIVATE:
                continue
            offenders.append(f"{src.path}:{node.lineno}: .{attr}")
    assert not offenders, "private attributes of other modules' objects:\n" + "\n".join(offenders)


# The one module outside torchnext.compat that may import torch's private modules: it
# registers the flat switch op in Dynamo's and Inductor's tables, and its supported()
# checks every piece it uses before anything is registered.
PRIVATE_TORCH_ALLOWED = {"torchnext.control_flow._flat_switch_compile"}


def _is_private_torch(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts)


def test_torch_internals_are_imported_only_by_the_compat_modules() -> None:
    offenders = []
    for src in SOURCES.values():
        if (
            src.name == COMPAT
            or src.name.startswith(COMPAT + ".")
            or src.name in PRIVATE_TORCH_ALLOWED
        ):
            continue
        for imp in _imports(src):
            names = [imp.module] + [f"{imp.module}.{n}" for n in imp.names]
            if any(_is_private_torch(n) for n in names):
                offenders.append(f"{src.path}:{imp.line}: imports {imp.module} {list(imp.names)}")
    assert not offenders, "torch internals outside torchnext.compat:\n" + "\n".join(offenders)


def test_the_private_torch_check_sees_private_modules() -> None:
    assert _is_private_torch("torch._C") and _is_private_torch("torch.utils._pytree")
    assert not _is_private_torch("torch.fx.experimental.proxy_tensor")
    assert not _is_private_torch("torchnext._env")


def test_no_file_over_the_size_limit() -> None:
    big = {
        str(s.path): n
        for s in SOURCES.values()
        if (n := len(s.path.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"files over {MAX_LINES} lines: {big}"


def _fault_tolerant_group_lines() -> int:
    src = SOURCES["torchnext.distributed.group.fault_tolerant_group"]
    for node in src.tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "FaultTolerantGroup":
            return (node.end_lineno or node.lineno) - node.lineno + 1
    raise LookupError("FaultTolerantGroup is not defined in its module")


def test_fault_tolerant_group_is_small() -> None:
    assert _fault_tolerant_group_lines() < 400


@pytest.mark.parametrize(
    ("statement", "forbidden"),
    [
        (
            "from torchnext.distributed import FaultTolerantGroup",
            (
                "torchnext.distributed.training",
                "torchnext.distributed.launch",
                "torchnext.distributed.flight_recorder",
                "torchnext.distributed.rma",
                "numpy",
            ),
        ),
        (
            "from torchnext.distributed import flight_recorder as fr; fr.enable",
            (
                "torchnext.distributed.training",
                "torchnext.distributed.launch",
                "torchnext.distributed.flight_recorder.analyzer",
                "torchnext.distributed.rma",
            ),
        ),
        ("import torchnext.distributed", ("torchnext.distributed.group.fault_tolerant_group",)),
    ],
)
def test_imports_load_only_what_they_name(statement: str, forbidden: tuple[str, ...]) -> None:
    # A fresh interpreter: this one has loaded everything already. What bare torch
    # loads is subtracted, so only torchnext's own choices count.
    probe = (
        "import sys, json, torch\n"
        "before = set(sys.modules)\n"
        f"{statement}\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TORCHNEXT_FR_ENABLE"}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    ).stdout
    loaded = __import__("json").loads(out)
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)]
    assert not bad, f"{statement!r} loaded {bad}"


def test_fr_enable_from_the_environment_still_works_at_import() -> None:
    probe = (
        "import torchnext.distributed\n"
        "from torchnext.distributed import flight_recorder as fr\n"
        "print(fr.is_enabled())\n"
    )
    env = {**__import__("os").environ, "TORCHNEXT_FR_ENABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    ).stdout
    assert out.strip() == "True"


OLD_PATHS = {
    "torchnext.distributed.group_config": "torchnext.distributed.group.config",
    "torchnext.distributed.membership": "torchnext.distributed.group.membership",
    "torchnext.distributed.heartbeat": "torchnext.distributed.group.heartbeat",
    "torchnext.distributed.work": "torchnext.distributed.group.work",
    "torchnext.distributed.backend": "torchnext.distributed.group.backend",
    "torchnext.distributed.collectives": "torchnext.distributed.group.collectives",
    "torchnext.distributed.interop": "torchnext.distributed.group.interop",
    "torchnext.distributed.manager": "torchnext.distributed.training.manager",
    "torchnext.distributed.bucketing": "torchnext.distributed.training.bucketing",
    "torchnext.distributed.commit": "torchnext.distributed.training.commit",
    "torchnext.distributed.healing": "torchnext.distributed.training.healing",
    "torchnext.distributed.sampler": "torchnext.distributed.training.sampler",
    "torchnext.distributed.launcher": "torchnext.distributed.launch.agent",
    "torchnext.distributed.agent_exits": "torchnext.distributed.launch.exits",
    "torchnext.distributed.agent_store": "torchnext.distributed.launch.store",
    "torchnext.distributed.run_cli": "torchnext.distributed.launch.cli",
    "torchnext.distributed.fr_analyze": "torchnext.distributed.flight_recorder.analyzer",
    "torchnext.distributed.fr_cli": "torchnext.distributed.flight_recorder.cli",
    "torchnext.distributed.fr_crossgroup": "torchnext.distributed.flight_recorder.crossgroup",
    "torchnext.distributed.fr_exits": "torchnext.distributed.flight_recorder.exits",
    "torchnext.distributed.fr_export": "torchnext.distributed.flight_recorder.export",
    "torchnext.distributed.fr_report": "torchnext.distributed.flight_recorder.report",
}


@pytest.mark.parametrize(("old", "new"), sorted(OLD_PATHS.items()))
def test_old_module_paths_are_the_new_modules(old: str, new: str) -> None:
    import importlib

    assert importlib.import_module(old) is importlib.import_module(new)


def test_every_public_name_of_the_package_resolves() -> None:
    import torchnext.distributed as tnd

    for name in tnd.__all__:
        assert getattr(tnd, name) is not None, name
    assert set(tnd.__all__) <= set(dir(tnd))
    with pytest.raises(AttributeError, match="NoSuchName"):
        tnd.NoSuchName  # noqa: B018
