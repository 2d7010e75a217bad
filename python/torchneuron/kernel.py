"""Calling a compiled device kernel from a graph: tensors in, tensors out."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from torchneuron import collectives
from torchneuron._native import BufferArg, GenericKernel, Kernel
from torchneuron._stats import STATS
from torchneuron.fx_json import DTYPE_NAMES, dtype_from_name
from torchneuron.profile import record_run
from torchneuron.sizes import NotSizeGeneric

__all__ = ["DeviceKernel", "GenericDeviceKernel", "modeled_work"]


def modeled_work(kernel: Kernel) -> tuple[float, dict[str, float]]:
    """One run's modeled time and what it keeps busy (ns per engine, DMA, HBM): what kernels
    on other streams compete for (``runtime/device/Stream.h``)."""
    t = kernel.timeline()
    busy = {k: float(v) for k, v in t["engine_busy_ns"].items() if not k.endswith("_avg")}
    return float(t["device_ns"]), busy  # dma_avg is a statistic, not a resource


def _buffer(tensor: torch.Tensor) -> BufferArg:
    return (tensor.data_ptr(), DTYPE_NAMES[tensor.dtype], list(tensor.shape))


class DeviceKernel(torch.nn.Module):
    """Stands in for one device region (a ``neuron_graph_<i>`` submodule) of a graph.

    Inputs are made contiguous (and kept alive for the call); outputs are allocated here with
    the kernel's output specs and filled by ``kernel.run``. On neuron tensors, the run's
    modeled time goes on the current stream of their device, as an eager kernel's does, so
    events and profiles place it on the device's timeline."""

    def __init__(
        self,
        kernel: Kernel,
        name: str,
        returns_tuple: bool,
        output_map: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.kernel = kernel
        self.graph_name = name
        self.returns_tuple = returns_tuple
        # The graph's outputs by kernel output: a value the graph returns twice is one output.
        self.output_map = list(output_map) if output_map is not None else None
        self.input_specs = [(dtype_from_name(d), tuple(s)) for d, s in kernel.input_specs]
        self.output_specs = [(dtype_from_name(d), list(s)) for d, s in kernel.output_specs]
        # Collective instructions run through the c10d process groups they name.
        self.collectives = collectives.handler() if kernel.has_collectives else None
        self._work: tuple[float, dict[str, float]] | None = None  # (ns, busy ns per resource)
        if not returns_tuple and len(self.output_specs) != 1:
            raise RuntimeError(
                f"{name}: kernel has {len(self.output_specs)} outputs, the graph expects 1"
            )

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if len(args) != len(self.input_specs):
            raise RuntimeError(
                f"{self.graph_name}: kernel takes {len(self.input_specs)} inputs, got {len(args)}"
            )
        inputs = []
        for i, (arg, (dtype, shape)) in enumerate(zip(args, self.input_specs, strict=True)):
            if arg.dtype == torch.float64 and dtype == torch.float32 and arg.dim() == 0:
                arg = arg.to(dtype)  # a Python float Dynamo passed as a tensor (rewrite.py)
            if arg.dtype == torch.float8_e8m0fnu and dtype == torch.uint8:
                arg = arg.view(torch.uint8)  # MX scales: the program holds their E8M0 bits
            if arg.dtype != dtype or tuple(arg.shape) != shape:
                raise RuntimeError(
                    f"{self.graph_name}: input {i} is {arg.dtype}{list(arg.shape)}, "
                    f"the kernel was compiled for {dtype}{list(shape)}"
                )
            inputs.append(arg.detach().contiguous())
        # Outputs live where the inputs do: neuron device memory is host memory, so the kernel
        # reads and writes neuron tensors in place, as it does CPU tensors.
        device = next((t.device for t in inputs if t.device.type != "cpu"), None)
        outputs = [
            torch.empty(shape, dtype=dtype, device=device) for dtype, shape in self.output_specs
        ]
        if torch.autograd.profiler._is_profiler_enabled:
            # A range in torch.profiler traces whose one input is the modeled device time (ns).
            # torch records a range's inputs under record_shapes=True, and only numbers among
            # them: record_function's string argument is dropped ("Concrete Inputs": [""]).
            device_ns = float(self.kernel.timeline()["device_ns"])
            handle = torch.autograd._record_function_with_args_enter(
                f"neuron:{self.graph_name}", device_ns
            )
            try:
                self._run(inputs, outputs)
            finally:
                torch.autograd._record_function_with_args_exit(handle)
        else:
            self._run(inputs, outputs)
        STATS.record_kernel_run()
        start_ns = self._place(device) if device is not None else None
        record_run(self.kernel, self.graph_name, start_ns=start_ns)
        if self.output_map is not None:
            outputs = [outputs[i] for i in self.output_map]
        return tuple(outputs) if self.returns_tuple else outputs[0]

    def _place(self, device: torch.device) -> float:
        """Put the run's modeled time on ``device``'s current stream; when it started."""
        from torchneuron import device as neuron_device

        if self._work is None:
            self._work = modeled_work(self.kernel)
        ns, busy = self._work
        start, _ = neuron_device._place_modeled_work(ns, neuron_device.current_stream(device), busy)
        return start

    def _run(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        self.kernel.run(
            [_buffer(t) for t in inputs], [_buffer(t) for t in outputs], self.collectives
        )

    def extra_repr(self) -> str:
        return (
            f"{self.graph_name}, inputs={len(self.input_specs)}, outputs={len(self.output_specs)}"
        )


class GenericDeviceKernel(torch.nn.Module):
    """Stands in for a device region compiled once for every size: a size-generic program
    (docs/PROGRAM_FORMAT.md, "Size parameters"). Each call's sizes are read from its arguments
    (an input's dimension, or a size passed as an int) and select the program's instance, a
    :class:`DeviceKernel` made on first use; the most recent :data:`KEEP` instances are kept
    (each holds an executor's on-chip scratch memory)."""

    #: How many instances (tuples of sizes) stay loaded.
    KEEP = 8

    def __init__(
        self,
        kernel: GenericKernel,
        name: str,
        returns_tuple: bool,
        output_map: Sequence[int] | None,
        region: torch.fx.GraphModule,
        document: dict[str, Any],
    ) -> None:
        super().__init__()
        self.kernel = kernel
        self.graph_name = name
        self.returns_tuple = returns_tuple
        self.output_map = output_map
        self.names = [p[0] for p in kernel.params]
        self.element_bindings = _element_bindings(region, document)
        self.tensor_args, self.bindings = _size_bindings(
            region, document, [n for n in self.names if n not in self.element_bindings]
        )
        self.instances: OrderedDict[tuple[int, ...], DeviceKernel] = OrderedDict()

    def _read_values(self, args: Sequence[Any]) -> dict[str, int]:
        """The parameters bound from an input's values (a grouped GEMM's row ends, the
        offsets): each such input read once per call, as the chip loads them into registers
        for its loop bounds. Offsets must not decrease (the ranges check the rest)."""
        values: dict[int, list[int]] = {}
        sizes: dict[str, int] = {}
        for name, (position, index) in self.element_bindings.items():
            if position not in values:
                row = [int(v) for v in args[position].reshape(-1).tolist()]
                STATS.record_launch_read()
                if any(b < a for a, b in itertools.pairwise(row)):
                    raise RuntimeError(
                        f"{self.graph_name}: offsets {row} decrease (they must be cumulative "
                        "row ends of groups)"
                    )
                values[position] = row
            sizes[name] = values[position][index]
        return sizes

    def forward(self, *args: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        sizes: dict[str, int] = {}
        for position, dim, name in self.bindings:
            arg = args[position]
            sizes[name] = int(arg.shape[dim]) if dim is not None else int(arg)
        if self.element_bindings:
            sizes.update(self._read_values(args))
        key = tuple(sizes[n] for n in self.names)
        instance = self.instances.get(key)
        if instance is None:
            instance = DeviceKernel(
                self.kernel.instance(sizes), self.graph_name, self.returns_tuple, self.output_map
            )
            self.instances[key] = instance
            if len(self.instances) > self.KEEP:
                self.instances.popitem(last=False)
        else:
            self.instances.move_to_end(key)
        return instance(*(args[i] for i in self.tensor_args))

    def extra_repr(self) -> str:
        return f"{self.graph_name}, sizes={self.names}, instances={len(self.instances)}"


def _element_bindings(
    region: torch.fx.GraphModule, document: dict[str, Any]
) -> dict[str, tuple[int, int]]:
    """Parameters the document binds to an element of an input (``element_of``: [input name,
    index]): name -> (argument position, index)."""
    positions = {
        n.name: i for i, n in enumerate(n for n in region.graph.nodes if n.op == "placeholder")
    }
    out: dict[str, tuple[int, int]] = {}
    for sym in document.get("symbols", []):
        if "element_of" in sym:
            source, index = sym["element_of"]
            if source not in positions:
                raise NotSizeGeneric(f"{sym['name']} reads {source}, not an argument")
            out[sym["name"]] = (positions[source], int(index))
    return out


def _size_bindings(
    region: torch.fx.GraphModule, document: dict[str, Any], names: Sequence[str]
) -> tuple[list[int], list[tuple[int, int | None, str]]]:
    """Where a region's call finds each size parameter: ``(argument position, dimension or None
    for an int argument, name)``, and the positions of its tensor arguments (the document's
    inputs, in order). Raises :class:`NotSizeGeneric` for a size no argument gives as it is."""
    shapes = {entry["name"]: entry["shape"] for entry in document["inputs"]}
    tensor_args: list[int] = []
    bindings: dict[str, tuple[int, int | None, str]] = {}
    placeholders = [n for n in region.graph.nodes if n.op == "placeholder"]
    for position, node in enumerate(placeholders):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            if node.name not in shapes:
                raise NotSizeGeneric(f"input {node.name} is not a document input")
            tensor_args.append(position)
            for dim, size in enumerate(shapes[node.name]):
                if isinstance(size, str) and size in names:
                    bindings.setdefault(size, (position, dim, size))
        elif isinstance(value, torch.SymInt) and str(value.node.expr) in names:
            bindings.setdefault(str(value.node.expr), (position, None, str(value.node.expr)))
    missing = [n for n in names if n not in bindings]
    if missing:
        raise NotSizeGeneric(f"sizes {missing} are not an input's dimension or argument")
    if len(tensor_args) != len(document["inputs"]):
        raise NotSizeGeneric("the document's inputs are not the region's tensor arguments")
    return tensor_args, list(bindings.values())
