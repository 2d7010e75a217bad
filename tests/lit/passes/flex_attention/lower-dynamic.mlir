// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// Decode over a KV cache of a run-time length s0 (issue #16): 4 query heads
// of 2 rows over 2 key heads (GQA), one program for every length. Per key
// head (unrolled: its keys start at a multiple of s0) the 2 query heads'
// rows are one query tile of 4 rows; keys stream in steps of 512: the last
// s0 mod 512 keys and the first 3 full steps' are loaded first (for key
// head 1, before key head 0's steps), then the full steps, counted at run
// time, their loads 3 steps ahead, then the last step with size-expression
// extents.

// CHECK-LABEL: func.func @decode(
// CHECK-DAG: %[[FULL:.*]] = arith.floordivsi %arg4, %c512 : index
// CHECK-DAG: %[[REST:.*]] = arith.remsi %arg4, %c512 : index
// CHECK-DAG: %[[UNITS:.*]] = arith.ceildivsi %[[REST]], %c128 : index
// Q^T of both query heads of key head 0, then the state.
// CHECK: nisa.dma_copy {{.*}} : memref<64x2xf32, strided<[1, 64], offset: ?>>, memref<64x2xf32, strided<[8, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy {{.*}} : memref<64x2xf32, strided<[1, 64], offset: ?>>, memref<64x2xf32, strided<[8, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.memset {{.*}} 3.40282347E+38
// The last keys' K^T, then V a unit at a time (loops of zero or one
// iteration).
// CHECK: memref.reinterpret_cast %arg1 to offset: [%{{.*}}], sizes: [64, %[[REST]]], strides: [1, 64]
// CHECK: nisa.dma_copy
// CHECK: scf.for %{{.*}} = %c0 to %{{.*}} step %c1 {
// CHECK: memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [%{{.*}}, 64], strides: [64, 1]
// The full steps: 3 loads ahead, then groups of 4 (load 3 ahead, compute).
// CHECK: nisa.dma_copy {{.*}} : memref<64x512xf32, strided<[1, 64], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<128x4x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK: %[[GROUPS:.*]] = arith.floordivsi %{{.*}}, %c4 : index
// CHECK: scf.for %{{.*}} = %c0 to %[[GROUPS]] step %c1 {
// A full step: S = Q K^T, -max, alpha, P with its row sums, P^T, O += P V.
// CHECK: nisa.matmul {{.*}} : memref<64x4xf32{{.*}}>, memref<64x512xf32{{.*}}>, memref<4x512xf32{{.*}}psum
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.scalar_tensor_tensor multiply, min
// CHECK: nisa.activation exp
// CHECK: nisa.activation exp {{.*}} accumulate
// CHECK-COUNT-4: nisa.matmul {{.*}} : memref<4x128xf32
// CHECK: nisa.copy
// CHECK: nisa.copy
// CHECK-COUNT-4: nisa.matmul {{.*}} : memref<128x4xf32
// CHECK: nisa.scalar_tensor_tensor multiply, add
// The last step: its extents are the rest.
// CHECK: nisa.matmul {{.*}} : memref<64x4xf32{{.*}}>, memref<64x?xf32{{.*}}>, memref<4x?xf32{{.*}}psum
// CHECK: nisa.tensor_reduce max {{.*}} : memref<4x?xf32
// Then out = O / l, stored per query head.
// CHECK: nisa.tensor_scalar divide
// CHECK: nisa.dma_copy {{.*}} : memref<2x64xf32, strided<[128, 1], offset: ?>, #nisa.mem<sbuf>>, memref<2x64xf32
// CHECK: nisa.dma_copy {{.*}} : memref<2x64xf32, strided<[128, 1], offset: ?>, #nisa.mem<sbuf>>, memref<2x64xf32

// The program: step counts and the last step's extents as size expressions;
// key head 1's keys start s0 * 64 elements in.
// PROGRAM: "const":"(s0*64)"
// PROGRAM: "count":"floordiv(max((floordiv(s0,512)-3),0),4)"
// PROGRAM: "shape":[4,"mod(s0,512)"]
// PROGRAM: "params":[{"min":1,"name":"s0"}]
func.func @decode(%q: tensor<1x4x2x64xf32>, %k: tensor<1x2x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 2, s0, 64)>}, %v: tensor<1x2x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 2, s0, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> tensor<1x4x2x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<2> : tensor<1x1x1x1xi8>, scale = 1.250000e-01 : f64} : tensor<1x4x2x64xf32>, tensor<1x2x?x64xf32>, tensor<1x2x?x64xf32> -> tensor<1x4x2x64xf32>, tensor<1x4x2xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %t = neuron.constant dense<true> : tensor<i1>
      neuron.yield %t : tensor<i1>
    }
  return %o : tensor<1x4x2x64xf32>
}
