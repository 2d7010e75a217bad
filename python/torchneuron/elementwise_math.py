"""Elementwise functions the engines have no instruction for, as the math they do have.

ScalarE's activation table (``runtime/program/InstructionSet.def``) has exp, log, log1p,
sqrt, tanh, sin, cos, erf, ...; the inverse trigonometric and hyperbolic functions and
PyTorch's special functions are built here from those and VectorE arithmetic, in float32
(16-bit inputs are widened and the result rounded once, as PyTorch's CPU kernels compute
them). Each is a decomposition (:func:`torchneuron.decompositions.neuron_decompositions`
adds :data:`ELEMENTWISE_DECOMPOSITIONS`), so it fuses with its neighbours like any
elementwise chain. Accuracy: a few float32 ulp over the whole domain, within the float32
``TRANSCENDENTAL`` bounds of ``tests/python/test_ops.py``; infinities and NaN map as in eager.

- ``atan``: Cephes' ``atanf``: reduce ``|x|`` to ``[0, tan(pi/8)]`` with ``-1/x`` or
  ``(x-1)/(x+1)`` and evaluate a degree-9 odd polynomial (relative error ~1e-7). ``atan2``,
  ``asin`` (``atan(x / sqrt((1-x)(1+x)))``) and ``acos`` (``2 atan(sqrt((1-x)/(1+x)))``,
  no cancellation near 1) are built on it.
- ``asinh``, ``acosh``, ``atanh``, ``sinh``, ``cosh``, ``tan``: their logarithmic and
  exponential forms, through ``log1p``/``expm1`` near 0 where the plain forms cancel.
- ``copysign``, ``fmax``/``fmin``, ``hypot`` (scaled: no overflow), ``log10``,
  ``round(decimals=)``: selects and arithmetic; ``log2`` splits off the exponent (below), so
  a power of two gives its exponent exactly.
- ``lgamma``, ``digamma``, ``polygamma``: the recurrence shifts the argument to >= 8 (20
  for polygamma's Hurwitz zeta), where Stirling's / the asymptotic / Euler-Maclaurin series
  converge to float32 precision in four terms; x <= 0 by reflection formulas.
- ``frexp``, ``nextafter``: float32's exponent by a binary search of exact powers of two
  (no bit operations on the device), then exact products and sums.
- ``erfinv``, ``special.ndtri``: Giles' single-precision polynomials; ``erfc``: Numerical
  Recipes' Chebyshev fit of ``erfc(x) e^(x^2)``, accurate in the tails where 1 - erf is 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

__all__ = ["ELEMENTWISE_DECOMPOSITIONS"]

_aten = torch.ops.aten

# Above this, x*x overflows float32 long before asinh/acosh do: use log(2x) (exact there).
_LARGE = 1e10


def _in_float32(fn: Callable[..., torch.Tensor]) -> Callable[..., object]:
    """Compute in float32 and round once to the input's (16-bit) dtype; other dtypes
    (integers, float64) keep the op whole (it stays eager, counted)."""

    @functools.wraps(fn)
    def wrapper(*args: torch.Tensor) -> object:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        dtype = torch.result_type(*args) if len(args) > 1 else tensors[0].dtype
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return NotImplemented
        wide = [a.to(torch.float32) if isinstance(a, torch.Tensor) else a for a in args]
        return fn(*wide).to(dtype)

    return wrapper


def _odd(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``r`` (computed from ``|x|``) with the sign of ``x``; NaN stays NaN."""
    return torch.where(x < 0, -r, r)


def _atan_abs(t: torch.Tensor) -> torch.Tensor:
    """atan of ``t >= 0`` (Cephes atanf)."""
    big = t > 2.414213562373095  # tan(3 pi / 8)
    mid = t > 0.4142135623730950  # tan(pi / 8)
    z = torch.where(big, -1.0 / t, torch.where(mid, (t - 1.0) / (t + 1.0), t))
    base = torch.where(big, math.pi / 2, torch.where(mid, math.pi / 4, 0.0))
    zz = z * z
    poly = ((8.05374449538e-2 * zz - 1.38776856032e-1) * zz + 1.99777106478e-1) * zz
    return base + ((poly - 3.33329491539e-1) * zz * z + z)


def _atan(x: torch.Tensor) -> torch.Tensor:
    return _odd(x, _atan_abs(x.abs()))


def _atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    y, x = torch.broadcast_tensors(y, x)
    # Both infinite: the angle of (sign y, sign x); both zero: 0 (x = +0's answer).
    both_inf = torch.isinf(x) & torch.isinf(y)
    both_zero = (x == 0) & (y == 0)
    xs = torch.where(both_inf, torch.sign(x), torch.where(both_zero, 1.0, x))
    ys = torch.where(both_inf, torch.sign(y), y)
    q = _atan(ys / xs)
    return torch.where(xs < 0, torch.where(ys < 0, q - math.pi, q + math.pi), q)


def _asin(x: torch.Tensor) -> torch.Tensor:
    return _atan(x / torch.sqrt((1.0 - x) * (1.0 + x)))


def _acos(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * _atan_abs(torch.sqrt((1.0 - x) / (1.0 + x)))


def _asinh(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    small = torch.log1p(a + a * a / (1.0 + torch.sqrt(1.0 + a * a)))
    return _odd(x, torch.where(a > _LARGE, torch.log(a) + math.log(2.0), small))


def _acosh(x: torch.Tensor) -> torch.Tensor:
    t = x - 1.0
    near = torch.log1p(t + torch.sqrt(t * (x + 1.0)))
    return torch.where(x > _LARGE, torch.log(x) + math.log(2.0), near)


def _atanh(x: torch.Tensor) -> torch.Tensor:
    # From |x|: 1 - |x| is exact near 1, where 1 - x of a negative x would round the
    # argument of log1p near -1 (4e-5 relative error at -0.9998). Zeros keep their sign.
    a = x.abs()
    r = 0.5 * torch.log1p(2.0 * a / (1.0 - a))
    return torch.where(x == 0, x, _odd(x, r))


def _sinh(x: torch.Tensor) -> torch.Tensor:
    # (e^x - e^-x) / 2 = (u + u / (u + 1)) / 2 with u = expm1(|x|): no cancellation near 0;
    # e^|x| / 2 * 2 overflows 1 ulp early, so large |x| uses e^(|x| - ln 2).
    a = x.abs()
    u = torch.expm1(a)
    r = torch.where(a > 80.0, torch.exp(a - math.log(2.0)), 0.5 * (u + u / (u + 1.0)))
    return _odd(x, r)


def _cosh(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    e = torch.exp(a)
    return torch.where(a > 80.0, torch.exp(a - math.log(2.0)), 0.5 * (e + 1.0 / e))


def _tan(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) / torch.cos(x)


def _negative(x: torch.Tensor) -> torch.Tensor:
    """The sign bit: x < 0, or -0 (whose reciprocal is -inf). NaN's sign is not visible."""
    return (x < 0) | (1.0 / x < 0)


def _copysign(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = torch.broadcast_tensors(a, b)
    return torch.where(_negative(b), -a.abs(), a.abs())


def _fmax(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """maximum that ignores a NaN operand (NaN only when both are)."""
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, torch.maximum(a, b)))


def _fmin(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, torch.minimum(a, b)))


def _hypot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sqrt(a^2 + b^2) scaled by the larger magnitude, so neither square overflows."""
    a, b = a.abs(), b.abs()
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = torch.where(big == 0, 0.0, small / big)
    r = big * torch.sqrt(1.0 + ratio * ratio)
    return torch.where(torch.isinf(a) | torch.isinf(b), math.inf, r)


def _log2(x: torch.Tensor) -> torch.Tensor:
    """log2 of x = 2^(e-1) * m, m in [1, 2): (e - 1) + log(m) / ln 2, so a power of two gives
    its exponent exactly (``floor(log2(x))`` of a scale, as TorchAO rounds scales to powers
    of two) and large |log2| lose no precision to the scaled log's rounding."""
    a = torch.where((x > 0) & (x < math.inf), x, 1.0)
    e = _exponent(a)
    m = _scaled(a, 1 - e)
    # m in [sqrt(1/2), sqrt(2)): just below 1, x is m itself with no exponent to cancel
    # against its log (-1 + log2(2x) lost 3.6e-5 of log2(0.9993)).
    high = m > math.sqrt(2.0)
    m = torch.where(high, m * 0.5, m)
    exact = (e - 1 + high.to(e.dtype)) + torch.log(m) * (1.0 / math.log(2.0))
    return torch.where((x > 0) & (x < math.inf), exact, torch.log(x) * (1.0 / math.log(2.0)))


def _log10(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x) * (1.0 / math.log(10.0))


def _round_decimals(x: torch.Tensor, *, decimals: int = 0) -> torch.Tensor:
    """PyTorch's formula: round(x * 10^d) / 10^d (x / 10^-d * 10^-d for d < 0)."""
    if decimals >= 0:
        scale = 10.0**decimals
        return torch.round(x * scale) / scale
    scale = 10.0**-decimals
    return torch.round(x / scale) * scale


def _round_decimals_op(x: torch.Tensor, *, decimals: int = 0) -> object:
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return NotImplemented
    return _round_decimals(x.to(torch.float32), decimals=decimals).to(x.dtype)


# -- gamma-family functions: shift up by recurrence, then an asymptotic series ------------

_SHIFT = 8  # terms of the recurrence: the series below run at z >= 8, where they converge fast
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _lgamma_positive(x: torch.Tensor) -> torch.Tensor:
    """lgamma for x > 0: Stirling's series at z = x + 8 (error < 1e-9 there), less the log of
    x (x + 1) ... (x + 7); large x use the series directly."""
    small = x < _SHIFT
    z = torch.where(small, x + _SHIFT, x)
    product = x
    for k in range(1, _SHIFT):
        product = product * (x + k)
    inv = 1.0 / z
    inv2 = inv * inv
    series = inv * (1.0 / 12 - inv2 * (1.0 / 360 - inv2 * (1.0 / 1260)))
    stirling = (z - 0.5) * torch.log(z) - z + _HALF_LOG_2PI + series
    return torch.where(small, stirling - torch.log(product), stirling)


def _sin_pi_abs(x: torch.Tensor) -> torch.Tensor:
    """|sin(pi x)|, reduced to [-1/2, 1/2] first (pi x itself loses the fraction)."""
    return torch.sin(math.pi * (x - torch.round(x))).abs()


def _cot_pi(r: torch.Tensor) -> torch.Tensor:
    """cot(pi r) for r in [-1/2, 1/2]: cos(pi r) as sin(pi (1/2 - |r|)), exact near r = 1/2
    where cos itself is small and would carry its absolute error."""
    return torch.sin(math.pi * (0.5 - r.abs())) / torch.sin(math.pi * r)


def _lgamma(x: torch.Tensor) -> torch.Tensor:
    """lgamma; x <= 0 by the reflection lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x)
    (inf at the poles, as in eager)."""
    reflected = torch.log(math.pi / _sin_pi_abs(x)) - _lgamma_positive(1.0 - x)
    r = torch.where(x > 0, _lgamma_positive(x), reflected)
    return torch.where(torch.isinf(x), math.inf, r)


def _digamma_positive(x: torch.Tensor) -> torch.Tensor:
    small = x < _SHIFT
    z = torch.where(small, x + _SHIFT, x)
    shift = 1.0 / x
    for k in range(1, _SHIFT):
        shift = shift + 1.0 / (x + k)
    inv2 = 1.0 / (z * z)
    series = inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240))))
    asymptotic = torch.log(z) - 0.5 / z - series
    return torch.where(small, asymptotic - shift, asymptotic)


def _digamma(x: torch.Tensor) -> torch.Tensor:
    """digamma; x <= 0 by the reflection psi(x) = psi(1 - x) - pi / tan(pi x): -inf at 0,
    NaN at the negative integers, as in eager."""
    r = x - torch.round(x)
    reflected = _digamma_positive(1.0 - x) - math.pi * _cot_pi(r)
    out = torch.where(x > 0, _digamma_positive(x), reflected)
    out = torch.where((x < 0) & (r == 0), math.nan, out)
    return torch.where(x == 0, -math.inf, torch.where(x == math.inf, math.inf, out))


# Bernoulli numbers B2, B4, B6, B8 for the Euler-Maclaurin tail of the Hurwitz zeta.
_BERNOULLI = (1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30)
_ZETA_SHIFT = 20  # sum the first terms directly: the tail's series then starts at x + 20


def _hurwitz_zeta(s: int, x: torch.Tensor) -> torch.Tensor:
    """zeta(s, x) = sum_k (x + k)^-s for an integer s >= 2 and x > 0: 20 terms, then
    Euler-Maclaurin."""
    total = torch.zeros_like(x)
    for k in range(_ZETA_SHIFT):
        total = total + torch.pow(x + k, -float(s))
    z = x + _ZETA_SHIFT
    tail = torch.pow(z, 1.0 - s) / (s - 1) + 0.5 * torch.pow(z, -float(s))
    rising = float(s)  # s (s + 1) ... (s + 2j - 2)
    for j, b in enumerate(_BERNOULLI, start=1):
        tail = tail + b / math.factorial(2 * j) * rising * torch.pow(z, -float(s + 2 * j - 1))
        rising *= (s + 2 * j - 1) * (s + 2 * j)
    return total + tail


def _cot_derivative(n: int, c: torch.Tensor) -> torch.Tensor:
    """d^n/du^n cot(u) as a polynomial in c = cot(u): P0 = c, P(k+1) = -(1 + c^2) P(k)'."""
    coeffs = [0.0, 1.0]  # coefficient of c^i
    for _ in range(n):
        deriv = [i * coeffs[i] for i in range(1, len(coeffs))]
        grown = [0.0] * (len(deriv) + 2)
        for i, a in enumerate(deriv):
            grown[i] -= a
            grown[i + 2] -= a
        coeffs = grown
    out = torch.full_like(c, coeffs[-1])
    for a in reversed(coeffs[:-1]):
        out = out * c + a
    return out


def _polygamma_positive(n: int, x: torch.Tensor) -> torch.Tensor:
    sign = 1.0 if n % 2 == 1 else -1.0
    return sign * math.factorial(n) * _hurwitz_zeta(n + 1, x)


def _polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x); x < 0 by the reflection
    psi^(n)(x) = (-1)^(n+1) ((-1)^n pi d^n/dx^n cot(pi x) - psi^(n)(1 - x))."""
    if n == 0:
        return _digamma(x)
    r = x - torch.round(x)
    sign = (-1.0) ** (n + 1)
    reflected = sign * (
        (-1.0) ** n * math.pi ** (n + 1) * _cot_derivative(n, _cot_pi(r))
        - _polygamma_positive(n, 1.0 - x)
    )
    out = torch.where(x < 0, reflected, _polygamma_positive(n, x))
    # As eager's zeta: poles at the non-positive integers (+inf for odd n, NaN for even n),
    # NaN at +inf and (-1)^(n+1) inf at -inf.
    out = torch.where((x <= 0) & (r == 0), math.inf if n % 2 else math.nan, out)
    return torch.where(x == math.inf, math.nan, torch.where(x == -math.inf, sign * math.inf, out))


def _polygamma_op(n: int, x: torch.Tensor) -> object:
    if n < 0 or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return NotImplemented
    return _polygamma(n, x.to(torch.float32)).to(x.dtype)


def _erfinv_from(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Giles' single-precision erfinv ("Approximating the erfinv function", GPU Computing
    Gems, 2011), given w = -log((1 - x)(1 + x)): two polynomials, relative error < 4e-7."""
    central = w - 2.5
    p = torch.full_like(w, 2.81022636e-08)
    for c in (
        3.43273939e-07,
        -3.5233877e-06,
        -4.39150654e-06,
        0.00021858087,
        -0.00125372503,
        -0.00417768164,
        0.246640727,
        1.50140941,
    ):
        p = c + p * central
    tail = torch.sqrt(w) - 3.0
    q = torch.full_like(w, -0.000200214257)
    for c in (
        0.000100950558,
        0.00134934322,
        -0.00367342844,
        0.00573950773,
        -0.0076224613,
        0.00943887047,
        1.00167406,
        2.83297682,
    ):
        q = c + q * tail
    y = torch.where(w < 5.0, p, q) * x
    return torch.where(x.abs() == 1.0, x * math.inf, y)


def _erfinv(x: torch.Tensor) -> torch.Tensor:
    return _erfinv_from(-torch.log1p(-x * x), x)


def _ndtri(p: torch.Tensor) -> torch.Tensor:
    """sqrt(2) erfinv(2p - 1), with w from p itself: -log(4 p (1 - p)) keeps the tails'
    precision that 2p - 1 would round away."""
    w = -torch.log(4.0 * p * (1.0 - p))
    return math.sqrt(2.0) * _erfinv_from(w, 2.0 * p - 1.0)


# Numerical Recipes' erfcc: erfc(|x|) = t exp(-x^2 + P(t)), t = 1 / (1 + |x| / 2), P a
# degree-9 Chebyshev fit (relative error below 1.2e-7 everywhere); highest power first.
_ERFC_POLY = (
    0.17087277,
    -0.82215223,
    1.48851587,
    -1.13520398,
    0.27886807,
    -0.18628806,
    0.09678418,
    0.37409196,
    1.00002368,
    -1.26551223,
)


def _erfc(x: torch.Tensor) -> torch.Tensor:
    """erfc to float32's relative precision in both tails (1 - erf(x) cancels to 0, and
    below, for x > 3.9). e^(-x^2) is e^(-h^2) e^(-(x - h)(x + h)) with h = |x| to 8 binary
    places, whose square is exact: x^2 rounded would cost 5e-6 relatively at x = 9."""
    a = x.abs()
    t = 1.0 / (1.0 + 0.5 * a)
    poly = torch.full_like(a, _ERFC_POLY[0])
    for c in _ERFC_POLY[1:]:
        poly = poly * t + c
    h = torch.round(a * 256.0) / 256.0
    tail = t * torch.exp(-h * h) * torch.exp((h - a) * (h + a) + poly)
    tail = torch.where(a >= 10.0, 0.0, tail)  # below float32's subnormals; no inf - inf
    return torch.where(x < 0, 2.0 - tail, tail)


#: op -> its decomposition (``NotImplemented`` for dtypes it does not cover).
# -- float32's binary exponent, without bit operations ----------------------------------------

_SMALLEST_EXPONENT = -148  # 2^-149, the smallest subnormal, has frexp exponent -148


def _exponent(a: torch.Tensor) -> torch.Tensor:
    """frexp's exponent of ``a`` (> 0, finite, float32): the largest e with 2^(e-1) <= a, by a
    binary search over float32's exponents whose probes are exact powers of two
    (``pow(2, e)`` is exact on the device, down to the subnormals). Nine compares; log2 would
    be off by one next to powers of two."""
    e = torch.full_like(a, _SMALLEST_EXPONENT)
    for step in (256, 128, 64, 32, 16, 8, 4, 2, 1):
        probe = e + step
        e = torch.where(a >= torch.pow(2.0, probe - 1), probe, e)
    return e


def _scaled(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """x * 2^e, exactly, in two factors: 2^e alone overflows for a subnormal x's -e."""
    half = torch.floor(e / 2)
    return x * torch.pow(2.0, half) * torch.pow(2.0, e - half)


def _frexp(x: torch.Tensor) -> object:
    """``frexp``: x = mantissa * 2^exponent with |mantissa| in [0.5, 1); 0, infinities and NaN
    keep themselves with exponent 0, as eager. Exact (powers of two and exact products)."""
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return NotImplemented
    wide = x.to(torch.float32)
    a = wide.abs()
    regular = (a > 0) & (a < math.inf)
    e = torch.where(regular, _exponent(torch.where(regular, a, 1.0)), 0.0)
    return _scaled(wide, -e).to(x.dtype), e.to(torch.int32)


def _nextafter(x: torch.Tensor, y: torch.Tensor) -> object:
    """``nextafter``: x moved one ulp of its dtype toward y, computed in float32 (exact for the
    16-bit dtypes too). The ulp is 2^(e - p) for frexp's exponent e and the dtype's p mantissa
    bits (the smallest subnormal among the subnormals), half that when stepping toward 0 from
    a power of two (the binade below is finer); the sum is exact. x == y gives y, NaN gives
    NaN, 0 the smallest subnormal and an infinity the largest finite value, as eager."""
    dtype = x.dtype
    if dtype not in (torch.float32, torch.bfloat16, torch.float16) or y.dtype != dtype:
        return NotImplemented
    info = torch.finfo(dtype)
    bits = 1 - round(math.log2(info.eps))  # mantissa bits with the implicit one
    lowest = round(math.log2(info.tiny * info.eps))  # the smallest subnormal's exponent
    x, y = x.to(torch.float32), y.to(torch.float32)
    a = x.abs()
    finite = (a > 0) & (a < math.inf)
    e = _exponent(torch.where(finite, a, 1.0))
    ulp = torch.pow(2.0, torch.clamp(e - bits, min=lowest))
    finer = torch.pow(2.0, torch.clamp(e - bits - 1, min=lowest))
    outward = (y > x) == (x > 0)
    step = torch.where(outward | (a != torch.pow(2.0, e - 1)), ulp, finer)
    out = x + torch.where(y > x, step, -step)
    out = torch.where(out == 0, x * 0.0, out)  # reaching 0 from below gives -0.0, as eager
    tiny = math.ldexp(1.0, lowest)
    out = torch.where(x == 0, torch.where(y > 0, tiny, -tiny), out)
    out = torch.where(a == math.inf, torch.where(x > 0, info.max, -info.max), out)
    out = torch.where(x == y, y, out)
    return torch.where(torch.isnan(x) | torch.isnan(y), math.nan, out).to(dtype)


ELEMENTWISE_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., object]] = {
    _aten.frexp.Tensor: _frexp,
    _aten.nextafter.default: _nextafter,
    _aten.atan.default: _in_float32(_atan),
    _aten.atan2.default: _in_float32(_atan2),
    _aten.asin.default: _in_float32(_asin),
    _aten.acos.default: _in_float32(_acos),
    _aten.asinh.default: _in_float32(_asinh),
    _aten.acosh.default: _in_float32(_acosh),
    _aten.atanh.default: _in_float32(_atanh),
    _aten.sinh.default: _in_float32(_sinh),
    _aten.cosh.default: _in_float32(_cosh),
    _aten.tan.default: _in_float32(_tan),
    _aten.copysign.Tensor: _in_float32(_copysign),
    _aten.fmax.default: _in_float32(_fmax),
    _aten.fmin.default: _in_float32(_fmin),
    _aten.hypot.default: _in_float32(_hypot),
    _aten.log2.default: _in_float32(_log2),
    _aten.log10.default: _in_float32(_log10),
    _aten.round.decimals: _round_decimals_op,
    _aten.lgamma.default: _in_float32(_lgamma),
    _aten.digamma.default: _in_float32(_digamma),
    _aten.polygamma.default: _polygamma_op,
    _aten.erfinv.default: _in_float32(_erfinv),
    _aten.special_ndtri.default: _in_float32(_ndtri),
    _aten.erfc.default: _in_float32(_erfc),
}
