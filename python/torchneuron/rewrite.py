"""Rewrites of an ATen graph before it is checked and partitioned (steps of
:data:`torchneuron.frontend.REWRITES`): nodes whose meaning depends on what the FX document does
not carry, written as ops that say it explicitly.

- ``aten.as_strided`` of a contiguous tensor, reading its elements in row-major order from
  offset 0 (as the training forward of group norm and adaptive pooling to size 1 do), is a
  ``view``; the stride of a size-1 dimension never moves, so it may be anything. The document gives
  tensors as values without strides, so the importer cannot tell this case from one that reads
  storage in another order; here the node's input metadata can. Another window of such a
  tensor (overlapping, transposed, strided: Swin's windows, OpInfo's partial views) inside
  its elements is a gather of them at positions computed on the host (a constant): in a
  functional graph nothing writes through the view, so a copy reads the same.
- A Python float that Dynamo passes as a 0-d float64 tensor (a float argument it did not
  specialize, e.g. after it changed between calls) and that the graph only converts to float32
  (possibly through float64 first) enters the kernel as float32: the host rounds it, as the
  conversion would, and the device, which has no float64, never sees it
  (:func:`float32_scalar_inputs`; :class:`torchneuron.kernel.DeviceKernel` converts).
- Float64 arithmetic on values converted to float64 inside the graph, whose results the graph
  only converts back to a narrower float (TorchAO's float8 scales: ``amax.to(float64)``,
  ``clamp``, ``max / amax``, ``.to(float32)``), runs in float32: the device has no 64-bit
  floats (the Neuron compiler likewise computes float64 in float32). The result can differ
  from eager's in the last bit of the float32 it is rounded to; each such graph says how
  many ops with ``TORCHNEURON_VERBOSE=1`` (:func:`float64_in_float32`).

Random ops are rewritten next to their device op, in :func:`torchneuron.rng.seed_random_ops`
(the first of the front end's rewrites).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from torchneuron import config, fx_json

__all__ = [
    "as_strided_views",
    "float32_scalar_inputs",
    "float64_in_float32",
    "grouped_mm_offsets",
    "splice",
]


def splice(
    gm: torch.fx.GraphModule,
    before: torch.fx.Node,
    fn: Callable[..., Any],
    inputs: Sequence[torch.fx.Node],
) -> Any:
    """``fn(*inputs)`` traced with the backend's decompositions and inserted into ``gm`` before
    ``before``, its nodes located at ``before``'s Python line; returns what ``fn`` returns, as
    nodes of ``gm``. Traced on meta tensors of the inputs' static shapes, which compute
    nothing (a fake trace here would join the compiler's fake mode and see symbolic sizes;
    zeros on the CPU would compute: a grouped GEMM's masked form took minutes), or on zeros
    when an op of ``fn`` has no meta kernel. None when the trace made tensor constants, which
    would have to move into ``gm``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchneuron.decompositions import neuron_decompositions

    def trace(device: str) -> torch.fx.GraphModule:
        examples = [
            torch.zeros(tuple(n.meta["val"].shape), dtype=n.meta["val"].dtype, device=device)
            for n in inputs
        ]
        return make_fx(fn, decomposition_table=neuron_decompositions())(*examples)

    try:
        traced = trace("meta")
    except Exception:  # noqa: BLE001 - an op without a meta kernel: trace on zeros
        traced = trace("cpu")
    if any(n.op == "get_attr" for n in traced.graph.nodes):
        return None
    for n in traced.graph.nodes:  # the graph's values are CPU tensors, as the rest of gm's
        value = n.meta.get("val")
        if isinstance(value, torch.Tensor) and value.device.type == "meta":
            n.meta["val"] = torch.empty_strided(
                value.shape, value.stride(), dtype=value.dtype, device="cpu"
            )
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    existing = set(gm.graph.nodes)
    with gm.graph.inserting_before(before):
        result = gm.graph.graph_copy(traced.graph, dict(zip(placeholders, inputs, strict=True)))
    for new in gm.graph.nodes:
        if new not in existing:
            new.meta["stack_trace"] = before.meta.get("stack_trace")
    return result


def _contiguous_strides(size: list[int]) -> list[int]:
    strides, step = [], 1
    for d in reversed(size):
        strides.append(step)
        step *= max(d, 1)
    return strides[::-1]


def _strided_positions(
    size: list[int], stride: list[int], offset: int, numel: int
) -> torch.Tensor | None:
    """Where each element of an ``as_strided`` window lies in its contiguous source, read
    flat: offset + sum_d i_d stride_d; None when a position falls outside the source (the
    window reads memory the graph does not see as the source)."""
    if any(st < 0 for st in stride) or math.prod(size) == 0 or offset < 0:
        return None
    if offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True)) >= numel:
        return None
    positions = torch.full(size, offset, dtype=torch.int64)
    for d, (n, st) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[d] = n
        positions = positions + torch.arange(n).reshape(shape) * st
    return positions.reshape(-1)


def _gathered_window(
    gm: torch.fx.GraphModule, node: torch.fx.Node, source: torch.fx.Node, positions: torch.Tensor
) -> torch.fx.Node:
    """``node`` (an as_strided of the contiguous ``source``) as a gather of the flat source at
    host-computed positions (a constant), viewed to the window's shape: the window copied."""
    value = source.meta["val"]
    name = f"_as_strided_positions_{node.name}"
    gm.register_buffer(name, positions, persistent=False)
    aten = torch.ops.aten
    with gm.graph.inserting_before(node):
        flat = gm.graph.call_function(aten.view.default, (source, [value.numel()]))
        index = gm.graph.get_attr(name)
        gathered = gm.graph.call_function(aten.index_select.default, (flat, 0, index))
        window = gm.graph.call_function(aten.view.default, (gathered, list(node.args[1])))
    mode = getattr(value, "fake_mode", None)
    with mode if mode is not None else contextlib.nullcontext():
        flat.meta["val"] = value.reshape(-1)
        index.meta["val"] = torch.empty(positions.shape, dtype=positions.dtype)
        gathered.meta["val"] = flat.meta["val"].new_empty(positions.shape)
    window.meta = dict(node.meta)
    return window


def as_strided_views(gm: torch.fx.GraphModule) -> int:
    """Replace contiguous ``as_strided`` nodes by ``aten.view``, and other windows of a
    contiguous tensor by a gather of their elements (in place); returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten.as_strided.default:
            continue
        source, size, stride = node.args[:3]
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or not all(
            isinstance(v, int) for v in [*size, *stride, *value.shape]
        ):
            continue
        if (
            value.is_contiguous()
            and value.storage_offset() == 0
            and offset in (None, 0)
            and value.numel() == torch.Size(size).numel()
            and all(
                s == c
                for s, c, d in zip(stride, _contiguous_strides(list(size)), size, strict=True)
                if d != 1
            )
        ):
            with gm.graph.inserting_before(node):
                view = gm.graph.call_function(torch.ops.aten.view.default, (source, list(size)))
            view.meta = dict(node.meta)
            node.replace_all_uses_with(view)
            gm.graph.erase_node(node)
            count += 1
        elif (
            value.is_contiguous() and value.storage_offset() == 0 and isinstance(offset, int | None)
        ):
            positions = _strided_positions(list(size), list(stride), offset or 0, value.numel())
            if positions is None:
                continue
            node.replace_all_uses_with(_gathered_window(gm, node, source, positions))
            gm.graph.erase_node(node)
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


_CONVERT = torch.ops.prims.convert_element_type.default


def _only_to_float32(node: torch.fx.Node) -> bool:
    """Whether every use of ``node`` converts it to float32, or to float64 whose every use
    does the same."""
    return all(
        user.op == "call_function"
        and user.target == _CONVERT
        and user.args[0] is node
        and (
            user.args[1] == torch.float32
            or (user.args[1] == torch.float64 and _only_to_float32(user))
        )
        for user in node.users
    )


def float32_scalar_inputs(gm: torch.fx.GraphModule) -> int:
    """Make 0-d float64 inputs that the graph only converts to float32 float32 inputs (in
    place; the kernel converts the argument, rounding as the conversion would); returns how
    many."""
    count = 0
    for node in list(gm.graph.nodes):
        value = node.meta.get("val")
        if (
            node.op != "placeholder"
            or not isinstance(value, torch.Tensor)
            or value.dtype != torch.float64
            or value.dim() != 0
            or not node.users
            or not _only_to_float32(node)
        ):
            continue
        node.meta["val"] = value.to(torch.float32)
        pending = list(node.users)
        while pending:  # the float64 conversions are no-ops now
            user = pending.pop()
            if user.args[1] == torch.float64:
                pending.extend(user.users)
                user.replace_all_uses_with(user.args[0])
                gm.graph.erase_node(user)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


_NARROW_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _converted_to(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype a conversion node (``_to_copy`` with only a dtype, or
    ``convert_element_type``) converts to; None for any other node."""
    if node.op != "call_function":
        return None
    if node.target is _CONVERT:
        dtype = node.args[1]
        return dtype if isinstance(dtype, torch.dtype) else None
    if node.target is torch.ops.aten._to_copy.default and set(node.kwargs) <= {"dtype"}:
        dtype = node.kwargs.get("dtype")
        return dtype if isinstance(dtype, torch.dtype) else None
    return None


def _is_float64(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype == torch.float64


def _float64_island(start: torch.fx.Node, seen: set[torch.fx.Node]) -> list[torch.fx.Node] | None:
    """The float64 nodes connected to ``start`` through float64 values, when they compute
    only what the graph converts back to a narrower float: each is an op (not a graph input),
    reads float64 only from the island, and is used only in it or by a conversion to float32,
    bfloat16 or float16. None otherwise."""
    island: list[torch.fx.Node] = []
    pending = [start]
    ok = True
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        island.append(node)
        ok &= node.op == "call_function"
        for arg in node.all_input_nodes:
            if _is_float64(arg):
                pending.append(arg)
            elif isinstance(arg.meta.get("val"), (tuple, list)):
                ok = False  # an element of a multi-output op's results
        for user in node.users:
            if _is_float64(user):
                pending.append(user)
            elif _converted_to(user) not in _NARROW_FLOATS:
                ok = False
    return island if ok else None


def float64_in_float32(gm: torch.fx.GraphModule) -> int:
    """Run float64 islands (:func:`_float64_island`) in float32, in place: their values'
    metadata and the float64 they convert to or create become float32. Returns how many nodes
    changed."""
    seen: set[torch.fx.Node] = set()
    changed: list[torch.fx.Node] = []
    for node in list(gm.graph.nodes):
        if node in seen or not _is_float64(node):
            continue
        island = _float64_island(node, seen)
        if island is None:
            continue
        for member in island:
            member.meta["val"] = member.meta["val"].to(torch.float32)
            member.args = tuple(torch.float32 if a == torch.float64 else a for a in member.args)
            member.kwargs = {
                k: torch.float32 if v == torch.float64 else v for k, v in member.kwargs.items()
            }
        changed += island
    if changed:
        gm.graph.lint()
        gm.recompile()
        where = sorted({line for n in changed if (line := fx_json.source_line(n)) is not None})
        config.tell(
            f"torchneuron: {len(changed)} float64 op(s) computed in float32 (the device has no "
            "64-bit floats; their results are converted to float32 or narrower)"
            + "".join(f"\n  {w}" for w in where)
        )
    return len(changed)


def grouped_mm_offsets(gm: torch.fx.GraphModule) -> int:
    """``_grouped_mm`` nodes left for the grouped-GEMM kernel
    (:func:`torchneuron.decompositions.grouped_mm_kernel`) whose offsets are a constant become
    the masked decomposition: the kernel binds each group's rows from the offsets' values when
    it is launched, so they must be an input of its region. Offsets computed in the graph (a
    router's ``cumsum``) are: the partitioner puts the GEMM in a region of its own
    (:func:`torchneuron.partition.partition_graph`). A node the trace cannot splice
    stays, and the partitioner leaves it in eager PyTorch (counted)."""
    from torchneuron.decompositions import grouped_mm_masked

    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten._grouped_mm.default:
            continue
        offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
        if isinstance(offs, torch.fx.Node) and offs.op in ("placeholder", "call_function"):
            continue
        a, b = node.args[0], node.args[1]
        if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)):
            continue
        inputs = [a, b] + ([offs] if isinstance(offs, torch.fx.Node) else [])
        try:
            result = splice(gm, node, lambda x, w, *o: grouped_mm_masked(x, w, *o), inputs)
        except Exception:  # noqa: BLE001 - symbolic sizes: the node stays (counted fallback)
            continue
        if result is None:
            continue
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        changed += 1
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
