//===- LowerDecodeAttention.cpp - flash-decoding for a few query rows -----===//
//
// The forward kernel of a neuron.flex_attention with a few query rows per key
// head (decode: query length 1-8, every query head of a GQA group) against a
// long key cache, made to read the cache once at the DMA's rate (issue #19),
// for a static key length and for one known at run time (runDynamic).
// The flash-attention kernel puts the query rows on the partitions and the
// keys on the free axis: with four rows per key head VectorE and ScalarE
// work on 4 of 128 partitions, and every key step waits on the one running
// max of those rows. Here the keys go on the partitions instead:
//  - a key head's keys stream through SBUF in full blocks of `chunks` x 128
//    keys, key `first + p * chunks + c` on partition p (each partition reads
//    one contiguous run of K and of V), counted at run time and loaded
//    kSlots - 1 blocks ahead; the rest (length mod a block) is one more
//    block, loaded first, of chunk-major chunks and a tail on the first
//    partitions, whose missing keys keep -huge scores;
//  - per chunk S^T = K Q^T [128 keys, rows] into one PSUM bank (K^T chunk
//    stationary, the key head's Q^T moving), all chunks side by side;
//  - the block's max per query row: a bf16 max tree over the chunks on
//    VectorE (its first level reads PSUM), then across the partitions by a
//    TensorE transpose and a row reduce; the max M, a bf16 value, is
//    subtracted in PSUM by a matmul adding -1s^T diag(M) to S^T (exact);
//  - P^T = exp(scale * (S^T - M)) on ScalarE, reading PSUM; O = P V and the
//    row sums (P times a ones column) accumulate in PSUM over the chunks,
//    P^T chunks stationary;
//  - the blocks of a key head combine by log-sum-exp (flash-decoding):
//    running -max, row sums and O in fp32, each rescaled by exp(m_old -
//    m_new) and the block's by exp(m_block - m_new). No block waits on
//    another's softmax, and a block is finished after the next block's
//    scores (the next key head's first block after a head's last), so the
//    in-order TensorE and VectorE queues work on the next block while this
//    one's exp runs; the next key head's first blocks load under this
//    one's (key heads unrolled), K^T before V. With exactly one
//    full block per key head (a static cache) a head's V loads after the
//    next head's K^T, so that only P V, the combine and the store follow
//    the last transfer;
//  - with a static cache, two blocks share their keys' partitions so that
//    their V loads in runs of twice the length, and the heads' outputs are
//    gathered onto all partitions by TensorE for one store at the end.
//===----------------------------------------------------------------------===//

#include "passes/flex_attention/FlexAttentionLowering.h"

#include <limits>

namespace mlir::neuron::flex {

namespace {
constexpr int64_t kSlots = 4; // blocks in flight: one computing, three loading
constexpr int64_t kMaxRows = 128;
// A block's K^T (128 keys per chunk) takes at most 8 KiB per partition: 32
// chunks in bf16, 16 in fp32 (K^T and V of 2 x kSlots blocks and the two
// rest blocks then fit in SBUF).
constexpr int64_t kMaxBlockBytes = 8192;
} // namespace

bool isDecodeAttention(FlexAttentionOp op) {
  auto qType = tensorType(op.getQuery()), kType = tensorType(op.getKey()),
       vType = tensorType(op.getValue());
  if (!qType.hasStaticShape() || !kType.hasStaticShape() ||
      !vType.hasStaticShape() || !op.getScoreBuffers().empty() ||
      !op.getMaskBuffers().empty() || op.getScale().convertToDouble() <= 0)
    return false;
  Block &scoreBody = op.getScoreMod().front();
  if (cast<YieldOp>(scoreBody.getTerminator()).getValues()[0] !=
      scoreBody.getArgument(0))
    return false;
  // Every block full (or a mask_mod that keeps everything): no mask.
  bool maskTrivial = false;
  Value keep =
      cast<YieldOp>(op.getMaskMod().front().getTerminator()).getValues()[0];
  if (auto c = keep.getDefiningOp<ConstantOp>())
    if (auto attr = dyn_cast<DenseElementsAttr>(c.getValue()))
      maskTrivial = attr.isSplat() && attr.getSplatValue<bool>();
  if (!maskTrivial)
    for (APInt v : op.getBlocks().getValues<APInt>())
      if (v.getSExtValue() != (int64_t)Kind::full)
        return false;
  int64_t heads = qType.getDimSize(1), kvHeads = kType.getDimSize(1);
  if (kvHeads == 0 || heads % kvHeads)
    return false;
  int64_t rows = heads / kvHeads * qType.getDimSize(2);
  // Keys on the partitions pay off against a cache of several chunks.
  return rows >= 1 && rows <= kMaxRows && kType.getDimSize(2) >= 512 &&
         qType.getDimSize(3) <= 128 && vType.getDimSize(3) <= 128 &&
         kType.getDimSize(2) == vType.getDimSize(2);
}

LogicalResult FlexAttentionLowering::runDecode() {
  if (::mlir::failed(setUp(op)))
    return failure();
  return decodeKernel(k.index(kvLen));
}

LogicalResult FlexAttentionLowering::decodeKernel(Value kvLenV) {
  const int64_t rows = group * qLen; // Q^T columns: head g's rows g*qLen+i
  std::tie(out, outStrides) = resultLayout(op.getOut());
  if (!op.getLse().use_empty()) {
    lse = k.resultBuffer(op.getLse());
    lseStrides = contiguousStrides(tensorType(op.getLse()).getShape());
  }
  auto idx = [&](int64_t v) -> OpFoldResult { return b.getIndexAttr(v); };

  // A key head's keys: full blocks of `chunks` x 128 keys (p-major), then
  // the rest (length mod the block) as a block of chunk-major chunks and a
  // tail on the first partitions. S^T of a block fills at most a PSUM bank:
  // the rest block's chunk c goes to column group c + 1, its tail to group
  // 0 (it has fewer than `chunks` whole chunks).
  const int64_t chunks = std::min(
      kMaxBlockBytes * 8 / (unit * inElt.getIntOrFloatBitWidth()), bank / rows);
  const int64_t blockKeys = chunks * unit;
  // A static cache of one full block per key head: a head's loads can run
  // ahead only into the next head's, so the kernel is ordered for that (the
  // V of a head after the next head's K^T, and the last head's softmax
  // before the previous head's P V and its V in two transfers): after the
  // last byte only P V of half a block, the combine and the store remain.
  // (Shorter caches are bound by latency, not by the loads; a run-time
  // choice of this order made the size-generic program slower.)
  std::optional<int64_t> staticKeys = getConstantIntValue(kvLenV);
  const bool oneBlock = staticKeys && *staticKeys == blockKeys;
  Value fullBlocks = b.create<arith::FloorDivSIOp>(kvLenV, k.index(blockKeys));
  Value restKeys = b.create<arith::RemSIOp>(kvLenV, k.index(blockKeys));
  Value restChunks = b.create<arith::FloorDivSIOp>(restKeys, k.index(unit));
  Value tail = b.create<arith::RemSIOp>(restKeys, k.index(unit));
  Value restAt = k.scale(fullBlocks, blockKeys);

  TileBuilder::TileScope scope(k);
  // Constants: the identity (transposes, diag(max)), ones and -1s.
  makeIdentity();
  Value ones = k.tile(MemorySpace::sbuf, {unit, 1}, inElt);
  b.create<nisa::MemsetOp>(ones, APFloat(1.0));
  Value negOnes = k.tile(MemorySpace::sbuf, {rows, unit}, inElt);
  b.create<nisa::MemsetOp>(negOnes, APFloat(-1.0));

  // Every buffer that blocks or key heads take turns with is a tile of its
  // own (the rest blocks' must be: nisa-insert-sync takes a view with a
  // run-time extent as its whole tile).
  auto tiles = [&](int64_t n, MemorySpace space, ArrayRef<int64_t> shape,
                   Type elt) {
    SmallVector<Value> all;
    for (int64_t i = 0; i < n; ++i)
      all.push_back(k.tile(space, shape, elt));
    return all;
  };
  // SBUF per head slot (two: the next key head loads while this one
  // computes): full blocks' K^T [dim, chunks x 128] ((c, p) order) and V
  // [128, chunks x vDim] in kSlots stream slots; the rest block's K^T (keys
  // in order) and V; Q^T.
  const int64_t streams = 2 * kSlots;
  const int64_t kW = chunks * unit, vW = chunks * vDim;
  // Block pairs: a block's V is `chunks` keys of vDim values per partition,
  // one DMA descriptor each; below the size that hides a descriptor's
  // overhead, two blocks share their keys' partitions, key `first + p * 2 *
  // chunks + half * chunks + c` being block `half`'s chunk c on partition
  // p, so that their V loads as one transfer of twice the run. The keys of
  // a block may be any of the head's: the softmax combines blocks by
  // log-sum-exp, whatever keys they hold. With a static cache only, where
  // which block is left without a partner is known: block 0 when the count
  // is odd (`pairOff`), then blocks (pairOff + 2i, pairOff + 2i + 1).
  static_assert(kSlots % 2 == 0, "block pairs are pairs of stream slots");
  const int64_t staticFull = staticKeys ? *staticKeys / blockKeys : 0;
  const bool pairs =
      staticFull >= 2 &&
      chunks * vDim * inElt.getIntOrFloatBitWidth() / 8 <
          (int64_t)k.target.value("dma_descriptor_overhead_hidden_bytes");
  const int64_t pairOff = staticFull % 2;
  // A block's half of its pair (from its stream slot: kSlots is even).
  auto halfOf = [&](int64_t slot) { return (slot + kSlots - pairOff) % 2; };
  const int64_t pairW = pairs ? 2 * vW : vW;
  auto kTs = tiles(streams, MemorySpace::sbuf, {dim, kW}, inElt);
  auto vs = tiles(pairs ? streams / 2 : streams, MemorySpace::sbuf,
                  {unit, pairW}, inElt);
  auto kTRest = tiles(2, MemorySpace::sbuf, {dim, kW}, inElt);
  auto vRest = tiles(2, MemorySpace::sbuf, {unit, vW}, inElt);
  auto qTs = tiles(2, MemorySpace::sbuf, {dim, rows}, inElt);
  // PSUM: per set a bank of S^T and one of O, max^T and the row sums. A key
  // head slot has two sets, which its blocks alternate: the rest block, then
  // full blocks by stream slot (kSlots is even). So the scores of the next
  // block, in this key head or the next one, never share a set with the
  // block being finished.
  constexpr int64_t sets = 4;
  static_assert(kSlots % 2 == 0, "blocks alternate two PSUM sets");
  auto sBanks = tiles(sets, MemorySpace::psum, {unit, bank}, f32);
  auto mBanks = tiles(sets, MemorySpace::psum, {unit, bank}, f32);
  const int64_t oCol = 0, maxTCol = vDim, lCol = vDim + unit;
  auto ps = [&](int64_t set, int64_t bankIdx, int64_t at, int64_t parts,
                int64_t n) {
    return k.view((bankIdx ? mBanks : sBanks)[set], k.index(at), {parts, n},
                  {bank, 1});
  };
  // The softmax's tiles, per set where a block's outlive the next one's.
  const int64_t sW = chunks * rows, treeW = (chunks + 1) / 2 * rows;
  Value tree = k.tile(MemorySpace::sbuf, {unit, 2 * treeW}, inElt);
  auto maxB = tiles(sets, MemorySpace::sbuf, {unit, rows}, inElt);
  auto maxR = tiles(sets, MemorySpace::sbuf, {rows, 1}, f32);
  // diag(M) over as many column groups (dividing `chunks`) as fit 128
  // columns: a short VectorE pass, and few matmuls to add it to S^T.
  int64_t dgGroups = std::min(chunks, std::max<int64_t>(1, unit / rows));
  while (chunks % dgGroups)
    --dgGroups;
  const int64_t dgW = dgGroups * rows;
  auto diag = tiles(sets, MemorySpace::sbuf, {rows, dgW}, inElt);
  auto pTs = tiles(sets, MemorySpace::sbuf, {unit, sW}, inElt);
  // A key head's running state, per head slot: -max, the row sums, O; and
  // a block's -max, -max', the two rescale factors, O and l rescaled.
  auto negms = tiles(2, MemorySpace::sbuf, {rows, 1}, f32);
  auto ls = tiles(2, MemorySpace::sbuf, {rows, 1}, f32);
  auto os = tiles(2, MemorySpace::sbuf, {rows, vDim}, f32);
  Value factors = k.tile(MemorySpace::sbuf, {rows, 4}, f32);
  Value scaled = k.tile(MemorySpace::sbuf, {rows, vDim + 1}, f32);
  auto oOuts = tiles(2, MemorySpace::sbuf, {rows, vDim}, inElt);
  // Gathered output: a key head's rows store from `rows` partitions, so on
  // `rows` / 8 of the 16 DMA engines, between the loads that every engine
  // carries. When the heads' rows fill whole partitions of the result (of
  // rows of vDim values, in any order of heads and tokens: [B, H, L, D], or
  // [B, L, H, D] as attention layers read it), each head is instead moved
  // onto their partitions, `perPart` consecutive result rows each, by
  // TensorE: a 0/1 selection matrix as stationary, the head's O as moving,
  // accumulated in PSUM (exact: one value per element); one store at the
  // end. Head h's row r is result row base(h) + f(r), f(g * qLen + i) = (g
  // * outStrides[1] + i * outStrides[2]) / vDim: the selection of residue e
  // (rows with f(r) = e mod perPart) is the view at column maxBase -
  // base(h) / perPart of select_e[r, j] = (j == (f(r) - e) / perPart +
  // maxBase), which no j meets where f(r) - e is not a multiple. Residue e
  // accumulates in the free columns at the end of set e's second bank.
  const int64_t headsAll = batch * kvHeads, allRows = headsAll * rows;
  const int64_t perPart = allRows / unit;
  auto rowsOf = [&](int64_t stride) { return stride / vDim; };
  auto baseOf = [&](int64_t headIdx) {
    return rowsOf((headIdx / kvHeads) * outStrides[0] +
                  (headIdx % kvHeads) * group * outStrides[1]);
  };
  auto rowOf = [&](int64_t r) {
    return rowsOf(r / qLen * outStrides[1] + r % qLen * outStrides[2]);
  };
  bool gather = headsAll > 1 && allRows % unit == 0 && perPart <= sets &&
                bank - vDim > lCol && outStrides[3] == 1 &&
                llvm::all_of(ArrayRef<int64_t>(outStrides).take_front(3),
                             [&](int64_t s) { return s % vDim == 0; });
  // Every result row exactly once; a head's rows from a partition's start.
  std::vector<bool> seen(gather ? allRows : 0);
  for (int64_t h = 0; gather && h < headsAll; ++h) {
    gather = baseOf(h) % perPart == 0;
    for (int64_t r = 0; gather && r < rows; ++r) {
      int64_t row = baseOf(h) + rowOf(r);
      gather = row >= 0 && row < allRows && !seen[row];
      if (gather)
        seen[row] = true;
    }
  }
  int64_t maxBase = 0;
  for (int64_t h = 0; gather && h < headsAll; ++h)
    maxBase = std::max(maxBase, baseOf(h) / perPart);
  // When the last head's rows end the result in order, it is stored as it
  // is, at the same time as the others: its gather would follow its
  // combine, before the one store.
  bool lastAlone = gather && baseOf(headsAll - 1) + rows == allRows;
  for (int64_t r = 0; lastAlone && r < rows; ++r)
    lastAlone = rowOf(r) == r;
  const int64_t selW = maxBase + unit;
  SmallVector<Value> selects;
  Value gathered;
  if (gather) {
    // f(r) from the partition index: i = p mod qLen, g = (p - i) / qLen.
    Value p = k.tile(MemorySpace::sbuf, {rows, 1}, f32),
          i = k.tile(MemorySpace::sbuf, {rows, 1}, f32),
          f = k.tile(MemorySpace::sbuf, {rows, 1}, f32),
          fe = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
    b.create<nisa::IotaOp>(p, APFloat(0.0), APFloat(1.0),
                           b.getDenseF64ArrayAttr({0.0}));
    auto unary = [&](nisa::AluOp alu, Value src, Value dst, double imm) {
      b.create<nisa::TensorScalarOp>(alu, src, dst, Value(), APFloat(imm),
                                     false);
    };
    unary(nisa::AluOp::mod, p, i, qLen);
    b.create<nisa::TensorTensorOp>(nisa::AluOp::subtract, p, i, f);
    unary(nisa::AluOp::divide, f, f, qLen);
    unary(nisa::AluOp::multiply, f, f, rowsOf(outStrides[1]));
    unary(nisa::AluOp::multiply, i, i, rowsOf(outStrides[2]));
    b.create<nisa::TensorTensorOp>(nisa::AluOp::add, f, i, f);
    Value cols = k.tile(MemorySpace::sbuf, {rows, selW}, f32);
    b.create<nisa::IotaOp>(cols, APFloat(0.0), APFloat(0.0),
                           b.getDenseF64ArrayAttr({1.0}));
    for (int64_t e = 0; e < perPart; ++e) {
      unary(nisa::AluOp::subtract, f, fe, e);
      unary(nisa::AluOp::divide, fe, fe, perPart);
      unary(nisa::AluOp::add, fe, fe, maxBase);
      Value diff = k.tile(MemorySpace::sbuf, {rows, selW}, f32);
      b.create<nisa::TensorScalarOp>(nisa::AluOp::subtract, cols, diff, fe,
                                     APFloat(0.0), false);
      selects.push_back(k.tile(MemorySpace::sbuf, {rows, selW}, inElt));
      unary(nisa::AluOp::eq, diff, selects.back(), 0.0);
    }
    gathered = k.tile(MemorySpace::sbuf, {unit, perPart * vDim}, inElt);
  }
  // Adds head `headIdx`'s O (in oOuts) to the gathered rows.
  auto gatherHead = [&](int64_t headIdx) {
    for (int64_t e = 0; e < perPart; ++e)
      b.create<nisa::MatmulOp>(
           k.view(selects[e], k.index(maxBase - baseOf(headIdx) / perPart),
                  {rows, unit}, {selW, 1}),
           oOuts[headIdx % 2], ps(e, 1, bank - vDim, unit, vDim))
          .setAccumulate(headIdx > 0);
  };
  Value lt = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
  auto col = [&](Value t, int64_t width, int64_t at) {
    return k.view(t, k.index(at), {rows, 1}, {width, 1});
  };

  // Loads on SyncE's queue, which waits on nothing but free slots (on
  // ScalarE's they would wait behind the exps of the blocks before);
  // stores on ScalarE's, behind the head's work. K^T first, so the scores
  // start while V is still coming.
  auto load = [&](Value src, Value dst) { k.dma(src, dst); };
  auto store = [&](Value src, Value dst) {
    b.create<nisa::DmaCopyOp>(src, dst, nisa::Engine::scalar);
  };
  int64_t hs = 0; // the key head's slot
  Value kBase, vBase;
  const int64_t ks = key.strides[2], vst = value.strides[2];
  auto headBase = [&](const TileBuilder::Window &w, int64_t bi, int64_t h,
                      int64_t perHead) {
    return k.addOffset(k.addOffsets(k.scale(w.stride(k, 0), bi),
                                    k.scale(w.stride(k, 1), h * perHead)),
                       w.offset);
  };
  // With a static cache whose blocks the prologue loads, the last key
  // head's V loads in two transfers per block or pair (P V of a chunk
  // waits only for its part): after the last byte only P V of the last
  // half remains. (With more blocks the halved runs cost more than this
  // saves.)
  int64_t vParts = 1;
  auto setHead = [&](int64_t headIdx) {
    hs = headIdx % 2;
    vParts = headIdx + 1 == headsAll && staticFull >= 1 &&
                     staticFull < kSlots && chunks % 2 == 0
                 ? 2
                 : 1;
    kBase = headBase(key, headIdx / kvHeads, headIdx % kvHeads, 1);
    vBase = headBase(value, headIdx / kvHeads, headIdx % kvHeads, 1);
  };
  // Slot `slot`'s V: its tile and its column in it.
  auto vTileOf = [&](int64_t slot) {
    if (!pairs)
      return vs[hs * kSlots + slot];
    return vs[(hs * kSlots + (slot + kSlots - pairOff) % kSlots) / 2];
  };
  auto vColOf = [&](int64_t slot) { return pairs ? halfOf(slot) * vW : 0; };
  // Whether block j has a partner (the unpaired block 0 is among the
  // first loads, whose j is a constant).
  auto paired = [&](Value j) {
    return pairs && !(pairOff && getConstantIntValue(j) == 0);
  };
  auto loadFullK = [&](Value j, int64_t slot) {
    auto loadK = [&](Value first, int64_t stride) {
      load(k.view(key.buffer, k.addOffsets(kBase, k.scale(first, ks)),
                  {dim, chunks, unit}, {key.strides[3], ks, stride * ks}),
           k.view(kTs[hs * kSlots + slot], k.index(0), {dim, chunks, unit},
                  {kW, unit, 1}));
    };
    Value first = k.scale(j, blockKeys);
    if (!paired(j))
      return loadK(first, chunks);
    loadK(k.addOffset(first, halfOf(slot) * (chunks - blockKeys)), 2 * chunks);
  };
  // The V of `blocks` blocks from key `first` into slot `slot`'s columns.
  auto loadV = [&](Value first, int64_t slot, int64_t blocks) {
    int64_t all = blocks * chunks, per = all / vParts;
    for (int64_t part = 0; part < vParts; ++part) {
      int64_t n = part + 1 == vParts ? all - part * per : per;
      load(k.view(value.buffer,
                  k.addOffsets(vBase,
                               k.scale(k.addOffset(first, part * per), vst)),
                  {unit, n, vDim}, {all * vst, vst, value.strides[3]}),
           k.view(vTileOf(slot), k.index(vColOf(slot) + part * per * vDim),
                  {unit, n, vDim}, {pairW, vDim, 1}));
    }
  };
  // A pair's V loads with its second block's loads.
  auto loadFullV = [&](Value j, int64_t slot) {
    Value first = k.scale(j, blockKeys);
    if (!paired(j))
      return loadV(first, slot, 1);
    if (halfOf(slot) == 1)
      loadV(k.addOffset(first, -blockKeys), (slot + kSlots - 1) % kSlots, 2);
  };
  auto loadFull = [&](Value j, int64_t slot) {
    loadFullK(j, slot);
    loadFullV(j, slot);
  };
  auto loadRestK = [&] {
    load(k.view(key.buffer, k.addOffsets(kBase, k.scale(restAt, ks)),
                {idx(dim), restKeys}, {key.strides[3], ks}),
         k.view(kTRest[hs], k.index(0), {idx(dim), restKeys}, {kW, 1}));
  };
  auto loadRestV = [&] {
    Value vAt = k.addOffsets(vBase, k.scale(restAt, vst));
    k.ifMore(restChunks, 0, [&] {
      load(k.view(value.buffer, vAt, {idx(unit), restChunks, idx(vDim)},
                  {vst, unit * vst, value.strides[3]}),
           k.view(vRest[hs], k.index(0), {idx(unit), restChunks, idx(vDim)},
                  {vW, vDim, 1}));
    });
    k.ifMore(tail, 0, [&] {
      load(k.view(value.buffer,
                  k.addOffsets(vAt, k.scale(restChunks, unit * vst)),
                  {tail, idx(vDim)}, {vst, value.strides[3]}),
           k.view(vRest[hs], k.scale(restChunks, vDim), {tail, idx(vDim)},
                  {vW, 1}));
    });
  };

  // A block is a full one from stream slot `slot`, or the rest (slot < 0),
  // whose missing chunks and tail partitions keep -huge scores (exp gives
  // 0) and whose matmuls run where keys are. Its work comes in two stages:
  // scores() (S^T and its max per partition) is issued before the previous
  // block's finish(), so TensorE and VectorE work on the next block while
  // the previous one's softmax runs on the other engines.
  auto setOf = [&](int64_t slot) { return 2 * hs + (slot < 0 ? 1 : slot % 2); };
  auto kChunk = [&](int64_t slot, int64_t c) {
    return slot < 0
               ? k.view(kTRest[hs], k.index(c * unit), {dim, unit}, {kW, 1})
               : k.view(kTs[hs * kSlots + slot], k.index(c * unit), {dim, unit},
                        {kW, 1});
  };
  auto vChunk = [&](int64_t slot, int64_t c) {
    return slot < 0
               ? k.view(vRest[hs], k.index(c * vDim), {unit, vDim}, {vW, 1})
               : k.view(vTileOf(slot), k.index(vColOf(slot) + c * vDim),
                        {unit, vDim}, {pairW, 1});
  };
  // Chunk c's body (its column group), for a rest block only when it has
  // chunk c; then the rest block's tail (group 0).
  auto eachChunk = [&](int64_t slot, llvm::function_ref<void(int64_t)> body,
                       llvm::function_ref<void()> tailBody) {
    if (slot >= 0) {
      for (int64_t c = 0; c < chunks; ++c)
        body(c);
      return;
    }
    for (int64_t c = 0; c + 1 < chunks; ++c)
      k.ifMore(restChunks, c, [&] { body(c); });
    k.ifMore(tail, 0, tailBody);
  };
  auto groupOf = [&](int64_t slot, int64_t c) { return slot < 0 ? c + 1 : c; };
  auto scores = [&](int64_t slot) {
    int64_t set = setOf(slot);
    Value qT = qTs[hs];
    Value sAll = ps(set, 0, 0, unit, sW);
    if (slot < 0)
      b.create<nisa::MemsetOp>(
          sAll, APFloat(double(-std::numeric_limits<float>::max() / 2)));
    eachChunk(
        slot,
        [&](int64_t c) {
          b.create<nisa::MatmulOp>(kChunk(slot, c), qT,
                                   ps(set, 0, groupOf(slot, c) * rows, unit,
                                      rows));
        },
        [&] {
          b.create<nisa::MatmulOp>(
              k.view(kTRest[hs], k.scale(restChunks, unit), {idx(dim), tail},
                     {kW, 1}),
              qT,
              k.view(sBanks[set], k.index(0), {tail, idx(rows)}, {bank, 1}));
        });
  };
  auto maxTree = [&](int64_t slot) {
    int64_t set = setOf(slot);
    // Max per (partition, row) over the column groups in bf16, halving
    // their count (an odd middle group is compared twice: max is
    // idempotent) between the two halves of `tree`: first the leading
    // groups from PSUM against the trailing ones copied by ScalarE (VectorE
    // reads one PSUM operand); the last level onto maxRows.
    Value maxRows = maxB[set];
    auto groupsView = [&](Value t, int64_t at, int64_t n, int64_t width) {
      return k.view(t, k.index(at), {unit, n * rows}, {width, 1});
    };
    int64_t m = chunks, h = m / 2, n = m - h;
    b.create<nisa::CopyOp>(groupsView(sBanks[set], h * rows, n, bank),
                           groupsView(tree, 0, n, 2 * treeW),
                           nisa::Engine::scalar);
    Value a = groupsView(sBanks[set], 0, n, bank);
    Value bOp = groupsView(tree, 0, n, 2 * treeW);
    for (int64_t half = 1;; half ^= 1) {
      Value dst = n == 1 ? maxRows : groupsView(tree, half * treeW, n, 2 * treeW);
      b.create<nisa::TensorTensorOp>(nisa::AluOp::max, a, bOp, dst);
      if (n == 1)
        break;
      m = n;
      h = m / 2;
      n = m - h;
      a = groupsView(tree, half * treeW, n, 2 * treeW);
      bOp = groupsView(tree, half * treeW + h * rows, n, 2 * treeW);
    }
  };
  // The softmax of a block in two parts: its max M and diag(M) (softMax),
  // then S^T - M and the exp (softExp; `between` before the exp).
  auto softMax = [&](int64_t slot) {
    int64_t set = setOf(slot);
    Value maxRows = maxB[set];
    // Across the partitions: max^T [rows, 128], its row max M (a bf16
    // value), diag(M) repeated over `dgGroups` column groups, then -1s^T
    // times it added to S^T: S^T - M in every group, exact in fp32.
    b.create<nisa::MatmulOp>(maxRows, ident, ps(set, 1, maxTCol, rows, unit));
    Value m = maxR[set];
    b.create<nisa::TensorReduceOp>(nisa::AluOp::max,
                                   ps(set, 1, maxTCol, rows, unit), m);
    Value dg = diag[set];
    b.create<nisa::TensorScalarOp>(
        nisa::AluOp::multiply,
        k.view(ident, k.index(0), {rows, dgGroups, rows}, {unit, 0, 1}),
        k.view(dg, k.index(0), {rows, dgGroups, rows}, {dgW, rows, 1}), m,
        APFloat(0.0), false);
  };
  auto softExp = [&](int64_t slot, llvm::function_ref<void()> between) {
    int64_t set = setOf(slot);
    Value dg = diag[set];
    for (int64_t g = 0; g < chunks; g += dgGroups)
      b.create<nisa::MatmulOp>(negOnes, dg, ps(set, 0, g * rows, unit, dgW))
          .setAccumulate(true);
    between();
    // P^T = exp(scale * (S^T - M)), read from PSUM, in two halves when
    // long, so that P V starts on the first while ScalarE does the second.
    int64_t expParts = sW >= 256 ? 2 : 1, partW = sW / expParts;
    for (int64_t e = 0; e < expParts; ++e)
      b.create<nisa::ActivationOp>(
          ps(set, 0, e * partW, unit,
             e + 1 == expParts ? sW - e * partW : partW),
          k.view(pTs[set], k.index(e * partW),
                 {unit, e + 1 == expParts ? sW - e * partW : partW}, {sW, 1}),
          Value(), nisa::ActivationFn::exp, APFloat(scale), APFloat(0.0));
  };
  auto soft = [&](int64_t slot, llvm::function_ref<void()> between) {
    softMax(slot);
    softExp(slot, between);
  };
  // `midway` runs between the P V matmuls of the first and the second half
  // of the chunks, `afterPV` after them (a full block's only).
  auto pvCombine = [&](int64_t slot, llvm::function_ref<void()> midway,
                       llvm::function_ref<void()> afterPV) {
    bool rest = slot < 0;
    int64_t set = setOf(slot);
    Value m = maxR[set];
    // O = P V and the row sums l = P 1, accumulated over the chunks.
    Value oPs = ps(set, 1, oCol, rows, vDim), lPs = ps(set, 1, lCol, rows, 1);
    if (rest) {
      b.create<nisa::MemsetOp>(oPs, APFloat(0.0));
      b.create<nisa::MemsetOp>(lPs, APFloat(0.0));
    }
    auto pv = [&](Value p, Value v, Value one, bool accumulate) {
      auto mo = b.create<nisa::MatmulOp>(p, v, oPs);
      auto ml = b.create<nisa::MatmulOp>(p, one, lPs);
      mo.setAccumulate(accumulate);
      ml.setAccumulate(accumulate);
    };
    eachChunk(
        slot,
        [&](int64_t c) {
          if (c == chunks / 2 && !rest)
            midway();
          pv(k.view(pTs[set], k.index(groupOf(slot, c) * rows), {unit, rows},
                    {sW, 1}),
             vChunk(slot, c), ones, rest || c > 0);
        },
        [&] {
          pv(k.view(pTs[set], k.index(0), {tail, idx(rows)}, {sW, 1}),
             k.view(vRest[hs], k.scale(restChunks, vDim), {tail, idx(vDim)},
                    {vW, 1}),
             k.view(ones, k.index(0), {tail, idx(1)}, {1, 1}), true);
        });
    if (!rest)
      afterPV();

    // Combine with the key head's state by log-sum-exp: -m' = min(-m_b,
    // -m), O = O exp(m - m') + O_b exp(m_b - m'), l likewise.
    Value negm = negms[hs], l = ls[hs], o = os[hs];
    Value mb = col(factors, 4, 0), next = col(factors, 4, 1),
          alpha = col(factors, 4, 2), beta = col(factors, 4, 3);
    b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, m, mb, Value(),
                                   APFloat(-scale), false);
    b.create<nisa::TensorTensorOp>(nisa::AluOp::min, mb, negm, next,
                                   nisa::Engine::gpsimd);
    b.create<nisa::ActivationOp>(negm, alpha, next, nisa::ActivationFn::exp,
                                 APFloat(-1.0), APFloat(0.0));
    b.create<nisa::ActivationOp>(mb, beta, next, nisa::ActivationFn::exp,
                                 APFloat(-1.0), APFloat(0.0));
    b.create<nisa::CopyOp>(next, negm, nisa::Engine::gpsimd);
    Value oB = k.view(scaled, k.index(0), {rows, vDim}, {vDim + 1, 1});
    Value lB = k.view(scaled, k.index(vDim), {rows, 1}, {vDim + 1, 1});
    b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, oPs, oB, beta,
                                   APFloat(0.0), false);
    b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, lPs, lB, beta,
                                   APFloat(0.0), false);
    scalarTensorTensor(o, alpha, 0.0, nisa::AluOp::multiply, oB,
                       nisa::AluOp::add, o, nisa::Engine::gpsimd);
    scalarTensorTensor(l, alpha, 0.0, nisa::AluOp::multiply, lB,
                       nisa::AluOp::add, l, nisa::Engine::gpsimd);
  };

  // `body` once if `count` is 0 (a loop of zero or one iteration).
  auto ifNone = [&](Value count, llvm::function_ref<void()> body) {
    Value some = b.create<arith::MinSIOp>(
        b.create<arith::MaxSIOp>(count, k.index(0)), k.index(1));
    k.ifMore(b.create<arith::SubIOp>(k.index(1), some), 0, body);
  };
  int64_t headNow = 0;   // the key head whose blocks are being finished
  int64_t stageHead = 0; // the key head of the block a stage is for
  // `stage` of key head `headIdx`'s first block (the rest, else full
  // block 0), if there is such a head.
  auto firstBlock = [&](int64_t headIdx,
                        llvm::function_ref<void(int64_t)> stage) {
    if (headIdx >= headsAll)
      return;
    // The stages read only the head slot's tiles: no other state to set
    // (the head's base offsets would be defined inside this region).
    int64_t current = hs, currentHead = stageHead;
    hs = headIdx % 2;
    stageHead = headIdx;
    k.ifMore(restKeys, 0, [&] { stage(-1); });
    ifNone(restKeys, [&] { k.ifMore(fullBlocks, 0, [&] { stage(0); }); });
    hs = current;
    stageHead = currentHead;
  };
  // The last head's block of a one-block cache has its softmax (soft) done
  // as the next block, before the previous head's P V: its K^T comes well
  // before the V that P V waits for.
  auto softStage = [&](int64_t slot) {
    if (oneBlock && stageHead == headsAll - 1)
      soft(slot, [] {});
  };
  // The gathered rows, into the result: all but the last head's when it is
  // stored alone.
  bool gatheredEarly = false;
  auto storeGathered = [&] {
    int64_t w = perPart * vDim,
            parts = lastAlone ? baseOf(headsAll - 1) / perPart : unit;
    for (int64_t e = 0; e < perPart; ++e)
      b.create<nisa::CopyOp>(
          ps(e, 1, bank - vDim, parts, vDim),
          k.view(gathered, k.index(e * vDim), {parts, vDim}, {w, 1}),
          nisa::Engine::vector);
    store(k.view(gathered, k.index(0), {parts, w}, {w, 1}),
          k.view(out, k.index(0), {parts, w}, {w, 1}));
  };
  // With a static cache of whole blocks that the prologue loads, how many
  // blocks the last key head has from the one in `slot` on (0 otherwise).
  const bool tailKnown = staticKeys && *staticKeys % blockKeys == 0 &&
                         staticFull >= 2 && staticFull < kSlots;
  auto lastBlocks = [&](int64_t slot) -> int64_t {
    return tailKnown && headNow == headsAll - 1 && slot >= 0 &&
                   slot < staticFull
               ? staticFull - slot
               : 0;
  };
  // Finishes a block between the next one's stages: TensorE computes the
  // next scores before this block's max^T, P V and row sums, VectorE the
  // next max tree after this block's max and diag(M), so neither waits on
  // the other's work of the same block (unless its soft already ran).
  auto finishBefore = [&](int64_t slot,
                          llvm::function_ref<void(
                              llvm::function_ref<void(int64_t)>)>
                              next) {
    next(scores);
    if ((oneBlock || lastBlocks(slot) == 1) && headNow == headsAll - 1)
      next(maxTree);
    else
      soft(slot, [&] { next(maxTree); });
    if (oneBlock) // no empty regions where no head is eager
      next(softStage);
    if (lastBlocks(slot) != 2)
      return pvCombine(slot, [] {}, [] {});
    // The last block's softmax runs under this one's P V: its max after
    // the first half of the chunks, its exp after the second. The heads
    // before the last are stored then, while TensorE waits for that exp.
    pvCombine(
        slot, [&] { next(softMax); },
        [&] {
          next([&](int64_t s) { softExp(s, [] {}); });
          if (gather && lastAlone) {
            gatherHead(headNow - 1);
            storeGathered();
            gatheredEarly = true;
          }
        });
  };

  // What a key head needs before its blocks: Q^T, its state, the rest
  // block's and the first full blocks' K^T (prologueK), then their V
  // (prologueV). Emitted before the previous head's blocks, so the loads
  // run under them; a head's V after the next head's K^T, so the scores,
  // max and exp of a head's last blocks run while their V still loads and
  // only P V, the combine and the store follow the last transfer.
  auto prologueK = [&](int64_t headIdx) {
    setHead(headIdx);
    int64_t bi = headIdx / kvHeads, hk = headIdx % kvHeads;
    load(k.view(q.buffer, headBase(q, bi, hk, group), {dim, group, qLen},
                {q.strides[3], q.strides[1], q.strides[2]}),
         k.view(qTs[hs], k.index(0), {dim, group, qLen}, {rows, qLen, 1}));
    b.create<nisa::MemsetOp>(
        negms[hs], APFloat(double(std::numeric_limits<float>::max())));
    b.create<nisa::MemsetOp>(ls[hs], APFloat(0.0));
    b.create<nisa::MemsetOp>(os[hs], APFloat(0.0));
    k.ifMore(restKeys, 0, loadRestK);
    k.pipelinedDynamicFirstLoads(fullBlocks, kSlots, loadFullK);
  };
  auto prologueV = [&](int64_t headIdx) {
    setHead(headIdx);
    k.ifMore(restKeys, 0, loadRestV);
    k.pipelinedDynamicFirstLoads(fullBlocks, kSlots, loadFullV);
  };
  // The key head's blocks (the rest, loaded first, then the full ones),
  // each finished after the next block's scores (the next key head's first
  // block after the last), and results: out = O / l; lse = log(l) + max.
  auto body = [&](int64_t headIdx) {
    setHead(headIdx);
    headNow = stageHead = headIdx;
    int64_t bi = headIdx / kvHeads, hk = headIdx % kvHeads;
    k.ifMore(restKeys, 0, [&] {
      finishBefore(-1, [&](llvm::function_ref<void(int64_t)> stage) {
        k.ifMore(fullBlocks, 0, [&] { stage(0); });
        ifNone(fullBlocks, [&] { firstBlock(headIdx + 1, stage); });
      });
    });
    k.forEachPipelinedDynamic(
        fullBlocks, kSlots, loadFull,
        [&](Value, int64_t slot, Value after) {
          finishBefore(slot, [&](llvm::function_ref<void(int64_t)> stage) {
            int64_t nextSlot = (slot + 1) % kSlots;
            if (!after)
              return stage(nextSlot);
            k.ifMore(after, 0, [&] { stage(nextSlot); });
            ifNone(after, [&] { firstBlock(headIdx + 1, stage); });
          });
        },
        /*firstLoads=*/false);
    Value l = ls[hs], oOut = oOuts[hs];
    b.create<nisa::TensorScalarOp>(nisa::AluOp::divide, os[hs], oOut, l,
                                   APFloat(0.0), false, nisa::Engine::gpsimd);
    // A head's rows join the gathered ones a head late, so that TensorE
    // does not wait for its combine; after the last head, all are stored.
    if (gather && headIdx > 0 && !gatheredEarly)
      gatherHead(headIdx - 1);
    if (gather && headIdx + 1 == headsAll && !gatheredEarly) {
      if (!lastAlone)
        gatherHead(headIdx);
      storeGathered();
    }
    // Else the query heads' rows in one store when they are evenly spaced.
    bool oneStore = qLen == 1 || outStrides[1] == qLen * outStrides[2];
    int64_t rowStride = qLen == 1 ? outStrides[1] : outStrides[2];
    int64_t stores = gather && !(lastAlone && headIdx + 1 == headsAll) ? 0
                     : oneStore                                        ? 1
                                                                       : group;
    for (int64_t g = 0; g < stores; ++g) {
      int64_t n = oneStore ? rows : qLen;
      int64_t to = bi * outStrides[0] + (hk * group + g) * outStrides[1];
      store(k.view(oOut, k.index(g * qLen * vDim), {n, vDim}, {vDim, 1}),
            k.view(out, k.index(to), {n, vDim}, {rowStride, 1}));
    }
    if (!lse)
      return;
    b.create<nisa::ActivationOp>(l, lt, Value(), nisa::ActivationFn::log,
                                 APFloat(1.0), APFloat(0.0));
    b.create<nisa::TensorTensorOp>(nisa::AluOp::subtract, lt, negms[hs], lt,
                                   nisa::Engine::gpsimd);
    int64_t to = bi * lseStrides[0] + hk * group * lseStrides[1];
    store(lt, k.view(lse, k.index(to), {rows, 1}, {lseStrides[2], 1}));
  };
  prologueK(0);
  firstBlock(0, scores);
  firstBlock(0, maxTree);
  if (oneBlock)
    firstBlock(0, softStage);
  if (!oneBlock)
    prologueV(0);
  for (int64_t headIdx = 0; headIdx < headsAll; ++headIdx) {
    if (headIdx + 1 < headsAll) {
      prologueK(headIdx + 1);
      if (!oneBlock)
        prologueV(headIdx + 1);
    }
    if (oneBlock)
      prologueV(headIdx);
    body(headIdx);
  }
  return success();
}

} // namespace mlir::neuron::flex
