"""LayerNorm over the channels of a channels-first tensor (ConvNeXt's LayerNorm2d) as one
kernel, ``neuron.channel_norm`` (torchneuron.norms, and the written-out moments canonicalization
recognizes): golden checks against eager PyTorch, the forms models write, gradients, and the
HBM bytes and time of ConvNeXt's first stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron
from torchneuron._native import native


class LayerNorm2d(nn.LayerNorm):
    """torchvision's and timm's: the channels-last view normalized, permuted back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


def norm(channels: int, dtype: torch.dtype, affine: bool = True, bias: bool = True) -> nn.Module:
    m = LayerNorm2d(channels, eps=1e-6, elementwise_affine=affine, bias=bias)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(generator=torch.Generator().manual_seed(2))
    return m.to(dtype)


def profiled(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Any, Any]:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron")
    with torch.no_grad(), torchneuron.profile() as prof:
        out = compiled(*args)
    return out, prof


def moved_bytes(prof: Any) -> float:
    return sum(k["hbm_bytes"] for k in prof.kernels)


# bf16 results within a rounding of eager's (the squared deviations are summed from bf16, so
# an output can round the other way); float32 to a few ulps.
TOL = {
    torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2},
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
}


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((2, 96, 14, 14), torch.bfloat16),  # ConvNeXt-T's stem width, one channel tile
        ((2, 192, 7, 9), torch.bfloat16),  # two tiles, the second of 64
        ((1, 771, 3, 5), torch.bfloat16),  # neither C nor C - 1 exact in bf16: -J, 768 I, 3 I
        ((2, 257, 6, 6), torch.float32),
        ((2, 100, 5, 7), torch.float16),
        ((3, 3, 4, 4), torch.bfloat16),
        ((1, 64, 1, 300), torch.float32),
    ],
)
def test_matches_eager(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g) * 3 + 1.5).to(dtype)
    m = norm(shape[1], dtype)
    got, prof = profiled(m, x)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), **TOL[dtype])
    # One read of x and one write: the decomposition read a transposed float32 copy.
    least = 2 * x.numel() * x.element_size() + 2 * shape[1] * x.element_size()
    assert moved_bytes(prof) <= 1.05 * least, moved_bytes(prof) / least
    assert torchneuron.stats()["ops_fallback"] == {}


@pytest.mark.parametrize("case", ["no-affine", "no-bias", "nn.LayerNorm", "1d", "timm-eps"])
def test_forms(case: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 48, 10, 12, generator=g)
    fn: Callable[[torch.Tensor], torch.Tensor]
    if case == "no-affine":
        fn = norm(48, torch.float32, affine=False)
    elif case == "no-bias":
        fn = norm(48, torch.float32, bias=False)
    elif case == "nn.LayerNorm":  # a LayerNorm module applied to the permuted view
        ln = nn.LayerNorm(48)

        def fn(x: torch.Tensor) -> torch.Tensor:
            return ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    elif case == "1d":  # [N, C, L] (a 1-d convolution's), transposed around the norm
        x = torch.randn(4, 80, 33, generator=g)
        ln = nn.LayerNorm(80)

        def fn(x: torch.Tensor) -> torch.Tensor:
            return ln(x.transpose(1, 2)).transpose(1, 2)

    else:  # the norm's result kept channels-last, as the ConvNeXt block's Linear reads it

        def fn(x: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(x.permute(0, 2, 3, 1), (48,), eps=1e-6) * 2.0

    got, prof = profiled(fn, x)
    with torch.no_grad():
        torch.testing.assert_close(got, fn(x), **TOL[torch.float32])
    if case != "timm-eps":  # whose channels-last result is a transposing copy of the norm's
        assert moved_bytes(prof) <= 1.1 * 2 * x.numel() * 4 + 1024, moved_bytes(prof) / x.numel()


class ChannelsFirstLayerNorm(nn.Module):
    """ConvNeXt's reference code's (Transformers' ConvNextLayerNorm and SAM's LayerNorm2d
    copy it): the moments over dim 1 written out."""

    def __init__(self, channels: int, form: str) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.weight = nn.Parameter(torch.randn(channels, generator=g))
        self.bias = nn.Parameter(torch.randn(channels, generator=g))
        self.form = form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.form == "upcast":  # Transformers' later versions
            x = x.float()
        u = x.mean(1, keepdim=True)
        if self.form == "var":
            s = x.var(dim=1, keepdim=True, unbiased=False)
        else:
            s = (x - u).pow(2).mean(1, keepdim=True)
        if self.form == "rsqrt":
            x = (x - u) * torch.rsqrt(s + 1e-6)
        else:
            x = (x - u) / torch.sqrt(s + 1e-6)
        x = x.to(dtype)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


@pytest.mark.parametrize("form", ["reference", "upcast", "var", "rsqrt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_written_out_forms(form: str, dtype: torch.dtype) -> None:
    # Decomposed, each mean over dim 1 read a transposed copy through HBM: 15x the bytes.
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 64, 9, 10, generator=g) * 2 + 1).to(dtype)
    m = ChannelsFirstLayerNorm(64, form).to(dtype)
    got, prof = profiled(m, x)
    with torch.no_grad():
        # bf16: against the same math in float32 (eager rounds every step to bf16)
        want = m.float()(x.float()).to(dtype)
    torch.testing.assert_close(got, want, **TOL[dtype])
    least = 2 * x.numel() * x.element_size() + 2 * 64 * x.element_size()
    assert moved_bytes(prof) <= 1.05 * least, moved_bytes(prof) / least


def test_other_layer_norms_keep_their_rows() -> None:
    # Channels beyond the kernel's 1024, and a contiguous channels-last tensor (rows already):
    # the decomposition's row norms, still correct.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1100, 2, 3, generator=g)
    m = norm(1100, torch.float32)
    got, _ = profiled(m, x)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), **TOL[torch.float32])
    rows = torch.randn(2, 5, 6, 64, generator=g)
    got, _ = profiled(lambda t: F.layer_norm(t, (64,)), rows)
    torch.testing.assert_close(got, F.layer_norm(rows, (64,)), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients(dtype: torch.dtype) -> None:
    # Training saves the kernel's mean and rstd ([N, 1, H, W] rows) for the backward.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 96, 6, 7, generator=g).to(dtype)
    weights = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
    m, ref = norm(96, dtype), norm(96, dtype)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    torch._dynamo.reset()
    (torch.compile(m, backend="neuron")(xs[0]).float() * weights).sum().backward()
    (ref(xs[1]).float() * weights).sum().backward()
    tol = TOL[dtype] if dtype == torch.float32 else {"atol": 0.15, "rtol": 0.05}
    torch.testing.assert_close(xs[0].grad, xs[1].grad, **tol)
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        # eager's bf16 bias gradient sums in bf16: compared to its float32 sum instead
        want = q.grad if dtype == torch.float32 else None
        if want is not None:
            torch.testing.assert_close(p.grad, want, **tol)
    if dtype == torch.bfloat16:
        exact = LayerNorm2d(96, eps=1e-6)
        exact.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
        xf = x.float().requires_grad_()
        (exact(xf) * weights).sum().backward()
        torch.testing.assert_close(m.weight.grad.float(), exact.weight.grad, atol=0.5, rtol=0.03)
        torch.testing.assert_close(m.bias.grad.float(), exact.bias.grad, atol=0.5, rtol=0.03)


def test_convnext_stage_norm_at_the_roofline() -> None:
    # ConvNeXt's LayerNorm2d over [8, 256, 56, 56] bf16: the decomposition read a transposed
    # float32 copy, 8x the bytes, 885 us (8% of the roofline, modeled, trn2); one kernel with
    # the channels summed on TensorE: 1.00x, 82 us (86%).
    x = torch.randn(8, 256, 56, 56, generator=torch.Generator().manual_seed(0)).bfloat16()
    m = norm(256, torch.bfloat16)
    got, prof = profiled(m, x)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), **TOL[torch.bfloat16])
    least = 2 * x.numel() * 2 + 2 * 256 * 2
    assert moved_bytes(prof) <= 1.01 * least, moved_bytes(prof) / least
    roofline = 1e9 * least / native().target_peaks("trn2")["hbm_bytes"]
    assert roofline / prof.total_device_ns >= 0.75, roofline / prof.total_device_ns


def test_transformers_convnext_matches_eager() -> None:
    # Transformers' ConvNextModel as users load it (random weights, a small config): its
    # ConvNextLayerNorm permutes channels-first tensors around F.layer_norm (the embeddings'
    # and downsampling layers'), its blocks normalize channels-last rows, and its Linears'
    # bias and GELU are the matmuls' epilogue. All on the device.
    from transformers import ConvNextConfig, ConvNextModel

    torch.manual_seed(0)
    config = ConvNextConfig(depths=[1, 1, 1, 1], hidden_sizes=[24, 48, 96, 192])
    model = ConvNextModel(config).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    before = torchneuron.stats()["ops_fallback"]
    with torch.no_grad():
        got = torch.compile(model, backend="neuron")(x)
        want = model(x)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, **TOL[torch.float32])
    torch.testing.assert_close(got.pooler_output, want.pooler_output, **TOL[torch.float32])
    assert torchneuron.stats()["ops_fallback"] == before
