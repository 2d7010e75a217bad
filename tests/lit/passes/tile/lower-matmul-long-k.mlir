// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=gemm-panel-sbuf-percent=90 --canonicalize --cse | FileCheck %s --check-prefix=WIDE

// An MLP's down projection (K = 14336): two A^T panels of an M block of
// one 128-row tile already take 57 KiB a partition, so within the default
// half of SBUF the block would be one tile and B (117 MB) would stream
// again for every 128 rows. The panels then may take three quarters of
// SBUF: two M tiles a block, 2 x 112 K tiles x 256 columns, half B's
// traffic (benchmark: 53% -> 89% of the TensorE peak, trn2). A budget that
// fits more keeps its own choice (three tiles at 90%).

// CHECK-LABEL: func.func @down_projection
// CHECK: memref.alloc() : memref<128x57344xbf16, #nisa.mem<sbuf>>
// WIDE-LABEL: func.func @down_projection
// WIDE: memref.alloc() : memref<128x86016xbf16, #nisa.mem<sbuf>>
func.func @down_projection(%a: tensor<2048x14336xbf16>, %w: tensor<14336x4096xbf16>) -> tensor<2048x4096xbf16> {
  %y = neuron.matmul %a, %w : tensor<2048x14336xbf16>, tensor<14336x4096xbf16> -> tensor<2048x4096xbf16>
  return %y : tensor<2048x4096xbf16>
}
