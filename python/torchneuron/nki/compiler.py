"""``torchneuron.nki.compiler``: NKI's compiler directives and hand allocation.

``skip_middle_end_transformations`` and ``no_reorder()`` steer the Neuron compiler's own
passes; this compiler traces a kernel as written, so they change nothing here (the kernel's
program is the same either way). ``sbuf.mod_alloc``/``psum.mod_alloc`` place a tensor's tiles
at the addresses the kernel gives (modulo allocation, NKI's formula), ``sbuf.alloc(func)``/
``psum.alloc(func)`` where the kernel's function puts them; other tensors of the kernel are
still placed by the allocator, around them.
"""

from __future__ import annotations

from typing import Any

from torchneuron.nki import _ir

__all__ = ["no_reorder", "psum", "sbuf", "skip_middle_end_transformations"]


def skip_middle_end_transformations(fn: Any) -> Any:
    """Decorator: this compiler applies no middle-end transformations to kernels anyway."""
    return fn


class no_reorder:  # noqa: N801 (NKI's spelling)
    """``nl.sequential_range(n, directives=nki.compiler.no_reorder())``: the loop's
    instructions keep their program order (they always do here: queues are in order)."""


def _tiles(value: Any, name: str) -> tuple[int, ...]:
    tiles = tuple(int(n) for n in value)
    if any(n <= 0 for n in tiles):
        raise _ir.error(f"{name}={value!r}: tile counts must be positive")
    return tiles


class _Memory:
    def __init__(self, name: str, space: str) -> None:
        self.name, self.space = name, space

    def mod_alloc(
        self,
        *,
        base_addr: int = 0,
        base_bank: int | None = None,
        base_partition: int = 0,
        num_bank_tiles: Any = (),
        num_par_tiles: Any = (),
        num_free_tiles: Any = (),
    ) -> _ir.ModAlloc:
        """``buffer=`` for ``nl.ndarray``: logical tile ``idx`` (its block indices) goes to
        ``base + linearize(idx % num_tiles) * tile size`` in each address component."""
        if self.space == _ir.SBUF and (base_bank is not None or num_bank_tiles):
            raise _ir.error("nki.compiler.sbuf.mod_alloc has no banks (base_bank, num_bank_tiles)")
        if int(base_addr) < 0 or (base_bank is not None and int(base_bank) < 0):
            raise _ir.error(f"nki.compiler.{self.name}.mod_alloc: negative base address")
        return _ir.ModAlloc(
            self.space,
            int(base_addr),
            int(base_bank or 0),
            int(base_partition),
            _tiles(num_bank_tiles, "num_bank_tiles"),
            _tiles(num_par_tiles, "num_par_tiles"),
            _tiles(num_free_tiles, "num_free_tiles"),
        )

    def alloc(self, func: Any) -> _ir.FuncAlloc:
        """``buffer=`` for ``nl.ndarray``: ``func(idx, pdim_size, fdim_size)`` places logical
        tile ``idx``: ``(start_partition, byte_addr)`` in SBUF, ``(bank, start_partition,
        byte_addr)`` in PSUM."""
        if not callable(func):
            raise _ir.error(f"nki.compiler.{self.name}.alloc takes a function, got {func!r}")
        return _ir.FuncAlloc(self.space, func)

    def __getattr__(self, name: str) -> Any:
        raise _ir.error(f"nki.compiler.{self.name}.{name} is not supported by torchneuron.nki yet")


sbuf = _Memory("sbuf", _ir.SBUF)
psum = _Memory("psum", _ir.PSUM)
