"""torchneuron.profile(): modeled device time per kernel run, its exports, and the range each
kernel run leaves in torch.profiler traces."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

import torchneuron


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 256)
        self.down = nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.up(x))  # the profile attributes instructions to this line
        return self.down(h)


def _profiled_runs(runs: int, target: str = "trn2") -> torchneuron.profile:
    model = Mlp().eval()
    compiled = torch.compile(model, backend="neuron", options={"target": target})
    x = torch.randn(128, 64)
    with torch.no_grad():
        compiled(x)  # compiled and run outside the profile: not recorded
        with torchneuron.profile() as prof:
            for _ in range(runs):
                compiled(x)
    return prof


def test_profile_records_each_kernel_run(real_native: ModuleType) -> None:
    prof = _profiled_runs(2)
    assert len(prof.kernels) == 2
    k = prof.kernels[0]
    assert k["device_ns"] > 0
    assert k["flops"] == 2 * 2 * 128 * 64 * 256  # two matmuls, 2 FLOPs per MAC
    assert k["hbm_bytes"] > 0
    assert set(k["engine_busy_ns"]) >= {"tensor", "vector", "scalar", "gpsimd", "dma"}
    assert k["bound"] in set(k["engine_busy_ns"]) | {"latency"}
    assert any(line.endswith(f"test_profile.py:{_gelu_line()}") for line in k["source_lines"])
    assert prof.total_device_ns == sum(k["device_ns"] for k in prof.kernels)
    # The program is static: the same kernel takes the same modeled time every run.
    assert prof.kernels[0]["device_ns"] == prof.kernels[1]["device_ns"]


def _gelu_line() -> int:
    source = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if "h = F.gelu(" in line)


def test_nothing_is_recorded_outside_a_profile(real_native: ModuleType) -> None:
    prof = _profiled_runs(0)
    assert prof.kernels == [] and prof.total_device_ns == 0


def test_summary_names_kernels_and_bounds(real_native: ModuleType) -> None:
    prof = _profiled_runs(1)
    text = prof.summary(file=io.StringIO())
    lines = text.splitlines()
    assert "TFLOP/s" in lines[0] and "bound" in lines[0]
    assert prof.kernels[0]["name"] in lines[1] and prof.kernels[0]["bound"] in lines[1]
    assert lines[-1].startswith("total modeled device time")


def test_chrome_trace_has_engine_tracks_and_source_lines(
    real_native: ModuleType, tmp_path: Path
) -> None:
    prof = _profiled_runs(1)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"tensor", "vector", "scalar", "gpsimd", "sync"} <= tracks
    assert any(t.startswith("dma") and t != "dma" for t in tracks)
    spans = [e for e in events if e["ph"] == "X" and e.get("tid", 0) != 0]
    assert {e["name"] for e in spans} >= {"matmul", "dma_copy", "activation"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert any(e["args"].get("source", "").endswith(f":{_gelu_line()}") for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    assert abs(end - prof.total_device_ns / 1e3) <= 1e-6 * max(1.0, end)


def test_parquet_tables(real_native: ModuleType, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    prof = _profiled_runs(2)
    kernels_path, instructions_path = prof.export_parquet(tmp_path)
    kernels = pq.read_table(kernels_path).to_pylist()
    assert [k["run"] for k in kernels] == [0, 1]
    assert kernels[0]["device_ns"] == prof.kernels[0]["device_ns"]
    assert kernels[0]["tensor_busy_ns"] == prof.kernels[0]["engine_busy_ns"]["tensor"]
    rows = pq.read_table(instructions_path).to_pylist()
    assert {r["run"] for r in rows} == {0, 1}
    matmuls = [r for r in rows if r["op"] == "matmul"]
    assert matmuls and all(r["unit"] == "tensor" for r in matmuls)
    assert max(r["end_ns"] for r in rows if r["run"] == 0) <= prof.kernels[0]["device_ns"] + 1e-6


def test_trn3_is_not_slower_than_trn2_on_this_kernel(real_native: ModuleType) -> None:
    trn2 = _profiled_runs(1, "trn2").total_device_ns
    trn3 = _profiled_runs(1, "trn3").total_device_ns
    assert 0 < trn3 <= trn2


def test_torch_profiler_shows_kernel_ranges(real_native: ModuleType) -> None:
    compiled = torch.compile(Mlp().eval(), backend="neuron")
    x = torch.randn(16, 64)
    with torch.no_grad():
        compiled(x)
        with torch.profiler.profile() as p:
            compiled(x)
    names = [e.key for e in p.key_averages()]
    assert any(n.startswith("neuron:graph_") for n in names), names


def test_torch_profiler_range_carries_the_modeled_device_time(
    real_native: ModuleType, tmp_path: Path
) -> None:
    """README (Profiling): under torch.profiler every compiled kernel run is a range
    ``neuron:<kernel>`` carrying the modeled device time: its one recorded input (torch records
    inputs with ``record_shapes=True``), in the event and in the exported trace."""
    compiled = torch.compile(Mlp().eval(), backend="neuron", options={"target": "trn3"})
    x = torch.randn(16, 64)
    with torch.no_grad():
        compiled(x)
        with torchneuron.profile() as prof, torch.profiler.profile(record_shapes=True) as p:
            compiled(x)
    (kernel,) = prof.kernels
    assert kernel["device_ns"] > 0
    ranges = [e for e in p.events() if e.name.startswith("neuron:graph_")]
    assert len(ranges) == 1, [e.name for e in p.events()]
    assert ranges[0].concrete_inputs == [kernel["device_ns"]]
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    (event,) = [
        e for e in json.loads(path.read_text())["traceEvents"] if e["name"] == ranges[0].name
    ]
    assert [float(v) for v in event["args"]["Concrete Inputs"]] == [kernel["device_ns"]]
