// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s

// A group's short last tile of at most 92 rows (K = 1024: below that the
// target's cost model makes it cheaper) computes transposed: the weights
// stationary, the tile's rows moving (their run-time count is TensorE's
// cost), each 128-column chunk's sums evicted and transposed back on
// TensorE by a product with the identity; a longer one computes whole.
// Where the group has a whole tile too, the tail computes transposed with
// the last one (128 + tail rows moving, two 128-row blocks transposed back
// and stored), which the whole tiles' loop then leaves out.

// CHECK-LABEL: func.func @tails(
// CHECK: nisa.iota
// CHECK: nisa.tensor_scalar
// CHECK: %[[FULL:.*]] = arith.floordivsi %arg4, %c128 : index
// CHECK: %[[TAIL:.*]] = arith.remsi %arg4, %c128 : index
// CHECK: %[[SHORT:.*]] = arith.subi %c93, %[[TAIL]] : index
// CHECK: %[[WHOLE:.*]] = arith.subi %[[FULL]], %[[MERGED:[0-9]+]] : index
// CHECK: %[[SHIFT:.*]] = arith.muli %[[MERGED]], %c128 : index
// CHECK: %[[ALONE:.*]] = arith.subi %[[TAIL]], %[[SHIFT]] : index
// CHECK: scf.for
// CHECK: arith.addi %[[TAIL]], %c128 : index
// CHECK: nisa.matmul {{.*}} : memref<128x128xbf16, {{.*}}>, memref<128x?xbf16, {{.*}}>, memref<128x?xf32,
// CHECK: nisa.copy {{.*}} : memref<128x256xf32, {{.*}}#nisa.mem<psum>>, memref<128x256xbf16,
// CHECK: nisa.matmul {{.*}} : memref<128x128xbf16, {{.*}}>, memref<128x128xbf16, #nisa.mem<sbuf>>, memref<128x128xf32,
// CHECK: nisa.matmul {{.*}} : memref<128x128xbf16, {{.*}}>, memref<128x128xbf16, #nisa.mem<sbuf>>, memref<128x128xf32,
// CHECK: nisa.dma_copy {{.*}} : memref<128x128xbf16, {{.*}}#nisa.mem<sbuf>>, memref<128x128xbf16,
// CHECK: nisa.dma_copy {{.*}} : memref<?x128xbf16, {{.*}}#nisa.mem<sbuf>>, memref<?x128xbf16,
// CHECK: arith.maxsi %[[ALONE]], %c0 : index
// CHECK: scf.for
// CHECK: nisa.matmul {{.*}} : memref<128x128xbf16, {{.*}}>, memref<128x?xbf16, {{.*}}>, memref<128x?xf32,
// CHECK: nisa.copy
// CHECK: nisa.matmul {{.*}} : memref<128x128xbf16, {{.*}}>, memref<128x128xbf16, #nisa.mem<sbuf>>, memref<128x128xf32,
// CHECK: nisa.dma_copy {{.*}} : memref<?x128xbf16, {{.*}}#nisa.mem<sbuf>>, memref<?x128xbf16,
// CHECK: arith.subi %[[TAIL]], %c92 : index
// CHECK: nisa.matmul {{.*}} : memref<128x128xbf16, {{.*}}>, memref<128x128xbf16, {{.*}}>, memref<128x128xf32,
// CHECK: arith.subi %[[WHOLE]], %c3 : index

func.func @tails(%x: tensor<300x1024xbf16>, %w: tensor<2x1024x128xbf16>, %offs: tensor<2xi32>,
                 %e0: index {neuron.size = {name = "offs__end0", min = 0 : i64, max = 300 : i64}},
                 %e1: index {neuron.size = {name = "offs__end1", min = 0 : i64, max = 300 : i64}}) -> tensor<300x128xbf16> {
  %y = neuron.grouped_matmul %x, %w ends(%e0, %e1) : tensor<300x1024xbf16>, tensor<2x1024x128xbf16> -> tensor<300x128xbf16>
  return %y : tensor<300x128xbf16>
}
