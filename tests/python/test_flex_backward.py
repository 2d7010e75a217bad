"""FlexAttention training: the ``flex_attention_backward`` kernel against torch's own backward.

Every case runs forward and backward through ``torch.compile(backend="neuron")`` and compares
the gradients of query, key and value with those of torch's dense FlexAttention backward
(``backend="aot_eager"``, in float64), asserting that both graphs ran on the device: no op
fell back, and the backward document holds one ``flex_attention_backward`` node.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CompileCall
from test_flex_attention import alibi, block_mask, causal, qkv, sliding_window, soft_cap
from torch.nn.attention.flex_attention import BlockMask, and_masks, flex_attention

import torchneuron

REPO = Path(__file__).resolve().parents[2]

# fp32: the device keeps scores, P and dS in fp32. bf16: P and dS are rounded to bf16 before
# the TensorE matmuls; the reference computes in float64 from the same bf16 inputs.
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def _flex_training() -> None:
    torchneuron.allow_flex_attention_training()


def check_grads(
    compile_calls: list[CompileCall],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score_mod: Callable[..., Any] | None = None,
    block_mask: BlockMask | None = None,
    enable_gqa: bool = False,
    options: dict[str, Any] | None = None,
) -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        return flex_attention(
            q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa
        )

    grad_out = torch.randn(q.shape[:-1] + v.shape[-1:], generator=torch.Generator().manual_seed(3))
    ours = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = torch.compile(attend, backend="neuron", fullgraph=True, options=options)(*ours)
    (out.float() * grad_out).sum().backward()
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}, stats
    assert stats["kernels_run"] == 2, stats  # forward and backward
    targets = [n["target"] for c in compile_calls for n in c.document["nodes"]]
    assert targets.count("higher_order.flex_attention_backward") == 1, targets

    torch._dynamo.reset()
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out = torch.compile(attend, backend="aot_eager", fullgraph=True)(*ref)
    (ref_out * grad_out.double()).sum().backward()
    tol = TOL[q.dtype]
    for name, a, b in zip("qkv", ours, ref, strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(
            a.grad.double(), b.grad, atol=tol, rtol=tol, msg=lambda m, n=name: f"d{n}: {m}"
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_mask(compile_calls: list[CompileCall], dtype: torch.dtype) -> None:
    # A BlockMask keeping every block, made outside the model: with block_mask=None the
    # forward graph builds the default one (sort, index_put, ...), which falls back.
    def everything(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return q >= 0

    check_grads(compile_calls, *qkv(1, 2, 256, 32, dtype), block_mask=block_mask(everything, 256))


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal(compile_calls: list[CompileCall], dtype: torch.dtype) -> None:
    check_grads(compile_calls, *qkv(1, 2, 256, 64, dtype), block_mask=block_mask(causal, 256))


@pytest.mark.parametrize("s", [77, 200])
def test_ragged_lengths(compile_calls: list[CompileCall], s: int) -> None:
    check_grads(compile_calls, *qkv(1, 2, s, 16, torch.float32), block_mask=block_mask(causal, s))


def test_soft_cap_with_captured_bias(compile_calls: list[CompileCall]) -> None:
    # score_mod's gradient (tanh') runs on the device; the bias table is a captured tensor.
    bias = torch.randn(2, generator=torch.Generator().manual_seed(2))
    cap = soft_cap(5.0)

    def score_mod(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        return cap(score, b, h, q, kv) + bias[h]

    check_grads(
        compile_calls,
        *qkv(1, 2, 256, 32, torch.float32),
        score_mod=score_mod,
        block_mask=block_mask(causal, 256),
    )


def test_alibi_sliding_window(compile_calls: list[CompileCall]) -> None:
    check_grads(
        compile_calls,
        *qkv(1, 4, 384, 32, torch.float32),
        score_mod=alibi(4),
        block_mask=block_mask(sliding_window(150), 384),
    )


def test_document_mask(compile_calls: list[CompileCall]) -> None:
    s = 300
    docs = torch.tensor([0] * 90 + [1] * 150 + [2] * 60, dtype=torch.int32)

    def document(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (docs[q] == docs[kv]) & (q >= kv)

    check_grads(compile_calls, *qkv(1, 2, s, 32, torch.float32), block_mask=block_mask(document, s))


def test_relative_position_bias(compile_calls: list[CompileCall]) -> None:
    s, h = 200, 2
    table = torch.randn(h, 2 * s - 1, generator=torch.Generator().manual_seed(1))

    def bias(score: Any, b: Any, hh: Any, q: Any, kv: Any) -> Any:
        return score + table[hh, kv - q + s - 1]

    check_grads(
        compile_calls,
        *qkv(1, h, s, 32, torch.float32),
        score_mod=bias,
        block_mask=block_mask(causal, s),
    )


def test_gqa_and_batch(compile_calls: list[CompileCall]) -> None:
    # Key and value gradients sum over the query heads sharing a key head.
    check_grads(
        compile_calls,
        *qkv(2, 4, 256, 32, torch.float32, kv_heads=2),
        enable_gqa=True,
        block_mask=block_mask(and_masks(causal, sliding_window(100)), 256),
    )


def test_long_sequence_streams_through_sbuf(compile_calls: list[CompileCall]) -> None:
    # 8192 tokens at head dim 128 do not fit in SBUF for the backward: keys and queries go
    # through it in chunks, and dQ sums over the key chunks in HBM.
    s = 8192
    check_grads(compile_calls, *qkv(1, 1, s, 128, torch.bfloat16), block_mask=block_mask(causal, s))


def test_chunks_on_a_small_sbuf(
    compile_calls: list[CompileCall], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Trn2 with 96 KiB per partition streams 3072 tokens in two key chunks and two query
    # chunks of unequal sizes; causal masking skips the chunk pair above the diagonal.
    spec = json.loads((REPO / "runtime" / "target" / "trn2.json").read_text())
    spec["name"] = "trn2small"
    spec["sbuf_bytes_per_partition"]["value"] = 96 * 1024
    (tmp_path / "trn2small.json").write_text(json.dumps(spec))
    monkeypatch.setenv("TORCHNEURON_TARGET_DIR", str(tmp_path))
    s = 3072
    check_grads(
        compile_calls,
        *qkv(1, 2, s, 64, torch.float32),
        block_mask=block_mask(causal, s),
        options={"target": "trn2small"},
    )


def test_eager_flex_attention_keeps_torchs_cpu_check() -> None:
    # README: allow_flex_attention_training() lifts torch's "no backward on CPU" check for
    # compiled code only; an eager call on CPU tensors that require grad still refuses.
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 128, 16, torch.float32))
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, k, v)


def _fallback_backward(
    attend: Callable[..., Any],
    leaves: list[torch.Tensor],
    loss: Callable[[Any], torch.Tensor],
    views: dict[str, int] | None = None,
) -> None:
    """Trains one step compiled for the device and with aot_eager in float64; the gradients of
    every leaf agree, and the backward kernel is the one counted fallback (named), besides
    `views` (view ops the eager region takes along, no arithmetic)."""
    ours = [t.detach().clone().requires_grad_() for t in leaves]
    loss(torch.compile(attend, backend="neuron", fullgraph=True)(*ours)).backward()
    expected = {"higher_order.flex_attention_backward": 1, **(views or {})}
    assert torchneuron.stats()["ops_fallback"] == expected
    torch._dynamo.reset()
    ref = [t.detach().double().requires_grad_() for t in leaves]
    loss(torch.compile(attend, backend="aot_eager", fullgraph=True)(*ref)).backward()
    for a, b in zip(ours, ref, strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-4, rtol=1e-4)


def test_gradient_of_a_captured_table_is_a_counted_fallback() -> None:
    # README: the gradient of a tensor score_mod captures (a learned bias table) is not
    # computed on the device: that backward falls back to eager PyTorch, counted.
    mask = block_mask(causal, 256)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> Any:
        def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return score + bias[h]

        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask)

    bias = torch.randn(2, generator=torch.Generator().manual_seed(4))
    # The captured table's aliases in the backward graph stay beside the eager kernel.
    _fallback_backward(
        attend,
        [*qkv(1, 2, 256, 16, torch.float32), bias],
        lambda out: out.square().sum(),
        views={"aten.alias.default": 2},
    )


def test_gradient_of_the_lse_is_a_counted_fallback() -> None:
    # README: a loss that uses the log-sum-exp (return_lse=True) needs its gradient, which
    # the device backward does not compute: that backward falls back, counted.
    mask = block_mask(causal, 256)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        return flex_attention(q, k, v, block_mask=mask, return_lse=True)

    _fallback_backward(
        attend,
        list(qkv(1, 2, 256, 16, torch.float32)),
        lambda out: out[0].square().sum() + out[1].sum(),
    )
