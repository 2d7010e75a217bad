// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// Causal prefill over a prompt of a run-time length s0 (issue #16): 4 query
// heads over 2 key heads (GQA), one program for every length. The causal
// bias of a diagonal unit is built once (kMaskScale * (p - j), min 0); the
// first 8 query tiles are loops of zero or one iteration whose rows are
// min(s0 - 128 t, 128); later full tiles run in a loop counted at run time,
// streaming their keys past the resident 1024 with an iota mask; the short
// last tile (s0 mod 128 rows) runs when it is past the first 8.

// CHECK-LABEL: func.func @prefill(
// CHECK: nisa.iota %{{.*}} {base = 0.000000e+00 : f64, channel_multiplier = 0x4130000000000000 : f64, multipliers = array<f64: 0xC130000000000000>} : memref<128x128xf32
// CHECK: nisa.tensor_scalar min
// CHECK-DAG: %[[FULL:.*]] = arith.floordivsi %arg4, %c128 : index
// CHECK-DAG: %[[REST:.*]] = arith.remsi %arg4, %c128 : index
// CHECK-DAG: %[[TILES:.*]] = arith.ceildivsi %arg4, %c128 : index
// A prefix tile: its rows a size expression, the diagonal unit's bias added
// to the scores in PSUM by an accumulating matmul; its steps' halves in loops
// of their own (zero or one iteration), so that the next step's are issued
// between them.
// CHECK: %[[ROWS:.*]] = arith.minsi %arg4, %c128 : index
// CHECK: scf.for
// CHECK: nisa.matmul {{.*}} : memref<64x?xf32{{.*}}>, memref<64x?xf32{{.*}}>, memref<?x?xf32{{.*}}psum
// CHECK: nisa.matmul {{.*}} {accumulate}
// CHECK-NEXT: nisa.tensor_reduce max
// CHECK: scf.for
// CHECK: nisa.activation exp
// The full tiles past the first 8, counted at run time, their streamed keys
// masked by an iota of q - kv.
// CHECK: scf.for
// CHECK: nisa.iota %{{.*}} offset %{{.*}} : memref<128x512xf32
// CHECK: nisa.scalar_tensor_tensor min, add
// The short last tile: rows s0 mod 128.
// CHECK: nisa.dma_copy {{.*}} : memref<64x?xf32, strided<[1, 64], offset: ?>>, memref<64x?xf32
// CHECK: nisa.tensor_scalar divide {{.*}} : memref<?x64xf32

// PROGRAM: "count":"(min(max((floordiv(s0,128)+-7),0),1)*min(mod(s0,128),1))"
// PROGRAM: "count":"max((floordiv(s0,128)-8),0)"
// PROGRAM: "params":[{"min":1,"name":"s0"}]
func.func @prefill(%q: tensor<1x4x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 4, s0, 64)>}, %k: tensor<1x2x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 2, s0, 64)>}, %v: tensor<1x2x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 2, s0, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<1x4x?x64xf32> {neuron.dims = affine_map<()[s0] -> (1, 4, s0, 64)>}) {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<1> : tensor<1x1x1x1xi8>, scale = 1.250000e-01 : f64} : tensor<1x4x?x64xf32>, tensor<1x2x?x64xf32>, tensor<1x2x?x64xf32> -> tensor<1x4x?x64xf32>, tensor<1x4x?xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x4x?x64xf32>
}
