// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// torch._grouped_mm of rows in groups (an MoE layer's experts): each
// group's row count, end minus start, is a size parameter (the offsets'
// values, bound when the program is launched). With K whole tiles, a
// group's x^T loads by one DMA transpose of its run-time row count and its
// weights by one transfer per K tile, both resident (two tiles of rows, two
// slots of weights, group 1's loads issued before group 0 computes); the
// short last tile computes first, then the full tiles; the rows after the
// last group are zeros.

// CHECK-LABEL: func.func @experts(
// CHECK: %[[W:.*]] = memref.alloc() : memref<128x128xbf16, #nisa.mem<sbuf>>
// CHECK: %[[X0:.*]] = memref.alloc() : memref<128x384xbf16, #nisa.mem<sbuf>>
// CHECK: %[[X1:.*]] = memref.alloc() : memref<128x384xbf16, #nisa.mem<sbuf>>
// CHECK: memref.alloc() : memref<128x1024xf32, #nisa.mem<psum>>
// CHECK: %[[ROWS1:.*]] = arith.subi %arg5, %arg4 : index
// CHECK: scf.for
// CHECK: memref.reinterpret_cast %[[X0]] to offset: [%c0], sizes: [128, 1, %arg4], strides: [384, 384, 1]
// CHECK: memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [128, 1, %arg4], strides: [1, 128, 128]
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c0], sizes: [128, 64], strides: [64, 1]
// CHECK: scf.for
// CHECK: memref.reinterpret_cast %[[X1]] to offset: [%c0], sizes: [128, 1, %[[ROWS1]]]
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c8192], sizes: [128, 64], strides: [64, 1]
// CHECK: %[[TAIL0:.*]] = arith.remsi %arg4, %c128 : index
// CHECK: nisa.matmul
// CHECK: memref.reinterpret_cast %arg3 to offset: [%{{.*}}], sizes: [%[[TAIL0]], 64], strides: [64, 1]
// CHECK: nisa.matmul
// CHECK: memref.reinterpret_cast %arg3 to offset: [%{{.*}}], sizes: [128, 64], strides: [64, 1]
// CHECK: %[[REST:.*]] = arith.subi %c300, %arg5 : index
// CHECK: nisa.memset
// CHECK: arith.floordivsi %[[REST]], %c128 : index

// The program's parameters and loop counts as expressions of them: group
// 1's rows, end minus start, and the rows after the last group.
// PROGRAM: "count":"min(max(offs__end0,0),1)"
// PROGRAM: "count":"min(max((offs__end1-offs__end0),0),1)"
// PROGRAM: "count":"floordiv((300-offs__end1),128)"
// PROGRAM: "count":"min(max((300-offs__end1),0),1)"
// PROGRAM: "params":[{"max":300,"min":0,"name":"offs__end0"},{"max":300,"min":0,"name":"offs__end1"}]

func.func @experts(%x: tensor<300x128xbf16>, %w: tensor<2x128x64xbf16>, %offs: tensor<2xi32>,
                   %e0: index {neuron.size = {name = "offs__end0", min = 0 : i64, max = 300 : i64}},
                   %e1: index {neuron.size = {name = "offs__end1", min = 0 : i64, max = 300 : i64}}) -> tensor<300x64xbf16> {
  %y = neuron.grouped_matmul %x, %w ends(%e0, %e1) : tensor<300x128xbf16>, tensor<2x128x64xbf16> -> tensor<300x64xbf16>
  return %y : tensor<300x64xbf16>
}
