//===- KernelLowering.h - the state of tiling one function into nisa ------===//
//
// `neuron-lower-to-nisa` lowers each function with one KernelLowering: a
// TileBuilder (the tensor -> HBM buffer map and the building blocks: views,
// tiles, loops) with one member per op family, which that family's pattern
// (TilePattern.h, in the family's file) calls. The FlexAttention kernels
// need only the TileBuilder.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_TILE_KERNELLOWERING_H
#define PASSES_TILE_KERNELLOWERING_H

#include "passes/Passes.h"
#include "passes/fuse/FusionPlan.h"
#include "passes/tile/TileBuilder.h"
#include "passes/tile/TilePattern.h"

#include "dialects/neuron/NeuronDialect.h"
#include "dialects/nisa/NisaDialect.h"
#include "runtime/target/Cost.h"
#include "runtime/target/Target.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::neuron {

/// Lowers the ops of one function, one member per op family, building with
/// the TileBuilder it is.
class KernelLowering : public TileBuilder {
public:
  /// `knobs`: the pass's tuning options (Passes.td documents each default).
  KernelLowering(ImplicitLocOpBuilder &builder, ModuleOp module,
                 const ::neuron::target::Target &target,
                 const NeuronLowerToNisaOptions &knobs,
                 const TilePatternSet &patterns)
      : TileBuilder(builder, module, target, knobs), patterns(patterns) {}

  LogicalResult lowerFunction(func::FuncOp func);

  // --- the op families, each called by its pattern (TilePattern.h) -------
  /// LowerLayout.cpp.
  void lowerLayout(Operation *op);
  void lowerConcat(ConcatOp op);
  /// The same over sizes known only at run time (issue #16).
  LogicalResult lowerDynamicLayout(Operation *op);
  LogicalResult lowerDynamicConcat(ConcatOp op);
  /// lowerConcat's path through SBUF for short rows; false where it does
  /// not apply.
  bool concatThroughSbuf(ConcatOp op);
  /// LowerGroup.cpp: a group of elementwise ops (GroupPlan.h).
  /// `operands`: each input of the group with the tensor it reads (null
  /// for a splat); `results`: each output with the result it stores.
  LogicalResult lowerGroup(Operation *anchor, ArrayRef<Operation *> ops,
                           ArrayRef<std::pair<Value, Value>> operands,
                           ArrayRef<std::pair<Value, Value>> results);
  LogicalResult lowerFusion(FusionOp fusion);
  /// LowerMatmul.cpp.
  void lowerMatmul(MatmulOp op);
  /// LowerReduce.cpp.
  void lowerReduce(ReduceOp op);
  /// LowerGather.cpp.
  void lowerGather(GatherOp op);
  void lowerScatter(ScatterOp op);
  /// body(first row, indices [rt, 1], first column, rows tile [rt, ct]);
  /// with `source`, the tile holds those rows of it.
  using IndexedRowsBody = llvm::function_ref<void(Value, Value, Value, Value)>;
  void forEachIndexedRows(Value idx, int64_t rows, int64_t width, Type elt,
                          Value source, IndexedRowsBody body);
  /// forEachIndexedRows' steps: rows per step, rotating slots, columns per
  /// chunk (an indirect DMA moves a chunk of each row per descriptor).
  struct IndexedRows {
    int64_t parts, slots, chunk;
  };
  IndexedRows indexedRows(int64_t rows, int64_t width, Type elt) const;
  /// LowerRand.cpp.
  void lowerRand(RandOp op);
  /// LowerScan.cpp.
  void lowerCumsum(CumsumOp op);
  /// LowerTopK.cpp.
  void lowerTopK(TopKOp op);
  /// lowerTopK's [P, n] constants: column numbers, "taken" (2n), the value
  /// of a taken element, +inf (what a NaN is loaded as), NaN; and how far a
  /// NaN's column number is shifted (-n or n).
  struct TopKConstants {
    Value iota, none, taken, inf, nan;
    double nanShift = 0;
  };
  /// The leading rows of `op` that fold several to a partition; returns how
  /// many (0 when rows are too few or too long to fold).
  int64_t lowerFoldedTopK(TopKOp op, const TopKConstants &c);
  /// Before the rounds: each NaN of `w` becomes +inf (`inf`), and `alive`
  /// the column numbers (`iota`), a NaN's shifted by c.nanShift.
  void loadNaNsAsInf(const TopKConstants &c, Value w, Value scratch,
                     Value alive, Value inf, Value iota);
  /// After the rounds: the picks whose column numbers are a NaN's shifted
  /// ones get their column back and NaN as the value (`scratch` as wide as
  /// `values`, `nan` read over it).
  void restoreNaNs(const TopKConstants &c, int64_t n, Value values,
                   Value indices, Value scratch, Value nan);
  /// Elements of a partition's folded rows.
  static constexpr int64_t kFoldedTopKElements = 512;
  /// LowerCollective.cpp.
  void lowerCollective(CollectiveOp op);

private:
  /// The driver: `op` to the pattern of its family.
  LogicalResult lower(Operation *op);
  /// In LowerColumnSum.cpp: a sum over leading dims, read in place and
  /// reduced across partitions on TensorE; false if `op` is not one.
  bool lowerColumnSum(ReduceOp op);
  /// A scan's blocks of `partitions` rows (the last one shorter): `block(index,
  /// slot, rows, first)`, the middle ones rotating over `slots`.
  void forEachScanBlock(
      int64_t len, int64_t slots,
      llvm::function_ref<void(Value, int64_t, int64_t, bool)> block);
  void lowerRowScan(Value in, Value out, int64_t rows, int64_t len, Type mmElt,
                    Value tri, Value identity);
  void lowerColumnScan(Value in, Value out, int64_t outer, int64_t len,
                       int64_t inner, Type mmElt, Value tri);
  Value scanMatrix(nisa::AluOp cmp, Type mmElt);

  const TilePatternSet &patterns;
};

inline nisa::ActivationFn activationFor(UnaryFn fn) {
  // The enums share spellings; ScalarE's table has every neuron function.
  return *nisa::symbolizeActivationFn(stringifyUnaryFn(fn));
}

inline nisa::AluOp aluFor(BinaryFn fn) {
  switch (fn) {
  case BinaryFn::add:
    return nisa::AluOp::add;
  case BinaryFn::sub:
    return nisa::AluOp::subtract;
  case BinaryFn::mul:
    return nisa::AluOp::multiply;
  case BinaryFn::div:
    return nisa::AluOp::divide;
  case BinaryFn::fmod:
    return nisa::AluOp::mod;
  default:
    return *nisa::symbolizeAluOp(stringifyBinaryFn(fn));
  }
}

inline nisa::AluOp aluFor(ReduceFn fn) {
  switch (fn) {
  case ReduceFn::sum:
    return nisa::AluOp::add;
  case ReduceFn::max:
    return nisa::AluOp::max;
  case ReduceFn::min:
    return nisa::AluOp::min;
  case ReduceFn::prod:
    return nisa::AluOp::multiply;
  }
  llvm_unreachable("unknown reduction");
}

} // namespace mlir::neuron

#endif // PASSES_TILE_KERNELLOWERING_H
