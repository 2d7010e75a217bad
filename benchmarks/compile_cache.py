"""Backend compile time of a model in a fresh process, with an empty and with a warm persistent
compile cache (:mod:`torchneuron.cache`): the second process loads the programs the first one
compiled. Each run is a new Python process (as a restarted job would be), timed by
``torchneuron.stats()["compile_seconds"]`` (the backend's compile, Dynamo's tracing excluded).

    .venv/bin/python benchmarks/compile_cache.py             # the Llama-style decoder layer
    .venv/bin/python benchmarks/compile_cache.py --train     # its forward and backward
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = """
import json, sys, torch, torchneuron
sys.path.insert(0, {bench!r})
from kernels import DecoderLayer
torch.manual_seed(0)
layer = DecoderLayer(hidden=256, heads=4, intermediate=688)
x = torch.randn(1, 128, 256, requires_grad={train})
out = torch.compile(layer, backend="neuron")(x)
if {train}:
    torchneuron.allow_flex_attention_training()
    out.sum().backward()
print(json.dumps(torchneuron.stats()))
"""


def run(cache: Path, train: bool) -> dict[str, float]:
    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(cache), "TORCHNEURON_CACHE": "1"}
    code = RUN.format(bench=str(Path(__file__).resolve().parent), train=train)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    stats: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", action="store_true", help="compile forward and backward")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cold = run(Path(tmp), args.train)
        warm = run(Path(tmp), args.train)
    print(f"{'process':<8} {'compile s':>10} {'compiled':>9} {'cache hits':>11}")
    for name, s in (("first", cold), ("second", warm)):
        print(
            f"{name:<8} {s['compile_seconds']:>10.3f} {s['graphs_compiled']:>9} "
            f"{s['cache_hits']:>11}"
        )
    ratio = warm["compile_seconds"] / max(cold["compile_seconds"], 1e-9)
    verdict = "MET" if ratio <= 0.1 else "NOT MET"
    print(f"second / first: {ratio:.3f} (target <= 0.1: {verdict})")


if __name__ == "__main__":
    main()
