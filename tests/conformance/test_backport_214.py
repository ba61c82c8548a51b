"""2.14 programs using torch.linalg.polar / matrix_sqrth run on 2.13 + backport."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

PROGRAM = """
import json, torch
import torchnext.backport
info = torchnext.backport.install()
out = {"installed": info["installed"], "unavailable": sorted(info["unavailable"])}
torch.manual_seed(0)
A = torch.randn(5, 3, dtype=torch.double)
if hasattr(torch.linalg, "polar"):
    U, H = torch.linalg.polar(A)
    out["polar"] = [U.tolist(), H.tolist()]
S = A.mT @ A + torch.eye(3, dtype=torch.double)
if hasattr(torch.linalg, "matrix_sqrth"):
    out["sqrth"] = torch.linalg.matrix_sqrth(S).tolist()
errors = {}
for name, call in {"polar_wide": lambda: torch.linalg.polar(torch.randn(3, 5)),
                   "sqrth_int": lambda: torch.linalg.matrix_sqrth(torch.ones(2, 2, dtype=torch.long))}.items():
    try:
        call()
    except AttributeError:
        pass
    except Exception as e:
        errors[name] = [c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins"][0]
out["errors"] = errors
print(json.dumps(out))
"""


def test_linalg_names_agree_with_native(run_on_torch213: Callable[[str], Any]) -> None:
    ours = run_on_torch213(PROGRAM)
    missing = {"torch.linalg.polar", "torch.linalg.matrix_sqrth"} & set(ours["unavailable"])
    torch.manual_seed(0)
    A = torch.randn(5, 3, dtype=torch.double)
    U, H = torch.linalg.polar(A)
    S = A.mT @ A + torch.eye(3, dtype=torch.double)
    if "polar" in ours:
        torch.testing.assert_close(torch.tensor(ours["polar"][0], dtype=torch.double), U)
        torch.testing.assert_close(torch.tensor(ours["polar"][1], dtype=torch.double), H)
        assert ours["errors"]["polar_wide"] == "RuntimeError"
    if "sqrth" in ours:
        torch.testing.assert_close(
            torch.tensor(ours["sqrth"], dtype=torch.double), torch.linalg.matrix_sqrth(S)
        )
        assert ours["errors"]["sqrth_int"] == "RuntimeError"
    if missing:
        pytest.skip(f"torchnext.linalg does not provide {sorted(missing)} yet")
    assert json.dumps(ours)
