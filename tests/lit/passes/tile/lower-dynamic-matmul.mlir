// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// A linear over rows known at run time (issue #16): one size-generic GEMM.
// M blocks are sized as for a large M (4 tiles of 128 rows); the full
// blocks are counted at run time (the first panel, pairs of blocks in a
// loop with constant panel slots, the one left, then the last block, its
// slot computed); the rest is one block of 1..4 tiles, each shape in a
// loop of zero or one iteration, whose last tile's DMAs move only the rows
// left (the panel load, the stores), the compute on whole tiles.

// CHECK-LABEL: func.func @linear(
// CHECK: %[[FULL:.*]] = arith.floordivsi %arg3, %c512 : index
// CHECK: %[[F0:.*]] = arith.maxsi %[[FULL]], %c0
// CHECK: %[[FIRST:.*]] = arith.minsi %[[F0]], %c1
// CHECK: scf.for %{{.*}} = %c0 to %[[FIRST]] step %c1 {
// CHECK: %[[STEADY:.*]] = arith.subi %[[FULL]], %c1
// CHECK: %[[STEADY0:.*]] = arith.maxsi %[[STEADY]], %c0
// CHECK: %[[PAIRS:.*]] = arith.floordivsi %[[STEADY0]], %c2
// CHECK: scf.for %{{.*}} = %c0 to %[[PAIRS]] step %c1 {
// CHECK-COUNT-8: nisa.matmul
// CHECK: }
// CHECK: scf.for %{{.*}} = %c0 to %[[FIRST]] step %c1 {
// CHECK: arith.remsi %{{.*}}, %c2
// CHECK: %[[REST:.*]] = arith.remsi %arg3, %c512 : index
// CHECK: %[[TILES:.*]] = arith.ceildivsi %[[REST]], %c128 : index
// CHECK: scf.for
// CHECK: memref.reinterpret_cast %arg0 to offset: [%{{.*}}], sizes: [64, %[[REST]]], strides: [1, 64]
// CHECK: nisa.matmul {{.*}} memref<64x128xf32
// CHECK: memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [%[[REST]], 96], strides: [96, 1]
// CHECK: scf.for
// CHECK: %[[LAST2:.*]] = arith.subi %[[REST]], %c128 : index
// CHECK-COUNT-2: nisa.matmul {{.*}} memref<64x128xf32
// CHECK: memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [%[[LAST2]], 96], strides: [96, 1]
// CHECK: scf.for
// CHECK-COUNT-3: nisa.matmul {{.*}} memref<64x128xf32
// CHECK: scf.for
// CHECK: %[[LAST4:.*]] = arith.subi %[[REST]], %c384 : index
// CHECK-COUNT-4: nisa.matmul {{.*}} memref<64x128xf32
// CHECK: memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [%[[LAST4]], 96], strides: [96, 1]

// The program's loop counts (each after its loop's body) and the short
// tile's views as size expressions.
// PROGRAM: "count":"min(max(floordiv(s0,512),0),1)"
// PROGRAM: "count":"floordiv(max((floordiv(s0,512)-1),0),2)"
// PROGRAM: "count":"min(max((max((floordiv(s0,512)-1),0)-(floordiv(max((floordiv(s0,512)-1),0),2)*2)),0),1)"
// PROGRAM: "shape":[64,"mod(s0,512)"]
// PROGRAM: "shape":["mod(s0,512)",96]
// PROGRAM: "count":"(min(max(ceildiv(mod(s0,512),128),0),1)-min(max((ceildiv(mod(s0,512),128)-1),0),1))"
// PROGRAM: "shape":["(mod(s0,512)-128)",96]
// PROGRAM: "count":"(min(max((ceildiv(mod(s0,512),128)-1),0),1)-min(max((ceildiv(mod(s0,512),128)-2),0),1))"
// PROGRAM: "shape":["(mod(s0,512)-384)",96]
// PROGRAM: "count":"(min(max((ceildiv(mod(s0,512),128)-3),0),1)-min(max((ceildiv(mod(s0,512),128)-4),0),1))"

func.func @linear(%x: tensor<?x64xf32> {neuron.dims = affine_map<()[s0] -> (s0, 64)>}, %w: tensor<64x96xf32>, %n: index {neuron.size = {name = "s0", min = 1 : i64, max = 4096 : i64}}) -> (tensor<?x96xf32> {neuron.dims = affine_map<()[s0] -> (s0, 96)>}) {
  %y = neuron.matmul %x, %w : tensor<?x64xf32>, tensor<64x96xf32> -> tensor<?x96xf32>
  return %y : tensor<?x96xf32>
}
