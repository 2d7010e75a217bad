"""The Python front end: an ATen graph to the FX documents of its device regions, in named
steps applied in a fixed order, :data:`STEPS` (docs/ARCHITECTURE.md lists the same). Each step
is a function of a graph:

1. ``specialize-sizes``, per call, graphs with symbolic sizes that do not compile size-generic
   (:func:`torchneuron.backend.build_generic_graph` runs steps 3-14 with the symbols kept): the
   call's sizes (:func:`torchneuron.specialize.specialize`, in :func:`specialize_call`).
2. ``block-classes``, per call, graphs with a BlockMask or SDPA mask: each attention node's block
   classes in ``node.meta`` (:func:`torchneuron.flex.annotate`, in :func:`specialize_call`).
3. ``random-ops``: :func:`torchneuron.rng.seed_random_ops`.
4. ``values-only-factorizations``: :func:`torchneuron.linalg.values_only_factorizations`.
5. ``complex-as-pairs``: :func:`torchneuron.complex_math.complex_as_pairs`.
6. ``as-strided-views``: :func:`torchneuron.rewrite.as_strided_views`.
7. ``float32-scalar-inputs``: :func:`torchneuron.rewrite.float32_scalar_inputs`.
8. ``float64-in-float32``: :func:`torchneuron.rewrite.float64_in_float32`.
9. ``grouped-mm-offsets``: :func:`torchneuron.rewrite.grouped_mm_offsets`.
10. ``unsort-by-scatter``: :func:`torchneuron.rewrite.unsort_by_scatter`.
11. ``check``: which nodes the importer lowers (:func:`torchneuron.partition.find_unsupported`:
   the whole graph leniently serialized for ``_C.check_graph``, each node once: the entries
   are kept for step 14, :class:`torchneuron.fx_json.Written`).
12. ``detach-block-masks``: attention nodes going to the device with known block classes drop
   their BlockMask tensors (:func:`torchneuron.flex.detach_block_masks`).
13. ``partition``: device regions become submodules, the rest stays eager
   (:func:`torchneuron.partition.partition_graph`).
14. ``serialize``: per region, its outputs deduplicated (:func:`dedupe_outputs`) and its document
   assembled from the nodes and constants step 11 wrote, writing only what it could not reuse
   (:func:`torchneuron.fx_json.serialize_graph`; SDPA calls in their FlexAttention form,
   :func:`torchneuron.sdpa.flex_form`).

Steps 3-10 are :data:`REWRITES` (:func:`rewrite_graph`); :func:`lower` runs steps 3-14 on a copy of
a static graph, and the backend compiles each region's document
(:func:`torchneuron.backend.build_graph`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchneuron import complex_math, flex, fx_json, linalg, partition, rewrite, rng, specialize

__all__ = [
    "REWRITES",
    "STEPS",
    "Lowered",
    "Region",
    "Rewrite",
    "dedupe_outputs",
    "lower",
    "rewrite_graph",
    "serialize_region",
    "specialize_call",
]


@dataclass(frozen=True)
class Rewrite:
    """A named FX rewrite: changes a graph in place and returns how many nodes it rewrote."""

    name: str
    run: Callable[[torch.fx.GraphModule], int]


#: The rewrites every graph goes through before the check, in this order: random ops first (a
#: seeded random op is then an ordinary device op), then the nodes whose meaning the document
#: does not carry.
REWRITES: tuple[Rewrite, ...] = (
    Rewrite("random-ops", rng.seed_random_ops),
    Rewrite("values-only-factorizations", linalg.values_only_factorizations),
    Rewrite("complex-as-pairs", complex_math.complex_as_pairs),
    Rewrite("as-strided-views", rewrite.as_strided_views),
    Rewrite("float32-scalar-inputs", rewrite.float32_scalar_inputs),
    Rewrite("float64-in-float32", rewrite.float64_in_float32),
    Rewrite("grouped-mm-offsets", rewrite.grouped_mm_offsets),
    Rewrite("unsort-by-scatter", rewrite.unsort_by_scatter),
)

#: Every step's name, in the order the front end applies them (the module docstring says what
#: each does).
STEPS: tuple[str, ...] = (
    "specialize-sizes",
    "block-classes",
    *(r.name for r in REWRITES),
    "check",
    "detach-block-masks",
    "partition",
    "serialize",
)


def specialize_call(
    gm: torch.fx.GraphModule, args: Sequence[object], masks: dict[str, torch.Tensor]
) -> torch.fx.GraphModule:
    """Steps ``specialize-sizes`` and ``block-classes``: a copy of ``gm`` for one call's
    ``args`` (its sizes, when ``gm`` has symbolic ones) with the block classes of ``masks``
    (:class:`torchneuron.flex.BlockMaskValues` of the call) on its attention nodes."""
    if specialize.is_static(gm):
        specialized = specialize.copy_graph_module(gm)
    else:
        specialized = specialize.specialize(gm, args)
    flex.annotate(specialized, masks)
    return specialized


def rewrite_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Steps 3-10: :data:`REWRITES` applied to ``gm`` in order (in place); returns ``gm``."""
    for step in REWRITES:
        step.run(gm)
    return gm


@dataclass
class Region:
    """A device region: its submodule in the outer graph and its document."""

    submodule: str
    document: dict[str, Any]
    returns_tuple: bool
    output_map: list[int] | None  # see dedupe_outputs


@dataclass
class Lowered:
    """The front end's result: the rewritten outer graph (device regions are submodules,
    compiled by the caller), each region's document, and what stays eager."""

    module: torch.fx.GraphModule
    regions: list[Region]
    ops_on_device: int
    fallback: list[partition.FallbackNode]


def lower(
    gm: torch.fx.GraphModule,
    name: Callable[[str], str],
    stage: Callable[[str], None] = lambda _: None,
    *,
    symbolic: bool = False,
) -> Lowered:
    """Steps 3-13 on a copy of the static graph ``gm`` (``gm`` is unchanged). ``name(prefix)``
    names each document (the check's, then each region's, in order); ``stage`` hears which
    step runs (a long compile's progress). ``symbolic``: ``gm`` keeps its symbolic sizes,
    written as size expressions (a size-generic compile, :mod:`torchneuron.sizes`)."""
    stage("checking which ops the device runs")
    work = rewrite_graph(specialize.copy_graph_module(gm))
    written = fx_json.Written()
    unsupported = partition.find_unsupported(
        work, name=name("check"), symbolic=symbolic, written=written
    )
    flex.detach_block_masks(work, unsupported)
    stage("partitioning")
    result = partition.partition_graph(work, unsupported)
    regions = [
        serialize_region(work, sub, name("graph"), symbolic=symbolic, reuse=written)
        for sub in result.device_submodules
    ]
    return Lowered(work, regions, result.ops_on_device, result.fallback)


def serialize_region(
    gm: torch.fx.GraphModule,
    submodule: str,
    name: str,
    *,
    symbolic: bool = False,
    reuse: fx_json.Written | None = None,
) -> Region:
    """Step 11 for one device region of a partitioned ``gm``: its document, named ``name``,
    reusing the entries ``reuse`` holds (step 11's)."""
    sub = gm.get_submodule(submodule)
    assert isinstance(sub, torch.fx.GraphModule)
    output_map = dedupe_outputs(sub)
    try:
        doc = fx_json.serialize_graph(sub, name=name, symbolic=symbolic, reuse=reuse)
    except fx_json.UnsupportedNodeError as e:
        raise RuntimeError(
            f"torchneuron internal error: device region {submodule} passed the check but "
            f"cannot be serialized: {e}"
        ) from e
    returns_tuple = isinstance(sub.graph.output_node().args[0], (tuple, list))
    return Region(submodule, doc, returns_tuple, output_map)


def dedupe_outputs(sub: torch.fx.GraphModule) -> list[int] | None:
    """Make a region return each of its values once: a value returned twice, directly or
    through ``aten.alias`` (aot_autograd's forward returns an alias of each output it also
    saves for the backward), would otherwise be written into two buffers, one more full copy
    on the device. Returns, per original output, its index among the kept ones; None when
    nothing repeats."""

    def root(value: Any) -> Any:
        while isinstance(value, torch.fx.Node) and value.target is torch.ops.aten.alias.default:
            value = value.args[0]
        return value

    output = sub.graph.output_node()
    values = output.args[0]
    if not isinstance(values, (tuple, list)):
        return None
    kept: list[Any] = []
    first: dict[torch.fx.Node, int] = {}
    index: list[int] = []
    for value in values:
        base = root(value)
        if isinstance(base, torch.fx.Node) and base in first:
            index.append(first[base])
            continue
        if isinstance(base, torch.fx.Node):
            first[base] = len(kept)
        index.append(len(kept))
        kept.append(value)
    if len(kept) == len(values):
        return None
    output.args = (tuple(kept),)
    sub.recompile()
    return index
