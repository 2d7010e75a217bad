"""``F.scaled_dot_product_attention`` through the FlexAttention kernels.

Every SDPA call the FlexAttention kernel can run is replaced, in Dynamo's graph and before
``aot_autograd`` traces it, with a custom op ``aot_autograd`` keeps whole: in a graph that
needs no gradient ``torchneuron::attention``; in one that may, ``torchneuron::attention_fwd``
(the output and its log-sum-exp), whose backward is ``torchneuron::attention_bwd``. Their
eager implementations are SDPA's math, so a fallback to eager PyTorch computes what the model
asked for. The FX document writes them as ``higher_order.flex_attention`` and
``flex_attention_backward`` nodes whose modifiers express SDPA's arguments (:func:`flex_form`):

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
So is the mask's form (:func:`mask_form`): a causal mask (``generate_square_subsequent_mask``)
is computed as ``is_causal`` is, not read; a float mask of only 0 and -inf only masks.

A call whose query or key length is symbolic (``dynamic=True``, a KV cache growing by a token
per call) is written for one program serving every length: one block class for all blocks
(full; causal: partial, when the lengths are one symbol); a mask tensor over such a length is
"not size-generic" and the graph is compiled per size. The key and value lengths are made one
symbol when the call is routed (a guard on Dynamo's frame: SDPA requires them equal).

Calls with ``dropout_p > 0``, inputs that are not 4-D, head dims above the partitions (128,
:func:`~torchneuron.attention_blocks.head_dim_limit`) or (in training) an additive mask that
requires grad keep the math path (a head dim that is symbolic when the graph is traced,
``dynamic=True``, is checked when it is specialized: above the limit the call falls back to
eager SDPA, counted in the stats).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from torchneuron.attention_blocks import (
    BLOCKS_META,
    MASK_FORM_META,
    block_classes,
    head_dim_limit,
    unit,
)
from torchneuron.sizes import NotSizeGeneric

__all__ = [
    "ATTENTION",
    "ATTENTION_BWD",
    "ATTENTION_FWD",
    "MASK_FORMS",
    "MAX_MASK_STRUCTURES",
    "FlexForm",
    "causal_block_classes",
    "expand_block_classes",
    "flex_form",
    "is_attention",
    "mask_block_classes",
    "mask_form",
    "needs_grad",
    "route_attention",
    "trace_transformer_modules",
]


def trace_transformer_modules() -> None:
    """Let Dynamo trace ``nn.TransformerEncoder``, ``nn.TransformerDecoder`` and
    ``nn.Transformer`` whole where two of their steps break the graph in the caller's frame,
    which leaves the whole module to eager PyTorch:

    - given a mask and no ``is_causal``, the encoder and decoder compare the mask with a causal
      one (``torch.nn.modules.transformer._detect_is_causal_mask``) and branch on the result, a
      bool of data (as PyTorch's language-modelling tutorial calls them: ``encoder(src,
      src_mask)``). In traced code the mask is applied as given instead, the same attention
      (its block classes are read from its content when the graph is called);
    - a float attention mask with a boolean padding mask (PyTorch's translation tutorial) or
      the other way round makes ``torch.nn.functional._canonical_mask`` warn that mixed types
      are deprecated, and Dynamo cannot trace ``warnings.warn``. Traced, the masks are made
      float as eager makes them, without the warning (eager PyTorch still gives it).

    Done once, when the backend loads: Dynamo's substitutes are process-wide. Substitutes
    registered before (by the user) are kept.
    """
    from torch.nn.modules import transformer

    def detect_is_causal_mask(
        mask: torch.Tensor | None, is_causal: bool | None = None, size: int | None = None
    ) -> bool:
        return is_causal is True

    def canonical_mask(
        mask: torch.Tensor | None,
        mask_name: str,
        other_type: torch.dtype | None,
        other_name: str,
        target_type: torch.dtype,
        check_other: bool = True,
    ) -> torch.Tensor | None:
        if mask is None or mask.is_floating_point():
            return mask
        if mask.dtype != torch.bool:
            raise AssertionError(f"only bool and floating types of {mask_name} are supported")
        return torch.zeros_like(mask, dtype=target_type).masked_fill_(mask, float("-inf"))

    for original, substitute in (
        (transformer._detect_is_causal_mask, detect_is_causal_mask),
        (F._canonical_mask, canonical_mask),
    ):
        try:
            torch.compiler.substitute_in_graph(original)(substitute)
        except ValueError:  # already substituted
            pass


#: Distinct block structures of SDPA masks a compiled graph gets kernels for; masks with other
#: structures share one kernel that treats every block as partial.
MAX_MASK_STRUCTURES = 8


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


def _scores(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    factor: float,
) -> torch.Tensor:
    """The scaled, masked fp32 scores of SDPA's math (keys already repeated for GQA)."""
    s = (query.float() @ key.float().transpose(-2, -1)) * factor
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    elif attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.float()
    return s


def _repeat_kv(query: torch.Tensor, t: torch.Tensor, enable_gqa: bool) -> torch.Tensor:
    if enable_gqa and t.shape[-3] != query.shape[-3]:
        return t.repeat_interleave(query.shape[-3] // t.shape[-3], -3)
    return t


def _factor(query: torch.Tensor, scale: float | None) -> float:
    return 1.0 / query.shape[-1] ** 0.5 if scale is None else scale


def _probabilities(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(s) and its natural log-sum-exp; a row whose keys are all masked has
    probabilities 0 (and lse -inf)."""
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1)), lse


def _math(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's math in fp32: the output and the base-2 log-sum-exp of each query row (-inf for
    a row whose keys are all masked, whose output is 0), as FlexAttention returns them."""
    k, v = (_repeat_kv(query, t, enable_gqa) for t in (key, value))
    p, lse = _probabilities(_scores(query, k, attn_mask, is_causal, _factor(query, scale)))
    out = (p @ v.float()).to(query.dtype)
    return out, lse / math.log(2.0)


def _math_backward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    grad_out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`_math`'s output with respect to query, key and value, written
    out (an op's eager kernel runs below autograd, so it cannot differentiate by tracing):
    dV = P^T dO, dS = P * (dO V^T - rowsum(P * dO V^T)), dQ = dS K * scale, dK = dS^T Q * scale,
    with the grouped heads' key and value gradients summed (GQA)."""
    factor = _factor(query, scale)
    k, v = (_repeat_kv(query, t, enable_gqa).float() for t in (key, value))
    q, do = query.float(), grad_out.float()
    p, _ = _probabilities(_scores(q, k, attn_mask, is_causal, factor))
    dp = do @ v.transpose(-2, -1)
    ds = p * (dp - (p * dp).sum(-1, keepdim=True))
    dq = (ds @ k) * factor
    dk = (ds.transpose(-2, -1) @ q) * factor
    dv = p.transpose(-2, -1) @ do

    def per_kv_head(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        heads = like.shape[-3]
        if g.shape[-3] != heads:
            g = g.unflatten(-3, (heads, g.shape[-3] // heads)).sum(-3)
        return g.to(like.dtype).contiguous()

    return dq.to(query.dtype).contiguous(), per_kv_head(dk, key), per_kv_head(dv, value)


@torch.library.custom_op("torchneuron::attention_fwd", mutates_args=())
def _attention_fwd(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA in a training graph: the output and its base-2 log-sum-exp (saved for the
    backward), as the FlexAttention kernel returns them."""
    out, lse = _math(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    return out.contiguous(), lse.contiguous()


@_attention_fwd.register_fake
def _(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    out = query.new_empty((*query.shape[:-1], value.shape[-1]))
    return out, query.new_empty(query.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("torchneuron::attention_bwd", mutates_args=())
def _attention_bwd(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of query, key and value of :func:`_attention_fwd`, given its outputs
    (the device kernel reads them; eager recomputes the probabilities: see _math_backward)."""
    return _math_backward(query, key, value, attn_mask, is_causal, scale, enable_gqa, grad_out)


@_attention_bwd.register_fake
def _(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.inputs = inputs
    ctx.outputs = output


def _backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
    dq, dk, dv = _attention_bwd(*ctx.inputs, *ctx.outputs, grad_out)
    return dq, dk, dv, None, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)

#: The op an SDPA call becomes in an inference graph.
ATTENTION: torch._ops.OpOverload = torch.ops.torchneuron.attention.default
#: The ops an SDPA call becomes in a training graph (forward with its log-sum-exp; backward).
ATTENTION_FWD: torch._ops.OpOverload = torch.ops.torchneuron.attention_fwd.default
ATTENTION_BWD: torch._ops.OpOverload = torch.ops.torchneuron.attention_bwd.default

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
    """Whether ``node`` calls ``torchneuron::attention``, ``attention_fwd`` or
    ``attention_bwd`` (an SDPA call and its gradients; arguments 0-6 are SDPA's)."""
    return node.op == "call_function" and node.target in (ATTENTION, ATTENTION_FWD, ATTENTION_BWD)


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


def _may_be_same(*sizes: object) -> bool:
    """Whether sizes (ints or SymInts) are equal for some value of their symbols (no guard is
    added)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return not any(statically_known_true(a != b) for a, b in itertools.pairwise(sizes))  # type: ignore[arg-type]


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
    # After a recompile with dynamic sizes, query, key and value get sizes of their own symbols
    # (SDPA's fake kernel does not unify them): sizes that may be equal route, and the kernel's
    # verifier rejects a call whose specialized sizes differ, which then runs (and fails, as
    # SDPA does) in eager PyTorch.
    if not (
        _may_be_same(q.shape[0], k.shape[0], v.shape[0])
        and _may_be_same(k.shape[1], v.shape[1])
        and _may_be_same(k.shape[2], v.shape[2])
        and _may_be_same(q.shape[3], k.shape[3])
    ):
        return False
    if not (_same(q.shape[1], k.shape[1]) or call["enable_gqa"]):
        return False  # with enable_gqa, SDPA itself checked that key heads divide query heads
    # A symbolic head dim is checked when the graph is specialized (a counted fallback to
    # eager SDPA when it is above the limit then).
    for dim in (q.shape[3], v.shape[3]):
        static = _static(dim)
        if static is not None and not 0 < static <= head_dim_limit():
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


def _unify_lengths(key: torch.fx.Node, value: torch.fx.Node) -> bool:
    """Make the key and value lengths one size: Dynamo gives each input's dynamic length a
    symbol of its own, and SDPA requires them equal. The check is a guard on Dynamo's frame
    (a call with lengths that differ is traced again and fails in eager SDPA, as uncompiled),
    and makes one symbol of the two, so a size-generic program reads one length for both."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    k, v = key.meta["example_value"], value.meta["example_value"]
    if _same(k.shape[2], v.shape[2]):
        return True
    if optimization_hint(k.shape[2]) != optimization_hint(v.shape[2]):
        return False
    torch._check(k.shape[2] == v.shape[2])
    return True


_MHA = F.multi_head_attention_forward
_MHA_PARAMS = inspect.signature(_MHA)
_ENCODER_LAYER = torch._transformer_encoder_layer_fwd


def _emitter(graph: torch.fx.Graph, fake_mode: Any) -> Callable[..., torch.fx.Node]:
    """``emit(target, *args, method=False)``: a call node with its ``example_value`` (what
    :func:`route_attention` reads), computed on the fake tensors of Dynamo's graph."""

    def emit(target: Any, *args: Any, method: bool = False) -> torch.fx.Node:
        n = graph.call_method(target, args) if method else graph.call_function(target, args)
        fake = torch.fx.node.map_arg(args, lambda x: x.meta["example_value"])
        with fake_mode:
            n.meta["example_value"] = (
                getattr(fake[0], target)(*fake[1:]) if method else target(*fake)
            )
        return n

    return emit


def _multi_head_attention(
    emit: Callable[..., torch.fx.Node],
    inputs: tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node],
    shapes: tuple[tuple[int, int, int], tuple[int, int, int]],
    heads: int,
    weights: tuple[Any, Any, Any, Any],
    mask: torch.fx.Node | None,
    is_causal: bool,
    batch_first: bool,
) -> torch.fx.Node:
    """nn.MultiheadAttention's computation of query, key and value ([L, N, E], or [N, L, E]
    with `batch_first`; `shapes`: the query's and the key's): the packed input projection (one
    matmul for a self-attention, else the packed weights' rows of each), the heads, SDPA with
    `mask` ([N, H, L, S] or broadcast to it, SDPA's meaning) and the output projection."""
    query, key, value = inputs
    in_w, in_b, out_w, out_b = weights
    (first, second, dim), key_shape = shapes
    head_dim = dim // heads

    def rows(t: Any, i: int, count: int) -> Any:
        return None if t is None else emit(operator.getitem, t, slice(i * dim, (i + count) * dim))

    def parts(x: torch.fx.Node, i: int, count: int) -> list[torch.fx.Node]:
        packed = emit(
            F.linear,
            x,
            *((in_w, in_b) if count == 3 else (rows(in_w, i, count), rows(in_b, i, count))),
        )
        return [
            emit(operator.getitem, packed, (Ellipsis, slice(j * dim, (j + 1) * dim)))
            for j in range(count)
        ]

    if query is key is value:
        q, k, v = parts(query, 0, 3)
    elif key is value:
        (q,), (k, v) = parts(query, 0, 1), parts(key, 1, 2)
    else:
        (q,), (k,), (v,) = parts(query, 0, 1), parts(key, 1, 1), parts(value, 2, 1)

    def heads_of(part: torch.fx.Node, shape: tuple[int, int, int]) -> torch.fx.Node:
        length, batch = (shape[1], shape[0]) if batch_first else (shape[0], shape[1])
        if batch_first:  # [N, L, E] -> [N, H, L, D]
            part = emit("reshape", part, batch, length, heads, head_dim, method=True)
            return emit("transpose", part, 1, 2, method=True)
        part = emit("reshape", part, length, batch * heads, head_dim, method=True)
        part = emit("transpose", part, 0, 1, method=True)
        return emit("reshape", part, batch, heads, length, head_dim, method=True)

    out = emit(
        _SDPA,
        heads_of(q, shapes[0]),
        heads_of(k, key_shape),
        heads_of(v, key_shape),
        mask,
        0.0,
        is_causal,
    )
    out = emit("permute", out, *((0, 2, 1, 3) if batch_first else (2, 0, 1, 3)), method=True)
    out = emit("reshape", out, first * second, dim, method=True)
    out = emit(F.linear, out, out_w, out_b)
    return emit("reshape", out, first, second, dim, method=True)


def _broadcasts_to(shape: Any, full: tuple[int, ...]) -> bool:
    try:
        return torch.broadcast_shapes(tuple(shape), full) == full
    except RuntimeError:
        return False


def _static_3d(x: Any) -> tuple[int, int, int] | None:
    val = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 3:
        return None
    if not all(isinstance(d, int) for d in val.shape):
        return None
    return tuple(val.shape)  # type: ignore[return-value]


def _mha_mask(
    emit: Callable[..., torch.fx.Node], *masks: torch.fx.Node | None
) -> torch.fx.Node | None:
    """SDPA's mask for MHA's masks (boolean ones mask where True, float ones add; each 4-D or
    broadcast to it), combined as MHA adds them."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    flags = [m for m in present if m.meta["example_value"].dtype == torch.bool]
    if len(flags) == len(present):  # SDPA keeps where True
        masked = functools.reduce(lambda x, y: emit(torch.logical_or, x, y), flags)
        return emit(torch.logical_not, masked)
    floats = [m for m in present if m.meta["example_value"].dtype != torch.bool]
    added = functools.reduce(lambda x, y: emit(operator.add, x, y), floats)
    for flag in flags:
        added = emit(torch.where, flag, float("-inf"), added)
    return added


def _write_out_multi_head_attention(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``F.multi_head_attention_forward`` (``nn.MultiheadAttention``'s, which Dynamo keeps
    whole: torchvision's ViT, ``nn.Transformer``'s layers, DETR's) written out as it
    computes an attention whose weights are not read (``need_weights`` or not): the input
    projections, the heads, SDPA (with the attention mask or else the key padding mask, a
    boolean one inverted: MHA masks where SDPA keeps) and the output projection. Its SDPA then
    reaches :func:`route_attention`, where ``aot_autograd`` would have traced it into float32
    math. With both masks, the key padding mask masks too (as MHA adds them). Added key
    biases, separate projection weights and dropout stay."""
    try:
        call = _MHA_PARAMS.bind(*node.args, **node.kwargs)
    except TypeError:
        return False
    call.apply_defaults()
    a = call.arguments
    query, key, value, heads = a["query"], a["key"], a["value"], a["num_heads"]
    shape, key_shape = _static_3d(query), _static_3d(key)
    if (
        shape is None
        or key_shape is None
        or _static_3d(value) != key_shape
        or key_shape[1] != shape[1]
        or key_shape[2] != shape[2]
        or not isinstance(heads, int)
        or shape[2] % heads
        or not all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)
        or any(a[k] is not None for k in ("bias_k", "bias_v", "static_k", "static_v"))
        or a["add_zero_attn"]
        or a["use_separate_proj_weight"]
        or (a["training"] and a["dropout_p"] != 0)
        # is_causal needs the (causal) mask it then ignores; eager reports its absence.
        or (a["is_causal"] and a["attn_mask"] is None)
    ):
        return False
    fake = query.meta["example_value"]
    emit = _emitter(gm.graph, fake.fake_mode)
    batch, length, src = shape[1], shape[0], key_shape[0]
    padding = a["key_padding_mask"]
    # is_causal stands for the mask only without a padding mask (then MHA adds them).
    attn = None if a["is_causal"] and padding is None else a["attn_mask"]
    for m, shapes in (
        (padding, [(batch, src)]),
        (attn, [(length, src), (batch * heads, length, src)]),
    ):
        if m is None:
            continue
        m = m.meta.get("example_value") if isinstance(m, torch.fx.Node) else None
        if not isinstance(m, torch.Tensor) or (m.dtype != torch.bool and m.dtype != fake.dtype):
            return False
        if tuple(m.shape) not in shapes:
            return False
    weights = (a["in_proj_weight"], a["in_proj_bias"], a["out_proj_weight"], a["out_proj_bias"])
    with gm.graph.inserting_before(node):
        if padding is not None:  # [N, S] -> [N, 1, 1, S]
            padding = emit("reshape", padding, batch, 1, 1, src, method=True)
        if attn is not None and attn.meta["example_value"].dim() == 3:
            attn = emit("reshape", attn, batch, heads, length, src, method=True)
        mask = _mha_mask(emit, attn, padding)
        out = _multi_head_attention(
            emit,
            (query, key, value),
            (shape, key_shape),
            heads,
            weights,
            mask,
            bool(a["is_causal"]) and attn is None,
            False,
        )
    for user in list(node.users):
        user.replace_all_uses_with(out)
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)
    return True


def _write_out_encoder_layer(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``torch._transformer_encoder_layer_fwd``, ``nn.TransformerEncoderLayer``'s fast path in
    inference (batch first, an even head count: a fallback to eager PyTorch for the whole layer
    otherwise), written out: its self-attention as :func:`_write_out_multi_head_attention`'s,
    the layer norms and the feed-forward. Its mask is ``merge_masks``': the key padding mask
    ([N, S], mask type 1) or the attention mask with it added ([N, H, L, S] or broadcast to
    it); a float one additive (eager's fast path gives NaN for values other than 0 and -inf;
    this is the layer's slow path), a boolean one masking where True."""
    args = list(node.args) + [None] * (20 - len(node.args))
    (src, dim, heads, in_w, in_b, out_w, out_b, use_gelu, norm_first, eps) = args[:10]
    n1w, n1b, n2w, n2b, f1w, f1b, f2w, f2b, mask, mask_type = args[10:20]
    shape = _static_3d(src)
    if node.kwargs or shape is None or not isinstance(heads, int):
        return False
    if shape[2] != dim or dim % heads:
        return False
    fake = src.meta["example_value"]
    if mask is not None:
        m = mask.meta.get("example_value") if isinstance(mask, torch.fx.Node) else None
        if not isinstance(m, torch.Tensor) or m.dtype not in (torch.bool, fake.dtype):
            return False
        batch, length = shape[0], shape[1]
        padding = mask_type == 1 and tuple(m.shape) == (batch, length)
        if not padding and not _broadcasts_to(m.shape, (batch, heads, length, length)):
            return False
    emit = _emitter(gm.graph, fake.fake_mode)

    def norm(x: torch.fx.Node, w: Any, b: Any) -> torch.fx.Node:
        return emit(F.layer_norm, x, (dim,), w, b, eps)

    def attention(x: torch.fx.Node) -> torch.fx.Node:
        weights = (in_w, in_b, out_w, out_b)
        return _multi_head_attention(
            emit, (x, x, x), (shape, shape), heads, weights, mask, False, True
        )

    def feed_forward(x: torch.fx.Node) -> torch.fx.Node:
        hidden = emit(F.gelu if use_gelu else F.relu, emit(F.linear, x, f1w, f1b))
        return emit(F.linear, hidden, f2w, f2b)

    with gm.graph.inserting_before(node):
        if mask is not None and padding:  # [N, S] -> [N, 1, 1, S]
            mask = emit("reshape", mask, shape[0], 1, 1, shape[1], method=True)
        mask = _mha_mask(emit, mask)
        if norm_first:
            x = emit(operator.add, src, attention(norm(src, n1w, n1b)))
            out = emit(operator.add, x, feed_forward(norm(x, n2w, n2b)))
        else:
            x = norm(emit(operator.add, src, attention(src)), n1w, n1b)
            out = norm(emit(operator.add, x, feed_forward(x)), n2w, n2b)
    node.replace_all_uses_with(out)
    gm.graph.erase_node(node)
    return True


def route_attention(gm: torch.fx.GraphModule, training: bool = False) -> int:
    """Replace, in Dynamo's graph ``gm``, every SDPA call the FlexAttention kernel computes
    with ``torchneuron::attention`` or, when the graph may need gradients (:func:`needs_grad`),
    ``torchneuron::attention_fwd`` (whose backward is ``attention_bwd``, the FlexAttention
    backward kernel); returns how many. ``nn.MultiheadAttention``'s self-attention and
    ``nn.TransformerEncoderLayer``'s fast path are written out around their SDPA first."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is _MHA:
            _write_out_multi_head_attention(gm, node)
        elif node.op == "call_function" and node.target is _ENCODER_LAYER:
            _write_out_encoder_layer(gm, node)
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
        if not _unify_lengths(a["key"], a["value"]):
            continue  # lengths that differ: eager SDPA reports it
        mask = a["attn_mask"]
        if training and isinstance(mask, torch.fx.Node):
            m = mask.meta.get("example_value")
            if isinstance(m, torch.Tensor) and m.requires_grad:
                continue  # a learned additive mask: its gradient is not computed here
        scale = None if a["scale"] is None else float(a["scale"])
        node.target = ATTENTION_FWD if training else ATTENTION
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
        if training:  # the output is the first of (out, lse)
            with gm.graph.inserting_after(node):
                out = gm.graph.call_function(operator.getitem, (node, 0))
            node.replace_all_uses_with(out, delete_user_cb=functools.partial(operator.is_not, out))
            out.meta = dict(node.meta)
        routed += 1
    if routed:
        gm.recompile()
    return routed


# -- block classes ------------------------------------------------------------------------------


def causal_block_classes(q_len: int, kv_len: int, block: int | None = None) -> torch.Tensor:
    """``int8 [1, 1, query blocks, key blocks]`` of SDPA's causal mask ``q >= kv`` in blocks
    of ``block`` (default: the kernels' :func:`~torchneuron.attention_blocks.unit`): masked
    where every key of the block is after every query, full where none is."""
    size = unit() if block is None else block
    codes = block_classes()
    q_lo = torch.arange(0, q_len, size)
    kv_lo = torch.arange(0, kv_len, size)
    q_hi = torch.clamp(q_lo + size, max=q_len) - 1
    kv_hi = torch.clamp(kv_lo + size, max=kv_len) - 1
    full = q_lo[:, None] >= kv_hi[None, :]
    masked = q_hi[:, None] < kv_lo[None, :]
    classes = torch.where(full, codes.full, torch.where(masked, codes.masked, codes.partial))
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


def _kept(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An SDPA mask on the host, and where it lets a key through (``True``, or not ``-inf``)."""
    m = mask.detach().to("cpu")
    return m, m if m.dtype == torch.bool else m != float("-inf")


def mask_block_classes(mask: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """``int8 [B or 1, H or 1, query blocks or 1, key blocks or 1]`` of an SDPA mask (any
    rank up to 4, broadcast dimensions of size 1 stay 1) in blocks of ``block`` (default: the
    kernels' :func:`~torchneuron.attention_blocks.unit`): masked where no entry of the block
    lets a key through (``False``, or ``-inf`` in a float mask), full where every one does,
    partial otherwise."""
    size = unit() if block is None else block
    codes = block_classes()
    _, kept = _kept(mask)
    kept = kept.reshape((1,) * (4 - kept.dim()) + tuple(kept.shape))

    def reduce(fill: bool, fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        units = _units(_units(kept, 3, size, fill), 2, size, fill)
        return fn(fn(units, dim=5), dim=3)

    every = reduce(True, torch.all)
    some = reduce(False, torch.any)
    classes = torch.where(every, codes.full, torch.where(some, codes.partial, codes.masked))
    return classes.to(torch.int8).contiguous()


#: How a routed SDPA call applies its mask (:func:`mask_form`), by code.
MASK_FORMS = ("given", "finite", "causal")


def mask_form(mask: torch.Tensor, q_len: int, kv_len: int) -> int:
    """The :data:`MASK_FORMS` code of an SDPA mask for a call of these lengths, from its
    content: ``causal`` where every [b, h] slice keeps exactly ``q_idx >= kv_idx`` (a float
    mask 0 there: ``nn.Transformer.generate_square_subsequent_mask``), which the kernel computes
    instead of reading the mask; ``finite`` where a float mask holds only 0 and -inf, which
    then only masks (nothing to add: the boolean mask's cost); else ``given``."""
    m, kept = _kept(mask)
    if m.dtype != torch.bool and not bool(((m == 0) | ~kept).all()):
        return MASK_FORMS.index("given")
    if tuple(m.shape[-2:]) == (q_len, kv_len):
        causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
        if bool((kept == causal).all()):
            return MASK_FORMS.index("causal")
    return MASK_FORMS.index("given" if m.dtype == torch.bool else "finite")


def expand_block_classes(classes: torch.Tensor, q_len: int, kv_len: int) -> torch.Tensor:
    """:func:`mask_block_classes` of a mask broadcast along the query or key rows, for a call
    with these lengths: ``[B or 1, H or 1, query blocks, key blocks]``."""
    n_q, n_kv = -(-q_len // unit()), -(-kv_len // unit())
    return classes.expand(*classes.shape[:2], n_q, n_kv).contiguous()


# -- the FlexAttention form of a call -------------------------------------------------------------


@dataclass(frozen=True)
class FlexForm:
    """A ``torchneuron::attention`` call as a FlexAttention call: modifiers (ATen graphs
    taking the score (score_mod only), b, h, q_idx and kv_idx as 0-d tensors, then the
    captured tensors), the tensors they capture (graph nodes), the scale and block classes."""

    scale: float
    score_mod: torch.fx.GraphModule
    score_grad: torch.fx.GraphModule
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


def _identity_grad(score: Any, b: Any, h: Any, q: Any, kv: Any, grad: Any) -> torch.Tensor:
    return grad  # type: ignore[no-any-return]


def _identity_grad_with(
    score: Any, b: Any, h: Any, q: Any, kv: Any, grad: Any, mask: torch.Tensor
) -> torch.Tensor:
    return grad  # type: ignore[no-any-return]


def _add_mask(score: Any, b: Any, h: Any, q: Any, kv: Any, mask: torch.Tensor) -> torch.Tensor:
    return score + _lookup(mask, b, h, q, kv)  # type: ignore[no-any-return]


def flex_form(node: torch.fx.Node) -> FlexForm:
    """The FlexAttention form of a ``torchneuron::attention`` node (query or key lengths
    known at run time only: :func:`_generic_form`). Block classes: from ``meta[BLOCKS_META]``
    when the backend computed them from the mask's content, from the shape without a mask,
    else ``None`` (all partial: the mask_mod decides every entry)."""
    q, k, _, mask, is_causal, scale, _ = node.args[:7]
    assert isinstance(q, torch.fx.Node) and isinstance(k, torch.fx.Node)
    qv, kv, vv = q.meta["val"], k.meta["val"], node.args[2].meta["val"]  # type: ignore[union-attr]
    limit = head_dim_limit()
    for dim in (qv.shape[-1], vv.shape[-1]):
        if _static(dim) is None:
            raise NotSizeGeneric("not size-generic: attention with a head dim known at run time")
    if int(qv.shape[-1]) > limit or int(vv.shape[-1]) > limit:
        raise ValueError(f"head dims above {limit} are not supported by the kernel")
    q_len, kv_len = _static(qv.shape[-2]), _static(kv.shape[-2])
    score = torch.zeros((), dtype=qv.dtype)
    grad = torch.zeros((), dtype=torch.float32)
    blocks = node.meta.get(BLOCKS_META)
    # score_mod adds the mask at most: its gradient passes the score's through.
    identity_grad = _trace(_identity_grad, score, *_indices(), grad)
    if q_len is None or kv_len is None:
        return _generic_form(qv, kv, mask, bool(is_causal), scale, identity_grad)
    form = MASK_FORMS[node.meta.get(MASK_FORM_META, 0)]
    if form == "causal":  # the mask is not read
        mask, is_causal = None, True
    if mask is None:
        score_mod = _trace(_identity_score, score, *_indices())
        mask_mod = _trace(_causal_mask if is_causal else _noop_mask, *_indices())
        if blocks is None and is_causal:
            blocks = causal_block_classes(q_len, kv_len)
        elif blocks is None:
            n_q, n_kv = -(-q_len // unit()), -(-kv_len // unit())
            blocks = torch.full((1, 1, n_q, n_kv), block_classes().full, dtype=torch.int8)
        return FlexForm(_scale(scale, qv), score_mod, identity_grad, mask_mod, (), (), blocks)
    assert isinstance(mask, torch.fx.Node)
    mv = mask.meta["val"]
    example = torch.zeros(tuple(int(s) for s in mv.shape), dtype=mv.dtype)
    if mv.dtype == torch.bool or form == "finite":
        score_mod = _trace(_identity_score, score, *_indices())
        keeps = _bool_mask if mv.dtype == torch.bool else _finite_mask
        mask_mod = _trace(keeps, *_indices(), example)
        return FlexForm(_scale(scale, qv), score_mod, identity_grad, mask_mod, (), (mask,), blocks)
    score_mod = _trace(_add_mask, score, *_indices(), example)
    score_grad = _trace(_identity_grad_with, score, *_indices(), grad, example)
    mask_mod = _trace(_finite_mask, *_indices(), example)
    return FlexForm(_scale(scale, qv), score_mod, score_grad, mask_mod, (mask,), (mask,), blocks)


def _generic_form(
    qv: torch.Tensor,
    kv: torch.Tensor,
    mask: object,
    is_causal: bool,
    scale: object,
    identity_grad: torch.fx.GraphModule,
) -> FlexForm:
    """The FlexAttention form of a call whose query or key length is known at run time only
    (one program for every length, issue #16): one block class for every block, ``full``
    without a mask, ``partial`` with the causal mask (the kernel bounds each query tile's keys
    by the diagonal). A mask tensor over a dynamic length has no block classes known when the
    program is compiled: :class:`~torchneuron.sizes.NotSizeGeneric` (compiled per size)."""
    if mask is not None:
        raise NotSizeGeneric(
            "not size-generic: an SDPA attn_mask tensor with a query or key length known at "
            "run time (its block classes depend on its content)"
        )
    if is_causal and not _same(qv.shape[-2], kv.shape[-2]):
        raise NotSizeGeneric(
            "not size-generic: is_causal with query and key lengths that may differ "
            f"({qv.shape[-2]} and {kv.shape[-2]})"
        )
    codes = block_classes()
    blocks = torch.full((1, 1, 1, 1), codes.partial if is_causal else codes.full, dtype=torch.int8)
    score = torch.zeros((), dtype=qv.dtype)
    score_mod = _trace(_identity_score, score, *_indices())
    mask_mod = _trace(_causal_mask if is_causal else _noop_mask, *_indices())
    return FlexForm(_scale(scale, qv), score_mod, identity_grad, mask_mod, (), (), blocks)


def _scale(scale: object, query: torch.Tensor) -> float:
    if scale is None:
        return 1.0 / float(int(query.shape[-1])) ** 0.5
    assert isinstance(scale, (int, float))
    return float(scale)
