"""A compile running longer than a couple of seconds says what it is doing on a terminal
(python/torchneuron/progress.py), and nothing otherwise. The threshold is lowered here."""

from __future__ import annotations

import io
import sys
import time

import pytest
import torch

from torchneuron import progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "AFTER_SECONDS", 0.0)
    monkeypatch.setattr(progress, "INTERVAL_SECONDS", 0.01)


def test_each_stage_is_shown_with_the_kernel_count(quick: None) -> None:
    out = FakeTerminal()
    with progress.Progress("graph of 812 ops (trn2)", stream=out) as p:
        for i in (1, 2):
            p.stage(f"compiling kernel {i}/2")
            time.sleep(0.1)
    lines = out.getvalue().splitlines()
    assert any("graph of 812 ops (trn2): compiling kernel 1/2" in line for line in lines)
    assert any("graph of 812 ops (trn2): compiling kernel 2/2" in line for line in lines)
    assert lines[-1].startswith("torchneuron: graph of 812 ops (trn2): done in ")
    assert len(lines) <= 4  # a line per new stage, not per interval


def test_a_short_compile_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "AFTER_SECONDS", 5.0)
    out = FakeTerminal()
    with progress.Progress("graph", stream=out) as p:
        p.stage("partitioning")
    assert out.getvalue() == ""


def test_not_a_terminal_says_nothing_and_starts_no_thread(quick: None) -> None:
    out = io.StringIO()
    with progress.Progress("graph", stream=out) as p:
        p.stage("partitioning")
        time.sleep(0.05)
        assert p._thread is None
    assert out.getvalue() == ""


def test_a_compile_on_a_terminal_shows_its_stages(
    quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with torch.no_grad():
        torch.compile(torch.nn.Linear(16, 4), backend="neuron")(torch.ones(8, 16))
    text = terminal.getvalue()
    assert "torchneuron: graph of " in text and "ops (trn2): " in text
    assert "done in " in text

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file: quiet
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(torch.nn.Linear(16, 4), backend="neuron")(torch.ones(8, 16))
    assert sys.stderr.getvalue() == ""
