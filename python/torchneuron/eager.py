"""Eager ops on neuron tensors as device kernels: the compiler side of the device's kernel
provider (``runtime/device/KernelProvider.h``).

The device library keys every eager call that reaches its fallback by the operator and the
arguments' dtypes, sizes and strides (and the values of non-tensor arguments), and asks
:func:`provide` once per key. The answer is the program of the op compiled by the
``torch.compile`` pipeline, or None (the op stays a counted CPU fallback). The device keeps the
answer in memory, so a second call with the same key costs a lookup and the run, with no Python.

How an op becomes a kernel: a mutating overload (``add.out``, ``add_.Tensor``) is replaced by
its functional overload (``add.Tensor``), whose results the device writes into the mutated
arguments (batch norm in training: ``_native_batch_norm_legit_functional``, whose new running
statistics the device writes into the module's buffers); the functional op is traced with
``make_fx`` under the backend's decompositions
(:func:`torchneuron.decompositions.neuron_decompositions`) on tensors of the call's sizes and
dtypes, checked with ``_C.check_graph`` (any op the importer rejects: no kernel) and compiled
with ``_C.compile_graph``. Inputs reach the kernel contiguous; CPU 0-d tensors (Python numbers
that PyTorch wrapped) are kernel inputs too, float64 ones as float32; tensor lists (``cat``)
are one input per element, and so are the tensors of a ``Tensor?[]`` (advanced indexing's
indices; its Nones stay in the traced call).

Random ops (dropout, ``rand``, ``uniform_``, ``bernoulli_``, ``normal_``) draw their numbers with
the device's Philox ``rand`` instruction (:mod:`torchneuron.rng`): the kernel takes a seed input
that the device fills on every run from the op's generator (or the device's default generator,
which ``torch.manual_seed`` seeds), so runs are reproducible and every run draws new numbers.

Not provided (CPU fallback): other random ops (``exponential_``, ``multinomial``), ops taking
devices, layouts or memory formats, ops that mutate an argument other than ``out=`` or ``self``
of an in-place op, results that are None, and anything the importer does not lower.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Provided",
    "counts",
    "enabled",
    "install",
    "provide",
    "record",
    "record_transfer",
    "rejected",
    "set_enabled",
]

log = logging.getLogger("torchneuron")

# torch's ScalarType enumeration (c10/core/ScalarType.h): how a dtype argument reaches us.
_SCALAR_TYPES: dict[int, torch.dtype] = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    11: torch.bool,
    15: torch.bfloat16,
}

_lock = threading.Lock()
# Kernels handed to the device, by the id the device passes back to :func:`record`.
_kernels: list[tuple[Any, str]] = []
# Why ops were not provided: "aten.op.overload" -> reason (the latest one).
_rejected: dict[str, str] = {}
_names: Counter[str] = Counter()


class _Reject(Exception):
    pass


def _aten(name: str) -> Any:
    return getattr(torch.ops.aten, name)


def _scalar_forms() -> dict[Any, tuple[str, Any]]:
    """Functional ops whose float ``Scalar`` argument becomes a kernel input: (argument, the
    op written with that argument as a 0-d tensor)."""
    add, sub, mul, div = (_aten(n).Tensor for n in ("add", "sub", "mul", "div"))
    return {
        _aten("addcdiv").default: (
            "value",
            lambda self, tensor1, tensor2, value: add(self, mul(div(tensor1, tensor2), value)),
        ),
        _aten("addcmul").default: (
            "value",
            lambda self, tensor1, tensor2, value: add(self, mul(mul(tensor1, tensor2), value)),
        ),
        _aten("add").Tensor: ("alpha", lambda self, other, alpha: add(self, mul(other, alpha))),
        _aten("sub").Tensor: ("alpha", lambda self, other, alpha: sub(self, mul(other, alpha))),
        _aten("lerp").Scalar: (
            "weight",
            lambda self, end, weight: _aten("lerp").Tensor(self, end, weight),
        ),
        _aten("mul").Scalar: ("other", lambda self, other: mul(self, other)),
        _aten("div").Scalar: ("other", lambda self, other: div(self, other)),
        _aten("add").Scalar: (
            "other",
            lambda self, other, alpha: add(self, other, alpha=alpha),
        ),
    }


_SCALAR_FORMS = _scalar_forms()


def _random_forms() -> dict[Any, Any]:
    """Random ops written with ``rand_like``, which becomes the device's Philox numbers."""

    def uniform(self: torch.Tensor, **kw: Any) -> torch.Tensor:
        low, high = kw.get("from", 0.0), kw.get("to", 1.0)
        return torch.rand_like(self) * (high - low) + low

    def bernoulli(self: torch.Tensor, p: float = 0.5, generator: None = None) -> torch.Tensor:
        return (torch.rand_like(self, dtype=torch.float32) < p).to(self.dtype)

    def normal(
        self: torch.Tensor, mean: float = 0.0, std: float = 1.0, generator: None = None
    ) -> torch.Tensor:
        # Box-Muller on two uniform streams; 1 - u is in (0, 1], so the log is finite.
        u1 = 1.0 - torch.rand_like(self, dtype=torch.float32)
        u2 = torch.rand_like(self, dtype=torch.float32)
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * torch.pi) * u2)
        return (z * std + mean).to(self.dtype)

    return {
        _aten("uniform").default: uniform,
        _aten("bernoulli").p: bernoulli,
        _aten("normal_functional").default: normal,
    }


_RANDOM_FORMS = _random_forms()


def _grad_scaler_forms() -> dict[Any, Any]:
    """``torch.amp.GradScaler``'s two ops, written with ops the device runs (their functional
    forms: the device writes the results into the gradients, ``found_inf``, the scale and the
    growth tracker). As PyTorch's kernels: a gradient times ``1 / scale``, ``found_inf`` set to
    1 when any gradient holds an inf or a NaN; the scale backs off after an overflow and grows
    after ``growth_interval`` clean steps (if the grown scale is finite)."""

    def unscale(
        self: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        found = found_inf
        for t in self:
            found = torch.maximum(found, (~torch.isfinite(t)).any().to(found.dtype))
        return [(t * inv_scale).to(t.dtype) for t in self], found

    def update_scale(
        self: torch.Tensor,
        growth_tracker: torch.Tensor,
        found_inf: torch.Tensor,
        scale_growth_factor: float,
        scale_backoff_factor: float,
        growth_interval: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        overflow = found_inf > 0
        clean_steps = torch.where(overflow, torch.zeros_like(growth_tracker), growth_tracker + 1)
        grown = self * scale_growth_factor
        grow = (clean_steps == growth_interval) & torch.isfinite(grown)
        scale = torch.where(overflow, self * scale_backoff_factor, torch.where(grow, grown, self))
        tracker = torch.where(clean_steps == growth_interval, 0, clean_steps)
        return scale, tracker.to(growth_tracker.dtype)

    return {
        _aten("_amp_foreach_non_finite_check_and_unscale").default: unscale,
        _aten("_amp_update_scale").default: update_scale,
    }


#: Functional ops traced from a Python form instead of themselves.
_PYTHON_FORMS = {**_RANDOM_FORMS, **_grad_scaler_forms()}
#: In-place random ops whose functional form has another overload name.
_IN_PLACE_RANDOM = {
    "bernoulli_.float": ("bernoulli", "p"),
    "normal_.default": ("normal_functional", "default"),
}


#: Ops that update arguments their schema does not mark as written: batch norm in training
#: updates its running statistics (when it has them). Their functional form returns the op's
#: results and then the new values of these arguments, which the device writes back.
_UPDATES: dict[Any, tuple[Any, tuple[str, ...]]] = {
    torch.ops.aten.native_batch_norm.default: (
        torch.ops.aten._native_batch_norm_legit_functional.default,
        ("running_mean", "running_var"),
    ),
}


@dataclass(frozen=True)
class Provided:
    """The provider's answer (``ProvidedKernel`` in ``runtime/device/KernelProvider.h``)."""

    name: str
    program: str  # program JSON
    device_ns: float  # modeled time of one run
    engine_busy_ns: dict[str, float]
    #: Per program input: (argument, element of a tensor list or -1); argument -1 is the seed.
    inputs: list[tuple[int, int]]
    #: Per program output: the argument it is written into, or -1 for a new tensor.
    outputs: list[int]
    #: Per op return: an argument index (>= 0), -(program output) - 1, or None for an
    #: undefined tensor (a result the op leaves out, as output_mask does).
    returns: list[int | None]
    id: int
    #: Float arguments that are 0-d kernel inputs (one kernel serves every value).
    scalar_args: list[int] = field(default_factory=list)
    #: Per program output written into an argument: the element of a tensor-list argument
    #: (-1: the whole argument); empty when no output is written into a list.
    output_elements: list[int] = field(default_factory=list)


#: ``Provided.inputs`` argument of the seed input.
SEED_INPUT = -1


def install() -> None:
    """Register :func:`provide` with the device library (``device.register`` calls this)."""
    from torchneuron import device

    device._C()._set_kernel_provider(provide, record, record_transfer)


def set_enabled(on: bool) -> None:
    """Run eager ops as device kernels (the default) or send every op to the counted CPU
    fallback (``TORCHNEURON_EAGER_KERNELS=0`` starts with them off): CPU's results bit for
    bit, and no modeled time."""
    from torchneuron import device

    device._C()._set_eager_kernels(bool(on))


def enabled() -> bool:
    from torchneuron import device

    return bool(device._C()._eager_kernels_enabled())


def counts() -> dict[str, int]:
    """``runs`` (device kernel runs of eager ops), ``compiles`` (calls compiled into a
    kernel), ``rejected`` (calls left to the CPU fallback) and ``cached_kernels``, since the
    last ``torchneuron.reset_stats()``."""
    from torchneuron import device

    return dict(device._C()._eager_kernel_counts())


def rejected() -> dict[str, str]:
    """Why each op that reached the provider was not compiled (``"aten.addcdiv.out"`` ->
    reason)."""
    with _lock:
        return dict(_rejected)


def record(kernel_id: int, start_ns: float) -> None:
    """Called by the device after each eager kernel run while a profile is active, with when
    it started on the device's timeline."""
    from torchneuron.profile import record_run

    kernel, name = _kernels[kernel_id]
    record_run(kernel, name, eager=True, start_ns=start_ns)


def record_transfer(
    name: str, resource: str, nbytes: int, device_ns: float, start_ns: float
) -> None:
    """Called by the device after each copy or collective while a profile is active."""
    from torchneuron.profile import record_transfer as to_profiles

    to_profiles(name, resource, nbytes, device_ns, start_ns)


def provide(name: str, overload: str, args: list[Any], target: str) -> Provided | None:
    """The device asks for the kernel of ``name.overload`` at ``args`` (tensors described as
    ``("tensor", dtype, sizes, strides, is_cpu_scalar)``, tensor lists as lists of those (with
    None for the absent entries of a ``Tensor?[]``), a generator as ``("generator",)``);
    returns the kernel or None.

    A runtime scalar argument (the ``value`` of ``addcdiv``, an ``alpha``, ``lerp``'s
    ``weight``: numbers an optimizer changes every step) is a 0-d float32 kernel input, so the
    device keys that argument of the op by its kind, not its value, and one kernel serves every
    value."""
    qualified = f"{name.replace('::', '.')}.{overload or 'default'}"
    try:
        return _provide(name, overload or "default", args, target)
    except _Reject as e:
        reason = str(e)
    except Exception as e:  # the op stays a CPU fallback; the model keeps running
        reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    with _lock:
        _rejected[qualified] = reason
    log.debug("torchneuron: %s stays a CPU fallback: %s", qualified, reason)
    return None


def _op(name: str, overload: str) -> torch._ops.OpOverload:
    namespace, op_name = name.split("::", 1)
    packet = getattr(getattr(torch.ops, namespace), op_name)
    return getattr(packet, overload)  # type: ignore[no-any-return]


def _writes(arg: Any) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _functional(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, list[int]]:
    """The functional overload computing ``op``'s results, and the arguments ``op`` writes
    them into (empty for a functional op)."""
    schema = op._schema
    written = [i for i, a in enumerate(schema.arguments) if _writes(a)]
    if not written:
        return op, []
    namespace, op_name = schema.name.split("::", 1)
    if all(schema.arguments[i].kwarg_only for i in written):  # out= variant
        kept = [(a.name, str(a.type)) for a in schema.arguments if not _writes(a)]
        packet = getattr(getattr(torch.ops, namespace), op_name)
        for overload in packet.overloads():
            candidate = getattr(packet, overload)
            cs = candidate._schema
            if any(a.alias_info is not None for a in cs.arguments):
                continue
            if [(a.name, str(a.type)) for a in cs.arguments] == kept and len(cs.returns) == len(
                written
            ):
                return candidate, written
        raise _Reject("no functional overload with the out= variant's arguments")
    if 0 in written and op_name.endswith("_"):  # in place on self (and maybe other arguments)
        functional_name, overload = _IN_PLACE_RANDOM.get(
            f"{op_name}.{schema.overload_name or 'default'}",
            (op_name[:-1], schema.overload_name or "default"),
        )
        packet = getattr(getattr(torch.ops, namespace), functional_name, None)
        candidate = getattr(packet, overload, None)
        if candidate is not None and len(candidate._schema.returns) == len(written):
            return candidate, written
    raise _Reject("mutates arguments other than out= or an in-place self")


def _is_tensor(value: Any) -> bool:
    return isinstance(value, tuple) and bool(value) and value[0] == "tensor"


def _example(value: Any) -> torch.Tensor:
    from torchneuron import fx_json

    _, dtype_name, sizes, _strides, _cpu_scalar = value
    return torch.empty(sizes, dtype=fx_json.dtype_from_name(dtype_name))


def _provide(name: str, overload: str, args: list[Any], target: str) -> Provided:
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchneuron import backend, config, frontend, fx_json, partition, rewrite
    from torchneuron.decompositions import neuron_decompositions
    from torchneuron.kernel import modeled_work

    op = _op(name, overload)
    schema = op._schema
    functional, written = _functional(op)

    # The functional call: tensors (and runtime scalars) become the traced function's inputs.
    by_name = {a.name: v for a, v in zip(schema.arguments, args, strict=True)}
    index = {a.name: i for i, a in enumerate(schema.arguments)}
    updated: list[int] = []  # arguments the last results are written into (_UPDATES)
    if op in _UPDATES and by_name.get("training") is True:
        update_form, names = _UPDATES[op]
        if all(_is_tensor(by_name[n]) for n in names):
            functional, updated = update_form, [index[n] for n in names]
    form = _SCALAR_FORMS.get(functional)
    runtime_scalar = None
    if form is not None:
        self_value = by_name.get("self")
        floating = (
            isinstance(self_value, tuple)
            and fx_json.dtype_from_name(self_value[1]).is_floating_point
        )
        if isinstance(by_name.get(form[0]), float):
            if not floating:
                # The device keys this float argument by kind once the op has a runtime-scalar
                # kernel: a kernel with the value built in would serve other values too.
                raise _Reject(f"a float {form[0]} with a tensor that is not floating point")
            runtime_scalar = form[0]
    values: dict[str, Any] = {}
    inputs: list[tuple[int, int]] = []  # (argument, list element or -1) of each traced input
    examples: list[torch.Tensor] = []
    traced: list[tuple[str, int]] = []  # (argument name, list element or -1) of each
    for a in functional._schema.arguments:
        value = by_name[a.name]
        type_name = str(a.type)
        if a.name == runtime_scalar:
            examples.append(torch.empty((), dtype=torch.float32))
            inputs.append((index[a.name], -1))
            traced.append((a.name, -1))
        elif _is_tensor(value):
            examples.append(_example(value))
            inputs.append((index[a.name], -1))
            traced.append((a.name, -1))
        elif (
            isinstance(value, list)
            and any(_is_tensor(v) for v in value)
            and all(_is_tensor(v) or v is None for v in value)
        ):  # a tensor list, or a Tensor?[] (advanced indexing) with its Nones kept
            for k, element in enumerate(value):
                if element is None:
                    continue
                examples.append(_example(element))
                inputs.append((index[a.name], k))
                traced.append((a.name, k))
            values[a.name] = [None] * len(value)
            continue
        elif "Generator" in type_name:
            value = None  # its numbers are the kernel's seed input (SEED_INPUT)
        elif any(t in type_name for t in ("Device", "Layout", "MemoryFormat")):
            if value is not None:
                raise _Reject(f"argument {a.name} of type {type_name}")
        elif "ScalarType" in type_name and isinstance(value, int):
            if value not in _SCALAR_TYPES:
                raise _Reject(f"dtype argument {a.name} = {value}")
            value = _SCALAR_TYPES[value]
        values[a.name] = value

    def call(*tensors: torch.Tensor) -> Any:
        named = {k: list(v) if isinstance(v, list) else v for k, v in values.items()}
        for (arg_name, element), t in zip(traced, tensors, strict=True):
            if element >= 0:
                named[arg_name][element] = t
            else:
                named[arg_name] = t
        if runtime_scalar is not None:
            assert form is not None
            return form[1](**named)
        if functional in _PYTHON_FORMS:
            return _PYTHON_FORMS[functional](**named)
        pos = [named[a.name] for a in functional._schema.arguments if not a.kwarg_only]
        kw = {a.name: named[a.name] for a in functional._schema.arguments if a.kwarg_only}
        return functional(*pos, **kw)

    gm = make_fx(call, decomposition_table=neuron_decompositions(), tracing_mode="fake")(*examples)
    if _seed_input(gm):
        inputs.append((SEED_INPUT, -1))
    output = gm.graph.output_node()
    returned = output.args[0]
    returned = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    # Where each result goes: (argument, element of a tensor-list argument or -1).
    targets = [
        (i, k)
        for i in written
        for k in (range(len(args[i])) if isinstance(args[i], list) else [-1])
    ]
    nested = any(isinstance(r, (list, tuple)) for r in returned)
    if written and nested:  # a written tensor list's new values: one result per element
        returned = [x for r in returned for x in (r if isinstance(r, (list, tuple)) else [r])]
    # None results (a backward's gradients that output_mask leaves out) return undefined
    # tensors; the kernel computes the others.
    results = [r for r in returned if r is not None]
    if not results or any(not isinstance(r, torch.fx.Node) for r in results):
        raise _Reject("a result is not a computed tensor (None or an input)")
    if written and len(results) != len(returned):
        raise _Reject("an in-place or out= op with a None result")
    if len(results) != len(returned) or nested:
        output.args = (tuple(results),)
        gm.recompile()
    if any(r.op == "placeholder" for r in results):
        raise _Reject("a result is an input")
    if written and len(results) != len(targets):
        raise _Reject(f"{len(results)} results for {len(targets)} written tensors")
    rewrite.as_strided_views(gm)
    if not any(partition.is_compute(n) for n in gm.graph.nodes):
        raise _Reject("no device work (views only)")
    unsupported = partition.find_unsupported(gm, name="eager_check")
    if unsupported:
        node, reason = next(iter(unsupported.items()))
        raise _Reject(f"{node}: {reason}")
    if frontend.dedupe_outputs(gm) is not None:
        raise _Reject("returns one value twice")

    short = f"{name.split('::', 1)[1]}_{overload}"
    with _lock:
        _names[short] += 1
        kernel_name = f"eager_{short}_{_names[short]}"
    doc = fx_json.serialize_graph(gm, name=kernel_name)
    kernel, _ = backend._compile_shared(doc, target, None, config.cache_dir())
    if len(kernel.input_specs) != len(inputs) or len(kernel.output_specs) != len(results):
        raise _Reject("the program's inputs or outputs differ from the graph's")

    # Program output of each returned value (None: an undefined tensor).
    output_of: list[int | None] = []
    computed = 0
    for r in returned:
        output_of.append(None if r is None else computed)
        computed += r is not None
    returns: list[int | None] = []
    for j, ret in enumerate(schema.returns):
        if ret.alias_info is not None:  # returns the argument it wrote
            (i,) = [
                i
                for i, a in enumerate(schema.arguments)
                if a.alias_info is not None and a.alias_info.before_set == ret.alias_info.before_set
            ]
            returns.append(i)
        else:
            out = output_of[j]
            returns.append(None if out is None else -out - 1)
    with _lock:
        _kernels.append((kernel, kernel_name))
        kernel_id = len(_kernels) - 1
    device_ns, busy = modeled_work(kernel)  # once per kernel
    return Provided(
        name=kernel_name,
        program=kernel.program_json,
        device_ns=device_ns,
        engine_busy_ns=busy,
        inputs=inputs,
        outputs=[i for i, _ in targets]
        if written
        else [-1] * (len(results) - len(updated)) + updated,
        output_elements=[k for _, k in targets],
        returns=returns,
        id=kernel_id,
        scalar_args=[index[runtime_scalar]] if runtime_scalar is not None else [],
    )


def _seed_input(gm: torch.fx.GraphModule) -> bool:
    """Turn the traced graph's uniform random numbers into the device's Philox numbers under
    a seed that is the graph's last input (the device draws it per run); whether there were
    any. Other random ops (``normal``) cannot run on the device."""
    from torchneuron import rng

    nodes = list(gm.graph.nodes)
    seeded = False
    if any(n.op == "call_function" and n.target in rng.RANDOM_TARGETS for n in nodes):
        placeholders = [n for n in nodes if n.op == "placeholder"]
        with (
            gm.graph.inserting_after(placeholders[-1])
            if placeholders
            else gm.graph.inserting_before(nodes[0])
        ):
            seed = gm.graph.placeholder("seed")
        seed.meta["val"] = torch.empty(2, dtype=torch.int32)
        seeded = rng.seed_random_ops(gm, seed=seed) > 0
    for n in gm.graph.nodes:
        if isinstance(n.target, torch._ops.OpOverload) and (
            torch.Tag.nondeterministic_seeded in n.target.tags
        ):
            raise _Reject(f"{n.target} draws random numbers the device cannot draw")
    return seeded
