"""Process-wide counters behind :func:`torchneuron.stats`."""

from __future__ import annotations

import sys
import threading
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STATS", "Stats"]


@dataclass
class Stats:
    graphs_compiled: int = 0
    ops_on_device: int = 0
    ops_fallback: Counter[str] = field(default_factory=Counter)
    kernels_run: int = 0
    recompiles: int = 0
    # Calls whose kernel read size parameters from a tensor's values when launched (a grouped
    # GEMM's offsets): on the chip, loading them into registers for dynamic loop bounds.
    launch_reads: int = 0
    compile_seconds: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    # Of those, lookups of whole graphs (:mod:`torchneuron.graph_cache`), and graphs not keyed.
    graph_cache_hits: int = 0
    graph_cache_misses: int = 0
    graph_cache_skipped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # Objects whose eager work is already counted (optimizers): once each until reset.
    counted: weakref.WeakSet[object] = field(
        default_factory=weakref.WeakSet, repr=False, compare=False
    )

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            fallback = Counter(self.ops_fallback)
            fallback.update(_eager_fallbacks())
            return {
                "graphs_compiled": self.graphs_compiled,
                "ops_on_device": self.ops_on_device,
                "ops_fallback": dict(fallback),
                "kernels_run": self.kernels_run + _eager_kernel_runs(),
                "recompiles": self.recompiles,
                "launch_reads": self.launch_reads,
                "compile_seconds": self.compile_seconds,
                "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses,
            }

    def reset(self) -> None:
        with self.lock:
            self.graphs_compiled = 0
            self.ops_on_device = 0
            self.ops_fallback = Counter()
            self.kernels_run = 0
            self.recompiles = 0
            self.launch_reads = 0
            self.compile_seconds = 0.0
            self.cache_hits = 0
            self.cache_misses = 0
            self.graph_cache_hits = 0
            self.graph_cache_misses = 0
            self.graph_cache_skipped = 0
            self.counted = weakref.WeakSet()
            device = sys.modules.get("torchneuron._device")
            if device is not None:
                device._reset_fallback_counts()
                device._reset_eager_kernel_counts()

    def record_compile(
        self, *, graphs: int, ops_on_device: int, fallback: list[str], seconds: float
    ) -> None:
        with self.lock:
            self.graphs_compiled += graphs
            self.ops_on_device += ops_on_device
            self.ops_fallback.update(fallback)
            self.compile_seconds += seconds

    def record_cache(self, hit: bool, graph: bool = False) -> None:
        with self.lock:
            if hit:
                self.cache_hits += 1
                self.graph_cache_hits += graph
            else:
                self.cache_misses += 1
                self.graph_cache_misses += graph

    def record_graph_skipped(self) -> None:
        with self.lock:
            self.graph_cache_skipped += 1

    def graph_cache_counts(self) -> dict[str, int]:
        with self.lock:
            return {
                "graph_hits": self.graph_cache_hits,
                "graph_misses": self.graph_cache_misses,
                "graph_skipped": self.graph_cache_skipped,
            }

    def record_eager_once(self, owner: object, name: str) -> None:
        """Count ``name`` in ``ops_fallback`` the first time ``owner`` does eager work."""
        with self.lock:
            if owner not in self.counted:
                self.counted.add(owner)
                self.ops_fallback[name] += 1

    def record_kernel_run(self) -> None:
        with self.lock:
            self.kernels_run += 1

    def record_launch_read(self) -> None:
        with self.lock:
            self.launch_reads += 1

    def record_recompile(self) -> None:
        with self.lock:
            self.recompiles += 1


def _eager_fallbacks() -> dict[str, int]:
    """CPU-fallback calls of eager ops on neuron tensors, as ``"aten.add.out (eager)"``: counted
    per call by the device library (only if it is loaded: this never loads it)."""
    device = sys.modules.get("torchneuron._device")
    if device is None:
        return {}
    return {
        name.replace("::", ".", 1) + " (eager)": n for name, n in device._fallback_counts().items()
    }


def _eager_kernel_runs() -> int:
    """Device kernel runs of eager ops on neuron tensors (:mod:`torchneuron.eager`)."""
    device = sys.modules.get("torchneuron._device")
    if device is None:
        return 0
    return int(device._eager_kernel_counts()["runs"])


STATS = Stats()
