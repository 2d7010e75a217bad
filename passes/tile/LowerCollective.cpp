//===- LowerCollective.cpp - neuron.collective
//------------------------------===//
//
// One collective instruction per op: the process group moves whole
// tensors.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

/// One collective instruction from the input's buffer (made contiguous) to
/// the result's: the process group moves whole tensors.
void KernelLowering::lowerCollective(CollectiveOp op) {
  auto flat = [&](Value buffer, RankedTensorType type) {
    SmallVector<int64_t> shape(type.getShape());
    if (shape.empty())
      shape.push_back(1);
    return view(buffer, index(0), shape, contiguousStrides(shape));
  };
  Value in = flat(bufferOf(op.getInput()), tensorType(op.getInput()));
  Value out = flat(resultBuffer(op.getResult()), op.getType());
  auto kind = *nisa::symbolizeCollective(stringifyCollectiveKind(op.getKind()));
  // all_gather reduces nothing, so it carries no reduction.
  nisa::AluOpAttr reduce;
  if (kind != nisa::Collective::all_gather)
    reduce = nisa::AluOpAttr::get(b.getContext(), aluFor(op.getReduce()));
  b.create<nisa::CollectiveOp>(in, out, kind, reduce, op.getGroup(),
                               op.getRanks());
}

namespace {
struct CollectivePattern : OpTilePattern<CollectivePattern, CollectiveOp> {
  LogicalResult lowerOp(CollectiveOp op, KernelLowering &k) const {
    k.lowerCollective(op);
    return success();
  }
};
} // namespace

void populateCollectivePatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<CollectivePattern>());
}

} // namespace mlir::neuron
