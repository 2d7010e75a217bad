"""What the FlexAttention (:mod:`torchneuron.flex`) and SDPA (:mod:`torchneuron.sdpa`) front
ends share: where a call's block classes are kept, and the attention kernels' facts about
blocks. The facts are the compiler's own (``torchneuron._C``), read when first needed, never
copied, so the two modules need not import each other.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

__all__ = [
    "BLOCKS_META",
    "MASK_FORM_META",
    "BlockClasses",
    "block_classes",
    "head_dim_limit",
    "unit",
]

#: ``node.meta`` key of an attention node's block classes: ``int8 [B or 1, H or 1, query
#: blocks, key blocks]``, one :class:`BlockClasses` code per block.
BLOCKS_META = "neuron_flex_blocks"
#: ``node.meta`` key of a routed SDPA call's mask form, read from the mask's content when the
#: call is specialized (:func:`torchneuron.sdpa.mask_form`).
MASK_FORM_META = "neuron_mask_form"


class BlockClasses(NamedTuple):
    """The codes of the ``neuron.flex_attention`` op's ``blocks`` attribute: a block the kernel
    skips, one that needs ``mask_mod`` and one that needs none."""

    masked: int
    partial: int
    full: int


@functools.cache
def block_classes() -> BlockClasses:
    """The block-class codes, as the attention kernels define them (``_C.FLEX_BLOCK_CLASSES``)."""
    from torchneuron._native import native

    return BlockClasses(**{k: int(v) for k, v in native().FLEX_BLOCK_CLASSES.items()})


@functools.cache
def unit() -> int:
    """The attention kernels' unit of query rows and keys: a query row per partition, against
    as many keys (TensorE contracts over the partitions). A document is compiled for any
    target, so this is the smallest unit of any (:func:`_partitions`); it is the block size of
    the FlexAttention call an SDPA call becomes (the kernels take any block size)."""
    return _partitions()


@functools.cache
def head_dim_limit() -> int:
    """The largest head dim the attention kernels take on every target: TensorE contracts
    over at most one partition per element (:func:`_partitions`)."""
    return _partitions()


def _partitions() -> int:
    """The fewest partitions of any target (``_C.target_memory(target)["partitions"]``)."""
    from torchneuron._native import native

    c = native()
    return min(int(c.target_memory(t)["partitions"]) for t in c.targets())
