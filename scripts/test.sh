#!/usr/bin/env bash
# Runs every test: lit + FileCheck and Catch2 (through ctest), then pytest.
# Sets everything up first on a fresh machine (scripts/setup.sh).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup.sh" || exit 1

if [ "${1:-}" = "--sanitize" ]; then
  # ASan + UBSan (build-sanitize/, clang): lit and Catch2, then the pytest files that drive the
  # C++ hardest, with the instrumented extension loaded into an uninstrumented Python.
  shift
  "$ROOT/scripts/build-sanitize.sh" || exit 1
  # allow_user_poisoning=0: see scripts/fuzz-parsers.sh (LLVM allocators shared with libMLIR).
  export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allow_user_poisoning=0"
  export UBSAN_OPTIONS="print_stacktrace=1"
  echo "== ctest (sanitized)"
  ctest --test-dir build-sanitize --output-on-failure
  ctest_rc=$?
  echo "== pytest (sanitized extension)"
  TORCHNEURON_NATIVE_LIBRARY="$(ls build-sanitize/python/torchneuron/_C*.so)" \
    LD_PRELOAD="$(clang-19 -print-file-name=libclang_rt.asan-x86_64.so)" \
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/python/test_backend.py \
    tests/python/test_ops.py tests/python/test_models.py tests/python/test_sync_check.py \
    tests/python/test_concurrency.py tests/python/test_profile.py "$@"
  pytest_rc=$?
  [ $ctest_rc -eq 0 ] && [ $pytest_rc -eq 0 ] || { echo "FAILED: ctest=$ctest_rc pytest=$pytest_rc" >&2; exit 1; }
  exit 0
fi

echo "== ruff"
.venv/bin/ruff check python tests/python examples scripts benchmarks
ruff_rc=$?

echo "== ctest (lit, unit)"
ctest --test-dir build --output-on-failure
ctest_rc=$?

echo "== pytest"
# One worker per core (pytest-xdist): every test compiles and runs its own programs, in its own
# temporary directories, so they are independent.
.venv/bin/python -m pytest -q -p no:cacheprovider -n auto tests/python "$@"
pytest_rc=$?

if [ $ruff_rc -ne 0 ] || [ $ctest_rc -ne 0 ] || [ $pytest_rc -ne 0 ]; then
  echo "FAILED: ruff=$ruff_rc ctest=$ctest_rc pytest=$pytest_rc" >&2
  exit 1
fi
