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
  /// A unary of a row r * c + d (c, d splats) -> r, c and d, which its
  /// activation takes as its scale and immediate bias (the multiply and add
  /// become no instructions of their own).
  struct Affine {
    Value input;
    double scale = 1, bias = 0;
  };
  llvm::DenseMap<Operation *, Affine> affineOf;
  /// A row sum ScalarE may compute whose one use is a multiply by a power
  /// of two (a mean) -> that multiply and the factor: a
  /// step that sums it on ScalarE scales as it sums (exactly) and has no
  /// multiply instruction.
  llvm::DenseMap<Operation *, std::pair<Operation *, double>> scaledSumOf;

  /// The values the group stores, in order, and as a set.
  SmallVector<Value> outputList;
  llvm::DenseSet<Value> outputs;
  /// The intermediates that get a tile, and the type they are stored in.
  SmallVector<std::pair<Value, Type>> intermediates;
  /// Intermediates whose elements nothing reads (an activation kept for the
  /// row sums it accumulates).
  llvm::DenseSet<Value> unread;
  /// Steps alternating over a period write the unread intermediates and
  /// ScalarE's row-sum scratch to one tile per element type, shared by all.
  bool sharedUnread = false;
  /// A select's row and splat operands, which the lowering makes tiles of
  /// (one a step per operand and result kind), and whether of a row result
  /// (a column, else a step's columns).
  SmallVector<std::pair<Value, bool>> operandTiles;
  /// The values loaded: the group's inputs, then the constants it holds as
  /// tensors.
  SmallVector<Value> loaded;

  // Tile geometry: a step is `cols` columns (by rows: a row of C per
  // partition; flat: [P, cols] tiles); loaded and stored tiles rotate over
  // `numSlots` slots, intermediates over `innerSlots`.
  int64_t cols = 0, steps = 0, numSlots = 0, innerSlots = 0;
  /// Steps whose rows one DMA moves (LowerGroup's batched steps: short
  /// rows, p * batch consecutive ones a transfer); numSlots is 2 * batch.
  int64_t batch = 1;

  /// Row sums ScalarE computes as an identity activation that accumulates.
  llvm::DenseSet<Operation *> scalarSums;
  /// Column vectors also copied once into PSUM, where VectorE reads them: a
  /// two-input VectorE instruction with one input in PSUM streams once.
  llvm::DenseSet<Value> psumColumns;
  /// The engine of each op's instruction, per step: step i takes
  /// engines[i % engines.size()] (more than one when alternating the
  /// engines over steps unloads the engine that bounds every step).
  SmallVector<llvm::DenseMap<Operation *, nisa::Engine>, 1> engines;

  /// Per step likewise, the segment (0 to 2) of its split each instruction
  /// is in: alternating steps are emitted segment by segment.
  SmallVector<llvm::DenseMap<Operation *, int>, 1> stages;

  /// The engine of `op`'s instruction in step `step`.
  nisa::Engine engineOf(Operation *op, int64_t step) const {
    return engines[step % int64_t(engines.size())].lookup(op);
  }
  int stageOf(Operation *op, int64_t step) const {
    return stages[step % int64_t(stages.size())].lookup(op);
  }

  Rep rep(Value v) const { return fusion.rep(v); }
  /// Columns a value takes in a step's tile: 1 for a row.
  int64_t slotWidth(Value v) const { return rep(v) == Rep::Row ? 1 : cols; }
  /// Whether the row input `v` is loaded once before the steps, a column per
  /// step ([P, steps]; BatchNorm's per-channel values): loaded per step, each
  /// small load would wait for the step that last read its slot.
  bool preloaded(Value v) const;
  /// The instruction `op` becomes (ops folded or summed become none).
  ::neuron::runtime::Opcode instructionOf(Operation *op) const;
  /// The column vector (a loaded value) `v` reads through broadcasts,
  /// reshapes and folded widening casts, or null.
  Value columnOf(Value v) const;
  /// The column `op`'s instruction reads from PSUM on VectorE, or null.
  Value psumColumnOf(Operation *op) const;
  /// The element type of the tile `v` is held in (a folded widening cast
  /// reads its input's tile).
  Type tileType(Value v) const;
  /// The element types of the shared tiles of unread values (sharedUnread).
  SmallVector<Type> unreadTypes() const;
  /// SBUF bytes per partition of the group's tiles (all live at once).
  int64_t heldBytes() const;

  /// Plans `ops` (in program order) reading `inputs` and storing `outputs`
  /// with tiles of at most `knobs.freeTileBytes` per partition, rotating
  /// over the slots `knobs` allow (`rowLength`: FusionPlan::analyze's, the
  /// plan refused if its rows do not fit; `maxCols`, when not 0: a flat
  /// plan's tiles at most that wide); on failure says why in `reason`.
  static FailureOr<GroupPlan>
  decide(ArrayRef<Operation *> ops, ArrayRef<Value> inputs,
         ArrayRef<Value> outputs, const ::neuron::target::Target &target,
         const NeuronLowerToNisaOptions &knobs, std::string &reason,
         int64_t rowLength = 0, int64_t maxCols = 0);

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
  void findRowAffines(ArrayRef<Operation *> ops);
  void findIntermediates(ArrayRef<Operation *> ops);
  void layOut(ArrayRef<Value> inputs, int64_t width,
              const ::neuron::target::Target &target,
              const NeuronLowerToNisaOptions &knobs);
  int64_t maxPeriod(const ::neuron::target::Target &target,
                    const NeuronLowerToNisaOptions &knobs);
  void setPeriod(int64_t period);
  void chooseSlots(ArrayRef<Operation *> ops, ArrayRef<Value> inputs,
                   const ::neuron::target::Target &target,
                   const NeuronLowerToNisaOptions &knobs, int64_t maxCols);
  void choosePsumColumns(ArrayRef<Operation *> ops,
                         const llvm::DenseSet<Operation *> &unassigned,
                         const ::neuron::target::Target &target);
  void dropUnreadPsumColumns(ArrayRef<Operation *> ops);
  double stepDmaNs(ArrayRef<Value> inputs,
                   const ::neuron::target::Target &target) const;
};

/// What assignEngines weighs beside the ops: the step's DMA time (an
/// engine with less work per step does not bound the group), which
/// instructions read a column from PSUM on VectorE, and the most steps a
/// schedule may alternate over.
struct EngineBudget {
  double stepDmaNs = 0;
  llvm::function_ref<bool(Operation *)> readsPsum = {};
  int64_t maxPeriod = 1;
};

/// Engines for a group's instructions, per step (GroupPlan.cpp); with
/// `stages`, each instruction's segment of its step's split.
SmallVector<llvm::DenseMap<Operation *, nisa::Engine>, 1> assignEngines(
    const ::neuron::target::Target &target, ArrayRef<Operation *> ops,
    const llvm::DenseSet<Operation *> &folded,
    const llvm::DenseSet<Operation *> &activations,
    const llvm::DenseSet<Operation *> &scalarSums,
    llvm::function_ref<::neuron::runtime::Opcode(Operation *)> instructionOf,
    const FusionPlan &plan, int64_t cols, const EngineBudget &budget = {},
    SmallVectorImpl<llvm::DenseMap<Operation *, int>> *stages = nullptr);

} // namespace mlir::neuron

#endif // PASSES_TILE_GROUPPLAN_H
