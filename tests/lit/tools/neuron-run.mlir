// RUN: neuron-run %s | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn3 | neuron-run --target=trn3 - | FileCheck %s --check-prefix=NISA
// RUN: not neuron-run --target=trn9 %s 2>&1 | FileCheck %s --check-prefix=BADTARGET
// RUN: not neuron-run %S/Inputs/malformed.mlir 2>&1 | FileCheck %s --check-prefix=BAD

// A neuron module is lowered, run with random inputs and timed.
// CHECK: mlp on trn2: {{[0-9]+}} static / {{[0-9]+}} dynamic instructions
// CHECK: modeled device time: {{[0-9.]+}} us, bound by {{[a-z_]+}}
// CHECK: matmul: 2.1{{.*}} FLOP
// CHECK: tensor {{[0-9.]+}} {{[0-9.]+}}%
// CHECK: busiest source lines
// CHECK-NEXT: neuron-run.mlir:{{[0-9]+}}

// A module neuron-opt already lowered runs as it is.
// NISA: mlp on trn3:
// NISA: modeled device time:

// BADTARGET: error: unknown target 'trn9'
// BAD: malformed.mlir:3:{{[0-9]+}}: error:
func.func @mlp(%x: tensor<128x64xbf16>, %w: tensor<64x128xbf16>) -> tensor<128x128xbf16> {
  %m = neuron.matmul %x, %w : tensor<128x64xbf16>, tensor<64x128xbf16> -> tensor<128x128xbf16>
  %g = neuron.unary gelu %m : tensor<128x128xbf16> -> tensor<128x128xbf16>
  return %g : tensor<128x128xbf16>
}
