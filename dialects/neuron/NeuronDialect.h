//===- NeuronDialect.h - graph-level Neuron dialect ------------*- C++ -*-===//
#ifndef DIALECTS_NEURON_NEURONDIALECT_H
#define DIALECTS_NEURON_NEURONDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/neuron/NeuronDialect.h.inc"
#include "dialects/neuron/NeuronEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/neuron/NeuronAttrs.h.inc"

namespace mlir::neuron {
/// neuron.conv2d's direct kernel (passes/tile/LowerConvolution.cpp) lays
/// out its tiles by these: channels per tile (the partitions of every
/// target), output positions per tile (a PSUM bank of fp32 sums), output
/// tiles staged for their stores. The importer forms a conv2d only where
/// the resident bytes stay within kConvResidentBudget (three quarters of
/// the smallest target's SBUF partition: the kernel's tiles are all that
/// is live while it runs).
constexpr int64_t kConvTile = 128;
constexpr int64_t kConvTileColumns = 512;
constexpr int64_t kConvStageSlots = 8;
constexpr int64_t kConvResidentBudget = 160 * 1024;
/// The partitions a DMA engine serves on every target
/// (dma_partitions_per_engine): a row-stacked copy of fewer channels takes
/// that many, its DMAs then spread over the engines.
constexpr int64_t kConvCopyPartitions = 8;

/// How the direct kernel holds a neuron.conv2d on chip (Conv2dOp::layout).
struct ConvLayout {
  /// 128-channel tiles of the input and of the output, and the output
  /// tiles whose weights are on chip at once (a panel; all of them unless
  /// the weights do not fit: each panel's then load in turn).
  int64_t cTiles, oTiles, oPanel;
  /// Copies of the image stacked on the partitions (C <= 64 only), copy r
  /// shifted by r tap columns, so one matmul contracts `copies` taps of a
  /// kernel row; the matmuls per output tile and channel tile: kh x
  /// ceil(kw / copies) tap groups. Row-stacked (strided rows or fewer than
  /// kConvCopyPartitions channels, kh x copyParts <= 128: a stem, a ViT's
  /// patch embedding, an RGB input layer): copy (r, q) holds only the
  /// padded rows kernel row r reads, y * stride + r * dilation for each
  /// output row y, shifted back q tap columns, loaded so from HBM, on
  /// partitions (q * kh + r) * copyParts; a tap group is colCopies kernel
  /// columns.
  bool rowStacked;
  int64_t copies, tapGroups, colCopies;
  /// Partitions per copy: C, or kConvCopyPartitions row-stacked where C
  /// is fewer (the partitions past C hold zeros).
  int64_t copyParts;
  /// Images whose outputs share a PSUM tile (small images; it divides N).
  int64_t images;
  /// Elements of one channel's padded image in SBUF: `lead` elements of
  /// slack in front (where the shifted copies start), then hp * wp (Ho *
  /// wp row-stacked).
  int64_t lead, plane;
  /// Image tiles the loads rotate over.
  int64_t imageSlots;
  /// Output rows per tile (all of them when images > 1), and columns per
  /// tile: Wo, or a bank's worth of one row's.
  int64_t rowsPerTile, chunkCols;
  /// An image too large for SBUF goes through in bands of output rows
  /// (`bands` of `bandRows`, the last may have fewer; one band of all Ho
  /// rows otherwise), each loading the input rows its windows read: a
  /// band's plane holds `bandIn` padded rows (a row-stacked one, one row
  /// per output row), `loadedRows` image rows as loaded where it pads.
  int64_t bands, bandRows, bandIn, loadedRows;
  /// SBUF bytes per partition of the kernel's tiles.
  int64_t residentBytes;
};
} // namespace mlir::neuron

#define GET_OP_CLASSES
#include "dialects/neuron/NeuronOps.h.inc"

namespace mlir::neuron {
/// True for functions whose result is a predicate (i1) rather than a value.
bool isPredicate(BinaryFn fn);

/// Size-generic functions (issue #16): a size parameter is an `index`
/// argument with {name, min, max} under kSizeAttrName; a tensor argument or
/// result with dynamic dims has its sizes as an affine map from the size
/// arguments (symbol i is the i-th of them) under kDimsAttrName, and so
/// may an op with one dynamic result (the importer's, from the document;
/// passes that change the result's type must change it too or drop it).
constexpr llvm::StringLiteral kSizeAttrName = "neuron.size";
constexpr llvm::StringLiteral kDimsAttrName = "neuron.dims";

/// Channels per group of a neuron.group_norm: a step of its lowering holds
/// whole groups on the partitions.
constexpr int64_t kGroupNormMaxChannels = 128;
/// Whether `fn` may be a neuron.matmul's epilogue: an activation ScalarE
/// applies as the sums leave PSUM.
bool isMatmulEpilogue(UnaryFn fn);
/// Channels of a neuron.channel_norm: its lowering multiplies each
/// position's channels by a C x C matrix on TensorE.
constexpr int64_t kChannelNormMaxChannels = 1024;

/// The longest rotated dim canonicalization makes a neuron.rotary of (heads
/// of RoPE are 64 to 256): its lowering keeps twelve rows of it per
/// partition on chip.
constexpr int64_t kMaxRotaryDim = 1024;

} // namespace mlir::neuron

#endif // DIALECTS_NEURON_NEURONDIALECT_H
