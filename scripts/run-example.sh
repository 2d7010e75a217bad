#!/usr/bin/env bash
# Compiles an example model with torch.compile(backend="neuron"), runs it on
# the engine model and prints its agreement with eager PyTorch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/python" "$ROOT/examples/gpt2_block.py" "$@"
