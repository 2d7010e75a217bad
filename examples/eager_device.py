"""Train a small model in eager PyTorch on the ``neuron`` device, with ``.to("neuron")`` as the
one change, next to the same loop on the CPU.

    .venv/bin/python examples/eager_device.py [--steps 10]

The device registers itself when torch is imported (no ``import torchneuron`` needed). Every
eager op the compiler lowers runs as a device kernel, compiled for its sizes and dtypes on
first use and cached (the first step compiles, later steps only look kernels up); the rest
are counted CPU fallbacks. The losses match CPU eager's within float32 rounding (the script
exits with status 1 if one does not). The run ends with the modeled device time of one step,
what fell back and the device's memory figures.
``TORCHNEURON_EAGER_KERNELS=0`` runs every op as a CPU fallback (CPU's numbers bit for bit).
"""

from __future__ import annotations

import argparse
import copy
import sys
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
    step_ns = 0.0
    different = []
    for step in range(args.steps):
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        losses = []
        for m, o, device in ((cpu_model, cpu_opt, "cpu"), (model, opt, "neuron")):
            with torchneuron.profile() as prof:
                loss = nn.functional.cross_entropy(m(x.to(device)), y.to(device))
                loss.backward()
                o.step()
                o.zero_grad()
            losses.append(loss.item())
        step_ns = prof.total_device_ns
        if losses[0] == losses[1]:
            same = "same"
        elif abs(losses[0] - losses[1]) <= 1e-5 * (1 + abs(losses[0])):
            same = "close"
        else:
            same = "DIFFERENT"
            different.append(step)
        print(f"step {step:3d}  cpu {losses[0]:.6f}  neuron {losses[1]:.6f}  ({same})")

    print(f"accelerator: {torch.accelerator.current_accelerator()}")
    print(
        f"memory allocated on neuron:0: {torch.neuron.memory_allocated()} bytes "
        f"(peak {torch.neuron.max_memory_allocated()}, capacity "
        f"{torch.neuron.get_device_capacity() / 2**30:.0f} GiB)"
    )
    stats = torchneuron.stats()
    print(
        f"device kernels run: {stats['kernels_run']}; modeled device time of the last step: "
        f"{step_ns / 1e3:.1f} us"
    )
    fallback = stats["ops_fallback"]
    print(f"CPU fallbacks: {sum(fallback.values())} calls of {len(fallback)} ops")
    for name, n in sorted(fallback.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {n:5d}  {name}")
    if different:
        sys.exit(f"MISMATCH: the neuron loss differs from the CPU loss at steps {different}")


if __name__ == "__main__":
    main()
