"""The decomposition table the backend hands to ``aot_autograd``.

Core ATen keeps some composite ops whole (layer/group/batch norm, softmax). The ``neuron``
dialect has no such ops: it has their building blocks (reductions, ``var_mean``, elementwise
math, matmul), so these composites are decomposed in Python, where PyTorch already knows how,
instead of in the importer. Everything else follows ``core_aten_decompositions()``.

Kept whole on purpose (not decomposed):

- ``aten.var_mean.correction``: one VectorE pass (``bn_stats``/``bn_aggr``) gives both results.
- ``aten.gelu``, ``aten.sigmoid``, ``aten.tanh``: single ScalarE activation functions.
- ``aten.embedding``, ``aten.addmm``, ``aten.avg_pool2d``, ``aten.max_pool2d_with_indices``:
  core ops the importer lowers directly (gather, matmul + bias, pooling windows).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

__all__ = ["EXTRA_DECOMPOSITIONS", "math_attention", "neuron_decompositions"]

_aten = torch.ops.aten

# Each entry: (op, why it is decomposed). Some are already in core_aten_decompositions();
# they are listed so the table does not depend on what a given torch release puts there.
EXTRA_DECOMPOSITIONS: tuple[tuple[torch._ops.OpOverloadPacket, str], ...] = (
    (_aten.native_layer_norm, "var_mean + rsqrt + affine: norm building blocks"),
    (_aten.native_group_norm, "reshape + var_mean + affine: norm building blocks"),
    (_aten._native_batch_norm_legit_no_training, "eval batch norm is elementwise"),
    (_aten._native_batch_norm_legit_functional, "training batch norm: reductions + math"),
    (_aten._native_batch_norm_legit, "training batch norm: reductions + math"),
    (_aten.native_batch_norm, "training batch norm: reductions + math"),
    (_aten._softmax, "amax/sub/exp/sum/div: the device's softmax building blocks"),
    (_aten._log_softmax, "amax/sub/exp/sum/log: the device's softmax building blocks"),
    (_aten.silu, "x * sigmoid(x)"),
    (_aten.hardswish, "clamp + mul"),
    (_aten.hardsigmoid, "clamp + mul"),
    (_aten.mish, "x * tanh(softplus(x))"),
    (_aten.addcmul, "elementwise mul + add"),
    (_aten.addcdiv, "elementwise div + add"),
    (_aten.lerp, "elementwise sub/mul/add"),
    # The CPU SDPA kernel, should a graph name it directly: torch's decomposition goes through
    # the math path. Graphs traced by the backend never contain it (see math_attention).
    (_aten._scaled_dot_product_flash_attention_for_cpu, "matmul + softmax + matmul"),
)


def math_attention() -> contextlib.AbstractContextManager[None]:
    """Context for tracing with ``aot_autograd``: SDPA takes its math path (matmul + softmax +
    matmul, with ``attn_mask``, ``is_causal`` and GQA) *before* autograd.

    On CPU the composite SDPA kernel otherwise picks
    ``_scaled_dot_product_flash_attention_for_cpu``. In a training graph that op is
    differentiated first and decomposed after, so the backward's
    ``_scaled_dot_product_flash_attention_for_cpu_backward`` reads the decomposition's
    attention weights as the flash kernel's logsumexp: wrong gradients. A decomposition-table
    entry for ``aten.scaled_dot_product_attention`` cannot fix this: composite ops decompose in
    C++ before the table is consulted. The backend choice can.

    The SDPA calls the FlexAttention kernels take are no longer SDPA when this applies
    (:mod:`torchneuron.sdpa`): the math path is for the calls they do not take.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


@functools.cache
def neuron_decompositions() -> dict[torch._ops.OperatorBase, Callable[..., object]]:
    """Core ATen decompositions plus :data:`EXTRA_DECOMPOSITIONS` (built once, then cached)."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table: dict[torch._ops.OperatorBase, Callable[..., object]] = dict(core_aten_decompositions())
    table.update(get_decompositions([op for op, _ in EXTRA_DECOMPOSITIONS]))
    missing = [
        str(op)
        for op, _ in EXTRA_DECOMPOSITIONS
        if not any(getattr(op, name) in table for name in op.overloads())  # type: ignore[no-untyped-call]
    ]
    if missing:
        raise RuntimeError(f"torch has no decomposition for {missing}; update decompositions.py")
    return table
