"""Kernel-level sanity of the engine model: compiled kernels are bound by the engine, and use it
as much as, the architecture implies.

Each test compiles one kernel with torch.compile(backend="neuron"), runs it once under
torchneuron.profile() on trn2 and checks the profile's bounding engine and busy shares against
a range argued from the trn2 figures (runtime/target/trn2.json; trainium.md sections 2 and 6).
The argument for each range is written next to it. Outputs are checked against eager CPU so
the kernel measured is one that computes the right thing.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchneuron

PEAK_FLOPS_PER_NS = 128 * 128 * 2 * 2.4  # bf16 TensorE: 78.6 TFLOPS [Dv S6]
KNEE = 214.0  # FLOP/B: 78.6 TFLOPS over 368 GB/s of DMA [Dv S6, S8]


def _profile(
    fn: Any, *args: torch.Tensor, target: str = "trn2"
) -> tuple[dict[str, Any], dict[str, float], torch.Tensor]:
    """The one kernel `fn` compiles to (run once, profiled) and its busy share per resource."""
    torchneuron.reset_stats()
    compiled = torch.compile(fn, backend="neuron", options={"target": target})
    with torch.no_grad():
        compiled(*args)  # compile outside the profile
        with torchneuron.profile() as prof:
            out = compiled(*args)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(prof.kernels) == 1, [k["name"] for k in prof.kernels]
    kernel = prof.kernels[0]
    share = {unit: busy / kernel["device_ns"] for unit, busy in kernel["engine_busy_ns"].items()}
    return kernel, share, out


def test_flash_attention_forward_d128_is_softmax_bound(real_native: ModuleType) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 2048, 128, dtype=torch.bfloat16) for _ in range(3))
    kernel, share, out = _profile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    # Matmul FLOPs: QK^T and PV (4 * S^2 * d per head) plus the transposes of P that TensorE
    # does (a PE transpose is a matmul with an identity): one or two of a 512-key step's four
    # 128-key chunks, i.e. 1/8 or 1/4 of the useful FLOPs; DMAs transpose the others.
    useful = 4 * 2 * 2048 * 2048 * 128
    assert useful * 9 // 8 <= kernel["flops"] <= useful * 5 // 4, kernel["flops"] / useful
    utilization = useful / kernel["device_ns"] / PEAK_FLOPS_PER_NS
    # Per step of 128 queries x 512 keys (bf16, d = 128), trn2:
    # - TensorE: QK^T and PV, 512 moving columns each at II = max(N, 64) [D S5], and the
    #   transposes of one or two 128-key chunks of P (128 cycles each): 1152-1280 cycles at
    #   2.4 GHz = 480-533 ns, of which 427 ns are the step's useful FLOPs at peak.
    # - VectorE: the row max over the fp32 scores in PSUM (N = 512 cycles at 0.96 GHz = 533 ns
    #   [D S5]) and the running output's rescale (128 fp32 columns, one input in PSUM: 133 ns):
    #   666 ns. GpSimd cannot read PSUM [D S5], ScalarE has no max: so 427 / 666 = 0.64 of the
    #   peak at most.
    # - ScalarE: exp over the scores (512 cycles at 1.2 GHz = 427 ns [D S5, S6]), evicting the
    #   TensorE-transposed chunks (107 ns each), the rescale factor and the DMA triggers:
    #   640-750 ns.
    # - DMA: the other two or three chunks of P by SBUF-to-SBUF transposing DMAs, at half the
    #   DMA rate [D S6]: 178 ns per chunk over the 16 engines, 356-534 ns.
    # So VectorE or ScalarE bounds the kernel (trainium.md 6.5 expects attention at d = 128 to
    # be softmax-bound). The floor: above what the kernel reached with every transpose on
    # TensorE (0.42: TensorE and the PSUM evictions of P^T took VectorE and ScalarE past the
    # step's 666 ns); trainium.md 6.5 expects about 25-35% of peak on hardware [S32].
    assert kernel["bound"] in {"vector", "scalar"}, kernel["bound"]
    assert 0.45 <= utilization <= 0.64, utilization
    # Pipelined (scores a step ahead, P V a step behind), TensorE overlaps the softmax and the
    # DMA transposes: busy, but less than the bound. The DMA queues carry the transposes (at
    # most 534 of the bound's 666 ns per step) and the loads and stores (a few MB; 0.81 of
    # the time since the two heads share one pipeline, whose fill and drain no longer
    # lengthen the kernel).
    assert 0.5 <= share["tensor"] < share[kernel["bound"]], share
    assert share["dma"] <= 0.85, share


def test_gemm_at_the_roofline_knee_keeps_tensor_and_dma_busy(real_native: ModuleType) -> None:
    torch.manual_seed(0)
    a = torch.randn(2048, 256, dtype=torch.bfloat16)
    b = torch.randn(256, 2048, dtype=torch.bfloat16)
    kernel, share, out = _profile(lambda a, b: a @ b, a, b)
    torch.testing.assert_close(out.float(), a.float() @ b.float(), atol=0.25, rtol=2e-2)
    assert kernel["flops"] == 2 * 2048 * 256 * 2048
    intensity = kernel["flops"] / kernel["hbm_bytes"]
    utilization = kernel["flops"] / kernel["device_ns"] / PEAK_FLOPS_PER_NS
    # At the knee (~214 FLOP/B on trn2) TensorE time equals DMA time, so a kernel that overlaps
    # its loads with its matmuls keeps both busy most of the run. This GEMM's HBM traffic (A
    # and B read once, B staying in SBUF, and C) puts it there: the test first checks that.
    assert 0.8 * KNEE <= intensity <= 1.25 * KNEE, intensity
    # Neither side can be idle for long: each of TensorE and the DMA engines is busy at least
    # half the run. Full overlap is out of reach because the first panels' load (~1.3 us fixed
    # DMA latency [D S9] plus transfer) precedes the first matmul and the last store follows
    # the last one, and the panels' 512-byte-per-partition rows (K = 256 bf16) move at ~55%
    # DMA efficiency [S9 curve]: so the DMA side (or HBM) bounds it, or TensorE at this
    # intensity.
    assert kernel["bound"] in {"dma", "hbm", "tensor"}, kernel["bound"]
    assert share["tensor"] >= 0.5, share
    assert share["dma"] >= 0.5, share
    assert 0.5 <= utilization <= 1.0, utilization
    # PSUM evictions (one 128 x 512 fp32 bank per 4 K-tiles of matmuls) fit beside TensorE.
    assert share["vector"] < share["tensor"] and share["scalar"] < share["tensor"], share


def test_compute_bound_gemm_keeps_tensor_engine_fed_across_output_groups(
    real_native: ModuleType,
) -> None:
    torch.manual_seed(0)
    a = torch.randn(2048, 2048, dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, dtype=torch.bfloat16)
    kernel, share, out = _profile(lambda a, b: a @ b, a, b)
    torch.testing.assert_close(out.float(), a.float() @ b.float(), atol=0.5, rtol=2e-2)
    # 2 * 2048^3 FLOP over 50 MB of HBM traffic is ~340 FLOP/B, past the knee: TensorE bounds
    # it. Each 512-column output group ends with its stores (512 KiB per M block) entering the
    # DMA queues just as the next group's first B tiles must load; unless the B stream runs
    # far enough ahead to cover them, TensorE idles at every group's start and warms up again
    # (81% of peak before the B stream had slots for it). What remains is the first panel's
    # load before the first matmul and the last group's eviction and store after the last.
    assert kernel["bound"] == "tensor", kernel["bound"]
    utilization = kernel["flops"] / kernel["device_ns"] / PEAK_FLOPS_PER_NS
    assert utilization >= 0.92, utilization
    assert share["tensor"] >= 0.93, share


def test_fp8_gemm_loads_its_operands_by_dma_transposes_of_pairs(real_native: ModuleType) -> None:
    # torch._scaled_mm as a float8 Linear runs it: A [M, K] row-major, B = w.t() of a row-major
    # weight, rowwise scales. Both operands are contiguous along K, which TensorE contracts over
    # the partitions, so both load transposed. A DMA transposes 2- and 4-byte units [D S6]:
    # fp8 moved one element per descriptor is ~30x slower than the matmuls (2.7% of the FP8
    # peak at 4096^3, DMA-bound); moved in pairs (a double_row group's two K values per unit)
    # it is a transpose at half the bf16 GEMM's bytes per step.
    torch.manual_seed(0)
    m, k, n = 2048, 4096, 2048
    a = torch.randn(m, k).to(torch.float8_e4m3fn)
    w = torch.randn(n, k).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5

    def linear(
        a: torch.Tensor, w: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor
    ) -> torch.Tensor:
        return torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)

    kernel, share, out = _profile(linear, a, w, scale_a, scale_b)
    ref = (a.float() @ w.float().t()) * scale_a * scale_b
    torch.testing.assert_close(out.float(), ref, atol=0.5, rtol=2e-2)
    # 2 * 2048 * 4096 * 2048 FLOP at the FP8 (double_row) peak, twice bf16's: 219 us. Per
    # 512-row M block TensorE works 55 us, while the DMA engines move B (8 MiB at the
    # transposing rate, 0.9 x 368 GB/s: 25 us), the block's A^T panel (6 us) and its bf16 output
    # (2 MiB in 1 KiB rows, ~70% efficient: 9 us): the loads hide behind the matmuls. What is
    # left is the first panel's load before the first matmul and the last stores after the
    # last one (a few us each, 10% of the run at this size).
    assert kernel["bound"] == "tensor", kernel["bound"]
    utilization = kernel["flops"] / kernel["device_ns"] / (2 * PEAK_FLOPS_PER_NS)
    assert utilization >= 0.85, utilization
    assert share["dma"] < share["tensor"], share


def test_mxfp8_gemm_is_tensor_bound_reading_b_once_per_1024_rows(real_native: ModuleType) -> None:
    # MXFP8 on trn3 (E8M0 scales of each 32 values of K): TensorE at 4x bf16's rate. An M
    # block of one PSUM bank per 128-row tile (512 rows) reads B once per 512 rows, which at
    # that rate the DMA engines cannot hide (66% of the MX peak, DMA-bound, at 4096^3); MX
    # accumulators of half a bank make the blocks 1024 rows.
    torch.manual_seed(0)
    m, k, n = 2048, 4096, 2048
    a = torch.randn(m, k).to(torch.float8_e4m3fn)
    w = torch.randn(n, k).to(torch.float8_e4m3fn)

    def scales(rows: int) -> torch.Tensor:
        bits = torch.randint(120, 130, (rows, k // 32), dtype=torch.uint8)
        return bits.view(torch.float8_e8m0fnu)

    sa, sb = scales(m), scales(n)

    def linear(
        a: torch.Tensor, w: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor
    ) -> torch.Tensor:
        return torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)

    kernel, share, out = _profile(linear, a, w, sa, sb, target="trn3")
    ref = (a.float() * sa.float().repeat_interleave(32, 1)) @ (
        w.float() * sb.float().repeat_interleave(32, 1)
    ).t()
    torch.testing.assert_close(out.float(), ref, atol=1e-3 * float(ref.abs().max()), rtol=2e-2)
    assert kernel["bound"] == "tensor", kernel["bound"]
    # A and its scales once, B twice (two 1024-row blocks), its scales once, the bf16 output.
    once = m * k + m * k // 32 + n * k // 32 + 2 * m * n
    assert kernel["hbm_bytes"] <= once + 2 * n * k + 4096, kernel["hbm_bytes"]
    # 109 us of MX matmuls; the start (both operands' scales transposed on TensorE, the first
    # A panel) takes about 30 us before the first one: 75% at this size (88% at 4096^3).
    utilization = kernel["flops"] / kernel["device_ns"] / (4 * PEAK_FLOPS_PER_NS)
    assert utilization >= 0.7, utilization


def test_pure_dma_copy_is_bound_by_the_cores_hbm_share(real_native: ModuleType) -> None:
    x = torch.randn(4096, 4096, dtype=torch.bfloat16)
    kernel, share, out = _profile(lambda x: x.clone(), x)
    assert torch.equal(out, x)
    assert kernel["flops"] == 0
    # An HBM -> HBM copy of B bytes reads and writes HBM: 2B at the core's share of the chip's
    # HBM, 2.9 TB/s / 8 cores = 362.5 B/ns [D S1; E policy], while its DMA engines move B at
    # 16 x 23 = 368 B/ns [D S8]. So HBM bounds it and is busy nearly the whole run (less only
    # the first transfer's ~1.3 us latency, <1% of ~186 us), and the DMA engines are busy
    # 362.5 / (2 x 368) = 0.49 of it. No compute engine has any work.
    assert kernel["bound"] == "hbm", kernel["bound"]
    assert share["hbm"] >= 0.95, share
    assert share["dma"] == pytest.approx(362.5 / (2 * 368), abs=0.04), share
    for engine in ("tensor", "vector", "scalar", "gpsimd"):
        assert share[engine] == 0, (engine, share)


def test_swiglu_of_chunk_halves_reads_each_input_byte_once(real_native: ModuleType) -> None:
    """SwiGLU over the halves of a fused gate/up projection, as Transformers' MoE experts and
    Phi-3's MLP write it (``gate, up = x.chunk(2, dim=-1)``): the halves are column windows
    of x, which the fused kernel loads in place, so HBM moves x once and the output once (the
    halves were copied contiguous first: 2.33x those bytes), and the DMA bounds it."""

    def swiglu(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    x = torch.randn(1024, 2048, dtype=torch.bfloat16)
    kernel, share, out = _profile(swiglu, x)
    torch.testing.assert_close(out, swiglu(x), atol=1e-2, rtol=1e-2)
    minimum = x.numel() * 2 + out.numel() * 2
    assert kernel["hbm_bytes"] == minimum, kernel["hbm_bytes"] / minimum
    assert kernel["bound"] in ("dma", "hbm"), kernel["bound"]
    assert share["dma"] >= 0.8, share


def test_rotary_embedding_as_llama_writes_it_reads_its_inputs_in_place(
    real_native: ModuleType,
) -> None:
    """Rotary embeddings as Transformers' Llama writes them (``q * cos + rotate_half(q) * sin``,
    cos and sin unsqueezed over the heads, rotate_half a concat of negated slices) are one
    neuron.rotary kernel: q and cos and sin read once, the output written once (the
    expression's concat went through HBM first: 9x q's bytes, 13x before cos and sin were
    read in place; 9.1 ms -> 0.73 ms -> 0.14 ms at 32 heads x 2048 x 128), bound by the
    engines' three 16-bit passes over q, not by the DMA."""

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    def rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin

    q = torch.randn(1, 8, 1024, 128, dtype=torch.bfloat16)
    cos, sin = torch.randn(2, 1, 1024, 128, dtype=torch.bfloat16).unbind(0)
    kernel, share, out = _profile(rope, q, cos, sin)
    torch.testing.assert_close(out, rope(q, cos, sin), atol=0, rtol=0)
    # q read and its output written, cos and sin (an eighth of q each) read once.
    q_bytes = q.numel() * 2
    assert kernel["hbm_bytes"] == 2.25 * q_bytes, kernel["hbm_bytes"] / q_bytes
    assert kernel["bound"] in ("vector", "gpsimd"), kernel["bound"]
