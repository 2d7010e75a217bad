// RUN: neuron-opt %s -split-input-file -verify-diagnostics

// Dynamic dims (`?`, sizes known only at run time, issue #16): accepted
// where the relation still holds, refused where it cannot be checked.

func.func @dynamic_ok(%a: tensor<?x4xf32>, %b: tensor<4xf32>, %c: tensor<?x4xf32>) {
  %0 = neuron.broadcast %b : tensor<4xf32> -> tensor<?x4xf32>
  %1 = neuron.binary add %a, %0 : tensor<?x4xf32>, tensor<?x4xf32> -> tensor<?x4xf32>
  %2 = neuron.reshape %1 : tensor<?x4xf32> -> tensor<?x2xf32>
  %3 = neuron.slice %a {offsets = array<i64: 0, 1>, strides = array<i64: 1, 1>} : tensor<?x4xf32> -> tensor<?x3xf32>
  %4 = neuron.concat %a, %c {dim = 0} : tensor<?x4xf32>, tensor<?x4xf32> -> tensor<?x4xf32>
  return
}

// -----

func.func @reshape_static_to_dynamic(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{reshape between a static and a dynamic shape}}
  %0 = neuron.reshape %a : tensor<2x4xf32> -> tensor<?x4xf32>
  return
}

// -----

func.func @broadcast_dynamic_to_static(%a: tensor<?x4xf32>) {
  // expected-error @+1 {{input dim 0 of size ? cannot broadcast to 3}}
  %0 = neuron.broadcast %a : tensor<?x4xf32> -> tensor<3x4xf32>
  return
}

// -----

func.func @slice_dynamic_part(%a: tensor<?x4xf32>) {
  // expected-error @+1 {{dim 0 is dynamic: a slice must keep it whole}}
  %0 = neuron.slice %a {offsets = array<i64: 1, 0>, strides = array<i64: 1, 1>} : tensor<?x4xf32> -> tensor<?x4xf32>
  return
}

// -----

func.func @slice_dynamic_to_static(%a: tensor<?x4xf32>) {
  // expected-error @+1 {{dim 0 is dynamic: a slice must keep it whole}}
  %0 = neuron.slice %a {offsets = array<i64: 0, 0>, strides = array<i64: 1, 1>} : tensor<?x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @concat_dynamic_result(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{dim 0 is dynamic in the result but in no input}}
  %0 = neuron.concat %a, %a {dim = 0} : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<?x4xf32>
  return
}

// -----

func.func @concat_dynamic_input(%a: tensor<?x4xf32>) {
  // expected-error @+1 {{dim 0 is dynamic in an input but not the result}}
  %0 = neuron.concat %a, %a {dim = 0} : tensor<?x4xf32>, tensor<?x4xf32> -> tensor<8x4xf32>
  return
}
