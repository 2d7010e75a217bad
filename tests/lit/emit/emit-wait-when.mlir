// RUN: neuron-opt %s --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s

!p = memref<128x1024xf32, #nisa.mem<sbuf>>

// A size-generic kernel's wait that holds at some sizes only (issue #16) is
// written {"on": instruction, "when": size expression}: the read of slot
// mod(s0, 2) waits for the write of slot 1 where s0 is odd.
// CHECK: "waits":[{"on":0,"when":"0 - max(2048*mod(s0, 2) + (-4096), (-2048)*mod(s0, 2))"}]
// CHECK: "params":[{"min":1,"name":"s0"}]
func.func @slot(%x: memref<128x512xf32>, %y: memref<128x512xf32>, %n: index {neuron.size = {min = 1 : i64, name = "s0"}}) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %c2 = arith.constant 2 : index
  %c512 = arith.constant 512 : index
  %p = memref.alloc() {nisa.address = 0 : i64} : !p
  %s1 = memref.reinterpret_cast %p to offset: [512], sizes: [128, 512], strides: [1024, 1] : !p to memref<128x512xf32, strided<[1024, 1], offset: 512>, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %s1 : memref<128x512xf32>, memref<128x512xf32, strided<[1024, 1], offset: 512>, #nisa.mem<sbuf>>
  %slot = arith.remsi %n, %c2 : index
  %at = arith.muli %slot, %c512 : index
  %sv = memref.reinterpret_cast %p to offset: [%at], sizes: [128, 512], strides: [1024, 1] : !p to memref<128x512xf32, strided<[1024, 1], offset: ?>, #nisa.mem<sbuf>>
  nisa.dma_copy %sv, %y : memref<128x512xf32, strided<[1024, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x512xf32>
  return
}
