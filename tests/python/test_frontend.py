"""The front end's steps (torchneuron.frontend), each on a small graph, and their order."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest
import torch
import torch.fx
from graph_capture import aten_graph, traced

from torchneuron import (
    attention_blocks,
    flex,
    frontend,
    fx_json,
    partition,
    rewrite,
    sdpa,
    specialize,
)
from torchneuron._native import native

ROOT = Path(__file__).resolve().parents[2]
aten = torch.ops.aten


def targets(gm: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def step(name: str) -> frontend.Rewrite:
    (found,) = [r for r in frontend.REWRITES if r.name == name]
    return found


def test_architecture_lists_the_steps_in_their_order() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    listed = re.findall(r"^\s+\d+\. `([a-z0-9-]+)`", text, flags=re.MULTILINE)
    assert tuple(listed) == frontend.STEPS
    assert frontend.STEPS.index("random-ops") < frontend.STEPS.index("check")


def test_random_ops_step_seeds_rand() -> None:
    gm = traced(lambda x: x + aten.rand_like.default(x), torch.zeros(3))
    assert step("random-ops").run(gm) == 1
    assert aten.rand_like.default not in targets(gm)
    assert torch.ops.torchneuron.philox_rand.default in targets(gm)


def test_as_strided_views_step_makes_a_contiguous_window_a_view() -> None:
    gm = traced(lambda x: aten.as_strided.default(x, [2, 8], [8, 1]), torch.zeros(4, 4))
    assert step("as-strided-views").run(gm) == 1
    assert targets(gm) == [aten.view.default]


def test_as_strided_views_step_gathers_other_windows_of_a_contiguous_tensor() -> None:
    gm = traced(lambda x: aten.as_strided.default(x, [3, 4], [2, 1], 1), torch.zeros(4, 4))
    assert step("as-strided-views").run(gm) == 1
    assert targets(gm) == [aten.view.default, aten.index_select.default, aten.view.default]
    x = torch.arange(16.0).reshape(4, 4)
    torch.testing.assert_close(gm(x), x.as_strided([3, 4], [2, 1], 1))


def test_float32_scalar_inputs_step_drops_the_float64_round_trip() -> None:
    convert = torch.ops.prims.convert_element_type.default

    def f(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x * convert(convert(s, torch.float64), torch.float32)

    gm = traced(f, torch.zeros(3), torch.zeros((), dtype=torch.float64))
    assert step("float32-scalar-inputs").run(gm) == 1
    s = gm.graph.find_nodes(op="placeholder")[1]
    assert s.meta["val"].dtype == torch.float32
    assert [n.args[1] for n in gm.graph.nodes if n.target is convert] == [torch.float32]


def test_float64_in_float32_step_runs_a_float64_scale_in_float32() -> None:
    # TorchAO's tensorwise scale: the device has no float64.
    def scale(amax: torch.Tensor) -> torch.Tensor:
        return (448.0 / torch.clamp(amax.to(torch.float64), min=1e-12)).to(torch.float32)

    gm = aten_graph(scale, torch.ones(()))
    assert step("float64-in-float32").run(gm) >= 3
    dtypes = {n.meta["val"].dtype for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.float64 not in dtypes
    amax = torch.tensor(3.7)
    torch.testing.assert_close(gm(amax)[0], scale(amax), atol=0, rtol=2.0**-23)


def test_float64_in_float32_step_keeps_float64_that_leaves_the_graph() -> None:
    gm = aten_graph(lambda x: x.to(torch.float64) * 2, torch.ones(3))
    assert step("float64-in-float32").run(gm) == 0
    assert gm.graph.output_node().args[0][0].meta["val"].dtype == torch.float64


def test_splice_traces_on_meta_tensors() -> None:
    # Tracing computes nothing: on zeros, the masked form of a Mixtral block's grouped GEMMs
    # at 2048 tokens took minutes of host time per compile.
    gm = aten_graph(lambda x: x * 2, torch.ones(4, 3))
    mul = next(n for n in gm.graph.nodes if n.op == "call_function")
    x = gm.graph.find_nodes(op="placeholder")[0]
    seen: list[str] = []

    def add_one(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.device.type)
        return t + 1

    out = rewrite.splice(gm, mul, add_one, [x])
    assert seen == ["meta"] and out.meta["val"].device.type == "cpu"


def test_rewrite_graph_applies_every_rewrite_in_order() -> None:
    gm = traced(
        lambda x: aten.rand_like.default(aten.as_strided.default(x, [16], [1])), torch.zeros(4, 4)
    )
    assert frontend.rewrite_graph(gm) is gm
    assert set(targets(gm)) >= {aten.view.default, torch.ops.torchneuron.philox_rand.default}
    assert not {aten.as_strided.default, aten.rand_like.default} & set(targets(gm))


def test_lower_checks_partitions_and_serializes_each_region_once() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = aten.special_bessel_j0.default(aten.mm.default(x, w))  # no lowering: eager
        return aten.add.Tensor(aten.tanh.default(h), 1)

    gm = traced(f, torch.randn(4, 4), torch.randn(4, 4))
    before = [n.format_node() for n in gm.graph.nodes]
    ids = itertools.count()
    names: list[str] = []

    def name(prefix: str) -> str:
        names.append(f"{prefix}_{next(ids)}")
        return names[-1]

    stages: list[str] = []
    lowered = frontend.lower(gm, name, stages.append)
    assert [n.format_node() for n in gm.graph.nodes] == before  # gm itself is unchanged
    assert stages == ["checking which ops the device runs", "partitioning"]
    assert names[0] == "check_0" and len(names) == 1 + len(lowered.regions)
    assert [r.document["name"] for r in lowered.regions] == names[1:]
    assert [f.target for f in lowered.fallback] == ["aten.special_bessel_j0.default"]
    assert [r.submodule for r in lowered.regions] == [
        f"{partition.DEVICE_PREFIX}{i}" for i in range(len(lowered.regions))
    ]
    regions = [[n["target"] for n in r.document["nodes"]] for r in lowered.regions]
    assert sorted(regions) == [["aten.mm.default"], ["aten.tanh.default", "aten.add.Tensor"]]


def test_regions_reuse_the_nodes_the_check_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    table = torch.arange(16.0).reshape(4, 4)

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = aten.max.dim(aten.mm.default(x, w), 1)  # a getitem of a multi-result node
        h = aten.special_bessel_j0.default(m[0])  # no lowering: two regions
        y = aten.add.Tensor(aten.mul.Tensor(aten.tanh.default(x), table), 2)  # a constant
        return aten.add.Tensor(y, aten.unsqueeze.default(h, 1)), m[1]

    gm = traced(f, torch.randn(4, 4), torch.randn(4, 4))
    written: list[str] = []  # the node of each entry written
    add_node = fx_json._Writer.add_node

    def counting(writer: fx_json._Writer, node: torch.fx.Node, entry: dict[str, object]) -> None:
        written.append(node.name)
        add_node(writer, node, entry)

    monkeypatch.setattr(fx_json._Writer, "add_node", counting)
    lowered = frontend.lower(gm, lambda prefix: prefix)
    # The check writes the 8 ATen nodes (the importer rejects max.dim and bessel_j0); of the
    # regions' 6, only mul (it reads the constant, which its region names anew) is written again.
    assert len(written) == 9 and written[8:] == ["mul_tensor"]
    assert sorted(len(r.document["nodes"]) for r in lowered.regions) == [1, 5]
    for region in lowered.regions:
        sub = lowered.module.get_submodule(region.submodule)
        assert isinstance(sub, torch.fx.GraphModule)
        # The document assembled from the check's entries is the one written from scratch.
        assert region.document == fx_json.serialize_graph(sub, name="graph")


def test_a_reused_entry_names_its_arguments_as_the_region_does() -> None:
    """A region fused after its producer's receives the producer's value under the name of the
    getitem of the producer's results: an entry the check wrote naming the value's own node is
    written anew there."""
    whole = traced(lambda x: aten.mm.default(x, aten.add.Tensor(x, 1)), torch.randn(4, 4))
    written = fx_json.Written()
    fx_json.serialize_graph_lenient(whole, "check", written=written)
    assert "mm_default" in written.nodes

    def region_of(x: torch.Tensor, getitem_3: torch.Tensor) -> torch.Tensor:
        return aten.mm.default(x, getitem_3)

    region = traced(region_of, torch.randn(4, 4), torch.randn(4, 4))
    fresh = fx_json.serialize_graph(region, name="graph")
    assert fresh["nodes"][0]["args"][1] == {"ref": "getitem_3"}
    assert fx_json.serialize_graph(region, name="graph", reuse=written) == fresh


def test_dedupe_outputs_returns_an_aliased_value_once() -> None:
    gm = traced(lambda x: (lambda y: (y, aten.alias.default(y), y * 2))(x + 1), torch.zeros(3))
    assert frontend.dedupe_outputs(gm) == [0, 0, 1]
    assert len(gm.graph.output_node().args[0]) == 2
    assert frontend.dedupe_outputs(gm) is None  # nothing repeats any more


def test_specialize_call_gives_symbolic_sizes_the_calls() -> None:
    x = torch.randn(5, 3)
    gm = aten_graph(lambda t: t.sum(0) * t.shape[0], x, dynamic=True)
    assert not specialize.is_static(gm)
    args = [
        x if isinstance(p.meta["val"], torch.Tensor) else 5
        for p in gm.graph.find_nodes(op="placeholder")
    ]
    specialized = frontend.specialize_call(gm, args, {})
    assert specialize.is_static(specialized) and not specialize.is_static(gm)
    (out,) = specialized.graph.output_node().args[0]
    assert tuple(out.meta["val"].shape) == (3,)


def test_block_classes_are_the_kernels_codes() -> None:
    codes = attention_blocks.block_classes()
    assert codes._asdict() == native().FLEX_BLOCK_CLASSES
    assert len(set(codes)) == 3
    # The kernels' unit is each target's partitions; a document serves every target.
    unit = attention_blocks.unit()
    assert unit == min(native().target_memory(t)["partitions"] for t in native().targets())
    assert not hasattr(native(), "FLEX_UNIT")
    classes = sdpa.causal_block_classes(2 * unit, 2 * unit)
    assert classes[0, 0].tolist() == [[codes.partial, codes.masked], [codes.full, codes.partial]]


def test_flex_and_sdpa_do_not_import_each_other() -> None:
    def imports(module: object) -> set[str]:
        tree = ast.parse(Path(str(getattr(module, "__file__", ""))).read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        return found

    assert "torchneuron.flex" not in imports(sdpa)
    assert "torchneuron.sdpa" in imports(flex)  # one direction: flex reads SDPA masks
