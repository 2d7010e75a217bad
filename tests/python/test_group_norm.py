"""Group normalization on the device's kernel (``neuron.group_norm``,
passes/tile/LowerGroupNorm.cpp): golden checks against float64 over the shapes its steps tell
apart, a training step, and its modeled time and HBM traffic, which the decomposition's float32
copies of the input through HBM would fail."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import torchneuron
from torchneuron._native import native

F32 = torch.float32
BF16 = torch.bfloat16

# (N, C, spatial, groups): what the kernel's steps distinguish.
SHAPES = [
    # Stable Diffusion's UNet: 10 channels a group, 12 groups (120 rows) a step, three
    # steps an image, the last of 8 groups.
    (2, 320, (16, 16), 32),
    # One group of all channels (GroupNorm(1, C)), 1-D positions.
    (2, 64, (5,), 1),
    # Three channels a group: 42 groups (126 rows) a step; 3-D positions; no positions.
    (3, 96, (7, 9), 32),
    (2, 128, (3, 3, 3), 4),
    (4, 6, (), 3),
    # 128 channels a group, one a step; several images through the loop.
    (5, 256, (4, 4), 2),
    # Rows longer than the row tiles: in chunks, statistics then normalization.
    (1, 12, (200, 150), 3),
    # More than 128 channels a group: PyTorch's decomposition.
    (2, 256, (4, 4), 1),
]


def _modeled(fn: Any, *args: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """fn compiled and run once: its result, modeled device time and HBM bytes."""
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        out = torch.compile(fn, backend="neuron")(*args)
    return out, prof.total_device_ns, sum(k["hbm_bytes"] for k in prof.kernels)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}g{s[3]}")
def test_group_norm_matches_eager(shape: tuple[Any, ...], dtype: torch.dtype, affine: bool) -> None:
    n, c, spatial, groups = shape
    torch.manual_seed(0)
    norm = nn.GroupNorm(groups, c, affine=affine).to(dtype)
    if affine:
        with torch.no_grad():
            norm.weight.normal_()
            norm.bias.normal_()
    # An offset larger than the spread: the variance must not cancel.
    x = (torch.randn(n, c, *spatial) * 3 + 20).to(dtype)
    before = torchneuron.stats()["kernels_run"]
    with torch.no_grad():
        got, _, _ = _modeled(norm, x)
    assert torchneuron.stats()["kernels_run"] > before
    weight = norm.weight.double() if affine else None
    bias = norm.bias.double() if affine else None
    want = F.group_norm(x.double(), groups, weight, bias, norm.eps)
    # Statistics in float32, the result rounded once.
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == F32 else dict(atol=3e-2, rtol=8e-3)
    torch.testing.assert_close(got.double(), want, **tol)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_group_norm_then_silu_matches_eager(dtype: torch.dtype) -> None:
    # A UNet's GroupNorm then SiLU folds into the group norm's pass (silu of the fp32
    # normalized value, rounded once); with the normalized value read again too (a
    # residual) it stays two passes.
    torch.manual_seed(0)
    norm = nn.GroupNorm(8, 64).to(dtype)
    x = torch.randn(2, 64, 12, 12, dtype=dtype)

    def block(norm: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = norm(x)
        return F.silu(norm(x * 2)), F.silu(y) + y

    reference = copy.deepcopy(norm).double()
    with torch.no_grad():
        (folded, kept), _, _ = _modeled(lambda x: block(norm, x), x)
        want = block(reference, x.double())
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == F32 else dict(atol=3e-2, rtol=8e-3)
    torch.testing.assert_close(folded.double(), want[0], **tol)
    torch.testing.assert_close(kept.double(), want[1], **tol)


def test_group_norm_trains_like_eager() -> None:
    # The forward kernel's mean and rstd feed the backward (PyTorch's decomposition of
    # native_group_norm_backward); a UNet ResBlock's conv, GroupNorm and SiLU.
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.SiLU())
    eager = copy.deepcopy(block)
    x = torch.randn(2, 64, 16, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    before = sum(torchneuron.stats()["ops_fallback"].values())
    torch._dynamo.reset()
    torch.compile(block, backend="neuron")(x).square().sum().backward()
    eager(x2).square().sum().backward()
    assert sum(torchneuron.stats()["ops_fallback"].values()) == before
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-4, rtol=1e-4)
    for p, q in zip(block.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize(
    "make, shape, share",
    [
        # Stable Diffusion's GroupNorm(32, 320) over [2, 320, 64, 64] bf16: decomposed,
        # 433 us (6.7% of its roofline, 6x the bytes: float32 copies of the input through
        # HBM); now 47.5 us.
        (lambda: nn.GroupNorm(32, 320), (2, 320, 64, 64), 0.5),
        # GroupNorm(32, 640) then SiLU over [2, 640, 32, 32]: decomposed, 226.7 us; the SiLU
        # a pass of its own after the kernel, 2x the bytes (55.4 us); now 32.0 us.
        (lambda: nn.Sequential(nn.GroupNorm(32, 640), nn.SiLU()), (2, 640, 32, 32), 0.35),
    ],
    ids=["unet-64", "unet-32-silu"],
)
def test_group_norm_reads_its_input_once(make: Any, shape: tuple[int, ...], share: float) -> None:
    torch.manual_seed(0)
    block = make().to(BF16)
    x = torch.randn(*shape, dtype=BF16)
    with torch.no_grad():
        out, ns, hbm = _modeled(block, x)
        want = block(x)
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=1.6e-2)
    minimum = 2 * x.numel() * x.element_size()
    assert hbm <= 1.02 * minimum, (hbm, minimum)
    roofline = 1e9 * minimum / native().target_peaks("trn2")["hbm_bytes"]
    assert roofline / ns >= share, roofline / ns
