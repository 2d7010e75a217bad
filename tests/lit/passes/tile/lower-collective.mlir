// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --nisa-allocate --nisa-insert-sync | FileCheck %s --check-prefix=SYNC
// RUN: neuron-opt %s --neuron-lower-to-nisa --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// A row-parallel matmul's all_reduce between two matmuls: one collective
// instruction from the first product's HBM buffer to the reduced one.
// CHECK-LABEL: func.func @tp
// CHECK: nisa.matmul
// CHECK: nisa.collective all_reduce %{{.*}}, %{{.*}} {group = "0", op = #nisa<alu add>, ranks = array<i64: 0, 1>} : memref<64x64xf32, strided<[64, 1], offset: ?>>, memref<64x64xf32, strided<[64, 1], offset: ?>>
// CHECK: nisa.matmul

// The collective waits for the store of its input; the second matmul does
// not wait for the collective (it overlaps it); the add's load of the
// reduced tensor does.
// SYNC: nisa.dma_copy {{.*}}engine = #nisa.engine<scalar>, nisa.id = [[STORE:[0-9]+]] : i64,
// SYNC-NOT: nisa.id
// SYNC: nisa.collective all_reduce {{.*}}nisa.id = [[COLL:[0-9]+]] : i64, nisa.waits = array<i64: [[STORE]]>
// SYNC-NOT: nisa.waits = array<i64:{{[0-9, ]*}} [[COLL]]{{[,>]}}
// SYNC: nisa.matmul
// SYNC-NOT: nisa.waits = array<i64:{{[0-9, ]*}} [[COLL]]{{[,>]}}
// SYNC: nisa.dma_copy {{.*}}nisa.waits = array<i64:{{[0-9, ]*}} [[COLL]]{{[,>]}}

// The program names the group once, with its ranks.
// PROGRAM: "body":[{{.*}}{"alu_op":"add","dst":{{.*}}"engine":"gpsimd","group":0,"kind":"all_reduce",{{.*}}"op":"collective","src":
// PROGRAM-SAME: "groups":[{"name":"0","ranks":[0,1]}]
func.func @tp(%x: tensor<64x64xf32>, %w1: tensor<64x64xf32>, %w2: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %y = neuron.matmul %x, %w1 : tensor<64x64xf32>, tensor<64x64xf32> -> tensor<64x64xf32>
  %z = neuron.collective all_reduce %y {group = "0", ranks = array<i64: 0, 1>} : tensor<64x64xf32> -> tensor<64x64xf32>
  %u = neuron.matmul %x, %w2 : tensor<64x64xf32>, tensor<64x64xf32> -> tensor<64x64xf32>
  %o = neuron.binary add %z, %u : tensor<64x64xf32>, tensor<64x64xf32> -> tensor<64x64xf32>
  return %o : tensor<64x64xf32>
}
