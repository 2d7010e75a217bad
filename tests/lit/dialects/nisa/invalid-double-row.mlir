// RUN: neuron-opt %s -split-input-file -verify-diagnostics

// FP8 double_row matmuls (nisa.matmul {double_row}): [K, 2, M] x [K, 2, N].

func.func @double_row_rank(%s: memref<128x64xf8E4M3FN, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{double_row and MX operands must be [K, R, M] and [K, R, N], the destination 2-d}}
  nisa.matmul %s, %s, %d {double_row} : memref<128x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @double_row_bf16(%s: memref<128x2x64xbf16, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{double_row takes fp8 operands, not 'bf16' and 'bf16'}}
  nisa.matmul %s, %s, %d {double_row} : memref<128x2x64xbf16, #nisa.mem<sbuf>>, memref<128x2x64xbf16, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @double_row_rows(%s: memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{double_row operands must have 2 rows per partition (dim 1)}}
  nisa.matmul %s, %s, %d {double_row} : memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @fp8_with_bf16(%s: memref<128x64xf8E4M3FN, #nisa.mem<sbuf>>, %m: memref<128x64xbf16, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{stationary and moving must have the same dtype (or both be fp8)}}
  nisa.matmul %s, %m, %d : memref<128x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x64xbf16, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  return
}
