"""Eight small models written with plain torch.nn, for end-to-end tests of the backend.

Each :class:`ModelCase` builds its model in eval mode (deterministic weights) and gives example
inputs at two sizes, so a compiled model sees a shape change (Dynamo then recompiles with
symbolic sizes, which exercises the backend's specialization).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODELS", "ModelCase", "make_inputs", "make_model"]


class GeluMLP(nn.Module):
    def __init__(self, hidden: int = 32, inner: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, inner)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10, image: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool2 = nn.AvgPool2d(2)
        self.fc = nn.Linear(16 * (image // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(F.relu(self.bn1(self.conv1(x))))
        x = self.pool2(F.relu(self.bn2(self.conv2(x))))
        return self.fc(torch.flatten(x, 1))


class GPT2Block(nn.Module):
    """Token + position embeddings and one pre-norm transformer block, GPT-2 style."""

    def __init__(self, vocab: int = 64, hidden: int = 32, heads: int = 4, max_len: int = 32):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_len, hidden)
        self.drop = nn.Dropout(0.1)
        self.ln_1 = nn.LayerNorm(hidden)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.attn_drop = nn.Dropout(0.1)
        self.ln_2 = nn.LayerNorm(hidden)
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = nn.Linear(4 * hidden, hidden)
        self.ln_f = nn.LayerNorm(hidden)
        mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
        self.register_buffer("causal", mask.view(1, 1, max_len, max_len), persistent=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        scores = scores.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
        weights = self.attn_drop(F.softmax(scores, dim=-1))
        y = (weights @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.size(1), device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(positions))
        x = x + self.attention(self.ln_1(x))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return self.ln_f(x)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaDecoderLayer(nn.Module):
    """RMSNorm, rotary embeddings, grouped-query causal SDPA, SiLU-gated MLP."""

    def __init__(
        self, hidden: int = 64, heads: int = 4, kv_heads: int = 2, inner: int = 128
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.input_norm = RMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.post_norm = RMSNorm(hidden)
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotary(self, t: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(t, device=self.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.input_norm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(t, x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class BertEncoderLayer(nn.Module):
    """Post-norm encoder layer; the boolean padding mask becomes an additive attention mask."""

    def __init__(self, hidden: int = 32, heads: int = 4, inner: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, inner)
        self.output = nn.Linear(inner, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        return x.view(b, t, self.heads, c // self.heads).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        # padding_mask: [batch, seq], True where the token is padding.
        additive = torch.zeros(padding_mask.shape, dtype=x.dtype, device=x.device)
        additive = additive.masked_fill(padding_mask, torch.finfo(x.dtype).min)[:, None, None, :]
        q = self.split_heads(self.query(x))
        k = self.split_heads(self.key(x))
        v = self.split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1)) + additive
        probs = self.dropout(scores.softmax(dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).flatten(2)
        x = self.attn_norm(x + self.dropout(self.attn_out(context)))
        return self.out_norm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


class ViTEncoder(nn.Module):
    """Patch embedding (conv with stride = patch), cls token, one pre-norm encoder layer."""

    def __init__(
        self, hidden: int = 32, heads: int = 4, patch: int = 4, max_patches: int = 16
    ) -> None:
        super().__init__()
        self.heads = heads
        self.patch_embed = nn.Conv2d(3, hidden, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + max_patches, hidden) * 0.02)
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 2 * hidden)
        self.fc2 = nn.Linear(2 * hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        b, n, c = x.shape
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)
        x = x + self.pos_embed[:, : n + 1]
        qkv = self.qkv(self.norm1(x)).reshape(b, n + 1, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n + 1, c))
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return self.norm(x)[:, 0]


class RobertaEmbeddings(nn.Module):
    """Hugging Face's RoBERTa embeddings: position ids from the padding mask by ``cumsum``
    (``create_position_ids_from_input_ids``), token types gathered from a buffer by position
    (``torch.gather``, as BertEmbeddings does without token_type_ids), then LayerNorm."""

    def __init__(self, vocab: int = 64, hidden: int = 32, max_positions: int = 40) -> None:
        super().__init__()
        self.padding_idx = 1
        self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=self.padding_idx)
        self.position_embeddings = nn.Embedding(max_positions, hidden, padding_idx=1)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.register_buffer(
            "token_type_ids", (torch.arange(max_positions) % 2)[None, :], persistent=False
        )
        self.norm = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = input_ids.ne(self.padding_idx).int()
        incremental_indices = torch.cumsum(mask, dim=1).type_as(mask) * mask
        position_ids = incremental_indices.long() + self.padding_idx
        buffered = self.token_type_ids.expand(position_ids.shape[0], -1)
        token_type_ids = torch.gather(buffered, dim=1, index=position_ids)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.norm(x + self.position_embeddings(position_ids))


class SparseMoeBlock(nn.Module):
    """A Mixtral-style MoE layer with static shapes: the router's softmax in float32, top-2 of
    8 experts, renormalized weights; tokens sorted by expert (``argsort``) and gathered
    (``hidden[token]``, advanced indexing), each row through its expert's gated MLP (expert
    weights gathered per row), scaled by its routing weight and summed back per token
    (``index_add_``, as Mixtral's experts loop does)."""

    def __init__(self, hidden: int = 32, inner: int = 48, experts: int = 8, top_k: int = 2):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.w_gate = nn.Parameter(torch.randn(experts, hidden, inner) / math.sqrt(hidden))
        self.w_up = nn.Parameter(torch.randn(experts, hidden, inner) / math.sqrt(hidden))
        self.w_down = nn.Parameter(torch.randn(experts, inner, hidden) / math.sqrt(inner))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, t, c = hidden_states.shape
        x = hidden_states.view(-1, c)
        router_logits = self.gate(x)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(x.dtype)
        flat_experts = selected_experts.reshape(-1)
        order = torch.argsort(flat_experts, stable=True)
        token = order // self.top_k
        expert = flat_experts[order]
        rows = x[token].unsqueeze(1)
        h = F.silu(rows @ self.w_gate[expert]) * (rows @ self.w_up[expert])
        out = (h @ self.w_down[expert]).squeeze(1) * routing_weights.reshape(-1)[order, None]
        final = torch.zeros_like(x)
        final.index_add_(0, token, out)
        return final.view(b, t, c)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: 7x7 depthwise convolution, LayerNorm over channels (channels last),
    pointwise MLP (Linear, GELU, Linear), layer scale, residual."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(0.5 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class Wav2Vec2FeatureEncoder(nn.Module):
    """wav2vec2's convolutional front end, small: stacked strided Conv1d without bias, group
    norm (one group per channel) after the first, GELU after each; then its positional
    convolution, grouped, under weight norm over the kernel dim, one trailing step cut
    (even kernel), GELU, added back."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.convs = nn.ModuleList(
            [
                nn.Conv1d(1, dim, 10, stride=5, bias=False),
                nn.Conv1d(dim, dim, 3, stride=2, bias=False),
                nn.Conv1d(dim, dim, 2, stride=2, bias=False),
            ]
        )
        self.norm = nn.GroupNorm(dim, dim)
        self.pos_conv = nn.utils.parametrizations.weight_norm(
            nn.Conv1d(dim, dim, 4, padding=2, groups=4), dim=2
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x)
            x = F.gelu(self.norm(x) if i == 0 else x)
        return x + F.gelu(self.pos_conv(x)[..., :-1])


@dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[], nn.Module]
    # size index (0 or 1) and a generator -> example inputs; floating inputs are float32
    inputs: Callable[[int, torch.Generator], tuple[torch.Tensor, ...]]


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _bert_inputs(size: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    batch, seq = ((2, 8), (3, 12))[size]
    lengths = torch.randint(1, seq + 1, (batch,), generator=g)
    lengths[0] = seq  # one full row, the others padded
    padding = torch.arange(seq)[None, :] >= lengths[:, None]
    return _randn(g, batch, seq, 32), padding


def _roberta_inputs(size: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    batch, seq = ((2, 10), (3, 16))[size]
    ids = torch.randint(2, 64, (batch, seq), generator=g)
    ids[1:, seq // 2 :] = 1  # right padding (padding_idx 1) after the first row
    return (ids,)


MODELS: tuple[ModelCase, ...] = (
    ModelCase("gelu_mlp", GeluMLP, lambda s, g: (_randn(g, *((2, 8, 32), (3, 12, 32))[s]),)),
    ModelCase("small_cnn", SmallCNN, lambda s, g: (_randn(g, (2, 5)[s], 3, 16, 16),)),
    ModelCase(
        "gpt2_block",
        GPT2Block,
        lambda s, g: (torch.randint(0, 64, ((2, 8), (3, 16))[s], generator=g),),
    ),
    ModelCase(
        "llama_layer", LlamaDecoderLayer, lambda s, g: (_randn(g, (2, 1)[s], (8, 16)[s], 64),)
    ),
    ModelCase("bert_layer", BertEncoderLayer, _bert_inputs),
    ModelCase(
        "vit_encoder", ViTEncoder, lambda s, g: (_randn(g, (2, 3)[s], 3, *((12, 12), (16, 16))[s]),)
    ),
    ModelCase("roberta_embeddings", RobertaEmbeddings, _roberta_inputs),
    ModelCase("convnext_block", ConvNeXtBlock, lambda s, g: (_randn(g, (2, 3)[s], 16, 9, 9),)),
    ModelCase(
        "wav2vec2_features",
        Wav2Vec2FeatureEncoder,
        lambda s, g: (_randn(g, (2, 3)[s], 1, (160, 200)[s]),),
    ),
    ModelCase("sparse_moe", SparseMoeBlock, lambda s, g: (_randn(g, (2, 3)[s], (8, 12)[s], 32),)),
)


def _init_weights(model: nn.Module, seed: int) -> None:
    """Non-trivial biases, norm weights and batch-norm statistics, so every op matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "bias", None)
            if isinstance(bias, nn.Parameter):
                bias.copy_(0.1 * torch.randn(bias.shape, generator=g))
            if isinstance(module, (nn.LayerNorm, nn.BatchNorm2d, RMSNorm)):
                module.weight.copy_(1.0 + 0.1 * torch.randn(module.weight.shape, generator=g))
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(0.1 * torch.randn(module.num_features, generator=g))
                module.running_var.copy_(1.0 + 0.2 * torch.rand(module.num_features, generator=g))


def make_model(case: ModelCase, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = case.build()
    _init_weights(model, seed=1)
    return model.eval().to(dtype)


def make_inputs(
    case: ModelCase, size: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(100 + size)
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in case.inputs(size, g))
