"""One rank of a test_compiled_collectives.py run:
``python compiled_collectives_worker.py OUT_DIR`` with torchrun's environment.

Functional collectives inside ``torch.compile(backend="neuron")`` graphs: a function with an
all_reduce between two matmuls, all_gather_into_tensor and reduce_scatter_tensor, and a
tensor-parallel MLP (ColwiseParallel then RowwiseParallel over a 1-D neuron mesh). Each
compiled result is saved next to the eager one, with ``torchneuron.stats()`` and, from a
Chrome trace of the compiled run, the intervals of the collective on ``neuronlink`` and of
the matmuls on TensorE. Writes ``OUT_DIR/rank<r>.pt``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import torchneuron


def trace_intervals(p: Any) -> dict[str, list[tuple[float, float]]]:
    """``{"neuronlink": [...], "tensor": [...]}``: (start, end) us of the trace's events."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        p.export_chrome_trace(path)
        events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    out: dict[str, list[tuple[float, float]]] = {"neuronlink": [], "tensor": []}
    for e in events:
        track = names.get(e.get("tid", -1))
        if e.get("ph") == "X" and track in out:
            out[track].append((e["ts"], e["ts"] + e["dur"]))
    return out


def done(t: torch.Tensor) -> torch.Tensor:
    """An eager functional collective's result once it is there (an AsyncCollectiveTensor
    on the CPU is its still-unfinished buffer)."""
    if isinstance(t, funcol.AsyncCollectiveTensor):
        t = t.wait()
    return t.cpu()


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dev = torch.device("neuron", torch.neuron.current_device())
    dist.init_process_group(timeout=timedelta(seconds=30))
    group = dist.group.WORLD
    results: dict[str, Any] = {}

    def overlapped(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        y = x @ w1
        z = funcol.all_reduce(y, "sum", group)
        # Independent of the all_reduce, and longer than its wait for y: 16 N tiles of
        # 512 columns, TensorE paced by w2's 4 MB.
        u = torch.relu(x @ w2).unflatten(1, (64, 128)).sum(1)
        return z + u

    def gather_scatter(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = funcol.all_gather_tensor(x, 0, group)
        s = funcol.reduce_scatter_tensor(x * 2, "sum", 0, group)
        a = funcol.all_reduce(x, "avg", group)
        return g, s, a

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(128, 128, generator=gen) + rank).to(dev)
    w1 = torch.randn(128, 128, generator=gen).to(dev)
    w2 = torch.randn(128, 8192, generator=gen).to(dev)
    small = (torch.randn(8, 16, generator=gen) * (rank + 1)).to(dev)

    results["overlapped_eager"] = overlapped(x, w1, w2).cpu()
    # Eager reference on CPU tensors (the group's Gloo backend): the neuron backend has no
    # coalesced all_gather, which eager functional all_gather uses.
    results["gather_scatter_eager"] = [done(t) for t in gather_scatter(small.cpu())]
    torchneuron.reset_stats()
    compiled = torch.compile(overlapped, backend="neuron")
    compiled(x, w1, w2)  # compile
    with torchneuron.profile() as p:
        results["overlapped_compiled"] = compiled(x, w1, w2).cpu()
    results["overlapped_trace"] = trace_intervals(p)
    results["gather_scatter_compiled"] = [
        t.cpu() for t in torch.compile(gather_scatter, backend="neuron")(small)
    ]
    results["functional_stats"] = torchneuron.stats()

    # Tensor parallelism: every rank builds the same full weights and keeps its shard.
    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(32, 64)
            self.down = torch.nn.Linear(64, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(1)
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    mlp = parallelize_module(
        MLP().to(dev),
        mesh,
        {"up": ColwiseParallel(), "down": RowwiseParallel()},
        src_data_rank=None,
    )
    inp = torch.randn(8, 32, generator=gen).to(dev)
    results["tp_eager"] = mlp(inp).cpu()
    torchneuron.reset_stats()
    results["tp_compiled"] = torch.compile(mlp, backend="neuron")(inp).cpu()
    results["tp_stats"] = torchneuron.stats()

    dist.destroy_process_group()
    torch.save(results, out_dir / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
