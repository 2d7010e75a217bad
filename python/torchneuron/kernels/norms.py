"""RMSNorm as an NKI kernel: one pass over HBM, 128 rows per tile."""

from __future__ import annotations

import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

__all__ = ["rms_norm", "rms_norm_kernel"]


_GROUP = 4  # row tiles per loop iteration (see _normalize)


def _normalize(x, out, w, first, count, eps):
    """RMSNorm of ``count`` row tiles starting at row tile ``first``: the ScalarE passes of
    all of them come before their VectorE passes and stores. Stores are issued from
    ScalarE's DMA queue, so ScalarE squaring the next tile while VectorE finishes this one
    needs the squares to come first in program order."""
    n, d = x.shape
    i_p, i_f = nl.mgrid[0:128, 0:d]
    tiles, totals = [], []
    for g in range(count):
        rows = (first + g) * 128 + i_p
        tile = nl.load(x[rows, i_f], mask=rows < n)
        # Compute runs on all 128 partitions (as fast as fewer): rows past N are not stored.
        squares = nl.ndarray((128, d), dtype=x.dtype)  # discarded: only the row sums count
        total = nl.ndarray((128, 1), dtype=nl.float32)
        nisa.activation(dst=squares, op=nl.square, data=tile, reduce_op=nl.add, reduce_res=total)
        tiles.append(tile)
        totals.append(total)
    for g in range(count):
        rows = (first + g) * 128 + i_p
        mean_eps = nisa.tensor_scalar(totals[g], nl.multiply, 1.0 / d, op1=nl.add, operand1=eps)
        inv_rms = nisa.tensor_scalar(mean_eps, nl.power, -0.5)
        normed = nisa.scalar_tensor_tensor(data=tiles[g], op0=nl.multiply, operand0=inv_rms,
                                           op1=nl.multiply, operand1=w, dtype=x.dtype)  # fmt: skip
        nl.store(out[rows, i_f], value=normed, mask=rows < n)


@nki.jit
def rms_norm_kernel(x, weight, eps):
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the rows of ``x`` [N, D].

    Per tile of 128 rows, one pass on each of two engines: ScalarE squares the rows and sums
    them in the same instruction (``reduce_res``); after two [128, 1] VectorE steps make the
    inverse RMS, one VectorE ``scalar_tensor_tensor`` scales each row by it and multiplies
    by the weight (loaded once for every partition). Tiles go in groups of four per loop
    iteration (``affine_range``: successive groups overlap), the remainder after the loop;
    the last tile is masked when N is not a multiple of 128."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    w = nl.load(weight.reshape((1, d)).broadcast_to((128, d)))
    tiles = (n + 127) // 128
    for t in nl.affine_range(tiles // _GROUP):
        _normalize(x, out, w, t * _GROUP, _GROUP, eps)
    if tiles % _GROUP:
        _normalize(x, out, w, tiles - tiles % _GROUP, tiles % _GROUP, eps)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` (any leading shape), as Llama's: the same
    dtype out as in."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight {list(weight.shape)} does not match x's last dim {x.shape[-1]}")
    flat = x.reshape(-1, x.shape[-1])
    return rms_norm_kernel(flat, weight.to(x.dtype), float(eps)).reshape(x.shape)
