"""Collective bus bandwidth of the ``neuron`` torch.distributed backend, modeled.

Run from the repository root, after ``scripts/setup.sh``:

    .venv/bin/python benchmarks/collectives.py                  # trn2, the cost model only
    .venv/bin/python benchmarks/collectives.py --target trn3
    .venv/bin/python benchmarks/collectives.py --measure        # also 2 real ranks, up to 4 MiB

The table is the cost model itself (``runtime/timing/CollectiveCost.h``, through
``torchneuron.distributed.collective_cost``): the duration the backend charges on each rank's
stream for one collective of the given size, for all_reduce, all_gather and reduce_scatter on
2, 4 and 8 ranks of one chip and on 8 ranks one per chip (ranks 0, 8, ..., 56). Large sizes are
not run on real ranks: the model does not depend on the data, and Gloo on one host would take
minutes for nothing. ``--measure`` launches 2 ranks (``torch.multiprocessing``, Gloo on
127.0.0.1) and times the same collectives with device events on the ranks' streams, sizes
1 KiB to 4 MiB: what the backend really charged, which must equal the model.

Bus bandwidth as nccl-tests defines it, so that a perfect ring reaches the link peak:
``algbw = bytes / time`` (bytes: the all-reduced tensor, the gathered output, the scattered
input), ``busbw = algbw * 2(n-1)/n`` for all_reduce and ``algbw * (n-1)/n`` for all_gather and
reduce_scatter. "peak" is the ring's bottleneck hop (the core's DMA within a chip, the chip's
NeuronLink share across chips). The three tables agree: all three are rings whose latency steps
grow with their bandwidth steps, so bus bandwidth normalizes them to the same curve.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

import torch

import torchneuron.distributed as neuron_dist

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter"]
SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KiB ... 256 MiB


def groups(cores_per_chip: int) -> dict[str, list[int]]:
    return {
        "2 ranks": [0, 1],
        "4 ranks": list(range(4)),
        "8 ranks": list(range(8)),
        "8 chips": [i * cores_per_chip for i in range(8)],
    }


def bus_factor(collective: str, n: int) -> float:
    return 2 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n


def size_name(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def model_table(target: str) -> None:
    topo = neuron_dist.topology(target)
    cases = groups(topo["cores_per_chip"])
    print(f"Modeled bus bandwidth, GB/s ({target}; cost model, not measured)")
    for collective in COLLECTIVES:
        peaks = {
            name: neuron_dist.collective_cost(collective, 1, ranks, target)["bus_bytes_per_ns"]
            for name, ranks in cases.items()
        }
        header = f"{collective:>14} | " + " | ".join(f"{name:>16}" for name in cases)
        print()
        print(header)
        print("-" * len(header))
        for nbytes in SIZES:
            cells = []
            for name, ranks in cases.items():
                cost = neuron_dist.collective_cost(collective, nbytes, ranks, target)
                busbw = nbytes / cost["duration_ns"] * bus_factor(collective, len(ranks))
                cells.append(f"{busbw:7.1f} ({busbw / peaks[name]:4.0%})")
            print(f"{size_name(nbytes):>14} | " + " | ".join(f"{c:>16}" for c in cells))
        print(f"{'link peak':>14} | " + " | ".join(f"{peaks[n]:16.1f}" for n in cases))


def _measure_rank(rank: int, port: int, sizes: list[int], out: Any) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # *_into_tensor's new names
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("neuron", rank=rank, world_size=2)
    torch.neuron.set_device(rank)
    dev = torch.device("neuron", rank)
    start = torch.Event(device=dev, enable_timing=True)
    end = torch.Event(device=dev, enable_timing=True)
    rows = []
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4, device=dev)
        gathered = torch.empty(2 * x.numel(), device=dev)
        half = torch.empty(x.numel() // 2, device=dev)
        runs = {
            "all_reduce": lambda x=x: dist.all_reduce(x),
            "all_gather": lambda x=x, g=gathered: dist.all_gather_into_tensor(g, x),
            "reduce_scatter": lambda x=x, h=half: dist.reduce_scatter_tensor(h, x),
        }
        for collective, run in runs.items():
            start.record()
            run()
            end.record()
            rows.append((collective, nbytes, start.elapsed_time(end) * 1e6))
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def measure(sizes: list[int]) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_measure_rank, args=(r, port, sizes, out)) for r in range(2)]
    for p in procs:
        p.start()
    rows = out.get(timeout=300)
    for p in procs:
        p.join()
    print("\nMeasured on 2 ranks: device events around each collective (modeled ns charged);")
    print("size: each rank's input")
    print(f"{'collective':>14} | {'size':>8} | {'event ns':>10} | {'model ns':>10} | busbw GB/s")
    for collective, nbytes, ns in rows:
        # all_gather's bytes are its output (2x the input); the others' the input.
        moved = 2 * nbytes if collective == "all_gather" else nbytes
        model = neuron_dist.collective_cost(collective, moved, [0, 1])["duration_ns"]
        busbw = moved / ns * bus_factor(collective, 2)
        print(
            f"{collective:>14} | {size_name(nbytes):>8} | {ns:10.0f} | {model:10.0f} | {busbw:6.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="trn2", choices=["trn2", "trn3"])
    parser.add_argument("--measure", action="store_true", help="also time 2 real ranks")
    args = parser.parse_args()
    model_table(args.target)
    if args.measure:
        os.environ["TORCHNEURON_TARGET"] = args.target
        measure([s for s in SIZES if s <= 4 << 20])


if __name__ == "__main__":
    main()
