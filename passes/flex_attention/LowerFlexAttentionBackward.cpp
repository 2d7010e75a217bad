//===- LowerFlexAttentionBackward.cpp - flex_attention_backward -> nisa ---===//
//
// One blockwise kernel per neuron.flex_attention_backward, with the forward
// kernel's block skipping:
//  - per (batch, key head): K (rows and K^T) and V^T in SBUF; fp32 dK and
//    dV accumulators;
//  - per query head of that key head: Q, Q^T, dO, dO^T and O in SBUF; per
//    query tile -lse and delta = rowsum(dO * O); an fp32 dQ accumulator;
//  - per key unit (128 keys), over the query tiles its blocks keep:
//    S = Q K^T recomputed (one step ahead of the gradients), score_mod and
//    the mask as in the forward,
//    P = exp(S - lse); dV += P^T dO and dK += dS^T Q accumulate in PSUM
//    across the query tiles, dS = score_grad(P * (dO V^T - delta)), and
//    dQ += dS K through a TensorE transpose of dS.
// Fully masked units are never visited; full units skip mask_mod.
//
//===----------------------------------------------------------------------===//

#include "passes/flex_attention/FlexAttentionLowering.h"

#include <limits>

namespace mlir::neuron::flex {

namespace {
// PSUM banks of the backward kernel: scores and dP alternate between two
// banks each; dV and dK accumulate side by side in one; dS^T and a dQ
// partial get one each; the last flips captured tables (gatherWindow).
constexpr int64_t kScoreBanks = 0, kDPBanks = 2, kGradKVBank = 4,
                  kDSTBank = 5, kDQBank = 6, kMiscBank = 7, kBanks = 8;
} // namespace

/// `len` rows of `width` elements of window `w` from `base` (rows at stride
/// w.strides[2]) into `dst`, a 128-row unit per `width` columns.
Value FlexAttentionLowering::loadRowsOf(const KernelLowering::Window &w,
                                        Value base, int64_t len,
                                        int64_t width, Value dst) {
  int64_t rs = w.strides[2], es = w.strides[3];
  int64_t stride = cast<MemRefType>(dst.getType()).getShape()[1];
  int64_t full = len / kUnit, rest = len % kUnit;
  if (full)
    k.dma(k.view(w.buffer, base, {kUnit, full, width},
                 {rs, kUnit * rs, es}),
          k.view(dst, k.index(0), {kUnit, full, width}, {stride, width, 1}));
  if (rest)
    k.dma(k.view(w.buffer, k.addOffset(base, full * kUnit * rs), {rest, width},
                 {rs, es}),
          k.view(dst, k.index(full * width), {rest, width}, {stride, 1}));
  return dst;
}

/// The transpose [width, len] of `len` rows of window `w` from `base`: one
/// transposing DMA.
Value FlexAttentionLowering::loadTransposed(const KernelLowering::Window &w,
                                            Value base, int64_t len,
                                            int64_t width, Value dst) {
  k.dma(k.view(w.buffer, base, {width, len}, {w.strides[3], w.strides[2]}),
        k.view(dst, k.index(0), {width, len},
               {cast<MemRefType>(dst.getType()).getShape()[1], 1}));
  return dst;
}

/// factor * `src` (fp32, a 128-row unit per `width` columns) cast to the
/// result type, stored as `len` rows from `base` of `buffer`.
void FlexAttentionLowering::storeRows(Value src, int64_t width, int64_t len,
                                      Value buffer, Value base,
                                      int64_t rowStride, double factor) {
  KernelLowering::TileScope scope(k);
  int64_t units = (len + kUnit - 1) / kUnit;
  Value res = k.tile(MemorySpace::sbuf, {kUnit, units * width}, inElt);
  b.create<nisa::TensorScalarOp>(k.loc, nisa::AluOp::multiply, src, res,
                                 Value(), APFloat(factor), false,
                                 nisa::Engine::gpsimd);
  int64_t full = len / kUnit, rest = len % kUnit;
  if (full)
    k.dma(k.view(res, k.index(0), {kUnit, full, width},
                 {units * width, width, 1}),
          k.view(buffer, base, {kUnit, full, width},
                 {rowStride, kUnit * rowStride, 1}));
  if (rest)
    k.dma(k.view(res, k.index(full * width), {rest, width}, {units * width, 1}),
          k.view(buffer, k.addOffset(base, full * kUnit * rowStride),
                 {rest, width}, {rowStride, 1}));
}

LogicalResult FlexAttentionLowering::runBackward() {
  FlexAttentionBackwardOp o = bwOp;
  if (::mlir::failed(setUp(o)))
    return failure();
  Block &scoreBody = o.getScoreMod().front();
  plainScores = cast<YieldOp>(scoreBody.getTerminator()).getValues()[0] ==
                scoreBody.getArgument(0);
  bw.scoreGrad = &o.getScoreGrad();
  Block &gradBody = bw.scoreGrad->front();
  bw.plainScoreGrad =
      cast<YieldOp>(gradBody.getTerminator()).getValues()[0] ==
      gradBody.getArgument(5);
  if (vDim > k.target.matmulMaxK)
    return o.emitOpError("value head dims above ")
           << k.target.matmulMaxK << " are not supported in the backward";
  if (k.target.psumBanks < kBanks || dim + vDim > bank)
    return o.emitOpError("the backward needs ")
           << kBanks << " PSUM banks and dV and dK side by side in one";
  int64_t elt = std::max<int64_t>(1, tensorType(o.getQuery()).getElementTypeBitWidth() / 8);
  // Per partition: K rows, K^T, V^T; Q, Q^T, dO, dO^T, O; fp32 dQ, dK, dV.
  int64_t bytes = (kvUnits * dim + 2 * kvLen) * elt +
                  (qTiles * (dim + 2 * vDim) + 2 * qLen) * elt +
                  4 * (qTiles * dim + kvUnits * (dim + vDim));
  if (bytes > k.target.sbufBytesPerPartition * 3 / 4)
    return o.emitOpError("sequences of ")
           << qLen << " queries and " << kvLen
           << " keys do not fit in SBUF for the backward (streaming them is "
              "not supported yet)";
  bw.o = k.windowOf(o.getOut());
  bw.dO = k.windowOf(o.getGradOut());
  bw.lseIn = k.windowOf(o.getLse());
  std::tie(bw.outDQ, bw.dqStrides) = resultLayout(o.getGradQuery());
  std::tie(bw.outDK, bw.dkStrides) = resultLayout(o.getGradKey());
  std::tie(bw.outDV, bw.dvStrides) = resultLayout(o.getGradValue());

  KernelLowering::TileScope scope(k);
  makeConstants(kUnit);
  psumCols = kBanks * bank;
  miscBank = kMiscBank;
  psum = k.tile(MemorySpace::psum, {kUnit, psumCols}, f32);
  if (!o.getScoreBuffers().empty() || !o.getMaskBuffers().empty())
    makeAntiIdentities();
  bw.kRows = k.tile(MemorySpace::sbuf, {kUnit, kvUnits * dim}, inElt);
  bw.kT = k.tile(MemorySpace::sbuf, {dim, kvLen}, inElt);
  bw.vT = k.tile(MemorySpace::sbuf, {vDim, kvLen}, inElt);
  bw.qRows = k.tile(MemorySpace::sbuf, {kUnit, qTiles * dim}, inElt);
  bw.qT = k.tile(MemorySpace::sbuf, {dim, qLen}, inElt);
  bw.doRows = k.tile(MemorySpace::sbuf, {kUnit, qTiles * vDim}, inElt);
  bw.doT = k.tile(MemorySpace::sbuf, {vDim, qLen}, inElt);
  bw.oRows = k.tile(MemorySpace::sbuf, {kUnit, qTiles * vDim}, inElt);
  bw.negLse = k.tile(MemorySpace::sbuf, {kUnit, qTiles}, f32);
  bw.delta = k.tile(MemorySpace::sbuf, {kUnit, qTiles}, f32);
  bw.dQ = k.tile(MemorySpace::sbuf, {kUnit, qTiles * dim}, f32);
  bw.dK = k.tile(MemorySpace::sbuf, {kUnit, kvUnits * dim}, f32);
  bw.dV = k.tile(MemorySpace::sbuf, {kUnit, kvUnits * vDim}, f32);
  bw.pIn = k.tile(MemorySpace::sbuf, {kUnit, 2 * kUnit}, inElt);
  bw.dSIn = k.tile(MemorySpace::sbuf, {kUnit, 2 * kUnit}, inElt);

  bool perBatch = blocksShape[0] != 1, perHead = blocksShape[1] != 1;
  for (int64_t bm = 0; bm < blocksShape[0]; ++bm) {
    auto batchBody = [&](Value batchIdx) {
      if (perHead)
        for (int64_t h = 0; h < kvHeads; ++h)
          backwardKeyHead(batchIdx, k.index(h), bm);
      else
        k.forEach(kvHeads,
                  [&](Value h) { backwardKeyHead(batchIdx, h, bm); });
    };
    if (perBatch)
      batchBody(k.index(bm));
    else
      k.forEach(batch, batchBody);
  }
  return failure(failed);
}

/// One (batch, key head): its K and V^T, the query heads sharing it, then
/// dK and dV stored.
void FlexAttentionLowering::backwardKeyHead(Value batchIdx, Value kvHead,
                                            int64_t bm) {
  auto base = [&](const KernelLowering::Window &w, Value head) {
    return k.addOffsets(k.addOffset(k.scale(batchIdx, w.strides[0]), w.offset),
                        k.scale(head, w.strides[1]));
  };
  loadRowsOf(key, base(key, kvHead), kvLen, dim, bw.kRows);
  loadTransposed(key, base(key, kvHead), kvLen, dim, bw.kT);
  loadTransposed(value, base(value, kvHead), kvLen, vDim, bw.vT);
  b.create<nisa::MemsetOp>(k.loc, bw.dK, APFloat(0.0));
  b.create<nisa::MemsetOp>(k.loc, bw.dV, APFloat(0.0));
  if (blocksShape[1] != 1) {
    std::optional<int64_t> kvh = getConstantIntValue(kvHead);
    assert(kvh && "per-head block masks unroll the key heads");
    for (int64_t g = 0; g < group; ++g)
      backwardQueryHead(batchIdx, kvHead, k.index(g), bm, *kvh * group + g);
  } else {
    k.forEach(group, [&](Value g) {
      backwardQueryHead(batchIdx, kvHead, g, bm, 0);
    });
  }
  auto store = [&](Value acc, int64_t width, Value buffer,
                   ArrayRef<int64_t> strides, double factor) {
    storeRows(acc, width, kvLen, buffer,
              k.addOffsets(k.scale(batchIdx, strides[0]),
                           k.scale(kvHead, strides[1])),
              strides[2], factor);
  };
  store(bw.dK, dim, bw.outDK, bw.dkStrides, scale);
  store(bw.dV, vDim, bw.outDV, bw.dvStrides, 1.0);
}

/// One query head against the key head in SBUF: its inputs, every kept
/// (key unit, query tile) step, then dQ stored.
void FlexAttentionLowering::backwardQueryHead(Value batchIdx, Value kvHead,
                                              Value g, int64_t bm,
                                              int64_t hm) {
  Value h = k.addOffsets(k.scale(kvHead, group), g);
  auto base = [&](const KernelLowering::Window &w) {
    return k.addOffsets(k.addOffset(k.scale(batchIdx, w.strides[0]), w.offset),
                        k.scale(h, w.strides[1]));
  };
  loadRowsOf(q, base(q), qLen, dim, bw.qRows);
  loadTransposed(q, base(q), qLen, dim, bw.qT);
  loadRowsOf(bw.dO, base(bw.dO), qLen, vDim, bw.doRows);
  loadTransposed(bw.dO, base(bw.dO), qLen, vDim, bw.doT);
  loadRowsOf(bw.o, base(bw.o), qLen, vDim, bw.oRows);
  b.create<nisa::MemsetOp>(k.loc, bw.dQ, APFloat(0.0));
  Value lseBase =
      k.addOffsets(k.addOffset(k.scale(batchIdx, bw.lseIn.strides[0]),
                               bw.lseIn.offset),
                   k.scale(h, bw.lseIn.strides[1]));
  for (int64_t t = 0; t < qTiles; ++t) {
    KernelLowering::TileScope scope(k);
    int64_t rows = std::min(kUnit, qLen - t * kUnit);
    auto col = [&](Value tile) {
      return k.view(tile, k.index(t), {rows, 1}, {qTiles, 1});
    };
    // -lse, finite: a fully masked row (lse = -inf) keeps P = exp(-inf) = 0.
    Value lse = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
    k.dma(k.view(bw.lseIn.buffer, k.addOffset(lseBase, t * kUnit *
                                                          bw.lseIn.strides[2]),
                 {rows, 1}, {bw.lseIn.strides[2], 1}),
          lse);
    b.create<nisa::TensorScalarOp>(k.loc, nisa::AluOp::multiply, lse, lse,
                                   Value(), APFloat(-1.0), false,
                                   nisa::Engine::gpsimd);
    b.create<nisa::TensorScalarOp>(
        k.loc, nisa::AluOp::min, lse, col(bw.negLse), Value(),
        APFloat(std::numeric_limits<float>::max()), false,
        nisa::Engine::gpsimd);
    // delta = rowsum(dO * O).
    Value prod = k.tile(MemorySpace::sbuf, {rows, vDim}, f32);
    auto rowsOf = [&](Value tile) {
      return k.view(tile, k.index(t * vDim), {rows, vDim}, {qTiles * vDim, 1});
    };
    b.create<nisa::TensorTensorOp>(k.loc, nisa::AluOp::multiply,
                                   rowsOf(bw.doRows), rowsOf(bw.oRows), prod,
                                   nisa::Engine::gpsimd);
    b.create<nisa::TensorReduceOp>(k.loc, nisa::AluOp::add, prod,
                                   col(bw.delta));
  }
  // The kept (key unit, query tile) steps, key unit by key unit; each
  // step's scores are computed one step ahead of its gradients, so the
  // engines overlap consecutive steps.
  struct BackwardStep {
    Step at;
    int64_t t, u;
    bool partial, first, last;
  };
  SmallVector<BackwardStep> steps;
  SmallVector<SmallVector<Kind>> kinds = unitKinds(bm, hm);
  for (int64_t u = 0; u < kvUnits; ++u) {
    size_t unitStart = steps.size();
    for (int64_t t = 0; t < qTiles; ++t) {
      if (kinds[t][u] == Kind::masked)
        continue;
      Step at;
      at.batch = batchIdx;
      at.head = h;
      at.q0 = k.index(t * kUnit);
      at.unit = k.index(u);
      at.rows = std::min(kUnit, qLen - t * kUnit);
      at.width = std::min(kUnit, kvLen - u * kUnit);
      steps.push_back({at, t, u, kinds[t][u] == Kind::partial,
                       steps.size() == unitStart, false});
    }
    if (steps.size() > unitStart)
      steps.back().last = true;
  }
  auto scores = [&](size_t i) {
    const BackwardStep &s = steps[i];
    backwardScores(s.at, s.t, s.u, s.partial, i % 2);
  };
  if (!steps.empty())
    scores(0);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i + 1 < steps.size())
      scores(i + 1);
    const BackwardStep &s = steps[i];
    backwardGrads(s.at, s.t, s.u, s.first, i % 2);
    if (!s.last)
      continue;
    // dV and dK of this unit, summed over the query tiles in PSUM, into the
    // accumulators (which also sum the query heads of the key head).
    int64_t keys = s.at.width;
    auto acc = [&](Value tile, int64_t width, int64_t psumCol) {
      Value dst = k.view(tile, k.index(s.u * width), {keys, width},
                         {kvUnits * width, 1});
      Value src = k.view(psum, k.index(kGradKVBank * bank + psumCol),
                         {keys, width}, {psumCols, 1});
      b.create<nisa::TensorTensorOp>(k.loc, nisa::AluOp::add, dst, src, dst);
    };
    acc(bw.dV, vDim, 0);
    acc(bw.dK, dim, vDim);
  }
  ArrayRef<int64_t> qStrides = bw.dqStrides;
  storeRows(bw.dQ, dim, qLen, bw.outDQ,
            k.addOffsets(k.scale(batchIdx, qStrides[0]),
                         k.scale(h, qStrides[1])),
            qStrides[2], scale);
}

/// Query tile t against key unit u, first half: P recomputed and dS (into
/// this parity's pIn and dSIn).
void FlexAttentionLowering::backwardScores(const Step &at, int64_t t,
                                           int64_t u, bool partial,
                                           int64_t parity) {
  KernelLowering::TileScope scope(k);
  int64_t rows = at.rows, keys = at.width;
  auto bankView = [&](int64_t bankIdx, int64_t r, int64_t c) {
    return k.view(psum, k.index(bankIdx * bank), {r, c}, {psumCols, 1});
  };
  auto full = [&](Value tile) {
    Operand v;
    v.kind = Operand::full;
    v.tile = tile;
    return v;
  };
  auto lowered = [&](FailureOr<Operand> r) -> Value {
    if (::mlir::failed(r)) {
      failed = true;
      return Value();
    }
    return materialize(*r, at, true);
  };
  auto slot = [&](Value tile) {
    return k.view(tile, k.index(parity * kUnit), {rows, keys}, {2 * kUnit, 1});
  };
  // S = Q K^T, scaled; score_mod; the mask.
  Value s = bankView(kScoreBanks + parity, rows, keys);
  b.create<nisa::MatmulOp>(
      k.loc, k.view(bw.qT, k.index(t * kUnit), {dim, rows}, {qLen, 1}),
      k.view(bw.kT, k.index(u * kUnit), {dim, keys}, {kvLen, 1}), s);
  Value sc = k.tile(MemorySpace::sbuf, {rows, keys}, f32);
  b.create<nisa::ActivationOp>(k.loc, s, sc, Value(),
                               nisa::ActivationFn::identity, APFloat(scale),
                               APFloat(0.0));
  Value scores = sc;
  if (!plainScores) {
    SmallVector<Operand> args{full(sc)};
    args.append(scoreArgs);
    scores = lowered(modifier(bwOp.getScoreMod(), args, at));
    if (!scores)
      return;
  }
  if (partial) {
    Value keep = lowered(modifier(bwOp.getMaskMod(), maskArgs, at));
    if (!keep)
      return;
    Value masked = k.tile(MemorySpace::sbuf, {rows, keys}, f32);
    b.create<nisa::SelectOp>(
        k.loc, keep, scores,
        k.view(negInf, k.index(0), {rows, keys}, {kUnit, 1}), masked,
        nisa::Engine::gpsimd);
    scores = masked;
  }
  // P = exp(s - lse); matmul inputs in the inputs' type.
  bool f32Inputs = inElt == f32;
  Value p = f32Inputs ? slot(bw.pIn) : k.tile(MemorySpace::sbuf, {rows, keys}, f32);
  b.create<nisa::ActivationOp>(
      k.loc, scores, p, k.view(bw.negLse, k.index(t), {rows, 1}, {qTiles, 1}),
      nisa::ActivationFn::exp, APFloat(1.0), APFloat(0.0));
  if (!f32Inputs)
    b.create<nisa::CopyOp>(k.loc, p, slot(bw.pIn), nisa::Engine::gpsimd);
  // dP = dO V^T; dS = P * (dP - delta), then through score_mod's gradient.
  Value dP = bankView(kDPBanks + parity, rows, keys);
  b.create<nisa::MatmulOp>(
      k.loc, k.view(bw.doT, k.index(t * kUnit), {vDim, rows}, {qLen, 1}),
      k.view(bw.vT, k.index(u * kUnit), {vDim, keys}, {kvLen, 1}), dP);
  bool direct = f32Inputs && bw.plainScoreGrad;
  Value dS = direct ? slot(bw.dSIn) : k.tile(MemorySpace::sbuf, {rows, keys}, f32);
  b.create<nisa::ScalarTensorTensorOp>(
      k.loc, nisa::AluOp::subtract, nisa::AluOp::multiply, dP, p, dS,
      k.view(bw.delta, k.index(t), {rows, 1}, {qTiles, 1}), APFloat(0.0),
      nisa::Engine::vector);
  if (!bw.plainScoreGrad) {
    SmallVector<Operand> args{full(sc)};
    args.append(scoreArgs.begin(), scoreArgs.begin() + 4);
    args.push_back(full(dS));
    args.append(scoreArgs.begin() + 4, scoreArgs.end());
    dS = lowered(modifier(*bw.scoreGrad, args, at));
    if (!dS)
      return;
  }
  if (!direct)
    b.create<nisa::CopyOp>(k.loc, dS, slot(bw.dSIn), nisa::Engine::gpsimd);
}

/// Query tile t against key unit u, second half: its share of dV and dK
/// (summed in PSUM; `first`: the unit's first step) and of dQ.
void FlexAttentionLowering::backwardGrads(const Step &at, int64_t t, int64_t u,
                                          bool first, int64_t parity) {
  KernelLowering::TileScope scope(k);
  int64_t rows = at.rows, keys = at.width;
  auto bankView = [&](int64_t bankIdx, int64_t col, int64_t r, int64_t c) {
    return k.view(psum, k.index(bankIdx * bank + col), {r, c}, {psumCols, 1});
  };
  auto slot = [&](Value tile) {
    return k.view(tile, k.index(parity * kUnit), {rows, keys}, {2 * kUnit, 1});
  };
  auto rowsOf = [&](Value tile, int64_t width) {
    return k.view(tile, k.index(t * width), {rows, width}, {qTiles * width, 1});
  };
  Value pIn = slot(bw.pIn), dSIn = slot(bw.dSIn);
  auto dv = b.create<nisa::MatmulOp>(k.loc, pIn, rowsOf(bw.doRows, vDim),
                                     bankView(kGradKVBank, 0, keys, vDim));
  auto dk = b.create<nisa::MatmulOp>(k.loc, dSIn, rowsOf(bw.qRows, dim),
                                     bankView(kGradKVBank, vDim, keys, dim));
  dv.setAccumulate(!first);
  dk.setAccumulate(!first);
  // dQ += dS K: dS^T by a TensorE transpose.
  Value dST = bankView(kDSTBank, 0, keys, rows);
  b.create<nisa::MatmulOp>(
      k.loc, dSIn, k.view(ident, k.index(0), {rows, rows}, {kUnit, 1}), dST);
  Value dSTIn = k.tile(MemorySpace::sbuf, {keys, rows}, inElt);
  b.create<nisa::CopyOp>(k.loc, dST, dSTIn, nisa::Engine::scalar);
  Value dQPart = bankView(kDQBank, 0, rows, dim);
  b.create<nisa::MatmulOp>(
      k.loc, dSTIn,
      k.view(bw.kRows, k.index(u * dim), {keys, dim}, {kvUnits * dim, 1}),
      dQPart);
  Value dQ = k.view(bw.dQ, k.index(t * dim), {rows, dim}, {qTiles * dim, 1});
  b.create<nisa::TensorTensorOp>(k.loc, nisa::AluOp::add, dQ, dQPart, dQ);
}

} // namespace mlir::neuron::flex

using namespace mlir;
using namespace mlir::neuron;

LogicalResult KernelLowering::lowerFlexAttentionBackward(
    FlexAttentionBackwardOp op) {
  return flex::FlexAttentionLowering(*this, op).runBackward();
}
