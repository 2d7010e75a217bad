"""torchneuron.nki: NKI kernels traced into nisa, compiled, and run on the engine model.

Our own kernels in the style of each NKI feature, checked against NumPy/PyTorch; every error a
kernel author can make points at the kernel's line."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import torchneuron
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron import nki_op

pytest.importorskip("torchneuron._C")

SOURCE = Path(__file__).read_text().splitlines()


def line_of(marker: str) -> int:
    """The line of this file that carries ``# <marker>``."""
    hits = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, marker
    return hits[0]


def raises_at(marker: str, message: str) -> pytest.RaisesContext[nki.KernelError]:
    pattern = rf"test_nki\.py:{line_of(marker)}: error: .*{message}"
    return pytest.raises(nki.KernelError, match=pattern)


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------


@nki.jit
def add_kernel(a, b):
    """Tensor addition over a 2-D grid of [128, 256] tiles, indexed with nl.arange."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(256)[None, :]
    for i in nl.affine_range(a.shape[0] // 128):
        for j in nl.affine_range(a.shape[1] // 256):
            x = nl.load(a[i * 128 + i_p, j * 256 + i_f])
            y = nl.load(b[i * 128 + i_p, j * 256 + i_f])
            nl.store(out[i * 128 + i_p, j * 256 + i_f], value=nl.add(x, y))
    return out


@nki.jit
def matmul_kernel(lhs_t, rhs):
    """out = lhs_t.T @ rhs: 128x128 stationary and 128x512 moving tiles, accumulating over K in
    a PSUM bank, evicted to SBUF and stored."""
    k_size, m_size = lhs_t.shape
    _, n_size = rhs.shape
    out = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.shared_hbm)
    tk, tm, tn = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    for m in nl.affine_range(m_size // tm):
        for n in nl.affine_range(n_size // tn):
            acc = nl.zeros((tm, tn), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_size // tk):
                stationary = nl.load(lhs_t[k * tk : (k + 1) * tk, m * tm : (m + 1) * tm])
                moving = nl.load(rhs[k * tk : (k + 1) * tk, n * tn : (n + 1) * tn])
                acc += nl.matmul(stationary, moving, transpose_x=True)
            nl.store(out[m * tm : (m + 1) * tm, n * tn : (n + 1) * tn], value=nl.copy(acc))
    return out


@nki.jit
def transpose_kernel(x):
    """[P, F] -> [F, P] on TensorE, tile by tile, with mgrid indices."""
    rows, cols = x.shape
    out = nl.ndarray((cols, rows), dtype=x.dtype, buffer=nl.shared_hbm)
    ix = nl.mgrid[0:128, 0:64]
    it = nl.mgrid[0:64, 0:128]
    for i in nl.affine_range(rows // 128):
        for j in nl.affine_range(cols // 64):
            tile = nl.load(x[i * 128 + ix.p, j * 64 + ix.x])
            flipped = nl.copy(nl.transpose(tile), dtype=x.dtype)
            nl.store(out[j * 64 + it.p, i * 128 + it.x], value=flipped)
    return out


@nki.jit
def softmax_kernel(x):
    """Row softmax: max, exp(x - max) on ScalarE, row sums, divide."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        rows = nl.load(x[i * 128 : (i + 1) * 128, :])
        row_max = nl.max(rows, axis=1, keepdims=True)
        e = nl.exp(nl.subtract(rows, row_max))
        total = nl.sum(e, axis=1, keepdims=True)
        nl.store(out[i * 128 : (i + 1) * 128, :], value=e / total)
    return out


@nki.jit
def rmsnorm_kernel(x, weight, eps):
    """RMSNorm over rows; the weight is loaded once, broadcast to every partition."""
    n, d = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    w = nl.load(weight.reshape((1, d)).broadcast_to((128, d)))
    for i in nl.affine_range(n // 128):
        rows = nl.load(x[i * 128 : (i + 1) * 128, :])
        mean_sq = nl.mean(nl.square(rows), axis=1)
        scale = nl.rsqrt(mean_sq + eps)
        nl.store(out[i * 128 : (i + 1) * 128, :], value=rows * scale * w)
    return out


@nki.jit
def scale_grid_kernel(x, factor):
    """SPMD: program (i, j) of the grid scales tile (i, j)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tp = x.shape[0] // nl.num_programs(0)
    tf = x.shape[1] // nl.num_programs(1)
    i, j = nl.program_id(0), nl.program_id(1)
    tile = nl.load(x[i * tp : (i + 1) * tp, j * tf : (j + 1) * tf])
    nl.store(out[i * tp : (i + 1) * tp, j * tf : (j + 1) * tf], value=tile * factor)
    return out


# ----------------------------------------------------------------------------------------------
# Numerics
# ----------------------------------------------------------------------------------------------


def test_add_numpy_and_torch() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 512), dtype=np.float32)
    b = rng.standard_normal((256, 512), dtype=np.float32)
    out = nki.simulate_kernel(add_kernel, a, b)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, a + b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    torch.testing.assert_close(add_kernel(ta, tb), ta + tb, rtol=0, atol=0)


def test_add_on_neuron_tensors() -> None:
    a = torch.randn(128, 256).to("neuron")
    b = torch.randn(128, 256).to("neuron")
    out = add_kernel(a, b)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_matmul(dtype: torch.dtype) -> None:
    lhs_t = torch.randn(384, 256, dtype=dtype)
    rhs = torch.randn(384, 1024, dtype=dtype)
    out = matmul_kernel(lhs_t, rhs)
    expected = lhs_t.float().T @ rhs.float()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-3)


def test_matmul_loops_stay_loops() -> None:
    """The program does not grow with the problem: the K, M, N loops are loops."""
    small = matmul_kernel.specialize(torch.empty(512, 512), torch.empty(512, 2048))
    large = matmul_kernel.specialize(torch.empty(1024, 1024), torch.empty(1024, 4096))
    assert small.kernel.num_instructions == large.kernel.num_instructions
    assert '"loop"' in large.kernel.program_json


def test_matmul_psum_accumulates_in_place() -> None:
    traced = matmul_kernel.specialize(torch.empty(256, 128), torch.empty(256, 512))
    assert re.search(r"nisa\.matmul .*\{accumulate\}", traced.mlir)
    # One PSUM tile: the += retargets each matmul to the accumulator instead of adding copies.
    assert len(re.findall(r"memref\.alloc\(\) : memref<\w+, #nisa\.mem<psum>>", traced.mlir)) == 1
    assert "tensor_tensor" not in traced.mlir


def test_affine_loops_rotate_tiles() -> None:
    """An affine_range body holds several iterations whose tiles have addresses of their own,
    so the next loads overlap this iteration's matmuls: same numbers, less modeled time."""
    lhs_t = torch.randn(512, 256, dtype=torch.bfloat16)
    rhs = torch.randn(512, 1024, dtype=torch.bfloat16)
    serial = nki.jit(matmul_kernel.fn, rotate=1)
    assert serial.specialize(lhs_t, rhs).mlir.count("nisa.matmul") == 1
    assert matmul_kernel.specialize(lhs_t, rhs).mlir.count("nisa.matmul") == 2 * 2 * 4
    torch.testing.assert_close(matmul_kernel(lhs_t, rhs), serial(lhs_t, rhs), rtol=0, atol=0)
    rotated_ns = nki.benchmark(matmul_kernel, lhs_t, rhs).device_ns
    assert rotated_ns < nki.benchmark(serial, lhs_t, rhs).device_ns


def test_transpose() -> None:
    x = torch.randn(256, 128)
    torch.testing.assert_close(transpose_kernel(x), x.T.contiguous(), rtol=0, atol=0)
    assert "nisa.matmul" in transpose_kernel.specialize(x).mlir  # on TensorE


def test_load_transpose2d() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load_transpose2d(x))
        return out

    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, x), x.T)


def test_softmax() -> None:
    x = torch.randn(256, 384) * 4
    torch.testing.assert_close(softmax_kernel(x), torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)


def test_rmsnorm() -> None:
    x, w, eps = torch.randn(256, 512), torch.randn(512), 1e-6
    expected = x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + eps) * w
    torch.testing.assert_close(rmsnorm_kernel(x, w, eps), expected, rtol=1e-5, atol=1e-5)


def test_spmd_grid() -> None:
    x = np.random.default_rng(1).standard_normal((256, 384), dtype=np.float32)
    out = nki.simulate_kernel(scale_grid_kernel[2, 3], x, 3.0)
    np.testing.assert_allclose(out, x * 3.0, rtol=1e-6)
    # The grid is a loop around the kernel body: one program for all six instances.
    assert scale_grid_kernel[2, 3].specialize(x, 3.0).mlir.count("scf.for") == 2


def test_static_and_sequential_ranges() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, x.shape[1]), nl.float32)
        for i in nl.sequential_range(x.shape[0] // 128):
            acc[...] = nl.add(acc, nl.load(x[i * 128 : (i + 1) * 128, :]))
        for r in nl.static_range(2):
            nl.store(out[r * 128 : (r + 1) * 128, :], value=acc * float(r + 1))
        return out

    x = np.random.default_rng(2).standard_normal((256, 64), dtype=np.float32)
    out = nki.simulate_kernel(kernel, x)
    partial = x[:128] + x[128:]
    np.testing.assert_allclose(out, np.concatenate([partial, 2 * partial]), rtol=1e-6)


def test_one_trace_per_signature() -> None:
    calls = []

    @nki.jit
    def kernel(x):
        calls.append(1)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.exp(nl.load(x)))
        return out

    for _ in range(3):
        kernel(torch.zeros(128, 8))
    kernel(torch.zeros(64, 8))
    assert len(calls) == 2


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------


def test_benchmark_reports_model_time_and_engines() -> None:
    lhs_t = torch.randn(512, 256, dtype=torch.bfloat16)
    rhs = torch.randn(512, 1024, dtype=torch.bfloat16)
    result = nki.benchmark(matmul_kernel, lhs_t, rhs)
    assert result.flops == 2 * 512 * 256 * 1024
    assert result.device_ns > 0 and result.latency_us == result.device_ns / 1e3
    assert 0 < result.utilization["tensor"] <= 1
    assert 0 < result.tensor_peak_fraction <= 1
    assert result.nc_latency.get_latency_percentile(50) == result.latency_us
    assert "matmul_kernel on trn2" in result.summary()


def test_profile_records_kernel_and_lines() -> None:
    x = torch.randn(128, 256)
    with torchneuron.profile() as prof:
        softmax_kernel(x)
    (record,) = prof.kernels
    assert record["name"] == "softmax_kernel"
    assert record["device_ns"] > 0
    assert any(
        line.endswith(f"test_nki.py:{_line('e = nl.exp(')}") for line in record["source_lines"]
    )


def _line(text: str) -> int:
    return next(i + 1 for i, t in enumerate(SOURCE) if text in t)


# ----------------------------------------------------------------------------------------------
# Errors at the kernel's line
# ----------------------------------------------------------------------------------------------


def test_unsupported_api_names_itself_and_line() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.device_print("x", x)  # unsupported-api
        return out

    with raises_at("unsupported-api", "nl.device_print is not supported"):
        kernel(np.zeros((128, 4), np.float32))


def test_partition_dim_over_128() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x[0:256, :])  # partitions
        nl.store(out[0:256, :], value=t)
        return out

    with raises_at("partitions", "uses 256 partitions; trn2 has 128"):
        kernel(np.zeros((256, 4), np.float32))


def test_sbuf_over_capacity() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        big = nl.zeros((128, 60000), nl.float32)  # sbuf-capacity
        nl.store(out, value=nl.add(nl.load(x), big[:, 0:4]))
        return out

    with raises_at("sbuf-capacity", "needs 240000 bytes per partition of sbuf"):
        kernel(np.zeros((128, 4), np.float32))


def test_psum_over_capacity() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 8192), nl.float32, buffer=nl.psum)  # psum-capacity
        nl.store(out, value=nl.add(nl.load(x), acc[:, 0:4]))
        return out

    with raises_at("psum-capacity", "needs 32768 bytes per partition of psum"):
        kernel(np.zeros((128, 4), np.float32))


def test_matmul_operand_in_psum() -> None:
    # nisa.nc_matmul is the instruction: its operands must be in SBUF (nl.matmul copies a
    # PSUM operand there first, test_nki_apis.py).
    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        p = nl.matmul(t, t, transpose_x=True)
        q = nisa.nc_matmul(p, t)  # matmul-psum
        nl.store(out, value=nl.copy(q))
        return out

    with raises_at("matmul-psum", "stationary and moving operands must be in SBUF"):
        kernel(np.zeros((128, 128), np.float32))


def test_matmul_dtype_the_engine_cannot_take() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, value=nl.copy(nl.matmul(t, t, transpose_x=True)))  # matmul-int
        return out

    with raises_at("matmul-int", "TensorE takes fp8, bf16, fp16 or fp32 operands, not 'i32'"):
        kernel(np.zeros((128, 128), np.int32))


def test_index_out_of_bounds() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(3):
            rows = x[i * 128 : (i + 1) * 128, :]  # oob
            nl.store(out[0:128, :], value=nl.load(rows))
        return out

    with raises_at("oob", r"index out of bounds: \[0, 383\] on a dimension of size 256"):
        kernel(np.zeros((256, 4), np.float32))


def test_branch_on_loop_variable() -> None:
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            if i == 0:  # branch
                nl.store(out, value=nl.load(x))
        return out

    with raises_at("branch", "cannot branch on a loop variable"):
        kernel(np.zeros((128, 4), np.float32))


def test_writing_an_input_is_an_error() -> None:
    @nki.jit
    def kernel(x):
        nl.store(x, value=nl.exp(nl.load(x)))  # write-input
        return x

    with raises_at("write-input", "may not write its input arguments"):
        kernel(np.zeros((128, 4), np.float32))


def test_store_from_psum_evicts_through_sbuf() -> None:
    # NKI's tutorials store matmul results straight from PSUM; DMA reads SBUF, so the
    # tracer copies the tile there first.
    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, value=nl.matmul(t, t, transpose_x=True))
        return out

    x = np.random.default_rng(3).standard_normal((128, 128)).astype(np.float32)
    np.testing.assert_allclose(kernel(x), x.T @ x, rtol=1e-4, atol=1e-4)
    assert "nisa.copy" in kernel.specialize(x).mlir


# ----------------------------------------------------------------------------------------------
# Kernels inside torch.compile, and autograd
# ----------------------------------------------------------------------------------------------


@nki.jit
def mul_kernel(a, b):
    """Elementwise product of two [128, F] tensors."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(a), nl.load(b)))
    return out


@nki.jit
def cast_kernel(x, dtype):
    """x converted to ``dtype`` (an NKI dtype: a static argument)."""
    out = nl.ndarray(x.shape, dtype=dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(nl.load(x), dtype=dtype))
    return out


class KernelMul(torch.autograd.Function):
    """a * b with a kernel forward and kernel backward, as one would write it for CUDA."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, a: torch.Tensor, b: torch.Tensor):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(a, b)
        return mul_kernel(a, b)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor):  # type: ignore[no-untyped-def]
        a, b = ctx.saved_tensors  # type: ignore[attr-defined]
        return mul_kernel(grad, b), mul_kernel(grad, a)


def _kernel_targets(fn: object, *args: torch.Tensor) -> list[str]:
    """The NKI operators in the graph Dynamo captures for ``fn(*args)``."""
    from torchneuron.backend import neuron_backend

    seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        for module in gm.modules():  # autograd.Function bodies are subgraphs
            if isinstance(module, torch.fx.GraphModule):
                nodes = module.graph.nodes
                seen.extend(str(n.target) for n in nodes if nki_op.is_kernel_op(n.target))
        return neuron_backend(gm, example_inputs)

    torch.compile(fn, backend=backend, fullgraph=True)(*args)  # type: ignore[arg-type]
    return seen


def test_kernels_inside_torch_compile_are_graph_operators() -> None:
    # No graph break (fullgraph), the kernel is an operator of the graph with its static
    # arguments (eps) and launch grid, runs on the engine model, and is not a fallback.
    x, w = torch.randn(256, 64), torch.randn(64)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = rmsnorm_kernel(x.relu(), w, 1e-5)
        return scale_grid_kernel[2, 2](y, 3.0) + 1

    before = torchneuron.stats()["kernels_run"]
    out = torch.compile(f, backend="neuron", fullgraph=True)(x, w)
    r = x.relu()
    expected = r * torch.rsqrt(r.square().mean(1, keepdim=True) + 1e-5) * w * 3.0 + 1
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}
    assert stats["kernels_run"] - before >= 3  # both kernels and at least one region
    torch._dynamo.reset()
    targets = _kernel_targets(f, x, w)
    assert targets == [
        "torchneuron_nki.rmsnorm_kernel.default",
        "torchneuron_nki.scale_grid_kernel.default",
    ]
    # A new size traces the kernel again through the operator's fake implementation.
    x2, w2 = torch.randn(256, 96), torch.randn(96)
    out2 = torch.compile(f, backend="neuron")(x2, w2)
    r2 = x2.relu()
    expected2 = r2 * torch.rsqrt(r2.square().mean(1, keepdim=True) + 1e-5) * w2 * 3.0 + 1
    torch.testing.assert_close(out2, expected2, atol=1e-4, rtol=1e-4)


def test_kernel_with_an_argument_the_graph_cannot_hold_runs_eagerly() -> None:
    # An NKI dtype cannot travel in the operator's literal: Dynamo breaks the graph there and
    # the kernel runs as an eager call, still on the engine model.
    x = torch.randn(128, 64)
    f = torch.compile(lambda x: cast_kernel(x * 2, nl.bfloat16), backend="neuron")
    out = f(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, (x * 2).bfloat16())
    assert torchneuron.stats()["ops_fallback"] == {}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autograd_function_with_kernel_backward(compiled: bool) -> None:
    a, b = torch.randn(128, 64, requires_grad=True), torch.randn(128, 64, requires_grad=True)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return KernelMul.apply(a, b).sin().sum()  # type: ignore[no-any-return]

    fn = torch.compile(f, backend="neuron", fullgraph=True) if compiled else f
    fn(a, b).backward()
    ra, rb = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    (ra * rb).sin().sum().backward()
    torch.testing.assert_close(a.grad, ra.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.grad, rb.grad, atol=1e-5, rtol=1e-5)
    assert torchneuron.stats()["ops_fallback"] == {}
    if compiled:
        torch._dynamo.reset()
        a.grad = b.grad = None
        # forward, and the backward's two
        assert _kernel_targets(f, a, b) == ["torchneuron_nki.mul_kernel.default"] * 3


def test_compiled_kernel_on_neuron_tensors() -> None:
    x, w = torch.randn(128, 64), torch.randn(64)
    f = torch.compile(lambda x, w: rmsnorm_kernel(x, w, 1e-6) * 2, backend="neuron")
    out = f(x.to("neuron"), w.to("neuron"))
    assert out.device.type == "neuron"
    expected = x * torch.rsqrt(x.square().mean(1, keepdim=True) + 1e-6) * w * 2
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)


def test_graphs_calling_kernels_are_not_cached_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel's code is not part of a graph's cache key: an edited kernel would meet
    # regions compiled for its old outputs. Such graphs cache only their regions' programs.
    monkeypatch.setenv("TORCHNEURON_CACHE", "1")
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path))
    x = torch.randn(128, 64)
    out = torch.compile(lambda x: mul_kernel(x.exp(), x) + 1, backend="neuron")(x)
    torch.testing.assert_close(out, x.exp() * x + 1)
    info = torchneuron.cache_info()
    assert info["graph_skipped"] == 1 and info["graph_misses"] == 0
