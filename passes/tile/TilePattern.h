//===- TilePattern.h - one op family's lowering into tiles ----------------===//
//
// neuron-lower-to-nisa is a set of patterns, one per op family, each in its
// own file with a populate...Patterns entry, and a driver (KernelLowering::
// lower) that hands every op, in program order, to the pattern matching it.
//
// Why a walk in program order and not MLIR's dialect conversion: a neuron
// op does not become nisa ops that replace it; its tensors become HBM
// buffers in a side table (TileBuilder) that later ops read from. A layout
// op's result stays a window of its input until a consumer needs it
// contiguous, a constant gets a buffer on its first use, and a returned
// tensor is computed straight into its output argument; the order the
// instructions are emitted in is the order the engines' queues issue them.
// The conversion driver's replace-and-roll-back model has no place for that
// bookkeeping, so the driver is a walk, and a pattern lowers an op into the
// function's KernelLowering instead of rewriting it.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_TILE_TILEPATTERN_H
#define PASSES_TILE_TILEPATTERN_H

#include "mlir/IR/Operation.h"
#include "llvm/ADT/SmallVector.h"

#include <memory>

namespace mlir::neuron {

class KernelLowering;

/// Lowers the ops of one family. The builder's location is the op's; a
/// failure has been reported on the op (emitOpError) by the pattern.
class TilePattern {
public:
  virtual ~TilePattern() = default;
  virtual bool matches(Operation *op) const = 0;
  virtual LogicalResult lower(Operation *op, KernelLowering &k) const = 0;
  /// Whether `op`, which has dynamic dims (issue #16), lowers to a program
  /// whose sizes are expressions of the size arguments; the driver refuses
  /// it with "not size-generic" otherwise.
  virtual bool isSizeGeneric(Operation *op) const { return false; }
};

/// A pattern for the ops `OpTys`: `lowerOp(op, k)` gets the op as the one
/// of them it is (or as Operation * for several).
template <typename Derived, typename... OpTys>
class OpTilePattern : public TilePattern {
public:
  bool matches(Operation *op) const final { return isa<OpTys...>(op); }
  LogicalResult lower(Operation *op, KernelLowering &k) const final {
    if constexpr (sizeof...(OpTys) == 1)
      return static_cast<const Derived *>(this)->lowerOp(cast<OpTys...>(op), k);
    else
      return static_cast<const Derived *>(this)->lowerOp(op, k);
  }
};

using TilePatternSet = SmallVector<std::unique_ptr<TilePattern>>;

/// LowerGroup.cpp: elementwise ops, alone or fused.
void populateElementwiseGroupPatterns(TilePatternSet &patterns);
/// LowerMatmul.cpp.
void populateMatmulPatterns(TilePatternSet &patterns);
/// LowerConvolution.cpp: neuron.conv2d.
void populateConvolutionPatterns(TilePatternSet &patterns);
/// LowerPool.cpp: neuron.pool2d.
void populatePoolPatterns(TilePatternSet &patterns);
/// LowerGroupNorm.cpp: neuron.group_norm.
void populateGroupNormPatterns(TilePatternSet &patterns);
/// LowerChannelNorm.cpp: neuron.channel_norm.
void populateChannelNormPatterns(TilePatternSet &patterns);
/// LowerReduce.cpp (with LowerColumnSum.cpp).
void populateReducePatterns(TilePatternSet &patterns);
/// LowerLayout.cpp: constants, views (reshape, transpose, broadcast, slice)
/// and concat.
void populateLayoutPatterns(TilePatternSet &patterns);
/// LowerGather.cpp.
void populateGatherPatterns(TilePatternSet &patterns);
/// LowerRand.cpp.
void populateRandPatterns(TilePatternSet &patterns);
/// LowerScan.cpp: cumsum.
void populateScanPatterns(TilePatternSet &patterns);
/// LowerTopK.cpp.
void populateTopKPatterns(TilePatternSet &patterns);
/// LowerRotary.cpp: rotary position embeddings.
void populateRotaryPatterns(TilePatternSet &patterns);
/// LowerCollective.cpp.
void populateCollectivePatterns(TilePatternSet &patterns);
/// passes/flex_attention/LowerFlexAttention.cpp.
void populateFlexAttentionPatterns(TilePatternSet &patterns);
/// passes/flex_attention/LowerFlexAttentionBackward.cpp.
void populateFlexAttentionBackwardPatterns(TilePatternSet &patterns);

/// Every family's patterns: what neuron-lower-to-nisa runs.
void populateLowerToNisaPatterns(TilePatternSet &patterns);

} // namespace mlir::neuron

#endif // PASSES_TILE_TILEPATTERN_H
