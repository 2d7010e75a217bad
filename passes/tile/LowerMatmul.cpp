//===- LowerMatmul.cpp - neuron.matmul as a blocked GEMM ------------------===//
//
// GEMM on TensorE: A^T panels resident in SBUF, B streamed, sums in PSUM
// (GemmLowering says how); neuron.scaled_matmul is the same GEMM with its
// scales and bias applied as the sums leave PSUM.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

#include "runtime/target/Cost.h"

#include <optional>

namespace mlir::neuron {

namespace {

using ::neuron::target::kMxBlock;
/// The SBUF bytes per partition an MX GEMM gives a row chunk of A's scales.
constexpr int64_t kMxScaleBytes = 32 * 1024;

/// Bytes per partition of an MX scale panel (GemmLowering::scalePanel) of
/// `cols` columns per 128 scale groups, for a contraction of `kDim`.
int64_t mxScalePanelBytes(const ::neuron::target::Target &target, int64_t kDim,
                          int64_t cols) {
  int64_t groups = kDim / kMxBlock;
  return (groups + target.matmulMaxK - 1) / target.matmulMaxK * cols;
}

/// The value of an index built from constants by TileBuilder's arithmetic.
std::optional<int64_t> constantIndex(Value v) {
  if (auto c = v.getDefiningOp<arith::ConstantIndexOp>())
    return c.value();
  auto both = [](Operation *op) -> std::optional<std::pair<int64_t, int64_t>> {
    auto a = constantIndex(op->getOperand(0)),
         b = constantIndex(op->getOperand(1));
    if (!a || !b)
      return std::nullopt;
    return std::pair{*a, *b};
  };
  if (auto add = v.getDefiningOp<arith::AddIOp>())
    if (auto ab = both(add))
      return ab->first + ab->second;
  if (auto mul = v.getDefiningOp<arith::MulIOp>())
    if (auto ab = both(mul))
      return ab->first * ab->second;
  return std::nullopt;
}

/// GEMM, with the operand reuse that keeps TensorE fed:
///  - an M block of up to four 128-row tiles keeps its A^T panel (all of K)
///    in SBUF, loaded once by DMA transposes;
///  - B streams through SBUF in [128, N group] tiles, double-buffered, each
///    feeding every M tile of the block;
///  - each (M tile, 512-column N tile) accumulates over K in its own PSUM
///    bank; two sets of banks alternate between N groups, so TensorE fills
///    one set while ScalarE and VectorE evict the other;
///  - fp8 operands on a chip with FP8 double_row (matmul_fp8_k_factor R):
///    one matmul contracts a group of R consecutive K tiles, held in R
///    adjacent panel columns (B slots). Value R * p + r of a group sits on
///    partition p, row r: an operand contiguous along K (A of a Linear, and
///    its weight as B) then loads by DMA transposes of R-byte units, R fp8
///    values of K at once, its R rows interleaved in SBUF; an operand
///    strided along K loads each row as a contiguous run, its rows a tile's
///    columns apart.
/// One member per level of the loop nest: batch, M block, N group, K step.
class GemmLowering {
public:
  /// What the eviction applies besides the rounding to the output dtype
  /// (neuron.scaled_matmul): fp32 scales of each row and each column, a
  /// bias of each column. Windows of 1-d tensors of one element, or of M
  /// (row scale) or N elements; `bias.buffer` is null without a bias.
  /// Without scales (`scaled` false: a neuron.matmul's epilogue), the
  /// column bias or a row affine (`rowScale`, `rowShift`: [M] f32, each
  /// optional), then `act`, then min(., clampMax).
  struct Epilogue {
    TileBuilder::Window rowScale, colScale, bias, rowShift;
    bool rowwise = false, colwise = false, scaled = true;
    Type biasElt;
    std::optional<nisa::ActivationFn> act;
    std::optional<double> clampMax;
    bool rowAffine() const {
      return !scaled && (rowScale.buffer || rowShift.buffer);
    }
  };
  /// MX block scales (neuron.scaled_matmul with E8M0 scales): windows of
  /// the ui8 [M, K / 32] and [N, K / 32] tensors.
  struct BlockScales {
    TileBuilder::Window a, b;
  };
  /// `rows`: M when only known at run time (issue #16), else null.
  GemmLowering(KernelLowering &k, Value lhsValue, Value rhsValue, Value result,
               Value rows = {}, std::optional<Epilogue> epilogue = std::nullopt,
               std::optional<BlockScales> blockScales = std::nullopt);
  /// One loop per batch dim (windows may stride them any way), a GEMM in
  /// each.
  void lower();
  /// neuron.grouped_matmul: group g's rows [ends[g-1], ends[g]) times rhs[g]
  /// as a GEMM of a row count known at run time (no work for an empty
  /// group), then zeros in the rows after the last group.
  void lowerGrouped(ValueRange ends);

private:
  /// Element offsets of one batch's A, B and output.
  struct Bases {
    Value lhs, rhs, out;
  };
  /// Where an M block's A^T panel is: K on the partitions, column
  /// kIdx * rows + row of A, from `at` in `buffer` of row stride `stride`.
  struct Panel {
    Value buffer, at;
    int64_t stride;
  };
  /// The panel of the next M block, loaded while this block computes: into
  /// slot `slot + 1` of `slots`, whole, a K chunk per N group, or else
  /// (rowPieces > 1) a piece of its rows per N group.
  struct NextPanel {
    Value block;
    int64_t slot;
    Value buffer;
    int64_t slots, cols, stride;
    bool chunked;
    int64_t chunk, rowPieces;
  };
  /// A block of a size-generic GEMM's last rows: its last tile moves only
  /// `lastRows` rows (the compute runs on the whole tile; rows past them are
  /// never stored).
  Value lastRows;
  /// An M block's on-chip state: B tiles rotating over `bSlots`, two PSUM
  /// bank sets and two output staging sets alternating between N groups;
  /// with an epilogue, each M tile's row scale (times a single column
  /// scale) as a [P, 1] column, and per N group set the column scales and
  /// bias broadcast over the partitions.
  struct Block {
    Value m0;
    int64_t rows, tiles;
    Panel panel;
    std::optional<NextPanel> next;
    int64_t maxPieces;
    int64_t bSlots;
    /// Each N group's B tiles load during the group before (a group of up
    /// to kAheadSteps K steps, a small K: a group's B loads would otherwise
    /// follow the group before's stores in program order, and its matmuls
    /// wait for them, the engines taking turns).
    bool bAhead = false;
    Value moving, acc, staged;
    Value rowScales, colScales, bias, scaled, rowShifts;
  };
  /// One N group of a block: columns [n0, n0 + cols), in bank set `set`.
  struct Group {
    Value g, n0;
    int64_t set, cols, tiles;
  };

  /// The GEMM of rows [0, rows) of A from `base`.
  void lowerBatch(const Bases &base, int64_t rows);
  /// With MX block scales: B's scales on chip once, then the GEMM in row
  /// chunks, each after its A scales.
  void lowerMx(const Bases &base);
  /// A scale panel of `cols` columns per 128 scale groups: the transpose of the
  /// scales, group g on partition g % 128 in the columns from (g / 128) * cols.
  /// A matmul's 16 groups from K tile kFirst then start on partition 4 * kFirst
  /// % 128: an affine offset while K <= 4096 (one block of columns), beyond it
  /// one the K loop must know (unrolledK).
  Value scalePanel(int64_t cols);
  bool unrolledK() const { return blockScales && kDim / kMxBlock > kTile; }
  /// Rows [r0, r0 + rows) of a [rows, K / 32] scale tensor into `panel`
  /// (scalePanel's layout), as the MX matmuls take them.
  void loadScales(const TileBuilder::Window &src, int64_t r0, int64_t rows,
                  Value panel, int64_t cols);
  /// An MX matmul's scale operands: those of the K group from K tile
  /// kFirst (`free` columns from `col` of a panel of `cols` columns per 128
  /// groups) on the matmul's `partitions` / 8 rows.
  Value scaleView(Value panel, int64_t cols, Value kFirst, Value col,
                  int64_t partitions, int64_t free);
  /// lowerBatch with M known at run time: full blocks counted at run time,
  /// then the last rows as a block of 1..mTiles tiles, its last one short.
  void lowerBatchDynamic(const Bases &base);
  void lowerFullBlocksDynamic(const Bases &base, Value fullBlocks);
  /// A^T rows [m0, m0 + rows) into `panel`: the full K tiles
  /// (loadPanelTiles), then the K tail (a double_row group, or a partial
  /// tile).
  void loadPanel(const Bases &base, Value m0, int64_t rows, Value panel,
                 Value panelAt, int64_t panelStride, Value moved = {});
  /// Rows [r0, r0 + count) (null r0: 0) of full K tiles [t0, t0 + tiles)
  /// (t0 a whole number of double_row groups) of a panel of `rows` rows:
  /// `src` is A's element (row r0, K t0 * kTile), `at` the panel column of
  /// tile t0's row 0. One transfer for the whole double_row groups ([k in
  /// tile, group, row of A, row in group], or R-major), one for the other
  /// tiles ([k in tile, tile, row of A]). `partitions`: one group on fewer
  /// partitions (the K tail).
  void loadPanelTiles(Value src, Value panel, Value at, int64_t stride,
                      int64_t rows, Value r0, int64_t count, int64_t tiles,
                      Value moved, std::optional<int64_t> partitions = {});
  /// k.view, with dim `rowsDim`'s size `moved` when known only at run time.
  Value viewMoving(Value base, Value at, ArrayRef<int64_t> shape,
                   ArrayRef<int64_t> strides, size_t rowsDim, Value moved);
  /// K tiles of the next panel each N group loads, when the groups divide
  /// the (full, whole double_row group) K tiles evenly; else 0.
  int64_t panelChunk() const;
  /// Without K chunks: N groups that each load mBlock / pieces rows of the
  /// next panel when they divide it (and K has no tail); else 1.
  int64_t panelRowPieces() const;
  /// The full M blocks, their panels alternating between two slots, each
  /// loading the next one's.
  void lowerFullBlocks(const Bases &base, int64_t fullBlocks);
  void lowerBlock(const Bases &base, Value m0, int64_t rows, const Panel &panel,
                  std::optional<NextPanel> next, int64_t maxPieces);
  /// B slots that hide a load behind the matmuls of the steps before it,
  /// and the group's stores behind those of the next group's first steps.
  int64_t bSlotsFor(int64_t blockTiles) const;
  /// N group g (columns from g * nGroup, `cols` of them) in bank set `set`;
  /// with `bAhead`, also the B tiles of the next group, of `nextCols`
  /// columns (0: none), into the other set's slots.
  void lowerGroup(const Bases &base, const Block &blk, Value g, int64_t set,
                  int64_t cols, bool first, bool prefetches,
                  int64_t nextCols = 0);
  /// The K steps of an N group with `bAhead` (at most kAheadSteps), their B
  /// tiles in slots `set * stepsPerGroup()` on, loaded by loadGroupB.
  static constexpr int64_t kAheadSteps = 4;
  int64_t stepsPerGroup() const { return fullK + (tailK > 0); }
  void loadGroupB(const Bases &base, const Block &blk, const Group &grp);
  /// The B tiles of K step `kFirst` (and the tilesPerMatmul - 1 after it)
  /// of a group into `slot0` on.
  void loadB(const Bases &base, const Block &blk, const Group &grp,
             Value kFirst, int64_t slot0, int64_t kt, int64_t tilesPerMatmul);
  /// K step `kIdx` of a group: a matmul per (M tile, N tile) into its bank
  /// (`first` starts the sums) over the last `tilesPerMatmul` K tiles,
  /// after loading their B tiles (0: none yet, the next step's matmul takes
  /// this tile; R: a double_row matmul over this tile and the R - 1 before
  /// it, loaded together into `slot` and the slots before it).
  void kStep(const Bases &base, const Block &blk, const Group &grp, Value kIdx,
             int64_t slot, int64_t kt, bool first, int64_t tilesPerMatmul,
             bool load = true);
  /// The tiles the matmul of step `i` of `count` consecutive full K steps
  /// (the first at an even K tile and slot) takes: R at the end of each
  /// whole group of R, 0 before it; 1 for steps past the last whole group.
  int64_t tilesAt(int64_t i, int64_t count) const;
  /// Loads the epilogue's row scales of the block (times a one-element
  /// column scale).
  void loadRowScales(const Block &blk);
  void loadRowAffine(const Block &blk);
  /// Loads the epilogue's column scales and bias of a group into its set.
  void loadColumnOperands(const Block &blk, const Group &grp);
  /// PSUM bank -> `part` (the output dtype), through the epilogue if any.
  void evictBank(const Block &blk, const Group &grp, int64_t mi, int64_t ni,
                 int64_t mt, int64_t nt, Value part);
  /// The full K steps in rounds of bSlots, spreading the next panel's
  /// pieces over the first rounds.
  void fullKSteps(const Bases &base, const Block &blk, const Group &grp,
                  bool first, bool prefetches);
  /// `piece` of `pieces` of the next panel's share for N group g (nothing
  /// for the last block).
  void prefetch(const Bases &base, const Block &blk, Value g, bool first,
                Value piece, int64_t pieces);
  /// Evict each bank (alternating VectorE and ScalarE) and store.
  void evictGroup(const Bases &base, const Block &blk, const Group &grp);
  Value bank(const Block &blk, const Group &grp, int64_t mi, int64_t ni,
             int64_t rows, int64_t width);

  KernelLowering &k;
  RankedTensorType lhsType, rhsType, outType;
  int64_t rank, m, kDim, n;
  // Operands are read through their windows: a transposed operand (a
  // linear layer's weight) is loaded by transposing DMAs, never copied.
  TileBuilder::Window a, bw;
  Value lhs, rhs, out;
  int64_t aRow, aCol, bRow, bCol;
  Type inElt, rhsElt, outElt, f32;
  int64_t eltBytes;
  /// K tiles one matmul contracts (FP8 double_row: matmul_fp8_k_factor),
  /// and whether A's (B's) whole double_row groups sit interleaved (K
  /// contiguous in memory) rather than R-major.
  int64_t kTilesPerMatmul;
  bool interleaveA, interleaveB;
  /// The K tiles of the full K steps, and the K values after them: one
  /// last step, a double_row group on tailK / R partitions when fp8 and
  /// whole (`tailGrouped`: no fp8 element then moves alone), else a
  /// partial tile.
  int64_t fullK, tailK;
  bool tailGrouped;
  std::optional<Epilogue> epilogue;
  /// A Linear epilogue's bias broadcast over the partitions, fp32 [mTile,
  /// N], loaded once for the whole GEMM (loaded for each N group of each
  /// block, its 128 copies read from HBM came to the bytes of a block's
  /// output).
  Value residentBias;
  static constexpr int64_t kResidentBiasBytes = 16 * 1024;
  void broadcastBias();
  /// MX: the scales, and on chip B's panel and that of the current row
  /// chunk of A (scalePanel), of scaleColsB (N) and scaleColsA (the chunk's
  /// rows) columns per 128 scale groups.
  std::optional<BlockScales> blockScales;
  Value scalesA, scalesB;
  int64_t scaleColsA = 0, scaleColsB = 0;
  /// accsPerSet: the (M tile, N tile) accumulators of a PSUM bank set, an
  /// nTile-column slot each.
  int64_t kTile, mTile, nTile, accsPerSet, kTiles, kRows;
  int64_t mTiles, nTiles, mBlock, nGroup;
  /// Whether all of B stays in SBUF for the batch (`bAll`: K tile kt's rows
  /// from column kt * n), loaded once: B small beside the panels and the
  /// staging, and M more than one block, which would stream it again for
  /// each (and a block's B loads, behind the block before's stores in the
  /// DMA queues, would hold up its matmuls).
  bool residentB = false;
  Value bAll;
  /// B's loads for the batch at `bPending`, issued after the first panel's
  /// (loadPanel): ahead of it, the first matmul would wait for all of B.
  std::optional<Bases> bPending;
  void loadAllB(const Bases &base);
  Value mRows;
};

GemmLowering::GemmLowering(KernelLowering &k, Value lhsValue, Value rhsValue,
                           Value result, Value rows,
                           std::optional<Epilogue> epilogue,
                           std::optional<BlockScales> blockScales)
    : k(k), lhsType(tensorType(lhsValue)), rhsType(tensorType(rhsValue)),
      outType(tensorType(result)), epilogue(std::move(epilogue)),
      blockScales(std::move(blockScales)), mRows(rows) {
  const auto &target = k.target;
  rank = lhsType.getRank();
  m = lhsType.getDimSize(rank - 2);
  kDim = lhsType.getDimSize(rank - 1);
  int64_t rhsRank = rhsType.getRank(); // a grouped GEMM's has one more dim
  n = rhsType.getDimSize(rhsRank - 1);
  a = k.windowOf(lhsValue);
  bw = k.windowOf(rhsValue);
  lhs = a.buffer;
  rhs = bw.buffer;
  aRow = a.strides[rank - 2];
  aCol = a.strides[rank - 1];
  bRow = bw.strides[rhsRank - 2];
  bCol = bw.strides[rhsRank - 1];
  out = k.resultBuffer(result);
  inElt = lhsType.getElementType();
  rhsElt = rhsType.getElementType();
  outElt = outType.getElementType();
  f32 = k.b.getF32Type();
  eltBytes = std::max<int64_t>(1, lhsType.getElementTypeBitWidth() / 8);
  auto isFp8 = [](Type t) { return isa<Float8E4M3FNType, Float8E5M2Type>(t); };
  kTilesPerMatmul = this->blockScales ? target.matmulMxKFactor()
                    : isFp8(inElt) && isFp8(rhsType.getElementType())
                        ? std::max<int64_t>(1, target.matmulFp8KFactor())
                        : 1;
  interleaveA = kTilesPerMatmul > 1 && aCol == 1;
  interleaveB = kTilesPerMatmul > 1 && bRow == 1;

  kTile = target.matmulMaxK;
  mTile = target.matmulMaxStationaryFree;
  int64_t bankCols = target.psumBankBytes / 4; // fp32 per bank
  nTile = std::min(target.matmulMaxMovingFree, bankCols);
  // MX: TensorE runs 4x bf16's rate, faster than the B stream of an M block
  // of one bank per M tile (a pass over B per 512 rows) can feed it;
  // half-bank accumulators double the block's rows, halving B's passes.
  if (this->blockScales)
    nTile = bankCols / 2;
  accsPerSet = std::max<int64_t>(1, target.psumBanks / 2) * (bankCols / nTile);
  kRows = std::min(kDim, kTile);
  int64_t grouped = kDim / kTile / kTilesPerMatmul * kTilesPerMatmul;
  tailGrouped = kTilesPerMatmul > 1 && kDim > grouped * kTile &&
                (kDim - grouped * kTile) % kTilesPerMatmul == 0;
  fullK = tailGrouped ? grouped : kDim / kTile;
  tailK = kDim - fullK * kTile;
  // Panel columns per row of A: a tile's each (a grouped tail takes R).
  kTiles = fullK + (tailGrouped ? kTilesPerMatmul : tailK > 0);
  // M tiles per block: as many as PSUM and the panel budget allow (two
  // panels over gemm-panel-sbuf-percent of SBUF would crowd out the streams).
  // Blocks of a size-generic GEMM are sized as a large M's.
  int64_t mTilesTotal = mRows ? accsPerSet : (m + mTile - 1) / mTile;
  // MX: B's scales and a row chunk's of A's stay on chip too; the panels
  // keep their share unless that leaves the scales and the streams less
  // than a quarter of SBUF.
  int64_t panelBudget =
      target.sbufBytesPerPartition * k.knobs.gemmPanelSbufPercent / 100;
  if (this->blockScales)
    panelBudget =
        std::min(panelBudget, target.sbufBytesPerPartition * 3 / 4 -
                                  mxScalePanelBytes(target, kDim, n) -
                                  std::min(kMxScaleBytes,
                                           mxScalePanelBytes(target, kDim, m)));
  auto fitTiles = [&](int64_t budget) {
    int64_t tiles = std::min<int64_t>(mTilesTotal, accsPerSet);
    while (tiles > 1 && 2 * kTiles * tiles * mTile * eltBytes > budget)
      --tiles;
    return tiles;
  };
  mTiles = fitTiles(panelBudget);
  // A block of one M tile streams all of B again for every 128 rows (a
  // long K, as an MLP's down projection: 14336): the panels may then take
  // three quarters of SBUF, which halves B's traffic or better.
  if (mTiles == 1 && !this->blockScales)
    mTiles = fitTiles(target.sbufBytesPerPartition * 3 / 4);
  // N tiles per B transfer: fill the bank set the M tiles leave free.
  int64_t nTilesTotal = (n + nTile - 1) / nTile;
  nTiles = std::max<int64_t>(
      1, std::min<int64_t>(nTilesTotal, accsPerSet / mTiles));
  mBlock = mTiles * mTile;
  nGroup = std::min(n, nTiles * nTile);
  int64_t sbuf = target.sbufBytesPerPartition;
  int64_t rhsBytes = std::max<int64_t>(1, rhsType.getElementTypeBitWidth() / 8);
  int64_t outBytes = std::max<int64_t>(1, outType.getElementTypeBitWidth() / 8);
  int64_t bBytes = kTiles * n * rhsBytes;
  int64_t others =
      2 * kTiles * mBlock * eltBytes + 2 * mTiles * nGroup * outBytes;
  residentB = !this->blockScales && kTilesPerMatmul == 1 &&
              (mRows || m > mBlock) && bBytes <= sbuf / 4 &&
              bBytes + others <= sbuf - sbuf / 8;
}

void GemmLowering::loadAllB(const Bases &base) {
  // In the order the first M block reads it, N group by N group, so its
  // first matmuls wait for their own tiles only.
  auto load = [&] {
    for (int64_t n0 = 0; n0 < n; n0 += nGroup)
      for (int64_t kt = 0; kt < kTiles; ++kt) {
        int64_t rows = kt < fullK ? kTile : tailK;
        int64_t cols = std::min(nGroup, n - n0);
        Value src = k.addOffset(base.rhs, kt * kTile * bRow + n0 * bCol);
        k.dma(
            k.view(rhs, src, {rows, cols}, {bRow, bCol}),
            k.view(bAll, k.index(kt * n + n0), {rows, cols}, {kTiles * n, 1}));
      }
  };
  // Rows known at run time may be none (an empty group): nothing to load.
  if (mRows)
    k.ifMore(mRows, 0, load);
  else
    load();
}

/// residentBias: one DMA broadcasting the bias over the partitions (and
/// widening it to fp32) for the whole GEMM.
void GemmLowering::broadcastBias() {
  const TileBuilder::Window &w = epilogue->bias;
  residentBias = k.tile(MemorySpace::sbuf, {mTile, n}, f32);
  k.dma(k.view(w.buffer, k.index(w.offset), {mTile, n}, {0, w.strides[0]}),
        residentBias);
}

void GemmLowering::lower() {
  TileBuilder::TileScope scope(k);
  if (epilogue && !epilogue->scaled && epilogue->bias.buffer &&
      n * 4 <= kResidentBiasBytes)
    broadcastBias();
  auto outStrides = contiguousStrides(outType.getShape());
  std::function<void(int64_t, Value, Value, Value)> batches =
      [&](int64_t d, Value lo, Value ro, Value oo) {
        if (d == rank - 2)
          return mRows         ? lowerBatchDynamic({lo, ro, oo})
                 : blockScales ? lowerMx({lo, ro, oo})
                               : lowerBatch({lo, ro, oo}, m);
        k.forEach(outType.getDimSize(d), [&](Value i) {
          batches(d + 1, k.addOffsets(lo, k.scale(i, a.strides[d])),
                  k.addOffsets(ro, k.scale(i, bw.strides[d])),
                  k.addOffsets(oo, k.scale(i, outStrides[d])));
        });
      };
  batches(0, k.index(a.offset), k.index(bw.offset), k.index(0));
}

/// Rows [start, m) of the grouped GEMM's [m, n] output, after the last
/// group: torch leaves them unspecified; they are zeros, as the per-group
/// loop of Transformers' fallback leaves them. Stored `tileRows` at a time.
static void zeroRowsFrom(KernelLowering &k, Value out, Value start, int64_t m,
                         int64_t n, int64_t tileRows, Type outElt) {
  auto &b = k.b;
  TileBuilder::TileScope scope(k);
  int64_t eltOut = std::max<int64_t>(1, outElt.getIntOrFloatBitWidth() / 8);
  int64_t cols = std::min<int64_t>(n, k.tileBytes / eltOut);
  Value zeros = k.tile(MemorySpace::sbuf, {tileRows, cols}, outElt);
  Value rest = b.create<arith::SubIOp>(k.index(m), start);
  k.ifMore(rest, 0, [&] {
    b.create<nisa::MemsetOp>(zeros, APFloat(0.0f));
    auto store = [&](Value r0, OpFoldResult rows) {
      for (int64_t c = 0; c < n; c += cols) {
        int64_t w = std::min(cols, n - c);
        Value at = k.addOffset(k.scale(k.addOffsets(start, r0), n), c);
        k.dma(k.view(zeros, k.index(0), {rows, b.getIndexAttr(w)}, {cols, 1}),
              k.view(out, at, {rows, b.getIndexAttr(w)}, {n, 1}));
      }
    };
    k.forEachDynamic(b.create<arith::FloorDivSIOp>(rest, k.index(tileRows)),
                     [&](Value i) {
                       store(k.scale(i, tileRows), b.getIndexAttr(tileRows));
                     });
    Value tail = b.create<arith::RemSIOp>(rest, k.index(tileRows));
    k.ifMore(tail, 0,
             [&] { store(b.create<arith::SubIOp>(rest, tail), tail); });
  });
}

void GemmLowering::lowerGrouped(ValueRange ends) {
  auto &b = k.b;
  Value start = k.index(0);
  for (auto [g, end] : llvm::enumerate(ends)) {
    mRows = b.create<arith::SubIOp>(end, start);
    lowerBatchDynamic({k.addOffset(k.scale(start, aRow), a.offset),
                       k.index(bw.offset + (int64_t)g * bw.strides[0]),
                       k.scale(start, n)});
    start = end;
  }
  mRows = {};
  zeroRowsFrom(k, out, start, m, n, mTile, outElt);
}

void GemmLowering::lowerBatch(const Bases &base, int64_t rows) {
  TileBuilder::TileScope scope(k);
  if (residentB) {
    bAll = k.tile(MemorySpace::sbuf, {kRows, kTiles * n}, rhsElt);
    bPending = base;
  }
  int64_t fullBlocks = rows / mBlock;
  if (fullBlocks > 0)
    lowerFullBlocks(base, fullBlocks);
  if (int64_t rest = rows % mBlock) {
    TileBuilder::TileScope panels(k);
    Value buffer = k.tile(MemorySpace::sbuf, {kRows, kTiles * rest}, inElt);
    Value m0 = k.index(fullBlocks * mBlock);
    loadPanel(base, m0, rest, buffer, k.index(0), kTiles * rest);
    lowerBlock(base, m0, rest, {buffer, k.index(0), kTiles * rest},
               std::nullopt, 1);
  }
}

void GemmLowering::lowerMx(const Bases &base) {
  TileBuilder::TileScope scope(k);
  scaleColsB = n;
  scalesB = scalePanel(scaleColsB);
  loadScales(blockScales->b, 0, n, scalesB, scaleColsB);
  // Row chunks whose A scales fit kMxScaleBytes per partition; B streams
  // once per M block anyway, so a chunk costs only its pipeline's fill.
  int64_t blocks = mxScalePanelBytes(k.target, kDim, 1);
  int64_t chunk =
      std::max<int64_t>(mBlock, kMxScaleBytes / blocks / mBlock * mBlock);
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    TileBuilder::TileScope rowScope(k);
    int64_t rows = std::min(chunk, m - r0);
    scaleColsA = rows;
    scalesA = scalePanel(scaleColsA);
    loadScales(blockScales->a, r0, rows, scalesA, scaleColsA);
    lowerBatch({k.addOffset(base.lhs, r0 * aRow), base.rhs,
                k.addOffset(base.out, r0 * n)},
               rows);
  }
}

Value GemmLowering::scalePanel(int64_t cols) {
  int64_t groups = kDim / kMxBlock;
  return k.tile(
      MemorySpace::sbuf,
      {std::min(groups, kTile), mxScalePanelBytes(k.target, kDim, cols)},
      k.b.getIntegerType(8, /*isSigned=*/false));
}

void GemmLowering::loadScales(const TileBuilder::Window &src, int64_t r0,
                              int64_t rows, Value panel, int64_t cols) {
  auto &b = k.b;
  TileBuilder::TileScope scope(k);
  int64_t groups = kDim / kMxBlock, rowStride = src.strides[0];
  int64_t chunks = (groups + kTile - 1) / kTile, panelStride = chunks * cols;
  // The DMA transposes 2- and 4-byte units only: a u8 transpose would move
  // one byte per descriptor. So the rows load as they are (partition p
  // holding rows [p * slots, p * slots + slots) of the whole 128-row
  // blocks, one run each, then the rest on their own partitions), widen to
  // bf16 (exact), transpose on TensorE (a product with the identity) and
  // narrow back into the panel.
  int64_t slots = rows / kTile, full = slots * kTile, rest = rows - full;
  int64_t rawCols = (slots + (rest > 0)) * groups;
  Type u8 = b.getIntegerType(8, /*isSigned=*/false), bf16 = b.getBF16Type();
  Value raw = k.tile(MemorySpace::sbuf, {kTile, rawCols}, u8);
  Value wide = k.tile(MemorySpace::sbuf, {kTile, rawCols}, bf16);
  Value ident = k.identity(kTile, bf16);
  constexpr int64_t kSums = 8; // transposes in flight
  Value sums =
      k.tile(MemorySpace::psum, {kTile, kSums * kTile}, b.getF32Type());
  // Widened in pieces over three engines, each piece's transposes free to
  // start when it is done.
  int64_t pieces = 0;
  auto widen = [&](int64_t col, int64_t partitions, int64_t width) {
    constexpr nisa::Engine engines[] = {
        nisa::Engine::vector, nisa::Engine::gpsimd, nisa::Engine::scalar};
    int64_t step = std::max<int64_t>(groups, width / 6 / groups * groups);
    for (int64_t c = 0; c < width; c += step, ++pieces) {
      int64_t w = std::min(step, width - c);
      b.create<nisa::CopyOp>(
          k.view(raw, k.index(col + c), {partitions, w}, {rawCols, 1}),
          k.view(wide, k.index(col + c), {partitions, w}, {rawCols, 1}),
          engines[pieces % 3]);
    }
  };
  if (slots) {
    k.dma(k.view(src.buffer, k.index(src.offset + r0 * rowStride),
                 {kTile, slots, groups}, {slots * rowStride, rowStride, 1}),
          k.view(raw, k.index(0), {kTile, slots, groups},
                 {rawCols, groups, 1}));
    widen(0, kTile, slots * groups);
  }
  if (rest) {
    k.dma(k.view(src.buffer, k.index(src.offset + (r0 + full) * rowStride),
                 {rest, groups}, {rowStride, 1}),
          k.view(raw, k.index(slots * groups), {rest, groups}, {rawCols, 1}));
    widen(slots * groups, rest, groups);
  }
  // Slot s's transpose: row p * slots + s of the whole blocks in column p
  // (the rest: row full + p).
  int64_t transposes = 0;
  for (int64_t slot = 0; slot < slots + (rest > 0); ++slot) {
    bool whole = slot < slots;
    int64_t pc = whole ? kTile : rest;
    for (int64_t gc = 0; gc < chunks; ++gc, ++transposes) {
      int64_t gw = std::min(kTile, groups - gc * kTile);
      Value t = k.view(sums, k.index(transposes % kSums * kTile), {gw, pc},
                       {kSums * kTile, 1});
      b.create<nisa::MatmulOp>(
          k.view(wide, k.index(slot * groups + gc * kTile), {pc, gw},
                 {rawCols, 1}),
          k.view(ident, k.index(0), {pc, pc}, {kTile, 1}), t);
      Value dst = whole ? k.view(panel, k.index(gc * cols + slot), {gw, pc},
                                 {panelStride, slots})
                        : k.view(panel, k.index(gc * cols + full), {gw, pc},
                                 {panelStride, 1});
      b.create<nisa::CopyOp>(t, dst,
                             transposes % 2 ? nisa::Engine::scalar
                                            : nisa::Engine::vector);
    }
  }
}

Value GemmLowering::scaleView(Value panel, int64_t cols, Value kFirst,
                              Value col, int64_t partitions, int64_t free) {
  int64_t groups = kDim / kMxBlock, perTile = kTile / kMxBlock;
  int64_t stride = (groups + kTile - 1) / kTile * cols;
  Value at;
  if (!unrolledK()) {
    at = k.addOffsets(k.scale(kFirst, perTile * stride), col);
  } else {
    std::optional<int64_t> tile = constantIndex(kFirst);
    assert(tile && "an unrolled K loop's K tiles are constants");
    int64_t g = *tile * perTile;
    at = k.addOffset(col, g % kTile * stride + g / kTile * cols);
  }
  return k.view(panel, at, {partitions * kTilesPerMatmul / kMxBlock, free},
                {stride, 1});
}

void GemmLowering::loadPanel(const Bases &base, Value m0, int64_t rows,
                             Value panel, Value panelAt, int64_t panelStride,
                             Value moved) {
  Value rows0 = k.addOffsets(base.lhs, k.scale(m0, aRow));
  // The panel's layout is that of `rows` rows; a short block moves `moved`.
  if (fullK)
    loadPanelTiles(rows0, panel, panelAt, panelStride, rows, Value(), rows,
                   fullK, moved);
  if (tailGrouped)
    loadPanelTiles(k.addOffset(rows0, fullK * kTile * aCol), panel,
                   k.addOffset(panelAt, fullK * rows), panelStride, rows,
                   Value(), rows, kTilesPerMatmul, moved,
                   tailK / kTilesPerMatmul);
  else if (tailK)
    k.dma(viewMoving(lhs, k.addOffset(rows0, fullK * kTile * aCol),
                     {tailK, rows}, {aCol, aRow}, 1, moved),
          viewMoving(panel, k.addOffset(panelAt, fullK * rows), {tailK, rows},
                     {panelStride, 1}, 1, moved));
  if (bPending) {
    loadAllB(*bPending);
    bPending.reset();
  }
}

void GemmLowering::loadPanelTiles(Value src, Value panel, Value at,
                                  int64_t stride, int64_t rows, Value r0,
                                  int64_t count, int64_t tiles, Value moved,
                                  std::optional<int64_t> partitions) {
  int64_t r = kTilesPerMatmul, kt = partitions.value_or(kTile);
  int64_t grouped = r > 1 ? tiles / r * r : 0;
  // Column of row r0 in a panel `offset` columns past `at`.
  auto column = [&](int64_t offset, int64_t rowColumns) {
    Value c = k.addOffset(at, offset);
    return r0 ? k.addOffsets(c, k.scale(r0, rowColumns)) : c;
  };
  if (int64_t groups = grouped / r) {
    Value dst = column(0, interleaveA ? r : 1);
    if (interleaveA)
      k.dma(viewMoving(lhs, src, {kt, groups, count, r},
                       {r * aCol, kTile * r * aCol, aRow, aCol}, 2, moved),
            viewMoving(panel, dst, {kt, groups, count, r},
                       {stride, r * rows, r, 1}, 2, moved));
    else
      k.dma(viewMoving(lhs, src, {kt, groups, r, count},
                       {r * aCol, kTile * r * aCol, aCol, aRow}, 3, moved),
            viewMoving(panel, dst, {kt, groups, r, count},
                       {stride, r * rows, rows, 1}, 3, moved));
  }
  if (int64_t single = tiles - grouped)
    k.dma(viewMoving(lhs, k.addOffset(src, grouped * kTile * aCol),
                     {kTile, single, count}, {aCol, kTile * aCol, aRow}, 2,
                     moved),
          viewMoving(panel, column(grouped * rows, 1), {kTile, single, count},
                     {stride, rows, 1}, 2, moved));
}

Value GemmLowering::viewMoving(Value base, Value at, ArrayRef<int64_t> shape,
                               ArrayRef<int64_t> strides, size_t rowsDim,
                               Value moved) {
  if (!moved)
    return k.view(base, at, shape, strides);
  SmallVector<OpFoldResult> sizes;
  for (int64_t s : shape)
    sizes.push_back(k.b.getIndexAttr(s));
  sizes[rowsDim] = moved;
  return k.view(base, at, sizes, strides);
}

int64_t GemmLowering::panelChunk() const {
  int64_t groups = n / nGroup;
  if (groups < 2 || tailK || kTiles % groups)
    return 0;
  int64_t chunk = kTiles / groups;
  return chunk % kTilesPerMatmul ? 0 : chunk;
}

int64_t GemmLowering::panelRowPieces() const {
  int64_t groups = n / nGroup;
  return groups >= 2 && !tailK && mBlock % groups == 0 ? groups : 1;
}

void GemmLowering::lowerBatchDynamic(const Bases &base) {
  auto &b = k.b;
  TileBuilder::TileScope scope(k);
  if (residentB) {
    bAll = k.tile(MemorySpace::sbuf, {kRows, kTiles * n}, rhsElt);
    loadAllB(base);
  }
  Value fullBlocks = b.create<arith::FloorDivSIOp>(mRows, k.index(mBlock));
  lowerFullBlocksDynamic(base, fullBlocks);
  Value rest = b.create<arith::RemSIOp>(mRows, k.index(mBlock));
  Value restTiles = b.create<arith::CeilDivSIOp>(rest, k.index(mTile));
  Value m0 = k.scale(fullBlocks, mBlock);
  // One block shape per tile count of the rest, each run when the rest
  // has that many tiles: a loop of one iteration or none.
  for (int64_t t = 1; t <= mTiles; ++t) {
    auto atLeast = [&](int64_t c) -> Value {
      return b.create<arith::MinSIOp>(
          b.create<arith::MaxSIOp>(
              b.create<arith::SubIOp>(restTiles, k.index(c - 1)), k.index(0)),
          k.index(1));
    };
    Value once = b.create<arith::SubIOp>(atLeast(t), atLeast(t + 1));
    k.forEachDynamic(once, [&](Value) {
      TileBuilder::TileScope panels(k);
      int64_t rows = t * mTile;
      Value buffer = k.tile(MemorySpace::sbuf, {kRows, kTiles * rows}, inElt);
      loadPanel(base, m0, rows, buffer, k.index(0), kTiles * rows, rest);
      lastRows = b.create<arith::SubIOp>(rest, k.index((t - 1) * mTile));
      lowerBlock(base, m0, rows, {buffer, k.index(0), kTiles * rows},
                 std::nullopt, 1);
      lastRows = {};
    });
  }
}

void GemmLowering::lowerFullBlocksDynamic(const Bases &base, Value fullBlocks) {
  auto &b = k.b;
  TileBuilder::TileScope panels(k);
  // As lowerFullBlocks with two panel slots: pairs of blocks in a loop
  // (constant slots), the one left, then the last block, whose slot is
  // known at run time.
  int64_t panelCols = kTiles * mBlock, stride = 2 * panelCols;
  Value buffer = k.tile(MemorySpace::sbuf, {kRows, stride}, inElt);
  k.ifMore(fullBlocks, 0, [&] {
    loadPanel(base, k.index(0), mBlock, buffer, k.index(0), stride);
  });
  int64_t chunk = panelChunk();
  bool chunked = chunk > 0;
  auto block = [&](Value i, int64_t slot) {
    lowerBlock(base, k.scale(i, mBlock), mBlock,
               {buffer, k.index(slot * panelCols), stride},
               NextPanel{i, slot, buffer, 2, panelCols, stride, chunked, chunk,
                         panelRowPieces()},
               chunked ? mBlock : 1);
  };
  Value steady = b.create<arith::MaxSIOp>(
      b.create<arith::SubIOp>(fullBlocks, k.index(1)), k.index(0));
  Value pairs = b.create<arith::FloorDivSIOp>(steady, k.index(2));
  k.forEachDynamic(pairs, [&](Value p) {
    block(k.scale(p, 2), 0);
    block(k.addOffset(k.scale(p, 2), 1), 1);
  });
  Value done = k.scale(pairs, 2);
  k.ifMore(b.create<arith::SubIOp>(steady, done), 0, [&] { block(done, 0); });
  k.ifMore(fullBlocks, 0, [&] {
    Value last = b.create<arith::SubIOp>(fullBlocks, k.index(1));
    Value at = k.scale(b.create<arith::RemSIOp>(last, k.index(2)), panelCols);
    lowerBlock(base, k.scale(last, mBlock), mBlock, {buffer, at, stride},
               std::nullopt, 1);
  });
}

void GemmLowering::lowerFullBlocks(const Bases &base, int64_t fullBlocks) {
  TileBuilder::TileScope panels(k);
  // The panel of the next M block loads while this block computes: full
  // blocks alternate between two panel slots.
  int64_t panelSlots = std::min<int64_t>(fullBlocks, 2);
  int64_t panelCols = kTiles * mBlock;
  Value buffer =
      k.tile(MemorySpace::sbuf, {kRows, panelSlots * panelCols}, inElt);
  auto at = [&](int64_t slot) { return k.index(slot * panelCols); };
  int64_t stride = panelSlots * panelCols;
  Value firstBlock = k.index(0);
  loadPanel(base, k.scale(firstBlock, mBlock), mBlock, buffer, at(0), stride);
  // Spread over the N groups, a K chunk per group, when they divide K
  // evenly: the DMA engines then never serve a whole panel at once.
  int64_t chunk = panelChunk();
  bool chunked = chunk > 0;
  k.forEachRotating(0, fullBlocks - 1, panelSlots, [&](Value i, int64_t slot) {
    lowerBlock(base, k.scale(i, mBlock), mBlock, {buffer, at(slot), stride},
               NextPanel{i, slot, buffer, panelSlots, panelCols, stride,
                         chunked, chunk, panelRowPieces()},
               chunked ? mBlock : 1);
  });
  int64_t last = fullBlocks - 1;
  lowerBlock(base, k.index(last * mBlock), mBlock,
             {buffer, at(last % panelSlots), stride}, std::nullopt, 1);
}

void GemmLowering::prefetch(const Bases &base, const Block &blk, Value g,
                            bool first, Value piece, int64_t pieces) {
  if (!blk.next)
    return;
  const NextPanel &next = *blk.next;
  Value m0 = k.scale(k.addOffset(next.block, 1), mBlock);
  int64_t slot = (next.slot + 1) % next.slots;
  auto at = [&] { return k.index(slot * next.cols); };
  if (!next.chunked && next.rowPieces > 1) {
    int64_t rows = mBlock / next.rowPieces;
    Value r0 = k.scale(g, rows);
    loadPanelTiles(k.addOffsets(base.lhs, k.scale(k.addOffsets(m0, r0), aRow)),
                   next.buffer, at(), next.stride, mBlock, r0, rows, fullK,
                   Value());
    return;
  }
  if (!next.chunked) {
    if (first)
      loadPanel(base, m0, mBlock, next.buffer, at(), next.stride);
    return;
  }
  int64_t rows = mBlock / pieces;
  Value r0 = k.scale(piece, rows);
  Value src =
      k.addOffsets(k.addOffsets(base.lhs, k.scale(k.addOffsets(m0, r0), aRow)),
                   k.scale(g, next.chunk * kTile * aCol));
  loadPanelTiles(src, next.buffer,
                 k.addOffsets(at(), k.scale(g, next.chunk * mBlock)),
                 next.stride, mBlock, r0, rows, next.chunk, Value());
}

int64_t GemmLowering::bSlotsFor(int64_t blockTiles) const {
  // Times by the cost model: a B tile is kRows descriptors of a row of the
  // group (a transposed B, a transposing DMA) over the DMA engines; a step,
  // a matmul per M tile and N tile.
  const ::neuron::target::CostModel costModel(k.target);
  double loadBytes = double(kRows * nGroup * eltBytes);
  double loadNs =
      (bCol == 1 ? costModel.dmaTransferNs(loadBytes, double(nGroup * eltBytes),
                                           double(kRows))
                 : loadBytes / costModel.dmaTransposeBytesPerNs(false)) /
      k.target.dmaEngines;
  double stepNs =
      blockTiles * nTiles *
      costModel.cyclesToNs(
          ::neuron::runtime::Engine::Tensor,
          costModel.matmulCycles(double(mTile), double(nTile), inElt.isF32())) /
      kTilesPerMatmul;
  // At each N group's end its stores (a tile's rows per M tile) enter the
  // DMA queues ahead of the next group's first B loads: enough more slots
  // that the loads already in flight cover them.
  int64_t outBytes = std::max<int64_t>(1, outType.getElementTypeBitWidth() / 8);
  double storeNs =
      blockTiles *
      costModel.dmaTransferNs(double(mTile * nGroup * outBytes),
                              double(nGroup * outBytes), double(mTile)) /
      k.target.dmaEngines;
  // (No more than a group has K steps: it would not load further ahead.)
  int64_t base = k.streamSlots(loadNs, stepNs);
  int64_t need = std::max(
      base, std::min(kTiles, base + (int64_t)std::ceil(storeNs /
                                                       std::max(stepNs, 1.0))));
  // Whole groups of double_row tiles in each round of slots; slots that
  // divide the K steps rotate the same way in every group, so a group's
  // first loads never wait on a slot the last group still reads.
  int64_t r = kTilesPerMatmul;
  auto whole = [&](int64_t slots) { return (slots + r - 1) / r * r; };
  for (int64_t slots = whole(need); slots <= std::min(2 * need, fullK);
       slots += r)
    if (fullK % slots == 0)
      return slots;
  return whole(need);
}

int64_t GemmLowering::tilesAt(int64_t i, int64_t count) const {
  int64_t r = kTilesPerMatmul;
  if (i / r * r + r > count)
    return 1;
  return i % r == r - 1 ? r : 0;
}

void GemmLowering::lowerBlock(const Bases &base, Value m0, int64_t rows,
                              const Panel &panel, std::optional<NextPanel> next,
                              int64_t maxPieces) {
  TileBuilder::TileScope blockScope(k);
  Block blk{m0, rows, (rows + mTile - 1) / mTile, panel, next, maxPieces};
  blk.bAhead = !residentB && n > nGroup && stepsPerGroup() <= kAheadSteps &&
               kTilesPerMatmul == 1 && !blockScales;
  blk.bSlots = blk.bAhead ? 2 * stepsPerGroup() : bSlotsFor(blk.tiles);
  if (!residentB)
    blk.moving =
        k.tile(MemorySpace::sbuf, {kRows, blk.bSlots * nGroup}, rhsElt);
  blk.acc = k.tile(MemorySpace::psum, {mTile, 2 * accsPerSet * nTile}, f32);
  blk.staged =
      k.tile(MemorySpace::sbuf, {mTile, 2 * blk.tiles * nGroup}, outElt);
  if (epilogue) {
    if (epilogue->rowScale.buffer)
      blk.rowScales = k.tile(MemorySpace::sbuf, {mTile, blk.tiles}, f32);
    if (epilogue->rowShift.buffer)
      blk.rowShifts = k.tile(MemorySpace::sbuf, {mTile, blk.tiles}, f32);
    if (epilogue->colwise)
      blk.colScales = k.tile(MemorySpace::sbuf, {mTile, 2 * nGroup}, f32);
    if (epilogue->bias.buffer && !residentBias)
      blk.bias =
          k.tile(MemorySpace::sbuf, {mTile, 2 * nGroup}, epilogue->biasElt);
    if ((epilogue->colwise || epilogue->act) && epilogue->bias.buffer)
      blk.scaled = k.tile(MemorySpace::sbuf, {mTile, nTile}, f32);
    if (epilogue->scaled)
      loadRowScales(blk);
    if (epilogue->rowAffine())
      loadRowAffine(blk);
  }
  int64_t groups = n / nGroup;
  if (blk.bAhead) {
    // Group i loads group i + 1's B: the last full group the remainder's,
    // so it leaves the loop.
    int64_t rest = n % nGroup;
    auto colsOf = [&](int64_t g) { return g < groups ? nGroup : rest; };
    loadGroupB(base, blk,
               Group{k.index(0), k.index(0), 0, colsOf(0),
                     (colsOf(0) + nTile - 1) / nTile});
    int64_t total = groups + (rest > 0);
    lowerGroup(base, blk, k.index(0), 0, colsOf(0), true, true, colsOf(1));
    k.forEachRotating(1, std::max<int64_t>(groups - 2, 0), 2,
                      [&](Value g, int64_t set) {
                        lowerGroup(base, blk, g, set, nGroup, false, true,
                                   nGroup);
                      });
    for (int64_t g = std::max<int64_t>(groups - 1, 1); g < total; ++g)
      lowerGroup(base, blk, k.index(g), g % 2, colsOf(g), false, g < groups,
                 g + 1 < total ? colsOf(g + 1) : 0);
    return;
  }
  if (groups > 0)
    lowerGroup(base, blk, k.index(0), 0, nGroup, true, true);
  else
    prefetch(base, blk, k.index(0), true, k.index(0), 1);
  k.forEachRotating(1, std::max<int64_t>(groups - 1, 0), 2,
                    [&](Value g, int64_t set) {
                      lowerGroup(base, blk, g, set, nGroup, false, true);
                    });
  if (n % nGroup)
    lowerGroup(base, blk, k.index(groups), groups % 2, n % nGroup, false,
               false);
}

Value GemmLowering::bank(const Block &blk, const Group &grp, int64_t mi,
                         int64_t ni, int64_t rows, int64_t width) {
  int64_t col = (grp.set * accsPerSet + mi * grp.tiles + ni) * nTile;
  return k.view(blk.acc, k.index(col), {rows, width},
                {2 * accsPerSet * nTile, 1});
}

void GemmLowering::lowerGroup(const Bases &base, const Block &blk, Value g,
                              int64_t set, int64_t cols, bool first,
                              bool prefetches, int64_t nextCols) {
  Group grp{g, k.scale(g, nGroup), set, cols, (cols + nTile - 1) / nTile};
  if (epilogue)
    loadColumnOperands(blk, grp);
  if (blk.bAhead) {
    if (nextCols) {
      Value next = k.addOffset(g, 1);
      loadGroupB(base, blk,
                 Group{next, k.scale(next, nGroup), 1 - set, nextCols,
                       (nextCols + nTile - 1) / nTile});
    }
    int64_t slot0 = set * stepsPerGroup();
    for (int64_t s = 0; s < fullK; ++s)
      kStep(base, blk, grp, k.index(s), slot0 + s, kTile, s == 0, 1,
            /*load=*/false);
    if (prefetches)
      prefetch(base, blk, grp.g, first, k.index(0), 1);
    if (tailK)
      kStep(base, blk, grp, k.index(fullK), slot0 + fullK, tailK, fullK == 0,
            1, /*load=*/false);
    evictGroup(base, blk, grp);
    return;
  }
  fullKSteps(base, blk, grp, first, prefetches);
  // The tail: a double_row group's last step, or a partial tile.
  int64_t r = tailGrouped ? kTilesPerMatmul : 1;
  if (tailK)
    kStep(base, blk, grp, k.index(fullK + r - 1), fullK % blk.bSlots + r - 1,
          tailK / r, fullK == 0, r);
  evictGroup(base, blk, grp);
}

void GemmLowering::loadGroupB(const Bases &base, const Block &blk,
                              const Group &grp) {
  int64_t slot0 = grp.set * stepsPerGroup();
  for (int64_t s = 0; s < stepsPerGroup(); ++s)
    loadB(base, blk, grp, k.index(s), slot0 + s, s < fullK ? kTile : tailK, 1);
}

void GemmLowering::loadB(const Bases &base, const Block &blk,
                         const Group &grp, Value kFirst, int64_t slot0,
                         int64_t kt, int64_t tilesPerMatmul) {
  int64_t r = tilesPerMatmul;
  bool doubleRow = r > 1;
  int64_t slotStride = blk.bSlots * nGroup;
  Value src =
      k.addOffsets(k.addOffsets(base.rhs, k.scale(kFirst, kTile * bRow)),
                   k.scale(grp.n0, bCol));
  // [k in tile, column], or a group's [k in tile, column, row in group]
  // (interleaved) or [k in tile, row in group, column].
  SmallVector<int64_t> shape{kt, grp.cols}, srcStrides{bRow, bCol},
      dstStrides{slotStride, 1};
  if (doubleRow && interleaveB) {
    shape = {kt, grp.cols, r};
    srcStrides = {r * bRow, bCol, bRow};
    dstStrides = {slotStride, r, 1};
  } else if (doubleRow) {
    shape = {kt, r, grp.cols};
    srcStrides = {r * bRow, bRow, bCol};
    dstStrides = {slotStride, nGroup, 1};
  }
  Value bTiles = k.view(blk.moving, k.index(slot0 * nGroup), shape, dstStrides);
  k.dma(k.view(rhs, src, shape, srcStrides), bTiles);
}

void GemmLowering::kStep(const Bases &base, const Block &blk, const Group &grp,
                         Value kIdx, int64_t slot, int64_t kt, bool first,
                         int64_t tilesPerMatmul, bool load) {
  // A double_row group's tiles load with its last step, into its slots.
  if (tilesPerMatmul == 0)
    return;
  // The matmul's first K tile and its slot.
  int64_t r = tilesPerMatmul, back = r - 1;
  Value kFirst = k.addOffset(kIdx, -back);
  int64_t slot0 = slot - back;
  bool doubleRow = r > 1;
  int64_t slotStride = blk.bSlots * nGroup;
  if (load && !residentB)
    loadB(base, blk, grp, kFirst, slot0, kt, r);
  // [K, free] or double_row's [K, R, free]: row r of a group a tile's
  // columns (`tileCols`) apart, or interleaved.
  auto operand = [&](Value buffer, Value at, int64_t free, int64_t tileCols,
                     bool interleaved, int64_t partitionStride) {
    if (!doubleRow)
      return k.view(buffer, at, {kt, free}, {partitionStride, 1});
    if (interleaved)
      return k.view(buffer, at, {kt, r, free}, {partitionStride, 1, r});
    return k.view(buffer, at, {kt, r, free}, {partitionStride, tileCols, 1});
  };
  int64_t aStep = doubleRow && interleaveA ? r : 1;
  int64_t bStep = doubleRow && interleaveB ? r : 1;
  for (int64_t mi = 0; mi < blk.tiles; ++mi) {
    int64_t mt = std::min(mTile, blk.rows - mi * mTile);
    Value stationary = operand(
        blk.panel.buffer,
        k.addOffsets(blk.panel.at, k.addOffset(k.scale(kFirst, blk.rows),
                                               mi * mTile * aStep)),
        mt, blk.rows, interleaveA, blk.panel.stride);
    for (int64_t ni = 0; ni < grp.tiles; ++ni) {
      int64_t nt = std::min(nTile, grp.cols - ni * nTile);
      Value mov = residentB
                      ? k.view(bAll,
                               k.addOffsets(k.scale(kFirst, n),
                                            k.addOffset(grp.n0, ni * nTile)),
                               {kt, nt}, {kTiles * n, 1})
                      : operand(blk.moving,
                                k.index(slot0 * nGroup + ni * nTile * bStep),
                                nt, nGroup, interleaveB, slotStride);
      Value statScale, movScale;
      if (blockScales) {
        statScale = scaleView(scalesA, scaleColsA, kFirst,
                              k.addOffset(blk.m0, mi * mTile), kt, mt);
        movScale = scaleView(scalesB, scaleColsB, kFirst,
                             k.addOffset(grp.n0, ni * nTile), kt, nt);
      }
      auto mm = k.b.create<nisa::MatmulOp>(
          stationary, mov, bank(blk, grp, mi, ni, mt, nt), statScale, movScale);
      if (!first)
        mm.setAccumulate(true);
      if (doubleRow && !blockScales)
        mm.setDoubleRow(true);
    }
  }
}

void GemmLowering::fullKSteps(const Bases &base, const Block &blk,
                              const Group &grp, bool first, bool prefetches) {
  int64_t bSlots = blk.bSlots;
  // Full k steps in rounds of bSlots (static slots): round 0 peeled (its
  // first step starts the sums), the others in one loop; round r loads
  // piece r of the next panel while there are pieces.
  int64_t rounds = fullK / bSlots;
  int64_t pieces = std::min(blk.maxPieces, rounds);
  while (pieces > 1 && (!llvm::isPowerOf2_64(pieces) || blk.rows % pieces))
    --pieces;
  // A step's matmul starts the sums when its first tile is tile 0.
  auto round = [&](Value r, bool firstRound) {
    for (int64_t i = 0; i < bSlots; ++i) {
      int64_t tiles = tilesAt(i, bSlots);
      kStep(base, blk, grp, k.addOffset(k.scale(r, bSlots), i), i, kTile,
            firstRound && i + 1 == tiles, tiles);
    }
    if (prefetches && pieces > 1)
      prefetch(base, blk, grp.g, first, r, pieces);
  };
  // Unrolled when the MX scales' partitions follow K (unrolledK).
  auto forEachRound = [&](int64_t count, llvm::function_ref<void(Value)> body) {
    if (!unrolledK())
      return k.forEach(count, body);
    for (int64_t r = 0; r < count; ++r)
      body(k.index(r));
  };
  if (rounds > 0)
    round(k.index(0), true);
  if (prefetches && pieces <= 1)
    prefetch(base, blk, grp.g, first, k.index(0), 1);
  forEachRound(std::max<int64_t>(pieces, 1) - 1,
               [&](Value r) { round(k.addOffset(r, 1), false); });
  int64_t spread = std::max<int64_t>(pieces, 1);
  forEachRound(rounds - spread, [&](Value r) {
    for (int64_t i = 0; i < bSlots; ++i)
      kStep(base, blk, grp,
            k.addOffset(k.scale(k.addOffset(r, spread), bSlots), i), i, kTile,
            false, tilesAt(i, bSlots));
  });
  for (int64_t s = rounds * bSlots; s < fullK; ++s) {
    int64_t tiles = tilesAt(s - rounds * bSlots, fullK - rounds * bSlots);
    kStep(base, blk, grp, k.index(s), s % bSlots, kTile, s + 1 == tiles, tiles);
  }
}

void GemmLowering::evictGroup(const Bases &base, const Block &blk,
                              const Group &grp) {
  for (int64_t mi = 0; mi < blk.tiles; ++mi) {
    int64_t mt = std::min(mTile, blk.rows - mi * mTile);
    Value stage =
        k.view(blk.staged, k.index((grp.set * blk.tiles + mi) * nGroup),
               {mt, grp.cols}, {2 * blk.tiles * nGroup, 1});
    for (int64_t ni = 0; ni < grp.tiles; ++ni) {
      int64_t nt = std::min(nTile, grp.cols - ni * nTile);
      Value part = k.view(
          blk.staged, k.index((grp.set * blk.tiles + mi) * nGroup + ni * nTile),
          {mt, nt}, {2 * blk.tiles * nGroup, 1});
      evictBank(blk, grp, mi, ni, mt, nt, part);
    }
    Value dst = k.addOffsets(
        k.addOffsets(base.out, k.scale(k.addOffset(blk.m0, mi * mTile), n)),
        grp.n0);
    Value dstView = k.view(out, dst, {mt, grp.cols}, {n, 1});
    if (lastRows && mi == blk.tiles - 1) {
      stage = k.withRows(stage, lastRows);
      dstView = k.withRows(dstView, lastRows);
    }
    // From ScalarE's queue: a store waits for its eviction, and on SyncE's
    // it would hold up the next group's B loads.
    k.b.create<nisa::DmaCopyOp>(stage, dstView, nisa::Engine::scalar);
  }
}

void GemmLowering::evictBank(const Block &blk, const Group &grp, int64_t mi,
                             int64_t ni, int64_t mt, int64_t nt, Value part) {
  Value acc = bank(blk, grp, mi, ni, mt, nt);
  // Banks alternate between VectorE and ScalarE where either can do it.
  bool onScalar = (mi * grp.tiles + ni) % 2;
  if (!epilogue) {
    k.b.create<nisa::CopyOp>(
        acc, part, onScalar ? nisa::Engine::scalar : nisa::Engine::vector);
    return;
  }
  auto columns = [&](Value tile) {
    return k.view(tile, k.index(grp.set * nGroup + ni * nTile), {mt, nt},
                  {2 * nGroup, 1});
  };
  auto clamp = [&] {
    if (epilogue->clampMax)
      k.b.create<nisa::TensorScalarOp>(nisa::AluOp::min, part, part, Value(),
                                       APFloat(*epilogue->clampMax), false,
                                       nisa::Engine::gpsimd);
  };
  if (epilogue->rowAffine()) {
    // A channel's scale and shift are a row's: ScalarE's scale and bias
    // columns, with the activation, in one pass from PSUM.
    auto col = [&](Value tile) {
      return tile ? k.view(tile, k.index(mi), {mt, 1}, {blk.tiles, 1})
                  : Value();
    };
    k.b.create<nisa::ActivationOp>(
        acc, part, col(blk.rowShifts), col(blk.rowScales), Value(),
        epilogue->act.value_or(nisa::ActivationFn::identity), APFloat(1.0),
        APFloat(0.0));
    clamp();
    return;
  }
  if (!epilogue->scaled) {
    // A Linear's bias (VectorE: ScalarE's bias is a column, this a row),
    // then its activation (ScalarE), both on the fp32 sums.
    Value sums = acc;
    if (epilogue->bias.buffer) {
      sums = epilogue->act
                 ? k.view(blk.scaled, k.index(0), {mt, nt}, {nTile, 1})
                 : part;
      Value bias = residentBias
                       ? k.view(residentBias, k.addOffset(grp.n0, ni * nTile),
                                {mt, nt}, {n, 1})
                       : columns(blk.bias);
      k.b.create<nisa::TensorTensorOp>(nisa::AluOp::add, acc, bias, sums,
                                       nisa::Engine::vector);
    }
    if (epilogue->act)
      k.b.create<nisa::ActivationOp>(sums, part, Value(), *epilogue->act,
                                     APFloat(1.0), APFloat(0.0));
    else if (!epilogue->bias.buffer)
      k.b.create<nisa::CopyOp>(acc, part, nisa::Engine::vector);
    clamp();
    return;
  }
  Value rowScale = k.view(blk.rowScales, k.index(mi), {mt, 1}, {blk.tiles, 1});
  if (!blk.colScales && !blk.bias) {
    if (onScalar)
      k.b.create<nisa::ActivationOp>(acc, part, Value(), rowScale, Value(),
                                     nisa::ActivationFn::identity, APFloat(1.0),
                                     APFloat(0.0));
    else
      k.b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, acc, part,
                                       rowScale, APFloat(0.0), false,
                                       nisa::Engine::vector);
    return;
  }
  // (acc * row scale) * column scales, or + bias; both: the scaled sums in
  // fp32, then the bias on GpSimd (SBUF only), off VectorE's queue.
  Value scaledDst =
      blk.scaled ? k.view(blk.scaled, k.index(0), {mt, nt}, {nTile, 1}) : part;
  k.b.create<nisa::ScalarTensorTensorOp>(
      nisa::AluOp::multiply,
      blk.colScales ? nisa::AluOp::multiply : nisa::AluOp::add, acc,
      columns(blk.colScales ? blk.colScales : blk.bias), scaledDst, rowScale,
      APFloat(0.0), nisa::Engine::vector);
  if (blk.scaled)
    k.b.create<nisa::TensorTensorOp>(nisa::AluOp::add, scaledDst,
                                     columns(blk.bias), part,
                                     nisa::Engine::gpsimd);
}

void GemmLowering::loadRowScales(const Block &blk) {
  const Epilogue &ep = *epilogue;
  // [rows, 1] of a vector from element `at`; a one-element vector is
  // broadcast (stride 0) over the rows.
  auto column = [&](const TileBuilder::Window &w, bool whole, Value at,
                    int64_t rows) {
    if (!whole)
      return k.view(w.buffer, k.index(w.offset), {rows, 1}, {0, 1});
    return k.view(w.buffer, k.addOffset(k.scale(at, w.strides[0]), w.offset),
                  {rows, 1}, {w.strides[0], 1});
  };
  Value single;
  if (!ep.colwise)
    single = k.tile(MemorySpace::sbuf, {mTile, 1}, f32);
  for (int64_t mi = 0; mi < blk.tiles; ++mi) {
    int64_t mt = std::min(mTile, blk.rows - mi * mTile);
    Value col = k.view(blk.rowScales, k.index(mi), {mt, 1}, {blk.tiles, 1});
    k.dma(column(ep.rowScale, ep.rowwise, k.addOffset(blk.m0, mi * mTile), mt),
          col);
    if (ep.colwise)
      continue;
    // A tensorwise column scale folds into the row scales.
    Value one = k.view(single, k.index(0), {mt, 1}, {1, 1});
    k.dma(column(ep.colScale, false, Value(), mt), one);
    k.b.create<nisa::TensorTensorOp>(nisa::AluOp::multiply, col, one, col,
                                     nisa::Engine::vector);
  }
}

/// A row affine's [M] scales and shifts, a column per M tile of the block.
void GemmLowering::loadRowAffine(const Block &blk) {
  const Epilogue &ep = *epilogue;
  for (auto [w, tile] : {std::pair{ep.rowScale, blk.rowScales},
                         std::pair{ep.rowShift, blk.rowShifts}}) {
    if (!tile)
      continue;
    for (int64_t mi = 0; mi < blk.tiles; ++mi) {
      int64_t mt = std::min(mTile, blk.rows - mi * mTile);
      Value at = k.addOffset(
          k.scale(k.addOffset(blk.m0, mi * mTile), w.strides[0]), w.offset);
      k.dma(k.view(w.buffer, at, {mt, 1}, {w.strides[0], 1}),
            k.view(tile, k.index(mi), {mt, 1}, {blk.tiles, 1}));
    }
  }
}

void GemmLowering::loadColumnOperands(const Block &blk, const Group &grp) {
  const Epilogue &ep = *epilogue;
  auto load = [&](const TileBuilder::Window &w, Value tile) {
    // The group's columns, the same row on every partition.
    Value src =
        k.view(w.buffer, k.addOffset(k.scale(grp.n0, w.strides[0]), w.offset),
               {mTile, grp.cols}, {0, w.strides[0]});
    k.dma(src, k.view(tile, k.index(grp.set * nGroup), {mTile, grp.cols},
                      {2 * nGroup, 1}));
  };
  if (blk.colScales)
    load(ep.colScale, blk.colScales);
  if (blk.bias)
    load(ep.bias, blk.bias);
}

/// A neuron.matmul's epilogue (bias or row affine, activation, clamp),
/// applied as the sums leave PSUM.
static std::optional<GemmLowering::Epilogue> linearEpilogue(MatmulOp op,
                                                            TileBuilder &k) {
  if (!op.getBias() && !op.getEpilogue() && !op.getRowScale() &&
      !op.getRowShift() && !op.getClampMax())
    return std::nullopt;
  GemmLowering::Epilogue ep;
  ep.scaled = false;
  if (op.getBias()) {
    ep.bias = k.windowOf(op.getBias());
    ep.biasElt = tensorType(op.getBias()).getElementType();
  }
  if (Value v = op.getRowScale())
    ep.rowScale = k.windowOf(v);
  if (Value v = op.getRowShift())
    ep.rowShift = k.windowOf(v);
  if (std::optional<UnaryFn> fn = op.getEpilogue())
    ep.act = activationFor(*fn);
  if (std::optional<APFloat> c = op.getClampMax())
    ep.clampMax = c->convertToDouble();
  return ep;
}

struct MatmulPattern : OpTilePattern<MatmulPattern, MatmulOp> {
  bool isSizeGeneric(Operation *) const override { return true; }
  LogicalResult lowerOp(MatmulOp op, KernelLowering &k) const {
    if (tensorType(op.getLhs()).getShape().back() == 0)
      return op->emitOpError("has an empty contraction (the importer folds "
                             "it to zeros)");
    RankedTensorType lhsType = tensorType(op.getLhs());
    if (lhsType.hasStaticShape() && tensorType(op.getRhs()).hasStaticShape()) {
      k.lowerMatmul(op);
      return success();
    }
    // Size-generic: only M (the lhs's rows) known at run time.
    int64_t rank = lhsType.getRank();
    auto refuse = [&](const Twine &why) {
      return emitError(op->getLoc())
             << "not size-generic: " << op->getName() << ": " << why << " ("
             << op.getLhs().getType() << " x " << op.getRhs().getType() << ")";
    };
    for (int64_t d = 0; d < rank - 2; ++d)
      if (lhsType.isDynamicDim(d) || tensorType(op.getRhs()).isDynamicDim(d))
        return refuse("a batch dim known only at run time");
    if (!tensorType(op.getRhs()).hasStaticShape() ||
        lhsType.isDynamicDim(rank - 1))
      return refuse("K or N known only at run time");
    if (rank > 2)
      return refuse("batch dims with rows known only at run time");
    // A view of the rows (a transposed activation) would have strides
    // that depend on them.
    if (k.windowOf(op.getLhs()).strides !=
        SmallVector<int64_t>{lhsType.getDimSize(1), 1})
      return refuse("the rows are a strided view");
    Value rows = k.dimOf(op.getLhs(), rank - 2);
    if (!rows || !k.dimOf(op.getResult(), rank - 2))
      return refuse("the row count is not known");
    GemmLowering(k, op.getLhs(), op.getRhs(), op.getResult(), rows,
                 linearEpilogue(op, k))
        .lower();
    return success();
  }
};

/// neuron.grouped_matmul with each group's rows and weights resident in SBUF:
/// the group's x^T, [K in tile, K tile, row], by one DMA transpose of its rows,
/// and its weights, [K in tile, K tile, column], in panels of up to a PSUM bank
/// set's columns (by DMA transposes when they are a transposed [G, N, K], as
/// Transformers keeps its experts'). K tile kt holds K row p * kTiles + kt on
/// partition p (any order of K sums the same products): a partition's rows of
/// several K tiles are one run of a row-major panel, so weights load in runs
/// long enough to hide the DMA's per-descriptor cost. The next group's rows
/// load while this group computes, and the weights up to two panels ahead
/// (nothing for an empty group). Each panel goes over the group's rows in
/// 128-row tiles counted at run time, its short last tile first (it stores only
/// its rows; the compute runs on the whole tile): per 512-column PSUM bank the
/// K tiles accumulated with the tile stationary, evicted by VectorE and ScalarE
/// in turn, and the tile's panel stored whole. Each group reads its weights
/// once, where the blocked GEMM streams them once per 512 rows, in runs of 512
/// columns. Where two tiles of all m rows do not fit (an MoE layer's routed
/// rows), a group's rows tile holds a chunk of them: a larger group goes
/// through its rows a chunk at a time under each panel of its weights.
class GroupedGemm {
public:
  GroupedGemm(KernelLowering &k, GroupedMatmulOp op)
      : k(k), a(k.windowOf(op.getLhs())), w(k.windowOf(op.getRhs())),
        out(k.resultBuffer(op.getResult())), ends(op.getEnds()) {
    auto lhsType = tensorType(op.getLhs());
    m = lhsType.getDimSize(0);
    n = tensorType(op.getRhs()).getDimSize(2);
    inElt = lhsType.getElementType();
    outElt = tensorType(op.getResult()).getElementType();
    Shape shape = shapeOf(k, op);
    kTile = shape.kTile;
    kTiles = shape.kTiles;
    tileRows = shape.tileRows;
    slotRows = shape.slotRows;
    bankCols = shape.bankCols;
    panelBanks = shape.panelBanks;
    panelCols = shape.panelCols;
    weightSlots = shape.weightSlots;
    panels = (n + panelCols - 1) / panelCols;
  }

  /// Whether two groups' rows (or chunks of them) and two panels' weights
  /// fit in SBUF (with the staging) and K is whole tiles; the blocked GEMM
  /// takes the others.
  static bool applies(KernelLowering &k, GroupedMatmulOp op) {
    auto lhsType = tensorType(op.getLhs());
    Shape shape = shapeOf(k, op);
    // Weights in rows of columns, or of K (loaded by DMA transposes).
    ArrayRef<int64_t> strides = k.windowOf(op.getRhs()).strides;
    return lhsType.getDimSize(1) % shape.kTile == 0 && shape.weightSlots &&
           (strides[2] == 1 || strides[1] == 1);
  }

  void lower() {
    auto &b = k.b;
    TileBuilder::TileScope scope(k);
    weights = k.tile(MemorySpace::sbuf,
                     {kTile, weightSlots * kTiles * panelCols}, inElt);
    // Two tiles, not two slots of one: a transfer of a run-time row count
    // may write anywhere in its tile as the synchronisation sees it.
    for (Value &t : rowsT)
      t = k.tile(MemorySpace::sbuf, {kTile, kTiles * slotRows}, inElt);
    acc = k.tile(MemorySpace::psum, {tileRows, 2 * panelBanks * bankCols},
                 b.getF32Type());
    staged =
        k.tile(MemorySpace::sbuf, {tileRows, kStageSlots * panelCols}, outElt);
    if (transposedTailRows(0)) {
      transT =
          k.tile(MemorySpace::sbuf, {tileRows, panelBanks * bankCols}, outElt);
      ident = k.identity(tileRows, outElt);
    }
    SmallVector<Value> starts{k.index(0)}, counts;
    for (Value end : ends) {
      counts.push_back(b.create<arith::SubIOp>(end, starts.back()));
      starts.push_back(end);
    }
    int64_t steps = (int64_t)ends.size() * panels;
    // Panel step s = group * panels + panel: its weights in slot s %
    // weightSlots, the group's rows in tile group % 2. The next group's rows
    // load before this group's last panel computes; a panel's weights,
    // weightSlots - 1 steps ahead, after it: the DMA queues serve transfers in
    // program order, and loads issued ahead of a panel's stores would hold
    // them up while the weights run further ahead.
    auto rowsOf = [&](int64_t g) {
      k.ifMore(counts[g], 0,
               [&] { loadRows(g, starts[g], firstChunk(counts[g])); });
    };
    auto weightsOf = [&](int64_t s) {
      if (s < steps)
        k.ifMore(counts[s / panels], 0, [&] { loadWeights(s); });
    };
    rowsOf(0);
    for (int64_t s = 0; s + 1 < weightSlots; ++s)
      weightsOf(s);
    for (int64_t s = 0; s < steps; ++s) {
      if ((s + 1) % panels == 0 && s + 1 < steps)
        rowsOf((s + 1) / panels);
      int64_t g = s / panels;
      if (!chunked()) {
        computeRows(s, starts[g], counts[g]);
      } else {
        // A group of more rows than its tile holds goes through them a
        // chunk at a time, its first chunk (loaded ahead) the short one:
        // then the rest are whole chunks, in a loop (a transfer's row count
        // is a size expression, not a loop's). A later panel needs the first
        // chunk again.
        Value rows = counts[g], chunk = k.index(slotRows);
        Value first = firstChunk(rows);
        Value wholeChunks = b.create<arith::FloorDivSIOp>(
            b.create<arith::SubIOp>(rows, first), chunk);
        if (s % panels)
          k.ifMore(wholeChunks, 0, [&] { loadRows(g, starts[g], first); });
        computeRows(s, starts[g], first);
        k.forEachDynamic(wholeChunks, [&](Value c) {
          Value start = k.addOffsets(k.addOffsets(starts[g], first),
                                     k.scale(c, slotRows));
          loadRows(g, start, chunk);
          computeRows(s, start, chunk);
        });
      }
      weightsOf(s + weightSlots - 1);
    }
    zeroRowsFrom(k, out, starts.back(), m, n, tileRows, outElt);
  }

private:
  /// Whether a group's rows may be more than its rows tile holds.
  bool chunked() const { return slotRows < m; }
  /// The rows of a group's first chunk: all of them, or those a whole
  /// number of chunks after it leave (1 to slotRows).
  Value firstChunk(Value rows) {
    if (!chunked())
      return rows;
    auto &b = k.b;
    Value before = b.create<arith::FloorDivSIOp>(
        b.create<arith::MaxSIOp>(k.addOffset(rows, -1), k.index(0)),
        k.index(slotRows));
    return b.create<arith::SubIOp>(rows, k.scale(before, slotRows));
  }

  /// Panel step s on `rows` rows from `start` (x^T of them in the group's
  /// rows tile from its column 0): the whole 128-row tiles, and the short
  /// last one first (it stores only its rows; the compute runs on the whole
  /// tile), transposed where that saves TensorE time.
  void computeRows(int64_t s, Value start, Value rows) {
    auto &b = k.b;
    Value full = b.create<arith::FloorDivSIOp>(rows, k.index(tileRows));
    Value tail = b.create<arith::RemSIOp>(rows, k.index(tileRows));
    // Where the tail computes transposed with the whole tile before it,
    // that tile leaves the whole ones and no tail is left alone (below 0).
    Value whole = full, alone = tail;
    if (int64_t most = mergedTailRows(s)) {
      auto atMostOne = [&](Value v) {
        return b.create<arith::MinSIOp>(b.create<arith::MaxSIOp>(v, k.index(0)),
                                        k.index(1));
      };
      Value fits = atMostOne(b.create<arith::SubIOp>(k.index(most + 1), tail));
      Value merged = b.create<arith::MinSIOp>(
          b.create<arith::MinSIOp>(atMostOne(tail), fits), atMostOne(full));
      whole = b.create<arith::SubIOp>(full, merged);
      alone = b.create<arith::SubIOp>(tail, k.scale(merged, tileRows));
      k.ifMore(merged, 0, [&] {
        computeTailTransposed(s, start, whole, k.addOffset(tail, tileRows),
                              kMergedBlocks);
      });
    }
    k.ifMore(alone, 0, [&] {
      int64_t most = transposedTailRows(s);
      if (!most)
        return computeTile(s, start, full, tail, kStageSlots - 1);
      k.ifMore(b.create<arith::SubIOp>(k.index(most + 1), tail), 0,
               [&] { computeTailTransposed(s, start, full, tail, 1); });
      k.ifMore(b.create<arith::SubIOp>(tail, k.index(most)), 0,
               [&] { computeTile(s, start, full, tail, kStageSlots - 1); });
    });
    k.forEachPipelinedDynamic(
        whole, kStageSlots - 1, [](Value, int64_t) {},
        [&](Value i, int64_t slot, Value) {
          computeTile(s, start, i, Value(), slot);
        });
  }

  /// Output staging slots: a tile's store has the lowest priority of the
  /// DMAs in flight (the next group's loads precede it in program order),
  /// so stores may trail the compute by a few tiles. The last is the short
  /// tile's; its PSUM slot is odd, so the first full tile's is free.
  static constexpr int64_t kStageSlots = 5;
  /// The tiles of rows a merged tail computes transposed: the last whole
  /// tile and the tail (staging slots kStageSlots - 2 and - 1).
  static constexpr int64_t kMergedBlocks = 2;
  /// The fewest rows of a chunk (a multiple of 128): smaller chunks would
  /// load a large group's rows again for each panel in little pieces; the
  /// blocked GEMM takes a shape whose chunks would be smaller (shapeOf).
  static constexpr int64_t kMinChunkRows = 512;

  struct Shape {
    int64_t kTile, kTiles, tileRows, slotRows, bankCols, panelBanks, panelCols;
    /// Panels of weights resident (0: two do not fit): three where they fit,
    /// so a large group's compute leaves the DMA two panels to load.
    int64_t weightSlots;
  };
  /// SBUF bytes per partition of lower()'s tiles: the weights' slots, two
  /// groups' rows, the staging, the transposed tails' block, identity and
  /// its iota, and the zeros of the rows after the last group.
  static int64_t sbufBytes(KernelLowering &k, const Shape &s, int64_t inBytes,
                           int64_t outBytes) {
    return (s.weightSlots * s.kTiles * s.panelCols +
            2 * s.kTiles * s.slotRows) *
               inBytes +
           (kStageSlots * s.panelCols + s.panelBanks * s.bankCols +
            s.tileRows) *
               outBytes +
           s.tileRows * 4 + k.tileBytes;
  }

  static Shape shapeOf(KernelLowering &k, GroupedMatmulOp op) {
    const auto &t = k.target;
    Shape s;
    s.kTile = t.matmulMaxK;
    s.kTiles = tensorType(op.getLhs()).getDimSize(1) / s.kTile;
    s.tileRows = t.matmulMaxStationaryFree;
    int64_t m = tensorType(op.getLhs()).getDimSize(0);
    int64_t allRows = (m + s.tileRows - 1) / s.tileRows * s.tileRows;
    s.bankCols = std::min(t.matmulMaxMovingFree, t.psumBankBytes / 4);
    s.panelBanks = std::max<int64_t>(1, t.psumBanks / 2);
    s.panelCols = std::min(tensorType(op.getRhs()).getDimSize(2),
                           s.panelBanks * s.bankCols);
    s.panelBanks = (s.panelCols + s.bankCols - 1) / s.bankCols;
    auto bytes = [](Value v) {
      return std::max<int64_t>(1, tensorType(v).getElementTypeBitWidth() / 8);
    };
    // A group's rows on chip at once: all m rows where they fit (with two
    // slots of weights if not three: a chunk loads ahead of its group only
    // when it is the group's first), else the most that do in whole tiles,
    // through which a larger group goes in chunks: at least kMinChunkRows
    // and a group's rows on average (groups of several chunks wait for each
    // chunk's load; the blocked GEMM hides its loads).
    auto fits = [&] {
      return sbufBytes(k, s, bytes(op.getLhs()), bytes(op.getResult())) <=
             t.sbufBytesPerPartition;
    };
    int64_t groups = tensorType(op.getRhs()).getDimSize(0);
    int64_t average = (m + groups - 1) / groups;
    int64_t least = std::max(kMinChunkRows, (average + s.tileRows - 1) /
                                                s.tileRows * s.tileRows);
    for (bool chunks : {false, true})
      for (s.weightSlots = 3; s.weightSlots >= 2; --s.weightSlots) {
        s.slotRows = allRows;
        while (chunks && s.slotRows > least && !fits())
          s.slotRows -= s.tileRows;
        if (fits())
          return s;
      }
    s.weightSlots = 0;
    return s;
  }

  int64_t cols(int64_t s) const {
    return std::min(panelCols, n - (s % panels) * panelCols);
  }

  /// Columns [col, col + width) of K tile kt of panel step s's weights,
  /// and of the `tiles` - 1 K tiles after it when `tiles` is set.
  Value weightsAt(int64_t s, int64_t kt, int64_t col, int64_t width,
                  std::optional<int64_t> tiles = std::nullopt) {
    int64_t stride = weightSlots * kTiles * panelCols;
    Value at = k.index(((s % weightSlots) * kTiles + kt) * panelCols + col);
    if (tiles)
      return k.view(weights, at, {kTile, *tiles, width},
                    {stride, panelCols, 1});
    return k.view(weights, at, {kTile, width}, {stride, 1});
  }

  /// K tiles a weights transfer moves: the fewest whose runs (a
  /// partition's consecutive rows of K) hide the DMA's per-descriptor cost,
  /// so the first matmuls wait for little more than their own tiles.
  int64_t tilesPerTransfer(int64_t s) const {
    int64_t width = cols(s), eltBytes = inElt.getIntOrFloatBitWidth() / 8;
    if (w.strides[2] != 1 || width * w.strides[2] != w.strides[1])
      return 1; // runs of one row at most
    const ::neuron::target::CostModel cost(k.target);
    auto nsPerByte = [&](int64_t tiles) {
      double run = double(tiles * width * eltBytes);
      return cost.dmaTransferNs(run, run, 1) / run;
    };
    for (int64_t tiles = 1; tiles < kTiles; ++tiles)
      if (kTiles % tiles == 0 && nsPerByte(tiles) <= nsPerByte(kTiles))
        return tiles;
    return kTiles;
  }

  void loadWeights(int64_t s) {
    int64_t g = s / panels, c0 = (s % panels) * panelCols, width = cols(s);
    int64_t bRow = w.strides[1], bCol = w.strides[2];
    int64_t per = tilesPerTransfer(s);
    // A transfer's K tiles are a run of rows on each partition.
    for (int64_t kt = 0; kt < kTiles; kt += per) {
      Value src = k.index(w.offset + g * w.strides[0] + kt * bRow + c0 * bCol);
      k.dma(k.view(w.buffer, src, {kTile, per, width},
                   {kTiles * bRow, bRow, bCol}),
            weightsAt(s, kt, 0, width, per));
    }
  }

  /// x^T of group g's `rows` rows from `start` into tile g % 2, K in the
  /// weights' order.
  void loadRows(int64_t g, Value start, Value rows) {
    SmallVector<OpFoldResult> shape{k.b.getIndexAttr(kTile),
                                    k.b.getIndexAttr(kTiles), rows};
    Value src = k.addOffset(k.scale(start, a.strides[0]), a.offset);
    k.dma(k.view(a.buffer, src, shape, {kTiles, 1, a.strides[0]}),
          k.view(rowsT[g % 2], k.index(0), shape,
                 {kTiles * slotRows, slotRows, 1}));
  }

  /// Row tile `tile` of panel step s's group, which starts at row `start`:
  /// `rows` rows of it when not null, in PSUM slot `slot` % 2 and staging
  /// slot `slot`.
  void computeTile(int64_t s, Value start, Value tile, Value rows,
                   int64_t slot) {
    auto &b = k.b;
    int64_t g = s / panels, psumSlot = slot % 2;
    int64_t width = cols(s), banks = (width + bankCols - 1) / bankCols;
    int64_t accStride = 2 * panelBanks * bankCols;
    int64_t stageStride = kStageSlots * panelCols;
    Value col0 = k.scale(tile, tileRows);
    auto bank = [&](int64_t nb) {
      int64_t nt = std::min(bankCols, width - nb * bankCols);
      return k.view(acc, k.index((psumSlot * panelBanks + nb) * bankCols),
                    {tileRows, nt}, {accStride, 1});
    };
    // K tiles outermost: a panel's first matmuls need its first weights
    // transfer only.
    for (int64_t kt = 0; kt < kTiles; ++kt) {
      Value stationary = k.view(rowsT[g % 2], k.addOffset(col0, kt * slotRows),
                                {kTile, tileRows}, {kTiles * slotRows, 1});
      for (int64_t nb = 0; nb < banks; ++nb) {
        int64_t nt = std::min(bankCols, width - nb * bankCols);
        auto mm = b.create<nisa::MatmulOp>(
            stationary, weightsAt(s, kt, nb * bankCols, nt), bank(nb));
        if (kt > 0)
          mm.setAccumulate(true);
      }
    }
    for (int64_t nb = 0; nb < banks; ++nb) {
      int64_t nt = std::min(bankCols, width - nb * bankCols);
      Value part = k.view(staged, k.index(slot * panelCols + nb * bankCols),
                          {tileRows, nt}, {stageStride, 1});
      b.create<nisa::CopyOp>(
          bank(nb), part, nb % 2 ? nisa::Engine::scalar : nisa::Engine::vector);
    }
    SmallVector<OpFoldResult> shape{b.getIndexAttr(tileRows),
                                    b.getIndexAttr(width)};
    if (rows)
      shape[0] = rows;
    Value dst = k.addOffset(k.scale(k.addOffsets(start, col0), n),
                            (s % panels) * panelCols);
    // From ScalarE's queue: on SyncE's a store would hold up the loads.
    b.create<nisa::DmaCopyOp>(
        k.view(staged, k.index(slot * panelCols), shape, {stageStride, 1}),
        k.view(out, dst, shape, {n, 1}), nisa::Engine::scalar);
  }

  /// TensorE cycles of panel step s's work on `rows` rows, by the
  /// target's cost model (each matmul's LoadStationary counted): a whole
  /// 128-row tile (`transposed` false), or the rows computed transposed
  /// (computeTailTransposed, up to kMergedBlocks tiles of them).
  double tensorCycles(int64_t s, int64_t rows, bool transposed) const {
    const ::neuron::target::CostModel cost(k.target);
    bool f32 = inElt.isF32();
    auto matmul = [&](int64_t stationary, int64_t moving) {
      return cost.matmulCycles(double(stationary), double(moving), f32) +
             cost.loadStationaryCycles(double(stationary));
    };
    int64_t width = cols(s), chunks = width / tileRows;
    double cycles = 0;
    if (!transposed) {
      for (int64_t c = 0; c < width; c += bankCols)
        cycles += kTiles * matmul(tileRows, std::min(bankCols, width - c));
      return cycles;
    }
    cycles = kTiles * chunks * matmul(tileRows, rows);
    for (int64_t r = rows; r > 0; r -= tileRows) // the transposes back
      cycles += chunks * matmul(std::min(r, tileRows), tileRows);
    return cycles;
  }

  /// The most rows of a group's short last tile that compute transposed
  /// in under 90% of the TensorE time of a whole tile (the margin: its two
  /// evictions per chunk); 0 where none do or it does not apply.
  int64_t transposedTailRows(int64_t s) const {
    if (cols(s) % tileRows || outElt != inElt)
      return 0;
    double whole = tensorCycles(s, tileRows, false);
    int64_t most = 0;
    for (int64_t r = 1; r < tileRows; ++r)
      if (tensorCycles(s, r, true) < 0.9 * whole)
        most = r;
    return most;
  }

  /// The most rows of a short last tile that compute transposed together
  /// with the whole tile before it (`tileRows` + r rows moving) in less
  /// TensorE time than the two apart: a tail of a few rows, which alone
  /// pays TensorE's minimum moving size for every matmul. Evictions are
  /// two per chunk either way. 0 where none do.
  int64_t mergedTailRows(int64_t s) const {
    int64_t most = transposedTailRows(s), merged = 0;
    if (!most)
      return 0;
    double whole = tensorCycles(s, tileRows, false);
    for (int64_t r = 1; r <= most; ++r)
      if (tensorCycles(s, tileRows + r, true) <
          whole + tensorCycles(s, r, true))
        merged = r;
    return merged;
  }

  /// `rows` rows from tile `tile` of panel step s's group (at most
  /// `blocks` tiles of them) computed transposed: per 128-column chunk of
  /// the panel, out^T [column, row] = w^T x^T with the weights stationary
  /// and the rows moving, so TensorE's time follows the rows, not whole
  /// tiles; each chunk rounded once to the output dtype, transposed back
  /// on TensorE a 128-row block at a time (an exact product with the
  /// identity) and stored. The chunks' sums take PSUM slot 1 in passes of
  /// as many chunks as it holds.
  void computeTailTransposed(int64_t s, Value start, Value tile, Value rows,
                             int64_t blocks) {
    auto &b = k.b;
    int64_t g = s / panels, width = cols(s), chunks = width / tileRows;
    int64_t accStride = 2 * panelBanks * bankCols;
    int64_t stageStride = kStageSlots * panelCols;
    int64_t span = blocks * tileRows; // a chunk's columns in PSUM and transT
    int64_t perPass = panelBanks * bankCols / span;
    Value col0 = k.scale(tile, tileRows);
    // Chunk c's sums, [column, row], at column c * span of PSUM slot 1 (c
    // counted in its pass); their transposes after them, in the same
    // columns. The rest moves whole 128 x span chunks (the rows past `rows`
    // are never stored): no cost that the rows would save, and views the
    // synchronisation can tell apart. `f` columns from column `col`:
    auto sums = [&](int64_t col, OpFoldResult f) {
      return k.view(acc, k.index(panelBanks * bankCols + col),
                    {b.getIndexAttr(tileRows), f}, {accStride, 1});
    };
    auto transposed = [&](int64_t col, OpFoldResult f) {
      return k.view(transT, k.index(col), {b.getIndexAttr(tileRows), f},
                    {panelBanks * bankCols, 1});
    };
    OpFoldResult whole = b.getIndexAttr(span), block = b.getIndexAttr(tileRows);
    for (int64_t first = 0; first < chunks; first += perPass) {
      int64_t count = std::min(perPass, chunks - first);
      for (int64_t kt = 0; kt < kTiles; ++kt) {
        Value moving =
            k.view(rowsT[g % 2], k.addOffset(col0, kt * slotRows),
                   {b.getIndexAttr(kTile), rows}, {kTiles * slotRows, 1});
        for (int64_t c = 0; c < count; ++c) {
          Value stationary = weightsAt(s, kt, (first + c) * tileRows, tileRows);
          auto mm = b.create<nisa::MatmulOp>(stationary, moving,
                                             sums(c * span, rows));
          if (kt > 0)
            mm.setAccumulate(true);
        }
      }
      auto engine = [](int64_t i) {
        return i % 2 ? nisa::Engine::scalar : nisa::Engine::vector;
      };
      for (int64_t c = 0; c < count; ++c)
        b.create<nisa::CopyOp>(sums(c * span, whole),
                               transposed(c * span, whole), engine(c));
      for (int64_t c = 0; c < count; ++c)
        for (int64_t col = c * span; col < (c + 1) * span; col += tileRows)
          b.create<nisa::MatmulOp>(transposed(col, block), ident,
                                   sums(col, block))
              .setIsTranspose(true); // infinite sums stay infinite
      // Block blk of the rows in staging slot kStageSlots - blocks + blk.
      for (int64_t c = 0; c < count; ++c)
        for (int64_t blk = 0; blk < blocks; ++blk) {
          int64_t slot = kStageSlots - blocks + blk;
          Value part =
              k.view(staged, k.index(slot * panelCols + (first + c) * tileRows),
                     {tileRows, tileRows}, {stageStride, 1});
          b.create<nisa::CopyOp>(sums(c * span + blk * tileRows, block), part,
                                 engine(c * blocks + blk));
        }
    }
    for (int64_t blk = 0; blk < blocks; ++blk) {
      OpFoldResult blockRows =
          blk + 1 < blocks ? OpFoldResult(b.getIndexAttr(tileRows))
                           : OpFoldResult(k.addOffset(rows, -blk * tileRows));
      SmallVector<OpFoldResult> shape{blockRows, b.getIndexAttr(width)};
      Value dst = k.addOffset(
          k.scale(k.addOffset(k.addOffsets(start, col0), blk * tileRows), n),
          (s % panels) * panelCols);
      int64_t slot = kStageSlots - blocks + blk;
      b.create<nisa::DmaCopyOp>(
          k.view(staged, k.index(slot * panelCols), shape, {stageStride, 1}),
          k.view(out, dst, shape, {n, 1}), nisa::Engine::scalar);
    }
  }

  KernelLowering &k;
  TileBuilder::Window a, w;
  Value out;
  ValueRange ends;
  int64_t m, n, kTile, kTiles, tileRows, slotRows, bankCols, panelBanks,
      panelCols, panels, weightSlots;
  Type inElt, outElt;
  Value weights, rowsT[2], acc, staged, transT, ident;
};

struct GroupedMatmulPattern
    : OpTilePattern<GroupedMatmulPattern, GroupedMatmulOp> {
  bool isSizeGeneric(Operation *) const override { return true; }
  LogicalResult lowerOp(GroupedMatmulOp op, KernelLowering &k) const {
    if (!tensorType(op.getLhs()).hasStaticShape() ||
        !tensorType(op.getRhs()).hasStaticShape())
      return emitError(op->getLoc())
             << "not size-generic: " << op->getName()
             << ": operand sizes known only at run time";
    if (tensorType(op.getLhs()).getShape().back() == 0)
      return op->emitOpError("has an empty contraction");
    // Rows are addressed from the group's first at run time: a row-major
    // lhs (a transposed one would need strides of the row count).
    RankedTensorType lhsType = tensorType(op.getLhs());
    if (k.windowOf(op.getLhs()).strides !=
        SmallVector<int64_t>{lhsType.getDimSize(1), 1})
      return emitError(op->getLoc())
             << op->getName() << ": the rows are a strided view";
    if (GroupedGemm::applies(k, op)) {
      GroupedGemm(k, op).lower();
      return success();
    }
    GemmLowering(k, op.getLhs(), op.getRhs(), op.getResult(), k.index(0))
        .lowerGrouped(op.getEnds());
    return success();
  }
};

struct ScaledMatmulPattern
    : OpTilePattern<ScaledMatmulPattern, ScaledMatmulOp> {
  LogicalResult lowerOp(ScaledMatmulOp op, KernelLowering &k) const {
    int64_t kDim = tensorType(op.getLhs()).getShape().back();
    if (kDim == 0)
      return op->emitOpError("has an empty contraction");
    if (op.hasBlockScales()) {
      int64_t r = k.target.matmulMxKFactor();
      if (r < 2)
        return op->emitOpError("MX block scales need TensorE's MX mode "
                               "(NeuronCore-v4, trn3); target '")
               << k.target.name << "' has none";
      // An MX matmul contracts whole 32-partition quadrants of R values.
      if (kDim % (32 * r))
        return op->emitOpError("MX on TensorE needs K a multiple of ")
               << 32 * r << ", not " << kDim;
      // B's scales stay on chip: up to half of SBUF (K <= 4096 takes N
      // bytes per partition, more K as many times as 512 values divide it).
      int64_t n = tensorType(op.getRhs()).getDimSize(1);
      if (mxScalePanelBytes(k.target, kDim, n) >
          k.target.sbufBytesPerPartition / 2)
        return op->emitOpError("MX: B's scales for K = ")
               << kDim << " and N = " << n
               << " do not fit half of SBUF, where the kernel keeps them";
      GemmLowering::BlockScales scales{k.windowOf(op.getRowScale()),
                                       k.windowOf(op.getColScale())};
      for (auto *w : {&scales.a, &scales.b})
        if (w->hasDynamicStrides() || w->strides[1] != 1)
          return op->emitOpError("MX scales must have contiguous rows");
      GemmLowering(k, op.getLhs(), op.getRhs(), op.getResult(), Value(),
                   std::nullopt, scales)
          .lower();
      return success();
    }
    GemmLowering::Epilogue ep;
    ep.rowScale = k.windowOf(op.getRowScale());
    ep.colScale = k.windowOf(op.getColScale());
    ep.rowwise = tensorType(op.getRowScale()).getDimSize(0) ==
                 tensorType(op.getLhs()).getDimSize(0);
    ep.colwise = tensorType(op.getColScale()).getDimSize(0) ==
                 tensorType(op.getRhs()).getDimSize(1);
    // One row (column): its single element is the tensorwise scale.
    ep.rowwise &= tensorType(op.getRowScale()).getDimSize(0) > 1;
    ep.colwise &= tensorType(op.getColScale()).getDimSize(0) > 1;
    if (op.getBias()) {
      ep.bias = k.windowOf(op.getBias());
      ep.biasElt = tensorType(op.getBias()).getElementType();
    }
    GemmLowering(k, op.getLhs(), op.getRhs(), op.getResult(), Value(), ep)
        .lower();
    return success();
  }
};
} // namespace

void KernelLowering::lowerMatmul(MatmulOp op) {
  GemmLowering(*this, op.getLhs(), op.getRhs(), op.getResult(), Value(),
               linearEpilogue(op, *this))
      .lower();
}

void populateMatmulPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<MatmulPattern>());
  patterns.push_back(std::make_unique<ScaledMatmulPattern>());
  patterns.push_back(std::make_unique<GroupedMatmulPattern>());
}

} // namespace mlir::neuron
