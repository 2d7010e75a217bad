"""A Linear's bias and the activation after it applied as the matmul's sums leave PSUM
(``neuron.matmul`` with ``bias`` and ``epilogue``, folded in by canonicalization): golden
checks against eager PyTorch and the HBM bytes (no pass of their own over the result)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron


def profiled(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Any, Any]:
    torch._dynamo.reset()
    with torch.no_grad(), torchneuron.profile() as prof:
        out = torch.compile(fn, backend="neuron")(*args)
    return out, prof


def moved_bytes(prof: Any) -> float:
    return sum(k["hbm_bytes"] for k in prof.kernels)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda y: y,
    "gelu": F.gelu,  # BERT's, ViT's
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),  # GPT-2's gelu_new
    "relu": torch.relu,
    "silu": F.silu,  # written x * sigmoid(x) on the widened sums, cast back
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matches_eager(act: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(96, 200).to(dtype)
    x = torch.randn(2, 150, 96, generator=g).to(dtype)  # [B, S, K]: rows through a reshape

    def fn(x: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[act](lin(x))

    got, prof = profiled(fn, x)
    with torch.no_grad():
        want = fn(x)
    # bf16: eager rounds the sums before the activation, the epilogue after it (within an ulp)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(got, want, **tol)
    # The bytes of the matmul alone, and the bias broadcast over the partitions once (128
    # copies): a pass of its own over the result read and wrote it again.
    _, bare = profiled(lambda x: F.linear(x, lin.weight), x)
    extra = moved_bytes(prof) - moved_bytes(bare)
    assert extra <= 128 * lin.bias.numel() * x.element_size(), extra / want.numel()
    assert torchneuron.stats()["ops_fallback"] == {}


def test_bert_mlp_up_projection() -> None:
    # [4096, 768] x [768, 3072] + bias, GELU (BERT-base's intermediate layer), bf16: the bias
    # add and GELU were a pass of their own over the 25 MB result (398.7 us modeled, trn2);
    # applied on the eviction: 260.6 us, the matmul alone 254.4 us (283.2 us while each block
    # loaded the bias broadcast from HBM).
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(768, 3072).bfloat16()
    x = torch.randn(4096, 768, generator=g).bfloat16()
    got, prof = profiled(lambda x: F.gelu(lin(x)), x)
    with torch.no_grad():
        torch.testing.assert_close(got, F.gelu(lin(x)), atol=2e-2, rtol=2e-2)
    _, bare = profiled(lambda x: F.linear(x, lin.weight), x)
    assert prof.total_device_ns <= 1.05 * bare.total_device_ns, (
        prof.total_device_ns,
        bare.total_device_ns,
    )


def test_sums_read_elsewhere_keep_their_pass() -> None:
    # The sums also returned (as a training forward saves them): the bias and activation
    # stay elementwise, the sums stored as they are.
    lin = nn.Linear(64, 32)
    x = torch.randn(8, 64)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ lin.weight.t()
        return y, torch.relu(y + lin.bias)

    got, _ = profiled(fn, x)
    with torch.no_grad():
        for a, b in zip(got, fn(x), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_training_gradients() -> None:
    # Training keeps the sums for the backward (GELU's derivative reads them): results and
    # gradients as eager's.
    torch.manual_seed(0)
    lin, ref = nn.Linear(48, 40), nn.Linear(48, 40)
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(16, 48)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    torch._dynamo.reset()
    torch.compile(lambda x: F.gelu(lin(x)), backend="neuron")(xs[0]).square().sum().backward()
    F.gelu(ref(xs[1])).square().sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, atol=1e-4, rtol=1e-4)
    for p, q in zip(lin.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
