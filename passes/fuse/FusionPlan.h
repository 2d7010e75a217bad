//===- FusionPlan.h - how a group of elementwise ops is tiled ---*- C++ -*-===//
//
// The analysis shared by neuron-fuse-elementwise (which groups may form)
// and neuron-lower-to-nisa (how a group is tiled). A group is a sequence of
// elementwise, reduce, broadcast and reshape ops. It is tiled either
//   - by rows: every full-size tensor is R rows of C elements (row-major),
//     reductions run along a row, and row vectors (R elements) or column
//     vectors (C elements) broadcast against full tensors; or
//   - flat: every tensor has the same N elements and is cut into tiles of
//     any shape (no reductions, no broadcasts).
// Each value is held per tile as a full tile, a [rows, 1] row tile, a
// column tile loaded once with its row broadcast to every partition, or a
// splat immediate.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_FUSE_FUSIONPLAN_H
#define PASSES_FUSE_FUSIONPLAN_H

#include "mlir/IR/Operation.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/DenseMap.h"

#include <string>

namespace mlir::neuron {

enum class Rep { Full, Row, Col, Splat };

/// Full values and column vectors are held as [rows, C] tiles.
inline bool heldAsTile(Rep r) { return r == Rep::Full || r == Rep::Col; }

struct FusionPlan {
  bool byRows = false;
  /// byRows: R and C. Flat: numRows = 1, numCols = N.
  int64_t numRows = 1, numCols = 1;
  /// byRows with a row count known at run time (issue #16): numRows is a
  /// stand-in, the lowering computes the rows from the size arguments.
  bool dynamicRows = false;
  /// byRows: each row of the group's tensors is this many rows of numCols
  /// (a row too long for SBUF in a group that reduces none: BatchNorm's
  /// rows of 112 x 112); a row value repeats over as many rows of the plan.
  int64_t rowFold = 1;
  llvm::DenseMap<Value, Rep> reps;
  llvm::DenseMap<Value, double> splats;

  Rep rep(Value v) const { return reps.lookup(v); }

  /// Plans `ops` (in program order); operands they do not define are the
  /// group's inputs and `outputs` the values it must store. `rowLength`
  /// (when not 0): a group of whole tensors only goes by rows of that many
  /// elements, not flat (inputs read through windows of those rows). On
  /// failure, returns std::nullopt and says why in `reason`.
  static std::optional<FusionPlan> analyze(ArrayRef<Operation *> ops,
                                           ArrayRef<Value> outputs,
                                           std::string &reason,
                                           int64_t rowLength = 0);
};

/// A sum over the leading dims of a tensor (the importer writes it as a
/// reduction of a transpose that keeps the source's innermost dim): its
/// rows are not rows of memory. Lowered alone it reads the source's rows in
/// place and sums them across partitions on TensorE
/// (KernelLowering::lowerColumnSum); in a group it would need a transposed
/// copy, so neuron-fuse-elementwise leaves it out.
bool isColumnSum(Operation *op);

/// A reduction TensorE can do as a matmul with a ones vector: a sum of a
/// float type its matmuls take (products with 1 exact, fp32 accumulation).
bool isTensorESum(Operation *op);

/// A cast from a float narrower than f32 (bf16, f16, fp8) to f32: exact, so
/// free in a group (the engines widen every operand they read).
bool isExactWidening(Type from, Type to);

/// The splat value of a constant tensor, if it is one.
std::optional<double> splatValueOf(Value tensor);

} // namespace mlir::neuron

#endif // PASSES_FUSE_FUSIONPLAN_H
