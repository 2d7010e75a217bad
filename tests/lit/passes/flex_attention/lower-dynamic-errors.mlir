// RUN: not neuron-opt %s --split-input-file --neuron-lower-to-nisa=target=trn2 -o /dev/null 2>&1 | FileCheck %s

// Attention over a run-time key length that one program cannot serve: refused
// with "not size-generic" (the backend then compiles per size).

// A mask over a run-time key length (its blocks all partial): compiled per
// size.
// CHECK: error: not size-generic: neuron.flex_attention: a mask over a key length known at run time
func.func @masked(%q: tensor<1x1x1x64xf32>, %k: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 1, s0, 64)>}, %v: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 1, s0, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> tensor<1x1x1x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<1> : tensor<1x1x1x1xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x1x64xf32>, tensor<1x1x?x64xf32>, tensor<1x1x?x64xf32> -> tensor<1x1x1x64xf32>, tensor<1x1x1xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x1x1x64xf32>
}

// -----

// Keys of a run-time length with their values of another.
// CHECK: error: not size-generic: neuron.flex_attention: key and value lengths not known to be one size
func.func @lengths(%q: tensor<1x1x1x64xf32>, %k: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0, s1] -> (1, 1, s0, 64)>}, %v: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0, s1] -> (1, 1, s1, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}, %m: index {neuron.size = {name = "s1", min = 1 : i64}}) -> tensor<1x1x1x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<2> : tensor<1x1x1x1xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x1x64xf32>, tensor<1x1x?x64xf32>, tensor<1x1x?x64xf32> -> tensor<1x1x1x64xf32>, tensor<1x1x1xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %t = neuron.constant dense<true> : tensor<i1>
      neuron.yield %t : tensor<i1>
    }
  return %o : tensor<1x1x1x64xf32>
}
