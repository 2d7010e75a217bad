"""The same model on a Trainium2 and a Trainium3 NeuronCore, side by side.

    .venv/bin/python examples/compare_targets.py

Compiles a SiLU-gated MLP block (Llama style) once per target, runs it on each engine model and
prints modeled device time, achieved FLOP/s and HBM bandwidth, and what bounds each kernel;
exits with status 1 if a target's result is off from eager PyTorch by more than the tolerance.
"""

from __future__ import annotations

import sys

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
    mismatches = []
    for target in ("trn2", "trn3"):
        compiled = torch.compile(model, backend="neuron", options={"target": target})
        with torch.no_grad():
            compiled(x)  # compile outside the profile
            with torchneuron.profile() as prof:
                y = compiled(x)
            expected = model(x).float()
            err = (y.float() - expected).abs().max().item()
        # bf16 results, rounded in other places than eager's bf16 kernels round: a few ulps.
        tol = 5e-2 * max(1.0, expected.abs().max().item())
        status = "ok" if err <= tol else "MISMATCH"
        if status != "ok":
            mismatches.append(f"{target}: {err:.3g} > {tol:.3g}")
        results[target] = prof
        print(f"== {target}: max |device - eager| = {err:.3g}  [{status}]")
        prof.summary()
    t2, t3 = (results[t].total_device_ns for t in ("trn2", "trn3"))
    print(f"\ntrn2 {t2 / 1e3:.1f} us vs trn3 {t3 / 1e3:.1f} us: trn3 is {t2 / t3:.2f}x as fast")
    if mismatches:
        sys.exit("MISMATCH with eager PyTorch: " + "; ".join(mismatches))


if __name__ == "__main__":
    main()
