"""One rank of a test_distributed.py run: ``python distributed_worker.py SCENARIO OUT_DIR``
with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

It writes ``OUT_DIR/rank<r>.pt``: a dict of results that the test compares (tensors on the
CPU). Scenarios:

- ``collectives``: ``init_process_group()`` with no backend (the accelerator's backend:
  ``neuron``); every collective on neuron tensors and the same one on CPU tensors over a Gloo
  group; the modeled time on the stream and in the profilers; DDP training of a
  small MLP and the same training in one process.
- ``parallel``: FSDP2 and tensor parallelism (with sequence parallelism) training a
  transformer MLP block, each against the same training in one process.
- ``mesh_2d`` (4 ranks): FSDP x tensor parallelism over a 2 x 2 device mesh.
- ``dies``: ``init_process_group("neuron")``; rank 1 exits abruptly after one all_reduce, rank
  0's next all_reduce must raise; rank 0 records the error and how long it took.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import torchneuron
from torchneuron import distributed as neuron_dist

# torch 2.13 deprecates all_gather_into_tensor/reduce_scatter_tensor names in favour of *_single.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*barrier\\(\\): using the device.*")

Results = dict[str, Any]


def cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, list | tuple):
        return [cpu(v) for v in x]
    return x


#: The process group of each device type: the default group (neuron) and a Gloo one (cpu).
GROUPS: dict[str, Any] = {}


def group(d: torch.device) -> Any:
    return GROUPS[d.type]


def both(results: Results, name: str, fn: Callable[[torch.device], Any], dev: torch.device) -> None:
    """``fn`` on neuron tensors (the neuron backend) and on CPU tensors (Gloo)."""
    results[name] = (cpu(fn(dev)), cpu(fn(torch.device("cpu"))))


def collectives(rank: int, world: int, dev: torch.device, results: Results) -> None:
    # Inputs are copied (.to(d, copy=True)): on the CPU, .to() would return `base` itself and the
    # in-place collectives would change it for the next one.
    g = torch.Generator().manual_seed(100 + rank)
    base = torch.randn(6, generator=g)
    ints = torch.randint(-50, 50, (5,), generator=g)

    def reduce(op: dist.ReduceOp, t: torch.Tensor) -> Callable[[torch.device], torch.Tensor]:
        def run(d: torch.device) -> torch.Tensor:
            x = t.to(d, copy=True)
            dist.all_reduce(x, op=op, group=group(d))
            return x

        return run

    for name, op in [
        ("sum", dist.ReduceOp.SUM),
        ("max", dist.ReduceOp.MAX),
        ("min", dist.ReduceOp.MIN),
        ("product", dist.ReduceOp.PRODUCT),
    ]:
        both(results, f"all_reduce_{name}", reduce(op, base), dev)
    both(results, "all_reduce_sum_int64", reduce(dist.ReduceOp.SUM, ints), dev)
    both(results, "all_reduce_sum_bf16", reduce(dist.ReduceOp.SUM, base.bfloat16()), dev)

    # Gloo has no AVG: the reference is the CPU sum divided by the group size.
    x = base.to(dev)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    ref = base.clone()
    dist.all_reduce(ref, group=GROUPS["cpu"])
    results["all_reduce_avg"] = (cpu(x), ref / world)

    def all_gather(d: torch.device) -> list[torch.Tensor]:
        out = [torch.empty(6, device=d) for _ in range(world)]
        dist.all_gather(out, base.to(d, copy=True), group=group(d))
        return out

    def all_gather_into_tensor(d: torch.device) -> torch.Tensor:
        out = torch.empty(world * 6, device=d)
        dist.all_gather_into_tensor(out, base.to(d, copy=True), group=group(d))
        return out

    def reduce_scatter_tensor(d: torch.device) -> torch.Tensor:
        out = torch.empty(3, device=d)
        dist.reduce_scatter_tensor(out, base.to(d, copy=True), group=group(d))
        return out

    def reduce_scatter(d: torch.device) -> torch.Tensor:
        out = torch.empty(3, device=d)
        dist.reduce_scatter(out, list(base.to(d, copy=True).chunk(world)), group=group(d))
        return out

    def broadcast(d: torch.device) -> torch.Tensor:
        x = base.to(d, copy=True)
        dist.broadcast(x, src=1, group=group(d))
        return x

    def all_to_all_single(d: torch.device) -> torch.Tensor:
        out = torch.empty(6, device=d)
        dist.all_to_all_single(out, base.to(d, copy=True), group=group(d))
        return out

    def all_to_all_uneven(d: torch.device) -> torch.Tensor:
        # Rank 0 sends 1 element to itself and 2 to rank 1; rank 1 sends 2 to rank 0 and 1 to
        # itself: each receives what it sends, in sizes.
        splits = [1, 2] if rank == 0 else [2, 1]
        out = torch.empty(3, device=d)
        dist.all_to_all_single(out, base[:3].to(d, copy=True), splits, splits, group=group(d))
        return out

    def all_to_all(d: torch.device) -> list[torch.Tensor]:
        out = [torch.empty(3, device=d) for _ in range(world)]
        dist.all_to_all(out, list(base.to(d, copy=True).chunk(world)), group=group(d))
        return out

    def send_recv(d: torch.device) -> torch.Tensor:
        x = base.to(d, copy=True)
        if rank == 0:
            dist.send(x, dst=1, group=group(d))
            dist.recv(x, src=1, group=group(d))
        else:
            dist.recv(x, src=0, group=group(d))
            x += 1
            dist.send(x, dst=0, group=group(d))
        return x

    def reduce_to_root(d: torch.device) -> torch.Tensor:
        x = base.to(d, copy=True)
        dist.reduce(x, dst=1, group=group(d))
        return x if rank == 1 else torch.empty(0)  # only the root's result is defined

    def gather(d: torch.device) -> list[torch.Tensor]:
        out = [torch.empty(6, device=d) for _ in range(world)] if rank == 0 else None
        dist.gather(base.to(d, copy=True), out, dst=0, group=group(d))
        return out or []

    def scatter(d: torch.device) -> torch.Tensor:
        out = torch.empty(3, device=d)
        pieces = list(base.to(d, copy=True).chunk(world)) if rank == 1 else None
        dist.scatter(out, pieces, src=1, group=group(d))
        return out

    def async_all_reduce(d: torch.device) -> list[Any]:
        x = base.to(d, copy=True)
        work = dist.all_reduce(x, async_op=True, group=group(d))
        work.wait()
        fut = work.get_future().wait()
        return [x, fut[0], str(fut[0].device.type)]

    for fn in [
        all_gather,
        all_gather_into_tensor,
        reduce_scatter_tensor,
        reduce_scatter,
        broadcast,
        all_to_all_single,
        all_to_all_uneven,
        all_to_all,
        send_recv,
        reduce_to_root,
        gather,
        scatter,
        async_all_reduce,
    ]:
        both(results, fn.__name__, fn, dev)

    out = torch.empty(3, device=dev)
    dist.reduce_scatter_tensor(out, base.to(dev), op=dist.ReduceOp.AVG)
    ref = torch.empty(3)
    dist.reduce_scatter_tensor(ref, base, group=GROUPS["cpu"])
    results["reduce_scatter_tensor_avg"] = (cpu(out), ref / world)
    dist.barrier()

    world_group = dist.group.WORLD
    assert world_group is not None
    results["backend_for_neuron"] = world_group._get_backend(dev).name()


def modeled_time(rank: int, world: int, dev: torch.device, results: Results) -> None:
    """Events around a collective measure its modeled duration; profilers see it."""
    x = torch.ones(1 << 16, device=dev)
    start = torch.Event(device=dev, enable_timing=True)
    end = torch.Event(device=dev, enable_timing=True)
    start.record()
    dist.all_reduce(x)
    end.record()
    expected = neuron_dist.collective_cost("all_reduce", x.nbytes, list(range(world)))
    results["all_reduce_event_ns"] = start.elapsed_time(end) * 1e6
    results["all_reduce_model_ns"] = expected["duration_ns"]

    out = torch.empty(world * x.numel(), device=dev)
    issued = torch.Event(device=dev, enable_timing=True)
    start.record()
    work = dist.all_gather_into_tensor(out, x, async_op=True)
    issued.record()  # the stream goes on without it until it is waited for
    work.wait()
    end.record()
    results["all_gather_issued_ns"] = start.elapsed_time(issued) * 1e6
    results["all_gather_event_ns"] = start.elapsed_time(end) * 1e6
    results["all_gather_model_ns"] = neuron_dist.collective_cost(
        "all_gather", out.nbytes, list(range(world))
    )["duration_ns"]

    with torchneuron.profile() as prof:
        dist.all_reduce(x)
    results["profile_runs"] = [
        (k["name"], k["bytes"], k["device_ns"], k["bound"])
        for k in prof.kernels
        if k["name"] == "all_reduce"
    ]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        dist.broadcast(x, src=0)
    results["torch_profiler_names"] = sorted({e.name for e in p.events()})

    # An async all_reduce under a matmul that does not need it, in one trace for both ranks.
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(3)).to(dev)
    with torchneuron.profile() as prof:
        work = dist.all_reduce(x, async_op=True)
        a @ a
        work.wait()
    trace = Path(os.environ["TRACE_DIR"]) / "merged.json"
    prof.export_chrome_trace(trace, all_ranks=True)
    dist.barrier()
    if rank == 0:
        results["merged_trace"] = json.loads(trace.read_text())["traceEvents"]


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def train_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(3, 8, 8, generator=g), torch.randn(3, 8, 4, generator=g)


def ddp(rank: int, world: int, dev: torch.device, results: Results) -> None:
    """DDP on 2 ranks (half of each batch each) against one process on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel

    xs, ys = train_data()

    torch.manual_seed(0)
    single = MLP().to(dev)
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    single_losses = []
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(single(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        single_losses.append(loss.item())

    torch.manual_seed(rank)  # DDP broadcasts rank 0's parameters: they must not start equal
    model = MLP().to(dev)
    if rank == 0:
        torch.manual_seed(0)
        model.load_state_dict(MLP().state_dict())
    net = DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    half = xs.shape[1] // world
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        part = slice(rank * half, (rank + 1) * half)
        loss = torch.nn.functional.mse_loss(net(x[part].to(dev)), y[part].to(dev))
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    results["ddp_losses"] = (losses, single_losses)
    results["ddp_params"] = (
        [cpu(p) for p in model.parameters()],
        [cpu(p) for p in single.parameters()],
    )
    results["ddp_grad_devices"] = sorted({str(p.grad.device.type) for p in model.parameters()})


class Block(torch.nn.Module):
    """A transformer MLP block: what tensor parallelism splits (norm, up, down)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def block_data() -> torch.Tensor:
    """Three steps of (batch 4, sequence 8, width 16) inputs."""
    return torch.randn(3, 4, 8, 16, generator=torch.Generator().manual_seed(7))


def train_block(
    model: torch.nn.Module, dev: torch.device, part: Callable[[torch.Tensor], torch.Tensor]
) -> list[float]:
    """AdamW steps of the block on ``part`` of each input; the loss is the mean square over
    the whole input, so each rank's share adds up to it (summed over the ranks that hold
    different parts)."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for x in block_data():
        out = model(part(x).to(dev))
        loss = out.pow(2).sum() / x.numel()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
    return [float(v) for v in losses]


def single_block(dev: torch.device) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Block().to(dev)
    losses = train_block(model, dev, lambda x: x)
    return losses, {k: cpu(v) for k, v in model.state_dict().items()}


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of a model whose parameters may be DTensors, whole, on the CPU."""
    from torch.distributed.tensor import DTensor

    return {
        k: cpu(v.full_tensor() if isinstance(v, DTensor) else v)
        for k, v in model.state_dict().items()
    }


def summed(losses: list[float], group: Any = None) -> list[float]:
    t = torch.tensor(losses, device="neuron")
    dist.all_reduce(t, group=group)
    return t.tolist()


def fsdp(rank: int, world: int, dev: torch.device, results: Results) -> None:
    """FSDP2 (``fully_shard``) on the batch split over the ranks, against one process."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    results["fsdp_single"] = single_block(dev)
    torch.manual_seed(0)
    model = Block().to(dev)
    fully_shard(model.up)
    fully_shard(model.down)
    fully_shard(model)
    weight = model.up.weight
    assert isinstance(weight, DTensor)
    results["fsdp_shard"] = (tuple(weight.to_local().shape), weight.to_local().device.type)
    rows = 4 // world
    losses = train_block(model, dev, lambda x: x[rank * rows : (rank + 1) * rows])
    results["fsdp"] = (summed(losses), full_state(model))

    # The same under torch.compile: the compute compiles, FSDP's hooks (Dynamo skips them by
    # default) gather and reduce-scatter in eager.
    torch.manual_seed(0)
    model = Block().to(dev)
    fully_shard(model)
    compiled = torch.compile(model, backend="neuron")
    losses = train_block(compiled, dev, lambda x: x[rank * rows : (rank + 1) * rows])
    results["fsdp_compiled"] = (summed(losses), full_state(model))
    results["compiled_graphs"] = torchneuron.stats()["graphs_compiled"]  # the cache is off


def tensor_parallel(rank: int, world: int, dev: torch.device, results: Results) -> None:
    """Megatron-style tensor parallelism with sequence parallelism (the plan Llama models use:
    the norm on sequence shards, ``up`` column-wise, ``down`` row-wise back to sequence
    shards) against one process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    results["tp_single"] = single_block(dev)
    torch.manual_seed(0)
    model = Block().to(dev)
    mesh = init_device_mesh("neuron", (world,))
    parallelize_module(
        model,
        mesh,
        {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
        },
    )
    results["tp_up_shard"] = tuple(model.up.weight.to_local().shape)
    seq = 8 // world
    losses = train_block(model, dev, lambda x: x[:, rank * seq : (rank + 1) * seq])
    results["tp"] = (summed(losses), full_state(model))


def mesh_2d(rank: int, world: int, dev: torch.device, results: Results) -> None:
    """FSDP over the ``dp`` dimension of a 2 x (world/2) mesh, tensor parallelism over
    ``tp``: each dp group gets half of the batch, whole sequences."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    results["mesh_single"] = single_block(dev)
    torch.manual_seed(0)
    model = Block().to(dev)
    mesh = init_device_mesh("neuron", (2, world // 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    dp = mesh["dp"].get_local_rank()
    rows = 2
    losses = train_block(model, dev, lambda x: x[dp * rows : (dp + 1) * rows])
    # Each dp group's loss is its half's share; the tp ranks of a group hold the same one.
    results["mesh"] = (summed(losses, mesh["dp"].get_group()), full_state(model))
    results["mesh_up_local"] = tuple(model.up.weight.to_local().shape)


def ddp_overlap(rank: int, world: int, dev: torch.device, results: Results) -> None:
    """The modeled time of a DDP backward whose gradient buckets all-reduce while the rest of
    the backward runs, against the same backward with free collectives."""
    from torch.nn.parallel import DistributedDataParallel

    def deep() -> torch.nn.Module:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(6):
            layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
        return torch.nn.Sequential(*layers).to(dev)

    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(rank)).to(dev)

    def backward_ns(model: torch.nn.Module) -> float:
        loss = model(x).pow(2).mean()
        torch.neuron.synchronize()
        start = torch.Event(device=dev, enable_timing=True)
        end = torch.Event(device=dev, enable_timing=True)
        start.record()
        loss.backward()
        end.record()
        return start.elapsed_time(end) * 1e6

    # The same DDP backward in a group of one rank: the same bucket copies, collectives that
    # cost nothing. 256 KiB buckets: a bucket per layer (each layer's weight is 256 KiB).
    alone_groups = [dist.new_group([r]) for r in range(world)]
    alone = DistributedDataParallel(deep(), bucket_cap_mb=0.3, process_group=alone_groups[rank])
    backward_ns(alone)  # compile the kernels first
    results["backward_alone_ns"] = backward_ns(alone)
    net = DistributedDataParallel(deep(), bucket_cap_mb=0.3)
    backward_ns(net)
    with torchneuron.profile() as prof:
        results["backward_ddp_ns"] = backward_ns(net)
    results["ddp_all_reduce_ns"] = [
        k["device_ns"] for k in prof.kernels if k["name"] == "all_reduce"
    ]


def main() -> None:
    scenario, out_dir = sys.argv[1], Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dev = torch.device("neuron", torch.neuron.current_device())
    results: Results = {}
    if scenario == "collectives":
        dist.init_process_group(timeout=timedelta(seconds=30))
        GROUPS["neuron"] = dist.group.WORLD
        GROUPS["cpu"] = dist.new_group(backend="gloo", timeout=timedelta(seconds=30))
        collectives(rank, world, dev, results)
        modeled_time(rank, world, dev, results)
        ddp(rank, world, dev, results)
        ddp_overlap(rank, world, dev, results)
        dist.destroy_process_group()
    elif scenario == "parallel":
        dist.init_process_group(timeout=timedelta(seconds=60))
        fsdp(rank, world, dev, results)
        tensor_parallel(rank, world, dev, results)
        results["fallbacks"] = torchneuron.stats()["ops_fallback"]
        dist.destroy_process_group()
    elif scenario == "mesh_2d":
        dist.init_process_group(timeout=timedelta(seconds=60))
        mesh_2d(rank, world, dev, results)
        results["fallbacks"] = torchneuron.stats()["ops_fallback"]
        dist.destroy_process_group()
    elif scenario == "dies":
        dist.init_process_group("neuron", timeout=timedelta(seconds=20))
        results["backend"] = dist.get_backend()
        x = torch.ones(4, device=dev)
        dist.all_reduce(x)
        on_cpu = torch.full((2,), float(rank + 1))  # a neuron group's CPU tensors go to Gloo
        dist.all_reduce(on_cpu)
        results["cpu_all_reduce"] = on_cpu
        if rank == 1:
            os._exit(3)  # no goodbye: the peer must notice on its own
        time.sleep(0.5)
        began = time.monotonic()
        try:
            dist.all_reduce(x)
            results["error"] = None
        except Exception as e:
            results["error"] = (type(e).__name__, str(e), [c.__name__ for c in type(e).__mro__])
        results["seconds"] = time.monotonic() - began
        torch.save(results, out_dir / f"rank{rank}.pt")
        os._exit(0)  # the group's peer is gone: skip its teardown
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    torch.save(results, out_dir / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
