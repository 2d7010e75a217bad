// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa | neuron-opt | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --nisa-allocate --nisa-insert-sync | FileCheck %s --check-prefix=SYNC

// cumsum along a 300-long dim of int64 (columns of 4): fp32 tiles (a
// casting DMA), the triangular matrix U = (m - k >= 0) and the carry
// selector E = (k == 127) from iotas; block 0 is one matmul, block 1 (in
// the loop) and the remainder of 44 rows add E^T carry into the same PSUM
// group.
// CHECK-LABEL: func.func @cumsum_int
// CHECK: nisa.iota {{.*}} {base = 0.000000e+00 : f64, channel_multiplier = -1.000000e+00 : f64, multipliers = array<f64: 1.000000e+00>}
// CHECK: nisa.tensor_scalar ge
// CHECK: nisa.iota {{.*}} {base = 0.000000e+00 : f64, channel_multiplier = 1.000000e+00 : f64, multipliers = array<f64: 0.000000e+00>}
// CHECK: nisa.tensor_scalar eq {{.*}}imm = 1.270000e+02
// CHECK: nisa.dma_copy {{.*}} : memref<128x1x4xi64, {{.*}}>, memref<128x1x4xf32, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} : memref<128x128xf32, {{.*}}>, memref<128x4xf32, {{.*}}>, memref<128x4xf32, {{.*}}#nisa.mem<psum>>
// CHECK-NOT: accumulate
// CHECK: nisa.copy
// CHECK: nisa.dma_copy {{.*}}engine = #nisa.engine<scalar>{{.*}} : memref<128x1x4xf32, {{.*}}>, memref<128x1x4xi64, {{.*}}>
// CHECK: nisa.matmul
// CHECK: nisa.matmul {{.*}} {accumulate}
// CHECK: nisa.dma_copy {{.*}} memref<44x1x4xi64
// CHECK: nisa.matmul {{.*}} memref<44x44xf32
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<128x44xf32
// SYNC-LABEL: func.func @cumsum_int
// SYNC: nisa.synchronized
func.func @cumsum_int(%x: tensor<300x4xi64>) -> tensor<300x4xi64> {
  %c = neuron.cumsum %x {dim = 0} : tensor<300x4xi64> -> tensor<300x4xi64>
  return %c : tensor<300x4xi64>
}

// Along the contiguous dim (position ids): rows stay on the partitions and
// every transfer is contiguous. Per block TensorE transposes x against the
// identity (x is the stationary operand), then scans x^T as the stationary
// against U; the eviction adds the running totals (a [rows, 1] column) and
// the block's last column becomes the next carry.
// CHECK-LABEL: func.func @cumsum_rows
// CHECK: nisa.tensor_scalar ge
// CHECK: nisa.tensor_scalar eq
// CHECK: nisa.dma_copy {{.*}} : memref<4x128xi64, strided<[300, 1], {{.*}}>>, memref<4x128xf32, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} : memref<4x128xf32, {{.*}}>, memref<4x4xf32, {{.*}}>, memref<128x4xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.copy
// CHECK: nisa.matmul {{.*}} : memref<128x4xf32, {{.*}}>, memref<128x128xf32, {{.*}}>, memref<4x128xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.copy {{.*}}#nisa.mem<psum>>, memref<4x128xf32
// CHECK: nisa.copy {{.*}} memref<4x1xf32
// CHECK: nisa.dma_copy {{.*}}engine = #nisa.engine<scalar>{{.*}} : memref<4x128xf32, {{.*}}>, memref<4x128xi64, strided<[300, 1]
// CHECK: nisa.tensor_scalar add {{.*}}#nisa.mem<psum>>, memref<4x128xf32, {{.*}}>, memref<4x1xf32
// CHECK: nisa.dma_copy {{.*}} memref<4x44xi64
// CHECK: nisa.tensor_scalar add {{.*}} memref<4x44xf32
func.func @cumsum_rows(%x: tensor<4x300xi64>) -> tensor<4x300xi64> {
  %c = neuron.cumsum %x {dim = 1} : tensor<4x300xi64> -> tensor<4x300xi64>
  return %c : tensor<4x300xi64>
}

// bf16 along a middle dim: TensorE takes bf16 operands (U copied to bf16),
// columns are whole inner rows of 8 for 2 outer indices.
// CHECK-LABEL: func.func @cumsum_bf16
// CHECK: nisa.copy {{.*}} : memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x128xbf16, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy {{.*}} : memref<5x2x8xbf16, {{.*}}>, memref<5x2x8xbf16, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}} : memref<5x5xbf16, {{.*}}>, memref<5x16xbf16, {{.*}}>, memref<5x16xf32, {{.*}}#nisa.mem<psum>>
// CHECK-NOT: nisa.matmul
// CHECK: return
func.func @cumsum_bf16(%x: tensor<2x5x8xbf16>) -> tensor<2x5x8xbf16> {
  %c = neuron.cumsum %x {dim = 1} : tensor<2x5x8xbf16> -> tensor<2x5x8xbf16>
  return %c : tensor<2x5x8xbf16>
}

// top-2 of 8: rows on partitions. A NaN loads as +inf, its column number
// shifted by -8 (largest first: ahead of an equal +inf); two rounds in a
// loop of reduce max -> values[:, r], eq, select, reduce min -> indices[:, r],
// eq against the column numbers, and the two selects that retire the
// winner; then picks below column 0 (NaNs) get their column back and NaN.
// CHECK-LABEL: func.func @topk
// CHECK: nisa.iota
// CHECK: nisa.memset {{.*}} 1.600000e+01
// CHECK: nisa.memset {{.*}} 0xFFF0000000000000
// CHECK: nisa.memset {{.*}} 0x7FF0000000000000
// CHECK: nisa.tensor_tensor subtract %[[INF:.*]], %[[INF]], %[[NAN:.*]] :
// CHECK: nisa.tensor_tensor ne
// CHECK: nisa.select
// CHECK: nisa.scalar_tensor_tensor multiply, add {{.*}} {engine = #nisa.engine<gpsimd>, imm = -8.000000e+00 : f64}
// CHECK: scf.for
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.tensor_scalar eq
// CHECK: nisa.select
// CHECK: nisa.tensor_reduce min
// CHECK: nisa.tensor_scalar eq
// CHECK: nisa.select
// CHECK: nisa.select {{.*}}engine = #nisa.engine<gpsimd>
// CHECK: }
// CHECK: nisa.tensor_scalar lt %{{[a-z_0-9]*}}, %{{[a-z_0-9]*}} : memref<6x2xf32
// CHECK: nisa.scalar_tensor_tensor multiply, add {{.*}} {engine = #nisa.engine<gpsimd>, imm = 8.000000e+00 : f64}
// CHECK: nisa.select
// CHECK: nisa.dma_copy {{.*}} : memref<6x2xf32, {{.*}}#nisa.mem<sbuf>>, memref<6x2xbf16
// CHECK: nisa.dma_copy {{.*}} : memref<6x2xf32, {{.*}}#nisa.mem<sbuf>>, memref<6x2xi64
func.func @topk(%x: tensor<6x8xbf16>) -> (tensor<6x2xbf16>, tensor<6x2xi64>) {
  %v, %i = neuron.topk %x {k = 2, largest = true} : tensor<6x8xbf16> -> tensor<6x2xbf16>, tensor<6x2xi64>
  return %v, %i : tensor<6x2xbf16>, tensor<6x2xi64>
}

// More rows than partitions, rows too long to fold: the tiles take two sets
// of working tiles in turn, so the second tile's rows load before the first
// tile's rounds; the last 44 rows after.
// CHECK-LABEL: func.func @topk_tiles
// CHECK: nisa.dma_copy {{.*}} : memref<128x300xbf16, {{.*}}>, memref<128x300xf32, {{.*}}#nisa.mem<sbuf>>
// CHECK-NOT: nisa.tensor_reduce
// CHECK: nisa.dma_copy {{.*}} : memref<128x300xbf16, {{.*}}>, memref<128x300xf32, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.dma_copy {{.*}} : memref<128x2xf32, {{.*}}#nisa.mem<sbuf>>, memref<128x2xi64
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.dma_copy {{.*}} : memref<44x300xbf16, {{.*}}>, memref<44x300xf32, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.dma_copy {{.*}} : memref<44x2xf32, {{.*}}#nisa.mem<sbuf>>, memref<44x2xi64
func.func @topk_tiles(%x: tensor<300x300xbf16>) -> (tensor<300x2xbf16>, tensor<300x2xi64>) {
  %v, %i = neuron.topk %x {k = 2, largest = true} : tensor<300x300xbf16> -> tensor<300x2xbf16>, tensor<300x2xi64>
  return %v, %i : tensor<300x2xbf16>, tensor<300x2xi64>
}

// Short rows fold two to a partition for the first 256: one load of
// [128, 2 * 8], the reductions along each row as trees of tensor_tensor
// (widths 4, 2, 1; the last onto the round's column), the round's column
// read along the row (stride 0), the [P, 8] constants read for each row
// (stride 0, a run-time stride in the types); then the last 44 rows one
// to a partition.
// CHECK-LABEL: func.func @topk_folded
// CHECK: nisa.dma_copy {{.*}} : memref<128x16xbf16, {{.*}}>, memref<128x16xf32, #nisa.mem<sbuf>>
// CHECK: nisa.scalar_tensor_tensor multiply, add {{.*}} : memref<128x2x8xf32, strided<[16, 8, 1]{{.*}}>, memref<128x2x8xf32, strided<[8, ?, 1]{{.*}}>, memref<128x2x8xf32, strided<[16, 8, 1]
// CHECK: scf.for
// CHECK: nisa.tensor_tensor max {{.*}} : memref<128x2x4xf32, strided<[16, 8, 1]{{.*}}, memref<128x2x4xf32, strided<[16, 8, 1]{{.*}}, memref<128x2x4xf32, strided<[16, 4, 1]
// CHECK: nisa.tensor_tensor max {{.*}} : memref<128x2x2xf32
// CHECK: nisa.tensor_tensor max {{.*}} : memref<128x2x1xf32, {{.*}}, memref<128x2x1xf32, {{.*}}, memref<128x2x1xf32, strided<[4, 2, 1]
// CHECK: nisa.tensor_tensor eq {{.*}} : memref<128x2x8xf32, strided<[16, 8, 1]{{.*}}, memref<128x2x8xf32, strided<[4, 2, ?]
// CHECK: nisa.select
// CHECK-COUNT-3: nisa.tensor_tensor min
// CHECK: nisa.tensor_tensor eq
// CHECK: nisa.select
// CHECK: nisa.select {{.*}}engine = #nisa.engine<gpsimd>
// CHECK: }
// CHECK: nisa.dma_copy {{.*}} : memref<128x4xf32, #nisa.mem<sbuf>>, memref<128x4xbf16
// CHECK: nisa.dma_copy {{.*}} : memref<128x4xf32, #nisa.mem<sbuf>>, memref<128x4xi64
// CHECK: nisa.dma_copy {{.*}} : memref<44x8xbf16, {{.*}}>, memref<44x8xf32
// CHECK: nisa.tensor_reduce max
func.func @topk_folded(%x: tensor<300x8xbf16>) -> (tensor<300x2xbf16>, tensor<300x2xi64>) {
  %v, %i = neuron.topk %x {k = 2, largest = true} : tensor<300x8xbf16> -> tensor<300x2xbf16>, tensor<300x2xi64>
  return %v, %i : tensor<300x2xbf16>, tensor<300x2xi64>
}

// smallest first: min reductions, +inf for taken elements.
// CHECK-LABEL: func.func @sort_ascending
// CHECK: nisa.memset {{.*}} 0x7FF0000000000000
// CHECK: nisa.tensor_reduce min
func.func @sort_ascending(%x: tensor<3x4xf32>) -> tensor<3x4xi64> {
  %v, %i = neuron.topk %x {k = 4, largest = false} : tensor<3x4xf32> -> tensor<3x4xf32>, tensor<3x4xi64>
  return %i : tensor<3x4xi64>
}
