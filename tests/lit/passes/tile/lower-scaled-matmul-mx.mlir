// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa | neuron-opt | FileCheck %s
// RUN: not neuron-opt %s --neuron-lower-to-nisa="target=trn2" 2>&1 | FileCheck %s --check-prefix=TRN2

// MX block scales on trn3: each matmul contracts 512 values of K (value
// 4p + r on partition p, row r) with the E8M0 scales of its 16 groups of 32,
// row j for partitions [8j, 8j + 8). The scales ([rows, K / 32] in HBM) load
// as they are, partition p holding rows 2p and 2p + 1 of B's 256 in one run,
// widen to bf16 (in pieces over VectorE and GpSimd) and transpose on TensorE
// against the identity, row 2p + s of slot s into column p: a stride-2
// narrowing copy back to ui8. With K <= 4096 that transpose is the panel:
// group g on partition g, a matmul's scales from partition 4 * kFirst.
// K = 640: a group of 512, then one of 128 on 32 partitions (4 scale rows).
// CHECK-LABEL: func.func @mx
// CHECK: nisa.dma_copy {{.*}} : memref<128x2x20xui8, strided<[40, 20, 1], offset: ?>>, memref<128x2x20xui8, strided<[40, 20, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.copy {{.*}} : memref<128x20xui8, strided<[40, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x20xbf16
// CHECK: nisa.copy {{.*}} {engine = #nisa.engine<gpsimd>} : memref<128x20xui8, strided<[40, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x20xbf16
// CHECK: nisa.matmul {{.*}} : memref<128x20xbf16, strided<[40, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x128xbf16, strided<[128, 1], offset: ?>, #nisa.mem<sbuf>>, memref<20x128xf32
// CHECK: nisa.copy {{.*}} : memref<20x128xf32, strided<[1024, 1], offset: ?>, #nisa.mem<psum>>, memref<20x128xui8, strided<[256, 2], offset: ?>, #nisa.mem<sbuf>>
// CHECK-NOT: nisa.dma_copy {{.*}}xui8{{.*}}#nisa.mem<sbuf>>, memref<{{.*}}xui8
// CHECK: nisa.matmul {{.*}} scales {{.*}} : memref<128x4x128xf8E4M3FN, strided<[1024, 1, 4], offset: ?>, #nisa.mem<sbuf>>, memref<128x4x256xf8E4M3FN, strided<[2048, 1, 4], offset: ?>, #nisa.mem<sbuf>>, memref<128x256xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>, memref<16x128xui8, strided<[128, 1], offset: ?>, #nisa.mem<sbuf>>, memref<16x256xui8, strided<[256, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} scales {{.*}} {accumulate} : memref<32x4x128xf8E4M3FN, strided<[1024, 1, 4], offset: ?>, #nisa.mem<sbuf>>, memref<32x4x256xf8E4M3FN, strided<[2048, 1, 4], offset: ?>, #nisa.mem<sbuf>>, memref<128x256xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>, memref<4x128xui8, strided<[128, 1], offset: ?>, #nisa.mem<sbuf>>, memref<4x256xui8, strided<[256, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK-NOT: double_row
// TRN2: error: 'neuron.scaled_matmul' op MX block scales need TensorE's MX mode (NeuronCore-v4, trn3); target 'trn2' has none
module attributes {nisa.target = "trn3"} {
func.func @mx(%a: tensor<128x640xf8E4M3FN>, %w: tensor<256x640xf8E4M3FN>, %sa: tensor<128x20xui8>, %sb: tensor<256x20xui8>) -> tensor<128x256xbf16> {
  %b = neuron.transpose %w, [1, 0] : tensor<256x640xf8E4M3FN> -> tensor<640x256xf8E4M3FN>
  %m = neuron.scaled_matmul %a, %b scales %sa, %sb : tensor<128x640xf8E4M3FN>, tensor<640x256xf8E4M3FN>, tensor<128x20xui8>, tensor<256x20xui8> -> tensor<128x256xbf16>
  return %m : tensor<128x256xbf16>
}

// K = 4608: 144 scales per row, more than the partitions: the panel holds
// them in two blocks of columns (groups 0-127, then 128-143 on partitions
// 0-15), matmul q's from partition 16 * (q % 8) of block q / 8. That offset
// is no affine function of a loop's index, so the K loop is unrolled: nine
// MX matmuls, each with [16, 128] views of the panels.
// CHECK-LABEL: func.func @mx_long_k
// CHECK: nisa.copy {{.*}} : memref<128x128xf32, strided<[1024, 1], offset: ?>, #nisa.mem<psum>>, memref<128x128xui8, strided<[256, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.copy {{.*}} : memref<16x128xf32, strided<[1024, 1], offset: ?>, #nisa.mem<psum>>, memref<16x128xui8, strided<[256, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK-NOT: scf.for
// CHECK-COUNT-9: nisa.matmul {{.*}} scales {{.*}} : memref<128x4x128xf8E4M3FN, {{.*}}, memref<16x128xui8, strided<[256, 1], offset: ?>, #nisa.mem<sbuf>>, memref<16x128xui8, strided<[256, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK-NOT: nisa.matmul {{.*}} scales
func.func @mx_long_k(%a: tensor<128x4608xf8E4M3FN>, %w: tensor<128x4608xf8E4M3FN>, %sa: tensor<128x144xui8>, %sb: tensor<128x144xui8>) -> tensor<128x128xbf16> {
  %b = neuron.transpose %w, [1, 0] : tensor<128x4608xf8E4M3FN> -> tensor<4608x128xf8E4M3FN>
  %m = neuron.scaled_matmul %a, %b scales %sa, %sb : tensor<128x4608xf8E4M3FN>, tensor<4608x128xf8E4M3FN>, tensor<128x144xui8>, tensor<128x144xui8> -> tensor<128x128xbf16>
  return %m : tensor<128x128xbf16>
}
}
