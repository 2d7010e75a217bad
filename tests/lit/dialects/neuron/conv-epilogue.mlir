// RUN: neuron-opt %s --canonicalize | FileCheck %s

// A convolution's result times per-channel values plus per-channel values
// (a BatchNorm in eval mode: x * S + T, x widened, then cast back), then
// max(0, .), folds into the convolution: scale S, bias T + bias * S, relu.

// CHECK-LABEL: func.func @conv_bn_relu
// CHECK-DAG: %[[S:.*]] = neuron.reshape %{{.*}} : tensor<1x4x1x1xf32> -> tensor<4xf32>
// CHECK-DAG: %[[B32:.*]] = neuron.cast %arg2 : tensor<4xbf16> -> tensor<4xf32>
// CHECK-DAG: %[[BS:.*]] = neuron.binary mul %[[B32]], %[[S]]
// CHECK: %[[SHIFT:.*]] = neuron.binary add %[[BS]], %{{.*}} : tensor<4xf32>
// CHECK: %[[Y:.*]] = neuron.conv2d %arg0, %arg1 bias %[[SHIFT]] scale %[[S]] stride [1, 1] padding [1, 1] dilation [1, 1] {relu} : tensor<2x3x6x6xbf16>, tensor<4x3x3x3xbf16>, tensor<4xf32>, tensor<4xf32> -> tensor<2x4x6x6xbf16>
// CHECK-NEXT: return %[[Y]]
func.func @conv_bn_relu(%x: tensor<2x3x6x6xbf16>, %w: tensor<4x3x3x3xbf16>, %b: tensor<4xbf16>, %s: tensor<4x1x1xf32>, %t: tensor<4x1x1xf32>) -> tensor<2x4x6x6xbf16> {
  %y = neuron.conv2d %x, %w bias %b stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<2x3x6x6xbf16>, tensor<4x3x3x3xbf16>, tensor<4xbf16> -> tensor<2x4x6x6xbf16>
  %0 = neuron.cast %y : tensor<2x4x6x6xbf16> -> tensor<2x4x6x6xf32>
  %s2 = neuron.broadcast %s : tensor<4x1x1xf32> -> tensor<2x4x1x1xf32>
  %t2 = neuron.broadcast %t : tensor<4x1x1xf32> -> tensor<2x4x1x1xf32>
  %sf = neuron.broadcast %s2 : tensor<2x4x1x1xf32> -> tensor<2x4x6x6xf32>
  %tf = neuron.broadcast %t2 : tensor<2x4x1x1xf32> -> tensor<2x4x6x6xf32>
  %1 = neuron.binary mul %0, %sf : tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32> -> tensor<2x4x6x6xf32>
  %2 = neuron.binary add %1, %tf : tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32> -> tensor<2x4x6x6xf32>
  %3 = neuron.cast %2 : tensor<2x4x6x6xf32> -> tensor<2x4x6x6xbf16>
  %4 = neuron.unary relu %3 : tensor<2x4x6x6xbf16> -> tensor<2x4x6x6xbf16>
  return %4 : tensor<2x4x6x6xbf16>
}

// Per-image values (not the same along the batch) are not per-channel:
// no fold.
// CHECK-LABEL: func.func @per_image
// CHECK: neuron.conv2d %arg0, %arg1 stride
// CHECK-NOT: scale
// CHECK: neuron.binary mul
func.func @per_image(%x: tensor<2x3x6x6xf32>, %w: tensor<4x3x3x3xf32>, %s: tensor<2x4x1x1xf32>) -> tensor<2x4x6x6xf32> {
  %y = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<2x3x6x6xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x6x6xf32>
  %sf = neuron.broadcast %s : tensor<2x4x1x1xf32> -> tensor<2x4x6x6xf32>
  %1 = neuron.binary mul %y, %sf : tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32> -> tensor<2x4x6x6xf32>
  %2 = neuron.binary add %1, %sf : tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32> -> tensor<2x4x6x6xf32>
  return %2 : tensor<2x4x6x6xf32>
}

// Values computed from the convolution's own result (a BatchNorm in
// training mode, its statistics), or a result read elsewhere too: no fold.
// CHECK-LABEL: func.func @from_result
// CHECK: neuron.conv2d %arg0, %arg1 stride
// CHECK-NOT: scale
// CHECK: neuron.binary mul
func.func @from_result(%x: tensor<2x3x6x6xf32>, %w: tensor<4x3x3x3xf32>) -> tensor<2x4x6x6xf32> {
  %y = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<2x3x6x6xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x6x6xf32>
  %m = neuron.reduce sum %y {count = 2 : i64} : tensor<2x4x6x6xf32> -> tensor<2x4xf32>
  %m1 = neuron.reshape %m : tensor<2x4xf32> -> tensor<1x2x4x1x1xf32>
  %m2 = neuron.slice %m1 {offsets = array<i64: 0, 0, 0, 0, 0>, strides = array<i64: 1, 1, 1, 1, 1>} : tensor<1x2x4x1x1xf32> -> tensor<1x1x4x1x1xf32>
  %m3 = neuron.reshape %m2 : tensor<1x1x4x1x1xf32> -> tensor<1x4x1x1xf32>
  %sf = neuron.broadcast %m3 : tensor<1x4x1x1xf32> -> tensor<2x4x6x6xf32>
  %1 = neuron.binary mul %y, %sf : tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32> -> tensor<2x4x6x6xf32>
  %2 = neuron.binary add %1, %sf : tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32> -> tensor<2x4x6x6xf32>
  return %2 : tensor<2x4x6x6xf32>
}

// CHECK-LABEL: func.func @read_elsewhere
// CHECK: neuron.conv2d %arg0, %arg1 stride [1, 1] padding [1, 1] dilation [1, 1] :
// CHECK: neuron.unary relu
func.func @read_elsewhere(%x: tensor<2x3x6x6xf32>, %w: tensor<4x3x3x3xf32>) -> (tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32>) {
  %y = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<2x3x6x6xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x6x6xf32>
  %1 = neuron.unary relu %y : tensor<2x4x6x6xf32> -> tensor<2x4x6x6xf32>
  return %1, %y : tensor<2x4x6x6xf32>, tensor<2x4x6x6xf32>
}
