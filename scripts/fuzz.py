#!/usr/bin/env python3
"""Random-program differential fuzzer for the ``neuron`` backend.

Each program is a seeded random function over ops the device runs (elementwise, matmul,
reductions, views and transposes, split/cat/slice/index_select, softmax and norms) on float32 or
bfloat16 tensors of odd sizes, half of them trained (outputs reduced to a loss, then backward).
It is compiled with ``torch.compile(backend="neuron")`` under ``TORCHNEURON_CHECK=1`` (every
kernel's modeled timeline is computed and checked for missing waits) and run under
``torchneuron.profile()``; its outputs and gradients are compared with eager PyTorch.

    scripts/fuzz.py --n 100 --seed 0          # the slice CI runs (tests/python/test_fuzz.py)
    scripts/fuzz.py --n 10000 --seed 7        # a long run

A verdict per program: ``ok``, ``mismatch`` (the device is further from a float64 reference than
eager PyTorch, by more than a margin), ``race`` (a missing wait), ``error`` (an exception from
the backend), ``crash`` (the process died) or ``hang``. Programs run in a worker process, so a
crash is reported and the run goes on. Every failure writes a standalone repro file (``--out``).
Ops left to eager PyTorch are counted and listed; ``--strict-fallback`` makes them failures.
Exit status: 0 when every program is ``ok``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Relative error (max |y - ref| / max |ref|) below which the device always passes, per dtype; above
# it, the device fails when it is more than MARGIN times further from the float64 reference
# than both eager PyTorch in the same dtype and the float64 result of inputs moved by one
# rounding error (which measures how ill-conditioned the output is).
FLOOR = {"float32": 1e-5, "bfloat16": 2e-2}
MARGIN = 4.0
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-9}
MIN_SCALE = 1.0
HANG_SECONDS = 300.0

# --------------------------------------------------------------------------------------------
# Programs
# --------------------------------------------------------------------------------------------


@dataclass
class Input:
    name: str
    shape: list[int]
    kind: str  # "act" (activations), "weight" (scaled by 1/sqrt(fan-in)), "index" (int64)
    high: int = 0  # index inputs: values in [0, high)


@dataclass
class Program:
    index: int
    seed: int
    dtype: str
    train: bool
    inputs: list[Input] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def function_source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        body = [f"    {line}" for line in self.lines]
        ret = ", ".join(self.outputs) + ("," if len(self.outputs) == 1 else "")
        return "\n".join([f"def program({args}):", *body, f"    return ({ret})"]) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "seed": self.seed,
            "dtype": self.dtype,
            "train": self.train,
            "inputs": [vars(i) for i in self.inputs],
            "lines": self.lines,
            "outputs": self.outputs,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Program:
        p = Program(d["index"], d["seed"], d["dtype"], d["train"])
        p.inputs = [Input(**i) for i in d["inputs"]]
        p.lines, p.outputs = list(d["lines"]), list(d["outputs"])
        return p


def program_seed(seed: int, index: int) -> int:
    """Program ``index`` of a run is the same whatever else the run holds."""
    return (seed * 1_000_003 + index * 7_919) % (2**31)


class Generator:
    """Builds one program step by step, running each candidate op eagerly on example tensors so
    that only ops valid for the current shapes are kept (and their shapes are known)."""

    def __init__(self, index: int, seed: int) -> None:
        import torch

        self.torch = torch
        self.rng = random.Random(program_seed(seed, index))
        dtype = self.rng.choice(["float32", "float32", "bfloat16"])
        train = self.rng.random() < 0.5
        self.program = Program(index, seed, dtype, train)
        self.values: dict[str, Any] = {}  # name -> example tensor (float32 stand-in)
        self.counter = 0
        self.env = namespace("float32")

    # ---- helpers
    def size(self) -> int:
        r = self.rng.random()
        if r < 0.15:
            return 1
        if r < 0.85:
            return self.rng.randint(2, 48)
        return self.rng.choice([63, 65, 96, 127, 129, 130, 200])

    def shape(self, ndim: int | None = None) -> list[int]:
        ndim = ndim if ndim is not None else self.rng.choice([1, 2, 2, 3, 3, 4])
        dims = [self.size() for _ in range(ndim)]
        while math.prod(dims) > 40_000:
            dims[dims.index(max(dims))] //= 2
        return dims

    def new_input(self, shape: list[int], kind: str = "act", high: int = 0) -> str:
        name = f"x{len(self.program.inputs)}"
        self.program.inputs.append(Input(name, shape, kind, high))
        torch = self.torch
        if kind == "index":
            self.values[name] = torch.randint(0, high, shape)
        else:
            self.values[name] = torch.randn(shape)
        return name

    def fresh(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    def pick(self, pred: Any = None) -> str | None:
        names = [
            n for n, v in self.values.items() if v.is_floating_point() and (pred is None or pred(v))
        ]
        if not names:
            return None
        # Favour recent values, so programs are chains rather than fans.
        weights = [1.0 + i for i in range(len(names))]
        return self.rng.choices(names, weights)[0]

    def attempt(self, expr: str) -> str | None:
        """Adds ``t = expr`` when it evaluates on the example tensors to a small float tensor."""
        try:
            value = eval(expr, dict(self.env), dict(self.values))  # noqa: S307
        except Exception:
            return None
        torch = self.torch
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return None
        if value.numel() == 0 or value.numel() > 60_000 or value.dim() > 4:
            return None
        if not torch.isfinite(value).all():
            return None
        name = self.fresh()
        self.program.lines.append(f"{name} = {expr}")
        self.values[name] = value
        return name

    # ---- op families: each returns an expression string (or None)
    def unary(self) -> str | None:
        a = self.pick()
        if a is None:
            return None
        forms = [
            "torch.relu({a})",
            "F.gelu({a})",
            "F.gelu({a}, approximate='tanh')",
            "F.silu({a})",
            "torch.tanh({a})",
            "torch.sigmoid({a})",
            "torch.exp({a}.clamp(-6, 6))",
            "{a} * 0.5 + 0.25",
            "-{a}",
            "{a}.abs()",
            "torch.sqrt({a}.abs() + 0.5)",
            "torch.rsqrt({a} * {a} + 1)",
            "torch.log({a}.abs() + 1)",
            "{a}.pow(2)",
            "F.leaky_relu({a}, 0.1)",
            "{a}.clamp(-1, 1)",
            "torch.sin({a})",
            "({a}.to(UP) * 2).to(DT)",
        ]
        return self.rng.choice(forms).format(a=a)

    def binary(self) -> str | None:
        a = self.pick()
        if a is None:
            return None
        shape = list(self.values[a].shape)

        def broadcasts(v: Any) -> bool:
            try:
                return list(self.torch.broadcast_shapes(v.shape, shape)) == shape
            except RuntimeError:
                return False

        b = self.pick(broadcasts)
        if b is None or self.rng.random() < 0.3:
            # A fresh operand: the same shape, a row vector or a column of the last two dims.
            bshape = list(shape)
            r = self.rng.random()
            if r < 0.3 and bshape:
                bshape = [bshape[-1]]
            elif r < 0.5 and len(bshape) >= 2:
                bshape[-1] = 1
            b = self.new_input(bshape)
        forms = [
            "{a} + {b}",
            "{a} - {b}",
            "{a} * {b}",
            "{a} / ({b}.abs() + 1)",
            "{a} * torch.sigmoid({b})",
        ]
        if self.program.dtype == "float32":
            # Comparing two computed values: in bfloat16 many pairs are within a rounding of
            # each other, so eager and the device legitimately take different branches.
            forms += ["torch.maximum({a}, {b})", "torch.where({a} > {b}, {a}, {b} * 0.5)"]
        return self.rng.choice(forms).format(a=a, b=b)

    def matmul(self) -> str | None:
        a = self.pick(lambda v: v.dim() >= 1 and v.shape[-1] <= 300)
        if a is None:
            return None
        k = self.values[a].shape[-1]
        n = self.size() if self.rng.random() < 0.8 else self.rng.choice([128, 130, 257])
        r = self.rng.random()
        if r < 0.4:
            w = self.new_input([n, k], "weight")
            if self.rng.random() < 0.5:
                bias = self.new_input([n], "weight")
                return f"F.linear({a}, {w}, {bias})"
            return f"F.linear({a}, {w})"
        if r < 0.7:
            w = self.new_input([k, n], "weight")
            return f"{a} @ {w}"
        # Between two activations of matching batch dims: a @ b^T.
        av = self.values[a]
        if av.dim() < 2:
            return None
        b = self.pick(lambda v: v.shape == av.shape and v is not av)
        if b is None:
            return None
        scale = 1.0 / math.sqrt(k)
        return f"({a} @ {b}.transpose(-2, -1)) * {scale:.6g}"

    def reduce(self) -> str | None:
        a = self.pick(lambda v: v.dim() >= 1)
        if a is None:
            return None
        nd = self.values[a].dim()
        d = self.rng.randrange(-nd, nd)
        keep = self.rng.random() < 0.5
        forms = [
            f"{a}.sum({d}, keepdim={keep})",
            f"{a}.mean({d}, keepdim={keep})",
            f"torch.softmax({a}, {d})",
            f"torch.log_softmax({a}, {d})",
            f"F.layer_norm({a}, ({self.values[a].shape[-1]},))",
            f"{a} * torch.rsqrt({a}.pow(2).mean(-1, keepdim=True) + 1e-6)",
            # RMSNorm as Llama-family models write it: upcast, normalize, cast back.
            f"({a}.to(UP) * torch.rsqrt({a}.to(UP).pow(2).mean(-1, keepdim=True) + 1e-6)).to(DT)",
        ]
        if not (self.program.train and self.program.dtype == "bfloat16"):
            # Ties (common in bf16) make max's gradient differ legitimately.
            forms.append(f"{a}.amax({d}, keepdim={keep})")
        if self.program.train is False:
            forms.append(f"{a}.sum()")
        return self.rng.choice(forms)

    def layout(self) -> str | None:
        a = self.pick()
        if a is None:
            return None
        v = self.values[a]
        nd = v.dim()
        rng = self.rng
        forms: list[str] = []
        if nd >= 2:
            i, j = rng.sample(range(nd), 2)
            forms += [f"{a}.transpose({i}, {j})", f"{a}.transpose({i}, {j}).contiguous()"]
            perm = list(range(nd))
            rng.shuffle(perm)
            forms.append(f"{a}.permute({', '.join(map(str, perm))})")
            forms.append(f"{a}.flatten(0, 1)")
            forms.append(
                f"{a}.reshape({', '.join(map(str, v.shape[:-2]))}{', ' if nd > 2 else ''}-1)"
            )
        if nd < 4:
            forms.append(f"{a}.unsqueeze({rng.randrange(nd + 1)})")
        if nd >= 1:
            d = rng.randrange(nd)
            n = v.shape[d]
            if n >= 2:
                lo = rng.randrange(n - 1)
                hi = rng.randrange(lo + 1, n + 1)
                index = ", ".join([":"] * d + [f"{lo}:{hi}"])
                forms.append(f"{a}[{index}]")
                step = rng.choice([2, 3])
                forms.append(f"{a}[{', '.join([':'] * d + [f'::{step}'])}]")
                parts = rng.randint(2, min(4, n))
                size = -(-n // parts)
                forms.append(f"{a}.split({size}, {d})[{rng.randrange(-(-n // size))}]")
                forms.append(f"{a}.narrow({d}, {lo}, {hi - lo})")
                # index_select with a constant index of repeats and gaps.
                idx = [rng.randrange(n) for _ in range(rng.randint(1, n + 2))]
                forms.append(f"torch.index_select({a}, {d}, torch.tensor({idx}))")
                # Split into pieces, work on them and cat them back (as fused QKV does).
                forms.append(self.split_cat(a, d, n))
            # cat with another value of matching shape except in d.
            others = [
                name
                for name, o in self.values.items()
                if o.is_floating_point()
                and o.dim() == nd
                and all(o.shape[e] == v.shape[e] for e in range(nd) if e != d)
            ]
            if others:
                b = rng.choice(others)
                forms.append(f"torch.cat([{a}, {b}], {d})")
        if not forms:
            return None
        return rng.choice(forms)

    def split_cat(self, a: str, d: int, n: int) -> str:
        size = -(-n // 3)
        pieces = -(-n // size)
        names = [f"{a}.split({size}, {d})[{i}]" for i in range(pieces)]
        ops = ["torch.relu({})", "{} * 2", "-{}", "{}.abs()", "torch.tanh({})"]
        worked = [self.rng.choice(ops).format(p) for p in names]
        if self.rng.random() < 0.5:
            worked.reverse()
        return f"torch.cat([{', '.join(worked)}], {d})"

    def gather(self) -> str | None:
        a = self.pick(lambda v: v.dim() >= 1)
        if a is None:
            return None
        v = self.values[a]
        d = self.rng.randrange(v.dim())
        n = v.shape[d]
        idx = self.new_input([self.rng.randint(1, n + 3)], "index", high=n)
        return f"torch.index_select({a}, {d}, {idx})"

    def build(self) -> Program:
        rng = self.rng
        first = self.new_input(self.shape())
        if rng.random() < 0.5:
            self.new_input(list(self.values[first].shape))
        families = [
            (self.unary, 3),
            (self.binary, 3),
            (self.matmul, 2),
            (self.reduce, 2),
            (self.layout, 3),
            (self.gather, 0.5),
        ]
        steps = rng.randint(2, 9)
        tries = 0
        while len(self.program.lines) < steps and tries < 200:
            tries += 1
            make = rng.choices([f for f, _ in families], [w for _, w in families])[0]
            expr = make()
            if expr is not None:
                self.attempt(expr)
        # Every value no later line reads is an output (at most four), so nothing is dead code.
        made = [f"t{i}" for i in range(1, self.counter + 1)] or [first]
        leaves = [
            m
            for k, m in enumerate(made)
            if not any(
                re.search(rf"\b{m}\b", line.split("=", 1)[1])
                for line in self.program.lines[k + 1 :]
            )
        ]
        self.program.outputs = leaves[-4:] if leaves else [made[-1]]
        return self.program


def namespace(dtype: str) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[dtype]
    up = torch.float64 if dtype == "float64" else torch.float32
    return {"torch": torch, "F": F, "DT": dt, "UP": up}


# --------------------------------------------------------------------------------------------
# Running one program
# --------------------------------------------------------------------------------------------


def make_inputs(p: Program) -> list[Any]:
    """The program's inputs in float32 (indices in int64), from its seed."""
    import torch

    g = torch.Generator().manual_seed(p.seed * 31 + p.index)
    out = []
    for i in p.inputs:
        if i.kind == "index":
            out.append(torch.randint(0, i.high, i.shape, generator=g))
        else:
            t = torch.randn(i.shape, generator=g)
            if i.kind == "weight":
                t = t / math.sqrt(i.shape[-1])
            out.append(t)
    return out


def rel_error(y: Any, ref: Any) -> float:
    """max |y - ref| over max |ref|; a reference below MIN_SCALE (a sum that cancels to about
    zero) counts as MIN_SCALE, so rounding noise around zero is not a huge relative error."""
    import torch

    y64 = y.detach().to(torch.float64)
    if not torch.isfinite(y64).all():
        return math.inf
    if not ref.numel():
        return 0.0
    scale = max(ref.abs().max().item(), MIN_SCALE)
    return (y64 - ref).abs().max().item() / scale


class RoundingNoise:
    """A dispatch mode that multiplies the result of every computing ATen op (forward and
    backward) by 1 + u * U(-1, 1), and moves a sum's or a matmul's by the error of adding up its
    terms in another order: float64 arithmetic behaving like an implementation with unit roundoff
    u that is free to choose its summation order, as the device's engines are."""

    def __init__(self, unit: float, seed: int) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        gen = torch.Generator().manual_seed(seed)

        def nudge(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
                return t
            noise = torch.rand(t.shape, generator=gen, dtype=t.dtype)
            return t * (1 + unit * (2 * noise - 1))

        def slack(func: Any, args: tuple, kwargs: dict) -> Any:
            """For a sum or a matmul, the rounding error of summing its terms in some order:
            u * sqrt(terms) * the sum of their magnitudes (a typical, not worst, bound)."""
            name = func._schema.name
            if not all(t.is_floating_point() for t in args if isinstance(t, torch.Tensor)):
                return None
            if name in ("aten::sum", "aten::mean"):
                x = args[0]
                dims = args[1] if len(args) > 1 and args[1] else list(range(x.dim()))
                keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
                n = math.prod(x.shape[d] for d in dims) if x.dim() else 1
                mag = x.abs().sum(dims, keepdim=keep) if x.dim() else x.abs()
                return unit * math.sqrt(n) * (mag / n if name == "aten::mean" else mag)
            if name in ("aten::mm", "aten::bmm", "aten::addmm"):
                a, b = args[-2:] if name != "aten::addmm" else args[1:3]
                return unit * math.sqrt(a.shape[-1]) * (a.abs() @ b.abs())
            return None

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                name = func._schema.name
                if func.is_view or name.endswith("_") or "out" in kwargs:
                    return out
                if isinstance(out, (tuple, list)):
                    return type(out)(nudge(o) for o in out)
                extra = slack(func, args, kwargs)
                out = nudge(out)
                if extra is not None and extra.shape == out.shape:
                    noise = torch.rand(out.shape, generator=gen, dtype=out.dtype)
                    out = out + extra * (2 * noise - 1)
                return out

        self.mode = Mode()

    def __enter__(self) -> None:
        self.mode.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)


def run_variant(p: Program, dtype: str, compiled: bool, base: list[Any]) -> tuple[list, list]:
    """Outputs and input gradients of ``p`` in ``dtype`` (eager, or compiled for the device)."""
    import torch

    env = namespace(dtype)
    scope: dict[str, Any] = dict(env)
    exec(p.function_source(), scope)  # noqa: S102
    fn = scope["program"]
    if compiled:
        fn = torch.compile(fn, backend="neuron", fullgraph=False)
    args = []
    for i, t in zip(p.inputs, base, strict=True):
        if i.kind == "index":
            args.append(t)
            continue
        a = t.to(env["DT"])
        if p.train:
            a.requires_grad_(True)
        args.append(a)
    outs = list(fn(*args))
    grads: list[Any] = []
    if p.train:
        loss = sum(
            (
                o.to(env["UP"]) * torch.linspace(-1, 1, o.numel(), dtype=env["UP"]).view(o.shape)
            ).sum()
            for o in outs
        )
        float_args = [a for a in args if a.is_floating_point()]
        grads = list(torch.autograd.grad(loss, float_args, allow_unused=True))
        grads = [
            torch.zeros_like(a) if g is None else g for a, g in zip(float_args, grads, strict=True)
        ]
    return outs, grads


def check_program(p: Program) -> dict[str, Any]:
    """The verdict of one program: status, details and the ops left to eager PyTorch."""
    import torch

    import torchneuron

    base = make_inputs(p)
    ref_outs, ref_grads = run_variant(p, "float64", False, base)
    eager_outs, eager_grads = run_variant(p, p.dtype, False, base)
    # How far the exact result moves when every op's result moves by a rounding error of the
    # program's dtype: an ill-conditioned output (the norm of a constant row, a sum that cancels)
    # may differ that much from the reference whatever order the device sums in.
    with RoundingNoise(UNIT_ROUNDOFF[p.dtype], p.seed):
        moved_outs, moved_grads = run_variant(p, "float64", False, base)
    torch._dynamo.reset()
    torchneuron.reset_stats()
    try:
        with torchneuron.profile() as prof:
            dev_outs, dev_grads = run_variant(p, p.dtype, True, base)
    except Exception as e:  # noqa: BLE001 - every backend failure is a finding
        text = f"{type(e).__name__}: {e}"
        status = "race" if "missing synchronisation" in text else "error"
        return {"status": status, "detail": text[:2000], "fallback": {}}
    stats = torchneuron.stats()
    fallback = dict(stats["ops_fallback"])
    kernels = int(stats["kernels_run"])
    if kernels > 0 and not prof.total_device_ns > 0:
        return {"status": "error", "detail": "profile recorded no device time", "fallback": {}}
    floor = FLOOR[p.dtype]
    worst = ""
    pairs = [
        ("output", i, d, e, r, m)
        for i, (d, e, r, m) in enumerate(
            zip(dev_outs, eager_outs, ref_outs, moved_outs, strict=True)
        )
    ]
    pairs += [
        ("grad", i, d, e, r, m)
        for i, (d, e, r, m) in enumerate(
            zip(dev_grads, eager_grads, ref_grads, moved_grads, strict=True)
        )
    ]
    for kind, i, d, e, r, m in pairs:
        if d.shape != r.shape or d.dtype != e.dtype:
            return {
                "status": "mismatch",
                "detail": f"{kind} {i}: {d.dtype}{list(d.shape)}, eager {e.dtype}{list(e.shape)}",
                "fallback": fallback,
            }
        e_err = max(rel_error(e, r), rel_error(m, r))
        if not math.isfinite(e_err):
            continue  # ill-conditioned in this dtype: nothing to compare against
        d_err = rel_error(d, r)
        if d_err > max(floor, MARGIN * e_err):
            worst = (
                f"{kind} {i} ({list(d.shape)}): relative error {d_err:.3g} vs float64; "
                f"eager {p.dtype} or rounded inputs {e_err:.3g} "
                f"(allowed {max(floor, MARGIN * e_err):.3g})"
            )
            break
    if worst:
        return {"status": "mismatch", "detail": worst, "fallback": fallback, "kernels": kernels}
    return {"status": "ok", "detail": "", "fallback": fallback, "kernels": kernels}


def repro_source(p: Program, verdict: dict[str, Any]) -> str:
    """A standalone file that rebuilds, runs and checks one program."""
    detail = "\n".join("# " + line for line in verdict["detail"].splitlines()[:20])
    commented = "".join(f"# {line}\n" for line in p.function_source().splitlines())
    return (
        f'"""torchneuron fuzz repro: program {p.index} of seed {p.seed} ({p.dtype}, '
        f'{"training" if p.train else "inference"}): {verdict["status"]}."""\n'
        f"{detail}\n"
        "import json\nimport sys\n\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "import fuzz  # noqa: E402\n\n"
        f"PROGRAM = json.loads({json.dumps(json.dumps(p.to_json()))})\n\n"
        f"# The program:\n{commented}\n"
        "if __name__ == '__main__':\n"
        "    fuzz.enable_checks()\n"
        "    verdict = fuzz.check_program(fuzz.Program.from_json(PROGRAM))\n"
        "    print(verdict['status'], verdict['detail'])\n"
        "    sys.exit(0 if verdict['status'] == 'ok' else 1)\n"
    )


def enable_checks() -> None:
    os.environ["TORCHNEURON_CHECK"] = "1"


# --------------------------------------------------------------------------------------------
# Worker and driver
# --------------------------------------------------------------------------------------------


def worker(seed: int, start: int, stop: int) -> None:
    """Runs programs start..stop-1, one JSON line each (a "begin" line first, so that the
    driver knows which program a crash belongs to)."""
    enable_checks()
    import torch

    torch.set_num_threads(1)
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 64
    for index in range(start, stop):
        p = Generator(index, seed).build()
        print(json.dumps({"begin": index, "program": p.to_json()}), flush=True)
        try:
            verdict = check_program(p)
        except Exception as e:  # noqa: BLE001 - the harness itself failed on this program
            verdict = {"status": "harness", "detail": f"{type(e).__name__}: {e}", "fallback": {}}
        print(json.dumps({"end": index, **verdict}), flush=True)


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    """Moves a worker's lines into a queue (None at its end), so the driver can time out."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def drive(args: argparse.Namespace) -> int:
    out_dir = Path(args.out or tempfile.mkdtemp(prefix=f"torchneuron-fuzz-{args.seed}-"))
    counts: Counter[str] = Counter()
    fallback: Counter[str] = Counter()
    failures: list[tuple[int, str, str, Path]] = []
    kernels = [0]  # device kernel runs, over all programs
    index = args.start
    stop = args.start + args.n
    started = time.monotonic()
    last_report = started

    def record(p: Program, verdict: dict[str, Any]) -> None:
        status = verdict["status"]
        if args.strict_fallback and status == "ok" and verdict["fallback"]:
            status = "fallback"
            verdict = {**verdict, "status": status, "detail": f"eager ops: {verdict['fallback']}"}
        counts[status] += 1
        kernels[0] += int(verdict.get("kernels", 0))
        fallback.update(verdict["fallback"])
        if status != "ok":
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"repro_{p.seed}_{p.index}_{status}.py"
            path.write_text(repro_source(p, verdict))
            failures.append((p.index, status, verdict["detail"], path))
            print(f"fuzz: program {p.index}: {status}: {verdict['detail'][:300]}", file=sys.stderr)
            print(f"      repro: {path}", file=sys.stderr)

    while index < stop:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--seed",
            str(args.seed),
            "--start",
            str(index),
            "--n",
            str(stop - index),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        current: Program | None = None
        while True:
            try:
                line = lines.get(timeout=HANG_SECONDS)
            except queue.Empty:
                proc.kill()
                if current is not None:
                    record(
                        current,
                        {
                            "status": "hang",
                            "detail": f"no verdict in {HANG_SECONDS:.0f} s",
                            "fallback": {},
                        },
                    )
                    index = current.index + 1
                break
            if line is None:
                rc = proc.wait()
                if current is not None:  # died inside a program
                    record(
                        current,
                        {"status": "crash", "detail": f"worker exit status {rc}", "fallback": {}},
                    )
                    index = current.index + 1
                else:
                    index = stop if rc == 0 else index + 1
                break
            msg = json.loads(line)
            if "begin" in msg:
                current = Program.from_json(msg["program"])
                continue
            assert current is not None and msg["end"] == current.index
            record(current, msg)
            index = current.index + 1
            current = None
            done = index - args.start
            now = time.monotonic()
            if now - last_report > 30 and sys.stderr.isatty() or done % 500 == 0:
                print(
                    f"fuzz: {done}/{args.n} programs, {dict(counts)} ({now - started:.0f} s)",
                    file=sys.stderr,
                )
                last_report = now
        proc.wait()

    elapsed = time.monotonic() - started
    bad = sum(v for k, v in counts.items() if k != "ok")
    summary = ", ".join(
        f"{counts[k]} {k}"
        for k in ("ok", "mismatch", "race", "error", "crash", "hang", "harness", "fallback")
        if counts[k] or k in ("ok", "mismatch", "race", "error", "crash")
    )
    print(f"fuzz: {args.n} programs (seed {args.seed}) in {elapsed:.0f} s: {summary}")
    print(f"fuzz: {kernels[0]} device kernel runs")
    if fallback:
        ops = ", ".join(f"{op} x{n}" for op, n in fallback.most_common())
        print(f"fuzz: ops left to eager PyTorch: {ops}")
    if failures:
        print(f"fuzz: repro files in {out_dir}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=200, help="programs to run (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    ap.add_argument("--start", type=int, default=0, help="index of the first program")
    ap.add_argument("--out", help="folder for repro files (default: a new temporary folder)")
    ap.add_argument(
        "--strict-fallback",
        action="store_true",
        help="count a program that leaves ops to eager PyTorch as a failure",
    )
    ap.add_argument("--show", type=int, metavar="INDEX", help="print program INDEX and exit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.show is not None:
        p = Generator(args.show, args.seed).build()
        print(
            f"# program {p.index} of seed {p.seed}: {p.dtype}, "
            f"{'training' if p.train else 'inference'}; inputs "
            + ", ".join(f"{i.name}{i.shape}" for i in p.inputs)
        )
        print(p.function_source(), end="")
        return 0
    if args.worker:
        worker(args.seed, args.start, args.start + args.n)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
