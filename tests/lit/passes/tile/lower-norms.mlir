// RUN: neuron-opt %s --neuron-fuse-elementwise --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-fuse-elementwise --neuron-lower-to-nisa | FileCheck %s --check-prefix=ALT

// LayerNorm as the backend decomposes it, on a square input (rows as long
// as the weight): the weight and bias casts join the group as column
// vectors (they are not row vectors, though they have as many elements),
// each (a long row) loaded from HBM once into one partition and copied on
// chip to the others; the square of x - mean takes the negated mean as its bias and
// only its row sums are kept (its elements in bf16); (x - mean) * w and
// t * rstd + b are one scalar_tensor_tensor each.
// CHECK-LABEL: func.func @layer_norm
// CHECK-NOT: neuron.
// CHECK: nisa.dma_copy {{.*}} : memref<1x4096xbf16, strided<[?, 1]{{.*}}>>, memref<1x4096xbf16, #nisa.mem<sbuf>>
// CHECK: memref.reinterpret_cast {{.*}} : memref<1x4096xbf16, #nisa.mem<sbuf>> to memref<128x4096xbf16, strided<[?, 1]{{.*}}#nisa.mem<sbuf>>
// CHECK-NEXT: nisa.dma_copy {{.*}} : memref<128x4096xbf16, strided<[?, 1]{{.*}}#nisa.mem<sbuf>>, memref<128x4096xbf16, #nisa.mem<sbuf>>
// CHECK: nisa.activation square %{{.*}}, %{{.*}} bias %{{.*}} accumulate %{{.*}} : memref<128x4096xbf16, {{.*}}>, memref<128x4096xbf16
// CHECK-NOT: nisa.tensor_scalar subtract
// CHECK: nisa.scalar_tensor_tensor subtract, multiply
// CHECK: nisa.scalar_tensor_tensor multiply, add
// Its engines alternate over a period of three steps (issue #19): no one
// split of the statistics (two ScalarE passes) and the two affine passes
// keeps every engine within a step's DMA time. w and b are also copied into
// PSUM, where VectorE reads them beside the float32 operand in one pass
// (GpSimd, which cannot reach PSUM, reads them in SBUF). One step of the
// period sums its rows on GpSimd, the others on ScalarE; the square of
// x - mean is that of -x + mean (no negated mean); a mean summed on ScalarE
// scales by 1/D as it sums, and rsqrt(var / D + eps) is one activation. A
// period's steps are emitted segment by segment, op by op across its steps.
// ALT-LABEL: func.func @layer_norm
// ALT: nisa.copy {{.*}} : memref<128x4096xbf16, #nisa.mem<sbuf>>, memref<128x4096xbf16, #nisa.mem<psum>>
// ALT: nisa.copy {{.*}} : memref<128x4096xbf16, #nisa.mem<sbuf>>, memref<128x4096xbf16, #nisa.mem<psum>>
// ALT: scf.for
// ALT: nisa.tensor_reduce add {{.*}} {engine = #nisa.engine<gpsimd>} : memref<128x4096xbf16
// ALT: nisa.activation identity {{.*}} accumulate %{{[^ ]*}} {scale = 2.44140625E-4 : f64}
// ALT-NOT: nisa.tensor_scalar
// ALT: nisa.activation identity {{.*}} accumulate %{{[^ ]*}} {scale = 2.44140625E-4 : f64}
// ALT: nisa.activation square %{{.*}}, %{{.*}} bias %{{.*}} accumulate %{{.*}} {scale = -1.000000e+00 : f64}
// ALT-NOT: nisa.tensor_scalar
// ALT: nisa.activation square
// ALT-NOT: nisa.tensor_scalar
// ALT: nisa.activation square
// ALT: nisa.activation rsqrt %{{[^ ]*}}, %{{[^ ]*}} {bias_imm = 9.9999997473787516E-6 : f64, scale = 2.44140625E-4 : f64}
// ALT: nisa.scalar_tensor_tensor subtract, multiply {{.*}} {engine = #nisa.engine<gpsimd>} : {{.*}}, memref<128x4096xbf16, strided<[4096, 1], offset: ?>, #nisa.mem<sbuf>>
// ALT: nisa.scalar_tensor_tensor subtract, multiply %{{[^{]*}} : {{.*}}, memref<128x4096xbf16, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// ALT: nisa.scalar_tensor_tensor multiply, add {{.*}} {engine = #nisa.engine<gpsimd>} : {{.*}}, memref<128x4096xbf16, strided<[4096, 1], offset: ?>, #nisa.mem<sbuf>>
// ALT: nisa.scalar_tensor_tensor multiply, add %{{[^{]*}} : memref<128x4096xf32, {{.*}}, memref<128x4096xbf16, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// Nothing overlaps the last period's stores: its affine passes and stores
// go by column halves, the first half's stores overlapping the second's
// compute.
// ALT: nisa.scalar_tensor_tensor multiply, add {{.*}} : memref<128x2048xf32
// ALT-NOT: memref<128x4096xbf16, strided<[4096, 1], offset: ?>>
// ALT: nisa.dma_copy {{.*}} : memref<128x2048xbf16, strided<[24576, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x2048xbf16, strided<[4096, 1], offset: ?>>
// ALT: nisa.scalar_tensor_tensor multiply, add {{.*}} : memref<128x2048xf32
// ALT-NOT: memref<128x4096xbf16, strided<[4096, 1], offset: ?>>
// ALT: nisa.dma_copy {{.*}} : memref<128x2048xbf16, strided<[24576, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x2048xbf16, strided<[4096, 1], offset: ?>>
// ALT-NOT: memref<128x4096xbf16, strided<[4096, 1], offset: ?>>
// ALT: return
func.func @layer_norm(%arg0: tensor<4096x4096xbf16>, %arg1: tensor<4096xbf16>, %arg2: tensor<4096xbf16>) -> tensor<4096x4096xbf16> {
  %0 = neuron.constant dense<9.99999974E-6> : tensor<4096x1xf32>
  %1 = neuron.constant dense<2.44140625E-4> : tensor<4096x1xf32>
  %2 = neuron.cast %arg0 : tensor<4096x4096xbf16> -> tensor<4096x4096xf32>
  %3 = neuron.reduce  sum %2 {count = 1 : i64} : tensor<4096x4096xf32> -> tensor<4096xf32>
  %4 = neuron.reshape %3 : tensor<4096xf32> -> tensor<4096x1xf32>
  %5 = neuron.binary  mul %4, %1 : tensor<4096x1xf32>, tensor<4096x1xf32> -> tensor<4096x1xf32>
  %6 = neuron.broadcast %5 : tensor<4096x1xf32> -> tensor<4096x4096xf32>
  %7 = neuron.binary  sub %2, %6 : tensor<4096x4096xf32>, tensor<4096x4096xf32> -> tensor<4096x4096xf32>
  %8 = neuron.binary  mul %7, %7 : tensor<4096x4096xf32>, tensor<4096x4096xf32> -> tensor<4096x4096xf32>
  %9 = neuron.reduce  sum %8 {count = 1 : i64} : tensor<4096x4096xf32> -> tensor<4096xf32>
  %10 = neuron.reshape %9 : tensor<4096xf32> -> tensor<4096x1xf32>
  %11 = neuron.binary  mul %10, %1 : tensor<4096x1xf32>, tensor<4096x1xf32> -> tensor<4096x1xf32>
  %12 = neuron.binary  add %11, %0 : tensor<4096x1xf32>, tensor<4096x1xf32> -> tensor<4096x1xf32>
  %13 = neuron.unary  rsqrt %12 : tensor<4096x1xf32> -> tensor<4096x1xf32>
  %14 = neuron.broadcast %5 : tensor<4096x1xf32> -> tensor<4096x4096xf32>
  %15 = neuron.binary  sub %2, %14 : tensor<4096x4096xf32>, tensor<4096x4096xf32> -> tensor<4096x4096xf32>
  %16 = neuron.cast %arg1 : tensor<4096xbf16> -> tensor<4096xf32>
  %17 = neuron.broadcast %16 : tensor<4096xf32> -> tensor<4096x4096xf32>
  %18 = neuron.binary  mul %15, %17 : tensor<4096x4096xf32>, tensor<4096x4096xf32> -> tensor<4096x4096xf32>
  %19 = neuron.broadcast %13 : tensor<4096x1xf32> -> tensor<4096x4096xf32>
  %20 = neuron.binary  mul %18, %19 : tensor<4096x4096xf32>, tensor<4096x4096xf32> -> tensor<4096x4096xf32>
  %21 = neuron.cast %arg2 : tensor<4096xbf16> -> tensor<4096xf32>
  %22 = neuron.broadcast %21 : tensor<4096xf32> -> tensor<4096x4096xf32>
  %23 = neuron.binary  add %20, %22 : tensor<4096x4096xf32>, tensor<4096x4096xf32> -> tensor<4096x4096xf32>
  %24 = neuron.cast %23 : tensor<4096x4096xf32> -> tensor<4096x4096xbf16>
  return %24 : tensor<4096x4096xbf16>
}

// Llama's RMSNorm: x * rstd cast to bf16, then times the weight, is one
// scalar_tensor_tensor that reads bf16 x and w and stores bf16 (the cast's
// rounding is not kept: one rounding, at the store). Its weight, a short
// row, is read from HBM by every partition: one transfer.
// CHECK-LABEL: func.func @llama_rms_norm
// CHECK: nisa.dma_copy {{.*}} : memref<128x256xbf16, strided<[?, 1]{{.*}}>>, memref<128x256xbf16, #nisa.mem<sbuf>>
// CHECK-NOT: memref<1x256xbf16
// CHECK: nisa.activation square {{.*}} accumulate
// CHECK-NOT: nisa.tensor_tensor
// CHECK: nisa.scalar_tensor_tensor multiply, multiply {{.*}} : memref<128x256xbf16, {{.*}}>, memref<128x256xbf16, {{.*}}>, memref<128x256xbf16
// Two steps: one split, nothing in PSUM.
// ALT-LABEL: func.func @llama_rms_norm
// ALT-NOT: psum
// ALT: return
func.func @llama_rms_norm(%arg0: tensor<256x256xbf16>, %arg1: tensor<256xbf16>) -> tensor<256x256xbf16> {
  %0 = neuron.constant dense<9.99999997E-7> : tensor<256x1xf32>
  %1 = neuron.constant dense<3.906250e-03> : tensor<256x1xf32>
  %2 = neuron.cast %arg0 : tensor<256x256xbf16> -> tensor<256x256xf32>
  %3 = neuron.binary  mul %2, %2 : tensor<256x256xf32>, tensor<256x256xf32> -> tensor<256x256xf32>
  %4 = neuron.reduce  sum %3 {count = 1 : i64} : tensor<256x256xf32> -> tensor<256xf32>
  %5 = neuron.reshape %4 : tensor<256xf32> -> tensor<256x1xf32>
  %6 = neuron.binary  mul %5, %1 : tensor<256x1xf32>, tensor<256x1xf32> -> tensor<256x1xf32>
  %7 = neuron.binary  add %6, %0 : tensor<256x1xf32>, tensor<256x1xf32> -> tensor<256x1xf32>
  %8 = neuron.unary  rsqrt %7 : tensor<256x1xf32> -> tensor<256x1xf32>
  %9 = neuron.broadcast %8 : tensor<256x1xf32> -> tensor<256x256xf32>
  %10 = neuron.binary  mul %2, %9 : tensor<256x256xf32>, tensor<256x256xf32> -> tensor<256x256xf32>
  %11 = neuron.cast %10 : tensor<256x256xf32> -> tensor<256x256xbf16>
  %12 = neuron.broadcast %arg1 : tensor<256xbf16> -> tensor<256x256xbf16>
  %13 = neuron.binary  mul %12, %11 : tensor<256x256xbf16>, tensor<256x256xbf16> -> tensor<256x256xbf16>
  return %13 : tensor<256x256xbf16>
}

// Qwen3's q/k norm (Llama's RMSNorm in float32 over rows of 128): one plan
// for every step, whose rsqrt(sum / 128 + eps) is one ScalarE activation
// too. Its three [P, 1] instructions a step had bound the kernel on ScalarE
// (804 -> 691 us for [1, 4096, 32, 128]).
// CHECK-LABEL: func.func @short_rows_rms_norm
// CHECK: nisa.activation square
// CHECK-NOT: nisa.tensor_scalar
// CHECK: nisa.activation rsqrt %{{[^ ]*}}, %{{[^ ]*}} {bias_imm = 9.9999999747524271E-7 : f64, scale = 7.812500e-03 : f64}
// CHECK: nisa.scalar_tensor_tensor multiply, multiply
func.func @short_rows_rms_norm(%x: tensor<1024x128xbf16>, %w: tensor<128xbf16>) -> tensor<1024x128xbf16> {
  %inv = neuron.constant dense<7.812500e-03> : tensor<1024x1xf32>
  %eps = neuron.constant dense<9.99999997E-7> : tensor<1024x1xf32>
  %h = neuron.cast %x : tensor<1024x128xbf16> -> tensor<1024x128xf32>
  %sq = neuron.binary mul %h, %h : tensor<1024x128xf32>, tensor<1024x128xf32> -> tensor<1024x128xf32>
  %s = neuron.reduce sum %sq {count = 1} : tensor<1024x128xf32> -> tensor<1024xf32>
  %s1 = neuron.reshape %s : tensor<1024xf32> -> tensor<1024x1xf32>
  %m = neuron.binary mul %s1, %inv : tensor<1024x1xf32>, tensor<1024x1xf32> -> tensor<1024x1xf32>
  %e = neuron.binary add %m, %eps : tensor<1024x1xf32>, tensor<1024x1xf32> -> tensor<1024x1xf32>
  %rs = neuron.unary rsqrt %e : tensor<1024x1xf32> -> tensor<1024x1xf32>
  %b = neuron.broadcast %rs : tensor<1024x1xf32> -> tensor<1024x128xf32>
  %n = neuron.binary mul %h, %b : tensor<1024x128xf32>, tensor<1024x128xf32> -> tensor<1024x128xf32>
  %nb = neuron.cast %n : tensor<1024x128xf32> -> tensor<1024x128xbf16>
  %gb = neuron.broadcast %w : tensor<128xbf16> -> tensor<1024x128xbf16>
  %y = neuron.binary mul %gb, %nb : tensor<1024x128xbf16>, tensor<1024x128xbf16> -> tensor<1024x128xbf16>
  return %y : tensor<1024x128xbf16>
}
