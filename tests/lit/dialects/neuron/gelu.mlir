// RUN: neuron-opt %s --canonicalize | FileCheck %s

// GELU's tanh approximation written out becomes one gelu_tanh: GPT-2's
// NewGELUActivation (with its constants rounded to bf16, as eager rounds
// every step) and BLOOM's arrangement of it.
// CHECK-LABEL: func.func @new_gelu
// CHECK-NEXT: %[[G:.*]] = neuron.unary gelu_tanh %arg0 : tensor<4x8xbf16> -> tensor<4x8xbf16>
// CHECK-NEXT: return %[[G]]
func.func @new_gelu(%x: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %one = neuron.constant dense<1.0> : tensor<4x8xbf16>
  %c = neuron.constant dense<7.968750e-01> : tensor<4x8xbf16>
  %k = neuron.constant dense<4.467770e-02> : tensor<4x8xbf16>
  %three = neuron.constant dense<3.0> : tensor<4x8xbf16>
  %half = neuron.constant dense<0.5> : tensor<4x8xbf16>
  %0 = neuron.binary mul %x, %half : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %1 = neuron.binary pow %x, %three : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %2 = neuron.binary mul %1, %k : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %3 = neuron.binary add %x, %2 : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %4 = neuron.binary mul %3, %c : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %5 = neuron.unary tanh %4 : tensor<4x8xbf16> -> tensor<4x8xbf16>
  %6 = neuron.binary add %5, %one : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  %7 = neuron.binary mul %0, %6 : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
  return %7 : tensor<4x8xbf16>
}

// CHECK-LABEL: func.func @bloom_gelu
// CHECK-NEXT: %[[G:.*]] = neuron.unary gelu_tanh %arg0 : tensor<16xf32> -> tensor<16xf32>
// CHECK-NEXT: return %[[G]]
func.func @bloom_gelu(%x: tensor<16xf32>) -> tensor<16xf32> {
  %one = neuron.constant dense<1.0> : tensor<16xf32>
  %c = neuron.constant dense<0.79788456> : tensor<16xf32>
  %k = neuron.constant dense<0.044715> : tensor<16xf32>
  %half = neuron.constant dense<0.5> : tensor<16xf32>
  %0 = neuron.binary mul %x, %half : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %1 = neuron.binary mul %c, %x : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %2 = neuron.binary mul %k, %x : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %3 = neuron.binary mul %2, %x : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %4 = neuron.binary add %one, %3 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %5 = neuron.binary mul %1, %4 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %6 = neuron.unary tanh %5 : tensor<16xf32> -> tensor<16xf32>
  %7 = neuron.binary add %one, %6 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %8 = neuron.binary mul %0, %7 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  return %8 : tensor<16xf32>
}

// Not GELU: a tanh expression of another value (0.5 * x * (1 + tanh(x))), and
// the formula whose inner value is also returned (it must stay computed).
// CHECK-LABEL: func.func @not_gelu
// CHECK-NOT: gelu_tanh
// CHECK: return
func.func @not_gelu(%x: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>, tensor<16xf32>) {
  %one = neuron.constant dense<1.0> : tensor<16xf32>
  %half = neuron.constant dense<0.5> : tensor<16xf32>
  %c = neuron.constant dense<0.79788456> : tensor<16xf32>
  %k = neuron.constant dense<0.044715> : tensor<16xf32>
  %three = neuron.constant dense<3.0> : tensor<16xf32>
  %0 = neuron.binary mul %x, %half : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %1 = neuron.unary tanh %x : tensor<16xf32> -> tensor<16xf32>
  %2 = neuron.binary add %1, %one : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %3 = neuron.binary mul %0, %2 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %4 = neuron.binary mul %x, %half : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %5 = neuron.binary pow %x, %three : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %6 = neuron.binary mul %5, %k : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %7 = neuron.binary add %x, %6 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %8 = neuron.binary mul %7, %c : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %9 = neuron.unary tanh %8 : tensor<16xf32> -> tensor<16xf32>
  %10 = neuron.binary add %9, %one : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %11 = neuron.binary mul %4, %10 : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  return %3, %11, %9 : tensor<16xf32>, tensor<16xf32>, tensor<16xf32>
}
