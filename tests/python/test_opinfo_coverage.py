"""scripts/opinfo_coverage.py classifies OpInfo entries by where they run (a few, with --only)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "opinfo_coverage.py"


@pytest.fixture(scope="module")
def coverage() -> ModuleType:
    spec = importlib.util.spec_from_file_location("opinfo_coverage", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["opinfo_coverage"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_classifies_a_handful_of_ops(
    coverage: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "coverage.json"
    only = ["add", "flip", "linalg.svd", "allclose", "nn.functional.relu"]
    args = [a for name in only for a in ("--only", name)]
    assert coverage.main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    by_name = {r["name"]: r for r in report["results"]}
    assert by_name["add"]["cls"] == "on_device"
    assert by_name["nn.functional.relu"]["cls"] == "on_device"
    assert by_name["flip"]["cls"] == "on_device"  # a decomposition (gathers), no fallback
    # SVD stays eager on purpose: counted, named, and listed with its reason.
    svd = by_name["linalg.svd"]
    assert svd["cls"] == "partly_eager"
    assert "aten._linalg_svd.default" in svd["fallback"]
    assert svd["reasons"]["aten._linalg_svd.default"]  # why the importer refused it
    # allclose returns a Python bool: its graph holds no ATen op for the backend.
    assert by_name["allclose"]["cls"] == "not_reached"
    summary = report["summary"]
    assert summary["counts"]["on_device"] == 3 and summary["reached"] == 4
    assert summary["on_device_percent"] == 75.0
    assert [row[0] for row in summary["leftovers"]] == ["aten._linalg_svd.default"]
    printed = capsys.readouterr()
    assert "fully on the device 3 (75.0%)" in printed.out
    assert "aten._linalg_svd.default  [stays eager: a matrix factorization" in printed.out
    assert summary["partly_eager_by_design"] == 1  # SVD, documented
    assert "[5/5]" in printed.err  # progress goes to stderr


class _Entry:
    """An op_db-like entry: one float32 sample through ``fn``."""

    def __init__(self, name: str, fn: Any) -> None:
        self.name, self.variant_test_name, self.op = name, "", fn

    def supported_dtypes(self, device: str) -> set[torch.dtype]:
        return {torch.float32}

    def sample_inputs(self, device: str, dtype: torch.dtype, **kw: Any) -> Iterator[Any]:
        from torch.testing._internal.opinfo.core import SampleInput

        yield SampleInput(torch.linspace(-2, 2, 12, dtype=dtype).reshape(3, 4))


def test_a_wrong_answer_is_reported_as_wrong(coverage: ModuleType) -> None:
    def shifted(x: torch.Tensor) -> torch.Tensor:
        # compiled, the graph adds 1; eager does not: the report must say "wrong"
        return x.exp() + (1.0 if torch.compiler.is_compiling() else 0.0)

    result = coverage.run_op(_Entry("shifted_exp", shifted), torch.float32, timeout=60)
    assert result.cls == "wrong", result
    assert "not close" in result.detail
    right = coverage.run_op(_Entry("exp", torch.exp), torch.float32, timeout=60)
    assert right.cls == "on_device", right


def test_an_op_past_the_time_limit_is_a_crash(coverage: ModuleType) -> None:
    import time

    def slow(x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            time.sleep(5)  # traced once, while compiling
        return x + 1

    result = coverage.run_op(_Entry("slow", slow), torch.float32, timeout=1)
    assert result.cls == "crash", result
    assert "time limit" in result.detail


class _TwoSamples(_Entry):
    """Two samples: 12 float32 values, then 0-d ones."""

    def sample_inputs(self, device: str, dtype: torch.dtype, **kw: Any) -> Iterator[Any]:
        from torch.testing._internal.opinfo.core import SampleInput

        yield from super().sample_inputs(device, dtype, **kw)
        yield SampleInput(torch.tensor(3.0, dtype=dtype))


def test_every_sample_counts_and_the_table_says_so(coverage: ModuleType, tmp_path: Path) -> None:
    def wrong_on_0d(x: torch.Tensor) -> torch.Tensor:
        # compiled, a 0-d input gets 1 added: only the second sample is wrong
        shift = 1.0 if torch.compiler.is_compiling() and x.dim() == 0 else 0.0
        return x.exp() + shift

    entry = _TwoSamples("wrong_on_0d", wrong_on_0d)
    first = coverage.run_op(entry, torch.float32, timeout=60, samples=1)
    assert first.cls == "on_device", first
    every = coverage.run_op(entry, torch.float32, timeout=60, samples=0)
    assert every.cls == "wrong" and every.detail.startswith("sample 1:"), every
    table = coverage.table([first, every], "float32", 0)
    assert "| wrong_on_0d | on_device |  |" in table
    assert "| wrong_on_0d | wrong |  |" in table
    assert "every sample" in table


class _Accumulation(_Entry):
    """float16 values added into one place: eager rounds each partial sum to float16."""

    def supported_dtypes(self, device: str) -> set[torch.dtype]:
        return {torch.float16}

    def sample_inputs(self, device: str, dtype: torch.dtype, **kw: Any) -> Iterator[Any]:
        from torch.testing._internal.opinfo.core import SampleInput

        torch.manual_seed(0)
        values = torch.rand(200, dtype=dtype) + 1
        yield SampleInput(torch.zeros(1, dtype=dtype), args=(values,))


def test_a_16bit_result_closer_to_exact_than_eagers_is_not_wrong(coverage: ModuleType) -> None:
    def accumulate(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        index = torch.zeros(values.shape[0], dtype=torch.int64)
        return torch.index_put(x, (index,), values, accumulate=True)

    def off(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return accumulate(x, values) + (4.0 if torch.compiler.is_compiling() else 0.0)

    result = coverage.run_op(_Accumulation("accumulate", accumulate), torch.float16, timeout=60)
    assert result.cls == "on_device", result
    wrong = coverage.run_op(_Accumulation("off", off), torch.float16, timeout=60)
    assert wrong.cls == "wrong", wrong
