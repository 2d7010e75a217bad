"""``torchneuron.nki.isa`` (``nisa``): NKI's engine instructions, tile-returning form.

Each call is one instruction on the engine NKI names (``nc_matmul``/``nc_transpose`` on TensorE,
``activation`` on ScalarE, ``tensor_tensor``/``tensor_scalar``/``tensor_reduce``/``tensor_copy``
on VectorE), in both the tile-returning form and the destination-passing form of newer
releases (``nisa.nc_matmul(dst=..., stationary=..., moving=...)``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from torchneuron.nki import _ir
from torchneuron.nki import language as nl
from torchneuron.nki._ir import Tensor, View, error


# NKI's engine names for ``engine=`` (which engine runs an instruction is this compiler's
# choice: VectorE for tensor_tensor/tensor_scalar/copies, ScalarE for activations).
class engine:  # noqa: N801 (NKI's spelling)
    unknown = "unknown"
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    sync = "sync"


unknown_engine, tensor_engine, vector_engine = engine.unknown, engine.tensor, engine.vector
scalar_engine, gpsimd_engine, sync_engine = engine.scalar, engine.gpsimd, engine.sync


class reduce_cmd:  # noqa: N801 (NKI's spelling)
    """How an instruction's ``reduce_res`` combines with what it held: ``reset_reduce``
    (overwrite; also the meaning when not given) is supported."""

    idle = "idle"
    reset = "reset"
    reset_reduce = "reset_reduce"
    reduce = "reduce"


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


# Reductions NKI takes as an ALU op (``op=np.max``, ``op=nl.sum``): the binary op they fold.
_FOLDS = {
    "max": "maximum",
    "amax": "maximum",
    "min": "minimum",
    "amin": "minimum",
    "sum": "add",
    "prod": "multiply",
}


def _as_nl(op: Any) -> Any:
    """NKI accepts NumPy's functions (``np.subtract``) for the ``nl`` ones of the same name."""
    fname = getattr(op, "__name__", None)
    if op in nl.ALU_OPS or op in nl.ACTIVATIONS or not isinstance(fname, str):
        return op
    return nl.__dict__.get(_FOLDS.get(fname, fname), op)


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
    value = nl._nc_matmul(
        nl._on_chip(stationary, "nisa.nc_matmul's stationary"),
        nl._on_chip(moving, "nisa.nc_matmul's moving"),
    )
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
    names = ["op", "data", "bias", "scale", "reduce_op", "reduce_res", "reduce_cmd", "dtype"]
    params = dict(zip(names, rest, strict=False))
    params.update({k: v for k, v in kwargs.items() if k in names})
    for k in kwargs:
        if k not in names and k not in ("name",):
            raise error(f"nisa.activation({k}=...) is not supported by torchneuron.nki yet")
    op, data = _as_nl(params.get("op")), params.get("data")
    scale = params.get("scale", 1.0)
    if op not in nl.ACTIVATIONS:
        raise error(f"nisa.activation: op={getattr(op, '__name__', op)!r} is not supported")
    dtype = params.get("dtype") or (dst.dtype if dst is not None else None)
    value = nl._activation(nl.ACTIVATIONS[op], data, dtype, scale, params.get("bias"))
    if params.get("reduce_res") is not None:
        _row_sums(value, params, "activation")
    if dst is None:
        return value
    _write(dst, value, "activation")
    return None


def _row_sums(value: Tensor, params: dict[str, Any], name: str) -> None:
    """ScalarE's free row sums of an activation's results into ``reduce_res`` (the
    instruction's accumulate operand: overwritten, NKI's ``reset_reduce``)."""
    if _alu(params.get("reduce_op", nl.add), name) != "add":
        raise error(f"nisa.{name}: only reduce_op=nl.add is supported (ScalarE sums rows)")
    cmd = params.get("reduce_cmd") or reduce_cmd.reset_reduce
    if cmd != reduce_cmd.reset_reduce:
        raise error(f"nisa.{name}(reduce_cmd={cmd}) is not supported yet (reset_reduce only)")
    instr = value.producer
    assert instr is not None and instr.op == "activation"
    res = params["reduce_res"]
    col = nl._column(res, "reduce_res", value.shape[0])
    if res.dtype != _ir.FLOAT32:
        raise error("nisa.activation: reduce_res must be a float32 tile")
    b = _ir.current()
    if b.mask is not None:  # the rows the mask keeps, as for the instruction's other operands
        col = b.clip(col, b.mask)
    instr.operands.append(("accumulate", col))
    col.buffer.users.append(instr)


@_maskable
def activation_reduce(*args: Any, **kwargs: Any) -> Any:
    """``activation`` whose row sums go to ``reduce_res`` (``reduce_op=nl.add``)."""
    return activation(*args, **kwargs)


@_maskable
def tensor_scalar_reduce(*args: Any, **kwargs: Any) -> Any:
    """``(data op0 operand0)`` with its free-axis reduction by ``reduce_op`` into
    ``reduce_res``: on the engine model a VectorE ``tensor_scalar`` then a ``tensor_reduce``
    of its result (two instructions where the hardware takes one)."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, len(args) >= 2 and _is_tile(args[0]) and _is_tile(args[1]))
    names = ["data", "op0", "operand0", "reduce_op", "reduce_res", "reverse0", "dtype"]
    p = dict(zip(names, rest, strict=False))
    p.update({k: v for k, v in kwargs.items() if k in names})
    t = nl._on_chip(p.get("data"), "data")
    dtype = p.get("dtype") or (dst.dtype if dst is not None else None)
    x, y = (p.get("operand0"), t) if p.get("reverse0") else (t, p.get("operand0"))
    out = nl._binary(_alu(p.get("op0"), "tensor_scalar_reduce"), x, y, dtype)
    res = nl._on_chip(p.get("reduce_res"), "reduce_res")
    folded = nl._reduce(
        _alu(p.get("reduce_op"), "tensor_scalar_reduce"),
        "tensor_scalar_reduce",
        out,
        tuple(range(1, out.ndim)),
        res.dtype,
        False,
    )
    _write(res, folded, "tensor_scalar_reduce")
    if dst is None:
        return out
    _write(dst, out, "tensor_scalar_reduce")
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
    names = ["op", "data", "axis", "dtype", "keepdims", "negate"]
    p = dict(zip(names, rest, strict=False))
    p.update({k: v for k, v in kwargs.items() if k in names})
    name = _alu(p.get("op"), "tensor_reduce")
    dtype = p.get("dtype") or (dst.dtype if dst is not None else None)
    value = nl._reduce(name, "tensor_reduce", p.get("data"), p.get("axis"), dtype, False)
    if p.get("negate"):
        value = nl._binary("multiply", value, -1.0, None, out=value)
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


@contextlib.contextmanager
def _unmasked(data: Tensor) -> Iterator[View | None]:
    """``data``'s view with the call's ``mask=`` applied (None: the mask keeps nothing); the
    instructions emitted inside then run unmasked (they use views derived from it)."""
    b = _ir.current()
    if b.mask_skip:
        yield None
        return
    view = b.clip(data.view, b.mask) if b.mask else data.view
    if view.oob:
        raise _ir.KernelError(view.oob)
    saved = b.mask
    b.mask = None
    try:
        yield view
    finally:
        b.mask = saved


def _sub(view: View, start: int, size: int, step: int) -> View:
    """Free-axis elements start, start + step, ... (size of them) of a 2-D view."""
    return View(
        view.buffer,
        view.offset + start * view.strides[1],
        (view.shape[0], size),
        (view.strides[0], view.strides[1] * step),
    )


def _emit(
    op: str,
    operands: list[tuple[str, View]],
    written: int,
    prefix: str = "",
    attrs: dict[str, str] | None = None,
) -> _ir.Instr:
    instr = _ir.current().emit(op, operands, prefix=prefix, attrs=attrs)
    instr.writes = [written]
    return instr


@_maskable
def bn_stats(*args: Any, **kwargs: Any) -> Any:
    """Mean and variance statistics of each partition's elements (VectorE's ``bn_stats``):
    a [P, 6] fp32 tile of (count, mean, count * variance) over the even-indexed elements, then
    over the odd-indexed ones, which ``bn_aggr`` combines. ``bn_stats(data)`` or
    ``bn_stats(dst, data)``; at most ``nl.tile_size.bn_stats_fmax`` elements per partition."""
    dst, rest = _split_dst(args, kwargs, len([a for a in args if _is_tile(a)]) == 2)
    data = nl._on_chip(_arg(kwargs, "data", rest), "nisa.bn_stats's data")
    kwargs.pop("dtype", None)
    if data.ndim != 2:
        raise error(f"nisa.bn_stats takes a 2-D [P, F] tile, got {list(data.shape)}")
    out = nl._new((data.shape[0], 6), _ir.FLOAT32)
    with _unmasked(data) as view:
        if view is None:
            return None
        n = view.shape[1]
        if n > nl.tile_size.bn_stats_fmax:
            raise error(
                f"nisa.bn_stats: {n} free elements, more than "
                f"nl.tile_size.bn_stats_fmax ({nl.tile_size.bn_stats_fmax})"
            )
        _emit("bn_stats", [("", view), ("", out.view)], 1)
    if dst is None:
        return out
    _write(dst, out, "bn_stats")
    return None


@_maskable
def nc_n_gather(*args: Any, **kwargs: Any) -> Any:
    """Each partition's elements of ``data`` (its free axes flattened) picked by that
    partition's ``indices`` on GpSimd, within SBUF (NKI's ``nc_n_gather``):
    ``nc_n_gather(data, indices)`` or ``nc_n_gather(dst, data, indices)``; the result has the
    indices' shape and the data's dtype. Indices are int32 tiles here (NKI's are uint32: the
    values are the same below 2^31); one out of range is an error when the kernel runs."""
    if _ir.current().mask is not None:  # it would clip the data the indices address
        raise error("nisa.nc_n_gather takes no mask=: slice its indices and dst instead")
    dst, rest = _split_dst(args, kwargs, len([a for a in args if _is_tile(a)]) == 3)
    data = nl._on_chip(_arg(kwargs, "data", rest), "nisa.nc_n_gather's data")
    indices = nl._on_chip(_arg(kwargs, "indices", rest), "nisa.nc_n_gather's indices")
    if indices.dtype != _ir.INT32:
        raise error(f"nisa.nc_n_gather: indices must be an int32 tile, got {indices.dtype}")
    if data.shape[0] != indices.shape[0]:
        raise error(
            f"nisa.nc_n_gather: data {list(data.shape)} and indices {list(indices.shape)} "
            "must have one partition count"
        )
    out = nl._new(indices.shape, data.dtype)
    _emit("n_gather", [("", data.view), ("", indices.view), ("", out.view)], 2)
    if dst is None:
        return out
    _write(dst, out, "nc_n_gather")
    return None


@_maskable
def bn_aggr(*args: Any, **kwargs: Any) -> Any:
    """Combine ``bn_stats`` results ([P, 6k]: k of them side by side) into a [P, 2] fp32 tile
    of (mean, variance) per partition (VectorE's ``bn_aggr``)."""
    dst, rest = _split_dst(args, kwargs, len([a for a in args if _is_tile(a)]) == 2)
    data = nl._on_chip(_arg(kwargs, "data", rest), "nisa.bn_aggr's data")
    kwargs.pop("dtype", None)
    if data.ndim != 2 or data.shape[1] % 3:
        raise error(f"nisa.bn_aggr takes [P, 6k] bn_stats results, got {list(data.shape)}")
    out = nl._new((data.shape[0], 2), _ir.FLOAT32)
    with _unmasked(data) as view:
        if view is None:
            return None
        _emit("bn_aggr", [("", view), ("", out.view)], 1)
    if dst is None:
        return out
    _write(dst, out, "bn_aggr")
    return None


@_maskable
def tensor_tensor_scan(*args: Any, **kwargs: Any) -> Any:
    """``res[:, i] = (data0[:, i] op0 res[:, i - 1]) op1 data1[:, i]`` along the free axis,
    ``res[:, -1] = initial`` (a number or a [P, 1] tile). ``tensor_tensor_scan(data0, data1,
    initial, op0, op1)`` or with ``dst`` first. The engine model has no scan instruction: it
    runs as a loop of one VectorE ``scalar_tensor_tensor`` per column, right in numbers but
    much slower than the hardware's single pass."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, len(args) >= 3 and all(_is_tile(a) for a in args[:3]))
    names = ["data0", "data1", "initial", "op0", "op1", "reverse0", "reverse1", "dtype"]
    prm = dict(zip(names, rest, strict=False))
    prm.update({k: v for k, v in kwargs.items() if k in names})
    if prm.get("reverse0") or prm.get("reverse1"):
        raise error("nisa.tensor_tensor_scan(reverse0/reverse1=True) is not supported yet")
    d0 = nl._on_chip(prm.get("data0"), "data0")
    d1 = nl._on_chip(prm.get("data1"), "data1")
    if d0.shape != d1.shape or d0.ndim != 2:
        raise error(
            f"nisa.tensor_tensor_scan: data0 {list(d0.shape)} and data1 "
            f"{list(d1.shape)} must be [P, F] tiles of one shape"
        )
    op0 = _alu(prm.get("op0"), "tensor_tensor_scan")
    op1 = _alu(prm.get("op1"), "tensor_tensor_scan")
    dtype = prm.get("dtype") or (dst.dtype if dst is not None else _ir.promote(d0.dtype, d1.dtype))
    p, f = d0.shape
    out = nl._new((p, f), _ir.as_dtype(dtype))
    initial = prm.get("initial", 0.0)
    b = _ir.current()
    with _unmasked(d0) as v0:
        if v0 is None:
            return None
        v1 = b.clip(d1.view, b.mask) if b.mask else d1.view
        stt = f"{op0}, {op1} "
        first = [("", _sub(v0, 0, 1, 1)), ("", _sub(v1, 0, 1, 1)), ("", _sub(out.view, 0, 1, 1))]
        if isinstance(initial, Tensor):
            first.append(("scalar", nl._column(initial, "initial", p)))
            _emit("scalar_tensor_tensor", first, 2, prefix=stt)
        else:
            _emit(
                "scalar_tensor_tensor", first, 2, prefix=stt, attrs={"imm": nl._f64(float(initial))}
            )
        if v0.shape[1] > 1:
            for i in b.loop(1, v0.shape[1], 1):
                _emit(
                    "scalar_tensor_tensor",
                    [
                        ("", _col_at(v0, i)),
                        ("", _col_at(v1, i)),
                        ("", _col_at(out.view, i)),
                        ("scalar", _col_at(out.view, i - 1)),
                    ],
                    2,
                    prefix=stt,
                )
    if dst is None:
        return out
    _write(dst, out, "tensor_tensor_scan")
    return None


@_maskable
def scalar_tensor_tensor(*args: Any, **kwargs: Any) -> Any:
    """``(data op0 operand0) op1 operand1`` in one VectorE pass: ``operand0`` a number or a
    [P, 1] tile, ``operand1`` a tile of data's shape; computed in fp32, rounded once.
    ``scalar_tensor_tensor(data=..., ...)`` or with ``dst`` first."""
    kwargs.pop("engine", None)
    dst, rest = _split_dst(args, kwargs, len(args) >= 2 and _is_tile(args[0]) and _is_tile(args[1]))
    names = ["data", "op0", "operand0", "op1", "operand1", "reverse0", "reverse1", "dtype"]
    prm = dict(zip(names, rest, strict=False))
    prm.update({k: v for k, v in kwargs.items() if k in names})
    if prm.get("reverse0") or prm.get("reverse1"):
        raise error("nisa.scalar_tensor_tensor(reverse0/reverse1=True) is not supported yet")
    data = nl._on_chip(prm.get("data"), "data")
    other = nl._on_chip(prm.get("operand1"), "operand1")
    if data.shape != other.shape:
        raise error(
            f"nisa.scalar_tensor_tensor: data {list(data.shape)} and operand1 "
            f"{list(other.shape)} differ"
        )
    op0 = _alu(prm.get("op0"), "scalar_tensor_tensor")
    op1 = _alu(prm.get("op1"), "scalar_tensor_tensor")
    dtype = prm.get("dtype") or (
        dst.dtype if dst is not None else _ir.promote(data.dtype, other.dtype)
    )
    out = nl._new(data.shape, _ir.as_dtype(dtype))
    operands = [("", data.view), ("", other.view), ("", out.view)]
    scalar = prm.get("operand0")
    attrs: dict[str, str] = {}
    if isinstance(scalar, Tensor):
        col = nl._column(scalar, "operand0", data.shape[0])
        if scalar.dtype != nl.FLOAT32:
            col = nl.copy(Tensor(_ir.current(), col), dtype=nl.FLOAT32).view
        operands.append(("scalar", col))
    else:
        attrs["imm"] = nl._f64(float(scalar))
    nl._produce(out, _emit("scalar_tensor_tensor", operands, 2, f"{op0}, {op1} ", attrs), 2)
    if dst is None:
        return out
    _write(dst, out, "scalar_tensor_tensor")
    return None


def _col_at(view: View, i: Any) -> View:
    return View(
        view.buffer, view.offset + i * view.strides[1], (view.shape[0], 1), (view.strides[0], 1)
    )


_NOT_YET = {
    "affine_select",
    "dma_transpose",
    "dropout",
    "iota",
    "local_gather",
    "max8",
    "nc_find_index8",
    "nc_match_replace8",
    "nc_stream_shuffle",
    "range_select",
    "select_reduce",
    "sequence_bounds",
    "tensor_partition_reduce",
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
