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

Two levels share this machinery (one entry layout, the same checks, atomic writes and cap):

- program entries (``<key>.json``, :func:`load`/:func:`store`): one device region's program, by
  its FX document; what the eager device kernels and the backend's regions use;
- graph entries (``<key>.graph.json``, :func:`load_graph`/:func:`store_graph`, written by
  :mod:`torchneuron.graph_cache`): everything the backend built from one whole ATen graph (the
  partition and every region's program), by the graph itself, so that a second process skips
  partitioning and serializing too. Their key adds the hash of this package's Python sources
  (:func:`source_id`): the partition is Python's work. They take no lock (the programs they
  are built from do).

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
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from torchneuron import _native
from torchneuron._stats import STATS

if TYPE_CHECKING:
    from torchneuron._native import Kernel

__all__ = [
    "clear",
    "graph_key",
    "info",
    "key",
    "load",
    "load_graph",
    "locked",
    "source_id",
    "store",
    "store_graph",
]

T = TypeVar("T")

#: The entry layout; a change makes every older entry a miss.
FORMAT = 1
#: Lock files per cache folder: two keys that share one only wait for each other.
_LOCKS = 64
_DEFAULT_MAX_MB = 2048
#: A file whose status changed less than this long ago (ns) is not trusted by its status.
_RACY_NS = 2_000_000_000


def build_id() -> str:
    """A hash of the compiler extension's file: programs of another build are other keys."""
    return _identity()[0]


def source_id() -> str:
    """A hash of this package's Python sources: graph entries of other sources are other keys."""
    return _identity()[1]


@functools.cache
def _identity() -> tuple[str, str]:
    """:func:`build_id` and :func:`source_id`.

    Hashing the files costs about as much as loading a program, so the hashes are kept in the
    cache folder's ``identity`` with the files' status (device, inode, size, modification and
    change times: a write changes the change time, and no program can set it back) and reused
    while every status is the same. Files changed in the last seconds are not memoized: a
    rewrite within one tick of a coarse clock would keep its status (git's "racy" entries)."""
    from torchneuron import config

    extension = Path(str(_native.native().__file__))
    sources = sorted(Path(__file__).parent.glob("*.py"))
    stats = [(path, path.stat()) for path in (extension, *sources)]
    stamp = [
        [str(p), s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns] for p, s in stats
    ]
    folder = config.cache_dir()
    memo = folder / "identity" if folder is not None else None
    if memo is not None:
        with contextlib.suppress(OSError, ValueError):
            saved = json.loads(memo.read_text())
            if isinstance(saved, dict) and saved.get("stamp") == stamp:
                ids = saved.get("ids")
                if isinstance(ids, list) and len(ids) == 2:
                    if all(isinstance(i, str) and len(i) == 64 for i in ids):
                        return str(ids[0]), str(ids[1])
    build = hashlib.sha256()
    with open(extension, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            build.update(block)
    source = hashlib.sha256()
    for path in sources:
        source.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    ids = [build.hexdigest(), source.hexdigest()]
    if memo is not None and all(time.time_ns() - s.st_ctime_ns > _RACY_NS for _, s in stats):
        with contextlib.suppress(OSError):
            memo.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=memo.parent, prefix=".tmp-", suffix=".identity")
            try:
                with os.fdopen(fd, "w") as out:
                    json.dump({"stamp": stamp, "ids": ids}, out)
                os.replace(tmp, memo)
            except OSError:
                os.unlink(tmp)
                raise
    return ids[0], ids[1]


def target_id(target: str) -> str:
    """``target``, with a hash of its data file when ``TORCHNEURON_TARGET_DIR`` replaces the
    built-in one (the built-in figures are part of the build): programs compiled for other
    figures are other keys."""
    folder = os.environ.get("TORCHNEURON_TARGET_DIR")
    if not folder:
        return target
    try:
        data = (Path(folder) / f"{target}.json").read_bytes()
    except OSError:
        return f"{target} from an unreadable {folder}"
    return f"{target} {hashlib.sha256(data).hexdigest()}"


def key(document: str, target: str) -> str:
    """The entry key of a name-less FX ``document`` compiled for ``target``."""
    text = f"torchneuron-cache {FORMAT}\n{build_id()}\n{target_id(target)}\n{document}"
    return hashlib.sha256(text.encode()).hexdigest()


def graph_key(graph: str, target: str) -> str:
    """The entry key of a whole ATen graph (its text, :func:`graph_cache.graph_text`)."""
    import torch

    text = (
        f"torchneuron-graph-cache {FORMAT}\n{build_id()}\n{source_id()}\n{torch.__version__}\n"
        f"{target_id(target)}\n{graph}"
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _entry(directory: Path, k: str, field: str = "program") -> Path:
    return directory / (f"{k}.json" if field == "program" else f"{k}.{field}.json")


def _read(path: Path, k: str, field: str, use: Callable[[str], T]) -> T | None:
    """``use(payload)`` of the entry at ``path``: None when there is none, or when it is bad
    (it does not parse, is for another key or format, fails its checksum, or ``use`` rejects
    it): then it is warned about, removed and never used."""
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        entry = json.loads(raw)
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != k:
            raise ValueError("not an entry of this cache format")
        payload = entry[field]
        if hashlib.sha256(payload.encode()).hexdigest() != entry["sha256"]:
            raise ValueError("checksum mismatch")
        value = use(payload)
    except Exception as e:  # corrupt, truncated or foreign: never loaded
        reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        warnings.warn(
            f"torchneuron: compile cache entry {path} is unusable ({reason}); removed, "
            "compiling anew",
            stacklevel=3,
        )
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used
    return value


def _write(directory: Path, k: str, field: str, payload: str) -> None:
    """Write ``payload`` under ``k`` (atomically), then keep the folder under its cap. A cache
    that cannot be written (read-only, full disk) only warns."""
    entry = {
        "format": FORMAT,
        "key": k,
        "sha256": hashlib.sha256(payload.encode()).hexdigest(),
        field: payload,
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f)
            os.replace(tmp, _entry(directory, k, field))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _evict(directory, _max_bytes())
    except OSError as e:
        warnings.warn(
            f"torchneuron: cannot write the compile cache in {directory}: {e}", stacklevel=3
        )


def load(directory: Path, k: str, target: str) -> Kernel | None:
    """The kernel stored under ``k``, or None (a miss, or a bad entry: warned and removed)."""
    kernel: Kernel | None = _read(
        _entry(directory, k), k, "program", lambda p: _native.native().load_program(p, target)
    )
    STATS.record_cache(hit=kernel is not None)
    return kernel


def store(directory: Path, k: str, kernel: Kernel) -> None:
    """Write ``kernel``'s program under ``k`` (atomically), then keep the folder under its cap.
    A cache that cannot be written (read-only, full disk) only warns."""
    _write(directory, k, "program", kernel.program_json)


def load_graph(directory: Path, k: str, use: Callable[[str], T]) -> T | None:
    """``use(payload)`` of the graph entry under ``k``, or None (a miss, or a bad entry, or
    one ``use`` raises for: warned and removed)."""
    value = _read(_entry(directory, k, "graph"), k, "graph", use)
    STATS.record_cache(hit=value is not None, graph=True)
    return value


def store_graph(directory: Path, k: str, payload: str) -> None:
    """Write a graph entry (atomically, like :func:`store`)."""
    _write(directory, k, "graph", payload)


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
    """``directory`` (None: the cache is off), ``entries`` (of which ``graph_entries`` are
    whole graphs), ``bytes``, ``max_bytes``, and this process's ``hits`` and ``misses`` (lookups
    at either level, as ``stats()["cache_hits"/"cache_misses"]``), of which ``graph_hits`` and
    ``graph_misses`` were graph lookups, and ``graph_skipped``: graphs that could not be keyed
    (:mod:`torchneuron.graph_cache`) and took the program-level path, since the last
    ``torchneuron.reset_stats()``."""
    entries = _entries(directory) if directory is not None and directory.is_dir() else []
    counts = STATS.snapshot()
    graph = STATS.graph_cache_counts()
    return {
        "directory": str(directory) if directory is not None else None,
        "entries": len(entries),
        "graph_entries": sum(path.name.endswith(".graph.json") for _, _, path in entries),
        "bytes": sum(size for _, size, _ in entries),
        "max_bytes": _max_bytes(),
        "hits": counts["cache_hits"],
        "misses": counts["cache_misses"],
        **graph,
    }


def clear(directory: Path | None) -> None:
    """Remove every entry of the folder."""
    if directory is not None and directory.is_dir():
        for _, _, path in _entries(directory):
            with contextlib.suppress(OSError):
                path.unlink()
