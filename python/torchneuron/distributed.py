"""The ``neuron`` backend of ``torch.distributed``.

Registering the device (``import torch`` does, through the autoload entry point) registers the
backend too, for the ``neuron`` device, so both of these work with neuron tensors::

    dist.init_process_group("neuron")   # or init_process_group(): neuron tensors go to "neuron"
    torch.neuron.set_device(local_rank)
    dist.all_reduce(torch.ones(4, device="neuron"))

Ranks are ordinary processes (``torchrun --nproc-per-node=N``), each using one neuron device.
The bytes move over Gloo's transport (torch ships it), on CPU tensors that alias the neuron
tensors' memory (device memory is host memory), so the results land in the neuron tensors
without a copy. Each collective also gets a modeled duration on the instance's topology
(``runtime/timing/CollectiveCost.h``: rings within a chip or across NeuronLink; rank ``r``
sits on core ``r % cores_per_chip`` of chip ``r // cores_per_chip``), placed on the current
stream of the tensors' device when it is issued, where events, :func:`torchneuron.profile` and
``torch.profiler`` see it (resource ``neuronlink``). Each rank charges its own timeline; the
ranks' timelines are not synchronized with each other.

Collectives: all_reduce (sum, avg, max, min, product), all_gather, all_gather_into_tensor,
reduce_scatter, reduce_scatter_tensor, broadcast, all_to_all, all_to_all_single, send, recv,
barrier; async work handles whose ``wait()`` and ``get_future()`` give the neuron tensors back.
A peer that fails makes ``wait()`` raise ``torch.distributed.DistBackendError`` naming the
collective and rank, within the process group's timeout.
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
    ``"reduce_scatter"``, ``"broadcast"``, ``"all_to_all"``, ``"send_recv"``, ``"barrier"``)
    moving ``nbytes`` among global ``ranks`` on ``target`` (default: the device's):
    ``duration_ns``, ``bus_bytes_per_ns`` (the ring's bottleneck hop, the peak that large
    messages approach) and ``crosses_chips``. ``nbytes`` is the tensor for all_reduce and
    broadcast, the gathered output for all_gather, the scattered input for reduce_scatter,
    each rank's input for all_to_all."""
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
