"""Whole vision models as torchvision-style code writes them, on the device: a ResNet-18
(BatchNorm, ReLU, max-pool, downsampling 1 x 1 convolutions), a ViT-Tiny (a 16 x 16 patch
embedding, two ``nn.TransformerEncoderLayer``), a MobileNetV2 (inverted residuals: depthwise
3 x 3 convolutions, ReLU6) and a ConvNeXt with Tiny's widths and one block a stage (7 x 7
depthwise convolutions, LayerNorm over channels after a permute, GELU), eval mode, random
weights.

    .venv/bin/python benchmarks/vision_models.py [--batch 2] [--target trn3]

Each compiles with ``torch.compile(backend="neuron")``, runs once under the profiler and
prints the modeled device time, the ops left to eager PyTorch and the worst error relative
to eager on the same values (the process exits 1 past 5% or on any fallback).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layers = nn.Sequential(
            *[
                block
                for cin, cout, stride in widths
                for block in (BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))
            ]
        )
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ViTTiny(nn.Module):
    def __init__(self, dim: int = 192, depth: int = 2, classes: int = 1000) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, 16, 16)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 197, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, 3, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.encoder(x)[:, 0])


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV2 block: 1 x 1 expansion, 3 x 3 depthwise, 1 x 1 projection."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1)]
        settings += [(6, 160, 3, 2), (6, 320, 1, 1)]
        layers: list[nn.Module] = [
            nn.Conv2d(3, 32, 3, 2, 1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU6(),
        ]
        cin = 32
        for t, c, n, s in settings:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class LayerNorm2d(nn.LayerNorm):
    """torchvision's: a LayerNorm over the channels of NCHW."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class CNBlock(nn.Module):
    """torchvision's ConvNeXt block (eval: no stochastic depth)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim),
            Permute([0, 2, 3, 1]),
            nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, 4 * dim),
            nn.GELU(),
            nn.Linear(4 * dim, dim),
            Permute([0, 3, 1, 2]),
        )
        self.layer_scale = nn.Parameter(torch.full((dim, 1, 1), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layer_scale * self.block(x)


class Permute(nn.Module):
    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.permute(x, self.dims)


class ConvNeXt(nn.Module):
    """ConvNeXt-Tiny's widths, one block a stage (Tiny has 3, 3, 9, 3)."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        dims = [96, 192, 384, 768]
        layers: list[nn.Module] = [
            nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))
        ]
        for i, dim in enumerate(dims):
            layers.append(CNBlock(dim))
            if i + 1 < len(dims):
                layers.append(
                    nn.Sequential(LayerNorm2d(dim, eps=1e-6), nn.Conv2d(dim, dims[i + 1], 2, 2))
                )
        self.features = nn.Sequential(*layers)
        self.norm = LayerNorm2d(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.norm(self.features(x)), 1)
        return self.head(torch.flatten(x, 1))


def relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    """The worst element's error over the largest reference value."""
    return ((y.float() - reference).abs().max() / reference.abs().max()).item()


def calibrate(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """Sets each BatchNorm's running statistics to those of `x`'s activations (one training
    step's with momentum 1): with the default init and identity statistics a deep network's
    activations shrink block by block (MobileNetV2's features reach ~1e-8, its logits are its
    classifier's bias, and a comparison with eager checks nothing)."""
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in norms:
        m.momentum = 1.0
    with torch.no_grad():
        model.train()(x.float())
    return model.eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--target", default="trn2")
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = [
        ("resnet18 bf16", ResNet18(), torch.bfloat16),
        ("resnet18 f32", ResNet18(), torch.float32),
        ("vit-tiny bf16", ViTTiny(), torch.bfloat16),
        ("mobilenet-v2 bf16", MobileNetV2(), torch.bfloat16),
        ("convnext bf16", ConvNeXt(), torch.bfloat16),
    ]
    # rel err: the worst element's error against float32 eager (the same weights), over the
    # largest output; eager's own at the dtype bounds what a bf16 run can reach (MobileNetV2's
    # 17 blocks: ~0.13), so the check allows twice it, or 0.05.
    print(f"{'model':18s} {'device us':>10s} {'rel err':>9s} {'eager':>9s}  fallbacks")
    ok = True
    for name, model, dtype in cases:
        x = torch.randn(args.batch, 3, 224, 224)
        model = calibrate(model, x)
        with torch.no_grad():
            reference = model(x)
        model = model.to(dtype)
        x = x.to(dtype)
        torch._dynamo.reset()
        before = dict(torchneuron.stats()["ops_fallback"])
        compiled = torch.compile(
            model, backend="neuron", options={"target": args.target, "cache": False}
        )
        with torch.no_grad(), torchneuron.profile() as prof:
            got = compiled(x)
        with torch.no_grad():
            eager = model(x)
        after = torchneuron.stats()["ops_fallback"]
        fallbacks = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
        err, eager_err = relative_error(got, reference), relative_error(eager, reference)
        ok &= err <= max(0.05, 2 * eager_err) and not fallbacks
        print(
            f"{name:18s} {prof.total_device_ns / 1e3:10.1f} {err:9.1e} {eager_err:9.1e}"
            f"  {fallbacks or '-'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
