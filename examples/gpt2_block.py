"""Compile a GPT-2 style transformer block for Trainium and run it on the engine model.

    scripts/run-example.sh            # or: .venv/bin/python examples/gpt2_block.py [--target trn3]

Prints how closely the device results match eager PyTorch on the CPU, in float32 and bfloat16,
and what ran on the device; exits with status 1 if any result is off by more than the tolerance.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import torchneuron


class Block(nn.Module):
    """Token + position embeddings, causal self-attention and a GELU MLP."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, max_len: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.1)
        mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, max_len, max_len), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        x = self.drop(self.tok(ids) + self.pos(torch.arange(t, device=ids.device)))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf")).softmax(-1)
        y = (self.drop(att) @ v).transpose(1, 2).reshape(b, t, -1)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="trn2", choices=["trn2", "trn3"])
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"GPT-2 style block on the {args.target} engine model")
    mismatches = []
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        model = Block().eval().to(dtype)
        compiled = torch.compile(model, backend="neuron", options={"target": args.target})
        for seq in (16, 24):  # a second length recompiles for its sizes
            ids = torch.randint(0, 256, (2, seq))
            with torch.no_grad():
                expected = model(ids)
                start = time.perf_counter()
                with torchneuron.profile() as prof:
                    got = compiled(ids)
                seconds = time.perf_counter() - start
            err = (got.float() - expected.float()).abs().max().item()
            scale = max(1.0, expected.float().abs().max().item())
            status = "ok" if err <= tol * scale else "MISMATCH"
            if status != "ok":
                mismatches.append(f"{dtype} seq={seq}: {err:.2e} > {tol * scale:.2e}")
            print(
                f"  {str(dtype):15s} seq={seq:3d}  max |device - eager| = {err:.2e}  "
                f"[{status}]  modeled device time {prof.total_device_ns / 1e3:8.1f} us  "
                f"(host {seconds * 1e3:.0f} ms incl. compile)"
            )
    s = torchneuron.stats()
    print(
        f"graphs compiled: {s['graphs_compiled']}, recompiles: {s['recompiles']}, "
        f"ops on device: {s['ops_on_device']}, fallback ops: {s['ops_fallback'] or 'none'}, "
        f"kernels run: {s['kernels_run']}, compile time: {s['compile_seconds']:.2f} s"
    )
    print("\nwhere the device time goes (last run):")
    prof.summary()
    if mismatches:
        sys.exit("MISMATCH with eager PyTorch: " + "; ".join(mismatches))


if __name__ == "__main__":
    main()
