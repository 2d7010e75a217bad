//===- LowerMatmul.cpp - neuron.matmul as a blocked GEMM
//--------------------===//
//
// GEMM on TensorE: A^T panels resident in SBUF, B streamed, sums in PSUM
// (lowerMatmul says how).
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

#include "runtime/target/Cost.h"

namespace mlir::neuron {

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
              auto mm = b.create<nisa::MatmulOp>(stationary, mov,
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
            b.create<nisa::CopyOp>(bank(mi, ni, mt, nt), part, engine);
          }
          Value dst = addOffsets(
              addOffsets(outBase, scale(addOffset(m0, mi * mTile), n)), n0);
          // From ScalarE's queue: a store waits for its eviction, and on
          // SyncE's it would hold up the next group's B loads.
          b.create<nisa::DmaCopyOp>(stage, view(out, dst, {mt, cols}, {n, 1}),
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

namespace {
struct MatmulPattern : OpTilePattern<MatmulPattern, MatmulOp> {
  LogicalResult lowerOp(MatmulOp op, KernelLowering &k) const {
    if (tensorType(op.getLhs()).getShape().back() == 0)
      return op->emitOpError("has an empty contraction (the importer folds "
                             "it to zeros)");
    k.lowerMatmul(op);
    return success();
  }
};
} // namespace

void populateMatmulPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<MatmulPattern>());
}

} // namespace mlir::neuron
