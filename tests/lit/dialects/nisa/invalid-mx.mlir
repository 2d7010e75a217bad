// RUN: neuron-opt %s -split-input-file -verify-diagnostics

// MX matmuls (nisa.matmul ... scales): fp8 [K, 4, M] x [K, 4, N] with E8M0
// scales ui8 [K / 8, M] and [K / 8, N], on a target with an MX TensorE.

module attributes {nisa.target = "trn3"} {
func.func @mx_and_double_row(%s: memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, %c: memref<16x64xui8, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{double_row and MX scales exclude each other}}
  nisa.matmul %s, %s, %d scales %c, %c {double_row} : memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>, memref<16x64xui8, #nisa.mem<sbuf>>, memref<16x64xui8, #nisa.mem<sbuf>>
  return
}
}

// -----

module attributes {nisa.target = "trn3"} {
func.func @mx_bf16(%s: memref<128x4x64xbf16, #nisa.mem<sbuf>>, %c: memref<16x64xui8, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{an MX matmul takes fp8 operands, not 'bf16' and 'bf16'}}
  nisa.matmul %s, %s, %d scales %c, %c : memref<128x4x64xbf16, #nisa.mem<sbuf>>, memref<128x4x64xbf16, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>, memref<16x64xui8, #nisa.mem<sbuf>>, memref<16x64xui8, #nisa.mem<sbuf>>
  return
}
}

// -----

// trn2 (the default target) has FP8 double_row but no MX mode.
func.func @mx_target(%s: memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, %c: memref<16x64xui8, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{target 'trn2' has no MX matmul}}
  nisa.matmul %s, %s, %d scales %c, %c : memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>, memref<16x64xui8, #nisa.mem<sbuf>>, memref<16x64xui8, #nisa.mem<sbuf>>
  return
}

// -----

module attributes {nisa.target = "trn3"} {
func.func @mx_rows(%s: memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>, %c: memref<16x64xui8, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{an MX matmul operands must have 4 rows per partition (dim 1)}}
  nisa.matmul %s, %s, %d scales %c, %c : memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>, memref<16x64xui8, #nisa.mem<sbuf>>, memref<16x64xui8, #nisa.mem<sbuf>>
  return
}
}

// -----

module attributes {nisa.target = "trn3"} {
func.func @mx_one_scale(%s: memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, %c: memref<16x64xui8, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{an MX matmul takes both scales}}
  "nisa.matmul"(%s, %s, %d, %c) <{operandSegmentSizes = array<i32: 1, 1, 1, 1, 0>}> : (memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>, memref<16x64xui8, #nisa.mem<sbuf>>) -> ()
  return
}
}

// -----

module attributes {nisa.target = "trn3"} {
func.func @mx_partitions(%s: memref<16x4x64xf8E4M3FN, #nisa.mem<sbuf>>, %c: memref<2x64xui8, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{an MX matmul contracts a multiple of 32 partitions, not 16}}
  nisa.matmul %s, %s, %d scales %c, %c : memref<16x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<16x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>, memref<2x64xui8, #nisa.mem<sbuf>>, memref<2x64xui8, #nisa.mem<sbuf>>
  return
}
}

// -----

module attributes {nisa.target = "trn3"} {
func.func @mx_scale_dtype(%s: memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, %c: memref<16x64xi8, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{MX scales must be ui8 tiles in SBUF}}
  nisa.matmul %s, %s, %d scales %c, %c : memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>, memref<16x64xi8, #nisa.mem<sbuf>>, memref<16x64xi8, #nisa.mem<sbuf>>
  return
}
}

// -----

module attributes {nisa.target = "trn3"} {
func.func @mx_scale_shape(%s: memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, %c: memref<32x64xui8, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{MX scales must be [16, 64] (one per 8 partitions), got 'memref<32x64xui8, #nisa.mem<sbuf>>'}}
  nisa.matmul %s, %s, %d scales %c, %c : memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x4x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>, memref<32x64xui8, #nisa.mem<sbuf>>, memref<32x64xui8, #nisa.mem<sbuf>>
  return
}
}
