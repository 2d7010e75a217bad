// RUN: neuron-opt %s -split-input-file -verify-diagnostics

func.func @all_reduce_shape(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{all_reduce keeps the input's shape}}
  %0 = neuron.collective all_reduce %a {group = "0", ranks = array<i64: 0, 1>} : tensor<4x8xf32> -> tensor<8x8xf32>
  return
}

// -----

func.func @element_type(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{input and result must have one element type}}
  %0 = neuron.collective all_reduce %a {group = "0", ranks = array<i64: 0, 1>} : tensor<4x8xf32> -> tensor<4x8xbf16>
  return
}

// -----

func.func @no_ranks(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{needs the group's ranks}}
  %0 = neuron.collective all_reduce %a {group = "0", ranks = array<i64>} : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @repeated_rank(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{rank 1 is negative or listed twice}}
  %0 = neuron.collective all_reduce %a {group = "0", ranks = array<i64: 1, 1>} : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @prod(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{reduces with sum, max or min}}
  %0 = neuron.collective all_reduce %a {group = "0", ranks = array<i64: 0, 1>, reduce = #neuron<reduce_fn prod>} : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @gather_size(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{all_gather's result dim 0 must be 2 (the group's size) times the input's}}
  %0 = neuron.collective all_gather %a {group = "0", ranks = array<i64: 0, 1>} : tensor<4x8xf32> -> tensor<12x8xf32>
  return
}

// -----

func.func @gather_other_dims(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{input and result must agree on every dim but dim 0}}
  %0 = neuron.collective all_gather %a {group = "0", ranks = array<i64: 0, 1>} : tensor<4x8xf32> -> tensor<8x4xf32>
  return
}

// -----

func.func @scatter_divisible(%a: tensor<5x8xf32>) {
  // expected-error @+1 {{reduce_scatter's input dim 0 (5) must be divisible by the group's size (2)}}
  %0 = neuron.collective reduce_scatter %a {group = "0", ranks = array<i64: 0, 1>} : tensor<5x8xf32> -> tensor<2x8xf32>
  return
}

// -----

func.func @scatter_size(%a: tensor<8x8xf32>) {
  // expected-error @+1 {{reduce_scatter's result dim 0 must be the input's / 2}}
  %0 = neuron.collective reduce_scatter %a {group = "0", ranks = array<i64: 0, 1>} : tensor<8x8xf32> -> tensor<2x8xf32>
  return
}
