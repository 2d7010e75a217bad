"""The repository itself: no file carries the markers of an unresolved merge."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKERS = re.compile(r"^(<{7} |>{7} )", re.MULTILINE)


def test_no_unresolved_merge_conflicts() -> None:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    conflicted = []
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        if MARKERS.search(text):
            conflicted.append(name)
    assert not conflicted, f"unresolved merge conflict markers in {conflicted}"
