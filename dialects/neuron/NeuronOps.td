//===- NeuronOps.td - graph-level Neuron dialect -----------*- tablegen -*-===//
//
// Tensors with value semantics, one op per ATen concept the hardware cares
// about. Shapes are static: the backend specializes symbolic sizes before
// import. Elementwise ops take operands of identical shape; broadcasting is
// the explicit `neuron.broadcast`, so every lowering sees plain shapes.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_OPS
#define NEURON_OPS

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/CommonTypeConstraints.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"

def Neuron_Dialect : Dialect {
  let name = "neuron";
  let cppNamespace = "::mlir::neuron";
  let summary = "Graph-level operations of the TorchNeuron compiler";
  let description = [{
    The `neuron` dialect is what the FX importer produces: a `func.func` of
    tensor operations, each carrying the location of the Python line it came
    from. Fusion and FlexAttention lowering work here; `neuron-lower-to-nisa`
    tiles every op into engine instructions of the `nisa` dialect.
  }];
  let useDefaultAttributePrinterParser = 1;
  let hasConstantMaterializer = 1;
}

class Neuron_Op<string mnemonic, list<Trait> traits = []>
    : Op<Neuron_Dialect, mnemonic, !listconcat(traits, [Pure])>;

// Element types the device handles. Integers and booleans exist for indices
// and masks; arithmetic runs on the engines' fp32 datapath.
// fp8 (OCP float8_e4m3fn, float8_e5m2) is a storage and TensorE input type.
def Neuron_Float : AnyTypeOf<[F32, BF16, F16, F8E4M3FN, F8E5M2]>;
def Neuron_Element : AnyTypeOf<[F32, BF16, F16, F8E4M3FN, F8E5M2, I1, I8, I32,
                                I64, UI8]>;
def Neuron_Tensor : RankedTensorOf<[Neuron_Element]>;
def Neuron_IndexTensor : RankedTensorOf<[I32, I64]>;

//===----------------------------------------------------------------------===//
// Function enums
//===----------------------------------------------------------------------===//

def Neuron_UnaryFn : I32EnumAttr<"UnaryFn", "elementwise function", [
  I32EnumAttrCase<"neg", 0>, I32EnumAttrCase<"abs", 1>,
  I32EnumAttrCase<"exp", 2>, I32EnumAttrCase<"log", 3>,
  I32EnumAttrCase<"sqrt", 4>, I32EnumAttrCase<"rsqrt", 5>,
  I32EnumAttrCase<"reciprocal", 6>, I32EnumAttrCase<"tanh", 7>,
  I32EnumAttrCase<"sigmoid", 8>, I32EnumAttrCase<"relu", 9>,
  I32EnumAttrCase<"gelu", 10>, I32EnumAttrCase<"gelu_tanh", 11>,
  I32EnumAttrCase<"silu", 12>, I32EnumAttrCase<"erf", 13>,
  I32EnumAttrCase<"sin", 14>, I32EnumAttrCase<"cos", 15>,
  I32EnumAttrCase<"sign", 16>, I32EnumAttrCase<"square", 17>,
  I32EnumAttrCase<"floor", 18>, I32EnumAttrCase<"ceil", 19>,
  I32EnumAttrCase<"round", 20>, I32EnumAttrCase<"trunc", 21>,
  I32EnumAttrCase<"log1p", 22>, I32EnumAttrCase<"expm1", 23>,
  I32EnumAttrCase<"logical_not", 24>
]> {
  let cppNamespace = "::mlir::neuron";
  let genSpecializedAttr = 0;
}
def Neuron_UnaryFnAttr : EnumAttr<Neuron_Dialect, Neuron_UnaryFn, "unary_fn">;

def Neuron_BinaryFn : I32EnumAttr<"BinaryFn", "elementwise binary function", [
  I32EnumAttrCase<"add", 0>, I32EnumAttrCase<"sub", 1>,
  I32EnumAttrCase<"mul", 2>, I32EnumAttrCase<"div", 3>,
  I32EnumAttrCase<"max", 4>, I32EnumAttrCase<"min", 5>,
  I32EnumAttrCase<"pow", 6>, I32EnumAttrCase<"fmod", 7>,
  I32EnumAttrCase<"remainder", 8>, I32EnumAttrCase<"eq", 9>,
  I32EnumAttrCase<"ne", 10>, I32EnumAttrCase<"lt", 11>,
  I32EnumAttrCase<"le", 12>, I32EnumAttrCase<"gt", 13>,
  I32EnumAttrCase<"ge", 14>, I32EnumAttrCase<"logical_and", 15>,
  I32EnumAttrCase<"logical_or", 16>, I32EnumAttrCase<"logical_xor", 17>
]> {
  let cppNamespace = "::mlir::neuron";
  let genSpecializedAttr = 0;
}
def Neuron_BinaryFnAttr : EnumAttr<Neuron_Dialect, Neuron_BinaryFn, "binary_fn">;

def Neuron_ReduceFn : I32EnumAttr<"ReduceFn", "reduction", [
  I32EnumAttrCase<"sum", 0>, I32EnumAttrCase<"max", 1>,
  I32EnumAttrCase<"min", 2>, I32EnumAttrCase<"prod", 3>
]> {
  let cppNamespace = "::mlir::neuron";
  let genSpecializedAttr = 0;
}
def Neuron_ReduceFnAttr : EnumAttr<Neuron_Dialect, Neuron_ReduceFn, "reduce_fn">;

//===----------------------------------------------------------------------===//
// Sources
//===----------------------------------------------------------------------===//

def Neuron_ConstantOp : Neuron_Op<"constant", [ConstantLike,
    AllTypesMatch<["value", "result"]>]> {
  let summary = "a tensor literal (weights captured by value, splats, tables)";
  let arguments = (ins ElementsAttr:$value);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = "attr-dict $value";
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

def Neuron_UnaryOp : Neuron_Op<"unary"> {
  let summary = "elementwise function of one tensor";
  let arguments = (ins Neuron_UnaryFnAttr:$fn, Neuron_Tensor:$input);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = "$fn $input attr-dict `:` type($input) `->` type($result)";
  let hasCanonicalizer = 1;
  let hasVerifier = 1;
}

def Neuron_BinaryOp : Neuron_Op<"binary"> {
  let summary = "elementwise function of two tensors of the same shape";
  let description = [{
    Comparisons and logical functions produce `i1`; the others produce the
    operands' element type.
  }];
  let arguments = (ins Neuron_BinaryFnAttr:$fn, Neuron_Tensor:$lhs,
                   Neuron_Tensor:$rhs);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = [{
    $fn $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasCanonicalizer = 1;
  let hasVerifier = 1;
}

def Neuron_SelectOp : Neuron_Op<"select",
    [AllTypesMatch<["on_true", "on_false", "result"]>]> {
  let summary = "cond ? on_true : on_false, elementwise";
  let arguments = (ins RankedTensorOf<[I1]>:$cond, Neuron_Tensor:$on_true,
                   Neuron_Tensor:$on_false);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = [{
    $cond `,` $on_true `,` $on_false attr-dict `:` type($cond) `,` type($result)
  }];
  let hasVerifier = 1;
}

def Neuron_CastOp : Neuron_Op<"cast"> {
  let summary = "element type conversion (round to nearest even for floats)";
  let arguments = (ins Neuron_Tensor:$input);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasCanonicalizer = 1;
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Contractions and reductions
//===----------------------------------------------------------------------===//

def Neuron_MatmulOp : Neuron_Op<"matmul", [AttrSizedOperandSegments]> {
  let summary = "[B...,M,K] x [B...,K,N] -> [B...,M,N], fp32 accumulation";
  let description = [{
    With an epilogue, result = min(epilogue(lhs @ rhs * row_scale[m] +
    row_shift[m] + bias[n]), clamp_max), each part optional, computed in
    fp32 from the fp32 sums and rounded once: a Linear's bias and the
    activation after it (relu, gelu, gelu_tanh, silu, sigmoid or tanh), or a
    pointwise convolution's BatchNorm (per output channel: the rows of a
    channels-first batched matmul) and ReLU6, applied as the sums leave PSUM
    (canonicalization folds them in) rather than as passes of their own over
    the result. A row affine and a column bias are not both given.
  }];
  let arguments = (ins RankedTensorOf<[Neuron_Float]>:$lhs,
                   RankedTensorOf<[Neuron_Float]>:$rhs,
                   Optional<RankedTensorOf<[Neuron_Float]>>:$bias,
                   Optional<RankedTensorOf<[F32]>>:$row_scale,
                   Optional<RankedTensorOf<[F32]>>:$row_shift,
                   OptionalAttr<Neuron_UnaryFnAttr>:$epilogue,
                   OptionalAttr<F64Attr>:$clamp_max);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$result);
  // Each epilogue operand with its type (several optional trailing types
  // would not parse back unambiguously).
  let assemblyFormat = [{
    $lhs `,` $rhs (`bias` `(` $bias^ `:` type($bias) `)`)?
    (`row_scale` `(` $row_scale^ `:` type($row_scale) `)`)?
    (`row_shift` `(` $row_shift^ `:` type($row_shift) `)`)?
    attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let builders = [
    OpBuilder<(ins "Type":$result, "Value":$lhs, "Value":$rhs), [{
      build($_builder, $_state, result, lhs, rhs, /*bias=*/Value(),
            /*row_scale=*/Value(), /*row_shift=*/Value(),
            /*epilogue=*/nullptr, /*clamp_max=*/nullptr);
    }]>
  ];
  let hasVerifier = 1;
}

def Neuron_ScaledMatmulOp : Neuron_Op<"scaled_matmul"> {
  let summary = "fp8 [M,K] x [K,N] with per-row and per-column scales and a bias";
  let description = [{
    torch._scaled_mm: result[m, n] = (sum_k lhs[m, k] * rhs[k, n])
    * row_scale[m] * col_scale[n] + bias[n], in fp32 (fp8 products are exact,
    the sum accumulates in fp32) and rounded once to the result type. A scale
    of one element applies to every row (column): torch's tensorwise scale;
    M (N) elements, its rowwise scale. The operands may mix the fp8 formats.

    MX block scales (OCP MXFP8, torch's e8m0 scales, held as ui8): row_scale
    [M, K / 32] and col_scale [N, K / 32], the E8M0 exponent of each 32
    consecutive values of K of a row of lhs (column of rhs): result[m, n] =
    sum_k lhs[m, k] 2^(row_scale[m, k / 32] - 127) rhs[k, n]
    2^(col_scale[n, k / 32] - 127); 255 is NaN. No bias then.
  }];
  let arguments = (ins RankedTensorOf<[F8E4M3FN, F8E5M2]>:$lhs,
                   RankedTensorOf<[F8E4M3FN, F8E5M2]>:$rhs,
                   RankedTensorOf<[F32, UI8]>:$row_scale,
                   RankedTensorOf<[F32, UI8]>:$col_scale,
                   Optional<RankedTensorOf<[Neuron_Float]>>:$bias);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `scales` $row_scale `,` $col_scale (`bias` $bias^)? attr-dict
    `:` type($lhs) `,` type($rhs) `,` type($row_scale) `,` type($col_scale)
    (`,` type($bias)^)? `->` type($result)
  }];
  let extraClassDeclaration = [{
    /// MX block scales (ui8) rather than fp32 tensorwise / rowwise ones.
    bool hasBlockScales() {
      return !getRowScale().getType().getElementType().isF32() ||
             !getColScale().getType().getElementType().isF32();
    }
  }];
  let hasVerifier = 1;
}

def Neuron_GroupedMatmulOp : Neuron_Op<"grouped_matmul"> {
  let summary = "[M,K] rows in groups x [G,K,N] -> [M,N] (torch._grouped_mm)";
  let description = [{
    Rows [ends[g-1], ends[g]) of lhs (ends[-1] = 0) times rhs[g], fp32
    accumulation; rows from ends[G-1] on are zeros. `ends` are size
    parameters of the function (the offsets tensor's values, bound when the
    program is launched), so one program serves every routing and each
    group does only its own rows' work.
  }];
  let arguments = (ins RankedTensorOf<[Neuron_Float]>:$lhs,
                   RankedTensorOf<[Neuron_Float]>:$rhs,
                   Variadic<Index>:$ends);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `ends` `(` $ends `)` attr-dict `:` type($lhs) `,` type($rhs)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

def Neuron_Conv2dOp : Neuron_Op<"conv2d", [AttrSizedOperandSegments]> {
  let summary = "2-d convolution [N,C,H,W] x [O,C,kh,kw] -> [N,O,Ho,Wo], fp32 accumulation";
  let description = [{
    out[n, o, y, x] = sum over c, i, j of weight[o, c, i, j] *
    input[n, c, y * stride[0] + i * dilation[0] - padding[0],
             x * stride[1] + j * dilation[1] - padding[1]]
    (zero outside the input), plus bias[o] when given, the products exact in
    fp32 and summed in fp32, rounded once to the result type:
    aten.convolution with one group.
    Lowered as a direct convolution on TensorE (each kernel tap a matmul of
    the weights by a shifted window of the image held in SBUF, the taps
    accumulating in PSUM), where im2col would write and read kh * kw copies
    of the input through HBM. The importer forms it only where the kernel
    keeps the image and weights on chip (`layout`).
    With `depthwise` (aten.convolution with groups = C = O), weight is
    [C, 1, kh, kw] and out[n, c] sums only input channel c: each tap's
    stationary is diagonal, one 128-channel tile of the output a tile of
    the input.
    An epilogue folded by canonicalization (a BatchNorm in eval mode and
    the activation after it): `scale` ([O], f32) multiplies the sums before
    the bias is added, and `relu` takes max(0, .) of that, in fp32, rounded
    once.
  }];
  let arguments = (ins RankedTensorOf<[Neuron_Float]>:$input,
                   RankedTensorOf<[Neuron_Float]>:$weight,
                   Optional<RankedTensorOf<[Neuron_Float]>>:$bias,
                   Optional<RankedTensorOf<[F32]>>:$scale,
                   DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding,
                   DenseI64ArrayAttr:$dilation, UnitAttr:$depthwise,
                   UnitAttr:$relu);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$result);
  let assemblyFormat = [{
    $input `,` $weight (`bias` $bias^)? (`scale` $scale^)? `stride` $stride
    `padding` $padding `dilation` $dilation attr-dict `:` type($input) `,`
    type($weight) (`,` type($bias)^)? (`,` type($scale)^)? `->` type($result)
  }];
  let extraClassDeclaration = [{
    /// How the direct kernel lays out the image, weights and sums.
    ConvLayout layout();
  }];
  let hasVerifier = 1;
}

def Neuron_GroupNormOp : Neuron_Op<"group_norm", [AttrSizedOperandSegments]> {
  let summary = "group normalization of [N, C, ...] (aten.native_group_norm)";
  let description = [{
    Per image n and group g of `groups` consecutive channels: mean and
    population variance over the group's channels and positions in fp32,
    rstd = 1 / sqrt(variance + eps), and
    out[n, c, ...] = (input - mean) * rstd * weight[c] + bias[c] (weight
    and bias optional) computed in fp32 and rounded once (with `silu`, the
    SiLU of that: a UNet's GroupNorm then SiLU, folded by canonicalization);
    `mean` and `rstd` are [N, groups]. Channels per group are at most 128
    (the partitions of one step of the lowering, which combines a group's
    rows on TensorE).
  }];
  let arguments = (ins RankedTensorOf<[Neuron_Float]>:$input,
                   Optional<RankedTensorOf<[Neuron_Float]>>:$weight,
                   Optional<RankedTensorOf<[Neuron_Float]>>:$bias,
                   I64Attr:$groups, F64Attr:$eps, UnitAttr:$silu);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$result,
                      RankedTensorOf<[Neuron_Float]>:$mean,
                      RankedTensorOf<[Neuron_Float]>:$rstd);
  let assemblyFormat = [{
    $input (`weight` $weight^)? (`bias` $bias^)? `groups` $groups `eps` $eps
    attr-dict `:` type($input) (`,` type($weight)^)? (`,` type($bias)^)?
    `->` type($result) `,` type($mean) `,` type($rstd)
  }];
  let hasVerifier = 1;
}

def Neuron_ChannelNormOp : Neuron_Op<"channel_norm", [AttrSizedOperandSegments]> {
  let summary = "layer normalization over the channels of [N, C, ...] at each position";
  let description = [{
    A LayerNorm over dim 1 (ConvNeXt's LayerNorm2d, `F.layer_norm` of the
    channels-last view of a channels-first tensor): per image n and
    position, the mean and population variance of the C channels in fp32,
    rstd = 1 / sqrt(variance + eps), and
    out[n, c, ...] = (input - mean) * rstd * weight[c] + bias[c] (weight
    and bias optional), computed in fp32 and rounded once (the squared
    deviations of a 16-bit input summed from bf16); `mean` and `rstd` are
    [N, 1, ...]. At most 1024 channels (the lowering combines the channels
    on TensorE, C x C products a position).
  }];
  let arguments = (ins RankedTensorOf<[Neuron_Float]>:$input,
                   Optional<RankedTensorOf<[Neuron_Float]>>:$weight,
                   Optional<RankedTensorOf<[Neuron_Float]>>:$bias,
                   F64Attr:$eps);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$result,
                      RankedTensorOf<[F32]>:$mean,
                      RankedTensorOf<[F32]>:$rstd);
  let assemblyFormat = [{
    $input (`weight` $weight^)? (`bias` $bias^)? `eps` $eps
    attr-dict `:` type($input) (`,` type($weight)^)? (`,` type($bias)^)?
    `->` type($result) `,` type($mean) `,` type($rstd)
  }];
  let hasVerifier = 1;
}

def Neuron_Pool2dOp : Neuron_Op<"pool2d"> {
  let summary = "max or sum over 2-d windows, times a scale (max/avg_pool2d)";
  let description = [{
    out[..., y, x] = scale * fn over (i, j) < kernel of input[..., y *
    stride[0] + i * dilation[0] - padding[0], x * stride[1] + j *
    dilation[1] - padding[1]], positions outside the input being fn's
    identity (-inf for max, 0 for sum); `fn` is max or sum, accumulated in
    fp32 and rounded once (avg_pool2d: sum with scale 1 / divisor). The
    lowering keeps 128 images' planes (the dims before the last two) in
    SBUF at a time and takes each window as an access pattern of them.
  }];
  let arguments = (ins RankedTensorOf<[Neuron_Float]>:$input,
                   Neuron_ReduceFnAttr:$fn, DenseI64ArrayAttr:$kernel,
                   DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding,
                   DenseI64ArrayAttr:$dilation,
                   DefaultValuedAttr<F64Attr, "1.0">:$scale);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$result);
  let assemblyFormat = [{
    $fn $input `kernel` $kernel `stride` $stride `padding` $padding
    `dilation` $dilation attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = [{
    /// SBUF bytes per partition its lowering keeps: two slots of a plane and
    /// of two partial results (fp32 at most).
    int64_t residentBytes();
  }];
  let hasVerifier = 1;
}

def Neuron_ReduceOp : Neuron_Op<"reduce"> {
  let summary = "reduction over the innermost `count` dims";
  let description = [{
    Reduces the trailing `count` dimensions; the importer transposes other
    reductions into this form so every reduction runs along the free axis.
    The result drops the reduced dims (keepdim is an explicit reshape).
  }];
  let arguments = (ins Neuron_ReduceFnAttr:$fn, Neuron_Tensor:$input,
                   I64Attr:$count);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = "$fn $input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// Layout
//===----------------------------------------------------------------------===//

def Neuron_BroadcastOp : Neuron_Op<"broadcast"> {
  let summary = "numpy-style broadcast (trailing dims aligned, size 1 expands)";
  let arguments = (ins Neuron_Tensor:$input);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Neuron_TransposeOp : Neuron_Op<"transpose"> {
  let summary = "dimension permutation: result dim i = input dim permutation[i]";
  let arguments = (ins Neuron_Tensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = [{
    $input `,` $permutation attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Neuron_ReshapeOp : Neuron_Op<"reshape"> {
  let summary = "same elements in row-major order, new shape";
  let arguments = (ins Neuron_Tensor:$input);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Neuron_SliceOp : Neuron_Op<"slice"> {
  let summary = "strided static slice: result[i] = input[offsets + i * strides]";
  let arguments = (ins Neuron_Tensor:$input, DenseI64ArrayAttr:$offsets,
                   DenseI64ArrayAttr:$strides);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = [{
    $input attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Neuron_ConcatOp : Neuron_Op<"concat"> {
  let summary = "concatenation along `dim`";
  let arguments = (ins Variadic<Neuron_Tensor>:$inputs, I64Attr:$dim);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

def Neuron_GatherOp : Neuron_Op<"gather"> {
  let summary = "rows of `table` picked by `indices` (embedding, index_select)";
  let description = [{
    result[i..., :] = table[indices[i...], :] where the result shape is
    indices.shape ++ table.shape[1:]. Indices out of range are a runtime
    error on the device, as in PyTorch.
  }];
  let arguments = (ins Neuron_Tensor:$table, Neuron_IndexTensor:$indices);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = [{
    $table `[` $indices `]` attr-dict `:` type($table) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Neuron_ScatterOp : Neuron_Op<"scatter"> {
  let summary = "`input` with rows replaced (or added to) by index (index_put)";
  let description = [{
    result = input; result[indices[i], :] = values[i, :] (+= with
    `accumulate`), where values.shape is indices.shape ++ input.shape[1:].
    Repeated indices: the last write wins, or every value is added. Indices
    out of range are a runtime error on the device, as in PyTorch. With
    `permutation` the indices are a permutation of the input's rows (a
    sort's indices, torchneuron.unpermute_rows): every row is written once,
    so the input is never read and the writes need no order among
    themselves; a repeated index is a runtime error.
  }];
  let arguments = (ins Neuron_Tensor:$input, Neuron_IndexTensor:$indices,
                   Neuron_Tensor:$values, UnitAttr:$accumulate,
                   UnitAttr:$permutation);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = [{
    $input `[` $indices `]` `,` $values attr-dict `:` type($input) `,` type($indices) `,` type($values) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Scans and selection
//===----------------------------------------------------------------------===//

def Neuron_CumsumOp : Neuron_Op<"cumsum"> {
  let summary = "inclusive prefix sum along `dim`";
  let description = [{
    result[..., i, ...] = sum of input[..., j, ...] for j <= i along `dim`,
    accumulated in fp32 (the engines' datapath; PSUM) and rounded to the
    result type once per element. Integer inputs and results are exact while
    the running sums stay below 2^24 in magnitude (fp32's integer range),
    which covers counts such as position ids built from a mask.
  }];
  let arguments = (ins Neuron_Tensor:$input, I64Attr:$dim);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Neuron_RotaryOp : Neuron_Op<"rotary"> {
  let summary = "rotary position embedding: x * cos + rotate_half(x) * sin";
  let description = [{
    RoPE as Transformers' Llama family writes it (`apply_rotary_pos_emb`):
    rotate_half(x) = concat(-x[..., h:], x[..., :h]) along the last dim, of
    2h elements. `cos` and `sin` have x's shape (usually broadcasts over the
    heads, which stay strided views). Both products are rounded to the
    result type, then their sum, as eager PyTorch computes the expression.
    Canonicalization forms it from that expression (BinaryOp's patterns);
    its lowering reads x once and each cos/sin position once per block of
    heads, where the expression's concat of the halves copied x through
    HBM first.
  }];
  let arguments = (ins Neuron_Tensor:$x, Neuron_Tensor:$cos,
                   Neuron_Tensor:$sin);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = [{
    $x `,` $cos `,` $sin attr-dict `:` type($x) `,` type($cos) `,` type($sin) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Neuron_TopKOp : Neuron_Op<"topk"> {
  let summary = "the k largest (or smallest) elements along the last dim, and where they are";
  let description = [{
    For each row (all dims but the last), `values` holds the row's k largest
    elements in descending order (`largest`) or its k smallest in ascending
    order, and `indices` their positions in the row. Among equal elements the
    one at the lower position comes first, so with k equal to the row's
    length this is a stable sort (torch.sort, argsort). Comparisons are in
    fp32; NaN inputs are not ordered as PyTorch orders them (largest).
  }];
  let arguments = (ins Neuron_Tensor:$input, I64Attr:$k, BoolAttr:$largest);
  let results = (outs Neuron_Tensor:$values, Neuron_IndexTensor:$indices);
  let assemblyFormat = [{
    $input attr-dict `:` type($input) `->` type($values) `,` type($indices)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Random numbers
//===----------------------------------------------------------------------===//

def Neuron_RandOp : Neuron_Op<"rand"> {
  let summary = "uniform [0, 1) numbers: Philox4x32-10 of (seed, stream, element index)";
  let description = [{
    result[i] (i the row-major element index) is the first word of
    Philox4x32-10 with key (seed[0], seed[1]) and counter (i mod 2^32,
    i div 2^32, stream, 0), its top 24 bits over 2^24, rounded to the
    result type. A pure function of its operands: the seed is an input the
    caller draws afresh for each run (from torch's generator), and
    `stream` tells the random tensors of one graph apart.
  }];
  let arguments = (ins RankedTensorOf<[I32]>:$seed,
                   DefaultValuedAttr<I64Attr, "0">:$stream);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$result);
  let assemblyFormat = "$seed attr-dict `:` type($seed) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

def Neuron_CollectiveKind : I32EnumAttr<"CollectiveKind", "collective", [
  I32EnumAttrCase<"all_reduce", 0>, I32EnumAttrCase<"all_gather", 1>,
  I32EnumAttrCase<"reduce_scatter", 2>
]> {
  let cppNamespace = "::mlir::neuron";
  let genSpecializedAttr = 0;
}
def Neuron_CollectiveKindAttr
    : EnumAttr<Neuron_Dialect, Neuron_CollectiveKind, "collective">;

// Not Pure: every rank of the group must issue the same collectives in the
// same order, so none may be dropped, merged or moved past another.
def Neuron_CollectiveOp : Op<Neuron_Dialect, "collective"> {
  let summary = "a collective among the ranks of a process group";
  let description = [{
    torch's functional collectives (`_c10d_functional.all_reduce`,
    `all_gather_into_tensor`, `reduce_scatter_tensor`; their
    `wait_tensor` is where the result is used, i.e. its data dependence).
    all_reduce: the result is `reduce` over the ranks' inputs; all_gather:
    the ranks' inputs concatenated along dim 0 in group order;
    reduce_scatter: this rank's dim-0 slice of the reduction. `group` is
    torch's group name, which the runtime resolves to the process group;
    `ranks` are its members' global ranks in group order.
  }];
  let arguments = (ins Neuron_Tensor:$input, Neuron_CollectiveKindAttr:$kind,
                   DefaultValuedAttr<Neuron_ReduceFnAttr, "ReduceFn::sum">:$reduce,
                   StrAttr:$group, DenseI64ArrayAttr:$ranks);
  let results = (outs Neuron_Tensor:$result);
  let assemblyFormat = [{
    $kind $input attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def Neuron_FlexAttentionOp : Op<Neuron_Dialect, "flex_attention",
    [IsolatedFromAbove, RecursiveMemoryEffects, AttrSizedOperandSegments]> {
  let summary = "FlexAttention: softmax(score_mod(q k^T * scale), masked) v";
  let description = [{
    PyTorch's `flex_attention` higher-order op (and SDPA). Per batch `b`,
    query head `h`, query row `q` and key row `kv`:

        s = score_mod(dot(query[b,h,q], key[b,h/G,kv]) * scale, b, h, q, kv)
        s = mask_mod(b, h, q, kv) ? s : -inf
        out[b,h,q] = softmax_kv(s) @ value[b,h/G]
        lse[b,h,q] = logsumexp_kv(s)   (natural log; -inf for a fully masked row)

    where G = query heads / key heads (GQA). The `score_mod` region takes
    the 0-d score (fp32), b, h, q, kv (0-d integers) and the tensors in
    `score_buffers`, and yields the new score; `mask_mod` takes b, h, q,
    kv and `mask_buffers` and yields an i1. Scores are fp32 whatever the
    inputs' type.

    `blocks` is the block-sparsity of the user's BlockMask at
    `block_size` = [query rows, key rows] granularity, one byte per block,
    indexed [b, h, query block, key block] (size-1 leading dims broadcast):
    0 = fully masked (skipped), 1 = partial (mask_mod applied),
    2 = full (mask_mod skipped).
  }];
  let arguments = (ins RankedTensorOf<[Neuron_Float]>:$query,
                   RankedTensorOf<[Neuron_Float]>:$key,
                   RankedTensorOf<[Neuron_Float]>:$value,
                   Variadic<Neuron_Tensor>:$score_buffers,
                   Variadic<Neuron_Tensor>:$mask_buffers,
                   F64Attr:$scale, DenseI64ArrayAttr:$block_size,
                   ElementsAttr:$blocks);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$out,
                 RankedTensorOf<[F32]>:$lse);
  let regions = (region SizedRegion<1>:$score_mod, SizedRegion<1>:$mask_mod);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`score_buffers` `(` $score_buffers^ `:` type($score_buffers) `)`)?
    (`mask_buffers` `(` $mask_buffers^ `:` type($mask_buffers) `)`)?
    attr-dict `:` type($query) `,` type($key) `,` type($value) `->` type($out) `,` type($lse)
    `score_mod` $score_mod `mask_mod` $mask_mod
  }];
  let hasVerifier = 1;
}

def Neuron_FlexAttentionBackwardOp : Op<Neuron_Dialect, "flex_attention_backward",
    [IsolatedFromAbove, RecursiveMemoryEffects, AttrSizedOperandSegments]> {
  let summary = "the gradients of neuron.flex_attention";
  let description = [{
    PyTorch's `flex_attention_backward` higher-order op: given the forward's
    operands, attributes and modifiers, its `out` and natural-log `lse`,
    and the gradient of `out`, the gradients of the query, key and value:

        s = score_mod(dot(q, k) * scale, b, h, q, kv), masked as forward
        p = exp(s - lse)
        dv += p * grad_out
        ds = p * (dot(grad_out, v) - rowsum(grad_out * out))
        ds = score_grad(dot(q, k) * scale, b, h, q, kv, ds)
        dq += ds * k * scale,  dk += ds * q * scale

    `score_grad` takes score_mod's arguments (the score is the one given
    to score_mod), then the gradient of score_mod's result (fp32), then
    `score_buffers`, and yields the gradient of the score. Key and value
    gradients sum over the query heads sharing a key head (GQA).
  }];
  let arguments = (ins RankedTensorOf<[Neuron_Float]>:$query,
                   RankedTensorOf<[Neuron_Float]>:$key,
                   RankedTensorOf<[Neuron_Float]>:$value,
                   RankedTensorOf<[Neuron_Float]>:$out,
                   RankedTensorOf<[F32]>:$lse,
                   RankedTensorOf<[Neuron_Float]>:$grad_out,
                   Variadic<Neuron_Tensor>:$score_buffers,
                   Variadic<Neuron_Tensor>:$mask_buffers,
                   F64Attr:$scale, DenseI64ArrayAttr:$block_size,
                   ElementsAttr:$blocks);
  let results = (outs RankedTensorOf<[Neuron_Float]>:$grad_query,
                 RankedTensorOf<[Neuron_Float]>:$grad_key,
                 RankedTensorOf<[Neuron_Float]>:$grad_value);
  let regions = (region SizedRegion<1>:$score_mod, SizedRegion<1>:$score_grad,
                 SizedRegion<1>:$mask_mod);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $out `,` $lse `,` $grad_out
    (`score_buffers` `(` $score_buffers^ `:` type($score_buffers) `)`)?
    (`mask_buffers` `(` $mask_buffers^ `:` type($mask_buffers) `)`)?
    attr-dict `:` type($query) `,` type($key) `,` type($value) `,` type($out)
    `,` type($lse) `,` type($grad_out) `->` type($grad_query) `,`
    type($grad_key) `,` type($grad_value)
    `score_mod` $score_mod `score_grad` $score_grad `mask_mod` $mask_mod
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Fusion
//===----------------------------------------------------------------------===//

def Neuron_FusionOp : Op<Neuron_Dialect, "fusion",
    [IsolatedFromAbove, SingleBlock, RecursiveMemoryEffects]> {
  let summary = "ops lowered together: inputs read from HBM once, outputs written once";
  let description = [{
    A group chosen by `neuron-fuse-elementwise`: elementwise ops, row
    reductions over the innermost dims and the broadcasts and reshapes
    between them. The body sees the group's inputs as block arguments and
    yields its outputs; `neuron-lower-to-nisa` tiles the whole body at once,
    keeping intermediates in SBUF.

    ```mlir
    %r = neuron.fusion (%x) : (tensor<4x8xf32>) -> tensor<4x8xf32> {
    ^bb0(%a: tensor<4x8xf32>):
      %e = neuron.unary exp %a : tensor<4x8xf32> -> tensor<4x8xf32>
      neuron.yield %e : tensor<4x8xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<Neuron_Tensor>:$inputs);
  let results = (outs Variadic<Neuron_Tensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` attr-dict `:` functional-type($inputs, results) $body
  }];
  let hasVerifier = 1;
}

def Neuron_YieldOp : Neuron_Op<"yield", [Terminator,
    ParentOneOf<["FusionOp", "FlexAttentionOp", "FlexAttentionBackwardOp"]>,
    ReturnLike]> {
  let summary = "the results of a fusion body or a FlexAttention modifier";
  let arguments = (ins Variadic<Neuron_Tensor>:$values);
  let assemblyFormat = "$values attr-dict `:` type($values)";
}

#endif // NEURON_OPS
