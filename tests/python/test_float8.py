"""FP8 on the device: float8_e4m3fn and float8_e5m2 casts (bit for bit against eager PyTorch's
CPU casts, exhaustively) and ``torch._scaled_mm`` against eager.

Casts are compared as bits: every one of the 256 fp8 patterns widened to float32 and bfloat16,
every one of the 65536 bfloat16 patterns narrowed to fp8, and float32 values around every fp8
rounding boundary (each representable value, each midpoint and its float32 neighbours, the
overflow thresholds, infinities, NaNs of both signs and the subnormal range).
"""

from __future__ import annotations

import copy

import pytest
import torch

import torchneuron

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _device(fn: object) -> object:
    return torch.compile(fn, backend="neuron", fullgraph=True)


def _assert_on_device() -> None:
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}
    assert stats["kernels_run"] >= 1


def _all_fp8(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)


def _boundary_values(dtype: torch.dtype) -> torch.Tensor:
    """float32 values at and around every rounding decision of a cast to `dtype`."""
    values = _all_fp8(dtype).float()
    finite = values[values.isfinite()].unique()  # sorted
    mids = (finite[1:] + finite[:-1]) / 2  # exact in float32: fp8 has 3 or 2 mantissa bits
    top = finite[-1]
    beyond = torch.tensor([top * 1.0625, top * 1.125, top * 1.5, top * 2, 3.0e38])
    base = torch.cat([finite, mids, beyond, -beyond, finite * 0.75, finite * 1.25])
    up = torch.nextafter(base, torch.full_like(base, float("inf")))
    down = torch.nextafter(base, torch.full_like(base, float("-inf")))
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), -float("nan"), 0.0, -0.0])
    subnormal = torch.linspace(-(2.0**-5), 2.0**-5, 4001)
    return torch.cat([base, up, down, special, subnormal])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


@pytest.mark.parametrize("dtype", FP8, ids=str)
@pytest.mark.parametrize("wide", [torch.float32, torch.bfloat16], ids=str)
def test_widen_every_pattern(dtype: torch.dtype, wide: torch.dtype) -> None:
    x = _all_fp8(dtype)
    got = _device(lambda t: t.to(wide))(x)
    want = x.to(wide)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    wide_bits = torch.int32 if wide == torch.float32 else torch.int16
    assert torch.equal(got[~nan].view(wide_bits), want[~nan].view(wide_bits))
    _assert_on_device()


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_narrow_every_bf16_pattern(dtype: torch.dtype) -> None:
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    got = _device(lambda t: t.to(dtype))(x)
    assert torch.equal(_bits(got), _bits(x.to(dtype)))
    _assert_on_device()


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_narrow_float32_at_rounding_boundaries(dtype: torch.dtype) -> None:
    x = _boundary_values(dtype)
    got = _device(lambda t: t.to(dtype))(x)
    want = x.to(dtype)
    mismatch = (_bits(got) != _bits(want)).nonzero().flatten()
    assert mismatch.numel() == 0, [
        (x[i].item(), hex(_bits(got)[i].item()), hex(_bits(want)[i].item())) for i in mismatch[:8]
    ]
    _assert_on_device()


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_round_trip_through_arithmetic(dtype: torch.dtype) -> None:
    # An fp8 input widened, computed on, narrowed again: a quantize/dequantize pair.
    x = torch.randn(64, 96).to(dtype)
    scale = torch.tensor(0.37)

    def qdq(t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (t.float() * s).to(dtype)

    got = _device(qdq)(x, scale)
    assert torch.equal(_bits(got), _bits(qdq(x, scale)))
    _assert_on_device()


# ----------------------------------------------------------------------------------------------
# torch._scaled_mm
# ----------------------------------------------------------------------------------------------


def _fp8_operands(
    m: int, k: int, n: int, a_dtype: torch.dtype, b_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    a = (torch.randn(m, k) * 2).to(a_dtype)
    # b column-major, as torch._scaled_mm wants it on GPUs (and Linear weights are stored).
    b = (torch.randn(n, k) * 2).to(b_dtype).t()
    return a, b


def _scales(kind: str, m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "tensorwise":
        return torch.tensor(0.75), torch.tensor(1.5)
    return torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5


def _assert_close_to_eager(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.float32:
        # fp8 products are exact and both sum in fp32, in different orders: a few ulps of
        # the sums' magnitude.
        atol = 1e-5 * float(want.abs().mean())
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)
    else:
        # One rounding apart; near zero (a bias cancelling the product) eager's bf16 rounding
        # of an intermediate shows as an absolute error of the terms' magnitude.
        atol = 2**-8 * float(want.float().abs().mean())
        torch.testing.assert_close(got, want, atol=atol, rtol=2**-7)


@pytest.mark.parametrize("kind", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_scaled_mm(kind: str, out_dtype: torch.dtype, bias: bool) -> None:
    # K = 320: a double_row pair of K tiles, then a partial one; M and N not multiples of
    # the tiles.
    m, k, n = 200, 320, 700
    a, b = _fp8_operands(m, k, n, torch.float8_e4m3fn, torch.float8_e4m3fn)
    scale_a, scale_b = _scales(kind, m, n)
    extra = {"bias": torch.randn(n).to(out_dtype)} if bias else {}

    def fn(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype, **extra)

    _assert_close_to_eager(_device(fn)(a, b, scale_a, scale_b), fn(a, b, scale_a, scale_b))
    _assert_on_device()


def test_scaled_mm_mixed_formats_large_k() -> None:
    # E4M3 activations against E5M2 gradients (float8 training's backward), K = 1024: four
    # double_row matmuls per bank.
    m, k, n = 256, 1024, 384
    a, b = _fp8_operands(m, k, n, torch.float8_e4m3fn, torch.float8_e5m2)
    scale_a, scale_b = _scales("rowwise", m, n)

    def fn(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)

    _assert_close_to_eager(_device(fn)(a, b, scale_a, scale_b), fn(a, b, scale_a, scale_b))
    _assert_on_device()


@pytest.mark.parametrize("kind", ["tensorwise", "rowwise"])
@pytest.mark.parametrize(
    ("m", "k", "n"),
    [(1000, 512, 384), (16, 512, 256), (128, 208, 128)],
    ids=["m1000", "decode_m16", "k208"],
)
def test_scaled_mm_linear_forms(kind: str, m: int, k: int, n: int) -> None:
    # The weight [N, K] transposed in the graph, as a float8 Linear calls it: both operands
    # contiguous along K, loaded in pairs of K values per double_row group. M not a multiple
    # of 128, a decode-sized M, and K = 208: no whole group, one group on 104 partitions.
    a = (torch.randn(m, k) * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k) * 2).to(torch.float8_e4m3fn)
    scale_a, scale_b = _scales(kind, m, n)

    def fn(a: torch.Tensor, w: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)

    _assert_close_to_eager(_device(fn)(a, w, scale_a, scale_b), fn(a, w, scale_a, scale_b))
    _assert_on_device()


def test_scaled_mm_row_major_b() -> None:
    # B contiguous [K, N] (strided along K): a double_row group's two rows per partition load as
    # contiguous runs, while A's pairs are interleaved; K = 384, one group and one on 64
    # partitions.
    a = (torch.randn(256, 384) * 2).to(torch.float8_e5m2)
    b = (torch.randn(384, 200) * 2).to(torch.float8_e4m3fn)
    scale = torch.tensor(0.5)

    def fn(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, b, s, s, out_dtype=torch.float32)

    _assert_close_to_eager(_device(fn)(a, b, scale), fn(a, b, scale))
    _assert_on_device()


def test_scaled_mm_dynamic_quantization() -> None:
    # The whole float8 dynamic recipe in one graph: per-row amax scales computed on the device,
    # the casts to fp8, then the scaled matmul.
    x = torch.randn(128, 256, dtype=torch.bfloat16)
    w = torch.randn(192, 256, dtype=torch.bfloat16)
    fp8_max = torch.finfo(torch.float8_e4m3fn).max

    def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xs = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / fp8_max
        ws = w.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / fp8_max
        xq = (x.float() / xs).to(torch.float8_e4m3fn)
        wq = (w.float() / ws).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, wq.t(), xs, ws.t(), out_dtype=torch.bfloat16)

    _assert_close_to_eager(_device(linear)(x, w), linear(x, w))
    _assert_on_device()


def test_scaled_mm_blockwise_scales_are_refused_as_eager_refuses_them() -> None:
    # Blockwise scales (one per 128 elements of K): PyTorch's CPU _scaled_mm refuses them, and
    # so does the compiled call, with the same message, at trace time.
    m, k, n = 128, 256, 128
    a, b = _fp8_operands(m, k, n, torch.float8_e4m3fn, torch.float8_e4m3fn)
    scale_a, scale_b = torch.rand(m, k // 128), torch.rand(k // 128, n)

    def fn(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)

    for call in (fn, _device(fn)):
        with pytest.raises(Exception, match="Invalid scaling configuration"):
            call(a, b, scale_a, scale_b)


def _mx_operands(
    m: int, k: int, n: int, wdtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, ...]:
    """MXFP8 operands: a [M, K] and a weight [N, K] in fp8, their E8M0 scales of each 32
    values of K ([M, K / 32], [N, K / 32]) between 2^-9 and 2^8."""
    g = torch.Generator().manual_seed(m * k + n)
    a = torch.randn(m, k, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, generator=g).to(wdtype)

    def scales(rows: int) -> torch.Tensor:
        bits = torch.randint(118, 136, (rows, k // 32), generator=g, dtype=torch.uint8)
        return bits.view(torch.float8_e8m0fnu)

    return a, w, scales(m), scales(n)


def _mx_mm(a: torch.Tensor, w: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    return torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)


def _mx_reference(
    a: torch.Tensor, w: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor
) -> torch.Tensor:
    """Each value times its block's power of two, the products summed in float64."""
    da = a.double() * sa.double().repeat_interleave(32, 1)
    dw = w.double() * sb.double().repeat_interleave(32, 1)
    return da @ dw.t()


def _mx_on_trn3(*tensors: torch.Tensor) -> torch.Tensor:
    # On the neuron device: PyTorch's CPU meta kernel wants cuBLAS's swizzled scale sizes.
    mm = torch.compile(_mx_mm, backend="neuron", fullgraph=True, options={"target": "trn3"})
    return mm(*(t.to("neuron") for t in tensors)).cpu()


@pytest.mark.parametrize(
    ("m", "k", "n", "wdtype"),
    [
        (128, 512, 128, torch.float8_e4m3fn),  # one MX matmul per tile
        (200, 640, 300, torch.float8_e5m2),  # a 128-value K tail; partial M and N tiles
        (64, 4608, 96, torch.float8_e4m3fn),  # 144 scales per row: two transposes of them
    ],
)
def test_scaled_mm_mx_block_scales_on_trn3(m: int, k: int, n: int, wdtype: torch.dtype) -> None:
    operands = _mx_operands(m, k, n, wdtype)
    got = _mx_on_trn3(*operands)
    want = _mx_reference(*operands)
    # fp8 products scaled by powers of two are exact; fp32 sums, one bf16 rounding.
    assert torch.allclose(got.double(), want, rtol=2**-8, atol=1e-6 * float(want.abs().max()))
    _assert_on_device()


def test_functional_scaled_mm_mx_on_trn3() -> None:
    # torch.nn.functional.scaled_mm (aten._scaled_mm_v2): BlockWise1x32 recipes, unswizzled.
    from torch.nn.functional import ScalingType, SwizzleType

    def mm(a: torch.Tensor, w: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
        block, plain = ScalingType.BlockWise1x32, SwizzleType.NO_SWIZZLE
        return torch.nn.functional.scaled_mm(
            a, w.t(), sa, block, sb, block, swizzle_a=plain, swizzle_b=plain
        )

    operands = _mx_operands(200, 640, 300)
    compiled = torch.compile(mm, backend="neuron", fullgraph=True, options={"target": "trn3"})
    got = compiled(*(t.to("neuron") for t in operands)).cpu()
    want = _mx_reference(*operands)
    assert torch.allclose(got.double(), want, rtol=2**-8, atol=1e-6 * float(want.abs().max()))
    _assert_on_device()


@pytest.mark.parametrize("kind", ["tensorwise", "rowwise"])
def test_functional_scaled_mm_matches_eager(kind: str) -> None:
    from torch.nn.functional import ScalingType

    m, k, n = 64, 256, 96
    a, b = _fp8_operands(m, k, n, torch.float8_e4m3fn, torch.float8_e4m3fn)
    if kind == "tensorwise":
        recipe, sa, sb = ScalingType.TensorWise, torch.tensor(0.5), torch.tensor(2.0)
    else:
        recipe, sa, sb = ScalingType.RowWise, torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5

    def mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_mm(a, b, sa, recipe, sb, recipe)

    _assert_close_to_eager(_device(mm)(a, b, sa, sb), mm(a, b, sa, sb))
    _assert_on_device()


def test_scaled_mm_mx_nan_scale() -> None:
    # E8M0's 255 is NaN: the rows (columns) it scales come out NaN, the others do not.
    a, w, sa, sb = _mx_operands(128, 512, 128)
    sa = sa.view(torch.uint8).clone()
    sa[3, 5] = 255
    got = _mx_on_trn3(a, w, sa.view(torch.float8_e8m0fnu), sb)
    assert got[3].isnan().all()
    assert not got[torch.arange(128) != 3].isnan().any()


def test_scaled_mm_mx_needs_trn3_and_whole_quadrants() -> None:
    # trn2's TensorE has no MX mode; an MX matmul contracts 32-partition multiples of 4 values.
    a, w, sa, sb = (t.to("neuron") for t in _mx_operands(128, 512, 128))
    with pytest.raises(Exception, match=r"MX block scales need TensorE's MX mode.*'trn2'"):
        torch.compile(_mx_mm, backend="neuron", options={"target": "trn2"})(a, w, sa, sb)
    torch._dynamo.reset()
    a, w, sa, sb = (t.to("neuron") for t in _mx_operands(128, 96, 128))
    with pytest.raises(Exception, match="MX on TensorE needs K a multiple of 128, not 96"):
        torch.compile(_mx_mm, backend="neuron", options={"target": "trn3"})(a, w, sa, sb)


def test_e8m0_read_as_numbers_falls_back() -> None:
    # E8M0 values are powers of two, held as their bits: only _scaled_mm reads them on the
    # device; anything else stays in eager PyTorch, counted, with eager's answer.
    s = torch.randint(100, 150, (8, 4), dtype=torch.uint8).view(torch.float8_e8m0fnu)

    def fn(s: torch.Tensor) -> torch.Tensor:
        return s.float() * 3

    got = _device(fn)(s)
    assert torch.equal(got, fn(s))
    assert torchneuron.stats()["ops_fallback"] != {}


def test_scaled_mm_with_output_scale_falls_back() -> None:
    # scale_result (an fp8 output's scale) is not lowered: the op stays in eager PyTorch,
    # counted, and the answer is eager's.
    m, k, n = 128, 256, 128
    a, b = _fp8_operands(m, k, n, torch.float8_e4m3fn, torch.float8_e4m3fn)
    one = torch.tensor(1.0)

    def fn(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(
            a, b, s, s, scale_result=s * 2, out_dtype=torch.float8_e4m3fn
        ).float()

    got = _device(fn)(a, b, one)
    assert torch.equal(got, fn(a, b, one))
    assert torchneuron.stats()["ops_fallback"] == {"aten._scaled_mm.default": 1}


def test_power_of_two_scales_are_exact() -> None:
    # exp2(floor(log2(s))): how TorchAO's rowwise recipe rounds its scales down to powers of
    # two. log2 must give a power of two's exponent exactly and exp2 an integer's power
    # exactly, or a scale comes out twice as large (every element of its row then differs).
    powers = 2.0 ** torch.arange(-126, 128, dtype=torch.float32)
    s = torch.cat([powers, powers * (1 - 2.0**-24), powers[1:] * 1.5, torch.rand(4096) * 1e4])

    def round_down(s: torch.Tensor) -> torch.Tensor:
        return torch.exp2(torch.floor(torch.log2(s)))

    assert torch.equal(_device(round_down)(s), round_down(s))
    _assert_on_device()


def _torchao_mlp(bias: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512, bias=bias), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    ).bfloat16()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_float8_training_runs_on_the_device(recipe: str) -> None:
    # TorchAO's float8 training as its README writes it: every Linear converted, the model
    # compiled; forward and backward (amax scales, casts, _scaled_mm in each direction) are
    # one device graph each, nothing left to eager PyTorch. The float64 scale arithmetic runs
    # in float32 (tensorwise: a scale can differ from eager's in its last float32 bit).
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = _torchao_mlp(bias=True)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    reference = copy.deepcopy(model)
    x = torch.randn(128, 256, dtype=torch.bfloat16)
    got = torch.compile(model, backend="neuron")(x)
    want = reference(x)
    got.float().square().sum().backward()
    want.float().square().sum().backward()
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}
    assert stats["graphs_compiled"] == stats["kernels_run"] == 2
    pairs = [(got, want)] + [
        (p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    ]
    for a, b in pairs:
        assert a is not None and b is not None
        if recipe == "rowwise":  # power-of-two scales: the same fp8 values, bit for bit
            assert torch.equal(a, b)
        else:  # a scale one bit apart flips a few fp8 roundings (e5m2 gradients: 2 bits)
            diff, top = (a - b).float().abs(), b.float().abs().max()
            assert (diff > 0.01 * top).float().mean() < 1e-3
            assert diff.max() <= 0.05 * top


def test_torchao_float8_weight_only_inference() -> None:
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    model = _torchao_mlp(bias=True).eval()
    quantize_(model, Float8WeightOnlyConfig())
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        got = torch.compile(model, backend="neuron")(x)
        want = model(x)
        # The device adds each Linear's bias to its float32 sums and rounds once (the matmul's
        # epilogue); eager on the CPU rounds the product to bf16 first, then adds the bias. So
        # both are held to the float32 computation with the same dequantized weights: the
        # device as close to it as eager.
        w1, w2 = (model[i].weight.dequantize().float() for i in (0, 2))
        b1, b2 = (model[i].bias.float() for i in (0, 2))
        exact = torch.relu(x.float() @ w1.t() + b1) @ w2.t() + b2
    device_err = float((got.float() - exact).abs().max())
    eager_err = float((want.float() - exact).abs().max())
    assert got.dtype == want.dtype and got.shape == want.shape
    assert device_err <= 1.25 * eager_err, (device_err, eager_err)
    _assert_on_device()
