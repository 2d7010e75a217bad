"""Sums over leading dims (column sums: bias and norm-weight gradients) lower to TensorE matmuls
with a ones vector that read the rows in place (passes/tile/LowerColumnSum.cpp): golden checks
against CPU eager in compiled graphs, as eager device kernels and in the backward graphs
aot_autograd writes, with no fallback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import torchneuron
from torchneuron import device as neuron_device

neuron_device.register()

F32 = {"atol": 1e-4, "rtol": 1e-5}
BF16 = {"atol": 1.6e-2, "rtol": 1.6e-2}  # one bf16 rounding of the fp32 sum, and then some


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


def _reference(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The op in float32 on the same (possibly bf16) values, rounded to the input's dtype."""
    return fn(x.float()).to(x.dtype)


CASES = [
    # (shape, dims, keepdim, mean)
    ((300, 700), (0,), False, False),
    ((300, 700), (0,), True, False),
    ((2, 256, 1024), (0, 1), False, False),
    ((3, 129, 1300), (0, 1), True, False),
    ((3, 129, 1300), (0, 1), False, True),
    ((5, 7, 300), (0,), True, True),
    ((4, 50, 6), (1,), False, False),  # a middle dim: a column sum per outer index
]
IDS = [
    f"{'x'.join(map(str, s))}-dims{''.join(map(str, d))}{'-keep' if k else ''}"
    f"{'-mean' if m else ''}"
    for s, d, k, m in CASES
]


def _fn(dims: tuple[int, ...], keepdim: bool, mean: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    if mean:
        return lambda x: x.mean(dim=dims, keepdim=keepdim)
    return lambda x: x.sum(dim=dims, keepdim=keepdim)


def _lowered(dump: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(dump.glob("*/*lower-to-nisa.mlir")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("shape", "dims", "keepdim", "mean"), CASES, ids=IDS)
def test_compiled_column_sum_matches_eager_on_tensore(
    shape: tuple[int, ...],
    dims: tuple[int, ...],
    keepdim: bool,
    mean: bool,
    dtype: torch.dtype,
    tmp_path: Path,
) -> None:
    torch._dynamo.reset()
    fn = _fn(dims, keepdim, mean)
    x = _randn(*shape, dtype=dtype)
    before = torchneuron.stats()["ops_fallback"]
    out = torch.compile(fn, backend="neuron", options={"dump_dir": str(tmp_path)})(x)
    assert torchneuron.stats()["ops_fallback"] == before
    torch.testing.assert_close(out, _reference(fn, x), **(F32 if dtype == torch.float32 else BF16))
    lowered = _lowered(tmp_path)
    # Reduced across partitions by matmuls with ones, not by a transposed copy and VectorE;
    # more rows than partitions accumulate in PSUM.
    assert "nisa.matmul" in lowered
    rows = 1
    for d in dims:
        rows *= shape[d]
    assert ("{accumulate}" in lowered) == (rows > 128)
    assert "nisa.tensor_reduce" not in lowered


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("shape", "dims", "keepdim", "mean"), CASES, ids=IDS)
def test_eager_column_sum_matches_cpu(
    shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool, mean: bool, dtype: torch.dtype
) -> None:
    fn = _fn(dims, keepdim, mean)
    x = _randn(*shape, dtype=dtype)
    before = torchneuron.stats()["ops_fallback"]
    out = fn(x.to("neuron"))
    assert out.device.type == "neuron"
    assert torchneuron.stats()["ops_fallback"] == before
    torch.testing.assert_close(
        out.cpu(), _reference(fn, x), **(F32 if dtype == torch.float32 else BF16)
    )


def test_sum_dim_intlist_over_batch_and_sequence_as_aot_writes_a_bias_grad(tmp_path: Path) -> None:
    # aot_autograd's backward of a (B, S, H) bias: aten.sum.dim_IntList(grad, [0, 1]).
    torch._dynamo.reset()
    g = _randn(2, 200, 640)

    def fn(grad: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.sum.dim_IntList(grad, [0, 1])

    out = torch.compile(fn, backend="neuron", options={"dump_dir": str(tmp_path)})(g)
    torch.testing.assert_close(out, g.sum((0, 1)), **F32)
    assert "nisa.tensor_reduce" not in _lowered(tmp_path)


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_norm_weight_gradients_match_cpu(norm: str, dtype: torch.dtype) -> None:
    """The weight (and bias) gradients of a norm are column sums of the backward graph."""
    torch._dynamo.reset()
    hidden = 700
    x = _randn(3, 100, hidden, dtype=dtype)
    w0 = (1 + 0.1 * _randn(hidden, seed=1)).to(dtype)
    b0 = (0.1 * _randn(hidden, seed=2)).to(dtype)
    grad = _randn(3, 100, hidden, dtype=dtype, seed=3)

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if norm == "layer_norm":
            return F.layer_norm(x, (hidden,), w, b)
        return F.rms_norm(x, (hidden,), w) + b

    def grads(fn: Callable[..., torch.Tensor], cast: torch.dtype) -> list[torch.Tensor]:
        args = [t.detach().to(cast).clone().requires_grad_() for t in (x, w0, b0)]
        fn(*args).backward(grad.to(cast))
        return [a.grad for a in args]

    before = torchneuron.stats()["ops_fallback"]
    got = grads(torch.compile(f, backend="neuron"), dtype)
    assert torchneuron.stats()["ops_fallback"] == before
    want = grads(f, torch.float32)
    # bf16: the gradients pass through several bf16 roundings of the forward and backward.
    tol = F32 if dtype == torch.float32 else {"atol": 0.5, "rtol": 3e-2}
    for name, a, e in zip(("x", "weight", "bias"), got, want, strict=True):
        torch.testing.assert_close(a.float(), e, **tol, msg=lambda m, n=name: f"{n}: {m}")


# Whole-tensor reductions (x.sum(), x.mean(), a loss): rows on every partition, then the sum
# of the row sums (decompositions.whole_sum); small or odd-sized tensors keep the direct path.
WHOLE = [
    ("sum", lambda x: x.sum()),
    ("mean", lambda x: x.mean()),
    ("sum_every_dim_keepdim", lambda x: x.sum(dim=(0, 1, 2), keepdim=True)),
    ("mean_every_dim", lambda x: x.mean(dim=(2, 0, 1))),
    ("loss", lambda x: x.float().pow(2).mean()),
]


@pytest.mark.parametrize("shape", [(2, 256, 1024), (3, 5, 7)], ids=["large", "small"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("name", "fn"), WHOLE, ids=[w[0] for w in WHOLE])
def test_whole_tensor_reductions(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype, shape: tuple
) -> None:
    x = _randn(*shape, dtype=dtype)
    want = fn(x.float()).to(fn(x).dtype)  # in float32, rounded to the op's result dtype
    tol = F32 if dtype == torch.float32 else BF16
    torchneuron.reset_stats()
    compiled = torch.compile(fn, backend="neuron", dynamic=False)(x)
    eager = fn(x.to("neuron"))
    for got in (compiled, eager.cpu()):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, **tol)
    assert torchneuron.stats()["ops_fallback"] == {}


def test_a_large_whole_tensor_sum_runs_on_every_partition() -> None:
    x = _randn(2, 256, 1024).to("neuron")
    x.mean()  # compile
    with torchneuron.profile() as prof:
        x.mean()
    # One row on one partition took 1 ms; 128 rows take what their 2 MiB take to load.
    assert prof.total_device_ns < 50_000, prof.kernels
