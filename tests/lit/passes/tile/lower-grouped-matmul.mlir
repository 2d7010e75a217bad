// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// torch._grouped_mm of rows in groups (an MoE layer's experts): each group
// is a GEMM whose row count, end minus start, is a size parameter (the
// offsets' values, bound when the program is launched), its rows and
// outputs addressed from its start and its weights from its index; then
// zeros in the rows after the last group.

// CHECK-LABEL: func.func @experts(
// CHECK: arith.floordivsi %arg4, %c512 : index
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c0]
// CHECK: nisa.matmul
// CHECK: %[[ROWS1:.*]] = arith.subi %arg5, %arg4 : index
// CHECK: arith.floordivsi %[[ROWS1]], %c512 : index
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c8192]
// CHECK: nisa.matmul
// CHECK: %[[REST:.*]] = arith.subi %c300, %arg5 : index
// CHECK: nisa.memset
// CHECK: arith.floordivsi %[[REST]], %c128 : index
// CHECK: memref.reinterpret_cast %arg3 to offset: [%{{.*}}], sizes: [128, 64]

// The program's parameters and loop counts as expressions of them: group
// 1's rows, end minus start, and the rows after the last group.
// PROGRAM: "count":"min(max(floordiv(offs__end0,512),0),1)"
// PROGRAM: "count":"min(max(floordiv((offs__end1-offs__end0),512),0),1)"
// PROGRAM: "count":"floordiv((300-offs__end1),128)"
// PROGRAM: "count":"min(max((300-offs__end1),0),1)"
// PROGRAM: "params":[{"max":300,"min":0,"name":"offs__end0"},{"max":300,"min":0,"name":"offs__end1"}]

func.func @experts(%x: tensor<300x128xbf16>, %w: tensor<2x128x64xbf16>, %offs: tensor<2xi32>,
                   %e0: index {neuron.size = {name = "offs__end0", min = 0 : i64, max = 300 : i64}},
                   %e1: index {neuron.size = {name = "offs__end1", min = 0 : i64, max = 300 : i64}}) -> tensor<300x64xbf16> {
  %y = neuron.grouped_matmul %x, %w ends(%e0, %e1) : tensor<300x128xbf16>, tensor<2x128x64xbf16> -> tensor<300x64xbf16>
  return %y : tensor<300x64xbf16>
}
