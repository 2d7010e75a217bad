//===- LowerGroup.cpp - a fused elementwise group -> tile loops -----------===//
//
// Emits a GroupPlan: the group's tiles (rotating slots for what DMAs move,
// two slots for intermediates, rows broadcast to every partition loaded
// once), then its steps, each a load phase and a compute phase so that the
// loads run ahead of the compute (forEachPipelined).
//
//===----------------------------------------------------------------------===//

#include "passes/tile/GroupPlan.h"
#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

#include "runtime/target/Cost.h"

#include <limits>

using namespace mlir;
using namespace mlir::neuron;

namespace {

class GroupEmitter {
public:
  GroupEmitter(TileBuilder &k, const GroupPlan &plan, ArrayRef<Operation *> ops,
               ArrayRef<std::pair<Value, Value>> inputs,
               ArrayRef<std::pair<Value, Value>> outputs,
               const llvm::DenseMap<Value, TileBuilder::GroupWindow> &windows)
      : k(k), b(k.b), plan(plan), fusion(plan.fusion), ops(ops), inputs(inputs),
        outputs(outputs), windows(windows), p(k.target.partitions) {}

  /// Everything: tiles, then the steps; `rows`: a size-generic group's.
  void emit(Value rows = {});

private:
  enum class Phase { Load, Compute };
  /// One step's place and tiles: `base` is the first row (by rows) or
  /// element (flat).
  struct Step {
    Value base;
    int64_t rows, cols, slotIndex;
    llvm::DenseMap<Value, Value> tiles; // value -> its tile in this step
    /// A size-generic group's last step: the rows its DMAs move (the
    /// compute runs on whole tiles; rows past these are never stored).
    Value dmaRows = {};
    /// Ops another instruction of this step computed (plan.scaledSumOf).
    llvm::DenseSet<Operation *> absorbed = {};
    /// The first of the step's `cols` columns within the group's row (a
    /// step split by columns: computeLastPeriod).
    int64_t col0 = 0;
    /// asTile's tiles of row and splat operands (and whether of a row
    /// result), made once a step, as GroupPlan::operandTiles counts them.
    mutable llvm::DenseMap<std::pair<Value, int>, Value> operandTiles = {};

    Value tileOf(Value v) const { return tiles.lookup(v); }
  };

  static Type elt(Value v) { return tensorType(v).getElementType(); }
  static int64_t bytes(Type t) { return (t.getIntOrFloatBitWidth() + 7) / 8; }
  bool fullish(Value v) const { return heldAsTile(plan.rep(v)); }
  nisa::Engine engineOf(const Step &st, Operation *op) const {
    return plan.engineOf(op, st.slotIndex);
  }

  void allocate();
  void loadColumn(Value v, Value buffer);
  void loadColumns();
  void copyToPsum(Value v);
  Value tensorOperand(const Step &st, Operation *op, Value v) const;
  void step(Phase phase, Value base, int64_t rows, int64_t stepCols,
            int64_t slotIndex, Value dmaRows = {});
  Step prepare(Phase phase, Value base, int64_t rows, int64_t stepCols,
               int64_t slotIndex, Value dmaRows = {});
  void computeOps(MutableArrayRef<Step> steps, int stage,
                  llvm::function_ref<bool(Operation *)> emits = {});
  void store(Step &st, llvm::function_ref<bool(Value)> stores = {});
  void emitAlternating();
  void computeLastPeriod(MutableArrayRef<Step> steps);
  Step columnsOf(const Step &st, int64_t col0, int64_t cols);
  Value moved(const Step &st, Value tile) {
    return st.dmaRows ? k.withRows(tile, st.dmaRows) : tile;
  }
  void emitDynamic(Value rows);
  void emitBatched();
  Value batchWindow(Value v, Value buffer, Value batchIdx);
  Value slot(const Step &st, Value v);
  Value window(const Step &st, Value v, Value buffer);
  void preloadRow(Value v, Value buffer);
  void loadFoldedRow(const Step &st, Value v, Value buffer);
  Value dstFor(const Step &st, Value v);
  Value heldTile(const Step &st, Value v);
  Value discardTile(const Step &st, Type t);
  Value asTile(const Step &st, Value v, bool rowResult);
  std::pair<Value, Value> rowSums(Step &st, Operation *op);
  std::pair<Value, Value> biasedSource(const Step &st, Operation *op,
                                       Value src);
  void emitOp(Step &st, Operation *op, Value dst);
  void emitBinary(Step &st, BinaryOp bin, Value dst);

  TileBuilder &k;
  ImplicitLocOpBuilder &b;
  const GroupPlan &plan;
  const FusionPlan &fusion;
  ArrayRef<Operation *> ops;
  ArrayRef<std::pair<Value, Value>> inputs, outputs;
  /// Inputs read in place from windows (KernelLowering::lowerGroup).
  const llvm::DenseMap<Value, TileBuilder::GroupWindow> &windows;
  int64_t p;
  llvm::DenseMap<Value, Value> slots, columns;
  llvm::DenseMap<Value, Value> preloadedRows; // GroupPlan::preloaded -> tile
  llvm::DenseMap<Value, Value> psumCopies; // column -> its copy in PSUM
  llvm::DenseMap<Type, Value> discards;    // plan.unreadTypes() -> tile
  llvm::DenseMap<Value, Value> inner;      // intermediate -> its two-slot tile
  SmallVector<std::pair<Value, Value>> loaded;
  SmallVector<std::pair<Value, Value>> columnBuffers; // Col inputs
};

void GroupEmitter::allocate() {
  int64_t numSlots = plan.numSlots;
  // The inputs with their buffers (none for a splat), then the constants
  // the plan holds as tensors.
  SmallVector<std::pair<Value, Value>> groupInputs(inputs);
  for (Value v : ArrayRef<Value>(plan.loaded).drop_front(inputs.size()))
    groupInputs.push_back({v, Value()});
  for (auto [v, given] : groupInputs) {
    Rep rep = plan.rep(v);
    // A splat the plan holds as a tensor needs its constant buffer.
    Value buffer = given || rep == Rep::Splat ? given : k.bufferOf(v);
    loaded.push_back({v, buffer});
    if (plan.preloaded(v))
      preloadRow(v, buffer);
    else if (rep == Rep::Full || rep == Rep::Row)
      slots[v] =
          k.tile(MemorySpace::sbuf, {p, numSlots * plan.slotWidth(v)}, elt(v));
    // Alternating steps load their columns after the first period's rows:
    // the rows' statistics do not need them.
    if (rep == Rep::Col && plan.engines.size() > 1)
      columnBuffers.push_back({v, buffer});
    else if (rep == Rep::Col)
      loadColumn(v, buffer);
  }
  for (auto [v, buffer] : outputs)
    if (!slots.count(v))
      slots[v] =
          k.tile(MemorySpace::sbuf, {p, numSlots * plan.slotWidth(v)}, elt(v));
  for (auto [v, storage] : plan.intermediates)
    if (!plan.sharedUnread || !plan.unread.contains(v))
      inner[v] = k.tile(MemorySpace::sbuf,
                        {p, plan.innerSlots * plan.slotWidth(v)}, storage);
  if (plan.sharedUnread)
    for (Type t : plan.unreadTypes())
      discards[t] = k.tile(MemorySpace::sbuf, {p, plan.cols}, t);
}

/// The tile a step's compute left `v` in, found again from the step's slot
/// (an alternating period stores after later periods' code, so not from
/// its SSA values): as computeOps maps them, a broadcast, reshape or folded
/// op holds its operand's tile (an output reshaping a row sum is stored
/// from the sum's inner tile, not from its own slot, which nothing wrote).
Value GroupEmitter::heldTile(const Step &st, Value v) {
  while (Operation *def = v.getDefiningOp()) {
    if (!llvm::is_contained(ops, def) ||
        !(isa<BroadcastOp, ReshapeOp>(def) || plan.folded.contains(def)))
      break;
    v = def->getOperand(0);
  }
  if (llvm::none_of(loaded, [&](auto l) { return l.first == v; }))
    return dstFor(st, v);
  if (plan.rep(v) == Rep::Col) // as prepare views it
    return k.view(columns.lookup(v), k.index(st.col0), {st.rows, st.cols},
                  {plan.cols, 1});
  return slot(st, v);
}

/// A tile of `t` whose elements nothing reads: the shared one, or a new one.
Value GroupEmitter::discardTile(const Step &st, Type t) {
  if (Value shared = discards.lookup(t))
    return k.view(shared, k.index(st.col0), {st.rows, st.cols}, {plan.cols, 1});
  return k.tile(MemorySpace::sbuf, {st.rows, st.cols}, t);
}

/// One row broadcast to every partition, loaded once. A long row goes to
/// one partition and is copied on chip to the others, so HBM gives its
/// bytes once, not once per partition; a short one is read from HBM by
/// every partition (a second transfer's latency would cost more than the
/// bytes).
void GroupEmitter::loadColumn(Value v, Value buffer) {
  const auto &target = k.target;
  int64_t cols = plan.cols;
  Value t = k.tile(MemorySpace::sbuf, {p, cols}, elt(v));
  double repeatedNs = double((p - 1) * cols * bytes(elt(v))) /
                      (target.peakHbmBytesPerSecond() * 1e-9);
  if (repeatedNs > target.dmaFixedLatencyNs) {
    Value row = k.tile(MemorySpace::sbuf, {1, cols}, elt(v));
    k.dma(k.view(buffer, k.index(0), {1, cols}, {0, 1}), row);
    k.dma(k.view(row, k.index(0), {p, cols}, {0, 1}), t);
  } else {
    k.dma(k.view(buffer, k.index(0), {p, cols}, {0, 1}), t);
  }
  columns[v] = t;
}

void GroupEmitter::loadColumns() {
  for (auto [v, buffer] : columnBuffers) {
    loadColumn(v, buffer);
    if (plan.psumColumns.contains(v))
      copyToPsum(v);
  }
}

/// A column VectorE reads from PSUM: copied there once, by the engine the
/// cost model finds fastest among those that write PSUM (GpSimd cannot).
void GroupEmitter::copyToPsum(Value v) {
  using ::neuron::runtime::Opcode;
  const ::neuron::target::CostModel costModel(k.target);
  ::neuron::target::ComputeShape shape;
  shape.elements = double(plan.cols);
  shape.streamed = 1;
  shape.all16Bit = bytes(elt(v)) == 2;
  shape.dstInPsum = true;
  nisa::Engine best = nisa::Engine::vector;
  double bestNs = std::numeric_limits<double>::infinity();
  for (nisa::Engine e : {nisa::Engine::vector, nisa::Engine::scalar}) {
    if (!nisa::canIssue(Opcode::Copy, e))
      continue;
    double ns = costModel.computeNs(Opcode::Copy, nisa::toProgram(e), shape);
    if (ns < bestNs) {
      bestNs = ns;
      best = e;
    }
  }
  Value t = k.tile(MemorySpace::psum, {p, plan.cols}, elt(v));
  b.create<nisa::CopyOp>(columns[v], t, best);
  psumCopies[v] = t;
}

/// A tensor operand of `op`'s instruction: a column's copy in PSUM where
/// the plan has VectorE read it there, else its tile.
Value GroupEmitter::tensorOperand(const Step &st, Operation *op,
                                  Value v) const {
  Value column = plan.columnOf(v);
  if (!column || engineOf(st, op) != nisa::Engine::vector ||
      plan.psumColumnOf(op) != column)
    return st.tileOf(v);
  return k.view(psumCopies.lookup(column), k.index(st.col0), {st.rows, st.cols},
                {plan.cols, 1});
}

Value GroupEmitter::slot(const Step &st, Value v) {
  int64_t width = plan.slotWidth(v), numSlots = plan.numSlots;
  int64_t col0 = width == 1 ? 0 : st.col0;
  return k.view(slots[v], k.index(st.slotIndex % numSlots * width + col0),
                {st.rows, width == 1 ? 1 : st.cols}, {numSlots * width, 1});
}

/// The HBM window of a value in this step.
Value GroupEmitter::window(const Step &st, Value v, Value buffer) {
  Value window;
  if (plan.rep(v) == Rep::Row) {
    auto type = tensorType(v);
    if (type.hasStaticShape() && type.getNumElements() == 1)
      window = k.view(buffer, k.index(0), {st.rows, 1}, {0, 1});
    else
      window = k.view(buffer, st.base, {st.rows, 1}, {1, 1});
  } else if (auto w = windows.find(v); w != windows.end() && w->second.period) {
    // Each step is one repeat of the block (lowerGroup).
    int64_t stride = fusion.byRows ? fusion.numCols : st.cols;
    window = k.view(buffer, k.index(w->second.offset + st.col0),
                    {st.rows, st.cols}, {stride, 1});
  } else if (w != windows.end()) {
    const TileBuilder::GroupWindow &rw = w->second;
    window =
        k.view(buffer,
               k.addOffset(k.scale(st.base, rw.rowStride), rw.offset + st.col0),
               {st.rows, st.cols}, {rw.rowStride, 1});
  } else {
    int64_t stride = fusion.byRows ? fusion.numCols : st.cols;
    Value at = fusion.byRows ? k.scale(st.base, fusion.numCols) : st.base;
    window = k.view(buffer, k.addOffset(at, st.col0), {st.rows, st.cols},
                    {stride, 1});
  }
  return st.dmaRows ? k.withRows(window, st.dmaRows) : window;
}

Value GroupEmitter::dstFor(const Step &st, Value v) {
  if (plan.outputs.contains(v))
    return slot(st, v);
  if (Value narrowed = plan.narrowedBy.lookup(v);
      narrowed && plan.outputs.contains(narrowed))
    return slot(st, narrowed);
  if (plan.sharedUnread && plan.unread.contains(v))
    return discardTile(st, plan.tileType(v));
  int64_t width = plan.slotWidth(v), innerSlots = plan.innerSlots;
  int64_t col0 = width == 1 ? 0 : st.col0;
  return k.view(inner.lookup(v),
                k.index(st.slotIndex % innerSlots * width + col0),
                {st.rows, width == 1 ? 1 : st.cols}, {innerSlots * width, 1});
}

/// A row or splat operand as a tile of the result's shape (select takes
/// equal shapes).
Value GroupEmitter::asTile(const Step &st, Value v, bool rowResult) {
  Rep rep = plan.rep(v);
  if (heldAsTile(rep) || (rowResult && rep == Rep::Row))
    return st.tileOf(v);
  Value &t = st.operandTiles[{v, int(rowResult)}];
  if (t)
    return t;
  t = k.tile(MemorySpace::sbuf, {st.rows, rowResult ? 1 : st.cols}, elt(v));
  double fill = rep == Rep::Splat ? fusion.splats.lookup(v) : 0.0;
  b.create<nisa::MemsetOp>(t, APFloat(fill));
  if (rep == Rep::Row)
    b.create<nisa::TensorScalarOp>(nisa::AluOp::add, t, t, st.tileOf(v),
                                   APFloat(0.0), false);
  return t;
}

/// The row sums `op`'s activation accumulates, fp32 on ScalarE: the tile
/// it accumulates into and, for a narrower sum, the tile it is copied to.
std::pair<Value, Value> GroupEmitter::rowSums(Step &st, Operation *op) {
  ReduceOp sum = plan.rowSumOf.lookup(op);
  if (!sum)
    return {};
  Value sums = dstFor(st, sum.getResult());
  st.tiles[sum.getResult()] = sums;
  if (cast<MemRefType>(sums.getType()).getElementType().isF32())
    return {sums, Value()};
  return {k.tile(MemorySpace::sbuf, {st.rows, 1}, b.getF32Type()), sums};
}

/// f(x - m) with m a row: the activation reads x and takes the row
/// (negated) as its per-partition bias.
std::pair<Value, Value> GroupEmitter::biasedSource(const Step &st,
                                                   Operation *op, Value src) {
  auto shift = plan.biasOf.lookup(op);
  if (!shift)
    return {st.tileOf(src), Value()};
  auto bin = cast<BinaryOp>(shift);
  Value bias = st.tileOf(bin.getRhs());
  if (bin.getFn() == BinaryFn::sub) {
    Value negated = k.tile(MemorySpace::sbuf, {st.rows, 1}, b.getF32Type());
    b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, bias, negated,
                                   Value(), APFloat(-1.0), false,
                                   engineOf(st, op));
    bias = negated;
  }
  return {st.tileOf(bin.getLhs()), bias};
}

void GroupEmitter::emitBinary(Step &st, BinaryOp bin, Value dst) {
  Operation *op = bin;
  if (BinaryOp inner = plan.scaledBy.lookup(op)) {
    // (x op0 m) op1 w.
    auto readsInner = [&](Value v) {
      auto c = v.getDefiningOp<CastOp>();
      return v == inner.getResult() || (c && c.getInput() == inner.getResult());
    };
    bool innerOnLeft = readsInner(bin.getLhs());
    Value w = innerOnLeft ? bin.getRhs() : bin.getLhs();
    b.create<nisa::ScalarTensorTensorOp>(
        aluFor(inner.getFn()), aluFor(bin.getFn()), st.tileOf(inner.getLhs()),
        tensorOperand(st, op, w), dst, st.tileOf(inner.getRhs()), APFloat(0.0),
        engineOf(st, op));
    return;
  }
  nisa::AluOp alu = aluFor(bin.getFn());
  Value l = bin.getLhs(), r = bin.getRhs();
  Rep rl = plan.rep(l), rr = plan.rep(r);
  if (rl == Rep::Splat || rr == Rep::Splat) {
    bool reverse = rl == Rep::Splat;
    double imm = fusion.splats.lookup(reverse ? l : r);
    b.create<nisa::TensorScalarOp>(alu, st.tileOf(reverse ? r : l), dst,
                                   Value(), APFloat(imm), reverse,
                                   engineOf(st, op));
  } else if (fullish(l) != fullish(r)) {
    // A row broadcast against a full tile: a per-partition scalar.
    bool reverse = !fullish(l);
    b.create<nisa::TensorScalarOp>(alu, st.tileOf(reverse ? r : l), dst,
                                   st.tileOf(reverse ? l : r), APFloat(0.0),
                                   reverse, engineOf(st, op));
  } else {
    b.create<nisa::TensorTensorOp>(alu, tensorOperand(st, op, l),
                                   tensorOperand(st, op, r), dst,
                                   engineOf(st, op));
  }
}

/// The instruction of one op of the group, writing `dst`.
void GroupEmitter::emitOp(Step &st, Operation *op, Value dst) {
  if (plan.activations.contains(op)) {
    // (x - m)^2 as (m - x)^2, the same number: -x with m as the bias, so
    // m needs no negating first.
    auto shift = cast_or_null<BinaryOp>(plan.biasOf.lookup(op));
    bool flip = shift && shift.getFn() == BinaryFn::sub;
    auto [src, bias] =
        flip ? std::pair(st.tileOf(shift.getLhs()), st.tileOf(shift.getRhs()))
             : biasedSource(st, op, op->getOperand(0));
    auto [acc, narrow] = rowSums(st, op);
    b.create<nisa::ActivationOp>(src, dst, bias, Value(), acc,
                                 nisa::ActivationFn::square,
                                 APFloat(flip ? -1.0 : 1.0), APFloat(0.0));
    if (narrow)
      b.create<nisa::CopyOp>(acc, narrow, nisa::Engine::gpsimd);
    return;
  }
  if (auto u = dyn_cast<UnaryOp>(op)) {
    // exp(x - m) with m a row: the row rides along as the bias;
    // rsqrt(r * c + d): the splats are its scale and immediate bias.
    auto [src, bias] = biasedSource(st, op, u.getInput());
    auto [acc, narrow] = rowSums(st, op);
    GroupPlan::Affine affine = plan.affineOf.lookup(op);
    if (affine.input)
      src = st.tileOf(affine.input);
    b.create<nisa::ActivationOp>(src, dst, bias, Value(), acc,
                                 activationFor(u.getFn()),
                                 APFloat(affine.scale), APFloat(affine.bias));
    if (narrow)
      b.create<nisa::CopyOp>(acc, narrow, nisa::Engine::gpsimd);
  } else if (auto bin = dyn_cast<BinaryOp>(op)) {
    emitBinary(st, bin, dst);
  } else if (auto sel = dyn_cast<SelectOp>(op)) {
    bool rowResult = plan.rep(sel.getResult()) == Rep::Row;
    Value c = asTile(st, sel.getCond(), rowResult);
    Value t = asTile(st, sel.getOnTrue(), rowResult);
    Value f = asTile(st, sel.getOnFalse(), rowResult);
    b.create<nisa::SelectOp>(c, t, f, dst, engineOf(st, op));
  } else if (auto c = dyn_cast<CastOp>(op)) {
    b.create<nisa::CopyOp>(st.tileOf(c.getInput()), dst, engineOf(st, op));
  } else if (auto r = dyn_cast<ReduceOp>(op);
             r && engineOf(st, op) == nisa::Engine::scalar) {
    // identity(x) written to a scratch tile, its fp32 row sums kept; a
    // mean's power-of-two factor applied as it sums.
    Value src = st.tileOf(r.getInput());
    Value scratch =
        discardTile(st, cast<MemRefType>(src.getType()).getElementType());
    double scale = 1.0;
    if (auto [mul, factor] = plan.scaledSumOf.lookup(op); mul) {
      dst = dstFor(st, mul->getResult(0));
      st.tiles[mul->getResult(0)] = dst;
      st.absorbed.insert(mul);
      scale = factor;
    }
    bool f32 = cast<MemRefType>(dst.getType()).getElementType().isF32();
    Value acc =
        f32 ? dst : k.tile(MemorySpace::sbuf, {st.rows, 1}, b.getF32Type());
    b.create<nisa::ActivationOp>(src, scratch, Value(), Value(), acc,
                                 nisa::ActivationFn::identity, APFloat(scale),
                                 APFloat(0.0));
    if (!f32)
      b.create<nisa::CopyOp>(acc, dst, nisa::Engine::gpsimd);
  } else if (auto r = dyn_cast<ReduceOp>(op)) {
    b.create<nisa::TensorReduceOp>(aluFor(r.getFn()), st.tileOf(r.getInput()),
                                   dst, engineOf(st, op));
  }
}

/// One step's loads or its compute (emitted apart, so loads can run ahead).
void GroupEmitter::step(Phase phase, Value base, int64_t rows, int64_t stepCols,
                        int64_t slotIndex, Value dmaRows) {
  TileBuilder::TileScope scope(k);
  Step st = prepare(phase, base, rows, stepCols, slotIndex, dmaRows);
  if (phase == Phase::Load)
    return;
  computeOps(MutableArrayRef<Step>(st), -1);
  store(st);
}

/// A row input loaded once (GroupPlan::preloaded): step s's values in
/// column s, one row of the group's tensors over rowFold partitions when
/// its rows are folded (FusionPlan::rowFold). The last step's rows, if
/// fewer, apart (a transfer of whole steps would read past the values).
void GroupEmitter::preloadRow(Value v, Value buffer) {
  int64_t steps = plan.steps, fold = fusion.rowFold, perStep = p / fold;
  Value all = k.tile(MemorySpace::sbuf, {p, steps}, elt(v));
  int64_t full = fusion.numRows / p, rem = fusion.numRows % p;
  if (full)
    k.dma(k.view(buffer, k.index(0), {perStep, fold, full}, {1, 0, perStep}),
          k.view(all, k.index(0), {perStep, fold, full},
                 {fold * steps, steps, 1}));
  if (rem)
    k.dma(k.view(buffer, k.index(full * perStep), {rem / fold, fold, 1},
                 {1, 0, 1}),
          k.view(all, k.index(full), {rem / fold, fold, 1},
                 {fold * steps, steps, 1}));
  preloadedRows[v] = all;
}

/// A row input of a group whose rows are folded, loaded per step: the
/// value of each of the step's rows of the tensors, over rowFold partitions.
void GroupEmitter::loadFoldedRow(const Step &st, Value v, Value buffer) {
  int64_t fold = fusion.rowFold, numSlots = plan.numSlots;
  k.dma(k.view(buffer, k.divideExactly(st.base, fold),
               {st.rows / fold, fold, 1}, {1, 0, 1}),
        k.view(slots[v], k.index(st.slotIndex % numSlots),
               {st.rows / fold, fold, 1}, {fold * numSlots, numSlots, 1}));
}

/// A step's tiles of the loaded values, and in the load phase its loads.
GroupEmitter::Step GroupEmitter::prepare(Phase phase, Value base, int64_t rows,
                                         int64_t stepCols, int64_t slotIndex,
                                         Value dmaRows) {
  Step st{base, rows, stepCols, slotIndex, {}, dmaRows};
  for (auto [v, buffer] : loaded) {
    switch (plan.rep(v)) {
    case Rep::Full:
    case Rep::Row:
      if (Value all = preloadedRows.lookup(v)) {
        st.tiles[v] = k.view(all, k.divideExactly(st.base, p), {rows, 1},
                             {plan.steps, 1});
        break;
      }
      st.tiles[v] = slot(st, v);
      if (phase == Phase::Load && plan.rep(v) == Rep::Row &&
          fusion.rowFold > 1 && tensorType(v).getNumElements() > 1)
        loadFoldedRow(st, v, buffer);
      else if (phase == Phase::Load)
        k.dma(window(st, v, buffer), moved(st, st.tiles[v]));
      break;
    case Rep::Col:
      if (Value column = columns.lookup(v)) // not yet loaded: not read yet
        st.tiles[v] =
            k.view(column, k.index(0), {rows, stepCols}, {plan.cols, 1});
      break;
    case Rep::Splat:
      break;
    }
  }
  return st;
}

/// The instructions of steps in segment `stage` of their splits (every one
/// when `stage` < 0), of the ops `emits` accepts (all when null), op by op
/// and, for each, step by step: consecutive instructions on an engine's
/// queue then belong to different steps and do not wait for each other.
void GroupEmitter::computeOps(MutableArrayRef<Step> steps, int stage,
                              llvm::function_ref<bool(Operation *)> emits) {
  for (Operation *op : ops) {
    b.setLoc(op->getLoc());
    if (isa<ConstantOp>(op))
      continue;
    Value result = op->getResult(0);
    if (plan.summed.contains(op))
      continue; // its activation wrote it
    for (Step &st : steps) {
      if (isa<BroadcastOp, ReshapeOp>(op) || plan.folded.contains(op)) {
        st.tiles[result] = st.tileOf(op->getOperand(0));
        continue;
      }
      if ((stage >= 0 && plan.stageOf(op, st.slotIndex) != stage) ||
          st.absorbed.contains(op) || (emits && !emits(op)))
        continue;
      Value dst = dstFor(st, result);
      st.tiles[result] = dst;
      emitOp(st, op, dst);
    }
  }
}

/// The step's outputs (those `stores` accepts, all when null).
void GroupEmitter::store(Step &st, llvm::function_ref<bool(Value)> stores) {
  for (auto [v, buffer] : outputs) {
    if (stores && !stores(v))
      continue;
    b.setLoc(v.getLoc());
    k.dma(moved(st, st.tileOf(v)), window(st, v, buffer));
  }
}

/// Steps whose engines alternate over a period of R splits: R steps at a
/// time (a period), their instructions emitted segment by segment (each
/// engine's queue then takes a later step's first segment before an
/// earlier step's last, and no engine waits on another's backlog). Before
/// each period's compute: the loads of the next period, into the slots the
/// previous one read (2R slots), then the previous period's stores, so
/// that the DMA queues never hold the loads behind its last step.
void GroupEmitter::emitAlternating() {
  int64_t period = plan.engines.size(), numSlots = plan.numSlots;
  int64_t cols = plan.cols;
  int64_t full = fusion.numRows / p, rem = fusion.numRows % p;
  int64_t count = full + (rem ? 1 : 0);
  int64_t groups = (count + period - 1) / period;
  auto rowsOf = [&](int64_t s) { return s < full ? p : rem; };
  // A period's steps: (first row, rows, slot index).
  using StepAt = std::tuple<Value, int64_t, int64_t>;
  auto staticGroup = [&](int64_t g) {
    SmallVector<StepAt> steps;
    for (int64_t s = g * period; s < std::min(count, (g + 1) * period); ++s)
      steps.push_back({k.index(s * p), rowsOf(s), s % numSlots});
    return steps;
  };
  // Period g's steps when g = first + 2 * it + h (it a loop index).
  auto loopGroup = [&](Value it, int64_t first, int64_t h) {
    SmallVector<StepAt> steps;
    for (int64_t j = 0; j < period; ++j) {
      Value s = k.addOffset(k.scale(it, 2 * period), (first + h) * period + j);
      steps.push_back({k.scale(s, p), p, ((first + h) % 2) * period + j});
    }
    return steps;
  };
  auto load = [&](ArrayRef<StepAt> steps) {
    for (auto [base, rows, slotIndex] : steps) {
      TileBuilder::TileScope scope(k);
      prepare(Phase::Load, base, rows, cols, slotIndex);
    }
  };
  auto storeAll = [&](ArrayRef<StepAt> steps) {
    for (auto [base, rows, slotIndex] : steps) {
      Step st{base, rows, cols, slotIndex, {}, {}};
      for (auto [v, buffer] : outputs)
        st.tiles[v] = heldTile(st, v);
      store(st);
    }
  };
  auto compute = [&](ArrayRef<StepAt> steps, bool last = false) {
    TileBuilder::TileScope scope(k);
    SmallVector<Step> sts;
    for (auto [base, rows, slotIndex] : steps)
      sts.push_back(prepare(Phase::Compute, base, rows, cols, slotIndex));
    if (last)
      return computeLastPeriod(sts);
    for (int stage = 0; stage < 3; ++stage)
      computeOps(sts, stage);
  };
  load(staticGroup(0));
  loadColumns();
  load(staticGroup(1));
  if (groups == 1)
    return compute(staticGroup(0), /*last=*/true);
  compute(staticGroup(0));
  // Periods g >= 1 whose next period is whole, two per iteration (their
  // slots are then constants); the rest one by one.
  int64_t looped = std::max<int64_t>(0, full / period - 2) / 2 * 2;
  k.forEach(looped / 2, [&](Value it) {
    for (int64_t h = 0; h < 2; ++h) {
      load(loopGroup(it, 2, h));
      storeAll(loopGroup(it, 0, h));
      compute(loopGroup(it, 1, h));
    }
  });
  for (int64_t g = 1 + looped; g < groups; ++g) {
    if (g + 1 < groups)
      load(staticGroup(g + 1));
    storeAll(staticGroup(g - 1));
    compute(staticGroup(g), /*last=*/g + 1 == groups);
  }
}

/// The last period's compute and stores. Nothing follows its stores, so
/// they are its drain: its ops after the last row statistic (elementwise
/// on whole rows) and its stores go by column halves, the first half's
/// stores overlapping the second half's compute.
void GroupEmitter::computeLastPeriod(MutableArrayRef<Step> steps) {
  llvm::DenseSet<Operation *> tail;
  for (Operation *op : llvm::reverse(ops)) {
    if (plan.rep(op->getResult(0)) == Rep::Row)
      break;
    tail.insert(op);
  }
  // Column halves, when each half's store of every output outlasts a
  // transfer's fixed latency (else the latency is all a split adds).
  int64_t storeBytes = 0;
  for (auto [v, buffer] : outputs)
    if (plan.rep(v) != Rep::Row)
      storeBytes += p * plan.cols * bytes(elt(v));
  double halfStoreNs =
      storeBytes / 2.0 / (k.target.peakHbmBytesPerSecond() * 1e-9);
  if (tail.empty() || plan.cols % 2 != 0 ||
      halfStoreNs <= k.target.dmaFixedLatencyNs) {
    for (int stage = 0; stage < 3; ++stage)
      computeOps(steps, stage);
    for (Step &st : steps)
      store(st);
    return;
  }
  auto inTail = [&](Operation *op) { return tail.contains(op); };
  auto isRow = [&](Value v) { return plan.rep(v) == Rep::Row; };
  for (int stage = 0; stage < 3; ++stage)
    computeOps(steps, stage, [&](Operation *op) { return !inTail(op); });
  for (Step &st : steps)
    store(st, isRow);
  int64_t width = plan.cols / 2;
  for (int64_t half = 0; half < 2; ++half) {
    SmallVector<Step> parts;
    for (const Step &st : steps)
      parts.push_back(columnsOf(st, half * width, width));
    computeOps(parts, -1, inTail);
    for (Step &part : parts)
      store(part, [&](Value v) { return !isRow(v); });
  }
}

/// `st` narrowed to `cols` columns from `col0`: its tiles of whole rows
/// narrowed likewise.
GroupEmitter::Step GroupEmitter::columnsOf(const Step &st, int64_t col0,
                                           int64_t cols) {
  Step part = st;
  part.col0 = st.col0 + col0;
  part.cols = cols;
  part.operandTiles
      .clear(); // of the whole step's width: the part makes its own
  for (auto &[v, tile] : part.tiles) {
    auto type = tile ? dyn_cast<MemRefType>(tile.getType()) : MemRefType();
    if (type && type.getRank() == 2 && type.getDimSize(1) == st.cols)
      tile = k.withColumns(tile, col0, cols);
  }
  return part;
}

/// A group of `rows` rows known at run time (issue #16): the full steps
/// pipelined as emit() does, then the last rows mod P in a step whose DMAs
/// move only those rows, in a loop of zero or one iteration.
void GroupEmitter::emitDynamic(Value rows) {
  int64_t cols = plan.cols;
  Value full = b.create<arith::FloorDivSIOp>(rows, k.index(p));
  k.forEachPipelinedDynamic(
      full, plan.numSlots,
      [&](Value i, int64_t slot) {
        step(Phase::Load, k.scale(i, p), p, cols, slot);
      },
      [&](Value i, int64_t slot, Value) {
        step(Phase::Compute, k.scale(i, p), p, cols, slot);
      });
  Value rem = b.create<arith::RemSIOp>(rows, k.index(p));
  k.ifMore(rem, 0, [&] {
    // Its slot: one the last full steps' loads did not just fill.
    Value base = b.create<arith::SubIOp>(rows, rem);
    step(Phase::Load, base, p, cols, plan.numSlots - 1, rem);
    step(Phase::Compute, base, p, cols, plan.numSlots - 1, rem);
  });
}

/// Batch b's rows of `v` in HBM: p * batch consecutive rows, partition q
/// holding rows q * batch to q * batch + batch - 1 (one run of them), so a
/// batch moves in one DMA of runs of batch rows. Step j of the batch takes
/// the j-th row of every partition's run: rows need not be consecutive
/// within a step, only the same for its loads and stores.
Value GroupEmitter::batchWindow(Value v, Value buffer, Value batchIdx) {
  int64_t batch = plan.batch, width = plan.slotWidth(v);
  Value at = k.scale(batchIdx, p * batch * width);
  if (plan.rep(v) == Rep::Row && tensorType(v).hasStaticShape() &&
      tensorType(v).getNumElements() == 1)
    return k.view(buffer, k.index(0), {p, batch}, {0, 0});
  return k.view(buffer, at, {p, batch * width}, {batch * width, 1});
}

/// Rows too short for a step's DMAs to hide their fixed cost (Qwen3's q/k
/// norm over rows of 128: 32 KB a transfer) go in batches of steps: one
/// load and one store per value a batch, the steps' compute as emit()'s,
/// two batches' slots in turn (the next batch loads while this one
/// computes). The rows past the last whole batch go as emit()'s steps.
void GroupEmitter::emitBatched() {
  int64_t batch = plan.batch, numSlots = plan.numSlots, cols = plan.cols;
  int64_t batches = fusion.numRows / (p * batch);
  auto slotsOf = [&](Value v, int64_t half) {
    int64_t width = plan.slotWidth(v);
    return k.view(slots[v], k.index(half * batch * width), {p, batch * width},
                  {numSlots * width, 1});
  };
  k.forEachPipelined(
      batches, 2,
      [&](Value bIdx, int64_t half) {
        for (auto [v, buffer] : loaded)
          if (plan.rep(v) == Rep::Full || plan.rep(v) == Rep::Row)
            k.dma(batchWindow(v, buffer, bIdx), slotsOf(v, half));
      },
      [&](Value bIdx, int64_t half) {
        for (int64_t j = 0; j < batch; ++j) {
          TileBuilder::TileScope scope(k);
          Step st = prepare(Phase::Compute, Value(), p, cols, half * batch + j);
          computeOps(MutableArrayRef<Step>(st), -1);
        }
        for (auto [v, buffer] : outputs) {
          b.setLoc(v.getLoc());
          k.dma(slotsOf(v, half), batchWindow(v, buffer, bIdx));
        }
      });
  int64_t done = batches * p * batch;
  for (int64_t base = done, i = 0; base < fusion.numRows; base += p, ++i) {
    int64_t rows = std::min(p, fusion.numRows - base);
    step(Phase::Load, k.index(base), rows, cols, i % numSlots);
    step(Phase::Compute, k.index(base), rows, cols, i % numSlots);
  }
}

void GroupEmitter::emit(Value rows) {
  TileBuilder::TileScope groupScope(k);
  allocate();
  int64_t cols = plan.cols;
  // Full steps pipelined (loads run numSlots - 1 steps ahead), then the
  // smaller steps at the end.
  auto run = [&](int64_t full, int64_t stride, int64_t rows) {
    k.forEachPipelined(
        full, plan.numSlots,
        [&](Value i, int64_t slot) {
          step(Phase::Load, k.scale(i, stride), rows, cols, slot);
        },
        [&](Value i, int64_t slot) {
          step(Phase::Compute, k.scale(i, stride), rows, cols, slot);
        });
  };
  auto single = [&](int64_t base, int64_t rows, int64_t stepCols,
                    int64_t slot) {
    step(Phase::Load, k.index(base), rows, stepCols, slot);
    step(Phase::Compute, k.index(base), rows, stepCols, slot);
  };
  if (fusion.dynamicRows)
    return emitDynamic(rows);
  if (plan.engines.size() > 1)
    return emitAlternating();
  if (plan.batch > 1)
    return emitBatched();
  if (fusion.byRows) {
    int64_t full = fusion.numRows / p, rem = fusion.numRows % p;
    run(full, p, p);
    if (rem)
      single(full * p, rem, cols, full);
    return;
  }
  int64_t n = fusion.numCols, chunk = p * cols, full = n / chunk;
  run(full, chunk, p);
  int64_t rem = n % chunk, at = full * chunk, next = full;
  if (rem / cols)
    single(at, rem / cols, cols, next++);
  if (rem % cols)
    single(at + rem / cols * cols, 1, rem % cols, next);
}

} // namespace

/// The steps a DMA moves (GroupEmitter::emitBatched): where a step's row of
/// every loaded and stored tile is shorter than a DMA moves well per
/// partition, the fewest (a power of two, up to kMaxBatch) that reach it,
/// for a static group by rows whose steps all take one plan, that reads
/// no window in place or row loaded once, and whose outputs are tiles its
/// ops compute (stored from their slots); else 1.
static int64_t
batchOf(const GroupPlan &plan, ArrayRef<Operation *> ops,
        ArrayRef<std::pair<Value, Value>> outputs,
        const llvm::DenseMap<Value, TileBuilder::GroupWindow> &windows,
        const ::neuron::target::Target &target) {
  constexpr int64_t kMaxBatch = 8;
  const FusionPlan &f = plan.fusion;
  if (!f.byRows || f.dynamicRows || f.rowFold != 1 ||
      plan.engines.size() != 1 || !windows.empty() ||
      llvm::any_of(plan.loaded, [&](Value v) { return plan.preloaded(v); }))
    return 1;
  int64_t rowBytes = 0;
  auto widen = [&](Value v) {
    if (plan.rep(v) == Rep::Full)
      rowBytes = std::max<int64_t>(
          rowBytes,
          plan.cols * ((tensorType(v).getElementTypeBitWidth() + 7) / 8));
  };
  llvm::for_each(plan.loaded, widen);
  for (auto [v, buffer] : outputs) {
    Operation *def = v.getDefiningOp();
    if (plan.rep(v) != Rep::Full || !def || !llvm::is_contained(ops, def) ||
        isa<BroadcastOp, ReshapeOp>(def) || plan.folded.contains(def))
      return 1;
    widen(v);
  }
  int64_t batch = 1;
  while (batch < kMaxBatch &&
         batch * rowBytes < target.dmaPreferredBytesPerPartition)
    batch *= 2;
  if (batch == 1 || f.numRows < 2 * target.partitions * batch)
    return 1;
  GroupPlan trial = plan;
  trial.numSlots = 2 * batch;
  return trial.heldBytes() <= target.sbufBytesPerPartition ? batch : 1;
}

LogicalResult
KernelLowering::lowerGroup(Operation *anchor, ArrayRef<Operation *> ops,
                           ArrayRef<std::pair<Value, Value>> operands,
                           ArrayRef<std::pair<Value, Value>> results) {
  SmallVector<Value> inputValues, outputValues;
  for (auto [v, tensor] : operands)
    inputValues.push_back(v);
  for (auto [v, result] : results)
    outputValues.push_back(v);
  bool dynamic = !tensorType(anchor->getResult(0)).hasStaticShape();
  // Inputs that are windows of rows of a wider buffer (column slices, such
  // as `chunk`'s halves), of one row length, are read in place when the
  // group can go by those rows; the others, and these otherwise, are read
  // contiguous (a window copied first). Rows of fewer bytes than a DMA
  // moves well per partition (rotate_half's halves) are copied: by rows,
  // the group would store its tiles in rows as short.
  llvm::DenseMap<Value, GroupWindow> windows;
  int64_t rowLength = 0;
  for (auto [v, tensor] : operands) {
    std::optional<GroupWindow> w = tensor && !dynamic
                                       ? rowWindow(tensor, target.partitions)
                                       : std::nullopt;
    if (w && w->rowLength * tensorType(tensor).getElementTypeBitWidth() / 8 <
                 target.dmaPreferredBytesPerPartition)
      continue;
    if (w && (!rowLength || w->rowLength == rowLength)) {
      rowLength = w->rowLength;
      windows[v] = *w;
    }
  }
  std::string reason;
  FailureOr<GroupPlan> plan = GroupPlan::decide(
      ops, inputValues, outputValues, target, knobs, reason, rowLength);
  if (rowLength && (failed(plan) || !plan->fusion.byRows ||
                    plan->fusion.numCols != rowLength)) {
    windows.clear();
    plan = GroupPlan::decide(ops, inputValues, outputValues, target, knobs,
                             reason);
  }
  if (failed(plan) && dynamic)
    return emitError(anchor->getLoc())
           << "not size-generic: " << anchor->getName() << ": " << reason;
  if (failed(plan))
    return anchor->emitOpError("cannot be tiled as one group: ") << reason;
  // Windows that repeat a block (a broadcast over leading dims) are read in
  // place when each step is one repeat (p rows of the plan's columns the
  // block's size: its offset then does not depend on the step); a flat
  // plan's tiles narrow to the block where it is smaller, if its rows per
  // partition still make DMAs that move well (else it is copied).
  const int64_t p = target.partitions;
  SmallVector<std::pair<Value, GroupWindow>> repeats;
  for (auto [v, tensor] : operands)
    if (tensor && !dynamic && !windows.count(v))
      if (std::optional<GroupWindow> w = repeatWindow(tensor);
          w &&
          w->period / p * tensorType(tensor).getElementTypeBitWidth() / 8 >=
              target.dmaPreferredBytesPerPartition)
        repeats.push_back({v, *w});
  auto stepOf = [&](const GroupPlan &g) {
    return p * (g.fusion.byRows ? g.fusion.numCols : g.cols);
  };
  if (!repeats.empty() && !plan->fusion.byRows) {
    int64_t period = repeats.front().second.period;
    if (period % p == 0 && period < stepOf(*plan)) {
      FailureOr<GroupPlan> narrowed =
          GroupPlan::decide(ops, inputValues, outputValues, target, knobs,
                            reason, rowLength, period / p);
      if (succeeded(narrowed) && stepOf(*narrowed) == period)
        plan = std::move(narrowed);
    }
  }
  for (auto &[v, w] : repeats)
    if (w.period == stepOf(*plan))
      windows[v] = w;
  SmallVector<std::pair<Value, Value>> inputs;
  for (auto [v, tensor] : operands) {
    auto w = windows.find(v);
    if (w != windows.end() && plan->fusion.rep(v) == Rep::Full) {
      inputs.push_back({v, w->second.buffer});
      continue;
    }
    if (w != windows.end())
      windows.erase(w);
    inputs.push_back({v, tensor ? bufferOf(tensor) : Value()});
  }
  SmallVector<std::pair<Value, Value>> outputs;
  for (auto [v, result] : results)
    outputs.push_back({v, resultBuffer(result)});
  // A size-generic group's rows: the dynamic dims' product times what the
  // static ones add to a row of numCols.
  Value rows;
  if (plan->fusion.dynamicRows) {
    Value out = anchor->getResult(0);
    RankedTensorType type = tensorType(out);
    int64_t staticPart = 1;
    for (int64_t d = 0; d < type.getRank(); ++d) {
      if (!type.isDynamicDim(d)) {
        staticPart *= type.getDimSize(d);
        continue;
      }
      Value dim = dimOf(out, d);
      if (!dim)
        return emitError(anchor->getLoc())
               << "not size-generic: " << anchor->getName()
               << ": the size of dim " << d << " is not known";
      rows = rows ? b.create<arith::MulIOp>(rows, dim).getResult() : dim;
    }
    if (staticPart % plan->fusion.numCols != 0)
      return emitError(anchor->getLoc())
             << "not size-generic: " << anchor->getName()
             << ": a row spans dynamic dims";
    rows = scale(rows, staticPart / plan->fusion.numCols);
  }
  plan->batch = batchOf(*plan, ops, outputs, windows, target);
  if (plan->batch > 1)
    plan->numSlots = 2 * plan->batch;
  GroupEmitter(*this, *plan, ops, inputs, outputs, windows).emit(rows);
  return success();
}

LogicalResult KernelLowering::lowerFusion(FusionOp fusion) {
  Block &body = fusion.getBody().front();
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  SmallVector<std::pair<Value, Value>> inputs, outputs;
  for (auto [arg, operand] : llvm::zip(body.getArguments(), fusion.getInputs()))
    inputs.push_back({arg, operand});
  auto yield = cast<YieldOp>(body.getTerminator());
  for (auto [v, result] : llvm::zip(yield.getValues(), fusion.getResults())) {
    if (isa<BlockArgument>(v))
      return fusion.emitOpError("yields an input unchanged");
    outputs.push_back({v, result});
  }
  return lowerGroup(fusion, ops, inputs, outputs);
}

namespace {
/// A size-generic group's results need their dims for their buffers.
LogicalResult checkDims(Operation *op, KernelLowering &k) {
  for (Value result : op->getResults()) {
    RankedTensorType type = tensorType(result);
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (type.isDynamicDim(d) && !k.dimOf(result, d))
        return emitError(op->getLoc())
               << "not size-generic: " << op->getName() << ": the size of "
               << "dim " << d << " of its result is not known";
  }
  return success();
}

/// One elementwise op is a group of one.
struct ElementwisePattern
    : OpTilePattern<ElementwisePattern, UnaryOp, BinaryOp, SelectOp, CastOp> {
  bool isSizeGeneric(Operation *) const override { return true; }
  LogicalResult lowerOp(Operation *op, KernelLowering &k) const {
    if (failed(checkDims(op, k)))
      return failure();
    SmallVector<std::pair<Value, Value>> inputs;
    for (Value operand : op->getOperands())
      inputs.push_back({operand, splatValueOf(operand) ? Value() : operand});
    Value result = op->getResult(0);
    return k.lowerGroup(op, op, inputs, {{result, result}});
  }
};

struct FusionPattern : OpTilePattern<FusionPattern, FusionOp> {
  bool isSizeGeneric(Operation *) const override { return true; }
  LogicalResult lowerOp(FusionOp op, KernelLowering &k) const {
    if (failed(checkDims(op, k)))
      return failure();
    return k.lowerFusion(op);
  }
};
} // namespace

void mlir::neuron::populateElementwiseGroupPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<ElementwisePattern>());
  patterns.push_back(std::make_unique<FusionPattern>());
}
