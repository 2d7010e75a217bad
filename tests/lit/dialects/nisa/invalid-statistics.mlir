// RUN: neuron-opt %s -split-input-file -verify-diagnostics

func.func @stats_width(%a: memref<128x64xf32, #nisa.mem<sbuf>>, %s: memref<128x4xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must have 6 elements per partition}}
  nisa.bn_stats %a, %s : memref<128x64xf32, #nisa.mem<sbuf>>, memref<128x4xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stats_too_long(%a: memref<128x1024xf32, #nisa.mem<sbuf>>, %s: memref<128x6xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source has 1024 elements per partition; bn_stats takes 1 to 512}}
  nisa.bn_stats %a, %s : memref<128x1024xf32, #nisa.mem<sbuf>>, memref<128x6xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stats_in_hbm(%a: memref<128x64xf32>, %s: memref<128x6xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source must be in SBUF or PSUM, not HBM}}
  nisa.bn_stats %a, %s : memref<128x64xf32>, memref<128x6xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stats_partitions(%a: memref<128x64xf32, #nisa.mem<sbuf>>, %s: memref<64x6xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source and destination must have one partition count}}
  nisa.bn_stats %a, %s : memref<128x64xf32, #nisa.mem<sbuf>>, memref<64x6xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @stats_integer(%a: memref<128x64xi32, #nisa.mem<sbuf>>, %s: memref<128x6xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{source and destination must be float tiles}}
  nisa.bn_stats %a, %s : memref<128x64xi32, #nisa.mem<sbuf>>, memref<128x6xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @aggr_triples(%s: memref<128x7xf32, #nisa.mem<sbuf>>, %r: memref<128x2xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{a positive multiple of 3 elements per partition, not 7}}
  nisa.bn_aggr %s, %r : memref<128x7xf32, #nisa.mem<sbuf>>, memref<128x2xf32, #nisa.mem<sbuf>>
  return
}

// -----

func.func @aggr_width(%s: memref<128x6xf32, #nisa.mem<sbuf>>, %r: memref<128x1xf32, #nisa.mem<sbuf>>) {
  // expected-error @+1 {{destination must have 2 elements per partition}}
  nisa.bn_aggr %s, %r : memref<128x6xf32, #nisa.mem<sbuf>>, memref<128x1xf32, #nisa.mem<sbuf>>
  return
}
