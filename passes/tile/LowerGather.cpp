//===- LowerGather.cpp - neuron.gather and neuron.scatter -----------------===//
//
// Rows of a table gathered by index: the indices loaded per 128 rows, each
// chunk of the gathered rows brought into SBUF by dma_gather and stored. A
// table that fits SBUF transposed, gathered often enough to pay for loading
// it (MoE dispatch: tokens sorted by expert), is gathered within partitions
// instead (PartitionGather). Rows written by index (scatter): the input
// copied to the result, then per 128 rows the indices and each chunk of the
// values loaded and written (or added) into the result's rows by dma_scatter.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"
#include "runtime/target/Cost.h"

namespace mlir::neuron {

/// Steps of up to 128 indexed rows: each loads its indices (and with
/// `source`, a scatter's, its rows of it) and calls `body` per chunk of
/// columns with an SBUF tile for those rows. The tiles rotate over a few
/// slots and the loads run ahead of the indirect DMAs, so that GpSimd
/// generates descriptors back to back: a step's load never waits on SyncE's
/// queue behind the store of the step before (gather), nor its indirect DMA
/// for a load queued behind such a wait.
KernelLowering::IndexedRows
KernelLowering::indexedRows(int64_t rows, int64_t width, Type elt) const {
  int64_t parts = std::min<int64_t>(rows, target.partitions);
  int64_t slots = std::min<int64_t>(3, (rows + parts - 1) / parts);
  int64_t eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
  // Rows land in SBUF; the slots together keep within a few tiles' bytes.
  int64_t chunk =
      std::min(width, std::max<int64_t>(1, 4 * tileBytes / slots / eltBytes));
  return {parts, slots, chunk};
}

void KernelLowering::forEachIndexedRows(Value idx, int64_t rows, int64_t width,
                                        Type elt, Value source,
                                        IndexedRowsBody body) {
  if (rows == 0 || width == 0)
    return;
  IndexedRows shape = indexedRows(rows, width, elt);
  int64_t parts = shape.parts, slots = shape.slots, chunk = shape.chunk;
  // Source rows that fit one chunk load ahead with their indices.
  bool rowsAhead = source && chunk == width;
  Type idxElt = cast<MemRefType>(idx.getType()).getElementType();
  TileScope scope(*this);
  SmallVector<Value> idxTiles, rowTiles;
  for (int64_t i = 0; i < slots; ++i) {
    idxTiles.push_back(tile(MemorySpace::sbuf, {parts, 1}, idxElt));
    rowTiles.push_back(tile(MemorySpace::sbuf, {parts, chunk}, elt));
  }
  auto rowsOf = [&](int64_t rt, int64_t ct, int64_t slot) {
    return view(rowTiles[slot], index(0), {rt, ct}, {chunk, 1});
  };
  auto loadRows = [&](Value r0, Value c0, int64_t rt, int64_t ct,
                      int64_t slot) {
    dma(view(source, addOffsets(scale(r0, width), c0), {rt, ct}, {width, 1}),
        rowsOf(rt, ct, slot));
  };
  auto load = [&](Value r0, int64_t rt, int64_t slot) {
    dma(rowView(idx, r0, rt, 1, 1),
        view(idxTiles[slot], index(0), {rt, 1}, {1, 1}));
    if (rowsAhead)
      loadRows(r0, index(0), rt, width, slot);
  };
  auto compute = [&](Value r0, int64_t rt, int64_t slot) {
    Value indices = view(idxTiles[slot], index(0), {rt, 1}, {1, 1});
    forTiles(width, chunk, [&](Value c0, int64_t ct) {
      if (source && !rowsAhead)
        loadRows(r0, c0, rt, ct, slot);
      body(r0, indices, c0, rowsOf(rt, ct, slot));
    });
  };
  int64_t full = rows / parts;
  forEachPipelined(
      full, slots,
      [&](Value s, int64_t slot) { load(scale(s, parts), parts, slot); },
      [&](Value s, int64_t slot) { compute(scale(s, parts), parts, slot); });
  if (int64_t rest = rows % parts) {
    load(index(full * parts), rest, full % slots);
    compute(index(full * parts), rest, full % slots);
  }
}

namespace {
/// A gather from a table held transposed in SBUF, [feature, row] in tiles
/// of 128 features: per 128 indices, spread to every partition (as i32),
/// GpSimd's n_gather picks each feature tile's rows, TensorE transposes
/// them back (is_transpose: bit for bit), VectorE and ScalarE move
/// them from PSUM and one DMA stores the whole rows. GpSimd spends 2
/// cycles an element where software DGE spends ~50 ns a row. A table too
/// large for SBUF goes in passes over its feature tiles, as many at once as
/// fit, each pass storing its columns of every row.
class PartitionGather {
public:
  PartitionGather(KernelLowering &k, GatherOp op)
      : k(k), b(k.b), p(k.target.partitions) {
    auto tableType = tensorType(op.getTable());
    elt = tableType.getElementType();
    vocab = tableType.getDimSize(0);
    width = product(tableType.getShape().drop_front());
    count = tensorType(op.getIndices()).getNumElements();
    idxElt = tensorType(op.getIndices()).getElementType();
    featureTiles = (width + p - 1) / p;
    eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
    chunkCols =
        std::min<int64_t>(width, k.target.psumBankBytes / 4 * kBanksPerChunk);
    // Feature tiles on chip at once: all that fit in half of SBUF, with the
    // steps' tiles (per slot the indices, at most 8 bytes, as f32 and as
    // i32, a pass's gathered features and its columns of the rows; once
    // the identity, its iota and ones).
    for (passTiles = featureTiles; passTiles > 0; --passTiles) {
      int64_t perStep =
          kSlots * (p * (8 + 4 + 4) + 2 * passTiles * p * eltBytes);
      int64_t bytes = passTiles * vocab * eltBytes + perStep + p * (4 + 4 + 4);
      if (bytes <= k.target.sbufBytesPerPartition / 2)
        break;
    }
    passCols = std::min(width, passTiles * p);
  }

  /// Whether a feature tile of the table fits SBUF transposed (with the
  /// steps' tiles) and the gather pays: the table's transposing load (and in
  /// passes, the rows' extra store descriptors) or GpSimd's gathers take
  /// less time than software DGE's descriptors.
  bool pays() const {
    bool floats = isa<BFloat16Type, Float16Type, Float32Type>(elt);
    if (!floats || vocab == 0 || vocab > (int64_t(1) << 24) || count == 0 ||
        width == 0 || passTiles == 0)
      return false; // TensorE transposes floats; indices pass through fp32
    const ::neuron::target::CostModel cost(k.target);
    double steps = double((count + p - 1) / p);
    ::neuron::target::ComputeShape gather;
    gather.elements = double(std::min(count, p));
    double gatherNs = steps * double(featureTiles) *
                      cost.computeNs(::neuron::runtime::Opcode::NGather,
                                     ::neuron::runtime::Engine::GpSimd, gather);
    double loadNs = double(vocab * width * eltBytes) /
                    (cost.dmaTransposeBytesPerNs(false) * k.target.dmaEngines);
    // In passes, each row is stored in as many runs, a descriptor each.
    if (int64_t passes = (featureTiles + passTiles - 1) / passTiles; passes > 1)
      loadNs += double(count * passes) *
                cost.dmaTransferNs(0, double(passTiles * p * eltBytes), 1) /
                double(k.target.dmaEngines);
    // The DMA gather's chunks of columns, a descriptor a row each.
    int64_t chunk = k.indexedRows(count, width, elt).chunk;
    double chunks = double((width + chunk - 1) / chunk);
    double swdgeNs =
        steps * chunks * cost.swdgeNs(0) +
        double(count) * chunks * (cost.swdgeNs(1) - cost.swdgeNs(0));
    return std::max(gatherNs, loadNs) < swdgeNs;
  }

  void lower(Value table, Value idx, Value out) {
    KernelLowering::TileScope scope(k);
    // A pass's feature tiles of the table transposed: tile f's rows at
    // columns [f * vocab, + vocab), one transposing DMA each, issued after
    // the pass's first step's indices (the DMA queues serve transfers in
    // program order).
    tableT = k.tile(MemorySpace::sbuf, {p, passTiles * vocab}, elt);
    ident = k.identity(p, elt);
    Type i32 = b.getIntegerType(32), f32 = b.getF32Type();
    ones = k.tile(MemorySpace::sbuf, {1, p}, f32);
    b.create<nisa::MemsetOp>(ones, APFloat(1.0));
    for (int64_t s = 0; s < kSlots; ++s) {
      line.push_back(k.tile(MemorySpace::sbuf, {1, p}, idxElt));
      lineF32.push_back(k.tile(MemorySpace::sbuf, {1, p}, f32));
      spread.push_back(k.tile(MemorySpace::psum, {p, p}, f32));
      narrow.push_back(k.tile(MemorySpace::sbuf, {p, p}, i32));
      picked.push_back(k.tile(MemorySpace::sbuf, {p, passTiles * p}, elt));
      rows.push_back(k.tile(MemorySpace::sbuf, {p, passCols}, elt));
      sums.push_back(k.tile(MemorySpace::psum, {p, chunkCols}, f32));
    }
    for (int64_t f0 = 0; f0 < featureTiles; f0 += passTiles)
      pass(table, idx, out, f0, std::min(featureTiles, f0 + passTiles));
  }

private:
  /// Feature tiles [f0, f1): their columns of every gathered row.
  void pass(Value table, Value idx, Value out, int64_t f0, int64_t f1) {
    int64_t c0 = f0 * p, cols = std::min(width, f1 * p) - c0;
    bool tableLoaded = false;
    auto loadTable = [&] {
      for (int64_t f = f0; f < f1; ++f)
        k.dma(k.view(table, k.index(f * p), {features(f), vocab}, {1, width}),
              k.view(tableT, k.index((f - f0) * vocab), {features(f), vocab},
                     {passTiles * vocab, 1}));
      tableLoaded = true;
    };
    // Step i: indices [i * p, + n) in one partition's run, then on every
    // partition by a product with a ones row (K = 1: exact below 2^24, and
    // an index out of range stays out of it), as i32: a broadcasting DMA
    // would read them from HBM once per partition.
    auto load = [&](Value r0, int64_t n, int64_t slot) {
      auto head = [&](Value t) {
        return k.view(t, k.index(0), {1, n}, {p, 1});
      };
      auto all = [&](Value t) { return k.view(t, k.index(0), {p, n}, {p, 1}); };
      k.dma(k.view(idx, r0, {1, n}, {n, 1}), head(line[slot]));
      b.create<nisa::CopyOp>(head(line[slot]), head(lineF32[slot]));
      b.create<nisa::MatmulOp>(ones, head(lineF32[slot]), all(spread[slot]));
      b.create<nisa::CopyOp>(all(spread[slot]), all(narrow[slot]));
      if (!tableLoaded)
        loadTable();
    };
    auto compute = [&](Value r0, int64_t n, int64_t slot) {
      for (int64_t f = f0; f < f1; ++f) {
        int64_t fw = features(f);
        b.create<nisa::NGatherOp>(
            k.view(tableT, k.index((f - f0) * vocab), {fw, vocab},
                   {passTiles * vocab, 1}),
            k.view(narrow[slot], k.index(0), {fw, n}, {p, 1}),
            k.view(picked[slot], k.index((f - f0) * n), {fw, n},
                   {passTiles * p, 1}));
      }
      // Per chunk of columns (PSUM banks), the feature tiles transposed
      // back into it, then out to the rows tile a bank at a time, by
      // VectorE and ScalarE in turn.
      int64_t bankCols = k.target.psumBankBytes / 4, evictions = 0;
      for (int64_t cc = 0; cc < cols; cc += chunkCols) {
        int64_t chunk = std::min(chunkCols, cols - cc);
        for (int64_t f = f0 + cc / p; f * p < c0 + cc + chunk; ++f) {
          int64_t fw = features(f);
          auto mm = b.create<nisa::MatmulOp>(
              k.view(picked[slot], k.index((f - f0) * n), {fw, n},
                     {passTiles * p, 1}),
              k.view(ident, k.index(0), {fw, fw}, {p, 1}),
              k.view(sums[slot], k.index(f * p - c0 - cc), {n, fw},
                     {chunkCols, 1}));
          mm.setIsTranspose(true); // exact for NaN and infinities too
        }
        for (int64_t b0 = 0; b0 < chunk; b0 += bankCols, ++evictions) {
          int64_t bc = std::min(bankCols, chunk - b0);
          b.create<nisa::CopyOp>(
              k.view(sums[slot], k.index(b0), {n, bc}, {chunkCols, 1}),
              k.view(rows[slot], k.index(cc + b0), {n, bc}, {passCols, 1}),
              evictions % 2 ? nisa::Engine::scalar : nisa::Engine::vector);
        }
      }
      // From ScalarE's queue: on SyncE's the store would hold up the next
      // steps' index loads.
      b.create<nisa::DmaCopyOp>(
          k.view(rows[slot], k.index(0), {n, cols}, {passCols, 1}),
          k.view(out, k.addOffset(k.scale(r0, width), c0), {n, cols},
                 {width, 1}),
          nisa::Engine::scalar);
    };
    int64_t full = count / p;
    k.forEachPipelined(
        full, kSlots,
        [&](Value i, int64_t slot) { load(k.scale(i, p), p, slot); },
        [&](Value i, int64_t slot) { compute(k.scale(i, p), p, slot); });
    if (int64_t rest = count % p) {
      load(k.index(full * p), rest, full % kSlots);
      compute(k.index(full * p), rest, full % kSlots);
    }
  }

  static constexpr int64_t kSlots = 2;
  static constexpr int64_t kBanksPerChunk = 2;
  int64_t features(int64_t f) const { return std::min(p, width - f * p); }

  KernelLowering &k;
  ImplicitLocOpBuilder &b;
  int64_t p;
  Type elt, idxElt;
  int64_t vocab, width, count, featureTiles, eltBytes, chunkCols;
  /// Feature tiles a pass holds on chip (0: not one fits), and their columns.
  int64_t passTiles, passCols;
  /// lower()'s tiles: the table's pass, the identity and a ones row; per
  /// slot the indices (as loaded, f32, spread over the partitions in PSUM,
  /// i32), the gathered features, the rows and their PSUM chunk.
  Value tableT, ident, ones;
  SmallVector<Value> line, lineF32, spread, narrow, picked, rows, sums;
};
} // namespace

void KernelLowering::lowerGather(GatherOp op) {
  auto tableType = tensorType(op.getTable());
  int64_t width = product(tableType.getShape().drop_front());
  int64_t vocab = tableType.getDimSize(0);
  Value table = bufferOf(op.getTable());
  Value out = resultBuffer(op.getResult());
  if (PartitionGather gather(*this, op); gather.pays())
    return gather.lower(table, bufferOf(op.getIndices()), out);
  forEachIndexedRows(
      bufferOf(op.getIndices()), tensorType(op.getIndices()).getNumElements(),
      width, tableType.getElementType(), Value(),
      [&](Value r0, Value indices, Value c0, Value rowsTile) {
        auto shape = cast<MemRefType>(rowsTile.getType()).getShape();
        b.create<nisa::DmaGatherOp>(
            view(table, c0, {vocab, shape[1]}, {width, 1}), indices, rowsTile);
        dma(rowsTile,
            view(out, addOffsets(scale(r0, width), c0), shape, {width, 1}));
      });
}

void KernelLowering::lowerScatter(ScatterOp op) {
  auto inputType = tensorType(op.getInput());
  int64_t width = product(inputType.getShape().drop_front());
  int64_t vocab = inputType.getDimSize(0);
  Value values = bufferOf(op.getValues());
  Value out = resultBuffer(op.getResult());
  auto scatterRows = [&] {
    forEachIndexedRows(
        bufferOf(op.getIndices()), tensorType(op.getIndices()).getNumElements(),
        width, inputType.getElementType(), values,
        [&](Value, Value indices, Value c0, Value rowsTile) {
          auto shape = cast<MemRefType>(rowsTile.getType()).getShape();
          auto scatter = b.create<nisa::DmaScatterOp>(
              rowsTile, indices, view(out, c0, {vocab, shape[1]}, {width, 1}),
              op.getAccumulate());
          scatter.setDisjoint(op.getPermutation());
        });
  };
  // A permutation writes every row, each once: nothing to initialize, and
  // the scatters need no order among themselves.
  if (op.getPermutation())
    return scatterRows();
  // The rows no index names keep the input's values, which every scatter
  // below waits for (they write the whole table): a splat (torch.zeros) is
  // stored from one tile set to it, half the HBM traffic of copying it;
  // anything else is one HBM-to-HBM copy.
  // (Float tables: a memset's value is an f64.)
  Type elt = inputType.getElementType();
  std::optional<double> value = splatValueOf(op.getInput());
  if (value && isa<FloatType>(elt) && vocab > 0 && width > 0) {
    TileScope scope(*this);
    int64_t rows = std::min<int64_t>(vocab, target.partitions);
    int64_t eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
    int64_t cols = std::min(width, std::max<int64_t>(1, tileBytes / eltBytes));
    Value fill = tile(MemorySpace::sbuf, {rows, cols}, elt);
    b.create<nisa::MemsetOp>(fill, APFloat(*value));
    forTiles(vocab, rows, [&](Value r0, int64_t rt) {
      forTiles(width, cols, [&](Value c0, int64_t ct) {
        dma(view(fill, index(0), {rt, ct}, {cols, 1}),
            view(out, addOffsets(scale(r0, width), c0), {rt, ct}, {width, 1}));
      });
    });
  } else {
    dma(view(bufferOf(op.getInput()), index(0), {vocab, width}, {width, 1}),
        view(out, index(0), {vocab, width}, {width, 1}));
  }
  scatterRows();
}

namespace {
struct GatherPattern : OpTilePattern<GatherPattern, GatherOp> {
  LogicalResult lowerOp(GatherOp op, KernelLowering &k) const {
    k.lowerGather(op);
    return success();
  }
};

struct ScatterPattern : OpTilePattern<ScatterPattern, ScatterOp> {
  LogicalResult lowerOp(ScatterOp op, KernelLowering &k) const {
    k.lowerScatter(op);
    return success();
  }
};
} // namespace

void populateGatherPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<GatherPattern>());
  patterns.push_back(std::make_unique<ScatterPattern>());
}

} // namespace mlir::neuron
