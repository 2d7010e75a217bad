"""Rewrites of an ATen graph before it is partitioned (``build_graph``): nodes whose meaning
depends on what the FX document does not carry, written as ops that say it explicitly.

- ``aten.as_strided`` of a contiguous tensor, reading its elements in row-major order from
  offset 0 (as the training forward of group norm does), is a ``view``. The document gives
  tensors as values without strides, so the importer cannot tell this case from one that reads
  storage in another order; here the node's input metadata can.

Random ops are rewritten next to their device op, in :func:`torchneuron.rng.seed_random_ops`.
"""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["as_strided_views"]


def _contiguous_strides(size: list[int]) -> list[int]:
    strides, step = [], 1
    for d in reversed(size):
        strides.append(step)
        step *= max(d, 1)
    return strides[::-1]


def as_strided_views(gm: torch.fx.GraphModule) -> int:
    """Replace contiguous ``as_strided`` nodes by ``aten.view`` (in place); returns how many."""
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
            and list(stride) == _contiguous_strides(list(size))
        ):
            with gm.graph.inserting_before(node):
                view = gm.graph.call_function(torch.ops.aten.view.default, (source, list(size)))
            view.meta = dict(node.meta)
            node.replace_all_uses_with(view)
            gm.graph.erase_node(node)
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
