// RUN: neuron-opt %s --neuron-lower-to-nisa -split-input-file -verify-diagnostics

// An op with dynamic dims (issue #16) that the lowering cannot make
// size-generic is refused at its location, never tiled for a wrong size:
// the Python backend then compiles a specialization for the call's sizes.

// A transposed view whose copy would take one DMA per row of 100 (their
// stride is known only at run time): refused where it is taken.
func.func @transpose(%a: tensor<?x100xf32> {neuron.dims = affine_map<()[s0] -> (s0, 100)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> tensor<100x?xf32> {
  // expected-error @+1 {{not size-generic: neuron.transpose: a copy in 100 pieces (strides known only at run time)}}
  %0 = neuron.transpose %a, [1, 0] : tensor<?x100xf32> -> tensor<100x?xf32>
  return %0 : tensor<100x?xf32>
}

// -----

// Two dynamic dims out of one, with no sizes from the importer.
func.func @split(%a: tensor<?x4xf32> {neuron.dims = affine_map<()[s0, s1] -> (s0 * s1, 4)>}, %m: index {neuron.size = {name = "s0", min = 1 : i64}}, %n: index {neuron.size = {name = "s1", min = 1 : i64}}) -> tensor<?x?x4xf32> {
  // expected-error @+1 {{not size-generic: neuron.reshape: the size of dim 0 is not known}}
  %0 = neuron.reshape %a : tensor<?x4xf32> -> tensor<?x?x4xf32>
  return %0 : tensor<?x?x4xf32>
}

// -----

// A copy over two dims whose sizes and strides are known only at run time.
func.func @transpose2(%a: tensor<?x?xf32> {neuron.dims = affine_map<()[s0, s1] -> (s0, s1)>}, %m: index {neuron.size = {name = "s0", min = 1 : i64}}, %n: index {neuron.size = {name = "s1", min = 1 : i64}}) -> (tensor<?x?xf32> {neuron.dims = affine_map<()[s0, s1] -> (s1, s0)>}) {
  // expected-error @+1 {{not size-generic: neuron.transpose: dims 0 and 1 and their strides are all known only at run time}}
  %0 = neuron.transpose %a, [1, 0] : tensor<?x?xf32> -> tensor<?x?xf32>
  return %0 : tensor<?x?xf32>
}

// -----

// expected-error @+1 {{size arguments must follow the tensors}}
func.func @order(%n: index {neuron.size = {name = "s0", min = 1 : i64}}, %a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}

// -----

// A GEMM is size-generic in M only.
func.func @matmul_n(%a: tensor<4x64xf32>, %b: tensor<64x?xf32> {neuron.dims = affine_map<()[s0] -> (64, s0)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> tensor<4x?xf32> {
  // expected-error @+1 {{not size-generic: neuron.matmul: K or N known only at run time ('tensor<4x64xf32>' x 'tensor<64x?xf32>')}}
  %0 = neuron.matmul %a, %b : tensor<4x64xf32>, tensor<64x?xf32> -> tensor<4x?xf32>
  return %0 : tensor<4x?xf32>
}

// -----

func.func @matmul_batch(%a: tensor<?x4x64xf32> {neuron.dims = affine_map<()[s0] -> (s0, 4, 64)>}, %b: tensor<?x64x8xf32> {neuron.dims = affine_map<()[s0] -> (s0, 64, 8)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> tensor<?x4x8xf32> {
  // expected-error @+1 {{not size-generic: neuron.matmul: a batch dim known only at run time}}
  %0 = neuron.matmul %a, %b : tensor<?x4x64xf32>, tensor<?x64x8xf32> -> tensor<?x4x8xf32>
  return %0 : tensor<?x4x8xf32>
}

// -----

func.func @matmul_batched_rows(%a: tensor<2x?x64xf32> {neuron.dims = affine_map<()[s0] -> (2, s0, 64)>}, %b: tensor<2x64x8xf32>, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> tensor<2x?x8xf32> {
  // expected-error @+1 {{not size-generic: neuron.matmul: batch dims with rows known only at run time}}
  %0 = neuron.matmul %a, %b : tensor<2x?x64xf32>, tensor<2x64x8xf32> -> tensor<2x?x8xf32>
  return %0 : tensor<2x?x8xf32>
}

// -----

// A broadcast whose users tell its rows only through itself (no loop).
func.func @broadcast_cycle(%x: tensor<?x4xf32> {neuron.dims = affine_map<()[s0] -> (s0, 4)>}, %w: tensor<4xf32>, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<?x4xf32> {neuron.dims = affine_map<()[s0] -> (s0, 4)>}) {
  // expected-error @+1 {{not size-generic: neuron.broadcast: the size of dim 0 is not known ('tensor<4xf32>' -> 'tensor<?x4xf32>')}}
  %b = neuron.broadcast %w : tensor<4xf32> -> tensor<?x4xf32>
  %e = neuron.unary exp %b : tensor<?x4xf32> -> tensor<?x4xf32>
  %y = neuron.binary add %b, %e : tensor<?x4xf32>, tensor<?x4xf32> -> tensor<?x4xf32>
  return %y : tensor<?x4xf32>
}
