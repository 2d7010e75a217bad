"""Engine schedules of a LayerNorm with weight and bias (4096x4096 bf16) on the engine model.

    .venv/bin/python benchmarks/layernorm_schedules.py [--target trn2]

Each schedule is a hand-written kernel (nisa text, run by build/bin/neuron-run with random
inputs; times only, no numbers checked), per 128 rows, two buffer slots per tile:

- stats "vector": bn_stats (8 chunks of 512) and bn_aggr on VectorE, rstd and -mean*rstd on
  [P, 1] columns, the normalize pass on ScalarE (an activation with scale_col=rstd and
  bias=-mean*rstd), then y * w and + b (tensor_tensor with a full [P, D] operand);
- stats "scalar" (one of the compiler's splits; it alternates splits over steps): the row
  sums of x and x^2 as ScalarE activations that accumulate, then (x - mean) * w and
  t * rstd + b (scalar_tensor_tensor);

- stats "scalar+psum": as "scalar", with w broadcast once into PSUM by TensorE (a matmul of
  a ones row by w's row per bank), so the VectorE pass that reads it streams one input
  (a 2-input VectorE op with one input in PSUM takes N cycles, not 2N);

with the two full-width passes on the engines named and y, t held in float32 or bf16. It
prints each engine's busy time: the busiest engine bounds the kernel whatever the pipelining,
so ``DMA busy / max(engine busy)`` bounds the fraction of the DMA roofline it can reach.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NEURON_RUN = ROOT / "build" / "bin" / "neuron-run"

ROWS, COLS, PARTS, CHUNK = 4096, 4096, 128, 512


def _sbuf(shape: str, dtype: str) -> str:
    return f"memref<{shape}x{dtype}, #nisa.mem<sbuf>>"


def _psum(shape: str) -> str:
    return f"memref<{shape}xf32, #nisa.mem<psum>>"


def _scalar_stats(
    s: str,
    mul: str,
    add: str,
    inner: str,
    tile: Any,
    column: str,
    rows: str,
    w_in_psum: bool,
) -> list[str]:
    """Slot `s`'s statistics and affine, the compiler's way: two accumulating ScalarE passes
    (sum of x, sum of x^2), [P, 1] column math, then two scalar_tensor_tensor passes; with
    `w_in_psum` the first reads w from the PSUM copy TensorE broadcast."""
    w, w_type = ("%wp", _psum(f"{PARTS}x{COLS}")) if w_in_psum else ("%wt", tile("bf16"))
    return [
        f"    nisa.activation identity %x{s}, %y{s} accumulate %sum{s} : "
        f"{tile('bf16')}, {tile(inner)}, {column}",
        f"    nisa.activation square %x{s}, %y{s} accumulate %sq{s} : "
        f"{tile('bf16')}, {tile(inner)}, {column}",
        f"    nisa.tensor_scalar multiply %sum{s}, %mu{s} {{imm = {1 / COLS!r} : f64}} : "
        f"{column}, {column}",
        # var = sumsq / D - mean^2; rstd = rsqrt(var + eps)
        f"    nisa.scalar_tensor_tensor multiply, subtract %mu{s}, %mu{s}, %m2{s} "
        f"{{imm = {COLS}.0 : f64}} : {column}, {column}, {column}",
        f"    nisa.tensor_tensor add %sq{s}, %m2{s}, %m2{s} : {column}, {column}, {column}",
        f"    nisa.activation rsqrt %m2{s}, %r{s} {{scale = {1 / COLS!r} : f64, "
        f"bias_imm = 1.0e-05 : f64}} : {column}, {column}",
        f"    nisa.scalar_tensor_tensor subtract, multiply %x{s}, {w}, %t{s} scalar %mu{s} "
        f"{{engine = #nisa.engine<{mul}>}} : {tile('bf16')}, {w_type}, {tile(inner)}, "
        f"{column}",
        f"    nisa.scalar_tensor_tensor multiply, add %t{s}, %bt, %o{s} scalar %r{s} "
        f"{{engine = #nisa.engine<{add}>}} : {tile(inner)}, {tile('bf16')}, {tile('bf16')}, "
        f"{column}",
        f"    nisa.dma_copy %o{s}, %ov{s} {{engine = #nisa.engine<scalar>}} : "
        f"{tile('bf16')}, {rows}",
    ]


def kernel(mul_engine: str, add_engine: str, inner: str, stats_on: str) -> str:
    """The kernel's nisa text. `stats_on` "vector": bn_stats/bn_aggr, a ScalarE normalize,
    then y * w on `mul_engine` and + b on `add_engine`; "scalar": the row sums of x and x^2 as
    ScalarE activations that accumulate (the compiler's split), then
    (x - mean) * w and t * rstd + b as scalar_tensor_tensor on those engines. y and t are
    held in `inner` (f32 or bf16)."""
    tile = lambda dt: _sbuf(f"{PARTS}x{COLS}", dt)  # noqa: E731
    stats = _sbuf(f"{PARTS}x{6 * COLS // CHUNK}", "f32")
    column = _sbuf(f"{PARTS}x1", "f32")
    pair = _sbuf(f"{PARTS}x2", "f32")
    hbm = f"memref<{ROWS}x{COLS}xbf16>"
    whole = f"memref<{PARTS}x{COLS}xbf16>"
    rows = f"memref<{PARTS}x{COLS}xbf16, strided<[{COLS}, 1], offset: ?>>"
    out = [
        f"func.func @layernorm(%x: {hbm}, %w: {whole}, %b: {whole}, %out: {hbm}) "
        "attributes {nisa.kernel, nisa.num_inputs = 3 : i64} {",
        "  %c0 = arith.constant 0 : index",
        "  %c1 = arith.constant 1 : index",
        f"  %tiles = arith.constant {ROWS // PARTS // 2} : index",
        f"  %tileElems = arith.constant {PARTS * COLS} : index",
        f"  %wt = memref.alloc() : {tile('bf16')}",
        f"  %bt = memref.alloc() : {tile('bf16')}",
        f"  nisa.dma_copy %w, %wt : {whole}, {tile('bf16')}",
        f"  nisa.dma_copy %b, %bt : {whole}, {tile('bf16')}",
    ]
    if stats_on == "scalar+psum":
        ones, wrow = _sbuf(f"1x{PARTS}", "bf16"), _sbuf(f"1x{COLS}", "bf16")
        out += [
            f"  %ones = memref.alloc() : {ones}",
            f"  %wrow = memref.alloc() : {wrow}",
            f"  %wp = memref.alloc() : {_psum(f'{PARTS}x{COLS}')}",
            f"  nisa.memset %ones, 1.0 : {ones}",
            f"  %w0 = memref.reinterpret_cast %w to offset: [0], sizes: [1, {COLS}], "
            f"strides: [{COLS}, 1] : {whole} to memref<1x{COLS}xbf16, strided<[{COLS}, 1]>>",
            f"  nisa.dma_copy %w0, %wrow : memref<1x{COLS}xbf16, strided<[{COLS}, 1]>>, {wrow}",
        ]
        for c in range(COLS // CHUNK):
            mov = (
                f"memref<1x{CHUNK}xbf16, strided<[{COLS}, 1], offset: {c * CHUNK}>, "
                "#nisa.mem<sbuf>>"
            )
            dst = (
                f"memref<{PARTS}x{CHUNK}xf32, strided<[{COLS}, 1], offset: {c * CHUNK}>, "
                "#nisa.mem<psum>>"
            )
            out += [
                f"  %wm{c} = memref.reinterpret_cast %wrow to offset: [{c * CHUNK}], sizes: [1, "
                f"{CHUNK}], strides: [{COLS}, 1] : {wrow} to {mov}",
                f"  %wd{c} = memref.reinterpret_cast %wp to offset: [{c * CHUNK}], sizes: "
                f"[{PARTS}, {CHUNK}], strides: [{COLS}, 1] : {_psum(f'{PARTS}x{COLS}')} to {dst}",
                f"  nisa.matmul %ones, %wm{c}, %wd{c} : {ones}, {mov}, {dst}",
            ]
    for s in "AB":
        out += [
            f"  %x{s} = memref.alloc() : {tile('bf16')}",
            f"  %y{s} = memref.alloc() : {tile(inner)}",
            f"  %t{s} = memref.alloc() : {tile(inner)}",
            f"  %o{s} = memref.alloc() : {tile('bf16')}",
            f"  %st{s} = memref.alloc() : {stats}",
            f"  %mv{s} = memref.alloc() : {pair}",
            f"  %r{s} = memref.alloc() : {column}",
            f"  %nb{s} = memref.alloc() : {column}",
            f"  %sum{s} = memref.alloc() : {column}",
            f"  %mu{s} = memref.alloc() : {column}",
            f"  %sq{s} = memref.alloc() : {column}",
            f"  %m2{s} = memref.alloc() : {column}",
        ]
    out.append("  scf.for %i = %c0 to %tiles step %c1 {")
    for k, s in enumerate("AB"):
        out += [
            f"    %twice{s} = arith.addi %i, %i : index",
            f"    %tile{s} = arith.addi %twice{s}, %c{k} : index",
            f"    %off{s} = arith.muli %tile{s}, %tileElems : index",
            f"    %xv{s} = memref.reinterpret_cast %x to offset: [%off{s}], sizes: [{PARTS}, "
            f"{COLS}], strides: [{COLS}, 1] : {hbm} to {rows}",
            f"    %ov{s} = memref.reinterpret_cast %out to offset: [%off{s}], sizes: [{PARTS}, "
            f"{COLS}], strides: [{COLS}, 1] : {hbm} to {rows}",
            f"    nisa.dma_copy %xv{s}, %x{s} : {rows}, {tile('bf16')}",
        ]
        if stats_on.startswith("scalar"):
            psum = stats_on == "scalar+psum"
            out += _scalar_stats(s, mul_engine, add_engine, inner, tile, column, rows, psum)
            continue
        for c in range(COLS // CHUNK):
            chunk = (
                f"memref<{PARTS}x{CHUNK}xbf16, strided<[{COLS}, 1], offset: {c * CHUNK}>, "
                "#nisa.mem<sbuf>>"
            )
            six = (
                f"memref<{PARTS}x6xf32, strided<[{6 * COLS // CHUNK}, 1], offset: {c * 6}>, "
                "#nisa.mem<sbuf>>"
            )
            out += [
                f"    %xc{s}{c} = memref.reinterpret_cast %x{s} to offset: [{c * CHUNK}], "
                f"sizes: [{PARTS}, {CHUNK}], strides: [{COLS}, 1] : {tile('bf16')} to {chunk}",
                f"    %sc{s}{c} = memref.reinterpret_cast %st{s} to offset: [{c * 6}], "
                f"sizes: [{PARTS}, 6], strides: [{6 * COLS // CHUNK}, 1] : {stats} to {six}",
                f"    nisa.bn_stats %xc{s}{c}, %sc{s}{c} : {chunk}, {six}",
            ]

        def half(k: int) -> str:
            return f"memref<{PARTS}x1xf32, strided<[2, 1], offset: {k}>, #nisa.mem<sbuf>>"

        out += [
            f"    nisa.bn_aggr %st{s}, %mv{s} : {stats}, {pair}",
            f"    %mean{s} = memref.reinterpret_cast %mv{s} to offset: [0], sizes: [{PARTS}, 1], "
            f"strides: [2, 1] : {pair} to {half(0)}",
            f"    %var{s} = memref.reinterpret_cast %mv{s} to offset: [1], sizes: [{PARTS}, 1], "
            f"strides: [2, 1] : {pair} to {half(1)}",
            f"    nisa.activation rsqrt %var{s}, %r{s} {{bias_imm = 1.0e-05 : f64}} : "
            f"{half(1)}, {column}",
            f"    nisa.scalar_tensor_tensor multiply, multiply %mean{s}, %r{s}, %nb{s} "
            f"{{imm = -1.0 : f64}} : {half(0)}, {column}, {column}",
            f"    nisa.activation identity %x{s}, %y{s} bias %nb{s} scale_col %r{s} : "
            f"{tile('bf16')}, {tile(inner)}, {column}, {column}",
            f"    nisa.tensor_tensor multiply %y{s}, %wt, %t{s} "
            f"{{engine = #nisa.engine<{mul_engine}>}} : {tile(inner)}, {tile('bf16')}, "
            f"{tile(inner)}",
            f"    nisa.tensor_tensor add %t{s}, %bt, %o{s} {{engine = #nisa.engine<{add_engine}>}}"
            f" : {tile(inner)}, {tile('bf16')}, {tile('bf16')}",
            f"    nisa.dma_copy %o{s}, %ov{s} {{engine = #nisa.engine<scalar>}} : "
            f"{tile('bf16')}, {rows}",
        ]
    out += ["  }", "  return", "}"]
    return "\n".join(out) + "\n"


SCHEDULES = [
    ("vector", "gpsimd", "vector", "f32"),
    ("vector", "vector", "gpsimd", "f32"),
    ("vector", "vector", "gpsimd", "bf16"),
    ("vector", "gpsimd", "gpsimd", "bf16"),
    ("vector", "vector", "vector", "bf16"),
    ("scalar", "vector", "gpsimd", "f32"),
    ("scalar", "vector", "gpsimd", "bf16"),
    ("scalar+psum", "vector", "gpsimd", "f32"),
]


def busy(text: str, target: str) -> dict[str, float]:
    """Each engine's busy time (us) neuron-run reports for the kernel `text`."""
    with tempfile.NamedTemporaryFile("w", suffix=".mlir") as f:
        f.write(text)
        f.flush()
        run = subprocess.run(
            [str(NEURON_RUN), f"--target={target}", f.name],
            capture_output=True,
            text=True,
            check=False,
        )
    if run.returncode != 0:
        raise RuntimeError(f"neuron-run failed:\n{run.stderr}")
    times = {}
    for line in run.stdout.splitlines():
        m = re.match(r"^(\w+)\s+([0-9.]+)\s+[0-9.]+%$", line)
        if m:
            times[m.group(1)] = float(m.group(2))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="trn2")
    args = parser.parse_args()
    if not NEURON_RUN.exists():
        sys.exit(f"{NEURON_RUN} is missing: build first (scripts/setup.sh)")
    print(f"LayerNorm {ROWS}x{COLS} bf16 on {args.target}: engine busy time (us)")
    print(
        f"{'stats':>11} {'*w on':>7} {'+b on':>7} {'y, t':>5}   dma  vector  scalar  gpsimd  bound"
    )
    for stats_on, mul, add, inner in SCHEDULES:
        t = busy(kernel(mul, add, inner, stats_on), args.target)
        engines = max(t["vector"], t["scalar"], t["gpsimd"])
        print(
            f"{stats_on:>11} {mul:>7} {add:>7} {inner:>5} {t['dma']:6.1f} {t['vector']:7.1f} "
            f"{t['scalar']:7.1f} {t['gpsimd']:7.1f} {100 * t['dma'] / max(engines, t['dma']):6.1f}%"
        )


if __name__ == "__main__":
    main()
