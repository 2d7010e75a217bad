// RUN: neuron-opt %s | neuron-opt | FileCheck %s

!sb = memref<128x64xf32, #nisa.mem<sbuf>>
!col = memref<128x1xf32, #nisa.mem<sbuf>>

// CHECK-LABEL: func.func @instructions
func.func @instructions(%in: memref<128x64xf32>, %out: memref<128x64xf32>,
                        %idx: memref<128x1xi32, #nisa.mem<sbuf>>) {
  %a = memref.alloc() : !sb
  %b = memref.alloc() : !sb
  %c = memref.alloc() : !col
  %ps = memref.alloc() : memref<64x64xf32, #nisa.mem<psum>>
  %st = memref.alloc() : memref<128x64xbf16, #nisa.mem<sbuf>>
  %pr = memref.alloc() : memref<128x64xi1, #nisa.mem<sbuf>>
  // CHECK: nisa.dma_copy
  nisa.dma_copy %in, %a : memref<128x64xf32>, !sb
  // CHECK: nisa.dma_gather
  nisa.dma_gather %in[%idx], %b : memref<128x64xf32>, memref<128x1xi32, #nisa.mem<sbuf>>, !sb
  // CHECK: nisa.dma_scatter {{.*}} {accumulate}
  nisa.dma_scatter %b, %in[%idx] {accumulate} : !sb, memref<128x64xf32>, memref<128x1xi32, #nisa.mem<sbuf>>
  // CHECK: nisa.matmul {{.*}} {accumulate}
  nisa.matmul %st, %st, %ps {accumulate} : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x64xbf16, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  // A convolution's window: [K, images, rows, columns], N their product.
  // CHECK: nisa.matmul {{.*}} : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x2x4x8xbf16, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  %win = memref.alloc() : memref<128x2x4x8xbf16, #nisa.mem<sbuf>>
  nisa.matmul %st, %win, %ps : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x2x4x8xbf16, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  // CHECK: nisa.matmul {{.*}} {is_transpose}
  %id = memref.alloc() : memref<128x128xbf16, #nisa.mem<sbuf>>
  %pt = memref.alloc() : memref<64x128xf32, #nisa.mem<psum>>
  nisa.matmul %st, %id, %pt {is_transpose} : memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x128xbf16, #nisa.mem<sbuf>>, memref<64x128xf32, #nisa.mem<psum>>
  // An FP8 double_row matmul, E4M3 stationary with E5M2 moving.
  %s8 = memref.alloc() : memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>
  %m8 = memref.alloc() : memref<128x2x64xf8E5M2, #nisa.mem<sbuf>>
  // CHECK: nisa.matmul {{.*}} {double_row} : memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x2x64xf8E5M2
  nisa.matmul %s8, %m8, %ps {double_row} : memref<128x2x64xf8E4M3FN, #nisa.mem<sbuf>>, memref<128x2x64xf8E5M2, #nisa.mem<sbuf>>, memref<64x64xf32, #nisa.mem<psum>>
  // CHECK: nisa.activation exp {{.*}} bias
  nisa.activation exp %a, %b bias %c {scale = 2.0 : f64} : !sb, !sb, !col
  // CHECK: nisa.tensor_tensor add
  nisa.tensor_tensor add %a, %b, %b : !sb, !sb, !sb
  // CHECK: nisa.tensor_scalar subtract {{.*}} scalar
  nisa.tensor_scalar subtract %a, %b scalar %c : !sb, !sb, !col
  // CHECK: nisa.tensor_scalar multiply {{.*}}imm = 5.000000e-01{{.*}}reverse
  nisa.tensor_scalar multiply %a, %b {imm = 0.5 : f64, reverse} : !sb, !sb
  // CHECK: nisa.tensor_reduce max
  nisa.tensor_reduce max %a, %c : !sb, !col
  // ALU instructions may run on GpSimd (and tensor_scalar on ScalarE).
  // CHECK: nisa.tensor_tensor add {{.*}}engine = #nisa.engine<gpsimd>
  nisa.tensor_tensor add %a, %b, %b {engine = #nisa.engine<gpsimd>} : !sb, !sb, !sb
  // CHECK: nisa.tensor_scalar add {{.*}}engine = #nisa.engine<scalar>
  nisa.tensor_scalar add %a, %b {engine = #nisa.engine<scalar>, imm = 1.0 : f64} : !sb, !sb
  // CHECK: nisa.select
  nisa.select %pr, %a, %b, %b : memref<128x64xi1, #nisa.mem<sbuf>>, !sb, !sb, !sb
  // CHECK: nisa.copy {{.*}}engine = #nisa.engine<scalar>
  nisa.copy %a, %st {engine = #nisa.engine<scalar>} : !sb, memref<128x64xbf16, #nisa.mem<sbuf>>
  // CHECK: nisa.memset
  nisa.memset %a, 0.0 : !sb
  // CHECK: nisa.iota
  nisa.iota %a {base = 0.0, channel_multiplier = 64.0, multipliers = array<f64: 1.0>} : !sb
  // CHECK: nisa.n_gather %{{.*}}[%{{.*}}], %{{.*}} : memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x8xi32, #nisa.mem<sbuf>>, memref<128x8xf32, #nisa.mem<sbuf>>
  %picks = memref.alloc() : memref<128x8xi32, #nisa.mem<sbuf>>
  %picked = memref.alloc() : memref<128x8xf32, #nisa.mem<sbuf>>
  nisa.n_gather %a[%picks], %picked : !sb, memref<128x8xi32, #nisa.mem<sbuf>>, memref<128x8xf32, #nisa.mem<sbuf>>
  // CHECK: nisa.rand %{{.*}}, %{{.*}} {channel_multiplier = 6.400000e+01 : f64, multipliers = array<f64: 1.000000e+00>, stream = 2 : i64} : memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x2xi32, #nisa.mem<sbuf>>
  %key = memref.alloc() : memref<128x2xi32, #nisa.mem<sbuf>>
  nisa.rand %a, %key {stream = 2, channel_multiplier = 64.0, multipliers = array<f64: 1.0>} : !sb, memref<128x2xi32, #nisa.mem<sbuf>>
  // Optional operands print with their types after dst's, in operand order.
  // CHECK: nisa.activation exp %{{.*}}, %{{.*}} bias %{{.*}} scale_col %{{.*}} accumulate %{{.*}} {scale = 5.000000e-01 : f64} : memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>
  nisa.activation exp %a, %b bias %c scale_col %c accumulate %c {scale = 0.5 : f64} : !sb, !sb, !col, !col, !col
  // CHECK: nisa.activation exp %{{.*}}, %{{.*}} accumulate %{{.*}} : memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x64xbf16, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>
  nisa.activation exp %a, %st accumulate %c : !sb, memref<128x64xbf16, #nisa.mem<sbuf>>, !col
  // CHECK: nisa.activation exp %{{.*}}, %{{.*}} scale_col %{{.*}} : memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>
  nisa.activation exp %a, %b scale_col %c : !sb, !sb, !col
  // CHECK: nisa.scalar_tensor_tensor subtract, multiply %{{.*}}, %{{.*}}, %{{.*}} scalar %{{.*}} : {{.*}}, memref<128x1xf32, #nisa.mem<sbuf>>
  nisa.scalar_tensor_tensor subtract, multiply %a, %b, %b scalar %c : !sb, !sb, !sb, !col
  // CHECK: nisa.scalar_tensor_tensor multiply, add {{.*}}engine = #nisa.engine<gpsimd>, imm = 5.000000e-01
  nisa.scalar_tensor_tensor multiply, add %a, %b, %b {engine = #nisa.engine<gpsimd>, imm = 0.5 : f64} : !sb, !sb, !sb
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c16 = arith.constant 16 : index
  // CHECK: scf.for %[[I:.*]] =
  scf.for %i = %c0 to %c4 step %c1 {
    // CHECK: %[[OFF:.*]] = arith.addi
    %base = arith.muli %i, %c16 : index
    %off = arith.addi %base, %c1 : index
    // CHECK: nisa.iota %{{.*}} offset %[[OFF]] {base = 0.000000e+00 : f64
    nisa.iota %a offset %off {base = 0.0, channel_multiplier = 64.0, multipliers = array<f64: 1.0>} : !sb
  }
  nisa.dma_copy %b, %out : !sb, memref<128x64xf32>
  return
}
