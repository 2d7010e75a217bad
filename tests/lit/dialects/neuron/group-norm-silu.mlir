// RUN: neuron-opt %s --canonicalize | FileCheck %s

// A group norm's SiLU, v * sigmoid(v) (v its result, or its widening cast,
// then cast back), folds into the group norm: a UNet's GroupNorm then SiLU.

// CHECK-LABEL: func.func @bf16_upcast
// CHECK-NEXT: %[[Y:.*]], %{{.*}}, %{{.*}} = neuron.group_norm %arg0 weight %arg1 bias %arg1 groups 2 eps 1.000000e-05 {silu} :
// CHECK-NEXT: return %[[Y]]
func.func @bf16_upcast(%x: tensor<1x8x4xbf16>, %w: tensor<8xbf16>) -> tensor<1x8x4xbf16> {
  %y:3 = neuron.group_norm %x weight %w bias %w groups 2 eps 1.0e-5 : tensor<1x8x4xbf16>, tensor<8xbf16>, tensor<8xbf16> -> tensor<1x8x4xbf16>, tensor<1x2xbf16>, tensor<1x2xbf16>
  %0 = neuron.cast %y#0 : tensor<1x8x4xbf16> -> tensor<1x8x4xf32>
  %1 = neuron.unary sigmoid %0 : tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  %2 = neuron.binary mul %0, %1 : tensor<1x8x4xf32>, tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  %3 = neuron.cast %2 : tensor<1x8x4xf32> -> tensor<1x8x4xbf16>
  return %3 : tensor<1x8x4xbf16>
}

// In float32, sigmoid's product the other way round; mean and rstd (a
// training forward's, for the backward) come from the folded op.
// CHECK-LABEL: func.func @f32_stats
// CHECK-NEXT: %[[Y:.*]], %[[M:.*]], %[[R:.*]] = neuron.group_norm %arg0 groups 2 eps 1.000000e-05 {silu} :
// CHECK-NEXT: return %[[Y]], %[[M]], %[[R]]
func.func @f32_stats(%x: tensor<1x8x4xf32>) -> (tensor<1x8x4xf32>, tensor<1x2xf32>, tensor<1x2xf32>) {
  %y:3 = neuron.group_norm %x groups 2 eps 1.0e-5 : tensor<1x8x4xf32> -> tensor<1x8x4xf32>, tensor<1x2xf32>, tensor<1x2xf32>
  %1 = neuron.unary sigmoid %y#0 : tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  %2 = neuron.binary mul %1, %y#0 : tensor<1x8x4xf32>, tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  return %2, %y#1, %y#2 : tensor<1x8x4xf32>, tensor<1x2xf32>, tensor<1x2xf32>
}

// The normalized value read elsewhere too (a residual): no fold.
// CHECK-LABEL: func.func @also_read
// CHECK: neuron.group_norm
// CHECK-NOT: {silu}
// CHECK: neuron.unary sigmoid
func.func @also_read(%x: tensor<1x8x4xf32>) -> (tensor<1x8x4xf32>, tensor<1x8x4xf32>) {
  %y:3 = neuron.group_norm %x groups 2 eps 1.0e-5 : tensor<1x8x4xf32> -> tensor<1x8x4xf32>, tensor<1x2xf32>, tensor<1x2xf32>
  %1 = neuron.unary sigmoid %y#0 : tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  %2 = neuron.binary mul %y#0, %1 : tensor<1x8x4xf32>, tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  return %2, %y#0 : tensor<1x8x4xf32>, tensor<1x8x4xf32>
}
