//===- TileBuilder.cpp - building blocks of the kernels
//--------------------===//

#include "passes/tile/TileBuilder.h"
#include "runtime/target/Cost.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/ScopeExit.h"

#include <limits>
#include <numeric>

using namespace mlir;
using namespace mlir::neuron;

Value mlir::neuron::unreshaped(Value base) {
  auto rc = base.getDefiningOp<memref::ReinterpretCastOp>();
  if (!rc || !isa<BlockArgument>(rc.getSource()) ||
      !rc.getType().getLayout().isIdentity())
    return base;
  return rc.getSource();
}

Value TileBuilder::view(Value base, Value offset, ArrayRef<int64_t> shape,
                        ArrayRef<int64_t> strides) {
  base = unreshaped(base);
  auto baseType = cast<MemRefType>(base.getType());
  // A zero (broadcast) stride is a constant operand: the strided layout
  // syntax has no zero, and the IR must print and parse back.
  SmallVector<int64_t> layoutStrides(strides);
  SmallVector<OpFoldResult> sizes, strideValues;
  for (int64_t &s : layoutStrides) {
    strideValues.push_back(s == 0 ? OpFoldResult(index(0))
                                  : OpFoldResult(b.getIndexAttr(s)));
    if (s == 0)
      s = ShapedType::kDynamic;
  }
  auto layout = StridedLayoutAttr::get(b.getContext(), ShapedType::kDynamic,
                                       layoutStrides);
  auto type = MemRefType::get(shape, baseType.getElementType(), layout,
                              baseType.getMemorySpace());
  for (int64_t s : shape)
    sizes.push_back(b.getIndexAttr(s));
  return b.create<memref::ReinterpretCastOp>(type, base, offset, sizes,
                                             strideValues);
}

Value TileBuilder::view(Value base, Value offset, ArrayRef<OpFoldResult> shape,
                        ArrayRef<int64_t> strides) {
  SmallVector<int64_t> staticShape;
  SmallVector<Value> dynamic;
  for (OpFoldResult s : shape) {
    if (auto attr = dyn_cast<Attribute>(s)) {
      staticShape.push_back(cast<IntegerAttr>(attr).getInt());
      continue;
    }
    staticShape.push_back(ShapedType::kDynamic);
    dynamic.push_back(cast<Value>(s));
  }
  auto rc = cast<memref::ReinterpretCastOp>(
      view(base, offset, staticShape, strides).getDefiningOp());
  if (dynamic.empty())
    return rc;
  // view() gave every size as an attribute; a dynamic one is an operand.
  auto result = b.create<memref::ReinterpretCastOp>(
      rc.getType(), rc.getSource(), rc.getMixedOffsets().front(), shape,
      rc.getMixedStrides());
  rc.erase();
  return result;
}

Value TileBuilder::withRows(Value tileView, Value rows) {
  if (auto rc = tileView.getDefiningOp<memref::ReinterpretCastOp>()) {
    SmallVector<OpFoldResult> shape = rc.getMixedSizes();
    shape[0] = rows;
    return view(rc.getSource(), cast<Value>(rc.getMixedOffsets().front()),
                shape, nisa::viewStrides(rc));
  }
  auto type = cast<MemRefType>(tileView.getType());
  SmallVector<OpFoldResult> shape{rows};
  for (int64_t d : type.getShape().drop_front())
    shape.push_back(b.getIndexAttr(d));
  return view(tileView, index(0), shape, contiguousStrides(type.getShape()));
}

Value TileBuilder::withColumns(Value tileView, int64_t col0, int64_t cols) {
  if (auto rc = tileView.getDefiningOp<memref::ReinterpretCastOp>()) {
    SmallVector<OpFoldResult> shape = rc.getMixedSizes();
    shape[1] = b.getIndexAttr(cols);
    Value offset = getValueOrCreateConstantIndexOp(
        b, b.getLoc(), rc.getMixedOffsets().front());
    return view(rc.getSource(), addOffset(offset, col0), shape,
                nisa::viewStrides(rc));
  }
  auto type = cast<MemRefType>(tileView.getType());
  return view(tileView, index(col0), {type.getDimSize(0), cols},
              contiguousStrides(type.getShape()));
}

Value TileBuilder::dimOf(Value tensor, int64_t d) {
  auto type = tensorType(tensor);
  if (!type.isDynamicDim(d))
    return index(type.getDimSize(d));
  // A buffer tells its dims when it has this tensor's shape (a reshape
  // aliases its input's buffer).
  auto sameShape = [&](Value buffer) {
    return cast<MemRefType>(buffer.getType()).getShape() == type.getShape();
  };
  if (auto it = buffers.find(tensor);
      it != buffers.end() && sameShape(it->second))
    if (Value v = bufferDim(it->second, d))
      return v;
  if (auto it = destinations.find(tensor);
      it != destinations.end() && sameShape(it->second))
    if (Value v = bufferDim(it->second, d))
      return v;
  // Inside a fused group: an argument is its operand.
  if (auto arg = dyn_cast<BlockArgument>(tensor))
    if (auto fusion = dyn_cast<FusionOp>(arg.getOwner()->getParentOp()))
      return dimOf(fusion.getInputs()[arg.getArgNumber()], d);
  Operation *def = tensor.getDefiningOp();
  if (!def)
    return {};
  if (auto fusion = dyn_cast<FusionOp>(def)) {
    auto yield = cast<YieldOp>(fusion.getBody().front().getTerminator());
    return dimOf(yield.getValues()[cast<OpResult>(tensor).getResultNumber()],
                 d);
  }
  if (auto t = dyn_cast<TransposeOp>(def))
    return dimOf(t.getInput(), t.getPermutation()[d]);
  if (auto bc = dyn_cast<BroadcastOp>(def)) {
    auto in = tensorType(bc.getInput());
    int64_t shift = type.getRank() - in.getRank();
    if (d >= shift && in.isDynamicDim(d - shift))
      if (Value v = dimOf(bc.getInput(), d - shift))
        return v;
    if (Value v = stampedDim(def, d))
      return v;
    // Broadcast to what an elementwise user combines it with (once per
    // broadcast: that may lead back here).
    if (!resolving.insert(def).second)
      return {};
    auto done = llvm::make_scope_exit([&] { resolving.erase(def); });
    for (Operation *user : def->getUsers()) {
      if (!isa<UnaryOp, BinaryOp, SelectOp, CastOp>(user) ||
          tensorType(user->getResult(0)).getShape() != type.getShape())
        continue;
      for (Value operand : user->getOperands())
        if (operand != tensor && !operand.getDefiningOp<BroadcastOp>())
          if (Value v = dimOf(operand, d))
            return v;
      if (Value v = stampedDim(user, d))
        return v;
    }
    return {};
  }
  if (auto r = dyn_cast<ReshapeOp>(def)) {
    if (Value v = reshapedDim(r, d))
      return v;
    return stampedDim(def, d);
  }
  if (auto c = dyn_cast<ConcatOp>(def)) {
    if ((int64_t)c.getDim() != d)
      return dimOf(c.getInputs().front(), d);
    Value sum;
    for (Value input : c.getInputs()) {
      Value n = dimOf(input, d);
      if (!n)
        return {};
      sum = sum ? b.create<arith::AddIOp>(sum, n).getResult() : n;
    }
    return sum;
  }
  // Elementwise ops keep their operands' dims; a reduction keeps the
  // leading ones; a matmul's rows are its lhs's.
  if (isa<UnaryOp, BinaryOp, SelectOp, CastOp>(def)) {
    for (Value operand : def->getOperands()) {
      auto t = tensorType(operand);
      if (t.getRank() == type.getRank() && t.isDynamicDim(d))
        if (Value v = dimOf(operand, d))
          return v;
    }
  }
  if (auto r = dyn_cast<ReduceOp>(def))
    return dimOf(r.getInput(), d);
  // A slice cuts static dims only: a dynamic one is its input's, whole.
  if (auto s = dyn_cast<SliceOp>(def); s && s.getOffsets()[d] == 0 &&
                                       s.getStrides()[d] == 1 &&
                                       tensorType(s.getInput()).isDynamicDim(d))
    return dimOf(s.getInput(), d);
  // Attention's output and log-sum-exp have the query's batch, heads, rows.
  if (auto a = dyn_cast<FlexAttentionOp>(def); a && d < 3)
    return dimOf(a.getQuery(), d);
  if (auto m = dyn_cast<MatmulOp>(def))
    return d + 1 < type.getRank() ? dimOf(m.getLhs(), d) : dimOf(m.getRhs(), d);
  return stampedDim(def, d);
}

/// Dim `d` of `op`'s result from the importer's sizes of it (the last
/// resort: the operands tell it otherwise), if they fit its type.
Value TileBuilder::stampedDim(Operation *op, int64_t d) {
  auto dims = op->getAttrOfType<AffineMapAttr>(kDimsAttrName);
  auto type = tensorType(op->getResult(0));
  if (!dims || !entry || dims.getValue().getNumResults() != type.getRank())
    return {};
  for (auto [i, e] : llvm::enumerate(dims.getValue().getResults())) {
    auto c = dyn_cast<AffineConstantExpr>(e);
    if (type.isDynamicDim(i) == bool(c) ||
        (c && c.getValue() != type.getDimSize(i)))
      return {};
  }
  SmallVector<Value> sizes;
  for (BlockArgument a : entry->getArguments())
    if (a.getType().isIndex())
      sizes.push_back(a);
  if (dims.getValue().getNumSymbols() != sizes.size())
    return {};
  return sizeValue(dims.getValue().getResult(d), sizes);
}

/// A reshape's one dynamic dim from the element count: the product of the
/// input's dynamic dims times its static ones over the result's static ones.
Value TileBuilder::reshapedDim(ReshapeOp op, int64_t d) {
  auto in = tensorType(op.getInput()), out = op.getType();
  if (llvm::count_if(out.getShape(), ShapedType::isDynamic) != 1)
    return {};
  int64_t staticIn = 1, staticOut = 1;
  Value dynamic;
  for (int64_t i = 0; i < in.getRank(); ++i) {
    if (!in.isDynamicDim(i)) {
      staticIn *= in.getDimSize(i);
      continue;
    }
    Value n = dimOf(op.getInput(), i);
    if (!n)
      return {};
    dynamic = dynamic ? b.create<arith::MulIOp>(dynamic, n).getResult() : n;
  }
  for (int64_t i = 0; i < out.getRank(); ++i)
    if (i != d)
      staticOut *= out.getDimSize(i);
  if (!dynamic || staticOut == 0)
    return {};
  if (staticIn % staticOut == 0)
    return scale(dynamic, staticIn / staticOut);
  return b.create<arith::FloorDivSIOp>(scale(dynamic, staticIn),
                                       index(staticOut));
}

Value TileBuilder::bufferDim(Value buffer, int64_t d) {
  auto type = cast<MemRefType>(buffer.getType());
  if (!type.isDynamicDim(d))
    return index(type.getDimSize(d));
  if (auto alloc = buffer.getDefiningOp<memref::AllocOp>())
    return alloc.getDynamicSizes()[type.getDynamicDimIndex(d)];
  auto arg = dyn_cast<BlockArgument>(buffer);
  auto kernel =
      arg ? dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp()) : nullptr;
  if (!kernel)
    return {};
  auto dims =
      kernel.getArgAttrOfType<AffineMapAttr>(arg.getArgNumber(), kDimsAttrName);
  SmallVector<Value> sizes;
  for (BlockArgument a : kernel.getArguments())
    if (a.getType().isIndex())
      sizes.push_back(a);
  if (!dims || dims.getValue().getNumSymbols() != sizes.size() ||
      dims.getValue().getNumResults() != type.getRank())
    return {};
  return sizeValue(dims.getValue().getResult(d), sizes);
}

Value TileBuilder::sizeValue(AffineExpr e, ValueRange sizes) {
  if (auto c = dyn_cast<AffineConstantExpr>(e))
    return index(c.getValue());
  if (auto s = dyn_cast<AffineSymbolExpr>(e))
    return sizes[s.getPosition()];
  auto bin = cast<AffineBinaryOpExpr>(e);
  Value l = sizeValue(bin.getLHS(), sizes), r = sizeValue(bin.getRHS(), sizes);
  switch (e.getKind()) {
  case AffineExprKind::Add:
    return b.create<arith::AddIOp>(l, r);
  case AffineExprKind::Mul:
    return b.create<arith::MulIOp>(l, r);
  case AffineExprKind::FloorDiv:
    return b.create<arith::FloorDivSIOp>(l, r);
  case AffineExprKind::CeilDiv:
    return b.create<arith::CeilDivSIOp>(l, r);
  default: // Mod: sizes are non-negative, where remsi is mod
    return b.create<arith::RemSIOp>(l, r);
  }
}

void TileBuilder::forEachDynamic(Value count,
                                 llvm::function_ref<void(Value)> body) {
  auto loop = b.create<scf::ForOp>(index(0), count, index(1));
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(loop.getBody()->getTerminator());
  body(loop.getInductionVar());
}

Value TileBuilder::tile(MemorySpace space, ArrayRef<int64_t> shape,
                        Type elementType) {
  auto type =
      MemRefType::get(shape, elementType, MemRefLayoutAttrInterface(),
                      nisa::MemorySpaceAttr::get(b.getContext(), space));
  Value t = b.create<memref::AllocOp>(type);
  scopeTiles.back().push_back(t);
  return t;
}

Value TileBuilder::identity(int64_t n, Type elementType) {
  Value diff = tile(MemorySpace::sbuf, {n, n}, b.getF32Type());
  b.create<nisa::IotaOp>(diff, APFloat(0.0), APFloat(1.0),
                         b.getDenseF64ArrayAttr({-1.0}));
  Value ident = tile(MemorySpace::sbuf, {n, n}, elementType);
  b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, diff, ident, Value(),
                                 APFloat(0.0), false);
  return ident;
}

void TileBuilder::fillBorders(Value tile, const Borders &p, double value) {
  int64_t partition = cast<MemRefType>(tile.getType()).getShape()[1];
  int64_t rows = std::max<int64_t>(0, p.rowEnd - p.rowBegin);
  int64_t first = p.start + p.rowBegin * p.rowLength + (rows ? p.left : 0);
  int64_t last =
      rows ? p.start + (p.rowEnd - 1) * p.rowLength + p.left + p.width : first;
  auto fill = [&](int64_t from, ArrayRef<int64_t> shape,
                  ArrayRef<int64_t> strides) {
    SmallVector<int64_t> sizes{p.parts, p.planes}, steps{partition, p.plane};
    sizes.append(shape.begin(), shape.end());
    steps.append(strides.begin(), strides.end());
    b.create<nisa::MemsetOp>(
        view(tile, index(p.part0 * partition + from), sizes, steps),
        APFloat(value), nisa::Engine::gpsimd);
  };
  if (first)
    fill(0, {first}, {1});
  if (p.width < p.rowLength && rows > 1)
    fill(first + p.width, {rows - 1, p.rowLength - p.width}, {p.rowLength, 1});
  if (p.plane > last)
    fill(last, {p.plane - last}, {1});
}

void TileBuilder::forTiles(int64_t total, int64_t tileSize, TileBody body) {
  int64_t full = total / tileSize, rem = total % tileSize;
  if (full == 1) {
    body(index(0), tileSize);
  } else if (full > 1) {
    auto loop =
        b.create<scf::ForOp>(index(0), index(full * tileSize), index(tileSize));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(loop.getBody()->getTerminator());
    body(loop.getInductionVar(), tileSize);
  }
  if (rem)
    body(index(full * tileSize), rem);
}

Value TileBuilder::resultBuffer(Value result) {
  auto it = destinations.find(result);
  Value buffer;
  if (it != destinations.end()) {
    buffer = it->second;
  } else {
    // A dynamic result's buffer is sized by its dims (the caller checked
    // that dimOf knows them).
    RankedTensorType type = tensorType(result);
    SmallVector<Value> sizes;
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (type.isDynamicDim(d))
        sizes.push_back(dimOf(result, d));
    buffer = b.create<memref::AllocOp>(hbmType(type), sizes).getResult();
  }
  buffers[result] = buffer;
  return buffer;
}

void TileBuilder::forEachIndex(ArrayRef<int64_t> dims, ArrayRef<int64_t> shape,
                               ArrayRef<int64_t> srcStrides,
                               ArrayRef<int64_t> dstStrides, Value src,
                               Value dst,
                               llvm::function_ref<void(Value, Value)> body) {
  if (dims.empty())
    return body(src, dst);
  int64_t d = dims.front();
  forEach(shape[d], [&](Value iv) {
    forEachIndex(dims.drop_front(), shape, srcStrides, dstStrides,
                 addOffsets(src, scale(iv, srcStrides[d])),
                 addOffsets(dst, scale(iv, dstStrides[d])), body);
  });
}

/// `shape` and a window's `strides` with the dims of one element dropped
/// and each dim merged into the one inside it where the strides run on:
/// the fewest dims that address the same elements in the same order (a
/// contiguous destination runs on wherever the window does).
static std::pair<SmallVector<int64_t>, SmallVector<int64_t>>
mergedRuns(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides) {
  SmallVector<int64_t> sizes, from;
  for (int64_t d = (int64_t)shape.size() - 1; d >= 0; --d) {
    if (shape[d] == 1)
      continue;
    if (!sizes.empty() && strides[d] == from.back() * sizes.back()) {
      sizes.back() *= shape[d];
      continue;
    }
    sizes.push_back(shape[d]);
    from.push_back(strides[d]);
  }
  std::reverse(sizes.begin(), sizes.end());
  std::reverse(from.begin(), from.end());
  return {sizes, from};
}

/// A window (dims merged: mergedRuns) of rows that repeat their values in
/// short runs (nearest upsampling's [R, 2, W, 2] of x's [R, W] rows, a
/// repeat_interleave): each partition loads k of x's rows as one run,
/// VectorE expands them (the broadcast dims read at stride 0), and the
/// expanded rows are stored whole. broadcastThroughSbuf would give each
/// value a partition and store runs of a few elements.
bool TileBuilder::expandThroughSbuf(const Window &window,
                                    ArrayRef<int64_t> shape, Value out) {
  int64_t rank = shape.size();
  if (rank < 2 || window.strides[0] <= 0 || window.strides.back() != 0)
    return false;
  Type elt = cast<MemRefType>(window.buffer.getType()).getElementType();
  int64_t eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
  if (shape.back() * eltBytes >= target.dmaPreferredBytesPerPartition)
    return false; // runs long enough for broadcastThroughSbuf's stores
  // The varying dims inside a row must be one run of the source.
  SmallVector<int64_t> inner(shape.drop_front()), from(rank - 1, 0);
  int64_t kept = 1;
  for (int64_t d = rank - 1; d >= 1; --d) {
    if (window.strides[d] == 0)
      continue;
    if (window.strides[d] != kept)
      return false;
    from[d - 1] = kept;
    kept *= shape[d];
  }
  int64_t wide = ShapedType::getNumElements(inner);
  int64_t most =
      std::max(tileBytes, target.sbufBytesPerPartition / 4) / eltBytes;
  if (wide > most)
    return false;
  int64_t rows = shape[0], rowFrom = window.strides[0], p = target.partitions;
  int64_t per = std::max<int64_t>(1, std::min(most / wide, rows / p));
  // pt partitions of k rows each from row r0.
  auto expand = [&](Value r0, int64_t pt, int64_t k) {
    TileScope scope(*this);
    Value loaded = tile(MemorySpace::sbuf, {pt, k * kept}, elt);
    Value expanded = tile(MemorySpace::sbuf, {pt, k * wide}, elt);
    dma(view(window.buffer, addOffset(scale(r0, rowFrom), window.offset),
             {pt, k, kept}, {k * rowFrom, rowFrom, 1}),
        view(loaded, index(0), {pt, k, kept}, {k * kept, kept, 1}));
    SmallVector<int64_t> dims{pt, k}, srcStrides{k * kept, kept},
        dstStrides{k * wide, wide};
    SmallVector<int64_t> dense = contiguousStrides(inner);
    for (auto [size, stride, to] : llvm::zip(inner, from, dense)) {
      dims.push_back(size);
      srcStrides.push_back(stride);
      dstStrides.push_back(to);
    }
    b.create<nisa::CopyOp>(view(loaded, index(0), dims, srcStrides),
                           view(expanded, index(0), dims, dstStrides));
    dma(expanded, view(out, scale(r0, wide), {pt, k * wide}, {k * wide, 1}));
  };
  int64_t block = p * per, full = rows / block;
  forTiles(full * block, block, [&](Value r0, int64_t) { expand(r0, p, per); });
  forTiles(rows - full * block, p, [&](Value r0, int64_t rt) {
    expand(addOffset(r0, full * block), rt, 1);
  });
  return true;
}

/// A window (dims merged: mergedRuns) whose innermost dim is a broadcast
/// (stride 0: a row's max expanded along the row, a per-channel [C, 1, 1]
/// value expanded over [N, C, H, W] where the canonicalizer did not split
/// it) made contiguous as a chip would: per 128 values of the innermost dim
/// that varies (or fewer, each over several partitions), the values
/// loaded as a column, expanded along the free dim once on VectorE and
/// stored to every place that repeats them (the broadcast dim in chunks,
/// the outer broadcast dims) by one DMA whose source repeats the chunk. One
/// HBM-to-HBM DMA would write an element per descriptor.
bool TileBuilder::broadcastThroughSbuf(const Window &window,
                                       ArrayRef<int64_t> shape, Value out) {
  int64_t rank = shape.size();
  if (rank == 0 || window.strides.back() != 0)
    return false;
  SmallVector<int64_t> dense = contiguousStrides(shape);
  int64_t run = shape.back(), p = target.partitions;
  // The innermost varying dim goes on the partitions, the other varying
  // dims are loops around its tiles, the broadcast ones repeats in a store.
  SmallVector<int64_t> varying, repeated;
  for (int64_t d = rank - 2; d >= 0; --d)
    (window.strides[d] ? varying : repeated).push_back(d);
  int64_t parts = varying.empty() ? 1 : shape[varying.front()];
  int64_t partFrom = varying.empty() ? 1 : window.strides[varying.front()];
  int64_t partTo = varying.empty() ? run : dense[varying.front()];
  // Fewer values than partitions (32 rows' max, 3 channels) each take
  // `split` partitions, a segment of the run apiece, where the values'
  // runs are adjacent in the result (the DMAs share a store by partitions).
  int64_t split = 1;
  if (partTo == run)
    for (int64_t q = std::min(run, p / parts); q > 1 && split == 1; --q)
      if (run % q == 0)
        split = q;
  int64_t segment = run / split;
  Type elt = cast<MemRefType>(window.buffer.getType()).getElementType();
  int64_t eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
  int64_t chunk = std::min(segment, std::max<int64_t>(1, tileBytes / eltBytes));
  // The store: [partitions, repeated dims..., chunks, chunk], the source
  // repeating the expanded chunk along all but its partitions.
  auto store = [&](Value expanded, Value dst, int64_t rows, int64_t chunks,
                   int64_t width) {
    SmallVector<int64_t> storeShape{rows}, srcStrides{chunk},
        dstStrides{partTo / split};
    for (int64_t d : repeated) {
      storeShape.push_back(shape[d]);
      srcStrides.push_back(0);
      dstStrides.push_back(dense[d]);
    }
    storeShape.append({chunks, width});
    srcStrides.append({0, 1});
    dstStrides.append({chunk, 1});
    dma(view(expanded, index(0), storeShape, srcStrides),
        view(out, dst, storeShape, dstStrides));
  };
  // The other varying dims: loops around the partition tiles.
  ArrayRef<int64_t> loops =
      varying.empty() ? ArrayRef<int64_t>() : ArrayRef(varying).drop_front();
  forEachIndex(loops, shape, window.strides, dense, index(window.offset),
               index(0), [&](Value src, Value dst) {
                 forTiles(parts, p / split, [&](Value v0, int64_t vt) {
                   TileScope scope(*this);
                   int64_t rows = vt * split;
                   Value column = tile(MemorySpace::sbuf, {rows, 1}, elt);
                   dma(view(window.buffer, addOffsets(src, scale(v0, partFrom)),
                            {vt, split, 1}, {partFrom, 0, 1}),
                       view(column, index(0), {vt, split, 1}, {split, 1, 1}));
                   Value expanded = tile(MemorySpace::sbuf, {rows, chunk}, elt);
                   b.create<nisa::CopyOp>(
                       view(column, index(0), {rows, chunk}, {1, 0}), expanded);
                   Value at = addOffsets(dst, scale(v0, partTo));
                   if (segment / chunk)
                     store(expanded, at, rows, segment / chunk, chunk);
                   if (segment % chunk)
                     store(expanded, addOffset(at, segment / chunk * chunk),
                           rows, 1, segment % chunk);
                 });
               });
  return true;
}

/// A stretch loaded for a strided window may take at most this many times
/// the elements its rows keep.
static constexpr int64_t kMostStretchPerKept = 8;
/// Fewer elements move as one HBM-to-HBM DMA in about the time of the three
/// instructions through SBUF.
static constexpr int64_t kLeastStridedElements = 4096;

/// A window (dims merged: mergedRuns) whose innermost dim is strided (every
/// s-th element: a max-pool's shifted windows with stride 2, x[..., ::2])
/// made contiguous as a chip would: the dim outside the rows on the
/// partitions, each partition loading the whole stretch its rows span by one
/// contiguous run (in chunks of rows where it would not fit), VectorE
/// picking the rows' elements out of it, and each partition's rows stored
/// whole (they are contiguous in the result); the dims further out are
/// loops. One HBM-to-HBM DMA would move an element per descriptor (the
/// 3 x 3 max-pool of ResNet's stem: 27.8 ms).
bool TileBuilder::stridedThroughSbuf(const Window &window,
                                     ArrayRef<int64_t> shape, Value out) {
  int64_t rank = shape.size();
  int64_t step = rank ? window.strides.back() : 0;
  if (rank == 0 || step <= 1 || shape.back() < 2 ||
      ShapedType::getNumElements(shape) < kLeastStridedElements)
    return false;
  int64_t cols = shape.back(), span = (cols - 1) * step + 1;
  int64_t rows = rank >= 2 ? shape[rank - 2] : 1;
  int64_t rowFrom = rank >= 2 ? window.strides[rank - 2] : span;
  Type elt = cast<MemRefType>(window.buffer.getType()).getElementType();
  int64_t eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
  // Alone in the kernel: a quarter of SBUF's partition per stretch.
  int64_t most =
      std::max(tileBytes, target.sbufBytesPerPartition / 4) / eltBytes;
  if (rowFrom <= 0 || span > most)
    return false;
  int64_t chunk = std::min(rows, (most - span) / rowFrom + 1);
  // A stretch mostly of elements no row takes (a ViT's patches, 14 of each
  // 224-element image row) would read many times the bytes it keeps.
  if (chunk * cols * kMostStretchPerKept < (chunk - 1) * rowFrom + span)
    return false;
  SmallVector<int64_t> dense = contiguousStrides(shape);
  int64_t parts = rank >= 3 ? shape[rank - 3] : 1;
  int64_t partFrom = rank >= 3 ? window.strides[rank - 3] : 0;
  int64_t partTo = rank >= 3 ? dense[rank - 3] : 0;
  if (rank == 2) {
    // One run of rows (the dims outside merged into it): the partitions
    // take equal shares of it, each a stretch.
    while (rows % chunk)
      --chunk;
    parts = rows / chunk;
    partFrom = chunk * rowFrom;
    partTo = chunk * cols;
    rows = chunk;
  }
  // The dims outside the partitions' dim: loops around the tiles.
  SmallVector<int64_t> loops =
      llvm::to_vector(llvm::seq<int64_t>(0, std::max<int64_t>(rank - 3, 0)));
  forEachIndex(
      loops, shape, window.strides, dense, index(window.offset), index(0),
      [&](Value src, Value dst) {
        forTiles(rows, chunk, [&](Value r0, int64_t rt) {
          int64_t stretch = (rt - 1) * rowFrom + span;
          forTiles(parts, target.partitions, [&](Value p0, int64_t pt) {
            TileScope scope(*this);
            Value loaded = tile(MemorySpace::sbuf, {pt, stretch}, elt);
            Value packed = tile(MemorySpace::sbuf, {pt, rt * cols}, elt);
            Value from = addOffsets(addOffsets(src, scale(p0, partFrom)),
                                    scale(r0, rowFrom));
            // (partFrom is 0 where the partitions' dim is a broadcast.)
            dma(view(window.buffer, from, {pt, stretch}, {partFrom, 1}),
                loaded);
            b.create<nisa::CopyOp>(
                view(loaded, index(0), {pt, rt, cols},
                     {stretch, rowFrom, step}),
                view(packed, index(0), {pt, rt, cols}, {rt * cols, cols, 1}));
            Value to =
                addOffsets(addOffsets(dst, scale(p0, partTo)), scale(r0, cols));
            dma(packed, view(out, to, {pt, rt * cols},
                             {std::max<int64_t>(partTo, 1), 1}));
          });
        });
      });
  return true;
}

/// permuteThroughSbuf: SBUF bytes a partition's rows take, per buffer.
static constexpr int64_t kPermuteBytesPerPartition = 16 * 1024;
/// permuteThroughSbuf: the most DMAs it emits (all unrolled).
static constexpr int64_t kMostPermuteDmas = 512;

/// A permuted window (dims merged: mergedRuns) of 2- or 4-byte elements whose
/// innermost dim is strided, as pixel_shuffle, a ViT's patchify or DiT's
/// unpatchify leave it: one HBM-to-HBM DMA would move it an element per
/// descriptor, and transposeThroughSbuf takes its [..., R, C] matrices one by
/// one (a pixel shuffle's are [16, 2]: a DMA each). Here the output is rows of
/// its dims after some dim d; each partition gathers `per` consecutive rows
/// in output order by a transposing load (its source side walks elements,
/// its SBUF side is contiguous), and a tile of partitions stores them as one
/// run each. Of the dims d and the rows per partition, the cheapest by the
/// target's DMA costs; not taken unless it beats the direct copy twice over.
bool TileBuilder::permuteThroughSbuf(const Window &window,
                                     ArrayRef<int64_t> shape, Value out) {
  int64_t rank = shape.size();
  Type elt = cast<MemRefType>(window.buffer.getType()).getElementType();
  int64_t eltBytes = elt.getIntOrFloatBitWidth() / 8;
  // (A broadcast innermost, stride 0, is no transposing load.)
  if (rank < 2 || (eltBytes != 2 && eltBytes != 4) ||
      window.strides.back() == 1 || window.strides.back() == 0)
    return false;
  const ::neuron::target::CostModel cost(target);
  int64_t p = target.partitions, engines = target.dmaEngines;
  int64_t perEngine = std::max<int64_t>(1, p / engines);
  double bytes = double(ShapedType::getNumElements(shape) * eltBytes);
  auto spread = [&](int64_t partitions) {
    return double(std::min<int64_t>(
        engines, (std::min(partitions, p) + perEngine - 1) / perEngine));
  };
  // The direct copy: a descriptor per element, over every engine at best.
  double best =
      0.5 *
      cost.dmaTransferNs(bytes, double(eltBytes), bytes / double(eltBytes)) /
      double(engines);
  int64_t dim = -1, per = 0;
  int64_t row = ShapedType::getNumElements(shape);
  for (int64_t d = 0; d + 1 < rank; ++d) {
    row /= shape[d]; // elements of the dims after d
    int64_t outer = ShapedType::getNumElements(shape.take_front(d));
    int64_t most = kPermuteBytesPerPartition / (row * eltBytes);
    for (int64_t k = 1; k <= std::min(shape[d], most); ++k) {
      if (shape[d] % k)
        continue;
      int64_t groups = outer * (shape[d] / k); // a partition's rows each
      int64_t tiles = (groups + p - 1) / p;
      if (2 * tiles + outer > kMostPermuteDmas) // stores, loads
        continue;
      double ns = (bytes / cost.dmaTransposeBytesPerNs(false) +
                   cost.dmaTransferNs(bytes, double(k * row * eltBytes),
                                      double(groups))) /
                  spread(groups);
      if (ns < best) {
        best = ns;
        dim = d;
        per = k;
      }
    }
  }
  if (dim < 0)
    return false;
  row = ShapedType::getNumElements(shape.drop_front(dim + 1));
  int64_t inDim = shape[dim] / per; // groups along dim `dim`
  int64_t groups = ShapedType::getNumElements(shape.take_front(dim)) * inDim;
  int64_t width = per * row;
  // A group's source view: `per` rows along dim `dim`, then the row dims.
  SmallVector<int64_t> rowShape{per}, rowStrides{window.strides[dim]};
  for (int64_t d = dim + 1; d < rank; ++d) {
    rowShape.push_back(shape[d]);
    rowStrides.push_back(window.strides[d]);
  }
  auto groupOffset = [&](int64_t g) {
    int64_t offset = window.offset + (g % inDim) * per * window.strides[dim];
    for (int64_t d = dim - 1, rest = g / inDim; d >= 0; --d) {
      offset += (rest % shape[d]) * window.strides[d];
      rest /= shape[d];
    }
    return offset;
  };
  TileScope scope(*this);
  int64_t tiles = (groups + p - 1) / p;
  SmallVector<Value, kTransposeSlots> slots;
  for (int64_t i = 0; i < std::min(kTransposeSlots, tiles); ++i)
    slots.push_back(tile(MemorySpace::sbuf, {std::min(p, groups), width}, elt));
  for (int64_t t = 0; t < tiles; ++t) {
    Value slot = slots[t % slots.size()];
    int64_t first = t * p, count = std::min(p, groups - first);
    // Loads: a run of groups with the same outer index each.
    for (int64_t g = first; g < first + count;) {
      int64_t run = std::min(first + count - g, inDim - g % inDim);
      SmallVector<int64_t> srcShape{run}, srcStrides{per * window.strides[dim]};
      srcShape.append(rowShape);
      srcStrides.append(rowStrides);
      SmallVector<int64_t> dstShape{run}, dstStrides{width};
      for (int64_t i = 0, n = rowShape.size(); i < n; ++i) {
        dstShape.push_back(rowShape[i]);
        dstStrides.push_back(ShapedType::getNumElements(
            ArrayRef<int64_t>(rowShape).drop_front(i + 1)));
      }
      dma(view(window.buffer, index(groupOffset(g)), srcShape, srcStrides),
          view(slot, index((g - first) * width), dstShape, dstStrides));
      g += run;
    }
    dma(view(slot, index(0), {count, width}, {width, 1}),
        view(out, index(first * width), {count, width}, {width, 1}));
  }
  return true;
}

/// A transposed window (dims merged: mergedRuns; [..., R, C] reading rows
/// contiguously, columns strided) of 2- or 4-byte elements, made contiguous as
/// a chip would: each [128, C-chunk] tile loaded into SBUF by a transposing
/// DMA, then stored whole. One HBM-to-HBM DMA would move it one element per
/// descriptor. The tiles rotate over kTransposeSlots buffers, each load issued
/// two tiles ahead of its store, so loads and stores overlap (one buffer
/// serialized them: a transpose took twice its DMA time); past
/// kMaxTransposeTiles, in loops over runs of like tiles.
bool TileBuilder::transposeThroughSbuf(const Window &window,
                                       ArrayRef<int64_t> shape, Value out) {
  int64_t rank = shape.size();
  Type elt = cast<MemRefType>(window.buffer.getType()).getElementType();
  int64_t eltBytes = elt.getIntOrFloatBitWidth() / 8;
  if (rank < 2 || (eltBytes != 2 && eltBytes != 4) ||
      window.strides[rank - 2] != 1 || window.strides[rank - 1] == 1 ||
      shape[rank - 1] < 2 || shape[rank - 2] < 2)
    return false;
  int64_t rows = shape[rank - 2], cols = shape[rank - 1];
  int64_t colStride = window.strides[rank - 1];
  int64_t chunk = std::max<int64_t>(1, tileBytes / eltBytes);
  // Leading dims: one matrix after another (their strides may be anything).
  int64_t matrices = 1;
  for (int64_t d = 0; d < rank - 2; ++d)
    matrices *= shape[d];
  // A tile: `parts` x `blocks` consecutive rows, `blocks` a partition (whole
  // 128-row blocks several to a transfer, since a transfer's fixed cost is
  // paid per tile: [3136, 256] in 128-row tiles took 4x a copy; then the
  // rows left), by `width` columns, from element `src` of the window and to
  // element `dst` of the output: a partition stores a run of whole rows
  // (a row a partition, block after block, stored [3136, 96] in 192-byte
  // runs).
  struct Tile {
    int64_t src, dst, parts, blocks, width;
  };
  SmallVector<Tile> tiles;
  int64_t p = target.partitions;
  for (int64_t m = 0; m < matrices; ++m) {
    int64_t from = window.offset, rest = m;
    for (int64_t d = rank - 3; d >= 0; --d) {
      from += (rest % shape[d]) * window.strides[d];
      rest /= shape[d];
    }
    int64_t to = m * rows * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += chunk) {
      int64_t width = std::min(chunk, cols - c0);
      int64_t perTile = std::max<int64_t>(1, chunk / width);
      for (int64_t b0 = 0; b0 < rows / p; b0 += perTile)
        tiles.push_back({from + b0 * p + c0 * colStride,
                         to + b0 * p * cols + c0, p,
                         std::min(perTile, rows / p - b0), width});
      if (int64_t rt = rows % p)
        tiles.push_back({from + (rows - rt) + c0 * colStride,
                         to + (rows - rt) * cols + c0, rt, 1, width});
    }
  }
  TileScope scope(*this);
  SmallVector<Value, kTransposeSlots> slots;
  for (int64_t i = 0; i < std::min<int64_t>(kTransposeSlots, tiles.size()); ++i)
    slots.push_back(tile(MemorySpace::sbuf, {p, chunk}, elt));
  // Tile t's load and store at element offsets src and dst, in `slot`.
  auto load = [&](const Tile &t, Value src, int64_t slot) {
    dma(view(window.buffer, src, {t.parts, t.blocks, t.width},
             {t.blocks, 1, colStride}),
        view(slots[slot], index(0), {t.parts, t.blocks, t.width},
             {chunk, t.width, 1}));
  };
  auto store = [&](const Tile &t, Value dst, int64_t slot) {
    dma(view(slots[slot], index(0), {t.parts, t.blocks, t.width},
             {chunk, t.width, 1}),
        view(out, dst, {t.parts, t.blocks, t.width},
             {t.blocks * cols, cols, 1}));
  };
  if (tiles.size() <= kMaxTransposeTiles) {
    // Unrolled, the loads running across matrices and column chunks.
    int64_t n = tiles.size(), ahead = std::min<int64_t>(slots.size() - 1, n);
    for (int64_t i = 0; i < ahead; ++i)
      load(tiles[i], index(tiles[i].src), i % slots.size());
    for (int64_t i = 0; i < n; ++i) {
      if (i + ahead < n)
        load(tiles[i + ahead], index(tiles[i + ahead].src),
             (i + ahead) % slots.size());
      store(tiles[i], index(tiles[i].dst), i % slots.size());
    }
    return true;
  }
  // Too many to unroll (a program of each): runs of like tiles evenly
  // apart (a column chunk's whole-block tiles) pipelined in loops.
  for (size_t i = 0; i < tiles.size();) {
    const Tile &t = tiles[i];
    size_t j = i + 1;
    int64_t srcStep = 0, dstStep = 0;
    if (j < tiles.size()) {
      srcStep = tiles[j].src - t.src;
      dstStep = tiles[j].dst - t.dst;
    }
    while (j < tiles.size() && tiles[j].parts == t.parts &&
           tiles[j].blocks == t.blocks && tiles[j].width == t.width &&
           tiles[j].src - tiles[j - 1].src == srcStep &&
           tiles[j].dst - tiles[j - 1].dst == dstStep)
      ++j;
    forEachPipelined(
        j - i, slots.size(),
        [&](Value step, int64_t slot) {
          load(t, addOffset(scale(step, srcStep), t.src), slot);
        },
        [&](Value step, int64_t slot) {
          store(t, addOffset(scale(step, dstStep), t.dst), slot);
        });
    i = j;
  }
  return true;
}

Value TileBuilder::bufferOf(Value tensor) {
  if (Value buffer = buffers.lookup(tensor))
    return buffer;
  if (auto it = lazyViews.find(tensor); it != lazyViews.end()) {
    // A consumer needs it contiguous: one strided DMA, HBM to HBM.
    LazyView lazy = it->second;
    LocScope at(b, lazy.loc);
    auto shape = tensorType(tensor).getShape();
    Value out = resultBuffer(tensor);
    if (!tensorType(tensor).hasStaticShape())
      copyWindow(lazy.window, rowMajorWindow(tensor, out), tensor);
    else if (tensorType(tensor).getNumElements() == 0)
      ; // nothing to move
    else if (shape.empty())
      dma(view(lazy.window.buffer, index(lazy.window.offset), {1}, {1}),
          view(out, index(0), {1}, {1}));
    else if (auto [sizes, strides] = mergedRuns(shape, lazy.window.strides);
             !expandThroughSbuf(
                 {lazy.window.buffer, lazy.window.offset, strides}, sizes,
                 out) &&
             !broadcastThroughSbuf(
                 {lazy.window.buffer, lazy.window.offset, strides}, sizes,
                 out) &&
             !permuteThroughSbuf(
                 {lazy.window.buffer, lazy.window.offset, strides}, sizes,
                 out) &&
             !transposeThroughSbuf(
                 {lazy.window.buffer, lazy.window.offset, strides}, sizes,
                 out) &&
             !stridedThroughSbuf(
                 {lazy.window.buffer, lazy.window.offset, strides}, sizes, out))
      copyMerged(lazy.window.buffer, lazy.window.offset, lazy.window.strides,
                 out, index(0), contiguousStrides(shape), shape);
    return out;
  }
  // Constants are materialized on first use: splats feeding tensor_scalar
  // instructions never need a buffer.
  auto constant = tensor.getDefiningOp<ConstantOp>();
  assert(constant && "operand lowered before its producer");
  auto type = hbmType(tensorType(tensor));
  std::string name = "__constant_" + std::to_string(constantCount++);
  OpBuilder::InsertionGuard guard(b);
  LocScope at(b, constant.getLoc());
  b.setInsertionPointToStart(module.getBody());
  auto global = b.create<memref::GlobalOp>(
      name, b.getStringAttr("private"), type,
      cast<ElementsAttr>(constant.getValue()), /*constant=*/true,
      /*alignment=*/nullptr);
  b.setInsertionPointToStart(entry);
  Value buffer = b.create<memref::GetGlobalOp>(type, global.getName());
  buffers[tensor] = buffer;
  return buffer;
}

std::optional<TileBuilder::GroupWindow>
TileBuilder::rowWindow(Value tensor, int64_t minRows, int64_t rowDims) {
  auto type = tensorType(tensor);
  int64_t rank = type.getRank();
  if (!isWindow(tensor) || !type.hasStaticShape() || rank <= rowDims)
    return std::nullopt;
  Window w = windowOf(tensor);
  ArrayRef<int64_t> shape = type.getShape();
  int64_t cols = ShapedType::getNumElements(shape.take_back(rowDims));
  int64_t rows = ShapedType::getNumElements(shape.drop_back(rowDims));
  if (rows < minRows || cols == 0)
    return std::nullopt;
  // A row's dims contiguous (dims of one element aside).
  for (int64_t d = rank - 1, inner = 1; d >= rank - rowDims;
       inner *= shape[d--])
    if (shape[d] != 1 && w.strides[d] != inner)
      return std::nullopt;
  // The leading dims must be one run of rows: each dim's stride the next
  // one's times its size (dims of one element aside), rows that do not
  // overlap (no broadcast).
  std::optional<int64_t> rowStride;
  int64_t next = 0;
  for (int64_t d = rank - rowDims - 1; d >= 0; --d) {
    if (shape[d] == 1)
      continue;
    if (!rowStride)
      rowStride = next = w.strides[d];
    else if (w.strides[d] != next)
      return std::nullopt;
    next *= shape[d];
  }
  if (!rowStride || *rowStride < cols)
    return std::nullopt;
  return GroupWindow{w.buffer, w.offset, *rowStride, cols};
}

std::optional<TileBuilder::GroupWindow>
TileBuilder::repeatWindow(Value tensor) {
  auto type = tensorType(tensor);
  if (!isWindow(tensor) || !type.hasStaticShape())
    return std::nullopt;
  Window w = windowOf(tensor);
  ArrayRef<int64_t> shape = type.getShape();
  // Innermost dims contiguous (the block), then only broadcast dims.
  int64_t d = type.getRank() - 1, block = 1;
  for (; d >= 0 && (shape[d] == 1 || w.strides[d] == block); --d)
    block *= shape[d];
  bool repeats = false;
  for (; d >= 0; --d) {
    if (shape[d] != 1 && w.strides[d] != 0)
      return std::nullopt;
    repeats |= shape[d] != 1;
  }
  if (!repeats)
    return std::nullopt;
  return GroupWindow{w.buffer, w.offset, 0, 0, block};
}

void TileBuilder::copyMerged(Value src, int64_t srcOffset,
                             ArrayRef<int64_t> srcStrides, Value dst,
                             Value dstOffset, ArrayRef<int64_t> dstStrides,
                             ArrayRef<int64_t> shape) {
  // Innermost first: each dim merges into the one inside it when both
  // sides' strides run on from it.
  SmallVector<int64_t> sizes, from, to;
  for (int64_t d = (int64_t)shape.size() - 1; d >= 0; --d) {
    if (shape[d] == 1)
      continue;
    if (!sizes.empty() && srcStrides[d] == from.back() * sizes.back() &&
        dstStrides[d] == to.back() * sizes.back()) {
      sizes.back() *= shape[d];
      continue;
    }
    sizes.push_back(shape[d]);
    from.push_back(srcStrides[d]);
    to.push_back(dstStrides[d]);
  }
  if (sizes.empty()) {
    sizes = {1};
    from = to = {1};
  }
  std::reverse(sizes.begin(), sizes.end());
  std::reverse(from.begin(), from.end());
  std::reverse(to.begin(), to.end());
  // The DMA engines share an HBM-to-HBM copy by its leading dim's rows, a
  // partition's share of them each: a copy of few long runs (a KV cache's
  // heads, appended to by torch.cat) would go to a few engines. A run of a
  // partition's rows' worth of pieces of at least a well-moving size leads
  // instead (the order of a copy's dims is free: both sides take it).
  int64_t rows = target.partitions, run = sizes.back();
  int64_t bytes = std::max<int64_t>(
      1, cast<MemRefType>(src.getType()).getElementTypeBitWidth() / 8);
  if (sizes.size() >= 2 && sizes.front() < rows && from.back() == 1 &&
      to.back() == 1 && run % rows == 0 &&
      run / rows * bytes >= target.dmaPreferredBytesPerPartition) {
    sizes.back() = run / rows;
    sizes.insert(sizes.begin(), rows);
    from.insert(from.begin(), run / rows);
    to.insert(to.begin(), run / rows);
  } else if (sizes.size() >= 3 && sizes.front() < rows) {
    // Else the longest dim outside the innermost leads, when longer than the
    // leading one (a [B, S, H, D] -> [B, H, S, D] transpose: S).
    auto longest = std::max_element(sizes.begin(), sizes.end() - 1);
    int64_t d = longest - sizes.begin();
    std::rotate(sizes.begin(), longest, longest + 1);
    std::rotate(from.begin(), from.begin() + d, from.begin() + d + 1);
    std::rotate(to.begin(), to.begin() + d, to.begin() + d + 1);
  }
  dma(view(src, index(srcOffset), sizes, from),
      view(dst, dstOffset, sizes, to));
}

TileBuilder::Window TileBuilder::windowOf(Value tensor) {
  if (auto it = lazyViews.find(tensor); it != lazyViews.end())
    return it->second.window;
  auto shape = tensorType(tensor).getShape();
  if (!tensorType(tensor).hasStaticShape())
    return rowMajorWindow(tensor, bufferOf(tensor));
  return {bufferOf(tensor), 0, contiguousStrides(shape)};
}

TileBuilder::Window TileBuilder::rowMajorWindow(Value tensor, Value buffer) {
  auto type = tensorType(tensor);
  int64_t rank = type.getRank();
  Window w{buffer, 0, SmallVector<int64_t>(rank, 0), {}};
  int64_t stride = 1;
  Value dynamic; // the run-time factor of the stride, once a dim is dynamic
  for (int64_t d = rank - 1; d >= 0; --d) {
    if (type.getDimSize(d) != 1) {
      if (!dynamic) {
        w.strides[d] = stride;
      } else {
        w.strides[d] = ShapedType::kDynamic;
        w.dynamicStrides.resize(rank);
        w.dynamicStrides[d] = scale(dynamic, stride);
      }
    }
    if (!type.isDynamicDim(d)) {
      stride *= type.getDimSize(d);
      continue;
    }
    Value n = dimOf(tensor, d);
    if (!n) { // whyNotCopyable says so
      w.strides[d] = ShapedType::kDynamic;
      w.dynamicStrides.resize(rank);
      return w;
    }
    dynamic = dynamic ? b.create<arith::MulIOp>(dynamic, n).getResult() : n;
  }
  return w;
}

SmallVector<OpFoldResult> TileBuilder::mixedShape(Value tensor) {
  SmallVector<OpFoldResult> shape;
  auto type = tensorType(tensor);
  for (int64_t d = 0; d < type.getRank(); ++d)
    shape.push_back(type.isDynamicDim(d) ? OpFoldResult(dimOf(tensor, d))
                                         : b.getIndexAttr(type.getDimSize(d)));
  return shape;
}

/// The copies of copyWindow unroll the dims whose stride is known only at
/// run time; more than this many copies would bloat the program.
static constexpr int64_t kMaxUnrolledCopies = 64;

std::string TileBuilder::whyNotCopyable(const Window &window, Value tensor) {
  auto type = tensorType(tensor);
  Window dense = rowMajorWindow(tensor, window.buffer);
  int64_t copies = 1, looped = -1;
  for (int64_t d = 0; d < type.getRank(); ++d) {
    if (type.isDynamicDim(d) && !dimOf(tensor, d))
      return "the size of dim " + std::to_string(d) + " is not known";
    bool dynamicStride = ShapedType::isDynamic(window.strides[d]) ||
                         ShapedType::isDynamic(dense.strides[d]);
    if (ShapedType::isDynamic(window.strides[d]) && !window.dynamicStrides[d])
      return "the stride of dim " + std::to_string(d) + " is not known";
    if (!dynamicStride)
      continue;
    // copyWindow unrolls a dim whose stride is known only at run time, or
    // loops over one whose size is too (two such loops would copy an
    // element at a time: a transpose of two run-time sizes).
    if (!type.isDynamicDim(d))
      copies *= type.getDimSize(d);
    else if (looped >= 0)
      return "dims " + std::to_string(looped) + " and " + std::to_string(d) +
             " and their strides are all known only at run time";
    else
      looped = d;
  }
  if (copies > kMaxUnrolledCopies)
    return "a copy in " + std::to_string(copies) +
           " pieces (strides known only at run time)";
  return "";
}

void TileBuilder::copyWindow(const Window &src, const Window &dst, Value tensor,
                             Value dstOffset) {
  auto type = tensorType(tensor);
  int64_t rank = type.getRank();
  SmallVector<OpFoldResult> sizes = mixedShape(tensor);
  SmallVector<int64_t> looped, unrolled, kept;
  for (int64_t d = 0; d < rank; ++d) {
    if (ShapedType::isDynamic(src.strides[d]) ||
        ShapedType::isDynamic(dst.strides[d]))
      (type.isDynamicDim(d) ? looped : unrolled).push_back(d);
    else if (type.getDimSize(d) != 1)
      kept.push_back(d);
  }
  Value srcBase = index(src.offset), dstBase = index(dst.offset);
  if (dstOffset)
    dstBase = addOffsets(dstBase, dstOffset);
  // A dim whose size and stride are both known only at run time (the batch
  // of a permuted [batch, seq, ...] view; whyNotCopyable allows one): a
  // loop over it.
  OpBuilder::InsertionGuard guard(b);
  for (int64_t d : looped) {
    auto loop = b.create<scf::ForOp>(index(0), dimOf(tensor, d), index(1));
    b.setInsertionPoint(loop.getBody()->getTerminator());
    Value iv = loop.getInductionVar();
    srcBase =
        addOffsets(srcBase, b.create<arith::MulIOp>(iv, src.stride(*this, d)));
    dstBase =
        addOffsets(dstBase, b.create<arith::MulIOp>(iv, dst.stride(*this, d)));
  }
  int64_t copies = 1;
  for (int64_t d : unrolled)
    copies *= type.getDimSize(d);
  for (int64_t c = 0; c < copies; ++c) {
    Value from = srcBase, to = dstBase;
    for (int64_t i = unrolled.size(), rest = c; i-- > 0;) {
      int64_t d = unrolled[i], at = rest % type.getDimSize(d);
      rest /= type.getDimSize(d);
      if (at == 0)
        continue;
      from = addOffsets(from, scale(src.stride(*this, d), at));
      to = addOffsets(to, scale(dst.stride(*this, d), at));
    }
    SmallVector<OpFoldResult> shape;
    SmallVector<int64_t> srcStrides, dstStrides;
    for (int64_t d : kept) {
      shape.push_back(sizes[d]);
      srcStrides.push_back(src.strides[d]);
      dstStrides.push_back(dst.strides[d]);
    }
    if (shape.empty()) {
      shape.push_back(b.getIndexAttr(1));
      srcStrides.push_back(1);
      dstStrides.push_back(1);
    }
    dma(view(src.buffer, from, shape, srcStrides),
        view(dst.buffer, to, shape, dstStrides));
  }
}

/// Runs `body(i)` for i in [0, count): once inline when count is 1, else
/// in an scf.for loop.
void TileBuilder::forEach(int64_t count, llvm::function_ref<void(Value)> body) {
  if (count == 1) {
    body(index(0));
  } else if (count > 1) {
    auto loop = b.create<scf::ForOp>(index(0), index(count), index(1));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(loop.getBody()->getTerminator());
    body(loop.getInductionVar());
  }
}

/// Steps [first, first + count) of a pipeline that rotates over `slots`
/// buffers (step i uses buffer i % slots): groups of `slots` steps run in a
/// loop whose body is unrolled, so each copy names its buffer by a constant
/// offset; the steps left over run alone.
void TileBuilder::forEachRotating(
    int64_t first, int64_t count, int64_t slots,
    llvm::function_ref<void(Value step, int64_t slot)> body) {
  forEach(count / slots, [&](Value group) {
    Value start = addOffset(scale(group, slots), first);
    for (int64_t i = 0; i < slots; ++i)
      body(addOffset(start, i), (first + i) % slots);
  });
  for (int64_t i = count / slots * slots; i < count; ++i)
    body(index(first + i), (first + i) % slots);
}

void TileBuilder::forEachStep(
    int64_t count, int64_t per, int64_t slots, int64_t ahead,
    llvm::function_ref<void(Value, int64_t, int64_t, int64_t)> body) {
  int64_t period = slots / std::gcd(per, slots);
  int64_t tail = std::min(count, (ahead + per - 1) / per);
  forEachRotating(0, count - tail, period, [&](Value i, int64_t phase) {
    for (int64_t j = 0; j < per; ++j)
      body(i, j, (phase * per + j) % slots,
           std::numeric_limits<int64_t>::max());
  });
  for (int64_t i = count - tail; i < count; ++i)
    for (int64_t j = 0; j < per; ++j)
      body(index(i), j, (i * per + j) % slots, (count - i) * per - j);
}

/// Steps [0, count) of a stream whose loads go to buffer step % slots:
/// the loads of the first slots - 1 steps, then per step the load of the
/// step slots - 1 ahead before the step's compute. In program order (which
/// is each DMA queue's issue order) a load thus never waits behind the
/// store of an earlier step.
void TileBuilder::forEachPipelined(
    int64_t count, int64_t slots,
    llvm::function_ref<void(Value step, int64_t slot)> load,
    llvm::function_ref<void(Value step, int64_t slot)> compute) {
  int64_t ahead = std::min(slots - 1, count);
  for (int64_t i = 0; i < ahead; ++i)
    load(index(i), i % slots);
  int64_t steady = count - ahead;
  forEachRotating(0, steady, slots, [&](Value i, int64_t slot) {
    load(addOffset(i, ahead), (slot + ahead) % slots);
    compute(i, slot);
  });
  for (int64_t i = steady; i < count; ++i)
    compute(index(i), i % slots);
}

void TileBuilder::ifMore(Value count, int64_t first,
                         llvm::function_ref<void()> body) {
  Value left =
      first ? b.create<arith::SubIOp>(count, index(first)).getResult() : count;
  Value once = b.create<arith::MinSIOp>(
      b.create<arith::MaxSIOp>(left, index(0)), index(1));
  forEachDynamic(once, [&](Value) { body(); });
}

/// As forEachPipelined: the loads of steps [0, ahead), then groups of
/// `slots` steps (load of step i + ahead, compute of step i) in a loop,
/// then the steps left (fewer than slots + ahead), each step's slot its
/// index mod slots, a constant since the groups end at a multiple of it.
void TileBuilder::forEachPipelinedDynamic(
    Value count, int64_t slots,
    llvm::function_ref<void(Value step, int64_t slot)> load,
    llvm::function_ref<void(Value step, int64_t slot, Value after)> compute,
    bool firstLoads) {
  int64_t ahead = slots - 1;
  if (firstLoads)
    pipelinedDynamicFirstLoads(count, slots, load);
  Value steady = b.create<arith::MaxSIOp>(
      b.create<arith::SubIOp>(count, index(ahead)), index(0));
  Value groups = b.create<arith::FloorDivSIOp>(steady, index(slots));
  forEachDynamic(groups, [&](Value group) {
    Value start = scale(group, slots);
    for (int64_t i = 0; i < slots; ++i) {
      load(addOffset(start, i + ahead), (i + ahead) % slots);
      compute(addOffset(start, i), i, Value());
    }
  });
  Value done = scale(groups, slots);
  Value left = b.create<arith::SubIOp>(count, done);
  for (int64_t t = 0; t < slots - 1 + ahead; ++t)
    ifMore(left, t, [&] {
      ifMore(left, t + ahead,
             [&] { load(addOffset(done, t + ahead), (t + ahead) % slots); });
      compute(addOffset(done, t), t % slots,
              b.create<arith::SubIOp>(left, index(t + 1)));
    });
}

void TileBuilder::pipelinedDynamicFirstLoads(
    Value count, int64_t slots,
    llvm::function_ref<void(Value step, int64_t slot)> load) {
  for (int64_t i = 0; i < slots - 1; ++i)
    ifMore(count, i, [&] { load(index(i), i % slots); });
}

/// How many buffers keep a stream of DMA transfers ahead of the work that
/// consumes them: enough to cover a transfer (fixed latency included) with
/// the compute of the steps in between, at least three (so one transfer
/// can finish while another is issued), at most four.
int64_t TileBuilder::streamSlots(double transferNs, double computeNs) const {
  double cover =
      (target.dmaFixedLatencyNs + transferNs) / std::max(computeNs, 1.0);
  // A slot is refilled once the step that read it is done and used
  // slots - 1 steps later; one more covers the trigger and semaphores.
  return std::clamp<int64_t>((int64_t)std::ceil(cover) + 2, 3, 4);
}
