"""Checkpoints of a training :class:`~torchnext.distributed.Manager` through ``torch.distributed.checkpoint``.

Use it so that a *full* job restart (every process gone: preemption, a deploy, the
agent's machine) resumes bit-identically where the job was; a member that dies alone
needs none of this, it heals from the live ones::

    manager = Manager.from_env(model, opt, sampler, state={"lr": schedule})
    load_checkpoint(manager, "ckpt")                   # every member, before the first step
    while manager.step < steps:
        manager.run_step(loss_of, batches=loader)
        if manager.step % 50 == 0:
            save_checkpoint(manager, "ckpt", keep=3)   # every member; one writes
    manager.finish()

``ckpt/step-00000050/`` is a dcp checkpoint (``.metadata``, one ``.distcp`` file) of
:meth:`Manager.state_dict` (model, optimizer, sampler position, registered entries,
RNG states, step count) and a ``"torchnext"`` manifest (format, step, registered
names, the state's layout). How it holds:

* **One writer, no process group.** Every member holds a full replica, so rank 0 of
  the current membership (the lowest-ranked survivor) writes alone with dcp's
  ``no_dist=True``: no collective and no ``init_process_group`` (the manager's group
  is no ``torch.distributed`` default group, and dcp needs none in this mode).
* **Atomic.** dcp writes into ``.tmp-step-N-<pid>/`` (files fsynced, ``.metadata``
  last), which is then renamed ``step-N``: a crash mid-write leaves only the
  temporary directory, ignored by readers and removed by the next save. The last
  ``keep`` checkpoints are kept.
* **Resume.** :func:`load_checkpoint` on every member before the first step restores
  all of the above. A member that finds none (no shared file system) starts at step 0
  and is healed at the first step from one that loaded it; a replacement loads nothing.
* **weights_only.** On torch 2.13 (and 2.14.1) dcp loads non-tensor values with
  ``torch.load(weights_only=False)`` and ``.metadata`` with ``pickle.load``, so a
  checkpoint could run code. Here both go through weights_only-safe loaders
  (:mod:`torchnext.compat.checkpoint_internals`), and the state may hold only tensors,
  None, bool, int, float, complex, str, bytes, dtypes, devices and dict/list/tuple of
  those: anything else (a numpy array) is refused at save, on every member, by name.
* **Exact.** What dcp's format loses (int dict keys become str, empty dicts vanish)
  comes back from the layout, so loading gives ``manager.state_dict()`` as saved;
  :func:`export_checkpoint` writes it as one file for ``torch.load(f, weights_only=True)``.

What not to assume: every member gets the *writer's* random states, as a healed
replacement does, so members whose draws differ per step (uneven shares with dropout)
do not resume their own streams. A ``DataLoader`` draws its workers' seed from the
global generator each time its iterator starts, which a resumed job does at another
step: give it ``generator=torch.Generator()``. The others wait for the writer in the
next step's first collective, bounded by ``ManagerConfig.step_timeout``. A checkpoint
loads only into the same model definition, optimizer type, sampler seed and
registered names; otherwise :class:`~torchnext.errors.CheckpointMismatchError` says what
differs, before anything is changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from torchnext.compat.checkpoint_internals import (
    METADATA_FILE,
    NO_DIST_WARNING,
    RefusedContent,
    SafeFileSystemReader,
    cause_of,
    load_items,
)
from torchnext.distributed.training.manager import Manager
from torchnext.errors import CheckpointError, CheckpointMismatchError, CheckpointNotFoundError

__all__ = [
    "FORMAT",
    "export_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
]

FORMAT = 1
"""Version of the manifest; a checkpoint of another version is refused."""

_MANIFEST = "torchnext"
_NAME = re.compile(r"step-(\d+)")
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device)
PathLike = str | os.PathLike[str]


def save_checkpoint(manager: Manager, directory: PathLike, *, keep: int = 3) -> Path | None:
    """Write ``manager.state_dict()`` as ``directory/step-N`` from rank 0; keep the last ``keep``.

    Call it on every member after the same committed step. Returns the checkpoint on the
    writer; None on the others and on a replacement that has not healed yet.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"save_checkpoint(keep={keep!r}): give how many to keep, 1 or more.")
    if manager.step < 0:
        return None
    state = manager.state_dict()
    manifest = {
        "format": FORMAT,
        "step": manager.step,
        "entries": manager.training_state.spec(),
        "optimizer": type(manager.optimizer).__name__,
        "members": list(manager.group.members),
        "torch": torch.__version__,
        "layout": _layout(state, "state"),  # refuses what weights_only cannot load
    }
    if manager.rank != 0:
        return None
    root = _directory(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{manager.step:08d}"
    tmp, old = (root / f".{kind}-{final.name}-{os.getpid()}" for kind in ("tmp", "old"))
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=NO_DIST_WARNING)
            dcp.save(
                {**state, _MANIFEST: json.dumps(manifest)},
                storage_writer=dcp.FileSystemWriter(tmp, sync_files=True),
                no_dist=True,
            )
        if final.exists():  # the same step again: swap, leaving no moment without it
            os.rename(final, old)
        os.rename(tmp, final)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a power loss
        finally:
            os.close(fd)
    except CheckpointException as exc:  # a BaseException: raise the failure it wraps
        shutil.rmtree(tmp, ignore_errors=True)
        raise cause_of(exc) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in [
        *list_checkpoints(root)[:-keep],
        *root.glob(".tmp-step-*"),
        *root.glob(".old-step-*"),
    ]:
        if stale != final:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _layout(obj: Any, where: str) -> Any:
    """The shape of ``obj`` dcp does not keep (dict keys, list or tuple); checks its leaves."""
    if isinstance(obj, torch.Tensor) or isinstance(obj, _LEAVES):
        return 0
    if isinstance(obj, Mapping):
        keys = list(obj)
        if len({str(k) for k in keys if type(k) in (str, int, float)}) != len(keys):
            raise CheckpointError(
                f"{where} has the keys {keys!r}; a checkpoint needs str, int or float keys "
                "that differ as strings. Use such keys in state_dict()."
            )
        return {"d": [[k, _layout(v, f"{where}[{k!r}]")] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        inner = [_layout(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if all(x == 0 for x in inner) and not any(isinstance(v, torch.Tensor) for v in obj):
            return 0  # nothing dcp walks into: stored whole, exactly
        return {"t" if isinstance(obj, tuple) else "l": inner}
    raise CheckpointError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which "
        "torch.load(weights_only=True) refuses; make state_dict() return tensors (e.g. "
        "torch.from_numpy), numbers, strings, None and dict/list/tuple of those."
    )


def list_checkpoints(directory: PathLike) -> list[Path]:
    """The complete checkpoints under ``directory``, oldest step first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _NAME.fullmatch(p.name)) and (p / METADATA_FILE).is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: PathLike) -> Path | None:
    """The complete checkpoint with the highest step under ``directory``, or None."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def _directory(path: PathLike) -> Path:
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CheckpointError(
            f"{p} is a file, not a checkpoint directory (step-N checkpoints go inside one); "
            "a torch.save file loads with manager.load_state_dict(torch.load(path, "
            "weights_only=True)). Move it away or give another directory.",
            path=str(p),
        )
    return p


def _resolve(path: PathLike, step: int | None, *, required: bool) -> Path | None:
    """A checkpoint from ``path``: itself, its ``step``, or its latest (None if none)."""
    p = _directory(path)
    if step is None and (p / METADATA_FILE).is_file():
        return p
    chosen = latest_checkpoint(p) if step is None else p / f"step-{step:08d}"
    if chosen is not None and (chosen / METADATA_FILE).is_file():
        return chosen
    if step is None and not required:
        return None
    have = [c.name for c in list_checkpoints(p)] or "none"
    raise CheckpointNotFoundError(
        f"no complete checkpoint {chosen or p} (a step-N directory with {METADATA_FILE}); "
        f"{p} holds {have}. Check the path and step, or save_checkpoint() first.",
        path=str(chosen or p),
    )


def load_checkpoint(
    manager: Manager, directory: PathLike, *, step: int | None = None
) -> Path | None:
    """Load the latest checkpoint under ``directory`` (or ``step``'s) into ``manager``.

    Call it on every member before the first step. Returns the checkpoint loaded; None
    when there is none (a fresh start) or ``manager`` is a replacement, which heals.
    """
    if manager.step < 0:
        return None
    if manager.step != 0:
        raise CheckpointError(
            f"load_checkpoint({str(directory)!r}) after step {manager.step} committed; "
            "load before the first run_step()/start_step(), on every member.",
            path=str(directory),
        )
    path = _resolve(directory, step, required=step is not None)
    if path is None:
        return None
    state = _read(path, manager)
    seed, ours = state["sampler"].get("seed"), manager.sampler.state_dict().get("seed")
    if seed != ours:
        raise CheckpointMismatchError(
            f"checkpoint {path} was saved with sampler seed {seed}, this sampler has {ours}; "
            "build the ElasticSampler with the SamplerConfig of the run that saved it.",
            path=str(path),
        )
    manager.load_state_dict(state)
    return path


def read_checkpoint(path: PathLike, *, step: int | None = None) -> dict[str, Any]:
    """A checkpoint's state as ``manager.state_dict()`` gave it (``path``: one, or a directory)."""
    found = _resolve(path, step, required=True)
    return _read(found, None) if found is not None else {}


def export_checkpoint(path: PathLike, file: PathLike, *, step: int | None = None) -> Path:
    """Write a checkpoint as one file that ``torch.load(file, weights_only=True)`` reads."""
    out = Path(file)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    torch.save(read_checkpoint(path, step=step), tmp)
    os.replace(tmp, out)
    return out


def _read(path: Path, manager: Manager | None) -> dict[str, Any]:
    try:
        metadata = SafeFileSystemReader(path).read_metadata()
        if _MANIFEST not in metadata.state_dict_metadata:
            raise CheckpointError(
                f"{path} is a dcp checkpoint without the {_MANIFEST!r} manifest that "
                "save_checkpoint writes; load it with torch.distributed.checkpoint.load.",
                path=str(path),
            )
        manifest = json.loads(load_items(path, {_MANIFEST})[_MANIFEST])
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CheckpointError(
                f"{path} is not in checkpoint format {FORMAT} (its manifest: "
                f"{str(manifest)[:80]}); load it with the torchnext version that wrote it.",
                path=str(path),
            )
        if manager is not None:
            _check_fits(manager, manifest, metadata, path)
        tree = _Node()
        for fqn, value in load_items(path).items():
            node, keys = tree, (metadata.planner_data or {}).get(fqn, (fqn,))
            for key in keys[:-1]:
                node = node.setdefault(key, _Node())
            node[keys[-1]] = value
        state = dict(_rebuild(manifest["layout"], tree, "state"))
    except CheckpointError:
        raise
    except RefusedContent as exc:
        raise CheckpointError(
            f"checkpoint {path} was refused: {exc}. It holds more than data (it could run "
            "code); load only checkpoints that save_checkpoint wrote, from sources you trust.",
            path=str(path),
        ) from exc
    except Exception as exc:  # noqa: BLE001 - anything else: the files are damaged
        others = [p.name for p in list_checkpoints(path.parent) if p != path]
        raise CheckpointError(
            f"checkpoint {path} is damaged or incomplete ({type(exc).__name__}: {str(exc) or 'cut short'}). "
            "Delete it to resume from the one before, or load another with step=N"
            + (f" (there: {', '.join(others)})." if others else "."),
            path=str(path),
        ) from exc
    return state


class _Node(dict[Any, Any]):
    """A container rebuilt from dcp's flattened names (never a value that loaded whole)."""


_MISSING = object()


def _rebuild(layout: Any, node: Any, where: str) -> Any:
    """``node`` in the shape ``layout`` recorded (see :func:`_layout`)."""
    if not isinstance(node, _Node) and node is not _MISSING:
        return node  # a tensor, or a value dcp stored whole: already exact
    if layout == 0:
        raise LookupError(f"no value for {where}")
    got = node if isinstance(node, _Node) else {}
    if "d" in layout:
        return {
            k: _rebuild(c, got.get(str(k), _MISSING), f"{where}[{k!r}]") for k, c in layout["d"]
        }
    items = [
        _rebuild(c, got.get(i, _MISSING), f"{where}[{i}]")
        for i, c in enumerate(layout.get("l", layout.get("t")))
    ]
    return tuple(items) if "t" in layout else items


def _check_fits(manager: Manager, manifest: dict[str, Any], metadata: Metadata, path: Path) -> None:
    """Raise :class:`CheckpointMismatchError` naming what differs, before anything is loaded."""
    saved, mine = dict(manifest.get("entries") or {}), manager.training_state.spec()
    problems = [
        f"registered entry {n!r} is in the checkpoint, not here"
        for n in sorted(set(saved) - set(mine))
    ]
    problems += [
        f"registered entry {n!r} is here, not in the checkpoint"
        for n in sorted(set(mine) - set(saved))
    ]
    if manifest.get("optimizer") != type(manager.optimizer).__name__:
        problems.append(
            f"the optimizer was {manifest.get('optimizer')}, is {type(manager.optimizer).__name__}"
        )
    paths = metadata.planner_data or {}
    theirs = {
        str(paths[fqn][1]): f"{str(md.properties.dtype).removeprefix('torch.')} {list(md.size)}"
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
        and len(paths.get(fqn, ())) == 2
        and paths[fqn][0] == "model"
    }
    ours = {
        k: f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
        for k, t in manager.model.state_dict().items()
        if isinstance(t, torch.Tensor)
    }
    for key in sorted(set(theirs) | set(ours)):
        if theirs.get(key) != ours.get(key):
            problems.append(
                f"model entry {key!r} was {theirs.get(key, 'absent')}, is {ours.get(key, 'absent')}"
            )
    if problems:
        more = f" (and {len(problems) - 6} more)" if len(problems) > 6 else ""
        raise CheckpointMismatchError(
            f"checkpoint {path} does not fit this manager: {'; '.join(problems[:6])}{more}. "
            "Build the model and optimizer and register the entries (Manager(state=...), "
            "manager.register) as the run that saved it did, or resume from another directory.",
            path=str(path),
        )
