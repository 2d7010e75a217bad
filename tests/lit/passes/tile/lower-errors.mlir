// RUN: neuron-opt %s --neuron-lower-to-nisa -split-input-file -verify-diagnostics

// Each failure is reported on the op that caused it (the user's line, once
// the importer has given ops their Python locations).

func.func @no_pattern(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'arith.constant' op has no lowering to nisa}}
  %c = arith.constant dense<1.0> : tensor<4xf32>
  %y = neuron.binary add %x, %c : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @empty_contraction(%a: tensor<4x0xf32>, %b: tensor<0x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{has an empty contraction}}
  %y = neuron.matmul %a, %b : tensor<4x0xf32>, tensor<0x4xf32> -> tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}

// -----

func.func @two_shapes(%x: tensor<4x8xf32>, %y: tensor<8x4xf32>) -> (tensor<4xf32>, tensor<8xf32>) {
  // expected-error @+1 {{cannot be tiled as one group}}
  %r:2 = neuron.fusion(%x, %y) : (tensor<4x8xf32>, tensor<8x4xf32>) -> (tensor<4xf32>, tensor<8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>):
    %s = neuron.reduce sum %a {count = 1} : tensor<4x8xf32> -> tensor<4xf32>
    %t = neuron.reduce sum %b {count = 1} : tensor<8x4xf32> -> tensor<8xf32>
    neuron.yield %s, %t : tensor<4xf32>, tensor<8xf32>
  }
  return %r#0, %r#1 : tensor<4xf32>, tensor<8xf32>
}

// -----

func.func @yields_input(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  // expected-error @+1 {{yields an input unchanged}}
  %r:2 = neuron.fusion(%x) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<4xf32>):
    %e = neuron.unary exp %a : tensor<4xf32> -> tensor<4xf32>
    neuron.yield %e, %a : tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1 : tensor<4xf32>, tensor<4xf32>
}

// -----

func.func @rotary_too_wide(%x: tensor<4x2048xf32>) -> tensor<4x2048xf32> {
  // expected-error @+1 {{rotates dims of up to 1024 elements}}
  %0 = neuron.rotary %x, %x, %x : tensor<4x2048xf32>, tensor<4x2048xf32>, tensor<4x2048xf32> -> tensor<4x2048xf32>
  return %0 : tensor<4x2048xf32>
}

// -----

// The importer forms a conv2d only where its layout fits; one written by
// hand that does not (rows too long for even one-row bands) is refused,
// not allocated past SBUF.
func.func @conv2d_too_large(%x: tensor<1x512x4x60000xbf16>, %w: tensor<64x512x3x3xbf16>) -> tensor<1x64x4x60000xbf16> {
  // expected-error @+1 {{bytes per partition resident, more than target 'trn2' has}}
  %y = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<1x512x4x60000xbf16>, tensor<64x512x3x3xbf16> -> tensor<1x64x4x60000xbf16>
  return %y : tensor<1x64x4x60000xbf16>
}
