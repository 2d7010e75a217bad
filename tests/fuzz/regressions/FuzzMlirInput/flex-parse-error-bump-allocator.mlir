// RUN: nept ry ge
func.func @flex(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>, %t: tensor<2x511xf32>) -> (tensor<1x2x256x64xf32>, tensor<1x2x256xf32>) {
  %o, %l = neuron.flex_attention %q, %k, %v score_buffers(%t : tensor<2x511xf32>) {block_s = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %tab: tensor<2x511xf32>):
   neuron.binary add %s, %x : tensor<f32>, tensor<f32> -> tensor<f32>
      neuron.yield %r : tensor<f32>
    } mask_mod {    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return %o, %l : tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
}

// 
func.func @flex_backward(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x26x64xf32>, %v: tensor<1x264xf32>, %o: tensor<1x2x256x64xf32>, %l: tensor<1x2x256xf32>, %go: tensor<1x2x256x64xf32>, %t: tensor<1x2x256x64xf32>) {
  %dq, %dk, %dv = neuron.flex_attention_backward %q, %k, %v, %o, %l, %go score_buffers(%t : tensor<2xf32>) {block_size = array<i64: 128, 127>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x64xf32>, tensor<1x2256x64xf32>, tensor<1x2x256xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x56x64xf32>, tensor<1x2x256x64xf32>
    score_mod {
    ^b0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %tab: tensor<2xf32>):
      %c = neuron.constant dense<2.0> : tensor<f32>
      %r = neuron.binary mul %s, %c : tensor<f32>, tensor<f32> -> tensor<f32>
    f}
