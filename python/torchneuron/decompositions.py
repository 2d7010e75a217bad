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
  backward): one-hot(indices)^T @ grad, a TensorE matmul instead of a scatter-add; without
  ``accumulate``, a row maximum finds each position's last writer, then a gather;
- mixture-of-experts routing: ``histc`` (token counts per expert) as a one-hot sum;
  ``_grouped_mm`` and Transformers' ``grouped_mm_fallback`` (and its backward) as every
  group's matmul masked to the group's rows; ``copy`` (cache updates) as a cast + broadcast;
- ``gather`` / ``scatter`` / ``scatter_add`` along a dim (cross-entropy's ``nll_loss`` and its
  backward, gather's and topk's backward): compares with an iota (one-hot), then a select and
  a sum.
"""

from __future__ import annotations

import contextlib
import functools
import math
import struct
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


def _pooled_size(size: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size (a ceil_mode window must start inside the input or its
    left padding)."""
    span = size + 2 * pad - kernel + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool_windows(
    size: int, kernel: int, stride: int, pad: int, out: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per output position along one dim: which inputs its window sums (``[out, size]``,
    0/1), its length counting padding (up to the padded input's end) and without it."""
    start = torch.arange(out, device=device) * stride - pad
    end = torch.clamp(start + kernel, max=size + pad)
    first, last = torch.clamp(start, min=0), torch.clamp(end, max=size)
    i = torch.arange(size, device=device)
    members = (i >= first.unsqueeze(1)) & (i < last.unsqueeze(1))
    return members.to(torch.float32), end - start, torch.clamp(last - first, min=0)


def avg_pool2d(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> object:
    """``avg_pool2d`` whose windows differ in size, which the importer's fixed windows cannot
    express: ceil_mode windows running past the padded input (EfficientNet's pooler, a window
    larger than the whole feature map) and ``count_include_pad=False`` with padding. Window
    sums as two matmuls with 0/1 window-membership matrices (rows, then columns; float32,
    exact sums of the inputs), divided by each window's divisor as PyTorch's CPU kernel
    computes it. Other shapes stay whole for the importer."""
    k = _pair(kernel_size, (1, 1))
    s, p = _pair(stride, k), _pair(padding, (0, 0))
    size: Pair = (x.shape[-2], x.shape[-1])
    out: Pair = (
        _pooled_size(size[0], k[0], s[0], p[0], ceil_mode),
        _pooled_size(size[1], k[1], s[1], p[1], ceil_mode),
    )
    if x.dim() not in (3, 4) or min(out) <= 0:
        return NotImplemented
    if _windows_fit(size, p, k, s, (1, 1), out) and (count_include_pad or p == (0, 0)):
        return NotImplemented
    rows, cols, divisors = _pool_divisors(
        size, k, s, p, out, count_include_pad, divisor_override, x.device
    )
    sums = torch.matmul(torch.matmul(rows, x.to(torch.float32)), cols.t())  # [..., Ho, Wo]
    return (sums / divisors).to(x.dtype)


def _pool_divisors(
    size: Pair,
    k: Pair,
    s: Pair,
    p: Pair,
    out: Pair,
    count_include_pad: bool,
    divisor_override: int | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int]:
    """The window-membership matrices of both dims and each window's divisor."""
    (rows, padded_h, real_h), (cols, padded_w, real_w) = (
        _pool_windows(size[d], k[d], s[d], p[d], out[d], device) for d in range(2)
    )
    if divisor_override:
        return rows, cols, divisor_override
    if count_include_pad:
        return rows, cols, padded_h.unsqueeze(1) * padded_w
    return rows, cols, real_h.unsqueeze(1) * real_w


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
    """Each window's gradient / divisor, summed back onto the input (col2im); for windows
    of different sizes (see :func:`avg_pool2d`) through the transposed membership matrices."""
    k = _pair(kernel_size, (1, 1))
    s, p = _pair(stride, k), _pair(padding, (0, 0))
    size: Pair = (x.shape[-2], x.shape[-1])
    out: Pair = (grad.shape[-2], grad.shape[-1])
    if not _windows_fit(size, p, k, s, (1, 1), out) or (
        divisor_override is None and not count_include_pad and p != (0, 0)
    ):
        rows, cols, divisors = _pool_divisors(
            size, k, s, p, out, count_include_pad, divisor_override, x.device
        )
        g = grad.to(torch.float32) / divisors
        return torch.matmul(torch.matmul(rows.t(), g), cols).to(x.dtype)
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
    Without ``accumulate`` (``t[index] = values``: MoE routing's inverse permutation), each
    position takes the values of the last index naming it, as PyTorch's serial CPU loop
    leaves it: the last one found as a row maximum over the indices' positions (VectorE),
    then a gather of those value rows. A boolean mask over the leading dims with values
    that do not depend on which elements it selects (``x[mask] = v``) is a select."""
    if not indices:
        return NotImplemented
    if len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool:
        return _put_masked(t, indices[0], values, accumulate)
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
    if not accumulate:
        if index.numel() >= 2**24:  # positions are exact float32 integers below 2**24
            return NotImplemented
        return _put_last_wins(x, index, src).movedim(0, dim)
    hit = index.unsqueeze(1) == torch.arange(x.shape[0], device=t.device)
    rows = src.reshape(index.numel(), -1)
    added = torch.matmul(hit.to(rows.dtype).t(), rows).reshape(x.shape)
    return (x + added.to(t.dtype)).movedim(0, dim)


def copy(t: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> object:
    """``aten.copy`` (what an in-place ``copy_`` into a buffer becomes, e.g. a KV or
    convolution-state cache update): ``src`` cast to ``t``'s dtype and broadcast to its shape."""
    del non_blocking
    if t.device != src.device:
        return NotImplemented
    return src.to(t.dtype).expand(t.shape).clone()


def histc(t: torch.Tensor, bins: int = 100, min: float = 0.0, max: float = 0.0) -> object:  # noqa: A002
    """``torch.histc`` with a given range (MoE routers count tokens per expert with it):
    each element's bin compared with every bin index (one-hot), summed over the elements.

    The bin is PyTorch's CPU formula, ``(x - min) * bins / (max - min)`` in the input's
    dtype, truncated, the top
    edge in the last bin and values outside ``[min, max]`` in none. With ``min == max`` the
    range is the data's (widened by 1 each way when that is a single value too)."""
    if not t.dtype.is_floating_point or t.dtype == torch.float64 or bins <= 0 or not t.numel():
        return NotImplemented
    flat = t.reshape(-1)
    lo: torch.Tensor | float
    hi: torch.Tensor | float
    if min == max:
        lo, hi = flat.min(), flat.max()
        same = lo == hi
        lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
        width: torch.Tensor | float = hi - lo
    else:
        lo, hi = _rounded(min, t.dtype), _rounded(max, t.dtype)
        width = _rounded(hi - lo, t.dtype)
    pos = ((flat - lo) * bins / width).floor().clamp(max=bins - 1)
    inside = (flat >= lo) & (flat <= hi)
    onehot = (pos.unsqueeze(1) == torch.arange(bins, device=t.device, dtype=t.dtype)) & (
        inside.unsqueeze(1)
    )
    return onehot.to(t.dtype).sum(0)


def _rounded(x: float, dtype: torch.dtype) -> float:
    """``x`` rounded to ``dtype`` (to nearest, ties to even), as the CPU kernel holds it."""
    if dtype == torch.float16:
        return float(struct.unpack("e", struct.pack("e", x))[0])
    single = struct.unpack("f", struct.pack("f", x))[0]
    if dtype != torch.bfloat16:
        return float(single)
    bits = struct.unpack("I", struct.pack("f", single))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return float(struct.unpack("f", struct.pack("I", bits))[0])


def _group_masks(offs: torch.Tensor, length: int, like: torch.Tensor) -> torch.Tensor:
    """``[groups, length]``: whether position ``i`` of a jagged dimension is in group ``g``
    (``offs[g - 1] <= i < offs[g]``; positions from ``offs[-1]`` on are in none)."""
    pos = torch.arange(length, device=offs.device, dtype=offs.dtype)
    group = (offs.unsqueeze(0) <= pos.unsqueeze(1)).to(torch.int32).sum(1)
    ids = torch.arange(offs.shape[0], device=offs.device, dtype=torch.int32)
    return (group.unsqueeze(0) == ids.unsqueeze(1)).to(like.dtype)


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> object:
    """``torch._grouped_mm`` (``F.grouped_mm``, Transformers' MoE experts): every group's
    matmul over all rows, masked to the group's rows and summed, so each output element is
    one group's product, exactly as a per-group GEMM gives it.

    Group boundaries come from data, and a kernel's shape cannot, so this does the groups'
    work ``groups`` times over: right for the expert counts of small models, and the place a
    grouped-GEMM kernel (token blocks with their expert's weights gathered) belongs."""
    if out_dtype not in (None, a.dtype) or a.dtype != b.dtype:
        return NotImplemented
    if offs is None:
        out = torch.bmm(a, b) if a.dim() == 3 and b.dim() == 3 else NotImplemented
    elif a.dim() == 2 and b.dim() == 3:  # rows of a in groups: (M, K) x (G, K, N) -> (M, N)
        mask = _group_masks(offs, a.shape[0], a)
        out = (torch.matmul(a.unsqueeze(0), b) * mask.unsqueeze(2)).sum(0)
    elif a.dim() == 2 and b.dim() == 2:  # K in groups (weight gradients): -> (G, M, N)
        mask = _group_masks(offs, a.shape[1], a)
        out = torch.matmul(a.unsqueeze(0) * mask.unsqueeze(1), b)
    elif a.dim() == 3 and b.dim() == 2:  # columns of b in groups: (G, M, K) x (K, N) -> (M, N)
        mask = _group_masks(offs, b.shape[1], a)
        out = (torch.matmul(a, b) * mask.unsqueeze(1)).sum(0)
    else:
        return NotImplemented
    if out is NotImplemented or bias is None:
        return out
    return out + bias


def transformers_grouped_mm(
    x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """Transformers' ``grouped_mm_fallback`` op: ``x`` (S, K) rows in groups, ``weight``
    (E, K, N); rows past the last group are zeros (as its loop leaves them)."""
    return grouped_mm(x, weight, offs)  # type: ignore[return-value]


def transformers_grouped_mm_backward(
    x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Its backward: the input's gradient row groups times the weights transposed, and each
    expert's weight gradient its rows of ``x`` transposed times theirs of ``grad``."""
    grad_x = grouped_mm(grad, weight.transpose(1, 2), offs)
    grad_w = grouped_mm(x.t(), grad, offs)
    return grad_x, grad_w  # type: ignore[return-value]


def _put_masked(
    t: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, accumulate: bool
) -> object:
    """``t[mask] = values`` (or ``+=``) for values broadcast along the selected elements."""
    inner = t.shape[mask.dim() :]
    if mask.shape != t.shape[: mask.dim()] or values.dim() > len(inner) + 1:
        return NotImplemented
    if values.dim() == len(inner) + 1:
        if values.shape[0] != 1:  # one row per selected element: their count is data
            return NotImplemented
        values = values[0]
    try:
        if torch.broadcast_shapes(values.shape, inner) != inner:
            return NotImplemented
    except RuntimeError:
        return NotImplemented
    selected = mask.reshape(*mask.shape, *([1] * len(inner)))
    new = (t + values) if accumulate else values.to(t.dtype).expand(t.shape)
    return torch.where(selected, new.to(t.dtype), t)


def _put_last_wins(x: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``x[index] = src`` along dim 0, a repeated index taking its last row of ``src``."""
    n, count = x.shape[0], index.shape[0]
    index = torch.where(index < 0, index + n, index)
    rows = torch.arange(n, device=x.device, dtype=index.dtype)
    positions = torch.arange(count, device=x.device, dtype=torch.float32)
    named = rows.unsqueeze(1) == index.unsqueeze(0)  # [n, count]: row r named by index i
    last = torch.where(named, positions, -1.0).amax(1)  # the last index naming each row
    taken = src[last.clamp(min=0).to(torch.int64)]
    written = (last >= 0).reshape(n, *([1] * (x.dim() - 1)))
    return torch.where(written, taken.to(x.dtype), x)


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
    _aten.avg_pool2d.default: avg_pool2d,
    _aten.avg_pool2d_backward.default: avg_pool2d_backward,
    _aten.max_pool2d_with_indices_backward.default: max_pool2d_with_indices_backward,
    _aten.embedding_dense_backward.default: embedding_dense_backward,
    _aten.index_put.default: index_put,
    _aten.gather.default: gather,
    _aten.scatter.value: scatter_value,
    _aten.scatter.src: scatter_src,
    _aten.scatter_add.default: scatter_add,
    _aten.slice_scatter.default: slice_scatter,
    _aten.copy.default: copy,
    _aten.histc.default: histc,
    _aten._grouped_mm.default: grouped_mm,
}

#: Ops of libraries models use (registered when the library is imported), by qualified name.
LIBRARY_DECOMPOSITIONS: dict[str, Callable[..., object]] = {
    "transformers::grouped_mm_fallback": transformers_grouped_mm,
    "transformers::grouped_mm_fallback_backward": transformers_grouped_mm_backward,
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


def neuron_decompositions() -> dict[torch._ops.OperatorBase, Callable[..., object]]:
    """Core ATen decompositions plus :data:`EXTRA_DECOMPOSITIONS`, and the
    :data:`LIBRARY_DECOMPOSITIONS` of the libraries imported so far."""
    table = _aten_decompositions()
    library = {}
    for name, fn in LIBRARY_DECOMPOSITIONS.items():
        namespace, op = name.split("::")
        packet = getattr(getattr(torch.ops, namespace), op, None)  # None until registered
        if packet is not None:
            library[packet.default] = fn
    return {**table, **library} if library else table


@functools.cache
def _aten_decompositions() -> dict[torch._ops.OperatorBase, Callable[..., object]]:
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
