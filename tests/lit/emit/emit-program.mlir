// RUN: neuron-opt %s --neuron-lower-to-nisa=free-tile-bytes=256 --nisa-allocate --nisa-insert-sync --mlir-print-debuginfo | neuron-translate --emit-program | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=free-tile-bytes=256 --nisa-allocate | neuron-translate --emit-program | FileCheck %s --check-prefix=DERIVED

// The program lists inputs then outputs, keeps loops as loops with affine
// view offsets, places tiles at the addresses nisa-allocate chose and turns
// nisa.waits ids into instruction indices. Each stream rotates over four
// slots of its tile: three loads run ahead before the loop, whose body
// loads three steps ahead of the step it computes.
// CHECK: "body":[{"dst":{"buf":[[IN:[0-9]+]],"offset":{"const":0,"terms":[]},"shape":[128,64],"strides":[256,1]},"engine":"sync",{{.*}}"op":"dma_copy","src":{"buf":0,"offset":{"const":0,"terms":[]},"shape":[128,64],"strides":[64,1]}}
// CHECK-SAME: {"dst":{"buf":[[IN]],"offset":{"const":64,"terms":[]}
// CHECK-SAME: {"dst":{"buf":[[IN]],"offset":{"const":128,"terms":[]}
// CHECK-SAME: {"body":[{"dst":{"buf":[[IN]],"offset":{"const":192,"terms":[]},"shape":[128,64],"strides":[256,1]},"engine":"sync",{{.*}}"src":{"buf":0,"offset":{"const":24576,"terms":{{\[\[}}0,32768]]},"shape":[128,64],"strides":[64,1]},"waits":[13]}
// CHECK-SAME: "engine":"scalar","func":"exp","loc":0,"op":"activation","scale":1.0,"src":{"buf":[[IN]],"offset":{"const":0,"terms":[]},"shape":[128,64],"strides":[256,1]},"waits":[0,5,6]}
// CHECK-SAME: "count":3,"loop":0
// CHECK-SAME: "buffers":[{"dtype":"f32","id":0,"kind":"input","name":"in0","shape":[2048,64],"space":"hbm"},{"dtype":"f32","id":1,"kind":"output","name":"out0","shape":[2048,64],"space":"hbm"},{"address":0,"dtype":"f32","id":2,"kind":"scratch","name":"tile2","shape":[128,256],"space":"sbuf"},{"address":1024,"dtype":"f32","id":3,"kind":"scratch","name":"tile3","shape":[128,256],"space":"sbuf"}]
// CHECK-SAME: "format":"torchneuron-kernel-program","inputs":[0]
// CHECK-SAME: "locations":["{{.*}}emit-program.mlir:25"]
// CHECK-SAME: "name":"exp","outputs":[1],"sync":"explicit","target":"trn2","version":1

// Without nisa-insert-sync the program leaves synchronisation to the
// runtime's data-derived dependences.
// DERIVED-NOT: "waits"
// DERIVED-NOT: "sync":"explicit"
func.func @exp(%x: tensor<2048x64xf32>) -> tensor<2048x64xf32> {
  %e = neuron.unary exp %x : tensor<2048x64xf32> -> tensor<2048x64xf32>
  return %e : tensor<2048x64xf32>
}
