// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s

// A matmul's bias and activation applied as each PSUM bank is evicted. The
// bias is broadcast over the partitions (and widened to fp32) by one DMA for
// the whole GEMM (loaded for each N group of each block, its 128 copies came
// to the bytes of a block's output). Each bank: the bias added to the fp32
// sums by VectorE into an fp32 tile, then the activation by ScalarE into the
// output dtype; no pass over the result after.
// CHECK-LABEL: func.func @linear_gelu
// CHECK: nisa.dma_copy %{{.*}}, %[[BIAS:.*]] : memref<128x384xbf16, strided<[?, 1], offset: ?>>, memref<128x384xf32, #nisa.mem<sbuf>>
// CHECK-NOT: strided<[?, 1]
// CHECK: nisa.matmul
// CHECK: nisa.tensor_tensor add %[[ACC:.*]], %{{.*}}, %[[PRE:.*]] : memref<128x384xf32, {{.*}}#nisa.mem<psum>>, memref<128x384xf32, {{.*}}>, memref<128x384xf32
// CHECK: nisa.activation gelu %[[PRE]], %{{.*}} : memref<128x384xf32, {{.*}}>, memref<128x384xbf16
// CHECK-NOT: nisa.copy
func.func @linear_gelu(%x: tensor<256x64xbf16>, %w: tensor<64x384xbf16>, %b: tensor<384xbf16>) -> tensor<256x384xbf16> {
  %m = neuron.matmul %x, %w bias(%b : tensor<384xbf16>) {epilogue = #neuron<unary_fn gelu>} : tensor<256x64xbf16>, tensor<64x384xbf16> -> tensor<256x384xbf16>
  return %m : tensor<256x384xbf16>
}

// Bias alone: VectorE adds it straight into the output dtype; an activation
// alone: ScalarE reads the sums in PSUM.
// CHECK-LABEL: func.func @bias_only
// CHECK: nisa.tensor_tensor add %{{.*}}, %{{.*}}, %{{.*}} : memref<128x384xf32, {{.*}}#nisa.mem<psum>>, memref<128x384xf32, {{.*}}>, memref<128x384xf32
// CHECK-NOT: nisa.activation
// CHECK-LABEL: func.func @relu_only
// CHECK: nisa.activation relu %{{.*}}, %{{.*}} : memref<128x384xf32, {{.*}}#nisa.mem<psum>>, memref<128x384xbf16
// CHECK-NOT: nisa.tensor_tensor
func.func @bias_only(%x: tensor<128x64xf32>, %w: tensor<64x384xf32>, %b: tensor<384xf32>) -> tensor<128x384xf32> {
  %m = neuron.matmul %x, %w bias(%b : tensor<384xf32>) : tensor<128x64xf32>, tensor<64x384xf32> -> tensor<128x384xf32>
  return %m : tensor<128x384xf32>
}
func.func @relu_only(%x: tensor<128x64xbf16>, %w: tensor<64x384xbf16>) -> tensor<128x384xbf16> {
  %m = neuron.matmul %x, %w {epilogue = #neuron<unary_fn relu>} : tensor<128x64xbf16>, tensor<64x384xbf16> -> tensor<128x384xbf16>
  return %m : tensor<128x384xbf16>
}

// A row affine (a pointwise convolution's BatchNorm: the channels are the
// rows) is ScalarE's scale and bias columns, loaded a column per row tile,
// with the relu in the same pass from PSUM; clamp_max a min on GpSimd.
// CHECK-LABEL: func.func @row_affine_relu6
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1xf32, strided<[1, 1], offset: ?>>, memref<128x1xf32
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1xf32, strided<[1, 1], offset: ?>>, memref<128x1xf32
// CHECK: nisa.activation relu %{{.*}}, %[[OUT:[^ ]*]] bias %{{.*}} scale_col %{{.*}} : memref<128x384xf32, {{.*}}#nisa.mem<psum>>, memref<128x384xbf16
// CHECK: nisa.tensor_scalar min %[[OUT]], %[[OUT]] {engine = #nisa.engine<gpsimd>, imm = 6.000000e+00 : f64}
func.func @row_affine_relu6(%w: tensor<2x128x64xbf16>, %x: tensor<2x64x384xbf16>, %s: tensor<128xf32>, %t: tensor<128xf32>) -> tensor<2x128x384xbf16> {
  %m = neuron.matmul %w, %x row_scale(%s : tensor<128xf32>) row_shift(%t : tensor<128xf32>) {clamp_max = 6.0 : f64, epilogue = #neuron<unary_fn relu>} : tensor<2x128x64xbf16>, tensor<2x64x384xbf16> -> tensor<2x128x384xbf16>
  return %m : tensor<2x128x384xbf16>
}
