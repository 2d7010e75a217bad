// RUN: env TORCHNEURON_TARGET_DIR=%S/../../passes/flex_attention/Inputs neuron-opt %s -verify-diagnostics

// A chip without FP8 double_row: a target file with no matmul_fp8_k_factor.
module attributes {nisa.target = "smallsbuf"} {
  func.func @double_row_target(%s: memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
    // expected-error @+1 {{target 'smallsbuf' has no double_row}}
    nisa.matmul %s, %s, %d {double_row} : memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
    return
  }
}
