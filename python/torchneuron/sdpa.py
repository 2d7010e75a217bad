"""``F.scaled_dot_product_attention`` through the FlexAttention kernel, in graphs without
gradients.

In an inference graph (no input requires grad, or grad mode is off) every SDPA call the
FlexAttention kernel can run is replaced, in Dynamo's graph and before ``aot_autograd`` traces
it, with the custom op ``torchneuron::attention``: ``aot_autograd`` keeps it whole (its eager
implementation is SDPA itself, so a fallback to eager PyTorch computes what the model asked
for), and the FX document writes it as a ``higher_order.flex_attention`` node whose modifiers
express SDPA's arguments (:func:`flex_form`):

- ``is_causal``: mask_mod ``q_idx >= kv_idx`` (SDPA's top-left aligned causal mask, also when
  the query and key lengths differ); block classes from the shape: blocks above the diagonal
  are skipped, blocks below it skip the mask.
- boolean ``attn_mask``: mask_mod reads the mask at ``[b, h, q_idx, kv_idx]`` (broadcast
  dimensions are not indexed).
- float ``attn_mask``: score_mod ``score + mask[b, h, q_idx, kv_idx]``, and mask_mod
  ``mask[...] != -inf``, so fully masked rows give 0 like eager SDPA instead of NaN.
- ``enable_gqa``: the kernel maps query head ``h`` to key head ``h // (H / H_kv)``, as SDPA does.
- ``scale``: passed as is; SDPA's default is ``1 / sqrt(head dim)``, as flex_attention's.

Block classes of a tensor mask are computed from its content when the graph is called
(:func:`mask_block_classes`; the backend compiles one kernel per block structure, like for a
BlockMask), so fully masked blocks are skipped and fully kept ones skip the mask. Past
:data:`MAX_MASK_STRUCTURES` structures, further ones share a kernel whose blocks are all partial.

Graphs that need gradients keep SDPA's math decomposition (matmul + softmax + matmul, see
:func:`torchneuron.decompositions.math_attention`): the FlexAttention kernel has no backward yet.
Calls with ``dropout_p > 0``, inputs that are not 4-D or head dims above 128 also keep the math
path (a head dim that is symbolic when the graph is traced, ``dynamic=True``, is checked when
it is specialized: above 128 the call falls back to eager SDPA, counted in the stats).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

__all__ = [
    "ATTENTION",
    "MAX_HEAD_DIM",
    "MAX_MASK_STRUCTURES",
    "SDPA_BLOCK",
    "FlexForm",
    "causal_block_classes",
    "expand_block_classes",
    "flex_form",
    "is_attention",
    "mask_block_classes",
    "needs_grad",
    "route_attention",
]

#: Block size of the FlexAttention call an SDPA call becomes: the kernel's key unit.
SDPA_BLOCK = 128
#: Largest query/key and value head dim the FlexAttention kernel takes (TensorE contracts over
#: at most 128 partitions).
MAX_HEAD_DIM = 128

#: Distinct block structures of SDPA masks a compiled graph gets kernels for; masks with other
#: structures share one kernel that treats every block as partial.
MAX_MASK_STRUCTURES = 8

#: Classes of a block, as in :mod:`torchneuron.flex`.
_MASKED, _PARTIAL, _FULL = 0, 1, 2


@torch.library.custom_op("torchneuron::attention", mutates_args=())
def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """SDPA without dropout, as one op ``aot_autograd`` does not decompose."""
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attn_mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )
    return out.contiguous()


@_attention.register_fake
def _(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


#: The op an SDPA call becomes in an inference graph.
ATTENTION: torch._ops.OpOverload = torch.ops.torchneuron.attention.default

_SDPA = torch._C._nn.scaled_dot_product_attention
_SDPA_PARAMS = inspect.Signature(
    [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for name, default in (
            ("query", inspect.Parameter.empty),
            ("key", inspect.Parameter.empty),
            ("value", inspect.Parameter.empty),
            ("attn_mask", None),
            ("dropout_p", 0.0),
            ("is_causal", False),
            ("scale", None),
            ("enable_gqa", False),
        )
    ]
)


def is_attention(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls ``torchneuron::attention``."""
    return node.op == "call_function" and node.target is ATTENTION


def needs_grad(gm: torch.fx.GraphModule, example_inputs: Any) -> bool:
    """Whether ``aot_autograd`` may trace ``gm`` as a training graph: grad mode is on and an
    input (or a parameter of ``gm``) requires grad, or ``gm`` switches grad mode itself.
    ``aot_autograd`` makes an inference graph whenever none of its inputs requires grad or no
    output does (which grad mode off guarantees), so ``False`` here implies an inference
    graph; the converse need not hold (a detached output), and then SDPA stays on its math
    path, which is correct for both."""
    if any(
        n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in gm.graph.nodes
    ):
        return True
    if not torch.is_grad_enabled():
        return False
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    tensors += list(gm.parameters())
    return any(t.requires_grad for t in tensors)


def _static(value: object) -> int | None:
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt) and is_concrete_int(value):
        return int(value)
    return None


def _same(*sizes: object) -> bool:
    """Whether sizes (ints or SymInts) are equal for every value of their symbols (no guard
    is added)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return all(statically_known_true(a == b) for a, b in itertools.pairwise(sizes))  # type: ignore[arg-type]


#: Element types of query, key and value the kernel takes.
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _routable(call: dict[str, Any]) -> bool:
    """Whether the FlexAttention kernel computes this SDPA call (see the module docstring).
    Sizes may be symbolic: the backend specializes them per call."""
    if call["dropout_p"] not in (0, 0.0) or not isinstance(call["is_causal"], bool):
        return False
    if not isinstance(call["enable_gqa"], bool):
        return False
    if call["scale"] is not None and not isinstance(call["scale"], (int, float)):
        return False
    vals = []
    for name in ("query", "key", "value"):
        node = call[name]
        val = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() != 4:
            return False
        vals.append(val)
    q, k, v = vals
    if q.dtype not in _DTYPES or not q.dtype == k.dtype == v.dtype:
        return False
    if not (
        _same(q.shape[0], k.shape[0], v.shape[0])
        and _same(k.shape[1], v.shape[1])
        and _same(k.shape[2], v.shape[2])
        and _same(q.shape[3], k.shape[3])
    ):
        return False
    if not (_same(q.shape[1], k.shape[1]) or call["enable_gqa"]):
        return False  # with enable_gqa, SDPA itself checked that key heads divide query heads
    # A symbolic head dim is checked when the graph is specialized (a counted fallback to
    # eager SDPA when it is above the limit then).
    for dim in (q.shape[3], v.shape[3]):
        static = _static(dim)
        if static is not None and not 0 < static <= MAX_HEAD_DIM:
            return False
    mask = call["attn_mask"]
    if mask is None:
        return True
    if call["is_causal"] or not isinstance(mask, torch.fx.Node):
        return False  # SDPA rejects a mask with is_causal: it keeps its own error
    m = mask.meta.get("example_value")
    return (
        isinstance(m, torch.Tensor)
        and m.dim() <= 4
        and (m.dtype == torch.bool or m.dtype in _DTYPES)
    )


def route_attention(gm: torch.fx.GraphModule) -> int:
    """Replace, in Dynamo's graph ``gm``, every SDPA call the FlexAttention kernel computes
    with ``torchneuron::attention``; returns how many. Only for graphs that need no gradient
    (:func:`needs_grad`): the op has no backward."""
    routed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        try:
            call = _SDPA_PARAMS.bind(*node.args, **node.kwargs)
        except TypeError:
            continue
        call.apply_defaults()
        if not _routable(call.arguments):
            continue
        a = call.arguments
        scale = None if a["scale"] is None else float(a["scale"])
        node.target = ATTENTION
        node.args = (
            a["query"],
            a["key"],
            a["value"],
            a["attn_mask"],
            a["is_causal"],
            scale,
            a["enable_gqa"],
        )
        node.kwargs = {}
        routed += 1
    if routed:
        gm.recompile()
    return routed


# -- block classes ------------------------------------------------------------------------------


def causal_block_classes(q_len: int, kv_len: int, block: int = SDPA_BLOCK) -> torch.Tensor:
    """``int8 [1, 1, query blocks, key blocks]`` of SDPA's causal mask ``q >= kv``: MASKED
    where every key of the block is after every query, FULL where none is."""
    q_lo = torch.arange(0, q_len, block)
    kv_lo = torch.arange(0, kv_len, block)
    q_hi = torch.clamp(q_lo + block, max=q_len) - 1
    kv_hi = torch.clamp(kv_lo + block, max=kv_len) - 1
    full = q_lo[:, None] >= kv_hi[None, :]
    masked = q_hi[:, None] < kv_lo[None, :]
    classes = torch.where(full, _FULL, torch.where(masked, _MASKED, _PARTIAL))
    return classes.to(torch.int8)[None, None]


def _units(x: torch.Tensor, dim: int, block: int, fill: bool) -> torch.Tensor:
    """``x`` with dimension ``dim`` split into ``[units, block]`` (padded with ``fill``); a
    broadcast dimension (size 1) stays one unit of one."""
    n = x.shape[dim]
    if n == 1:
        return x.unsqueeze(dim + 1)
    pad = -n % block
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        x = torch.cat([x, x.new_full(shape, fill)], dim)
    return x.unflatten(dim, (-1, block))


def mask_block_classes(mask: torch.Tensor, block: int = SDPA_BLOCK) -> torch.Tensor:
    """``int8 [B or 1, H or 1, query blocks or 1, key blocks or 1]`` of an SDPA mask (any
    rank up to 4, broadcast dimensions of size 1 stay 1): MASKED where no entry of the block
    lets a key through (``False``, or ``-inf`` in a float mask), FULL where every one does,
    PARTIAL otherwise."""
    m = mask.detach().to("cpu")
    m = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))
    kept = m if m.dtype == torch.bool else m != float("-inf")

    def reduce(fill: bool, fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        units = _units(_units(kept, 3, block, fill), 2, block, fill)
        return fn(fn(units, dim=5), dim=3)

    every = reduce(True, torch.all)
    some = reduce(False, torch.any)
    classes = torch.where(every, _FULL, torch.where(some, _PARTIAL, _MASKED))
    return classes.to(torch.int8).contiguous()


def expand_block_classes(classes: torch.Tensor, q_len: int, kv_len: int) -> torch.Tensor:
    """:func:`mask_block_classes` of a mask broadcast along the query or key rows, for a call
    with these lengths: ``[B or 1, H or 1, query blocks, key blocks]``."""
    n_q, n_kv = -(-q_len // SDPA_BLOCK), -(-kv_len // SDPA_BLOCK)
    return classes.expand(*classes.shape[:2], n_q, n_kv).contiguous()


# -- the FlexAttention form of a call -------------------------------------------------------------


@dataclass(frozen=True)
class FlexForm:
    """A ``torchneuron::attention`` call as a FlexAttention call: modifiers (ATen graphs
    taking the score (score_mod only), b, h, q_idx and kv_idx as 0-d tensors, then the
    captured tensors), the tensors they capture (graph nodes), the scale and block classes."""

    scale: float
    score_mod: torch.fx.GraphModule
    mask_mod: torch.fx.GraphModule
    score_buffers: tuple[torch.fx.Node, ...]
    mask_buffers: tuple[torch.fx.Node, ...]
    blocks: torch.Tensor | None


def _trace(fn: Callable[..., Any], *examples: torch.Tensor) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        return make_fx(fn)(*examples)


def _indices() -> list[torch.Tensor]:
    return [torch.zeros((), dtype=torch.int32) for _ in range(4)]


def _lookup(mask: torch.Tensor, b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
    """``mask[b, h, q, kv]`` of a mask of any rank up to 4, broadcast dimensions left out
    (the mask is viewed without them, so every index is a kernel index)."""
    dims = [(i, s) for i, s in zip((b, h, q, kv)[4 - mask.dim() :], mask.shape, strict=True)]
    kept = [(i, s) for i, s in dims if s != 1]
    if not kept:
        return mask.reshape(())
    table = mask.reshape([s for _, s in kept])
    return torch.ops.aten.index.Tensor(table, [i for i, _ in kept])  # type: ignore[no-any-return]


def _noop_mask(b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
    return torch.full((), True, dtype=torch.bool)


def _causal_mask(b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
    return q >= kv


def _bool_mask(b: Any, h: Any, q: Any, kv: Any, mask: torch.Tensor) -> torch.Tensor:
    return _lookup(mask, b, h, q, kv)


def _finite_mask(b: Any, h: Any, q: Any, kv: Any, mask: torch.Tensor) -> torch.Tensor:
    return _lookup(mask, b, h, q, kv) != float("-inf")


def _identity_score(score: Any, b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
    return score  # type: ignore[no-any-return]


def _add_mask(score: Any, b: Any, h: Any, q: Any, kv: Any, mask: torch.Tensor) -> torch.Tensor:
    return score + _lookup(mask, b, h, q, kv)  # type: ignore[no-any-return]


def flex_form(node: torch.fx.Node) -> FlexForm:
    """The FlexAttention form of a ``torchneuron::attention`` node whose ``meta["val"]`` have
    concrete shapes. Block classes: from ``meta[flex.BLOCKS_META]`` when the backend computed
    them from the mask's content, from the shape without a mask, else ``None`` (all partial:
    the mask_mod decides every entry)."""
    from torchneuron.flex import BLOCKS_META

    q, k, _, mask, is_causal, scale, _ = node.args
    assert isinstance(q, torch.fx.Node) and isinstance(k, torch.fx.Node)
    qv, kv, vv = q.meta["val"], k.meta["val"], node.args[2].meta["val"]  # type: ignore[union-attr]
    q_len, kv_len = int(qv.shape[-2]), int(kv.shape[-2])
    if int(qv.shape[-1]) > MAX_HEAD_DIM or int(vv.shape[-1]) > MAX_HEAD_DIM:
        raise ValueError(f"head dims above {MAX_HEAD_DIM} are not supported by the kernel")
    score = torch.zeros((), dtype=qv.dtype)
    blocks = node.meta.get(BLOCKS_META)
    if mask is None:
        score_mod = _trace(_identity_score, score, *_indices())
        mask_mod = _trace(_causal_mask if is_causal else _noop_mask, *_indices())
        if blocks is None and is_causal:
            blocks = causal_block_classes(q_len, kv_len)
        elif blocks is None:
            n_q, n_kv = -(-q_len // SDPA_BLOCK), -(-kv_len // SDPA_BLOCK)
            blocks = torch.full((1, 1, n_q, n_kv), _FULL, dtype=torch.int8)
        return FlexForm(_scale(scale, qv), score_mod, mask_mod, (), (), blocks)
    assert isinstance(mask, torch.fx.Node)
    mv = mask.meta["val"]
    example = torch.zeros(tuple(int(s) for s in mv.shape), dtype=mv.dtype)
    if mv.dtype == torch.bool:
        score_mod = _trace(_identity_score, score, *_indices())
        mask_mod = _trace(_bool_mask, *_indices(), example)
        return FlexForm(_scale(scale, qv), score_mod, mask_mod, (), (mask,), blocks)
    score_mod = _trace(_add_mask, score, *_indices(), example)
    mask_mod = _trace(_finite_mask, *_indices(), example)
    return FlexForm(_scale(scale, qv), score_mod, mask_mod, (mask,), (mask,), blocks)


def _scale(scale: object, query: torch.Tensor) -> float:
    if scale is None:
        return 1.0 / float(int(query.shape[-1])) ** 0.5
    assert isinstance(scale, (int, float))
    return float(scale)
