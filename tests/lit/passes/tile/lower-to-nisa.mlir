// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s
// The lowered IR prints and parses back (dumps are reproducible).
// RUN: neuron-opt %s --neuron-lower-to-nisa | neuron-opt | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn3 | FileCheck %s --check-prefix=TRN3
// RUN: neuron-opt %s --neuron-lower-to-nisa=free-tile-bytes=256 | FileCheck %s --check-prefix=SMALL
// RUN: not neuron-opt %s --neuron-lower-to-nisa=target=trn9 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not neuron-opt %s --neuron-lower-to-nisa=free-tile-bytes=2 2>&1 | FileCheck %s --check-prefix=TINY

// Tensors become HBM buffers; results are trailing output arguments. Each
// elementwise op is a group of one (neuron-fuse-elementwise makes larger
// ones).
// CHECK-LABEL: func.func @elementwise
// CHECK-SAME: (%[[X:.*]]: memref<256x64xf32>, %[[OUT:.*]]: memref<256x64xf32>)
// CHECK-SAME: attributes {nisa.kernel, nisa.num_inputs = 1 : i64}
// 16384 elements = 128 partitions x 128: one step, so one slot per stream.
// CHECK: memref.alloc() : memref<128x128xf32, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy
// CHECK: nisa.activation exp
// The splat operand rides along as an immediate.
// CHECK: nisa.tensor_scalar multiply {{.*}}imm = 2.000000e+00 : f64}
// CHECK: nisa.dma_copy {{.*}}, %{{.*}} : memref<128x128xf32, strided<[128, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: memref.dealloc
// CHECK: return
// TRN3: module attributes {nisa.target = "trn3"}
// 256 bytes per partition: two [128, 64] steps, alternating between the two
// halves of each stream's tile.
// SMALL: memref.alloc() : memref<128x128xf32, #nisa.mem<sbuf>>
// SMALL: memref.reinterpret_cast %{{.*}} to offset: [%c0{{.*}}], sizes: [128, 64], strides: [128, 1]
// SMALL: memref.reinterpret_cast %{{.*}} to offset: [%c64{{.*}}], sizes: [128, 64], strides: [128, 1]
// BAD: error: unknown target 'trn9'
// TINY: error: free-tile-bytes must be at least 4
func.func @elementwise(%x: tensor<256x64xf32>) -> tensor<256x64xf32> {
  %e = neuron.unary exp %x : tensor<256x64xf32> -> tensor<256x64xf32>
  %c = neuron.constant dense<2.0> : tensor<256x64xf32>
  %m = neuron.binary mul %e, %c : tensor<256x64xf32>, tensor<256x64xf32> -> tensor<256x64xf32>
  return %m : tensor<256x64xf32>
}

// K = 300 accumulates in one PSUM bank per output tile over three K
// tiles: the first overwrites, the rest accumulate. M = 200 is one block of
// two M tiles whose A^T panel (all of K) is loaded once by transposing DMAs.
// Stores go from ScalarE's queue.
// CHECK-LABEL: func.func @matmul
// The full K tiles come in one transposing transfer ([k, tile, row]), the
// partial one in another.
// CHECK: memref.alloc() : memref<128x600xbf16, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy {{.*}} : memref<128x2x200xbf16, strided<[1, 128, 300], offset: ?>>, memref<128x2x200xbf16, strided<[600, 200, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy {{.*}} : memref<44x200xbf16, strided<[1, 300], offset: ?>>, memref<44x200xbf16, strided<[600, 1], offset: ?>, #nisa.mem<sbuf>>
// B tiles rotate over four slots (a load takes longer than a K step); two
// sets of four 512-column PSUM banks alternate between N groups.
// CHECK: memref.alloc() : memref<128x1024xbf16, #nisa.mem<sbuf>>
// CHECK-NEXT: memref.alloc() : memref<128x4096xf32, #nisa.mem<psum>>
// CHECK: nisa.matmul {{.*}} : memref<128x128xbf16, strided<[600, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x256xbf16, strided<[1024, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x256xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// CHECK-NOT: accumulate
// CHECK: nisa.matmul {{.*}} : memref<128x72xbf16
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<128x128xbf16
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<44x72xbf16
// Evictions alternate between VectorE and ScalarE.
// CHECK: nisa.copy {{.*}} : memref<128x256xf32
// CHECK: nisa.copy {{.*}} {engine = #nisa.engine<scalar>} : memref<72x256xf32
// CHECK: nisa.dma_copy {{.*}} {engine = #nisa.engine<scalar>}
func.func @matmul(%a: tensor<200x300xbf16>, %b: tensor<300x256xbf16>) -> tensor<200x256xbf16> {
  %m = neuron.matmul %a, %b : tensor<200x300xbf16>, tensor<300x256xbf16> -> tensor<200x256xbf16>
  return %m : tensor<200x256xbf16>
}

// Rows on the partitions, the reduced dim along the free axis in chunks.
// CHECK-LABEL: func.func @reduce
// CHECK: nisa.tensor_reduce max {{.*}} : memref<128x2048xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>
// CHECK: scf.for
// CHECK: nisa.tensor_reduce max
// CHECK: nisa.tensor_tensor max
func.func @reduce(%x: tensor<128x6144xf32>) -> tensor<128xf32> {
  %r = neuron.reduce max %x {count = 1} : tensor<128x6144xf32> -> tensor<128xf32>
  return %r : tensor<128xf32>
}

// Layout ops move no data until a consumer needs contiguous data; here the
// results are returned, so each is one strided DMA into its output, except
// the transpose: a transposing DMA into an SBUF tile (rows x rows a
// partition x columns), then a contiguous store (one HBM-to-HBM DMA would
// move it an element per descriptor), and no copy of the output onto itself
// after.
// CHECK-LABEL: func.func @layout
// CHECK: %[[SLOT:.*]] = memref.alloc() : memref<128x2048xf32, #nisa.mem<sbuf>>
// CHECK: %[[T:.*]] = memref.reinterpret_cast %[[SLOT]] to offset: [%{{.*}}], sizes: [8, 1, 4], strides: [2048, 4, 1]
// CHECK: %[[SRC:.*]] = memref.reinterpret_cast %arg0 to offset: [%{{.*}}], sizes: [8, 1, 4], strides: [1, 1, 8]
// CHECK: nisa.dma_copy %[[SRC]], %[[T]]
// CHECK: %[[DST:.*]] = memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [8, 1, 4], strides: [4, 4, 1]
// CHECK: nisa.dma_copy %{{.*}}, %[[DST]]
// CHECK-NOT: reinterpret_cast %arg2
// A broadcast's zero stride is a constant operand (strided layouts cannot
// spell zero), so the IR prints and parses back.
// CHECK: sizes: [3, 8], strides: [%c0{{.*}}, 1] : memref<8xf32> to memref<3x8xf32, strided<[?, 1], offset: ?>>
// CHECK: sizes: [4, 2], strides: [8, 3]
func.func @layout(%x: tensor<4x8xf32>, %v: tensor<8xf32>) -> (tensor<8x4xf32>, tensor<3x8xf32>, tensor<4x2xf32>, tensor<32xf32>) {
  %t = neuron.transpose %x, [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  %b = neuron.broadcast %v : tensor<8xf32> -> tensor<3x8xf32>
  %s = neuron.slice %x {offsets = array<i64: 0, 1>, strides = array<i64: 1, 3>} : tensor<4x8xf32> -> tensor<4x2xf32>
  %r = neuron.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  return %t, %b, %s, %r : tensor<8x4xf32>, tensor<3x8xf32>, tensor<4x2xf32>, tensor<32xf32>
}

// A few rows of a table that costs more to load than their descriptors: an
// indirect DMA.
// CHECK-LABEL: func.func @gather
// CHECK: memref.alloc() : memref<3x1xi64, #nisa.mem<sbuf>>
// CHECK-NEXT: memref.alloc() : memref<3x16xf32, #nisa.mem<sbuf>>
// CHECK-NOT: memref.alloc
// CHECK: nisa.dma_copy {{.*}} memref<3x1xi64, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.dma_gather
func.func @gather(%t: tensor<100000x16xf32>, %i: tensor<3xi64>) -> tensor<3x16xf32> {
  %g = neuron.gather %t[%i] : tensor<100000x16xf32>, tensor<3xi64> -> tensor<3x16xf32>
  return %g : tensor<3x16xf32>
}

// A table that fits SBUF transposed, gathered often enough to pay for its
// load, is gathered within partitions: the table in by one transposing DMA
// per 128 features (200: a whole tile and 72), after the first step's
// indices; per step the indices spread to every partition (a ones-row
// matmul) as i32, an n_gather per feature tile, TensorE transposes back
// into PSUM (is_transpose: bit for bit, infinities too), evictions a bank
// at a time, one store of whole rows from ScalarE's queue. 300 rows: two
// steps of 128 (two slots: unrolled) and a rest of 44.
// CHECK-LABEL: func.func @gather_within_partitions
// CHECK: memref.alloc() : memref<128x512xf32, #nisa.mem<sbuf>>
// CHECK: memref.reinterpret_cast %arg1 to offset: [{{.*}}], sizes: [1, 128], strides: [128, 1]
// CHECK: nisa.copy {{.*}} : memref<1x128xi64, {{.*}}>, memref<1x128xf32,
// CHECK: nisa.matmul {{.*}} : memref<1x128xf32, {{.*}}>, memref<1x128xf32, {{.*}}>, memref<128x128xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.copy {{.*}} : memref<128x128xf32, {{.*}}#nisa.mem<psum>>, memref<128x128xi32,
// CHECK: memref.reinterpret_cast %arg0 to offset: [{{.*}}], sizes: [128, 256], strides: [1, 200]
// CHECK: memref.reinterpret_cast %arg0 to offset: [{{.*}}], sizes: [72, 256], strides: [1, 200]
// CHECK: nisa.n_gather {{.*}} : memref<128x256xf32, {{.*}}>, memref<128x128xi32, {{.*}}>, memref<128x128xf32,
// CHECK: nisa.n_gather {{.*}} : memref<72x256xf32, {{.*}}>, memref<72x128xi32, {{.*}}>, memref<72x128xf32,
// CHECK: nisa.matmul {{.*}} {is_transpose} : memref<128x128xf32, {{.*}}>, memref<128x128xf32, {{.*}}>, memref<128x128xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.matmul {{.*}} {is_transpose} : memref<72x128xf32, {{.*}}>, memref<72x72xf32, {{.*}}>, memref<128x72xf32, {{.*}}#nisa.mem<psum>>
// CHECK: nisa.copy {{.*}}#nisa.mem<psum>>, memref<128x200xf32
// CHECK: nisa.dma_copy {{.*}}engine = #nisa.engine<scalar>
// CHECK: memref.reinterpret_cast %arg1 to offset: [{{.*}}], sizes: [1, 44], strides: [44, 1]
// CHECK: nisa.n_gather {{.*}} : memref<128x256xf32, {{.*}}>, memref<128x44xi32
// CHECK-NOT: nisa.dma_gather
func.func @gather_within_partitions(%t: tensor<256x200xf32>, %i: tensor<300xi64>) -> tensor<300x200xf32> {
  %g = neuron.gather %t[%i] : tensor<256x200xf32>, tensor<300xi64> -> tensor<300x200xf32>
  return %g : tensor<300x200xf32>
}

// A scatter copies its input to the result, then writes each 128 rows of
// values (here 130: two steps) by index; accumulate carries through. The
// steps' tiles rotate (one pair each here), so that a step's load does not
// wait for the previous step's scatter.
// CHECK-LABEL: func.func @scatter
// CHECK: nisa.dma_copy {{.*}} : memref<10x16xf32, {{.*}}>, memref<10x16xf32
// CHECK: %[[I0:.*]] = memref.alloc() : memref<128x1xi64, #nisa.mem<sbuf>>
// CHECK: %[[V0:.*]] = memref.alloc() : memref<128x16xf32, #nisa.mem<sbuf>>
// CHECK: %[[I1:.*]] = memref.alloc() : memref<128x1xi64, #nisa.mem<sbuf>>
// CHECK: %[[V1:.*]] = memref.alloc() : memref<128x16xf32, #nisa.mem<sbuf>>
// CHECK-NOT: memref.alloc
// CHECK: memref.reinterpret_cast %[[V0]]
// CHECK: nisa.dma_scatter {{.*}} {accumulate} : memref<128x16xf32, {{.*}}#nisa.mem<sbuf>>
// CHECK: memref.reinterpret_cast %[[V1]]
// CHECK: nisa.dma_scatter {{.*}} {accumulate} : memref<2x16xf32, {{.*}}#nisa.mem<sbuf>>
func.func @scatter(%t: tensor<10x16xf32>, %i: tensor<130xi64>, %v: tensor<130x16xf32>) -> tensor<10x16xf32> {
  %s = neuron.scatter %t[%i], %v {accumulate} : tensor<10x16xf32>, tensor<130xi64>, tensor<130x16xf32> -> tensor<10x16xf32>
  return %s : tensor<10x16xf32>
}

// Into a splat (torch.zeros(...).index_add_): the result's rows are stored
// from one tile set to it (300 rows: blocks of 128, 128 and 44), not copied
// from a constant in HBM.
// CHECK-LABEL: func.func @scatter_into_zeros
// CHECK: memref.alloc() : memref<128x16xf32, #nisa.mem<sbuf>>
// CHECK-NEXT: nisa.memset {{.*}}, 0.000000e+00
// CHECK: scf.for
// CHECK: nisa.dma_copy {{.*}} : memref<128x16xf32, {{.*}}#nisa.mem<sbuf>>, memref<128x16xf32
// CHECK: nisa.dma_copy {{.*}} : memref<44x16xf32, {{.*}}#nisa.mem<sbuf>>, memref<44x16xf32
// CHECK-NOT: memref.get_global
// CHECK: nisa.dma_scatter
func.func @scatter_into_zeros(%i: tensor<8xi64>, %v: tensor<8x16xf32>) -> tensor<300x16xf32> {
  %z = neuron.constant dense<0.0> : tensor<300x16xf32>
  %s = neuron.scatter %z[%i], %v {accumulate} : tensor<300x16xf32>, tensor<8xi64>, tensor<8x16xf32> -> tensor<300x16xf32>
  return %s : tensor<300x16xf32>
}

// A permutation (torchneuron.unpermute_rows) writes every row once: no copy
// or fill of the input first, and its scatters are disjoint (no order
// among them).
// CHECK-LABEL: func.func @scatter_permutation
// CHECK-NOT: nisa.memset
// CHECK-NOT: nisa.dma_copy {{.*}} : memref<130x16xf32, {{.*}}>, memref<130x16xf32
// CHECK: nisa.dma_scatter {{.*}} {disjoint} : memref<128x16xf32, {{.*}}#nisa.mem<sbuf>>
// CHECK: nisa.dma_scatter {{.*}} {disjoint} : memref<2x16xf32, {{.*}}#nisa.mem<sbuf>>
func.func @scatter_permutation(%i: tensor<130xi64>, %v: tensor<130x16xf32>) -> tensor<130x16xf32> {
  %s = neuron.scatter %v[%i], %v {permutation} : tensor<130x16xf32>, tensor<130xi64>, tensor<130x16xf32> -> tensor<130x16xf32>
  return %s : tensor<130x16xf32>
}

// A returned reshape of a computed result (a Linear's product returned as
// [B, L, N]): the product is stored straight into the output, its views
// taken of the output argument itself; no copy HBM to HBM after it.
// CHECK-LABEL: func.func @returned_reshape
// CHECK-NOT: memref.alloc() : memref<256x128xbf16>
// CHECK: memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [128, 128], strides: [128, 1] : memref<2x128x128xbf16>
// CHECK: memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [128, 128], strides: [128, 1] : memref<2x128x128xbf16>
// CHECK-NEXT: nisa.dma_copy
// CHECK-NOT: nisa.dma_copy
// CHECK: return
func.func @returned_reshape(%a: tensor<256x64xbf16>, %w: tensor<64x128xbf16>) -> tensor<2x128x128xbf16> {
  %m = neuron.matmul %a, %w : tensor<256x64xbf16>, tensor<64x128xbf16> -> tensor<256x128xbf16>
  %r = neuron.reshape %m : tensor<256x128xbf16> -> tensor<2x128x128xbf16>
  return %r : tensor<2x128x128xbf16>
}

// Returned both as itself and reshaped: computed into its own output, copied
// into the reshaped one.
// CHECK-LABEL: func.func @returned_twice
// CHECK: memref.reinterpret_cast %arg2 to offset: [%{{.*}}], sizes: [128, 128]
// CHECK: memref.reinterpret_cast %arg3 to offset: [%{{.*}}], sizes: [128, 256]
// CHECK: nisa.dma_copy {{.*}} : memref<128x256xbf16, strided<[256, 1], offset: ?>>, memref<128x256xbf16, strided<[256, 1], offset: ?>>
func.func @returned_twice(%a: tensor<256x64xbf16>, %w: tensor<64x128xbf16>) -> (tensor<256x128xbf16>, tensor<2x128x128xbf16>) {
  %m = neuron.matmul %a, %w : tensor<256x64xbf16>, tensor<64x128xbf16> -> tensor<256x128xbf16>
  %r = neuron.reshape %m : tensor<256x128xbf16> -> tensor<2x128x128xbf16>
  return %m, %r : tensor<256x128xbf16>, tensor<2x128x128xbf16>
}

// Random numbers: the seed is broadcast to every partition by one DMA; 301
// elements are one [128, 2] tile numbered p * 2 + i from 0, then 22 rows of
// 2 from 256, then a row of 1 from 300; each goes to HBM row-major.
// CHECK-LABEL: func.func @rand
// CHECK: %[[KEY:.*]] = memref.alloc() : memref<128x2xi32, #nisa.mem<sbuf>>
// CHECK: %[[SEED:.*]] = memref.reinterpret_cast %arg0 to offset: [{{.*}}], sizes: [128, 2], strides: [%{{.*}}, 1]
// CHECK: nisa.dma_copy %[[SEED]], %[[KEY]]
// CHECK: nisa.rand %{{.*}}, %{{.*}} offset %{{.*}} {channel_multiplier = 2.000000e+00 : f64, multipliers = array<f64: 1.000000e+00>, stream = 5 : i64} : memref<128x2xf32, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy
// CHECK: %[[C256:.*]] = arith.constant 256 : index
// CHECK: nisa.rand %{{.*}}, %{{.*}} offset %[[C256]] {{.*}} : memref<22x2xf32, #nisa.mem<sbuf>>
// CHECK: %[[LAST:.*]] = arith.addi %[[C256]], %{{.*}} : index
// CHECK: nisa.rand %{{.*}}, %{{.*}} offset %[[LAST]] {{.*}} : memref<1x1xf32, #nisa.mem<sbuf>>
func.func @rand(%seed: tensor<2xi32>) -> tensor<7x43xf32> {
  %r = neuron.rand %seed {stream = 5} : tensor<2xi32> -> tensor<7x43xf32>
  return %r : tensor<7x43xf32>
}

// CHECK-LABEL: func.func @concat
// CHECK: sizes: [2, 3], strides: [7, 1]
// CHECK: sizes: [2, 4], strides: [7, 1]
func.func @concat(%a: tensor<2x3xf32>, %b: tensor<2x4xf32>) -> tensor<2x7xf32> {
  %c = neuron.concat %a, %b {dim = 1} : tensor<2x3xf32>, tensor<2x4xf32> -> tensor<2x7xf32>
  return %c : tensor<2x7xf32>
}

// An empty result has a buffer but no instructions.
// CHECK-LABEL: func.func @empty
// CHECK-SAME: nisa.kernel
// CHECK-NEXT: return
func.func @empty(%x: tensor<4x0xf32>) -> tensor<4x0xf32> {
  %e = neuron.unary exp %x : tensor<4x0xf32> -> tensor<4x0xf32>
  return %e : tensor<4x0xf32>
}

// A transpose of more tiles than unroll (2 x 2 column chunks x 128 blocks):
// each run of like tiles a loop, its loads two tiles ahead of its stores.
// CHECK-LABEL: func.func @big_transpose
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1x4096xbf16, strided<[1, 1, 16384], offset: ?>>, memref<128x1x4096xbf16
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1x4096xbf16, strided<[1, 1, 16384], offset: ?>>, memref<128x1x4096xbf16
// CHECK: scf.for
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1x4096xbf16, strided<[1, 1, 16384], offset: ?>>, memref<128x1x4096xbf16
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1x4096xbf16, strided<[4096, 4096, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x1x4096xbf16, strided<[8192, 8192, 1], offset: ?>>
func.func @big_transpose(%x: tensor<2x8192x16384xbf16>) -> tensor<2x16384x8192xbf16> {
  %t = neuron.transpose %x, [0, 2, 1] : tensor<2x8192x16384xbf16> -> tensor<2x16384x8192xbf16>
  return %t : tensor<2x16384x8192xbf16>
}
