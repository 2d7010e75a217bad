"""Symbolic sizes in FX documents: Dynamo's size symbols as size expressions.

A graph whose sizes Dynamo made dynamic is first offered to the compiler as it is, with every
symbolic size written as an expression over the symbols (docs/FX_GRAPH_FORMAT.md, "Symbolic
sizes"; the grammar is ``runtime/program/SizeExpr.h``'s). When the compiler makes the program
size-generic, one compile serves every size (:class:`torchneuron.kernel.GenericDeviceKernel`);
when it cannot, the backend compiles a specialization per tuple of sizes
(:mod:`torchneuron.specialize`) and says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sympy
import torch
import torch.fx

__all__ = ["NotSizeGeneric", "SizeSymbols", "no_size_guards", "size_expression", "sym_values"]


class NotSizeGeneric(Exception):
    """A graph (or one of its regions) that cannot be compiled once for every size; the
    message says why. The backend compiles per tuple of sizes instead."""


@contextlib.contextmanager
def no_size_guards(gm: torch.fx.GraphModule) -> Iterator[None]:
    """Within: deciding anything about a symbolic size of ``gm`` that its ranges do not already
    decide (``int(size)``, ``size == 16``) raises :class:`NotSizeGeneric` instead of adding a
    guard. A guard would make Dynamo specialize its graph to this call's sizes, compile the
    frame again for every new size and, after ``recompile_limit`` sizes, run it in eager
    PyTorch; and a program built on such a decision would not serve other sizes."""
    envs = {
        id(v.node.shape_env): v.node.shape_env
        for n in gm.graph.nodes
        for v in sym_values(n.meta.get("val"))
    }
    patched = []
    for env in envs.values():
        original = env.evaluate_expr

        def strict(expr: Any, *args: Any, _env: Any = env, _orig: Any = original, **kw: Any) -> Any:
            static = _env._maybe_evaluate_static(
                expr, size_oblivious=kw.get("size_oblivious", False)
            )
            if static is None:
                raise NotSizeGeneric(f"the front end needs the value of {expr}")
            return _orig(expr, *args, **kw)

        env.evaluate_expr = strict
        patched.append(env)
    try:
        yield
    finally:
        for env in patched:
            del env.evaluate_expr  # the class's method again


def sym_values(value: object) -> Iterator[torch.SymInt | torch.SymFloat | torch.SymBool]:
    """The symbolic values in a node's value: sizes of tensors, scalars, in tuples."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        if not value.node.is_constant():
            yield value
    elif isinstance(value, torch.Tensor):
        for size in value.shape:
            yield from sym_values(size)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from sym_values(item)


def size_expression(expr: sympy.Expr) -> str:
    """``expr`` (a SymInt's sympy expression) in the document's size-expression grammar.

    Raises ``ValueError`` for what the grammar has no form for (true division, powers of
    symbols, unbacked sizes, ...)."""
    from torch.utils._sympy import functions as fn

    def binary(name: str, args: tuple[Any, ...]) -> str:
        text = walk(args[0])
        for arg in args[1:]:
            text = f"{name}({text}, {walk(arg)})"
        return text

    def walk(e: Any) -> str:
        if isinstance(e, (int, sympy.Integer)):
            return str(int(e))
        if isinstance(e, sympy.Symbol):
            name = str(e)
            if not (name.startswith("s") and name[1:].isdigit()):
                raise ValueError(f"size {name} is not an input's size (data-dependent?)")
            return name
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(walk(a) for a in e.args) + ")"
        if isinstance(e, sympy.Mul):
            return "*".join(walk(a) for a in e.args)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 1:
            return "*".join([walk(e.base)] * int(e.exp))
        if isinstance(e, (fn.FloorDiv, fn.CleanDiv)):
            return binary("floordiv", e.args)
        if isinstance(e, fn.CeilDiv):
            return binary("ceildiv", e.args)
        if isinstance(e, (fn.PythonMod, fn.Mod, sympy.Mod)):
            return binary("mod", e.args)
        if isinstance(e, fn.ModularIndexing):
            x, divisor, modulus = e.args
            return f"mod(floordiv({walk(x)}, {walk(divisor)}), {walk(modulus)})"
        if isinstance(e, (sympy.Max, fn.Max)):
            return binary("max", e.args)
        if isinstance(e, (sympy.Min, fn.Min)):
            return binary("min", e.args)
        raise ValueError(f"size {expr} ({type(e).__name__}) has no size-expression form")

    return walk(expr)


def _finite(bound: object) -> int | None:
    """A range bound as an int; None for an infinite one (torch's ``int_oo``)."""
    return int(bound) if isinstance(bound, (int, sympy.Integer)) else None


class SizeSymbols:
    """The size symbols one document uses, with the ranges Dynamo's guards give them."""

    def __init__(self) -> None:
        self.ranges: dict[str, tuple[int, int | None]] = {}

    def size(self, value: int | torch.SymInt) -> int | str:
        """A size as the document writes it: an int, or an expression over symbols (recorded
        with their ranges). Raises ``ValueError`` when it has no expression form."""
        if isinstance(value, int):
            return value
        node = value.node
        if node.is_constant():
            return int(value)
        expr = node.expr
        text = size_expression(expr)
        ranges = node.shape_env.var_to_range
        for symbol in expr.free_symbols:
            bounds = ranges.get(symbol)
            low = _finite(bounds.lower) if bounds is not None else None
            high = _finite(bounds.upper) if bounds is not None else None
            self.ranges[str(symbol)] = (max(low or 0, 0), high)
        return text

    def entries(self) -> list[dict[str, Any]]:
        """The document's ``symbols`` field."""
        return [
            {"name": name, "min": low, "max": high}
            for name, (low, high) in sorted(self.ranges.items())
        ]
