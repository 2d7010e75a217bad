"""``F.scaled_dot_product_attention`` on the FlexAttention kernel (inference graphs): golden
checks against eager SDPA on CPU.

Every inference case asserts that nothing fell back to eager and that the compiled document
is one ``higher_order.flex_attention`` node, with none of the math path's matmul + softmax
ops; block classes are checked where they decide which blocks the kernel skips. Training
graphs run the FlexAttention forward and backward kernels.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from graph_capture import CompileCall

import torchneuron
from torchneuron.attention_blocks import block_classes
from torchneuron.sdpa import (
    MASK_FORMS,
    causal_block_classes,
    expand_block_classes,
    mask_block_classes,
    mask_form,
)

# As in test_flex_attention.py: fp32 scores and softmax on the device; bf16 rounds P before
# P @ V on TensorE where eager keeps fp32.
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.bfloat16]
FLEX = "higher_order.flex_attention"
MASKED, PARTIAL, FULL = block_classes()  # the kernels' codes (torchneuron._C)


def qkv(
    b: int, h: int, s: int, d: int, dtype: torch.dtype, *, kv_heads: int = 0, kv_len: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    kv_heads, kv_len = kv_heads or h, kv_len or s
    q = torch.randn(b, h, s, d, generator=g).to(dtype)
    k = torch.randn(b, kv_heads, kv_len, d, generator=g).to(dtype)
    v = torch.randn(b, kv_heads, kv_len, d, generator=g).to(dtype)
    return q, k, v


def flex_nodes(calls: list[CompileCall]) -> list[dict[str, Any]]:
    return [n for c in calls for n in c.document["nodes"] if n["target"] == FLEX]


def blocks_of(node: dict[str, Any]) -> torch.Tensor:
    blocks = node["kwargs"]["blocks"]
    data = bytearray(base64.b64decode(blocks["data"]))
    return torch.frombuffer(data, dtype=torch.int8).reshape(blocks["shape"])


def run(
    calls: list[CompileCall],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """Compiles and runs SDPA without gradients, checks it against eager and that it became
    one FlexAttention node; returns that node."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: Any) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)

    with torch.no_grad():
        ref = attend(q, k, v, mask)
        out = torch.compile(attend, backend="neuron", fullgraph=True)(q, k, v, mask)
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}, stats
    tol = TOL[q.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    (doc,) = [c.document for c in calls]
    assert [n["target"] for n in doc["nodes"]] == [FLEX]
    (node,) = doc["nodes"]
    return node


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal(compile_calls: list[CompileCall], dtype: torch.dtype) -> None:
    node = run(compile_calls, *qkv(1, 2, 300, 32, dtype), is_causal=True)
    blocks = blocks_of(node)
    # 3 x 3 units: above the diagonal skipped, below it without the mask.
    expected = [[PARTIAL, MASKED, MASKED], [FULL, PARTIAL, MASKED], [FULL, FULL, PARTIAL]]
    assert blocks.tolist() == [[expected]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("q_len", "kv_len"), [(200, 333), (333, 200), (1, 77)])
def test_causal_cross_lengths(
    compile_calls: list[CompileCall], dtype: torch.dtype, q_len: int, kv_len: int
) -> None:
    # SDPA's causal mask is top-left aligned: query i sees keys 0..i whatever the lengths.
    run(compile_calls, *qkv(1, 2, q_len, 32, dtype, kv_len=kv_len), is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(200, 300), (1, 1, 200, 300), (2, 1, 200, 300), (2, 2, 200, 300), (2, 1, 1, 300)]
)
def test_bool_mask(
    compile_calls: list[CompileCall], dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(1)) > 0.3
    node = run(compile_calls, *qkv(2, 2, 200, 32, dtype, kv_len=300), mask)
    assert node["kwargs"]["mask_buffers"] and not node["kwargs"]["score_buffers"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_padding_mask_skips_blocks(compile_calls: list[CompileCall], dtype: torch.dtype) -> None:
    # [B, 1, 1, S]: batch 0 keeps 100 keys, batch 1 all 384; keys 256.. of batch 0 are one
    # masked unit the kernel skips, keys 0..127 of both a unit it reads without the mask.
    lengths = torch.tensor([100, 384])
    mask = (torch.arange(384) < lengths[:, None])[:, None, None, :]
    node = run(compile_calls, *qkv(2, 2, 256, 32, dtype, kv_len=384), mask)
    blocks = blocks_of(node)
    assert blocks.shape == (2, 1, 2, 3)
    assert blocks[0, 0].tolist() == [[PARTIAL, MASKED, MASKED]] * 2
    assert blocks[1, 0].tolist() == [[FULL, FULL, FULL]] * 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(200, 300), (2, 2, 200, 300), (2, 1, 1, 300)])
def test_additive_mask(
    compile_calls: list[CompileCall], dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    mask = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    node = run(compile_calls, *qkv(2, 2, 200, 32, dtype, kv_len=300), mask)
    assert node["kwargs"]["score_buffers"] == node["kwargs"]["mask_buffers"] != []
    assert blocks_of(node).unique().tolist() == [FULL]  # finite everywhere: no mask needed


def test_additive_mask_with_inf(compile_calls: list[CompileCall]) -> None:
    # -inf entries are masked (mask_mod), so blocks of -inf are skipped, and rows that are
    # -inf throughout give 0 like eager SDPA (whose softmax is "safe": no NaN).
    mask = torch.randn(1, 1, 256, 256, generator=torch.Generator().manual_seed(3))
    mask[..., 128:] = float("-inf")
    mask[..., 5, :] = float("-inf")
    node = run(compile_calls, *qkv(1, 2, 256, 32, torch.float32), mask)
    assert blocks_of(node).tolist() == [[[[PARTIAL, MASKED], [FULL, MASKED]]]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["float", "bool"])
def test_a_causal_mask_is_computed_not_read(
    compile_calls: list[CompileCall], dtype: torch.dtype, kind: str
) -> None:
    # nn.Transformer.generate_square_subsequent_mask, or its boolean form: the kernel computes
    # q_idx >= kv_idx as for is_causal instead of reading the mask ([4, 8, 1024, 64] bf16:
    # 358.1 us as with is_causal; the float mask added and read was 1164.5 us, modeled trn2).
    mask = torch.ones(200, 200, dtype=torch.bool).tril()
    if kind == "float":
        mask = nn.Transformer.generate_square_subsequent_mask(200).to(dtype)
    node = run(compile_calls, *qkv(2, 2, 200, 32, dtype), mask)
    assert node["kwargs"]["mask_buffers"] == node["kwargs"]["score_buffers"] == []
    assert torch.equal(blocks_of(node), causal_block_classes(200, 200))


def test_a_float_mask_of_zeros_and_inf_only_masks(compile_calls: list[CompileCall]) -> None:
    # Padding as a float mask (0 kept, -inf masked): read as a boolean one, nothing added.
    keep = torch.rand(2, 1, 200, 300, generator=torch.Generator().manual_seed(4)) > 0.3
    mask = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    node = run(compile_calls, *qkv(2, 2, 200, 32, torch.float32, kv_len=300), mask)
    assert node["kwargs"]["mask_buffers"] and not node["kwargs"]["score_buffers"]


def test_a_mask_whose_form_changes_gets_its_own_kernel(compile_calls: list[CompileCall]) -> None:
    # The same block classes (one entry of a diagonal block differs), another form: the
    # causal kernel would ignore the entry.
    causal = nn.Transformer.generate_square_subsequent_mask(256)
    other = causal.clone()
    other[5, 2] = float("-inf")
    q, k, v = qkv(1, 2, 256, 32, torch.float32)
    attend = torch.compile(F.scaled_dot_product_attention, backend="neuron")
    with torch.no_grad():
        for mask in (causal, other, causal):
            ref = F.scaled_dot_product_attention(q, k, v, mask)
            torch.testing.assert_close(attend(q, k, v, mask), ref, atol=2e-5, rtol=2e-5)
    assert torch.equal(mask_block_classes(causal), mask_block_classes(other))
    assert torchneuron.stats()["graphs_compiled"] == 2


def test_mask_forms() -> None:
    given, finite, causal = (MASK_FORMS.index(f) for f in ("given", "finite", "causal"))
    tril = torch.ones(6, 8, dtype=torch.bool).tril()  # top-left aligned, as SDPA's is_causal
    additive = torch.zeros(6, 8).masked_fill(~tril, float("-inf"))
    assert mask_form(tril, 6, 8) == mask_form(additive, 6, 8) == causal
    assert mask_form(tril.expand(2, 3, 6, 8), 6, 8) == causal
    differs = tril.repeat(2, 1, 1, 1)
    differs[1, 0, 5, 7] = True
    assert mask_form(differs, 6, 8) == given
    assert mask_form(additive.roll(1, 1), 6, 8) == finite
    assert mask_form(additive + 0.5, 6, 8) == given
    assert mask_form(tril[-1:], 6, 8) == given  # [1, 8], broadcast over the queries
    assert mask_form(torch.zeros(1, 8), 6, 8) == finite


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_are_zero_like_eager(
    compile_calls: list[CompileCall], dtype: torch.dtype
) -> None:
    # Eager SDPA gives 0 (not NaN) for a query row whose keys are all masked; so does the
    # kernel: row 3 in a partial block, rows 140.. in a block of their own.
    mask = torch.ones(150, 150, dtype=torch.bool).tril()
    mask[3] = False
    mask[128:] = False
    mask[128:140, :5] = True
    q, k, v = qkv(1, 2, 150, 16, dtype)
    with torch.no_grad():
        out = torch.compile(F.scaled_dot_product_attention, backend="neuron")(q, k, v, mask)
        ref = F.scaled_dot_product_attention(q, k, v, mask)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 1
    assert (ref[:, :, 3] == 0).all() and (ref[:, :, 140:] == 0).all()
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert (out[:, :, 3] == 0).all() and (out[:, :, 140:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_gqa(compile_calls: list[CompileCall], dtype: torch.dtype) -> None:
    node = run(
        compile_calls, *qkv(1, 8, 256, 64, dtype, kv_heads=2), is_causal=True, enable_gqa=True
    )
    assert node["outputs"][0]["shape"] == [1, 8, 256, 64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gqa_with_mask(compile_calls: list[CompileCall], dtype: torch.dtype) -> None:
    mask = torch.rand(1, 4, 130, 130, generator=torch.Generator().manual_seed(4)) > 0.5
    run(compile_calls, *qkv(1, 4, 130, 32, dtype, kv_heads=2), mask, enable_gqa=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_custom_scale(compile_calls: list[CompileCall], dtype: torch.dtype) -> None:
    node = run(compile_calls, *qkv(1, 2, 200, 32, dtype), is_causal=True, scale=0.3)
    assert node["kwargs"]["scale"] == 0.3
    mask = torch.randn(200, 200, generator=torch.Generator().manual_seed(5))
    compile_calls.clear()
    torchneuron.reset_stats()
    run(compile_calls, *qkv(1, 2, 200, 32, dtype), mask, scale=0.05)


def test_default_scale(compile_calls: list[CompileCall]) -> None:
    node = run(compile_calls, *qkv(1, 2, 64, 48, torch.float32))
    assert node["kwargs"]["scale"] == pytest.approx(48**-0.5)
    assert blocks_of(node).tolist() == [[[[FULL]]]]


def test_mask_content_with_the_same_blocks_reuses_the_kernel(
    compile_calls: list[CompileCall],
) -> None:
    # The kernel depends on the mask's block classes, not on its content: two masks with the
    # same classes share one kernel, a third with other classes compiles another.
    q, k, v = qkv(1, 2, 256, 32, torch.float32)
    attend = torch.compile(F.scaled_dot_product_attention, backend="neuron")
    g = torch.Generator().manual_seed(6)
    first = torch.rand(256, 256, generator=g) > 0.5
    second = torch.rand(256, 256, generator=g) > 0.5
    third = first.clone()
    third[:128, 128:] = False
    for mask in (first, second, third):
        with torch.no_grad():
            out = attend(q, k, v, mask)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, mask))
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(compile_calls) == 2
    assert blocks_of(flex_nodes(compile_calls)[1]).tolist() == [
        [[[PARTIAL, MASKED], [PARTIAL, PARTIAL]]]
    ]


def test_masks_past_the_structure_limit_share_an_all_partial_kernel(
    compile_calls: list[CompileCall], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A padding mask whose structure changes every call: after the limit, one kernel whose
    # blocks are all partial serves every further structure.
    monkeypatch.setattr("torchneuron.sdpa.MAX_MASK_STRUCTURES", 1)
    q, k, v = qkv(1, 2, 256, 32, torch.float32)
    attend = torch.compile(F.scaled_dot_product_attention, backend="neuron")
    for length in (256, 100, 200, 20):
        mask = (torch.arange(256) < length)[None, :]
        with torch.no_grad():
            out = attend(q, k, v, mask)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, mask))
    assert torchneuron.stats()["ops_fallback"] == {}
    first, partial = flex_nodes(compile_calls)
    assert blocks_of(first).unique().tolist() == [FULL]
    assert partial["kwargs"]["blocks"] is None


def test_module_with_parameters_under_no_grad(compile_calls: list[CompileCall]) -> None:
    # Parameters require grad, but grad mode is off: an inference graph, so SDPA is routed.
    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).view(1, -1, 3, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(1, 140, 32)
    with torch.no_grad():
        out = torch.compile(model, backend="neuron")(x)
        torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 1
    targets = [n["target"] for c in compile_calls for n in c.document["nodes"]]
    assert not any("bmm" in t or "exp" in t or "amax" in t for t in targets), targets


def test_dynamic_shapes_with_a_mask(compile_calls: list[CompileCall]) -> None:
    # All sizes symbolic (head dim too): one kernel per call size, each a flex node.
    attend = torch.compile(F.scaled_dot_product_attention, backend="neuron", dynamic=True)
    for s in (100, 260):
        q, k, v = qkv(1, 2, s, 16, torch.float32)
        mask = torch.rand(1, 1, s, s, generator=torch.Generator().manual_seed(s)) > 0.4
        with torch.no_grad():
            out = attend(q, k, v, mask)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, mask))
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {} and stats["recompiles"] >= 1
    assert len(flex_nodes(compile_calls)) == 2


def test_a_recompile_for_a_new_length_keeps_the_kernel(compile_calls: list[CompileCall]) -> None:
    # Dynamo's automatic dynamic recompile gives query, key and value sizes of their own
    # symbols; the call must still become the attention kernel (the math path it fell to was
    # 17x slower at 1024 rows).
    attend = torch.compile(F.scaled_dot_product_attention, backend="neuron")
    for s in (100, 260, 300):
        q, k, v = qkv(1, 2, s, 16, torch.float32)
        with torch.no_grad():
            out = attend(q, k, v, is_causal=True)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {} and stats["recompiles"] >= 1
    assert len(flex_nodes(compile_calls)) == 3 and math_targets(compile_calls) == set()


def test_symbolic_head_dim_above_128_is_a_counted_fallback(
    compile_calls: list[CompileCall],
) -> None:
    q, k, v = qkv(1, 1, 64, 160, torch.float32)
    with torch.no_grad():
        attend = torch.compile(F.scaled_dot_product_attention, backend="neuron", dynamic=True)
        out = attend(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, ref)
    assert torchneuron.stats()["ops_fallback"] == {"torchneuron.attention.default": 1}
    assert flex_nodes(compile_calls) == []


def test_float16(compile_calls: list[CompileCall]) -> None:
    q, k, v = qkv(1, 2, 200, 32, torch.float16)
    with torch.no_grad():
        out = torch.compile(F.scaled_dot_product_attention, backend="neuron")(
            q, k, v, None, 0.0, True
        )
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-3, rtol=3e-3)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 1


def math_targets(calls: list[CompileCall]) -> set[str]:
    targets = {n["target"] for c in calls for n in c.document["nodes"]}
    return {t for t in targets if t.split(".")[1] in ("bmm", "exp", "amax", "div", "sum")}


def _bool_mask(s: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(1, 1, s, s, generator=g) > 0.3
    return mask | torch.eye(s, dtype=torch.bool)  # every row keeps a key


def _additive_mask(s: int) -> torch.Tensor:
    m = torch.randn(1, 2, s, s, generator=torch.Generator().manual_seed(6))
    return m.masked_fill(~_bool_mask(s), float("-inf"))


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        ("causal", torch.float32),
        ("causal", torch.bfloat16),
        ("bool", torch.float32),
        ("additive", torch.float32),
        ("gqa", torch.float32),
    ],
)
def test_training_runs_on_the_flex_kernels(
    compile_calls: list[CompileCall], case: str, dtype: torch.dtype
) -> None:
    # Forward and backward are the FlexAttention forward and backward kernels, not the math
    # path; the gradients match eager SDPA's.
    s = 140
    mask = {"bool": _bool_mask(s), "additive": _additive_mask(s)}.get(case)

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=case in ("causal", "gqa"), enable_gqa=case == "gqa"
        )

    def leaves() -> list[torch.Tensor]:
        kv_heads = 1 if case == "gqa" else 0
        return [t.requires_grad_() for t in qkv(1, 2, s, 16, dtype, kv_heads=kv_heads)]

    ours, ref = leaves(), leaves()
    out = torch.compile(attention, backend="neuron")(*ours)
    out.float().square().sum().backward()
    attention(*ref).float().square().sum().backward()
    tol = {torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype]
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad.float(), b.grad.float(), atol=tol, rtol=tol)
    assert torchneuron.stats()["ops_fallback"] == {}
    targets = [n["target"] for c in compile_calls for n in c.document["nodes"]]
    assert targets.count(FLEX) == 1 and targets.count(FLEX + "_backward") == 1, targets
    assert not math_targets(compile_calls)


def test_dropout_keeps_the_math_path(compile_calls: list[CompileCall]) -> None:
    # dropout_p > 0 (the caller's choice even without gradients) is not a FlexAttention
    # call: the math path with its random mask, on the device where it can be.
    q, k, v = qkv(1, 2, 64, 16, torch.float32)
    with torch.no_grad():
        out = torch.compile(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5),
            backend="neuron",
        )(q, k, v)
    assert out.shape == (1, 2, 64, 16)
    assert flex_nodes(compile_calls) == []
    assert "aten.bmm.default" in math_targets(compile_calls)


def test_three_d_inputs_keep_the_math_path(compile_calls: list[CompileCall]) -> None:
    # README: inputs that are not 4-D keep SDPA's math path (the kernels index [B, H, L, D]).
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 64, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        out = torch.compile(F.scaled_dot_product_attention, backend="neuron")(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)
    assert flex_nodes(compile_calls) == []
    assert "aten.bmm.default" in math_targets(compile_calls)


def test_float64_keeps_the_math_path(compile_calls: list[CompileCall]) -> None:
    # README: float64 keeps SDPA's math path (the kernels compute in fp32 at most).
    q, k, v = (t.double() for t in qkv(1, 2, 64, 16, torch.float32))
    with torch.no_grad():
        out = torch.compile(F.scaled_dot_product_attention, backend="neuron")(q, k, v)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert flex_nodes(compile_calls) == []
    # The math path's float64 matmuls fall back op by op (counted; the device computes in
    # fp32 at most), never the attention op as a whole.
    fallback = torchneuron.stats()["ops_fallback"]
    assert "aten.bmm.default" in fallback, fallback
    assert not any("attention" in op for op in fallback), fallback


def test_float_mask_requiring_grad_keeps_the_math_path_in_training(
    compile_calls: list[CompileCall],
) -> None:
    # README: in training, a float mask that requires grad keeps the math path, whose
    # backward gives the mask its gradient (the FlexAttention backward has none for it).
    s = 64

    def leaves() -> list[torch.Tensor]:
        mask = _additive_mask(s).clone()
        return [t.requires_grad_() for t in (*qkv(1, 2, s, 16, torch.float32), mask)]

    def attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    ours, ref = leaves(), leaves()
    torch.compile(attention, backend="neuron")(*ours).square().sum().backward()
    attention(*ref).square().sum().backward()
    for a, b in zip(ours, ref, strict=True):
        assert a.grad is not None
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4)
    targets = [n["target"] for c in compile_calls for n in c.document["nodes"]]
    assert FLEX not in targets and FLEX + "_backward" not in targets, targets
    assert "aten.bmm.default" in math_targets(compile_calls)


def test_head_dim_above_128_keeps_the_math_path(compile_calls: list[CompileCall]) -> None:
    q, k, v = qkv(1, 1, 64, 160, torch.float32)
    with torch.no_grad():
        out = torch.compile(F.scaled_dot_product_attention, backend="neuron")(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-4, rtol=1e-4)
    assert flex_nodes(compile_calls) == []
    assert "aten.bmm.default" in math_targets(compile_calls)


# -- block classes ------------------------------------------------------------------------------


@pytest.mark.parametrize(("q_len", "kv_len"), [(300, 300), (1, 77), (130, 500), (500, 130)])
def test_causal_classes_are_the_classes_of_the_causal_mask(q_len: int, kv_len: int) -> None:
    tril = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
    assert torch.equal(causal_block_classes(q_len, kv_len), mask_block_classes(tril))


def test_mask_classes() -> None:
    mask = torch.zeros(2, 1, 200, 260, dtype=torch.bool)
    mask[0, :, :128, :128] = True  # full unit
    mask[0, :, 150, 3] = True  # one entry
    mask[1, :, 128:, 256:] = True  # the ragged corner unit: 72 x 4 entries, all kept
    classes = mask_block_classes(mask)
    assert classes.tolist() == [
        [[[FULL, MASKED, MASKED], [PARTIAL, MASKED, MASKED]]],
        [[[MASKED, MASKED, MASKED], [MASKED, MASKED, FULL]]],
    ]
    additive = torch.zeros(1, 260)
    additive[0, 128:256] = float("-inf")
    assert mask_block_classes(additive).tolist() == [[[[FULL, MASKED, FULL]]]]


def test_broadcast_mask_classes_expand_to_the_call() -> None:
    padding = torch.arange(300)[None, None, None, :] < torch.tensor([100, 300])[:, None, None, None]
    classes = mask_block_classes(padding)
    assert classes.shape == (2, 1, 1, 3)
    expanded = expand_block_classes(classes, 140, 300)
    assert expanded.shape == (2, 1, 2, 3)
    assert expanded[0, 0].tolist() == [[PARTIAL, MASKED, MASKED]] * 2


@pytest.mark.parametrize("case", ["causal", "bool", "additive", "gqa"])
def test_eager_attention_backward_op_matches_autograd(case: str) -> None:
    # The op's eager kernel (run when its graph falls back, e.g. after a failed
    # specialization) runs below autograd: it must not rely on tracing a backward.
    s = 12
    mask = {"bool": _bool_mask(s)[0, 0], "additive": _additive_mask(s)[0]}.get(case)
    causal, gqa = case in ("causal", "gqa"), case == "gqa"
    q, k, v = qkv(2, 2, s, 8, torch.float32, kv_heads=1 if gqa else 0)
    grad_out = torch.randn(2, 2, s, 8, generator=torch.Generator().manual_seed(3))
    out, lse = torch.ops.torchneuron.attention_fwd(q, k, v, mask, causal, 0.3, gqa)
    got = torch.ops.torchneuron.attention_bwd(q, k, v, mask, causal, 0.3, gqa, out, lse, grad_out)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(
        *leaves, attn_mask=mask, is_causal=causal, scale=0.3, enable_gqa=gqa
    )
    expected = torch.autograd.grad(ref, leaves, grad_out)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads", [3, 4])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transformer_encoder_layer_runs_on_the_flex_kernel(
    compile_calls: list[CompileCall], dtype: torch.dtype, norm_first: bool, heads: int
) -> None:
    # In inference nn.TransformerEncoderLayer calls nn.MultiheadAttention's functional form
    # (an odd head count), which Dynamo keeps whole and aot_autograd traced into float32
    # math, or its fused fast path (an even one: a fallback to eager PyTorch for the whole
    # layer). Both are written out around SDPA, so the attention is the FlexAttention
    # kernel: a ViT-Tiny layer over [2, 197, 192] bf16 348.6 -> 120.5 us (modeled, trn2).
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        96, heads, 128, dropout=0.1, activation="gelu", batch_first=True, norm_first=norm_first
    )
    layer = layer.eval().to(dtype)
    x = torch.randn(2, 70, 96).to(dtype)
    with torch.no_grad():
        out = torch.compile(layer, backend="neuron")(x)
        ref = layer(x)
    tol = TOL[dtype] if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 1
    assert not math_targets(compile_calls)


def test_multihead_attention_trains_causal_on_the_flex_kernels(
    compile_calls: list[CompileCall],
) -> None:
    # Sequence-first, train mode without dropout, a causal mask with is_causal: SDPA's causal
    # attention forward and backward; the gradients match eager.
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(32, 4)
    mask = nn.Transformer.generate_square_subsequent_mask(40)
    x = torch.randn(40, 3, 32, requires_grad=True)

    def attend(x: torch.Tensor) -> torch.Tensor:
        return mha(x, x, x, need_weights=False, attn_mask=mask, is_causal=True)[0]

    out = torch.compile(attend, backend="neuron")(x)
    out.square().sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in mha.parameters()]
    x.grad = None
    mha.zero_grad()
    attend(x).square().sum().backward()
    for got, want in zip(grads, [x.grad] + [p.grad for p in mha.parameters()], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    targets = [n["target"] for c in compile_calls for n in c.document["nodes"]]
    assert targets.count(FLEX) == 1 and targets.count(FLEX + "_backward") == 1, targets


@pytest.mark.parametrize("masks", ["bool and bool", "float and bool", "causal and padding"])
def test_multihead_attention_with_both_masks_runs_on_the_flex_kernel(
    compile_calls: list[CompileCall], masks: str
) -> None:
    # An attention mask and a key padding mask at once: MHA adds them (booleans as -inf),
    # is_causal then stands for nothing (the mask is applied). SDPA's mask is their sum.
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(2, 20, 32)
    pad = torch.zeros(2, 20, dtype=torch.bool)
    pad[1, 15:] = True
    causal = torch.ones(20, 20, dtype=torch.bool).triu(1)  # MHA's: True masks
    if masks != "bool and bool":
        causal = nn.Transformer.generate_square_subsequent_mask(20)
    is_causal = masks == "causal and padding"

    def attend(x: torch.Tensor) -> torch.Tensor:
        return mha(
            x,
            x,
            x,
            attn_mask=causal,
            key_padding_mask=pad,
            need_weights=False,
            is_causal=is_causal,
        )[0]

    with torch.no_grad():
        out = torch.compile(attend, backend="neuron", fullgraph=True)(x)
        ref = attend(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 1
    assert not math_targets(compile_calls)


@pytest.mark.parametrize("masks", ["causal", "bool", "padding", "causal and padding"])
def test_transformer_encoder_layer_fast_path_with_masks(
    compile_calls: list[CompileCall], masks: str
) -> None:
    # Batch first, an even head count, inference: the layer's fused fast path with
    # merge_masks' mask ([N, S] padding, or [N, H, L, S]): a fallback to eager PyTorch for
    # the whole layer unless written out.
    torch.manual_seed(4)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
    x = torch.randn(2, 40, 64)
    pad = torch.zeros(2, 40, dtype=torch.bool)
    pad[0, 33:] = True
    kwargs: dict[str, torch.Tensor] = {}
    if "causal" in masks:
        kwargs["src_mask"] = nn.Transformer.generate_square_subsequent_mask(40)
    if masks == "bool":
        kwargs["src_mask"] = torch.rand(40, 40) > 0.8
    if "padding" in masks:  # a float one: mixed types are deprecated
        kwargs["src_key_padding_mask"] = torch.zeros(2, 40).masked_fill(pad, float("-inf"))
    with torch.no_grad():
        out = torch.compile(layer, backend="neuron", fullgraph=True)(x, **kwargs)
        ref = layer(x, **kwargs)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 1


def test_transformer_encoder_with_a_mask_compiles_whole(
    compile_calls: list[CompileCall],
) -> None:
    # PyTorch's language-modelling tutorial: `encoder(src, src_mask)`, sequence first, a
    # float causal mask and no is_causal. The encoder compares the mask with a causal one and
    # branches on the result (a graph break in the caller: the whole encoder ran in eager
    # PyTorch); traced, the mask is applied as given.
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    src = torch.randn(35, 2, 64)
    mask = nn.Transformer.generate_square_subsequent_mask(35)
    for train in (False, True):
        encoder.train(train)
        with torch.set_grad_enabled(train):
            out = torch.compile(encoder, backend="neuron", fullgraph=True)(src, mask)
            torch.testing.assert_close(out, encoder(src, mask), atol=1e-5, rtol=1e-5)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 4  # two layers, in each mode


def test_transformer_with_mixed_mask_types_compiles_whole(
    compile_calls: list[CompileCall],
) -> None:
    # PyTorch's translation tutorial: float attention masks with boolean padding masks. Both
    # modules warn that mixed types are deprecated (warnings.warn: a graph break in the
    # caller, the whole model in eager PyTorch).
    torch.manual_seed(6)
    model = nn.Transformer(64, 4, 1, 1, 128, dropout=0.0).eval()
    src, tgt = torch.randn(30, 2, 64), torch.randn(12, 2, 64)
    src_pad = torch.zeros(2, 30, dtype=torch.bool)
    src_pad[1, 24:] = True
    masks = {
        "src_mask": torch.zeros(30, 30),
        "tgt_mask": nn.Transformer.generate_square_subsequent_mask(12),
        "src_key_padding_mask": src_pad,
        "tgt_key_padding_mask": torch.zeros(2, 12, dtype=torch.bool),
        "memory_key_padding_mask": src_pad,
    }
    with torch.no_grad():
        out = torch.compile(model, backend="neuron", fullgraph=True)(src, tgt, **masks)
        torch.testing.assert_close(out, model(src, tgt, **masks), atol=1e-5, rtol=1e-5)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 3  # encoder, decoder self and cross attention


@pytest.mark.parametrize(
    "case",
    ["packed kv", "separate k v", "bool mask", "float 3-d mask", "padding mask", "weights unread"],
)
def test_multihead_cross_attention_and_masks_run_on_the_flex_kernel(
    compile_calls: list[CompileCall], case: str
) -> None:
    # Cross-attention (nn.TransformerDecoderLayer's over the memory, DETR's) projects the
    # query and the keys and values by the packed weights' rows; MHA's attention mask, or its
    # key padding mask ([N, S]: [N, 1, 1, S]), is SDPA's (a boolean one inverted: MHA masks
    # where it is True, SDPA keeps). `mha(q, k, v)[0]` (need_weights by default) never reads
    # the weights: the same kernel.
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(64, 4).eval()
    q, kv, v = torch.randn(30, 2, 64), torch.randn(45, 2, 64), torch.randn(45, 2, 64)
    mask = {
        "bool mask": torch.rand(30, 45) > 0.7,
        "float 3-d mask": torch.randn(8, 30, 45),
    }.get(case)
    padding = None
    if case == "padding mask":
        padding = torch.zeros(2, 45, dtype=torch.bool)
        padding[1, 30:] = True
    value = v if case == "separate k v" else kv

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        need = case == "weights unread"
        return mha(q, k, v, attn_mask=mask, key_padding_mask=padding, need_weights=need)[0]

    with torch.no_grad():
        out = torch.compile(attend, backend="neuron")(q, kv, value)
        ref = attend(q, kv, value)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert len(flex_nodes(compile_calls)) == 1
    assert not math_targets(compile_calls)
