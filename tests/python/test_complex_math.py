"""Complex tensors as float32 pairs and FFTs as DFT matmuls (torchneuron/complex_math.py),
against eager PyTorch: every torch.fft function, complex inputs and results, and the ops a
graph with complex values keeps eager (counted) when one of them is not handled."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch

import torchneuron
from torchneuron import complex_math

X = (5, 6, 7)
CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "fft_padded_ortho": lambda x: torch.fft.fft(x, n=10, dim=1, norm="ortho"),
    "fft2_cropped_padded": lambda x: torch.fft.fft2(x, s=(3, 10), dim=(1, 2)),
    "ifftn_forward_norm": lambda x: torch.fft.ifftn(x, dim=(0, 2), norm="forward"),
    "rfft": lambda x: torch.fft.rfft(x),
    "rfftn": lambda x: torch.fft.rfftn(x, s=(3, 10), dim=(1, 2), norm="ortho"),
    "irfft_odd_length": lambda x: torch.fft.irfft(x, n=9, dim=1),
    "irfft2": lambda x: torch.fft.irfft2(x, s=(3, 10), dim=(1, 2), norm="ortho"),
    "hfft": lambda x: torch.fft.hfft(x, n=10, dim=1),
    "ihfft2": lambda x: torch.fft.ihfft2(x, s=(3, 10), dim=(1, 2), norm="ortho"),
    "power_spectrum": lambda x: torch.fft.rfft(x, dim=-1).abs().square(),
    "phase": lambda x: torch.fft.fft(x).angle(),
    "convolution_by_fft": lambda x: torch.fft.irfft(
        torch.fft.rfft(x) * torch.fft.rfft(x.flip(-1)), n=x.shape[-1]
    ),
    "stft": lambda x: torch.stft(x.flatten()[:100], n_fft=10, return_complex=True),
    "complex_polar": lambda x: torch.complex(x, 2 * x) - torch.polar(x.abs(), x),
    "view_as_complex": lambda x: torch.view_as_complex(
        x[..., :6].contiguous().unflatten(-1, (3, 2))
    ),
    "cfloat_real": lambda x: x.cfloat().real * 3,
}


def _fallbacks(before: dict[str, int]) -> dict[str, int]:
    after = torchneuron.stats()["ops_fallback"]
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _compiled(
    fn: Callable[..., torch.Tensor], *args: torch.Tensor
) -> tuple[torch.Tensor, dict[str, int]]:
    torch._dynamo.reset()
    before = dict(torchneuron.stats()["ops_fallback"])
    got = torch.compile(fn, backend="neuron", options={"cache": False})(*args)
    return got, _fallbacks(before)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_fully_on_the_device(name: str, real_native: ModuleType) -> None:
    torch.manual_seed(0)
    x = torch.randn(*X)
    got, fallbacks = _compiled(CASES[name], x)
    assert fallbacks == {}
    torch.testing.assert_close(got, CASES[name](x), atol=1e-4, rtol=1e-4)


def test_complex_inputs_and_results(real_native: ModuleType) -> None:
    """A complex input enters as its float pairs, a complex result leaves as one."""

    def fn(z: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.fft.ifft(z * w.conj()), (z + w).abs()

    z, w = torch.randn(4, 8, dtype=torch.complex64), torch.randn(4, 8, dtype=torch.complex64)
    got, fallbacks = _compiled(fn, z, w)
    assert fallbacks == {}
    assert got[0].dtype == torch.complex64
    torch.testing.assert_close(got, fn(z, w), atol=1e-4, rtol=1e-4)


def test_an_unhandled_complex_op_keeps_the_complex_ops_eager_counted(
    real_native: ModuleType,
) -> None:
    z = torch.randn(3, 4, dtype=torch.complex64)
    got, fallbacks = _compiled(lambda z: torch.exp(z) + z, z)
    torch.testing.assert_close(got, torch.exp(z) + z)
    assert fallbacks == {"aten.exp.default": 1, "aten.add.Tensor": 1}


def test_transforms_longer_than_a_dft_matmul_stay_eager_counted(real_native: ModuleType) -> None:
    x = torch.randn(complex_math.MAX_POINTS + 2)
    got, fallbacks = _compiled(torch.fft.rfft, x)
    torch.testing.assert_close(got, torch.fft.rfft(x), atol=1e-3, rtol=1e-3)
    assert fallbacks == {"aten._fft_r2c.default": 1}
