//===- FlexAttentionLowering.h - neuron.flex_attention(_backward) -> nisa -===//
//
// The FlexAttention kernels' lowering state, shared by the forward
// (LowerFlexAttention.cpp) and backward (LowerFlexAttentionBackward.cpp)
// kernels: block classes, the modifiers' lowering and the PSUM/SBUF tiles
// they use.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_FLEX_ATTENTION_FLEXATTENTIONLOWERING_H
#define PASSES_FLEX_ATTENTION_FLEXATTENTIONLOWERING_H

#include "dialects/neuron/FlexBlockClass.h"
#include "passes/tile/KernelLowering.h"

namespace mlir::neuron {

namespace flex {

/// One key tile of a query tile: keys [firstUnit * unit, + width), and the
/// runs of its units (offset in the tile, count) that need mask_mod.
struct KvTile {
  int64_t firstUnit;
  int64_t units;
  int64_t width;
  SmallVector<std::pair<int64_t, int64_t>, 2> partialRuns;
  bool partial() const { return !partialRuns.empty(); }
  bool sameShape(const KvTile &o) const {
    return units == o.units && width == o.width && partialRuns == o.partialRuns;
  }
};

/// An integer affine function of the modifier's indices b, h, q, kv.
struct Affine {
  int64_t c0 = 0, cb = 0, ch = 0, cq = 0, ckv = 0;
  bool operator==(const Affine &o) const {
    return c0 == o.c0 && cb == o.cb && ch == o.ch && cq == o.cq && ckv == o.ckv;
  }
};

/// A modifier value during lowering: a compile-time number, an affine index
/// not materialized yet, a [rows, 1] column, a [rows, width] tile, or a
/// captured tensor (flattened).
struct Operand {
  enum Kind { imm, index, column, full, table } kind = imm;
  double value = 0;
  Affine affine;
  Value tile;
  Value buffer;
  int64_t offset = 0, elements = 0;
};

/// Whether runDecode lowers `op`: static shapes, plain scores, no mask,
/// at most 128 query rows per key head, at least 512 keys.
bool isDecodeAttention(FlexAttentionOp op);

/// Whether two index values compute one number: the same value, or the
/// same arith op on operands that are (sizes are built per use, so equal
/// lengths are equal trees of arith ops over the size arguments).
inline bool sameIndex(Value a, Value b) {
  if (a == b)
    return true;
  Operation *x = a.getDefiningOp(), *y = b.getDefiningOp();
  if (!x || !y || x->getName() != y->getName() ||
      x->getAttrDictionary() != y->getAttrDictionary() ||
      x->getNumOperands() != y->getNumOperands() ||
      !isa<arith::ArithDialect>(x->getDialect()))
    return false;
  return llvm::all_of(
      llvm::zip(x->getOperands(), y->getOperands()),
      [](auto p) { return sameIndex(std::get<0>(p), std::get<1>(p)); });
}

class FlexAttentionLowering {
public:
  FlexAttentionLowering(TileBuilder &k, FlexAttentionOp op)
      : k(k), b(k.b), unit(k.target.partitions), op(op) {}
  FlexAttentionLowering(TileBuilder &k, FlexAttentionBackwardOp op)
      : k(k), b(k.b), unit(k.target.partitions), bwOp(op) {}
  /// The forward kernel (LowerFlexAttention.cpp).
  LogicalResult run();
  /// The forward kernel over a key length known at run time only
  /// (LowerFlexAttentionDynamic.cpp), or "not size-generic".
  LogicalResult runDynamic();
  /// The forward kernel over a query length known at run time only
  /// (LowerFlexAttentionPrefillDynamic.cpp: prefill), or "not size-generic".
  LogicalResult runPrefillDynamic();
  /// The backward kernel (LowerFlexAttentionBackward.cpp).
  LogicalResult runBackward();
  /// The forward kernel for a few query rows per key head against a long
  /// key cache, keys on the partitions (LowerDecodeAttention.cpp); for the
  /// ops isDecodeAttention accepts.
  LogicalResult runDecode();

private:
  /// Where a key step is: loop indices (index values) and static sizes.
  struct Step {
    Value batch, head; // query head
    Value q0;          // first query row
    Value qTile;       // its query tile (forward kernel)
    Value unit;        // first key unit (`unit` keys)
    int64_t rows = 0, width = 0;
    int64_t kvSlot = 0; // the SBUF slot of its key head's K^T and V
  };

  /// A key step in a lane's stream: key tile `keys` of query tile `q`.
  struct LaneStep {
    int64_t q;
    KvTile keys;
    int64_t set;      // the query tile's state set (laneStreams)
    bool first, last; // the query tile's first / last key step
  };
  /// Sets of a lane's query-tile state (O, l, the output, Q^T): its tiles
  /// alternate over the first two, its last takes the third, so that a
  /// query head's first tile and the last of the head before never share
  /// one (fuseHeads).
  static constexpr int64_t kSets = 3;
  /// The column (in units of its width) of a step's query-tile state set in
  /// the per-lane state tiles (l, O, the output, Q^T).
  static int64_t stateColumn(int64_t lane, const LaneStep &step) {
    return kSets * lane + step.set;
  }
  using Lane = SmallVector<LaneStep>;

  /// A lane's step during emission: which, where, and its buffer parity.
  struct Cursor {
    int64_t lane;
    const LaneStep *step;
    Step at;
    int64_t parity;
  };

  LogicalResult setUpCommon(Operation *o, Value query, Value keyV, Value valueV,
                            double opScale, ArrayRef<int64_t> blockSize,
                            ElementsAttr blocks, ValueRange scoreBuffers,
                            ValueRange maskBuffers);
  template <typename OpTy> LogicalResult setUp(OpTy o) {
    return setUpCommon(o, o.getQuery(), o.getKey(), o.getValue(),
                       o.getScale().convertToDouble(), o.getBlockSize(),
                       o.getBlocks(), o.getScoreBuffers(), o.getMaskBuffers());
  }
  /// `ident`, the identity for TensorE transposes ((p - j) == 0).
  void makeIdentity();
  void makeConstants(int64_t cols);
  /// The decode kernel over `kvLen` keys (an index: a constant, or a size
  /// known at run time for runDynamic), after setUp.
  LogicalResult decodeKernel(Value kvLen);
  // The forward kernel's plan and tiles.
  void planPsum(bool tables);
  LogicalResult planSbuf();
  void allocateTiles(bool tables);
  void emitBatches();
  std::pair<Value, SmallVector<int64_t>> resultLayout(Value result);
  void makeAntiIdentities();

  // The backward kernel.
  struct BackwardTiles {
    Value kRows, kT, vT;                 // the key head's
    Value qRows, qT, doRows, doT, oRows; // the query head's
    Value negLse, delta;                 // per query tile columns
    Value dQ, dK, dV;                    // fp32 accumulators
    Value pIn, dSIn, dSTIn;    // matmul inputs P, dS, dS^T: two steps' worth
    Value outDQ, outDK, outDV; // results (HBM)
    SmallVector<int64_t> dqStrides, dkStrides, dvStrides;
    // Streaming: queries and keys pass through SBUF in chunks of at most
    // qCap and kvCap rows (whole sequences when they fit; otherwise
    // multiples of 128). The chunk being computed starts at query tile t0
    // and key unit u0. With several key chunks, dQ sums over them in
    // dQPartial, fp32 in HBM.
    int64_t qCap = 0, kvCap = 0, qCapTiles = 0, kvCapUnits = 0;
    int64_t t0 = 0, u0 = 0, chunkUnits = 0;
    TileBuilder::Window dQPartial;
    TileBuilder::Window o, dO, lseIn;
    Region *scoreGrad = nullptr;
    bool plainScoreGrad = false;
  };
  BackwardTiles bw;
  LogicalResult planChunks(FlexAttentionBackwardOp o);
  void backwardKeyHead(Value batchIdx, Value kvHead, int64_t bm);
  void backwardQueryHead(Value batchIdx, Value kvHead, Value g, int64_t bm,
                         int64_t hm, int64_t kvChunk);
  Value headBase(const TileBuilder::Window &w, Value batchIdx, Value h,
                 int64_t row);
  std::pair<int64_t, int64_t> dQChunks(ArrayRef<SmallVector<Kind>> kinds,
                                       int64_t tiles) const;
  Value loadQueryChunk(Value batchIdx, Value h, int64_t q0, int64_t queries,
                       bool firstChunk);
  void lseAndDelta(Value batchIdx, Value h, int64_t t);
  /// A (key unit, query tile) step of the backward kernel.
  struct BackwardStep {
    Step at;
    int64_t t, u;
    bool partial, first, last; // first / last: of the key unit's steps
  };
  SmallVector<BackwardStep> backwardSteps(ArrayRef<SmallVector<Kind>> kinds,
                                          Value batchIdx, Value h,
                                          int64_t tiles);
  void pipelineSteps(ArrayRef<BackwardStep> steps);
  void accumulateKV(const BackwardStep &s, int64_t kvBank);
  void backwardScores(const Step &at, int64_t t, int64_t u, bool partial,
                      int64_t slot);
  /// A step's scores: `scaled` (S times the scale, or S in PSUM when exp
  /// applies the scale), `scores` after score_mod and the mask (null if a
  /// modifier failed).
  struct ScoreTiles {
    Value scaled, scores;
    bool expFromPsum = false;
  };
  ScoreTiles backwardScoreTiles(const Step &at, int64_t t, int64_t u,
                                bool partial, int64_t slotIdx);
  Value recomputeP(const Step &at, int64_t t, const ScoreTiles &s,
                   int64_t slotIdx);
  void scoreGradient(const Step &at, int64_t t, int64_t u, const ScoreTiles &s,
                     Value p, int64_t slotIdx);
  Value bankView(int64_t bankIdx, int64_t col, int64_t rows, int64_t cols);
  Value stepSlot(Value tile, int64_t slotIdx, const Step &at);
  Value modifierTile(FailureOr<Operand> r, const Step &at);
  void backwardGrads(const Step &at, int64_t t, int64_t u, bool first,
                     int64_t slot, int64_t parity, int64_t kvBank);
  void backwardDQ(const Step &at, int64_t t, int64_t u, int64_t parity);
  Value loadRowsOf(const TileBuilder::Window &w, Value base, int64_t len,
                   int64_t width, Value dst);
  Value loadTransposed(const TileBuilder::Window &w, Value base, int64_t len,
                       int64_t width, Value dst);
  void storeRows(Value src, int64_t width, int64_t len, Value buffer,
                 Value base, int64_t rowStride, double factor);
  SmallVector<SmallVector<Kind>> unitKinds(int64_t bm, int64_t hm) const;
  SmallVector<Operand> tableOperands(ValueRange buffers);
  SmallVector<KvTile> keyTiles(ArrayRef<Kind> row) const;
  SmallVector<Lane> laneStreams(ArrayRef<SmallVector<Kind>> kinds,
                                SmallVectorImpl<int64_t> &empty) const;
  bool sameRound(ArrayRef<Lane> lanes, int64_t r, int64_t r2,
                 int64_t qShift) const;
  /// Rounds repeating for later query tiles: `count` periods of `rounds`
  /// rounds, each `tiles` query tiles further.
  struct Period {
    int64_t rounds = 0, tiles = 0, count = 0;
  };
  Period periodAt(ArrayRef<Lane> lanes, int64_t r, int64_t rounds) const;
  int64_t rowsOf(int64_t qTile) const {
    return std::min(unit, qLen - qTile * unit);
  }

  // The kernel.
  /// Where a key head's operands load: its indices and SBUF slot.
  struct HeadLoad {
    Value batch, kvHead;
    int64_t slot;
  };
  /// A head load spread over a query head's `end` rounds: round r issues
  /// the pieces up to (r + 1) * pieces / end, in key order, which is the
  /// order the next head's first rounds need them (loops: loopPieces).
  struct PieceSchedule {
    PieceSchedule(const HeadLoad *load, int64_t rounds, int64_t pieces,
                  int64_t whole)
        : load(load), pieces(load ? pieces : 0), whole(whole),
          end(std::max<int64_t>(1, rounds)) {}
    int64_t dueBefore(int64_t r) const {
      return std::clamp<int64_t>(((r + 1) * pieces + end - 1) / end, 0, pieces);
    }
    const HeadLoad *load;
    int64_t pieces, whole, end, issued = 0;
  };
  void loadHead(Value batchIdx, Value kvHead, int64_t slot);
  void loadUnits(const HeadLoad &at, Value first, int64_t firstStatic,
                 int64_t count);
  int64_t pieceCount() const;
  int64_t wholePieces() const;
  void issuePieces(PieceSchedule &s, int64_t r);
  int64_t loopPieces(PieceSchedule &s, int64_t to, int64_t steps);
  void queryHeads(Value batchIdx, Value kvHead, int64_t bm, int64_t slot,
                  const HeadLoad *next = nullptr, bool afterHead = false);
  static int64_t roundsOf(ArrayRef<Lane> streams);
  bool fusibleHeads(ArrayRef<Lane> streams) const;
  void finishHead(const Step &head, ArrayRef<Lane> streams, int64_t from);
  void storesAfter(const Step &head, ArrayRef<Lane> streams, int64_t rounds,
                   bool withLse);
  void emptyTile(const Step &at);
  /// What locates a round's key steps (round's arguments).
  struct RoundAt {
    const Step &head;
    ArrayRef<Lane> streams;
    int64_t r;
    Value rIdx, qShift;
    bool affine;
  };
  void round(const Step &head, Value qTHead, ArrayRef<Lane> lanes, int64_t r,
             Value rIdx, int64_t parity, Value qShift, bool affine,
             const RoundAt *finishing = nullptr);
  std::optional<Cursor> cursor(const RoundAt &at, int64_t lane, int64_t s,
                               int64_t par);
  std::pair<int64_t, int64_t> peChunksOf(int64_t lane) const;
  int64_t dmaChunks(const Cursor &c) const;
  /// The step's columns in pBuf and pTBuf (per lane and parity).
  int64_t slotOf(const Cursor &c) const {
    return (2 * c.lane + c.parity) * bank;
  }
  void transposeP(const Cursor &c);
  void dmaTransposeP(const Cursor &c);
  void evictPT(const Cursor &c);
  void accumulateO(const Cursor &c);
  Value queryT(const Cursor &c, Value qTHead);
  void startTile(const Cursor &c);
  void scores(const Cursor &c, Value qTs);
  void rowMax(const Cursor &c);
  void emitRowMax(const Cursor &c, Value src);
  void maskBias(const Cursor &c);
  Value biasOf(const Cursor &c, int64_t offset, int64_t cols);
  std::optional<int64_t> staticDelta(const Cursor &c, int64_t offset);
  std::optional<Value> cachedMask(const Cursor &c, int64_t offset,
                                  int64_t cols);
  void probabilities(const Cursor &c);
  void rescaleFactor(const Cursor &c);
  void finishTile(const Cursor &c);
  /// Rounds a lane's output store may trail its finishTile (storeTiles):
  /// a lane reuses an output slot two tiles on, at the earliest two rounds.
  static constexpr int64_t kMaxStoreDelay = 2;
  void storeTiles(const RoundAt &at, int64_t r, int64_t parity);
  void storeTile(const Cursor &c);
  Value outputOf(const Cursor &c);
  void storeLseParts(const Step &at, Value sums, Value negMax);
  void finishLse(const Step &head);

  // Per-lane buffers.
  Value psumBank(int64_t bank, int64_t rows, int64_t cols);
  Value column(Value t, int64_t i, int64_t rows);
  Value scoresOf(const Cursor &c);
  int64_t scoreBankOf(const Cursor &c) const { return 2 * c.lane + c.parity; }
  Value expSource(const Cursor &c);
  Value negmOf(int64_t lane, int64_t parity, int64_t rows);

  void scalarTensorTensor(Value a, Value sCol, double sImm, nisa::AluOp op0,
                          Value other, nisa::AluOp op1, Value dst,
                          nisa::Engine engine);

  // Modifiers.
  FailureOr<Operand> modifier(Region &region, ArrayRef<Operand> args,
                              const Step &at);
  FailureOr<Operand> modifierOp(Operation &inner,
                                const DenseMap<Value, Operand> &values,
                                const Step &at);
  Operand castOperand(CastOp castOp, Operand x, const Step &at);
  FailureOr<Operand> gatherOperand(GatherOp gather, Operand table, Operand idx,
                                   const Step &at);
  FailureOr<Operand> binaryOperand(BinaryOp bin, Operand l, Operand r,
                                   const Step &at);
  Operand aluOperand(nisa::AluOp alu, const Operand &l, const Operand &r,
                     const Step &at);
  Value materialize(const Operand &v, const Step &at, bool asFull);
  Value gatherWindow(Value buffer, Value first, int64_t rowStride,
                     int64_t colStride, int64_t rows, int64_t cols);
  Value iota(const Affine &a, const Step &at, bool asFull);
  Value indexValue(const Affine &a, const Step &at);

  TileBuilder &k;
  ImplicitLocOpBuilder &b;
  /// The kernels work on unit x unit blocks of the score matrix whatever
  /// the BlockMask's block size: a query tile of a row per partition
  /// against as many keys (TensorE contracts over the partitions).
  const int64_t unit;
  FlexAttentionOp op;           // the forward kernel's
  FlexAttentionBackwardOp bwOp; // the backward kernel's
  bool failed = false;

  int64_t batch = 0, heads = 0, kvHeads = 0, group = 0;
  int64_t qLen = 0, kvLen = 0, dim = 0, vDim = 0;
  int64_t qTiles = 0, kvUnits = 0, bank = 0, kvSlots = 1;
  double scale = 1.0;
  bool plainScores = false; // score_mod returns the score unchanged
  bool scaleOnExp = false;  // the softmax scale rides on exp (plain scores)
  bool maskTrivial = false; // mask_mod is constant true: no unit is partial
  SmallVector<int8_t> blockKinds; // the blocks attribute, row-major
  ArrayRef<int64_t> blocksShape;
  int64_t qBlock = 0, kvBlock = 0;
  // The modifiers' arguments but the score: b, h, q_idx, kv_idx, then the
  // captured tensors (resolved before any loop is emitted).
  SmallVector<Operand> scoreArgs, maskArgs;
  Type inElt, f32;
  TileBuilder::Window q, key, value;
  Value out, lse;
  SmallVector<int64_t> outStrides, lseStrides;

  // `lanes` query tiles run interleaved stage by stage, so one tile's
  // softmax overlaps another's matmuls. Per lane, buffers of consecutive
  // key steps alternate (parity) and so do the states of consecutive query
  // tiles (set). PSUM: per lane two score banks, vDim columns for O and
  // 128 for its TensorE-transposed chunk of P^T.
  int64_t lanes = 1;
  Value psum;
  int64_t psumCols = 0;
  // With captured tensors: a PSUM bank and anti-identities (by size) that
  // flip windows read backwards.
  int64_t miscBank = 0;
  int64_t pTBank = 0; // TensorE's chunk of P^T, `unit` columns per lane
  DenseMap<int64_t, Value> antiIdentity;
  Value ident, negInf, zeros, negmInit;
  Value negm, alpha;        // [128, lanes x 2 parities]
  Value l, o, oOut;         // per lane x 2 sets
  Value lseSums, lseNegMax; // [128, query tiles] of the head, for its lse
  Value expSrc;             // [128, lanes x 2 parities x bank]
  // P and P^T of a key step, [128, lanes x 2 parities x bank] each: P^T
  // is read a round after P is computed (its DMA-transposed chunks land
  // then), so both outlive the round.
  Value pBuf, pTBuf;
  Value maskBiases; // [128, lanes x 2 parities x bank]
  /// Plain scores in bf16 or fp32 (f16 cannot hold the scale) take their
  /// mask as a TensorE matmul accumulating into the scores' bank.
  bool maskOnTensorE() const {
    return scaleOnExp && !maskTrivial && (inElt.isBF16() || inElt.isF32());
  }
  static constexpr double kTensorMaskScale = 0x1p64;
  Value maskIdentity, maskFill; // kTensorMaskScale I; -kTensorMaskScale
  // Biases of a mask of q - kv alone, one per static q0 - kv0 and shape.
  static constexpr int64_t kMaskCacheCols = 1024;
  struct CachedMask {
    int64_t delta, rows, cols, col;
  };
  Value maskCache;
  SmallVector<CachedMask> cachedMasks;
  int64_t maskCacheUsed = 0;
  std::optional<bool> maskShiftInvariant;
  SmallVectorImpl<Affine> *affineLog = nullptr; // iota's affines, when set
  // K^T [dim, slots x keys], V [128, slots x units x vDim] and, when
  // `qResident`, Q^T of the key head's query heads [dim, slots x group x
  // queries].
  bool qResident = false;
  Value kT, vS, qT;
  int64_t kTStride = 0, vSStride = 0, qTStride = 0;
  Value qLaneT;       // per query tile Q^T when not resident
  // Whether a query head's last round runs in the next query head's first
  // (emitBatches): the steps of both then keep the engines busy where each
  // alone would leave them waiting on its pipeline's fill or drain.
  bool fuseHeads = false;
};

} // namespace flex
} // namespace mlir::neuron

#endif // PASSES_FLEX_ATTENTION_FLEXATTENTIONLOWERING_H
