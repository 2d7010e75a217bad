"""What a long compile is doing, on stderr when it is a terminal.

A compile that is still running after :data:`AFTER_SECONDS` prints its stage (``checking 812
ops``, ``partitioning``, ``compiling kernel 3/7``, ...) and then each new stage, at most every
:data:`INTERVAL_SECONDS`, and a last line when it is done. A thread watches the stage, so the
compile itself pays only an attribute write per stage; the compiler releases the GIL, so the
lines also appear while one long kernel compiles. Not a terminal (a log file, a pipe, pytest's
capture): nothing is printed and no thread is started.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

__all__ = ["AFTER_SECONDS", "INTERVAL_SECONDS", "Progress"]

#: A compile running longer than this says what it is doing.
AFTER_SECONDS = 2.0
#: At most one line per this many seconds after that.
INTERVAL_SECONDS = 1.0


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """``with Progress("graph 3 (812 ops)") as p: p.stage("partitioning"); ...``"""

    def __init__(self, what: str, stream: TextIO | None = None) -> None:
        self.what = what
        self.status = "starting"
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.printed = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def stage(self, status: str) -> None:
        """What the compile does now."""
        self.status = status

    def __enter__(self) -> Progress:
        if _is_terminal(self.stream):
            self._thread = threading.Thread(
                target=self._watch, name="torchneuron-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._thread is None:
            return
        self._done.set()
        self._thread.join()
        if self.printed:
            outcome = "failed" if kind is not None else "done"
            self._print(f"{outcome} in {time.perf_counter() - self.start:.1f} s")

    def _print(self, text: str) -> None:
        print(f"torchneuron: {self.what}: {text}", file=self.stream, flush=True)
        self.printed = True

    def _watch(self) -> None:
        if self._done.wait(AFTER_SECONDS):
            return
        shown = None
        while True:
            status = self.status
            if status != shown:
                self._print(f"{status} ({time.perf_counter() - self.start:.0f} s so far)")
                shown = status
            if self._done.wait(INTERVAL_SECONDS):
                return
