"""The eight models of tests/python/models.py through ``torch.compile(backend="neuron")``.

Each runs at two sizes (the second makes Dynamo recompile with symbolic sizes), compiled for trn2
and for trn3, on the built extension ``torchneuron._C`` (skipped until it is built) and is
compared with eager PyTorch; every op of every model must run on the device (no fallback).

Tolerances: float32 atol = rtol = 1e-4 (fp32 accumulation everywhere); bfloat16 atol = rtol =
2e-2 (about one bf16 ulp at the outputs' magnitude, which reach 4, plus rounding of
intermediates in a different order than the eager kernels).
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from models import MODELS, ModelCase, make_inputs, make_model

import torchneuron

TOLERANCES = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", MODELS, ids=[c.name for c in MODELS])
def test_model_matches_eager(
    case: ModelCase, dtype: torch.dtype, target: str, real_native: ModuleType
) -> None:
    # trn3's kernels are tiled and allocated for its own engines and memories.
    model = make_model(case, dtype)
    compiled = torch.compile(model, backend="neuron", options={"target": target})
    with torch.no_grad():
        for size in (0, 1):
            inputs = make_inputs(case, size, dtype)
            torch.testing.assert_close(compiled(*inputs), model(*inputs), **TOLERANCES[dtype])
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}
    assert stats["kernels_run"] > 0
    assert stats["ops_on_device"] > 0


@pytest.mark.parametrize("case", MODELS, ids=[c.name for c in MODELS])
def test_default_backend_and_module_compile(case: ModelCase, real_native: ModuleType) -> None:
    model = make_model(case)
    previous = torch.compiler.get_default_backend()
    try:
        torch.compiler.set_default_backend("neuron")
        model.compile()
        with torch.no_grad():
            for size in (0, 1):
                inputs = make_inputs(case, size)
                torch.testing.assert_close(
                    model(*inputs), model._call_impl(*inputs), **TOLERANCES[torch.float32]
                )
    finally:
        torch.compiler.set_default_backend(previous)
    stats = torchneuron.stats()
    assert stats["kernels_run"] >= 2
    assert stats["ops_fallback"] == {}


def test_training_loop_with_a_smaller_last_batch(real_native: ModuleType) -> None:
    # Batches of 8, 8 and 5: the last one makes Dynamo hand over graphs with symbolic sizes,
    # which the backend specializes; every step matches eager training.
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    step = torch.compile(lambda x, y: torch.nn.functional.mse_loss(model(x), y), backend="neuron")
    for n in (8, 8, 5):
        x, y = torch.randn(n, 16), torch.randn(n, 4)
        loss = step(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = torch.nn.functional.mse_loss(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss, ref_loss, **TOLERANCES[torch.float32])
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOLERANCES[torch.float32])
    stats = torchneuron.stats()
    assert stats["kernels_run"] >= 6  # forward and backward of every step
    # With a symbolic batch size, mse_loss's mean divides by the element count as a float64
    # host scalar; the device has no float64, so exactly those scalar ops stay eager. The
    # optimizer step is eager too, counted once.
    host_scalar_ops = {
        "aten.scalar_tensor.default",
        "prims.convert_element_type.default",
        "aten.true_divide.Tensor",
    }
    assert stats["ops_fallback"].pop("optimizer.step (SGD)") == 1
    assert set(stats["ops_fallback"]) <= host_scalar_ops
