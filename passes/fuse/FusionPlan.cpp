//===- FusionPlan.cpp - how a group of elementwise ops is tiled -----------===//
#include "passes/fuse/FusionPlan.h"

#include "dialects/neuron/NeuronDialect.h"

#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::neuron;

namespace {

/// A dynamic dim's stand-in (issue #16): the plan compares element counts,
/// and the group's dynamic values share their row count (Dynamo guarded
/// their sizes equal), so any large value no static count meets will do.
constexpr int64_t kDynamicStandIn = 1000003;

int64_t dimSize(RankedTensorType t, int64_t d) {
  return t.isDynamicDim(d) ? kDynamicStandIn : t.getDimSize(d);
}

int64_t numElements(RankedTensorType t) {
  int64_t n = 1;
  for (int64_t d = 0; d < t.getRank(); ++d)
    n *= dimSize(t, d);
  return n;
}

int64_t numElements(Value v) {
  return numElements(cast<RankedTensorType>(v.getType()));
}

/// What a broadcast does to the [rows, cols] picture.
struct BroadcastShape {
  enum Kind { Same, Scalar, Row, Col } kind;
  int64_t cols = 0; // Row, Col: the row length C it implies
};

std::optional<BroadcastShape> classify(BroadcastOp op) {
  auto in = cast<RankedTensorType>(op.getInput().getType());
  auto out = op.getType();
  if (numElements(in) == numElements(out))
    return BroadcastShape{BroadcastShape::Same};
  if (numElements(in) == 1)
    return BroadcastShape{BroadcastShape::Scalar};
  int64_t rank = out.getRank(), shift = rank - in.getRank();
  SmallVector<bool> expanded(rank);
  int64_t first = rank, last = -1;
  for (int64_t i = 0; i < rank; ++i) {
    int64_t inDim = i < shift ? 1 : dimSize(in, i - shift);
    expanded[i] = inDim == 1 && dimSize(out, i) != 1;
    if (expanded[i]) {
      first = std::min(first, i);
      last = i;
    }
  }
  auto productFrom = [&](int64_t begin) {
    int64_t p = 1;
    for (int64_t i = begin; i < rank; ++i)
      p *= dimSize(out, i);
    return p;
  };
  bool suffix = true, prefix = true;
  for (int64_t i = 0; i < rank; ++i) {
    if (dimSize(out, i) == 1)
      continue;
    if (i >= first && !expanded[i])
      suffix = false;
    if (i <= last && !expanded[i])
      prefix = false;
  }
  if (suffix)
    return BroadcastShape{BroadcastShape::Row, productFrom(first)};
  if (prefix)
    return BroadcastShape{BroadcastShape::Col, productFrom(last + 1)};
  return std::nullopt;
}

} // namespace

std::optional<double> mlir::neuron::splatValueOf(Value tensor) {
  // A splat broadcast to dynamic sizes (a constant's sizes are static, so
  // canonicalization keeps that broadcast) is the splat.
  if (auto b = tensor.getDefiningOp<BroadcastOp>();
      b && !b.getType().hasStaticShape())
    return splatValueOf(b.getInput());
  auto constant = tensor.getDefiningOp<ConstantOp>();
  if (!constant)
    return std::nullopt;
  auto splat = dyn_cast<SplatElementsAttr>(constant.getValue());
  if (!splat)
    return std::nullopt;
  Type elt = splat.getElementType();
  if (isa<FloatType>(elt))
    return splat.getSplatValue<APFloat>().convertToDouble();
  if (elt.isInteger(1))
    return splat.getSplatValue<bool>() ? 1.0 : 0.0;
  return (double)splat.getSplatValue<APInt>().getSExtValue();
}

namespace {

/// Geometry: reductions and row/column broadcasts fix the row length C
/// (`cols`) and the full size (`full`); without them both stay 0 and the
/// group is tiled flat.
LogicalResult rowGeometry(ArrayRef<Operation *> ops, int64_t &cols,
                          int64_t &full, std::string &reason) {
  auto constrain = [&](int64_t c, int64_t n) {
    if ((cols && cols != c) || (full && full != n))
      return false;
    cols = c;
    full = n;
    return true;
  };
  for (Operation *op : ops) {
    if (auto r = dyn_cast<ReduceOp>(op)) {
      auto type = cast<RankedTensorType>(r.getInput().getType());
      int64_t c = 1;
      for (int64_t d = type.getRank() - r.getCount(); d < type.getRank(); ++d)
        c *= dimSize(type, d);
      if (!constrain(c, numElements(r.getInput()))) {
        reason = "reductions and broadcasts disagree on the row length";
        return failure();
      }
    } else if (auto b = dyn_cast<BroadcastOp>(op)) {
      auto shape = classify(b);
      if (!shape) {
        reason = "broadcast along interior dims";
        return failure();
      }
      if ((shape->kind == BroadcastShape::Row ||
           shape->kind == BroadcastShape::Col) &&
          !constrain(shape->cols, numElements(b.getResult()))) {
        reason = "reductions and broadcasts disagree on the row length";
        return failure();
      }
    }
  }
  return success();
}

/// Values that only feed column broadcasts through casts and unary ops (a
/// norm's weight cast to float32 before it broadcasts): column vectors,
/// even when a row has as many elements (square tensors).
llvm::DenseSet<Value> columnSide(ArrayRef<Operation *> ops) {
  llvm::DenseSet<Value> colSide;
  auto colBroadcast = [](Operation *op) {
    auto b = dyn_cast<BroadcastOp>(op);
    auto shape = b ? classify(b) : std::nullopt;
    return shape && shape->kind == BroadcastShape::Col;
  };
  for (Operation *op : llvm::reverse(ops)) {
    if (colBroadcast(op)) {
      colSide.insert(op->getOperand(0));
    } else if (isa<CastOp, UnaryOp>(op) && colSide.contains(op->getResult(0)) &&
               llvm::all_of(op->getResult(0).getUsers(), [&](Operation *u) {
                 return colBroadcast(u) || (isa<CastOp, UnaryOp>(u) &&
                                            colSide.contains(u->getResult(0)));
               })) {
      colSide.insert(op->getOperand(0));
    }
  }
  return colSide;
}

/// How a group input `v` read by `user` is held, by its size and the
/// broadcast reading it (a splat is recorded in `plan.splats`).
std::optional<Rep> inputRep(FusionPlan &plan, Value v, Operation *user,
                            int64_t full,
                            const llvm::DenseSet<Value> &colSide) {
  if (auto splat = splatValueOf(v)) {
    plan.splats[v] = *splat;
    return Rep::Splat;
  }
  int64_t n = numElements(v);
  if (auto b = dyn_cast<BroadcastOp>(user)) {
    auto shape = classify(b);
    if (shape->kind == BroadcastShape::Col)
      return Rep::Col;
    if (shape->kind != BroadcastShape::Same)
      return Rep::Row;
  }
  if (plan.byRows && n == plan.numCols && colSide.contains(v))
    return Rep::Col;
  if (n == full)
    return Rep::Full;
  if (n == 1 || (plan.byRows && n == plan.numRows))
    return Rep::Row;
  return std::nullopt;
}

/// The reps of `op`'s operands into `in`, giving the group's inputs theirs.
LogicalResult operandReps(FusionPlan &plan, Operation *op,
                          const llvm::DenseSet<Operation *> &members,
                          int64_t full, const llvm::DenseSet<Value> &colSide,
                          SmallVectorImpl<Rep> &in, std::string &reason) {
  // An op of splats alone computes on its first operand as a tensor.
  bool allSplats = !isa<BroadcastOp, ReshapeOp>(op) &&
                   llvm::all_of(op->getOperands(), [&](Value v) {
                     return !plan.reps.count(v) && splatValueOf(v);
                   });
  for (Value operand : op->getOperands()) {
    if (allSplats && operand == op->getOperand(0) &&
        !plan.reps.count(operand)) {
      int64_t n = numElements(operand);
      plan.reps[operand] = n == full ? Rep::Full : Rep::Row;
    }
    auto it = plan.reps.find(operand);
    if (it == plan.reps.end()) {
      Operation *def = operand.getDefiningOp();
      if (def && members.contains(def) && !isa<ConstantOp>(def)) {
        reason = "operand used before it is computed";
        return failure();
      }
      auto rep = inputRep(plan, operand, op, full, colSide);
      if (!rep) {
        reason = "an input is neither full-size, a row nor a column";
        return failure();
      }
      it = plan.reps.try_emplace(operand, *rep).first;
    }
    in.push_back(it->second);
  }
  return success();
}

/// How `op`'s result is held, given its operands' reps `in`; none if the
/// group cannot compute it per tile.
std::optional<Rep> resultRep(Operation *op, ArrayRef<Rep> in,
                             const llvm::DenseSet<Value> &colSide) {
  bool anyFull = llvm::any_of(in, heldAsTile);
  bool anyRow = llvm::is_contained(in, Rep::Row);
  Rep combined = anyFull ? Rep::Full : anyRow ? Rep::Row : Rep::Splat;
  // Casts and unary ops of a column vector stay column vectors.
  if (isa<CastOp, UnaryOp>(op) && in[0] == Rep::Col &&
      colSide.contains(op->getResult(0)))
    combined = Rep::Col;
  return llvm::TypeSwitch<Operation *, std::optional<Rep>>(op)
      .Case<UnaryOp, BinaryOp, SelectOp, CastOp>(
          [&](Operation *) -> std::optional<Rep> {
            if (combined == Rep::Splat)
              return std::nullopt;
            return combined;
          })
      .Case<ReduceOp>([&](ReduceOp) -> std::optional<Rep> {
        if (in[0] != Rep::Full)
          return std::nullopt;
        return Rep::Row;
      })
      .Case<BroadcastOp>([&](BroadcastOp b) -> std::optional<Rep> {
        // A splat broadcast any way is a splat.
        if (in[0] == Rep::Splat)
          return Rep::Splat;
        // A row vector only broadcasts along rows, a column vector along
        // columns.
        switch (classify(b)->kind) {
        case BroadcastShape::Row:
          if (in[0] != Rep::Row)
            return std::nullopt;
          break;
        case BroadcastShape::Col:
          if (in[0] != Rep::Col)
            return std::nullopt;
          break;
        case BroadcastShape::Scalar:
          if (heldAsTile(in[0]))
            return std::nullopt;
          break;
        case BroadcastShape::Same:
          break;
        }
        return in[0];
      })
      .Case<ReshapeOp>([&](Operation *) -> std::optional<Rep> { return in[0]; })
      .Default([](Operation *) { return std::nullopt; });
}

/// Whether every output is a full tensor or a row vector (a column or a
/// splat would have to be broadcast in memory).
bool outputsStorable(const FusionPlan &plan, ArrayRef<Value> outputs,
                     int64_t full) {
  for (Value out : outputs) {
    Rep rep = plan.rep(out);
    int64_t n = numElements(out);
    if (!plan.reps.count(out) || rep == Rep::Col || rep == Rep::Splat ||
        (rep == Rep::Full && n != full) ||
        (rep == Rep::Row && (!plan.byRows || n != plan.numRows)))
      return false;
  }
  return true;
}

/// A row longer than kFoldedRowBytes of the group's widest values that it
/// reduces nothing along, held as the fewest rows of numCols / rowFold that
/// are within it (rowFold a power of two dividing the row and the 128 rows
/// of a tile, so a tile holds whole rows' pieces): every value of such a
/// group is full-size or a row's (no column vectors, whose values would
/// differ between a row's pieces), and its row values are inputs (or their
/// broadcasts and reshapes), so that none is an output, while the group
/// grows (outputs unknown) or once it is whole.
constexpr int64_t kFoldedRowBytes = 16384;
constexpr int64_t kMaxRowFold = 128;

void foldLongRows(FusionPlan &plan, ArrayRef<Operation *> ops,
                  ArrayRef<Value> outputs, int64_t rowLength) {
  if (!plan.byRows || plan.dynamicRows || rowLength ||
      llvm::any_of(outputs, [&](Value v) { return plan.rep(v) != Rep::Full; }))
    return;
  int64_t widest = 1;
  for (Operation *op : ops) {
    if (isa<ReduceOp>(op) || (!isa<BroadcastOp, ReshapeOp, ConstantOp>(op) &&
                              plan.rep(op->getResult(0)) == Rep::Row))
      return;
    SmallVector<Value> values(op->getOperands());
    llvm::append_range(values, op->getResults());
    for (Value v : values) {
      if (plan.reps.count(v) && plan.rep(v) == Rep::Col)
        return;
      widest = std::max<int64_t>(
          widest,
          cast<RankedTensorType>(v.getType()).getElementTypeBitWidth() / 8);
    }
  }
  int64_t fold = 1;
  while (plan.numCols / fold * widest > kFoldedRowBytes && fold < kMaxRowFold &&
         plan.numCols % (2 * fold) == 0)
    fold *= 2;
  if (plan.numCols / fold * widest > kFoldedRowBytes)
    return;
  plan.rowFold = fold;
  plan.numCols /= fold;
  plan.numRows *= fold;
}

} // namespace

std::optional<FusionPlan> FusionPlan::analyze(ArrayRef<Operation *> ops,
                                              ArrayRef<Value> outputs,
                                              std::string &reason,
                                              int64_t rowLength) {
  FusionPlan plan;
  auto fail = [&](const Twine &why) -> std::optional<FusionPlan> {
    reason = why.str();
    return std::nullopt;
  };
  int64_t cols = 0, full = 0;
  if (failed(rowGeometry(ops, cols, full, reason)))
    return std::nullopt;
  // Dynamic sizes: tiled by rows of the static innermost dims, whatever the
  // group computes, so that a step is a run of whole rows.
  auto dynamic = [](Type t) {
    auto shaped = dyn_cast<RankedTensorType>(t);
    return shaped && !shaped.hasStaticShape();
  };
  for (Operation *op : ops)
    if (llvm::any_of(op->getOperandTypes(), dynamic) ||
        llvm::any_of(op->getResultTypes(), dynamic))
      plan.dynamicRows = true;
  if (plan.dynamicRows && cols == 0) {
    auto type = cast<RankedTensorType>(ops.back()->getResult(0).getType());
    cols = 1;
    for (int64_t d = type.getRank() - 1; d >= 0 && !type.isDynamicDim(d); --d)
      cols *= type.getDimSize(d);
    full = numElements(type);
  }
  if (plan.dynamicRows && cols >= kDynamicStandIn)
    return fail("dynamic sizes: the innermost dim must be static");
  if (cols > 0) {
    plan.byRows = true;
    plan.numCols = cols;
    plan.numRows = full / cols;
  } else {
    for (Operation *op : ops)
      if (!isa<ConstantOp>(op) && op->getNumResults() == 1)
        full = std::max(full, numElements(op->getResult(0)));
    plan.numCols = full;
    if (rowLength > 0 && full > rowLength && full % rowLength == 0) {
      plan.byRows = true;
      plan.numCols = rowLength;
      plan.numRows = full / rowLength;
    }
  }
  if (full == 0)
    return fail("empty tensors");

  llvm::DenseSet<Value> colSide = columnSide(ops);
  llvm::DenseSet<Operation *> members(ops.begin(), ops.end());
  for (Operation *op : ops) {
    if (isa<ConstantOp>(op))
      continue; // held by its users, like an input
    SmallVector<Rep> in;
    if (failed(operandReps(plan, op, members, full, colSide, in, reason)))
      return std::nullopt;
    std::optional<Rep> result = resultRep(op, in, colSide);
    if (!result)
      return fail(Twine("cannot fuse '") + op->getName().getStringRef() + "'");
    plan.reps[op->getResult(0)] = *result;
    // A splat broadcast or reshaped in the group keeps its value.
    if (*result == Rep::Splat && isa<BroadcastOp, ReshapeOp>(op))
      if (auto it = plan.splats.find(op->getOperand(0));
          it != plan.splats.end())
        plan.splats[op->getResult(0)] = it->second;
  }
  if (!outputsStorable(plan, outputs, full))
    return fail("an output would have to materialize a broadcast");
  foldLongRows(plan, ops, outputs, rowLength);
  return plan;
}

bool mlir::neuron::isExactWidening(Type from, Type to) {
  return isa<FloatType>(from) && from.getIntOrFloatBitWidth() < 32 &&
         to.isF32();
}

bool mlir::neuron::isTensorESum(Operation *op) {
  auto r = dyn_cast<ReduceOp>(op);
  if (!r || r.getFn() != ReduceFn::sum)
    return false;
  Type elt = cast<RankedTensorType>(r.getType()).getElementType();
  return elt.isBF16() || elt.isF16() || elt.isF32();
}

bool mlir::neuron::isColumnSum(Operation *op) {
  if (!isTensorESum(op))
    return false;
  auto r = cast<ReduceOp>(op);
  auto t = r.getInput().getDefiningOp<TransposeOp>();
  if (!t)
    return false;
  auto perm = t.getPermutation();
  int64_t kept = (int64_t)perm.size() - (int64_t)r.getCount();
  return kept > 0 && perm[kept - 1] == (int64_t)perm.size() - 1;
}
