"""``torchneuron.nki.compiler``: NKI's compiler directives.

``skip_middle_end_transformations`` and ``no_reorder()`` steer the Neuron compiler's own
passes; this compiler traces a kernel as written, so they change nothing here (the kernel's
program is the same either way). Hand allocation (``sbuf.mod_alloc``/``psum.mod_alloc``) is
not supported yet: calling it is an error naming it at the kernel's line.
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


class _Memory:
    def __init__(self, name: str) -> None:
        self.name = name

    def mod_alloc(self, *args: Any, **kwargs: Any) -> Any:
        raise _ir.error(
            f"nki.compiler.{self.name}.mod_alloc (hand-placed tiles) is not supported by "
            "torchneuron.nki yet; use buffer=nl.sbuf / nl.psum and let the allocator place them"
        )

    def __getattr__(self, name: str) -> Any:
        raise _ir.error(f"nki.compiler.{self.name}.{name} is not supported by torchneuron.nki yet")


sbuf = _Memory("sbuf")
psum = _Memory("psum")
