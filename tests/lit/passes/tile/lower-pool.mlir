// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s

// neuron.pool2d with the planes on the partitions: 128 of them a step, the
// padded plane in SBUF (its border -inf for max), each window offset one
// instruction over an access pattern of them, the even ones on VectorE and
// the odd ones on GpSimd into two fp32 partial results, combined and
// stored (the DMA rounds to bf16). 130 planes: a step of 128, then one of 2.

// CHECK-LABEL: func.func @max_pool(
// CHECK: %[[IMG:.*]] = memref.alloc() : memref<128x100xbf16, #nisa.mem<sbuf>>
// CHECK: %[[LOADED:.*]] = memref.alloc() : memref<128x64xbf16, #nisa.mem<sbuf>>
// CHECK: nisa.memset %{{.*}}, 0xFFF0000000000000 {engine = #nisa.engine<gpsimd>} : memref<128x1x11xbf16
// CHECK: nisa.memset %{{.*}}, 0xFFF0000000000000 {engine = #nisa.engine<gpsimd>} : memref<128x1x7x2xbf16
// CHECK: nisa.memset %{{.*}}, 0xFFF0000000000000 {engine = #nisa.engine<gpsimd>} : memref<128x1x11xbf16
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x64xbf16, strided<[64, 1], offset: ?>>, memref<128x64xbf16
// CHECK: %[[INTERIOR:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c11], sizes: [128, 8, 8], strides: [100, 10, 1]
// CHECK: nisa.copy %{{.*}}, %[[INTERIOR]] {engine = #nisa.engine<gpsimd>}
// CHECK: %[[W0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c0], sizes: [128, 4, 4], strides: [100, 20, 2]
// CHECK: nisa.copy %[[W0]], %[[A:.*]] : {{.*}}, memref<128x4x4xf32
// CHECK: %[[W1:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c1], sizes: [128, 4, 4], strides: [100, 20, 2]
// CHECK: nisa.copy %[[W1]], %[[B:.*]] {engine = #nisa.engine<gpsimd>}
// CHECK: nisa.tensor_tensor max %[[A]], %{{.*}}, %[[A]] :
// CHECK: nisa.tensor_tensor max %[[B]], %{{.*}}, %[[B]] {engine = #nisa.engine<gpsimd>}
// CHECK: nisa.tensor_tensor max %[[A]], %[[B]], %[[A]] :
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} {engine = #nisa.engine<scalar>} : memref<128x16xf32, strided<[16, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x16xbf16
// CHECK: nisa.dma_copy {{.*}} : memref<2x64xbf16
func.func @max_pool(%x: tensor<2x65x8x8xbf16>) -> tensor<2x65x4x4xbf16> {
  %0 = neuron.pool2d max %x kernel [3, 3] stride [2, 2] padding [1, 1] dilation [1, 1] : tensor<2x65x8x8xbf16> -> tensor<2x65x4x4xbf16>
  return %0 : tensor<2x65x4x4xbf16>
}

// Average pooling: a sum of the windows, times 1 / 4 before the store.

// CHECK-LABEL: func.func @avg_pool(
// CHECK: nisa.tensor_tensor add
// CHECK: nisa.tensor_scalar  multiply %{{.*}}, %{{.*}} {imm = 2.500000e-01 : f64}
func.func @avg_pool(%x: tensor<1x4x8x8xf32>) -> tensor<1x4x4x4xf32> {
  %0 = neuron.pool2d sum %x kernel [2, 2] stride [2, 2] padding [0, 0] dilation [1, 1] {scale = 2.500000e-01 : f64} : tensor<1x4x8x8xf32> -> tensor<1x4x4x4xf32>
  return %0 : tensor<1x4x4x4xf32>
}
