// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa | neuron-opt | FileCheck %s

// fp8 operands contract on TensorE's double_row: a group of two K tiles
// puts K value 2p + r of its 256 on partition p, row r. A float8 Linear's
// operands are both contiguous along K (A row-major, B = w^T of a row-major
// weight): each loads by DMA transposes of 2-byte units (the two K values of
// a row), interleaved in SBUF, and the matmuls read [K, 2, F] views of row
// stride 1. K = 320: one group, then a tail of 64 values as a group on 32
// partitions; no fp8 element moves alone.
// CHECK-LABEL: func.func @linear
// CHECK: memref.alloc() : memref<128x1024xf8E4M3FN, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy {{.*}} : memref<128x1x256x2xf8E4M3FN, strided<[2, 256, 320, 1], offset: ?>>, memref<128x1x256x2xf8E4M3FN, strided<[1024, 512, 2, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy {{.*}} : memref<32x1x256x2xf8E4M3FN, strided<[2, 256, 320, 1], offset: ?>>, memref<32x1x256x2xf8E4M3FN, strided<[1024, 512, 2, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy {{.*}} : memref<128x384x2xf8E4M3FN, strided<[2, 320, 1], offset: ?>>, memref<128x384x2xf8E4M3FN, strided<[1536, 2, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} {double_row} : memref<128x2x128xf8E4M3FN, strided<[1024, 1, 2], offset: ?>, #nisa.mem<sbuf>>, memref<128x2x384xf8E4M3FN, strided<[1536, 1, 2], offset: ?>, #nisa.mem<sbuf>>, memref<128x384xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// CHECK: nisa.dma_copy {{.*}} : memref<32x384x2xf8E4M3FN, strided<[2, 320, 1], offset: ?>>, memref<32x384x2xf8E4M3FN, strided<[1536, 2, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} {accumulate, double_row} : memref<32x2x128xf8E4M3FN, strided<[1024, 1, 2], offset: ?>, #nisa.mem<sbuf>>, memref<32x2x384xf8E4M3FN
// CHECK-NOT: nisa.matmul {{.*}} : memref<{{[0-9]+}}x{{[0-9]+}}xf8
func.func @linear(%a: tensor<256x320xf8E4M3FN>, %w: tensor<384x320xf8E4M3FN>, %ra: tensor<256xf32>, %cb: tensor<384xf32>) -> tensor<256x384xbf16> {
  %b = neuron.transpose %w, [1, 0] : tensor<384x320xf8E4M3FN> -> tensor<320x384xf8E4M3FN>
  %m = neuron.scaled_matmul %a, %b scales %ra, %cb : tensor<256x320xf8E4M3FN>, tensor<320x384xf8E4M3FN>, tensor<256xf32>, tensor<384xf32> -> tensor<256x384xbf16>
  return %m : tensor<256x384xbf16>
}

// A row-major B is strided along K: each partition's two rows of a group
// load as contiguous runs, a tile's columns apart (R-major), while A stays
// interleaved; E5M2 with E4M3.
// CHECK-LABEL: func.func @row_major_b
// CHECK: nisa.dma_copy {{.*}} : memref<128x2x256xf8E4M3FN, strided<[512, 256, 1], offset: ?>>, memref<128x2x256xf8E4M3FN, strided<[1024, 256, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} {double_row} : memref<128x2x128xf8E5M2, strided<[512, 1, 2], offset: ?>, #nisa.mem<sbuf>>, memref<128x2x256xf8E4M3FN, strided<[1024, 256, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} {accumulate, double_row}
func.func @row_major_b(%a: tensor<128x512xf8E5M2>, %b: tensor<512x256xf8E4M3FN>, %s: tensor<1xf32>) -> tensor<128x256xf32> {
  %m = neuron.scaled_matmul %a, %b scales %s, %s : tensor<128x512xf8E5M2>, tensor<512x256xf8E4M3FN>, tensor<1xf32>, tensor<1xf32> -> tensor<128x256xf32>
  return %m : tensor<128x256xf32>
}
