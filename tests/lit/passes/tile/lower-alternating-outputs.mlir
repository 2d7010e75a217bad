// RUN: neuron-opt %s --neuron-fuse-elementwise --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-fuse-elementwise --neuron-lower-to-nisa | FileCheck %s --check-prefix=SLOT

// The ranks of decompositions.sort's rank sort: compares over [2, 300, 300]
// summed along the row, stored reshaped to [2, 1, 300]. The group's engines
// alternate over a period of two steps (one sums on GpSimd, the other on
// VectorE), and a period is stored after the next one's code. The output is
// a reshape of the row sum, so each step stores the sum's own tile (its
// inner slot, [128, 2]); the output's slot ([128, 4]) is never written and
// storing it gave the sort garbage ranks.
// CHECK-LABEL: func.func @ranks
// CHECK: [[SUMS:%[a-z_0-9]+]] = memref.alloc() : memref<128x2xi64, #nisa.mem<sbuf>>
// CHECK: nisa.tensor_reduce add {{.*}} {engine = #nisa.engine<gpsimd>} : memref<128x300xi64, {{.*}}>, memref<128x1xi64, strided<[2, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.tensor_reduce add %{{[^{]*}} : memref<128x300xi64, {{.*}}>, memref<128x1xi64, strided<[2, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: [[HELD:%[a-z_0-9]+]] = memref.reinterpret_cast [[SUMS]] to offset: [%{{[^]]*}}], sizes: [128, 1]
// CHECK: nisa.dma_copy [[HELD]], %{{[^ ]*}} : memref<128x1xi64, strided<[2, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x1xi64, strided<[1, 1], offset: ?>>
// SLOT-LABEL: func.func @ranks
// SLOT-NOT: nisa.dma_copy {{.*}} : memref<{{[0-9]+}}x1xi64, strided<[4, 1], offset: ?>, #nisa.mem<sbuf>>
// SLOT: return
func.func @ranks(%arg1: tensor<2x300xf32>, %arg2: tensor<2x300x300xf32>, %arg3: tensor<2x300x300xi1>, %arg4: tensor<2x300x300xf32>, %arg5: tensor<2x300x300xi1>, %arg6: tensor<2x300x300xi1>) -> tensor<2x1x300xi64> {
  %16 = neuron.reshape %arg1 : tensor<2x300xf32> -> tensor<2x300x1xf32>
  %17 = neuron.binary ne %16, %16 : tensor<2x300x1xf32>, tensor<2x300x1xf32> -> tensor<2x300x1xi1>
  %18 = neuron.broadcast %16 : tensor<2x300x1xf32> -> tensor<2x300x300xf32>
  %19 = neuron.binary gt %arg2, %18 : tensor<2x300x300xf32>, tensor<2x300x300xf32> -> tensor<2x300x300xi1>
  %20 = neuron.unary logical_not %17 : tensor<2x300x1xi1> -> tensor<2x300x1xi1>
  %21 = neuron.broadcast %20 : tensor<2x300x1xi1> -> tensor<2x300x300xi1>
  %22 = neuron.binary logical_and %arg3, %21 : tensor<2x300x300xi1>, tensor<2x300x300xi1> -> tensor<2x300x300xi1>
  %23 = neuron.binary logical_or %19, %22 : tensor<2x300x300xi1>, tensor<2x300x300xi1> -> tensor<2x300x300xi1>
  %25 = neuron.binary eq %arg4, %18 : tensor<2x300x300xf32>, tensor<2x300x300xf32> -> tensor<2x300x300xi1>
  %26 = neuron.broadcast %17 : tensor<2x300x1xi1> -> tensor<2x300x300xi1>
  %27 = neuron.binary logical_and %26, %arg5 : tensor<2x300x300xi1>, tensor<2x300x300xi1> -> tensor<2x300x300xi1>
  %28 = neuron.binary logical_or %25, %27 : tensor<2x300x300xi1>, tensor<2x300x300xi1> -> tensor<2x300x300xi1>
  %29 = neuron.binary logical_and %28, %arg6 : tensor<2x300x300xi1>, tensor<2x300x300xi1> -> tensor<2x300x300xi1>
  %30 = neuron.binary logical_or %23, %29 : tensor<2x300x300xi1>, tensor<2x300x300xi1> -> tensor<2x300x300xi1>
  %31 = neuron.cast %30 : tensor<2x300x300xi1> -> tensor<2x300x300xi64>
  %32 = neuron.reduce sum %31 {count = 1 : i64} : tensor<2x300x300xi64> -> tensor<2x300xi64>
  %33 = neuron.reshape %32 : tensor<2x300xi64> -> tensor<2x1x300xi64>
  return %33 : tensor<2x1x300xi64>
}
