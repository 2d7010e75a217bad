// RUN: neuron-opt %s --canonicalize | FileCheck %s

// Transformers' apply_rotary_pos_emb, q * cos + rotate_half(q) * sin with
// rotate_half(x) = concat(-x[..., h:], x[..., :h]), becomes one
// neuron.rotary of q and the broadcast cos and sin, in either order of the
// sum and of each product.

// CHECK-LABEL: func.func @llama
// CHECK: %[[COS:.*]] = neuron.broadcast %arg1
// CHECK: %[[SIN:.*]] = neuron.broadcast %arg2
// CHECK: %[[R:.*]] = neuron.rotary %arg0, %[[COS]], %[[SIN]] : tensor<1x4x8x16xbf16>, tensor<1x4x8x16xbf16>, tensor<1x4x8x16xbf16> -> tensor<1x4x8x16xbf16>
// CHECK-NOT: neuron.concat
// CHECK: return %[[R]]
func.func @llama(%q: tensor<1x4x8x16xbf16>, %c: tensor<1x1x8x16xbf16>, %s: tensor<1x1x8x16xbf16>) -> tensor<1x4x8x16xbf16> {
  %cos = neuron.broadcast %c : tensor<1x1x8x16xbf16> -> tensor<1x4x8x16xbf16>
  %sin = neuron.broadcast %s : tensor<1x1x8x16xbf16> -> tensor<1x4x8x16xbf16>
  %lo = neuron.slice %q {offsets = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1, 1, 1>} : tensor<1x4x8x16xbf16> -> tensor<1x4x8x8xbf16>
  %hi = neuron.slice %q {offsets = array<i64: 0, 0, 0, 8>, strides = array<i64: 1, 1, 1, 1>} : tensor<1x4x8x16xbf16> -> tensor<1x4x8x8xbf16>
  %neg = neuron.unary neg %hi : tensor<1x4x8x8xbf16> -> tensor<1x4x8x8xbf16>
  %rot = neuron.concat %neg, %lo {dim = 3 : i64} : tensor<1x4x8x8xbf16>, tensor<1x4x8x8xbf16> -> tensor<1x4x8x16xbf16>
  %a = neuron.binary mul %q, %cos : tensor<1x4x8x16xbf16>, tensor<1x4x8x16xbf16> -> tensor<1x4x8x16xbf16>
  %b = neuron.binary mul %rot, %sin : tensor<1x4x8x16xbf16>, tensor<1x4x8x16xbf16> -> tensor<1x4x8x16xbf16>
  %y = neuron.binary add %a, %b : tensor<1x4x8x16xbf16>, tensor<1x4x8x16xbf16> -> tensor<1x4x8x16xbf16>
  return %y : tensor<1x4x8x16xbf16>
}

// CHECK-LABEL: func.func @swapped
// CHECK: neuron.rotary %arg0, %arg1, %arg2
func.func @swapped(%q: tensor<8x16xf32>, %cos: tensor<8x16xf32>, %sin: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %lo = neuron.slice %q {offsets = array<i64: 0, 0>, strides = array<i64: 1, 1>} : tensor<8x16xf32> -> tensor<8x8xf32>
  %hi = neuron.slice %q {offsets = array<i64: 0, 8>, strides = array<i64: 1, 1>} : tensor<8x16xf32> -> tensor<8x8xf32>
  %neg = neuron.unary neg %hi : tensor<8x8xf32> -> tensor<8x8xf32>
  %rot = neuron.concat %neg, %lo {dim = 1 : i64} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x16xf32>
  %b = neuron.binary mul %sin, %rot : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %a = neuron.binary mul %cos, %q : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %y = neuron.binary add %b, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

// Not a rotation of the pairs (i, i + h): the halves the other way round,
// or the products of another tensor. Left as written.
// CHECK-LABEL: func.func @not_rotate_half
// CHECK-NOT: neuron.rotary
// CHECK: return
func.func @not_rotate_half(%q: tensor<8x16xf32>, %k: tensor<8x16xf32>, %cos: tensor<8x16xf32>, %sin: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %lo = neuron.slice %q {offsets = array<i64: 0, 0>, strides = array<i64: 1, 1>} : tensor<8x16xf32> -> tensor<8x8xf32>
  %hi = neuron.slice %q {offsets = array<i64: 0, 8>, strides = array<i64: 1, 1>} : tensor<8x16xf32> -> tensor<8x8xf32>
  %neglo = neuron.unary neg %lo : tensor<8x8xf32> -> tensor<8x8xf32>
  %wrong = neuron.concat %neglo, %hi {dim = 1 : i64} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x16xf32>
  %a = neuron.binary mul %q, %cos : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %b = neuron.binary mul %wrong, %sin : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %y = neuron.binary add %a, %b : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %neghi = neuron.unary neg %hi : tensor<8x8xf32> -> tensor<8x8xf32>
  %rot = neuron.concat %neghi, %lo {dim = 1 : i64} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x16xf32>
  %c = neuron.binary mul %k, %cos : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %d = neuron.binary mul %rot, %sin : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  %z = neuron.binary add %c, %d : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
  return %y, %z : tensor<8x16xf32>, tensor<8x16xf32>
}

// A rotated dim longer than the lowering keeps on chip stays as written.
// CHECK-LABEL: func.func @too_wide
// CHECK-NOT: neuron.rotary
// CHECK: return
func.func @too_wide(%q: tensor<2x2048xf32>, %cos: tensor<2x2048xf32>, %sin: tensor<2x2048xf32>) -> tensor<2x2048xf32> {
  %lo = neuron.slice %q {offsets = array<i64: 0, 0>, strides = array<i64: 1, 1>} : tensor<2x2048xf32> -> tensor<2x1024xf32>
  %hi = neuron.slice %q {offsets = array<i64: 0, 1024>, strides = array<i64: 1, 1>} : tensor<2x2048xf32> -> tensor<2x1024xf32>
  %neg = neuron.unary neg %hi : tensor<2x1024xf32> -> tensor<2x1024xf32>
  %rot = neuron.concat %neg, %lo {dim = 1 : i64} : tensor<2x1024xf32>, tensor<2x1024xf32> -> tensor<2x2048xf32>
  %a = neuron.binary mul %q, %cos : tensor<2x2048xf32>, tensor<2x2048xf32> -> tensor<2x2048xf32>
  %b = neuron.binary mul %rot, %sin : tensor<2x2048xf32>, tensor<2x2048xf32> -> tensor<2x2048xf32>
  %y = neuron.binary add %a, %b : tensor<2x2048xf32>, tensor<2x2048xf32> -> tensor<2x2048xf32>
  return %y : tensor<2x2048xf32>
}
