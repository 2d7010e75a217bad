"""Training on the device: backward graphs, dropout's random numbers, whole training loops.

- Gradient checks: every op with a backward lowering, compiled with ``backend="neuron"``, against
  eager PyTorch. float32: atol = rtol = 1e-4 (fp32 accumulation everywhere, sums in another
  order). bfloat16: against eager in float32 on the same bf16 inputs, atol = rtol = 4e-2 (a few
  bf16 ulps: the device rounds matmul results and intermediates to bf16 where eager's bf16
  kernels round at other points). Each asserts that the backward graph compiled and ran as
  device kernels with no fallback.
- Dropout: keep rate, determinism under ``torch.manual_seed``, gradient = mask * scale, and the
  device's numbers equal the CPU reference of ``torchneuron::philox_rand`` bit for bit.
- Training loops against eager, from the same seed and weights, loss compared at every step: a
  4-layer GPT-style model (causal SDPA, AdamW, 30 steps) in float32 (rtol 1e-4) and under
  ``torch.autocast("cpu", torch.bfloat16)`` with fp32 master weights (rtol 3e-2: bf16 matmul
  inputs, rounded in different places), and a small CNN (batch norm in training, max and
  average pooling, cross-entropy, 20 steps, rtol 1e-4).
- ``scripts/training_inventory.py``'s finding, that in training only the optimizer step falls
  back: each of its cases (the models of models.py and a conv net) trained one step.
"""

from __future__ import annotations

import copy
import ctypes
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import models
import pytest
import torch
import torch.nn.functional as F
from models import SmallCNN
from torch import nn

import torchneuron
from torchneuron import rng

F32 = {"atol": 1e-4, "rtol": 1e-4}
BF16 = {"atol": 4e-2, "rtol": 4e-2}


def _load_training_inventory() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "training_inventory.py"
    spec = importlib.util.spec_from_file_location("training_inventory", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRAINING_INVENTORY = _load_training_inventory()


def _leaves(inputs: tuple[object, ...], dtype: torch.dtype) -> list[object]:
    return [
        x.detach().to(dtype).requires_grad_()
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in inputs
    ]


def _grad_check(fn: Callable[..., torch.Tensor], *inputs: object, dtype: torch.dtype) -> None:
    """Gradients of ``fn`` compiled vs eager (eager in fp32 on the same rounded inputs)."""
    ours = _leaves(inputs, dtype)
    ref = [
        x.detach().float().requires_grad_()
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in ours
    ]
    out = torch.compile(fn, backend="neuron")(*ours)
    forward = torchneuron.stats()
    want = fn(*ref)
    tol = F32 if dtype == torch.float32 else BF16
    torch.testing.assert_close(out.float(), want, **tol)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(g.to(out.dtype))
    want.backward(g)
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}
    # The backward is its own graph, compiled and run on the device.
    assert stats["graphs_compiled"] > forward["graphs_compiled"]
    assert stats["kernels_run"] > forward["kernels_run"]
    checked = 0
    for a, b in zip(ours, ref, strict=True):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            assert a.grad is not None and a.grad.dtype == dtype
            torch.testing.assert_close(a.grad.float(), b.grad, **tol)
            checked += 1
    assert checked > 0


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CASES: list[tuple[str, Callable[..., torch.Tensor], Callable[[], tuple[object, ...]]]] = [
    (
        "conv2d_stride_pad_dilation",
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2),
        lambda: (_randn(2, 3, 9, 9), _randn(4, 3, 3, 3, seed=1) * 0.3, _randn(4, seed=2)),
    ),
    (
        "conv2d_same",
        lambda x, w: F.conv2d(x, w, padding=1),
        lambda: (_randn(2, 3, 8, 8), _randn(5, 3, 3, 3, seed=1) * 0.3),
    ),
    (
        "conv2d_patches",
        lambda x, w, b: F.conv2d(x, w, b, stride=4),
        lambda: (_randn(2, 3, 8, 8), _randn(6, 3, 4, 4, seed=1) * 0.2, _randn(6, seed=2)),
    ),
    # wav2vec2's feature encoder: 1-d, strided, dilated (as 2-d of unit height).
    (
        "conv1d_stride_pad_dilation",
        lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2),
        lambda: (_randn(2, 3, 20), _randn(4, 3, 3, seed=1) * 0.3, _randn(4, seed=2)),
    ),
    (
        "conv2d_grouped",
        lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2),
        lambda: (_randn(2, 4, 7, 7), _randn(6, 2, 3, 3, seed=1) * 0.3, _randn(6, seed=2)),
    ),
    # ConvNeXt's 7x7 depthwise convolution (VectorE multiply-accumulates).
    (
        "conv2d_depthwise",
        lambda x, w, b: F.conv2d(x, w, b, padding=3, groups=4),
        lambda: (_randn(2, 4, 9, 9), _randn(4, 1, 7, 7, seed=1) * 0.2, _randn(4, seed=2)),
    ),
    (
        "conv2d_depthwise_multiplier_stride",
        lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=3),
        lambda: (_randn(2, 3, 9, 9), _randn(6, 1, 3, 3, seed=1) * 0.3),
    ),
    (
        "conv1d_depthwise",
        lambda x, w: F.conv1d(x, w, padding=2, groups=4),
        lambda: (_randn(2, 4, 16), _randn(4, 1, 5, seed=1) * 0.3),
    ),
    (
        "conv_transpose2d",
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
        lambda: (_randn(2, 4, 5, 5), _randn(4, 3, 3, 3, seed=1) * 0.3, _randn(3, seed=2)),
    ),
    (
        "conv_transpose1d_grouped",
        lambda x, w: F.conv_transpose1d(x, w, stride=2, groups=2),
        lambda: (_randn(2, 4, 7), _randn(4, 3, 4, seed=1) * 0.3),
    ),
    # wav2vec2's positional convolution: weight norm over the kernel dim (dim=2).
    (
        "weight_norm_conv1d",
        lambda x, v, g: F.conv1d(x, torch._weight_norm(v, g, 2), padding=2, groups=2),
        lambda: (_randn(2, 4, 12), _randn(4, 2, 5, seed=1), 1 + 0.1 * _randn(1, 1, 5, seed=2)),
    ),
    ("avg_pool2d_padded", lambda x: F.avg_pool2d(x, 3, 2, 1), lambda: (_randn(2, 3, 9, 9),)),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 2), lambda: (_randn(2, 3, 8, 8),)),
    # After relu many windows hold several zero maxima: the first one gets the gradient.
    (
        "max_pool2d_ties",
        lambda x: F.max_pool2d(F.relu(x), 3, 2, 1),
        lambda: (_randn(2, 3, 9, 9),),
    ),
    (
        "max_pool2d_dilation",
        lambda x: F.max_pool2d(x, 2, 1, 0, dilation=2),
        lambda: (_randn(2, 2, 7, 7),),
    ),
    (
        "embedding_padding_idx",
        lambda w, i: F.embedding(i, w, padding_idx=3),
        lambda: (_randn(10, 8), torch.tensor([[1, 3, 3, 9], [0, 1, 1, 5]])),
    ),
    (
        "cross_entropy_ignore_index",
        lambda x, t: F.cross_entropy(x, t, ignore_index=2),
        lambda: (_randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 2])),
    ),
    ("mse_loss", lambda x, y: F.mse_loss(x, y), lambda: (_randn(4, 7), _randn(4, 7, seed=1))),
    (
        "gather",
        lambda x, i: torch.gather(x, 1, i) * 2,
        lambda: (_randn(3, 6), torch.tensor([[0, 5], [2, 2], [4, 1]])),
    ),
    ("slice", lambda x: x[:, 1:4] * 3, lambda: (_randn(3, 6),)),
    # Its backward accumulates rows with index_put(accumulate=True): a one-hot matmul.
    (
        "index_select",
        lambda x, i: torch.index_select(x, 0, i) * 2,
        lambda: (_randn(6, 5), torch.tensor([1, 1, 4, 0])),
    ),
    # Its backward builds full_like(empty_permuted(...)): the importer reads empty as zeros.
    (
        "addcdiv",
        lambda a, b, c: torch.addcdiv(a, b, c, value=0.5),
        lambda: (_randn(4, 5), _randn(4, 5, seed=1), 2 + _randn(4, 5, seed=2).abs()),
    ),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), lambda: (_randn(4, 32),)),
    ("gelu_silu", lambda x: F.gelu(x) * F.silu(x), lambda: (_randn(4, 32),)),
    ("relu_softmax", lambda x: F.softmax(F.relu(x), -1), lambda: (_randn(4, 32),)),
    (
        "layer_norm",
        lambda x, w, b: F.layer_norm(x, (32,), w, b),
        lambda: (_randn(4, 32), 1 + 0.1 * _randn(32, seed=1), _randn(32, seed=2)),
    ),
    (
        "batch_norm_training",
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        lambda: (_randn(4, 3, 5, 5), 1 + 0.1 * _randn(3, seed=1), _randn(3, seed=2)),
    ),
    (
        "group_norm",
        lambda x, w, b: F.group_norm(x, 2, w, b),
        lambda: (_randn(3, 4, 5, 5), 1 + 0.1 * _randn(4, seed=1), _randn(4, seed=2)),
    ),
    (
        "rms_norm",
        lambda x, w: w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
        lambda: (_randn(4, 32), 1 + 0.1 * _randn(32, seed=1)),
    ),
    ("log_softmax", lambda x: F.log_softmax(x, -1), lambda: (_randn(4, 32),)),
    (
        "activations",
        lambda x: (
            torch.sigmoid(x)
            + torch.tanh(x)
            + F.leaky_relu(x)
            + F.elu(x)
            + F.hardtanh(x)
            + F.hardswish(x)
            + F.mish(x)
        ),
        lambda: (_randn(4, 32),),
    ),
    (
        "linear",
        lambda x, w, b: F.linear(x, w, b),
        lambda: (_randn(5, 16), _randn(8, 16, seed=1) * 0.2, _randn(8, seed=2)),
    ),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients_match_eager(
    case: tuple[str, Callable[..., torch.Tensor], Callable[[], tuple[object, ...]]],
    dtype: torch.dtype,
    real_native: ModuleType,
) -> None:
    _, fn, inputs = case
    _grad_check(fn, *inputs(), dtype=dtype)


def test_large_embedding_gradient_is_a_scatter_add(real_native: ModuleType) -> None:
    """The gradient of a vocabulary-sized embedding adds each token's row into the table by
    indirect DMA (``dma_scatter`` with accumulate), rows in token order and rounded per add:
    bit-identical to eager's bf16 kernel, repeated tokens and ``padding_idx`` included. A
    one-hot matmul would cost 2 x tokens x vocab x hidden FLOPs (an output projection)."""
    vocab, hidden = 4096, 512
    w = (_randn(vocab, hidden) * 0.1).bfloat16().requires_grad_()
    ids = torch.randint(0, vocab, (2, 96), generator=torch.Generator().manual_seed(2))
    ids[0, ::5] = 7  # one token many times
    ids[1, ::3] = 3  # padding: no gradient
    ref = w.detach().clone().requires_grad_()

    def fn(table: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return F.embedding(i, table, padding_idx=3)

    g = _randn(2, 96, hidden, seed=4).bfloat16()
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        torch.compile(fn, backend="neuron")(w, ids).backward(g)
    fn(ref, ids).backward(g)
    assert w.grad is not None and ref.grad is not None
    assert torch.equal(w.grad, ref.grad)
    names = {n for r in prof._runs if r.kernel for n in r.kernel.instruction_names}
    assert "dma_scatter" in names and "matmul" not in names
    assert torchneuron.stats()["ops_fallback"] == {}


def test_unsupported_backward_is_a_counted_fallback(real_native: ModuleType) -> None:
    # 3-d transposed convolution's backward has no lowering (its forward is 2-d transposed
    # convolutions, decompositions.py): it stays eager, counted, and the gradients are right.
    x, w = _randn(2, 2, 4, 4, 4).requires_grad_(), _randn(2, 3, 3, 3, 3, seed=1).requires_grad_()
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    compiled = torch.compile(lambda x, w: F.conv_transpose3d(x, w).relu(), backend="neuron")
    compiled(x, w).sum().backward()
    F.conv_transpose3d(xr, wr).relu().sum().backward()
    fallback = torchneuron.stats()["ops_fallback"]
    assert "aten.convolution.default" not in fallback
    assert fallback["aten.convolution_backward.default"] == 1
    torch.testing.assert_close(x.grad, xr.grad, **F32)
    torch.testing.assert_close(w.grad, wr.grad, **F32)


def test_training_after_a_recompile_for_new_sizes(real_native: ModuleType) -> None:
    # The second size recompiles the graphs symbolically and the backend specializes them to
    # each call. The forward kernel returns contiguous tensors where the traced graph had
    # strided views, which the backward's specialization used to reject (the whole backward
    # then ran in eager and SDPA's backward op failed there).
    case = next(c for c in models.MODELS if c.name == "llama_layer")
    model = models.make_model(case).train()
    compiled = torch.compile(model, backend="neuron")
    for size in (0, 1):
        (x,) = models.make_inputs(case, size)
        ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        model.zero_grad()
        compiled(ours).sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(ref).sum().backward()
        torch.testing.assert_close(ours.grad, ref.grad, **F32)
        for a, p in zip(got, model.parameters(), strict=True):
            torch.testing.assert_close(a, p.grad, **F32)
    assert torchneuron.stats()["ops_fallback"] == {}


# -- dropout ---------------------------------------------------------------------------------


def _dropout(p: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return torch.compile(lambda x: F.dropout(x, p, training=True), backend="neuron")


def test_dropout_keep_rate_and_scale(real_native: ModuleType) -> None:
    p, n = 0.3, 256 * 400
    x = torch.ones(256, 400)
    torch.manual_seed(0)
    y = _dropout(p)(x)
    assert torchneuron.stats()["ops_fallback"] == {}
    kept = y != 0
    # Kept elements are scaled by 1 / (1 - p); the rate is within 6 standard deviations.
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    rate = kept.float().mean().item()
    assert abs(rate - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n)
    # No structure across rows or columns (a tiling or counter bug would show here).
    for dim in (0, 1):
        per_line = kept.float().mean(dim)
        assert per_line.std().item() < 3 * math.sqrt(p * (1 - p) / y.shape[dim])


def test_dropout_is_reproducible_under_manual_seed(real_native: ModuleType) -> None:
    f = _dropout(0.5)
    x = torch.randn(64, 96)
    torch.manual_seed(7)
    a, b = f(x), f(x)
    torch.manual_seed(7)
    c = f(x)
    assert torch.equal(a, c)  # same seed, same masks
    assert not torch.equal(a, b)  # every call draws a fresh seed
    torch.manual_seed(8)
    assert not torch.equal(f(x), a)


def test_dropout_gradient_is_mask_times_scale(real_native: ModuleType) -> None:
    p = 0.25
    x = torch.randn(32, 50, requires_grad=True)
    f = torch.compile(lambda x: F.dropout(x * 2.0, p, training=True), backend="neuron")
    y = f(x)
    g = torch.randn_like(y)
    y.backward(g)
    mask = y != 0  # x has no zeros
    assert 0 < mask.sum() < mask.numel()
    torch.testing.assert_close(x.grad, g * mask * (2.0 / (1 - p)))
    assert torchneuron.stats()["ops_fallback"] == {}


def test_device_random_numbers_equal_the_reference(real_native: ModuleType) -> None:
    # Ragged sizes (the lowering's short tiles) and two streams; bf16 is the fp32 value rounded.
    seed = torch.tensor([123, -456], dtype=torch.int32)

    def draw(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.ops.torchneuron.philox_rand(s, 0, [5, 301], torch.float32)
        b = torch.ops.torchneuron.philox_rand(s, 1, [3, 7], torch.bfloat16)
        return a, b

    a, b = torch.compile(draw, backend="neuron")(seed)
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {} and stats["kernels_run"] == 1
    want_a, want_b = draw(seed)
    assert torch.equal(a, want_a) and torch.equal(b, want_b)
    assert not torch.equal(a[0, :21].bfloat16(), b.flatten())  # streams differ
    assert 0.0 <= a.min().item() and a.max().item() < 1.0
    # Uniform: each tenth of [0, 1) holds about a tenth of 1505 numbers.
    counts = torch.histc(a, bins=10, min=0.0, max=1.0)
    assert counts.min().item() > 100 and counts.max().item() < 200
    # The reference is Philox4x32-10 (Random123's known answer for key 0, counter 0).
    assert rng.philox_uniform([0, 0], 0, 1).item() == (0x6627E8D5 >> 8) / 2**24


# -- training loops ----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyGPT(nn.Module):
    """4 pre-norm layers, causal attention, tied embeddings."""

    def __init__(self, vocab: int = 64, hidden: int = 32, heads: int = 4, layers: int = 4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(16, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _train(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, ...]],
    loss_of: Callable[..., torch.Tensor],
    autocast: bool,
) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for batch in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("autocast", [False, True], ids=["f32", "bf16_autocast"])
def test_gpt_trains_like_eager(autocast: bool, real_native: ModuleType) -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 64, (30, 4, 17), generator=g)
    batches = [(d[:, :-1], d[:, 1:]) for d in data]
    compiled = torch.compile(model, backend="neuron")
    ours = _train(model, batches, compiled, autocast)
    want = _train(reference, batches, reference, autocast)
    rtol = 3e-2 if autocast else 1e-4
    for step, (a, b) in enumerate(zip(ours, want, strict=True)):
        assert abs(a - b) <= rtol * abs(b), f"step {step}: {a} vs eager {b}"
    assert want[-1] < want[0] - 0.3  # it learns: the comparison is not between flat lines
    # Weights are not compared: a key bias has a zero gradient in exact arithmetic (softmax
    # ignores a shift of a row), so AdamW turns both runs' rounding noise there into steps of
    # about lr in unrelated directions. The losses show the models stay the same.
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    stats = torchneuron.stats()
    # Forward and backward ran as device kernels; only the optimizer step stayed eager.
    assert stats["ops_fallback"] == {"optimizer.step (AdamW)": 1}
    assert stats["kernels_run"] >= 60


def test_cnn_trains_like_eager(real_native: ModuleType) -> None:
    torch.manual_seed(0)
    model = SmallCNN().train()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(2)
    images = torch.randn(2, 8, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (2, 8), generator=g)
    batches = list(zip(images, labels, strict=True)) * 10  # 10 epochs: the loss must fall
    compiled = torch.compile(model, backend="neuron")

    def loss_of(net: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
        return lambda x, y: F.cross_entropy(net(x), y)

    ours = _train(model, batches, loss_of(compiled), autocast=False)
    want = _train(reference, batches, loss_of(reference), autocast=False)
    for step, (a, b) in enumerate(zip(ours, want, strict=True)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: {a} vs eager {b}"
    assert want[-1] < want[0] - 0.5
    # Batch-norm running statistics are updated by the device graph, as eager updates them.
    # (Not the running means: they include the conv biases, whose gradient is zero in exact
    # arithmetic under batch norm, so AdamW moves them by rounding noise, differently per run.)
    for ours_bn, eager_bn in ((model.bn1, reference.bn1), (model.bn2, reference.bn2)):
        torch.testing.assert_close(ours_bn.running_var, eager_bn.running_var, **F32)
        assert int(ours_bn.num_batches_tracked) == 20
    assert torchneuron.stats()["ops_fallback"] == {"optimizer.step (AdamW)": 1}


def _layer_norm_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 40), nn.GELU(), nn.LayerNorm(40), nn.Linear(40, 4))


def _run_placed(
    native: ModuleType, program: str, inputs: list[torch.Tensor], shift: int, filler: int
) -> list[torch.Tensor]:
    """Runs ``program`` on a new executor, built while ``filler`` small allocations are live (so
    its buffers land elsewhere on the heap), with every input and output ``shift`` floats past
    a 64-byte boundary (torch's CPU allocator aligns to 64 bytes)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    held = [libc.malloc(16 + 8 * i) for i in range(filler)]
    kernel = native.load_program(program)
    for p in held:
        libc.free(p)

    def placed(shape: list[int] | torch.Size) -> torch.Tensor:
        n = math.prod(shape)
        return torch.empty(n + 16)[shift : shift + n].view(shape)

    ins = [placed(t.shape).copy_(t) for t in inputs]
    outs = [placed(shape) for _, shape in kernel.output_specs]
    kernel.run(
        [(t.data_ptr(), "float32", list(t.shape)) for t in ins],
        [(t.data_ptr(), "float32", list(t.shape)) for t in outs],
    )
    return outs


def test_training_kernels_are_bit_reproducible(tmp_path: Path, real_native: ModuleType) -> None:
    """One program on the same inputs gives the same bits wherever its buffers live.

    Each compile builds a new executor, whose buffers and scratch land wherever the heap has
    room: vectorized kernels that peeled to the first 64-byte-aligned element made a training
    graph's LayerNorm statistics (and all that follows) differ by an ulp between compiles. Here
    each program of a forward and backward graph runs on executors built at other heap
    addresses, with the inputs and outputs at other offsets."""
    model = _layer_norm_mlp()
    compiled = torch.compile(model, backend="neuron", options={"dump_dir": str(tmp_path)})
    compiled(torch.randn(8, 16)).square().sum().backward()
    programs = sorted(tmp_path.glob("graph_*/06-program.json"))
    assert len(programs) == 2  # forward and backward
    gen = torch.Generator().manual_seed(3)
    for path in programs:
        program = path.read_text()
        specs = real_native.load_program(program)
        assert all(d == "float32" for d, _ in specs.input_specs + specs.output_specs)
        inputs = [torch.randn(shape, generator=gen) for _, shape in specs.input_specs]
        reference = _run_placed(real_native, program, inputs, 0, 0)
        for trial in range(1, 12):
            got = _run_placed(real_native, program, inputs, trial % 16, trial)
            for i, (a, b) in enumerate(zip(got, reference, strict=True)):
                assert torch.equal(a, b), f"{path.parent.name} output {i}, trial {trial}"


@pytest.mark.parametrize("name", TRAINING_INVENTORY.case_names())
def test_training_inventory_only_the_optimizer_step_falls_back(
    name: str, real_native: ModuleType
) -> None:
    """README (Training): scripts/training_inventory.py trains every test model and finds that
    only the optimizer step falls back. One step of each case, through the script's own code."""
    loss, stats = TRAINING_INVENTORY.train(name, steps=1)
    assert math.isfinite(loss)
    assert stats["ops_fallback"] == {"optimizer.step (AdamW)": 1}, stats["ops_fallback"]
    assert stats["graphs_compiled"] >= 2, stats  # a forward and a backward graph at least
    assert stats["kernels_run"] >= 2, stats
