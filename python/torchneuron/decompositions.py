"""The decomposition table the backend hands to ``aot_autograd``.

Core ATen keeps some composite ops whole (layer/group/batch norm, softmax). The ``neuron``
dialect has no such ops: it has their building blocks (reductions, ``var_mean``, elementwise
math, matmul), so these composites are decomposed in Python, where PyTorch already knows how,
instead of in the importer. Everything else follows ``core_aten_decompositions()``.

Kept whole on purpose (not decomposed):

- ``aten.var_mean.correction``: one VectorE pass (``bn_stats``/``bn_aggr``) gives both results.
- ``aten.gelu``, ``aten.sigmoid``, ``aten.tanh``: single ScalarE activation functions.
- ``aten.embedding``, ``aten.addmm``, ``aten.avg_pool2d``, ``aten.max_pool2d_with_indices``:
  core ops the importer lowers directly (gather, matmul + bias, pooling windows). The pooling
  decompositions below only add what the importer refuses (ceil_mode's extra windows, max
  pooling's indices, divisors that exclude padding) around the op itself, kept whole.

Ops core ATen keeps whole (:data:`OP_DECOMPOSITIONS`), as ops the device runs:

- layout: ``flip`` (gathers of reversed rows), ``diagonal`` (a strided window of the two dims
  flattened) and its scatter, ``unfold`` (one gather);
- scans: ``cumprod``, ``cummax``/``cummin``, ``logcumsumexp`` by doubling (log2(n) elementwise
  steps); ``max``/``min`` along a dim and ``argmax``/``argmin``: the extreme, then the first
  position holding it;
- indexing: ``index_put`` (any leading block of index tensors, overwrite or accumulate),
  ``put``, ``scatter_reduce``, ``index_reduce``, ``masked_scatter``, ``searchsorted``: one-hot
  compares with an iota, selects, reductions, gathers and TensorE matmuls; ``as_strided_copy`` and
  ``as_strided_scatter`` of a contiguous tensor: a gather or put at iota-computed positions;
  ``index_add`` in bfloat16/float16 summed in float32 and rounded once, as eager's kernel;
- pooling and convolution: 3-d convolutions (and transposed ones, float32) as sums of 2-d
  ones over the depth taps, adaptive average pooling with unequal windows and 3-d average
  pooling as matmuls with window matrices, antialiased bilinear resizing likewise;
- selection and counting: sorts longer than the select rounds take, up to 2048, by rank,
  longer ones (up to 128K: top-p sampling over a vocabulary) by a bitonic network;
  ``histogram``/``histogramdd`` with eager's linspace edges, ``segment_reduce``,
  ``nonzero_static``, ``embedding_bag`` (sum, mean): compares with iotas, one-hot sums and
  matmuls; ``grid_sample`` (2-d, 3-d; float32) as gathers of pixel rows; sums over an empty
  dim; torch's chunked ``linear_cross_entropy`` ops (float32 inference);
- the elementwise functions the engines have no instruction for:
  :mod:`torchneuron.elementwise_math`, and Bessel functions and Chebyshev polynomials:
  :mod:`torchneuron.special_math`;
- matrix factorizations (Cholesky, LU, QR) and the solves, inverses and determinants built on
  them: :mod:`torchneuron.linalg`.

Training graphs (:data:`TRAINING_DECOMPOSITIONS`): backward ops that torch keeps whole, or
decomposes into scatters and gathers by index, become device math here:

- convolution backward (1-d as 2-d of unit height, grouped, depthwise, transposed):
  ``grad_weight`` is a matmul of the output gradient with the input's patches (im2col; with
  one group a position's patch is a row, channels last; batched over groups);
  ``grad_input`` is, with one group, one ordinary convolution of the gradient per phase of
  the input (positions modulo the stride) and a permute, else the weights' transpose times
  the gradient summed back onto the input's positions by phase (col2im). Depthwise
  convolutions use VectorE multiply-accumulates per tap instead, as their forward does;
- transposed convolution (forward, in every graph): the input gradient of the ordinary
  convolution it is the adjoint of; with one group one ordinary convolution of its output's
  phases (positions modulo the stride) and a permute, else col2im(weight^T x x);
- ``_weight_norm_interface_backward`` (weight norm's backward): reductions and elementwise math;
- pooling backward: each window position's share of the gradient, summed back the same way
  (max pooling recomputes which element was each window's first maximum, as PyTorch's CPU kernel
  picks it, so ``max_pool2d_with_indices`` needs no indices on the device);
- ``slice_scatter`` (a sliced view's backward): a concat of the untouched parts and the slice;
- ``index_put`` brought to rows of a 2-D table written by a 1-D index, which the device
  writes by indirect DMA (``neuron.scatter``); with ``accumulate`` (index_select's backward)
  and ``embedding_dense_backward`` into a small table, one-hot(indices)^T @ grad, a TensorE
  matmul instead of a scatter-add;
- mixture-of-experts routing: ``histc`` (token counts per expert) as a one-hot sum;
  ``_grouped_mm`` and Transformers' ``grouped_mm_fallback`` (and its backward) as every
  group's matmul masked to the group's rows; ``copy`` (cache updates) as a cast + broadcast;
- ``gather`` / ``scatter`` / ``scatter_add`` along a dim (cross-entropy's ``nll_loss`` and its
  backward, gather's and topk's backward): compares with an iota (one-hot), then a select and
  a sum.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import functools
import itertools
import math
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
import torch._refs
import torch.fx
import torch.nn.functional as F

from torchneuron.elementwise_math import ELEMENTWISE_DECOMPOSITIONS
from torchneuron.linalg import LINALG_DECOMPOSITIONS
from torchneuron.norms import channels_last_layer_norm
from torchneuron.special_math import SPECIAL_DECOMPOSITIONS

__all__ = [
    "EXTRA_DECOMPOSITIONS",
    "TRAINING_DECOMPOSITIONS",
    "grouped_mm_kernel",
    "grouped_mm_masked",
    "is_grouped_mm_kernel_form",
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
    # PyTorch's own decompositions outside core ATen, into ops the device runs.
    (_aten.addmv, "matmul + scaled add"),
    (_aten.isinf, "abs == inf"),
    (_aten.ldexp, "x * 2^e"),
    (_aten.dist, "norm of the difference"),
    (_aten.narrow_copy, "a slice, copied"),
    (_aten.max_pool3d_with_indices, "maxima of shifted windows, indices by comparison"),
    (_aten._batch_norm_with_update, "training batch norm: reductions + math"),
    (_aten._batch_norm_with_update_functional, "training batch norm: reductions + math"),
    (_aten.view_copy, "a view, copied"),
    (_aten.permute_copy, "a permutation, copied"),
    (_aten.unbind_copy, "selects, copied"),
    (_aten.new_empty_strided, "uninitialized memory: zeros"),
    (_aten.index_copy, "index_put"),
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
    positions (in fp32 for 16-bit types), the padding cropped. By phase: the padded input's
    positions ``(a, b)`` modulo the stride take the kernel positions ``(i, j)`` whose offsets
    ``i * dilation`` are ``a`` modulo it (and ``j``'s ``b``), each share shifted by
    ``i * dilation // stride`` rows on that phase's grid. So the sums are of shifted planes at
    the shares' resolution, and one permute (as pixel_shuffle's) interleaves the phases.
    Placing each share into the whole grid by zero insertion wrote every stride-th element, an
    element a descriptor: a [8, 256, 32, 32] transposed convolution of kernel 2, stride 2 took
    18.6 ms modeled."""
    (sh, sw), (dh, dw) = stride, dilation
    padded = (size[0] + 2 * padding[0], size[1] + 2 * padding[1])
    rows, cols = -(-padded[0] // sh), -(-padded[1] // sw)  # a phase's grid
    phases: dict[tuple[int, int], torch.Tensor] = {}
    for i, j, part in parts:
        (qi, a), (qj, b) = divmod(i * dh, sh), divmod(j * dw, sw)
        ho, wo = part.shape[-2:]
        pads = (qj, cols - qj - wo, qi, rows - qi - ho)
        placed = F.pad(part, pads) if any(pads) else part
        if (a, b) in phases:  # a sum (one share is moved as it is)
            acc = _accumulation_dtype(part)
            placed = placed.to(acc) + phases[a, b].to(acc)
        phases[a, b] = placed
    any_phase = max(phases.values(), key=lambda t: t.element_size())  # the widest dtype
    grids = [
        phases[a, b].to(any_phase.dtype) if (a, b) in phases else torch.zeros_like(any_phase)
        for a in range(sh)
        for b in range(sw)
    ]
    if len(grids) == 1:
        whole = grids[0]
    else:  # [sh * sw, ..., rows, cols] -> [..., rows, sh, cols, sw]
        lead = any_phase.dim() - 2
        stacked = torch.stack(grids).reshape(sh, sw, *any_phase.shape)
        order = (*range(2, 2 + lead), 2 + lead, 0, 3 + lead, 1)
        whole = stacked.permute(order).reshape(*any_phase.shape[:-2], rows * sh, cols * sw)
    cropped = whole[..., padding[0] : padding[0] + size[0], padding[1] : padding[1] + size[1]]
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
    if groups == 1:
        return _phase_convolution(g, weight, size, stride, padding, dilation).to(dtype)
    og, ckk = o // groups, cg * kh * kw
    wt = weight.reshape(groups, og, ckk).transpose(1, 2)
    cols = torch.matmul(wt, g.reshape(n, groups, og, ho * wo))
    cols = cols.reshape(n, c, kh, kw, ho, wo)
    parts = [(i, j, cols[:, :, i, j]) for i in range(kh) for j in range(kw)]
    return _sum_back(parts, stride, dilation, size, padding, dtype)


def _phase_convolution(
    g: torch.Tensor, weight: torch.Tensor, size: Pair, stride: Pair, padding: Pair, dilation: Pair
) -> torch.Tensor:
    """A transposed convolution of ``g`` (col2im(weight^T x g), ``weight`` ``[O, C, kh, kw]``,
    one group) as one ordinary convolution (sub-pixel convolution): the padded output's
    positions ``(a, b)`` modulo the stride (its phases) take the kernel positions whose
    offsets ``i * dilation`` are ``a`` modulo it, each shifted by ``i * dilation // stride`` on
    that phase's grid: a correlation of ``g`` with those taps. The phases that take any are
    output channels of one convolution (summed in PSUM, rounded once, as eager's),
    interleaved by one permute (as pixel_shuffle's). col2im placed each kernel position's
    share by zero insertion ([8, 128, 32, 32] through a kernel 4, stride 2 transposed
    convolution: 38.8 ms modeled)."""
    n, o, ho, wo = g.shape
    c, kh, kw = weight.shape[1:]
    (sh, sw), (dh, dw) = stride, dilation
    padded = (size[0] + 2 * padding[0], size[1] + 2 * padding[1])
    rows, cols = -(-padded[0] // sh), -(-padded[1] // sw)  # a phase's grid
    qh, qw = (kh - 1) * dh // sh, (kw - 1) * dw // sw  # the largest shifts
    taps: dict[tuple[int, int], dict[tuple[int, int], torch.Tensor]] = {}
    for i in range(kh):
        for j in range(kw):
            (qi, a), (qj, b) = divmod(i * dh, sh), divmod(j * dw, sw)
            taps.setdefault((a, b), {})[qh - qi, qw - qj] = weight[:, :, i, j].t()
    zero = weight.new_zeros(c, o)
    phases = sorted(taps)
    kernel = torch.stack(
        [
            taps[phase].get((mi, mj), zero)
            for phase in phases
            for mi in range(qh + 1)
            for mj in range(qw + 1)
        ]
    )  # [phases * (qh + 1) * (qw + 1), C, O] -> [phases * C, O, qh + 1, qw + 1]
    kernel = kernel.reshape(len(phases), qh + 1, qw + 1, c, o).permute(0, 3, 4, 1, 2)
    kernel = kernel.reshape(len(phases) * c, o, qh + 1, qw + 1)
    y = F.conv2d(F.pad(g, (qw, cols - wo, qh, rows - ho)), kernel)
    whole = y.reshape(n, len(phases), c, rows, cols)
    if len(phases) < sh * sw:  # phases no kernel position reaches are zeros
        empty = whole.new_zeros(n, c, rows, cols)
        grids = [
            whole[:, phases.index((a, b))] if (a, b) in taps else empty
            for a in range(sh)
            for b in range(sw)
        ]
        whole = torch.stack(grids, 1)
    whole = whole.reshape(n, sh, sw, c, rows, cols).permute(0, 3, 4, 1, 5, 2)
    whole = whole.reshape(n, c, rows * sh, cols * sw)
    return whole[..., padding[0] : padding[0] + size[0], padding[1] : padding[1] + size[1]]


def _weight_grad(
    g: torch.Tensor,
    x: torch.Tensor,
    kernel: Pair,
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    groups: int,
) -> torch.Tensor:
    """``[O, C/G, kh, kw]``: g x patches(x)^T summed over images (im2col; with one group each
    position's patch a row, channels last), batched over groups; depthwise: per tap, the
    gradient times the window, summed (VectorE multiply and reduce; the contraction has no
    channel dim for TensorE)."""
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
    if groups == 1:
        # Channels last, a position's patch one row in (i, j, c) order: the windows
        # concatenate along their channels into the rows the matmul reads (im2col's
        # [C * kh * kw, positions] went through HBM twice more, stacked then transposed:
        # 964 -> 536 us for a 3 x 3 convolution over [8, 64, 56, 56] bf16).
        if tuple(stride) == (1, 1):
            # Positions over the whole padded grid (g zero past its own): window (i, j) is
            # the padded image's rows from i * Wp + j on, one run (rows past an image's
            # meet g's zeros), not a copy of its own.
            hp, wp = xp.shape[2:]
            rows = n * hp * wp
            tail = dilation[0] * (kh - 1) * wp + dilation[1] * (kw - 1)
            xh = F.pad(xp.permute(0, 2, 3, 1).reshape(rows, c), (0, 0, 0, tail))
            starts = [dilation[0] * i * wp + dilation[1] * j for i in range(kh) for j in range(kw)]
            windows = [xh[start : start + rows] for start in starts]
            g = F.pad(g, (0, wp - wo, 0, hp - ho))
        else:
            rows = n * ho * wo
            windows = [
                _window(xp, i, j, stride, dilation, (ho, wo)).permute(0, 2, 3, 1).reshape(rows, c)
                for i in range(kh)
                for j in range(kw)
            ]
        patches = torch.cat(windows, dim=-1)
        gm = g.permute(1, 0, 2, 3).reshape(o, rows)
        return (gm @ patches).reshape(o, kh, kw, c).permute(0, 3, 1, 2).contiguous()
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
    """A transposed convolution is the input gradient of an ordinary one (its adjoint), as
    :func:`convolution_backward` computes it: with one group one ordinary convolution of its
    phases (:func:`_phase_convolution`, in the input's dtype: PSUM sums and rounds once), else
    col2im(weight^T x x) on TensorE in fp32; ordinary convolutions are the importer's."""
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
    # weight [C_in, C_out/G, kh, kw] is the ordinary convolution's [O, C/G, kh, kw]. 16-bit
    # inputs multiply in float32: a 16-bit matmul would round every window position's share
    # before the shares are summed (several ulps off eager's one rounding, in OpInfo's bf16
    # samples 0.07 at magnitude 5).
    if groups == 1:
        y = _phase_convolution(x, weight, (size[0], size[1]), s, p, d)
    else:
        acc = _accumulation_dtype(x)
        y = _input_grad(x.to(acc), weight.to(acc), (size[0], size[1]), s, p, d, groups, x.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype).reshape(1, -1, 1, 1)
    return y.squeeze(2) if one_d else y


def convolution(
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
    """3-d convolutions as 2-d ones (below); transposed ones as :func:`transposed_convolution`;
    ordinary 1-d and 2-d ones are the importer's."""
    if weight.dim() == 5 and not transposed:
        return _convolution3d(x, weight, bias, stride, padding, dilation, groups)
    if weight.dim() == 5:
        return _transposed_convolution3d(
            x, weight, bias, stride, padding, dilation, output_padding, groups
        )
    return transposed_convolution(
        x, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )


def _convolution3d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> object:
    """A 3-d convolution is a sum over the kernel's depth taps of 2-d convolutions: tap ``kd``
    convolves every output depth's input plane (a strided slice of the depth-padded input,
    depths folded into the batch) with the weights' plane ``kd``. Each is the device's 2-d
    convolution (im2col + TensorE matmul); the taps are summed in float32 and rounded once."""
    unbatched = x.dim() == 4
    if unbatched:
        x = x.unsqueeze(0)
    if x.dim() != 5 or isinstance(padding, str):
        return NotImplemented
    s = [stride[k] if len(stride) > 1 else stride[0] for k in range(3)]
    p = [padding[k] if len(padding) > 1 else padding[0] for k in range(3)]
    d = [dilation[k] if len(dilation) > 1 else dilation[0] for k in range(3)]
    n, c, depth = x.shape[:3]
    o, kd = weight.shape[0], weight.shape[2]
    out_depth = (depth + 2 * p[0] - d[0] * (kd - 1) - 1) // s[0] + 1
    acc = _accumulation_dtype(x)
    xp = F.pad(x.to(acc), (0, 0, 0, 0, p[0], p[0])) if p[0] else x.to(acc)
    w = weight.to(acc)
    y: torch.Tensor | None = None
    for tap in range(kd):
        start = tap * d[0]
        planes = xp[:, :, start : start + s[0] * (out_depth - 1) + 1 : s[0]]
        planes = planes.transpose(1, 2).reshape(n * out_depth, c, *x.shape[3:])
        part = _aten.convolution.default(
            planes, w[:, :, tap], None, s[1:], p[1:], d[1:], False, [0, 0], groups
        )
        y = part if y is None else y + part
    assert y is not None
    y = y.reshape(n, out_depth, o, *y.shape[2:]).transpose(1, 2)
    if bias is not None:
        y = y + bias.to(acc).reshape(1, -1, 1, 1, 1)
    y = y.to(x.dtype)
    return y.squeeze(0) if unbatched else y


def _transposed_convolution3d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    output_padding: Sequence[int],
    groups: int,
) -> object:
    """A 3-d transposed convolution as 2-d ones, the adjoint of :func:`_convolution3d`: depth
    tap ``kd`` transposes-convolves every input depth's plane (depths folded into the batch)
    with the weights' plane ``kd``; input depth i lands on output depth i * stride + kd *
    dilation (zeros between, by a concat with zeros and a reshape), the taps are summed in
    float32, the depth padding is cropped and the result rounded once. Float32 only: eager's
    16-bit kernel rounds its partial sums (OpInfo's dilated bf16 sample: eager 0.088 from the
    float64 result, this form 0.031), so the two differ by more than an ulp."""
    unbatched = x.dim() == 4
    if unbatched:
        x = x.unsqueeze(0)
    if x.dim() != 5 or isinstance(padding, str) or x.dtype != torch.float32:
        return NotImplemented
    if not _known(x, weight):
        return NotImplemented

    def triple(v: Sequence[int]) -> list[int]:
        return [v[k] if len(v) > 1 else v[0] for k in range(3)]

    s, p, d, op = triple(stride), triple(padding), triple(dilation), triple(output_padding)
    n, c, depth = x.shape[:3]
    kd = weight.shape[2]
    full = (depth - 1) * s[0] + d[0] * (kd - 1) + 1 + op[0]
    out_depth = full - 2 * p[0]
    if out_depth <= 0 or op[0] >= max(s[0], d[0]):
        return NotImplemented
    acc = _accumulation_dtype(x)
    planes = x.to(acc).transpose(1, 2).reshape(n * depth, c, *x.shape[3:])
    w = weight.to(acc)
    y: torch.Tensor | None = None
    for tap in range(kd):
        part = _aten.convolution.default(
            planes, w[:, :, tap], None, s[1:], p[1:], d[1:], True, op[1:], groups
        )
        if part is NotImplemented:
            return NotImplemented
        part = part.reshape(n, depth, *part.shape[1:]).transpose(1, 2)  # [n, o, depth, h, w]
        if s[0] > 1:  # input depth i at i * stride: zeros between
            gaps = part.new_zeros(*part.shape[:3], s[0] - 1, *part.shape[3:])
            part = torch.cat([part.unsqueeze(3), gaps], 3).flatten(2, 3)
            part = part[:, :, : (depth - 1) * s[0] + 1]
        front = tap * d[0]
        part = F.pad(part, (0, 0, 0, 0, front, full - front - part.shape[2]))
        y = part if y is None else y + part
    assert y is not None
    y = y[:, :, p[0] : p[0] + out_depth]
    if bias is not None:
        y = y + bias.to(acc).reshape(1, -1, 1, 1, 1)
    y = y.to(x.dtype)
    return y.squeeze(0) if unbatched else y


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
        _pool_size(size[0], k[0], s[0], p[0], 1, ceil_mode),
        _pool_size(size[1], k[1], s[1], p[1], 1, ceil_mode),
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


def avg_pool3d(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> object:
    """``avg_pool3d`` as :func:`avg_pool2d`'s window matrices, one per dim: a window is a box, so
    its sum is the depth windows' sum of the (height, width) windows' sums, and PyTorch's CPU
    divisor is the product of the three window lengths (with or without padding)."""

    def triple(v: Sequence[int] | int) -> list[int]:
        v = [v] if isinstance(v, int) else list(v)
        return v * 3 if len(v) == 1 else v

    k = triple(kernel_size)
    s, p = triple(stride or k), triple(padding)
    if x.dim() not in (4, 5) or not x.is_floating_point() or len(k) != 3 or not _known(x):
        return NotImplemented
    size = list(x.shape[-3:])
    out = [_pool_size(size[d], k[d], s[d], p[d], 1, ceil_mode) for d in range(3)]
    if min(out) <= 0 or any(2 * p[d] > k[d] for d in range(3)):
        return NotImplemented  # eager refuses these; leave it to say so
    windows = [_pool_windows(size[d], k[d], s[d], p[d], out[d], x.device) for d in range(3)]
    (depth, _, _), (rows, _, _), (cols, _, _) = windows
    plane = torch.matmul(torch.matmul(rows, x.to(torch.float32)), cols.t())  # [..., D, Ho, Wo]
    lead = list(plane.shape[:-3])
    sums = torch.matmul(depth, plane.reshape(*lead, size[0], out[1] * out[2]))
    sums = sums.reshape(*lead, *out)
    if divisor_override:
        return (sums / divisor_override).to(x.dtype)
    lengths = [w[1] if count_include_pad else w[2] for w in windows]
    divisors = lengths[0].reshape(-1, 1, 1) * lengths[1].reshape(-1, 1) * lengths[2]
    return (sums / divisors).to(x.dtype)


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
    k = _pair(kernel_size, (1, 1))
    s, p, d = _pair(stride, k), _pair(padding, (0, 0)), _pair(dilation, (1, 1))
    size: Pair = (x.shape[-2], x.shape[-1])
    out: Pair = (grad.shape[-2], grad.shape[-1])
    extra = _ceil_padding(size, k, s, p, d, out)
    if extra != (0, 0):  # ceil_mode's last windows: on an input grown with -inf, cropped back
        grown = F.pad(x, (0, extra[1], 0, extra[0]), value=-math.inf)
        back = max_pool2d_with_indices_backward(
            grad, grown, kernel_size, stride, padding, dilation, False, indices
        )
        return back[..., : size[0], : size[1]]  # type: ignore[index]
    del indices
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
    """Each token's gradient row added to its row of the table: a DMA scatter-add into a
    large table (``index_put`` with accumulate: rows added in index order, rounded per add,
    as eager's kernel does), or for a small one one_hot(indices)^T @ grad, a matmul on
    TensorE (0/1 times the gradient is exact in any dtype; PSUM accumulates in fp32, one
    rounding at the end), which costs as much as an output projection onto the vocabulary
    (see :func:`_scatter_add_wins`). Tokens at ``padding_idx`` add nothing."""
    if scale_grad_by_freq:
        return NotImplemented
    flat = indices.reshape(-1)
    g = grad.reshape(flat.numel(), -1)
    shape = (num_weights, *grad.shape[indices.dim() :])
    if _scatter_add_wins(num_weights, g.shape[1]):
        if padding_idx >= 0:
            g = torch.where((flat != padding_idx).unsqueeze(1), g, 0)
        table = torch.zeros(num_weights, g.shape[1], dtype=g.dtype, device=g.device)
        return _aten.index_put.default(table, [flat], g, True).reshape(shape)
    hit = flat.unsqueeze(1) == torch.arange(num_weights, device=flat.device)
    if padding_idx >= 0:
        hit = hit & (flat != padding_idx).unsqueeze(1)
    return torch.matmul(hit.to(g.dtype).t(), g).reshape(shape)


def index_put(
    t: torch.Tensor,
    indices: Sequence[torch.Tensor | None],
    values: torch.Tensor,
    accumulate: bool = False,
) -> object:
    """``t[..., i0, i1, ...] = values`` (or ``+=`` with ``accumulate``: index_select's and
    index_add's backward) for one block of integer index tensors after whole dims: the
    indexed dims flattened to rows, each index tuple a row number, and the rows written by
    index (``index_put`` of a 2-D table by a 1-D index, which the device runs as an
    indirect DMA; a row written twice keeps the last write, as PyTorch's CPU kernel does).
    With ``accumulate`` into a small table, a one-hot(rows)^T @ values matmul on TensorE
    instead (see :func:`_scatter_add_wins`). A bool mask with one value is a select. Other
    forms (masks with many values, indices apart) stay eager."""
    if not indices:
        return NotImplemented
    if _is_row_put(t, indices, values) and (
        not accumulate or _scatter_add_wins(t.shape[0], t.shape[1])
    ):
        return NotImplemented  # the device's own form: rows written by indirect DMA
    lead = 0
    while lead < len(indices) and indices[lead] is None:
        lead += 1
    block = list(indices[lead:])
    if not block or any(i is None for i in block) or t.dtype == torch.bool:
        return NotImplemented
    tensors = cast(list[torch.Tensor], block)
    if any(i.dtype in (torch.bool, torch.uint8) for i in tensors):
        return _masked_put(t, lead, tensors, values, accumulate)
    if t.dim() == 0:  # a 0-d tensor indexed by [0]s: a one-row table
        put = index_put(t.reshape(1), indices, values.reshape(-1), accumulate)
        return NotImplemented if put is NotImplemented else put.reshape(())  # type: ignore[union-attr]
    k = len(tensors)
    if lead + k > t.dim():
        return NotImplemented
    try:
        shape = torch.broadcast_shapes(*(i.shape for i in tensors))
    except RuntimeError:
        return NotImplemented
    expected = (*t.shape[:lead], *shape, *t.shape[lead + k :])
    try:
        if torch.broadcast_shapes(values.shape, expected) != expected:
            return NotImplemented
    except RuntimeError:
        return NotImplemented
    dims = t.shape[lead : lead + k]
    if math.prod(shape) == 0 or t.numel() == 0:
        return t.clone()
    flat: torch.Tensor | None = None
    for i, n in zip(tensors, dims, strict=True):
        i = torch.where(i < 0, i + n, i).expand(shape)
        flat = i if flat is None else flat * n + i
    assert flat is not None
    # The indexed dims first, then the whole dims before them, then the rest.
    moved = (tuple(range(lead)), tuple(range(k, k + lead)))
    x = t.movedim(*moved)
    v = (
        values.to(t.dtype)
        .expand(expected)
        .movedim(tuple(range(lead)), tuple(range(len(shape), len(shape) + lead)))
    )
    rows_n = math.prod(dims)
    rows = x.reshape(rows_n, -1)
    flat = flat.reshape(-1)
    vals = v.reshape(flat.numel(), -1)
    if accumulate and not _scatter_add_wins(rows_n, rows.shape[1]):
        hit = flat.unsqueeze(1) == torch.arange(rows_n, device=t.device)
        mm = torch.float32 if not t.is_floating_point() else vals.dtype
        out = rows + torch.matmul(hit.to(mm).t(), vals.to(mm)).to(t.dtype)
    else:
        out = _aten.index_put.default(rows, [flat], vals, accumulate)
    return out.reshape(x.shape).movedim(moved[1], moved[0])


def _is_row_put(
    t: torch.Tensor, indices: Sequence[torch.Tensor | None], values: torch.Tensor
) -> bool:
    """Whether ``t[idx] = values`` is the row form the device runs as an indirect DMA
    (``neuron.scatter``): a 2-D table, one 1-D integer index, one row of values per index.
    Of repeated indices the last write wins (PyTorch's CPU kernel; undefined on others)."""
    idx = indices[0] if len(indices) == 1 else None
    return (
        idx is not None
        and idx.dim() == 1
        and idx.dtype in (torch.int32, torch.int64)
        and t.dim() == 2
        and t.dtype != torch.bool
        and values.dtype == t.dtype
        and tuple(values.shape) == (idx.shape[0], t.shape[1])
    )


def _scatter_add_wins(rows: int, width: int) -> bool:
    """Whether adding rows by index is faster as a DMA scatter-add (a descriptor per row,
    ~50 ns of GpSimd each) than as a one-hot [indices, rows] matmul on TensorE (2 x rows x
    width FLOPs per index at the bf16 peak, ~79 FLOPs per ps: 50 ns at 2M elements): tables
    of more than about 2M elements (an embedding's gradient), not a router's few rows."""
    return rows * width >= 1 << 21


def _masked_put(
    t: torch.Tensor,
    lead: int,
    masks: list[torch.Tensor],
    values: torch.Tensor,
    accumulate: bool,
) -> object:
    """``t[mask] = v`` with one mask over leading dims: a select. ``v`` is either one value
    (or row) for every masked position, or one per masked position in order, which the
    k-th masked position reads as row k (a running count of the mask, cumsum on TensorE,
    and a gather)."""
    if len(masks) != 1 or lead != 0:
        return NotImplemented
    mask = masks[0].to(torch.bool)
    m = mask.dim()
    if m > t.dim() or mask.shape != t.shape[:m]:
        return NotImplemented
    rest = t.shape[m:]
    v = values.to(t.dtype)
    if v.dim() > len(rest):  # one row per masked position
        if v.dim() != len(rest) + 1:
            return NotImplemented
        flat = mask.reshape(-1)
        order = torch.clamp(torch.cumsum(flat.to(torch.int64), 0) - 1, min=0)
        rows = v.expand(v.shape[0], *rest).reshape(v.shape[0], -1)
        if rows.shape[0] == 0:
            return t.clone()
        v = torch.index_select(rows, 0, order).reshape(t.shape)
    keep = mask.reshape(*mask.shape, *([1] * len(rest)))
    return torch.where(keep, t + v if accumulate else v, t)


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


def _known(*tensors: torch.Tensor) -> bool:
    """Whether every size of ``tensors`` is a number at trace time: the one-hot forms below
    size their compares by it (sizes known only at run time keep those ops whole)."""
    return all(isinstance(n, int) for t in tensors for n in t.shape)


#: The most compares a one-hot form here makes (a rank sort's rows x n x n, a histogram's
#: elements x bins, ...). Measured with the rank sort (``torchneuron.profile()``, trn2, one
#: row): n = 2048 models 0.67 ms; past it the compares spill through HBM (4096: 71 ms, 8000:
#: 520 ms, DMA-bound) where the host takes well under a millisecond, so larger ones stay a
#: counted fallback until the lowering keeps them on chip.
_ONE_HOT_WORK = 1 << 22


def _linspace_edges(
    column: torch.Tensor, bins: int, bounds: tuple[float, float] | None
) -> torch.Tensor:
    """One dim's bin edges as eager's histograms make them: the given range or the data's
    (widened by 0.5 each way when it is one value; [0, 1] without data), then eager's CPU
    ``linspace`` in the input's dtype (``start + i * step`` up to half way, ``end - (bins -
    i) * step`` after)."""
    dtype, device = column.dtype, column.device
    if bounds is not None:
        left, right = float(bounds[0]), float(bounds[1])
        if left == right:
            left, right = left - 0.5, right + 0.5
        lo = torch.full((), left, dtype=dtype, device=device)
        hi = torch.full((), right, dtype=dtype, device=device)
    elif column.numel():
        lo, hi = column.min(), column.max()
        same = lo == hi
        lo, hi = torch.where(same, lo - 0.5, lo), torch.where(same, hi + 0.5, hi)
    else:
        lo = torch.zeros((), dtype=dtype, device=device)
        hi = torch.ones((), dtype=dtype, device=device)
    step = (hi - lo) / bins
    i = torch.arange(bins + 1, device=device, dtype=dtype)
    return torch.where(i < (bins + 1) // 2, lo + step * i, hi - step * (bins - i)).to(dtype)


_HISTOGRAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def histogram(
    t: torch.Tensor,
    bins: int = 100,
    *,
    range: Sequence[float] | None = None,  # noqa: A002
    weight: torch.Tensor | None = None,
    density: bool = False,
) -> object:
    """``torch.histogram`` with a bin count: :func:`_linspace_edges`, then each element
    compared with the edges (one-hot), weighted and summed over the elements."""
    if t.dtype not in _HISTOGRAM_DTYPES or bins <= 0 or not _known(t):
        return NotImplemented
    flat = t.reshape(-1)
    if flat.numel() * bins > _ONE_HOT_WORK:
        return NotImplemented
    bounds = None if range is None else (range[0], range[1])
    edges = _linspace_edges(flat, bins, bounds)
    return _histogram_counts(flat, edges, weight, density), edges


def _histogramdd_edges(
    t: torch.Tensor,
    bins: Sequence[int],
    range: Sequence[float] | None,  # noqa: A002
) -> list[torch.Tensor] | None:
    """Every dim's edges of a d-dimensional histogram of ``t`` (points along its last dim)."""
    dims = t.shape[-1] if t.dim() else 0
    if t.dtype not in _HISTOGRAM_DTYPES or dims != len(bins) or min(bins, default=0) <= 0:
        return None
    if not _known(t):
        return None
    if t.numel() // max(dims, 1) * math.prod(bins) > _ONE_HOT_WORK:
        return None
    points = t.reshape(-1, dims)
    return [
        _linspace_edges(
            points[:, d], bins[d], None if range is None else (range[2 * d], range[2 * d + 1])
        )
        for d in builtins.range(dims)
    ]


def histogramdd_bin_edges(
    t: torch.Tensor,
    bins: Sequence[int],
    *,
    range: Sequence[float] | None = None,  # noqa: A002
    weight: torch.Tensor | None = None,
    density: bool = False,
) -> object:
    edges = _histogramdd_edges(t, bins, range)
    return NotImplemented if edges is None else edges


def histogramdd_from_bin_cts(
    t: torch.Tensor,
    bins: Sequence[int],
    *,
    range: Sequence[float] | None = None,  # noqa: A002
    weight: torch.Tensor | None = None,
    density: bool = False,
) -> object:
    edges = _histogramdd_edges(t, bins, range)
    return NotImplemented if edges is None else _histogramdd_counts(t, edges, weight, density)


def histogramdd_from_bin_tensors(
    t: torch.Tensor,
    bins: Sequence[torch.Tensor],
    *,
    weight: torch.Tensor | None = None,
    density: bool = False,
) -> object:
    dims = t.shape[-1] if t.dim() else 0
    if t.dtype not in _HISTOGRAM_DTYPES or dims != len(bins) or not _known(t, *bins):
        return NotImplemented
    if any(e.dim() != 1 or e.numel() < 2 or e.dtype != t.dtype for e in bins):
        return NotImplemented  # eager refuses these: let it say why
    if t.numel() // max(dims, 1) * math.prod(e.numel() - 1 for e in bins) > _ONE_HOT_WORK:
        return NotImplemented
    return _histogramdd_counts(t, list(bins), weight, density)


def _histogramdd_counts(
    t: torch.Tensor, edges: list[torch.Tensor], weight: torch.Tensor | None, density: bool
) -> torch.Tensor:
    """Each point's bin along every dim (how many inner edges it reaches; inside when within
    the outer ones, the top edge in the last bin), the dims' bins as one flat bin (one-hot
    against an iota), weighted sums per bin; density divides by the total and each bin's
    volume."""
    dims = len(edges)
    points = t.reshape(-1, dims)
    sizes = [e.shape[0] - 1 for e in edges]
    flat_bin = torch.zeros(points.shape[0], dtype=torch.int64, device=t.device)
    inside = torch.ones(points.shape[0], dtype=torch.bool, device=t.device)
    for d, e in enumerate(edges):
        x = points[:, d]
        reached = (x.unsqueeze(1) >= e[1:-1]).sum(1) if sizes[d] > 1 else 0
        inside = inside & (x >= e[0]) & (x <= e[-1])
        flat_bin = flat_bin * sizes[d] + reached
    total = math.prod(sizes)
    onehot = (flat_bin.unsqueeze(1) == torch.arange(total, device=t.device)) & inside.unsqueeze(1)
    w = torch.ones_like(points[:, 0]) if weight is None else weight.reshape(-1).to(t.dtype)
    hist = torch.where(onehot, w.unsqueeze(1), 0.0).sum(0).reshape(sizes)
    if density:
        volume = functools.reduce(
            lambda v, e: v.unsqueeze(-1) * (e[1:] - e[:-1]), edges[1:], edges[0][1:] - edges[0][:-1]
        )
        hist = hist / (hist.sum() * volume)
    return hist.to(t.dtype)


def histogram_edges(
    t: torch.Tensor,
    bins: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    density: bool = False,
) -> object:
    """``torch.histogram`` with given edges: as :func:`histogram` after its edges."""
    if t.dtype not in _HISTOGRAM_DTYPES or bins.dim() != 1 or not _known(t, bins):
        return NotImplemented
    if bins.numel() < 2 or bins.dtype != t.dtype:
        return NotImplemented  # eager refuses these: let it say why
    if t.numel() * bins.numel() > _ONE_HOT_WORK:
        return NotImplemented
    return _histogram_counts(t.reshape(-1), bins, weight, density), bins.clone()


def _histogram_counts(
    flat: torch.Tensor, edges: torch.Tensor, weight: torch.Tensor | None, density: bool
) -> torch.Tensor:
    """Each element's bin by comparison with the (increasing) edges, the top edge in the last
    bin and values outside none, as eager's CPU kernel bins them; weighted sums per bin."""
    bins = edges.shape[0] - 1
    x = flat.unsqueeze(1)
    last = torch.arange(bins, device=flat.device) == bins - 1
    onehot = (x >= edges[:-1]) & ((x < edges[1:]) | (last & (x == edges[1:])))
    w = torch.ones_like(flat) if weight is None else weight.reshape(-1).to(flat.dtype)
    hist = torch.where(onehot, w.unsqueeze(1), 0.0).sum(0)
    if density:
        hist = hist / (hist.sum() * (edges[1:] - edges[:-1]))
    return hist.to(flat.dtype)


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


#: Whether ``_grouped_mm`` of rows in groups stays one op for the grouped-GEMM kernel
#: (:func:`grouped_mm_kernel`).
_GROUPED_MM_KERNEL: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchneuron_grouped_mm_kernel", default=False
)

#: Groups the grouped-GEMM kernel takes: its program holds one GEMM per group.
GROUPED_MM_KERNEL_MAX_GROUPS = 64


@contextlib.contextmanager
def grouped_mm_kernel(enabled: bool = True) -> Iterator[None]:
    """While tracing (``aot_autograd``): ``torch._grouped_mm`` of [M, K] rows in groups by
    [G, K, N] stays one op (:func:`is_grouped_mm_kernel_form`), which the compiler lowers to a
    grouped GEMM whose per-group row counts are the offsets' values, bound when the program is
    launched (``neuron.grouped_matmul``); :func:`torchneuron.rewrite.grouped_mm_offsets`
    decomposes the ones whose offsets are a constant (the partitioner puts the GEMM in a region
    of its own, so offsets the graph computes are an input of it)."""
    token = _GROUPED_MM_KERNEL.set(enabled)
    try:
        yield
    finally:
        _GROUPED_MM_KERNEL.reset(token)


def is_grouped_mm_kernel_form(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: object,
    bias: object = None,
    out_dtype: torch.dtype | None = None,
) -> bool:
    """Whether the grouped-GEMM kernel computes this ``_grouped_mm``: rows of a 2-d ``a`` in
    groups times a 3-d ``b`` of one float dtype, int32 offsets, no bias, at most
    :data:`GROUPED_MM_KERNEL_MAX_GROUPS` groups."""
    return (
        isinstance(offs, torch.Tensor)
        and offs.dtype == torch.int32
        and a.dim() == 2
        and b.dim() == 3
        and bias is None
        and out_dtype in (None, a.dtype)
        and a.dtype == b.dtype
        and a.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and b.shape[0] <= GROUPED_MM_KERNEL_MAX_GROUPS
    )


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> object:
    """``torch._grouped_mm``: left as it is for the grouped-GEMM kernel inside
    :func:`grouped_mm_kernel`, else :func:`grouped_mm_masked`."""
    if _GROUPED_MM_KERNEL.get() and is_grouped_mm_kernel_form(a, b, offs, bias, out_dtype):
        return NotImplemented
    return grouped_mm_masked(a, b, offs, bias, out_dtype)


def grouped_mm_masked(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> object:
    """``torch._grouped_mm`` (``F.grouped_mm``, Transformers' MoE experts), each output
    element one group's product, exactly as a per-group GEMM gives it: with rows in groups,
    one GEMM of the rows, each spread over the groups' K blocks with zeros outside its own,
    against every group's weights stacked along K.

    This does the groups' work ``groups`` times over (benchmarks/kernels.py's MoE workload on
    trn2: 1525 us where the grouped-GEMM kernel takes 184.5 us): what training graphs and
    offsets computed in the graph get (:func:`grouped_mm_kernel` says which take the
    kernel)."""
    if out_dtype not in (None, a.dtype) or a.dtype != b.dtype:
        return NotImplemented
    if offs is None:
        out = torch.bmm(a, b) if a.dim() == 3 and b.dim() == 3 else NotImplemented
    elif a.dim() == 2 and b.dim() == 3:  # rows of a in groups: (M, K) x (G, K, N) -> (M, N)
        # One GEMM over the groups' weights stacked along K, each row's K block of the other
        # groups zeroed: the zeros add nothing, and the output is never materialized per group.
        mask = _group_masks(offs, a.shape[0], a)
        blocks = a.unsqueeze(1) * mask.t().unsqueeze(2)  # (M, G, K)
        out = torch.matmul(blocks.reshape(a.shape[0], -1), b.reshape(-1, b.shape[2]))
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
    return grouped_mm_masked(x, weight, offs)  # type: ignore[return-value]


def transformers_grouped_mm_backward(
    x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Its backward: the input's gradient row groups times the weights transposed, and each
    expert's weight gradient its rows of ``x`` transposed times theirs of ``grad``."""
    grad_x = grouped_mm_masked(grad, weight.transpose(1, 2), offs)
    grad_w = grouped_mm_masked(x.t(), grad, offs)
    return grad_x, grad_w  # type: ignore[return-value]


def _along_last(t: torch.Tensor, index: torch.Tensor, dim: int) -> bool:
    """Whether ``index`` matches ``t`` in every dim but ``dim`` (the one-hot forms need it)."""
    return (
        t.dim() == index.dim()
        and t.dim() > 0
        and all(
            a == b for k, (a, b) in enumerate(zip(t.shape, index.shape, strict=True)) if k != dim
        )
    )


# Rows at least this long gather by position (an indirect DMA per element) rather than by a
# one-hot pass over every element: cross-entropy's pick of one logit per vocabulary row.
_GATHER_BY_POSITION_COLS = 1024


def gather(t: torch.Tensor, dim: int, index: torch.Tensor, sparse_grad: bool = False) -> object:
    """Compare with an iota (one-hot), select and sum: ``t[..., index[..., k]]`` (integer
    tables too: the one nonzero term of each sum is exact in the engines' fp32 below 2**24).
    For the few columns models gather from (top-k weights, token types) the one-hot pass is
    cheaper than an indirect DMA per element; from long rows (a vocabulary's logits) the
    elements are picked by row and position (advanced indexing: a gather of elements)."""
    dim = dim % max(t.dim(), 1)
    if t.dtype == torch.bool or not _along_last(t, index, dim):
        return NotImplemented
    x, idx = t.movedim(dim, -1), index.movedim(dim, -1)
    if x.shape[-1] >= _GATHER_BY_POSITION_COLS and idx.numel() > 0:
        rows = x.reshape(-1, x.shape[-1])
        at = idx.reshape(rows.shape[0], -1)
        row = torch.arange(rows.shape[0], device=t.device).unsqueeze(-1)
        return rows[row, at].reshape(idx.shape).movedim(-1, dim)
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
    """``t`` with ``src`` in a slice (a sliced view's backward): a concat. A strided slice
    (``step`` > 1) interleaves: the ``n * step`` elements from ``start`` seen as ``[n, step]``
    (``t`` padded when they run past its end) take ``src`` as their first column."""
    dim = dim % max(t.dim(), 1)
    size = t.shape[dim]
    lo = 0 if start is None else (start + size if start < 0 else start)
    lo = min(max(lo, 0), size)
    if step < 1 or t.dim() == 0:
        return NotImplemented
    n = src.shape[dim]
    src = src.to(t.dtype)
    if step > 1 and n > 0:
        width = n * step
        pad = max(lo + width - size, 0)
        if pad:
            shape = list(t.shape)
            shape[dim] = pad
            t = torch.cat([t, t.new_zeros(shape)], dim=dim)
        window = t.narrow(dim, lo, width).movedim(dim, -1)
        rows = window.reshape(*window.shape[:-1], n, step)
        rows = torch.cat([src.movedim(dim, -1).unsqueeze(-1), rows[..., 1:]], dim=-1)
        src = rows.reshape(window.shape).movedim(-1, dim)
        hi = lo + width
        pieces = [t.narrow(dim, 0, lo), src, t.narrow(dim, hi, size + pad - hi)]
        out = torch.cat([piece for piece in pieces if piece.shape[dim] > 0], dim=dim)
        return out.narrow(dim, 0, size) if pad else out
    hi = lo + n
    pieces = [t.narrow(dim, 0, lo), src, t.narrow(dim, hi, size - hi)]
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
    numel = t.numel()
    if isinstance(numel, int) and numel == 0 and t.is_floating_point() and dtype in (None, t.dtype):
        # Nothing to add up: 0, and 0 / 0 for the mean, as eager (a vecdot over an empty dim).
        return torch.full((), math.nan if mean else 0.0, dtype=t.dtype, device=t.device)
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
        if t.dim() and t.is_floating_point() and dtype in (None, t.dtype) and dim:
            reduced = {d % max(t.dim(), 1) for d in dim}
            if any(isinstance(t.shape[d], int) and t.shape[d] == 0 for d in reduced):
                # nothing to add up (see _whole_sum); sizes known only at run time never are
                shape = [1 if d in reduced else n for d, n in enumerate(t.shape)]
                out = torch.full(shape, math.nan if mean else 0.0, dtype=t.dtype, device=t.device)
                return (
                    out
                    if keepdim
                    else out.reshape([n for d, n in enumerate(t.shape) if d not in reduced])
                )
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
    over_channels = channels_last_layer_norm(x, normalized_shape, weight, bias, eps)
    if over_channels is not None:
        out, mean, rstd = over_channels
        if x.device.type in ("cpu", "mtia"):
            mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
        return out, mean, rstd
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


# -- ops core ATen keeps whole, as ops the device runs -------------------------------------


def _reversed(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n - 1, -1, -1, device=device)


def flip(t: torch.Tensor, dims: Sequence[int]) -> object:
    """Reversal along ``dims``: a gather of the rows in reverse order per dim (index_select,
    an indirect DMA), as a strided window cannot step backwards."""
    out = t
    for d in {d % max(t.dim(), 1) for d in dims}:
        if t.dim() == 0 or t.shape[d] <= 1:
            continue
        out = torch.index_select(out, d, _reversed(t.shape[d], t.device))
    return out.clone() if out is t else out


def im2col(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> object:
    """``F.unfold``: each kernel position's window of every block, ``[N, C * kh * kw, L]``;
    blocks that tile the input (kernel = stride, no padding or dilation: a ViT's patches) are
    one permute. Core ATen gathers every element by a computed index ([8, 64, 64, 64], 2 x 2
    blocks: 135.5 us, 5.5x a copy)."""
    batched = x.dim() == 4
    x = x if batched else x.unsqueeze(0)
    n, c, h, w = x.shape
    k, d = _pair(kernel_size, (1, 1)), _pair(dilation, (1, 1))
    p, s = _pair(padding, (0, 0)), _pair(stride, (1, 1))
    out = (
        _pool_size(h, k[0], s[0], p[0], d[0], False),
        _pool_size(w, k[1], s[1], p[1], d[1], False),
    )
    if k == s and d == (1, 1) and p == (0, 0) and (h, w) == (out[0] * k[0], out[1] * k[1]):
        cols = x.reshape(n, c, out[0], k[0], out[1], k[1]).permute(0, 1, 3, 5, 2, 4)
    else:
        xp = F.pad(x, (p[1], p[1], p[0], p[0]))
        windows = [_window(xp, i, j, s, d, out) for i in range(k[0]) for j in range(k[1])]
        cols = torch.stack(windows, 2)
    cols = cols.reshape(n, c * k[0] * k[1], out[0] * out[1])
    return cols if batched else cols.squeeze(0)


def col2im(
    cols: torch.Tensor,
    output_size: Sequence[int],
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> object:
    """``F.fold``: each block's kernel positions summed onto the output's positions by phase
    (col2im, :func:`_sum_back`), or one permute where the blocks tile the output. Core ATen scatters
    every element by a computed index ([8, 256, 1024] into 64 x 64: 622.4 us, 25x a copy)."""
    batched = cols.dim() == 3
    cols = cols if batched else cols.unsqueeze(0)
    size = _pair(output_size, (1, 1))
    k, d = _pair(kernel_size, (1, 1)), _pair(dilation, (1, 1))
    p, s = _pair(padding, (0, 0)), _pair(stride, (1, 1))
    out = (
        _pool_size(size[0], k[0], s[0], p[0], d[0], False),
        _pool_size(size[1], k[1], s[1], p[1], d[1], False),
    )
    n, rows, blocks = cols.shape
    if rows % (k[0] * k[1]) or blocks != out[0] * out[1]:
        return NotImplemented  # eager PyTorch reports the mismatch
    c = rows // (k[0] * k[1])
    shares = cols.reshape(n, c, k[0], k[1], out[0], out[1])
    if k == s and d == (1, 1) and p == (0, 0) and size == (out[0] * k[0], out[1] * k[1]):
        y = shares.permute(0, 1, 4, 2, 5, 3).reshape(n, c, *size)  # blocks tile the output
    else:
        parts = [(i, j, shares[:, :, i, j]) for i in range(k[0]) for j in range(k[1])]
        y = _sum_back(parts, s, d, size, p, cols.dtype)
    return y if batched else y.squeeze(0)


def roll(t: torch.Tensor, shifts: Sequence[int], dims: Sequence[int] = ()) -> object:
    """A rotation along each dim as its two slices concatenated (window copies). Core ATen
    gathers by computed indices instead, an indirect DMA through a transposed copy per dim
    (Swin's shifted windows over [8, 56, 56, 96] bf16: 12x a copy)."""
    if not dims:  # the flattened tensor rolled
        return torch.ops.aten.roll.default(t.flatten(), shifts, [0]).view(t.shape)
    out = t
    for shift, d in zip(shifts, dims, strict=True):
        n = t.shape[d]
        s = shift % n if n else 0
        if s:
            out = torch.cat([out.narrow(d, n - s, s), out.narrow(d, 0, n - s)], d)
    return out.clone() if out is t else out


def diagonal(t: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> object:
    """The diagonal as a strided window: the two dims moved last and flattened, then every
    ``(n2 + 1)``-th element from the first diagonal entry (a slice with a step)."""
    rank = t.dim()
    d1, d2 = dim1 % rank, dim2 % rank
    n1, n2 = t.shape[d1], t.shape[d2]
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    x = t.movedim((d1, d2), (-2, -1)).reshape(
        *[t.shape[k] for k in range(rank) if k not in (d1, d2)], n1 * n2
    )
    if length == 0:
        return x[..., :0].clone()
    start = offset if offset >= 0 else -offset * n2
    return x[..., start : start + (length - 1) * (n2 + 1) + 1 : n2 + 1]


_WHOLE = contextvars.ContextVar("torchneuron_kept_whole", default=False)


@contextlib.contextmanager
def _kept_whole() -> Iterator[None]:
    """Inside: the decompositions below that call their own op keep it whole (the importer
    lowers that form), instead of decomposing it again."""
    token = _WHOLE.set(True)
    try:
        yield
    finally:
        _WHOLE.reset(token)


def _pool_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size (a ceil_mode window must start inside the input)."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _ceil_padding(size: Pair, k: Pair, s: Pair, p: Pair, d: Pair, out: Pair) -> Pair:
    """Extra padding at the end so that ceil_mode's last windows fit the padded input."""
    return (
        max(0, (out[0] - 1) * s[0] + d[0] * (k[0] - 1) + 1 - (size[0] + 2 * p[0])),
        max(0, (out[1] - 1) * s[1] + d[1] * (k[1] - 1) + 1 - (size[1] + 2 * p[1])),
    )


def max_pool2d_with_indices(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> object:
    """Values: the importer's pooling windows (the op kept whole, on an input padded with
    -inf, ceil_mode's extra windows included). Indices, when the graph reads them: each
    window's first maximum in row-major order, as PyTorch's CPU kernel records it: the
    window positions compared with the maximum, last to first, each hit taking its flat
    input position."""
    if _WHOLE.get() or x.dim() not in (3, 4):
        return NotImplemented
    k = _pair(kernel_size, (1, 1))
    s, p, d = _pair(stride, k), _pair(padding, (0, 0)), _pair(dilation, (1, 1))
    size: Pair = (x.shape[-2], x.shape[-1])
    out = (
        _pool_size(size[0], k[0], s[0], p[0], d[0], ceil_mode),
        _pool_size(size[1], k[1], s[1], p[1], d[1], ceil_mode),
    )
    extra = _ceil_padding(size, k, s, p, d, out)
    pads = (p[1], p[1] + extra[1], p[0], p[0] + extra[0])
    xp = F.pad(x, pads, value=-math.inf) if any(pads) else x
    with _kept_whole():
        best = _aten.max_pool2d_with_indices.default(xp, list(k), list(s), [0, 0], list(d))[0]
    rows = torch.arange(out[0], device=x.device).unsqueeze(1) * s[0] - p[0]
    cols = torch.arange(out[1], device=x.device) * s[1] - p[1]
    index: torch.Tensor | None = None
    for i in reversed(range(k[0])):
        for j in reversed(range(k[1])):
            at = (rows + i * d[0]) * size[1] + (cols + j * d[1])
            hit = _window(xp, i, j, s, d, out) == best
            index = at.expand(hit.shape) if index is None else torch.where(hit, at, index)
    assert index is not None
    return best, index


def _adaptive_windows(size: int, out: int, device: torch.device) -> torch.Tensor:
    """[out, size] 0/1: row i marks adaptive window i, [floor(i size / out),
    ceil((i + 1) size / out))."""
    i = torch.arange(out, device=device).unsqueeze(1)
    start = torch.div(i * size, out, rounding_mode="floor")
    end = torch.div((i + 1) * size + out - 1, out, rounding_mode="floor")
    j = torch.arange(size, device=device)
    return ((j >= start) & (j < end)).to(torch.float32)


def _adaptive_avg_pool(x: torch.Tensor, output_size: Sequence[int]) -> object:
    """Adaptive average pooling with windows of different sizes: along each pooled dim, a
    matmul with the 0/1 window matrix (TensorE sums every window at once, in float32),
    then a division by the window sizes. Equal windows stay the importer's pooling."""
    spatial = len(output_size)
    sizes = x.shape[-spatial:]
    if spatial == 2 and all(n % o == 0 for n, o in zip(sizes, output_size, strict=True)):
        return NotImplemented
    if any(o <= 0 for o in output_size):
        return NotImplemented
    y = x.to(torch.float32)
    count: torch.Tensor | None = None
    for k, (n, o) in enumerate(zip(sizes, output_size, strict=True)):
        windows = _adaptive_windows(n, o, x.device)
        dim = x.dim() - spatial + k
        y = torch.matmul(y.movedim(dim, -1), windows.t()).movedim(-1, dim)
        shape = [1] * spatial
        shape[k] = o
        lengths = windows.sum(1).reshape(shape)
        count = lengths if count is None else count * lengths
    return (y / count).to(x.dtype)


def adaptive_avg_pool2d(x: torch.Tensor, output_size: Sequence[int]) -> object:
    return _adaptive_avg_pool(x, output_size)


def adaptive_avg_pool3d(x: torch.Tensor, output_size: Sequence[int]) -> object:
    return _adaptive_avg_pool(x, output_size)


def _adaptive_max_pool(x: torch.Tensor, output_size: Sequence[int]) -> object:
    """Adaptive max pooling (values and first-maximum indices): window position ``a`` of
    every window along a dim is a gather of rows ``min(start + a, end - 1)`` (a window
    shorter than the longest repeats its last row, which changes neither its maximum nor
    where that first occurs); the maximum over positions, then the first position holding
    it, last to first, as max pooling's indices."""
    spatial = len(output_size)
    sizes = list(x.shape[-spatial:])
    if any(o <= 0 for o in output_size) or x.numel() == 0:
        return NotImplemented
    rows: list[list[torch.Tensor]] = []  # per dim, per window position: [out] input rows
    for n, o in zip(sizes, output_size, strict=True):
        i = torch.arange(o, device=x.device)
        start = torch.div(i * n, o, rounding_mode="floor")
        end = torch.div((i + 1) * n + o - 1, o, rounding_mode="floor")
        longest = max(-(-(k + 1) * n // o) - (k * n // o) for k in range(o))
        rows.append([torch.minimum(start + a, end - 1) for a in range(longest)])
    positions = list(itertools.product(*(range(len(r)) for r in rows)))
    windows = []
    for position in positions:
        w = x
        for d, a in enumerate(position):
            w = torch.index_select(w, x.dim() - spatial + d, rows[d][a])
        windows.append(w)
    best = windows[0]
    for w in windows[1:]:
        best = torch.maximum(best, w)
    index: torch.Tensor | None = None
    for position, w in zip(reversed(positions), reversed(windows), strict=True):
        flat: torch.Tensor | None = None
        for d, a in enumerate(position):
            shape = [1] * spatial
            shape[d] = output_size[d]
            at = rows[d][a].reshape(shape)
            flat = at if flat is None else flat * sizes[d] + at
        assert flat is not None
        hit = (w == best) | torch.isnan(w)
        index = flat.expand(hit.shape) if index is None else torch.where(hit, flat, index)
    return best, index


def adaptive_max_pool2d(x: torch.Tensor, output_size: Sequence[int]) -> object:
    return _adaptive_max_pool(x, output_size)


def adaptive_max_pool3d(x: torch.Tensor, output_size: Sequence[int]) -> object:
    return _adaptive_max_pool(x, output_size)


def trilinear(
    i1: torch.Tensor,
    i2: torch.Tensor,
    i3: torch.Tensor,
    expand1: Sequence[int],
    expand2: Sequence[int],
    expand3: Sequence[int],
    sumdim: Sequence[int],
    unroll_dim: int = 1,
) -> object:
    """``_trilinear`` (bilinear layers): the three inputs broadcast by their expanded dims,
    multiplied and summed over ``sumdim``, its definition."""
    a, b, c = i1, i2, i3
    for d in sorted(expand1):
        a = a.unsqueeze(d)
    for d in sorted(expand2):
        b = b.unsqueeze(d)
    for d in sorted(expand3):
        c = c.unsqueeze(d)
    product = a * b * c
    return product.sum(list(sumdim)) if sumdim else product


def kthvalue(t: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False) -> object:
    """The k-th smallest along ``dim`` and its position: the device's top-k (smallest
    first), its last row."""
    if t.dim() == 0:
        return t.clone(), torch.zeros((), dtype=torch.int64, device=t.device)
    values, indices = torch.topk(t, k, dim, largest=False)
    dim = dim % t.dim()
    value, index = values.narrow(dim, k - 1, 1), indices.narrow(dim, k - 1, 1)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def median(t: torch.Tensor) -> object:
    """The lower median of every element ((n - 1) // 2-th smallest, by top-k); NaN if any
    element is NaN, as in eager."""
    if t.numel() == 0:
        return NotImplemented
    flat = t.reshape(-1)
    value = kthvalue(flat, (flat.numel() - 1) // 2 + 1, 0)[0]  # type: ignore[index]
    if not t.is_floating_point():
        return value
    return torch.where(torch.isnan(flat).any(), math.nan, value)


def median_dim(t: torch.Tensor, dim: int, keepdim: bool = False) -> object:
    """The lower median along ``dim`` and its position (by top-k; rows holding a NaN keep
    eager's NaN and its position)."""
    if t.dim() == 0:
        return t.clone(), torch.zeros((), dtype=torch.int64, device=t.device)
    dim = dim % t.dim()
    n = t.shape[dim]
    if n == 0:
        return NotImplemented
    value, index = kthvalue(t, (n - 1) // 2 + 1, dim, keepdim=True)  # type: ignore[misc]
    if t.is_floating_point():
        nan = torch.isnan(t)
        positions = torch.arange(n, device=t.device).reshape(
            [n if d == dim else 1 for d in range(t.dim())]
        )
        first_nan = torch.amin(torch.where(nan, positions, n), dim, keepdim=True)
        has_nan = first_nan < n
        value = torch.where(has_nan, math.nan, value)
        index = torch.where(has_nan, first_nan, index)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def nanmedian_dim(t: torch.Tensor, dim: int, keepdim: bool = False) -> object:
    """The lower median of the non-NaN values along ``dim``: sorted with NaN as +inf (the
    device's sort), then the element at (count - 1) // 2, picked by a one-hot gather; NaN
    where a row is all NaN."""
    if t.dim() == 0:
        return t.clone(), torch.zeros((), dtype=torch.int64, device=t.device)
    if not t.is_floating_point():
        return median_dim(t, dim, keepdim)
    dim = dim % t.dim()
    if t.shape[dim] == 0:
        return NotImplemented
    nan = torch.isnan(t)
    values, order = torch.sort(torch.where(nan, math.inf, t), dim=dim, stable=True)
    count = (~nan).sum(dim, keepdim=True)
    at = torch.clamp(torch.div(count - 1, 2, rounding_mode="floor"), min=0)
    value = torch.gather(values, dim, at)
    index = torch.gather(order, dim, at)
    value = torch.where(count == 0, math.nan, value)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def nanmedian(t: torch.Tensor) -> object:
    if t.numel() == 0:
        return NotImplemented
    found = nanmedian_dim(t.reshape(-1), 0)
    return found if found is NotImplemented else found[0]  # type: ignore[index]


@functools.cache
def _max_select() -> tuple[int, int]:
    """The longest row and the most work (k * n) the device's top-k/sort takes
    (``_C.MAX_SELECT``, the importer's own limits)."""
    from torchneuron._native import native

    limits = native().MAX_SELECT
    return int(limits["row"]), int(limits["work"])


def sort(
    t: torch.Tensor,
    dim: int = -1,
    descending: bool = False,
    *,
    stable: bool | None = False,
) -> object:
    """A sort along a row longer than the device's select rounds take (:func:`_max_select`):
    by rank. Each element's place is the number of elements that sort before it (smaller,
    or larger when descending; NaN after every number, before when descending) plus the
    equal ones at earlier positions, so the order is stable, as eager's CPU sort is. The
    sorted row then reads each place's element through a one-hot compare of the places with
    an iota and a max over the row (exact; -0.0 and NaN kept). n^2 compares per row on
    VectorE; shorter rows stay whole for the importer's select rounds, and rows whose n^2
    compares would spill to HBM go through :func:`_network_sort`."""
    if t.dim() == 0 or t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return NotImplemented
    if t.dtype != torch.float32 and not stable:
        # Thousands of 16-bit values hold many ties, which eager's unstable sort orders its own
        # way: the stable order is a valid answer, but not eager's, so these stay eager.
        return NotImplemented
    dim = dim % t.dim()
    n = t.shape[dim]
    row, work = _max_select()
    if not _known(t) or (n <= row and n * n <= work):
        return NotImplemented
    if t.numel() * n > _ONE_HOT_WORK:
        if n > _MAX_NETWORK_SORT:
            return NotImplemented
        values, indices = _network_sort(t.movedim(dim, -1).to(torch.float32), descending)
        return values.to(t.dtype).movedim(-1, dim), indices.movedim(-1, dim)
    x = t.movedim(dim, -1).to(torch.float32)  # exact; 16-bit [n, n] tiles overflow SBUF
    xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)  # [..., i, 1] and [..., 1, j]
    ahead = xj > xi if descending else xj < xi
    nan_i, nan_j = torch.isnan(xi), torch.isnan(xj)
    ahead = ahead | ((nan_j & ~nan_i) if descending else (nan_i & ~nan_j))
    same = (xj == xi) | (nan_i & nan_j)
    place = torch.arange(n, device=t.device)
    earlier = place.unsqueeze(0) < place.unsqueeze(1)  # [i, j]: j before i
    rank = (ahead | (same & earlier)).sum(-1)  # [..., i]
    onehot = rank.unsqueeze(-2) == place.unsqueeze(-1)  # [..., place, i]
    values = torch.where(onehot, x.unsqueeze(-2), -math.inf).amax(-1).to(t.dtype)
    indices = torch.where(onehot, place, -1).amax(-1)
    return values.movedim(-1, dim), indices.movedim(-1, dim)


#: The longest row :func:`_network_sort` sorts (a vocabulary of 128K tokens: top-p sampling).
_MAX_NETWORK_SORT = 1 << 17


def _network_sort(x: torch.Tensor, descending: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A bitonic sorting network along the last dim of float32 ``x``, for rows too long for
    the rank sort's n^2 compares: n log^2 n / 2 compare-exchanges in log n (log n + 1) / 2
    steps, each a whole-row VectorE select over the row viewed as [blocks, 2, d] (the pairs
    d apart, no gather). Each element carries its position; an element goes before another
    when its value does (NaN after every number, before when descending) or the values tie
    and its position is smaller: the order is stable, as eager's CPU sort, whatever the
    network does with ties. The row is padded to a power of two with positions past its end,
    which go after everything."""
    n = x.shape[-1]
    size = 1 << max(n - 1, 1).bit_length()
    lead = x.shape[:-1]
    position = torch.arange(size, device=x.device, dtype=torch.float32).expand(*lead, size)
    if size != n:
        x = torch.cat([x, x.new_zeros((*lead, size - n))], -1)

    def before(
        a: torch.Tensor, ia: torch.Tensor, b: torch.Tensor, ib: torch.Tensor
    ) -> torch.Tensor:
        """Whether element (a, ia) goes before (b, ib)."""
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        ahead = (a > b) if descending else (a < b)
        ahead = ahead | ((nan_a & ~nan_b) if descending else (nan_b & ~nan_a))
        tie = (a == b) | (nan_a & nan_b)
        order = ahead | (tie & (ia < ib))
        if size == n:
            return order
        pad_a, pad_b = ia >= n, ib >= n
        return torch.where(pad_a | pad_b, ~pad_a & (pad_b | (ia < ib)), order)

    steps = size.bit_length() - 1
    for stage in range(1, steps + 1):
        block = 1 << stage
        for d in (block >> j for j in range(1, stage + 1)):
            pairs = x.reshape(*lead, size // (2 * d), 2, d)
            places = position.reshape(*lead, size // (2 * d), 2, d)
            a, b = pairs[..., 0, :], pairs[..., 1, :]
            ia, ib = places[..., 0, :], places[..., 1, :]
            # Pairs in a block of ``block`` elements whose block index is odd sort the other
            # way: the bitonic sequences the next stage merges. Positions differ, so the
            # order is strict: "a before b" is "not b before a".
            first = torch.arange(size // (2 * d), device=x.device) * (2 * d)
            reverse = ((first // block) % 2 == 1).unsqueeze(-1)
            swap = before(b, ib, a, ia) ^ reverse
            low, high = torch.where(swap, b, a), torch.where(swap, a, b)
            ilow, ihigh = torch.where(swap, ib, ia), torch.where(swap, ia, ib)
            x = torch.stack([low, high], -2).reshape(*lead, size)
            position = torch.stack([ilow, ihigh], -2).reshape(*lead, size)
    return x[..., :n], position[..., :n].to(torch.int64)


_SEGMENT_IDENTITY = {"max": -math.inf, "min": math.inf, "sum": 0.0, "mean": 0.0, "prod": 1.0}


def segment_reduce(
    data: torch.Tensor,
    reduce: str,
    *,
    lengths: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: float | None = None,
) -> object:
    """Segments given by ``lengths`` or ``offsets`` along ``axis``, each reduced: which
    positions each segment holds (an iota compared with its start and end), every other
    position the reduction's identity, then one reduction over the axis. ``initial`` joins
    every segment's reduction; a mean divides by the segment's length only and an empty
    segment's mean is ``initial`` (NaN without one), as eager's CPU kernel."""
    if indices is not None or not data.is_floating_point() or reduce not in _SEGMENT_IDENTITY:
        return NotImplemented
    if not _known(data, *(x for x in (lengths, offsets) if x is not None)):
        return NotImplemented
    axis = axis % max(data.dim(), 1)
    if lengths is not None:
        ends = torch.cumsum(lengths, -1)
        starts, count = ends - lengths, lengths
    elif offsets is not None:
        starts, ends = offsets[..., :-1], offsets[..., 1:]
        count = ends - starts
    else:
        return NotImplemented
    if starts.dim() != axis + 1 or starts.numel() * data.numel() > _ONE_HOT_WORK:
        return NotImplemented
    n, post = data.shape[axis], data.dim() - axis - 1
    position = torch.arange(n, device=data.device)
    member = (position >= starts.unsqueeze(-1)) & (position < ends.unsqueeze(-1))  # [.., S, N]
    member = member.reshape(*member.shape, *([1] * post))
    values = torch.where(member, data.unsqueeze(axis), _SEGMENT_IDENTITY[reduce])
    if reduce == "max":
        out = values.amax(axis + 1)
    elif reduce == "min":
        out = values.amin(axis + 1)
    elif reduce == "prod":
        out = values.prod(axis + 1)
    else:
        out = values.sum(axis + 1)
    if initial is not None:
        out = {
            "max": torch.maximum,
            "min": torch.minimum,
            "prod": torch.mul,
        }.get(reduce, torch.add)(out, torch.full_like(out, initial))
    if reduce == "mean":
        count = count.reshape(*count.shape, *([1] * post))
        fill = math.nan if initial is None else initial
        out = torch.where(count > 0, out / count.clamp(min=1), fill)
    return out.to(data.dtype)


def nonzero_static(t: torch.Tensor, *, size: int, fill_value: int = -1) -> object:
    """The coordinates of the first ``size`` nonzero elements in row-major order, then rows of
    ``fill_value``: each nonzero's place is a running count of the mask (cumsum on TensorE);
    place k's coordinates are read through a one-hot compare of the places with an iota and
    a sum over the elements (a coordinate is an iota along its dim)."""
    if t.is_complex() or not _known(t):
        return NotImplemented
    rows = torch.full((size, t.dim()), fill_value, dtype=torch.int64, device=t.device)
    if size == 0 or t.numel() == 0 or t.dim() == 0:
        return rows  # no coordinates to find (a 0-d tensor's have no columns)
    if size * t.numel() > _ONE_HOT_WORK:
        return NotImplemented
    mask = (t != 0).reshape(-1)
    place = torch.cumsum(mask.to(torch.int64), 0) - 1
    slots = torch.arange(size, device=t.device).unsqueeze(1)
    onehot = (place.unsqueeze(0) == slots) & mask.unsqueeze(0)  # [size, numel]
    found = onehot.any(1, keepdim=True)
    coords = []
    for d, n in enumerate(t.shape):
        along = torch.arange(n, device=t.device).reshape(
            [n if e == d else 1 for e in range(t.dim())]
        )
        coord = along.expand(t.shape).reshape(-1)
        coords.append(torch.where(onehot, coord, 0).sum(1, keepdim=True))
    return torch.where(found, torch.cat(coords, 1), rows)


def _grid_source(coord: torch.Tensor, size: int, align_corners: bool, border: bool) -> torch.Tensor:
    """A grid coordinate in [-1, 1] as a position along a dim of ``size`` pixels, as eager's
    CPU grid sampler scales it (clipped into the image for ``padding_mode="border"``)."""
    if align_corners:
        x = (coord + 1) * ((size - 1) / 2)
    else:
        x = (coord + 1) * (size / 2) - 0.5
    return x.clamp(0, size - 1) if border else x


def grid_sampler(
    x: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> object:
    """``grid_sample`` of a 4-d or 5-d input, (bi/tri)linear or nearest, with zero or border
    padding: each output pixel reads its source pixels as rows of the image with a pixel per
    row (index_select: a gather of rows by indirect DMA), weighted by the linear weights
    (in eager's order of corners and factors), a pixel outside the image weighing 0. Bicubic
    and reflection padding stay whole, and so do 16-bit inputs: eager rounds every step of
    their coordinates to 16 bits, which moves a nearest neighbour or a linear weight by more
    than an ulp of the result."""
    linear, nearest = interpolation_mode == 0, interpolation_mode == 1
    if x.dim() not in (4, 5) or x.dtype != torch.float32 or grid.dtype != torch.float32:
        return NotImplemented
    if not (linear or nearest) or padding_mode not in (0, 1) or not _known(x, grid):
        return NotImplemented
    if x.numel() == 0:
        return NotImplemented
    if grid.numel() == 0:
        return NotImplemented
    n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    dims = len(spatial)
    out_shape = list(grid.shape[1:-1])
    # grid's last dim lists x (the last spatial dim) first
    source = [
        _grid_source(grid[..., dims - 1 - d], spatial[d], align_corners, padding_mode == 1)
        for d in range(dims)
    ]
    pixels = math.prod(spatial)
    image = x.reshape(n, c, pixels).transpose(1, 2).reshape(n * pixels, c)  # a row per pixel
    strides = [math.prod(spatial[d + 1 :]) for d in range(dims)]
    batch = (torch.arange(n, device=x.device) * pixels).reshape([n] + [1] * len(out_shape))

    def read(points: list[torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
        inside = functools.reduce(
            torch.logical_and,
            [(p >= 0) & (p <= size - 1) for p, size in zip(points, spatial, strict=True)],
        )
        at = sum(
            p.clamp(0, size - 1) * st for p, size, st in zip(points, spatial, strides, strict=True)
        )
        at = cast(torch.Tensor, at).to(torch.int64) + batch
        rows = torch.index_select(image, 0, at.reshape(-1)).reshape(*at.shape, c)
        values = rows.movedim(-1, 1)  # [n, c, *out]
        return torch.where(inside.unsqueeze(1), values * weight.unsqueeze(1), 0.0)

    if nearest:  # half to even, as nearbyint
        return read([torch.round(p) for p in source], torch.ones_like(source[0]))
    low = [torch.floor(p) for p in source]
    high = [f + 1 for f in low]
    out: torch.Tensor | None = None
    for corner in itertools.product((0, 1), repeat=dims):
        points = [high[d] if bit else low[d] for d, bit in enumerate(corner)]
        factors = [
            source[d] - low[d] if bit else high[d] - source[d] for d, bit in enumerate(corner)
        ]
        weight = functools.reduce(torch.mul, factors[::-1])  # x's factor first, as eager
        part = read(points, weight)
        out = part if out is None else out + part
    return out


def _antialias_weights(
    size: int, out: int, align_corners: bool, scale: float | None, device: torch.device
) -> torch.Tensor:
    """``[out, size]``: each output position's weights over the input along one dim, as
    PyTorch's antialiased bilinear resampling defines them: a triangle filter centred at
    ``scale * (i + 0.5)``, widened by the scale when downsampling, cut to the pixels within
    its support and normalized to sum 1."""
    if align_corners:
        ratio = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else size / out
    support = ratio if ratio >= 1.0 else 1.0
    stretch = 1.0 / ratio if ratio >= 1.0 else 1.0
    i = torch.arange(out, device=device, dtype=torch.float32).unsqueeze(1)
    j = torch.arange(size, device=device, dtype=torch.float32)
    center = ratio * (i + 0.5)
    first = torch.clamp(torch.floor(center - support + 0.5), min=0)
    last = torch.clamp(torch.floor(center + support + 0.5), max=size)
    weights = torch.clamp(1 - ((j - center + 0.5) * stretch).abs(), min=0)
    weights = torch.where((j >= first) & (j < last), weights, 0.0)
    total = weights.sum(1, keepdim=True)
    return weights / torch.where(total == 0, 1.0, total)


#: Channels per group the device's group norm takes (``kGroupNormMaxChannels`` in
#: dialects/neuron/NeuronDialect.h: a step of its lowering holds whole groups on the
#: partitions).
GROUP_NORM_MAX_CHANNELS = 128


def group_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    n: int,
    c: int,
    inner: int,
    groups: int,
    eps: float,
) -> object:
    """``native_group_norm`` stays whole for the device's kernel (``neuron.group_norm``, one
    pass over the input where a step's rows fit SBUF) where a group has at most
    :data:`GROUP_NORM_MAX_CHANNELS` channels; otherwise PyTorch's decomposition (its
    reductions over rows longer than SBUF wrote float32 copies of the input through HBM)."""
    whole = (
        x.dim() >= 2
        and _known(x)
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and all(t is None or t.dtype == x.dtype for t in (weight, bias))
        and isinstance(groups, int)
        and groups >= 1
        and x.shape[1] % groups == 0
        and x.shape[1] // groups <= GROUP_NORM_MAX_CHANNELS
    )
    if whole:
        return NotImplemented
    return torch._refs.native_group_norm(x, weight, bias, n, c, inner, groups, eps)


def _nearest_repeats(
    x: torch.Tensor, output_size: Sequence[int] | None, scales: Sequence[float | None]
) -> tuple[int, ...] | None:
    """How many times nearest resizing repeats each input position along the last
    ``len(scales)`` dims, where it repeats each one a power-of-two number of times (the
    source index ``floor(dst * scale)`` is then exact in float, as PyTorch computes it, and
    the same for ``nearest-exact``); None otherwise."""
    dims = len(scales)
    sizes = x.shape[-dims:]
    if output_size is None:
        if any(s is None for s in scales):
            return None
        output_size = [int(n * s) for n, s in zip(sizes, scales, strict=True)]  # type: ignore[operator]
    if len(output_size) != dims:
        return None
    repeats = []
    for n, out, scale in zip(sizes, output_size, scales, strict=True):
        if not isinstance(n, int) or not isinstance(out, int) or n <= 0 or out % n:
            return None
        r = out // n
        if r & (r - 1) or (scale is not None and scale != r):
            return None
        repeats.append(r)
    return tuple(repeats)


def repeat_blocks(x: torch.Tensor, repeats: Sequence[int]) -> torch.Tensor:
    """Each position of ``x``'s last ``len(repeats)`` dims repeated into a block (nearest
    resizing by whole factors) as an expand and a reshape, which the device expands on chip
    in runs."""
    lead = list(x.shape[: x.dim() - len(repeats)])
    sizes = x.shape[len(lead) :]
    blocks = x
    for i in range(len(repeats)):  # [..., n0, 1, n1, 1, ...]
        blocks = blocks.unsqueeze(len(lead) + 2 * i + 1)
    shape = [d for n, r in zip(sizes, repeats, strict=True) for d in (n, r)]
    out = [n * r for n, r in zip(sizes, repeats, strict=True)]
    return blocks.expand(*lead, *shape).reshape(*lead, *out)


def upsample_nearest(
    x: torch.Tensor, output_size: Sequence[int] | None, scales: Sequence[float | None]
) -> object:
    """Nearest resizing by whole factors (a UNet's or an FPN's 2x) as :func:`repeat_blocks`:
    PyTorch's decomposition gathers every output element by a computed index."""
    repeats = _nearest_repeats(x, output_size, scales)
    if repeats is None or x.dim() < len(scales) + 1:
        return NotImplemented
    return repeat_blocks(x, repeats)


def nearest_resizing(gm: torch.fx.GraphModule) -> int:
    """``F.interpolate`` in ``nearest`` or ``nearest-exact`` mode by whole power-of-two
    factors, in Dynamo's graph before ``aot_autograd`` traces it, as :func:`repeat_blocks`:
    its ATen ops (``upsample_nearest2d.vec``) are composite and decompose to an index gather
    before the decomposition table is consulted. Returns how many calls it rewrote."""
    import inspect

    signature = inspect.signature(F.interpolate)
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.interpolate:
            continue
        args = signature.bind(*node.args, **node.kwargs).arguments
        x = args["input"]
        value = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
        if args.get("mode", "nearest") not in ("nearest", "nearest-exact") or not isinstance(
            value, torch.Tensor
        ):
            continue
        dims = value.dim() - 2
        size, factor = args.get("size"), args.get("scale_factor")
        if dims < 1 or not all(isinstance(n, int) for n in value.shape):
            continue
        output_size: list[Any] | None = None
        scales: list[Any] = [None] * dims
        if size is not None:
            output_size = [size] * dims if isinstance(size, int) else list(size)
        elif factor is not None:
            factors = list(factor) if isinstance(factor, (list, tuple)) else [factor] * dims
            if len(factors) != dims or not all(isinstance(f, (int, float)) for f in factors):
                continue
            output_size = [math.floor(n * f) for n, f in zip(value.shape[2:], factors, strict=True)]
            if not args.get("recompute_scale_factor"):
                scales = [float(f) for f in factors]
        if output_size is None or len(output_size) != dims:
            continue
        repeats = _nearest_repeats(value, output_size, scales)
        if repeats is None:
            continue
        replace_call(gm, node, repeat_blocks, (x, repeats))
        count += 1
    if count:
        gm.recompile()
    return count


def replace_call(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
) -> torch.fx.Node:
    """A Dynamo-graph rewrite's step: ``node`` replaced by a call of ``fn``, which keeps its
    metadata (example value, source line)."""
    with gm.graph.inserting_before(node):
        call = gm.graph.call_function(fn, args, kwargs)
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    gm.graph.erase_node(node)
    return call


def _nearest(dims: int, vec: bool) -> Callable[..., object]:
    """``upsample_nearest{dims}d`` (and ``_upsample_nearest_exact``): the ``.vec`` overload
    takes a list of scale factors, the default one a scale per dim, trailing ones omitted."""

    def upsample(x: torch.Tensor, output_size: Sequence[int] | None, *rest: object) -> object:
        if vec:
            factors = cast("Sequence[float] | None", rest[0] if rest else None)
            scales = list(factors) if factors is not None else [None] * dims
        else:
            scales = list(cast("Sequence[float | None]", rest)) + [None] * (dims - len(rest))
        return upsample_nearest(x, output_size, scales)

    return upsample


def upsample_bilinear2d_aa(
    x: torch.Tensor,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> object:
    """Antialiased bilinear resizing: separable, so two matmuls with each dim's weight
    matrix (:func:`_antialias_weights`), in float32 on TensorE."""
    if x.dim() != 4 or x.dtype != torch.float32 or not _known(x):
        return NotImplemented
    if not all(isinstance(n, int) for n in output_size) or min(output_size) <= 0:
        return NotImplemented
    if x.numel() == 0:
        return NotImplemented
    rows = _antialias_weights(x.shape[2], output_size[0], align_corners, scales_h, x.device)
    cols = _antialias_weights(x.shape[3], output_size[1], align_corners, scales_w, x.device)
    return torch.matmul(torch.matmul(rows, x), cols.t())


def embedding_bag_forward_only(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: torch.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> object:
    """``embedding_bag`` (inference) summing or averaging its bags: the rows by a gather
    (index_select, indirect DMA), each bag's rows summed by a TensorE matmul with a one-hot
    bag-membership matrix (each index's bag: how many bag starts it reaches, by compares);
    padding indices and, with ``include_last_offset``, indices past the last offset belong
    to no bag; an empty bag is 0. The other results as eager's CPU kernel gives them
    (``offset2bag``, ``bag_size``, ``max_indices``). Max bags stay whole."""
    if mode not in (0, 1) or indices.dim() != 1 or offsets.dim() != 1:
        return NotImplemented
    if not _known(weight, indices, offsets):
        return NotImplemented
    if weight.dtype != torch.float32 or weight.dim() != 2:
        return NotImplemented
    if include_last_offset and (mode != 0 or padding_idx >= 0):
        return NotImplemented  # eager's auxiliary results differ in shape there
    n = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    if n * bags > _ONE_HOT_WORK:
        return NotImplemented
    position = torch.arange(n, device=weight.device)
    bag = (position.unsqueeze(1) >= offsets[:bags]).sum(1) - 1  # [n]
    valid = torch.ones_like(position, dtype=torch.bool)
    if include_last_offset:
        valid = position < offsets[-1]
    if padding_idx >= 0:
        valid = valid & (indices != padding_idx)
    member = (bag == torch.arange(bags, device=weight.device).unsqueeze(1)) & valid
    rows = torch.index_select(weight, 0, indices)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(rows.dtype).unsqueeze(1)
    out = torch.matmul(member.to(rows.dtype), rows)
    counts = member.sum(1)
    if mode == 1:
        out = out / counts.clamp(min=1).unsqueeze(1).to(out.dtype)
        return out, bag, counts, counts.clone()
    zeros = torch.zeros(offsets.shape[0], dtype=torch.int64, device=weight.device)
    offset2bag = bag if padding_idx >= 0 else bag[:0]
    return out, offset2bag, zeros, zeros.clone()


def diagonal_scatter(
    t: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> object:
    """``t`` with ``src`` on its diagonal: a select between ``t`` and ``src`` laid along the
    rows (padded to every row), where column - row == offset."""
    rank = t.dim()
    d1, d2 = dim1 % rank, dim2 % rank
    x = t.movedim((d1, d2), (-2, -1))
    n1, n2 = x.shape[-2:]
    first_row = max(0, -offset)
    length = src.shape[-1]
    rows = torch.arange(n1, device=t.device).unsqueeze(1)
    cols = torch.arange(n2, device=t.device)
    on_diagonal = cols - rows == offset
    pad = (first_row, n1 - first_row - length)
    along_rows = F.pad(src.to(t.dtype), pad) if any(pad) else src.to(t.dtype)
    out = torch.where(on_diagonal, along_rows.unsqueeze(-1), x)
    return out.movedim((-2, -1), (d1, d2))


def unfold(t: torch.Tensor, dim: int, size: int, step: int) -> object:
    """``t.unfold(dim, size, step)``: one gather of every window's elements along ``dim``
    (window-major), reshaped to [windows, size] and the size dim moved last."""
    if t.dim() == 0:
        return t.reshape(1).clone()
    dim = dim % t.dim()
    windows = (t.shape[dim] - size) // step + 1
    starts = torch.arange(windows, device=t.device) * step
    index = (starts.unsqueeze(1) + torch.arange(size, device=t.device)).reshape(-1)
    picked = torch.index_select(t, dim, index)
    shape = (*t.shape[:dim], windows, size, *t.shape[dim + 1 :])
    return picked.reshape(shape).movedim(dim + 1, -1)


def _shifted(x: torch.Tensor, dim: int, by: int, fill: torch.Tensor) -> torch.Tensor:
    """``x`` moved ``by`` places forward along ``dim``, ``fill`` in the places it left."""
    head = fill.expand(*x.shape[:dim], by, *x.shape[dim + 1 :])
    return torch.cat([head, x.narrow(dim, 0, x.shape[dim] - by)], dim=dim)


def _scan(
    x: torch.Tensor,
    dim: int,
    combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    identity: float,
) -> torch.Tensor:
    """Inclusive scan by doubling (Hillis-Steele): ceil(log2 n) steps, each one elementwise
    ``combine`` of ``x`` with itself shifted by 1, 2, 4, ... places. Whole-tensor VectorE
    passes instead of one step per element; exact for max/min, a balanced product order
    (error ~log2(n) ulp, like a pairwise sum) for multiplication."""
    if x.shape[dim] <= 1:
        return x.clone()
    fill = torch.full((), identity, dtype=x.dtype, device=x.device)
    by = 1
    while by < x.shape[dim]:
        x = combine(_shifted(x, dim, by, fill), x)
        by *= 2
    return x


def cumprod(t: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> object:
    """Cumulative product: a doubling scan of multiplications (:func:`_scan`)."""
    x = t.to(dtype) if dtype is not None else t
    if not x.is_floating_point():
        return NotImplemented
    if x.dim() == 0:
        return x.clone()
    # 16-bit types accumulate in float32 and round once, as PyTorch's CPU kernel does
    return _scan(x.to(_accumulation_dtype(x)), dim % x.dim(), torch.mul, 1.0).to(x.dtype)


def logcumsumexp(t: torch.Tensor, dim: int) -> object:
    """log(cumsum(exp(x))): a doubling scan of ``logaddexp``, which never leaves the log
    domain (a shift by the maximum would underflow the terms far below it)."""
    if not t.is_floating_point():
        return NotImplemented
    if t.dim() == 0:
        return t.clone()
    wide = t.to(_accumulation_dtype(t))
    return _scan(wide, dim % t.dim(), torch.logaddexp, -math.inf).to(t.dtype)


def _cumulative_extreme(largest: bool) -> Callable[..., object]:
    def scan(t: torch.Tensor, dim: int) -> object:
        """(running max/min, the last position it was reached at): a doubling scan of
        (value, index) pairs; the later element wins ties, as in PyTorch's kernel, and a NaN,
        once seen, stays."""
        if t.dim() == 0:
            return t.clone(), torch.zeros((), dtype=torch.int64, device=t.device)
        dim = dim % t.dim()
        n = t.shape[dim]
        shape = [1] * t.dim()
        shape[dim] = n
        index = torch.arange(n, device=t.device).reshape(shape).expand(t.shape)
        values, at = t, index
        by = 1
        while by < n:
            v0 = values.narrow(dim, 0, n - by)
            i0 = at.narrow(dim, 0, n - by)
            v1 = values.narrow(dim, by, n - by)
            i1 = at.narrow(dim, by, n - by)
            better = (v0 > v1) if largest else (v0 < v1)
            # the earlier part wins only when strictly better or a NaN (NaNs propagate)
            earlier = better | (torch.isnan(v0) & ~torch.isnan(v1))
            v = torch.where(earlier, v0, v1)
            i = torch.where(earlier, i0, i1)
            values = torch.cat([values.narrow(dim, 0, by), v], dim=dim)
            at = torch.cat([at.narrow(dim, 0, by), i], dim=dim)
            by *= 2
        return values, at

    return scan


# The bytes of a row a fused group holds per partition (the fusion's row-bytes). Longer rows
# (a vocabulary's logits) that a reduction runs along go in blocks that fit.
_ROW_BYTES = 16384


def row_blocks(n: int, element_bytes: int = 4) -> int | None:
    """The fewest blocks an ``n``-element row splits into evenly, each within ``_ROW_BYTES``
    of ``element_bytes`` elements and at least a quarter of that (shorter blocks would pay
    more per-step costs than the split saves); any divisor, so GPT-2's 50257 classes go as
    29 blocks of 1733. None when the row fits whole or no such split exists."""
    most = _ROW_BYTES // element_bytes
    if n <= most:
        return None
    fewest = -(-n // most)
    return next((b for b in range(fewest, n // (most // 4) + 1) if n % b == 0), None)


def _softmax(log: bool) -> Callable[..., object]:
    def softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> object:
        """Softmax (``log``: log-softmax) as PyTorch decomposes it, over rows too long for a
        fused group (a vocabulary's) in blocks: each block's max and sum of exponentials,
        then the row's; the row's values broadcast to each block first ([..., blocks, 1]),
        so that every group goes by rows of a block (one row broadcast over a whole long
        row would have materialized every intermediate at float32)."""
        from torch._decomp import decompositions as torch_decompositions

        dim = dim % max(x.dim(), 1)
        blocks = row_blocks(x.shape[dim]) if x.dim() else None
        if blocks is None:
            whole = torch_decompositions._log_softmax if log else torch_decompositions._softmax
            return whole(x, dim, half_to_float)
        out_dtype = torch.float32 if half_to_float else x.dtype
        xt = x.movedim(dim, -1)
        lead = xt.shape[:-1]
        xb = xt.reshape(*lead, blocks, xt.shape[-1] // blocks)
        # The max in x's dtype (exact), the rest in float32 by type promotion of each use
        # (one cast of x read by every pass would be stored at float32 for the others).
        m = xb.amax(-1, keepdim=True).amax(-2, keepdim=True).to(torch.float32)
        m = m.expand(*lead, blocks, 1)
        s = torch.exp(xb - m).sum(-1, keepdim=True).sum(-2, keepdim=True)
        s = s.expand(*lead, blocks, 1)
        out = xb - (m + torch.log(s)) if log else torch.exp(xb - m) / s
        return out.reshape(xt.shape).to(out_dtype).movedim(-1, dim)

    return softmax


def _dim_extreme(largest: bool) -> Callable[..., object]:
    def reduce(t: torch.Tensor, dim: int, keepdim: bool = False) -> object:
        """(max/min along ``dim``, the first position holding it): amax, then the smallest
        position where the element equals it (a NaN is the extreme, as in eager). Rows too
        long for a fused group go in blocks: each block's extreme and first position, then
        the first block holding the row's extreme and its position there."""
        if t.dim() == 0:
            return t.clone(), torch.zeros((), dtype=torch.int64, device=t.device)
        if t.dtype == torch.bool:
            return NotImplemented
        dim = dim % t.dim()
        n = t.shape[dim]
        if (blocks := row_blocks(n, torch.int64.itemsize)) is not None:  # positions
            xt = t.movedim(dim, -1)
            xb = xt.reshape(*xt.shape[:-1], blocks, n // blocks)
            block_values, block_firsts = reduce(xb, -1)  # type: ignore[misc]
            v, b = reduce(block_values, -1, True)  # type: ignore[misc]
            first = b * (n // blocks) + torch.gather(block_firsts, -1, b)
            v, first = v.movedim(-1, dim), first.movedim(-1, dim)
            return (v, first) if keepdim else (v.squeeze(dim), first.squeeze(dim))
        m = (torch.amax if largest else torch.amin)(t, dim, keepdim=True)
        shape = [1] * t.dim()
        shape[dim] = n
        index = torch.arange(n, device=t.device).reshape(shape)
        hit = (t == m) | torch.isnan(t) if t.is_floating_point() else t == m
        first = torch.amin(torch.where(hit, index, n), dim, keepdim=True)
        if not keepdim:
            return m.squeeze(dim), first.squeeze(dim)
        return m, first

    return reduce


def _arg_extreme(largest: bool) -> Callable[..., object]:
    reduce = _dim_extreme(largest)

    def arg(t: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> object:
        """The first position of the max/min (over every element when ``dim`` is None)."""
        if dim is None:
            found = reduce(t.reshape(-1), 0, False)
            if found is NotImplemented:
                return found
            first = found[1]  # type: ignore[index]
            return first.reshape([1] * t.dim()) if keepdim else first
        found = reduce(t, dim, keepdim)
        return found if found is NotImplemented else found[1]  # type: ignore[index]

    return arg


def copy(t: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> object:
    """``t.copy_(src)`` made functional (a slice assignment): ``src`` in ``t``'s dtype,
    broadcast to its shape."""
    return src.to(t.dtype).expand(t.shape).clone()


def empty_strided(
    size: Sequence[int],
    stride: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    layout: object = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> object:
    """Uninitialized memory may hold anything: zeros, as ``empty`` in the importer."""
    return torch.zeros(size, dtype=dtype, device=device)


def addbmm(
    t: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, *, beta: float = 1, alpha: float = 1
) -> object:
    """beta * t + alpha * sum_b b1[b] @ b2[b]: one matmul contracting batch and k together.
    16-bit types accumulate batch by batch in float32, rounding after each, as PyTorch's
    CPU kernel does (one addmm per batch)."""
    if b1.dtype in (torch.bfloat16, torch.float16):
        base = t.to(torch.float32) * beta if beta != 0 else t.new_zeros((), dtype=torch.float32)
        acc = base.to(t.dtype)
        acc = acc.expand(b1.shape[1], b2.shape[2])
        for b in range(b1.shape[0]):
            step = torch.matmul(b1[b].to(torch.float32), b2[b].to(torch.float32))
            acc = (acc.to(torch.float32) + alpha * step).to(t.dtype)
        return acc
    n = b1.shape[1]
    product = torch.matmul(b1.transpose(0, 1).reshape(n, -1), b2.reshape(-1, b2.shape[2]))
    out = product if alpha == 1 else alpha * product
    if beta == 0:
        return out.expand(t.shape[:-2] + out.shape) if t.dim() > 2 else out
    return (t if beta == 1 else beta * t) + out


def put(
    t: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False
) -> object:
    """``t.put_(index, source)``: an index_put into the flattened tensor."""
    flat = index_put(t.reshape(-1), [index.reshape(-1)], source.reshape(-1), accumulate)
    return flat if flat is NotImplemented else flat.reshape(t.shape)  # type: ignore[union-attr]


def _strided_positions(
    t: torch.Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None
) -> torch.Tensor | None:
    """Where each element of ``t.as_strided(size, stride, storage_offset)`` lies in
    ``t.reshape(-1)``: storage_offset + sum_d i_d stride_d, an iota sum. None (the op stays
    whole) unless ``t`` is its storage from offset 0 in row-major order and every position
    falls inside it; elsewhere as_strided reads memory the graph does not see as ``t``."""
    offset = t.storage_offset() if storage_offset is None else storage_offset
    if not all(isinstance(v, int) for v in [*size, *stride, offset, *t.shape]):
        return None
    if not t.is_contiguous() or t.storage_offset() != 0 or math.prod(size) == 0:
        return None
    if offset < 0 or any(st < 0 for st in stride):
        return None
    if offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True)) >= t.numel():
        return None
    positions = torch.full(list(size), offset, dtype=torch.int64, device=t.device)
    for d, (n, st) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[d] = n
        positions = positions + torch.arange(n, device=t.device).reshape(shape) * st
    return positions


def as_strided_copy(
    t: torch.Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None
) -> object:
    """``t.as_strided(...)`` materialized: one gather of the strided positions."""
    positions = _strided_positions(t, size, stride, storage_offset)
    if positions is None:
        return NotImplemented
    return torch.index_select(t.reshape(-1), 0, positions.reshape(-1)).reshape(list(size))


def _without_overlap(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether no two elements of a strided window share a position: with the dims sorted by
    stride, each stride passes the last position the smaller ones reach."""
    reach = 0
    dims = [(st, n) for n, st in zip(size, stride, strict=True) if n > 1]
    for st, n in sorted(dims):
        if st <= reach:
            return False
        reach += (n - 1) * st
    return True


def as_strided_scatter(
    t: torch.Tensor,
    src: torch.Tensor,
    size: Sequence[int],
    stride: Sequence[int],
    storage_offset: int | None = None,
) -> object:
    """``t`` with ``src`` written through ``t.as_strided(...)``: a put at the strided positions.
    Windows whose elements overlap stay whole: eager refuses some (stride 0) and leaves the
    order of the others' writes to its copy."""
    positions = _strided_positions(t, size, stride, storage_offset)
    if positions is None or not _without_overlap(size, stride):
        return NotImplemented
    return put(t, positions, src.to(t.dtype).expand(list(size)))


def masked_scatter(t: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> object:
    """The masked positions take ``source``'s elements in order: the k-th set position reads
    source element k, with k a running count of the mask (cumsum on TensorE) and the read
    a gather (index_select)."""
    t, mask = torch.broadcast_tensors(t, mask)
    flat_mask = mask.reshape(-1)
    if flat_mask.numel() == 0:
        return t.clone()
    order = torch.cumsum(flat_mask.to(torch.int64), 0) - 1
    picked = torch.index_select(source.reshape(-1), 0, torch.clamp(order, min=0))
    return torch.where(flat_mask, picked.to(t.dtype), t.reshape(-1)).reshape(t.shape)


def searchsorted(
    sorted_sequence: torch.Tensor,
    values: torch.Tensor,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: torch.Tensor | None = None,
) -> object:
    """The insertion point of each value: how many boundaries lie below it (a compare with
    every boundary and a sum)."""
    if sorted_sequence.dim() == 0:
        return NotImplemented
    right = right or side == "right"
    seq = sorted_sequence
    if seq.shape[-1] == 0 or values.numel() == 0:  # no boundaries: every value goes first
        return torch.zeros(values.shape, dtype=torch.int32 if out_int32 else torch.int64)
    if sorter is not None:  # the sequence in sorted order
        seq = torch.gather(seq, -1, sorter)
    if seq.dim() == 1:
        below = (seq <= values.unsqueeze(-1)) if right else (seq < values.unsqueeze(-1))
    elif seq.shape[:-1] == values.shape[:-1]:
        s, v = seq.unsqueeze(-2), values.unsqueeze(-1)
        below = (s <= v) if right else (s < v)
    else:
        return NotImplemented
    return below.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


def bucketize(
    t: torch.Tensor, boundaries: torch.Tensor, *, out_int32: bool = False, right: bool = False
) -> object:
    """The bucket of each value: :func:`searchsorted` of the value among the boundaries."""
    return searchsorted(boundaries, t, out_int32=out_int32, right=right)


def _pairwise_distance(x: torch.Tensor, y: torch.Tensor, p: float) -> torch.Tensor:
    """The p-norm of every row difference: [..., r1, r2]."""
    diff = (x.unsqueeze(-2) - y.unsqueeze(-3)).abs()
    if p == 0:
        return (diff != 0).sum(-1).to(x.dtype)
    if math.isinf(p):
        return diff.amax(-1)
    if p == 1:
        return diff.sum(-1)
    if p == 2:
        return torch.sqrt((diff * diff).sum(-1))
    return diff.pow(p).sum(-1).pow(1.0 / p)


def cdist_forward(
    x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None
) -> object:
    """Pairwise p-norm distances from the row differences (not the |x|^2 + |y|^2 - 2xy
    matmul form, which cancels for near points)."""
    return _pairwise_distance(x1, x2, p)


def pdist_forward(t: torch.Tensor, p: float = 2) -> object:
    """Distances of every row pair i < j, in row-major order: the full distance matrix's
    upper triangle, picked by a gather."""
    n = t.shape[0]
    if n < 2:
        return t.new_zeros((0,))
    full = _pairwise_distance(t, t, p).reshape(-1)
    # pair q lies in row i = the number of rows r >= 1 whose first pair s_r is <= q, where
    # s_r = r n - r (r + 1) / 2; its column is j = q - s_i + i + 1.
    q = torch.arange(n * (n - 1) // 2, device=t.device)
    r = torch.arange(n, device=t.device)
    starts = r * n - torch.div(r * (r + 1), 2, rounding_mode="floor")
    row = (q.unsqueeze(1) >= starts[1:]).sum(1)
    first = row * n - torch.div(row * (row + 1), 2, rounding_mode="floor")
    col = q - first + row + 1
    return torch.index_select(full, 0, row * n + col)


_REDUCE_FILL = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "amax": -math.inf, "amin": math.inf}


def _one_hot_reduce(
    x: torch.Tensor,
    hit: torch.Tensor,
    src: torch.Tensor,
    reduce: str,
    include_self: bool,
) -> torch.Tensor:
    """``x[..., n]`` combined with every ``src[..., m]`` whose ``hit[..., m, n]`` holds."""
    fill = _REDUCE_FILL[reduce]
    spread = torch.where(hit, src.unsqueeze(-1), fill)
    if reduce in ("sum", "mean"):
        combined = spread.sum(-2)
    elif reduce == "prod":
        combined = spread.prod(-2)
    elif reduce == "amax":
        combined = spread.amax(-2)
    else:
        combined = spread.amin(-2)
    touched = hit.any(-2)
    if reduce == "mean":
        count = hit.sum(-2).to(x.dtype) + (1 if include_self else 0)
        total = combined + x if include_self else combined
        mean = total / torch.clamp(count, min=1)
        out = torch.div(mean, 1, rounding_mode="floor") if not x.is_floating_point() else mean
    elif not include_self:
        out = combined
    elif reduce == "sum":
        out = combined + x
    elif reduce == "prod":
        out = combined * x
    elif reduce == "amax":
        out = torch.maximum(combined, x)
    else:
        out = torch.minimum(combined, x)
    return torch.where(touched, out.to(x.dtype), x)


def scatter_reduce(
    t: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    src: torch.Tensor,
    reduce: str,
    *,
    include_self: bool = True,
) -> object:
    """``t`` combined with the ``src`` elements each ``index`` sends to it along ``dim``:
    a one-hot compare with an iota, a select and a reduction over the sources (as gather
    and scatter_add are)."""
    if reduce not in _REDUCE_FILL or not t.is_floating_point():
        return NotImplemented
    if t.dim() == 0:  # one element: a 1-element dim
        one = scatter_reduce(
            t.reshape(1), 0, index.reshape(-1), src.reshape(-1), reduce, include_self=include_self
        )
        return one if one is NotImplemented else one.reshape(())  # type: ignore[union-attr]
    dim = dim % t.dim()
    if index.shape != src.shape:
        src = src[tuple(slice(0, n) for n in index.shape)]
    if index.dim() != t.dim() or any(
        index.shape[k] > t.shape[k] for k in range(t.dim()) if k != dim
    ):
        return NotImplemented
    # A smaller index along the other dims leaves the rest of t alone: pad it with -1
    # (matches no position) and the sources with anything.
    pads: list[int] = []
    for k in reversed(range(t.dim())):
        pads += [0, 0 if k == dim else t.shape[k] - index.shape[k]]
    if any(pads):
        index, src = F.pad(index, pads, value=-1), F.pad(src, pads)
    x, idx, values = t.movedim(dim, -1), index.movedim(dim, -1), src.movedim(dim, -1)
    hit = idx.unsqueeze(-1) == torch.arange(x.shape[-1], device=t.device)
    return _one_hot_reduce(x, hit, values.to(t.dtype), reduce, include_self).movedim(-1, dim)


def index_reduce(
    t: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    source: torch.Tensor,
    reduce: str,
    *,
    include_self: bool = True,
) -> object:
    """``t`` combined along ``dim`` with the slices of ``source`` that ``index`` sends to
    each position: one-hot(index) against an iota, a select and a reduction."""
    if reduce not in _REDUCE_FILL or not t.is_floating_point():
        return NotImplemented
    if t.dim() == 0:  # one element: a 1-element dim
        one = index_reduce(
            t.reshape(1),
            0,
            index.reshape(-1),
            source.reshape(-1),
            reduce,
            include_self=include_self,
        )
        return one if one is NotImplemented else one.reshape(())  # type: ignore[union-attr]
    dim = dim % t.dim()
    x, values = t.movedim(dim, -1), source.movedim(dim, -1)
    hit = index.reshape(-1, 1) == torch.arange(x.shape[-1], device=t.device)
    return _one_hot_reduce(x, hit, values.to(t.dtype), reduce, include_self).movedim(-1, dim)


def index_add(
    t: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    source: torch.Tensor,
    *,
    alpha: float = 1,
) -> object:
    """``t.index_add(dim, index, source)``. In bfloat16 or float16 with ``alpha`` 1 it sums as
    eager's CPU kernel does: in float32, every addition to a position (repeated indices
    included) before one rounding; PyTorch's decomposition (``index_put`` with accumulate)
    rounds each addition (a row of 50 additions came out 2.0 away). With another ``alpha``
    eager rounds each addition too: the decomposition as it is."""
    from torch._decomp.decompositions import index_add as functional

    if t.dtype not in (torch.bfloat16, torch.float16) or alpha != 1:
        return functional(t, dim, index, source, alpha=alpha)
    return functional(t.float(), dim, index, source.float()).to(t.dtype)


def signbit(t: torch.Tensor) -> object:
    """x < 0, or -0 (whose reciprocal is -inf)."""
    if not t.is_floating_point():
        return t < 0
    return (t < 0) | (1.0 / t < 0)


def angle(t: torch.Tensor) -> object:
    """The angle of a real number: pi below 0, else 0 (NaN stays NaN)."""
    if t.is_complex():
        return NotImplemented
    x = t if t.is_floating_point() else t.to(torch.float32)
    return torch.where(x < 0, math.pi, torch.where(torch.isnan(x), x, 0.0)).to(x.dtype)


#: Ops core ATen keeps whole, as ops the device runs (each returns ``NotImplemented`` where it
#: does not apply; those calls stay eager and are counted).
OP_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., object]] = {
    _aten.index_add.default: index_add,
    _aten.native_layer_norm.default: native_layer_norm,
    _aten.native_layer_norm_backward.default: native_layer_norm_backward,
    _aten._grouped_mm.default: grouped_mm,
    _aten.flip.default: flip,
    _aten.roll.default: roll,
    _aten.im2col.default: im2col,
    _aten.col2im.default: col2im,
    _aten.diagonal.default: diagonal,
    _aten.diagonal_copy.default: diagonal,
    _aten.diagonal_scatter.default: diagonal_scatter,
    _aten.unfold.default: unfold,
    _aten.cumprod.default: cumprod,
    _aten.logcumsumexp.default: logcumsumexp,
    _aten.cummax.default: _cumulative_extreme(largest=True),
    _aten.cummin.default: _cumulative_extreme(largest=False),
    _aten._softmax.default: _softmax(log=False),
    _aten._log_softmax.default: _softmax(log=True),
    _aten.max.dim: _dim_extreme(largest=True),
    _aten.min.dim: _dim_extreme(largest=False),
    _aten.argmax.default: _arg_extreme(largest=True),
    _aten.argmin.default: _arg_extreme(largest=False),
    _aten.copy.default: copy,
    _aten.empty_strided.default: empty_strided,
    _aten.addbmm.default: addbmm,
    _aten.put.default: put,
    _aten.as_strided_copy.default: as_strided_copy,
    _aten.as_strided_scatter.default: as_strided_scatter,
    _aten.masked_scatter.default: masked_scatter,
    _aten.searchsorted.Tensor: searchsorted,
    _aten.bucketize.Tensor: bucketize,
    _aten._cdist_forward.default: cdist_forward,
    _aten._pdist_forward.default: pdist_forward,
    _aten.scatter_reduce.two: scatter_reduce,
    _aten.index_reduce.default: index_reduce,
    _aten.signbit.default: signbit,
    _aten.angle.default: angle,
    _aten.max_pool2d_with_indices.default: max_pool2d_with_indices,
    _aten.avg_pool2d.default: avg_pool2d,
    _aten._adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    _aten._adaptive_avg_pool3d.default: adaptive_avg_pool3d,
    _aten.adaptive_max_pool2d.default: adaptive_max_pool2d,
    _aten.adaptive_max_pool3d.default: adaptive_max_pool3d,
    _aten._trilinear.default: trilinear,
    _aten.kthvalue.default: kthvalue,
    _aten.median.default: median,
    _aten.median.dim: median_dim,
    _aten.nanmedian.default: nanmedian,
    _aten.nanmedian.dim: nanmedian_dim,
    _aten.histc.default: histc,
    _aten.avg_pool3d.default: avg_pool3d,
    _aten.sort.default: sort,
    _aten.sort.stable: sort,
    _aten.segment_reduce.default: segment_reduce,
    _aten.nonzero_static.default: nonzero_static,
    _aten.grid_sampler_2d.default: grid_sampler,
    _aten.grid_sampler_3d.default: grid_sampler,
    _aten._upsample_bilinear2d_aa.default: upsample_bilinear2d_aa,
    _aten.native_group_norm.default: group_norm,
    **{
        op: _nearest(dims, vec)
        for dims, ops in (
            (1, (_aten.upsample_nearest1d, _aten._upsample_nearest_exact1d)),
            (2, (_aten.upsample_nearest2d, _aten._upsample_nearest_exact2d)),
            (3, (_aten.upsample_nearest3d, _aten._upsample_nearest_exact3d)),
        )
        for packet in ops
        for op, vec in ((packet.default, False), (packet.vec, True))
    },
    _aten._embedding_bag_forward_only.default: embedding_bag_forward_only,
    _aten.histogram.bin_ct: histogram,
    _aten.histogram.bins_tensor: histogram_edges,
    _aten._histogramdd_bin_edges.default: histogramdd_bin_edges,
    _aten._histogramdd_from_bin_cts.default: histogramdd_from_bin_cts,
    _aten._histogramdd_from_bin_tensors.default: histogramdd_from_bin_tensors,
}


#: Backward (and index) ops lowered as device math; each returns ``NotImplemented`` for
#: argument combinations it does not cover, which then stay eager and are counted.
TRAINING_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., object]] = {
    _aten.convolution_backward.default: convolution_backward,
    _aten.convolution.default: convolution,
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


def _chunked_loss(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    weight: torch.Tensor | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    acc_dtype: torch.dtype,
) -> torch.Tensor | None:
    """``F.linear_cross_entropy``'s chunked ops in float32: the logits' matmul and the
    cross-entropy as one graph (the chunks only bound eager's memory; the device tiles the
    matmul itself). None (the op stays whole) for 16-bit inputs, whose accumulator policies
    round differently."""
    if not (x.dtype == w.dtype == acc_dtype == torch.float32) or w.dim() != 2:
        return None
    from torchneuron.losses import fused_cross_entropy  # losses imports this module

    return fused_cross_entropy(
        F.linear(x, w, b), target, weight, ignore_index, reduction, label_smoothing
    )


def linear_cross_entropy_chunked(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    weight: torch.Tensor | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    batch_chunk_size: int,
    acc_policy: str,
    acc_dtype: torch.dtype,
    allow_retain_graph: bool,
    compute_input_grad: bool,
    compute_linear_weight_grad: bool,
    compute_linear_bias_grad: bool,
) -> object:
    """The mean/sum form, when no gradient is precomputed (inference): the loss, and the
    empty gradient slots the op returns then."""
    if compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad:
        return NotImplemented
    loss = _chunked_loss(
        x, w, target, b, weight, reduction, ignore_index, label_smoothing, acc_dtype
    )
    if loss is None:
        return NotImplemented
    empty = torch.zeros((0, 0), dtype=x.dtype, device=x.device)
    return loss, empty, empty.clone(), torch.zeros((0,), dtype=x.dtype, device=x.device)


def linear_cross_entropy_chunked_none(
    x: torch.Tensor,
    w: torch.Tensor,
    target: torch.Tensor,
    b: torch.Tensor | None,
    weight: torch.Tensor | None,
    ignore_index: int,
    batch_chunk_size: int,
    acc_policy: str,
    acc_dtype: torch.dtype,
) -> object:
    """The ``reduction="none"`` form: the per-sample losses."""
    loss = _chunked_loss(x, w, target, b, weight, "none", ignore_index, 0.0, acc_dtype)
    return NotImplemented if loss is None else loss


#: Ops of libraries models use (registered when the library is imported), by qualified name.
LIBRARY_DECOMPOSITIONS: dict[str, Callable[..., object]] = {
    "transformers::grouped_mm_fallback": transformers_grouped_mm,
    "transformers::grouped_mm_fallback_backward": transformers_grouped_mm_backward,
    # torch's own (torch/nn/modules/linear_cross_entropy.py), registered when torch.nn loads
    "torch_nn::_linear_cross_entropy_batch_chunked": linear_cross_entropy_chunked,
    "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction": (
        linear_cross_entropy_chunked_none
    ),
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
    table.update(OP_DECOMPOSITIONS)
    table.update(ELEMENTWISE_DECOMPOSITIONS)
    table.update(SPECIAL_DECOMPOSITIONS)
    table.update(LINALG_DECOMPOSITIONS)
    missing = [
        str(op)
        for op, _ in EXTRA_DECOMPOSITIONS
        if not any(getattr(op, name) in table for name in op.overloads())  # type: ignore[no-untyped-call]
    ]
    if missing:
        raise RuntimeError(f"torch has no decomposition for {missing}; update decompositions.py")
    return table
