// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s

// neuron.group_norm with an image's channels on the partitions, whole groups
// a step: here 12 channels of 32 x 32 in 4 groups of 3, one step of 12 rows
// an image. Each row's mean and variance by bn_stats (512 columns each) and
// bn_aggr; the group's on TensorE, by a membership matrix (iota's p - 3g,
// from 0 to 2: 1/3, so the matmul averages a group's rows) and its
// transpose (1s: each row gets its group's value back); the variance the
// rows' plus their means' squared deviations; rstd by ScalarE's rsqrt with
// eps; mean and rstd stored from ScalarE's queue; scale = weight * rstd,
// -scale and shift = bias - mean * scale on ScalarE, which then normalizes
// the rows in place.

// CHECK-LABEL: func.func @group_norm(
// CHECK: nisa.iota %[[V:.*]] {base = 0.000000e+00 : f64, channel_multiplier = 1.000000e+00 : f64, multipliers = array<f64: -3.000000e+00>} : memref<12x4xf32
// CHECK: nisa.scalar_tensor_tensor multiply, multiply %{{.*}}, %[[M:.*]], %[[M]] {imm = 0.33333333333333331 : f64} : memref<12x4xf32
// CHECK: nisa.iota %{{.*}} {base = 0.000000e+00 : f64, channel_multiplier = -3.000000e+00 : f64, multipliers = array<f64: 1.000000e+00>} : memref<4x12xf32
// CHECK: nisa.scalar_tensor_tensor multiply, multiply %{{.*}}, %[[MT:.*]], %[[MT]] {imm = 1.000000e+00 : f64} : memref<4x12xf32
// The weight and bias as fp32 columns, the two images' rows loaded ahead.
// CHECK: nisa.dma_copy %{{.*}}, %[[W:.*]] : memref<12x1xf32, strided<[1, 1], offset: ?>>, memref<12x1xf32
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<12x1xf32, strided<[1, 1], offset: ?>>, memref<12x1xf32
// CHECK: nisa.dma_copy %{{.*}}, %[[ROWS:.*]] : memref<12x1024xf32, strided<[1024, 1], offset: ?>>, memref<12x1024xf32
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<12x1024xf32, strided<[1024, 1], offset: ?>>, memref<12x1024xf32
// CHECK-COUNT-2: nisa.bn_stats %{{.*}}, %{{.*}} : memref<12x512xf32
// CHECK: nisa.bn_aggr %{{.*}}, %{{.*}} : memref<12x12xf32, {{.*}}>, memref<12x2xf32
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[MEANS:.*]] : memref<12x4xf32, {{.*}}>, memref<12x1xf32, {{.*}}>, memref<4x1xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.copy %[[MEANS]], %[[GMEAN:.*]] : memref<4x1xf32
// CHECK: nisa.matmul %{{.*}}, %[[GMEAN]], %[[ROWGMEAN:.*]] : memref<4x12xf32, {{.*}}>, memref<4x1xf32, {{.*}}>, memref<12x1xf32
// CHECK: nisa.tensor_tensor subtract %{{.*}}, %[[ROWGMEAN]], %[[DEV:.*]] :
// CHECK: nisa.scalar_tensor_tensor multiply, add %[[DEV]], %{{.*}}, %[[DEV]] scalar %[[DEV]]
// CHECK: nisa.matmul %{{.*}}, %[[DEV]], %[[VAR:.*]] : memref<12x4xf32
// CHECK: nisa.activation rsqrt %[[VAR]], %[[RSTD:.*]] {bias_imm = 1.000000e-05 : f64}
// CHECK: nisa.dma_copy %[[GMEAN]], %{{.*}} {engine = #nisa.engine<scalar>} : memref<4x1xf32, {{.*}}>, memref<4x1xf32, strided<[1, 1], offset: ?>>
// CHECK: nisa.dma_copy %[[RSTD]], %{{.*}} {engine = #nisa.engine<scalar>}
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %{{.*}} : memref<4x12xf32, {{.*}}>, memref<4x2xf32, {{.*}}>, memref<12x2xf32
// CHECK: nisa.activation identity %[[W]], %[[SCALE:.*]] scale_col %[[ROWRSTD:[^ ]*]] :
// CHECK: nisa.activation identity %[[W]], %[[NEG:.*]] scale_col %[[ROWRSTD]] {scale = -1.000000e+00 : f64}
// CHECK: nisa.activation identity %{{.*}}, %[[SHIFT:.*]] bias %{{.*}} scale_col %[[NEG]] :
// The next image's statistics, then this one's rows normalized and stored.
// CHECK-COUNT-2: nisa.bn_stats
// CHECK: nisa.bn_aggr
// CHECK: nisa.activation identity %[[ROWS]], %[[ROWS]] bias %[[SHIFT]] scale_col %[[SCALE]]
// CHECK: nisa.dma_copy %[[ROWS]], %{{.*}} {engine = #nisa.engine<scalar>} : memref<12x1024xf32
func.func @group_norm(%x: tensor<2x12x32x32xf32>, %w: tensor<12xf32>, %b: tensor<12xf32>) -> (tensor<2x12x32x32xf32>, tensor<2x4xf32>, tensor<2x4xf32>) {
  %0:3 = neuron.group_norm %x weight %w bias %b groups 4 eps 1.0e-5 : tensor<2x12x32x32xf32>, tensor<12xf32>, tensor<12xf32> -> tensor<2x12x32x32xf32>, tensor<2x4xf32>, tensor<2x4xf32>
  return %0#0, %0#1, %0#2 : tensor<2x12x32x32xf32>, tensor<2x4xf32>, tensor<2x4xf32>
}

// Channels of few positions (4 x 4) share a partition row: a group's 3
// channels one row of 48 (the membership's rows one a group), scale and
// shift one column a channel (no weight: ones times rstd), and a channel's
// 16 columns normalized at a time.

// CHECK-LABEL: func.func @group_norm_channels(
// CHECK: nisa.iota %{{.*}} multipliers = array<f64: -1.000000e+00>} : memref<4x4xf32
// CHECK: nisa.memset %[[ONES:.*]], 1.000000e+00 {{.*}} : memref<4x3xf32
// CHECK: nisa.dma_copy %{{.*}}, %[[ROWS:.*]] : memref<4x48xf32, strided<[48, 1], offset: ?>>, memref<4x48xf32
// CHECK: nisa.bn_stats %[[ROWS]], %{{.*}} : memref<4x48xf32
// CHECK: nisa.activation identity %{{.*}}, %{{.*}} scale_col %{{.*}} : memref<4x3xf32
// CHECK-COUNT-3: nisa.activation identity %{{.*}}, %{{.*}} scale_col %{{.*}} : memref<4x1xf32
// CHECK-COUNT-3: nisa.activation identity %{{.*}}, %{{.*}} bias %{{.*}} scale_col %{{.*}} : memref<4x16xf32, strided<[48, 1]
func.func @group_norm_channels(%x: tensor<1x12x4x4xf32>) -> tensor<1x12x4x4xf32> {
  %0:3 = neuron.group_norm %x groups 4 eps 1.0e-5 : tensor<1x12x4x4xf32> -> tensor<1x12x4x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>
  return %0#0 : tensor<1x12x4x4xf32>
}

// Rows of 40000 fp32 longer than the row tiles take: chunks of 8192
// columns, each chunk's mean and variance kept as a (count, mean, count *
// variance) triple (the last chunk's count 7232) that one bn_aggr combines
// into the row's; then the chunks loaded again and normalized.

// CHECK-LABEL: func.func @group_norm_chunks(
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<6x8192xf32, strided<[40000, 1], offset: ?>>, memref<6x8192xf32
// CHECK-COUNT-16: nisa.bn_stats %{{.*}}, %{{.*}} : memref<6x512xf32
// CHECK: nisa.bn_aggr %{{.*}}, %{{.*}} : memref<6x96xf32
// CHECK: nisa.memset %{{.*}}, 8.192000e+03 {engine = #nisa.engine<gpsimd>} : memref<6x1xf32, strided<[15, 1], offset: ?>
// CHECK: nisa.memset %{{.*}}, 7.232000e+03
// CHECK: nisa.bn_aggr %{{.*}}, %{{.*}} : memref<6x15xf32
// CHECK: nisa.activation rsqrt
// CHECK-COUNT-5: nisa.activation identity %{{.*}}, %{{.*}} bias %{{.*}} scale_col %{{.*}} : memref<6x{{8192|7232}}xf32
func.func @group_norm_chunks(%x: tensor<1x6x200x200xf32>) -> tensor<1x6x200x200xf32> {
  %0:3 = neuron.group_norm %x groups 2 eps 1.0e-5 : tensor<1x6x200x200xf32> -> tensor<1x6x200x200xf32>, tensor<1x2xf32>, tensor<1x2xf32>
  return %0#0 : tensor<1x6x200x200xf32>
}

// With SiLU folded in, the rows' pass is ScalarE's silu(x * scale + shift);
// rstd is then (variance + eps) ^ -0.5 on VectorE, so that ScalarE keeps the
// one activation table.

// CHECK-LABEL: func.func @group_norm_silu(
// CHECK-NOT: nisa.activation rsqrt
// CHECK: nisa.tensor_scalar add %{{.*}}, %[[RSTD:.*]] {imm = 1.000000e-05 : f64}
// CHECK: nisa.tensor_scalar pow %[[RSTD]], %[[RSTD]] {imm = -5.000000e-01 : f64}
// CHECK-COUNT-3: nisa.activation silu %{{.*}}, %{{.*}} bias %{{.*}} scale_col %{{.*}} : memref<4x16xbf16
func.func @group_norm_silu(%x: tensor<1x12x4x4xbf16>) -> tensor<1x12x4x4xbf16> {
  %0:3 = neuron.group_norm %x groups 4 eps 1.0e-5 {silu} : tensor<1x12x4x4xbf16> -> tensor<1x12x4x4xbf16>, tensor<1x4xbf16>, tensor<1x4xbf16>
  return %0#0 : tensor<1x12x4x4xbf16>
}
