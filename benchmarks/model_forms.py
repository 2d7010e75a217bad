"""Forms as models write them, each against its roofline: the norms, activations and
per-channel math of Hugging Face and torchvision-style code, reductions along a vocabulary's
rows, and vision's convolutions. A form far below its roofline is a cliff users fall off
without knowing.

    .venv/bin/python benchmarks/model_forms.py                  # every form, trn2
    .venv/bin/python benchmarks/model_forms.py --only batchnorm,argmax --target trn3

Each form compiles with ``torch.compile(backend="neuron")``, runs once under the profiler and
prints the modeled device time, the roofline (minimum bytes, every input read once and every
output written once, at the HBM peak; for a convolution the longer of that and its FLOPs at
the TensorE peak), their ratio, the HBM bytes moved against that minimum, the kernel count,
the ops left to eager PyTorch, and the worst error relative to eager PyTorch on the same
values (the process exits 1 if any form is off by more than 5%).
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron
from torchneuron._native import native

BF16 = torch.bfloat16


class GemmaRMSNorm(nn.Module):
    """Gemma's: float32 throughout, ``1 + weight``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class LlamaRMSNorm(nn.Module):
    """Llama's (and Qwen3's q/k norm over a head's 128 values)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LayerNorm2d(nn.LayerNorm):
    """ConvNeXt's channels-first LayerNorm: NCHW permuted to NHWC and back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias)
        return x.permute(0, 3, 1, 2)


class ChannelsFirstLayerNorm(nn.Module):
    """Transformers' ConvNextLayerNorm(data_format="channels_first") (SAM's LayerNorm2d too):
    the moments over dim 1 written out, in float32, then the affine."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = ((x - u) / torch.sqrt(s + self.eps)).to(dtype)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class UpcastLayerNorm(nn.Module):
    """A LayerNorm run in float32 on a bf16 input, cast back."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.float()).type_as(x)


class ResidualNorm(nn.Module):
    """The residual add before a decoder layer's norm: both the sum and its norm out."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(dim)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + r
        return self.norm(h), h


class Normalize(nn.Module):
    """torchvision's transforms.Normalize on a batch of images."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean[None, :, None, None]) / self.std[None, :, None, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's NewGELUActivation."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def batchnorm(channels: int) -> nn.Module:
    bn = nn.BatchNorm2d(channels).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    return bn.to(BF16)


@dataclass
class Form:
    name: str
    fn: Callable[..., object]
    inputs: Callable[[], Sequence[torch.Tensor]]
    # The least bytes when not every input is read whole (a gather's table): else inputs,
    # parameters and outputs, each once.
    least_bytes: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], int] | None = None
    # Matmul FLOPs (convolutions): the roofline is then the longer of them at the TensorE
    # peak and the bytes at the HBM peak.
    flops: float = 0.0


def forms() -> list[Form]:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=BF16)

    def conv(
        name: str,
        c: int,
        o: int,
        size: int,
        kernel: int,
        stride: int = 1,
        padding: int = 0,
        bias: bool = False,
        batch: int = 8,
        groups: int = 1,
    ) -> Form:
        """nn.Conv2d over a batch of square images, its FLOPs the roofline's."""
        out = (size + 2 * padding - kernel) // stride + 1
        module = nn.Conv2d(c, o, kernel, stride, padding, bias=bias, groups=groups)
        return Form(
            name,
            module.to(BF16),
            lambda: [randn(batch, c, size, size)],
            flops=2.0 * batch * out * out * o * c // groups * kernel * kernel,
        )

    t, h = 4096, 4096
    return [
        Form("llama rmsnorm 4096x4096", LlamaRMSNorm(h).to(BF16), lambda: [randn(t, h)]),
        Form("gemma rmsnorm 4096x4096", GemmaRMSNorm(h).to(BF16), lambda: [randn(t, h)]),
        Form(
            "qwen3 q_norm [1,4096,32,128]",
            LlamaRMSNorm(128).to(BF16),
            lambda: [randn(1, t, 32, 128)],
        ),
        Form("layernorm 4096x4096", nn.LayerNorm(h).to(BF16), lambda: [randn(t, h)]),
        Form("layernorm fp32 upcast 4096x4096", UpcastLayerNorm(h), lambda: [randn(t, h)]),
        Form(
            "residual add + rmsnorm 4096x4096",
            ResidualNorm(h).to(BF16),
            lambda: [randn(t, h), randn(t, h)],
        ),
        Form(
            "silu(gate) * up 4096x11008",
            lambda g, u: F.silu(g) * u,
            lambda: [randn(t, 11008), randn(t, 11008)],
        ),
        Form("gelu_new 4096x16384", gelu_new, lambda: [randn(t, 16384)]),
        Form(
            "hf rotary q [1,32,4096,128], k [1,8,...]",
            hf_rotary,
            lambda: [randn(1, 32, t, 128), randn(1, 8, t, 128), randn(1, t, 128), randn(1, t, 128)],
        ),
        Form(
            "attention softmax fp32 [32,1024,1024]",
            lambda s: F.softmax(s, dim=-1, dtype=torch.float32).to(s.dtype),
            lambda: [randn(32, 1024, 1024)],
        ),
        Form("batchnorm2d eval [8,256,56,56]", batchnorm(256), lambda: [randn(8, 256, 56, 56)]),
        Form(
            "batchnorm2d + relu [8,64,112,112]",
            nn.Sequential(batchnorm(64), nn.ReLU()),
            lambda: [randn(8, 64, 112, 112)],
        ),
        Form("normalize [16,3,224,224]", Normalize(), lambda: [randn(16, 3, 224, 224)]),
        Form(
            "layernorm2d [8,256,56,56]", LayerNorm2d(256).to(BF16), lambda: [randn(8, 256, 56, 56)]
        ),
        Form(
            "hf channels_first layernorm [8,96,56,56]",
            ChannelsFirstLayerNorm(96).to(BF16),
            lambda: [randn(8, 96, 56, 56)],
        ),
        Form(
            "max pool 3x3 s2 [8,64,112,112]",
            nn.MaxPool2d(3, 2, 1),
            lambda: [randn(8, 64, 112, 112)],
        ),
        Form("mean pool [8,4096,1024]", lambda x: x.mean(1), lambda: [randn(8, 4096, 1024)]),
        Form("argmax [32,128256]", lambda x: x.argmax(-1), lambda: [randn(32, 128256)]),
        Form("softmax [32,128256]", lambda x: torch.softmax(x, -1), lambda: [randn(32, 128256)]),
        Form(
            "cross entropy fp32 [4096,32000]",
            lambda x, y: F.cross_entropy(x.float(), y),
            lambda: [randn(t, 32000), torch.randint(0, 32000, (t,))],
        ),
        # Vision: ResNet's convolutions (its stem, a 3 x 3 of each stage), a ViT's patch
        # embedding, Stable Diffusion's, a UNet's upsampling.
        conv("resnet stem 7x7 s2 [8,3,224,224]", 3, 64, 224, 7, stride=2, padding=3),
        conv("conv 3x3 64->64 [8,64,56,56]", 64, 64, 56, 3, padding=1),
        Form(
            "conv 3x3 + bn + relu [8,64,56,56]",
            nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, bias=False), batchnorm(64), nn.ReLU())
            .eval()
            .to(BF16),
            lambda: [randn(8, 64, 56, 56)],
            flops=2.0 * 8 * 56 * 56 * 64 * 64 * 9,
        ),
        conv("conv 3x3 128->128 [8,128,28,28]", 128, 128, 28, 3, padding=1),
        conv("conv 3x3 s2 128->128 [8,128,56,56]", 128, 128, 56, 3, stride=2, padding=1),
        conv("conv 3x3 256->256 [8,256,14,14]", 256, 256, 14, 3, padding=1),
        conv("conv 3x3 512->512 [8,512,7,7]", 512, 512, 7, 3, padding=1),
        conv("vit patch embed 16x16 [8,3,224,224]", 3, 768, 224, 16, stride=16, bias=True),
        conv("vgg conv1 3->64 [8,3,224,224]", 3, 64, 224, 3, padding=1, bias=True),
        # Depthwise: ConvNeXt's 7 x 7, MobileNetV2's 3 x 3.
        conv("convnext dwconv 7x7 [8,96,56,56]", 96, 96, 56, 7, padding=3, bias=True, groups=96),
        conv("mobilenet dwconv 3x3 [8,144,56,56]", 144, 144, 56, 3, padding=1, groups=144),
        # Stable Diffusion's UNet: conv_in over the 4 latent channels, a 1280-channel 3 x 3.
        conv("sd conv_in 4->320 [2,4,64,64]", 4, 320, 64, 3, padding=1, bias=True, batch=2),
        conv("sd conv 1280 [2,1280,8,8]", 1280, 1280, 8, 3, padding=1, bias=True, batch=2),
        # Its VAE decoder: images larger than SBUF, which go through in bands of rows.
        conv("sd vae conv 512 [1,512,64,64]", 512, 512, 64, 3, padding=1, bias=True, batch=1),
        conv("sd vae conv 128 [1,128,256,256]", 128, 128, 256, 3, padding=1, bias=True, batch=1),
        Form(
            "sd groupnorm(32) [2,320,64,64]",
            nn.GroupNorm(32, 320).to(BF16),
            lambda: [randn(2, 320, 64, 64)],
        ),
        Form(
            "sd groupnorm + silu [2,640,32,32]",
            nn.Sequential(nn.GroupNorm(32, 640), nn.SiLU()).to(BF16),
            lambda: [randn(2, 640, 32, 32)],
        ),
        Form(
            "upsample nearest 2x [2,320,32,32]",
            nn.Upsample(scale_factor=2, mode="nearest"),
            lambda: [randn(2, 320, 32, 32)],
        ),
        Form(
            "embedding 4096 of 32000x4096",
            nn.Embedding(32000, h).to(BF16),
            lambda: [torch.randint(0, 32000, (t,))],
            # the indices, the rows they pick (read), the output (written)
            lambda ins, outs: unique_bytes(ins) + 2 * unique_bytes(outs),
        ),
    ]


def unique_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum({t.data_ptr(): t.numel() * t.element_size() for t in tensors}.values())


def leaves(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in leaves(v)]
    return []


def measure(form: Form, target: str) -> bool:
    peaks = native().target_peaks(target)
    inputs = list(form.inputs())
    params = [p for p in getattr(form.fn, "parameters", list)()] + list(
        getattr(form.fn, "buffers", list)()
    )
    torch._dynamo.reset()
    compiled = torch.compile(form.fn, backend="neuron", options={"target": target})
    before = torchneuron.stats()["ops_fallback"]
    with torch.no_grad(), torchneuron.profile() as prof:
        got = leaves(compiled(*inputs))
    with torch.no_grad():
        want = leaves(form.fn(*inputs))
    after = torchneuron.stats()["ops_fallback"]
    fallback = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    err = max(
        float((g.double() - w.double()).abs().max() / (w.double().abs().max() + 1e-6))
        for g, w in zip(got, want, strict=True)
    )
    if form.least_bytes:
        least = form.least_bytes(inputs, want)
    else:
        least = unique_bytes([*inputs, *params, *want])
    roofline_ns = 1e9 * max(least / peaks["hbm_bytes"], form.flops / peaks["flops"])
    device_ns = prof.total_device_ns
    hbm = sum(k["hbm_bytes"] for k in prof.kernels)
    print(
        f"{form.name:42s} {device_ns / 1e3:10.1f} {roofline_ns / 1e3:9.1f} "
        f"{100 * roofline_ns / device_ns:6.1f}% {hbm / least:6.2f} {len(prof.kernels):4d} "
        f"{err:8.1e} {fallback or ''}",
        flush=True,
    )
    return err <= 0.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated name substrings")
    parser.add_argument("--target", default="trn2")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    wanted = [s for s in args.only.split(",") if s]
    header = ("form", "device us", "roof us", "eff", "x min", "kern", "rel err")
    widths = (-42, 10, 9, 7, 6, 4, 8)
    print(
        " ".join(
            f"{h:<{-w}s}" if w < 0 else f"{h:>{w}s}" for h, w in zip(header, widths, strict=True)
        )
    )
    ok = True
    for form in forms():
        if not wanted or any(w in form.name for w in wanted):
            ok &= measure(form, args.target)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
