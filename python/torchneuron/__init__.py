"""TorchNeuron: a PyTorch compiler backend for AWS Trainium, on MLIR.

    torch.compile(model, backend="neuron")        # no import of torchneuron needed
    torchneuron.set_default_backend("neuron")     # then: model.compile()

Importing this package has no side effects: it neither imports ``torch._dynamo`` nor the C++
extension, and it does not change ``torch.compile``'s default backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchneuron._stats import STATS as _STATS
from torchneuron.profile import profile

if TYPE_CHECKING:
    from collections.abc import Callable

__version__ = "0.1.0"
__all__ = [
    "allow_flex_attention_training",
    "cache_info",
    "clear_cache",
    "neuron_backend",
    "profile",
    "reset_stats",
    "set_default_backend",
    "stats",
]


def stats() -> dict[str, Any]:
    """A copy of the process-wide counters:

    - ``graphs_compiled``: device kernels compiled (one per device region of each ATen graph,
      and per specialization of a graph with symbolic sizes)
    - ``ops_on_device``: ATen operator nodes placed in device regions, counted once per compile
    - ``ops_fallback``: ``{"aten.op.overload": n}`` for operator nodes left to eager PyTorch,
      counted once per compile (``TORCHNEURON_VERBOSE=1`` says which, why and where); an
      optimizer stepping parameters of a trained compiled model runs eagerly and is counted
      once per optimizer as ``"optimizer.step (<class>)"`` (:mod:`torchneuron.optimizer`); an
      eager op on neuron tensors without a device kernel runs as a CPU fallback and is counted
      per call as ``"aten.<op>.<overload> (eager)"`` (:mod:`torchneuron.device`)
    - ``kernels_run``: device kernel calls
    - ``recompiles``: compiles of a graph with symbolic sizes after its first one
    - ``compile_seconds``: wall time spent compiling ATen graphs
    - ``cache_hits`` / ``cache_misses``: lookups in the persistent compile cache that found a
      usable entry / did not, of whole graphs and of single device regions' programs (a
      graph hit compiles nothing and looks up no programs; :func:`cache_info` splits them)
    """
    return _STATS.snapshot()


def reset_stats() -> None:
    """Set every counter of :func:`stats` back to zero."""
    _STATS.reset()


def cache_info() -> dict[str, Any]:
    """The persistent compile cache (:mod:`torchneuron.cache`): ``directory`` (None when it is
    off), ``entries`` (``graph_entries`` of them whole graphs), ``bytes``, ``max_bytes``, and
    this process's ``hits`` and ``misses`` (``graph_hits`` and ``graph_misses`` of them graph
    lookups) and ``graph_skipped`` (graphs that could not be keyed, so their programs were
    looked up one by one)."""
    from torchneuron import cache, config

    return cache.info(config.cache_dir())


def clear_cache() -> None:
    """Remove every entry of the persistent compile cache (``TORCHNEURON_CACHE_DIR``)."""
    from torchneuron import cache, config

    cache.clear(config.cache_dir())


def allow_flex_attention_training() -> None:
    """Let ``torch.compile`` trace FlexAttention on CPU tensors that require grad (torch's
    ``flex_attention`` refuses them while Dynamo traces, before any backend runs): the check is
    skipped while Dynamo compiles, and eager calls keep it. :func:`set_default_backend` calls
    this for ``"neuron"``; call it yourself with ``torch.compile(..., backend="neuron")``."""
    from torchneuron.flex import allow_training

    allow_training()


def set_default_backend(name: str | Callable[..., Any] | None = "neuron") -> None:
    """Make ``name`` the backend of ``torch.compile`` / ``nn.Module.compile`` calls that do not
    pass ``backend=``; ``None`` restores Inductor. An explicit ``backend=`` still wins. For
    ``"neuron"`` it also lets FlexAttention train (:func:`allow_flex_attention_training`).

    Feature-detected: uses ``torch.compiler.set_default_backend`` when torch has it (torch 2.13
    does); on older torch it sets ``torch.compile.__kwdefaults__["backend"]``, which
    ``nn.Module.compile`` also reads since it calls ``torch.compile`` at call time.
    Nothing calls this on import.
    """
    import torch

    if name == "neuron":
        allow_flex_attention_training()
    setter = getattr(torch.compiler, "set_default_backend", None)
    if setter is not None:
        setter(name)
        return
    defaults = torch.compile.__kwdefaults__
    if defaults is None or "backend" not in defaults:
        raise RuntimeError("this torch has no way to change torch.compile's default backend")
    defaults["backend"] = "inductor" if name is None else name


def __getattr__(name: str) -> Any:
    if name == "neuron_backend":  # imported on use: it brings in torch._dynamo
        from torchneuron.backend import neuron_backend

        return neuron_backend
    raise AttributeError(f"module 'torchneuron' has no attribute {name!r}")
