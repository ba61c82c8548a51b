"""Loading ``torch.distributed.checkpoint`` (dcp) checkpoints with ``weights_only`` semantics.

On torch 2.13 and 2.14.1 dcp's ``FileSystemReader.read_metadata`` loads a checkpoint's
``.metadata`` with plain ``pickle.load``, and ``DefaultLoadPlanner.load_bytes`` loads
every non-tensor value with ``torch.load(weights_only=False)``: opening a checkpoint
someone else wrote can run their code. :func:`load_items` reads a checkpoint through
:class:`SafeFileSystemReader` (an unpickler that accepts only what dcp writes into
``.metadata``: its metadata dataclasses and enums, the filesystem layer's storage
records, ``torch.Size``, dtypes, layouts, memory formats, paths) and
:class:`SafeLoadPlanner` (values through ``torch.load(weights_only=True)``); anything
else raises :class:`RefusedContent`. Tensors were already read with
``weights_only=True`` by dcp itself. Use it wherever a checkpoint from disk is loaded
(:mod:`torchnext.distributed.training.checkpoint` does).

====================================================  ===========================  ==============
access                                                what for                     tested on
====================================================  ===========================  ==============
``.metadata``, dcp's global metadata file name        the file read here           2.13.0, 2.14.1
``filesystem._StorageInfo`` (by name, in the pickle)  where each item's bytes lie  2.13.0, 2.14.1
``metadata._MEM_FORMAT_ENCODING`` (by name)           tensor memory formats        2.13.0, 2.14.1
``torch.serialization._get_layout`` (by name)         tensor layouts               2.13.0, 2.14.1
``FileSystemReader.read_metadata`` sets ``load_id``   what the override keeps      2.13.0, 2.14.1
``DefaultLoadPlanner`` plans from the dict it gets    a state dict built here      2.13.0, 2.14.1
====================================================  ===========================  ==============

What not to assume: the names are allowed, never imported here; a torch release that
pickles other classes into ``.metadata`` makes loading fail with :class:`RefusedContent`
naming the class (add it here after checking it is data only), never run it. The whole
checkpoint is loaded into CPU memory.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pickle
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem

__all__ = [
    "METADATA_FILE",
    "NO_DIST_WARNING",
    "RefusedContent",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "load_items",
    "cause_of",
    "read_metadata",
]

METADATA_FILE = ".metadata"
"""dcp's global metadata file, written last (through a temporary file and a rename)."""

_DCP_MODULES = frozenset(
    {
        "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.filesystem",
        "torch.distributed.checkpoint.planner",
    }
)
"""Modules whose dataclasses and enums a metadata file may hold (data only)."""

_ALLOWED = frozenset(
    {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
        ("pathlib", "Path"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
    }
)
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)
NO_DIST_WARNING = r"torch\.distributed is disabled"
"""The warning dcp gives on every ``no_dist=True`` call (a filter pattern for it)."""


class RefusedContent(pickle.UnpicklingError):
    """A checkpoint holds something other than data (it could run code); not loaded."""


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds dcp's metadata records and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_CONSTANTS):
            return getattr(torch, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module in _DCP_MODULES:
            found = super().find_class(module, name)
            if isinstance(found, type) and (
                dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)
            ):
                return found
        raise RefusedContent(
            f"{METADATA_FILE} refers to {module}.{name}, which is not one of the data "
            "classes dcp writes there"
        )


def read_metadata(stream: IO[bytes]) -> Metadata:
    """Unpickle a dcp ``.metadata`` stream, refusing every class that is not dcp data."""
    metadata = _MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(
            f"{METADATA_FILE} holds a {type(metadata).__name__}, not dcp Metadata"
        )
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """dcp's ``FileSystemReader`` whose metadata read cannot run code (see the module)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.directory = Path(path)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with open(self.directory / METADATA_FILE, "rb") as stream:
            metadata = read_metadata(stream)
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Loads every item of a checkpoint into a flat dict (``keys``: only those top-level keys).

    No state dict is needed: one is built from the metadata (empty tensors and
    placeholders, by dcp's flattened name); values load with ``weights_only=True``.
    """

    def __init__(self, keys: Collection[str] | None = None) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.keys = keys
        self.loaded: dict[str, Any] = {}

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        metadata: Metadata | None = None,
        is_coordinator: bool = False,
    ) -> None:
        paths = (metadata.planner_data if metadata is not None else None) or {}
        for fqn, md in (metadata.state_dict_metadata if metadata is not None else {}).items():
            if self.keys is not None and str(paths.get(fqn, (fqn,))[0]) not in self.keys:
                continue
            if isinstance(md, TensorStorageMetadata):
                state_dict[fqn] = torch.empty(md.size, dtype=md.properties.dtype)
            else:
                state_dict[fqn] = md  # a placeholder load_bytes replaces
        self.loaded = state_dict
        super().set_up_planner(state_dict, metadata, is_coordinator)

    def load_bytes(self, read_item: ReadItem, value: Any) -> None:
        fqn = read_item.dest_index.fqn
        try:
            self.loaded[fqn] = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            why = next((ln for ln in str(exc).splitlines() if "Unsupported global" in ln), "")
            if not why:
                raise  # truncated or garbled, not refused
            why = why.strip().split(" was not an allowed global")[0]
            raise RefusedContent(f"{fqn!r} does not load with weights_only=True: {why}") from exc


def load_items(path: str | os.PathLike[str], keys: Collection[str] | None = None) -> dict[str, Any]:
    """Every item of the dcp checkpoint at ``path`` (or of top-level ``keys``), by flattened name.

    Raises what went wrong (:class:`RefusedContent`, ``OSError``, ``EOFError``...),
    unwrapped from dcp's ``CheckpointException``.
    """
    planner = SafeLoadPlanner(keys)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=NO_DIST_WARNING)
            dcp.load({}, storage_reader=SafeFileSystemReader(path), planner=planner, no_dist=True)
    except CheckpointException as exc:  # a BaseException: raise the failure it wraps
        raise cause_of(exc) from exc
    return planner.loaded


def cause_of(exc: BaseException) -> BaseException:
    """The exception dcp wrapped in a ``CheckpointException`` (its first rank's), else ``exc``."""
    if isinstance(exc, CheckpointException) and exc.failures:
        return next(iter(exc.failures.values()))[0]
    return exc
