// RUN: neuron-opt %s --canonicalize | FileCheck %s

// Identity layout ops and casts disappear; reshape chains collapse; a
// broadcast of a splat is a splat.

// The permuted sizes of @sink_transpose_dynamic's multiply (printed first).
// CHECK: #[[DYNDIMS:.*]] = affine_map<()[s0] -> (s0, 4, 8)>

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

// A transpose of a transpose is one transpose of the first's input, none
// where the permutations cancel (the permutes around a channels-last
// LayerNorm of a channels-first tensor).
// CHECK-LABEL: func.func @transpose_of_transpose
// CHECK: %[[T:.*]] = neuron.transpose %arg0, [2, 0, 1] : tensor<2x3x4xf32> -> tensor<4x2x3xf32>
// CHECK-NOT: neuron.transpose
// CHECK: return %arg0, %[[T]]
func.func @transpose_of_transpose(%a: tensor<2x3x4xf32>) -> (tensor<2x3x4xf32>, tensor<4x2x3xf32>) {
  %t = neuron.transpose %a, [0, 2, 1] : tensor<2x3x4xf32> -> tensor<2x4x3xf32>
  %back = neuron.transpose %t, [0, 2, 1] : tensor<2x4x3xf32> -> tensor<2x3x4xf32>
  %other = neuron.transpose %t, [1, 0, 2] : tensor<2x4x3xf32> -> tensor<4x2x3xf32>
  return %back, %other : tensor<2x3x4xf32>, tensor<4x2x3xf32>
}

// A transpose sinks below elementwise ops whose other operands are splats
// or the same transpose, so it reaches the matmul that reads it through a
// strided window instead of being copied for the elementwise op.
// CHECK-LABEL: func.func @sink_transpose
// CHECK: %[[S:.*]] = neuron.constant dense<5.000000e-01> : tensor<4x8xf32>
// CHECK: %[[M:.*]] = neuron.binary mul %arg0, %[[S]] : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
// CHECK: %[[E:.*]] = neuron.unary exp %[[M]] : tensor<4x8xf32> -> tensor<4x8xf32>
// CHECK: %[[T:.*]] = neuron.transpose %[[E]], [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
// CHECK: neuron.matmul %[[T]], %arg1
func.func @sink_transpose(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>) -> tensor<8x2xf32> {
  %t = neuron.transpose %x, [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  %c = neuron.constant dense<0.5> : tensor<8x4xf32>
  %m = neuron.binary mul %t, %c : tensor<8x4xf32>, tensor<8x4xf32> -> tensor<8x4xf32>
  %e = neuron.unary exp %m : tensor<8x4xf32> -> tensor<8x4xf32>
  %r = neuron.matmul %e, %w : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
  return %r : tensor<8x2xf32>
}

// Over sizes known only at run time (issue #16): a splat is a broadcast
// constant, broadcast to the permuted sizes; the importer's sizes of the
// result (neuron.dims) are permuted with it. The transposes there and back
// then cancel (a decoder layer's heads move no data for elementwise work).
// CHECK-LABEL: func.func @sink_transpose_dynamic
// CHECK: %[[C:.*]] = neuron.constant dense<2.000000e+00> : tensor<1x1x1xf32>
// CHECK: %[[B:.*]] = neuron.broadcast %[[C]] : tensor<1x1x1xf32> -> tensor<?x4x8xf32>
// CHECK: %[[M:.*]] = neuron.binary mul %arg0, %[[B]] {neuron.dims = #[[DYNDIMS]]} : tensor<?x4x8xf32>, tensor<?x4x8xf32> -> tensor<?x4x8xf32>
// CHECK-NOT: neuron.transpose
// CHECK: return %[[M]]
func.func @sink_transpose_dynamic(%x: tensor<?x4x8xf32>) -> tensor<?x4x8xf32> {
  %t = neuron.transpose %x, [1, 0, 2] : tensor<?x4x8xf32> -> tensor<4x?x8xf32>
  %c = neuron.constant dense<2.0> : tensor<1x1x1xf32>
  %b = neuron.broadcast %c : tensor<1x1x1xf32> -> tensor<4x?x8xf32>
  %m = neuron.binary mul %t, %b {neuron.dims = affine_map<()[s0] -> (4, s0, 8)>} : tensor<4x?x8xf32>, tensor<4x?x8xf32> -> tensor<4x?x8xf32>
  %r = neuron.transpose %m, [1, 0, 2] : tensor<4x?x8xf32> -> tensor<?x4x8xf32>
  return %r : tensor<?x4x8xf32>
}

// Different permutations, or an operand that is neither a transpose nor a
// splat, keep the op where it is.
// CHECK-LABEL: func.func @keep_transpose
// CHECK: neuron.transpose %arg0
// CHECK-NEXT: neuron.binary add
func.func @keep_transpose(%x: tensor<4x8xf32>, %y: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %t = neuron.transpose %x, [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  %a = neuron.binary add %t, %y : tensor<8x4xf32>, tensor<8x4xf32> -> tensor<8x4xf32>
  return %a : tensor<8x4xf32>
}

// A splat broadcast to dynamic sizes stays a broadcast: a constant has
// static sizes.
// CHECK-LABEL: func.func @dynamic_splat
// CHECK: %[[K:.*]] = neuron.constant dense<2.000000e+00> : tensor<1x4xf32>
// CHECK: neuron.broadcast %[[K]] : tensor<1x4xf32> -> tensor<?x4xf32>
func.func @dynamic_splat() -> tensor<?x4xf32> {
  %k = neuron.constant dense<2.0> : tensor<1x4xf32>
  %b = neuron.broadcast %k : tensor<1x4xf32> -> tensor<?x4xf32>
  return %b : tensor<?x4xf32>
}

// Slices of a tensor only slices read move above the ops that compute it
// (the top-2 sum of an MoE layer: [4096, 1024] -> [2048, 2, 1024], summed
// over the 2): a reshape that splits a dim takes every second row, a
// broadcast slices its input's non-expanded dims, elementwise ops slice
// their operands; the whole product is never computed.
// CHECK-LABEL: func.func @hoist_slices
// CHECK-NOT: tensor<8x2x3xf32>
// CHECK-DAG: neuron.slice %arg0 {offsets = array<i64: 0, 0>, strides = array<i64: 2, 1>} : tensor<8x3xbf16> -> tensor<4x3xbf16>
// CHECK-DAG: neuron.slice %arg0 {offsets = array<i64: 1, 0>, strides = array<i64: 2, 1>} : tensor<8x3xbf16> -> tensor<4x3xbf16>
// CHECK-DAG: neuron.slice %arg1 {offsets = array<i64: 1, 0>, strides = array<i64: 2, 1>} : tensor<8x1xf32> -> tensor<4x1xf32>
// CHECK: neuron.binary add {{.*}} : tensor<4x3xf32>, tensor<4x3xf32> -> tensor<4x3xf32>
func.func @hoist_slices(%x: tensor<8x3xbf16>, %w: tensor<8x1xf32>) -> tensor<4x3xf32> {
  %c = neuron.cast %x : tensor<8x3xbf16> -> tensor<8x3xf32>
  %b = neuron.broadcast %w : tensor<8x1xf32> -> tensor<8x3xf32>
  %m = neuron.binary mul %c, %b : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %r = neuron.reshape %m : tensor<8x3xf32> -> tensor<4x2x3xf32>
  %s0 = neuron.slice %r {offsets = array<i64: 0, 0, 0>, strides = array<i64: 1, 1, 1>} : tensor<4x2x3xf32> -> tensor<4x1x3xf32>
  %s1 = neuron.slice %r {offsets = array<i64: 0, 1, 0>, strides = array<i64: 1, 1, 1>} : tensor<4x2x3xf32> -> tensor<4x1x3xf32>
  %a0 = neuron.reshape %s0 : tensor<4x1x3xf32> -> tensor<4x3xf32>
  %a1 = neuron.reshape %s1 : tensor<4x1x3xf32> -> tensor<4x3xf32>
  %sum = neuron.binary add %a0, %a1 : tensor<4x3xf32>, tensor<4x3xf32> -> tensor<4x3xf32>
  return %sum : tensor<4x3xf32>
}

// A producer with another use keeps its slices: moving them would compute
// the sliced elements twice.
// CHECK-LABEL: func.func @keep_slices
// CHECK: %[[M:.*]] = neuron.binary mul %arg0, %arg0
// CHECK: neuron.slice %[[M]]
func.func @keep_slices(%x: tensor<8x3xf32>) -> (tensor<4x3xf32>, tensor<8x3xf32>) {
  %m = neuron.binary mul %x, %x : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %s = neuron.slice %m {offsets = array<i64: 0, 0>, strides = array<i64: 2, 1>} : tensor<8x3xf32> -> tensor<4x3xf32>
  return %s, %m : tensor<4x3xf32>, tensor<8x3xf32>
}

// A slice of a splat is a smaller splat.
// CHECK-LABEL: func.func @slice_splat
// CHECK: neuron.constant dense<2.000000e+00> : tensor<4x3xf32>
// CHECK-NOT: neuron.slice
func.func @slice_splat() -> tensor<4x3xf32> {
  %k = neuron.constant dense<2.0> : tensor<8x3xf32>
  %s = neuron.slice %k {offsets = array<i64: 1, 0>, strides = array<i64: 2, 1>} : tensor<8x3xf32> -> tensor<4x3xf32>
  return %s : tensor<4x3xf32>
}

// A slice stays below an op that uses one value twice (a square): moving it
// up would double the slices at each such op (2^40 here).
// CHECK-LABEL: func.func @keep_slice_of_squares
// CHECK-COUNT-40: neuron.binary mul
// CHECK-NEXT: neuron.slice
// CHECK-NOT: neuron.slice
func.func @keep_slice_of_squares(%x: tensor<8x3xf32>) -> tensor<4x3xf32> {
  %c = neuron.cast %x : tensor<8x3xf32> -> tensor<8x3xf32>
  %a1 = neuron.binary mul %c, %c : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a2 = neuron.binary mul %a1, %a1 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a3 = neuron.binary mul %a2, %a2 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a4 = neuron.binary mul %a3, %a3 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a5 = neuron.binary mul %a4, %a4 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a6 = neuron.binary mul %a5, %a5 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a7 = neuron.binary mul %a6, %a6 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a8 = neuron.binary mul %a7, %a7 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a9 = neuron.binary mul %a8, %a8 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a10 = neuron.binary mul %a9, %a9 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a11 = neuron.binary mul %a10, %a10 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a12 = neuron.binary mul %a11, %a11 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a13 = neuron.binary mul %a12, %a12 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a14 = neuron.binary mul %a13, %a13 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a15 = neuron.binary mul %a14, %a14 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a16 = neuron.binary mul %a15, %a15 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a17 = neuron.binary mul %a16, %a16 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a18 = neuron.binary mul %a17, %a17 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a19 = neuron.binary mul %a18, %a18 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a20 = neuron.binary mul %a19, %a19 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a21 = neuron.binary mul %a20, %a20 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a22 = neuron.binary mul %a21, %a21 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a23 = neuron.binary mul %a22, %a22 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a24 = neuron.binary mul %a23, %a23 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a25 = neuron.binary mul %a24, %a24 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a26 = neuron.binary mul %a25, %a25 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a27 = neuron.binary mul %a26, %a26 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a28 = neuron.binary mul %a27, %a27 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a29 = neuron.binary mul %a28, %a28 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a30 = neuron.binary mul %a29, %a29 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a31 = neuron.binary mul %a30, %a30 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a32 = neuron.binary mul %a31, %a31 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a33 = neuron.binary mul %a32, %a32 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a34 = neuron.binary mul %a33, %a33 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a35 = neuron.binary mul %a34, %a34 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a36 = neuron.binary mul %a35, %a35 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a37 = neuron.binary mul %a36, %a36 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a38 = neuron.binary mul %a37, %a37 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a39 = neuron.binary mul %a38, %a38 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %a40 = neuron.binary mul %a39, %a39 : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<8x3xf32>
  %s = neuron.slice %a40 {offsets = array<i64: 0, 0>, strides = array<i64: 2, 1>} : tensor<8x3xf32> -> tensor<4x3xf32>
  return %s : tensor<4x3xf32>
}

// A broadcast along interior dims whose innermost expanded dims run to the
// end (BatchNorm's [C, 1, 1] over [N, C, H, W]) splits into a broadcast to
// the values of each row and one along the rows, which a fusion group holds
// as a [rows, 1] column. One that already expands only a suffix or only a
// prefix stays, as does one whose last dim is not expanded.
// CHECK-LABEL: func.func @split_interior_broadcast
// CHECK: %[[ROWS:.*]] = neuron.broadcast %arg0 : tensor<16x1x1xf32> -> tensor<2x16x1x1xf32>
// CHECK: %[[FULL:.*]] = neuron.broadcast %[[ROWS]] : tensor<2x16x1x1xf32> -> tensor<2x16x5x7xf32>
// CHECK: %[[ROWS3:.*]] = neuron.broadcast %arg1 : tensor<1x16x1xf32> -> tensor<3x16x1xf32>
// CHECK: neuron.broadcast %[[ROWS3]] : tensor<3x16x1xf32> -> tensor<3x16x9xf32>
// CHECK: neuron.broadcast %arg0 : tensor<16x1x1xf32> -> tensor<16x5x7xf32>
// CHECK: neuron.broadcast %arg2 : tensor<16xf32> -> tensor<4x16xf32>
// CHECK: neuron.broadcast %arg3 : tensor<2x1x7xf32> -> tensor<2x5x7xf32>
// CHECK-NOT: neuron.broadcast
func.func @split_interior_broadcast(%w: tensor<16x1x1xf32>, %v: tensor<1x16x1xf32>,
                                    %r: tensor<16xf32>, %m: tensor<2x1x7xf32>)
    -> (tensor<2x16x5x7xf32>, tensor<3x16x9xf32>, tensor<16x5x7xf32>,
        tensor<4x16xf32>, tensor<2x5x7xf32>) {
  %0 = neuron.broadcast %w : tensor<16x1x1xf32> -> tensor<2x16x5x7xf32>
  %1 = neuron.broadcast %v : tensor<1x16x1xf32> -> tensor<3x16x9xf32>
  %2 = neuron.broadcast %w : tensor<16x1x1xf32> -> tensor<16x5x7xf32>
  %3 = neuron.broadcast %r : tensor<16xf32> -> tensor<4x16xf32>
  %4 = neuron.broadcast %m : tensor<2x1x7xf32> -> tensor<2x5x7xf32>
  return %0, %1, %2, %3, %4 : tensor<2x16x5x7xf32>, tensor<3x16x9xf32>, tensor<16x5x7xf32>, tensor<4x16xf32>, tensor<2x5x7xf32>
}

// BatchNorm in eval as PyTorch decomposes it, ((x - mean) * invstd) * weight
// + bias per channel: x * S + T, S and T computed on the [4, 1] values (two
// passes over x's elements instead of four). A chain of two stays; a link
// whose value is also used elsewhere ends the chain.
// CHECK-LABEL: func.func @affine_chain
// CHECK-DAG: %[[S:.*]] = neuron.binary mul %arg2, %arg3 : tensor<4x1xf32>
// CHECK-DAG: %[[N:.*]] = neuron.unary neg %arg1 : tensor<4x1xf32>
// CHECK: neuron.binary mul %arg0, %{{.*}} : tensor<4x16xf32>
// CHECK: neuron.binary add %{{.*}}, %{{.*}} : tensor<4x16xf32>
// CHECK-NOT: neuron.binary sub {{.*}} : tensor<4x16xf32>
// CHECK: return
func.func @affine_chain(%x: tensor<4x16xf32>, %m: tensor<4x1xf32>, %s: tensor<4x1xf32>,
                        %w: tensor<4x1xf32>, %b: tensor<4x1xf32>) -> tensor<4x16xf32> {
  %bm = neuron.broadcast %m : tensor<4x1xf32> -> tensor<4x16xf32>
  %bs = neuron.broadcast %s : tensor<4x1xf32> -> tensor<4x16xf32>
  %bw = neuron.broadcast %w : tensor<4x1xf32> -> tensor<4x16xf32>
  %bb = neuron.broadcast %b : tensor<4x1xf32> -> tensor<4x16xf32>
  %0 = neuron.binary sub %x, %bm : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  %1 = neuron.binary mul %0, %bs : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  %2 = neuron.binary mul %1, %bw : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  %3 = neuron.binary add %2, %bb : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  return %3 : tensor<4x16xf32>
}

// CHECK-LABEL: func.func @affine_chain_stays
// CHECK: neuron.binary sub %arg0
// CHECK: neuron.binary mul
// CHECK: neuron.binary sub %arg0
// CHECK: neuron.binary mul
// CHECK: neuron.binary add
func.func @affine_chain_stays(%x: tensor<4x16xf32>, %m: tensor<4x1xf32>, %s: tensor<4x1xf32>)
    -> (tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>) {
  %bm = neuron.broadcast %m : tensor<4x1xf32> -> tensor<4x16xf32>
  %bs = neuron.broadcast %s : tensor<4x1xf32> -> tensor<4x16xf32>
  %0 = neuron.binary sub %x, %bm : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  %1 = neuron.binary mul %0, %bs : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  %2 = neuron.binary sub %x, %bs : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  %3 = neuron.binary mul %2, %bm : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  %4 = neuron.binary add %3, %bs : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x16xf32>
  return %1, %2, %4 : tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>
}

// A reduction over dims of size 1 and a transpose that moves only dims of
// size 1 are reshapes (gather's gradient sums its one-hot over a size-1
// index dim).
// CHECK-LABEL: func.func @singletons
func.func @singletons(%a: tensor<4x1x8xf32>, %b: tensor<4x8x1x1xf32>) -> (tensor<4x8x1xf32>, tensor<4x8xf32>, tensor<4x2xf32>) {
  // CHECK-NOT: neuron.transpose
  // CHECK-NOT: neuron.reduce
  // CHECK: %[[T:.*]] = neuron.reshape %arg0 : tensor<4x1x8xf32> -> tensor<4x8x1xf32>
  // CHECK: %[[R:.*]] = neuron.reshape %arg1 : tensor<4x8x1x1xf32> -> tensor<4x8xf32>
  %t = neuron.transpose %a, [0, 2, 1] : tensor<4x1x8xf32> -> tensor<4x8x1xf32>
  %r = neuron.reduce sum %b {count = 2 : i64} : tensor<4x8x1x1xf32> -> tensor<4x8xf32>
  // Transposes that reorder dims of more than one element, and reductions over
  // them, stay.
  // CHECK: neuron.transpose %arg0, [2, 1, 0]
  // CHECK: neuron.reduce max
  %u = neuron.transpose %a, [2, 1, 0] : tensor<4x1x8xf32> -> tensor<8x1x4xf32>
  %m = neuron.reduce max %u {count = 2 : i64} : tensor<8x1x4xf32> -> tensor<8xf32>
  %s = neuron.reshape %m : tensor<8xf32> -> tensor<4x2xf32>
  // CHECK: return %[[T]], %[[R]]
  return %t, %r, %s : tensor<4x8x1xf32>, tensor<4x8xf32>, tensor<4x2xf32>
}
