// RUN: neuron-opt %s --nisa-allocate --nisa-insert-sync | neuron-translate --emit-program | FileCheck %s
// RUN: neuron-run %s | FileCheck %s --check-prefix=EXEC

// A hand-written kernel using the flash-attention instructions in a loop:
// an activation with a per-partition scale column and fp32 row sums, an
// iota whose offset moves with the loop, and a scalar_tensor_tensor.
// Program JSON keys come out sorted.
// The activation's scale column and row sums are views named scale_col and
// reduce_res (matmul's "accumulate" is a boolean). It waits for the loads
// of its input (0, 1) and, since it writes the row sums as well as dst, for
// the stores of the previous iteration's exp (3) and row sums (4).
// CHECK: "func":"exp",{{.*}}"op":"activation","reduce_res":{"buf":[[ACC:[0-9]+]],"offset":{"const":0,"terms":[]},"shape":[128,1],"strides":[1,1]},"scale":0.5,"scale_col":{"buf":[[SC:[0-9]+]],"offset":{"const":0,"terms":[]},"shape":[128,1],"strides":[1,1]},"src":{{.*}},"waits":[0,1,3,4]}
// CHECK-SAME: "op":"dma_copy","src":{"buf":[[ACC]],

// The iota's offset is an affine form over loop counters, as a view's.
// CHECK-SAME: {"base":0.0,"channel_multiplier":256.0,"dst":{{.*}},"engine":"gpsimd",{{.*}}"multipliers":[1.0],"offset":{"const":0,"terms":{{\[\[}}0,128]]},"op":"iota",

// scalar_tensor_tensor: (a op0 s) op1 b with s the column, so no "imm".
// CHECK-SAME: {"a":{{.*}},"alu_op0":"subtract","alu_op1":"multiply","b":{{.*}},"dst":{{.*}},"engine":"vector",{{.*}}"op":"scalar_tensor_tensor","scalar":{"buf":[[SC]],
// With an immediate, "imm" is written and there is no "scalar".
// CHECK-SAME: {"a":{{.*}},"alu_op0":"add","alu_op1":"max","b":{{.*}},"engine":"gpsimd","imm":-1.0,{{.*}}"op":"scalar_tensor_tensor","waits":[6]}
// CHECK-SAME: "count":2,"loop":0

// The whole chain runs: emitted, loaded, executed, and timed with the
// compiler's waits checked for races.
// EXEC: isa on trn2: 9 static / 17 dynamic instructions
// EXEC: modeled device time:
func.func @isa(%x: memref<128x256xf32>, %sc: memref<128x1xf32>, %y: memref<128x256xbf16>, %sums: memref<128x2xf32>, %io: memref<128x256xf32>) attributes {nisa.kernel, nisa.num_inputs = 2 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c128 = arith.constant 128 : index
  %t = memref.alloc() : memref<128x128xf32, #nisa.mem<sbuf>>
  %s = memref.alloc() : memref<128x1xf32, #nisa.mem<sbuf>>
  %e = memref.alloc() : memref<128x128xbf16, #nisa.mem<sbuf>>
  %acc = memref.alloc() : memref<128x1xf32, #nisa.mem<sbuf>>
  %it = memref.alloc() : memref<128x128xf32, #nisa.mem<sbuf>>
  nisa.dma_copy %sc, %s : memref<128x1xf32>, memref<128x1xf32, #nisa.mem<sbuf>>
  scf.for %j = %c0 to %c2 step %c1 {
    %off = arith.muli %j, %c128 : index
    %xv = memref.reinterpret_cast %x to offset: [%off], sizes: [128, 128], strides: [256, 1] : memref<128x256xf32> to memref<128x128xf32, strided<[256, 1], offset: ?>>
    %yv = memref.reinterpret_cast %y to offset: [%off], sizes: [128, 128], strides: [256, 1] : memref<128x256xbf16> to memref<128x128xbf16, strided<[256, 1], offset: ?>>
    %sv = memref.reinterpret_cast %sums to offset: [%j], sizes: [128, 1], strides: [2, 1] : memref<128x2xf32> to memref<128x1xf32, strided<[2, 1], offset: ?>>
    %iov = memref.reinterpret_cast %io to offset: [%off], sizes: [128, 128], strides: [256, 1] : memref<128x256xf32> to memref<128x128xf32, strided<[256, 1], offset: ?>>
    nisa.dma_copy %xv, %t : memref<128x128xf32, strided<[256, 1], offset: ?>>, memref<128x128xf32, #nisa.mem<sbuf>>
    nisa.activation exp %t, %e scale_col %s accumulate %acc {scale = 0.5 : f64} : memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x128xbf16, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>
    nisa.dma_copy %e, %yv : memref<128x128xbf16, #nisa.mem<sbuf>>, memref<128x128xbf16, strided<[256, 1], offset: ?>>
    nisa.dma_copy %acc, %sv : memref<128x1xf32, #nisa.mem<sbuf>>, memref<128x1xf32, strided<[2, 1], offset: ?>>
    // Element (p, i) of this iteration's tile is element p * 256 + j * 128 + i of x.
    nisa.iota %it offset %off {base = 0.0, channel_multiplier = 256.0, multipliers = array<f64: 1.0>} : memref<128x128xf32, #nisa.mem<sbuf>>
    nisa.scalar_tensor_tensor subtract, multiply %t, %it, %it scalar %s : memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>
    nisa.scalar_tensor_tensor add, max %it, %it, %it {imm = -1.0 : f64, engine = #nisa.engine<gpsimd>} : memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x128xf32, #nisa.mem<sbuf>>
    nisa.dma_copy %it, %iov : memref<128x128xf32, #nisa.mem<sbuf>>, memref<128x128xf32, strided<[256, 1], offset: ?>>
  }
  return
}
