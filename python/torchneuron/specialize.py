"""Symbolic shapes: specialize a graph to the sizes of one call.

With dynamic shapes, Dynamo passes every size symbol as a ``SymInt`` placeholder and the
ATen graph computes sizes with ``sym_size`` and integer arithmetic. A graph the compiler cannot
make size-generic (:func:`torchneuron.backend.build_generic_graph`) is compiled once per tuple
of sizes it is called with: :func:`specialize` re-runs shape propagation with the call's real
inputs and folds every scalar node into a literal. Dynamo's guards keep the graph valid for all
those sizes.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Sequence

import sympy
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.node import Argument

from torchneuron.fx_json import concrete_scalar
from torchneuron.sizes import sym_values

__all__ = [
    "copy_graph_module",
    "has_data_dependent_sizes",
    "has_symbols",
    "is_static",
    "size_key",
    "specialize",
]


def has_symbols(value: object) -> bool:
    """Whether a node value (tensor, scalar, or a tuple/list of them) has a symbolic size."""
    return next(sym_values(value), None) is not None  # no truth test of a SymInt


def has_data_dependent_sizes(gm: torch.fx.GraphModule) -> bool:
    """Whether a node of ``gm`` has a size that depends on data (an unbacked symbol: the
    result of ``nonzero``, ``unique``, ``.item()``, ...)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(free_unbacked_symbols(node.meta.get("val")) for node in gm.graph.nodes)


def is_static(gm: torch.fx.GraphModule) -> bool:
    """True when no node of ``gm`` has a symbolic size or scalar value."""
    return not any(has_symbols(node.meta.get("val")) for node in gm.graph.nodes)


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy whose graph (nodes, node.meta dicts) can be rewritten without touching ``gm``.

    Attributes (parameters, constants) are shared, not copied."""
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def size_key(args: Sequence[object]) -> Hashable:
    """What selects a specialization: each tensor's shape and dtype, each scalar's value."""
    key: list[Hashable] = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            key.append((tuple(arg.shape), arg.dtype))
        elif isinstance(arg, (bool, int, float, str)) or arg is None:
            key.append(arg)
        else:
            key.append(type(arg).__name__)
    return tuple(key)


def _substitute(node: torch.fx.Node, value: Argument) -> None:
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda n: value if n is node else n)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n: value if n is node else n)


def specialize(gm: torch.fx.GraphModule, args: Sequence[object]) -> torch.fx.GraphModule:
    """A copy of ``gm`` for the concrete ``args`` of one call: every node's ``meta["val"]``
    recomputed with concrete sizes, and every scalar node (SymInt placeholders' uses,
    ``sym_size``, integer arithmetic, satisfied runtime asserts) folded into a literal.

    Data-dependent sizes (``nonzero``, ``item``) stay symbolic; the serializer rejects the nodes
    that depend on them, so those run in eager PyTorch."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    out = copy_graph_module(gm)
    for node in out.graph.nodes:
        # Symbols of the original ShapeEnv; the propagation below binds fresh ones.
        node.meta.pop("unbacked_bindings", None)
    mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True, allow_non_fake_inputs=True)
    FakeTensorProp(out, mode=mode).propagate(*_as_traced(gm, args, mode))

    graph = out.graph
    assert_scalar = torch.ops.aten._assert_scalar.default
    for node in list(graph.nodes):
        if node.op not in ("placeholder", "call_function"):
            continue
        if node.op == "call_function" and node.target is assert_scalar:
            condition = node.args[0]
            if condition is True:
                graph.erase_node(node)
            elif condition is False:
                raise AssertionError(f"runtime assert failed for these sizes: {node.args[1]}")
            continue
        scalar = concrete_scalar(node.meta.get("val"))
        if scalar is None:
            continue
        if isinstance(node.target, torch._ops.OpOverload) and not _is_size_query(node.target):
            continue  # an operator with a scalar result (item()) is real work, not a size
        _substitute(node, scalar)
        if node.op == "call_function":
            graph.erase_node(node)
    graph.lint()
    out.recompile()
    return out


def _as_traced(
    gm: torch.fx.GraphModule, args: Sequence[object], mode: FakeTensorMode
) -> list[object]:
    """The call's inputs as fake tensors with the strides the graph was traced with, evaluated
    at the call's sizes. A device kernel's outputs are contiguous whatever strides the graph
    gave them, so a tensor saved for the backward can arrive with other strides than the
    backward graph's views assumed; the device reads every input as contiguous, so only the
    shapes matter to it, but propagating the real strides would fail those views."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    binding: dict[sympy.Symbol, sympy.Integer] = {}
    for node, arg in zip(placeholders, args, strict=False):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(arg, int):
            sizes: list[tuple[object, int]] = [(val, arg)]
        elif isinstance(val, torch.Tensor) and isinstance(arg, torch.Tensor):
            sizes = list(zip(val.shape, arg.shape, strict=False))
        else:
            continue
        for size, concrete in sizes:
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                binding[size.node.expr] = sympy.Integer(concrete)

    def traced_strides(val: torch.Tensor, arg: torch.Tensor) -> list[int] | None:
        strides = []
        for stride in val.stride():
            expr = sympy.sympify(stride.node.expr if isinstance(stride, torch.SymInt) else stride)
            value = expr.xreplace(binding)
            if not value.is_Integer:
                return None
            strides.append(int(value))
        return strides

    out: list[object] = []
    for i, arg in enumerate(args):
        val = placeholders[i].meta.get("val") if i < len(placeholders) else None
        if isinstance(arg, torch.Tensor) and isinstance(val, torch.Tensor):
            strides = traced_strides(val, arg)
            if strides is not None and len(strides) == arg.dim():
                with mode:
                    arg = torch.empty_strided(
                        arg.shape, strides, dtype=arg.dtype, device=arg.device
                    )
        out.append(arg)
    return out


def _is_size_query(op: torch._ops.OpOverload) -> bool:
    return op.overloadpacket in (
        torch.ops.aten.sym_size,
        torch.ops.aten.sym_stride,
        torch.ops.aten.sym_numel,
        torch.ops.aten.sym_storage_offset,
    )
