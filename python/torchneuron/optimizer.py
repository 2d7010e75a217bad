"""The optimizer step stays in eager PyTorch, and is counted like any fallback.

The backend records the parameters a compiled graph trains (the leaf tensors requiring grad
among its inputs). The first time it compiles a backward graph it installs one global
``torch.optim`` step pre-hook; an optimizer stepping any such parameter is then counted once in
``torchneuron.stats()["ops_fallback"]`` as ``"optimizer.step (<class name>)"``. An
``opt.step`` that the user compiles is traced, not run eagerly: the hook does nothing under
compilation, and whatever of the compiled step falls back is counted the usual way.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from torchneuron._stats import STATS

__all__ = ["install_step_hook", "track_parameters"]

# id -> tensor (tensors compare elementwise, so no WeakSet); an entry goes when its tensor does.
_trained: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
_install_lock = threading.Lock()
_hook: Any = None


def track_parameters(inputs: Iterable[object]) -> None:
    """Remember the leaf tensors requiring grad among a compiled graph's inputs."""
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.requires_grad and value.is_leaf:
            _trained[id(value)] = value


def install_step_hook() -> None:
    """Install the global optimizer step pre-hook (once per process)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    global _hook
    with _install_lock:
        if _hook is None:
            _hook = register_optimizer_step_pre_hook(_count_step)


def _count_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if torch.compiler.is_compiling():
        return  # a compiled step: its graph goes through the backend like any other
    for group in optimizer.param_groups:
        if any(_trained.get(id(p)) is p for p in group["params"]):
            STATS.record_eager_once(optimizer, f"optimizer.step ({type(optimizer).__name__})")
            return
