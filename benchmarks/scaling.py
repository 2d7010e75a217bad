"""Scaling of a Llama decoder layer's training step over neuron ranks, modeled.

Run from the repository root, after ``scripts/setup.sh``:

    .venv/bin/python benchmarks/scaling.py                     # TP, DDP, FSDP on 1-8 ranks
    .venv/bin/python benchmarks/scaling.py --modes tp --ranks 1 2 4 8 --target trn3

Each configuration launches its ranks as processes (``torch.multiprocessing``, the ``neuron``
process group over Gloo on 127.0.0.1; rank ``r`` on NeuronCore ``r`` of one chip) and times
one training step of the benchmark's Llama-style decoder layer (``kernels.py``'s
``DecoderLayer``: RMSNorm, causal SDPA, SiLU-gated MLP; bf16, eager on the device) after a
warm-up step: forward, backward and AdamW, from device events on rank 0's stream, so the
figure is the modeled device time including the collectives the parallelism issues and
whatever of them the backward overlaps.

- ``tp``: tensor parallelism (``ColwiseParallel`` q/k/v/gate/up, ``RowwiseParallel`` o/down,
  the heads split over the ranks), one batch for all ranks: strong scaling, efficiency
  ``T(1) / (n * T(n))``.
- ``ddp`` and ``fsdp``: ``DistributedDataParallel`` and FSDP2 (``fully_shard``), a batch per
  rank: weak scaling, efficiency ``T(1) / T(n)``.

"collectives" is the modeled time of the step's collectives on rank 0 (from
``torchneuron.profile()``), serialized; the step hides part of it behind compute. The
engine model computes real numbers on the host, so 8 ranks of the default size take a minute
or two on a small machine.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels import DecoderLayer  # noqa: E402


def _rank(rank: int, world: int, port: int, mode: str, args: Any, out: Any) -> None:
    import torch.distributed as dist

    import torchneuron

    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("neuron", rank=rank, world_size=world)
    torch.neuron.set_device(rank)
    dev = torch.device("neuron", rank)

    torch.manual_seed(0)
    layer = DecoderLayer(args.hidden, args.heads, args.intermediate).to(dev, torch.bfloat16)
    if mode == "tp" and world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        columns, rows = ColwiseParallel(), RowwiseParallel()
        plan = dict.fromkeys(["q_proj", "k_proj", "v_proj", "mlp.gate", "mlp.up"], columns)
        plan.update(dict.fromkeys(["o_proj", "mlp.down"], rows))
        parallelize_module(layer, init_device_mesh("neuron", (world,)), plan)
    elif mode == "ddp" and world > 1:
        from torch.nn.parallel import DistributedDataParallel

        layer = DistributedDataParallel(layer)
    elif mode == "fsdp" and world > 1:
        from torch.distributed.fsdp import fully_shard

        fully_shard(layer)
    # Sharded (DTensor) and plain parameters in separate groups: AdamW's foreach kernels take
    # one kind per group (tensor parallelism leaves the norms' weights plain).
    from torch.distributed.tensor import DTensor

    params = list(layer.parameters())
    groups = [
        [p for p in params if isinstance(p, DTensor)],
        [p for p in params if not isinstance(p, DTensor)],
    ]
    opt = torch.optim.AdamW([{"params": g} for g in groups if g], lr=1e-4)
    gen = torch.Generator().manual_seed(rank if mode != "tp" else 0)
    x = torch.randn(args.batch, args.seq, args.hidden, generator=gen).to(dev, torch.bfloat16)

    def step() -> None:
        loss = layer(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # compiles the eager kernels
    start = torch.Event(device=dev, enable_timing=True)
    end = torch.Event(device=dev, enable_timing=True)
    torch.neuron.synchronize()
    with torchneuron.profile() as prof:
        start.record()
        step()
        end.record()
    collectives = sum(k["device_ns"] for k in prof.kernels if k["bound"] == "neuronlink")
    if rank == 0:
        fallbacks = torchneuron.stats()["ops_fallback"]
        out.put((start.elapsed_time(end) * 1e6, collectives, fallbacks))
    dist.destroy_process_group()


def run(mode: str, world: int, args: Any) -> tuple[float, float, dict[str, int]]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, mode, args, out)) for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        while True:  # a rank that fails ends the run instead of leaving the others waiting
            try:
                return out.get(timeout=1)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise SystemExit(f"{mode} on {world} ranks: a rank failed") from None
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["tp", "ddp", "fsdp"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--target", default="trn2", choices=["trn2", "trn3"])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    os.environ["TORCHNEURON_TARGET"] = args.target
    # DDP's logger warns that it times only CPU and CUDA devices, once per rank and run.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.pop("TORCHNEURON_VISIBLE_CORES", None)

    print(
        f"Llama decoder layer, hidden {args.hidden}, {args.heads} heads, MLP "
        f"{args.intermediate}, batch {args.batch} x {args.seq} tokens per "
        f"{'step (tp)' if 'tp' in args.modes else 'rank'}, bf16, {args.target}; "
        "modeled device time of one training step on rank 0"
    )
    header = (
        f"{'mode':>5} | {'ranks':>5} | {'step (us)':>10} | {'collectives (us)':>16} | "
        f"{'tokens/s':>10} | efficiency"
    )
    print(header)
    print("-" * len(header))
    tokens = args.batch * args.seq
    for mode in args.modes:
        base = None
        for world in args.ranks:
            step_ns, comm_ns, fallbacks = run(mode, world, args)
            base = base or step_ns
            if mode == "tp":
                efficiency = base / (world * step_ns)
                rate = tokens / (step_ns * 1e-9)
            else:
                efficiency = base / step_ns
                rate = world * tokens / (step_ns * 1e-9)
            note = f"  fallbacks: {fallbacks}" if fallbacks else ""
            print(
                f"{mode:>5} | {world:>5} | {step_ns / 1e3:10.1f} | {comm_ns / 1e3:16.1f} | "
                f"{rate:10.0f} | {efficiency:9.0%}{note}",
                flush=True,
            )


if __name__ == "__main__":
    main()
