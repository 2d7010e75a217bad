"""Host overhead of an eager op on neuron tensors whose device kernel is cached (issue 17:
target <= 30 us per op, median, small tensors), next to the same op on CPU tensors.

    .venv/bin/python benchmarks/eager_overhead.py [--size 16] [--iters 2000]

Each op is called once first (compiled and cached), then timed call by call; the figure is
the median wall time of one call, which includes the engine model computing the result on the
host. Also printed: the same op as a counted CPU fallback (device kernels off), and the
modeled device time the kernel puts on the stream.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch

import torchneuron
from torchneuron import eager


def median_us(fn: Callable[[], object], iters: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="neuron: .* runs as a CPU fallback")
    n = args.size
    a, b = torch.randn(n, n), torch.randn(n, n)
    an, bn = a.to("neuron"), b.to("neuron")
    ops: dict[str, Callable[[torch.Tensor, torch.Tensor], object]] = {
        "add": lambda x, y: x + y,
        "mul": lambda x, y: x * y,
        "relu": lambda x, y: torch.relu(x),
        "mm": lambda x, y: x @ y,
        "add_ (in place)": lambda x, y: x.add_(y, alpha=0.5),
        "sum(dim=1)": lambda x, y: x.sum(dim=1),
    }
    print(f"{n}x{n} float32, median of {args.iters} calls (us per op)")
    print(
        f"{'op':<16s} {'cpu':>8s} {'neuron':>8s} {'overhead':>9s} {'fallback':>9s} {'modeled':>9s}"
    )
    over = []
    for name, op in ops.items():
        cpu = median_us(lambda op=op: op(a, b), args.iters)
        eager.set_enabled(True)
        torchneuron.reset_stats()
        with torchneuron.profile() as prof:
            op(an, bn)  # compile and cache
        modeled = prof.total_device_ns / 1e3
        before = eager.counts()
        dev = median_us(lambda op=op: op(an, bn), args.iters)
        after = eager.counts()
        assert after["compiles"] == before["compiles"], "a cached op compiled again"
        assert after["runs"] - before["runs"] >= args.iters, "the op did not run as a kernel"
        assert not torchneuron.stats()["ops_fallback"], torchneuron.stats()["ops_fallback"]
        eager.set_enabled(False)
        fallback = median_us(lambda op=op: op(an, bn), args.iters)
        eager.set_enabled(True)
        over.append(dev - cpu)
        print(f"{name:<16s} {cpu:8.1f} {dev:8.1f} {dev - cpu:9.1f} {fallback:9.1f} {modeled:9.2f}")
    target = 30.0
    worst = max(over)
    verdict = "MET" if worst <= target else "NOT MET"
    print(
        f"overhead vs CPU: median {statistics.median(over):.1f} us, worst {worst:.1f} us "
        f"(target <= {target:.0f} us: {verdict})"
    )


if __name__ == "__main__":
    main()
