"""Matrix factorizations and solves as device math: Cholesky, LU with partial pivoting,
Householder QR and the solves, inverses and determinants built on them; singular values,
symmetric eigenvalues and pseudo-inverses by Jacobi rotations; the matrix exponential.

Each factorization is LAPACK's unblocked algorithm (``potf2``, ``getf2``, ``geqr2``) unrolled
over the columns at trace time: a column step is a handful of whole-matrix VectorE operations
(a masked outer-product update, a select of the new column) and a TensorE matrix-vector
product, so the matrix stays on chip and the steps run back to back with no host round trip.
Row interchanges are gathers whose index is computed on the device (an ``argmax`` of the
column, then a swap of two positions of an iota). Pivots, Householder scalars and ``info``
follow LAPACK's conventions (first largest pivot, ``beta = -sign(alpha) ||x||``, info = the
first failing column, 1-based) so that every output matches eager PyTorch, which calls LAPACK.

The unrolled form costs a few instructions per column, so it is used up to
:data:`MAX_UNROLLED` columns (OpInfo's and the usual small-matrix uses: 3x3 rotations, 5x5
covariances, the per-head solves of some attention variants); larger matrices keep the op
whole (a counted fallback) until a blocked TensorE form exists. float64 and complex inputs
stay eager (the device has neither dtype); 16-bit inputs too, as on CPU where LAPACK has no
16-bit kernels.

Jacobi (:func:`_jacobi`) runs a fixed number of sweeps, n / 2 rotations at once per round as
one rotation matrix (two TensorE matmuls). It gives values only: vectors are defined up to
sign and LAPACK's signs come from its own algorithm, so an SVD or eigh whose vectors are read
stays eager (counted); the pseudo-inverse, unique whatever the signs, is built from them. The
matrix exponential scales A to a norm of at most 1 by a power of two computed on the device,
sums a Taylor series and squares back, selecting past the squarings it needs.

``_linalg_check_errors`` (the check ``torch.linalg.cholesky``, ``inv`` and ``solve`` run on
``info``) reads a device result and raises on the host, as torch does on every device; it is
not device work (:func:`torchneuron.partition.is_op`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx

__all__ = ["LINALG_DECOMPOSITIONS", "MAX_UNROLLED", "values_only_factorizations"]

_aten = torch.ops.aten

#: The most columns (or rows, for a triangular solve) a factorization is unrolled over.
MAX_UNROLLED = 64


def _fits(*tensors: torch.Tensor) -> bool:
    """float32 matrices whose sizes are known at trace time and small enough to unroll."""
    return all(
        t.dtype == torch.float32
        and all(isinstance(n, int) for n in t.shape)
        and (t.dim() < 2 or min(t.shape[-2:]) <= MAX_UNROLLED)
        for t in tensors
    )


def _iota(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(n, device=like.device)


def _first_true(flags: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """LAPACK's ``info``: 1 + the index of the first true flag along the list, 0 if none."""
    if not flags:
        return torch.zeros(like.shape[:-2], dtype=torch.int32, device=like.device)
    stacked = torch.stack(flags, -1).to(torch.int32)
    first = torch.argmax(stacked, -1).to(torch.int32) + 1
    return torch.where(stacked.amax(-1) > 0, first, 0).to(torch.int32)


def _batch_broadcast(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` [..., m, m] and ``b`` [..., m, k] with their batch dims broadcast together."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])


# -- Cholesky -------------------------------------------------------------------------------


def _cholesky_lower(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``potf2`` on the lower triangle of ``a``: L with L L^T = A, and info. Like LAPACK, a
    failing column keeps its pivot's value (not positive) and the columns from there on keep
    A's entries."""
    n = a.shape[-1]
    rows = _iota(n, a)
    columns: list[torch.Tensor] = []
    failed: list[torch.Tensor] = []
    stopped = torch.zeros(a.shape[:-2], dtype=torch.bool, device=a.device)
    for j in range(n):
        original = torch.where(rows >= j, a[..., :, j], 0.0)
        v = a[..., :, j]
        if columns:
            done = torch.stack(columns, -1)  # [..., n, j]
            v = v - (done @ done[..., j, :].unsqueeze(-1)).squeeze(-1)
        d = v[..., j]
        fails = ~stopped & ~(d > 0)
        root = torch.sqrt(d).unsqueeze(-1)
        column = torch.where(rows == j, root, v / root)
        column = torch.where(rows >= j, column, 0.0)
        at_failure = torch.where(rows == j, d.unsqueeze(-1), original)
        column = torch.where(
            stopped.unsqueeze(-1), original, torch.where(fails.unsqueeze(-1), at_failure, column)
        )
        columns.append(column)
        failed.append(fails)
        stopped = stopped | fails
    lower = torch.stack(columns, -1) if columns else torch.zeros_like(a)
    return lower, _first_true(failed, a)


def linalg_cholesky_ex(a: torch.Tensor, upper: bool = False, check_errors: bool = False) -> object:
    if check_errors or not _fits(a):
        return NotImplemented
    lower, info = _cholesky_lower(a.mT if upper else a)
    return (lower.mT if upper else lower), info


def cholesky(a: torch.Tensor, upper: bool = False) -> object:
    if not _fits(a):
        return NotImplemented
    lower, _ = _cholesky_lower(a.mT if upper else a)
    return lower.mT if upper else lower


# -- triangular solves ----------------------------------------------------------------------


def _substitute(t: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool) -> torch.Tensor:
    """X with T X = B for triangular ``t`` [..., n, n] and ``b`` [..., n, k]: forward (lower)
    or back (upper) substitution, one row of X per step."""
    t, b = _batch_broadcast(t, b)
    n = t.shape[-1]
    solved: dict[int, torch.Tensor] = {}
    order = range(n - 1, -1, -1) if upper else range(n)
    for i in order:
        r = b[..., i, :]
        known = sorted(solved)
        if known:
            lo, hi = known[0], known[-1] + 1
            r = r - (
                t[..., i : i + 1, lo:hi] @ torch.stack([solved[k] for k in known], -2)
            ).squeeze(-2)
        solved[i] = r if unit else r / t[..., i, i].unsqueeze(-1)
    if not solved:
        return torch.zeros_like(b)
    return torch.stack([solved[i] for i in range(n)], -2)


def linalg_solve_triangular(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    upper: bool,
    left: bool = True,
    unitriangular: bool = False,
) -> object:
    if not _fits(a, b):
        return NotImplemented
    if left:
        return _substitute(a, b, upper, unitriangular)
    return _substitute(a.mT, b.mT, not upper, unitriangular).mT


def triangular_solve(
    b: torch.Tensor,
    a: torch.Tensor,
    upper: bool = True,
    transpose: bool = False,
    unitriangular: bool = False,
) -> object:
    if not _fits(a, b):
        return NotImplemented
    t = a.mT if transpose else a
    x = _substitute(t, b, upper != transpose, unitriangular)
    return x, a.clone()


def cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> object:
    """A X = B with A = L L^T (or U^T U)."""
    if not _fits(b, factor):
        return NotImplemented
    lower = factor.mT if upper else factor
    return _substitute(lower.mT, _substitute(lower, b, False, False), True, False)


def cholesky_inverse(factor: torch.Tensor, upper: bool = False) -> object:
    if not _fits(factor):
        return NotImplemented
    n = factor.shape[-1]
    eye = torch.eye(n, dtype=factor.dtype, device=factor.device).expand_as(factor)
    return cholesky_solve(eye, factor, upper)


# -- LU with partial pivoting ---------------------------------------------------------------


def _swap(index: torch.Tensor, j: int, p: torch.Tensor) -> torch.Tensor:
    """``index`` [..., m] with positions ``j`` and ``p`` [...] exchanged."""
    at = _iota(index.shape[-1], index)
    p = p.unsqueeze(-1)
    source = torch.where(at == j, p, torch.where(at == p, j, at))
    return torch.gather(index, -1, source)


def _lu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``getf2``: LU (L's unit diagonal implied), pivots (1-based, int32), info and the row
    order ``perm`` with LU = A[perm] (so A = P L U with P[perm[i], i] = 1)."""
    m, n = a.shape[-2:]
    k = min(m, n)
    rows, cols = _iota(m, a), _iota(n, a)
    perm = rows.expand(*a.shape[:-2], m)
    pivots: list[torch.Tensor] = []
    singular: list[torch.Tensor] = []
    for j in range(k):
        size = torch.where(rows >= j, a[..., :, j].abs(), -1.0)
        p = torch.argmax(size, -1)
        pivots.append(p.to(torch.int32) + 1)
        source = _swap(rows.expand_as(perm), j, p)
        a = torch.gather(a, -2, source.unsqueeze(-1).expand_as(a))
        perm = torch.gather(perm, -1, source)
        pivot = a[..., j, j].unsqueeze(-1)
        singular.append(a[..., j, j] == 0)
        below = torch.where((rows > j) & (pivot != 0), a[..., :, j] * torch.reciprocal(pivot), 0.0)
        right = torch.where(cols > j, a[..., j, :], 0.0)
        a = a - below.unsqueeze(-1) * right.unsqueeze(-2)
        in_column = (rows.unsqueeze(-1) > j) & (cols == j)
        a = torch.where(in_column, below.unsqueeze(-1), a)
    if pivots:
        pivot_tensor = torch.stack(pivots, -1)
    else:
        pivot_tensor = torch.zeros((*a.shape[:-2], 0), dtype=torch.int32, device=a.device)
    return a, pivot_tensor, _first_true(singular, a), perm


def _permutation(perm: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """P [..., m, m] with P[perm[i], i] = 1."""
    rows = _iota(perm.shape[-1], perm)
    return (perm.unsqueeze(-2) == rows.unsqueeze(-1)).to(dtype)


def _perm_from_pivots(pivots: torch.Tensor, m: int) -> torch.Tensor:
    """The row order the (1-based) interchanges ``pivots`` make of m rows."""
    perm = _iota(m, pivots).expand(*pivots.shape[:-1], m)
    for j in range(pivots.shape[-1]):
        perm = _swap(perm, j, pivots[..., j].to(torch.int64) - 1)
    return perm


def _unpack(lu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-lower L [..., m, k] and upper U [..., k, n] of a packed LU."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    eye = torch.eye(m, k, dtype=lu.dtype, device=lu.device)
    return torch.tril(lu[..., :, :k], -1) + eye, torch.triu(lu[..., :k, :])


def linalg_lu_factor_ex(
    a: torch.Tensor, *, pivot: bool = True, check_errors: bool = False
) -> object:
    if not pivot or check_errors or not _fits(a):
        return NotImplemented
    lu, pivots, info, _ = _lu(a)
    return lu, pivots, info


def linalg_lu(a: torch.Tensor, *, pivot: bool = True) -> object:
    if not pivot or not _fits(a):
        return NotImplemented
    lu, _, _, perm = _lu(a)
    lower, upper = _unpack(lu)
    return _permutation(perm, a.dtype), lower, upper


def lu_unpack(
    lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool = True, unpack_pivots: bool = True
) -> object:
    if not _fits(lu):
        return NotImplemented
    empty = lu.new_empty(0)
    lower, upper = _unpack(lu) if unpack_data else (empty, empty)
    if not unpack_pivots:
        return empty, lower, upper
    return _permutation(_perm_from_pivots(pivots, lu.shape[-2]), lu.dtype), lower, upper


def _lu_solve(lu: torch.Tensor, perm: torch.Tensor, b: torch.Tensor, adjoint: bool) -> torch.Tensor:
    """X with A X = B (or A^T X = B) for A = P L U given as its packed LU and row order."""
    lu, b = _batch_broadcast(lu, b)
    perm = perm.expand(*lu.shape[:-2], perm.shape[-1])
    if not adjoint:  # X = U^-1 L^-1 P^T B, (P^T B)[i] = B[perm[i]]
        b = torch.gather(b, -2, perm.unsqueeze(-1).expand_as(b))
        return _substitute(lu, _substitute(lu, b, False, True), True, False)
    # A^T = U^T L^T P^T: X = P L^-T U^-T B
    z = _substitute(lu.mT, _substitute(lu.mT, b, False, False), True, True)
    rows = _iota(perm.shape[-1], perm)
    inverse = ((perm.unsqueeze(-2) == rows.unsqueeze(-1)) * rows).sum(-1)
    return torch.gather(z, -2, inverse.unsqueeze(-1).expand_as(z))


def linalg_lu_solve(
    lu: torch.Tensor,
    pivots: torch.Tensor,
    b: torch.Tensor,
    *,
    left: bool = True,
    adjoint: bool = False,
) -> object:
    if not _fits(lu, b):
        return NotImplemented
    perm = _perm_from_pivots(pivots, lu.shape[-1])
    if left:
        return _lu_solve(lu, perm, b, adjoint)
    # X A = B: A^T X^T = B^T
    return _lu_solve(lu, perm, b.mT, not adjoint).mT


def _factor_transposed(a: torch.Tensor) -> bool:
    """Whether torch's det and slogdet factor A^T rather than A (they do for contiguous real
    A; ``_linalg_solve_ex`` factors A itself); their backward formulas read LU so."""
    return a.is_contiguous()


def _det_parts(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """LU and pivots as torch's det/slogdet return them, the diagonal of U and the
    permutation's sign."""
    lu, pivots, _, _ = _lu(a.mT if _factor_transposed(a) else a)
    n = a.shape[-1]
    diagonal = torch.diagonal(lu, dim1=-2, dim2=-1)
    if not n:
        return lu, pivots, diagonal, a.new_ones(a.shape[:-2])
    moved = (pivots != (_iota(n, a) + 1).to(torch.int32)).to(torch.int32).sum(-1)
    sign = 1.0 - 2.0 * (moved % 2).to(a.dtype)
    return lu, pivots, diagonal, sign


def _product(t: torch.Tensor) -> torch.Tensor:
    """The product along the last dim (1 for an empty one)."""
    return torch.prod(t, -1) if t.shape[-1] else t.new_ones(t.shape[:-1])


def linalg_det(a: torch.Tensor) -> object:
    if not _fits(a):
        return NotImplemented
    lu, pivots, diagonal, sign = _det_parts(a)
    return sign * _product(diagonal), lu, pivots


def linalg_slogdet(a: torch.Tensor) -> object:
    if not _fits(a):
        return NotImplemented
    lu, pivots, diagonal, sign = _det_parts(a)
    signs = torch.where(diagonal > 0, 1.0, torch.where(diagonal < 0, -1.0, 0.0))
    logabs = torch.log(diagonal.abs())
    logabs = logabs.sum(-1) if a.shape[-1] else a.new_zeros(a.shape[:-2])
    return sign * _product(signs), logabs, lu, pivots


def _is_vector_rhs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch's rule (``linalg_solve_is_vector_rhs``)."""
    return b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])


def _solve(
    a: torch.Tensor, b: torch.Tensor, left: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_linalg_solve_ex``'s results: X, and LU, pivots and info as torch returns them."""
    vector = _is_vector_rhs(a, b)
    rhs = b.unsqueeze(-1) if vector else b
    lu, pivots, info, perm = _lu(a)
    if left:
        x = _lu_solve(lu, perm, rhs, False)
    else:  # X A = B: A^T X^T = B^T
        x = _lu_solve(lu, perm, rhs.mT, True).mT
    return (x.squeeze(-1) if vector else x), lu, pivots, info


def linalg_solve_ex(
    a: torch.Tensor, b: torch.Tensor, *, left: bool = True, check_errors: bool = False
) -> object:
    if check_errors or not _fits(a, b):
        return NotImplemented
    return _solve(a, b, left)


def linalg_inv_ex(a: torch.Tensor, *, check_errors: bool = False) -> object:
    if check_errors or not _fits(a):
        return NotImplemented
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    x, _, _, info = _solve(a, eye, True)
    return x, info


# -- Householder QR -------------------------------------------------------------------------


def _reflector(a: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``larfg`` on column j of ``a`` from row j: v (v[j] = 1, zeros above), tau and beta,
    with (I - tau v v^T) a[:, j] = beta e_j."""
    rows = _iota(a.shape[-2], a)
    x = a[..., :, j]
    alpha = a[..., j, j]
    tail = torch.where(rows > j, x, 0.0)
    xnorm = torch.sqrt((tail * tail).sum(-1))
    norm = torch.sqrt(alpha * alpha + xnorm * xnorm)
    reflect = xnorm != 0
    beta = torch.where(reflect, torch.where(alpha >= 0, -norm, norm), alpha)
    tau = torch.where(reflect, (beta - alpha) / beta, 0.0)
    scale = torch.where(reflect, 1.0 / (alpha - beta), 0.0)
    v = torch.where(rows > j, tail * scale.unsqueeze(-1), (rows == j).to(a.dtype))
    return v, tau, beta


def _reflect_left(c: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """(I - tau v v^T) C."""
    w = (v.unsqueeze(-2) @ c).squeeze(-2)
    return c - tau[..., None, None] * v.unsqueeze(-1) * w.unsqueeze(-2)


def _reflect_right(c: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """C (I - tau v v^T)."""
    w = (c @ v.unsqueeze(-1)).squeeze(-1)
    return c - tau[..., None, None] * w.unsqueeze(-1) * v.unsqueeze(-2)


def _geqrf(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``geqr2``: R on and above the diagonal, the reflectors' tails below it, and tau."""
    m, n = a.shape[-2:]
    rows, cols = _iota(m, a), _iota(n, a)
    taus: list[torch.Tensor] = []
    for j in range(min(m, n)):
        v, tau, beta = _reflector(a, j)
        a = torch.where(cols > j, _reflect_left(a, v, tau), a)
        column = torch.where(rows > j, v, torch.where(rows == j, beta.unsqueeze(-1), a[..., :, j]))
        a = torch.where(cols == j, column.unsqueeze(-1), a)
        taus.append(tau)
    if taus:
        return a, torch.stack(taus, -1)
    return a, a.new_zeros((*a.shape[:-2], 0))


def _vector(packed: torch.Tensor, j: int) -> torch.Tensor:
    """Reflector j of a packed QR: 1 at j, the stored tail below, zeros above."""
    rows = _iota(packed.shape[-2], packed)
    return torch.where(rows > j, packed[..., :, j], (rows == j).to(packed.dtype))


def _householder_product(packed: torch.Tensor, tau: torch.Tensor, columns: int) -> torch.Tensor:
    """``org2r``: the first ``columns`` columns of H_0 H_1 ... H_{k-1}."""
    m = packed.shape[-2]
    eye = torch.eye(m, columns, dtype=packed.dtype, device=packed.device)
    q = eye.expand(*packed.shape[:-2], m, columns)
    for j in reversed(range(tau.shape[-1])):
        q = _reflect_left(q, _vector(packed, j), tau[..., j])
    return q


def geqrf(a: torch.Tensor) -> object:
    if not _fits(a):
        return NotImplemented
    return _geqrf(a)


def linalg_householder_product(a: torch.Tensor, tau: torch.Tensor) -> object:
    if not _fits(a, tau):
        return NotImplemented
    return _householder_product(a, tau, a.shape[-1])


def linalg_qr(a: torch.Tensor, mode: str = "reduced") -> object:
    if not _fits(a) or mode not in ("reduced", "complete", "r"):
        return NotImplemented
    m, n = a.shape[-2:]
    k = min(m, n)
    packed, tau = _geqrf(a)
    if mode == "r":
        return a.new_empty(0), torch.triu(packed[..., :k, :])
    if mode == "complete":
        return _householder_product(packed, tau, m), torch.triu(packed)
    return _householder_product(packed, tau, k), torch.triu(packed[..., :k, :])


def ormqr(
    a: torch.Tensor,
    tau: torch.Tensor,
    c: torch.Tensor,
    left: bool = True,
    transpose: bool = False,
) -> object:
    """Q C, Q^T C, C Q or C Q^T with Q = H_0 ... H_{k-1} of a packed QR."""
    if not _fits(a, tau, c):
        return NotImplemented
    k = tau.shape[-1]
    # Q C = H_0 (... (H_{k-1} C)): the last reflector first; Q^T C the first first; C Q the
    # first first; C Q^T the last first.
    forward = transpose if left else not transpose
    for j in range(k) if forward else reversed(range(k)):
        v = _vector(a, j)
        c = _reflect_left(c, v, tau[..., j]) if left else _reflect_right(c, v, tau[..., j])
    return c


# -- Jacobi: symmetric eigenvalues and singular values ---------------------------------------


def _rotation(app: torch.Tensor, aqq: torch.Tensor, apq: torch.Tensor) -> torch.Tensor:
    """t = tan(theta) of the rotation that diagonalizes [[app, apq], [apq, aqq]]
    (Golub and Van Loan's sym.schur2): the smaller root, 0 when apq is 0."""
    tau = (aqq - app) / (2 * apq)
    size = tau.abs()
    # 1 / (|tau| + sqrt(1 + tau^2)), written so that a huge tau neither overflows nor cancels.
    t = torch.where(size > 1e18, 0.5 / size, 1 / (size + torch.sqrt(1 + size * size)))
    t = torch.where(tau < 0, -t, t)
    return torch.where(apq == 0, 0.0, t)


def _sweeps(n: int) -> int:
    """Jacobi sweeps: convergence is quadratic once the off-diagonal is small; 6 plus one per
    doubling of n reach float32's rounding level on the matrices tested (test_linalg.py)."""
    return 6 + max(n - 1, 1).bit_length()


def _drop(x: torch.Tensor, at: int, dim: int) -> torch.Tensor:
    """``x`` without index ``at`` of ``dim``."""
    return torch.cat([x.narrow(dim, 0, at), x.narrow(dim, at + 1, x.shape[dim] - at - 1)], dim)


def _next_round(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The circle method's move between rounds: place 0 stays, the others turn by one
    (order 0, n-1, 1, ..., n-2), so that pairing place i with n-1-i meets every pair once in
    n - 1 rounds."""
    parts = (x.narrow(dim, 0, 1), x.narrow(dim, -1, 1), x.narrow(dim, 1, x.shape[dim] - 2))
    return torch.cat(parts, dim)


def _jacobi(
    a: torch.Tensor, one_sided: bool, vectors: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cyclic Jacobi, n / 2 rotations at once (places i and n-1-i; round-robin order), as one
    n x n rotation J on TensorE: two-sided (A <- J^T A J, A symmetric: its diagonal converges
    to the eigenvalues) or one-sided (A <- A J: its columns become orthogonal, their norms
    the singular values). An odd n gets a zero row and column, which no rotation moves, taken
    out at the end. Returns the final A, its columns in the rounds' order, and, with
    ``vectors``, V with A_final = V^T A V (two-sided) or A V (one-sided)."""
    n = a.shape[-1]
    size = n + n % 2
    if size != n:
        a = torch.cat([a, a.new_zeros((*a.shape[:-1], 1))], -1)
        if not one_sided:
            a = torch.cat([a, a.new_zeros((*a.shape[:-2], 1, size))], -2)
    half = size // 2
    v = torch.eye(size, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], size, size)
    places = list(range(size))  # the original index at each place
    for _ in range(_sweeps(n)):
        for _ in range(size - 1):
            gram = a.mT @ a if one_sided else a
            diagonal = torch.diagonal(gram, dim1=-2, dim2=-1)
            app, aqq = diagonal[..., :half], diagonal.flip(-1)[..., :half]
            apq = torch.diagonal(gram.flip(-1), dim1=-2, dim2=-1)[..., :half]
            t = _rotation(app, aqq, apq)
            c = torch.rsqrt(1 + t * t)
            s = t * c
            # c at (i, i) and (n-1-i, n-1-i), s at (i, n-1-i), -s at (n-1-i, i)
            j = torch.diag_embed(torch.cat([c, c.flip(-1)], -1))
            j = j + torch.diag_embed(torch.cat([s, -s.flip(-1)], -1)).flip(-1)
            a = a @ j if one_sided else j.mT @ a @ j
            v = v @ j
            a = _next_round(a, -1) if one_sided else _next_round(_next_round(a, -1), -2)
            v = _next_round(v, -1)
            places = [places[0], places[-1], *places[1:-1]]
    if size != n:  # drop the zero column (and row) wherever the rounds moved it
        at = places.index(n)
        a, v = _drop(a, at, -1), _drop(v, at, -1)[..., :n, :]
        if not one_sided:
            a = _drop(a, at, -2)
    return a, (v if vectors else None)


def _symmetric(a: torch.Tensor, upper: bool) -> torch.Tensor:
    """The symmetric matrix of A's upper (or lower) triangle, as LAPACK reads it."""
    half = torch.triu(a, 1) if upper else torch.tril(a, -1)
    return torch.diagonal(a, dim1=-2, dim2=-1).diag_embed() + half + half.mT


def _singular_values(a: torch.Tensor) -> torch.Tensor:
    if a.shape[-2] < a.shape[-1]:
        a = a.mT
    if a.shape[-1] == 0:
        return a.new_zeros((*a.shape[:-2], 0))
    done, _ = _jacobi(a, one_sided=True, vectors=False)
    norms = torch.sqrt((done * done).sum(-2))
    return torch.sort(norms, -1, descending=True).values


def linalg_eigh(a: torch.Tensor, UPLO: str = "L", compute_v: bool = True) -> object:  # noqa: N803
    """Eigenvalues only: eigenvectors are defined up to sign, and LAPACK's signs come from its
    own algorithm, so ``compute_v`` keeps the op whole."""
    if compute_v or not _fits(a) or a.shape[-1] == 0:
        return NotImplemented
    done, _ = _jacobi(_symmetric(a, UPLO == "U"), one_sided=False, vectors=False)
    values = torch.sort(torch.diagonal(done, dim1=-2, dim2=-1), -1).values
    return values, a.new_empty(0)


def linalg_svd(
    a: torch.Tensor, full_matrices: bool = True, compute_uv: bool = True, driver: str | None = None
) -> object:
    """Singular values only (the vectors' signs are LAPACK's choice, as for eigh)."""
    if compute_uv or not _fits(a):
        return NotImplemented
    empty = a.new_empty(0)
    return empty, _singular_values(a), empty


def linalg_pinv(
    a: torch.Tensor,
    *,
    atol: torch.Tensor | None = None,
    rtol: torch.Tensor | None = None,
    hermitian: bool = False,
) -> object:
    """The pseudo-inverse, unique whatever the signs of the vectors it is built from:
    V diag(1/s) U^T over the values above max(atol, rtol * largest), as torch's."""
    tolerances = [t for t in (atol, rtol) if t is not None]
    if not _fits(a) or any(t.dtype != torch.float32 or t.dim() for t in tolerances):
        return NotImplemented
    m, n = a.shape[-2:]
    if m == 0 or n == 0:
        return a.new_zeros((*a.shape[:-2], n, m))
    relative: torch.Tensor | float = torch.finfo(a.dtype).eps * max(m, n)
    if rtol is not None:
        relative = rtol
    elif atol is not None:  # torch's default: no relative bound when atol > 0 is given
        relative = torch.where(atol > 0, 0.0, relative)

    def threshold(largest: torch.Tensor) -> torch.Tensor:
        bound = relative * largest
        return bound.clamp_min(0.0) if atol is None else torch.maximum(atol, bound)

    if hermitian:
        done, v = _jacobi(_symmetric(a, False), one_sided=False, vectors=True)
        assert v is not None
        values = torch.diagonal(done, dim1=-2, dim2=-1)
        largest = values.abs().amax(-1, keepdim=True)
        keep = values.abs() > threshold(largest)
        inverse = torch.where(keep, 1 / values, 0.0)
        return (v * inverse.unsqueeze(-2)) @ v.mT
    tall = a if m >= n else a.mT
    done, v = _jacobi(tall, one_sided=True, vectors=True)
    assert v is not None
    values = torch.sqrt((done * done).sum(-2))
    largest = values.amax(-1, keepdim=True)
    keep = values > threshold(largest)
    # tall = U S V^T with U S = done: pinv(tall) = V S^-2 done^T
    inverse = torch.where(keep, 1 / (values * values), 0.0)
    result = (v * inverse.unsqueeze(-2)) @ done.mT
    return result if m >= n else result.mT


# -- matrix exponential ----------------------------------------------------------------------

#: Taylor degree and the most squarings of the scaling-and-squaring matrix exponential: A is
#: scaled by 2^-s to a 1-norm of at most 1 (the degree-14 remainder is below 1/15! = 8e-13),
#: then squared s times. 2^40 bounds the norms whose exponential float32 can resolve.
_EXP_DEGREE = 14
_EXP_SQUARINGS = 40


def linalg_matrix_exp(a: torch.Tensor) -> object:
    """exp(A) = (exp(A / 2^s))^(2^s) with s = ceil(log2 |A|_1) computed on the device; the
    squarings past s keep their input (a select), so one program serves every norm."""
    if not _fits(a) or a.shape[-1] == 0:
        return NotImplemented
    norm = a.abs().sum(-2).amax(-1)
    s = torch.ceil(torch.log2(norm)).clamp(0, _EXP_SQUARINGS)
    s = torch.where(norm > 0, s, 0.0)
    x = a * torch.exp2(-s)[..., None, None]
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    result = eye + x / _EXP_DEGREE
    for k in range(_EXP_DEGREE - 1, 0, -1):  # Horner: I + X/k (I + X/(k+1) (...))
        result = eye + (x @ result) / k
    for i in range(_EXP_SQUARINGS):
        result = torch.where((s > i)[..., None, None], result @ result, result)
    return result


LINALG_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable[..., object]] = {
    _aten.linalg_cholesky_ex.default: linalg_cholesky_ex,
    _aten.cholesky.default: cholesky,
    _aten.cholesky_solve.default: cholesky_solve,
    _aten.cholesky_inverse.default: cholesky_inverse,
    _aten.linalg_solve_triangular.default: linalg_solve_triangular,
    _aten.triangular_solve.default: triangular_solve,
    _aten.linalg_lu_factor_ex.default: linalg_lu_factor_ex,
    _aten.linalg_lu.default: linalg_lu,
    _aten.lu_unpack.default: lu_unpack,
    _aten.linalg_lu_solve.default: linalg_lu_solve,
    _aten._linalg_det.default: linalg_det,
    _aten._linalg_slogdet.default: linalg_slogdet,
    _aten._linalg_solve_ex.default: linalg_solve_ex,
    _aten.linalg_inv_ex.default: linalg_inv_ex,
    _aten.geqrf.default: geqrf,
    _aten.linalg_householder_product.default: linalg_householder_product,
    _aten.linalg_qr.default: linalg_qr,
    _aten.ormqr.default: ormqr,
    _aten._linalg_eigh.default: linalg_eigh,
    _aten._linalg_svd.default: linalg_svd,
    _aten.linalg_pinv.atol_rtol_tensor: linalg_pinv,
    _aten.linalg_matrix_exp.default: linalg_matrix_exp,
}


#: Ops whose vectors may go unread: (the output holding the values, the flag that asks for
#: the vectors).
_VALUES_ONLY: dict[object, tuple[int, str]] = {
    _aten._linalg_svd.default: (1, "compute_uv"),
    _aten._linalg_eigh.default: (0, "compute_v"),
}


def values_only_factorizations(gm: torch.fx.GraphModule) -> int:
    """An SVD or symmetric eigendecomposition whose vectors nothing reads, computed without
    them, on the device.

    ``svdvals``, ``eigvalsh``, ``cond`` and the nuclear norm reach the ATen graph as
    ``_linalg_svd`` / ``_linalg_eigh`` asking for vectors (torch asks whenever the input is a
    tensor subclass, as traced tensors are), which :func:`linalg_svd` and :func:`linalg_eigh`
    leave whole: LAPACK's vector signs cannot be reproduced. When only the values are read,
    the node is replaced here by the values-only decomposition traced for its input."""
    from torch.fx.operator_schemas import normalize_function

    from torchneuron import rewrite

    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _VALUES_ONLY:
            continue
        values, flag = _VALUES_ONLY[node.target]
        source = node.args[0]
        example = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        users = list(node.users)
        read = [u for u in users if u.target is operator.getitem and u.args[1] == values]
        unread = all(u.target is operator.getitem and not u.users for u in users if u not in read)
        if not (len(read) == 1 and unread and isinstance(example, torch.Tensor)):
            continue
        if not _fits(example):
            continue
        normalized = normalize_function(
            node.target, tuple(node.args), dict(node.kwargs), normalize_to_only_use_kwargs=True
        )
        assert normalized is not None
        kwargs = {**normalized.kwargs, flag: False}
        target = node.target

        def values_of(a: torch.Tensor) -> torch.Tensor:
            return target(**{**kwargs, "A": a})[values]  # noqa: B023

        result = rewrite.splice(gm, node, values_of, [source])
        if result is None:
            continue  # keep the node (counted)
        read[0].replace_all_uses_with(result)
        for user in users:
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
