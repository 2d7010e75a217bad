"""A custom FlexAttention variant compiled for Trainium and profiled on the engine model.

    .venv/bin/python examples/flex_attention.py [--target trn3] [--seq 1024]

The attention below combines a score_mod (tanh soft-capping plus ALiBi head slopes) with a
mask_mod (causal sliding window within documents, from a captured document-id tensor). The
backend compiles it into one flash-attention kernel that skips the fully masked blocks of the
BlockMask and applies mask_mod only on partial ones. The script prints the largest difference
from eager ``flex_attention`` on the CPU (exiting with status 1 if it exceeds the tolerance),
the modeled device time and the kernel profile.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torchneuron


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target", default="trn2", choices=["trn2", "trn3"])
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--window", type=int, default=256)
    args = parser.parse_args()
    s, heads, window = args.seq, args.heads, args.window
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, s, 64, dtype=torch.bfloat16) for _ in range(3))
    # Three documents of different lengths packed into one sequence.
    bounds = torch.tensor([0, s // 3, s // 3 + s // 2, s])
    documents = torch.bucketize(torch.arange(s), bounds[1:], right=True).to(torch.int32)

    def soft_cap_alibi(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        slope = torch.exp2(-8.0 * (h + 1) / heads)
        return 20.0 * torch.tanh(score / 20.0) + slope * (kv_idx - q_idx)

    def local_documents(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        same_document = documents[q_idx] == documents[kv_idx]
        return same_document & (q_idx >= kv_idx) & (q_idx - kv_idx <= window)

    block_mask = create_block_mask(local_documents, None, None, s, s, device="cpu")

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flex_attention(q, k, v, score_mod=soft_cap_alibi, block_mask=block_mask)

    expected = attention(q, k, v)
    compiled = torch.compile(attention, backend="neuron", options={"target": args.target})
    with torchneuron.profile() as prof:
        out = compiled(q, k, v)
    error = (out.float() - expected.float()).abs().max().item()
    # bf16 inputs and output: a few bf16 ulps of the largest output.
    tol = 5e-2 * max(1.0, expected.float().abs().max().item())
    kept = 1.0 - block_mask.sparsity() / 100.0
    print(f"flex_attention on {args.target}: 1 x {heads} heads x {s} tokens x 64, bf16")
    print(f"  blocks computed: {100 * kept:.0f}% of the score matrix (the rest is skipped)")
    print(f"  max |device - eager| = {error:.3g}  [{'ok' if error <= tol else 'MISMATCH'}]")
    print(f"  modeled device time: {prof.total_device_ns / 1e3:.1f} us")
    print(f"  ops left to eager PyTorch: {sum(torchneuron.stats()['ops_fallback'].values())}")
    prof.summary()
    if not error <= tol:
        sys.exit(f"MISMATCH with eager flex_attention: {error:.3g} > {tol:.3g}")


if __name__ == "__main__":
    main()
