"""The NKI kernel library (torchneuron.kernels) next to the compiler's kernels for the same ops.

    .venv/bin/python benchmarks/kernel_library.py [--small] [--target trn2]

For each op: the hand kernel's modeled time (nki.benchmark: traced, compiled, timed; what
bounds it), the compiled PyTorch form's modeled time (torch.compile with the neuron backend,
under torchneuron.profile) and their ratio; both outputs are checked against eager PyTorch
before any figure is printed. bf16 throughout, sizes of a Llama-style layer unless ``--small``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import torchneuron
import torchneuron.nki as nki
from torchneuron import kernels


@dataclass
class Case:
    name: str
    kernel: Any  # the @nki.jit kernel
    kernel_args: tuple[Any, ...]
    library: Callable[[], torch.Tensor]  # the library call (checks numerics)
    torch_form: Callable[..., torch.Tensor]  # what a user writes, compiled
    torch_args: tuple[torch.Tensor, ...]
    tolerance: float


def llama_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def cases(small: bool) -> list[Case]:
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    n, d = (512, 1024) if small else (4096, 4096)
    x, w = torch.randn(n, d, dtype=bf16), torch.randn(d, dtype=bf16)
    heads, s, hd = (2, 512, 128) if small else (8, 2048, 128)
    q, k, v = (torch.randn(1, heads, s, hd, dtype=bf16) for _ in range(3))
    mask = torch.full((128, 128), float("-inf")).triu(1)
    experts, tokens, hidden, inner = (4, 512, 256, 512) if small else (8, 2048, 1024, 2048)
    sizes = torch.distributions.Multinomial(tokens, torch.ones(experts)).sample().int()
    group = tuple(int(c) for c in sizes)
    tok = torch.randn(tokens, hidden, dtype=bf16)
    weights = torch.randn(experts, hidden, inner, dtype=bf16) * hidden**-0.5
    offsets = torch.cumsum(sizes, 0).to(torch.int32)
    flat = (q.reshape(-1, s, hd), k.reshape(-1, s, hd), v.reshape(-1, s, hd))
    return [
        Case(
            "rms_norm (Llama form)",
            kernels.rms_norm_kernel,
            (x, w, 1e-6),
            lambda: kernels.rms_norm(x, w),
            llama_rms_norm,
            (x, w),
            2e-2,
        ),
        Case(
            "softmax",
            kernels.softmax_kernel,
            (x,),
            lambda: kernels.softmax(x),
            lambda x: torch.softmax(x.float(), -1).to(x.dtype),
            (x,),
            1e-2,
        ),
        Case(
            "causal attention",
            kernels.attention_kernel,
            (*flat, hd**-0.5, mask),
            lambda: kernels.attention(q, k, v, is_causal=True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            (q, k, v),
            2e-2,
        ),
        Case(
            f"MoE grouped matmul ({experts} experts)",
            kernels.grouped_matmul_kernel,
            (tok, weights, group),
            lambda: kernels.grouped_matmul(tok, weights, group),
            lambda t, wt, o: torch._grouped_mm(t, wt, offs=o),
            (tok, weights, offsets),
            2e-2,
        ),
    ]


def _close(got: torch.Tensor, ref: torch.Tensor, tolerance: float, what: str) -> None:
    err = (got.float() - ref.float()).abs().max().item() / max(ref.float().abs().max().item(), 1)
    if not math.isfinite(err) or err > tolerance:
        raise SystemExit(f"{what}: wrong answer (max error {err:.3g} of the largest value)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="small sizes (a quick check)")
    parser.add_argument("--target", default="trn2")
    args = parser.parse_args()
    header = f"{'op':34} {'kernel us':>10} {'compiled us':>12} {'kernel/compiled':>16}"
    print(f"{header}  kernel bound by")
    for case in cases(args.small):
        reference = case.torch_form(*case.torch_args)
        _close(case.library(), reference, case.tolerance, f"{case.name} (kernel)")
        result = nki.benchmark(nki.jit(case.kernel.fn, target=args.target), *case.kernel_args)
        compiled = torch.compile(case.torch_form, backend="neuron", options={"target": args.target})
        with torch.no_grad(), torchneuron.profile() as prof:
            out = compiled(*case.torch_args)
        _close(out, reference, case.tolerance, f"{case.name} (compiled)")
        ratio = result.latency_us * 1e3 / prof.total_device_ns
        print(
            f"{case.name:34} {result.latency_us:10.1f} {prof.total_device_ns / 1e3:12.1f} "
            f"{ratio:16.2f}  {result.bound}"
        )


if __name__ == "__main__":
    main()
