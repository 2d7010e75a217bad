// RUN: env TORCHNEURON_TARGET_DIR=%S/Inputs neuron-opt %s --neuron-lower-to-nisa=target=smallsbuf | FileCheck %s
// RUN: env TORCHNEURON_TARGET_DIR=%S/Inputs neuron-opt %s --neuron-lower-to-nisa=target=smallsbuf | grep -c "nisa.matmul" | FileCheck %s --check-prefix=MATMULS

// Inputs/smallsbuf.json leaves the backward 8 KiB per partition for its
// data: 384 causal tokens at head dim 64 (fp32, 30 bytes per token) go
// through SBUF in key chunks of 256 + 128 keys and query chunks of 256 +
// 128 queries. The pair (query chunk 0, key chunk 1) is fully masked and
// skipped; dQ sums over the key chunks in an fp32 buffer in HBM. The six
// kept steps of the causal 3 x 3 units run six matmuls each.
// MATMULS: 36

// CHECK-LABEL: func.func @chunked_backward
// CHECK: memref.alloc() : memref<1x1x384x64xf32>
// Key chunk 0: K rows, K^T and V^T of keys 0-255; dK and dV start at zero.
// CHECK: nisa.dma_copy {{.*}} : memref<128x2x64xf32, strided<[64, 8192, 1], offset: ?>>, memref<128x2x64xf32
// CHECK: nisa.dma_copy {{.*}} : memref<64x256xf32, strided<[1, 64], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<64x256xf32, strided<[1, 64], offset: ?>>
// CHECK: nisa.memset
// CHECK: nisa.memset
// Query chunk 0 (queries 0-255): Q, Q^T, dO, dO^T, O; key chunk 0 is the
// first to reach it: dQ starts at zero, and is stored to the HBM sum.
// CHECK-COUNT-5: nisa.dma_copy {{.*}} : memref<{{128x2x64|64x256}}xf32
// CHECK: nisa.memset {{.*}} 0.0
// CHECK: nisa.dma_copy {{.*}} : memref<128x2x64xf32, strided<[128, 64, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x2x64xf32, strided<[64, 8192, 1], offset: ?>>
// Query chunk 1 (queries 256-383): the same with one tile.
// CHECK-COUNT-5: nisa.dma_copy {{.*}} : memref<{{128x1x64|64x128}}xf32
// CHECK: nisa.memset {{.*}} 0.0
// CHECK: nisa.dma_copy {{.*}} : memref<128x1x64xf32, strided<[128, 64, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x1x64xf32, strided<[64, 8192, 1], offset: ?>>
// dK and dV of keys 0-255.
// CHECK: nisa.dma_copy {{.*}} memref<128x2x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} memref<128x2x64xf32, strided<[64, 8192, 1], offset: ?>>
// Key chunk 1 (keys 256-383), then only query chunk 1: its inputs, and dQ
// from the HBM sum instead of zeros; its last key chunk stores dQ.
// CHECK: nisa.dma_copy {{.*}} : memref<128x1x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<64x128xf32, strided<[1, 64], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<64x128xf32, strided<[1, 64], offset: ?>>
// CHECK: nisa.memset
// CHECK: nisa.memset
// CHECK-COUNT-5: nisa.dma_copy {{.*}} : memref<{{128x1x64|64x128}}xf32
// CHECK-NOT: nisa.memset
// CHECK: nisa.dma_copy {{.*}} : memref<128x1x64xf32, strided<[64, 8192, 1], offset: ?>>, memref<128x1x64xf32, strided<[128, 64, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK-NOT: nisa.memset
// CHECK: nisa.dma_copy {{.*}} : memref<128x1x64xf32, strided<[64, 64, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x1x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} memref<128x1x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} memref<128x1x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK-NOT: nisa.dma_copy
// CHECK: return

func.func @chunked_backward(%q: tensor<1x1x384x64xf32>, %k: tensor<1x1x384x64xf32>, %v: tensor<1x1x384x64xf32>, %o: tensor<1x1x384x64xf32>, %l: tensor<1x1x384xf32>, %go: tensor<1x1x384x64xf32>) -> (tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>) {
  %dq, %dk, %dv = neuron.flex_attention_backward %q, %k, %v, %o, %l, %go {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0, 0], [2, 1, 0], [2, 2, 1]]]]> : tensor<1x1x3x3xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>, tensor<1x1x384xf32>, tensor<1x1x384x64xf32> -> tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } score_grad {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %g: tensor<f32>):
      neuron.yield %g : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %dq, %dk, %dv : tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>, tensor<1x1x384x64xf32>
}
