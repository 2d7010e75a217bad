"""Write an ATen-level FX graph as the FX graph document (docs/FX_GRAPH_FORMAT.md, version 1).

The document is the only thing the C++ importer sees. Its sizes are concrete (graphs with symbolic
shapes specialized first, :mod:`torchneuron.specialize`) unless it is written ``symbolic``: then
a symbolic size is a size expression over Dynamo's symbols (:mod:`torchneuron.sizes`).

Anything the format cannot express raises :class:`UnsupportedNodeError`; the partitioner keeps
such nodes in eager PyTorch.
"""

from __future__ import annotations

import base64
import json
import math
import operator
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from torchneuron import collectives, flex, sdpa
from torchneuron.attention_blocks import BLOCKS_META, unit
from torchneuron.sizes import SizeSymbols

__all__ = [
    "DTYPE_NAMES",
    "FORMAT",
    "SCALAR_TARGETS",
    "VERSION",
    "UnsupportedNodeError",
    "Written",
    "concrete_scalar",
    "constant_entry",
    "dtype_from_name",
    "fetch_attr",
    "serialize_graph",
    "serialize_graph_lenient",
    "numpy_storage_dtype",
    "source_line",
    "source_location",
    "tensor_from_constant",
    "tensor_spec",
    "to_json",
]

FORMAT = "torchneuron-fx-graph"
VERSION = 1

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.float8_e8m0fnu: "float8_e8m0fnu",  # MX block scales (torch._scaled_mm)
}
_DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}

# Scalar helpers that Dynamo and AOT put in graphs with symbolic shapes. They are written as
# their (specialized) value, never as nodes.
SCALAR_TARGETS: frozenset[object] = frozenset(
    {
        torch.ops.aten.sym_size.int,
        torch.ops.aten.sym_stride.int,
        torch.ops.aten.sym_numel.default,
        torch.ops.aten.sym_storage_offset.default,
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.mod,
        operator.pow,
        operator.neg,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        torch.sym_float,
        torch.sym_int,
        torch.sym_max,
        torch.sym_min,
        torch.sym_not,
        math.ceil,
        math.floor,
    }
)

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+)')


class UnsupportedNodeError(Exception):
    """A node (or one of its arguments or results) that the document cannot express."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"{node}: {reason}")
        self.node = node
        self.reason = reason


class _Unencodable(Exception):
    """Raised while encoding one value; becomes an UnsupportedNodeError for its node."""


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype for a document dtype name (``"bfloat16"`` -> ``torch.bfloat16``)."""
    try:
        return _DTYPES_BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r}") from None


def _dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise _Unencodable(f"dtype {dtype} is not supported") from None


def _concrete_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import is_concrete_int

        if is_concrete_int(value):
            return int(value)
    return None


def tensor_spec(value: object, sizes: SizeSymbols | None = None) -> dict[str, Any]:
    """``{"dtype", "shape"}`` of a (fake) tensor; raises when it is not a tensor, or has a
    symbolic size and ``sizes`` (a symbolic document's symbols) is not given."""
    if not isinstance(value, torch.Tensor):
        raise _Unencodable(f"result is not a tensor ({type(value).__name__})")
    shape: list[int | str] = []
    for size in value.shape:
        concrete = _concrete_int(size)
        if concrete is not None:
            shape.append(concrete)
        elif sizes is None:
            raise _Unencodable(f"symbolic size {size} in shape {list(value.shape)}")
        else:
            shape.append(_size(sizes, size))
    return {"dtype": _dtype_name(value.dtype), "shape": shape}


def _size(sizes: SizeSymbols, value: torch.SymInt) -> int | str:
    try:
        return sizes.size(value)
    except ValueError as e:
        raise _Unencodable(str(e)) from None


def _first(value: object) -> object:
    return value[0] if isinstance(value, (tuple, list)) else value


def _result_specs(value: object, sizes: SizeSymbols | None = None) -> list[dict[str, Any]]:
    if isinstance(value, (tuple, list)):
        if not value:
            raise _Unencodable("operator has no tensor results")
        return [tensor_spec(v, sizes) for v in value]
    return [tensor_spec(value, sizes)]


def source_location(stack_trace: str | None) -> dict[str, Any] | None:
    """``{"file", "line", "col"}`` of the innermost frame outside torch itself in a node's
    ``stack_trace`` (the innermost frame when every frame is inside torch); ``None`` without
    frames. The trace carries no column, so ``col`` is 0."""
    if not stack_trace:
        return None
    frames = [(m.group(1), int(m.group(2))) for m in _FRAME_RE.finditer(stack_trace)]
    if not frames:
        return None
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    file, line = (user or frames)[-1]
    return {"file": file, "line": line, "col": 0}


def source_line(node: torch.fx.Node) -> str | None:
    """``file:line`` of a node's :func:`source_location`, or None."""
    loc = source_location(node.meta.get("stack_trace"))
    return f"{loc['file']}:{loc['line']}" if loc else None


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(tensor, FakeTensor) or tensor.device.type == "meta":
        raise _Unencodable("constant has no data (fake or meta tensor)")
    t = tensor.detach().to("cpu").contiguous()
    t = t.view(numpy_storage_dtype(t.dtype))
    array = t.numpy()
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def numpy_storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """A dtype numpy holds with the same bytes (bf16 and fp8 have no numpy dtype)."""
    if dtype == torch.bfloat16:
        return torch.int16
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu):
        return torch.uint8
    return dtype


def constant_entry(name: str, tensor: torch.Tensor) -> dict[str, Any]:
    """A ``constants`` entry: dtype, shape and base64 of the contiguous little-endian bytes."""
    spec = tensor_spec(tensor)
    data = base64.b64encode(_tensor_bytes(tensor)).decode("ascii")
    return {"name": name, **spec, "data": data}


def tensor_from_constant(entry: Mapping[str, Any]) -> torch.Tensor:
    """Inverse of :func:`constant_entry`."""
    import numpy as np

    dtype = dtype_from_name(entry["dtype"])
    raw = base64.b64decode(entry["data"])
    storage_dtype = numpy_storage_dtype(dtype)
    np_dtype = torch.empty((), dtype=storage_dtype).numpy().dtype.newbyteorder("<")
    array = np.frombuffer(raw, dtype=np_dtype).astype(np_dtype.newbyteorder("="))
    tensor = torch.from_numpy(array.copy()).view(storage_dtype).view(dtype)
    return tensor.reshape(entry["shape"])


def _float(value: float) -> Any:
    if math.isnan(value):
        return {"float": "nan"}
    if math.isinf(value):
        return {"float": "inf" if value > 0 else "-inf"}
    return float(value)


def fetch_attr(gm: torch.fx.GraphModule, target: str) -> object:
    """The object a ``get_attr`` node reads (``target`` may be a dotted path)."""
    obj: object = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Written:
    """What writing a graph's document leaves for the documents of its regions, so a node is
    serialized once (:func:`serialize_graph_lenient` fills it, :func:`serialize_graph` reuses
    it): each ATen node's entry by node name, when the entry means the same in any document
    holding the node (its tensor arguments are referred to by their own names: no getitem of a
    multi-result node, constant or inline scalar, no symbolic size), with the names of its
    arguments (a region whose partition was fused after its producer's receives a value under
    the producer's getitem name, and must write the entry anew), and each constant's entry by
    tensor."""

    nodes: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = field(default_factory=dict)
    constants: dict[int, tuple[torch.Tensor, dict[str, Any]]] = field(default_factory=dict)


def _argument_names(node: torch.fx.Node) -> tuple[str, ...]:
    return tuple(n.name for n in node.all_input_nodes)


class _Writer:
    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        lenient: bool,
        constants: Mapping[str, torch.Tensor] | None,
        symbolic: bool = False,
        written: Written | None = None,
        reuse: Written | None = None,
    ) -> None:
        self.gm = gm
        self.written = written  # entries recorded for the documents of regions
        self.reuse = reuse  # entries recorded by the document of the whole graph
        self.portable = True  # the entry being written refers to values by name only
        # A symbolic document's size symbols; None: every size must be concrete.
        self.sizes = SizeSymbols() if symbolic else None
        # Parameters bound from an input's values when the program is launched: a grouped
        # GEMM's row ends, the offsets (name -> symbol entry with "element_of").
        self.value_symbols: dict[str, dict[str, Any]] = {}
        self.name = name
        self.lenient = lenient
        self.constant_inputs = dict(constants or {})
        self.inputs: list[dict[str, Any]] = []
        self.extra_inputs: list[dict[str, Any]] = []  # unsupported nodes, in lenient mode
        self.constants: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = []
        self.outputs: list[Any] = []
        self.refs: dict[torch.fx.Node, Any] = {}  # node -> its JSON reference
        self.scalars: dict[torch.fx.Node, int | float | bool] = {}
        self.multi: set[torch.fx.Node] = set()  # written nodes with several results
        self.external_multi: set[torch.fx.Node] = set()  # unsupported nodes with several
        self.unsupported: dict[str, str] = {}
        self.numbers: dict[str, int | float | bool] = {}  # placeholders given as literals

    # -- values ----------------------------------------------------------------------------
    def encode(self, value: object) -> Any:
        if isinstance(value, torch.fx.Node):
            return self.encode_ref(value)
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return _float(value)
        if isinstance(value, (list, tuple)):
            return [self.encode(v) for v in value]
        if isinstance(value, torch.dtype):
            return {"dtype": _dtype_name(value)}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        if isinstance(value, (torch.memory_format, torch.layout)):
            return {"enum": str(value)}
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.encode_symbolic(value)
        raise _Unencodable(f"cannot encode argument of type {type(value).__name__}")

    def encode_symbolic(self, value: torch.SymInt | torch.SymFloat | torch.SymBool) -> Any:
        self.portable = False
        scalar = concrete_scalar(value)
        if scalar is not None:
            return self.encode(scalar)
        if self.sizes is not None and isinstance(value, torch.SymInt):
            return {"size": _size(self.sizes, value)}
        raise _Unencodable(f"symbolic value {value} (shapes must be specialized first)")

    def encode_ref(self, node: torch.fx.Node) -> Any:
        if node in self.refs:
            ref = self.refs[node]
            # A region refers to a getitem of another's result or to a constant by other
            # names (a placeholder, the constant inlined under a fresh name).
            if "index" in ref or node.op == "get_attr" or node.name in self.constant_inputs:
                self.portable = False
            return ref
        if node in self.scalars:
            self.portable = False
            return self.encode(self.scalars[node])
        if node in self.multi:
            raise _Unencodable(f"uses the tuple result of {node.name} as one value")
        raise _Unencodable(f"argument {node.name} is not a tensor the device can receive")

    # -- nodes -----------------------------------------------------------------------------
    def placeholder(self, node: torch.fx.Node) -> None:
        if node.name in self.numbers:
            self.scalars[node] = self.numbers[node.name]
            return
        if node.name in self.constant_inputs:
            self.add_constant(node, self.constant_inputs[node.name])
            return
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            try:
                self.inputs.append({"name": node.name, **tensor_spec(value, self.sizes)})
            except _Unencodable as e:
                self.fail(node, f"input {node.name}: {e}", external=False)
                return
            self.refs[node] = {"ref": node.name}
            return
        scalar = concrete_scalar(value)
        if scalar is not None:
            self.scalars[node] = scalar
        elif self.sizes is not None and isinstance(value, torch.SymInt):
            self.scalars[node] = value  # a size the call gives: written as its expression

    def add_constant(self, node: torch.fx.Node, value: object) -> None:
        if not isinstance(value, torch.Tensor):
            return  # submodules and other attributes: users referencing them are unsupported
        hit = self.reuse.constants.get(id(value)) if self.reuse is not None else None
        if hit is not None and hit[0] is value:
            self.constants.append({**hit[1], "name": node.name})
            self.refs[node] = {"ref": node.name}
            return
        try:
            entry = constant_entry(node.name, value)
        except _Unencodable as e:
            self.fail(node, f"constant {node.name}: {e}", external=False)
            return
        self.constants.append(entry)
        if self.written is not None:
            self.written.constants[id(value)] = (value, entry)
        self.refs[node] = {"ref": node.name}

    def call_function(self, node: torch.fx.Node) -> None:
        target = node.target
        if target is operator.getitem:
            self.getitem(node)
            return
        if target in SCALAR_TARGETS:
            value = node.meta.get("val")
            scalar = concrete_scalar(value)
            if scalar is not None:
                self.scalars[node] = scalar
                return
            if self.sizes is not None and isinstance(value, torch.SymInt):
                self.scalars[node] = value
                return
            self.fail(node, f"symbolic scalar {value} (not specialized)")
            return
        if flex.is_flex_attention(node):
            self.flex_attention(node)
            return
        if flex.is_flex_backward(node):
            self.flex_backward(node)
            return
        if sdpa.is_attention(node):
            self.attention(node)
            return
        if not isinstance(target, torch._ops.OpOverload):
            self.fail(node, f"{_target_name(target)} is not an ATen operator")
            return
        if target is torch.ops.aten._grouped_mm.default:
            self.grouped_mm_ends(node)
        reused = self.reuse.nodes.get(node.name) if self.reuse is not None else None
        if reused is not None and reused[0] == _argument_names(node):
            self.append_node(node, reused[1])
            return
        self.portable = self.sizes is None
        try:
            entry: dict[str, Any] = {
                "name": node.name,
                "target": str(target),
                "args": [self.encode(a) for a in node.args],
                "kwargs": {str(k): self.encode(v) for k, v in node.kwargs.items()},
                "outputs": _result_specs(node.meta.get("val"), self.sizes),
            }
            if collectives.is_collective(node):
                try:
                    entry["group"] = collectives.group_entry(node)
                except LookupError as e:
                    raise _Unencodable(str(e)) from None
        except _Unencodable as e:
            self.fail(node, str(e))
            return
        self.add_node(node, entry)
        if self.written is not None and self.portable:
            self.written.nodes[node.name] = (_argument_names(node), entry)

    def grouped_mm_ends(self, node: torch.fx.Node) -> None:
        """The parameters ``<offsets>__end<g>`` of a ``_grouped_mm`` whose offsets are an
        input: the importer's ``neuron.grouped_matmul`` counts each group's rows from them,
        and the call binds them from the offsets' values. Other offsets get none (the
        importer then says why it cannot take the node), except in the whole graph's check:
        offsets computed there become an input of the GEMM's region (the partitioner puts
        the GEMM in a region of its own)."""
        offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
        ref = self.refs.get(offs) if isinstance(offs, torch.fx.Node) else None
        if ref is None or "index" in ref:
            return
        name = ref["ref"]
        inputs = self.inputs + self.extra_inputs
        if not self.lenient and not any(i["name"] == name for i in inputs):
            return
        a, b = node.args[0], node.args[1]
        if not (_is_node(a) and _is_node(b)):
            return
        rows, groups = a.meta["val"].shape[0], b.meta["val"].shape[0]
        for g in range(int(groups)):
            symbol = f"{name}__end{g}"
            self.value_symbols[symbol] = {
                "name": symbol,
                "min": 0,
                "max": rows if isinstance(rows, int) else None,
                "element_of": [name, g],
            }

    def add_node(self, node: torch.fx.Node, entry: dict[str, Any]) -> None:
        loc = source_location(node.meta.get("stack_trace"))
        if loc is not None:
            entry["loc"] = loc
        self.append_node(node, entry)

    def append_node(self, node: torch.fx.Node, entry: dict[str, Any]) -> None:
        self.nodes.append(entry)
        if isinstance(node.meta.get("val"), (tuple, list)):
            self.multi.add(node)
        else:
            self.refs[node] = {"ref": node.name}

    def flex_attention(self, node: torch.fx.Node) -> None:
        """``flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options,
        score_mod_buffers, mask_mod_buffers)``: the modifiers as nested documents, the block
        classes (when :func:`flex.annotate` found them) as int8 bytes."""
        try:
            q, k, v, score_mod, block_mask, scale, options = node.args[:7]
            score_buffers, mask_buffers = (tuple(a) for a in node.args[7:9])  # type: ignore[arg-type]
            try:
                mask = flex.parse_block_mask(block_mask)  # type: ignore[arg-type]
            except ValueError as e:
                raise _Unencodable(str(e)) from None
            if isinstance(options, Mapping) and options.get("OUTPUT_MAX"):
                if any(u.target is operator.getitem and u.args[1] == 2 for u in node.users):
                    raise _Unencodable("the max-score output (OUTPUT_MAX) is not supported")
            entry = self.flex_entry(
                node,
                (q, k, v),
                scale,
                (mask.q_block, mask.kv_block),
                node.meta.get(BLOCKS_META),
                [b for b in score_buffers if _is_node(b)],
                [b for b in mask_buffers if _is_node(b)],
                self.subgraph(score_mod, "score_mod", 5, score_buffers),
                self.subgraph(mask.mask_mod, "mask_mod", 4, mask_buffers),
                _result_specs(node.meta.get("val"))[:2],
            )
        except _Unencodable as e:
            self.fail(node, str(e))
            return
        self.add_node(node, entry)

    def flex_backward(self, node: torch.fx.Node) -> None:
        """``flex_attention_backward(q, k, v, out, lse, grad_out, grad_lse, fw_graph,
        joint_graph, block_mask, scale, kernel_options, score_mod_buffers, mask_mod_buffers)
        -> (dq, dk, dv, buffer grads)``: like :meth:`flex_attention`, with the joint graph (the
        gradient of score_mod) as ``score_grad``."""
        try:
            q, k, v, out, lse, grad_out, grad_lse, fw_graph, joint, block_mask, scale = node.args[
                :11
            ]
            score_buffers, mask_buffers = (tuple(a) for a in node.args[12:14])  # type: ignore[arg-type]
            if grad_lse is not None:
                raise _Unencodable("a gradient of the log-sum-exp output is not supported")
            if any(u.target is operator.getitem and u.args[1] == 3 for u in node.users):
                raise _Unencodable("gradients of tensors captured by score_mod are not supported")
            try:
                mask = flex.parse_block_mask(block_mask)  # type: ignore[arg-type]
            except ValueError as e:
                raise _Unencodable(str(e)) from None
            score_grad = self.subgraph(joint, "score_grad", 6, score_buffers)
            # The joint graph returns the score's gradient, then None for the indices.
            if any(o is not None for o in score_grad["outputs"][1:]):
                raise _Unencodable("score_grad returns gradients of the indices")
            score_grad["outputs"] = score_grad["outputs"][:1]
            entry = self.flex_entry(
                node,
                (q, k, v, out, lse, grad_out),
                scale,
                (mask.q_block, mask.kv_block),
                node.meta.get(BLOCKS_META),
                [b for b in score_buffers if _is_node(b)],
                [b for b in mask_buffers if _is_node(b)],
                self.subgraph(fw_graph, "score_mod", 5, score_buffers),
                self.subgraph(mask.mask_mod, "mask_mod", 4, mask_buffers),
                _result_specs(tuple(node.meta.get("val") or ())[:3]),
            )
        except _Unencodable as e:
            self.fail(node, str(e))
            return
        entry["target"] = "higher_order.flex_attention_backward"
        entry["score_grad"] = score_grad
        self.add_node(node, entry)

    def attention(self, node: torch.fx.Node) -> None:
        """An SDPA call (:mod:`torchneuron.sdpa`) as the FlexAttention node computing it:
        ``torchneuron::attention`` (its log-sum-exp output is left unused), ``attention_fwd``
        (out and the base-2 log-sum-exp, as ``flex_attention``) or ``attention_bwd``
        (``flex_attention_backward`` of its query, key, value, out, lse and grad_out)."""
        try:
            try:
                form = sdpa.flex_form(node)
            except Exception as e:  # a counted fallback to eager SDPA, never a crash
                raise _Unencodable(f"SDPA call not expressible as FlexAttention: {e}") from None
            backward = node.target is sdpa.ATTENTION_BWD
            if backward:
                outputs = _result_specs(node.meta.get("val"))
                tensors = (*node.args[:3], *node.args[7:10])
            else:
                out = tensor_spec(_first(node.meta.get("val")), self.sizes)
                outputs = [out, {"dtype": "float32", "shape": out["shape"][:-1]}]
                tensors = node.args[:3]
            entry = self.flex_entry(
                node,
                tensors,
                form.scale,
                (unit(), unit()),
                form.blocks,
                list(form.score_buffers),
                list(form.mask_buffers),
                self.module_doc(form.score_mod, "score_mod", 5, form.score_buffers),
                self.module_doc(form.mask_mod, "mask_mod", 4, form.mask_buffers),
                outputs,
            )
            if backward:
                entry["target"] = "higher_order.flex_attention_backward"
                entry["score_grad"] = self.module_doc(
                    form.score_grad, "score_grad", 6, form.score_buffers
                )
        except _Unencodable as e:
            self.fail(node, str(e))
            return
        self.add_node(node, entry)

    def flex_entry(
        self,
        node: torch.fx.Node,
        qkv: Sequence[object],
        scale: object,
        block_size: tuple[int, int],
        blocks: torch.Tensor | None,
        score_buffers: list[object],
        mask_buffers: list[object],
        score_mod: dict[str, Any],
        mask_mod: dict[str, Any],
        outputs: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """A ``higher_order.flex_attention`` document node."""
        return {
            "name": node.name,
            "target": "higher_order.flex_attention",
            "args": [self.encode(t) for t in qkv],
            "kwargs": {
                "scale": self.encode(scale),
                "block_size": list(block_size),
                "blocks": None
                if blocks is None
                else {
                    "shape": list(blocks.shape),
                    "data": base64.b64encode(blocks.numpy().tobytes()).decode("ascii"),
                },
                "score_buffers": [self.encode(b) for b in score_buffers],
                "mask_buffers": [self.encode(b) for b in mask_buffers],
            },
            "score_mod": score_mod,
            "mask_mod": mask_mod,
            "outputs": outputs,
        }

    def subgraph(
        self, attr: object, what: str, indices: int, buffers: tuple[object, ...]
    ) -> dict[str, Any]:
        """A ``get_attr`` submodule (a FlexAttention modifier) as a nested document."""
        if not isinstance(attr, torch.fx.Node) or attr.op != "get_attr":
            raise _Unencodable(f"{what} is not a traced subgraph")
        sub = fetch_attr(self.gm, str(attr.target))
        if not isinstance(sub, torch.fx.GraphModule):
            raise _Unencodable(f"{what} is not a traced subgraph")
        return self.module_doc(sub, what, indices, buffers)

    def module_doc(
        self, sub: torch.fx.GraphModule, what: str, indices: int, buffers: tuple[object, ...]
    ) -> dict[str, Any]:
        """A FlexAttention modifier graph as a nested document. Its placeholders are
        ``indices`` index scalars, then one per buffer; a buffer that is a number (a
        specialized closure variable) becomes a literal."""
        placeholders = sub.graph.find_nodes(op="placeholder")
        if len(placeholders) != indices + len(buffers):
            raise _Unencodable(
                f"{what} takes {len(placeholders)} arguments, not "
                f"{indices} indices and {len(buffers)} buffers"
            )
        writer = _Writer(sub, what, lenient=False, constants=None)
        for node, buffer in zip(placeholders[indices:], buffers, strict=True):
            if not _is_node(buffer):
                scalar = concrete_scalar(buffer)
                if scalar is None:
                    raise _Unencodable(f"{what} captures {buffer!r}, not a tensor or number")
                writer.numbers[node.name] = scalar
        try:
            doc = writer.run()
        except UnsupportedNodeError as e:
            raise _Unencodable(f"{what}: {e}") from None
        return {key: doc[key] for key in ("inputs", "constants", "nodes", "outputs")}

    def getitem(self, node: torch.fx.Node) -> None:
        source, index = node.args[0], node.args[1]
        if not isinstance(source, torch.fx.Node) or not isinstance(index, int):
            self.fail(node, "getitem on a value that is not an operator result")
            return
        if source in self.multi:
            self.refs[node] = {"ref": source.name, "index": index}
        elif source in self.external_multi:
            self.make_external(node)
        # Otherwise the source is unsupported: users of this getitem fail when they encode it.

    def fail(self, node: torch.fx.Node, reason: str, *, external: bool = True) -> None:
        if not self.lenient:
            raise UnsupportedNodeError(node.name, reason)
        if node.op == "call_function":
            self.unsupported[node.name] = reason
        if external:
            self.make_external(node)

    def make_external(self, node: torch.fx.Node) -> None:
        """Lenient mode: an unsupported node's results reach the device as graph inputs."""
        value = node.meta.get("val")
        if isinstance(value, (tuple, list)):
            self.external_multi.add(node)
            return
        try:
            spec = tensor_spec(value, self.sizes)
        except _Unencodable:
            return
        self.extra_inputs.append({"name": node.name, **spec})
        self.refs[node] = {"ref": node.name}

    def output(self, node: torch.fx.Node) -> None:
        results = node.args[0]
        values = results if isinstance(results, (tuple, list)) else (results,)
        for value in values:
            try:
                self.outputs.append(self.encode(value))
            except _Unencodable as e:
                if not self.lenient:
                    raise UnsupportedNodeError("output", str(e)) from None

    def run(self) -> dict[str, Any]:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node)
            elif node.op == "get_attr":
                self.add_constant(node, fetch_attr(self.gm, str(node.target)))
            elif node.op == "call_function":
                self.call_function(node)
            elif node.op == "output":
                self.output(node)
            else:
                self.fail(node, f"{node.op} nodes are not supported")
        doc: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "inputs": self.inputs + self.extra_inputs,
            "constants": self.constants,
            "nodes": self.nodes,
            "outputs": self.outputs,
        }
        symbols = self.sizes.entries() if self.sizes is not None else []
        symbols += list(self.value_symbols.values())
        if symbols:
            doc["symbols"] = symbols
        return doc


def _is_node(value: object) -> bool:
    return isinstance(value, torch.fx.Node)


def concrete_scalar(value: object) -> int | float | bool | None:
    """A Python number for a concrete int/float/bool or constant Sym value, else None."""
    if isinstance(value, (bool, int, float)):
        return value
    if (
        isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))
        and value.node.is_constant()
    ):
        if isinstance(value, torch.SymInt):
            return int(value)
        return float(value) if isinstance(value, torch.SymFloat) else bool(value)
    return None


def _target_name(target: object) -> str:
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher-order op {target.name()}"  # type: ignore[no-untyped-call]
    name = getattr(target, "__name__", None)
    module = getattr(target, "__module__", None)
    return f"{module}.{name}" if module and name else repr(target)


def serialize_graph(
    gm: torch.fx.GraphModule,
    name: str = "graph_0",
    *,
    constants: Mapping[str, torch.Tensor] | None = None,
    symbolic: bool = False,
    reuse: Written | None = None,
) -> dict[str, Any]:
    """The document for ``gm``; raises :class:`UnsupportedNodeError` on the first node the
    format cannot express. ``constants`` turns the placeholders it names into constants;
    ``symbolic`` writes symbolic sizes as size expressions instead of refusing them; ``reuse``
    (``gm`` is a region of the graph that wrote it) gives the entries of nodes and constants
    already written."""
    writer = _Writer(gm, name, lenient=False, constants=constants, symbolic=symbolic, reuse=reuse)
    return writer.run()


def serialize_graph_lenient(
    gm: torch.fx.GraphModule,
    name: str = "graph_0",
    *,
    symbolic: bool = False,
    written: Written | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """A document for the importer's checker plus ``{node name: reason}`` for the nodes it
    leaves out. Left-out nodes whose results are tensors appear as extra inputs, so their
    users can still be checked. ``written`` receives the entries the documents of ``gm``'s
    regions can reuse."""
    writer = _Writer(gm, name, lenient=True, constants=None, symbolic=symbolic, written=written)
    return writer.run(), writer.unsupported


def to_json(doc: Mapping[str, Any], *, indent: int | None = None) -> str:
    """The document as JSON text (never NaN/Infinity literals)."""
    return json.dumps(doc, allow_nan=False, indent=indent)
