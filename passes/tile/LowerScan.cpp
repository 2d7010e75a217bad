//===- LowerScan.cpp - neuron.cumsum as a blocked scan on TensorE ---------===//
//
// A prefix sum is a matmul with a triangular matrix. With the scanned dim
// on the partitions (the contraction), U[k, m] = (k <= m) gives
// (U^T x)[m, n] = sum_{k <= m} x[k, n]: a 128-long inclusive scan of up to
// 512 columns in one TensorE instruction. Longer scans go block by block,
// and the carry joins the same PSUM accumulation group as a second matmul:
// E^T prev with E[k, m] = (k == 127) broadcasts the previous block's last
// row (its running totals) to every partition. Each 128-block thus costs
// two matmuls, one PSUM eviction and its two transfers; VectorE does no
// scan work. (A recurrence on VectorE, NKI's tensor_tensor_scan, walks the
// free axis one element per cycle per lane.) A scan along the contiguous
// dim keeps rows on the partitions instead (lowerRowScan): TensorE
// transposes each block and scans it with the operands' roles swapped, so
// no transfer is strided.
//
// Numerics: the engines' fp32 datapath. bf16/f16 inputs multiply exact 0/1
// entries in their own dtype; f32 and integer inputs (loaded into fp32
// tiles by a casting DMA) run fp32 matmuls at a quarter of the bf16 rate.
// PSUM accumulates in fp32 and the carry stays fp32, so a result is rounded
// once, like eager's fp32 accumulation of bf16 scans. Integer sums are
// exact while they stay below 2^24 in magnitude: position ids and counts.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

/// A scan along the contiguous dim (position ids: mask.cumsum(1)): rows
/// stay on the partitions, as they lie in HBM, so every transfer is
/// contiguous (a transposing DMA of one element per descriptor would bound
/// the kernel). Per [128 rows, 128] block, TensorE transposes it (x as the
/// stationary operand against the identity I) and scans it with the roles
/// swapped, out = (x^T)^T U, which puts the rows back on the partitions.
/// The carry is a [rows, 1] column of running totals: the eviction adds it
/// (tensor_scalar on the PSUM result, the eviction the block needs anyway),
/// and the block's last column becomes the next carry.
void KernelLowering::forEachScanBlock(
    int64_t len, int64_t slots,
    llvm::function_ref<void(Value, int64_t, int64_t, bool)> block) {
  const int64_t p = target.partitions;
  int64_t full = len / p, rem = len % p;
  if (full > 0)
    block(index(0), 0, p, true);
  if (full > 1)
    forEachRotating(1, full - 1, slots, [&](Value blk, int64_t slot) {
      block(blk, slot, p, false);
    });
  if (rem)
    block(index(full), full % slots, rem, full == 0);
}

void KernelLowering::lowerRowScan(Value in, Value out, int64_t rows,
                                  int64_t len, Type mmElt, Value tri,
                                  Value identity) {
  Type f32 = b.getF32Type();
  const int64_t p = target.partitions;
  const int64_t slots = 2;
  forTiles(rows, p, [&](Value r0, int64_t rt) {
    TileScope scope(*this);
    Value xs = tile(MemorySpace::sbuf, {p, slots * p}, mmElt);
    Value xts = tile(MemorySpace::sbuf, {p, slots * p}, mmElt);
    Value sums = tile(MemorySpace::psum, {p, 2 * slots * p}, f32);
    Value outs = tile(MemorySpace::sbuf, {p, slots * p}, f32);
    Value carry = tile(MemorySpace::sbuf, {p, 1}, f32);
    auto block = [&](Value blk, int64_t slot, int64_t kt, bool first) {
      Value at = addOffsets(scale(r0, len), scale(blk, p));
      auto onChip = [&](Value t, int64_t r, int64_t c) {
        return view(t, index(slot * p), {r, c}, {slots * p, 1});
      };
      auto psum = [&](int64_t which, int64_t r, int64_t c) {
        return view(sums, index((2 * slot + which) * p), {r, c},
                    {2 * slots * p, 1});
      };
      Value x = onChip(xs, rt, kt), xt = onChip(xts, kt, rt);
      dma(view(in, at, {rt, kt}, {len, 1}), x);
      b.create<nisa::MatmulOp>(x, view(identity, index(0), {rt, rt}, {p, 1}),
                               psum(0, kt, rt));
      b.create<nisa::CopyOp>(psum(0, kt, rt), xt);
      b.create<nisa::MatmulOp>(xt, view(tri, index(0), {kt, kt}, {p, 1}),
                               psum(1, rt, kt));
      Value result = onChip(outs, rt, kt);
      if (first)
        b.create<nisa::CopyOp>(psum(1, rt, kt), result);
      else
        b.create<nisa::TensorScalarOp>(
            nisa::AluOp::add, psum(1, rt, kt), result,
            view(carry, index(0), {rt, 1}, {1, 1}), APFloat(0.0), false);
      b.create<nisa::CopyOp>(
          view(outs, index(slot * p + kt - 1), {rt, 1}, {slots * p, 1}),
          view(carry, index(0), {rt, 1}, {1, 1}));
      b.create<nisa::DmaCopyOp>(result, view(out, at, {rt, kt}, {len, 1}),
                                nisa::Engine::scalar);
    };
    forEachScanBlock(len, slots, block);
  });
}

void KernelLowering::lowerCumsum(CumsumOp op) {
  auto inType = tensorType(op.getInput());
  ArrayRef<int64_t> shape = inType.getShape();
  int64_t dim = op.getDim();
  int64_t outer = product(shape.take_front(dim));
  int64_t len = shape[dim];
  int64_t inner = product(shape.drop_front(dim + 1));
  Value in = bufferOf(op.getInput()), out = resultBuffer(op.getResult());

  Type inElt = inType.getElementType();
  // 16-bit floats feed TensorE as they are; anything else as fp32.
  Type mmElt = inElt.isBF16() || inElt.isF16() ? inElt : b.getF32Type();
  TileScope scope(*this);
  // U[k, m] = (k <= m).
  Value tri = scanMatrix(nisa::AluOp::ge, mmElt);
  if (inner == 1)
    lowerRowScan(in, out, outer, len, mmElt, tri,
                 scanMatrix(nisa::AluOp::eq, mmElt));
  else
    lowerColumnScan(in, out, outer, len, inner, mmElt, tri);
}

/// A [P, P] 0/1 matrix: (m - k) `cmp` 0, in TensorE's operand dtype.
Value KernelLowering::scanMatrix(nisa::AluOp cmp, Type mmElt) {
  const int64_t p = target.partitions;
  Type f32 = b.getF32Type();
  Value t = tile(MemorySpace::sbuf, {p, p}, f32);
  b.create<nisa::IotaOp>(t, APFloat(0.0), APFloat(-1.0), ArrayRef<double>{1.0});
  b.create<nisa::TensorScalarOp>(cmp, t, t, Value(), APFloat(0.0), false);
  if (mmElt == f32)
    return t;
  Value narrow = tile(MemorySpace::sbuf, {p, p}, mmElt);
  b.create<nisa::CopyOp>(t, narrow);
  return narrow;
}

/// A scan along a strided dim: the scanned dim on the partitions, the
/// columns (outer, inner) pairs: whole inner rows, `group` outer indices at
/// a time, or chunks of one long inner row.
void KernelLowering::lowerColumnScan(Value in, Value out, int64_t outer,
                                     int64_t len, int64_t inner, Type mmElt,
                                     Value tri) {
  Type f32 = b.getF32Type();
  const int64_t p = target.partitions;
  const int64_t nTile = std::min(target.matmulMaxMovingFree,
                                 target.psumBankBytes / 4); // fp32 per bank
  int64_t innerChunk = std::min(inner, nTile);
  int64_t group =
      innerChunk == inner ? std::clamp<int64_t>(nTile / inner, 1, outer) : 1;
  int64_t width = group * innerChunk;
  const int64_t slots = 2;
  // E[k, m] = (k == P - 1).
  Value last = tile(MemorySpace::sbuf, {p, p}, f32);
  b.create<nisa::IotaOp>(last, APFloat(0.0), APFloat(1.0),
                         ArrayRef<double>{0.0});
  b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, last, last, Value(),
                                 APFloat(double(p - 1)), false);

  // Rotating slots: the loads of block j + 1, the PSUM bank and the
  // eviction of block j alternate, so a store never holds up the next
  // block's eviction.
  Value xs = tile(MemorySpace::sbuf, {p, slots * width}, mmElt);
  Value sums = tile(MemorySpace::psum, {p, slots * nTile}, f32);
  Value carries = tile(MemorySpace::sbuf, {p, slots * width}, f32);

  auto columns = [&](Value o0, int64_t gt, Value i0, int64_t it) {
    int64_t cols = gt * it;
    Value base = addOffsets(scale(o0, len * inner), i0);
    // Block `blk` (rows [blk * P, blk * P + kt)) in slot `slot`; the
    // carry comes from the other slot.
    auto block = [&](Value blk, int64_t slot, int64_t kt, bool first) {
      Value at = addOffsets(base, scale(blk, p * inner));
      auto hbm = [&](Value buffer) {
        return view(buffer, at, {kt, gt, it}, {inner, len * inner, 1});
      };
      auto onChip = [&](Value t, int64_t s) {
        return view(t, index(s * width), {kt, gt, it}, {slots * width, it, 1});
      };
      auto flat = [&](Value t, int64_t s, int64_t rows) {
        return view(t, index(s * width), {rows, cols}, {slots * width, 1});
      };
      dma(hbm(in), onChip(xs, slot));
      Value acc =
          view(sums, index(slot * nTile), {kt, cols}, {slots * nTile, 1});
      b.create<nisa::MatmulOp>(view(tri, index(0), {kt, kt}, {p, 1}),
                               flat(xs, slot, kt), acc);
      if (!first) {
        auto carry =
            b.create<nisa::MatmulOp>(view(last, index(0), {p, kt}, {p, 1}),
                                     flat(carries, 1 - slot, p), acc);
        carry.setAccumulate(true);
      }
      b.create<nisa::CopyOp>(acc, flat(carries, slot, kt));
      // From ScalarE's queue, so the next block's load is not queued
      // behind a store that waits for this eviction.
      b.create<nisa::DmaCopyOp>(onChip(carries, slot), hbm(out),
                                nisa::Engine::scalar);
    };
    forEachScanBlock(len, slots, block);
  };

  forTiles(outer, group, [&](Value o0, int64_t gt) {
    forTiles(inner, innerChunk,
             [&](Value i0, int64_t it) { columns(o0, gt, i0, it); });
  });
}

namespace {
struct CumsumPattern : OpTilePattern<CumsumPattern, CumsumOp> {
  LogicalResult lowerOp(CumsumOp op, KernelLowering &k) const {
    k.lowerCumsum(op);
    return success();
  }
};
} // namespace

void populateScanPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<CumsumPattern>());
}

} // namespace mlir::neuron
