//===- LowerFlexAttentionDynamic.cpp - attention over a run-time length ---===//
//
// The forward kernel of a neuron.flex_attention whose key length is known at
// run time only (issue #16: a KV cache growing by a token per call), one
// program for every length: the decode kernel (LowerDecodeAttention.cpp)
// with its block counts, the rest block's chunk count and its tail computed
// from the length at run time, every query head of a key head in one tile.
//
// What it cannot do (a mask, score_mod, a query length known at run time,
// key or value views) is refused with "not size-generic": the backend then
// compiles per size.
//===----------------------------------------------------------------------===//

#include "passes/flex_attention/FlexAttentionLowering.h"

namespace mlir::neuron::flex {

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
    return runPrefillDynamic();
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
  if (vDim > unit)
    return refuse("value head dims above " + Twine(unit));
  if (k.isWindow(op.getKey()) || k.isWindow(op.getValue()))
    return refuse("key or value is a strided view");
  Value kvLenV = k.dimOf(op.getKey(), 2), vLenV = k.dimOf(op.getValue(), 2);
  if (!kvLenV || !vLenV)
    return refuse("the key length is not known");
  if (!sameIndex(kvLenV, vLenV))
    return refuse("key and value lengths not known to be one size");

  return decodeKernel(kvLenV);
}

} // namespace mlir::neuron::flex
