//===- GroupPlan.cpp - what a fused elementwise group becomes -------------===//

#include "passes/tile/GroupPlan.h"

#include "runtime/target/Cost.h"

#include "llvm/ADT/STLExtras.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace mlir::neuron;

namespace {
RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }
Type elt(Value v) { return typeOf(v).getElementType(); }
int64_t bytes(Type t) { return (t.getIntOrFloatBitWidth() + 7) / 8; }
} // namespace

::neuron::runtime::Opcode GroupPlan::instructionOf(Operation *op) const {
  using ::neuron::runtime::Opcode;
  if (isa<UnaryOp>(op) || activations.contains(op))
    return Opcode::Activation;
  if (scaledBy.count(op))
    return Opcode::ScalarTensorTensor;
  if (auto bin = dyn_cast<BinaryOp>(op)) {
    // A splat or a row broadcast against a full tile is a scalar.
    Rep l = rep(bin.getLhs()), r = rep(bin.getRhs());
    bool scalar =
        l == Rep::Splat || r == Rep::Splat || heldAsTile(l) != heldAsTile(r);
    return scalar ? Opcode::TensorScalar : Opcode::TensorTensor;
  }
  if (isa<SelectOp>(op))
    return Opcode::Select;
  if (isa<CastOp>(op))
    return Opcode::Copy;
  assert(isa<ReduceOp>(op) && "an op of a group without an instruction");
  return Opcode::TensorReduce;
}

// Instructions saved by reading values as the engines do (every operand
// is widened to fp32 and every result rounded once on store):
//  - a widening cast (bf16/f16 to f32) is exact: its users read the input;
//  - a narrowing cast of a value used only by it: the producer stores in
//    the narrow type directly (one rounding either way);
//  - f(x - m) (or +) in fp32 with m a row broadcast: one activation with
//    m as its per-partition bias;
//  - a row sum of f(x) (or of x * x): the activation computing f sums its
//    rows as it goes (ScalarE's accumulate);
//  - (x op m) op' w with m a row broadcast, the first result used only
//    by the second: one scalar_tensor_tensor (findScaled).
Operation *GroupPlan::onlyUse(Value v) const {
  if (!v.hasOneUse() || outputs.contains(v))
    return nullptr;
  return *v.getUsers().begin();
}

/// x +- m with m a row, in fp32: what an activation takes as its bias.
static bool isRowShift(const FusionPlan &plan, BinaryOp bin) {
  return (bin.getFn() == BinaryFn::sub || bin.getFn() == BinaryFn::add) &&
         bin.getType().getElementType().isF32() &&
         plan.rep(bin.getLhs()) == Rep::Full &&
         plan.rep(bin.getRhs()) == Rep::Row;
}

/// x * x of a full tile: a square activation can compute it.
static bool isSquare(const FusionPlan &plan, Operation *op) {
  auto bin = dyn_cast<BinaryOp>(op);
  return bin && bin.getFn() == BinaryFn::mul && bin.getLhs() == bin.getRhs() &&
         plan.rep(bin.getLhs()) == Rep::Full;
}

void GroupPlan::findFolds(ArrayRef<Operation *> ops) {
  llvm::DenseSet<Operation *> members(ops.begin(), ops.end());
  findCastAndBiasFolds(ops, members);
  findRowSums(ops, members);
  findSquareBiases(members);
}

/// Widening casts, narrowing casts stored directly, and f(x +- m) as one
/// activation with m as its bias.
void GroupPlan::findCastAndBiasFolds(
    ArrayRef<Operation *> ops, const llvm::DenseSet<Operation *> &members) {
  const FusionPlan &plan = fusion;
  for (Operation *op : ops) {
    if (auto c = dyn_cast<CastOp>(op)) {
      Type from = typeOf(c.getInput()).getElementType();
      Type to = c.getType().getElementType();
      Operation *producer = c.getInput().getDefiningOp();
      if (isExactWidening(from, to)) {
        folded.insert(op);
      } else if (from.isF32() && isa<FloatType>(to) && producer &&
                 members.contains(producer) &&
                 !isa<BroadcastOp, ReshapeOp, ConstantOp>(producer) &&
                 !folded.contains(producer) && onlyUse(c.getInput()) == op &&
                 plan.rep(c.getInput()) == plan.rep(c.getResult())) {
        narrowedBy[c.getInput()] = c.getResult();
        folded.insert(op);
      }
    }
    if (auto u = dyn_cast<UnaryOp>(op)) {
      auto bin = u.getInput().getDefiningOp<BinaryOp>();
      if (bin && members.contains(bin) && onlyUse(bin.getResult()) == op &&
          isRowShift(plan, bin)) {
        biasOf[op] = bin;
        folded.insert(bin);
      }
    }
  }
}

/// Row sums of f(x) or x * x that the activation computing it accumulates.
void GroupPlan::findRowSums(ArrayRef<Operation *> ops,
                            const llvm::DenseSet<Operation *> &members) {
  const FusionPlan &plan = fusion;
  for (Operation *op : ops) {
    auto r = dyn_cast<ReduceOp>(op);
    if (!r || r.getFn() != ReduceFn::sum || plan.rep(r.getResult()) != Rep::Row)
      continue;
    Operation *producer = r.getInput().getDefiningOp();
    if (!producer || !members.contains(producer) || folded.contains(producer) ||
        rowSumOf.count(producer) ||
        !(isa<UnaryOp>(producer) || isSquare(plan, producer)) ||
        plan.rep(r.getInput()) != Rep::Full)
      continue;
    rowSumOf[producer] = r;
    summed.insert(op);
    if (isSquare(plan, producer))
      activations.insert(producer);
  }
}

/// (x - m)^2 with m a row (a variance): the square activation takes -m as
/// its bias, so x - m is never written.
void GroupPlan::findSquareBiases(const llvm::DenseSet<Operation *> &members) {
  for (Operation *op : activations) {
    auto bin = op->getOperand(0).getDefiningOp<BinaryOp>();
    Value v = op->getOperand(0);
    if (bin && members.contains(bin) && !folded.contains(bin) &&
        !outputs.contains(v) &&
        llvm::all_of(v.getUsers(), [&](Operation *u) { return u == op; }) &&
        isRowShift(fusion, bin)) {
      biasOf[op] = bin;
      folded.insert(bin);
    }
  }
}

void GroupPlan::findScaled(ArrayRef<Operation *> ops) {
  const FusionPlan &plan = fusion;
  llvm::DenseSet<Operation *> members(ops.begin(), ops.end());
  for (Operation *op : ops) {
    auto outer = dyn_cast<BinaryOp>(op);
    if (!outer || folded.contains(op) || summed.contains(op))
      continue;
    for (bool innerOnLeft : {true, false}) {
      Value innerValue = innerOnLeft ? outer.getLhs() : outer.getRhs();
      Value other = innerOnLeft ? outer.getRhs() : outer.getLhs();
      // x * rstd cast to bf16 and then scaled by the weight (Llama's RMSNorm):
      // the instruction keeps x * rstd in fp32 and rounds once, at the
      // store, as fused kernels do (PyTorch's Inductor too); eager rounds
      // the product to bf16 first, so the two differ by that rounding.
      CastOp narrowing;
      if (auto c = innerValue.getDefiningOp<CastOp>();
          c && members.contains(c) && narrowedBy.count(c.getInput()) &&
          narrowedBy.lookup(c.getInput()) == c.getResult() &&
          onlyUse(c.getResult()) == op) {
        narrowing = c;
        innerValue = c.getInput();
      }
      auto inner = innerValue.getDefiningOp<BinaryOp>();
      bool commutes =
          outer.getFn() == BinaryFn::mul || outer.getFn() == BinaryFn::add;
      Value innerUse = narrowing ? narrowing.getResult() : innerValue;
      if (!inner || !members.contains(inner) || folded.contains(inner) ||
          onlyUse(innerUse) != op ||
          (narrowing && onlyUse(innerValue) != narrowing) ||
          (!innerOnLeft && !commutes) || biasOf.count(op) ||
          !heldAsTile(plan.rep(other)) || !heldAsTile(plan.rep(innerValue)) ||
          plan.rep(inner.getLhs()) != Rep::Full ||
          plan.rep(inner.getRhs()) != Rep::Row ||
          (!narrowing && inner.getType().getElementType() !=
                             outer.getType().getElementType()))
        continue;
      if (narrowing)
        narrowedBy.erase(innerValue); // the cast is folded: nothing stores
      scaledBy[op] = inner;
      folded.insert(inner);
      break;
    }
  }
}

void GroupPlan::findIntermediates(ArrayRef<Operation *> ops) {
  // The intermediates that get a tile, stored in their own type (or the
  // type of the cast that narrows them).
  for (Operation *op : ops) {
    Value v = op->getResult(0);
    if (isa<ConstantOp, BroadcastOp, ReshapeOp>(op) || folded.contains(op) ||
        outputs.contains(v) ||
        (narrowedBy.count(v) && outputs.contains(narrowedBy.lookup(v))))
      continue;
    Type storage = narrowedBy.count(v) ? elt(narrowedBy.lookup(v)) : elt(v);
    // An activation kept only for the row sums it accumulates (a variance's
    // squares): nothing reads its elements, so they take 16 bits.
    if (rowSumOf.count(op) && isa<FloatType>(storage) &&
        llvm::all_of(v.getUsers(), [&](Operation *u) {
          return u == rowSumOf.lookup(op).getOperation();
        })) {
      storage = BFloat16Type::get(op->getContext());
      unread.insert(v);
    }
    intermediates.push_back({v, storage});
  }
  for (Operation *op : ops)
    if (auto sel = dyn_cast<SelectOp>(op)) {
      bool rowResult = rep(sel.getResult()) == Rep::Row;
      for (Value v : sel->getOperands()) {
        Rep r = rep(v);
        std::pair<Value, bool> tile{v, rowResult};
        if (!heldAsTile(r) && !(rowResult && r == Rep::Row) &&
            !llvm::is_contained(operandTiles, tile))
          operandTiles.push_back(tile);
      }
    }
  // Constants in the group that the plan holds as tensors load like inputs.
  for (Operation *op : ops)
    if (isa<ConstantOp>(op) && fusion.reps.count(op->getResult(0)))
      loaded.push_back(op->getResult(0));
}

// Tile geometry: a row of C per partition, or flat [P, F] tiles (F
// smaller when that keeps every partition busy). Tiles DMAs read or write
// rotate over up to stream-slots slots, so loads run ahead of the compute
// and stores trail it (within stream-sbuf-percent of SBUF); the tiles in
// between alternate between two (within inner-sbuf-percent), so one step's
// instructions never wait for the previous step's to free a tile.
void GroupPlan::layOut(ArrayRef<Value> inputs, int64_t width,
                       const ::neuron::target::Target &target,
                       const NeuronLowerToNisaOptions &knobs) {
  const FusionPlan &plan = fusion;
  int64_t p = target.partitions;
  cols = width;
  if (plan.byRows) {
    steps = (plan.numRows + p - 1) / p;
  } else {
    int64_t rem = plan.numCols % (p * cols);
    steps = plan.numCols / (p * cols) + (rem / cols > 0) + (rem % cols > 0);
  }
  // Per slot, a tile of every input and output, a row's value one column
  // (bits rounded up per column: an over-estimate kept so that programs
  // stay as they were). A row's statistics stored per step (a block's max
  // and sum of exponentials) take a column each: counted whole rows, they
  // held a long row's loads to two slots.
  int64_t streamBytes = 0;
  for (Value v : inputs)
    if (plan.rep(v) == Rep::Full || plan.rep(v) == Rep::Row) // not loaded once
      streamBytes +=
          slotWidth(v) * (typeOf(v).getElementTypeBitWidth() + 7) / 8;
  for (Value v : outputList)
    streamBytes += slotWidth(v) * (typeOf(v).getElementTypeBitWidth() + 7) / 8;
  numSlots = std::min<int64_t>(steps, knobs.streamSlots);
  while (numSlots > 1 && numSlots * streamBytes > target.sbufBytesPerPartition *
                                                      knobs.streamSbufPercent /
                                                      100)
    --numSlots;
  int64_t innerBytes = 0;
  for (auto [v, storage] : intermediates)
    innerBytes += slotWidth(v) * bytes(storage);
  innerSlots = std::min<int64_t>(steps, 2);
  if (innerBytes * innerSlots >
      target.sbufBytesPerPartition * knobs.innerSbufPercent / 100)
    innerSlots = 1;
}

/// Per partition, what a row input loaded once may take.
static constexpr int64_t kPreloadedRowBytes = 2048;

bool GroupPlan::preloaded(Value v) const {
  return rep(v) == Rep::Row && fusion.byRows && !fusion.dynamicRows &&
         typeOf(v).getNumElements() > 1 &&
         steps * bytes(elt(v)) <= kPreloadedRowBytes &&
         llvm::is_contained(loaded, v);
}

/// What the group's tiles take per partition (they are all live at once).
int64_t GroupPlan::heldBytes() const {
  int64_t total = 0;
  llvm::DenseSet<Value> streamed;
  for (Value v : loaded) {
    Rep r = rep(v);
    if (preloaded(v))
      total += steps * bytes(elt(v));
    else if (r == Rep::Full || r == Rep::Row)
      total += numSlots * slotWidth(v) * bytes(elt(v));
    else if (r == Rep::Col)
      total += cols * bytes(elt(v));
    streamed.insert(v);
  }
  for (Value v : outputList)
    if (streamed.insert(v).second)
      total += numSlots * slotWidth(v) * bytes(elt(v));
  for (auto [v, storage] : intermediates)
    if (!sharedUnread || !unread.contains(v))
      total += innerSlots * slotWidth(v) * bytes(storage);
  if (sharedUnread)
    for (Type t : unreadTypes())
      total += cols * bytes(t);
  for (auto [v, rowResult] : operandTiles)
    total += (rowResult ? 1 : cols) * bytes(elt(v));
  return total;
}

Type GroupPlan::tileType(Value v) const {
  if (auto c = v.getDefiningOp<CastOp>();
      c && folded.contains(c) && bytes(elt(c.getInput())) < bytes(elt(v)))
    return tileType(c.getInput());
  if (Value narrowed = narrowedBy.lookup(v))
    return elt(narrowed);
  for (auto [value, storage] : intermediates)
    if (value == v)
      return storage;
  return elt(v);
}

SmallVector<Type> GroupPlan::unreadTypes() const {
  SmallVector<Type> types;
  auto add = [&](Type t) {
    if (!llvm::is_contained(types, t))
      types.push_back(t);
  };
  for (auto [v, storage] : intermediates)
    if (unread.contains(v))
      add(storage);
  for (Operation *op : scalarSums)
    add(tileType(op->getOperand(0)));
  return types;
}

void GroupPlan::chooseSlots(ArrayRef<Operation *> ops, ArrayRef<Value> inputs,
                            const ::neuron::target::Target &target,
                            const NeuronLowerToNisaOptions &knobs,
                            int64_t maxCols) {
  int64_t p = target.partitions;
  int64_t widest = 1;
  for (Operation *op : ops)
    for (Value v : op->getResults())
      widest =
          std::max<int64_t>(widest, typeOf(v).getElementTypeBitWidth() / 8);
  int64_t width = fusion.numCols;
  if (!fusion.byRows) {
    int64_t freeMax = std::max<int64_t>(1, knobs.freeTileBytes / widest);
    if (maxCols)
      freeMax = std::min(freeMax, maxCols);
    width = width >= p * freeMax ? freeMax : std::max<int64_t>(1, width / p);
  }
  layOut(inputs, width, target, knobs);
  // A group with many values gives up pipelining slots, then (flat) tile
  // width, until its tiles fit; a row-tiled group too wide even then is
  // refused by nisa-allocate (neuron-fuse-elementwise's group-bytes keeps
  // such groups from forming).
  while (heldBytes() > target.sbufBytesPerPartition) {
    if (numSlots > 1)
      --numSlots;
    else if (innerSlots > 1)
      innerSlots = 1;
    else if (!fusion.byRows && cols > 1)
      layOut(inputs, cols / 2, target, knobs);
    else
      break;
  }
}

FailureOr<GroupPlan> GroupPlan::decide(ArrayRef<Operation *> ops,
                                       ArrayRef<Value> inputs,
                                       ArrayRef<Value> outputValues,
                                       const ::neuron::target::Target &target,
                                       const NeuronLowerToNisaOptions &knobs,
                                       std::string &reason, int64_t rowLength,
                                       int64_t maxCols) {
  std::optional<FusionPlan> fusion =
      FusionPlan::analyze(ops, outputValues, reason, rowLength);
  if (!fusion)
    return failure();
  GroupPlan plan;
  plan.fusion = std::move(*fusion);
  plan.outputList.assign(outputValues.begin(), outputValues.end());
  plan.outputs.insert(outputValues.begin(), outputValues.end());
  plan.findFolds(ops);
  plan.findScaled(ops);
  plan.loaded.assign(inputs.begin(), inputs.end());
  plan.findIntermediates(ops);
  plan.chooseSlots(ops, inputs, target, knobs, maxCols);
  if (rowLength && plan.heldBytes() > target.sbufBytesPerPartition) {
    reason = "rows of " + std::to_string(rowLength) + " do not fit in SBUF";
    return failure();
  }

  // Row sums of a full tile no activation computes: VectorE's tensor_reduce
  // or ScalarE's identity activation accumulating (ScalarE's clock is
  // faster, and in a norm VectorE has the affine part to do).
  // The activation writes the elements to a scratch tile: only where SBUF
  // has room for one.
  int64_t spare = target.sbufBytesPerPartition - plan.heldBytes();
  for (Operation *op : ops) {
    auto r = dyn_cast<ReduceOp>(op);
    if (r && r.getFn() == ReduceFn::sum && !plan.summed.contains(op) &&
        plan.rep(r.getInput()) == Rep::Full &&
        plan.rep(r.getResult()) == Rep::Row &&
        (spare -= plan.cols * bytes(elt(r.getInput()))) >= 0)
      plan.scalarSums.insert(op);
  }
  llvm::DenseSet<Operation *> unassigned(plan.folded.begin(),
                                         plan.folded.end());
  unassigned.insert(plan.summed.begin(), plan.summed.end());
  plan.choosePsumColumns(ops, unassigned, target);
  auto readsPsum = [&](Operation *op) { return bool(plan.psumColumnOf(op)); };
  EngineBudget budget;
  budget.readsPsum = readsPsum;
  budget.stepDmaNs = plan.stepDmaNs(inputs, target);
  budget.maxPeriod = plan.maxPeriod(target, knobs);
  auto assign = [&] {
    plan.engines = assignEngines(
        target, ops, unassigned, plan.activations, plan.scalarSums,
        [&](Operation *op) { return plan.instructionOf(op); }, plan.fusion,
        plan.cols, budget, &plan.stages);
  };
  assign();
  // Copies in PSUM are for groups whose engines bound them: a group whose
  // steps all take one split keeps its columns in SBUF (and its split).
  if (plan.engines.size() == 1 && !plan.psumColumns.empty()) {
    plan.psumColumns.clear();
    assign();
  }
  if (int64_t period = plan.engines.size(); period > 1)
    plan.setPeriod(period);
  plan.findRowAffines(ops);
  plan.dropUnreadPsumColumns(ops);
  return plan;
}

/// The longest period (up to three steps) the group's engines may
/// alternate over: a static group by rows with at least two periods of
/// steps, whose loaded and stored tiles fit 2 * period slots (a period's
/// loads go to the slots the previous period read) within the stream
/// share of SBUF, and whose period of steps' scratch tiles (ScalarE's row
/// sums) fit beside them.
int64_t GroupPlan::maxPeriod(const ::neuron::target::Target &target,
                             const NeuronLowerToNisaOptions &knobs) {
  if (!fusion.byRows || fusion.dynamicRows)
    return 1;
  int64_t streamBytes = 0;
  llvm::DenseSet<Value> streamed;
  for (Value v : loaded)
    if ((rep(v) == Rep::Full || rep(v) == Rep::Row) &&
        streamed.insert(v).second)
      streamBytes += slotWidth(v) * bytes(elt(v));
  for (Value v : outputList)
    if (streamed.insert(v).second)
      streamBytes += slotWidth(v) * bytes(elt(v));
  int64_t best = 1;
  for (int64_t period = 3; period > 1 && best == 1; --period) {
    GroupPlan trial = *this;
    trial.setPeriod(period);
    if (steps >= 2 * period &&
        trial.numSlots * streamBytes <=
            target.sbufBytesPerPartition * knobs.streamSbufPercent / 100 &&
        trial.heldBytes() <= target.sbufBytesPerPartition)
      best = period;
  }
  return best;
}

/// Steps alternating over `period` splits: a period of steps is emitted at
/// a time, its loads into the other period's slots (2 * period slots), each
/// of its steps with intermediates of its own (period inner slots), the
/// unread ones sharing a tile.
void GroupPlan::setPeriod(int64_t period) {
  numSlots = 2 * period;
  innerSlots = period;
  sharedUnread = true;
}

/// rsqrt(var * (1/D) + eps) and the like on a row: one activation whose
/// scale and immediate bias are the splats, rounded as the separate
/// instructions round (after the product, after the sum). Each [P, 1]
/// instruction saved is a fixed cost a step: Qwen3's q/k norm over rows of
/// 128 spent three of them per 128 rows on ScalarE, its bound.
void GroupPlan::findRowAffines(ArrayRef<Operation *> ops) {
  llvm::DenseSet<Operation *> members(ops.begin(), ops.end());
  // The splat operand of `bin` (an op of the group computing a row in
  // f32, used only by `user`) with fn, and its other operand.
  auto splatStep =
      [&](Value v, BinaryFn fn,
          Operation *user) -> std::optional<std::pair<Value, double>> {
    auto bin = v.getDefiningOp<BinaryOp>();
    if (!bin || bin.getFn() != fn || !members.contains(bin) ||
        folded.contains(bin) || onlyUse(v) != user || rep(v) != Rep::Row ||
        !elt(v).isF32())
      return std::nullopt;
    for (auto [mine, other] : {std::pair(bin.getLhs(), bin.getRhs()),
                               std::pair(bin.getRhs(), bin.getLhs())})
      if (rep(other) == Rep::Splat && rep(mine) == Rep::Row)
        return std::pair(mine, fusion.splats.lookup(other));
    return std::nullopt;
  };
  for (Operation *op : scalarSums) {
    Value v = op->getResult(0);
    while (Operation *user = onlyUse(v)) {
      if (!isa<ReshapeOp>(user))
        break;
      v = user->getResult(0);
    }
    auto mul = dyn_cast_or_null<BinaryOp>(onlyUse(v));
    if (!mul || mul.getFn() != BinaryFn::mul || !members.contains(mul) ||
        folded.contains(mul) || rep(mul.getResult()) != Rep::Row ||
        !elt(mul.getResult()).isF32())
      continue;
    Value other = mul.getLhs() == v ? mul.getRhs() : mul.getLhs();
    int exponent;
    if (rep(other) != Rep::Splat ||
        std::frexp(fusion.splats.lookup(other), &exponent) != 0.5)
      continue; // not a power of two: scaling each element would round
    scaledSumOf[op] = {mul, fusion.splats.lookup(other)};
  }
  for (Operation *op : ops) {
    auto u = dyn_cast<UnaryOp>(op);
    if (!u || biasOf.count(op) || rowSumOf.count(op) ||
        rep(u.getResult()) != Rep::Row)
      continue;
    Affine affine{u.getInput()};
    SmallVector<Operation *> absorbed;
    if (auto add = splatStep(affine.input, BinaryFn::add, op)) {
      absorbed.push_back(affine.input.getDefiningOp());
      affine.bias = add->second;
      affine.input = add->first;
    }
    Operation *user = absorbed.empty() ? op : absorbed.back();
    if (auto mul = splatStep(affine.input, BinaryFn::mul, user)) {
      absorbed.push_back(affine.input.getDefiningOp());
      affine.scale = mul->second;
      affine.input = mul->first;
    }
    if (absorbed.empty())
      continue;
    affineOf[op] = affine;
    folded.insert(absorbed.begin(), absorbed.end());
  }
}

Value GroupPlan::columnOf(Value v) const {
  while (Operation *def = v.getDefiningOp()) {
    bool widening = isa<CastOp>(def) && folded.contains(def) &&
                    typeOf(def->getResult(0)).getElementTypeBitWidth() >
                        typeOf(def->getOperand(0)).getElementTypeBitWidth();
    if (!isa<BroadcastOp, ReshapeOp>(def) && !widening)
      break;
    v = def->getOperand(0);
  }
  return rep(v) == Rep::Col ? v : Value();
}

/// The column vectors a two-input ALU instruction streams beside a full
/// tile without VectorE's 16-bit one-pass mode (an fp32 operand or
/// result): a copy in PSUM makes VectorE stream it once, where the columns
/// fit in PSUM (the group has no other PSUM tiles). By rows and static
/// only: a size-generic group keeps its columns in SBUF.
void GroupPlan::choosePsumColumns(ArrayRef<Operation *> ops,
                                  const llvm::DenseSet<Operation *> &unassigned,
                                  const ::neuron::target::Target &target) {
  using ::neuron::runtime::Opcode;
  if (!fusion.byRows || fusion.dynamicRows)
    return;
  int64_t room = target.psumBytesPerPartition;
  for (Operation *op : ops) {
    if (unassigned.contains(op) || isa<ConstantOp, BroadcastOp, ReshapeOp>(op))
      continue;
    Opcode opcode = instructionOf(op);
    if (opcode != Opcode::TensorTensor && opcode != Opcode::ScalarTensorTensor)
      continue;
    bool all16 = llvm::all_of(op->getResults(), [](Value v) {
      return typeOf(v).getElementTypeBitWidth() == 16;
    });
    for (Value v : op->getOperands())
      all16 &= !heldAsTile(rep(v)) || typeOf(v).getElementTypeBitWidth() == 16;
    if (all16)
      continue;
    for (Value v : op->getOperands()) {
      Value column = columnOf(v);
      if (!column || psumColumns.contains(column))
        continue;
      int64_t need = cols * bytes(elt(column));
      if (need <= room) {
        psumColumns.insert(column);
        room -= need;
      }
      break; // one input in PSUM per instruction
    }
  }
}

void GroupPlan::dropUnreadPsumColumns(ArrayRef<Operation *> ops) {
  llvm::DenseSet<Value> read;
  for (const auto &phase : engines)
    for (Operation *op : ops)
      if (phase.lookup(op) == nisa::Engine::vector && phase.count(op))
        if (Value column = psumColumnOf(op))
          read.insert(column);
  psumColumns = std::move(read);
}

Value GroupPlan::psumColumnOf(Operation *op) const {
  using ::neuron::runtime::Opcode;
  if (psumColumns.empty() || !isa<BinaryOp>(op))
    return Value();
  Opcode opcode = instructionOf(op);
  if (opcode != Opcode::TensorTensor && opcode != Opcode::ScalarTensorTensor)
    return Value();
  for (Value v : op->getOperands())
    if (Value column = columnOf(v); column && psumColumns.contains(column))
      return column;
  return Value();
}

/// The DMA time of one step of P rows: its loads and stores over the DMA
/// engines, by the cost model.
double GroupPlan::stepDmaNs(ArrayRef<Value> inputs,
                            const ::neuron::target::Target &target) const {
  const ::neuron::target::CostModel costModel(target);
  double ns = 0;
  auto moved = [&](Value v) {
    double rowBytes = double(slotWidth(v) * bytes(elt(v)));
    ns += costModel.dmaTransferNs(target.partitions * rowBytes, rowBytes,
                                  target.partitions);
  };
  for (Value v : inputs)
    if (rep(v) == Rep::Full || rep(v) == Rep::Row)
      moved(v);
  for (Value v : outputList)
    moved(v);
  return ns / target.dmaEngines;
}

namespace {
/// What engine assignment weighs: whether an engine may issue an op's
/// instruction, and its time there by the cost model the timing model
/// charges (runtime/target/Cost.h).
class EngineCosts {
public:
  EngineCosts(
      const ::neuron::target::Target &target,
      const llvm::DenseSet<Operation *> &activations,
      const llvm::DenseSet<Operation *> &scalarSums,
      llvm::function_ref<::neuron::runtime::Opcode(Operation *)> instructionOf,
      const FusionPlan &plan, int64_t cols,
      llvm::function_ref<bool(Operation *)> readsPsum)
      : costModel(target), activations(activations), scalarSums(scalarSums),
        instructionOf(instructionOf), plan(plan), cols(cols),
        readsPsum(readsPsum) {}

  bool allowed(Operation *op, nisa::Engine e) const {
    if (e == nisa::Engine::scalar && scalarSums.contains(op))
      return nisa::canIssue(::neuron::runtime::Opcode::Activation, e);
    return nisa::canIssue(instructionOf(op), e);
  }

  /// The group's tiles are contiguous SBUF tiles, read element by element
  /// unless a per-partition register.
  double cost(Operation *op, nisa::Engine e) const {
    using ::neuron::runtime::Opcode;
    Value out = op->getResult(0);
    Value measured = isa<ReduceOp>(op) ? op->getOperand(0) : out;
    Opcode opcode = e == nisa::Engine::scalar && scalarSums.contains(op)
                        ? Opcode::Activation
                        : instructionOf(op);
    ::neuron::target::ComputeShape shape;
    shape.elements = plan.rep(measured) == Rep::Row ? 1.0 : double(cols);
    SmallVector<Value> streamed;
    for (Value v : op->getOperands())
      if (heldAsTile(plan.rep(v)))
        streamed.push_back(v);
    shape.all16Bit = is16(out) && llvm::all_of(streamed, is16);
    // An activation streams its input; its bias and scale are registers.
    shape.streamed = activations.contains(op) || opcode == Opcode::Activation
                         ? 1
                         : int(streamed.size());
    // VectorE reads a column vector's copy in PSUM.
    if (e == nisa::Engine::vector && shape.streamed == 2 && readsPsum(op))
      shape.streamedInPsum = 1;
    return costModel.computeNs(opcode, nisa::toProgram(e), shape);
  }

private:
  static bool is16(Value v) {
    return cast<RankedTensorType>(v.getType()).getElementTypeBitWidth() == 16;
  }

  const ::neuron::target::CostModel costModel;
  const llvm::DenseSet<Operation *> &activations;
  const llvm::DenseSet<Operation *> &scalarSums;
  llvm::function_ref<::neuron::runtime::Opcode(Operation *)> instructionOf;
  const FusionPlan &plan;
  int64_t cols;
  llvm::function_ref<bool(Operation *)> readsPsum;
};

/// One way to run a step's chain of instructions: engine order[0] for
/// work[0, cut1), order[1] for [cut1, cut2), order[2] for the rest, and
/// each engine's time (ns) in load (by kEngines' index).
struct Split {
  nisa::Engine order[3];
  size_t cut1, cut2;
  double load[3];

  double worst() const { return std::max({load[0], load[1], load[2]}); }
  bool dominates(const Split &o) const {
    return load[0] <= o.load[0] && load[1] <= o.load[1] && load[2] <= o.load[2];
  }
};

const nisa::Engine kEngines[3] = {nisa::Engine::vector, nisa::Engine::gpsimd,
                                  nisa::Engine::scalar};

/// Every order of the three engines and two cut points of `work` whose
/// instructions each run on an engine that may issue them.
SmallVector<Split> allSplits(ArrayRef<Operation *> work,
                             const EngineCosts &costs) {
  SmallVector<Split> splits;
  size_t n = work.size();
  for (int a = 0; a < 3; ++a)
    for (int b2 = 0; b2 < 3; ++b2)
      for (int c = 0; c < 3; ++c) {
        if (a == b2 || a == c || b2 == c)
          continue;
        int index[3] = {a, b2, c};
        for (size_t cut1 = 0; cut1 <= n; ++cut1)
          for (size_t cut2 = cut1; cut2 <= n; ++cut2) {
            Split split{{kEngines[a], kEngines[b2], kEngines[c]},
                        cut1,
                        cut2,
                        {0, 0, 0}};
            bool ok = true;
            for (size_t i = 0; i < n && ok; ++i) {
              int seg = i < cut1 ? 0 : i < cut2 ? 1 : 2;
              ok = costs.allowed(work[i], split.order[seg]);
              split.load[index[seg]] += costs.cost(work[i], split.order[seg]);
            }
            if (ok)
              splits.push_back(split);
          }
      }
  return splits;
}

void apply(const Split &split, ArrayRef<Operation *> work,
           llvm::DenseMap<Operation *, nisa::Engine> &engines) {
  for (size_t i = 0; i < work.size(); ++i)
    engines[work[i]] = split.order[i < split.cut1 ? 0 : i < split.cut2 ? 1 : 2];
}

/// The splits for steps 0, 1, ... of a period: the one split whose busiest
/// engine has the least work, unless that engine has more work per step
/// than the step's DMA (it bounds the group) and steps taking different
/// splits in turn (a period of up to three) spread the work better.
SmallVector<const Split *> bestSchedule(ArrayRef<Split> splits,
                                        const EngineBudget &budget) {
  const Split *single = nullptr;
  for (const Split &split : splits)
    if (!single || split.worst() < single->worst())
      single = &split;
  SmallVector<const Split *> best;
  if (!single)
    return best;
  best.push_back(single);
  int64_t maxPeriod = std::min<int64_t>(budget.maxPeriod, 3);
  if (maxPeriod < 2 || single->worst() <= budget.stepDmaNs)
    return best;
  // Only splits no other beats on every engine can be in the best period.
  SmallVector<const Split *> front;
  for (const Split &split : splits) {
    bool dominated = llvm::any_of(splits, [&](const Split &o) {
      return o.dominates(split) && (!split.dominates(o) || &o < &split);
    });
    if (!dominated)
      front.push_back(&split);
  }
  double bestPerStep = single->worst();
  size_t n = front.size();
  auto consider = [&](ArrayRef<const Split *> period) {
    double load[3] = {0, 0, 0};
    for (const Split *split : period)
      for (int e = 0; e < 3; ++e)
        load[e] += split->load[e];
    double perStep = std::max({load[0], load[1], load[2]}) / period.size();
    if (perStep < bestPerStep) {
      bestPerStep = perStep;
      best.assign(period.begin(), period.end());
    }
  };
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i; j < n; ++j)
      consider({front[i], front[j]});
  if (maxPeriod >= 3)
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i; j < n; ++j)
        for (size_t k = j; k < n; ++k)
          consider({front[i], front[j], front[k]});
  return best;
}
} // namespace

/// Engines for a group's instructions. Each engine's queue runs in order,
/// so a step's chain of instructions flows through the engines without
/// going back to one (engine A for a first run of instructions, B for the
/// next, ...): then every engine works on a later step while the next
/// engine finishes this one. Among such splits (each instruction on an
/// engine that may issue it: InstructionSet.def), the one whose busiest
/// engine has the least work, by the target's clocks; if none fits, ALU ops
/// stay on VectorE. Row sums in `scalarSums` may also go to ScalarE, as an
/// identity activation that accumulates. When even that engine has more
/// work than a step's DMA, steps may take different splits in turn, so
/// that each engine's work averaged over the period is least.
SmallVector<llvm::DenseMap<Operation *, nisa::Engine>, 1>
mlir::neuron::assignEngines(
    const ::neuron::target::Target &target, ArrayRef<Operation *> ops,
    const llvm::DenseSet<Operation *> &folded,
    const llvm::DenseSet<Operation *> &activations,
    const llvm::DenseSet<Operation *> &scalarSums,
    llvm::function_ref<::neuron::runtime::Opcode(Operation *)> instructionOf,
    const FusionPlan &plan, int64_t cols, const EngineBudget &budget,
    SmallVectorImpl<llvm::DenseMap<Operation *, int>> *stages) {
  using nisa::Engine;
  SmallVector<Operation *> work;
  for (Operation *op : ops)
    if (!isa<ConstantOp, BroadcastOp, ReshapeOp>(op) && !folded.contains(op))
      work.push_back(op);
  llvm::DenseMap<Operation *, Engine> fallback;
  for (Operation *op : work)
    fallback[op] = isa<UnaryOp>(op) || activations.contains(op)
                       ? Engine::scalar
                       : Engine::vector;
  // Orders of up to three engines and two cut points: cubic in the
  // instructions, so long groups keep the default.
  if (stages)
    stages->assign(1, {});
  if (work.size() > 24)
    return {fallback};
  auto readsPsum = [&](Operation *op) {
    return budget.readsPsum && budget.readsPsum(op);
  };
  EngineCosts costs(target, activations, scalarSums, instructionOf, plan, cols,
                    readsPsum);
  SmallVector<Split> splits = allSplits(work, costs);
  SmallVector<const Split *> schedule = bestSchedule(splits, budget);
  if (schedule.empty())
    return {fallback};
  SmallVector<llvm::DenseMap<Operation *, Engine>, 1> engines;
  if (stages)
    stages->clear();
  for (const Split *split : schedule) {
    engines.push_back(fallback);
    apply(*split, work, engines.back());
    if (stages) {
      stages->emplace_back();
      for (size_t i = 0; i < work.size(); ++i)
        stages->back()[work[i]] = i < split->cut1 ? 0 : i < split->cut2 ? 1 : 2;
    }
  }
  return engines;
}
