"""The random-program differential fuzzer (scripts/fuzz.py): a fixed-seed slice must pass, and
its verdicts must catch a wrong answer and a race."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import fuzz  # noqa: E402


def test_fixed_seed_slice_passes(real_native: ModuleType, tmp_path: Path) -> None:
    """CI's slice: 100 seeded programs, each compared with eager and checked for races."""
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "fuzz.py"),
            "--n",
            "100",
            "--seed",
            "0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "100 ok, 0 mismatch, 0 race, 0 error, 0 crash" in run.stdout
    assert not list(tmp_path.iterdir())


def test_programs_are_reproducible_from_their_seed() -> None:
    a = fuzz.Generator(17, 5).build()
    b = fuzz.Generator(17, 5).build()
    assert a.to_json() == b.to_json()
    assert fuzz.Program.from_json(a.to_json()).function_source() == a.function_source()
    assert a.function_source() != fuzz.Generator(18, 5).build().function_source()


def test_a_wrong_answer_is_a_mismatch(
    real_native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = next(
        p for p in (fuzz.Generator(i, 0).build() for i in range(50)) if p.dtype == "float32"
    )
    assert fuzz.check_program(program)["status"] == "ok"
    run_variant = fuzz.run_variant

    def off_by_a_little(p: fuzz.Program, dtype: str, compiled: bool, base: list) -> tuple:
        outs, grads = run_variant(p, dtype, compiled, base)
        if compiled:
            outs = [o + 1e-3 * o.detach().abs().max() for o in outs]
        return outs, grads

    monkeypatch.setattr(fuzz, "run_variant", off_by_a_little)
    verdict = fuzz.check_program(program)
    assert verdict["status"] == "mismatch", verdict
    assert "relative error" in verdict["detail"]


def test_repro_file_reruns_the_program(real_native: ModuleType, tmp_path: Path) -> None:
    program = fuzz.Generator(3, 0).build()
    repro = tmp_path / "repro.py"
    repro.write_text(fuzz.repro_source(program, {"status": "mismatch", "detail": "example"}))
    run = subprocess.run([sys.executable, str(repro)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok")
