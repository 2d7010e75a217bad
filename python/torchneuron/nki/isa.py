"""``torchneuron.nki.isa`` (``nisa``): NKI's engine instructions, tile-returning form.

Each call is one instruction on the engine NKI names (``nc_matmul``/``nc_transpose`` on TensorE,
``activation`` on ScalarE, ``tensor_tensor``/``tensor_scalar``/``tensor_reduce``/``tensor_copy``
on VectorE). The destination-passing form of newer NKI releases (``dst=``) is not supported yet.
"""

from __future__ import annotations

from typing import Any

from torchneuron.nki import _ir
from torchneuron.nki import language as nl
from torchneuron.nki._ir import Tensor, error


def _dst_form(kwargs: dict[str, Any], name: str) -> None:
    if "dst" in kwargs:
        raise error(f"nisa.{name}(dst=...) (the destination-passing form) is not supported yet")
    if kwargs.get("mask") is not None:
        raise error(f"nisa.{name}(mask=...) is not supported yet")


def _alu(op: Any, name: str) -> str:
    if op not in nl.ALU_OPS:
        raise error(f"nisa.{name}: op={getattr(op, '__name__', op)!r} is not an ALU operation")
    return nl.ALU_OPS[op]


def nc_matmul(stationary: Any, moving: Any, **kwargs: Any) -> Tensor:
    """``stationary.T @ moving`` on TensorE into a new PSUM tile (fp32)."""
    _dst_form(kwargs, "nc_matmul")
    return nl.matmul(stationary, moving, transpose_x=True)


def nc_transpose(data: Any, **kwargs: Any) -> Tensor:
    """Partitions <-> free axis of a 2-D tile on TensorE, into a new PSUM tile (fp32)."""
    _dst_form(kwargs, "nc_transpose")
    return nl.transpose(data)


def activation(
    op: Any, data: Any, bias: Any = None, scale: Any = 1.0, dtype: Any = None, **kwargs: Any
) -> Tensor:
    """``op(data * scale + bias)`` on ScalarE: ``scale`` a number, ``bias`` a [P, 1] tile."""
    _dst_form(kwargs, "activation")
    if op not in nl.ACTIVATIONS:
        raise error(f"nisa.activation: op={getattr(op, '__name__', op)!r} is not supported")
    if isinstance(scale, Tensor):
        raise error("nisa.activation: a tile scale is not supported yet (use a number)")
    return nl._activation(nl.ACTIVATIONS[op], data, dtype, float(scale), bias)


def tensor_tensor(data1: Any, data2: Any, op: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
    _dst_form(kwargs, "tensor_tensor")
    a, b = nl._on_chip(data1, "data1"), nl._on_chip(data2, "data2")
    if a.shape != b.shape:
        raise error(f"nisa.tensor_tensor: shapes {list(a.shape)} and {list(b.shape)} differ")
    return nl._binary(_alu(op, "tensor_tensor"), a, b, dtype)  # type: ignore[no-any-return]


def tensor_scalar(
    data: Any,
    op0: Any,
    operand0: Any,
    reverse0: bool = False,
    op1: Any = None,
    operand1: Any = None,
    reverse1: bool = False,
    dtype: Any = None,
    **kwargs: Any,
) -> Tensor:
    """``(data op0 operand0) op1 operand1``; operands are numbers or [P, 1] tiles."""
    _dst_form(kwargs, "tensor_scalar")
    t = nl._on_chip(data, "data")
    out = nl._binary(
        _alu(op0, "tensor_scalar"),
        *((operand0, t) if reverse0 else (t, operand0)),
        dtype if op1 is None else None,
    )
    if op1 is not None:
        out = nl._binary(
            _alu(op1, "tensor_scalar"), *((operand1, out) if reverse1 else (out, operand1)), dtype
        )
    return out  # type: ignore[no-any-return]


def tensor_reduce(
    op: Any, data: Any, axis: Any, dtype: Any = None, keepdims: bool = False, **kwargs: Any
) -> Tensor:
    _dst_form(kwargs, "tensor_reduce")
    name = _alu(op, "tensor_reduce")
    return nl._reduce(name, "tensor_reduce", data, axis, dtype, keepdims)


def tensor_copy(src: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
    _dst_form(kwargs, "tensor_copy")
    return nl.copy(src, dtype=dtype)


def memset(shape: Any, value: float, dtype: Any, **kwargs: Any) -> Tensor:
    _dst_form(kwargs, "memset")
    return nl.full(shape, value, dtype)


_NOT_YET = {
    "activation_reduce",
    "affine_select",
    "bn_aggr",
    "bn_stats",
    "dma_copy",
    "dma_transpose",
    "dropout",
    "iota",
    "local_gather",
    "max8",
    "nc_find_index8",
    "nc_match_replace8",
    "nc_stream_shuffle",
    "range_select",
    "scalar_tensor_tensor",
    "select_reduce",
    "sequence_bounds",
    "tensor_partition_reduce",
    "tensor_scalar_reduce",
    "tensor_tensor_scan",
    "nc_n_gather",
    "exponential",
    "rng",
    "rand2",
    "rand_set_state",
    "rand_get_state",
    "set_rng_seed",
}


def __getattr__(name: str) -> Any:
    if name in _NOT_YET:
        raise _ir.error(f"nisa.{name} is not supported by torchneuron.nki yet")
    raise AttributeError(f"module 'torchneuron.nki.isa' has no attribute {name!r}")
