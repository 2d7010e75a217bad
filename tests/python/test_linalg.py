"""Matrix factorizations and solves on the device (torchneuron/linalg.py) against eager PyTorch
(LAPACK): every output, no op left in eager, LAPACK's conventions for pivots, reflectors and
``info``, errors raised at the user's call, gradients."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch

import torchneuron
from torchneuron.linalg import MAX_UNROLLED

Case = tuple[Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]


def _spd(*shape: int) -> torch.Tensor:
    a = torch.randn(*shape)
    return a @ a.mT + torch.eye(shape[-1])


def _triangular(n: int, upper: bool) -> torch.Tensor:
    a = torch.randn(n, n) + 3 * torch.eye(n)
    return a.triu() if upper else a.tril()


def _lu_factor(*shape: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.linalg.lu_factor(torch.randn(*shape)))


def _geqrf(*shape: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.geqrf(torch.randn(*shape)))


CASES: dict[str, Case] = {
    "cholesky": (torch.linalg.cholesky, lambda: (_spd(3, 5, 5),)),
    "cholesky_upper": (lambda a: torch.linalg.cholesky(a, upper=True), lambda: (_spd(5, 5),)),
    "cholesky_ex": (torch.linalg.cholesky_ex, lambda: (_spd(4, 4),)),
    "cholesky_ex_not_pd": (  # LAPACK stops at the failing column: info and partial L
        lambda a: torch.linalg.cholesky_ex(a, upper=True),
        lambda: (
            torch.tensor(
                [
                    [[1.0, 2, 0.5], [2, 1, 0.3], [0.5, 0.3, 2]],
                    [[4.0, 2, 0.5], [2, 3, 0.3], [0.5, 0.3, 2]],
                ]
            ),
        ),
    ),
    "cholesky_solve": (
        lambda b, a: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
        lambda: (torch.randn(2, 5, 3), _spd(5, 5)),
    ),
    "cholesky_inverse": (
        lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a).mT, upper=True),
        lambda: (_spd(4, 4),),
    ),
    "solve_triangular_upper_unit": (
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, unitriangular=True),
        lambda: (torch.randn(3, 3), torch.randn(3, 1)),
    ),
    "solve_triangular_right": (
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, left=False),
        lambda: (_triangular(4, False), torch.randn(2, 2, 4)),
    ),
    "triangular_solve_transposed": (
        lambda b, a: torch.triangular_solve(b, a, transpose=True),
        lambda: (torch.randn(5, 2), _triangular(5, True)),
    ),
    "lu_factor_wide": (torch.linalg.lu_factor_ex, lambda: (torch.randn(3, 5),)),
    "lu_factor_tall_batched": (torch.linalg.lu_factor, lambda: (torch.randn(2, 6, 4),)),
    "lu_factor_singular": (  # a zero pivot: info = its column, no NaN below it
        torch.linalg.lu_factor_ex,
        lambda: (torch.tensor([[1.0, 2, 3], [2, 4, 6], [1, 1, 1]]),),
    ),
    "lu": (torch.linalg.lu, lambda: (torch.randn(4, 3),)),
    "lu_unpack": (torch.lu_unpack, lambda: _lu_factor(2, 4, 4)),
    "lu_solve": (torch.linalg.lu_solve, lambda: (*_lu_factor(3, 3), torch.randn(3, 4))),
    "lu_solve_adjoint": (
        lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, adjoint=True),
        lambda: (*_lu_factor(3, 3), torch.randn(3, 4)),
    ),
    "lu_solve_right": (
        lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, left=False),
        lambda: (*_lu_factor(3, 3), torch.randn(4, 3)),
    ),
    "det": (torch.linalg.det, lambda: (torch.randn(2, 5, 5),)),
    "det_singular": (torch.linalg.det, lambda: (torch.tensor([[1.0, 2], [2, 4]]),)),
    "det_empty": (torch.linalg.det, lambda: (torch.randn(0, 0),)),
    "slogdet": (torch.linalg.slogdet, lambda: (torch.randn(3, 5, 5),)),
    "slogdet_singular": (torch.linalg.slogdet, lambda: (torch.tensor([[1.0, 2], [2, 4]]),)),
    "logdet": (torch.logdet, lambda: (_spd(5, 5),)),
    "inv": (torch.linalg.inv, lambda: (torch.randn(5, 5) + 3 * torch.eye(5),)),
    "inv_ex": (torch.linalg.inv_ex, lambda: (torch.randn(2, 4, 4) + 3 * torch.eye(4),)),
    "solve_vector": (
        torch.linalg.solve,
        lambda: (torch.randn(5, 5) + 3 * torch.eye(5), torch.randn(5)),
    ),
    "solve_broadcast": (
        torch.linalg.solve,
        lambda: (torch.randn(4, 4) + 3 * torch.eye(4), torch.randn(3, 4, 2)),
    ),
    "solve_right": (
        lambda a, b: torch.linalg.solve(a, b, left=False),
        lambda: (torch.randn(4, 4) + 3 * torch.eye(4), torch.randn(3, 4)),
    ),
    "tensorsolve": (torch.linalg.tensorsolve, lambda: (torch.randn(2, 3, 6), torch.randn(2, 3))),
    "geqrf": (torch.geqrf, lambda: (torch.randn(5, 5),)),
    "qr_reduced_tall": (torch.linalg.qr, lambda: (torch.randn(6, 4),)),
    "qr_complete_wide": (
        lambda a: torch.linalg.qr(a, mode="complete"),
        lambda: (torch.randn(2, 3, 5),),
    ),
    "qr_r": (lambda a: torch.linalg.qr(a, mode="r"), lambda: (torch.randn(5, 3),)),
    "householder_product": (torch.linalg.householder_product, lambda: _geqrf(6, 4)),
    "ormqr_left_transposed": (
        lambda a, t, c: torch.ormqr(a, t, c, left=True, transpose=True),
        lambda: (*_geqrf(5, 5), torch.randn(5, 3)),
    ),
    "ormqr_left": (torch.ormqr, lambda: (*_geqrf(5, 5), torch.randn(5, 2))),
    "ormqr_right": (
        lambda a, t, c: torch.ormqr(a, t, c, left=False),
        lambda: (*_geqrf(5, 5), torch.randn(3, 5)),
    ),
    "ormqr_right_transposed": (
        lambda a, t, c: torch.ormqr(a, t, c, left=False, transpose=True),
        lambda: (*_geqrf(5, 5), torch.randn(3, 5)),
    ),
    "matrix_exp": (torch.linalg.matrix_exp, lambda: (torch.randn(5, 5),)),
    "matrix_exp_batched_norms": (  # a zero matrix, one needing no squaring, one needing 6
        torch.linalg.matrix_exp,
        lambda: (torch.stack([torch.zeros(3, 3), 0.1 * torch.randn(3, 3), 8 * torch.randn(3, 3)]),),
    ),
    # Jacobi: values only (vectors nobody reads are not computed), and the pseudo-inverse
    "svdvals_wide_batched": (torch.linalg.svdvals, lambda: (torch.randn(2, 3, 5),)),
    "eigvalsh_upper": (lambda a: torch.linalg.eigvalsh(a, UPLO="U"), lambda: (torch.randn(5, 5),)),
    "cond": (torch.linalg.cond, lambda: (torch.randn(4, 4),)),
    "nuclear_norm": (lambda a: torch.linalg.matrix_norm(a, "nuc"), lambda: (torch.randn(4, 3),)),
    "pinv_wide": (torch.linalg.pinv, lambda: (torch.randn(3, 4),)),
    "pinv_hermitian_rank_deficient": (
        lambda a: torch.linalg.pinv(a @ a.mT, hermitian=True),
        lambda: (torch.randn(4, 2),),
    ),
    "pinv_atol": (
        lambda a, atol: torch.linalg.pinv(a, atol=atol),
        lambda: (torch.randn(4, 4), torch.tensor(0.5)),
    ),
    "pinv_empty": (torch.linalg.pinv, lambda: (torch.randn(3, 0),)),
}


def _fallbacks(before: dict[str, int]) -> dict[str, int]:
    after = torchneuron.stats()["ops_fallback"]
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_fully_on_the_device(name: str, real_native: ModuleType) -> None:
    fn, make = CASES[name]
    torch.manual_seed(0)
    args = make()
    want = fn(*args)
    torch._dynamo.reset()
    before = dict(torchneuron.stats()["ops_fallback"])
    got = torch.compile(fn, backend="neuron", options={"cache": False})(*args)
    assert _fallbacks(before) == {}
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, equal_nan=True)


@pytest.mark.parametrize(
    ("op", "contiguous"),
    [
        (op, c)
        for op in ("_linalg_det", "_linalg_slogdet", "_linalg_solve_ex")
        for c in (True, False)
    ],
)
def test_lu_outputs_follow_torch(op: str, contiguous: bool, real_native: ModuleType) -> None:
    """det and slogdet factor A^T when A is contiguous, solve A itself: the backward formulas
    read the LU and pivots these ops return, so they must be the ones torch returns."""
    torch.manual_seed(0)
    a = torch.randn(4, 4) + 3 * torch.eye(4)
    if not contiguous:
        a = a.mT.contiguous().mT
    args = (a, torch.randn(4, 2)) if op == "_linalg_solve_ex" else (a,)
    aten = getattr(torch.ops.aten, op).default

    def fn(*xs: torch.Tensor) -> Any:
        return aten(*xs)

    torch._dynamo.reset()
    got = torch.compile(fn, backend="neuron", options={"cache": False})(*args)
    torch.testing.assert_close(got, aten(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.linalg.det(a).sum(),
        lambda a: torch.linalg.slogdet(a)[1].sum(),
        lambda a: torch.linalg.solve(a, torch.ones(4, 2)).square().sum(),
        lambda a: torch.linalg.inv(a).sum(),
        lambda a: torch.linalg.cholesky(a @ a.mT + torch.eye(4)).sum(),
        lambda a: torch.linalg.qr(a)[1].sum(),
    ],
    ids=["det", "slogdet", "solve", "inv", "cholesky", "qr"],
)
def test_gradients_match_eager(
    fn: Callable[[torch.Tensor], torch.Tensor], real_native: ModuleType
) -> None:
    torch.manual_seed(0)
    a = (torch.randn(4, 4) + 3 * torch.eye(4)).requires_grad_()
    fn(a).backward()
    assert a.grad is not None
    want, a.grad = a.grad.clone(), None
    torch._dynamo.reset()
    torch.compile(fn, backend="neuron", options={"cache": False})(a).backward()
    torch.testing.assert_close(a.grad, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("fn", "matrix", "message"),
    [
        (torch.linalg.cholesky, [[1.0, 2], [2, 1]], "not positive-definite"),
        (torch.linalg.inv, [[1.0, 2], [2, 4]], "singular"),
        (lambda a: torch.linalg.solve(a, torch.ones(2)), [[1.0, 2], [2, 4]], "singular"),
    ],
    ids=["cholesky", "inv", "solve"],
)
def test_failed_factorization_raises_like_eager(
    fn: Callable[[torch.Tensor], torch.Tensor],
    matrix: list[list[float]],
    message: str,
    real_native: ModuleType,
) -> None:
    """The info check runs on the host after the kernel, as torch's does, not as a fallback."""
    torch._dynamo.reset()
    before = dict(torchneuron.stats()["ops_fallback"])
    with pytest.raises(torch.linalg.LinAlgError, match=message):
        torch.compile(fn, backend="neuron", options={"cache": False})(torch.tensor(matrix))
    assert _fallbacks(before) == {}


def test_large_and_float64_matrices_stay_eager_counted(real_native: ModuleType) -> None:
    n = MAX_UNROLLED + 1
    a = torch.randn(n, n) + n * torch.eye(n)
    torch._dynamo.reset()
    before = dict(torchneuron.stats()["ops_fallback"])
    got = torch.compile(torch.linalg.inv, backend="neuron", options={"cache": False})(a)
    torch.testing.assert_close(got, torch.linalg.inv(a))
    assert _fallbacks(before) == {"aten.linalg_inv_ex.default": 1}


def test_read_vectors_keep_svd_and_eigh_eager_counted(real_native: ModuleType) -> None:
    """Singular and eigenvectors are defined up to sign; LAPACK's come from its algorithm."""
    a = torch.randn(4, 4)
    torch._dynamo.reset()
    before = dict(torchneuron.stats()["ops_fallback"])
    compiled = torch.compile(
        lambda a: (torch.linalg.svd(a)[0], torch.linalg.eigh(a + a.mT)[1]),
        backend="neuron",
        options={"cache": False},
    )
    u, v = compiled(a)
    torch.testing.assert_close(u, torch.linalg.svd(a)[0])
    torch.testing.assert_close(v, torch.linalg.eigh(a + a.mT)[1])
    assert _fallbacks(before) == {"aten._linalg_svd.default": 1, "aten._linalg_eigh.default": 1}
