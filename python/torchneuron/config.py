"""Backend configuration: target chip and diagnostics, from ``options=`` and the environment.

- ``TORCHNEURON_TARGET``: target chip (``trn2`` by default); ``torch.compile(...,
  options={"target": ...})`` wins over it.
- ``TORCHNEURON_VERBOSE=1``: print which ops fell back to eager PyTorch, why, and where
  (the same messages go to the ``torchneuron`` logger at INFO level).
- ``TORCHNEURON_DUMP_DIR`` (or ``options={"dump_dir": ...}``, which wins): write every FX graph
  document sent to the compiler into this folder, and every compiler stage of graph ``<name>``
  (``00-import.mlir`` ... ``05-schedule.mlir``, ``06-program.json``) into ``<name>/`` beside it.
- ``TORCHNEURON_CHECK=1``: compute and verify every compiled kernel's modeled timeline as soon as
  it is compiled (the timing model raises ``DeviceError`` for an instruction that may start
  before an earlier conflicting one is done: a wait the program lacks). The test suite sets it.
- ``TORCHNEURON_CACHE_DIR``: the persistent compile cache's folder (:mod:`torchneuron.cache`;
  default ``$XDG_CACHE_HOME/torchneuron``, i.e. ``~/.cache/torchneuron``);
  ``TORCHNEURON_CACHE=0`` or ``options={"cache": False}`` turn the cache off.
- ``options={"specialize_sizes": True}``: compile a graph with symbolic sizes for each call's
  sizes even when the compiler could make its programs size-generic (to compare the two).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_ENV",
    "CHECK_ENV",
    "DEFAULT_TARGET",
    "DUMP_ENV",
    "KNOWN_OPTIONS",
    "TARGET_ENV",
    "VERBOSE_ENV",
    "available_targets",
    "cache_dir",
    "check",
    "dump_dir",
    "resolve_target",
    "tell",
    "verbose",
]

DEFAULT_TARGET = "trn2"
TARGET_ENV = "TORCHNEURON_TARGET"
VERBOSE_ENV = "TORCHNEURON_VERBOSE"
DUMP_ENV = "TORCHNEURON_DUMP_DIR"
CHECK_ENV = "TORCHNEURON_CHECK"
CACHE_ENV = "TORCHNEURON_CACHE"
CACHE_DIR_ENV = "TORCHNEURON_CACHE_DIR"

#: Keys of ``torch.compile(options=...)`` the backend understands.
KNOWN_OPTIONS = frozenset({"target", "dump_dir", "cache", "specialize_sizes"})


def available_targets() -> list[str]:
    """Target names the compiler knows (``torchneuron._C.targets()``)."""
    from torchneuron._native import native

    return [str(t) for t in native().targets()]


def resolve_target(options: Mapping[str, object] | None = None) -> str:
    """The target for one compile: ``options["target"]``, else ``$TORCHNEURON_TARGET``, else
    ``trn2``. Raises ``ValueError`` naming the valid targets when the name is unknown."""
    requested: object = None
    source = "default"
    if options is not None and options.get("target") is not None:
        requested, source = options["target"], 'options["target"]'
    elif os.environ.get(TARGET_ENV):
        requested, source = os.environ[TARGET_ENV], TARGET_ENV
    target = DEFAULT_TARGET if requested is None else requested
    valid = available_targets()
    if not isinstance(target, str) or target not in valid:
        raise ValueError(
            f"unknown torchneuron target {target!r} (from {source}); "
            f"valid targets: {', '.join(valid)}"
        )
    return target


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def verbose() -> bool:
    return _flag(VERBOSE_ENV)


def tell(message: str) -> None:
    """``message`` on stderr with ``TORCHNEURON_VERBOSE=1`` (unless the ``torchneuron`` logger
    shows INFO), else to the logger at INFO."""
    log = logging.getLogger("torchneuron")
    if verbose() and not log.isEnabledFor(logging.INFO):
        print(message, file=sys.stderr)
    else:
        log.info(message)


def check() -> bool:
    """Whether every compiled kernel's timeline is verified right away (``TORCHNEURON_CHECK``)."""
    return _flag(CHECK_ENV)


def dump_dir(options: Mapping[str, object] | None = None) -> Path | None:
    """Where to dump documents and compiler stages: ``options["dump_dir"]``, else
    ``$TORCHNEURON_DUMP_DIR``, else nowhere."""
    value = (options or {}).get("dump_dir") or os.environ.get(DUMP_ENV)
    return Path(str(value)) if value else None


def cache_dir(options: Mapping[str, object] | None = None) -> Path | None:
    """The persistent compile cache's folder, or None when it is off (``options["cache"]``
    false, or ``$TORCHNEURON_CACHE`` set to 0/false/no/off)."""
    if not (options or {}).get("cache", True):
        return None
    if os.environ.get(CACHE_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torchneuron"
