// RUN: neuron-opt %s --nisa-allocate --split-input-file --verify-diagnostics | FileCheck %s

// Tiles live at once get disjoint byte ranges; a new tile takes bytes no
// tile used before it over those a tile just freed (whose readers may still
// run: its first write would wait for them).
// CHECK-LABEL: func.func @reuse
// CHECK: %[[A:.*]] = memref.alloc() {nisa.address = 0 : i64} : memref<128x512xf32, #nisa.mem<sbuf>>
// CHECK: %[[B:.*]] = memref.alloc() {nisa.address = 2048 : i64} : memref<128x512xbf16, #nisa.mem<sbuf>>
// CHECK: %[[C:.*]] = memref.alloc() {nisa.address = 3072 : i64} : memref<128x16xf32, #nisa.mem<sbuf>>
func.func @reuse(%x: memref<128x512xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %a = memref.alloc() : memref<128x512xf32, #nisa.mem<sbuf>>
  %b = memref.alloc() : memref<128x512xbf16, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %a : memref<128x512xf32>, memref<128x512xf32, #nisa.mem<sbuf>>
  nisa.copy %a, %b : memref<128x512xf32, #nisa.mem<sbuf>>, memref<128x512xbf16, #nisa.mem<sbuf>>
  memref.dealloc %a : memref<128x512xf32, #nisa.mem<sbuf>>
  %c = memref.alloc() : memref<128x16xf32, #nisa.mem<sbuf>>
  nisa.memset %c, 0.0 : memref<128x16xf32, #nisa.mem<sbuf>>
  return
}

// -----

// nisa.reuse = "lowest": first fit, the lowest free address (a dead tile's
// range is reused at once).
// CHECK-LABEL: func.func @reuse_lowest
// CHECK: memref.alloc() {nisa.address = 0 : i64} : memref<128x512xf32, #nisa.mem<sbuf>>
// CHECK: memref.alloc() {nisa.address = 2048 : i64} : memref<128x512xbf16, #nisa.mem<sbuf>>
// CHECK: memref.alloc() {nisa.address = 0 : i64} : memref<128x16xf32, #nisa.mem<sbuf>>
func.func @reuse_lowest(%x: memref<128x512xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64, nisa.reuse = "lowest"} {
  %a = memref.alloc() : memref<128x512xf32, #nisa.mem<sbuf>>
  %b = memref.alloc() : memref<128x512xbf16, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %a : memref<128x512xf32>, memref<128x512xf32, #nisa.mem<sbuf>>
  nisa.copy %a, %b : memref<128x512xf32, #nisa.mem<sbuf>>, memref<128x512xbf16, #nisa.mem<sbuf>>
  memref.dealloc %a : memref<128x512xf32, #nisa.mem<sbuf>>
  %c = memref.alloc() : memref<128x16xf32, #nisa.mem<sbuf>>
  nisa.memset %c, 0.0 : memref<128x16xf32, #nisa.mem<sbuf>>
  return
}

// -----

// Where placing by least recent use fragments SBUF (208 KiB on trn2: %c on
// never-used bytes at 128 KiB leaves no 140 KiB run for %d), the kernel is
// placed lowest first instead: %c at 0, %d right after it.
// CHECK-LABEL: func.func @fragmented
// CHECK: memref.alloc() {nisa.address = 0 : i64} : memref<128x16384xf32
// CHECK: memref.alloc() {nisa.address = 65536 : i64} : memref<128x16384xf32
// CHECK: memref.alloc() {nisa.address = 0 : i64} : memref<128x8192xf32
// CHECK: memref.alloc() {nisa.address = 32768 : i64} : memref<128x35840xf32
func.func @fragmented(%x: memref<128x16384xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %a = memref.alloc() : memref<128x16384xf32, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %a : memref<128x16384xf32>, memref<128x16384xf32, #nisa.mem<sbuf>>
  %b = memref.alloc() : memref<128x16384xf32, #nisa.mem<sbuf>>
  nisa.copy %a, %b : memref<128x16384xf32, #nisa.mem<sbuf>>, memref<128x16384xf32, #nisa.mem<sbuf>>
  %c = memref.alloc() : memref<128x8192xf32, #nisa.mem<sbuf>>
  nisa.memset %c, 0.0 : memref<128x8192xf32, #nisa.mem<sbuf>>
  nisa.dma_copy %b, %x : memref<128x16384xf32, #nisa.mem<sbuf>>, memref<128x16384xf32>
  %d = memref.alloc() : memref<128x35840xf32, #nisa.mem<sbuf>>
  nisa.memset %d, 0.0 : memref<128x35840xf32, #nisa.mem<sbuf>>
  nisa.memset %c, 1.0 : memref<128x8192xf32, #nisa.mem<sbuf>>
  return
}

// -----

// A tile allocated outside a loop and used inside it stays live for the
// whole loop, so a tile allocated in the loop body never overlaps it.
// CHECK-LABEL: func.func @loop_liveness
// CHECK: memref.alloc() {nisa.address = 0 : i64} : memref<128x4xf32, #nisa.mem<sbuf>>
// CHECK: scf.for
// CHECK: memref.alloc() {nisa.address = 16 : i64} : memref<128x4xf32, #nisa.mem<sbuf>>
func.func @loop_liveness() attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %acc = memref.alloc() : memref<128x4xf32, #nisa.mem<sbuf>>
  scf.for %i = %c0 to %c4 step %c1 {
    %t = memref.alloc() : memref<128x4xf32, #nisa.mem<sbuf>>
    nisa.memset %t, 1.0 : memref<128x4xf32, #nisa.mem<sbuf>>
    nisa.tensor_tensor add %acc, %t, %acc : memref<128x4xf32, #nisa.mem<sbuf>>, memref<128x4xf32, #nisa.mem<sbuf>>, memref<128x4xf32, #nisa.mem<sbuf>>
    memref.dealloc %t : memref<128x4xf32, #nisa.mem<sbuf>>
  }
  return
}

// -----

// A tile used only through a view (here the row sums an activation writes)
// is live until the last instruction using the view, not just the view: a
// view taken before a loop keeps its tile through the loop, so the tile
// allocated inside the loop gets bytes of its own.
// CHECK-LABEL: func.func @view_liveness
// CHECK: memref.alloc() {nisa.address = 0 : i64} : memref<128x2xf32, #nisa.mem<sbuf>>
// CHECK: scf.for
// CHECK: memref.alloc() {nisa.address = 8 : i64} : memref<128x4xf32, #nisa.mem<sbuf>>
func.func @view_liveness() attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %sums = memref.alloc() : memref<128x2xf32, #nisa.mem<sbuf>>
  %col = memref.reinterpret_cast %sums to offset: [1], sizes: [128, 1], strides: [2, 1] : memref<128x2xf32, #nisa.mem<sbuf>> to memref<128x1xf32, strided<[2, 1], offset: 1>, #nisa.mem<sbuf>>
  scf.for %i = %c0 to %c2 step %c1 {
    %t = memref.alloc() : memref<128x4xf32, #nisa.mem<sbuf>>
    nisa.memset %t, 1.0 : memref<128x4xf32, #nisa.mem<sbuf>>
    nisa.activation exp %t, %t accumulate %col : memref<128x4xf32, #nisa.mem<sbuf>>, memref<128x4xf32, #nisa.mem<sbuf>>, memref<128x1xf32, strided<[2, 1], offset: 1>, #nisa.mem<sbuf>>
    memref.dealloc %t : memref<128x4xf32, #nisa.mem<sbuf>>
  }
  return
}

// -----

// PSUM tiles that fit in a 2 KiB bank never straddle two banks; a fixed
// address is kept; HBM allocations are not on-chip tiles.
// CHECK-LABEL: func.func @psum_banks
// CHECK: memref.alloc() {nisa.address = 0 : i64} : memref<128x384xf32, #nisa.mem<psum>>
// CHECK: memref.alloc() {nisa.address = 2048 : i64} : memref<128x256xf32, #nisa.mem<psum>>
// CHECK: memref.alloc() {nisa.address = 4096 : i64} : memref<128x8xf32, #nisa.mem<sbuf>>
// CHECK: memref.alloc() : memref<16xf32>
func.func @psum_banks() attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %p0 = memref.alloc() : memref<128x384xf32, #nisa.mem<psum>>
  %p1 = memref.alloc() : memref<128x256xf32, #nisa.mem<psum>>
  %s = memref.alloc() {nisa.address = 4096 : i64} : memref<128x8xf32, #nisa.mem<sbuf>>
  %h = memref.alloc() : memref<16xf32>
  nisa.memset %p0, 0.0 : memref<128x384xf32, #nisa.mem<psum>>
  nisa.memset %p1, 0.0 : memref<128x256xf32, #nisa.mem<psum>>
  nisa.memset %s, 0.0 : memref<128x8xf32, #nisa.mem<sbuf>>
  return
}

// -----

// More live tiles than SBUF holds is an error naming the tile.
func.func @too_big() attributes {nisa.kernel, nisa.num_inputs = 0 : i64} {
  %a = memref.alloc() : memref<128x40000xf32, #nisa.mem<sbuf>>
  // expected-error @+1 {{needs 160000 bytes per partition of sbuf but 1 live tiles already use 160000}}
  %b = memref.alloc() : memref<128x40000xf32, #nisa.mem<sbuf>>
  nisa.tensor_tensor add %a, %a, %b : memref<128x40000xf32, #nisa.mem<sbuf>>, memref<128x40000xf32, #nisa.mem<sbuf>>, memref<128x40000xf32, #nisa.mem<sbuf>>
  return
}

// -----

// With nisa.reuse = "least_recent" a new tile takes never-used bytes before
// freed ones, then the bytes freed longest ago (64 KiB tiles, 208 KiB of
// SBUF on trn2): %c avoids %a's range (just freed), %d takes %a's range, freed
// before %b's.
// CHECK-LABEL: func.func @least_recent
// CHECK: memref.alloc() {nisa.address = 0 : i64}
// CHECK: memref.alloc() {nisa.address = 65536 : i64}
// CHECK: memref.alloc() {nisa.address = 131072 : i64}
// CHECK: memref.alloc() {nisa.address = 0 : i64}
func.func @least_recent(%x: memref<128x16384xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64, nisa.reuse = "least_recent"} {
  %a = memref.alloc() : memref<128x16384xf32, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %a : memref<128x16384xf32>, memref<128x16384xf32, #nisa.mem<sbuf>>
  %b = memref.alloc() : memref<128x16384xf32, #nisa.mem<sbuf>>
  nisa.copy %a, %b : memref<128x16384xf32, #nisa.mem<sbuf>>, memref<128x16384xf32, #nisa.mem<sbuf>>
  %c = memref.alloc() : memref<128x16384xf32, #nisa.mem<sbuf>>
  nisa.copy %b, %c : memref<128x16384xf32, #nisa.mem<sbuf>>, memref<128x16384xf32, #nisa.mem<sbuf>>
  %d = memref.alloc() : memref<128x16384xf32, #nisa.mem<sbuf>>
  nisa.copy %c, %d : memref<128x16384xf32, #nisa.mem<sbuf>>, memref<128x16384xf32, #nisa.mem<sbuf>>
  return
}

// -----

// expected-error @+1 {{'nisa.reuse' is "lowest" or "least_recent" on a kernel function}}
func.func @bad_reuse() attributes {nisa.kernel, nisa.num_inputs = 0 : i64, nisa.reuse = "newest"} {
  return
}
