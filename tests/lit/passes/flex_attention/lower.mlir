// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | FileCheck %s
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | sed -n '/@causal/,/@relative_bias/p' | grep -c "nisa.matmul" | FileCheck %s --check-prefix=MATMULS
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | sed -n '/@causal/,/@relative_bias/p' | grep -c "nisa.select" | FileCheck %s --check-prefix=SELECTS
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | sed -n '/@next_head_in_pieces/,$p' | grep -c "nisa.dma_copy.*memref<128x1x64xf32, strided<\[64, 8192, 1\]" | FileCheck %s --check-prefix=PIECES
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | neuron-opt | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: neuron-opt %s --neuron-lower-to-nisa=target=trn2 | sed -n '/@next_head_in_pieces/,/@f16_causal/p' | FileCheck %s --check-prefix=ALPHA

// Causal blocks of a 256-row sequence: query tile 0 sees key unit 0 (partial)
// and skips unit 1 (masked); query tile 1 sees unit 0 (full) and unit 1
// (partial), one key step of 256 keys that masks its second unit only. The
// tiles run in lanes, interleaved, longest first. Matmuls: per key step
// S = QK^T (2), per unit PV (3), and the TensorE transposes of P: a step's
// last 128-key chunk (2); a DMA transposes tile 1's first chunk; per partial
// unit its mask on TensorE (2): 9.
// mask_mod runs once: q >= kv reads q - kv alone, and both partial units are
// at q0 - kv0 = 0, so they share one cached bias.
// MATMULS: 9
// SELECTS: 1

// CHECK-LABEL: func.func @causal
// CHECK: nisa.iota %{{.*}} {base = 0.000000e+00 : f64, channel_multiplier = 1.000000e+00 : f64, multipliers = array<f64: -1.000000e+00>}
// The masks' TensorE operands: 2^64 I, and -2^64 for masked scores (their
// product overflows to -inf; 0 * -2^64 is 0, where 0 * -inf would be NaN).
// CHECK: nisa.tensor_scalar multiply {{.*}} {imm = 1.8446744073709552E+19 : f64}
// CHECK: nisa.memset {{.*}}, -1.8446744073709552E+19
// V, then K^T and Q^T by transposing DMAs.
// CHECK-COUNT-3: nisa.dma_copy
// mask_mod of the first partial unit, ahead of its scores, on GpSimd: q - kv
// by one iota, >= 0, a 0 / -inf bias into the mask cache (no more selects).
// CHECK: nisa.iota %{{.*}} offset %{{.*}} {base = 0.000000e+00 : f64, channel_multiplier = 1.000000e+00 : f64, multipliers = array<f64: -1.000000e+00>}
// CHECK: nisa.tensor_scalar ge {{.*}}engine = #nisa.engine<gpsimd>
// CHECK: nisa.select {{.*}} : {{.*}}, memref<128x128xf32, strided<[1024, 1], offset: ?>, #nisa.mem<sbuf>>
// The first round: both lanes' scores (query tile 0: 128 keys, tile 1: 256),
// each partial unit's bias accumulated onto its scores in PSUM by TensorE,
// then the max over all the step's keys (VectorE adds no mask).
// CHECK: nisa.matmul {{.*}}, memref<128x128xf32, {{.*}}psum
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[PART:[a-z_0-9]+]] {accumulate} : memref<128x128xf32, strided<[128, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x128xf32, strided<[1024, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x128xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// CHECK: nisa.matmul {{.*}}, memref<128x256xf32, {{.*}}psum
// CHECK: nisa.matmul {{.*}} {accumulate} : memref<128x128xf32, strided<[128, 1], offset: ?>, {{.*}}, memref<128x128xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// CHECK-NOT: nisa.tensor_tensor
// CHECK: nisa.tensor_reduce max %{{.*}} : memref<128x128xf32
// CHECK: nisa.scalar_tensor_tensor
// CHECK-NOT: nisa.tensor_tensor
// CHECK: nisa.tensor_reduce max %{{.*}} : memref<128x256xf32
// The next round: both lanes' probabilities with their row sums.
// CHECK: nisa.activation exp {{.*}} accumulate
// CHECK: nisa.activation exp {{.*}} accumulate
// CHECK-NOT: nisa.select
func.func @causal(%q: tensor<1x1x256x64xf32>, %k: tensor<1x1x256x64xf32>, %v: tensor<1x1x256x64xf32>) -> tensor<1x1x256x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32> -> tensor<1x1x256x64xf32>, tensor<1x1x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x1x256x64xf32>
}

// A relative position bias table[kv - q + 255] is read backwards along the
// query rows: each window is loaded in reverse (positive strides) and flipped
// back by a matmul against the anti-identity (iota p + j - 127 == 0).
// CHECK-LABEL: func.func @relative_bias
// CHECK: nisa.iota %{{.*}} {base = -1.270000e+02 : f64, channel_multiplier = 1.000000e+00 : f64, multipliers = array<f64: 1.000000e+00>}
// CHECK: nisa.tensor_scalar eq
// CHECK: nisa.dma_copy %{{.*}}, %[[REV:[a-z_0-9]+]] : memref<128x128xf32, strided<[1, 1], offset: ?>>
// CHECK: nisa.matmul %{{.*}}, %[[REV]], %{{.*}} : memref<128x128xf32
// CHECK: nisa.copy
func.func @relative_bias(%q: tensor<1x1x256x64xf32>, %k: tensor<1x1x256x64xf32>, %v: tensor<1x1x256x64xf32>, %t: tensor<511xf32>) -> tensor<1x1x256x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v score_buffers(%t : tensor<511xf32>) {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32> -> tensor<1x1x256x64xf32>, tensor<1x1x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %tab: tensor<511xf32>):
      %d = neuron.binary sub %kvi, %qi : tensor<i32>, tensor<i32> -> tensor<i32>
      %c = neuron.constant dense<255> : tensor<i32>
      %i = neuron.binary add %d, %c : tensor<i32>, tensor<i32> -> tensor<i32>
      %x = neuron.gather %tab[%i] : tensor<511xf32>, tensor<i32> -> tensor<f32>
      %r = neuron.binary add %s, %x : tensor<f32>, tensor<f32> -> tensor<f32>
      neuron.yield %r : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x1x256x64xf32>
}

// An output read only through transpose(1, 2) is written in the layout the
// transpose gives, [B, L, H, D]: each query tile's rows are stored H * D = 128
// apart, and the transposed result is already contiguous. Returned, it is
// written straight into the kernel's output.
// CHECK-LABEL: func.func @heads_inner
// CHECK-SAME: %[[OUT:arg3]]: memref<1x256x2x64xf32>
// CHECK-NOT: memref.alloc() : memref<1x256x2x64xf32>
// CHECK: %[[ROWS:.*]] = memref.reinterpret_cast %[[OUT]] to offset: [%{{.*}}], sizes: [128, 64], strides: [128, 1]
// CHECK: nisa.dma_copy %{{.*}}, %[[ROWS]] : memref<128x64xf32, {{.*}}#nisa.mem<sbuf>>, memref<128x64xf32, strided<[128, 1], offset: ?>>
func.func @heads_inner(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) -> tensor<1x256x2x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[2, 2], [2, 2]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  %t = neuron.transpose %o, [0, 2, 1, 3] : tensor<1x2x256x64xf32> -> tensor<1x256x2x64xf32>
  return %t : tensor<1x256x2x64xf32>
}

// With the log-sum-exp returned, each query tile leaves its row sums and
// -max in SBUF columns; the head's logs are taken once, after its last tile
// (one ScalarE table load instead of two per tile), and stored in one DMA.
// CHECK-LABEL: func.func @with_lse
// CHECK-NOT: nisa.activation log
// CHECK-COUNT-2: nisa.copy {{.*}} : memref<128x1xf32, strided<[{{6|9}}, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x1xf32, strided<[2, 1], offset: ?>
// CHECK-NOT: nisa.activation log
// CHECK-COUNT-2: nisa.copy {{.*}} : memref<128x1xf32, strided<[{{6|9}}, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x1xf32, strided<[2, 1], offset: ?>
// CHECK: nisa.activation log {{.*}}: memref<128x2xf32
// CHECK: nisa.tensor_tensor subtract
// CHECK: nisa.dma_copy {{.*}} : memref<128x2xf32, strided<[2, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x2xf32, strided<[1, 128], offset: ?>>
// CHECK-NOT: nisa.activation log
// CHECK: return
func.func @with_lse(%q: tensor<1x1x256x64xf32>, %k: tensor<1x1x256x64xf32>, %v: tensor<1x1x256x64xf32>) -> (tensor<1x1x256x64xf32>, tensor<1x1x256xf32>) {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32> -> tensor<1x1x256x64xf32>, tensor<1x1x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o, %l : tensor<1x1x256x64xf32>, tensor<1x1x256xf32>
}

// The constants' memsets print as f64 values that parse back to themselves:
// -inf, and fp32's largest finite value (an fp32 APFloat in an f64
// attribute printed as 0xFF800000, which reads back as a denormal double).
// ROUNDTRIP: nisa.memset %{{.*}}, 0xFFF0000000000000
// ROUNDTRIP: nisa.memset %{{.*}}, 3.4028234663852886E+38

// Four key heads: the first loads whole, and each next one in pieces of one
// key unit (V rows, K^T and Q^T columns) spread over the rounds of the head
// before it (8 pieces in 6 rounds: two in front of round 0), so no load
// holds the DMA queues in front of the rounds' P^T transposes. 3 heads x 8.
// PIECES: 24
// A later step's rescale factor exp(max_old - max_new) is e^x on GpSimd
// (ScalarE's exps and VectorE's max bound the kernel), never a ScalarE exp.
// ALPHA-NOT: scale = -1.000000e+00
// ALPHA: nisa.tensor_tensor subtract %{{.*}}, %{{.*}}, %[[ALPHA:[a-z_0-9]+]] {engine = #nisa.engine<gpsimd>}
// ALPHA-NEXT: nisa.tensor_scalar pow %[[ALPHA]], %[[ALPHA]] {engine = #nisa.engine<gpsimd>, imm = 2.7182818284590451 : f64, reverse}
// ALPHA-NOT: scale = -1.000000e+00
// CHECK-LABEL: func.func @next_head_in_pieces
// CHECK: nisa.dma_copy {{.*}} : memref<128x8x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<64x1024xf32, strided<[1, 64], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<64x1024xf32, strided<[1, 64], offset: ?>>
// CHECK-COUNT-3: nisa.matmul {{.*}}memref<128x512xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// CHECK-COUNT-2: nisa.dma_copy {{.*}} : memref<128x1x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK-COUNT-3: nisa.matmul {{.*}}memref<128x512xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// CHECK: nisa.dma_copy {{.*}} : memref<128x1x64xf32, strided<[64, 8192, 1], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<64x128xf32, strided<[1, 64], offset: ?>>
// CHECK: nisa.dma_copy {{.*}} : memref<64x128xf32, strided<[1, 64], offset: ?>>
// CHECK-COUNT-3: nisa.matmul {{.*}}memref<128x512xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// The three lanes end their first query tiles in one round: lane 0 stores
// its output there, lanes 1 and 2 a round and two later (three stores at
// once held the DMA queues in front of the next rounds' P^T transposes).
// CHECK: nisa.tensor_scalar divide
// CHECK: nisa.dma_copy {{.*}} : memref<128x64xf32, strided<[576, 1], offset: ?>, #nisa.mem<sbuf>>, memref<128x64xf32, strided<[64, 1], offset: ?>>
// CHECK: nisa.tensor_scalar divide
// CHECK-NOT: nisa.dma_copy {{.*}}, memref<128x64xf32, strided<[64, 1], offset: ?>>
// CHECK: nisa.tensor_scalar divide
// CHECK-NOT: nisa.dma_copy {{.*}}, memref<128x64xf32, strided<[64, 1], offset: ?>>
// CHECK: nisa.matmul {{.*}}memref<128x512xf32, strided<[4096, 1], offset: ?>, #nisa.mem<psum>>
// CHECK: nisa.dma_copy {{.*}}, memref<128x64xf32, strided<[64, 1], offset: ?>>
func.func @next_head_in_pieces(%q: tensor<1x4x1024x64xf32>, %k: tensor<1x4x1024x64xf32>, %v: tensor<1x4x1024x64xf32>) -> tensor<1x4x1024x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<2> : tensor<1x1x8x8xi8>, scale = 1.250000e-01 : f64} : tensor<1x4x1024x64xf32>, tensor<1x4x1024x64xf32>, tensor<1x4x1024x64xf32> -> tensor<1x4x1024x64xf32>, tensor<1x4x1024xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.constant dense<true> : tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x4x1024x64xf32>
}

// f16 cannot hold 2^64: its partial units' biases (0 / -inf) are added to the
// scores in PSUM by VectorE.
// CHECK-LABEL: func.func @f16_causal
// CHECK-NOT: imm = 1.8446744073709552E+19
// CHECK: nisa.select {{.*}} : {{.*}}, memref<128x128xf32, strided<[1024, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul {{.*}}, memref<128x128xf32, {{.*}}psum
// CHECK-NOT: {accumulate}
// CHECK: nisa.matmul {{.*}}, memref<128x256xf32, {{.*}}psum
// CHECK: nisa.tensor_tensor add [[PART:%[a-z_0-9]+]], %{{[a-z_0-9]+}}, [[PART]] : memref<128x128xf32, {{.*}}psum
// CHECK: nisa.tensor_reduce max %{{.*}} : memref<128x128xf32
func.func @f16_causal(%q: tensor<1x1x256x64xf16>, %k: tensor<1x1x256x64xf16>, %v: tensor<1x1x256x64xf16>) -> tensor<1x1x256x64xf16> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x256x64xf16>, tensor<1x1x256x64xf16>, tensor<1x1x256x64xf16> -> tensor<1x1x256x64xf16>, tensor<1x1x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x1x256x64xf16>
}
