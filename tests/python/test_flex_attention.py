"""FlexAttention on the device: golden checks against eager ``flex_attention`` on CPU.

Every case compiles one ``neuron.flex_attention`` kernel (asserted through
``torchneuron.stats()``: no op fell back to eager) and compares output and log-sum-exp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn.attention.flex_attention import (
    BlockMask,
    and_masks,
    create_block_mask,
    flex_attention,
)

import torchneuron
from torchneuron._native import native

# fp32: the device computes scores and softmax in fp32 like eager. bf16: P is rounded to
# bf16 before P @ V on TensorE, eager keeps it in fp32.
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return q >= kv


def sliding_window(window: int) -> Callable[..., Any]:
    def mask(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (q >= kv) & (q - kv <= window)

    return mask


def prefix_lm(prefix: int) -> Callable[..., Any]:
    def mask(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (kv <= prefix) | (q >= kv)

    return mask


def alibi(heads: int) -> Callable[..., Any]:
    def score_mod(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        slope = torch.exp2(-8.0 * (h + 1) / heads)
        return score + slope * (kv - q)

    return score_mod


def soft_cap(cap: float) -> Callable[..., Any]:
    def score_mod(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        return cap * torch.tanh(score / cap)

    return score_mod


def run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score_mod: Callable[..., Any] | None = None,
    block_mask: BlockMask | None = None,
    enable_gqa: bool = False,
    scale: float | None = None,
) -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        return flex_attention(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            enable_gqa=enable_gqa,
            scale=scale,
            return_lse=True,
        )

    ref_out, ref_lse = attend(q, k, v)
    out, lse = torch.compile(attend, backend="neuron", fullgraph=True)(q, k, v)
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}, stats
    assert stats["graphs_compiled"] >= 1
    tol = TOL[q.dtype]
    torch.testing.assert_close(out.float(), ref_out.float(), atol=tol, rtol=tol)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=tol, rtol=tol)


def qkv(
    b: int,
    h: int,
    s: int,
    d: int,
    dtype: torch.dtype,
    kv_heads: int | None = None,
    kv_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    kv_heads = kv_heads or h
    kv_len = kv_len or s
    q = torch.randn(b, h, s, d, generator=g).to(dtype)
    k = torch.randn(b, kv_heads, kv_len, d, generator=g).to(dtype)
    v = torch.randn(b, kv_heads, kv_len, d, generator=g).to(dtype)
    return q, k, v


def block_mask(
    mask_mod: Callable[..., Any], s: int, kv_len: int | None = None, **kw: Any
) -> BlockMask:
    return create_block_mask(mask_mod, None, None, s, kv_len or s, device="cpu", **kw)


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_mask(dtype: torch.dtype) -> None:
    run(*qkv(1, 2, 256, 64, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal(dtype: torch.dtype) -> None:
    run(*qkv(1, 2, 384, 64, dtype), block_mask=block_mask(causal, 384))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sliding_window(dtype: torch.dtype) -> None:
    run(*qkv(1, 2, 512, 32, dtype), block_mask=block_mask(sliding_window(100), 512))


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefix_lm(dtype: torch.dtype) -> None:
    run(*qkv(1, 2, 320, 32, dtype), block_mask=block_mask(prefix_lm(70), 320))


@pytest.mark.parametrize("dtype", DTYPES)
def test_document_mask(dtype: torch.dtype) -> None:
    s = 300
    docs = torch.tensor([0] * 90 + [1] * 150 + [2] * 60, dtype=torch.int32)

    def document(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (docs[q] == docs[kv]) & (q >= kv)

    run(*qkv(1, 2, s, 32, dtype), block_mask=block_mask(document, s))


@pytest.mark.parametrize("dtype", DTYPES)
def test_alibi(dtype: torch.dtype) -> None:
    run(*qkv(1, 4, 256, 32, dtype), score_mod=alibi(4), block_mask=block_mask(causal, 256))


@pytest.mark.parametrize("dtype", DTYPES)
def test_soft_cap(dtype: torch.dtype) -> None:
    run(*qkv(1, 2, 256, 64, dtype), score_mod=soft_cap(5.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("direction", ["kv-q", "q-kv"])
def test_relative_position_bias(dtype: torch.dtype, direction: str) -> None:
    # The table is read backwards along the query rows (kv - q) or the keys
    # (q - kv): the kernel loads it reversed and flips it on TensorE.
    s, h = 200, 2
    table = torch.randn(h, 2 * s - 1, generator=torch.Generator().manual_seed(1))

    def bias(score: Any, b: Any, hh: Any, q: Any, kv: Any) -> Any:
        offset = kv - q if direction == "kv-q" else q - kv
        return score + table[hh, offset + s - 1]

    run(*qkv(1, h, s, 32, dtype), score_mod=bias, block_mask=block_mask(causal, s))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gqa(dtype: torch.dtype) -> None:
    run(*qkv(1, 8, 256, 64, dtype, kv_heads=2), enable_gqa=True, block_mask=block_mask(causal, 256))


@pytest.mark.parametrize("dtype", DTYPES)
def test_score_mod_with_mask_mod(dtype: torch.dtype) -> None:
    run(
        *qkv(2, 2, 256, 32, dtype),
        score_mod=soft_cap(4.0),
        block_mask=block_mask(and_masks(causal, sliding_window(150)), 256),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s", [1, 77, 130, 333])
def test_ragged_lengths(dtype: torch.dtype, s: int) -> None:
    run(*qkv(1, 2, s, 16, dtype), block_mask=block_mask(causal, s))


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_and_heads(dtype: torch.dtype) -> None:
    run(*qkv(3, 5, 192, 32, dtype), block_mask=block_mask(causal, 192), scale=0.3)


def test_cross_attention_lengths() -> None:
    run(*qkv(1, 2, 100, 32, torch.float32, kv_len=300))


def test_block_size_not_128() -> None:
    run(*qkv(1, 2, 256, 32, torch.float32), block_mask=block_mask(causal, 256, BLOCK_SIZE=64))


def test_per_batch_block_mask() -> None:
    s = 256
    lengths = torch.tensor([200, 120])

    def padding(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return kv < lengths[b]

    mask = create_block_mask(padding, 2, None, s, s, device="cpu")
    run(*qkv(2, 2, s, 32, torch.float32), block_mask=mask)


def test_fully_masked_rows_match_eager() -> None:
    def late(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return q >= 50

    run(*qkv(1, 1, 128, 16, torch.float32), block_mask=block_mask(late, 128))


def test_block_mask_change_recompiles() -> None:
    q, k, v = qkv(1, 1, 256, 32, torch.float32)
    attend = torch.compile(
        lambda q, k, v, m: flex_attention(q, k, v, block_mask=m), backend="neuron"
    )
    for window in (64, 200):
        mask = block_mask(sliding_window(window), 256)
        torch.testing.assert_close(
            attend(q, k, v, mask), flex_attention(q, k, v, block_mask=mask), atol=2e-5, rtol=2e-5
        )
    # One kernel per block structure (whether Dynamo or the backend recompiles).
    assert torchneuron.stats()["graphs_compiled"] >= 2
    assert torchneuron.stats()["ops_fallback"] == {}


def test_captured_view_of_a_table() -> None:
    # The score_mod reads a transposed view computed in the graph: the kernel makes it
    # contiguous once, before its loops.
    q, k, v = qkv(1, 2, 256, 32, torch.float32)
    table = torch.randn(256, 2, generator=torch.Generator().manual_seed(2))

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        per_head = table.t() * 2.0

        def bias(score: Any, b: Any, h: Any, qi: Any, kv: Any) -> Any:
            return score + per_head[h, kv]

        return flex_attention(q, k, v, score_mod=bias)

    out = torch.compile(attend, backend="neuron", fullgraph=True)(q, k, v)
    assert torchneuron.stats()["ops_fallback"] == {}
    torch.testing.assert_close(out, attend(q, k, v), atol=2e-5, rtol=2e-5)


def test_the_kernels_unit_is_the_targets_partitions(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target with 64 partitions (a copy of trn2's file): the attention kernels work in
    blocks of its partitions, and the front end's block classes in the fewest partitions of
    any target; a fixed 128 anywhere would not fit its SBUF views."""
    import json
    from pathlib import Path

    from torchneuron import attention_blocks

    trn2 = Path(__file__).resolve().parents[2] / "runtime" / "target" / "trn2.json"
    data = json.loads(trn2.read_text())
    data["partitions"]["value"] = 64
    data["name"] = "half"
    (tmp_path / "half.json").write_text(json.dumps(data))
    monkeypatch.setenv("TORCHNEURON_TARGET_DIR", str(tmp_path))
    caches = (attention_blocks.unit, attention_blocks.head_dim_limit)
    for cached in caches:
        cached.cache_clear()
    try:
        assert attention_blocks.unit() == 64
        q, k, v = (
            torch.randn(1, 2, 200, 64, generator=torch.Generator().manual_seed(i)) for i in range(3)
        )
        mask = create_block_mask(causal, 1, 1, 200, 200, device="cpu")
        f = torch.compile(
            lambda q, k, v: flex_attention(q, k, v, block_mask=mask),
            backend="neuron",
            options={"target": "half", "cache": False},
        )
        with torch.no_grad():
            got = f(q, k, v)
        torch.testing.assert_close(
            got, flex_attention(q, k, v, block_mask=mask), atol=2e-3, rtol=2e-3
        )
        assert torchneuron.stats()["ops_fallback"] == {}
    finally:
        monkeypatch.undo()
        for cached in caches:
            cached.cache_clear()


def test_causal_kernel_share_of_the_tensor_peak() -> None:
    # Causal S=2048, 2 heads, d=128, bf16 on trn2: per 512-key step VectorE's max and rescale
    # take 666 ns against TensorE's 427 ns of useful work; P^T mostly by transposing DMAs keeps
    # TensorE and ScalarE off the transposes and their evictions, and the diagonal steps' mask
    # is built while GpSimd waits for a round's maxima. 29.1% of the peak with every transpose
    # on TensorE and the mask built at a round's end; 36.1% with the diagonal units' mask added
    # by VectorE and the rescale factors exps on ScalarE; 37.7% now, the mask accumulated onto
    # the scores by TensorE and the factors e^x on GpSimd (modeled, deterministic).
    s = 2048
    q, k, v = (
        torch.randn(1, 2, s, 128, generator=torch.Generator().manual_seed(i)).bfloat16()
        for i in range(3)
    )
    mask = create_block_mask(causal, None, None, s, s, device="cpu")
    f = torch.compile(
        lambda q, k, v: flex_attention(q, k, v, block_mask=mask),
        backend="neuron",
        options={"target": "trn2"},
    )
    with torch.no_grad(), torchneuron.profile() as prof:
        got = f(q, k, v)
    (kernel,) = prof.kernels
    useful = 4 * 2 * 128 * s * (s + 1) / 2  # unmasked (query, key) pairs
    peak_flops_per_ns = native().target_peaks("trn2")["flops"] / 1e9
    assert useful / kernel["device_ns"] / peak_flops_per_ns >= 0.37
    torch.testing.assert_close(
        got.float(),
        flex_attention(q.float(), k.float(), v.float(), block_mask=mask),
        atol=3e-2,
        rtol=3e-2,
    )


@pytest.mark.parametrize(("s", "mask_mod"), [(768, None), (1024, causal)])
def test_query_heads_run_as_one_stream(s: int, mask_mod: Callable[..., Any] | None) -> None:
    # Three lanes of two or three query tiles and an even round count: each query head's
    # last two rounds run in the next one's first two, across key heads (both K/V slots,
    # the key heads' loop included) and within a GQA group, per batch; the heads' query
    # tiles keep their state sets apart. float32 tolerances catch any mix-up.
    mask = block_mask(mask_mod, s) if mask_mod else None
    run(*qkv(2, 8, s, 32, torch.float32, kv_heads=4), enable_gqa=True, block_mask=mask)


def test_query_heads_share_the_pipeline() -> None:
    # S=1024, 16 heads, d=128, bf16 on trn2, no mask: a head is 32 key steps, so each
    # head's pipeline fill and drain (the first scores and maxima, the last P V and
    # stores) took a tenth of its time: 42.6% of the peak; 46.6% with each head's last
    # two rounds in the next head's first two (modeled, deterministic).
    s = 1024
    q, k, v = (
        torch.randn(1, 16, s, 128, generator=torch.Generator().manual_seed(i)).bfloat16()
        for i in range(3)
    )
    f = torch.compile(
        lambda q, k, v: flex_attention(q, k, v), backend="neuron", options={"target": "trn2"}
    )
    with torch.no_grad(), torchneuron.profile() as prof:
        got = f(q, k, v)
    (kernel,) = prof.kernels
    peak_flops_per_ns = native().target_peaks("trn2")["flops"] / 1e9
    assert 4 * 16 * 128 * s * s / kernel["device_ns"] / peak_flops_per_ns >= 0.46
    torch.testing.assert_close(
        got.float(), flex_attention(q.float(), k.float(), v.float()), atol=3e-2, rtol=3e-2
    )


def test_block_mask_over_several_lengths() -> None:
    # From the second length on Dynamo traces with symbolic sizes: the BlockMask's sequence
    # lengths are then graph inputs, each call's kernel is compiled for its lengths (the
    # backend had refused the graph: "sequence lengths ... are not integers").
    attend = torch.compile(
        lambda q, k, v, m: flex_attention(q, k, v, block_mask=m), backend="neuron"
    )
    for s in (256, 384, 200):
        q, k, v = qkv(1, 2, s, 32, torch.float32)
        mask = block_mask(causal, s)
        torch.testing.assert_close(
            attend(q, k, v, mask), flex_attention(q, k, v, block_mask=mask), atol=2e-5, rtol=2e-5
        )
    assert torchneuron.stats()["ops_fallback"] == {}
