//===- LowerFlexAttentionDynamic.cpp - attention over a run-time length ---===//
//
// The forward kernel of a neuron.flex_attention whose key length is known at
// run time only (issue #16: a KV cache growing by a token per call), one
// program for every length:
//  - per (batch, key head), unrolled (their offsets are multiples of the
//    length): Q^T of its query heads, their rows side by side in one query
//    tile (decode: a few rows per head);
//  - keys stream through SBUF in steps of up to a PSUM bank of fp32 scores
//    (512): the full steps counted at run time, their K^T and V loaded
//    slots - 1 steps ahead; the last keys (length mod 512) one step whose
//    free extents are size expressions, loaded first;
//  - per step the online softmax of the static kernel: S = Q K^T in PSUM,
//    -max, alpha, P = exp(S - max) with its row sums on ScalarE, P^T on
//    TensorE, O = O * alpha + P V. The state starts at -max = huge, l = 0,
//    O = 0, so every step is alike (no first step known at compile time).
//
// What it cannot do (a mask, score_mod, a query length known at run time,
// key or value views) is refused with "not size-generic": the backend then
// compiles per size.
//===----------------------------------------------------------------------===//

#include "passes/flex_attention/FlexAttentionLowering.h"

#include <limits>

namespace mlir::neuron::flex {

LogicalResult FlexAttentionLowering::runDynamic() {
  auto refuse = [&](const Twine &why) {
    return emitError(op.getLoc())
           << "not size-generic: " << op->getName() << ": " << why;
  };
  auto qType = tensorType(op.getQuery()), kType = tensorType(op.getKey()),
       vType = tensorType(op.getValue());
  for (auto [t, what] : {std::pair(qType, "query"), std::pair(kType, "key"),
                         std::pair(vType, "value")})
    for (int64_t d : {0, 1, 3})
      if (t.isDynamicDim(d))
        return refuse(Twine("a batch, head or head-dim size of the ") + what +
                      " known at run time");
  if (qType.isDynamicDim(2))
    return runPrefillDynamic();
  if (!op.getScoreBuffers().empty() || !op.getMaskBuffers().empty())
    return refuse("modifiers that capture tensors");
  if (::mlir::failed(setUp(op)))
    return failure();
  Block &scoreBody = op.getScoreMod().front();
  if (cast<YieldOp>(scoreBody.getTerminator()).getValues()[0] !=
          scoreBody.getArgument(0) ||
      scale <= 0)
    return refuse("a score_mod or a scale that is not positive");
  // A mask_mod that is constant true keeps every block whatever its class.
  Value keep =
      cast<YieldOp>(op.getMaskMod().front().getTerminator()).getValues()[0];
  if (auto c = keep.getDefiningOp<ConstantOp>())
    if (auto attr = dyn_cast<DenseElementsAttr>(c.getValue()))
      maskTrivial = attr.isSplat() && attr.getSplatValue<bool>();
  if (!maskTrivial && llvm::any_of(blockKinds, [](int8_t c) {
        return c != (int8_t)Kind::full;
      }))
    return refuse("a mask over a key length known at run time");
  if (llvm::is_contained(blockKinds, (int8_t)Kind::masked))
    return refuse("masked blocks over a key length known at run time");
  int64_t rows = group * qLen; // the query tile: every query head's rows
  if (rows > unit)
    return refuse(Twine(rows) + " query rows per key head (" + Twine(unit) +
                  " at most)");
  if (vDim > bank)
    return op.emitOpError("value head dims above ")
           << bank << " are not supported";
  if (k.isWindow(op.getKey()) || k.isWindow(op.getValue()))
    return refuse("key or value is a strided view");
  Value kvLenV = k.dimOf(op.getKey(), 2), vLenV = k.dimOf(op.getValue(), 2);
  if (!kvLenV || !vLenV)
    return refuse("the key length is not known");
  if (!sameIndex(kvLenV, vLenV))
    return refuse("key and value lengths not known to be one size");

  std::tie(out, outStrides) = resultLayout(op.getOut());
  if (!op.getLse().use_empty()) {
    lse = k.resultBuffer(op.getLse());
    lseStrides = contiguousStrides(tensorType(op.getLse()).getShape());
  }

  int64_t maxUnits =
      std::max<int64_t>(1, std::min(k.target.matmulMaxMovingFree, bank) / unit);
  int64_t width = maxUnits * unit; // keys of a full step
  constexpr int64_t slots = 4;     // even: a step's parity is its slot's
  auto idx = [&](int64_t v) -> OpFoldResult { return b.getIndexAttr(v); };
  auto dynView = [&](Value base, Value offset, ArrayRef<OpFoldResult> shape,
                     ArrayRef<int64_t> strides) {
    return k.view(base, offset, shape, strides);
  };

  // Loads from ScalarE's queue, as the static kernel's: on SyncE's they
  // would wait behind the previous key head's output stores.
  auto load = [&](Value src, Value dst) {
    b.create<nisa::DmaCopyOp>(src, dst, nisa::Engine::scalar);
  };
  TileBuilder::TileScope scope(k);
  Value diff = k.tile(MemorySpace::sbuf, {unit, unit}, f32);
  b.create<nisa::IotaOp>(diff, APFloat(0.0), APFloat(1.0),
                         b.getDenseF64ArrayAttr({-1.0}));
  ident = k.tile(MemorySpace::sbuf, {unit, unit}, inElt);
  b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, diff, ident, Value(),
                                 APFloat(0.0), false);
  // PSUM: scores of even and odd full steps, then O.
  psumCols = 3 * bank;
  psum = k.tile(MemorySpace::psum, {unit, psumCols}, f32);
  Value oPs = k.view(psum, k.index(2 * bank), {rows, vDim}, {psumCols, 1});
  // Stream slots per head slot: the next key head's first loads need not
  // wait for this head's steps.
  constexpr int64_t streams = 2 * slots;
  Value kTs = k.tile(MemorySpace::sbuf, {dim, streams * width}, inElt);
  Value vSs =
      k.tile(MemorySpace::sbuf, {unit, streams * maxUnits * vDim}, inElt);
  // The last step's keys and Q^T alternate between two slots by key head:
  // the next head's loads need not wait for this head's last step.
  // Tiles of their own: nisa-insert-sync takes a view with a run-time
  // extent as its whole tile, which must not hold the other head's keys,
  // the full steps' scores, nor another unit's values (whose loads would
  // then wait for each other).
  Value kTRest[2], psumRest[2];
  SmallVector<Value> vRest[2];
  for (int64_t i = 0; i < 2; ++i) {
    kTRest[i] = k.tile(MemorySpace::sbuf, {dim, width}, inElt);
    for (int64_t u = 0; u < maxUnits; ++u)
      vRest[i].push_back(k.tile(MemorySpace::sbuf, {unit, vDim}, inElt));
    psumRest[i] = k.tile(MemorySpace::psum, {unit, bank}, f32);
  }
  Value qTiles = k.tile(MemorySpace::sbuf, {dim, 2 * rows}, inElt);
  Value qTile;
  // The softmax state, per head slot: -max and alpha in a column per full
  // step parity (a step reads its predecessor's -max) and one for the last
  // step (a column known at compile time: nisa-insert-sync takes a run-time
  // one as the whole tile), the row sums l and O.
  Value negms[2], alphas[2];
  for (int64_t i = 0; i < 2; ++i) {
    negms[i] = k.tile(MemorySpace::sbuf, {rows, 3}, f32);
    alphas[i] = k.tile(MemorySpace::sbuf, {rows, 3}, f32);
  }
  Value ls = k.tile(MemorySpace::sbuf, {rows, 2}, f32);
  Value os = k.tile(MemorySpace::sbuf, {rows, 2 * vDim}, f32);
  Value oOuts = k.tile(MemorySpace::sbuf, {rows, 2 * vDim}, inElt);
  int64_t headSlot = 0;
  auto stateCol = [&](Value *t, Value col) {
    return k.view(t[headSlot], col, {rows, 1}, {3, 1});
  };

  Value fullSteps = b.create<arith::FloorDivSIOp>(kvLenV, k.index(width));
  Value rest = b.create<arith::RemSIOp>(kvLenV, k.index(width));
  Value restUnits = b.create<arith::CeilDivSIOp>(rest, k.index(unit));

  // One key step: `kT` [dim, keys], V unit u's rows by `vOf(u)`; `keys` is
  // static for a full step, `rest` for the last one.
  // `col`: the step's state column, `before` its predecessor's.
  auto step = [&](Value kT, OpFoldResult keys,
                  llvm::function_ref<Value(int64_t, OpFoldResult)> vOf,
                  Value sTile, int64_t sAt, int64_t sStride, bool last,
                  Value before, Value col) {
    Value negm = stateCol(negms, before);
    Value next = stateCol(negms, col);
    Value alphaT = stateCol(alphas, col);
    TileBuilder::TileScope stepScope(k);
    // Unit u's key count, and running it only when the step has it.
    auto unitKeys = [&](int64_t u) -> OpFoldResult {
      if (!last)
        return idx(unit);
      return b
          .create<arith::MinSIOp>(
              b.create<arith::SubIOp>(rest, k.index(u * unit)), k.index(unit))
          .getResult();
    };
    auto eachUnit = [&](llvm::function_ref<void(int64_t, OpFoldResult)> body) {
      for (int64_t u = 0; u < maxUnits; ++u) {
        if (!last) {
          body(u, idx(unit));
          continue;
        }
        k.ifMore(restUnits, u, [&] { body(u, unitKeys(u)); });
      }
    };
    Value s = dynView(sTile, k.index(sAt), {idx(rows), keys}, {sStride, 1});
    b.create<nisa::MatmulOp>(qTile, kT, s);
    Value mt = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
    b.create<nisa::TensorReduceOp>(nisa::AluOp::max, s, mt);
    // -max' = min(-scale * max(row), -max); alpha = exp(max - max').
    scalarTensorTensor(mt, Value(), -scale, nisa::AluOp::multiply, negm,
                       nisa::AluOp::min, next, nisa::Engine::gpsimd);
    // P first: alpha is off its path (it rescales what came before).
    Value pFull = k.tile(MemorySpace::sbuf, {rows, width}, inElt);
    Value p = dynView(pFull, k.index(0), {idx(rows), keys}, {width, 1});
    Value sums = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
    b.create<nisa::ActivationOp>(s, p, next, Value(), sums,
                                 nisa::ActivationFn::exp, APFloat(scale),
                                 APFloat(0.0));
    b.create<nisa::ActivationOp>(negm, alphaT, next, nisa::ActivationFn::exp,
                                 APFloat(-1.0), APFloat(0.0));
    scalarTensorTensor(l, alphaT, 0.0, nisa::AluOp::multiply, sums,
                       nisa::AluOp::add, l, nisa::Engine::gpsimd);
    // P^T a unit at a time into the scores' bank (exp has read them).
    eachUnit([&](int64_t u, OpFoldResult n) {
      b.create<nisa::MatmulOp>(
          dynView(pFull, k.index(u * unit), {idx(rows), n}, {width, 1}),
          k.view(ident, k.index(0), {rows, rows}, {unit, 1}),
          dynView(sTile, k.index(sAt + u * rows), {n, idx(rows)},
                  {sStride, 1}));
    });
    Value pT = k.tile(MemorySpace::sbuf, {unit, maxUnits * rows}, inElt);
    if (!last) {
      // ScalarE evicts all but the last of four units, VectorE that one
      // (as the static kernel: VectorE has the max and O's rescale).
      int64_t onScalar = maxUnits < 4 ? maxUnits : maxUnits - 1;
      auto copy = [&](int64_t from, int64_t n, nisa::Engine engine) {
        b.create<nisa::CopyOp>(k.view(sTile, k.index(sAt + from * rows),
                                      {unit, n * rows}, {sStride, 1}),
                               k.view(pT, k.index(from * rows),
                                      {unit, n * rows}, {maxUnits * rows, 1}),
                               engine);
      };
      copy(0, onScalar, nisa::Engine::scalar);
      if (onScalar < maxUnits)
        copy(onScalar, maxUnits - onScalar, nisa::Engine::vector);
    } else {
      eachUnit([&](int64_t u, OpFoldResult n) {
        b.create<nisa::CopyOp>(dynView(sTile, k.index(sAt + u * rows),
                                       {n, idx(rows)}, {sStride, 1}),
                               dynView(pT, k.index(u * rows), {n, idx(rows)},
                                       {maxUnits * rows, 1}),
                               nisa::Engine::scalar);
      });
    }
    eachUnit([&](int64_t u, OpFoldResult n) {
      auto mm = b.create<nisa::MatmulOp>(
          dynView(pT, k.index(u * rows), {n, idx(rows)}, {maxUnits * rows, 1}),
          vOf(u, n), oPs);
      if (u > 0)
        mm.setAccumulate(true);
    });
    scalarTensorTensor(o, alphaT, 0.0, nisa::AluOp::multiply, oPs,
                       nisa::AluOp::add, o, nisa::Engine::vector);
  };

  // Key head `headIdx` (batch-major): its state and slots, and where its
  // keys and values start (a multiple of the run-time length).
  int64_t bi = 0, hk = 0;
  Value kBase, vBase;
  auto setHead = [&](int64_t headIdx) {
    bi = headIdx / kvHeads;
    hk = headIdx % kvHeads;
    headSlot = headIdx % 2;
    auto headBase = [&](const TileBuilder::Window &w, int64_t d) {
      Value base = headIdx ? k.scale(kvLenV, headIdx * d) : k.index(0);
      return k.addOffset(base, w.offset);
    };
    kBase = headBase(key, dim);
    vBase = headBase(value, vDim);
    l = k.view(ls, k.index(headSlot), {rows, 1}, {2, 1});
    o = k.view(os, k.index(headSlot * vDim), {rows, vDim}, {2 * vDim, 1});
    oOut = k.view(oOuts, k.index(headSlot * vDim), {rows, vDim}, {2 * vDim, 1});
    qTile =
        k.view(qTiles, k.index(headSlot * rows), {dim, rows}, {2 * rows, 1});
  };
  Value restAt = k.scale(fullSteps, width);
  auto loadStep = [&](Value j, int64_t slot) {
    Value first = k.scale(j, width);
    load(k.view(key.buffer, k.addOffsets(kBase, k.scale(first, dim)),
                {dim, width}, {1, dim}),
         k.view(kTs, k.index((headSlot * slots + slot) * width), {dim, width},
                {streams * width, 1}));
    load(k.view(value.buffer, k.addOffsets(vBase, k.scale(first, vDim)),
                {unit, maxUnits, vDim}, {vDim, unit * vDim, 1}),
         k.view(vSs, k.index((headSlot * slots + slot) * maxUnits * vDim),
                {unit, maxUnits, vDim}, {streams * maxUnits * vDim, vDim, 1}));
  };
  // What a key head needs before its steps: Q^T, the state, the last keys
  // and the first full steps' keys. Emitted before the previous head's
  // steps, so its loads run under them.
  auto prologue = [&](int64_t headIdx) {
    setHead(headIdx);
    for (int64_t g = 0; g < group; ++g) {
      int64_t h = hk * group + g;
      Value at = k.index(q.offset + bi * q.strides[0] + h * q.strides[1]);
      load(k.view(q.buffer, at, {dim, qLen}, {q.strides[3], q.strides[2]}),
           k.view(qTiles, k.index(headSlot * rows + g * qLen), {dim, qLen},
                  {2 * rows, 1}));
    }
    b.create<nisa::MemsetOp>(
        k.view(negms[headSlot], k.index(0), {rows, 2}, {3, 1}),
        APFloat(std::numeric_limits<float>::max()));
    b.create<nisa::MemsetOp>(l, APFloat(0.0));
    b.create<nisa::MemsetOp>(o, APFloat(0.0));
    k.ifMore(rest, 0, [&] {
      load(dynView(key.buffer, k.addOffsets(kBase, k.scale(restAt, dim)),
                   {idx(dim), rest}, {1, dim}),
           dynView(kTRest[headSlot], k.index(0), {idx(dim), rest}, {width, 1}));
    });
    for (int64_t u = 0; u < maxUnits; ++u)
      k.ifMore(restUnits, u, [&] {
        Value n = b.create<arith::MinSIOp>(
            b.create<arith::SubIOp>(rest, k.index(u * unit)), k.index(unit));
        Value from =
            k.addOffsets(vBase, k.scale(k.addOffset(restAt, u * unit), vDim));
        load(
            dynView(value.buffer, from, {n, idx(vDim)}, {vDim, 1}),
            dynView(vRest[headSlot][u], k.index(0), {n, idx(vDim)}, {vDim, 1}));
      });
    k.pipelinedDynamicFirstLoads(fullSteps, slots, loadStep);
  };
  // The key head's steps (the full ones, then the last keys) and results.
  auto body = [&](int64_t headIdx) {
    setHead(headIdx);
    auto compute = [&](Value, int64_t slot) {
      Value kT = k.view(kTs, k.index((headSlot * slots + slot) * width),
                        {dim, width}, {streams * width, 1});
      step(
          kT, idx(width),
          [&](int64_t u, OpFoldResult) {
            return k.view(
                vSs, k.index(((headSlot * slots + slot) * maxUnits + u) * vDim),
                {unit, vDim}, {streams * maxUnits * vDim, 1});
          },
          psum, slot % 2 * bank, psumCols, false, k.index(1 - slot % 2),
          k.index(slot % 2));
    };
    k.forEachPipelinedDynamic(fullSteps, slots, loadStep, compute,
                              /*firstLoads=*/false);
    k.ifMore(rest, 0, [&] {
      step(
          dynView(kTRest[headSlot], k.index(0), {idx(dim), rest}, {width, 1}),
          rest,
          [&](int64_t u, OpFoldResult n) {
            return dynView(vRest[headSlot][u], k.index(0), {n, idx(vDim)},
                           {vDim, 1});
          },
          psumRest[headSlot], 0, bank, true,
          b.create<arith::SubIOp>(
              k.index(1), b.create<arith::RemSIOp>(fullSteps, k.index(2))),
          k.index(2));
    });
    // out = O / l; lse = log(l) + max.
    TileBuilder::TileScope finish(k);
    b.create<nisa::TensorScalarOp>(nisa::AluOp::divide, o, oOut, l,
                                   APFloat(0.0), false, nisa::Engine::gpsimd);
    for (int64_t g = 0; g < group; ++g) {
      int64_t h = hk * group + g;
      Value to = k.index(bi * outStrides[0] + h * outStrides[1]);
      k.dma(k.view(oOuts, k.index(g * qLen * 2 * vDim + headSlot * vDim),
                   {qLen, vDim}, {2 * vDim, 1}),
            k.view(out, to, {qLen, vDim}, {outStrides[2], 1}));
    }
    if (!lse)
      return;
    Value lt = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
    b.create<nisa::ActivationOp>(l, lt, Value(), nisa::ActivationFn::log,
                                 APFloat(1.0), APFloat(0.0));
    // The last step's column: 2 if there are last keys, else the parity
    // column of full step fullSteps - 1.
    Value parity =
        b.create<arith::RemSIOp>(k.addOffset(fullSteps, 1), k.index(2));
    Value lastCol = k.addOffsets(
        parity,
        b.create<arith::MulIOp>(b.create<arith::MinSIOp>(rest, k.index(1)),
                                b.create<arith::SubIOp>(k.index(2), parity)));
    b.create<nisa::TensorTensorOp>(nisa::AluOp::subtract, lt,
                                   stateCol(negms, lastCol), lt,
                                   nisa::Engine::gpsimd);
    for (int64_t g = 0; g < group; ++g) {
      int64_t h = hk * group + g;
      k.dma(k.view(lt, k.index(g * qLen), {qLen, 1}, {1, 1}),
            k.view(lse, k.index(bi * lseStrides[0] + h * lseStrides[1]),
                   {qLen, 1}, {1, 1}));
    }
  };
  int64_t kvHeadsAll = batch * kvHeads;
  prologue(0);
  for (int64_t headIdx = 0; headIdx < kvHeadsAll; ++headIdx) {
    if (headIdx + 1 < kvHeadsAll)
      prologue(headIdx + 1);
    body(headIdx);
  }
  return success();
}

} // namespace mlir::neuron::flex
