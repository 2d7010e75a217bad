//===- TileBuilder.cpp - building blocks of the kernels
//--------------------===//

#include "passes/tile/TileBuilder.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

using namespace mlir;
using namespace mlir::neuron;

Value TileBuilder::view(Value base, Value offset, ArrayRef<int64_t> shape,
                        ArrayRef<int64_t> strides) {
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
      rc.getType(), base, rc.getMixedOffsets().front(), shape,
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

Value TileBuilder::dimOf(Value tensor, int64_t d) {
  auto type = tensorType(tensor);
  if (!type.isDynamicDim(d))
    return index(type.getDimSize(d));
  if (auto it = buffers.find(tensor); it != buffers.end())
    return bufferDim(it->second, d);
  if (auto it = destinations.find(tensor); it != destinations.end())
    return bufferDim(it->second, d);
  Operation *def = tensor.getDefiningOp();
  // Elementwise ops keep their operands' dims; a reduction keeps the
  // leading ones; a matmul's rows are its lhs's.
  if (isa_and_nonnull<UnaryOp, BinaryOp, SelectOp, CastOp, FusionOp>(def)) {
    for (Value operand : def->getOperands()) {
      auto t = tensorType(operand);
      if (t.getRank() == type.getRank() && t.isDynamicDim(d))
        if (Value v = dimOf(operand, d))
          return v;
    }
    return {};
  }
  if (auto r = dyn_cast_or_null<ReduceOp>(def))
    return dimOf(r.getInput(), d);
  if (auto m = dyn_cast_or_null<MatmulOp>(def))
    return d + 1 < type.getRank() ? dimOf(m.getLhs(), d) : dimOf(m.getRhs(), d);
  return {};
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

/// A transposed window ([..., R, C] reading rows contiguously, columns
/// strided) of 2- or 4-byte elements, made contiguous as a chip would: each
/// [128, C-chunk] tile loaded into SBUF by a transposing DMA, then stored
/// whole. One HBM-to-HBM DMA would move it one element per descriptor.
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
  if (matrices > 64) // each is its own loop nest: keep programs small
    return false;
  for (int64_t m = 0; m < matrices; ++m) {
    int64_t from = window.offset, rest = m;
    for (int64_t d = rank - 3; d >= 0; --d) {
      from += (rest % shape[d]) * window.strides[d];
      rest /= shape[d];
    }
    int64_t to = m * rows * cols;
    forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
      forTiles(cols, chunk, [&](Value c0, int64_t ct) {
        TileScope scope(*this);
        Value t = tile(MemorySpace::sbuf, {rt, ct}, elt);
        Value src = addOffsets(addOffset(r0, from), scale(c0, colStride));
        dma(view(window.buffer, src, {rt, ct}, {1, colStride}), t);
        Value dst = addOffsets(addOffset(scale(r0, cols), to), c0);
        dma(t, view(out, dst, {rt, ct}, {cols, 1}));
      });
    });
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
    if (tensorType(tensor).getNumElements() == 0)
      ; // nothing to move
    else if (shape.empty())
      dma(view(lazy.window.buffer, index(lazy.window.offset), {1}, {1}),
          view(out, index(0), {1}, {1}));
    else if (!transposeThroughSbuf(lazy.window, shape, out))
      dma(view(lazy.window.buffer, index(lazy.window.offset), shape,
               lazy.window.strides),
          view(out, index(0), shape, contiguousStrides(shape)));
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

TileBuilder::Window TileBuilder::windowOf(Value tensor) {
  if (auto it = lazyViews.find(tensor); it != lazyViews.end())
    return it->second.window;
  auto shape = tensorType(tensor).getShape();
  return {bufferOf(tensor), 0, contiguousStrides(shape)};
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
    llvm::function_ref<void(Value step, int64_t slot)> compute,
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
      compute(addOffset(start, i), i);
    }
  });
  Value done = scale(groups, slots);
  Value left = b.create<arith::SubIOp>(count, done);
  for (int64_t t = 0; t < slots - 1 + ahead; ++t)
    ifMore(left, t, [&] {
      ifMore(left, t + ahead,
             [&] { load(addOffset(done, t + ahead), (t + ahead) % slots); });
      compute(addOffset(done, t), t % slots);
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
