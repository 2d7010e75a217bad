//===- LowerLayout.cpp - constants, views and concat
//------------------------===//
//
// Layout ops move no data: a transpose, broadcast, slice or reshape result
// is a strided window of its input's buffer (TileBuilder::bindWindow),
// copied only if a consumer needs it contiguous. Constants get a buffer on
// their first use. Concat copies each input into its place by DMA.
//
//===----------------------------------------------------------------------===//

#include "passes/fuse/FusionPlan.h"
#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"
#include "runtime/target/Cost.h"

namespace mlir::neuron {

namespace {
/// Strides that show a strided window of `shape` as `newShape` without
/// moving data (numpy's no-copy reshape), or std::nullopt.
std::optional<SmallVector<int64_t>>
reshapedStrides(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides,
                ArrayRef<int64_t> newShape) {
  SmallVector<int64_t> oldDims, oldStrides;
  for (auto [d, st] : llvm::zip(shape, strides))
    if (d != 1) {
      oldDims.push_back(d);
      oldStrides.push_back(st);
    }
  SmallVector<int64_t> newDims, where;
  for (auto [i, d] : llvm::enumerate(newShape))
    if (d != 1) {
      newDims.push_back(d);
      where.push_back(i);
    }
  SmallVector<int64_t> out(newShape.size(), 0);
  size_t oi = 0, ni = 0;
  while (oi < oldDims.size() && ni < newDims.size()) {
    size_t oj = oi + 1, nj = ni + 1;
    int64_t op = oldDims[oi], np = newDims[ni];
    while (op != np) {
      if (np < op) {
        if (nj >= newDims.size())
          return std::nullopt;
        np *= newDims[nj++];
      } else {
        if (oj >= oldDims.size())
          return std::nullopt;
        op *= oldDims[oj++];
      }
    }
    for (size_t k = oi; k + 1 < oj; ++k)
      if (oldStrides[k] != oldDims[k + 1] * oldStrides[k + 1])
        return std::nullopt;
    int64_t st = oldStrides[oj - 1];
    for (size_t k = nj; k-- > ni;) {
      out[where[k]] = st;
      st *= newDims[k];
    }
    oi = oj;
    ni = nj;
  }
  if (oi != oldDims.size() || ni != newDims.size())
    return std::nullopt;
  return out;
}
/// reshapedStrides over a window with dynamic sizes (issue #16): each dim
/// of the result is a run of the window's dims, a dynamic dim only ever
/// itself (the one dynamic dim of each side: the element counts then make
/// them equal); nullopt when a run would need a stride known at run time.
std::optional<SmallVector<int64_t>>
reshapedDynamicStrides(ArrayRef<int64_t> shape, ArrayRef<int64_t> strides,
                       ArrayRef<int64_t> newShape) {
  if (llvm::count_if(shape, ShapedType::isDynamic) != 1 ||
      llvm::count_if(newShape, ShapedType::isDynamic) != 1)
    return std::nullopt;
  // A stride known only at run time (of a dim that is not 1) has no number
  // to regroup with.
  for (auto [d, st] : llvm::zip(shape, strides))
    if (d != 1 && ShapedType::isDynamic(st))
      return std::nullopt;
  auto split = [](ArrayRef<int64_t> dims) {
    auto at = llvm::find_if(dims, ShapedType::isDynamic) - dims.begin();
    return std::pair(dims.take_front(at), dims.drop_front(at + 1));
  };
  auto [inOuter, inInner] = split(shape);
  auto [outOuter, outInner] = split(newShape);
  int64_t inAt = inOuter.size();
  // The dims around the dynamic one reshape statically, each side alone.
  auto outer = reshapedStrides(inOuter, strides.take_front(inAt), outOuter);
  auto inner = reshapedStrides(inInner, strides.drop_front(inAt + 1), outInner);
  if (!outer || !inner)
    return std::nullopt;
  SmallVector<int64_t> out(*outer);
  out.push_back(strides[inAt]);
  out.append(*inner);
  return out;
}
} // namespace

/// lowerLayout over sizes known only at run time: the same windows, their
/// strides from the dims (TileBuilder::rowMajorWindow); a window whose
/// copy would need a dim and its stride both at run time is refused.
LogicalResult KernelLowering::lowerDynamicLayout(Operation *op) {
  Value input = op->getOperand(0), result = op->getResult(0);
  auto refuse = [&](const Twine &why) {
    return emitError(op->getLoc())
           << "not size-generic: " << op->getName() << ": " << why << " ("
           << input.getType() << " -> " << result.getType() << ")";
  };
  for (int64_t d = 0; d < tensorType(result).getRank(); ++d)
    if (tensorType(result).isDynamicDim(d) && !dimOf(result, d))
      return refuse("the size of dim " + Twine(d) + " is not known");
  Window in = windowOf(input);
  auto inShape = tensorType(input).getShape();
  auto outType = tensorType(result);
  int64_t rank = outType.getRank();
  Window out{in.buffer, in.offset, {}, {}};
  auto dynamicAt = [&](int64_t d) {
    return in.dynamicStrides.empty() ? Value() : in.dynamicStrides[d];
  };
  if (auto t = dyn_cast<TransposeOp>(op)) {
    for (int64_t p : t.getPermutation()) {
      out.strides.push_back(in.strides[p]);
      out.dynamicStrides.push_back(dynamicAt(p));
    }
  } else if (isa<BroadcastOp>(op)) {
    int64_t shift = rank - (int64_t)inShape.size();
    out.strides.assign(rank, 0);
    out.dynamicStrides.assign(rank, Value());
    for (auto [i, d] : llvm::enumerate(inShape))
      if (d != 1) {
        out.strides[i + shift] = in.strides[i];
        out.dynamicStrides[i + shift] = dynamicAt(i);
      }
  } else if (auto sl = dyn_cast<SliceOp>(op)) {
    for (auto [i, st] : llvm::enumerate(in.strides)) {
      int64_t offset = sl.getOffsets()[i], step = sl.getStrides()[i];
      if (ShapedType::isDynamic(st) && (offset != 0 || step != 1))
        return refuse("a slice along a dim whose stride is known only at "
                      "run time");
      if (!ShapedType::isDynamic(st))
        out.offset += st * offset;
      out.strides.push_back(ShapedType::isDynamic(st) ? st : st * step);
      out.dynamicStrides.push_back(dynamicAt(i));
    }
  } else if (!isWindow(input)) {
    // A contiguous buffer reshaped is the same buffer.
    bind(result, in.buffer);
    return success();
  } else if (auto strides = reshapedDynamicStrides(inShape, in.strides,
                                                   outType.getShape())) {
    out.strides = *strides;
  } else {
    // Not a window: the input becomes contiguous first.
    if (std::string why = whyNotCopyable(in, input); !why.empty())
      return refuse(why);
    bind(result, bufferOf(input));
    return success();
  }
  if (llvm::all_of(out.dynamicStrides, [](Value v) { return !v; }))
    out.dynamicStrides.clear();
  if (std::string why = whyNotCopyable(out, result); !why.empty())
    return refuse(why);
  bindWindow(result, out, op->getLoc());
  return success();
}

/// Concat over sizes known only at run time: each input copied into its
/// place, at an offset the sizes before it give.
LogicalResult KernelLowering::lowerDynamicConcat(ConcatOp op) {
  Value result = op.getResult();
  int64_t dim = op.getDim();
  SmallVector<Value> values(op.getInputs());
  values.push_back(result);
  for (Value v : values)
    for (int64_t d = 0; d < tensorType(v).getRank(); ++d)
      if (tensorType(v).isDynamicDim(d) && !dimOf(v, d))
        return emitError(op->getLoc())
               << "not size-generic: " << op->getName() << ": the size of dim "
               << d << " of " << v.getType() << " is not known";
  Value out = resultBuffer(result);
  Window dst = rowMajorWindow(result, out);
  if (std::string why = whyNotCopyable(dst, result); !why.empty())
    return emitError(op->getLoc())
           << "not size-generic: " << op->getName() << ": " << why;
  Value position = index(0);
  for (Value input : op.getInputs()) {
    Window src = windowOf(input);
    // The input's place: the output's strides, its own sizes.
    Window place = dst;
    if (std::string why = whyNotCopyable(src, input); !why.empty())
      return emitError(op->getLoc())
             << "not size-generic: " << op->getName() << ": " << why;
    if (!tensorType(input).hasStaticShape() ||
        tensorType(input).getNumElements() > 0)
      copyWindow(src, place, input,
                 b.create<arith::MulIOp>(position, dst.stride(*this, dim)));
    position = addOffsets(position, dimOf(input, dim));
  }
  return success();
}

/// Transpose, broadcast, slice and reshape move no data here: the result
/// is a window of the input's buffer, copied only if a consumer needs it
/// contiguous (matmul operands and these ops themselves never do).
void KernelLowering::lowerLayout(Operation *op) {
  Value input = op->getOperand(0), result = op->getResult(0);
  Window in = windowOf(input);
  auto inShape = tensorType(input).getShape();
  auto outType = tensorType(result);
  Window out{in.buffer, in.offset, {}};
  if (auto t = dyn_cast<TransposeOp>(op)) {
    for (int64_t p : t.getPermutation())
      out.strides.push_back(in.strides[p]);
  } else if (isa<BroadcastOp>(op)) {
    int64_t shift = outType.getRank() - (int64_t)inShape.size();
    out.strides.assign(outType.getRank(), 0);
    for (auto [i, d] : llvm::enumerate(inShape))
      if (d != 1)
        out.strides[i + shift] = in.strides[i];
  } else if (auto sl = dyn_cast<SliceOp>(op)) {
    for (auto [i, st] : llvm::enumerate(in.strides)) {
      out.offset += st * sl.getOffsets()[i];
      out.strides.push_back(st * sl.getStrides()[i]);
    }
  } else {
    auto strides = reshapedStrides(inShape, in.strides, outType.getShape());
    if (!strides) {
      // Not expressible as a window: the input becomes contiguous first.
      bind(result, bufferOf(input));
      return;
    }
    if (!isWindow(input) && *strides == contiguousStrides(outType.getShape())) {
      bind(result, in.buffer); // same row-major order: an alias
      return;
    }
    out.strides = *strides;
  }
  // A window over all of its buffer in row-major order is that buffer (the
  // [B, L, H, D] result of an attention kernel seen through its transpose).
  if (out.offset == 0 && out.strides == contiguousStrides(outType.getShape()) &&
      cast<MemRefType>(out.buffer.getType()).hasStaticShape() &&
      cast<MemRefType>(out.buffer.getType()).getNumElements() ==
          outType.getNumElements()) {
    bind(result, out.buffer);
    return;
  }
  bindWindow(result, out, op->getLoc());
}

namespace {
/// SBUF bytes a partition's output rows take in concatThroughSbuf.
constexpr int64_t kConcatBytesPerPartition = 16 * 1024;
/// The longest output row concatThroughSbuf assembles: longer rows copy
/// straight, each input's part of a row a run long enough.
constexpr int64_t kConcatRowBytes = 4096;
/// The most tiles it unrolls.
constexpr int64_t kMostConcatTiles = 64;
} // namespace

/// A concat of short rows (the dims from the concat dim on: a padded image's
/// rows, or its planes) assembled in SBUF: a partition takes a run of whole
/// output rows; each input's part of them loads into a staging tile in one
/// run (a splat, a padding's zeros, is set there instead), an engine copy
/// puts it in its columns, and the rows store in one run a partition. Copied
/// into place straight, each input's part of a row was a DMA descriptor of
/// its own: the zeros of a padding two bytes each, 6.4x a copy's time for
/// F.pad(x, (1, 1)) of [8, 64, 56, 56] bf16. Float elements of at most 4
/// bytes only: an engine copies through fp32.
bool KernelLowering::concatThroughSbuf(ConcatOp op) {
  auto outType = op.getType();
  Type elt = outType.getElementType();
  int64_t dim = op.getDim();
  if (dim < 1 || !isa<FloatType>(elt) || elt.getIntOrFloatBitWidth() > 32 ||
      elt.getIntOrFloatBitWidth() < 16)
    return false;
  int64_t eltBytes = elt.getIntOrFloatBitWidth() / 8;
  // [rows, width]: the dims before `dim`, and those from it on.
  int64_t rows = ShapedType::getNumElements(outType.getShape().take_front(dim));
  int64_t width =
      ShapedType::getNumElements(outType.getShape().drop_front(dim));
  int64_t p = target.partitions;
  if (width * eltBytes > kConcatRowBytes || rows < p)
    return false;
  int64_t perPartition =
      std::max<int64_t>(1, kConcatBytesPerPartition / (width * eltBytes));
  // Tiles of `parts` partitions of `each` rows: whole ones, then the rest
  // in fewer rows a partition.
  struct Tile {
    int64_t first, parts, each;
  };
  SmallVector<Tile> tiles;
  for (int64_t first = 0; first < rows;) {
    int64_t left = rows - first;
    int64_t each = std::min(perPartition, (left + p - 1) / p);
    int64_t parts = std::min(p, left / each);
    tiles.push_back({first, parts, each});
    first += parts * each;
  }
  if ((int64_t)tiles.size() > kMostConcatTiles)
    return false;
  // Each input as rows (a splat as its value; a window whose rows do not
  // merge is made contiguous).
  struct Part {
    Value input;
    int64_t col = 0, cols = 0;
    std::optional<double> splat;
    std::optional<GroupWindow> source;
  };
  SmallVector<Part> parts;
  int64_t col = 0;
  for (Value input : op.getInputs()) {
    auto inType = tensorType(input);
    Part part;
    part.input = input;
    part.col = col;
    part.cols = ShapedType::getNumElements(inType.getShape().drop_front(dim));
    part.splat = splatValueOf(input);
    col += part.cols;
    if (!part.cols)
      continue;
    if (!part.splat)
      part.source = rowWindow(input, 0, inType.getRank() - dim);
    parts.push_back(std::move(part));
  }
  // Worth it where the DMA time falls by half: straight, a descriptor per
  // input's part of a row; staged, a run a partition for contiguous inputs
  // and the stores (rows of a window still load a descriptor each), plus
  // the latency of a transfer more on the way (a small concat, the rotary
  // frequencies' [2048, 128] f32, was 13 us slower staged).
  const ::neuron::target::CostModel cost(target);
  int64_t runs = 0; // of the loads of contiguous rows and of the stores
  for (const Tile &tl : tiles)
    runs += tl.parts;
  double direct = 0, throughSbuf = cost.dmaTransferNs(
                         double(rows * width * eltBytes),
                         double(perPartition * width * eltBytes), double(runs));
  for (const Part &part : parts) {
    double bytes = double(rows * part.cols * eltBytes);
    double row = double(part.cols * eltBytes);
    direct += cost.dmaTransferNs(bytes, row, double(rows));
    if (part.splat)
      continue;
    throughSbuf += part.source && part.source->rowStride != part.cols
                       ? cost.dmaTransferNs(bytes, row, double(rows))
                       : cost.dmaTransferNs(bytes, double(perPartition) * row,
                                            double(runs));
  }
  double engines = double(target.dmaEngines);
  if (throughSbuf / engines + 2 * target.dmaFixedLatencyNs >=
      0.5 * direct / engines)
    return false;
  for (Part &part : parts)
    if (!part.splat && !part.source)
      part.source = GroupWindow{bufferOf(part.input), 0, part.cols, part.cols};
  Value out = resultBuffer(op.getResult());
  TileScope scope(*this);
  constexpr int64_t kSlots = 2; // a tile's loads beside the last one's store
  Value assembled[kSlots], staged[kSlots];
  for (int64_t s = 0; s < kSlots; ++s) {
    assembled[s] =
        tile(MemorySpace::sbuf, {std::min(p, rows), perPartition * width}, elt);
    staged[s] =
        tile(MemorySpace::sbuf, {std::min(p, rows), perPartition * width}, elt);
  }
  int64_t copies = 0;
  for (auto [t, tl] : llvm::enumerate(tiles)) {
    Value whole = assembled[t % kSlots], stage = staged[t % kSlots];
    int64_t pitch = perPartition * width; // a partition's elements
    for (const Part &part : parts) {
      Value place = view(whole, index(part.col), {tl.parts, tl.each, part.cols},
                         {pitch, width, 1});
      nisa::Engine engine =
          copies++ % 2 ? nisa::Engine::gpsimd : nisa::Engine::vector;
      if (part.splat) {
        b.create<nisa::MemsetOp>(place, APFloat(*part.splat), engine);
        continue;
      }
      // Staged densely at the part's columns times `each`: one run a
      // partition when the input's rows are contiguous.
      Value dense = view(stage, index(tl.each * part.col),
                         {tl.parts, tl.each, part.cols}, {pitch, part.cols, 1});
      const GroupWindow &src = *part.source;
      dma(view(src.buffer, index(src.offset + tl.first * src.rowStride),
               {tl.parts, tl.each, part.cols},
               {tl.each * src.rowStride, src.rowStride, 1}),
          dense);
      b.create<nisa::CopyOp>(dense, place, engine);
    }
    dma(view(whole, index(0), {tl.parts, tl.each * width}, {pitch, 1}),
        view(out, index(tl.first * width), {tl.parts, tl.each * width},
             {tl.each * width, 1}));
  }
  return true;
}

void KernelLowering::lowerConcat(ConcatOp op) {
  if (concatThroughSbuf(op))
    return;
  auto outType = op.getType();
  SmallVector<int64_t> outStrides = contiguousStrides(outType.getShape());
  Value out = resultBuffer(op.getResult());
  int64_t position = 0;
  for (Value input : op.getInputs()) {
    auto inType = tensorType(input);
    // A window whose rows run along its last dim (a slice: rotate_half's
    // halves) copies straight into its place; other windows (a transpose,
    // which bufferOf moves through SBUF) become contiguous first.
    Window in =
        isWindow(input) && windowOf(input).strides.back() == 1
            ? windowOf(input)
            : Window{bufferOf(input), 0, contiguousStrides(inType.getShape())};
    if (inType.getNumElements() > 0)
      copyMerged(in.buffer, in.offset, in.strides, out,
                 index(position * outStrides[op.getDim()]), outStrides,
                 inType.getShape());
    position += inType.getDimSize(op.getDim());
  }
}

namespace {
struct ConstantPattern : OpTilePattern<ConstantPattern, ConstantOp> {
  LogicalResult lowerOp(ConstantOp op, KernelLowering &k) const {
    return success(); // materialized on first use (TileBuilder::bufferOf)
  }
};
struct ViewPattern
    : OpTilePattern<ViewPattern, ReshapeOp, TransposeOp, BroadcastOp, SliceOp> {
  bool isSizeGeneric(Operation *) const override { return true; }
  LogicalResult lowerOp(Operation *op, KernelLowering &k) const {
    if (!tensorType(op->getOperand(0)).hasStaticShape() ||
        !tensorType(op->getResult(0)).hasStaticShape())
      return k.lowerDynamicLayout(op);
    k.lowerLayout(op);
    return success();
  }
};
struct ConcatPattern : OpTilePattern<ConcatPattern, ConcatOp> {
  bool isSizeGeneric(Operation *) const override { return true; }
  LogicalResult lowerOp(ConcatOp op, KernelLowering &k) const {
    if (!op.getType().hasStaticShape())
      return k.lowerDynamicConcat(op);
    k.lowerConcat(op);
    return success();
  }
};
} // namespace

void populateLayoutPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<ConstantPattern>());
  patterns.push_back(std::make_unique<ViewPattern>());
  patterns.push_back(std::make_unique<ConcatPattern>());
}

} // namespace mlir::neuron
