// RUN: neuron-opt %s --neuron-fuse-elementwise --split-input-file | FileCheck %s
// RUN: neuron-opt %s --neuron-fuse-elementwise=row-bytes=64 --split-input-file | FileCheck %s --check-prefix=NARROW
// RUN: neuron-opt %s --neuron-fuse-elementwise=group-bytes=400 --split-input-file | FileCheck %s --check-prefix=GROUP

// Softmax is one fusion: the reductions, the broadcasts of their results
// and the elementwise ops between them; only x comes in, only y goes out.
// CHECK-LABEL: func.func @softmax
// CHECK: %[[F:.*]] = neuron.fusion(%arg0) : (tensor<64x32xf32>) -> tensor<64x32xf32> {
// CHECK: neuron.reduce max
// CHECK: neuron.broadcast
// CHECK: neuron.binary sub
// CHECK: neuron.unary exp
// CHECK: neuron.reduce sum
// CHECK: neuron.binary div
// CHECK: neuron.yield
// CHECK: return %[[F]]
// With rows wider than row-bytes, reductions stay apart; the elementwise
// ops between them still form a flat group.
// NARROW-LABEL: func.func @softmax
// NARROW: neuron.reduce max %arg0
// NARROW: neuron.fusion
// NARROW: neuron.binary sub
// NARROW-NEXT: neuron.unary exp
// NARROW-NEXT: neuron.yield
// NARROW: neuron.reduce sum
// When the rows of all its values exceed group-bytes (x, the difference,
// the exponentials and the quotient: four 128-byte rows and two row sums),
// the group stops growing: the division is left out.
// GROUP-LABEL: func.func @softmax
// GROUP: %[[F:.*]]:2 = neuron.fusion(%arg0)
// GROUP: neuron.reduce max
// GROUP: neuron.reduce sum
// GROUP: neuron.yield
// GROUP: neuron.binary div %[[F]]#0
func.func @softmax(%x: tensor<64x32xf32>) -> tensor<64x32xf32> {
  %m = neuron.reduce max %x {count = 1} : tensor<64x32xf32> -> tensor<64xf32>
  %r = neuron.reshape %m : tensor<64xf32> -> tensor<64x1xf32>
  %b = neuron.broadcast %r : tensor<64x1xf32> -> tensor<64x32xf32>
  %d = neuron.binary sub %x, %b : tensor<64x32xf32>, tensor<64x32xf32> -> tensor<64x32xf32>
  %e = neuron.unary exp %d : tensor<64x32xf32> -> tensor<64x32xf32>
  %s = neuron.reduce sum %e {count = 1} : tensor<64x32xf32> -> tensor<64xf32>
  %r2 = neuron.reshape %s : tensor<64xf32> -> tensor<64x1xf32>
  %b2 = neuron.broadcast %r2 : tensor<64x1xf32> -> tensor<64x32xf32>
  %y = neuron.binary div %e, %b2 : tensor<64x32xf32>, tensor<64x32xf32> -> tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}

// -----

// An elementwise chain is one flat group; a splat constant is cloned into
// the body (it rides along as an immediate) and a value used after the
// group is one of its results.
// CHECK-LABEL: func.func @chain
// CHECK: %[[F:.*]]:2 = neuron.fusion(%arg0, %arg1) : (tensor<8x8xbf16>, tensor<8x8xbf16>) -> (tensor<8x8xbf16>, tensor<8x8xbf16>) {
// CHECK: neuron.constant dense<5.000000e-01>
// CHECK: neuron.unary sigmoid
// CHECK: neuron.yield
// CHECK: neuron.matmul %[[F]]#0, %[[F]]#1
func.func @chain(%x: tensor<8x8xbf16>, %y: tensor<8x8xbf16>) -> tensor<8x8xbf16> {
  %s = neuron.unary sigmoid %x : tensor<8x8xbf16> -> tensor<8x8xbf16>
  %m = neuron.binary mul %x, %s : tensor<8x8xbf16>, tensor<8x8xbf16> -> tensor<8x8xbf16>
  %a = neuron.binary add %m, %y : tensor<8x8xbf16>, tensor<8x8xbf16> -> tensor<8x8xbf16>
  %h = neuron.constant dense<0.5> : tensor<8x8xbf16>
  %o = neuron.binary mul %a, %h : tensor<8x8xbf16>, tensor<8x8xbf16> -> tensor<8x8xbf16>
  %r = neuron.matmul %m, %o : tensor<8x8xbf16>, tensor<8x8xbf16> -> tensor<8x8xbf16>
  return %r : tensor<8x8xbf16>
}

// -----

// RMSNorm: the weight (a column vector) broadcasts along rows inside the
// group.
// CHECK-LABEL: func.func @rmsnorm
// CHECK: neuron.fusion(%arg0, %arg1)
// CHECK-NOT: neuron.fusion
func.func @rmsnorm(%x: tensor<16x32xf32>, %w: tensor<32xf32>) -> tensor<16x32xf32> {
  %sq = neuron.binary mul %x, %x : tensor<16x32xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
  %s = neuron.reduce sum %sq {count = 1} : tensor<16x32xf32> -> tensor<16xf32>
  %n = neuron.constant dense<3.125e-02> : tensor<16xf32>
  %mean = neuron.binary mul %s, %n : tensor<16xf32>, tensor<16xf32> -> tensor<16xf32>
  %r = neuron.unary rsqrt %mean : tensor<16xf32> -> tensor<16xf32>
  %r2 = neuron.reshape %r : tensor<16xf32> -> tensor<16x1xf32>
  %b = neuron.broadcast %r2 : tensor<16x1xf32> -> tensor<16x32xf32>
  %xn = neuron.binary mul %x, %b : tensor<16x32xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
  %wb = neuron.broadcast %w : tensor<32xf32> -> tensor<16x32xf32>
  %y = neuron.binary mul %xn, %wb : tensor<16x32xf32>, tensor<16x32xf32> -> tensor<16x32xf32>
  return %y : tensor<16x32xf32>
}

// -----

// A reduction's row vector broadcast along columns (a transpose in
// disguise) cannot share its group: the reduction ends one group, and the
// next takes its result as a column vector.
// CHECK-LABEL: func.func @wrong_axis
// CHECK: %[[M:.*]] = neuron.fusion(%arg0) : (tensor<5x5xf32>) -> tensor<1x5xf32>
// CHECK: neuron.fusion(%[[M]], %arg0)
// CHECK-NEXT: ^bb0(%[[COL:.*]]: tensor<1x5xf32>,
// CHECK-NEXT: neuron.broadcast %[[COL]] : tensor<1x5xf32> -> tensor<5x5xf32>
func.func @wrong_axis(%x: tensor<5x5xf32>) -> tensor<5x5xf32> {
  %m = neuron.reduce max %x {count = 1} : tensor<5x5xf32> -> tensor<5xf32>
  %r = neuron.reshape %m : tensor<5xf32> -> tensor<1x5xf32>
  %b = neuron.broadcast %r : tensor<1x5xf32> -> tensor<5x5xf32>
  %d = neuron.binary sub %x, %b : tensor<5x5xf32>, tensor<5x5xf32> -> tensor<5x5xf32>
  return %d : tensor<5x5xf32>
}

// -----

// An op whose operands come from two groups that cannot merge (rows of 64
// vs a 1024-element column broadcast) joins the one it can: the centring
// joins the mean's group, and the broadcast of the mean stays inside it.
// CHECK-LABEL: func.func @partial_join
// CHECK: %[[X:.*]] = neuron.fusion(%arg1, %arg0)
// CHECK: %[[Y:.*]] = neuron.fusion(%[[X]]) : (tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
// CHECK: neuron.reduce sum
// CHECK: neuron.broadcast {{.*}} : tensor<2x16x1xf32> -> tensor<2x16x64xf32>
// CHECK: neuron.binary sub
// CHECK: return %[[Y]]
func.func @partial_join(%tok: tensor<2x16x64xf32>, %pos: tensor<16x64xf32>) -> tensor<2x16x64xf32> {
  %e = neuron.broadcast %pos : tensor<16x64xf32> -> tensor<2x16x64xf32>
  %x = neuron.binary add %tok, %e : tensor<2x16x64xf32>, tensor<2x16x64xf32> -> tensor<2x16x64xf32>
  %s = neuron.reduce sum %x {count = 1} : tensor<2x16x64xf32> -> tensor<2x16xf32>
  %r = neuron.reshape %s : tensor<2x16xf32> -> tensor<2x16x1xf32>
  %b = neuron.broadcast %r : tensor<2x16x1xf32> -> tensor<2x16x64xf32>
  %d = neuron.binary sub %x, %b : tensor<2x16x64xf32>, tensor<2x16x64xf32> -> tensor<2x16x64xf32>
  return %d : tensor<2x16x64xf32>
}

// -----

// Column sums (the weight and bias gradients of a norm) stay out of groups:
// lowered alone they read the transposed tensor in place on TensorE. The
// casts and the add of their results still form a group.
// CHECK-LABEL: func.func @column_sums
// CHECK: %[[W:.*]] = neuron.reduce sum %{{.*}} {count = 2 : i64} : tensor<256x2x8xf32> -> tensor<256xf32>
// CHECK: %[[B:.*]] = neuron.reduce sum %{{.*}} {count = 2 : i64} : tensor<256x2x8xf32> -> tensor<256xf32>
// CHECK: neuron.fusion(%[[W]], %[[B]])
// CHECK-NOT: neuron.reduce
// CHECK: neuron.yield
func.func @column_sums(%g: tensor<2x8x256xf32>, %x: tensor<2x8x256xf32>) -> tensor<256xbf16> {
  %t = neuron.transpose %g, [2, 0, 1] : tensor<2x8x256xf32> -> tensor<256x2x8xf32>
  %u = neuron.transpose %x, [2, 0, 1] : tensor<2x8x256xf32> -> tensor<256x2x8xf32>
  %w = neuron.reduce sum %t {count = 2} : tensor<256x2x8xf32> -> tensor<256xf32>
  %b = neuron.reduce sum %u {count = 2} : tensor<256x2x8xf32> -> tensor<256xf32>
  %wc = neuron.cast %w : tensor<256xf32> -> tensor<256xbf16>
  %bc = neuron.cast %b : tensor<256xf32> -> tensor<256xbf16>
  %s = neuron.binary add %wc, %bc : tensor<256xbf16>, tensor<256xbf16> -> tensor<256xbf16>
  return %s : tensor<256xbf16>
}

// -----

// An upcast read by groups of different row lengths (a long row's softmax
// in blocks: the blocks' max by rows of 4, the exponentials by rows of 4
// after a broadcast to each block) is not stored at float32 by the first
// group for the second: each reads x in bf16 and widens it for free.
// CHECK-LABEL: func.func @upcast_read_by_two_groups
// CHECK: neuron.fusion(%arg0) : (tensor<8x16xbf16>) -> tensor<8x4x1xf32>
// CHECK: neuron.fusion(%{{.*}}, %arg0) : (tensor<8x4x1xf32>, tensor<8x16xbf16>) -> tensor<8x4x4xf32>
// CHECK-NOT: tensor<8x16xf32>) ->
func.func @upcast_read_by_two_groups(%x: tensor<8x16xbf16>) -> tensor<8x4x4xf32> {
  %f = neuron.cast %x : tensor<8x16xbf16> -> tensor<8x16xf32>
  %xb = neuron.reshape %f : tensor<8x16xf32> -> tensor<8x4x4xf32>
  %m = neuron.reduce max %xb {count = 1} : tensor<8x4x4xf32> -> tensor<8x4xf32>
  %m1 = neuron.reshape %m : tensor<8x4xf32> -> tensor<8x4x1xf32>
  %t = neuron.transpose %m1, [0, 2, 1] : tensor<8x4x1xf32> -> tensor<8x1x4xf32>
  %mm = neuron.reduce max %t {count = 1} : tensor<8x1x4xf32> -> tensor<8x1xf32>
  %mr = neuron.reshape %mm : tensor<8x1xf32> -> tensor<8x1x1xf32>
  %mk = neuron.broadcast %mr : tensor<8x1x1xf32> -> tensor<8x4x1xf32>
  %b = neuron.broadcast %mk : tensor<8x4x1xf32> -> tensor<8x4x4xf32>
  %d = neuron.binary sub %xb, %b : tensor<8x4x4xf32>, tensor<8x4x4xf32> -> tensor<8x4x4xf32>
  %e = neuron.unary exp %d : tensor<8x4x4xf32> -> tensor<8x4x4xf32>
  return %e : tensor<8x4x4xf32>
}
