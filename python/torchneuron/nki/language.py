"""``torchneuron.nki.language`` (``nl``): NKI's tile-level language, traced onto the engine model.

The tile-returning style of the Neuron SDK 2.2x releases: ``nl.load`` gives an SBUF tile,
operators and ``nl`` functions give new tiles (ScalarE for activation functions, VectorE for
arithmetic and reductions, TensorE for ``nl.matmul`` and ``nl.transpose``, whose results are
PSUM tiles), ``nl.store`` writes HBM. Only meaningful while a ``@nki.jit`` kernel is traced.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

from torchneuron.nki import _ir
from torchneuron.nki._ir import (
    BFLOAT16,
    BOOL,
    FLOAT16,
    FLOAT32,
    HBM,
    INT8,
    INT32,
    INT64,
    PSUM,
    SBUF,
    UINT8,
    Affine,
    DType,
    IndexExpr,
    Instr,
    Tensor,
    View,
    current,
    error,
)

# ----------------------------------------------------------------------------------------------
# Data types, memories, sizes
# ----------------------------------------------------------------------------------------------

float32 = FLOAT32
bfloat16 = BFLOAT16
float16 = FLOAT16
int32 = INT32
int64 = INT64
int8 = INT8
uint8 = UINT8
bool_ = BOOL


class _Memory:
    def __init__(self, name: str, space: str, shared: bool = False) -> None:
        self.name, self.space, self.shared = name, space, shared

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = _Memory("sbuf", SBUF)
psum = _Memory("psum", PSUM)
hbm = _Memory("hbm", HBM)
private_hbm = _Memory("private_hbm", HBM)
shared_hbm = _Memory("shared_hbm", HBM, shared=True)


class tile_size:  # noqa: N801 (NKI's spelling)
    """The engines' tile limits (NeuronCore-v3 as NKI states them)."""

    pmax = 128  # partitions
    psum_fmax = 512  # fp32 elements of one PSUM bank per partition
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512  # free elements one nisa.bn_stats takes


def par_dim(n: int) -> int:
    """Marks the partition dimension of a shape: ``(n, par_dim(128), f)`` is a block of n
    [128, f] tiles (its partition axis is the second)."""
    return _ir.ParDim(n)


# ----------------------------------------------------------------------------------------------
# Loops, grids and index expressions
# ----------------------------------------------------------------------------------------------


def _range_args(start: int, stop: int | None, step: int) -> tuple[int, int, int]:
    if stop is None:
        start, stop = 0, start
    return int(start), int(stop), int(step)


def affine_range(
    start: int, stop: int | None = None, step: int = 1, directives: Any = None
) -> Iterator[Affine]:
    """A loop whose iterations are independent: one ``scf.for`` whose body holds up to
    ``rotate`` copies of the iteration (``nki.jit(rotate=4)``; the body is traced once per
    copy), so the tiles each copy allocates rotate and loads run ahead of compute."""
    b = current()
    return b.loop(*_range_args(start, stop, step), rotate=b.rotate)


def sequential_range(
    start: int, stop: int | None = None, step: int = 1, directives: Any = None
) -> Iterator[Affine]:
    """A loop with a dependence between iterations: one ``scf.for``, iterations in order (the
    compiler's synchronisation orders every conflicting access, so both loops are safe). Its
    body holds up to ``rotate`` iterations like ``affine_range``'s, so each copy's tiles get
    addresses of their own and the next iteration's loads need not wait for this one's
    readers (effects stay in program order)."""
    return current().loop(*_range_args(start, stop, step), rotate=current().rotate)


def static_range(
    start: int, stop: int | None = None, step: int = 1, directives: Any = None
) -> range:
    """A loop unrolled while tracing: its variable is a Python ``int``."""
    return range(*_range_args(start, stop, step))


def program_id(axis: int) -> Affine:
    """This program's index along ``axis`` of the launch grid (``kernel[g0, g1](...)``)."""
    grid = current().grid_vars
    if not 0 <= axis < len(grid):
        if not grid and axis == 0:
            return Affine(0)
        raise error(f"nl.program_id({axis}): the launch grid has {len(grid)} dimensions")
    return grid[axis]


def num_programs(axes: int | None = None) -> int:
    grid = current().grid or (1,)
    if axes is None:
        return math.prod(grid)
    if not 0 <= axes < len(grid):
        raise error(f"nl.num_programs({axes}): the launch grid has {len(grid)} dimensions")
    return grid[axes]


class nc:  # noqa: N801 (NKI's spelling)
    """``nl.nc(k)``: spread a launch-grid axis over k NeuronCores (with ``nl.spmd_dim``)."""

    def __init__(self, cores: int) -> None:
        if int(cores) < 1:
            raise ValueError(f"nl.nc({cores}): need at least one core")
        self.cores = int(cores)


def spmd_dim(size: int, *cores: nc) -> int:
    """``nl.spmd_dim(n, nl.nc(k))``: a launch-grid axis of n * k programs, program i on core
    i % k. The engine model runs one core, so all n * k programs run on it one after
    another: the numbers are the grid's, the modeled time that of one core doing all of it
    (about k times the multi-core time)."""
    total = int(size)
    for c in cores:
        if not isinstance(c, nc):
            raise TypeError(f"nl.spmd_dim takes nl.nc(k) after the size, got {c!r}")
        total *= c.cores
    return total


def program_ndim() -> int:
    return len(current().grid)


def ds(start: Any, size: int) -> slice:
    """``nl.ds(start, size)``: the slice ``start : start + size`` (start may be a loop index)."""
    return slice(start, start + size)


def arange(start: int, stop: int | None = None, step: int = 1) -> IndexExpr:
    """An index expression over ``range(start, stop, step)``; ``[:, None]`` / ``[None, :]``
    make it a partition or free index of a 2-D access."""
    return IndexExpr.arange(*_range_args(start, stop, step))


class _MGridResult(tuple):  # type: ignore[type-arg]
    @property
    def p(self) -> IndexExpr:
        return self[0]  # type: ignore[no-any-return]

    @property
    def x(self) -> IndexExpr:
        return self[1]  # type: ignore[no-any-return]


class _MGrid:
    """``nl.mgrid[0:128, 0:512]``: one index expression per axis, broadcast against each other."""

    def __getitem__(self, key: Any) -> _MGridResult:
        key = key if isinstance(key, tuple) else (key,)
        out = []
        for axis, k in enumerate(key):
            if not isinstance(k, slice) or k.stop is None:
                raise error("nl.mgrid takes bounded slices, e.g. nl.mgrid[0:128, 0:512]")
            e = IndexExpr.arange(k.start or 0, k.stop, k.step or 1)
            coeffs = [0] * len(key)
            shape = [1] * len(key)
            coeffs[axis], shape[axis] = e.coeffs[0], e.shape[0]
            out.append(IndexExpr(e.base, coeffs, shape))
        return _MGridResult(out)


mgrid = _MGrid()

# ----------------------------------------------------------------------------------------------
# Creating tensors
# ----------------------------------------------------------------------------------------------


def _memory(buffer: Any) -> _Memory:
    if isinstance(buffer, _Memory):
        return buffer
    if isinstance(buffer, (_ir.ModAlloc, _ir.FuncAlloc)):
        return sbuf if buffer.space == SBUF else psum
    raise error(
        f"buffer={buffer!r}: expected nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm or "
        "nki.compiler.sbuf/psum.mod_alloc(...) or .alloc(func)"
    )


def ndarray(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "") -> Tensor:
    """A new tensor: an SBUF/PSUM tile, or an HBM tensor (``nl.shared_hbm``: a kernel output
    when the kernel returns it). ``buffer=nki.compiler.sbuf.mod_alloc(...)`` or
    ``.alloc(func)`` (or psum's) places its tiles at the addresses the kernel gives."""
    mem = _memory(buffer)
    placement = buffer if isinstance(buffer, (_ir.ModAlloc, _ir.FuncAlloc)) else None
    t = current().alloc(shape, _ir.as_dtype(dtype), mem.space, placement=placement)
    t.view.buffer.kind = "shared" if mem.shared else "alloc"
    return t


def shared_constant(constant: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
    """An HBM tensor holding ``constant`` (a NumPy array, cast to ``dtype``): an extra kernel
    input the kernel's calls pass along."""
    import numpy as np
    import torch

    b = current()
    arr = np.asarray(constant)
    dt = _ir.as_dtype(dtype if dtype is not None else arr.dtype)
    value = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64)).to(
        getattr(torch, dt.name)
    )
    b.constants.append(value)
    return b.input(tuple(arr.shape), dt, _ir.user_location())


def static_cast(x: Any, dtype: Any) -> Any:
    """A NumPy array (outside kernels) converted to ``dtype``; NumPy has no bfloat16, so a
    bfloat16 result is a torch tensor."""
    import numpy as np

    dt = _ir.as_dtype(dtype)
    if dt.name == "bfloat16":
        import torch

        return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(torch.bfloat16)
    return np.asarray(x).astype(np.bool_ if dt.name == "bool" else dt.name)


def zeros(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "") -> Tensor:
    return full(shape, 0.0, dtype, buffer)


def ones(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "") -> Tensor:
    return full(shape, 1.0, dtype, buffer)


def full(
    shape: Sequence[int], fill_value: float, dtype: Any, buffer: Any = sbuf, name: str = ""
) -> Tensor:
    mem = _memory(buffer)
    if mem.space == HBM:
        raise error("nl.full/zeros/ones make on-chip tiles; use nl.sbuf or nl.psum")
    t = ndarray(shape, dtype, buffer)
    b = current()
    if isinstance(t, _ir.BlockTensor):
        # Tiles allocated one by one: each starts filled.
        for idx in itertools.product(*(range(n) for n in t.blocks.block_shape)):
            instr = b.emit(
                "memset",
                [("", b.full_view(b.block_buffer(t.blocks, idx)).view)],
                attrs={"value": _f64(fill_value)},
            )
            instr.writes = [0]
            t.blocks.started.add(tuple((i, ()) for i in idx))
        return t
    whole = b.full_view(t.view.buffer).view  # partitions first, even with par_dim
    t.producer = b.emit("memset", [("", whole)], attrs={"value": _f64(fill_value)})
    t.producer.writes = [0]
    return t


def zeros_like(a: Tensor, dtype: Any = None, buffer: Any = sbuf, name: str = "") -> Tensor:
    return zeros(a.shape, dtype or a.dtype, buffer)


def empty_like(a: Tensor, dtype: Any = None, buffer: Any = sbuf, name: str = "") -> Tensor:
    return ndarray(a.shape, dtype or a.dtype, buffer)


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def _f64(x: float) -> str:
    x = float(x)
    if math.isinf(x):
        return ("0x7FF0000000000000" if x > 0 else "0xFFF0000000000000") + " : f64"
    if math.isnan(x):
        return "0x7FF8000000000000 : f64"
    text = repr(x)
    if "." not in text:  # MLIR float literals need a '.': 1e-06 -> 1.0e-06
        mantissa, _, exponent = text.partition("e")
        text = mantissa + ".0" + ("e" + exponent if exponent else "")
    return f"{text} : f64"


def _tensor(x: Any, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise error(f"{what} must be a tensor or tile, got {type(x).__name__}")
    return x


def _on_chip(x: Any, what: str) -> Tensor:
    t = _tensor(x, what)
    if t.view.buffer.space == HBM:
        raise error(f"{what} is an HBM tensor; nl.load it into SBUF first")
    return t


def _new(shape: Sequence[int], dtype: DType, space: str = SBUF) -> Tensor:
    return current().alloc(shape, dtype, space)


def _produce(t: Tensor, instr: Instr, dst_index: int) -> Tensor:
    instr.writes = [dst_index]
    t.producer = instr
    return t


def _reshaped(view: View, shape: Sequence[int]) -> View:
    """``view`` seen with ``shape``, which differs from its own by unit dimensions only."""
    shape = tuple(shape)
    if view.shape == shape:
        return view
    squeeze = [(d, s) for d, s in zip(view.shape, view.strides, strict=True) if d != 1]
    if [d for d in shape if d != 1] != [d for d, _ in squeeze]:
        raise error(f"shapes {list(view.shape)} and {list(shape)} differ")
    strides, it = [], iter(squeeze)
    for d in shape:
        strides.append(next(it)[1] if d != 1 else 1)
    return View(view.buffer, view.offset, shape, tuple(strides))


def _same_view(a: View, b: View) -> bool:
    return (
        a.buffer is b.buffer
        and a.offset.const == b.offset.const
        and a.offset.terms == b.offset.terms
        and a.shape == b.shape
        and a.strides == b.strides
    )


def _retarget(value: Tensor, target: View) -> bool:
    """Make the instruction that produced ``value`` (a fresh, unread tile) write ``target``
    instead, when that saves a copy."""
    instr = value.producer
    buf = value.view.buffer
    if (
        instr is None
        or len(instr.writes) != 1
        or buf.users != [instr]
        or buf.space == HBM
        or target.buffer.space == HBM
        or (instr.op == "matmul" and target.buffer.space != PSUM)  # TensorE writes PSUM only
        or value.view.shape != target.shape
        or not _same_view(value.view, current().full_view(buf).view)
    ):
        return False
    i = instr.writes[0]
    kw, written = instr.operands[i]
    if written.shape != target.shape:
        # A masked instruction wrote part of the tile: write the same part of the target.
        full = current().full_view(buf).view
        if written.strides != full.strides or not written.offset.is_const():
            return False
        rest, starts = written.offset.const, []
        for st in full.strides:
            starts.append(rest // st)
            rest %= st
        offset = target.offset
        for start, st in zip(starts, target.strides, strict=True):
            offset = offset + start * st
        target = View(target.buffer, offset, written.shape, target.strides)
    instr.operands[i] = (kw, target)
    buf.users.remove(instr)
    target.buffer.users.append(instr)
    value.producer = None
    return True


def _assign(target: Tensor, value: Any) -> None:
    """``target[...] = value``."""
    b = current()
    if isinstance(value, Tensor):
        if _same_view(value.view, target.view):
            return
        if target.view.buffer.space == HBM:
            store(target, value)
        elif value.view.buffer.space == HBM:
            b.emit("dma_copy", [("", _reshaped(value.view, target.shape)), ("", target.view)])
        elif not _retarget(value, target.view):
            b.emit("copy", [("", _reshaped(value.view, target.shape)), ("", target.view)])
    elif isinstance(value, (int, float)):
        if target.view.buffer.space == HBM:
            raise error("assigning a number to an HBM tensor; store a tile with nl.store")
        b.emit("memset", [("", target.view)], attrs={"value": _f64(value)})
    else:
        raise error(f"cannot assign a {type(value).__name__} to a tile")


def _accumulate(target: Tensor, other: Any, op: str) -> None:
    """``target op= other``: a matmul just made into PSUM accumulates there; anything else is
    an elementwise instruction writing ``target`` in place."""
    producer = other.producer if isinstance(other, Tensor) else None
    buf = target.view.buffer
    fresh = not buf.users
    if (
        op == "add"
        and producer is not None
        and producer.op == "matmul"
        and buf.space == PSUM
        and _retarget(other, target.view)
    ):
        producer.attrs["accumulate"] = ""
        # Accumulating into a PSUM tile nothing wrote yet starts from zero; hand-placed
        # tiles share buffers, so there each logical tile's first write starts.
        b = current()
        if target.logical is not None and target.logical[0].placement is not None:
            home = b.start_logical_tile(target)
            if home is not None:
                zero = _ir.Instr(
                    "memset",
                    "",
                    [("", target.view)],
                    {"value": _f64(0.0)},
                    _ir.user_location(),
                    [0],
                )
                b.insert_before_current(home, zero, producer)
        elif fresh and buf.block is not None:
            from torchneuron.nki import isa

            isa._zero_at_alloc(buf)
        return
    _binary(op, target, other, None, out=target)


# ----------------------------------------------------------------------------------------------
# Memory movement
# ----------------------------------------------------------------------------------------------


def _maskable(fn: Any) -> Any:
    """``fn`` with NKI's ``mask=``: its instructions run on the operands' masked part."""

    @functools.wraps(fn)
    def wrapper(*args: Any, mask: Any = None, **kwargs: Any) -> Any:
        if mask is None:
            return fn(*args, **kwargs)
        with current().masked(mask):
            return fn(*args, **kwargs)

    return wrapper


def load(src: Any, dtype: Any = None, mask: Any = None, **kwargs: Any) -> Tensor:
    """Copy an HBM tensor (a view of one) into a new SBUF tile, by DMA."""
    t = _tensor(src, "nl.load's source")
    if t.view.buffer.space != HBM:
        raise error(f"nl.load's source is in {t.buffer}; it must be an HBM tensor")
    out = _new(t.shape, _ir.as_dtype(dtype) if dtype is not None else t.dtype)
    return _produce(out, current().emit("dma_copy", [("", t.view), ("", out.view)]), 1)


def load_transpose2d(src: Any, dtype: Any = None, mask: Any = None) -> Tensor:
    """Load a 2-D HBM tensor [A, B] as an SBUF tile [B, A] with a transposing DMA."""
    t = _tensor(src, "nl.load_transpose2d's source")
    if t.view.buffer.space != HBM or len(t.shape) != 2:
        raise error("nl.load_transpose2d takes a 2-D HBM tensor")
    v = t.view
    tv = View(v.buffer, v.offset, (v.shape[1], v.shape[0]), (v.strides[1], v.strides[0]))
    out = _new(tv.shape, _ir.as_dtype(dtype) if dtype is not None else t.dtype)
    return _produce(out, current().emit("dma_copy", [("", tv), ("", out.view)]), 1)


def store(dst: Any, value: Any, mask: Any = None, **kwargs: Any) -> None:
    """Write an SBUF tile into an HBM tensor (a view of one), by DMA."""
    d = _tensor(dst, "nl.store's destination")
    if d.view.buffer.space != HBM:
        raise error(f"nl.store's destination is in {d.buffer}; it must be an HBM tensor")
    v = _on_chip(value, "nl.store's value")
    if v.view.buffer.space != SBUF:
        # DMA reads SBUF: a PSUM value is evicted by a VectorE copy first (as NKI does).
        v = copy(v)
    current().emit("dma_copy", [("", _reshaped(v.view, d.shape)), ("", d.view)])


def copy(x: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
    """A new SBUF tile with ``x``'s values (and ``dtype``): how PSUM results are evicted."""
    t = _on_chip(x, "nl.copy's source")
    out = _new(t.shape, _ir.as_dtype(dtype) if dtype is not None else t.dtype)
    return _produce(out, current().emit("copy", [("", t.view), ("", out.view)]), 1)


# ----------------------------------------------------------------------------------------------
# Elementwise arithmetic (VectorE) and activation functions (ScalarE)
# ----------------------------------------------------------------------------------------------


def _is_column(t: Tensor, other: Tensor) -> bool:
    return t.shape[0] == other.shape[0] and all(d == 1 for d in t.shape[1:])


def _binary(op: str, x: Any, y: Any, dtype: Any, out: Tensor | None = None) -> Any:
    b = current()
    xt, yt = isinstance(x, Tensor), isinstance(y, Tensor)
    if not xt and not yt:
        raise error(f"nl.{op} needs at least one tile operand")
    if xt:
        _on_chip(x, f"nl.{op}'s first operand")
    if yt:
        _on_chip(y, f"nl.{op}'s second operand")
    if xt and yt:
        res_dtype = _ir.promote(x.dtype, y.dtype)
    else:
        res_dtype = (x if xt else y).dtype
    if dtype is not None:
        res_dtype = _ir.as_dtype(dtype)
    if xt and yt and x.shape == y.shape:
        dst = out if out is not None else _new(x.shape, res_dtype)
        instr = b.emit(
            "tensor_tensor", [("", x.view), ("", y.view), ("", dst.view)], prefix=op + " "
        )
        return _produce(dst, instr, 2)
    if xt and yt:
        if _is_column(y, x):
            data, col, reverse = x, y, False
        elif _is_column(x, y):
            data, col, reverse = y, x, True
        else:
            raise error(
                f"nl.{op}: shapes {list(x.shape)} and {list(y.shape)} do not broadcast on the "
                "engines (a [P, 1] column broadcasts along the free dimensions; nothing "
                "broadcasts along partitions)"
            )
        dst = out if out is not None else _new(data.shape, res_dtype)
        if dst.shape != data.shape:
            raise error(f"nl.{op}: the result {list(data.shape)} does not fit {list(dst.shape)}")
        col_view = _reshaped(col.view, (col.shape[0], 1))
        instr = b.emit(
            "tensor_scalar",
            [("", data.view), ("", dst.view), ("scalar", col_view)],
            prefix=op + " ",
            attrs={"reverse": ""} if reverse else {},
        )
        return _produce(dst, instr, 1)
    data, imm, reverse = (x, y, False) if xt else (y, x, True)
    if not isinstance(imm, (int, float)):
        raise error(f"nl.{op}: {type(imm).__name__} operand is neither a tile nor a number")
    dst = out if out is not None else _new(data.shape, res_dtype)
    attrs = {"imm": _f64(imm)}
    if reverse:
        attrs["reverse"] = ""
    instr = b.emit("tensor_scalar", [("", data.view), ("", dst.view)], prefix=op + " ", attrs=attrs)
    return _produce(dst, instr, 1)


def add(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("add", x, y, dtype)


def subtract(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("subtract", x, y, dtype)


def multiply(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("multiply", x, y, dtype)


def divide(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("divide", x, y, dtype)


def maximum(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("max", x, y, dtype)


def minimum(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("min", x, y, dtype)


def power(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("pow", x, y, dtype)


def equal(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("eq", x, y, dtype)


def not_equal(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("ne", x, y, dtype)


def less(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("lt", x, y, dtype)


def less_equal(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("le", x, y, dtype)


def greater(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("gt", x, y, dtype)


def greater_equal(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("ge", x, y, dtype)


def logical_and(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("logical_and", x, y, dtype)


def logical_or(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("logical_or", x, y, dtype)


def logical_xor(x: Any, y: Any, dtype: Any = None, **kwargs: Any) -> Any:
    return _binary("logical_xor", x, y, dtype)


def _column(x: Any, what: str, rows: int) -> View:
    """A [P, 1] per-partition operand (a [P] or [P, 1] tile) as a view."""
    t = _on_chip(x, what)
    if math.prod(t.shape) != t.shape[0] or t.shape[0] != rows:
        raise error(
            f"{what} must be a [{rows}, 1] tile (one value per partition), got {list(t.shape)}"
        )
    return _reshaped(t.view, (t.shape[0], 1))


def _activation(func: str, x: Any, dtype: Any, scale: Any = 1.0, bias: Any = None) -> Tensor:
    t = _on_chip(x, f"nl.{func}'s operand")
    out = _new(t.shape, _ir.as_dtype(dtype) if dtype is not None else t.dtype)
    operands: list[tuple[str, View]] = [("", t.view), ("", out.view)]
    attrs: dict[str, str] = {}
    if bias is not None:
        operands.append(("bias", _column(bias, "bias", t.shape[0])))
    if isinstance(scale, Tensor):
        # A per-partition scale: ScalarE's scale column, read as fp32.
        col = _column(scale, "scale", t.shape[0])
        if scale.dtype != FLOAT32:
            col = copy(Tensor(current(), col), dtype=FLOAT32).view
        operands.append(("scale_col", col))
    elif float(scale) != 1.0:
        attrs["scale"] = _f64(scale)
    instr = current().emit("activation", operands, prefix=func + " ", attrs=attrs)
    return _produce(out, instr, 1)


def _unary(func: str, doc: str) -> Any:
    def fn(x: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
        return _activation(func, x, dtype)

    fn.__doc__ = f"{doc} (ScalarE activation ``{func}``)."
    return fn


exp = _unary("exp", "e**x")
log = _unary("log", "natural logarithm")
tanh = _unary("tanh", "hyperbolic tangent")
sigmoid = _unary("sigmoid", "logistic sigmoid")
relu = _unary("relu", "max(x, 0)")
gelu = _unary("gelu", "GELU (erf form)")
gelu_apprx_tanh = _unary("gelu_tanh", "GELU (tanh approximation)")
silu = _unary("silu", "x * sigmoid(x)")
sqrt = _unary("sqrt", "square root")
rsqrt = _unary("rsqrt", "1 / sqrt(x)")
abs = _unary("abs", "absolute value")  # noqa: A001 (NKI's name)
negative = _unary("neg", "-x")
reciprocal = _unary("reciprocal", "1 / x")
square = _unary("square", "x * x")
sin = _unary("sin", "sine")
cos = _unary("cos", "cosine")
sign = _unary("sign", "sign")
floor = _unary("floor", "floor")
ceil = _unary("ceil", "ceiling")
trunc = _unary("trunc", "truncation toward zero")
erf = _unary("erf", "error function")
log1p = _unary("log1p", "log(1 + x)")
expm1 = _unary("expm1", "exp(x) - 1")

# ----------------------------------------------------------------------------------------------
# Reductions (VectorE)
# ----------------------------------------------------------------------------------------------


def _reduce(op: str, name: str, x: Any, axis: Any, dtype: Any, keepdims: bool) -> Tensor:
    t = _on_chip(x, f"nl.{name}'s operand")
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    axes = sorted(int(a) % t.ndim for a in axes)
    if axes and 0 not in axes and axes != list(range(1, t.ndim)):
        return _reduce_some(op, name, t, axes, dtype)
    if axes != list(range(1, t.ndim)):
        raise error(
            f"nl.{name}(axis={axis}) on a {t.ndim}-d tile: the engines reduce all free axes "
            f"(axis={list(range(1, t.ndim))}); transpose to reduce along partitions"
        )
    out = _new((t.shape[0], 1), _ir.as_dtype(dtype) if dtype is not None else t.dtype)
    instr = current().emit("tensor_reduce", [("", t.view), ("", out.view)], prefix=op + " ")
    return _produce(out, instr, 1)


def _reduce_some(op: str, name: str, t: Tensor, axes: list[int], dtype: Any) -> Tensor:
    """A reduction over some free axes (average pooling's window axes): one VectorE
    ``tensor_tensor`` per element of the reduced window, on strided views of the tile (the
    engines' tensor_reduce folds every free axis into one column)."""
    v = t.view
    kept = [a for a in range(1, t.ndim) if a not in axes]
    window = [range(t.shape[a]) for a in axes]
    count = math.prod(len(r) for r in window)
    if count > 64:
        raise error(
            f"nl.{name}(axis={axes}) keeps free axes {kept} and reduces {count} elements per "
            "output; reducing only some free axes is supported up to 64 (reduce all free "
            "axes, or transpose)"
        )
    shape = (t.shape[0], *[t.shape[a] for a in kept])
    strides = (v.strides[0], *[v.strides[a] for a in kept])
    out = _new(shape, _ir.as_dtype(dtype) if dtype is not None else t.dtype)
    parts = []
    for idx in itertools.product(*window):
        offset = v.offset + builtins.sum(i * v.strides[a] for i, a in zip(idx, axes, strict=True))
        parts.append(Tensor(current(), View(v.buffer, offset, shape, strides)))
    if len(parts) == 1:
        return copy(parts[0], dtype=out.dtype)
    _binary(op, parts[0], parts[1], None, out=out)
    for part in parts[2:]:
        _binary(op, out, part, None, out=out)
    return out


def sum(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, **kw: Any) -> Tensor:  # noqa: A001
    """Sum over the free axes; the result is a [P, 1] column whatever ``keepdims``."""
    return _reduce("add", "sum", x, axis, dtype, keepdims)


def max(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, **kw: Any) -> Tensor:  # noqa: A001
    return _reduce("max", "max", x, axis, dtype, keepdims)


def min(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, **kw: Any) -> Tensor:  # noqa: A001
    return _reduce("min", "min", x, axis, dtype, keepdims)


def prod(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, **kw: Any) -> Tensor:
    return _reduce("multiply", "prod", x, axis, dtype, keepdims)


def mean(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, **kw: Any) -> Tensor:
    t = _on_chip(x, "nl.mean's operand")
    s = _reduce("add", "mean", t, axis, FLOAT32, keepdims)
    n = math.prod(t.shape[1:])
    return _binary("multiply", s, 1.0 / n, dtype or t.dtype)  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------------------
# TensorE
# ----------------------------------------------------------------------------------------------


def _in_sbuf(t: Tensor) -> Tensor:
    """TensorE reads SBUF: a PSUM operand of nl.matmul/nl.transpose (an earlier matmul's
    result) is copied there first, as NKI's compiler does, in the dtype it holds."""
    return copy(t) if t.view.buffer.space == PSUM else t


def _identity(dtype: DType) -> Tensor:
    """A 128x128 identity in SBUF, made once per kernel and dtype at its start (GpSimd iota of
    p - i, then VectorE p - i == 0)."""
    b = current()
    if dtype in b.identities:
        return b.identities[dtype]
    saved, b.block = b.block, b.root
    start = len(b.root.items)
    try:
        n = tile_size.pmax
        ramp = b.alloc((n, n), FLOAT32, SBUF)
        b.emit(
            "iota",
            [("", ramp.view)],
            attrs={
                "base": _f64(0.0),
                "channel_multiplier": _f64(1.0),
                "multipliers": "array<f64: -1.0>",
            },
        )
        ident = b.alloc((n, n), dtype, SBUF)
        b.emit(
            "tensor_scalar",
            [("", ramp.view), ("", ident.view)],
            prefix="eq ",
            attrs={"imm": _f64(0.0)},
        )
    finally:
        b.block = saved
    # Move what was just made to the kernel's start, ahead of every loop.
    made = b.root.items[start:]
    del b.root.items[start:]
    b.root.items[0:0] = made
    b.identities[dtype] = ident
    return ident


def transpose(x: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
    """Swap partitions and the free axis of a 2-D SBUF tile on TensorE (a matmul by the
    identity); the result is a PSUM tile (fp32)."""
    t = _in_sbuf(_on_chip(x, "nl.transpose's operand"))
    if t.ndim != 2:
        raise error(f"nl.transpose takes a 2-D tile, got shape {list(t.shape)}")
    p, f = t.shape
    ident = _identity(t.dtype)[0:p, 0:p]
    out = _new((f, p), FLOAT32, PSUM)
    instr = current().emit("matmul", [("", t.view), ("", ident.view), ("", out.view)])
    return _produce(out, instr, 2)


def matmul(x: Any, y: Any, transpose_x: bool = False, mask: Any = None, **kwargs: Any) -> Tensor:
    """``x @ y`` (``x.T @ y`` with ``transpose_x=True``) on TensorE into a new PSUM tile (fp32).
    With ``transpose_x=True``, x is the stationary [K, M] tile and y the moving [K, N] one, both
    in SBUF; without it x [M, K] is first transposed on TensorE. ``psum_tile += nl.matmul(...)``
    accumulates in PSUM."""
    xt = _in_sbuf(_on_chip(x, "nl.matmul's x"))
    yt = _in_sbuf(_on_chip(y, "nl.matmul's y"))
    if not transpose_x:
        xt = copy(transpose(xt), dtype=xt.dtype)
    return _nc_matmul(xt, yt)


def _nc_matmul(xt: Tensor, yt: Tensor) -> Tensor:
    """One TensorE matmul, stationary.T @ moving, into a new PSUM tile: the operands as given
    (nisa.nc_matmul's, which the verifier wants in SBUF)."""
    if xt.ndim != 2 or yt.ndim != 2:
        raise error("nl.matmul takes 2-D tiles")
    out = _new((xt.shape[1], yt.shape[1]), FLOAT32, PSUM)
    instr = current().emit("matmul", [("", xt.view), ("", yt.view), ("", out.view)])
    return _produce(out, instr, 2)


# ----------------------------------------------------------------------------------------------
# The rest of NKI's public API: named, so that a kernel using it learns at its line that it is
# not supported yet (rather than a bare AttributeError).
# ----------------------------------------------------------------------------------------------

_NOT_YET = {
    "all",
    "any",
    "arctan",
    "atomic_rmw",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "broadcast_to",
    "device_print",
    "dropout",
    "expand_dims",
    "gather_flattened",
    "invert",
    "left_shift",
    "loop_reduce",
    "mod",
    "fmod",
    "random_seed",
    "rand",
    "right_shift",
    "rms_norm",
    "select",
    "shared_identity_matrix",
    "softmax",
    "tan",
    "var",
    "where",
    "dynamic_range",
    "float8_e4m3",
    "float8_e5m2",
    "tfloat32",
    "uint16",
    "int16",
    "uint32",
}


def __getattr__(name: str) -> Any:
    if name in _NOT_YET:
        raise error(f"nl.{name} is not supported by torchneuron.nki yet")
    raise AttributeError(f"module 'torchneuron.nki.language' has no attribute {name!r}")


# Every call that makes instructions takes NKI's ``mask=``.
for _name in (
    "load", "load_transpose2d", "store", "copy", "add", "subtract", "multiply", "divide",
    "maximum", "minimum", "power", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "logical_and", "logical_or", "logical_xor", "exp", "log", "tanh",
    "sigmoid", "relu", "gelu", "gelu_apprx_tanh", "silu", "sqrt", "rsqrt", "abs", "negative",
    "reciprocal", "square", "sin", "cos", "sign", "floor", "ceil", "trunc", "erf", "log1p",
    "expm1", "sum", "max", "min", "prod", "mean", "transpose", "matmul", "full", "zeros",
    "ones",
):  # fmt: skip
    globals()[_name] = _maskable(globals()[_name])

# The engine operation behind each nl function that nki.isa instructions take as ``op=``.
ALU_OPS: dict[Any, str] = {
    add: "add",
    subtract: "subtract",
    multiply: "multiply",
    divide: "divide",
    maximum: "max",
    minimum: "min",
    power: "pow",
    equal: "eq",
    not_equal: "ne",
    less: "lt",
    less_equal: "le",
    greater: "gt",
    greater_equal: "ge",
    logical_and: "logical_and",
    logical_or: "logical_or",
    logical_xor: "logical_xor",
}
ACTIVATIONS: dict[Any, str] = {
    copy: "identity",  # nisa.activation(op=nl.copy): NKI's identity (scaled, biased)
    exp: "exp",
    log: "log",
    tanh: "tanh",
    sigmoid: "sigmoid",
    relu: "relu",
    gelu: "gelu",
    gelu_apprx_tanh: "gelu_tanh",
    silu: "silu",
    sqrt: "sqrt",
    rsqrt: "rsqrt",
    abs: "abs",
    negative: "neg",
    reciprocal: "reciprocal",
    square: "square",
    sin: "sin",
    cos: "cos",
    sign: "sign",
    floor: "floor",
    ceil: "ceil",
    trunc: "trunc",
    erf: "erf",
    log1p: "log1p",
    expm1: "expm1",
}
