"""The decomposition table the backend hands to ``aot_autograd``.

Core ATen keeps some composite ops whole (layer/group/batch norm, softmax). The ``neuron``
dialect has no such ops: it has their building blocks (reductions, ``var_mean``, elementwise
math, matmul), so these composites are decomposed in Python, where PyTorch already knows how,
instead of in the importer. Everything else follows ``core_aten_decompositions()``.

Kept whole on purpose (not decomposed):

- ``aten.var_mean.correction``: one VectorE pass (``bn_stats``/``bn_aggr``) gives both results.
- ``aten.gelu``, ``aten.sigmoid``, ``aten.tanh``: single ScalarE activation functions.
- ``aten.embedding``, ``aten.addmm``, ``aten.avg_pool2d``, ``aten.max_pool2d_with_indices``:
  core ops the importer lowers directly (gather, matmul + bias, pooling windows).

Training graphs (:data:`TRAINING_DECOMPOSITIONS`): backward ops that torch keeps whole, or
decomposes into scatters and gathers by index, become device math here:

- convolution backward (1-d as 2-d of unit height, grouped, depthwise, transposed):
  ``grad_weight`` is a matmul of the output gradient with the input's patches (im2col, as the
  forward; batched over groups); ``grad_input`` is the weights' transpose times the gradient,
  summed back onto the input's positions window by window (col2im). Depthwise convolutions
  use VectorE multiply-accumulates per tap instead, as their forward does;
- transposed convolution (forward, in every graph): the input gradient of the ordinary
  convolution it is the adjoint of, col2im(weight^T x x);
- ``_weight_norm_interface_backward`` (weight norm's backward): reductions and elementwise math;
- pooling backward: each window position's share of the gradient, summed back the same way
  (max pooling recomputes which element was each window's first maximum, as PyTorch's CPU kernel
  picks it, so ``max_pool2d_with_indices`` needs no indices on the device);
- ``slice_scatter`` (a sliced view's backward): a concat of the untouched parts and the slice;
- ``embedding_dense_backward`` and ``index_put`` with ``accumulate`` (index_select's
  backward): one-hot(indices)^T @ grad, a TensorE matmul instead of a scatter-add;
- ``gather`` / ``scatter`` / ``scatter_add`` along a dim (cross-entropy's ``nll_loss`` and its
  backward, gather's and topk's backward): compares with an iota (one-hot), then a select and
  a sum.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence

import torch
import torch._refs
import torch.nn.functional as F

__all__ = [
    "EXTRA_DECOMPOSITIONS",
    "TRAINING_DECOMPOSITIONS",
    "math_attention",
    "neuron_decompositions",
]

_aten = torch.ops.aten

# Each entry: (op, why it is decomposed). Some are already in core_aten_decompositions();
# they are listed so the table does not depend on what a given torch release puts there.
EXTRA_DECOMPOSITIONS: tuple[tuple[torch._ops.OpOverloadPacket, str], ...] = (
    (_aten.native_layer_norm, "var_mean + rsqrt + affine: norm building blocks"),
    (_aten.native_group_norm, "reshape + var_mean + affine: norm building blocks"),
    (_aten._native_batch_norm_legit_no_training, "eval batch norm is elementwise"),
    (_aten._native_batch_norm_legit_functional, "training batch norm: reductions + math"),
    (_aten._native_batch_norm_legit, "training batch norm: reductions + math"),
    (_aten.native_batch_norm, "training batch norm: reductions + math"),
    (_aten._softmax, "amax/sub/exp/sum/div: the device's softmax building blocks"),
    (_aten._log_softmax, "amax/sub/exp/sum/log: the device's softmax building blocks"),
    (_aten.silu, "x * sigmoid(x)"),
    (_aten.hardswish, "clamp + mul"),
    (_aten.hardsigmoid, "clamp + mul"),
    (_aten.mish, "x * tanh(softplus(x))"),
    (_aten.addcmul, "elementwise mul + add"),
    (_aten.addcdiv, "elementwise div + add"),
    (_aten.lerp, "elementwise sub/mul/add"),
    (_aten.linalg_vector_norm, "abs/pow + sum + root (weight norm's norms)"),
    (_aten.native_dropout, "rand_like > p, then masks: the device's rand (see rng.py)"),
    # The CPU SDPA kernel, should a graph name it directly: torch's decomposition goes through
    # the math path. Graphs traced by the backend never contain it (see math_attention).
    (_aten._scaled_dot_product_flash_attention_for_cpu, "matmul + softmax + matmul"),
)


# -- training: backward ops as device math -------------------------------------------------

Pair = tuple[int, int]


def _pair(value: Sequence[int] | int | None, default: Pair) -> Pair:
    values = [value] if isinstance(value, int) else list(value or [])
    if not values:
        return default
    return (values[0], values[-1])


def _window(
    x: torch.Tensor, i: int, j: int, stride: Pair, dilation: Pair, out: Pair
) -> torch.Tensor:
    """``x[..., Ho, Wo]`` read by kernel position ``(i, j)`` of every window."""
    h0, w0 = i * dilation[0], j * dilation[1]
    return x[
        ...,
        h0 : h0 + stride[0] * (out[0] - 1) + 1 : stride[0],
        w0 : w0 + stride[1] * (out[1] - 1) + 1 : stride[1],
    ]


def _place(
    part: torch.Tensor, i: int, j: int, stride: Pair, dilation: Pair, padded: Pair
) -> torch.Tensor:
    """Inverse of :func:`_window`: ``part[..., Ho, Wo]`` at the positions kernel position
    ``(i, j)`` reads in a ``[..., Hp, Wp]`` input, zeros elsewhere (zero insertion by
    pad + reshape, then a pad to the window's offset)."""
    ho, wo = part.shape[-2:]
    if stride[1] > 1:
        part = F.pad(part.unsqueeze(-1), (0, stride[1] - 1)).flatten(-2)
        part = part[..., : (wo - 1) * stride[1] + 1]
    if stride[0] > 1:
        part = F.pad(part.unsqueeze(-2), (0, 0, 0, stride[0] - 1)).flatten(-3, -2)
        part = part[..., : (ho - 1) * stride[0] + 1, :]
    h0, w0 = i * dilation[0], j * dilation[1]
    h, w = part.shape[-2:]
    return F.pad(part, (w0, padded[1] - w0 - w, h0, padded[0] - h0 - h))


def _windows_fit(
    size: Pair, padding: Pair, kernel: Pair, stride: Pair, dilation: Pair, out: Pair
) -> bool:
    """Whether every window lies inside the padded input (not so for some ceil_mode shapes)."""
    return all(
        (out[d] - 1) * stride[d] + (kernel[d] - 1) * dilation[d] + 1 <= size[d] + 2 * padding[d]
        for d in range(2)
    )


def _accumulation_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else t.dtype


def _sum_back(
    parts: Sequence[tuple[int, int, torch.Tensor]],
    stride: Pair,
    dilation: Pair,
    size: Pair,
    padding: Pair,
    dtype: torch.dtype,
) -> torch.Tensor:
    """col2im: every kernel position's ``[..., Ho, Wo]`` share summed onto the input's
    positions (in fp32 for 16-bit types), the padding cropped."""
    padded = (size[0] + 2 * padding[0], size[1] + 2 * padding[1])
    total: torch.Tensor | None = None
    for i, j, part in parts:
        placed = _place(part.to(_accumulation_dtype(part)), i, j, stride, dilation, padded)
        total = placed if total is None else total + placed
    assert total is not None
    cropped = total[..., padding[0] : padding[0] + size[0], padding[1] : padding[1] + size[1]]
    return cropped.to(dtype)


def _conv_params(
    x: torch.Tensor, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]
) -> tuple[Pair, Pair, Pair]:
    """Stride, padding and dilation as (height, width); a 1-d convolution (``x`` of rank 3)
    is a 2-d one of unit height, as the importer runs it."""

    def param(v: Sequence[int], unit: int) -> Pair:
        p = _pair(v, (unit, unit))
        return (unit, p[1]) if x.dim() == 3 else p

    return param(stride, 1), param(padding, 0), param(dilation, 1)


def _input_grad(
    g: torch.Tensor,
    weight: torch.Tensor,
    size: Pair,
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    groups: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """col2im(weight^T x g) of a 2-d convolution: ``g`` is ``[N, O, Ho, Wo]``, ``weight``
    ``[O, C/G, kh, kw]``, the result ``[N, C, *size]``. Grouped: one matmul batched over the
    groups. Depthwise (one input channel per group): each tap's share is the gradient times
    the tap's per-channel weight, elementwise on VectorE (a matmul would contract one row)."""
    n, o, ho, wo = g.shape
    cg, kh, kw = weight.shape[1:]
    c = cg * groups
    if groups > 1 and cg == 1:
        acc = _accumulation_dtype(g)
        gm = g.to(acc).reshape(n, c, o // c, ho, wo)
        wm = weight.to(acc).reshape(1, c, o // c, kh * kw, 1, 1)
        parts = [
            (i, j, (gm * wm[:, :, :, i * kw + j]).sum(2)) for i in range(kh) for j in range(kw)
        ]
        return _sum_back(parts, stride, dilation, size, padding, dtype)
    og, ckk = o // groups, cg * kh * kw
    wt = weight.reshape(groups, og, ckk).transpose(1, 2)
    cols = torch.matmul(wt, g.reshape(n, groups, og, ho * wo))
    cols = cols.reshape(n, c, kh, kw, ho, wo)
    parts = [(i, j, cols[:, :, i, j]) for i in range(kh) for j in range(kw)]
    return _sum_back(parts, stride, dilation, size, padding, dtype)


def _weight_grad(
    g: torch.Tensor,
    x: torch.Tensor,
    kernel: Pair,
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    groups: int,
) -> torch.Tensor:
    """``[O, C/G, kh, kw]``: g x patches(x)^T summed over images (im2col, as the forward),
    batched over groups; depthwise: per tap, the gradient times the window, summed (VectorE
    multiply and reduce; the contraction has no channel dim for TensorE)."""
    n, o, ho, wo = g.shape
    c = x.shape[1]
    kh, kw = kernel
    xp = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
    if groups > 1 and groups == c:
        acc = _accumulation_dtype(g)
        m = o // c
        xe = xp.to(acc).unsqueeze(2).expand(-1, -1, m, -1, -1).reshape(n, o, *xp.shape[2:])
        ge = g.to(acc)
        taps = [
            (ge * _window(xe, i, j, stride, dilation, (ho, wo))).sum((0, 2, 3))
            for i in range(kh)
            for j in range(kw)
        ]
        return torch.stack(taps, dim=1).reshape(o, 1, kh, kw).to(x.dtype)
    windows = [
        _window(xp, i, j, stride, dilation, (ho, wo)).unsqueeze(2)
        for i in range(kh)
        for j in range(kw)
    ]
    ckk = (c // groups) * kh * kw
    # Images and positions form one contraction, summed in PSUM's fp32 and rounded once.
    patches = torch.cat(windows, dim=2).reshape(n, groups, ckk, ho * wo)
    patches = patches.permute(1, 0, 3, 2).reshape(groups, n * ho * wo, ckk)
    gm = g.reshape(n, groups, o // groups, ho * wo).permute(1, 2, 0, 3)
    gm = gm.reshape(groups, o // groups, n * ho * wo)
    return torch.matmul(gm, patches).reshape(o, c // groups, kh, kw)


def convolution_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Sequence[int] | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
) -> object:
    """1-d (as 2-d of unit height) and 2-d, grouped or depthwise, ordinary or transposed:
    ``grad_weight`` = grad x patches^T (im2col), ``grad_input`` = col2im(weight^T x grad),
    ``grad_bias`` = grad summed. A transposed convolution is the adjoint of an ordinary one,
    so its roles swap: ``grad_input`` is the ordinary convolution of ``grad``, and
    ``grad_weight`` the ordinary weight gradient with ``x`` as the output gradient."""
    if x.dim() not in (3, 4) or weight.dim() != x.dim():
        return NotImplemented
    s, p, d = _conv_params(x, stride, padding, dilation)
    one_d = x.dim() == 3
    if one_d:
        grad, x, weight = grad.unsqueeze(2), x.unsqueeze(2), weight.unsqueeze(2)
    kernel: Pair = (weight.shape[2], weight.shape[3])
    # The ordinary convolution's input and output sides.
    inner, outer = (grad, x) if transposed else (x, grad)
    size: Pair = (inner.shape[2], inner.shape[3])
    if not _windows_fit(size, p, kernel, s, d, (outer.shape[2], outer.shape[3])):
        return NotImplemented
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if transposed:
            grad_input = F.conv2d(grad, weight, None, s, p, d, groups)
        else:
            grad_input = _input_grad(grad, weight, size, s, p, d, groups, x.dtype)
        grad_input = grad_input.squeeze(2) if one_d else grad_input
    if output_mask[1]:
        grad_weight = _weight_grad(outer, inner, kernel, s, p, d, groups)
        grad_weight = grad_weight.squeeze(2) if one_d else grad_weight
    if output_mask[2]:
        grad_bias = grad.sum((0, 2, 3))
    return grad_input, grad_weight, grad_bias


def transposed_convolution(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> object:
    """A transposed convolution is the input gradient of an ordinary one (its adjoint):
    col2im(weight^T x x) on TensorE, as :func:`convolution_backward` computes it; ordinary
    convolutions are the importer's."""
    if not transposed or x.dim() not in (3, 4) or weight.dim() != x.dim():
        return NotImplemented
    s, p, d = _conv_params(x, stride, padding, dilation)
    op = _conv_params(x, output_padding, output_padding, output_padding)[1]
    one_d = x.dim() == 3
    if one_d:
        x, weight = x.unsqueeze(2), weight.unsqueeze(2)
    kernel: Pair = (weight.shape[2], weight.shape[3])
    inner: Pair = (x.shape[2], x.shape[3])
    size = tuple(
        (inner[k] - 1) * s[k] - 2 * p[k] + d[k] * (kernel[k] - 1) + op[k] + 1 for k in range(2)
    )
    if any(op[k] >= max(s[k], d[k]) for k in range(2)):
        return NotImplemented
    # weight [C_in, C_out/G, kh, kw] is the ordinary convolution's [O, C/G, kh, kw].
    y = _input_grad(x, weight, (size[0], size[1]), s, p, d, groups, x.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype).reshape(1, -1, 1, 1)
    return y.squeeze(2) if one_d else y


def avg_pool2d_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> object:
    """Each window's gradient / divisor, summed back onto the input (col2im)."""
    k = _pair(kernel_size, (1, 1))
    s, p = _pair(stride, k), _pair(padding, (0, 0))
    size: Pair = (x.shape[-2], x.shape[-1])
    out: Pair = (grad.shape[-2], grad.shape[-1])
    if not _windows_fit(size, p, k, s, (1, 1), out):
        return NotImplemented
    if divisor_override is None and not count_include_pad and p != (0, 0):
        return NotImplemented  # windows of different sizes divide differently
    divisor = divisor_override or k[0] * k[1]
    g = grad.to(_accumulation_dtype(grad)) * (1.0 / divisor)
    parts = [(i, j, g) for i in range(k[0]) for j in range(k[1])]
    return _sum_back(parts, s, (1, 1), size, p, x.dtype)


def max_pool2d_with_indices_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
    indices: torch.Tensor,
) -> object:
    """The gradient goes to each window's first maximum in row-major order (the element
    PyTorch's CPU kernel records as the index), recomputed from ``x`` instead of read from
    ``indices``."""
    del indices
    k = _pair(kernel_size, (1, 1))
    s, p, d = _pair(stride, k), _pair(padding, (0, 0)), _pair(dilation, (1, 1))
    size: Pair = (x.shape[-2], x.shape[-1])
    out: Pair = (grad.shape[-2], grad.shape[-1])
    if not _windows_fit(size, p, k, s, d, out):
        return NotImplemented
    xp = F.pad(x, (p[1], p[1], p[0], p[0]), value=-math.inf) if p != (0, 0) else x
    positions = [(i, j) for i in range(k[0]) for j in range(k[1])]
    windows = [_window(xp, i, j, s, d, out) for i, j in positions]
    best = windows[0]
    for win in windows[1:]:
        best = torch.maximum(best, win)
    taken: torch.Tensor | None = None
    parts = []
    for (i, j), win in zip(positions, windows, strict=True):
        hit = win == best
        if taken is not None:
            hit = hit & ~taken
            taken = taken | hit
        else:
            taken = hit
        parts.append((i, j, torch.where(hit, grad, 0.0)))
    return _sum_back(parts, s, d, size, p, x.dtype)


def embedding_dense_backward(
    grad: torch.Tensor,
    indices: torch.Tensor,
    num_weights: int,
    padding_idx: int,
    scale_grad_by_freq: bool,
) -> object:
    """one_hot(indices)^T @ grad: a matmul on TensorE instead of a scatter-add (0/1 times
    the gradient is exact in any dtype; PSUM accumulates in fp32, one rounding at the end).
    The one-hot is a [tokens, vocab] tensor in HBM and the matmul costs as much as an output
    projection onto the vocabulary: right for small vocabularies; large ones want a DMA
    scatter-add (``dma_compute``), which the device does not model yet."""
    if scale_grad_by_freq:
        return NotImplemented
    flat = indices.reshape(-1)
    hit = flat.unsqueeze(1) == torch.arange(num_weights, device=flat.device)
    if padding_idx >= 0:
        hit = hit & (flat != padding_idx).unsqueeze(1)
    g = grad.reshape(flat.numel(), -1)
    return torch.matmul(hit.to(g.dtype).t(), g).reshape(num_weights, *grad.shape[indices.dim() :])


def index_put(
    t: torch.Tensor,
    indices: Sequence[torch.Tensor | None],
    values: torch.Tensor,
    accumulate: bool = False,
) -> object:
    """``t[..., index] += values`` with one index tensor on dim ``d`` after ``d`` whole dims
    (index_select's backward; ``index_add``, which core ATen turns into this, on any dim):
    one-hot(index)^T @ values, like the embedding gradient, with dim ``d`` moved first.
    Without ``accumulate`` repeated indices leave the winner unspecified, so that form stays
    eager."""
    if not accumulate or not indices:
        return NotImplemented
    if t.dim() == 0:  # a 0-d tensor indexed by [0]s: a one-row table
        added = index_put(t.reshape(1), indices, values.reshape(-1), accumulate)
        return NotImplemented if added is NotImplemented else added.reshape(())  # type: ignore[union-attr]
    dim = len(indices) - 1
    index = indices[dim]
    if index is None or any(i is not None for i in indices[:dim]) or index.dtype == torch.bool:
        return NotImplemented
    if index.dim() != 1 and dim != 0:
        return NotImplemented
    # values broadcast to the indexed result, as index_put allows
    expected = (*t.shape[:dim], *index.shape, *t.shape[dim + 1 :])
    try:
        if torch.broadcast_shapes(values.shape, expected) != expected:
            return NotImplemented
    except RuntimeError:
        return NotImplemented
    values = values.expand(expected)
    if index.dim() != 1:
        index, values = index.reshape(-1), values.reshape(index.numel(), *t.shape[1:])
    x, src = t.movedim(dim, 0), values.movedim(dim, 0)
    hit = index.unsqueeze(1) == torch.arange(x.shape[0], device=t.device)
    rows = src.reshape(index.numel(), -1)
    added = torch.matmul(hit.to(rows.dtype).t(), rows).reshape(x.shape)
    return (x + added.to(t.dtype)).movedim(0, dim)


def _along_last(t: torch.Tensor, index: torch.Tensor, dim: int) -> bool:
    """Whether ``index`` matches ``t`` in every dim but ``dim`` (the one-hot forms need it)."""
    return (
        t.dim() == index.dim()
        and t.dim() > 0
        and all(
            a == b for k, (a, b) in enumerate(zip(t.shape, index.shape, strict=True)) if k != dim
        )
    )


def gather(t: torch.Tensor, dim: int, index: torch.Tensor, sparse_grad: bool = False) -> object:
    """Compare with an iota (one-hot), select and sum: ``t[..., index[..., k]]`` (integer
    tables too: the one nonzero term of each sum is exact in the engines' fp32 below 2**24).
    For the few columns models gather from (top-k weights, token types) the one-hot pass is
    cheaper than an indirect DMA per element."""
    dim = dim % max(t.dim(), 1)
    if t.dtype == torch.bool or not _along_last(t, index, dim):
        return NotImplemented
    x, idx = t.movedim(dim, -1), index.movedim(dim, -1)
    hit = idx.unsqueeze(-1) == torch.arange(x.shape[-1], device=t.device)
    picked = torch.where(hit, x.unsqueeze(-2), 0).sum(-1, dtype=t.dtype)
    return picked.movedim(-1, dim)


def _scatter(t: torch.Tensor, dim: int, index: torch.Tensor, value: torch.Tensor | float) -> object:
    dim = dim % max(t.dim(), 1)
    if not _along_last(t, index, dim):
        return NotImplemented
    if isinstance(value, torch.Tensor) and value.shape != index.shape:
        return NotImplemented
    x, idx = t.movedim(dim, -1), index.movedim(dim, -1)
    hits = idx.unsqueeze(-1) == torch.arange(x.shape[-1], device=t.device)
    hit = hits.any(-2)
    if not isinstance(value, torch.Tensor):
        return torch.where(hit, value, x).movedim(-1, dim)
    src = value.movedim(dim, -1)
    if src.shape[-1] == 1:
        return torch.where(hit, src, x).movedim(-1, dim)
    # Several sources per row (topk's backward): where two point at one element, the last
    # one wins, as on CPU, which writes them in order. Source k is kept where it is the last
    # hit: its number k equals the largest one hitting the element.
    k = torch.arange(src.shape[-1], device=t.device).unsqueeze(-1)
    numbered = torch.where(hits, k, -1)
    last = numbered == numbered.amax(-2, keepdim=True)
    picked = torch.where(hits & last, src.unsqueeze(-1), 0).sum(-2, dtype=src.dtype)
    return torch.where(hit, picked, x).movedim(-1, dim)


def scatter_value(t: torch.Tensor, dim: int, index: torch.Tensor, value: float) -> object:
    """``t`` with ``value`` where some ``index[..., k]`` points (cross-entropy's backward)."""
    return _scatter(t, dim, index, value)


def scatter_src(t: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> object:
    """``t`` with ``src[..., k]`` at ``index[..., k]`` (the last ``k`` where several hit)."""
    return _scatter(t, dim, index, src)


def scatter_add(t: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> object:
    """``t`` plus every ``src[..., k]`` at ``index[..., k]`` (gather's backward): one-hot
    times the sources, summed over ``k``."""
    dim = dim % max(t.dim(), 1)
    if not t.is_floating_point() or not _along_last(t, index, dim) or src.shape != index.shape:
        return NotImplemented
    x, idx, values = t.movedim(dim, -1), index.movedim(dim, -1), src.movedim(dim, -1)
    hit = idx.unsqueeze(-1) == torch.arange(x.shape[-1], device=t.device)
    added = torch.where(hit, values.unsqueeze(-1), 0.0).sum(-2)
    return (x + added.to(x.dtype)).movedim(-1, dim)


def slice_scatter(
    t: torch.Tensor,
    src: torch.Tensor,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> object:
    """``t`` with ``src`` in a contiguous slice (a sliced view's backward): a concat."""
    dim = dim % max(t.dim(), 1)
    size = t.shape[dim]
    lo = 0 if start is None else (start + size if start < 0 else start)
    lo = min(max(lo, 0), size)
    if step != 1 or t.dim() == 0:
        return NotImplemented
    hi = lo + src.shape[dim]
    pieces = [t.narrow(dim, 0, lo), src.to(t.dtype), t.narrow(dim, hi, size - hi)]
    return torch.cat([piece for piece in pieces if piece.shape[dim] > 0], dim=dim)


def weight_norm_backward(
    grad_w: torch.Tensor,
    saved_v: torch.Tensor,
    saved_g: torch.Tensor,
    saved_norms: torch.Tensor,
    dim: int,
) -> object:
    """``w = g * v / |v|`` (norms over every dim but ``dim``, kept): ``grad_g = sum(grad_w *
    v) / |v|`` and ``grad_v = g / |v| * (grad_w - v * grad_g / |v|)``, reductions and
    elementwise math in fp32 as PyTorch's kernel computes them."""
    acc = _accumulation_dtype(saved_v)
    dims = [k for k in range(saved_v.dim()) if k != dim % max(saved_v.dim(), 1)]
    gw, v, g = grad_w.to(acc), saved_v.to(acc), saved_g.to(acc)
    norms = saved_norms.to(acc)
    grad_g = (gw * v).sum(dims, keepdim=True) / norms
    grad_v = g / norms * (gw - v * (grad_g / norms))
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype)


def whole_max(t: torch.Tensor) -> object:
    """``t.max()`` (every element): ``amax`` over all dims."""
    return torch.amax(t, dim=list(range(t.dim()))) if t.dim() else t.clone()


def whole_min(t: torch.Tensor) -> object:
    """``t.min()`` (every element): ``amin`` over all dims."""
    return torch.amin(t, dim=list(range(t.dim()))) if t.dim() else t.clone()


#: Rows that reduce side by side: the engines' partitions. Reduced over every dim at once, a
#: tensor is one row on one partition: a 2 MiB loss mean kept one VectorE lane busy for 1 ms.
_PARALLEL_ROWS = 128


def _as_rows(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` as ``_PARALLEL_ROWS`` rows, when it is large enough to gain from it."""
    n = t.numel()
    if not t.is_floating_point() or n % _PARALLEL_ROWS or n < _PARALLEL_ROWS * _PARALLEL_ROWS:
        return None
    return t.reshape(_PARALLEL_ROWS, -1)


def _whole_sum(t: torch.Tensor, dtype: torch.dtype | None, mean: bool) -> object:
    """``t.sum()`` (or ``t.mean()``): a sum per row on every partition, then the sum of the row
    sums, accumulated in float32 and rounded once, as PyTorch's CPU kernel does for 16-bit
    inputs."""
    rows = _as_rows(t)
    if rows is None or (dtype is not None and dtype != t.dtype):
        return NotImplemented
    total = rows.sum(1, dtype=_accumulation_dtype(t)).sum()
    return (total / t.numel() if mean else total).to(t.dtype)


def _every_dim(t: torch.Tensor, dim: Sequence[int] | None) -> bool:
    return not dim or sorted(d % max(t.dim(), 1) for d in dim) == list(range(t.dim()))


def _whole_reduction(mean: bool) -> tuple[Callable[..., object], Callable[..., object]]:
    """The decompositions of ``sum``/``mean`` over every element, and over a list of dims
    (how eager ``x.sum()`` arrives), which apply when that list covers every dim."""

    def whole(t: torch.Tensor, *, dtype: torch.dtype | None = None) -> object:
        return _whole_sum(t, dtype, mean)

    def over_dims(
        t: torch.Tensor,
        dim: Sequence[int] | None,
        keepdim: bool = False,
        *,
        dtype: torch.dtype | None = None,
    ) -> object:
        if not _every_dim(t, dim):
            return NotImplemented
        total = _whole_sum(t, dtype, mean)
        if total is NotImplemented or not keepdim:
            return total
        return total.reshape([1] * t.dim())  # type: ignore[attr-defined]

    return whole, over_dims


whole_sum, sum_dims = _whole_reduction(mean=False)
whole_mean, mean_dims = _whole_reduction(mean=True)


def native_layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> object:
    """``layer_norm`` as torch's reference computes it (16-bit inputs in float32, ``var_mean``,
    the result rounded once), with the weight applied before ``1/std``:
    ``(x - mean) * w`` and ``t * rstd + b`` are then each one engine instruction with a per-row
    scalar (``scalar_tensor_tensor``), where ``((x - mean) * rstd) * w + b`` takes three."""
    if x.is_complex() or len(normalized_shape) < 1:  # torch's reference says what is wrong
        return torch._refs.native_layer_norm(x, normalized_shape, weight, bias, eps)
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    acc = x.to(_accumulation_dtype(x))
    var, mean = torch.var_mean(acc, dim=dims, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = acc - mean
    if weight is not None:
        out = out * weight
    out = out * rstd
    if bias is not None:
        out = out + bias
    if x.device.type in ("cpu", "mtia"):  # as torch's reference: its CPU kernel's dtypes
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    return out.to(x.dtype), mean, rstd


def native_layer_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    output_mask: Sequence[bool],
) -> object:
    """torch's decomposition of ``layer_norm``'s backward, ordered for the device: the input
    gradient first, rounded to its dtype before the column sums (the fusion pass groups ops in
    program order, so the whole per-row chain is one group), and the bias gradient summed from
    the 16-bit gradient itself (TensorE multiplies by ones exactly and accumulates in fp32, as
    eager's sum of the float32 copy does) instead of a float32 copy written to HBM."""
    axis = x.dim() - len(normalized_shape)
    inner = list(range(axis, x.dim()))
    outer = list(range(axis))
    n = math.prod(x.shape[axis:])
    if n == 0 or math.prod(x.shape[:axis]) == 0 or not outer:  # no rows to sum over
        from torch._decomp import decompositions

        return decompositions.native_layer_norm_backward(
            grad, x, normalized_shape, mean, rstd, weight, bias, output_mask
        )
    acc = _accumulation_dtype(x)
    g, xf = grad.to(acc), x.to(acc)
    # The saved statistics with a 1 for every normalized dim, as torch's decomposition has them.
    mean = mean.reshape(mean.shape + (1,) * (x.dim() - mean.dim()))
    rstd = rstd.reshape(rstd.shape + (1,) * (x.dim() - rstd.dim()))
    x_hat = (xf - mean) * rstd
    grad_x_hat = g * weight.to(acc) if weight is not None else g
    d_input = None
    if output_mask[0]:
        b = torch.sum(grad_x_hat, inner, True)
        c = torch.sum(grad_x_hat * x_hat, inner, True)
        d_input = ((rstd / n) * (grad_x_hat * n - b - x_hat * c)).to(x.dtype)
    d_weight = d_bias = None
    if output_mask[1] and weight is not None:
        d_weight = torch.sum(g * x_hat, outer).to(weight.dtype)
    if output_mask[2] and bias is not None:
        same = grad.dtype == bias.dtype
        d_bias = torch.sum(grad if same else g, outer).to(bias.dtype)
    return d_input, d_weight, d_bias


#: Reductions of a whole tensor, which the importer knows as reductions over every dim.
WHOLE_REDUCTIONS: dict[torch._ops.OpOverload, Callable[..., object]] = {
    _aten.max.default: whole_max,
    _aten.min.default: whole_min,
    _aten.sum.default: whole_sum,
    _aten.mean.default: whole_mean,
    _aten.sum.dim_IntList: sum_dims,
    _aten.mean.dim: mean_dims,
}


#: Backward (and index) ops lowered as device math; each returns ``NotImplemented`` for
#: argument combinations it does not cover, which then stay eager and are counted.
TRAINING_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., object]] = {
    _aten.convolution_backward.default: convolution_backward,
    _aten.convolution.default: transposed_convolution,
    _aten._weight_norm_interface_backward.default: weight_norm_backward,
    _aten.avg_pool2d_backward.default: avg_pool2d_backward,
    _aten.max_pool2d_with_indices_backward.default: max_pool2d_with_indices_backward,
    _aten.embedding_dense_backward.default: embedding_dense_backward,
    _aten.index_put.default: index_put,
    _aten.gather.default: gather,
    _aten.scatter.value: scatter_value,
    _aten.scatter.src: scatter_src,
    _aten.scatter_add.default: scatter_add,
    _aten.slice_scatter.default: slice_scatter,
}


def math_attention() -> contextlib.AbstractContextManager[None]:
    """Context for tracing with ``aot_autograd``: SDPA takes its math path (matmul + softmax +
    matmul, with ``attn_mask``, ``is_causal`` and GQA) *before* autograd.

    On CPU the composite SDPA kernel otherwise picks
    ``_scaled_dot_product_flash_attention_for_cpu``. In a training graph that op is
    differentiated first and decomposed after, so the backward's
    ``_scaled_dot_product_flash_attention_for_cpu_backward`` reads the decomposition's
    attention weights as the flash kernel's logsumexp: wrong gradients. A decomposition-table
    entry for ``aten.scaled_dot_product_attention`` cannot fix this: composite ops decompose in
    C++ before the table is consulted. The backend choice can.

    The SDPA calls the FlexAttention kernels take are no longer SDPA when this applies
    (:mod:`torchneuron.sdpa`): the math path is for the calls they do not take.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


@functools.cache
def neuron_decompositions() -> dict[torch._ops.OperatorBase, Callable[..., object]]:
    """Core ATen decompositions plus :data:`EXTRA_DECOMPOSITIONS` (built once, then cached)."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table: dict[torch._ops.OperatorBase, Callable[..., object]] = dict(core_aten_decompositions())
    table.update(get_decompositions([op for op, _ in EXTRA_DECOMPOSITIONS]))
    table.update(TRAINING_DECOMPOSITIONS)
    table.update(WHOLE_REDUCTIONS)
    table[_aten.native_layer_norm.default] = native_layer_norm
    table[_aten.native_layer_norm_backward.default] = native_layer_norm_backward
    missing = [
        str(op)
        for op, _ in EXTRA_DECOMPOSITIONS
        if not any(getattr(op, name) in table for name in op.overloads())  # type: ignore[no-untyped-call]
    ]
    if missing:
        raise RuntimeError(f"torch has no decomposition for {missing}; update decompositions.py")
    return table
