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
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseMap.h"

#include <limits>

namespace mlir::neuron {
#define GEN_PASS_DEF_NISAINSERTSYNC
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

using namespace mlir;

namespace {

constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 4;

/// First and last value of a loop's iv and its step (constant bounds).
/// A size-generic loop's upper bound is known at run time only (issue #16):
/// it has no last value, and what it moves reaches without bound.
struct LoopRange {
  int64_t first, last, step;
  bool bounded = true;
};

std::optional<LoopRange> rangeOf(scf::ForOp loop) {
  auto lb = nisa::affineIndexOf(loop.getLowerBound());
  auto ub = nisa::affineIndexOf(loop.getUpperBound());
  auto step = nisa::affineIndexOf(loop.getStep());
  if (!lb || !step || !lb->terms.empty() || !step->terms.empty() ||
      step->constant <= 0)
    return std::nullopt;
  if (!ub || !ub->terms.empty())
    return LoopRange{lb->constant, lb->constant, step->constant, false};
  int64_t first = lb->constant, end = ub->constant, s = step->constant;
  int64_t last = end > first ? first + (end - first - 1) / s * s : first;
  return LoopRange{first, last, s};
}

/// What an access covers along one dimension, over every loop iteration:
/// [lo, hi]; and when a single loop moves it, where it starts (phase +
/// k * period, k = 0, 1, ...) and how far past its start it reaches.
struct Span {
  int64_t lo = 0, hi = kUnbounded;
  int64_t period = 0, phase = 0, extent = 0;
  Operation *loop = nullptr;
};

using Terms = ArrayRef<std::pair<Value, int64_t>>; // (iv, coefficient)

std::optional<Span> spanOf(int64_t constant, Terms terms, int64_t extent) {
  Span s;
  s.lo = s.hi = constant;
  bool unbounded = false;
  for (auto [iv, coeff] : terms) {
    auto r = rangeOf(scf::getForInductionVarOwner(iv));
    if (!r || (!r->bounded && coeff < 0))
      return std::nullopt;
    unbounded |= !r->bounded;
    s.lo += std::min(coeff * r->first, coeff * r->last);
    s.hi += std::max(coeff * r->first, coeff * r->last);
  }
  s.hi = unbounded ? kUnbounded : s.hi + extent;
  if (terms.size() == 1 && terms[0].second > 0) {
    scf::ForOp loop = scf::getForInductionVarOwner(terms[0].first);
    auto r = *rangeOf(loop);
    s.period = terms[0].second * r.step;
    s.phase = ((constant + terms[0].second * r.first) % s.period + s.period) %
              s.period;
    s.extent = extent;
    s.loop = loop;
  }
  return s;
}

Span whole(int64_t lo, int64_t hi) {
  Span s;
  s.lo = lo;
  s.hi = hi;
  return s;
}

/// Two spans never meet: their intervals are apart, or one loop moves both
/// by a period longer than they reach and their starts differ enough.
bool apart(const Span &x, const Span &y) {
  if (x.hi < y.lo || y.hi < x.lo)
    return true;
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

/// What one operand touches: a storage (an on-chip memory, or an HBM
/// buffer) and, over every loop iteration, the bytes of each partition on
/// chip or the elements in HBM: as one linear span, and in HBM also as a
/// box of rows x columns of the buffer's innermost dim when the view stays
/// within rows.
struct Access {
  const void *storage;
  bool write;
  Span linear;
  bool boxed = false;
  Span rows, cols;
  /// A size-generic kernel's offset part known at run time only (issue
  /// #16): (value, coefficient) terms; spans compare only over equal ones.
  SmallVector<std::pair<Value, int64_t>, 1> symbolic;

  /// The spans a loop may move.
  SmallVector<const Span *, 3> spans() const {
    if (boxed)
      return {&linear, &rows, &cols};
    return {&linear};
  }
};

bool apart(const Access &x, const Access &y) {
  if (x.symbolic != y.symbolic)
    return false;
  if (apart(x.linear, y.linear))
    return true;
  return x.boxed && y.boxed && (apart(x.rows, y.rows) || apart(x.cols, y.cols));
}

struct Instruction {
  Operation *op;
  nisa::Engine engine; // the queue that issues it
  bool dma;
  SmallVector<Access, 4> accesses;
  SmallVector<Operation *, 4> loops; // enclosing scf.for ops
  /// The nearest earlier compute instruction of the same queue, or -1.
  int64_t queuePredecessor = -1;
};

/// An on-chip operand: its memory and, in every partition, the bytes of
/// its tile (at `address`) that it reaches.
Access onChipAccess(MemRefType type, nisa::MemorySpace space,
                    IntegerAttr address, bool write,
                    const std::optional<nisa::AffineIndex> &offset,
                    ArrayRef<int64_t> sizes, ArrayRef<int64_t> strides,
                    ArrayRef<std::pair<Value, int64_t>> symbolic,
                    MLIRContext *ctx) {
  // Distinct, stable keys for the two on-chip memories.
  const void *storage =
      nisa::MemorySpaceAttr::get(ctx, space).getAsOpaquePointer();
  int64_t begin = address.getInt();
  int64_t bytes = nisa::bytesPerPartition(type);
  int64_t elt = std::max<int64_t>(1, type.getElementTypeBitWidth() / 8);
  Access access{storage, write, whole(begin, begin + bytes - 1)};
  access.symbolic.assign(symbolic.begin(), symbolic.end());
  // A view whose partition stride is the tile's row covers, in every
  // partition, the bytes its free dims reach from its offset.
  if (offset && !strides.empty() && strides[0] * elt == bytes) {
    int64_t reach = 0;
    for (size_t d = 1; d < sizes.size(); ++d)
      reach += (sizes[d] - 1) * strides[d];
    SmallVector<std::pair<Value, int64_t>, 2> byteTerms;
    for (auto [iv, coeff] : offset->terms)
      byteTerms.push_back({iv, coeff * elt});
    auto span = spanOf(begin + offset->constant * elt, byteTerms,
                       (reach + 1) * elt - 1);
    if (span && span->lo >= begin && span->hi < begin + bytes)
      access.linear = *span;
  }
  return access;
}

/// An HBM operand: its buffer, the elements it reaches as one span and,
/// when no term or stride wraps a row, as rows x columns of the innermost
/// dim.
Access hbmAccess(Value base, MemRefType type, bool write,
                 const std::optional<nisa::AffineIndex> &offset,
                 ArrayRef<int64_t> sizes, ArrayRef<int64_t> strides,
                 ArrayRef<std::pair<Value, int64_t>> symbolic) {
  // Every use of one constant global is the same storage.
  const void *storage = base.getAsOpaquePointer();
  if (auto global = base.getDefiningOp<memref::GetGlobalOp>())
    storage = global.getNameAttr().getAsOpaquePointer();
  Access access{storage, write, whole(0, kUnbounded)};
  access.symbolic.assign(symbolic.begin(), symbolic.end());
  if (!offset)
    return access;
  int64_t reach = 0;
  for (auto [size, stride] : llvm::zip(sizes, strides))
    reach += (size - 1) * stride;
  if (auto span = spanOf(offset->constant, offset->terms, reach))
    access.linear = *span;
  int64_t row = type.getRank() > 1 ? type.getShape().back() : 0;
  // Rows and columns of a symbolic offset compare only if it moves whole
  // rows.
  if (row <= 1 || llvm::any_of(symbolic, [&](auto &t) {
        return t.second % row != 0;
      }))
    return access;
  SmallVector<std::pair<Value, int64_t>, 2> rowTerms, colTerms;
  for (auto [iv, coeff] : offset->terms)
    (coeff % row == 0 ? rowTerms : colTerms)
        .push_back({iv, coeff % row == 0 ? coeff / row : coeff});
  int64_t rowReach = 0, colReach = 0;
  for (auto [size, stride] : llvm::zip(sizes, strides)) {
    if (stride % row == 0)
      rowReach += (size - 1) * (stride / row);
    else if (stride < row)
      colReach += (size - 1) * stride;
    else
      return access;
  }
  auto rows = spanOf(offset->constant / row, rowTerms, rowReach);
  auto cols = spanOf(offset->constant % row, colTerms, colReach);
  if (rows && cols && cols->lo >= 0 && cols->hi < row) {
    access.boxed = true;
    access.rows = *rows;
    access.cols = *cols;
  }
  return access;
}

/// An index as an affine function of loop ivs plus terms in other index
/// values (a size-generic kernel's sizes), which `symbolic` collects.
nisa::AffineIndex
affineWithSymbols(Value index,
                  SmallVector<std::pair<Value, int64_t>, 1> &symbolic) {
  nisa::AffineIndex out;
  std::function<void(Value, int64_t)> walk = [&](Value x, int64_t k) {
    if (auto c = x.getDefiningOp<arith::ConstantIndexOp>()) {
      out.constant += k * c.value();
      return;
    }
    if (auto add = x.getDefiningOp<arith::AddIOp>()) {
      walk(add.getLhs(), k);
      walk(add.getRhs(), k);
      return;
    }
    if (auto mul = x.getDefiningOp<arith::MulIOp>())
      for (auto [y, z] : {std::pair(mul.getLhs(), mul.getRhs()),
                          std::pair(mul.getRhs(), mul.getLhs())})
        if (auto c = z.getDefiningOp<arith::ConstantIndexOp>())
          return walk(y, k * c.value());
    auto add = [&](auto &terms) {
      for (auto &[v, coeff] : terms)
        if (v == x) {
          coeff += k;
          return;
        }
      terms.push_back({x, k});
    };
    if (scf::getForInductionVarOwner(x))
      add(out.terms);
    else
      add(symbolic);
  };
  walk(index, 1);
  llvm::sort(symbolic, [](auto &a, auto &b) {
    return a.first.getAsOpaquePointer() < b.first.getAsOpaquePointer();
  });
  return out;
}

/// The storage and spans of a memref operand, or failure with a diagnostic.
FailureOr<Access> accessOf(Operation *user, Value v, bool write,
                           MLIRContext *ctx) {
  Value base = v;
  std::optional<nisa::AffineIndex> offset;
  SmallVector<std::pair<Value, int64_t>, 1> symbolic;
  SmallVector<int64_t> sizes, strides;
  if (auto view = v.getDefiningOp<memref::ReinterpretCastOp>()) {
    base = view.getSource();
    OpFoldResult off = view.getMixedOffsets().front();
    if (auto attr = dyn_cast<Attribute>(off))
      offset = nisa::AffineIndex{cast<IntegerAttr>(attr).getInt(), {}};
    else
      offset = affineWithSymbols(cast<Value>(off), symbolic);
    sizes.assign(view.getStaticSizes().begin(), view.getStaticSizes().end());
    strides = nisa::viewStrides(view);
    // A size known only at run time (issue #16): the whole tile or buffer,
    // whatever the sizes, so the waits hold for every instance.
    if (llvm::any_of(strides, [](int64_t s) { return s < 0; }) ||
        llvm::any_of(sizes, ShapedType::isDynamic))
      offset.reset();
  }
  auto type = cast<MemRefType>(base.getType());
  nisa::MemorySpace space = nisa::getMemorySpace(type);
  if (space == nisa::MemorySpace::hbm)
    return hbmAccess(base, type, write, offset, sizes, strides, symbolic);
  auto alloc = base.getDefiningOp<memref::AllocOp>();
  auto address = alloc
                     ? alloc->getAttrOfType<IntegerAttr>(nisa::kAddressAttrName)
                     : IntegerAttr();
  if (!address)
    return user->emitOpError("reads or writes an on-chip tile without a "
                             "nisa.address (run nisa-allocate first)");
  return onChipAccess(type, space, address, write, offset, sizes, strides,
                      symbolic, ctx);
}

/// An access that the innermost loop around its instruction moves by more
/// than it reaches meets the instruction's other instances only in other
/// iterations of the outer loops.
bool movesWithInnermostLoop(const Instruction &inst, const Access &x) {
  if (inst.loops.empty())
    return false;
  return llvm::any_of(x.spans(), [&](const Span *s) {
    return s->period > s->extent && s->loop == inst.loops.front();
  });
}

bool touches(const Access &x, const Access &y) {
  return (x.write || y.write) && x.storage == y.storage && !apart(x, y);
}

/// Whether instances of `a` and `b` touch a common byte, one writing.
bool conflict(const Instruction &a, const Instruction &b) {
  for (const Access &x : a.accesses)
    for (const Access &y : b.accesses) {
      if (&a == &b && &x == &y && movesWithInnermostLoop(a, x) &&
          a.loops.size() == 1)
        continue;
      if (touches(x, y))
        return true;
    }
  return false;
}

/// An instruction conflicts with its own earlier instances only across
/// iterations of loops outside its innermost one.
bool selfConflictSkipsInnermost(const Instruction &a) {
  for (const Access &x : a.accesses)
    for (const Access &y : a.accesses)
      if (touches(x, y) && !(&x == &y && movesWithInnermostLoop(a, x)))
        return false;
  return true;
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
  return !a.dma && !b.dma && a.engine == b.engine;
}

bool needsWait(const Instruction &a, int64_t aIndex, const Instruction &b,
               int64_t bIndex) {
  return !queueOrdered(a, b) && canPrecede(a, aIndex, b, bIndex) &&
         conflict(a, b);
}

/// The waits of every instruction, as lists and as bit sets for lookup.
struct Waits {
  std::vector<SmallVector<int64_t>> lists;
  std::vector<llvm::BitVector> sets;
  explicit Waits(int64_t n) : lists(n), sets(n, llvm::BitVector(n)) {}
  bool has(int64_t b, int64_t a) const { return sets[b].test(a); }
  void add(int64_t b, int64_t a) {
    lists[b].push_back(a);
    sets[b].set(a);
  }
};

/// A loop whose body runs at least once: constant bounds, not empty.
bool alwaysIterates(Operation *op) {
  auto loop = cast<scf::ForOp>(op);
  std::optional<int64_t> lb = getConstantIntValue(loop.getLowerBound());
  std::optional<int64_t> ub = getConstantIntValue(loop.getUpperBound());
  return lb && ub && *ub > *lb;
}

/// Instruction `b` need not wait for `a` when it waits for (or follows on
/// its queue) an instruction `c` that itself waited for `a`, provided no
/// instance of `a` can run between the instance of `c` that `b` waits for
/// and `b`. Two cases:
///  - c before b: in every iteration c runs before b, so `a` must not sit
///    between them (c < a < b); `a` may come after b in a shared loop;
///  - c after b, in a loop around both: b follows c of the previous
///    iteration, so `a` must sit in [b, c] (inside that loop).
/// In both, c runs inside every loop around both a and b. Witnesses after
/// b are used only once their waits are final (b runs in decreasing order
/// in that case), so justifications never go round.
bool covered(ArrayRef<Instruction> insts, const Waits &waits, int64_t a,
             int64_t b, bool loopCarried) {
  auto waitedFor = [&](int64_t c) {
    return c != a && c != b &&
           (waits.has(c, a) || queueOrdered(insts[a], insts[c]));
  };
  // The instance of c that b follows must come after the instances of a
  // that b needs; those include a's instances in earlier iterations of any
  // loop around both, so c must run inside every such loop.
  // (For an instruction whose instances meet only across outer iterations,
  // its innermost loop does not count.)
  Operation *skipped =
      a == b && !insts[a].loops.empty() && selfConflictSkipsInnermost(insts[a])
          ? insts[a].loops.front()
          : nullptr;
  auto insideSharedLoops = [&](int64_t c) {
    return llvm::all_of(insts[a].loops, [&](Operation *loop) {
      return loop == skipped || !llvm::is_contained(insts[b].loops, loop) ||
             llvm::is_contained(insts[c].loops, loop);
    });
  };
  // A witness in a loop that does not hold b and may run no iteration (a
  // trip count known only at run time) may never run: a wait on it is then
  // met at once and says nothing of `a`.
  auto runsBeforeB = [&](int64_t c) {
    return llvm::all_of(insts[c].loops, [&](Operation *loop) {
      return llvm::is_contained(insts[b].loops, loop) || alwaysIterates(loop);
    });
  };
  auto covers = [&](int64_t c) {
    if (!waitedFor(c) || !insideSharedLoops(c) || !runsBeforeB(c))
      return false;
    if (!loopCarried)
      return c < b && !(c < a && a < b);
    return c > b && b <= a && a < c && canPrecede(insts[c], c, insts[b], b);
  };
  if (llvm::any_of(waits.lists[b], covers))
    return true;
  // The nearest earlier instruction of b's own queue runs before b.
  int64_t c = insts[b].queuePredecessor;
  return !loopCarried && c >= 0 && covers(c);
}

/// The instructions of `func` in program order, with their accesses and
/// enclosing loops (failure, with a diagnostic, on an access it cannot
/// summarize).
FailureOr<std::vector<Instruction>> collectInstructions(func::FuncOp func) {
  MLIRContext *ctx = func.getContext();
  std::vector<Instruction> insts;
  WalkResult walk = func.walk<WalkOrder::PreOrder>([&](Operation *op) {
    auto instruction = dyn_cast<nisa::InstructionOpInterface>(op);
    if (!instruction)
      return WalkResult::advance();
    Instruction inst{
        op, instruction.getIssuingEngine(), instruction.isDma(), {}, {}};
    // Every written operand is a write (an activation's row sums as much
    // as its dst); index operands (an iota's offset) touch no memory.
    SmallVector<Value, 2> written = instruction.getWrittenOperands();
    for (Value operand : op->getOperands()) {
      if (!isa<MemRefType>(operand.getType()))
        continue;
      auto access =
          accessOf(op, operand, llvm::is_contained(written, operand), ctx);
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
  return insts;
}

/// Each compute instruction's nearest earlier one on its queue.
void linkQueues(std::vector<Instruction> &insts) {
  int64_t lastOnQueue[5] = {-1, -1, -1, -1, -1};
  for (int64_t b = 0; b < (int64_t)insts.size(); ++b) {
    Instruction &inst = insts[b];
    if (inst.dma)
      continue;
    int64_t &last = lastOnQueue[(int)inst.engine];
    inst.queuePredecessor = last;
    last = b;
  }
}

/// Only instructions that touch a common region can conflict: an HBM
/// buffer is one region, the on-chip memories are cut into 1 KiB of a
/// partition (their spans are always bounded; half a PSUM bank, so that
/// the slots of a bank are apart). The instructions touching each region,
/// in program order.
class RegionIndex {
public:
  RegionIndex(MLIRContext *ctx, const std::vector<Instruction> &insts)
      : sbuf(nisa::MemorySpaceAttr::get(ctx, nisa::MemorySpace::sbuf)
                 .getAsOpaquePointer()),
        psum(nisa::MemorySpaceAttr::get(ctx, nisa::MemorySpace::psum)
                 .getAsOpaquePointer()) {
    for (int64_t b = 0; b < (int64_t)insts.size(); ++b)
      for (const Access &x : insts[b].accesses)
        forEachRegion(x, [&](Region r) {
          SmallVector<int64_t> &users = byRegion[r];
          if (users.empty() || users.back() != b)
            users.push_back(b);
        });
  }

  /// Calls `fn` with every instruction sharing a region with `x` (an
  /// instruction may come more than once).
  template <typename Fn> void forEachSharing(const Access &x, Fn &&fn) {
    forEachRegion(x, [&](Region r) {
      for (int64_t a : byRegion[r])
        fn(a);
    });
  }

private:
  static constexpr int64_t kRegionBytes = 1024;
  using Region = std::pair<const void *, int64_t>;

  template <typename Fn> void forEachRegion(const Access &x, Fn &&fn) const {
    if (x.storage != sbuf && x.storage != psum)
      return fn(Region{x.storage, 0});
    for (int64_t r = x.linear.lo / kRegionBytes;
         r <= x.linear.hi / kRegionBytes; ++r)
      fn(Region{x.storage, r});
  }

  const void *sbuf, *psum;
  llvm::DenseMap<Region, SmallVector<int64_t>> byRegion;
};

/// The waits every instruction needs. Waits implied by an earlier witness
/// are dropped in program order (closest first); then those implied by a
/// later witness in a shared loop, in reverse order.
Waits findWaits(const std::vector<Instruction> &insts, RegionIndex &regions) {
  int64_t n = insts.size();
  // Instructions sharing a region with b, marked by stamping b.
  std::vector<int64_t> seen(n, -1);
  Waits waits(n);
  for (int64_t b = 0; b < n; ++b) {
    for (const Access &x : insts[b].accesses)
      regions.forEachSharing(x, [&](int64_t a) { seen[a] = b; });
    auto consider = [&](int64_t a) {
      if (seen[a] == b && needsWait(insts[a], a, insts[b], b) &&
          !covered(insts, waits, a, b, /*loopCarried=*/false))
        waits.add(b, a);
    };
    for (int64_t a = b - 1; a >= 0; --a)
      consider(a);
    for (int64_t a = b; a < n; ++a)
      consider(a);
  }
  for (int64_t b = n - 1; b >= 0; --b)
    llvm::erase_if(waits.lists[b], [&](int64_t a) {
      bool drop = a >= b && covered(insts, waits, a, b, /*loopCarried=*/true);
      if (drop)
        waits.sets[b].reset(a);
      return drop;
    });
  return waits;
}

/// Numbers the instructions (nisa.id) and lists each one's waits
/// (nisa.waits).
void annotate(func::FuncOp func, const std::vector<Instruction> &insts,
              Waits &waits) {
  MLIRContext *ctx = func.getContext();
  Type i64 = IntegerType::get(ctx, 64);
  for (int64_t b = 0; b < (int64_t)insts.size(); ++b) {
    Operation *op = insts[b].op;
    op->setAttr(nisa::kIdAttrName, IntegerAttr::get(i64, b));
    SmallVector<int64_t> &list = waits.lists[b];
    llvm::sort(list);
    if (list.empty())
      op->removeAttr(nisa::kWaitsAttrName);
    else
      op->setAttr(nisa::kWaitsAttrName, DenseI64ArrayAttr::get(ctx, list));
  }
  func->setAttr(nisa::kSynchronizedAttrName, UnitAttr::get(ctx));
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
  FailureOr<std::vector<Instruction>> insts = collectInstructions(func);
  if (failed(insts))
    return failure();
  linkQueues(*insts);
  RegionIndex regions(&getContext(), *insts);
  Waits waits = findWaits(*insts, regions);
  annotate(func, *insts, waits);
  return success();
}

} // namespace
