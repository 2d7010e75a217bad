"""Convolutions on TensorE's direct kernel (``neuron.conv2d``, passes/tile/LowerConvolution.cpp):
golden checks against eager over the shapes its layout distinguishes, and its modeled time and
HBM traffic, which im2col's kh x kw copies of the input through HBM would fail."""

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


def _modeled(fn: Any, *args: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """fn compiled and run once: its result, modeled device time and HBM bytes."""
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        out = torch.compile(fn, backend="neuron")(*args)
    return out, prof.total_device_ns, sum(k["hbm_bytes"] for k in prof.kernels)


# (N, C, H, W, O, kernel, stride, padding, dilation): what the layout tells apart.
SHAPES = [
    # 64 channels: two copies of the image on the partitions, two taps a matmul; images
    # of 14 x 14 share a PSUM tile (two of them).
    (2, 64, 14, 14, 64, 3, 1, 1, 1),
    # Stride 2 with C x kh <= 128: kernel rows stacked (33 channels: 99 partitions), each
    # copy holding the rows its kernel row reads; dilation 2, more than one output tile.
    (2, 33, 17, 13, 300, 3, 2, 2, 2),
    # Fewer than 8 channels: each stacked copy a DMA engine's 8 partitions, rows and
    # column shifts (a stem; a patch embedding whose size leaves rows and columns over; a
    # stride-1 RGB layer; columns dilated, padding past the shifts).
    (2, 3, 32, 32, 16, 7, 2, 3, 1),
    (2, 3, 33, 31, 24, 4, 4, 0, 1),
    (1, 4, 17, 19, 7, 3, 3, 2, 2),
    (2, 3, 30, 28, 16, 3, 1, 1, 1),
    (1, 3, 17, 19, 7, (5, 3), 1, (2, 1), (1, 2)),
    (2, 2, 20, 21, 8, 5, 1, 4, 2),
    # A kernel row that reads only padding (image rows 2 on of a 2-row image).
    (1, 4, 2, 5, 3, (6, 1), 2, (3, 0), 1),
    # C and O past one 128-channel tile, neither a multiple of it; stride 2.
    (1, 192, 9, 11, 200, 3, 2, 1, 1),
    (2, 130, 8, 8, 129, 3, 1, 1, 1),
    # Weights too large for SBUF (1280 -> 1024 channels): panels of output tiles in turn.
    (1, 1280, 4, 4, 1024, 3, 1, 1, 1),
    # A 3 x 1 kernel (one tap a row: no copies), asymmetric padding.
    (2, 48, 10, 9, 50, (3, 1), 1, (1, 0), 1),
    # No padding (the image loads straight into its tile), with copies.
    (1, 8, 6, 7, 8, 3, 1, 0, 1),
    # 5 x 5, five images of 7 x 7 sharing a tile (N = 5: a divisor of N).
    (5, 16, 7, 7, 16, 5, 1, 2, 1),
    # Rows longer than a PSUM bank: one row a tile, in chunks (a 1-d convolution as Whisper's
    # encoder starts with, and its strided second one).
    (1, 80, 1, 1200, 384, (1, 3), 1, (0, 1), 1),
    (1, 384, 1, 1200, 384, (1, 3), (1, 2), (0, 1), 1),
    # Images too large for SBUF in float32, in bands of output rows: with copies, two
    # images (the last image's bands end the sequence); strided, 5 x 5; two channel tiles,
    # dilated; row-stacked (3 channels), three images.
    (2, 64, 100, 100, 32, 3, 1, 1, 1),
    (1, 64, 120, 90, 64, 5, 2, 2, 1),
    (1, 130, 70, 70, 20, 3, 1, 2, 2),
    (3, 3, 200, 150, 16, 3, 1, 1, 1),
]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])))
def test_direct_convolution_matches_eager(shape: tuple[Any, ...], dtype: torch.dtype) -> None:
    n, c, h, w, o, kernel, stride, padding, dilation = shape
    kh, kw = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    torch.manual_seed(0)
    x = torch.randn(n, c, h, w, dtype=dtype)
    weight = (torch.randn(o, c, kh, kw) / (c * kh * kw) ** 0.5).to(dtype)
    bias = torch.randn(o, dtype=dtype)

    def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation)

    before = torchneuron.stats()["kernels_run"]
    torch._dynamo.reset()
    got = torch.compile(conv, backend="neuron", fullgraph=True)(x, weight, bias)
    assert torchneuron.stats()["kernels_run"] > before
    # The products are exact and summed in float32, rounded once: the float64 result rounded
    # to the dtype, up to the order of the float32 sums.
    want = conv(x.double(), weight.double(), bias.double())
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == F32 else dict(atol=1e-2, rtol=8e-3)
    torch.testing.assert_close(got.double(), want, **tol)


def test_padding_stays_zero_and_non_finite_values_stay_where_they_are() -> None:
    # The padded border is zeroed once and each image writes only the interior; an infinity
    # or NaN reaches only the outputs whose windows hold it.
    x = torch.randn(3, 64, 9, 9)
    x[0, 5, 0, 0] = float("inf")
    x[2, 7, 8, 8] = float("nan")
    weight = torch.randn(64, 64, 3, 3).abs()
    got = torch.compile(lambda a, b: F.conv2d(a, b, padding=1), backend="neuron")(x, weight)
    want = F.conv2d(x, weight, padding=1)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "shape, share",
    [
        # ResNet's stages (3 x 3, batch 8, bf16): C = 64 uses half the PE array's rows even
        # with two taps a matmul, 128 and more all of them.
        ((8, 64, 56, 56, 64, 1), 0.25),
        ((8, 128, 28, 28, 128, 1), 0.7),
        ((8, 256, 14, 14, 256, 1), 0.55),
        ((8, 128, 56, 56, 128, 2), 0.6),
    ],
    ids=["64@56", "128@28", "256@14", "128@56s2"],
)
def test_direct_convolution_reads_the_input_once_at_a_share_of_the_tensor_peak(
    shape: tuple[int, ...], share: float
) -> None:
    # im2col wrote and read nine shifted copies of the input through HBM in runs of one
    # image row: 1053 us for the first of these (2.2% of the TensorE peak), now 76.7 us.
    n, c, h, w, o, stride = shape
    torch.manual_seed(0)
    conv = nn.Conv2d(c, o, 3, stride=stride, padding=1, bias=False).to(BF16)
    x = torch.randn(n, c, h, w, dtype=BF16)
    with torch.no_grad():
        out, ns, hbm = _modeled(conv, x)
        want = conv(x)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    minimum = sum(t.numel() * t.element_size() for t in (x, conv.weight, out))
    assert hbm <= 1.02 * minimum, (hbm, minimum)
    flops = 2.0 * out.numel() * c * 9
    peak_flops_per_ns = native().target_peaks("trn2")["flops"] / 1e9
    assert flops / peak_flops_per_ns / ns >= share, flops / peak_flops_per_ns / ns


@pytest.mark.parametrize(
    "shape, share",
    [
        # ResNet's stem: 7 x 7, stride 2 over 3 channels (306 us; im2col took 3447 us: 0.7%).
        ((8, 3, 224, 224, 64, 7, 2, 3), 0.06),
        # A ViT's 16 x 16 patch embedding; as a permute and a matmul, 12.2 ms.
        ((8, 3, 224, 224, 768, 16, 16, 0), 0.2),
        # Stable Diffusion's conv_in over its 4 latent channels, stride 1 (im2col: 306 us).
        ((2, 4, 64, 64, 320, 3, 1, 1), 0.035),
        # Its 1280-channel 3 x 3, 29 MB of weights in panels (im2col: 1058 us, 4.5%).
        ((2, 1280, 8, 8, 1280, 3, 1, 1), 0.15),
    ],
    ids=["stem", "patch16", "latent-conv-in", "weight-panels"],
)
def test_input_layers_and_large_weights_take_the_direct_kernel(
    shape: tuple[int, ...], share: float
) -> None:
    n, c, h, w, o, k, stride, padding = shape
    torch.manual_seed(0)
    conv = nn.Conv2d(c, o, k, stride=stride, padding=padding, bias=False).to(BF16)
    x = torch.randn(n, c, h, w, dtype=BF16)
    with torch.no_grad():
        out, ns, _ = _modeled(conv, x)
        want = conv(x)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    flops = 2.0 * out.numel() * c * k * k
    peak_flops_per_ns = native().target_peaks("trn2")["flops"] / 1e9
    assert flops / peak_flops_per_ns / ns >= share, flops / peak_flops_per_ns / ns


@pytest.mark.parametrize(
    "shape, share",
    [
        # Stable Diffusion's VAE decoder, 128 channels at 256 x 256 (bias): four bands of
        # 64 rows (im2col: 2640 us, 9.3% of its roofline; now 277 us, 88%).
        ((1, 128, 256, 256, 128, 3, 1), 0.8),
        # VGG's first layer, 3 channels at 224 x 224, row-stacked: bound by its output's
        # bytes (im2col: 2675 us, 5.5% of its roofline; now 819 us, 18%).
        ((8, 3, 224, 224, 64, 3, 1), 0.15),
    ],
    ids=["vae-128@256", "vgg-conv1"],
)
def test_images_larger_than_sbuf_go_through_in_bands(shape: tuple[int, ...], share: float) -> None:
    n, c, h, w, o, k, padding = shape
    torch.manual_seed(0)
    conv = nn.Conv2d(c, o, k, padding=padding).to(BF16)
    x = torch.randn(n, c, h, w, dtype=BF16)
    with torch.no_grad():
        out, ns, hbm = _modeled(conv, x)
        want = conv(x)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    # The roofline: the FLOPs at the TensorE peak or every tensor moved once at the HBM
    # peak, whichever is longer.
    peaks = native().target_peaks("trn2")
    tensors = (x, conv.weight, conv.bias, out)
    minimum = sum(t.numel() * t.element_size() for t in tensors)
    flops = 2.0 * out.numel() * c * k * k
    roofline = 1e9 * max(flops / peaks["flops"], minimum / peaks["hbm_bytes"])
    assert roofline / ns >= share, roofline / ns
    if c >= 8:  # each band reads its rows and their halo once
        assert hbm <= 1.05 * minimum, (hbm, minimum)


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_conv_batchnorm_relu_leave_psum_together(dtype: torch.dtype, bias: bool) -> None:
    # An eval BatchNorm and a ReLU after a convolution fold into it (scale, bias, relu as
    # the sums leave PSUM, rounded once): the output is written once, not normalized and
    # clamped in passes of their own over it.
    torch.manual_seed(0)
    block = nn.Sequential(
        nn.Conv2d(16, 24, 3, padding=1, bias=bias), nn.BatchNorm2d(24), nn.ReLU()
    ).eval()
    with torch.no_grad():
        block[1].running_mean.normal_()
        block[1].running_var.uniform_(0.5, 2.0)
        block[1].weight.normal_()
        block[1].bias.normal_()
    block = block.to(dtype)
    x = torch.randn(2, 16, 48, 48, dtype=dtype)
    with torch.no_grad():
        got, _, hbm = _modeled(block, x)
        want = copy.deepcopy(block).double()(x.double())
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == F32 else dict(atol=2e-2, rtol=8e-3)
    torch.testing.assert_close(got.double(), want, **tol)
    # The input, weights and output once (2.4x without the fold: the output written, read
    # and written again), plus the per-channel values' small computations.
    minimum = sum(t.numel() * t.element_size() for t in (x, block[0].weight, got))
    assert hbm <= 1.2 * minimum, (hbm, minimum)


def test_resnet_basic_block_trains_like_eager() -> None:
    # torchvision's BasicBlock: the forward convolutions take the direct kernel inside the
    # training graph, their gradients im2col's (convolution_backward).
    class BasicBlock(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(channels)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + x)

    torch.manual_seed(0)
    model = BasicBlock(32)
    reference = copy.deepcopy(model)
    x = torch.randn(2, 32, 12, 12)
    fallbacks = dict(torchneuron.stats()["ops_fallback"])
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="neuron")
    for fn in (compiled, reference):
        fn(x).square().mean().backward()
    assert torchneuron.stats()["ops_fallback"] == fallbacks
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize(
    "kind, shape, kernel, stride, padding, dilation",
    [
        ("max", (2, 64, 20, 20), 3, 2, 1, 1),  # ResNet's stem pooling, smaller
        ("max", (3, 5, 9, 11), 2, 2, 0, 1),
        ("max", (1, 130, 10, 10), 3, 1, 1, 2),  # planes past 128, dilated
        ("max", (4, 7, 7), 3, 2, 1, 1),  # unbatched
        ("avg", (2, 16, 8, 8), 2, 2, 0, 1),
        ("avg", (2, 300, 9, 9), 3, 1, 1, 1),
    ],
)
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_pooling_takes_its_windows_in_sbuf(
    kind: str,
    shape: tuple[int, ...],
    kernel: int,
    stride: int,
    padding: int,
    dilation: int,
    dtype: torch.dtype,
) -> None:
    # Each window offset is one instruction over the planes in SBUF (neuron.pool2d); an
    # infinity or NaN stays in its windows (max pooling propagates NaN, as eager does).
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype)
    x.view(-1)[17] = float("inf")
    if kind == "max":
        x.view(-1)[5] = float("nan")

        def pool(t: torch.Tensor) -> torch.Tensor:
            return F.max_pool2d(t, kernel, stride, padding, dilation)
    else:

        def pool(t: torch.Tensor) -> torch.Tensor:
            return F.avg_pool2d(t, kernel, stride, padding)

    torch._dynamo.reset()
    got = torch.compile(pool, backend="neuron", fullgraph=True)(x)
    want = pool(x)
    torch.testing.assert_close(got, want, equal_nan=True, atol=1e-6, rtol=8e-3)


def test_max_pooling_reads_its_input_once() -> None:
    # ResNet's 3 x 3, stride 2 max-pool over [8, 64, 112, 112]: its -inf padding (a
    # constant_pad_nd before the pooling) folds into the kernel's border, and the nine
    # windows are access patterns of the planes in SBUF. As strided copies through HBM:
    # 1158.6 us and 14x the bytes; at the minimum bytes, 172 us with fp32 partials and a
    # padded copy of each step's planes; 90.5 us with bf16 partials and each tap over the
    # outputs its window position lies inside.
    x = torch.randn(8, 64, 112, 112, dtype=BF16)
    pool = nn.MaxPool2d(3, 2, 1)
    with torch.no_grad():
        out, ns, hbm = _modeled(pool, x)
    assert torch.equal(out, pool(x))
    minimum = (x.numel() + out.numel()) * x.element_size()
    assert hbm <= 1.02 * minimum, (hbm, minimum)
    # VectorE and GpSimd take the windows: ~1.2x a copy of x (2.4x with fp32 partials and
    # the padded copy; the windows as copies: 16x).
    _, copy_ns, _ = _modeled(lambda t: t + 0, x)
    assert ns < 1.5 * copy_ns, (ns, copy_ns)


def test_max_pooling_backward_of_resnets_stem_compiles() -> None:
    # ResNet's stem max-pool trained alone. Its backward's nine selects of one constant each
    # held a tile of it, beyond what the group's plan counted: 'memref.alloc' needed 4096 bytes
    # per partition of SBUF but 67 live tiles already used 208896. One tile a step now; the
    # shares summed by phase: 3929.4 us modeled (65.2 ms placing each share by zero insertion).
    x = torch.randn(8, 64, 112, 112, dtype=BF16, requires_grad=True)
    pool = nn.MaxPool2d(3, 2, 1)
    torch._dynamo.reset()
    out = torch.compile(pool, backend="neuron")(x)
    grad = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, x, grad)
    leaf = x.detach().requires_grad_()
    (eager,) = torch.autograd.grad(pool(leaf), leaf, grad)
    wide = x.detach().float().requires_grad_()
    (exact,) = torch.autograd.grad(pool(wide), wide, grad.float())
    err, eager_err = (got.float() - exact).abs().max(), (eager.float() - exact).abs().max()
    assert err <= eager_err, (err, eager_err)  # summed in fp32, rounded once


# Depthwise (groups = C = O): (N, C, H, W, kernel, stride, padding, dilation).
DEPTHWISE = [
    # ConvNeXt's 7 x 7 (one tap a matmul, a diagonal stationary).
    (2, 96, 14, 14, 7, 1, 3, 1),
    # MobileNet's stride-2 3 x 3 over 144 channels (two channel tiles), with copies of
    # 40 channels' kernel rows stacked (stride 2, 40 x 3 <= 128 partitions), and of 32
    # channels' columns (stride 1).
    (2, 144, 15, 15, 3, 2, 1, 1),
    (1, 40, 12, 12, 3, 2, 1, 1),
    (1, 32, 9, 11, 3, 1, 1, 1),
    # Few channels (a DMA engine's 8 partitions a copy), dilated; 200 channels.
    (2, 5, 10, 10, 3, 1, 2, 2),
    (1, 200, 8, 8, 5, 1, 2, 1),
]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", DEPTHWISE, ids=lambda s: "x".join(map(str, s[:5])))
def test_depthwise_convolution_matches_eager(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    n, c, h, w, k, stride, padding, dilation = shape
    torch.manual_seed(0)
    x = torch.randn(n, c, h, w, dtype=dtype)
    weight = (torch.randn(c, 1, k, k) / k).to(dtype)
    bias = torch.randn(c, dtype=dtype)

    def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups=c)

    torch._dynamo.reset()
    got = torch.compile(conv, backend="neuron", fullgraph=True)(x, weight, bias)
    want = conv(x.double(), weight.double(), bias.double())
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == F32 else dict(atol=1e-2, rtol=8e-3)
    torch.testing.assert_close(got.double(), want, **tol)


def test_depthwise_with_a_channel_multiplier_matches_eager() -> None:
    # Two outputs a channel (groups = C, O = 2C): VectorE's multiply-adds, not the direct
    # kernel.
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 16, 3, padding=1, groups=8)
    x = torch.randn(2, 8, 7, 7)
    with torch.no_grad():
        got, _, _ = _modeled(conv, x)
        want = conv(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_depthwise_convolution_takes_tensor_engine_taps() -> None:
    # ConvNeXt's 7 x 7 depthwise over [8, 96, 56, 56] bf16: VectorE's multiply-adds over
    # shifted windows copied through HBM took 9.66 ms (188x the bytes); each tap is now a
    # matmul by a diagonal stationary over the image held in SBUF (522 us, TensorE-bound:
    # a diagonal uses one PE column in 128).
    torch.manual_seed(0)
    conv = nn.Conv2d(96, 96, 7, padding=3, groups=96).to(BF16)
    x = torch.randn(8, 96, 56, 56, dtype=BF16)
    with torch.no_grad():
        out, ns, hbm = _modeled(conv, x)
        want = conv(x)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    tensors = (x, conv.weight, conv.bias, out)
    minimum = sum(t.numel() * t.element_size() for t in tensors)
    assert hbm <= 1.02 * minimum, (hbm, minimum)
    assert ns <= 700e3, ns


NEAREST = [
    # (input shape, interpolate arguments)
    ((2, 8, 5, 7), dict(scale_factor=2)),  # nn.Upsample(scale_factor=2), a UNet's
    ((2, 8, 5, 7), dict(size=(10, 28))),  # sizes: 2x and 4x
    ((2, 8, 5, 7), dict(scale_factor=(4.0, 2.0), mode="nearest-exact")),
    ((3, 4, 9), dict(scale_factor=8)),  # 1-D
    ((1, 2, 3, 4, 5), dict(scale_factor=2)),  # 3-D volumes
    ((2, 8, 5, 7), dict(scale_factor=3)),  # not a power of two: PyTorch's gather
    ((2, 8, 6, 6), dict(scale_factor=1.5)),
]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, kwargs", NEAREST, ids=lambda v: str(v).replace(" ", ""))
def test_nearest_resizing_matches_eager(
    shape: tuple[int, ...], kwargs: dict[str, Any], dtype: torch.dtype
) -> None:
    # A copy of each input into its block: bit for bit eager's, forward and backward.
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)

    def resize(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, **kwargs) * 2

    torch._dynamo.reset()
    got = torch.compile(resize, backend="neuron")(x)
    want = resize(x)
    assert torch.equal(got, want)
    grad = torch.randn_like(want)
    (got_grad,) = torch.autograd.grad(got, x, grad)
    (want_grad,) = torch.autograd.grad(want, x, grad)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-2 if dtype == BF16 else 1e-6, rtol=0)


def test_nearest_upsampling_copies_blocks_on_chip() -> None:
    # Stable Diffusion's UNet upsampling, 2x over [2, 320, 32, 32]: PyTorch's decomposition
    # gathers each output element by a computed index (235 us, 7.7% of the roofline).
    x = torch.randn(2, 320, 32, 32, dtype=BF16)
    with torch.no_grad():
        out, ns, hbm = _modeled(nn.Upsample(scale_factor=2, mode="nearest"), x)
    assert torch.equal(out, F.interpolate(x, scale_factor=2))
    minimum = (x.numel() + out.numel()) * 2
    roofline = 1e9 * minimum / native().target_peaks("trn2")["hbm_bytes"]
    assert hbm <= 1.02 * minimum, (hbm, minimum)
    assert roofline / ns >= 0.4, roofline / ns


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "most"), [(2, 2, 0, 8), (4, 2, 1, 30)], ids=["k2s2", "k4s2p1"]
)
def test_transposed_convolution_is_one_convolution_of_its_phases(
    kernel: int, stride: int, padding: int, most: float
) -> None:
    # A UNet decoder's or a DCGAN generator's upsampling. Each output position modulo the
    # stride (a phase) takes the kernel positions that reach it: an ordinary correlation of
    # the input with them. The phases are one convolution's output channels, interleaved by
    # one permute. col2im placed each kernel position's share by zero insertion, an element a
    # descriptor: [8, 128, 32, 32] bf16 116.7 us (kernel 2) and 436.6 us (kernel 4), where
    # float32 took 18.6 and 38.8 ms.
    torch.manual_seed(0)
    m = nn.ConvTranspose2d(128, 64, kernel, stride, padding).to(BF16)
    x = torch.randn(8, 128, 32, 32, dtype=BF16)
    with torch.no_grad():
        out, ns, _ = _modeled(m, x)
        want = copy.deepcopy(m).float()(x.float())
        eager = m(x).float()
        _, copy_ns, _ = _modeled(lambda t: t + 0, out)
    err, eager_err = (out.float() - want).abs().max(), (eager - want).abs().max()
    assert err <= 2 * eager_err, (err, eager_err)
    assert ns < most * copy_ns, (ns, copy_ns)
    assert torchneuron.stats()["ops_fallback"] == {}


@pytest.mark.parametrize(
    ("channels", "size", "stride", "most"),
    [(64, 56, 1, 10), (128, 28, 1, 16), (64, 56, 2, None)],
    ids=["64x56", "128x28", "stride2"],
)
def test_weight_gradients_read_channels_last_patches(
    channels: int, size: int, stride: int, most: float | None
) -> None:
    # dW = g x patches^T over images and positions: with each position's (i, j, c) patch a
    # row, the windows concatenate along their channels into the rows TensorE reads. im2col's
    # [C * 9, positions] was stacked and then transposed through HBM: for 64 channels over
    # [8, 64, 56, 56] bf16 964 us, 12.6x the forward's time (632 us now), for 128 over
    # [8, 128, 28, 28] 24x (12.5x).
    torch.manual_seed(0)
    x = torch.randn(8, channels, size, size, dtype=BF16)
    w = torch.randn(channels, channels, 3, 3, dtype=BF16, requires_grad=True)

    def conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, stride=stride, padding=1)

    torch._dynamo.reset()
    compiled = torch.compile(conv, backend="neuron")
    y = compiled(x, w)
    g = torch.randn_like(y)
    with torchneuron.profile() as prof:
        y = compiled(x, w)
        y.backward(g)
    forward_ns, backward_ns = (k["device_ns"] for k in prof.kernels)
    want = torch.nn.grad.conv2d_weight(x.float(), w.shape, g.float(), stride=stride, padding=1)
    err = (w.grad.float() - want).abs().max() / want.abs().max()
    assert err < 1e-2, err
    if most:
        assert backward_ns < most * forward_ns, (backward_ns, forward_ns)
    assert torchneuron.stats()["ops_fallback"] == {}


@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "padding", "dilation"),
    [
        ((2, 16, 13, 11), (3, 3), 1, (2, 2), 2),  # positions over the padded grid, dilated
        ((2, 8, 9, 10), (2, 3), 1, (0, 1), 1),  # rectangular, unpadded rows
        ((3, 5, 6, 17), (5, 1), 1, (2, 0), 1),
        ((2, 6, 15, 14), (3, 3), 2, 1, 1),  # a window of its own per tap
        ((2, 6, 15, 14), (3, 2), (2, 1), (1, 0), (1, 2)),
    ],
    ids=["dilated", "rectangular", "tall", "stride2", "mixed"],
)
def test_weight_gradients_of_any_geometry_match_float64(
    shape: tuple[int, ...], kernel: tuple[int, int], stride: Any, padding: Any, dilation: Any
) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape)
    w = torch.randn(7, shape[1], *kernel, requires_grad=True)

    def conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)

    torch._dynamo.reset()
    y = torch.compile(conv, backend="neuron")(x, w)
    g = torch.randn_like(y)
    y.backward(g)
    want = torch.nn.grad.conv2d_weight(
        x.double(), w.shape, g.double(), stride=stride, padding=padding, dilation=dilation
    )
    torch.testing.assert_close(w.grad.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())


@pytest.mark.parametrize(
    ("op", "shape", "most"),
    [
        ("unfold", (8, 64, 64, 64), 2),  # blocks that tile the input: one permute
        ("fold", (8, 256, 1024), 2),
        ("unfold", (2, 16, 32, 32), None),  # 3 x 3 windows, padding 1: overlapping
        ("fold", (2, 144, 1024), None),
        ("unfold", (2, 8, 33, 31), None),  # stride 2, dilation 2
        ("fold", (2, 72, 240), None),
    ],
    ids=["unfold-tiles", "fold-tiles", "unfold-3x3", "fold-3x3", "unfold-strided", "fold-strided"],
)
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_unfold_and_fold_move_blocks(
    op: str, shape: tuple[int, ...], most: float | None, dtype: torch.dtype
) -> None:
    # nn.Unfold / nn.Fold: core ATen gathered or scattered every element by a computed index
    # ([8, 64, 64, 64] into 2 x 2 blocks: 135.5 us bf16; folded back 622.4 us); now 31.1 us
    # each. An overlapping fold sums the blocks' shares by phase (col2im).
    blocks = {
        (8, 64, 64, 64): dict(kernel_size=2, stride=2),
        (8, 256, 1024): dict(output_size=(64, 64), kernel_size=2, stride=2),
        (2, 16, 32, 32): dict(kernel_size=3, padding=1),
        (2, 144, 1024): dict(output_size=(32, 32), kernel_size=3, padding=1),
        (2, 8, 33, 31): dict(kernel_size=3, dilation=2, stride=2, padding=1),
        (2, 72, 240): dict(output_size=(33, 31), kernel_size=3, dilation=2, stride=2, padding=1),
    }[shape]

    def fn(t: torch.Tensor) -> torch.Tensor:
        return getattr(F, op)(t, **blocks)

    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.no_grad():
        out, ns, _ = _modeled(fn, x)
        _, copy_ns, _ = _modeled(lambda t: t + 0, x)
    exact = fn(x.double())
    err, eager_err = (out.double() - exact).abs().max(), (fn(x).double() - exact).abs().max()
    assert err <= max(eager_err, 1e-6), (err, eager_err)
    assert torchneuron.stats()["ops_fallback"] == {}
    if most is not None:
        assert ns < most * copy_ns, (ns, copy_ns)
