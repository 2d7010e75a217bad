"""``torchneuron.nki.typing`` (``nt``): NKI's tensor type annotations.

``nt.tensor[shape, dtype]`` (or ``nt.tensor[[d0, d1], dtype]``) names a tensor's shape and
dtype. As an annotation it documents a tile; as a value it stands for a kernel argument
without data, which ``nki.benchmark`` times (the modeled time needs only shapes and dtypes).
"""

from __future__ import annotations

from typing import Any

from torchneuron.nki import _ir

__all__ = ["TensorSpec", "tensor"]


class TensorSpec:
    """A kernel argument's shape and dtype, without data."""

    def __init__(self, shape: tuple[int, ...], dtype: _ir.DType | None) -> None:
        self.shape = shape
        self._dtype = dtype

    @property
    def dtype(self) -> _ir.DType:
        if self._dtype is None:
            raise _ir.error(
                f"nt.tensor{list(self.shape)} has no dtype; write nt.tensor[shape, dtype]"
            )
        return self._dtype

    def __repr__(self) -> str:
        return f"nt.tensor[{list(self.shape)}, {self._dtype!r}]"


class tensor:  # noqa: N801 (NKI's spelling)
    """``nt.tensor[...]``: a :class:`TensorSpec`."""

    def __class_getitem__(cls, key: Any) -> TensorSpec:
        items = list(key) if isinstance(key, tuple) else [key]
        dtype = None
        if items and not isinstance(items[-1], (int, list, tuple)):
            dtype = _ir.as_dtype(items.pop())
        if len(items) == 1 and isinstance(items[0], (list, tuple)):
            items = list(items[0])
        if not all(isinstance(d, int) for d in items):
            raise TypeError(f"nt.tensor[{key!r}]: expected a shape of integers and a dtype")
        return TensorSpec(tuple(int(d) for d in items), dtype)
