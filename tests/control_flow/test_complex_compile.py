"""complex_compile: complex inputs/intermediates/outputs under Inductor; clear op errors."""

from __future__ import annotations

import pytest
import torch

from torchnext.control_flow import complex_compile
from torchnext.errors import UnsupportedComplexOpError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Inductor's imports


def _common_ops(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    c = (a * b + a.conj()).exp() - b / (a.abs() + 1)
    m = a @ b
    spectrum = torch.fft.fft(c, norm="ortho")
    return c, m.abs() + m.angle(), torch.view_as_real(m), torch.fft.ifft2(spectrum)


@pytest.mark.slow  # one Inductor compile of a dozen complex ops: ~5-20 s on 2 cores
def test_common_ops_with_complex_outputs_match_eager() -> None:
    torch._dynamo.reset()
    a = torch.randn(6, 6, dtype=torch.complex64)
    b = torch.randn(6, 6, dtype=torch.complex64)
    got = complex_compile(_common_ops, fullgraph=True)(a, b)
    want = _common_ops(a, b)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_view_as_complex_of_real_input_and_real_output() -> None:
    torch._dynamo.reset()

    @complex_compile(fullgraph=True)
    def f(xr: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(xr)
        return (z * z.conj()).real

    xr = torch.randn(5, 2)
    torch.testing.assert_close(f(xr), torch.view_as_complex(xr).abs() ** 2, rtol=1e-5, atol=1e-5)


def test_unsupported_op_names_the_op() -> None:
    torch._dynamo.reset()
    a = torch.randn(3, 3, dtype=torch.complex64)
    with pytest.raises(UnsupportedComplexOpError, match="linalg_eig") as info:
        complex_compile(lambda a: torch.linalg.eigvals(a))(a)
    assert isinstance(info.value, NotImplementedError)


def test_rejects_non_callable() -> None:
    with pytest.raises(TypeError, match="must be callable"):
        complex_compile(3)  # type: ignore[arg-type]
