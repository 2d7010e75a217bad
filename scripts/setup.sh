#!/usr/bin/env bash
# Brings a fresh Debian 12/13 machine to a built, installed TorchNeuron, and is
# quick (a no-op ninja check) when everything is already in place.
#   Debian packages: MLIR/LLVM 19, nlohmann_json, simdjson, Catch2, Eigen, ninja, ccache, cmake
#   .venv:           torch==2.13.0 (CPU wheel; always pinned), test tools, build tools
#   build/:          the CMake build, installed into .venv as an editable package
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { echo "[setup] $*" >&2; }

APT_PACKAGES=(libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools nlohmann-json3-dev
              libsimdjson-dev catch2 libeigen3-dev ninja-build ccache cmake g++)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >&2
fi

PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
# transformers, torchao: the tests run their models and float8 recipes as users write them
# (neither pulls a torch).
# pytest-xdist: scripts/test.sh runs the tests on every core.
PIP_PACKAGES=(torch==2.13.0 numpy expecttest pytest pytest-xdist==3.8.0 pybind11 scikit-build-core
  ruff pyarrow transformers==5.24.0 torchao==0.18.0)
# The stamp holds the package list, so adding a package reinstalls.
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.deps-ok" 2>/dev/null)" != "${PIP_PACKAGES[*]}" ]; then
  say "setting up $VENV (torch==2.13.0 CPU wheel and test tools)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PIP_PACKAGES[@]}" >&2
  echo "${PIP_PACKAGES[*]}" > "$VENV/.deps-ok"
fi

# The editable install drives CMake into build/. Afterwards an incremental
# ninja build tells whether anything changed; the venv copies of the built
# artifacts are refreshed only then.
stamp() {
  cat pyproject.toml CMakeLists.txt
  stat -c '%n %Y' build/python/torchneuron/_C*.so build/python/torchneuron/_device*.so build/python/torchneuron/_distributed*.so build/bin/* 2>/dev/null || true
}
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Paths relative to the checkout: another clone or worktree hits the same cache entries.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
if [ -f build/build.ninja ] && [ -f build/.install-stamp ]; then
  ninja -C build >/dev/null || { ninja -C build >&2; exit 1; }
  [ "$(stamp | sha1sum | cut -d' ' -f1)" = "$(cat build/.install-stamp)" ] && exit 0
fi
# Debian's CMake (installed above), not whatever `cmake` comes first on PATH: a pyenv shim there
# has failed to run inside pip's build ("Could not find CMake with version >=3.20").
export CMAKE_EXECUTABLE="${CMAKE_EXECUTABLE:-/usr/bin/cmake}"
say "building (ninja in build/, installed into .venv; the first build takes a few minutes)"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  -e . >&2
stamp | sha1sum | cut -d' ' -f1 > build/.install-stamp
