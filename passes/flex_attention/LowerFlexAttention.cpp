//===- LowerFlexAttention.cpp - neuron.flex_attention -> flash attention --===//
//
// One blockwise flash-attention kernel per neuron.flex_attention:
//  - per (batch, key head): K^T (head dim on the partitions) and V (key
//    rows on the partitions) stay in SBUF, K transposed on TensorE; the
//    next head's K and V load while this head computes;
//  - per query head of that key head (GQA) and 128-row query tile: Q^T by a
//    TensorE transpose, then the tile's key tiles, each up to 512 keys of
//    the blocks the BlockMask keeps. Fully masked blocks are never visited;
//    full blocks skip mask_mod;
//  - per key tile: S = Q K^T in a PSUM bank; score_mod and mask_mod as
//    VectorE/ScalarE/GpSimd instructions on the tile (indices from iota,
//    captured tensors by DMA); the online softmax: running max and sum in
//    fp32, P = exp(S - max) on ScalarE summing its rows as it goes; P^T on
//    TensorE; O += P V accumulated in PSUM and rescaled on VectorE.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"

#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <limits>

namespace mlir::neuron {

namespace {

/// The attention kernel works on 128 x 128 blocks ("units") of the score
/// matrix whatever the BlockMask's block size.
constexpr int64_t kUnit = 128;

enum class Kind : int8_t { masked = 0, partial = 1, full = 2 };

/// One key tile of a query tile: keys [firstUnit * 128, + width).
struct KvTile {
  int64_t firstUnit;
  int64_t units;
  int64_t width;
  bool partial;
  bool sameShape(const KvTile &o) const {
    return units == o.units && width == o.width && partial == o.partial;
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

} // namespace

class FlexAttentionLowering {
public:
  FlexAttentionLowering(KernelLowering &k, FlexAttentionOp op)
      : k(k), b(k.b), op(op) {}
  LogicalResult run();

private:
  /// Where a key step is: loop indices (index values) and static sizes.
  struct Step {
    Value batch, head; // query head
    Value q0;          // first query row
    Value unit;        // first key unit (128 keys)
    int64_t rows = 0, width = 0;
  };

  SmallVector<SmallVector<Kind>> unitKinds(int64_t bm, int64_t hm) const;
  SmallVector<Operand> tableOperands(ValueRange buffers);
  SmallVector<KvTile> keyTiles(ArrayRef<Kind> row) const;
  void loadKeys(Value batchIdx, Value kvHead, int64_t slot);
  void queryHeads(Value batchIdx, Value kvHead, int64_t bm, int64_t slot);
  void queryTile(const Step &at, int64_t slot, ArrayRef<KvTile> tiles);
  void keyStep(const Step &at, const KvTile &tile, int64_t parity, Value qTs,
               Value negmOld, Value negmNew, Value ls, Value os);
  void scalarTensorTensor(Value a, Value sCol, double sImm, nisa::AluOp op0,
                          Value other, nisa::AluOp op1, Value dst,
                          nisa::Engine engine);
  void expWithRowSum(Value src, Value p, double scale, Value bias,
                     Value rowSums);

  // Modifiers.
  FailureOr<Operand> modifier(Region &region, ArrayRef<Operand> args,
                              const Step &at);
  Value materialize(const Operand &v, const Step &at, bool asFull);
  Value iota(const Affine &a, const Step &at, bool asFull);
  Value indexValue(const Affine &a, const Step &at);

  KernelLowering &k;
  OpBuilder &b;
  FlexAttentionOp op;
  bool failed = false;

  int64_t batch = 0, heads = 0, kvHeads = 0, group = 0;
  int64_t qLen = 0, kvLen = 0, dim = 0, vDim = 0;
  int64_t kvUnits = 0, bank = 0, kvSlots = 1;
  bool plainScores = false;       // score_mod returns the score unchanged
  SmallVector<int8_t> blockKinds; // the blocks attribute, row-major
  ArrayRef<int64_t> blocksShape;
  int64_t qBlock = 0, kvBlock = 0;
  // The modifiers' arguments but the score: b, h, q_idx, kv_idx, then the
  // captured tensors (resolved before any loop is emitted).
  SmallVector<Operand> scoreArgs, maskArgs;
  Type inElt, f32;
  KernelLowering::Window q, key, value;
  Value out, lse;
  SmallVector<int64_t> outStrides, lseStrides;
  // Kernel-wide tiles; the pairs alternate between consecutive query tiles
  // or key steps so they overlap.
  Value ident, negInf;
  Value scorePsum, ptPsum, outPsum, miscPsum;
  Value qIn, qT, oOut, negm, l, o, lc, lseTile;
  Value kT, vS; // K^T [dim, slots x keys], V [128, slots x units x vDim]
  int64_t kTStride = 0, vSStride = 0;
  int64_t kvSlot = 0; // the slot of the key head being computed
};

//===----------------------------------------------------------------------===//
// Block structure
//===----------------------------------------------------------------------===//

/// The kind of every 128 x 128 unit for (b, h) of the blocks attribute
/// (masked, full, or partial when it overlaps blocks of different kinds or
/// a partial block).
SmallVector<SmallVector<Kind>>
FlexAttentionLowering::unitKinds(int64_t bm, int64_t hm) const {
  ArrayRef<int64_t> shape = blocksShape;
  int64_t qb = qBlock, kb = kvBlock;
  auto at = [&](int64_t i, int64_t j) {
    return (
        Kind)blockKinds[((bm * shape[1] + hm) * shape[2] + i) * shape[3] + j];
  };
  int64_t qTiles = (qLen + kUnit - 1) / kUnit;
  SmallVector<SmallVector<Kind>> kinds(
      qTiles, SmallVector<Kind>(kvUnits, Kind::masked));
  for (int64_t t = 0; t < qTiles; ++t) {
    int64_t qFirst = t * kUnit / qb;
    int64_t qLast = (std::min(qLen, (t + 1) * kUnit) - 1) / qb;
    for (int64_t u = 0; u < kvUnits; ++u) {
      int64_t kFirst = u * kUnit / kb;
      int64_t kLast = (std::min(kvLen, (u + 1) * kUnit) - 1) / kb;
      bool any = false, allFull = true;
      for (int64_t i = qFirst; i <= qLast; ++i)
        for (int64_t j = kFirst; j <= kLast; ++j) {
          Kind kind = at(i, j);
          any |= kind != Kind::masked;
          allFull &= kind == Kind::full;
        }
      kinds[t][u] = !any ? Kind::masked : allFull ? Kind::full : Kind::partial;
    }
  }
  return kinds;
}

/// The key tiles of one query tile: runs of consecutive unmasked units of
/// one kind, up to a PSUM bank of fp32 scores (512) each.
SmallVector<KvTile> FlexAttentionLowering::keyTiles(ArrayRef<Kind> row) const {
  int64_t maxUnits = std::max<int64_t>(
      1, std::min(k.target.matmulMaxMovingFree, k.target.psumBankBytes / 4) /
             kUnit);
  SmallVector<KvTile> tiles;
  for (int64_t u = 0; u < (int64_t)row.size();) {
    if (row[u] == Kind::masked) {
      ++u;
      continue;
    }
    int64_t first = u;
    while (u < (int64_t)row.size() && row[u] == row[first] &&
           u - first < maxUnits)
      ++u;
    int64_t width = std::min(kvLen, u * kUnit) - first * kUnit;
    tiles.push_back({first, u - first, width, row[first] == Kind::partial});
  }
  return tiles;
}

//===----------------------------------------------------------------------===//
// Modifiers: score_mod and mask_mod on a tile of scores
//===----------------------------------------------------------------------===//

Value FlexAttentionLowering::indexValue(const Affine &a, const Step &at) {
  Value v = k.index(0);
  auto term = [&](Value x, int64_t c) {
    if (c != 0)
      v = k.addOffsets(v, k.scale(x, c));
  };
  term(at.batch, a.cb);
  term(at.head, a.ch);
  term(at.q0, a.cq);
  if (a.ckv != 0)
    term(k.scale(at.unit, kUnit), a.ckv);
  return v;
}

/// An affine index as fp32 values: a column (no kv term) or a tile.
Value FlexAttentionLowering::iota(const Affine &a, const Step &at,
                                  bool asFull) {
  bool full = asFull || a.ckv != 0;
  Value t = k.tile(MemorySpace::sbuf, {at.rows, full ? at.width : 1}, f32);
  b.create<nisa::IotaOp>(k.loc, t, indexValue(a, at), APFloat((double)a.c0),
                         APFloat((double)a.cq),
                         ArrayRef<double>{(double)a.ckv});
  return t;
}

/// A modifier value as an SBUF tile ([rows, 1] columns stay columns unless
/// `asFull`).
Value FlexAttentionLowering::materialize(const Operand &v, const Step &at,
                                         bool asFull) {
  switch (v.kind) {
  case Operand::imm: {
    Value t = k.tile(MemorySpace::sbuf, {at.rows, asFull ? at.width : 1}, f32);
    b.create<nisa::MemsetOp>(k.loc, t, APFloat(v.value));
    return t;
  }
  case Operand::index:
    return iota(v.affine, at, asFull);
  case Operand::column: {
    if (!asFull)
      return v.tile;
    Value t = k.tile(MemorySpace::sbuf, {at.rows, at.width}, f32);
    b.create<nisa::MemsetOp>(k.loc, t, APFloat(0.0));
    b.create<nisa::TensorScalarOp>(k.loc, nisa::AluOp::add, t, t, v.tile,
                                   APFloat(0.0), false);
    return t;
  }
  case Operand::full:
    return v.tile;
  case Operand::table:
    break;
  }
  llvm_unreachable("a captured tensor is not a value");
}

/// Emits `region` on the tile of step `at`; `args` stand for its block
/// arguments. Fails (with an error at the offending op) on what the device
/// cannot compute per element.
FailureOr<Operand> FlexAttentionLowering::modifier(Region &region,
                                                   ArrayRef<Operand> args,
                                                   const Step &at) {
  DenseMap<Value, Operand> values;
  Block &body = region.front();
  for (auto [arg, v] : llvm::zip(body.getArguments(), args))
    values[arg] = v;
  auto isAffine = [](const Operand &v) {
    return v.kind == Operand::index ||
           (v.kind == Operand::imm && v.value == std::floor(v.value) &&
            std::abs(v.value) < (1ll << 40));
  };
  auto affineOf = [](const Operand &v) {
    if (v.kind == Operand::index)
      return v.affine;
    Affine a;
    a.c0 = (int64_t)v.value;
    return a;
  };
  for (Operation &inner : body.without_terminator()) {
    Location saved = k.loc;
    k.loc = inner.getLoc();
    auto fail = [&](const Twine &why) -> FailureOr<Operand> {
      inner.emitOpError(why);
      k.loc = saved;
      return failure();
    };
    auto get = [&](Value v) { return values.lookup(v); };
    Operand result;
    if (auto c = dyn_cast<ConstantOp>(inner)) {
      auto attr = dyn_cast<DenseElementsAttr>(c.getValue());
      if (!attr || !attr.isSplat())
        return fail("a non-scalar constant in a modifier");
      Type elt = attr.getElementType();
      result.value = isa<FloatType>(elt)
                         ? attr.getSplatValue<APFloat>().convertToDouble()
                     : elt.isInteger(1)
                         ? (double)attr.getSplatValue<bool>()
                         : (double)attr.getSplatValue<APInt>().getSExtValue();
    } else if (auto castOp = dyn_cast<CastOp>(inner)) {
      // The engines compute in fp32: a cast changes nothing but float ->
      // integer truncation.
      result = get(castOp.getInput());
      bool toInt =
          !isa<FloatType>(tensorType(castOp.getResult()).getElementType());
      bool fromFloat =
          isa<FloatType>(tensorType(castOp.getInput()).getElementType());
      if (toInt && fromFloat) {
        if (result.kind == Operand::imm) {
          result.value = std::trunc(result.value);
        } else {
          Value src = materialize(result, at, false);
          Value t = k.tile(MemorySpace::sbuf,
                           cast<MemRefType>(src.getType()).getShape(), f32);
          b.create<nisa::ActivationOp>(k.loc, src, t, Value(),
                                       nisa::ActivationFn::trunc, APFloat(1.0),
                                       APFloat(0.0));
          result.kind = cast<MemRefType>(src.getType()).getShape()[1] == 1
                            ? Operand::column
                            : Operand::full;
          result.tile = t;
        }
      }
    } else if (auto reshape = dyn_cast<ReshapeOp>(inner)) {
      result = get(reshape.getInput());
      if (result.kind != Operand::table &&
          tensorType(reshape.getResult()).getNumElements() != 1)
        return fail("reshapes only captured tensors");
    } else if (auto gather = dyn_cast<GatherOp>(inner)) {
      Operand table = get(gather.getTable());
      Operand idx = get(gather.getIndices());
      if (table.kind != Operand::table || !isAffine(idx))
        return fail("indexes a captured tensor with an index that is not an "
                    "affine function of b, h, q_idx and kv_idx");
      Affine a = affineOf(idx);
      // The index's range over the whole kernel must lie in the tensor.
      int64_t lo = a.c0, hi = a.c0;
      auto span = [&](int64_t c, int64_t n) {
        (c < 0 ? lo : hi) += c * (n - 1);
      };
      span(a.cb, batch);
      span(a.ch, heads);
      span(a.cq, qLen);
      span(a.ckv, kvLen);
      if (lo < 0 || hi >= table.elements)
        return fail("indexes a captured tensor of " + Twine(table.elements) +
                    " elements at " + Twine(lo) + ".." + Twine(hi) +
                    " (out of bounds)");
      if (a.cq < 0 || a.ckv < 0)
        return fail("indexes a captured tensor backwards along q_idx or "
                    "kv_idx (not supported yet)");
      bool full = a.ckv != 0;
      Value t = k.tile(MemorySpace::sbuf, {at.rows, full ? at.width : 1}, f32);
      Value offset = k.addOffset(indexValue(a, at), table.offset + a.c0);
      k.dma(k.view(table.buffer, offset, {at.rows, full ? at.width : 1},
                   {a.cq, full ? a.ckv : 1}),
            t);
      result.kind = full ? Operand::full : Operand::column;
      result.tile = t;
    } else if (auto unary = dyn_cast<UnaryOp>(inner)) {
      Operand x = get(unary.getInput());
      if (x.kind == Operand::table)
        return fail("applies a function to a whole captured tensor");
      Value src = materialize(x, at, false);
      auto shape = cast<MemRefType>(src.getType()).getShape();
      Value t = k.tile(MemorySpace::sbuf, shape, f32);
      b.create<nisa::ActivationOp>(k.loc, src, t, Value(),
                                   activationFor(unary.getFn()), APFloat(1.0),
                                   APFloat(0.0));
      result.kind = shape[1] == 1 ? Operand::column : Operand::full;
      result.tile = t;
    } else if (auto bin = dyn_cast<BinaryOp>(inner)) {
      Operand l = get(bin.getLhs()), r = get(bin.getRhs());
      if (l.kind == Operand::table || r.kind == Operand::table)
        return fail("computes with a whole captured tensor");
      BinaryFn fn = bin.getFn();
      bool isInt = !isa<FloatType>(tensorType(bin.getLhs()).getElementType());
      // Index arithmetic stays symbolic while it is affine.
      if (isInt && isAffine(l) && isAffine(r) &&
          (l.kind == Operand::index || r.kind == Operand::index) &&
          (fn == BinaryFn::add || fn == BinaryFn::sub ||
           (fn == BinaryFn::mul &&
            (l.kind == Operand::imm || r.kind == Operand::imm)))) {
        Affine x = affineOf(l), y = affineOf(r), z;
        if (fn == BinaryFn::mul) {
          const Affine &a = l.kind == Operand::imm ? y : x;
          int64_t c = l.kind == Operand::imm ? x.c0 : y.c0;
          z = {a.c0 * c, a.cb * c, a.ch * c, a.cq * c, a.ckv * c};
        } else {
          int64_t s = fn == BinaryFn::add ? 1 : -1;
          z = {x.c0 + s * y.c0, x.cb + s * y.cb, x.ch + s * y.ch,
               x.cq + s * y.cq, x.ckv + s * y.ckv};
        }
        result.kind = Operand::index;
        result.affine = z;
      } else if (l.kind == Operand::imm && r.kind == Operand::imm) {
        return fail("computes with constants only (fold it in Python)");
      } else {
        nisa::AluOp alu = aluFor(fn);
        bool lTile = l.kind == Operand::full ||
                     (l.kind == Operand::index && l.affine.ckv != 0);
        bool rTile = r.kind == Operand::full ||
                     (r.kind == Operand::index && r.affine.ckv != 0);
        bool full = lTile || rTile;
        Value t =
            k.tile(MemorySpace::sbuf, {at.rows, full ? at.width : 1}, f32);
        if (l.kind == Operand::imm || r.kind == Operand::imm) {
          bool reverse = l.kind == Operand::imm;
          Value src = materialize(reverse ? r : l, at, false);
          b.create<nisa::TensorScalarOp>(k.loc, alu, src, t, Value(),
                                         APFloat(reverse ? l.value : r.value),
                                         reverse);
        } else if (lTile != rTile) {
          // A column operand is the per-partition scalar.
          bool reverse = !lTile;
          Value src = materialize(reverse ? r : l, at, false);
          Value col = materialize(reverse ? l : r, at, false);
          b.create<nisa::TensorScalarOp>(k.loc, alu, src, t, col, APFloat(0.0),
                                         reverse);
        } else {
          b.create<nisa::TensorTensorOp>(k.loc, alu, materialize(l, at, false),
                                         materialize(r, at, false), t);
        }
        result.kind = full ? Operand::full : Operand::column;
        result.tile = t;
      }
    } else if (auto sel = dyn_cast<SelectOp>(inner)) {
      Operand c = get(sel.getCond()), x = get(sel.getOnTrue()),
              y = get(sel.getOnFalse());
      if (c.kind == Operand::table || x.kind == Operand::table ||
          y.kind == Operand::table)
        return fail("selects whole captured tensors");
      Value t = k.tile(MemorySpace::sbuf, {at.rows, at.width}, f32);
      b.create<nisa::SelectOp>(k.loc, materialize(c, at, true),
                               materialize(x, at, true),
                               materialize(y, at, true), t);
      result.kind = Operand::full;
      result.tile = t;
    } else {
      return fail("is not supported in a FlexAttention modifier");
    }
    k.loc = saved;
    values[inner.getResult(0)] = result;
  }
  return values.lookup(cast<YieldOp>(body.getTerminator()).getValues()[0]);
}

//===----------------------------------------------------------------------===//
// The kernel
//===----------------------------------------------------------------------===//

/// K^T [dim, keys] and V [128 keys, units x vDim] of one (batch, key head)
/// into slot `slot`: one DMA each (on ScalarE's queue, so they never wait
/// behind the query tiles' transfers), K transposed on TensorE.
void FlexAttentionLowering::loadKeys(Value batchIdx, Value kvHead,
                                     int64_t slot) {
  int64_t fullUnits = kvLen / kUnit, rest = kvLen % kUnit;
  auto base = [&](const KernelLowering::Window &w) {
    return k.addOffsets(k.addOffset(k.scale(batchIdx, w.strides[0]), w.offset),
                        k.scale(kvHead, w.strides[1]));
  };
  Value kBase = base(key), vBase = base(value);
  int64_t ks = key.strides[2], kd = key.strides[3];
  int64_t vs = value.strides[2], vd = value.strides[3];
  KernelLowering::TileScope scope(k);
  // K rows land on the partitions (unit u at columns u * dim), as V's do.
  Value kIn = k.tile(MemorySpace::sbuf, {kUnit, kvUnits * dim}, inElt);
  int64_t vAt = slot * kvUnits * vDim;
  auto load = [&](Value src, Value dst) {
    b.create<nisa::DmaCopyOp>(k.loc, src, dst, nisa::Engine::scalar);
  };
  if (fullUnits) {
    load(k.view(key.buffer, kBase, {kUnit, fullUnits, dim},
                {ks, kUnit * ks, kd}),
         k.view(kIn, k.index(0), {kUnit, fullUnits, dim},
                {kvUnits * dim, dim, 1}));
    load(k.view(value.buffer, vBase, {kUnit, fullUnits, vDim},
                {vs, kUnit * vs, vd}),
         k.view(vS, k.index(vAt), {kUnit, fullUnits, vDim},
                {vSStride, vDim, 1}));
  }
  if (rest) {
    load(
        k.view(key.buffer, k.addOffset(kBase, fullUnits * kUnit * ks),
               {rest, dim}, {ks, kd}),
        k.view(kIn, k.index(fullUnits * dim), {rest, dim}, {kvUnits * dim, 1}));
    load(k.view(value.buffer, k.addOffset(vBase, fullUnits * kUnit * vs),
                {rest, vDim}, {vs, vd}),
         k.view(vS, k.index(vAt + fullUnits * vDim), {rest, vDim},
                {vSStride, 1}));
  }
  // A PSUM bank takes four transposed units; one copy per bank.
  int64_t perBank = std::max<int64_t>(1, bank / kUnit);
  for (int64_t u0 = 0; u0 < kvUnits; u0 += perBank) {
    int64_t n = std::min(perBank, kvUnits - u0);
    int64_t cols = std::min(kvLen, (u0 + n) * kUnit) - u0 * kUnit;
    int64_t at = ((u0 / perBank) % 2) * bank;
    for (int64_t u = u0; u < u0 + n; ++u) {
      int64_t rows = std::min(kUnit, kvLen - u * kUnit);
      b.create<nisa::MatmulOp>(
          k.loc, k.view(kIn, k.index(u * dim), {rows, dim}, {kvUnits * dim, 1}),
          k.view(ident, k.index(0), {rows, rows}, {kUnit, 1}),
          k.view(miscPsum, k.index(at + (u - u0) * kUnit), {dim, rows},
                 {2 * bank, 1}));
    }
    b.create<nisa::CopyOp>(
        k.loc, k.view(miscPsum, k.index(at), {dim, cols}, {2 * bank, 1}),
        k.view(kT, k.index(slot * kvUnits * kUnit + u0 * kUnit), {dim, cols},
               {kTStride, 1}),
        (u0 / perBank) % 2 ? nisa::Engine::scalar : nisa::Engine::vector);
  }
}

/// Captured tensors as flat tables: their buffers, contiguous (a strided
/// window is copied once, here, outside every loop).
SmallVector<Operand> FlexAttentionLowering::tableOperands(ValueRange buffers) {
  SmallVector<Operand> tables;
  for (Value buffer : buffers) {
    KernelLowering::Window w = k.windowOf(buffer);
    Operand v;
    v.kind = Operand::table;
    v.buffer = w.buffer;
    v.offset = w.offset;
    v.elements = tensorType(buffer).getNumElements();
    if (w.strides != contiguousStrides(tensorType(buffer).getShape())) {
      v.buffer = k.bufferOf(buffer);
      v.offset = 0;
    }
    tables.push_back(v);
  }
  return tables;
}

LogicalResult FlexAttentionLowering::run() {
  auto qType = tensorType(op.getQuery()), kType = tensorType(op.getKey()),
       vType = tensorType(op.getValue());
  batch = qType.getDimSize(0);
  heads = qType.getDimSize(1);
  qLen = qType.getDimSize(2);
  dim = qType.getDimSize(3);
  kvHeads = kType.getDimSize(1);
  group = heads / kvHeads;
  kvLen = kType.getDimSize(2);
  vDim = vType.getDimSize(3);
  kvUnits = (kvLen + kUnit - 1) / kUnit;
  bank = k.target.psumBankBytes / 4; // fp32 columns per PSUM bank
  inElt = qType.getElementType();
  f32 = b.getF32Type();
  Block &scoreBody = op.getScoreMod().front();
  plainScores = cast<YieldOp>(scoreBody.getTerminator()).getValues()[0] ==
                scoreBody.getArgument(0);
  if (dim > k.target.matmulMaxK || vDim > bank)
    return op.emitOpError("head dims above ")
           << k.target.matmulMaxK << " (query and key) or " << bank
           << " (value) are not supported";
  if (qLen == 0 || kvLen == 0 || batch == 0 || heads == 0)
    return op.emitOpError("has an empty dimension");
  int64_t eltBytes = std::max<int64_t>(1, qType.getElementTypeBitWidth() / 8);
  // K^T and V of two key heads (the next loads while this one computes)
  // when they fit in half of SBUF.
  int64_t kvBytes = kvUnits * (kUnit + vDim) * eltBytes;
  kvSlots = 2 * kvBytes <= k.target.sbufBytesPerPartition / 2 ? 2 : 1;
  if (kvSlots * kvBytes > k.target.sbufBytesPerPartition * 3 / 4)
    return op.emitOpError("keys of ")
           << kvLen << " rows do not fit in SBUF (streaming them is not "
           << "supported yet)";

  auto blocks = cast<ElementsAttr>(op.getBlocks());
  blocksShape = cast<ShapedType>(blocks.getType()).getShape();
  for (APInt v : blocks.getValues<APInt>())
    blockKinds.push_back((int8_t)v.getSExtValue());
  qBlock = op.getBlockSize()[0];
  kvBlock = op.getBlockSize()[1];
  for (Affine a : {Affine{0, 1, 0, 0, 0}, Affine{0, 0, 1, 0, 0},
                   Affine{0, 0, 0, 1, 0}, Affine{0, 0, 0, 0, 1}}) {
    Operand index;
    index.kind = Operand::index;
    index.affine = a;
    scoreArgs.push_back(index);
  }
  maskArgs = scoreArgs;
  scoreArgs.append(tableOperands(op.getScoreBuffers()));
  maskArgs.append(tableOperands(op.getMaskBuffers()));
  q = k.windowOf(op.getQuery());
  key = k.windowOf(op.getKey());
  value = k.windowOf(op.getValue());
  out = k.resultBuffer(op.getOut());
  outStrides = contiguousStrides(tensorType(op.getOut()).getShape());
  if (!op.getLse().use_empty()) {
    lse = k.resultBuffer(op.getLse());
    lseStrides = contiguousStrides(tensorType(op.getLse()).getShape());
  }

  KernelLowering::TileScope scope(k);
  // The identity for TensorE transposes: (p - j) == 0.
  Value diff = k.tile(MemorySpace::sbuf, {kUnit, kUnit}, f32);
  b.create<nisa::IotaOp>(k.loc, diff, APFloat(0.0), APFloat(1.0),
                         b.getDenseF64ArrayAttr({-1.0}));
  ident = k.tile(MemorySpace::sbuf, {kUnit, kUnit}, inElt);
  b.create<nisa::TensorScalarOp>(k.loc, nisa::AluOp::eq, diff, ident, Value(),
                                 APFloat(0.0), false);
  negInf = k.tile(MemorySpace::sbuf, {kUnit, bank}, f32);
  b.create<nisa::MemsetOp>(k.loc, negInf,
                           APFloat(-std::numeric_limits<float>::infinity()));
  scorePsum = k.tile(MemorySpace::psum, {kUnit, 2 * bank}, f32);
  ptPsum = k.tile(MemorySpace::psum, {kUnit, 2 * bank}, f32);
  outPsum = k.tile(MemorySpace::psum, {kUnit, 2 * bank}, f32);
  miscPsum = k.tile(MemorySpace::psum, {kUnit, 2 * bank}, f32);
  qIn = k.tile(MemorySpace::sbuf, {kUnit, 2 * dim}, inElt);
  qT = k.tile(MemorySpace::sbuf, {dim, 2 * kUnit}, inElt);
  negm = k.tile(MemorySpace::sbuf, {kUnit, 4}, f32); // two per query slot
  l = k.tile(MemorySpace::sbuf, {kUnit, 2}, f32);
  lc = k.tile(MemorySpace::sbuf, {kUnit, 2}, f32);
  lseTile = k.tile(MemorySpace::sbuf, {kUnit, 2}, f32);
  o = k.tile(MemorySpace::sbuf, {kUnit, 2 * vDim}, f32);
  oOut = k.tile(MemorySpace::sbuf, {kUnit, 2 * vDim}, inElt);
  kTStride = kvSlots * kvUnits * kUnit;
  vSStride = kvSlots * kvUnits * vDim;
  kT = k.tile(MemorySpace::sbuf, {dim, kTStride}, inElt);
  vS = k.tile(MemorySpace::sbuf, {kUnit, vSStride}, inElt);

  bool perBatch = blocksShape[0] != 1, perHead = blocksShape[1] != 1;
  // Batches and key heads with one block structure run in loops (per-head
  // structures unroll the heads); the next key head's K and V load into
  // the other slot while this one computes.
  for (int64_t bm = 0; bm < blocksShape[0]; ++bm) {
    auto batchBody = [&](Value batchIdx) {
      if (perHead || kvSlots == 1) {
        auto each = [&](Value h) {
          loadKeys(batchIdx, h, 0);
          queryHeads(batchIdx, h, bm, 0);
        };
        if (perHead)
          for (int64_t h = 0; h < kvHeads; ++h)
            each(k.index(h));
        else
          k.forEach(kvHeads, each);
        return;
      }
      loadKeys(batchIdx, k.index(0), 0);
      k.forEachRotating(0, kvHeads - 1, 2, [&](Value h, int64_t slot) {
        loadKeys(batchIdx, k.addOffset(h, 1), 1 - slot);
        queryHeads(batchIdx, h, bm, slot);
      });
      queryHeads(batchIdx, k.index(kvHeads - 1), bm, (kvHeads - 1) % 2);
    };
    if (perBatch)
      batchBody(k.index(bm));
    else
      k.forEach(batch, batchBody);
  }
  return failure(failed);
}

/// The query heads of one key head, against its K^T and V in `slot`.
void FlexAttentionLowering::queryHeads(Value batchIdx, Value kvHead, int64_t bm,
                                       int64_t slot) {
  bool perHead = blocksShape[1] != 1;
  auto body = [&](Value g, int64_t hm) {
    Value h = k.addOffsets(k.scale(kvHead, group), g);
    SmallVector<SmallVector<Kind>> kinds = unitKinds(bm, hm);
    int64_t qTiles = kinds.size();
    // Query tiles with the same key units (and rows) run in one loop.
    for (int64_t t = 0; t < qTiles;) {
      SmallVector<KvTile> tiles = keyTiles(kinds[t]);
      int64_t rows = std::min(kUnit, qLen - t * kUnit);
      int64_t run = t + 1;
      while (run < qTiles && kinds[run] == kinds[t] &&
             std::min(kUnit, qLen - run * kUnit) == rows)
        ++run;
      k.forEachRotating(t, run - t, 2, [&](Value ti, int64_t parity) {
        Step at;
        at.batch = batchIdx;
        at.head = h;
        at.q0 = k.scale(ti, kUnit);
        at.rows = rows;
        queryTile(at, parity, tiles);
      });
      t = run;
    }
  };
  kvSlot = slot;
  if (!perHead) {
    k.forEach(group, [&](Value g) { body(g, 0); });
  } else {
    // Per-head structures: the key heads are unrolled, so is this.
    std::optional<int64_t> kvh = getConstantIntValue(kvHead);
    assert(kvh && "per-head block masks unroll the key heads");
    for (int64_t g = 0; g < group; ++g)
      body(k.index(g), *kvh * group + g);
  }
}

/// One query tile: Q^T, its key steps, then out = O / l and the lse.
void FlexAttentionLowering::queryTile(const Step &at, int64_t slot,
                                      ArrayRef<KvTile> tiles) {
  int64_t rows = at.rows;
  Value qOffset = k.addOffsets(
      k.addOffsets(k.addOffset(k.scale(at.batch, q.strides[0]), q.offset),
                   k.scale(at.head, q.strides[1])),
      k.scale(at.q0, q.strides[2]));
  Value qTile = k.view(qIn, k.index(slot * dim), {rows, dim}, {2 * dim, 1});
  k.dma(k.view(q.buffer, qOffset, {rows, dim}, {q.strides[2], q.strides[3]}),
        qTile);
  Value qPs =
      k.view(miscPsum, k.index(slot * bank), {dim, rows}, {2 * bank, 1});
  b.create<nisa::MatmulOp>(
      k.loc, qTile, k.view(ident, k.index(0), {rows, rows}, {kUnit, 1}), qPs);
  Value qTs = k.view(qT, k.index(slot * kUnit), {dim, rows}, {2 * kUnit, 1});
  b.create<nisa::CopyOp>(k.loc, qPs, qTs, nisa::Engine::scalar);
  auto column = [&](Value t, int64_t i, int64_t n) {
    return k.view(t, k.index(i), {rows, 1}, {n, 1});
  };
  // This slot's running state: -max (two, alternating between key steps),
  // the row sums and the unnormalized output.
  Value ls = column(l, slot, 2);
  Value os = k.view(o, k.index(slot * vDim), {rows, vDim}, {2 * vDim, 1});
  Value negms[2] = {column(negm, 2 * slot, 4), column(negm, 2 * slot + 1, 4)};
  // -max starts huge but finite: exp(s - max) of a masked -inf score is 0,
  // never NaN, and the first step's rescale factor exp(-huge) is 0.
  b.create<nisa::MemsetOp>(k.loc, negms[0],
                           APFloat(std::numeric_limits<float>::max()));
  b.create<nisa::MemsetOp>(k.loc, ls, APFloat(0.0));
  b.create<nisa::MemsetOp>(k.loc, os, APFloat(0.0));
  // Key tiles of one shape at consecutive units run in one loop.
  int64_t steps = 0;
  for (size_t i = 0; i < tiles.size();) {
    size_t j = i + 1;
    while (j < tiles.size() && tiles[j].sameShape(tiles[i]) &&
           tiles[j].firstUnit == tiles[j - 1].firstUnit + tiles[i].units)
      ++j;
    const KvTile &tile = tiles[i];
    int64_t start = steps;
    k.forEachRotating(start, j - i, 2, [&](Value s, int64_t parity) {
      Step step = at;
      step.width = tile.width;
      step.unit = k.addOffset(k.scale(k.addOffset(s, -start), tile.units),
                              tile.firstUnit);
      keyStep(step, tile, parity, qTs, negms[parity], negms[1 - parity], ls,
              os);
    });
    steps += j - i;
    i = j;
  }
  Value negmFinal = negms[steps % 2];
  // out = O / max(l, tiny): a fully masked row has O = 0 and l = 0.
  Value lcs = column(lc, slot, 2);
  b.create<nisa::TensorScalarOp>(k.loc, nisa::AluOp::max, ls, lcs, Value(),
                                 APFloat(std::numeric_limits<float>::min()),
                                 false);
  Value res = k.view(oOut, k.index(slot * vDim), {rows, vDim}, {2 * vDim, 1});
  b.create<nisa::TensorScalarOp>(k.loc, nisa::AluOp::divide, os, res, lcs,
                                 APFloat(0.0), false);
  Value outOffset = k.addOffsets(k.addOffsets(k.scale(at.batch, outStrides[0]),
                                              k.scale(at.head, outStrides[1])),
                                 k.scale(at.q0, outStrides[2]));
  k.dma(res, k.view(out, outOffset, {rows, vDim}, {outStrides[2], 1}));
  if (lse) {
    // lse = max + log(l): -inf for a fully masked row.
    Value lt = column(lseTile, slot, 2);
    b.create<nisa::ActivationOp>(k.loc, ls, lt, Value(),
                                 nisa::ActivationFn::log, APFloat(1.0),
                                 APFloat(0.0));
    b.create<nisa::TensorTensorOp>(k.loc, nisa::AluOp::subtract, lt, negmFinal,
                                   lt);
    Value lseOffset =
        k.addOffsets(k.addOffsets(k.scale(at.batch, lseStrides[0]),
                                  k.scale(at.head, lseStrides[1])),
                     at.q0);
    k.dma(lt, k.view(lse, lseOffset, {rows, 1}, {1, 1}));
  }
}

/// One key tile of one query tile: scores, modifiers, the online softmax
/// update and O += P V. `parity` alternates between consecutive steps.
void FlexAttentionLowering::keyStep(const Step &at, const KvTile &tile,
                                    int64_t parity, Value qTs, Value negmOld,
                                    Value negmNew, Value ls, Value os) {
  KernelLowering::TileScope scope(k);
  int64_t rows = at.rows, width = at.width;
  auto column = [&]() { return k.tile(MemorySpace::sbuf, {rows, 1}, f32); };
  Value s =
      k.view(scorePsum, k.index(parity * bank), {rows, width}, {2 * bank, 1});
  b.create<nisa::MatmulOp>(
      k.loc, qTs,
      k.view(kT, k.addOffset(k.scale(at.unit, kUnit), kvSlot * kvUnits * kUnit),
             {dim, width}, {kTStride, 1}),
      s);
  double scale = op.getScale().convertToDouble();
  Value mt = column(), rs = column();
  Value p = k.tile(MemorySpace::sbuf, {rows, width}, inElt);
  if (!tile.partial && plainScores && scale > 0) {
    // max(scale * s) = scale * max(s): the scale rides on the exp.
    b.create<nisa::TensorReduceOp>(k.loc, nisa::AluOp::max, s, mt);
    scalarTensorTensor(mt, Value(), -scale, nisa::AluOp::multiply, negmOld,
                       nisa::AluOp::min, negmNew, nisa::Engine::vector);
    expWithRowSum(s, p, scale, negmNew, rs);
  } else {
    Value sc = k.tile(MemorySpace::sbuf, {rows, width}, f32);
    b.create<nisa::ActivationOp>(k.loc, s, sc, Value(),
                                 nisa::ActivationFn::identity, APFloat(scale),
                                 APFloat(0.0));
    if (!plainScores) {
      Operand score;
      score.kind = Operand::full;
      score.tile = sc;
      SmallVector<Operand> args{score};
      args.append(scoreArgs);
      FailureOr<Operand> r = modifier(op.getScoreMod(), args, at);
      if (::mlir::failed(r)) {
        failed = true;
        return;
      }
      sc = materialize(*r, at, true);
    }
    if (tile.partial) {
      FailureOr<Operand> r = modifier(op.getMaskMod(), maskArgs, at);
      if (::mlir::failed(r)) {
        failed = true;
        return;
      }
      if (r->kind != Operand::imm || r->value == 0.0) {
        Value masked = k.tile(MemorySpace::sbuf, {rows, width}, f32);
        Value inf = k.view(negInf, k.index(0), {rows, width}, {bank, 1});
        if (r->kind == Operand::imm)
          b.create<nisa::CopyOp>(k.loc, inf, masked);
        else
          b.create<nisa::SelectOp>(k.loc, materialize(*r, at, true), sc, inf,
                                   masked);
        sc = masked;
      }
    }
    b.create<nisa::TensorReduceOp>(k.loc, nisa::AluOp::max, sc, mt);
    scalarTensorTensor(mt, Value(), -1.0, nisa::AluOp::multiply, negmOld,
                       nisa::AluOp::min, negmNew, nisa::Engine::vector);
    expWithRowSum(sc, p, 1.0, negmNew, rs);
  }
  // alpha = exp(max_old - max_new) rescales what came before.
  Value alpha = column();
  b.create<nisa::ActivationOp>(k.loc, negmOld, alpha, negmNew,
                               nisa::ActivationFn::exp, APFloat(-1.0),
                               APFloat(0.0));
  scalarTensorTensor(ls, alpha, 0.0, nisa::AluOp::multiply, rs,
                     nisa::AluOp::add, ls, nisa::Engine::vector);
  // P^T, a 128-key chunk at a time, into one PSUM bank; then O += P V.
  Value pT = k.tile(MemorySpace::sbuf, {kUnit, tile.units * rows}, inElt);
  Value oPs =
      k.view(outPsum, k.index(parity * bank), {rows, vDim}, {2 * bank, 1});
  for (int64_t c = 0; c < tile.units; ++c) {
    int64_t keys = std::min(kUnit, width - c * kUnit);
    Value chunk = k.view(p, k.index(c * kUnit), {rows, keys}, {width, 1});
    Value id = k.view(ident, k.index(0), {rows, rows}, {kUnit, 1});
    Value dst = k.view(ptPsum, k.index(parity * bank + c * rows), {keys, rows},
                       {2 * bank, 1});
    b.create<nisa::MatmulOp>(k.loc, chunk, id, dst);
  }
  int64_t fullChunks = width / kUnit;
  if (fullChunks)
    b.create<nisa::CopyOp>(k.loc,
                           k.view(ptPsum, k.index(parity * bank),
                                  {kUnit, fullChunks * rows}, {2 * bank, 1}),
                           k.view(pT, k.index(0), {kUnit, fullChunks * rows},
                                  {tile.units * rows, 1}),
                           nisa::Engine::vector);
  if (int64_t rest = width % kUnit)
    b.create<nisa::CopyOp>(k.loc,
                           k.view(ptPsum,
                                  k.index(parity * bank + fullChunks * rows),
                                  {rest, rows}, {2 * bank, 1}),
                           k.view(pT, k.index(fullChunks * rows), {rest, rows},
                                  {tile.units * rows, 1}),
                           nisa::Engine::vector);
  for (int64_t c = 0; c < tile.units; ++c) {
    int64_t keys = std::min(kUnit, width - c * kUnit);
    Value stationary =
        k.view(pT, k.index(c * rows), {keys, rows}, {tile.units * rows, 1});
    Value moving = k.view(
        vS,
        k.addOffset(k.scale(at.unit, vDim), kvSlot * kvUnits * vDim + c * vDim),
        {keys, vDim}, {vSStride, 1});
    auto mm = b.create<nisa::MatmulOp>(k.loc, stationary, moving, oPs);
    if (c > 0)
      mm.setAccumulate(true);
  }
  scalarTensorTensor(os, alpha, 0.0, nisa::AluOp::multiply, oPs,
                     nisa::AluOp::add, os, nisa::Engine::vector);
}

/// dst = (a op0 s) op1 other, s a column or an immediate.
void FlexAttentionLowering::scalarTensorTensor(Value a, Value sCol, double sImm,
                                               nisa::AluOp op0, Value other,
                                               nisa::AluOp op1, Value dst,
                                               nisa::Engine engine) {
  b.create<nisa::ScalarTensorTensorOp>(k.loc, op0, op1, a, other, dst, sCol,
                                       APFloat(sImm), engine);
}

/// p = exp(src * scale + bias) on ScalarE, with the fp32 row sums of p.
void FlexAttentionLowering::expWithRowSum(Value src, Value p, double scale,
                                          Value bias, Value rowSums) {
  b.create<nisa::ActivationOp>(k.loc, src, p, bias, Value(), rowSums,
                               nisa::ActivationFn::exp, APFloat(scale),
                               APFloat(0.0));
}

} // namespace mlir::neuron

using namespace mlir;
using namespace mlir::neuron;

LogicalResult KernelLowering::lowerFlexAttention(FlexAttentionOp op) {
  return FlexAttentionLowering(*this, op).run();
}
