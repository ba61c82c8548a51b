"""Bad input: every public function names the argument and, for batches, the index."""

from __future__ import annotations

import pytest
import torch

import torchnext.linalg as tl
from torchnext.errors import LinAlgInputError, NotPositiveDefiniteError

SQUARE_FNS = {
    "eigh": lambda a: tl.eigh(a),
    "cholesky": lambda a: tl.cholesky(a),
    "matrix_sqrth": lambda a: tl.matrix_sqrth(a),
}
ANY_FNS = {
    "svd": lambda a: tl.svd(a),
    "qr": lambda a: tl.qr(a),
    "polar": lambda a: tl.polar(a),
}


@pytest.mark.parametrize("name", [*SQUARE_FNS, *ANY_FNS])
def test_fewer_than_two_dims(name: str) -> None:
    fn = {**SQUARE_FNS, **ANY_FNS}[name]
    with pytest.raises(RuntimeError, match="The input tensor A must have at least 2 dimensions"):
        fn(torch.randn(3))


@pytest.mark.parametrize("name", list(SQUARE_FNS))
def test_non_square(name: str) -> None:
    with pytest.raises(
        RuntimeError, match="A must be batches of square matrices, but they are 3 by 4"
    ):
        SQUARE_FNS[name](torch.randn(2, 3, 4))


@pytest.mark.parametrize("name", [*SQUARE_FNS, *ANY_FNS])
def test_integer_dtype(name: str) -> None:
    fn = {**SQUARE_FNS, **ANY_FNS}[name]
    with pytest.raises(
        RuntimeError, match="Expected a floating point or complex tensor as input. Got Long"
    ):
        fn(torch.ones(3, 3, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(dtype: torch.dtype) -> None:
    with pytest.raises(RuntimeError, match="Low precision dtypes not supported"):
        tl.matrix_sqrth(torch.eye(3, dtype=dtype))
    with pytest.raises(RuntimeError, match="Low precision dtypes not supported"):
        tl.eigh(torch.eye(3, dtype=dtype))
    with pytest.raises(NotImplementedError, match="linalg_svd_cpu"):
        tl.polar(torch.eye(3, dtype=dtype))


def test_non_finite_polar_names_batch_index() -> None:
    A = torch.randn(2, 3, 4, 4)
    A[1, 2, 0, 0] = float("inf")
    with pytest.raises(LinAlgInputError, match="argument 'A'.*batch index 5") as err:
        tl.polar(A)
    assert err.value.batch_index == 5


def test_not_positive_definite_is_a_value_error_with_index() -> None:
    A = torch.eye(3).repeat(4, 1, 1)
    A[2, 1, 1] = -1
    with pytest.raises(ValueError, match="batch index 2"):
        tl.cholesky(A)
    with pytest.raises(NotPositiveDefiniteError):
        tl.matrix_sqrth(A, check_pd=True)


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="side"):
        tl.polar(torch.eye(2), side="top")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method"):
        tl.polar(torch.eye(2), method="magic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method"):
        tl.eigh(torch.eye(2), method="magic")
    with pytest.raises(RuntimeError, match="UPLO"):
        tl.eigh(torch.eye(2), UPLO="X")
    with pytest.raises(RuntimeError, match="unrecognized mode"):
        tl.qr(torch.eye(2), mode="full")
