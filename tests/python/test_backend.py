"""The backend end to end on the built extension ``torchneuron._C`` (the real importer, compiler
and engine-model runtime): stats, fallback, targets, symbolic shapes, compile errors, training
graphs, default backend.

Nothing stands in for the device. The ops that fall back are ops the importer really has no
lowering for (``aten.special_airy_ai``, ``aten.special_laguerre_polynomial_l``,
``aten.nonzero``, ...; see ``handlers()`` in compiler/importer/FxImporter.cpp). Where a test
needs a failure the compiler does not produce on demand, it injects that failure into one call
of the real module with ``monkeypatch`` and says so; spies on ``_C.compile_graph`` record what
the compiler received and call through to it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from graph_capture import CompileCall

import torchneuron
from torchneuron import backend, config
from torchneuron.backend import neuron_backend

# fp32 accumulation on the device, in a different order than the eager CPU kernels.
F32 = {"atol": 1e-4, "rtol": 1e-4}


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = x @ w1
    h = F.gelu(h)
    return torch.tanh(h @ w2)


def mlp_with_airy(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = x @ w1
    h = torch.special.airy_ai(h)  # the importer has no lowering for aten.special_airy_ai
    return torch.tanh(h @ w2)


MLP_ARGS = (torch.randn(4, 8), torch.randn(8, 16), torch.randn(16, 8))
AIRY_LINE = f"{__file__}:{mlp_with_airy.__code__.co_firstlineno + 2}"


@pytest.fixture(autouse=True)
def _no_backend_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests set the backend's environment variables themselves."""
    for name in (config.TARGET_ENV, config.VERBOSE_ENV, config.DUMP_ENV):
        monkeypatch.delenv(name, raising=False)


def test_stats_count_compiles_and_runs(compile_calls: list[CompileCall]) -> None:
    compiled = torch.compile(mlp, backend=neuron_backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*MLP_ARGS), mlp(*MLP_ARGS), **F32)
        compiled(*MLP_ARGS)
    s = torchneuron.stats()
    assert s["graphs_compiled"] == 1 and len(compile_calls) == 1
    assert s["ops_on_device"] == len(compile_calls[0].document["nodes"]) > 0
    assert s["ops_fallback"] == {} and s["recompiles"] == 0
    assert s["kernels_run"] == 2
    assert s["compile_seconds"] > 0.0


def test_stats_is_a_copy_and_reset_clears_it(real_native: ModuleType) -> None:
    with torch.no_grad():
        torch.compile(mlp_with_airy, backend=neuron_backend)(*MLP_ARGS)
    s = torchneuron.stats()
    s["ops_fallback"]["x"] = 1
    s["kernels_run"] = 99
    assert torchneuron.stats()["ops_fallback"] == {"aten.special_airy_ai.default": 1}
    assert torchneuron.stats()["kernels_run"] == 2
    torchneuron.reset_stats()
    assert torchneuron.stats() == {
        "graphs_compiled": 0,
        "ops_on_device": 0,
        "ops_fallback": {},
        "kernels_run": 0,
        "recompiles": 0,
        "launch_reads": 0,
        "compile_seconds": 0.0,
        "cache_hits": 0,
        "cache_misses": 0,
    }


def test_unsupported_op_falls_back_and_is_reported(
    compile_calls: list[CompileCall],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TORCHNEURON_VERBOSE", "1")
    with torch.no_grad():
        out = torch.compile(mlp_with_airy, backend=neuron_backend)(*MLP_ARGS)
    torch.testing.assert_close(out, mlp_with_airy(*MLP_ARGS), **F32)
    s = torchneuron.stats()
    assert s["ops_fallback"] == {"aten.special_airy_ai.default": 1}
    # The graph splits around the Airy function: x @ w1 before it, tanh(h @ w2) after it.
    assert s["graphs_compiled"] == 2 and s["kernels_run"] == 2
    regions = sorted(sorted({n["target"] for n in c.document["nodes"]}) for c in compile_calls)
    assert regions == [["aten.mm.default"], ["aten.mm.default", "aten.tanh.default"]]
    err = capsys.readouterr().err
    assert "1 op(s) run in eager PyTorch" in err
    assert "aten.special_airy_ai.default" in err and "no lowering" in err  # the importer's reason
    assert AIRY_LINE in err


def test_recompiles_for_new_sizes_are_counted_and_say_why(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHNEURON_VERBOSE", "1")
    w = torch.randn(8)
    # A sum over rows known at run time is not size-generic yet: specialized per size.
    f = torch.compile(lambda x: torch.relu(x).sum(0) * w, backend="neuron")
    for rows in (4, 5, 6, 5):  # the second size makes the graph symbolic; 5 is compiled once
        x = torch.randn(rows, 8)
        torch.testing.assert_close(f(x), torch.relu(x).sum(0) * w, **F32)
    assert torchneuron.stats()["recompiles"] == 1
    err = capsys.readouterr().err
    assert "compiling a graph again, for this call's" in err
    assert "[6, 8] (was [5, 8])" in err


def test_elementwise_graph_over_any_rows_compiles_once(real_native: ModuleType) -> None:
    f = torch.compile(lambda x: torch.relu(x) * 2, backend="neuron")
    for rows in (4, 5, 6, 300, 5):  # the second size makes the graph symbolic
        x = torch.randn(rows, 8)
        torch.testing.assert_close(f(x), torch.relu(x) * 2)
    # The static first graph, then one size-generic program for every other size.
    assert torchneuron.stats()["recompiles"] == 0


def test_fallback_report_goes_to_logging_at_info(
    real_native: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    def ranked(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.special.airy_ai(x @ w))

    w = torch.randn(8, 5)
    with caplog.at_level(logging.INFO, logger="torchneuron"), torch.no_grad():
        out = torch.compile(ranked, backend=neuron_backend)(MLP_ARGS[0], w)
    torch.testing.assert_close(out, ranked(MLP_ARGS[0], w), **F32)
    assert torchneuron.stats()["ops_fallback"] == {"aten.special_airy_ai.default": 1}
    (record,) = [r for r in caplog.records if r.name == "torchneuron"]
    assert record.levelno == logging.INFO
    assert "aten.special_airy_ai.default" in record.getMessage()
    assert f"{__file__}:{ranked.__code__.co_firstlineno + 1}" in record.getMessage()


def test_everything_unsupported_still_runs(compile_calls: list[CompileCall]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.special.airy_ai(torch.special.airy_ai(x))
        return torch.special.laguerre_polynomial_l(y, y)

    x = torch.randn(5, 6)
    with torch.no_grad():
        out = torch.compile(f, backend=neuron_backend)(x)
    torch.testing.assert_close(out, f(x))
    s = torchneuron.stats()
    assert s["graphs_compiled"] == 0 and s["kernels_run"] == 0 and s["ops_on_device"] == 0
    assert s["ops_fallback"] == {
        "aten.special_airy_ai.default": 2,
        "aten.special_laguerre_polynomial_l.default": 1,
    }
    assert compile_calls == []


def _inject_compile_error(real_native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fault injection: ``_C.compile_graph`` raises the extension's own ``CompileError`` for one
    test (a simulated failure of that call; the device is not replaced). Returns the documents
    it was given."""
    received: list[str] = []

    def failing(document: str, *args: Any, **kwargs: Any) -> Any:
        received.append(document)
        raise real_native.CompileError("model.py:12: tile does not fit in SBUF")

    monkeypatch.setattr(real_native, "compile_graph", failing)
    return received


def _run_repro_command(message: str) -> None:
    """Runs the ``neuron-translate --import-fx <saved>`` command the error message gives."""
    match = re.search(r"`neuron-translate --import-fx (\S+)`", message)
    assert match, message
    saved = Path(match.group(1))
    assert saved.is_file()
    venv_bin = str(Path(sys.executable).parent)
    tool = shutil.which("neuron-translate", path=venv_bin) or shutil.which("neuron-translate")
    if tool is None:
        return  # the command-line tools are not installed
    result = subprocess.run(
        [tool, "--import-fx", str(saved)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert f"func.func @{saved.stem}(" in result.stdout


def test_compile_error_is_raised_not_swallowed(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_compile = real_native.compile_graph
    received = _inject_compile_error(real_native, monkeypatch)
    monkeypatch.setenv("TORCHNEURON_DUMP_DIR", str(tmp_path))
    with pytest.raises(Exception, match="tile does not fit in SBUF") as info, torch.no_grad():
        torch.compile(mlp, backend=neuron_backend)(*MLP_ARGS)
    message = str(info.value)
    assert "model.py:12" in message and "(target trn2)" in message
    assert isinstance(getattr(info.value, "inner_exception", None), real_native.CompileError)
    (dumped,) = tmp_path.glob("graph_*.json")
    assert f"neuron-translate --import-fx {dumped}" in message
    # The saved document is the one the compiler was given, and the real compiler takes it.
    assert json.loads(dumped.read_text()) == json.loads(received[0])
    assert real_compile(dumped.read_text(), "trn2").output_specs == [("float32", [4, 8])]
    _run_repro_command(message)


def test_compile_error_without_dump_dir_saves_the_document(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    received = _inject_compile_error(real_native, monkeypatch)
    with pytest.raises(Exception, match="tile does not fit in SBUF") as info, torch.no_grad():
        torch.compile(mlp, backend=neuron_backend)(*MLP_ARGS)
    match = re.search(r"the graph is saved in (\S+);", str(info.value))
    assert match, str(info.value)
    saved = Path(match.group(1))
    try:
        assert json.loads(saved.read_text()) == json.loads(received[0])
        _run_repro_command(str(info.value))
    finally:
        shutil.rmtree(saved.parent, ignore_errors=True)


def test_dump_dir_gets_every_document(
    compile_calls: list[CompileCall], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHNEURON_DUMP_DIR", str(tmp_path))
    with torch.no_grad():
        torch.compile(mlp_with_airy, backend=neuron_backend)(*MLP_ARGS)
    dumped = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert len(dumped) == len(compile_calls) == torchneuron.stats()["graphs_compiled"] == 2
    assert dumped == {c.document["name"]: c.document for c in compile_calls}


STAGE_FILES = [
    "00-import.mlir",
    "01-canonicalize.mlir",
    "02-fuse.mlir",
    "03-lower-to-nisa.mlir",
    "04-cleanup.mlir",
    "05-schedule.mlir",
    "06-program.json",
]


def test_dump_dir_gets_every_stage_of_every_graph(
    compile_calls: list[CompileCall], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README (Compiler engineers): TORCHNEURON_DUMP_DIR writes every stage of every graph,
    00-import.mlir ... 06-program.json, next to the graph's FX document."""
    monkeypatch.setenv("TORCHNEURON_DUMP_DIR", str(tmp_path))
    with torch.no_grad():
        torch.compile(mlp_with_airy, backend=neuron_backend)(*MLP_ARGS)
    names = sorted(c.document["name"] for c in compile_calls)
    assert len(names) == 2  # the Airy function splits the graph in two device regions
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*names, *(f"{n}.json" for n in names)]
    )
    for call in compile_calls:
        stages = tmp_path / call.document["name"]
        assert sorted(p.name for p in stages.iterdir()) == STAGE_FILES
        text = {name: (stages / name).read_text() for name in STAGE_FILES}
        # Each stage is the module after that stage: neuron ops, then nisa instructions.
        assert "neuron.matmul" in text["00-import.mlir"]
        assert "neuron.matmul" in text["02-fuse.mlir"] and "nisa.matmul" not in text["02-fuse.mlir"]
        assert "nisa.matmul" in text["03-lower-to-nisa.mlir"]
        assert "neuron.matmul" not in text["03-lower-to-nisa.mlir"]
        assert "nisa.address" in text["05-schedule.mlir"]
        assert "nisa.address" not in text["04-cleanup.mlir"]
        # The program is the one the kernel runs.
        program = json.loads(text["06-program.json"])
        assert program == json.loads(call.kernel.program_json)


def _flex_with_a_table_read_backwards() -> tuple[Any, tuple[torch.Tensor, ...]]:
    """A FlexAttention score_mod reading a captured table at ``c - q_idx - kv_idx``: backwards
    along both indices, which the FlexAttention lowering refuses (a compile error)."""
    from torch.nn.attention.flex_attention import flex_attention

    s = 64
    table = torch.randn(2 * s, generator=torch.Generator().manual_seed(0))

    def bias(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        return score + table[2 * s - 2 - q - kv]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flex_attention(q, k, v, score_mod=bias)

    g = torch.Generator().manual_seed(1)
    return attend, tuple(torch.randn(1, 1, s, 16, generator=g) for _ in range(3))


def test_failing_stage_prints_the_neuron_opt_command_that_reproduces_it(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README (Compiler engineers): a failing stage writes the module it failed on and prints
    the neuron-opt command that reproduces it. The failure is a real one: the FlexAttention
    lowering refuses a captured tensor read backwards along both q_idx and kv_idx."""
    monkeypatch.setenv("TORCHNEURON_DUMP_DIR", str(tmp_path))
    attend, args = _flex_with_a_table_read_backwards()
    with pytest.raises(Exception, match="backwards along both q_idx") as info, torch.no_grad():
        torch.compile(attend, backend=neuron_backend, fullgraph=True)(*args)
    message = str(info.value)
    match = re.search(
        r"stage 'lower-to-nisa' failed; reproduce with:\n"
        r"  neuron-opt (\S+) --pass-pipeline='([^']+)'",
        message,
    )
    assert match, message
    saved, pipeline = Path(match.group(1)), match.group(2)
    assert saved.parent.parent == tmp_path and saved.name == "failed-lower-to-nisa.mlir"
    assert pipeline == "builtin.module(neuron-lower-to-nisa{target=trn2})"
    assert "neuron.flex_attention" in saved.read_text()  # the module the stage was given
    tool = shutil.which("neuron-opt", path=str(Path(sys.executable).parent))
    assert tool, "neuron-opt is not installed next to the Python interpreter"
    result = subprocess.run(
        [tool, str(saved), f"--pass-pipeline={pipeline}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0, result.stdout
    assert "backwards along both q_idx and kv_idx" in result.stderr


def test_graph_the_importer_cannot_read_runs_eagerly(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHNEURON_DUMP_DIR", str(tmp_path))  # where a failed compile saves
    # The device holds no float64: check_graph rejects every node that reads such an input
    # ("depends on 'arg0_1', which stays on the host (dtype float64 ...)").
    args = [a.double() for a in MLP_ARGS]
    with torch.no_grad():
        out = torch.compile(mlp, backend=neuron_backend)(*args)
    torch.testing.assert_close(out, mlp(*args))
    s = torchneuron.stats()
    assert s["graphs_compiled"] == 0 and s["kernels_run"] == 0
    assert s["ops_fallback"] == {
        "aten.mm.default": 2,
        "aten.gelu.default": 1,
        "aten.tanh.default": 1,
    }


def test_symbolic_shapes_compile_once_per_size(compile_calls: list[CompileCall]) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.softmax(x @ w, dim=-1) * x.shape[0]

    w = torch.randn(8, 6)
    compiled = torch.compile(f, backend=neuron_backend, dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 3, 9, 5):
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x, w), f(x, w), **F32)
    s = torchneuron.stats()
    assert s["graphs_compiled"] == 3 and s["recompiles"] == 2 and s["kernels_run"] == 5
    assert s["ops_fallback"] == {}
    shapes = [[i["shape"] for i in c.document["inputs"]] for c in compile_calls]
    assert shapes == [[[3, 8], [8, 6]], [[5, 8], [8, 6]], [[9, 8], [8, 6]]]
    assert [c.kernel.output_specs for c in compile_calls] == [
        [("float32", [n, 6])] for n in (3, 5, 9)
    ]
    for call in compile_calls:
        assert not any("sym_size" in n["target"] for n in call.document["nodes"])


def test_a_float_argument_dynamo_stops_specializing_runs_on_the_device(
    real_native: ModuleType,
) -> None:
    # From the second value on, Dynamo passes the float as a 0-d float64 tensor input that
    # the graph converts to float32 (through float64): the kernel takes it as float32.
    def f(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.tanh(x * scale + 1.0)

    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(8, 16)
    for scale in (0.5, 0.25, 1.0 / 3.0):
        torch.testing.assert_close(compiled(x, scale), f(x, scale), **F32)
    s = torchneuron.stats()
    assert s["ops_fallback"] == {} and s["graphs_compiled"] == 2 and s["kernels_run"] == 3


def test_data_dependent_sizes_stay_eager(real_native: ModuleType) -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        nz = torch.nonzero(x > 0)
        return x.sin() * 2, nz.sum() + x.cos().sum()

    x = torch.randn(7)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
        out = torch.compile(f, backend=neuron_backend, fullgraph=True)(x)
    for got, want in zip(out, f(x), strict=True):
        torch.testing.assert_close(got, want, **F32)
    s = torchneuron.stats()
    assert s["ops_fallback"]["aten.nonzero.default"] == 1
    assert "aten.sin.default" not in s["ops_fallback"]
    assert "aten.cos.default" not in s["ops_fallback"]
    assert s["kernels_run"] > 0


def test_graph_that_cannot_be_specialized_runs_eagerly(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchneuron import specialize

    def fail(gm: torch.fx.GraphModule, args: object) -> torch.fx.GraphModule:
        raise RuntimeError("no\nmore")  # fault injection into the Python specializer

    monkeypatch.setattr(specialize, "specialize", fail)
    compiled = torch.compile(mlp, backend=neuron_backend, dynamic=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*MLP_ARGS), mlp(*MLP_ARGS))
    s = torchneuron.stats()
    assert s["kernels_run"] == 0 and s["graphs_compiled"] == 0
    assert s["ops_fallback"]["aten.gelu.default"] == 1


def test_shape_change_without_dynamic_recompiles_through_dynamo(real_native: ModuleType) -> None:
    compiled = torch.compile(mlp, backend=neuron_backend)
    with torch.no_grad():
        for n in (4, 6, 7):
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x, *MLP_ARGS[1:]), mlp(x, *MLP_ARGS[1:]), **F32)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert torchneuron.stats()["kernels_run"] == 3


def test_training_forward_and_backward(compile_calls: list[CompileCall]) -> None:
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def leaves() -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        shapes = ((2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16))
        return [torch.randn(s, generator=g).requires_grad_() for s in shapes]

    ours, ref = leaves(), leaves()
    loss = torch.compile(attention, backend=neuron_backend)(*ours).square().sum()
    forward = torchneuron.stats()
    assert forward["graphs_compiled"] == 1 and forward["kernels_run"] == 1
    loss.backward()
    attention(*ref).square().sum().backward()
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, **F32)
    s = torchneuron.stats()
    # The backward is a second graph, compiled and run on the device as a whole.
    assert s["graphs_compiled"] == 2 and s["kernels_run"] == 2
    assert s["ops_fallback"] == {} and s["ops_on_device"] > forward["ops_on_device"]
    targets = {n["target"] for c in compile_calls for n in c.document["nodes"]}
    assert not any("flash_attention" in t for t in targets)


def test_training_backward_runs_on_the_device(real_native: ModuleType) -> None:
    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)
            self.fc1 = torch.nn.Linear(8, 16)
            self.fc2 = torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            logits = self.fc2(F.gelu(self.fc1(self.norm(x))))
            return F.cross_entropy(logits, labels)

    torch.manual_seed(0)
    ours = Classifier()
    ref = Classifier()
    ref.load_state_dict(ours.state_dict())
    x, labels = torch.randn(6, 8), torch.tensor([0, 3, 1, 2, 3, 0])

    loss = torch.compile(ours, backend=neuron_backend)(x, labels)
    forward = torchneuron.stats()
    want = ref(x, labels)
    torch.testing.assert_close(loss, want, **F32)
    # cross_entropy picks the label's log-probability with aten.gather (a one-hot select).
    assert forward["ops_fallback"] == {}
    assert forward["graphs_compiled"] == forward["kernels_run"] == 1
    loss.backward()
    want.backward()
    for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert a.grad is not None, name
        torch.testing.assert_close(a.grad, b.grad, **F32, msg=name)
    s = torchneuron.stats()
    # Its gradient scatters into the one-hot gradient (aten.scatter.value, a select): the
    # whole backward (that, GELU, layer norm, matmuls) is one device graph.
    assert s["ops_fallback"] == {}
    assert s["graphs_compiled"] == s["kernels_run"] == 2
    assert s["ops_on_device"] > forward["ops_on_device"]


# LayerNorm as models write it, large enough (8 steps of 128 rows) that its engines alternate
# over steps and VectorE reads w and b from PSUM (issue #19); the rows are not a multiple of
# 128, so the last period has a short step. (rows, hidden, form)
LAYER_NORM_FORMS = {
    "affine-bf16": (1000, 4096, "affine"),
    "float32-upcast": (1000, 4096, "upcast"),
    "no-affine": (800, 4096, "plain"),
    "bert-768": (1000, 768, "bert"),
    "vit-1024": (900, 1024, "bert"),
    "float32": (800, 2048, "float32"),
}


@pytest.mark.parametrize("form", list(LAYER_NORM_FORMS))
def test_layer_norm_forms_match_eager(real_native: ModuleType, form: str) -> None:
    rows, hidden, kind = LAYER_NORM_FORMS[form]
    g = torch.Generator().manual_seed(0)
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    # A mean well away from 0, so that the variance is of x - mean.
    x = (torch.randn(rows, hidden, generator=g) * 2 + 3).to(dtype)
    w = (torch.randn(hidden, generator=g) * 0.5 + 1).to(dtype)
    b = torch.randn(hidden, generator=g).to(dtype)
    if kind == "plain":
        module = torch.nn.LayerNorm(hidden, elementwise_affine=False)
        fn: Any = module
    elif kind == "bert":
        module = torch.nn.LayerNorm(hidden, eps=1e-12).to(dtype)
        with torch.no_grad():
            module.weight.copy_(w)
            module.bias.copy_(b)
        fn = module
    elif kind == "upcast":

        def fn(x: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(x.float(), (hidden,), w.float(), b.float()).to(x.dtype)

    else:

        def fn(x: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(x, (hidden,), w, b)

    with torch.no_grad():
        got = torch.compile(fn, backend=neuron_backend)(x)
        eps = 1e-12 if kind == "bert" else 1e-5
        affine = () if kind == "plain" else (w.float(), b.float())
        want = F.layer_norm(x.float(), (hidden,), *affine, eps=eps).to(dtype)
    assert torchneuron.stats()["ops_fallback"] == {}
    assert torchneuron.stats()["kernels_run"] == 1
    tol = F32 if dtype == torch.float32 else {"atol": 1.6e-2, "rtol": 1.6e-2}
    torch.testing.assert_close(got, want, **tol)


def test_rank_sort_row_sum_stored_reshaped_matches_eager(real_native: ModuleType) -> None:
    """A fused group whose engines alternate over steps and whose output reshapes a row sum
    (the ranks of a [2, 300, 300] compare): the output is stored from the sum's tile, which the
    alternating periods once lost (they stored the reshape's own slot, never written, and the
    one-hot select after it gave -inf at 598 of 600 places)."""

    def values(x: torch.Tensor) -> torch.Tensor:  # decompositions.sort's rank sort, descending
        xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)
        nan_i, nan_j = torch.isnan(xi), torch.isnan(xj)
        ahead = (xj > xi) | (nan_j & ~nan_i)
        same = (xj == xi) | (nan_i & nan_j)
        place = torch.arange(x.shape[-1])
        earlier = place.unsqueeze(0) < place.unsqueeze(1)
        rank = (ahead | (same & earlier)).sum(-1)
        onehot = rank.unsqueeze(-2) == place.unsqueeze(-1)
        return torch.where(onehot, x.unsqueeze(-2), float("-inf")).amax(-1)

    x = torch.randn(2, 300, generator=torch.Generator().manual_seed(1))
    got = torch.compile(values, backend=neuron_backend)(x)
    assert torchneuron.stats()["ops_fallback"] == {}
    torch.testing.assert_close(got, values(x), rtol=0, atol=0)


def test_a_returned_reshape_is_computed_into_the_output(real_native: ModuleType) -> None:
    """A Linear on [B, L, K] returns its [B * L, N] product as [B, L, N] (and a router its
    top-k indices flattened): the kernel writes the product straight into that output, with
    no HBM-to-HBM copy of it after the GEMM."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 512, bias=False)
    x = torch.randn(2, 128, 256)
    with torch.no_grad(), torchneuron.profile() as prof:
        got = torch.compile(linear, backend=neuron_backend)(x)
        want = linear(x)
    torch.testing.assert_close(got, want, **F32)
    (run,) = prof._runs
    program = json.loads(run.kernel.program_json)
    hbm = {b["id"] for b in program["buffers"] if b["space"] == "hbm"}

    def copies(items: list[dict[str, Any]]) -> int:
        found = 0
        for item in items:
            if "op" not in item:
                found += copies(item["body"])
            elif item["op"] == "dma_copy":
                found += item["src"]["buf"] in hbm and item["dst"]["buf"] in hbm
        return found

    assert copies(program["body"]) == 0


@pytest.mark.parametrize(
    ("rows", "n", "k", "largest", "dtype"),
    [
        (2048, 8, 2, True, torch.bfloat16),  # a Mixtral router: 16 rows to a partition
        (300, 5, 5, False, torch.float32),  # a sort; 256 rows folded, 44 one to a partition
        (1100, 64, 8, True, torch.float32),  # eight to a partition, then 76 rows
    ],
)
def test_topk_of_short_rows_matches_eager(
    real_native: ModuleType, rows: int, n: int, k: int, largest: bool, dtype: torch.dtype
) -> None:
    """Short rows fold several to a partition (trees of tensor_tensor along each row, the
    round's extreme read back along it): values and positions as eager's, rows past the
    folded blocks included. Distinct values per row: eager's order among ties is its own."""
    g = torch.Generator().manual_seed(rows)
    x = (torch.rand(rows, n, generator=g).argsort(-1).to(dtype) - n / 2) * 0.25

    def top(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.topk(t, k, dim=-1, largest=largest)

    got = torch.compile(top, backend=neuron_backend)(x)
    assert torchneuron.stats()["ops_fallback"] == {}
    want = top(x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(("rows", "n"), [(300, 5), (40, 6)])  # folded, and one row a partition
def test_topk_treats_nan_as_the_largest_value(
    real_native: ModuleType, rows: int, n: int, largest: bool
) -> None:
    """As PyTorch: NaN comes before +inf from the largest and after it from the smallest, its
    value NaN and its position in the row (the rounds compare with ==, which NaN never
    passes: they took it as +inf, with its column number moved past the others'). Equal
    picks (NaNs among themselves) may come in another order than eager's."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(rows, n, generator=g)
    nan, inf = float("nan"), float("inf")
    x[3, 1] = x[3, 3] = nan
    x[3, 0] = inf
    x[7, 2], x[7, 4] = nan, -inf
    x[9] = nan
    x[-1, 0] = nan

    def top(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.topk(t, 3, dim=-1, largest=largest)

    values, indices = torch.compile(top, backend=neuron_backend)(x)
    want, _ = top(x)
    torch.testing.assert_close(values, want, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(x.gather(-1, indices), values, rtol=0, atol=0, equal_nan=True)
    assert all(len(set(r)) == 3 for r in indices.tolist())


def test_target_selection(real_native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    assert config.available_targets() == list(real_native.targets()) == ["trn2", "trn3"]
    assert config.resolve_target(None) == "trn2"
    assert config.resolve_target({"target": "trn3"}) == "trn3"
    monkeypatch.setenv("TORCHNEURON_TARGET", "trn3")
    assert config.resolve_target({}) == "trn3"
    assert config.resolve_target({"target": "trn2"}) == "trn2"  # options win over env
    monkeypatch.setenv("TORCHNEURON_TARGET", "trn9")
    with pytest.raises(ValueError, match=r"'trn9' \(from TORCHNEURON_TARGET\).*trn2, trn3"):
        config.resolve_target(None)
    with pytest.raises(ValueError, match=r"unknown torchneuron target 'inf2'.*trn2, trn3"):
        config.resolve_target({"target": "inf2"})


def test_target_reaches_the_compiler(
    compile_calls: list[CompileCall], monkeypatch: pytest.MonkeyPatch
) -> None:
    with torch.no_grad():
        out = torch.compile(mlp, backend=neuron_backend, options={"target": "trn3"})(*MLP_ARGS)
        torch.testing.assert_close(out, mlp(*MLP_ARGS), **F32)
        torch._dynamo.reset()
        torch.compile(mlp, backend=neuron_backend)(*MLP_ARGS)
        torch._dynamo.reset()
        backend.clear_kernel_cache()  # the first trn3 kernel would be reused
        monkeypatch.setenv("TORCHNEURON_TARGET", "trn3")
        torch.compile(mlp, backend=neuron_backend)(*MLP_ARGS)
    assert [c.target for c in compile_calls] == ["trn3", "trn2", "trn3"]
    assert [c.kernel.target for c in compile_calls] == ["trn3", "trn2", "trn3"]
    assert torchneuron.stats()["kernels_run"] == 3


def test_a_graph_compiled_again_reuses_its_kernel(compile_calls: list[CompileCall]) -> None:
    """A second torch.compile of the same graph for the same target (here after a Dynamo reset)
    runs the kernel compiled first, while that one is alive; another target compiles anew."""
    with torch.no_grad():
        first = torch.compile(mlp, backend=neuron_backend)
        first(*MLP_ARGS)
        torch._dynamo.reset()
        out = torch.compile(mlp, backend=neuron_backend)(*MLP_ARGS)
        torch.testing.assert_close(out, mlp(*MLP_ARGS), **F32)
        torch._dynamo.reset()
        torch.compile(mlp, backend=neuron_backend, options={"target": "trn3"})(*MLP_ARGS)
    assert [c.target for c in compile_calls] == ["trn2", "trn3"]
    assert torchneuron.stats()["graphs_compiled"] == 2
    assert torchneuron.stats()["kernels_run"] == 3
    del first


def test_unknown_target_fails_the_compile(compile_calls: list[CompileCall]) -> None:
    with pytest.raises(Exception, match="valid targets: trn2, trn3"):
        torch.compile(mlp, backend=neuron_backend, options={"target": "trn1"})(*MLP_ARGS)
    assert compile_calls == []


def test_mode_is_accepted_and_unknown_options_warn(real_native: ModuleType) -> None:
    with torch.no_grad():
        out = torch.compile(mlp, backend=neuron_backend, mode="max-autotune")(*MLP_ARGS)
        torch.testing.assert_close(out, mlp(*MLP_ARGS), **F32)
        torch._dynamo.reset()
        options = {"triton.cudagraphs": True}
        with pytest.warns(UserWarning, match="unknown options"):
            out = torch.compile(mlp, backend=neuron_backend, options=options)(*MLP_ARGS)
        torch.testing.assert_close(out, mlp(*MLP_ARGS), **F32)
    assert torchneuron.stats()["kernels_run"] == 2


def test_backend_name_resolves_to_neuron_backend() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("neuron") is neuron_backend
    assert torchneuron.neuron_backend is neuron_backend


def test_entry_point_is_declared() -> None:
    import importlib.metadata as md

    md.distribution("torchneuron")  # installed by scripts/setup.sh (pip install -e .)
    (entry,) = md.entry_points(group="torch_dynamo_backends", name="neuron")
    assert entry.value == "torchneuron.backend:neuron_backend"


def test_backend_works_without_importing_torchneuron() -> None:
    # A fresh interpreter that never imports torchneuron itself: the entry point does.
    code = (
        "import sys, torch\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))\n"
        "x = torch.randn(5, 8)\n"
        "with torch.no_grad():\n"
        "    out = torch.compile(m, backend='neuron')(x)\n"
        "    torch.testing.assert_close(out, m(x), atol=1e-4, rtol=1e-4)\n"
        "assert 'torchneuron' in sys.modules, 'the entry point did not load the backend'\n"
        "import torchneuron\n"
        "s = torchneuron.stats()\n"
        "assert s['kernels_run'] == 1 and s['ops_fallback'] == {}, s\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_set_default_backend() -> None:
    calls: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        calls.append(1)
        return gm.forward

    previous = torch.compiler.get_default_backend()
    try:
        torchneuron.set_default_backend(counting_backend)
        assert torch.compiler.get_default_backend() is counting_backend
        torch.compile(lambda x: x + 1)(torch.randn(3))
        assert calls == [1]
        torchneuron.set_default_backend(None)
        assert torch.compiler.get_default_backend() == "inductor"
        torchneuron.set_default_backend()
        assert torch.compiler.get_default_backend() == "neuron"
    finally:
        torch.compiler.set_default_backend(previous)


def test_set_default_backend_without_torch_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.compiler, "set_default_backend")
    defaults = torch.compile.__kwdefaults__
    assert defaults is not None
    monkeypatch.setitem(defaults, "backend", defaults["backend"])  # restored afterwards
    torchneuron.set_default_backend("neuron")
    assert defaults["backend"] == "neuron"
    torchneuron.set_default_backend(None)
    assert defaults["backend"] == "inductor"


def test_import_has_no_side_effects() -> None:
    code = (
        "import sys, torchneuron\n"
        "assert 'torch._dynamo' not in sys.modules, 'dynamo imported'\n"
        "assert 'torchneuron._C' not in sys.modules, 'extension imported'\n"
        "import torch\n"
        "assert torch.compiler.get_default_backend() == 'inductor'\n"
    )
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


def test_a_value_returned_twice_is_written_once(compile_calls: list[CompileCall]) -> None:
    # exp saves its result for the backward: aot_autograd's forward graph returns that tensor
    # both as the output and as a saved value. The kernel writes it into one buffer and the
    # graph returns it in both places.
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x * 0.5)

    x = torch.randn(8, 16)
    leaf = x.clone().requires_grad_()
    out = torch.compile(fn, backend=neuron_backend)(leaf)
    out.sum().backward()
    torch.testing.assert_close(out, fn(x), **F32)
    assert leaf.grad is not None
    torch.testing.assert_close(leaf.grad, 0.5 * fn(x), **F32)
    forward = compile_calls[0].document
    assert len(forward["outputs"]) == 1, forward["outputs"]


def _modeled(fn: Any, *args: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """fn compiled and run once: its result, modeled device time and HBM bytes."""
    torch._dynamo.reset()
    with torchneuron.profile() as prof:
        out = torch.compile(fn, backend="neuron")(*args)
    return out, prof.total_device_ns, sum(k["hbm_bytes"] for k in prof.kernels)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((130, 257), torch.float32),
        ((3, 129, 64), torch.bfloat16),
        ((2, 200, 300), torch.float32),
        ((2, 3136, 96), torch.bfloat16),
    ],
    ids=["f32-odd", "bf16-batched", "f32-batched", "bf16-narrow-rows"],
)
def test_a_transpose_made_contiguous_goes_through_sbuf(
    shape: tuple[int, ...], dtype: torch.dtype, real_native: ModuleType
) -> None:
    # One HBM-to-HBM DMA would move it one element per descriptor (1024x1024 bf16: 1973 us);
    # through SBUF by transposing DMAs it costs about what a contiguous copy does. The tiles
    # rotate over buffers (one buffer serialized loads and stores), a partition stores a run of
    # whole rows ([2, 3136, 96] stored 192-byte runs: 2.0x a copy, now 0.6x), and the result,
    # made contiguous in its output, is not copied onto itself (2x the bytes).
    x = torch.randn(shape).to(dtype)
    transposed, transpose_ns, moved = _modeled(lambda t: t.transpose(-1, -2).contiguous(), x)
    assert torch.equal(transposed, x.transpose(-1, -2).contiguous())
    _, copy_ns, _ = _modeled(lambda t: t + 0, x)
    assert transpose_ns < 1.3 * copy_ns, (transpose_ns, copy_ns)
    assert moved <= 1.01 * 2 * x.numel() * x.element_size(), moved / x.numel()
    assert torchneuron.stats()["ops_fallback"] == {}


def test_a_permute_of_dims_that_merge_goes_through_sbuf(real_native: ModuleType) -> None:
    # NCHW -> NHWC (ConvNeXt's LayerNorm2d): H and W are one run of the input, so it is 8
    # transposes of [C, H * W], not 8 * 56 of [C, W] (those went HBM to HBM, an element per
    # descriptor: 387 ms for the LayerNorm2d of [8, 256, 56, 56]).
    x = torch.randn(8, 256, 56, 56, dtype=torch.bfloat16)
    out, permute_ns, _ = _modeled(lambda t: t.permute(0, 2, 3, 1).contiguous(), x)
    assert torch.equal(out, x.permute(0, 2, 3, 1).contiguous())
    back, back_ns, _ = _modeled(lambda t: t.permute(0, 3, 1, 2).contiguous(), out)
    assert torch.equal(back, x)
    _, copy_ns, _ = _modeled(lambda t: t + 0, x)
    assert permute_ns < 1.6 * copy_ns and back_ns < 1.6 * copy_ns, (permute_ns, back_ns, copy_ns)


def _patchify(x: torch.Tensor) -> torch.Tensor:  # MAE's, and einops' ViT patches
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // 16, 16, w // 16, 16)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(n, h * w // 256, 256 * c)


def _unpatchify(x: torch.Tensor) -> torch.Tensor:  # DiT's
    n, t, d = x.shape
    x = x.reshape(n, 16, 16, 2, 2, d // 4)
    return torch.einsum("nhwpqc->nchpwq", x).reshape(n, d // 4, 32, 32)


@pytest.mark.parametrize(
    ("fn", "shape", "most"),
    [
        (lambda t: F.pixel_shuffle(t, 2), (2, 64, 64, 64), 1.5),
        (lambda t: F.pixel_unshuffle(t, 2), (2, 16, 128, 128), 1.5),
        (_patchify, (8, 3, 224, 224), 1.5),
        (_unpatchify, (8, 256, 16), 1.5),
        (lambda t: t.reshape(4, 512, 16, 64).transpose(1, 2).contiguous(), (4, 512, 1024), 4),
    ],
    ids=["pixel_shuffle", "pixel_unshuffle", "patchify", "unpatchify", "heads"],
)
def test_a_permute_with_a_strided_innermost_dim_goes_through_sbuf(
    fn: Callable[[torch.Tensor], torch.Tensor],
    shape: tuple[int, ...],
    most: float,
    real_native: ModuleType,
) -> None:
    # The output's innermost dim strided in the input: transposeThroughSbuf took the
    # [..., R, C] matrices one by one (a pixel shuffle's [16, 2]: 6.2 ms for [2, 64, 64, 64]
    # bf16, now 10.3 us), one HBM-to-HBM DMA an element a descriptor (MAE's patchify of [8, 3,
    # 224, 224]: 41.4 ms, now 22.9 us; DiT's unpatchify 861.9 -> 4.9 us). Each partition
    # gathers whole output rows by a transposing load and stores them as one run. The heads'
    # transpose moves 128-byte runs; its HBM-to-HBM copy went to one DMA engine (its leading
    # dim, 4 batches, the engines' share): 1151.4 -> 73.2 us.
    x = torch.randn(shape, dtype=torch.bfloat16)
    out, ns, moved = _modeled(fn, x)
    assert torch.equal(out, fn(x))
    _, copy_ns, _ = _modeled(lambda t: t + 0, x)
    assert ns < most * copy_ns, (ns, copy_ns)
    assert moved <= 1.01 * 2 * x.numel() * x.element_size(), moved / x.numel()


@pytest.mark.parametrize(
    ("fn", "shape", "dtype", "most"),
    [
        (lambda t: F.pad(t, (1, 1)), (8, 64, 56, 56), torch.bfloat16, 1.5),
        (lambda t: F.pad(t, (1, 1, 1, 1)), (8, 512, 7, 7), torch.bfloat16, 3.0),
        (lambda t: F.pad(t, (0, 3), value=-2.5), (4096, 29), torch.float32, 1.5),
        # Rows of a window and of a computed tensor, and planes (dim -2): values only.
        (lambda t: torch.cat([t[..., 1:], t[..., :1] * 2], -1), (256, 64, 40), torch.float16, None),
        (lambda t: torch.cat([t, t * 3, t[:, :2]], -2), (1024, 3, 20), torch.float32, None),
    ],
    ids=["pad-columns", "pad-small-planes", "pad-value-f32", "f16-window", "planes-dim1"],
)
def test_a_concat_of_short_rows_goes_through_sbuf(
    fn: Any,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    most: float | None,
    real_native: ModuleType,
) -> None:
    # Each input's part of an output row was a DMA descriptor of its own, a padding's zeros
    # two bytes each: F.pad(x, (1, 1)) of [8, 64, 56, 56] bf16 took 170.9 us, 6.4x a copy of
    # its result (now 30.5 us). A partition assembles whole rows in SBUF, stored in one run.
    x = torch.randn(shape, dtype=dtype)
    out, ns, _ = _modeled(fn, x)
    assert torch.equal(out, fn(x))
    assert torchneuron.stats()["ops_fallback"] == {}
    if most:
        _, copy_ns, _ = _modeled(lambda t: t + 0, fn(x))
        assert ns < most * copy_ns, (ns, copy_ns)


def test_a_concat_of_integers_copies_straight(real_native: ModuleType) -> None:
    # An engine copies through fp32: integers (and 8-byte elements) keep the DMA copies.
    x = torch.arange(4096 * 6, dtype=torch.int64).view(4096, 6) * (1 << 40)
    out, _, _ = _modeled(lambda t: F.pad(t, (1, 1), value=7), x)
    assert torch.equal(out, F.pad(x, (1, 1), value=7))


@pytest.mark.parametrize(
    ("shifts", "dims", "most"),
    [((-3, -3), (1, 2), 2.5), (5, None, 2.5), ((2, -60), (0, 3), 5)],
    ids=["swin", "flattened", "channels"],
)
def test_roll_copies_its_slices(
    shifts: Any, dims: Any, most: float, real_native: ModuleType
) -> None:
    # Swin's shifted windows: each rolled dim is its two slices concatenated (a copy each).
    # Core ATen's decomposition gathered by computed indices through a transposed copy per
    # dim: 390.3 us for [8, 56, 56, 96] bf16, 12x a copy; now 67.1 us. Rolled channels are
    # runs of 72 and 120 bytes (107.4 us for that dim alone, 135.8 before).
    x = torch.randn(8, 56, 56, 96, dtype=torch.bfloat16)
    fn = (
        (lambda t: torch.roll(t, shifts)) if dims is None else lambda t: torch.roll(t, shifts, dims)
    )
    out, ns, _ = _modeled(fn, x)
    assert torch.equal(out, fn(x))
    _, copy_ns, _ = _modeled(lambda t: t + 0, x)
    assert ns < most * copy_ns, (ns, copy_ns)
    assert torchneuron.stats()["ops_fallback"] == {}


def test_a_strided_slice_made_contiguous_goes_through_sbuf(real_native: ModuleType) -> None:
    # Every other element of every other row: each channel's rows span one stretch of the
    # input, loaded whole by one run a partition and picked on chip. One HBM-to-HBM DMA
    # moved an element per descriptor: the 3 x 3, stride 2 max-pool of ResNet's stem over
    # [8, 64, 112, 112] (nine such slices) took 27.8 ms modeled.
    x = torch.randn(8, 64, 112, 112, dtype=torch.bfloat16)
    out, slice_ns, _ = _modeled(lambda t: t[:, :, ::2, ::2].contiguous(), x)
    assert torch.equal(out, x[:, :, ::2, ::2].contiguous())
    pool = torch.nn.MaxPool2d(3, 2, 1)
    pooled, pool_ns, _ = _modeled(pool, x)
    assert torch.equal(pooled, pool(x))
    _, copy_ns, _ = _modeled(lambda t: t + 0, x)
    assert slice_ns < 3 * copy_ns, (slice_ns, copy_ns)
    assert pool_ns < 20 * copy_ns, (pool_ns, copy_ns)
    # Partitions over a broadcast dim read the same stretch each; one run of rows (the outer
    # dims merged into it) splits into equal shares.
    v = torch.randn(64, 200)
    for fn in (
        lambda t: t[None].expand(3, 64, 200)[..., ::2].contiguous(),
        lambda t: t[:, 1::3].contiguous(),
    ):
        out, _, _ = _modeled(fn, v)
        assert torch.equal(out, fn(v))


@pytest.mark.parametrize(
    ("build", "shape"),
    [
        (lambda v: v[:, None].expand(32, 50000), (32,)),  # a row's value along the row
        (lambda v: v.view(1, 3, 1, 1).expand(16, 3, 224, 224), (3,)),  # channels over images
        (lambda v: v[None, :, None].expand(4, 200, 300), (200,)),
        (lambda v: v.expand(2, 3, 1000), ()),  # one value everywhere
    ],
    ids=["rows", "channels", "interior", "scalar"],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64])
def test_a_broadcast_made_contiguous_goes_through_sbuf(
    build: Callable[[torch.Tensor], torch.Tensor],
    shape: tuple[int, ...],
    dtype: torch.dtype,
    real_native: ModuleType,
) -> None:
    # Expanded on chip once per 128 values and stored to every place that repeats them: one
    # HBM-to-HBM DMA with a zero stride innermost wrote an element per descriptor (a [32, 1]
    # max expanded over 128256 columns: ~30 ms).
    v = (torch.randn(shape) * 100).to(dtype)
    out, expand_ns, _ = _modeled(lambda t: build(t).contiguous(), v)
    want = build(v).contiguous()
    assert torch.equal(out, want)
    _, copy_ns, _ = _modeled(lambda t: t + 0, want)
    assert expand_ns < 2 * copy_ns, (expand_ns, copy_ns)


@pytest.mark.parametrize(
    ("fn", "shape"),
    [
        (lambda t: t.repeat_interleave(2, dim=-1), (4096, 64)),  # GPT-J's rotary sin/cos
        (  # nearest upsampling written as an expand
            lambda t: (
                t[:, :, :, None, :, None].expand(2, 320, 32, 2, 32, 2).reshape(2, 320, 64, 64)
            ),
            (2, 320, 32, 32),
        ),
    ],
    ids=["repeat-interleave", "nearest"],
)
def test_short_repeats_expand_whole_rows_on_chip(
    fn: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...], real_native: ModuleType
) -> None:
    # Values repeated in runs of a few elements: each partition loads whole rows, VectorE
    # expands them, rows are stored whole. Giving each value a partition and storing runs of
    # two elements took 3.6 ms for repeat_interleave(2) of [4096, 64] (9.4 us now), 50.8 ms
    # for the nearest 2x upsampling of [2, 320, 32, 32].
    x = torch.randn(shape, dtype=torch.bfloat16)
    out, ns, _ = _modeled(lambda t: fn(t).contiguous(), x)
    want = fn(x).contiguous()
    assert torch.equal(out, want)
    _, copy_ns, _ = _modeled(lambda t: t + 0, want)
    assert ns < 2 * copy_ns, (ns, copy_ns)


class _Normalize(torch.nn.Module):
    """torchvision's transforms.Normalize on a batch: per-channel mean and std."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean[None, :, None, None]) / self.std[None, :, None, None]


def test_group_norm_over_long_groups_matches_eager(real_native: ModuleType) -> None:
    # Groups of 160 channels x 64 x 64, more than the device's group norm takes (128
    # channels a group): PyTorch's decomposition. Its mean-subtracting group also stores the
    # per-group mean (a row value): such a group must not fold its rows (a folded plan stored
    # Stable Diffusion's 64 means, 32 groups of 10 channels, as 64 x 8 rows, past the
    # buffer: a DeviceError).
    torch.manual_seed(0)
    norm = torch.nn.GroupNorm(2, 320).to(torch.bfloat16)
    x = torch.randn(2, 320, 64, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out, _, _ = _modeled(norm, x)
        want = norm(x)
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (lambda: torch.nn.BatchNorm2d(256).eval(), (8, 256, 56, 56)),
        (
            lambda: torch.nn.Sequential(torch.nn.BatchNorm2d(64).eval(), torch.nn.ReLU()),
            (8, 64, 112, 112),  # rows of 12544 elements: folded into 4 rows each
        ),
        (_Normalize, (16, 3, 64, 64)),
    ],
    ids=["batchnorm", "batchnorm-relu", "normalize"],
)
def test_per_channel_values_broadcast_along_rows(
    make: Callable[[], torch.nn.Module], shape: tuple[int, ...], real_native: ModuleType
) -> None:
    # [C, 1, 1] over [N, C, H, W] expands interior dims: fusion tiled none of it and each
    # per-channel value was materialized as large as x (BatchNorm2d of [8, 256, 56, 56]:
    # 775 ms, 13x the bytes). Split into [N, C, 1, 1] and a broadcast along rows of H * W,
    # one group reads x once and writes the result once; rows too long for SBUF (ResNet's
    # stem, 112 x 112) fold into several rows each, the per-channel values repeating.
    torch.manual_seed(0)
    model = make()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-1, 1)
    model = model.to(torch.bfloat16)
    x = torch.randn(shape, dtype=torch.bfloat16)
    with torch.no_grad():
        out, ns, hbm = _modeled(model, x)
        want = model(x)
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=2e-2)
    assert hbm <= 1.05 * 2 * x.numel() * x.element_size(), hbm
    _, copy_ns, _ = _modeled(lambda t: t + 0, x)
    assert ns < 2.5 * copy_ns, (ns, copy_ns)


def test_norms_over_short_rows_move_batches_of_rows(real_native: ModuleType) -> None:
    # Qwen3's q/k norm: Llama's RMSNorm over each head's 128 values, [1, 1024, 32, 128] bf16.
    # A 128-row step moved 32 KB a DMA (256 bytes a partition), which the DMAs' fixed costs
    # bound (21.6% of the roofline at [1, 4096, 32, 128], with three [P, 1] ScalarE
    # instructions a step besides); batches of 8 steps move 2 KiB a partition a transfer
    # (46.7% there, now bound by ScalarE's two activations a step). Modeled, trn2.
    class RMSNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(128) * 0.1 + 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * h.to(x.dtype)

    norm = RMSNorm().to(torch.bfloat16)
    x = torch.randn(1, 1000, 32, 128, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad():
        got, ns, hbm = _modeled(norm, x)
        want = norm(x)
    torch.testing.assert_close(got, want, atol=1.6e-2, rtol=1.6e-2)
    minimum = 2 * x.numel() * x.element_size()
    assert hbm <= 1.02 * minimum, hbm / minimum
    roofline = 1e9 * minimum / real_native.target_peaks("trn2")["hbm_bytes"]
    assert roofline / ns >= 0.38, roofline / ns  # 42.7% now; a 128-row step a DMA: ~26%
