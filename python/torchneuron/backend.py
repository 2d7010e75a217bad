"""The ``neuron`` torch.compile backend.

Registered through the ``torch_dynamo_backends`` entry point, so ``torch.compile(m,
backend="neuron")`` works without importing this package. Dynamo's graph goes through
``aot_autograd`` (forward, backward and inference graphs, decomposed to the ATen ops the
importer lowers); each ATen graph goes through the front end's steps (:mod:`torchneuron.frontend`:
rewrites, the importer's check, partitioning into device regions and eager PyTorch, one
document per region), and each device region is compiled into one kernel.
"""

from __future__ import annotations

import itertools
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

from torchneuron import cache as compile_cache
from torchneuron import (
    config,
    flex,
    frontend,
    fx_json,
    graph_cache,
    optimizer,
    partition,
    sdpa,
    specialize,
)
from torchneuron._native import Kernel, native
from torchneuron._stats import STATS
from torchneuron.decompositions import (
    grouped_mm_kernel,
    math_attention,
    nearest_resizing,
    neuron_decompositions,
)
from torchneuron.kernel import DeviceKernel, GenericDeviceKernel
from torchneuron.losses import cross_entropy_rows
from torchneuron.progress import Progress
from torchneuron.sizes import NotSizeGeneric, no_size_guards

__all__ = ["SpecializingGraph", "build_graph", "compile_aten_graph", "neuron_backend"]


_graph_ids = itertools.count()
sdpa.trace_transformer_modules()


def neuron_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
) -> Callable[..., Any]:
    """``torch.compile`` backend: ``torch.compile(model, backend="neuron", options=...)``.

    ``options={"target": "trn2" | "trn3"}`` picks the chip (default ``trn2``, or
    ``$TORCHNEURON_TARGET``). ``mode`` is accepted and has no effect.

    SDPA calls the FlexAttention kernels compute are routed to them (:mod:`torchneuron.sdpa`):
    the forward kernel in graphs that need no gradient, the forward and backward kernels in
    training graphs.
    """
    from torch._dynamo.backends.common import aot_autograd

    options = kwargs.get("options") or {}
    unknown = sorted(set(options) - config.KNOWN_OPTIONS)
    if unknown:
        warnings.warn(
            f"torchneuron ignores unknown options {unknown}; "
            f"known options: {sorted(config.KNOWN_OPTIONS)}",
            stacklevel=2,
        )
    target = config.resolve_target(options)
    dump = config.dump_dir(options)
    cache = config.cache_dir(options)

    def neuron_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return compile_aten_graph(
            gm,
            example_inputs,
            target=target,
            dump=dump,
            cache=cache,
            specialize_sizes=bool(options.get("specialize_sizes", False)),
        )

    def backward_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        optimizer.install_step_hook()  # training: the optimizer step is eager, and counted
        return neuron_compiler(gm, example_inputs)

    optimizer.track_parameters(example_inputs)
    aot = aot_autograd(
        fw_compiler=neuron_compiler,
        bw_compiler=backward_compiler,
        inference_compiler=neuron_compiler,
        decompositions=neuron_decompositions(),
    )
    training = sdpa.needs_grad(gm, example_inputs)
    sdpa.route_attention(gm, training=training)
    nearest_resizing(gm)
    cross_entropy_rows(gm)
    # Forward and backward graphs are traced in this call. Training keeps the masked grouped
    # GEMM: its backward's weight gradients (K in groups) have no kernel yet.
    with math_attention(), grouped_mm_kernel(not training):
        return aot(gm, example_inputs)


def compile_aten_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    target: str,
    dump: Path | None = None,
    cache: Path | None = None,
    specialize_sizes: bool = False,
) -> Callable[[list[Any]], Any]:
    """The AOT compiler: a boxed callable running ``gm`` with its device regions compiled.

    Static graphs compile now. Graphs with symbolic sizes compile now too, once for every size,
    when the compiler can make each region's program size-generic (:func:`build_generic_graph`);
    otherwise, and for graphs whose BlockMask or SDPA mask content shapes the kernel, once per
    tuple of sizes and mask content they are called with (:class:`SpecializingGraph`)."""
    from functorch.compile import make_boxed_func  # type: ignore[import-untyped]
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    del example_inputs  # node.meta["val"] has everything the compiler needs
    runner: Callable[..., Any]
    generic: torch.fx.GraphModule | None = None
    if specialize.is_static(gm) and not flex.call_dependent(gm):
        with unset_fake_temporarily():  # AOT calls compilers inside its fake mode
            runner = build_graph(gm, target, dump, cache)
    else:
        if not flex.call_dependent(gm) and not specialize_sizes:
            with unset_fake_temporarily():
                generic = build_generic_graph(gm, target, dump, cache)
        runner = generic if generic is not None else SpecializingGraph(gm, target, dump, cache)

    def run(*args: Any) -> Any:
        return runner(*args)

    boxed: Callable[[list[Any]], Any] = make_boxed_func(run)
    return boxed


def build_graph(
    gm: torch.fx.GraphModule, target: str, dump: Path | None = None, cache: Path | None = None
) -> torch.fx.GraphModule:
    """A copy of a static ``gm`` whose device regions are compiled :class:`DeviceKernel`\\ s.

    With a persistent compile cache in ``cache``: rebuilt from the graph's entry when it has one
    (:mod:`torchneuron.graph_cache`: no partitioning, serializing or compiling), else built with
    each region's program loaded from its program entry or compiled, and stored whole. A long
    compile says what it is doing on a terminal (:mod:`torchneuron.progress`)."""
    ops = sum(partition.is_op(n) for n in gm.graph.nodes)
    with Progress(f"graph of {ops} ops ({target})") as progress:
        return _build_graph(gm, target, dump, cache, progress)


def _build_graph(
    gm: torch.fx.GraphModule,
    target: str,
    dump: Path | None,
    cache: Path | None,
    progress: Progress,
) -> torch.fx.GraphModule:
    start = time.perf_counter()
    key = graph_cache.key(gm, target) if cache is not None and dump is None else None
    if cache is not None and key is not None:
        progress.stage("loading it from the compile cache")
        hit = graph_cache.load(cache, key, gm, target, lambda: f"graph_{next(_graph_ids)}")
        if hit is not None:
            _report_fallback(hit.fallback)
            STATS.record_compile(
                graphs=0,
                ops_on_device=hit.ops_on_device,
                fallback=[f.target for f in hit.fallback],
                seconds=time.perf_counter() - start,
            )
            return hit.module
    lowered = frontend.lower(gm, lambda prefix: f"{prefix}_{next(_graph_ids)}", progress.stage)
    work = lowered.module
    compiled = 0
    for i, region in enumerate(lowered.regions):
        progress.stage(f"compiling kernel {i + 1}/{len(lowered.regions)}")
        doc = region.document
        kernel, fresh = _compile_shared(doc, target, dump, cache)
        compiled += fresh
        kernel_module: torch.nn.Module
        if isinstance(kernel, native().GenericKernel):
            # Static sizes, but parameters bound at each call from an input's values (a
            # grouped GEMM's offsets).
            sub = work.get_submodule(region.submodule)
            assert isinstance(sub, torch.fx.GraphModule)
            kernel_module = GenericDeviceKernel(
                kernel, doc["name"], region.returns_tuple, region.output_map, sub, doc
            )
        else:
            kernel_module = DeviceKernel(
                kernel, doc["name"], region.returns_tuple, region.output_map
            )
        setattr(work, region.submodule, kernel_module)
    if cache is not None and key is not None:
        graph_cache.store(cache, key, gm, work, lowered.ops_on_device, lowered.fallback)
    _report_fallback(lowered.fallback)
    STATS.record_compile(
        graphs=compiled,
        ops_on_device=lowered.ops_on_device,
        fallback=[f.target for f in lowered.fallback],
        seconds=time.perf_counter() - start,
    )
    return work


def build_generic_graph(
    gm: torch.fx.GraphModule, target: str, dump: Path | None = None, cache: Path | None = None
) -> torch.fx.GraphModule | None:
    """A copy of ``gm``, a graph with symbolic sizes, whose device regions are compiled once
    for every size (:class:`GenericDeviceKernel`), or None when some region cannot be: an op
    the compiler cannot make size-generic, a size no argument gives, or an op that would stay
    in eager PyTorch (the per-size compile handles and reports those). Says why with
    ``TORCHNEURON_VERBOSE=1``."""
    start = time.perf_counter()
    if specialize.has_data_dependent_sizes(gm):
        _report_not_size_generic("sizes that depend on data (nonzero, unique, ...)")
        return None
    ops = sum(partition.is_op(n) for n in gm.graph.nodes)
    with Progress(f"graph of {ops} ops with symbolic sizes ({target})") as progress:
        try:
            with no_size_guards(gm):
                lowered = frontend.lower(
                    gm,
                    lambda prefix: f"{prefix}_{next(_graph_ids)}",
                    progress.stage,
                    symbolic=True,
                )
            if lowered.fallback:
                first = lowered.fallback[0]
                raise NotSizeGeneric(
                    f"{len(lowered.fallback)} op(s) would stay in eager PyTorch "
                    f"(first: {first.describe()})"
                )
            work = lowered.module
            compiled = 0
            c = native()
            for i, region in enumerate(lowered.regions):
                progress.stage(f"compiling size-generic kernel {i + 1}/{len(lowered.regions)}")
                doc = region.document
                sub = work.get_submodule(region.submodule)
                assert isinstance(sub, torch.fx.GraphModule)
                try:
                    kernel, fresh = _compile_shared(doc, target, dump, cache, quiet=True)
                except c.CompileError as e:
                    raise NotSizeGeneric(str(e).strip().splitlines()[0]) from None
                compiled += fresh
                module: torch.nn.Module
                if isinstance(kernel, c.GenericKernel):
                    module = GenericDeviceKernel(
                        kernel, doc["name"], region.returns_tuple, region.output_map, sub, doc
                    )
                else:  # every size of this region is fixed
                    takes = [n.meta.get("val") for n in sub.graph.nodes if n.op == "placeholder"]
                    if not all(isinstance(v, torch.Tensor) for v in takes):
                        # Its call passes sizes a static kernel does not take.
                        raise NotSizeGeneric(f"{doc['name']} takes sizes, its program none")
                    module = DeviceKernel(
                        kernel, doc["name"], region.returns_tuple, region.output_map
                    )
                setattr(work, region.submodule, module)
        except NotSizeGeneric as e:
            _report_not_size_generic(str(e))
            return None
        except Exception as e:  # the per-size compile is the proven path: take it, and say why
            first = (str(e).strip().splitlines() or [""])[0]
            _report_not_size_generic(f"{type(e).__name__}: {first}")
            return None
    STATS.record_compile(
        graphs=compiled,
        ops_on_device=lowered.ops_on_device,
        fallback=[],
        seconds=time.perf_counter() - start,
    )
    return work


def clear_kernel_cache() -> None:
    """Forget the kernels compiled so far: the next compile of every graph compiles anew."""
    with _kernels_lock:
        _kernels.clear()


# Kernels by (target, document without its name), while some compiled graph holds them: threads
# that compile the same graph at once (Dynamo compiles a new frame in each thread that calls it
# first) share one compile and one kernel.
_kernels: weakref.WeakValueDictionary[tuple[str, str], Kernel] = weakref.WeakValueDictionary()
_kernels_lock = threading.Lock()
_compiling: dict[tuple[str, str], threading.Lock] = {}


def _compile_shared(
    doc: dict[str, Any],
    target: str,
    dump: Path | None,
    cache: Path | None,
    *,
    quiet: bool = False,
) -> tuple[Kernel, bool]:
    """The kernel of ``doc`` and whether this call compiled it (always, when stages are dumped):
    shared with other threads in memory, and with other processes through ``cache``.
    ``quiet``: a failed compile raises ``CompileError`` without saving the document (an
    attempt the caller has a way around)."""
    if dump is not None:
        return _compile_document(doc, target, dump, quiet), True
    key = (target, fx_json.to_json({**doc, "name": ""}))
    with _kernels_lock:
        kernel = _kernels.get(key)
        if kernel is not None:
            return kernel, False
        lock = _compiling.setdefault(key, threading.Lock())
    with lock:
        kernel = _kernels.get(key)
        if kernel is not None:
            return kernel, False
        try:
            kernel, fresh = _compile_cached(doc, key[1], target, cache, quiet)
            _kernels[key] = kernel
        finally:
            with _kernels_lock:
                _compiling.pop(key, None)
    return kernel, fresh


def _compile_cached(
    doc: dict[str, Any], nameless: str, target: str, cache: Path | None, quiet: bool
) -> tuple[Kernel, bool]:
    """The kernel of ``doc`` from the persistent cache, or compiled (and stored): whether it
    was compiled. Processes that miss one key at once compile it once (a file lock)."""
    if cache is None:
        return _compile_document(doc, target, None, quiet), True
    entry = compile_cache.key(nameless, target)
    with compile_cache.locked(cache, entry):
        kernel = compile_cache.load(cache, entry, target)
        if kernel is not None:
            if config.check() and hasattr(kernel, "timeline"):
                kernel.timeline()
            return kernel, False
        kernel = _compile_document(doc, target, None, quiet)
        compile_cache.store(cache, entry, kernel)
    return kernel, True


class SpecializingGraph:
    """Runs a graph that needs its call's inputs to compile: one compiled graph per tuple of
    concrete sizes (symbolic shapes) and per BlockMask content (FlexAttention, see
    :mod:`torchneuron.flex`) or SDPA mask block structure (:mod:`torchneuron.sdpa`)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        target: str,
        dump: Path | None = None,
        cache: Path | None = None,
    ) -> None:
        self.gm = gm
        self.target = target
        self.dump = dump
        self.cache_dir = cache
        self.block_masks = flex.BlockMaskValues(gm)
        self.cache: dict[object, Callable[..., Any]] = {}

    def __call__(self, *args: Any) -> Any:
        masks = self.block_masks(args)
        key = (specialize.size_key(args), self.block_masks.key(masks))
        compiled = self.cache.get(key)
        if compiled is None:
            if self.cache:
                STATS.record_recompile()
                _report_recompile(_why_recompiled(next(reversed(self.cache)), key))
            compiled = self._compile(args, masks)
            self.cache[key] = compiled
        return compiled(*args)

    def _compile(self, args: Sequence[Any], masks: dict[str, torch.Tensor]) -> Callable[..., Any]:
        start = time.perf_counter()
        try:
            specialized = frontend.specialize_call(self.gm, args, masks)
        except Exception as e:  # the graph itself stays valid: run all of it in eager PyTorch
            first_line = (str(e).strip().splitlines() or [""])[0]
            reason = f"could not specialize to this call ({type(e).__name__}: {first_line})"
            fallback = [
                partition.FallbackNode(n.name, partition.op_name(n.target), reason, None)
                for n in self.gm.graph.nodes
                if partition.is_op(n)
            ]
            _report_fallback(fallback)
            STATS.record_compile(
                graphs=0,
                ops_on_device=0,
                fallback=[f.target for f in fallback],
                seconds=time.perf_counter() - start,
            )
            return self.gm
        return build_graph(specialized, self.target, self.dump, self.cache_dir)


def _compile_document(
    doc: dict[str, Any], target: str, dump: Path | None, quiet: bool = False
) -> Kernel:
    text = fx_json.to_json(doc)
    saved: Path | None = None
    stages = ""
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        saved = dump / f"{doc['name']}.json"
        saved.write_text(fx_json.to_json(doc, indent=1))
        stages = str(dump / doc["name"])
    c = native()
    # DeviceError (when the extension has it): the compiled program failed to load.
    errors = tuple(getattr(c, n) for n in ("CompileError", "DeviceError") if hasattr(c, n))
    try:
        kernel: Kernel = c.compile_graph(text, target, stages)
        if config.check() and hasattr(kernel, "timeline"):  # a GenericKernel has no sizes yet
            kernel.timeline()  # raises DeviceError for a missing wait
        return kernel
    except errors as e:
        if quiet:
            raise
        if saved is None:
            saved = Path(tempfile.mkdtemp(prefix="torchneuron-")) / f"{doc['name']}.json"
            saved.write_text(fx_json.to_json(doc, indent=1))
        note = (
            f"torchneuron: the graph is saved in {saved}; reproduce without Python with "
            f"`neuron-translate --import-fx {saved}` (target {target})"
        )
        # Dynamo reports only str(error) (it raises BackendCompilerFailed from None), so the
        # note goes into the message of an error of the same type.
        try:
            error = type(e)(f"{e}\n{note}")
        except Exception:
            e.add_note(note)
            raise e from None
        raise error from e


def _why_recompiled(previous: tuple[Any, Any], key: tuple[Any, Any]) -> str:
    """What differs between two specialization keys (sizes, then block masks)."""
    changes = [
        f"input {i}: {list(new[0]) if isinstance(new, tuple) else new} "
        f"(was {list(old[0]) if isinstance(old, tuple) else old})"
        for i, (old, new) in enumerate(zip(previous[0], key[0], strict=False))
        if old != new
    ]
    if previous[1] != key[1]:
        changes.append("a block mask with another block structure")
    return ", ".join(changes) or "new call signature"


def _report_recompile(why: str) -> None:
    config.tell(
        f"torchneuron: compiling a graph again, for this call's {why}: this graph's kernel "
        "programs are built for one set of sizes (stats()['recompiles'] counts these)"
    )


def _report_not_size_generic(why: str) -> None:
    config.tell(
        "torchneuron: a graph with symbolic sizes is compiled for each call's sizes, not once "
        f"for all: {why}"
    )


def _report_fallback(fallback: Sequence[partition.FallbackNode]) -> None:
    if not fallback:
        return
    message = "\n".join(
        [f"torchneuron: {len(fallback)} op(s) run in eager PyTorch:"]
        + [f"  {f.describe()}" for f in fallback]
    )
    config.tell(message)
