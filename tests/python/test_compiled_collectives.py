"""Functional collectives inside compiled graphs, on 2 ranks of one host
(``compiled_collectives_worker.py``): the compiled results match eager on every rank, the
collectives run on the device (no fallback), and the profile shows the all_reduce on
``neuronlink`` while TensorE works on the independent matmul."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_distributed import WORLD, _launch, _load

WORKER = Path(__file__).with_name("compiled_collectives_worker.py")

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("compiled_collectives")
    procs = _launch("", out, worker=WORKER)
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{p.stderr[-4000:]}"
    return [_load(out, r) for r in range(WORLD)]


def test_compiled_all_reduce_matches_eager(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        torch.testing.assert_close(r["overlapped_compiled"], r["overlapped_eager"])
    # An all_reduce: both ranks hold the same sum plus their own relu term.
    assert not torch.equal(ranks[0]["overlapped_compiled"], ranks[1]["overlapped_compiled"])


def test_compiled_gather_scatter_avg_match_eager(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        for compiled, eager in zip(
            r["gather_scatter_compiled"], r["gather_scatter_eager"], strict=True
        ):
            torch.testing.assert_close(compiled, eager)
    gathered = ranks[0]["gather_scatter_compiled"][0]
    assert gathered.shape == (16, 16)
    torch.testing.assert_close(gathered, ranks[1]["gather_scatter_compiled"][0])


def test_collectives_run_on_the_device(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        for stats in (r["functional_stats"], r["tp_stats"]):
            assert not any("_c10d_functional" in op for op in stats["ops_fallback"]), stats


def test_compiled_tensor_parallel_mlp_matches_eager(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        torch.testing.assert_close(r["tp_compiled"], r["tp_eager"])
    torch.testing.assert_close(ranks[0]["tp_compiled"], ranks[1]["tp_compiled"])
    assert not ranks[0]["tp_stats"]["ops_fallback"]


def test_profile_shows_the_collective_overlapping_compute(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        trace = r["overlapped_trace"]
        assert len(trace["neuronlink"]) == 1, trace
        start, end = trace["neuronlink"][0]
        assert end > start
        assert any(s < end and e > start for s, e in trace["tensor"]), trace
