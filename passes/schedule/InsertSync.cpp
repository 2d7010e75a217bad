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
// A size-generic kernel (issue #16) has offsets, extents and loop counts
// that are functions of its size parameter n. With one parameter, each
// access's bounds are also summarized as functions of n, and two accesses
// are apart when, for every n, one of them does not run or their ranges are
// disjoint (SizeFunctions says how a finite window of sizes proves that).
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "dialects/neuron/NeuronDialect.h"
#include "dialects/nisa/NisaDialect.h"
#include "runtime/program/Error.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SparseBitVector.h"

#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <set>

namespace mlir::neuron {
#define GEN_PASS_DEF_NISAINSERTSYNC
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

using namespace mlir;
namespace rt = ::neuron::runtime;

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

/// An integer function of the size parameter n: constant + sum(coefficient *
/// function), the functions being a SizeFunctions table's (issue #16).
struct Linear {
  int64_t constant = 0;
  SmallVector<std::pair<int, int64_t>, 4> terms; // (function id, coefficient)

  void add(int fn, int64_t coeff) {
    for (auto &[f, c] : terms)
      if (f == fn) {
        c += coeff;
        return;
      }
    terms.push_back({fn, coeff});
  }
};

class SizeFunctions;

/// An access of a size-generic kernel, as functions of its size parameter:
/// the range it covers over every loop iteration (lo and hi, inclusive) and,
/// in HBM, its rows (its columns do not depend on n), and the trip counts
/// known at run time of the loops around it (it runs when all are positive).
struct Sized {
  const SizeFunctions *fns = nullptr;
  Linear lo, hi;
  bool boxed = false;
  Linear rowLo, rowHi;
  Span cols;
  SmallVector<int, 2> counts;
  /// After SizeFunctions::sample(): the window's sizes at which every loop
  /// around it runs (or whose trip count is unknown).
  llvm::BitVector running;
};

/// The functions of the size parameter n (n >= min, up to max when known)
/// that a kernel's accesses use, and how they decide "for every n".
///
/// Every expression of the size grammar is quasi-linear: from some `from`
/// on, f(n + period) = f(n) + slope. Sums and constant multiples keep this
/// (the least common period); floordiv, ceildiv and mod by a constant d
/// stretch the period until its step is a multiple of d; min and max settle
/// on one operand once their difference has moved past zero for good (or
/// keep a periodic difference). With one period L and start N common to all
/// functions, a condition "some g_i(n) >= 0" holds for every n when it holds
/// at each n below N + L, and from N on through a g_i that does not fall
/// (slope >= 0): g_i(n + kL) >= g_i(n). The window [min, N + L) is sampled
/// once; a function that is not quasi-linear (a product of sizes) or whose
/// window is too large is unknown, and conditions on it do not hold.
class SizeFunctions {
public:
  SizeFunctions(Value param, std::string name, int64_t min,
                std::optional<int64_t> max)
      : param(param), name(std::move(name)), min(min), max(max) {}

  /// The kernel's size parameter when it has exactly one (else nullptr).
  static std::unique_ptr<SizeFunctions> of(func::FuncOp func) {
    std::unique_ptr<SizeFunctions> out;
    for (BlockArgument arg : func.getArguments()) {
      auto size = func.getArgAttrOfType<DictionaryAttr>(
          arg.getArgNumber(), mlir::neuron::kSizeAttrName);
      if (!size || !arg.getType().isIndex())
        continue;
      auto argName = size.getAs<StringAttr>("name");
      auto lo = size.getAs<IntegerAttr>("min");
      if (out || !argName || !lo)
        return nullptr;
      std::optional<int64_t> hi;
      if (auto attr = size.getAs<IntegerAttr>("max"))
        hi = attr.getInt();
      out =
          std::make_unique<SizeFunctions>(arg, argName.str(), lo.getInt(), hi);
    }
    return out;
  }

  /// The id of the function of n that index `v` computes, or -1 (it
  /// depends on a loop iv or on an op that is no size function).
  int functionOf(Value v) {
    auto [it, inserted] = byValue.try_emplace(v, -1);
    if (inserted)
      if (auto e = exprOf(v))
        it->second = addFunction(std::move(*e));
    return it->second;
  }

  /// The id of the trip count of `loop` (lower bound and step constant),
  /// or -1; zero or negative where the loop does not run.
  int tripCountOf(scf::ForOp loop, int64_t lb, int64_t step) {
    auto [it, inserted] = byLoop.try_emplace(loop, -1);
    if (inserted)
      if (auto count = exprOf(loop.getUpperBound())) {
        if (lb != 0)
          count = rt::SizeExpr::binary(Kind::Sub, std::move(*count),
                                       rt::SizeExpr::constant(lb));
        if (step != 1)
          count = rt::SizeExpr::binary(Kind::CeilDiv, std::move(*count),
                                       rt::SizeExpr::constant(step));
        it->second = addFunction(std::move(*count));
      }
    return it->second;
  }

  /// Keeps `s` (its samples are taken by sample()).
  std::shared_ptr<const Sized> keep(Sized s) {
    s.fns = this;
    auto out = std::make_shared<Sized>(std::move(s));
    kept.push_back(out);
    return out;
  }

  /// Analyzes every function and samples them, and the kept accesses, over
  /// the window.
  void sample();

  /// Whether, for every n, `x` or `y` does not run or they are apart.
  bool apart(const Sized &x, const Sized &y) const;

  /// Where `x` and `y` may meet, as a size expression positive at those
  /// sizes (exactly: at the others one of them does not run or they are
  /// apart); nullopt when they meet at every size of the window.
  std::optional<rt::SizeExpr> whereTouching(const Sized &x,
                                            const Sized &y) const;

private:
  using Kind = rt::SizeExpr::Kind;
  struct QuasiLinear {
    int64_t period = 1, from = 0, slope = 0;
  };
  /// A function's samples over the window and its slope over the period.
  struct Samples {
    std::vector<int64_t> values;
    int64_t slope = 0;
    bool known = false;
    /// A kept bound's least and greatest sample.
    int64_t least = 0, greatest = 0;
  };

  std::optional<rt::SizeExpr> exprOf(Value v) const {
    if (auto c = v.getDefiningOp<arith::ConstantIndexOp>())
      return rt::SizeExpr::constant(c.value());
    if (v == param)
      return rt::SizeExpr::param(name);
    Operation *def = v.getDefiningOp();
    auto kind = nisa::sizeFunctionOf(def);
    if (!kind)
      return std::nullopt;
    auto l = exprOf(def->getOperand(0)), r = exprOf(def->getOperand(1));
    if (!l || !r)
      return std::nullopt;
    return rt::SizeExpr::binary(*kind, std::move(*l), std::move(*r));
  }

  int addFunction(rt::SizeExpr e) {
    exprs.push_back(std::move(e));
    return (int)exprs.size() - 1;
  }

  std::optional<int64_t> evaluate(const rt::SizeExpr &e, int64_t n) const {
    try {
      return rt::evaluate(e, rt::SizeEnv{{name, n}});
    } catch (const rt::Error &) {
      return std::nullopt; // overflow, or a divisor that is not positive
    }
  }

  std::optional<QuasiLinear> quasiLinear(const rt::SizeExpr &e) const;
  /// `a` and `b` over one common period from one common start.
  static std::optional<std::pair<QuasiLinear, QuasiLinear>>
  common(QuasiLinear a, QuasiLinear b);
  /// The samples of a kept access's bound.
  Samples sampleLinear(const Linear &l) const;
  /// The known samples of the conditions "first - second - 1 >= 0" (second
  /// below first) of which one holds where `x` and `y` are apart.
  using SamplePair = std::pair<const Samples *, const Samples *>;
  SmallVector<SamplePair, 6> belowSamples(const Sized &x, const Sized &y) const;
  rt::SizeExpr exprOf(const Linear &l) const;
  /// The conditions "value >= 0" of which one holds where x and y are
  /// apart, as functions of n.
  /// `idle`: with "a loop around x or y does not run".
  SmallVector<Linear, 8> apartConditions(const Sized &x, const Sized &y,
                                         bool idle) const;

  static constexpr int64_t kMaxWindow = 1 << 14;

  Value param;
  std::string name;
  int64_t min;
  std::optional<int64_t> max;
  std::vector<rt::SizeExpr> exprs;
  llvm::DenseMap<Value, int> byValue;
  llvm::DenseMap<Operation *, int> byLoop;
  std::vector<std::shared_ptr<Sized>> kept;

  // After sample(): the window [min, min + windowSize), from `from` on
  // checked for good (`tail`), and each function's and bound's samples.
  int64_t windowSize = 0, from = 0;
  bool tail = false;
  std::vector<Samples> functions;
  /// Each kept bound's samples, shared by equal bounds (unrolled code
  /// repeats them: one copy each would take window x 8 bytes per bound).
  llvm::DenseMap<const Linear *, const Samples *> bounds;
  std::map<SmallVector<int64_t, 9>, Samples> boundSamples;
};

std::optional<std::pair<SizeFunctions::QuasiLinear, SizeFunctions::QuasiLinear>>
SizeFunctions::common(QuasiLinear a, QuasiLinear b) {
  int64_t period = std::lcm(a.period, b.period);
  if (period <= 0 || period > kMaxWindow)
    return std::nullopt;
  int64_t start = std::max(a.from, b.from);
  for (QuasiLinear *q : {&a, &b}) {
    if (__builtin_mul_overflow(q->slope, period / q->period, &q->slope))
      return std::nullopt;
    q->period = period;
    q->from = start;
  }
  return std::pair(a, b);
}

std::optional<SizeFunctions::QuasiLinear>
SizeFunctions::quasiLinear(const rt::SizeExpr &e) const {
  switch (e.kind) {
  case Kind::Const:
    return QuasiLinear{1, min, 0};
  case Kind::Param:
    return QuasiLinear{1, min, 1};
  case Kind::Neg: {
    auto q = quasiLinear(e.operands[0]);
    if (q)
      q->slope = -q->slope;
    return q;
  }
  default:
    break;
  }
  auto l = quasiLinear(e.operands[0]), r = quasiLinear(e.operands[1]);
  if (!l || !r)
    return std::nullopt;
  const rt::SizeExpr &rhs = e.operands[1];
  switch (e.kind) {
  case Kind::Add:
  case Kind::Sub: {
    auto c = common(*l, *r);
    if (!c)
      return std::nullopt;
    QuasiLinear out = c->first;
    if (e.kind == Kind::Add
            ? __builtin_add_overflow(out.slope, c->second.slope, &out.slope)
            : __builtin_sub_overflow(out.slope, c->second.slope, &out.slope))
      return std::nullopt;
    return out;
  }
  case Kind::Mul: {
    // A constant times a function.
    const rt::SizeExpr &lhs = e.operands[0];
    QuasiLinear out = lhs.kind == Kind::Const ? *r : *l;
    int64_t k = lhs.kind == Kind::Const ? lhs.value : rhs.value;
    if (lhs.kind != Kind::Const && rhs.kind != Kind::Const)
      return std::nullopt;
    if (__builtin_mul_overflow(out.slope, k, &out.slope))
      return std::nullopt;
    return out;
  }
  case Kind::FloorDiv:
  case Kind::CeilDiv:
  case Kind::Mod: {
    if (rhs.kind != Kind::Const || rhs.value <= 0)
      return std::nullopt;
    int64_t d = rhs.value;
    // Periods until the step is a multiple of d.
    int64_t stretch = d / std::gcd(l->slope, d);
    QuasiLinear out = *l;
    if (__builtin_mul_overflow(out.period, stretch, &out.period) ||
        out.period > kMaxWindow)
      return std::nullopt;
    out.slope = e.kind == Kind::Mod ? 0 : l->slope * stretch / d;
    return out;
  }
  case Kind::Min:
  case Kind::Max: {
    auto c = common(*l, *r);
    if (!c)
      return std::nullopt;
    auto [a, b] = *c;
    int64_t dslope = a.slope - b.slope;
    if (dslope == 0)
      return a; // a - b is periodic: so is the result minus either
    // a - b moves by dslope a period: over one period from `from` find its
    // extreme, then the periods until its sign is settled.
    int64_t extreme = dslope < 0 ? std::numeric_limits<int64_t>::min()
                                 : std::numeric_limits<int64_t>::max();
    for (int64_t n = a.from; n < a.from + a.period; ++n) {
      auto x = evaluate(e.operands[0], n), y = evaluate(e.operands[1], n);
      if (!x || !y)
        return std::nullopt;
      extreme =
          dslope < 0 ? std::max(extreme, *x - *y) : std::min(extreme, *x - *y);
    }
    // dslope < 0: a < b after k periods; dslope > 0: a >= b.
    int64_t k = dslope < 0
                    ? (extreme >= 0 ? extreme / -dslope + 1 : 0)
                    : (extreme < 0 ? (-extreme + dslope - 1) / dslope : 0);
    bool aWins = (dslope < 0) == (e.kind == Kind::Min);
    QuasiLinear out = aWins ? a : b;
    if (k > kMaxWindow / out.period)
      return std::nullopt;
    out.from += k * out.period;
    return out;
  }
  default:
    return std::nullopt;
  }
}

void SizeFunctions::sample() {
  std::vector<std::optional<QuasiLinear>> analyzed;
  QuasiLinear all{1, min, 0};
  for (const rt::SizeExpr &e : exprs) {
    analyzed.push_back(quasiLinear(e));
    if (!analyzed.back())
      continue;
    auto c = common(all, *analyzed.back());
    if (!c) {
      analyzed.back().reset();
      continue;
    }
    all = c->first;
  }
  from = all.from;
  int64_t end = from + all.period; // exclusive
  tail = true;
  if (max && *max < end) {
    end = *max + 1;
    tail = false;
  }
  windowSize = end - min;
  functions.assign(exprs.size(), Samples{});
  if (windowSize <= 0 || windowSize > kMaxWindow)
    return;
  for (auto [i, e] : llvm::enumerate(exprs)) {
    if (!analyzed[i])
      continue;
    Samples &s = functions[i];
    s.slope = analyzed[i]->slope * (all.period / analyzed[i]->period);
    s.values.reserve(windowSize);
    for (int64_t n = min; n < end; ++n) {
      auto v = evaluate(e, n);
      if (!v)
        break;
      s.values.push_back(*v);
    }
    s.known = (int64_t)s.values.size() == windowSize;
  }
  for (const auto &k : kept) {
    for (const Linear *l : {&k->lo, &k->hi, &k->rowLo, &k->rowHi}) {
      SmallVector<int64_t, 9> key{l->constant};
      for (auto [fn, coeff] : l->terms)
        key.append({fn, coeff});
      auto [it, fresh] = boundSamples.try_emplace(std::move(key));
      if (fresh)
        it->second = sampleLinear(*l);
      bounds[l] = &it->second;
    }
    k->running = llvm::BitVector(windowSize, true);
    for (int fn : k->counts)
      if (functions[fn].known)
        for (int64_t w = 0; w < windowSize; ++w)
          if (functions[fn].values[w] <= 0)
            k->running.reset(w);
  }
}

SizeFunctions::Samples SizeFunctions::sampleLinear(const Linear &l) const {
  Samples out;
  out.values.assign(windowSize, l.constant);
  for (auto [fn, coeff] : l.terms) {
    const Samples &f = functions[fn];
    if (!f.known)
      return Samples{};
    out.slope += coeff * f.slope;
    for (int64_t w = 0; w < windowSize; ++w)
      out.values[w] += coeff * f.values[w];
  }
  out.known = windowSize > 0;
  if (out.known) {
    auto [least, greatest] =
        std::minmax_element(out.values.begin(), out.values.end());
    out.least = *least;
    out.greatest = *greatest;
  }
  return out;
}

rt::SizeExpr SizeFunctions::exprOf(const Linear &l) const {
  std::optional<rt::SizeExpr> e;
  for (auto [fn, coeff] : l.terms) {
    if (coeff == 0)
      continue;
    rt::SizeExpr term =
        coeff == 1 ? exprs[fn]
                   : rt::SizeExpr::binary(
                         Kind::Mul, rt::SizeExpr::constant(coeff), exprs[fn]);
    e = e ? rt::SizeExpr::binary(Kind::Add, std::move(*e), std::move(term))
          : std::move(term);
  }
  if (!e)
    return rt::SizeExpr::constant(l.constant);
  if (l.constant == 0)
    return *e;
  return rt::SizeExpr::binary(Kind::Add, std::move(*e),
                              rt::SizeExpr::constant(l.constant));
}

SmallVector<Linear, 8> SizeFunctions::apartConditions(const Sized &x,
                                                      const Sized &y,
                                                      bool idle) const {
  SmallVector<Linear, 8> out;
  // a - b - 1 >= 0: b < a.
  auto below = [&](const Linear &a, const Linear &b) {
    Linear d = a;
    d.constant -= b.constant + 1;
    for (auto [fn, coeff] : b.terms)
      d.add(fn, -coeff);
    out.push_back(std::move(d));
  };
  below(y.lo, x.hi);
  below(x.lo, y.hi);
  below(x.lo, x.hi);
  below(y.lo, y.hi);
  if (x.boxed && y.boxed) {
    below(y.rowLo, x.rowHi);
    below(x.rowLo, y.rowHi);
  }
  for (int fn : llvm::concat<const int>(x.counts, y.counts)) {
    if (!idle)
      break;
    Linear none;
    none.add(fn, -1);
    out.push_back(std::move(none));
  }
  return out;
}

std::optional<rt::SizeExpr> SizeFunctions::whereTouching(const Sized &x,
                                                         const Sized &y) const {
  if (windowSize <= 0 || windowSize > kMaxWindow)
    return std::nullopt;
  // The conditions on ranges that depend on n (an instance drops the
  // waits on instructions that do not run, and constant ones never hold
  // here).
  SmallVector<Linear, 8> conditions;
  for (Linear &l : apartConditions(x, y, /*idle=*/false))
    if (llvm::any_of(l.terms, [](auto &t) { return t.second != 0; }))
      conditions.push_back(std::move(l));
  if (conditions.empty())
    return std::nullopt;
  // Worth a condition only if at some size of the window where both run
  // they are apart: not when no bound ever passes the other.
  if (llvm::none_of(belowSamples(x, y), [](const SamplePair &p) {
        return p.first->greatest - p.second->least > 0;
      }))
    return std::nullopt;
  llvm::BitVector bothRun = x.running;
  bothRun &= y.running;
  auto apartAt = [&](int64_t w) {
    return llvm::any_of(conditions, [&](const Linear &l) {
      int64_t v = l.constant;
      for (auto [fn, coeff] : l.terms) {
        if (!functions[fn].known)
          return false;
        v += coeff * functions[fn].values[w];
      }
      return v >= 0;
    });
  };
  if (llvm::none_of(bothRun.set_bits(), apartAt))
    return std::nullopt;
  // They meet only where every condition fails: -max(conditions) > 0.
  rt::SizeExpr most = exprOf(conditions.front());
  for (const Linear &l : ArrayRef(conditions).drop_front())
    most = rt::SizeExpr::binary(Kind::Max, std::move(most), exprOf(l));
  return rt::SizeExpr::binary(Kind::Sub, rt::SizeExpr::constant(0),
                              std::move(most));
}

SmallVector<SizeFunctions::SamplePair, 6>
SizeFunctions::belowSamples(const Sized &x, const Sized &y) const {
  SmallVector<SamplePair, 6> below;
  auto get = [&](const Linear &l) -> const Samples * {
    auto it = bounds.find(&l);
    return it != bounds.end() && it->second->known ? it->second : nullptr;
  };
  auto pair = [&](const Linear &a, const Linear &b) {
    if (const Samples *sa = get(a), *sb = get(b); sa && sb)
      below.push_back({sa, sb});
  };
  pair(y.lo, x.hi); // x before y
  pair(x.lo, y.hi); // y before x
  pair(x.lo, x.hi); // x is empty
  pair(y.lo, y.hi);
  if (x.boxed && y.boxed) {
    pair(y.rowLo, x.rowHi);
    pair(x.rowLo, y.rowHi);
  }
  return below;
}

bool SizeFunctions::apart(const Sized &x, const Sized &y) const {
  if (windowSize <= 0 || windowSize > kMaxWindow)
    return false;
  SmallVector<SamplePair, 6> below = belowSamples(x, y);
  // Most accesses that are apart are so by one condition at every size: a
  // bound's least sample beyond the other's greatest (and, past `from`, not
  // closing in) settles that without a pass over the window.
  if (llvm::any_of(below, [&](auto &p) {
        return p.first->least - p.second->greatest > 0 &&
               (!tail || p.first->slope >= p.second->slope);
      }))
    return true;
  // Conditions "count <= 0": a loop around x or y does not run.
  SmallVector<const Samples *, 4> idle;
  for (int fn : llvm::concat<const int>(x.counts, y.counts))
    if (functions[fn].known)
      idle.push_back(&functions[fn]);
  // From the largest size down: there every loop runs, so accesses that
  // meet at all meet there, and the scan stops at once.
  for (int64_t w = windowSize - 1; w >= 0; --w) {
    // From `from` on, only a condition that stays true a period later.
    bool settled = tail && min + w >= from;
    bool holds = llvm::any_of(below, [&](auto &p) {
      return p.first->values[w] - p.second->values[w] > 0 &&
             (!settled || p.first->slope >= p.second->slope);
    });
    holds = holds || llvm::any_of(idle, [&](const Samples *c) {
              return c->values[w] <= 0 && (!settled || c->slope <= 0);
            });
    if (!holds)
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
  /// The same with rows of an HBM buffer's last two dims.
  bool planeBoxed = false;
  Span planeRows, planeCols;
  /// An on-chip operand's partitions, where its offset says which.
  Span partitions;
  /// A size-generic kernel's offset part known at run time only (issue
  /// #16): (value, coefficient) terms; spans compare only over equal ones.
  SmallVector<std::pair<Value, int64_t>, 1> symbolic;
  /// Where it may be, for RegionIndex: `linear`'s bounds, or the whole tile
  /// when a symbolic part moves it.
  int64_t regionLo = 0, regionHi = kUnbounded;
  /// In a kernel with one size parameter, its range as functions of it.
  std::shared_ptr<const Sized> sized;
  /// A disjoint scatter's rows (nisa.dma_scatter `disjoint`): the rows of
  /// another such write are never its own.
  bool disjointRows = false;

  /// The spans a loop may move.
  SmallVector<const Span *, 5> spans() const {
    SmallVector<const Span *, 5> all{&linear};
    if (boxed)
      all.append({&rows, &cols});
    if (planeBoxed)
      all.append({&planeRows, &planeCols});
    return all;
  }
};

bool apart(const Access &x, const Access &y) {
  if (x.symbolic == y.symbolic &&
      (apart(x.linear, y.linear) || apart(x.partitions, y.partitions) ||
       (x.boxed && y.boxed &&
        (apart(x.rows, y.rows) || apart(x.cols, y.cols))) ||
       (x.planeBoxed && y.planeBoxed &&
        (apart(x.planeRows, y.planeRows) || apart(x.planeCols, y.planeCols)))))
    return true;
  // Columns do not depend on the sizes: apart in every iteration of the
  // loop that moves them, whatever the sizes.
  if (!x.sized || !y.sized)
    return false;
  if (x.sized->boxed && y.sized->boxed && apart(x.sized->cols, y.sized->cols))
    return true;
  return x.sized->fns->apart(*x.sized, *y.sized);
}

struct Instruction {
  Operation *op;
  nisa::Engine engine; // the queue that issues it
  bool dma;
  SmallVector<Access, 4> accesses;
  SmallVector<Operation *, 4> loops; // enclosing scf.for ops
  /// Per loop, whether its body runs at least once (alwaysIterates).
  SmallVector<bool, 4> loopIterates;
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
  // A view with a dim whose stride is the tile's row (its partition dim:
  // dim 0, or another in a transposing DMA's view) covers, in every
  // partition, the bytes its other dims reach from its offset.
  size_t partitionDim = 0;
  while (partitionDim < strides.size() &&
         strides[partitionDim] * elt != bytes)
    ++partitionDim;
  if (offset && partitionDim < strides.size()) {
    int64_t reach = 0;
    for (size_t d = 0; d < sizes.size(); ++d)
      if (d != partitionDim)
        reach += (sizes[d] - 1) * strides[d];
    SmallVector<std::pair<Value, int64_t>, 2> byteTerms;
    for (auto [iv, coeff] : offset->terms)
      byteTerms.push_back({iv, coeff * elt});
    // A constant offset of whole rows starts the view on a later partition
    // (the stacked copies of a convolution's image): it covers the bytes
    // from the rest of its offset on partitions [first, first + size), if
    // those stay within a partition over every iteration.
    int64_t rowElts = bytes / elt, constant = offset->constant;
    Span partitions = access.partitions;
    if (constant >= 0 && symbolic.empty()) {
      int64_t first = constant / rowElts;
      partitions = whole(first, first + sizes[partitionDim] - 1);
      constant %= rowElts;
    }
    auto span =
        spanOf(begin + constant * elt, byteTerms, (reach + 1) * elt - 1);
    if (span && span->lo >= begin && span->hi < begin + bytes) {
      access.linear = *span;
      access.partitions = partitions;
    }
  }
  // A symbolic part moves the view anywhere in its tile.
  access.regionLo = symbolic.empty() ? access.linear.lo : begin;
  access.regionHi = symbolic.empty() ? access.linear.hi : begin + bytes - 1;
  return access;
}

/// The rows and columns an HBM view reaches, rows of `row` elements, when
/// no term or stride wraps a row.
std::optional<std::pair<Span, Span>>
boxOf(const nisa::AffineIndex &offset, ArrayRef<int64_t> sizes,
      ArrayRef<int64_t> strides, ArrayRef<std::pair<Value, int64_t>> symbolic,
      int64_t row) {
  // Rows and columns of a symbolic offset compare only if it moves whole
  // rows.
  if (row <= 1 ||
      llvm::any_of(symbolic, [&](auto &t) { return t.second % row != 0; }))
    return std::nullopt;
  SmallVector<std::pair<Value, int64_t>, 2> rowTerms, colTerms;
  for (auto [iv, coeff] : offset.terms)
    (coeff % row == 0 ? rowTerms : colTerms)
        .push_back({iv, coeff % row == 0 ? coeff / row : coeff});
  int64_t rowReach = 0, colReach = 0, rowStep = 0, rowDims = 0;
  for (auto [size, stride] : llvm::zip(sizes, strides)) {
    if (stride % row == 0) {
      rowReach += (size - 1) * (stride / row);
      if (size > 1) {
        rowStep = stride / row;
        ++rowDims;
      }
    } else if (stride < row) {
      colReach += (size - 1) * stride;
    } else {
      return std::nullopt;
    }
  }
  auto rows = spanOf(offset.constant / row, rowTerms, rowReach);
  auto cols = spanOf(offset.constant % row, colTerms, colReach);
  if (!rows || !cols || cols->lo < 0 || cols->hi >= row)
    return std::nullopt;
  // Rows one dim steps through, every rowStep-th: views of interleaved
  // rows (e.g. one query head's rows of a [B, L, H, D] result) are apart
  // when their first rows differ modulo the step.
  if (rowTerms.empty() && rowDims == 1 && rowStep > 1) {
    rows->period = rowStep;
    rows->phase = rows->lo % rowStep;
    rows->extent = 0;
  }
  return std::pair{*rows, *cols};
}

/// An HBM operand: its buffer, the elements it reaches as one span and,
/// when no term or stride wraps a row, as rows x columns of the innermost
/// dim, and of the last two.
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
  if (symbolic.empty()) {
    access.regionLo = access.linear.lo;
    access.regionHi = access.linear.hi;
  }
  int64_t rank = type.getRank();
  if (rank > 1)
    if (auto box =
            boxOf(*offset, sizes, strides, symbolic, type.getShape().back())) {
      access.boxed = true;
      std::tie(access.rows, access.cols) = *box;
    }
  // The same over rows of the last two dims (a [N, O, H, W] result stored
  // a block of channels and of whole rows of H at a time).
  if (rank > 2 && !ShapedType::isDynamic(type.getShape()[rank - 2]) &&
      !ShapedType::isDynamic(type.getShape().back()))
    if (auto box = boxOf(*offset, sizes, strides, symbolic,
                         type.getShape()[rank - 2] * type.getShape().back())) {
      access.planeBoxed = true;
      std::tie(access.planeRows, access.planeCols) = *box;
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

/// Adds to [lo, hi] the range of `constant` + `symbolic` + `ivTerms` over
/// every iteration of the ivs' loops, as functions of the size parameter;
/// false when some part is not such a function.
bool addIndexRange(SizeFunctions &fns, int64_t constant, Terms ivTerms,
                   Terms symbolic, Linear &lo, Linear &hi) {
  lo.constant += constant;
  hi.constant += constant;
  for (auto [v, coeff] : symbolic) {
    int fn = fns.functionOf(v);
    if (fn < 0)
      return false;
    lo.add(fn, coeff);
    hi.add(fn, coeff);
  }
  for (auto [iv, coeff] : ivTerms) {
    scf::ForOp loop = scf::getForInductionVarOwner(iv);
    auto lb = nisa::affineIndexOf(loop.getLowerBound());
    auto step = nisa::affineIndexOf(loop.getStep());
    if (!lb || !step || !lb->terms.empty() || !step->terms.empty() ||
        step->constant <= 0)
      return false;
    lo.constant += coeff * lb->constant;
    hi.constant += coeff * lb->constant;
    // The last iteration moves it by d * (count - 1).
    int64_t d = coeff * step->constant;
    Linear &moved = d > 0 ? hi : lo;
    if (auto ub = getConstantIntValue(loop.getUpperBound())) {
      int64_t count =
          (*ub - lb->constant + step->constant - 1) / step->constant;
      moved.constant += d * (std::max<int64_t>(count, 1) - 1);
      continue;
    }
    int fn = fns.tripCountOf(loop, lb->constant, step->constant);
    if (fn < 0)
      return false;
    moved.add(fn, d);
    moved.constant -= d;
  }
  return true;
}

/// Adds sum((size - 1) * stride) over `dims` (a size known at run time, a
/// function of the size parameter); false when one is not.
bool addReach(SizeFunctions &fns, ArrayRef<OpFoldResult> sizes,
              ArrayRef<int64_t> strides, Linear &hi) {
  for (auto [size, stride] : llvm::zip(sizes, strides)) {
    hi.constant -= stride;
    if (auto c = getConstantIntValue(size)) {
      hi.constant += *c * stride;
      continue;
    }
    int fn = fns.functionOf(cast<Value>(size));
    if (fn < 0)
      return false;
    hi.add(fn, stride);
  }
  return true;
}

Linear scaled(Linear l, int64_t k) {
  l.constant *= k;
  for (auto &t : l.terms)
    t.second *= k;
  return l;
}

/// A view's Sized form (issue #16): its offset (`offset` and `symbolic`),
/// sizes and strides; nullptr when a part is no function of the size
/// parameter. Without a view (`offset` empty), the whole tile or buffer.
std::shared_ptr<const Sized>
sizedAccess(SizeFunctions &fns, MemRefType type,
            const std::optional<nisa::AffineIndex> &offset, Terms symbolic,
            ArrayRef<OpFoldResult> sizes, ArrayRef<int64_t> strides,
            IntegerAttr address, ArrayRef<int> counts) {
  Sized out;
  out.counts.assign(counts.begin(), counts.end());
  bool onChip = nisa::getMemorySpace(type) != nisa::MemorySpace::hbm;
  bool valid =
      offset && llvm::none_of(strides, [](int64_t s) { return s < 0; });
  if (onChip) {
    // Bytes of one partition: the partition dim does not count, and views
    // whose partition stride is not the tile's row cover all of it.
    int64_t begin = address.getInt();
    int64_t bytes = nisa::bytesPerPartition(type);
    int64_t elt = std::max<int64_t>(1, type.getElementTypeBitWidth() / 8);
    out.lo.constant = begin;
    out.hi.constant = begin + bytes - 1;
    if (!valid || strides.empty() || strides[0] * elt != bytes)
      return fns.keep(std::move(out));
    Linear lo, hi;
    if (!addIndexRange(fns, offset->constant, offset->terms, symbolic, lo,
                       hi) ||
        !addReach(fns, sizes.drop_front(), strides.drop_front(), hi))
      return nullptr;
    out.lo = scaled(lo, elt);
    out.lo.constant += begin;
    out.hi = scaled(hi, elt);
    out.hi.constant += begin + elt - 1;
    return fns.keep(std::move(out));
  }
  out.hi.constant = kUnbounded;
  if (!valid)
    return fns.keep(std::move(out));
  Linear lo, hi;
  if (!addIndexRange(fns, offset->constant, offset->terms, symbolic, lo, hi) ||
      !addReach(fns, sizes, strides, hi))
    return nullptr;
  out.lo = lo;
  out.hi = hi;
  // Rows x columns of the innermost dim, as hbmAccess, with the sizes known
  // at run time on rows only: the columns are then the same for every size.
  int64_t row = type.getRank() > 1 ? type.getShape().back() : 0;
  if (row <= 1 || ShapedType::isDynamic(row) ||
      llvm::any_of(symbolic, [&](auto &t) { return t.second % row != 0; }))
    return fns.keep(std::move(out));
  SmallVector<std::pair<Value, int64_t>, 2> rowTerms, colTerms, rowSymbolic;
  for (auto [iv, coeff] : offset->terms)
    (coeff % row == 0 ? rowTerms : colTerms)
        .push_back({iv, coeff % row == 0 ? coeff / row : coeff});
  for (auto [v, coeff] : symbolic)
    rowSymbolic.push_back({v, coeff / row});
  SmallVector<OpFoldResult> rowSizes;
  SmallVector<int64_t> rowStrides;
  int64_t colReach = 0;
  for (auto [size, stride] : llvm::zip(sizes, strides)) {
    if (stride % row == 0) {
      rowSizes.push_back(size);
      rowStrides.push_back(stride / row);
      continue;
    }
    auto c = getConstantIntValue(size);
    if (!c || stride >= row)
      return fns.keep(std::move(out));
    colReach += (*c - 1) * stride;
  }
  auto cols = spanOf(offset->constant % row, colTerms, colReach);
  Linear rowLo, rowHi;
  if (!cols || cols->lo < 0 || cols->hi >= row ||
      !addIndexRange(fns, offset->constant / row, rowTerms, rowSymbolic, rowLo,
                     rowHi) ||
      !addReach(fns, rowSizes, rowStrides, rowHi))
    return fns.keep(std::move(out));
  out.boxed = true;
  out.rowLo = rowLo;
  out.rowHi = rowHi;
  out.cols = *cols;
  return fns.keep(std::move(out));
}

/// An upper bound (at least 1) of a size known at run time, when its
/// definition gives one: a constant, a remainder by a constant, a minimum,
/// or a maximum, sum or quotient of bounded terms.
std::optional<int64_t> upperBound(OpFoldResult size) {
  if (auto c = getConstantIntValue(size))
    return std::max<int64_t>(*c, 1);
  Operation *def = cast<Value>(size).getDefiningOp();
  if (!def)
    return std::nullopt;
  std::optional<int64_t> c = def->getNumOperands() == 2
                                 ? getConstantIntValue(def->getOperand(1))
                                 : std::nullopt;
  if (isa<arith::RemSIOp, arith::RemUIOp>(def) && c && *c > 0)
    return std::max<int64_t>(*c - 1, 1);
  if (isa<arith::MinSIOp, arith::MinUIOp>(def)) {
    auto l = upperBound(def->getOperand(0)), r = upperBound(def->getOperand(1));
    if (l && r)
      return std::min(*l, *r);
    return l ? l : r;
  }
  if (isa<arith::MaxSIOp, arith::AddIOp>(def)) {
    auto l = upperBound(def->getOperand(0)), r = upperBound(def->getOperand(1));
    if (!l || !r)
      return std::nullopt;
    return isa<arith::MaxSIOp>(def) ? std::max(*l, *r) : *l + *r;
  }
  if (isa<arith::FloorDivSIOp, arith::DivUIOp>(def) && c && *c > 0)
    if (auto l = upperBound(def->getOperand(0)))
      return std::max<int64_t>(*l / *c, 1);
  return std::nullopt;
}

/// The storage and spans of a memref operand, or failure with a diagnostic.
/// `fns`: the kernel's size parameter, if it has one, and `counts` the trip
/// counts known at run time of the loops around `user`.
FailureOr<Access> accessOf(Operation *user, Value v, bool write,
                           MLIRContext *ctx, SizeFunctions *fns,
                           ArrayRef<int> counts) {
  Value base = v;
  std::optional<nisa::AffineIndex> offset, viewOffset;
  SmallVector<std::pair<Value, int64_t>, 1> symbolic;
  SmallVector<int64_t> sizes, strides;
  SmallVector<OpFoldResult> mixedSizes;
  if (auto view = v.getDefiningOp<memref::ReinterpretCastOp>()) {
    base = view.getSource();
    OpFoldResult off = view.getMixedOffsets().front();
    if (auto attr = dyn_cast<Attribute>(off))
      offset = nisa::AffineIndex{cast<IntegerAttr>(attr).getInt(), {}};
    else
      offset = affineWithSymbols(cast<Value>(off), symbolic);
    viewOffset = offset;
    sizes.assign(view.getStaticSizes().begin(), view.getStaticSizes().end());
    mixedSizes = view.getMixedSizes();
    strides = nisa::viewStrides(view);
    // A size known only at run time (issue #16) reaches as far as its bound
    // (a remainder's, as a group's last rows); without one, the whole tile
    // or buffer, whatever the sizes, so the waits hold for every instance.
    // On chip the partitions a view spans do not count (the spans are bytes
    // of a partition): their number may be anything.
    auto baseType = cast<MemRefType>(base.getType());
    int64_t partitionStride =
        nisa::getMemorySpace(baseType) == nisa::MemorySpace::hbm
            ? 0
            : nisa::bytesPerPartition(baseType) /
                  std::max<int64_t>(1, baseType.getElementTypeBitWidth() / 8);
    for (auto [size, mixed, stride] : llvm::zip(sizes, mixedSizes, strides))
      if (ShapedType::isDynamic(size))
        size = stride == partitionStride
                   ? 1
                   : upperBound(mixed).value_or(ShapedType::kDynamic);
    if (llvm::any_of(strides, [](int64_t s) { return s < 0; }) ||
        llvm::any_of(sizes, ShapedType::isDynamic))
      offset.reset();
  }
  auto type = cast<MemRefType>(base.getType());
  nisa::MemorySpace space = nisa::getMemorySpace(type);
  IntegerAttr address;
  FailureOr<Access> access = failure();
  if (space == nisa::MemorySpace::hbm) {
    access = hbmAccess(base, type, write, offset, sizes, strides, symbolic);
  } else {
    auto alloc = base.getDefiningOp<memref::AllocOp>();
    address = alloc ? alloc->getAttrOfType<IntegerAttr>(nisa::kAddressAttrName)
                    : IntegerAttr();
    if (!address)
      return user->emitOpError("reads or writes an on-chip tile without a "
                               "nisa.address (run nisa-allocate first)");
    access = onChipAccess(type, space, address, write, offset, sizes, strides,
                          symbolic, ctx);
  }
  if (fns)
    access->sized = sizedAccess(*fns, type, viewOffset, symbolic, mixedSizes,
                                strides, address, counts);
  return access;
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
  return (x.write || y.write) && x.storage == y.storage &&
         !(x.disjointRows && y.disjointRows) && !apart(x, y);
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

/// The waits of every instruction, as lists and as bit sets for lookup
/// (sparse: an instruction waits for a few, and dense sets would be
/// instructions squared bits).
struct Waits {
  std::vector<SmallVector<int64_t>> lists;
  std::vector<llvm::SparseBitVector<>> sets;
  /// Issue #16: the sizes at which wait (b, a) is needed, as a size
  /// expression positive there; no entry: at every size. A wait that another
  /// one's removal relies on (`pinned`) holds at every size.
  std::map<std::pair<int64_t, int64_t>, rt::SizeExpr> when;
  std::set<std::pair<int64_t, int64_t>> pinned;
  explicit Waits(int64_t n) : lists(n), sets(n) {}
  bool has(int64_t b, int64_t a) const { return sets[b].test(a); }
  void add(int64_t b, int64_t a) {
    lists[b].push_back(a);
    sets[b].set(a);
  }
};

/// Issue #16: the sizes at which instances of `a` and `b` touch a common
/// byte, one writing, as a size expression positive there; nullopt: at
/// every size (or not known).
std::optional<rt::SizeExpr> whereConflicting(const Instruction &a,
                                             const Instruction &b) {
  std::optional<rt::SizeExpr> where;
  for (const Access &x : a.accesses)
    for (const Access &y : b.accesses) {
      if (&a == &b && &x == &y && movesWithInnermostLoop(a, x) &&
          a.loops.size() == 1)
        continue;
      if (!touches(x, y))
        continue;
      if (!x.sized || !y.sized)
        return std::nullopt;
      auto pair = x.sized->fns->whereTouching(*x.sized, *y.sized);
      if (!pair)
        return std::nullopt;
      where = where ? rt::SizeExpr::binary(rt::SizeExpr::Kind::Max,
                                           std::move(*where), std::move(*pair))
                    : std::move(*pair);
    }
  return where;
}

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
bool covered(ArrayRef<Instruction> insts, Waits &waits, int64_t a, int64_t b,
             bool loopCarried) {
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
  // met at once and says nothing of `a`. Unless the loop holds `a` too and
  // c follows a in its body: `a` runs only in its iterations, and c after
  // it in each, so c's latest instance follows a's (a grouped GEMM's
  // matmuls otherwise waited for every eviction of every group before).
  auto runsBeforeB = [&](int64_t c) {
    for (auto [loop, iterates] :
         llvm::zip_equal(insts[c].loops, insts[c].loopIterates))
      if (!iterates && !llvm::is_contained(insts[b].loops, loop) &&
          !(a < c && llvm::is_contained(insts[a].loops, loop)))
        return false;
    return true;
  };
  auto covers = [&](int64_t c) {
    if (!waitedFor(c) || !insideSharedLoops(c) || !runsBeforeB(c))
      return false;
    if (!loopCarried)
      return c < b && !(c < a && a < b);
    return c > b && b <= a && a < c && canPrecede(insts[c], c, insts[b], b);
  };
  // The waits the removal relies on then hold at every size.
  auto pin = [&](int64_t c) {
    for (std::pair<int64_t, int64_t> wait : {std::pair(b, c), std::pair(c, a)})
      if (waits.when.count(wait))
        waits.pinned.insert(wait);
    return true;
  };
  auto it = llvm::find_if(waits.lists[b], covers);
  if (it != waits.lists[b].end())
    return pin(*it);
  // The nearest earlier instruction of b's own queue runs before b.
  int64_t c = insts[b].queuePredecessor;
  return !loopCarried && c >= 0 && covers(c) && pin(c);
}

/// The instructions of `func` in program order, with their accesses and
/// enclosing loops (failure, with a diagnostic, on an access it cannot
/// summarize).
FailureOr<std::vector<Instruction>> collectInstructions(func::FuncOp func,
                                                        SizeFunctions *fns) {
  MLIRContext *ctx = func.getContext();
  std::vector<Instruction> insts;
  WalkResult walk = func.walk<WalkOrder::PreOrder>([&](Operation *op) {
    auto instruction = dyn_cast<nisa::InstructionOpInterface>(op);
    if (!instruction)
      return WalkResult::advance();
    Instruction inst{
        op, instruction.getIssuingEngine(), instruction.isDma(), {}, {}};
    for (Operation *p = op->getParentOp(); p != func; p = p->getParentOp())
      if (isa<scf::ForOp>(p)) {
        inst.loops.push_back(p);
        inst.loopIterates.push_back(alwaysIterates(p));
      }
    // The trip counts known at run time of the loops around it.
    SmallVector<int, 2> counts;
    for (Operation *p : fns ? inst.loops : SmallVector<Operation *, 4>{}) {
      auto loop = cast<scf::ForOp>(p);
      auto lb = getConstantIntValue(loop.getLowerBound());
      auto step = getConstantIntValue(loop.getStep());
      if (lb && step && *step > 0 && !getConstantIntValue(loop.getUpperBound()))
        if (int fn = fns->tripCountOf(loop, *lb, *step); fn >= 0)
          counts.push_back(fn);
    }
    // Every written operand is a write (an activation's row sums as much
    // as its dst); index operands (an iota's offset) touch no memory.
    SmallVector<Value, 2> written = instruction.getWrittenOperands();
    for (Value operand : op->getOperands()) {
      if (!isa<MemRefType>(operand.getType()))
        continue;
      bool writes = llvm::is_contained(written, operand);
      auto access = accessOf(op, operand, writes, ctx, fns, counts);
      if (failed(access))
        return WalkResult::interrupt();
      auto scatter = dyn_cast<nisa::DmaScatterOp>(op);
      access->disjointRows = writes && scatter && scatter.getDisjoint();
      inst.accesses.push_back(*access);
    }
    insts.push_back(std::move(inst));
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  return insts;
}

/// Each compute instruction's nearest earlier one on its queue.
void linkQueues(std::vector<Instruction> &insts) {
  SmallVector<int64_t, 8> lastOnQueue(nisa::getMaxEnumValForEngine() + 1, -1);
  for (int64_t b = 0; b < (int64_t)insts.size(); ++b) {
    Instruction &inst = insts[b];
    if (inst.dma)
      continue;
    int64_t &last = lastOnQueue[(int)inst.engine];
    inst.queuePredecessor = last;
    last = b;
  }
}

/// Only instructions that touch a common region can conflict. Each memory
/// is cut into fine regions (64 bytes of an on-chip partition, 512 elements
/// of an HBM buffer) grouped into coarse ones (1 KiB of a partition, half a
/// PSUM bank so that the slots of a bank are apart; a whole HBM buffer). An
/// access reaching at most 16 fine regions is listed under each and under
/// its coarse regions' `kAll` lists; a wider one (or one a size moves) under
/// its coarse regions' `kWide` and `kAll` lists. A narrow access then meets
/// the accesses of its fine regions and the wide ones of its coarse regions,
/// a wide one all those of its coarse regions: small tiles packed into one
/// KiB do not all meet, and a large tile is listed a few times only.
/// Each region's lists are kept per queue and for reads and writes apart: a
/// compute instruction never waits for its own queue, and a read only for
/// writes (a decoder layer's GEMMs' matmuls meet in PSUM banks, and their
/// weights' loads in one HBM buffer: most of the pairs otherwise).
class RegionIndex {
public:
  RegionIndex(MLIRContext *ctx, const std::vector<Instruction> &insts)
      : sbuf(nisa::MemorySpaceAttr::get(ctx, nisa::MemorySpace::sbuf)
                 .getAsOpaquePointer()),
        psum(nisa::MemorySpaceAttr::get(ctx, nisa::MemorySpace::psum)
                 .getAsOpaquePointer()) {
    for (int64_t b = 0; b < (int64_t)insts.size(); ++b)
      for (const Access &x : insts[b].accesses)
        forEachRegion(x, /*listed=*/true, [&](Region r) {
          SmallVector<int64_t> &users =
              byRegion[listOf(r, queueOf(insts[b]), x.write)];
          if (users.empty() || users.back() != b)
            users.push_back(b);
        });
  }

  /// Calls `fn` with every instruction that may conflict with `x`, an
  /// access of `inst`, in a region they share: not the compute instructions
  /// of its own queue, and only writers when `x` reads (an instruction may
  /// come more than once).
  template <typename Fn>
  void forEachSharing(const Instruction &inst, const Access &x, Fn &&fn) {
    int64_t own = queueOf(inst);
    forEachRegion(x, /*listed=*/false, [&](Region r) {
      for (int64_t q = 0; q < kQueues; ++q) {
        if (q == own && !inst.dma)
          continue;
        for (bool write : {false, true}) {
          if (!write && !x.write)
            continue;
          auto it = byRegion.find(listOf(r, q, write));
          if (it != byRegion.end())
            for (int64_t a : it->second)
              fn(a);
        }
      }
    });
  }

private:
  /// DMAs (one list: they wait for each other), then each compute queue.
  static constexpr int64_t kQueues = 1 + nisa::getMaxEnumValForEngine() + 1;
  static int64_t queueOf(const Instruction &inst) {
    return inst.dma ? 0 : 1 + (int64_t)inst.engine;
  }
  static constexpr int64_t kFinePerAccess = 16;
  enum List : int64_t { kFine, kWide, kAll };
  using Region = std::pair<const void *, int64_t>;
  static Region listOf(Region r, int64_t queue, bool write) {
    return {r.first, (r.second * kQueues + queue) * 2 + write};
  }

  /// The regions `x` is listed under (`listed`), or whose lists it meets.
  template <typename Fn>
  void forEachRegion(const Access &x, bool listed, Fn &&fn) const {
    bool onChip = x.storage == sbuf || x.storage == psum;
    int64_t fine = onChip ? 64 : 512, coarse = onChip ? 1024 : 0;
    auto region = [&](int64_t index, List list) {
      return Region{x.storage, index * 3 + list};
    };
    int64_t lo = x.regionLo, hi = x.regionHi;
    auto forEachCoarse = [&](List list) {
      if (!coarse)
        return fn(region(0, list));
      for (int64_t c = lo / coarse; c <= hi / coarse; ++c)
        fn(region(c, list));
    };
    if (lo < 0 || hi / fine - lo / fine >= kFinePerAccess) {
      if (listed)
        forEachCoarse(kWide);
      return forEachCoarse(kAll);
    }
    forEachCoarse(listed ? kAll : kWide);
    for (int64_t f = lo / fine; f <= hi / fine; ++f)
      fn(region(f, kFine));
  }

  const void *sbuf, *psum;
  llvm::DenseMap<Region, SmallVector<int64_t>> byRegion;
};

/// The waits every instruction needs. Waits implied by an earlier witness
/// are dropped in program order (closest first); then those implied by a
/// later witness in a shared loop, in reverse order.
Waits findWaits(const std::vector<Instruction> &insts, RegionIndex &regions) {
  int64_t n = insts.size();
  // The instructions sharing a region with b.
  llvm::BitVector sharing(n);
  Waits waits(n);
  // A witness for (a, b) is an earlier c that b waits for (or b's queue
  // predecessor) and that waited for a or follows it on a's queue. What
  // those c waited for, and their queues, rule most pairs out at once (a
  // matmul reading a panel waits for each of its many loads: scanning its
  // waits for every new one was most of the pass).
  llvm::BitVector reach(n);
  uint32_t queuesReached = 0;
  auto reached = [&](int64_t c) {
    for (unsigned a : waits.sets[c])
      reach.set(a);
    if (!insts[c].dma)
      queuesReached |= 1u << (unsigned)insts[c].engine;
  };
  auto mayBeCovered = [&](int64_t a) {
    return reach.test(a) ||
           (!insts[a].dma && (queuesReached >> (unsigned)insts[a].engine) & 1);
  };
  auto consider = [&](int64_t a, int64_t b) {
    if (needsWait(insts[a], a, insts[b], b) &&
        (!mayBeCovered(a) ||
         !covered(insts, waits, a, b, /*loopCarried=*/false))) {
      waits.add(b, a);
      if (a < b)
        reached(a);
      if (auto where = whereConflicting(insts[a], insts[b]))
        waits.when.emplace(std::pair(b, a), std::move(*where));
    }
  };
  for (int64_t b = 0; b < n; ++b) {
    reach.reset();
    queuesReached = 0;
    if (insts[b].queuePredecessor >= 0)
      reached(insts[b].queuePredecessor);
    sharing.reset();
    for (const Access &x : insts[b].accesses)
      regions.forEachSharing(insts[b], x, [&](int64_t a) { sharing.set(a); });
    // The closest earlier first, then b and the later ones in order.
    for (int a = sharing.find_prev(b); a >= 0; a = sharing.find_prev(a))
      consider(a, b);
    for (int a = sharing.find_first_in(b, n); a >= 0; a = sharing.find_next(a))
      consider(a, b);
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
    // Issue #16: each wait's sizes ("" for every size), when some are not
    // every size.
    SmallVector<Attribute> when;
    bool conditional = false;
    for (int64_t a : list) {
      auto it = waits.when.find({b, a});
      bool sized = it != waits.when.end() && !waits.pinned.count({b, a});
      conditional |= sized;
      when.push_back(
          StringAttr::get(ctx, sized ? rt::toString(it->second) : ""));
    }
    if (conditional)
      op->setAttr(nisa::kWaitWhenAttrName, ArrayAttr::get(ctx, when));
    else
      op->removeAttr(nisa::kWaitWhenAttrName);
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
  std::unique_ptr<SizeFunctions> fns = SizeFunctions::of(func);
  FailureOr<std::vector<Instruction>> insts =
      collectInstructions(func, fns.get());
  if (failed(insts))
    return failure();
  if (fns)
    fns->sample();
  linkQueues(*insts);
  RegionIndex regions(&getContext(), *insts);
  Waits waits = findWaits(*insts, regions);
  annotate(func, *insts, waits);
  return success();
}

} // namespace
