"""Complex tensors as pairs of float32 tensors, and FFTs as DFT matmuls on TensorE.

The device has no complex dtype. A complex64 value of shape S is, in memory, a float32 tensor
of shape S + [2] (real and imaginary parts interleaved: ``torch.view_as_real``). The front-end
step :func:`complex_as_pairs` rewrites a graph's complex64 nodes into ops on those pairs, so the
device runs them: a complex graph input enters through ``view_as_real`` and a complex result
leaves through ``view_as_complex``, reinterpretations of the same memory that the kernel reads
and writes (they are not device work, :func:`torchneuron.partition.is_op`).

FFTs (``_fft_r2c``, ``_fft_c2c``, ``_fft_c2r``: every ``torch.fft`` function, ``stft``) are
discrete Fourier transforms, one dim at a time, as matmuls with the [n, m] cosine and sine
matrices, built on the device from an iota (the angle of entry (j, k) is 2 pi (jk mod n) / n,
reduced before the multiply so it stays exact in float32). An FFT is O(n log n) and a DFT
O(n^2), but TensorE does the n^2 at 128x128 per cycle: up to a few thousand points a DFT
matmul beats a butterfly network on the vector engines. Longer transforms (over
:data:`MAX_POINTS` points) stay eager, counted.

A graph whose complex nodes include an op not handled here is left as it is (its complex ops
stay eager, counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.fx

from torchneuron import rewrite

__all__ = ["MAX_POINTS", "complex_as_pairs"]

_aten = torch.ops.aten

#: The longest transform (points along one dim) done as a DFT matmul.
MAX_POINTS = 4096

# -- the pair forms: functions of float32 tensors [..., 2] ------------------------------------


def _parts(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return z[..., 0], z[..., 1]


def _pair(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    return torch.stack([re, im], -1)


def _angles(n: int, rows: int, columns: int, like: torch.Tensor) -> torch.Tensor:
    """[rows, columns]: 2 pi (j k mod n) / n."""
    j = torch.arange(rows, device=like.device).unsqueeze(-1)
    k = torch.arange(columns, device=like.device)
    return torch.remainder(j * k, n).to(torch.float32) * (2 * math.pi / n)


def _along(x: torch.Tensor, dim: int, matrix: torch.Tensor) -> torch.Tensor:
    """``x`` with its dim ``dim`` [n] multiplied by ``matrix`` [n, m]."""
    return (x.movedim(dim, -1) @ matrix).movedim(-1, dim)


def _dft(
    re: torch.Tensor, im: torch.Tensor | None, dim: int, forward: bool, out: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``out`` coefficients of the DFT along ``dim`` (sign -1 forward, +1 back)."""
    n = re.shape[dim]
    angle = _angles(n, n, out, re)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if not forward:
        sin = -sin
    # (re + i im)(cos - i sin) = re cos + im sin + i (im cos - re sin)
    real, imag = _along(re, dim, cos), -_along(re, dim, sin)
    if im is not None:
        real = real + _along(im, dim, sin)
        imag = imag + _along(im, dim, cos)
    return real, imag


def _scale(normalization: int, points: int) -> float:
    """torch's FFT normalization codes: 0 none, 1 1/sqrt(n), 2 1/n."""
    return (1.0, 1.0 / math.sqrt(points), 1.0 / points)[normalization]


def fft_r2c(
    x: torch.Tensor, dim: Sequence[int], normalization: int, onesided: bool
) -> torch.Tensor:
    dims = [d % x.dim() for d in dim]
    points = math.prod(x.shape[d] for d in dims)
    last = dims[-1]
    n = x.shape[last]
    re, im = _dft(x, None, last, True, n // 2 + 1 if onesided else n)
    for d in dims[:-1]:
        re, im = _dft(re, im, d, True, re.shape[d])
    factor = _scale(normalization, points)
    return _pair(re * factor, im * factor)


def fft_c2c(z: torch.Tensor, dim: Sequence[int], normalization: int, forward: bool) -> torch.Tensor:
    re, im = _parts(z)
    dims = [d % re.dim() for d in dim]
    points = math.prod(re.shape[d] for d in dims)
    for d in dims:
        re, im = _dft(re, im, d, forward, re.shape[d])
    factor = _scale(normalization, points)
    return _pair(re * factor, im * factor)


def fft_c2r(
    z: torch.Tensor, dim: Sequence[int], normalization: int, last_dim_size: int
) -> torch.Tensor:
    """The inverse transform of a Hermitian half spectrum: the other dims as c2c, then the
    last one with each coefficient k (0 < k < n/2) counted twice (its conjugate's share); the
    imaginary parts of coefficients 0 and n/2 drop out, as pocketfft's do."""
    re, im = _parts(z)
    dims = [d % re.dim() for d in dim]
    for d in dims[:-1]:
        re, im = _dft(re, im, d, False, re.shape[d])
    last, n = dims[-1], last_dim_size
    half = re.shape[last]
    angle = _angles(n, half, n, re)
    k = torch.arange(half, device=re.device).unsqueeze(-1)
    weight = torch.where((k == 0) | (2 * k == n), 1.0, 2.0)
    # Re((re + i im)(cos + i sin)) = re cos - im sin
    x = _along(re, last, weight * torch.cos(angle)) - _along(im, last, weight * torch.sin(angle))
    points = math.prod(re.shape[d] for d in dims[:-1]) * n
    return x * _scale(normalization, points)


def _pair_dim(dim: int, ndim: int) -> int:
    """A dim of a complex tensor of ``ndim`` dims, as a dim of its pair tensor."""
    return dim % ndim if ndim else 0


# -- the rewrite -----------------------------------------------------------------------------


def _is_complex(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.complex64


def _ndim(node: torch.fx.Node) -> int:
    return node.meta["val"].dim()


def _handle(
    node: torch.fx.Node, paired: set[torch.fx.Node]
) -> tuple[Callable[..., torch.Tensor], list[torch.fx.Node]] | None:
    """How to compute ``node`` on pairs: a function of tensors and the nodes it takes (those in
    ``paired`` are read in their pair form), or None when this op is not handled."""
    target, args, kwargs = node.target, node.args, node.kwargs
    source = args[0] if args and isinstance(args[0], torch.fx.Node) else None
    pair = source if source in paired else None
    if target is _aten._fft_r2c.default and source is not None:
        n = max(source.meta["val"].shape[d] for d in args[1]) if args[1] else 0
        if n > MAX_POINTS:
            return None
        return (lambda x: fft_r2c(x, *args[1:])), [source]
    if pair is None:
        if target in (_aten.complex.default, _aten.polar.default):
            second = args[1]
            if target is _aten.complex.default:
                return (lambda re, im: _pair(*torch.broadcast_tensors(re, im))), [source, second]
            return (
                lambda r, t: _pair(*torch.broadcast_tensors(r * torch.cos(t), r * torch.sin(t)))
            ), [source, second]
        if target in (_aten._to_copy.default, _aten.view_as_complex.default) and source is not None:
            if target is _aten.view_as_complex.default:
                return (lambda x: x.clone()), [source]
            if kwargs.get("dtype") == torch.complex64 and source.meta["val"].dtype == torch.float32:
                return (lambda x: _pair(x, torch.zeros_like(x))), [source]
        return None
    ndim = _ndim(source)
    if target is _aten._fft_c2c.default:
        if max((source.meta["val"].shape[d] for d in args[1]), default=0) > MAX_POINTS:
            return None
        return (lambda z: fft_c2c(z, *args[1:])), [pair]
    if target is _aten._fft_c2r.default:
        if args[3] > MAX_POINTS:
            return None
        return (lambda z: fft_c2r(z, *args[1:])), [pair]
    if target in (_aten._conj.default, _aten._conj_physical.default):
        return (lambda z: _pair(z[..., 0], -z[..., 1])), [pair]
    if target in (_aten.clone.default, _aten.alias.default) or (
        target is _aten._to_copy.default and kwargs.get("dtype", torch.complex64) == torch.complex64
    ):
        return (lambda z: z.clone()), [pair]
    if target is _aten.slice.Tensor:
        d = _pair_dim(args[1] if len(args) > 1 else 0, ndim)
        rest = list(args[2:])
        return (lambda z: _aten.slice.Tensor(z, d, *rest)), [pair]
    if target is _aten.select.int:
        d, index = _pair_dim(args[1], ndim), args[2]
        return (lambda z: z.select(d, index)), [pair]
    if target is _aten.constant_pad_nd.default:
        pad = list(args[1])
        value = args[2] if len(args) > 2 else 0
        if value != 0:
            return None
        return (lambda z: _aten.constant_pad_nd.default(z, [0, 0, *pad], 0.0)), [pair]
    if target in (
        _aten.transpose.int,
        _aten.permute.default,
        _aten.unsqueeze.default,
        _aten.squeeze.dim,
        _aten.squeeze.dims,
        _aten.view.default,
        _aten.reshape.default,
        _aten.expand.default,
    ):
        shape = list(node.meta["val"].shape)
        if target is _aten.permute.default:
            order = [_pair_dim(d, ndim) for d in args[1]] + [ndim]
            return (lambda z: z.permute(order)), [pair]
        if target is _aten.transpose.int:
            a, b = _pair_dim(args[1], ndim), _pair_dim(args[2], ndim)
            return (lambda z: z.transpose(a, b)), [pair]
        if target is _aten.expand.default:
            return (lambda z: z.expand(*shape, 2)), [pair]
        return (lambda z: z.reshape(*shape, 2)), [pair]
    if target is _aten.view_as_real.default:
        return (lambda z: z.clone()), [pair]
    if target is _aten.abs.default:
        return (lambda z: torch.sqrt(z[..., 0] * z[..., 0] + z[..., 1] * z[..., 1])), [pair]
    if target is _aten.angle.default:
        return (lambda z: torch.atan2(z[..., 1], z[..., 0])), [pair]
    other = args[1] if len(args) > 1 else None
    if target in (_aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor) and isinstance(
        other, torch.fx.Node
    ):
        if other not in paired or len(args) > 2 or kwargs:
            return None
        if target is _aten.mul.Tensor:
            return (lambda a, b: _pair(*_multiply(a, b))), [pair, other]
        sign = 1.0 if target is _aten.add.Tensor else -1.0
        return (lambda a, b: a + sign * b), [pair, other]
    return None


def _multiply(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return ar * br - ai * bi, ar * bi + ai * br


def complex_as_pairs(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm``'s complex64 nodes into ops on float32 pairs (in place), when every one of
    them is handled; returns how many nodes were rewritten."""
    complex_nodes = [
        n
        for n in gm.graph.nodes
        if n.op in ("call_function", "placeholder") and _is_complex(n.meta.get("val"))
    ]
    if not complex_nodes:
        return 0
    # Plan first: leave the graph as it is unless every complex node is handled.
    paired: set[torch.fx.Node] = set()  # nodes that have a pair form once rewritten
    planned: list[tuple[torch.fx.Node, Callable[..., torch.Tensor], list[torch.fx.Node]]] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder" and _is_complex(node.meta.get("val")):
            paired.add(node)
            continue
        if node.op != "call_function":
            continue
        takes_complex = any(_is_complex(a.meta.get("val")) for a in node.all_input_nodes)
        if not (_is_complex(node.meta.get("val")) or takes_complex):
            continue
        how = _handle(node, paired)
        if how is None:
            return 0
        planned.append((node, *how))
        paired.add(node)
    # Rewrite: complex inputs through view_as_real, each planned node as its pair form, and
    # complex values the rest of the graph reads through view_as_complex.
    made: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node in paired:
            with gm.graph.inserting_after(node):
                view = gm.graph.call_function(_aten.view_as_real.default, (node,))
            view.meta["val"] = torch.view_as_real(node.meta["val"])
            made[node] = view
    count = 0
    for node, fn, inputs in planned:
        actual = [made.get(i, i) for i in inputs]
        result = rewrite.splice(gm, node, fn, actual)
        if result is None:
            raise RuntimeError(f"complex_as_pairs: {node.name} made tensor constants")
        if _is_complex(node.meta.get("val")):
            made[node] = result
            with gm.graph.inserting_before(node):
                back = gm.graph.call_function(_aten.view_as_complex.default, (result,))
            back.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(back)
        else:
            node.replace_all_uses_with(result)
        count += 1
    for node, _, _ in reversed(planned):
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return count
