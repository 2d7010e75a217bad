"""The ``neuron`` torch.distributed backend on 2 ranks of one host.

Each launch starts two processes of ``distributed_worker.py`` with torchrun's environment (a
free port on 127.0.0.1, short timeouts); the workers save their results and these tests
compare them: every collective on neuron tensors against the same one on CPU tensors over
Gloo, DDP training against one process, the modeled time on the stream and in the profilers,
and a rank that dies making the other raise.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import torchneuron.distributed as neuron_dist

WORKER = Path(__file__).with_name("distributed_worker.py")
WORLD = 2

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    scenario: str,
    out: Path,
    timeout: float = 90,
    world: int = WORLD,
    worker: Path = WORKER,
) -> list[subprocess.CompletedProcess]:
    """Run the ``world`` ranks of ``scenario`` of ``worker`` (no scenario argument when
    empty); kill them all if they outlive ``timeout`` seconds."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            TORCHNEURON_TARGET="trn2",
        )
        env.pop("TORCHNEURON_VISIBLE_CORES", None)
        env["TRACE_DIR"] = str(out)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(worker), *([scenario] if scenario else []), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{scenario}: the ranks did not finish within {timeout} s (a hang)")
    return done


def _load(out: Path, rank: int) -> dict[str, Any]:
    return torch.load(out / f"rank{rank}.pt", weights_only=False)


@pytest.fixture(scope="module")
def collectives(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("collectives")
    procs = _launch("collectives", out)
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{p.stderr[-4000:]}"
    return [_load(out, r) for r in range(WORLD)]


COLLECTIVES = [
    "all_reduce_sum",
    "all_reduce_max",
    "all_reduce_min",
    "all_reduce_product",
    "all_reduce_sum_int64",
    "all_reduce_sum_bf16",
    "all_reduce_avg",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_avg",
    "reduce_scatter",
    "broadcast",
    "all_to_all_single",
    "all_to_all_uneven",
    "all_to_all",
    "send_recv",
    "reduce_to_root",
    "gather",
    "scatter",
]


@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective_matches_gloo_on_cpu(collectives: list[dict[str, Any]], name: str) -> None:
    for rank, results in enumerate(collectives):
        got, want = results[name]
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"rank {rank}: {name}")


def test_collectives_changed_the_data(collectives: list[dict[str, Any]]) -> None:
    # The reference is not the input unchanged: rank 0 holds rank 1's row after a broadcast.
    b0, _ = collectives[0]["broadcast"]
    b1, _ = collectives[1]["broadcast"]
    torch.testing.assert_close(b0, b1)
    s0, _ = collectives[0]["all_reduce_sum"]
    m0, _ = collectives[0]["all_reduce_max"]
    assert not torch.equal(s0, m0)


def test_default_group_sends_neuron_tensors_to_the_neuron_backend(
    collectives: list[dict[str, Any]],
) -> None:
    assert collectives[0]["backend_for_neuron"] == "neuron"


def test_async_work_hands_back_neuron_tensors(collectives: list[dict[str, Any]]) -> None:
    for results in collectives:
        (x, fut, device), (x_ref, _, _) = results["async_all_reduce"]
        torch.testing.assert_close(x, x_ref)
        torch.testing.assert_close(fut, x_ref)
        assert device == "neuron"


def test_modeled_collective_time_is_on_the_stream(collectives: list[dict[str, Any]]) -> None:
    for results in collectives:
        model = results["all_reduce_model_ns"]
        # 256 KiB over a 2-core ring: bandwidth and latency terms of CollectiveCost.h.
        topo = neuron_dist.topology("trn2")
        assert model == pytest.approx(
            (1 << 18) / topo["core_bytes_per_ns"] + 2 * topo["core_latency_ns"]
        )
        assert results["all_reduce_event_ns"] == pytest.approx(model, rel=1e-6)
        # An async collective holds its stream back only once it is waited for.
        assert results["all_gather_issued_ns"] == 0
        assert results["all_gather_event_ns"] == pytest.approx(
            results["all_gather_model_ns"], rel=1e-6
        )


def test_profilers_see_collectives(collectives: list[dict[str, Any]]) -> None:
    for results in collectives:
        ((name, nbytes, device_ns, bound),) = results["profile_runs"]
        assert (name, nbytes, bound) == ("all_reduce", 1 << 18, "neuronlink")
        assert device_ns == pytest.approx(results["all_reduce_model_ns"])
        assert "neuron::broadcast" in results["torch_profiler_names"]


def test_one_trace_shows_every_rank_and_the_overlap(collectives: list[dict[str, Any]]) -> None:
    events = collectives[0]["merged_trace"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    for rank in range(WORLD):
        spans = [e for e in events if e["pid"] == rank and e["ph"] == "X"]
        (comm,) = [e for e in spans if e["name"] == "all_reduce"]
        tracks = {
            (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
        }
        assert tracks[(rank, comm["tid"])] == "neuronlink transfers"
        # The matmul's kernel starts with the collective (it does not wait for it) and on
        # the engines' tracks, not the collective's.
        (mm,) = [e for e in spans if e["tid"] == 0]
        assert mm["ts"] == comm["ts"] == 0
        assert mm["tid"] != comm["tid"]


def test_ddp_matches_one_process(collectives: list[dict[str, Any]]) -> None:
    for rank, results in enumerate(collectives):
        losses, single_losses = results["ddp_losses"]
        assert len(losses) == 3
        torch.testing.assert_close(
            torch.tensor(losses), torch.tensor(single_losses), rtol=1e-5, atol=1e-6
        )
        params, single_params = results["ddp_params"]
        for p, q in zip(params, single_params, strict=True):
            torch.testing.assert_close(
                p, q, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: parameters differ"
            )
        assert results["ddp_grad_devices"] == ["neuron"]
    # Both ranks end with the same parameters (they started different on rank 1).
    for p, q in zip(collectives[0]["ddp_params"][0], collectives[1]["ddp_params"][0], strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def _launched(scenario: str, out: Path, world: int) -> list[dict[str, Any]]:
    procs = _launch(scenario, out, timeout=240, world=world)
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{p.stderr[-4000:]}"
    return [_load(out, r) for r in range(world)]


@pytest.fixture(scope="module")
def parallel(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _launched("parallel", tmp_path_factory.mktemp("parallel"), WORLD)


def _matches_one_process(results: dict[str, Any], name: str, single: str) -> None:
    losses, state = results[name]
    single_losses, single_state = results[single]
    # Different reduction orders: float32 rounding, nothing more.
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(single_losses), rtol=1e-5, atol=0)
    assert state.keys() == single_state.keys()
    for k, v in state.items():
        torch.testing.assert_close(v, single_state[k], rtol=1e-4, atol=1e-5, msg=f"{name}: {k}")
    # Training moved the parameters: the comparison is not of two initializations.
    assert not torch.equal(single_state["up.weight"], _initial_up_weight())


def _initial_up_weight() -> torch.Tensor:
    torch.manual_seed(0)  # the block's first random parameter (its LayerNorm draws nothing)
    return torch.nn.Linear(16, 32).weight.detach()


def test_fsdp2_trains_as_one_process(parallel: list[dict[str, Any]]) -> None:
    for results in parallel:
        _matches_one_process(results, "fsdp", "fsdp_single")
        _matches_one_process(results, "fsdp_compiled", "fsdp_single")
        assert results["compiled_graphs"] >= 2  # forward and backward
        # Each rank keeps half of each parameter, on its neuron device.
        assert results["fsdp_shard"] == ((32 // WORLD, 16), "neuron")
        assert results["fallbacks"] == {}


def test_tensor_parallel_trains_as_one_process(parallel: list[dict[str, Any]]) -> None:
    for results in parallel:
        _matches_one_process(results, "tp", "tp_single")
        assert results["tp_up_shard"] == (32 // WORLD, 16)


def test_fsdp_times_tensor_parallel_on_a_2d_mesh(tmp_path: Path) -> None:
    runs = _launched("mesh_2d", tmp_path, world=4)
    for results in runs:
        _matches_one_process(results, "mesh", "mesh_single")
        # up.weight (32, 16): split in 2 by tp (rows), then in 2 by FSDP (rows again).
        assert results["mesh_up_local"] == (8, 16)
        assert results["fallbacks"] == {}


def test_ddp_all_reduce_overlaps_the_backward(collectives: list[dict[str, Any]]) -> None:
    for results in collectives:
        alone = results["backward_alone_ns"]
        comm = results["ddp_all_reduce_ns"]
        ddp = results["backward_ddp_ns"]
        assert len(comm) >= 3, "expected several gradient buckets"
        # Serialized, the backward would take alone + sum(comm); overlapped, all but the
        # buckets' tail hides behind the compute.
        assert ddp < alone + sum(comm) - 0.5 * sum(comm[:-1])
        # Fully hidden, the same time summed in another order: equal to rounding.
        assert ddp >= max(alone, sum(comm)) * (1 - 1e-12)


def test_a_rank_that_dies_makes_the_other_raise(tmp_path: Path) -> None:
    procs = _launch("dies", tmp_path, timeout=60)
    assert procs[1].returncode == 3, procs[1].stderr[-2000:]
    assert procs[0].returncode == 0, procs[0].stderr[-4000:]
    results = _load(tmp_path, 0)
    assert results["backend"] == "neuron"
    torch.testing.assert_close(results["cpu_all_reduce"], torch.full((2,), 3.0))
    assert results["error"] is not None, "all_reduce with a dead peer returned"
    kind, message, mro = results["error"]
    assert "DistBackendError" in mro
    assert "neuron all_reduce on rank 0 of 2 failed" in message
    assert results["seconds"] < 20  # within the process group's timeout


def test_cost_model_binding_orders_topologies() -> None:
    one_chip = neuron_dist.collective_cost("all_reduce", 1 << 20, list(range(8)), "trn2")
    two_chips = neuron_dist.collective_cost(
        "all_reduce", 1 << 20, [0, 1, 2, 3, 8, 9, 10, 11], "trn2"
    )
    assert not one_chip["crosses_chips"] and two_chips["crosses_chips"]
    assert two_chips["duration_ns"] > one_chip["duration_ns"]
    with pytest.raises(ValueError, match="outside the instance"):
        neuron_dist.collective_cost("all_reduce", 4, [0, 128], "trn2")
