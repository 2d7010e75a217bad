// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse --nisa-allocate | FileCheck %s --check-prefix=ALLOC

// torch._grouped_mm of rows in groups (lower-grouped-matmul.mlir has the
// kernel for K of whole tiles).
// With K not whole tiles, each group is the blocked GEMM over a run-time
// row count: its rows and outputs addressed from its start, its weights
// from its index, loaded once for all its row blocks when it has rows.

// CHECK-LABEL: func.func @narrow_k(
// CHECK: arith.floordivsi %arg4, %c512 : index
// CHECK: nisa.matmul
// CHECK: %[[N1:.*]] = arith.subi %arg5, %arg4 : index
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c4096]
// CHECK: arith.floordivsi %[[N1]], %c512 : index
// CHECK: nisa.matmul

func.func @narrow_k(%x: tensor<300x64xbf16>, %w: tensor<2x64x64xbf16>, %offs: tensor<2xi32>,
                    %e0: index {neuron.size = {name = "offs__end0", min = 0 : i64, max = 300 : i64}},
                    %e1: index {neuron.size = {name = "offs__end1", min = 0 : i64, max = 300 : i64}}) -> tensor<300x64xbf16> {
  %y = neuron.grouped_matmul %x, %w ends(%e0, %e1) : tensor<300x64xbf16>, tensor<2x64x64xbf16> -> tensor<300x64xbf16>
  return %y : tensor<300x64xbf16>
}

// With more rows than two groups' x^T fit in SBUF (4096 x 2048: 128 KiB a
// partition each), the kernel for K of whole tiles still: each group's rows
// tile holds 2944 rows, and a larger group goes through its rows in chunks,
// the first what whole chunks leave, then a loop over whole chunks, each
// loaded into the group's tile and computed.
// CHECK-LABEL: func.func @many_rows(
// CHECK-COUNT-2: memref.alloc() : memref<128x47104xbf16, #nisa.mem<sbuf>>
// CHECK: %[[DONE:.*]] = arith.muli %arg{{[0-9]+}}, %c2944 : index
// CHECK-NEXT: %[[ROW:.*]] = arith.addi %{{.*}}, %[[DONE]] : index
// CHECK-NEXT: %[[AT:.*]] = arith.muli %[[ROW]], %c2048 : index
// CHECK-NEXT: %[[TO:.*]] = memref.reinterpret_cast %alloc_0 to offset: [%c0], sizes: [128, 16, %c2944]
// CHECK-NEXT: %[[FROM:.*]] = memref.reinterpret_cast %arg0 to offset: [%[[AT]]], sizes: [128, 16, %c2944]
// CHECK-NEXT: nisa.dma_copy %[[FROM]], %[[TO]]
// CHECK: nisa.matmul
// ALLOC-LABEL: func.func @many_rows(
// ALLOC: nisa.address

func.func @many_rows(%x: tensor<4096x2048xbf16>, %w: tensor<2x2048x64xbf16>, %offs: tensor<2xi32>,
                     %e0: index {neuron.size = {name = "offs__end0", min = 0 : i64, max = 4096 : i64}},
                     %e1: index {neuron.size = {name = "offs__end1", min = 0 : i64, max = 4096 : i64}}) -> tensor<4096x64xbf16> {
  %y = neuron.grouped_matmul %x, %w ends(%e0, %e1) : tensor<4096x2048xbf16>, tensor<2x2048x64xbf16> -> tensor<4096x64xbf16>
  return %y : tensor<4096x64xbf16>
}

// Where a chunk would hold fewer rows than a group has on average (4096 rows
// over 2 groups, 2048 -> 1024: three panels of weights leave room for 1280
// rows), a group would wait for the load of most of its chunks: the blocked
// GEMM, which hides its loads.
// CHECK-LABEL: func.func @large_groups(
// CHECK-NOT: nisa.matmul
// CHECK: arith.floordivsi %arg4, %c512 : index
// CHECK: nisa.matmul

func.func @large_groups(%x: tensor<4096x2048xbf16>, %w: tensor<2x2048x1024xbf16>, %offs: tensor<2xi32>,
                        %e0: index {neuron.size = {name = "offs__end0", min = 0 : i64, max = 4096 : i64}},
                        %e1: index {neuron.size = {name = "offs__end1", min = 0 : i64, max = 4096 : i64}}) -> tensor<4096x1024xbf16> {
  %y = neuron.grouped_matmul %x, %w ends(%e0, %e1) : tensor<4096x2048xbf16>, tensor<2x2048x1024xbf16> -> tensor<4096x1024xbf16>
  return %y : tensor<4096x1024xbf16>
}
