// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn3 | FileCheck %s --check-prefix=TRN3
// RUN: neuron-opt %s --neuron-lower-to-nisa=free-tile-bytes=256 | FileCheck %s --check-prefix=SMALL
// RUN: not neuron-opt %s --neuron-lower-to-nisa=target=trn9 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not neuron-opt %s --neuron-lower-to-nisa=free-tile-bytes=2 2>&1 | FileCheck %s --check-prefix=TINY

// Tensors become HBM buffers; results are trailing output arguments.
// CHECK-LABEL: func.func @elementwise
// CHECK-SAME: (%[[X:.*]]: memref<256x64xf32>, %[[OUT:.*]]: memref<256x64xf32>)
// CHECK-SAME: attributes {nisa.kernel, nisa.num_inputs = 1 : i64}
// 16384 elements = 128 partitions x 128: one [128, 128] tile.
// CHECK: memref.alloc() : memref<128x128xf32, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy
// CHECK: nisa.activation exp
// The splat operand rides along as an immediate.
// CHECK: nisa.tensor_scalar multiply {{.*}} {imm = 2.000000e+00 : f64}
// CHECK: nisa.dma_copy {{.*}}, %{{.*}} : memref<128x128xf32, #nisa.mem<sbuf>>
// CHECK: memref.dealloc
// CHECK: return
// TRN3: module attributes {nisa.target = "trn3"}
// 256 bytes per partition: [128, 64] tiles in a loop of 2.
// SMALL: scf.for
// SMALL: memref.alloc() : memref<128x64xf32, #nisa.mem<sbuf>>
// BAD: error: unknown target 'trn9'
// TINY: error: free-tile-bytes must be at least 4
func.func @elementwise(%x: tensor<256x64xf32>) -> tensor<256x64xf32> {
  %e = neuron.unary exp %x : tensor<256x64xf32> -> tensor<256x64xf32>
  %c = neuron.constant dense<2.0> : tensor<256x64xf32>
  %m = neuron.binary mul %e, %c : tensor<256x64xf32>, tensor<256x64xf32> -> tensor<256x64xf32>
  return %m : tensor<256x64xf32>
}

// K = 300 accumulates in one PSUM bank over three K tiles: the first
// overwrites, the rest accumulate; M = 200 takes two stationary tiles.
// CHECK-LABEL: func.func @matmul
// CHECK: memref.alloc() : memref<128x256xf32, #nisa.mem<psum>>
// CHECK: nisa.matmul {{.*}} : memref<128x128xbf16, #nisa.mem<sbuf>>, memref<128x256xbf16, #nisa.mem<sbuf>>, memref<128x256xf32, #nisa.mem<psum>>
// CHECK-NOT: accumulate
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<128x128xbf16
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<44x128xbf16
// CHECK: nisa.copy
// CHECK: memref.alloc() : memref<72x256xf32, #nisa.mem<psum>>
func.func @matmul(%a: tensor<200x300xbf16>, %b: tensor<300x256xbf16>) -> tensor<200x256xbf16> {
  %m = neuron.matmul %a, %b : tensor<200x300xbf16>, tensor<300x256xbf16> -> tensor<200x256xbf16>
  return %m : tensor<200x256xbf16>
}

// Rows on the partitions, the reduced dim along the free axis in chunks.
// CHECK-LABEL: func.func @reduce
// CHECK: nisa.tensor_reduce max {{.*}} : memref<128x512xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>
// CHECK: scf.for
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.tensor_tensor max
func.func @reduce(%x: tensor<128x1536xf32>) -> tensor<128xf32> {
  %r = neuron.reduce max %x {count = 1} : tensor<128x1536xf32> -> tensor<128xf32>
  return %r : tensor<128xf32>
}

// Layout ops are one strided DMA; reshape is free (the result aliases).
// CHECK-LABEL: func.func @layout
// CHECK: memref.reinterpret_cast %{{.*}} to offset: [%{{.*}}], sizes: [8, 4], strides: [1, 8]
// CHECK: nisa.dma_copy
// CHECK: sizes: [3, 8], strides: [0, 1]
// CHECK: sizes: [4, 2], strides: [8, 3]
func.func @layout(%x: tensor<4x8xf32>, %v: tensor<8xf32>) -> (tensor<8x4xf32>, tensor<3x8xf32>, tensor<4x2xf32>, tensor<32xf32>) {
  %t = neuron.transpose %x, [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  %b = neuron.broadcast %v : tensor<8xf32> -> tensor<3x8xf32>
  %s = neuron.slice %x {offsets = array<i64: 0, 1>, strides = array<i64: 1, 3>} : tensor<4x8xf32> -> tensor<4x2xf32>
  %r = neuron.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  return %t, %b, %s, %r : tensor<8x4xf32>, tensor<3x8xf32>, tensor<4x2xf32>, tensor<32xf32>
}

// CHECK-LABEL: func.func @gather
// CHECK: nisa.dma_copy {{.*}} memref<3x1xi64, #nisa.mem<sbuf>>
// CHECK: nisa.dma_gather
func.func @gather(%t: tensor<10x16xf32>, %i: tensor<3xi64>) -> tensor<3x16xf32> {
  %g = neuron.gather %t[%i] : tensor<10x16xf32>, tensor<3xi64> -> tensor<3x16xf32>
  return %g : tensor<3x16xf32>
}

// CHECK-LABEL: func.func @concat
// CHECK: sizes: [2, 3], strides: [7, 1]
// CHECK: sizes: [2, 4], strides: [7, 1]
func.func @concat(%a: tensor<2x3xf32>, %b: tensor<2x4xf32>) -> tensor<2x7xf32> {
  %c = neuron.concat %a, %b {dim = 1} : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<2x7xf32>
  return %c : tensor<2x7xf32>
}

// An empty result has a buffer but no instructions.
// CHECK-LABEL: func.func @empty
// CHECK-SAME: nisa.kernel
// CHECK-NEXT: return
func.func @empty(%x: tensor<4x0xf32>) -> tensor<4x0xf32> {
  %e = neuron.unary exp %x : tensor<4x0xf32> -> tensor<4x0xf32>
  return %e : tensor<4x0xf32>
}
