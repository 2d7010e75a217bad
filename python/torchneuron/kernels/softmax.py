"""Softmax over the last dimension as an NKI kernel: one pass over HBM, 128 rows per tile."""

from __future__ import annotations

import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

__all__ = ["softmax", "softmax_kernel"]

_GROUP = 4  # row tiles per loop iteration (see _softmax_rows)


def _softmax_rows(x, out, first, count):
    """Softmax of ``count`` row tiles starting at row tile ``first``, engine by engine: the
    row maxima of every tile (VectorE), their exponentials with the row sums in the same
    instruction (ScalarE, the maximum subtracted as a per-partition bias), then the scaling
    by 1 / sum (on VectorE and ScalarE in turn, which balances them) and the stores. Each
    engine works on one tile while the next engine takes the previous one."""
    n, d = x.shape
    i_p, i_f = nl.mgrid[0:128, 0:d]
    tiles, neg_maxes = [], []
    for g in range(count):
        rows = (first + g) * 128 + i_p
        tile = nl.load(x[rows, i_f], mask=rows < n)
        # Compute runs on all 128 partitions (as fast as fewer): rows past N are not stored.
        row_max = nisa.tensor_reduce(nl.max, tile, axis=1, keepdims=True, dtype=nl.float32)
        neg_maxes.append(nisa.tensor_scalar(row_max, nl.multiply, -1.0))
        tiles.append(tile)
    exps, sums = [], []
    for g in range(count):
        e = nl.ndarray((128, d), dtype=nl.float32)
        total = nl.ndarray((128, 1), dtype=nl.float32)
        nisa.activation(dst=e, op=nl.exp, data=tiles[g], bias=neg_maxes[g], reduce_op=nl.add,
                        reduce_res=total)  # fmt: skip
        exps.append(e)
        sums.append(total)
    for g in range(count):
        rows = (first + g) * 128 + i_p
        inv_sum = nisa.tensor_scalar(sums[g], nl.divide, 1.0, reverse0=True)
        if g % 2:  # half the tiles' scaling on each engine: both then make 1.5 passes
            probs = nisa.activation(op=nl.copy, data=exps[g], scale=inv_sum, dtype=x.dtype)
        else:
            probs = nisa.tensor_scalar(exps[g], nl.multiply, inv_sum, dtype=x.dtype)
        nl.store(out[rows, i_f], value=probs, mask=rows < n)


@nki.jit
def softmax_kernel(x):
    """``softmax(x, dim=-1)`` of ``x`` [N, D], computed in fp32 (the result in x's dtype).

    Per tile of 128 rows: one VectorE pass for the row maxima, one ScalarE pass for
    ``exp(x - max)`` and the row sums, one pass scaling by 1 / sum (every other tile on
    each engine). Tiles go in
    groups of four per loop iteration (``affine_range``: successive groups overlap), the
    remainder after the loop; the last tile is masked when N is not a multiple of 128."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    tiles = (n + 127) // 128
    for t in nl.affine_range(tiles // _GROUP):
        _softmax_rows(x, out, t * _GROUP, _GROUP)
    if tiles % _GROUP:
        _softmax_rows(x, out, tiles - tiles % _GROUP, tiles % _GROUP)
    return out


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)`` for the last dimension (any leading shape), in x's dtype."""
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"softmax runs over the last dimension; got dim={dim} of a {x.dim()}-d x")
    return softmax_kernel(x.reshape(-1, x.shape[-1])).reshape(x.shape)
