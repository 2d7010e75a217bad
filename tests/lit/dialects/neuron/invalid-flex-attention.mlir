// RUN: neuron-opt %s -split-input-file -verify-diagnostics

func.func @rank(%q: tensor<2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{query, key and value must be [batch, heads, rows, dim]}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @types(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xbf16>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{query, key and value must have one element type}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xbf16>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @batch(%q: tensor<1x2x256x64xf32>, %k: tensor<2x2x256x64xf32>, %v: tensor<2x2x256x64xf32>) {
  // expected-error @+1 {{query, key and value must have one batch size}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<2x2x256x64xf32>, tensor<2x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @heads(%q: tensor<1x3x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{key and value heads must divide the query heads}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x3x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x3x256x64xf32>, tensor<1x3x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @kvrows(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x128x64xf32>) {
  // expected-error @+1 {{key and value must have one number of rows}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x128x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @dim(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x32xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{query and key must have one head dim}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x32xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @out(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{out must be [batch, heads, query rows, value dim]}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x32xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @lse(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{lse must be [batch, heads, query rows]}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x128xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @block_size(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{block_size must be two positive sizes}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 0, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @blocks_type(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{blocks must be a rank-4 i8 tensor}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi32>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @blocks_shape(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{blocks must be [1 or batch, 1 or heads, query blocks, key blocks]}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 64, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @blocks_value(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{blocks values must be 0 (masked), 1 (partial) or 2 (full)}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [3, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @score_args(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{score_mod takes 5 scalars and one argument per buffer}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @score_type(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{score_mod argument 1 must be a 0-d integer tensor}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<f32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @mask_yield(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{mask_mod must yield a 0-d i1}}
  %o, %l = neuron.flex_attention %q, %k, %v {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %qi : tensor<i32>
    }
  return
}

// -----

func.func @backward_grad_out(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>, %o: tensor<1x2x256x64xf32>, %l: tensor<1x2x256xf32>, %go: tensor<1x2x256x32xf32>) {
  // expected-error @+1 {{grad_out must have the type of out}}
  %dq, %dk, %dv = neuron.flex_attention_backward %q, %k, %v, %o, %l, %go {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256xf32>, tensor<1x2x256x32xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } score_grad {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %g: tensor<f32>):
      neuron.yield %g : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @backward_grad_types(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>, %o: tensor<1x2x256x64xf32>, %l: tensor<1x2x256xf32>, %go: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{gradients must have the types of query, key and value}}
  %dq, %dk, %dv = neuron.flex_attention_backward %q, %k, %v, %o, %l, %go {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xbf16>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } score_grad {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %g: tensor<f32>):
      neuron.yield %g : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @backward_score_grad_args(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>, %o: tensor<1x2x256x64xf32>, %l: tensor<1x2x256xf32>, %go: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{score_grad argument 5 must be a 0-d float tensor}}
  %dq, %dk, %dv = neuron.flex_attention_backward %q, %k, %v, %o, %l, %go {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } score_grad {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %g: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}

// -----

func.func @backward_score_grad_yield(%q: tensor<1x2x256x64xf32>, %k: tensor<1x2x256x64xf32>, %v: tensor<1x2x256x64xf32>, %o: tensor<1x2x256x64xf32>, %l: tensor<1x2x256xf32>, %go: tensor<1x2x256x64xf32>) {
  // expected-error @+1 {{score_grad must yield a 0-d float}}
  %dq, %dk, %dv = neuron.flex_attention_backward %q, %k, %v, %o, %l, %go {block_size = array<i64: 128, 128>, blocks = dense<[[[[1, 0], [2, 1]]]]> : tensor<1x1x2x2xi8>, scale = 1.250000e-01 : f64} : tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256xf32>, tensor<1x2x256x64xf32> -> tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>, tensor<1x2x256x64xf32>
    score_mod {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      neuron.yield %s : tensor<f32>
    } score_grad {
    ^bb0(%s: tensor<f32>, %bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>, %g: tensor<f32>):
      neuron.yield %bi : tensor<i32>
    } mask_mod {
    ^bb0(%bi: tensor<i32>, %hi: tensor<i32>, %qi: tensor<i32>, %kvi: tensor<i32>):
      %m = neuron.binary ge %qi, %kvi : tensor<i32>, tensor<i32> -> tensor<i1>
      neuron.yield %m : tensor<i1>
    }
  return
}
