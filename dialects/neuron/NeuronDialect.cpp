//===- NeuronDialect.cpp - verifiers and folds of `neuron` ops ------------===//
#include "dialects/neuron/NeuronDialect.h"
#include "dialects/neuron/FlexBlockClass.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::neuron;

#include "dialects/neuron/NeuronDialect.cpp.inc"
#include "dialects/neuron/NeuronEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/neuron/NeuronAttrs.cpp.inc"

void NeuronDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/neuron/NeuronAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialects/neuron/NeuronOps.cpp.inc"
      >();
}

Operation *NeuronDialect::materializeConstant(OpBuilder &builder,
                                              Attribute value, Type type,
                                              Location loc) {
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  return builder.create<ConstantOp>(loc, type, elements);
}

bool mlir::neuron::isPredicate(BinaryFn fn) {
  switch (fn) {
  case BinaryFn::eq:
  case BinaryFn::ne:
  case BinaryFn::lt:
  case BinaryFn::le:
  case BinaryFn::gt:
  case BinaryFn::ge:
  case BinaryFn::logical_and:
  case BinaryFn::logical_or:
  case BinaryFn::logical_xor:
    return true;
  default:
    return false;
  }
}

static RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

static bool isI1(Type t) { return t.isInteger(1); }

/// The value of a float splat constant.
static std::optional<double> splat(Value v) {
  auto c = v.getDefiningOp<ConstantOp>();
  auto attr =
      c ? dyn_cast<SplatElementsAttr>(c.getValue()) : SplatElementsAttr();
  if (!attr || !isa<FloatType>(attr.getElementType()))
    return std::nullopt;
  return attr.getSplatValue<APFloat>().convertToDouble();
}

//===----------------------------------------------------------------------===//
// Sources
//===----------------------------------------------------------------------===//

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

LogicalResult UnaryOp::verify() {
  auto in = tensorType(getInput()), out = getType();
  if (in.getShape() != out.getShape())
    return emitOpError("result shape must equal the input shape");
  bool predicate = getFn() == UnaryFn::logical_not;
  if (predicate && !isI1(out.getElementType()))
    return emitOpError("logical_not produces i1");
  if (!predicate && in.getElementType() != out.getElementType())
    return emitOpError("result element type must equal the input's");
  return success();
}

LogicalResult BinaryOp::verify() {
  auto lhs = tensorType(getLhs()), rhs = tensorType(getRhs()), out = getType();
  if (lhs.getShape() != rhs.getShape() || lhs.getShape() != out.getShape())
    return emitOpError("operands and result must have the same shape "
                       "(broadcast explicitly with neuron.broadcast)");
  if (lhs.getElementType() != rhs.getElementType())
    return emitOpError("operands must have the same element type");
  if (isPredicate(getFn())) {
    if (!isI1(out.getElementType()))
      return emitOpError("'") << stringifyBinaryFn(getFn())
                              << "' produces an i1 tensor";
  } else if (out.getElementType() != lhs.getElementType()) {
    return emitOpError("result element type must equal the operands'");
  }
  return success();
}

LogicalResult SelectOp::verify() {
  if (tensorType(getCond()).getShape() != getType().getShape())
    return emitOpError("condition and values must have the same shape");
  return success();
}

LogicalResult CastOp::verify() {
  if (tensorType(getInput()).getShape() != getType().getShape())
    return emitOpError("cast keeps the shape");
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getType())
    return getInput();
  return {};
}

//===----------------------------------------------------------------------===//
// Contractions and reductions
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::verify() {
  auto lhs = tensorType(getLhs()), rhs = tensorType(getRhs()), out = getType();
  int64_t rank = lhs.getRank();
  if (rank < 2 || rhs.getRank() != rank || out.getRank() != rank)
    return emitOpError("operands and result must have the same rank >= 2");
  if (lhs.getElementType() != rhs.getElementType())
    return emitOpError("operands must have the same element type");
  auto l = lhs.getShape(), r = rhs.getShape(), o = out.getShape();
  for (int64_t i = 0; i < rank - 2; ++i)
    if (l[i] != r[i] || l[i] != o[i])
      return emitOpError("batch dimension ") << i << " differs";
  if (l[rank - 1] != r[rank - 2])
    return emitOpError("contraction sizes differ: ")
           << l[rank - 1] << " vs " << r[rank - 2];
  if (o[rank - 2] != l[rank - 2] || o[rank - 1] != r[rank - 1])
    return emitOpError("result must be [..., M, N]");
  if (getBias() && (tensorType(getBias()).getRank() != 1 ||
                    tensorType(getBias()).getDimSize(0) != o[rank - 1]))
    return emitOpError("bias must be [N]");
  for (Value v : {getRowScale(), getRowShift()})
    if (v && (tensorType(v).getRank() != 1 ||
              tensorType(v).getDimSize(0) != o[rank - 2]))
      return emitOpError("row_scale and row_shift must be [M]");
  if (getBias() && (getRowScale() || getRowShift()))
    return emitOpError("takes a row affine or a column bias, not both");
  if (std::optional<UnaryFn> fn = getEpilogue(); fn && !isMatmulEpilogue(*fn))
    return emitOpError("epilogue must be an activation (relu, gelu, "
                       "gelu_tanh, silu, sigmoid, tanh), not ")
           << stringifyUnaryFn(*fn);
  return success();
}

bool mlir::neuron::isMatmulEpilogue(UnaryFn fn) {
  switch (fn) {
  case UnaryFn::relu:
  case UnaryFn::gelu:
  case UnaryFn::gelu_tanh:
  case UnaryFn::silu:
  case UnaryFn::sigmoid:
  case UnaryFn::tanh:
    return true;
  default:
    return false;
  }
}

LogicalResult ScaledMatmulOp::verify() {
  auto lhs = tensorType(getLhs()), rhs = tensorType(getRhs()), out = getType();
  if (lhs.getRank() != 2 || rhs.getRank() != 2 || out.getRank() != 2)
    return emitOpError("operands and result must be 2-d");
  int64_t m = lhs.getDimSize(0), n = rhs.getDimSize(1);
  if (lhs.getDimSize(1) != rhs.getDimSize(0))
    return emitOpError("contraction sizes differ: ")
           << lhs.getDimSize(1) << " vs " << rhs.getDimSize(0);
  if (out.getDimSize(0) != m || out.getDimSize(1) != n)
    return emitOpError("result must be [M, N] = [") << m << ", " << n << "]";
  auto checkVector = [&](Value v, int64_t size, bool one,
                         const char *name) -> LogicalResult {
    auto t = tensorType(v);
    if (t.getRank() != 1 ||
        !(t.getDimSize(0) == size || (one && t.getDimSize(0) == 1)))
      return emitOpError(name) << " must be [" << size << "]"
                               << (one ? " or [1]" : "") << ", got " << t;
    return success();
  };
  if (hasBlockScales()) {
    int64_t k = lhs.getDimSize(1);
    if (k % 32)
      return emitOpError("MX block scales need K a multiple of 32, not ") << k;
    for (auto [scale, rows, name] :
         {std::tuple{getRowScale(), m, "row_scale"},
          std::tuple{getColScale(), n, "col_scale"}}) {
      auto t = tensorType(scale);
      if (!t.getElementType().isUnsignedInteger(8) || t.getRank() != 2 ||
          t.getDimSize(0) != rows || t.getDimSize(1) != k / 32)
        return emitOpError(name) << " must be ui8 [" << rows << ", " << k / 32
                                 << "] (MX block scales), got " << t;
    }
    if (getBias())
      return emitOpError("takes no bias with MX block scales");
    return success();
  }
  if (failed(checkVector(getRowScale(), m, true, "row_scale")) ||
      failed(checkVector(getColScale(), n, true, "col_scale")))
    return failure();
  if (getBias() && failed(checkVector(getBias(), n, false, "bias")))
    return failure();
  return success();
}

LogicalResult GroupedMatmulOp::verify() {
  auto lhs = tensorType(getLhs()), rhs = tensorType(getRhs()), out = getType();
  if (lhs.getRank() != 2 || rhs.getRank() != 3 || out.getRank() != 2)
    return emitOpError("takes [M, K] x [G, K, N] -> [M, N]");
  if (lhs.getDimSize(1) != rhs.getDimSize(1))
    return emitOpError("contraction sizes differ: ")
           << lhs.getDimSize(1) << " vs " << rhs.getDimSize(1);
  if (out.getDimSize(0) != lhs.getDimSize(0) ||
      out.getDimSize(1) != rhs.getDimSize(2))
    return emitOpError("result must be [M, N] = [")
           << lhs.getDimSize(0) << ", " << rhs.getDimSize(2) << "]";
  if ((int64_t)getEnds().size() != rhs.getDimSize(0))
    return emitOpError("needs one row end per group: ")
           << getEnds().size() << " for " << rhs.getDimSize(0) << " groups";
  return success();
}

LogicalResult Conv2dOp::verify() {
  auto in = tensorType(getInput()), w = tensorType(getWeight()),
       out = getType();
  if (in.getRank() != 4 || w.getRank() != 4 || out.getRank() != 4)
    return emitOpError("takes [N, C, H, W] x [O, C, kh, kw] -> [N, O, Ho, Wo]");
  if (!in.hasStaticShape() || !w.hasStaticShape() || !out.hasStaticShape())
    return emitOpError("needs static shapes");
  if (in.getElementType() != w.getElementType() ||
      in.getElementType() != out.getElementType())
    return emitOpError("input, weight and result must share an element type");
  for (ArrayRef<int64_t> attr : {getStride(), getPadding(), getDilation()})
    if (attr.size() != 2)
      return emitOpError("stride, padding and dilation take (height, width)");
  if (getDepthwise()) {
    if (w.getDimSize(1) != 1 || w.getDimSize(0) != in.getDimSize(1))
      return emitOpError("depthwise takes [C, 1, kh, kw] weights for ")
             << in.getDimSize(1) << " channels";
  } else if (in.getDimSize(1) != w.getDimSize(1)) {
    return emitOpError("input channels differ: ")
           << in.getDimSize(1) << " vs the weight's " << w.getDimSize(1);
  }
  if (getBias()) {
    auto bias = tensorType(getBias());
    if (bias.getRank() != 1 || bias.getDimSize(0) != w.getDimSize(0) ||
        (bias.getElementType() != in.getElementType() &&
         !bias.getElementType().isF32()))
      return emitOpError("bias must be [")
             << w.getDimSize(0) << "] of the input's element type or f32";
  }
  // A scale comes with a bias (the fold makes both; the types of a scale
  // alone would print as the bias's).
  if (getScale() && (!getBias() || tensorType(getScale()).getShape() !=
                                       ArrayRef<int64_t>{w.getDimSize(0)}))
    return emitOpError("scale must be [")
           << w.getDimSize(0) << "], with a bias";
  SmallVector<int64_t> expected{in.getDimSize(0), w.getDimSize(0)};
  for (int d = 0; d < 2; ++d) {
    int64_t s = getStride()[d], p = getPadding()[d], dil = getDilation()[d];
    if (s < 1 || p < 0 || dil < 1)
      return emitOpError("needs stride and dilation >= 1, padding >= 0");
    int64_t span = dil * (w.getDimSize(2 + d) - 1) + 1;
    int64_t padded = in.getDimSize(2 + d) + 2 * p;
    if (span > padded || w.getDimSize(2 + d) < 1)
      return emitOpError("kernel does not fit the padded input");
    expected.push_back((padded - span) / s + 1);
  }
  if (out.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError("result must be [")
           << expected[0] << ", " << expected[1] << ", " << expected[2] << ", "
           << expected[3] << "]";
  return success();
}

ConvLayout Conv2dOp::layout() {
  auto in = tensorType(getInput()), w = tensorType(getWeight()),
       out = getType();
  int64_t n = in.getDimSize(0), c = in.getDimSize(1), h = in.getDimSize(2),
          wd = in.getDimSize(3);
  int64_t o = w.getDimSize(0), kh = w.getDimSize(2), kw = w.getDimSize(3);
  int64_t ho = out.getDimSize(2), wo = out.getDimSize(3);
  int64_t hp = h + 2 * getPadding()[0], wp = wd + 2 * getPadding()[1];
  ConvLayout l;
  l.cTiles = (c + kConvTile - 1) / kConvTile;
  l.oTiles = (o + kConvTile - 1) / kConvTile;
  // Few channels stacked take a DMA engine's partitions each, so that the
  // copies load over as many engines.
  l.copyParts = c < kConvCopyPartitions && kh * kConvCopyPartitions <= kConvTile
                    ? kConvCopyPartitions
                    : c;
  l.rowStacked = kh > 1 && kh * l.copyParts <= kConvTile &&
                 (getStride()[0] > 1 || c < kConvCopyPartitions);
  if (!l.rowStacked)
    l.copyParts = c;
  // Row-stacked: the kernel rows, and as many column shifts of them as fit.
  l.colCopies = l.rowStacked ? std::min(kw, kConvTile / (kh * l.copyParts)) : 1;
  l.copies = l.rowStacked ? kh * l.colCopies
                          : std::min(kw, std::max<int64_t>(1, kConvTile / c));
  l.tapGroups = l.rowStacked ? (kw + l.colCopies - 1) / l.colCopies
                             : kh * ((kw + l.copies - 1) / l.copies);
  l.images = 1;
  for (int64_t b = 2; b <= n; ++b)
    if (n % b == 0 && b * ho * wo <= kConvTileColumns)
      l.images = b;
  l.lead = l.rowStacked ? 0 : (l.copies - 1) * getDilation()[1];
  l.rowsPerTile = std::max<int64_t>(1, std::min(ho, kConvTileColumns / wo));
  l.chunkCols = std::min(wo, kConvTileColumns);
  int64_t eltBytes = in.getElementTypeBitWidth() / 8;
  bool padded = getPadding()[0] || getPadding()[1];
  // A band of `rows` output rows: its plane's padded rows (all hp for a
  // whole image) and the image rows it loads.
  int64_t span = (kh - 1) * getDilation()[0] + 1;
  auto setBand = [&](int64_t rows) {
    l.bandRows = rows;
    l.bands = (ho + rows - 1) / rows;
    l.bandIn = l.rowStacked   ? rows
               : l.bands == 1 ? hp
                              : (rows - 1) * getStride()[0] + span;
    l.loadedRows = l.bands == 1 ? h : std::min(h, l.bandIn);
    l.plane = l.lead + l.bandIn * wp;
  };
  // An image slot: the padded planes and (where it pads a whole image)
  // them as loaded.
  auto imageSlot = [&] {
    int64_t loaded = padded && !l.rowStacked ? l.loadedRows * wd : 0;
    return l.images * l.cTiles * (l.plane + loaded);
  };
  // The rows of w as loaded, and reordered for the copies (depthwise: each
  // copy's channels' taps on its partitions).
  int64_t raw = getDepthwise()
                    ? kh * kw
                    : (c + (l.copies > 1 ? l.copyParts : 0)) * kh * kw;
  int64_t staged = kConvStageSlots * kConvTileColumns;
  // The bias and scale of each output channel as fp32 columns per output
  // tile.
  int64_t bias =
      ((getBias() ? 1 : 0) + (getScale() ? 1 : 0)) * l.oTiles * 4 / eltBytes;
  // The transposes' identity and the fp32 iota it is made from.
  int64_t identity = kConvTile * (eltBytes + 4) / eltBytes;
  int64_t rest = eltBytes * (raw + staged + identity + bias);
  // The weights of a panel of output tiles: all of them where they fit
  // beside two image slots, else the most that do (the images then load
  // once per panel); a single image in bands of whole tiles of output rows
  // where the whole does not fit beside them, the fewest bands that do.
  // Depthwise: an output tile's only from its own channel tile.
  int64_t weightTiles = getDepthwise() ? 1 : l.cTiles;
  auto weights = [&](int64_t panel) {
    return eltBytes * weightTiles * l.tapGroups *
           std::min(o, panel * kConvTile);
  };
  auto fits = [&](int64_t panel, int64_t slots) {
    return rest + weights(panel) + slots * eltBytes * imageSlot() <=
           kConvResidentBudget;
  };
  auto fitBands = [&](int64_t panel) {
    setBand(ho);
    if (fits(panel, 2) || l.images > 1)
      return;
    for (int64_t count = 2; count <= ho; ++count) {
      int64_t rows = llvm::alignTo((ho + count - 1) / count, l.rowsPerTile);
      if (rows >= l.bandRows)
        continue;
      setBand(rows);
      if (fits(panel, 2))
        return;
    }
  };
  for (l.oPanel = l.oTiles;; --l.oPanel) {
    fitBands(l.oPanel);
    if (l.oPanel == 1 || fits(l.oPanel, 2))
      break;
  }
  rest += weights(l.oPanel);
  // A third image slot where it fits: a load's DMAs and GpSimd copy then
  // run two groups ahead of TensorE.
  int64_t slot = imageSlot();
  bool third = n / l.images * l.bands >= 3 &&
               rest + 3 * eltBytes * slot <= kConvResidentBudget;
  l.imageSlots = third ? 3 : 2;
  l.residentBytes = rest + l.imageSlots * eltBytes * slot;
  return l;
}

LogicalResult GroupNormOp::verify() {
  auto in = tensorType(getInput());
  if (in.getRank() < 2 || !in.hasStaticShape())
    return emitOpError("takes a static [N, C, ...] input");
  int64_t n = in.getDimSize(0), c = in.getDimSize(1), g = getGroups();
  if (g < 1 || c % g != 0)
    return emitOpError("needs groups dividing the ") << c << " channels";
  if (c / g > kGroupNormMaxChannels)
    return emitOpError("takes at most ")
           << kGroupNormMaxChannels << " channels per group";
  if (tensorType(getResult()) != in)
    return emitOpError("result type must equal the input's");
  for (Value v : {getWeight(), getBias()})
    if (v && tensorType(v).getShape() != ArrayRef<int64_t>{c})
      return emitOpError("weight and bias are [C]");
  for (Value v : {getMean(), getRstd()})
    if (tensorType(v).getShape() != ArrayRef<int64_t>{n, g})
      return emitOpError("mean and rstd are [N, groups]");
  return success();
}

LogicalResult ChannelNormOp::verify() {
  auto in = tensorType(getInput());
  if (in.getRank() < 3 || !in.hasStaticShape())
    return emitOpError("takes a static [N, C, ...] input of rank 3 or more");
  int64_t c = in.getDimSize(1);
  if (c < 1 || c > kChannelNormMaxChannels)
    return emitOpError("takes 1 to ")
           << kChannelNormMaxChannels << " channels, not " << c;
  if (tensorType(getResult()) != in)
    return emitOpError("result type must equal the input's");
  for (Value v : {getWeight(), getBias()})
    if (v && tensorType(v) != RankedTensorType::get({c}, in.getElementType()))
      return emitOpError("weight and bias are [C] of the input's type");
  SmallVector<int64_t> stats(in.getShape());
  stats[1] = 1;
  for (Value v : {getMean(), getRstd()})
    if (tensorType(v).getShape() != ArrayRef<int64_t>(stats))
      return emitOpError("mean and rstd are [N, 1, ...]");
  return success();
}

LogicalResult Pool2dOp::verify() {
  auto in = tensorType(getInput()), out = getType();
  if (in.getRank() < 3 || out.getRank() != in.getRank())
    return emitOpError("takes [..., H, W] -> [..., Ho, Wo]");
  if (!in.hasStaticShape() || !out.hasStaticShape())
    return emitOpError("needs static shapes");
  if (in.getElementType() != out.getElementType())
    return emitOpError("result element type must equal the input's");
  if (getFn() != ReduceFn::max && getFn() != ReduceFn::sum)
    return emitOpError("takes max or sum windows");
  for (ArrayRef<int64_t> attr :
       {getKernel(), getStride(), getPadding(), getDilation()})
    if (attr.size() != 2)
      return emitOpError(
          "kernel, stride, padding and dilation take (height, width)");
  int64_t rank = in.getRank();
  SmallVector<int64_t> expected(in.getShape().drop_back(2));
  for (int d = 0; d < 2; ++d) {
    int64_t k = getKernel()[d], s = getStride()[d], p = getPadding()[d],
            dil = getDilation()[d];
    if (k < 1 || s < 1 || p < 0 || dil < 1)
      return emitOpError(
          "needs kernel, stride and dilation >= 1, padding >= 0");
    int64_t span = dil * (k - 1) + 1;
    int64_t padded = in.getDimSize(rank - 2 + d) + 2 * p;
    if (span > padded)
      return emitOpError("window does not fit the padded input");
    expected.push_back((padded - span) / s + 1);
  }
  if (out.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError("result shape must be the windows' ");
  return success();
}

int64_t Pool2dOp::residentBytes() {
  auto in = tensorType(getInput()), out = getType();
  int64_t rank = in.getRank();
  int64_t h = in.getDimSize(rank - 2), w = in.getDimSize(rank - 1);
  int64_t outPlane = out.getDimSize(rank - 2) * out.getDimSize(rank - 1);
  int64_t eltBytes = in.getElementTypeBitWidth() / 8;
  // Two slots of a plane and two partial results (fp32 at most): padding
  // is never materialized (LowerPool.cpp).
  return 2 * (eltBytes * h * w + 2 * 4 * outPlane);
}

LogicalResult ReduceOp::verify() {
  auto in = tensorType(getInput());
  int64_t count = getCount();
  if (count < 1 || count > in.getRank())
    return emitOpError("count ") << count << " out of range for rank "
                                 << in.getRank();
  auto kept = in.getShape().drop_back(count);
  if (getType().getShape() != kept)
    return emitOpError("result shape must be the input shape without the "
                       "reduced dims");
  if (getType().getElementType() != in.getElementType())
    return emitOpError("result element type must equal the input's");
  return success();
}

//===----------------------------------------------------------------------===//
// Layout
//===----------------------------------------------------------------------===//

LogicalResult BroadcastOp::verify() {
  auto in = tensorType(getInput()), out = getType();
  if (in.getElementType() != out.getElementType())
    return emitOpError("broadcast keeps the element type");
  if (in.getRank() > out.getRank())
    return emitOpError("result rank must be at least the input rank");
  int64_t shift = out.getRank() - in.getRank();
  for (int64_t i = 0; i < in.getRank(); ++i) {
    int64_t s = in.getDimSize(i), d = out.getDimSize(i + shift);
    if (s != 1 && s != d) {
      auto size = [](int64_t n) {
        return ShapedType::isDynamic(n) ? std::string("?") : std::to_string(n);
      };
      return emitOpError("input dim ") << i << " of size " << size(s)
                                       << " cannot broadcast to " << size(d);
    }
  }
  return success();
}

OpFoldResult BroadcastOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  // A constant has static sizes: a splat broadcast to dynamic ones stays.
  if (auto splat = dyn_cast_or_null<SplatElementsAttr>(adaptor.getInput());
      splat && getType().hasStaticShape())
    return SplatElementsAttr::get(getType(), splat.getSplatValue<Attribute>());
  return {};
}

LogicalResult TransposeOp::verify() {
  auto in = tensorType(getInput()), out = getType();
  ArrayRef<int64_t> perm = getPermutation();
  if ((int64_t)perm.size() != in.getRank() || out.getRank() != in.getRank())
    return emitOpError("permutation must list every dimension once");
  llvm::SmallVector<bool> seen(perm.size(), false);
  for (auto [i, p] : llvm::enumerate(perm)) {
    if (p < 0 || p >= in.getRank() || seen[p])
      return emitOpError("permutation must list every dimension once");
    seen[p] = true;
    if (out.getDimSize(i) != in.getDimSize(p))
      return emitOpError("result dim ") << i << " must be input dim " << p;
  }
  if (in.getElementType() != out.getElementType())
    return emitOpError("transpose keeps the element type");
  return success();
}

OpFoldResult TransposeOp::fold(FoldAdaptor) {
  // A transpose of a transpose is one (a permute and its inverse, as
  // around a channels-last LayerNorm, none).
  auto inner = getInput().getDefiningOp<TransposeOp>();
  if (inner) {
    SmallVector<int64_t> composed;
    for (int64_t p : getPermutation())
      composed.push_back(inner.getPermutation()[p]);
    setPermutation(composed);
    getInputMutable().assign(inner.getInput());
  }
  for (auto [i, p] : llvm::enumerate(getPermutation()))
    if ((int64_t)i != p)
      return inner ? getResult() : OpFoldResult();
  return getInput();
}

LogicalResult ReshapeOp::verify() {
  auto in = tensorType(getInput()), out = getType();
  // With dynamic dims the counts are size expressions, equal only when both
  // sides have them (a static count never equals a symbolic one).
  if (in.hasStaticShape() != out.hasStaticShape())
    return emitOpError("reshape between a static and a dynamic shape");
  if (in.hasStaticShape() && in.getNumElements() != out.getNumElements())
    return emitOpError("reshape must keep the number of elements (")
           << in.getNumElements() << " vs " << out.getNumElements() << ")";
  if (in.getElementType() != out.getElementType())
    return emitOpError("reshape keeps the element type");
  return success();
}

OpFoldResult ReshapeOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  if (auto producer = getInput().getDefiningOp<ReshapeOp>()) {
    getInputMutable().assign(producer.getInput());
    return getResult();
  }
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(adaptor.getInput()))
    return dense.reshape(getType());
  return {};
}

LogicalResult SliceOp::verify() {
  auto in = tensorType(getInput()), out = getType();
  ArrayRef<int64_t> offsets = getOffsets(), strides = getStrides();
  int64_t rank = in.getRank();
  if ((int64_t)offsets.size() != rank || (int64_t)strides.size() != rank ||
      out.getRank() != rank)
    return emitOpError("offsets and strides need one entry per dimension");
  for (int64_t i = 0; i < rank; ++i) {
    if (strides[i] < 1)
      return emitOpError("stride of dim ") << i << " must be positive";
    int64_t n = out.getDimSize(i);
    if (in.isDynamicDim(i) || out.isDynamicDim(i)) {
      // Only a whole dynamic dim is known to lie inside the input.
      if (!in.isDynamicDim(i) || !out.isDynamicDim(i) || offsets[i] != 0 ||
          strides[i] != 1)
        return emitOpError("dim ")
               << i << " is dynamic: a slice must keep it whole";
      continue;
    }
    if (offsets[i] < 0 ||
        (n > 0 && offsets[i] + (n - 1) * strides[i] >= in.getDimSize(i)))
      return emitOpError("dim ") << i << " reads outside the input";
  }
  if (in.getElementType() != out.getElementType())
    return emitOpError("slice keeps the element type");
  return success();
}

OpFoldResult SliceOp::fold(FoldAdaptor adaptor) {
  // A slice of a splat (HoistSlice moves slices onto constants) is one.
  if (auto splat = dyn_cast_or_null<SplatElementsAttr>(adaptor.getInput());
      splat && getType().hasStaticShape())
    return SplatElementsAttr::get(getType(), splat.getSplatValue<Attribute>());
  if (getInput().getType() != getType())
    return {};
  for (auto [o, s] : llvm::zip(getOffsets(), getStrides()))
    if (o != 0 || s != 1)
      return {};
  return getInput();
}

LogicalResult ConcatOp::verify() {
  auto out = getType();
  int64_t dim = getDim();
  if (getInputs().empty())
    return emitOpError("needs at least one input");
  if (dim < 0 || dim >= out.getRank())
    return emitOpError("dim ") << dim << " out of range";
  int64_t total = 0;
  bool dynamicInput = false;
  for (Value v : getInputs()) {
    auto t = tensorType(v);
    dynamicInput |= t.getRank() > dim && t.isDynamicDim(dim);
    if (t.getRank() != out.getRank() ||
        t.getElementType() != out.getElementType())
      return emitOpError("inputs must match the result's rank and type");
    for (int64_t i = 0; i < out.getRank(); ++i)
      if (i != dim && t.getDimSize(i) != out.getDimSize(i))
        return emitOpError("inputs differ from the result in dim ") << i;
    total += t.getDimSize(dim);
  }
  // Along a dynamic dim the sum is a size expression: the result is dynamic
  // exactly when an input is.
  if (dynamicInput || out.isDynamicDim(dim)) {
    if (dynamicInput != out.isDynamicDim(dim))
      return emitOpError("dim ")
             << dim << " is dynamic in "
             << (dynamicInput ? "an input but not the result"
                              : "the result but in no input");
    return success();
  }
  if (total != out.getDimSize(dim))
    return emitOpError("sizes along dim ") << dim << " add up to " << total
                                           << ", result has "
                                           << out.getDimSize(dim);
  return success();
}

LogicalResult GatherOp::verify() {
  auto table = tensorType(getTable()), idx = tensorType(getIndices());
  if (table.getRank() < 1)
    return emitOpError("table must have rank >= 1");
  llvm::SmallVector<int64_t> expect(idx.getShape());
  llvm::append_range(expect, table.getShape().drop_front());
  if (getType().getShape() != ArrayRef<int64_t>(expect))
    return emitOpError("result shape must be indices.shape ++ "
                       "table.shape[1:]");
  if (getType().getElementType() != table.getElementType())
    return emitOpError("result element type must equal the table's");
  return success();
}

LogicalResult ScatterOp::verify() {
  auto input = tensorType(getInput()), idx = tensorType(getIndices()),
       values = tensorType(getValues());
  if (input.getRank() < 1)
    return emitOpError("input must have rank >= 1");
  llvm::SmallVector<int64_t> expect(idx.getShape());
  llvm::append_range(expect, input.getShape().drop_front());
  if (values.getShape() != ArrayRef<int64_t>(expect))
    return emitOpError("values shape must be indices.shape ++ "
                       "input.shape[1:]");
  if (values.getElementType() != input.getElementType() || getType() != input)
    return emitOpError("values and result must have the input's type");
  if (isI1(input.getElementType()) && getAccumulate())
    return emitOpError("accumulate adds numbers, not i1");
  if (getPermutation() && (getAccumulate() || idx.getRank() != 1 ||
                           idx.getDimSize(0) != input.getDimSize(0)))
    return emitOpError("a permutation writes each of the input's rows once: "
                       "one index per row, without accumulate");
  return success();
}

LogicalResult CumsumOp::verify() {
  RankedTensorType in = tensorType(getInput()), out = getType();
  if (in.getShape() != out.getShape())
    return emitOpError("result must have the input's shape");
  if (getDim() < 0 || getDim() >= in.getRank())
    return emitOpError("dim ")
           << getDim() << " is out of range for rank " << in.getRank();
  if (isI1(in.getElementType()) || isI1(out.getElementType()))
    return emitOpError("sums numbers: cast i1 to an integer type first");
  return success();
}

LogicalResult RotaryOp::verify() {
  RankedTensorType x = tensorType(getX()), out = getType();
  for (Value v : {getCos(), getSin()})
    if (tensorType(v) != x)
      return emitOpError("cos and sin must have x's type ") << x;
  if (out != x)
    return emitOpError("result must have x's type");
  if (!isa<FloatType>(x.getElementType()))
    return emitOpError("rotates floats");
  if (x.getRank() < 1 || ShapedType::isDynamic(x.getShape().back()) ||
      x.getShape().back() % 2)
    return emitOpError("the last dim must be of an even static size");
  return success();
}

LogicalResult TopKOp::verify() {
  RankedTensorType in = tensorType(getInput());
  if (in.getRank() < 1)
    return emitOpError("input must have rank >= 1");
  if (isI1(in.getElementType()))
    return emitOpError("orders numbers: cast i1 to an integer type first");
  int64_t n = in.getShape().back();
  if (getK() < 0 || getK() > n)
    return emitOpError("k = ") << getK() << " is outside [0, " << n << "]";
  SmallVector<int64_t> expect(in.getShape());
  expect.back() = getK();
  for (Value r : {getValues(), getIndices()})
    if (tensorType(r).getShape() != ArrayRef<int64_t>(expect))
      return emitOpError("results must have the input's shape with k as the "
                         "last dim");
  if (tensorType(getValues()).getElementType() != in.getElementType())
    return emitOpError("values must have the input's element type");
  return success();
}

LogicalResult RandOp::verify() {
  if (tensorType(getSeed()).getShape() != ArrayRef<int64_t>{2})
    return emitOpError("seed must be a tensor<2xi32> (the Philox key)");
  if (getStream() < 0 || getStream() > 0xFFFFFFFFll)
    return emitOpError("stream must fit in 32 unsigned bits");
  return success();
}

LogicalResult CollectiveOp::verify() {
  RankedTensorType in = tensorType(getInput()), out = getType();
  if (in.getElementType() != out.getElementType())
    return emitOpError("input and result must have one element type");
  ArrayRef<int64_t> ranks = getRanks();
  if (ranks.empty())
    return emitOpError("needs the group's ranks");
  llvm::SmallDenseSet<int64_t> seen;
  for (int64_t r : ranks)
    if (r < 0 || !seen.insert(r).second)
      return emitOpError("rank ") << r << " is negative or listed twice";
  if (getKind() != CollectiveKind::all_gather && getReduce() == ReduceFn::prod)
    return emitOpError("reduces with sum, max or min");
  if (getKind() == CollectiveKind::all_reduce) {
    if (in.getShape() != out.getShape())
      return emitOpError("all_reduce keeps the input's shape");
    return success();
  }
  // all_gather and reduce_scatter work on dim 0.
  auto n = static_cast<int64_t>(ranks.size());
  if (in.getRank() < 1 || in.getRank() != out.getRank() ||
      in.getShape().drop_front() != out.getShape().drop_front())
    return emitOpError("input and result must agree on every dim but dim 0");
  if (getKind() == CollectiveKind::all_gather) {
    if (out.getDimSize(0) != in.getDimSize(0) * n)
      return emitOpError("all_gather's result dim 0 must be ")
             << n << " (the group's size) times the input's";
    return success();
  }
  if (in.getDimSize(0) % n != 0)
    return emitOpError("reduce_scatter's input dim 0 (")
           << in.getDimSize(0) << ") must be divisible by the group's size ("
           << n << ")";
  if (out.getDimSize(0) * n != in.getDimSize(0))
    return emitOpError("reduce_scatter's result dim 0 must be the input's / ")
           << n;
  return success();
}

#define GET_OP_CLASSES
#include "dialects/neuron/NeuronOps.cpp.inc"

LogicalResult FusionOp::verify() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size() ||
      !llvm::equal(body.getArgumentTypes(), getInputs().getTypes()))
    return emitOpError("body arguments must match the inputs' types");
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("body must end in neuron.yield");
  if (!llvm::equal(yield.getValues().getTypes(), getResultTypes()))
    return emitOpError("yielded types must match the results' types");
  for (Operation &op : body.without_terminator())
    if (!isa<UnaryOp, BinaryOp, SelectOp, CastOp, ReduceOp, BroadcastOp,
             ReshapeOp, ConstantOp>(op))
      return op.emitOpError("cannot be fused (a fusion holds elementwise, "
                            "reduce, broadcast, reshape and constant ops)");
  return success();
}

//===----------------------------------------------------------------------===//
// FlexAttentionOp
//===----------------------------------------------------------------------===//

/// A modifier region: `scalars` 0-d arguments (the first of type `first`
/// when given, the others integers), then one per buffer, yielding a 0-d
/// value whose element type satisfies `yields`.
/// A FlexAttention modifier region: `scalars` 0-d arguments (floats at
/// `floats`, integers elsewhere), then one per buffer; it yields one 0-d
/// value satisfying `yields`.
static LogicalResult verifyModifier(Operation *op, Region &region,
                                    StringRef name, unsigned scalars,
                                    ArrayRef<unsigned> floats,
                                    ValueRange buffers,
                                    function_ref<bool(Type)> yields,
                                    StringRef yieldsWhat) {
  Block &body = region.front();
  if (body.getNumArguments() != scalars + buffers.size())
    return op->emitOpError() << name << " takes " << scalars
                             << " scalars and one argument per buffer";
  for (auto [i, arg] : llvm::enumerate(body.getArguments())) {
    auto type = dyn_cast<RankedTensorType>(arg.getType());
    if (i >= scalars) {
      if (arg.getType() != buffers[i - scalars].getType())
        return op->emitOpError()
               << name << " argument " << i << " must match its buffer";
      continue;
    }
    bool isFloat = llvm::is_contained(floats, i);
    if (!type || type.getRank() != 0 ||
        !(isFloat ? isa<FloatType>(type.getElementType())
                  : type.getElementType().isSignlessInteger()))
      return op->emitOpError()
             << name << " argument " << i << " must be a 0-d "
             << (isFloat ? "float" : "integer") << " tensor";
  }
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield || yield.getValues().size() != 1)
    return op->emitOpError() << name << " must yield one value";
  auto type = dyn_cast<RankedTensorType>(yield.getValues()[0].getType());
  if (!type || type.getRank() != 0 || !yields(type.getElementType()))
    return op->emitOpError() << name << " must yield a 0-d " << yieldsWhat;
  return success();
}

/// What the forward and backward FlexAttention ops share: query, key and
/// value, out and lse shapes, the block classes, score_mod and mask_mod.
template <typename OpTy>
static LogicalResult verifyAttention(OpTy op, Value outValue, Value lseValue) {
  auto q = cast<RankedTensorType>(op.getQuery().getType());
  auto k = cast<RankedTensorType>(op.getKey().getType());
  auto v = cast<RankedTensorType>(op.getValue().getType());
  if (q.getRank() != 4 || k.getRank() != 4 || v.getRank() != 4)
    return op.emitOpError(
        "query, key and value must be [batch, heads, rows, dim]");
  if (q.getElementType() != k.getElementType() ||
      q.getElementType() != v.getElementType())
    return op.emitOpError("query, key and value must have one element type");
  int64_t batch = q.getDimSize(0), heads = q.getDimSize(1);
  if (k.getDimSize(0) != batch || v.getDimSize(0) != batch)
    return op.emitOpError("query, key and value must have one batch size");
  if (k.getDimSize(1) != v.getDimSize(1) || k.getDimSize(1) == 0 ||
      heads % k.getDimSize(1) != 0)
    return op.emitOpError("key and value heads must divide the query heads");
  if (k.getDimSize(2) != v.getDimSize(2))
    return op.emitOpError("key and value must have one number of rows");
  if (k.getDimSize(3) != q.getDimSize(3))
    return op.emitOpError("query and key must have one head dim");
  auto out = cast<RankedTensorType>(outValue.getType());
  auto lse = cast<RankedTensorType>(lseValue.getType());
  if (out.getShape() != ArrayRef<int64_t>{batch, heads, q.getDimSize(2),
                                          v.getDimSize(3)} ||
      out.getElementType() != q.getElementType())
    return op.emitOpError("out must be [batch, heads, query rows, value dim] "
                          "of the query's type");
  if (lse.getShape() != ArrayRef<int64_t>{batch, heads, q.getDimSize(2)})
    return op.emitOpError("lse must be [batch, heads, query rows]");
  ArrayRef<int64_t> blockSize = op.getBlockSize();
  if (blockSize.size() != 2 || blockSize[0] <= 0 || blockSize[1] <= 0)
    return op.emitOpError("block_size must be two positive sizes");
  auto blocksType = dyn_cast<RankedTensorType>(op.getBlocks().getType());
  if (!blocksType || blocksType.getRank() != 4 ||
      !blocksType.getElementType().isInteger(8))
    return op.emitOpError("blocks must be a rank-4 i8 tensor");
  ArrayRef<int64_t> bs = blocksType.getShape();
  // A length known at run time only (issue #16): one class for its blocks.
  auto blocksOf = [](int64_t len, int64_t block) {
    return ShapedType::isDynamic(len) ? 1 : (len + block - 1) / block;
  };
  if ((bs[0] != 1 && bs[0] != batch) || (bs[1] != 1 && bs[1] != heads) ||
      bs[2] != blocksOf(q.getDimSize(2), blockSize[0]) ||
      bs[3] != blocksOf(k.getDimSize(2), blockSize[1]))
    return op.emitOpError("blocks must be [1 or batch, 1 or heads, query "
                          "blocks, key blocks] for block_size (1 for a "
                          "length known at run time)");
  for (APInt value : op.getBlocks().template getValues<APInt>())
    if (value.getSExtValue() < int64_t(flex::kFirstKind) ||
        value.getSExtValue() > int64_t(flex::kLastKind))
      return op.emitOpError("blocks values must be ")
             << int(flex::Kind::masked) << " (masked), "
             << int(flex::Kind::partial) << " (partial) or "
             << int(flex::Kind::full) << " (full)";
  auto isFloat = [](Type t) { return isa<FloatType>(t); };
  if (failed(verifyModifier(op, op.getScoreMod(), "score_mod", 5, {0},
                            op.getScoreBuffers(), isFloat, "float")))
    return failure();
  return verifyModifier(op, op.getMaskMod(), "mask_mod", 4, {},
                        op.getMaskBuffers(),
                        [](Type t) { return t.isInteger(1); }, "i1");
}

LogicalResult FlexAttentionOp::verify() {
  return verifyAttention(*this, getOut(), getLse());
}

LogicalResult FlexAttentionBackwardOp::verify() {
  if (failed(verifyAttention(*this, getOut(), getLse())))
    return failure();
  if (getGradOut().getType() != getOut().getType())
    return emitOpError("grad_out must have the type of out");
  if (getGradQuery().getType() != getQuery().getType() ||
      getGradKey().getType() != getKey().getType() ||
      getGradValue().getType() != getValue().getType())
    return emitOpError("gradients must have the types of query, key and "
                       "value");
  return verifyModifier(*this, getScoreGrad(), "score_grad", 6, {0, 5},
                        getScoreBuffers(),
                        [](Type t) { return isa<FloatType>(t); }, "float");
}

//===----------------------------------------------------------------------===//
// Canonicalization: transposes sink below elementwise ops
//===----------------------------------------------------------------------===//

namespace {
/// elementwise(transpose(x), splat) -> transpose(elementwise(x, splat')):
/// a transpose moves no data only where its consumer reads it through a
/// strided window (a matmul); sinking it below elementwise ops carries it
/// there instead of materializing it for them.
template <typename OpTy>
struct SinkTranspose : public OpRewritePattern<OpTy> {
  using OpRewritePattern<OpTy>::OpRewritePattern;

  LogicalResult matchAndRewrite(OpTy op,
                                PatternRewriter &rewriter) const override {
    std::optional<ArrayRef<int64_t>> perm;
    for (Value v : op->getOperands()) {
      auto t = v.template getDefiningOp<TransposeOp>();
      if (!t)
        continue;
      if (perm && *perm != t.getPermutation())
        return failure();
      perm = t.getPermutation();
    }
    if (!perm)
      return failure();
    auto resultType = cast<RankedTensorType>(op.getType());
    SmallVector<int64_t> shape(resultType.getRank());
    for (auto [i, p] : llvm::enumerate(*perm))
      shape[p] = resultType.getDimSize(i);
    SmallVector<Value> operands;
    for (Value v : op->getOperands()) {
      if (auto t = v.template getDefiningOp<TransposeOp>()) {
        operands.push_back(t.getInput());
        continue;
      }
      // A splat broadcast to sizes known only at run time (issue #16) is
      // broadcast to the permuted ones.
      if (auto bc = v.template getDefiningOp<BroadcastOp>();
          bc && !bc.getType().hasStaticShape()) {
        auto c = bc.getInput().template getDefiningOp<ConstantOp>();
        if (!c || !isa<SplatElementsAttr>(c.getValue()))
          return failure();
        operands.push_back(rewriter.create<BroadcastOp>(
            bc.getLoc(), bc.getType().clone(shape), bc.getInput()));
        continue;
      }
      auto constant = v.template getDefiningOp<ConstantOp>();
      auto splat = constant ? dyn_cast<SplatElementsAttr>(constant.getValue())
                            : SplatElementsAttr();
      if (!splat)
        return failure();
      auto type = RankedTensorType::get(shape, splat.getElementType());
      operands.push_back(rewriter.create<ConstantOp>(
          constant.getLoc(), type, splat.resizeSplat(type)));
    }
    Operation *inner = rewriter.clone(*op);
    inner->setOperands(operands);
    inner->getResult(0).setType(
        RankedTensorType::get(shape, resultType.getElementType()));
    // The importer's sizes of the result, permuted as its dims are.
    if (auto dims = op->template getAttrOfType<AffineMapAttr>(kDimsAttrName)) {
      AffineMap map = dims.getValue();
      SmallVector<AffineExpr> permuted(map.getNumResults());
      for (auto [i, p] : llvm::enumerate(*perm))
        permuted[p] = map.getResult(i);
      inner->setAttr(kDimsAttrName,
                     AffineMapAttr::get(AffineMap::get(
                         0, map.getNumSymbols(), permuted, op.getContext())));
    }
    rewriter.replaceOpWithNewOp<TransposeOp>(op, resultType,
                                             inner->getResult(0), *perm);
    return success();
  }
};
} // namespace

namespace {
/// Ops HoistSlice moves slices above.
bool hoists(Operation *op) {
  return op &&
         isa<UnaryOp, BinaryOp, CastOp, SelectOp, BroadcastOp, ReshapeOp>(op);
}

/// Whether every use of `v` is a slice, or an op HoistSlice moves slices
/// above whose every use is (recursively; `seen` memoizes).
bool onlySliced(Value v, llvm::SmallDenseMap<Value, bool> &seen) {
  if (auto it = seen.find(v); it != seen.end())
    return it->second;
  bool sliced = llvm::all_of(v.getUsers(), [&](Operation *user) {
    return isa<SliceOp>(user) || (hoists(user) && user->getNumResults() == 1 &&
                                  onlySliced(user->getResult(0), seen));
  });
  return seen[v] = sliced;
}

/// Whether the slices HoistSlice would put on `op`'s operands stay as many
/// as the slices of its result: its operands are distinct, and one another
/// hoisting op computes has no other user than `op` and slices (moved up
/// from `op` before). A square, or two paths to one value, would double
/// them at every such op on the way up.
bool slicesStayFew(Operation *op) {
  llvm::SmallDenseSet<Value, 4> operands;
  for (Value v : op->getOperands())
    if (!operands.insert(v).second ||
        (hoists(v.getDefiningOp()) &&
         !llvm::all_of(v.getUsers(), [&](Operation *user) {
           return user == op || isa<SliceOp>(user);
         })))
      return false;
  return true;
}

/// slice(elementwise(x, y)) -> elementwise(slice(x), slice(y)), likewise
/// through a broadcast and a reshape that splits one dim, when every use of
/// the producer is sliced: the slices of a tensor that only slices read
/// (a sum over a small dim, importer's sumOfSlices) then reach the values
/// computed before it, and the elementwise ops fuse with the slices'
/// consumer instead of materializing the whole tensor for them.
struct HoistSlice : public OpRewritePattern<SliceOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(SliceOp slice,
                                PatternRewriter &rewriter) const override {
    Operation *def = slice.getInput().getDefiningOp();
    llvm::SmallDenseMap<Value, bool> seen;
    if (!def || def->getNumResults() != 1 || !slicesStayFew(def) ||
        !tensorType(def->getResult(0)).hasStaticShape() ||
        !onlySliced(def->getResult(0), seen))
      return failure();
    Location loc = slice.getLoc();
    ArrayRef<int64_t> offsets = slice.getOffsets(),
                      strides = slice.getStrides();
    ArrayRef<int64_t> shape = slice.getType().getShape();
    auto sliceOf = [&](Value v, ArrayRef<int64_t> o, ArrayRef<int64_t> st,
                       ArrayRef<int64_t> sh) -> Value {
      auto type = RankedTensorType::get(sh, tensorType(v).getElementType());
      return rewriter.create<SliceOp>(loc, type, v, o, st);
    };
    auto sliced = slice.getType();
    if (isa<UnaryOp, BinaryOp, CastOp, SelectOp>(def)) {
      auto defShape = tensorType(def->getResult(0)).getShape();
      SmallVector<Value> operands;
      for (Value v : def->getOperands()) {
        if (tensorType(v).getShape() != defShape)
          return failure();
        operands.push_back(sliceOf(v, offsets, strides, shape));
      }
      Operation *inner = rewriter.clone(*def);
      inner->setOperands(operands);
      inner->getResult(0).setType(
          sliced.clone(tensorType(def->getResult(0)).getElementType()));
      inner->removeAttr(kDimsAttrName);
      rewriter.replaceOp(slice, inner->getResult(0));
      return success();
    }
    if (auto b = dyn_cast<BroadcastOp>(def)) {
      // Trailing dims aligned: an expanded (size-1) input dim stays whole.
      auto in = tensorType(b.getInput());
      int64_t lead = sliced.getRank() - in.getRank();
      SmallVector<int64_t> o, st, sh;
      for (int64_t j = 0; j < in.getRank(); ++j) {
        bool expanded =
            in.getDimSize(j) == 1 && b.getType().getDimSize(j + lead) != 1;
        o.push_back(expanded ? 0 : offsets[j + lead]);
        st.push_back(expanded ? 1 : strides[j + lead]);
        sh.push_back(expanded ? 1 : shape[j + lead]);
      }
      rewriter.replaceOpWithNewOp<BroadcastOp>(
          slice, sliced, sliceOf(b.getInput(), o, st, sh));
      return success();
    }
    if (auto r = dyn_cast<ReshapeOp>(def)) {
      // [..., A * B, ...] -> [..., A, B, ...] with one element taken of B:
      // every B-th element of the input dim.
      auto in = tensorType(r.getInput()), out = r.getType();
      if (!in.hasStaticShape() || out.getRank() != in.getRank() + 1)
        return failure();
      int64_t d = 0;
      while (d < in.getRank() && in.getDimSize(d) == out.getDimSize(d))
        ++d;
      if (d == in.getRank() ||
          in.getDimSize(d) != out.getDimSize(d) * out.getDimSize(d + 1) ||
          in.getShape().drop_front(d + 1) != out.getShape().drop_front(d + 2) ||
          shape[d + 1] != 1)
        return failure();
      int64_t inner = out.getDimSize(d + 1);
      SmallVector<int64_t> o(offsets), st(strides), sh(shape);
      o[d] = offsets[d] * inner + offsets[d + 1];
      st[d] = strides[d] * inner;
      o.erase(o.begin() + d + 1);
      st.erase(st.begin() + d + 1);
      sh.erase(sh.begin() + d + 1);
      rewriter.replaceOpWithNewOp<ReshapeOp>(slice, sliced,
                                             sliceOf(r.getInput(), o, st, sh));
      return success();
    }
    return failure();
  }
};
} // namespace

namespace {
/// The x of rotate_half(x) = concat(-x[..., h:], x[..., :h]) along the last
/// dim (of 2h), as Transformers writes it; null for anything else.
Value rotatedHalves(Value v) {
  auto cat = v.getDefiningOp<ConcatOp>();
  if (!cat || cat.getInputs().size() != 2 ||
      cat.getDim() != cat.getType().getRank() - 1)
    return {};
  auto neg = cat.getInputs()[0].getDefiningOp<UnaryOp>();
  if (!neg || neg.getFn() != UnaryFn::neg)
    return {};
  auto hi = neg.getInput().getDefiningOp<SliceOp>();
  auto lo = cat.getInputs()[1].getDefiningOp<SliceOp>();
  if (!hi || !lo || hi.getInput() != lo.getInput())
    return {};
  Value x = lo.getInput();
  ArrayRef<int64_t> shape = tensorType(x).getShape();
  int64_t last = shape.size() - 1, half = shape[last] / 2;
  // [..., h:] and [..., :h]: whole in every other dim, unit strides.
  auto halfAt = [&](SliceOp s, int64_t offset) {
    ArrayRef<int64_t> sliced = tensorType(s.getResult()).getShape();
    for (int64_t d = 0; d <= last; ++d)
      if (s.getStrides()[d] != 1 ||
          s.getOffsets()[d] != (d == last ? offset : 0) ||
          sliced[d] != (d == last ? half : shape[d]))
        return false;
    return true;
  };
  if (shape[last] % 2 || !halfAt(hi, half) || !halfAt(lo, 0))
    return {};
  return x;
}

/// x * cos + rotate_half(x) * sin (either order of each product and of the
/// sum), all of one static type: one neuron.rotary.
struct FormRotary : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BinaryOp add,
                                PatternRewriter &rewriter) const override {
    RankedTensorType type = add.getType();
    if (add.getFn() != BinaryFn::add || !type.hasStaticShape() ||
        !isa<FloatType>(type.getElementType()) || type.getRank() < 1 ||
        type.getShape().back() > kMaxRotaryDim)
      return failure();
    // The two operands of a product of `type`, or nullopt.
    auto factors = [&](Value v) -> std::optional<std::pair<Value, Value>> {
      auto mul = v.getDefiningOp<BinaryOp>();
      if (!mul || mul.getFn() != BinaryFn::mul ||
          tensorType(mul.getLhs()) != type || tensorType(mul.getRhs()) != type)
        return std::nullopt;
      return std::pair(mul.getLhs(), mul.getRhs());
    };
    for (auto [plain, rotated] : {std::pair(add.getLhs(), add.getRhs()),
                                  std::pair(add.getRhs(), add.getLhs())}) {
      auto p = factors(plain), r = factors(rotated);
      if (!p || !r)
        continue;
      for (auto [rot, sin] : {*r, std::pair(r->second, r->first)}) {
        Value x = rotatedHalves(rot);
        if (!x)
          continue;
        Value cos = p->first == x    ? p->second
                    : p->second == x ? p->first
                                     : Value();
        if (!cos)
          continue;
        rewriter.replaceOpWithNewOp<RotaryOp>(add, type, x, cos, sin);
        return success();
      }
    }
    return failure();
  }
};
} // namespace

namespace {
/// GELU's tanh approximation written out, as GPT-2's NewGELUActivation,
/// BLOOM's and FastGELU write it (0.5 * x * (1 + tanh(sqrt(2 / pi) * (x +
/// 0.044715 * x^3))), in any arrangement): one neuron.unary gelu_tanh, a
/// single activation instead of eight instructions per tile. Recognized by
/// value: an expression of one tensor x, splat constants, add, sub, mul,
/// div, pow and one tanh, each intermediate used once, that equals GELU's
/// tanh form at points over [-6, 6] (within the rounding of its constants
/// to x's dtype: eager rounds every step to it).
struct FormGeluTanh : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;
  static constexpr int kMostOps = 16;

  /// The ops of the expression rooted at `v` (inner ones used only in it),
  /// its one tensor leaf in `x`; false if it is not such an expression.
  static bool collect(Value v, bool root, Value &x, int &ops, int &tanhs) {
    if (splat(v))
      return true;
    Operation *def = v.getDefiningOp();
    bool inner = def && (isa<BinaryOp>(def) || isa<UnaryOp>(def)) &&
                 (root || v.hasOneUse());
    if (!inner || (x && v == x)) {
      if (x && x != v)
        return false;
      x = v;
      return true;
    }
    if (++ops > kMostOps)
      return false;
    if (auto u = dyn_cast<UnaryOp>(def)) {
      if (u.getFn() == UnaryFn::tanh)
        ++tanhs;
      else if (u.getFn() != UnaryFn::neg)
        return false;
      return collect(u.getInput(), false, x, ops, tanhs);
    }
    auto b = cast<BinaryOp>(def);
    switch (b.getFn()) {
    case BinaryFn::add:
    case BinaryFn::sub:
    case BinaryFn::mul:
    case BinaryFn::div:
    case BinaryFn::pow:
      break;
    default:
      return false;
    }
    return collect(b.getLhs(), false, x, ops, tanhs) &&
           collect(b.getRhs(), false, x, ops, tanhs);
  }

  static double eval(Value v, Value x, double at) {
    if (v == x)
      return at;
    if (auto c = splat(v))
      return *c;
    if (auto u = v.getDefiningOp<UnaryOp>()) {
      double in = eval(u.getInput(), x, at);
      return u.getFn() == UnaryFn::tanh ? std::tanh(in) : -in;
    }
    auto b = v.getDefiningOp<BinaryOp>();
    double l = eval(b.getLhs(), x, at), r = eval(b.getRhs(), x, at);
    switch (b.getFn()) {
    case BinaryFn::add:
      return l + r;
    case BinaryFn::sub:
      return l - r;
    case BinaryFn::mul:
      return l * r;
    case BinaryFn::div:
      return l / r;
    default:
      return std::pow(l, r);
    }
  }

  LogicalResult matchAndRewrite(BinaryOp op,
                                PatternRewriter &rewriter) const override {
    Value x;
    int ops = 0, tanhs = 0;
    if (op.getFn() != BinaryFn::mul ||
        !collect(op.getResult(), true, x, ops, tanhs) || tanhs != 1 || !x ||
        x.getType() != op.getType() ||
        !isa<FloatType>(op.getType().getElementType()))
      return failure();
    for (int i = -24; i <= 24; ++i) {
      double at = i / 4.0;
      double want =
          0.5 * at *
          (1 + std::tanh(0.7978845608028654 * (at + 0.044715 * at * at * at)));
      if (std::abs(eval(op.getResult(), x, at) - want) >
          0.01 * std::abs(want) + 1e-3)
        return failure();
    }
    rewriter.replaceOpWithNewOp<UnaryOp>(op, op.getType(), UnaryFn::gelu_tanh,
                                         x);
    return success();
  }
};
} // namespace

namespace {
/// A chain of three or more adds, subtracts and multiplies of one tensor x
/// by broadcasts of small tensors of one shape (BatchNorm in eval as PyTorch
/// decomposes it: (x - mean) * invstd * weight + bias, per channel) ->
/// x * S + T, S and T computed on the small tensors: two passes over x's
/// elements instead of one per op (the engines had bounded BatchNorm at 63%
/// of the DMA roofline). Each link's intermediate has one use.
struct FoldAffineChain : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  /// The small tensor `v` broadcasts, if it is a broadcast of one.
  static Value smallOf(Value v) {
    auto b = v.getDefiningOp<BroadcastOp>();
    if (!b || !b.getType().hasStaticShape() ||
        tensorType(b.getInput()).getNumElements() >=
            b.getType().getNumElements())
      return {};
    return b.getInput();
  }

  LogicalResult matchAndRewrite(BinaryOp root,
                                PatternRewriter &rewriter) const override {
    auto linkOf = [](Operation *op) -> BinaryOp {
      auto b = dyn_cast_or_null<BinaryOp>(op);
      if (!b || !(b.getFn() == BinaryFn::add || b.getFn() == BinaryFn::sub ||
                  b.getFn() == BinaryFn::mul))
        return {};
      return b;
    };
    if (!linkOf(root) || !root.getType().hasStaticShape() ||
        !isa<FloatType>(root.getType().getElementType()))
      return failure();
    // Walk from the root towards x: links whose other operand is small.
    struct Link {
      BinaryOp op;
      Value small;
      bool chainOnLeft;
    };
    SmallVector<Link> links;
    Type smallType;
    Value v = root.getResult();
    while (BinaryOp op = linkOf(v.getDefiningOp())) {
      if (!links.empty() && !v.hasOneUse())
        break;
      Value lhsSmall = smallOf(op.getLhs()), rhsSmall = smallOf(op.getRhs());
      bool left = rhsSmall && !lhsSmall;
      Value small = left ? rhsSmall : lhsSmall;
      if (!small || (lhsSmall && rhsSmall) ||
          (smallType && small.getType() != smallType))
        break;
      smallType = small.getType();
      links.push_back({op, small, left});
      v = left ? op.getLhs() : op.getRhs();
    }
    // r - v (x negated) is not folded: S would need a -1 of its own.
    if (links.size() < 3 || llvm::any_of(links, [](Link l) {
          return l.op.getFn() == BinaryFn::sub && !l.chainOnLeft;
        }))
      return failure();
    // x * S + T, from x outwards; S and T null while 1 and 0.
    Location loc = root.getLoc();
    auto smallTy = cast<RankedTensorType>(smallType);
    auto bin = [&](BinaryFn fn, Value a, Value b) -> Value {
      return rewriter.create<BinaryOp>(loc, smallTy, fn, a, b);
    };
    Value scale, shift;
    for (Link link : llvm::reverse(links)) {
      Value r = link.small;
      switch (link.op.getFn()) {
      case BinaryFn::add:
        shift = shift ? bin(BinaryFn::add, shift, r) : r;
        break;
      case BinaryFn::sub: // v - r
        shift = shift ? bin(BinaryFn::sub, shift, r)
                      : rewriter.create<UnaryOp>(loc, smallTy, UnaryFn::neg, r)
                            .getResult();
        break;
      default: // mul
        scale = scale ? bin(BinaryFn::mul, scale, r) : r;
        if (shift)
          shift = bin(BinaryFn::mul, shift, r);
        break;
      }
    }
    RankedTensorType full = root.getType();
    auto spread = [&](Value small) {
      return rewriter.create<BroadcastOp>(loc, full, small).getResult();
    };
    Value y = v;
    if (scale)
      y = rewriter.create<BinaryOp>(loc, full, BinaryFn::mul, y, spread(scale));
    if (shift)
      y = rewriter.create<BinaryOp>(loc, full, BinaryFn::add, y, spread(shift));
    rewriter.replaceOp(root, y);
    return success();
  }
};
} // namespace

namespace {
/// A broadcast along interior dims whose innermost expanded dims run to the
/// end ([C, 1, 1] -> [N, C, H, W]: BatchNorm's per-channel values, a conv's
/// bias, torchvision's mean and std) -> a broadcast to the values of each
/// row ([N, C, 1, 1], small), then one along the rows. A fusion group tiles
/// the second as a [rows, 1] column; the interior one it cannot tile, and
/// a consumer would read it materialized, as large as the result.
struct SplitInteriorBroadcast : public OpRewritePattern<BroadcastOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BroadcastOp op,
                                PatternRewriter &rewriter) const override {
    auto in = tensorType(op.getInput());
    RankedTensorType out = op.getType();
    if (!in.hasStaticShape() || !out.hasStaticShape())
      return failure();
    int64_t rank = out.getRank(), shift = rank - in.getRank();
    auto expanded = [&](int64_t i) {
      int64_t inDim = i < shift ? 1 : in.getDimSize(i - shift);
      return inDim == 1 && out.getDimSize(i) != 1;
    };
    // The trailing run: dims from `first` on are expanded or of size 1.
    int64_t first = rank;
    while (first > 0 && (expanded(first - 1) || out.getDimSize(first - 1) == 1))
      --first;
    bool expandsRun = false, expandsBefore = false;
    for (int64_t i = 0; i < rank; ++i)
      (i < first ? expandsBefore : expandsRun) |= expanded(i);
    if (!expandsRun || !expandsBefore)
      return failure();
    SmallVector<int64_t> rowShape(out.getShape());
    for (int64_t i = first; i < rank; ++i)
      rowShape[i] = 1;
    Value rows = rewriter.create<BroadcastOp>(op.getLoc(), out.clone(rowShape),
                                              op.getInput());
    rewriter.replaceOpWithNewOp<BroadcastOp>(op, out, rows);
    return success();
  }
};
} // namespace

void BroadcastOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                              MLIRContext *context) {
  patterns.add<SplitInteriorBroadcast>(context);
}
/// A reduction over dims of size 1 is its input reshaped (each result is
/// the one element it reduces): the gradient of a gather of one element
/// per row sums a one-hot over its size-1 index dim, which as a reduction
/// went through a transpose and an instruction per element.
struct ReduceOfSingletons : public OpRewritePattern<ReduceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ReduceOp op,
                                PatternRewriter &rewriter) const override {
    auto in = tensorType(op.getInput());
    auto out = tensorType(op.getResult());
    if (!in.hasStaticShape() || !out.hasStaticShape() ||
        in.getElementType() != out.getElementType())
      return failure();
    ArrayRef<int64_t> shape = in.getShape();
    if (llvm::any_of(shape.take_back(op.getCount()),
                     [](int64_t d) { return d != 1; }))
      return failure();
    rewriter.replaceOpWithNewOp<ReshapeOp>(op, out, op.getInput());
    return success();
  }
};

/// A transpose that moves only dims of size 1 keeps the elements' order: a
/// reshape, which costs no data movement.
struct TransposeOfSingletons : public OpRewritePattern<TransposeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TransposeOp op,
                                PatternRewriter &rewriter) const override {
    auto in = tensorType(op.getInput());
    if (!in.hasStaticShape())
      return failure();
    int64_t last = -1;
    for (int64_t p : op.getPermutation()) {
      if (in.getDimSize(p) == 1)
        continue;
      if (p < last)
        return failure();
      last = p;
    }
    rewriter.replaceOpWithNewOp<ReshapeOp>(op, op.getType(), op.getInput());
    return success();
  }
};

void ReduceOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                           MLIRContext *context) {
  patterns.add<ReduceOfSingletons>(context);
}
void SliceOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                          MLIRContext *context) {
  patterns.add<HoistSlice>(context);
}
/// Whether v holds the same values at every index of its first dim: built
/// from broadcasts that add or expand it, constants and elementwise ops.
static bool sameAlongFirstDim(Value v, int depth = 0) {
  auto type = tensorType(v);
  if (type.getRank() == 0 || type.getDimSize(0) == 1)
    return true;
  if (depth > 32)
    return false;
  Operation *def = v.getDefiningOp();
  if (auto b = dyn_cast_or_null<BroadcastOp>(def)) {
    auto in = tensorType(b.getInput());
    if (in.getRank() < type.getRank() || in.getDimSize(0) == 1)
      return true;
    return sameAlongFirstDim(b.getInput(), depth + 1);
  }
  if (auto c = dyn_cast_or_null<ConstantOp>(def))
    if (auto attr = dyn_cast<DenseElementsAttr>(c.getValue()))
      return attr.isSplat();
  if (isa_and_nonnull<UnaryOp, CastOp, BinaryOp>(def))
    return llvm::all_of(def->getOperands(), [&](Value o) {
      return sameAlongFirstDim(o, depth + 1);
    });
  return false;
}

/// Whether v is computed from `target` (past a depth, assumed so).
static bool computedFrom(Value v, Value target, int depth = 0) {
  if (v == target)
    return true;
  Operation *def = v.getDefiningOp();
  if (!def)
    return false;
  if (depth > 32)
    return true;
  return llvm::any_of(def->getOperands(), [&](Value o) {
    return computedFrom(o, target, depth + 1);
  });
}

/// A [N, O, H, W] (or [N, O, P]: a channels-first batched matmul's) value
/// broadcast from per-channel values ([O, 1, 1] or [N, O, 1, 1] the same
/// for every image; [O, 1] or [N, O, 1]) not computed from `conv`: those
/// values; null otherwise.
static Value perChannel(Value full, Value conv) {
  auto b = full.getDefiningOp<BroadcastOp>();
  if (!b)
    return {};
  Value small = b.getInput();
  auto type = tensorType(small);
  auto convType = tensorType(conv);
  int64_t o = convType.getDimSize(1), ones = convType.getRank() - 2;
  ArrayRef<int64_t> dims = type.getShape();
  int64_t rank = dims.size();
  if (!type.hasStaticShape() || ones < 1 || rank < ones + 1 ||
      rank > ones + 2 || dims[rank - ones - 1] != o ||
      llvm::any_of(
          dims.take_back(ones), [](int64_t d) { return d != 1; }) ||
      (rank == ones + 2 && !sameAlongFirstDim(small)) ||
      computedFrom(small, conv))
    return {};
  return small;
}

/// perChannel's values (of a result of rank `rank`: [N, O] and rank - 2 ones
/// after) as [O] (the first image's), in their element type.
static Value channelValues(Value small, PatternRewriter &rewriter, Location loc,
                           int64_t rank = 4) {
  auto type = tensorType(small);
  ArrayRef<int64_t> dims = type.getShape();
  int64_t ones = rank - 2, o = dims[dims.size() - ones - 1];
  if ((int64_t)dims.size() == rank && dims[0] != 1) {
    SmallVector<int64_t> shape(rank, 1), zeros(rank, 0);
    shape[1] = o;
    small = rewriter.create<SliceOp>(
        loc, RankedTensorType::get(shape, type.getElementType()), small,
        rewriter.getDenseI64ArrayAttr(zeros),
        rewriter.getDenseI64ArrayAttr(SmallVector<int64_t>(rank, 1)));
  }
  return rewriter.create<ReshapeOp>(
      loc, RankedTensorType::get({o}, type.getElementType()), small);
}

/// channelValues in f32.
static Value asChannels(Value small, PatternRewriter &rewriter, Location loc,
                        int64_t rank = 4) {
  Value v = channelValues(small, rewriter, loc, rank);
  auto type = tensorType(v);
  if (type.getElementType().isF32())
    return v;
  return rewriter.create<CastOp>(loc, type.clone(rewriter.getF32Type()), v);
}

/// The matmul whose result `v` is, or a reshape of it (for a per-column
/// bias, one that keeps the columns: a Linear over [B, S, K] as [B * S, K]
/// rows), where the matmul's result is read only by it (what reads `v` is
/// the caller's to check).
static MatmulOp soleMatmulOf(Value v, bool keepColumns = false) {
  if (auto reshape = v.getDefiningOp<ReshapeOp>()) {
    auto in = tensorType(reshape.getInput()), out = tensorType(v);
    if (!in.hasStaticShape() || !out.hasStaticShape() || in.getRank() < 1 ||
        out.getRank() < 1 ||
        (keepColumns && in.getShape().back() != out.getShape().back()))
      return {};
    v = reshape.getInput();
    if (!v.hasOneUse())
      return {};
  }
  return v.getDefiningOp<MatmulOp>();
}

/// A neuron.matmul's epilogue: its operands and attributes after the sums.
struct MatmulEpilogue {
  Value bias, rowScale, rowShift;
  UnaryFnAttr act;
  FloatAttr clampMax;

  static MatmulEpilogue of(MatmulOp mm) {
    return {mm.getBias(), mm.getRowScale(), mm.getRowShift(),
            mm.getEpilogueAttr(), mm.getClampMaxAttr()};
  }
  bool empty() const {
    return !bias && !rowScale && !rowShift && !act && !clampMax;
  }
};

/// `mm` rebuilt with epilogue `ep` (at `at`, where its values dominate),
/// seen in `type` (a reshape of it when that is another shape).
static Value rebuildMatmul(PatternRewriter &rewriter, Operation *at,
                           MatmulOp mm, const MatmulEpilogue &ep, Type type) {
  rewriter.setInsertionPoint(at);
  Value out = rewriter.create<MatmulOp>(mm.getLoc(), mm.getType(), mm.getLhs(),
                                        mm.getRhs(), ep.bias, ep.rowScale,
                                        ep.rowShift, ep.act, ep.clampMax);
  if (out.getType() != type)
    out = rewriter.create<ReshapeOp>(at->getLoc(), type, out);
  return out;
}

/// A convolution's result times per-channel values plus per-channel values
/// (a BatchNorm in eval mode, as canonicalization leaves it: x * S + T, x
/// the result or its widening cast, then cast back), or plus them alone,
/// read nowhere else: the convolution with that scale and bias (bias' = T +
/// bias * S), applied to its sums as they leave PSUM in fp32, rounded once.
/// A pointwise convolution written as a channels-first batched matmul takes
/// them as its row scale and shift (composing with those it has).
struct FoldConvAffine : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BinaryOp add,
                                PatternRewriter &rewriter) const override {
    if (add.getFn() != BinaryFn::add || !add->hasOneUse())
      return failure();
    for (auto [prod, shiftFull] : {std::pair(add.getLhs(), add.getRhs()),
                                   std::pair(add.getRhs(), add.getLhs())}) {
      // x * S, or x alone (S none).
      SmallVector<std::pair<Value, Value>, 2> factors{{prod, Value()}};
      if (auto mul = prod.getDefiningOp<BinaryOp>();
          mul && mul.getFn() == BinaryFn::mul && mul->hasOneUse())
        factors = {{mul.getLhs(), mul.getRhs()}, {mul.getRhs(), mul.getLhs()}};
      for (auto [v, scaleFull] : factors) {
        if (succeeded(fold(add, v, scaleFull, shiftFull, rewriter)))
          return success();
      }
    }
    return failure();
  }

  /// A pointwise convolution as the importer writes it, [O, C] weights
  /// times each image's [C, H * W] (a batched matmul, channels-first out),
  /// or its result reshaped to [N, O, H, W]: the matmul, whose rows are the
  /// channels.
  static MatmulOp channelsFirstMatmulOf(Value y) {
    MatmulOp mm = soleMatmulOf(y);
    // No epilogue yet, or a row affine alone (a second one composes).
    if (!mm || mm.getBias() || mm.getEpilogue() || mm.getClampMax())
      return {};
    auto out = mm.getType(), in = tensorType(y);
    if (out.getRank() != 3 || (in.getRank() != 4 && in != out) ||
        !in.hasStaticShape() || in.getDimSize(0) != out.getDimSize(0) ||
        in.getDimSize(1) != out.getDimSize(1))
      return {};
    return mm;
  }

  LogicalResult fold(BinaryOp add, Value v, Value scaleFull, Value shiftFull,
                     PatternRewriter &rewriter) const {
    auto widen = v.getDefiningOp<CastOp>();
    Value y = widen ? widen.getInput() : v;
    auto conv = y.getDefiningOp<Conv2dOp>();
    MatmulOp mm = conv ? MatmulOp() : channelsFirstMatmulOf(y);
    if ((!conv && !mm) ||
        (conv && (conv.getRelu() || (scaleFull && conv.getScale()))) ||
        !y.hasOneUse() || (widen && !v.hasOneUse()))
      return failure();
    // The sum back at the result's type: it, or its one cast.
    Operation *replaced = add;
    if (add.getType() != tensorType(y)) {
      auto narrow = dyn_cast<CastOp>(*add->getUsers().begin());
      if (!narrow || narrow.getType() != tensorType(y))
        return failure();
      replaced = narrow;
    }
    Value scaleSmall = scaleFull ? perChannel(scaleFull, y) : Value();
    Value shiftSmall = perChannel(shiftFull, y);
    if ((scaleFull && !scaleSmall) || !shiftSmall)
      return failure();
    Location loc = add.getLoc();
    rewriter.setInsertionPoint(replaced);
    if (mm) {
      // (x * S0 + T0) * S + T: x * (S0 * S) + (T0 * S + T).
      MatmulEpilogue ep = MatmulEpilogue::of(mm);
      auto f32 = RankedTensorType::get({tensorType(y).getDimSize(1)},
                                       rewriter.getF32Type());
      auto mul = [&](Value a, Value b) -> Value {
        if (!a || !b)
          return a ? a : b;
        return rewriter.create<BinaryOp>(loc, f32, BinaryFn::mul, a, b);
      };
      int64_t rank = tensorType(y).getRank();
      Value scale =
          scaleSmall ? asChannels(scaleSmall, rewriter, loc, rank) : Value();
      Value shift = asChannels(shiftSmall, rewriter, loc, rank);
      if (ep.rowShift)
        shift = rewriter.create<BinaryOp>(loc, f32, BinaryFn::add,
                                          mul(ep.rowShift, scale), shift);
      ep.rowScale = mul(ep.rowScale, scale);
      ep.rowShift = shift;
      rewriter.replaceOp(
          replaced, rebuildMatmul(rewriter, replaced, mm, ep, tensorType(y)));
      return success();
    }
    Value scale =
        scaleSmall ? asChannels(scaleSmall, rewriter, loc) : conv.getScale();
    Value shift = asChannels(shiftSmall, rewriter, loc);
    if (Value bias = conv.getBias()) {
      auto f32 = RankedTensorType::get(tensorType(bias).getShape(),
                                       rewriter.getF32Type());
      Value b32 = bias;
      if (tensorType(bias) != f32)
        b32 = rewriter.create<CastOp>(loc, f32, bias);
      if (scaleSmall)
        b32 = rewriter.create<BinaryOp>(loc, f32, BinaryFn::mul, b32, scale);
      shift = rewriter.create<BinaryOp>(loc, f32, BinaryFn::add, b32, shift);
    }
    auto fused = rewriter.create<Conv2dOp>(
        conv.getLoc(), conv.getType(), conv.getInput(), conv.getWeight(), shift,
        scale, conv.getStrideAttr(), conv.getPaddingAttr(),
        conv.getDilationAttr(), conv.getDepthwiseAttr(), UnitAttr());
    rewriter.replaceOp(replaced, fused.getResult());
    return success();
  }
};

/// max(0, .) of a convolution's result read nowhere else: the convolution
/// with relu, applied as its sums leave PSUM.
struct FoldConvRelu : public OpRewritePattern<UnaryOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(UnaryOp relu,
                                PatternRewriter &rewriter) const override {
    auto conv = relu.getInput().getDefiningOp<Conv2dOp>();
    if (relu.getFn() != UnaryFn::relu || !conv || conv.getRelu() ||
        !relu.getInput().hasOneUse() || relu.getType() != conv.getType())
      return failure();
    rewriter.setInsertionPoint(relu);
    auto fused = rewriter.create<Conv2dOp>(
        conv.getLoc(), conv.getType(), conv.getInput(), conv.getWeight(),
        conv.getBias(), conv.getScale(), conv.getStrideAttr(),
        conv.getPaddingAttr(), conv.getDilationAttr(), conv.getDepthwiseAttr(),
        rewriter.getUnitAttr());
    rewriter.replaceOp(relu, fused.getResult());
    return success();
  }
};

/// A matmul's sums plus a bias per column (a Linear's, broadcast along the
/// rows), where nothing else reads the sums: the matmul with that bias,
/// added to the fp32 sums as they leave PSUM and rounded once (a pass of
/// its own over the result, twice its bytes, otherwise).
struct FoldMatmulBias : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BinaryOp add,
                                PatternRewriter &rewriter) const override {
    if (add.getFn() != BinaryFn::add)
      return failure();
    for (auto [v, full] : {std::pair(add.getLhs(), add.getRhs()),
                           std::pair(add.getRhs(), add.getLhs())}) {
      MatmulOp mm = v.hasOneUse() ? soleMatmulOf(v, true) : MatmulOp();
      auto b = full.getDefiningOp<BroadcastOp>();
      if (!mm || !MatmulEpilogue::of(mm).empty() || !b ||
          add.getType() != tensorType(v))
        continue;
      // The bias: [N], or [1, ..., 1, N].
      Value bias = b.getInput();
      auto type = tensorType(bias);
      int64_t n = mm.getType().getShape().back();
      if (!type.hasStaticShape() || type.getRank() < 1 ||
          type.getShape().back() != n || type.getNumElements() != n ||
          !isa<FloatType>(type.getElementType()))
        continue;
      if (type.getRank() != 1) {
        rewriter.setInsertionPoint(add);
        bias = rewriter.create<ReshapeOp>(
            add.getLoc(), RankedTensorType::get({n}, type.getElementType()),
            bias);
      }
      MatmulEpilogue ep;
      ep.bias = bias;
      rewriter.replaceOp(add,
                         rebuildMatmul(rewriter, add, mm, ep, add.getType()));
      return success();
    }
    return failure();
  }
};

/// An activation of a matmul's sums (after its bias, if folded in), where
/// nothing else reads them: the matmul with that epilogue, ScalarE applying
/// it to the fp32 sums as they leave PSUM (the activation after a Linear:
/// BERT's and GPT-2's GELU, a ReLU), rounded once.
struct FoldMatmulActivation : public OpRewritePattern<UnaryOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(UnaryOp act,
                                PatternRewriter &rewriter) const override {
    if (!isMatmulEpilogue(act.getFn()))
      return failure();
    Value v = act.getInput();
    MatmulOp mm = v.hasOneUse() ? soleMatmulOf(v) : MatmulOp();
    if (!mm || mm.getEpilogue() || mm.getClampMax() ||
        act.getType() != tensorType(v))
      return failure();
    MatmulEpilogue ep = MatmulEpilogue::of(mm);
    ep.act = UnaryFnAttr::get(act.getContext(), act.getFn());
    rewriter.replaceOp(act,
                       rebuildMatmul(rewriter, act, mm, ep, act.getType()));
    return success();
  }
};

/// SiLU as the importer writes it: `mul` = v * sigmoid(v), v a value y or
/// its widening cast (the product then cast back to y's type), where the
/// sigmoid and v are read only by the product (and y only by a cast v).
struct Silu {
  Value y;
  /// What SiLU(y) replaces: the product, or its cast back.
  Operation *replaced;
};
static std::optional<Silu> siluOf(BinaryOp mul) {
  if (mul.getFn() != BinaryFn::mul)
    return std::nullopt;
  for (auto [v, s] : {std::pair(mul.getLhs(), mul.getRhs()),
                      std::pair(mul.getRhs(), mul.getLhs())}) {
    auto sigmoid = s.getDefiningOp<UnaryOp>();
    if (!sigmoid || sigmoid.getFn() != UnaryFn::sigmoid ||
        sigmoid.getInput() != v || !sigmoid->hasOneUse() ||
        !llvm::all_of(v.getUsers(),
                      [&](Operation *u) { return u == sigmoid || u == mul; }))
      continue;
    auto widen = v.getDefiningOp<CastOp>();
    Value y = widen ? widen.getInput() : v;
    if (widen && !y.hasOneUse())
      continue;
    Operation *replaced = mul;
    if (mul.getType() != tensorType(y)) {
      auto narrow = mul->hasOneUse()
                        ? dyn_cast<CastOp>(*mul->getUsers().begin())
                        : CastOp();
      if (!narrow || narrow.getType() != tensorType(y))
        continue;
      replaced = narrow;
    }
    return Silu{y, replaced};
  }
  return std::nullopt;
}

/// SiLU of a matmul's sums, read nowhere else: the matmul with a silu
/// epilogue.
struct FoldMatmulSilu : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BinaryOp mul,
                                PatternRewriter &rewriter) const override {
    std::optional<Silu> silu = siluOf(mul);
    MatmulOp mm = silu ? soleMatmulOf(silu->y) : MatmulOp();
    if (!mm || mm.getEpilogue() || mm.getClampMax())
      return failure();
    MatmulEpilogue ep = MatmulEpilogue::of(mm);
    ep.act = UnaryFnAttr::get(mul.getContext(), UnaryFn::silu);
    rewriter.replaceOp(
        silu->replaced,
        rebuildMatmul(rewriter, silu->replaced, mm, ep, tensorType(silu->y)));
    return success();
  }
};

void UnaryOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                          MLIRContext *context) {
  patterns.add<SinkTranspose<UnaryOp>, FoldConvRelu, FoldMatmulActivation>(
      context);
}
/// SiLU of a group norm's result, v * sigmoid(v) with v the result or its
/// widening cast (then cast back), where nothing else reads them: the group
/// norm with `silu` (its ScalarE pass computes it at no cost, where it was an
/// elementwise pass of its own over the result).
struct FoldGroupNormSilu : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BinaryOp mul,
                                PatternRewriter &rewriter) const override {
    std::optional<Silu> silu = siluOf(mul);
    auto norm = silu ? silu->y.getDefiningOp<GroupNormOp>() : GroupNormOp();
    if (!norm || norm.getSilu() || silu->y != norm.getResult())
      return failure();
    rewriter.setInsertionPoint(norm);
    auto fused = rewriter.create<GroupNormOp>(
        norm.getLoc(), norm->getResultTypes(), norm.getInput(),
        norm.getWeight(), norm.getBias(), norm.getGroupsAttr(),
        norm.getEpsAttr(), rewriter.getUnitAttr());
    rewriter.replaceOp(silu->replaced, fused.getResult());
    rewriter.replaceAllUsesWith(norm.getMean(), fused.getMean());
    rewriter.replaceAllUsesWith(norm.getRstd(), fused.getRstd());
    return success();
  }
};

/// The channels-first LayerNorm as ConvNeXt's reference code (and
/// Transformers' ConvNextLayerNorm, SAM's) writes it: u = x.mean(1,
/// keepdim=True), s = (x - u).pow(2).mean(1, keepdim=True), then
/// (x - u) / sqrt(s + eps), or times rsqrt(s + eps): one neuron.channel_norm
/// of x, or of the source of x's widening cast where the result is only cast
/// back to it. Decomposed, each mean over dim 1 read a transposed copy of x
/// through HBM (15x the bytes).
struct FormChannelNorm : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  /// The x of a mean over dim 1 as the importer writes it: the sum over the
  /// last dim of x transposed to [N, ..., C], reshaped to [N, 1, ...], times
  /// 1 / C.
  static Value meanOver(Value m) {
    auto mul = m.getDefiningOp<BinaryOp>();
    if (!mul || mul.getFn() != BinaryFn::mul)
      return {};
    for (auto [r, c] : {std::pair(mul.getLhs(), mul.getRhs()),
                        std::pair(mul.getRhs(), mul.getLhs())}) {
      auto reshape = r.getDefiningOp<ReshapeOp>();
      auto reduce =
          reshape ? reshape.getInput().getDefiningOp<ReduceOp>() : ReduceOp();
      auto t = reduce ? reduce.getInput().getDefiningOp<TransposeOp>()
                      : TransposeOp();
      std::optional<double> factor = splat(c);
      if (!t || reduce.getFn() != ReduceFn::sum || reduce.getCount() != 1 ||
          !factor)
        continue;
      ArrayRef<int64_t> perm = t.getPermutation();
      int64_t rank = perm.size();
      bool channelsLast = rank >= 3 && perm[0] == 0 && perm[rank - 1] == 1;
      for (int64_t i = 1; channelsLast && i + 1 < rank; ++i)
        channelsLast = perm[i] == i + 1;
      Value x = t.getInput();
      auto type = tensorType(x);
      if (!channelsLast || !type.hasStaticShape())
        continue;
      SmallVector<int64_t> kept(type.getShape());
      kept[1] = 1;
      if (tensorType(m).getShape() != ArrayRef<int64_t>(kept) ||
          std::abs(*factor * double(type.getDimSize(1)) - 1.0) > 1e-6)
        continue;
      return x;
    }
    return {};
  }

  /// x - u with u a mean of x over dim 1 (broadcast back): its u.
  static Value deviationMean(Value d, Value x) {
    auto sub = d.getDefiningOp<BinaryOp>();
    auto b = sub && sub.getFn() == BinaryFn::sub && sub.getLhs() == x
                 ? sub.getRhs().getDefiningOp<BroadcastOp>()
                 : BroadcastOp();
    if (!b || meanOver(b.getInput()) != x)
      return {};
    return b.getInput();
  }

  /// s + eps with s the mean over dim 1 of (x - u)^2: its eps.
  static std::optional<double> varianceEps(Value v, Value x) {
    auto add = v.getDefiningOp<BinaryOp>();
    if (!add || add.getFn() != BinaryFn::add)
      return std::nullopt;
    for (auto [s, e] : {std::pair(add.getLhs(), add.getRhs()),
                        std::pair(add.getRhs(), add.getLhs())}) {
      std::optional<double> eps = splat(e);
      Value sq = meanOver(s);
      auto square = sq ? sq.getDefiningOp<BinaryOp>() : BinaryOp();
      if (eps && square && square.getFn() == BinaryFn::mul &&
          square.getLhs() == square.getRhs() &&
          deviationMean(square.getLhs(), x))
        return eps;
    }
    return std::nullopt;
  }

  LogicalResult matchAndRewrite(BinaryOp root,
                                PatternRewriter &rewriter) const override {
    bool divides = root.getFn() == BinaryFn::div;
    if (!divides && root.getFn() != BinaryFn::mul)
      return failure();
    for (auto [d, scaleFull] : {std::pair(root.getLhs(), root.getRhs()),
                                std::pair(root.getRhs(), root.getLhs())}) {
      if (divides && d != root.getLhs())
        break;
      auto sub = d.getDefiningOp<BinaryOp>();
      Value x = sub ? sub.getLhs() : Value();
      auto b = scaleFull.getDefiningOp<BroadcastOp>();
      auto root2 = b ? b.getInput().getDefiningOp<UnaryOp>() : UnaryOp();
      if (!x || !deviationMean(d, x) || !root2 ||
          root2.getFn() != (divides ? UnaryFn::sqrt : UnaryFn::rsqrt))
        continue;
      std::optional<double> eps = varianceEps(root2.getInput(), x);
      auto type = tensorType(x);
      if (!eps || type.getRank() < 3 || type.getDimSize(1) < 2 ||
          type.getDimSize(1) > kChannelNormMaxChannels ||
          root.getType() != type)
        continue;
      // Of x's narrower source where the result is only cast back to it.
      Operation *replaced = root;
      auto widen = x.getDefiningOp<CastOp>();
      if (widen && root->hasOneUse())
        if (auto narrow = dyn_cast<CastOp>(*root->getUsers().begin());
            narrow && narrow.getType() == tensorType(widen.getInput()) &&
            isa<FloatType>(narrow.getType().getElementType())) {
          x = widen.getInput();
          replaced = narrow;
        }
      auto in = tensorType(x);
      SmallVector<int64_t> statsShape(in.getShape());
      statsShape[1] = 1;
      auto stats = RankedTensorType::get(statsShape, rewriter.getF32Type());
      rewriter.setInsertionPoint(replaced);
      auto norm = rewriter.create<ChannelNormOp>(
          root.getLoc(), TypeRange{in, stats, stats}, x, Value(), Value(),
          rewriter.getF64FloatAttr(*eps));
      rewriter.replaceOp(replaced, norm.getResult());
      return success();
    }
    return failure();
  }
};

/// A channel norm's result times per-channel values, then plus per-channel
/// values (or not), read nowhere else: the norm with that weight (and
/// bias), applied in fp32 and rounded once (Transformers' channels-first
/// LayerNorm applies weight[:, None, None] and bias[:, None, None] after the
/// norm: a pass over the result of its own).
struct FoldChannelNormAffine : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  /// perChannel's values as [C] of the norm's dtype.
  LogicalResult matchAndRewrite(BinaryOp mul,
                                PatternRewriter &rewriter) const override {
    if (mul.getFn() != BinaryFn::mul)
      return failure();
    for (auto [y, full] : {std::pair(mul.getLhs(), mul.getRhs()),
                           std::pair(mul.getRhs(), mul.getLhs())}) {
      auto norm = y.getDefiningOp<ChannelNormOp>();
      if (!norm || y != norm.getResult() || !y.hasOneUse() ||
          norm.getWeight() || norm.getBias() || !norm.getMean().use_empty() ||
          !norm.getRstd().use_empty() || tensorType(y).getRank() != 4 ||
          mul.getType() != tensorType(y))
        continue;
      Type elt = tensorType(y).getElementType();
      Value weight = perChannel(full, y);
      if (!weight || tensorType(weight).getElementType() != elt)
        continue;
      Operation *replaced = mul;
      Value bias;
      if (mul->hasOneUse())
        if (auto add = dyn_cast<BinaryOp>(*mul->getUsers().begin());
            add && add.getFn() == BinaryFn::add &&
            add.getType() == mul.getType())
          for (Value other : {add.getLhs(), add.getRhs()})
            if (other != mul.getResult())
              if (Value b = perChannel(other, y);
                  b && tensorType(b).getElementType() == elt) {
                bias = b;
                replaced = add;
              }
      rewriter.setInsertionPoint(replaced);
      Location loc = norm.getLoc();
      auto fused = rewriter.create<ChannelNormOp>(
          loc, norm->getResultTypes(), norm.getInput(),
          channelValues(weight, rewriter, loc),
          bias ? channelValues(bias, rewriter, loc) : Value(),
          norm.getEpsAttr());
      rewriter.replaceOp(replaced, fused.getResult());
      return success();
    }
    return failure();
  }
};

/// max(y, 0), then min(., c), of a matmul's sums read nowhere else (clamp's
/// decomposition: a MobileNet's ReLU6): relu, then clamp_max, in the
/// matmul's epilogue.
struct FoldMatmulClamp : public OpRewritePattern<BinaryOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BinaryOp op,
                                PatternRewriter &rewriter) const override {
    bool isMax = op.getFn() == BinaryFn::max;
    if (!isMax && op.getFn() != BinaryFn::min)
      return failure();
    for (auto [v, c] : {std::pair(op.getLhs(), op.getRhs()),
                        std::pair(op.getRhs(), op.getLhs())}) {
      std::optional<double> bound = splat(c);
      MatmulOp mm = bound && v.hasOneUse() ? soleMatmulOf(v) : MatmulOp();
      if (!mm || op.getType() != tensorType(v) || mm.getClampMax())
        continue;
      MatmulEpilogue ep = MatmulEpilogue::of(mm);
      if (isMax) {
        if (*bound != 0.0 || ep.act)
          continue;
        ep.act = UnaryFnAttr::get(op.getContext(), UnaryFn::relu);
      } else {
        ep.clampMax = rewriter.getF64FloatAttr(*bound);
      }
      rewriter.replaceOp(op, rebuildMatmul(rewriter, op, mm, ep, op.getType()));
      return success();
    }
    return failure();
  }
};

/// Linears over the channels of channels-first images, as ConvNeXt's block
/// writes its MLP (torchvision, Transformers, timm): permute [N, C, H, W] to
/// channels-last, Linear (and activation), Linear (then, in Transformers',
/// a per-channel layer scale), permute back. Each Linear there is a
/// pointwise convolution: [O, C] weights times each image's [C, H * W], a
/// channels-first batched matmul whose rows are the output channels, its
/// bias the row shift and the layer scale the row scale. The chain then
/// reads and writes channels-first tensors: no transpose is materialized
/// (the last Linear's output was transposed back in a pass of its own).
/// Rooted at the permute back; the values between are read nowhere else.
struct ChannelsFirstLinears : public OpRewritePattern<TransposeOp> {
  using OpRewritePattern::OpRewritePattern;

  /// An image's positions, the channels-first matmuls' columns, below which
  /// the channels-last form is kept: with fewer than a matmul's moving tile
  /// (512 columns) TensorE waits on loading the weights as its stationary
  /// operand, once per image (ConvNeXt-T's 7 x 7 stage: 128.6 -> 202.9 us a
  /// block at batch 2; its 56 x 56 stage 306.2 -> 241.9 us).
  static constexpr int64_t kMinPositions = 512;

  /// A step of the chain, last first: a Linear (`mm`), or an elementwise
  /// unary op between two (`unary`).
  struct Step {
    MatmulOp mm;
    UnaryOp unary;
  };

  /// `v` as the sole reader of a value sees it, looking through reshapes.
  static Value throughReshapes(Value v) {
    while (auto r = v.getDefiningOp<ReshapeOp>()) {
      if (!r.getInput().hasOneUse())
        break;
      v = r.getInput();
    }
    return v;
  }

  /// The channels-first [N, C, H, W] tensor whose channels-last rows `lhs`
  /// is ([N * H * W, C], by a reshape of its [0, 2, 3, 1] transpose).
  static Value channelsFirstSource(Value lhs) {
    auto r = lhs.getDefiningOp<ReshapeOp>();
    auto t = r ? r.getInput().getDefiningOp<TransposeOp>() : TransposeOp();
    if (!t || t.getPermutation() != ArrayRef<int64_t>{0, 2, 3, 1} ||
        !r.getInput().hasOneUse())
      return {};
    auto x = tensorType(t.getInput());
    auto rows = tensorType(lhs);
    if (!x.hasStaticShape() || rows.getRank() != 2 ||
        rows.getDimSize(1) != x.getDimSize(1))
      return {};
    return t.getInput();
  }

  LogicalResult matchAndRewrite(TransposeOp back,
                                PatternRewriter &rewriter) const override {
    auto outType = back.getType();
    if (back.getPermutation() != ArrayRef<int64_t>{0, 3, 1, 2} ||
        !outType.hasStaticShape())
      return failure();
    // An optional per-channel scale of the last Linear's result.
    Value v = back.getInput();
    Value scale;
    if (auto mul = v.getDefiningOp<BinaryOp>();
        mul && mul.getFn() == BinaryFn::mul && mul->hasOneUse()) {
      for (auto [y, full] : {std::pair(mul.getLhs(), mul.getRhs()),
                             std::pair(mul.getRhs(), mul.getLhs())}) {
        auto b = full.getDefiningOp<BroadcastOp>();
        auto small = b ? tensorType(b.getInput()) : RankedTensorType();
        if (b && small.hasStaticShape() &&
            small.getNumElements() == outType.getDimSize(1) &&
            small.getShape().back() == outType.getDimSize(1) &&
            isa<FloatType>(small.getElementType()) && y.hasOneUse()) {
          scale = b.getInput();
          v = y;
          break;
        }
      }
      if (!scale)
        return failure();
    }
    SmallVector<Step> chain;
    Value x;
    for (v = throughReshapes(v); !x;) {
      if (auto unary = v.getDefiningOp<UnaryOp>();
          unary && unary.getInput().hasOneUse()) {
        // A layer scale applies after the last Linear's epilogue.
        if (scale && chain.empty())
          return failure();
        chain.push_back({MatmulOp(), unary});
        v = throughReshapes(unary.getInput());
        continue;
      }
      auto mm = v.getDefiningOp<MatmulOp>();
      if (!mm || !v.hasOneUse() || mm.getType().getRank() != 2 ||
          tensorType(mm.getRhs()).getRank() != 2 || mm.getRowScale() ||
          mm.getRowShift() || !mm.getType().hasStaticShape() ||
          (scale && chain.empty() && (mm.getEpilogue() || mm.getClampMax())))
        return failure();
      chain.push_back({mm, UnaryOp()});
      x = channelsFirstSource(mm.getLhs());
      if (!x)
        v = throughReshapes(mm.getLhs());
    }
    auto xType = tensorType(x);
    int64_t n = xType.getDimSize(0), h = xType.getDimSize(2),
            w = xType.getDimSize(3);
    Operation *last = chain.front().mm ? chain.front().mm.getOperation()
                                       : chain.front().unary.getOperation();
    if (outType.getDimSize(0) != n || outType.getDimSize(2) != h ||
        outType.getDimSize(3) != w || h * w < kMinPositions ||
        tensorType(last->getResult(0)).getElementType() !=
            outType.getElementType())
      return failure();
    Location loc = back.getLoc();
    rewriter.setInsertionPoint(back);
    auto f32 = rewriter.getF32Type();
    // A bias ([O]) or layer scale ([..., O]): values per channel of a [rows,
    // O] result.
    auto toF32 = [&](Value t) { return asChannels(t, rewriter, loc, 2); };
    // Each image's [C, H * W], through the chain.
    Value cur = rewriter.create<ReshapeOp>(
        loc,
        RankedTensorType::get({n, xType.getDimSize(1), h * w},
                              xType.getElementType()),
        x);
    for (auto [i, step] : llvm::enumerate(llvm::reverse(chain))) {
      auto curType = tensorType(cur);
      if (step.unary) {
        cur = rewriter.create<UnaryOp>(
            loc, curType.clone(tensorType(step.unary).getElementType()),
            step.unary.getFn(), cur);
        continue;
      }
      MatmulOp mm = step.mm;
      Value weights = mm.getRhs(); // [C, O]
      auto wType = tensorType(weights);
      int64_t c = wType.getDimSize(0), o = wType.getDimSize(1);
      weights = rewriter.create<TransposeOp>(
          loc, RankedTensorType::get({o, c}, wType.getElementType()), weights,
          rewriter.getDenseI64ArrayAttr({1, 0}));
      weights = rewriter.create<BroadcastOp>(
          loc, RankedTensorType::get({n, o, c}, wType.getElementType()),
          weights);
      MatmulEpilogue ep;
      ep.act = mm.getEpilogueAttr();
      ep.clampMax = mm.getClampMaxAttr();
      if (mm.getBias())
        ep.rowShift = toF32(mm.getBias());
      if (scale && i + 1 == chain.size()) {
        ep.rowScale = toF32(scale);
        if (ep.rowShift)
          ep.rowShift = rewriter.create<BinaryOp>(
              loc, RankedTensorType::get({o}, f32), BinaryFn::mul, ep.rowShift,
              ep.rowScale);
      }
      cur = rewriter.create<MatmulOp>(
          mm.getLoc(),
          RankedTensorType::get({n, o, h * w}, mm.getType().getElementType()),
          weights, cur, Value(), ep.rowScale, ep.rowShift, ep.act, ep.clampMax);
    }
    rewriter.replaceOpWithNewOp<ReshapeOp>(back, outType, cur);
    return success();
  }
};

void TransposeOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                              MLIRContext *context) {
  patterns.add<TransposeOfSingletons, ChannelsFirstLinears>(context);
}

void BinaryOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                           MLIRContext *context) {
  patterns.add<SinkTranspose<BinaryOp>, FormRotary, FormGeluTanh,
               FoldAffineChain, FoldGroupNormSilu, FoldConvAffine,
               FormChannelNorm, FoldChannelNormAffine, FoldMatmulBias,
               FoldMatmulSilu, FoldMatmulClamp>(context);
}
void CastOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                         MLIRContext *context) {
  patterns.add<SinkTranspose<CastOp>>(context);
}
