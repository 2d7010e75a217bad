// RUN: neuron-opt %s -split-input-file -verify-diagnostics

func.func @gather_psum(%s: memref<128x64xbf16, #nisa.mem<psum>>, %i: memref<128x8xi32, #nisa.mem<sbuf>>, %d: memref<128x8xbf16, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source must be in SBUF (engine cannot access PSUM)}}
  nisa.n_gather %s[%i], %d : memref<128x64xbf16, #nisa.mem<psum>>, memref<128x8xi32, #nisa.mem<sbuf>>, memref<128x8xbf16, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gather_hbm_indices(%s: memref<128x64xbf16, #nisa.mem<sbuf>>, %i: memref<128x8xi32>, %d: memref<128x8xbf16, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{indices must be in SBUF or PSUM, not HBM}}
  nisa.n_gather %s[%i], %d : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x8xi32>, memref<128x8xbf16, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gather_partitions(%s: memref<128x64xbf16, #nisa.mem<sbuf>>, %i: memref<64x8xi32, #nisa.mem<sbuf>>, %d: memref<128x8xbf16, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source, indices and destination must have one partition count}}
  nisa.n_gather %s[%i], %d : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<64x8xi32, #nisa.mem<sbuf>>, memref<128x8xbf16, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gather_i64(%s: memref<128x64xbf16, #nisa.mem<sbuf>>, %i: memref<128x8xi64, #nisa.mem<sbuf>>, %d: memref<128x8xbf16, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{indices must be i32}}
  nisa.n_gather %s[%i], %d : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x8xi64, #nisa.mem<sbuf>>, memref<128x8xbf16, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gather_cast(%s: memref<128x64xbf16, #nisa.mem<sbuf>>, %i: memref<128x8xi32, #nisa.mem<sbuf>>, %d: memref<128x8xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must have the source's element type}}
  nisa.n_gather %s[%i], %d : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x8xi32, #nisa.mem<sbuf>>, memref<128x8xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gather_count(%s: memref<128x64xbf16, #nisa.mem<sbuf>>, %i: memref<128x4xi32, #nisa.mem<sbuf>>, %d: memref<128x8xbf16, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{needs one index per destination element}}
  nisa.n_gather %s[%i], %d : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x4xi32, #nisa.mem<sbuf>>, memref<128x8xbf16, #nisa.mem<sbuf>>
  return
}

// -----

// TensorE's transpose mode (is_transpose) streams a square identity.
func.func @transpose_not_square(%s: memref<128x64xbf16, #nisa.mem<sbuf>>, %i: memref<128x64xbf16, #nisa.mem<sbuf>>, %d: memref<64x64xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{an is_transpose matmul takes a square moving identity [K, K], without accumulate, double_row or scales}}
  nisa.matmul %s, %i, %d {is_transpose} : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x64xbf16, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @transpose_accumulate(%s: memref<128x64xbf16, #nisa.mem<sbuf>>, %i: memref<128x128xbf16, #nisa.mem<sbuf>>, %d: memref<64x128xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{an is_transpose matmul takes a square moving identity}}
  nisa.matmul %s, %i, %d {is_transpose, accumulate} : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x128xbf16, #nisa.mem<sbuf>>, memref<64x128xf32, #nisa.mem<psum>>
  return
}
