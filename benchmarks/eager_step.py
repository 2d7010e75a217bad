"""Modeled device time of one training step of examples/train.py's model, eager on the neuron
device (only ``.to("neuron")`` added: one device kernel per op, the optimizer step included)
next to the same step compiled (forward and backward kernels; its optimizer step stays eager).

    .venv/bin/python benchmarks/eager_step.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import torchneuron

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train import GPT, batch  # noqa: E402


def step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    loss = model(ids, targets)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def main() -> None:
    torch.manual_seed(0)
    data = batch(torch.Generator().manual_seed(0))
    ids, targets = data[:, :-1], data[:, 1:]
    reference = GPT().train()

    eager = GPT()
    eager.load_state_dict(reference.state_dict())
    eager = eager.to("neuron")
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    on_device = ids.to("neuron"), targets.to("neuron")
    step(eager, opt, *on_device)  # compiles each op's kernel once
    torchneuron.reset_stats()
    with torchneuron.profile() as prof:
        step(eager, opt, *on_device)
    stats = torchneuron.stats()
    print(
        f"eager on neuron: {prof.total_device_ns / 1e6:.3f} ms modeled per step, "
        f"{stats['kernels_run']} kernels, CPU fallbacks {stats['ops_fallback']}"
    )

    compiled = GPT()
    compiled.load_state_dict(reference.state_dict())
    compiled.compile(backend="neuron")
    torchneuron.allow_flex_attention_training()
    opt = torch.optim.AdamW(compiled.parameters(), lr=1e-3)
    step(compiled, opt, ids, targets)
    with torchneuron.profile() as prof_compiled:
        step(compiled, opt, ids, targets)
    print(
        f"compiled: {prof_compiled.total_device_ns / 1e6:.3f} ms modeled per step "
        f"(forward and backward kernels; the optimizer step runs eagerly on the CPU)"
    )
    print(f"eager / compiled: {prof.total_device_ns / prof_compiled.total_device_ns:.2f}x")


if __name__ == "__main__":
    main()
