"""The engine model against the published figures (scripts/fidelity.py, docs/FIDELITY.md).

Fit points confirm the fits recorded in runtime/target/*.json; validation points check
published figures nothing was fitted to, each within its stated tolerance. The committed report
is what the script generates, so it cannot drift from the model or the target files.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_fidelity() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fidelity", REPO / "scripts" / "fidelity.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["fidelity"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


fidelity = _load_fidelity()
POINTS = fidelity.points()


@pytest.mark.parametrize("point", POINTS, ids=[p.ident for p in POINTS])
def test_calibration_point(point: fidelity.Point, real_native: ModuleType) -> None:
    model = point.model()
    assert point.ok(model), (
        f"{point.ident}: model {model:.4g} {point.unit} is {point.error(model):+.1%} from the "
        f"published {point.low:g}-{point.high:g}, beyond the {point.tolerance:.0%} tolerance"
    )


def test_every_fitted_figure_has_its_fit_points() -> None:
    """A fitted figure is confirmed by fit points naming it, and only fitted figures are."""
    confirmed = {(p.target, f) for p in POINTS if p.role == "fit" for f in p.fits}
    for target in fidelity.TARGETS:
        doc = json.loads((REPO / "runtime" / "target" / f"{target}.json").read_text())
        fitted = {k for k, v in doc.items() if isinstance(v, dict) and v["kind"] == "fitted"}
        assert fitted == {f for t, f in confirmed if t == target}, target
    assert all(p.role in ("fit", "validation") for p in POINTS)
    assert all(p.sources and set(p.sources) <= set(fidelity.SOURCES) for p in POINTS)
    # Both targets are validated, not only the one the fits were made on.
    assert {p.target for p in POINTS if p.role == "validation"} == set(fidelity.TARGETS)


def test_every_cited_source_key_resolves() -> None:
    """Figures cite trainium.md's source keys; the report lists each with its address."""
    import re

    for target in fidelity.TARGETS:
        doc = json.loads((REPO / "runtime" / "target" / f"{target}.json").read_text())
        for key, v in doc.items():
            if isinstance(v, dict):
                for cited in re.findall(r"\bS\d+\b", v["source"] + v.get("fit_to", "")):
                    assert cited in fidelity.SOURCES, f"{target}.{key} cites {cited}"


def test_committed_report_is_generated(real_native: ModuleType) -> None:
    committed = (REPO / "docs" / "FIDELITY.md").read_text()
    assert committed == fidelity.generate(), (
        "docs/FIDELITY.md differs from what scripts/fidelity.py generates: run "
        ".venv/bin/python scripts/fidelity.py"
    )
