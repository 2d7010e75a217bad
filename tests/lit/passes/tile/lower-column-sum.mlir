// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa | neuron-opt | FileCheck %s
// Narrow free tiles: groups of one PSUM bank, two sets alternating.
// RUN: neuron-opt %s --neuron-lower-to-nisa=free-tile-bytes=1024 | FileCheck %s --check-prefix=SMALL

// A sum over the two leading dims (a bias gradient): 600 rows of 1300
// contiguous columns. Row tiles load in place (no transposed copy); a ones
// vector is the stationary operand, the free axis splits into 512-column
// PSUM banks, the first row tile starts the sums and the others (the last
// one 88 rows) accumulate; the banks are evicted in bf16 and stored once.
// CHECK-LABEL: func.func @column_sum
// CHECK-NOT: nisa.tensor_reduce
// CHECK: nisa.memset %[[ONES:.*]], 1.000000e+00 : memref<128x1xbf16, #nisa.mem<sbuf>>
// CHECK: memref.alloc() : memref<1x1536xf32, #nisa.mem<psum>>
// CHECK: nisa.dma_copy {{.*}} : memref<128x1300xbf16, strided<[1300, 1], offset: ?>>, memref<128x1300xbf16, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.matmul %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}} : memref<128x1xbf16, {{.*}}>, memref<128x512xbf16, {{.*}}>, memref<1x512xf32, {{.*}}#nisa.mem<psum>>
// CHECK: to offset: [%c512], sizes: [1, 512]
// CHECK: nisa.matmul %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}} : memref<128x1xbf16, {{.*}}>, memref<128x512xbf16
// CHECK: to offset: [%c1024], sizes: [1, 276]
// CHECK: nisa.matmul %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}} : memref<128x1xbf16, {{.*}}>, memref<128x276xbf16
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<128x1xbf16
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<88x1xbf16, {{.*}}>, memref<88x512xbf16
// CHECK: nisa.copy {{.*}} : memref<1x512xf32, {{.*}}#nisa.mem<psum>>, memref<1x512xbf16, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.dma_copy {{.*}} {engine = #nisa.engine<scalar>} : memref<1x1300xbf16, {{.*}}#nisa.mem<sbuf>>, memref<1x1300xbf16
// CHECK-NOT: nisa.tensor_reduce
// CHECK-LABEL: return
func.func @column_sum(%x: tensor<2x300x1300xbf16>) -> tensor<1300xbf16> {
  %t = neuron.transpose %x, [2, 0, 1] : tensor<2x300x1300xbf16> -> tensor<1300x2x300xbf16>
  %r = neuron.reduce sum %t {count = 2} : tensor<1300x2x300xbf16> -> tensor<1300xbf16>
  return %r : tensor<1300xbf16>
}

// fp32, beyond one row tile's banks: groups of 2048 columns (a free tile of
// 8 KiB per partition, 4 banks), the two groups in alternate bank sets; the
// row tiles stream in a loop of accumulating matmuls.
// CHECK-LABEL: func.func @column_sum_groups
// CHECK: memref.alloc() : memref<1x4096xf32, #nisa.mem<psum>>
// CHECK: scf.for
// CHECK: nisa.dma_copy {{.*}} : memref<128x2048xf32, strided<[2560, 1], offset: ?>>
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<128x1xf32, {{.*}}>, memref<128x512xf32, {{.*}}>, memref<1x512xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// CHECK: }
// CHECK: to offset: [%c2048{{.*}}], sizes: [1, 512], strides: [4096, 1] : memref<1x4096xf32, #nisa.mem<psum>>
// CHECK: nisa.matmul %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}} : memref<128x1xf32, {{.*}}>, memref<128x512xf32
// CHECK-NOT: nisa.tensor_reduce
// CHECK-LABEL: return
// SMALL-LABEL: func.func @column_sum_groups
// SMALL: memref.alloc() : memref<1x1024xf32, #nisa.mem<psum>>
// SMALL: scf.for
// SMALL: nisa.matmul {{.*}} : memref<128x1xf32, {{.*}}>, memref<128x512xf32, {{.*}}>, memref<1x512xf32, strided<[1024, 1], offset: ?>, #nisa.mem<psum>>
func.func @column_sum_groups(%x: tensor<4096x2560xf32>) -> tensor<2560xf32> {
  %t = neuron.transpose %x, [1, 0] : tensor<4096x2560xf32> -> tensor<2560x4096xf32>
  %r = neuron.reduce sum %t {count = 1} : tensor<2560x4096xf32> -> tensor<2560xf32>
  return %r : tensor<2560xf32>
}

// A sum over a middle dim: a column sum per index of the outer kept dim.
// CHECK-LABEL: func.func @middle
// CHECK: scf.for
// CHECK: nisa.dma_copy {{.*}} : memref<50x6xf32, strided<[6, 1], offset: ?>>
// CHECK: nisa.matmul {{.*}} : memref<50x1xf32, {{.*}}>, memref<50x6xf32, {{.*}}>, memref<1x6xf32
func.func @middle(%x: tensor<4x50x6xf32>) -> tensor<4x6xf32> {
  %t = neuron.transpose %x, [0, 2, 1] : tensor<4x50x6xf32> -> tensor<4x6x50xf32>
  %r = neuron.reduce sum %t {count = 1} : tensor<4x6x50xf32> -> tensor<4x6xf32>
  return %r : tensor<4x6xf32>
}

// Not column sums: reduced dims that are not rows of memory, and a max,
// keep the row reduction on VectorE.
// CHECK-LABEL: func.func @not_columns
// CHECK-NOT: nisa.matmul
// CHECK: nisa.tensor_reduce add
// CHECK: nisa.tensor_reduce max
// CHECK-NOT: nisa.matmul
// CHECK-LABEL: return
func.func @not_columns(%x: tensor<4x8x16xf32>, %y: tensor<300x64xf32>) -> (tensor<8xf32>, tensor<64xf32>) {
  %t = neuron.transpose %x, [1, 0, 2] : tensor<4x8x16xf32> -> tensor<8x4x16xf32>
  %r = neuron.reduce sum %t {count = 2} : tensor<8x4x16xf32> -> tensor<8xf32>
  %u = neuron.transpose %y, [1, 0] : tensor<300x64xf32> -> tensor<64x300xf32>
  %m = neuron.reduce max %u {count = 1} : tensor<64x300xf32> -> tensor<64xf32>
  return %r, %m : tensor<8xf32>, tensor<64xf32>
}
