// RUN: neuron-opt %s --neuron-lower-to-nisa -split-input-file -verify-diagnostics

// An op with dynamic dims (issue #16) that the lowering cannot make
// size-generic is refused at its location, never tiled for a wrong size:
// the Python backend then compiles a specialization for the call's sizes.

func.func @transpose(%a: tensor<?x4xf32> {neuron.dims = affine_map<()[s0] -> (s0, 4)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> tensor<4x?xf32> {
  // expected-error @+1 {{not size-generic: neuron.transpose on dynamic sizes ('tensor<4x?xf32>')}}
  %0 = neuron.transpose %a, [1, 0] : tensor<?x4xf32> -> tensor<4x?xf32>
  return %0 : tensor<4x?xf32>
}

// -----

// expected-error @+1 {{size arguments must follow the tensors}}
func.func @order(%n: index {neuron.size = {name = "s0", min = 1 : i64}}, %a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
