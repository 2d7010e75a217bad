"""Graph-level entries of the persistent compile cache (:mod:`torchneuron.cache`).

A program entry saves the MLIR compile of one device region, but the process that loads it
still asks the importer which ops it lowers, partitions the graph and writes every region's
document, which costs more than the compile of a small graph. A graph entry saves all of it:
keyed by the whole ATen graph the backend is given (:func:`graph_text`), it holds what the
backend built from it (the outer graph: its eager ops and the calls of its device regions; each
region's program; the fallback report), and a hit rebuilds the compiled graph from that alone.

The key is a text of every node: its name, target (by a name that is checked to resolve back
to the same object), arguments, result dtypes/shapes/strides/devices, source line and block
classes, and of every attribute the graph reads (tensor constants by dtype, shape, strides and
a hash of their bytes; subgraphs such as FlexAttention modifiers by their own text), plus the
target chip, the compiler build, this package's sources and torch's version
(:func:`torchneuron.cache.graph_key`). A graph with anything that has no such text (an
attribute that is neither a tensor nor a graph, a tensor without data, a target or argument
without a resolvable name) is not keyed: it takes the program-level path and is counted in
``cache_info()["graph_skipped"]``.

Entries are read and written by :mod:`torchneuron.cache` (atomic, checksummed, capped, a bad
entry warned about, removed and recompiled); a graph entry that parses but does not rebuild is
bad too. Graph entries take no lock: two processes missing one graph at once both partition
it, and the program-level lock still makes them compile each region once.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from torchneuron import cache, config, fx_json, nki_op
from torchneuron._native import native
from torchneuron._stats import STATS
from torchneuron.attention_blocks import BLOCKS_META, MASK_FORM_META
from torchneuron.kernel import DeviceKernel
from torchneuron.partition import FallbackNode

__all__ = ["GraphHit", "Unkeyable", "graph_text", "key", "load", "store"]

log = logging.getLogger("torchneuron")


class Unkeyable(Exception):
    """A part of a graph without a reliable text."""


@dataclass
class GraphHit:
    """A compiled graph rebuilt from its entry, with what :func:`torchneuron.stats` counts."""

    module: torch.fx.GraphModule
    ops_on_device: int
    fallback: list[FallbackNode]


# -- targets and arguments as JSON, and back --------------------------------------------------

_refs: dict[object, str] = {}


def _resolve(ref: str) -> Any:
    kind, _, name = ref.partition(":")
    if kind == "op":  # ns.op.overload
        obj: Any = torch.ops
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj
    if kind == "hop":
        return getattr(torch.ops.higher_order, name)
    if kind == "fn":
        module, _, qualname = name.partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    raise ValueError(f"unknown target reference {ref!r}")


def _target_ref(target: object) -> str:
    """A name of a ``call_function`` target that resolves back to it (checked once per target)."""
    try:
        return _refs[target]
    except (KeyError, TypeError):
        pass
    if nki_op.is_kernel_op(target):
        # The kernel's code is not in the key: an edited kernel would meet regions compiled
        # for its old outputs.
        raise Unkeyable(f"{target} calls an NKI kernel")
    if isinstance(target, torch._ops.OpOverload):
        ref = f"op:{target}"
    elif isinstance(target, torch._ops.HigherOrderOperator):
        ref = f"hop:{target.name()}"  # type: ignore[no-untyped-call]
    else:
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", None)
        if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
            raise Unkeyable(f"target {target!r} has no importable name")
        ref = f"fn:{module}:{qualname}"
    try:
        resolved = _resolve(ref)
    except Exception:
        resolved = None
    if resolved is not target:
        raise Unkeyable(f"target {target!r} does not resolve back from {ref!r}")
    _refs[target] = ref
    return ref


_TORCH_ENUMS = (torch.dtype, torch.memory_format, torch.layout)
_PLAIN = frozenset({int, bool, str, type(None)})


def _value(value: object) -> Any:
    """An argument as JSON: nodes by name; every container and non-JSON value tagged."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, torch.fx.Node):
        return {"n": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"f": value.hex()}
    if isinstance(value, list):
        return [_value(v) for v in value]
    if isinstance(value, tuple):
        return {"t": [_value(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise Unkeyable("a dict argument with keys that are not strings")
        return {"d": [[k, _value(v)] for k, v in value.items()]}
    if isinstance(value, _TORCH_ENUMS):
        name = str(value).removeprefix("torch.")
        if getattr(torch, name, None) is not value:
            raise Unkeyable(f"{value!r} is not torch.{name}")
        return {"torch": name}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, slice):
        return {"slice": [_value(value.start), _value(value.stop), _value(value.step)]}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        scalar = fx_json.concrete_scalar(value)
        if scalar is None:
            raise Unkeyable(f"symbolic value {value}")
        return _value(scalar)
    raise Unkeyable(f"an argument of type {type(value).__name__}")


def _decode(value: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    if isinstance(value, list):
        return [_decode(v, nodes) for v in value]
    if not isinstance(value, dict):
        return value
    ((tag, body),) = value.items()
    if tag == "n":
        return nodes[body]
    if tag == "f":
        return float.fromhex(body)
    if tag == "t":
        return tuple(_decode(v, nodes) for v in body)
    if tag == "d":
        return {k: _decode(v, nodes) for k, v in body}
    if tag == "torch":
        decoded = getattr(torch, body)
        if not isinstance(decoded, _TORCH_ENUMS):
            raise ValueError(f"torch.{body} is not a dtype, memory format or layout")
        return decoded
    if tag == "device":
        return torch.device(body)
    if tag == "slice":
        return slice(*(_decode(v, nodes) for v in body))
    raise ValueError(f"unknown value tag {tag!r}")


# -- the key ---------------------------------------------------------------------------------


def _tensor_digest(tensor: torch.Tensor) -> str:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(tensor, FakeTensor) or tensor.device.type == "meta":
        raise Unkeyable("a tensor constant without data")
    t = tensor.detach().to("cpu").contiguous()
    t = t.view(fx_json.numpy_storage_dtype(t.dtype))
    try:
        data = t.numpy().tobytes()
    except (TypeError, RuntimeError) as e:
        raise Unkeyable(f"a tensor constant of dtype {tensor.dtype}") from e
    return hashlib.sha256(data).hexdigest()


def _spec(value: object) -> Any:
    """A node result's metadata: what the document and the partitioner read of it."""
    if isinstance(value, torch.Tensor):
        try:
            sizes = (*value.shape, *value.stride())
        except RuntimeError as e:  # sparse and other layouts without strides
            raise Unkeyable(f"a result of layout {value.layout}") from e
        if not all(type(s) is int for s in sizes):
            sizes = tuple(_value(s) for s in sizes)
        return [str(value.dtype), sizes, str(value.device)]
    if isinstance(value, (tuple, list)):
        return [_spec(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, torch.SymInt, torch.SymFloat)):
        return _value(value)
    return type(value).__name__


def _attribute(gm: torch.fx.GraphModule, target: str) -> Any:
    value = fx_json.fetch_attr(gm, target)
    if isinstance(value, torch.Tensor):
        return [_spec(value), _tensor_digest(value)]
    if isinstance(value, torch.fx.GraphModule):
        return _graph_lines(value)
    raise Unkeyable(f"attribute {target} is a {type(value).__name__}")


@functools.lru_cache(maxsize=1024)
def _location(stack_trace: str | None) -> dict[str, Any] | None:
    """A node's source line, as the document has it (the same trace repeats across nodes)."""
    return fx_json.source_location(stack_trace)


def _graph_lines(gm: torch.fx.GraphModule) -> list[Any]:
    lines: list[Any] = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            target: Any = _target_ref(node.target)
        elif node.op in ("placeholder", "output"):
            target = str(node.target)
        elif node.op == "get_attr":
            target = [str(node.target), _attribute(gm, str(node.target))]
        else:
            raise Unkeyable(f"a {node.op} node")
        blocks = node.meta.get(BLOCKS_META)
        lines.append(
            [
                node.op,
                node.name,
                target,
                _value(node.args),
                _value(node.kwargs),
                _spec(node.meta.get("val")),
                _location(node.meta.get("stack_trace")),
                None if blocks is None else [list(blocks.shape), _tensor_digest(blocks)],
                node.meta.get(MASK_FORM_META),
            ]
        )
    return lines


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The text of ``gm`` a graph entry is keyed by; raises :class:`Unkeyable`."""
    return json.dumps(_graph_lines(gm), separators=(",", ":"))


def key(gm: torch.fx.GraphModule, target: str) -> str | None:
    """The graph entry key of ``gm`` for ``target``, or None when it cannot be keyed (counted
    in ``cache_info()["graph_skipped"]``)."""
    try:
        text = graph_text(gm)
    except Unkeyable as e:
        log.debug("torchneuron: graph not keyed for the compile cache: %s", e)
        STATS.record_graph_skipped()
        return None
    return cache.graph_key(text, target)


# -- entries ---------------------------------------------------------------------------------


def store(
    directory: Path,
    k: str,
    gm: torch.fx.GraphModule,
    module: torch.fx.GraphModule,
    ops_on_device: int,
    fallback: Sequence[FallbackNode],
) -> None:
    """Store ``module``, compiled from ``gm`` (:func:`torchneuron.backend.build_graph`), under
    ``k``. A module that has no text (an eager op without an importable name, an attribute
    that ``gm`` does not have) is not stored."""
    nodes: list[Any] = []
    regions: dict[str, Any] = {}
    try:
        for node in module.graph.nodes:
            target: Any = str(node.target)
            if node.op == "call_function":
                target = _target_ref(node.target)
            elif node.op == "call_module":
                kernel = module.get_submodule(target)
                if not isinstance(kernel, DeviceKernel):
                    raise Unkeyable(f"submodule {target} is not a device kernel")
                regions[target] = {
                    "program": kernel.kernel.program_json,
                    "returns_tuple": kernel.returns_tuple,
                    "output_map": kernel.output_map,
                }
            elif node.op == "get_attr":
                if fx_json.fetch_attr(module, target) is not _attribute_or_none(gm, target):
                    raise Unkeyable(f"attribute {target} is not the graph's own")
            elif node.op not in ("placeholder", "output"):
                raise Unkeyable(f"a {node.op} node")
            nodes.append([node.op, node.name, target, _value(node.args), _value(node.kwargs)])
    except Unkeyable as e:
        log.debug("torchneuron: compiled graph not stored in the compile cache: %s", e)
        return
    payload = {
        "nodes": nodes,
        "regions": regions,
        "ops_on_device": ops_on_device,
        "fallback": [[f.name, f.target, f.reason, f.loc] for f in fallback],
    }
    cache.store_graph(directory, k, json.dumps(payload, separators=(",", ":")))


def _attribute_or_none(gm: torch.fx.GraphModule, target: str) -> object:
    try:
        return fx_json.fetch_attr(gm, target)
    except AttributeError:
        return None


def load(
    directory: Path,
    k: str,
    gm: torch.fx.GraphModule,
    target: str,
    name: Callable[[], str],
) -> GraphHit | None:
    """The compiled graph stored under ``k`` for ``gm`` (whose attributes it reads), its device
    kernels named by ``name()``; None on a miss or a bad entry (warned about and removed)."""
    return cache.load_graph(directory, k, lambda payload: _rebuild(payload, gm, target, name))


def _rebuild(
    payload: str, gm: torch.fx.GraphModule, target: str, name: Callable[[], str]
) -> GraphHit:
    plan = json.loads(payload)
    regions: dict[str, Any] = plan["regions"]
    graph = torch.fx.Graph()
    nodes: dict[str, torch.fx.Node] = {}
    root: dict[str, Any] = {}
    c = native()
    for op, node_name, node_target, args, kwargs in plan["nodes"]:
        if op == "call_function":
            node_target = _resolve(node_target)
        elif op == "get_attr":
            root[node_target] = fx_json.fetch_attr(gm, node_target)
        elif op == "call_module":
            entry = regions[node_target]
            kernel = c.load_program(entry["program"], target)  # verified, or raises
            if config.check():
                kernel.timeline()
            root[node_target] = DeviceKernel(
                kernel, name(), entry["returns_tuple"], entry["output_map"]
            )
        elif op not in ("placeholder", "output"):
            raise ValueError(f"a {op} node")
        node = graph.create_node(
            op, node_target, _decode(args, nodes), _decode(kwargs, nodes), name=node_name
        )
        if node.name != node_name:
            raise ValueError(f"node {node_name} is named {node.name} in the rebuilt graph")
        nodes[node_name] = node
    graph.lint()
    module = torch.fx.GraphModule(root, graph)
    fallback = [FallbackNode(*f) for f in plan["fallback"]]
    return GraphHit(module, int(plan["ops_on_device"]), fallback)
