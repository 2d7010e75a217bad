"""The device's eager work in PyTorch's profilers (runtime/device/Profiler.cpp): a range
``neuron::<kernel>`` per eager kernel run and ``neuron::copy_*`` per copy, a device event of
the kernel's modeled duration per run when the PrivateUse1 activity is recorded (the Kineto
plugin), the legacy ``use_device="neuron"`` device times, and ``export_chrome_trace``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import torchneuron
from torchneuron import device as neuron_device
from torchneuron import eager

neuron_device.register()

pytestmark = pytest.mark.filterwarnings("ignore:neuron.*runs as a CPU fallback:UserWarning")


@pytest.fixture(autouse=True)
def kernels_on() -> Iterator[None]:
    eager.set_enabled(True)
    yield
    eager.set_enabled(True)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)
    a, b = a.to("neuron"), b.to("neuron")
    torch.relu(a @ b + a)  # compiled and cached before any profile
    return a, b


def _work(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b + a).cpu()


def _trace(prof: Any, tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events: list[dict[str, Any]] = json.loads(path.read_text())["traceEvents"]
    return events


def _modeled(ours: torchneuron.profile) -> dict[str, float]:
    """Kernel name -> modeled ns, as torchneuron.profile() recorded them."""
    return {f"neuron::{k['name']}": k["device_ns"] for k in ours.kernels}


def test_cpu_activity_shows_each_kernel_run_and_copy_with_its_modeled_time(
    tmp_path: Path,
) -> None:
    a, b = _inputs()
    with torchneuron.profile() as ours:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            host = torch.ones(8, 4)
            _work(a, b)
            host.to("neuron")
    modeled = _modeled(ours)
    assert len([n for n in modeled if "eager_" in n]) == 3  # mm, add, relu
    events = _trace(prof, tmp_path)
    ranges = [e for e in events if e.get("cat") == "cpu_op" and e["name"] in modeled]
    assert sorted(e["name"] for e in ranges) == sorted(modeled)
    for e in ranges:
        assert e["args"]["device_ns"] == pytest.approx(modeled[e["name"]])
        assert e["args"]["stream"] == 0
    copies = {e["name"]: e["args"]["bytes"] for e in events if "neuron::copy_" in e["name"]}
    assert copies == {
        "neuron::copy_device_to_host": 64 * 64 * 4,
        "neuron::copy_host_to_device": 8 * 4 * 4,
    }
    # A CPU-only profile asks for no device events.
    assert not [e for e in events if e.get("cat") == "kernel"]


def test_privateuse1_activity_puts_kernels_on_a_device_track(tmp_path: Path) -> None:
    a, b = _inputs()
    with torchneuron.profile() as ours:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            _work(a, b)
            _work(a, b)
    modeled = _modeled(ours)
    events = _trace(prof, tmp_path)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ranges = {
        e["args"]["External id"]: e
        for e in events
        if e.get("cat") == "cpu_op" and e["name"].startswith("neuron::eager_")
    }
    assert len(ranges) == 6
    copies = [k for k in kernels if k["name"] == "neuron::copy_device_to_host"]
    assert len(kernels) == 8 and len(copies) == 2  # the results' copies take device time too
    for k in kernels:
        # The event lasts the modeled time, on device 0's stream 0, linked to its range.
        assert k["dur"] == pytest.approx(modeled[k["name"]] / 1e3, abs=2e-3)
        assert k["args"]["device_ns"] == pytest.approx(modeled[k["name"]])
        assert (k["pid"], k["tid"]) == (0, 0)
        if k in copies:
            continue
        launch = ranges[k["args"]["External id"]]
        assert launch["name"] == k["name"]
        # Issued inside its range, then run; torch times ranges with its approximate clock
        # converted to wall time, the plugin reads wall time: allow that conversion's error.
        assert k["ts"] >= launch["ts"] - 0.5
    # One stream runs one kernel at a time.
    ordered = sorted(kernels, key=lambda e: e["ts"])
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert after["ts"] >= before["ts"] + before["dur"] - 1e-3
    names = {
        e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("pid") == 0 and e["name"] == "process_name"
    }
    assert names == {"neuron"}
    # key_averages counts each kernel's modeled time as its device time.
    averages = {e.key: e for e in prof.key_averages()}
    for name, ns in modeled.items():
        assert averages[name].self_device_time_total == pytest.approx(2 * ns / 1e3, abs=5e-3)


def test_default_activities_include_the_device_and_streams_get_their_own_tracks(
    tmp_path: Path,
) -> None:
    a, b = _inputs()
    side = torch.Stream(device="neuron")
    with profile() as prof:  # torch's default activities: CPU and PrivateUse1
        a + b
        with side:
            a + b
    kernels = [e for e in _trace(prof, tmp_path) if e.get("cat") == "kernel"]
    assert sorted(e["tid"] for e in kernels) == [0, side.stream_id]
    assert sorted(e["args"]["stream"] for e in kernels) == [0, side.stream_id]


def test_legacy_use_device_reports_the_modeled_time_of_each_op() -> None:
    a, b = _inputs()
    with torchneuron.profile() as ours:
        with torch.autograd.profiler.profile(use_device="neuron") as prof:
            _work(a, b)
    averages = {e.key: e for e in prof.key_averages()}
    for name, ns in _modeled(ours).items():
        # torch keeps these times in whole microseconds.
        assert averages[name].device_time_total == pytest.approx(ns / 1e3, abs=1.0)
        assert averages[name].device_time_total > 0


def test_profiled_eager_training_step_device_time_matches_torchneuron_profile(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    ).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16).to("neuron"), torch.randint(0, 4, (8,)).to("neuron")

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # compiles every kernel of the step
    with torchneuron.profile() as ours:
        with profile() as prof:
            step()
    kernels = [e for e in _trace(prof, tmp_path) if e.get("cat") == "kernel"]
    assert len(kernels) == len(ours.kernels) > 10
    total_us = sum(e["dur"] for e in kernels)
    assert total_us == pytest.approx(ours.total_device_ns / 1e3, rel=1e-3)
