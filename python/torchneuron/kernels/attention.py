"""Attention forward (``softmax(q k^T * scale) v``, causal or not) as an NKI kernel."""

from __future__ import annotations

import math

import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

__all__ = ["attention", "attention_kernel"]


def _softmax_phase(q, head, i, k_t, scale, diagonal):
    """Rows ``i * 128 ...`` of one head, first half: scores against every key (causal: the
    keys up to the tile's last row, ``diagonal`` masking the last 128) evicted from PSUM to
    SBUF by ScalarE, their row maxima (VectorE), then exp((s - max) * scale) in the input
    dtype with the row sums (ScalarE). Returns (probabilities, row sums)."""
    d = q.shape[2]
    keys = (i + 1) * 128 if diagonal is not None else k_t.shape[1]
    i_p, i_d = nl.mgrid[0:128, 0:d]
    q_t = nl.load_transpose2d(q[head, i * 128 : (i + 1) * 128, :])  # [d, 128] by DMA
    scores = nl.ndarray((128, keys), dtype=nl.float32)
    for j in range(0, keys, 512):  # a PSUM bank holds 512 fp32 columns
        width = min(512, keys - j)
        block = nisa.nc_matmul(q_t, k_t[:, j : j + width])
        if diagonal is not None and j + width == keys:
            if width > 128:
                nisa.activation(dst=scores[:, j : keys - 128], op=nl.copy,
                                data=block[:, 0 : width - 128])  # fmt: skip
            scores[:, keys - 128 : keys] = nl.add(block[:, width - 128 : width], diagonal)
        else:
            nisa.activation(dst=scores[:, j : j + width], op=nl.copy, data=block)
    neg_max = nisa.tensor_scalar(
        nisa.tensor_reduce(nl.max, scores, axis=1, keepdims=True), nl.multiply, -scale
    )
    probs = nl.ndarray((128, keys), dtype=q.dtype)
    total = nl.ndarray((128, 1), dtype=nl.float32)
    nisa.activation(dst=probs, op=nl.exp, data=scores, bias=neg_max, scale=scale,
                    reduce_op=nl.add, reduce_res=total)  # fmt: skip
    return probs, total


def _output_phase(q, out, head, i, v_tiles, probs, total):
    """Second half: probabilities (transposed 128 columns at a time on TensorE, copied to SBUF
    by VectorE) times values, accumulated in one PSUM tile, scaled by 1 / sum and stored."""
    d = q.shape[2]
    i_p, i_d = nl.mgrid[0:128, 0:d]
    acc = nl.zeros((128, d), dtype=nl.float32, buffer=nl.psum)
    blocks = probs.shape[1] // 128
    for j in range(0, blocks, 4):  # four transposes fill a PSUM bank: one copy evicts them
        n = min(4, blocks - j)
        banked = nl.ndarray((128, n * 128), dtype=nl.float32, buffer=nl.psum)
        for m in range(n):
            banked[:, m * 128 : (m + 1) * 128] = nl.transpose(
                probs[:, (j + m) * 128 : (j + m + 1) * 128]
            )
        p_t = nl.copy(banked, dtype=q.dtype)
        for m in range(n):
            acc += nisa.nc_matmul(p_t[:, m * 128 : (m + 1) * 128], v_tiles[j + m])
    inv_total = nisa.tensor_scalar(total, nl.divide, 1.0, reverse0=True)
    result = nisa.activation(op=nl.copy, data=acc, scale=inv_total, dtype=q.dtype)
    nl.store(out[head, i * 128 + i_p, i_d], value=result)


@nki.jit
def attention_kernel(q, k, v, scale, causal_mask):
    """``softmax(q @ k^T * scale) @ v`` per head: q [H, S, D], k and v [Hkv, T, D] (H a
    multiple of Hkv: grouped-query heads share their group's keys), S and T multiples of 128,
    D <= 128. ``causal_mask`` is None or the [128, 128] additive mask of a diagonal block
    (0 on and below the diagonal, -inf above; then S == T).

    Per key/value head, keys are loaded once by transposing DMAs into an SBUF [D, T] tile
    and values kept as 128-row tiles; query tiles are loaded transposed the same way. Per
    query tile, scores q k^T go through PSUM into SBUF (fp32), one VectorE pass finds the row
    maxima, one ScalarE pass makes exp((s - max) * scale) in the input dtype with the row
    sums, and probabilities (transposed 128 columns at a time on TensorE) times values
    accumulate in PSUM, scaled by 1 / sum on the way out (``_softmax_phase``,
    ``_output_phase``). All scores of a row stay in SBUF (no online rescaling), which bounds
    T by SBUF."""
    heads, s, d = q.shape
    kv_heads, t, _ = k.shape
    group = heads // kv_heads
    out = nl.ndarray((heads, s, d), dtype=q.dtype, buffer=nl.shared_hbm)
    diagonal = nl.load(causal_mask) if causal_mask is not None else None
    i_p, i_d = nl.mgrid[0:128, 0:d]
    for hk in nl.affine_range(kv_heads):
        k_t = nl.ndarray((d, t), dtype=q.dtype)
        v_tiles = []
        for j in range(t // 128):
            k_t[:, j * 128 : (j + 1) * 128] = nl.load_transpose2d(k[hk, j * 128 : (j + 1) * 128, :])
            v_tiles.append(nl.load(v[hk, j * 128 + i_p, i_d]))
        # Software-pipelined in program order: the next tile's scores and softmax come
        # before this tile's output matmuls, so TensorE computes them while VectorE and
        # ScalarE finish this tile's softmax (each engine runs its instructions in order).
        tiles = [(hk * group + g, i) for g in range(group) for i in range(s // 128)]
        pending = _softmax_phase(q, *tiles[0], k_t, scale, diagonal)
        for n, (head, i) in enumerate(tiles):
            current = pending
            if n + 1 < len(tiles):
                pending = _softmax_phase(q, *tiles[n + 1], k_t, scale, diagonal)
            _output_phase(q, out, head, i, v_tiles, *current)
    return out


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(query, key, value, is_causal=..., scale=...,
    enable_gqa=True)`` for [..., H, S, D] inputs with S and the key length multiples of 128
    and D <= 128."""
    *lead, heads, s, d = query.shape
    kv_heads, t = key.shape[-3], key.shape[-2]
    if s % 128 or t % 128 or d > 128:
        raise ValueError(
            f"attention kernel: sequence lengths must be multiples of 128 and the head dim at "
            f"most 128; got query length {s}, key length {t}, head dim {d}"
        )
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not group over {kv_heads} key/value heads")
    if is_causal and s != t:
        raise ValueError(f"causal attention needs equal lengths, got {s} and {t}")
    mask = None
    if is_causal:
        mask = torch.full((128, 128), float("-inf")).triu(1).to(query.device)
    out = attention_kernel(
        query.reshape(-1, s, d),
        key.reshape(-1, t, d).to(query.dtype),
        value.reshape(-1, t, d).to(query.dtype),
        float(scale if scale is not None else 1.0 / math.sqrt(d)),
        mask,
    )
    return out.reshape(*lead, heads, s, d)
