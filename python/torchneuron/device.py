"""The ``neuron`` PyTorch device: ``torch.neuron``.

One device per visible NeuronCore of the target (``TORCHNEURON_TARGET``, default ``trn2``): by
default every core of one chip (8 on trn2 and trn3); ``TORCHNEURON_VISIBLE_CORES="0,1"`` or
``"0-3"`` picks cores, device ``i`` being the ``i``-th listed. Device memory is host memory
standing for each core's HBM share (the target's ``hbm_bytes_per_core``: 12 GiB on trn2, 18 GiB
on trn3), managed by a caching allocator that raises ``torch.OutOfMemoryError`` past it.

What runs: tensor creation, views, copies, ``fill_``/``zero_`` and ``.item()`` are device
kernels (host copies: the memory is host memory); every other op the compiler lowers runs as a
device kernel compiled for the call's sizes and dtypes and cached (:mod:`torchneuron.eager`);
the rest run as a CPU fallback (inputs copied out, results copied back), counted in
``torchneuron.stats()["ops_fallback"]`` as ``"aten.<op>.<overload> (eager)"`` and warned about
once per op. Streams are host-ordered queues: work runs when issued. Each stream keeps a
modeled-time cursor that events record and device kernels advance by their modeled time, so
``Event.elapsed_time`` is modeled milliseconds.

``torch.autocast("neuron")`` uses PyTorch's CUDA autocast op lists (``runtime/device/
Autocast.cpp``) with bfloat16 as the default dtype (set for the thread that loads the device;
PyTorch keeps autocast dtypes per thread, so threads started later begin at float16).

The package's ``torch.backends`` entry point registers the device when torch is imported
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` or ``TORCHNEURON_DEVICE_AUTOLOAD=0`` turn that off; then
``import torchneuron.device`` registers it). Loading the device does not load the compiler; the
first eager op that needs a kernel does.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

__all__ = [
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_device_capacity",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "stream",
    "synchronize",
    "target",
    "visible_cores",
    "DeviceProperties",
    "Event",
    "Stream",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "is_bf16_supported",
    "memory_summary",
    "set_stream",
]

_NAME = "neuron"
_lock = threading.Lock()
_registered = False
_native: ModuleType | None = None


def _C() -> ModuleType:
    """The C++ device library (importing it registers the device's kernels and hooks)."""
    global _native
    if _native is None:
        from torchneuron import _device

        _native = _device
    return _native


def register() -> None:
    """Make ``neuron`` a PyTorch device (idempotent): load the device library, name
    PrivateUse1 ``neuron``, install this module as ``torch.neuron`` and add ``Tensor.neuron()``,
    ``Tensor.is_neuron``, ``Module.neuron()`` and the storage methods."""
    global _registered
    with _lock:
        if _registered:
            return
        _C()
        from torchneuron import eager

        eager.install()  # the compiler side; it loads the compiler on the first eager op
        current = torch._C._get_privateuse1_backend_name()
        if current != _NAME:
            if current != "privateuseone":
                raise RuntimeError(
                    f"PrivateUse1 is already the {current!r} device: torchneuron cannot register "
                    f"{_NAME!r} in the same process"
                )
            torch.utils.rename_privateuse1_backend(_NAME)
        import sys

        torch._register_device_module(_NAME, sys.modules[__name__])
        if not hasattr(torch.Tensor, "is_" + _NAME):
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
            )
        atexit.register(_drain_autograd_worker)
        _format_on_the_host()
        from torchneuron import distributed

        distributed.register()  # the torch.distributed backend "neuron"
        _registered = True


def _format_on_the_host() -> None:
    """Print neuron tensors from a host copy, as torch does for XLA and MTIA tensors.

    torch's formatter runs a dozen ops on the tensor it prints (masked_select, float64 min/max,
    comparisons): on this device each would compile an eager kernel or take the CPU fallback
    (it has no float64). Only the contents are formatted from the copy: ``device=`` and
    ``grad_fn=`` still come from the tensor itself."""
    import torch._tensor_str as tensor_str

    format_contents = tensor_str._tensor_str
    if getattr(format_contents, "_neuron_host_copy", False):
        return

    def format_from_host(self: torch.Tensor, indent: int) -> str:
        if self.device.type == _NAME:
            self = self.detach().to("cpu")
        return format_contents(self, indent)

    format_from_host._neuron_host_copy = True  # type: ignore[attr-defined]
    tensor_str._tensor_str = format_from_host


def _drain_autograd_worker() -> None:
    """At exit, let the autograd engine's neuron worker thread finish with the last backward.

    Each ``backward()`` on neuron tensors runs on the engine's thread for the device, and that
    thread may drop the last reference to the finished graph after ``backward()`` has returned;
    the graph holds a Python object (the context ``torch.autograd`` stashes), so dropping it
    takes the GIL. During interpreter shutdown that thread is killed inside a destructor and
    the process aborts ("terminate called without an active exception"). One more backward
    through that thread, with no Python objects in it, waits until it is done with the last."""
    if device_count() == 0:
        return
    with torch.enable_grad():
        x = torch.zeros((), device=_NAME, requires_grad=True)
        y = x.clone()  # CloneBackward runs on the device's worker: no kernel, no fallback
        # The engine directly: torch.autograd.backward would stash a Python object again.
        engine = torch.autograd.graph.Variable._execution_engine  # type: ignore[attr-defined]
        engine.run_backward((y,), (torch.ones((), device=_NAME),), False, False, (), True, True)


# ---- devices ------------------------------------------------------------------------------


def _index(dev: Any, optional: bool = True) -> int:
    if dev is None:
        return current_device()
    if isinstance(dev, str):
        dev = torch.device(dev)
    if isinstance(dev, torch.device):
        if dev.type != _NAME:
            raise ValueError(f"expected a {_NAME} device, got {dev}")
        return current_device() if dev.index is None else dev.index
    return int(dev)


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return _C()._device_count()


def current_device() -> int:
    return _C()._current_device()


def set_device(dev: Any) -> None:
    _C()._set_device(_index(dev))


def target() -> str:
    """The target whose cores the devices stand for (``TORCHNEURON_TARGET``, default trn2)."""
    return _C()._target()


def visible_cores() -> list[int]:
    """The physical core of each device (``TORCHNEURON_VISIBLE_CORES``)."""
    return list(_C()._visible_cores())


def is_initialized() -> bool:
    return _registered


def init() -> None:
    register()


def _lazy_init() -> None:
    register()


def _is_in_bad_fork() -> bool:
    return False


class device:
    """Context manager that makes ``dev`` the current neuron device."""

    def __init__(self, dev: Any) -> None:
        self.idx = -1 if dev is None else _index(dev)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = _C()._exchange_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            _C()._set_device(self.prev)


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.neuron.get_device_properties`` tells, as ``torch.cuda``'s does for the
    fields code reads: ``name``, ``total_memory`` (the core's HBM share), ``major``/``minor``
    (the NeuronCore version), and the target the device models."""

    name: str
    total_memory: int
    major: int
    minor: int
    target: str


def get_device_name(dev: Any = None) -> str:
    """The modeled core, e.g. ``"AWS Trainium2 NeuronCore-v3"``."""
    _index(dev)
    return str(_C()._device_name())


def get_device_capability(dev: Any = None) -> tuple[int, int]:
    """(NeuronCore version, 0): (3, 0) on trn2, (4, 0) on trn3."""
    _index(dev)
    return int(_C()._neuron_core_version()), 0


def get_device_properties(dev: Any = None) -> DeviceProperties:
    major, minor = get_device_capability(dev)
    return DeviceProperties(
        name=get_device_name(dev),
        total_memory=int(_C()._hbm_bytes_per_core()),
        major=major,
        minor=minor,
        target=target(),
    )


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is the engines' native 16-bit format."""
    return True


def synchronize(dev: Any = None) -> None:
    """Wait for the device's work: a no-op today (work runs when issued)."""
    torch.accelerator.synchronize(_index(dev))


# ---- streams ------------------------------------------------------------------------------


class Stream(torch.Stream):
    """A stream of neuron device ``device`` (default: the current one), as ``torch.cuda.Stream``:
    code that asks ``torch.<device>`` for its stream class (FSDP2, DDP) gets one. ``priority``
    is kept; the modeled device gives every stream the same engines."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        return super().__new__(cls, device=torch.device(_NAME, _index(device)), priority=priority)


class Event(torch.Event):
    """An event of the current neuron device, as ``torch.cuda.Event``. Its times are modeled
    device time; ``blocking`` and ``interprocess`` are accepted for compatibility (work runs
    when issued, so there is nothing to block on)."""

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Event:
        return super().__new__(cls, device=torch.device(_NAME), enable_timing=enable_timing)


def current_stream(dev: Any = None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(dev))


def default_stream(dev: Any = None) -> torch.Stream:
    return torch.Stream(stream_id=0, device_index=_index(dev), device_type=_device_type())


def _device_type() -> int:
    return torch._C._autograd.DeviceType.PrivateUse1.value  # type: ignore[attr-defined]


def set_stream(s: torch.Stream) -> None:
    """Make ``s`` the current stream of its device."""
    torch.accelerator.set_stream(s)


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    """Make ``s`` the current stream of its device inside the block."""
    if s is None:
        yield
        return
    with s:
        yield


def _modeled_time_ns(s: torch.Stream | None = None) -> float:
    """The modeled-time cursor of stream ``s`` (default: current stream), in ns."""
    s = s or current_stream()
    return _C()._stream_cursor_ns(device=s.device_index, stream=s.stream_id)


def _place_modeled_work(
    ns: float, s: torch.Stream | None = None, busy: dict[str, float] | None = None
) -> tuple[float, float]:
    """Put ``ns`` of modeled work that keeps the device's resources ``busy`` (``"tensor"``:
    ns, ...) on stream ``s`` (default: current stream) and return its (start, end). Eager
    device kernels and copies do this; tests use it directly."""
    s = s or current_stream()
    start, end = _C()._place_modeled_work(
        ns=ns, device=s.device_index, stream=s.stream_id, busy=busy or {}
    )
    return start, end


# ---- memory -------------------------------------------------------------------------------


def get_device_capacity(dev: Any = None) -> int:
    """Bytes the device may hold: the core's HBM share, or less after
    :func:`set_per_process_memory_fraction`."""
    return _C()._capacity(_index(dev))


def set_per_process_memory_fraction(fraction: float, dev: Any = None) -> None:
    """Limit the device to ``fraction`` of its core's HBM share (``0 < fraction <= 1``)."""
    _C()._set_memory_fraction(float(fraction), _index(dev))


def memory_stats(dev: Any = None) -> OrderedDict[str, Any]:
    return torch.accelerator.memory_stats(_index(dev))


def memory_allocated(dev: Any = None) -> int:
    return torch.accelerator.memory_allocated(_index(dev))


def max_memory_allocated(dev: Any = None) -> int:
    return torch.accelerator.max_memory_allocated(_index(dev))


def memory_reserved(dev: Any = None) -> int:
    return torch.accelerator.memory_reserved(_index(dev))


def max_memory_reserved(dev: Any = None) -> int:
    return torch.accelerator.max_memory_reserved(_index(dev))


def reset_peak_memory_stats(dev: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(dev))


def reset_accumulated_memory_stats(dev: Any = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(dev))


def empty_cache() -> None:
    """Return every cached (free) block of every neuron device to the host."""
    torch.accelerator.empty_cache()


def memory_summary(dev: Any = None, abbreviated: bool = False) -> str:
    """A short table of the device's allocator statistics (current and peak bytes)."""
    index = _index(dev)
    stats = memory_stats(index)
    rows = [f"neuron:{index} ({get_device_name(index)}) memory"]
    for key, label in (("allocated_bytes", "allocated"), ("reserved_bytes", "reserved")):
        current = stats.get(f"{key}.all.current", 0)
        peak = stats.get(f"{key}.all.peak", 0)
        rows.append(f"  {label:<10s} {current / 2**20:12.2f} MiB   (peak {peak / 2**20:.2f} MiB)")
    free, total = mem_get_info(index)
    rows.append(f"  {'free':<10s} {free / 2**20:12.2f} MiB   of {total / 2**20:.2f} MiB")
    return "\n".join(rows)


def mem_get_info(dev: Any = None) -> tuple[int, int]:
    """(free, total) bytes: capacity minus reserved, and capacity."""
    return torch.accelerator.get_memory_info(_index(dev))


# ---- random numbers -----------------------------------------------------------------------

# Dynamo skips torch.cuda's seed and state functions (graph breaks: they are not ATen ops, and
# their callers, torch.testing's freeze_rng_state for one, run them under no_dispatch()) but
# traces into a third-party module's; ``torch._disable_dynamo`` gives ours the same treatment
# without importing torch._dynamo when the device loads.
_skipped_by_dynamo = torch._disable_dynamo


@_skipped_by_dynamo
def manual_seed(seed: int) -> None:
    """Seed the current device's default generator."""
    _C()._manual_seed(current_device(), int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


@_skipped_by_dynamo
def manual_seed_all(seed: int) -> None:
    """Seed every device's default generator (``torch.manual_seed`` calls this)."""
    for i in range(device_count()):
        _C()._manual_seed(i, int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


@_skipped_by_dynamo
def seed() -> None:
    _C()._seed(current_device())


@_skipped_by_dynamo
def seed_all() -> None:
    s = _C()._seed(0) if device_count() else 0
    for i in range(1, device_count()):
        _C()._manual_seed(i, s)


@_skipped_by_dynamo
def initial_seed() -> int:
    return _C()._initial_seed(current_device())


@_skipped_by_dynamo
def get_rng_state(dev: Any = "neuron") -> torch.Tensor:
    """The default generator's state: 16 bytes (seed, offset) as a CPU uint8 tensor."""
    raw = _C()._get_rng_state(_index(dev))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


@_skipped_by_dynamo
def set_rng_state(state: torch.Tensor, dev: Any = "neuron") -> None:
    _C()._set_rng_state(_index(dev), bytes(state.cpu().contiguous().view(torch.uint8).numpy()))


@_skipped_by_dynamo
def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


@_skipped_by_dynamo
def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for i, state in enumerate(states):
        set_rng_state(state, i)


# ---- autocast -----------------------------------------------------------------------------


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("neuron", dtype=...)`` accepts (torch asks the device
    module); bfloat16 is the default."""
    return [torch.bfloat16, torch.float16]


def _fallback_counts() -> dict[str, int]:
    """CPU-fallback calls per ATen operator (``"aten::add.Tensor"``) since the last reset."""
    return dict(_C()._fallback_counts())
