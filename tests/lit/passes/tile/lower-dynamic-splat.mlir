// RUN: neuron-opt %s --canonicalize --neuron-fuse-elementwise --neuron-lower-to-nisa | FileCheck %s

// A scalar of a dynamic op is a static splat broadcast to the dynamic sizes
// (constants have static sizes; canonicalization keeps that broadcast). It
// is still a splat: fused as an immediate (here 0.5, not a load and not 0),
// and the broadcast outside the group needs no buffer.

// CHECK-LABEL: func.func @scale(
// CHECK-NOT: not size-generic
// CHECK: scf.for
// CHECK: nisa.tensor_scalar multiply {{.*}}imm = 5.000000e-01
// CHECK: nisa.activation exp

func.func @scale(%x: tensor<?x64xf32> {neuron.dims = affine_map<()[s0] -> (s0, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) -> (tensor<?x64xf32> {neuron.dims = affine_map<()[s0] -> (s0, 64)>}) {
  %h = neuron.constant dense<0.5> : tensor<1x64xf32>
  %hb = neuron.broadcast %h : tensor<1x64xf32> -> tensor<?x64xf32>
  %y = neuron.binary mul %x, %hb : tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
  %e = neuron.unary exp %y : tensor<?x64xf32> -> tensor<?x64xf32>
  return %e : tensor<?x64xf32>
}
