"""``@nki.jit`` kernels: traced per argument signature, compiled, run on the engine model."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchneuron.nki import _ir

__all__ = [
    "BenchmarkResult",
    "Kernel",
    "baremetal",
    "benchmark",
    "jit",
    "profile",
    "simulate_kernel",
]

# Which operand each instruction writes (the others it reads).
_WRITTEN = {
    "dma_copy": 1,
    "copy": 1,
    "tensor_tensor": 2,
    "scalar_tensor_tensor": 2,
    "tensor_scalar": 1,
    "activation": 1,
    "matmul": 2,
    "tensor_reduce": 1,
    "bn_stats": 1,
    "bn_aggr": 1,
    "n_gather": 2,
    "memset": 0,
    "iota": 0,
}


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, _ir.Tensor)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _spec(x: Any) -> tuple[tuple[int, ...], _ir.DType]:
    return tuple(int(d) for d in x.shape), _ir.as_dtype(x.dtype)


def _static_key(x: Any) -> Any:
    try:
        hash(x)
    except TypeError:
        return ("repr", repr(x))
    return ("value", type(x).__name__, x)


@dataclass
class Traced:
    """One specialization of a kernel: its ``nisa`` text and compiled program."""

    name: str
    mlir: str
    kernel: Any  # torchneuron._C.Kernel
    array_positions: list[int]
    returns_tuple: bool
    constants: list[Any] = field(default_factory=list)  # CPU torch tensors, inputs last
    _device_kernel: Any = field(default=None, repr=False)

    def device_kernel(self) -> Any:
        if self._device_kernel is None:
            from torchneuron.kernel import DeviceKernel

            self._device_kernel = DeviceKernel(self.kernel, self.name, self.returns_tuple)
        return self._device_kernel


class _Retraced:
    """What earlier traces of a kernel asked of the next (see ``_ir._Retrace``)."""

    def __init__(self) -> None:
        self.copies: dict[_ir.Location, int] = {}
        self.split: set[str] = set()
        self.spill: set[str] = set()

    def merge(self, r: _ir._Retrace, unroll: set[_ir.Location]) -> bool:
        """Add ``r``'s requests; False when they add nothing (tracing would not settle)."""
        progress = not (r.unroll <= unroll and r.split <= self.split and r.spill <= self.spill)
        unroll |= r.unroll
        self.split |= r.split
        self.spill |= r.spill
        for loc, n in r.copies.items():
            have = self.copies.get(loc, 1)
            if have % n:
                self.copies[loc] = math.lcm(have, n)
                progress = True
        return progress


class _UserState:
    """The objects of the kernel's own module that its globals hold (instances of classes
    that module defines, such as a hand allocator with a running offset), with a copy of
    their attributes: the tracer may run the kernel's Python several times (to unroll or
    peel loops), and each run must see what the first saw, as NKI traces once."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        import copy

        self.saved: list[tuple[Any, dict[str, Any]]] = []
        module = getattr(fn, "__module__", None)
        for value in list(getattr(fn, "__globals__", {}).values()):
            if (
                isinstance(value, type)
                or callable(value)
                or type(value).__module__ != module
                or not hasattr(value, "__dict__")
            ):
                continue
            try:
                self.saved.append((value, copy.deepcopy(vars(value))))
            except Exception:  # noqa: BLE001 (an object we cannot copy is left alone)
                continue

    def restore(self) -> None:
        import copy

        for obj, attrs in self.saved:
            vars(obj).clear()
            vars(obj).update(copy.deepcopy(attrs))


class Kernel:
    """A ``@nki.jit`` kernel. Call it with torch tensors (CPU or ``neuron``) or NumPy arrays;
    ``kernel[g0, g1](...)`` launches an SPMD grid. Each distinct signature (array shapes and
    dtypes, other arguments' values, grid) is traced and compiled once."""

    def __init__(self, fn: Callable[..., Any], target: str | None = None, rotate: int = 4) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.target = target
        if rotate < 1:
            raise ValueError("rotate must be at least 1")
        self.rotate = rotate
        self._cache: dict[Any, Traced] = {}
        # Whether the kernel returns a tuple (known once traced; its operator returns a list).
        self._returns_tuple = False
        # Its torch operator, for calls in torch.compile graphs (torchneuron/nki_op.py). Made here:
        # Dynamo cannot trace the making of an operator.
        from torchneuron import nki_op

        self._torch_op = nki_op.define(self)

    def __getitem__(self, grid: Any) -> _Launch:
        grid = grid if isinstance(grid, tuple) else (grid,)
        grid = tuple(int(g) for g in grid)
        if not grid or any(g <= 0 for g in grid):
            raise ValueError(f"launch grid {list(grid)} must have positive sizes")
        return _Launch(self, grid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._run((), args, kwargs)

    # -- tracing --
    def specialize(self, *args: Any, grid: Sequence[int] = (), **kwargs: Any) -> Traced:
        """Trace and compile for these arguments (cached); ``.mlir`` is the traced kernel."""
        return self._traced(tuple(grid), args, kwargs)

    def _traced(self, grid: tuple[int, ...], args: Sequence[Any], kwargs: dict[str, Any]) -> Traced:
        from torchneuron import config

        target = config.resolve_target({"target": self.target})
        key = (
            target,
            grid,
            tuple(("array", _spec(a)) if _is_array(a) else _static_key(a) for a in args),
            tuple(sorted((k, _static_key(v)) for k, v in kwargs.items())),
        )
        traced = self._cache.get(key)
        if traced is None:
            traced = self._trace(target, grid, args, kwargs)
            self._cache[key] = traced
        return traced

    def _trace(
        self, target: str, grid: tuple[int, ...], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Traced:

        # A mask that cuts the last iteration of a loop peels that iteration off: the kernel
        # is traced again with the loop split (loops are numbered in creation order).
        # A loop variable indexing a Python list unrolls that loop (and the loops that may
        # have filled the list) the same way.
        # A loop variable modulo a number traces its loop with that many iterations per
        # step, and a block tensor allocated per tile unrolls the loops indexing its blocks.
        peel: set[_ir.Location] = set()
        unroll: set[_ir.Location] = set()
        retrace = _Retraced()
        state = _UserState(self.fn)
        while True:
            try:
                return self._trace_once(target, grid, args, kwargs, peel, unroll, retrace)
            except _ir._Peel as p:
                if p.loc in peel:
                    raise
                peel.add(p.loc)
            except _ir._Unroll as u:
                if u.locs <= unroll:
                    raise
                unroll |= u.locs
            except _ir._Retrace as r:
                if not retrace.merge(r, unroll):
                    raise _ir.KernelError(
                        f"{self.fn.__name__}: tracing does not settle (loops to unroll: "
                        f"{sorted(r.unroll)}, iterations per step: {r.copies})"
                    ) from None
            # The kernel's Python runs again: its module's objects start as they were.
            state.restore()

    def _trace_once(
        self,
        target: str,
        grid: tuple[int, ...],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        peel: set[_ir.Location],
        unroll: set[_ir.Location],
        retrace: _Retraced,
    ) -> Traced:
        from torchneuron import config
        from torchneuron._native import native

        name = self.fn.__name__
        b = _ir.Builder(name, grid, target, self.rotate)
        b.peel, b.unroll = peel, unroll
        b.copies_need, b.split, b.spill = retrace.copies, retrace.split, retrace.spill
        try:
            file = inspect.getsourcefile(self.fn) or self.fn.__code__.co_filename
        except TypeError:
            file = self.fn.__code__.co_filename
        b.def_loc = (file, self.fn.__code__.co_firstlineno)
        memory = native().target_memory(target)
        b.capacity = {
            _ir.SBUF: int(memory["sbuf_bytes_per_partition"]),
            _ir.PSUM: int(memory["psum_bytes_per_partition"]),
        }
        b.psum_bank_bytes = int(memory["psum_bank_bytes"])
        positions = [i for i, a in enumerate(args) if _is_array(a)]
        with b:
            call_args = list(args)
            for i in positions:
                shape, dtype = _spec(args[i])
                call_args[i] = b.input(shape, dtype, b.def_loc)
            for k, v in kwargs.items():
                if _is_array(v):
                    raise TypeError(f"{name}: pass arrays positionally (got {k}=...)")
            loops = [b.loop(0, g, 1) for g in grid]
            for loop in loops:
                b.grid_vars.append(next(loop))
            try:
                result = self.fn(*call_args, **kwargs)
            except _ir.KernelError:
                # Stand-ins this trace used until loops unroll may be what failed.
                request = b.retrace_request()
                if request is not None:
                    raise request from None
                raise
            for loop in reversed(loops):
                if next(loop, None) is not None:
                    raise _ir.error(
                        "a mask cuts the last program of the launch grid; masks may cut "
                        "only the last iteration of kernel loops",
                        b.def_loc,
                    )
        request = b.retrace_request()
        if request is not None:
            raise request
        self._check_writes(b)
        returns_tuple = isinstance(result, (tuple, list))
        results = list(result) if returns_tuple else [result]
        outputs: list[_ir.Buffer] = []
        for r in results:
            if (
                not isinstance(r, _ir.Tensor)
                or r.view.buffer.kind != "shared"
                or r.shape != r.view.buffer.shape
            ):
                raise _ir.error(
                    f"{name} must return tensors made with nl.ndarray(..., buffer=nl.shared_hbm)"
                    f" (whole tensors), got {r!r}",
                    b.def_loc,
                )
            if r.view.buffer in outputs:
                raise _ir.error(f"{name} returns one tensor twice", b.def_loc)
            r.view.buffer.returned = True
            outputs.append(r.view.buffer)
        # nl.shared_hbm tensors the kernel does not return are its HBM scratch.
        for buf in b.buffers:
            if buf.kind == "shared" and not buf.returned:
                buf.kind = "alloc"
        # Early allocation of unrolled tiles (_Renderer._hoist) may be what overflows a
        # memory: compile with less of it, then none, before reporting the first error.
        dump = config.dump_dir()
        first_error = ""
        # Least-recently-freed placement may fragment memory where lowest-first would not.
        for share, reuse in (
            (1.0, "least_recent"),
            (0.5, "least_recent"),
            (0.0, "least_recent"),
            (0.0, "lowest"),
        ):
            b.hoist, b.reuse = share, reuse
            text = _ir.render(b, outputs)
            try:
                kernel = native().compile_kernel(
                    text,
                    name=f"{name}.nki.mlir",
                    target=target,
                    dump_dir=str(dump) if dump else "",
                )
                break
            except native().CompileError as e:
                first_error = first_error or str(e).rstrip()
        else:
            if b.whole_blocks - b.split:
                # Block tensors held whole may be what does not fit: allocate them per tile.
                raise _ir._Retrace(set(), {}, b.whole_blocks - b.split)
            if b.over_blocks - b.spill:
                # Tiles of a block tensor larger than its memory live together: spill it.
                raise _ir._Retrace(set(), {}, set(), b.over_blocks - b.spill)
            raise _ir.KernelError(first_error) from None
        if config.check():
            kernel.timeline()  # raises DeviceError for a missing wait
        return Traced(name, text, kernel, positions, returns_tuple, b.constants)

    @staticmethod
    def _check_writes(b: _ir.Builder) -> None:
        def walk(block: _ir.Block) -> None:
            for item in block.items:
                if isinstance(item, _ir.Loop):
                    walk(item.body)
                elif isinstance(item, _ir.Instr):
                    written = item.operands[_WRITTEN[item.op]][1].buffer
                    if written.kind == "input":
                        raise _ir.error(
                            "a kernel may not write its input arguments; write a tensor made "
                            "with nl.ndarray(..., buffer=nl.shared_hbm) and return it",
                            item.loc,
                        )

        walk(b.root)

    # -- running --
    def _run(self, grid: tuple[int, ...], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        import torch

        from torchneuron import nki_op

        if torch.compiler.is_compiling() and all(
            nki_op.encodable(a)
            for a in (*args, *kwargs.values())
            if not isinstance(a, torch.Tensor)
        ):
            # Dynamo traces this: the call becomes one operator in the graph.
            return nki_op.call(self, grid, args, kwargs)
        traced = self._traced(grid, args, kwargs)
        arrays = [args[i] for i in traced.array_positions]
        if arrays and all(_is_torch(a) for a in arrays):
            consts = [c.to(arrays[0].device) for c in traced.constants]
            return traced.device_kernel()(*arrays, *consts)
        if any(_is_torch(a) for a in arrays):
            raise TypeError(f"{traced.name}: pass either torch tensors or NumPy arrays, not both")
        return _run_numpy(traced, arrays)


class _Launch:
    def __init__(self, kernel: Kernel, grid: tuple[int, ...]) -> None:
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel._run(self.grid, args, kwargs)

    def specialize(self, *args: Any, **kwargs: Any) -> Traced:
        return self.kernel._traced(self.grid, args, kwargs)


def _run_numpy(traced: Traced, arrays: Sequence[Any]) -> Any:
    import numpy as np

    from torchneuron.profile import record_run

    inputs = [np.ascontiguousarray(a) for a in arrays]
    outputs = []
    for dtype, shape in traced.kernel.output_specs:
        if dtype == "bfloat16":
            raise TypeError(
                f"{traced.name}: a bfloat16 output needs torch tensors (NumPy has none)"
            )
        outputs.append(np.empty(shape, dtype=np.dtype("bool" if dtype == "bool" else dtype)))

    def buf(a: Any) -> tuple[int, str, list[int]]:
        return (a.ctypes.data, _ir.as_dtype(a.dtype).name, list(a.shape))

    consts = [(c.data_ptr(), _ir.as_dtype(c.dtype).name, list(c.shape)) for c in traced.constants]
    traced.kernel.run([buf(a) for a in inputs] + consts, [buf(a) for a in outputs])
    record_run(traced.kernel, traced.name)
    return tuple(outputs) if traced.returns_tuple else outputs[0]


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    target: str | None = None,
    rotate: int = 4,
    **kwargs: Any,
) -> Any:
    """Make ``fn`` an NKI kernel (``@nki.jit`` or ``@nki.jit(target="trn3")``).

    ``rotate``: iterations of an ``nl.affine_range`` loop traced into each step of its loop
    (at most; a divisor of the trip count), whose tiles get addresses of their own so loads
    run ahead of compute (1: every iteration reuses the same tiles). NKI's other options
    (``mode=``, ``platform_target=``...) are accepted and ignored."""
    if fn is None:
        return lambda f: Kernel(f, target, rotate)
    return Kernel(fn, target, rotate)


def simulate_kernel(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``kernel`` (``kernel`` or ``kernel[grid]``) on NumPy arrays and return NumPy arrays,
    like NKI's simulator: numerics of the engine model, no device needed."""
    if isinstance(kernel, _Launch):
        return kernel(*args, **kwargs)
    if not isinstance(kernel, Kernel):
        raise TypeError("simulate_kernel takes a @nki.jit kernel")
    return kernel(*args, **kwargs)


@dataclass
class BenchmarkResult:
    """The modeled cost of one run of a kernel on the engine model."""

    name: str
    target: str
    device_ns: float
    bound: str
    flops: float
    hbm_bytes: float
    instructions: int
    engine_busy_ns: dict[str, float]
    peak_flops: float

    @property
    def latency_us(self) -> float:
        return self.device_ns / 1e3

    @property
    def utilization(self) -> dict[str, float]:
        """Busy fraction of each engine (and DMA/HBM) over the kernel's time."""
        t = self.device_ns or 1.0
        return {k: v / t for k, v in self.engine_busy_ns.items()}

    @property
    def tflops(self) -> float:
        return self.flops / self.device_ns / 1e3 if self.device_ns else 0.0

    @property
    def tensor_peak_fraction(self) -> float:
        """Matmul FLOP/s over TensorE's bf16 peak: the figure the NKI tutorials chase."""
        if not self.device_ns:
            return 0.0
        return self.flops / (self.device_ns * 1e-9) / self.peak_flops

    def summary(self) -> str:
        util = ", ".join(
            f"{k} {v:.0%}" for k, v in self.utilization.items() if k not in ("dma_avg",)
        )
        return (
            f"{self.name} on {self.target}: {self.latency_us:.2f} us modeled, bound by "
            f"{self.bound}; {self.tflops:.1f} TFLOP/s ({self.tensor_peak_fraction:.0%} of "
            f"TensorE peak); {self.instructions} instructions; busy: {util}"
        )

    # NKI's ``benchmark_result.nc_latency.get_latency_percentile(p)`` (microseconds): the model
    # has no run-to-run variation, so every percentile is the modeled latency.
    @property
    def nc_latency(self) -> BenchmarkResult:
        return self

    def get_latency_percentile(self, percentile: float) -> float:
        return self.latency_us


def _benchmark_traced(traced: Traced) -> BenchmarkResult:
    from torchneuron._native import native

    t = traced.kernel.timeline()
    return BenchmarkResult(
        name=traced.name,
        target=traced.kernel.target,
        device_ns=float(t["device_ns"]),
        bound=str(t["bound"]),
        flops=float(t["flops"]),
        hbm_bytes=float(t["hbm_bytes"]),
        instructions=int(t["instructions"]),
        engine_busy_ns={str(k): float(v) for k, v in t["engine_busy_ns"].items()},
        peak_flops=float(native().target_peaks(traced.kernel.target)["flops"]),
    )


# NKI's options of nki.benchmark / nki.profile / nki.baremetal. The model has no run-to-run
# variation and compiles with its own pipeline, so warm-up, iteration counts and compiler
# flags change nothing; the file names are honoured.
_RUN_OPTIONS = {
    "warmup",
    "iters",
    "save_neff_name",
    "save_trace_name",
    "additional_compile_opt",
    "working_directory",
    "profile_nth",
    "device_count",
    "artifacts_dir",
    "num_execs",
}


class _Benchmarked:
    """A kernel wrapped by ``nki.benchmark(...)`` / ``nki.profile(...)`` /
    ``nki.baremetal(...)``: a call runs it (on NumPy arrays; with ``nt.tensor[...]`` arguments
    it is only compiled and timed), sets ``benchmark_result`` and writes the files asked for:
    ``save_neff_name`` the program (JSON, the model's NEFF), ``save_trace_name`` the modeled
    timeline as a Chrome trace, both under ``working_directory`` when given."""

    def __init__(self, kernel: Any, options: dict[str, Any]) -> None:
        unknown = set(options) - _RUN_OPTIONS
        if unknown:
            raise TypeError(
                f"unsupported option(s) {sorted(unknown)} (NKI's: {sorted(_RUN_OPTIONS)})"
            )
        self.kernel = kernel if isinstance(kernel, (Kernel, _Launch)) else jit(kernel)
        self.options = options
        self.benchmark_result: BenchmarkResult | None = None
        k = self.kernel
        functools.update_wrapper(self, k.fn if isinstance(k, Kernel) else k.kernel.fn)

    def __getitem__(self, grid: Any) -> _Benchmarked:
        if not isinstance(self.kernel, Kernel):
            raise TypeError("the launch grid is already given")
        return _Benchmarked(self.kernel[grid], self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        launch = self.kernel if isinstance(self.kernel, _Launch) else _Launch(self.kernel, ())
        traced = launch.specialize(*args, **kwargs)
        from torchneuron.nki.typing import TensorSpec

        out = None
        if not any(isinstance(a, TensorSpec) for a in args):
            out = launch(*args, **kwargs)
        self.benchmark_result = _benchmark_traced(traced)
        self._save(traced)
        return out

    def _save(self, traced: Traced) -> None:
        from pathlib import Path

        directory = Path(self.options.get("working_directory") or ".")
        neff, trace = self.options.get("save_neff_name"), self.options.get("save_trace_name")
        if neff or trace:
            directory.mkdir(parents=True, exist_ok=True)
        if neff:
            (directory / neff).write_text(traced.kernel.program_json)
        if trace:
            from torchneuron.profile import Profile

            prof = Profile()
            prof.record(traced.kernel, traced.name)
            prof.export_chrome_trace(directory / trace)


def benchmark(kernel: Any = None, *args: Any, **kwargs: Any) -> Any:
    """The modeled latency and engine utilisation of ``kernel`` on these arguments:
    ``nki.benchmark(kernel, a, b)`` or ``nki.benchmark(kernel[grid], a, b)`` (traced and
    compiled, not run: the time is a property of the program) gives a :class:`BenchmarkResult`.
    NKI's forms -- ``nki.benchmark(kernel, warmup=..., save_trace_name=...)``,
    ``@nki.benchmark(...)`` and ``nki.benchmark(warmup=5, iters=10)(kernel)`` -- give a wrapped
    kernel whose calls run it and set ``benchmark_result`` (``.nc_latency
    .get_latency_percentile(p)``, microseconds)."""
    if kernel is None:
        return lambda k: _Benchmarked(k, kwargs)
    if not args and (not kwargs or set(kwargs) & _RUN_OPTIONS):
        return _Benchmarked(kernel, kwargs)
    if not isinstance(kernel, (Kernel, _Launch)):
        raise TypeError("nki.benchmark takes a @nki.jit kernel")
    return _benchmark_traced(kernel.specialize(*args, **kwargs))


def profile(kernel: Any = None, **options: Any) -> Any:
    """NKI's ``nki.profile(working_directory=..., save_neff_name=..., save_trace_name=...)``:
    wraps a kernel whose calls run it and write its program and modeled Chrome trace."""
    if kernel is None:
        return lambda k: _Benchmarked(k, options)
    return _Benchmarked(kernel, options)


def baremetal(kernel: Any = None, **options: Any) -> Any:
    """NKI's ``nki.baremetal``: run on NumPy arrays (here, the engine model), optionally
    writing the program and trace like :func:`profile`."""
    return profile(kernel, **options)
