"""Hugging Face Transformers models, as users build them, through torch.compile(backend="neuron").

Randomly initialised from small configs (no downloads): each family's own modelling code, with
the forms our hand-written models (models.py) do not have: Transformers v5's grouped-GEMM
mixture-of-experts (``sort``, ``histc``, ``cumsum``, ``_grouped_mm`` or its
``transformers::grouped_mm_fallback`` op, the inverse permutation as ``index_put``), Swin's
pooler (an ``as_strided`` of a pooled tensor), Mamba's convolution-state cache (``copy_``),
sliding windows, MLA attention. Every op must run on the device, matching eager PyTorch.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
import transformers as hf

import torchneuron

TOLERANCES = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
}
LM = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256}
MOE = {"num_experts_per_tok": 2}


def _ids(batch: int = 2, length: int = 16) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, 256, (batch, length))}


def _pixels(size: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(2, 3, size, size)}


# name -> (model factory, inputs factory, output field)
FAMILIES: dict[str, tuple[Callable[[], Any], Callable[[], dict[str, torch.Tensor]], str]] = {
    "llama": (
        lambda: hf.LlamaForCausalLM(
            hf.LlamaConfig(**LM, num_attention_heads=4, num_key_value_heads=2)
        ),
        _ids,
        "logits",
    ),
    "mistral_sliding_window": (
        lambda: hf.MistralForCausalLM(
            hf.MistralConfig(**LM, num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
        ),
        _ids,
        "logits",
    ),
    "mixtral_moe": (
        lambda: hf.MixtralForCausalLM(
            hf.MixtralConfig(
                **LM, **MOE, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4
            )
        ),
        _ids,
        "logits",
    ),
    "qwen2_moe_shared_expert": (
        lambda: hf.Qwen2MoeForCausalLM(
            hf.Qwen2MoeConfig(
                **LM,
                **MOE,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_experts=4,
                moe_intermediate_size=64,
                shared_expert_intermediate_size=64,
            )
        ),
        _ids,
        "logits",
    ),
    # Top-8 routing (Qwen3-MoE, OLMoE, DeepSeek-V3's shape): the weighted sum over 8 slices.
    "qwen3_moe_top8": (
        lambda: hf.Qwen3MoeForCausalLM(
            hf.Qwen3MoeConfig(
                **LM,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_experts=16,
                num_experts_per_tok=8,
                moe_intermediate_size=64,
            )
        ),
        _ids,
        "logits",
    ),
    "deepseek_v3_mla_moe": (
        lambda: hf.DeepseekV3ForCausalLM(
            hf.DeepseekV3Config(
                **LM,
                **MOE,
                num_attention_heads=4,
                num_key_value_heads=4,
                n_routed_experts=4,
                moe_intermediate_size=64,
                q_lora_rank=32,
                kv_lora_rank=32,
                qk_rope_head_dim=8,
                qk_nope_head_dim=8,
                v_head_dim=16,
                first_k_dense_replace=1,
                n_group=1,
                topk_group=1,
            )
        ),
        _ids,
        "logits",
    ),
    "bert": (
        lambda: hf.BertModel(hf.BertConfig(**LM, num_attention_heads=4)),
        _ids,
        "last_hidden_state",
    ),
    "swin": (
        lambda: hf.SwinModel(
            hf.SwinConfig(
                image_size=64,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=4,
            )
        ),
        lambda: _pixels(64),
        "pooler_output",
    ),
    "convnext": (
        lambda: hf.ConvNextModel(
            hf.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=64)
        ),
        lambda: _pixels(64),
        "pooler_output",
    ),
    "whisper_encoder": (
        lambda: hf.WhisperModel(
            hf.WhisperConfig(
                d_model=64,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_ffn_dim=128,
                num_mel_bins=16,
                max_source_positions=32,
                vocab_size=256,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=1,
            )
        ).get_encoder(),
        lambda: {"input_features": torch.randn(2, 16, 64)},
        "last_hidden_state",
    ),
    "mamba": (
        lambda: hf.MambaForCausalLM(
            hf.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=256, state_size=8)
        ),
        _ids,
        "logits",
    ),
}


def _assert_all_on_device() -> None:
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}, stats["ops_fallback"]
    assert stats["kernels_run"] > 0 and stats["ops_on_device"] > 0


# A router picks experts by comparing scores, so a bf16 rounding that differs from eager's
# anywhere upstream can flip a near tie and route a token elsewhere: whole models with experts
# are compared in float32, and their expert blocks in bf16 on the same inputs (below).
# In bf16, the families whose code has a bf16-specific form (Llama's RMSNorm upcast and
# rotary embedding, BERT's LayerNorm, ConvNeXt's convolutions and channel LayerNorm); the
# other families' ops are the same in bf16, covered op by op (test_ops.py, OpInfo).
BF16_FAMILIES = ("llama", "bert", "convnext")
CASES = [(family, torch.float32) for family in FAMILIES] + [
    (family, torch.bfloat16) for family in BF16_FAMILIES
]


@pytest.mark.parametrize(("family", "dtype"), CASES, ids=[f"{f}-{str(d)[6:]}" for f, d in CASES])
def test_family_matches_eager(family: str, dtype: torch.dtype, real_native: ModuleType) -> None:
    build, inputs_of, field = FAMILIES[family]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build().eval().to(dtype)
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs_of().items()}
    with torch.no_grad():
        expected = getattr(model(**inputs), field)
        actual = getattr(torch.compile(model, backend="neuron")(**inputs), field)
    assert expected.abs().amax() > 1e-2 and expected.std() > 1e-3  # not vanished to a constant
    torch.testing.assert_close(actual, expected, **TOLERANCES[dtype])
    _assert_all_on_device()


@pytest.mark.parametrize("family", [f for f in FAMILIES if "moe" in f])
def test_bf16_expert_block_matches_eager(family: str, real_native: ModuleType) -> None:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FAMILIES[family][0]().eval().to(torch.bfloat16)
    block = model.model.layers[-1].mlp  # the routed experts (a dense first layer in DeepSeek)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = block(x)
        actual = torch.compile(block, backend="neuron")(x)
    expected, actual = (o[0] if isinstance(o, tuple) else o for o in (expected, actual))
    torch.testing.assert_close(actual, expected, **TOLERANCES[torch.bfloat16])
    _assert_all_on_device()


def test_moe_training_step_matches_eager(real_native: ModuleType) -> None:
    # The backward of Transformers' grouped-GEMM op (its own custom backward op) and of
    # the routing (sort, gathers, index_put) on the device too.
    torch.manual_seed(0)
    model = FAMILIES["mixtral_moe"][0]().train()
    twin = copy.deepcopy(model)
    ids = _ids()["input_ids"]
    expected = model(input_ids=ids, labels=ids).loss
    expected.backward()
    loss = torch.compile(twin, backend="neuron")(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
    _assert_all_on_device()


def test_generate_with_a_kv_cache_runs_no_eager_ops(real_native: ModuleType) -> None:
    torch.manual_seed(0)
    model = FAMILIES["llama"][0]().eval()
    ids = torch.randint(0, 256, (1, 10))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False)
        model.forward = torch.compile(model.forward, backend="neuron")
        actual = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(actual, expected)
    _assert_all_on_device()
