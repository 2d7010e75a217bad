"""The persistent compile cache: kernel programs on disk, shared by every process of the user.

A compiled device region is stored under a key that hashes its FX document (without its name),
the target and the compiler's build identity (a hash of the ``_C`` extension), so a second
process that compiles the same graph loads the program instead of compiling it, and a rebuilt
compiler never loads an older compiler's programs. Eager device kernels (:mod:`torchneuron.eager`)
use it too.

- Where: ``$TORCHNEURON_CACHE_DIR``, else ``$XDG_CACHE_HOME/torchneuron`` (``~/.cache``);
  ``TORCHNEURON_CACHE=0`` or ``torch.compile(..., options={"cache": False})`` turn it off.
- Entries are JSON files (format, key, program, its SHA-256) written to a temporary file and
  renamed into place, so a reader sees a whole entry or none. An entry that does not parse, is
  for another key or format, or fails its checksum or the program verifier is reported once as
  a warning, removed and recompiled: never loaded.
- Two processes that miss the same key at once compile it once: the compile holds a file lock
  (one of :data:`_LOCKS` lock files, picked by the key), and the second rereads the entry
  after taking it.
- The folder is capped (``$TORCHNEURON_CACHE_MAX_MB``, default 2048): after a store, the least
  recently used entries (a hit touches its file) are removed until it fits.

:func:`info` and :func:`clear` are ``torchneuron.cache_info()`` and ``torchneuron.clear_cache()``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchneuron import _native
from torchneuron._stats import STATS

if TYPE_CHECKING:
    from torchneuron._native import Kernel

__all__ = ["clear", "info", "key", "load", "locked", "store"]

#: The entry layout; a change makes every older entry a miss.
FORMAT = 1
#: Lock files per cache folder: two keys that share one only wait for each other.
_LOCKS = 64
_DEFAULT_MAX_MB = 2048


@functools.cache
def build_id() -> str:
    """A hash of the compiler extension's file: programs of another build are other keys."""
    path = _native.native().__file__
    digest = hashlib.sha256()
    with open(str(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def key(document: str, target: str) -> str:
    """The entry key of a name-less FX ``document`` compiled for ``target``."""
    text = f"torchneuron-cache {FORMAT}\n{build_id()}\n{target}\n{document}"
    return hashlib.sha256(text.encode()).hexdigest()


def _entry(directory: Path, k: str) -> Path:
    return directory / f"{k}.json"


def load(directory: Path, k: str, target: str) -> Kernel | None:
    """The kernel stored under ``k``, or None (a miss, or a bad entry: warned and removed)."""
    path = _entry(directory, k)
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        STATS.record_cache(hit=False)
        return None
    try:
        entry = json.loads(raw)
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != k:
            raise ValueError("not an entry of this cache format")
        program = entry["program"]
        if hashlib.sha256(program.encode()).hexdigest() != entry["sha256"]:
            raise ValueError("checksum mismatch")
        kernel: Kernel = _native.native().load_program(program, target)
    except Exception as e:  # corrupt, truncated or foreign: never loaded
        reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        warnings.warn(
            f"torchneuron: compile cache entry {path} is unusable ({reason}); removed, "
            "compiling anew",
            stacklevel=2,
        )
        with contextlib.suppress(OSError):
            path.unlink()
        STATS.record_cache(hit=False)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used
    STATS.record_cache(hit=True)
    return kernel


def store(directory: Path, k: str, kernel: Kernel) -> None:
    """Write ``kernel``'s program under ``k`` (atomically), then keep the folder under its cap.
    A cache that cannot be written (read-only, full disk) only warns."""
    program = kernel.program_json
    entry = {
        "format": FORMAT,
        "key": k,
        "sha256": hashlib.sha256(program.encode()).hexdigest(),
        "program": program,
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f)
            os.replace(tmp, _entry(directory, k))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _evict(directory, _max_bytes())
    except OSError as e:
        warnings.warn(
            f"torchneuron: cannot write the compile cache in {directory}: {e}", stacklevel=2
        )


@contextlib.contextmanager
def locked(directory: Path, k: str) -> Iterator[None]:
    """Hold the file lock of key ``k`` (shared with other processes)."""
    locks = directory / "locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(locks / f"{int(k[:8], 16) % _LOCKS}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield  # an unwritable cache: compile without the lock (store will warn)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _max_bytes() -> int:
    value = os.environ.get("TORCHNEURON_CACHE_MAX_MB", "")
    try:
        mb = float(value) if value.strip() else _DEFAULT_MAX_MB
    except ValueError:
        mb = _DEFAULT_MAX_MB
    return int(mb * (1 << 20))


def _entries(directory: Path) -> list[tuple[float, int, Path]]:
    out = []
    for path in directory.glob("*.json"):
        with contextlib.suppress(OSError):
            st = path.stat()
            out.append((st.st_mtime, st.st_size, path))
    return out


def _evict(directory: Path, max_bytes: int) -> None:
    entries = sorted(_entries(directory))
    total = sum(size for _, size, _ in entries)
    for _, size, path in entries:  # least recently used first
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            total -= size


def info(directory: Path | None) -> dict[str, Any]:
    """``directory`` (None: the cache is off), ``entries``, ``bytes``, ``max_bytes``, and this
    process's ``hits`` and ``misses`` since the last ``torchneuron.reset_stats()``."""
    entries = _entries(directory) if directory is not None and directory.is_dir() else []
    counts = STATS.snapshot()
    return {
        "directory": str(directory) if directory is not None else None,
        "entries": len(entries),
        "bytes": sum(size for _, size, _ in entries),
        "max_bytes": _max_bytes(),
        "hits": counts["cache_hits"],
        "misses": counts["cache_misses"],
    }


def clear(directory: Path | None) -> None:
    """Remove every entry of the folder."""
    if directory is not None and directory.is_dir():
        for _, _, path in _entries(directory):
            with contextlib.suppress(OSError):
                path.unlink()
