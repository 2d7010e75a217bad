#!/usr/bin/env bash
# Runs the libFuzzer targets (tests/fuzz) on the inputs TorchNeuron parses:
#   FuzzProgram    kernel programs (the runtime's loader, verifier, executor, timing model)
#   FuzzFxImport   FX graph documents (the importer and the whole pipeline)
#   FuzzMlirInput  neuron-opt's input (parser, verifiers, printers)
# each for SECONDS (default 600), with AddressSanitizer and UBSan, from a seed corpus built out
# of the test inputs. A crash leaves its input in build-sanitize/fuzz/<target>/crash-*; add it to
# tests/fuzz/regressions/<target>/ so that ctest replays it from then on.
#   scripts/fuzz-parsers.sh [SECONDS] [TARGET ...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_EACH="${1:-600}"
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(FuzzProgram FuzzFxImport FuzzMlirInput)
"$ROOT/scripts/build-sanitize.sh"

OUT="$ROOT/build-sanitize/fuzz"
seed() { # target -> corpus folder with the test inputs it reads
  local corpus="$OUT/$1/corpus"
  mkdir -p "$corpus"
  case "$1" in
    FuzzProgram)
      # Programs of a few small models, compiled by the regular build.
      "$ROOT/.venv/bin/python" - "$corpus" <<'PY'
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import torchneuron.backend as backend

out = Path(sys.argv[1])
cases = {
    "mlp": (lambda x, w: F.gelu(x @ w).sum(-1), (torch.randn(64, 32), torch.randn(32, 48))),
    "softmax": (lambda x: torch.softmax(x, -1), (torch.randn(130, 70),)),
    "cat": (lambda x: torch.cat([x[:, :5].relu(), -x[:, 5:]], 1), (torch.randn(33, 12),)),
    "bf16": (lambda x, w: x @ w, (torch.randn(40, 64).bfloat16(), torch.randn(64, 20).bfloat16())),
}
kernels = []
real = backend._compile_document
backend._compile_document = lambda *a: kernels.append(real(*a)) or kernels[-1]
for name, (fn, args) in cases.items():
    kernels.clear()
    torch.compile(fn, backend="neuron")(*args)
    for i, k in enumerate(kernels):
        (out / f"{name}{i}.json").write_text(k.program_json)
PY
      ;;
    FuzzFxImport) cp tests/lit/importer/Inputs/*.json "$corpus"/ ;;
    FuzzMlirInput)
      find tests/lit -name '*.mlir' | while read -r f; do
        awk -v d="$corpus" -v b="$(echo "$f" | tr / _)" '
          /^\/\/ -----/ { n++ ; next } { print > (d "/" b "." n) }' "$f"
      done ;;
  esac
  [ -d "tests/fuzz/regressions/$1" ] && cp "tests/fuzz/regressions/$1"/* "$corpus"/ 2>/dev/null || true
  # A dictionary of the seeds' quoted words (keys, op names) and punctuation, so mutations
  # make documents that get past the JSON and MLIR parsers.
  "$ROOT/.venv/bin/python" - "$corpus" "$OUT/$1/dict" <<'PY'
import json
import re
import sys
from pathlib import Path

words = set()
for f in Path(sys.argv[1]).iterdir():
    words.update(re.findall(r'"[A-Za-z_.#][A-Za-z0-9_.<>#-]*"', f.read_text(errors="replace")))
words.update(["{", "}", "[", "]", ":", ",", "-1", "0", "128", "null", "%", "->", "!"])
Path(sys.argv[2]).write_text("".join(json.dumps(w) + "\n" for w in sorted(words)))
PY
  echo "$corpus"
}

# allow_user_poisoning=0: LLVM's BumpPtrAllocator poisons its slabs when its header is compiled
# with ASan (our code) but not in Debian's uninstrumented libMLIR, which shares the allocator;
# memory libMLIR hands out from a slab our code poisoned would be reported as use-after-poison.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:allow_user_poisoning=0}"
status=0
for t in "${TARGETS[@]}"; do
  corpus="$(seed "$t")"
  echo "== $t: ${SECONDS_EACH} s from $(ls "$corpus" | wc -l) seed inputs" >&2
  (cd "$OUT/$t" && "$ROOT/build-sanitize/bin/$t" -max_total_time="$SECONDS_EACH" \
    -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 -dict=dict corpus) > "$OUT/$t/log.txt" 2>&1 \
    && echo "$t: no crash ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/$t/log.txt" | grep -o '[0-9]*$') runs)" \
    || { status=1; echo "$t: CRASH, see $OUT/$t/log.txt and $OUT/$t/crash-*"; }
done
exit $status
