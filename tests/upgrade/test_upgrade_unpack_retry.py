"""Retries that are not version guards, tuple results unpacked with ``_`` placeholders,
and comments kept beside the arguments they belong to (issue 14, upgrade tool)."""

from __future__ import annotations

import pytest

pytest.importorskip("libcst")

from torchnext.upgrade.engine import EngineOptions, process_source  # noqa: E402
from torchnext.upgrade.registry import resolve_selection  # noqa: E402

SAFE = EngineOptions(active=resolve_selection(["TNU"]), fix_level="safe")

RETRY = """\
import torch


def make(shapes):
    try:
        return torch.profiler.profile(use_cuda=True, record_shapes=shapes)
    except (TypeError, AttributeError):
        return torch.profiler.profile(use_cuda=True)
"""

SHIM = """\
import torch


def make():
    try:
        return torch.autograd.profiler.profile(use_device="cuda")
    except TypeError:
        return torch.autograd.profiler.profile(use_cuda=True)
"""


def test_retry_with_the_removed_keyword_is_fixed_and_names_the_handler() -> None:
    findings, new = process_source(RETRY, SAFE)
    assert new is not None
    assert "use_cuda" not in new
    assert "TNU301" not in {f.code for f in findings}
    sites = [f for f in findings if f.code == "TNU003"]
    assert [f.line for f in sites] == [6, 8]
    for finding in sites:
        assert finding.fixed
        assert "`except` at line 7" in finding.message
        assert "hide" in finding.message


def test_shim_with_another_spelling_in_the_handler_stays_a_version_guard() -> None:
    findings, new = process_source(SHIM, SAFE)
    assert new is None
    assert "TNU301" in {f.code for f in findings}
    assert not any(f.fixed for f in findings)


def test_placeholder_unpacking_of_symeig_becomes_eigvalsh_upper() -> None:
    source = "import torch\n\ne, _ = torch.symeig(A)\nf, _ = torch.symeig(A, False, False)\n"
    findings, new = process_source(source, SAFE)
    assert new == (
        "import torch\n\n"
        'e = torch.linalg.eigvalsh(A, UPLO="U")\n'
        'f = torch.linalg.eigvalsh(A, UPLO="L")\n'
    )
    assert [f.fixed for f in findings] == [True, True]


@pytest.mark.parametrize(
    "line",
    [
        "_, _ = torch.symeig(A)",  # nothing kept
        "e, _, x = torch.symeig(A)",  # not symeig's arity
        "*e, _ = torch.symeig(A)",  # starred
        "_, lu = torch.solve(B, A)",  # the dropped result is the one the replacement returns
        "u, s, _ = torch.svd(A, compute_uv=False)",  # two results kept
    ],
)
def test_other_unpackings_keep_their_targets(line: str) -> None:
    _, new = process_source(f"import torch\n\n{line}\n", SAFE)
    assert new is None or line.split("=")[0] in new
