"""Splitting real ATen graphs into device regions and eager PyTorch."""

from __future__ import annotations

import json
import operator
from types import ModuleType

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from graph_capture import aten_graph

from torchneuron import fx_json, partition


def call_modules(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_module"]


def eager_targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if partition.is_op(n)]


def submodule_targets(gm: torch.fx.GraphModule, name: str) -> list[str]:
    sub = gm.get_submodule(name)
    assert isinstance(sub, torch.fx.GraphModule)
    return [str(n.target) for n in sub.graph.nodes if partition.is_op(n)]


def names_of(gm: torch.fx.GraphModule, target: str) -> list[str]:
    return [n.name for n in gm.graph.nodes if str(n.target) == target]


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = x @ w1
    h = F.gelu(h)
    return torch.tanh(h @ w2)


MLP_ARGS = (torch.randn(4, 8), torch.randn(8, 16), torch.randn(16, 8))


def test_everything_supported_is_one_region() -> None:
    gm = aten_graph(mlp, *MLP_ARGS)
    ops = sum(1 for n in gm.graph.nodes if partition.is_op(n))
    result = partition.partition_graph(gm, set())
    assert result.device_submodules == ["neuron_graph_0"]
    assert result.fallback == [] and result.ops_on_device == ops
    assert eager_targets(gm) == []
    torch.testing.assert_close(gm(*MLP_ARGS)[0], mlp(*MLP_ARGS))


def two_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two unrelated computations, one with a multi-output op."""
    values, indices = torch.sort(x)
    return values * 2, torch.tanh(y) + indices.float()


def test_all_supported_shortcut_matches_the_partitioner() -> None:
    """A graph whose every op is supported skips CapabilityBasedPartitioner's quadratic search;
    its one partition must be exactly the partitioner's, horizontal fusion included."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    for fn, args in ((mlp, MLP_ARGS), (two_outputs, (torch.randn(6), torch.randn(6)))):
        gm = aten_graph(fn, *args)
        support = partition._Support({})
        expected = CapabilityBasedPartitioner(
            gm, support, allows_single_node_partition=True
        ).propose_partitions()
        got = partition._propose_partitions(gm, support)
        assert [list(p.nodes) for p in got] == [list(p.nodes) for p in expected]


def test_unsupported_op_splits_the_graph_and_stays_eager() -> None:
    gm = aten_graph(mlp, *MLP_ARGS)
    (gelu,) = names_of(gm, "aten.gelu.default")
    result = partition.partition_graph(gm, {gelu: "no gelu today"})
    assert len(result.device_submodules) == 2
    assert eager_targets(gm) == ["aten.gelu.default"]
    regions = sorted(sorted(submodule_targets(gm, name)) for name in result.device_submodules)
    assert regions == [["aten.mm.default"], ["aten.mm.default", "aten.tanh.default"]]
    (fallback,) = result.fallback
    assert (fallback.name, fallback.target, fallback.reason) == (
        gelu,
        "aten.gelu.default",
        "no gelu today",
    )
    assert fallback.loc == f"{__file__}:{mlp.__code__.co_firstlineno + 2}"
    assert "aten.gelu.default" in fallback.describe() and fallback.loc in fallback.describe()
    torch.testing.assert_close(gm(*MLP_ARGS)[0], mlp(*MLP_ARGS))


def test_a_plain_set_of_names_works_too() -> None:
    gm = aten_graph(mlp, *MLP_ARGS)
    result = partition.partition_graph(gm, set(names_of(gm, "aten.tanh.default")))
    assert [f.reason for f in result.fallback] == ["rejected by the importer"]


def test_independent_work_around_an_eager_op_is_one_region() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x.sin() * 2
        b = torch.exp(x)  # unsupported below
        return a, b.cos() + 1

    x = torch.randn(5)
    gm = aten_graph(f, x)
    result = partition.partition_graph(gm, set(names_of(gm, "aten.exp.default")))
    assert result.device_submodules == ["neuron_graph_0"]  # sin/mul and cos/add together
    assert sorted(submodule_targets(gm, "neuron_graph_0")) == sorted(
        ["aten.sin.default", "aten.mul.Tensor", "aten.cos.default", "aten.add.Tensor"]
    )
    for got, want in zip(gm(x), f(x), strict=True):
        torch.testing.assert_close(got, want)


def test_getitem_goes_with_its_producer() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.exp(F.layer_norm(x, (8,)))

    x = torch.randn(3, 8)
    gm = aten_graph(f, x)
    result = partition.partition_graph(gm, set(names_of(gm, "aten.exp.default")))
    assert result.device_submodules == ["neuron_graph_0"]
    assert "aten.var_mean.correction" in submodule_targets(gm, "neuron_graph_0")
    producers = {
        n.args[0].op for n in gm.graph.nodes if n.target is operator.getitem
    }  # only getitems of the region's own tuple output remain outside
    assert producers <= {"call_module"}
    torch.testing.assert_close(gm(x)[0], f(x))


def test_view_only_region_stays_eager_and_is_reported() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x)
        return torch.exp(y.view(-1))

    x = torch.randn(2, 3)
    gm = aten_graph(f, x)
    result = partition.partition_graph(gm, set(names_of(gm, "aten.exp.default")))
    assert result.device_submodules == [] and result.ops_on_device == 0
    reasons = {f.target: f.reason for f in result.fallback}
    assert reasons["aten.view.default"].startswith("only view/metadata ops")
    assert sorted(eager_targets(gm)) == sorted(["aten.exp.default"] * 2 + ["aten.view.default"])
    torch.testing.assert_close(gm(x)[0], f(x))


def test_outputs_that_view_an_input_are_made_on_the_host() -> None:
    """A router returns ``x.view(-1, h)`` beside its logits: as the region's output it
    would be a full copy on the device; the outer graph makes it from the input."""

    def router(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.view(-1, x.shape[-1])
        return flat, flat @ w.t()

    args = (torch.randn(2, 4, 8), torch.randn(3, 8))
    gm = aten_graph(router, *args)
    result = partition.partition_graph(gm, set())
    (name,) = result.device_submodules
    sub = gm.get_submodule(name)
    assert isinstance(sub, torch.fx.GraphModule)
    returned = sub.graph.output_node().args[0]
    assert isinstance(returned, tuple) and len(returned) == 1  # the product only
    assert eager_targets(gm) == ["aten.view.default"]
    assert result.fallback == []  # a view on the host is not work left to eager
    got = gm(*args)
    assert got[0].data_ptr() == args[0].data_ptr()  # an alias, as eager returns
    for g, want in zip(got, router(*args), strict=True):
        torch.testing.assert_close(g, want)


def test_constants_move_into_the_region() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.0, 2.0, 3.0])

    x = torch.randn(3)
    gm = aten_graph(f, x)
    result = partition.partition_graph(gm, set())
    (call,) = call_modules(gm)
    assert [a.op for a in call.args] == ["placeholder"]  # the constant is no longer an input
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"]
    sub = gm.get_submodule(result.device_submodules[0])
    assert isinstance(sub, torch.fx.GraphModule)
    doc = fx_json.serialize_graph(sub)
    assert len(doc["inputs"]) == 1 and len(doc["constants"]) == 1
    assert fx_json.tensor_from_constant(doc["constants"][0]).tolist() == [1.0, 2.0, 3.0]
    torch.testing.assert_close(gm(x)[0], f(x))


def mlp_with_airy(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.tanh(torch.special.airy_ai(x @ w1) @ w2)


def test_find_unsupported_asks_the_importer(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[dict[str, object]] = []
    real = real_native.check_graph

    def spy(document: str) -> dict[str, str]:  # records the document, calls the real check
        checked.append(json.loads(document))
        return real(document)

    monkeypatch.setattr(real_native, "check_graph", spy)
    gm = aten_graph(mlp_with_airy, *MLP_ARGS)
    unsupported = partition.find_unsupported(gm)
    assert list(unsupported) == names_of(gm, "aten.special_airy_ai.default")
    assert "no lowering" in next(iter(unsupported.values()))
    (doc,) = checked
    assert len(doc["nodes"]) == sum(1 for n in gm.graph.nodes if partition.is_op(n))
    assert partition.find_unsupported(aten_graph(mlp, *MLP_ARGS)) == {}


def test_find_unsupported_when_the_importer_cannot_read_the_graph(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(graph_json: str) -> dict[str, str]:
        # Fault injection: this one check_graph call fails with the extension's CompileError.
        # (The real check_graph does not raise for an unreadable document; it reports it under
        # the key "", see the xfail test below.)
        raise real_native.CompileError("bad document")

    monkeypatch.setattr(real_native, "check_graph", broken)
    gm = aten_graph(mlp, *MLP_ARGS)
    unsupported = partition.find_unsupported(gm)
    assert set(unsupported) == {n.name for n in gm.graph.nodes if partition.is_op(n)}
    assert all("bad document" in reason for reason in unsupported.values())


def test_find_unsupported_rejects_users_of_inputs_the_device_cannot_hold(
    real_native: ModuleType,
) -> None:
    args = [a.double() for a in MLP_ARGS]  # the importer has no float64 inputs
    gm = aten_graph(mlp, *args)
    unsupported = partition.find_unsupported(gm)
    assert set(unsupported) == {n.name for n in gm.graph.nodes if partition.is_op(n)}
    assert all("float64" in reason for reason in unsupported.values())


def test_find_unsupported_includes_nodes_the_document_cannot_express(
    real_native: ModuleType,
) -> None:
    from test_fx_json import chain_with_bad_argument

    assert list(partition.find_unsupported(chain_with_bad_argument())) == ["add_scalar"]


def test_is_compute() -> None:
    gm = aten_graph(lambda x: (x * 2).t().reshape(-1), torch.randn(2, 3))
    kinds = {str(n.target): partition.is_compute(n) for n in gm.graph.nodes if n.op != "output"}
    assert kinds["aten.permute.default"] is False
    assert kinds["aten.view.default"] is False
    assert kinds["aten.mul.Tensor"] is True
