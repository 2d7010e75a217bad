"""The same model on a Trainium2 and a Trainium3 NeuronCore, side by side.

    .venv/bin/python examples/compare_targets.py

Compiles a SiLU-gated MLP block (Llama style) once per target, runs it on each engine model and
prints modeled device time, achieved FLOP/s and HBM bandwidth, and what bounds each kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import torchneuron


class GatedMlp(nn.Module):
    def __init__(self, dim: int = 512, hidden: int = 1408) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def main() -> None:
    torch.manual_seed(0)
    model = GatedMlp().eval().to(torch.bfloat16)
    x = torch.randn(256, 512, dtype=torch.bfloat16)
    results = {}
    for target in ("trn2", "trn3"):
        compiled = torch.compile(model, backend="neuron", options={"target": target})
        with torch.no_grad():
            compiled(x)  # compile outside the profile
            with torchneuron.profile() as prof:
                y = compiled(x)
            err = (y.float() - model(x).float()).abs().max().item()
        results[target] = prof
        print(f"== {target}: max |device - eager| = {err:.3g}")
        prof.summary()
    t2, t3 = (results[t].total_device_ns for t in ("trn2", "trn3"))
    print(f"\ntrn2 {t2 / 1e3:.1f} us vs trn3 {t3 / 1e3:.1f} us: trn3 is {t2 / t3:.2f}x as fast")


if __name__ == "__main__":
    main()
