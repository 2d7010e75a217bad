"""Golden checks of every op the device lowers, on PyTorch's OpInfo samples, against eager CPU.

One test per (OpInfo entry, dtype) -- float32, and bfloat16 where the entry supports it on CPU.
Each selected sample runs through ``torch.compile(fn, backend="neuron", fullgraph=True)`` under
``torch.no_grad()``; its outputs (tuples and lists element by element) and any inputs the op
updates in place are compared with eager PyTorch, and ``torchneuron.stats()`` must show that
the work ran on the device: no fallback, at least one kernel run.

``CASES`` is the curated list of entries (``FxImporter.cpp``'s ``handlers()`` plus what
``torchneuron/decompositions.py`` and core ATen decompose into them). What an entry may do
differently is stated there, with the reason:

- ``skip``: samples that cannot be compared (random ops).
- ``fallback``: samples with an argument the importer rejects on purpose (float64,
  ceil_mode pooling, ...): they must fall back (counted in ``ops_fallback``; the op
  the rule names, when it names one, and no other) and still match eager.
- ``bugs``: samples hitting a known device or compiler bug. They leave ``test_op`` and run in
  ``test_known_bug``, marked ``xfail(strict=True)``: when the bug is fixed the test fails and
  asks for the entry to be removed.
- ``xfail``: the whole entry falls back (a missing lowering).

An expected failure is only ever an expected *fallback*: ``xfail`` entries (``Gap``) and ``bugs``
rules name the ATen op that falls back, and the xfail holds only while every failing sample
failed by that op, and nothing else, falling back to eager. A wrong answer, a crash or another
op falling back fails the test, xfail or not (``OpCheckFailed`` is raised only for the named
fallback), so an op that starts giving wrong numbers cannot hide behind its xfail.

Samples: the first ``SCAN`` OpInfo samples, of which a spread of ``SAMPLES[dtype]`` that run on
the device and ``FALLBACK_SAMPLES`` expected fallbacks; for elementwise math also up to
``EXTREMAL_SAMPLES[dtype]`` OpInfo *reference* samples holding inf, nan or values beyond 1e3.
Only float tensors are under test: integer results (count_nonzero, indices) are computed in
fp32 on the engines, exact below 2**24, which OpInfo's values stay far below.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import OpInfo, SampleInput
from torch.utils._pytree import tree_leaves, tree_map, tree_map_only

import torchneuron

# OpInfo's var/std samples include single-element reductions (eager warns, returns nan/inf).
pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")

F32 = torch.float32
BF16 = torch.bfloat16
DTYPES: tuple[torch.dtype, ...] = (F32, BF16)

# ----------------------------------------------------------------------------------------------
# Tolerances: (atol, rtol) per dtype.
#
# float32: torch.testing's defaults for float32 (atol 1e-5, rtol 1.3e-6, about 11 ulp). The
#   device runs fp32 arithmetic with fp32 accumulation, so plain arithmetic, reductions and
#   matmuls (small K in OpInfo samples) stay within them.
# float32, transcendental functions: rtol 1e-5 (about 80 ulp). The device computes exp, log,
#   tanh, erf, ... in fp32 with its own ScalarE activation-function implementations, eager CPU
#   uses SLEEF or libm: both are accurate to a few ulp but not bit-identical, and composites
#   (softmax, layer_norm, gelu, logsumexp, attention, ...) chain several of them. (The engine
#   model currently stays within the plain float32 bounds on these samples, except attention;
#   the margin is for table-based activation functions.)
# bfloat16: atol = rtol = 1.6e-2 (one bf16 ulp is 2**-7 = 7.8e-3 relative; torch.testing's
#   bf16 rtol). Inputs are bf16 and the device computes in fp32, rounding once on output, like
#   eager's bf16 kernels; ops that PyTorch decomposes before the device sees them (addcdiv,
#   lerp, norms, ...) round their intermediates to bf16 too, so a few entries state looser
#   bounds where an intermediate of OpInfo's magnitude (up to 9) loses an ulp.
# ----------------------------------------------------------------------------------------------
Tol = tuple[float, float]
TOLERANCES: dict[torch.dtype, Tol] = {F32: (1e-5, 1.3e-6), BF16: (1.6e-2, 1.6e-2)}
TRANSCENDENTAL: dict[torch.dtype, Tol] = {F32: (1e-5, 1e-5), BF16: TOLERANCES[BF16]}
# Transposed convolution (col2im of weight^T x x): computed in float32 and rounded once, like
#   eager with oneDNN's bf16 kernels, but summed in another order: one bf16 ulp (torch's bf16
#   tolerance) suffices. The reference is the float32 op rounded once (Case.float32_reference).
COL2IM: dict[torch.dtype, Tol] = {F32: TOLERANCES[F32], BF16: TOLERANCES[BF16]}
# bf16 ops decomposed into several bf16-rounded steps: one ulp of an intermediate of magnitude
# up to 9 (OpInfo's value range) is 2**-4 = 0.0625.
BF16_COMPOSITE: dict[torch.dtype, Tol] = {F32: TOLERANCES[F32], BF16: (6.3e-2, 1.6e-2)}
# 3-d convolutions sum their depth taps' 2-d convolutions (decompositions.py): another order
#   than eager's direct kernel, for sums of up to 64 products of values up to 9 (float32 ulp
#   of such sums: ~1e-4); in bf16 each tap is computed in float32 and rounded once.
CONV3D: dict[torch.dtype, Tol] = {F32: (1e-4, 1e-5), BF16: BF16_COMPOSITE[BF16]}
# addbmm sums batch x K products in one chain in K order, as the PE array does, and eager's BLAS
#   in another order (blocked, several partial sums): for up to 25 products of values up to 9,
#   the float32 ulp of such sums is ~1e-5, where cancellation can leave a small result.
BATCH_SUM: dict[torch.dtype, Tol] = {F32: (1e-4, 1e-5), BF16: BF16_COMPOSITE[BF16]}
# polygamma: eager's float32 Hurwitz zeta is itself off by up to ~2e-5 relative near the
#   poles (psi'(-3.973) = 1377.0506 exactly; eager 1377.0603, the decomposition 1377.0507).
POLYGAMMA: dict[torch.dtype, Tol] = {F32: (1e-5, 5e-5), BF16: TOLERANCES[BF16]}
# Attention outputs are softmax-weighted sums of values up to 9: where they cancel to near 0,
# a few fp32 ulp of the terms (~1e-6 each, after two matmuls and an exp) remain.
ATTENTION: dict[torch.dtype, Tol] = {F32: (1e-4, 1e-5), BF16: TOLERANCES[BF16]}

# Samples per test, to bound the run time (every sample is a Dynamo trace and a device compile).
SCAN = 64  # OpInfo samples read per entry (some generators yield more than a thousand)
SAMPLES: dict[torch.dtype, int] = {F32: 6, BF16: 3}  # spread over the samples that run
EXTREMAL_SAMPLES: dict[torch.dtype, int] = {F32: 3, BF16: 1}
FALLBACK_SAMPLES = 2  # samples of expected fallbacks, per test
KNOWN_BUG_SAMPLES = 1

# ----------------------------------------------------------------------------------------------
# Samples and the predicates that classify them
# ----------------------------------------------------------------------------------------------


def _tensors(value: object) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (nested lists, tuples, dicts), in order."""
    return (t for t in tree_leaves(value) if isinstance(t, torch.Tensor))


@dataclasses.dataclass(frozen=True)
class Sample:
    """An OpInfo sample and its eager result (rules may look at both)."""

    input: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    expected: Any

    @property
    def tensors(self) -> list[torch.Tensor]:
        return list(_tensors([self.input, self.args, self.kwargs]))

    def arg(self, name: str, index: int, default: object = None) -> object:
        """An argument given by keyword or at position ``index`` of ``args``."""
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[index] if len(self.args) > index else default


Predicate = Callable[[Sample], bool]


def zero_size_input(s: Sample) -> bool:
    return any(t.numel() == 0 for t in s.tensors)


def extremal(s: SampleInput) -> bool:
    """Holds inf, nan or values beyond 1e3, and is small enough to be cheap."""
    tensors = list(_tensors([s.input, s.args, s.kwargs]))
    return all(t.numel() <= 20_000 for t in tensors) and any(
        t.numel() > 0
        and t.is_floating_point()
        and not bool(torch.isfinite(t).all() and t.abs().max() <= 1e3)
        for t in tensors
    )


def has_complex(s: Sample) -> bool:
    values = [s.input, *s.args, *s.kwargs.values()]
    return any(isinstance(v, complex) for v in values) or any(t.is_complex() for t in s.tensors)


def kwarg(name: str, test: Callable[[object], bool]) -> Predicate:
    return lambda s: name in s.kwargs and test(s.kwargs[name])


def float64_dtype(s: Sample) -> bool:
    return s.kwargs.get("dtype") in (torch.float64, torch.complex64, torch.complex128)


def topk_ties(s: Sample) -> bool:
    """Equal values along topk's dim: which of them eager returns first is unspecified (its
    partial sort), the device returns the lowest position first."""
    x, dim = s.input, s.arg("dim", 1, -1)
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or not isinstance(dim, int):
        return False
    rows = x.movedim(dim, -1).reshape(-1, x.shape[dim])
    return any(len(set(row.tolist())) < len(row) for row in rows)


def equal_values(s: Sample) -> bool:
    """Equal values in the input: which of their positions eager reports for a k-th value
    or a median is unspecified."""
    x = s.input
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return False
    return bool(x.unique().numel() < x.numel())


def long_unstable_16bit_sort(s: Sample) -> bool:
    """An unstable sort of thousands of 16-bit values (OpInfo's 8000-element sample): they hold
    many ties, which eager's unstable sort orders its own way (decompositions.sort)."""
    x, dim = s.input, s.arg("dim", 0, -1)
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or not isinstance(dim, int):
        return False
    return x.dtype != torch.float32 and x.shape[dim] > 2048 and not s.kwargs.get("stable")


def index_rank_differs(s: Sample) -> bool:
    """gather of a 0-d input, or with an index of another rank than the input (empty)."""
    index = s.arg("index", 1)
    return s.input.dim() == 0 or (isinstance(index, torch.Tensor) and index.dim() != s.input.dim())


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Gap:
    """An op the device does not run yet: it must fall back (counted in ``ops_fallback`` as
    ``falls_back``, e.g. ``"aten.argmax.default"``), and the result must still match eager."""

    falls_back: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Rule:
    """Samples of one entry that behave differently, and why."""

    key: str  # short name, used in test ids
    reason: str
    applies: Predicate
    dtypes: frozenset[torch.dtype] = frozenset(DTYPES)
    # The op that must fall back: for a ``fallback`` rule, the only one that may (unset: any);
    # for a ``bugs`` rule, the known bug's only accepted symptom (required).
    falls_back: str | None = None


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # OpInfo name, with ".variant_test_name" when it has one
    extremal: bool = False  # add OpInfo reference samples with inf/nan/large values
    # Clone the outputs: a graph of views only does no device work (the partitioner leaves
    # it to eager PyTorch), so layout ops are checked by materializing their result.
    materialize: bool = False
    fn: Callable[..., Any] | None = None  # instead of the OpInfo's op
    # Compare bfloat16 with the op computed in float32 and rounded once. Eager's own bf16
    # kernel depends on the host: without AVX-512-BF16 some round partial sums to bf16 (seen
    # for conv_transpose: 17 ulp off where the device is within 1.2).
    float32_reference: bool = False
    tol: Mapping[torch.dtype, Tol] = dataclasses.field(default_factory=dict)
    skip: tuple[Rule, ...] = ()
    fallback: tuple[Rule, ...] = ()
    bugs: tuple[Rule, ...] = ()
    xfail: Mapping[torch.dtype, Gap] = dataclasses.field(default_factory=dict)


def _all(falls_back: str, reason: str) -> dict[torch.dtype, Gap]:
    return dict.fromkeys(DTYPES, Gap(falls_back, reason))


FLOAT64 = Rule(
    "float64",
    "dtype=float64: the device has no 64-bit types; the importer rejects the node "
    "('dtype float64 is not supported by the device')",
    float64_dtype,
)
SELECT_TIES = Rule(
    "ties",
    "equal values: which position eager reports among them is unspecified",
    equal_values,
)
EMPTY_INPUT = Rule(
    "empty",
    "a zero-size input: the graph has no device work to check (eager returns it empty)",
    zero_size_input,
)
EMPTY_REDUCTION = Rule(
    "empty",
    "a reduction over an empty dimension (var/std: nan) is rejected by the importer",
    zero_size_input,
)
LONG_16BIT_SORT = Rule(
    "ties",
    "an unstable sort of thousands of 16-bit values: eager orders their many ties its own way",
    long_unstable_16bit_sort,
    falls_back="aten.sort.default",
)
COMPLEX = Rule(
    "complex",
    "a complex scalar makes the result complex: the device has no complex types",
    has_complex,
)
RANDOM_DROPOUT = Rule(
    "dropout",
    "dropout_p > 0 draws a random mask: eager and compiled runs cannot be compared",
    kwarg("dropout_p", lambda p: isinstance(p, float) and p > 0),
)


def elementwise(name: str, **kw: Any) -> Case:
    return Case(name, extremal=True, **kw)


def transcendental(name: str, **kw: Any) -> Case:
    return Case(name, extremal=True, tol=TRANSCENDENTAL, **kw)


def layout(name: str, **kw: Any) -> Case:
    return Case(name, materialize=True, **kw)


CASES: tuple[Case, ...] = (
    # -- elementwise unary ---------------------------------------------------------------------
    elementwise("abs"),
    elementwise("neg"),
    transcendental("exp"),
    transcendental("log"),
    transcendental("sqrt"),
    transcendental("rsqrt"),
    transcendental("reciprocal"),
    transcendental("tanh"),
    transcendental("sigmoid"),
    elementwise("nn.functional.relu"),
    transcendental("erf"),
    transcendental("sin"),
    transcendental("cos"),
    elementwise("sign"),
    elementwise("sgn"),
    elementwise("floor"),
    elementwise("ceil"),
    elementwise("round"),
    elementwise("round.decimals_3"),
    elementwise("round.decimals_neg_3"),
    elementwise("trunc"),
    elementwise("frac"),
    transcendental("log1p"),
    transcendental("expm1"),
    elementwise("logical_not"),
    elementwise("square"),
    elementwise("positive", materialize=True),
    elementwise("rad2deg"),
    elementwise("deg2rad"),
    transcendental("logit"),
    transcendental("sinc"),
    transcendental("special.ndtr"),
    elementwise("isfinite"),
    elementwise("isposinf"),
    elementwise("isneginf"),
    # -- elementwise binary / ternary ----------------------------------------------------------
    elementwise("add"),
    elementwise("sub"),
    elementwise("mul"),
    elementwise("rsub"),
    elementwise("__rsub__"),
    elementwise("__rdiv__"),
    elementwise("__rmod__"),
    elementwise("__rpow__", tol=TRANSCENDENTAL),
    elementwise("div.no_rounding_mode"),
    elementwise("div.trunc_rounding"),
    elementwise("div.floor_rounding"),
    elementwise("floor_divide"),
    elementwise("pow", tol=TRANSCENDENTAL),
    elementwise("maximum"),
    elementwise("minimum"),
    elementwise("fmod"),
    elementwise("remainder"),
    elementwise("clamp"),
    elementwise("clamp_min"),
    elementwise("clamp_max"),
    elementwise("where", fallback=(COMPLEX,)),
    elementwise("masked_fill"),
    elementwise("eq"),
    elementwise("ne"),
    elementwise("lt"),
    elementwise("le"),
    elementwise("gt"),
    elementwise("ge"),
    elementwise("logical_and"),
    elementwise("logical_or"),
    elementwise("logical_xor"),
    elementwise("lerp", tol=BF16_COMPOSITE),
    elementwise("addcmul", tol=BF16_COMPOSITE),
    elementwise("addcdiv", tol=BF16_COMPOSITE),
    elementwise("logaddexp", tol=TRANSCENDENTAL),
    # -- activations and normalization ---------------------------------------------------------
    transcendental("nn.functional.gelu"),
    transcendental("nn.functional.silu"),
    elementwise("nn.functional.hardswish"),
    elementwise("nn.functional.hardsigmoid"),
    transcendental("nn.functional.mish"),
    transcendental("nn.functional.logsigmoid"),
    elementwise("nn.functional.softsign"),
    transcendental("nn.functional.tanhshrink"),
    transcendental("nn.functional.softplus"),
    transcendental("nn.functional.celu"),
    elementwise("nn.functional.threshold"),
    elementwise("nn.functional.softshrink"),
    elementwise("nn.functional.hardshrink"),
    Case("nn.functional.prelu"),
    Case("nn.functional.glu", tol=TRANSCENDENTAL),
    Case("softmax", tol=TRANSCENDENTAL),
    Case("log_softmax", tol=TRANSCENDENTAL),
    Case("nn.functional.softmin", tol=TRANSCENDENTAL),
    Case("torch.ops.aten._safe_softmax.default", tol=TRANSCENDENTAL),
    Case("nn.functional.layer_norm", tol=TRANSCENDENTAL),
    Case("native_layer_norm", tol=TRANSCENDENTAL),
    Case("nn.functional.rms_norm", tol=TRANSCENDENTAL),
    Case("nn.functional.batch_norm", tol=TRANSCENDENTAL),
    # Its decomposition reshapes with a contiguous as_strided (a view, rewrite.py).
    Case("nn.functional.group_norm", tol=TRANSCENDENTAL),
    Case("native_batch_norm", tol=TRANSCENDENTAL),
    Case("_native_batch_norm_legit", tol=TRANSCENDENTAL),
    # -- reductions ----------------------------------------------------------------------------
    Case("sum"),
    Case("mean"),
    Case("amax"),
    Case("amin"),
    Case("aminmax"),
    Case("var", tol=TRANSCENDENTAL, fallback=(EMPTY_REDUCTION,)),
    Case("var.unbiased", fallback=(EMPTY_REDUCTION,)),
    Case("var_mean", fallback=(EMPTY_REDUCTION,)),
    Case("std", tol=TRANSCENDENTAL, fallback=(EMPTY_REDUCTION,)),
    Case("std.unbiased", fallback=(EMPTY_REDUCTION,)),
    Case("std_mean", tol=TRANSCENDENTAL, fallback=(EMPTY_REDUCTION,)),
    Case("prod"),
    Case("logsumexp", tol=TRANSCENDENTAL),
    Case("any"),
    Case("all"),
    Case("count_nonzero"),
    layout("sum_to_size"),
    # -- matmul --------------------------------------------------------------------------------
    Case("matmul"),
    Case("mm"),
    Case("bmm"),
    Case("addmm"),
    Case("baddbmm"),
    Case("dot"),
    Case("mv"),
    Case("addr", tol=BF16_COMPOSITE),
    Case("outer"),
    Case("inner"),
    Case("einsum"),
    Case("tensordot"),
    Case("kron"),
    Case("linalg.vecdot"),
    Case("linalg.multi_dot"),
    Case("__rmatmul__"),
    Case("nn.functional.linear"),
    # -- layout --------------------------------------------------------------------------------
    layout("view"),
    layout("reshape"),
    layout("flatten"),
    layout("unflatten"),
    layout("ravel"),
    layout("permute"),
    layout("movedim"),
    layout("transpose"),
    layout("t"),
    layout("T"),
    layout("mT"),
    layout("expand"),
    layout("broadcast_to"),
    layout("unsqueeze"),
    layout("squeeze"),
    layout("squeeze.multiple"),
    layout(
        "narrow",
        fallback=(
            Rule(
                "tensor_start",
                "start given as a tensor: reading its value (aten._local_scalar_dense) is "
                "host work",
                lambda s: isinstance(s.arg("start", 1), torch.Tensor),
            ),
        ),
    ),
    layout("select"),
    layout("slice"),
    layout("split"),
    layout("split.list_args"),
    layout("split_with_sizes"),
    layout("chunk"),
    layout("unbind"),
    layout("contiguous"),
    layout("clone"),
    Case("cat"),
    Case("stack"),
    Case("hstack"),
    Case("vstack"),
    Case("dstack"),
    Case("column_stack"),
    Case("tril"),
    Case("triu"),
    Case("nn.functional.pixel_shuffle"),
    Case("nn.functional.pixel_unshuffle"),
    Case("nn.functional.channel_shuffle"),
    # -- indexing and creation -----------------------------------------------------------------
    Case("index_select"),
    Case("index_add"),
    Case(
        "gather",
        fallback=(
            Rule(
                "rank",
                "an index of another rank than the input (0-d input, empty index): the "
                "one-hot form compares along matching dims",
                index_rank_differs,
                falls_back="aten.gather.default",
            ),
        ),
    ),
    Case("take_along_dim"),
    Case("roll"),
    Case("__getitem__", materialize=True),
    # -- scans and selection -------------------------------------------------------------------
    Case("cumsum"),
    Case(
        "topk",
        skip=(Rule("ties", "equal values: eager's order among them is unspecified", topk_ties),),
    ),
    Case("sort", fallback=(LONG_16BIT_SORT,)),
    Case("argsort", fallback=(LONG_16BIT_SORT,)),
    Case("msort", fallback=(LONG_16BIT_SORT,)),
    Case(
        "nn.functional.embedding",
        fallback=(
            Rule(
                "max_norm",
                "max_norm renormalizes the weight in place (aten.embedding_renorm), which has "
                "no lowering",
                kwarg("max_norm", lambda v: v is not None),
            ),
        ),
    ),
    Case("zeros_like", fallback=(FLOAT64,)),
    Case("ones_like", fallback=(FLOAT64,)),
    Case("full_like", fallback=(FLOAT64,)),
    Case("new_zeros", fallback=(FLOAT64,)),
    Case("new_ones", fallback=(FLOAT64,)),
    Case("new_full", fallback=(FLOAT64,)),
    Case("arange"),
    # -- convolution, pooling, attention, losses -----------------------------------------------
    Case("nn.functional.conv1d"),
    Case("nn.functional.conv2d"),
    Case("nn.functional.conv_transpose1d", tol=COL2IM, float32_reference=True),
    Case("nn.functional.conv_transpose2d", tol=COL2IM, float32_reference=True),
    # ceil_mode, return_indices and count_include_pad=False too (decompositions.py)
    Case("nn.functional.max_pool1d"),
    Case("nn.functional.max_pool2d"),
    Case("nn.functional.max_pool3d"),
    Case("max_pool2d_with_indices_backward"),
    Case("nn.functional.avg_pool1d"),
    Case("nn.functional.avg_pool2d"),
    Case("nn.functional.adaptive_avg_pool1d"),
    Case("nn.functional.adaptive_avg_pool3d"),
    Case("nn.functional.interpolate.area"),
    Case("nn.functional.conv3d", tol=CONV3D),
    Case("nn.functional.adaptive_max_pool1d"),
    Case("nn.functional.adaptive_max_pool2d"),
    Case("nn.functional.adaptive_max_pool3d"),
    Case("nn.functional.max_unpool1d"),
    Case("nn.functional.max_unpool2d"),
    Case("nn.functional.max_unpool3d"),
    Case(
        "nn.functional.scaled_dot_product_attention",
        fn=F.scaled_dot_product_attention,  # the OpInfo's op wraps it in an untraceable seed
        tol=ATTENTION,
        skip=(RANDOM_DROPOUT,),
    ),
    Case("nn.functional.mse_loss"),
    Case("nn.functional.l1_loss"),
    Case("nn.functional.smooth_l1_loss"),
    Case("nn.functional.huber_loss"),
    Case("nn.functional.binary_cross_entropy_with_logits", tol=TRANSCENDENTAL),
    # The target class is picked with gather, a one-hot select on the device.
    Case("nn.functional.cross_entropy", tol=TRANSCENDENTAL),
    elementwise("nn.functional.hardtanh"),
    elementwise("nn.functional.relu6"),
    elementwise("nn.functional.leaky_relu"),
    transcendental("nn.functional.elu"),
    elementwise("nan_to_num"),
    Case("nn.functional.pad.constant"),
    layout("repeat"),
    Case("nn.functional.normalize"),
    Case("linalg.vector_norm"),
    # unequal windows (8 -> 5) as matmuls with window matrices
    Case("nn.functional.adaptive_avg_pool2d"),
    # -- decompositions of ops core ATen keeps whole (decompositions.py) -----------------------
    Case("max.reduction_with_dim"),
    Case("min.reduction_with_dim"),
    Case("argmax"),
    Case("argmin"),
    Case("cumprod", tol=TRANSCENDENTAL, skip=(EMPTY_INPUT,)),
    Case("cummax"),
    Case("cummin"),
    Case("logcumsumexp", tol=TRANSCENDENTAL),
    layout("flip"),
    layout("fliplr"),
    layout("rot90"),
    layout("diagonal"),
    layout("diagonal_copy"),
    Case("diagonal_scatter"),
    Case("trace"),
    layout("unfold"),
    Case("nn.functional.unfold"),
    Case("diff"),
    Case("index_put"),
    Case("index_copy"),
    Case("index_fill"),
    Case("put"),
    Case("masked_scatter"),
    Case("scatter_reduce.sum", tol=BF16_COMPOSITE),
    Case("scatter_reduce.prod", tol=BF16_COMPOSITE),
    Case("scatter_reduce.mean", tol=BF16_COMPOSITE),
    Case("scatter_reduce.amax"),
    Case("scatter_reduce.amin"),
    Case("index_reduce.prod", tol=BF16_COMPOSITE),
    Case("index_reduce.mean", tol=BF16_COMPOSITE),
    Case("index_reduce.amax"),
    Case("index_reduce.amin"),
    Case("searchsorted"),
    Case("kthvalue", skip=(SELECT_TIES,)),
    Case("median", skip=(SELECT_TIES,)),
    Case("nanmedian", skip=(SELECT_TIES,)),
    Case("histc"),
    Case("nn.functional.bilinear", tol=BF16_COMPOSITE),
    Case("bucketize"),
    Case("addmv"),
    Case("addbmm", tol=BATCH_SUM),
    Case("cdist", tol=TRANSCENDENTAL),
    Case("nn.functional.pdist", tol=TRANSCENDENTAL),
    # -- elementwise math without an engine instruction (elementwise_math.py) -----------------
    transcendental("atan"),
    transcendental("atan2"),
    transcendental("asin"),
    transcendental("acos"),
    transcendental("asinh"),
    transcendental("acosh"),
    transcendental("atanh"),
    transcendental("sinh"),
    transcendental("cosh"),
    transcendental("tan"),
    elementwise("copysign"),
    elementwise("fmax"),
    elementwise("fmin"),
    transcendental("hypot"),
    transcendental("log2"),
    transcendental("log10"),
    elementwise("isinf"),
    elementwise("signbit"),
    elementwise("angle"),
    transcendental("lgamma"),
    transcendental("digamma"),
    elementwise("polygamma.polygamma_n_1", tol=POLYGAMMA),
    elementwise("polygamma.polygamma_n_2", tol=POLYGAMMA),
    transcendental("mvlgamma.mvlgamma_p_3"),
    transcendental("erfinv"),
    transcendental("special.ndtri"),
    transcendental("erfc"),
)

OPS: dict[str, OpInfo] = {
    op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""): op for op in op_db
}
CASE_BY_NAME: dict[str, Case] = {case.name: case for case in CASES}
assert len(CASE_BY_NAME) == len(CASES), "duplicate entries in CASES"

# ----------------------------------------------------------------------------------------------
# Running samples
# ----------------------------------------------------------------------------------------------


class OpCheckFailed(AssertionError):
    """Every failing sample of an entry failed by the op its ``Gap`` names falling back: the
    only failure the xfail marks accept."""


class SamplesFailed(AssertionError):
    """Samples of an entry failed otherwise (a wrong answer, an error, another fallback):
    never an expected failure."""


class WrongAnswer(AssertionError):
    """The compiled result differs from eager PyTorch."""


class FellBack(AssertionError):
    """The op a ``Gap`` names fell back to eager (and the result matched eager)."""


def _dtypes(case: Case) -> list[torch.dtype]:
    """float32, and bfloat16 where the OpInfo entry supports it on CPU."""
    if case.name not in OPS:  # test_cases_name_opinfo_entries reports it
        return []
    supported = OPS[case.name].supported_dtypes("cpu")
    return [dtype for dtype in DTYPES if dtype in supported]


def _clone_outputs(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_clone_outputs(o) for o in out)
    return out


def _function(case: Case) -> Callable[..., Any]:
    op: Callable[..., Any] = case.fn if case.fn is not None else OPS[case.name].op
    if not case.materialize:
        return op

    def materialized(*args: Any, **kwargs: Any) -> Any:
        return _clone_outputs(op(*args, **kwargs))

    return materialized


def _eager(fn: Callable[..., Any], s: SampleInput) -> Sample:
    args = (s.input, tuple(s.args), dict(s.kwargs))
    x, a, k = copy.deepcopy(args)
    with torch.no_grad():
        expected = fn(x, *a, **k)
    return Sample(*args, expected=expected)


def _samples(
    case: Case, dtype: torch.dtype, extremal_samples: int
) -> tuple[list[Sample], list[Sample]]:
    """(regular samples, extremal reference samples), deterministic."""
    op = OPS[case.name]
    fn = _function(case)
    torch.manual_seed(0)
    found = itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=False), SCAN)
    regular = [_eager(fn, s) for s in found]
    extra: list[Sample] = []
    if case.extremal:
        torch.manual_seed(0)
        references = op.reference_inputs("cpu", dtype, requires_grad=False)
        chosen = itertools.islice((s for s in references if extremal(s)), extremal_samples)
        extra = [_eager(fn, s) for s in chosen]
    return regular, extra


def _spread(samples: Sequence[Any], n: int) -> list[Any]:
    if len(samples) <= n:
        return list(samples)
    return [samples[i * len(samples) // n] for i in range(n)]


def _rule(rules: Sequence[Rule], dtype: torch.dtype, sample: Sample) -> Rule | None:
    return next((r for r in rules if dtype in r.dtypes and r.applies(sample)), None)


def _describe(sample: Sample) -> str:
    def brief(value: object) -> str:
        if isinstance(value, torch.Tensor):
            return f"T{list(value.shape)}"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(brief(v) for v in value) + "]"
        return repr(value)

    parts = [brief(sample.input), *(brief(a) for a in sample.args)]
    parts += [f"{k}={brief(v)}" for k, v in sample.kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _summary(error: BaseException) -> str:
    """The first line of an error, plus assert_close's mismatch statistics."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # Dynamo's BackendCompilerFailed starts with "backend='neuron' raised:".
    lines = [line for line in lines if not line.startswith("backend=")] or lines or [""]
    details = [line for line in lines[1:] if line.startswith(("Mismatched", "Greatest"))]
    return f"{type(error).__name__}: " + "; ".join([lines[0][:300], *details])


def _widen_bf16(tree: Any) -> Any:
    return tree_map_only(
        torch.Tensor, lambda t: t.float() if t.dtype == torch.bfloat16 else t, tree
    )


def check_sample(
    fn: Callable[..., Any],
    sample: Sample,
    tol: Tol,
    expect_fallback: Rule | None = None,
    gap: str | None = None,
    float32_reference: bool = False,
) -> None:
    """Run one sample compiled; compare with eager (with ``float32_reference``, eager in
    float32 rounded to the output's dtype); check where it ran. With ``gap`` (an op that may
    fall back), that op alone falling back raises :class:`FellBack`; a numeric mismatch raises
    :class:`WrongAnswer` whatever ran where."""
    inputs = (sample.input, sample.args, sample.kwargs)
    e_input, e_args, e_kwargs = copy.deepcopy(_widen_bf16(inputs) if float32_reference else inputs)
    d_input, d_args, d_kwargs = copy.deepcopy(inputs)
    torch._dynamo.reset()
    torchneuron.reset_stats()
    with torch.no_grad():
        expected = fn(e_input, *e_args, **e_kwargs)
        actual = torch.compile(fn, backend="neuron", fullgraph=True)(d_input, *d_args, **d_kwargs)
    updated, expected_updated = (
        list(_tensors([d_input, d_args, d_kwargs])),
        list(_tensors([e_input, e_args, e_kwargs])),
    )
    if float32_reference:
        expected = tree_map(lambda e, a: e.to(a.dtype), expected, actual)
        expected_updated = tree_map(lambda e, a: e.to(a.dtype), expected_updated, updated)
    stats = torchneuron.stats()
    atol, rtol = tol
    try:
        torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
        # Inputs the op updates in place (batch_norm's running stats) must match too.
        torch.testing.assert_close(
            updated,
            expected_updated,
            atol=atol,
            rtol=rtol,
            equal_nan=True,
        )
    except AssertionError as e:
        raise WrongAnswer(f"wrong answer (ops that fell back: {stats['ops_fallback']}): {e}") from e
    if expect_fallback is not None:
        assert stats["ops_fallback"], (
            f"expected a fallback ({expect_fallback.reason}), but everything ran on the device"
        )
        if expect_fallback.falls_back is not None:
            assert set(stats["ops_fallback"]) == {expect_fallback.falls_back}, (
                f"expected only {expect_fallback.falls_back} to fall back, got "
                f"{stats['ops_fallback']}"
            )
    elif gap is not None and set(stats["ops_fallback"]) == {gap}:
        raise FellBack(f"{gap} fell back (expected)")
    else:
        assert stats["ops_fallback"] == {}, f"ops fell back to eager: {stats['ops_fallback']}"
        assert stats["kernels_run"] >= 1, f"no device kernel ran: {stats}"


def _run_samples(
    case: Case,
    plan: Sequence[tuple[Sample, Rule | None]],
    dtype: torch.dtype,
    gap: str | None = None,
) -> None:
    """Checks every sample of ``plan``. Raises :class:`OpCheckFailed` only when every failure
    is ``gap`` falling back (what an xfail accepts), else :class:`SamplesFailed`."""
    fn = _function(case)
    tol = case.tol.get(dtype, TOLERANCES[dtype])
    failures: list[str] = []
    expected_only = True
    for i, (sample, fallback) in enumerate(plan):
        try:
            check_sample(fn, sample, tol, fallback, gap, case.float32_reference)
        except Exception as e:
            expected_only &= isinstance(e, FellBack)
            failures.append(f"  sample {i} {_describe(sample)}: {_summary(e)}")
    if failures:
        error = OpCheckFailed if expected_only else SamplesFailed
        raise error(
            f"{case.name} {dtype}: {len(failures)} of {len(plan)} samples failed\n"
            + "\n".join(failures)
        )


# ----------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------


def _id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _xfail(falls_back: str, reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(
        strict=True, raises=OpCheckFailed, reason=f"{reason}: {falls_back} falls back"
    )


def _op_params() -> Iterator[Any]:
    for case in CASES:
        for dtype in _dtypes(case):
            gap = case.xfail.get(dtype)
            marks = [_xfail(gap.falls_back, gap.reason)] if gap else []
            yield pytest.param(case.name, dtype, id=f"{case.name}-{_id(dtype)}", marks=marks)


def _bug_params() -> Iterator[Any]:
    for case in CASES:
        for bug in case.bugs:
            for dtype in _dtypes(case):
                if dtype in bug.dtypes:
                    test_id = f"{case.name}-{bug.key}-{_id(dtype)}"
                    assert bug.falls_back, f"{case.name} bug {bug.key}: name the op"
                    marks = _xfail(bug.falls_back, bug.reason)
                    yield pytest.param(case.name, bug.key, dtype, id=test_id, marks=marks)


@pytest.fixture(scope="module", autouse=True)
def _no_guard_latency_profiling() -> Iterator[None]:
    """Dynamo times every new guard set once, after flushing the CPU caches, for a compile
    metric; that is a third of the time per sample here, so this module skips it."""
    import torch._dynamo.guards as guards

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(guards, "profile_guard_manager", lambda *args: 0.0, raising=False)
        yield


@pytest.mark.parametrize(("name", "dtype"), list(_op_params()))
def test_op(name: str, dtype: torch.dtype) -> None:
    case = CASE_BY_NAME[name]
    regular, extra = _samples(case, dtype, EXTREMAL_SAMPLES[dtype])
    on_device: list[tuple[Sample, Rule | None]] = []
    falling_back: list[tuple[Sample, Rule | None]] = []
    for s in regular:
        if _rule(case.bugs, dtype, s) is None and _rule(case.skip, dtype, s) is None:
            fallback = _rule(case.fallback, dtype, s)
            (on_device if fallback is None else falling_back).append((s, fallback))
    assert on_device, f"no sample of {name} can run on the device: the test would prove nothing"
    plan = _spread(on_device, SAMPLES[dtype]) + _spread(falling_back, FALLBACK_SAMPLES)
    plan += [(s, _rule(case.fallback, dtype, s)) for s in extra if not _rule(case.bugs, dtype, s)]
    gap = case.xfail.get(dtype)
    _run_samples(case, plan, dtype, gap.falls_back if gap else None)


@pytest.mark.parametrize(("name", "bug", "dtype"), list(_bug_params()))
def test_known_bug(
    name: str, bug: str, dtype: torch.dtype, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASE_BY_NAME[name]
    rule = next(r for r in case.bugs if r.key == bug)
    regular, extra = _samples(case, dtype, max(EXTREMAL_SAMPLES.values()))
    hits = [s for s in regular + extra if rule.applies(s)][:KNOWN_BUG_SAMPLES]
    if not hits:
        pytest.fail(f"no OpInfo sample of {name} {dtype} matches known bug {bug!r}: update CASES")
    # A failed compile saves its graph: keep those files out of /tmp.
    monkeypatch.setenv("TORCHNEURON_DUMP_DIR", str(tmp_path / "dump"))
    _run_samples(case, [(s, None) for s in hits], dtype, rule.falls_back)


def test_cases_name_opinfo_entries() -> None:
    missing = [case.name for case in CASES if case.name not in OPS]
    assert not missing, f"not in op_db: {missing}"


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong"])
def test_an_expected_fallback_xfail_does_not_accept_a_wrong_answer(wrong: bool) -> None:
    """The harness itself: with airy_ai (no lowering) expected to fall back, a sample whose
    airy_ai falls back and whose result matches is the failure the xfail accepts
    (OpCheckFailed); the same sample giving a wrong answer on the device side is not
    (SamplesFailed)."""

    def airy_plus(x: torch.Tensor) -> torch.Tensor:
        # Under torch.compile a wrong device: the compiled graph adds 1, eager does not.
        shift = 1.0 if wrong and torch.compiler.is_compiling() else 0.0
        return torch.special.airy_ai(x) + x.sum() * 0 + shift

    case = Case("airy_plus", fn=airy_plus)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    sample = Sample(x, (), {}, expected=airy_plus(x))
    expected_error = SamplesFailed if wrong else OpCheckFailed
    with pytest.raises(AssertionError) as info:
        _run_samples(case, [(sample, None)], F32, gap="aten.special_airy_ai.default")
    assert type(info.value) is expected_error, str(info.value)
    assert ("WrongAnswer" in str(info.value)) == wrong, str(info.value)


# Bessel functions, erfcx and orthogonal polynomials (torchneuron/special_math.py) over their whole
# domain: each function switches method at some |x| (4, 8, 15; 1 for K; |x| = 1 for the
# polynomials), which OpInfo's samples (|x| < 9) mostly do not reach. Compared with eager
# float64 on the same float32 inputs, rounded to float32: eager's own float32 kernels are
# off by up to ~1e-3 near x = +-1 (Chebyshev U and V of degree 12) and ~5e-7 near x = 5 (J, Y).
SPECIAL_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "i0": torch.i0,
    "i0e": torch.special.i0e,
    "i1": torch.special.i1,
    "i1e": torch.special.i1e,
    "modified_bessel_i0": torch.special.modified_bessel_i0,
    "modified_bessel_i1": torch.special.modified_bessel_i1,
    "bessel_j0": torch.special.bessel_j0,
    "bessel_j1": torch.special.bessel_j1,
    "bessel_y0": torch.special.bessel_y0,
    "bessel_y1": torch.special.bessel_y1,
    "modified_bessel_k0": torch.special.modified_bessel_k0,
    "modified_bessel_k1": torch.special.modified_bessel_k1,
    "scaled_modified_bessel_k0": torch.special.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": torch.special.scaled_modified_bessel_k1,
    "spherical_bessel_j0": torch.special.spherical_bessel_j0,
    "erfcx": torch.special.erfcx,
}
SPECIAL_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    f"{prefix}chebyshev_polynomial_{kind}": getattr(
        torch.special, f"{prefix}chebyshev_polynomial_{kind}"
    )
    for prefix in ("", "shifted_")
    for kind in "tuvw"
} | {
    "hermite_polynomial_h": torch.special.hermite_polynomial_h,
    "hermite_polynomial_he": torch.special.hermite_polynomial_he,
}
_EDGES = [0.0, 1e-30, 1e-6, 0.5, 1.0, 3.9999, 4.0, 7.9999, 8.0, 9.9999, 10.0, 88.0, 89.0, 1e4]
SPECIAL_X = torch.cat(
    [
        torch.linspace(-40, 40, 801),
        torch.tensor(_EDGES + [-v for v in _EDGES] + [math.inf, -math.inf, math.nan]),
    ]
)
_POLY_X = torch.cat(
    [torch.linspace(-3, 3, 61), torch.tensor([-1.0, 1.0, 0.0, -0.999999, 0.999999, 1.00001])]
)
# Degrees: truncated toward 0 as eager does, negative ones give 0. The Hermite polynomials
# also at 128 and past it (NaN): they are eager's float32 recurrence step for step
# (special_math.py), so their reference is eager float32 (float64's kernel stops at 512).
# The closed forms' float32 phase error grows with the degree (~n ulp): eager's own float32
# kernels are off by 3e-6 at degree 129.
_POLY_N = [-1.77, -0.5, 0, 0.3, 1, 1.9, 2, 3, 4.5, 5, 6, 7, 9, 12, 20]
SPECIAL_POLY_GRIDS = {
    name: tuple(
        t.flatten()
        for t in torch.meshgrid(
            _POLY_X,
            torch.tensor(_POLY_N + ([30, 127, 128, 129] if "hermite" in name else [])),
            indexing="ij",
        )
    )
    for name in SPECIAL_BINARY
}


# On the device: one function of each implementation (the others differ in a constant or a
# final factor, and the whole set is checked on the CPU below, in seconds less).
SPECIAL_ON_DEVICE = {
    "unary": [
        "i0",
        "i1e",
        "bessel_j0",
        "bessel_y1",
        "modified_bessel_k1",
        "scaled_modified_bessel_k0",
        "spherical_bessel_j0",
        "erfcx",
    ],
    "polynomials": [
        "chebyshev_polynomial_t",
        "chebyshev_polynomial_u",
        "chebyshev_polynomial_v",
        "shifted_chebyshev_polynomial_w",
    ],
}


def _special_calls(names: Sequence[str]) -> list[tuple[str, Callable[..., torch.Tensor], Any]]:
    return [
        (name, SPECIAL_UNARY[name], (SPECIAL_X,))
        if name in SPECIAL_UNARY
        else (name, SPECIAL_BINARY[name], SPECIAL_POLY_GRIDS[name])
        for name in names
    ]


def _check_special(name: str, fn: Callable[..., torch.Tensor], args: Any, got: Any) -> None:
    exact = "hermite" not in name
    want = fn(*(t.double() if exact else t for t in args)).float()
    atol, rtol = TRANSCENDENTAL[F32]
    torch.testing.assert_close(
        got, want, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{name}: {m}"
    )


@pytest.mark.parametrize("group", list(SPECIAL_ON_DEVICE))
def test_bessel_and_chebyshev_match_float64_over_their_domain(group: str) -> None:
    calls = _special_calls(SPECIAL_ON_DEVICE[group])

    def every(*inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(fn(*args) for (_, fn, _), args in zip(calls, inputs, strict=True))

    got = torch.compile(every, backend="neuron", fullgraph=True)(*(args for _, _, args in calls))
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {} and stats["kernels_run"] >= 1
    for (name, fn, args), g in zip(calls, got, strict=True):
        _check_special(name, fn, args, g)


def test_every_bessel_and_polynomial_decomposition_matches_float64() -> None:
    """Every decomposition of special_math.py, run by eager PyTorch on the CPU (the table's
    entry for the op itself): exact to float32 precision over the same domains."""
    from torchneuron.decompositions import neuron_decompositions

    table = neuron_decompositions()
    for name, fn, args in _special_calls([*SPECIAL_UNARY, *SPECIAL_BINARY]):
        op = getattr(torch.ops.aten, name if name == "i0" else f"special_{name}").default
        _check_special(name, fn, args, table[op](*args))


# Where a formula cancels: the executor's sigmoid was off by 6.6e-4 relatively at x = -8.8
# (Eigen's logistic()), its erf overshot 1 near x = 4 so that erfc = 1 - erf turned
# negative, and atanh near -1 and log2 just below 1 lost 4e-5.
CANCELLING = [
    ("sigmoid", torch.sigmoid, torch.linspace(-30.0, -4.0, 40001)),
    ("silu", torch.nn.functional.silu, torch.linspace(-30.0, -4.0, 40001)),
    ("erfc", torch.special.erfc, torch.linspace(-9.0, 9.0, 40001)),
    ("atanh", torch.atanh, torch.logspace(-6.0, 0.0, 40001) - 1.0),
    ("log2", torch.log2, torch.linspace(0.99, 1.01, 40001)),
]


@pytest.mark.parametrize(("name", "fn", "x"), CANCELLING, ids=[c[0] for c in CANCELLING])
def test_functions_keep_float32_precision_where_their_formulas_cancel(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> None:
    got = fn(x.to("neuron")).cpu().double()
    torch.testing.assert_close(
        got, fn(x.double()), rtol=2e-6, atol=0.0, msg=lambda m: f"{name}: {m}"
    )


def test_erf_stays_within_its_range() -> None:
    got = torch.erf(torch.linspace(-6.0, 6.0, 40001).to("neuron")).cpu()
    assert got.abs().max().item() == 1.0


@pytest.mark.parametrize(
    ("x", "dim", "index"),
    [
        (torch.tensor(3.5), 0, torch.tensor([0])),
        (torch.tensor(3.5), -1, torch.tensor(0)),
        (torch.arange(5.0), 0, torch.tensor(2)),
        (torch.arange(10.0).view(5, 2), -2, torch.tensor(4)),
    ],
    ids=["0d_input", "0d_input_and_index", "0d_index", "0d_index_2d_input"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_id)
def test_index_select_with_a_0d_input_or_index_runs_on_the_device(
    x: torch.Tensor, dim: int, index: torch.Tensor, dtype: torch.dtype
) -> None:
    """A 0-d index keeps its dim in the result (like a 1-element index) and a 0-d input is
    selected by its one index. Both once built a gather the verifier rejected (a 0-d index:
    the whole graph went back to eager) or were refused (a 0-d input); with ops around it the
    graph is still one kernel."""

    def fn(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x * 2, dim, index) + 1

    x = x.to(dtype)
    got = torch.compile(fn, backend="neuron", fullgraph=True)(x, index)
    want = fn(x, index)
    assert got.shape == want.shape
    assert torch.equal(got, want)
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {}
    assert stats["ops_on_device"] == 3
    assert stats["kernels_run"] == 1


def _instructions(prof: torchneuron.profile) -> set[str]:
    return {n for r in prof._runs if r.kernel for n in r.kernel.instruction_names}


def _scatters(prof: torchneuron.profile) -> list[dict[str, Any]]:
    """The dma_scatter instructions of the profiled kernels' programs."""
    found: list[dict[str, Any]] = []

    def walk(items: list[dict[str, Any]]) -> None:
        for item in items:
            if "op" not in item:
                walk(item["body"])
            elif item["op"] == "dma_scatter":
                found.append(item)

    for r in prof._runs:
        if r.kernel:
            walk(json.loads(r.kernel.program_json)["body"])
    return found


def test_unpermute_rows_in_eager_pytorch() -> None:
    """The op the unsort rewrite leaves for a sort's indices runs on the CPU too (a graph
    that keeps it eager): out[perm[i]] = rows[i]."""
    rows = torch.arange(12.0).reshape(4, 3)
    perm = torch.tensor([2, 0, 3, 1])
    got = torch.ops.torchneuron.unpermute_rows(rows, perm)
    want = torch.empty_like(rows)
    want[perm] = rows
    assert torch.equal(got, want)


def test_index_put_writes_rows_by_indirect_dma() -> None:
    """``t[idx] = v`` without accumulate: rows written by index (``dma_scatter``), each
    row's last write winning (as PyTorch's CPU kernel does; rows go in index order). The
    inverse permutation Transformers' MoE layers compute this way (``inv[perm] = arange(n)``)
    at 4096 routed rows takes under 0.5 ms modeled on trn2 (0.35: a descriptor per row on
    GpSimd; 0.78 as [rows, indices] comparisons, 35.8 ms as a one-hot matmul before)."""

    def put(t: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[idx] = v
        return t

    g = torch.Generator().manual_seed(7)
    t = torch.randn(50, 3, generator=g)
    idx = torch.tensor([4, 9, 4, 0, 49, 9, -46])  # rows written twice and three times
    v = torch.randn(7, 3, generator=g)
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(put, backend="neuron", fullgraph=True)(t, idx, v)
    assert torch.equal(got, put(t, idx, v))
    assert "dma_scatter" in _instructions(prof)

    def inverse(perm: torch.Tensor) -> torch.Tensor:
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        return inv

    perm = torch.randperm(4096, generator=g)
    torch._dynamo.reset()
    options = {"target": "trn2", "cache": False}
    with torchneuron.profile() as prof:
        got = torch.compile(inverse, backend="neuron", fullgraph=True, options=options)(perm)
    assert torch.equal(got, torch.argsort(perm))
    assert torchneuron.stats()["ops_fallback"] == {}
    assert prof.total_device_ns < 0.5e6


def test_indexing_past_2_24_positions_picks_exact_rows() -> None:
    """``logits[arange(B), labels]`` over B x V past 2^24 positions: the engines' fp32
    arithmetic holds integers exactly only below 2^24, so a row number computed as
    ``b * V + label`` was off by a few rows (2801 of 4096 picks wrong at 4096 x 32000). It
    is found in two gathers: a block of 128 rows by an exact block number, then the row
    within it. Where no block makes both numbers exact (an odd last dim), the index falls
    back to eager, counted."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(600, 32000, generator=g).to(torch.bfloat16)  # 19.2M positions
    labels = torch.randint(0, 32000, (600,), generator=g)
    labels[:3] = torch.tensor([0, 31999, 31872])  # a block's first and last rows

    def pick(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x[torch.arange(x.shape[0]), i]

    torch._dynamo.reset()
    got = torch.compile(pick, backend="neuron", fullgraph=True)(logits, labels)
    assert torch.equal(got, pick(logits, labels))
    assert torchneuron.stats()["ops_fallback"] == {}

    # Middle dims of 17.2M positions, blocks of 4 rows (2100 = 4 * 525), negative indices.
    table = torch.randn(2, 8200, 2100, generator=g).to(torch.bfloat16)
    i = torch.randint(0, 8200, (50,), generator=g)
    j = torch.randint(-2100, 2100, (50,), generator=g)
    torch._dynamo.reset()
    got = torch.compile(lambda t, a, b: t[:, a, b], backend="neuron", fullgraph=True)(table, i, j)
    assert torch.equal(got, table[:, i, j])
    assert torchneuron.stats()["ops_fallback"] == {}

    odd = torch.randn(16400, 1025, generator=g)
    rows = torch.randint(0, 16400, (8,), generator=g)
    cols = torch.randint(0, 1025, (8,), generator=g)
    torch._dynamo.reset()
    got = torch.compile(lambda t, a, b: t[a, b] * 2, backend="neuron")(odd, rows, cols)
    assert torch.equal(got, odd[rows, cols] * 2)
    assert torchneuron.stats()["ops_fallback"].get("aten.index.Tensor") == 1


def test_a_gather_from_long_rows_picks_by_position() -> None:
    """``torch.gather`` of a few elements per long row (cross-entropy's logit of each label)
    picks them by row and position, not by a one-hot pass over every element (which read all
    of ``x`` and, over rows too long for a fused group, wrote [rows, 1, V] int64 masks)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(600, 32000, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 32000, (600, 2), generator=g)
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(lambda t, i: torch.gather(t, 1, i), backend="neuron")(x, idx)
    assert torch.equal(got, torch.gather(x, 1, idx))
    assert torchneuron.stats()["ops_fallback"] == {}
    hbm = sum(k["hbm_bytes"] for k in prof.kernels)
    assert hbm < 0.1 * x.numel() * x.element_size(), hbm


@pytest.mark.parametrize(
    ("fn", "shape", "dtype", "passes"),
    [
        (lambda t: torch.softmax(t, -1), (32, 128256), torch.bfloat16, 4.3),
        # x upcast by the caller: that float32 copy is stored once and read by each pass.
        (lambda t: F.softmax(t, dim=-1, dtype=torch.float32), (16, 128256), torch.bfloat16, 9),
        (lambda t: F.log_softmax(t.float(), -1), (64, 32000), torch.bfloat16, 9),
        (lambda t: torch.softmax(t, 1), (2, 16384, 3), torch.float32, None),  # transposed
        (lambda t: torch.softmax(t, -1), (4, 50257), torch.float32, None),  # odd: whole
        (lambda t: t.argmax(-1), (32, 128256), torch.bfloat16, 1.2),
        (lambda t: t.argmin(1), (3, 40000, 2), torch.float32, None),  # transposed
        (lambda t: torch.max(t, -1), (8, 65536), torch.bfloat16, 1.2),
    ],
    ids=["softmax", "softmax-f32", "log-softmax", "middle", "odd", "argmax", "argmin", "max"],
)
def test_reductions_along_long_rows_go_in_blocks(
    fn: Callable[[torch.Tensor], Any],
    shape: tuple[int, ...],
    dtype: torch.dtype,
    passes: float | None,
) -> None:
    """Softmax, log-softmax and the first position of a row's extreme over rows too long
    for a fused group (a vocabulary's logits) run in blocks: each block's max (and sum of
    exponentials, or first position), then the row's. Whole, every intermediate of such a
    row was materialized in HBM (a [32, 128256] argmax moved 17x its bytes: 32 ms modeled).
    Ties and NaNs pick the first position, as eager does."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(shape, generator=g) * 4).to(dtype)
    if "arg" in repr(fn) or x.dim() == 2:
        x.view(-1)[[5, 70000 % x.numel()]] = x.max() + 1  # a tie: the first wins
    x.view(-1)[-3] = float("nan")
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(fn, backend="neuron")(x)
    want = fn(x)
    for g_, w_ in zip(tree_leaves(got), tree_leaves(want), strict=True):
        if g_.is_floating_point():
            torch.testing.assert_close(g_.float(), w_.float(), atol=2e-3, rtol=1e-2, equal_nan=True)
        else:
            assert torch.equal(g_, w_)
    assert torchneuron.stats()["ops_fallback"] == {}
    if passes is not None:  # reads of x (softmax: three or four passes), the output
        out_bytes = sum(t.numel() * t.element_size() for t in tree_leaves(want))
        hbm = sum(k["hbm_bytes"] for k in prof.kernels)
        assert hbm < passes * x.numel() * x.element_size() + 1.2 * out_bytes, hbm


@pytest.mark.parametrize("name", ["gelu_new", "gelu_fast", "gelu_python_tanh", "gelu_accurate"])
def test_gelu_tanh_written_out_is_one_activation(name: str) -> None:
    """Transformers' GELU tanh approximations written as formulas (GPT-2's gelu_new and the
    others: 8 elementwise ops, at 4x the DMA roofline) are recognized by value and run as one
    gelu_tanh activation: as fast as a copy, within bf16 rounding of eager (which rounds
    every step of the formula to bf16)."""
    from transformers.activations import ACT2FN

    act = ACT2FN[name]
    x = torch.randn(1024, 4096, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16) * 3

    def modeled(fn: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, float]:
        torch._dynamo.reset()
        with torch.no_grad(), torchneuron.profile() as prof:
            out = torch.compile(fn, backend="neuron")(x)
        return out, prof.total_device_ns

    got, ns = modeled(act)
    _, copy_ns = modeled(lambda t: t + 0)
    torch.testing.assert_close(got.float(), act(x).float(), atol=2e-2, rtol=2e-2)
    assert ns < 1.2 * copy_ns, (ns, copy_ns)
    assert torchneuron.stats()["ops_fallback"] == {}


def test_out_of_range_row_index_is_an_index_error() -> None:
    """A gathered or written row outside its table raises what eager raises (IndexError),
    as the device's own error (``DeviceError``: the instruction and the user's line), not a
    crash or a silent read."""
    table = torch.randn(100, 16)

    def lookup(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return t[idx] * 2

    def put(t: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[idx] = v
        return t

    idx = torch.tensor([1, 5, 100])
    with pytest.raises(IndexError):
        lookup(table, idx)  # eager's meaning
    torch._dynamo.reset()
    with pytest.raises(IndexError, match=r"index 100 .*out of range \[0, 100\)") as info:
        torch.compile(lookup, backend="neuron", fullgraph=True)(table, idx)
    assert isinstance(info.value, torchneuron._C.DeviceError)
    assert "test_ops.py" in str(info.value)  # the user's line
    torch._dynamo.reset()
    with pytest.raises(IndexError, match="index 100"):
        torch.compile(put, backend="neuron", fullgraph=True)(table, idx, torch.randn(3, 16))


@pytest.mark.parametrize(
    ("rows", "width", "index_shape", "dtype", "index_dtype"),
    [
        (2048, 1024, (4096,), torch.bfloat16, torch.int64),  # Mixtral's MoE dispatch
        (300, 200, (10, 77), torch.float32, torch.int64),  # features and steps not whole
        (64, 130, (300,), torch.float16, torch.int32),
        # Tables SBUF holds transposed only in part: passes of feature tiles (8192 tokens'
        # dispatch: 4 of 8 tiles a pass; 2, then 1 of 44 features).
        (8192, 1024, (16384,), torch.bfloat16, torch.int64),
        (12000, 300, (5000,), torch.float32, torch.int32),
    ],
    ids=["moe_dispatch", "f32_ragged", "f16_i32_index", "moe_dispatch_8k", "f32_passes"],
)
def test_gathers_that_pay_run_within_partitions(
    rows: int,
    width: int,
    index_shape: tuple[int, ...],
    dtype: torch.dtype,
    index_dtype: torch.dtype,
) -> None:
    """A table that fits SBUF transposed, gathered often enough (MoE dispatch: each token's
    row once per expert it is routed to), is gathered by GpSimd within partitions
    (``n_gather``) and transposed back on TensorE (its transpose mode), bit for bit:
    infinities and NaN too (max-pooling gathers a padding of -inf)."""

    def lookup(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return t[idx]

    g = torch.Generator().manual_seed(3)
    table = torch.randn(rows, width, generator=g).to(dtype)
    table[1, 0], table[2, 1], table[3, 2] = float("inf"), float("-inf"), float("nan")
    idx = torch.randint(-rows, rows, index_shape, generator=g).to(index_dtype)
    idx.view(-1)[:3] = torch.tensor([1, 2, 3])
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(lookup, backend="neuron", fullgraph=True)(table, idx)
    torch.testing.assert_close(got, lookup(table, idx), rtol=0, atol=0, equal_nan=True)
    assert "n_gather" in _instructions(prof) and "dma_gather" not in _instructions(prof)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_a_top_k_sum_adds_its_slices(k: int) -> None:
    """An MoE layer's weighted top-k sum over [tokens, k, hidden] (top-8 in Qwen3-MoE, OLMoE
    and DeepSeek-V3) adds its k slices, bf16 ones in float32 rounded once as eager's sum:
    no transpose of the tensor and no column sums on TensorE (Qwen3-MoE's top-8 sum at 1024
    tokens took 3.1 ms modeled that way, 0.58 ms with the unsort it shares a kernel with)."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(1024, k, 512, generator=g).bfloat16()
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(lambda t: t.sum(1), backend="neuron", fullgraph=True)(x)
    want = x.float().sum(1)
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-6)
    assert "matmul" not in _instructions(prof)
    # k + 1 MB of bf16 moved, 2.8 us a MB at the HBM peak (k = 8: 94 us modeled, the adds'
    # float32 partial sums through HBM; k = 2: 27 us).
    assert prof.total_device_ns < 15e3 * (k + 1)


def test_a_few_rows_of_a_large_table_stay_an_indirect_dma() -> None:
    """Loading the table would cost more than the descriptors of three rows."""
    table = torch.randn(2048, 1024, dtype=torch.bfloat16)
    idx = torch.tensor([5, 0, 2047])
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(lambda t, i: t[i], backend="neuron", fullgraph=True)(table, idx)
    assert torch.equal(got, table[idx])
    assert "dma_gather" in _instructions(prof) and "n_gather" not in _instructions(prof)


def test_a_bad_index_of_a_gather_within_partitions_is_an_index_error() -> None:
    """As test_out_of_range_row_index_is_an_index_error, on n_gather's path."""
    table = torch.randn(256, 256)
    idx = torch.randint(0, 256, (2048,))
    idx[1000] = 256

    def lookup(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return t[idx] * 2

    torch._dynamo.reset()
    with pytest.raises(IndexError, match=r"index 256 .*out of range \[0, 256\)") as info:
        torch.compile(lookup, backend="neuron", fullgraph=True)(table, idx)
    assert isinstance(info.value, torchneuron._C.DeviceError)
    assert "test_ops.py" in str(info.value)


def test_unsort_by_inverse_permutation_is_one_scatter() -> None:
    """Transformers' MoE layers put expert-sorted rows back in token order through the
    inverse permutation (``inv[perm] = arange(n)``, then ``rows[inv]``), with the router
    weights gathered by ``perm`` and multiplied in before: on the device the rows are
    written to rows ``perm`` by one indirect DMA and the weights multiply after it, in token
    order (``rewrite.unsort_by_scatter``): no gather is left. An inverse built on a tensor
    with values, or an index with repeats, keeps eager's meaning."""

    def unsort(x: torch.Tensor, keys: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        _, perm = torch.sort(keys, stable=True)
        scaled = x[perm] * w[perm].unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        return scaled[inv].view(-1, 2, x.shape[1]).sum(dim=1)

    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 32, generator=g).bfloat16()
    keys = torch.randint(0, 8, (64,), generator=g)
    w = torch.rand(64, generator=g)
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(unsort, backend="neuron", fullgraph=True)(x, keys, w)
    torch.testing.assert_close(got, unsort(x, keys, w))
    # x[perm] stays a gather (of a table this small, within partitions: one n_gather).
    names = _instructions(prof)
    assert "dma_scatter" in names and "n_gather" in names
    gathers = sum(
        n in ("dma_gather", "n_gather")
        for r in prof._runs
        if r.kernel
        for n in r.kernel.instruction_names
    )
    assert gathers == 1  # only x[perm]: neither w[perm] nor scaled[inv]
    # perm is a sort's: every row is written once (torchneuron.unpermute_rows), so the
    # output is not filled first and the scatters are disjoint (no waits among them).
    scatters = _scatters(prof)
    assert scatters and all(s.get("disjoint") for s in scatters)

    def given(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        inv = torch.empty_like(q)
        inv[q] = torch.arange(q.size(0))
        return x[inv]

    # An inverse of an index the graph does not know to be a permutation: an ordered
    # scatter over the zero-filled output (of repeated entries, the last wins).
    q = torch.randperm(64, generator=g)
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(given, backend="neuron", fullgraph=True)(x, q)
    assert torch.equal(got, given(x, q))
    scatters = _scatters(prof)
    assert scatters and not any(s.get("disjoint") for s in scatters)

    def filled(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        inv = torch.full_like(idx, 3)  # rows idx misses keep 3: not an inverse
        inv[idx] = torch.arange(idx.size(0))
        return x[inv]

    idx = torch.tensor([5, 1, 5, 0, 2, 7, 7, 6])
    torch._dynamo.reset()
    got = torch.compile(filled, backend="neuron", fullgraph=True)(x[:8], idx)
    assert torch.equal(got, filled(x[:8], idx))


def test_index_put_accumulate_into_a_large_table_is_a_scatter_add() -> None:
    """``index_put(..., accumulate=True)`` into an embedding-sized table adds rows by
    index (``dma_scatter`` with accumulate: a read-add-write per row in fp32, rounded to the
    table's dtype), exactly as eager's sequential bf16 adds, repeated rows included; a
    one-hot matmul over 4096 x 1024 rows would cost 4096 x 1024 x 2 FLOPs per index. A
    small table (a router's counts) keeps the matmul."""

    def add(t: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return t.index_put((idx,), v, accumulate=True)

    g = torch.Generator().manual_seed(3)
    t = torch.randn(4096, 1024, generator=g).bfloat16()
    idx = torch.randint(-4096, 4096, (300,), generator=g)
    idx[1::7] = idx[0]  # one row added to many times
    v = torch.randn(300, 1024, generator=g).bfloat16()
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(add, backend="neuron", fullgraph=True)(t, idx, v)
    assert torch.equal(got, add(t, idx, v))
    assert "dma_scatter" in _instructions(prof)

    # Into zeros the graph creates (an MoE combine): the table's rows are stored from a
    # tile set to zero, not copied from a constant.
    def add_to_zeros(idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return add(torch.zeros(4096, 1024, dtype=v.dtype), idx, v)

    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(add_to_zeros, backend="neuron", fullgraph=True)(idx, v)
    assert torch.equal(got, add_to_zeros(idx, v))
    assert {"dma_scatter", "memset"} <= _instructions(prof)

    small = torch.zeros(8, 4)
    idx8 = torch.tensor([1, 7, 1, 0])
    v8 = torch.randn(4, 4, generator=g)
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        got = torch.compile(add, backend="neuron", fullgraph=True)(small, idx8, v8)
    torch.testing.assert_close(got, add(small, idx8, v8))
    assert "dma_scatter" not in _instructions(prof) and "matmul" in _instructions(prof)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=_id)
def test_index_add_sums_repeats_as_eager_does(dtype: torch.dtype) -> None:
    """Eager's ``index_add_`` in bfloat16/float16 sums every addition to a position in
    float32 and rounds once (``index_put`` with accumulate rounds each: a position added to
    50 times came out 2.0 away). As eager on the device, along any dim, for a small table
    (a one-hot matmul) and a large one (rows added by indirect DMA)."""

    def add(t: torch.Tensor, idx: torch.Tensor, v: torch.Tensor, dim: int) -> torch.Tensor:
        return t.index_add(dim, idx, v)

    g = torch.Generator().manual_seed(3)
    for rows, dim in ((64, 0), (64, 1), (4096, 0)):
        t = torch.randn(rows, 33, generator=g).to(dtype) * 10
        idx = torch.randint(0, t.shape[dim], (1000,), generator=g)
        idx[::3] = 2  # one position added to 300+ times
        shape = (1000, 33) if dim == 0 else (rows, 1000)
        v = torch.randn(*shape, generator=g).to(dtype)
        torch._dynamo.reset()
        got = torch.compile(add, backend="neuron", fullgraph=True)(t, idx, v, dim)
        assert torch.equal(got, add(t, idx, v, dim)), (rows, dim)
        assert torchneuron.stats()["ops_fallback"] == {}


def test_as_strided_copy_and_scatter_run_on_the_device() -> None:
    """Windows that overlap (a stride smaller than the window; copies only), skip elements,
    start at an offset and repeat (stride 0), in one graph: gathers and puts at iota-computed
    positions (decompositions.py). A scatter through overlapping positions stays eager, which
    refuses it at the user's line."""

    def fn(x: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2  # a contiguous intermediate, as in any graph
        return (
            torch.as_strided_copy(y, (3, 4), (2, 1), 1),
            torch.as_strided_copy(y, (2, 3, 2), (7, 0, 3)),
            torch.as_strided_scatter(y, src, (3, 4), (5, 1), 2),
            torch.as_strided_scatter(y, src[:2], (2, 4), (4, 1), 3),
        )

    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    src = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    got = torch.compile(fn, backend="neuron", fullgraph=True)(x, src)
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {} and stats["kernels_run"] >= 1
    for g, w in zip(got, fn(x, src), strict=True):
        assert torch.equal(g, w)

    def overlapping(x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.as_strided_scatter(x * 2, src[:2], (2, 4), (0, 2), 3)

    with pytest.raises(RuntimeError, match="refers to a single memory location"):
        torch.compile(overlapping, backend="neuron")(x, src)


def test_strided_slice_scatter_runs_on_the_device() -> None:
    """``slice_scatter`` with a step (the backward of ``x[:, 1::2]``): interleaved by a reshape
    and a concat, the window padded where it runs past the end (decompositions.py)."""

    def fn(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2
        return (
            torch.slice_scatter(y, a, dim=1, start=1, step=3),  # the window runs past the end
            torch.slice_scatter(y, b, dim=0, start=-4, end=4, step=2),
        )

    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    a = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    b = torch.randn(1, 8, generator=torch.Generator().manual_seed(2))
    got = torch.compile(fn, backend="neuron", fullgraph=True)(x, a, b)
    assert torchneuron.stats()["ops_fallback"] == {}
    for g, w in zip(got, fn(x, a, b), strict=True):
        assert torch.equal(g, w)


# (mat_a shape, mat_b shape, which part of the result the groups define: rows / all / columns)
GROUPED_MM = {
    "rows": ((16, 8), (3, 8, 16), (slice(0, 12), slice(None))),
    "k": ((8, 16), (16, 8), (slice(None), slice(None), slice(None))),
    "columns": ((3, 8, 16), (16, 16), (slice(None), slice(0, 12))),
    "batched": ((3, 8, 16), (3, 16, 8), (slice(None), slice(None), slice(None))),
}


@pytest.mark.parametrize("layout", list(GROUPED_MM))
def test_grouped_mm_matches_eager(layout: str) -> None:
    """``torch._grouped_mm`` (bf16 only, as its compile-time check requires) in each of its
    layouts (an MoE forward, its weight gradient, ...) with group offsets from data, an empty
    group among them. Past the last offset PyTorch leaves the result unspecified, so only the
    groups' part is compared."""
    a_shape, b_shape, region = GROUPED_MM[layout]
    offs = None if layout == "batched" else torch.tensor([5, 5, 12], dtype=torch.int32)
    a, b = torch.randn(a_shape, dtype=torch.bfloat16), torch.randn(b_shape, dtype=torch.bfloat16)

    def fn(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
        return torch._grouped_mm(a, b, offs=offs)

    got = torch.compile(fn, backend="neuron", fullgraph=True)(a, b, offs)
    want = fn(a, b, offs)
    torch.testing.assert_close(got[region], want[region], atol=2e-2, rtol=2e-2)
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {} and stats["kernels_run"] == 1


@pytest.mark.parametrize(
    "args",
    [
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {"kernel_size": 4, "stride": 3, "padding": 1, "ceil_mode": True, "divisor_override": 5},
        {"kernel_size": 40, "ceil_mode": True},  # EfficientNet's pooler: one window past it all
    ],
    ids=["ceil", "exclude_pad", "divisor", "window_past_the_input"],
)
def test_avg_pool2d_windows_of_different_sizes_train_on_the_device(args: dict[str, Any]) -> None:
    def loss(x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, **args).square().sum()

    x = torch.randn(2, 3, 10, 9, requires_grad=True)
    twin = x.detach().clone().requires_grad_()
    loss(x).backward()
    got = torch.compile(loss, backend="neuron")(twin)
    got.backward()
    torch.testing.assert_close(got, loss(x.detach()), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(twin.grad, x.grad, atol=1e-5, rtol=1e-5)
    assert torchneuron.stats()["ops_fallback"] == {}


def _specials(dtype: torch.dtype) -> torch.Tensor:
    """Zeros, ones, powers of two, the extremes, the subnormals, infinities and NaN."""
    info = torch.finfo(dtype)
    subnormal = info.tiny * info.eps
    values = [0.0, -0.0, 1.0, -1.0, 2.0, 0.75, 3.0, info.max, -info.max, info.tiny]
    values += [subnormal, -subnormal, info.tiny / 2, math.inf, -math.inf, math.nan, 1e-3]
    return torch.tensor(values, dtype=dtype)


def test_decompositions_of_ops_core_aten_keeps_whole() -> None:
    """One compiled graph of the ops OpInfo left eager until decompositions.py and
    elementwise_math.py took them, on the inputs where they are delicate: frexp and
    nextafter of every special value against every other (exact), a sort of rows longer than
    the select rounds take (NaN, ties: stable, both orders), histograms (data range, given
    edges, weights, density), 3-d average pooling with windows of different sizes, segments
    (empty ones, ``initial``), nonzero_static past the nonzeros, 2-d and 3-d grid sampling
    outside the image, antialiased resizing, a 3-d transposed convolution, a 2-d histogram,
    overlapping as_strided windows (rewrite.py), embedding bags (an empty one), a dot product
    over an empty dim and the chunked linear cross-entropy. Every op on the device; every
    result as eager's."""
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    special = _specials(torch.float32)
    a, b = special.repeat_interleave(len(special)), special.repeat(len(special))
    rows = torch.randn(2, 300).round(decimals=1) + 0.0  # ties (no -0.0: it ties with 0.0)
    rows[0, ::7] = math.nan
    data = torch.randn(6, 2)
    lengths = torch.tensor([2, 0, 4])
    sparse = torch.randn(4, 5) * (torch.rand(4, 5) > 0.6)
    image, grid = torch.randn(1, 2, 4, 5), torch.rand(1, 3, 3, 2) * 2.4 - 1.2
    volume, grid3 = torch.randn(1, 2, 5, 6, 7), torch.rand(1, 2, 3, 2, 3) * 2.4 - 1.2
    kernel3 = torch.randn(2, 3, 3, 2, 3)
    options = LinearCrossEntropyOptions(batch_chunk_size=2)
    features, classifier, labels = (
        torch.randn(5, 3),
        torch.randn(4, 3),
        torch.tensor([0, 3, 1, 2, 3]),
    )

    def fn(*_: torch.Tensor) -> list[torch.Tensor]:
        out = [*torch.frexp(a), torch.nextafter(a, b), torch.nextafter(a.bfloat16(), b.bfloat16())]
        out += [
            *torch.sort(rows, dim=1, stable=True),
            *torch.sort(rows, descending=True, stable=True),
        ]
        out += [*torch.histogram(rows[1], bins=7, weight=rows[1].abs(), density=True)]
        out += [torch.histogram(rows[1], bins=torch.tensor([-2.0, -0.5, 0.0, 0.3, 2.0]))[0]]
        out += [F.avg_pool3d(volume, 3, 2, 1, ceil_mode=True, count_include_pad=False)]
        out += [torch.segment_reduce(data, "max", lengths=lengths, initial=-0.5)]
        out += [torch.segment_reduce(data, "mean", lengths=lengths)]
        out += [torch.nonzero_static(sparse, size=12)]
        out += [F.grid_sample(image, grid, align_corners=False)]
        out += [
            F.grid_sample(image, grid, mode="nearest", padding_mode="border", align_corners=True)
        ]
        out += [F.grid_sample(volume, grid3, align_corners=True)]
        out += [F.interpolate(image, size=(3, 9), mode="bilinear", antialias=True)]
        out += [F.conv_transpose3d(volume, kernel3, stride=2, padding=1, output_padding=1)]
        out += [torch.histogramdd(data, bins=[3, 2], weight=data[:, 0].abs(), density=True)[0]]
        out += [torch.as_strided(data, (3, 4), (2, 1)) * 1]  # overlapping windows
        out += [F.embedding_bag(labels, classifier, torch.tensor([0, 2, 2]), mode="mean")]
        out += [torch.linalg.vecdot(data[:, :0], data[:, :0])]
        out += [F.linear_cross_entropy(features, classifier, labels, options=options)]
        return out

    got = torch.compile(fn, backend="neuron")()
    for i, (g, w) in enumerate(zip(got, fn(), strict=True)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, equal_nan=True, msg=f"output {i}")
        if g.is_floating_point():  # -0.0 kept (frexp, nextafter, sort)
            number = ~torch.isnan(w)
            assert torch.equal(g.signbit()[number], w.signbit()[number]), f"output {i}: -0.0"
    stats = torchneuron.stats()
    assert stats["ops_fallback"] == {} and stats["kernels_run"] >= 1
