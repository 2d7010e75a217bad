// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s

// neuron.channel_norm with the channels on the partitions: 256 channels are
// two tiles, each image's 40 positions one block (loaded as rows of 40),
// in chunks of a multiple of the PSUM sets (three here: 13, 13 and 14
// positions). Per chunk, D = (256 I - J) x on TensorE (C - 1 = 255 is exact
// in bf16: one matrix for the diagonal blocks, -J off them), the squares
// (D / 256)^2 to bf16 on ScalarE, V = ones^T squares on TensorE, R =
// rsqrt(256 V + 256^2 eps) on ScalarE, y = (D * weight) * R on VectorE and
// + bias on GpSimd into the block's tile, which is stored.

// CHECK-LABEL: func.func @channel_norm(
// CHECK: nisa.memset %[[NEGJ:.*]], -1.000000e+00 {engine = #nisa.engine<gpsimd>} : memref<128x128xbf16
// CHECK: nisa.tensor_scalar  eq %{{.*}}, %[[I:.*]] : memref<128x128xf32, {{.*}}>, memref<128x128xbf16
// CHECK: nisa.scalar_tensor_tensor  multiply,  add %[[I]], %[[NEGJ]], %[[DIAG:.*]] {imm = 2.560000e+02 : f64}
// CHECK: nisa.memset %[[ONES:.*]], 1.000000e+00 {engine = #nisa.engine<gpsimd>} : memref<128x128xbf16
// The weight and bias as fp32 columns, a channel tile each.
// CHECK-COUNT-4: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1xbf16, {{.*}}>, memref<128x1xf32
// Both images' blocks, two channel tiles of 40 positions each.
// CHECK-COUNT-4: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x40xbf16, strided<[40, 1], offset: ?>>, memref<128x40xbf16
// Chunk 0's D (two PSUM banks: tile 0 then tile 1) and squares.
// CHECK: nisa.matmul %[[DIAG_V:.*]], %[[X00:.*]], %[[D0:.*]] : memref<128x128xbf16, {{.*}}>, memref<128x13xbf16, {{.*}}>, memref<128x13xf32, {{.*}}psum>>
// CHECK: nisa.matmul %[[NEGJ_V:.*]], %[[X01:.*]], %[[D0]] {accumulate}
// CHECK: nisa.matmul %[[NEGJ_V]], %[[X00]], %[[D1:.*]] :
// CHECK: nisa.matmul %[[DIAG_V]], %[[X01]], %[[D1]] {accumulate}
// CHECK: nisa.activation  square %[[D0]], %[[SQ0:.*]] {scale = 3.906250e-03 : f64} : memref<128x13xf32, {{.*}}psum>>, memref<128x13xbf16
// CHECK: nisa.activation  square %[[D1]], %[[SQ1:.*]] {scale = 3.906250e-03 : f64}
// Chunk 1's D and squares, two sets ahead of stage two: chunk 0's V first.
// CHECK-COUNT-4: nisa.matmul %{{.*}}, %{{.*}}, %{{.*}} : memref<128x128xbf16, {{.*}}>, memref<128x13xbf16
// CHECK-COUNT-2: nisa.activation  square
// CHECK: nisa.matmul %[[ONES_V:.*]], %[[SQ0]], %[[V:.*]] : memref<128x128xbf16
// CHECK: nisa.matmul %[[ONES_V]], %[[SQ1]], %[[V]] {accumulate}
// CHECK: nisa.activation  rsqrt %[[V]], %[[R:.*]] {bias_imm = 0.065535999999999997 : f64, scale = 2.560000e+02 : f64}
// Then chunk 2's D (14 positions), and chunk 0 scaled into its block.
// CHECK-COUNT-4: nisa.matmul %{{.*}}, %{{.*}}, %{{.*}} : memref<128x128xbf16, {{.*}}>, memref<128x14xbf16
// CHECK-COUNT-2: nisa.activation  square
// CHECK: nisa.scalar_tensor_tensor  multiply,  multiply %[[D0]], %[[R]], %[[T0:.*]] scalar %{{.*}} {imm = 1.000000e+00 : f64} : memref<128x13xf32, {{.*}}psum>>
// CHECK: nisa.tensor_scalar  add %[[T0]], %[[X00]] scalar %{{.*}} {engine = #nisa.engine<gpsimd>} : memref<128x13xf32, {{.*}}>, memref<128x13xbf16
// CHECK: nisa.scalar_tensor_tensor  multiply,  multiply %[[D1]], %[[R]]
// CHECK: nisa.tensor_scalar  add
// The block's tiles stored.
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x40xbf16, {{.*}}>, memref<128x40xbf16, strided<[40, 1], offset: ?>>
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x40xbf16, {{.*}}>, memref<128x40xbf16, strided<[40, 1], offset: ?>>
func.func @channel_norm(%x: tensor<2x256x40xbf16>, %w: tensor<256xbf16>, %b: tensor<256xbf16>) -> tensor<2x256x40xbf16> {
  %0:3 = neuron.channel_norm %x weight %w bias %b eps 1.0e-6 : tensor<2x256x40xbf16>, tensor<256xbf16>, tensor<256xbf16> -> tensor<2x256x40xbf16>, tensor<2x1x40xf32>, tensor<2x1x40xf32>
  return %0#0 : tensor<2x256x40xbf16>
}

// The statistics (a training forward's): each chunk's channel sums by a
// ones column into one PSUM row, mean = sums / C on ScalarE and rstd = R C
// on GpSimd, stored as rows of [N, 1, positions]. No weight: y = D * 1 * R.
// CHECK-LABEL: func.func @channel_norm_stats(
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[SUMS:.*]] : memref<96x1xf32, {{.*}}>, memref<96x{{[0-9]+}}xf32, {{.*}}>, memref<1x{{[0-9]+}}xf32, {{.*}}psum>>
// CHECK: nisa.activation  square %{{.*}}, %{{.*}} {scale = 0.010416666666666666 : f64} : memref<96x{{[0-9]+}}xf32, {{.*}}psum>>, memref<96x{{[0-9]+}}xf32
// CHECK: nisa.scalar_tensor_tensor  multiply,  multiply %{{.*}}, %{{.*}}, %[[Y:[^ ]*]] {imm = 1.000000e+00 : f64}
// CHECK-NOT: scalar %
// CHECK: nisa.activation  identity %[[SUMS]], %[[MEAN:.*]] {scale = 0.010416666666666666 : f64}
// CHECK: nisa.tensor_scalar  multiply %{{.*}}, %[[RSTD:.*]] {engine = #nisa.engine<gpsimd>, imm = 9.600000e+01 : f64}
// CHECK: nisa.dma_copy %[[MEAN]], %{{.*}} : memref<1x{{[0-9]+}}xf32, {{.*}}>, memref<1x{{[0-9]+}}xf32, strided<[{{[0-9]+}}, 1], offset: ?>>
// CHECK: nisa.dma_copy %[[RSTD]], %{{.*}} : memref<1x{{[0-9]+}}xf32, {{.*}}>, memref<1x{{[0-9]+}}xf32, strided<[{{[0-9]+}}, 1], offset: ?>>
func.func @channel_norm_stats(%x: tensor<1x96x4x5xf32>) -> (tensor<1x96x4x5xf32>, tensor<1x1x4x5xf32>, tensor<1x1x4x5xf32>) {
  %0:3 = neuron.channel_norm %x eps 1.0e-5 : tensor<1x96x4x5xf32> -> tensor<1x96x4x5xf32>, tensor<1x1x4x5xf32>, tensor<1x1x4x5xf32>
  return %0#0, %0#1, %0#2 : tensor<1x96x4x5xf32>, tensor<1x1x4x5xf32>, tensor<1x1x4x5xf32>
}

// 771 channels (seven tiles, the last of 3): neither C - 1 nor C is exact
// in bf16, so the diagonal blocks take -J, 768 I and 3 I, accumulated: a
// channel tile's D is nine matmuls.
// CHECK-LABEL: func.func @channel_norm_parts(
// CHECK: nisa.tensor_scalar  multiply %[[I2:.*]], %[[P1:.*]] {imm = 7.680000e+02 : f64}
// CHECK: nisa.tensor_scalar  multiply %[[I2]], %[[P2:.*]] {imm = 3.000000e+00 : f64}
// CHECK-NOT: nisa.activation
// CHECK: nisa.matmul %[[J:[^ ]*]], %{{.*}}, %[[DT0:[^ ]*]] :
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[DT0]] {accumulate}
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[DT0]] {accumulate}
// CHECK-COUNT-5: nisa.matmul %[[J]], %{{.*}}, %[[DT0]] {accumulate}
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[DT0]] {accumulate} : memref<3x128xbf16
// CHECK-NOT: %[[DT0]] {accumulate}
func.func @channel_norm_parts(%x: tensor<1x771x2xbf16>) -> tensor<1x771x2xbf16> {
  %0:3 = neuron.channel_norm %x eps 1.0e-5 : tensor<1x771x2xbf16> -> tensor<1x771x2xbf16>, tensor<1x1x2xf32>, tensor<1x1x2xf32>
  return %0#0 : tensor<1x771x2xbf16>
}
