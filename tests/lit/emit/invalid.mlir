// RUN: not neuron-translate --emit-program --split-input-file %s 2>&1 | FileCheck %s

// CHECK: error: no kernel function (run neuron-lower-to-nisa)
func.func @not_lowered(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

// CHECK: error: an index argument of a kernel is a size parameter with a name and a min
func.func @scalar_arg(%x: memref<4xf32>, %n: index) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  return
}

// -----

// CHECK: error: loop bounds must be constants
func.func @dynamic_loop(%x: memref<4xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %c0 to %c4 step %c1 {
    scf.for %j = %c0 to %i step %c1 {
    }
  }
  return
}

// -----

// CHECK: error: index is not affine in the enclosing loop ivs
func.func @nonaffine(%x: memref<16xf32>, %y: memref<16xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %c0 to %c4 step %c1 {
    %sq = arith.muli %i, %i : index
    %v = memref.reinterpret_cast %x to offset: [%sq], sizes: [1, 1], strides: [1, 1] : memref<16xf32> to memref<1x1xf32, strided<[1, 1], offset: ?>>
    %w = memref.reinterpret_cast %y to offset: [%sq], sizes: [1, 1], strides: [1, 1] : memref<16xf32> to memref<1x1xf32, strided<[1, 1], offset: ?>>
    nisa.dma_copy %v, %w : memref<1x1xf32, strided<[1, 1], offset: ?>>, memref<1x1xf32, strided<[1, 1], offset: ?>>
  }
  return
}

// -----

// CHECK: error: 'arith.constant' op cannot be emitted into a kernel program
func.func @foreign(%x: memref<4xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %s = arith.constant 1.0 : f32
  return
}

// -----

// CHECK: error: on-chip tile has no nisa.address (run nisa-allocate)
func.func @unallocated(%x: memref<128x4xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %t = memref.alloc() : memref<128x4xf32, #nisa.mem<sbuf>>
  nisa.dma_copy %x, %t : memref<128x4xf32>, memref<128x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

// CHECK: error: instruction of a synchronized kernel needs a unique nisa.id
func.func @unnumbered(%x: memref<4x4xf32>, %y: memref<4x4xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64, nisa.synchronized} {
  nisa.dma_copy %x, %y {nisa.id = 0 : i64} : memref<4x4xf32>, memref<4x4xf32>
  nisa.dma_copy %x, %y : memref<4x4xf32>, memref<4x4xf32>
  return
}

// -----

// CHECK: error: waits for unknown instruction id 7
func.func @unknown_wait(%x: memref<4x4xf32>, %y: memref<4x4xf32>) attributes {nisa.kernel, nisa.num_inputs = 1 : i64, nisa.synchronized} {
  nisa.dma_copy %x, %y {nisa.id = 0 : i64, nisa.waits = array<i64: 7>} : memref<4x4xf32>, memref<4x4xf32>
  return
}

// -----

// A buffer with dynamic dims needs their sizes over the params (issue #16).
// CHECK: error: a kernel buffer with dynamic dims needs their sizes (neuron.dims over the params)
func.func @dynamic_without_dims(%x: memref<?x4xf32>, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  return
}

// -----

// A loop count that is neither a constant nor arith on the params (here an
// enclosing loop's iv: the program's loops have counts fixed per instance).
// CHECK: error: index is neither a constant nor a size expression of the kernel's params
func.func @iv_loop_count(%x: memref<4xf32>, %n: index {neuron.size = {name = "s0", min = 1 : i64}}) attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.for %i = %c0 to %n step %c1 {
    scf.for %j = %c0 to %i step %c1 {
    }
  }
  return
}
