// RUN: neuron-opt %s --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s
// RUN: neuron-run %s | FileCheck %s --check-prefix=EXEC

// n_gather (NKI's nc_n_gather) reversing each partition's 8 elements by
// indices an iota counts down: the emitter writes it from its ODS operand
// names, on GpSimd (its only engine).
// CHECK: "base":7.0,{{.*}}"dst":{"buf":[[IDX:[0-9]+]],{{.*}}"multipliers":[-1.0],"op":"iota"
// CHECK-SAME: "dst":{"buf":{{[0-9]+}},"offset":{"const":0,"terms":[]},"shape":[128,8],"strides":[8,1]},"engine":"gpsimd","indices":{"buf":[[IDX]],{{.*}}"op":"n_gather","src":{"buf":[[X:[0-9]+]],"offset":{"const":0,"terms":[]},"shape":[128,2,4],"strides":[8,4,1]}

// EXEC: reverse on trn2: 4 static / 4 dynamic instructions
func.func @reverse(%x: memref<128x2x4xbf16>, %out: memref<128x8xbf16>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %t = memref.alloc() : memref<128x2x4xbf16, #nisa.mem<sbuf>>
  %i = memref.alloc() : memref<128x8xi32, #nisa.mem<sbuf>>
  %r = memref.alloc() : memref<128x8xbf16, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %t : memref<128x2x4xbf16>, memref<128x2x4xbf16, #nisa.mem<sbuf>>
  nisa.iota %i {base = 7.0 : f64, channel_multiplier = 0.0 : f64, multipliers = array<f64: -1.0>} : memref<128x8xi32, #nisa.mem<sbuf>>
  nisa.n_gather %t[%i], %r : memref<128x2x4xbf16, #nisa.mem<sbuf>>, memref<128x8xi32, #nisa.mem<sbuf>>, memref<128x8xbf16, #nisa.mem<sbuf>>
  nisa.dma_copy %r, %out : memref<128x8xbf16, #nisa.mem<sbuf>>, memref<128x8xbf16>
  return
}
