// RUN: neuron-opt %s -split-input-file -verify-diagnostics

func.func @dma_shape(%a: memref<4x8xf32>, %b: memref<4x9xf32>) {
  // expected-error @+1 {{source and destination must have the same shape}}
  nisa.dma_copy %a, %b : memref<4x8xf32>, memref<4x9xf32>
  return
}

// -----

func.func @dma_partitions(%a: memref<129x8xf32>, %b: memref<129x8xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{uses 129 partitions; trn2 has 128}}
  nisa.dma_copy %a, %b : memref<129x8xf32>, memref<129x8xf32, #nisa.mem<sbuf>>
  return
}

// -----

module attributes {nisa.target = "trn9"} {
  func.func @unknown_target(%a: memref<4x8xf32>, %b: memref<4x8xf32, #nisa.mem<sbuf>>) {
    // expected-error @+1 {{unknown target}}
    nisa.dma_copy %a, %b : memref<4x8xf32>, memref<4x8xf32, #nisa.mem<sbuf>>
    return
  }
}

// -----

func.func @gather_table(%t: memref<8x4xf32, #nisa.mem<sbuf>>, %i: memref<4x1xi32, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{table must be in HBM}}
  nisa.dma_gather %t[%i], %d : memref<8x4xf32, #nisa.mem<sbuf>>, memref<4x1xi32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gather_psum(%t: memref<8x4xf32>, %i: memref<4x1xi32, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{destination must be in SBUF (engine cannot access PSUM)}}
  nisa.dma_gather %t[%i], %d : memref<8x4xf32>, memref<4x1xi32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @gather_index_type(%t: memref<8x4xf32>, %i: memref<4x1xf32, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{indices must be integers}}
  nisa.dma_gather %t[%i], %d : memref<8x4xf32>, memref<4x1xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gather_column(%t: memref<8x4xf32>, %i: memref<4x2xi32, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{indices must be a [P, 1] column}}
  nisa.dma_gather %t[%i], %d : memref<8x4xf32>, memref<4x2xi32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gather_width(%t: memref<8x4xf32>, %i: memref<4x1xi32, #nisa.mem<sbuf>>, %d: memref<4x5xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{must agree on D}}
  nisa.dma_gather %t[%i], %d : memref<8x4xf32>, memref<4x1xi32, #nisa.mem<sbuf>>, memref<4x5xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @scatter_dst(%s: memref<4x4xf32, #nisa.mem<sbuf>>, %i: memref<4x1xi32, #nisa.mem<sbuf>>, %d: memref<8x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must be in HBM}}
  nisa.dma_scatter %s, %d[%i] : memref<4x4xf32, #nisa.mem<sbuf>>, memref<8x4xf32, #nisa.mem<sbuf>>, memref<4x1xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @scatter_disjoint_accumulates(%s: memref<4x4xf32, #nisa.mem<sbuf>>, %i: memref<4x1xi32, #nisa.mem<sbuf>>, %d: memref<8x4xf32>) {
  // expected-error @+1 {{disjoint scatters overwrite rows: no accumulate}}
  nisa.dma_scatter %s, %d[%i] {accumulate, disjoint} : memref<4x4xf32, #nisa.mem<sbuf>>, memref<8x4xf32>, memref<4x1xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @scatter_source(%s: memref<4x4xf32>, %i: memref<4x1xi32, #nisa.mem<sbuf>>, %d: memref<8x4xf32>) {
  // expected-error @+1 {{source must be in SBUF or PSUM, not HBM}}
  nisa.dma_scatter %s, %d[%i] : memref<4x4xf32>, memref<8x4xf32>, memref<4x1xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @scatter_index_type(%s: memref<4x4xf32, #nisa.mem<sbuf>>, %i: memref<4x1xf32, #nisa.mem<sbuf>>, %d: memref<8x4xf32>) {
  // expected-error @+1 {{indices must be integers}}
  nisa.dma_scatter %s, %d[%i] : memref<4x4xf32, #nisa.mem<sbuf>>, memref<8x4xf32>, memref<4x1xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @scatter_column(%s: memref<4x4xf32, #nisa.mem<sbuf>>, %i: memref<3x1xi32, #nisa.mem<sbuf>>, %d: memref<8x4xf32>) {
  // expected-error @+1 {{indices must be a [P, 1] column}}
  nisa.dma_scatter %s, %d[%i] : memref<4x4xf32, #nisa.mem<sbuf>>, memref<8x4xf32>, memref<3x1xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @scatter_width(%s: memref<4x4xf32, #nisa.mem<sbuf>>, %i: memref<4x1xi32, #nisa.mem<sbuf>>, %d: memref<8x5xf32>) {
  // expected-error @+1 {{must agree on D}}
  nisa.dma_scatter %s, %d[%i] : memref<4x4xf32, #nisa.mem<sbuf>>, memref<8x5xf32>, memref<4x1xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @matmul_rank(%s: memref<4xbf16, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{operands must be 2-d tiles}}
  nisa.matmul %s, %s, %d : memref<4xbf16, #nisa.mem<sbuf>>, memref<4xbf16, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

// A moving operand of more than three free dims.
func.func @matmul_moving_rank(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %m: memref<4x1x2x2x1xbf16, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{operands must be 2-d tiles}}
  nisa.matmul %s, %m, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x1x2x2x1xbf16, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

// An is_transpose matmul's moving operand is its [K, K] identity.
func.func @transpose_moving_rank(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %m: memref<4x2x2xbf16, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{operands must be 2-d tiles}}
  nisa.matmul %s, %m, %d {is_transpose} : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x2x2xbf16, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

// N is the product of the moving operand's free dims.
func.func @matmul_window_size(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %m: memref<4x2x3xbf16, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{destination must be [M, N] = [4, 6]}}
  nisa.matmul %s, %m, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x2x3xbf16, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @matmul_sbuf(%s: memref<4x4xbf16>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{stationary and moving operands must be in SBUF}}
  nisa.matmul %s, %s, %d : memref<4x4xbf16>, memref<4x4xbf16>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @matmul_psum(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must be in PSUM}}
  nisa.matmul %s, %s, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @matmul_f32(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %d: memref<4x4xbf16, #nisa.mem<psum>>) {
  // expected-error @+1 {{PSUM accumulates in f32}}
  nisa.matmul %s, %s, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x4xbf16, #nisa.mem<psum>>
  return
}

// -----

func.func @matmul_dtypes(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %m: memref<4x4xf32, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{stationary and moving must have the same dtype}}
  nisa.matmul %s, %m, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @matmul_int(%s: memref<4x4xi32, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{TensorE takes fp8, bf16, fp16 or fp32 operands, not 'i32'}}
  nisa.matmul %s, %s, %d : memref<4x4xi32, #nisa.mem<sbuf>>, memref<4x4xi32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @matmul_k(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %m: memref<8x4xbf16, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{contraction (partition) sizes differ: 4 vs 8}}
  nisa.matmul %s, %m, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<8x4xbf16, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @matmul_kmax(%s: memref<256x4xbf16, #nisa.mem<sbuf>>, %d: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{contraction size 256 exceeds 128}}
  nisa.matmul %s, %s, %d : memref<256x4xbf16, #nisa.mem<sbuf>>, memref<256x4xbf16, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @matmul_stationary(%s: memref<4x256xbf16, #nisa.mem<sbuf>>, %m: memref<4x4xbf16, #nisa.mem<sbuf>>, %d: memref<256x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{stationary free size 256 exceeds 128}}
  nisa.matmul %s, %m, %d : memref<4x256xbf16, #nisa.mem<sbuf>>, memref<4x4xbf16, #nisa.mem<sbuf>>, memref<256x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @matmul_moving(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %m: memref<4x1024xbf16, #nisa.mem<sbuf>>, %d: memref<4x1024xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{moving free size 1024 exceeds 512}}
  nisa.matmul %s, %m, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x1024xbf16, #nisa.mem<sbuf>>, memref<4x1024xf32, #nisa.mem<psum>>
  return
}

// -----

// Trainium3 matmuls may write up to 4096 fp32 columns (all eight banks).
module attributes {nisa.target = "trn3"} {
  func.func @matmul_moving_trn3(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %m: memref<4x1024xbf16, #nisa.mem<sbuf>>, %d: memref<4x1024xf32, #nisa.mem<psum>>) {
    nisa.matmul %s, %m, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x1024xbf16, #nisa.mem<sbuf>>, memref<4x1024xf32, #nisa.mem<psum>>
    return
  }
}

// -----

func.func @matmul_dst(%s: memref<4x4xbf16, #nisa.mem<sbuf>>, %d: memref<4x8xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{destination must be [M, N] = [4, 4]}}
  nisa.matmul %s, %s, %d : memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x8xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @activation_hbm(%a: memref<4x4xf32>, %b: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source must be in SBUF or PSUM, not HBM}}
  nisa.activation exp %a, %b : memref<4x4xf32>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_shape(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %b: memref<4x5xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source and destination must have the same shape}}
  nisa.activation exp %a, %b : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x5xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_bias(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %c: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{bias must be a [P, 1] column}}
  nisa.activation exp %a, %a bias %c : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_scale_col_shape(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %s: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{scale_col must be a [P, 1] column matching the partitions of the data}}
  nisa.activation exp %a, %a scale_col %s : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_scale_col_partitions(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %s: memref<2x1xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{scale_col must be a [P, 1] column matching the partitions of the data}}
  nisa.activation exp %a, %a scale_col %s : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<2x1xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_scale_col_dtype(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %s: memref<4x1xbf16, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{scale_col must be f32}}
  nisa.activation exp %a, %a scale_col %s : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x1xbf16, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_scale_col_hbm(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %s: memref<4x1xf32>) {
  // expected-error @+1 {{scale_col must be in SBUF or PSUM, not HBM}}
  nisa.activation exp %a, %a scale_col %s : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x1xf32>
  return
}

// -----

func.func @activation_accumulate_shape(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %r: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{accumulate must be a [P, 1] column matching the partitions of the data}}
  nisa.activation exp %a, %a accumulate %r : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_accumulate_partitions(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %r: memref<8x1xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{accumulate must be a [P, 1] column matching the partitions of the data}}
  nisa.activation exp %a, %a accumulate %r : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<8x1xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_accumulate_dtype(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %b: memref<4x4xbf16, #nisa.mem<sbuf>>, %r: memref<4x1xbf16, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{accumulate must be f32}}
  nisa.activation exp %a, %b accumulate %r : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xbf16, #nisa.mem<sbuf>>, memref<4x1xbf16, #nisa.mem<sbuf>>
  return
}

// -----

func.func @activation_accumulate_hbm(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %r: memref<4x1xf32>) {
  // expected-error @+1 {{accumulate must be in SBUF or PSUM, not HBM}}
  nisa.activation exp %a, %a accumulate %r : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x1xf32>
  return
}

// -----

func.func @activation_types(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %r: memref<4x1xf32, #nisa.mem<sbuf>>) {
  // Each present optional operand needs its type after dst's.
  // expected-error @+1 {{expected ','}}
  nisa.activation exp %a, %a accumulate %r : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stt_engine(%a: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{runs on vector or gpsimd, not scalar}}
  nisa.scalar_tensor_tensor multiply, add %a, %a, %a {engine = #nisa.engine<scalar>} : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stt_gpsimd_psum(%a: memref<4x4xf32, #nisa.mem<psum>>, %b: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{on GpSimd cannot access PSUM}}
  nisa.scalar_tensor_tensor multiply, add %a, %b, %b {engine = #nisa.engine<gpsimd>} : memref<4x4xf32, #nisa.mem<psum>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stt_hbm(%a: memref<4x4xf32>, %b: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{first operand must be in SBUF or PSUM, not HBM}}
  nisa.scalar_tensor_tensor multiply, add %a, %b, %b : memref<4x4xf32>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stt_shape(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %b: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{operands must have the same shape}}
  nisa.scalar_tensor_tensor multiply, add %a, %b, %a : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stt_dst(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %d: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{operands and destination must have the same shape}}
  nisa.scalar_tensor_tensor multiply, add %a, %a, %d : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stt_scalar(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %c: memref<2x1xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{scalar must be a [P, 1] column matching the partitions of the data}}
  nisa.scalar_tensor_tensor subtract, multiply %a, %a, %a scalar %c : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<2x1xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stt_psum(%a: memref<4x4xf32, #nisa.mem<psum>>, %b: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{at most one operand may be in PSUM}}
  nisa.scalar_tensor_tensor multiply, add %a, %a, %b : memref<4x4xf32, #nisa.mem<psum>>, memref<4x4xf32, #nisa.mem<psum>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @tt_psum(%a: memref<4x4xf32, #nisa.mem<psum>>, %b: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{at most one operand may be in PSUM}}
  nisa.tensor_tensor add %a, %a, %b : memref<4x4xf32, #nisa.mem<psum>>, memref<4x4xf32, #nisa.mem<psum>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @tt_shape(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %b: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{operands must have the same shape}}
  nisa.tensor_tensor add %a, %b, %a : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @ts_scalar(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %c: memref<2x1xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{scalar must be a [P, 1] column}}
  nisa.tensor_scalar add %a, %a scalar %c : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<2x1xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @reduce_column(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %c: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must be a [P, 1] column}}
  nisa.tensor_reduce add %a, %c : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @reduce_op(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %c: memref<4x1xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{reduction must be add, max, min or multiply}}
  nisa.tensor_reduce divide %a, %c : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x1xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @select_shape(%p: memref<4x4xi1, #nisa.mem<sbuf>>, %a: memref<4x4xf32, #nisa.mem<sbuf>>, %b: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{operands must have the same shape}}
  nisa.select %p, %a, %b, %a : memref<4x4xi1, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @copy_engine(%a: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{runs on vector, scalar or gpsimd, not tensor}}
  nisa.copy %a, %a {engine = #nisa.engine<tensor>} : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @copy_gpsimd_psum(%a: memref<4x4xf32, #nisa.mem<psum>>, %b: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source must be in SBUF (engine cannot access PSUM)}}
  nisa.copy %a, %b {engine = #nisa.engine<gpsimd>} : memref<4x4xf32, #nisa.mem<psum>>, memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @memset_hbm(%a: memref<4x4xf32>) {
  // expected-error @+1 {{destination must be in SBUF or PSUM, not HBM}}
  nisa.memset %a, 0.0 : memref<4x4xf32>
  return
}

// -----

func.func @iota_multipliers(%a: memref<4x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{needs one multiplier per free dim}}
  nisa.iota %a {base = 0.0, channel_multiplier = 1.0, multipliers = array<f64>} : memref<4x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @iota_offset_iv_times_size(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %c0 to %c4 step %c1 {
    // A size is a term of its own, never an iv's coefficient.
    %o = arith.muli %i, %n : index
    // expected-error @+1 {{offset must be built from index constants, arith.addi, arith.muli by a constant, scf.for ivs and size expressions}}
    nisa.iota %a offset %o {base = 0.0, channel_multiplier = 1.0, multipliers = array<f64: 1.0>} : memref<4x4xf32, #nisa.mem<sbuf>>
  }
  return
}

// -----

func.func @iota_offset_not_affine(%a: memref<4x4xf32, #nisa.mem<sbuf>>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %c0 to %c4 step %c1 {
    // A product of two ivs is not affine.
    %o = arith.muli %i, %i : index
    // expected-error @+1 {{offset must be built from index constants}}
    nisa.iota %a offset %o {base = 0.0, channel_multiplier = 1.0, multipliers = array<f64: 1.0>} : memref<4x4xf32, #nisa.mem<sbuf>>
  }
  return
}

// -----

func.func @tt_dst(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %d: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{operands and destination must have the same shape}}
  nisa.tensor_tensor add %a, %a, %d : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @iota_psum(%a: memref<4x4xf32, #nisa.mem<psum>>) {
  // expected-error @+1 {{destination must be in SBUF (engine cannot access PSUM)}}
  nisa.iota %a {base = 0.0, channel_multiplier = 1.0, multipliers = array<f64: 1.0>} : memref<4x4xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @tile_rank(%a: memref<f32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must have a partition dim}}
  nisa.memset %a, 0.0 : memref<f32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @ts_shape(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %d: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source and destination must have the same shape}}
  nisa.tensor_scalar add %a, %d {imm = 1.0 : f64} : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @address_negative() {
  // expected-error @+1 {{'nisa.address' must be a non-negative integer}}
  %t = memref.alloc() {nisa.address = -4 : i64} : memref<128x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @address_hbm() {
  // expected-error @+1 {{'nisa.address' belongs on the memref.alloc of a static SBUF or PSUM tile}}
  %t = memref.alloc() {nisa.address = 0 : i64} : memref<128x4xf32>
  return
}

// -----

func.func @address_capacity() {
  // expected-error @+1 {{tile at byte 212000 needs 1024 bytes per partition; sbuf has 212728}}
  %t = memref.alloc() {nisa.address = 212000 : i64} : memref<128x256xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @address_bank() {
  // expected-error @+1 {{PSUM tile at byte 1024 (2048 bytes) crosses a 2048-byte bank boundary}}
  %t = memref.alloc() {nisa.address = 1024 : i64} : memref<128x512xf32, #nisa.mem<psum>>
  return
}

// -----

func.func @id_not_instruction() {
  // expected-error @+1 {{'nisa.id' belongs on a nisa instruction}}
  %t = memref.alloc() {nisa.id = 0 : i64} : memref<4xf32>
  return
}

// -----

func.func @id_negative(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{'nisa.id' must be a non-negative integer}}
  nisa.dma_copy %a, %b {nisa.id = -1 : i64} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @waits_type(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{'nisa.waits' must be an array<i64> of ids}}
  nisa.dma_copy %a, %b {nisa.waits = [0]} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

// expected-error @+1 {{'nisa.synchronized' is a unit attribute of a kernel function}}
module attributes {nisa.synchronized} {
}

// -----

func.func @unknown_attr(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{unknown nisa attribute 'nisa.wait'}}
  nisa.dma_copy %a, %b {nisa.wait = array<i64: 0>} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @tensor_tensor_on_scalar(%a: memref<4x8xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{runs on vector or gpsimd, not scalar}}
  nisa.tensor_tensor add %a, %a, %a {engine = #nisa.engine<scalar>} : memref<4x8xf32, #nisa.mem<sbuf>>, memref<4x8xf32, #nisa.mem<sbuf>>, memref<4x8xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @dma_on_vector(%a: memref<4x8xf32>, %b: memref<4x8xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{runs on scalar, gpsimd or sync, not vector}}
  nisa.dma_copy %a, %b {engine = #nisa.engine<vector>} : memref<4x8xf32>, memref<4x8xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @memset_on_scalar(%a: memref<4x8xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{runs on vector or gpsimd, not scalar}}
  nisa.memset %a, 0.0 {engine = #nisa.engine<scalar>} : memref<4x8xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @tensor_scalar_on_tensor(%a: memref<4x8xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{runs on vector, scalar or gpsimd, not tensor}}
  nisa.tensor_scalar multiply %a, %a {engine = #nisa.engine<tensor>, imm = 2.0 : f64} : memref<4x8xf32, #nisa.mem<sbuf>>, memref<4x8xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @gpsimd_psum(%a: memref<4x8xf32, #nisa.mem<psum>>, %b: memref<4x1xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{on GpSimd cannot access PSUM}}
  nisa.tensor_reduce add %a, %b {engine = #nisa.engine<gpsimd>} : memref<4x8xf32, #nisa.mem<psum>>, memref<4x1xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @rand_seed_shape(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %s: memref<4x1xi32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{seed must be an i32 [P, 2] tile matching the destination's partitions}}
  nisa.rand %a, %s {channel_multiplier = 4.0, multipliers = array<f64: 1.0>} : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x1xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @rand_seed_type(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %s: memref<4x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{seed must be an i32 [P, 2] tile}}
  nisa.rand %a, %s {channel_multiplier = 4.0, multipliers = array<f64: 1.0>} : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @rand_integer_dst(%a: memref<4x4xi32, #nisa.mem<sbuf>>, %s: memref<4x2xi32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must have a float element type}}
  nisa.rand %a, %s {channel_multiplier = 4.0, multipliers = array<f64: 1.0>} : memref<4x4xi32, #nisa.mem<sbuf>>, memref<4x2xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @rand_multipliers(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %s: memref<4x2xi32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{needs one multiplier per free dim}}
  nisa.rand %a, %s {channel_multiplier = 4.0, multipliers = array<f64>} : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @rand_psum(%a: memref<4x4xf32, #nisa.mem<psum>>, %s: memref<4x2xi32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must be in SBUF (engine cannot access PSUM)}}
  nisa.rand %a, %s {channel_multiplier = 4.0, multipliers = array<f64: 1.0>} : memref<4x4xf32, #nisa.mem<psum>>, memref<4x2xi32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @rand_stream(%a: memref<4x4xf32, #nisa.mem<sbuf>>, %s: memref<4x2xi32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{stream must fit in 32 unsigned bits}}
  nisa.rand %a, %s {stream = -1, channel_multiplier = 4.0, multipliers = array<f64: 1.0>} : memref<4x4xf32, #nisa.mem<sbuf>>, memref<4x2xi32, #nisa.mem<sbuf>>
  return
}
