"""torchneuron.kernels: the NKI kernel library against eager PyTorch, eager and compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron import kernels

pytest.importorskip("torchneuron._C")

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape
    tol = TOL[ref.dtype]
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


def llama_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rows", [128, 300, 1100])  # one tile, a masked tail, groups + rest
def test_rms_norm(rows: int, dtype: torch.dtype) -> None:
    x, w = torch.randn(rows // 100 + 1, rows, 96, dtype=dtype), torch.randn(96, dtype=dtype)
    _close(kernels.rms_norm(x, w, eps=1e-5), llama_rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(128, 64), (700, 200), (3, 5, 40)])
def test_softmax(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = torch.randn(*shape, dtype=dtype) * 5
    _close(kernels.softmax(x), torch.softmax(x.float(), -1).to(dtype))


@pytest.mark.parametrize(
    ("heads", "kv_heads", "q_len", "kv_len", "dim", "causal", "dtype"),
    [
        (2, 2, 256, 384, 64, False, torch.float32),
        (4, 2, 384, 384, 128, True, torch.bfloat16),  # GQA, causal over 3 tiles
        (2, 1, 640, 640, 32, True, torch.float32),  # keys past one PSUM bank
    ],
)
def test_attention(
    heads: int, kv_heads: int, q_len: int, kv_len: int, dim: int, causal: bool, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, q_len, dim, generator=g).to(dtype)
    k, v = (torch.randn(2, kv_heads, kv_len, dim, generator=g).to(dtype) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True, scale=0.2)
    _close(kernels.attention(q, k, v, is_causal=causal, scale=0.2), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_grouped_matmul(dtype: torch.dtype) -> None:
    sizes = (100, 0, 300, 37)  # an expert with no tokens; tails of every length
    x = torch.randn(sum(sizes), 256, dtype=dtype)
    w = torch.randn(len(sizes), 256, 640, dtype=dtype) * 0.1
    ref = torch.cat([xe @ w[e] for e, xe in enumerate(torch.split(x, sizes))])
    _close(kernels.grouped_matmul(x, w, sizes), ref)


def test_bad_shapes_are_clear_errors() -> None:
    q = torch.randn(1, 2, 200, 64)
    with pytest.raises(ValueError, match="multiples of 128"):
        kernels.attention(q, q, q)
    with pytest.raises(ValueError, match="sum to the 10 rows"):
        kernels.grouped_matmul(torch.randn(10, 128), torch.randn(2, 128, 8), (3, 4))
    with pytest.raises(ValueError, match="does not match"):
        kernels.rms_norm(torch.randn(4, 8), torch.randn(9))
    with pytest.raises(ValueError, match="last dimension"):
        kernels.softmax(torch.randn(4, 8), dim=0)


class KernelRMSNorm(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, eps=1e-6)


def test_library_kernels_inside_a_compiled_model() -> None:
    # The library's kernels are operators of the compiled graph (no graph break), on neuron
    # tensors too.
    norm, proj = KernelRMSNorm(64), torch.nn.Linear(64, 64)
    model = torch.nn.Sequential(proj, norm).to("neuron")
    x = torch.randn(2, 70, 64)
    with torch.no_grad():
        out = torch.compile(model, backend="neuron", fullgraph=True)(x.to("neuron"))
        ref = llama_rms_norm(proj.cpu()(x), norm.weight.cpu(), 1e-6)
    assert out.device.type == "neuron"
    _close(out.cpu(), ref)
    assert torchneuron.stats()["ops_fallback"] == {}


def test_library_kernel_under_dynamic_shapes() -> None:
    # dynamic=True makes sizes and Python numbers (eps) symbolic: they reach the kernel's
    # operator as its int and float arguments; the kernel is traced per size.
    f = torch.compile(lambda x, w: kernels.rms_norm(x * 2, w), backend="neuron", dynamic=True)
    w = torch.randn(64)
    for rows in (100, 300):
        x = torch.randn(rows, 64)
        _close(f(x, w), llama_rms_norm(x * 2, w, 1e-6))
    assert torchneuron.stats()["ops_fallback"] == {}
