// RUN: neuron-opt %s | neuron-opt | FileCheck %s

// CHECK-LABEL: func.func @ops
func.func @ops(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>, %c: tensor<4x8xi1>,
               %i: tensor<3xi64>) -> tensor<4x16xf32> {
  // CHECK: neuron.constant dense<1.000000e+00> : tensor<4x8xf32>
  %one = neuron.constant dense<1.0> : tensor<4x8xf32>
  // CHECK: neuron.unary exp
  %e = neuron.unary exp %a : tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK: neuron.binary add
  %s = neuron.binary add %e, %one : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK: neuron.binary lt {{.*}} -> tensor<4x8xi1>
  %p = neuron.binary lt %s, %a : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xi1>
  // CHECK: neuron.select
  %w = neuron.select %c, %s, %a : tensor<4x8xi1>, tensor<4x8xf32>
  // CHECK: neuron.cast {{.*}} -> tensor<4x8xbf16>
  %h = neuron.cast %w : tensor<4x8xf32> -> tensor<4x8xbf16>
  // CHECK: neuron.reduce sum {{.*}} {count = 1 : i64}
  %r = neuron.reduce sum %a {count = 1} : tensor<4x8xf32> -> tensor<4xf32>
  // CHECK: neuron.broadcast
  %bc = neuron.broadcast %r : tensor<4xf32> -> tensor<2x4xf32>
  // CHECK: neuron.transpose {{.*}}, [1, 0]
  %t = neuron.transpose %a, [1, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
  // CHECK: neuron.reshape
  %v = neuron.reshape %t : tensor<8x4xf32> -> tensor<32xf32>
  // CHECK: neuron.slice {{.*}}offsets = array<i64: 0, 2>{{.*}}strides = array<i64: 1, 2>
  %sl = neuron.slice %a {offsets = array<i64: 0, 2>, strides = array<i64: 1, 2>} : tensor<4x8xf32> -> tensor<4x3xf32>
  // CHECK: neuron.concat {{.*}} {dim = 1 : i64}
  %cc = neuron.concat %a, %a {dim = 1} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x16xf32>
  // CHECK: neuron.gather
  %g = neuron.gather %b[%i] : tensor<8x16xf32>, tensor<3xi64> -> tensor<3x16xf32>
  // CHECK: neuron.scatter {{.*}} {accumulate} : tensor<8x16xf32>, tensor<3xi64>, tensor<3x16xf32> -> tensor<8x16xf32>
  %sc = neuron.scatter %b[%i], %g {accumulate} : tensor<8x16xf32>, tensor<3xi64>, tensor<3x16xf32> -> tensor<8x16xf32>
  // CHECK: neuron.cumsum {{.*}} {dim = 1 : i64} : tensor<4x8xf32> -> tensor<4x8xf32>
  %cs = neuron.cumsum %a {dim = 1} : tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK: neuron.topk {{.*}} {k = 2 : i64, largest = false} : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi64>
  %tv, %ti = neuron.topk %a {k = 2, largest = false} : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi64>
  // CHECK: neuron.matmul
  %m = neuron.matmul %a, %b : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: neuron.matmul %{{.*}}, %{{.*}} bias(%{{.*}} : tensor<16xf32>) {epilogue = #neuron<unary_fn gelu>} : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %bias = neuron.constant dense<0.5> : tensor<16xf32>
  %mb = neuron.matmul %a, %b bias(%bias : tensor<16xf32>) {epilogue = #neuron<unary_fn gelu>} : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: neuron.matmul %{{.*}}, %{{.*}} row_scale(%{{.*}} : tensor<4xf32>) row_shift(%{{.*}} : tensor<4xf32>) {clamp_max = 6.000000e+00 : f64} : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %rows = neuron.constant dense<0.5> : tensor<4xf32>
  %mr = neuron.matmul %a, %b row_scale(%rows : tensor<4xf32>) row_shift(%rows : tensor<4xf32>) {clamp_max = 6.0 : f64} : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: neuron.conv2d {{.*}} stride [2, 1] padding [1, 0] dilation [1, 2] : tensor<1x8x4x6xf32>, tensor<3x8x3x3xf32> -> tensor<1x3x2x2xf32>
  %img4 = neuron.constant dense<2.0> : tensor<1x8x4x6xf32>
  %kern = neuron.constant dense<1.0> : tensor<3x8x3x3xf32>
  %cv = neuron.conv2d %img4, %kern stride [2, 1] padding [1, 0] dilation [1, 2] : tensor<1x8x4x6xf32>, tensor<3x8x3x3xf32> -> tensor<1x3x2x2xf32>
  // CHECK: neuron.pool2d sum {{.*}} kernel [2, 2] stride [2, 1] padding [1, 0] dilation [1, 1] {scale = 2.500000e-01 : f64} : tensor<1x8x4x6xf32> -> tensor<1x8x3x5xf32>
  %pl = neuron.pool2d sum %img4 kernel [2, 2] stride [2, 1] padding [1, 0] dilation [1, 1] {scale = 0.25 : f64} : tensor<1x8x4x6xf32> -> tensor<1x8x3x5xf32>
  // CHECK: neuron.group_norm {{.*}} weight {{.*}} bias {{.*}} groups 4 eps 1.000000e-05 : tensor<1x8x4x6xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<1x8x4x6xf32>, tensor<1x4xf32>, tensor<1x4xf32>
  %gw = neuron.constant dense<1.5> : tensor<8xf32>
  %gn:3 = neuron.group_norm %img4 weight %gw bias %gw groups 4 eps 1.0e-5 : tensor<1x8x4x6xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<1x8x4x6xf32>, tensor<1x4xf32>, tensor<1x4xf32>
  // CHECK: neuron.group_norm {{.*}} groups 2 eps 0.000000e+00 : tensor<1x8x4x6xf32> -> tensor<1x8x4x6xf32>, tensor<1x2xf32>, tensor<1x2xf32>
  %gn2:3 = neuron.group_norm %img4 groups 2 eps 0.0 : tensor<1x8x4x6xf32> -> tensor<1x8x4x6xf32>, tensor<1x2xf32>, tensor<1x2xf32>
  // CHECK: neuron.channel_norm {{.*}} weight {{.*}} bias {{.*}} eps 9.9999999999999995E-7 : tensor<1x8x4x6xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<1x8x4x6xf32>, tensor<1x1x4x6xf32>, tensor<1x1x4x6xf32>
  %cn:3 = neuron.channel_norm %img4 weight %gw bias %gw eps 1.0e-6 : tensor<1x8x4x6xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<1x8x4x6xf32>, tensor<1x1x4x6xf32>, tensor<1x1x4x6xf32>
  // CHECK: neuron.channel_norm {{.*}} eps 0.000000e+00 : tensor<1x8x4x6xf32> -> tensor<1x8x4x6xf32>, tensor<1x1x4x6xf32>, tensor<1x1x4x6xf32>
  %cn2:3 = neuron.channel_norm %img4 eps 0.0 : tensor<1x8x4x6xf32> -> tensor<1x8x4x6xf32>, tensor<1x1x4x6xf32>, tensor<1x1x4x6xf32>
  // CHECK: neuron.conv2d {{.*}} bias {{.*}} scale {{.*}} stride [1, 1] padding [1, 1] dilation [1, 1] {relu} : tensor<1x8x4x6xf32>, tensor<3x8x3x3xf32>, tensor<3xf32>, tensor<3xf32> -> tensor<1x3x4x6xf32>
  %csc = neuron.constant dense<2.0> : tensor<3xf32>
  %cep = neuron.conv2d %img4, %kern bias %csc scale %csc stride [1, 1] padding [1, 1] dilation [1, 1] {relu} : tensor<1x8x4x6xf32>, tensor<3x8x3x3xf32>, tensor<3xf32>, tensor<3xf32> -> tensor<1x3x4x6xf32>
  // CHECK: neuron.conv2d {{.*}} stride [1, 1] padding [1, 1] dilation [1, 1] {depthwise} : tensor<1x8x4x6xf32>, tensor<8x1x3x3xf32> -> tensor<1x8x4x6xf32>
  %dw = neuron.constant dense<1.0> : tensor<8x1x3x3xf32>
  %cdw = neuron.conv2d %img4, %dw stride [1, 1] padding [1, 1] dilation [1, 1] {depthwise} : tensor<1x8x4x6xf32>, tensor<8x1x3x3xf32> -> tensor<1x8x4x6xf32>
  // CHECK: neuron.conv2d {{.*}} bias {{.*}} : tensor<1x8x4x6xf32>, tensor<3x8x3x3xf32>, tensor<3xf32> -> tensor<1x3x2x2xf32>
  %cb = neuron.constant dense<0.5> : tensor<3xf32>
  %cvb = neuron.conv2d %img4, %kern bias %cb stride [2, 1] padding [1, 0] dilation [1, 2] : tensor<1x8x4x6xf32>, tensor<3x8x3x3xf32>, tensor<3xf32> -> tensor<1x3x2x2xf32>
  // CHECK: neuron.rand {{.*}} {stream = 3 : i64} : tensor<2xi32> -> tensor<4x8xbf16>
  %seed = neuron.constant dense<[1, 2]> : tensor<2xi32>
  %rnd = neuron.rand %seed {stream = 3} : tensor<2xi32> -> tensor<4x8xbf16>
  return %m : tensor<4x16xf32>
}
