//===- LowerFlexAttentionPrefillDynamic.cpp - prefill over a run-time length =//
//
// The forward kernel of a neuron.flex_attention whose query length is known
// at run time only (issue #16: a prompt of any length, `dynamic=True`), one
// program for every length S: SDPA's causal mask (mask_mod q >= kv, the
// query and key lengths one size) or no mask (the key length may differ),
// grouped-query heads, no score_mod.
//
// A program's loop counts are expressions of the sizes, never of an
// enclosing loop's index (docs/PROGRAM_FORMAT.md), so a key loop cannot stop
// at a looped query tile's diagonal. The query tiles of 128 rows therefore
// come in two kinds:
//  - the first `kPrefixTiles` (unrolled, each in a loop of zero or one
//    iteration, its rows min(128, S - 128 t) a size expression) read the keys
//    up to their diagonal exactly: those keys, at most kPrefixTiles * 128,
//    are resident in SBUF per key head, loaded once; the diagonal unit gets
//    the causal bias (0 on and below the diagonal, <= -2^20 above: an iota
//    and a min, built once);
//  - the later ones (the full ones counted at run time, then the short last
//    one) read the resident keys, unmasked, then stream the keys after them
//    through SBUF in steps of a PSUM bank (512): the full steps counted at
//    run time, loaded ahead, the last S mod 512 keys one step whose extents
//    are size expressions. Streamed steps reach past the diagonal (their
//    count cannot depend on the query tile) and are masked by an iota of
//    q - kv per step: above the diagonal they compute nothing kept, so
//    prompts beyond kPrefixTiles * 128 rows pay up to twice the exact work
//    for their later tiles.
// Per key step: the online softmax of the static kernel (S = Q K^T in PSUM,
// -max, P = exp(S - max) with its row sums on ScalarE, alpha, P^T on TensorE,
// O = O * alpha + P V). The state starts at -max = huge, l = 0, O = 0, so
// every step is alike.
//
// Heads are unrolled (a head's rows start at a multiple of S); the next key
// head's resident keys load while this one computes. The prefix tiles are
// software-pipelined across tiles and heads: each step's scores are issued
// before the P V of the steps two before it, with banks, scratch and state of
// their own (the engines run their queues in order), and each tile's Q^T loads
// while the tile before it computes.
//===----------------------------------------------------------------------===//

#include "passes/flex_attention/FlexAttentionLowering.h"

#include <deque>
#include <functional>
#include <limits>

namespace mlir::neuron::flex {

namespace {
/// Query tiles whose keys stop at their diagonal (see the file comment):
/// their keys are resident, kPrefixTiles * 128 rows of K^T and V per key
/// head slot.
constexpr int64_t kPrefixTiles = 8;
/// The causal bias of a key after its query: at most -kMaskScale, whose
/// exp(scale * (score - kMaskScale) - max) is 0 for any score a bf16 or
/// fp32 head produces.
constexpr double kMaskScale = 1048576.0; // 2^20
} // namespace

LogicalResult FlexAttentionLowering::runPrefillDynamic() {
  auto refuse = [&](const Twine &why) {
    return emitError(op.getLoc())
           << "not size-generic: " << op->getName() << ": " << why;
  };
  if (!op.getScoreBuffers().empty() || !op.getMaskBuffers().empty())
    return refuse("modifiers that capture tensors");
  if (!op.getLse().use_empty())
    return refuse("the log-sum-exp of a query length known at run time");
  if (::mlir::failed(setUp(op)))
    return failure();
  Block &scoreBody = op.getScoreMod().front();
  if (cast<YieldOp>(scoreBody.getTerminator()).getValues()[0] !=
          scoreBody.getArgument(0) ||
      scale <= 0)
    return refuse("a score_mod or a scale that is not positive");
  Block &maskBody = op.getMaskMod().front();
  Value keep = cast<YieldOp>(maskBody.getTerminator()).getValues()[0];
  bool causal = false;
  if (auto c = keep.getDefiningOp<ConstantOp>()) {
    if (auto attr = dyn_cast<DenseElementsAttr>(c.getValue()))
      maskTrivial = attr.isSplat() && attr.getSplatValue<bool>();
  } else if (auto bin = keep.getDefiningOp<BinaryOp>()) {
    Value qi = maskBody.getArgument(2), kvi = maskBody.getArgument(3);
    causal = (bin.getFn() == BinaryFn::ge && bin.getLhs() == qi &&
              bin.getRhs() == kvi) ||
             (bin.getFn() == BinaryFn::le && bin.getLhs() == kvi &&
              bin.getRhs() == qi);
  }
  if (!maskTrivial && !causal)
    return refuse("a mask other than the causal one over a query length "
                  "known at run time");
  // The generic form's block classes: all partial with the causal mask
  // (the kernel finds the diagonal), any but masked without a mask.
  if (llvm::any_of(blockKinds, [&](int8_t c) {
        return c == (int8_t)Kind::masked ||
               (causal && c != (int8_t)Kind::partial);
      }))
    return refuse("block classes other than the causal mask's over a query "
                  "length known at run time");
  if (vDim > bank)
    return op.emitOpError("value head dims above ")
           << bank << " are not supported";
  Value qLenV = k.dimOf(op.getQuery(), 2), kvLenV = k.dimOf(op.getKey(), 2),
        vLenV = k.dimOf(op.getValue(), 2);
  if (!qLenV || !kvLenV || !vLenV)
    return refuse("the query or key length is not known");
  if (!sameIndex(kvLenV, vLenV))
    return refuse("key and value lengths not known to be one size");
  if (causal && !sameIndex(qLenV, kvLenV))
    return refuse("a causal mask over query and key lengths not known to be "
                  "one size");
  // Heads are reached by offsets (strides known at run time are fine), rows
  // and head dims by views (their strides must be numbers).
  Value qHeadStride[2], kHeadStride[2], vHeadStride[2];
  for (auto [w, strides] :
       {std::pair(&q, qHeadStride), std::pair(&key, kHeadStride),
        std::pair(&value, vHeadStride)}) {
    if (ShapedType::isDynamic(w->strides[2]) ||
        ShapedType::isDynamic(w->strides[3]))
      return refuse("query, key or value rows with strides known at run time");
    for (int64_t d = 0; d < 2; ++d) {
      strides[d] = w->stride(k, d);
      if (!strides[d])
        return refuse("a query, key or value stride that is not known");
    }
  }
  // The result [B, H, S, Dv]; read only through transpose(1, 2) (heads
  // side by side, as an attention layer joins them) it is written as
  // [B, S, H, Dv], so the transpose and the reshape after it move no data.
  Value result = op.getOut();
  bool headsInner =
      !result.use_empty() && !k.hasDestination(result) &&
      llvm::all_of(result.getUsers(), [](Operation *user) {
        auto t = dyn_cast<TransposeOp>(user);
        return t && t.getPermutation() == ArrayRef<int64_t>{0, 2, 1, 3};
      });
  Type outElt = tensorType(result).getElementType();
  int64_t rowStride = headsInner ? heads * vDim : vDim;
  Value rowsOfHead = k.scale(qLenV, vDim);
  TileBuilder::Window outW;
  if (headsInner) {
    out = b.create<memref::AllocOp>(
        MemRefType::get({batch, ShapedType::kDynamic, heads, vDim}, outElt),
        ValueRange{qLenV});
    outW = {out, 0, {ShapedType::kDynamic, vDim, rowStride, 1}, {}};
    outW.dynamicStrides = {k.scale(rowsOfHead, heads), Value(), Value(),
                           Value()};
    k.bindWindow(result, outW, result.getLoc());
  } else {
    if (k.hasDestination(result)) {
      out = k.resultBuffer(result);
    } else {
      out = b.create<memref::AllocOp>(TileBuilder::hbmType(tensorType(result)),
                                      ValueRange{qLenV});
      k.bind(result, out);
    }
    outW = {out, 0, {ShapedType::kDynamic, ShapedType::kDynamic, vDim, 1}, {}};
    outW.dynamicStrides = {k.scale(rowsOfHead, heads), rowsOfHead, Value(),
                           Value()};
  }
  Value outHeadStride[2] = {outW.stride(k, 0), outW.stride(k, 1)};

  auto idx = [&](int64_t v) -> OpFoldResult { return b.getIndexAttr(v); };
  auto minI = [&](Value x, Value y) -> Value {
    return b.create<arith::MinSIOp>(x, y);
  };
  auto maxI = [&](Value x, Value y) -> Value {
    return b.create<arith::MaxSIOp>(x, y);
  };
  auto sub = [&](Value x, Value y) -> Value {
    return b.create<arith::SubIOp>(x, y);
  };
  int64_t maxUnits =
      std::max<int64_t>(1, std::min(k.target.matmulMaxMovingFree, bank) / unit);
  int64_t width = maxUnits * unit; // keys of a full step
  constexpr int64_t slots = 4;     // even: a step's parity is its slot's
  int64_t prefix = causal ? kPrefixTiles : 0;
  int64_t resident = prefix * unit; // resident keys per key head slot

  // Loads from ScalarE's queue, as the static kernel's: on SyncE's they
  // would wait behind the output stores.
  auto load = [&](Value src, Value dst) {
    b.create<nisa::DmaCopyOp>(src, dst, nisa::Engine::scalar);
  };
  TileBuilder::TileScope scope(k);
  makeConstants(1);
  Value causalBias;
  if (causal) {
    // kMaskScale * min(q - kv, 0) of a diagonal unit: row p, column j.
    causalBias = k.tile(MemorySpace::sbuf, {unit, unit}, f32);
    b.create<nisa::IotaOp>(causalBias, APFloat(0.0), APFloat(kMaskScale),
                           ArrayRef<double>{-kMaskScale});
    b.create<nisa::TensorScalarOp>(nisa::AluOp::min, causalBias, causalBias,
                                   Value(), APFloat(0.0), false,
                                   nisa::Engine::gpsimd);
    // In the inputs' type (its values, multiples of 2^20 up to 127 * 2^20,
    // are exact in bf16 and fp32, not in fp16), TensorE adds it to the
    // scores in PSUM (I^T bias, accumulating): VectorE is the busier engine.
    if (!inElt.isF16()) {
      Value wide = causalBias;
      causalBias = k.tile(MemorySpace::sbuf, {unit, unit}, inElt);
      b.create<nisa::CopyOp>(wide, causalBias, nisa::Engine::gpsimd);
    }
  }
  // Tiles of their own per role: nisa-insert-sync takes a view with a
  // run-time extent as its whole tile.
  // The prefix tiles' steps (below) are issued kLag steps ahead of their
  // accumulation, so they rotate over kLag + 1 score banks, scratch sets and
  // state sets; the later tiles' two follow (index kLater on), so that a
  // pending prefix step shares nothing with what comes between.
  constexpr int64_t kLag = 2, kLater = kLag + 1;
  Value scoreBanks[kLater + 2], restBank, oPsum;
  for (Value &t : scoreBanks)
    t = k.tile(MemorySpace::psum, {unit, bank}, f32);
  restBank = k.tile(MemorySpace::psum, {unit, bank}, f32);
  oPsum = k.tile(MemorySpace::psum, {unit, vDim}, f32);
  // Resident keys per key head slot: K^T [dim, resident], V [128, units x
  // vDim].
  Value kRes[2], vRes[2];
  if (prefix)
    for (int64_t i = 0; i < 2; ++i) {
      kRes[i] = k.tile(MemorySpace::sbuf, {dim, resident}, inElt);
      vRes[i] = k.tile(MemorySpace::sbuf, {unit, prefix * vDim}, inElt);
    }
  // Streamed keys: `slots` full steps, and the last keys (one tile per V
  // unit: their extents are run-time ones).
  Value kStream = k.tile(MemorySpace::sbuf, {dim, slots * width}, inElt);
  Value vStream =
      k.tile(MemorySpace::sbuf, {unit, slots * maxUnits * vDim}, inElt);
  Value kRest = k.tile(MemorySpace::sbuf, {dim, width}, inElt);
  SmallVector<Value> vRest;
  for (int64_t u = 0; u < maxUnits; ++u)
    vRest.push_back(k.tile(MemorySpace::sbuf, {unit, vDim}, inElt));
  // Per query tile (two sets per kind: consecutive tiles overlap): Q^T and
  // the softmax state (-max, the next step's -max, l, O, the output).
  struct State {
    Value qT, negm, next, l, o, oOut;
  };
  State sets[kLater + 2];
  for (State &s : sets) {
    s.qT = k.tile(MemorySpace::sbuf, {dim, unit}, inElt);
    s.negm = k.tile(MemorySpace::sbuf, {unit, 1}, f32);
    s.next = k.tile(MemorySpace::sbuf, {unit, 1}, f32);
    s.l = k.tile(MemorySpace::sbuf, {unit, 1}, f32);
    s.o = k.tile(MemorySpace::sbuf, {unit, vDim}, f32);
    s.oOut = k.tile(MemorySpace::sbuf, {unit, vDim}, inElt);
  }

  Value one = k.index(1);
  Value qFull = b.create<arith::FloorDivSIOp>(qLenV, k.index(unit));
  Value qRest = b.create<arith::RemSIOp>(qLenV, k.index(unit));
  Value qTilesV = b.create<arith::CeilDivSIOp>(qLenV, k.index(unit));
  // Keys after the resident ones, streamed.
  Value streamed = maxI(sub(kvLenV, k.index(resident)), k.index(0));
  Value fullSteps = b.create<arith::FloorDivSIOp>(streamed, k.index(width));
  Value rest = b.create<arith::RemSIOp>(streamed, k.index(width));
  Value restUnits = b.create<arith::CeilDivSIOp>(rest, k.index(unit));
  Value restAt = k.addOffset(k.scale(fullSteps, width), resident);

  // Where head (bi, h) of a window starts.
  auto headBase = [&](int64_t offset, Value *strides, int64_t bi, int64_t h) {
    Value base = k.index(offset);
    if (bi)
      base = k.addOffsets(base, k.scale(strides[0], bi));
    if (h)
      base = k.addOffsets(base, k.scale(strides[1], h));
    return base;
  };
  Value kBase, vBase; // the current key head's
  auto rowsView = [&](Value t, OpFoldResult rows, int64_t cols,
                      int64_t at = 0) {
    int64_t stride = cast<MemRefType>(t.getType()).getShape()[1];
    return k.view(t, k.index(at), {rows, idx(cols)}, {stride, 1});
  };

  /// What a key step reads and how it is masked.
  struct KeyStep {
    Value kT;          // [dim, keys]
    OpFoldResult keys; // static for all but the last streamed step
    // V of unit u with n keys, n static or not.
    std::function<Value(int64_t, OpFoldResult)> vOf;
    // Units (all maxUnits of them when null): the last step's, counted at
    // run time.
    Value units;
    int64_t staticUnits = 0;
    // The last unit's keys when that is a diagonal (run-time rows).
    OpFoldResult lastUnitKeys;
    Value diagBias; // added to the last unit's scores
    Value iotaAt;   // kMaskScale * (first query - first key): iota mask
    Value sTile;
    int64_t scratch = 0; // its set of scratch tiles (below)
  };
  // Scratch tiles per score bank (and the last streamed step's): a step
  // whose scores go to the other bank need not wait for this one's readers
  // of them, so consecutive steps (and query tiles) overlap.
  struct Scratch {
    Value max, sums, alpha, p, pT, mask;
  };
  // One per score bank, and the last streamed step's (kRestScratch); only
  // streamed steps (the later tiles') are masked by an iota.
  constexpr int64_t kRestScratch = kLater + 2;
  Scratch scratches[kRestScratch + 1];
  for (int64_t i = 0; i <= kRestScratch; ++i) {
    Scratch &t = scratches[i];
    t.max = k.tile(MemorySpace::sbuf, {unit, 1}, f32);
    t.sums = k.tile(MemorySpace::sbuf, {unit, 1}, f32);
    t.alpha = k.tile(MemorySpace::sbuf, {unit, 1}, f32);
    t.p = k.tile(MemorySpace::sbuf, {unit, width}, inElt);
    t.pT = k.tile(MemorySpace::sbuf, {unit, width}, inElt);
    if (causal && i >= kLater)
      t.mask = k.tile(MemorySpace::sbuf, {unit, width}, f32);
  }
  // A key step in two halves of two phases each, so that the next step's
  // scores can be issued between this one's (each engine runs its
  // instructions in order): `scores` 0: S = Q K^T and the running max, 1:
  // P = exp(S - max) with its row sums, alpha and l; `accumulate` 0: P^T to
  // SBUF, 1: O = O * alpha + P V.
  auto scores = [&](const State &st, OpFoldResult rows, const KeyStep &ks,
                    int phase) {
    const Scratch &scratch = scratches[ks.scratch];
    auto col = [&](Value t) { return rowsView(t, rows, 1); };
    Value negm = col(st.negm), next = col(st.next), alphaT = col(scratch.alpha);
    Value qT = k.view(st.qT, k.index(0), {idx(dim), rows}, {unit, 1});
    Value s = k.view(ks.sTile, k.index(0), {rows, ks.keys}, {bank, 1});
    Value mt = col(scratch.max);
    if (phase == 1) {
      Value p = k.view(scratch.p, k.index(0), {rows, ks.keys}, {width, 1});
      Value sums = col(scratch.sums);
      b.create<nisa::ActivationOp>(s, p, next, Value(), sums,
                                   nisa::ActivationFn::exp, APFloat(scale),
                                   APFloat(0.0));
      b.create<nisa::ActivationOp>(negm, alphaT, next, nisa::ActivationFn::exp,
                                   APFloat(-1.0), APFloat(0.0));
      Value l = col(st.l);
      scalarTensorTensor(l, alphaT, 0.0, nisa::AluOp::multiply, sums,
                         nisa::AluOp::add, l, nisa::Engine::gpsimd);
      b.create<nisa::CopyOp>(next, negm, nisa::Engine::gpsimd);
      return;
    }
    b.create<nisa::MatmulOp>(qT, ks.kT, s);
    if (ks.diagBias) {
      int64_t at = (ks.staticUnits - 1) * unit;
      Value part =
          k.view(ks.sTile, k.index(at), {rows, ks.lastUnitKeys}, {bank, 1});
      Value bias =
          k.view(ks.diagBias, k.index(0), {rows, ks.lastUnitKeys}, {unit, 1});
      if (inElt.isF16())
        b.create<nisa::TensorTensorOp>(nisa::AluOp::add, part, bias, part);
      else
        b.create<nisa::MatmulOp>(
             k.view(ident, k.index(0), {rows, rows}, {unit, 1}), bias, part)
            .setAccumulate(true);
    }
    if (ks.iotaAt) {
      Value vv = k.view(scratch.mask, k.index(0), {rows, ks.keys}, {width, 1});
      b.create<nisa::IotaOp>(vv, ks.iotaAt, APFloat(0.0), APFloat(kMaskScale),
                             ArrayRef<double>{-kMaskScale});
      scalarTensorTensor(vv, Value(), 0.0, nisa::AluOp::min, s,
                         nisa::AluOp::add, s, nisa::Engine::vector);
    }
    b.create<nisa::TensorReduceOp>(nisa::AluOp::max, s, mt);
    // -max' = min(-scale * max(row), -max); alpha = exp(max - max').
    scalarTensorTensor(mt, Value(), -scale, nisa::AluOp::multiply, negm,
                       nisa::AluOp::min, next, nisa::Engine::gpsimd);
  };
  auto accumulate = [&](const State &st, OpFoldResult rows, const KeyStep &ks,
                        int phase) {
    const Scratch &scratch = scratches[ks.scratch];
    auto unitKeys = [&](int64_t u) -> OpFoldResult {
      if (ks.units)
        return b
            .create<arith::MinSIOp>(
                b.create<arith::SubIOp>(rest, k.index(u * unit)), k.index(unit))
            .getResult();
      if (u + 1 == ks.staticUnits && ks.lastUnitKeys)
        return ks.lastUnitKeys;
      return idx(unit);
    };
    auto eachUnit = [&](llvm::function_ref<void(int64_t, OpFoldResult)> body) {
      for (int64_t u = 0; u < ks.staticUnits; ++u) {
        if (!ks.units) {
          body(u, unitKeys(u));
          continue;
        }
        k.ifMore(ks.units, u, [&] { body(u, unitKeys(u)); });
      }
    };
    // P^T a unit at a time into the scores' bank (exp has read them), unit u
    // at column u * 128; then to SBUF and O += P^T^T V.
    if (phase == 0) {
      Value identRows = k.view(ident, k.index(0), {rows, rows}, {unit, 1});
      eachUnit([&](int64_t u, OpFoldResult n) {
        b.create<nisa::MatmulOp>(
            k.view(scratch.p, k.index(u * unit), {rows, n}, {width, 1}),
            identRows,
            k.view(ks.sTile, k.index(u * unit), {n, rows}, {bank, 1}));
      });
      eachUnit([&](int64_t u, OpFoldResult n) {
        b.create<nisa::CopyOp>(
            k.view(ks.sTile, k.index(u * unit), {n, rows}, {bank, 1}),
            k.view(scratch.pT, k.index(u * unit), {n, rows}, {width, 1}),
            nisa::Engine::scalar);
      });
      return;
    }
    Value oPs = k.view(oPsum, k.index(0), {rows, idx(vDim)}, {vDim, 1});
    eachUnit([&](int64_t u, OpFoldResult n) {
      auto mm = b.create<nisa::MatmulOp>(
          k.view(scratch.pT, k.index(u * unit), {n, rows}, {width, 1}),
          ks.vOf(u, n), oPs);
      if (u > 0)
        mm.setAccumulate(true);
    });
    Value o = rowsView(st.o, rows, vDim);
    scalarTensorTensor(o, rowsView(scratch.alpha, rows, 1), 0.0,
                       nisa::AluOp::multiply, oPs, nisa::AluOp::add, o,
                       nisa::Engine::vector);
  };
  auto step = [&](const State &st, OpFoldResult rows, const KeyStep &ks) {
    for (int phase : {0, 1})
      scores(st, rows, ks, phase);
    for (int phase : {0, 1})
      accumulate(st, rows, ks, phase);
  };

  // Resident keys: units [first, first + n) of the key head slot, the last
  // one of `lastKeys` keys when given (a diagonal).
  auto residentStep = [&](int64_t slot, int64_t first, int64_t n,
                          Value lastKeys, int64_t bankIdx) {
    KeyStep ks;
    OpFoldResult keys = idx(n * unit);
    if (lastKeys) {
      keys = k.addOffset(lastKeys, (n - 1) * unit);
      ks.lastUnitKeys = lastKeys;
      ks.diagBias = causalBias;
    }
    ks.keys = keys;
    ks.kT = k.view(kRes[slot], k.index(first * unit), {idx(dim), keys},
                   {resident, 1});
    ks.staticUnits = n;
    ks.vOf = [&, slot, first](int64_t u, OpFoldResult nk) {
      return k.view(vRes[slot], k.index((first + u) * vDim), {nk, idx(vDim)},
                    {prefix * vDim, 1});
    };
    ks.sTile = scoreBanks[bankIdx];
    ks.scratch = bankIdx;
    return ks;
  };

  int64_t bi = 0, h = 0, slot = 0;
  // Q^T of rows [q0, q0 + rows) of head (bi, h) into state set `set`.
  auto loadQuery = [&](Value q0, OpFoldResult rows, int64_t set) {
    Value qAt = k.addOffsets(headBase(q.offset, qHeadStride, bi, h),
                             k.scale(q0, q.strides[2]));
    load(k.view(q.buffer, qAt, {idx(dim), rows}, {q.strides[3], q.strides[2]}),
         k.view(sets[set].qT, k.index(0), {idx(dim), rows}, {unit, 1}));
  };
  // A query tile's state before its first key step (set on GpSimd: VectorE
  // is the busier engine), and its output after its last: out = O / l.
  auto startTile = [&](const State &st, OpFoldResult rows) {
    auto gpsimd = nisa::Engine::gpsimd;
    b.create<nisa::MemsetOp>(rowsView(st.negm, rows, 1),
                             APFloat(double(std::numeric_limits<float>::max())),
                             gpsimd);
    b.create<nisa::MemsetOp>(rowsView(st.l, rows, 1), APFloat(0.0), gpsimd);
    b.create<nisa::MemsetOp>(rowsView(st.o, rows, vDim), APFloat(0.0), gpsimd);
  };
  auto finishTile = [&](Value q0, OpFoldResult rows, const State &st,
                        int64_t bi, int64_t h) {
    Value oOut = rowsView(st.oOut, rows, vDim);
    b.create<nisa::TensorScalarOp>(
        nisa::AluOp::divide, rowsView(st.o, rows, vDim), oOut,
        rowsView(st.l, rows, 1), APFloat(0.0), false, nisa::Engine::gpsimd);
    Value to = k.addOffsets(headBase(0, outHeadStride, bi, h),
                            k.scale(q0, outW.strides[2]));
    k.dma(oOut, k.view(out, to, {rows, idx(vDim)},
                       {outW.strides[2], outW.strides[3]}));
  };
  // The later tiles' parity of score banks: it alternates across steps and
  // tiles, so a step's scores need not wait for the last step's transposes
  // out of the same bank.
  int64_t nextBank = 0;
  // A query tile after the prefix ones: rows [q0, q0 + rows) of head
  // (bi, h), with state set `set` (its Q^T loaded): every resident key,
  // then the streamed ones.
  auto queryTile = [&](Value q0, OpFoldResult rows, int64_t set) {
    const State &st = sets[set];
    startTile(st, rows);
    int64_t parity = nextBank;
    for (int64_t first = 0; first < prefix; first += maxUnits) {
      step(st, rows,
           residentStep(slot, first, std::min(maxUnits, prefix - first),
                        Value(), kLater + parity));
      parity ^= 1;
    }
    nextBank = parity;
    // Streamed keys: the full steps, then the last ones.
    // kMaskScale * (q0 - first key), the first key's negation `negK0`
    // built without a subtraction: an iota offset is a sum of terms.
    auto iotaAt = [&](Value negK0) -> Value {
      if (!causal)
        return Value();
      return k.scale(k.addOffsets(q0, negK0), (int64_t)kMaskScale);
    };
    auto loadStep = [&](Value j, int64_t s) {
      Value first = k.addOffset(k.scale(j, width), resident);
      load(k.view(key.buffer,
                  k.addOffsets(kBase, k.scale(first, key.strides[2])),
                  {dim, width}, {key.strides[3], key.strides[2]}),
           k.view(kStream, k.index(s * width), {dim, width},
                  {slots * width, 1}));
      load(
          k.view(value.buffer,
                 k.addOffsets(vBase, k.scale(first, value.strides[2])),
                 {unit, maxUnits, vDim},
                 {value.strides[2], unit * value.strides[2], value.strides[3]}),
          k.view(vStream, k.index(s * maxUnits * vDim), {unit, maxUnits, vDim},
                 {slots * maxUnits * vDim, vDim, 1}));
    };
    auto compute = [&](Value j, int64_t s, Value) {
      KeyStep ks;
      ks.keys = idx(width);
      ks.kT =
          k.view(kStream, k.index(s * width), {dim, width}, {slots * width, 1});
      ks.staticUnits = maxUnits;
      ks.vOf = [&, s](int64_t u, OpFoldResult) {
        return k.view(vStream, k.index((s * maxUnits + u) * vDim), {unit, vDim},
                      {slots * maxUnits * vDim, 1});
      };
      ks.iotaAt = iotaAt(k.addOffset(k.scale(j, -width), -resident));
      ks.scratch = kLater + (parity + s) % 2;
      ks.sTile = scoreBanks[ks.scratch];
      step(st, rows, ks);
    };
    k.forEachPipelinedDynamic(fullSteps, slots, loadStep, compute);
    k.ifMore(rest, 0, [&] {
      load(k.view(key.buffer,
                  k.addOffsets(kBase, k.scale(restAt, key.strides[2])),
                  {idx(dim), rest}, {key.strides[3], key.strides[2]}),
           k.view(kRest, k.index(0), {idx(dim), rest}, {width, 1}));
      for (int64_t u = 0; u < maxUnits; ++u)
        k.ifMore(restUnits, u, [&] {
          Value n = minI(sub(rest, k.index(u * unit)), k.index(unit));
          Value from = k.addOffsets(
              vBase, k.scale(k.addOffset(restAt, u * unit), value.strides[2]));
          load(k.view(value.buffer, from, {n, idx(vDim)},
                      {value.strides[2], value.strides[3]}),
               k.view(vRest[u], k.index(0), {n, idx(vDim)}, {vDim, 1}));
        });
      KeyStep ks;
      ks.keys = rest;
      ks.kT = k.view(kRest, k.index(0), {idx(dim), rest}, {width, 1});
      ks.units = restUnits;
      ks.staticUnits = maxUnits;
      ks.vOf = [&](int64_t u, OpFoldResult n) {
        return k.view(vRest[u], k.index(0), {n, idx(vDim)}, {vDim, 1});
      };
      ks.iotaAt = iotaAt(k.addOffset(k.scale(fullSteps, -width), -resident));
      ks.sTile = restBank;
      ks.scratch = kRestScratch;
      step(st, rows, ks);
    });
    finishTile(q0, rows, st, bi, h);
  };

  // Key head `headIdx`'s resident keys: [0, min(S, resident)).
  auto loadResident = [&](int64_t headIdx) {
    if (!prefix)
      return;
    int64_t s = headIdx % 2, b0 = headIdx / kvHeads, hk = headIdx % kvHeads;
    Value kb = headBase(key.offset, kHeadStride, b0, hk);
    Value vb = headBase(value.offset, vHeadStride, b0, hk);
    Value keys = minI(kvLenV, k.index(resident));
    load(k.view(key.buffer, kb, {idx(dim), keys},
                {key.strides[3], key.strides[2]}),
         k.view(kRes[s], k.index(0), {idx(dim), keys}, {resident, 1}));
    Value kvFull = b.create<arith::FloorDivSIOp>(kvLenV, k.index(unit));
    Value fullUnits = minI(kvFull, k.index(prefix));
    k.ifMore(fullUnits, 0, [&] {
      load(k.view(value.buffer, vb, {idx(unit), fullUnits, idx(vDim)},
                  {value.strides[2], unit * value.strides[2],
                   value.strides[3]}),
           k.view(vRes[s], k.index(0), {idx(unit), fullUnits, idx(vDim)},
                  {prefix * vDim, vDim, 1}));
    });
    // The short last unit, when it is resident.
    Value kvRest = b.create<arith::RemSIOp>(kvLenV, k.index(unit));
    Value shortUnit = b.create<arith::MulIOp>(
        minI(maxI(sub(k.index(prefix), kvFull), k.index(0)), one),
        minI(kvRest, one));
    k.forEachDynamic(shortUnit, [&](Value) {
      Value first = k.scale(kvFull, unit);
      load(k.view(value.buffer,
                  k.addOffsets(vb, k.scale(first, value.strides[2])),
                  {kvRest, idx(vDim)}, {value.strides[2], value.strides[3]}),
           k.view(vRes[s], k.scale(kvFull, vDim), {kvRest, idx(vDim)},
                  {prefix * vDim, 1}));
    });
  };

  // Prefix tiles, each if the query has it, its keys up to its diagonal,
  // pipelined across tiles and heads: a tile's Q^T loads while the tile
  // before it computes (a load's latency outlasts a short tile), and each
  // step's scores are issued before the steps `kLag` before it accumulate
  // P V (banks, scratch and state sets rotate over kLag + 1).
  SmallVector<Value> rowsOf;
  for (int64_t t = 0; t < prefix; ++t)
    rowsOf.push_back(minI(sub(qLenV, k.index(t * unit)), k.index(unit)));
  struct Pending {
    int64_t tile, set, head, bi, h;
    KeyStep ks;
    bool last;
  };
  std::deque<Pending> pending;
  // The oldest pending step's accumulate phase `phase` (done: off the list).
  auto flush = [&](int phase) {
    const Pending &p = pending.front();
    k.ifMore(qTilesV, p.tile, [&] {
      accumulate(sets[p.set], rowsOf[p.tile], p.ks, phase);
      if (p.last && phase == 1)
        finishTile(k.index(p.tile * unit), rowsOf[p.tile], sets[p.set], p.bi,
                   p.h);
    });
    if (phase == 1)
      pending.pop_front();
  };
  auto flushOlderThan = [&](int64_t head) {
    while (!pending.empty() && pending.front().head < head)
      for (int phase : {0, 1})
        flush(phase);
  };
  int64_t prefixSet = 0, prefixBank = 0;

  int64_t kvHeadsAll = batch * kvHeads;
  loadResident(0);
  for (int64_t headIdx = 0; headIdx < kvHeadsAll; ++headIdx) {
    // The next key head's resident keys go to the slot of the one before
    // this: once that head's pending steps are issued (`drain`: now).
    bool nextLoaded = headIdx + 1 == kvHeadsAll;
    auto loadNext = [&](bool drain) {
      if (drain)
        flushOlderThan(headIdx);
      if (nextLoaded || (!pending.empty() && pending.front().head < headIdx))
        return;
      loadResident(headIdx + 1);
      nextLoaded = true;
    };
    slot = headIdx % 2;
    bi = headIdx / kvHeads;
    int64_t hk = headIdx % kvHeads;
    kBase = headBase(key.offset, kHeadStride, bi, hk);
    vBase = headBase(value.offset, vHeadStride, bi, hk);
    for (int64_t g = 0; g < group; ++g) {
      h = hk * group + g;
      if (prefix)
        k.ifMore(qTilesV, 0,
                 [&] { loadQuery(k.index(0), rowsOf[0], prefixSet); });
      for (int64_t t = 0; t < prefix; ++t) {
        int64_t set = prefixSet;
        prefixSet = (prefixSet + 1) % (kLag + 1);
        if (t + 1 < prefix)
          k.ifMore(qTilesV, t + 1, [&] {
            loadQuery(k.index((t + 1) * unit), rowsOf[t + 1], prefixSet);
          });
        int64_t units = t + 1;
        for (int64_t first = 0; first < units; first += maxUnits) {
          int64_t n = std::min(maxUnits, units - first);
          bool last = first + n == units;
          KeyStep ks = residentStep(slot, first, n, last ? rowsOf[t] : Value(),
                                    prefixBank);
          prefixBank = (prefixBank + 1) % (kLag + 1);
          bool full = (int64_t)pending.size() == kLag;
          for (int phase : {0, 1}) {
            k.ifMore(qTilesV, t, [&] {
              if (first == 0 && phase == 0)
                startTile(sets[set], rowsOf[t]);
              scores(sets[set], rowsOf[t], ks, phase);
            });
            if (full)
              flush(phase);
          }
          pending.push_back(Pending{t, set, headIdx, bi, h, ks, last});
          loadNext(/*drain=*/false);
        }
      }
      loadNext(/*drain=*/true);
      // The full tiles after them, then the short last one if it is not a
      // prefix tile.
      k.forEachDynamic(maxI(sub(qFull, k.index(prefix)), k.index(0)),
                       [&](Value i) {
                         Value q0 = k.scale(k.addOffset(i, prefix), unit);
                         loadQuery(q0, idx(unit), kLater);
                         queryTile(q0, idx(unit), kLater);
                       });
      Value lastTile = b.create<arith::MulIOp>(
          minI(maxI(k.addOffset(sub(qFull, k.index(prefix)), 1), k.index(0)),
               one),
          minI(qRest, one));
      k.forEachDynamic(lastTile, [&](Value) {
        loadQuery(k.scale(qFull, unit), qRest, kLater + 1);
        queryTile(k.scale(qFull, unit), qRest, kLater + 1);
      });
    }
  }
  flushOlderThan(kvHeadsAll);
  return success();
}

} // namespace mlir::neuron::flex
