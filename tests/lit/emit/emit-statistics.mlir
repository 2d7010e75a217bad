// RUN: neuron-opt %s --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s
// RUN: neuron-run %s | FileCheck %s --check-prefix=EXEC

// bn_stats over two 512-element chunks of each row, side by side in one
// [128, 12] tile, then bn_aggr of the two: the emitter writes them from
// their ODS operand names alone (no attributes, VectorE's only).
// CHECK: "dst":{"buf":[[STATS:[0-9]+]],"offset":{"const":0,"terms":[]},"shape":[128,6],"strides":[12,1]},"engine":"vector",{{.*}}"op":"bn_stats","src":{"buf":[[X:[0-9]+]],"offset":{"const":0,"terms":[]},"shape":[128,512],"strides":[1024,1]}
// CHECK-SAME: "dst":{"buf":[[STATS]],"offset":{"const":6,"terms":[]},"shape":[128,6],"strides":[12,1]},"engine":"vector",{{.*}}"op":"bn_stats","src":{"buf":[[X]],"offset":{"const":512,"terms":[]},"shape":[128,512],"strides":[1024,1]}
// CHECK-SAME: "dst":{"buf":{{[0-9]+}},"offset":{"const":0,"terms":[]},"shape":[128,2],"strides":[2,1]},"engine":"vector",{{.*}}"op":"bn_aggr","src":{"buf":[[STATS]],{{.*}}"shape":[128,12]

// EXEC: stats on trn2: 5 static / 5 dynamic instructions
func.func @stats(%x: memref<128x1024xbf16>, %out: memref<128x2xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %t = memref.alloc() : memref<128x1024xbf16, #nisa.mem<sbuf>>
  %s = memref.alloc() : memref<128x12xf32, #nisa.mem<sbuf>>
  %r = memref.alloc() : memref<128x2xf32, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %t : memref<128x1024xbf16>, memref<128x1024xbf16, #nisa.mem<sbuf>>
  %t0 = memref.reinterpret_cast %t to offset: [0], sizes: [128, 512], strides: [1024, 1] : memref<128x1024xbf16, #nisa.mem<sbuf>> to memref<128x512xbf16, strided<[1024, 1]>, #nisa.mem<sbuf>>
  %t1 = memref.reinterpret_cast %t to offset: [512], sizes: [128, 512], strides: [1024, 1] : memref<128x1024xbf16, #nisa.mem<sbuf>> to memref<128x512xbf16, strided<[1024, 1], offset: 512>, #nisa.mem<sbuf>>
  %s0 = memref.reinterpret_cast %s to offset: [0], sizes: [128, 6], strides: [12, 1] : memref<128x12xf32, #nisa.mem<sbuf>> to memref<128x6xf32, strided<[12, 1]>, #nisa.mem<sbuf>>
  %s1 = memref.reinterpret_cast %s to offset: [6], sizes: [128, 6], strides: [12, 1] : memref<128x12xf32, #nisa.mem<sbuf>> to memref<128x6xf32, strided<[12, 1], offset: 6>, #nisa.mem<sbuf>>
  nisa.bn_stats %t0, %s0 : memref<128x512xbf16, strided<[1024, 1]>, #nisa.mem<sbuf>>, memref<128x6xf32, strided<[12, 1]>, #nisa.mem<sbuf>>
  nisa.bn_stats %t1, %s1 : memref<128x512xbf16, strided<[1024, 1], offset: 512>, #nisa.mem<sbuf>>, memref<128x6xf32, strided<[12, 1], offset: 6>, #nisa.mem<sbuf>>
  nisa.bn_aggr %s, %r : memref<128x12xf32, #nisa.mem<sbuf>>, memref<128x2xf32, #nisa.mem<sbuf>>
  nisa.dma_copy %r, %out : memref<128x2xf32, #nisa.mem<sbuf>>, memref<128x2xf32>
  return
}
