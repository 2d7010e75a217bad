// RUN: neuron-opt %s --neuron-fuse-elementwise --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s
// RUN: neuron-opt %s --neuron-fuse-elementwise --neuron-lower-to-nisa --canonicalize --cse --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s --check-prefix=PROGRAM

// A softmax over rows whose count (2 * s0) is known at run time (issue #16):
// one size-generic program. The size argument comes last; the row count is
// arith on it; tiles are [128, ...] whatever the sizes. The full 128-row
// steps run as the static pipeline does (loads of the first three steps,
// groups of four steps in a loop, the steps left in loops of zero or one
// iteration); the last rows mod 128 are one step whose DMAs move only them.

// CHECK-LABEL: func.func @softmax(
// CHECK-SAME: %arg0: memref<?x64xf32> {neuron.dims = affine_map<()[s0] -> (s0 * 2, 64)>}, %arg1: memref<?x64xf32> {neuron.dims = affine_map<()[s0] -> (s0 * 2, 64)>}, %arg2: index {neuron.size = {max = 2048 : i64, min = 1 : i64, name = "s0"}})
// CHECK: %[[ROWS:.*]] = arith.muli %arg2, %c2 : index
// CHECK-NOT: memref.alloc({{.*}}) : {{.*}}sbuf
// CHECK: memref.alloc() : memref<128x256xf32, #nisa.mem<sbuf>>
// CHECK: %[[FULL:.*]] = arith.floordivsi %[[ROWS]], %c128 : index
// CHECK: %[[MAX0:.*]] = arith.maxsi %[[FULL]], %c0
// CHECK: %[[ONCE0:.*]] = arith.minsi %[[MAX0]], %c1
// CHECK: scf.for %{{.*}} = %c0 to %[[ONCE0]] step %c1 {
// CHECK: %[[STEADY:.*]] = arith.subi %[[FULL]], %c3
// CHECK: %[[STEADY0:.*]] = arith.maxsi %[[STEADY]], %c0
// CHECK: %[[GROUPS:.*]] = arith.floordivsi %[[STEADY0]], %c4
// CHECK: scf.for %{{.*}} = %c0 to %[[GROUPS]] step %c1 {
// CHECK-COUNT-4: nisa.activation exp
// CHECK: }
// CHECK: %[[REM:.*]] = arith.remsi %[[ROWS]], %c128 : index
// CHECK: %[[LAST:.*]] = arith.minsi %{{.*}}, %c1
// CHECK: scf.for %{{.*}} = %c0 to %[[LAST]] step %c1 {
// CHECK: memref.reinterpret_cast %alloc{{.*}} sizes: [%[[REM]], 64]
// CHECK: memref.reinterpret_cast %arg0 to offset: [%{{.*}}], sizes: [%[[REM]], 64], strides: [64, 1]
// CHECK: nisa.dma_copy
// CHECK: nisa.activation exp {{.*}} memref<128x64xf32
// CHECK: memref.reinterpret_cast %arg1 to offset: [%{{.*}}], sizes: [%[[REM]], 64], strides: [64, 1]

// The program: its params, HBM buffers shaped by them, loop counts and the
// last step's views as size expressions; the sizes' arith is no instruction.
// PROGRAM: "count":"floordiv(max((floordiv((s0*2),128)-3),0),4)"
// PROGRAM: "shape":["mod((s0*2),128)",64],"strides":[256,1]},"engine":"sync"
// PROGRAM-SAME: "src":{"buf":0,"offset":{"const":"(((s0*2)-mod((s0*2),128))*64)","terms":[]},"shape":["mod((s0*2),128)",64]
// PROGRAM: "count":"min(max(mod((s0*2),128),0),1)"
// PROGRAM: "buffers":[{"dtype":"f32","id":0,"kind":"input","name":"in0","shape":["(s0*2)",64],"space":"hbm"},{"dtype":"f32","id":1,"kind":"output","name":"out0","shape":["(s0*2)",64]
// PROGRAM: "params":[{"max":2048,"min":1,"name":"s0"}]

func.func @softmax(%x: tensor<?x64xf32> {neuron.dims = affine_map<()[s0] -> (s0 * 2, 64)>}, %n: index {neuron.size = {name = "s0", min = 1 : i64, max = 2048 : i64}}) -> (tensor<?x64xf32> {neuron.dims = affine_map<()[s0] -> (s0 * 2, 64)>}) {
  %m = neuron.reduce max %x {count = 1} : tensor<?x64xf32> -> tensor<?xf32>
  %mr = neuron.reshape %m : tensor<?xf32> -> tensor<?x1xf32>
  %mb = neuron.broadcast %mr : tensor<?x1xf32> -> tensor<?x64xf32>
  %d = neuron.binary sub %x, %mb : tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
  %e = neuron.unary exp %d : tensor<?x64xf32> -> tensor<?x64xf32>
  %s = neuron.reduce sum %e {count = 1} : tensor<?x64xf32> -> tensor<?xf32>
  %sr = neuron.reshape %s : tensor<?xf32> -> tensor<?x1xf32>
  %sb = neuron.broadcast %sr : tensor<?x1xf32> -> tensor<?x64xf32>
  %y = neuron.binary div %e, %sb : tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
  return %y : tensor<?x64xf32>
}
