"""NKI kernels as PyTorch operators, so that ``torch.compile`` graphs can hold kernel calls
(outside the ``nki`` package: the backend recognises the operators without importing the
kernel language).

Each ``@nki.jit`` kernel called while Dynamo traces becomes one custom operator,
``torchneuron_nki::<kernel name>``, taking the kernel's tensors, its launch grid, the numbers
among its other arguments (int and float lists: symbolic under ``dynamic=True``) and the rest
of them written as a Python literal. The operator's fake implementation traces the kernel to
learn its outputs; its real implementation runs the kernel's program on the engine model (the
same program an eager call runs). The backend leaves these calls between its compiled regions
and counts them as device work (:func:`torchneuron.partition.partition_graph`).

Autograd is PyTorch's own: a ``torch.autograd.Function`` whose ``forward`` and ``backward``
call kernels works eagerly and compiled, as it would with CUDA kernels.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchneuron.nki import Kernel

__all__ = ["NAMESPACE", "call", "define", "encodable", "is_kernel_op"]

NAMESPACE = "torchneuron_nki"

_names: set[str] = set()  # operator names taken in this process


def is_kernel_op(target: object) -> bool:
    """Whether an FX node target is an NKI kernel call."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace == NAMESPACE


def encodable(value: object) -> bool:
    """Whether a non-tensor kernel argument can be an operator argument: numbers (which
    travel as the operator's int and float lists, symbolic under ``dynamic=True``),
    strings, booleans, None and tuples or lists of them (written into a Python literal)."""
    if isinstance(value, (tuple, list)):
        return all(encodable(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _encode(value: Any, ints: list[int], floats: list[float]) -> Any:
    """``value`` with its numbers moved into ``ints``/``floats`` and replaced by references."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        ints.append(value)
        return ("__int__", len(ints) - 1)
    if isinstance(value, float):
        floats.append(value)
        return ("__float__", len(floats) - 1)
    return tuple(_encode(v, ints, floats) for v in value)


def _resolve(value: Any, ints: Sequence[int], floats: Sequence[float]) -> Any:
    if isinstance(value, tuple):
        if len(value) == 2 and value[0] == "__int__":
            return int(ints[value[1]])  # a symbolic size is specialized: kernels trace per value
        if len(value) == 2 and value[0] == "__float__":
            return float(floats[value[1]])
        return tuple(_resolve(v, ints, floats) for v in value)
    return value


def call(kernel: Kernel, grid: tuple[int, ...], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``kernel[grid](*args, **kwargs)`` through the kernel's operator (traceable by Dynamo)."""
    arrays = [a for a in args if isinstance(a, torch.Tensor)]
    ints: list[int] = []
    floats: list[float] = []
    statics = repr(
        (
            tuple(
                (i, _encode(a, ints, floats))
                for i, a in enumerate(args)
                if not isinstance(a, torch.Tensor)
            ),
            tuple((k, _encode(v, ints, floats)) for k, v in sorted(kwargs.items())),
        )
    )
    outputs = kernel._torch_op(arrays, list(grid), ints, floats, statics)
    if len(outputs) == 1 and not kernel._returns_tuple:
        return outputs[0]
    return tuple(outputs)


def _decode(
    arrays: Sequence[torch.Tensor], ints: Sequence[int], floats: Sequence[float], statics: str
) -> tuple[list[Any], dict[str, Any]]:
    positions, kwargs = ast.literal_eval(statics)
    fixed = {i: _resolve(v, ints, floats) for i, v in positions}
    remaining = iter(arrays)
    args = [fixed[i] if i in fixed else next(remaining) for i in range(len(arrays) + len(fixed))]
    return args, {k: _resolve(v, ints, floats) for k, v in kwargs}


def define(kernel: Kernel) -> Any:
    """The kernel's operator, ``torchneuron_nki::<kernel name>`` (numbered when the name is
    taken)."""
    base = re.sub(r"\W", "_", kernel.fn.__name__) or "kernel"
    name, n = base, 1
    while name in _names:
        n += 1
        name = f"{base}_{n}"
    _names.add(name)

    def traced(
        arrays: list[torch.Tensor],
        grid: list[int],
        ints: list[int],
        floats: list[float],
        statics: str,
    ) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        args, kwargs = _decode(arrays, ints, floats, statics)
        # Tracing makes the kernel's constants as real CPU tensors, even under fake tensors.
        with _disable_current_modes():
            result = kernel._traced(tuple(grid), args, kwargs)
        kernel._returns_tuple = result.returns_tuple
        return result

    def run(
        arrays: list[torch.Tensor],
        grid: list[int],
        ints: list[int],
        floats: list[float],
        statics: str,
    ) -> list[torch.Tensor]:
        result = traced(arrays, grid, ints, floats, statics)
        consts = [c.to(arrays[0].device) for c in result.constants] if arrays else []
        outputs = result.device_kernel()(*arrays, *consts)
        return list(outputs) if isinstance(outputs, tuple) else [outputs]

    def fake(
        arrays: list[torch.Tensor],
        grid: list[int],
        ints: list[int],
        floats: list[float],
        statics: str,
    ) -> list[torch.Tensor]:
        from torchneuron.fx_json import dtype_from_name

        result = traced(arrays, grid, ints, floats, statics)
        device = arrays[0].device if arrays else torch.device("cpu")
        return [
            torch.empty(shape, dtype=dtype_from_name(dtype), device=device)
            for dtype, shape in result.kernel.output_specs
        ]

    op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=())(run)
    op.register_fake(fake)
    return op
