//===- LowerToNisa.cpp - tile `neuron` ops into engine instructions -------===//
//
// Every tensor lives in an HBM buffer in row-major order, or is a strided
// window of another's (layout ops move no data until a consumer needs it
// contiguous). Each op, or fused group of ops, becomes loops over tiles:
// DMA loads into SBUF running ahead of the compute over rotating buffer
// slots, engine instructions, DMA stores. GEMMs keep A^T panels resident,
// stream B and accumulate in PSUM. Tiles are scoped to the op that
// allocates them; nisa-allocate gives them addresses afterwards.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/STLExtras.h"

#include <numeric>

namespace mlir::neuron {
#define GEN_PASS_DEF_NEURONLOWERTONISA
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

using namespace mlir;
using namespace mlir::neuron;

namespace mlir::neuron {

static bool hasDynamicDims(Type t) {
  auto shaped = dyn_cast<ShapedType>(t);
  return shaped && !shaped.hasStaticShape();
}

/// Whether `w` holds static `tensor` row-major from the first element of
/// `buffer` (or of the kernel argument `buffer` seen in another shape).
static bool isRowMajorIn(const TileBuilder::Window &w, Value tensor,
                         Value buffer) {
  if (unreshaped(w.buffer) != buffer || w.offset != 0 || w.hasDynamicStrides())
    return false;
  auto shape = tensorType(tensor).getShape();
  SmallVector<int64_t> rowMajor = contiguousStrides(shape);
  for (auto [d, size] : llvm::enumerate(shape))
    if (size != 1 && w.strides[d] != rowMajor[d])
      return false;
  return true;
}

/// The driver: each op, in program order, to the pattern of its family.
LogicalResult KernelLowering::lower(Operation *op) {
  b.setLoc(op->getLoc());
  if (llvm::any_of(op->getOperandTypes(), hasDynamicDims) ||
      llvm::any_of(op->getResultTypes(), hasDynamicDims)) {
    // A splat broadcast to dynamic sizes has no buffer: its users take the
    // splat as an immediate.
    if (isa<BroadcastOp>(op) && splatValueOf(op->getResult(0)))
      return success();
    for (const std::unique_ptr<TilePattern> &pattern : patterns)
      if (pattern->matches(op) && pattern->isSizeGeneric(op))
        return pattern->lower(op, *this);
    InFlightDiagnostic diag = emitError(op->getLoc())
                              << "not size-generic: " << op->getName()
                              << " on dynamic sizes (";
    llvm::interleaveComma(op->getResultTypes(), diag);
    return diag << ")";
  }
  // An empty result needs a buffer but no instructions.
  if (op->getNumResults() == 1 && !isa<ConstantOp, ReshapeOp>(op) &&
      tensorType(op->getResult(0)).getNumElements() == 0) {
    resultBuffer(op->getResult(0));
    return success();
  }
  for (const std::unique_ptr<TilePattern> &pattern : patterns)
    if (pattern->matches(op))
      return pattern->lower(op, *this);
  return op->emitOpError("has no lowering to nisa");
}

LogicalResult KernelLowering::lowerFunction(func::FuncOp func) {
  FunctionType fnType = func.getFunctionType();
  // Kernel arguments: the tensor inputs, the outputs, then the size
  // parameters of a size-generic function (index arguments, last).
  SmallVector<Type> argTypes;
  SmallVector<DictionaryAttr> argAttrs;
  SmallVector<unsigned> sizeArgs;
  unsigned numInputs = 0;
  for (auto [i, t] : llvm::enumerate(fnType.getInputs())) {
    if (t.isIndex() && func.getArgAttr(i, kSizeAttrName)) {
      sizeArgs.push_back(i);
      continue;
    }
    if (!sizeArgs.empty())
      return func.emitOpError("size arguments must follow the tensors");
    ++numInputs;
  }
  for (Type t : llvm::concat<const Type>(
           fnType.getInputs().take_front(numInputs), fnType.getResults())) {
    auto tensor = dyn_cast<RankedTensorType>(t);
    if (!tensor)
      return func.emitOpError("kernel arguments and results must be ranked "
                              "tensors, got ")
             << t;
    argTypes.push_back(hbmType(tensor));
  }
  for (unsigned i = 0; i < numInputs; ++i)
    argAttrs.push_back(func.getArgAttrDict(i));
  for (unsigned i = 0; i < fnType.getNumResults(); ++i)
    argAttrs.push_back(func.getResultAttrDict(i));
  for (unsigned i : sizeArgs) {
    argTypes.push_back(b.getIndexType());
    argAttrs.push_back(func.getArgAttrDict(i));
  }
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(func);
  b.setLoc(func.getLoc());
  auto kernel =
      b.create<func::FuncOp>(func.getName(), b.getFunctionType(argTypes, {}));
  kernel->setAttr("nisa.kernel", b.getUnitAttr());
  kernel->setAttr("nisa.num_inputs", b.getI64IntegerAttr(numInputs));
  for (auto [i, attrs] : llvm::enumerate(argAttrs))
    if (attrs)
      kernel.setArgAttrs(i, attrs);
  Block *entry = kernel.addEntryBlock();
  setEntry(entry);
  b.setInsertionPointToStart(entry);

  Block &body = func.getBody().front();
  for (unsigned i = 0; i < numInputs; ++i)
    bind(body.getArgument(i), entry->getArgument(i));
  unsigned firstSize = numInputs + fnType.getNumResults();
  for (auto [k, i] : llvm::enumerate(sizeArgs))
    body.getArgument(i).replaceAllUsesWith(entry->getArgument(firstSize + k));

  // Results computed by an op are written straight into their output buffer.
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Operation *def = v.getDefiningOp();
    if (def && !isa<ConstantOp, ReshapeOp>(def) && !hasDestination(v))
      setDestination(v, entry->getArgument(numInputs + i));
  }
  // So are those a returned reshape reads (a Linear's [B * L, N] product
  // returned as [B, L, N]; a router's top-k indices flattened): into the
  // output seen in their shape, which views address as the output itself
  // (TileBuilder::view). Otherwise the output was a copy of them, HBM to HBM.
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Value x = v;
    while (auto reshape = x.getDefiningOp<ReshapeOp>())
      x = reshape.getInput();
    Operation *def = x.getDefiningOp();
    if (x == v || !def || isa<ConstantOp>(def) || hasDestination(x) ||
        !tensorType(v).hasStaticShape() || !tensorType(x).hasStaticShape())
      continue;
    auto shape = tensorType(x).getShape();
    setDestination(x,
                   b.create<memref::ReinterpretCastOp>(
                       MemRefType::get(shape, tensorType(x).getElementType()),
                       entry->getArgument(numInputs + i), 0, shape,
                       contiguousStrides(shape)));
  }

  for (Operation &op : body.without_terminator())
    if (failed(lower(&op)))
      return failure();

  b.setLoc(ret.getLoc());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Value dst = entry->getArgument(numInputs + i);
    if (!tensorType(v).hasStaticShape()) {
      // An input or a view of one, returned: copied into its output.
      if (boundBuffer(v) == dst)
        continue;
      Window src = windowOf(v);
      if (std::string why = whyNotCopyable(src, v); !why.empty())
        return emitError(ret.getLoc()) << "not size-generic: result " << i
                                       << " (" << v.getType() << "): " << why;
      copyWindow(src, rowMajorWindow(v, dst), v);
      continue;
    }
    // Already in the output, row-major (computed into it, or through a
    // reshape into it seen in another shape).
    if (isRowMajorIn(windowOf(v), v, dst) ||
        tensorType(v).getNumElements() == 0)
      continue;
    // A view materialized now, into its destination (a returned transpose):
    // there already.
    Value src = bufferOf(v);
    if (src == dst)
      continue;
    // Both sides are contiguous: copied as rows that spread over the DMA
    // engines (an HBM-to-HBM transfer splits by its leading dim).
    int64_t n = tensorType(v).getNumElements();
    int64_t rows = std::gcd(n, (int64_t)target.partitions);
    SmallVector<int64_t> dims{rows, n / rows}, strides{n / rows, 1};
    dma(view(src, index(0), dims, strides), view(dst, index(0), dims, strides));
  }
  b.create<func::ReturnOp>();
  kernel->setLoc(func.getLoc());
  func.erase();
  return success();
}

void populateLowerToNisaPatterns(TilePatternSet &patterns) {
  populateLayoutPatterns(patterns);
  populateElementwiseGroupPatterns(patterns);
  populateMatmulPatterns(patterns);
  populateConvolutionPatterns(patterns);
  populatePoolPatterns(patterns);
  populateGroupNormPatterns(patterns);
  populateChannelNormPatterns(patterns);
  populateReducePatterns(patterns);
  populateGatherPatterns(patterns);
  populateScanPatterns(patterns);
  populateTopKPatterns(patterns);
  populateRotaryPatterns(patterns);
  populateRandPatterns(patterns);
  populateCollectivePatterns(patterns);
  populateFlexAttentionPatterns(patterns);
  populateFlexAttentionBackwardPatterns(patterns);
}

/// Wires the patterns: one KernelLowering per function, which the driver
/// walks in program order (TilePattern.h says why not a conversion).
struct NeuronLowerToNisaPass
    : public mlir::neuron::impl::NeuronLowerToNisaBase<NeuronLowerToNisaPass> {
  using NeuronLowerToNisaBase::NeuronLowerToNisaBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!target.empty())
      module->setAttr(nisa::kTargetAttrName,
                      StringAttr::get(&getContext(), target));
    const auto *chip = nisa::lookupTarget(module);
    if (!chip)
      return signalPassFailure();
    if (freeTileBytes < 4) {
      module.emitError("free-tile-bytes must be at least 4");
      return signalPassFailure();
    }
    NeuronLowerToNisaOptions knobs;
    knobs.freeTileBytes = freeTileBytes;
    knobs.streamSlots = streamSlots;
    knobs.streamSbufPercent = streamSbufPercent;
    knobs.innerSbufPercent = innerSbufPercent;
    knobs.gemmPanelSbufPercent = gemmPanelSbufPercent;
    knobs.attentionLanes = attentionLanes;
    knobs.attentionSbufPercent = attentionSbufPercent;
    if (knobs.streamSlots < 1 || knobs.attentionLanes < 1) {
      module.emitError("stream-slots and attention-lanes must be at least 1");
      return signalPassFailure();
    }
    for (auto [name, percent] :
         {std::pair{"stream-sbuf-percent", knobs.streamSbufPercent},
          {"inner-sbuf-percent", knobs.innerSbufPercent},
          {"gemm-panel-sbuf-percent", knobs.gemmPanelSbufPercent},
          {"attention-sbuf-percent", knobs.attentionSbufPercent}})
      if (percent < 1 || percent > 100) {
        module.emitError() << name << " must be between 1 and 100, not "
                           << percent;
        return signalPassFailure();
      }
    TilePatternSet patterns;
    populateLowerToNisaPatterns(patterns);
    SmallVector<func::FuncOp> funcs(module.getOps<func::FuncOp>());
    for (func::FuncOp func : funcs) {
      if (func->hasAttr("nisa.kernel") || func.isExternal())
        continue;
      ImplicitLocOpBuilder builder(UnknownLoc::get(&getContext()),
                                   &getContext());
      KernelLowering lowering(builder, module, *chip, knobs, patterns);
      if (failed(lowering.lowerFunction(func)))
        return signalPassFailure();
    }
  }
};

} // namespace mlir::neuron
