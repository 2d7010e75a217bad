"""Programs are race-free by construction: every kernel the suite compiles has its timeline
checked (TORCHNEURON_CHECK, set in conftest.py), and models whose outputs are written in
pieces (cat, split backward) profile."""

from __future__ import annotations

import json
from types import ModuleType

import pytest
import torch
from torch import nn

import torchneuron
from torchneuron import backend, config


class FusedQkv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(48, 144)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(48, dim=-1)
        return (q * k + v).sum()


def test_split_backward_profiles(real_native: ModuleType) -> None:
    """The split's backward writes the three gradients into column thirds of one HBM buffer;
    the writes are disjoint, so the program has no wait between them and the checker agrees."""
    torch.manual_seed(0)
    model = FusedQkv()
    x = torch.randn(4, 33, 48)
    expected = torch.autograd.grad(model(x), list(model.parameters()))
    compiled = torch.compile(model, backend="neuron")
    with torchneuron.profile() as prof:
        grads = torch.autograd.grad(compiled(x), list(model.parameters()))
    assert len(prof.kernels) == 2  # forward and backward, both profiled
    assert prof.total_device_ns > 0
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    assert torchneuron.stats()["ops_fallback"] == {}


def test_cat_of_pieces_profiles(real_native: ModuleType) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        a, b, c = x.split(16, dim=-1)
        return torch.cat([torch.relu(c), b * 2, -a], dim=-1)

    x = torch.randn(3, 17, 48)
    with torchneuron.profile() as prof:
        y = torch.compile(f, backend="neuron")(x)
    torch.testing.assert_close(y, f(x))
    assert prof.total_device_ns > 0


def _racing_program() -> str:
    """Two DMAs into overlapping columns of one HBM output, with no wait between them."""

    def view(buf: int, offset: int) -> dict:
        return {
            "buf": buf,
            "offset": {"const": offset, "terms": []},
            "shape": [4, 48],
            "strides": [144 if buf == 1 else 48, 1],
        }

    def buffer(i: int, kind: str, shape: list[int]) -> dict:
        return {
            "id": i,
            "name": f"b{i}",
            "space": "hbm",
            "kind": kind,
            "dtype": "f32",
            "shape": shape,
        }

    return json.dumps(
        {
            "format": "torchneuron-kernel-program",
            "version": 1,
            "name": "racing",
            "target": "trn2",
            "sync": "explicit",
            "buffers": [buffer(0, "input", [4, 48]), buffer(1, "output", [4, 144])],
            "inputs": [0],
            "outputs": [1],
            "locations": [],
            "body": [
                {"op": "dma_copy", "engine": "sync", "src": view(0, 0), "dst": view(1, 0)},
                {"op": "dma_copy", "engine": "sync", "src": view(0, 0), "dst": view(1, 40)},
            ],
        }
    )


@pytest.mark.parametrize("check", ["1", "0"])
def test_check_flag_verifies_each_compiled_kernel(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    """With TORCHNEURON_CHECK=1 a kernel that lacks a wait is refused as soon as it is
    compiled, with the graph saved for a repro; without it, only a profile would notice."""

    class RacingCompiler:
        CompileError = real_native.CompileError
        DeviceError = real_native.DeviceError

        def compile_graph(self, text: str, target: str, stages: str) -> object:
            return real_native.load_program(_racing_program(), target)

    monkeypatch.setenv(config.CHECK_ENV, check)
    monkeypatch.setattr(backend, "native", RacingCompiler)
    doc = {"name": "racing_graph", "nodes": []}
    if check == "1":
        with pytest.raises(real_native.DeviceError, match="missing synchronisation") as e:
            backend._compile_document(doc, "trn2", None)
        assert "the graph is saved in" in str(e.value)
    else:
        kernel = backend._compile_document(doc, "trn2", None)
        with pytest.raises(real_native.DeviceError, match="missing synchronisation"):
            kernel.timeline()


def test_the_suite_runs_with_the_check() -> None:
    assert config.check()
