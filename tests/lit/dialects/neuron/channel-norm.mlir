// RUN: neuron-opt %s --canonicalize | FileCheck %s

// The channels-first LayerNorm as ConvNeXt's reference code writes it
// (u = x.mean(1, keepdim=True), s = (x - u).pow(2).mean(1, keepdim=True),
// (x - u) / sqrt(s + eps)), as the importer leaves it: each mean a sum over
// x transposed to channels-last, times 1 / C. Transformers' version widens x
// to f32 and casts the result back, then applies weight[:, None, None] and
// bias[:, None, None]: one channel_norm of the bf16 input with that weight
// and bias.
// CHECK-LABEL: func.func @hf_layer_norm
// CHECK-NOT: neuron.transpose
// CHECK-NOT: neuron.reduce
// CHECK: %[[W:.*]] = neuron.reshape %arg1 : tensor<16xbf16> -> tensor<16x1x1xbf16>
// CHECK: %[[N:.*]], %{{.*}}, %{{.*}} = neuron.channel_norm %arg0 weight %[[W2:.*]] bias %[[B2:.*]] eps 9.9999999747524271E-7 : tensor<2x16x3x3xbf16>, tensor<16xbf16>, tensor<16xbf16> -> tensor<2x16x3x3xbf16>, tensor<2x1x3x3xf32>, tensor<2x1x3x3xf32>
// CHECK-NOT: neuron.binary
// CHECK: return %[[N]]
func.func @hf_layer_norm(%arg0: tensor<2x16x3x3xbf16>, %arg1: tensor<16xbf16>, %arg2: tensor<16xbf16>) -> tensor<2x16x3x3xbf16> {
  %0 = neuron.cast %arg0 : tensor<2x16x3x3xbf16> -> tensor<2x16x3x3xf32>
  %1 = neuron.transpose %0, [0, 2, 3, 1] : tensor<2x16x3x3xf32> -> tensor<2x3x3x16xf32>
  %2 = neuron.reduce  sum %1 {count = 1 : i64} : tensor<2x3x3x16xf32> -> tensor<2x3x3xf32>
  %3 = neuron.reshape %2 : tensor<2x3x3xf32> -> tensor<2x1x3x3xf32>
  %4 = neuron.constant dense<6.250000e-02> : tensor<2x1x3x3xf32>
  %5 = neuron.binary  mul %3, %4 : tensor<2x1x3x3xf32>, tensor<2x1x3x3xf32> -> tensor<2x1x3x3xf32>
  %6 = neuron.broadcast %5 : tensor<2x1x3x3xf32> -> tensor<2x16x3x3xf32>
  %7 = neuron.binary  sub %0, %6 : tensor<2x16x3x3xf32>, tensor<2x16x3x3xf32> -> tensor<2x16x3x3xf32>
  %8 = neuron.binary  mul %7, %7 : tensor<2x16x3x3xf32>, tensor<2x16x3x3xf32> -> tensor<2x16x3x3xf32>
  %9 = neuron.transpose %8, [0, 2, 3, 1] : tensor<2x16x3x3xf32> -> tensor<2x3x3x16xf32>
  %10 = neuron.reduce  sum %9 {count = 1 : i64} : tensor<2x3x3x16xf32> -> tensor<2x3x3xf32>
  %11 = neuron.reshape %10 : tensor<2x3x3xf32> -> tensor<2x1x3x3xf32>
  %12 = neuron.constant dense<6.250000e-02> : tensor<2x1x3x3xf32>
  %13 = neuron.binary  mul %11, %12 : tensor<2x1x3x3xf32>, tensor<2x1x3x3xf32> -> tensor<2x1x3x3xf32>
  %14 = neuron.broadcast %5 : tensor<2x1x3x3xf32> -> tensor<2x16x3x3xf32>
  %15 = neuron.binary  sub %0, %14 : tensor<2x16x3x3xf32>, tensor<2x16x3x3xf32> -> tensor<2x16x3x3xf32>
  %16 = neuron.constant dense<9.99999997E-7> : tensor<2x1x3x3xf32>
  %17 = neuron.binary  add %13, %16 : tensor<2x1x3x3xf32>, tensor<2x1x3x3xf32> -> tensor<2x1x3x3xf32>
  %18 = neuron.unary  sqrt %17 : tensor<2x1x3x3xf32> -> tensor<2x1x3x3xf32>
  %19 = neuron.broadcast %18 : tensor<2x1x3x3xf32> -> tensor<2x16x3x3xf32>
  %20 = neuron.binary  div %15, %19 : tensor<2x16x3x3xf32>, tensor<2x16x3x3xf32> -> tensor<2x16x3x3xf32>
  %21 = neuron.cast %20 : tensor<2x16x3x3xf32> -> tensor<2x16x3x3xbf16>
  %22 = neuron.reshape %arg1 : tensor<16xbf16> -> tensor<16x1x1xbf16>
  %23 = neuron.broadcast %22 : tensor<16x1x1xbf16> -> tensor<2x16x3x3xbf16>
  %24 = neuron.binary  mul %23, %21 : tensor<2x16x3x3xbf16>, tensor<2x16x3x3xbf16> -> tensor<2x16x3x3xbf16>
  %25 = neuron.reshape %arg2 : tensor<16xbf16> -> tensor<16x1x1xbf16>
  %26 = neuron.broadcast %25 : tensor<16x1x1xbf16> -> tensor<2x16x3x3xbf16>
  %27 = neuron.binary  add %24, %26 : tensor<2x16x3x3xbf16>, tensor<2x16x3x3xbf16> -> tensor<2x16x3x3xbf16>
  return %27 : tensor<2x16x3x3xbf16>
}

// Times rsqrt(s + eps), in f32 throughout, without an affine: the norm of x
// itself. Its result read twice (not only cast back) keeps it f32 too.
// CHECK-LABEL: func.func @rsqrt_form
// CHECK: %[[N:.*]], %{{.*}}, %{{.*}} = neuron.channel_norm %arg0 eps 9.9999997473787516E-6 : tensor<1x16x5xf32> -> tensor<1x16x5xf32>, tensor<1x1x5xf32>, tensor<1x1x5xf32>
// CHECK: return %[[N]]
func.func @rsqrt_form(%x: tensor<1x16x5xf32>) -> tensor<1x16x5xf32> {
  %t = neuron.transpose %x, [0, 2, 1] : tensor<1x16x5xf32> -> tensor<1x5x16xf32>
  %s = neuron.reduce  sum %t {count = 1 : i64} : tensor<1x5x16xf32> -> tensor<1x5xf32>
  %r = neuron.reshape %s : tensor<1x5xf32> -> tensor<1x1x5xf32>
  %c = neuron.constant dense<6.250000e-02> : tensor<1x1x5xf32>
  %u = neuron.binary  mul %c, %r : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %ub = neuron.broadcast %u : tensor<1x1x5xf32> -> tensor<1x16x5xf32>
  %d = neuron.binary  sub %x, %ub : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  %sq = neuron.binary  mul %d, %d : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  %t2 = neuron.transpose %sq, [0, 2, 1] : tensor<1x16x5xf32> -> tensor<1x5x16xf32>
  %s2 = neuron.reduce  sum %t2 {count = 1 : i64} : tensor<1x5x16xf32> -> tensor<1x5xf32>
  %r2 = neuron.reshape %s2 : tensor<1x5xf32> -> tensor<1x1x5xf32>
  %v = neuron.binary  mul %r2, %c : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %e = neuron.constant dense<1.000000e-05> : tensor<1x1x5xf32>
  %ve = neuron.binary  add %e, %v : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %rs = neuron.unary  rsqrt %ve : tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %rsb = neuron.broadcast %rs : tensor<1x1x5xf32> -> tensor<1x16x5xf32>
  %y = neuron.binary  mul %rsb, %d : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  return %y : tensor<1x16x5xf32>
}

// Not a channel norm: a mean times a factor other than 1 / C, a reduction
// over the last dim (an ordinary row norm, the decomposition's own), and a
// deviation from a mean of another tensor.
// CHECK-LABEL: func.func @not_channel_norms
// CHECK-NOT: neuron.channel_norm
// CHECK: return
func.func @not_channel_norms(%x: tensor<1x16x5xf32>, %z: tensor<1x16x5xf32>) -> (tensor<1x16x5xf32>, tensor<1x16x5xf32>) {
  %t = neuron.transpose %x, [0, 2, 1] : tensor<1x16x5xf32> -> tensor<1x5x16xf32>
  %s = neuron.reduce  sum %t {count = 1 : i64} : tensor<1x5x16xf32> -> tensor<1x5xf32>
  %r = neuron.reshape %s : tensor<1x5xf32> -> tensor<1x1x5xf32>
  %half = neuron.constant dense<5.000000e-01> : tensor<1x1x5xf32>
  %u = neuron.binary  mul %r, %half : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %ub = neuron.broadcast %u : tensor<1x1x5xf32> -> tensor<1x16x5xf32>
  %d = neuron.binary  sub %x, %ub : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  %sq = neuron.binary  mul %d, %d : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  %t2 = neuron.transpose %sq, [0, 2, 1] : tensor<1x16x5xf32> -> tensor<1x5x16xf32>
  %s2 = neuron.reduce  sum %t2 {count = 1 : i64} : tensor<1x5x16xf32> -> tensor<1x5xf32>
  %r2 = neuron.reshape %s2 : tensor<1x5xf32> -> tensor<1x1x5xf32>
  %v = neuron.binary  mul %r2, %half : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %e = neuron.constant dense<1.000000e-05> : tensor<1x1x5xf32>
  %ve = neuron.binary  add %v, %e : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %rs = neuron.unary  rsqrt %ve : tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %rsb = neuron.broadcast %rs : tensor<1x1x5xf32> -> tensor<1x16x5xf32>
  %y = neuron.binary  mul %d, %rsb : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  %c = neuron.constant dense<6.250000e-02> : tensor<1x1x5xf32>
  %uz = neuron.binary  mul %r, %c : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %uzb = neuron.broadcast %uz : tensor<1x1x5xf32> -> tensor<1x16x5xf32>
  %dz = neuron.binary  sub %z, %uzb : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  %sqz = neuron.binary  mul %dz, %dz : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  %t3 = neuron.transpose %sqz, [0, 2, 1] : tensor<1x16x5xf32> -> tensor<1x5x16xf32>
  %s3 = neuron.reduce  sum %t3 {count = 1 : i64} : tensor<1x5x16xf32> -> tensor<1x5xf32>
  %r3 = neuron.reshape %s3 : tensor<1x5xf32> -> tensor<1x1x5xf32>
  %v3 = neuron.binary  mul %r3, %c : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %ve3 = neuron.binary  add %v3, %e : tensor<1x1x5xf32>, tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %rs3 = neuron.unary  rsqrt %ve3 : tensor<1x1x5xf32> -> tensor<1x1x5xf32>
  %rsb3 = neuron.broadcast %rs3 : tensor<1x1x5xf32> -> tensor<1x16x5xf32>
  %y3 = neuron.binary  mul %dz, %rsb3 : tensor<1x16x5xf32>, tensor<1x16x5xf32> -> tensor<1x16x5xf32>
  return %y, %y3 : tensor<1x16x5xf32>, tensor<1x16x5xf32>
}

// A channel norm's statistics read elsewhere (a training forward's) keep
// the per-channel affine a pass of its own.
// CHECK-LABEL: func.func @affine_with_statistics
// CHECK: neuron.channel_norm %arg0 eps
// CHECK: neuron.binary mul
func.func @affine_with_statistics(%x: tensor<1x4x2x3xf32>, %w: tensor<4x1x1xf32>) -> (tensor<1x4x2x3xf32>, tensor<1x1x2x3xf32>) {
  %n:3 = neuron.channel_norm %x eps 1.0e-6 : tensor<1x4x2x3xf32> -> tensor<1x4x2x3xf32>, tensor<1x1x2x3xf32>, tensor<1x1x2x3xf32>
  %wb = neuron.broadcast %w : tensor<4x1x1xf32> -> tensor<1x4x2x3xf32>
  %y = neuron.binary  mul %n#0, %wb : tensor<1x4x2x3xf32>, tensor<1x4x2x3xf32> -> tensor<1x4x2x3xf32>
  return %y, %n#1 : tensor<1x4x2x3xf32>, tensor<1x1x2x3xf32>
}
