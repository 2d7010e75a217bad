// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// torch._grouped_mm of rows in groups (an MoE layer's experts): each
// group's row count, end minus start, is a size parameter (the offsets'
// values, bound when the program is launched). With K whole tiles, a
// group's x^T loads by one DMA transpose of its run-time row count and its
// weights by transfers of K tiles, both resident. K tile kt holds K row
// p * 2 + kt on partition p (x^T too), so one transfer moves a partition's
// two rows of a group's weights as one run. Three slots of weights: groups
// 0 and 1 load first, group 2's after group 0's last store (the DMA queues
// serve in program order: ahead of it they would hold the stores up);
// group 1's rows load before group 0 computes, group 2's before group 1.
// The short last tile computes first, then the full tiles; the rows after
// the last group are zeros.

// CHECK-LABEL: func.func @experts(
// CHECK: %[[W:.*]] = memref.alloc() : memref<128x384xbf16, #nisa.mem<sbuf>>
// CHECK: %[[X0:.*]] = memref.alloc() : memref<128x768xbf16, #nisa.mem<sbuf>>
// CHECK: %[[X1:.*]] = memref.alloc() : memref<128x768xbf16, #nisa.mem<sbuf>>
// CHECK: memref.alloc() : memref<128x1024xf32, #nisa.mem<psum>>
// CHECK: %[[ROWS1:.*]] = arith.subi %arg5, %arg4 : index
// CHECK: %[[ROWS2:.*]] = arith.subi %arg6, %arg5 : index
// CHECK: scf.for
// CHECK: memref.reinterpret_cast %[[X0]] to offset: [%c0], sizes: [128, 2, %arg4], strides: [768, 384, 1]
// CHECK: memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [128, 2, %arg4], strides: [2, 1, 256]
// CHECK: memref.reinterpret_cast %[[W]] to offset: [%c0], sizes: [128, 2, 64], strides: [384, 64, 1]
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c0], sizes: [128, 2, 64], strides: [128, 64, 1]
// CHECK: memref.reinterpret_cast %[[W]] to offset: [%c128], sizes: [128, 2, 64], strides: [384, 64, 1]
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c16384], sizes: [128, 2, 64], strides: [128, 64, 1]
// CHECK: memref.reinterpret_cast %[[X1]] to offset: [%c0], sizes: [128, 2, %[[ROWS1]]]
// CHECK: %[[TAIL0:.*]] = arith.remsi %arg4, %c128 : index
// CHECK: nisa.matmul
// CHECK: memref.reinterpret_cast %arg3 to offset: [%{{.*}}], sizes: [%[[TAIL0]], 64], strides: [64, 1]
// CHECK: nisa.matmul
// CHECK: memref.reinterpret_cast %arg3 to offset: [%{{.*}}], sizes: [128, 64], strides: [64, 1]
// CHECK: memref.reinterpret_cast %[[W]] to offset: [%c256], sizes: [128, 2, 64], strides: [384, 64, 1]
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c32768], sizes: [128, 2, 64], strides: [128, 64, 1]
// CHECK: memref.reinterpret_cast %[[X0]] to offset: [%c0], sizes: [128, 2, %[[ROWS2]]]
// CHECK: nisa.matmul
// CHECK: %[[REST:.*]] = arith.subi %c300, %arg6 : index
// CHECK: nisa.memset
// CHECK: arith.floordivsi %[[REST]], %c128 : index

// The program's parameters and loop counts as expressions of them: group
// 1's rows, end minus start, and the rows after the last group.
// PROGRAM: "count":"min(max(offs__end0,0),1)"
// PROGRAM: "count":"min(max((offs__end1-offs__end0),0),1)"
// PROGRAM: "count":"floordiv((300-offs__end2),128)"
// PROGRAM: "count":"min(max((300-offs__end2),0),1)"
// PROGRAM: "params":[{"max":300,"min":0,"name":"offs__end0"},{"max":300,"min":0,"name":"offs__end1"},{"max":300,"min":0,"name":"offs__end2"}]

func.func @experts(%x: tensor<300x256xbf16>, %w: tensor<3x256x64xbf16>, %offs: tensor<3xi32>,
                   %e0: index {neuron.size = {name = "offs__end0", min = 0 : i64, max = 300 : i64}},
                   %e1: index {neuron.size = {name = "offs__end1", min = 0 : i64, max = 300 : i64}},
                   %e2: index {neuron.size = {name = "offs__end2", min = 0 : i64, max = 300 : i64}}) -> tensor<300x64xbf16> {
  %y = neuron.grouped_matmul %x, %w ends(%e0, %e1, %e2) : tensor<300x256xbf16>, tensor<3x256x64xbf16> -> tensor<300x64xbf16>
  return %y : tensor<300x64xbf16>
}
