"""FlexAttention: reading the ``flex_attention`` higher-order op and its BlockMask.

Under ``aot_autograd`` a ``flex_attention(q, k, v, score_mod=..., block_mask=...)`` call stays
one ``torch.ops.higher_order.flex_attention`` node whose ``score_mod``/``mask_mod`` are ATen
subgraphs. The device kernel skips the key blocks the BlockMask leaves out and applies
``mask_mod`` only on partial blocks, so the block structure must be known when the kernel is
compiled: the backend compiles one kernel per distinct BlockMask it is called with
(:class:`BlockMaskValues`), after :func:`annotate` has stored each node's block classes in
``node.meta``; the BlockMask tensors then no longer reach the device
(:func:`detach_block_masks`).

SDPA calls routed to the same kernel (:mod:`torchneuron.sdpa`) with a tensor ``attn_mask`` get
their block classes the same way: computed from the mask each call, one kernel per block
structure.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from torchneuron import sdpa
from torchneuron.attention_blocks import BLOCKS_META, MASK_FORM_META
from torchneuron.attention_blocks import block_classes as block_class_codes

__all__ = [
    "BlockMaskArgs",
    "BlockMaskValues",
    "annotate",
    "block_classes",
    "call_dependent",
    "detach_block_masks",
    "allow_training",
    "block_mask_of",
    "flex_nodes",
    "is_flex",
    "is_flex_attention",
    "is_flex_backward",
    "parse_block_mask",
]

#: Position of the BlockMask tuple in the arguments of each FlexAttention higher-order op.
_BLOCK_MASK_ARG = {"flex_attention": 4, "flex_attention_backward": 9}


def _hop_name(node: torch.fx.Node) -> str | None:
    target = node.target
    if node.op == "call_function" and isinstance(target, torch._ops.HigherOrderOperator):
        return str(target.name())  # type: ignore[no-untyped-call]
    return None


def is_flex_attention(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls the ``flex_attention`` higher-order op."""
    return _hop_name(node) == "flex_attention"


def is_flex_backward(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls ``flex_attention_backward`` (in ``aot_autograd``'s backward
    graphs)."""
    return _hop_name(node) == "flex_attention_backward"


def is_flex(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a FlexAttention forward or backward call."""
    return _hop_name(node) in _BLOCK_MASK_ARG


def flex_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if is_flex(n)]


def block_mask_of(node: torch.fx.Node) -> Sequence[object]:
    """The BlockMask tuple a FlexAttention forward or backward node was called with."""
    return node.args[_BLOCK_MASK_ARG[str(_hop_name(node))]]  # type: ignore[return-value]


def allow_training() -> None:
    """Let FlexAttention with inputs that require grad through ``torch.compile`` on CPU tensors.

    ``flex_attention``'s Python wrapper refuses CPU tensors that require grad ("FlexAttention
    does not support backward on CPU"), and Dynamo runs that check while tracing, before any
    backend sees the graph. This replaces the check with one that skips the CPU refusal while
    Dynamo compiles (the backward then reaches the backend as ``flex_attention_backward`` and
    runs on the device); eager calls keep torch's check unchanged. Called by
    :func:`torchneuron.set_default_backend`; idempotent."""
    import torch.nn.attention.flex_attention as fa

    original = fa._validate_device
    if getattr(original, "_torchneuron", False):
        return

    def validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if torch.compiler.is_dynamo_compiling() and query.device.type == "cpu":
            return
        original(query, key, value)

    validate_device._torchneuron = True  # type: ignore[attr-defined]
    fa._validate_device = validate_device


def _masked_attention(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """``(node, attn_mask node)`` of each routed SDPA call with a tensor mask."""
    return [
        (n, n.args[3])
        for n in gm.graph.nodes
        if sdpa.is_attention(n) and isinstance(n.args[3], torch.fx.Node)
    ]


#: Suffix of the name under which :class:`BlockMaskValues` keeps an SDPA mask's form.
_FORM = "/form"


def _lengths(node: torch.fx.Node) -> tuple[int, int]:
    """The query and key lengths of a routed SDPA call (static where it has a mask)."""
    query, key = node.args[0], node.args[1]
    assert isinstance(query, torch.fx.Node) and isinstance(key, torch.fx.Node)
    return int(query.meta["val"].shape[-2]), int(key.meta["val"].shape[-2])


def call_dependent(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm``'s kernels depend on tensor contents of each call: a FlexAttention
    BlockMask or an SDPA mask (block classes are part of the program)."""
    return bool(flex_nodes(gm) or _masked_attention(gm))


@dataclass(frozen=True)
class BlockMaskArgs:
    """The parts of a BlockMask tuple the device kernel uses (tensors as graph nodes). Its
    sequence lengths are not among them: they may be symbolic (a graph Dynamo traced with
    dynamic sizes), and each call's come from its query and key."""

    kv_num_blocks: object
    kv_indices: object
    full_kv_num_blocks: object | None
    full_kv_indices: object | None
    q_block: int
    kv_block: int
    mask_mod: object

    def tensors(self) -> tuple[object, ...]:
        return (self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks, self.full_kv_indices)


# Known layouts of BlockMask.as_tuple() by length. torch 2.13 writes 17 entries:
# (Q_LEN, KV_LEN, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks,
#  q_indices, full_q_num_blocks, full_q_indices, four dq_* schedule entries, Q_BLOCK_SIZE,
#  KV_BLOCK_SIZE, mask_mod); 2.6-2.12 wrote the first ten, the block sizes and mask_mod (13).
_LAYOUTS = {17: 2, 13: 2}


def parse_block_mask(block_mask: Sequence[object]) -> BlockMaskArgs:
    """The BlockMask tuple of a ``flex_attention`` node; ``ValueError`` naming the torch
    version when its layout is not one this backend knows."""
    first_tensor = _LAYOUTS.get(len(block_mask))
    problem = None
    if first_tensor is None:
        problem = f"{len(block_mask)} entries"
    else:
        q_block, kv_block = block_mask[-3], block_mask[-2]
        if not all(isinstance(v, int) for v in (q_block, kv_block)):
            problem = "block sizes are not integers"
    if problem is not None:
        raise ValueError(
            f"unknown FlexAttention BlockMask layout ({problem}) in torch {torch.__version__}; "
            "torchneuron reads the layouts of torch 2.6 to 2.13"
        )
    t = block_mask[first_tensor : first_tensor + 4]
    return BlockMaskArgs(
        kv_num_blocks=t[0],
        kv_indices=t[1],
        full_kv_num_blocks=t[2],
        full_kv_indices=t[3],
        q_block=int(q_block),  # type: ignore[call-overload]
        kv_block=int(kv_block),  # type: ignore[call-overload]
        mask_mod=block_mask[-1],
    )


def block_classes(
    mask: BlockMaskArgs, tensors: Sequence[torch.Tensor | None], q_len: int, kv_len: int
) -> torch.Tensor:
    """``int8 [B or 1, H or 1, query blocks, key blocks]``: masked, partial or full per block
    (:func:`~torchneuron.attention_blocks.block_classes`), from the BlockMask's real
    ``kv_num_blocks``/``kv_indices`` (and ``full_*``) tensors."""
    kv_num, kv_idx, full_num, full_idx = tensors
    assert kv_num is not None and kv_idx is not None
    n_q = -(-q_len // mask.q_block)
    n_kv = -(-kv_len // mask.kv_block)
    if kv_num.dim() != 3 or kv_idx.dim() != 4 or kv_num.shape[-1] < n_q:
        raise ValueError(
            f"BlockMask with {tuple(kv_num.shape)} block counts does not cover {q_len} query "
            f"rows in blocks of {mask.q_block}"
        )
    codes = block_class_codes()
    classes = torch.full((*kv_num.shape[:2], n_q, n_kv + 1), codes.masked, dtype=torch.int8)

    def mark(num: torch.Tensor, idx: torch.Tensor, value: int) -> None:
        num, idx = num[..., :n_q].long(), idx[..., :n_q, :].long()
        listed = torch.arange(idx.shape[-1]) < num.unsqueeze(-1)
        valid = listed & (idx >= 0) & (idx < n_kv)
        classes.scatter_(-1, torch.where(valid, idx, n_kv), value)

    mark(kv_num, kv_idx, codes.partial)
    if full_num is not None and full_idx is not None:
        mark(full_num, full_idx, codes.full)
    return classes[..., :n_kv].contiguous()


class BlockMaskValues:
    """Evaluates the BlockMask tensors of a graph's flex nodes for one call: graph inputs are
    read, tensors computed in the graph (``create_block_mask`` traced with the model, or the
    default mask of ``block_mask=None``) are computed from the call's inputs in eager PyTorch,
    once when they depend on no input. The masks of routed SDPA calls are evaluated the same
    way and reduced to their block classes (:func:`torchneuron.sdpa.mask_block_classes`)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        wanted: list[torch.fx.Node] = []
        for node in flex_nodes(gm):
            try:
                mask = parse_block_mask(block_mask_of(node))
            except ValueError:
                continue  # the node stays in eager PyTorch, counted, with the reason (fx_json)
            wanted += [t for t in mask.tensors() if isinstance(t, torch.fx.Node)]
        self.attention_masks = _masked_attention(gm)
        wanted += [m for _, m in self.attention_masks]
        needed: set[torch.fx.Node] = set()
        stack = list(wanted)
        while stack:
            n = stack.pop()
            if n not in needed:
                needed.add(n)
                stack.extend(n.all_input_nodes)
        self.nodes = [n for n in gm.graph.nodes if n in needed]
        self.wanted = wanted
        self.constant = not any(n.op == "placeholder" for n in self.nodes)
        self.cached: dict[str, torch.Tensor] | None = None
        self.structures: set[Hashable] = set()  # SDPA mask block structures compiled for

    def __call__(self, args: Sequence[object]) -> dict[str, torch.Tensor]:
        """``{node name: tensor}`` for every BlockMask tensor node, and ``{SDPA node name:
        block classes}`` for every routed SDPA call with a mask. After
        :data:`~torchneuron.sdpa.MAX_MASK_STRUCTURES` distinct block structures, a mask with
        yet another one gets no entry: its kernel treats every block as partial (correct for
        any mask), so masks that change their structure every call stop compiling kernels."""
        if self.cached is not None:
            return self.cached
        inputs = iter(args)
        env: dict[torch.fx.Node, object] = {}
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(inputs)
            elif node.op == "get_attr" and node in self.nodes:
                env[node] = operator.attrgetter(str(node.target))(self.gm)
            elif node in self.nodes:
                args_ = torch.fx.node.map_arg(node.args, env.__getitem__)
                kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
                env[node] = node.target(*args_, **kwargs)  # type: ignore[operator]
        values = {n.name: v for n in self.wanted if isinstance(v := env[n], torch.Tensor)}
        for node, mask in self.attention_masks:
            values.pop(mask.name, None)
            value = env[mask]
            assert isinstance(value, torch.Tensor)
            classes = sdpa.mask_block_classes(value)
            form = sdpa.mask_form(value, *_lengths(node))
            structure = (node.name, tuple(classes.shape), classes.numpy().tobytes(), form)
            if structure not in self.structures:
                if len(self.structures) >= sdpa.MAX_MASK_STRUCTURES:
                    continue
                self.structures.add(structure)
            values[node.name] = classes
            values[node.name + _FORM] = torch.tensor(form, dtype=torch.int8)
        if self.constant:
            self.cached = values
        return values

    def key(self, values: dict[str, torch.Tensor]) -> Hashable:
        """What selects a kernel besides sizes: the BlockMask tensors' contents (the block
        classes of SDPA masks)."""
        return tuple(
            (name, tuple(t.shape), t.detach().to("cpu").contiguous().numpy().tobytes())
            for name, t in sorted(values.items())
        )


def annotate(gm: torch.fx.GraphModule, values: dict[str, torch.Tensor]) -> None:
    """Store the block classes of each flex node of ``gm`` whose BlockMask tensors are in
    ``values`` (by node name), and of each routed SDPA call whose mask's classes are."""
    for node, _ in _masked_attention(gm):
        if node.name in values:
            node.meta[BLOCKS_META] = sdpa.expand_block_classes(values[node.name], *_lengths(node))
            node.meta[MASK_FORM_META] = int(values[node.name + _FORM])
    for node in flex_nodes(gm):
        try:
            mask = parse_block_mask(block_mask_of(node))
        except ValueError:
            continue  # as in BlockMaskValues
        tensors = [
            values.get(t.name) if isinstance(t, torch.fx.Node) else None for t in mask.tensors()
        ]
        if tensors[0] is None or tensors[1] is None or (tensors[2] is None) != (tensors[3] is None):
            continue
        query, key = node.args[0], node.args[1]
        assert isinstance(query, torch.fx.Node) and isinstance(key, torch.fx.Node)
        q_len = int(query.meta["val"].shape[-2])
        kv_len = int(key.meta["val"].shape[-2])
        node.meta[BLOCKS_META] = block_classes(mask, tensors, q_len, kv_len)  # type: ignore[arg-type]


def detach_block_masks(gm: torch.fx.GraphModule, unsupported: Collection[str]) -> None:
    """Flex nodes going to the device with known block classes no longer read their
    BlockMask tensors: drop them from the node, so the code computing them goes too."""
    changed = False
    for node in flex_nodes(gm):
        if node.name in unsupported or BLOCKS_META not in node.meta:
            continue
        block_mask = tuple(block_mask_of(node))
        stripped = tuple(
            None if isinstance(v, torch.fx.Node) and i < len(block_mask) - 1 else v
            for i, v in enumerate(block_mask)
        )
        at = _BLOCK_MASK_ARG[str(_hop_name(node))]
        node.args = (*node.args[:at], stripped, *node.args[at + 1 :])
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
