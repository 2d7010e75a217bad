"""The tracer behind ``torchneuron.nki``: a kernel's calls become ``nisa`` dialect text.

A kernel runs once per argument signature with tracing values in place of its arrays. Every
``nl``/``nisa`` call appends an instruction to the current block (a loop body or the kernel);
each instruction remembers the kernel line that made it, which becomes its MLIR location, so the
compiler's diagnostics (verifiers, allocation) name that line. Indices are affine expressions in
the loop variables (:class:`Affine`); every operand is an access pattern (offset, sizes,
strides) over a buffer, written as a ``memref.reinterpret_cast`` exactly as the compiler's own
lowering writes them. Allocation, synchronisation and emission are the compiler's
(``_C.compile_kernel``).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Affine",
    "BlockTensor",
    "Builder",
    "DType",
    "IndexExpr",
    "KernelError",
    "Tensor",
    "current",
    "user_location",
]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class ParDim(int):
    """``nl.par_dim(n)``: marks the partition axis of a tile shape (the first unless marked)."""


class KernelError(Exception):
    """A kernel that cannot be traced or compiled; the message starts with ``file:line:``."""


Location = tuple[str, int]


def user_location() -> Location:
    """The innermost frame outside this package: the kernel line being traced."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if os.path.dirname(filename) != _PACKAGE_DIR:
            return (frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back  # type: ignore[assignment]
    return ("<unknown>", 0)


def error(message: str, loc: Location | None = None) -> KernelError:
    file, line = loc or user_location()
    return KernelError(f"{file}:{line}: error: {message}")


# ----------------------------------------------------------------------------------------------
# Data types
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DType:
    """An NKI data type: its name (also torch's and the program's) and MLIR element type."""

    name: str
    mlir: str
    itemsize: int
    is_float: bool

    def __repr__(self) -> str:
        return f"nl.{self.name}"


FLOAT32 = DType("float32", "f32", 4, True)
BFLOAT16 = DType("bfloat16", "bf16", 2, True)
FLOAT16 = DType("float16", "f16", 2, True)
INT32 = DType("int32", "i32", 4, False)
INT64 = DType("int64", "i64", 8, False)
INT8 = DType("int8", "i8", 1, False)
UINT8 = DType("uint8", "ui8", 1, False)
BOOL = DType("bool", "i1", 1, False)
DTYPES = {d.name: d for d in (FLOAT32, BFLOAT16, FLOAT16, INT32, INT64, INT8, UINT8, BOOL)}


def as_dtype(value: Any) -> DType:
    """An NKI dtype from ``nl.float32``, a NumPy/torch dtype or a name."""
    if isinstance(value, DType):
        return value
    name = getattr(value, "name", None)  # numpy dtypes and scalar types
    if name is None and isinstance(value, type):
        name = value.__name__
    if name is None:
        name = str(value).removeprefix("torch.")
    name = {"bool_": "bool", "bfloat16": "bfloat16"}.get(name, name)
    if name in DTYPES:
        return DTYPES[name]
    raise error(f"dtype {value!r} is not supported (supported: {', '.join(DTYPES)})")


def promote(a: DType, b: DType) -> DType:
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    return a if a.itemsize >= b.itemsize else b


# ----------------------------------------------------------------------------------------------
# Affine index expressions in the loop variables
# ----------------------------------------------------------------------------------------------


class Affine:
    """``const + sum(coeff * loop_var)``: a loop variable, ``nl.program_id``, or arithmetic on
    them with integers. Kernels may not branch on one (its value differs per iteration)."""

    __slots__ = ("const", "terms")

    def __init__(self, const: int = 0, terms: dict[int, int] | None = None) -> None:
        self.const = const
        self.terms = {k: v for k, v in (terms or {}).items() if v != 0}

    @staticmethod
    def of(value: Any) -> Affine:
        if isinstance(value, Affine):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            import numbers

            if isinstance(value, numbers.Integral):
                return Affine(int(value))
            raise error(f"index {value!r} is not an integer or a loop variable expression")
        return Affine(value)

    def is_const(self) -> bool:
        return not self.terms

    def __add__(self, other: Any) -> Any:
        if isinstance(other, IndexExpr):
            return other + self
        o = Affine.of(other)
        terms = dict(self.terms)
        for k, v in o.terms.items():
            terms[k] = terms.get(k, 0) + v
        return Affine(self.const + o.const, terms)

    __radd__ = __add__

    def __neg__(self) -> Affine:
        return Affine(-self.const, {k: -v for k, v in self.terms.items()})

    def __sub__(self, other: Any) -> Any:
        return self + (-other)

    def __rsub__(self, other: Any) -> Any:
        return (-self) + other

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, IndexExpr):
            return other * self
        o = Affine.of(other)
        if o.terms and self.terms:
            raise error("a product of two loop variables is not an affine index")
        k, scaled = (o.const, self) if not o.terms else (self.const, o)
        return Affine(scaled.const * k, {i: v * k for i, v in scaled.terms.items()})

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Affine:
        m = _positive_int(other, "//")
        # (c + m * k * i) // m == c // m + k * i: exact when m divides every coefficient.
        if all(v % m == 0 for v in self.terms.values()):
            return Affine(self.const // m, {k: v // m for k, v in self.terms.items()})
        raise error(
            f"{self} // {m}: dividing a loop variable by a number that does not divide its "
            "coefficient is not an affine index (iterate over the quotient)"
        )

    def __mod__(self, other: Any) -> Affine:
        m = _positive_int(other, "%")
        if all(v % m == 0 for v in self.terms.values()):
            return Affine(self.const % m)
        # A loop variable modulo m (software pipelining's `qk[i % 2]`): constant in each of a
        # loop body's copies once the loop's step is a multiple of m, so the loop is traced
        # with such copies (or unrolled when its trip count is no multiple of them).
        return current().modulo(self, m)

    def __index__(self) -> int:
        if self.is_const():
            return self.const
        if len(self.terms) == 1 and _CURRENT:
            # A loop variable indexing a Python list (NKI's lists of tiles): that loop, and
            # the earlier loops of its trip count that may have filled the list, unroll.
            (var,) = self.terms
            _CURRENT[-1].request_unroll(var)
        raise error(
            "a loop variable was used where Python needs a number; use nl.static_range to "
            "unroll the loop in Python"
        )

    def __bool__(self) -> bool:
        raise error(
            "a kernel cannot branch on a loop variable or program id (its value differs per "
            "iteration); use nl.static_range to unroll the loop in Python"
        )

    def __lt__(self, other: Any) -> bool:
        return self.__bool__()

    __le__ = __gt__ = __ge__ = __lt__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (int, Affine)) and not isinstance(other, bool):
            return self.__bool__()
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        return self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = [f"{v}*i{k}" for k, v in self.terms.items()]
        return " + ".join(parts + [str(self.const)]) if parts else str(self.const)


def _positive_int(value: Any, op: str) -> int:
    import numbers

    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0:
        return int(value)
    raise error(f"a loop variable {op} {value!r}: expected a positive integer")


class IndexExpr:
    """An NKI index expression (``nl.arange``, ``nl.mgrid``, arithmetic on them): a base
    (affine in loop variables) plus a coefficient per axis of a NumPy-like shape."""

    __slots__ = ("base", "coeffs", "shape")

    def __init__(self, base: Affine, coeffs: Sequence[int], shape: Sequence[int]) -> None:
        self.base = base
        self.coeffs = tuple(coeffs)
        self.shape = tuple(shape)

    @staticmethod
    def arange(start: int, stop: int, step: int = 1) -> IndexExpr:
        n = max(0, -(-(stop - start) // step))
        return IndexExpr(Affine(start), (step,), (n,))

    def __getitem__(self, key: Any) -> IndexExpr:
        # Only new axes and full slices: ``nl.arange(n)[:, None]``.
        key = key if isinstance(key, tuple) else (key,)
        coeffs, shape, axis = [], [], 0
        for k in key:
            if k is None:
                coeffs.append(0)
                shape.append(1)
            elif isinstance(k, slice) and k == slice(None):
                coeffs.append(self.coeffs[axis])
                shape.append(self.shape[axis])
                axis += 1
            else:
                raise error("index expressions take only ':' and None subscripts")
        coeffs += self.coeffs[axis:]
        shape += self.shape[axis:]
        return IndexExpr(self.base, coeffs, shape)

    def _aligned(self, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        pad = ndim - len(self.shape)
        return (0,) * pad + self.coeffs, (1,) * pad + self.shape

    def __add__(self, other: Any) -> IndexExpr:
        if isinstance(other, IndexExpr):
            ndim = max(len(self.shape), len(other.shape))
            ca, sa = self._aligned(ndim)
            cb, sb = other._aligned(ndim)
            shape = []
            for x, y in zip(sa, sb, strict=True):
                if x != y and 1 not in (x, y):
                    raise error(f"index shapes {self.shape} and {other.shape} do not broadcast")
                shape.append(max(x, y))
            return IndexExpr(
                self.base + other.base, [a + b for a, b in zip(ca, cb, strict=True)], shape
            )
        return IndexExpr(self.base + other, self.coeffs, self.shape)

    __radd__ = __add__

    def __neg__(self) -> IndexExpr:
        return IndexExpr(-self.base, [-c for c in self.coeffs], self.shape)

    def __sub__(self, other: Any) -> IndexExpr:
        return self + (-other)

    def __rsub__(self, other: Any) -> IndexExpr:
        return (-self) + other

    def __mul__(self, other: Any) -> IndexExpr:
        if isinstance(other, IndexExpr):
            raise error("a product of two index expressions is not an affine index")
        k = Affine.of(other)
        if not k.is_const():
            raise error("an index expression times a loop variable is not an affine index")
        return IndexExpr(self.base * k.const, [c * k.const for c in self.coeffs], self.shape)

    __rmul__ = __mul__

    # Comparisons make masks: ``i * 128 + i_p < n`` keeps the first rows of a partial tile.
    def _compare(self, op: str, other: Any) -> Mask:
        if isinstance(other, IndexExpr):
            raise error(
                "a mask comparing two index expressions (e.g. i_p >= i_f) is not supported "
                "yet; masks compare one index expression with a number"
            )
        return Mask([(self, op, Affine.of(other))])

    def __lt__(self, other: Any) -> Mask:  # type: ignore[override]
        return self._compare("<", other)

    def __le__(self, other: Any) -> Mask:  # type: ignore[override]
        return self._compare("<=", other)

    def __gt__(self, other: Any) -> Mask:  # type: ignore[override]
        return self._compare(">", other)

    def __ge__(self, other: Any) -> Mask:  # type: ignore[override]
        return self._compare(">=", other)

    def __repr__(self) -> str:
        return f"IndexExpr({self.base}, coeffs={self.coeffs}, shape={self.shape})"


class Mask:
    """NKI's ``mask=``: a conjunction of ``index_expr <op> bound`` conditions. Each condition
    must vary along at most one axis, where it keeps a contiguous range of indices; the
    instruction then runs on that range of every operand (a shortened access pattern). A
    condition that depends on a loop variable and cuts only the loop's last iteration makes
    the tracer peel that iteration off the loop (traced once more with a constant index)."""

    __slots__ = ("conds",)

    def __init__(self, conds: list[tuple[IndexExpr, str, Affine]]) -> None:
        self.conds = conds

    def __and__(self, other: Any) -> Mask:
        if not isinstance(other, Mask):
            raise error("masks combine with '&' only with other masks")
        return Mask(self.conds + other.conds)

    __rand__ = __and__

    def __or__(self, other: Any) -> Mask:
        raise error("masks joined with '|' are not supported (only '&' of conditions)")

    def __bool__(self) -> bool:
        raise error("a mask is not a Python condition; pass it as mask=...")

    def __repr__(self) -> str:
        return " & ".join(f"({e} {op} {b})" for e, op, b in self.conds)


def _range_of_cond(c: int, d: int, op: str, rel: int) -> tuple[int, int] | None:
    """The indices t in [0, d) with ``c * t <op> rel``, a range (None if empty)."""
    if op == "<":
        op, rel = "<=", rel - 1
    elif op == ">":
        op, rel = ">=", rel + 1
    if c == 0:
        ok = 0 <= rel if op == "<=" else 0 >= rel
        return (0, d) if ok else None
    if (op == "<=") == (c > 0):  # t <= floor(rel / c)
        lo, hi = 0, math.floor(rel / c) + 1
    else:  # t >= ceil(rel / c)
        lo, hi = math.ceil(rel / c), d
    lo, hi = max(lo, 0), min(hi, d)
    return (lo, hi) if lo < hi else None


class _Unroll(Exception):  # noqa: N818 (control flow, not an error)
    """Raised while tracing: the loops at these lines must unroll in Python."""

    def __init__(self, locs: set[Location]) -> None:
        super().__init__(locs)
        self.locs = locs


class _Peel(Exception):  # noqa: N818 (control flow, not an error)
    """Raised while tracing: loop ``var``'s last iteration must be traced on its own."""

    def __init__(self, loc: Location) -> None:
        super().__init__(loc)
        self.loc = loc


class _Retrace(Exception):  # noqa: N818 (control flow, not an error)
    """Raised after a trace that found what it must do differently: unroll the loops at
    ``unroll``, trace the loops at ``copies`` with a multiple of that many iterations per
    step, allocate the block tensors of the memories in ``split`` per tile, keep those
    larger than the memories in ``spill`` in HBM."""

    def __init__(
        self,
        unroll: set[Location],
        copies: dict[Location, int],
        split: set[str],
        spill: set[str] | None = None,
    ) -> None:
        super().__init__(unroll, copies, split)
        self.unroll, self.copies, self.split = unroll, copies, split
        self.spill = spill or set()


# ----------------------------------------------------------------------------------------------
# Buffers, views and instructions
# ----------------------------------------------------------------------------------------------

SBUF, PSUM, HBM = "sbuf", "psum", "hbm"


class Buffer:
    """A memref the kernel reads or writes: an input or output argument, or an allocation."""

    def __init__(self, kind: str, shape: Sequence[int], dtype: DType, space: str, loc: Location):
        self.kind = kind  # "input", "output", "alloc"
        self.shape = tuple(shape)
        self.dtype = dtype
        self.space = space
        self.loc = loc
        self.name = ""  # SSA name, given when rendered
        self.block: Block | None = None  # where an alloc was made
        self.position = 0  # its position in that block at the time
        self.users: list[Instr] = []
        self.returned = False
        self.address: int | None = None  # bytes per partition, when the kernel placed it

    @property
    def type(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        space = "" if self.space == HBM else f", #nisa.mem<{self.space}>"
        return f"memref<{dims}x{self.dtype.mlir}{space}>"

    def strides(self) -> tuple[int, ...]:
        strides, acc = [], 1
        for d in reversed(self.shape):
            strides.append(acc)
            acc *= d
        return tuple(reversed(strides))


@dataclass(eq=False)  # compared by identity: offsets are Affine, which refuses ==
class View:
    """An access pattern over a buffer, in elements: what every instruction operand is."""

    buffer: Buffer
    offset: Affine
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    # Index bounds this view breaks unless a mask shortens it first: (base, coefficient per
    # view axis, dimension size) for each indexed dimension, with the error to raise.
    checks: tuple[tuple[Affine, tuple[int, ...], int], ...] = ()
    oob: str = ""
    # Set on the whole of a block tensor allocated per tile: no instruction may take it.
    blocks: Blocks | None = None

    def type(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        strides = ", ".join("?" if s == 0 else str(s) for s in self.strides)
        space = "" if self.buffer.space == HBM else f", #nisa.mem<{self.buffer.space}>"
        return f"memref<{dims}x{self.buffer.dtype.mlir}, strided<[{strides}], offset: ?>{space}>"


@dataclass(eq=False)
class Instr:
    """One engine instruction: ``nisa.<op> <operands> {attrs}`` at a kernel line."""

    op: str
    prefix: str  # e.g. "exp " or "add " (the enum operand written before the views)
    operands: list[tuple[str, View]]  # (keyword before it, or "", view)
    attrs: dict[str, str]
    loc: Location
    writes: list[int] = field(default_factory=list)  # indices of written operands


@dataclass(eq=False)
class Loop:
    start: int
    stop: int
    step: int
    var: int
    body: Block
    loc: Location
    copies: int = 1  # iterations traced into the body per step
    count: int = 0  # the trip count the kernel asked for


class Block:
    def __init__(self, parent: Loop | None = None, outer: Block | None = None) -> None:
        self.items: list[Instr | Loop | Buffer] = []
        self.parent = parent
        self.outer = outer

    def ancestors(self) -> list[Block]:
        chain: list[Block] = []
        b: Block | None = self
        while b is not None:
            chain.append(b)
            b = b.outer
        return chain


@dataclass(frozen=True)
class ModAlloc:
    """NKI's hand allocation (``nki.compiler.sbuf.mod_alloc``/``psum.mod_alloc``): logical
    block index ``idx`` is the physical tile at ``base + linearize(idx % num_tiles) * size``
    per address component (PSUM bank, partition, bytes in the bank or SBUF partition), as
    NKI's reference ``modulo_allocate_func`` defines it."""

    space: str
    base_addr: int
    base_bank: int = 0
    base_partition: int = 0
    num_bank_tiles: tuple[int, ...] = ()
    num_par_tiles: tuple[int, ...] = ()
    num_free_tiles: tuple[int, ...] = ()

    def moduli(self, rank: int) -> list[int]:
        """Per block axis, the modulus that decides every address component."""
        out = [1] * rank
        for tiles in (self.num_bank_tiles, self.num_par_tiles, self.num_free_tiles):
            for axis, n in enumerate(tiles[:rank]):
                out[axis] = math.lcm(out[axis], n)
        return out

    def address(
        self, idx: Sequence[int], tile_bytes: int, bank_bytes: int, partitions: int = 128
    ) -> int:
        def component(base: int, tiles: tuple[int, ...], scale: int) -> int:
            shape = tiles or (1,) * len(idx)
            mod = [i % n for i, n in zip(idx, shape, strict=False)]
            linear, stride = 0, 1
            for m, n in reversed(list(zip(mod, shape, strict=False))):
                linear += m * stride
                stride *= n
            return base + linear * scale

        if component(self.base_partition, self.num_par_tiles, 1) != 0:
            raise error(
                f"nki.compiler.{self.space}.mod_alloc: tiles placed from a partition other "
                "than 0 (base_partition, num_par_tiles) are not supported by torchneuron.nki"
            )
        byte = component(self.base_addr, self.num_free_tiles, tile_bytes)
        if self.space == PSUM:
            return component(self.base_bank, self.num_bank_tiles, 1) * bank_bytes + byte
        return byte


@dataclass(frozen=True)
class FuncAlloc:
    """NKI's hand allocation by a function (``nki.compiler.sbuf.alloc(func)``/``psum``'s):
    ``func(idx, pdim_size, fdim_size)`` gives the physical tile of logical block index
    ``idx``: ``(start_partition, byte_addr)`` in SBUF, ``(bank, start_partition,
    byte_addr)`` in PSUM. It is called with numbers, so loops over the blocks unroll."""

    space: str
    func: Any

    def moduli(self, rank: int) -> list[int] | None:
        return None

    def address(
        self, idx: Sequence[int], tile_bytes: int, bank_bytes: int, partitions: int = 128
    ) -> int:
        where = self.func(tuple(idx), partitions, tile_bytes)
        where = tuple(int(w) for w in (where if isinstance(where, (tuple, list)) else (where,)))
        want = 3 if self.space == PSUM else 2
        name = f"nki.compiler.{self.space}.alloc"
        if len(where) != want:
            raise error(f"{name}: the function returned {where}, expected {want} integers")
        if where[-2] != 0:
            raise error(f"{name}: tiles from partition {where[-2]} are not supported (only 0)")
        if self.space == PSUM:
            return where[0] * bank_bytes + where[2]
        return where[1]


class Blocks:
    """A tensor with NKI block dimensions, ``(n, par_dim(p), f)``, whose n tiles ``[p, f]``
    are buffers of their own, each made when the kernel first uses it: NKI's block axes are
    logical and its compiler gives each tile memory only while the tile is live (NKI's
    block dimension migration guide). With hand allocation (``mod_alloc``) logical tiles
    that share a physical tile share one buffer at that address."""

    def __init__(
        self,
        block_shape: tuple[int, ...],
        tile_shape: tuple[int, ...],
        dtype: DType,
        space: str,
        loc: Location,
        home: Block,
        placement: ModAlloc | FuncAlloc | None,
    ) -> None:
        self.block_shape, self.tile_shape = block_shape, tile_shape
        self.dtype, self.space, self.loc = dtype, space, loc
        self.home = home  # the block that declared the tensor
        self.placement = placement
        self.tiles: dict[Any, Buffer] = {}
        self.started: set[Any] = set()  # logical tiles written so far (by index as written)


def _contiguous(v: View) -> bool:
    expected = 1
    for d, st in reversed(list(zip(v.shape, v.strides, strict=True))):
        if d != 1 and st != expected:
            return False
        expected *= d
    return True


# ----------------------------------------------------------------------------------------------
# The values a kernel sees
# ----------------------------------------------------------------------------------------------


class Tensor:
    """An NKI tensor or tile: a view of an HBM buffer, or of an SBUF/PSUM tile. Indexing gives a
    view; arithmetic operators are the ``nl`` functions of the same name."""

    def __init__(self, builder: Builder, view: View) -> None:
        self._builder = builder
        self.view = view
        # The instruction that wrote this whole tile last, while no one has read it: an
        # assignment or ``+=`` may retarget it instead of copying.
        self.producer: Instr | None = None
        # For a tile of a block tensor allocated per tile: its tensor and logical block index.
        self.logical: tuple[Blocks, tuple[Affine, ...]] | None = None

    # -- NKI tensor attributes --
    @property
    def shape(self) -> tuple[int, ...]:
        return self.view.shape

    @property
    def dtype(self) -> DType:
        return self.view.buffer.dtype

    @property
    def buffer(self) -> str:
        return self.view.buffer.space

    @property
    def ndim(self) -> int:
        return len(self.view.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.buffer}, {list(self.shape)}, {self.dtype})"

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self) -> Iterator[Any]:
        raise error("iterating over a tensor is not supported; index it instead")

    def __bool__(self) -> bool:
        raise error("a kernel cannot branch on a tensor's values")

    # -- indexing --
    def __getitem__(self, key: Any) -> Tensor:
        return Tensor(self._builder, self._builder.index(self.view, key))

    def __setitem__(self, key: Any, value: Any) -> None:
        from torchneuron.nki import language

        target = self[key]
        language._assign(target, value)

    def reshape(self, shape: Sequence[int]) -> Tensor:
        """The same elements with another shape (a contiguous tensor or tile only)."""
        shape = tuple(int(d) for d in shape)
        v = self.view
        if math.prod(shape) != math.prod(v.shape):
            raise error(f"cannot reshape {list(v.shape)} to {list(shape)}")
        if not _contiguous(v):
            raise error("reshape needs a contiguous tensor (index after reshaping)")
        buf = Buffer("view", shape, v.buffer.dtype, v.buffer.space, v.buffer.loc)
        return Tensor(self._builder, View(v.buffer, v.offset, shape, buf.strides()))

    def ap(self, pattern: Sequence[Sequence[int]], offset: int = 0, **kwargs: Any) -> Tensor:
        """NKI's access pattern: ``[[stride, size], ...]`` in elements over this tensor's
        buffer (the first pair is the partition axis), from ``offset``."""
        if self.view.oob:
            raise KernelError(self.view.oob)
        strides = tuple(int(p[0]) for p in pattern)
        shape = tuple(int(p[1]) for p in pattern)
        v = self.view
        hi = sum((d - 1) * abs(st) for st, d in zip(strides, shape, strict=True))
        lo_off, hi_off = self._builder.range_of(v.offset + offset)
        if lo_off < 0 or hi_off + hi >= math.prod(v.buffer.shape):
            raise error(f"access pattern {list(map(list, pattern))} leaves the tensor")
        return Tensor(self._builder, View(v.buffer, v.offset + offset, shape, strides))

    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        """Repeat unit dimensions up to ``shape``: a zero-stride view (a DMA reads it as often
        as it is repeated); a tile repeated along partitions is copied by a broadcasting DMA."""
        shape = tuple(int(d) for d in shape)
        v = self.view
        if len(shape) != len(v.shape) or any(
            a != b and a != 1 for a, b in zip(v.shape, shape, strict=True)
        ):
            raise error(f"cannot broadcast {list(v.shape)} to {list(shape)}")
        strides = tuple(
            0 if a == 1 and b != 1 else s for a, b, s in zip(v.shape, shape, v.strides, strict=True)
        )
        view = View(v.buffer, v.offset, shape, strides)
        if v.buffer.space == HBM or v.shape[0] == shape[0]:
            return Tensor(self._builder, view)
        out = self._builder.alloc(shape, v.buffer.dtype, SBUF)
        self._builder.emit("dma_copy", [("", view), ("", out.view)])
        return out

    @property
    def T(self) -> Tensor:  # noqa: N802 (NKI's spelling)
        from torchneuron.nki import language

        return language.transpose(self)

    # -- arithmetic (the nl functions) --
    def _binary(name: str, reverse: bool = False) -> Any:  # type: ignore[misc]  # noqa: N805
        def method(self: Tensor, other: Any) -> Tensor:
            from torchneuron.nki import language

            fn = getattr(language, name)
            return fn(other, self) if reverse else fn(self, other)

        return method

    __add__ = _binary("add")
    __radd__ = _binary("add", reverse=True)
    __sub__ = _binary("subtract")
    __rsub__ = _binary("subtract", reverse=True)
    __mul__ = _binary("multiply")
    __rmul__ = _binary("multiply", reverse=True)
    __truediv__ = _binary("divide")
    __rtruediv__ = _binary("divide", reverse=True)
    __pow__ = _binary("power")
    __lt__ = _binary("less")
    __le__ = _binary("less_equal")
    __gt__ = _binary("greater")
    __ge__ = _binary("greater_equal")
    __eq__ = _binary("equal")  # type: ignore[assignment]
    __ne__ = _binary("not_equal")  # type: ignore[assignment]
    __hash__ = object.__hash__  # type: ignore[assignment]

    def __neg__(self) -> Tensor:
        from torchneuron.nki import language

        return language.negative(self)

    def __iadd__(self, other: Any) -> Tensor:
        from torchneuron.nki import language

        language._accumulate(self, other, "add")
        return self

    def __isub__(self, other: Any) -> Tensor:
        from torchneuron.nki import language

        language._accumulate(self, other, "subtract")
        return self

    def __imul__(self, other: Any) -> Tensor:
        from torchneuron.nki import language

        language._accumulate(self, other, "multiply")
        return self


class BlockTensor(Tensor):
    """A tensor whose block dimensions are allocated per tile (:class:`Blocks`): indexing
    selects one tile (every block axis a number or loop expression) and then indexes it."""

    def __init__(self, builder: Builder, view: View, blocks: Blocks) -> None:
        super().__init__(builder, view)
        self.blocks = blocks

    def __getitem__(self, key: Any) -> Tensor:
        view, logical = self._builder.block_tile(self.blocks, key)
        t = Tensor(self._builder, view)
        t.logical = (self.blocks, logical)
        return t


class SpilledTensor(Tensor):
    """A block tensor larger than its memory whose tiles do not fit even one by one (all
    live at once, as in the attention tutorial's v3): kept in HBM scratch, as NKI's compiler
    spills it. Reading a tile loads it into a new SBUF tile; writing one stores it."""

    def __getitem__(self, key: Any) -> Tensor:
        from torchneuron.nki import language

        return language.load(Tensor(self._builder, self._builder.index(self.view, key)))

    def __setitem__(self, key: Any, value: Any) -> None:
        from torchneuron.nki import language

        language._assign(Tensor(self._builder, self._builder.index(self.view, key)), value)


# ----------------------------------------------------------------------------------------------
# The builder
# ----------------------------------------------------------------------------------------------

_CURRENT: list[Builder] = []


def current() -> Builder:
    """The builder of the kernel being traced; outside a kernel, an error naming the call."""
    if not _CURRENT:
        raise KernelError(
            "nki.language functions run only while a @nki.jit kernel is traced "
            "(call the kernel, or nki.simulate_kernel(kernel, ...))"
        )
    return _CURRENT[-1]


class Builder:
    def __init__(self, name: str, grid: tuple[int, ...], target: str, rotate: int = 1) -> None:
        self.name = name
        self.rotate = rotate  # copies of an affine_range iteration per loop step
        self.grid = grid
        self.target = target
        self.root = Block()
        self.block = self.root
        self.inputs: list[Buffer] = []
        self.buffers: list[Buffer] = []
        self.loops: dict[int, Loop] = {}
        self.grid_vars: list[Affine] = []
        self.identities: dict[DType, Tensor] = {}
        self.def_loc: Location = ("<unknown>", 0)
        # Bytes per partition a program may allocate, by memory (from the target): how much
        # of it rotating loop bodies may hold at once.
        self.capacity: dict[str, int] = {}
        self.next_var = 0  # loop variables are numbered in creation order, stable per trace
        # Loops (by line) whose last iteration is traced on its own, and loops unrolled.
        self.peel: set[Location] = set()
        self.unroll: set[Location] = set()
        # Axis ranges ([axis, extent, lo, hi) or None: skip) of the mask= of the call being
        # traced; emit() shortens operands to them.
        self.mask: list[tuple[int, int, int, int]] | None = None
        self.mask_skip = False
        self.hoist = 1.0  # the share of memory _Renderer._hoist may use (0: none)
        # nl.shared_constant values (CPU torch tensors): kernel inputs after the arrays.
        self.constants: list[Any] = []
        # nisa-allocate's choice among free addresses: "least_recent" keeps a new tile off
        # the bytes a tile just freed (whose readers may still run), "lowest" packs tighter.
        self.reuse = "least_recent"
        # From earlier traces: loops (by line) traced with a multiple of that many iterations
        # per step, memories whose block tensors are all allocated per tile.
        self.copies_need: dict[Location, int] = {}
        self.split: set[str] = set()
        # Found by this trace, for the next (see _Retrace).
        self.want_unroll: set[Location] = set()
        self.want_copies: dict[Location, int] = {}
        self.want_split: set[str] = set()
        self.whole_blocks: set[str] = set()  # memories holding a block tensor
        self.over_blocks: set[str] = set()  # memories with a block tensor larger than them
        self.spill: set[str] = set()  # from earlier traces: spill those to HBM
        self.psum_bank_bytes = 0

    def __enter__(self) -> Builder:
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.pop()

    # -- buffers --
    def input(self, shape: Sequence[int], dtype: DType, loc: Location) -> Tensor:
        buf = Buffer("input", shape, dtype, HBM, loc)
        self.inputs.append(buf)
        return self.full_view(buf)

    def alloc(
        self,
        shape: Sequence[int],
        dtype: DType,
        space: str,
        loc: Location | None = None,
        placement: ModAlloc | FuncAlloc | None = None,
    ) -> Tensor:
        loc = loc or user_location()
        if not shape or any(int(d) <= 0 for d in shape):
            raise error(f"tensor shape {list(shape)} must have positive sizes", loc)
        # NKI's block dimensions: in (n, par_dim(128), f) the partition axis is the second;
        # the buffer puts it first ([128, n, f]) and the tensor is a view with its axes in
        # the kernel's order, so t[i] is the [128, f] tile i.
        part = next((i for i, d in enumerate(shape) if isinstance(d, ParDim)), 0)
        shape = tuple(int(d) for d in shape)
        physical = (shape[part], *shape[:part], *shape[part + 1 :])
        buf = Buffer("alloc", physical, dtype, space, loc)
        ps = buf.strides()
        strides = (*ps[1 : part + 1], ps[0], *ps[part + 1 :])
        if part > 0 and space != HBM:
            # One buffer for the whole tensor is the compact choice (a loop over its tiles
            # stays a loop); a tensor larger than its memory has its tiles allocated one by
            # one, and then so have the other block tensors of that memory.
            over = _bytes_per_partition(buf) > self.capacity.get(space, 1 << 62)
            if over and space not in self.split:
                self.want_split.add(space)
            self.whole_blocks.add(space)
            if over and placement is None:
                self.over_blocks.add(space)
                if space in self.spill:
                    hbm = Buffer("alloc", physical, dtype, HBM, loc)
                    hbm.block, hbm.position = self.block, len(self.block.items)
                    self.block.items.append(hbm)
                    self.buffers.append(hbm)
                    return SpilledTensor(self, View(hbm, Affine(0), shape, strides))
            if placement is not None or over or space in self.split:
                blocks = Blocks(
                    shape[:part],
                    physical[:1] + physical[1 + part :],
                    dtype,
                    space,
                    loc,
                    self.block,
                    placement,
                )
                view = View(buf, Affine(0), shape, strides, blocks=blocks)
                return BlockTensor(self, view, blocks)
        buf.block = self.block
        buf.position = len(self.block.items)
        self.block.items.append(buf)
        self.buffers.append(buf)
        if placement is not None:
            buf.address = placement.address(
                (), _bytes_per_partition(buf), self.psum_bank_bytes, buf.shape[0]
            )
        if part == 0:
            return self.full_view(buf)
        return Tensor(self, View(buf, Affine(0), shape, strides))

    def block_tile(self, blocks: Blocks, key: Any) -> tuple[View, tuple[Affine, ...]]:
        """The view ``t[key]`` of a block tensor allocated per tile: its block indices pick
        the tile (made on first use), the rest index the tile."""
        key = key if isinstance(key, tuple) else (key,)
        nb = len(blocks.block_shape)
        rank = nb + len(blocks.tile_shape)
        if any(k is Ellipsis for k in key):
            i = next(n for n, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (rank - len(key) + 1) + key[i + 1 :]
        shape = [*blocks.block_shape, *blocks.tile_shape]
        if len(key) < nb:
            raise error(
                f"a tensor of block shape {list(blocks.block_shape)} is used one tile at a "
                f"time here (NKI allocates block tiles separately): index all {nb} block "
                "dimensions"
            )
        idx: list[Affine] = []
        for k, n in zip(key[:nb], blocks.block_shape, strict=True):
            if isinstance(k, slice):
                r = range(n)[k]
                if len(r) != 1:
                    raise error(
                        f"a slice over a block dimension (size {n}) of tensor "
                        f"{shape}: its tiles are allocated separately, so an instruction "
                        "takes one tile; index the block dimension with a number or loop "
                        "variable"
                    )
                a = Affine(r.start)
            elif isinstance(k, IndexExpr):
                raise error("index a block dimension with a number or loop variable")
            else:
                a = Affine.of(k)
            lo, hi = self.range_of(a)
            if lo < 0 or hi >= n:
                raise error(
                    f"index out of bounds: [{lo}, {hi}] on a block dimension of size {n} "
                    f"(tensor shape {shape})"
                )
            idx.append(a)
        logical = tuple(idx)
        moduli = blocks.placement.moduli(nb) if blocks.placement is not None else None
        if moduli is not None:
            idx = [a % m for a, m in zip(idx, moduli, strict=True)]
        consts = []
        for a, n in zip(idx, blocks.block_shape, strict=True):
            # A tile per loop iteration: the loops its index depends on unroll (until then
            # the trace goes on with a stand-in tile).
            for var in a.terms:
                self.want_unroll.add(self.loops[var].loc)
            consts.append(min(max(a.const, 0), n - 1))
        tile = self.block_buffer(blocks, tuple(consts))
        return self.index(self.full_view(tile).view, key[nb:]), logical

    def start_logical_tile(self, t: Tensor) -> Block | None:
        """The first write of a block tensor's logical tile ``t`` (its index as written):
        the block where that tile's life starts (the tensor's, or the body of the innermost
        loop its index depends on), or None when it was written before."""
        assert t.logical is not None
        blocks, idx = t.logical
        key = tuple((a.const, tuple(sorted(a.terms.items()))) for a in idx)
        if key in blocks.started:
            return None
        blocks.started.add(key)
        homes = {id(blocks.home)} | {id(self.loops[v].body) for a in idx for v in a.terms}
        return next((b for b in self.block.ancestors() if id(b) in homes), self.block)

    def insert_before_current(self, block: Block, instr: Instr, last: Instr) -> None:
        """Put ``instr`` in ``block`` (an ancestor of the current block) before the item that
        holds ``last``, the current block's last instruction."""
        item: Any = last
        b = self.block
        while b is not block:
            item, b = b.parent, b.outer  # type: ignore[assignment]
        pos = block.items.index(item)
        block.items.insert(pos, instr)
        for _, v in instr.operands:
            v.buffer.users.append(instr)

    def block_buffer(self, blocks: Blocks, idx: tuple[int, ...]) -> Buffer:
        """The buffer of tile ``idx`` of ``blocks``, made where the kernel declared the tensor
        (before the loop of this block that first uses it)."""
        tile_bytes = math.prod(blocks.tile_shape[1:]) * blocks.dtype.itemsize
        address = None
        tid: Any = idx
        if blocks.placement is not None:
            address = blocks.placement.address(
                idx, tile_bytes, self.psum_bank_bytes, blocks.tile_shape[0]
            )
            tid = address
        buf = blocks.tiles.get(tid)
        if buf is not None:
            return buf
        buf = Buffer("alloc", blocks.tile_shape, blocks.dtype, blocks.space, blocks.loc)
        buf.address = address
        home = blocks.home
        chain = self.block.ancestors()
        if home not in chain:
            home = self.block
        item: Any = None
        b = self.block
        while b is not home:
            item, b = b.parent, b.outer  # type: ignore[assignment]
        pos = len(home.items) if item is None else home.items.index(item)
        home.items.insert(pos, buf)
        buf.block, buf.position = home, pos
        self.buffers.append(buf)
        blocks.tiles[tid] = buf
        return buf

    def modulo(self, a: Affine, m: int) -> Affine:
        """``a % m``: a number in every copy of the loops' bodies whose step (iterations per
        step times the loop's own) is a multiple of what m needs; other loops are asked to
        be traced so (the result is a placeholder until they are)."""
        const = a.const
        for var, coeff in a.terms.items():
            loop = self.loops.get(var)
            if loop is None:
                raise error(f"{a} % {m}: not a loop variable")
            if coeff * loop.step % m == 0:
                const += coeff * loop.start
                continue
            base = loop.step // loop.copies
            need = m // math.gcd(coeff * base, m)
            have = self.copies_need.get(loop.loc, 1)
            self.want_copies[loop.loc] = math.lcm(have, self.want_copies.get(loop.loc, 1), need)
        return Affine(const % m)

    def retrace_request(self) -> _Retrace | None:
        if self.want_unroll - self.unroll or self.want_copies or self.want_split - self.split:
            return _Retrace(set(self.want_unroll), dict(self.want_copies), set(self.want_split))
        return None

    def full_view(self, buf: Buffer) -> Tensor:
        return Tensor(self, View(buf, Affine(0), buf.shape, buf.strides()))

    # -- loops --
    def loop(self, start: int, stop: int, step: int, rotate: int = 1) -> Iterator[Affine]:
        """One ``scf.for``. With ``rotate`` > 1 (independent iterations) the body is traced
        that many times per loop step, so each copy has tiles of its own: the next
        iterations' loads fill their tiles while the engines work on this one's."""
        loc = user_location()
        if step <= 0:
            raise error("loop steps must be positive", loc)
        var = self.next_var
        self.next_var += 1
        count = len(range(start, stop, step))
        peel = loc in self.peel and count > 0
        main = count - 1 if peel else count
        # Copies a modulo of the loop variable needs (Affine.__mod__); a trip count that is
        # no multiple of them unrolls the loop.
        need = self.copies_need.get(loc, 1)
        if loc in self.unroll or main % need:
            for i in range(start, stop, step):
                yield Affine(i)
            return
        if main > 0:
            copies = next(
                c
                for u in (rotate, 4, 2, 1)
                if u <= rotate
                for c in (math.lcm(u, need),)
                if main % c == 0
            )
            body = Block(outer=self.block)
            loop = Loop(start, start + main * step, step * copies, var, body, loc, copies, count)
            body.parent = loop
            self.loops[var] = loop
            self.block.items.append(loop)
            self.block = body
            try:
                for k in range(copies):
                    yield Affine(k * step, {var: 1})
            finally:
                self.block = body.outer  # type: ignore[assignment]
        if peel:
            # The partial last iteration, after the loop: its index is a number, so masks
            # on it become static shortened access patterns.
            yield Affine(start + (count - 1) * step)

    def request_unroll(self, var: int) -> None:
        loop = self.loops.get(var)
        if loop is None:
            return
        home = loop.body.outer
        assert home is not None
        chain = home.ancestors()
        locs = {loop.loc}
        for other in self.loops.values():
            if (
                other.var < var
                and other.count == loop.count
                and other.body.outer in chain
                and other.loc not in self.unroll
            ):
                locs.add(other.loc)
        if not locs <= self.unroll:
            raise _Unroll(locs)

    # -- masks --
    @contextlib.contextmanager
    def masked(self, mask: Any) -> Iterator[None]:
        """Instructions emitted inside run on the part of their operands ``mask`` keeps."""
        if mask is None:
            yield
            return
        if not isinstance(mask, Mask):
            raise error(
                f"mask={mask!r}: expected a comparison of an index expression with a number, "
                "e.g. mask=(i * 128 + i_p < n)"
            )
        ranges = self.mask_ranges(mask)
        saved = (self.mask, self.mask_skip)
        if ranges is None:
            self.mask_skip = True
        else:
            self.mask = (self.mask or []) + ranges
        try:
            yield
        finally:
            self.mask, self.mask_skip = saved

    def mask_ranges(self, mask: Mask) -> list[tuple[int, int, int, int]] | None:
        """``mask`` as (axis, extent, lo, hi) ranges of the instruction's axes (None: the
        instruction runs nowhere). Peels a loop (``_Peel``) whose last iteration alone is
        partial."""
        ranges: list[tuple[int, int, int, int]] = []
        for expr, op, bound in mask.conds:
            axes = [
                (i, c, d)
                for i, (c, d) in enumerate(zip(expr.coeffs, expr.shape, strict=True))
                if c != 0 and d > 1
            ]
            if len(axes) > 1:
                raise error(
                    f"mask {expr} {op} {bound} varies along several axes; masks keep "
                    "a range of one axis per condition"
                )
            rel = bound - expr.base  # condition: c * t  op  rel
            if not isinstance(rel, Affine):
                raise error(f"mask bound {bound!r} is not a number")
            axis, c, d = axes[0] if axes else (0, 0, 1)
            if rel.is_const():
                r = _range_of_cond(c, d, op, rel.const)
                if r is None:
                    return None
                if r != (0, d):
                    ranges.append((axis, d, r[0], r[1]))
                continue
            # Depends on loop variables: every iteration but the last must be whole.
            if len(rel.terms) != 1:
                raise error(f"mask {expr} {op} {bound} depends on several loop variables")
            ((var, coeff),) = rel.terms.items()
            loop = self.loops.get(var)
            if loop is None:
                raise error(f"mask {expr} {op} {bound}: unknown loop variable")
            values = list(range(loop.start, loop.stop, loop.step))
            partial = [
                v for v in values if _range_of_cond(c, d, op, rel.const + coeff * v) != (0, d)
            ]
            if not partial:
                continue
            if loop.loc not in self.peel and partial == [values[-1]]:
                raise _Peel(loop.loc)
            raise error(
                f"mask {expr} {op} {bound} cuts iterations other than the last of the loop "
                f"at line {loop.loc[1]}; only a partial last tile is supported"
            )
        return ranges

    def clip(self, v: View, ranges: list[tuple[int, int, int, int]]) -> View:
        """``v`` shortened to the mask's ranges on the axes where it has the mask's extent."""
        offset, shape, checks = v.offset, list(v.shape), list(v.checks)
        for mask_axis, extent, lo, hi in ranges:
            axis = mask_axis
            if axis >= len(shape) or shape[axis] != extent:
                # The mask's grid may have more axes than the operand (mgrid's unit axes):
                # its free axis is the operand's one free axis of that extent.
                same = [j for j in range(1, len(shape)) if shape[j] == extent]
                if mask_axis == 0 or len(same) != 1:
                    continue
                axis = same[0]
            offset = offset + lo * v.strides[axis]
            shape[axis] = hi - lo
            checks = [(base + coeffs[axis] * lo, coeffs, size) for base, coeffs, size in checks]
        out = View(v.buffer, offset, tuple(shape), v.strides, tuple(checks), v.oob)
        if out.checks and self._in_bounds(out):
            out.checks, out.oob = (), ""
        return out

    def _in_bounds(self, v: View) -> bool:
        for base, coeffs, size in v.checks:
            lo, hi = self.range_of(base)
            for c, d in zip(coeffs, v.shape, strict=True):
                lo += min(0, c * (d - 1))
                hi += max(0, c * (d - 1))
            if lo < 0 or hi >= size:
                return False
        return True

    def range_of(self, a: Affine) -> tuple[int, int]:
        lo = hi = a.const
        for var, coeff in a.terms.items():
            loop = self.loops[var]
            last = loop.start + max(0, (loop.stop - loop.start - 1) // loop.step) * loop.step
            lo += min(coeff * loop.start, coeff * last)
            hi += max(coeff * loop.start, coeff * last)
        return lo, hi

    # -- views --
    def index(self, view: View, key: Any) -> View:
        """The view ``view[key]``: integers and loop expressions select, slices and index
        expressions make the axes of the result (NumPy's basic and advanced indexing)."""
        if view.oob:
            raise KernelError(view.oob)
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            i = next(n for n, k in enumerate(key) if k is Ellipsis)
            fill = (slice(None),) * (len(view.shape) - len(key) + 1)
            key = key[:i] + fill + key[i + 1 :]
        if len(key) > len(view.shape):
            raise error(f"{len(key)} indices for a tensor of rank {len(view.shape)}")
        key = key + (slice(None),) * (len(view.shape) - len(key))
        advanced = [k for k in key if isinstance(k, IndexExpr)]
        exprs: list[IndexExpr] = []
        if advanced:
            ndim = max(len(k.shape) for k in advanced)
            for k, size in zip(key, view.shape, strict=True):
                if isinstance(k, IndexExpr):
                    exprs.append(k)
                elif isinstance(k, slice):
                    if k != slice(None) or size != 1:
                        raise error(
                            "mixing slices with nl.arange/nl.mgrid indices is not supported"
                        )
                    exprs.append(IndexExpr(Affine(0), (), ()))
                else:
                    exprs.append(IndexExpr(Affine.of(k), (), ()))
        else:
            slices = [k for k in key if isinstance(k, slice)]
            ndim = len(slices)
            axis = 0
            for k, size in zip(key, view.shape, strict=True):
                if isinstance(k, slice):
                    start = Affine(0) if k.start is None else Affine.of(k.start)
                    step = 1 if k.step is None else int(k.step)
                    if k.stop is None:
                        stop = Affine(size)
                    else:
                        stop = Affine.of(k.stop)
                    extent = stop - start
                    if not isinstance(extent, Affine) or not extent.is_const():
                        raise error("a slice's length must not depend on a loop variable")
                    n = max(0, -(-extent.const // step))
                    coeffs = [0] * ndim
                    shape = [1] * ndim
                    coeffs[axis], shape[axis] = step, n
                    exprs.append(IndexExpr(start, coeffs, shape))
                    axis += 1
                else:
                    exprs.append(IndexExpr(Affine.of(k), (), ()))
        shape = [1] * ndim
        for e in exprs:
            _, s = e._aligned(ndim)
            for i, d in enumerate(s):
                if d != 1:
                    if shape[i] not in (1, d):
                        raise error("index expressions do not broadcast to one shape")
                    shape[i] = d
        offset = view.offset
        strides = [0] * ndim
        checks: list[tuple[Affine, tuple[int, ...], int]] = []
        oob = ""
        for e, stride, size in zip(exprs, view.strides, view.shape, strict=True):
            coeffs, s = e._aligned(ndim)
            lo, hi = self.range_of(e.base)
            for c, d in zip(coeffs, s, strict=True):
                lo += min(0, c * (d - 1))
                hi += max(0, c * (d - 1))
            # Out of bounds is an error when an instruction uses the view, unless its mask=
            # shortens the view back inside first.
            checks.append((e.base, tuple(coeffs), size))
            if (lo < 0 or hi >= size) and not oob:
                oob = str(
                    error(
                        f"index out of bounds: [{lo}, {hi}] on a dimension of size {size} "
                        f"(tensor shape {list(view.shape)})"
                    )
                )
            offset = offset + e.base * stride
            for i, c in enumerate(coeffs):
                strides[i] += c * stride
        # Axes of extent 1 carry no stride; a zero stride of one would be a needless broadcast.
        strides = [
            s if d != 1 else (strides[i] or 1)
            for i, (s, d) in enumerate(zip(strides, shape, strict=True))
        ]
        if advanced and ndim > len(view.shape):
            # NKI's mgrid idiom indexes a 2-D tensor with 3-D index grids (a unit axis for
            # another operand): unit free axes that no index spans go, down to the rank.
            drop: list[int] = []
            for i in range(ndim - 1, 0, -1):
                if len(drop) == ndim - len(view.shape):
                    break
                if shape[i] == 1:
                    drop.append(i)
            keep = [i for i in range(ndim) if i not in drop]
            shape = [shape[i] for i in keep]
            strides = [strides[i] for i in keep]
            checks = [(b_, tuple(c[i] for i in keep), n) for b_, c, n in checks]
        if not oob:
            return View(view.buffer, offset, tuple(shape), tuple(strides))
        # Unit axes of the index shape keep their coefficients (clip() never shortens them).
        return View(view.buffer, offset, tuple(shape), tuple(strides), tuple(checks), oob)

    # -- instructions --
    def emit(
        self,
        op: str,
        operands: list[tuple[str, View]],
        prefix: str = "",
        attrs: dict[str, str] | None = None,
        writes: Sequence[int] = (),
        loc: Location | None = None,
    ) -> Instr:
        loc = loc or user_location()
        if (
            op == "dma_copy"
            and operands[1][1].buffer.space == HBM
            and "engine" not in (attrs or {})
        ):
            # Stores wait for their data; on GpSimd's queue (idle in most kernels) they do
            # not hold up the loads queued behind them on SyncE (the compiler does the same).
            attrs = {**(attrs or {}), "engine": "#nisa.engine<scalar>"}
        if self.mask is not None:
            operands = [(kw, self.clip(v, self.mask)) for kw, v in operands]
        for _, v in operands:
            if v.blocks is not None:
                raise error(
                    f"a tensor of block shape {list(v.blocks.block_shape)} is used whole; its "
                    "tiles are allocated separately (NKI's block dimensions), so instructions "
                    "take one tile of it: index its block dimensions",
                    loc,
                )
            if v.oob:  # reported at the line that indexed it
                raise KernelError(v.oob)
        instr = Instr(op, prefix, operands, attrs or {}, loc, list(writes))
        if self.mask_skip:  # the mask keeps no element: the instruction does nothing
            return instr
        for _, v in operands:
            v.buffer.users.append(instr)
        self.block.items.append(instr)
        return instr


# ----------------------------------------------------------------------------------------------
# Rendering to MLIR text
# ----------------------------------------------------------------------------------------------


def _bytes_per_partition(buf: Buffer) -> int:
    return math.prod(buf.shape[1:]) * buf.dtype.itemsize


def _loc(loc: Location) -> str:
    file = loc[0].replace("\\", "\\\\").replace('"', '\\"')
    return f'loc("{file}":{loc[1]}:1)'


class _Renderer:
    def __init__(self, builder: Builder, outputs: list[Buffer]) -> None:
        self.b = builder
        self.outputs = outputs
        self.lines: list[str] = []
        self.counter = 0
        self.indent = 2
        self.loop_vars: dict[int, str] = {}
        self.loc: Location | None = None  # of the instruction being written
        self.placement = self._place_allocs()

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"%{stem}{self.counter}"

    def line(self, text: str) -> None:
        if self.loc is not None:
            text += " " + _loc(self.loc)
        self.lines.append("  " * self.indent + text)

    def _item_chain(self, instr_block: Block, item: object) -> list[tuple[Block, object]]:
        """(block, item of that block) from ``instr_block`` out to the kernel's body."""
        chain: list[tuple[Block, object]] = [(instr_block, item)]
        b = instr_block
        while b.outer is not None:
            chain.append((b.outer, b.parent))
            b = b.outer
        return chain

    def _place_allocs(self) -> dict[int, tuple[Block, int]]:
        """Where each used on-chip or scratch allocation goes: in the innermost block holding
        all its uses, just before the first item that uses it, so a tile lives (for the
        allocator) only as long as the kernel uses it, and one made in a loop but read after
        it is still in scope."""
        where: dict[int, list[tuple[Block, object]]] = {}

        def walk(block: Block) -> None:
            for item in block.items:
                if isinstance(item, Instr):
                    for _, v in item.operands:
                        where.setdefault(id(v.buffer), []).append((block, item))
                elif isinstance(item, Loop):
                    walk(item.body)

        walk(self.b.root)
        placement: dict[int, tuple[Block, int]] = {}
        for buf in self.b.buffers:
            if buf.kind != "alloc" or buf.returned or id(buf) not in where:
                continue
            chains = [self._item_chain(block, item) for block, item in where[id(buf)]]
            common = None
            for chain in chains:
                blocks = [b for b, _ in chain]
                common = blocks if common is None else [b for b in common if b in blocks]
            home = common[0]  # type: ignore[index]
            first = None
            for chain in chains:
                for block, item in chain:
                    if block is home:
                        idx = next(i for i, it in enumerate(home.items) if it is item)
                        first = idx if first is None else min(first, idx)
            placement[id(buf)] = (home, first or 0)
            if buf.address is not None:
                # A hand-placed tile is live from the kernel's start: tiles the allocator
                # places never take its bytes while it is in use.
                placement[id(buf)] = (self.b.root, 0)
        if self.b.hoist:
            self._hoist(placement)
        self._rotate(placement)
        return placement

    def _hoist(self, placement: dict[int, tuple[Block, int]]) -> None:
        """Tiles made at one kernel line, one after another in a block (an unrolled loop's
        iterations), are allocated a few generations early: the next ones get addresses of
        their own, so TensorE fills the next PSUM bank while VectorE drains this one and the
        next loads run while this tile is computed on (NKI's compiler rotates such tiles
        too). A bounded share of each memory goes to it; ``Kernel`` retraces without it if
        allocation then fails."""
        groups: dict[tuple[Any, ...], list[Buffer]] = {}
        for buf in self.b.buffers:
            place = placement.get(id(buf))
            if place is None or buf.space == HBM or buf.address is not None:
                continue
            key = (id(place[0]), buf.loc, buf.space, buf.shape, buf.dtype)
            groups.setdefault(key, []).append(buf)
        # A share of each memory per block (blocks run one after another).
        budgets: dict[int, dict[str, int]] = {}
        for key, bufs in groups.items():
            budget = budgets.setdefault(
                key[0],
                {
                    SBUF: int(self.b.capacity.get(SBUF, 0) * self.b.hoist / 4),
                    PSUM: int(self.b.capacity.get(PSUM, 0) * self.b.hoist / 2),
                },
            )
            if len(bufs) < 2:
                continue
            bufs.sort(key=lambda b: placement[id(b)][1])
            space, size = bufs[0].space, _bytes_per_partition(bufs[0])
            # A tile allocated `depth` generations early overlaps about 2 * depth others.
            depth = min(len(bufs) - 1, 8, budget[space] // max(2 * size, 1))
            if depth <= 0:
                continue
            budget[space] -= 2 * depth * size
            firsts = [placement[id(b)][1] for b in bufs]
            for i in range(depth, len(bufs)):
                home, _ = placement[id(bufs[i])]
                placement[id(bufs[i])] = (home, min(firsts[i], firsts[i - depth]))

    def _rotate(self, placement: dict[int, tuple[Block, int]]) -> None:
        """In a loop whose body holds several iterations, every tile of the body is allocated
        at the body's start, so the copies' tiles are live together and get addresses of their
        own: iteration i + 1 loads while iteration i computes. Only while the body's tiles fit
        in half of each memory; otherwise the copies share addresses (correct, serialized)."""
        by_loop: dict[int, list[Buffer]] = {}
        for buf in self.b.buffers:
            place = placement.get(id(buf))
            if place is None or buf.space == HBM:
                continue
            loop = place[0].parent
            if loop is not None and loop.copies > 1:
                by_loop.setdefault(id(loop), []).append(buf)
        for bufs in by_loop.values():
            fits = True
            for space in (SBUF, PSUM):
                used = sum(_bytes_per_partition(b) for b in bufs if b.space == space)
                if used > self.b.capacity.get(space, 0) // 2:
                    fits = False
            if fits:
                for buf in bufs:
                    placement[id(buf)] = (placement[id(buf)][0], 0)

    def index(self, a: Affine) -> str:
        const = self.fresh("c")
        self.line(f"{const} = arith.constant {a.const} : index")
        value = const
        for var, coeff in a.terms.items():
            iv = self.loop_vars[var]
            if coeff != 1:
                k = self.fresh("c")
                self.line(f"{k} = arith.constant {coeff} : index")
                term = self.fresh("t")
                self.line(f"{term} = arith.muli {iv}, {k} : index")
            else:
                term = iv
            s = self.fresh("s")
            self.line(f"{s} = arith.addi {value}, {term} : index")
            value = s
        return value

    def view(self, v: View) -> str:
        off = self.index(v.offset)
        strides = []
        for s in v.strides:
            if s == 0:
                zero = self.fresh("c")
                self.line(f"{zero} = arith.constant 0 : index")
                strides.append(zero)
            else:
                strides.append(str(s))
        name = self.fresh("v")
        sizes = ", ".join(str(d) for d in v.shape)
        self.line(
            f"{name} = memref.reinterpret_cast {v.buffer.name} to offset: [{off}], "
            f"sizes: [{sizes}], strides: [{', '.join(strides)}] : {v.buffer.type} to {v.type()}"
        )
        return name

    def render(self) -> str:
        b = self.b
        args = []
        for i, buf in enumerate(b.inputs):
            buf.name = f"%in{i}"
            args.append(f"{buf.name}: {buf.type} {_loc(buf.loc)}")
        for i, buf in enumerate(self.outputs):
            buf.name = f"%out{i}"
            args.append(f"{buf.name}: {buf.type} {_loc(buf.loc)}")
        self.lines.append(f'module attributes {{nisa.target = "{b.target}"}} {{')
        self.lines.append(
            f"  func.func @{b.name}({', '.join(args)}) attributes "
            f"{{nisa.kernel, nisa.num_inputs = {len(b.inputs)} : i64, "
            f'nisa.reuse = "{b.reuse}"}} {{'
        )
        self.indent = 2
        self.block(b.root)
        self.line("return")
        self.lines.append(f"  }} {_loc(b.def_loc)}")
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def block(self, block: Block) -> None:
        pending: dict[int, list[Buffer]] = {}
        for buf in self.b.buffers:
            place = self.placement.get(id(buf))
            if place is not None and place[0] is block:
                pending.setdefault(place[1], []).append(buf)
        for i, item in enumerate(block.items):
            for buf in pending.get(i, []):
                buf.name = self.fresh("buf")
                attrs = ""
                if buf.address is not None:
                    attrs = f" {{nisa.address = {buf.address} : i64}}"
                self.line(f"{buf.name} = memref.alloc(){attrs} : {buf.type} {_loc(buf.loc)}")
            if isinstance(item, Instr):
                self.instr(item)
            elif isinstance(item, Loop):
                lb, ub, st = self.fresh("lb"), self.fresh("ub"), self.fresh("st")
                self.line(f"{lb} = arith.constant {item.start} : index")
                self.line(f"{ub} = arith.constant {item.stop} : index")
                self.line(f"{st} = arith.constant {item.step} : index")
                iv = self.fresh("i")
                self.loop_vars[item.var] = iv
                self.line(f"scf.for {iv} = {lb} to {ub} step {st} {{")
                self.indent += 1
                self.block(item.body)
                self.indent -= 1
                self.line(f"}} {_loc(item.loc)}")

    def instr(self, instr: Instr) -> None:
        self.loc = instr.loc
        names = [(kw, self.view(v), v) for kw, v in instr.operands]
        self.loc = None
        parts = []
        for kw, name, _ in names:
            parts.append(f"{kw} {name}" if kw else name)
        # Positional operands are comma-separated; keyword ones follow with a space.
        text = ""
        for i, p in enumerate(parts):
            sep = "" if i == 0 else (" " if names[i][0] else ", ")
            text += sep + p
        if instr.op == "n_gather":  # nisa.n_gather %data[%indices], %dst
            text = f"{parts[0]}[{parts[1]}], {parts[2]}"
        attrs_d = dict(instr.attrs)
        if instr.op == "memset":  # its value is positional: nisa.memset %dst, 0.0
            text += ", " + attrs_d.pop("value").split(" :")[0]
        attrs = ""
        if attrs_d:
            attrs = " {" + ", ".join(f"{k} = {v}" if v else k for k, v in attrs_d.items()) + "}"
        types = ", ".join(v.type() for _, _, v in names)
        self.loc = instr.loc
        self.line(f"nisa.{instr.op} {instr.prefix}{text}{attrs} : {types}")
        self.loc = None


def render(builder: Builder, outputs: list[Buffer]) -> str:
    return _Renderer(builder, outputs).render()
