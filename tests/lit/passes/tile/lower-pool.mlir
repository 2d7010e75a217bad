// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa | sed -n '/@max_pool/,/@avg_pool/p' | grep -c "nisa.tensor_tensor  max" | FileCheck %s --check-prefix=MAXES

// neuron.pool2d with the planes on the partitions: 128 of them a step, each
// window offset (tap) one instruction over an access pattern of them, on
// VectorE or GpSimd by their costs, each engine into a partial result of its
// own, combined and stored. A tap reads only the outputs whose window
// position is inside the plane (a sub-rectangle): no padded copy. Max keeps
// bf16 partials (exact). 130 planes: a step of 128, then one of 2.
// MAXES: 16

// CHECK-LABEL: func.func @max_pool(
// CHECK: %[[IMG:.*]] = memref.alloc() : memref<128x64xbf16, #nisa.mem<sbuf>>
// CHECK: %[[A:.*]] = memref.alloc() : memref<128x16xbf16, #nisa.mem<sbuf>>
// CHECK: %[[B:.*]] = memref.alloc() : memref<128x16xbf16, #nisa.mem<sbuf>>
// CHECK-NOT: nisa.memset
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x64xbf16, strided<[64, 1], offset: ?>>, memref<128x64xbf16
// Tap (2, 1) covers every output: VectorE's partial starts as its copy.
// CHECK: %[[W21:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c8], sizes: [128, 4, 4], strides: [64, 16, 2]
// CHECK: nisa.copy %[[W21]], %{{.*}} : memref<128x4x4xbf16
// Tap (0, 1): output rows 1 to 3 read input rows 1, 3, 5 (row 0's is padding).
// CHECK: %[[W01:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c8], sizes: [128, 3, 4], strides: [64, 16, 2]
// CHECK: %[[O01:.*]] = memref.reinterpret_cast %[[A]] to offset: [%c4], sizes: [128, 3, 4], strides: [16, 4, 1]
// CHECK: nisa.tensor_tensor max %[[O01]], %[[W01]], %[[O01]] :
// CHECK: nisa.copy %{{.*}}, %{{.*}} {engine = #nisa.engine<gpsimd>} : memref<128x4x4xbf16
// CHECK: nisa.tensor_tensor max {{.*}} {engine = #nisa.engine<gpsimd>}
// CHECK: nisa.tensor_tensor max %{{.*}}, %{{.*}}, %{{.*}} : memref<128x16xbf16
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} {engine = #nisa.engine<scalar>} : memref<128x16xbf16, strided<[16, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x16xbf16
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

// A padded average: fp32 partials; only the centre tap covers every output:
// GpSimd's partial starts as its copy, VectorE's as zeros (the padding's
// value), and every other tap adds its sub-rectangle.

// CHECK-LABEL: func.func @avg_pool_padded(
// CHECK: memref.alloc() : memref<128x64xf32, #nisa.mem<sbuf>>
// CHECK: nisa.memset %{{.*}}, 0.000000e+00 : memref<4x64xf32
// CHECK: nisa.tensor_tensor add {{.*}} : memref<4x8x7xf32
// CHECK: nisa.tensor_tensor add {{.*}} : memref<4x7x7xf32
// CHECK: nisa.copy %{{.*}}, %{{.*}} {engine = #nisa.engine<gpsimd>} : memref<4x8x8xf32
// CHECK: nisa.tensor_tensor add %{{.*}}, %{{.*}}, %{{.*}} : memref<4x64xf32
// CHECK: nisa.tensor_scalar  multiply %{{.*}}, %{{.*}} {imm = 0.1111
func.func @avg_pool_padded(%x: tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32> {
  %0 = neuron.pool2d sum %x kernel [3, 3] stride [1, 1] padding [1, 1] dilation [1, 1] {scale = 0.1111111111111111 : f64} : tensor<1x4x8x8xf32> -> tensor<1x4x8x8xf32>
  return %0 : tensor<1x4x8x8xf32>
}
