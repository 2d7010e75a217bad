// RUN: neuron-opt %s --neuron-lower-to-nisa --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s
// RUN: neuron-run %s | FileCheck %s --check-prefix=EXEC

// A dropout-style mask: random numbers times the input. The seed (a graph
// input) reaches every partition through one broadcasting DMA (partition
// stride 0); rand numbers elements p * 3 + i of [128, 3] on GpSimd under
// that key, in stream 1, after the seed's load.
// CHECK: {"body":[{"dst":{"buf":[[KEY:[0-9]+]],{{.*}}"shape":[128,2],"strides":[2,1]},"engine":"sync",{{.*}}"op":"dma_copy","src":{"buf":0,{{.*}}"shape":[128,2],"strides":[0,1]}}
// CHECK-SAME: {"channel_multiplier":3.0,"dst":{{.*}},"engine":"gpsimd",{{.*}}"multipliers":[1.0],"offset":{"const":0,"terms":[]},"op":"rand","seed":{"buf":[[KEY]],{{.*}}"shape":[128,2],{{.*}}"stream":1,"waits":[0]}

// It runs, and the race checker accepts the compiler's waits.
// EXEC: dropout_mask on trn2: 7 static / 7 dynamic instructions
// EXEC: gpsimd
func.func @dropout_mask(%seed: tensor<2xi32>, %x: tensor<4x96xf32>) -> tensor<4x96xf32> {
  %r = neuron.rand %seed {stream = 1} : tensor<2xi32> -> tensor<4x96xf32>
  %y = neuron.binary mul %r, %x : tensor<4x96xf32>, tensor<4x96xf32> -> tensor<4x96xf32>
  return %y : tensor<4x96xf32>
}
