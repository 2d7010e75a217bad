// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// all_gather and reduce_scatter on dim 0; a max reduction.
// CHECK-LABEL: func.func @gather_scatter
// CHECK: nisa.collective all_gather {{.*}} : memref<4x8xbf16, {{.*}}>, memref<8x8xbf16, {{.*}}>
// CHECK: nisa.collective reduce_scatter {{.*}}op = #nisa<alu max>{{.*}} : memref<8x8xbf16, {{.*}}>, memref<4x8xbf16, {{.*}}>
func.func @gather_scatter(%x: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %g = neuron.collective all_gather %x {group = "1", ranks = array<i64: 2, 3>} : tensor<4x8xbf16> -> tensor<8x8xbf16>
  %s = neuron.collective reduce_scatter %g {group = "1", ranks = array<i64: 2, 3>, reduce = #neuron<reduce_fn max>} : tensor<8x8xbf16> -> tensor<4x8xbf16>
  return %s : tensor<4x8xbf16>
}

// reduce_scatter's max is its alu_op; all_gather has none. The group's
// global ranks (here 2 and 3 of the instance) are the program's group 0.
// PROGRAM: {"dst":{"buf":[[GATHERED:[0-9]+]],{{.*}}"shape":[8,8],{{.*}}"engine":"gpsimd","group":0,"kind":"all_gather",{{.*}}"op":"collective","src":{"buf":0,
// PROGRAM-SAME: {"alu_op":"max","dst":{"buf":1,{{.*}}"shape":[4,8],{{.*}}"group":0,"kind":"reduce_scatter",{{.*}}"src":{"buf":[[GATHERED]],{{.*}}"shape":[8,8]
// PROGRAM-SAME: "groups":[{"name":"1","ranks":[2,3]}]
