"""Where device time goes: the engine model's timeline of every kernel run.

    with torchneuron.profile() as prof:
        model(x)
    prof.summary()                        # per kernel: time, FLOP/s, bytes/s, utilisation, bound
    prof.export_chrome_trace("trace.json")  # Perfetto / chrome://tracing: a track per engine
    prof.total_device_ns

A kernel's timeline is computed once (the program is static) and only when a profile asks
for it: runs outside ``profile()`` pay nothing. Under ``torch.profiler`` each compiled kernel
run also appears as a range ``neuron:<kernel>`` whose input (recorded with ``record_shapes=True``:
``FunctionEvent.concrete_inputs``, "Concrete Inputs" in a trace) is the modeled device time; eager
kernels on the ``neuron`` device appear as ranges ``neuron::<kernel>`` and, with the PrivateUse1
activity, as device events of their modeled duration (``runtime/device/Profiler.cpp``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchneuron._native import Kernel

__all__ = ["Profile", "profile"]

# Device resources in trace-track order: the engines' queues, then DMA.
_UNITS = ("tensor", "vector", "scalar", "gpsimd", "sync", "dma")


@dataclass
class _Run:
    kernel: Kernel | None  # None for a copy or a collective
    name: str
    record: dict[str, Any]


def _user_line() -> str | None:
    """``file:line`` of the innermost caller outside torch and torchneuron: where an eager op
    or a copy was written."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not any(part in path for part in _LIBRARY_PATHS):
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


_LIBRARY_PATHS = (
    str(Path(__file__).resolve().parent),
    str(Path(torch.__file__).resolve().parent),
    "<frozen ",
)


class Profile:
    """Kernel runs recorded by :func:`profile`.

    ``kernels`` is a list of dicts, one per run: ``name``, ``target``, ``device_ns``, ``flops``,
    ``hbm_bytes``, ``engine_busy_ns`` (engine -> ns), ``bound`` (the engine or DMA that limited
    the run, or ``latency``) and ``source_lines`` (the Python ``file:line`` locations whose
    instructions ran in it; for an eager op's kernel, the line that called the op).

    Copies to, from and between neuron devices are runs too, named ``copy_host_to_device``,
    ``copy_device_to_host`` or ``copy_device_to_device``, with ``bytes``, their modeled time
    (the host link or the DMA engines, from the target) and ``source_lines`` the line that
    copied. So are the collectives of the ``neuron`` process-group backend (``all_reduce``,
    ``all_gather``, ``reduce_scatter``, ``broadcast``, ``all_to_all``, ``send_recv``,
    ``barrier``; :mod:`torchneuron.distributed`), bound by ``neuronlink``, the collective path
    between cores."""

    def __init__(self) -> None:
        self._runs: list[_Run] = []
        self._lock = threading.Lock()

    @property
    def kernels(self) -> list[dict[str, Any]]:
        return [dict(r.record) for r in self._runs]

    @property
    def total_device_ns(self) -> float:
        """Modeled device time of everything recorded (kernels run one after another)."""
        return float(sum(r.record["device_ns"] for r in self._runs))

    def record(
        self, kernel: Kernel, name: str, eager: bool = False, start_ns: float | None = None
    ) -> None:
        t = kernel.timeline()
        record = {
            "name": name,
            "start_ns": start_ns,
            "target": kernel.target,
            "device_ns": t["device_ns"],
            "flops": t["flops"],
            "hbm_bytes": t["hbm_bytes"],
            "engine_busy_ns": dict(t["engine_busy_ns"]),
            "bound": t["bound"],
            "instructions": t["instructions"],
            "source_lines": [_user_line() or "?"] if eager else list(kernel.locations),
        }
        with self._lock:
            self._runs.append(_Run(kernel, name, record))

    def record_transfer(
        self,
        name: str,
        resource: str,
        nbytes: int,
        device_ns: float,
        target: str,
        start_ns: float | None = None,
    ) -> None:
        """A copy or a collective: ``resource`` (``host_link``, ``dma``, ``neuronlink``)
        carries it for ``device_ns`` from ``start_ns`` on the device's timeline."""
        record = {
            "name": name,
            "start_ns": start_ns,
            "target": target,
            "device_ns": device_ns,
            "flops": 0,
            "hbm_bytes": nbytes,
            "bytes": nbytes,
            "engine_busy_ns": {resource: device_ns},
            "bound": resource,
            "instructions": 0,
            "source_lines": [_user_line() or "?"],
        }
        with self._lock:
            self._runs.append(_Run(None, name, record))

    def summary(self, file: Any = None) -> str:
        """A table of the recorded runs; printed (to ``file`` or stdout) and returned."""
        from torchneuron import _native

        rows = []
        for r in self._runs:
            k = r.record
            peaks = _native.native().target_peaks(k["target"])
            seconds = max(k["device_ns"], 1e-9) * 1e-9
            flops_s = k["flops"] / seconds
            bytes_s = k["hbm_bytes"] / seconds
            busy = k["engine_busy_ns"]
            util = "  ".join(
                f"{u[:3]}={100 * busy.get(u, 0.0) / max(k['device_ns'], 1e-9):3.0f}%"
                for u in ("tensor", "vector", "scalar", "dma")
            )
            rows.append(
                f"{r.name:<14s} {k['target']:<5s} {k['device_ns'] / 1e3:>10.2f} "
                f"{flops_s / 1e12:>8.2f} ({100 * flops_s / peaks['flops']:5.1f}%) "
                f"{bytes_s / 1e9:>8.1f} ({100 * bytes_s / peaks['hbm_bytes']:5.1f}%)  "
                f"{util}  {k['bound']}"
            )
        header = (
            f"{'kernel':<14s} {'chip':<5s} {'time (us)':>10s} {'TFLOP/s':>8s} {'(peak)':>8s} "
            f"{'HBM GB/s':>8s} {'(peak)':>8s}  engine utilisation" + " " * 28 + "bound"
        )
        total = f"total modeled device time: {self.total_device_ns / 1e3:.2f} us"
        text = "\n".join([header, *rows, total])
        print(text, file=file)
        return text

    def export_chrome_trace(self, path: str | Path, all_ranks: bool = False) -> None:
        """Write a Chrome trace (Perfetto, chrome://tracing): one track per engine queue and
        DMA engine, where every instruction is an event whose args carry its Python source
        line, and one per transfer resource (``neuronlink`` for collectives, ``host_link`` and
        ``dma`` for copies) with an event per copy or collective.

        Runs on neuron tensors sit where they ran on the device's timeline (so a collective
        that overlaps kernels is drawn under them); a profile with runs on CPU tensors lays
        its runs end to end instead. ``all_ranks=True`` in a torch.distributed job: every rank
        must call it; rank 0 writes one trace with a process per rank (each rank's timeline
        starting at its first run), the others write nothing."""
        events = self._chrome_events(pid=0, label="device")
        if all_ranks and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
            gathered: list[Any] | None = (
                [None] * torch.distributed.get_world_size() if rank == 0 else None
            )
            mine = self._chrome_events(pid=rank, label=f"rank {rank}")
            torch.distributed.gather_object(mine, gathered, dst=0)
            if rank != 0:
                return
            assert gathered is not None
            events = [e for rank_events in gathered for e in rank_events]
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))

    def _chrome_events(self, pid: int, label: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = [
            {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}}
        ]
        tids: dict[tuple[str, int], int] = {}

        def track(unit: str, queue: int = 0) -> int:
            key = (unit, queue)
            if key not in tids:
                tids[key] = len(tids) + 1
                track_name = (
                    f"{unit} transfers" if queue < 0 else f"dma{queue}" if unit == "dma" else unit
                )
                events.append(
                    {
                        "ph": "M",
                        "pid": pid,
                        "tid": tids[key],
                        "name": "thread_name",
                        "args": {"name": track_name},
                    }
                )
            return tids[key]

        for unit in _UNITS[:-1]:
            track(unit)
        timed = bool(self._runs) and all(r.record["start_ns"] is not None for r in self._runs)
        origin = min((r.record["start_ns"] for r in self._runs), default=0.0) if timed else 0.0
        offset = 0.0
        for r in self._runs:
            start = r.record["start_ns"] - origin if timed else offset
            offset += r.record["device_ns"]
            if r.kernel is None:  # a copy or a collective: one event on its resource's track
                events.append(
                    {
                        "ph": "X",
                        "pid": pid,
                        # -1: the transfer tracks, apart from the DMA queues' instructions.
                        "tid": track(r.record["bound"], -1),
                        "name": r.name,
                        "ts": start / 1e3,
                        "dur": r.record["device_ns"] / 1e3,
                        "args": {"bytes": r.record["bytes"], "source": r.record["source_lines"]},
                    }
                )
                continue
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": 0,
                    "name": r.name,
                    "ts": start / 1e3,
                    "dur": r.record["device_ns"] / 1e3,
                    "args": {"bound": r.record["bound"], "source": r.record["source_lines"]},
                }
            )
            names = r.kernel.instruction_names
            lines = r.kernel.locations
            for node, unit, queue, count, begin, end, loc in r.kernel.timeline_events():
                args: dict[str, Any] = {"kernel": r.name}
                if loc >= 0:
                    args["source"] = lines[loc]
                if unit == "dma":
                    args["dma_engines"] = count
                events.append(
                    {
                        "ph": "X",
                        "pid": pid,
                        "tid": track(unit, queue),
                        "name": names[node],
                        "ts": (start + begin) / 1e3,
                        "dur": max(end - begin, 0.0) / 1e3,
                        "args": args,
                    }
                )
        return events

    def export_parquet(self, directory: str | Path) -> tuple[Path, Path]:
        """Write ``kernels.parquet`` (one row per run) and ``instructions.parquet`` (one row per
        instruction event: kernel run, op, engine/DMA unit and queue, start/end ns, source line)
        for automated bottleneck analysis. Needs pyarrow."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        runs: dict[str, list[Any]] = {
            k: [] for k in ("run", "name", "target", "device_ns", "flops", "hbm_bytes", "bound")
        }
        busy: dict[str, list[float]] = {f"{u}_busy_ns": [] for u in _UNITS}
        columns: dict[str, list[Any]] = {
            k: []
            for k in (
                "run",
                "kernel",
                "op",
                "unit",
                "queue",
                "dma_engines",
                "start_ns",
                "end_ns",
                "source",
            )
        }
        for i, r in enumerate(self._runs):
            k = r.record
            for key in ("name", "target", "device_ns", "flops", "hbm_bytes", "bound"):
                runs[key].append(k[key])
            runs["run"].append(i)
            for u in _UNITS:
                busy[f"{u}_busy_ns"].append(float(k["engine_busy_ns"].get(u, 0.0)))
            if r.kernel is None:  # a copy or a collective: no instructions
                continue
            names, lines = r.kernel.instruction_names, r.kernel.locations
            for node, unit, queue, count, start, end, loc in r.kernel.timeline_events():
                for key, value in (
                    ("run", i),
                    ("kernel", r.name),
                    ("op", names[node]),
                    ("unit", unit),
                    ("queue", queue),
                    ("dma_engines", count),
                    ("start_ns", start),
                    ("end_ns", end),
                    ("source", lines[loc] if loc >= 0 else None),
                ):
                    columns[key].append(value)
        kernels_path, instructions_path = out / "kernels.parquet", out / "instructions.parquet"
        pq.write_table(pa.table({**runs, **busy}), kernels_path)
        pq.write_table(pa.table(columns), instructions_path)
        return kernels_path, instructions_path


_ACTIVE: list[Profile] = []


@contextlib.contextmanager
def profile() -> Iterator[Profile]:
    """Record every kernel run inside the ``with`` block: compiled models' kernels and the
    device kernels of eager ops on neuron tensors."""
    prof = Profile()
    _ACTIVE.append(prof)
    _eager_profiling()
    try:
        yield prof
    finally:
        _ACTIVE.remove(prof)
        _eager_profiling()


def _eager_profiling() -> None:
    """Have the device report eager kernel runs (:mod:`torchneuron.eager`) while a profile is
    active; it never loads the device library."""
    device = sys.modules.get("torchneuron._device")
    if device is not None:
        device._set_eager_profiling(bool(_ACTIVE))


def record_run(
    kernel: Kernel, name: str, eager: bool = False, start_ns: float | None = None
) -> None:
    """Called by every kernel run (``eager``: an eager op's kernel on the device; ``start_ns``:
    when it started on the device's timeline, for runs on neuron tensors): hands it to the
    active profiles, if any."""
    for prof in _ACTIVE:
        prof.record(kernel, name, eager, start_ns)


def record_transfer(
    name: str, resource: str, nbytes: int, device_ns: float, start_ns: float
) -> None:
    """Called by the device after every copy or collective while a profile is active."""
    from torchneuron import device

    target = device._C()._target()
    for prof in _ACTIVE:
        prof.record_transfer(name, resource, nbytes, device_ns, target, start_ns)
