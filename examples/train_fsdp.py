"""Train a small Llama-style model with FSDP2 on neuron devices, optionally with tensor
parallelism on a 2-D mesh: ordinary torch.distributed code, with "neuron" as the device.

    torchrun --nproc-per-node=4 examples/train_fsdp.py              # FSDP over 4 ranks
    torchrun --nproc-per-node=4 examples/train_fsdp.py --tp 2       # 2 (FSDP) x 2 (TP) mesh
    torchrun --nproc-per-node=2 examples/train_fsdp.py --tp 2       # tensor parallelism only

Each rank owns one NeuronCore of the modeled chip (``LOCAL_RANK``); ``init_process_group()``
picks the ``neuron`` backend for neuron tensors. Tensor parallelism splits attention heads and
MLP columns (``ColwiseParallel``/``RowwiseParallel``, as Megatron and torchtitan do) over the
``tp`` dimension of the mesh; FSDP2 (``fully_shard``) shards every layer's parameters over the
``dp`` dimension, gathering them before use and reduce-scattering the gradients. Each data
parallel group reads its own part of the batch.

Rank 0 prints per step the loss and the modeled device time of the step on its NeuronCore
(kernels, copies and collectives, from device events). The task (the next token is the
current one plus 1) is easy: the script exits with status 1 if a loss is not finite or the loss
did not fall, or if any op fell back to the CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchneuron


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Layer(nn.Module):
    def __init__(self, dim: int, head_dim: int, hidden: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        # -1 heads: under tensor parallelism each rank holds a share of them.
        q = self.q_proj(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, -1))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Model(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, context: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.layers = nn.ModuleList(Layer(dim, 16, 4 * dim) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


TP_PLAN = {
    **dict.fromkeys(["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"], ColwiseParallel()),
    **dict.fromkeys(["o_proj", "down_proj"], RowwiseParallel()),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per group")
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    args = parser.parse_args()

    torch.neuron.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the {world} ranks")
    dp = world // args.tp
    mesh = init_device_mesh("neuron", (dp, args.tp), mesh_dim_names=("dp", "tp"))
    dev = torch.device("neuron", torch.neuron.current_device())

    vocab, context = 64, 32
    torch.manual_seed(0)  # every rank starts from the same model
    model = Model(vocab, dim=64, layers=2, context=context).to(dev)
    for layer in model.layers:
        if args.tp > 1:
            parallelize_module(layer, mesh["tp"], TP_PLAN)
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    # Each dp group trains on its slice of the global batch; its tp ranks see the same one.
    per_group = args.batch // dp
    gen = torch.Generator().manual_seed(1234)
    start = torch.Event(device=dev, enable_timing=True)
    end = torch.Event(device=dev, enable_timing=True)
    losses = []
    for step in range(args.steps):
        first = torch.randint(0, vocab, (args.batch, 1), generator=gen)
        seq = (first + torch.arange(context + 1)) % vocab
        part = seq[mesh["dp"].get_local_rank() * per_group :][:per_group].to(dev)
        start.record()
        logits = model(part[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), part[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        end.record()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
        if rank == 0:
            print(
                f"step {step:3d}  loss {losses[-1]:.4f}  "
                f"device {start.elapsed_time(end) * 1e3:8.1f} us",
                flush=True,
            )

    fallbacks = torchneuron.stats()["ops_fallback"]
    dist.destroy_process_group()
    if rank != 0:
        return 0
    print(f"mesh: {dp} (FSDP) x {args.tp} (TP); CPU fallbacks: {fallbacks or 'none'}")
    if not all(math.isfinite(v) for v in losses):
        print("FAILED: a loss is not finite", file=sys.stderr)
        return 1
    if losses[-1] >= losses[0]:
        print(
            f"FAILED: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})", file=sys.stderr
        )
        return 1
    if fallbacks:
        print(f"FAILED: ops fell back to the CPU: {fallbacks}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
