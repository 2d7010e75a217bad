//===- LowerFlexAttentionDynamic.cpp - attention over a run-time length ---===//
//
// The forward kernel of a neuron.flex_attention whose key length is known at
// run time only (issue #16: a KV cache growing by a token per call), one
// program for every length:
//  - per (batch, key head), unrolled (their offsets are multiples of the
//    length): Q^T of its query heads, their rows side by side in one query
//    tile (decode: a few rows per head);
//  - keys stream through SBUF in steps of up to a PSUM bank of fp32 scores
//    (512): the full steps counted at run time, their K^T and V loaded
//    slots - 1 steps ahead; the last keys (length mod 512) one step whose
//    free extents are size expressions, loaded first;
//  - per step the online softmax of the static kernel: S = Q K^T in PSUM,
//    -max, alpha, P = exp(S - max) with its row sums on ScalarE, P^T on
//    TensorE, O = O * alpha + P V. The state starts at -max = huge, l = 0,
//    O = 0, so every step is alike (no first step known at compile time).
//
// What it cannot do (a mask, score_mod, a query length known at run time,
// key or value views) is refused with "not size-generic": the backend then
// compiles per size.
//===----------------------------------------------------------------------===//

#include "passes/flex_attention/FlexAttentionLowering.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <limits>

namespace mlir::neuron::flex {

namespace {
/// The size expression of dim `d` of a kernel argument (its neuron.dims),
/// or null.
AffineExpr argDimExpr(Value buffer, int64_t d) {
  auto arg = dyn_cast<BlockArgument>(buffer);
  auto kernel =
      arg ? dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp()) : nullptr;
  if (!kernel)
    return {};
  auto dims =
      kernel.getArgAttrOfType<AffineMapAttr>(arg.getArgNumber(), kDimsAttrName);
  if (!dims || d >= (int64_t)dims.getValue().getNumResults())
    return {};
  return dims.getValue().getResult(d);
}
} // namespace

LogicalResult FlexAttentionLowering::runDynamic() {
  auto refuse = [&](const Twine &why) {
    return emitError(op.getLoc())
           << "not size-generic: " << op->getName() << ": " << why;
  };
  auto qType = tensorType(op.getQuery()), kType = tensorType(op.getKey()),
       vType = tensorType(op.getValue());
  for (auto [t, what] : {std::pair(qType, "query"), std::pair(kType, "key"),
                         std::pair(vType, "value")})
    for (int64_t d : {0, 1, 3})
      if (t.isDynamicDim(d))
        return refuse(Twine("a batch, head or head-dim size of the ") + what +
                      " known at run time");
  if (qType.isDynamicDim(2))
    return refuse("a query length known at run time (only the key length "
                  "may be)");
  if (!op.getScoreBuffers().empty() || !op.getMaskBuffers().empty())
    return refuse("modifiers that capture tensors");
  if (::mlir::failed(setUp(op)))
    return failure();
  Block &scoreBody = op.getScoreMod().front();
  if (cast<YieldOp>(scoreBody.getTerminator()).getValues()[0] !=
          scoreBody.getArgument(0) ||
      scale <= 0)
    return refuse("a score_mod or a scale that is not positive");
  // A mask_mod that is constant true keeps every block whatever its class.
  Value keep =
      cast<YieldOp>(op.getMaskMod().front().getTerminator()).getValues()[0];
  if (auto c = keep.getDefiningOp<ConstantOp>())
    if (auto attr = dyn_cast<DenseElementsAttr>(c.getValue()))
      maskTrivial = attr.isSplat() && attr.getSplatValue<bool>();
  if (!maskTrivial && llvm::any_of(blockKinds, [](int8_t c) {
        return c != (int8_t)Kind::full;
      }))
    return refuse("a mask over a key length known at run time");
  if (llvm::is_contained(blockKinds, (int8_t)Kind::masked))
    return refuse("masked blocks over a key length known at run time");
  int64_t rows = group * qLen; // the query tile: every query head's rows
  if (rows > unit)
    return refuse(Twine(rows) + " query rows per key head (" + Twine(unit) +
                  " at most)");
  if (vDim > bank)
    return op.emitOpError("value head dims above ")
           << bank << " are not supported";
  if (k.isWindow(op.getKey()) || k.isWindow(op.getValue()))
    return refuse("key or value is a strided view");
  Value keyBuf = k.bufferOf(op.getKey()), valueBuf = k.bufferOf(op.getValue());
  AffineExpr kLen = argDimExpr(keyBuf, 2), vLen = argDimExpr(valueBuf, 2);
  if (!kLen || kLen != vLen)
    return refuse("key and value lengths not known to be one size");
  Value kvLenV = k.dimOf(op.getKey(), 2);
  if (!kvLenV)
    return refuse("the key length is not known");

  std::tie(out, outStrides) = resultLayout(op.getOut());
  if (!op.getLse().use_empty()) {
    lse = k.resultBuffer(op.getLse());
    lseStrides = contiguousStrides(tensorType(op.getLse()).getShape());
  }

  int64_t maxUnits =
      std::max<int64_t>(1, std::min(k.target.matmulMaxMovingFree, bank) / unit);
  int64_t width = maxUnits * unit; // keys of a full step
  constexpr int64_t slots = 4;     // even: a step's parity is its slot's
  auto idx = [&](int64_t v) -> OpFoldResult { return b.getIndexAttr(v); };
  auto dynView = [&](Value base, Value offset, ArrayRef<OpFoldResult> shape,
                     ArrayRef<int64_t> strides) {
    return k.view(base, offset, shape, strides);
  };

  TileBuilder::TileScope scope(k);
  Value diff = k.tile(MemorySpace::sbuf, {unit, unit}, f32);
  b.create<nisa::IotaOp>(diff, APFloat(0.0), APFloat(1.0),
                         b.getDenseF64ArrayAttr({-1.0}));
  ident = k.tile(MemorySpace::sbuf, {unit, unit}, inElt);
  b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, diff, ident, Value(),
                                 APFloat(0.0), false);
  // PSUM: scores of even and odd full steps, of the last step, then O.
  psumCols = 4 * bank;
  psum = k.tile(MemorySpace::psum, {unit, psumCols}, f32);
  Value oPs = k.view(psum, k.index(3 * bank), {rows, vDim}, {psumCols, 1});
  Value kTs = k.tile(MemorySpace::sbuf, {dim, slots * width}, inElt);
  Value vSs = k.tile(MemorySpace::sbuf, {unit, slots * maxUnits * vDim}, inElt);
  // The last step's keys and Q^T alternate between two slots by key head:
  // the next head's loads need not wait for this head's last step.
  Value kTRests = k.tile(MemorySpace::sbuf, {dim, 2 * width}, inElt);
  Value vRests = k.tile(MemorySpace::sbuf, {unit, 2 * maxUnits * vDim}, inElt);
  Value qTiles = k.tile(MemorySpace::sbuf, {dim, 2 * rows}, inElt);
  Value qTile;
  // The softmax state, per head slot: -max and alpha in a column per step
  // parity (a step reads its predecessor's -max), the row sums l and O.
  Value negms = k.tile(MemorySpace::sbuf, {rows, 4}, f32);
  Value alphas = k.tile(MemorySpace::sbuf, {rows, 4}, f32);
  Value ls = k.tile(MemorySpace::sbuf, {rows, 2}, f32);
  Value os = k.tile(MemorySpace::sbuf, {rows, 2 * vDim}, f32);
  Value oOuts = k.tile(MemorySpace::sbuf, {rows, 2 * vDim}, inElt);
  int64_t headSlot = 0;
  auto stateCol = [&](Value t, Value parity) {
    return k.view(t, k.addOffset(parity, 2 * headSlot), {rows, 1}, {4, 1});
  };

  Value fullSteps = b.create<arith::FloorDivSIOp>(kvLenV, k.index(width));
  Value rest = b.create<arith::RemSIOp>(kvLenV, k.index(width));
  Value restUnits = b.create<arith::CeilDivSIOp>(rest, k.index(unit));

  // One key step: `kT` [dim, keys], V unit u's rows by `vOf(u)`; `keys` is
  // static for a full step, `rest` for the last one.
  // `parity`: the step's state column (its predecessor's is the other).
  auto step = [&](Value kT, OpFoldResult keys,
                  llvm::function_ref<Value(int64_t, OpFoldResult)> vOf,
                  int64_t scoreBank, bool last, Value parity) {
    std::optional<int64_t> known = getConstantIntValue(parity);
    Value before = known ? k.index(1 - *known)
                         : b.create<arith::SubIOp>(k.index(1), parity);
    Value negm = stateCol(negms, before);
    Value next = stateCol(negms, parity);
    Value alphaT = stateCol(alphas, parity);
    TileBuilder::TileScope stepScope(k);
    // Unit u's key count, and running it only when the step has it.
    auto unitKeys = [&](int64_t u) -> OpFoldResult {
      if (!last)
        return idx(unit);
      return b
          .create<arith::MinSIOp>(
              b.create<arith::SubIOp>(rest, k.index(u * unit)), k.index(unit))
          .getResult();
    };
    auto eachUnit = [&](llvm::function_ref<void(int64_t, OpFoldResult)> body) {
      for (int64_t u = 0; u < maxUnits; ++u) {
        if (!last) {
          body(u, idx(unit));
          continue;
        }
        k.ifMore(restUnits, u, [&] { body(u, unitKeys(u)); });
      }
    };
    Value s = dynView(psum, k.index(scoreBank * bank), {idx(rows), keys},
                      {psumCols, 1});
    b.create<nisa::MatmulOp>(qTile, kT, s);
    Value mt = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
    b.create<nisa::TensorReduceOp>(nisa::AluOp::max, s, mt);
    // -max' = min(-scale * max(row), -max); alpha = exp(max - max').
    scalarTensorTensor(mt, Value(), -scale, nisa::AluOp::multiply, negm,
                       nisa::AluOp::min, next, nisa::Engine::gpsimd);
    // P first: alpha is off its path (it rescales what came before).
    Value pFull = k.tile(MemorySpace::sbuf, {rows, width}, inElt);
    Value p = dynView(pFull, k.index(0), {idx(rows), keys}, {width, 1});
    Value sums = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
    b.create<nisa::ActivationOp>(s, p, next, Value(), sums,
                                 nisa::ActivationFn::exp, APFloat(scale),
                                 APFloat(0.0));
    b.create<nisa::ActivationOp>(negm, alphaT, next, nisa::ActivationFn::exp,
                                 APFloat(-1.0), APFloat(0.0));
    scalarTensorTensor(l, alphaT, 0.0, nisa::AluOp::multiply, sums,
                       nisa::AluOp::add, l, nisa::Engine::gpsimd);
    // P^T a unit at a time into the scores' bank (exp has read them).
    eachUnit([&](int64_t u, OpFoldResult n) {
      b.create<nisa::MatmulOp>(
          dynView(pFull, k.index(u * unit), {idx(rows), n}, {width, 1}),
          k.view(ident, k.index(0), {rows, rows}, {unit, 1}),
          dynView(psum, k.index(scoreBank * bank + u * rows), {n, idx(rows)},
                  {psumCols, 1}));
    });
    Value pT = k.tile(MemorySpace::sbuf, {unit, maxUnits * rows}, inElt);
    if (!last) {
      // ScalarE evicts all but the last of four units, VectorE that one
      // (as the static kernel: VectorE has the max and O's rescale).
      int64_t onScalar = maxUnits < 4 ? maxUnits : maxUnits - 1;
      auto copy = [&](int64_t from, int64_t n, nisa::Engine engine) {
        b.create<nisa::CopyOp>(k.view(psum,
                                      k.index(scoreBank * bank + from * rows),
                                      {unit, n * rows}, {psumCols, 1}),
                               k.view(pT, k.index(from * rows),
                                      {unit, n * rows}, {maxUnits * rows, 1}),
                               engine);
      };
      copy(0, onScalar, nisa::Engine::scalar);
      if (onScalar < maxUnits)
        copy(onScalar, maxUnits - onScalar, nisa::Engine::vector);
    } else {
      eachUnit([&](int64_t u, OpFoldResult n) {
        b.create<nisa::CopyOp>(dynView(psum,
                                       k.index(scoreBank * bank + u * rows),
                                       {n, idx(rows)}, {psumCols, 1}),
                               dynView(pT, k.index(u * rows), {n, idx(rows)},
                                       {maxUnits * rows, 1}),
                               nisa::Engine::scalar);
      });
    }
    eachUnit([&](int64_t u, OpFoldResult n) {
      auto mm = b.create<nisa::MatmulOp>(
          dynView(pT, k.index(u * rows), {n, idx(rows)}, {maxUnits * rows, 1}),
          vOf(u, n), oPs);
      if (u > 0)
        mm.setAccumulate(true);
    });
    scalarTensorTensor(o, alphaT, 0.0, nisa::AluOp::multiply, oPs,
                       nisa::AluOp::add, o, nisa::Engine::vector);
  };

  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t hk = 0; hk < kvHeads; ++hk) {
      // Heads of a run-time length lie a multiple of it apart.
      auto headBase = [&](const TileBuilder::Window &w, int64_t d) {
        int64_t headIdx = bi * kvHeads + hk;
        Value base = headIdx ? k.scale(kvLenV, headIdx * d) : k.index(0);
        return k.addOffset(base, w.offset);
      };
      Value kBase = headBase(key, dim), vBase = headBase(value, vDim);
      headSlot = (bi * kvHeads + hk) % 2;
      l = k.view(ls, k.index(headSlot), {rows, 1}, {2, 1});
      o = k.view(os, k.index(headSlot * vDim), {rows, vDim}, {2 * vDim, 1});
      oOut =
          k.view(oOuts, k.index(headSlot * vDim), {rows, vDim}, {2 * vDim, 1});
      qTile =
          k.view(qTiles, k.index(headSlot * rows), {dim, rows}, {2 * rows, 1});
      for (int64_t g = 0; g < group; ++g) {
        int64_t h = hk * group + g;
        Value at = k.index(q.offset + bi * q.strides[0] + h * q.strides[1]);
        k.dma(k.view(q.buffer, at, {dim, qLen}, {q.strides[3], q.strides[2]}),
              k.view(qTiles, k.index(headSlot * rows + g * qLen), {dim, qLen},
                     {2 * rows, 1}));
      }
      b.create<nisa::MemsetOp>(
          k.view(negms, k.index(2 * headSlot), {rows, 2}, {4, 1}),
          APFloat(std::numeric_limits<float>::max()));
      b.create<nisa::MemsetOp>(l, APFloat(0.0));
      b.create<nisa::MemsetOp>(o, APFloat(0.0));
      // The last keys first: their loads run under the full steps.
      Value restAt = k.scale(fullSteps, width);
      k.ifMore(rest, 0, [&] {
        k.dma(dynView(key.buffer, k.addOffsets(kBase, k.scale(restAt, dim)),
                      {idx(dim), rest}, {1, dim}),
              dynView(kTRests, k.index(headSlot * width), {idx(dim), rest},
                      {2 * width, 1}));
      });
      for (int64_t u = 0; u < maxUnits; ++u)
        k.ifMore(restUnits, u, [&] {
          Value n = b.create<arith::MinSIOp>(
              b.create<arith::SubIOp>(rest, k.index(u * unit)), k.index(unit));
          Value from =
              k.addOffsets(vBase, k.scale(k.addOffset(restAt, u * unit), vDim));
          k.dma(dynView(value.buffer, from, {n, idx(vDim)}, {vDim, 1}),
                dynView(vRests, k.index((headSlot * maxUnits + u) * vDim),
                        {n, idx(vDim)}, {2 * maxUnits * vDim, 1}));
        });
      auto load = [&](Value j, int64_t slot) {
        Value first = k.scale(j, width);
        k.dma(k.view(key.buffer, k.addOffsets(kBase, k.scale(first, dim)),
                     {dim, width}, {1, dim}),
              k.view(kTs, k.index(slot * width), {dim, width},
                     {slots * width, 1}));
        k.dma(k.view(value.buffer, k.addOffsets(vBase, k.scale(first, vDim)),
                     {unit, maxUnits, vDim}, {vDim, unit * vDim, 1}),
              k.view(vSs, k.index(slot * maxUnits * vDim),
                     {unit, maxUnits, vDim},
                     {slots * maxUnits * vDim, vDim, 1}));
      };
      auto compute = [&](Value, int64_t slot) {
        Value kT = k.view(kTs, k.index(slot * width), {dim, width},
                          {slots * width, 1});
        step(
            kT, idx(width),
            [&](int64_t u, OpFoldResult) {
              return k.view(vSs, k.index((slot * maxUnits + u) * vDim),
                            {unit, vDim}, {slots * maxUnits * vDim, 1});
            },
            slot % 2, false, k.index(slot % 2));
      };
      k.forEachPipelinedDynamic(fullSteps, slots, load, compute);
      k.ifMore(rest, 0, [&] {
        step(
            dynView(kTRests, k.index(headSlot * width), {idx(dim), rest},
                    {2 * width, 1}),
            rest,
            [&](int64_t u, OpFoldResult n) {
              return dynView(vRests, k.index((headSlot * maxUnits + u) * vDim),
                             {n, idx(vDim)}, {2 * maxUnits * vDim, 1});
            },
            2, true, b.create<arith::RemSIOp>(fullSteps, k.index(2)));
      });
      // out = O / l; lse = log(l) + max.
      TileBuilder::TileScope finish(k);
      b.create<nisa::TensorScalarOp>(nisa::AluOp::divide, o, oOut, l,
                                     APFloat(0.0), false, nisa::Engine::gpsimd);
      for (int64_t g = 0; g < group; ++g) {
        int64_t h = hk * group + g;
        Value to = k.index(bi * outStrides[0] + h * outStrides[1]);
        k.dma(k.view(oOut, k.index(g * qLen * vDim), {qLen, vDim}, {vDim, 1}),
              k.view(out, to, {qLen, vDim}, {outStrides[2], 1}));
      }
      if (lse) {
        Value lt = k.tile(MemorySpace::sbuf, {rows, 1}, f32);
        b.create<nisa::ActivationOp>(l, lt, Value(), nisa::ActivationFn::log,
                                     APFloat(1.0), APFloat(0.0));
        // The last step's column: of step fullSteps + (rest > 0) - 1.
        Value steps =
            k.addOffsets(fullSteps, b.create<arith::MinSIOp>(rest, k.index(1)));
        Value lastCol =
            b.create<arith::RemSIOp>(k.addOffset(steps, 1), k.index(2));
        b.create<nisa::TensorTensorOp>(nisa::AluOp::subtract, lt,
                                       stateCol(negms, lastCol), lt,
                                       nisa::Engine::gpsimd);
        for (int64_t g = 0; g < group; ++g) {
          int64_t h = hk * group + g;
          k.dma(k.view(lt, k.index(g * qLen), {qLen, 1}, {1, 1}),
                k.view(lse, k.index(bi * lseStrides[0] + h * lseStrides[1]),
                       {qLen, 1}, {1, 1}));
        }
      }
    }
  }
  return success();
}

} // namespace mlir::neuron::flex
