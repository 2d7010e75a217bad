"""Lazy access to the C++ extension ``torchneuron._C``.

The extension is imported on first use, not when ``torchneuron`` is imported, so the pure-Python
parts (serializer, partitioner, stats) work without it. Its API, as this package uses it:

- ``targets() -> list[str]``
- ``check_graph(graph_json: str) -> dict[str, str]``: node name -> why it cannot be lowered
- ``compile_graph(graph_json: str, target: str, dump_dir: str = "") -> Kernel``, or a
  ``GenericKernel`` when the document has symbolic sizes and the compiler made the program
  size-generic (docs/PROGRAM_FORMAT.md, "Size parameters"); ``load_program`` likewise
- ``GenericKernel.params``: ``[(name, min, max or None)]``; ``GenericKernel.instance(sizes:
  dict[str, int]) -> Kernel``: the program at those sizes (``DeviceError`` outside the ranges)
- ``compile_kernel(text: str, name: str, target: str, dump_dir: str = "") -> Kernel``: a
  ``nisa`` kernel module (MLIR text, e.g. a traced NKI kernel) from allocation on
- ``target_memory(target) -> dict``: partitions and SBUF/PSUM bytes per partition
- ``Kernel.input_specs`` / ``Kernel.output_specs``: ``list[tuple[str, list[int]]]`` (dtype name
  as in docs/FX_GRAPH_FORMAT.md, shape)
- ``Kernel.run(inputs, outputs)``: each a list of ``(data_ptr, dtype_name, shape)``
- ``Kernel.timeline() -> dict`` (modeled device time of one run: ``device_ns``, ``flops``,
  ``hbm_bytes``, ``engine_busy_ns``, ``bound``, ...), ``Kernel.timeline_events()``,
  ``Kernel.instruction_names``, ``Kernel.locations``, ``Kernel.target``
- ``target_peaks(target) -> {"flops": ..., "hbm_bytes": ...}``: per-second peaks of one core
- ``CompileError``: raised for compile failures, message naming the user's Python line
- ``FLEX_BLOCK_CLASSES`` (``{"masked", "partial", "full"}`` -> code): the attention kernels'
  block-class codes (:mod:`torchneuron.attention_blocks`)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol

__all__ = ["GenericKernel", "Kernel", "native"]

TensorSpec = tuple[str, list[int]]
BufferArg = tuple[int, str, list[int]]


class Kernel(Protocol):
    """A compiled device program (``torchneuron._C.Kernel``)."""

    @property
    def input_specs(self) -> Sequence[TensorSpec]: ...

    @property
    def output_specs(self) -> Sequence[TensorSpec]: ...

    def run(
        self, inputs: list[BufferArg], outputs: list[BufferArg], collectives: Any = None
    ) -> None: ...

    @property
    def has_collectives(self) -> bool: ...

    @property
    def target(self) -> str: ...

    @property
    def locations(self) -> list[str]: ...

    @property
    def instruction_names(self) -> list[str]: ...

    def timeline(self) -> dict[str, Any]: ...

    def timeline_events(self) -> list[tuple[int, str, int, int, float, float, int]]: ...


class GenericKernel(Protocol):
    """A size-generic device program (``torchneuron._C.GenericKernel``)."""

    @property
    def params(self) -> list[tuple[str, int, int | None]]: ...

    @property
    def target(self) -> str: ...

    @property
    def program_json(self) -> str: ...

    def instance(self, sizes: dict[str, int]) -> Kernel: ...


#: Loads the extension from this file instead (a sanitizer build: ``scripts/test.sh --sanitize``).
LIBRARY_ENV = "TORCHNEURON_NATIVE_LIBRARY"


def native() -> ModuleType:
    """Return ``torchneuron._C``, importing it on first use."""
    path = os.environ.get(LIBRARY_ENV)
    if path and "torchneuron._C" not in sys.modules:
        spec = importlib.util.spec_from_file_location("torchneuron._C", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{LIBRARY_ENV}={path} is not a Python extension module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["torchneuron._C"] = module
    try:
        return importlib.import_module("torchneuron._C")
    except ImportError as e:
        raise ImportError(
            "torchneuron._C, the C++ extension, is not available "
            f"({e}); build and install it with scripts/setup.sh"
        ) from e
