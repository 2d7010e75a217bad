"""The quick examples run as scripts, as a user runs them, and must exit 0.

Each example compares what it computes on the device with eager PyTorch (or checks its losses)
and exits non-zero on a mismatch, so a wrong result fails here. They run concurrently, a few
seconds each; ``examples/eager_device.py`` runs in ``test_device.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (script, arguments that keep it quick)
QUICK = [
    ("gpt2_block.py", []),
    ("compare_targets.py", []),
    ("flex_attention.py", ["--seq", "256", "--heads", "2", "--window", "64"]),
    ("train.py", ["--steps", "2"]),
    # torchrun's launcher as a module: 2 ranks of tensor parallelism (a 1 x 2 mesh).
    (
        "-m",
        [
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--standalone",
            str(EXAMPLES / "train_fsdp.py"),
            "--tp",
            "2",
            "--steps",
            "4",
        ],
    ),
]

# Runs a script on a wrong device (kernel outputs off by one).
WRONG_DEVICE = str(Path(__file__).resolve().parent / "wrong_device.py")


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_quick_examples_exit_zero() -> None:
    runs = {
        " ".join([name, *args]): _start([name if name == "-m" else str(EXAMPLES / name), *args])
        for name, args in QUICK
    }
    failures = []
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or "MISMATCH" in out:
            failures.append(f"{name} exited {proc.returncode}\n{out[-2000:]}\n{err[-2000:]}")
    assert not failures, "\n\n".join(failures)


def test_an_example_exits_nonzero_on_a_mismatch() -> None:
    proc = _start([WRONG_DEVICE, str(EXAMPLES / "gpt2_block.py")])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    assert "[MISMATCH]" in out
    assert "MISMATCH with eager PyTorch" in err
