"""PyTorch's device-generic OpInfo tests, instantiated for the ``neuron`` device.

``torch.testing._internal``'s ``instantiate_device_type_tests`` makes ``TestNeuronOpInfo`` a
``neuron`` test class (PyTorch's ``PrivateUse1TestBase``), and ``@ops`` runs each test once per
OpInfo entry of PyTorch's own database, with that op's own sample inputs on the device: the
same machinery and samples PyTorch's ``test_ops.py`` uses for CUDA. Each sample is compared with
the op on CPU copies of its inputs (forward, and the gradients of every floating input), and
the ops listed here must run as device kernels: no CPU fallback (except for samples with empty
tensors, which the compiler builds no kernels for: the counted CPU fallback computes those).

The list is the float32 ops whose every sample runs on the device today (ops that draw random
numbers are elsewhere: their numbers are the device's Philox ones, not the CPU's); ops outside
it still work on neuron tensors through the counted CPU fallback (``test_device.py``).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

import torchneuron
from torchneuron import device as neuron_device
from torchneuron import eager

neuron_device.register()

pytestmark = pytest.mark.filterwarnings("ignore:neuron.*runs as a CPU fallback:UserWarning")

#: OpInfo names (with variant after a dot) that run on the device, forward only.
FORWARD = {
    "abs", "add", "addmm", "addr", "amax", "amin", "baddbmm", "bmm", "cat", "ceil", "clamp_max",
    "clamp_min", "cos", "dot", "einsum", "eq", "erf", "exp", "exp2", "expm1", "floor", "frac",
    "ge", "gt", "hstack", "isfinite", "isnan", "kron", "le", "lerp", "log", "log1p",
    "log_softmax", "logaddexp", "logical_and", "logical_not", "logsumexp", "lt", "masked_fill",
    "maximum", "mean", "minimum", "mm", "mul", "ne", "neg", "nn.functional.celu",
    "nn.functional.elu", "nn.functional.gelu", "nn.functional.glu", "nn.functional.group_norm",
    "nn.functional.hardsigmoid", "nn.functional.hardswish", "nn.functional.hardtanh",
    "nn.functional.huber_loss", "nn.functional.kl_div", "nn.functional.l1_loss",
    "nn.functional.layer_norm", "nn.functional.leaky_relu", "nn.functional.linear",
    "nn.functional.logsigmoid", "nn.functional.mish", "nn.functional.mse_loss",
    "nn.functional.relu", "nn.functional.relu6", "nn.functional.rms_norm",
    "nn.functional.selu", "nn.functional.silu", "nn.functional.smooth_l1_loss",
    "nn.functional.softplus", "nn.functional.softsign", "nn.functional.tanhshrink", "outer",
    "pow", "prod", "reciprocal", "roll", "round", "rsqrt", "rsub", "sigmoid", "sign", "sin",
    "softmax", "sqrt", "square", "stack", "std", "sub", "sum", "tanh", "tril", "triu", "trunc",
    "var", "vstack", "where", "xlogy",
}  # fmt: skip

#: Of those, the ops whose gradients are checked too (a backward the device runs).
GRADIENTS = {
    "add", "addmm", "amax", "bmm", "cat", "exp", "log_softmax", "mean", "mm", "mul",
    "nn.functional.gelu", "nn.functional.layer_norm", "nn.functional.linear",
    "nn.functional.mse_loss", "nn.functional.relu", "nn.functional.rms_norm",
    "nn.functional.silu", "sigmoid", "softmax", "sqrt", "stack", "sub", "sum", "tanh", "where",
}  # fmt: skip


def _name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


FORWARD_OPS = [op for op in op_db if _name(op) in FORWARD]
GRADIENT_OPS = [op for op in op_db if _name(op) in GRADIENTS]
SAMPLES = 3  # per op: the first ones cover the usual shapes, broadcasting and 0-d


def _cpu(x: Any) -> Any:
    return x.detach().cpu().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def _inputs(sample: Any) -> list[torch.Tensor]:
    leaves = [sample.input, *sample.args, *sample.kwargs.values()]
    return [t for t in _tensors(leaves) if t.requires_grad]


class TestNeuronOpInfo(TestCase):
    def _compare(self, op: Any, sample: Any, gradients: bool) -> None:
        cpu = sample.transform(_cpu)
        out = op(sample.input, *sample.args, **sample.kwargs)
        ref = op(cpu.input, *cpu.args, **cpu.kwargs)
        self.assertEqual(out, ref, exact_device=False, atol=1e-3, rtol=1e-3)
        if not gradients:
            return
        outs = [t for t in _tensors(out) if t.requires_grad]
        refs = [t for t in _tensors(ref) if t.requires_grad]
        wrt, wrt_cpu = _inputs(sample), _inputs(cpu)
        if not outs or not wrt:
            return
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(r.shape, generator=gen) for r in refs]
        loss = sum((o * w.to(o.device)).sum() for o, w in zip(outs, weights, strict=True))
        loss_cpu = sum((r * w).sum() for r, w in zip(refs, weights, strict=True))
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        grads_cpu = torch.autograd.grad(loss_cpu, wrt_cpu, allow_unused=True)
        for g, g_cpu in zip(grads, grads_cpu, strict=True):
            if g_cpu is None:
                continue
            self.assertEqual(g.device.type, "neuron")
            self.assertEqual(g, g_cpu, exact_device=False, atol=1e-3, rtol=1e-3)

    def _run(self, op: Any, dtype: torch.dtype, device: str, gradients: bool) -> None:
        samples = list(itertools.islice(op.sample_inputs(device, dtype, gradients), SAMPLES))
        runs = 0
        for sample in samples:
            torchneuron.reset_stats()  # what making the samples ran does not count
            self._compare(op, sample, gradients)
            stats = torchneuron.stats()
            runs += stats["kernels_run"]
            # Empty tensors are the CPU fallback's (counted): no zero-size kernels.
            if all(t.numel() for t in _tensors([sample.input, *sample.args])):
                self.assertEqual(stats["ops_fallback"], {}, str(eager.rejected()))
        self.assertGreater(runs, 0)

    @ops(FORWARD_OPS, allowed_dtypes=(torch.float32,))
    def test_forward_matches_cpu_on_the_device(
        self, device: str, dtype: torch.dtype, op: Any
    ) -> None:
        self._run(op, dtype, device, gradients=False)

    @ops(GRADIENT_OPS, allowed_dtypes=(torch.float32,))
    def test_gradients_match_cpu_on_the_device(
        self, device: str, dtype: torch.dtype, op: Any
    ) -> None:
        self._run(op, dtype, device, gradients=True)


instantiate_device_type_tests(TestNeuronOpInfo, globals(), only_for="neuron")


def test_every_listed_op_is_in_pytorchs_database() -> None:
    names = {_name(op) for op in op_db}
    assert FORWARD - names == set() and GRADIENTS - FORWARD == set()
    assert "TestNeuronOpInfoPRIVATEUSE1" in globals()  # instantiated for the neuron device
