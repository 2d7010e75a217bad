"""A Linear's bias and the activation after it applied as the matmul's sums leave PSUM
(``neuron.matmul`` with ``bias`` and ``epilogue``, folded in by canonicalization): golden
checks against eager PyTorch and the HBM bytes (no pass of their own over the result)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron


def profiled(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Any, Any]:
    torch._dynamo.reset()
    with torch.no_grad(), torchneuron.profile() as prof:
        out = torch.compile(fn, backend="neuron")(*args)
    return out, prof


def moved_bytes(prof: Any) -> float:
    return sum(k["hbm_bytes"] for k in prof.kernels)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda y: y,
    "gelu": F.gelu,  # BERT's, ViT's
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),  # GPT-2's gelu_new
    "relu": torch.relu,
    "silu": F.silu,  # written x * sigmoid(x) on the widened sums, cast back
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matches_eager(act: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(96, 200).to(dtype)
    x = torch.randn(2, 150, 96, generator=g).to(dtype)  # [B, S, K]: rows through a reshape

    def fn(x: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[act](lin(x))

    got, prof = profiled(fn, x)
    with torch.no_grad():
        want = fn(x)
    # bf16: eager rounds the sums before the activation, the epilogue after it (within an ulp)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(got, want, **tol)
    # The bytes of the matmul alone, and the bias broadcast over the partitions once (128
    # copies): a pass of its own over the result read and wrote it again.
    _, bare = profiled(lambda x: F.linear(x, lin.weight), x)
    extra = moved_bytes(prof) - moved_bytes(bare)
    assert extra <= 128 * lin.bias.numel() * x.element_size(), extra / want.numel()
    assert torchneuron.stats()["ops_fallback"] == {}


def test_bert_mlp_up_projection() -> None:
    # [4096, 768] x [768, 3072] + bias, GELU (BERT-base's intermediate layer), bf16: the bias
    # add and GELU were a pass of their own over the 25 MB result (398.7 us modeled, trn2);
    # applied on the eviction: 260.6 us, the matmul alone 254.4 us (283.2 us while each block
    # loaded the bias broadcast from HBM).
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(768, 3072).bfloat16()
    x = torch.randn(4096, 768, generator=g).bfloat16()
    got, prof = profiled(lambda x: F.gelu(lin(x)), x)
    with torch.no_grad():
        torch.testing.assert_close(got, F.gelu(lin(x)), atol=2e-2, rtol=2e-2)
    _, bare = profiled(lambda x: F.linear(x, lin.weight), x)
    assert prof.total_device_ns <= 1.05 * bare.total_device_ns, (
        prof.total_device_ns,
        bare.total_device_ns,
    )


def test_sums_read_elsewhere_keep_their_pass() -> None:
    # The sums also returned (as a training forward saves them): the bias and activation
    # stay elementwise, the sums stored as they are.
    lin = nn.Linear(64, 32)
    x = torch.randn(8, 64)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ lin.weight.t()
        return y, torch.relu(y + lin.bias)

    got, _ = profiled(fn, x)
    with torch.no_grad():
        for a, b in zip(got, fn(x), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_training_gradients() -> None:
    # Training keeps the sums for the backward (GELU's derivative reads them): results and
    # gradients as eager's.
    torch.manual_seed(0)
    lin, ref = nn.Linear(48, 40), nn.Linear(48, 40)
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(16, 48)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    torch._dynamo.reset()
    torch.compile(lambda x: F.gelu(lin(x)), backend="neuron")(xs[0]).square().sum().backward()
    F.gelu(ref(xs[1])).square().sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, atol=1e-4, rtol=1e-4)
    for p, q in zip(lin.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pointwise_convolution_batchnorm_relu6(dtype: torch.dtype) -> None:
    # MobileNetV2's pointwise convolution: a batched matmul with the channels as its rows,
    # then BatchNorm (eval) and ReLU6, each a pass of its own over the result (224.4 us and
    # 23.2 MB for [8, 24, 56, 56] -> 144 channels, bf16, modeled; float32 340.2 us, 46.1 MB);
    # the BatchNorm is the matmul's row scale and shift, ReLU6 its relu and clamp: 160.7 us,
    # 8.7 MB (float32 276.5 us, 17.2 MB).
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(24, 144, 1, bias=False), nn.BatchNorm2d(144), nn.ReLU6())
    with torch.no_grad():
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.uniform_(-1, 1)
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
    m = m.eval().to(dtype)
    x = torch.randn(4, 24, 20, 20, generator=torch.Generator().manual_seed(1)).to(dtype)
    got, prof = profiled(m, x)
    with torch.no_grad():
        want = m(x)
    tol = {"atol": 4e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(got, want, **tol)
    # Each pass of its own read and wrote the result again (2.8x the least bytes; 1.5x now,
    # the GEMM's own excess at this size).
    least = (x.numel() + want.numel() + m[0].weight.numel()) * x.element_size()
    assert moved_bytes(prof) <= 1.6 * least, moved_bytes(prof) / least


@pytest.mark.parametrize(
    "act",
    [nn.ReLU6(), nn.Hardtanh(0.0, 3.0), nn.Hardtanh(-1.0, 1.0)],
    ids=["relu6", "hardtanh-0-3", "hardtanh-1-1"],
)
def test_linear_clamps(act: nn.Module) -> None:
    # ReLU6 and clamp(0, c) after a Linear are its epilogue's relu and clamp; a clamp whose
    # lower bound is not 0 keeps its own pass (and eager's numbers either way).
    lin = nn.Linear(64, 48)
    x = torch.randn(40, 64) * 4
    got, _ = profiled(lambda x: act(lin(x)), x)
    with torch.no_grad():
        torch.testing.assert_close(got, act(lin(x)), atol=1e-5, rtol=1e-5)


class ConvNeXtMlp(nn.Module):
    """ConvNeXt's block after its depthwise convolution and norm: channels-last Linears
    between permutes (torchvision's; Transformers' with a per-channel layer scale)."""

    def __init__(self, dim: int, layer_scale: bool) -> None:
        super().__init__()
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim)) if layer_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pwconv2(F.gelu(self.pwconv1(x.permute(0, 2, 3, 1))))
        if self.gamma is not None:
            y = self.gamma * y
        return x + y.permute(0, 3, 1, 2)


@pytest.mark.parametrize("layer_scale", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_convnext_linears_run_channels_first(layer_scale: bool, dtype: torch.dtype) -> None:
    # The Linears become channels-first pointwise matmuls (each image's [C, H * W]), so the
    # permutes cancel: the bytes are x read by the first matmul and by the residual add,
    # the hidden [B, 4C, H, W] and the second matmul's result each written and read once,
    # the output and the weights (the second Linear's result went through a transposing
    # pass of its own before: 1.38x these, 1.54x with the scale; a torchvision ConvNeXt-T
    # block at 56 x 56, batch 2, bf16: 306.2 -> 241.9 us).
    g = torch.Generator().manual_seed(0)
    mlp = ConvNeXtMlp(32, layer_scale).to(dtype)
    x = torch.randn(2, 32, 24, 24, generator=g).to(dtype)
    got, prof = profiled(mlp, x)
    with torch.no_grad():
        want = mlp(x)
    tol = {"atol": 3e-2, "rtol": 3e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(got, want, **tol)
    hidden = 2 * 4 * 32 * 24 * 24
    weights = sum(p.numel() for p in mlp.parameters())
    least = (5 * x.numel() + 2 * hidden + weights) * x.element_size()
    assert moved_bytes(prof) <= 1.08 * least, moved_bytes(prof) / least
    assert torchneuron.stats()["ops_fallback"] == {}
