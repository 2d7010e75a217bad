//===- KernelLowering.h - the state of tiling one function into nisa ------===//
//
// `neuron-lower-to-nisa` lowers each function with one KernelLowering: the
// tensor -> HBM buffer map, the building blocks (views, tiles, loops) and one
// member per op family. Op families with files of their own (FlexAttention)
// implement their member there.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_TILE_KERNELLOWERING_H
#define PASSES_TILE_KERNELLOWERING_H

#include "passes/Passes.h"
#include "passes/fuse/FusionPlan.h"

#include "dialects/neuron/NeuronDialect.h"
#include "dialects/nisa/NisaDialect.h"
#include "runtime/target/Cost.h"
#include "runtime/target/Target.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::neuron {

using nisa::MemorySpace;

using TileBody = llvm::function_ref<void(Value offset, int64_t size)>;

inline int64_t product(ArrayRef<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    n *= d;
  return n;
}

inline SmallVector<int64_t> contiguousStrides(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t i = (int64_t)shape.size() - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

inline RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

namespace flex {
class FlexAttentionLowering;
} // namespace flex

/// Lowers the ops of one function; owns the tensor -> HBM buffer mapping.
class KernelLowering {
public:
  /// `knobs`: the pass's tuning options (Passes.td documents each default).
  KernelLowering(OpBuilder &builder, ModuleOp module,
                 const ::neuron::target::Target &target,
                 const NeuronLowerToNisaOptions &knobs)
      : b(builder), module(module), target(target), knobs(knobs),
        tileBytes(knobs.freeTileBytes), loc(builder.getUnknownLoc()) {}

  LogicalResult lowerFunction(func::FuncOp func);

private:
  friend class flex::FlexAttentionLowering;

  // --- building blocks --------------------------------------------------
  Value index(int64_t v) { return b.create<arith::ConstantIndexOp>(loc, v); }
  Value addOffset(Value offset, int64_t c) {
    if (c == 0)
      return offset;
    return b.create<arith::AddIOp>(loc, offset, index(c));
  }
  Value addOffsets(Value a, Value c) {
    return b.create<arith::AddIOp>(loc, a, c);
  }
  Value scale(Value v, int64_t c) {
    if (c == 1)
      return v;
    return b.create<arith::MulIOp>(loc, v, index(c));
  }

  /// An access pattern into a base buffer: element offset, static sizes and
  /// strides. Operands of every instruction are built this way.
  Value view(Value base, Value offset, ArrayRef<int64_t> shape,
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
    return b.create<memref::ReinterpretCastOp>(loc, type, base, offset, sizes,
                                               strideValues);
  }
  Value rowView(Value base, Value offset, int64_t rows, int64_t cols,
                int64_t rowStride) {
    return view(base, offset, {rows, cols}, {rowStride, 1});
  }

  /// An on-chip tile, released at the end of the enclosing TileScope.
  Value tile(MemorySpace space, ArrayRef<int64_t> shape, Type elementType) {
    auto type =
        MemRefType::get(shape, elementType, MemRefLayoutAttrInterface(),
                        nisa::MemorySpaceAttr::get(b.getContext(), space));
    Value t = b.create<memref::AllocOp>(loc, type);
    scopeTiles.back().push_back(t);
    return t;
  }
  struct TileScope {
    KernelLowering &k;
    explicit TileScope(KernelLowering &k) : k(k) {
      k.scopeTiles.emplace_back();
    }
    ~TileScope() {
      for (Value t : llvm::reverse(k.scopeTiles.back()))
        k.b.create<memref::DeallocOp>(k.loc, t);
      k.scopeTiles.pop_back();
    }
  };

  /// Calls `body` for [0, total) in chunks of `tileSize`: a loop over the
  /// full chunks, then the remainder once.
  void forTiles(int64_t total, int64_t tileSize, TileBody body) {
    int64_t full = total / tileSize, rem = total % tileSize;
    if (full == 1) {
      body(index(0), tileSize);
    } else if (full > 1) {
      auto loop = b.create<scf::ForOp>(loc, index(0), index(full * tileSize),
                                       index(tileSize));
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPoint(loop.getBody()->getTerminator());
      body(loop.getInductionVar(), tileSize);
    }
    if (rem)
      body(index(full * tileSize), rem);
  }

  void dma(Value src, Value dst) { b.create<nisa::DmaCopyOp>(loc, src, dst); }

  Value load(Value base, Value offset, int64_t rows, int64_t cols,
             int64_t rowStride) {
    auto elt = cast<MemRefType>(base.getType()).getElementType();
    Value t = tile(MemorySpace::sbuf, {rows, cols}, elt);
    dma(rowView(base, offset, rows, cols, rowStride), t);
    return t;
  }

  // --- tensors and buffers ------------------------------------------------
  MemRefType hbmType(RankedTensorType t) {
    return MemRefType::get(t.getShape(), t.getElementType());
  }
  Value bufferOf(Value tensor);
  /// Where a tensor's elements are: a buffer, an element offset and a
  /// stride per dim (a layout op's result is such a window of its input
  /// until a consumer needs it contiguous).
  struct Window {
    Value buffer;
    int64_t offset = 0;
    SmallVector<int64_t> strides;
  };
  Window windowOf(Value tensor);
  bool transposeThroughSbuf(const Window &window, ArrayRef<int64_t> shape,
                            Value out);
  void lowerLayout(Operation *op);
  Value resultBuffer(Value result) {
    auto it = destinations.find(result);
    Value buffer =
        it != destinations.end()
            ? it->second
            : b.create<memref::AllocOp>(loc, hbmType(tensorType(result)))
                  .getResult();
    buffers[result] = buffer;
    return buffer;
  }

  // --- op lowerings -------------------------------------------------------
  LogicalResult lower(Operation *op);
  void lowerGroup(Operation *anchor, ArrayRef<Operation *> ops,
                  ArrayRef<std::pair<Value, Value>> inputs,
                  ArrayRef<std::pair<Value, Value>> outputs);
  void lowerFusion(FusionOp fusion);
  llvm::DenseMap<Operation *, nisa::Engine> assignEngines(
      ArrayRef<Operation *> ops, const llvm::DenseSet<Operation *> &folded,
      const llvm::DenseSet<Operation *> &activations,
      const llvm::DenseSet<Operation *> &scalarSums,
      llvm::function_ref<::neuron::runtime::Opcode(Operation *)> instructionOf,
      const FusionPlan &plan, int64_t cols) const;
  void lowerMatmul(MatmulOp op);
  void forEach(int64_t count, llvm::function_ref<void(Value)> body);
  void forEachRotating(int64_t first, int64_t count, int64_t slots,
                       llvm::function_ref<void(Value, int64_t)> body);
  int64_t streamSlots(double transferNs, double computeNs) const;
  void forEachPipelined(int64_t count, int64_t slots,
                        llvm::function_ref<void(Value, int64_t)> load,
                        llvm::function_ref<void(Value, int64_t)> compute);
  void lowerReduce(ReduceOp op);
  /// In LowerColumnSum.cpp: a sum over leading dims, read in place and
  /// reduced across partitions on TensorE; false if `op` is not one.
  bool lowerColumnSum(ReduceOp op);
  void lowerConcat(ConcatOp op);
  void lowerGather(GatherOp op);
  void lowerRand(RandOp op);
  /// In passes/tile/LowerScan.cpp.
  void lowerCumsum(CumsumOp op);
  /// A scan's blocks of `partitions` rows (the last one shorter): `block(index,
  /// slot, rows, first)`, the middle ones rotating over `slots`.
  void forEachScanBlock(
      int64_t len, int64_t slots,
      llvm::function_ref<void(Value, int64_t, int64_t, bool)> block);
  void lowerRowScan(Value in, Value out, int64_t rows, int64_t len, Type mmElt,
                    Value tri, Value identity);
  /// In passes/tile/LowerTopK.cpp.
  void lowerTopK(TopKOp op);
  void lowerCollective(CollectiveOp op);
  /// In passes/flex_attention/LowerFlexAttention(Backward).cpp.
  LogicalResult lowerFlexAttention(FlexAttentionOp op);
  LogicalResult lowerFlexAttentionBackward(FlexAttentionBackwardOp op);

  OpBuilder &b;
  ModuleOp module;
  const ::neuron::target::Target &target;
  const NeuronLowerToNisaOptions knobs;
  int64_t tileBytes;
  Location loc;
  Block *entry = nullptr;
  DenseMap<Value, Value> buffers;      // tensor -> HBM base buffer
  DenseMap<Value, Value> destinations; // returned tensor -> output argument
  /// Results of layout ops not copied yet, and where they came from.
  struct LazyView {
    Window window;
    Location loc;
  };
  DenseMap<Value, LazyView> lazyViews;
  SmallVector<SmallVector<Value>> scopeTiles;
  unsigned constantCount = 0;
  bool hadError = false; // a lowering emitted an error
};

inline nisa::ActivationFn activationFor(UnaryFn fn) {
  // The enums share spellings; ScalarE's table has every neuron function.
  return *nisa::symbolizeActivationFn(stringifyUnaryFn(fn));
}

inline nisa::AluOp aluFor(BinaryFn fn) {
  switch (fn) {
  case BinaryFn::add:
    return nisa::AluOp::add;
  case BinaryFn::sub:
    return nisa::AluOp::subtract;
  case BinaryFn::mul:
    return nisa::AluOp::multiply;
  case BinaryFn::div:
    return nisa::AluOp::divide;
  case BinaryFn::fmod:
    return nisa::AluOp::mod;
  default:
    return *nisa::symbolizeAluOp(stringifyBinaryFn(fn));
  }
}

inline nisa::AluOp aluFor(ReduceFn fn) {
  switch (fn) {
  case ReduceFn::sum:
    return nisa::AluOp::add;
  case ReduceFn::max:
    return nisa::AluOp::max;
  case ReduceFn::min:
    return nisa::AluOp::min;
  case ReduceFn::prod:
    return nisa::AluOp::multiply;
  }
  llvm_unreachable("unknown reduction");
}

} // namespace mlir::neuron

#endif // PASSES_TILE_KERNELLOWERING_H
