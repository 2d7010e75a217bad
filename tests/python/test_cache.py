"""The persistent compile cache (python/torchneuron/cache.py, graph_cache.py): a second compile
of a graph rebuilds it from its graph entry (a fresh process compiles nothing), or loads its
programs; bad entries of either level (corrupt, truncated, foreign, tampered) are warned about,
removed and recompiled, never loaded; another target misses; graphs that cannot be keyed take
the program-level path; processes racing on one key compile it once; the folder stays under its
cap; the cache can be turned off. And a long compile's progress on a terminal (progress.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    """Program entries."""
    return sorted(p for p in folder.glob("*.json") if not p.name.endswith(".graph.json"))


def _graph_entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.graph.json"))


def _drop_graph_entries(folder: Path) -> None:
    for entry in _graph_entries(folder):
        entry.unlink()


def test_a_second_compile_rebuilds_the_graph(cache_dir: Path) -> None:
    model = _model()
    first = _compile_and_run(model)
    stats = torchneuron.stats()
    assert stats["graphs_compiled"] == 1 and stats["cache_misses"] == 2  # graph, program
    assert torchneuron.cache_info()["graph_misses"] == 1
    (entry,) = _entries(cache_dir)
    (graph,) = _graph_entries(cache_dir)
    torchneuron.reset_stats()
    second = _compile_and_run(model)
    stats = torchneuron.stats()
    assert stats["graphs_compiled"] == 0 and stats["cache_hits"] == 1
    assert stats["cache_misses"] == 0 and stats["ops_on_device"] > 0
    assert torch.equal(first, second)
    info = torchneuron.cache_info()
    assert info["directory"] == str(cache_dir) and info["entries"] == 2
    assert info["graph_entries"] == 1 and info["graph_hits"] == 1 and info["hits"] == 1
    assert info["bytes"] == entry.stat().st_size + graph.stat().st_size
    torchneuron.clear_cache()
    assert _entries(cache_dir) == [] and _graph_entries(cache_dir) == []


def test_a_second_compile_loads_the_program(cache_dir: Path) -> None:
    model = _model()
    first = _compile_and_run(model)
    _drop_graph_entries(cache_dir)
    torchneuron.reset_stats()
    second = _compile_and_run(model)
    stats = torchneuron.stats()
    assert stats["graphs_compiled"] == 0 and stats["cache_hits"] == 1
    assert torchneuron.cache_info()["graph_misses"] == 1
    assert torch.equal(first, second)
    assert len(_graph_entries(cache_dir)) == 1  # stored again


# A model with an op the device does not run (an Airy function): its compiled graph has eager work
# between two device regions, which a graph entry must rebuild too.
FRESH_PROCESS = """
import json, torch, torchneuron
torch.manual_seed(0)
lin1, lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
def f(x):
    return lin2(torch.special.airy_ai(torch.nn.functional.gelu(lin1(x))))
x = torch.randn(8, 16)
with torch.no_grad():
    out = torch.compile(f, backend="neuron")(x)
    expected = f(x)
print(json.dumps({
    "stats": torchneuron.stats(),
    "info": torchneuron.cache_info(),
    "out": out.tolist(),
    "error": (out - expected).abs().max().item(),
}))
"""


def test_a_graph_hit_in_a_fresh_process_compiles_nothing(cache_dir: Path) -> None:
    env = {**os.environ, "TORCHNEURON_CACHE_DIR": str(cache_dir), "TORCHNEURON_CACHE": "1"}

    def fresh_process() -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-c", FRESH_PROCESS],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result

    first = fresh_process()
    assert first["stats"]["graphs_compiled"] == 2  # two regions around the eager Airy function
    assert first["stats"]["ops_fallback"] == {"aten.special_airy_ai.default": 1}
    second = fresh_process()
    stats, info = second["stats"], second["info"]
    assert stats["graphs_compiled"] == 0
    assert info["graph_hits"] == 1 and stats["cache_hits"] == 1  # no program lookups
    assert stats["cache_misses"] == 0
    assert stats["ops_fallback"] == {"aten.special_airy_ai.default": 1}  # reported as the first did
    assert stats["ops_on_device"] == first["stats"]["ops_on_device"]
    assert second["out"] == first["out"]
    assert second["error"] < 1e-4  # as eager PyTorch


def _corrupt(entry: Path, how: str, field: str = "program") -> None:
    raw = entry.read_text()
    data = json.loads(raw)
    if how == "garbage":
        entry.write_bytes(b"\x00\xffnot json")
    elif how == "truncated":
        entry.write_text(raw[: len(raw) // 2])
    elif how == "foreign":
        entry.write_text(json.dumps({**data, "key": "0" * 64}))
    elif how == "tampered":  # the checksum no longer matches
        entry.write_text(json.dumps({**data, field: data[field].replace("1", "2", 1)}))
    elif how == "invalid program":  # checksum fine, program refused by the verifier
        program = '{"format": "nonsense"}'
        if field == "graph":  # a whole plan whose region's program is refused
            plan = json.loads(data["graph"])
            for region in plan["regions"].values():
                region["program"] = program
            program = json.dumps(plan)
        entry.write_text(json.dumps({**data, field: program, "sha256": _sha(program)}))
    elif how == "invalid plan":  # checksum fine, a node that does not rebuild
        plan = json.loads(data["graph"])
        plan["nodes"][-1][0] = "call_method"
        text = json.dumps(plan)
        entry.write_text(json.dumps({**data, "graph": text, "sha256": _sha(text)}))


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("how", ["garbage", "truncated", "foreign", "tampered", "invalid program"])
def test_a_bad_entry_is_reported_and_recompiled_never_loaded(cache_dir: Path, how: str) -> None:
    model = _model()
    reference = _compile_and_run(model)
    _drop_graph_entries(cache_dir)  # this test is about program entries
    (entry,) = _entries(cache_dir)
    _corrupt(entry, how)
    torchneuron.reset_stats()
    with pytest.warns(UserWarning, match="compile cache entry .* is unusable"):
        out = _compile_and_run(model)
    assert torch.equal(out, reference)
    stats = torchneuron.stats()
    assert stats["graphs_compiled"] == 1 and stats["cache_misses"] == 2  # graph, program
    # Stored anew, whole: the next compile loads it.
    _drop_graph_entries(cache_dir)
    torchneuron.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_and_run(model)
    assert torchneuron.stats()["cache_hits"] == 1


@pytest.mark.parametrize(
    "how", ["garbage", "truncated", "foreign", "tampered", "invalid program", "invalid plan"]
)
def test_a_bad_graph_entry_is_reported_and_rebuilt_never_loaded(cache_dir: Path, how: str) -> None:
    model = _model()
    reference = _compile_and_run(model)
    (entry,) = _graph_entries(cache_dir)
    _corrupt(entry, how, "graph")
    torchneuron.reset_stats()
    with pytest.warns(UserWarning, match="compile cache entry .*graph.json is unusable"):
        out = _compile_and_run(model)
    assert torch.equal(out, reference)
    stats, info = torchneuron.stats(), torchneuron.cache_info()
    # Built again around the program entry, which is fine: nothing compiled.
    assert info["graph_misses"] == 1 and stats["cache_hits"] == 1
    assert stats["graphs_compiled"] == 0
    # Stored anew, whole: the next compile rebuilds from it, without a warning.
    torchneuron.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(_compile_and_run(model), reference)
    assert torchneuron.cache_info()["graph_hits"] == 1


def test_another_target_or_graph_misses(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    _compile_and_run(model)
    torchneuron.reset_stats()
    _compile_and_run(model, target="trn3")
    stats = torchneuron.stats()
    assert stats["graphs_compiled"] == 1 and stats["cache_hits"] == 0
    assert torchneuron.cache_info()["graph_misses"] == 1
    torchneuron.reset_stats()
    monkeypatch.setenv("TORCHNEURON_TARGET", "trn3")
    _compile_and_run(model)  # the same target, from the environment: a hit
    assert torchneuron.cache_info()["graph_hits"] == 1
    monkeypatch.delenv("TORCHNEURON_TARGET")
    torchneuron.reset_stats()
    _compile_and_run(_model(width=40))  # another graph
    assert torchneuron.stats()["graphs_compiled"] == 1
    assert torchneuron.cache_info()["graph_misses"] == 1


def test_target_figures_from_target_dir_are_part_of_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TORCHNEURON_TARGET_DIR replaces the built-in figures: programs compiled for other
    # figures (another SBUF size, other costs) must not be served for these.
    from torchneuron import cache

    builtin = cache.key("{}", "trn2")
    folder = tmp_path / "targets"
    folder.mkdir()
    monkeypatch.setenv("TORCHNEURON_TARGET_DIR", str(folder))
    (folder / "trn2.json").write_text('{"name": "trn2", "sbuf": 1}')
    first = cache.key("{}", "trn2")
    assert first != builtin and cache.graph_key("g", "trn2") != cache.graph_key("g", "trn3")
    assert cache.key("{}", "trn2") == first  # the same file: the same key
    (folder / "trn2.json").write_text('{"name": "trn2", "sbuf": 2}')
    assert cache.key("{}", "trn2") not in (first, builtin)


def test_dumping_stages_compiles_despite_the_cache(cache_dir: Path, tmp_path: Path) -> None:
    model = _model()
    _compile_and_run(model)
    torchneuron.reset_stats()
    _compile_and_run(model, dump_dir=str(tmp_path / "dump"))
    assert torchneuron.stats()["graphs_compiled"] == 1
    assert any((tmp_path / "dump").iterdir())


def _traced(scale: float) -> torch.fx.GraphModule:
    """An ATen graph with a captured tensor constant (a get_attr node)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    weight = torch.full((4, 4), scale)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ weight)

    return make_fx(f)(torch.ones(4, 4))


def test_constants_are_keyed_by_their_values() -> None:
    from torchneuron import graph_cache

    assert any(n.op == "get_attr" for n in _traced(1.0).graph.nodes)
    one = graph_cache.key(_traced(1.0), "trn2")
    assert one is not None and one == graph_cache.key(_traced(1.0), "trn2")
    assert one != graph_cache.key(_traced(2.0), "trn2")
    assert one != graph_cache.key(_traced(1.0), "trn3")


def test_a_graph_that_cannot_be_keyed_takes_the_program_path(cache_dir: Path) -> None:
    """An op whose target has no importable name (a local function) stays eager, and the graph
    has no reliable text: it is compiled or loaded program by program, and counted."""
    gm = _traced(1.0)
    output = gm.graph.output_node()
    (result,) = output.args[0] if isinstance(output.args[0], (tuple, list)) else output.args

    def double(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    with gm.graph.inserting_before(output):
        doubled = gm.graph.call_function(double, (result,))
    doubled.meta["val"] = torch.empty(4, 4)
    output.args = ((doubled,),)
    gm.recompile()
    x = torch.ones(4, 4)
    expected = gm(x)
    for compiled in (1, 0):  # compiled, then loaded from its program entry
        backend.clear_kernel_cache()
        torchneuron.reset_stats()
        out = backend.build_graph(gm, "trn2", None, cache_dir)(x)
        torch.testing.assert_close(out, expected)
        stats, info = torchneuron.stats(), torchneuron.cache_info()
        assert info["graph_skipped"] == 1 and info["graph_hits"] == info["graph_misses"] == 0
        assert stats["graphs_compiled"] == compiled and stats["cache_hits"] == 1 - compiled
    assert _graph_entries(cache_dir) == [] and len(_entries(cache_dir)) == 1


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
    assert len(_entries(cache_dir)) == 1 and len(_graph_entries(cache_dir)) == 1
    assert not list(cache_dir.glob(".tmp-*"))  # no half-written entry left behind


def test_the_folder_stays_under_its_cap(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _compile_and_run(_model(32))
    first = _entries(cache_dir) + _graph_entries(cache_dir)
    size = sum(e.stat().st_size for e in first)  # a program and its graph
    monkeypatch.setenv("TORCHNEURON_CACHE_MAX_MB", str(2.5 * size / (1 << 20)))
    _compile_and_run(_model(40))
    _compile_and_run(_model(48))
    entries = _entries(cache_dir) + _graph_entries(cache_dir)
    assert len(entries) == 4 and not set(first) & set(entries)  # the least recently used went
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
    assert torchneuron.cache_info()["graph_hits"] == 2  # one graph entry per size
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
