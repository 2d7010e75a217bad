"""NKI API forms the published tutorials use, one test each (our own kernels): nt.tensor
specs, NKI's benchmark/profile/baremetal wrappers and their files, par_dim block tiles,
per-partition activation scales, NumPy reductions as ALU ops, multi-core SPMD grids,
bn_stats/bn_aggr, tensor_tensor_scan and nc_n_gather, loop variables modulo a number, PSUM
block tensors larger than PSUM and hand allocation (mod_alloc), all checked against NumPy."""

from __future__ import annotations

import json

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt

pytest.importorskip("torchneuron._C")

RNG = np.random.default_rng(1)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@nki.jit
def double(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128 : (i + 1) * 128, :])
        nl.store(out[i * 128 : (i + 1) * 128, :], value=t * 2.0)
    return out


def test_tensor_spec_times_without_data() -> None:
    spec = nt.tensor[[256, 64], nl.bfloat16]
    assert spec.shape == (256, 64) and spec.dtype == nl.bfloat16
    assert nt.tensor[128, 32, nl.float32].shape == (128, 32)
    bench = nki.benchmark(warmup=5, iters=10)(double)
    assert bench(spec) is None  # nothing to compute on, only timed
    assert bench.benchmark_result.nc_latency.get_latency_percentile(99) > 0


def test_benchmark_and_profile_wrappers_run_and_write_files(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    x = rand(256, 64)
    bench = nki.benchmark(double, save_neff_name="k.neff", save_trace_name="k.ntff")
    np.testing.assert_array_equal(bench(x), x * 2)
    assert bench.benchmark_result.latency_us > 0
    assert (tmp_path / "k.neff").exists() and (tmp_path / "k.ntff").exists()
    prof = nki.profile(
        working_directory=str(tmp_path / "prof"),
        save_neff_name="file.neff",
        save_trace_name="profile.ntff",
        profile_nth=2,
    )(double)
    np.testing.assert_array_equal(prof(x), x * 2)
    program = json.loads((tmp_path / "prof" / "file.neff").read_text())
    assert program["name"]
    assert json.loads((tmp_path / "prof" / "profile.ntff").read_text())["traceEvents"]
    np.testing.assert_array_equal(nki.baremetal(double)(x), x * 2)
    with pytest.raises(TypeError, match="unsupported option"):
        nki.benchmark(double, warmup=1, colour="red")


def test_benchmark_options_with_arrays_are_kernel_arguments() -> None:
    # nki.benchmark(kernel, *args) is the direct form; options alone make the wrapper.
    r = nki.benchmark(double, rand(128, 8))
    assert isinstance(r, nki.BenchmarkResult)


@nki.jit
def block_tiles(x):
    """Row tiles kept in one (n, par_dim(128), f) block tensor, summed across blocks."""
    n = x.shape[0] // 128
    out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    blocks = nl.zeros((n, nl.par_dim(128), x.shape[1]), dtype=nl.float32)
    for i in nl.affine_range(n):
        blocks[i, 0:128, 0 : x.shape[1]] = nl.load(x[i * 128 : (i + 1) * 128, :])
    acc = nl.zeros((128, x.shape[1]), dtype=nl.float32)
    for i in nl.sequential_range(n):
        acc[...] = nl.add(acc, blocks[i, 0:128, 0 : x.shape[1]])
    nl.store(out, value=acc)
    return out


def test_par_dim_block_tiles() -> None:
    x = rand(512, 512)
    got = nki.simulate_kernel(block_tiles, x)
    np.testing.assert_allclose(got, x.reshape(4, 128, 512).sum(0), rtol=1e-5, atol=1e-5)
    # Partitions first: 8 KiB per partition (the blocks side by side), not 256 KiB.
    assert "memref<128x4x512xf32, #nisa.mem<sbuf>>" in block_tiles.specialize(x).mlir


@nki.jit
def exp_scaled_rows(x, s):
    """exp(x * s[p]) with a per-partition scale tile (a 1-D load of a column of s)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    scale = nl.load(s[0:128, 1])
    nl.store(out, value=nisa.activation(op=nl.exp, data=nl.load(x), scale=scale))
    return out


def test_activation_with_a_tile_scale() -> None:
    x, s = rand(128, 64), rand(128, 3)
    got = nki.simulate_kernel(exp_scaled_rows, x, s)
    np.testing.assert_allclose(got, np.exp(x * s[:, 1:2]), rtol=1e-4)


@nki.jit
def row_max_np(x):
    out = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.tensor_reduce(np.max, nl.load(x), axis=(1,)))
    return out


def test_numpy_reductions_as_alu_ops() -> None:
    x = rand(128, 40)
    np.testing.assert_array_equal(nki.simulate_kernel(row_max_np, x), x.max(1, keepdims=True))


@nki.jit
def add_one_tile(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    cols = nl.arange(a.shape[1])[None, :]
    nl.store(out[rows, cols], value=nl.load(a[rows, cols]) + 1.0)
    return out


def test_spmd_dim_over_cores_covers_every_program() -> None:
    a = rand(512, 32)
    # 2 programs per core, 2 cores: program ids 0..3 cover the 4 row tiles.
    got = nki.simulate_kernel(add_one_tile[nl.spmd_dim(2, nl.nc(2))], a)
    np.testing.assert_allclose(got, a + 1.0, rtol=1e-6)


@nki.jit
def mean_var(x):
    """Mean and variance per row by bn_stats over chunks of bn_stats_fmax, then bn_aggr (a
    partial last chunk by mask)."""
    out = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
    fmax = nl.tile_size.bn_stats_fmax
    chunks = (x.shape[1] + fmax - 1) // fmax
    t = nl.load(x)
    stats = nl.ndarray((128, 6 * chunks), dtype=nl.float32)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(fmax)[None, :]
    i_s = nl.arange(6)[None, :]
    for j in nl.affine_range(chunks):
        stats[i_p, j * 6 + i_s] = nisa.bn_stats(
            t[i_p, j * fmax + i_f], mask=(j * fmax + i_f < x.shape[1])
        )
    nl.store(out, value=nisa.bn_aggr(stats))
    return out


@pytest.mark.parametrize("cols", [1, 7, 512, 1100])
def test_bn_stats_and_bn_aggr(cols: int) -> None:
    x = rand(128, cols) + 3.0
    got = nki.simulate_kernel(mean_var, x)
    np.testing.assert_allclose(got[:, 0], x.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 1], x.var(1), rtol=1e-4, atol=1e-5)


@nki.jit
def gather_in_partitions(x, idx):
    """Each row of x picks its own elements by its row of idx (GpSimd, within SBUF)."""
    out = nl.ndarray(idx.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.nc_n_gather(nl.load(x), nl.load(idx)))
    return out


def test_nc_n_gather_picks_within_each_partition() -> None:
    x = rand(128, 8, 5)  # free axes flattened: 40 elements a partition
    idx = RNG.integers(0, 40, size=(128, 17)).astype(np.int32)
    got = nki.simulate_kernel(gather_in_partitions, x, idx)
    np.testing.assert_array_equal(got, np.take_along_axis(x.reshape(128, 40), idx, axis=1))
    idx[3, 4] = 40
    with pytest.raises(IndexError, match="out of range"):
        nki.simulate_kernel(gather_in_partitions, x, idx)


@nki.jit
def masked_gather(x, idx):
    out = nl.ndarray(idx.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    nl.store(out, value=nisa.nc_n_gather(nl.load(x), nl.load(idx), mask=(i_p < 64)))
    return out


def test_nc_n_gather_refuses_a_mask() -> None:
    idx = np.zeros((128, 4), np.int32)
    with pytest.raises(Exception, match="takes no mask"):
        nki.simulate_kernel(masked_gather, rand(128, 8), idx)


@nki.jit
def linear_recurrence(a, b):
    """h[t] = a[t] * h[t-1] + b[t] along the free axis, h[-1] = 0.5."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    h = nki.isa.tensor_tensor_scan(nl.load(a), nl.load(b), initial=0.5, op0=np.multiply, op1=np.add)
    nl.store(out, value=h)
    return out


def test_tensor_tensor_scan() -> None:
    a, b = rand(128, 33) * 0.5, rand(128, 33)
    ref = np.empty_like(a)
    h = np.full(128, 0.5, np.float32)
    for t in range(a.shape[1]):
        h = a[:, t] * h + b[:, t]
        ref[:, t] = h
    np.testing.assert_allclose(
        nki.simulate_kernel(linear_recurrence, a, b), ref, rtol=1e-4, atol=1e-5
    )


@nki.jit
def transpose_into_sbuf(x):
    """A TensorE transpose assigned straight into an SBUF tile: evicted by a copy (TensorE
    writes PSUM only)."""
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    t[...] = nisa.nc_transpose(nl.load(x))
    nl.store(out, value=t)
    return out


def test_transpose_assigned_to_sbuf() -> None:
    x = rand(64, 128)
    np.testing.assert_array_equal(nki.simulate_kernel(transpose_into_sbuf, x), x.T)


@nki.jit
def scratch_roundtrip(x):
    """A shared_hbm tensor the kernel does not return is HBM scratch: stored, loaded back."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(scratch, value=nl.exp(nl.load(x)))
    nl.store(out, value=nl.load(scratch) + 1.0)
    return out


def test_unreturned_shared_hbm_is_scratch() -> None:
    x = rand(128, 16)
    np.testing.assert_allclose(
        nki.simulate_kernel(scratch_roundtrip, x), np.exp(x) + 1.0, rtol=1e-5
    )


@nki.jit
def softmax_rows_isa(x):
    """Softmax with ScalarE's row sums (activation reduce_res), tensor_reduce(negate=True),
    tensor_scalar_reduce, and the identity as nl.shared_constant transposing on TensorE."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    outT = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    row_max = nl.ndarray((128, 1), dtype=nl.float32)
    scaled = nisa.tensor_scalar_reduce(
        data=t,
        op0=nl.multiply,
        operand0=1.0,
        reduce_op=nl.max,
        reduce_res=row_max,
        engine=nisa.vector_engine,
    )
    neg_max = nisa.tensor_reduce(op=nl.max, data=scaled, axis=1, negate=True)
    sums = nl.ndarray((128, 1), dtype=nl.float32)
    e = nisa.activation(
        op=nl.exp,
        data=scaled,
        bias=neg_max,
        reduce_op=nl.add,
        reduce_res=sums,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    sm = nisa.tensor_scalar(data=e, op0=nl.multiply, operand0=nisa.reciprocal(sums))
    nl.store(out, value=sm)
    ident = nl.load(nl.shared_constant(np.identity(128, dtype=np.int8), dtype=nl.float32))
    nl.store(outT, value=nisa.nc_matmul(sm, ident))
    return out, outT


def test_softmax_with_row_sum_apis() -> None:
    x = rand(128, 64)
    e = np.exp(x - x.max(1, keepdims=True))
    ref = e / e.sum(1, keepdims=True)
    got, got_t = nki.simulate_kernel(softmax_rows_isa, x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_t, ref.T, rtol=1e-4, atol=1e-6)


def test_compiler_directives_change_nothing() -> None:
    @nki.compiler.skip_middle_end_transformations
    @nki.jit
    def ordered(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for _ in nl.sequential_range(1, directives=nki.compiler.no_reorder()):
            nl.store(out, value=nl.load(x))
        return out

    x = rand(128, 8)
    np.testing.assert_array_equal(nki.simulate_kernel(ordered, x), x)


@nki.jit
def ping_pong(x):
    """Row tiles staged through two halves of one SBUF tile, picked by the loop variable
    modulo 2 (software pipelining's double buffer); (i * 4) // 2 is an affine index too."""
    n, f = x.shape[0] // 128, x.shape[1]
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    stage = nl.ndarray((nl.par_dim(128), 2, f), dtype=x.dtype, buffer=nl.sbuf)
    for i in nl.sequential_range(n):
        stage[:, i % 2, :] = nl.load(x[nl.ds((i * 4) // 4 * 128, 128), :])
        stage[:, (i + 1) % 2, :] = nl.multiply(stage[:, i % 2, :], 2.0)
        nl.store(out[nl.ds(i * 128, 128), :], value=stage[:, (i + 3) % 2, :])
    return out


@pytest.mark.parametrize("tiles", [4, 3])
def test_loop_variable_modulo_picks_a_buffer_per_iteration(tiles: int) -> None:
    x = rand(128 * tiles, 16)
    np.testing.assert_allclose(nki.simulate_kernel(ping_pong, x), x * 2, rtol=1e-6)
    # An even trip count stays a loop (two iterations per step); an odd one unrolls.
    assert ("scf.for" in ping_pong.specialize(x).mlir) == (tiles % 2 == 0)


def test_loop_variable_division_needs_a_divisible_coefficient() -> None:
    @nki.jit
    def halves(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            nl.store(out[nl.ds(i // 2 * 128, 128), :], value=nl.load(x[0:128, :]))
        return out

    with pytest.raises(nki.KernelError, match=r"test_nki_apis\.py:\d+: error: .*// 2"):
        nki.simulate_kernel(halves, rand(256, 8))


@nki.jit
def scores_by_tile(q, k):
    """q^T k in [128, 512] PSUM tiles of one block tensor far larger than PSUM (each tile
    written and read in its own iteration, as NKI allocates block tiles), the row sums of
    each row tile accumulated in a second PSUM block tensor by matmuls with ones."""
    nq, nk = q.shape[1] // 128, k.shape[1] // 512
    out = nl.ndarray((q.shape[1], k.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    sums = nl.ndarray((q.shape[1], 128), dtype=nl.float32, buffer=nl.shared_hbm)
    q_t, k_t = nl.load(q), nl.load(k)
    ones = nl.ones((128, 128), dtype=nl.float32)
    qk = nl.ndarray((nq, nk, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    acc = nl.ndarray((nq, nl.par_dim(128), 128), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(nq):
        for j in nl.affine_range(nk):
            qk[i, j] = nisa.nc_matmul(q_t[:, nl.ds(i * 128, 128)], k_t[:, nl.ds(j * 512, 512)])
            row = nl.copy(qk[i, j])
            nl.store(out[nl.ds(i * 128, 128), nl.ds(j * 512, 512)], value=row)
            for c in nl.affine_range(4):
                row_t = nl.copy(nl.transpose(row[:, nl.ds(c * 128, 128)]))
                acc[i] += nisa.nc_matmul(row_t, ones)
        nl.store(sums[nl.ds(i * 128, 128), :], value=acc[i])
    return out, sums


def test_psum_block_tensor_larger_than_psum_gets_tiles_as_used() -> None:
    q, k = rand(128, 512), rand(128, 2048)  # 4 x 4 tiles of 2 KiB: 32 KiB of PSUM
    got, sums = nki.simulate_kernel(scores_by_tile, q, k)
    np.testing.assert_allclose(got, q.T @ k, rtol=1e-4, atol=1e-4)
    want = np.repeat((q.T @ k).sum(axis=1, keepdims=True), 128, axis=1)
    np.testing.assert_allclose(sums, want, rtol=1e-4, atol=1e-3)


@nki.jit
def two_pass_exp(q, k):
    """The attention tutorial v3's shape: a PSUM block tensor larger than PSUM written by
    one loop and read by a later one, so all its tiles are live at once: spilled to HBM."""
    nk = k.shape[1] // 512
    out = nl.ndarray((128, k.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    q_t, k_t = nl.load(q), nl.load(k)
    qk = nl.ndarray((nk, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    for j in nl.affine_range(nk):
        qk[j] = nisa.nc_matmul(q_t, k_t[:, nl.ds(j * 512, 512)])
    for j in nl.affine_range(nk):
        nl.store(out[:, nl.ds(j * 512, 512)], value=nl.exp(qk[j]))
    return out


def test_psum_block_tensor_whose_tiles_live_together_is_spilled() -> None:
    q, k = rand(128, 128) * 0.1, rand(128, 9 * 512) * 0.1  # 9 tiles of 2 KiB: 18 KiB
    got = nki.simulate_kernel(two_pass_exp, q, k)
    np.testing.assert_allclose(got, np.exp(q.T @ k), rtol=1e-4, atol=1e-5)
    assert "memref.alloc() : memref<128x9x512xf32> loc" in two_pass_exp.specialize(q, k).mlir


def test_block_tensor_allocated_per_tile_is_used_a_tile_at_a_time() -> None:
    @nki.jit
    def whole_store(x):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        big = nl.zeros((9, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        nl.store(out, value=big[0:2])
        return out

    with pytest.raises(
        nki.KernelError, match=r"test_nki_apis\.py:\d+: error: a slice over a block dimension"
    ):
        nki.simulate_kernel(whole_store, rand(128, 8))


class _Offsets:
    """A hand allocator in the tutorials' style: each call hands out the next bytes."""

    def __init__(self) -> None:
        self.offset = 0

    def take(self, nbytes: int, buffers: int = 1) -> object:
        addr = self.offset
        self.offset += nbytes * buffers
        return nki.compiler.sbuf.mod_alloc(base_addr=addr, num_free_tiles=(buffers,))


OFFSETS = _Offsets()


@nki.jit
def hand_placed(x):
    """Double-buffered row tiles at hand-given SBUF addresses (two physical tiles for n
    logical ones) and PSUM transposes rotating over two banks; the loop variable modulo
    picks the physical tile, so the loop is traced two iterations per step."""
    n = x.shape[0] // 128
    out = nl.ndarray((n * 128, 128), dtype=x.dtype, buffer=nl.shared_hbm)
    rows = nl.ndarray((n, nl.par_dim(128), 128), dtype=x.dtype, buffer=OFFSETS.take(512, 2))
    col = nl.ndarray((nl.par_dim(128), 128), dtype=x.dtype, buffer=OFFSETS.take(512))
    tr = nl.ndarray(
        (n, nl.par_dim(128), 128),
        dtype=nl.float32,
        buffer=nki.compiler.psum.mod_alloc(base_bank=2, num_bank_tiles=(2,)),
    )
    for i in nl.affine_range(n):
        rows[i] = nl.load(x[nl.ds(i * 128, 128), :])
        tr[i] = nisa.nc_transpose(rows[i])
        col[...] = nl.copy(tr[i])
        nl.store(out[nl.ds(i * 128, 128), :], value=col)
    return out


def test_hand_allocation_by_modulo_places_tiles_at_their_addresses() -> None:
    x = rand(384, 128)
    got = nki.simulate_kernel(hand_placed, x)
    want = np.concatenate([x[i * 128 : (i + 1) * 128].T for i in range(3)])
    np.testing.assert_array_equal(got, want)
    mlir = hand_placed.specialize(x).mlir
    # SBUF: rows at 0 and 512, col at 1024; PSUM banks 2 and 3 (2 KiB each). The tracer ran
    # the kernel twice (the loop of 3 unrolls for i % 2), and the allocator's offset was
    # as the first run left it each time.
    for address in (0, 512, 1024, 4096, 6144):
        assert f"nisa.address = {address} : i64" in mlir
    assert "nisa.address = 1536" not in mlir and "nisa.address = 2048" not in mlir


def _alternate(idx, pdim_size, fdim_size):
    """Even logical tiles at byte 2048 of every partition, odd ones right after them."""
    (i,) = idx
    return (0, 2048 + (i % 2) * fdim_size)


@nki.jit
def placed_by_function(x):
    n = x.shape[0] // 128
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    rows = nl.ndarray(
        (n, nl.par_dim(128), x.shape[1]),
        dtype=x.dtype,
        buffer=nki.compiler.sbuf.alloc(_alternate),
    )
    for i in nl.affine_range(n):
        rows[i] = nl.load(x[nl.ds(i * 128, 128), :])
        nl.store(out[nl.ds(i * 128, 128), :], value=nl.exp(rows[i]))
    return out


def test_hand_allocation_by_a_function() -> None:
    x = rand(384, 64)
    np.testing.assert_allclose(nki.simulate_kernel(placed_by_function, x), np.exp(x), rtol=1e-5)
    mlir = placed_by_function.specialize(x).mlir
    assert mlir.count("nisa.address = 2048 : i64") == 1  # tiles 0 and 2 share one buffer
    assert mlir.count("nisa.address = 2304 : i64") == 1


def test_hand_allocation_errors_name_the_line() -> None:
    @nki.jit
    def too_far(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        far = nki.compiler.sbuf.mod_alloc(base_addr=1 << 20)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=far)
        t[...] = nl.load(x)
        nl.store(out, value=t)
        return out

    with pytest.raises(nki.KernelError, match=r"test_nki_apis\.py:\d+.*sbuf has"):
        nki.simulate_kernel(too_far, rand(128, 8))
    with pytest.raises(nki.KernelError, match=r"nki\.compiler\.psum\.swizzle_alloc"):
        nki.compiler.psum.swizzle_alloc()


def test_static_cast() -> None:
    x = np.linspace(-1, 1, 6)
    assert nl.static_cast(x, nl.float32).dtype == np.float32
    assert str(nl.static_cast(x, nl.bfloat16).dtype) == "torch.bfloat16"


@nki.jit
def matmul_by_transposed(x, w):
    """nl.matmul whose moving operand is nl.transpose's PSUM result: copied to SBUF first."""
    out = nl.ndarray((x.shape[0], w.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    wt = nl.transpose(nl.load(w))  # [K, N] in PSUM
    nl.store(out, value=nl.matmul(nl.load(x), wt, transpose_x=False))
    return out


def test_matmul_reads_a_psum_operand_through_sbuf() -> None:
    x, w = rand(128, 128), rand(64, 128)
    np.testing.assert_allclose(
        nki.simulate_kernel(matmul_by_transposed, x, w), x @ w.T, rtol=1e-4, atol=1e-4
    )


@nki.jit
def masked_row_square_sums(x):
    """Row sums of squares by ScalarE's reduce_res, the last row tile masked."""
    n, d = x.shape
    out = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:d]
    j_p, j_o = nl.mgrid[0:128, 0:1]
    for t in nl.affine_range((n + 127) // 128):
        rows = t * 128 + i_p < n
        tile = nl.load(x[t * 128 + i_p, i_f], mask=rows)
        squares = nl.ndarray((128, d), dtype=nl.float32)
        total = nl.ndarray((128, 1), dtype=nl.float32)
        nisa.activation(dst=squares, op=nl.square, data=tile, reduce_op=nl.add,
                        reduce_res=total, mask=rows)  # fmt: skip
        nl.store(out[t * 128 + j_p, j_o], value=total, mask=t * 128 + j_p < n)
    return out


def test_masked_activation_reduces_the_rows_it_keeps() -> None:
    # The mask applies to reduce_res too (it used to keep all 128 rows of the accumulator
    # against the masked data's fewer, and the verifier refused the instruction).
    x = rand(300, 64)
    got = nki.simulate_kernel(masked_row_square_sums, x)
    np.testing.assert_allclose(got[:, 0], (x * x).sum(1), rtol=1e-5)
