// RUN: not neuron-opt %s --split-input-file --neuron-lower-to-nisa=target=trn2 -o /dev/null 2>&1 | FileCheck %s

// Prefill over a run-time query length that one program cannot serve:
// refused with "not size-generic" (the backend then compiles per size).

// A causal mask over query and key lengths of two sizes.
// CHECK: error: not size-generic: neuron.flex_attention: a causal mask over query and key lengths not known to be one size
func.func @lengths(%q: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0, s1] -> (1, 1, s0, 64)>}, %k: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0, s1] -> (1, 1, s1, 64)>}, %v: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0, s1] -> (1, 1, s1, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}, %s1: index {neuron.size = {name = "s1", min = 1 : i64}}) -> tensor<1x1x?x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<1> : tensor<1x1x1x1xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x?x64xf32>, tensor<1x1x?x64xf32>, tensor<1x1x?x64xf32> -> tensor<1x1x?x64xf32>, tensor<1x1x?xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x1x?x64xf32>
}

// -----

// A mask other than the causal one (a sliding window).
// CHECK: error: not size-generic: neuron.flex_attention: a mask other than the causal one over a query length known at run time
func.func @window(%q: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 1, s0, 64)>}, %k: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 1, s0, 64)>}, %v: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 1, s0, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> tensor<1x1x?x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<1> : tensor<1x1x1x1xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x?x64xf32>, tensor<1x1x?x64xf32>, tensor<1x1x?x64xf32> -> tensor<1x1x?x64xf32>, tensor<1x1x?xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %d = neuron.binary sub %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i32>
      %c = neuron.constant dense<64> : tensor<i32>
      %m = neuron.binary lt %d, %c : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x1x?x64xf32>
}

// -----

// The log-sum-exp (a training forward).
// CHECK: error: not size-generic: neuron.flex_attention: the log-sum-exp of a query length known at run time
func.func @lse(%q: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 1, s0, 64)>}, %k: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 1, s0, 64)>}, %v: tensor<1x1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 1, s0, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<1x1x?x64xf32>, tensor<1x1x?xf32>) {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<1> : tensor<1x1x1x1xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x?x64xf32>, tensor<1x1x?x64xf32>, tensor<1x1x?x64xf32> -> tensor<1x1x?x64xf32>, tensor<1x1x?xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o, %l : tensor<1x1x?x64xf32>, tensor<1x1x?xf32>
}
