//===- FuseElementwise.cpp - group elementwise ops and row reductions -----===//
//
// Greedy, in program order: an op joins the groups of the operands it
// consumes (all of them, else the first one that works alone) when the
// merged group still has a FusionPlan, fits the row and group budgets, and
// stays legal to place at the op (no op outside the group, before it, uses a
// value of the group). Each group with at least two ops,
// one of them computing, becomes a neuron.fusion at its last op.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "dialects/neuron/NeuronDialect.h"
#include "passes/fuse/FusionPlan.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::neuron {
#define GEN_PASS_DEF_NEURONFUSEELEMENTWISE
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

using namespace mlir;
using namespace mlir::neuron;

namespace {

bool isFusible(Operation *op) {
  if (isColumnSum(op))
    return false; // read in place by its own lowering
  return isa<UnaryOp, BinaryOp, SelectOp, CastOp, ReduceOp, BroadcastOp,
             ReshapeOp>(op);
}

bool computes(Operation *op) { return !isa<BroadcastOp, ReshapeOp>(op); }

/// bf16/f16/fp8 -> f32: free in a group (lowerGroup folds it).
bool widens(Operation *op) {
  auto c = dyn_cast<CastOp>(op);
  if (!c)
    return false;
  Type from = cast<RankedTensorType>(c.getInput().getType()).getElementType();
  return isExactWidening(from, c.getType().getElementType());
}

using Group = SmallVector<Operation *>;

/// Values of `group` that ops outside it use, in program order.
SmallVector<Value> outputsOf(ArrayRef<Operation *> group) {
  llvm::SmallPtrSet<Operation *, 16> members(group.begin(), group.end());
  SmallVector<Value> outputs;
  for (Operation *op : group)
    for (Value v : op->getResults())
      if (llvm::any_of(v.getUsers(),
                       [&](Operation *u) { return !members.contains(u); }))
        outputs.push_back(v);
  return outputs;
}

struct FusePass
    : public mlir::neuron::impl::NeuronFuseElementwiseBase<FusePass> {
  using NeuronFuseElementwiseBase::NeuronFuseElementwiseBase;

  /// The group can be placed at its last op: every use outside the group
  /// comes after that op.
  static bool placeable(ArrayRef<Operation *> group) {
    Operation *last = group.back();
    llvm::SmallPtrSet<Operation *, 16> members(group.begin(), group.end());
    for (Operation *op : group)
      for (Operation *user : op->getUsers())
        if (!members.contains(user) && !last->isBeforeInBlock(user))
          return false;
    return true;
  }

  /// The group has a plan within the row budget. While a group grows, its
  /// outputs are not checked: a broadcast it cannot store may yet be
  /// consumed by an op that joins later.
  bool fits(ArrayRef<Operation *> group, bool checkOutputs) const {
    std::string reason;
    SmallVector<Value> outputs;
    if (checkOutputs)
      outputs = outputsOf(group);
    auto plan = FusionPlan::analyze(group, outputs, reason);
    if (!plan)
      return false;
    if (!plan->byRows)
      return true;
    // A row of every value the lowering may hold in SBUF at once (inputs,
    // outputs, intermediates): flat groups shrink their tiles to fit, but a
    // row-tiled group's rows are whole.
    auto eltBytes = [](Value v) {
      return std::max<int64_t>(
          1, cast<RankedTensorType>(v.getType()).getElementTypeBitWidth() / 8);
    };
    auto rowBytesOf = [&](Value v) {
      return (plan->rep(v) == Rep::Row ? 1 : plan->numCols) * eltBytes(v);
    };
    llvm::SmallPtrSet<Operation *, 16> members(group.begin(), group.end());
    llvm::SmallPtrSet<Value, 16> inputs;
    int64_t widest = 1, held = 0;
    for (Operation *op : group) {
      for (Value v : op->getResults()) {
        widest = std::max(widest, eltBytes(v));
        // Widening casts hold nothing: the engines read 16-bit floats as
        // fp32, so the lowering reads the cast's input.
        if (!isa<ConstantOp, BroadcastOp, ReshapeOp>(op) && !widens(op))
          held += rowBytesOf(v);
      }
      for (Value v : op->getOperands())
        if ((!v.getDefiningOp() || !members.contains(v.getDefiningOp())) &&
            plan->rep(v) != Rep::Splat && inputs.insert(v).second)
          held += rowBytesOf(v);
    }
    return plan->numCols * widest <= rowBytes && held <= groupBytes;
  }

  std::vector<Group> formGroups(Block &block);
  void fuseBlock(Block &block);
  void materialize(ArrayRef<Operation *> group);

  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp func) {
      if (!func.isExternal())
        fuseBlock(func.getBody().front());
    });
  }
};

/// A value computed for free from values computed before it: a widening
/// cast (the engines read 16-bit floats as fp32), or a reshape of one.
static bool isFree(Value v) {
  Operation *def = v.getDefiningOp();
  if (def && isa<ReshapeOp>(def))
    return isFree(def->getOperand(0));
  return def && widens(def);
}

/// Clones `v`'s free chain (isFree) before `user`, returning the copy.
static Value cloneFreeChain(Value v, Operation *user) {
  Operation *def = v.getDefiningOp();
  Value input = def->getOperand(0);
  if (isa<ReshapeOp>(def))
    input = cloneFreeChain(input, user);
  OpBuilder b(user);
  Operation *copy = b.clone(*def);
  copy->setOperand(0, input);
  return copy->getResult(0);
}

std::vector<Group> FusePass::formGroups(Block &block) {
  std::vector<Group> groups;
  llvm::DenseMap<Operation *, size_t> groupOf;
  for (Operation &opRef : block) {
    Operation *op = &opRef;
    if (!isFusible(op))
      continue;
    // Candidates: the groups of the producers of op's operands all merged
    // with op, else each of them alone with op.
    llvm::SetVector<size_t> joined;
    for (Value operand : op->getOperands())
      if (Operation *def = operand.getDefiningOp())
        if (auto it = groupOf.find(def); it != groupOf.end())
          joined.insert(it->second);
    auto tryJoin = [&](ArrayRef<size_t> ids) {
      Group merged;
      for (size_t g : ids)
        merged.append(groups[g]);
      llvm::sort(merged, [](Operation *a, Operation *b) {
        return a->isBeforeInBlock(b);
      });
      merged.push_back(op);
      if (!placeable(merged) || !fits(merged, false))
        return false;
      for (size_t g : ids.drop_front())
        groups[g].clear();
      groups[ids.front()] = merged;
      for (Operation *member : merged)
        groupOf[member] = ids.front();
      return true;
    };
    if (!joined.empty() && tryJoin(joined.getArrayRef()))
      continue;
    if (joined.size() > 1 &&
        llvm::any_of(joined, [&](size_t g) { return tryJoin(g); }))
      continue;
    groups.push_back({op});
    groupOf[op] = groups.size() - 1;
  }
  return groups;
}

/// A group's output that is free (isFree: an upcast x a long row's softmax
/// reads in three groups) would be stored at float32 for the other groups
/// to read: each of them gets its own copy of the cast instead (then the
/// groups are formed again), which its group computes for free. Within one
/// group a cast stays shared (the norms' fused square reads it once).
void FusePass::fuseBlock(Block &block) {
  std::vector<Group> groups = formGroups(block);
  bool copied = false;
  for (Group &group : groups) {
    llvm::SmallPtrSet<Operation *, 16> members(group.begin(), group.end());
    for (Value out : outputsOf(group))
      if (isFree(out))
        for (OpOperand &use : llvm::make_early_inc_range(out.getUses()))
          if (!members.contains(use.getOwner()) && isFusible(use.getOwner())) {
            use.set(cloneFreeChain(out, use.getOwner()));
            copied = true;
          }
  }
  if (copied) {
    // The chains nothing reads any more, users before producers.
    for (Operation &op : llvm::make_early_inc_range(llvm::reverse(block)))
      if (op.getNumResults() == 1 && isFree(op.getResult(0)) && op.use_empty())
        op.erase();
    groups = formGroups(block);
  }
  for (Group &group : groups) {
    // Layout ops whose results the group could only store materialized
    // stay outside it, lowered on their own.
    while (!group.empty() && !computes(group.back()) && !fits(group, true))
      group.pop_back();
    if (group.size() >= 2 && llvm::any_of(group, computes) && fits(group, true))
      materialize(group);
  }
}

void FusePass::materialize(ArrayRef<Operation *> group) {
  llvm::SmallPtrSet<Operation *, 16> members(group.begin(), group.end());
  llvm::SetVector<Value> inputs;
  SmallVector<Operation *> splats;
  for (Operation *op : group)
    for (Value operand : op->getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (def && members.contains(def))
        continue;
      // Splat constants ride along as immediates; clone them inside (with
      // the broadcast that gives one dynamic sizes).
      if (def && isa<ConstantOp>(def) && splatValueOf(operand)) {
        splats.push_back(def);
      } else if (def && isa<BroadcastOp>(def) && splatValueOf(operand) &&
                 def->getOperand(0).getDefiningOp<ConstantOp>()) {
        splats.push_back(def->getOperand(0).getDefiningOp());
        splats.push_back(def);
      } else {
        inputs.insert(operand);
      }
    }
  SmallVector<Value> outputs = outputsOf(group);

  Operation *last = group.back();
  OpBuilder b(last);
  b.setInsertionPointAfter(last);
  SmallVector<Location> locs;
  for (Operation *op : group)
    locs.push_back(op->getLoc());
  Location loc = b.getFusedLoc(locs);
  auto fusion = b.create<FusionOp>(loc, ValueRange(outputs).getTypes(),
                                   inputs.getArrayRef());
  Block *body = b.createBlock(&fusion.getBody());
  IRMapping map;
  for (Value in : inputs)
    map.map(in, body->addArgument(in.getType(), in.getLoc()));
  for (Operation *c : splats)
    if (!map.contains(c->getResult(0)))
      b.clone(*c, map);
  for (Operation *op : group)
    b.clone(*op, map);
  SmallVector<Value> yielded;
  for (Value out : outputs)
    yielded.push_back(map.lookup(out));
  b.create<YieldOp>(loc, yielded);

  for (auto [out, result] : llvm::zip(outputs, fusion.getResults()))
    out.replaceUsesWithIf(result, [&](OpOperand &use) {
      return !members.contains(use.getOwner());
    });
  for (Operation *op : llvm::reverse(group))
    op->erase();
}

} // namespace
