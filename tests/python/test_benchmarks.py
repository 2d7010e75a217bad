"""The benchmarks as smoke tests: they run, and they check their answers.

``benchmarks/kernels.py --small`` (every workload at 1/8 of its size, on trn2 and trn3) and
``benchmarks/attention.py`` at a short sequence (forward and backward; forward only with the
wrong device) run as scripts, as a user
runs them. Each compares every output with eager PyTorch on CPU and exits 1 on a mismatch,
which the last test provokes with a wrong device. They run concurrently, about 10 s in all.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
KERNELS_SMALL = [str(BENCHMARKS / "kernels.py"), "--small"]
ATTENTION_SHORT = [
    str(BENCHMARKS / "attention.py"),
    *("--seq", "256", "--heads", "2", "--targets", "trn2", "--backward"),
]
WORKLOADS = 27  # benchmarks/kernels.py's workloads, each run on trn2 and trn3
TRN3_ONLY = 2  # of them, those trn2 lacks the hardware for (MXFP8)

# Runs a script on a wrong device (kernel outputs off by one).
WRONG_DEVICE = str(Path(__file__).resolve().parent / "wrong_device.py")


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, f"{out}\n--- stderr ---\n{err[-3000:]}"


def test_benchmarks_run_and_match_eager() -> None:
    kernels = _start(KERNELS_SMALL)
    attention = _start(ATTENTION_SHORT)

    rc, out = _finish(kernels)
    assert rc == 0, out
    runs = 2 * WORKLOADS - TRN3_ONLY
    assert out.count("trn2  skipped: runs on trn3 only") == TRN3_ONLY, out
    assert f"numeric check: {runs} of {runs} runs match eager PyTorch" in out, out
    rows = [
        line
        for line in out.splitlines()
        if re.match(r"\S.* (trn2|trn3) ", line) and "skipped:" not in line
    ]
    assert len(rows) == runs, out
    for row in rows:  # the last column: worst |device - eager| / tolerance
        assert 0.0 <= float(row.split()[-1]) <= 1.0, row

    rc, out = _finish(attention)
    assert rc == 0, out
    assert "numeric check against eager PyTorch (float32, 2 of 2 heads): all match" in out, out


def test_benchmarks_exit_nonzero_on_a_wrong_answer() -> None:
    kernels = _start([WRONG_DEVICE, *KERNELS_SMALL, "--only", "softmax 512", "--targets", "trn2"])
    # Forward only here (the other test runs the backward too).
    attention = _start([WRONG_DEVICE, *ATTENTION_SHORT[:-1]])

    rc, out = _finish(kernels)
    assert rc == 1, out
    assert "MISMATCH with eager PyTorch" in out
    assert "numeric check: 0 of 1 runs match eager PyTorch" in out
    assert "softmax 512x512 on trn2: MISMATCH with eager PyTorch" in out

    rc, out = _finish(attention)
    assert rc == 1, out
    assert "MISMATCH with eager PyTorch: full out:" in out


def test_kernel_library_benchmark_runs_and_checks_answers() -> None:
    rc, out = _finish(_start([str(BENCHMARKS / "kernel_library.py"), "--small"]))
    assert rc == 0, out
    rows = [line for line in out.splitlines() if re.search(r"\d+\.\d+ +\d+\.\d+ +\d+\.\d+", line)]
    assert len(rows) == 4, out


def test_model_forms_benchmark_runs_and_checks_answers() -> None:
    only = "batchnorm2d eval,argmax,gelu_new,embedding"
    rc, out = _finish(_start([str(BENCHMARKS / "model_forms.py"), "--only", only]))
    assert rc == 0, out
    rows = [line for line in out.splitlines() if re.search(r"\d+\.\d+% +\d+\.\d+", line)]
    assert len(rows) == 4, out
