// RUN: neuron-opt %s --nisa-insert-sync --split-input-file --verify-diagnostics | FileCheck %s

!t = memref<128x64xf32, #nisa.mem<sbuf>>

// A compute instruction waits for the DMA that loads its input, the store
// waits for the instruction that produced its data; two instructions of one
// compute queue need no semaphore between them.
// CHECK-LABEL: func.func @chain
// CHECK-SAME: nisa.synchronized
// CHECK: nisa.dma_copy %{{.*}}, %[[T:.*]] {nisa.id = 0 : i64}
// CHECK: nisa.activation {{ *}}exp %[[T]], %[[U:.*]] {nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.activation {{ *}}tanh %[[U]], %[[U]] {nisa.id = 2 : i64}
// CHECK: nisa.dma_copy %[[U]], %{{.*}} {nisa.id = 3 : i64, nisa.waits = array<i64: 2>}
func.func @chain(%x: memref<128x64xf32>, %y: memref<128x64xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %u = memref.alloc() {nisa.address = 256 : i64} : !t
  nisa.dma_copy %x, %t : memref<128x64xf32>, !t
  nisa.activation exp %t, %u : !t, !t
  nisa.activation tanh %u, %u : !t, !t
  nisa.dma_copy %u, %y : !t, memref<128x64xf32>
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>

// In a loop, the next load into a tile waits for the instruction of the
// previous iteration that read it (WAR). Its wait for its own previous
// instance (WAW) is implied by that one and dropped; so is the store's.
// CHECK-LABEL: func.func @loop
// CHECK: scf.for
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64, nisa.waits = array<i64: 1>}
// CHECK: nisa.activation {{.*}} {nisa.id = 1 : i64, nisa.waits = array<i64: 0, 2>}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 2 : i64, nisa.waits = array<i64: 1>}
func.func @loop(%x: memref<512x64xf32>, %y: memref<512x64xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %c8192 = arith.constant 8192 : index
  %c32768 = arith.constant 32768 : index
  scf.for %i = %c0 to %c32768 step %c8192 {
    %t = memref.alloc() {nisa.address = 0 : i64} : !t
    %u = memref.alloc() {nisa.address = 256 : i64} : !t
    %xv = memref.reinterpret_cast %x to offset: [%i], sizes: [128, 64], strides: [64, 1] : memref<512x64xf32> to memref<128x64xf32, strided<[64, 1], offset: ?>>
    %yv = memref.reinterpret_cast %y to offset: [%i], sizes: [128, 64], strides: [64, 1] : memref<512x64xf32> to memref<128x64xf32, strided<[64, 1], offset: ?>>
    nisa.dma_copy %xv, %t : memref<128x64xf32, strided<[64, 1], offset: ?>>, !t
    nisa.activation exp %t, %u : !t, !t
    nisa.dma_copy %u, %yv : !t, memref<128x64xf32, strided<[64, 1], offset: ?>>
  }
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>

// A wait implied by a nearer one is dropped: the second load overwrites %t
// (WAW with the first load, WAR with the copy), and the copy already
// waited for the first load.
// CHECK-LABEL: func.func @implied
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.copy {{.*}} {nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 2 : i64, nisa.waits = array<i64: 1>}
func.func @implied(%x: memref<128x64xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %u = memref.alloc() {nisa.address = 256 : i64} : !t
  nisa.dma_copy %x, %t : memref<128x64xf32>, !t
  nisa.copy %t, %u : !t, !t
  nisa.dma_copy %x, %t : memref<128x64xf32>, !t
  return
}

// -----

// Tiles of different dtypes at overlapping addresses are the same storage;
// at disjoint addresses they are not.
// CHECK-LABEL: func.func @aliasing
// CHECK: nisa.memset {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.iota {{.*}}nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.iota {{.*}}nisa.id = 2 : i64}
func.func @aliasing() attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %a = memref.alloc() {nisa.address = 0 : i64} : memref<128x64xf32, #nisa.mem<sbuf>>
  %b = memref.alloc() {nisa.address = 128 : i64} : memref<128x64xbf16, #nisa.mem<sbuf>>
  %c = memref.alloc() {nisa.address = 256 : i64} : memref<128x64xbf16, #nisa.mem<sbuf>>
  nisa.memset %a, 0.0 : memref<128x64xf32, #nisa.mem<sbuf>>
  nisa.iota %b {base = 0.0 : f64, channel_multiplier = 0.0 : f64, multipliers = array<f64: 1.0>} : memref<128x64xbf16, #nisa.mem<sbuf>>
  nisa.iota %c {base = 0.0 : f64, channel_multiplier = 0.0 : f64, multipliers = array<f64: 1.0>} : memref<128x64xbf16, #nisa.mem<sbuf>>
  return
}

// -----

// HBM accesses conflict only where their element ranges meet: two stores
// into disjoint halves of one buffer run concurrently, the load of the
// whole buffer waits for both.
// CHECK-LABEL: func.func @hbm_ranges
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 2 : i64, nisa.waits = array<i64: 0, 1>}
func.func @hbm_ranges(%x: memref<2x64xf32>, %y: memref<2x64xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %h = memref.alloc() : memref<4x64xf32>
  %lo = memref.reinterpret_cast %h to offset: [0], sizes: [2, 64], strides: [64, 1] : memref<4x64xf32> to memref<2x64xf32, strided<[64, 1]>>
  %hi = memref.reinterpret_cast %h to offset: [128], sizes: [2, 64], strides: [64, 1] : memref<4x64xf32> to memref<2x64xf32, strided<[64, 1], offset: 128>>
  %all = memref.reinterpret_cast %h to offset: [0], sizes: [2, 64], strides: [128, 1] : memref<4x64xf32> to memref<2x64xf32, strided<[128, 1]>>
  nisa.dma_copy %x, %lo : memref<2x64xf32>, memref<2x64xf32, strided<[64, 1]>>
  nisa.dma_copy %x, %hi : memref<2x64xf32>, memref<2x64xf32, strided<[64, 1], offset: 128>>
  nisa.dma_copy %all, %y : memref<2x64xf32, strided<[128, 1]>>, memref<2x64xf32>
  return
}

// -----

// The pieces of a cat along the last dim of a 3-D HBM buffer (a fused QKV
// projection's split backward): their element ranges interleave, but each
// writes its own columns of every row, so no piece waits for another. A
// piece whose columns overlap the first two waits for them (the next waits
// for it, which covers those); one of interleaved columns (even vs odd:
// disjoint elements, overlapping column ranges) waits too, conservatively. The timing model's checker compares the same
// rows x columns boxes, so it agrees.
// CHECK-LABEL: func.func @hbm_cat_pieces
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 2 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 3 : i64, nisa.waits = array<i64: 0, 1>}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 4 : i64, nisa.waits = array<i64: 3>}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 5 : i64, nisa.waits = array<i64: 0, 1, 4>}
func.func @hbm_cat_pieces(%x: memref<4x33x48xf32>, %h: memref<4x33x144xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %q = memref.reinterpret_cast %h to offset: [0], sizes: [4, 33, 48], strides: [4752, 144, 1] : memref<4x33x144xf32> to memref<4x33x48xf32, strided<[4752, 144, 1]>>
  %k = memref.reinterpret_cast %h to offset: [48], sizes: [4, 33, 48], strides: [4752, 144, 1] : memref<4x33x144xf32> to memref<4x33x48xf32, strided<[4752, 144, 1], offset: 48>>
  %v = memref.reinterpret_cast %h to offset: [96], sizes: [4, 33, 48], strides: [4752, 144, 1] : memref<4x33x144xf32> to memref<4x33x48xf32, strided<[4752, 144, 1], offset: 96>>
  %over = memref.reinterpret_cast %h to offset: [47], sizes: [4, 33, 48], strides: [4752, 144, 1] : memref<4x33x144xf32> to memref<4x33x48xf32, strided<[4752, 144, 1], offset: 47>>
  %even = memref.reinterpret_cast %h to offset: [0], sizes: [4, 33, 48], strides: [4752, 144, 2] : memref<4x33x144xf32> to memref<4x33x48xf32, strided<[4752, 144, 2]>>
  %odd = memref.reinterpret_cast %h to offset: [1], sizes: [4, 33, 48], strides: [4752, 144, 2] : memref<4x33x144xf32> to memref<4x33x48xf32, strided<[4752, 144, 2], offset: 1>>
  nisa.dma_copy %x, %q : memref<4x33x48xf32>, memref<4x33x48xf32, strided<[4752, 144, 1]>>
  nisa.dma_copy %x, %k : memref<4x33x48xf32>, memref<4x33x48xf32, strided<[4752, 144, 1], offset: 48>>
  nisa.dma_copy %x, %v : memref<4x33x48xf32>, memref<4x33x48xf32, strided<[4752, 144, 1], offset: 96>>
  nisa.dma_copy %x, %over : memref<4x33x48xf32>, memref<4x33x48xf32, strided<[4752, 144, 1], offset: 47>>
  nisa.dma_copy %x, %even : memref<4x33x48xf32>, memref<4x33x48xf32, strided<[4752, 144, 2]>>
  nisa.dma_copy %x, %odd : memref<4x33x48xf32>, memref<4x33x48xf32, strided<[4752, 144, 2], offset: 1>>
  return
}

// -----

// Interleaved rows: one query head's rows of a [B, L, H, D] result are every
// H-th row of the buffer, so the stores of different heads (different first
// rows modulo the step) are apart and need no wait; a store from the same
// phase (rows 4 and 8 after rows 0 and 4) meets its first, and one stepping
// by another amount (rows 0 and 2) the views whose span it meets.
// CHECK-LABEL: func.func @interleaved_rows
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 2 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 3 : i64, nisa.waits = array<i64: 0, 1>}
func.func @interleaved_rows(%x: memref<2x64xf32>, %h: memref<3x4x64xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %h0 = memref.reinterpret_cast %h to offset: [0], sizes: [2, 64], strides: [256, 1] : memref<3x4x64xf32> to memref<2x64xf32, strided<[256, 1]>>
  %h1 = memref.reinterpret_cast %h to offset: [64], sizes: [2, 64], strides: [256, 1] : memref<3x4x64xf32> to memref<2x64xf32, strided<[256, 1], offset: 64>>
  %h0again = memref.reinterpret_cast %h to offset: [256], sizes: [2, 64], strides: [256, 1] : memref<3x4x64xf32> to memref<2x64xf32, strided<[256, 1], offset: 256>>
  %pairs = memref.reinterpret_cast %h to offset: [0], sizes: [2, 64], strides: [128, 1] : memref<3x4x64xf32> to memref<2x64xf32, strided<[128, 1]>>
  nisa.dma_copy %x, %h0 : memref<2x64xf32>, memref<2x64xf32, strided<[256, 1]>>
  nisa.dma_copy %x, %h1 : memref<2x64xf32>, memref<2x64xf32, strided<[256, 1], offset: 64>>
  nisa.dma_copy %x, %h0again : memref<2x64xf32>, memref<2x64xf32, strided<[256, 1], offset: 256>>
  nisa.dma_copy %x, %pairs : memref<2x64xf32>, memref<2x64xf32, strided<[128, 1]>>
  return
}

// -----

// Views into the two halves of one tile (double buffering) are disjoint
// bytes of every partition: the load into the second half need not wait
// for the reader of the first. A reader of the whole tile waits for both.
// CHECK-LABEL: func.func @slots
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.activation {{.*}} {nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 2 : i64}
// CHECK: nisa.copy {{.*}} {nisa.id = 3 : i64, nisa.waits = array<i64: 0, 2>}
func.func @slots(%x: memref<128x64xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %t = memref.alloc() {nisa.address = 0 : i64} : memref<128x128xf32, #nisa.mem<sbuf>>
  %u = memref.alloc() {nisa.address = 512 : i64} : memref<128x64xf32, #nisa.mem<sbuf>>
  %w = memref.alloc() {nisa.address = 768 : i64} : memref<128x128xf32, #nisa.mem<sbuf>>
  %s0 = memref.reinterpret_cast %t to offset: [0], sizes: [128, 64], strides: [128, 1] : memref<128x128xf32, #nisa.mem<sbuf>> to memref<128x64xf32, strided<[128, 1]>, #nisa.mem<sbuf>>
  %s1 = memref.reinterpret_cast %t to offset: [64], sizes: [128, 64], strides: [128, 1] : memref<128x128xf32, #nisa.mem<sbuf>> to memref<128x64xf32, strided<[128, 1], offset: 64>, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %s0 : memref<128x64xf32>, memref<128x64xf32, strided<[128, 1]>, #nisa.mem<sbuf>>
  nisa.activation exp %s0, %u : memref<128x64xf32, strided<[128, 1]>, #nisa.mem<sbuf>>, memref<128x64xf32, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %s1 : memref<128x64xf32>, memref<128x64xf32, strided<[128, 1], offset: 64>, #nisa.mem<sbuf>>
  nisa.copy %t, %w : memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x128xf32, #nisa.mem<sbuf>>
  return
}

// -----

// Rows x columns of an HBM buffer: stores of two M tiles (rows 0-127 and
// 128-255 of every 256-row block) into column groups a loop moves never
// meet, so neither waits for the other. (Each still waits for its own
// earlier instances: that they differ in rows or in columns is beyond the
// per-dimension test.)
// CHECK-LABEL: func.func @boxes
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64, nisa.waits = array<i64: 1>}
func.func @boxes(%out: memref<512x1024xf32>) attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c256 = arith.constant 256 : index
  %c512 = arith.constant 512 : index
  %c131072 = arith.constant 131072 : index
  %c262144 = arith.constant 262144 : index
  %t = memref.alloc() {nisa.address = 0 : i64} : memref<128x512xf32, #nisa.mem<sbuf>>
  scf.for %m = %c0 to %c2 step %c1 {
    scf.for %g = %c0 to %c2 step %c1 {
      %row = arith.muli %m, %c262144 : index
      %col = arith.muli %g, %c512 : index
      %o0 = arith.addi %row, %col : index
      %o1 = arith.addi %o0, %c131072 : index
      %v0 = memref.reinterpret_cast %out to offset: [%o0], sizes: [128, 512], strides: [1024, 1] : memref<512x1024xf32> to memref<128x512xf32, strided<[1024, 1], offset: ?>>
      %v1 = memref.reinterpret_cast %out to offset: [%o1], sizes: [128, 512], strides: [1024, 1] : memref<512x1024xf32> to memref<128x512xf32, strided<[1024, 1], offset: ?>>
      nisa.dma_copy %t, %v0 : memref<128x512xf32, #nisa.mem<sbuf>>, memref<128x512xf32, strided<[1024, 1], offset: ?>>
      nisa.dma_copy %t, %v1 : memref<128x512xf32, #nisa.mem<sbuf>>, memref<128x512xf32, strided<[1024, 1], offset: ?>>
    }
  }
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>
!col = memref<128x1xf32, #nisa.mem<sbuf>>

// An activation writes its row sums (accumulate) as it writes dst: it waits
// for the GpSimd memset of that tile (WAW), and the VectorE instruction
// that reads only the sums waits for it (RAW). The per-partition scale is
// read, so the activation waits for its load too.
// CHECK-LABEL: func.func @accumulate
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.memset {{.*}} {engine = #nisa.engine<gpsimd>, nisa.id = 2 : i64}
// CHECK: nisa.activation {{.*}} {nisa.id = 3 : i64, nisa.waits = array<i64: 0, 1, 2>}
// CHECK: nisa.tensor_scalar {{.*}} {imm = 2.000000e+00 : f64, nisa.id = 4 : i64, nisa.waits = array<i64: 3>}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 5 : i64, nisa.waits = array<i64: 4>}
func.func @accumulate(%x: memref<128x64xf32>, %s: memref<128x1xf32>, %y: memref<128x1xf32>) attributes {nisa.kernel, nisa.num_inputs = 2 : i64} {
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %u = memref.alloc() {nisa.address = 256 : i64} : !t
  %sc = memref.alloc() {nisa.address = 512 : i64} : !col
  %acc = memref.alloc() {nisa.address = 516 : i64} : !col
  %r = memref.alloc() {nisa.address = 520 : i64} : !col
  nisa.dma_copy %x, %t : memref<128x64xf32>, !t
  nisa.dma_copy %s, %sc : memref<128x1xf32>, !col
  nisa.memset %acc, 0.0 {engine = #nisa.engine<gpsimd>} : !col
  nisa.activation exp %t, %u scale_col %sc accumulate %acc : !t, !t, !col, !col
  nisa.tensor_scalar multiply %acc, %r {imm = 2.0 : f64} : !col, !col
  nisa.dma_copy %r, %y : !col, memref<128x1xf32>
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>
!col = memref<128x1xf32, #nisa.mem<sbuf>>

// scalar_tensor_tensor is an instruction of its engine's queue: it waits
// for the loads of both tensors and of its scalar column, and the store
// waits for it.
// CHECK-LABEL: func.func @scalar_tensor_tensor
// CHECK: nisa.scalar_tensor_tensor {{.*}}nisa.id = 2 : i64, nisa.waits = array<i64: 0, 1>
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 3 : i64, nisa.waits = array<i64: 2>}
func.func @scalar_tensor_tensor(%x: memref<128x64xf32>, %s: memref<128x1xf32>, %y: memref<128x64xf32>) attributes {nisa.kernel, nisa.num_inputs = 2 : i64} {
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %c = memref.alloc() {nisa.address = 256 : i64} : !col
  %u = memref.alloc() {nisa.address = 260 : i64} : !t
  nisa.dma_copy %x, %t : memref<128x64xf32>, !t
  nisa.dma_copy %s, %c : memref<128x1xf32>, !col
  nisa.scalar_tensor_tensor subtract, multiply %t, %t, %u scalar %c {engine = #nisa.engine<gpsimd>} : !t, !t, !t, !col
  nisa.dma_copy %u, %y : !t, memref<128x64xf32>
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>

// An iota's index offset is no memory access: the iota writes its tile, the
// store waits for it, and the next iteration's iota waits for the store.
// CHECK-LABEL: func.func @iota_offset
// CHECK: scf.for
// CHECK: nisa.iota {{.*}} offset {{.*}}nisa.id = 0 : i64, nisa.waits = array<i64: 1>
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
func.func @iota_offset(%y: memref<512x64xf32>) attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8192 = arith.constant 8192 : index
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  scf.for %i = %c0 to %c4 step %c1 {
    %o = arith.muli %i, %c8192 : index
    %yv = memref.reinterpret_cast %y to offset: [%o], sizes: [128, 64], strides: [64, 1] : memref<512x64xf32> to memref<128x64xf32, strided<[64, 1], offset: ?>>
    nisa.iota %t offset %o {base = 0.0, channel_multiplier = 64.0, multipliers = array<f64: 1.0>} : !t
    nisa.dma_copy %t, %yv : !t, memref<128x64xf32, strided<[64, 1], offset: ?>>
  }
  return
}

// -----

func.func @unallocated(%x: memref<128x4xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %t = memref.alloc() : memref<128x4xf32, #nisa.mem<sbuf>>
  // expected-error @+1 {{reads or writes an on-chip tile without a nisa.address (run nisa-allocate first)}}
  nisa.dma_copy %x, %t : memref<128x4xf32>, memref<128x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>

// Size-generic (issue #16): the full tiles of rows [128 i, 128 i + 128),
// i < floordiv(n, 128), are stored in a loop counted at run time, then the
// last rows [n - mod(n, 128), n) in a store of mod(n, 128) rows. For every
// n they are apart: the last store does not wait for the loop's. A load of
// rows [0, 128) meets both: the loop's first store wherever the loop runs,
// the last rows only where they start at 0 (n < 128), a wait at those sizes
// (nisa.wait_when: where the expression is positive; "" at every size).
// CHECK-LABEL: func.func @rows_known_at_run_time
// CHECK: scf.for
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 2 : i64, nisa.wait_when = ["", "0 - max({{.*}})"], nisa.waits = array<i64: 0, 1>}
func.func @rows_known_at_run_time(%x: memref<?x64xf32>, %y: memref<?x64xf32>, %n: index {neuron.size = {min = 1 : i64, name = "s0"}}) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %c8192 = arith.constant 8192 : index
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %u = memref.alloc() {nisa.address = 256 : i64} : !t
  %w = memref.alloc() {nisa.address = 512 : i64} : !t
  %full = arith.floordivsi %n, %c128 : index
  scf.for %i = %c0 to %full step %c1 {
    %o = arith.muli %i, %c8192 : index
    %yv = memref.reinterpret_cast %y to offset: [%o], sizes: [128, 64], strides: [64, 1] : memref<?x64xf32> to memref<128x64xf32, strided<[64, 1], offset: ?>>
    nisa.dma_copy %t, %yv : !t, memref<128x64xf32, strided<[64, 1], offset: ?>>
  }
  %rest = arith.remsi %n, %c128 : index
  %start = arith.subi %n, %rest : index
  %o2 = arith.muli %start, %c64 : index
  %yv2 = memref.reinterpret_cast %y to offset: [%o2], sizes: [%rest, 64], strides: [64, 1] : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
  %uv = memref.reinterpret_cast %u to offset: [0], sizes: [%rest, 64], strides: [64, 1] : !t to memref<?x64xf32, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  nisa.dma_copy %uv, %yv2 : memref<?x64xf32, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>, memref<?x64xf32, strided<[64, 1], offset: ?>>
  %y0 = memref.reinterpret_cast %y to offset: [0], sizes: [128, 64], strides: [64, 1] : memref<?x64xf32> to memref<128x64xf32, strided<[64, 1], offset: ?>>
  nisa.dma_copy %y0, %w : memref<128x64xf32, strided<[64, 1], offset: ?>>, !t
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>

// As above with the last rows starting one row early: they overlap the last
// full tile, so the last store waits for the loop's.
// CHECK-LABEL: func.func @rows_overlap
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
func.func @rows_overlap(%x: memref<?x64xf32>, %y: memref<?x64xf32>, %n: index {neuron.size = {min = 129 : i64, name = "s0"}}) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %c8192 = arith.constant 8192 : index
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %u = memref.alloc() {nisa.address = 256 : i64} : !t
  %full = arith.floordivsi %n, %c128 : index
  scf.for %i = %c0 to %full step %c1 {
    %o = arith.muli %i, %c8192 : index
    %yv = memref.reinterpret_cast %y to offset: [%o], sizes: [128, 64], strides: [64, 1] : memref<?x64xf32> to memref<128x64xf32, strided<[64, 1], offset: ?>>
    nisa.dma_copy %t, %yv : !t, memref<128x64xf32, strided<[64, 1], offset: ?>>
  }
  %rest = arith.remsi %n, %c128 : index
  %start = arith.subi %n, %rest : index
  %early = arith.subi %start, %c1 : index
  %more = arith.addi %rest, %c1 : index
  %o2 = arith.muli %early, %c64 : index
  %yv2 = memref.reinterpret_cast %y to offset: [%o2], sizes: [%more, 64], strides: [64, 1] : memref<?x64xf32> to memref<?x64xf32, strided<[64, 1], offset: ?>>
  %uv = memref.reinterpret_cast %u to offset: [0], sizes: [%more, 64], strides: [64, 1] : !t to memref<?x64xf32, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  nisa.dma_copy %uv, %yv2 : memref<?x64xf32, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>, memref<?x64xf32, strided<[64, 1], offset: ?>>
  return
}

// -----

!p = memref<128x1024xf32, #nisa.mem<sbuf>>

// A view of a tile at an offset known at run time (slot mod(n, 2) of two
// 2 KiB slots) may be anywhere in its tile: the read of that slot waits for
// the write of slot 1 where n is odd, though the slot's constant part is
// slot 0.
// CHECK-LABEL: func.func @slot_known_at_run_time
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64, nisa.wait_when = ["0 - max(2048*mod(s0, 2) + (-4096), (-2048)*mod(s0, 2))"], nisa.waits = array<i64: 0>}
func.func @slot_known_at_run_time(%x: memref<128x512xf32>, %y: memref<128x512xf32>, %n: index {neuron.size = {min = 1 : i64, name = "s0"}}) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
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

// -----

// A transposing view (its partition dim is dim 1: stride = the tile's row)
// of the second half of a tile, read by an SBUF-to-SBUF DMA, covers only
// those bytes of every partition: the write into the first half need not
// wait for it; a write into the second half does.
// CHECK-LABEL: func.func @transposed_slot
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.activation {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.activation {{.*}} {nisa.id = 2 : i64, nisa.waits = array<i64: 0>}
func.func @transposed_slot() attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %t = memref.alloc() {nisa.address = 0 : i64} : memref<128x128xf32, #nisa.mem<sbuf>>
  %u = memref.alloc() {nisa.address = 512 : i64} : memref<64x128xf32, #nisa.mem<sbuf>>
  %v = memref.alloc() {nisa.address = 1024 : i64} : memref<128x64xf32, #nisa.mem<sbuf>>
  %s0 = memref.reinterpret_cast %t to offset: [0], sizes: [128, 64], strides: [128, 1] : memref<128x128xf32, #nisa.mem<sbuf>> to memref<128x64xf32, strided<[128, 1]>, #nisa.mem<sbuf>>
  %s1 = memref.reinterpret_cast %t to offset: [64], sizes: [128, 64], strides: [128, 1] : memref<128x128xf32, #nisa.mem<sbuf>> to memref<128x64xf32, strided<[128, 1], offset: 64>, #nisa.mem<sbuf>>
  %s1t = memref.reinterpret_cast %t to offset: [64], sizes: [64, 128], strides: [1, 128] : memref<128x128xf32, #nisa.mem<sbuf>> to memref<64x128xf32, strided<[1, 128], offset: 64>, #nisa.mem<sbuf>>
  nisa.dma_copy %s1t, %u : memref<64x128xf32, strided<[1, 128], offset: 64>, #nisa.mem<sbuf>>, memref<64x128xf32, #nisa.mem<sbuf>>
  nisa.activation exp %v, %s0 : memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x64xf32, strided<[128, 1]>, #nisa.mem<sbuf>>
  nisa.activation exp %v, %s1 : memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x64xf32, strided<[128, 1], offset: 64>, #nisa.mem<sbuf>>
  return
}
// -----

!n = memref<128x2xf32, #nisa.mem<sbuf>>
!w = memref<128x512xf32, #nisa.mem<sbuf>>

// Accesses meet through the region index whatever their widths: a tile of
// 8 bytes a partition inside a 2 KiB one, and an HBM slice of 256 elements
// inside a whole buffer. Each pair below touches a common byte, so each
// later instruction waits for the earlier one.
// CHECK-LABEL: func.func @narrow_and_wide
// CHECK: nisa.dma_copy %[[Y:.*]], %[[W:.*]] {nisa.id = 0 : i64}
// CHECK: nisa.activation {{ *}}exp %[[N:.*]], %[[N]] {nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.dma_copy %[[W]], %[[H:.*]] {nisa.id = 2 : i64, nisa.waits = array<i64: 1>}
// CHECK: nisa.dma_copy %[[N]], %[[HV:.*]] {nisa.id = 3 : i64, nisa.waits = array<i64: 0, 2>}
// CHECK: nisa.dma_copy %[[H]], %[[Y]] {nisa.id = 4 : i64, nisa.waits = array<i64: 3>}
func.func @narrow_and_wide(%y: memref<128x512xf32>, %h: memref<128x512xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %c0 = arith.constant 0 : index
  %w = memref.alloc() {nisa.address = 0 : i64} : !w
  %n = memref.alloc() {nisa.address = 1536 : i64} : !n
  nisa.dma_copy %y, %w : memref<128x512xf32>, !w
  nisa.activation exp %n, %n : !n, !n
  nisa.dma_copy %w, %h : !w, memref<128x512xf32>
  %hv = memref.reinterpret_cast %h to offset: [%c0], sizes: [128, 2], strides: [2, 1] : memref<128x512xf32> to memref<128x2xf32, strided<[2, 1], offset: ?>>
  nisa.dma_copy %n, %hv : !n, memref<128x2xf32, strided<[2, 1], offset: ?>>
  nisa.dma_copy %h, %y : memref<128x512xf32>, memref<128x512xf32>
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>

// A loop counted at run time may run no iteration: a wait on an instruction
// in it may then be met at once, so it stands for no earlier instruction
// outside the loop (@witness_outside: GpSimd reads %t, written by 0, and
// %u, written by 1 in the loop after 0 on VectorE's queue: it waits for
// both). It stands for one before it in the loop's body (@witness_in_loop):
// when the loop runs no iteration neither ran, else its last instance came
// after theirs; waiting for 1 covers 0.
// CHECK-LABEL: func.func @witness_outside
// CHECK: nisa.tensor_tensor {{.*}} nisa.id = 2 : i64, nisa.waits = array<i64: 0, 1>}
func.func @witness_outside(%n: index {neuron.size = {min = 1 : i64, name = "s0"}}) attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %s = memref.alloc() {nisa.address = 0 : i64} : !t
  %t = memref.alloc() {nisa.address = 256 : i64} : !t
  %u = memref.alloc() {nisa.address = 512 : i64} : !t
  %w = memref.alloc() {nisa.address = 768 : i64} : !t
  nisa.copy %s, %t : !t, !t
  scf.for %i = %c0 to %n step %c1 {
    nisa.copy %s, %u : !t, !t
  }
  nisa.tensor_tensor add %t, %u, %w {engine = #nisa.engine<gpsimd>} : !t, !t, !t
  return
}

// -----

!t = memref<128x64xf32, #nisa.mem<sbuf>>

// CHECK-LABEL: func.func @witness_in_loop
// CHECK: scf.for
// CHECK: nisa.copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.copy {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.tensor_tensor {{.*}} nisa.id = 2 : i64, nisa.waits = array<i64: 1>}
func.func @witness_in_loop(%n: index {neuron.size = {min = 1 : i64, name = "s0"}}) attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %s = memref.alloc() {nisa.address = 0 : i64} : !t
  %t = memref.alloc() {nisa.address = 256 : i64} : !t
  %u = memref.alloc() {nisa.address = 512 : i64} : !t
  %w = memref.alloc() {nisa.address = 768 : i64} : !t
  scf.for %i = %c0 to %n step %c1 {
    nisa.copy %s, %t : !t, !t
    nisa.copy %s, %u : !t, !t
  }
  nisa.tensor_tensor add %t, %u, %w {engine = #nisa.engine<gpsimd>} : !t, !t, !t
  return
}

// -----

!t = memref<128x256xf32, #nisa.mem<sbuf>>

// A size known at run time reaches as far as its bound when its definition
// gives one: a remainder by 128 writes at most 127 columns, apart from
// columns [128, 256) (with two size parameters, so no size functions: the
// bound alone). A size without a bound covers the whole tile.
// CHECK-LABEL: func.func @bounded_size
// CHECK: nisa.memset {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.copy {{.*}} nisa.id = 1 : i64}
// CHECK: nisa.memset {{.*}} {nisa.id = 2 : i64, nisa.waits = array<i64: 1>}
func.func @bounded_size(%n: index {neuron.size = {min = 1 : i64, name = "s0"}}, %m: index {neuron.size = {min = 1 : i64, name = "s1"}}) attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c128 = arith.constant 128 : index
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %u = memref.alloc() {nisa.address = 1024 : i64} : !t
  %r = arith.remsi %n, %c128 : index
  %head = memref.reinterpret_cast %t to offset: [0], sizes: [128, %r], strides: [256, 1] : !t to memref<128x?xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  nisa.memset %head, 0.0 : memref<128x?xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  %tail = memref.reinterpret_cast %t to offset: [128], sizes: [128, 128], strides: [256, 1] : !t to memref<128x128xf32, strided<[256, 1], offset: 128>, #nisa.mem<sbuf>>
  %v = memref.reinterpret_cast %u to offset: [0], sizes: [128, 128], strides: [256, 1] : !t to memref<128x128xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  nisa.copy %tail, %v {engine = #nisa.engine<scalar>} : memref<128x128xf32, strided<[256, 1], offset: 128>, #nisa.mem<sbuf>>, memref<128x128xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  %any = memref.reinterpret_cast %t to offset: [0], sizes: [128, %n], strides: [256, 1] : !t to memref<128x?xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  nisa.memset %any, 1.0 : memref<128x?xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  return
}

// -----

!t = memref<128x256xf32, #nisa.mem<sbuf>>

// On chip, how many partitions a view spans (known at run time here) does
// not move its bytes in a partition: columns [0, 128) of %n partitions are
// apart from columns [128, 256). A sum of bounded terms is bounded: %n mod
// 64 + 64 columns reach at most column 127. (The two memsets meet.)
// CHECK-LABEL: func.func @dynamic_partitions
// CHECK: nisa.memset {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.memset {{.*}} nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.copy {{.*}} nisa.id = 2 : i64}
func.func @dynamic_partitions(%n: index {neuron.size = {min = 1 : i64, name = "s0"}}, %m: index {neuron.size = {min = 1 : i64, name = "s1"}}) attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c64 = arith.constant 64 : index
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %u = memref.alloc() {nisa.address = 1024 : i64} : !t
  %rows = memref.reinterpret_cast %t to offset: [0], sizes: [%n, 128], strides: [256, 1] : !t to memref<?x128xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  nisa.memset %rows, 0.0 : memref<?x128xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  %r = arith.remsi %n, %c64 : index
  %w = arith.addi %r, %c64 : index
  %cols = memref.reinterpret_cast %t to offset: [0], sizes: [128, %w], strides: [256, 1] : !t to memref<128x?xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  nisa.memset %cols, 0.0 {engine = #nisa.engine<gpsimd>} : memref<128x?xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  %tail = memref.reinterpret_cast %t to offset: [128], sizes: [128, 128], strides: [256, 1] : !t to memref<128x128xf32, strided<[256, 1], offset: 128>, #nisa.mem<sbuf>>
  %v = memref.reinterpret_cast %u to offset: [0], sizes: [128, 128], strides: [256, 1] : !t to memref<128x128xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  nisa.copy %tail, %v {engine = #nisa.engine<scalar>} : memref<128x128xf32, strided<[256, 1], offset: 128>, #nisa.mem<sbuf>>, memref<128x128xf32, strided<[256, 1]>, #nisa.mem<sbuf>>
  return
}

// -----

!r = memref<128x16xf32, #nisa.mem<sbuf>>
!i = memref<128x1xi32, #nisa.mem<sbuf>>

// Scatters into one table may write the same row: the second waits for the
// first (WAW). Disjoint ones (parts of one permutation) do not wait for
// each other; a load of the table waits for both.
// CHECK-LABEL: func.func @disjoint_scatters
// CHECK: nisa.dma_scatter {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.dma_scatter {{.*}} {nisa.id = 1 : i64, nisa.waits = array<i64: 0>}
// CHECK: nisa.dma_scatter {{.*}} {disjoint, nisa.id = 2 : i64} :
// CHECK: nisa.dma_scatter {{.*}} {disjoint, nisa.id = 3 : i64} :
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 4 : i64, nisa.waits = array<i64: 2, 3>}
func.func @disjoint_scatters(%t: memref<256x16xf32>, %u: memref<256x16xf32>) attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %rows = memref.alloc() {nisa.address = 0 : i64} : !r
  %idx = memref.alloc() {nisa.address = 64 : i64} : !i
  %back = memref.alloc() {nisa.address = 128 : i64} : !r
  nisa.dma_scatter %rows, %t[%idx] : !r, memref<256x16xf32>, !i
  nisa.dma_scatter %rows, %t[%idx] : !r, memref<256x16xf32>, !i
  nisa.dma_scatter %rows, %u[%idx] {disjoint} : !r, memref<256x16xf32>, !i
  nisa.dma_scatter %rows, %u[%idx] {disjoint} : !r, memref<256x16xf32>, !i
  %view = memref.reinterpret_cast %u to offset: [0], sizes: [128, 16], strides: [16, 1] : memref<256x16xf32> to memref<128x16xf32, strided<[16, 1]>>
  nisa.dma_copy %view, %back : memref<128x16xf32, strided<[16, 1]>>, !r
  return
}

// -----

!t = memref<128x64xbf16, #nisa.mem<sbuf>>

// Views starting on later partitions (a constant offset of whole rows: a
// convolution's stacked copies of its image) cover only their partitions:
// loads into partitions [0, 8) and [8, 16) at the same bytes need no order;
// one into [4, 12) waits for both, and a matmul reading [0, 16) for it.
// CHECK-LABEL: func.func @partition_blocks
// CHECK: nisa.dma_copy %arg1, {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.dma_copy %arg0, {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.dma_copy %arg0, {{.*}} {nisa.id = 2 : i64}
// CHECK: nisa.dma_copy %arg0, {{.*}} {nisa.id = 3 : i64, nisa.waits = array<i64: 1, 2>}
// CHECK: nisa.matmul {{.*}} {nisa.id = 4 : i64, nisa.waits = array<i64: 0, 3>}
func.func @partition_blocks(%x: memref<8x64xbf16>, %w: memref<16x16xbf16>) attributes {nisa.kernel, nisa.num_inputs = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c256 = arith.constant 256 : index
  %c512 = arith.constant 512 : index
  %t = memref.alloc() {nisa.address = 0 : i64} : !t
  %s = memref.alloc() {nisa.address = 128 : i64} : memref<16x16xbf16, #nisa.mem<sbuf>>
  %p = memref.alloc() {nisa.address = 0 : i64} : memref<16x64xf32, #nisa.mem<psum>>
  nisa.dma_copy %w, %s : memref<16x16xbf16>, memref<16x16xbf16, #nisa.mem<sbuf>>
  %a = memref.reinterpret_cast %t to offset: [%c0], sizes: [8, 64], strides: [64, 1] : !t to memref<8x64xbf16, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  %b = memref.reinterpret_cast %t to offset: [%c512], sizes: [8, 64], strides: [64, 1] : !t to memref<8x64xbf16, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  %c = memref.reinterpret_cast %t to offset: [%c256], sizes: [8, 64], strides: [64, 1] : !t to memref<8x64xbf16, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  %m = memref.reinterpret_cast %t to offset: [%c0], sizes: [16, 64], strides: [64, 1] : !t to memref<16x64xbf16, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %a : memref<8x64xbf16>, memref<8x64xbf16, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %b : memref<8x64xbf16>, memref<8x64xbf16, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %c : memref<8x64xbf16>, memref<8x64xbf16, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>
  nisa.matmul %s, %m, %p : memref<16x16xbf16, #nisa.mem<sbuf>>, memref<16x64xbf16, strided<[64, 1], offset: ?>, #nisa.mem<sbuf>>, memref<16x64xf32, #nisa.mem<psum>>
  return
}

// -----

!s = memref<64x448xbf16, #nisa.mem<sbuf>>

// Stores of a [N, O, H, W] result a block of channels and four whole rows
// of H at a time (a convolution's output tiles) reach every channel's rows:
// as rows of W they overlap, as rows of H x W (the last two dims) they are
// columns [0, 448) and [448, 896) of the same channels, apart. A store of
// rows 3 to 6 meets both.
// CHECK-LABEL: func.func @plane_blocks
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 0 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 1 : i64}
// CHECK: nisa.dma_copy {{.*}} {nisa.id = 2 : i64, nisa.waits = array<i64: 0, 1>}
func.func @plane_blocks(%y: memref<1x64x112x112xbf16>) attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c0 = arith.constant 0 : index
  %c336 = arith.constant 336 : index
  %c448 = arith.constant 448 : index
  %t = memref.alloc() {nisa.address = 0 : i64} : !s
  %a = memref.reinterpret_cast %y to offset: [%c0], sizes: [64, 448], strides: [12544, 1] : memref<1x64x112x112xbf16> to memref<64x448xbf16, strided<[12544, 1], offset: ?>>
  %b = memref.reinterpret_cast %y to offset: [%c448], sizes: [64, 448], strides: [12544, 1] : memref<1x64x112x112xbf16> to memref<64x448xbf16, strided<[12544, 1], offset: ?>>
  %c = memref.reinterpret_cast %y to offset: [%c336], sizes: [64, 448], strides: [12544, 1] : memref<1x64x112x112xbf16> to memref<64x448xbf16, strided<[12544, 1], offset: ?>>
  nisa.dma_copy %t, %a : !s, memref<64x448xbf16, strided<[12544, 1], offset: ?>>
  nisa.dma_copy %t, %b : !s, memref<64x448xbf16, strided<[12544, 1], offset: ?>>
  nisa.dma_copy %t, %c : !s, memref<64x448xbf16, strided<[12544, 1], offset: ?>>
  return
}
