"""Export flight-recorder dumps in the layout PyTorch's own analyzer, ``torchfrtrace``, reads.

torchnext's dumps are JSON in PyTorch's dump layout (version ``"2.10"``) plus a
``torchnext`` object; ``torchfrtrace`` reads one pickle per rank named
``<prefix><rank>``. :func:`export_torchfrtrace` writes those files from a folder of
dumps (the latest dump of each rank, as ``torchnext fr analyze`` takes it) and returns
the exact ``torchfrtrace`` command to run on them.

What changes on the way, and why:

* **States.** PyTorch's recorder knows ``scheduled``, ``started`` and ``completed``: an
  op that ended in an error never completes, so it stays ``started`` there (a NCCL
  timeout dump shows the stuck op as ``started`` on every rank that entered it).
  torchnext records how it ended (``failed``, ``timed_out``, ``revoked``), and
  ``torchfrtrace`` compares states across ranks: one rank's ``timed_out`` against
  another's ``failed`` in the same collective would be reported as a state mismatch
  that PyTorch's own dumps never show. Those states are exported as ``started``; the
  recorded one stays in the entry under ``torchnext_state``.
* **Ops.** ``torchfrtrace`` stops with an assertion on an op it does not know and on a
  send or receive without its peers, so such entries are left out (and counted).
* **Missing ranks.** ``torchfrtrace`` refuses a set of dumps in which a member of a
  group has none unless it is given ``--allow-incomplete-ranks``; the command carries
  the flag exactly when a member's dump is missing (a rank that died or was stopped).

The reverse is never done: torchnext does not unpickle dumps.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchnext.errors import FlightRecorderExportError

__all__ = [
    "EXPORT_PREFIX",
    "ExportResult",
    "export_torchfrtrace",
    "torchfrtrace_entry",
    "torchfrtrace_state",
]

EXPORT_PREFIX = "torchnext_fr_rank"
"""File-name prefix of exported dumps: ``torchfrtrace -p`` strips it to find the rank."""

# The op names torchfrtrace's matcher accepts (its COLLECTIVES and P2P sets, 2.13-2.14).
_TORCHFRTRACE_OPS = frozenset(
    {
        "broadcast", "reduce", "all_gather", "all_reduce", "_all_gather_base", "reduce_scatter",
        "_reduce_scatter_base", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
        "send", "recv", "coalesced", "all_gather_single", "reduce_scatter_single", "split", "new_window",
    }
)  # fmt: skip

# torchnext's end states -> the state PyTorch's recorder would show for the same op.
_STATES = {
    "scheduled": "scheduled",
    "started": "started",
    "completed": "completed",
    "failed": "started",
    "timed_out": "started",
    "revoked": "started",
}
_EXPORTED_NAME = re.compile(re.escape(EXPORT_PREFIX) + r"\d+")


def torchfrtrace_state(state: str) -> str:
    """The state PyTorch's recorder shows for an op that ended in torchnext's ``state``.

    An op that did not complete (it failed, timed out or was revoked) is ``started``,
    as in PyTorch's own dumps; an unknown state passes unchanged.
    """
    return _STATES.get(state, state)


def torchfrtrace_entry(entry: dict[str, Any]) -> dict[str, Any] | None:
    """``entry`` as torchfrtrace reads it, or ``None`` if torchfrtrace cannot read its op."""
    name = str(entry["profiling_name"]).split(":", 1)[-1]
    op, _, peers = name.partition(" ")
    if op == "send" and "->" not in peers or op == "recv" and "<-" not in peers:
        return None
    if op not in _TORCHFRTRACE_OPS:
        return None
    out = dict(entry)
    state = str(entry["state"])
    out["state"] = torchfrtrace_state(state)
    if out["state"] != state:
        out["torchnext_state"] = state
    return out


@dataclass
class ExportResult:
    """What :func:`export_torchfrtrace` wrote, and the ``torchfrtrace`` command to run."""

    output: Path
    written: dict[int, Path] = field(default_factory=dict)
    left_out: dict[int, int] = field(default_factory=dict)
    """Rank -> how many entries with ops torchfrtrace does not read were left out."""
    missing_ranks: tuple[int, ...] = ()
    """Members of a group that have no dump: torchfrtrace needs ``--allow-incomplete-ranks``."""
    unreadable: list[tuple[Path, str]] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    """Files of an earlier export in ``output`` for ranks this set does not have."""

    @property
    def command(self) -> list[str]:
        """The ``torchfrtrace`` command line that reads the export, as an argv list.

        Uses the ``torchfrtrace`` script when it is on ``PATH``, else the same analyzer
        run as a module of this interpreter's torch.
        """
        if shutil.which("torchfrtrace"):
            argv = ["torchfrtrace"]
        else:
            argv = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
        argv += [str(self.output), "-p", EXPORT_PREFIX]
        if self.missing_ranks:
            argv.append("--allow-incomplete-ranks")
        return argv

    @property
    def command_line(self) -> str:
        """:attr:`command` quoted for a POSIX shell."""
        return shlex.join(self.command)


def _members(pg_config: dict[str, Any]) -> set[int]:
    ranks: set[int] = set()
    for cfg in pg_config.values():
        text = cfg.get("ranks", "[]") if isinstance(cfg, dict) else "[]"
        try:
            value = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError:
            value = ast.literal_eval(text)
        ranks.update(int(r) for r in value)
    return ranks


def _clear_output(output: Path) -> list[Path]:
    """Remove an earlier export's files; refuse a folder torchfrtrace would misread.

    torchfrtrace reads every file under its folder, recursively, whose name contains the
    prefix, and takes what follows the prefix as the rank: a dump left there (the export
    written into the dump folder itself) would make it fail.
    """
    removed: list[Path] = []
    foreign: list[Path] = []
    for path in sorted(p for p in output.rglob("*") if p.is_file() and EXPORT_PREFIX in p.name):
        if path.parent == output and _EXPORTED_NAME.fullmatch(path.name):
            removed.append(path)
        else:
            foreign.append(path)
    if foreign:
        raise FlightRecorderExportError(
            f"export folder {output} holds {foreign[0]}"
            + (f" and {len(foreign) - 1} more" if len(foreign) > 1 else "")
            + f", which torchfrtrace would also read (every file with {EXPORT_PREFIX!r} in its "
            "name); export into an empty folder, not into the dump folder"
        )
    for path in removed:
        path.unlink()
    return removed


def export_torchfrtrace(directory: str | Path, output: str | Path) -> ExportResult:
    """Write the latest dump of each rank in ``directory`` as ``output/<prefix><rank>``.

    Raises :class:`FileNotFoundError` if ``directory`` is not a folder and
    :class:`~torchnext.errors.FlightRecorderExportError` if it holds no readable dump or
    ``output`` holds files torchfrtrace would misread. Unreadable dumps are skipped and
    listed in :attr:`ExportResult.unreadable`.
    """
    # Imported here: the analyzer imports the report model, not the other way round.
    from torchnext.distributed.flight_recorder.analyzer import load_dumps

    dumps, bad, _ = load_dumps(directory)
    if not dumps:
        raise FlightRecorderExportError(
            f"dump folder {directory} holds no readable flight-recorder dump"
            + (f" ({len(bad)} unreadable)" if bad else "")
            + "; point it at the folder the recorder dumped into (dump_dir)"
        )
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise FlightRecorderExportError(
            f"export folder {out} is a file; give a folder to write the exported dumps into"
        )
    out.mkdir(parents=True, exist_ok=True)
    result = ExportResult(output=out, unreadable=list(bad))
    result.removed = _clear_output(out)
    members: set[int] = set()
    for rank, dump in sorted(dumps.items()):
        doc = {k: v for k, v in dump.doc.items() if k != "torchnext"}
        kept = [e for e in map(torchfrtrace_entry, doc["entries"]) if e is not None]
        if len(kept) != len(doc["entries"]):
            result.left_out[rank] = len(doc["entries"]) - len(kept)
        doc["entries"] = kept
        members |= _members(doc["pg_config"])
        path = out / f"{EXPORT_PREFIX}{rank}"
        with open(path, "wb") as f:
            pickle.dump(doc, f)
        result.written[rank] = path
    result.missing_ranks = tuple(sorted(members - set(dumps)))
    return result
