// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s

// neuron.conv2d as a direct convolution: the weights load as rows of
// [O, C * 9] and go to [C, O] per tap by TensorE transposes; the image, zero
// padded, stays in SBUF, and each tap (group) is a matmul of its weights by
// the window the tap sees, a [C, images, rows, columns] access pattern.
//
// 64 channels: two copies of the image on the partitions, copy 1 one tap
// column further back (a plane of 1 + 8 * 8 elements: one element of lead),
// so a matmul contracts taps (i, 0) and (i, 1) on 128 partitions and tap
// (i, 2) alone on 64; the packed weights of copy 1 come from copy 0's by DMA.
// Both 6 x 6 images share one PSUM tile (72 positions).

// CHECK-LABEL: func.func @conv(
// CHECK-DAG: %[[W:.*]] = memref.alloc() : memref<128x640xbf16, #nisa.mem<sbuf>>
// CHECK-DAG: %[[PACKED:.*]] = memref.alloc() : memref<128x384xbf16, #nisa.mem<sbuf>>
// CHECK-DAG: %[[IMG:.*]] = memref.alloc() : memref<128x130xbf16, #nisa.mem<sbuf>>
// CHECK-DAG: %[[LOADED:.*]] = memref.alloc() : memref<128x72xbf16, #nisa.mem<sbuf>>
// The border: before the first row, between rows, after the last.
// CHECK: %[[B0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c0], sizes: [128, 2, 10], strides: [130, 65, 1]
// CHECK: nisa.memset %[[B0]], 0.000000e+00 {engine = #nisa.engine<gpsimd>}
// CHECK: memref.reinterpret_cast %[[IMG]] to offset: [%c16], sizes: [128, 2, 5, 2], strides: [130, 65, 8, 1]
// CHECK: memref.reinterpret_cast %[[IMG]] to offset: [%c56], sizes: [128, 2, 9], strides: [130, 65, 1]
// CHECK: %[[RAW:.*]] = memref.alloc() : memref<128x576xbf16, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<64x576xbf16, strided<[576, 1], offset: ?>>, memref<64x576xbf16
// CHECK: %[[TAP0:.*]] = memref.reinterpret_cast %[[RAW]] to offset: [%c0], sizes: [64, 64], strides: [576, 9]
// CHECK: nisa.matmul %[[TAP0]], %{{.*}}, %{{.*}} {is_transpose}
// CHECK: %[[FROM1:.*]] = memref.reinterpret_cast %[[W]] to offset: [%c64], sizes: [64, 3, 2, 64], strides: [640, 192, 128, 1]
// CHECK: nisa.dma_copy %[[FROM1]], %{{.*}} : memref<64x3x2x64xbf16, strided<[640, 192, 128, 1], offset: ?>, #nisa.mem<sbuf>>, memref<64x3x2x64xbf16, strided<[384, 128, 64, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: %[[X:.*]] = memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [64, 2, 36], strides: [36, 2304, 1]
// CHECK: nisa.dma_copy %[[X]], %{{.*}} : memref<64x2x36xbf16
// CHECK: %[[INTERIOR:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c10], sizes: [64, 2, 6, 6], strides: [130, 65, 8, 1]
// CHECK: nisa.copy %{{.*}}, %[[INTERIOR]] {engine = #nisa.engine<gpsimd>}
// CHECK: %[[COPY1:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c8320], sizes: [64, 2, 64], strides: [130, 65, 1]
// CHECK: %[[COPY0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c1], sizes: [64, 2, 64], strides: [130, 65, 1]
// CHECK: nisa.dma_copy %[[COPY0]], %[[COPY1]]
// CHECK: %[[SUMS:.*]] = memref.reinterpret_cast %{{.*}} to offset: [%c0], sizes: [64, 72], strides: [2048, 1]
// CHECK: %[[WIN0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c1], sizes: [128, 2, 6, 6], strides: [130, 65, 8, 1]
// CHECK: %[[G0:.*]] = memref.reinterpret_cast %[[PACKED]] to offset: [%c0], sizes: [128, 64], strides: [384, 1]
// CHECK: nisa.matmul %[[G0]], %[[WIN0]], %[[SUMS]] :
// CHECK: %[[WIN1:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c3], sizes: [64, 2, 6, 6], strides: [130, 65, 8, 1]
// CHECK: nisa.matmul %{{.*}}, %[[WIN1]], %[[SUMS]] {accumulate}
// CHECK-COUNT-4: nisa.matmul {{.*}} {accumulate}
// CHECK: nisa.copy %[[SUMS]], %{{.*}} :
// CHECK: %[[OUT:.*]] = memref.reinterpret_cast %arg2 to offset: [%c0], sizes: [64, 2, 6, 6], strides: [36, 2304, 6, 1]
// CHECK: nisa.dma_copy %{{.*}}, %[[OUT]] {engine = #nisa.engine<scalar>}
func.func @conv(%x: tensor<2x64x6x6xbf16>, %w: tensor<64x64x3x3xbf16>) -> tensor<2x64x6x6xbf16> {
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<2x64x6x6xbf16>, tensor<64x64x3x3xbf16> -> tensor<2x64x6x6xbf16>
  return %0 : tensor<2x64x6x6xbf16>
}

// 192 channels in two tiles (128 and 64), 200 outputs in two; stride 2,
// no padding: the image loads straight into its tile, each window strides
// two rows (22 elements) and two columns.

// CHECK-LABEL: func.func @conv_strided(
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1x99xf32, strided<[99, 19008, 1], offset: ?>>, memref<128x1x99xf32, strided<[198, 198, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<64x1x99xf32, strided<[99, 19008, 1], offset: ?>>, memref<64x1x99xf32, strided<[198, 198, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[S:.*]] : memref<128x128xf32, {{.*}}>, memref<128x1x4x5xf32, strided<[198, 198, 22, 2], offset: ?>, #nisa.mem<sbuf>>, memref<128x20xf32
// CHECK-COUNT-8: nisa.matmul {{.*}}, %[[S]] {accumulate} : memref<128x128xf32
// CHECK-COUNT-9: nisa.matmul {{.*}}, %[[S]] {accumulate} : memref<64x128xf32
// CHECK: nisa.matmul {{.*}} : memref<128x72xf32, {{.*}}>, memref<128x1x4x5xf32, {{.*}}>, memref<72x20xf32
func.func @conv_strided(%x: tensor<1x192x9x11xf32>, %w: tensor<200x192x3x3xf32>) -> tensor<1x200x4x5xf32> {
  %0 = neuron.conv2d %x, %w stride [2, 2] padding [0, 0] dilation [1, 1] : tensor<1x192x9x11xf32>, tensor<200x192x3x3xf32> -> tensor<1x200x4x5xf32>
  return %0 : tensor<1x200x4x5xf32>
}
