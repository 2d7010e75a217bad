"""The persistent compile cache (python/torchneuron/cache.py): a second compile of a graph
loads its program; bad entries (corrupt, truncated, foreign, tampered) are warned about,
removed and recompiled, never loaded; processes racing on one key compile it once; the folder
stays under its cap; the cache can be turned off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import torchneuron
from torchneuron import backend


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "cache"
    monkeypatch.setenv("TORCHNEURON_CACHE", "1")
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(folder))
    yield folder


def _model(width: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, width), torch.nn.GELU(), torch.nn.Linear(width, 4)
    )


def _compile_and_run(model: torch.nn.Module, **options: object) -> torch.Tensor:
    """A compile as a new process would do it: nothing in memory."""
    torch._dynamo.reset()
    backend.clear_kernel_cache()
    with torch.no_grad():
        return torch.compile(model, backend="neuron", options=options or None)(torch.ones(8, 16))


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json"))


def test_a_second_compile_loads_the_program(cache_dir: Path) -> None:
    model = _model()
    first = _compile_and_run(model)
    assert torchneuron.stats()["graphs_compiled"] == 1
    assert torchneuron.stats()["cache_misses"] == 1
    (entry,) = _entries(cache_dir)
    torchneuron.reset_stats()
    second = _compile_and_run(model)
    stats = torchneuron.stats()
    assert stats["graphs_compiled"] == 0 and stats["cache_hits"] == 1
    assert torch.equal(first, second)
    info = torchneuron.cache_info()
    assert info["directory"] == str(cache_dir) and info["entries"] == 1
    assert info["bytes"] == entry.stat().st_size and info["hits"] == 1
    torchneuron.clear_cache()
    assert _entries(cache_dir) == []


def _corrupt(entry: Path, how: str) -> None:
    raw = entry.read_text()
    data = json.loads(raw)
    if how == "garbage":
        entry.write_bytes(b"\x00\xffnot json")
    elif how == "truncated":
        entry.write_text(raw[: len(raw) // 2])
    elif how == "foreign":
        entry.write_text(json.dumps({**data, "key": "0" * 64}))
    elif how == "tampered":  # the checksum no longer matches
        entry.write_text(json.dumps({**data, "program": data["program"].replace("1", "2", 1)}))
    elif how == "invalid program":  # checksum fine, program refused by the verifier
        program = '{"format": "nonsense"}'
        entry.write_text(json.dumps({**data, "program": program, "sha256": _sha(program)}))


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("how", ["garbage", "truncated", "foreign", "tampered", "invalid program"])
def test_a_bad_entry_is_reported_and_recompiled_never_loaded(cache_dir: Path, how: str) -> None:
    model = _model()
    reference = _compile_and_run(model)
    (entry,) = _entries(cache_dir)
    _corrupt(entry, how)
    torchneuron.reset_stats()
    with pytest.warns(UserWarning, match="compile cache entry .* is unusable"):
        out = _compile_and_run(model)
    assert torch.equal(out, reference)
    stats = torchneuron.stats()
    assert stats["graphs_compiled"] == 1 and stats["cache_misses"] == 1
    # Stored anew, whole: the next compile loads it.
    torchneuron.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_and_run(model)
    assert torchneuron.stats()["cache_hits"] == 1


def test_processes_racing_on_one_key_compile_it_once(cache_dir: Path) -> None:
    code = (
        "import json, torch, torchneuron\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(\n"
        "    torch.nn.Linear(16, 48), torch.nn.GELU(), torch.nn.Linear(48, 4)\n"
        ")\n"
        "with torch.no_grad():\n"
        "    y = torch.compile(m, backend='neuron')(torch.ones(8, 16))\n"
        "print(json.dumps([torchneuron.stats()['graphs_compiled'], y.sum().item()]))\n"
    )
    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(cache_dir), "TORCHNEURON_CACHE": "1"}
    runs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    results = []
    for run in runs:
        out, _ = run.communicate(timeout=300)
        assert run.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(compiled for compiled, _ in results) == 1  # the others waited and loaded it
    assert len({value for _, value in results}) == 1
    assert len(_entries(cache_dir)) == 1
    assert not list(cache_dir.glob(".tmp-*"))  # no half-written entry left behind


def test_the_folder_stays_under_its_cap(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _compile_and_run(_model(32))
    size = _entries(cache_dir)[0].stat().st_size
    monkeypatch.setenv("TORCHNEURON_CACHE_MAX_MB", str(2.5 * size / (1 << 20)))
    _compile_and_run(_model(40))
    _compile_and_run(_model(48))
    entries = _entries(cache_dir)
    assert len(entries) == 2  # the least recently used one went
    assert sum(e.stat().st_size for e in entries) <= 2.5 * size
    torchneuron.reset_stats()
    _compile_and_run(_model(48))  # the newest is still there
    assert torchneuron.stats()["cache_hits"] == 1


def test_the_cache_can_be_turned_off(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _compile_and_run(_model(), cache=False)
    assert not cache_dir.exists()
    monkeypatch.setenv("TORCHNEURON_CACHE", "0")
    _compile_and_run(_model())
    assert not cache_dir.exists()
    assert torchneuron.cache_info()["directory"] is None


def test_an_unwritable_cache_only_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TORCHNEURON_CACHE", "1")
    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(UserWarning, match="cannot write the compile cache"):
        out = _compile_and_run(_model())
    assert out.shape == (8, 4) and torchneuron.stats()["graphs_compiled"] == 1


def test_eager_device_kernels_use_the_cache(cache_dir: Path) -> None:
    from torchneuron import eager

    x = torch.ones(8, 8, device="neuron")
    expected = torch.tanh(x).cpu()  # compiled and stored
    assert len(_entries(cache_dir)) == 1
    # A new process: nothing in memory, neither in the device library nor in the backend.
    eager.install()
    backend.clear_kernel_cache()
    torchneuron.reset_stats()
    assert torch.equal(torch.tanh(x).cpu(), expected)
    assert torchneuron.stats()["cache_hits"] == 1 and eager.counts()["runs"] == 1


def test_graphs_with_symbolic_sizes_use_the_cache(cache_dir: Path) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + 1).sum(-1)

    def run() -> list[torch.Tensor]:
        torch._dynamo.reset()
        backend.clear_kernel_cache()
        compiled = torch.compile(f, backend="neuron", dynamic=True)
        return [compiled(torch.ones(n, 8)) for n in (3, 5)]

    first = run()
    assert len(_entries(cache_dir)) == 2  # one program per size
    torchneuron.reset_stats()
    second = run()
    assert torchneuron.stats()["cache_hits"] == 2 and torchneuron.stats()["graphs_compiled"] == 0
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
