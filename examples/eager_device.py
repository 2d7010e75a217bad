"""Train a small model in eager PyTorch on the ``neuron`` device, with ``.to("neuron")`` as the
one change, next to the same loop on the CPU.

    .venv/bin/python examples/eager_device.py [--steps 10]

The device registers itself when torch is imported (no ``import torchneuron`` needed). Today
every op on neuron tensors, except tensor creation, views and copies, runs as a counted CPU
fallback, so the losses equal CPU eager's exactly; the run ends with what fell back and the
device's memory figures.
"""

from __future__ import annotations

import argparse
import copy
import warnings

import torch
from torch import nn

import torchneuron


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="neuron: .* runs as a CPU fallback")

    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 10))
    model = copy.deepcopy(cpu_model).to("neuron")  # the one changed line
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        losses = []
        for m, o, device in ((cpu_model, cpu_opt, "cpu"), (model, opt, "neuron")):
            loss = nn.functional.cross_entropy(m(x.to(device)), y.to(device))
            loss.backward()
            o.step()
            o.zero_grad()
            losses.append(loss.item())
        same = "same" if losses[0] == losses[1] else "DIFFERENT"
        print(f"step {step:3d}  cpu {losses[0]:.6f}  neuron {losses[1]:.6f}  ({same})")

    print(f"accelerator: {torch.accelerator.current_accelerator()}")
    print(
        f"memory allocated on neuron:0: {torch.neuron.memory_allocated()} bytes "
        f"(peak {torch.neuron.max_memory_allocated()}, capacity "
        f"{torch.neuron.get_device_capacity() / 2**30:.0f} GiB)"
    )
    fallback = torchneuron.stats()["ops_fallback"]
    print(f"CPU fallbacks: {sum(fallback.values())} calls of {len(fallback)} ops")
    for name, n in sorted(fallback.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
