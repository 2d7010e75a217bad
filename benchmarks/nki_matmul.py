"""NKI's matmul optimisation series on the engine model: modeled time of each step.

    .venv/bin/python benchmarks/nki_matmul.py [--size 4096] [--target trn2] [--from FILE]

The kernels are the tutorial-style ones of tests/python/test_nki_tutorials.py (tiled, hoisted
loads, blocked free dimensions, fully optimized), in bf16, timed by nki.benchmark (traced and
compiled, not run: the time is a property of the program). Numerics are the tests' business.
``--from`` times the published tutorial instead: nki-samples'
matrix_multiplication_nki_kernels.py with its import lines changed to torchneuron.nki (kept
outside this repository).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

import torchneuron.nki as nki

# The published tutorial's kernel names for our steps.
PUBLISHED = {
    "tiled": "nki_matmul_tiled_",
    "hoisted": "nki_matmul_hoist_load_",
    "blocked_free": "nki_matmul_block_free_dimension_",
    "fully_optimized": "nki_matmul_fully_optimized_",
}


def load_kernels(path: Path | None = None):  # noqa: ANN201
    path = path or Path(__file__).resolve().parent.parent / "tests/python/test_nki_tutorials.py"
    spec = importlib.util.spec_from_file_location("nki_tutorials", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="M = N = K")
    parser.add_argument("--steps", default="tiled,hoisted,blocked_free,fully_optimized")
    parser.add_argument("--target", default=None)
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=None,
        help="a copy of nki-samples' matrix_multiplication_nki_kernels.py",
    )
    args = parser.parse_args()
    k = load_kernels(args.source)
    a = torch.empty(args.size, args.size, dtype=torch.bfloat16)
    for step in args.steps.split(","):
        kernel = getattr(k, PUBLISHED[step] if args.source else f"mm_{step}")
        if args.target:
            kernel.target = args.target
        r = nki.benchmark(kernel, a, a)
        print(
            f"{step:16s} {r.latency_us:10.1f} us  {r.tflops:5.1f} TFLOP/s  "
            f"{r.tensor_peak_fraction:6.1%} of TensorE peak  bound by {r.bound}  "
            f"(tensor busy {r.utilization.get('tensor', 0):.0%}, "
            f"dma {r.utilization.get('dma', 0):.0%}, vector {r.utilization.get('vector', 0):.0%})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
