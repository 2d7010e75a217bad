"""Capture the ATen graphs the backend would see, without compiling them, and the documents
it compiles (:class:`CompileCall`, recorded by the ``compile_calls`` fixture of conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx


@dataclass
class CompileCall:
    """One call of the real ``_C.compile_graph``."""

    document: dict[str, Any]
    target: str
    kernel: Any


def aten_graphs(
    fn: Callable[..., Any], *args: Any, dynamic: bool | None = False, backward: bool = False
) -> list[torch.fx.GraphModule]:
    """Run ``torch.compile(fn)`` once through aot_autograd with the backend's decompositions and
    return the ATen graphs it produced (inference graph, or forward and, with ``backward``,
    the backward graph, which AOT compiles when the backward first runs)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from torchneuron.decompositions import math_attention, neuron_decompositions

    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    aot = aot_autograd(fw_compiler=keep, decompositions=neuron_decompositions())

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        with math_attention():
            return aot(gm, example_inputs)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)(*args)
    if backward:
        out.sum().backward()
    return graphs


def aten_graph(
    fn: Callable[..., Any], *args: Any, dynamic: bool | None = False
) -> torch.fx.GraphModule:
    """The single (inference) ATen graph of ``fn``."""
    with torch.no_grad():
        (gm,) = aten_graphs(fn, *args, dynamic=dynamic)
    return gm


def traced(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    """``symbolic_trace`` + fake shape propagation: a graph with ``meta["val"]`` on every node,
    for graphs aot_autograd would never produce (hand-written targets and arguments)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm = torch.fx.symbolic_trace(fn)
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)
    return gm
