"""NKI's public tutorials on the engine model: our own kernels written in each tutorial's style
(the same APIs and structure: masked partial row tiles, mgrid index grids, destination-passing
nisa calls, lists of tiles, blocked matmuls), checked against NumPy, with modeled time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

pytest.importorskip("torchneuron._C")

RNG = np.random.default_rng(0)
TILE_M, TILE_K, TILE_N = 128, 128, 512


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def timed(kernel, *args, **kwargs) -> nki.BenchmarkResult:
    r = nki.benchmark(kernel, *args, **kwargs)
    assert r.latency_us > 0 and r.instructions > 0
    print(r.summary())
    return r


# ----------------------------------------------------------------------------------------------
# Tensor addition (SPMD grid, nl.arange offsets by program id)
# ----------------------------------------------------------------------------------------------


@nki.jit
def spmd_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    cols = nl.program_id(1) * 512 + nl.arange(512)[None, :]
    nl.store(out[rows, cols], value=nl.load(a[rows, cols]) + nl.load(b[rows, cols]))
    return out


def test_tensor_addition_spmd() -> None:
    a, b = rand(256, 1024), rand(256, 1024)
    np.testing.assert_allclose(nki.simulate_kernel(spmd_add[2, 2], a, b), a + b, rtol=1e-6)
    timed(spmd_add[2, 2], a, b)


# ----------------------------------------------------------------------------------------------
# Softmax, RMSNorm, LayerNorm: row tiles of 128 with a masked partial last tile
# ----------------------------------------------------------------------------------------------


@nki.jit
def masked_softmax(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0 : x.shape[1]]
    n = x.shape[0]
    for t in nl.affine_range(math.ceil(n / 128)):
        rows = t * 128 + i_p
        tile = nl.load(x[rows, i_f], mask=(rows < n))
        top = nl.max(tile, axis=[1], keepdims=True, mask=(rows < n))
        e = nl.exp(nl.subtract(tile, top, mask=(rows < n)))
        total = nl.sum(e, axis=[1])
        nl.store(out[rows, i_f], value=e / total, mask=(rows < n))
    return out


def test_softmax_with_partial_row_tile() -> None:
    x = rand(300, 96)
    ref = np.exp(x - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(nki.simulate_kernel(masked_softmax, x), ref, rtol=1e-4, atol=1e-6)
    traced = masked_softmax.specialize(x)
    # Two full tiles in a loop, the partial third one peeled after it with 44 rows.
    assert traced.mlir.count("scf.for") == 1
    assert "memref<44x96xf32" in traced.mlir
    timed(masked_softmax, x)


@nki.jit
def rmsnorm(a, g):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_u, i_f = nl.mgrid[0:128, 0:1, 0 : a.shape[1]]  # the tutorial's 3-axis grid
    n = a.shape[0]
    weight = nl.load(g.reshape((1, g.shape[0]))[i_u, i_f])
    for t in nl.affine_range(math.ceil(n / 128)):
        tile = nl.load(a[t * 128 + i_p, i_f], mask=(t * 128 + i_p < n))
        scale = nl.rsqrt(nl.sum(nl.square(tile), axis=[1]) / a.shape[1])
        y = nl.multiply(tile, scale)
        y[...] = nl.multiply(y, weight.broadcast_to((128, g.shape[0])), mask=(t * 128 + i_p < n))
        nl.store(out[t * 128 + i_p, i_f], value=y, mask=(t * 128 + i_p < n))
    return out


@pytest.mark.parametrize("rows", [100, 256, 333])
def test_rmsnorm_masked_rows(rows: int) -> None:
    a, g = rand(rows, 256), rand(256)
    ref = a / np.sqrt(np.mean(a * a, axis=1, keepdims=True)) * g
    np.testing.assert_allclose(nki.simulate_kernel(rmsnorm, a, g), ref, rtol=1e-4, atol=1e-5)
    timed(rmsnorm, a, g)


@nki.jit
def layernorm(x, eps, gamma, beta):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p, i_f, i_1 = nl.mgrid[0 : nl.tile_size.pmax, 0 : x.shape[1], 0:1]
    n = x.shape[0]
    g = nl.load(gamma.reshape((1, gamma.shape[0]))[i_1, i_f]).broadcast_to((128, x.shape[1]))
    b = nl.load(beta.reshape((1, beta.shape[0]))[i_1, i_f]).broadcast_to((128, x.shape[1]))
    for t in nl.affine_range(math.ceil(n / nl.tile_size.pmax)):
        rows = t * nl.tile_size.pmax + i_p
        tile = nl.load(x[rows, i_f], mask=(rows < n))
        mean = nl.mean(tile, axis=1)
        var = nl.mean(nl.square(tile), axis=1) - mean * mean
        # The isa form of shift-and-scale: two ALU operations in one tensor_scalar call.
        norm = nisa.tensor_scalar(
            data=tile, op0=np.subtract, operand0=mean, op1=np.multiply,
            operand1=nl.rsqrt(var + eps),
        )  # fmt: skip
        nl.store(out[rows, i_f], value=norm * g + b, mask=(rows < n))
    return out


def test_layernorm_masked_rows() -> None:
    x, gamma, beta = rand(200, 128), rand(128), rand(128)
    mu = x.mean(1, keepdims=True)
    ref = (x - mu) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * gamma + beta
    got = nki.simulate_kernel(layernorm, x, 1e-5, gamma, beta)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)
    timed(layernorm, x, 1e-5, gamma, beta)


def test_unsupported_isa_call_names_itself() -> None:
    @nki.jit
    def uses_find_index8(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.nc_find_index8(nl.load(x), nl.load(x))
        return out

    with pytest.raises(nki.KernelError, match="nisa.nc_find_index8 is not supported"):
        nki.simulate_kernel(uses_find_index8, rand(128, 64))


def test_mask_cutting_a_middle_iteration_is_an_error() -> None:
    @nki.jit
    def bad(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        for t in nl.affine_range(3):
            tile = nl.load(x[t * 128 + i_p, i_f])
            nl.store(out[t * 128 + i_p, i_f], value=tile, mask=(t * 128 + i_p < 100))
        return out

    with pytest.raises(nki.KernelError, match="only a partial last tile is supported"):
        nki.simulate_kernel(bad, rand(384, 64))


# ----------------------------------------------------------------------------------------------
# Transpose of flattened 2-D matrices per partition (SBUF access patterns) and average pooling
# ----------------------------------------------------------------------------------------------


@nki.jit
def transpose_rows(x, shape2d):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    f1, f2 = shape2d
    tile = nl.load(x)
    i_p, i_1, i_2 = nl.mgrid[0 : x.shape[0], 0:f1, 0:f2]
    res = nl.ndarray((x.shape[0], f1 * f2), dtype=x.dtype)
    res[i_p, i_2 * f1 + i_1] = nl.copy(tile[i_p, i_1 * f2 + i_2])
    nl.store(out, value=res)
    return out


def test_transpose2d_by_access_patterns() -> None:
    x = np.arange(5 * 12, dtype=np.float32).reshape(5, 12)
    ref = x.reshape(5, 3, 4).transpose(0, 2, 1).reshape(5, 12)
    np.testing.assert_array_equal(nki.simulate_kernel(transpose_rows, x, (3, 4)), ref)
    timed(transpose_rows, x, (3, 4))


@nki.jit
def avgpool_indexed(x, pool):
    c, h, w = x.shape
    out = nl.ndarray((c, h // pool, w // pool), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray((c, h, w), dtype=x.dtype)
    tile[:, :, :] = nl.load(x)
    i0 = nl.arange(c)[:, None, None, None, None]
    i1 = nl.arange(h // pool)[None, :, None, None, None]
    i2 = nl.arange(pool)[None, None, :, None, None]
    i3 = nl.arange(w // pool)[None, None, None, :, None]
    i4 = nl.arange(pool)[None, None, None, None, :]
    pooled = nl.sum(tile[i0, pool * i1 + i2, pool * i3 + i4], axis=[2, 4]) / (pool * pool)
    nl.store(out, value=pooled)
    return out


@nki.jit
def avgpool_ap(x, pool):
    c, h, w = x.shape
    out = nl.ndarray((c, h // pool, w // pool), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    view = tile.ap([[h * w, c], [pool * w, h // pool], [pool, w // pool], [w, pool], [1, pool]])
    total = nl.sum(view, axis=[3, 4])
    res = nl.ndarray(total.shape, dtype=total.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=res, data=total, op0=nl.multiply, operand0=1.0 / (pool * pool))
    nisa.dma_copy(dst=out, src=res)
    return out


@pytest.mark.parametrize("kernel", [avgpool_indexed, avgpool_ap])
def test_average_pool2d(kernel) -> None:
    x = rand(16, 12, 8)
    ref = x.reshape(16, 6, 2, 4, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(nki.simulate_kernel(kernel, x, 2), ref, rtol=1e-5, atol=1e-6)
    timed(kernel, x, 2)


# ----------------------------------------------------------------------------------------------
# Attention forward (softmax in SBUF between two matmuls), both API styles
# ----------------------------------------------------------------------------------------------


@nki.jit
def attention_tiles(q, k, v):
    d, s = q.shape
    out = nl.ndarray((s, d), dtype=q.dtype, buffer=nl.shared_hbm)
    qs, ks, vs = nl.load(q), nl.load(k), nl.load(v)
    scores_psum = nl.matmul(x=qs, y=ks, transpose_x=True)
    scores = nl.ndarray(scores_psum.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=scores, src=scores_psum)
    shifted = nl.ndarray(scores.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=shifted, data=scores, op0=nl.subtract,
                       operand0=nl.max(scores, axis=1, keepdims=True))  # fmt: skip
    e = nl.exp(shifted)
    probs = nl.ndarray(e.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=probs, data=e, op0=nl.multiply,
                       operand0=nl.reciprocal(nl.sum(e, axis=1, keepdims=True)))  # fmt: skip
    v_t = nl.copy(nl.transpose(vs), dtype=vs.dtype)
    p_t = nl.ndarray((s, s), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=p_t, src=nl.transpose(probs))
    res_psum = nl.ndarray((s, d), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=res_psum, stationary=p_t, moving=v_t)
    res = nl.ndarray((s, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=res_psum)
    nl.store(dst=out, value=res)
    return out


def test_attention_forward() -> None:
    q, k, v = rand(128, 128), rand(128, 128), rand(128, 128)
    s = q.T @ k
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    got = nki.simulate_kernel(attention_tiles, q, k, v)
    np.testing.assert_allclose(got, p @ v.T, rtol=1e-3, atol=1e-3)
    timed(attention_tiles, q, k, v)


# ----------------------------------------------------------------------------------------------
# The matmul optimisation series (destination-passing form)
# ----------------------------------------------------------------------------------------------


@nki.jit
def mm_tiled(lhs_t, rhs):
    k_size, m_size = lhs_t.shape
    n_size = rhs.shape[1]
    out = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_size // TILE_M):
        for n in nl.affine_range(n_size // TILE_N):
            acc = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_size // TILE_K):
                a = nl.ndarray((TILE_K, TILE_M), dtype=lhs_t.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(
                    dst=a, src=lhs_t[nl.ds(k * TILE_K, TILE_K), nl.ds(m * TILE_M, TILE_M)]
                )
                nisa.dma_copy(dst=b, src=rhs[nl.ds(k * TILE_K, TILE_K), nl.ds(n * TILE_N, TILE_N)])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)  # accumulates over k
            res = nl.ndarray((TILE_M, TILE_N), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[nl.ds(m * TILE_M, TILE_M), nl.ds(n * TILE_N, TILE_N)], src=res)
    return out


@nki.jit
def mm_hoisted(lhs_t, rhs):
    k_size, m_size = lhs_t.shape
    n_size = rhs.shape[1]
    out = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_size // TILE_M):
        a_tiles = []
        for k in nl.affine_range(k_size // TILE_K):
            a = nl.ndarray((TILE_K, TILE_M), dtype=lhs_t.dtype, buffer=nl.sbuf)
            nisa.dma_copy(
                dst=a, src=lhs_t[k * TILE_K : (k + 1) * TILE_K, m * TILE_M : (m + 1) * TILE_M]
            )
            a_tiles.append(a)
        for n in nl.affine_range(n_size // TILE_N):
            b_tiles = []
            for k in nl.affine_range(k_size // TILE_K):
                b = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(
                    dst=b, src=rhs[k * TILE_K : (k + 1) * TILE_K, n * TILE_N : (n + 1) * TILE_N]
                )
                b_tiles.append(b)
            acc = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_size // TILE_K):  # indexes the lists: unrolled
                nisa.nc_matmul(dst=acc, stationary=a_tiles[k], moving=b_tiles[k])
            res = nl.ndarray((TILE_M, TILE_N), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(
                dst=out[m * TILE_M : (m + 1) * TILE_M, n * TILE_N : (n + 1) * TILE_N], src=res
            )
    return out


@nki.jit
def mm_blocked_free(lhs_t, rhs, bm_tiles=2, bn_tiles=2):
    k_size, m_size = lhs_t.shape
    n_size = rhs.shape[1]
    out = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_size // (TILE_M * bm_tiles)):
        a_tiles = []
        for bm in nl.affine_range(bm_tiles):
            col = (m * bm_tiles + bm) * TILE_M
            row = []
            for k in nl.affine_range(k_size // TILE_K):
                a = nl.ndarray((TILE_K, TILE_M), dtype=lhs_t.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhs_t[k * TILE_K : (k + 1) * TILE_K, col : col + TILE_M])
                row.append(a)
            a_tiles.append(row)
        for n in nl.affine_range(n_size // (TILE_N * bn_tiles)):
            b_tiles = []
            for bn in nl.affine_range(bn_tiles):
                col = (n * bn_tiles + bn) * TILE_N
                row = []
                for k in nl.affine_range(k_size // TILE_K):
                    b = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=b, src=rhs[k * TILE_K : (k + 1) * TILE_K, col : col + TILE_N])
                    row.append(b)
                b_tiles.append(row)
            for bm in nl.affine_range(bm_tiles):
                for bn in nl.affine_range(bn_tiles):
                    acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(k_size // TILE_K):
                        nisa.nc_matmul(dst=acc, stationary=a_tiles[bm][k], moving=b_tiles[bn][k])
                    res = nl.ndarray((TILE_M, TILE_N), dtype=out.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=res, src=acc)
                    r0 = (m * bm_tiles + bm) * TILE_M
                    c0 = (n * bn_tiles + bn) * TILE_N
                    nisa.dma_copy(dst=out[r0 : r0 + TILE_M, c0 : c0 + TILE_N], src=res)
    return out


@nki.jit
def mm_fully_optimized(lhs_t, rhs, bm_tiles=16, bn_tiles=2, bk_tiles=8):
    k_size, m_size = lhs_t.shape
    n_size = rhs.shape[1]
    out = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    block_m, block_n, block_k = TILE_M * bm_tiles, TILE_N * bn_tiles, TILE_K * bk_tiles
    for n in nl.affine_range(n_size // block_n):
        # Partial sums in SBUF across the K blocks, one tile per (m block, bm, bn).
        sums = []
        for _m in range(m_size // block_m):
            rows = []
            for _bm in range(bm_tiles):
                tiles = []
                for _bn in range(bn_tiles):
                    t = nl.ndarray((TILE_M, TILE_N), dtype=lhs_t.dtype, buffer=nl.sbuf)
                    nisa.memset(dst=t, value=0)
                    tiles.append(t)
                rows.append(tiles)
            sums.append(rows)
        for k in nl.sequential_range(k_size // block_k):
            b_tiles = []
            for bk in range(bk_tiles):
                b = nl.ndarray((TILE_K, block_n), dtype=rhs.dtype, buffer=nl.sbuf)
                r0 = (k * bk_tiles + bk) * TILE_K
                nisa.dma_copy(dst=b, src=rhs[r0 : r0 + TILE_K, n * block_n : (n + 1) * block_n])
                b_tiles.append(b)
            for m in nl.affine_range(m_size // block_m):
                a_tiles = []
                for bk in nl.affine_range(bk_tiles):
                    a = nl.ndarray((TILE_K, block_m), dtype=lhs_t.dtype, buffer=nl.sbuf)
                    r0 = (k * bk_tiles + bk) * TILE_K
                    nisa.dma_copy(
                        dst=a, src=lhs_t[r0 : r0 + TILE_K, m * block_m : (m + 1) * block_m]
                    )
                    a_tiles.append(a)
                for bn in nl.affine_range(bn_tiles):
                    for bm in nl.affine_range(bm_tiles):
                        acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(bk_tiles):
                            nisa.nc_matmul(
                                dst=acc,
                                stationary=a_tiles[bk][0:TILE_K, bm * TILE_M : (bm + 1) * TILE_M],
                                moving=b_tiles[bk][0:TILE_K, bn * TILE_N : (bn + 1) * TILE_N],
                            )
                        s = sums[m][bm][bn]
                        nisa.tensor_tensor(dst=s, data1=s, data2=acc, op=nl.add)
        for m in nl.affine_range(m_size // block_m):
            for bm in nl.affine_range(bm_tiles):
                packed = nl.ndarray((TILE_M, block_n), dtype=nl.float32, buffer=nl.sbuf)
                for bn in nl.affine_range(bn_tiles):
                    nisa.tensor_copy(
                        dst=packed[0:TILE_M, bn * TILE_N : (bn + 1) * TILE_N], src=sums[m][bm][bn]
                    )
                r0 = (m * bm_tiles + bm) * TILE_M
                nisa.dma_copy(
                    dst=out[r0 : r0 + TILE_M, n * block_n : (n + 1) * block_n], src=packed
                )
    return out


@pytest.mark.parametrize(
    ("kernel", "kwargs"),
    [
        (mm_tiled, {}),
        (mm_hoisted, {}),
        (mm_blocked_free, {}),
        (mm_fully_optimized, {"bm_tiles": 2, "bn_tiles": 1, "bk_tiles": 2}),
    ],
)
def test_matmul_series(kernel, kwargs) -> None:
    a, b = rand(512, 256), rand(512, 1024)  # lhs_t [K, M], rhs [K, N]
    got = nki.simulate_kernel(kernel, a, b, **kwargs)
    np.testing.assert_allclose(got, a.T @ b, rtol=1e-4, atol=1e-3)
    ta, tb = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
    got_bf16 = kernel(ta, tb, **kwargs).float()
    ref = (ta.float().T @ tb.float()).bfloat16().float()
    torch.testing.assert_close(got_bf16, ref, rtol=2e-2, atol=2e-1)
    timed(kernel, ta, tb, **kwargs)


def test_psum_first_written_in_a_loop_starts_at_zero() -> None:
    """nc_matmul(dst=...) accumulates; a PSUM tile made outside the K loop is zeroed where it
    is allocated, one made in the matmul's own block starts the accumulation group."""
    text = mm_tiled.specialize(rand(256, 128), rand(256, 512)).mlir
    assert "nisa.memset" in text and "accumulate" in text
    text = mm_hoisted.specialize(rand(256, 128), rand(256, 512)).mlir
    assert "nisa.memset" not in text
