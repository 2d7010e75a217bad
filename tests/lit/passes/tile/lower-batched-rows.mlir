// RUN: neuron-opt %s --neuron-fuse-elementwise --neuron-lower-to-nisa | FileCheck %s

// Rows of 128 bf16 (256 bytes a partition) go in batches of 8 steps: one
// load and one store a batch, each partition a run of 8 consecutive rows
// (2 KiB), step j of a batch the j-th row of every run; two batches' slots
// in turn. 4160 rows: 4 batches of 1024, then a step of the last 64 rows.
// CHECK-LABEL: func.func @rms_norm_rows_of_128
// CHECK: memref.alloc() : memref<128x2048xbf16, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1024xbf16, strided<[1024, 1], offset: ?>>, memref<128x1024xbf16, strided<[2048, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1024xbf16, strided<[1024, 1], offset: ?>>, memref<128x1024xbf16, strided<[2048, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK-COUNT-8: nisa.activation square
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1024xbf16, strided<[2048, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x1024xbf16, strided<[1024, 1], offset: ?>>
// The last 64 rows: a step of its own.
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<64x128xbf16, strided<[128, 1], offset: ?>>
// CHECK: nisa.activation square {{.*}} : memref<64x128xbf16
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : {{.*}}, memref<64x128xbf16, strided<[128, 1], offset: ?>>
func.func @rms_norm_rows_of_128(%x: tensor<4160x128xbf16>, %w: tensor<128xbf16>) -> tensor<4160x128xbf16> {
  %inv = neuron.constant dense<7.812500e-03> : tensor<4160x1xf32>
  %eps = neuron.constant dense<9.99999997E-7> : tensor<4160x1xf32>
  %h = neuron.cast %x : tensor<4160x128xbf16> -> tensor<4160x128xf32>
  %sq = neuron.binary mul %h, %h : tensor<4160x128xf32>, tensor<4160x128xf32> -> tensor<4160x128xf32>
  %s = neuron.reduce sum %sq {count = 1} : tensor<4160x128xf32> -> tensor<4160xf32>
  %s1 = neuron.reshape %s : tensor<4160xf32> -> tensor<4160x1xf32>
  %m = neuron.binary mul %s1, %inv : tensor<4160x1xf32>, tensor<4160x1xf32> -> tensor<4160x1xf32>
  %e = neuron.binary add %m, %eps : tensor<4160x1xf32>, tensor<4160x1xf32> -> tensor<4160x1xf32>
  %rs = neuron.unary rsqrt %e : tensor<4160x1xf32> -> tensor<4160x1xf32>
  %b = neuron.broadcast %rs : tensor<4160x1xf32> -> tensor<4160x128xf32>
  %n = neuron.binary mul %h, %b : tensor<4160x128xf32>, tensor<4160x128xf32> -> tensor<4160x128xf32>
  %nb = neuron.cast %n : tensor<4160x128xf32> -> tensor<4160x128xbf16>
  %gb = neuron.broadcast %w : tensor<128xbf16> -> tensor<4160x128xbf16>
  %y = neuron.binary mul %gb, %nb : tensor<4160x128xbf16>, tensor<4160x128xbf16> -> tensor<4160x128xbf16>
  return %y : tensor<4160x128xbf16>
}

// Rows of 2048 bytes already move well a step: no batches.
// CHECK-LABEL: func.func @rows_of_1024
// CHECK-NOT: memref<128x2048xbf16
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1024xbf16, strided<[1024, 1], offset: ?>>
func.func @rows_of_1024(%x: tensor<4096x1024xbf16>) -> tensor<4096x1024xbf16> {
  %m = neuron.reduce max %x {count = 1} : tensor<4096x1024xbf16> -> tensor<4096xbf16>
  %m1 = neuron.reshape %m : tensor<4096xbf16> -> tensor<4096x1xbf16>
  %b = neuron.broadcast %m1 : tensor<4096x1xbf16> -> tensor<4096x1024xbf16>
  %d = neuron.binary sub %x, %b : tensor<4096x1024xbf16>, tensor<4096x1024xbf16> -> tensor<4096x1024xbf16>
  return %d : tensor<4096x1024xbf16>
}
