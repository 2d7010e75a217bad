// RUN: neuron-opt %s --canonicalize | FileCheck %s

// A Linear's bias (a row broadcast over the sums' rows) and the activation
// after it, where nothing else reads the sums, fold into the matmul: its
// eviction from PSUM applies them to the fp32 sums, rounded once. Through a
// reshape that keeps the columns (a Linear over [B, S, K] as [B * S, K]).
// CHECK-LABEL: func.func @linear_gelu
// CHECK: %[[M:.*]] = neuron.matmul %arg0, %arg1 bias(%arg2 : tensor<4xbf16>) {epilogue = #neuron<unary_fn gelu>} : tensor<6x8xbf16>, tensor<8x4xbf16> -> tensor<6x4xbf16>
// CHECK: %[[R:.*]] = neuron.reshape %[[M]] : tensor<6x4xbf16> -> tensor<2x3x4xbf16>
// CHECK-NOT: neuron.binary
// CHECK-NOT: neuron.unary
// CHECK: return %[[R]]
func.func @linear_gelu(%x: tensor<6x8xbf16>, %w: tensor<8x4xbf16>, %b: tensor<4xbf16>) -> tensor<2x3x4xbf16> {
  %m = neuron.matmul %x, %w : tensor<6x8xbf16>, tensor<8x4xbf16> -> tensor<6x4xbf16>
  %r = neuron.reshape %m : tensor<6x4xbf16> -> tensor<2x3x4xbf16>
  %bb = neuron.broadcast %b : tensor<4xbf16> -> tensor<2x3x4xbf16>
  %a = neuron.binary add %bb, %r : tensor<2x3x4xbf16>, tensor<2x3x4xbf16> -> tensor<2x3x4xbf16>
  %g = neuron.unary gelu %a : tensor<2x3x4xbf16> -> tensor<2x3x4xbf16>
  return %g : tensor<2x3x4xbf16>
}

// SiLU as the importer writes it, on the widened sums and cast back.
// CHECK-LABEL: func.func @silu
// CHECK: %[[M:.*]] = neuron.matmul %arg0, %arg1 {epilogue = #neuron<unary_fn silu>} : tensor<2x8xbf16>, tensor<8x4xbf16> -> tensor<2x4xbf16>
// CHECK-NEXT: return %[[M]]
func.func @silu(%x: tensor<2x8xbf16>, %w: tensor<8x4xbf16>) -> tensor<2x4xbf16> {
  %m = neuron.matmul %x, %w : tensor<2x8xbf16>, tensor<8x4xbf16> -> tensor<2x4xbf16>
  %c = neuron.cast %m : tensor<2x4xbf16> -> tensor<2x4xf32>
  %s = neuron.unary sigmoid %c : tensor<2x4xf32> -> tensor<2x4xf32>
  %p = neuron.binary mul %c, %s : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  %n = neuron.cast %p : tensor<2x4xf32> -> tensor<2x4xbf16>
  return %n : tensor<2x4xbf16>
}

// Not folded: sums read elsewhere too (a training forward saves them), a
// bias per row rather than per column, an activation that is not one
// (exp), and an epilogue already there (a second activation stays).
// CHECK-LABEL: func.func @kept
// CHECK: %[[M:.*]] = neuron.matmul %arg0, %arg1 : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<2x4xf32>
// CHECK: neuron.binary add %[[M]]
// CHECK: %[[M2:.*]] = neuron.matmul %arg0, %arg1 : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<2x4xf32>
// CHECK: neuron.binary add %[[M2]]
// CHECK: %[[M3:.*]] = neuron.matmul %arg0, %arg1 : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<2x4xf32>
// CHECK: neuron.unary exp %[[M3]]
// CHECK: %[[M4:.*]] = neuron.matmul %arg0, %arg1 {epilogue = #neuron<unary_fn relu>}
// CHECK: neuron.unary tanh %[[M4]]
func.func @kept(%x: tensor<2x8xf32>, %w: tensor<8x4xf32>, %b: tensor<4xf32>, %rows: tensor<2x1xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) {
  %m = neuron.matmul %x, %w : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<2x4xf32>
  %bb = neuron.broadcast %b : tensor<4xf32> -> tensor<2x4xf32>
  %a = neuron.binary add %m, %bb : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  %m2 = neuron.matmul %x, %w : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<2x4xf32>
  %rb = neuron.broadcast %rows : tensor<2x1xf32> -> tensor<2x4xf32>
  %a2 = neuron.binary add %m2, %rb : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  %m3 = neuron.matmul %x, %w : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<2x4xf32>
  %e = neuron.unary exp %m3 : tensor<2x4xf32> -> tensor<2x4xf32>
  %m4 = neuron.matmul %x, %w {epilogue = #neuron<unary_fn relu>} : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<2x4xf32>
  %t = neuron.unary tanh %m4 : tensor<2x4xf32> -> tensor<2x4xf32>
  return %a, %m, %a2, %e, %t : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
}

// A pointwise convolution as the importer writes it (the weights broadcast
// over the images, each image's [C, H * W]: the channels are the rows) with
// a BatchNorm (x * S + T per channel, in f32 on the widened sums, cast back)
// and ReLU6 (max with 0, min with 6): a row affine, relu and clamp_max.
// CHECK-LABEL: func.func @pointwise_bn_relu6
// CHECK: %[[M:.*]] = neuron.matmul %{{.*}}, %{{.*}} row_scale(%{{.*}} : tensor<6xf32>) row_shift(%{{.*}} : tensor<6xf32>) {clamp_max = 6.000000e+00 : f64, epilogue = #neuron<unary_fn relu>} : tensor<2x6x4xbf16>, tensor<2x4x9xbf16> -> tensor<2x6x9xbf16>
// CHECK: %[[R:.*]] = neuron.reshape %[[M]] : tensor<2x6x9xbf16> -> tensor<2x6x3x3xbf16>
// CHECK-NOT: neuron.binary {{.*}} tensor<2x6x3x3x
// CHECK: return %[[R]]
func.func @pointwise_bn_relu6(%w: tensor<6x4xbf16>, %x: tensor<2x4x9xbf16>, %s: tensor<6x1x1xf32>, %t: tensor<6x1x1xf32>) -> tensor<2x6x3x3xbf16> {
  %wb = neuron.broadcast %w : tensor<6x4xbf16> -> tensor<2x6x4xbf16>
  %m = neuron.matmul %wb, %x : tensor<2x6x4xbf16>, tensor<2x4x9xbf16> -> tensor<2x6x9xbf16>
  %r = neuron.reshape %m : tensor<2x6x9xbf16> -> tensor<2x6x3x3xbf16>
  %c = neuron.cast %r : tensor<2x6x3x3xbf16> -> tensor<2x6x3x3xf32>
  %sb = neuron.broadcast %s : tensor<6x1x1xf32> -> tensor<2x6x3x3xf32>
  %p = neuron.binary mul %c, %sb : tensor<2x6x3x3xf32>, tensor<2x6x3x3xf32> -> tensor<2x6x3x3xf32>
  %tb = neuron.broadcast %t : tensor<6x1x1xf32> -> tensor<2x6x3x3xf32>
  %a = neuron.binary add %p, %tb : tensor<2x6x3x3xf32>, tensor<2x6x3x3xf32> -> tensor<2x6x3x3xf32>
  %n = neuron.cast %a : tensor<2x6x3x3xf32> -> tensor<2x6x3x3xbf16>
  %zero = neuron.constant dense<0.0> : tensor<2x6x3x3xbf16>
  %six = neuron.constant dense<6.0> : tensor<2x6x3x3xbf16>
  %lo = neuron.binary max %n, %zero : tensor<2x6x3x3xbf16>, tensor<2x6x3x3xbf16> -> tensor<2x6x3x3xbf16>
  %hi = neuron.binary min %lo, %six : tensor<2x6x3x3xbf16>, tensor<2x6x3x3xbf16> -> tensor<2x6x3x3xbf16>
  return %hi : tensor<2x6x3x3xbf16>
}

// A max with something other than 0 is not a relu.
// CHECK-LABEL: func.func @max_one
// CHECK: neuron.binary max
func.func @max_one(%x: tensor<2x8xf32>, %w: tensor<8x4xf32>) -> tensor<2x4xf32> {
  %m = neuron.matmul %x, %w : tensor<2x8xf32>, tensor<8x4xf32> -> tensor<2x4xf32>
  %one = neuron.constant dense<1.0> : tensor<2x4xf32>
  %r = neuron.binary max %m, %one : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}

// A pointwise convolution's own bias, added by the importer to the batched
// matmul's [N, O, H * W] before the reshape back ([1, O, 1] broadcast), and
// the GELU after it: a row shift (f32) and the epilogue.
// CHECK-LABEL: func.func @pointwise_bias_gelu
// CHECK: %[[B:.*]] = neuron.cast %{{.*}} : tensor<6xbf16> -> tensor<6xf32>
// CHECK: %[[M:.*]] = neuron.matmul %{{.*}}, %{{.*}} row_shift(%[[B]] : tensor<6xf32>) {epilogue = #neuron<unary_fn gelu>} : tensor<2x6x4xbf16>, tensor<2x4x9xbf16> -> tensor<2x6x9xbf16>
// CHECK-NOT: neuron.binary
// CHECK-NOT: neuron.unary
// CHECK: return
func.func @pointwise_bias_gelu(%w: tensor<6x4xbf16>, %x: tensor<2x4x9xbf16>, %b: tensor<6xbf16>) -> tensor<2x6x3x3xbf16> {
  %wb = neuron.broadcast %w : tensor<6x4xbf16> -> tensor<2x6x4xbf16>
  %m = neuron.matmul %wb, %x : tensor<2x6x4xbf16>, tensor<2x4x9xbf16> -> tensor<2x6x9xbf16>
  %b1 = neuron.reshape %b : tensor<6xbf16> -> tensor<1x6x1xbf16>
  %b2 = neuron.broadcast %b1 : tensor<1x6x1xbf16> -> tensor<2x6x1xbf16>
  %b3 = neuron.broadcast %b2 : tensor<2x6x1xbf16> -> tensor<2x6x9xbf16>
  %a = neuron.binary add %m, %b3 : tensor<2x6x9xbf16>, tensor<2x6x9xbf16> -> tensor<2x6x9xbf16>
  %r = neuron.reshape %a : tensor<2x6x9xbf16> -> tensor<2x6x3x3xbf16>
  %g = neuron.unary gelu %r : tensor<2x6x3x3xbf16> -> tensor<2x6x3x3xbf16>
  return %g : tensor<2x6x3x3xbf16>
}

// A bias that differs between the batch's matrices is not a row shift.
// CHECK-LABEL: func.func @batched_bias_per_matrix
// CHECK: neuron.binary add
func.func @batched_bias_per_matrix(%w: tensor<2x6x4xbf16>, %x: tensor<2x4x9xbf16>, %b: tensor<2x6x1xbf16>) -> tensor<2x6x9xbf16> {
  %m = neuron.matmul %w, %x : tensor<2x6x4xbf16>, tensor<2x4x9xbf16> -> tensor<2x6x9xbf16>
  %b3 = neuron.broadcast %b : tensor<2x6x1xbf16> -> tensor<2x6x9xbf16>
  %a = neuron.binary add %m, %b3 : tensor<2x6x9xbf16>, tensor<2x6x9xbf16> -> tensor<2x6x9xbf16>
  return %a : tensor<2x6x9xbf16>
}

// ConvNeXt's block MLP as torchvision writes it: permute to channels-last,
// Linear, GELU, Linear, permute back. Both Linears become channels-first
// pointwise matmuls (each image's [C, H * W]; biases as f32 row shifts, the
// GELU the first one's epilogue), and no transpose is left.
// CHECK-LABEL: func.func @channels_first_linears
// CHECK-NOT: neuron.transpose
// CHECK: %[[X:.*]] = neuron.reshape %arg0 : tensor<2x4x32x32xbf16> -> tensor<2x4x1024xbf16>
// CHECK: %[[H:.*]] = neuron.matmul %{{.*}}, %[[X]] row_shift(%{{.*}} : tensor<8xf32>) {epilogue = #neuron<unary_fn gelu>} : tensor<2x8x4xbf16>, tensor<2x4x1024xbf16> -> tensor<2x8x1024xbf16>
// CHECK: %[[Y:.*]] = neuron.matmul %{{.*}}, %[[H]] row_shift(%{{.*}} : tensor<4xf32>) : tensor<2x4x8xbf16>, tensor<2x8x1024xbf16> -> tensor<2x4x1024xbf16>
// CHECK: %[[R:.*]] = neuron.reshape %[[Y]] : tensor<2x4x1024xbf16> -> tensor<2x4x32x32xbf16>
// CHECK-NOT: neuron.transpose
// CHECK: return %[[R]]
func.func @channels_first_linears(%x: tensor<2x4x32x32xbf16>, %w1: tensor<8x4xbf16>, %b1: tensor<8xbf16>, %w2: tensor<4x8xbf16>, %b2: tensor<4xbf16>) -> tensor<2x4x32x32xbf16> {
  %t = neuron.transpose %x, [0, 2, 3, 1] : tensor<2x4x32x32xbf16> -> tensor<2x32x32x4xbf16>
  %w1t = neuron.transpose %w1, [1, 0] : tensor<8x4xbf16> -> tensor<4x8xbf16>
  %r = neuron.reshape %t : tensor<2x32x32x4xbf16> -> tensor<2048x4xbf16>
  %m1 = neuron.matmul %r, %w1t : tensor<2048x4xbf16>, tensor<4x8xbf16> -> tensor<2048x8xbf16>
  %m1r = neuron.reshape %m1 : tensor<2048x8xbf16> -> tensor<2x32x32x8xbf16>
  %b1b = neuron.broadcast %b1 : tensor<8xbf16> -> tensor<2x32x32x8xbf16>
  %a1 = neuron.binary add %m1r, %b1b : tensor<2x32x32x8xbf16>, tensor<2x32x32x8xbf16> -> tensor<2x32x32x8xbf16>
  %g = neuron.unary gelu %a1 : tensor<2x32x32x8xbf16> -> tensor<2x32x32x8xbf16>
  %gr = neuron.reshape %g : tensor<2x32x32x8xbf16> -> tensor<2048x8xbf16>
  %w2t = neuron.transpose %w2, [1, 0] : tensor<4x8xbf16> -> tensor<8x4xbf16>
  %m2 = neuron.matmul %gr, %w2t : tensor<2048x8xbf16>, tensor<8x4xbf16> -> tensor<2048x4xbf16>
  %b2b = neuron.broadcast %b2 : tensor<4xbf16> -> tensor<2048x4xbf16>
  %a2 = neuron.binary add %b2b, %m2 : tensor<2048x4xbf16>, tensor<2048x4xbf16> -> tensor<2048x4xbf16>
  %a2r = neuron.reshape %a2 : tensor<2048x4xbf16> -> tensor<2x32x32x4xbf16>
  %back = neuron.transpose %a2r, [0, 3, 1, 2] : tensor<2x32x32x4xbf16> -> tensor<2x4x32x32xbf16>
  return %back : tensor<2x4x32x32xbf16>
}

// Transformers' ConvNextLayer scales the last Linear's result per channel
// before permuting back: the row scale, the bias times it the row shift.
// CHECK-LABEL: func.func @channels_first_layer_scale
// CHECK-NOT: neuron.transpose
// CHECK: %[[B:.*]] = neuron.cast %arg3 : tensor<4xbf16> -> tensor<4xf32>
// CHECK: %[[S:.*]] = neuron.cast %arg4 : tensor<4xbf16> -> tensor<4xf32>
// CHECK: %[[T:.*]] = neuron.binary mul %[[B]], %[[S]] : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
// CHECK: neuron.matmul %{{.*}}, %{{.*}} row_scale(%[[S]] : tensor<4xf32>) row_shift(%[[T]] : tensor<4xf32>) : tensor<2x4x8xbf16>, tensor<2x8x1024xbf16> -> tensor<2x4x1024xbf16>
// CHECK-NOT: neuron.transpose
func.func @channels_first_layer_scale(%x: tensor<2x4x32x32xbf16>, %w1: tensor<8x4xbf16>, %w2: tensor<4x8xbf16>, %b2: tensor<4xbf16>, %s: tensor<4xbf16>) -> tensor<2x4x32x32xbf16> {
  %t = neuron.transpose %x, [0, 2, 3, 1] : tensor<2x4x32x32xbf16> -> tensor<2x32x32x4xbf16>
  %w1t = neuron.transpose %w1, [1, 0] : tensor<8x4xbf16> -> tensor<4x8xbf16>
  %r = neuron.reshape %t : tensor<2x32x32x4xbf16> -> tensor<2048x4xbf16>
  %m1 = neuron.matmul %r, %w1t : tensor<2048x4xbf16>, tensor<4x8xbf16> -> tensor<2048x8xbf16>
  %g = neuron.unary gelu %m1 : tensor<2048x8xbf16> -> tensor<2048x8xbf16>
  %w2t = neuron.transpose %w2, [1, 0] : tensor<4x8xbf16> -> tensor<8x4xbf16>
  %m2 = neuron.matmul %g, %w2t : tensor<2048x8xbf16>, tensor<8x4xbf16> -> tensor<2048x4xbf16>
  %b2b = neuron.broadcast %b2 : tensor<4xbf16> -> tensor<2048x4xbf16>
  %a2 = neuron.binary add %m2, %b2b : tensor<2048x4xbf16>, tensor<2048x4xbf16> -> tensor<2048x4xbf16>
  %a2r = neuron.reshape %a2 : tensor<2048x4xbf16> -> tensor<2x32x32x4xbf16>
  %sb = neuron.broadcast %s : tensor<4xbf16> -> tensor<2x32x32x4xbf16>
  %sc = neuron.binary mul %sb, %a2r : tensor<2x32x32x4xbf16>, tensor<2x32x32x4xbf16> -> tensor<2x32x32x4xbf16>
  %back = neuron.transpose %sc, [0, 3, 1, 2] : tensor<2x32x32x4xbf16> -> tensor<2x4x32x32xbf16>
  return %back : tensor<2x4x32x32xbf16>
}

// Fewer positions an image than a matmul's 512 moving columns: the Linears
// stay channels-last (the weights would be a stationary operand reloaded
// for a few columns, once per image).
// CHECK-LABEL: func.func @channels_last_small_images
// CHECK: neuron.matmul {{.*}} : tensor<128x4xbf16>, tensor<4x8xbf16> -> tensor<128x8xbf16>
// CHECK: neuron.transpose {{.*}}[0, 3, 1, 2]
func.func @channels_last_small_images(%x: tensor<2x4x8x8xbf16>, %w1: tensor<8x4xbf16>) -> tensor<2x8x8x8xbf16> {
  %t = neuron.transpose %x, [0, 2, 3, 1] : tensor<2x4x8x8xbf16> -> tensor<2x8x8x4xbf16>
  %w1t = neuron.transpose %w1, [1, 0] : tensor<8x4xbf16> -> tensor<4x8xbf16>
  %r = neuron.reshape %t : tensor<2x8x8x4xbf16> -> tensor<128x4xbf16>
  %m1 = neuron.matmul %r, %w1t : tensor<128x4xbf16>, tensor<4x8xbf16> -> tensor<128x8xbf16>
  %m1r = neuron.reshape %m1 : tensor<128x8xbf16> -> tensor<2x8x8x8xbf16>
  %back = neuron.transpose %m1r, [0, 3, 1, 2] : tensor<2x8x8x8xbf16> -> tensor<2x8x8x8xbf16>
  return %back : tensor<2x8x8x8xbf16>
}

// A Linear whose channels-last result is also read elsewhere keeps it.
// CHECK-LABEL: func.func @channels_last_result_read_twice
// CHECK: neuron.matmul {{.*}} -> tensor<2048x8xbf16>
// CHECK: neuron.transpose {{.*}}[0, 3, 1, 2]
func.func @channels_last_result_read_twice(%x: tensor<2x4x32x32xbf16>, %w1: tensor<8x4xbf16>) -> (tensor<2x8x32x32xbf16>, tensor<2048x8xbf16>) {
  %t = neuron.transpose %x, [0, 2, 3, 1] : tensor<2x4x32x32xbf16> -> tensor<2x32x32x4xbf16>
  %w1t = neuron.transpose %w1, [1, 0] : tensor<8x4xbf16> -> tensor<4x8xbf16>
  %r = neuron.reshape %t : tensor<2x32x32x4xbf16> -> tensor<2048x4xbf16>
  %m1 = neuron.matmul %r, %w1t : tensor<2048x4xbf16>, tensor<4x8xbf16> -> tensor<2048x8xbf16>
  %m1r = neuron.reshape %m1 : tensor<2048x8xbf16> -> tensor<2x32x32x8xbf16>
  %back = neuron.transpose %m1r, [0, 3, 1, 2] : tensor<2x32x32x8xbf16> -> tensor<2x8x32x32xbf16>
  return %back, %m1 : tensor<2x8x32x32xbf16>, tensor<2048x8xbf16>
}
