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
      bind(result, bufferOf(input));
      return;
    }
    if (!isWindow(input) && *strides == contiguousStrides(outType.getShape())) {
      bind(result, in.buffer); // same row-major order: an alias
      return;
    }
    out.strides = *strides;
  }
  bindWindow(result, out, op->getLoc());
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
  // panels over half of SBUF would crowd out the streams).
  int64_t mTilesTotal = (m + mTile - 1) / mTile;
  int64_t mTiles = std::min<int64_t>(mTilesTotal, banksPerSet);
  while (mTiles > 1 && 2 * kTiles * mTiles * mTile * eltBytes >
                           target.sbufBytesPerPartition / 2)
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
      double loadNs = double(kRows * nGroup * eltBytes) /
                      (target.dmaEngines * target.dmaBytesPerNsPerEngine);
      double stepNs =
          double(blockTiles * nTiles * std::max<int64_t>(nTile, 64)) /
          target.tensorClockGHz;
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
      b.create<nisa::TensorReduceOp>(alu, t, acc);
    }
    if (cols > first)
      forTiles(cols - first, chunk, [&](Value c0, int64_t ct) {
        TileScope s(*this);
        Value t =
            load(in, addOffsets(rowBase, addOffset(c0, first)), rt, ct, cols);
        Value part = tile(MemorySpace::sbuf, {rt, 1}, f32);
        b.create<nisa::TensorReduceOp>(alu, t, part);
        b.create<nisa::TensorTensorOp>(alu, acc, part, acc);
      });
    Value result = tile(MemorySpace::sbuf, {rt, 1}, inType.getElementType());
    b.create<nisa::CopyOp>(acc, result);
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
      b.create<nisa::DmaGatherOp>(view(table, c0, {vocab, ct}, {width, 1}),
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
    b.create<nisa::RandOp>(t, view(seed, index(0), {rows, 2}, {2, 1}), base,
                           op.getStream(), APFloat(double(cols)),
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
  b.create<nisa::CollectiveOp>(in, out, kind, aluFor(op.getReduce()),
                               op.getGroup(), op.getRanks());
}

LogicalResult KernelLowering::lower(Operation *op) {
  b.setLoc(op->getLoc());
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
        return lowerGroup(e, e, inputs, {{result, resultBuffer(result)}});
      })
      .Case<FusionOp>([&](FusionOp f) { return lowerFusion(f); })
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
  b.setLoc(func.getLoc());
  auto kernel =
      b.create<func::FuncOp>(func.getName(), b.getFunctionType(argTypes, {}));
  kernel->setAttr("nisa.kernel", b.getUnitAttr());
  kernel->setAttr("nisa.num_inputs",
                  b.getI64IntegerAttr(fnType.getNumInputs()));
  Block *entry = kernel.addEntryBlock();
  setEntry(entry);
  b.setInsertionPointToStart(entry);

  Block &body = func.getBody().front();
  unsigned numInputs = fnType.getNumInputs();
  for (auto [i, arg] : llvm::enumerate(body.getArguments()))
    bind(arg, entry->getArgument(i));

  // Results computed by an op are written straight into their output buffer.
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Operation *def = v.getDefiningOp();
    if (def && !isa<ConstantOp, ReshapeOp>(def) && !hasDestination(v))
      setDestination(v, entry->getArgument(numInputs + i));
  }

  for (Operation &op : body.without_terminator())
    if (failed(lower(&op)))
      return failure();

  b.setLoc(ret.getLoc());
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
  b.create<func::ReturnOp>();
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
    SmallVector<func::FuncOp> funcs(module.getOps<func::FuncOp>());
    for (func::FuncOp func : funcs) {
      if (func->hasAttr("nisa.kernel") || func.isExternal())
        continue;
      ImplicitLocOpBuilder builder(UnknownLoc::get(&getContext()),
                                   &getContext());
      KernelLowering lowering(builder, module, *chip, freeTileBytes);
      if (failed(lowering.lowerFunction(func)))
        return signalPassFailure();
    }
  }
};

} // namespace mlir::neuron
