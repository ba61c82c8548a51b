"""Method calls on receivers not proved to be tensors, ``new_group`` with local
synchronization, and deprecated names used as values (issue 14, upgrade tool)."""

from __future__ import annotations

import pytest

pytest.importorskip("libcst")

from torchnext.upgrade.engine import EngineOptions, process_source  # noqa: E402
from torchnext.upgrade.registry import resolve_selection  # noqa: E402

UNSAFE = EngineOptions(active=resolve_selection(["ALL"]), fix_level="unsafe")
SAFE = EngineOptions(active=resolve_selection([]), fix_level="safe")

LIBRARY_CLASS = """\
import torch


class Decomposition:
    def qr(self, some=True):
        return self

    def cholesky(self, upper=False):
        return self

    def solve(self, other):
        return other

    def run(self, other):
        q = self.qr(some=False)
        c = self.cholesky(upper=True)
        return q, c, self.solve(other), other.svd(), other.ger(other)


def use(d: Decomposition, x):
    store = Decomposition()
    return d.cholesky(), store.qr(), x.cholesky(), x.lu()
"""


def test_library_methods_named_like_tensor_methods_are_left_alone() -> None:
    findings, new = process_source(LIBRARY_CLASS, UNSAFE)
    assert [f.code for f in findings] == []
    assert new is None


def test_proven_tensor_receivers_are_still_fixed() -> None:
    source = (
        "import torch\n\n\n"
        "def f(A: torch.Tensor, B):\n"
        "    P = torch.nn.Parameter(torch.randn(3, 3))\n"
        "    C = A.mT @ A\n"
        "    Q, R = torch.linalg.qr(C)\n"
        "    B = torch.eye(3)\n"
        "    return C.cholesky(), P.double().qr(), R.ger(Q[0]), B.cholesky()\n"
    )
    findings, new = process_source(source, SAFE)
    assert sorted(f.code for f in findings) == ["TNU001", "TNU001", "TNU002", "TNU211"]
    assert all(f.fixed for f in findings)
    assert new is not None
    assert "torch.linalg.cholesky(C)" in new and "torch.linalg.qr(P.double())" in new
    assert "R.outer(Q[0])" in new and "torch.linalg.cholesky(B)" in new


def test_rebinding_or_shadowing_a_tensor_name_drops_the_proof() -> None:
    source = (
        "import torch\n\n"
        "A = torch.eye(3)\n\n\n"
        "def f(A):\n"
        "    return A.cholesky()\n\n\n"
        "def g(B):\n"
        "    X = torch.eye(3)\n"
        "    X = B\n"
        "    return X.cholesky(), [A.qr() for A in B]\n\n\n"
        "class M:\n"
        "    W = torch.eye(3)\n\n"
        "    def h(self, W):\n"
        "        return W.cholesky()\n"
    )
    findings, new = process_source(source, UNSAFE)
    assert findings == []
    assert new is None


NEW_GROUP = """\
import torch.distributed as dist


def setup(ranks):
    g = dist.new_group(ranks, use_local_synchronization=True)
    if g is None:
        return None
    return g
"""


def test_new_group_with_local_synchronization_is_covered_like_split_group() -> None:
    findings, new = process_source(NEW_GROUP, UNSAFE)
    assert [f.code for f in findings] == ["TNU004"]
    assert findings[0].line == 6
    assert new is not None
    assert "if g is None or g == dist.GroupMember.NON_GROUP_MEMBER:" in new
    # Without the flag 2.13 already gave the sentinel: nothing changes there.
    plain = NEW_GROUP.replace(", use_local_synchronization=True", "")
    assert process_source(plain, UNSAFE) == ([], None)


VALUE_USES = """\
from torch import cholesky, qr as tqr
from torch.jit import script


def build(mats, model):
    solvers = {"chol": cholesky}
    return solvers, list(map(tqr, mats)), apply(script, model)
"""


def test_deprecated_names_used_as_values_are_reported_at_the_import() -> None:
    findings, new = process_source(VALUE_USES, SAFE)
    got = sorted((f.code, f.line, f.column) for f in findings)
    assert got == [("TNU001", 1, 19), ("TNU002", 1, 29), ("TNU101", 2, 23)]
    assert "line 6" in next(f.message for f in findings if f.code == "TNU001")
    assert all(not f.fixed and f.applicability is None for f in findings)
    assert new is None


def test_value_use_report_honours_noqa_and_ignores_calls_and_shadowing() -> None:
    source = (
        "from torch import cholesky  # noqa: TNU001\n"
        "from torch import svd\n"
        "from torch.profiler import profile\n\n\n"
        "def f(A, svd=None):\n"
        "    return cholesky, svd, profile\n"
    )
    assert process_source(source, SAFE) == ([], None)
