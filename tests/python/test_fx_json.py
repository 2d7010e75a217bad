"""The FX graph document (docs/FX_GRAPH_FORMAT.md) written from real ATen graphs."""

from __future__ import annotations

import json
import operator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graph_capture import aten_graph, aten_graphs, traced

from torchneuron import fx_json, specialize


def nodes_by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in doc["nodes"]}


def all_refs(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value] if "ref" in value else []
    if isinstance(value, list):
        return [r for v in value for r in all_refs(v)]
    return []


def check_well_formed(doc: dict[str, Any]) -> None:
    """Every ref names an earlier input, constant or node; indices fit the producer."""
    assert doc["format"] == "torchneuron-fx-graph" and doc["version"] == 1
    results: dict[str, int] = {e["name"]: 1 for e in doc["inputs"] + doc["constants"]}
    for node in doc["nodes"]:
        for ref in all_refs(node["args"]) + all_refs(list(node["kwargs"].values())):
            assert ref["ref"] in results, (node["name"], ref)
            assert ref.get("index", 0) < results[ref["ref"]], (node["name"], ref)
        assert "." in node["target"] and not node["target"].startswith("<")
        results[node["name"]] = len(node["outputs"])
    for ref in all_refs(doc["outputs"]):
        assert ref["ref"] in results
    json.loads(fx_json.to_json(doc))  # valid JSON, no NaN/Infinity literals


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w1, b1)) @ w2


def test_inputs_nodes_and_refs() -> None:
    args = (torch.randn(4, 8), torch.randn(16, 8), torch.randn(16), torch.randn(16, 4))
    doc = fx_json.serialize_graph(aten_graph(mlp, *args), name="graph_7")
    check_well_formed(doc)
    assert doc["name"] == "graph_7"
    assert [(i["dtype"], i["shape"]) for i in doc["inputs"]] == [
        ("float32", [4, 8]),
        ("float32", [16, 8]),
        ("float32", [16]),
        ("float32", [16, 4]),
    ]
    targets = [n["target"] for n in doc["nodes"]]
    assert "aten.addmm.default" in targets and "aten.gelu.default" in targets
    addmm = next(n for n in doc["nodes"] if n["target"] == "aten.addmm.default")
    assert addmm["outputs"] == [{"dtype": "float32", "shape": [4, 16]}]
    assert addmm["args"][0] == {"ref": doc["inputs"][2]["name"]}  # the bias
    (out,) = doc["outputs"]
    assert nodes_by_name(doc)[out["ref"]]["outputs"][0]["shape"] == [4, 4]


def test_getitem_is_folded_into_indexed_refs() -> None:
    def layer_norm(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (8,), eps=1e-5)

    gm = aten_graph(layer_norm, torch.randn(3, 8))
    assert any(n.target is operator.getitem for n in gm.graph.nodes)
    doc = fx_json.serialize_graph(gm)
    check_well_formed(doc)
    assert all(n["target"] != "_operator.getitem" for n in doc["nodes"])
    var_mean = next(n for n in doc["nodes"] if n["target"] == "aten.var_mean.correction")
    assert var_mean["outputs"] == [{"dtype": "float32", "shape": [3, 1]}] * 2
    used = [r for n in doc["nodes"] for r in all_refs(n["args"]) if r["ref"] == var_mean["name"]]
    assert sorted(r["index"] for r in used) == [0, 1]


def test_loc_is_the_line_in_this_file() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        return y * 2.0

    doc = fx_json.serialize_graph(aten_graph(f, torch.randn(3)))
    first = f.__code__.co_firstlineno
    locs = {n["target"]: n["loc"] for n in doc["nodes"]}
    assert locs["aten.sin.default"] == {"file": __file__, "line": first + 1, "col": 0}
    assert locs["aten.mul.Tensor"]["line"] == first + 2


def test_loc_skips_torch_frames() -> None:
    import os

    torch_file = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "linear.py")
    trace = (
        '  File "/home/me/model.py", line 12, in forward\n    y = self.fc(x)\n'
        f'  File "{torch_file}", line 134, in forward\n    return F.linear(x, w)\n'
    )
    assert fx_json.source_location(trace) == {"file": "/home/me/model.py", "line": 12, "col": 0}
    only_torch = f'  File "{torch_file}", line 134, in forward\n'
    assert fx_json.source_location(only_torch) == {"file": torch_file, "line": 134, "col": 0}
    assert fx_json.source_location(None) is None
    assert fx_json.source_location("no frames here") is None


def test_floats_and_special_values() -> None:
    def f(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x.masked_fill(mask, float("-inf")) + 1e-5
        z = torch.clamp(x, min=-3.5, max=float("inf"))
        return y, z, torch.full_like(x, float("nan"))

    doc = fx_json.serialize_graph(aten_graph(f, torch.randn(3, 3), torch.rand(3, 3) > 0.5))
    check_well_formed(doc)
    nodes = {n["target"]: n for n in doc["nodes"]}
    assert nodes["aten.add.Tensor"]["args"][1] == 1e-05
    assert nodes["aten.clamp.default"]["args"][1:] == [-3.5, {"float": "inf"}]
    assert nodes["aten.full_like.default"]["args"][1] == {"float": "nan"}
    assert {"float": "-inf"} in [a for n in doc["nodes"] for a in n["args"]]
    text = fx_json.to_json(doc)
    assert "1e-05" in text and "Infinity" not in text and "NaN" not in text
    assert fx_json.to_json({"x": [1.0, 2]}) == '{"x": [1.0, 2]}'  # floats keep a fraction


def test_dtype_device_layout_and_memory_format() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.to(torch.bfloat16), torch.arange(4), x.t().contiguous()

    doc = fx_json.serialize_graph(aten_graph(f, torch.randn(2, 3)))
    check_well_formed(doc)
    nodes = {n["target"]: n for n in doc["nodes"]}
    assert nodes["aten._to_copy.default"]["kwargs"]["dtype"] == {"dtype": "bfloat16"}
    assert nodes["aten._to_copy.default"]["outputs"][0]["dtype"] == "bfloat16"
    arange = nodes["aten.arange.start_step"]
    assert arange["kwargs"]["device"] == {"device": "cpu"}
    assert arange["kwargs"]["layout"] == {"enum": "torch.strided"}
    assert arange["outputs"] == [{"dtype": "int64", "shape": [4]}]
    clone = nodes["aten.clone.default"]["kwargs"]["memory_format"]
    assert clone == {"enum": "torch.contiguous_format"}


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor([1.5, -2.25, 3.0e38, float("inf")], dtype=torch.bfloat16),
        torch.tensor([[1e-5, -0.0], [float("nan"), 7.0]]),
        torch.arange(6, dtype=torch.float16).reshape(2, 3),
        torch.arange(6, dtype=torch.float64).reshape(3, 2).t(),  # non-contiguous
        torch.tensor([-(2**40), 2**40]),
        torch.tensor([-7, 9], dtype=torch.int32),
        torch.tensor([-7, 9], dtype=torch.int16),
        torch.tensor([-7, 9], dtype=torch.int8),
        torch.tensor([0, 255], dtype=torch.uint8),
        torch.tensor([True, False, True]),
        torch.tensor(3.25),
    ],
    ids=lambda t: f"{t.dtype}{list(t.shape)}",
)
def test_constant_round_trip(tensor: torch.Tensor) -> None:
    entry = fx_json.constant_entry("c", tensor)
    assert entry["shape"] == list(tensor.shape)
    assert entry["dtype"] == str(tensor.dtype).removeprefix("torch.")
    back = fx_json.tensor_from_constant(json.loads(json.dumps(entry)))
    assert back.dtype == tensor.dtype
    torch.testing.assert_close(back, tensor, rtol=0, atol=0, equal_nan=True)


def test_constant_bytes_are_little_endian() -> None:
    import base64

    entry = fx_json.constant_entry("c", torch.tensor([1.0], dtype=torch.bfloat16))
    assert base64.b64decode(entry["data"]) == b"\x80\x3f"  # bf16 1.0 = 0x3f80
    entry = fx_json.constant_entry("c", torch.tensor([1], dtype=torch.int32))
    assert base64.b64decode(entry["data"]) == b"\x01\x00\x00\x00"


def test_get_attr_constant_in_a_graph() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.5, -2.25, 3.0e38], dtype=torch.bfloat16)

    doc = fx_json.serialize_graph(aten_graph(f, torch.randn(3).to(torch.bfloat16)))
    check_well_formed(doc)
    (constant,) = doc["constants"]
    assert (constant["dtype"], constant["shape"]) == ("bfloat16", [3])
    expected = torch.tensor([1.5, -2.25, 3.0e38], dtype=torch.bfloat16)
    assert torch.equal(fx_json.tensor_from_constant(constant), expected)
    assert any(constant["name"] == r["ref"] for n in doc["nodes"] for r in all_refs(n["args"]))


def chain_with_bad_argument() -> torch.fx.GraphModule:
    """mul -> add -> cos, where add's scalar is a complex number (no JSON encoding)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten.mul.Scalar(x, 2.0)
        z = torch.ops.aten.add.Scalar(y, 1.0)
        return torch.ops.aten.cos.default(z)

    gm = traced(f, torch.randn(3))
    (add,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Scalar]
    add.args = (add.args[0], complex(1.0, 2.0))
    return gm


def test_unencodable_argument_raises() -> None:
    with pytest.raises(fx_json.UnsupportedNodeError) as info:
        fx_json.serialize_graph(chain_with_bad_argument())
    assert info.value.node == "add_scalar" and "complex" in info.value.reason


def test_lenient_mode_feeds_unsupported_results_to_users_as_inputs() -> None:
    doc, unsupported = fx_json.serialize_graph_lenient(chain_with_bad_argument())
    check_well_formed(doc)
    assert list(unsupported) == ["add_scalar"]
    assert [n["name"] for n in doc["nodes"]] == ["mul_scalar", "cos_default"]
    assert [i["name"] for i in doc["inputs"]] == ["x", "add_scalar"]
    assert doc["nodes"][1]["args"] == [{"ref": "add_scalar"}]


def test_non_aten_targets_are_unsupported() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x)  # a torch function, not an ATen overload

    doc, unsupported = fx_json.serialize_graph_lenient(traced(f, torch.randn(3)))
    assert list(unsupported) == ["sin"] and "not an ATen operator" in unsupported["sin"]
    assert doc["nodes"] == []


def test_unsupported_dtype() -> None:
    with pytest.raises(Exception, match="complex64"):
        fx_json.constant_entry("c", torch.zeros(2, dtype=torch.complex64))


def test_symbolic_shapes_must_be_specialized() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * x.shape[0]).sum(0)

    gm = aten_graph(f, torch.randn(5, 3), dynamic=True)
    assert not specialize.is_static(gm)
    with pytest.raises(fx_json.UnsupportedNodeError, match="symbolic"):
        fx_json.serialize_graph(gm)

    args = [7 if isinstance(v, torch.SymInt) else torch.randn(7, 3) for v in _example(gm)]
    concrete = specialize.specialize(gm, args)
    assert specialize.is_static(concrete)
    doc = fx_json.serialize_graph(concrete)
    check_well_formed(doc)
    assert [i["shape"] for i in doc["inputs"]] == [[7, 3]]  # SymInt inputs are not listed
    mul = next(n for n in doc["nodes"] if n["target"].startswith("aten.mul"))
    assert 7 in mul["args"]
    torch.testing.assert_close(concrete(*args)[0], gm(*args)[0])


def _example(gm: torch.fx.GraphModule) -> list[object]:
    return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


def test_training_graphs_serialize() -> None:
    w = torch.randn(4, 4, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x @ w, (4,)).relu().sum()

    graphs = aten_graphs(f, torch.randn(3, 4), backward=True)
    assert len(graphs) == 2  # forward and backward
    for gm in graphs:
        check_well_formed(fx_json.serialize_graph(gm))
