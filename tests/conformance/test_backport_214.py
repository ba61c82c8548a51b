"""2.14 programs using torch.linalg.polar / matrix_sqrth run on 2.13 + backport.

Both sides must provide the names: native 2.14.1 has them itself, and on 2.13 (which
lacks them) ``torchnext.backport.install()`` puts torchnext's in place. Values and error
types then agree with native 2.14.1's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import torchnext.backport as backport

NAMES = ("polar", "matrix_sqrth")

PROGRAM = """
import json, torch
had = {name: hasattr(torch.linalg, name) for name in ("polar", "matrix_sqrth")}
import torchnext.backport
info = torchnext.backport.install()
out = {
    "had": had,
    "installed": info["installed"],
    "native": info["native"],
    "unavailable": sorted(info["unavailable"]),
    "modules": {name: getattr(getattr(torch.linalg, name, None), "__module__", None)
                for name in ("polar", "matrix_sqrth")},
}
torch.manual_seed(0)
A = torch.randn(5, 3, dtype=torch.double)
U, H = torch.linalg.polar(A)
out["polar"] = [U.tolist(), H.tolist()]
S = A.mT @ A + torch.eye(3, dtype=torch.double)
out["sqrth"] = torch.linalg.matrix_sqrth(S).tolist()
errors = {}
for name, call in {"polar_wide": lambda: torch.linalg.polar(torch.randn(3, 5)),
                   "sqrth_int": lambda: torch.linalg.matrix_sqrth(torch.ones(2, 2, dtype=torch.long))}.items():
    try:
        call()
    except Exception as e:
        errors[name] = [c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins"][0]
out["errors"] = errors
print(json.dumps(out))
"""


def _error_type(call: Callable[[], object]) -> str | None:
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the type is what the test compares
        return [c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins"][0]
    return None


def test_native_214_provides_polar_and_matrix_sqrth() -> None:
    for name in NAMES:
        assert hasattr(torch.linalg, name), f"torch {torch.__version__} lacks linalg.{name}"
        assert not getattr(torch.linalg, name).__module__.startswith("torchnext")
    info = backport.report()
    for name in NAMES:
        assert f"torch.linalg.{name}" in info["native"]
        assert f"torch.linalg.{name}" not in info["would_install"]


def test_linalg_names_agree_with_native(run_on_torch213: Callable[[str], Any]) -> None:
    ours = run_on_torch213(PROGRAM)
    # 2.13 lacks both names; the backport provides both, from torchnext.linalg.
    assert ours["had"] == {"polar": False, "matrix_sqrth": False}
    for name in NAMES:
        key = f"torch.linalg.{name}"
        assert key in ours["installed"], key
        assert key not in ours["native"] and key not in ours["unavailable"], key
        assert str(ours["modules"][name]).startswith("torchnext.linalg"), ours["modules"]

    torch.manual_seed(0)
    A = torch.randn(5, 3, dtype=torch.double)
    U, H = torch.linalg.polar(A)
    S = A.mT @ A + torch.eye(3, dtype=torch.double)
    torch.testing.assert_close(torch.tensor(ours["polar"][0], dtype=torch.double), U)
    torch.testing.assert_close(torch.tensor(ours["polar"][1], dtype=torch.double), H)
    torch.testing.assert_close(
        torch.tensor(ours["sqrth"], dtype=torch.double), torch.linalg.matrix_sqrth(S)
    )
    native_errors = {
        "polar_wide": _error_type(lambda: torch.linalg.polar(torch.randn(3, 5))),
        "sqrth_int": _error_type(
            lambda: torch.linalg.matrix_sqrth(torch.ones(2, 2, dtype=torch.long))
        ),
    }
    assert native_errors == {"polar_wide": "RuntimeError", "sqrth_int": "RuntimeError"}
    assert ours["errors"] == native_errors
