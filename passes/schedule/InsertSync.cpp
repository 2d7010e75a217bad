//===- InsertSync.cpp - semaphore waits between dependent instructions ----===//
//
// Every instruction's accesses are summarized as (storage, byte or element
// range over all loop iterations, read/write). Two instructions conflict
// when they touch overlapping ranges of one storage and one of them writes;
// the later one then waits for the earlier one unless both are compute
// instructions of the same in-order queue. Ranges are conservative (the
// union over every iteration), so a wait may be stronger than needed but
// never missing; the timing model re-checks this on every instance.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "dialects/nisa/NisaDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"

#include <functional>
#include <limits>

namespace mlir::neuron {
#define GEN_PASS_DEF_NISAINSERTSYNC
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

using namespace mlir;

namespace {

constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

/// [lo, hi] of an index over every iteration of the enclosing loops.
struct Interval {
  int64_t lo, hi;
};

std::optional<Interval> intervalOf(Value v) {
  if (auto c = v.getDefiningOp<arith::ConstantIndexOp>())
    return Interval{c.value(), c.value()};
  if (auto add = v.getDefiningOp<arith::AddIOp>()) {
    auto l = intervalOf(add.getLhs()), r = intervalOf(add.getRhs());
    if (l && r)
      return Interval{l->lo + r->lo, l->hi + r->hi};
    return std::nullopt;
  }
  if (auto mul = v.getDefiningOp<arith::MulIOp>()) {
    auto l = intervalOf(mul.getLhs()), r = intervalOf(mul.getRhs());
    if (!l || !r)
      return std::nullopt;
    if (r->lo != r->hi)
      std::swap(l, r);
    if (r->lo != r->hi)
      return std::nullopt;
    int64_t a = l->lo * r->lo, b = l->hi * r->lo;
    return Interval{std::min(a, b), std::max(a, b)};
  }
  if (auto loop = scf::getForInductionVarOwner(v)) {
    auto lb = intervalOf(loop.getLowerBound());
    auto ub = intervalOf(loop.getUpperBound());
    auto step = intervalOf(loop.getStep());
    if (!lb || !ub || !step || lb->lo != lb->hi || ub->lo != ub->hi ||
        step->lo != step->hi || step->lo <= 0)
      return std::nullopt;
    int64_t lastIv = ub->lo > lb->lo
                         ? lb->lo + (ub->lo - lb->lo - 1) / step->lo * step->lo
                         : lb->lo;
    return Interval{lb->lo, lastIv};
  }
  return std::nullopt;
}

/// What one operand touches: a storage (an on-chip memory, or an HBM
/// buffer) and the range of it, in bytes per partition on chip and in
/// elements in HBM.
struct Access {
  const void *storage;
  Interval range;
  bool write;
  /// HBM views moved by one loop: the view starts at phase + k * period
  /// (k = 0, 1, ...) and spans `extent` elements past its start.
  int64_t period = 0, phase = 0, extent = 0;
};

/// The period and phase of an offset `c + coeff * iv` over one scf.for.
std::optional<std::pair<int64_t, int64_t>> periodOf(Value offset) {
  int64_t constant = 0, coeff = 0;
  Value iv;
  std::function<bool(Value, int64_t)> walk = [&](Value v, int64_t k) {
    if (auto c = v.getDefiningOp<arith::ConstantIndexOp>()) {
      constant += k * c.value();
      return true;
    }
    if (auto add = v.getDefiningOp<arith::AddIOp>())
      return walk(add.getLhs(), k) && walk(add.getRhs(), k);
    if (auto mul = v.getDefiningOp<arith::MulIOp>()) {
      for (auto [x, y] : {std::pair(mul.getLhs(), mul.getRhs()),
                          std::pair(mul.getRhs(), mul.getLhs())})
        if (auto c = y.getDefiningOp<arith::ConstantIndexOp>())
          return walk(x, k * c.value());
      return false;
    }
    if (scf::getForInductionVarOwner(v) && (!iv || iv == v)) {
      iv = v;
      coeff += k;
      return true;
    }
    return false;
  };
  if (!walk(offset, 1) || !iv || coeff <= 0)
    return std::nullopt;
  auto loop = scf::getForInductionVarOwner(iv);
  auto lb = intervalOf(loop.getLowerBound());
  auto step = intervalOf(loop.getStep());
  if (!lb || !step || lb->lo != lb->hi || step->lo != step->hi || step->lo <= 0)
    return std::nullopt;
  int64_t period = coeff * step->lo;
  int64_t phase = ((constant + coeff * lb->lo) % period + period) % period;
  return std::pair(period, phase);
}

struct Instruction {
  Operation *op;
  nisa::Issue issue;
  SmallVector<Access, 4> accesses;
  SmallVector<Operation *, 4> loops; // enclosing scf.for ops
};

/// The storage and range of a memref operand, or failure with a diagnostic.
FailureOr<Access> accessOf(Operation *user, Value v, bool write,
                           MLIRContext *ctx) {
  // The element range a view covers (over every loop iteration), measured
  // from its base; the whole base when unknown.
  Value base = v;
  std::optional<Interval> range;
  std::optional<std::pair<int64_t, int64_t>> period;
  int64_t partitionStride = 0, extent = 0;
  if (auto view = v.getDefiningOp<memref::ReinterpretCastOp>()) {
    base = view.getSource();
    OpFoldResult off = view.getMixedOffsets().front();
    std::optional<Interval> offset;
    if (auto attr = dyn_cast<Attribute>(off))
      offset = Interval{cast<IntegerAttr>(attr).getInt(),
                        cast<IntegerAttr>(attr).getInt()};
    else {
      offset = intervalOf(cast<Value>(off));
      period = periodOf(cast<Value>(off));
    }
    auto sizes = view.getStaticSizes(), strides = view.getStaticStrides();
    if (offset && llvm::all_of(strides, [](int64_t s) { return s >= 0; })) {
      // On chip, the partition dim is not part of a partition's bytes.
      bool onChip = nisa::getMemorySpace(view.getType()) != nisa::MemorySpace::hbm;
      for (size_t d = onChip ? 1 : 0; d < sizes.size(); ++d)
        extent += (sizes[d] - 1) * strides[d];
      range = Interval{offset->lo, offset->hi + extent};
      partitionStride = strides.empty() ? 0 : strides.front();
    }
  }

  auto type = cast<MemRefType>(base.getType());
  nisa::MemorySpace space = nisa::getMemorySpace(type);
  if (space != nisa::MemorySpace::hbm) {
    auto alloc = base.getDefiningOp<memref::AllocOp>();
    auto address =
        alloc ? alloc->getAttrOfType<IntegerAttr>(nisa::kAddressAttrName)
              : IntegerAttr();
    if (!address)
      return user->emitOpError("reads or writes an on-chip tile without a "
                               "nisa.address (run nisa-allocate first)");
    // Distinct, stable keys for the two on-chip memories.
    const void *storage =
        nisa::MemorySpaceAttr::get(ctx, space).getAsOpaquePointer();
    int64_t begin = address.getInt();
    int64_t bytes = nisa::bytesPerPartition(type);
    int64_t elt = std::max<int64_t>(1, type.getElementTypeBitWidth() / 8);
    int64_t rowElements = bytes / elt;
    // A view that starts in partition 0's row and stays in it (rows being
    // the tile's partitions) covers those bytes of every partition.
    if (range && partitionStride == rowElements && range->lo >= 0 &&
        range->hi < rowElements)
      return Access{storage,
                    {begin + range->lo * elt, begin + (range->hi + 1) * elt - 1},
                    write};
    return Access{storage, {begin, begin + bytes - 1}, write};
  }
  if (!range)
    range = Interval{0, kUnbounded};
  // Every use of one constant global is the same storage.
  const void *storage = base.getAsOpaquePointer();
  if (auto global = base.getDefiningOp<memref::GetGlobalOp>())
    storage = global.getNameAttr().getAsOpaquePointer();
  Access access{storage, *range, write};
  if (period && range->hi != kUnbounded) {
    access.period = period->first;
    access.phase = period->second;
    access.extent = extent;
  }
  return access;
}

/// Two periodic views with one period never meet when their windows within
/// a period are disjoint (compared round the period, as residues).
bool disjointPeriodic(const Access &x, const Access &y) {
  int64_t p = x.period;
  if (p <= 0 || y.period != p || x.extent + y.extent + 2 > p)
    return false;
  for (int64_t shift : {-p, int64_t(0), p}) {
    int64_t lo = y.phase + shift, hi = lo + y.extent;
    if (x.phase <= hi && lo <= x.phase + x.extent)
      return false;
  }
  return true;
}

bool conflict(const Instruction &a, const Instruction &b) {
  for (const Access &x : a.accesses)
    for (const Access &y : b.accesses)
      if ((x.write || y.write) && x.storage == y.storage &&
          x.range.lo <= y.range.hi && y.range.lo <= x.range.hi &&
          !disjointPeriodic(x, y))
        return true;
  return false;
}

/// Some instance of `earlier` can precede some instance of `later` in
/// program order: it comes first, or a loop around both runs again.
bool canPrecede(const Instruction &earlier, size_t earlierIndex,
                const Instruction &later, size_t laterIndex) {
  if (earlierIndex < laterIndex)
    return true;
  return llvm::any_of(earlier.loops, [&](Operation *loop) {
    return llvm::is_contained(later.loops, loop);
  });
}

/// Compute instructions of one queue run in order: no semaphore between them.
bool queueOrdered(const Instruction &a, const Instruction &b) {
  return !a.issue.dma && !b.issue.dma && a.issue.engine == b.issue.engine;
}

bool needsWait(const Instruction &a, int64_t aIndex, const Instruction &b,
               int64_t bIndex) {
  return !queueOrdered(a, b) && canPrecede(a, aIndex, b, bIndex) &&
         conflict(a, b);
}

/// Instruction `b` need not wait for `a` when it waits for (or follows on
/// its queue) an instruction `c` that itself waited for `a`, provided no
/// instance of `a` can run between the instance of `c` that `b` waits for
/// and `b`. Two cases:
///  - c before b: in every iteration c runs before b, so `a` must not sit
///    between them (c < a < b); `a` may come after b in a shared loop;
///  - c after b, in a loop around both: b follows c of the previous
///    iteration, so `a` must sit in [b, c] (inside that loop).
/// Witnesses after b are used only once their waits are final (b runs in
/// decreasing order in that case), so justifications never go round.
bool covered(ArrayRef<Instruction> insts, ArrayRef<SmallVector<int64_t>> waits,
             int64_t a, int64_t b, bool loopCarried) {
  auto waitedFor = [&](int64_t c) {
    return c != a && c != b &&
           (llvm::is_contained(waits[c], a) ||
            queueOrdered(insts[a], insts[c]));
  };
  auto covers = [&](int64_t c) {
    if (!waitedFor(c))
      return false;
    if (!loopCarried)
      return c < b && !(c < a && a < b);
    return c > b && b <= a && a < c && canPrecede(insts[c], c, insts[b], b);
  };
  if (llvm::any_of(waits[b], covers))
    return true;
  // The nearest earlier instruction of b's own queue runs before b.
  for (int64_t c = b - 1; !loopCarried && c >= 0; --c)
    if (queueOrdered(insts[c], insts[b]))
      return covers(c);
  return false;
}

struct NisaInsertSyncPass
    : public mlir::neuron::impl::NisaInsertSyncBase<NisaInsertSyncPass> {
  using NisaInsertSyncBase::NisaInsertSyncBase;

  LogicalResult synchronize(func::FuncOp func);

  void runOnOperation() override {
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (func->hasAttr("nisa.kernel") && failed(synchronize(func)))
        return signalPassFailure();
  }
};

LogicalResult NisaInsertSyncPass::synchronize(func::FuncOp func) {
  MLIRContext *ctx = &getContext();
  std::vector<Instruction> insts;
  WalkResult walk = func.walk<WalkOrder::PreOrder>([&](Operation *op) {
    std::optional<nisa::Issue> issue = nisa::issueOf(op);
    if (!issue)
      return WalkResult::advance();
    Instruction inst{op, *issue, {}, {}};
    Value written = nisa::writtenOperand(op);
    for (Value operand : op->getOperands()) {
      auto access = accessOf(op, operand, operand == written, ctx);
      if (failed(access))
        return WalkResult::interrupt();
      inst.accesses.push_back(*access);
    }
    for (Operation *p = op->getParentOp(); p != func; p = p->getParentOp())
      if (isa<scf::ForOp>(p))
        inst.loops.push_back(p);
    insts.push_back(std::move(inst));
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();

  // Waits implied by an earlier witness are dropped in program order
  // (closest first); then those implied by a later witness in a shared
  // loop, in reverse order.
  int64_t n = insts.size();
  std::vector<SmallVector<int64_t>> waits(n);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t a = b - 1; a >= 0; --a)
      if (needsWait(insts[a], a, insts[b], b) &&
          !covered(insts, waits, a, b, /*loopCarried=*/false))
        waits[b].push_back(a);
    for (int64_t a = b; a < n; ++a)
      if (needsWait(insts[a], a, insts[b], b) &&
          !covered(insts, waits, a, b, /*loopCarried=*/false))
        waits[b].push_back(a);
  }
  for (int64_t b = n - 1; b >= 0; --b)
    llvm::erase_if(waits[b], [&](int64_t a) {
      return a >= b && covered(insts, waits, a, b, /*loopCarried=*/true);
    });
  Type i64 = IntegerType::get(ctx, 64);
  for (int64_t b = 0; b < n; ++b) {
    Operation *op = insts[b].op;
    op->setAttr(nisa::kIdAttrName, IntegerAttr::get(i64, b));
    llvm::sort(waits[b]);
    if (waits[b].empty())
      op->removeAttr(nisa::kWaitsAttrName);
    else
      op->setAttr(nisa::kWaitsAttrName, DenseI64ArrayAttr::get(ctx, waits[b]));
  }
  func->setAttr(nisa::kSynchronizedAttrName, UnitAttr::get(ctx));
  return success();
}

} // namespace
