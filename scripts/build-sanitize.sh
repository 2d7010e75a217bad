#!/usr/bin/env bash
# Builds build-sanitize/: everything (tools, unit tests, the _C extension) with
# clang, AddressSanitizer and UBSan, plus the libFuzzer targets (tests/fuzz).
# Used by `scripts/test.sh --sanitize` and scripts/fuzz-parsers.sh. Installs
# Debian's clang-19 and its sanitizer runtimes when missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/setup.sh" # Debian packages, .venv, the regular build

missing=()
for p in clang-19 libclang-rt-19-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[sanitize] installing Debian packages: ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >&2
fi

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Paths relative to the checkout: another clone or worktree hits the same cache entries.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
if [ ! -f build-sanitize/build.ninja ]; then
  cmake -G Ninja -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
    -DTORCHNEURON_SANITIZE=ON -DTORCHNEURON_FUZZERS=ON \
    -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir -DLLVM_DIR=/usr/lib/llvm-19/lib/cmake/llvm \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-19/build/utils/lit/lit.py \
    -DPython_EXECUTABLE="$ROOT/.venv/bin/python" >&2
fi
echo "[sanitize] building build-sanitize/ (the first build takes several minutes)" >&2
ninja -C build-sanitize >&2
