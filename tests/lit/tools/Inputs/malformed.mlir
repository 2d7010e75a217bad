func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  // an op with a bad attribute
  %0 = neuron.unary notafunction %a : tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
