"""Bessel functions, erfcx and orthogonal polynomials as elementwise math the engines run.

PyTorch's CPU kernels use Cephes' rational approximations (and, for the polynomials, a
recurrence as long as the degree). Here every function is a fixed chain of ScalarE activations
(exp, log, sin, cos, ...) and VectorE arithmetic in float32, chosen per range so that nothing
cancels: accurate to a few 1e-7 (relative, or absolute near a zero) over the whole domain,
checked against mpmath; eager's float32 kernels are themselves off by up to ~1e-6 near x = 5
(J0, J1, Y0, Y1) and near x = +-1 (Chebyshev U, V), where these are closer to the exact
values. Like :mod:`torchneuron.elementwise_math`, each is a decomposition, so it fuses with
its neighbours; 16-bit inputs are widened and the result rounded once.

- ``I0``, ``I1`` (and ``i0e``/``i1e``, scaled by exp(-|x|)): the power series
  sum_k y^k / (k! (k+nu)!), y = x^2 / 4 (positive terms, nested so that no coefficient
  underflows) below 10, the large-x expansion sum_k (-1)^k a_k / x^k above (A&S 9.7.1),
  times exp(|x|) in two halves (finite up to 91.9, where eager's kernel gives inf from 88.7).
- ``J0``, ``J1``: below 8, the trapezoid rule on Bessel's integral
  (1/pi) int_0^pi cos(nu t - x sin t) dt, periodic and analytic, so 16 nodes leave an error of
  J_32(x) (< 1e-16) and no series cancels; above 8, Hankel's expansions (A&S 9.2.5), whose
  smallest term there is ~exp(-16).
- ``Y0``, ``Y1``: the power series with the logarithm (A&S 9.1.13) below 4; on [4, 8], where
  that series would cancel to ~1e-5 in float32, a degree-14 Chebyshev interpolant whose
  coefficients are computed at import from the same series in double precision; Hankel above.
- ``K0``, ``K1`` (and the scaled ``k0e``/``k1e``): the series (A&S 9.6.13) up to 1, above it
  the trapezoid rule on int_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt (A&S 9.6.24) with 10
  nodes spread over the integrand's width at each x (it decays doubly exponentially, so the
  rule converges geometrically); exp(-x) applied last.
- ``spherical_bessel_j0``: sin(x) / x, its Taylor series below 0.5.
- ``erfcx`` (exp(x^2) erfc(x); ``special.log_ndtr`` decomposes into it): a Chebyshev
  interpolant in t = (x - 3) / (x + 3) below 10, fitted at import to libm's double erfc; the
  asymptotic series above; 2 exp(x^2) - erfcx(-x) below 0.
- Chebyshev ``T``, ``U``, ``V``, ``W`` (and the shifted ones, of 2x - 1) of a tensor degree:
  closed forms in x = cos(s) or cosh(s) (a recurrence as long as the degree cannot be unrolled
  for a degree that is data); see :func:`_chebyshev`. Past float32's range eager's recurrence
  gives NaN (inf - inf) a step or two after it overflows; these give inf.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from torchneuron.elementwise_math import _in_float32

__all__ = ["SPECIAL_DECOMPOSITIONS"]

_aten = torch.ops.aten

_EULER_GAMMA = 0.5772156649015329
_TWO_OVER_PI = 2.0 / math.pi

_I_ASYMPTOTIC = 10.0  # I: series below, the large-x expansion (12 terms: 1e-8) above
_I_TERMS = 17  # series terms: the truncation is < 2e-10 below 10
_J_ASYMPTOTIC = 8.0  # J and Y: Hankel's expansions above (smallest term ~exp(-16))
_J_NODES = 16  # trapezoid nodes over J's period: the error is J_32(x) < 1e-16 below 8
_Y_SERIES = 4.0  # Y: the power series below, the Chebyshev interpolant on [4, 8]
_Y_TERMS = 14
_Y_DEGREE = 14  # the interpolant's error: ~1e-13
_K_SERIES = 1.0  # K: the series up to here, the integral above
_K_TERMS = 8
_K_NODES = 10  # the rule's error is ~1e-11 (float64) with 10 nodes
_K_TAIL = 20.0  # the K integrand is cut where it has fallen by exp(-20)


def _harmonic(k: int) -> float:
    return sum(1.0 / j for j in range(1, k + 1))


def _asymptotic_terms(nu: int, count: int) -> list[float]:
    """a_k(nu) = prod_{j<=k} (4 nu^2 - (2j - 1)^2) / (8 j), k < count: the coefficients of the
    large-x expansions of I, K, J and Y (A&S 9.2.5-10, 9.7.1-2)."""
    terms, a = [], 1.0
    for k in range(count):
        terms.append(a)
        a *= (4 * nu * nu - (2 * k + 1) ** 2) / (8 * (k + 1))
    return terms


def _poly(coeffs: list[float], z: torch.Tensor) -> torch.Tensor:
    """sum_k coeffs[k] z^k by Horner's rule."""
    out = torch.full_like(z, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        out = out * z + c
    return out


# -- I ------------------------------------------------------------------------------------------


def _series_i(nu: int, y: torch.Tensor, terms: int) -> torch.Tensor:
    """sum_k y^k / (k! (k + nu)!) * nu!, nested as 1 + y / (1 (1 + nu)) (1 + y / (2 (2 + nu))
    (...)) so that no coefficient underflows float32."""
    out = torch.ones_like(y)
    for k in range(terms, 0, -1):
        out = 1.0 + out * y / (k * (k + nu))
    return out


def _i_large(nu: int, b: torch.Tensor) -> torch.Tensor:
    """I_nu(b) exp(-b) for b >= 10: sum_k (-1)^k a_k(nu) / b^k / sqrt(2 pi b)."""
    a = _asymptotic_terms(nu, 12)
    return _poly([(-1) ** k * c for k, c in enumerate(a)], 1.0 / b) * torch.rsqrt(2 * math.pi * b)


def _i_parts(nu: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(small, I_nu(a) by its series, I_nu(b) exp(-b)), a = |x| where |x| < 10, b = |x|
    elsewhere (each branch gets an argument it is exact for)."""
    ax = x.abs()
    small = ax < _I_ASYMPTOTIC
    a = torch.where(small, ax, 0.0)
    b = torch.where(small, 2 * _I_ASYMPTOTIC, ax)
    series = _series_i(nu, a * a * 0.25, _I_TERMS)
    if nu == 1:
        series = series * (0.5 * a)
    return small, series, _i_large(nu, b)


def _odd_sign(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 0, -r, r)


def _times_exp(scaled: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """scaled * exp(|x|) in two halves: finite up to I's own overflow (|x| ~ 91.9), where
    exp(|x|) alone overflows from 88.7 (eager's kernels give inf there)."""
    half = torch.exp(0.5 * x.abs())
    return scaled * half * half


def _i0(x: torch.Tensor) -> torch.Tensor:
    small, series, large = _i_parts(0, x)
    return torch.where(small, series, _times_exp(large, x))


def _i1(x: torch.Tensor) -> torch.Tensor:
    small, series, large = _i_parts(1, x)
    return _odd_sign(x, torch.where(small, series, _times_exp(large, x)))


def _i0e(x: torch.Tensor) -> torch.Tensor:
    small, series, large = _i_parts(0, x)
    return torch.where(small, series * torch.exp(-x.abs()), large)


def _i1e(x: torch.Tensor) -> torch.Tensor:
    small, series, large = _i_parts(1, x)
    return _odd_sign(x, torch.where(small, series * torch.exp(-x.abs()), large))


# -- J and Y ------------------------------------------------------------------------------------


def _j_integral(nu: int, a: torch.Tensor) -> torch.Tensor:
    """J_nu(a), nu = 0, 1, 0 <= a < 8: the trapezoid rule on (1/pi) int_0^pi cos(a sin t) dt
    and (1/pi) int_0^pi sin t sin(a sin t) dt, at t_j = j pi / 16; sin t_j is symmetric about
    pi/2, so each pair of nodes is one term."""
    n = _J_NODES
    if nu == 0:
        out = 0.5 * (1.0 + torch.cos(a))
        for j in range(1, n // 2):
            out = out + torch.cos(a * math.sin(math.pi * j / n))
    else:
        out = 0.5 * torch.sin(a)
        for j in range(1, n // 2):
            s = math.sin(math.pi * j / n)
            out = out + s * torch.sin(a * s)
    return out * (2.0 / n)


def _hankel(nu: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(J_nu(b), Y_nu(b)) for b >= 8 (A&S 9.2.5-10): sqrt(2 / (pi b)) (P cos w - Q sin w) and
    (P sin w + Q cos w), w = b - (2 nu + 1) pi / 4."""
    a = _asymptotic_terms(nu, 18)
    z = 1.0 / (b * b)
    p = _poly([(-1) ** k * a[2 * k] for k in range(9)], z)
    q = _poly([(-1) ** k * a[2 * k + 1] for k in range(9)], z) / b
    # cos(b - pi/4) = (cos b + sin b) / sqrt 2 and sin(b - pi/4) = (sin b - cos b) / sqrt 2,
    # so b - pi/4 is never rounded; for nu = 1 the phase moves by another -pi/2.
    c, s = torch.cos(b), torch.sin(b)
    cw, sw = (c + s, s - c) if nu == 0 else (s - c, -(c + s))
    scale = torch.rsqrt(math.pi * b)  # sqrt(2 / (pi b)) / sqrt 2
    return scale * (p * cw - q * sw), scale * (p * sw + q * cw)


def _j(nu: int, x: torch.Tensor) -> torch.Tensor:
    ax = x.abs()
    small = ax < _J_ASYMPTOTIC
    a = torch.where(small, ax, 0.0)
    b = torch.where(small, 2 * _J_ASYMPTOTIC, ax)
    out = torch.where(small, _j_integral(nu, a), _hankel(nu, b)[0])  # NaN at inf, as eager
    return _odd_sign(x, out) if nu == 1 else out


def _j0(x: torch.Tensor) -> torch.Tensor:
    return _j(0, x)


def _j1(x: torch.Tensor) -> torch.Tensor:
    return _j(1, x)


def _y_series_coeffs(nu: int, terms: int) -> list[float]:
    """Y0 = (2/pi) ((log(x/2) + gamma) J0(x) + sum_k c_k y^k) and
    Y1 = (2/pi) (log(x/2) J1(x) - 1/x - (x/4) sum_k c_k y^k), y = x^2 / 4 (A&S 9.1.13, with
    psi(k+1) = H_k - gamma)."""
    if nu == 0:
        return [0.0] + [
            (-1) ** (k + 1) * _harmonic(k) / math.factorial(k) ** 2 for k in range(1, terms)
        ]
    return [
        (-1) ** k
        * (2 * _harmonic(k) + 1.0 / (k + 1) - 2 * _EULER_GAMMA)
        / (math.factorial(k) * math.factorial(k + 1))
        for k in range(terms)
    ]


_Y_COEFFS = [_y_series_coeffs(nu, _Y_TERMS) for nu in (0, 1)]


def _y_double(nu: int, x: float) -> float:
    """Y_nu(x) by the same series in double precision (it cancels to ~1e-13 below 8): the
    values the float32 interpolant on [4, 8] is fitted to."""
    y = x * x / 4
    j = (x / 2) ** nu * sum(
        (-y) ** k / (math.factorial(k) * math.factorial(k + nu)) for k in range(40)
    )
    s = sum(c * y**k for k, c in enumerate(_y_series_coeffs(nu, 40)))
    if nu == 0:
        return _TWO_OVER_PI * ((math.log(x / 2) + _EULER_GAMMA) * j + s)
    return _TWO_OVER_PI * (math.log(x / 2) * j - 1 / x - 0.25 * x * s)


def _chebyshev_fit(f: Callable[[float], float], lo: float, hi: float, degree: int) -> list[float]:
    """c_k of sum_k c_k T_k(t), t = (2x - lo - hi) / (hi - lo): the interpolant of ``f`` at
    the Chebyshev points of [lo, hi] (near-minimax for an analytic ``f``)."""
    n = degree + 1
    angles = [math.pi * (i + 0.5) / n for i in range(n)]
    values = [f(0.5 * (hi - lo) * math.cos(t) + 0.5 * (hi + lo)) for t in angles]
    return [
        (2.0 - (k == 0)) / n * sum(v * math.cos(k * t) for v, t in zip(values, angles, strict=True))
        for k in range(n)
    ]


def _clenshaw(coeffs: list[float], lo: float, hi: float, x: torch.Tensor) -> torch.Tensor:
    """sum_k c_k T_k(t) for x in [lo, hi], by Clenshaw's recurrence."""
    t2 = (4.0 / (hi - lo)) * x - 2.0 * (hi + lo) / (hi - lo)  # 2 t
    b1, b2 = torch.zeros_like(x), torch.zeros_like(x)
    for c in reversed(coeffs[1:]):
        b1, b2 = t2 * b1 - b2 + c, b1
    return 0.5 * t2 * b1 - b2 + coeffs[0]


_Y_FIT = [
    _chebyshev_fit(functools.partial(_y_double, nu), _Y_SERIES, _J_ASYMPTOTIC, _Y_DEGREE)
    for nu in (0, 1)
]


def _y(nu: int, x: torch.Tensor) -> torch.Tensor:
    """Y_nu(x): NaN below 0, -inf at 0, NaN at inf (as eager)."""
    small = x < _Y_SERIES
    mid = (x >= _Y_SERIES) & (x < _J_ASYMPTOTIC)
    a = torch.where(small & (x > 0), x, 1.0)
    b = torch.where(x < _J_ASYMPTOTIC, 2 * _J_ASYMPTOTIC, x)
    y = a * a * 0.25
    log_half = torch.log(0.5 * a)
    s = _poly(_Y_COEFFS[nu], y)
    if nu == 0:
        series = (log_half + _EULER_GAMMA) * _j_integral(0, a) + s
    else:
        series = log_half * _j_integral(1, a) - 1.0 / a - 0.25 * a * s
    fit = _clenshaw(_Y_FIT[nu], _Y_SERIES, _J_ASYMPTOTIC, torch.where(mid, x, _Y_SERIES))
    out = torch.where(small, _TWO_OVER_PI * series, torch.where(mid, fit, _hankel(nu, b)[1]))
    out = torch.where(x == 0, -math.inf, out)
    return torch.where(x < 0, math.nan, out)


def _y0(x: torch.Tensor) -> torch.Tensor:
    return _y(0, x)


def _y1(x: torch.Tensor) -> torch.Tensor:
    return _y(1, x)


# -- K ------------------------------------------------------------------------------------------

# K0 = -(log(x/2) + gamma) I0(x) + sum_k c_k y^k, K1 = 1/x + log(x/2) I1(x) - (x/4) sum_k c_k
# y^k (A&S 9.6.13, 9.6.11): positive series that converge in a few terms up to x = 1.
_K_COEFFS = [
    [0.0] + [_harmonic(k) / math.factorial(k) ** 2 for k in range(1, _K_TERMS)],
    [
        (2 * _harmonic(k) + 1.0 / (k + 1) - 2 * _EULER_GAMMA)
        / (math.factorial(k) * math.factorial(k + 1))
        for k in range(_K_TERMS)
    ],
]


def _k_series(nu: int, a: torch.Tensor) -> torch.Tensor:
    y = a * a * 0.25
    log_half = torch.log(0.5 * a)
    s = _poly(_K_COEFFS[nu], y)
    if nu == 0:
        return s - (log_half + _EULER_GAMMA) * _series_i(0, y, _K_TERMS)
    return 1.0 / a + log_half * (0.5 * a) * _series_i(1, y, _K_TERMS) - 0.25 * a * s


def _k_integral_scaled(nu: int, b: torch.Tensor) -> torch.Tensor:
    """K_nu(b) exp(b) for b > 1: the trapezoid rule on int_0^T exp(-b (cosh t - 1)) cosh(nu t)
    dt, T = acosh(1 + 20 / b), with its nodes spread over [0, T] so that they follow the
    integrand's width (~1/sqrt(b)) at any b. d_j = cosh(j h) - 1 by the recurrence
    d_(j+1) = 2 d_j - d_(j-1) + 2 d_1 (1 + d_j) (cosh's addition formula; exact for small t,
    where cosh(t) - 1 itself would cancel), so each node costs one exp."""
    h = torch.acosh(1.0 + _K_TAIL / b) / _K_NODES
    e = torch.expm1(h)
    d1 = e * e / (2.0 * (1.0 + e))
    out = torch.full_like(b, 0.5)  # the t = 0 node, halved
    before, d = torch.zeros_like(b), d1
    for j in range(1, _K_NODES + 1):
        term = torch.exp(-b * d)
        out = out + (term if nu == 0 else term * (1.0 + d))
        if j < _K_NODES:
            before, d = d, 2.0 * d - before + 2.0 * d1 * (1.0 + d)
    return out * h


def _k_parts(nu: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(small, K_nu(a) by its series, K_nu(b) exp(b) by the integral)."""
    small = x <= _K_SERIES
    a = torch.where(small & (x > 0), x, 1.0)
    b = torch.where(small, 2 * _K_SERIES, x)
    return small, _k_series(nu, a), _k_integral_scaled(nu, b)


def _k_edges(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """NaN below 0, inf at 0, 0 at inf (as eager)."""
    out = torch.where(x == math.inf, 0.0, out)
    out = torch.where(x == 0, math.inf, out)
    return torch.where(x < 0, math.nan, out)


def _k(nu: int, x: torch.Tensor) -> torch.Tensor:
    small, series, scaled = _k_parts(nu, x)
    return _k_edges(x, torch.where(small, series, scaled * torch.exp(-x)))


def _k_scaled(nu: int, x: torch.Tensor) -> torch.Tensor:
    small, series, scaled = _k_parts(nu, x)
    return _k_edges(x, torch.where(small, series * torch.exp(torch.clamp(x, max=1.0)), scaled))


# -- spherical j0 -------------------------------------------------------------------------------


def _spherical_j0(x: torch.Tensor) -> torch.Tensor:
    """sin(x) / x; below 0.5 its Taylor series (0/0 at 0)."""
    small = x.abs() < 0.5
    a = torch.where(small, 1.0, x)
    z = x * x
    series = 1.0 - z / 6.0 * (1.0 - z / 20.0 * (1.0 - z / 42.0 * (1.0 - z / 72.0)))
    out = torch.where(small, series, torch.sin(a) / a)
    return torch.where(x.abs() == math.inf, 0.0, out)


# -- erfcx ----------------------------------------------------------------------------------------

_ERFCX_ASYMPTOTIC = 10.0  # the large-x series (8 terms: 1e-12) above, the interpolant below
_ERFCX_SCALE = 3.0  # t = (x - 3) / (x + 3) maps [0, 10] to [-1, 7/13]


def _erfcx_double(t: float) -> float:
    """erfcx at x = 3 (1 + t) / (1 - t), x < 10, in double precision (libm's erfc keeps its
    relative precision; exp(x^2) < exp(100))."""
    x = _ERFCX_SCALE * (1 + t) / (1 - t)
    return math.erfc(x) * math.exp(x * x)


_ERFCX_T_MAX = (_ERFCX_ASYMPTOTIC - _ERFCX_SCALE) / (_ERFCX_ASYMPTOTIC + _ERFCX_SCALE)
_ERFCX_FIT = _chebyshev_fit(_erfcx_double, -1.0, _ERFCX_T_MAX, 12)  # error ~1e-10
# erfcx(x) ~ (1 / (x sqrt(pi))) sum_k (-1)^k (2k - 1)!! / (2 x^2)^k (A&S 7.1.23)
_ERFCX_SERIES = [(-1) ** k * math.prod(range(1, 2 * k, 2)) for k in range(8)]


def _erfcx(x: torch.Tensor) -> torch.Tensor:
    """exp(x^2) erfc(x): for x >= 0 a degree-12 Chebyshev interpolant in t = (x - 3) / (x + 3)
    (erfcx is smooth in t up to x = inf) below 10, the asymptotic series above; for x < 0,
    2 exp(x^2) - erfcx(-x) (inf once exp(x^2) overflows, as eager)."""
    ax = x.abs()
    small = ax < _ERFCX_ASYMPTOTIC
    a = torch.where(small, ax, 0.0)
    b = torch.where(small, _ERFCX_ASYMPTOTIC, ax)
    fit = _clenshaw(_ERFCX_FIT, -1.0, _ERFCX_T_MAX, (a - _ERFCX_SCALE) / (a + _ERFCX_SCALE))
    series = _poly(_ERFCX_SERIES, 0.5 / (b * b)) / (b * math.sqrt(math.pi))
    positive = torch.where(small, fit, series)
    return torch.where(x < 0, 2.0 * torch.exp(x * x) - positive, positive)


# -- Chebyshev polynomials of a tensor degree ---------------------------------------------------


def _chebyshev(kind: str, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """T_n, U_n, V_n or W_n (``kind`` "t", "u", "v", "w") at any degree n (truncated toward 0,
    as eager; a negative or non-finite one gives 0) from the closed forms in x = cos(s)
    (|x| < 1) or cosh(s): T = cos(n s), U = sin((n+1) s) / sin(s), V = cos((n+1/2) s) /
    cos(s/2), W = sin((n+1/2) s) / sin(s/2) (cosh and sinh outside). Negative x by the
    reflections T_n(-x) = (-1)^n T_n(x), U likewise and V_n(-x) = (-1)^n W_n(x), so the angle
    stays in [0, pi/2]; the divisors come from 1 -+ x, exact: sin(s) = sqrt((1-x)(1+x)),
    cos(s/2) = sqrt((1+x)/2), sin(s/2) = sqrt((1-x)/2)."""
    n = torch.where(torch.isfinite(n), torch.trunc(n), -1.0)
    x, n = torch.broadcast_tensors(x, n)
    a = x.abs()
    odd = torch.remainder(n, 2.0) == 1.0
    parity = torch.where(odd, -1.0, 1.0)
    inside = a < 1.0
    ai = torch.where(inside, a, 0.5)
    ao = torch.where(inside, 2.0, a)
    s_in, s_out = torch.acos(ai), torch.acosh(ao)

    def value(k: str) -> torch.Tensor:
        if k == "t":
            return torch.where(inside, torch.cos(n * s_in), torch.cosh(n * s_out))
        m = n + (1.0 if k == "u" else 0.5)
        if k == "u":
            inner = torch.sin(m * s_in) / torch.sqrt((1.0 - ai) * (1.0 + ai))
            outer = torch.sinh(m * s_out) / torch.sqrt((ao - 1.0) * (ao + 1.0))
        elif k == "v":
            inner = torch.cos(m * s_in) / torch.sqrt(0.5 * (1.0 + ai))
            outer = torch.cosh(m * s_out) / torch.sqrt(0.5 * (ao + 1.0))
        else:
            inner = torch.sin(m * s_in) / torch.sqrt(0.5 * (1.0 - ai))
            outer = torch.sinh(m * s_out) / torch.sqrt(0.5 * (ao - 1.0))
        return torch.where(inside, inner, outer)

    if kind in ("t", "u"):
        out = value(kind)
    else:
        out = torch.where(x < 0, value("w" if kind == "v" else "v"), value(kind))
    out = torch.where(x < 0, parity * out, out)
    # x = +-1: the limits of the forms above (0/0 there).
    one = {"t": 1.0, "u": n + 1.0, "v": 1.0, "w": 2.0 * n + 1.0}[kind]
    minus_one = {"t": 1.0, "u": n + 1.0, "v": 2.0 * n + 1.0, "w": 1.0}[kind]
    out = torch.where(x == 1.0, one, torch.where(x == -1.0, parity * minus_one, out))
    return torch.where(n < 0, 0.0, torch.where(n == 0, 1.0, out))


def _polynomial_op(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], shifted: bool = False
) -> Callable[..., object]:
    """The decomposition of a polynomial of a tensor degree, ``fn(x, n)`` (any overload: either
    argument may be a Python scalar); ``shifted`` evaluates it at 2x - 1."""

    def decomposition(x: torch.Tensor | float, n: torch.Tensor | float) -> object:
        dtype = torch.result_type(x, n)
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return NotImplemented
        like = x if isinstance(x, torch.Tensor) else n
        assert isinstance(like, torch.Tensor)
        xt = (
            x.to(torch.float32)
            if isinstance(x, torch.Tensor)
            else torch.full_like(like, x, dtype=torch.float32)
        )
        nt = (
            n.to(torch.float32)
            if isinstance(n, torch.Tensor)
            else torch.full_like(like, n, dtype=torch.float32)
        )
        if shifted:
            xt = xt + xt - 1.0  # as eager: x + x - 1, rounded once
        return fn(xt, nt).to(dtype)

    return decomposition


def _polynomial_table() -> dict[torch._ops.OpOverload, Callable[..., object]]:
    fns = {
        f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}": _polynomial_op(
            functools.partial(_chebyshev, kind), shifted
        )
        for shifted in (False, True)
        for kind in "tuvw"
    }
    fns["hermite_polynomial_h"] = _polynomial_op(functools.partial(_hermite, True))
    fns["hermite_polynomial_he"] = _polynomial_op(functools.partial(_hermite, False))
    table: dict[torch._ops.OpOverload, Callable[..., object]] = {}
    for name, fn in fns.items():
        packet = getattr(_aten, f"special_{name}")
        for overload in ("default", "x_scalar", "n_scalar"):
            table[getattr(packet, overload)] = fn
    return table


# -- Hermite polynomials of a tensor degree ------------------------------------------------------

_HERMITE_LIMIT = 128  # eager's float32 kernels return NaN above this degree


def _hermite(physicists: bool, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """H_n (physicists') or He_n at a degree up to 128: eager's own recurrence, step for step
    in float32 (H: r = 2x q - 2k p; He: r = x q - k p), unrolled to its 128 steps and the
    step n selected; NaN above 128 and 0 below 0, as eager (a non-finite degree counts as
    negative)."""
    n = torch.where(torch.isfinite(n), torch.trunc(n), -1.0)
    x, n = torch.broadcast_tensors(x, n)
    two_x = x + x if physicists else x
    p, q = torch.ones_like(x), two_x
    out = torch.where(n == 1, q, 1.0)
    for k in range(1, _HERMITE_LIMIT):
        p, q = q, two_x * q - (2 * k if physicists else k) * p
        out = torch.where(n == k + 1, q, out)
    out = torch.where(n > _HERMITE_LIMIT, math.nan, out)
    return torch.where(n < 0, 0.0, out)


#: op -> its decomposition (``NotImplemented`` for dtypes it does not cover).
SPECIAL_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., object]] = {
    _aten.i0.default: _in_float32(_i0),
    _aten.special_i0e.default: _in_float32(_i0e),
    _aten.special_i1.default: _in_float32(_i1),
    _aten.special_i1e.default: _in_float32(_i1e),
    _aten.special_modified_bessel_i0.default: _in_float32(_i0),
    _aten.special_modified_bessel_i1.default: _in_float32(_i1),
    _aten.special_bessel_j0.default: _in_float32(_j0),
    _aten.special_bessel_j1.default: _in_float32(_j1),
    _aten.special_bessel_y0.default: _in_float32(_y0),
    _aten.special_bessel_y1.default: _in_float32(_y1),
    _aten.special_modified_bessel_k0.default: _in_float32(functools.partial(_k, 0)),
    _aten.special_modified_bessel_k1.default: _in_float32(functools.partial(_k, 1)),
    _aten.special_scaled_modified_bessel_k0.default: _in_float32(functools.partial(_k_scaled, 0)),
    _aten.special_scaled_modified_bessel_k1.default: _in_float32(functools.partial(_k_scaled, 1)),
    _aten.special_spherical_bessel_j0.default: _in_float32(_spherical_j0),
    _aten.special_erfcx.default: _in_float32(_erfcx),
    **_polynomial_table(),
}
