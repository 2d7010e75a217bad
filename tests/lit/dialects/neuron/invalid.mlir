// RUN: neuron-opt %s -split-input-file -verify-diagnostics

func.func @constant_type(%a: tensor<4xf32>) {
  // expected-error @+1 {{all of {value, result} have same type}}
  %0 = "neuron.constant"() {value = dense<1.0> : tensor<2xf32>} : () -> tensor<4xf32>
  return
}

// -----

func.func @unary_shape(%a: tensor<4xf32>) {
  // expected-error @+1 {{result shape must equal the input shape}}
  %0 = neuron.unary exp %a : tensor<4xf32> -> tensor<5xf32>
  return
}

// -----

func.func @unary_type(%a: tensor<4xf32>) {
  // expected-error @+1 {{result element type must equal the input's}}
  %0 = neuron.unary exp %a : tensor<4xf32> -> tensor<4xbf16>
  return
}

// -----

func.func @logical_not(%a: tensor<4xf32>) {
  // expected-error @+1 {{logical_not produces i1}}
  %0 = neuron.unary logical_not %a : tensor<4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @binary_broadcast(%a: tensor<4xf32>, %b: tensor<1xf32>) {
  // expected-error @+1 {{broadcast explicitly}}
  %0 = neuron.binary add %a, %b : tensor<4xf32>, tensor<1xf32> -> tensor<4xf32>
  return
}

// -----

func.func @binary_types(%a: tensor<4xf32>, %b: tensor<4xbf16>) {
  // expected-error @+1 {{operands must have the same element type}}
  %0 = neuron.binary add %a, %b : tensor<4xf32>, tensor<4xbf16> -> tensor<4xf32>
  return
}

// -----

func.func @predicate(%a: tensor<4xf32>) {
  // expected-error @+1 {{'lt' produces an i1 tensor}}
  %0 = neuron.binary lt %a, %a : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @binary_result(%a: tensor<4xf32>) {
  // expected-error @+1 {{result element type must equal the operands'}}
  %0 = neuron.binary add %a, %a : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  return
}

// -----

func.func @select_types(%c: tensor<4xi1>, %a: tensor<4xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{all of {on_true, on_false, result} have same type}}
  %0 = "neuron.select"(%c, %a, %b) : (tensor<4xi1>, tensor<4xf32>, tensor<3xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @select_shape(%c: tensor<3xi1>, %a: tensor<4xf32>) {
  // expected-error @+1 {{condition and values must have the same shape}}
  %0 = neuron.select %c, %a, %a : tensor<3xi1>, tensor<4xf32>
  return
}

// -----

func.func @cast(%a: tensor<4xf32>) {
  // expected-error @+1 {{cast keeps the shape}}
  %0 = neuron.cast %a : tensor<4xf32> -> tensor<2xbf16>
  return
}

// -----

func.func @matmul_rank(%a: tensor<4xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{same rank >= 2}}
  %0 = neuron.matmul %a, %b : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @matmul_types(%a: tensor<4x8xf32>, %b: tensor<8x2xbf16>) {
  // expected-error @+1 {{operands must have the same element type}}
  %0 = neuron.matmul %a, %b : tensor<4x8xf32>, tensor<8x2xbf16> -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_batch(%a: tensor<2x4x8xf32>, %b: tensor<3x8x2xf32>) {
  // expected-error @+1 {{batch dimension 0 differs}}
  %0 = neuron.matmul %a, %b : tensor<2x4x8xf32>, tensor<3x8x2xf32> -> tensor<2x4x2xf32>
  return
}

// -----

func.func @matmul_bias(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>, %c: tensor<4xf32>) {
  // expected-error @+1 {{bias must be [N]}}
  %0 = neuron.matmul %a, %b bias(%c : tensor<4xf32>) : tensor<4x8xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_row_scale(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>, %s: tensor<2xf32>) {
  // expected-error @+1 {{row_scale and row_shift must be [M]}}
  %0 = neuron.matmul %a, %b row_scale(%s : tensor<2xf32>) : tensor<4x8xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_row_and_column(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>, %c: tensor<2xf32>, %s: tensor<4xf32>) {
  // expected-error @+1 {{takes a row affine or a column bias, not both}}
  %0 = neuron.matmul %a, %b bias(%c : tensor<2xf32>) row_shift(%s : tensor<4xf32>) : tensor<4x8xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_epilogue(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>) {
  // expected-error @+1 {{epilogue must be an activation (relu, gelu, gelu_tanh, silu, sigmoid, tanh), not exp}}
  %0 = neuron.matmul %a, %b {epilogue = #neuron<unary_fn exp>} : tensor<4x8xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_k(%a: tensor<4x8xf32>, %b: tensor<7x2xf32>) {
  // expected-error @+1 {{contraction sizes differ: 8 vs 7}}
  %0 = neuron.matmul %a, %b : tensor<4x8xf32>, tensor<7x2xf32> -> tensor<4x2xf32>
  return
}

// -----

func.func @matmul_result(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>) {
  // expected-error @+1 {{result must be [..., M, N]}}
  %0 = neuron.matmul %a, %b : tensor<4x8xf32>, tensor<8x2xf32> -> tensor<4x3xf32>
  return
}

// -----

func.func @reduce_count(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{count 3 out of range for rank 2}}
  %0 = neuron.reduce sum %a {count = 3} : tensor<4x8xf32> -> tensor<f32>
  return
}

// -----

func.func @reduce_shape(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{without the reduced dims}}
  %0 = neuron.reduce sum %a {count = 1} : tensor<4x8xf32> -> tensor<8xf32>
  return
}

// -----

func.func @reduce_type(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{result element type must equal the input's}}
  %0 = neuron.reduce max %a {count = 1} : tensor<4x8xf32> -> tensor<4xbf16>
  return
}

// -----

func.func @broadcast_type(%a: tensor<4xf32>) {
  // expected-error @+1 {{broadcast keeps the element type}}
  %0 = neuron.broadcast %a : tensor<4xf32> -> tensor<2x4xbf16>
  return
}

// -----

func.func @broadcast_rank(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{result rank must be at least the input rank}}
  %0 = neuron.broadcast %a : tensor<2x4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @broadcast_size(%a: tensor<3xf32>) {
  // expected-error @+1 {{input dim 0 of size 3 cannot broadcast to 4}}
  %0 = neuron.broadcast %a : tensor<3xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @transpose_perm(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{permutation must list every dimension once}}
  %0 = neuron.transpose %a, [0, 0] : tensor<2x4xf32> -> tensor<2x2xf32>
  return
}

// -----

func.func @transpose_shape(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{result dim 0 must be input dim 1}}
  %0 = neuron.transpose %a, [1, 0] : tensor<2x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @transpose_type(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{transpose keeps the element type}}
  %0 = neuron.transpose %a, [1, 0] : tensor<2x4xf32> -> tensor<4x2xbf16>
  return
}

// -----

func.func @reshape_count(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{reshape must keep the number of elements (8 vs 9)}}
  %0 = neuron.reshape %a : tensor<2x4xf32> -> tensor<9xf32>
  return
}

// -----

func.func @reshape_type(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{reshape keeps the element type}}
  %0 = neuron.reshape %a : tensor<2x4xf32> -> tensor<8xbf16>
  return
}

// -----

func.func @slice_entries(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{one entry per dimension}}
  %0 = neuron.slice %a {offsets = array<i64: 0>, strides = array<i64: 1, 1>} : tensor<2x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @slice_stride(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{stride of dim 1 must be positive}}
  %0 = neuron.slice %a {offsets = array<i64: 0, 0>, strides = array<i64: 1, 0>} : tensor<2x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @slice_bounds(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{dim 1 reads outside the input}}
  %0 = neuron.slice %a {offsets = array<i64: 0, 2>, strides = array<i64: 1, 1>} : tensor<2x4xf32> -> tensor<2x3xf32>
  return
}

// -----

func.func @slice_type(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{slice keeps the element type}}
  %0 = neuron.slice %a {offsets = array<i64: 0, 0>, strides = array<i64: 1, 1>} : tensor<2x4xf32> -> tensor<2x4xbf16>
  return
}

// -----

func.func @concat_empty() {
  // expected-error @+1 {{needs at least one input}}
  %0 = "neuron.concat"() {dim = 0 : i64} : () -> tensor<2xf32>
  return
}

// -----

func.func @concat_dim(%a: tensor<2xf32>) {
  // expected-error @+1 {{dim 1 out of range}}
  %0 = neuron.concat %a {dim = 1} : tensor<2xf32> -> tensor<2xf32>
  return
}

// -----

func.func @concat_rank(%a: tensor<2xf32>, %b: tensor<2x1xf32>) {
  // expected-error @+1 {{inputs must match the result's rank and type}}
  %0 = neuron.concat %a, %b {dim = 0} : tensor<2xf32>, tensor<2x1xf32> -> tensor<4xf32>
  return
}

// -----

func.func @concat_other_dim(%a: tensor<2x3xf32>, %b: tensor<2x4xf32>) {
  // expected-error @+1 {{inputs differ from the result in dim 1}}
  %0 = neuron.concat %a, %b {dim = 0} : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<4x3xf32>
  return
}

// -----

func.func @concat_sum(%a: tensor<2xf32>) {
  // expected-error @+1 {{sizes along dim 0 add up to 4, result has 5}}
  %0 = neuron.concat %a, %a {dim = 0} : tensor<2xf32>, tensor<2xf32> -> tensor<5xf32>
  return
}

// -----

func.func @gather_rank(%t: tensor<f32>, %i: tensor<3xi64>) {
  // expected-error @+1 {{table must have rank >= 1}}
  %0 = neuron.gather %t[%i] : tensor<f32>, tensor<3xi64> -> tensor<3xf32>
  return
}

// -----

func.func @gather_shape(%t: tensor<8x4xf32>, %i: tensor<3xi64>) {
  // expected-error @+1 {{indices.shape ++ table.shape[1:]}}
  %0 = neuron.gather %t[%i] : tensor<8x4xf32>, tensor<3xi64> -> tensor<3x8xf32>
  return
}

// -----

func.func @gather_type(%t: tensor<8x4xf32>, %i: tensor<3xi64>) {
  // expected-error @+1 {{result element type must equal the table's}}
  %0 = neuron.gather %t[%i] : tensor<8x4xf32>, tensor<3xi64> -> tensor<3x4xbf16>
  return
}

// -----

func.func @scatter_rank(%t: tensor<f32>, %i: tensor<3xi64>, %v: tensor<3xf32>) {
  // expected-error @+1 {{input must have rank >= 1}}
  %0 = neuron.scatter %t[%i], %v : tensor<f32>, tensor<3xi64>, tensor<3xf32> -> tensor<f32>
  return
}

// -----

func.func @scatter_shape(%t: tensor<8x4xf32>, %i: tensor<3xi64>, %v: tensor<3x8xf32>) {
  // expected-error @+1 {{values shape must be indices.shape ++ input.shape[1:]}}
  %0 = neuron.scatter %t[%i], %v : tensor<8x4xf32>, tensor<3xi64>, tensor<3x8xf32> -> tensor<8x4xf32>
  return
}

// -----

func.func @scatter_type(%t: tensor<8x4xf32>, %i: tensor<3xi64>, %v: tensor<3x4xbf16>) {
  // expected-error @+1 {{values and result must have the input's type}}
  %0 = neuron.scatter %t[%i], %v : tensor<8x4xf32>, tensor<3xi64>, tensor<3x4xbf16> -> tensor<8x4xf32>
  return
}

// -----

func.func @scatter_bool(%t: tensor<8x4xi1>, %i: tensor<3xi64>, %v: tensor<3x4xi1>) {
  // expected-error @+1 {{accumulate adds numbers, not i1}}
  %0 = neuron.scatter %t[%i], %v {accumulate} : tensor<8x4xi1>, tensor<3xi64>, tensor<3x4xi1> -> tensor<8x4xi1>
  return
}

// -----

func.func @scatter_permutation_accumulates(%t: tensor<3x4xf32>, %i: tensor<3xi64>, %v: tensor<3x4xf32>) {
  // expected-error @+1 {{a permutation writes each of the input's rows once: one index per row, without accumulate}}
  %0 = neuron.scatter %t[%i], %v {accumulate, permutation} : tensor<3x4xf32>, tensor<3xi64>, tensor<3x4xf32> -> tensor<3x4xf32>
  return
}

// -----

func.func @scatter_permutation_rows(%t: tensor<8x4xf32>, %i: tensor<3xi64>, %v: tensor<3x4xf32>) {
  // expected-error @+1 {{a permutation writes each of the input's rows once: one index per row, without accumulate}}
  %0 = neuron.scatter %t[%i], %v {permutation} : tensor<8x4xf32>, tensor<3xi64>, tensor<3x4xf32> -> tensor<8x4xf32>
  return
}

// -----

func.func @rand_seed(%s: tensor<3xi32>) {
  // expected-error @+1 {{seed must be a tensor<2xi32> (the Philox key)}}
  %0 = neuron.rand %s : tensor<3xi32> -> tensor<4xf32>
  return
}

// -----

func.func @rand_stream(%s: tensor<2xi32>) {
  // expected-error @+1 {{stream must fit in 32 unsigned bits}}
  %0 = neuron.rand %s {stream = 4294967296} : tensor<2xi32> -> tensor<4xf32>
  return
}

// -----

func.func @rand_integer(%s: tensor<2xi32>) {
  // expected-error @+1 {{result #0 must be ranked tensor of}}
  %0 = neuron.rand %s : tensor<2xi32> -> tensor<4xi32>
  return
}

// -----

func.func @cumsum_shape(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{result must have the input's shape}}
  %0 = neuron.cumsum %a {dim = 1} : tensor<4x8xf32> -> tensor<4x7xf32>
  return
}

// -----

func.func @cumsum_dim(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{dim 2 is out of range for rank 2}}
  %0 = neuron.cumsum %a {dim = 2} : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @cumsum_bool(%a: tensor<4x8xi1>) {
  // expected-error @+1 {{sums numbers: cast i1 to an integer type first}}
  %0 = neuron.cumsum %a {dim = 1} : tensor<4x8xi1> -> tensor<4x8xi64>
  return
}

// -----

func.func @topk_rank(%a: tensor<f32>) {
  // expected-error @+1 {{input must have rank >= 1}}
  %v, %i = neuron.topk %a {k = 1, largest = true} : tensor<f32> -> tensor<f32>, tensor<i64>
  return
}

// -----

func.func @topk_bool(%a: tensor<4x8xi1>) {
  // expected-error @+1 {{orders numbers: cast i1 to an integer type first}}
  %v, %i = neuron.topk %a {k = 2, largest = true} : tensor<4x8xi1> -> tensor<4x2xi1>, tensor<4x2xi64>
  return
}

// -----

func.func @topk_k(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{k = 9 is outside [0, 8]}}
  %v, %i = neuron.topk %a {k = 9, largest = true} : tensor<4x8xf32> -> tensor<4x9xf32>, tensor<4x9xi64>
  return
}

// -----

func.func @topk_shape(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{results must have the input's shape with k as the last dim}}
  %v, %i = neuron.topk %a {k = 2, largest = true} : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x3xi64>
  return
}

// -----

func.func @topk_type(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{values must have the input's element type}}
  %v, %i = neuron.topk %a {k = 2, largest = true} : tensor<4x8xf32> -> tensor<4x2xbf16>, tensor<4x2xi64>
  return
}

// -----

func.func @scaled_matmul_contraction(%a: tensor<4x8xf8E4M3FN>, %b: tensor<6x3xf8E4M3FN>, %s: tensor<1xf32>) {
  // expected-error @+1 {{contraction sizes differ: 8 vs 6}}
  %0 = neuron.scaled_matmul %a, %b scales %s, %s : tensor<4x8xf8E4M3FN>, tensor<6x3xf8E4M3FN>, tensor<1xf32>, tensor<1xf32> -> tensor<4x3xbf16>
  return
}

// -----

func.func @scaled_matmul_result(%a: tensor<4x8xf8E4M3FN>, %b: tensor<8x3xf8E5M2>, %s: tensor<1xf32>) {
  // expected-error @+1 {{result must be [M, N] = [4, 3]}}
  %0 = neuron.scaled_matmul %a, %b scales %s, %s : tensor<4x8xf8E4M3FN>, tensor<8x3xf8E5M2>, tensor<1xf32>, tensor<1xf32> -> tensor<3x4xbf16>
  return
}

// -----

func.func @scaled_matmul_rank(%a: tensor<2x4x8xf8E4M3FN>, %b: tensor<2x8x3xf8E4M3FN>, %s: tensor<1xf32>) {
  // expected-error @+1 {{operands and result must be 2-d}}
  %0 = neuron.scaled_matmul %a, %b scales %s, %s : tensor<2x4x8xf8E4M3FN>, tensor<2x8x3xf8E4M3FN>, tensor<1xf32>, tensor<1xf32> -> tensor<2x4x3xbf16>
  return
}

// -----

func.func @scaled_matmul_row_scale(%a: tensor<4x8xf8E4M3FN>, %b: tensor<8x3xf8E4M3FN>, %r: tensor<3xf32>, %s: tensor<1xf32>) {
  // expected-error @+1 {{row_scale must be [4] or [1], got 'tensor<3xf32>'}}
  %0 = neuron.scaled_matmul %a, %b scales %r, %s : tensor<4x8xf8E4M3FN>, tensor<8x3xf8E4M3FN>, tensor<3xf32>, tensor<1xf32> -> tensor<4x3xbf16>
  return
}

// -----

func.func @scaled_matmul_col_scale(%a: tensor<4x8xf8E4M3FN>, %b: tensor<8x3xf8E4M3FN>, %c: tensor<4xf32>, %s: tensor<1xf32>) {
  // expected-error @+1 {{col_scale must be [3] or [1], got 'tensor<4xf32>'}}
  %0 = neuron.scaled_matmul %a, %b scales %s, %c : tensor<4x8xf8E4M3FN>, tensor<8x3xf8E4M3FN>, tensor<1xf32>, tensor<4xf32> -> tensor<4x3xbf16>
  return
}

// -----

func.func @scaled_matmul_bias(%a: tensor<4x8xf8E4M3FN>, %b: tensor<8x3xf8E4M3FN>, %s: tensor<1xf32>, %bias: tensor<1xbf16>) {
  // expected-error @+1 {{bias must be [3], got 'tensor<1xbf16>'}}
  %0 = neuron.scaled_matmul %a, %b scales %s, %s bias %bias : tensor<4x8xf8E4M3FN>, tensor<8x3xf8E4M3FN>, tensor<1xf32>, tensor<1xf32>, tensor<1xbf16> -> tensor<4x3xbf16>
  return
}

// -----

func.func @scaled_matmul_bf16(%a: tensor<4x8xbf16>, %s: tensor<1xf32>) {
  // expected-error @+1 {{operand #0 must be ranked tensor of f8E4M3FN type or f8E5M2 type values}}
  %0 = neuron.scaled_matmul %a, %a scales %s, %s : tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<1xf32>, tensor<1xf32> -> tensor<4x4xbf16>
  return
}

// -----

func.func @grouped_matmul_ends(%x: tensor<16x8xf32>, %w: tensor<3x8x4xf32>, %e0: index, %e1: index) {
  // expected-error @+1 {{needs one row end per group: 2 for 3 groups}}
  %0 = neuron.grouped_matmul %x, %w ends(%e0, %e1) : tensor<16x8xf32>, tensor<3x8x4xf32> -> tensor<16x4xf32>
  return
}

// -----

func.func @grouped_matmul_contraction(%x: tensor<16x8xf32>, %w: tensor<1x9x4xf32>, %e0: index) {
  // expected-error @+1 {{contraction sizes differ: 8 vs 9}}
  %0 = neuron.grouped_matmul %x, %w ends(%e0) : tensor<16x8xf32>, tensor<1x9x4xf32> -> tensor<16x4xf32>
  return
}

// -----

func.func @grouped_matmul_rank(%x: tensor<16x8xf32>, %w: tensor<8x4xf32>, %e0: index) {
  // expected-error @+1 {{takes [M, K] x [G, K, N] -> [M, N]}}
  %0 = neuron.grouped_matmul %x, %w ends(%e0) : tensor<16x8xf32>, tensor<8x4xf32> -> tensor<16x4xf32>
  return
}

// -----

func.func @scaled_matmul_mx_k(%a: tensor<4x48xf8E4M3FN>, %b: tensor<48x3xf8E4M3FN>, %r: tensor<4x1xui8>, %c: tensor<3x1xui8>) {
  // expected-error @+1 {{MX block scales need K a multiple of 32, not 48}}
  %0 = neuron.scaled_matmul %a, %b scales %r, %c : tensor<4x48xf8E4M3FN>, tensor<48x3xf8E4M3FN>, tensor<4x1xui8>, tensor<3x1xui8> -> tensor<4x3xbf16>
  return
}

// -----

func.func @scaled_matmul_mx_shape(%a: tensor<4x64xf8E4M3FN>, %b: tensor<64x3xf8E4M3FN>, %r: tensor<4x2xui8>, %c: tensor<2x3xui8>) {
  // expected-error @+1 {{col_scale must be ui8 [3, 2] (MX block scales), got 'tensor<2x3xui8>'}}
  %0 = neuron.scaled_matmul %a, %b scales %r, %c : tensor<4x64xf8E4M3FN>, tensor<64x3xf8E4M3FN>, tensor<4x2xui8>, tensor<2x3xui8> -> tensor<4x3xbf16>
  return
}

// -----

func.func @scaled_matmul_mx_mixed(%a: tensor<4x64xf8E4M3FN>, %b: tensor<64x3xf8E4M3FN>, %r: tensor<4x2xui8>, %c: tensor<3xf32>) {
  // expected-error @+1 {{col_scale must be ui8 [3, 2] (MX block scales), got 'tensor<3xf32>'}}
  %0 = neuron.scaled_matmul %a, %b scales %r, %c : tensor<4x64xf8E4M3FN>, tensor<64x3xf8E4M3FN>, tensor<4x2xui8>, tensor<3xf32> -> tensor<4x3xbf16>
  return
}

// -----

func.func @scaled_matmul_mx_bias(%a: tensor<4x64xf8E4M3FN>, %b: tensor<64x3xf8E4M3FN>, %r: tensor<4x2xui8>, %c: tensor<3x2xui8>, %bias: tensor<3xbf16>) {
  // expected-error @+1 {{takes no bias with MX block scales}}
  %0 = neuron.scaled_matmul %a, %b scales %r, %c bias %bias : tensor<4x64xf8E4M3FN>, tensor<64x3xf8E4M3FN>, tensor<4x2xui8>, tensor<3x2xui8>, tensor<3xbf16> -> tensor<4x3xbf16>
  return
}

// -----

func.func @rotary_table_type(%x: tensor<4x8xbf16>, %c: tensor<4x8xf32>) {
  // expected-error @+1 {{cos and sin must have x's type}}
  %0 = neuron.rotary %x, %c, %c : tensor<4x8xbf16>, tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xbf16>
  return
}

// -----

func.func @rotary_odd(%x: tensor<4x7xf32>) {
  // expected-error @+1 {{the last dim must be of an even static size}}
  %0 = neuron.rotary %x, %x, %x : tensor<4x7xf32>, tensor<4x7xf32>, tensor<4x7xf32> -> tensor<4x7xf32>
  return
}

// -----

func.func @rotary_result(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{result must have x's type}}
  %0 = neuron.rotary %x, %x, %x : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xbf16>
  return
}

// -----

func.func @rotary_ints(%x: tensor<4x8xi32>) {
  // expected-error @+1 {{rotates floats}}
  %0 = neuron.rotary %x, %x, %x : tensor<4x8xi32>, tensor<4x8xi32>, tensor<4x8xi32> -> tensor<4x8xi32>
  return
}

// -----

func.func @conv2d_rank(%x: tensor<8x4x4xf32>, %w: tensor<3x8x3x3xf32>) {
  // expected-error @+1 {{takes [N, C, H, W] x [O, C, kh, kw] -> [N, O, Ho, Wo]}}
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<8x4x4xf32>, tensor<3x8x3x3xf32> -> tensor<1x3x4x4xf32>
  return
}

// -----

func.func @conv2d_dynamic(%x: tensor<?x8x4x4xf32>, %w: tensor<3x8x3x3xf32>) {
  // expected-error @+1 {{needs static shapes}}
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<?x8x4x4xf32>, tensor<3x8x3x3xf32> -> tensor<1x3x4x4xf32>
  return
}

// -----

func.func @conv2d_types(%x: tensor<1x8x4x4xbf16>, %w: tensor<3x8x3x3xf32>) {
  // expected-error @+1 {{input, weight and result must share an element type}}
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<1x8x4x4xbf16>, tensor<3x8x3x3xf32> -> tensor<1x3x4x4xf32>
  return
}

// -----

func.func @conv2d_params(%x: tensor<1x8x4x4xf32>, %w: tensor<3x8x3x3xf32>) {
  // expected-error @+1 {{stride, padding and dilation take (height, width)}}
  %0 = neuron.conv2d %x, %w stride [1] padding [1, 1] dilation [1, 1] : tensor<1x8x4x4xf32>, tensor<3x8x3x3xf32> -> tensor<1x3x4x4xf32>
  return
}

// -----

func.func @conv2d_channels(%x: tensor<1x8x4x4xf32>, %w: tensor<3x7x3x3xf32>) {
  // expected-error @+1 {{input channels differ: 8 vs the weight's 7}}
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<1x8x4x4xf32>, tensor<3x7x3x3xf32> -> tensor<1x3x4x4xf32>
  return
}

// -----

func.func @conv2d_stride(%x: tensor<1x8x4x4xf32>, %w: tensor<3x8x3x3xf32>) {
  // expected-error @+1 {{needs stride and dilation >= 1, padding >= 0}}
  %0 = neuron.conv2d %x, %w stride [0, 1] padding [1, 1] dilation [1, 1] : tensor<1x8x4x4xf32>, tensor<3x8x3x3xf32> -> tensor<1x3x4x4xf32>
  return
}

// -----

func.func @conv2d_kernel(%x: tensor<1x8x4x4xf32>, %w: tensor<3x8x3x3xf32>) {
  // expected-error @+1 {{kernel does not fit the padded input}}
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [0, 0] dilation [2, 2] : tensor<1x8x4x4xf32>, tensor<3x8x3x3xf32> -> tensor<1x3x1x1xf32>
  return
}

// -----

func.func @conv2d_result(%x: tensor<1x8x4x4xf32>, %w: tensor<3x8x3x3xf32>) {
  // expected-error @+1 {{result must be [1, 3, 2, 4]}}
  %0 = neuron.conv2d %x, %w stride [2, 1] padding [1, 1] dilation [1, 1] : tensor<1x8x4x4xf32>, tensor<3x8x3x3xf32> -> tensor<1x3x4x4xf32>
  return
}

// -----

func.func @conv2d_bias(%x: tensor<1x8x4x4xf32>, %w: tensor<3x8x3x3xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{bias must be [3] of the input's element type}}
  %0 = neuron.conv2d %x, %w bias %b stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<1x8x4x4xf32>, tensor<3x8x3x3xf32>, tensor<4xf32> -> tensor<1x3x4x4xf32>
  return
}

// -----

func.func @pool2d_rank(%x: tensor<8x8xf32>) {
  // expected-error @+1 {{takes [..., H, W] -> [..., Ho, Wo]}}
  %0 = neuron.pool2d max %x kernel [2, 2] stride [2, 2] padding [0, 0] dilation [1, 1] : tensor<8x8xf32> -> tensor<4x4xf32>
  return
}

// -----

func.func @pool2d_dynamic(%x: tensor<?x8x8xf32>) {
  // expected-error @+1 {{needs static shapes}}
  %0 = neuron.pool2d max %x kernel [2, 2] stride [2, 2] padding [0, 0] dilation [1, 1] : tensor<?x8x8xf32> -> tensor<?x4x4xf32>
  return
}

// -----

func.func @pool2d_type(%x: tensor<1x8x8xf32>) {
  // expected-error @+1 {{result element type must equal the input's}}
  %0 = neuron.pool2d max %x kernel [2, 2] stride [2, 2] padding [0, 0] dilation [1, 1] : tensor<1x8x8xf32> -> tensor<1x4x4xbf16>
  return
}

// -----

func.func @pool2d_fn(%x: tensor<1x8x8xf32>) {
  // expected-error @+1 {{takes max or sum windows}}
  %0 = neuron.pool2d prod %x kernel [2, 2] stride [2, 2] padding [0, 0] dilation [1, 1] : tensor<1x8x8xf32> -> tensor<1x4x4xf32>
  return
}

// -----

func.func @pool2d_params(%x: tensor<1x8x8xf32>) {
  // expected-error @+1 {{kernel, stride, padding and dilation take (height, width)}}
  %0 = neuron.pool2d max %x kernel [2] stride [2, 2] padding [0, 0] dilation [1, 1] : tensor<1x8x8xf32> -> tensor<1x4x4xf32>
  return
}

// -----

func.func @pool2d_stride(%x: tensor<1x8x8xf32>) {
  // expected-error @+1 {{needs kernel, stride and dilation >= 1, padding >= 0}}
  %0 = neuron.pool2d max %x kernel [2, 2] stride [0, 2] padding [0, 0] dilation [1, 1] : tensor<1x8x8xf32> -> tensor<1x4x4xf32>
  return
}

// -----

func.func @pool2d_window(%x: tensor<1x2x8xf32>) {
  // expected-error @+1 {{window does not fit the padded input}}
  %0 = neuron.pool2d max %x kernel [3, 2] stride [1, 2] padding [0, 0] dilation [1, 1] : tensor<1x2x8xf32> -> tensor<1x1x4xf32>
  return
}

// -----

func.func @pool2d_result(%x: tensor<1x8x8xf32>) {
  // expected-error @+1 {{result shape must be the windows'}}
  %0 = neuron.pool2d max %x kernel [2, 2] stride [2, 2] padding [0, 0] dilation [1, 1] : tensor<1x8x8xf32> -> tensor<1x4x5xf32>
  return
}

// -----

func.func @group_norm_rank(%x: tensor<8xf32>) {
  // expected-error @+1 {{takes a static [N, C, ...] input}}
  %0:3 = neuron.group_norm %x groups 2 eps 1.0e-5 : tensor<8xf32> -> tensor<8xf32>, tensor<1x2xf32>, tensor<1x2xf32>
  return
}

// -----

func.func @group_norm_dynamic(%x: tensor<?x8x4xf32>) {
  // expected-error @+1 {{takes a static [N, C, ...] input}}
  %0:3 = neuron.group_norm %x groups 2 eps 1.0e-5 : tensor<?x8x4xf32> -> tensor<?x8x4xf32>, tensor<?x2xf32>, tensor<?x2xf32>
  return
}

// -----

func.func @group_norm_groups(%x: tensor<1x8x4xf32>) {
  // expected-error @+1 {{needs groups dividing the 8 channels}}
  %0:3 = neuron.group_norm %x groups 3 eps 1.0e-5 : tensor<1x8x4xf32> -> tensor<1x8x4xf32>, tensor<1x3xf32>, tensor<1x3xf32>
  return
}

// -----

func.func @group_norm_wide_groups(%x: tensor<1x256x4xf32>) {
  // expected-error @+1 {{takes at most 128 channels per group}}
  %0:3 = neuron.group_norm %x groups 1 eps 1.0e-5 : tensor<1x256x4xf32> -> tensor<1x256x4xf32>, tensor<1x1xf32>, tensor<1x1xf32>
  return
}

// -----

func.func @group_norm_type(%x: tensor<1x8x4xf32>) {
  // expected-error @+1 {{result type must equal the input's}}
  %0:3 = neuron.group_norm %x groups 2 eps 1.0e-5 : tensor<1x8x4xf32> -> tensor<1x8x4xbf16>, tensor<1x2xf32>, tensor<1x2xf32>
  return
}

// -----

func.func @group_norm_weight(%x: tensor<1x8x4xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{weight and bias are [C]}}
  %0:3 = neuron.group_norm %x weight %w groups 2 eps 1.0e-5 : tensor<1x8x4xf32>, tensor<4xf32> -> tensor<1x8x4xf32>, tensor<1x2xf32>, tensor<1x2xf32>
  return
}

// -----

func.func @group_norm_stats(%x: tensor<1x8x4xf32>) {
  // expected-error @+1 {{mean and rstd are [N, groups]}}
  %0:3 = neuron.group_norm %x groups 2 eps 1.0e-5 : tensor<1x8x4xf32> -> tensor<1x8x4xf32>, tensor<2xf32>, tensor<1x2xf32>
  return
}


// -----

func.func @channel_norm_rank(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{takes a static [N, C, ...] input of rank 3 or more}}
  %0:3 = neuron.channel_norm %x eps 1.0e-5 : tensor<2x8xf32> -> tensor<2x8xf32>, tensor<2x1xf32>, tensor<2x1xf32>
  return
}

// -----

func.func @channel_norm_dynamic(%x: tensor<?x8x4xf32>) {
  // expected-error @+1 {{takes a static [N, C, ...] input of rank 3 or more}}
  %0:3 = neuron.channel_norm %x eps 1.0e-5 : tensor<?x8x4xf32> -> tensor<?x8x4xf32>, tensor<?x1x4xf32>, tensor<?x1x4xf32>
  return
}

// -----

func.func @channel_norm_wide(%x: tensor<1x1025x4xf32>) {
  // expected-error @+1 {{takes 1 to 1024 channels, not 1025}}
  %0:3 = neuron.channel_norm %x eps 1.0e-5 : tensor<1x1025x4xf32> -> tensor<1x1025x4xf32>, tensor<1x1x4xf32>, tensor<1x1x4xf32>
  return
}

// -----

func.func @channel_norm_type(%x: tensor<1x8x4xf32>) {
  // expected-error @+1 {{result type must equal the input's}}
  %0:3 = neuron.channel_norm %x eps 1.0e-5 : tensor<1x8x4xf32> -> tensor<1x8x4xbf16>, tensor<1x1x4xf32>, tensor<1x1x4xf32>
  return
}

// -----

func.func @channel_norm_weight(%x: tensor<1x8x4xbf16>, %w: tensor<8xf32>) {
  // expected-error @+1 {{weight and bias are [C] of the input's type}}
  %0:3 = neuron.channel_norm %x weight %w eps 1.0e-5 : tensor<1x8x4xbf16>, tensor<8xf32> -> tensor<1x8x4xbf16>, tensor<1x1x4xf32>, tensor<1x1x4xf32>
  return
}

// -----

func.func @channel_norm_stats(%x: tensor<1x8x4xf32>) {
  // expected-error @+1 {{mean and rstd are [N, 1, ...]}}
  %0:3 = neuron.channel_norm %x eps 1.0e-5 : tensor<1x8x4xf32> -> tensor<1x8x4xf32>, tensor<1x4xf32>, tensor<1x1x4xf32>
  return
}

// -----

func.func @conv2d_depthwise_weight(%x: tensor<1x8x6x6xf32>, %w: tensor<8x2x3x3xf32>) {
  // expected-error @+1 {{depthwise takes [C, 1, kh, kw] weights for 8 channels}}
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] {depthwise} : tensor<1x8x6x6xf32>, tensor<8x2x3x3xf32> -> tensor<1x8x6x6xf32>
  return
}

// -----

func.func @conv2d_scale(%x: tensor<1x8x6x6xf32>, %w: tensor<4x8x3x3xf32>, %b: tensor<4xf32>, %s: tensor<8xf32>) {
  // expected-error @+1 {{scale must be [4], with a bias}}
  %0 = neuron.conv2d %x, %w bias %b scale %s stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<1x8x6x6xf32>, tensor<4x8x3x3xf32>, tensor<4xf32>, tensor<8xf32> -> tensor<1x4x6x6xf32>
  return
}
