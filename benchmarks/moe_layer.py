"""A Transformers mixture-of-experts block on the device: modeled time against the sum of its
ATen ops' rooflines (issue #19: an MoE layer within 1.3x of that sum).

    .venv/bin/python benchmarks/moe_layer.py                    # 2048 tokens, trn2
    .venv/bin/python benchmarks/moe_layer.py --tokens 256 --targets trn2,trn3

The block is ``MixtralSparseMoeBlock`` as Transformers builds it (router, top-2 of 8 experts,
the experts as ``_grouped_mm`` over routed rows sorted by expert), hidden 1024, intermediate
2048, bf16, random weights. Each target prints the modeled device time per kernel, the sum of
per-op roofline times (``kernels.op_costs`` on an ATen trace: each op's FLOPs at the TensorE
peak or its bytes at the HBM peak, whichever is longer), their ratio, the host compile time,
the ops left to eager PyTorch, and how far the output is from eager PyTorch's on the same bf16
values (a router that rounds differently can send a near-tie token to another expert: the
share of tokens within bf16 tolerance is printed, not checked).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernels  # noqa: E402

import torchneuron  # noqa: E402
from torchneuron._native import native  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--targets", default="trn2")
    args = parser.parse_args()
    import transformers as hf

    warnings.simplefilter("ignore")
    config = hf.MixtralConfig(
        hidden_size=1024,
        intermediate_size=2048,
        num_local_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=256,
    )
    torch.manual_seed(0)
    block = hf.MixtralForCausalLM(config).model.layers[0].mlp.eval().bfloat16()
    x = torch.randn(1, args.tokens, config.hidden_size, dtype=torch.bfloat16)
    costs = kernels.trace_costs(kernels.as_module(block, (x,), 0.0))
    with torch.no_grad():
        want = block(x)
    for target in args.targets.split(","):
        peaks = native().target_peaks(target)
        roofline_ns = sum(c.roofline_ns(peaks["flops"], peaks["hbm_bytes"]) for c in costs)
        torchneuron.reset_stats()
        compiled = torch.compile(block, backend="neuron", options={"target": target})
        start = time.perf_counter()
        with torch.no_grad(), torchneuron.profile() as prof:
            got = compiled(x)
        wall = time.perf_counter() - start
        stats = torchneuron.stats()
        prof.summary()
        ratio = prof.total_device_ns / roofline_ns
        print(
            f"{target}: modeled {prof.total_device_ns / 1e3:.1f} us, sum of {len(costs)} op "
            f"rooflines {roofline_ns / 1e3:.1f} us: {ratio:.2f}x (target 1.3x); compile "
            f"{stats['compile_seconds']:.2f} s, first call {wall:.1f} s; eager fallbacks "
            f"{stats['ops_fallback'] or 'none'}"
        )
        close = torch.isclose(got.float(), want.float(), atol=3e-2, rtol=3e-2).all(-1)
        print(f"  tokens within bf16 tolerance of eager: {close.float().mean().item():.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
