"""Shared fixtures: a clean Dynamo cache and clean stats for every test, and the built extension."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# Every kernel a test compiles has its timeline computed and checked, so a program that lacks a
# wait (and would race on the chip) fails the test that compiled it.
os.environ["TORCHNEURON_CHECK"] = "1"
# Each test compiles what it compiles: the persistent compile cache would turn a compile into a
# load when an earlier test (or run) compiled the same graph. test_cache.py turns it on.
os.environ["TORCHNEURON_CACHE"] = "0"

# Running from a source tree without `pip install -e .`: use python/ (no _C there).
if importlib.util.find_spec("torchneuron") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402
from graph_capture import CompileCall  # noqa: E402

import torchneuron  # noqa: E402


def _ensure_neuron_backend_name() -> None:
    """``backend="neuron"`` resolves through the package's entry point once it is installed;
    from a source tree, register the same function under that name."""
    import torch._dynamo

    if "neuron" not in torch._dynamo.list_backends(exclude_tags=()):
        from torchneuron.backend import neuron_backend

        torch._dynamo.register_backend(neuron_backend, name="neuron")


_ensure_neuron_backend_name()


@pytest.fixture(autouse=True)
def _clean_state() -> Iterator[None]:
    from torchneuron import backend

    torch._dynamo.reset()
    backend.clear_kernel_cache()  # each test compiles its graphs itself
    torchneuron.reset_stats()
    yield
    torch._dynamo.reset()
    torchneuron.reset_stats()


@pytest.fixture
def real_native() -> ModuleType:
    """The built extension. A missing extension fails the test: a skip would let a broken
    build look green."""
    import importlib

    return importlib.import_module("torchneuron._C")


@pytest.fixture
def compile_calls(real_native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[CompileCall]:
    """Every ``_C.compile_graph`` call of the test, recorded by a spy that calls the real one."""
    calls: list[CompileCall] = []
    real = real_native.compile_graph

    def spy(document: str, target: str = "trn2", *args: Any, **kwargs: Any) -> Any:
        kernel = real(document, target, *args, **kwargs)
        calls.append(CompileCall(json.loads(document), target, kernel))
        return kernel

    monkeypatch.setattr(real_native, "compile_graph", spy)
    return calls
