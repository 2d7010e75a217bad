"""Train a small GPT-style model on the Trainium engine model: an ordinary training loop, with
``model.compile()`` after ``set_default_backend("neuron")`` as the one change.

    .venv/bin/python examples/train.py [--steps 20] [--target trn3] [--bf16]

Prints, per step, the loss and the modeled device time of that step's kernels (forward and
backward; the optimizer step runs in eager PyTorch and is counted in ``torchneuron.stats()``).
The task (the next token is the current one plus 1) is easy, so the loss falls quickly: the
script exits with status 1 if a loss is not finite, or if it did not fall over 10 or more steps.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

import torchneuron


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, vocab: int = 96, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(64, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout=0.1) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def batch(g: torch.Generator, size: int = 8, length: int = 32, vocab: int = 96) -> torch.Tensor:
    """Runs of consecutive tokens from random starts: the next token is this one plus 1."""
    start = torch.randint(0, vocab, (size, 1), generator=g)
    return (start + torch.arange(length + 1)) % vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--target", default="trn2", choices=["trn2", "trn3"])
    parser.add_argument("--bf16", action="store_true", help="torch.autocast to bfloat16")
    args = parser.parse_args()

    torch.manual_seed(0)  # also seeds dropout's device random numbers
    torchneuron.set_default_backend("neuron")
    model = GPT().train()
    model.compile(options={"target": args.target})
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)

    print(f"training on the {args.target} engine model ({'bf16 autocast' if args.bf16 else 'f32'})")
    losses = []
    for step in range(args.steps):
        data = batch(g)
        with torchneuron.profile() as prof:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = model(data[:, :-1], data[:, 1:])
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        print(
            f"step {step:3d}  loss {loss.item():.4f}  "
            f"modeled device time {prof.total_device_ns / 1e3:8.1f} us "
            f"({len(prof.kernels)} kernels)"
        )
    s = torchneuron.stats()
    print(
        f"graphs compiled: {s['graphs_compiled']}, ops on device: {s['ops_on_device']}, "
        f"kernels run: {s['kernels_run']}, eager: {s['ops_fallback'] or 'nothing'}"
    )
    torchneuron.set_default_backend(None)
    if not all(math.isfinite(x) for x in losses):
        sys.exit(f"FAILED: a loss is not finite: {losses}")
    if len(losses) >= 10 and not losses[-1] < losses[0]:
        sys.exit(f"FAILED: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")


if __name__ == "__main__":
    main()
