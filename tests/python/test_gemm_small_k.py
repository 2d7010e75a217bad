"""GEMMs of a small K (up to four K steps) over several N groups, as pointwise convolutions
and narrow Linears give: each N group's B tiles load during the group before
(``GemmLowering``'s ``bAhead``); and GEMMs of a small B over many rows, B loaded once
(``residentB``). Golden checks against eager PyTorch, modeled times and HBM bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchneuron


def compiled(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[torch.Tensor, Any]:
    torch._dynamo.reset()
    with torch.no_grad(), torchneuron.profile() as prof:
        out = torch.compile(fn, backend="neuron", options={"target": "trn2"})(*args)
    assert torchneuron.stats()["ops_fallback"] == {}
    return out, prof


# (M, K, N, B as a Linear's weight: read transposed). Small K: one K step (a partial one),
# one and a partial, three, four; N groups of 2048 columns with and without a remainder
# group; M of one and of several tiles. Small B over more rows than an M block: all of B
# stays in SBUF.
SHAPES = [
    (300, 96, 4100, False),
    (128, 200, 2500, False),
    (512, 384, 4160, False),
    (130, 512, 6144, False),
    (64, 128, 2049, False),
    (6272, 96, 384, True),
    (3000, 200, 300, True),
    (2048, 1024, 128, True),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul(shape: tuple[int, int, int, bool], dtype: torch.dtype) -> None:
    m, k, n, linear = shape
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(*((n, k) if linear else (k, n)), generator=g).to(dtype)
    out, _ = compiled(lambda a: F.linear(a, b) if linear else a @ b, a)
    want = a.double() @ (b.double().t() if linear else b.double())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), want, atol=tol * k**0.5, rtol=tol)


@pytest.mark.parametrize("act", [F.relu6, F.gelu, F.silu])
def test_pointwise_convolution_with_bias(act: Callable[[torch.Tensor], torch.Tensor]) -> None:
    # The convolution's bias (added to the batched matmul's [N, O, H * W]) and the
    # activation are the matmul's row shift and epilogue: no pass of their own over the
    # result (93.8 us for 96 -> 384 with GELU before, 39.4 now; bytes 2.6x the minimum).
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 24, 56, 56, generator=g).bfloat16()
    w = torch.randn(144, 24, 1, 1, generator=g).bfloat16()
    b = torch.randn(144, generator=g).bfloat16()
    out, prof = compiled(lambda x: act(F.conv2d(x, w, b)), x)
    want = act(F.conv2d(x.float(), w.float(), b.float()))
    torch.testing.assert_close(out.float(), want, atol=5e-2, rtol=2e-2)
    least = 2 * (x.numel() + w.numel() + b.numel() + out.numel())
    assert sum(k["hbm_bytes"] for k in prof.kernels) <= 1.1 * least


def test_pointwise_convolution_keeps_the_dma_busy() -> None:
    # ConvNeXt's first MLP as a pointwise convolution, 96 -> 384 over [2, 96, 56, 56] bf16:
    # one (partial) K step per N group of 2048 positions. Its B tile loaded after the group
    # before had stored its outputs, so load, matmuls, evictions and stores took turns:
    # 65.1 us. Loaded a group ahead: 36.7 us (the HBM bytes, 6 MB, take 16.4 us).
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 96, 56, 56, generator=g).bfloat16()
    w = torch.randn(384, 96, 1, 1, generator=g).bfloat16()
    out, prof = compiled(lambda x: F.conv2d(x, w), x)
    assert prof.total_device_ns <= 45_000, prof.total_device_ns
    torch.testing.assert_close(out.float(), F.conv2d(x.float(), w.float()), atol=5e-2, rtol=2e-2)


def test_small_b_is_read_once() -> None:
    # [4096, 4096] x [4096, 128] bf16: B (1 MiB) was streamed again for every M block, 1.21x
    # the minimum bytes, each block's B loads behind the block before's stores (201.2 us);
    # resident, read once: the minimum bytes, 154.4 us.
    g = torch.Generator().manual_seed(4)
    a = torch.randn(4096, 4096, generator=g).bfloat16()
    b = torch.randn(4096, 128, generator=g).bfloat16()
    out, prof = compiled(lambda a, b: a @ b, a, b)
    least = 2 * (a.numel() + b.numel() + out.numel())
    assert sum(k["hbm_bytes"] for k in prof.kernels) <= 1.01 * least
    assert prof.total_device_ns <= 170_000, prof.total_device_ns
    torch.testing.assert_close(out.float(), a.float() @ b.float(), atol=0.5, rtol=2e-2)
