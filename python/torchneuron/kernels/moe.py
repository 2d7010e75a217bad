"""Grouped matmul of a mixture-of-experts layer as an NKI kernel: each expert's tokens times
that expert's weights, computing only the rows each expert owns."""

from __future__ import annotations

from collections.abc import Sequence

import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

__all__ = ["grouped_matmul", "grouped_matmul_kernel"]


def _expert(x, w, out, e, start, count):
    """Rows ``start .. start + count`` of ``x`` times ``w[e]``: the rows are loaded and
    transposed on TensorE (K on partitions) once, then for each 512-column block of the
    expert's weights (loaded once) every row tile accumulates over K in one PSUM bank."""
    k, n = w.shape[1], w.shape[2]
    i_p, i_k = nl.mgrid[0:128, 0:k]
    row_tiles = []
    for r in range(0, count, 128):
        rows = min(128, count - r)
        tile = nl.load(x[start + r + i_p, i_k], mask=i_p < rows)
        x_t = nl.ndarray((128, k // 128, 128), dtype=x.dtype)  # [K within block, block, row]
        for kb in range(k // 128):
            x_t[:, kb, :] = nl.copy(nl.transpose(tile[:, kb * 128 : (kb + 1) * 128]))
        row_tiles.append((r, rows, x_t))
    for c in range(0, n, 512):
        cols = min(512, n - c)
        i_w, i_n = nl.mgrid[0:128, 0:cols]
        w_block = nl.ndarray((128, k // 128, cols), dtype=w.dtype)
        for kb in range(k // 128):
            w_block[:, kb, :] = nl.load(w[e, kb * 128 + i_w, c + i_n])
        for r, rows, x_t in row_tiles:
            acc = nl.zeros((128, cols), dtype=nl.float32, buffer=nl.psum)
            for kb in range(k // 128):
                acc += nisa.nc_matmul(x_t[:, kb, :], w_block[:, kb, :])
            nl.store(out[start + r + i_w, c + i_n],
                     value=nl.copy(acc, dtype=out.dtype), mask=i_w < rows)  # fmt: skip


@nki.jit
def grouped_matmul_kernel(x, w, group_sizes):
    """``out[rows of expert e] = x[rows of expert e] @ w[e]`` for x [T, K] whose rows are
    sorted by expert, ``group_sizes`` the number of rows of each of the E experts (a tuple:
    the program is built for these counts), w [E, K, N]; K a multiple of 128. Each expert's
    rows are tiled by 128 (the last tile masked), so the work is that of the rows each
    expert owns, not E times all of them."""
    t, k = x.shape
    out = nl.ndarray((t, w.shape[2]), dtype=x.dtype, buffer=nl.shared_hbm)
    start = 0
    for e, count in enumerate(group_sizes):
        if count:
            _expert(x, w, out, e, start, count)
        start += count
    return out


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, group_sizes: Sequence[int]) -> torch.Tensor:
    """``torch.cat([x[rows_e] @ w[e] for e])`` for x [T, K] sorted by expert, w [E, K, N] and
    ``group_sizes`` the rows of each expert (summing to T); K a multiple of 128."""
    sizes = tuple(int(s) for s in group_sizes)
    if len(sizes) != w.shape[0] or sum(sizes) != x.shape[0] or min(sizes, default=0) < 0:
        raise ValueError(
            f"group_sizes {list(sizes)} must give the rows of each of the {w.shape[0]} experts "
            f"and sum to the {x.shape[0]} rows of x"
        )
    if x.shape[1] != w.shape[1] or x.shape[1] % 128:
        raise ValueError(
            f"x [T, K] and w [E, K, N] must share K, a multiple of 128; got x {list(x.shape)} "
            f"and w {list(w.shape)}"
        )
    return grouped_matmul_kernel(x, w.to(x.dtype), sizes)
