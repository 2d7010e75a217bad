//===- LowerLayout.cpp - constants, views and concat
//------------------------===//
//
// Layout ops move no data: a transpose, broadcast, slice or reshape result
// is a strided window of its input's buffer (TileBuilder::bindWindow),
// copied only if a consumer needs it contiguous. Constants get a buffer on
// their first use. Concat copies each input into its place by DMA.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

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
} // namespace

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
  bindWindow(result, out, op->getLoc());
}

void KernelLowering::lowerConcat(ConcatOp op) {
  auto outType = op.getType();
  SmallVector<int64_t> outStrides = contiguousStrides(outType.getShape());
  Value out = resultBuffer(op.getResult());
  int64_t position = 0;
  for (Value input : op.getInputs()) {
    auto inType = tensorType(input);
    if (inType.getNumElements() > 0)
      dma(view(bufferOf(input), index(0), inType.getShape(),
               contiguousStrides(inType.getShape())),
          view(out, index(position * outStrides[op.getDim()]),
               inType.getShape(), outStrides));
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
  LogicalResult lowerOp(Operation *op, KernelLowering &k) const {
    k.lowerLayout(op);
    return success();
  }
};
struct ConcatPattern : OpTilePattern<ConcatPattern, ConcatOp> {
  LogicalResult lowerOp(ConcatOp op, KernelLowering &k) const {
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
