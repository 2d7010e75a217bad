"""``torchneuron.nki.isa`` (``nisa``): NKI's engine instructions, tile-returning form.

Each call is one instruction on the engine NKI names (``nc_matmul``/``nc_transpose`` on TensorE,
``activation`` on ScalarE, ``tensor_tensor``/``tensor_scalar``/``tensor_reduce``/``tensor_copy``
on VectorE), in both the tile-returning form and the destination-passing form of newer
releases (``nisa.nc_matmul(dst=..., stationary=..., moving=...)``).
"""

from __future__ import annotations

import math
from typing import Any

from torchneuron.nki import _ir
from torchneuron.nki import language as nl
from torchneuron.nki._ir import Tensor, error


def _is_tile(x: Any) -> bool:
    return isinstance(x, Tensor)


def _split_dst(
    args: tuple[Any, ...], kwargs: dict[str, Any], positional: bool
) -> tuple[Any, list[Any]]:
    """(``dst`` of the destination-passing form of newer NKI or None for the tile-returning
    form, the other positional arguments); ``positional``: the leading argument is dst."""
    if "dst" in kwargs:
        return kwargs.pop("dst"), list(args)
    if positional:
        return args[0], list(args[1:])
    return None, list(args)


def _arg(kwargs: dict[str, Any], name: str, rest: list[Any]) -> Any:
    if name in kwargs:
        return kwargs.pop(name)
    return rest.pop(0) if rest else None


def _write(dst: Any, value: Tensor, name: str) -> None:
    """``dst[...] = value``: the instruction that made ``value`` writes ``dst`` instead."""
    d = nl._tensor(dst, f"nisa.{name}'s dst")
    if math.prod(d.shape) != math.prod(value.shape):
        raise error(f"nisa.{name}: dst shape {list(d.shape)} does not hold {list(value.shape)}")
    if d.shape != value.shape:
        d = Tensor(d._builder, nl._reshaped(d.view, value.shape))
    nl._assign(d, value)


def _as_nl(op: Any) -> Any:
    """NKI accepts NumPy's functions (``np.subtract``) for the ``nl`` ones of the same name."""
    fname = getattr(op, "__name__", None)
    if op in nl.ALU_OPS or op in nl.ACTIVATIONS or not isinstance(fname, str):
        return op
    return nl.__dict__.get(fname, op)


def _alu(op: Any, name: str) -> str:
    op = _as_nl(op)
    if op not in nl.ALU_OPS:
        raise error(f"nisa.{name}: op={getattr(op, '__name__', op)!r} is not an ALU operation")
    return nl.ALU_OPS[op]


def _maskable(fn: Any) -> Any:
    return nl._maskable(fn)


@_maskable
def nc_matmul(*args: Any, accumulate: Any = None, **kwargs: Any) -> Any:
    """``stationary.T @ moving`` on TensorE. Tile-returning ``nc_matmul(stationary, moving)``
    gives a new PSUM tile (fp32); ``nc_matmul(dst, stationary, moving)`` (newer NKI) writes
    the PSUM tile ``dst``, accumulating onto what earlier matmuls wrote there (a PSUM tile
    allocated outside the loop that accumulates starts at zero)."""
    dst, rest = _split_dst(args, kwargs, len(args) == 3 and all(_is_tile(a) for a in args))
    stationary = _arg(kwargs, "stationary", rest)
    moving = _arg(kwargs, "moving", rest)
    value = nl.matmul(stationary, moving, transpose_x=True)
    if dst is None:
        return value
    d = nl._tensor(dst, "nisa.nc_matmul's dst")
    if d.view.buffer.space != _ir.PSUM:
        raise error(f"nisa.nc_matmul's dst is in {d.buffer}; TensorE writes PSUM")
    b = _ir.current()
    buf = d.view.buffer
    fresh = not buf.users
    instr = value.producer
    _write(d, value, "nc_matmul")
    assert instr is not None
    if accumulate is None:
        # A fresh PSUM tile written in the block that made it starts the accumulation group;
        # one first written inside a loop below accumulates from zero.
        accumulate = not (fresh and buf.block is b.block)
        if accumulate and fresh:
            _zero_at_alloc(buf)
    if accumulate:
        instr.attrs["accumulate"] = ""
    return None


def _zero_at_alloc(buf: _ir.Buffer) -> None:
    b = _ir.current()
    view = b.full_view(buf).view
    instr = _ir.Instr("memset", "", [("", view)], {"value": nl._f64(0.0)}, buf.loc, [0])
    block = buf.block
    assert block is not None
    i = next(n for n, item in enumerate(block.items) if item is buf)
    block.items.insert(i + 1, instr)
    buf.users.append(instr)


@_maskable
def nc_transpose(*args: Any, **kwargs: Any) -> Any:
    """Partitions <-> free axis of a 2-D tile on TensorE, into a PSUM tile (fp32):
    ``nc_transpose(data)`` or ``nc_transpose(dst, data)``."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, len([a for a in args if _is_tile(a)]) == 2)
    data = _arg(kwargs, "data", rest)
    value = nl.transpose(data)
    if dst is None:
        return value
    _write(dst, value, "nc_transpose")
    return None


@_maskable
def activation(*args: Any, **kwargs: Any) -> Any:
    """``op(data * scale + bias)`` on ScalarE: ``scale`` a number, ``bias`` a [P, 1] tile.
    ``activation(op, data, ...)`` or ``activation(dst, op, data, ...)``."""
    dst, rest = _split_dst(args, kwargs, bool(args) and _is_tile(args[0]))
    names = ["op", "data", "bias", "scale", "dtype"]
    params = dict(zip(names, rest, strict=False))
    params.update({k: v for k, v in kwargs.items() if k in names})
    for k in kwargs:
        if k not in names and k not in ("name",):
            raise error(f"nisa.activation({k}=...) is not supported by torchneuron.nki yet")
    op, data = _as_nl(params.get("op")), params.get("data")
    scale = params.get("scale", 1.0)
    if op not in nl.ACTIVATIONS:
        raise error(f"nisa.activation: op={getattr(op, '__name__', op)!r} is not supported")
    if isinstance(scale, Tensor):
        raise error("nisa.activation: a tile scale is not supported yet (use a number)")
    dtype = params.get("dtype") or (dst.dtype if dst is not None else None)
    value = nl._activation(nl.ACTIVATIONS[op], data, dtype, float(scale), params.get("bias"))
    if dst is None:
        return value
    _write(dst, value, "activation")
    return None


@_maskable
def reciprocal(*args: Any, **kwargs: Any) -> Any:
    """1 / data on ScalarE: ``reciprocal(data)`` or ``reciprocal(dst, data)``."""
    dst, rest = _split_dst(args, kwargs, len([a for a in args if _is_tile(a)]) == 2)
    data = _arg(kwargs, "data", rest)
    value = nl._activation("reciprocal", data, dst.dtype if dst is not None else None)
    if dst is None:
        return value
    _write(dst, value, "reciprocal")
    return None


@_maskable
def tensor_tensor(*args: Any, **kwargs: Any) -> Any:
    """``data1 op data2`` on VectorE: ``tensor_tensor(data1, data2, op)`` or
    ``tensor_tensor(dst, data1, data2, op)``."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, len([a for a in args if _is_tile(a)]) == 3)
    names = ["data1", "data2", "op", "dtype"]
    params = dict(zip(names, rest, strict=False))
    params.update({k: v for k, v in kwargs.items() if k in names})
    a = nl._on_chip(params.get("data1"), "data1")
    c = nl._on_chip(params.get("data2"), "data2")
    if a.shape != c.shape:
        raise error(f"nisa.tensor_tensor: shapes {list(a.shape)} and {list(c.shape)} differ")
    dtype = params.get("dtype") or (dst.dtype if dst is not None else None)
    value = nl._binary(_alu(params.get("op"), "tensor_tensor"), a, c, dtype)
    if dst is None:
        return value
    _write(dst, value, "tensor_tensor")
    return None


@_maskable
def tensor_scalar(*args: Any, **kwargs: Any) -> Any:
    """``(data op0 operand0) op1 operand1``; operands are numbers or [P, 1] tiles.
    ``tensor_scalar(data, op0, operand0, ...)`` or ``tensor_scalar(dst, data, op0, ...)``."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, len(args) >= 2 and _is_tile(args[0]) and _is_tile(args[1]))
    names = ["data", "op0", "operand0", "reverse0", "op1", "operand1", "reverse1", "dtype"]
    p = dict(zip(names, rest, strict=False))
    p.update({k: v for k, v in kwargs.items() if k in names})
    t = nl._on_chip(p.get("data"), "data")
    dtype = p.get("dtype") or (dst.dtype if dst is not None else None)
    op1 = p.get("op1")
    x, y = (p.get("operand0"), t) if p.get("reverse0") else (t, p.get("operand0"))
    out = nl._binary(_alu(p.get("op0"), "tensor_scalar"), x, y, dtype if op1 is None else None)
    if op1 is not None:
        x, y = (p.get("operand1"), out) if p.get("reverse1") else (out, p.get("operand1"))
        out = nl._binary(_alu(op1, "tensor_scalar"), x, y, dtype)
    if dst is None:
        return out
    _write(dst, out, "tensor_scalar")
    return None


@_maskable
def tensor_reduce(*args: Any, **kwargs: Any) -> Any:
    """Reduce the free axes with ``op``: ``tensor_reduce(op, data, axis)`` or
    ``tensor_reduce(dst, op, data, axis)``."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, bool(args) and _is_tile(args[0]))
    names = ["op", "data", "axis", "dtype", "keepdims"]
    p = dict(zip(names, rest, strict=False))
    p.update({k: v for k, v in kwargs.items() if k in names})
    name = _alu(p.get("op"), "tensor_reduce")
    dtype = p.get("dtype") or (dst.dtype if dst is not None else None)
    value = nl._reduce(name, "tensor_reduce", p.get("data"), p.get("axis"), dtype, False)
    if dst is None:
        return value
    _write(dst, value, "tensor_reduce")
    return None


@_maskable
def tensor_copy(*args: Any, **kwargs: Any) -> Any:
    """A copy (with dtype cast) on VectorE: ``tensor_copy(src)`` or ``tensor_copy(dst, src)``."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, len([a for a in args if _is_tile(a)]) == 2)
    src = _arg(kwargs, "src", rest)
    dtype = kwargs.pop("dtype", None) or (dst.dtype if dst is not None else None)
    value = nl.copy(src, dtype=dtype)
    if dst is None:
        return value
    _write(dst, value, "tensor_copy")
    return None


@_maskable
def dma_copy(*args: Any, **kwargs: Any) -> None:
    """``dma_copy(dst, src)``: one DMA between any two memories (HBM, SBUF)."""
    kwargs.pop("dge_mode", None)
    kwargs.pop("engine", None)
    rest = list(args)
    dst = _arg(kwargs, "dst", rest)
    src = _arg(kwargs, "src", rest)
    d = nl._tensor(dst, "nisa.dma_copy's dst")
    s_ = nl._tensor(src, "nisa.dma_copy's src")
    if math.prod(d.shape) != math.prod(s_.shape):
        raise error(f"nisa.dma_copy: shapes {list(s_.shape)} and {list(d.shape)} differ")
    if _ir.PSUM in (d.view.buffer.space, s_.view.buffer.space):
        raise error("nisa.dma_copy: DMA moves HBM and SBUF data, not PSUM")
    src_view = s_.view if s_.shape == d.shape else nl._reshaped(s_.view, d.shape)
    instr = _ir.current().emit("dma_copy", [("", src_view), ("", d.view)])
    instr.writes = [1]


@_maskable
def memset(*args: Any, **kwargs: Any) -> Any:
    """``memset(shape, value, dtype)`` (a new tile) or ``memset(dst, value)``."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, bool(args) and _is_tile(args[0]))
    if dst is None:
        shape = _arg(kwargs, "shape", rest)
        value = _arg(kwargs, "value", rest) or 0.0
        dtype = _arg(kwargs, "dtype", rest)
        return nl.full(shape, value, dtype)
    value = _arg(kwargs, "value", rest) or 0.0
    nl._assign(nl._on_chip(dst, "nisa.memset's dst"), float(value))
    return None


_NOT_YET = {
    "activation_reduce",
    "affine_select",
    "bn_aggr",
    "bn_stats",
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
