//===- GroupPlan.h - what a fused elementwise group becomes ---------------===//
//
// The decisions of lowering a group of elementwise ops (a neuron.fusion, or
// one op alone), made before any IR is built: which ops fold into others'
// instructions, the tile geometry and buffer slots, and the engine each
// instruction runs on. LowerGroup.cpp emits the plan; a unit test checks it
// alone (tests/unit/GroupPlanTest.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_TILE_GROUPPLAN_H
#define PASSES_TILE_GROUPPLAN_H

#include "passes/Passes.h"
#include "passes/fuse/FusionPlan.h"

#include "dialects/neuron/NeuronDialect.h"
#include "dialects/nisa/NisaDialect.h"
#include "runtime/target/Target.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <string>

namespace mlir::neuron {

struct GroupPlan {
  /// How each value is held (full, row, column, splat) and the group's
  /// shape: FusionPlan::analyze's.
  FusionPlan fusion;

  // Folds: instructions saved by reading values as the engines do.
  /// Ops that become no instruction of their own (their users read
  /// through them).
  llvm::DenseSet<Operation *> folded;
  /// An activation -> the row sum it accumulates as it goes.
  llvm::DenseMap<Operation *, ReduceOp> rowSumOf;
  /// The row sums activations make.
  llvm::DenseSet<Operation *> summed;
  /// x * x computed as a square activation (to accumulate its row sum).
  llvm::DenseSet<Operation *> activations;
  /// An outer binary -> the inner one it takes as scalar_tensor_tensor.
  llvm::DenseMap<Operation *, BinaryOp> scaledBy;
  /// A producer's result -> the narrowing cast it stores as directly.
  llvm::DenseMap<Value, Value> narrowedBy;
  /// A unary (or square) -> the add/sub of a row it takes as its bias.
  llvm::DenseMap<Operation *, Operation *> biasOf;

  /// The values the group stores, in order, and as a set.
  SmallVector<Value> outputList;
  llvm::DenseSet<Value> outputs;
  /// The intermediates that get a tile, and the type they are stored in.
  SmallVector<std::pair<Value, Type>> intermediates;
  /// The values loaded: the group's inputs, then the constants it holds as
  /// tensors.
  SmallVector<Value> loaded;

  // Tile geometry: a step is `cols` columns (by rows: a row of C per
  // partition; flat: [P, cols] tiles); loaded and stored tiles rotate over
  // `numSlots` slots, intermediates over `innerSlots`.
  int64_t cols = 0, steps = 0, numSlots = 0, innerSlots = 0;

  /// Row sums ScalarE computes as an identity activation that accumulates.
  llvm::DenseSet<Operation *> scalarSums;
  /// The engine of each op's instruction.
  llvm::DenseMap<Operation *, nisa::Engine> engines;

  Rep rep(Value v) const { return fusion.rep(v); }
  /// Columns a value takes in a step's tile: 1 for a row.
  int64_t slotWidth(Value v) const { return rep(v) == Rep::Row ? 1 : cols; }
  /// The instruction `op` becomes (ops folded or summed become none).
  ::neuron::runtime::Opcode instructionOf(Operation *op) const;

  /// Plans `ops` (in program order) reading `inputs` and storing `outputs`
  /// with tiles of at most `knobs.freeTileBytes` per partition, rotating
  /// over the slots `knobs` allow; on failure says why in `reason`.
  static FailureOr<GroupPlan>
  decide(ArrayRef<Operation *> ops, ArrayRef<Value> inputs,
         ArrayRef<Value> outputs, const ::neuron::target::Target &target,
         const NeuronLowerToNisaOptions &knobs, std::string &reason);

private:
  /// The one user of `v` when it has one and is not a group output (what a
  /// fold may absorb), else null.
  Operation *onlyUse(Value v) const;
  void findFolds(ArrayRef<Operation *> ops);
  void findCastAndBiasFolds(ArrayRef<Operation *> ops,
                            const llvm::DenseSet<Operation *> &members);
  void findRowSums(ArrayRef<Operation *> ops,
                   const llvm::DenseSet<Operation *> &members);
  void findSquareBiases(const llvm::DenseSet<Operation *> &members);
  void findScaled(ArrayRef<Operation *> ops);
  void findIntermediates(ArrayRef<Operation *> ops);
  void layOut(ArrayRef<Value> inputs, int64_t width,
              const ::neuron::target::Target &target,
              const NeuronLowerToNisaOptions &knobs);
  int64_t heldBytes() const;
  void chooseSlots(ArrayRef<Operation *> ops, ArrayRef<Value> inputs,
                   const ::neuron::target::Target &target,
                   const NeuronLowerToNisaOptions &knobs);
};

/// Engines for a group's instructions (GroupPlan.cpp).
llvm::DenseMap<Operation *, nisa::Engine> assignEngines(
    const ::neuron::target::Target &target, ArrayRef<Operation *> ops,
    const llvm::DenseSet<Operation *> &folded,
    const llvm::DenseSet<Operation *> &activations,
    const llvm::DenseSet<Operation *> &scalarSums,
    llvm::function_ref<::neuron::runtime::Opcode(Operation *)> instructionOf,
    const FusionPlan &plan, int64_t cols);

} // namespace mlir::neuron

#endif // PASSES_TILE_GROUPPLAN_H
