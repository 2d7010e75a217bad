// The tuning options of neuron-lower-to-nisa (Passes.td documents each
// default and its reason): each sizes the tiles it names, and a value out of
// range is an error.
// RUN: neuron-opt %s --neuron-lower-to-nisa=free-tile-bytes=256 | FileCheck %s --check-prefix=DEFAULT
// RUN: neuron-opt %s --neuron-lower-to-nisa="free-tile-bytes=256 stream-slots=2" | FileCheck %s --check-prefix=SLOTS
// RUN: neuron-opt %s --neuron-lower-to-nisa="free-tile-bytes=1024 stream-sbuf-percent=1" | FileCheck %s --check-prefix=STREAM
// RUN: neuron-opt %s --neuron-lower-to-nisa="free-tile-bytes=2048 inner-sbuf-percent=1" | FileCheck %s --check-prefix=INNER
// RUN: neuron-opt %s --neuron-lower-to-nisa="gemm-panel-sbuf-percent=1" | FileCheck %s --check-prefix=PANEL
// RUN: neuron-opt %s --neuron-lower-to-nisa="attention-lanes=1" | FileCheck %s --check-prefix=LANES
// RUN: neuron-opt %s --neuron-lower-to-nisa="attention-sbuf-percent=1" | FileCheck %s --check-prefix=ATTN
// RUN: not neuron-opt %s --neuron-lower-to-nisa="stream-slots=0" 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not neuron-opt %s --neuron-lower-to-nisa="attention-lanes=0" 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not neuron-opt %s --neuron-lower-to-nisa="inner-sbuf-percent=101" 2>&1 | FileCheck %s --check-prefix=PERCENT
// RUN: not neuron-opt %s --neuron-lower-to-nisa="gemm-panel-sbuf-percent=0" 2>&1 | FileCheck %s --check-prefix=NONE

// ZERO: error: stream-slots and attention-lanes must be at least 1
// PERCENT: error: inner-sbuf-percent must be between 1 and 100, not 101
// NONE: error: gemm-panel-sbuf-percent must be between 1 and 100, not 0

// 64 columns per step, 8 steps: the input and the output each rotate over
// stream-slots tiles (4 by default).
// DEFAULT-LABEL: func.func @stream
// DEFAULT-COUNT-2: memref.alloc() : memref<128x256xf32, #nisa.mem<sbuf>>
// SLOTS-LABEL: func.func @stream
// SLOTS-COUNT-2: memref.alloc() : memref<128x128xf32, #nisa.mem<sbuf>>
// Two steps of 256 columns would take two slots each (128x512); 1% of SBUF
// holds one.
// STREAM-LABEL: func.func @stream
// STREAM-COUNT-2: memref.alloc() : memref<128x256xf32, #nisa.mem<sbuf>>
func.func @stream(%x: tensor<1024x64xf32>) -> tensor<1024x64xf32> {
  %e = neuron.unary exp %x : tensor<1024x64xf32> -> tensor<1024x64xf32>
  return %e : tensor<1024x64xf32>
}

// The intermediate exp alternates between two tiles of a step (2 x 512
// columns), within inner-sbuf-percent of SBUF; in 1% it has one.
// INNER-LABEL: func.func @inner
// INNER-COUNT-2: memref.alloc() : memref<128x1024xf32, #nisa.mem<sbuf>>
// INNER-NEXT: memref.alloc() : memref<128x512xf32, #nisa.mem<sbuf>>
func.func @inner(%x: tensor<256x512xf32>) -> tensor<256x512xf32> {
  %r = neuron.fusion(%x) : (tensor<256x512xf32>) -> tensor<256x512xf32> {
  ^bb0(%a: tensor<256x512xf32>):
    %e = neuron.unary exp %a : tensor<256x512xf32> -> tensor<256x512xf32>
    %t = neuron.unary tanh %e : tensor<256x512xf32> -> tensor<256x512xf32>
    neuron.yield %t : tensor<256x512xf32>
  }
  return %r : tensor<256x512xf32>
}

// Four M tiles per block by default (output staging: 2 sets x 4 tiles x 512
// columns); when two A^T panels may take only 1% of SBUF, two.
// DEFAULT-LABEL: func.func @gemm
// DEFAULT: memref.alloc() : memref<128x4096xf32, #nisa.mem<psum>>
// DEFAULT-NEXT: memref.alloc() : memref<128x4096xf32, #nisa.mem<sbuf>>
// PANEL-LABEL: func.func @gemm
// PANEL: memref.alloc() : memref<128x4096xf32, #nisa.mem<psum>>
// PANEL-NEXT: memref.alloc() : memref<128x2048xf32, #nisa.mem<sbuf>>
func.func @gemm(%a: tensor<512x128xf32>, %b: tensor<128x512xf32>) -> tensor<512x512xf32> {
  %c = neuron.matmul %a, %b : tensor<512x128xf32>, tensor<128x512xf32> -> tensor<512x512xf32>
  return %c : tensor<512x512xf32>
}

// Three lanes by default (-max and its correction: 2 parities per lane; the
// row sums: 3 query-tile state sets per lane), one with attention-lanes=1.
// K^T of the key head has two slots of 256 keys, one when the resident
// operands may take only 1% of SBUF.
// DEFAULT-LABEL: func.func @attention
// DEFAULT-COUNT-2: memref.alloc() : memref<128x6xf32, #nisa.mem<sbuf>>
// DEFAULT-NEXT: memref.alloc() : memref<128x9xf32, #nisa.mem<sbuf>>
// DEFAULT: memref.alloc() : memref<64x512xf32, #nisa.mem<sbuf>>
// LANES-LABEL: func.func @attention
// LANES-COUNT-2: memref.alloc() : memref<128x2xf32, #nisa.mem<sbuf>>
// LANES-NEXT: memref.alloc() : memref<128x3xf32, #nisa.mem<sbuf>>
// ATTN-LABEL: func.func @attention
// ATTN: memref.alloc() : memref<64x256xf32, #nisa.mem<sbuf>>
func.func @attention(%q: tensor<1x1x256x64xf32>, %k: tensor<1x1x256x64xf32>, %v: tensor<1x1x256x64xf32>) -> tensor<1x1x256x64xf32> {
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[2, 2], [2, 2]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32>, tensor<1x1x256x64xf32> -> tensor<1x1x256x64xf32>, tensor<1x1x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.constant dense<true> : tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o : tensor<1x1x256x64xf32>
}
