"""Which ATen ops of a training step stay in eager PyTorch: trains each model of
tests/python/models.py (plus a conv net, cross-entropy and MSE losses, dropout in training
mode) for two steps with ``backend="neuron"`` and AdamW, and prints
``torchneuron.stats()["ops_fallback"]`` per model (``TORCHNEURON_VERBOSE=1``: why, where).

    .venv/bin/python scripts/training_inventory.py [model ...]

``tests/python/test_training.py`` trains every case one step through :func:`train` and asserts
what the README says this script finds: only the optimizer step falls back.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from models import MODELS, make_inputs, make_model  # noqa: E402

import torchneuron  # noqa: E402

Loss = Callable[[torch.Tensor], torch.Tensor]
Case = tuple[str, Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, ...]], Loss]


class ConvNet(nn.Module):
    """Strided and padded convolutions, max pooling with overlapping windows, dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.silu(self.conv1(x)))
        x = self.drop(F.relu(self.conv2(x)))
        return self.fc(x.flatten(1))


def _cross_entropy(out: torch.Tensor) -> torch.Tensor:
    logits = out.reshape(-1, out.shape[-1])
    target = torch.arange(logits.shape[0]) % logits.shape[-1]
    return F.cross_entropy(logits, target)


def _mse(out: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, torch.ones_like(out) * 0.5)


def _cases() -> list[Case]:
    cases: list[Case] = []
    for case in MODELS:

        def build(case=case) -> nn.Module:
            return make_model(case).train()

        def inputs(case=case) -> tuple[torch.Tensor, ...]:
            return make_inputs(case, 0)

        cases.append((case.name, build, inputs, _mse))
    cases.append(
        ("conv_net+cross_entropy", ConvNet, lambda: (torch.randn(2, 3, 16, 16),), _cross_entropy)
    )
    return cases


def case_names() -> list[str]:
    return [name for name, _, _, _ in _cases()]


def train(name: str, steps: int = 2) -> tuple[float, dict[str, Any]]:
    """Trains case ``name`` for ``steps`` AdamW steps with ``backend="neuron"`` from fresh
    Dynamo state and stats; returns the last loss and ``torchneuron.stats()``."""
    (build, inputs, loss_fn) = next((b, i, f) for n, b, i, f in _cases() if n == name)
    torch._dynamo.reset()
    torchneuron.reset_stats()
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = torch.compile(lambda *xs: loss_fn(model(*xs)), backend="neuron")
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        loss = step(*inputs())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item(), torchneuron.stats()


def main(names: list[str]) -> None:
    for name in case_names():
        if names and name not in names:
            continue
        loss, stats = train(name)
        print(
            f"{name}: loss {loss:.4f}, {stats['ops_on_device']} ops on device, "
            f"fallback {stats['ops_fallback']}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
