//===- LowerToNisa.cpp - tile `neuron` ops into engine instructions -------===//
//
// Every tensor lives in an HBM buffer in row-major order, or is a strided
// window of another's (layout ops move no data until a consumer needs it
// contiguous). Each op, or fused group of ops, becomes loops over tiles:
// DMA loads into SBUF running ahead of the compute over rotating buffer
// slots, engine instructions, DMA stores. GEMMs keep A^T panels resident,
// stream B and accumulate in PSUM. Tiles are scoped to the op that
// allocates them; nisa-allocate gives them addresses afterwards.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::neuron {
#define GEN_PASS_DEF_NEURONLOWERTONISA
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

using namespace mlir;
using namespace mlir::neuron;

namespace mlir::neuron {

/// A transposed window ([..., R, C] reading rows contiguously, columns
/// strided) of 2- or 4-byte elements, made contiguous as a chip would: each
/// [128, C-chunk] tile loaded into SBUF by a transposing DMA, then stored
/// whole. One HBM-to-HBM DMA would move it one element per descriptor.
bool KernelLowering::transposeThroughSbuf(const Window &window,
                                          ArrayRef<int64_t> shape, Value out) {
  int64_t rank = shape.size();
  Type elt = cast<MemRefType>(window.buffer.getType()).getElementType();
  int64_t eltBytes = elt.getIntOrFloatBitWidth() / 8;
  if (rank < 2 || (eltBytes != 2 && eltBytes != 4) ||
      window.strides[rank - 2] != 1 || window.strides[rank - 1] == 1 ||
      shape[rank - 1] < 2 || shape[rank - 2] < 2)
    return false;
  int64_t rows = shape[rank - 2], cols = shape[rank - 1];
  int64_t colStride = window.strides[rank - 1];
  int64_t chunk = std::max<int64_t>(1, tileBytes / eltBytes);
  // Leading dims: one matrix after another (their strides may be anything).
  int64_t matrices = 1;
  for (int64_t d = 0; d < rank - 2; ++d)
    matrices *= shape[d];
  if (matrices > 64) // each is its own loop nest: keep programs small
    return false;
  for (int64_t m = 0; m < matrices; ++m) {
    int64_t from = window.offset, rest = m;
    for (int64_t d = rank - 3; d >= 0; --d) {
      from += (rest % shape[d]) * window.strides[d];
      rest /= shape[d];
    }
    int64_t to = m * rows * cols;
    forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
      forTiles(cols, chunk, [&](Value c0, int64_t ct) {
        TileScope scope(*this);
        Value t = tile(MemorySpace::sbuf, {rt, ct}, elt);
        Value src = addOffsets(addOffset(r0, from), scale(c0, colStride));
        dma(view(window.buffer, src, {rt, ct}, {1, colStride}), t);
        Value dst = addOffsets(addOffset(scale(r0, cols), to), c0);
        dma(t, view(out, dst, {rt, ct}, {cols, 1}));
      });
    });
  }
  return true;
}

Value KernelLowering::bufferOf(Value tensor) {
  if (Value buffer = buffers.lookup(tensor))
    return buffer;
  if (auto it = lazyViews.find(tensor); it != lazyViews.end()) {
    // A consumer needs it contiguous: one strided DMA, HBM to HBM.
    LazyView lazy = it->second;
    Location consumer = loc;
    loc = lazy.loc;
    auto shape = tensorType(tensor).getShape();
    Value out = resultBuffer(tensor);
    if (tensorType(tensor).getNumElements() == 0)
      ; // nothing to move
    else if (shape.empty())
      dma(view(lazy.window.buffer, index(lazy.window.offset), {1}, {1}),
          view(out, index(0), {1}, {1}));
    else if (!transposeThroughSbuf(lazy.window, shape, out))
      dma(view(lazy.window.buffer, index(lazy.window.offset), shape,
               lazy.window.strides),
          view(out, index(0), shape, contiguousStrides(shape)));
    loc = consumer;
    return out;
  }
  // Constants are materialized on first use: splats feeding tensor_scalar
  // instructions never need a buffer.
  auto constant = tensor.getDefiningOp<ConstantOp>();
  assert(constant && "operand lowered before its producer");
  auto type = hbmType(tensorType(tensor));
  std::string name = "__constant_" + std::to_string(constantCount++);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(module.getBody());
  auto global = b.create<memref::GlobalOp>(
      constant.getLoc(), name, b.getStringAttr("private"), type,
      cast<ElementsAttr>(constant.getValue()), /*constant=*/true,
      /*alignment=*/nullptr);
  b.setInsertionPointToStart(entry);
  Value buffer =
      b.create<memref::GetGlobalOp>(constant.getLoc(), type, global.getName());
  buffers[tensor] = buffer;
  return buffer;
}

KernelLowering::Window KernelLowering::windowOf(Value tensor) {
  if (auto it = lazyViews.find(tensor); it != lazyViews.end())
    return it->second.window;
  auto shape = tensorType(tensor).getShape();
  return {bufferOf(tensor), 0, contiguousStrides(shape)};
}

namespace {
/// Strides that show a strided window of `shape` as `newShape` without
/// moving data (numpy's no-copy reshape), or std::nullopt.
std::optional<SmallVector<int64_t>>
reshapedStrides(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides,
                ArrayRef<int64_t> newShape) {
  SmallVector<int64_t> oldDims, oldStrides;
  for (auto [d, st] : llvm::zip(shape, strides))
    if (d != 1) {
      oldDims.push_back(d);
      oldStrides.push_back(st);
    }
  SmallVector<int64_t> newDims, where;
  for (auto [i, d] : llvm::enumerate(newShape))
    if (d != 1) {
      newDims.push_back(d);
      where.push_back(i);
    }
  SmallVector<int64_t> out(newShape.size(), 0);
  size_t oi = 0, ni = 0;
  while (oi < oldDims.size() && ni < newDims.size()) {
    size_t oj = oi + 1, nj = ni + 1;
    int64_t op = oldDims[oi], np = newDims[ni];
    while (op != np) {
      if (np < op) {
        if (nj >= newDims.size())
          return std::nullopt;
        np *= newDims[nj++];
      } else {
        if (oj >= oldDims.size())
          return std::nullopt;
        op *= oldDims[oj++];
      }
    }
    for (size_t k = oi; k + 1 < oj; ++k)
      if (oldStrides[k] != oldDims[k + 1] * oldStrides[k + 1])
        return std::nullopt;
    int64_t st = oldStrides[oj - 1];
    for (size_t k = nj; k-- > ni;) {
      out[where[k]] = st;
      st *= newDims[k];
    }
    oi = oj;
    ni = nj;
  }
  if (oi != oldDims.size() || ni != newDims.size())
    return std::nullopt;
  return out;
}
} // namespace

/// Transpose, broadcast, slice and reshape move no data here: the result
/// is a window of the input's buffer, copied only if a consumer needs it
/// contiguous (matmul operands and these ops themselves never do).
void KernelLowering::lowerLayout(Operation *op) {
  Value input = op->getOperand(0), result = op->getResult(0);
  Window in = windowOf(input);
  auto inShape = tensorType(input).getShape();
  auto outType = tensorType(result);
  Window out{in.buffer, in.offset, {}};
  if (auto t = dyn_cast<TransposeOp>(op)) {
    for (int64_t p : t.getPermutation())
      out.strides.push_back(in.strides[p]);
  } else if (isa<BroadcastOp>(op)) {
    int64_t shift = outType.getRank() - (int64_t)inShape.size();
    out.strides.assign(outType.getRank(), 0);
    for (auto [i, d] : llvm::enumerate(inShape))
      if (d != 1)
        out.strides[i + shift] = in.strides[i];
  } else if (auto sl = dyn_cast<SliceOp>(op)) {
    for (auto [i, st] : llvm::enumerate(in.strides)) {
      out.offset += st * sl.getOffsets()[i];
      out.strides.push_back(st * sl.getStrides()[i]);
    }
  } else {
    auto strides = reshapedStrides(inShape, in.strides, outType.getShape());
    if (!strides) {
      // Not expressible as a window: the input becomes contiguous first.
      buffers[result] = bufferOf(input);
      return;
    }
    if (!lazyViews.count(input) &&
        *strides == contiguousStrides(outType.getShape())) {
      buffers[result] = in.buffer; // same row-major order: an alias
      return;
    }
    out.strides = *strides;
  }
  lazyViews.try_emplace(result, LazyView{out, op->getLoc()});
}

namespace {
/// One step's tiles of a fused group.
struct GroupStep {
  const FusionPlan &plan;
  llvm::DenseMap<Value, Value> tiles; // value -> its tile in this step

  Value tileOf(Value v) const { return tiles.lookup(v); }
  bool fullish(Value v) const { return heldAsTile(plan.rep(v)); }
};
} // namespace

/// Engines for a group's instructions. Each engine's queue runs in order,
/// so a step's chain of instructions flows through the engines without
/// going back to one (engine A for a first run of instructions, B for the
/// next, ...): then every engine works on a later step while the next
/// engine finishes this one. Among such splits (each instruction on an
/// engine that may issue it: InstructionSet.def), the one whose busiest
/// engine has the least work, by the target's clocks; if none fits, ALU ops
/// stay on VectorE. Row sums in `scalarSums` may also go to ScalarE, as an
/// identity activation that accumulates.
llvm::DenseMap<Operation *, nisa::Engine> KernelLowering::assignEngines(
    ArrayRef<Operation *> ops, const llvm::DenseSet<Operation *> &folded,
    const llvm::DenseSet<Operation *> &activations,
    const llvm::DenseSet<Operation *> &scalarSums,
    llvm::function_ref<::neuron::runtime::Opcode(Operation *)> instructionOf,
    const FusionPlan &plan, int64_t cols) const {
  using nisa::Engine;
  SmallVector<Operation *> work;
  for (Operation *op : ops)
    if (!isa<ConstantOp, BroadcastOp, ReshapeOp>(op) && !folded.contains(op))
      work.push_back(op);
  auto allowed = [&](Operation *op, Engine e) {
    if (e == Engine::scalar && scalarSums.contains(op))
      return nisa::canIssue(::neuron::runtime::Opcode::Activation, e);
    return nisa::canIssue(instructionOf(op), e);
  };
  // Each instruction's time on an engine, by the cost model the timing
  // model charges (runtime/target/Cost.h): the group's tiles are contiguous
  // SBUF tiles, read element by element unless a per-partition register.
  const ::neuron::target::CostModel costModel(target);
  auto is16 = [](Value v) {
    return cast<RankedTensorType>(v.getType()).getElementTypeBitWidth() == 16;
  };
  auto cost = [&](Operation *op, Engine e) {
    using ::neuron::runtime::Opcode;
    Value out = op->getResult(0);
    Value measured = isa<ReduceOp>(op) ? op->getOperand(0) : out;
    Opcode opcode = e == Engine::scalar && scalarSums.contains(op)
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
    return costModel.computeNs(opcode, nisa::toProgram(e), shape);
  };
  llvm::DenseMap<Operation *, Engine> best;
  for (Operation *op : work)
    best[op] = isa<UnaryOp>(op) || activations.contains(op) ? Engine::scalar
                                                            : Engine::vector;
  double bestLoad = std::numeric_limits<double>::infinity();
  const Engine all[3] = {Engine::vector, Engine::gpsimd, Engine::scalar};
  size_t n = work.size();
  if (n > 24)
    return best;
  // Orders of up to three engines and two cut points.
  for (int a = 0; a < 3; ++a)
    for (int b2 = 0; b2 < 3; ++b2)
      for (int c = 0; c < 3; ++c) {
        if (a == b2 || a == c || b2 == c)
          continue;
        Engine order[3] = {all[a], all[b2], all[c]};
        for (size_t cut1 = 0; cut1 <= n; ++cut1)
          for (size_t cut2 = cut1; cut2 <= n; ++cut2) {
            double load[3] = {0, 0, 0};
            bool ok = true;
            for (size_t i = 0; i < n && ok; ++i) {
              int seg = i < cut1 ? 0 : i < cut2 ? 1 : 2;
              ok = allowed(work[i], order[seg]);
              load[seg] += cost(work[i], order[seg]);
            }
            double worst = std::max({load[0], load[1], load[2]});
            if (!ok || worst >= bestLoad)
              continue;
            bestLoad = worst;
            for (size_t i = 0; i < n; ++i)
              best[work[i]] = order[i < cut1 ? 0 : i < cut2 ? 1 : 2];
          }
      }
  return best;
}

void KernelLowering::lowerGroup(Operation *anchor, ArrayRef<Operation *> ops,
                                ArrayRef<std::pair<Value, Value>> inputs,
                                ArrayRef<std::pair<Value, Value>> outputs) {
  SmallVector<Value> outputValues;
  for (auto [v, buffer] : outputs)
    outputValues.push_back(v);
  std::string reason;
  std::optional<FusionPlan> maybePlan =
      FusionPlan::analyze(ops, outputValues, reason);
  if (!maybePlan) {
    anchor->emitOpError("cannot be tiled as one group: ") << reason;
    hadError = true;
    return;
  }
  const FusionPlan &plan = *maybePlan;
  llvm::DenseSet<Value> isOutput(outputValues.begin(), outputValues.end());

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
  //    by the second: one scalar_tensor_tensor.
  llvm::DenseSet<Operation *> folded;
  llvm::DenseMap<Operation *, ReduceOp> rowSumOf; // activation -> its sum
  llvm::DenseSet<Operation *> summed;             // sums activations make
  llvm::DenseSet<Operation *> activations;        // x * x: activation square
  llvm::DenseMap<Operation *, BinaryOp> scaledBy; // outer binary -> inner
  llvm::DenseMap<Value, Value> narrowedBy; // producer result -> cast result
  llvm::DenseMap<Operation *, Operation *> biasOf; // unary -> its add/sub
  llvm::DenseSet<Operation *> members(ops.begin(), ops.end());
  auto onlyUse = [&](Value v) -> Operation * {
    if (!v.hasOneUse() || isOutput.contains(v))
      return nullptr;
    return *v.getUsers().begin();
  };
  for (Operation *op : ops) {
    if (auto c = dyn_cast<CastOp>(op)) {
      Type from = tensorType(c.getInput()).getElementType();
      Type to = c.getType().getElementType();
      Operation *producer = c.getInput().getDefiningOp();
      if ((from.isBF16() || from.isF16()) && to.isF32()) {
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
          (bin.getFn() == BinaryFn::sub || bin.getFn() == BinaryFn::add) &&
          bin.getType().getElementType().isF32() &&
          plan.rep(bin.getLhs()) == Rep::Full &&
          plan.rep(bin.getRhs()) == Rep::Row) {
        biasOf[op] = bin;
        folded.insert(bin);
      }
    }
  }
  auto isSquare = [&](Operation *op) {
    auto bin = dyn_cast<BinaryOp>(op);
    return bin && bin.getFn() == BinaryFn::mul &&
           bin.getLhs() == bin.getRhs() && plan.rep(bin.getLhs()) == Rep::Full;
  };
  for (Operation *op : ops) {
    auto r = dyn_cast<ReduceOp>(op);
    if (!r || r.getFn() != ReduceFn::sum || plan.rep(r.getResult()) != Rep::Row)
      continue;
    Operation *producer = r.getInput().getDefiningOp();
    if (!producer || !members.contains(producer) || folded.contains(producer) ||
        rowSumOf.count(producer) ||
        !(isa<UnaryOp>(producer) || isSquare(producer)) ||
        plan.rep(r.getInput()) != Rep::Full)
      continue;
    rowSumOf[producer] = r;
    summed.insert(op);
    if (isSquare(producer))
      activations.insert(producer);
  }
  // (x - m)^2 with m a row (a variance): the square activation takes -m as
  // its bias, so x - m is never written.
  for (Operation *op : activations) {
    auto bin = op->getOperand(0).getDefiningOp<BinaryOp>();
    Value v = op->getOperand(0);
    if (bin && members.contains(bin) && !folded.contains(bin) &&
        !isOutput.contains(v) &&
        llvm::all_of(v.getUsers(), [&](Operation *u) { return u == op; }) &&
        (bin.getFn() == BinaryFn::sub || bin.getFn() == BinaryFn::add) &&
        bin.getType().getElementType().isF32() &&
        plan.rep(bin.getLhs()) == Rep::Full &&
        plan.rep(bin.getRhs()) == Rep::Row) {
      biasOf[op] = bin;
      folded.insert(bin);
    }
  }
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

  TileScope groupScope(*this);
  int64_t p = target.partitions;
  int64_t widest = 1;
  for (Operation *op : ops)
    for (Value v : op->getResults())
      widest =
          std::max<int64_t>(widest, tensorType(v).getElementTypeBitWidth() / 8);
  auto elt = [&](Value v) { return tensorType(v).getElementType(); };
  auto bytes = [](Type t) -> int64_t {
    return (t.getIntOrFloatBitWidth() + 7) / 8;
  };
  // The intermediates that get a tile, stored in their own type (or the
  // type of the cast that narrows them).
  SmallVector<std::pair<Value, Type>> intermediates;
  for (Operation *op : ops) {
    Value v = op->getResult(0);
    if (isa<ConstantOp, BroadcastOp, ReshapeOp>(op) || folded.contains(op) ||
        isOutput.contains(v) ||
        (narrowedBy.count(v) && isOutput.contains(narrowedBy.lookup(v))))
      continue;
    Type storage = narrowedBy.count(v) ? elt(narrowedBy.lookup(v)) : elt(v);
    // An activation kept only for the row sums it accumulates (a variance's
    // squares): nothing reads its elements, so they take 16 bits.
    if (rowSumOf.count(op) && isa<FloatType>(storage) &&
        llvm::all_of(v.getUsers(), [&](Operation *u) {
          return u == rowSumOf.lookup(op).getOperation();
        }))
      storage = b.getBF16Type();
    intermediates.push_back({v, storage});
  }
  // Constants in the group that the plan holds as tensors load like inputs.
  SmallVector<std::pair<Value, Value>> groupInputs(inputs);
  for (Operation *op : ops)
    if (isa<ConstantOp>(op) && plan.reps.count(op->getResult(0)))
      groupInputs.push_back({op->getResult(0), Value()});

  // Tile geometry: a row of C per partition, or flat [P, F] tiles (F
  // smaller when that keeps every partition busy). Tiles DMAs read or write
  // rotate over up to stream-slots slots, so loads run ahead of the compute
  // and stores trail it (within stream-sbuf-percent of SBUF); the tiles in
  // between alternate between two (within inner-sbuf-percent), so one
  // step's instructions never wait for the previous step's to free a tile.
  int64_t cols = 0, steps = 0, numSlots = 0, innerSlots = 0;
  auto slotWidth = [&](Value v) -> int64_t {
    return plan.rep(v) == Rep::Row ? 1 : cols;
  };
  auto layOut = [&](int64_t width) {
    cols = width;
    if (plan.byRows) {
      steps = (plan.numRows + p - 1) / p;
    } else {
      int64_t rem = plan.numCols % (p * cols);
      steps = plan.numCols / (p * cols) + (rem / cols > 0) + (rem % cols > 0);
    }
    // Per slot, about a tile of every input and output (bits rounded up
    // per column: an over-estimate kept so that programs stay as they were).
    int64_t streamBytes = 0;
    for (auto [v, buffer] : inputs)
      if (plan.rep(v) == Rep::Full ||
          plan.rep(v) == Rep::Row) // not loaded once
        streamBytes += cols * (tensorType(v).getElementTypeBitWidth() + 7) / 8;
    for (auto [v, buffer] : outputs)
      streamBytes += cols * (tensorType(v).getElementTypeBitWidth() + 7) / 8;
    numSlots = std::min<int64_t>(steps, knobs.streamSlots);
    while (numSlots > 1 &&
           numSlots * streamBytes >
               target.sbufBytesPerPartition * knobs.streamSbufPercent / 100)
      --numSlots;
    int64_t innerBytes = 0;
    for (auto [v, storage] : intermediates)
      innerBytes += slotWidth(v) * bytes(storage);
    innerSlots = std::min<int64_t>(steps, 2);
    if (innerBytes * innerSlots >
        target.sbufBytesPerPartition * knobs.innerSbufPercent / 100)
      innerSlots = 1;
  };
  // What the group's tiles take per partition (they are all live at once).
  auto held = [&] {
    int64_t total = 0;
    llvm::DenseSet<Value> streamed;
    for (auto [v, given] : groupInputs) {
      Rep rep = plan.rep(v);
      if (rep == Rep::Full || rep == Rep::Row)
        total += numSlots * slotWidth(v) * bytes(elt(v));
      else if (rep == Rep::Col)
        total += cols * bytes(elt(v));
      streamed.insert(v);
    }
    for (auto [v, buffer] : outputs)
      if (streamed.insert(v).second)
        total += numSlots * slotWidth(v) * bytes(elt(v));
    for (auto [v, storage] : intermediates)
      total += innerSlots * slotWidth(v) * bytes(storage);
    return total;
  };
  int64_t width = plan.numCols;
  if (!plan.byRows) {
    int64_t freeMax = std::max<int64_t>(1, tileBytes / widest);
    width = width >= p * freeMax ? freeMax : std::max<int64_t>(1, width / p);
  }
  layOut(width);
  // A group with many values gives up pipelining slots, then (flat) tile
  // width, until its tiles fit; a row-tiled group too wide even then is
  // refused by nisa-allocate (neuron-fuse-elementwise's group-bytes keeps
  // such groups from forming).
  while (held() > target.sbufBytesPerPartition) {
    if (numSlots > 1)
      --numSlots;
    else if (innerSlots > 1)
      innerSlots = 1;
    else if (!plan.byRows && cols > 1)
      layOut(cols / 2);
    else
      break;
  }
  llvm::DenseMap<Value, Value> slots, columns;
  SmallVector<std::pair<Value, Value>> loaded;
  for (auto [v, given] : groupInputs) {
    Rep rep = plan.rep(v);
    // A splat the plan holds as a tensor needs its constant buffer.
    Value buffer = given || rep == Rep::Splat ? given : bufferOf(v);
    loaded.push_back({v, buffer});
    if (rep == Rep::Full || rep == Rep::Row)
      slots[v] = tile(MemorySpace::sbuf, {p, numSlots * slotWidth(v)}, elt(v));
    if (rep == Rep::Col) {
      // One row broadcast to every partition, loaded once. A long row goes
      // to one partition and is copied on chip to the others, so HBM gives
      // its bytes once, not once per partition; a short one is read from
      // HBM by every partition (a second transfer's latency would cost more
      // than the bytes).
      Value t = tile(MemorySpace::sbuf, {p, cols}, elt(v));
      double repeatedNs = double((p - 1) * cols * bytes(elt(v))) /
                          (target.peakHbmBytesPerSecond() * 1e-9);
      if (repeatedNs > target.dmaFixedLatencyNs) {
        Value row = tile(MemorySpace::sbuf, {1, cols}, elt(v));
        dma(view(buffer, index(0), {1, cols}, {0, 1}), row);
        dma(view(row, index(0), {p, cols}, {0, 1}), t);
      } else {
        dma(view(buffer, index(0), {p, cols}, {0, 1}), t);
      }
      columns[v] = t;
    }
  }
  for (auto [v, buffer] : outputs)
    if (!slots.count(v))
      slots[v] = tile(MemorySpace::sbuf, {p, numSlots * slotWidth(v)}, elt(v));

  llvm::DenseSet<Operation *> unassigned(folded.begin(), folded.end());
  unassigned.insert(summed.begin(), summed.end());
  // The instruction each op becomes in the loop below.
  auto instructionOf = [&](Operation *op) {
    using ::neuron::runtime::Opcode;
    if (isa<UnaryOp>(op) || activations.contains(op))
      return Opcode::Activation;
    if (scaledBy.count(op))
      return Opcode::ScalarTensorTensor;
    if (auto bin = dyn_cast<BinaryOp>(op)) {
      // A splat or a row broadcast against a full tile is a scalar.
      Rep l = plan.rep(bin.getLhs()), r = plan.rep(bin.getRhs());
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
  };
  // Row sums of a full tile no activation computes: VectorE's tensor_reduce
  // or ScalarE's identity activation accumulating (ScalarE's clock is
  // faster, and in a norm VectorE has the affine part to do).
  // The activation writes the elements to a scratch tile: only where SBUF
  // has room for one.
  llvm::DenseSet<Operation *> scalarSums;
  int64_t spare = target.sbufBytesPerPartition - held();
  for (Operation *op : ops) {
    auto r = dyn_cast<ReduceOp>(op);
    if (r && r.getFn() == ReduceFn::sum && !summed.contains(op) &&
        plan.rep(r.getInput()) == Rep::Full &&
        plan.rep(r.getResult()) == Rep::Row &&
        (spare -= cols * bytes(elt(r.getInput()))) >= 0)
      scalarSums.insert(op);
  }
  llvm::DenseMap<Operation *, nisa::Engine> engineFor = assignEngines(
      ops, unassigned, activations, scalarSums, instructionOf, plan, cols);
  llvm::DenseMap<Value, Value> inner; // intermediate -> its two-slot tile
  for (auto [v, storage] : intermediates)
    inner[v] = tile(MemorySpace::sbuf, {p, innerSlots * slotWidth(v)}, storage);

  // One step: `base` is the first row (by rows) or element (flat). Its
  // loads and its compute are emitted apart, so loads can run ahead.
  enum class Phase { Load, Compute };
  auto step = [&](Phase phase, Value base, int64_t rows, int64_t stepCols,
                  int64_t slotIndex) {
    TileScope scope(*this);
    GroupStep st{plan, llvm::DenseMap<Value, Value>()};
    auto slot = [&](Value v) {
      int64_t width = slotWidth(v);
      return view(slots[v], index(slotIndex % numSlots * width),
                  {rows, width == 1 ? 1 : stepCols}, {numSlots * width, 1});
    };
    // The HBM window of a value in this step.
    auto window = [&](Value v, Value buffer) {
      if (plan.rep(v) == Rep::Row) {
        if (tensorType(v).getNumElements() == 1)
          return view(buffer, index(0), {rows, 1}, {0, 1});
        return view(buffer, base, {rows, 1}, {1, 1});
      }
      int64_t stride = plan.byRows ? plan.numCols : stepCols;
      return view(buffer, plan.byRows ? scale(base, plan.numCols) : base,
                  {rows, stepCols}, {stride, 1});
    };
    for (auto [v, buffer] : loaded) {
      switch (plan.rep(v)) {
      case Rep::Full:
      case Rep::Row:
        st.tiles[v] = slot(v);
        if (phase == Phase::Load)
          dma(window(v, buffer), st.tiles[v]);
        break;
      case Rep::Col:
        st.tiles[v] = view(columns[v], index(0), {rows, stepCols}, {cols, 1});
        break;
      case Rep::Splat:
        break;
      }
    }
    if (phase == Phase::Load)
      return;
    auto dstFor = [&](Value v) {
      if (isOutput.contains(v))
        return slot(v);
      if (Value narrowed = narrowedBy.lookup(v);
          narrowed && isOutput.contains(narrowed))
        return slot(narrowed);
      int64_t width = slotWidth(v);
      return view(inner[v], index(slotIndex % innerSlots * width),
                  {rows, width == 1 ? 1 : stepCols}, {innerSlots * width, 1});
    };
    // A row or splat operand as a tile of the result's shape (select takes
    // equal shapes).
    auto asTile = [&](Value v, bool rowResult) -> Value {
      Rep rep = plan.rep(v);
      if (heldAsTile(rep) || (rowResult && rep == Rep::Row))
        return st.tileOf(v);
      Value t =
          tile(MemorySpace::sbuf, {rows, rowResult ? 1 : stepCols}, elt(v));
      double fill = rep == Rep::Splat ? plan.splats.lookup(v) : 0.0;
      b.create<nisa::MemsetOp>(loc, t, APFloat(fill));
      if (rep == Rep::Row)
        b.create<nisa::TensorScalarOp>(loc, nisa::AluOp::add, t, t,
                                       st.tileOf(v), APFloat(0.0), false);
      return t;
    };
    for (Operation *op : ops) {
      loc = op->getLoc();
      if (isa<ConstantOp>(op))
        continue;
      Value result = op->getResult(0);
      if (summed.contains(op))
        continue; // its activation wrote it
      if (isa<BroadcastOp, ReshapeOp>(op) || folded.contains(op)) {
        st.tiles[result] = st.tileOf(op->getOperand(0));
        continue;
      }
      Value dst = dstFor(result);
      st.tiles[result] = dst;
      // The row sums an activation accumulates, fp32 on ScalarE.
      auto rowSums = [&]() -> std::pair<Value, Value> {
        ReduceOp sum = rowSumOf.lookup(op);
        if (!sum)
          return {};
        Value sums = dstFor(sum.getResult());
        st.tiles[sum.getResult()] = sums;
        if (cast<MemRefType>(sums.getType()).getElementType().isF32())
          return {sums, Value()};
        return {tile(MemorySpace::sbuf, {rows, 1}, b.getF32Type()), sums};
      };
      // f(x - m) with m a row: the activation reads x and takes the row
      // (negated) as its per-partition bias.
      auto biasedSource = [&](Value src) -> std::pair<Value, Value> {
        auto shift = biasOf.lookup(op);
        if (!shift)
          return {st.tileOf(src), Value()};
        auto bin = cast<BinaryOp>(shift);
        Value bias = st.tileOf(bin.getRhs());
        if (bin.getFn() == BinaryFn::sub) {
          Value negated = tile(MemorySpace::sbuf, {rows, 1}, b.getF32Type());
          b.create<nisa::TensorScalarOp>(loc, nisa::AluOp::multiply, bias,
                                         negated, Value(), APFloat(-1.0), false,
                                         engineFor.lookup(op));
          bias = negated;
        }
        return {st.tileOf(bin.getLhs()), bias};
      };
      if (activations.contains(op)) {
        auto [src, bias] = biasedSource(op->getOperand(0));
        auto [acc, narrow] = rowSums();
        b.create<nisa::ActivationOp>(loc, src, dst, bias, Value(), acc,
                                     nisa::ActivationFn::square, APFloat(1.0),
                                     APFloat(0.0));
        if (narrow)
          b.create<nisa::CopyOp>(loc, acc, narrow, nisa::Engine::gpsimd);
        continue;
      }
      if (BinaryOp inner = scaledBy.lookup(op)) {
        // (x op0 m) op1 w.
        auto bin = cast<BinaryOp>(op);
        auto readsInner = [&](Value v) {
          auto c = v.getDefiningOp<CastOp>();
          return v == inner.getResult() ||
                 (c && c.getInput() == inner.getResult());
        };
        bool innerOnLeft = readsInner(bin.getLhs());
        Value w = innerOnLeft ? bin.getRhs() : bin.getLhs();
        b.create<nisa::ScalarTensorTensorOp>(
            loc, aluFor(inner.getFn()), aluFor(bin.getFn()),
            st.tileOf(inner.getLhs()), st.tileOf(w), dst,
            st.tileOf(inner.getRhs()), APFloat(0.0), engineFor.lookup(op));
        continue;
      }
      if (auto u = dyn_cast<UnaryOp>(op)) {
        // exp(x - m) with m a row: the row rides along as the bias.
        auto [src, bias] = biasedSource(u.getInput());
        auto [acc, narrow] = rowSums();
        b.create<nisa::ActivationOp>(loc, src, dst, bias, Value(), acc,
                                     activationFor(u.getFn()), APFloat(1.0),
                                     APFloat(0.0));
        if (narrow)
          b.create<nisa::CopyOp>(loc, acc, narrow, nisa::Engine::gpsimd);
      } else if (auto bin = dyn_cast<BinaryOp>(op)) {
        nisa::AluOp alu = aluFor(bin.getFn());
        Value l = bin.getLhs(), r = bin.getRhs();
        Rep rl = plan.rep(l), rr = plan.rep(r);
        if (rl == Rep::Splat || rr == Rep::Splat) {
          bool reverse = rl == Rep::Splat;
          double imm = plan.splats.lookup(reverse ? l : r);
          b.create<nisa::TensorScalarOp>(loc, alu, st.tileOf(reverse ? r : l),
                                         dst, Value(), APFloat(imm), reverse,
                                         engineFor.lookup(op));
        } else if (st.fullish(l) != st.fullish(r)) {
          // A row broadcast against a full tile: a per-partition scalar.
          bool reverse = !st.fullish(l);
          b.create<nisa::TensorScalarOp>(loc, alu, st.tileOf(reverse ? r : l),
                                         dst, st.tileOf(reverse ? l : r),
                                         APFloat(0.0), reverse,
                                         engineFor.lookup(op));
        } else {
          b.create<nisa::TensorTensorOp>(loc, alu, st.tileOf(l), st.tileOf(r),
                                         dst, engineFor.lookup(op));
        }
      } else if (auto sel = dyn_cast<SelectOp>(op)) {
        bool rowResult = plan.rep(result) == Rep::Row;
        Value c = asTile(sel.getCond(), rowResult);
        Value t = asTile(sel.getOnTrue(), rowResult);
        Value f = asTile(sel.getOnFalse(), rowResult);
        b.create<nisa::SelectOp>(loc, c, t, f, dst, engineFor.lookup(op));
      } else if (auto c = dyn_cast<CastOp>(op)) {
        b.create<nisa::CopyOp>(loc, st.tileOf(c.getInput()), dst,
                               engineFor.lookup(op));
      } else if (auto r = dyn_cast<ReduceOp>(op);
                 r && engineFor.lookup(op) == nisa::Engine::scalar) {
        // identity(x) written to a scratch tile, its fp32 row sums kept.
        Value src = st.tileOf(r.getInput());
        Value scratch = tile(MemorySpace::sbuf, {rows, stepCols},
                             cast<MemRefType>(src.getType()).getElementType());
        bool f32 = cast<MemRefType>(dst.getType()).getElementType().isF32();
        Value acc =
            f32 ? dst : tile(MemorySpace::sbuf, {rows, 1}, b.getF32Type());
        b.create<nisa::ActivationOp>(loc, src, scratch, Value(), Value(), acc,
                                     nisa::ActivationFn::identity, APFloat(1.0),
                                     APFloat(0.0));
        if (!f32)
          b.create<nisa::CopyOp>(loc, acc, dst, nisa::Engine::gpsimd);
      } else if (auto r = dyn_cast<ReduceOp>(op)) {
        b.create<nisa::TensorReduceOp>(loc, aluFor(r.getFn()),
                                       st.tileOf(r.getInput()), dst,
                                       engineFor.lookup(op));
      }
    }
    for (auto [v, buffer] : outputs) {
      loc = v.getLoc();
      dma(st.tileOf(v), window(v, buffer));
    }
  };

  // Full steps pipelined (loads run numSlots - 1 steps ahead), then the
  // smaller steps at the end.
  auto run = [&](int64_t full, int64_t stride, int64_t rows) {
    forEachPipelined(
        full, numSlots,
        [&](Value i, int64_t slot) {
          step(Phase::Load, scale(i, stride), rows, cols, slot);
        },
        [&](Value i, int64_t slot) {
          step(Phase::Compute, scale(i, stride), rows, cols, slot);
        });
  };
  auto single = [&](int64_t base, int64_t rows, int64_t stepCols,
                    int64_t slot) {
    step(Phase::Load, index(base), rows, stepCols, slot);
    step(Phase::Compute, index(base), rows, stepCols, slot);
  };
  if (plan.byRows) {
    int64_t full = plan.numRows / p, rem = plan.numRows % p;
    run(full, p, p);
    if (rem)
      single(full * p, rem, cols, full);
    return;
  }
  int64_t n = plan.numCols, chunk = p * cols, full = n / chunk;
  run(full, chunk, p);
  int64_t rem = n % chunk, at = full * chunk, next = full;
  if (rem / cols)
    single(at, rem / cols, cols, next++);
  if (rem % cols)
    single(at + rem / cols * cols, 1, rem % cols, next);
}

void KernelLowering::lowerFusion(FusionOp fusion) {
  Block &body = fusion.getBody().front();
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  SmallVector<std::pair<Value, Value>> inputs, outputs;
  for (auto [arg, operand] : llvm::zip(body.getArguments(), fusion.getInputs()))
    inputs.push_back({arg, bufferOf(operand)});
  auto yield = cast<YieldOp>(body.getTerminator());
  for (auto [v, result] : llvm::zip(yield.getValues(), fusion.getResults())) {
    if (isa<BlockArgument>(v)) {
      fusion.emitOpError("yields an input unchanged");
      hadError = true;
      return;
    }
    outputs.push_back({v, resultBuffer(result)});
  }
  lowerGroup(fusion, ops, inputs, outputs);
}

/// Runs `body(i)` for i in [0, count): once inline when count is 1, else
/// in an scf.for loop.
void KernelLowering::forEach(int64_t count,
                             llvm::function_ref<void(Value)> body) {
  if (count == 1) {
    body(index(0));
  } else if (count > 1) {
    auto loop = b.create<scf::ForOp>(loc, index(0), index(count), index(1));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(loop.getBody()->getTerminator());
    body(loop.getInductionVar());
  }
}

/// Steps [first, first + count) of a pipeline that rotates over `slots`
/// buffers (step i uses buffer i % slots): groups of `slots` steps run in a
/// loop whose body is unrolled, so each copy names its buffer by a constant
/// offset; the steps left over run alone.
void KernelLowering::forEachRotating(
    int64_t first, int64_t count, int64_t slots,
    llvm::function_ref<void(Value step, int64_t slot)> body) {
  forEach(count / slots, [&](Value group) {
    Value start = addOffset(scale(group, slots), first);
    for (int64_t i = 0; i < slots; ++i)
      body(addOffset(start, i), (first + i) % slots);
  });
  for (int64_t i = count / slots * slots; i < count; ++i)
    body(index(first + i), (first + i) % slots);
}

/// Steps [0, count) of a stream whose loads go to buffer step % slots:
/// the loads of the first slots - 1 steps, then per step the load of the
/// step slots - 1 ahead before the step's compute. In program order (which
/// is each DMA queue's issue order) a load thus never waits behind the
/// store of an earlier step.
void KernelLowering::forEachPipelined(
    int64_t count, int64_t slots,
    llvm::function_ref<void(Value step, int64_t slot)> load,
    llvm::function_ref<void(Value step, int64_t slot)> compute) {
  int64_t ahead = std::min(slots - 1, count);
  for (int64_t i = 0; i < ahead; ++i)
    load(index(i), i % slots);
  int64_t steady = count - ahead;
  forEachRotating(0, steady, slots, [&](Value i, int64_t slot) {
    load(addOffset(i, ahead), (slot + ahead) % slots);
    compute(i, slot);
  });
  for (int64_t i = steady; i < count; ++i)
    compute(index(i), i % slots);
}

/// How many buffers keep a stream of DMA transfers ahead of the work that
/// consumes them: enough to cover a transfer (fixed latency included) with
/// the compute of the steps in between, at least three (so one transfer
/// can finish while another is issued), at most four.
int64_t KernelLowering::streamSlots(double transferNs, double computeNs) const {
  double cover =
      (target.dmaFixedLatencyNs + transferNs) / std::max(computeNs, 1.0);
  // A slot is refilled once the step that read it is done and used
  // slots - 1 steps later; one more covers the trigger and semaphores.
  return std::clamp<int64_t>((int64_t)std::ceil(cover) + 2, 3, 4);
}

/// GEMM, with the operand reuse that keeps TensorE fed:
///  - an M block of up to four 128-row tiles keeps its A^T panel (all of K)
///    in SBUF, loaded once by DMA transposes;
///  - B streams through SBUF in [128, N group] tiles, double-buffered, each
///    feeding every M tile of the block;
///  - each (M tile, 512-column N tile) accumulates over K in its own PSUM
///    bank; two sets of banks alternate between N groups, so TensorE fills
///    one set while ScalarE and VectorE evict the other.
void KernelLowering::lowerMatmul(MatmulOp op) {
  auto lhsType = tensorType(op.getLhs()), rhsType = tensorType(op.getRhs());
  auto outType = op.getType();
  int64_t rank = lhsType.getRank();
  int64_t m = lhsType.getDimSize(rank - 2), k = lhsType.getDimSize(rank - 1);
  int64_t n = rhsType.getDimSize(rank - 1);
  // Operands are read through their windows: a transposed operand (a
  // linear layer's weight) is loaded by transposing DMAs, never copied.
  Window a = windowOf(op.getLhs()), bw = windowOf(op.getRhs());
  Value lhs = a.buffer, rhs = bw.buffer;
  int64_t aRow = a.strides[rank - 2], aCol = a.strides[rank - 1];
  int64_t bRow = bw.strides[rank - 2], bCol = bw.strides[rank - 1];
  Value out = resultBuffer(op.getResult());
  Type inElt = lhsType.getElementType(), outElt = outType.getElementType();
  Type f32 = b.getF32Type();
  int64_t eltBytes = std::max<int64_t>(1, lhsType.getElementTypeBitWidth() / 8);

  const int64_t kTile = target.matmulMaxK;
  const int64_t mTile = target.matmulMaxStationaryFree;
  const int64_t nTile = std::min(target.matmulMaxMovingFree,
                                 target.psumBankBytes / 4); // fp32 per bank
  const int64_t banksPerSet = std::max<int64_t>(1, target.psumBanks / 2);
  int64_t kTiles = (k + kTile - 1) / kTile;
  int64_t kRows = std::min(k, kTile);
  // M tiles per block: as many as PSUM and the panel budget allow (two
  // panels over gemm-panel-sbuf-percent of SBUF would crowd out the streams).
  int64_t mTilesTotal = (m + mTile - 1) / mTile;
  int64_t mTiles = std::min<int64_t>(mTilesTotal, banksPerSet);
  while (mTiles > 1 &&
         2 * kTiles * mTiles * mTile * eltBytes >
             target.sbufBytesPerPartition * knobs.gemmPanelSbufPercent / 100)
    --mTiles;
  // N tiles per B transfer: fill the bank set the M tiles leave free.
  int64_t nTilesTotal = (n + nTile - 1) / nTile;
  int64_t nTiles = std::max<int64_t>(
      1, std::min<int64_t>(nTilesTotal, banksPerSet / mTiles));
  int64_t mBlock = mTiles * mTile, nGroup = std::min(n, nTiles * nTile);

  auto body = [&](Value lhsBase, Value rhsBase, Value outBase) {
    // The panel of the next M block loads while this block computes: full
    // blocks alternate between two panel slots.
    int64_t fullBlocks = m / mBlock;
    int64_t panelSlots = std::min<int64_t>(fullBlocks, 2);
    auto loadPanel = [&](Value m0, int64_t mRows, Value panel, Value panelAt,
                         int64_t panelStride) {
      // One transfer for the full K tiles ([k in tile, tile, row of A]),
      // one for the partial tile.
      Value rows0 = addOffsets(lhsBase, scale(m0, aRow));
      if (int64_t full = k / kTile)
        dma(view(lhs, rows0, {kTile, full, mRows}, {aCol, kTile * aCol, aRow}),
            view(panel, panelAt, {kTile, full, mRows},
                 {panelStride, mRows, 1}));
      if (int64_t kt = k % kTile)
        dma(view(lhs, addOffset(rows0, k / kTile * kTile * aCol), {kt, mRows},
                 {aCol, aRow}),
            view(panel, addOffset(panelAt, k / kTile * mRows), {kt, mRows},
                 {panelStride, 1}));
    };
    // `prefetch(g, first, piece, pieces)` loads piece `piece` of `pieces`
    // of the next panel's share for N group g: spread over the group's k
    // steps, between its B loads, it never holds the DMA engines long
    // enough to starve them (up to `maxPieces`; 1 loads it in one go).
    using Prefetch = llvm::function_ref<void(Value, bool, Value, int64_t)>;
    auto block = [&](Value m0, int64_t mRows, Value panel, Value panelAt,
                     int64_t panelStride, Prefetch prefetch,
                     int64_t maxPieces) {
      TileScope blockScope(*this);
      int64_t blockTiles = (mRows + mTile - 1) / mTile;
      // A^T panel: K on the partitions, column kIdx * mRows + row of A.
      // B tiles rotate over enough slots to hide a load behind the matmuls
      // of the steps before it; two PSUM bank sets and two output staging
      // sets alternate between N groups.
      // Times by the cost model: a B tile is kRows descriptors of a row of
      // the group (a transposed B, a transposing DMA) over the DMA engines;
      // a step, a matmul per M tile and N tile.
      const ::neuron::target::CostModel costModel(target);
      double loadBytes = double(kRows * nGroup * eltBytes);
      double loadNs =
          (bCol == 1 ? costModel.dmaTransferNs(
                           loadBytes, double(nGroup * eltBytes), double(kRows))
                     : loadBytes / costModel.dmaTransposeBytesPerNs(false)) /
          target.dmaEngines;
      double stepNs = blockTiles * nTiles *
                      costModel.cyclesToNs(
                          ::neuron::runtime::Engine::Tensor,
                          costModel.matmulCycles(double(mTile), double(nTile),
                                                 inElt.isF32()));
      int64_t bSlots = streamSlots(loadNs, stepNs);
      Value moving = tile(MemorySpace::sbuf, {kRows, bSlots * nGroup}, inElt);
      Value acc =
          tile(MemorySpace::psum, {mTile, 2 * banksPerSet * nTile}, f32);
      Value staged =
          tile(MemorySpace::sbuf, {mTile, 2 * blockTiles * nGroup}, outElt);
      auto nStep = [&](Value g, int64_t set, int64_t cols, bool first,
                       bool prefetches) {
        Value n0 = scale(g, nGroup);
        int64_t groupTiles = (cols + nTile - 1) / nTile;
        auto bank = [&](int64_t mi, int64_t ni, int64_t rows, int64_t width) {
          int64_t col = (set * banksPerSet + mi * groupTiles + ni) * nTile;
          return view(acc, index(col), {rows, width},
                      {2 * banksPerSet * nTile, 1});
        };
        auto kStep = [&](Value kIdx, int64_t slot, int64_t kt, bool first) {
          Value src = addOffsets(addOffsets(rhsBase, scale(kIdx, kTile * bRow)),
                                 scale(n0, bCol));
          Value bTile = view(moving, index(slot * nGroup), {kt, cols},
                             {bSlots * nGroup, 1});
          dma(view(rhs, src, {kt, cols}, {bRow, bCol}), bTile);
          for (int64_t mi = 0; mi < blockTiles; ++mi) {
            int64_t mt = std::min(mTile, mRows - mi * mTile);
            Value stationary = view(
                panel,
                addOffsets(panelAt, addOffset(scale(kIdx, mRows), mi * mTile)),
                {kt, mt}, {panelStride, 1});
            for (int64_t ni = 0; ni < groupTiles; ++ni) {
              int64_t nt = std::min(nTile, cols - ni * nTile);
              Value mov = view(moving, index(slot * nGroup + ni * nTile),
                               {kt, nt}, {bSlots * nGroup, 1});
              auto mm = b.create<nisa::MatmulOp>(loc, stationary, mov,
                                                 bank(mi, ni, mt, nt));
              if (!first)
                mm.setAccumulate(true);
            }
          }
        };
        int64_t fullK = k / kTile;
        // Full k steps in rounds of bSlots (static slots): round 0 peeled
        // (its first step starts the sums), the others in one loop; round r
        // loads piece r of the next panel while there are pieces.
        int64_t rounds = fullK / bSlots;
        int64_t pieces = std::min(maxPieces, rounds);
        while (pieces > 1 && (!llvm::isPowerOf2_64(pieces) || mRows % pieces))
          --pieces;
        auto round = [&](Value r, bool firstRound) {
          for (int64_t i = 0; i < bSlots; ++i)
            kStep(addOffset(scale(r, bSlots), i), i, kTile,
                  firstRound && i == 0);
          if (prefetches && pieces > 1)
            prefetch(g, first, r, pieces);
        };
        if (rounds > 0)
          round(index(0), true);
        if (prefetches && pieces <= 1)
          prefetch(g, first, index(0), 1);
        forEach(std::max<int64_t>(pieces, 1) - 1,
                [&](Value r) { round(addOffset(r, 1), false); });
        int64_t spread = std::max<int64_t>(pieces, 1);
        forEach(rounds - spread, [&](Value r) {
          for (int64_t i = 0; i < bSlots; ++i)
            kStep(addOffset(scale(addOffset(r, spread), bSlots), i), i, kTile,
                  false);
        });
        for (int64_t s = rounds * bSlots; s < fullK; ++s)
          kStep(index(s), s % bSlots, kTile, s == 0);
        if (k % kTile)
          kStep(index(fullK), fullK % bSlots, k % kTile, fullK == 0);
        // Evict each bank (alternating VectorE and ScalarE) and store.
        for (int64_t mi = 0; mi < blockTiles; ++mi) {
          int64_t mt = std::min(mTile, mRows - mi * mTile);
          Value stage = view(staged, index((set * blockTiles + mi) * nGroup),
                             {mt, cols}, {2 * blockTiles * nGroup, 1});
          for (int64_t ni = 0; ni < groupTiles; ++ni) {
            int64_t nt = std::min(nTile, cols - ni * nTile);
            Value part = view(
                staged, index((set * blockTiles + mi) * nGroup + ni * nTile),
                {mt, nt}, {2 * blockTiles * nGroup, 1});
            auto engine = (mi * groupTiles + ni) % 2 ? nisa::Engine::scalar
                                                     : nisa::Engine::vector;
            b.create<nisa::CopyOp>(loc, bank(mi, ni, mt, nt), part, engine);
          }
          Value dst = addOffsets(
              addOffsets(outBase, scale(addOffset(m0, mi * mTile), n)), n0);
          // From ScalarE's queue: a store waits for its eviction, and on
          // SyncE's it would hold up the next group's B loads.
          b.create<nisa::DmaCopyOp>(loc, stage,
                                    view(out, dst, {mt, cols}, {n, 1}),
                                    nisa::Engine::scalar);
        }
      };
      int64_t groups = n / nGroup;
      if (groups > 0)
        nStep(index(0), 0, nGroup, true, true);
      else
        prefetch(index(0), true, index(0), 1);
      forEachRotating(
          1, std::max<int64_t>(groups - 1, 0), 2,
          [&](Value g, int64_t set) { nStep(g, set, nGroup, false, true); });
      if (n % nGroup)
        nStep(index(groups), groups % 2, n % nGroup, false, false);
    };
    if (fullBlocks > 0) {
      TileScope panels(*this);
      int64_t panelCols = kTiles * mBlock;
      Value panel =
          tile(MemorySpace::sbuf, {kRows, panelSlots * panelCols}, inElt);
      auto at = [&](int64_t slot) { return index(slot * panelCols); };
      int64_t stride = panelSlots * panelCols;
      auto load = [&](Value i, int64_t slot) {
        loadPanel(scale(i, mBlock), mBlock, panel, at(slot), stride);
      };
      load(index(0), 0);
      // Spread over the N groups, a K chunk per group, when they divide K
      // evenly: the DMA engines then never serve a whole panel at once.
      int64_t groups = n / nGroup;
      bool chunked = groups >= 2 && k % kTile == 0 && kTiles % groups == 0;
      int64_t chunk = chunked ? kTiles / groups : 0;
      auto prefetchNext = [&](Value i, int64_t slot) {
        return [&, i, slot](Value g, bool first, Value piece, int64_t pieces) {
          Value m0 = scale(addOffset(i, 1), mBlock);
          int64_t next = (slot + 1) % panelSlots;
          if (!chunked) {
            if (first)
              loadPanel(m0, mBlock, panel, at(next), stride);
            return;
          }
          int64_t rows = mBlock / pieces;
          Value r0 = scale(piece, rows);
          Value src =
              addOffsets(addOffsets(lhsBase, scale(addOffsets(m0, r0), aRow)),
                         scale(g, chunk * kTile * aCol));
          dma(view(lhs, src, {kTile, chunk, rows}, {aCol, kTile * aCol, aRow}),
              view(panel,
                   addOffsets(addOffsets(at(next), scale(g, chunk * mBlock)),
                              r0),
                   {kTile, chunk, rows}, {stride, mBlock, 1}));
        };
      };
      forEachRotating(0, fullBlocks - 1, panelSlots,
                      [&](Value i, int64_t slot) {
                        block(scale(i, mBlock), mBlock, panel, at(slot), stride,
                              prefetchNext(i, slot), chunked ? mBlock : 1);
                      });
      int64_t last = fullBlocks - 1;
      block(
          index(last * mBlock), mBlock, panel, at(last % panelSlots), stride,
          [](Value, bool, Value, int64_t) {}, 1);
    }
    if (int64_t rest = m % mBlock) {
      TileScope panels(*this);
      Value panel = tile(MemorySpace::sbuf, {kRows, kTiles * rest}, inElt);
      Value m0 = index(fullBlocks * mBlock);
      loadPanel(m0, rest, panel, index(0), kTiles * rest);
      block(
          m0, rest, panel, index(0), kTiles * rest,
          [](Value, bool, Value, int64_t) {}, 1);
    }
  };
  // One loop per batch dim: windows may stride them any way.
  auto outStrides = contiguousStrides(outType.getShape());
  std::function<void(int64_t, Value, Value, Value)> batches =
      [&](int64_t d, Value lo, Value ro, Value oo) {
        if (d == rank - 2)
          return body(lo, ro, oo);
        forEach(outType.getDimSize(d), [&](Value i) {
          batches(d + 1, addOffsets(lo, scale(i, a.strides[d])),
                  addOffsets(ro, scale(i, bw.strides[d])),
                  addOffsets(oo, scale(i, outStrides[d])));
        });
      };
  batches(0, index(a.offset), index(bw.offset), index(0));
}

void KernelLowering::lowerReduce(ReduceOp op) {
  if (lowerColumnSum(op))
    return;
  auto inType = tensorType(op.getInput());
  int64_t cols = product(inType.getShape().take_back(op.getCount()));
  int64_t rows = product(inType.getShape().drop_back(op.getCount()));
  Value in = bufferOf(op.getInput()), out = resultBuffer(op.getResult());
  nisa::AluOp alu = aluFor(op.getFn());
  Type f32 = b.getF32Type();
  int64_t chunk = std::max<int64_t>(1, tileBytes / 4);
  forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
    TileScope scope(*this);
    Value acc = tile(MemorySpace::sbuf, {rt, 1}, f32);
    Value rowBase = scale(r0, cols);
    int64_t first = std::min(cols, chunk);
    {
      TileScope s(*this);
      Value t = load(in, rowBase, rt, first, cols);
      b.create<nisa::TensorReduceOp>(loc, alu, t, acc);
    }
    if (cols > first)
      forTiles(cols - first, chunk, [&](Value c0, int64_t ct) {
        TileScope s(*this);
        Value t =
            load(in, addOffsets(rowBase, addOffset(c0, first)), rt, ct, cols);
        Value part = tile(MemorySpace::sbuf, {rt, 1}, f32);
        b.create<nisa::TensorReduceOp>(loc, alu, t, part);
        b.create<nisa::TensorTensorOp>(loc, alu, acc, part, acc);
      });
    Value result = tile(MemorySpace::sbuf, {rt, 1}, inType.getElementType());
    b.create<nisa::CopyOp>(loc, acc, result);
    dma(result, view(out, r0, {rt, 1}, {1, 1}));
  });
}

void KernelLowering::lowerConcat(ConcatOp op) {
  auto outType = op.getType();
  SmallVector<int64_t> outStrides = contiguousStrides(outType.getShape());
  Value out = resultBuffer(op.getResult());
  int64_t position = 0;
  for (Value input : op.getInputs()) {
    auto inType = tensorType(input);
    if (inType.getNumElements() > 0)
      dma(view(bufferOf(input), index(0), inType.getShape(),
               contiguousStrides(inType.getShape())),
          view(out, index(position * outStrides[op.getDim()]),
               inType.getShape(), outStrides));
    position += inType.getDimSize(op.getDim());
  }
}

void KernelLowering::lowerGather(GatherOp op) {
  auto tableType = tensorType(op.getTable());
  auto idxType = tensorType(op.getIndices());
  int64_t rows = idxType.getNumElements();
  int64_t width = product(tableType.getShape().drop_front());
  int64_t vocab = tableType.getDimSize(0);
  Value table = bufferOf(op.getTable()), idx = bufferOf(op.getIndices());
  Value out = resultBuffer(op.getResult());
  // Gathered rows land in SBUF; keep each chunk within a few tiles' bytes.
  int64_t eltBytes =
      std::max<int64_t>(1, tableType.getElementTypeBitWidth() / 8);
  int64_t chunk = std::max<int64_t>(1, 4 * tileBytes / eltBytes);
  forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
    TileScope scope(*this);
    Value indices = load(idx, r0, rt, 1, 1);
    forTiles(width, chunk, [&](Value c0, int64_t ct) {
      TileScope s(*this);
      Value rowsTile =
          tile(MemorySpace::sbuf, {rt, ct}, tableType.getElementType());
      b.create<nisa::DmaGatherOp>(loc, view(table, c0, {vocab, ct}, {width, 1}),
                                  indices, rowsTile);
      dma(rowsTile,
          view(out, addOffsets(scale(r0, width), c0), {rt, ct}, {width, 1}));
    });
  });
}

/// GpSimd numbers the result's elements in row-major order, P x F at a
/// time (rows of F, then one short row), each partition under the same key:
/// the seed, broadcast to every partition by one DMA.
void KernelLowering::lowerRand(RandOp op) {
  auto type = tensorType(op.getResult());
  int64_t n = type.getNumElements(), p = target.partitions;
  int64_t eltBytes = std::max<int64_t>(1, type.getElementTypeBitWidth() / 8);
  int64_t cols = std::clamp<int64_t>(n / p, 1, tileBytes / eltBytes);
  Value out = resultBuffer(op.getResult());
  TileScope scope(*this);
  Value seed = tile(MemorySpace::sbuf, {p, 2}, b.getI32Type());
  dma(view(bufferOf(op.getSeed()), index(0), {p, 2}, {0, 1}), seed);
  auto rand = [&](Value base, int64_t rows, int64_t width) {
    TileScope s(*this);
    Value t = tile(MemorySpace::sbuf, {rows, width}, type.getElementType());
    b.create<nisa::RandOp>(loc, t, view(seed, index(0), {rows, 2}, {2, 1}),
                           base, op.getStream(), APFloat(double(cols)),
                           ArrayRef<double>{1.0});
    dma(t, view(out, base, {rows, width}, {cols, 1}));
  };
  forTiles(n, p * cols, [&](Value base, int64_t count) {
    if (count / cols)
      rand(base, count / cols, cols);
    if (count % cols)
      rand(addOffset(base, count / cols * cols), 1, count % cols);
  });
}

/// One collective instruction from the input's buffer (made contiguous) to
/// the result's: the process group moves whole tensors.
void KernelLowering::lowerCollective(CollectiveOp op) {
  auto flat = [&](Value buffer, RankedTensorType type) {
    SmallVector<int64_t> shape(type.getShape());
    if (shape.empty())
      shape.push_back(1);
    return view(buffer, index(0), shape, contiguousStrides(shape));
  };
  Value in = flat(bufferOf(op.getInput()), tensorType(op.getInput()));
  Value out = flat(resultBuffer(op.getResult()), op.getType());
  auto kind = *nisa::symbolizeCollective(stringifyCollectiveKind(op.getKind()));
  b.create<nisa::CollectiveOp>(loc, in, out, kind, aluFor(op.getReduce()),
                               op.getGroup(), op.getRanks());
}

LogicalResult KernelLowering::lower(Operation *op) {
  loc = op->getLoc();
  // An empty result needs a buffer but no instructions.
  if (op->getNumResults() == 1 && !isa<ConstantOp, ReshapeOp>(op) &&
      tensorType(op->getResult(0)).getNumElements() == 0) {
    resultBuffer(op->getResult(0));
    return success();
  }
  if (auto mm = dyn_cast<MatmulOp>(op))
    if (tensorType(mm.getLhs()).getShape().back() == 0)
      return op->emitOpError("has an empty contraction (the importer folds "
                             "it to zeros)");
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<ConstantOp>([&](auto) { return success(); })
      .Case<UnaryOp, BinaryOp, SelectOp, CastOp>([&](Operation *e) {
        // One elementwise op is a group of one.
        SmallVector<std::pair<Value, Value>> inputs;
        for (Value operand : e->getOperands())
          inputs.push_back(
              {operand, splatValueOf(operand) ? Value() : bufferOf(operand)});
        Value result = e->getResult(0);
        lowerGroup(e, e, inputs, {{result, resultBuffer(result)}});
        return failure(hadError);
      })
      .Case<FusionOp>([&](FusionOp f) {
        lowerFusion(f);
        return failure(hadError);
      })
      .Case<MatmulOp>([&](MatmulOp m) {
        lowerMatmul(m);
        return success();
      })
      .Case<ReduceOp>([&](ReduceOp r) {
        lowerReduce(r);
        return success();
      })
      .Case<ReshapeOp, TransposeOp, BroadcastOp, SliceOp>(
          [&](Operation *layout) {
            lowerLayout(layout);
            return success();
          })
      .Case<ConcatOp>([&](ConcatOp c) {
        lowerConcat(c);
        return success();
      })
      .Case<GatherOp>([&](GatherOp g) {
        lowerGather(g);
        return success();
      })
      .Case<CumsumOp>([&](CumsumOp c) {
        lowerCumsum(c);
        return success();
      })
      .Case<TopKOp>([&](TopKOp t) {
        lowerTopK(t);
        return success();
      })
      .Case<RandOp>([&](RandOp r) {
        lowerRand(r);
        return success();
      })
      .Case<CollectiveOp>([&](CollectiveOp c) {
        lowerCollective(c);
        return success();
      })
      .Case<FlexAttentionOp>(
          [&](FlexAttentionOp f) { return lowerFlexAttention(f); })
      .Case<FlexAttentionBackwardOp>([&](FlexAttentionBackwardOp f) {
        return lowerFlexAttentionBackward(f);
      })
      .Default([&](Operation *other) {
        return other->emitOpError("has no lowering to nisa");
      });
}

LogicalResult KernelLowering::lowerFunction(func::FuncOp func) {
  FunctionType fnType = func.getFunctionType();
  SmallVector<Type> argTypes;
  for (Type t :
       llvm::concat<const Type>(fnType.getInputs(), fnType.getResults())) {
    auto tensor = dyn_cast<RankedTensorType>(t);
    if (!tensor)
      return func.emitOpError("kernel arguments and results must be ranked "
                              "tensors, got ")
             << t;
    argTypes.push_back(hbmType(tensor));
  }
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(func);
  auto kernel = b.create<func::FuncOp>(func.getLoc(), func.getName(),
                                       b.getFunctionType(argTypes, {}));
  kernel->setAttr("nisa.kernel", b.getUnitAttr());
  kernel->setAttr("nisa.num_inputs",
                  b.getI64IntegerAttr(fnType.getNumInputs()));
  entry = kernel.addEntryBlock();
  b.setInsertionPointToStart(entry);

  Block &body = func.getBody().front();
  unsigned numInputs = fnType.getNumInputs();
  for (auto [i, arg] : llvm::enumerate(body.getArguments()))
    buffers[arg] = entry->getArgument(i);

  // Results computed by an op are written straight into their output buffer.
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Operation *def = v.getDefiningOp();
    if (def && !isa<ConstantOp, ReshapeOp>(def) && !destinations.count(v))
      destinations[v] = entry->getArgument(numInputs + i);
  }

  for (Operation &op : body.without_terminator())
    if (failed(lower(&op)))
      return failure();

  loc = ret.getLoc();
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Value dst = entry->getArgument(numInputs + i);
    Value src = bufferOf(v);
    if (src == dst || tensorType(v).getNumElements() == 0)
      continue;
    auto shape = tensorType(v).getShape();
    SmallVector<int64_t> dims(shape);
    if (dims.empty())
      dims.push_back(1);
    auto strides = contiguousStrides(dims);
    dma(view(src, index(0), dims, strides), view(dst, index(0), dims, strides));
  }
  b.create<func::ReturnOp>(ret.getLoc());
  kernel->setLoc(func.getLoc());
  func.erase();
  return success();
}

struct NeuronLowerToNisaPass
    : public mlir::neuron::impl::NeuronLowerToNisaBase<NeuronLowerToNisaPass> {
  using NeuronLowerToNisaBase::NeuronLowerToNisaBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!target.empty())
      module->setAttr(nisa::kTargetAttrName,
                      StringAttr::get(&getContext(), target));
    const auto *chip = nisa::lookupTarget(module);
    if (!chip)
      return signalPassFailure();
    if (freeTileBytes < 4) {
      module.emitError("free-tile-bytes must be at least 4");
      return signalPassFailure();
    }
    NeuronLowerToNisaOptions knobs;
    knobs.freeTileBytes = freeTileBytes;
    knobs.streamSlots = streamSlots;
    knobs.streamSbufPercent = streamSbufPercent;
    knobs.innerSbufPercent = innerSbufPercent;
    knobs.gemmPanelSbufPercent = gemmPanelSbufPercent;
    knobs.attentionLanes = attentionLanes;
    knobs.attentionSbufPercent = attentionSbufPercent;
    if (knobs.streamSlots < 1 || knobs.attentionLanes < 1) {
      module.emitError("stream-slots and attention-lanes must be at least 1");
      return signalPassFailure();
    }
    for (auto [name, percent] :
         {std::pair{"stream-sbuf-percent", knobs.streamSbufPercent},
          {"inner-sbuf-percent", knobs.innerSbufPercent},
          {"gemm-panel-sbuf-percent", knobs.gemmPanelSbufPercent},
          {"attention-sbuf-percent", knobs.attentionSbufPercent}})
      if (percent < 1 || percent > 100) {
        module.emitError() << name << " must be between 1 and 100, not "
                           << percent;
        return signalPassFailure();
      }
    SmallVector<func::FuncOp> funcs(module.getOps<func::FuncOp>());
    OpBuilder builder(&getContext());
    for (func::FuncOp func : funcs) {
      if (func->hasAttr("nisa.kernel") || func.isExternal())
        continue;
      KernelLowering lowering(builder, module, *chip, knobs);
      if (failed(lowering.lowerFunction(func)))
        return signalPassFailure();
    }
  }
};

} // namespace mlir::neuron
