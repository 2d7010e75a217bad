"""torch's functional collectives inside compiled graphs.

Dynamo captures ``_c10d_functional.all_reduce``, ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` (and ``wait_tensor``, where a result is first used), as DTensor, tensor
parallelism and ``torch.distributed._functional_collectives`` emit them. The importer turns them
into ``neuron.collective`` ops, which lower to collective instructions in the kernel program: the
program's timeline charges each on the core's collective path (``neuronlink``), overlapping
independent compute, and the executor runs it through the c10d process group the node names
(``torchneuron._distributed``'s handler, on CPU tensors aliasing the kernel's buffers).

A node carries only its group's name; the document adds the group's global ranks (what sizes
the result and places the ring on the instance for the cost model), resolved here when the
graph is written.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx

__all__ = ["COLLECTIVE_TARGETS", "group_entry", "handler", "is_collective"]

#: Functional collectives the device runs (``wait_tensor`` is an identity on the device).
COLLECTIVE_TARGETS = (
    "_c10d_functional.all_reduce.default",
    "_c10d_functional.all_gather_into_tensor.default",
    "_c10d_functional.reduce_scatter_tensor.default",
)


def is_collective(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls one of :data:`COLLECTIVE_TARGETS`."""
    return node.op == "call_function" and str(node.target) in COLLECTIVE_TARGETS


def group_entry(node: torch.fx.Node) -> dict[str, Any]:
    """``{"name", "ranks"}`` of the process group a collective node names (its last argument,
    ``group_name``). Raises LookupError when torch.distributed knows no such group."""
    name = node.kwargs.get("group_name", node.args[-1] if node.args else None)
    if not isinstance(name, str):
        raise LookupError(f"{node.name}: the collective's group name is not a string")
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        raise LookupError(f"{node.name}: torch.distributed is not initialized")
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        group = _resolve_process_group(name)
    except (RuntimeError, ValueError) as e:
        raise LookupError(f"{node.name}: unknown process group '{name}' ({e})") from None
    ranks = torch.distributed.get_process_group_ranks(group)
    return {"name": name, "ranks": [int(r) for r in ranks]}


@functools.cache
def handler() -> Any:
    """The collective handler capsule kernels with collective instructions run with."""
    from torchneuron import _distributed

    return _distributed._collective_handler()
