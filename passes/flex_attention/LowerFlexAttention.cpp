//===- LowerFlexAttention.cpp - neuron.flex_attention -> flash attention --===//
//
// One blockwise flash-attention kernel per neuron.flex_attention:
//  - per (batch, key head): K^T and Q^T of its query heads (by transposing
//    DMAs) and V stay in SBUF; the next key head's load while this one
//    computes;
//  - per query head: its 128-row query tiles run in up to attention-lanes
//    lanes (a pass option, 3 by default), interleaved stage by stage, in a
//    three-step pipeline (round r: P V of step r - 1, the scores and -max
//    of step r + 1, P and P^T of step r); each query tile's key tiles are
//    up to 512 keys of the blocks the BlockMask keeps. Fully masked blocks
//    are never visited; full blocks skip mask_mod;
//  - per key step: S = Q K^T in a PSUM bank; plain scores are masked in
//    place by a 0 / -inf bias GpSimd computes two steps ahead, score_mod and
//    mask_mod otherwise run as engine instructions on the tile (indices from
//    iota, captured tensors by DMA); the online softmax keeps -max and the
//    row sums in fp32, P = exp(S - max) on ScalarE summing its rows as it
//    goes; P^T half by SBUF-to-SBUF transposing DMAs, half on TensorE into
//    the scores' bank; O = O * alpha + P V a round later.
//===----------------------------------------------------------------------===//

#include "passes/flex_attention/FlexAttentionLowering.h"
#include "passes/tile/TilePattern.h"

#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <limits>

namespace mlir::neuron::flex {

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
  SmallVector<SmallVector<Kind>> kinds(
      qTiles, SmallVector<Kind>(kvUnits, Kind::masked));
  for (int64_t t = 0; t < qTiles; ++t) {
    int64_t qFirst = t * unit / qb;
    int64_t qLast = (std::min(qLen, (t + 1) * unit) - 1) / qb;
    for (int64_t u = 0; u < kvUnits; ++u) {
      int64_t kFirst = u * unit / kb;
      int64_t kLast = (std::min(kvLen, (u + 1) * unit) - 1) / kb;
      bool any = false, allFull = true;
      for (int64_t i = qFirst; i <= qLast; ++i)
        for (int64_t j = kFirst; j <= kLast; ++j) {
          Kind kind = at(i, j);
          any |= kind != Kind::masked;
          allFull &= kind == Kind::full;
        }
      kinds[t][u] = !any                     ? Kind::masked
                    : allFull || maskTrivial ? Kind::full
                                             : Kind::partial;
    }
  }
  return kinds;
}

/// The key tiles of one query tile: runs of consecutive unmasked units, up
/// to a PSUM bank of fp32 scores (512) each. Plain scores mask in PSUM, so
/// a tile mixes full and partial units; otherwise a tile has one kind.
SmallVector<KvTile> FlexAttentionLowering::keyTiles(ArrayRef<Kind> row) const {
  int64_t maxUnits = std::max<int64_t>(
      1, std::min(k.target.matmulMaxMovingFree, k.target.psumBankBytes / 4) /
             unit);
  SmallVector<KvTile> tiles;
  for (int64_t u = 0; u < (int64_t)row.size();) {
    if (row[u] == Kind::masked) {
      ++u;
      continue;
    }
    int64_t first = u;
    while (u < (int64_t)row.size() && row[u] != Kind::masked &&
           (scaleOnExp || row[u] == row[first]) && u - first < maxUnits)
      ++u;
    KvTile tile{first, u - first, std::min(kvLen, u * unit) - first * unit, {}};
    for (int64_t v = first; v < u; ++v) {
      if (row[v] != Kind::partial)
        continue;
      auto &runs = tile.partialRuns;
      if (!runs.empty() && runs.back().first + runs.back().second == v - first)
        ++runs.back().second;
      else
        runs.push_back({v - first, 1});
    }
    tiles.push_back(std::move(tile));
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
    term(k.scale(at.unit, unit), a.ckv);
  return v;
}

/// The [rows, cols] window of a captured table whose element (i, j) is at
/// `first` + i * rowStride + j * colStride, as an fp32 SBUF tile. DMAs need
/// positive strides: a window read backwards along one axis is loaded in
/// reverse and flipped back by a TensorE matmul against an anti-identity.
Value FlexAttentionLowering::gatherWindow(Value buffer, Value first,
                                          int64_t rowStride, int64_t colStride,
                                          int64_t rows, int64_t cols) {
  Value t = k.tile(MemorySpace::sbuf, {rows, cols}, f32);
  if (rowStride >= 0 && colStride >= 0) {
    k.dma(k.view(buffer, first, {rows, cols}, {rowStride, colStride}), t);
    return t;
  }
  Value flipped =
      k.view(psum, k.index(miscBank * bank), {rows, cols}, {psumCols, 1});
  if (rowStride < 0) {
    // R[i'] = window[rows - 1 - i'], then window = J^T R.
    Value reversed = k.tile(MemorySpace::sbuf, {rows, cols}, f32);
    k.dma(k.view(buffer, k.addOffset(first, rowStride * (rows - 1)),
                 {rows, cols}, {-rowStride, colStride}),
          reversed);
    b.create<nisa::MatmulOp>(antiIdentity.lookup(rows), reversed, flipped);
  } else {
    // Per chunk of up to 128 columns from the right: its reversed transpose
    // R^T (a transposing DMA), then window[:, chunk] = (R^T)^T J.
    for (int64_t c0 = 0; c0 < cols; c0 += unit) {
      int64_t n = std::min(unit, cols - c0);
      Value reversedT = k.tile(MemorySpace::sbuf, {n, rows}, f32);
      int64_t lastCol = cols - 1 - c0;
      k.dma(k.view(buffer, k.addOffset(first, colStride * lastCol), {n, rows},
                   {-colStride, rowStride}),
            reversedT);
      b.create<nisa::MatmulOp>(reversedT, antiIdentity.lookup(n),
                               k.view(psum,
                                      k.index(miscBank * bank + cols - c0 - n),
                                      {rows, n}, {psumCols, 1}));
    }
  }
  b.create<nisa::CopyOp>(flipped, t, nisa::Engine::scalar);
  return t;
}

/// An affine index as fp32 values: a column (no kv term) or a tile.
Value FlexAttentionLowering::iota(const Affine &a, const Step &at,
                                  bool asFull) {
  bool full = asFull || a.ckv != 0;
  if (affineLog)
    affineLog->push_back(a);
  Value t = k.tile(MemorySpace::sbuf, {at.rows, full ? at.width : 1}, f32);
  b.create<nisa::IotaOp>(t, indexValue(a, at), APFloat((double)a.c0),
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
    b.create<nisa::MemsetOp>(t, APFloat(v.value));
    return t;
  }
  case Operand::index:
    return iota(v.affine, at, asFull);
  case Operand::column: {
    if (!asFull)
      return v.tile;
    Value t = k.tile(MemorySpace::sbuf, {at.rows, at.width}, f32);
    b.create<nisa::MemsetOp>(t, APFloat(0.0));
    b.create<nisa::TensorScalarOp>(nisa::AluOp::add, t, t, v.tile, APFloat(0.0),
                                   false, nisa::Engine::gpsimd);
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
/// cannot compute per element. Arithmetic runs on GpSimd (its operands are
/// SBUF tiles), off VectorE, which has the softmax.
FailureOr<Operand> FlexAttentionLowering::modifier(Region &region,
                                                   ArrayRef<Operand> args,
                                                   const Step &at) {
  DenseMap<Value, Operand> values;
  Block &body = region.front();
  for (auto [arg, v] : llvm::zip(body.getArguments(), args))
    values[arg] = v;
  for (Operation &inner : body.without_terminator()) {
    TileBuilder::LocScope innerLoc(b, inner.getLoc());
    FailureOr<Operand> result = modifierOp(inner, values, at);
    if (::mlir::failed(result))
      return failure();
    values[inner.getResult(0)] = *result;
  }
  return values.lookup(cast<YieldOp>(body.getTerminator()).getValues()[0]);
}

namespace {
FailureOr<Operand> failAt(Operation *op, const Twine &why) {
  op->emitOpError(why);
  return failure();
}

/// An index or an integral constant: what stays symbolic (Affine).
bool isAffine(const Operand &v) {
  return v.kind == Operand::index ||
         (v.kind == Operand::imm && v.value == std::floor(v.value) &&
          std::abs(v.value) < (1ll << 40));
}

Affine affineOf(const Operand &v) {
  if (v.kind == Operand::index)
    return v.affine;
  Affine a;
  a.c0 = (int64_t)v.value;
  return a;
}

/// The compile-time number a splat constant is.
FailureOr<Operand> constantOperand(ConstantOp c) {
  auto attr = dyn_cast<DenseElementsAttr>(c.getValue());
  if (!attr || !attr.isSplat())
    return failAt(c, "a non-scalar constant in a modifier");
  Type elt = attr.getElementType();
  Operand result;
  result.value =
      isa<FloatType>(elt) ? attr.getSplatValue<APFloat>().convertToDouble()
      : elt.isInteger(1)  ? (double)attr.getSplatValue<bool>()
                          : (double)attr.getSplatValue<APInt>().getSExtValue();
  return result;
}
} // namespace

/// One op of a modifier's body, its operands' values in `values`.
FailureOr<Operand> FlexAttentionLowering::modifierOp(
    Operation &inner, const DenseMap<Value, Operand> &values, const Step &at) {
  auto get = [&](Value v) { return values.lookup(v); };
  return llvm::TypeSwitch<Operation *, FailureOr<Operand>>(&inner)
      .Case([&](ConstantOp c) { return constantOperand(c); })
      .Case([&](CastOp c) { return castOperand(c, get(c.getInput()), at); })
      .Case([&](ReshapeOp reshape) -> FailureOr<Operand> {
        Operand result = get(reshape.getInput());
        if (result.kind != Operand::table &&
            tensorType(reshape.getResult()).getNumElements() != 1)
          return failAt(&inner, "reshapes only captured tensors");
        return result;
      })
      .Case([&](GatherOp g) {
        return gatherOperand(g, get(g.getTable()), get(g.getIndices()), at);
      })
      .Case([&](UnaryOp unary) -> FailureOr<Operand> {
        Operand x = get(unary.getInput());
        if (x.kind == Operand::table)
          return failAt(&inner,
                        "applies a function to a whole captured tensor");
        Value src = materialize(x, at, false);
        auto shape = cast<MemRefType>(src.getType()).getShape();
        Value t = k.tile(MemorySpace::sbuf, shape, f32);
        b.create<nisa::ActivationOp>(src, t, Value(),
                                     activationFor(unary.getFn()), APFloat(1.0),
                                     APFloat(0.0));
        Operand result;
        result.kind = shape[1] == 1 ? Operand::column : Operand::full;
        result.tile = t;
        return result;
      })
      .Case([&](BinaryOp bin) {
        return binaryOperand(bin, get(bin.getLhs()), get(bin.getRhs()), at);
      })
      .Case([&](SelectOp sel) -> FailureOr<Operand> {
        Operand c = get(sel.getCond()), x = get(sel.getOnTrue()),
                y = get(sel.getOnFalse());
        if (c.kind == Operand::table || x.kind == Operand::table ||
            y.kind == Operand::table)
          return failAt(&inner, "selects whole captured tensors");
        Value t = k.tile(MemorySpace::sbuf, {at.rows, at.width}, f32);
        b.create<nisa::SelectOp>(
            materialize(c, at, true), materialize(x, at, true),
            materialize(y, at, true), t, nisa::Engine::gpsimd);
        Operand result;
        result.kind = Operand::full;
        result.tile = t;
        return result;
      })
      .Default([&](Operation *) {
        return failAt(&inner, "is not supported in a FlexAttention modifier");
      });
}

/// The engines compute in fp32: a cast changes nothing but float ->
/// integer truncation.
Operand FlexAttentionLowering::castOperand(CastOp castOp, Operand x,
                                           const Step &at) {
  Operand result = x;
  bool toInt = !isa<FloatType>(tensorType(castOp.getResult()).getElementType());
  bool fromFloat =
      isa<FloatType>(tensorType(castOp.getInput()).getElementType());
  if (!toInt || !fromFloat)
    return result;
  if (result.kind == Operand::imm) {
    result.value = std::trunc(result.value);
    return result;
  }
  Value src = materialize(result, at, false);
  Value t = k.tile(MemorySpace::sbuf,
                   cast<MemRefType>(src.getType()).getShape(), f32);
  b.create<nisa::ActivationOp>(src, t, Value(), nisa::ActivationFn::trunc,
                               APFloat(1.0), APFloat(0.0));
  result.kind = cast<MemRefType>(src.getType()).getShape()[1] == 1
                    ? Operand::column
                    : Operand::full;
  result.tile = t;
  return result;
}

/// A captured tensor read at an affine index: a window of it by DMA, after
/// checking the index's range over the whole kernel lies in the tensor.
FailureOr<Operand> FlexAttentionLowering::gatherOperand(GatherOp gather,
                                                        Operand table,
                                                        Operand idx,
                                                        const Step &at) {
  if (table.kind != Operand::table || !isAffine(idx))
    return failAt(gather, "indexes a captured tensor with an index that is "
                          "not an affine function of b, h, q_idx and kv_idx");
  Affine a = affineOf(idx);
  int64_t lo = a.c0, hi = a.c0;
  auto span = [&](int64_t c, int64_t n) { (c < 0 ? lo : hi) += c * (n - 1); };
  span(a.cb, batch);
  span(a.ch, heads);
  span(a.cq, qLen);
  span(a.ckv, kvLen);
  if (lo < 0 || hi >= table.elements)
    return failAt(gather, "indexes a captured tensor of " +
                              Twine(table.elements) + " elements at " +
                              Twine(lo) + ".." + Twine(hi) +
                              " (out of bounds)");
  bool full = a.ckv != 0;
  if (a.cq < 0 && a.ckv < 0)
    return failAt(gather, "indexes a captured tensor backwards along both "
                          "q_idx and kv_idx (not supported)");
  Value offset = k.addOffset(indexValue(a, at), table.offset + a.c0);
  Operand result;
  result.kind = full ? Operand::full : Operand::column;
  result.tile = gatherWindow(table.buffer, offset, a.cq, full ? a.ckv : 1,
                             at.rows, full ? at.width : 1);
  return result;
}

/// Index arithmetic stays symbolic while it is affine; anything else is an
/// ALU instruction on GpSimd.
FailureOr<Operand> FlexAttentionLowering::binaryOperand(BinaryOp bin, Operand l,
                                                        Operand r,
                                                        const Step &at) {
  if (l.kind == Operand::table || r.kind == Operand::table)
    return failAt(bin, "computes with a whole captured tensor");
  BinaryFn fn = bin.getFn();
  bool isInt = !isa<FloatType>(tensorType(bin.getLhs()).getElementType());
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
      z = {x.c0 + s * y.c0, x.cb + s * y.cb, x.ch + s * y.ch, x.cq + s * y.cq,
           x.ckv + s * y.ckv};
    }
    Operand result;
    result.kind = Operand::index;
    result.affine = z;
    return result;
  }
  if (l.kind == Operand::imm && r.kind == Operand::imm)
    return failAt(bin, "computes with constants only (fold it in Python)");
  // Indices compared: (l - r) against 0, one iota, and a mask of q - kv
  // (q >= kv) reads only indices of q - kv (maskBias caches it).
  bool compare = fn == BinaryFn::eq || fn == BinaryFn::ne ||
                 fn == BinaryFn::lt || fn == BinaryFn::le ||
                 fn == BinaryFn::gt || fn == BinaryFn::ge;
  if (isInt && compare && l.kind == Operand::index &&
      r.kind == Operand::index) {
    Affine x = l.affine, y = r.affine;
    Operand diff, zero;
    diff.kind = Operand::index;
    diff.affine = {x.c0 - y.c0, x.cb - y.cb, x.ch - y.ch, x.cq - y.cq,
                   x.ckv - y.ckv};
    return aluOperand(aluFor(fn), diff, zero, at);
  }
  return aluOperand(aluFor(fn), l, r, at);
}

/// `l alu r` on GpSimd: an immediate or a column operand is the
/// per-partition scalar.
Operand FlexAttentionLowering::aluOperand(nisa::AluOp alu, const Operand &l,
                                          const Operand &r, const Step &at) {
  bool lTile = l.kind == Operand::full ||
               (l.kind == Operand::index && l.affine.ckv != 0);
  bool rTile = r.kind == Operand::full ||
               (r.kind == Operand::index && r.affine.ckv != 0);
  bool full = lTile || rTile;
  Value t = k.tile(MemorySpace::sbuf, {at.rows, full ? at.width : 1}, f32);
  if (l.kind == Operand::imm || r.kind == Operand::imm) {
    bool reverse = l.kind == Operand::imm;
    Value src = materialize(reverse ? r : l, at, false);
    b.create<nisa::TensorScalarOp>(alu, src, t, Value(),
                                   APFloat(reverse ? l.value : r.value),
                                   reverse, nisa::Engine::gpsimd);
  } else if (lTile != rTile) {
    bool reverse = !lTile;
    Value src = materialize(reverse ? r : l, at, false);
    Value col = materialize(reverse ? l : r, at, false);
    b.create<nisa::TensorScalarOp>(alu, src, t, col, APFloat(0.0), reverse,
                                   nisa::Engine::gpsimd);
  } else {
    b.create<nisa::TensorTensorOp>(alu, materialize(l, at, false),
                                   materialize(r, at, false), t,
                                   nisa::Engine::gpsimd);
  }
  Operand result;
  result.kind = full ? Operand::full : Operand::column;
  result.tile = t;
  return result;
}

//===----------------------------------------------------------------------===//
// The kernel
//===----------------------------------------------------------------------===//

/// V [128 keys, units x vDim] of one (batch, key head) into `slot` (row r
/// of unit u on partition r); K^T [dim, keys] and, when resident, Q^T of
/// its query heads by transposing DMAs. All on ScalarE's DMA queue, so they
/// never wait behind the output stores.
void FlexAttentionLowering::loadHead(Value batchIdx, Value kvHead,
                                     int64_t slot) {
  loadUnits({batchIdx, kvHead, slot}, k.index(0), 0,
            std::max(kvUnits, (qLen + unit - 1) / unit));
}

/// Key units [first, first + count) of a key head's V and K^T and the same
/// query tiles of its query heads' Q^T (resident), into `slot`. `first` is
/// static (`firstStatic`, the ranges clipped to the lengths) or, with
/// `firstStatic` -1, a loop index over units that are whole in all three.
void FlexAttentionLowering::loadUnits(const HeadLoad &at, Value first,
                                      int64_t firstStatic, int64_t count) {
  auto load = [&](Value src, Value to) {
    b.create<nisa::DmaCopyOp>(src, to, nisa::Engine::scalar);
  };
  auto base = [&](const TileBuilder::Window &w, Value head, int64_t rowStride) {
    return k.addOffsets(
        k.addOffsets(k.addOffset(k.scale(at.batch, w.strides[0]), w.offset),
                     k.scale(head, w.strides[1])),
        k.scale(first, unit * rowStride));
  };
  // Rows of [first unit, + count units) within `len` (all when dynamic).
  auto rowsIn = [&](int64_t len) {
    if (firstStatic < 0)
      return count * unit;
    return std::clamp<int64_t>(len - firstStatic * unit, 0, count * unit);
  };
  int64_t vs = value.strides[2], vd = value.strides[3];
  int64_t vRows = rowsIn(kvLen), whole = vRows / unit, rest = vRows % unit;
  Value vBase = base(value, at.kvHead, vs);
  Value vAt = k.addOffset(k.scale(first, vDim), at.slot * kvUnits * vDim);
  if (whole)
    load(k.view(value.buffer, vBase, {unit, whole, vDim}, {vs, unit * vs, vd}),
         k.view(vS, vAt, {unit, whole, vDim}, {vSStride, vDim, 1}));
  if (rest)
    load(k.view(value.buffer, k.addOffset(vBase, whole * unit * vs),
                {rest, vDim}, {vs, vd}),
         k.view(vS, k.addOffset(vAt, whole * vDim), {rest, vDim},
                {vSStride, 1}));
  int64_t kRows = rowsIn(kvLen);
  if (kRows)
    load(k.view(key.buffer, base(key, at.kvHead, key.strides[2]), {dim, kRows},
                {key.strides[3], key.strides[2]}),
         k.view(kT, k.addOffset(k.scale(first, unit), at.slot * kvUnits * unit),
                {dim, kRows}, {kTStride, 1}));
  int64_t qRows = rowsIn(qLen);
  if (!qResident || !qRows)
    return;
  for (int64_t g = 0; g < group; ++g)
    load(
        k.view(q.buffer,
               base(q, k.addOffset(k.scale(at.kvHead, group), g), q.strides[2]),
               {dim, qRows}, {q.strides[3], q.strides[2]}),
        k.view(qT,
               k.addOffset(k.scale(first, unit), (at.slot * group + g) * qLen),
               {dim, qRows}, {qTStride, 1}));
}

/// Captured tensors as flat tables: their buffers, contiguous (a strided
/// window is copied once, here, outside every loop).
SmallVector<Operand> FlexAttentionLowering::tableOperands(ValueRange buffers) {
  SmallVector<Operand> tables;
  for (Value buffer : buffers) {
    TileBuilder::Window w = k.windowOf(buffer);
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

void FlexAttentionLowering::makeIdentity() { ident = k.identity(unit, inElt); }

/// The identity, and 0 and -inf tiles of `cols` columns for masks.
void FlexAttentionLowering::makeConstants(int64_t cols) {
  makeIdentity();
  negInf = k.tile(MemorySpace::sbuf, {unit, cols}, f32);
  b.create<nisa::MemsetOp>(
      negInf, APFloat(double(-std::numeric_limits<float>::infinity())));
  zeros = k.tile(MemorySpace::sbuf, {unit, cols}, f32);
  b.create<nisa::MemsetOp>(zeros, APFloat(0.0));
}

/// The buffer a [B, H, L, D] result is written to, and its strides. A
/// result read only through transpose(1, 2) (an attention layer putting the
/// heads side by side) is written in that layout, [B, L, H, D]: the
/// transpose, and the reshape after it, then move no data.
std::pair<Value, SmallVector<int64_t>>
FlexAttentionLowering::resultLayout(Value result) {
  auto shape = tensorType(result).getShape();
  bool headsInner =
      !result.use_empty() && !k.hasDestination(result) &&
      llvm::all_of(result.getUsers(), [](Operation *user) {
        auto t = dyn_cast<TransposeOp>(user);
        return t && t.getPermutation() == ArrayRef<int64_t>{0, 2, 1, 3};
      });
  if (!headsInner)
    return {k.resultBuffer(result), contiguousStrides(shape)};
  // A returned transpose is written straight into its output.
  Value transposed = result.getUsers().begin()->getResult(0);
  Value buffer = result.hasOneUse() && k.hasDestination(transposed)
                     ? k.resultBuffer(transposed)
                     : b.create<memref::AllocOp>(MemRefType::get(
                           {shape[0], shape[2], shape[1], shape[3]},
                           tensorType(result).getElementType()));
  int64_t rowStride = shape[1] * shape[3];
  SmallVector<int64_t> strides{shape[2] * rowStride, shape[3], rowStride, 1};
  k.bindWindow(result, {buffer, 0, strides}, result.getLoc());
  return {buffer, strides};
}

/// The anti-identities gatherWindow flips windows with: (p + j) == n - 1 for
/// the window sizes a kernel has (128, and the query and key remainders).
void FlexAttentionLowering::makeAntiIdentities() {
  for (int64_t n : {unit, qLen % unit, kvLen % unit}) {
    if (n == 0 || antiIdentity.count(n))
      continue;
    Value sum = k.tile(MemorySpace::sbuf, {n, n}, f32);
    b.create<nisa::IotaOp>(sum, APFloat((double)(1 - n)), APFloat(1.0),
                           b.getDenseF64ArrayAttr({1.0}));
    Value j = k.tile(MemorySpace::sbuf, {n, n}, f32);
    b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, sum, j, Value(),
                                   APFloat(0.0), false);
    antiIdentity[n] = j;
  }
}

/// What both kernels read from their op: shapes, scale, block classes, the
/// modifiers' arguments and where query, key and value are.
LogicalResult FlexAttentionLowering::setUpCommon(
    Operation *o, Value query, Value keyV, Value valueV, double opScale,
    ArrayRef<int64_t> blockSize, ElementsAttr blocks, ValueRange scoreBuffers,
    ValueRange maskBuffers) {
  auto qType = tensorType(query), kType = tensorType(keyV),
       vType = tensorType(valueV);
  batch = qType.getDimSize(0);
  heads = qType.getDimSize(1);
  qLen = qType.getDimSize(2);
  qTiles = (qLen + unit - 1) / unit;
  dim = qType.getDimSize(3);
  kvHeads = kType.getDimSize(1);
  group = heads / kvHeads;
  kvLen = kType.getDimSize(2);
  vDim = vType.getDimSize(3);
  kvUnits = (kvLen + unit - 1) / unit;
  bank = k.target.psumBankBytes / 4; // fp32 columns per PSUM bank
  inElt = qType.getElementType();
  f32 = b.getF32Type();
  scale = opScale;
  if (dim > k.target.matmulMaxK)
    return o->emitOpError("head dims above ")
           << k.target.matmulMaxK << " (query and key) are not supported";
  if (qLen == 0 || kvLen == 0 || batch == 0 || heads == 0)
    return o->emitOpError("has an empty dimension");
  blocksShape = cast<ShapedType>(blocks.getType()).getShape();
  for (APInt v : blocks.getValues<APInt>())
    blockKinds.push_back((int8_t)v.getSExtValue());
  qBlock = blockSize[0];
  kvBlock = blockSize[1];
  for (Affine a : {Affine{0, 1, 0, 0, 0}, Affine{0, 0, 1, 0, 0},
                   Affine{0, 0, 0, 1, 0}, Affine{0, 0, 0, 0, 1}}) {
    Operand index;
    index.kind = Operand::index;
    index.affine = a;
    scoreArgs.push_back(index);
  }
  maskArgs = scoreArgs;
  scoreArgs.append(tableOperands(scoreBuffers));
  maskArgs.append(tableOperands(maskBuffers));
  q = k.windowOf(query);
  key = k.windowOf(keyV);
  value = k.windowOf(valueV);
  return success();
}

LogicalResult FlexAttentionLowering::run() {
  if (::mlir::failed(setUp(op)))
    return failure();
  if (vDim > bank)
    return op.emitOpError("value head dims above ")
           << bank << " are not supported";
  Block &scoreBody = op.getScoreMod().front();
  plainScores = cast<YieldOp>(scoreBody.getTerminator()).getValues()[0] ==
                scoreBody.getArgument(0);
  scaleOnExp = plainScores && scale > 0;
  Value keep =
      cast<YieldOp>(op.getMaskMod().front().getTerminator()).getValues()[0];
  if (auto c = keep.getDefiningOp<ConstantOp>())
    if (auto attr = dyn_cast<DenseElementsAttr>(c.getValue()))
      maskTrivial = attr.isSplat() && attr.getSplatValue<bool>();
  bool tables = !op.getScoreBuffers().empty() || !op.getMaskBuffers().empty();
  planPsum(tables);
  if (::mlir::failed(planSbuf()))
    return failure();

  std::tie(out, outStrides) = resultLayout(op.getOut());
  if (!op.getLse().use_empty()) {
    lse = k.resultBuffer(op.getLse());
    lseStrides = contiguousStrides(tensorType(op.getLse()).getShape());
  }

  TileBuilder::TileScope scope(k);
  allocateTiles(tables);
  emitBatches();
  return failure(failed);
}

/// Lanes: as many as attention-lanes asks and PSUM holds. A lane needs two
/// PSUM banks for scores, vDim columns of a bank for O and 128 columns for
/// its TensorE-transposed chunk of P^T (apart from the scores, so the next
/// scores need not wait for its eviction); captured tensors, one more bank.
void FlexAttentionLowering::planPsum(bool tables) {
  int64_t outsPerBank = std::max<int64_t>(1, bank / vDim);
  int64_t chunksPerBank = std::max<int64_t>(1, bank / unit);
  auto psumBanksFor = [&](int64_t n) {
    return 2 * n + (n + outsPerBank - 1) / outsPerBank +
           (n + chunksPerBank - 1) / chunksPerBank;
  };
  int64_t extra = tables ? 1 : 0;
  for (lanes = k.knobs.attentionLanes;
       lanes > 1 && psumBanksFor(lanes) + extra > k.target.psumBanks;)
    --lanes;
  pTBank = 2 * lanes + (lanes + outsPerBank - 1) / outsPerBank;
  miscBank = psumBanksFor(lanes);
  psumCols = (miscBank + extra) * bank;
}

/// SBUF: per key-head slot K^T, V and (resident) Q^T of its query heads.
/// Two slots let the next key head load while this one computes; resident
/// Q^T saves a load in front of every query tile. They take up to
/// attention-sbuf-percent; the rest of the kernel's tiles fit beyond.
LogicalResult FlexAttentionLowering::planSbuf() {
  auto qType = tensorType(op.getQuery());
  int64_t elt = std::max<int64_t>(1, qType.getElementTypeBitWidth() / 8);
  int64_t kvBytes = (kvLen + kvUnits * vDim) * elt;
  int64_t qBytes = group * qLen * elt;
  // P and P^T per lane and parity (allocateTiles) and the mask cache
  // outlive the rounds: with them and a quarter of SBUF for the other tiles
  // (scores, modifiers), what is left bounds the resident operands too (a
  // small SBUF, fp32).
  int64_t sbuf = k.target.sbufBytesPerPartition;
  int64_t pipelineBytes = 2 * 2 * lanes * bank * elt + kMaskCacheCols * 4;
  int64_t budget = std::min(sbuf * k.knobs.attentionSbufPercent / 100,
                            sbuf - sbuf / 4 - pipelineBytes);
  std::pair<int64_t, bool> choices[] = {
      {2, true}, {1, true}, {2, false}, {1, false}};
  auto choice = llvm::find_if(choices, [&](const std::pair<int64_t, bool> &c) {
    return c.first * (kvBytes + (c.second ? qBytes : 0)) <= budget;
  });
  if (choice == std::end(choices))
    return op.emitOpError("keys of ")
           << kvLen << " rows do not fit in SBUF (streaming them is not "
           << "supported yet)";
  kvSlots = choice->first;
  qResident = choice->second;
  return success();
}

/// The kernel's tiles, live for all of it.
void FlexAttentionLowering::allocateTiles(bool tables) {
  makeConstants(bank);
  // -max starts huge but finite: exp(s - max) of a masked -inf score is 0,
  // never NaN.
  negmInit = k.tile(MemorySpace::sbuf, {unit, 1}, f32);
  b.create<nisa::MemsetOp>(negmInit,
                           APFloat(double(std::numeric_limits<float>::max())));
  psum = k.tile(MemorySpace::psum, {unit, psumCols}, f32);
  if (tables)
    makeAntiIdentities();
  negm = k.tile(MemorySpace::sbuf, {unit, 2 * lanes}, f32);
  alpha = k.tile(MemorySpace::sbuf, {unit, 2 * lanes}, f32);
  l = k.tile(MemorySpace::sbuf, {unit, kSets * lanes}, f32);
  if (lse) {
    // Each query tile of a head leaves its row sums and -max here; their
    // logs are taken once per head (finishLse): ScalarE would otherwise
    // switch activation tables (exp, log, exp) for every query tile.
    lseSums = k.tile(MemorySpace::sbuf, {unit, qTiles}, f32);
    lseNegMax = k.tile(MemorySpace::sbuf, {unit, qTiles}, f32);
  }
  o = k.tile(MemorySpace::sbuf, {unit, kSets * lanes * vDim}, f32);
  oOut = k.tile(MemorySpace::sbuf, {unit, kSets * lanes * vDim}, inElt);
  expSrc = k.tile(MemorySpace::sbuf, {unit, 2 * lanes * bank}, f32);
  pBuf = k.tile(MemorySpace::sbuf, {unit, 2 * lanes * bank}, inElt);
  pTBuf = k.tile(MemorySpace::sbuf, {unit, 2 * lanes * bank}, inElt);
  Type maskElt = f32;
  if (maskOnTensorE()) {
    // c I against biases of 0 / -c: a masked score's product overflows
    // fp32 to -inf (c^2 = 2^128) and every other product is an exact 0.
    maskElt = inElt;
    maskIdentity = k.tile(MemorySpace::sbuf, {unit, unit}, inElt);
    b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, ident, maskIdentity,
                                   Value(), APFloat(kTensorMaskScale), false);
    maskFill = k.tile(MemorySpace::sbuf, {unit, bank}, f32);
    b.create<nisa::MemsetOp>(maskFill, APFloat(-kTensorMaskScale));
  }
  maskBiases = k.tile(MemorySpace::sbuf, {unit, 2 * lanes * bank}, maskElt);
  if (!maskTrivial && op.getMaskBuffers().empty())
    maskCache = k.tile(MemorySpace::sbuf, {unit, kMaskCacheCols}, maskElt);
  kTStride = kvSlots * kvUnits * unit;
  vSStride = kvSlots * kvUnits * vDim;
  kT = k.tile(MemorySpace::sbuf, {dim, kTStride}, inElt);
  vS = k.tile(MemorySpace::sbuf, {unit, vSStride}, inElt);
  if (qResident) {
    qTStride = kvSlots * group * qLen;
    qT = k.tile(MemorySpace::sbuf, {dim, qTStride}, inElt);
  } else {
    qLaneT = k.tile(MemorySpace::sbuf, {dim, kSets * lanes * unit}, inElt);
  }
}

/// Batches and key heads with one block structure run in loops (per-head
/// structures unroll the heads); the next key head loads while this one
/// computes. With two slots each query head's last round runs in the next
/// one's first (fuseHeads): the key heads' loop starts at the second, whose
/// first round finishes the first's.
void FlexAttentionLowering::emitBatches() {
  bool perBatch = blocksShape[0] != 1, perHead = blocksShape[1] != 1;
  for (int64_t bm = 0; bm < blocksShape[0]; ++bm) {
    SmallVector<int64_t> empty;
    SmallVector<Lane> streams = laneStreams(unitKinds(bm, 0), empty);
    fuseHeads = !perHead && kvSlots == 2 && fusibleHeads(streams);
    auto batchBody = [&](Value batchIdx) {
      if (perHead || kvSlots == 1) {
        auto each = [&](Value h) {
          loadHead(batchIdx, h, 0);
          queryHeads(batchIdx, h, bm, 0);
        };
        if (perHead)
          for (int64_t h = 0; h < kvHeads; ++h)
            each(k.index(h));
        else
          k.forEach(kvHeads, each);
        return;
      }
      loadHead(batchIdx, k.index(0), 0);
      HeadLoad second{batchIdx, k.index(1), 1};
      queryHeads(batchIdx, k.index(0), bm, 0, kvHeads > 1 ? &second : nullptr);
      k.forEachRotating(1, std::max<int64_t>(0, kvHeads - 2), 2,
                        [&](Value h, int64_t slot) {
                          HeadLoad next{batchIdx, k.addOffset(h, 1), 1 - slot};
                          queryHeads(batchIdx, h, bm, slot, &next, true);
                        });
      if (kvHeads > 1)
        queryHeads(batchIdx, k.index(kvHeads - 1), bm, (kvHeads - 1) % 2,
                   nullptr, true);
      if (!fuseHeads)
        return;
      // The batch's last query head's last two rounds.
      Step last;
      last.batch = batchIdx;
      last.head = k.index(kvHeads * group - 1);
      last.kvSlot = (kvHeads - 1) % 2;
      finishHead(last, streams, roundsOf(streams) - 1);
    };
    if (perBatch)
      batchBody(k.index(bm));
    else
      k.forEach(batch, batchBody);
  }
}

/// The query tiles of one query head as `lanes` streams of key steps, each
/// query tile in the lane with the fewest steps so far. Query tiles without
/// any key go to `empty`.
SmallVector<FlexAttentionLowering::Lane>
FlexAttentionLowering::laneStreams(ArrayRef<SmallVector<Kind>> kinds,
                                   SmallVectorImpl<int64_t> &empty) const {
  SmallVector<Lane> streams(lanes);
  SmallVector<int64_t> tilesIn(lanes, 0);
  // Longest query tiles first, so the lanes end together.
  SmallVector<std::pair<int64_t, SmallVector<KvTile>>> order;
  for (int64_t t = 0; t < (int64_t)kinds.size(); ++t) {
    SmallVector<KvTile> tiles = keyTiles(kinds[t]);
    if (tiles.empty())
      empty.push_back(t);
    else
      order.emplace_back(t, std::move(tiles));
  }
  llvm::stable_sort(order, [](const auto &x, const auto &y) {
    return x.second.size() > y.second.size();
  });
  for (auto &[t, tiles] : order) {
    Lane &lane = *llvm::min_element(streams, [](const Lane &a, const Lane &c) {
      return a.size() < c.size();
    });
    int64_t set = tilesIn[&lane - streams.data()]++ % 2;
    for (size_t i = 0; i < tiles.size(); ++i)
      lane.push_back({t, tiles[i], set, i == 0, i + 1 == tiles.size()});
  }
  for (Lane &lane : streams)
    for (LaneStep &step : llvm::reverse(lane)) {
      if (step.q != lane.back().q)
        break;
      step.set = kSets - 1;
    }
  return streams;
}

int64_t FlexAttentionLowering::roundsOf(ArrayRef<Lane> streams) {
  int64_t rounds = 0;
  for (const Lane &lane : streams)
    rounds = std::max<int64_t>(rounds, lane.size());
  return rounds;
}

/// Whether query heads of `streams` may run as one stream (fuseHeads): at
/// least two rounds, an even count of them (a step's buffer parity is its
/// round's), and no lane of one query tile (which would follow itself in
/// its set).
bool FlexAttentionLowering::fusibleHeads(ArrayRef<Lane> streams) const {
  int64_t rounds = roundsOf(streams);
  return rounds >= 2 && rounds % 2 == 0 &&
         llvm::all_of(streams, [](const Lane &lane) {
           return lane.empty() || lane.front().q != lane.back().q;
         });
}

/// Whether round r2 does what round r does, either in the same query tiles
/// with keys shifted by r2 - r key tiles (`qShift` 0) or in query tiles
/// `qShift` tiles further with the same keys (so rounds r..r2 can be one
/// loop).
bool FlexAttentionLowering::sameRound(ArrayRef<Lane> lanes, int64_t r,
                                      int64_t r2, int64_t qShift) const {
  for (const Lane &lane : lanes) {
    int64_t n = lane.size();
    // Steps r - 1 - kMaxStoreDelay (storeTiles) to r + 2.
    for (int64_t s = r - 1 - kMaxStoreDelay; s <= r + 2; ++s) {
      int64_t s2 = s + (r2 - r);
      bool in = s >= 0 && s < n, in2 = s2 >= 0 && s2 < n;
      if (in != in2)
        return false;
      if (!in)
        continue;
      const LaneStep &a = lane[s], &c = lane[s2];
      int64_t unitShift = qShift ? 0 : (r2 - r) * a.keys.units;
      if (c.q != a.q + qShift || !a.keys.sameShape(c.keys) ||
          c.keys.firstUnit != a.keys.firstUnit + unitShift ||
          a.first != c.first || a.last != c.last || a.set != c.set ||
          rowsOf(a.q) != rowsOf(c.q))
        return false;
    }
  }
  return true;
}

/// Periods of rounds from r that repeat for query tiles further on: the
/// period (even, so buffer parities repeat), the query tiles a period
/// advances, and how many periods repeat (0 if none).
FlexAttentionLowering::Period
FlexAttentionLowering::periodAt(ArrayRef<Lane> lanes, int64_t r,
                                int64_t rounds) const {
  const Lane *first = llvm::find_if(
      lanes, [&](const Lane &lane) { return r < (int64_t)lane.size(); });
  if (first == lanes.end())
    return {};
  constexpr int64_t kMaxPeriod = 256;
  for (int64_t p = 2; p <= kMaxPeriod && r + 2 * p <= rounds; p += 2) {
    if (r + p >= (int64_t)first->size())
      break;
    int64_t shift = (*first)[r + p].q - (*first)[r].q;
    if (shift <= 0)
      continue;
    int64_t count = 1;
    auto repeats = [&](int64_t j) {
      for (int64_t i = r; i < r + p; ++i)
        if (!sameRound(lanes, i, i + j * p, j * shift))
          return false;
      return true;
    };
    while (r + (count + 1) * p <= rounds && repeats(count))
      ++count;
    if (count >= 2)
      return {p, shift, count};
  }
  return {};
}

/// The query heads of one key head, against its K^T and V in `slot`; with
/// `next`, the next key head loads in pieces during the first query head's
/// rounds. Loaded whole in front, its transfer (15 us at S = 4096, V's
/// 256-byte rows) would hold the DMA queues, which serve in program order,
/// and the first rounds' P^T transposes would wait behind it. With
/// fuseHeads each query head leaves its last round to the next one's first
/// (the previous key head's last query head's to the first: `afterHead`).
void FlexAttentionLowering::queryHeads(Value batchIdx, Value kvHead, int64_t bm,
                                       int64_t slot, const HeadLoad *next,
                                       bool afterHead) {
  bool perHead = blocksShape[1] != 1;
  // `previous`: the query head before this one is unfinished.
  auto body = [&](Value g, int64_t hm, const HeadLoad *load, bool previous) {
    previous &= fuseHeads;
    Step head;
    head.batch = batchIdx;
    head.head = k.addOffsets(k.scale(kvHead, group), g);
    head.kvSlot = slot;
    Value qTHead = qResident
                       ? k.addOffset(k.scale(g, qLen), slot * group * qLen)
                       : Value();
    SmallVector<int64_t> empty;
    SmallVector<Lane> streams = laneStreams(unitKinds(bm, hm), empty);
    for (int64_t t : empty) {
      Step at = head;
      at.qTile = k.index(t);
      at.q0 = k.index(t * unit);
      at.rows = std::min(unit, qLen - t * unit);
      emptyTile(at);
    }
    // Round r computes the scores of step r + 1, P of step r and P V of
    // step r - 1 of every lane. Rounds that repeat with shifted keys run in
    // loops, and so do periods of rounds that repeat for later query tiles.
    int64_t rounds = roundsOf(streams);
    PieceSchedule pieces(load, rounds, pieceCount(), wholePieces());
    // `before(i)` runs before round i unrolled and before a loop from
    // round i; loops issue pieces round by round with `loadsInLoops`.
    auto emitRounds = [&](int64_t from, int64_t to, Value qShift,
                          llvm::function_ref<void(int64_t)> before,
                          bool loadsInLoops) {
      for (int64_t r = from; r < to;) {
        int64_t len = 1;
        while (r + len < to && sameRound(streams, r, r + len, 0))
          ++len;
        before(r);
        if (len >= 4) {
          int64_t firstPiece = pieces.issued;
          int64_t per = loadsInLoops ? loopPieces(pieces, r + len, len) : 0;
          k.forEachRotating(r, len, 2, [&](Value idx, int64_t parity) {
            if (per)
              loadUnits(*load,
                        k.addOffset(k.scale(idx, per), firstPiece - r * per),
                        -1, per);
            round(head, qTHead, streams, r, idx, parity, qShift, true);
          });
        } else {
          for (int64_t i = r; i < r + len; ++i) {
            if (i > r)
              before(i);
            round(head, qTHead, streams, i, k.index(i), i % 2, qShift, false);
          }
        }
        r += len;
      }
    };
    auto issueDue = [&](int64_t i) { issuePieces(pieces, i); };
    // With fuseHeads the query head before (of the key head before at g =
    // 0) ends in this head's first two rounds, its rounds R - 1 and R with
    // this one's -1 and 0: one stream of steps, as if its lanes went on into
    // this head's (fusibleHeads: the parities and state sets line up).
    int64_t first = 0, end = fuseHeads ? rounds - 1 : rounds;
    if (previous) {
      Step before = head;
      before.head = k.addOffset(head.head, -1);
      std::optional<int64_t> g0 = getConstantIntValue(g);
      before.kvSlot = g0 && *g0 == 0 ? 1 - slot : slot;
      RoundAt penultimate{before,  streams, rounds - 1, k.index(rounds - 1),
                          Value(), false};
      round(head, qTHead, streams, -1, Value(), 1, Value(), false,
            &penultimate);
      // Its lse parts are in (step R - 1's exps): their logs before this
      // head's first exps write its own.
      if (lse)
        finishLse(before);
      RoundAt last{before, streams, rounds, k.index(rounds), Value(), false};
      round(head, qTHead, streams, 0, k.index(0), 0, Value(), false, &last);
      storesAfter(before, streams, rounds, /*withLse=*/false);
      first = 1;
    } else {
      round(head, qTHead, streams, -1, Value(), 1, Value(), false);
    }
    for (int64_t r = first; r < end;) {
      Period period = periodAt(streams, r, end);
      if (period.count) {
        // `per` pieces an iteration, spread over its rounds.
        int64_t periodsEnd = r + period.count * period.rounds;
        issuePieces(pieces, r);
        int64_t firstPiece = pieces.issued;
        int64_t per = loopPieces(pieces, periodsEnd, period.count);
        k.forEach(period.count, [&](Value m) {
          int64_t done = 0;
          auto before = [&](int64_t i) {
            int64_t due = std::min(per, (i - r) * per / period.rounds + 1);
            for (; done < due; ++done)
              loadUnits(*load, k.addOffset(k.scale(m, per), firstPiece + done),
                        -1, 1);
          };
          emitRounds(r, r + period.rounds, k.scale(m, period.tiles), before,
                     false);
          before(r + period.rounds);
        });
        r = periodsEnd;
        continue;
      }
      int64_t len = 1;
      while (r + len < end && sameRound(streams, r, r + len, 0))
        ++len;
      emitRounds(r, r + len, Value(), issueDue, true);
      r += len;
    }
    issuePieces(pieces, rounds + 1);
    if (!fuseHeads)
      finishHead(head, streams, rounds);
  };
  if (!perHead) {
    int64_t from = 0;
    if (next || fuseHeads)
      body(k.index(from++), 0, next, afterHead);
    if (from < group)
      k.forEach(group - from,
                [&](Value g) { body(k.addOffset(g, from), 0, nullptr, true); });
  } else {
    // Per-head structures: the key heads are unrolled, so is this.
    std::optional<int64_t> kvh = getConstantIntValue(kvHead);
    assert(kvh && "per-head block masks unroll the key heads");
    for (int64_t g = 0; g < group; ++g)
      body(k.index(g), *kvh * group + g, g == 0 ? next : nullptr, false);
  }
}

/// The rounds of a query head from `from` to its last (P V of its last
/// steps), then the stores after them.
void FlexAttentionLowering::finishHead(const Step &head, ArrayRef<Lane> streams,
                                       int64_t from) {
  int64_t rounds = roundsOf(streams);
  for (int64_t r = from; r <= rounds; ++r)
    round(head, Value(), streams, r, k.index(r), r % 2, Value(), false);
  storesAfter(head, streams, rounds, bool(lse));
}

/// The output stores delayed past a query head's last round, and its lse.
void FlexAttentionLowering::storesAfter(const Step &head,
                                        ArrayRef<Lane> streams, int64_t rounds,
                                        bool withLse) {
  for (int64_t r = rounds + 1; r <= rounds + kMaxStoreDelay; ++r) {
    TileBuilder::TileScope scope(k);
    RoundAt at{head, streams, r, k.index(r), Value(), false};
    storeTiles(at, r, r % 2);
  }
  if (withLse)
    finishLse(head);
}

/// Pieces of a head load: one key unit (and query tile) each.
int64_t FlexAttentionLowering::pieceCount() const {
  return std::max(kvUnits, (qLen + unit - 1) / unit);
}

/// The first pieces, whole in V, K^T and Q^T: loops may index them.
int64_t FlexAttentionLowering::wholePieces() const {
  return qResident ? std::min(kvLen, qLen) / unit : kvLen / unit;
}

/// Issues (unrolled) the pieces due before round r.
void FlexAttentionLowering::issuePieces(PieceSchedule &s, int64_t r) {
  for (int64_t due = s.dueBefore(r); s.issued < due; ++s.issued)
    loadUnits(*s.load, k.index(s.issued), s.issued, 1);
}

/// The pieces due before round `to` for a loop of `steps` iterations from
/// the next one: `per` an iteration (the loop issues pieces [issued, issued
/// + per * steps), whole ones, affine in its index); the others are issued
/// now, early rather than after the loop. Returns per; all count as issued.
int64_t FlexAttentionLowering::loopPieces(PieceSchedule &s, int64_t to,
                                          int64_t steps) {
  int64_t due = s.dueBefore(to);
  int64_t per = std::max<int64_t>(0, std::min(due, s.whole) - s.issued) / steps;
  for (int64_t i = s.issued + per * steps; i < due; ++i)
    loadUnits(*s.load, k.index(i), i, 1);
  s.issued = std::max(s.issued, due);
  return per;
}

/// A query tile whose keys are all masked: out = 0 and lse = -inf.
void FlexAttentionLowering::emptyTile(const Step &at) {
  TileBuilder::TileScope scope(k);
  Value zeros = k.tile(MemorySpace::sbuf, {at.rows, vDim}, inElt);
  b.create<nisa::MemsetOp>(zeros, APFloat(0.0));
  Value outOffset = k.addOffsets(k.addOffsets(k.scale(at.batch, outStrides[0]),
                                              k.scale(at.head, outStrides[1])),
                                 k.scale(at.q0, outStrides[2]));
  k.dma(zeros, k.view(out, outOffset, {at.rows, vDim}, {outStrides[2], 1}));
  if (!lse)
    return;
  // Row sum 0 and -max 0: lse = log(0) - 0 = -inf.
  Value zero = k.tile(MemorySpace::sbuf, {at.rows, 1}, f32);
  b.create<nisa::MemsetOp>(zero, APFloat(0.0));
  storeLseParts(at, zero, zero);
}

/// Round r of a query head: every lane's O += P V of step r - 1 (and the
/// query tile's output after its last step), the scores and -max of step
/// r + 1, then P and P^T of step r. P V waits a round for P^T: the DMA
/// transposes' latency. Stages run lane by lane so the engines overlap the
/// lanes. In a loop (`affine`), round r is the template and `rIdx` the
/// round; `qShift` (query tiles) moves every query tile (in a loop over
/// periods). With `finishing` (a round of the query head before, of this
/// round's parity: fuseHeads) the round is also that one: its last steps'
/// P and P V run with this head's first scores.
void FlexAttentionLowering::round(const Step &head, Value qTHead,
                                  ArrayRef<Lane> streams, int64_t r, Value rIdx,
                                  int64_t parity, Value qShift, bool affine,
                                  const RoundAt *finishing) {
  TileBuilder::TileScope scope(k);
  RoundAt at{head, streams, r, rIdx, qShift, affine};
  // A lane's step s of this head, or else of the finishing one.
  auto either = [&](int64_t lane, int64_t s, int64_t par) {
    std::optional<Cursor> c = cursor(at, lane, s, par);
    if (!c && finishing)
      c = cursor(*finishing, lane, s - r + finishing->r, par);
    return c;
  };
  SmallVector<std::optional<Cursor>> prev, next, cur;
  for (int64_t i = 0; i < lanes; ++i) {
    prev.push_back(either(i, r - 1, 1 - parity));
    next.push_back(cursor(at, i, r + 1, 1 - parity));
    cur.push_back(either(i, r, parity));
  }
  // mask_mod depends on indices only: GpSimd computes it two steps ahead,
  // so the masking never waits for it.
  if (r == -1)
    for (int64_t i = 0; i < lanes; ++i)
      if (auto c = cursor(at, i, 0, 0); c && c->step->keys.partial())
        maskBias(*c);
  // Step r + 2's first: GpSimd has it done while it waits for this round's
  // maxima, not in front of the next round's.
  for (int64_t i = 0; i < lanes; ++i)
    if (auto c = cursor(at, i, r + 2, parity); c && c->step->keys.partial())
      maskBias(*c);
  for (auto &c : next)
    if (c) {
      if (c->step->first && !qResident)
        startTile(*c);
      scores(*c, queryT(*c, qTHead));
    }
  for (auto &c : next)
    if (c)
      rowMax(*c);
  for (auto &c : cur)
    if (c) {
      probabilities(*c);
      dmaTransposeP(*c);
    }
  // Lane by lane, P V of the step before (its DMA-transposed chunks came
  // a lane's exp earlier than the next lane's) and the TensorE transpose.
  for (int64_t i = 0; i < lanes; ++i) {
    if (prev[i])
      accumulateO(*prev[i]);
    if (cur[i])
      transposeP(*cur[i]);
  }
  for (auto &c : cur)
    if (c)
      evictPT(*c);
  storeTiles(at, r, parity);
  if (finishing)
    storeTiles(*finishing, finishing->r, parity);
  for (auto &c : prev)
    if (c && c->step->last)
      finishTile(*c);
  for (auto &c : next)
    if (c && !c->step->first)
      rescaleFactor(*c);
}

/// Step `s` of `lane` in round `at.r` (none past the lane's ends), with
/// buffer parity `par`.
std::optional<FlexAttentionLowering::Cursor>
FlexAttentionLowering::cursor(const RoundAt &at, int64_t lane, int64_t s,
                              int64_t par) {
  if (s < 0 || s >= (int64_t)at.streams[lane].size())
    return std::nullopt;
  const LaneStep &step = at.streams[lane][s];
  Cursor c{lane, &step, at.head, par};
  c.at.qTile = k.index(step.q);
  c.at.q0 = k.index(step.q * unit);
  if (at.qShift) {
    c.at.qTile = k.addOffsets(c.at.qTile, at.qShift);
    c.at.q0 = k.scale(c.at.qTile, unit);
  }
  c.at.rows = rowsOf(step.q);
  c.at.width = step.keys.width;
  c.at.unit =
      at.affine
          ? k.addOffset(k.scale(k.addOffset(at.rIdx, -at.r), step.keys.units),
                        step.keys.firstUnit)
          : k.index(step.keys.firstUnit);
  return c;
}

/// How many 128-key chunks of P a lane's TensorE transposes (the last
/// ones of a step), and where in the transpose bank: the bank's chunks
/// shared out over the lanes, the first lanes one more.
std::pair<int64_t, int64_t>
FlexAttentionLowering::peChunksOf(int64_t lane) const {
  int64_t per = std::max<int64_t>(1, bank / unit);
  if (lanes >= per)
    return {1, lane};
  int64_t base = per / lanes, extra = per % lanes;
  return {base + (lane < extra ? 1 : 0), lane * base + std::min(lane, extra)};
}

/// How many of a step's 128-key chunks of P DMAs transpose SBUF to SBUF:
/// the first ones (all full), all but the lane's TensorE chunks. All on
/// TensorE would spend a third of its time on transposes, and the
/// evictions more than VectorE's max and ScalarE's exp leave those
/// engines; all by DMA would make the DMA queues the bound (a transposing
/// SBUF-to-SBUF DMA runs at half the DMA rate).
int64_t FlexAttentionLowering::dmaChunks(const Cursor &c) const {
  return std::max<int64_t>(0, (c.at.width + unit - 1) / unit -
                                  peChunksOf(c.lane).first);
}

/// P^T of a step's last chunks by TensorE into its lane's columns of the
/// transpose bank.
void FlexAttentionLowering::transposeP(const Cursor &c) {
  int64_t rows = c.at.rows, at = peChunksOf(c.lane).second;
  for (int64_t i = dmaChunks(c); i * unit < c.at.width; ++i) {
    int64_t keys = std::min(unit, c.at.width - i * unit);
    b.create<nisa::MatmulOp>(
        k.view(pBuf, k.index(slotOf(c) + i * unit), {rows, keys},
               {2 * lanes * bank, 1}),
        k.view(ident, k.index(0), {rows, rows}, {unit, 1}),
        k.view(psum, k.index(pTBank * bank + (at + i - dmaChunks(c)) * unit),
               {keys, rows}, {psumCols, 1}));
  }
}

/// P^T of the step's first dmaChunks chunks by one SBUF-to-SBUF
/// transposing DMA, triggered from ScalarE's queue right after exp wrote P.
void FlexAttentionLowering::dmaTransposeP(const Cursor &c) {
  int64_t rows = c.at.rows, n = dmaChunks(c);
  if (n == 0)
    return;
  b.create<nisa::DmaCopyOp>(k.view(pBuf, k.index(slotOf(c)), {unit, n, rows},
                                   {1, unit, 2 * lanes * bank}),
                            k.view(pTBuf, k.index(slotOf(c)), {unit, n, rows},
                                   {2 * lanes * bank, rows, 1}),
                            nisa::Engine::scalar);
}

/// TensorE's chunks of P^T from PSUM to the step's P^T slot (by ScalarE:
/// VectorE has the max and O's rescale), the matmul input of P V. A last
/// chunk of fewer keys leaves rows of P^T unwritten: not read.
void FlexAttentionLowering::evictPT(const Cursor &c) {
  int64_t rows = c.at.rows, first = dmaChunks(c);
  int64_t n = (c.at.width + unit - 1) / unit - first;
  int64_t keys = std::min(unit, c.at.width - first * unit);
  int64_t at = peChunksOf(c.lane).second;
  if (n == 1) {
    b.create<nisa::CopyOp>(k.view(psum, k.index(pTBank * bank + at * unit),
                                  {keys, rows}, {psumCols, 1}),
                           k.view(pTBuf, k.index(slotOf(c) + first * rows),
                                  {keys, rows}, {2 * lanes * bank, 1}),
                           nisa::Engine::scalar);
    return;
  }
  // Chunk j is unit columns from the last in PSUM, rows in P^T.
  b.create<nisa::CopyOp>(k.view(psum, k.index(pTBank * bank + at * unit),
                                {keys, n, rows}, {psumCols, unit, 1}),
                         k.view(pTBuf, k.index(slotOf(c) + first * rows),
                                {keys, n, rows}, {2 * lanes * bank, rows, 1}),
                         nisa::Engine::scalar);
}

/// O = O * alpha + P V (O = P V on the query tile's first key step).
void FlexAttentionLowering::accumulateO(const Cursor &c) {
  int64_t rows = c.at.rows, width = c.at.width;
  const LaneStep &step = *c.step;
  int64_t outsPerBank = std::max<int64_t>(1, bank / vDim);
  Value oPs = k.view(psum,
                     k.index((2 * lanes + c.lane / outsPerBank) * bank +
                             c.lane % outsPerBank * vDim),
                     {rows, vDim}, {psumCols, 1});
  for (int64_t i = 0; i * unit < width; ++i) {
    int64_t keys = std::min(unit, width - i * unit);
    Value stationary = k.view(pTBuf, k.index(slotOf(c) + i * rows),
                              {keys, rows}, {2 * lanes * bank, 1});
    Value moving = k.view(vS,
                          k.addOffset(k.scale(c.at.unit, vDim),
                                      c.at.kvSlot * kvUnits * vDim + i * vDim),
                          {keys, vDim}, {vSStride, 1});
    auto mm = b.create<nisa::MatmulOp>(stationary, moving, oPs);
    if (i > 0)
      mm.setAccumulate(true);
  }
  Value os = k.view(o, k.index((stateColumn(c.lane, step))*vDim), {rows, vDim},
                    {kSets * lanes * vDim, 1});
  if (step.first)
    b.create<nisa::CopyOp>(oPs, os, nisa::Engine::vector);
  else
    scalarTensorTensor(os, column(alpha, 2 * c.lane + c.parity, rows), 0.0,
                       nisa::AluOp::multiply, oPs, nisa::AluOp::add, os,
                       nisa::Engine::vector);
}

Value FlexAttentionLowering::psumBank(int64_t bankIdx, int64_t rows,
                                      int64_t cols) {
  return k.view(psum, k.index(bankIdx * bank), {rows, cols}, {psumCols, 1});
}

/// Column i of a [128, n] tile, `rows` rows.
Value FlexAttentionLowering::column(Value t, int64_t i, int64_t rows) {
  int64_t n = cast<MemRefType>(t.getType()).getShape()[1];
  return k.view(t, k.index(i), {rows, 1}, {n, 1});
}

Value FlexAttentionLowering::scoresOf(const Cursor &c) {
  return psumBank(scoreBankOf(c), c.at.rows, c.at.width);
}

/// What exp reads: plain scores in PSUM (masked in place; the scale rides on
/// exp) or the modified, masked scores in SBUF.
Value FlexAttentionLowering::expSource(const Cursor &c) {
  if (scaleOnExp)
    return scoresOf(c);
  return k.view(expSrc, k.index((2 * c.lane + c.parity) * bank),
                {c.at.rows, c.at.width}, {2 * lanes * bank, 1});
}

Value FlexAttentionLowering::negmOf(int64_t lane, int64_t parity,
                                    int64_t rows) {
  return column(negm, 2 * lane + parity, rows);
}

/// Q^T of the cursor's query tile: resident, or loaded by startTile.
Value FlexAttentionLowering::queryT(const Cursor &c, Value qTHead) {
  if (qResident)
    return k.view(qT, k.addOffsets(qTHead, c.at.q0), {dim, c.at.rows},
                  {qTStride, 1});
  return k.view(qLaneT, k.index((stateColumn(c.lane, *c.step))*unit),
                {dim, c.at.rows}, {kSets * lanes * unit, 1});
}

/// Q^T of a query tile when Q is not resident: a transposing DMA.
void FlexAttentionLowering::startTile(const Cursor &c) {
  Value qOffset = k.addOffsets(
      k.addOffsets(k.addOffset(k.scale(c.at.batch, q.strides[0]), q.offset),
                   k.scale(c.at.head, q.strides[1])),
      k.scale(c.at.q0, q.strides[2]));
  k.dma(
      k.view(q.buffer, qOffset, {dim, c.at.rows}, {q.strides[3], q.strides[2]}),
      queryT(c, Value()));
}

/// S = Q K^T of the cursor's step into its score bank.
void FlexAttentionLowering::scores(const Cursor &c, Value qTs) {
  b.create<nisa::MatmulOp>(qTs,
                           k.view(kT,
                                  k.addOffset(k.scale(c.at.unit, unit),
                                              c.at.kvSlot * kvUnits * unit),
                                  {dim, c.at.width}, {kTStride, 1}),
                           scoresOf(c));
  if (!maskOnTensorE())
    return;
  // The partial units' mask added in PSUM by TensorE (c I times the bias):
  // VectorE, the kernel's bound, then only takes the max.
  int64_t rows = c.at.rows;
  for (auto [offset, count] : c.step->keys.partialRuns) {
    int64_t cols = std::min(count * unit, c.at.width - offset * unit);
    b.create<nisa::MatmulOp>(
         k.view(maskIdentity, k.index(0), {rows, rows}, {unit, 1}),
         biasOf(c, offset, cols),
         k.view(psum, k.index(scoreBankOf(c) * bank + offset * unit),
                {rows, cols}, {psumCols, 1}))
        .setAccumulate(true);
  }
}

/// score_mod and the mask on the step's scores (into expSource), then the
/// new -max. Plain scores stay in PSUM: the partial units get their mask
/// bias added in place.
void FlexAttentionLowering::rowMax(const Cursor &c) {
  const Step &at = c.at;
  int64_t rows = at.rows, width = at.width;
  Value s = scoresOf(c), dst = expSource(c);
  if (scaleOnExp) {
    // The partial units' bias in place, unless scores() accumulated it.
    for (auto [offset, count] : c.step->keys.partialRuns) {
      if (maskOnTensorE())
        continue;
      int64_t cols = std::min(count * unit, width - offset * unit);
      Value part = k.view(psum, k.index(scoreBankOf(c) * bank + offset * unit),
                          {rows, cols}, {psumCols, 1});
      b.create<nisa::TensorTensorOp>(nisa::AluOp::add, part,
                                     biasOf(c, offset, cols), part);
    }
    emitRowMax(c, s);
    return;
  }
  Value sc = k.tile(MemorySpace::sbuf, {rows, width}, f32);
  b.create<nisa::ActivationOp>(s, sc, Value(), nisa::ActivationFn::identity,
                               APFloat(scale), APFloat(0.0));
  Value src = sc;
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
    src = materialize(*r, at, true);
  }
  // Tiles of one kind here: a partial tile is masked whole.
  if (c.step->keys.partial())
    b.create<nisa::TensorTensorOp>(nisa::AluOp::add, src, biasOf(c, 0, width),
                                   dst, nisa::Engine::gpsimd);
  else
    b.create<nisa::CopyOp>(src, dst, nisa::Engine::gpsimd);
  emitRowMax(c, dst);
}

/// The mask of a step's partial units as a 0 / -inf bias (GpSimd). A mask
/// of q - kv alone (causal, sliding windows: every index it reads has no
/// batch or head term and opposite q and kv terms) is the same for every
/// unit at one static q0 - kv0: it is computed once, into `maskCache`.
void FlexAttentionLowering::maskBias(const Cursor &c) {
  for (auto [offset, count] : c.step->keys.partialRuns) {
    Step sub = c.at;
    sub.unit = k.addOffset(c.at.unit, offset);
    sub.width = std::min(count * unit, c.at.width - offset * unit);
    if (cachedMask(c, offset, sub.width))
      continue;
    SmallVector<Affine> affines;
    affineLog = &affines;
    FailureOr<Operand> r = modifier(op.getMaskMod(), maskArgs, sub);
    affineLog = nullptr;
    if (::mlir::failed(r)) {
      failed = true;
      return;
    }
    if (!maskShiftInvariant)
      maskShiftInvariant = llvm::all_of(affines, [](const Affine &a) {
        return a.cb == 0 && a.ch == 0 && a.cq + a.ckv == 0;
      });
    Value bias = biasOf(c, offset, sub.width);
    std::optional<int64_t> delta = staticDelta(c, offset);
    if (maskCache && *maskShiftInvariant && delta &&
        maskCacheUsed + sub.width <= kMaskCacheCols) {
      cachedMasks.push_back({*delta, sub.rows, sub.width, maskCacheUsed});
      maskCacheUsed += sub.width;
      bias = *cachedMask(c, offset, sub.width);
    }
    if (r->kind == Operand::imm) {
      double masked = maskOnTensorE() ? -kTensorMaskScale
                                      : -std::numeric_limits<float>::infinity();
      b.create<nisa::MemsetOp>(bias, APFloat(r->value != 0.0 ? 0.0 : masked));
      continue;
    }
    auto full = [&](Value t) {
      return k.view(t, k.index(0), {sub.rows, sub.width}, {bank, 1});
    };
    b.create<nisa::SelectOp>(materialize(*r, sub, true), full(zeros),
                             full(maskOnTensorE() ? maskFill : negInf), bias,
                             nisa::Engine::gpsimd);
  }
}

/// q0 - kv0 of the unit `offset` units into a step, when both are static
/// (unrolled rounds).
std::optional<int64_t> FlexAttentionLowering::staticDelta(const Cursor &c,
                                                          int64_t offset) {
  std::optional<int64_t> q0 = getConstantIntValue(c.at.q0);
  std::optional<int64_t> u = getConstantIntValue(c.at.unit);
  if (!q0 || !u)
    return std::nullopt;
  return *q0 - (*u + offset) * unit;
}

/// The cached bias of a step's partial run, if computed already.
std::optional<Value> FlexAttentionLowering::cachedMask(const Cursor &c,
                                                       int64_t offset,
                                                       int64_t cols) {
  std::optional<int64_t> delta = staticDelta(c, offset);
  if (!maskShiftInvariant || !*maskShiftInvariant || !delta)
    return std::nullopt;
  for (const CachedMask &m : cachedMasks)
    if (m.delta == *delta && m.rows == c.at.rows && m.cols == cols)
      return k.view(maskCache, k.index(m.col), {m.rows, cols},
                    {kMaskCacheCols, 1});
  return std::nullopt;
}

/// Columns [offset units, + cols) of a step's mask bias.
Value FlexAttentionLowering::biasOf(const Cursor &c, int64_t offset,
                                    int64_t cols) {
  if (std::optional<Value> cached = cachedMask(c, offset, cols))
    return *cached;
  return k.view(maskBiases,
                k.index((2 * c.lane + c.parity) * bank + offset * unit),
                {c.at.rows, cols}, {2 * lanes * bank, 1});
}

/// -max of the step's final scores `src`: min(-max(row), previous -max).
void FlexAttentionLowering::emitRowMax(const Cursor &c, Value src) {
  int64_t rows = c.at.rows;
  Value mt = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
  b.create<nisa::TensorReduceOp>(nisa::AluOp::max, src, mt);
  Value old = c.step->first ? column(negmInit, 0, rows)
                            : negmOf(c.lane, 1 - c.parity, rows);
  scalarTensorTensor(mt, Value(), scaleOnExp ? -scale : -1.0,
                     nisa::AluOp::multiply, old, nisa::AluOp::min,
                     negmOf(c.lane, c.parity, rows), nisa::Engine::gpsimd);
}

/// P = exp(S - max) on ScalarE with its fp32 row sums, into the step's
/// pBuf slot; l = l * alpha + sums (the sums themselves at a query tile's
/// first step). After a query tile's last step l and -max are final: their
/// lse parts are kept now, before a later step reuses the -max column.
void FlexAttentionLowering::probabilities(const Cursor &c) {
  int64_t rows = c.at.rows;
  const LaneStep &step = *c.step;
  Value p = k.view(pBuf, k.index(slotOf(c)), {rows, c.at.width},
                   {2 * lanes * bank, 1});
  Value ls = column(l, stateColumn(c.lane, step), rows);
  Value sums = step.first ? ls : k.tile(MemorySpace::sbuf, {rows, 1}, f32);
  b.create<nisa::ActivationOp>(expSource(c), p, negmOf(c.lane, c.parity, rows),
                               Value(), sums, nisa::ActivationFn::exp,
                               APFloat(scaleOnExp ? scale : 1.0), APFloat(0.0));
  if (!step.first)
    scalarTensorTensor(ls, column(alpha, 2 * c.lane + c.parity, rows), 0.0,
                       nisa::AluOp::multiply, sums, nisa::AluOp::add, ls,
                       nisa::Engine::gpsimd);
  if (lse && step.last)
    storeLseParts(c.at, ls, negmOf(c.lane, c.parity, rows));
}

/// alpha = exp(max_old - max_new) rescales what came before this step,
/// as e^x on GpSimd: ScalarE's exps and VectorE's max bound the kernel.
void FlexAttentionLowering::rescaleFactor(const Cursor &c) {
  int64_t rows = c.at.rows;
  Value a = column(alpha, 2 * c.lane + c.parity, rows);
  b.create<nisa::TensorTensorOp>(
      nisa::AluOp::subtract, negmOf(c.lane, c.parity, rows),
      negmOf(c.lane, 1 - c.parity, rows), a, nisa::Engine::gpsimd);
  b.create<nisa::TensorScalarOp>(nisa::AluOp::pow, a, a, Value(), APFloat(M_E),
                                 /*reverse=*/true, nisa::Engine::gpsimd);
}

/// out = O / max(l, tiny) (a fully masked row has O = 0 and l = 0),
/// stored (lse's parts were kept by probabilities). All in SBUF: GpSimd
/// computes it, off VectorE.
void FlexAttentionLowering::finishTile(const Cursor &c) {
  const Step &at = c.at;
  int64_t rows = at.rows, at2 = stateColumn(c.lane, *c.step);
  Value ls = column(l, at2, rows);
  Value lc = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
  b.create<nisa::TensorScalarOp>(
      nisa::AluOp::max, ls, lc, Value(),
      APFloat(double(std::numeric_limits<float>::min())), false,
      nisa::Engine::gpsimd);
  b.create<nisa::TensorScalarOp>(
      nisa::AluOp::divide,
      k.view(o, k.index(at2 * vDim), {rows, vDim}, {kSets * lanes * vDim, 1}),
      outputOf(c), lc, APFloat(0.0), false, nisa::Engine::gpsimd);
  if (c.lane == 0)
    storeTile(c);
}

/// The outputs of the query tiles lane i >= 1 finished d = min(i,
/// kMaxStoreDelay) rounds ago (its step r - 1 - d was the tile's last; lane 0
/// stores in finishTile): the lanes end their tiles in one round, and their
/// stores at once held the DMA queues in front of the next rounds' P^T
/// transposes. Emitted before this round's finishTile, which may reuse a lane's
/// output slot two tiles (rounds) on.
void FlexAttentionLowering::storeTiles(const RoundAt &at, int64_t r,
                                       int64_t parity) {
  for (int64_t i = 1; i < lanes; ++i) {
    int64_t s = r - 1 - std::min(i, kMaxStoreDelay);
    std::optional<Cursor> c =
        cursor(at, i, s, (r - s) % 2 == 0 ? parity : 1 - parity);
    if (c && c->step->last)
      storeTile(*c);
  }
}

/// A query tile's output in SBUF: its lane and state set's slot of oOut.
Value FlexAttentionLowering::outputOf(const Cursor &c) {
  int64_t at2 = stateColumn(c.lane, *c.step);
  return k.view(oOut, k.index(at2 * vDim), {c.at.rows, vDim},
                {kSets * lanes * vDim, 1});
}

/// A finished query tile's output (finishTile's) to HBM.
void FlexAttentionLowering::storeTile(const Cursor &c) {
  const Step &at = c.at;
  Value outOffset = k.addOffsets(k.addOffsets(k.scale(at.batch, outStrides[0]),
                                              k.scale(at.head, outStrides[1])),
                                 k.scale(at.q0, outStrides[2]));
  k.dma(outputOf(c),
        k.view(out, outOffset, {at.rows, vDim}, {outStrides[2], 1}));
}

/// A query tile's row sums and -max into column at.qTile of lseSums and
/// lseNegMax.
void FlexAttentionLowering::storeLseParts(const Step &at, Value sums,
                                          Value negMax) {
  auto col = [&](Value t) {
    return k.view(t, at.qTile, {at.rows, 1}, {qTiles, 1});
  };
  b.create<nisa::CopyOp>(sums, col(lseSums), nisa::Engine::gpsimd);
  b.create<nisa::CopyOp>(negMax, col(lseNegMax), nisa::Engine::gpsimd);
}

/// lse = log(row sum) - (-max) of every query of a head: one ScalarE table
/// load for the whole head. Query q is row q % 128 of column q / 128.
void FlexAttentionLowering::finishLse(const Step &head) {
  Value lseBase = k.addOffsets(k.scale(head.batch, lseStrides[0]),
                               k.scale(head.head, lseStrides[1]));
  int64_t full = qLen / unit, rest = qLen % unit;
  auto block = [&](int64_t col, int64_t rows, int64_t cols) {
    auto sbuf = [&](Value t) {
      return k.view(t, k.index(col), {rows, cols}, {qTiles, 1});
    };
    b.create<nisa::ActivationOp>(sbuf(lseSums), sbuf(lseSums), Value(),
                                 nisa::ActivationFn::log, APFloat(1.0),
                                 APFloat(0.0));
    b.create<nisa::TensorTensorOp>(nisa::AluOp::subtract, sbuf(lseSums),
                                   sbuf(lseNegMax), sbuf(lseSums),
                                   nisa::Engine::gpsimd);
    k.dma(sbuf(lseSums), k.view(lse, k.addOffset(lseBase, col * unit),
                                {rows, cols}, {1, unit}));
  };
  if (full)
    block(0, unit, full);
  if (rest)
    block(full, rest, 1);
}

/// dst = (a op0 s) op1 other, s a column or an immediate.
void FlexAttentionLowering::scalarTensorTensor(Value a, Value sCol, double sImm,
                                               nisa::AluOp op0, Value other,
                                               nisa::AluOp op1, Value dst,
                                               nisa::Engine engine) {
  b.create<nisa::ScalarTensorTensorOp>(op0, op1, a, other, dst, sCol,
                                       APFloat(sImm), engine);
}

} // namespace mlir::neuron::flex

namespace mlir::neuron {
namespace {
/// The forward kernel builds with the function's TileBuilder alone.
struct FlexAttentionPattern
    : OpTilePattern<FlexAttentionPattern, FlexAttentionOp> {
  bool isSizeGeneric(Operation *) const override { return true; }
  LogicalResult lowerOp(FlexAttentionOp op, KernelLowering &k) const {
    if (!tensorType(op.getQuery()).hasStaticShape() ||
        !tensorType(op.getKey()).hasStaticShape() ||
        !tensorType(op.getValue()).hasStaticShape())
      return flex::FlexAttentionLowering(k, op).runDynamic();
    if (flex::isDecodeAttention(op))
      return flex::FlexAttentionLowering(k, op).runDecode();
    return flex::FlexAttentionLowering(k, op).run();
  }
};
} // namespace

void populateFlexAttentionPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<FlexAttentionPattern>());
}
} // namespace mlir::neuron
