"""Split an ATen FX graph into device regions and eager PyTorch.

The C++ importer decides what it can lower (``_C.check_graph`` on the whole graph's document);
nodes the document cannot express are unsupported too. Supported nodes are grouped into as few
regions as the graph's dependencies allow (``CapabilityBasedPartitioner``); each region becomes
a submodule that is compiled into one kernel. Everything else stays in the outer graph and runs
in eager PyTorch, so a model never fails because an op is unsupported.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from torchneuron import flex, fx_json, nki_op, rng

__all__ = [
    "DEVICE_PREFIX",
    "FallbackNode",
    "PartitionResult",
    "find_unsupported",
    "is_compute",
    "is_host_check",
    "is_op",
    "op_name",
    "partition_graph",
]

#: Name prefix of the submodules that hold device regions.
DEVICE_PREFIX = "neuron_graph_"

_REJECTED = "rejected by the importer"
_VIEW_ONLY = "only view/metadata ops in this region, no device work"


@dataclass(frozen=True)
class FallbackNode:
    """A ``call_function`` node left to eager PyTorch."""

    name: str
    target: str
    reason: str
    loc: str | None  # "file:line" of the user's Python source, when known

    def describe(self) -> str:
        where = f" at {self.loc}" if self.loc else ""
        return f"{self.target} ({self.name}){where}: {self.reason}"


@dataclass
class PartitionResult:
    module: torch.fx.GraphModule  # the outer graph; device regions are submodules
    device_submodules: list[str] = field(default_factory=list)
    fallback: list[FallbackNode] = field(default_factory=list)
    ops_on_device: int = 0


def op_name(target: object) -> str:
    """``aten.add.Tensor`` for ATen overloads, a qualified Python name otherwise."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"  # type: ignore[no-untyped-call]
    return torch.fx.node._get_qualified_name(target)  # type: ignore[arg-type]


def is_compute(node: torch.fx.Node) -> bool:
    """Whether a node is device work: views, ``getitem`` and size queries are not."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return not target.is_view and target not in fx_json.SCALAR_TARGETS
    return target not in fx_json.SCALAR_TARGETS


def is_op(node: torch.fx.Node) -> bool:
    """Whether a node is an operator call counted in the stats (not ``getitem``, a size
    computation, the host drawing a random seed (:func:`rng.next_seed`) or checking a
    factorization's ``info`` (:func:`is_host_check`), or a complex tensor read as float pairs
    and back)."""
    return (
        node.op == "call_function"
        and node.target is not operator.getitem
        and node.target not in fx_json.SCALAR_TARGETS
        and node.target is not rng.next_seed
        and not is_host_check(node)
        and node.target not in _COMPLEX_VIEWS
    )


#: The views between a complex tensor and its float32 pairs (:mod:`torchneuron.complex_math`):
#: the same memory read as either, how a kernel takes and returns complex values.
_COMPLEX_VIEWS = (torch.ops.aten.view_as_real.default, torch.ops.aten.view_as_complex.default)


def is_host_check(node: torch.fx.Node) -> bool:
    """``torch.linalg``'s check of a factorization's ``info`` (functionalized as
    ``with_effects(token, _linalg_check_errors, info, ...)``): it raises on the host when a
    matrix is singular or not positive definite, as torch does after the factorization on
    every device (a CUDA ``linalg.inv`` synchronizes for it too). It reads a device result;
    it is not device work."""
    return (
        node.op == "call_function"
        and node.target is torch.ops.higher_order.with_effects
        and len(node.args) > 1
        and node.args[1] is torch.ops.aten._linalg_check_errors.default
    )


class _Support(OperatorSupportBase):
    def __init__(self, unsupported: Mapping[str, str]) -> None:
        self.unsupported = unsupported

    def is_node_supported(
        self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node
    ) -> bool:
        if node.op != "call_function" or node.name in self.unsupported:
            return False
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, torch.fx.Node) and self.is_node_supported(submodules, source)
        return isinstance(node.target, torch._ops.OpOverload) or flex.is_flex(node)


def find_unsupported(
    gm: torch.fx.GraphModule,
    name: str = "check",
    *,
    symbolic: bool = False,
    written: fx_json.Written | None = None,
) -> dict[str, str]:
    """``{node name: reason}`` for every node that cannot go to the device: those the document
    cannot express, and those ``_C.check_graph`` rejects. A graph the importer cannot read at
    all (``_C.CompileError``) is unsupported as a whole. ``symbolic``: check the graph with its
    symbolic sizes (:mod:`torchneuron.sizes`). ``written`` receives the entries the regions'
    documents reuse (:class:`torchneuron.fx_json.Written`)."""
    from torchneuron._native import native

    doc, unsupported = fx_json.serialize_graph_lenient(gm, name, symbolic=symbolic, written=written)
    if not doc["nodes"]:
        return unsupported
    c = native()
    try:
        rejected = c.check_graph(fx_json.to_json(doc))
    except c.CompileError as e:
        rejected = {"": str(e)}
    if "" in rejected:  # the importer cannot read the document at all
        reason = f"the importer cannot read this graph: {rejected['']}"
        whole = {n.name: reason for n in gm.graph.nodes if is_op(n)}
        return {**whole, **unsupported}
    return {**{str(k): str(v) for k, v in rejected.items()}, **unsupported}


def partition_graph(
    gm: torch.fx.GraphModule, unsupported: Mapping[str, str] | Iterable[str]
) -> PartitionResult:
    """Move every supported region of ``gm`` into a ``neuron_graph_<i>`` submodule (in place).

    ``unsupported`` names the nodes that must stay in eager PyTorch (a mapping gives the
    reasons). Regions without device work (only views) stay eager as well. Tensor constants
    used by a region move into its submodule, so each submodule is a self-contained graph.
    """
    reasons: dict[str, str] = (
        dict(unsupported)
        if isinstance(unsupported, Mapping)
        else dict.fromkeys(unsupported, _REJECTED)
    )
    support = _Support(reasons)
    partitions: list[Partition] = [
        p
        for proposed in _propose_partitions(gm, support)
        for p in _isolate_grouped_gemms(proposed)
        if any(is_compute(n) for n in p.nodes)
    ]
    on_device = {n for p in partitions for n in p.nodes}

    result = PartitionResult(module=gm)
    for node in gm.graph.nodes:
        if not is_op(node):
            continue
        if node in on_device or _is_kernel_call(node):
            result.ops_on_device += 1
            continue
        if node.name in reasons:
            reason = reasons[node.name]
        elif not isinstance(node.target, torch._ops.OpOverload) and not flex.is_flex(node):
            reason = "not an ATen operator"
        elif support.is_node_supported({}, node):
            reason = _VIEW_ONLY
        else:
            reason = "its input comes from an unsupported operator result"
        result.fallback.append(
            FallbackNode(node.name, op_name(node.target), reason, fx_json.source_line(node))
        )

    if partitions:
        fuse_by_partitions(gm, [p.nodes for p in partitions], prefix=DEVICE_PREFIX)
        result.device_submodules = [f"{DEVICE_PREFIX}{i}" for i in range(len(partitions))]
        for submodule in result.device_submodules:
            _inline_constants(gm, submodule)
            _views_of_inputs_on_host(gm, submodule)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return result


def _propose_partitions(gm: torch.fx.GraphModule, support: _Support) -> list[Partition]:
    """``CapabilityBasedPartitioner``'s partitions of ``gm``. When it supports every operator,
    they are one partition of them all (it merges every partition that makes no cycle, and none
    can when all are supported), built here without its search: that takes time quadratic in
    the graph's size (20 s for the 7800 nodes of an 8000-element sort)."""
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    if all(support.is_node_supported({}, n) for n in ops):
        return [Partition(id=0, nodes=ops)] if ops else []
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    return partitioner.propose_partitions()


def _isolate_grouped_gemms(partition: Partition) -> list[Partition]:
    """``partition``, or its nodes in several partitions when it holds a ``_grouped_mm`` and
    more: what the GEMM depends on, the GEMM alone (with the views only it reads), then the
    rest, each cut again. The grouped-GEMM kernel binds each group's rows from its offsets'
    values when it is launched (:func:`torchneuron.decompositions.grouped_mm_kernel`), so
    offsets the graph computes (a router's ``cumsum``) must come from another region; and its
    loops over groups, any of which may be empty, would make every later instruction of a
    kernel it shared wait for each of theirs (nisa-insert-sync took 72 s on a 2048-token
    Mixtral block). No part depends on another's nodes through a third partition (the whole
    made no cycle), so each is a region."""
    nodes = set(partition.nodes)
    gemm = next(
        (n for n in partition.nodes if n.target is torch.ops.aten._grouped_mm.default), None
    )
    if gemm is None or len(nodes) == 1:
        return [partition]
    # The GEMM with the views only it reads (its weights transposed: a view of a region's
    # input, a copy as another region's output).
    own = {gemm}
    stack = list(gemm.all_input_nodes)
    while stack:
        node = stack.pop()
        if (
            node in nodes
            and isinstance(node.target, torch._ops.OpOverload)
            and node.target.is_view
            and all(user in own for user in node.users)
        ):
            own.add(node)
            stack.extend(node.all_input_nodes)
    before: set[torch.fx.Node] = set()
    stack = [n for node in own for n in node.all_input_nodes]
    while stack:
        node = stack.pop()
        if node in nodes and node not in before and node not in own:
            before.add(node)
            stack.extend(node.all_input_nodes)
    # A multi-output node's items go where it goes (a region returns them, not its tuple).
    before |= {n for n in nodes if n.target is operator.getitem and n.args[0] in before}
    after = [n for n in partition.nodes if n not in before and n not in own]
    return [
        *_isolate_grouped_gemms(Partition(nodes=[n for n in partition.nodes if n in before])),
        Partition(nodes=[n for n in partition.nodes if n in own]),
        *_isolate_grouped_gemms(Partition(nodes=after)),
    ]


def _is_kernel_call(node: torch.fx.Node) -> bool:
    """An NKI kernel call, device work of its own (its operator runs the kernel's program on
    the engine model between the regions, torchneuron/nki_op.py), or a view that only
    reshapes a kernel call's argument or result (the views of a library call's wrapper)."""
    if nki_op.is_kernel_op(node.target):
        return True
    if not (isinstance(node.target, torch._ops.OpOverload) and node.target.is_view):
        return False
    # A kernel's results come out of its list through getitem nodes.
    sources = [n.args[0] if n.target is operator.getitem else n for n in node.all_input_nodes]
    neighbours = [*sources, *node.users]
    return any(isinstance(n, torch.fx.Node) and nki_op.is_kernel_op(n.target) for n in neighbours)


def _view_chain(value: object) -> tuple[list[torch.fx.Node], torch.fx.Node] | None:
    """The views (last first) that make ``value`` from a region's input, and that input;
    None when ``value`` is not such a chain or a view takes a traced value besides its base
    (a symbolic size), which the outer graph does not have."""
    views: list[torch.fx.Node] = []
    while (
        isinstance(value, torch.fx.Node)
        and isinstance(value.target, torch._ops.OpOverload)
        and value.target.is_view
        and isinstance(value.args[0], torch.fx.Node)
        and value.all_input_nodes == [value.args[0]]
    ):
        views.append(value)
        value = value.args[0]
    if not views or not isinstance(value, torch.fx.Node) or value.op != "placeholder":
        return None
    return views, value


def _views_of_inputs_on_host(gm: torch.fx.GraphModule, submodule: str) -> None:
    """Make each output of the region that is only views of one of its inputs (a router
    returns ``x.view(-1, hidden)`` beside its logits) in the outer graph, from the input, as
    eager does: an alias of the input's memory. As the kernel's output it would be a copy of
    the whole tensor from HBM to HBM (23 us of a Mixtral router's 87)."""
    (call,) = [n for n in gm.graph.nodes if n.op == "call_module" and n.target == submodule]
    sub = gm.get_submodule(submodule)
    assert isinstance(sub, torch.fx.GraphModule)
    output = sub.graph.output_node()
    values = output.args[0]
    if not isinstance(values, (tuple, list)):
        return  # a lone output made of views only: the region would have no device work
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    items = {u.args[1]: u for u in call.users if u.target is operator.getitem}
    if len(items) != len(call.users):
        return  # the outer graph reads the outputs some other way
    chains = {i: _view_chain(v) for i, v in enumerate(values)}
    host = {i: c for i, c in chains.items() if c is not None}
    if not host or len(host) == len(values):
        return
    for i, (views, base) in host.items():
        value = call.args[placeholders.index(base)]
        item = items.get(i)
        if item is None:
            continue
        with gm.graph.inserting_before(item):
            for view in reversed(views):
                value = gm.graph.call_function(view.target, (value, *view.args[1:]), view.kwargs)
                value.meta = dict(view.meta)
        item.replace_all_uses_with(value)
        gm.graph.erase_node(item)
    kept = [i for i in range(len(values)) if i not in host]
    for new, old in enumerate(kept):
        if old in items:
            items[old].args = (call, new)
    output.args = (tuple(values[i] for i in kept),)
    sub.graph.eliminate_dead_code()
    sub.recompile()


def _inline_constants(gm: torch.fx.GraphModule, submodule: str) -> None:
    """Turn the submodule inputs that are tensor constants or subgraphs (FlexAttention
    modifiers) of ``gm`` into its own attributes."""
    (call,) = [n for n in gm.graph.nodes if n.op == "call_module" and n.target == submodule]
    sub = gm.get_submodule(submodule)
    assert isinstance(sub, torch.fx.GraphModule)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(call.args)
    first_body = next(n for n in sub.graph.nodes if n.op != "placeholder")
    kept_args = []
    for placeholder, arg in zip(placeholders, call.args, strict=True):
        value = (
            fx_json.fetch_attr(gm, str(arg.target))
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr"
            else None
        )
        if not isinstance(value, (torch.Tensor, torch.fx.GraphModule)):
            kept_args.append(arg)
            continue
        attr = placeholder.name
        if isinstance(value, torch.Tensor):
            sub.register_buffer(attr, value, persistent=False)
        else:
            sub.add_submodule(attr, value)
        with sub.graph.inserting_before(first_body):
            constant = sub.graph.get_attr(attr)
        constant.meta = dict(placeholder.meta)
        placeholder.replace_all_uses_with(constant)
        sub.graph.erase_node(placeholder)
    if len(kept_args) != len(call.args):
        call.args = tuple(kept_args)
        sub.graph.lint()
        sub.recompile()
