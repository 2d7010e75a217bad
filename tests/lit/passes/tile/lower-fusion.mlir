// RUN: neuron-opt %s --neuron-lower-to-nisa | FileCheck %s

// A fused softmax on bf16 rows: the widening cast costs nothing (engines
// read bf16 exactly as fp32), x - max and exp are one activation with the
// negated row max as its bias that also sums its rows (no tensor_reduce
// add), the narrowing cast folds into the divide (which stores bf16
// straight into the output tile), and the instructions spread over VectorE,
// ScalarE and GpSimd. Steps alternate between slots.
// CHECK-LABEL: func.func @softmax_bf16
// CHECK-NOT: nisa.copy
// CHECK: nisa.dma_copy
// CHECK: nisa.tensor_reduce max {{.*}} : memref<128x64xbf16, {{.*}}>, memref<128x1xf32
// CHECK: nisa.tensor_scalar multiply {{.*}}imm = -1.000000e+00 : f64}
// CHECK: nisa.activation exp %{{.*}}, %{{.*}} bias %{{.*}} accumulate %{{.*}} : memref<128x64xbf16
// CHECK-NOT: nisa.tensor_reduce add
// CHECK: nisa.tensor_scalar divide {{.*}} scalar {{.*}} : memref<128x64xf32, {{.*}}>, memref<128x64xbf16
// CHECK-NOT: nisa.copy
// CHECK: return
func.func @softmax_bf16(%x: tensor<256x64xbf16>) -> tensor<256x64xbf16> {
  %r = neuron.fusion(%x) : (tensor<256x64xbf16>) -> tensor<256x64xbf16> {
  ^bb0(%a: tensor<256x64xbf16>):
    %w = neuron.cast %a : tensor<256x64xbf16> -> tensor<256x64xf32>
    %m = neuron.reduce max %w {count = 1} : tensor<256x64xf32> -> tensor<256xf32>
    %r1 = neuron.reshape %m : tensor<256xf32> -> tensor<256x1xf32>
    %b = neuron.broadcast %r1 : tensor<256x1xf32> -> tensor<256x64xf32>
    %d = neuron.binary sub %w, %b : tensor<256x64xf32>, tensor<256x64xf32> -> tensor<256x64xf32>
    %e = neuron.unary exp %d : tensor<256x64xf32> -> tensor<256x64xf32>
    %s = neuron.reduce sum %e {count = 1} : tensor<256x64xf32> -> tensor<256xf32>
    %r2 = neuron.reshape %s : tensor<256xf32> -> tensor<256x1xf32>
    %b2 = neuron.broadcast %r2 : tensor<256x1xf32> -> tensor<256x64xf32>
    %y = neuron.binary div %e, %b2 : tensor<256x64xf32>, tensor<256x64xf32> -> tensor<256x64xf32>
    %n = neuron.cast %y : tensor<256x64xf32> -> tensor<256x64xbf16>
    neuron.yield %n : tensor<256x64xbf16>
  }
  return %r : tensor<256x64xbf16>
}

// A linear layer's weight transpose moves no data: the matmul streams the
// weight through transposing DMA windows ([K, N] read from [N, K]).
// CHECK-LABEL: func.func @linear
// CHECK-NOT: memref.alloc() : memref<256x512xbf16>
// CHECK: memref.reinterpret_cast %arg1 to offset: [%{{.*}}], sizes: [128, 512], strides: [1, 256]
// CHECK: nisa.matmul
func.func @linear(%x: tensor<128x256xbf16>, %w: tensor<512x256xbf16>) -> tensor<128x512xbf16> {
  %t = neuron.transpose %w, [1, 0] : tensor<512x256xbf16> -> tensor<256x512xbf16>
  %y = neuron.matmul %x, %t : tensor<128x256xbf16>, tensor<256x512xbf16> -> tensor<128x512xbf16>
  return %y : tensor<128x512xbf16>
}

// RMSNorm: x * x and its row sum are one activation (square, accumulating
// fp32 sums; a bf16 sum is copied narrow), and x * rsqrt(...) * w is one
// scalar_tensor_tensor with the row as its scalar.
// CHECK-LABEL: func.func @rms_norm
// CHECK: nisa.activation square %{{.*}}, %{{.*}} accumulate %[[SUMS:[a-z_0-9]+]]
// CHECK-NOT: nisa.tensor_reduce
// CHECK: nisa.copy %[[SUMS]]
// CHECK: nisa.activation rsqrt
// CHECK: nisa.scalar_tensor_tensor multiply, multiply
func.func @rms_norm(%x: tensor<256x512xbf16>, %w: tensor<512xbf16>) -> tensor<256x512xbf16> {
  %r = neuron.fusion(%x, %w) : (tensor<256x512xbf16>, tensor<512xbf16>) -> tensor<256x512xbf16> {
  ^bb0(%a: tensor<256x512xbf16>, %g: tensor<512xbf16>):
    %inv = neuron.constant dense<1.953130e-03> : tensor<256x1xbf16>
    %eps = neuron.constant dense<9.983770e-07> : tensor<256x1xbf16>
    %sq = neuron.binary mul %a, %a : tensor<256x512xbf16>, tensor<256x512xbf16> -> tensor<256x512xbf16>
    %s = neuron.reduce sum %sq {count = 1} : tensor<256x512xbf16> -> tensor<256xbf16>
    %s1 = neuron.reshape %s : tensor<256xbf16> -> tensor<256x1xbf16>
    %m = neuron.binary mul %s1, %inv : tensor<256x1xbf16>, tensor<256x1xbf16> -> tensor<256x1xbf16>
    %e = neuron.binary add %m, %eps : tensor<256x1xbf16>, tensor<256x1xbf16> -> tensor<256x1xbf16>
    %rs = neuron.unary rsqrt %e : tensor<256x1xbf16> -> tensor<256x1xbf16>
    %b = neuron.broadcast %rs : tensor<256x1xbf16> -> tensor<256x512xbf16>
    %n = neuron.binary mul %a, %b : tensor<256x512xbf16>, tensor<256x512xbf16> -> tensor<256x512xbf16>
    %gb = neuron.broadcast %g : tensor<512xbf16> -> tensor<256x512xbf16>
    %y = neuron.binary mul %n, %gb : tensor<256x512xbf16>, tensor<256x512xbf16> -> tensor<256x512xbf16>
    neuron.yield %y : tensor<256x512xbf16>
  }
  return %r : tensor<256x512xbf16>
}

// The halves of `chunk` (column slices: rows of 1024 elements, 2048 apart)
// feeding a SwiGLU are read in place: the group goes by rows of 1024 and
// loads each half's tile through its window (row stride 2048, the second
// half at offset 1024), with no copy of either half first. (Rows shorter
// than a DMA moves well per partition, 2 KiB, are copied: the group would
// store in rows as short.)
// CHECK-LABEL: func.func @swiglu_halves
// CHECK-NOT: memref.alloc() : memref<256x1024xbf16>
// CHECK: memref.reinterpret_cast %arg0 to offset: [%{{.*}}], sizes: [128, 1024], strides: [2048, 1]
// CHECK: nisa.dma_copy
// CHECK: memref.reinterpret_cast %arg0 to offset: [%{{.*}}], sizes: [128, 1024], strides: [2048, 1]
// CHECK: nisa.dma_copy
// CHECK: nisa.activation
// CHECK: return
func.func @swiglu_halves(%x: tensor<256x2048xbf16>) -> tensor<256x1024xbf16> {
  %g = neuron.slice %x {offsets = array<i64: 0, 0>, strides = array<i64: 1, 1>} : tensor<256x2048xbf16> -> tensor<256x1024xbf16>
  %u = neuron.slice %x {offsets = array<i64: 0, 1024>, strides = array<i64: 1, 1>} : tensor<256x2048xbf16> -> tensor<256x1024xbf16>
  %r = neuron.fusion(%g, %u) : (tensor<256x1024xbf16>, tensor<256x1024xbf16>) -> tensor<256x1024xbf16> {
  ^bb0(%a: tensor<256x1024xbf16>, %b: tensor<256x1024xbf16>):
    %w = neuron.cast %a : tensor<256x1024xbf16> -> tensor<256x1024xf32>
    %s = neuron.unary sigmoid %w : tensor<256x1024xf32> -> tensor<256x1024xf32>
    %m = neuron.binary mul %w, %s : tensor<256x1024xf32>, tensor<256x1024xf32> -> tensor<256x1024xf32>
    %n = neuron.cast %m : tensor<256x1024xf32> -> tensor<256x1024xbf16>
    %y = neuron.binary mul %n, %b : tensor<256x1024xbf16>, tensor<256x1024xbf16> -> tensor<256x1024xbf16>
    neuron.yield %y : tensor<256x1024xbf16>
  }
  return %r : tensor<256x1024xbf16>
}

// Rotary cos broadcast over the heads ([1, 1, 1024, 128] seen as
// [1, 4, 1024, 128]) is read in place: the flat group's tiles narrow to one
// repeat of the block (128 partitions of 1024), so every step reads the
// block at the same offset; nothing is materialized. (Blocks of less than
// 2 KiB per partition are copied: the DMAs would move too little.)
// CHECK-LABEL: func.func @rotary_cos
// CHECK-NOT: memref.alloc() : memref<1x4x1024x128xbf16>
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c0{{.*}}], sizes: [128, 1024], strides: [1024, 1]
// CHECK: return
func.func @rotary_cos(%q: tensor<1x4x1024x128xbf16>, %cos: tensor<1x1x1024x128xbf16>) -> tensor<1x4x1024x128xbf16> {
  %c = neuron.broadcast %cos : tensor<1x1x1024x128xbf16> -> tensor<1x4x1024x128xbf16>
  %r = neuron.fusion(%q, %c) : (tensor<1x4x1024x128xbf16>, tensor<1x4x1024x128xbf16>) -> tensor<1x4x1024x128xbf16> {
  ^bb0(%a: tensor<1x4x1024x128xbf16>, %b: tensor<1x4x1024x128xbf16>):
    %y = neuron.binary mul %a, %b : tensor<1x4x1024x128xbf16>, tensor<1x4x1024x128xbf16> -> tensor<1x4x1024x128xbf16>
    neuron.yield %y : tensor<1x4x1024x128xbf16>
  }
  return %r : tensor<1x4x1024x128xbf16>
}

// A concat of slices copies each window straight into its place (dims
// merged: [1, 4, 256, 64] as 1024 rows of 64), with no copy of the slice.
// CHECK-LABEL: func.func @concat_halves
// CHECK-NOT: memref.alloc() : memref<1x4x256x64xbf16>
// CHECK: memref.reinterpret_cast %arg0 to offset: [%c64{{.*}}], sizes: [1024, 64], strides: [128, 1]
// CHECK: nisa.dma_copy
// CHECK: memref.reinterpret_cast %arg0 to offset: [%c0{{.*}}], sizes: [1024, 64], strides: [128, 1]
// CHECK: nisa.dma_copy
// CHECK: return
func.func @concat_halves(%x: tensor<1x4x256x128xbf16>) -> tensor<1x4x256x128xbf16> {
  %lo = neuron.slice %x {offsets = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1, 1, 1>} : tensor<1x4x256x128xbf16> -> tensor<1x4x256x64xbf16>
  %hi = neuron.slice %x {offsets = array<i64: 0, 0, 0, 64>, strides = array<i64: 1, 1, 1, 1>} : tensor<1x4x256x128xbf16> -> tensor<1x4x256x64xbf16>
  %r = neuron.concat %hi, %lo {dim = 3 : i64} : tensor<1x4x256x64xbf16>, tensor<1x4x256x64xbf16> -> tensor<1x4x256x128xbf16>
  return %r : tensor<1x4x256x128xbf16>
}

// A KV cache's append (torch.cat along the positions): each head's 2048
// rows are one run on both sides, but 8 runs would give the copy to one
// DMA engine (the engines share an HBM-to-HBM copy by its leading dim's
// rows, 8 apiece): the copy leads with 128 pieces of each run (4 KiB
// each), so all 16 engines take a share. The new row, 8 runs of 256 bytes,
// stays as it is.
// CHECK-LABEL: func.func @kv_append
// CHECK: memref.reinterpret_cast %arg0 to offset: [%c0{{.*}}], sizes: [128, 8, 2048], strides: [2048, 262144, 1]
// CHECK: nisa.dma_copy
// CHECK: memref.reinterpret_cast %arg1 to offset: [%c0{{.*}}], sizes: [8, 128], strides: [128, 1]
func.func @kv_append(%cache: tensor<1x8x2048x128xbf16>, %new: tensor<1x8x1x128xbf16>) -> tensor<1x8x2049x128xbf16> {
  %y = neuron.concat %cache, %new {dim = 2 : i64} : tensor<1x8x2048x128xbf16>, tensor<1x8x1x128xbf16> -> tensor<1x8x2049x128xbf16>
  return %y : tensor<1x8x2049x128xbf16>
}

// A window whose rows overlap (a row broadcast down the columns) is not
// rows of its buffer: it is copied contiguous first, as before.
// CHECK-LABEL: func.func @broadcast_window
// CHECK: memref.alloc() : memref<256x256xf32>
// CHECK: nisa.dma_copy {{.*}} : memref<256x256xf32, strided<[?, 1], {{.*}}>>, memref<256x256xf32, strided<[256, 1], {{.*}}>>
// CHECK: return
func.func @broadcast_window(%v: tensor<256xf32>, %x: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %b = neuron.broadcast %v : tensor<256xf32> -> tensor<256x256xf32>
  %r = neuron.fusion(%b, %x) : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32> {
  ^bb0(%a: tensor<256x256xf32>, %c: tensor<256x256xf32>):
    %y = neuron.binary add %a, %c : tensor<256x256xf32>, tensor<256x256xf32> -> tensor<256x256xf32>
    neuron.yield %y : tensor<256x256xf32>
  }
  return %r : tensor<256x256xf32>
}

// Per-channel values over rows too long for SBUF (BatchNorm over 112 x 112
// in float32: 49 KiB a row) in a group that reduces nothing: each row folds
// into 4 rows of 3136 (tiles of [128, 3136]), and the channel values load
// once before the steps, [128, steps], each of the 64 channels over 4
// partitions (a stride-0 dim in the load), each step reading its column.
// CHECK-LABEL: func.func @folded_rows
// CHECK: memref.alloc() : memref<128x2xf32, #nisa.mem<sbuf>>
// CHECK: memref.reinterpret_cast %arg1 to offset: [%{{.*}}], sizes: [32, 4, 2], strides: [1, %{{.*}}, 32]
// CHECK: nisa.dma_copy
// CHECK: nisa.dma_copy {{.*}} : memref<128x3136xf32
// CHECK: nisa.tensor_scalar multiply {{.*}} scalar {{.*}} : memref<128x3136xf32
// CHECK-NOT: nisa.dma_copy {{.*}} memref<128x1xf32
func.func @folded_rows(%x: tensor<64x12544xf32>, %w: tensor<64xf32>) -> tensor<64x12544xf32> {
  %r = neuron.fusion(%x, %w) : (tensor<64x12544xf32>, tensor<64xf32>) -> tensor<64x12544xf32> {
  ^bb0(%a: tensor<64x12544xf32>, %c: tensor<64xf32>):
    %r1 = neuron.reshape %c : tensor<64xf32> -> tensor<64x1xf32>
    %b = neuron.broadcast %r1 : tensor<64x1xf32> -> tensor<64x12544xf32>
    %y = neuron.binary mul %a, %b : tensor<64x12544xf32>, tensor<64x12544xf32> -> tensor<64x12544xf32>
    neuron.yield %y : tensor<64x12544xf32>
  }
  return %r : tensor<64x12544xf32>
}
