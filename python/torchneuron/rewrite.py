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
import functools
import math
import operator
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
    "unpermute_rows",
    "unsort_by_scatter",
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


_aten = torch.ops.aten
#: Ops whose result holds their input's elements in the same row-major order.
_SAME_ORDER = (
    _aten.view.default,
    _aten.reshape.default,
    _aten._unsafe_view.default,
    _aten.alias.default,
    _aten.unsqueeze.default,
    _aten.squeeze.dim,
    _aten.squeeze.default,
)
#: Allocations whose elements PyTorch leaves undefined.
_UNINITIALIZED = (
    _aten.empty.memory_format,
    _aten.empty_permuted.default,
    _aten.empty_like.default,
    _aten.empty_strided.default,
    _aten.new_empty.default,
)


def _static_shape(node: object) -> tuple[int, ...] | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not all(isinstance(d, int) for d in value.shape):
        return None
    return tuple(value.shape)


def _flat_base(node: object) -> object:
    """The node whose elements ``node`` holds in the same row-major order: through views,
    identity permutes and expands to the same shape."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        source = node.args[0] if node.args else None
        if node.target in _SAME_ORDER:
            node = source
        elif node.target is _aten.permute.default and list(node.args[1]) == list(
            range(len(node.args[1]))
        ):
            node = source
        elif node.target is _aten.expand.default and _static_shape(node) == _static_shape(source):
            node = source
        else:
            break
    return node


def _unwrapped(index: object) -> object:
    """An index without the wrap of negative entries (``where(i < 0, i + n, i)``, as
    ``index_put``'s decomposition writes it), through views."""
    node = _flat_base(index)
    if isinstance(node, torch.fx.Node) and node.target is _aten.where.self:
        cond, wrapped, plain = node.args
        if (
            isinstance(cond, torch.fx.Node)
            and cond.target is _aten.lt.Scalar
            and cond.args == (plain, 0)
            and isinstance(wrapped, torch.fx.Node)
            and wrapped.target is _aten.add.Tensor
            and wrapped.args[0] is plain
        ):
            return _flat_base(plain)
    return node


def _is_iota(node: object, n: int) -> bool:
    """Whether ``node`` is ``arange(n)`` of an integer dtype (through views)."""
    node = _flat_base(node)
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    args = list(node.args)
    if node.target is _aten.arange.default:
        args = [0, *args[:1], 1]
    elif node.target is _aten.arange.start:
        args = [*args[:2], 1]
    elif node.target is _aten.arange.start_step:
        args = [*args, 1][:3]  # step defaults to 1
    else:
        return False
    value = node.meta.get("val")
    return (
        args[:3] == [0, n, 1]
        and isinstance(value, torch.Tensor)
        and not value.dtype.is_floating_point
    )


def _inverse_index(put: object, n: int) -> torch.fx.Node | None:
    """The index ``q`` when ``put`` is ``empty[q] = arange(n)`` with n rows of one element: the
    inverse of q (of repeated entries, the last; rows q misses are undefined). None otherwise."""
    if not (
        isinstance(put, torch.fx.Node)
        and put.target is _aten.index_put.default
        and not (put.args[3] if len(put.args) > 3 else put.kwargs.get("accumulate", False))
    ):
        return None
    table, indices, values = put.args[:3]
    shape = _static_shape(table)
    if shape is None or math.prod(shape) != n or shape[0] != n or len(indices) != 1:
        return None
    index = indices[0]
    uninitialized = getattr(_flat_base(table), "target", None) in _UNINITIALIZED
    if not uninitialized or _static_shape(index) != (n,) or not _is_iota(values, n):
        return None
    return index


def _row_factor(factor: object, index: torch.fx.Node, n: int) -> torch.fx.Node | None:
    """``b`` when ``factor`` is ``b[index]`` of a 1-D ``b`` of length n shaped [n, 1, ...]
    (one factor per row, as a router's weights), ``index`` compared without its wrap."""
    shape = _static_shape(factor)
    if shape is None or not shape or shape[0] != n or math.prod(shape) != n:
        return None
    gathered = _flat_base(factor)
    if not (
        isinstance(gathered, torch.fx.Node)
        and gathered.target is _aten.index.Tensor
        and len(gathered.args[1]) == 1
        and _unwrapped(gathered.args[1][0]) is _unwrapped(index)
        and _static_shape(gathered.args[0]) == (n,)
    ):
        return None
    return gathered.args[0]


@torch.library.custom_op("torchneuron::unpermute_rows", mutates_args=())
def unpermute_rows(rows: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``out[perm[i]] = rows[i]``, where ``perm`` holds each row number of ``rows`` once (the
    indices of a sort): every row of ``out`` is written once, so the device needs neither to
    initialize ``out`` nor to order the writes (``neuron.scatter {permutation}``; a repeated
    index is a runtime error there). Eager: ``index_put`` into zeros."""
    return torch.zeros_like(rows).index_put((perm,), rows)


@unpermute_rows.register_fake
def _unpermute_rows_fake(rows: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(rows)


def _is_permutation(index: object, n: int) -> bool:
    """Whether ``index`` holds each of 0..n-1 once: the indices of a sort of n elements."""
    node = _flat_base(_unwrapped(index))
    if not (
        isinstance(node, torch.fx.Node)
        and node.target is operator.getitem
        and node.args[1] == 1
        and isinstance(node.args[0], torch.fx.Node)
    ):
        return False
    sort = node.args[0]
    return sort.target in (_aten.sort.default, _aten.sort.stable) and _static_shape(
        sort.args[0]
    ) == (n,)


def _placed(rows: torch.Tensor, index: torch.Tensor, permutation: bool) -> torch.Tensor:
    """``rows`` written to rows ``index`` of a new tensor (``index`` a permutation: every row)."""
    if permutation:
        return torch.ops.torchneuron.unpermute_rows(rows, index)
    return torch.zeros_like(rows).index_put((index,), rows)


def _placed_times(
    rows: torch.Tensor,
    index: torch.Tensor,
    factor: torch.Tensor,
    shape: tuple[int, ...],
    first: bool,
    permutation: bool,
) -> torch.Tensor:
    """:func:`_placed` times ``factor`` shaped ``shape`` (in the original product's order)."""
    placed, w = _placed(rows, index, permutation), factor.reshape(shape)
    return placed * w if first else w * placed


def unsort_by_scatter(gm: torch.fx.GraphModule) -> int:
    """``x[inv]`` where ``inv`` is the inverse of an index ``q`` (``inv = empty; inv[q] =
    arange(n)``: how Transformers' MoE layers put the expert-sorted rows back in token order)
    becomes ``x``'s rows written to rows ``q`` (``out[q] = x``: one indirect DMA of the rows,
    where computing ``inv`` and then gathering made two, a descriptor per row each). Equal
    for every row ``q`` names (of repeated entries the last, both ways); eager leaves the
    others undefined. A per-row factor gathered by the same ``q`` (``x = y * w[q][:, None]``,
    the router weights) moves after the scatter, as ``w`` in token order, so that it is not
    gathered at all. Where ``q`` is a sort's indices (a permutation: Transformers' ``perm``),
    the scatter is :func:`unpermute_rows`, which writes every row once in any order. Returns
    how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _aten.index.Tensor:
            continue
        x, indices = node.args[0], node.args[1]
        shape = _static_shape(x)
        if shape is None or not shape or len(indices) != 1 or indices[0] is None:
            continue
        n = shape[0]
        if _static_shape(indices[0]) != (n,):
            continue
        q = _inverse_index(_flat_base(indices[0]), n)
        if q is None:
            continue
        rows, factor, first = x, None, True
        if isinstance(x, torch.fx.Node) and x.target is _aten.mul.Tensor and len(x.args) == 2:
            for position, (y, w) in enumerate((x.args, x.args[::-1])):
                b = _row_factor(w, q, n)
                if b is not None and _static_shape(y) == shape:
                    rows, factor, first = y, (b, _static_shape(w)), position == 0
                    break
        permutation = _is_permutation(q, n)
        if factor is None:
            placed = functools.partial(_placed, permutation=permutation)
            result = splice(gm, node, placed, [rows, q])
        else:
            b, w_shape = factor
            scaled = functools.partial(
                _placed_times, shape=w_shape, first=first, permutation=permutation
            )
            result = splice(gm, node, scaled, [rows, q, b])
        if result is None:
            continue
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return count
