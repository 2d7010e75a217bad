// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | grep -c "nisa.matmul" | FileCheck %s --check-prefix=MATMULS
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | grep -c "nisa.select" | FileCheck %s --check-prefix=SELECTS

// Causal blocks of a 256-row sequence: key unit 0 is kept by query tiles 0
// (partial) and 1 (full); key unit 1 by query tile 1 only (partial); the
// masked (tile 0, unit 1) step is skipped. Per kept step six matmuls (S,
// dP, dV, dK, dS^T, dQ): 18. mask_mod runs on the 2 partial steps.
// MATMULS: 18
// SELECTS: 2

// CHECK-LABEL: func.func @causal_backward
// K rows, K^T and V^T; then Q, Q^T, dO, dO^T and O of the query head.
// CHECK-COUNT-3: nisa.dma_copy
// CHECK-COUNT-5: nisa.dma_copy
// Per query tile: -lse, and delta = rowsum(dO * O).
// CHECK: nisa.tensor_tensor multiply
// CHECK: nisa.tensor_reduce add
// CHECK: nisa.tensor_tensor multiply
// CHECK: nisa.tensor_reduce add
// Steps run scores two steps ahead of their gradients, and dQ one step
// behind those. Step 0 (key unit 0, query tile 0: partial): S, scaled into
// SBUF for the mask, P, dP, dS = P (dP - delta).
// CHECK: nisa.matmul
// CHECK: nisa.activation identity
// CHECK: nisa.select
// CHECK: nisa.activation exp
// CHECK: nisa.matmul
// CHECK: nisa.scalar_tensor_tensor subtract, multiply
// Step 1 (key unit 0, query tile 1: full, no mask): exp reads S from PSUM
// and applies the scale itself.
// CHECK: nisa.matmul
// CHECK-NOT: nisa.select
// CHECK-NOT: nisa.activation identity
// CHECK: nisa.activation exp {{.*}} {scale = 1.250000e-01
// CHECK: nisa.scalar_tensor_tensor subtract, multiply
// Step 2 (key unit 1, query tile 1: partial) before step 0's gradients.
// CHECK: nisa.select
// CHECK: nisa.scalar_tensor_tensor subtract, multiply
// Step 0's gradients: dV and dK start their PSUM sums (no accumulate), then
// dS^T, copied for its dQ.
// CHECK-NOT: accumulate
// CHECK: nisa.copy
// Step 1's gradients: dV and dK accumulate; then step 0's dQ.
// CHECK: nisa.matmul {{.*}}accumulate
// CHECK: nisa.matmul {{.*}}accumulate
// CHECK: nisa.copy
// CHECK: nisa.matmul
// Step 2's gradients start key unit 1's sums; then the dQ of steps 1 and 2.
// CHECK-NOT: accumulate
// CHECK: nisa.copy
// CHECK-COUNT-2: nisa.matmul
// CHECK-NOT: accumulate

func.func @causal_backward(%q: tensor<1x1x256x64xf32>, %k: tensor<1x1x256x64xf32>, %v: tensor<1x1x256x64xf32>, %o: tensor<1x1x256x64xf32>, %l: tensor<1x1x256xf32>, %go: tensor<1x1x256x64xf32>) -> (tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>) {
  %dq, %dk, %dv = neuron.flex_attention_backward %q, %k, %v, %o, %l, %go {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256xf32>, tensor<1x1x256x64xf32> -> tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } score_grad {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %g: tensor<f32>):
      neuron.yield %g : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %dq, %dk, %dv : tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>
}
