//===- NisaOps.td - kernel-level Neuron ISA dialect --------*- tablegen -*-===//
//
// One op per engine instruction of a NeuronCore, named after the NKI ISA.
// Operands are memref views: HBM buffers (no memory space or #nisa.mem<hbm>)
// and on-chip tiles in #nisa.mem<sbuf> / #nisa.mem<psum> whose dim 0 is the
// partition dim. Views are built with memref.reinterpret_cast so every
// operand is an access pattern (offset affine in scf.for ivs, static sizes
// and strides), which is exactly what the program emitter writes out.
//
//===----------------------------------------------------------------------===//

#ifndef NISA_OPS
#define NISA_OPS

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/CommonTypeConstraints.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "dialects/nisa/NisaInterfaces.td"
// The enum cases, from runtime/program/InstructionSet.def (NisaEnums.cmake).
include "dialects/nisa/NisaEnumCases.td"

def Nisa_Dialect : Dialect {
  let name = "nisa";
  let cppNamespace = "::mlir::nisa";
  let summary = "Engine instructions of a Trainium NeuronCore";
  let description = [{
    Kernel-level IR: explicit memories (HBM, SBUF, PSUM), partition dims of at
    most the target's partition count, and one op per TensorE, VectorE,
    ScalarE, GpSimd or DMA instruction. Loops stay `scf.for` loops, so the
    program does not grow with tensor sizes. Verifiers ask the target named
    by the module attribute `nisa.target` (default `trn2`).

    Discardable attributes written by the `nisa` passes, checked by the
    dialect: `nisa.address` (i64, on an SBUF/PSUM `memref.alloc`: the byte
    offset of the tile in every partition, from `nisa-allocate`), and, from
    `nisa-insert-sync`, `nisa.id` (i64, on an instruction), `nisa.waits`
    (array<i64>, on an instruction: ids whose earlier instances must have
    completed before it issues), `nisa.wait_when` (array of strings, one per
    wait: in a size-generic kernel, the size expression positive at the
    sizes where the wait holds, "" for every size) and `nisa.synchronized`
    (unit, on the kernel).
  }];
  let useDefaultAttributePrinterParser = 1;
  let hasOperationAttrVerify = 1;
}

def Nisa_MemorySpace : I32EnumAttr<"MemorySpace", "memory of a NeuronCore",
                                   Nisa_MEMORY_SPACE_CASES> {
  let cppNamespace = "::mlir::nisa";
  let genSpecializedAttr = 0;
}
def Nisa_MemorySpaceAttr : EnumAttr<Nisa_Dialect, Nisa_MemorySpace, "mem"> {
  let assemblyFormat = "`<` $value `>`";
}

def Nisa_ActivationFn : I32EnumAttr<"ActivationFn", "ScalarE function",
                                    Nisa_ACT_FUNC_CASES> {
  let cppNamespace = "::mlir::nisa";
  let genSpecializedAttr = 0;
}
def Nisa_ActivationFnAttr : EnumAttr<Nisa_Dialect, Nisa_ActivationFn, "act">;

def Nisa_AluOp : I32EnumAttr<"AluOp", "VectorE/GpSimd ALU operation",
                             Nisa_ALU_OP_CASES> {
  let cppNamespace = "::mlir::nisa";
  let genSpecializedAttr = 0;
}
def Nisa_AluOpAttr : EnumAttr<Nisa_Dialect, Nisa_AluOp, "alu">;

def Nisa_Collective : I32EnumAttr<"Collective", "collective among ranks",
                                  Nisa_COLLECTIVE_CASES> {
  let cppNamespace = "::mlir::nisa";
  let genSpecializedAttr = 0;
}
def Nisa_CollectiveAttr : EnumAttr<Nisa_Dialect, Nisa_Collective, "collective">;

def Nisa_Engine : I32EnumAttr<"Engine", "instruction queue",
                              Nisa_ENGINE_CASES> {
  let cppNamespace = "::mlir::nisa";
  let genSpecializedAttr = 0;
}
def Nisa_EngineAttr : EnumAttr<Nisa_Dialect, Nisa_Engine, "engine"> {
  let assemblyFormat = "`<` $value `>`";
}

// Every op is an instruction (NisaInterfaces.td). Memref operands say what
// the instruction does to their memory: Nisa_In (read), Nisa_Out (written),
// Nisa_InOut (both); nisa-insert-sync asks which through the interface.
class Nisa_Op<string mnemonic, list<Trait> traits = []>
    : Op<Nisa_Dialect, mnemonic,
         !listconcat([Nisa_InstructionOpInterface], traits)> {
  let hasVerifier = 1;
  // The names of its arguments in ODS order (operands and attributes), for
  // InstructionOpInterface::getNamedOperands.
  let extraClassDeclaration = [{
    static ::llvm::ArrayRef<::llvm::StringLiteral> getArgumentNames() {
      static constexpr ::llvm::StringLiteral names[] = {
  }] # !interleave(!foreach(i, !range(!size(arguments)),
                            "\"" # !getdagname(arguments, i) # "\""), ", ") # [{
      };
      return names;
    }
  }];
}
def Nisa_In : Arg<AnyMemRef, "read", [MemRead]>;
def Nisa_Out : Arg<AnyMemRef, "written", [MemWrite]>;
def Nisa_InOut : Arg<AnyMemRef, "read and written", [MemRead, MemWrite]>;
def Nisa_OptIn : Arg<Optional<AnyMemRef>, "read", [MemRead]>;
def Nisa_OptOut : Arg<Optional<AnyMemRef>, "written", [MemWrite]>;

//===----------------------------------------------------------------------===//
// DMA
//===----------------------------------------------------------------------===//

def Nisa_DmaCopyOp : Nisa_Op<"dma_copy"> {
  let summary = "DMA transfer between any two memories, with dtype cast";
  let description = [{
    `engine` is the queue that triggers the transfer: SyncE by default, or
    ScalarE or GpSimd, so transfers that must wait (a store waiting for its
    data) need not hold up the others queued behind them.
  }];
  let arguments = (ins Nisa_In:$src, Nisa_Out:$dst,
                   DefaultValuedAttr<Nisa_EngineAttr, "Engine::sync">:$engine);
  let assemblyFormat = "$src `,` $dst attr-dict `:` type($src) `,` type($dst)";
}

def Nisa_DmaGatherOp : Nisa_Op<"dma_gather"> {
  let summary = "indirect DMA: dst[p, :] = table[indices[p], :]";
  let arguments = (ins Nisa_In:$table, Nisa_In:$indices, Nisa_Out:$dst);
  let assemblyFormat = [{
    $table `[` $indices `]` `,` $dst attr-dict `:` type($table) `,` type($indices) `,` type($dst)
  }];
}

def Nisa_DmaScatterOp : Nisa_Op<"dma_scatter"> {
  let summary = "indirect DMA: dst[indices[p], :] = src[p, :] (or +=)";
  let description = [{
    Rows of `dst` (in HBM) written by index: the rows no index names keep
    their values. With `accumulate` each row is read, added to in fp32 and
    rounded back (NKI's dma_compute read-add-write). Repeated indices: rows
    go in partition order, the last write wins (PyTorch leaves the order of
    an overwriting index_put undefined). With `disjoint`, no row it writes
    is written by another instruction of the kernel marked so (their
    indices are parts of one permutation): they need no order among
    themselves, and a row written twice is a runtime error.
  }];
  let arguments = (ins Nisa_In:$src, Nisa_In:$indices, Nisa_InOut:$dst,
                   UnitAttr:$accumulate, UnitAttr:$disjoint);
  let assemblyFormat = [{
    $src `,` $dst `[` $indices `]` attr-dict `:` type($src) `,` type($dst) `,` type($indices)
  }];
}

//===----------------------------------------------------------------------===//
// TensorE
//===----------------------------------------------------------------------===//

def Nisa_MatmulOp : Nisa_Op<"matmul", [AttrSizedOperandSegments]> {
  let summary = "dst[M,N] (+)= stationary[K,M]^T @ moving[K,N] into PSUM";
  let description = [{
    The moving operand may have up to three free dims, [K, N1, N2, N3] (a
    convolution's window: images, rows, columns), N their product.

    With `double_row` (NKI's `perf_mode=double_row`, fp8 operands only) the
    operands are [K, R, M] and [K, R, N], R the target's
    matmul_fp8_k_factor: the contraction runs over K x R rows in the time of
    a K-row matmul. Operand dtypes may differ only between the fp8 formats
    (E4M3 with E5M2).

    With `scales` it is an MX matmul (NKI's `nc_matmul_mx`, NC-v4): fp8
    operands [K, R, M] and [K, R, N], R the target's matmul_mx_k_factor (R
    values of K packed per partition, NKI's x4 types), times their E8M0
    scales, u8 [K / 8, M] and [K / 8, N]: row j scales the values on
    partitions [8j, 8j + 8), 32 values per scale. K is a multiple of 32.

    With `is_transpose` (NKI's, bit-accurate from NC-v3 on) the engine moves
    rather than multiplies: dst[M, K] = stationary^T exactly, NaN and
    infinities included, the moving operand the [K, K] identity it streams
    (costed as a matmul with it).
  }];
  // dst is read too when the matmul accumulates into it.
  let arguments = (ins Nisa_In:$stationary, Nisa_In:$moving,
                   Nisa_InOut:$dst, Nisa_OptIn:$stationary_scale,
                   Nisa_OptIn:$moving_scale, UnitAttr:$accumulate,
                   UnitAttr:$double_row, UnitAttr:$is_transpose);
  let assemblyFormat = [{
    $stationary `,` $moving `,` $dst
    (`scales` $stationary_scale^ `,` $moving_scale)? attr-dict `:`
    type($stationary) `,` type($moving) `,` type($dst)
    (`,` type($stationary_scale)^ `,` type($moving_scale))?
  }];
  let builders = [
    OpBuilder<(ins "Value":$stationary, "Value":$moving, "Value":$dst), [{
      build($_builder, $_state, stationary, moving, dst,
            /*stationary_scale=*/Value(), /*moving_scale=*/Value());
    }]>
  ];
}

//===----------------------------------------------------------------------===//
// ScalarE / VectorE / GpSimd
//===----------------------------------------------------------------------===//

def Nisa_ActivationOp : Nisa_Op<"activation", [AttrSizedOperandSegments]> {
  let summary = "ScalarE: dst = func(src * scale + bias), optionally with row sums";
  let description = [{
    `bias` is a [P, 1] column added to `bias_imm`. `scale_col`, a [P, 1] f32
    column, multiplies the `scale` attribute per partition (NKI's tensor
    `scale`). `reduce_res` (written after the keyword `accumulate`), a
    [P, 1] f32 tile, receives for each partition the sum over the free
    elements of the fp32 function results, before they are rounded to dst's
    dtype (NKI's `reduce_op=add, reduce_res`); it is overwritten, not added
    to, and costs nothing extra on ScalarE. The instruction then writes two
    operands: dst and reduce_res.

    Types follow the data types, in operand order: src, dst, then those of
    bias, scale_col and reduce_res that are present.
  }];
  let arguments = (ins Nisa_In:$src, Nisa_Out:$dst, Nisa_OptIn:$bias,
                   Nisa_OptIn:$scale_col, Nisa_OptOut:$reduce_res,
                   Nisa_ActivationFnAttr:$func,
                   DefaultValuedAttr<F64Attr, "1.0">:$scale,
                   DefaultValuedAttr<F64Attr, "0.0">:$bias_imm);
  // The trailing types of the optional operands are printed only for those
  // present; a declarative `(`,` type($x)^)?` per operand would be
  // ambiguous when an earlier one is absent.
  let assemblyFormat = [{
    $func $src `,` $dst (`bias` $bias^)? (`scale_col` $scale_col^)?
    (`accumulate` $reduce_res^)? attr-dict `:` type($src) `,` type($dst) ``
    custom<OptionalTypes>(ref($bias), type($bias), ref($scale_col),
                          type($scale_col), ref($reduce_res), type($reduce_res))
  }];
  // The signature before scale_col and accumulate existed, so lowerings that
  // use neither need not spell two null operands.
  let builders = [
    OpBuilder<(ins "Value":$src, "Value":$dst, "Value":$bias,
                   "ActivationFn":$func, "llvm::APFloat":$scale,
                   "llvm::APFloat":$bias_imm), [{
      build($_builder, $_state, src, dst, bias, /*scale_col=*/Value(),
            /*reduce_res=*/Value(), func, scale, bias_imm);
    }]>
  ];
}

def Nisa_TensorTensorOp : Nisa_Op<"tensor_tensor"> {
  let summary = "VectorE or GpSimd: dst = a op b";
  let arguments = (ins Nisa_AluOpAttr:$op, Nisa_In:$a, Nisa_In:$b,
                   Nisa_Out:$dst,
                   DefaultValuedAttr<Nisa_EngineAttr, "Engine::vector">:$engine);
  let assemblyFormat = [{
    $op $a `,` $b `,` $dst attr-dict `:` type($a) `,` type($b) `,` type($dst)
  }];
}

def Nisa_ScalarTensorTensorOp : Nisa_Op<"scalar_tensor_tensor"> {
  let summary = "VectorE or GpSimd: dst = (a op0 s) op1 b, s an immediate or a [P,1] column";
  let description = [{
    NKI's `scalar_tensor_tensor`: one streaming pass over two tensors with a
    per-partition scalar folded in, computed in fp32 and rounded to dst's
    dtype once. `s` is `scalar[p]` when the [P, 1] `scalar` column is given,
    else `imm`. Costs like a `tensor_tensor` of the same shape.
  }];
  let arguments = (ins Nisa_AluOpAttr:$op0, Nisa_AluOpAttr:$op1,
                   Nisa_In:$a, Nisa_In:$b, Nisa_Out:$dst, Nisa_OptIn:$scalar,
                   DefaultValuedAttr<F64Attr, "0.0">:$imm,
                   DefaultValuedAttr<Nisa_EngineAttr, "Engine::vector">:$engine);
  let assemblyFormat = [{
    $op0 `,` $op1 $a `,` $b `,` $dst (`scalar` $scalar^)? attr-dict `:` type($a) `,` type($b) `,` type($dst) (`,` type($scalar)^)?
  }];
}

def Nisa_TensorScalarOp : Nisa_Op<"tensor_scalar"> {
  let summary = "VectorE, GpSimd or ScalarE: dst = src op s, s an immediate or a [P,1] column";
  let arguments = (ins Nisa_AluOpAttr:$op, Nisa_In:$src, Nisa_Out:$dst,
                   Nisa_OptIn:$scalar,
                   DefaultValuedAttr<F64Attr, "0.0">:$imm, UnitAttr:$reverse,
                   DefaultValuedAttr<Nisa_EngineAttr, "Engine::vector">:$engine);
  let assemblyFormat = [{
    $op $src `,` $dst (`scalar` $scalar^)? attr-dict `:` type($src) `,` type($dst) (`,` type($scalar)^)?
  }];
}

def Nisa_TensorReduceOp : Nisa_Op<"tensor_reduce"> {
  let summary = "VectorE or GpSimd: dst[p, 0] = reduce of the free elements of src[p]";
  let arguments = (ins Nisa_AluOpAttr:$op, Nisa_In:$src, Nisa_Out:$dst,
                   DefaultValuedAttr<Nisa_EngineAttr, "Engine::vector">:$engine);
  let assemblyFormat = [{
    $op $src `,` $dst attr-dict `:` type($src) `,` type($dst)
  }];
}

def Nisa_BnStatsOp : Nisa_Op<"bn_stats"> {
  let summary = "VectorE: dst[p] = (count, mean, count * variance) of the even, then the odd free elements of src[p]";
  let description = [{
    NKI's `bn_stats`: one fp32 pass over at most the target's
    `bn_stats_max_free_elements` (512) elements per partition, written as a
    [P, 6] tile (f32 keeps the statistics exact; other float dtypes round
    them). `bn_aggr` combines the results of several.
  }];
  let arguments = (ins Nisa_In:$src, Nisa_Out:$dst);
  let assemblyFormat = "$src `,` $dst attr-dict `:` type($src) `,` type($dst)";
}

def Nisa_BnAggrOp : Nisa_Op<"bn_aggr"> {
  let summary = "VectorE: dst[p] = (mean, variance) of the bn_stats triples in src[p]";
  let description = [{
    NKI's `bn_aggr`: src[p] holds (count, mean, count * variance) triples
    (one or more `bn_stats` results side by side), combined in fp32 into
    the mean and the population variance of all their elements, a [P, 2]
    tile.
  }];
  let arguments = (ins Nisa_In:$src, Nisa_Out:$dst);
  let assemblyFormat = "$src `,` $dst attr-dict `:` type($src) `,` type($dst)";
}

def Nisa_SelectOp : Nisa_Op<"select"> {
  let summary = "VectorE or GpSimd: dst = pred != 0 ? on_true : on_false";
  let arguments = (ins Nisa_In:$pred, Nisa_In:$on_true, Nisa_In:$on_false,
                   Nisa_Out:$dst,
                   DefaultValuedAttr<Nisa_EngineAttr, "Engine::vector">:$engine);
  let assemblyFormat = [{
    $pred `,` $on_true `,` $on_false `,` $dst attr-dict `:` type($pred) `,` type($on_true) `,` type($on_false) `,` type($dst)
  }];
}

def Nisa_CopyOp : Nisa_Op<"copy"> {
  let summary = "tensor_copy on VectorE, ScalarE or GpSimd, with dtype cast";
  let arguments = (ins Nisa_In:$src, Nisa_Out:$dst,
                   DefaultValuedAttr<Nisa_EngineAttr, "Engine::vector">:$engine);
  let assemblyFormat = "$src `,` $dst attr-dict `:` type($src) `,` type($dst)";
}

def Nisa_MemsetOp : Nisa_Op<"memset"> {
  let summary = "VectorE or GpSimd: dst = value";
  let arguments = (ins Nisa_Out:$dst, F64Attr:$value,
                   DefaultValuedAttr<Nisa_EngineAttr, "Engine::vector">:$engine);
  let assemblyFormat = "$dst `,` $value attr-dict `:` type($dst)";
}

def Nisa_IotaOp : Nisa_Op<"iota"> {
  let summary = "GpSimd: dst[p, i...] = base + offset + p * channel_multiplier + sum(i_k * multipliers[k])";
  let description = [{
    `offset` (optional, index) is built like a view's element offset: index
    constants, `arith.addi`, `arith.muli` by a constant and `scf.for` ivs,
    so an iota can number the elements of the tile a loop iteration covers
    (NKI iota expressions may contain loop indices).
  }];
  let arguments = (ins Nisa_Out:$dst, Optional<Index>:$offset, F64Attr:$base,
                   F64Attr:$channel_multiplier, DenseF64ArrayAttr:$multipliers);
  let assemblyFormat = "$dst (`offset` $offset^)? attr-dict `:` type($dst)";
  // The signature before `offset` existed.
  let builders = [
    OpBuilder<(ins "Value":$dst, "llvm::APFloat":$base,
                   "llvm::APFloat":$channel_multiplier,
                   "llvm::ArrayRef<double>":$multipliers), [{
      build($_builder, $_state, dst, /*offset=*/Value(), base,
            channel_multiplier, multipliers);
    }]>
  ];
}

def Nisa_NGatherOp : Nisa_Op<"n_gather"> {
  let summary = "GpSimd: dst[p, j] = src[p, indices[p, j]] within each partition";
  let description = [{
    NKI's nc_n_gather: each partition gathers from its own elements of `src`
    (its free dims flattened, row-major) by the i32 `indices` (NKI's
    uint32), whose free elements (row-major) number the destination's. All three
    tiles in SBUF (GpSimd cannot reach PSUM), `dst` of `src`'s element type.
    An index outside [0, free elements of `src`) is a runtime error.
  }];
  let arguments = (ins Nisa_In:$src, Nisa_In:$indices, Nisa_Out:$dst);
  let assemblyFormat = [{
    $src `[` $indices `]` `,` $dst attr-dict `:` type($src) `,` type($indices) `,` type($dst)
  }];
}

def Nisa_RandOp : Nisa_Op<"rand"> {
  let summary = "GpSimd: dst[p, i...] = Philox4x32-10 uniform in [0, 1) of element offset + p * channel_multiplier + sum(i_k * multipliers[k])";
  let description = [{
    The element's number n (built like an iota's value, `offset` affine in
    the loop ivs) is the Philox counter (n mod 2^32, n div 2^32, `stream`,
    0) under the key seed[p, 0..1]; the first output word's top 24 bits over
    2^24 is the value, stored with dst's rounding. `seed` is an i32 [P, 2]
    tile (one key per partition, normally the same one broadcast). Every
    element is a function of (seed, stream, n) only, so tiling and engine
    order never change the numbers (docs/PROGRAM_FORMAT.md).
  }];
  let arguments = (ins Nisa_Out:$dst, Nisa_In:$seed, Optional<Index>:$offset,
                   DefaultValuedAttr<I64Attr, "0">:$stream,
                   F64Attr:$channel_multiplier,
                   DenseF64ArrayAttr:$multipliers);
  let assemblyFormat = [{
    $dst `,` $seed (`offset` $offset^)? attr-dict `:` type($dst) `,` type($seed)
  }];
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

def Nisa_CollectiveOp : Nisa_Op<"collective"> {
  let summary = "collective among the ranks of a process group, HBM to HBM";
  let description = [{
    `kind` is all_reduce (dst = `op` over the ranks' src), all_gather
    (dst = the ranks' src one after another, in group order) or
    reduce_scatter (dst = this rank's slice of the reduction of the ranks'
    src). `group` names the process group the runtime resolves (torch's
    group name); `ranks` are its members' global ranks in group order, which
    size the result and place the ring on the instance for the cost model.
    Triggered from GpSimd's queue; like a DMA it completes asynchronously,
    so `nisa-insert-sync` makes readers of dst (and writers of src) wait
    for it, and independent instructions overlap it. `op` is there exactly
    when the collective reduces (not for all_gather).
  }];
  let arguments = (ins Nisa_In:$src, Nisa_Out:$dst, Nisa_CollectiveAttr:$kind,
                   OptionalAttr<Nisa_AluOpAttr>:$op,
                   StrAttr:$group, DenseI64ArrayAttr:$ranks);
  let assemblyFormat = [{
    $kind $src `,` $dst attr-dict `:` type($src) `,` type($dst)
  }];
}

#endif // NISA_OPS
