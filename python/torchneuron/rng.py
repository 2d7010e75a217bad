"""Random numbers on the device, reproducible with ``torch.manual_seed``.

A graph that draws random numbers (``aten.rand``/``aten.rand_like``, e.g. from dropout in
training mode) gets them from :func:`philox_rand`, the op ``torchneuron::philox_rand``: uniform
numbers in [0, 1) that are a pure function of a seed, a stream number and each element's
row-major index, computed with Philox4x32-10 (docs/PROGRAM_FORMAT.md, ``rand``). The device
computes them with its ``rand`` instruction; the op's CPU kernel here computes the same numbers,
bit for bit, when the op stays in eager PyTorch.

The seed is drawn from torch's default CPU generator each time the graph runs
(:func:`next_seed`, two int32 words), so ``torch.manual_seed`` reproduces a run. The numbers
are not eager PyTorch's (its CPU generator is an MT19937 stream consumed in order), but they
have the same distribution: uniform on the 2^24 multiples of 2^-24 in [0, 1). A run also
advances torch's generator differently from eager (one small draw per graph run instead of
one number per element), so later eager random calls see different numbers too.

Importing this module registers the op with ``torch.library``; the backend imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx

from torchneuron.specialize import has_symbols

__all__ = ["RANDOM_TARGETS", "next_seed", "philox_rand", "philox_uniform", "seed_random_ops"]

_aten = torch.ops.aten

#: The ops that draw uniform random numbers, replaced by :func:`seed_random_ops`.
RANDOM_TARGETS: frozenset[object] = frozenset({_aten.rand.default, _aten.rand_like.default})

_MASK = 0xFFFFFFFF


def philox_uniform(seed: Sequence[int], stream: int, count: int) -> torch.Tensor:
    """Elements ``0 .. count-1`` of stream ``stream`` under key ``seed`` (two int32 words), as
    float32: the first word of Philox4x32-10 of the counter (i mod 2^32, i div 2^32, stream, 0),
    its top 24 bits over 2^24."""
    import numpy as np

    u64 = np.uint64
    index = np.arange(count, dtype=u64)
    c0, c1 = index & u64(_MASK), index >> u64(32)
    c2 = np.full(count, stream & _MASK, dtype=u64)
    c3 = np.zeros(count, dtype=u64)
    k0, k1 = u64(seed[0] & _MASK), u64(seed[1] & _MASK)
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + u64(0x9E3779B9)) & u64(_MASK), (k1 + u64(0xBB67AE85)) & u64(_MASK)
        p0, p1 = u64(0xD2511F53) * c0, u64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> u64(32)) ^ c1 ^ k0, p1 & u64(_MASK), (p0 >> u64(32)) ^ c3 ^ k1, p0
        c3 &= u64(_MASK)
    values = (c0 >> u64(8)).astype(np.float32) * np.float32(2.0**-24)
    return torch.from_numpy(values)


@torch.library.custom_op("torchneuron::philox_rand", mutates_args=())
def philox_rand(
    seed: torch.Tensor, stream: int, size: list[int], dtype: torch.dtype
) -> torch.Tensor:
    """Uniform [0, 1) numbers of shape ``size``: :func:`philox_uniform` under ``seed`` (int32
    ``[2]``), rounded to ``dtype``. The device's ``rand`` gives the same numbers."""
    if seed.dtype != torch.int32 or seed.shape != (2,):
        raise ValueError(
            f"philox_rand: the seed must be int32 [2], got {seed.dtype}{list(seed.shape)}"
        )
    count = 1
    for d in size:
        count *= d
    words = [int(w) for w in seed.tolist()]
    return philox_uniform(words, stream, count).reshape(size).to(dtype)


@philox_rand.register_fake
def _philox_rand_fake(
    seed: torch.Tensor, stream: int, size: list[int], dtype: torch.dtype
) -> torch.Tensor:
    return seed.new_empty(size, dtype=dtype)


def next_seed() -> torch.Tensor:
    """Two int32 words from torch's default CPU generator: the seed of one graph run."""
    return torch.randint(-(2**31), 2**31, (2,), dtype=torch.int32)


def seed_random_ops(gm: torch.fx.GraphModule, seed: torch.fx.Node | None = None) -> int:
    """Replace every ``aten.rand``/``aten.rand_like`` of a concrete float shape in ``gm`` by
    ``philox_rand(seed, stream, size, dtype)`` (in place), one stream per op, under ``seed``
    (an int32 ``[2]`` node; by default one :func:`next_seed` call per run of the graph).
    Returns how many were replaced; others (a ``generator`` argument, a symbolic size) stay
    as they are."""
    randoms = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target in RANDOM_TARGETS
        and n.kwargs.get("generator") is None
        and isinstance(n.meta.get("val"), torch.Tensor)
        and n.meta["val"].is_floating_point()
        and not has_symbols(n.meta["val"])
    ]
    if not randoms:
        return 0
    if seed is None:
        # At the top: the seed depends on nothing, and no device region is split around it.
        first = next(n for n in gm.graph.nodes if n.op != "placeholder")
        with gm.graph.inserting_before(first):
            seed = gm.graph.call_function(next_seed)
        seed.meta["val"] = torch.empty(2, dtype=torch.int32)
    for stream, node in enumerate(randoms):
        value = node.meta["val"]
        with gm.graph.inserting_before(node):
            replacement = gm.graph.call_function(
                torch.ops.torchneuron.philox_rand.default,
                (seed, stream, [int(d) for d in value.shape], value.dtype),
            )
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return len(randoms)
