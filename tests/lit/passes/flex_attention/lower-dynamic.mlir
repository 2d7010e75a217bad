// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// Decode over a KV cache of a run-time length s0 (issue #16): 4 query heads
// of 2 rows over 2 key heads (GQA), one program for every length, on the
// decode kernel (LowerDecodeAttention.cpp). Per key head (unrolled: its keys
// start at a multiple of s0) the 2 query heads' rows are one Q^T of 4
// columns; keys stream in full blocks of 16 x 128 keys (8 KiB of fp32 K^T
// per partition) counted at run time (key p * 16 + c on partition p), after
// the rest (s0 mod 2048) as chunk-major chunks and a tail of s0 mod 128 keys.

// CHECK-LABEL: func.func @decode(
// CHECK-DAG: %[[FULL:.*]] = arith.floordivsi %arg4, %c2048 : index
// CHECK-DAG: %[[REST:.*]] = arith.remsi %arg4, %c2048 : index
// CHECK-DAG: arith.floordivsi %[[REST]], %c128 : index
// CHECK-DAG: arith.remsi %[[REST]], %c128 : index
// Q^T of both query heads of key head 0 in one transposing load.
// CHECK: nisa.dma_copy {{.*}} : memref<64x2x2xf32, strided<[1, 128, 64], offset: ?>>, memref<64x2x2xf32, strided<[4, 2, 1], offset: ?>, #nisa.mem<sbuf>>
// The rest: its keys in order (K^T), V by chunks and the tail.
// CHECK: nisa.dma_copy {{.*}} : memref<64x?xf32, strided<[1, 64], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<128x?x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<?x64xf32, strided<[64, 1], offset: ?>>
// A full block: K^T with key p * 16 + c at column c * 128 + p, V a
// contiguous run per partition.
// CHECK: memref.reinterpret_cast %arg1 to offset: [%{{.*}}], sizes: [64, 16, 128], strides: [1, 64, 1024]
// CHECK: nisa.dma_copy
// CHECK: memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [128, 16, 64], strides: [1024, 64, 1]
// CHECK: nisa.dma_copy
// S^T = K Q^T per chunk: [128 keys, 4 rows] of PSUM.
// CHECK: nisa.matmul {{.*}} : memref<64x128xf32, {{.*}}>, memref<64x4xf32, {{.*}}>, memref<128x4xf32, {{.*}}#nisa.mem<psum>>
// The max across partitions: transpose, row max, -1s^T diag(max) added to
// S^T, exp from PSUM.
// CHECK: nisa.matmul {{.*}} : memref<128x4xf32, {{.*}}>, memref<128x128xf32, {{.*}}>, memref<4x128xf32,
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<4x128xf32, {{.*}}>, memref<4x64xf32, {{.*}}>, memref<128x64xf32,
// CHECK: nisa.activation exp {{.*}} : memref<128x64xf32, {{.*}}#nisa.mem<psum>>
// P V and the row sums, P^T chunks stationary.
// CHECK: nisa.matmul {{.*}} : memref<128x4xf32, {{.*}}>, memref<128x64xf32, {{.*}}>, memref<4x64xf32,
// CHECK: nisa.matmul {{.*}} : memref<128x4xf32, {{.*}}>, memref<128x1xf32, {{.*}}>, memref<4x1xf32,

// The program: block counts and the rest's extents as size expressions.
// PROGRAM: "count":"floordiv(max((floordiv(s0,2048)-3),0),4)"
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
