"""Compiled models called from several Python threads, and from a forked child."""

from __future__ import annotations

import os
import threading
from types import ModuleType

import pytest
import torch
from torch import nn

import torchneuron


def _model() -> nn.Module:
    torch.manual_seed(0)
    # Big enough that the executor splits its matmuls between host threads (>= 2M MACs).
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).eval()


def _in_threads(fn, n: int) -> list[BaseException]:  # type: ignore[no-untyped-def]
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            start.wait()
            fn(i)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@torch.no_grad()
def test_four_threads_get_their_own_answers(real_native: ModuleType) -> None:
    model = _model()
    compiled = torch.compile(model, backend="neuron")
    xs = [torch.randn(64, 256) for _ in range(4)]
    expected = [model(x) for x in xs]

    def call(i: int) -> None:
        for _ in range(3):
            torch.testing.assert_close(compiled(xs[i]), expected[i], rtol=1e-4, atol=1e-4)

    assert _in_threads(call, 4) == []
    assert torchneuron.stats()["kernels_run"] == 12


@torch.no_grad()
def test_two_threads_compiling_one_graph_compile_once(real_native: ModuleType) -> None:
    model = _model()
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(8, 256)
    assert _in_threads(lambda i: compiled(x), 2) == []
    assert torchneuron.stats()["graphs_compiled"] == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@torch.no_grad()
def test_a_forked_child_runs_compiled_models(real_native: ModuleType) -> None:
    """The executor's host worker threads do not exist in a forked child; the child's runs must
    neither hang on them nor get wrong answers."""
    model = _model()
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(64, 256)
    expected = model(x)
    torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)  # workers started
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        status = 1
        try:
            ok = torch.allclose(compiled(x), expected, rtol=1e-4, atol=1e-4)
            status = 0 if ok else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)  # the parent too
