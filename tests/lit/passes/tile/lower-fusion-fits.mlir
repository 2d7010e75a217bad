// RUN: neuron-opt %s --neuron-lower-to-nisa --nisa-allocate | FileCheck %s

// A flat group of 26 elementwise ops holds 25 intermediates: in 8 KiB tiles
// with four load/store slots they would need 264 KiB per partition, more
// than SBUF. The lowering gives up slots, then halves the tile width, until
// the group's tiles fit: 4 KiB tiles, and allocation succeeds.
// CHECK-LABEL: func.func @long_chain
// CHECK: memref.alloc() {nisa.address = {{[0-9]+}} : i64} : memref<128x4096xf32, #nisa.mem<sbuf>>
// CHECK-NOT: memref<128x2048xf32, #nisa.mem<sbuf>>
// CHECK: memref.alloc() {nisa.address = {{[0-9]+}} : i64} : memref<128x1024xf32, #nisa.mem<sbuf>>
func.func @long_chain(%x: tensor<256x8192xf32>) -> tensor<256x8192xf32> {
  %y = neuron.fusion(%x) : (tensor<256x8192xf32>) -> tensor<256x8192xf32> {
  ^bb0(%a: tensor<256x8192xf32>):
    %v0 = neuron.unary exp %a : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v1 = neuron.unary tanh %v0 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v2 = neuron.unary sigmoid %v1 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v3 = neuron.unary exp %v2 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v4 = neuron.unary tanh %v3 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v5 = neuron.unary sigmoid %v4 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v6 = neuron.unary exp %v5 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v7 = neuron.unary tanh %v6 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v8 = neuron.unary sigmoid %v7 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v9 = neuron.unary exp %v8 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v10 = neuron.unary tanh %v9 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v11 = neuron.unary sigmoid %v10 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v12 = neuron.unary exp %v11 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v13 = neuron.unary tanh %v12 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v14 = neuron.unary sigmoid %v13 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v15 = neuron.unary exp %v14 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v16 = neuron.unary tanh %v15 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v17 = neuron.unary sigmoid %v16 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v18 = neuron.unary exp %v17 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v19 = neuron.unary tanh %v18 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v20 = neuron.unary sigmoid %v19 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v21 = neuron.unary exp %v20 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v22 = neuron.unary tanh %v21 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v23 = neuron.unary sigmoid %v22 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v24 = neuron.unary exp %v23 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    %v25 = neuron.unary tanh %v24 : tensor<256x8192xf32> -> tensor<256x8192xf32>
    neuron.yield %v25 : tensor<256x8192xf32>
  }
  return %y : tensor<256x8192xf32>
}
