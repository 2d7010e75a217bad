// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse --nisa-allocate --nisa-insert-sync > /dev/null

// neuron.rotary over q [1, 4, 300, 64] with cos and sin broadcast over the
// heads: positions on the partitions, two a partition (runs of 128
// elements per head) in a block of 256 positions, then the 44 left one a
// partition; the four heads in one tile. Each block's cos and sin load with
// its first tile ([parts, 1, r, 64]: the broadcast's zero stride stays in
// HBM's view), two tiles ahead, and the products read them through a zero
// head stride. x * cos on VectorE, the rotated halves' products on GpSimd;
// a tile's difference and sum (VectorE) come after the next tile's
// products, its store from ScalarE's queue.

// CHECK-LABEL: func.func @rope(
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c0], sizes: [128, 1, 2, 64], strides: [128, %c0, 64, 1]
// CHECK: %[[X:.*]] = memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [128, 4, 2, 64], strides: [128, 19200, 64, 1]
// CHECK: nisa.dma_copy %[[X]], %[[XT:[a-z_0-9]+]]
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c16384], sizes: [44, 1, 1, 64]
// CHECK: memref.reinterpret_cast %arg0 to offset: [%c16384], sizes: [44, 4, 1, 64], strides: [64, 19200, 64, 1]
// CHECK: %[[COST:.*]] = memref.reinterpret_cast %{{.*}} to offset: [%c0], sizes: [128, 4, 2, 64], strides: [384, %c0, 64, 1]
// CHECK: nisa.tensor_tensor multiply %[[XT]], %[[COST]], %[[T1:[a-z_0-9]+]] :
// CHECK: nisa.tensor_tensor multiply %{{.*}}, %{{.*}}, %[[T2LO:[a-z_0-9]+]] {engine = #nisa.engine<gpsimd>}
// CHECK: nisa.tensor_tensor multiply %{{.*}}, %{{.*}}, %[[T2HI:[a-z_0-9]+]] {engine = #nisa.engine<gpsimd>}
// CHECK: nisa.tensor_tensor multiply
// CHECK: nisa.tensor_tensor subtract %{{.*}}, %[[T2LO]], %{{.*}} :
// CHECK: nisa.tensor_tensor add %{{.*}}, %[[T2HI]], %{{.*}} :
// CHECK: %[[OUT:.*]] = memref.reinterpret_cast %arg3 to offset: [%c0], sizes: [128, 4, 2, 64], strides: [128, 19200, 64, 1]
// CHECK: nisa.dma_copy %{{.*}}, %[[OUT]] {engine = #nisa.engine<scalar>}
// CHECK: %[[OUT2:.*]] = memref.reinterpret_cast %arg3 to offset: [%c16384], sizes: [44, 4, 1, 64]
// CHECK: nisa.dma_copy %{{.*}}, %[[OUT2]]
// CHECK-NOT: nisa.dma_copy

func.func @rope(%q: tensor<1x4x300x64xbf16>, %c: tensor<1x1x300x64xbf16>, %s: tensor<1x1x300x64xbf16>) -> tensor<1x4x300x64xbf16> {
  %cos = neuron.broadcast %c : tensor<1x1x300x64xbf16> -> tensor<1x4x300x64xbf16>
  %sin = neuron.broadcast %s : tensor<1x1x300x64xbf16> -> tensor<1x4x300x64xbf16>
  %y = neuron.rotary %q, %cos, %sin : tensor<1x4x300x64xbf16>, tensor<1x4x300x64xbf16>, tensor<1x4x300x64xbf16> -> tensor<1x4x300x64xbf16>
  return %y : tensor<1x4x300x64xbf16>
}

// q as Llama's projection splits it ([1, L, 4, 64] in memory, heads
// transposed out): the output, which the kernel allocates (not returned),
// takes x's memory order, and a tile holds r positions of every head in
// that order, so loads and stores move 512 contiguous elements a partition.
// CHECK-LABEL: func.func @heads_inner(
// CHECK: %[[BUF:.*]] = memref.alloc() : memref<1x300x4x64xbf16>
// CHECK: memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [128, 2, 4, 64], strides: [512, 256, 64, 1]
// CHECK: memref.reinterpret_cast %[[BUF]] to offset: [%c0], sizes: [128, 2, 4, 64], strides: [512, 256, 64, 1]
func.func @heads_inner(%p: tensor<1x300x4x64xbf16>, %c: tensor<1x1x300x64xbf16>, %s: tensor<1x1x300x64xbf16>) -> tensor<1x4x300x64xbf16> {
  %q = neuron.transpose %p, [0, 2, 1, 3] : tensor<1x300x4x64xbf16> -> tensor<1x4x300x64xbf16>
  %cos = neuron.broadcast %c : tensor<1x1x300x64xbf16> -> tensor<1x4x300x64xbf16>
  %sin = neuron.broadcast %s : tensor<1x1x300x64xbf16> -> tensor<1x4x300x64xbf16>
  %y = neuron.rotary %q, %cos, %sin : tensor<1x4x300x64xbf16>, tensor<1x4x300x64xbf16>, tensor<1x4x300x64xbf16> -> tensor<1x4x300x64xbf16>
  %z = neuron.unary exp %y : tensor<1x4x300x64xbf16> -> tensor<1x4x300x64xbf16>
  return %z : tensor<1x4x300x64xbf16>
}
