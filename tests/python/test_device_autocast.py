"""``torch.autocast("neuron")`` (runtime/device/Autocast.cpp): PyTorch's CUDA policy lists on
the neuron device (lower precision for matmuls, convolutions and linear layers; float32 for
softmax, norms, reductions and losses; promotion for mixed-dtype ops), bfloat16 by default,
nesting and disabled regions, an autocast training step against CPU autocast, and
``torch.amp.GradScaler("neuron")``."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron import device as neuron_device

neuron_device.register()

pytestmark = pytest.mark.filterwarnings("ignore:neuron.*runs as a CPU fallback:UserWarning")

LOW = (torch.bfloat16, torch.float16)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)))


def _on_neuron(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to("neuron") for t in tensors]


def test_default_dtype_is_bfloat16_and_both_low_dtypes_are_supported() -> None:
    assert torch.get_autocast_dtype("neuron") == torch.bfloat16
    assert torch.amp.is_autocast_available("neuron")
    assert torch.neuron.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    a, b = _on_neuron(_randn(4, 8), _randn(8, 3))
    with torch.autocast("neuron"):
        assert torch.is_autocast_enabled("neuron")
        assert (a @ b).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("neuron")


def test_the_default_is_per_thread_as_in_pytorch() -> None:
    # PyTorch keeps autocast dtypes per thread; the device sets bfloat16 on the thread that
    # loaded it (this one), a new thread starts at PyTorch's float16 default.
    seen: list[torch.dtype] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_autocast_dtype("neuron")))
    thread.start()
    thread.join()
    assert seen == [torch.float16]


def test_every_op_cuda_autocasts_has_a_neuron_policy() -> None:
    # CUDA's registrations are the reference list (convolutions included: they have a policy
    # here, though convolution itself has no neuron kernel yet); only the cuDNN ops are CUDA's.
    names = torch._C._dispatch_get_all_op_names()

    def registered(key: str) -> set[str]:
        return {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, key)}

    cuda, neuron = registered("AutocastCUDA"), registered("AutocastPrivateUse1")
    assert cuda - neuron == {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose"}
    assert neuron - cuda == set()
    assert {"aten::conv2d", "aten::mm", "aten::softmax.int", "aten::mse_loss"} <= neuron


# (name, op, inputs) of ops CUDA autocast runs in the lower precision.
LOWERED: list[tuple[str, Callable[..., torch.Tensor], list[tuple[int, ...]]]] = [
    ("mm", torch.mm, [(4, 8), (8, 3)]),
    ("matmul", torch.matmul, [(2, 4, 8), (8, 3)]),
    ("linear", lambda x, w, b: F.linear(x, w, b), [(4, 8), (3, 8), (3,)]),
    ("bmm", torch.bmm, [(2, 4, 8), (2, 8, 3)]),
    ("addmm", torch.addmm, [(4, 3), (4, 8), (8, 3)]),
    ("baddbmm", torch.baddbmm, [(2, 4, 3), (2, 4, 8), (2, 8, 3)]),
    ("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), [(4, 8), (8, 3)]),
]

# Ops CUDA autocast runs in float32 whatever their inputs' dtype.
FP32: list[tuple[str, Callable[..., torch.Tensor], list[tuple[int, ...]]]] = [
    ("softmax", lambda x: torch.softmax(x, -1), [(4, 8)]),
    ("log_softmax", lambda x: F.log_softmax(x, -1), [(4, 8)]),
    ("layer_norm", lambda x: F.layer_norm(x, (8,)), [(4, 8)]),
    ("sum", torch.sum, [(4, 8)]),
    ("exp", torch.exp, [(4, 8)]),
    ("mse_loss", F.mse_loss, [(4, 8), (4, 8)]),
    (
        "cross_entropy",
        lambda x: F.cross_entropy(x, torch.zeros(4, dtype=torch.long, device=x.device)),
        [(4, 8)],
    ),
]


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name,op,shapes", LOWERED, ids=[c[0] for c in LOWERED])
def test_matmuls_and_convolutions_run_in_the_autocast_dtype(
    name: str, op: Callable[..., torch.Tensor], shapes: list[tuple[int, ...]], dtype: torch.dtype
) -> None:
    cpu = [_randn(*s) for s in shapes]
    with torch.autocast("neuron", dtype=dtype):
        out = op(*_on_neuron(*cpu))
    assert out.device.type == "neuron" and out.dtype == dtype
    # The same op on inputs cast by hand: autocast only casts.
    expected = op(*[t.to(dtype) for t in cpu]).float()
    torch.testing.assert_close(out.cpu().float(), expected, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name,op,shapes", FP32, ids=[c[0] for c in FP32])
def test_softmax_norms_reductions_and_losses_run_in_float32(
    name: str, op: Callable[..., torch.Tensor], shapes: list[tuple[int, ...]], dtype: torch.dtype
) -> None:
    low = [t.to(dtype) for t in _on_neuron(*[_randn(*s) for s in shapes])]
    with torch.autocast("neuron", dtype=dtype):
        out = op(*low)
    assert out.device.type == "neuron" and out.dtype == torch.float32


def test_mixed_dtype_ops_promote_and_ops_without_a_policy_keep_their_dtype() -> None:
    a32, b16, c16 = _on_neuron(_randn(4, 8), _randn(4, 8, seed=1), _randn(4, 8, seed=2))
    b16, c16 = b16.bfloat16(), c16.bfloat16()
    with torch.autocast("neuron"):
        assert torch.addcmul(a32, b16, c16).dtype == torch.float32  # promote
        assert torch.relu(b16).dtype == torch.bfloat16  # no policy: unchanged
        assert (a32 + 1).dtype == torch.float32
        assert torch.relu(a32).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_cuda() -> None:
    p, t = _on_neuron(torch.rand(4), torch.rand(4))
    with torch.autocast("neuron"), pytest.raises(RuntimeError, match="with_logits"):
        F.binary_cross_entropy(p, t)
    with torch.autocast("neuron"):
        assert F.binary_cross_entropy_with_logits(p, t).dtype == torch.float32


def test_nested_and_disabled_regions() -> None:
    a, b = _on_neuron(_randn(4, 8), _randn(8, 3))
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
        with torch.autocast("neuron", enabled=False):
            assert (a @ b).dtype == torch.float32
            with torch.autocast("neuron", dtype=torch.float16):
                assert (a @ b).dtype == torch.float16
            assert (a @ b).dtype == torch.float32
        with torch.autocast("neuron", dtype=torch.float16):
            assert (a @ b).dtype == torch.float16
        assert (a @ b).dtype == torch.bfloat16
        # A CPU region does not change what neuron tensors do, and the other way round.
        with torch.autocast("cpu", enabled=False):
            assert (a @ b).dtype == torch.bfloat16
        assert (a.cpu() @ b.cpu()).dtype == torch.float32
    assert (a @ b).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.float32


def test_gradients_reach_float32_parameters() -> None:
    w = torch.nn.Parameter(_randn(8, 3).to("neuron"))
    x = _randn(4, 8).to("neuron")
    with torch.autocast("neuron"):
        y = x @ w
        loss = y.float().pow(2).mean()
    assert y.dtype == torch.bfloat16
    loss.backward()
    assert w.grad is not None and w.grad.dtype == torch.float32
    # The same computation on the CPU, cast by hand.
    wc = _randn(8, 3).requires_grad_()
    (_randn(4, 8).bfloat16() @ wc.bfloat16()).float().pow(2).mean().backward()
    assert wc.grad is not None
    torch.testing.assert_close(w.grad.cpu(), wc.grad, atol=2e-2, rtol=2e-2)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 32),
        torch.nn.GELU(),
        torch.nn.Linear(32, 4),
    )


def test_autocast_training_step_matches_cpu_autocast() -> None:
    cpu_model = _mlp()
    dev_model = copy.deepcopy(cpu_model).to("neuron")
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        losses = []
        for model, opt, dev in ((cpu_model, cpu_opt, "cpu"), (dev_model, dev_opt, "neuron")):
            with torch.autocast(dev, dtype=torch.bfloat16):
                logits = model(x.to(dev))
                loss = F.cross_entropy(logits, y.to(dev))
            assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=2e-2, abs=2e-2)
    for pc, pd in zip(cpu_model.parameters(), dev_model.parameters(), strict=True):
        assert pd.dtype == torch.float32
        torch.testing.assert_close(pd.cpu(), pc, atol=2e-2, rtol=2e-2)
    # The lowered matmuls ran as device kernels, not on the CPU.
    fallbacks = torchneuron.stats()["ops_fallback"]
    assert not any(k.startswith(("aten.addmm", "aten.mm", "aten.linear")) for k in fallbacks)


def test_grad_scaler_scales_unscales_and_skips_steps_with_inf_gradients() -> None:
    model = _mlp().to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron", init_scale=2.0**10, growth_interval=1)
    x = _randn(8, 16).to("neuron")
    with torch.autocast("neuron"):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    before = [p.detach().clone() for p in model.parameters()]
    scaler.unscale_(opt)
    for p, g in zip(model.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad.cpu(), g.cpu() / 2.0**10)  # type: ignore[union-attr]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**11  # a finite step grows the scale
    assert any(
        not torch.equal(p.cpu(), b.cpu()) for p, b in zip(model.parameters(), before, strict=True)
    )

    # An inf gradient: the step is skipped and the scale backs off.
    opt.zero_grad()
    with torch.autocast("neuron"):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    next(iter(model.parameters())).grad[0, 0] = float("inf")  # type: ignore[index]
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**10
    assert all(
        torch.equal(p.cpu(), b.cpu()) for p, b in zip(model.parameters(), before, strict=True)
    )
    # The two scaler ops run on the device; the scale's float64 reciprocal is the counted
    # CPU fallback.
    fallbacks = torchneuron.stats()["ops_fallback"]
    assert set(fallbacks) <= {"aten.reciprocal.out (eager)"}, fallbacks
