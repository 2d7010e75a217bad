"""The ``neuron`` backend of ``torch.distributed``.

Registering the device (``import torch`` does, through the autoload entry point) registers the
backend too, for the ``neuron`` device, so both of these work with neuron tensors::

    dist.init_process_group("neuron")   # or init_process_group(): neuron tensors go to "neuron"
    torch.neuron.set_device(local_rank)
    dist.all_reduce(torch.ones(4, device="neuron"))

Ranks are ordinary processes (``torchrun --nproc-per-node=N``), each using one neuron device;
several hosts join through torchrun's rendezvous (``--nnodes``, ``--rdzv-endpoint``) as with any
backend, though the cost model places every rank within one instance. The bytes move over
Gloo's transport (torch ships it), on CPU tensors that alias the neuron tensors' memory (device
memory is host memory), so the results land in the neuron tensors without a copy.

Each collective also gets a modeled duration on the instance's topology
(``runtime/timing/CollectiveCost.h``: rings, or trees for small all-reduces and for
broadcast/reduce/gather/scatter, within a chip or across NeuronLink; rank ``r`` sits on core
``r % cores_per_chip`` of chip ``r // cores_per_chip``). As on a GPU with NCCL, it runs on the
device's collective stream, after the work issued before it on the current stream, and the
current stream does not wait for it until its result is waited for (``work.wait()``, or its
future's ``wait()``, which DDP's reducer calls at the end of the backward): kernels issued in
between overlap it. Events, :func:`torchneuron.profile` and ``torch.profiler`` see it (resource
``neuronlink``). Each rank charges its own timeline; the ranks' timelines are not synchronized
with each other (exact when the ranks do the same work, as in DDP, FSDP and tensor
parallelism).

Collectives: all_reduce (sum, avg, max, min, product), all_gather, all_gather_into_tensor,
reduce_scatter, reduce_scatter_tensor (and their coalesced forms), broadcast, reduce, gather,
scatter, all_to_all, all_to_all_single, send, recv, barrier; async work handles whose
``wait()`` and ``get_future()`` give the neuron tensors back. A peer that fails makes
``wait()`` raise ``torch.distributed.DistBackendError`` naming the collective and rank, within
the process group's timeout.

On top of these, torch's parallelisms run unchanged on neuron devices: ``DistributedDataParallel``,
FSDP2 (``fully_shard``), tensor and sequence parallelism (``parallelize_module`` with
``ColwiseParallel``/``RowwiseParallel``/``SequenceParallel`` over
``init_device_mesh("neuron", ...)``) and 2-D meshes (FSDP x TP); ``examples/train_fsdp.py``.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch

__all__ = ["BACKEND", "collective_cost", "is_registered", "register", "topology"]

#: The backend's name for ``init_process_group``.
BACKEND = "neuron"

_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register the ``neuron`` backend with ``torch.distributed`` for the ``neuron`` device
    (idempotent; a no-op when torch was built without distributed support). Cheap: the
    backend's library loads when a process group is created."""
    global _registered
    with _lock:
        if _registered or not torch.distributed.is_available():
            return
        torch.distributed.Backend.register_backend(
            BACKEND, _create_backend, extended_api=True, devices=[BACKEND]
        )
        _registered = True


def is_registered() -> bool:
    return _registered


def _create_backend(opts: Any, backend_options: Any) -> Any:
    """``register_backend``'s creator (extended API): one Gloo process group over the same
    store and ranks moves the bytes; the C++ ``neuron`` backend wraps it for neuron tensors, and
    CPU tensors of the group go to the Gloo group itself (as ``"cpu:gloo,neuron:neuron"``).

    It returns a whole ``ProcessGroup`` (torch keeps such a group as it is), not only the
    backend: torch 2.13's ``init_process_group()`` without a backend name marks Gloo as the
    default backend of the group whenever the accelerator's backend is not NCCL, so every
    ``ProcessGroup.getBackendName()`` (DDP's constructor calls it) would fail on a group with
    no Gloo backend. Here the default backend is the neuron one."""
    from torch.distributed import ProcessGroup, ProcessGroupGloo

    from torchneuron import _distributed, device

    timeout: timedelta = opts.timeout
    transport = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, timeout)
    backend = _distributed._create_backend(
        transport,
        opts.group_rank,
        opts.group_size,
        list(opts.global_ranks_in_group),
        device._C()._collective_timeline(),
        timeout.total_seconds(),
    )
    pg = ProcessGroup(opts.store, opts.group_rank, opts.group_size)
    pg._set_default_backend(ProcessGroup.BackendType.CUSTOM)
    pg._register_backend(torch.device(BACKEND), ProcessGroup.BackendType.CUSTOM, backend)
    pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, transport)
    return pg


def collective_cost(
    collective: str, nbytes: int, ranks: list[int], target: str | None = None
) -> dict[str, Any]:
    """The modeled cost of ``collective`` (``"all_reduce"``, ``"all_gather"``,
    ``"reduce_scatter"``, ``"broadcast"``, ``"reduce"``, ``"gather"``, ``"scatter"``,
    ``"all_to_all"``, ``"send_recv"``, ``"barrier"``) moving ``nbytes`` among global ``ranks``
    on ``target`` (default: the device's): ``duration_ns``, ``bus_bytes_per_ns`` (the
    bottleneck hop, the peak that large messages approach), ``crosses_chips`` and
    ``algorithm`` (``"ring"``, ``"tree"``, ``"direct"`` or ``"none"`` for one rank).
    ``nbytes`` is the tensor for all_reduce and broadcast, the gathered output for all_gather,
    the scattered input for reduce_scatter, each rank's input for all_to_all; for gather and
    scatter the root's whole buffer."""
    from torchneuron import _distributed, device

    return dict(
        _distributed._collective_cost(
            collective, nbytes, list(ranks), target or device._C()._target()
        )
    )


def topology(target: str | None = None) -> dict[str, Any]:
    """The target's topology figures as the cost model reads them (bytes/ns and ns)."""
    from torchneuron import _distributed, device

    return dict(_distributed._topology(target or device._C()._target()))
