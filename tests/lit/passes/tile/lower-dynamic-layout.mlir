// RUN: neuron-opt %s -split-input-file --neuron-fuse-elementwise --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s -split-input-file --neuron-fuse-elementwise --neuron-lower-to-nisa --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program -split-input-file | FileCheck %s --check-prefix=PROGRAM

// Decoder-layer work over a sequence length s0 known only at run time
// (issue #16): N-d groups whose rows are the product of the leading dims,
// and the views between them.

// An RMSNorm over [1, s0, 64] yielding its rows as [s0, 64] (the view a
// Linear reads): the group's rows are s0, from the fusion's body.
// CHECK-LABEL: func.func @norm_rows(
// CHECK: %[[FULL:.*]] = arith.floordivsi %arg2, %c128 : index
// CHECK: %[[REM:.*]] = arith.remsi %arg2, %c128 : index
// CHECK: memref.reinterpret_cast %arg0 to offset: [%{{.*}}], sizes: [%[[REM]], 64], strides: [64, 1]
// CHECK: memref.reinterpret_cast %arg1 to offset: [%{{.*}}], sizes: [%[[REM]], 64], strides: [64, 1]
// PROGRAM: "count":"floordiv(max((floordiv(s0,128)-3),0),4)"
// PROGRAM-SAME: "shape":["mod(s0,128)",64]
// PROGRAM-SAME: "count":"min(max(mod(s0,128),0),1)"
// PROGRAM-SAME: "shape":[1,"s0",64]
// PROGRAM-SAME: "name":"norm_rows"
// PROGRAM-SAME: "params":[{"min":1,"name":"s0"}]
func.func @norm_rows(%x: tensor<1x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, s0, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<?x64xf32> {neuron.dims = affine_map<()[s0] -> (s0, 64)>}) {
  %sq = neuron.binary mul %x, %x : tensor<1x?x64xf32>, tensor<1x?x64xf32> -> tensor<1x?x64xf32>
  %s = neuron.reduce sum %sq {count = 1} : tensor<1x?x64xf32> -> tensor<1x?xf32>
  %sr = neuron.reshape %s : tensor<1x?xf32> -> tensor<1x?x1xf32>
  %r = neuron.unary rsqrt %sr : tensor<1x?x1xf32> -> tensor<1x?x1xf32>
  %rb = neuron.broadcast %r : tensor<1x?x1xf32> -> tensor<1x?x64xf32>
  %y = neuron.binary mul %x, %rb : tensor<1x?x64xf32>, tensor<1x?x64xf32> -> tensor<1x?x64xf32>
  %rows = neuron.reshape %y : tensor<1x?x64xf32> -> tensor<?x64xf32>
  return %rows : tensor<?x64xf32>
}

// -----

// Heads: [1, s0, 128] seen as [1, 2, s0, 64] (view, transpose), doubled,
// and back. The transposed window is copied into a [1, 2, s0, 64] buffer
// one head at a time (its heads are s0 * 64 apart, a stride known only at
// run time), each a [s0, 64] DMA; the group runs over 2 * s0 rows of 64;
// the transpose back is copied the same way.
// CHECK-LABEL: func.func @heads(
// CHECK: %[[HEADS:.*]] = memref.alloc(%arg2) : memref<1x2x?x64xf32>
// CHECK: %[[HEAD1:.*]] = arith.muli %arg2, %c64 : index
// CHECK: %[[D0:.*]] = memref.reinterpret_cast %[[HEADS]] to offset: [%c0], sizes: [%arg2, 64], strides: [64, 1]
// CHECK: %[[S0:.*]] = memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [%arg2, 64], strides: [128, 1]
// CHECK: nisa.dma_copy %[[S0]], %[[D0]]
// CHECK: %[[D1:.*]] = memref.reinterpret_cast %[[HEADS]] to offset: [%[[HEAD1]]], sizes: [%arg2, 64], strides: [64, 1]
// CHECK: %[[S1:.*]] = memref.reinterpret_cast %arg0 to offset: [%c64], sizes: [%arg2, 64], strides: [128, 1]
// CHECK: nisa.dma_copy %[[S1]], %[[D1]]
// CHECK: %[[ROWS:.*]] = arith.muli %arg2, %c2 : index
// CHECK: arith.floordivsi %[[ROWS]], %c128 : index
// CHECK: nisa.tensor_scalar
// CHECK: %[[BACK:.*]] = memref.alloc(%arg2) : memref<1x?x2x64xf32>
// CHECK: memref.reinterpret_cast %[[BACK]] to offset: [%c0], sizes: [%arg2, 64], strides: [128, 1]
// CHECK: nisa.dma_copy
// CHECK: memref.reinterpret_cast %[[BACK]] to offset: [%c64], sizes: [%arg2, 64], strides: [128, 1]
// CHECK: memref.reinterpret_cast %{{.*}} to offset: [%[[HEAD1]]], sizes: [%arg2, 64], strides: [64, 1]
// CHECK: nisa.dma_copy
// PROGRAM: "dst":{"buf":2,"offset":{"const":"(s0*64)","terms":[]},"shape":["s0",64],"strides":[64,1]}
// PROGRAM-SAME: "count":"floordiv(max((floordiv((s0*2),128)-3),0),4)"
// PROGRAM-SAME: "count":"min(max(mod((s0*2),128),0),1)"
// PROGRAM-SAME: "src":{"buf":3,"offset":{"const":"(s0*64)","terms":[]},"shape":["s0",64],"strides":[64,1]}
// PROGRAM-SAME: "name":"heads"
func.func @heads(%x: tensor<1x?x128xf32> {neuron.dims = affine_map<()[s0] -> (1, s0, 128)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<1x?x128xf32> {neuron.dims = affine_map<()[s0] -> (1, s0, 128)>}) {
  %two = neuron.constant dense<2.0> : tensor<1x2x1x64xf32>
  %v = neuron.reshape %x {neuron.dims = affine_map<()[s0] -> (1, s0, 2, 64)>} : tensor<1x?x128xf32> -> tensor<1x?x2x64xf32>
  %t = neuron.transpose %v, [0, 2, 1, 3] : tensor<1x?x2x64xf32> -> tensor<1x2x?x64xf32>
  %twos = neuron.broadcast %two : tensor<1x2x1x64xf32> -> tensor<1x2x?x64xf32>
  %d = neuron.binary mul %t, %twos : tensor<1x2x?x64xf32>, tensor<1x2x?x64xf32> -> tensor<1x2x?x64xf32>
  %b = neuron.transpose %d, [0, 2, 1, 3] : tensor<1x2x?x64xf32> -> tensor<1x?x2x64xf32>
  %y = neuron.reshape %b : tensor<1x?x2x64xf32> -> tensor<1x?x128xf32>
  return %y : tensor<1x?x128xf32>
}

// -----

// A transposed view returned: copied into the output one column at a time
// (the output's rows are s0 apart).
// CHECK-LABEL: func.func @transpose(
// CHECK-COUNT-4: nisa.dma_copy {{.*}} : memref<?xf32, strided<[4], offset: ?>>, memref<?xf32, strided<[1], offset: ?>>
// PROGRAM: "dst":{"buf":1,"offset":{"const":"(s0*3)","terms":[]},"shape":["s0"],"strides":[1]}
// PROGRAM-SAME: "src":{"buf":0,"offset":{"const":3,"terms":[]},"shape":["s0"],"strides":[4]}
// PROGRAM-SAME: "name":"transpose"
func.func @transpose(%a: tensor<?x4xf32> {neuron.dims = affine_map<()[s0] -> (s0, 4)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<4x?xf32> {neuron.dims = affine_map<()[s0] -> (4, s0)>}) {
  %0 = neuron.transpose %a, [1, 0] : tensor<?x4xf32> -> tensor<4x?xf32>
  return %0 : tensor<4x?xf32>
}

// -----

// A KV cache update: [1, 2, s0, 16] ++ [1, 2, 1, 16] along the sequence.
// Each input is copied per head (the output's heads are (s0 + 1) * 16
// apart), the new row at offset s0 * 16 within its head.
// CHECK-LABEL: func.func @cache(
// CHECK: %[[LEN:.*]] = arith.addi %arg3, %c1 : index
// CHECK-COUNT-4: nisa.dma_copy
// CHECK-NOT: nisa.dma_copy
// PROGRAM: "dst":{"buf":2,"offset":{"const":"((s0*16)+16)","terms":[]},"shape":["s0",16],"strides":[16,1]}
// PROGRAM-SAME: "src":{"buf":0,"offset":{"const":"(s0*16)","terms":[]},"shape":["s0",16],"strides":[16,1]}
// PROGRAM-SAME: "dst":{"buf":2,"offset":{"const":"(s0*16)","terms":[]},"shape":[16],"strides":[1]}
// PROGRAM-SAME: "dst":{"buf":2,"offset":{"const":"(((s0*16)+(s0*16))+16)","terms":[]},"shape":[16],"strides":[1]}
// PROGRAM-SAME: "shape":[1,2,"(s0+1)",16]
// PROGRAM-SAME: "name":"cache"
func.func @cache(%past: tensor<1x2x?x16xf32> {neuron.dims = affine_map<()[s0] -> (1, 2, s0, 16)>}, %new: tensor<1x2x1x16xf32>, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<1x2x?x16xf32> {neuron.dims = affine_map<()[s0] -> (1, 2, s0 + 1, 16)>}) {
  %0 = neuron.concat %past, %new {dim = 2} : tensor<1x2x?x16xf32>, tensor<1x2x1x16xf32> -> tensor<1x2x?x16xf32>
  return %0 : tensor<1x2x?x16xf32>
}

// -----

// Transposed there and back, then viewed as rows: still a window of the
// input (its strides are numbers again), so the only data moved is the
// result's one copy into its output.
// CHECK-LABEL: func.func @there_and_back(
// CHECK: %[[SRC:.*]] = memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [%arg2, 128], strides: [128, 1]
// CHECK: nisa.dma_copy %[[SRC]], %{{.*}}
// CHECK-NOT: nisa.dma_copy
func.func @there_and_back(%x: tensor<1x?x128xf32> {neuron.dims = affine_map<()[s0] -> (1, s0, 128)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<?x128xf32> {neuron.dims = affine_map<()[s0] -> (s0, 128)>}) {
  %v = neuron.reshape %x {neuron.dims = affine_map<()[s0] -> (1, s0, 2, 64)>} : tensor<1x?x128xf32> -> tensor<1x?x2x64xf32>
  %t = neuron.transpose %v, [0, 2, 1, 3] : tensor<1x?x2x64xf32> -> tensor<1x2x?x64xf32>
  %b = neuron.transpose %t, [0, 2, 1, 3] : tensor<1x2x?x64xf32> -> tensor<1x?x2x64xf32>
  %r = neuron.reshape %b : tensor<1x?x2x64xf32> -> tensor<?x128xf32>
  return %r : tensor<?x128xf32>
}

// -----

// Heads of a batch and a sequence both known only at run time: the batch's
// stride is too, so the copy loops over the batch (s0), two [s1, 64] DMAs a
// step, their offsets the loop's counter times run-time strides.
// CHECK-LABEL: func.func @batch_heads(
// CHECK: scf.for %[[B:.*]] = %c0 to %arg2 step %c1
// CHECK-COUNT-2: nisa.dma_copy
// CHECK-NOT: nisa.dma_copy
// CHECK: }
// PROGRAM: "dst":{"buf":2,"offset":{"const":0,"terms":{{\[\[0,"\(s1\*128\)"\]\]}}},"shape":["s1",64],"strides":[64,1]}
// PROGRAM-SAME: "src":{"buf":0,"offset":{"const":0,"terms":{{\[\[0,"\(s1\*128\)"\]\]}}},"shape":["s1",64],"strides":[128,1]}
// PROGRAM-SAME: "dst":{"buf":2,"offset":{"const":"(s1*64)","terms":{{\[\[0,"\(s1\*128\)"\]\]}}}
// PROGRAM-SAME: "src":{"buf":0,"offset":{"const":64,"terms":{{\[\[0,"\(s1\*128\)"\]\]}}}
// PROGRAM-SAME: "count":"s0"
// PROGRAM-SAME: "name":"batch_heads"
func.func @batch_heads(%x: tensor<?x?x128xf32> {neuron.dims = affine_map<()[s0, s1] -> (s0, s1, 128)>}, %m: index {neuron.size = {name = "s0", min = 1 : i64}}, %n: index {neuron.size = {name = "s1", min = 1 : i64}}) -> (tensor<?x2x?x64xf32> {neuron.dims = affine_map<()[s0, s1] -> (s0, 2, s1, 64)>}) {
  %v = neuron.reshape %x {neuron.dims = affine_map<()[s0, s1] -> (s0, s1, 2, 64)>} : tensor<?x?x128xf32> -> tensor<?x?x2x64xf32>
  %t = neuron.transpose %v, [0, 2, 1, 3] {neuron.dims = affine_map<()[s0, s1] -> (s0, 2, s1, 64)>} : tensor<?x?x2x64xf32> -> tensor<?x2x?x64xf32>
  %d = neuron.binary add %t, %t : tensor<?x2x?x64xf32>, tensor<?x2x?x64xf32> -> tensor<?x2x?x64xf32>
  return %d : tensor<?x2x?x64xf32>
}
