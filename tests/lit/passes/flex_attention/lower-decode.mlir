// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 --canonicalize --cse --nisa-allocate --nisa-insert-sync -o /dev/null

// Decode attention with static shapes (issue #19): 8 query heads of one row
// over 2 key heads against 1100 keys take the decode kernel
// (LowerDecodeAttention.cpp), not the flash-attention one: Q^T of a key
// head's 4 query heads in one load, S^T = K Q^T [128 keys, 4 rows] per chunk,
// the max per partition by a bf16 tree whose first level reads PSUM, the max
// across partitions by a transpose, -M added to S^T in PSUM by a matmul
// (-1s^T diag(M), diag(M) repeated over the 32 column groups), exp reading
// PSUM with the scale folded in, and P^T chunks stationary for P V and the
// row sums. 1100 keys: no full block of 4096, a rest of 8 chunks and a tail
// of 76 keys. The next key head's first block is scored (S^T and its max
// tree) before this head's block is finished.

// CHECK-LABEL: func.func @decode(
// CHECK: nisa.dma_copy {{.*}} : memref<64x4x1xbf16, strided<[1, 64, 64], offset: ?>>, memref<64x4x1xbf16, strided<[4, 1, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} : memref<64x128xbf16, {{.*}}>, memref<64x4xbf16, {{.*}}>, memref<128x4xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.copy {{.*}} {engine = #nisa.engine<scalar>} : memref<128x64xf32, {{.*}}#nisa.mem<psum>>, memref<128x64xbf16,
// CHECK: nisa.tensor_tensor max {{.*}} : memref<128x64xf32, {{.*}}#nisa.mem<psum>>, memref<128x64xbf16, {{.*}}>, memref<128x64xbf16,
// CHECK: nisa.tensor_tensor max {{.*}} : memref<128x4xbf16, {{.*}}>, memref<128x4xbf16, {{.*}}>, memref<128x4xbf16,
// CHECK: nisa.dma_copy {{.*}} : memref<64x4x1xbf16, strided<[1, 64, 64], offset: ?>>
// CHECK: nisa.matmul {{.*}} : memref<64x128xbf16, {{.*}}>, memref<64x4xbf16, {{.*}}>, memref<128x4xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.matmul {{.*}} : memref<128x4xbf16, {{.*}}>, memref<128x128xbf16, {{.*}}>, memref<4x128xf32,
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.tensor_scalar multiply {{.*}} : memref<4x32x4xbf16, strided<[128, ?, 1], offset: ?>, #nisa.mem<sbuf>>, memref<4x32x4xbf16,
// CHECK: nisa.matmul %[[NEG:.*]], %{{.*}}, %[[S:.*]] {accumulate} : memref<4x128xbf16, {{.*}}>, memref<4x128xbf16, {{.*}}>, memref<128x128xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.copy {{.*}} {engine = #nisa.engine<scalar>} : memref<128x64xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.activation exp %[[S]], %{{.*}} {scale = 1.250000e-01 : f64} : memref<128x128xf32, {{.*}}#nisa.mem<psum>>, memref<128x128xbf16,
// CHECK: nisa.matmul {{.*}} : memref<128x4xbf16, {{.*}}>, memref<128x64xbf16, {{.*}}>, memref<4x64xf32,
// CHECK-NOT: memref<1x512xf32
func.func @decode(%q: tensor<1x8x1x64xbf16>, %k: tensor<1x2x1100x64xbf16>, %v: tensor<1x2x1100x64xbf16>) -> tensor<1x8x1x64xbf16> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<2> : tensor<1x1x1x9xi8>, scale = 1.250000e-01 : f64} : tensor<1x8x1x64xbf16>, tensor<1x2x1100x64xbf16>, tensor<1x2x1100x64xbf16> -> tensor<1x8x1x64xbf16>, tensor<1x8x1xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %t = neuron.constant dense<true> : tensor<i1>
      neuron.yield %t : tensor<i1>
    }
  return %o : tensor<1x8x1x64xbf16>
}
