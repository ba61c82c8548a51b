"""The analyzer's report model: one finding, one rank's dump, one group's report.

Use it to read what :func:`torchnext.distributed.fr_analyze.analyze` returns (the
names are re-exported there) or to build findings in analysis passes that live in
their own modules. What not to assume: ranks in findings are group members' ranks
as the dumps number them; ``--json`` output is :func:`finding_json` of each.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Finding", "GroupReport", "RankDump", "finding_json", "ranges"]


@dataclass(frozen=True)
class Finding:
    """One problem: its kind, where (group, collective), who is to blame and why."""

    kind: str
    group: str
    seq: int | None
    op: str
    culprits: tuple[int, ...]
    message: str
    expected: str = ""
    found: str = ""
    ambiguous: bool = False
    ops: tuple[tuple[str, int], ...] = ()
    """For a ``deadlock``: every (group, collective) of the cycle."""


@dataclass
class RankDump:
    rank: int
    path: Path
    doc: dict[str, Any]

    @property
    def time_ns(self) -> int:
        meta = self.doc.get("torchnext") or {}
        return int(meta.get("time_ns", 0))


@dataclass
class GroupReport:
    name: str
    desc: str
    ranks: tuple[int, ...]
    dumped: tuple[int, ...]
    last_seq: dict[int, int]
    first_divergence: int | None = None
    findings: list[Finding] = field(default_factory=list)
    dump_of: dict[int, int] = field(default_factory=dict)
    """Member rank -> key in :attr:`Analysis.dumps` of the dump that speaks for it."""


def finding_json(f: Finding) -> dict[str, Any]:
    d = asdict(f)
    d["culprits"] = list(f.culprits)
    d["ops"] = [list(op) for op in f.ops]
    return d


def ranges(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks) if ranks else "none"
