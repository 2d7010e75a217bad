#!/usr/bin/env python3
"""How much of PyTorch's OpInfo database runs on the device under ``torch.compile``.

Every entry of ``op_db`` (or those ``--only`` names), its first sample of ``--dtype`` on CPU
inputs (``--samples N``: its first N, 0 for every one; the entry gets the worst class any of
them gets), through ``torch.compile(backend="neuron")`` in this process (no subprocesses: a
per-op time limit by SIGALRM keeps a stuck op from taking the run with it). Each entry gets one
class:

- ``no_sample``: the entry has no sample of that dtype on CPU, or eager PyTorch itself fails
  on it (not counted);
- ``not_reached``: no graph with an op reached the backend (Dynamo ran it in Python, or the
  graph was empty);
- ``on_device``: every op of every graph ran on the device (``torchneuron.stats()`` counts no
  fallback) and the result matches eager;
- ``partly_eager``: some ATen ops fell back to eager PyTorch (which ones: the stats' fallback
  counter) and the result matches eager;
- ``crash``: the compiled call raised (or ran past the time limit) where eager did not;
- ``wrong``: the compiled result differs from eager beyond the tolerances below (in a 16-bit
  dtype, unless it is no further than eager's from the op computed in float64).

Outputs are cloned inside the compiled function, so an entry made only of views (``t``,
``narrow``) is a copy the device must do, as in ``tests/python/test_ops.py``'s layout cases.
Random ops (the result depends on the seed) and ``empty*`` factories compare shapes and dtypes
only. The percentage is of the entries that reach the backend. Among the ops that fell back,
views (``aten.view``, ``aten.diagonal``...) are usually eager because a neighbouring op is, so
the leftover table counts an entry's non-view fallbacks as what blocks it, and its views
separately. Ops the device is a poor home for stay a counted fallback on purpose: see
``DOCUMENTED_FALLBACKS``, printed with the leftovers.

    .venv/bin/python scripts/opinfo_coverage.py                   # float32, all of op_db
    .venv/bin/python scripts/opinfo_coverage.py --dtype bfloat16 --json out.json
    .venv/bin/python scripts/opinfo_coverage.py --only flip --only cumprod -v
    .venv/bin/python scripts/opinfo_coverage.py --samples 0 --table f32.md   # every sample
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
import itertools
import json
import logging
import re
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import torch
import torch._dynamo
from torch.utils._pytree import tree_leaves

CLASSES = ("not_reached", "on_device", "partly_eager", "crash", "wrong")
# (atol, rtol) per dtype: a few ulp of fp32 work on OpInfo's values (up to ~9) for float32;
# two bf16 ulps for bfloat16, two fp16 ulps for float16. Integer and bool results compare
# exactly.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (3.2e-2, 3.2e-2),
    torch.float16: (4e-3, 4e-3),
}
# Ops whose result is unspecified memory: only their shapes and dtypes can be compared.
UNINITIALIZED_PREFIXES = ("empty", "new_empty", "nn.functional.dropout")

# ATen ops that stay eager on purpose, the device being a poor home for them (op -> why). With
# float64 and complex dtypes (no such types on the device) they make an entry partly eager "by
# design" in the summary.
_FACTOR = (
    "a matrix factorization that iterates to convergence (eigenvalue and singular value "
    "decompositions whose vectors are read, general eigenvalues) or pivots symmetrically "
    "(LDL^T): beyond the unrolled column steps "
    "torchneuron/linalg.py uses for Cholesky, LU, QR and Jacobi's values"
)
DOCUMENTED_FALLBACKS: dict[str, str] = {
    **dict.fromkeys(
        [
            f"aten.{name}.default"
            for name in (
                "_linalg_svd",
                "_linalg_eigh",
                "linalg_eig",
                "linalg_ldl_factor_ex",
                "linalg_ldl_solve",
            )
        ],
        _FACTOR,
    ),
    "aten.linalg_pinv.atol_rtol_tensor": (
        "float64 tolerances (torch.pinverse's rcond): the device has no float64"
    ),
}
BY_DESIGN_REASONS = ("float64", "complex", "int16")  # dtypes the device does not have
# How the importer says an op is eager only because of another one.
DEPENDENT_REASONS = ("depends on", "is not a tensor the device can receive")


class FallbackLog(logging.Handler):
    """Why each op fell back: the backend logs every eager op with its reason
    (``target (node) at file:line: reason``) at INFO on the ``torchneuron`` logger."""

    LINE = re.compile(r"^\s+(\S+) \(([^)]*)\)(?: at \S+)?: (.*)$")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reasons: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        for line in record.getMessage().splitlines()[1:]:
            match = self.LINE.match(line)
            if match:
                self.reasons.setdefault(match.group(1), match.group(3))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Collect the reasons (INFO, kept from the console) while the ops run."""
        log = logging.getLogger("torchneuron")
        level, propagate = log.level, log.propagate
        log.setLevel(logging.INFO)
        log.propagate = False
        log.addHandler(self)
        try:
            yield
        finally:
            log.removeHandler(self)
            log.setLevel(level)
            log.propagate = propagate


FALLBACK_LOG = FallbackLog()


class OpTimeout(Exception):
    """The op ran past ``--timeout`` seconds."""


@dataclasses.dataclass
class Result:
    name: str
    cls: str  # one of CLASSES, or "no_sample"
    seconds: float
    fallback: dict[str, int] = dataclasses.field(default_factory=dict)
    detail: str = ""
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)  # fallback op -> why


def _tensors(value: object) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (nested lists, tuples, dicts), in order."""
    return (t for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    return value


def _is_view(name: str) -> bool:
    """Whether a fallback counter's name (``aten.diagonal.default``) is a view overload."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return False
    try:
        overload = getattr(getattr(torch.ops.aten, parts[1]), parts[2])
    except AttributeError:
        return False
    return bool(overload.is_view)


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise OpTimeout(f"ran past the time limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _first_line(error: BaseException) -> str:
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("backend=")] or lines or [""]
    return f"{type(error).__name__}: {lines[0][:300]}"


def _values_random(fn: Callable[..., Any], sample: Any) -> bool:
    """Whether eager results depend on the RNG seed."""
    results = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        inputs = copy.deepcopy((sample.input, sample.args, sample.kwargs))
        with torch.no_grad():
            results.append(fn(inputs[0], *inputs[1], **inputs[2]))
    try:
        torch.testing.assert_close(results[0], results[1], equal_nan=True, atol=0, rtol=0)
    except (AssertionError, RuntimeError, TypeError, ValueError):
        return True
    return False


def _compare(actual: Any, expected: Any, dtype: torch.dtype, values: bool) -> str:
    """'' when ``actual`` matches ``expected``, else what differs."""
    if not values:
        got = [(t.shape, t.dtype) for t in _tensors(actual)]
        want = [(t.shape, t.dtype) for t in _tensors(expected)]
        return "" if got == want else f"shapes/dtypes {got} != {want}"
    atol, rtol = TOLERANCES[dtype]
    try:
        torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    except (AssertionError, TypeError, ValueError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return "; ".join(lines[:3])[:400]
    return ""


#: How an entry's class follows from its samples': the first of these any sample has.
_WORST_FIRST = ("crash", "wrong", "partly_eager", "on_device", "not_reached", "no_sample")


def _closer_than_eager(
    fn: Callable[..., Any], inputs: Any, actual: Any, expected: Any, dtype: torch.dtype
) -> bool:
    """For 16-bit dtypes, whether the device's results are no further from the exact answer
    (the op on the inputs widened to float64) than eager's own: eager rounds every partial
    sum of a 16-bit accumulation (index_put's, for one), the device rounds once, so the two
    can differ by more than the tolerance while the device is the more accurate."""
    if dtype == torch.float32:
        return False

    def widened(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == dtype:
            return value.to(torch.float64)
        return value

    try:
        wide = copy.deepcopy(inputs)
        x, args, kwargs = (torch.utils._pytree.tree_map(widened, part) for part in wide)
        with torch.no_grad():
            exact = fn(x, *args, **kwargs)
    except Exception:
        return False
    trios = list(zip(_tensors(actual), _tensors(expected), _tensors(exact), strict=False))
    if not trios or len(trios) != len(list(_tensors(exact))):
        return False
    for got, want, truth in trios:
        if not got.is_floating_point():
            if not torch.equal(got, want):
                return False
            continue
        device_error = (got.double() - truth.double()).abs().nan_to_num(0.0).max()
        eager_error = (want.double() - truth.double()).abs().nan_to_num(0.0).max()
        if device_error > eager_error:
            return False
    return True


def run_op(op: Any, dtype: torch.dtype, timeout: float, samples: int = 1) -> Result:
    """The entry's class over its first ``samples`` samples of ``dtype`` (0: every sample):
    the worst any of them gets (a crash before a wrong answer before a fallback), with the
    fallbacks of all of them."""
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    start = time.perf_counter()

    def result(cls: str, detail: str = "", fallback: dict[str, int] | None = None) -> Result:
        reasons = {op: FALLBACK_LOG.reasons.get(op, "") for op in fallback or {}}
        return Result(name, cls, time.perf_counter() - start, fallback or {}, detail, reasons)

    if dtype not in op.supported_dtypes("cpu"):
        return result("no_sample", f"{dtype} not supported on CPU")
    try:
        with _time_limit(timeout):
            torch.manual_seed(0)
            generator = iter(op.sample_inputs("cpu", dtype, requires_grad=False))
            chosen = list(itertools.islice(generator, samples or None))
    except Exception as e:  # an OpInfo generator that fails on this dtype
        return result("no_sample", _first_line(e))
    if not chosen:
        return result("no_sample", "no sample")
    FALLBACK_LOG.reasons.clear()
    outcomes = [_run_sample(name, op, sample, dtype, timeout) for sample in chosen]
    fallback: collections.Counter[str] = collections.Counter()
    for _, _, ops in outcomes:
        fallback.update(ops)
    index, (cls, detail, _) = min(
        enumerate(outcomes), key=lambda item: _WORST_FIRST.index(item[1][0])
    )
    if len(chosen) > 1 and detail:
        detail = f"sample {index}: {detail}"
    return result(cls, detail, dict(fallback))


def _run_sample(
    name: str, op: Any, sample: Any, dtype: torch.dtype, timeout: float
) -> tuple[str, str, dict[str, int]]:
    """One sample through ``torch.compile``: (class, detail, fallback ops)."""

    def fn(x: Any, *args: Any, **kwargs: Any) -> Any:
        return _clone(op.op(x, *args, **kwargs))

    inputs = (sample.input, tuple(sample.args), dict(sample.kwargs))
    try:
        e_in = copy.deepcopy(inputs)  # sparse inputs cannot be copied (nor compiled)
        with _time_limit(timeout), torch.no_grad():
            torch.manual_seed(0)
            expected = fn(e_in[0], *e_in[1], **e_in[2])
            compare_values = not name.startswith(UNINITIALIZED_PREFIXES) and not _values_random(
                fn, sample
            )
    except Exception as e:
        return "no_sample", f"eager fails: {_first_line(e)}", {}

    import torchneuron

    neuron = torch._dynamo.lookup_backend("neuron")
    calls = [0]

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        calls[0] += 1
        return neuron(gm, example_inputs)

    d_in = copy.deepcopy(inputs)
    torch._dynamo.reset()
    torchneuron.reset_stats()
    try:
        with _time_limit(timeout), torch.no_grad():
            torch.manual_seed(0)
            actual = torch.compile(fn, backend=backend)(d_in[0], *d_in[1], **d_in[2])
    except Exception as e:
        if calls[0] == 0 and not isinstance(e, OpTimeout):  # Dynamo gave up: no graph
            return "not_reached", f"Dynamo: {_first_line(e)}", {}
        return "crash", _first_line(e), torchneuron.stats()["ops_fallback"]
    stats = torchneuron.stats()
    fallback: dict[str, int] = stats["ops_fallback"]
    if stats["ops_on_device"] + sum(fallback.values()) == 0:
        return "not_reached", "no ATen op reached the backend", {}
    mismatch = _compare(actual, expected, dtype, compare_values)
    if not mismatch and compare_values:  # inputs the op updates in place must match too
        mismatch = _compare(list(_tensors(d_in)), list(_tensors(e_in)), dtype, True)
    if mismatch and not _closer_than_eager(fn, inputs, actual, expected, dtype):
        return "wrong", mismatch, fallback
    if fallback:
        return "partly_eager", "", fallback
    if stats["kernels_run"] == 0:
        return "not_reached", "no device kernel ran", {}
    return "on_device", "", fallback


def _selected(only: Sequence[str]) -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    def full(op: Any) -> str:
        return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")

    if not only:
        return list(op_db)
    wanted = set(only)
    ops = [op for op in op_db if full(op) in wanted or op.name in wanted]
    unknown = wanted - {full(op) for op in ops} - {op.name for op in ops}
    if unknown:
        raise SystemExit(f"not in op_db: {sorted(unknown)}")
    return ops


def _by_design(r: Result) -> bool:
    """Whether the entry is eager only on purpose: some op keeps it eager for a dtype the
    device does not have (float64, complex, int16) or is in ``DOCUMENTED_FALLBACKS``, and
    every other op (views aside) is eager only because of those (it reads their results, or
    is the error check a factorization carries, ``with_effects``)."""
    ops = [op for op in r.fallback if not _is_view(op)]

    def root(op: str) -> bool:
        reason = r.reasons.get(op, "")
        return op in DOCUMENTED_FALLBACKS or any(word in reason for word in BY_DESIGN_REASONS)

    def dependent(op: str) -> bool:
        reason = r.reasons.get(op, "")
        return op == "higher_order.with_effects" or any(
            phrase in reason for phrase in DEPENDENT_REASONS
        )

    return any(root(op) for op in ops) and all(root(op) or dependent(op) for op in ops)


def summarize(results: Sequence[Result], top: int) -> dict[str, Any]:
    counts = collections.Counter(r.cls for r in results)
    reached = sum(counts[c] for c in ("on_device", "partly_eager", "crash", "wrong"))
    by_design = sum(r.cls == "partly_eager" and _by_design(r) for r in results)
    blockers: collections.Counter[str] = collections.Counter()
    views: collections.Counter[str] = collections.Counter()
    why: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in results:
        if r.cls not in ("partly_eager", "wrong", "crash"):
            continue
        for op_name in r.fallback:
            (views if _is_view(op_name) else blockers)[op_name] += 1
            if r.reasons.get(op_name):
                why[op_name][r.reasons[op_name]] += 1
    return {
        "entries": len(results),
        "counts": {c: counts[c] for c in ("no_sample", *CLASSES)},
        "reached": reached,
        "on_device_percent": round(100.0 * counts["on_device"] / reached, 1) if reached else 0.0,
        "partly_eager_by_design": by_design,
        "on_device_percent_of_the_rest": (
            round(100.0 * counts["on_device"] / (reached - by_design), 1)
            if reached > by_design
            else 0.0
        ),
        "leftovers": [
            (op, n, why[op].most_common(1)[0][0] if why[op] else "")
            for op, n in blockers.most_common(top)
        ],
        "leftover_views": views.most_common(top),
    }


def table(results: Sequence[Result], dtype: str, samples: int) -> str:
    """Every entry as a Markdown table row: its class and the ATen ops it left eager, with
    why when they stay eager by design."""
    which = "every sample" if samples == 0 else f"the first {samples} sample(s)"
    lines = [
        f"OpInfo, {dtype}, {which} of each entry (scripts/opinfo_coverage.py)",
        "",
        "| entry | class | ATen ops left eager |",
        "|---|---|---|",
    ]
    for r in results:
        eager = ", ".join(
            f"`{op}`" + (" (by design)" if op in DOCUMENTED_FALLBACKS else "")
            for op in sorted(r.fallback)
        )
        cls = r.cls + (" (by design)" if r.cls == "partly_eager" and _by_design(r) else "")
        lines.append(f"| {r.name} | {cls} | {eager} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--only", action="append", default=[], help="an op_db name (repeat)")
    parser.add_argument("--json", help="write every entry's result and the summary here")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per entry")
    parser.add_argument("--top", type=int, default=25, help="leftover ops to list")
    parser.add_argument(
        "--samples",
        type=int,
        default=1,
        help="samples per entry (0: all of them); an entry gets its worst sample's class",
    )
    parser.add_argument("--table", help="write a Markdown table (entry, class, eager ops) here")
    parser.add_argument("-v", "--verbose", action="store_true", help="every entry's class")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)

    import torchneuron  # noqa: F401  (registers the backend)

    ops = _selected(args.only)
    results: list[Result] = []
    with (
        warnings.catch_warnings(),
        FALLBACK_LOG.installed(),
        torch._dynamo.config.patch(cache_size_limit=64),
    ):
        warnings.simplefilter("ignore")
        for i, op in enumerate(ops):
            r = run_op(op, dtype, args.timeout, args.samples)
            results.append(r)
            line = f"[{i + 1}/{len(ops)}] {r.name}: {r.cls} ({r.seconds:.1f} s)"
            if r.fallback:
                line += f" fallback={sorted(r.fallback)}"
            if r.detail and r.cls != "on_device":
                line += f" -- {r.detail}"
            print(line, file=sys.stderr, flush=True)
    summary = summarize(results, args.top)

    out = sys.stdout
    c = summary["counts"]
    print(f"OpInfo {args.dtype}: {summary['entries']} entries", file=out)
    print(f"  no {args.dtype} sample / eager fails: {c['no_sample']}", file=out)
    print(f"  do not reach the backend:  {c['not_reached']}", file=out)
    print(
        f"  reach the backend:         {summary['reached']}, of which fully on the device "
        f"{c['on_device']} ({summary['on_device_percent']}%), partly eager "
        f"{c['partly_eager']}, crash {c['crash']}, wrong answer {c['wrong']}",
        file=out,
    )
    print(
        f"  partly eager by design:    {summary['partly_eager_by_design']} (float64/complex/"
        f"int16 dtypes, eigen/singular vectors, LDL^T); of the other entries that "
        f"reach the backend, "
        f"{summary['on_device_percent_of_the_rest']}% run fully on the device",
        file=out,
    )
    if args.verbose:
        for r in results:
            print(f"  {r.cls:13} {r.name} {sorted(r.fallback) or ''} {r.detail}", file=out)
    if summary["leftovers"]:
        print("Most frequent leftover ops (entries they keep partly eager):", file=out)
        for op_name, n, reason in summary["leftovers"]:
            why = DOCUMENTED_FALLBACKS.get(op_name)
            note = f"  [stays eager: {why}]" if why else f"  ({reason[:110]})" if reason else ""
            print(f"  {n:4} {op_name}{note}", file=out)
    if summary["leftover_views"]:
        views = ", ".join(f"{op_name} {n}" for op_name, n in summary["leftover_views"])
        print(f"Views left eager next to them: {views}", file=out)
    for cls in ("crash", "wrong"):
        for r in results:
            if r.cls == cls:
                print(f"{cls}: {r.name}: {r.detail}", file=out)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table(results, args.dtype, args.samples))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "dtype": args.dtype,
                    "summary": summary,
                    "documented_fallbacks": DOCUMENTED_FALLBACKS,
                    "results": [dataclasses.asdict(r) for r in results],
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
