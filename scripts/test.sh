#!/usr/bin/env bash
# Runs every test: lit + FileCheck and Catch2 (through ctest), then pytest.
# Sets everything up first on a fresh machine (scripts/setup.sh).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup.sh" || exit 1

echo "== ruff"
.venv/bin/ruff check python tests/python examples scripts
ruff_rc=$?

echo "== ctest (lit, unit)"
ctest --test-dir build --output-on-failure
ctest_rc=$?

echo "== pytest"
.venv/bin/python -m pytest -q -p no:cacheprovider tests/python "$@"
pytest_rc=$?

if [ $ruff_rc -ne 0 ] || [ $ctest_rc -ne 0 ] || [ $pytest_rc -ne 0 ]; then
  echo "FAILED: ruff=$ruff_rc ctest=$ctest_rc pytest=$pytest_rc" >&2
  exit 1
fi
