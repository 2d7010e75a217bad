// RUN: neuron-opt %s -split-input-file -verify-diagnostics

func.func @on_chip(%a: memref<4x8xf32>, %t: memref<4x8xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source and destination must be in HBM}}
  nisa.collective all_reduce %a, %t {group = "0", ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<4x8xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @element_type(%a: memref<4x8xf32>, %b: memref<4x8xbf16>) {
  // expected-error @+1 {{source and destination must have one element type}}
  nisa.collective all_reduce %a, %b {group = "0", ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<4x8xbf16>
  return
}

// -----

func.func @no_ranks(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{needs the group's ranks}}
  nisa.collective all_reduce %a, %b {group = "0", ranks = array<i64>} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @repeated_rank(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{rank 0 is negative or listed twice}}
  nisa.collective all_reduce %a, %b {group = "0", ranks = array<i64: 0, 0>} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @all_reduce_size(%a: memref<4x8xf32>, %b: memref<8x8xf32>) {
  // expected-error @+1 {{all_reduce needs as many destination elements as source elements}}
  nisa.collective all_reduce %a, %b {group = "0", ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<8x8xf32>
  return
}

// -----

func.func @all_gather_size(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{all_gather needs 2 (the group's size) times the source's elements in the destination}}
  nisa.collective all_gather %a, %b {group = "0", ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @reduce_scatter_size(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{reduce_scatter needs 2 (the group's size) times the destination's elements in the source}}
  nisa.collective reduce_scatter %a, %b {group = "0", ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @kind(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{kind must be all_reduce, all_gather or reduce_scatter, not broadcast}}
  nisa.collective broadcast %a, %b {group = "0", ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @reduction(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{reduces with add, max or min, not multiply}}
  nisa.collective all_reduce %a, %b {group = "0", op = #nisa<alu multiply>, ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<4x8xf32>
  return
}

// -----

func.func @gather_reduces(%a: memref<4x8xf32>, %b: memref<8x8xf32>) {
  // expected-error @+1 {{all_gather reduces nothing; it takes no 'op'}}
  nisa.collective all_gather %a, %b {group = "0", op = #nisa<alu add>, ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<8x8xf32>
  return
}

// -----

func.func @reduction_missing(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  // expected-error @+1 {{all_reduce needs its reduction 'op' (add, max or min)}}
  nisa.collective all_reduce %a, %b {group = "0", ranks = array<i64: 0, 1>} : memref<4x8xf32>, memref<4x8xf32>
  return
}
