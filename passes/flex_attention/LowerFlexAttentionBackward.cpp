//===- LowerFlexAttentionBackward.cpp - flex_attention_backward -> nisa ---===//
//
// One blockwise kernel per neuron.flex_attention_backward, with the forward
// kernel's block skipping:
//  - per (batch, key head) and key chunk: K (rows and K^T) and V^T in SBUF;
//    fp32 dK and dV accumulators;
//  - per query head of that key head and query chunk: Q, Q^T, dO, dO^T and
//    O in SBUF; per query tile -lse and delta = rowsum(dO * O); an fp32 dQ
//    accumulator (summed over key chunks through HBM when there are
//    several);
//  - per key unit (128 keys), over the query tiles its blocks keep:
//    S = Q K^T recomputed (two steps ahead of the gradients, which run one
//    step ahead of dQ), score_mod and the mask as in the forward,
//    P = exp(S - lse); dV += P^T dO and dK += dS^T Q accumulate in PSUM
//    across the query tiles, dS = score_grad(P * (dO V^T - delta)), and
//    dQ += dS K through a TensorE transpose of dS.
// Fully masked units are never visited; full units skip mask_mod. The
// chunks are whole sequences when they fit in SBUF (planChunks).
//
//===----------------------------------------------------------------------===//

#include "passes/flex_attention/FlexAttentionLowering.h"
#include "passes/tile/TilePattern.h"

#include <limits>

namespace mlir::neuron::flex {

namespace {
// Scores run kAhead steps ahead of the gradients, in kSlots rotating
// buffers. PSUM banks: the scores' slots in one, dP's in another; dV and dK
// accumulate side by side in one of two banks, which alternate by key unit;
// dS^T and dQ partials take two slots each of one bank; the last flips
// captured tables (gatherWindow).
constexpr int64_t kAhead = 2, kSlots = kAhead + 1;
constexpr int64_t kScoreBank = 0, kDPBank = 1, kGradKVBanks[2] = {2, 3},
                  kTransposeBank = 4, kMiscBank = 7, kBanks = 8;
} // namespace

/// `len` rows of `width` elements of window `w` from `base` (rows at stride
/// w.strides[2]) into `dst`, a 128-row unit per `width` columns.
Value FlexAttentionLowering::loadRowsOf(const TileBuilder::Window &w,
                                        Value base, int64_t len, int64_t width,
                                        Value dst) {
  int64_t rs = w.strides[2], es = w.strides[3];
  int64_t stride = cast<MemRefType>(dst.getType()).getShape()[1];
  int64_t full = len / unit, rest = len % unit;
  if (full)
    k.dma(k.view(w.buffer, base, {unit, full, width}, {rs, unit * rs, es}),
          k.view(dst, k.index(0), {unit, full, width}, {stride, width, 1}));
  if (rest)
    k.dma(k.view(w.buffer, k.addOffset(base, full * unit * rs), {rest, width},
                 {rs, es}),
          k.view(dst, k.index(full * width), {rest, width}, {stride, 1}));
  return dst;
}

/// The transpose [width, len] of `len` rows of window `w` from `base`: one
/// transposing DMA.
Value FlexAttentionLowering::loadTransposed(const TileBuilder::Window &w,
                                            Value base, int64_t len,
                                            int64_t width, Value dst) {
  k.dma(k.view(w.buffer, base, {width, len}, {w.strides[3], w.strides[2]}),
        k.view(dst, k.index(0), {width, len},
               {cast<MemRefType>(dst.getType()).getShape()[1], 1}));
  return dst;
}

/// factor * `src` (fp32, a 128-row unit per `width` columns) in the type of
/// `buffer`, stored there as `len` rows from `base`.
void FlexAttentionLowering::storeRows(Value src, int64_t width, int64_t len,
                                      Value buffer, Value base,
                                      int64_t rowStride, double factor) {
  TileBuilder::TileScope scope(k);
  int64_t units = (len + unit - 1) / unit;
  int64_t srcCols = cast<MemRefType>(src.getType()).getShape()[1];
  Type elt = cast<MemRefType>(buffer.getType()).getElementType();
  Value res = k.view(src, k.index(0), {unit, units * width}, {srcCols, 1});
  if (factor != 1.0 || elt != f32) {
    Value converted = k.tile(MemorySpace::sbuf, {unit, units * width}, elt);
    b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, res, converted,
                                   Value(), APFloat(factor), false,
                                   nisa::Engine::gpsimd);
    res = converted;
    srcCols = units * width;
  }
  int64_t full = len / unit, rest = len % unit;
  if (full)
    k.dma(k.view(res, k.index(0), {unit, full, width}, {srcCols, width, 1}),
          k.view(buffer, base, {unit, full, width},
                 {rowStride, unit * rowStride, 1}));
  if (rest)
    k.dma(k.view(res, k.index(full * width), {rest, width}, {srcCols, 1}),
          k.view(buffer, k.addOffset(base, full * unit * rowStride),
                 {rest, width}, {rowStride, 1}));
}

LogicalResult FlexAttentionLowering::planChunks(FlexAttentionBackwardOp o) {
  int64_t elt = std::max<int64_t>(1, inElt.getIntOrFloatBitWidth() / 8);
  auto units = [&](int64_t rows) { return (rows + unit - 1) / unit; };
  // Per partition: K rows, K^T, V^T and fp32 dK, dV for `keys` keys.
  auto kvBytes = [&](int64_t keys) {
    return (units(keys) * dim + 2 * keys) * elt +
           4 * units(keys) * (dim + vDim);
  };
  // Q, Q^T, dO, dO^T, O, fp32 dQ, -lse and delta for `queries` queries.
  auto qBytes = [&](int64_t queries) {
    return (units(queries) * (dim + 2 * vDim) + 2 * queries) * elt +
           4 * units(queries) * (dim + 2);
  };
  // The most rows, all of `len` or a multiple of 128, that fit in `room`.
  auto fitting = [&](auto bytes, int64_t len, int64_t room) {
    if (bytes(len) <= room)
      return len;
    int64_t rows = (len - 1) / unit * unit;
    while (rows > 0 && bytes(rows) > room)
      rows -= unit;
    return rows;
  };
  int64_t budget =
      k.target.sbufBytesPerPartition * k.knobs.attentionSbufPercent / 100;
  bw.kvCap = kvLen;
  bw.qCap = qLen;
  if (kvBytes(kvLen) + qBytes(qLen) > budget) {
    bw.kvCap = fitting(kvBytes, kvLen, budget / 2);
    bw.qCap =
        bw.kvCap > 0 ? fitting(qBytes, qLen, budget - kvBytes(bw.kvCap)) : 0;
  }
  if (bw.kvCap == 0 || bw.qCap == 0)
    return o.emitOpError("head dims of ")
           << dim << " and " << vDim
           << " leave no room in SBUF for 128 queries and keys in the "
              "backward";
  bw.qCapTiles = units(bw.qCap);
  bw.kvCapUnits = units(bw.kvCap);
  if (bw.kvCap < kvLen) {
    auto type = MemRefType::get({batch, heads, qLen, dim}, f32);
    bw.dQPartial.buffer = b.create<memref::AllocOp>(type);
    bw.dQPartial.strides = {heads * qLen * dim, qLen * dim, dim, 1};
  }
  return success();
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
  bw.plainScoreGrad = cast<YieldOp>(gradBody.getTerminator()).getValues()[0] ==
                      gradBody.getArgument(5);
  if (vDim > k.target.matmulMaxK)
    return o.emitOpError("value head dims above ")
           << k.target.matmulMaxK << " are not supported in the backward";
  if (k.target.psumBanks < kBanks || dim + vDim > bank ||
      2 * (unit + dim) > bank || kSlots * unit > bank)
    return o.emitOpError("the backward needs ")
           << kBanks
           << " PSUM banks, dV and dK side by side in one, and two dS^T and "
              "dQ partials in one";
  if (::mlir::failed(planChunks(o)))
    return failure();
  bw.o = k.windowOf(o.getOut());
  bw.dO = k.windowOf(o.getGradOut());
  bw.lseIn = k.windowOf(o.getLse());
  std::tie(bw.outDQ, bw.dqStrides) = resultLayout(o.getGradQuery());
  std::tie(bw.outDK, bw.dkStrides) = resultLayout(o.getGradKey());
  std::tie(bw.outDV, bw.dvStrides) = resultLayout(o.getGradValue());

  TileBuilder::TileScope scope(k);
  makeConstants(unit);
  psumCols = kBanks * bank;
  miscBank = kMiscBank;
  psum = k.tile(MemorySpace::psum, {unit, psumCols}, f32);
  if (!o.getScoreBuffers().empty() || !o.getMaskBuffers().empty())
    makeAntiIdentities();
  int64_t tiles = bw.qCapTiles, units = bw.kvCapUnits;
  bw.kRows = k.tile(MemorySpace::sbuf, {unit, units * dim}, inElt);
  bw.kT = k.tile(MemorySpace::sbuf, {dim, bw.kvCap}, inElt);
  bw.vT = k.tile(MemorySpace::sbuf, {vDim, bw.kvCap}, inElt);
  bw.qRows = k.tile(MemorySpace::sbuf, {unit, tiles * dim}, inElt);
  bw.qT = k.tile(MemorySpace::sbuf, {dim, bw.qCap}, inElt);
  bw.doRows = k.tile(MemorySpace::sbuf, {unit, tiles * vDim}, inElt);
  bw.doT = k.tile(MemorySpace::sbuf, {vDim, bw.qCap}, inElt);
  bw.oRows = k.tile(MemorySpace::sbuf, {unit, tiles * vDim}, inElt);
  bw.negLse = k.tile(MemorySpace::sbuf, {unit, tiles}, f32);
  bw.delta = k.tile(MemorySpace::sbuf, {unit, tiles}, f32);
  bw.dQ = k.tile(MemorySpace::sbuf, {unit, tiles * dim}, f32);
  bw.dK = k.tile(MemorySpace::sbuf, {unit, units * dim}, f32);
  bw.dV = k.tile(MemorySpace::sbuf, {unit, units * vDim}, f32);
  bw.pIn = k.tile(MemorySpace::sbuf, {unit, kSlots * unit}, inElt);
  bw.dSIn = k.tile(MemorySpace::sbuf, {unit, kSlots * unit}, inElt);
  bw.dSTIn = k.tile(MemorySpace::sbuf, {unit, 2 * unit}, inElt);

  bool perBatch = blocksShape[0] != 1, perHead = blocksShape[1] != 1;
  for (int64_t bm = 0; bm < blocksShape[0]; ++bm) {
    auto batchBody = [&](Value batchIdx) {
      if (perHead)
        for (int64_t h = 0; h < kvHeads; ++h)
          backwardKeyHead(batchIdx, k.index(h), bm);
      else
        k.forEach(kvHeads, [&](Value h) { backwardKeyHead(batchIdx, h, bm); });
    };
    if (perBatch)
      batchBody(k.index(bm));
    else
      k.forEach(batch, batchBody);
  }
  return failure(failed);
}

/// One (batch, key head), a key chunk at a time: its K and V^T, the query
/// heads sharing it, then its dK and dV stored.
void FlexAttentionLowering::backwardKeyHead(Value batchIdx, Value kvHead,
                                            int64_t bm) {
  auto base = [&](const TileBuilder::Window &w, Value head, int64_t row) {
    return k.addOffset(
        k.addOffsets(k.addOffset(k.scale(batchIdx, w.strides[0]), w.offset),
                     k.scale(head, w.strides[1])),
        row * w.strides[2]);
  };
  for (int64_t c = 0; c * bw.kvCap < kvLen; ++c) {
    int64_t kv0 = c * bw.kvCap, keys = std::min(bw.kvCap, kvLen - kv0);
    bw.u0 = kv0 / unit;
    bw.chunkUnits = (keys + unit - 1) / unit;
    loadRowsOf(key, base(key, kvHead, kv0), keys, dim, bw.kRows);
    loadTransposed(key, base(key, kvHead, kv0), keys, dim, bw.kT);
    loadTransposed(value, base(value, kvHead, kv0), keys, vDim, bw.vT);
    b.create<nisa::MemsetOp>(bw.dK, APFloat(0.0));
    b.create<nisa::MemsetOp>(bw.dV, APFloat(0.0));
    if (blocksShape[1] != 1) {
      std::optional<int64_t> kvh = getConstantIntValue(kvHead);
      assert(kvh && "per-head block masks unroll the key heads");
      for (int64_t g = 0; g < group; ++g)
        backwardQueryHead(batchIdx, kvHead, k.index(g), bm, *kvh * group + g,
                          c);
    } else {
      k.forEach(group, [&](Value g) {
        backwardQueryHead(batchIdx, kvHead, g, bm, 0, c);
      });
    }
    auto store = [&](Value acc, int64_t width, Value buffer,
                     ArrayRef<int64_t> strides, double factor) {
      storeRows(acc, width, keys, buffer,
                k.addOffset(k.addOffsets(k.scale(batchIdx, strides[0]),
                                         k.scale(kvHead, strides[1])),
                            kv0 * strides[2]),
                strides[2], factor);
    };
    store(bw.dK, dim, bw.outDK, bw.dkStrides, scale);
    store(bw.dV, vDim, bw.outDV, bw.dvStrides, 1.0);
  }
}

/// Element offset of row `row` of head `h` of batch `batchIdx` in window
/// `w` ([batch, heads, rows, ...]).
Value FlexAttentionLowering::headBase(const TileBuilder::Window &w,
                                      Value batchIdx, Value h, int64_t row) {
  return k.addOffset(
      k.addOffsets(k.addOffset(k.scale(batchIdx, w.strides[0]), w.offset),
                   k.scale(h, w.strides[1])),
      row * w.strides[2]);
}

/// One query head against the key chunk in SBUF, a query chunk at a time:
/// its inputs, every kept (key unit, query tile) step, then dQ: stored, or
/// summed over the key chunks in dQPartial.
void FlexAttentionLowering::backwardQueryHead(Value batchIdx, Value kvHead,
                                              Value g, int64_t bm, int64_t hm,
                                              int64_t kvChunk) {
  Value h = k.addOffsets(k.scale(kvHead, group), g);
  SmallVector<SmallVector<Kind>> kinds = unitKinds(bm, hm);
  for (int64_t q0 = 0; q0 < qLen; q0 += bw.qCap) {
    int64_t queries = std::min(bw.qCap, qLen - q0);
    int64_t tiles = (queries + unit - 1) / unit;
    bw.t0 = q0 / unit;
    auto [firstChunk, lastChunk] = dQChunks(kinds, tiles);
    if (kvChunk < firstChunk || kvChunk > lastChunk)
      continue;

    Value partialBase =
        loadQueryChunk(batchIdx, h, q0, queries, kvChunk == firstChunk);
    for (int64_t t = bw.t0; t < bw.t0 + tiles; ++t)
      lseAndDelta(batchIdx, h, t);
    pipelineSteps(backwardSteps(kinds, batchIdx, h, tiles));
    if (kvChunk == lastChunk) {
      ArrayRef<int64_t> qStrides = bw.dqStrides;
      storeRows(bw.dQ, dim, queries, bw.outDQ,
                k.addOffset(k.addOffsets(k.scale(batchIdx, qStrides[0]),
                                         k.scale(h, qStrides[1])),
                            q0 * qStrides[2]),
                qStrides[2], scale);
    } else {
      storeRows(bw.dQ, dim, queries, bw.dQPartial.buffer, partialBase, dim,
                1.0);
    }
  }
}

/// dQ of query tiles [t0, t0 + tiles) sums over the key chunks that keep a
/// step of them: the first starts it, the last stores it (rows no key
/// reaches get zeros from the last chunk).
std::pair<int64_t, int64_t>
FlexAttentionLowering::dQChunks(ArrayRef<SmallVector<Kind>> kinds,
                                int64_t tiles) const {
  int64_t kvChunks = (kvLen + bw.kvCap - 1) / bw.kvCap;
  // Key chunk c keeps a step of query tiles [t, t + tiles).
  auto kept = [&](int64_t c, int64_t t, int64_t tiles) {
    for (int64_t u = c * bw.kvCapUnits;
         u < std::min(kvUnits, (c + 1) * bw.kvCapUnits); ++u)
      for (int64_t i = t; i < t + tiles; ++i)
        if (kinds[i][u] != Kind::masked)
          return true;
    return false;
  };
  int64_t firstChunk = kvChunks - 1, lastChunk = kvChunks - 1;
  for (int64_t c = kvChunks - 1; c >= 0; --c)
    if (kept(c, bw.t0, tiles))
      firstChunk = c;
  for (int64_t c = 0; c < kvChunks; ++c)
    if (kept(c, bw.t0, tiles))
      lastChunk = c;
  return {firstChunk, lastChunk};
}

/// The query chunk's Q, dO (rows and transposed) and O, and dQ: zeros in
/// the first key chunk, else the sum so far. Returns where that sum is
/// kept between key chunks (null with one key chunk).
Value FlexAttentionLowering::loadQueryChunk(Value batchIdx, Value h, int64_t q0,
                                            int64_t queries, bool firstChunk) {
  auto base = [&](const TileBuilder::Window &w, int64_t row) {
    return headBase(w, batchIdx, h, row);
  };
  loadRowsOf(q, base(q, q0), queries, dim, bw.qRows);
  loadTransposed(q, base(q, q0), queries, dim, bw.qT);
  loadRowsOf(bw.dO, base(bw.dO, q0), queries, vDim, bw.doRows);
  loadTransposed(bw.dO, base(bw.dO, q0), queries, vDim, bw.doT);
  loadRowsOf(bw.o, base(bw.o, q0), queries, vDim, bw.oRows);
  Value partialBase;
  if (bw.dQPartial.buffer)
    partialBase = base(bw.dQPartial, q0);
  if (firstChunk)
    b.create<nisa::MemsetOp>(bw.dQ, APFloat(0.0));
  else
    loadRowsOf(bw.dQPartial, partialBase, queries, dim, bw.dQ);
  return partialBase;
}

/// Query tile t's columns: -lse and delta = rowsum(dO * O).
void FlexAttentionLowering::lseAndDelta(Value batchIdx, Value h, int64_t t) {
  TileBuilder::TileScope scope(k);
  int64_t rows = std::min(unit, qLen - t * unit);
  int64_t local = t - bw.t0;
  auto col = [&](Value tile) {
    return k.view(tile, k.index(local), {rows, 1}, {bw.qCapTiles, 1});
  };
  // -lse, finite: a fully masked row (lse = -inf) keeps P = exp(-inf) = 0.
  Value lse = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
  k.dma(k.view(bw.lseIn.buffer,
               k.addOffset(headBase(bw.lseIn, batchIdx, h, 0),
                           t * unit * bw.lseIn.strides[2]),
               {rows, 1}, {bw.lseIn.strides[2], 1}),
        lse);
  b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, lse, lse, Value(),
                                 APFloat(-1.0), false, nisa::Engine::gpsimd);
  b.create<nisa::TensorScalarOp>(
      nisa::AluOp::min, lse, col(bw.negLse), Value(),
      APFloat(double(std::numeric_limits<float>::max())), false,
      nisa::Engine::gpsimd);
  Value prod = k.tile(MemorySpace::sbuf, {rows, vDim}, f32);
  auto rowsOf = [&](Value tile) {
    return k.view(tile, k.index(local * vDim), {rows, vDim},
                  {bw.qCapTiles * vDim, 1});
  };
  b.create<nisa::TensorTensorOp>(nisa::AluOp::multiply, rowsOf(bw.doRows),
                                 rowsOf(bw.oRows), prod, nisa::Engine::gpsimd);
  b.create<nisa::TensorReduceOp>(nisa::AluOp::add, prod, col(bw.delta));
}

/// The kept (key unit, query tile) steps of the chunks in SBUF, key unit by
/// key unit.
SmallVector<FlexAttentionLowering::BackwardStep>
FlexAttentionLowering::backwardSteps(ArrayRef<SmallVector<Kind>> kinds,
                                     Value batchIdx, Value h, int64_t tiles) {
  SmallVector<BackwardStep> steps;
  for (int64_t u = bw.u0; u < bw.u0 + bw.chunkUnits; ++u) {
    size_t unitStart = steps.size();
    for (int64_t t = bw.t0; t < bw.t0 + tiles; ++t) {
      if (kinds[t][u] == Kind::masked)
        continue;
      Step at;
      at.batch = batchIdx;
      at.head = h;
      at.q0 = k.index(t * unit);
      at.unit = k.index(u);
      at.rows = std::min(unit, qLen - t * unit);
      at.width = std::min(unit, kvLen - u * unit);
      steps.push_back({at, t, u, kinds[t][u] == Kind::partial,
                       steps.size() == unitStart, false});
    }
    if (steps.size() > unitStart)
      steps.back().last = true;
  }
  return steps;
}

/// A software pipeline over the steps: step i's scores are emitted kAhead
/// steps ahead of its dV, dK and dS^T, and its dQ one step behind them, so
/// that no engine waits on the one before it in a step (and the engines
/// overlap consecutive steps).
void FlexAttentionLowering::pipelineSteps(ArrayRef<BackwardStep> steps) {
  auto scores = [&](size_t i) {
    const BackwardStep &s = steps[i];
    backwardScores(s.at, s.t, s.u, s.partial, i % kSlots);
  };
  for (size_t i = 0; i < std::min<size_t>(kAhead, steps.size()); ++i)
    scores(i);
  for (size_t i = 0; i <= steps.size(); ++i) {
    if (i + kAhead < steps.size())
      scores(i + kAhead);
    if (i < steps.size()) {
      const BackwardStep &s = steps[i];
      int64_t kvBank = kGradKVBanks[s.u % 2];
      backwardGrads(s.at, s.t, s.u, s.first, i % kSlots, i % 2, kvBank);
      if (s.last)
        accumulateKV(s, kvBank);
    }
    if (i > 0) {
      const BackwardStep &s = steps[i - 1];
      backwardDQ(s.at, s.t, s.u, (i - 1) % 2);
    }
  }
}

/// dV and dK of a key unit, summed over the query tiles in PSUM bank
/// `kvBank`, into the accumulators (which also sum the query heads of the
/// key head).
void FlexAttentionLowering::accumulateKV(const BackwardStep &s,
                                         int64_t kvBank) {
  int64_t keys = s.at.width;
  auto acc = [&](Value tile, int64_t width, int64_t psumCol) {
    Value dst = k.view(tile, k.index((s.u - bw.u0) * width), {keys, width},
                       {bw.kvCapUnits * width, 1});
    Value src = k.view(psum, k.index(kvBank * bank + psumCol), {keys, width},
                       {psumCols, 1});
    b.create<nisa::TensorTensorOp>(nisa::AluOp::add, dst, src, dst);
  };
  acc(bw.dV, vDim, 0);
  acc(bw.dK, dim, vDim);
}

/// Query tile t against key unit u, first half: P recomputed and dS (into
/// this slot's pIn and dSIn).
void FlexAttentionLowering::backwardScores(const Step &at, int64_t t, int64_t u,
                                           bool partial, int64_t slotIdx) {
  TileBuilder::TileScope scope(k);
  ScoreTiles s = backwardScoreTiles(at, t, u, partial, slotIdx);
  if (!s.scores)
    return;
  Value p = recomputeP(at, t, s, slotIdx);
  scoreGradient(at, t, u, s, p, slotIdx);
}

Value FlexAttentionLowering::bankView(int64_t bankIdx, int64_t col, int64_t r,
                                      int64_t c) {
  return k.view(psum, k.index(bankIdx * bank + col), {r, c}, {psumCols, 1});
}

/// Slot `slotIdx` of a [128, kSlots x 128] matmul input tile.
Value FlexAttentionLowering::stepSlot(Value tile, int64_t slotIdx,
                                      const Step &at) {
  return k.view(tile, k.index(slotIdx * unit), {at.rows, at.width},
                {kSlots * unit, 1});
}

/// A modifier's result as a full tile (null, the kernel failed, if the
/// modifier did).
Value FlexAttentionLowering::modifierTile(FailureOr<Operand> r,
                                          const Step &at) {
  if (::mlir::failed(r)) {
    failed = true;
    return Value();
  }
  return materialize(*r, at, true);
}

static Operand fullOperand(Value tile) {
  Operand v;
  v.kind = Operand::full;
  v.tile = tile;
  return v;
}

/// S = Q K^T, scaled; score_mod; the mask.
FlexAttentionLowering::ScoreTiles
FlexAttentionLowering::backwardScoreTiles(const Step &at, int64_t t, int64_t u,
                                          bool partial, int64_t slotIdx) {
  int64_t rows = at.rows, keys = at.width;
  Value s = bankView(kScoreBank, slotIdx * unit, rows, keys);
  int64_t tl = t - bw.t0, ul = u - bw.u0; // in the chunks in SBUF
  b.create<nisa::MatmulOp>(
      k.view(bw.qT, k.index(tl * unit), {dim, rows}, {bw.qCap, 1}),
      k.view(bw.kT, k.index(ul * unit), {dim, keys}, {bw.kvCap, 1}), s);
  // Plain scores of a full unit go from PSUM straight into exp, which
  // applies the scale; anything else reads them scaled, in SBUF.
  ScoreTiles tiles;
  tiles.expFromPsum = plainScores && bw.plainScoreGrad && !partial;
  tiles.scaled = s;
  if (!tiles.expFromPsum) {
    tiles.scaled = k.tile(MemorySpace::sbuf, {rows, keys}, f32);
    b.create<nisa::ActivationOp>(s, tiles.scaled, Value(),
                                 nisa::ActivationFn::identity, APFloat(scale),
                                 APFloat(0.0));
  }
  Value scores = tiles.scaled;
  if (!plainScores) {
    SmallVector<Operand> args{fullOperand(tiles.scaled)};
    args.append(scoreArgs);
    scores = modifierTile(modifier(bwOp.getScoreMod(), args, at), at);
    if (!scores)
      return tiles;
  }
  if (partial) {
    Value keep = modifierTile(modifier(bwOp.getMaskMod(), maskArgs, at), at);
    if (!keep)
      return tiles;
    Value masked = k.tile(MemorySpace::sbuf, {rows, keys}, f32);
    b.create<nisa::SelectOp>(
        keep, scores, k.view(negInf, k.index(0), {rows, keys}, {unit, 1}),
        masked, nisa::Engine::gpsimd);
    scores = masked;
  }
  tiles.scores = scores;
  return tiles;
}

/// P = exp(s - lse), into this slot's pIn in the inputs' type; returns P
/// in fp32.
Value FlexAttentionLowering::recomputeP(const Step &at, int64_t t,
                                        const ScoreTiles &s, int64_t slotIdx) {
  int64_t rows = at.rows, keys = at.width, tl = t - bw.t0;
  bool f32Inputs = inElt == f32;
  Value p = f32Inputs ? stepSlot(bw.pIn, slotIdx, at)
                      : k.tile(MemorySpace::sbuf, {rows, keys}, f32);
  b.create<nisa::ActivationOp>(
      s.scores, p, k.view(bw.negLse, k.index(tl), {rows, 1}, {bw.qCapTiles, 1}),
      nisa::ActivationFn::exp, APFloat(s.expFromPsum ? scale : 1.0),
      APFloat(0.0));
  if (!f32Inputs)
    b.create<nisa::CopyOp>(p, stepSlot(bw.pIn, slotIdx, at),
                           nisa::Engine::gpsimd);
  return p;
}

/// dP = dO V^T; dS = P * (dP - delta), then through score_mod's gradient,
/// into this slot's dSIn.
void FlexAttentionLowering::scoreGradient(const Step &at, int64_t t, int64_t u,
                                          const ScoreTiles &s, Value p,
                                          int64_t slotIdx) {
  int64_t rows = at.rows, keys = at.width;
  int64_t tl = t - bw.t0, ul = u - bw.u0;
  Value dP = bankView(kDPBank, slotIdx * unit, rows, keys);
  b.create<nisa::MatmulOp>(
      k.view(bw.doT, k.index(tl * unit), {vDim, rows}, {bw.qCap, 1}),
      k.view(bw.vT, k.index(ul * unit), {vDim, keys}, {bw.kvCap, 1}), dP);
  // Without score_mod's gradient, dS is only a matmul input: stored (and
  // rounded) straight into its slot.
  bool dSInPlace = bw.plainScoreGrad;
  Value dS = dSInPlace ? stepSlot(bw.dSIn, slotIdx, at)
                       : k.tile(MemorySpace::sbuf, {rows, keys}, f32);
  b.create<nisa::ScalarTensorTensorOp>(
      nisa::AluOp::subtract, nisa::AluOp::multiply, dP, p, dS,
      k.view(bw.delta, k.index(tl), {rows, 1}, {bw.qCapTiles, 1}), APFloat(0.0),
      nisa::Engine::vector);
  if (!bw.plainScoreGrad) {
    SmallVector<Operand> args{fullOperand(s.scaled)};
    args.append(scoreArgs.begin(), scoreArgs.begin() + 4);
    args.push_back(fullOperand(dS));
    args.append(scoreArgs.begin() + 4, scoreArgs.end());
    dS = modifierTile(modifier(*bw.scoreGrad, args, at), at);
    if (!dS)
      return;
  }
  if (!dSInPlace)
    b.create<nisa::CopyOp>(dS, stepSlot(bw.dSIn, slotIdx, at),
                           nisa::Engine::gpsimd);
}

/// Query tile t against key unit u, second half: its share of dV and dK
/// (summed in PSUM bank `kvBank`; `first`: the unit's first step), and dS^T
/// for its dQ.
void FlexAttentionLowering::backwardGrads(const Step &at, int64_t t, int64_t u,
                                          bool first, int64_t slotIdx,
                                          int64_t parity, int64_t kvBank) {
  TileBuilder::TileScope scope(k);
  int64_t rows = at.rows, keys = at.width;
  auto slot = [&](Value tile) {
    return k.view(tile, k.index(slotIdx * unit), {rows, keys},
                  {kSlots * unit, 1});
  };
  int64_t tl = t - bw.t0; // in the chunk in SBUF
  auto rowsOf = [&](Value tile, int64_t width) {
    return k.view(tile, k.index(tl * width), {rows, width},
                  {bw.qCapTiles * width, 1});
  };
  auto bankView = [&](int64_t col, int64_t r, int64_t c) {
    return k.view(psum, k.index(kvBank * bank + col), {r, c}, {psumCols, 1});
  };
  Value pIn = slot(bw.pIn), dSIn = slot(bw.dSIn);
  auto dv = b.create<nisa::MatmulOp>(pIn, rowsOf(bw.doRows, vDim),
                                     bankView(0, keys, vDim));
  auto dk = b.create<nisa::MatmulOp>(dSIn, rowsOf(bw.qRows, dim),
                                     bankView(vDim, keys, dim));
  dv.setAccumulate(!first);
  dk.setAccumulate(!first);
  // dS^T by a TensorE transpose, into this parity's dSTIn.
  Value dST = k.view(psum, k.index(kTransposeBank * bank + parity * unit),
                     {keys, rows}, {psumCols, 1});
  b.create<nisa::MatmulOp>(
      dSIn, k.view(ident, k.index(0), {rows, rows}, {unit, 1}), dST);
  b.create<nisa::CopyOp>(
      dST,
      k.view(bw.dSTIn, k.index(parity * unit), {keys, rows}, {2 * unit, 1}),
      nisa::Engine::scalar);
}

/// Query tile t against key unit u, last: dQ += dS K.
void FlexAttentionLowering::backwardDQ(const Step &at, int64_t t, int64_t u,
                                       int64_t parity) {
  int64_t rows = at.rows, keys = at.width;
  int64_t tl = t - bw.t0, ul = u - bw.u0; // in the chunks in SBUF
  Value dQPart =
      k.view(psum, k.index(kTransposeBank * bank + 2 * unit + parity * dim),
             {rows, dim}, {psumCols, 1});
  b.create<nisa::MatmulOp>(
      k.view(bw.dSTIn, k.index(parity * unit), {keys, rows}, {2 * unit, 1}),
      k.view(bw.kRows, k.index(ul * dim), {keys, dim},
             {bw.kvCapUnits * dim, 1}),
      dQPart);
  Value dQ =
      k.view(bw.dQ, k.index(tl * dim), {rows, dim}, {bw.qCapTiles * dim, 1});
  b.create<nisa::TensorTensorOp>(nisa::AluOp::add, dQ, dQPart, dQ);
}

} // namespace mlir::neuron::flex

namespace mlir::neuron {
namespace {
struct FlexAttentionBackwardPattern
    : OpTilePattern<FlexAttentionBackwardPattern, FlexAttentionBackwardOp> {
  LogicalResult lowerOp(FlexAttentionBackwardOp op, KernelLowering &k) const {
    return flex::FlexAttentionLowering(k, op).runBackward();
  }
};
} // namespace

void populateFlexAttentionBackwardPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<FlexAttentionBackwardPattern>());
}
} // namespace mlir::neuron
