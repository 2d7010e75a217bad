// RUN: neuron-opt %s --canonicalize | FileCheck %s

// Identity layout ops and casts disappear; reshape chains collapse; a
// broadcast of a splat is a splat.
// CHECK-LABEL: func.func @identities
func.func @identities(%a: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<32xf32>, tensor<2x4xf32>) {
  // CHECK-NOT: neuron.transpose
  // CHECK-NOT: neuron.cast
  // CHECK-NOT: neuron.slice
  %t = neuron.transpose %a, [0, 1] : tensor<4x8xf32> -> tensor<4x8xf32>
  %c = neuron.cast %t : tensor<4x8xf32> -> tensor<4x8xf32>
  %s = neuron.slice %c {offsets = array<i64: 0, 0>, strides = array<i64: 1, 1>} : tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK-DAG: %[[R:.*]] = neuron.reshape %arg0 : tensor<4x8xf32> -> tensor<32xf32>
  // CHECK-DAG: %[[S:.*]] = neuron.constant dense<2.000000e+00> : tensor<2x4xf32>
  %r1 = neuron.reshape %s : tensor<4x8xf32> -> tensor<8x4xf32>
  %r2 = neuron.reshape %r1 : tensor<8x4xf32> -> tensor<32xf32>
  %k = neuron.constant dense<2.0> : tensor<4xf32>
  %b = neuron.broadcast %k : tensor<4xf32> -> tensor<2x4xf32>
  // CHECK: return %arg0, %[[R]], %[[S]]
  return %s, %r2, %b : tensor<4x8xf32>, tensor<32xf32>, tensor<2x4xf32>
}
