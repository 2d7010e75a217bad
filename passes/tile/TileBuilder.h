//===- TileBuilder.h - what every op family's lowering builds with --------===//
//
// One TileBuilder per function being lowered, passed explicitly to each op
// family's lowering: the chip (target), the tensor -> HBM buffer map, and an
// ImplicitLocOpBuilder whose location is the op being lowered (LocScope sets
// it for a nested one), with the building blocks every kernel is made of:
// index arithmetic, strided views, scoped on-chip tiles, tile loops, DMAs.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_TILE_TILEBUILDER_H
#define PASSES_TILE_TILEBUILDER_H

#include "dialects/neuron/NeuronDialect.h"
#include "dialects/nisa/NisaDialect.h"
#include "passes/Passes.h"
#include "runtime/target/Target.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::neuron {

using nisa::MemorySpace;

using TileBody = llvm::function_ref<void(Value offset, int64_t size)>;

inline int64_t product(ArrayRef<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    n *= d;
  return n;
}

/// The kernel argument `base` shows in another shape (a contiguous
/// reinterpret_cast from its first element: an output that a returned
/// reshape's operand is computed into), else `base`. A view's offset and
/// strides address the argument unchanged, and views are taken of buffers.
Value unreshaped(Value base);

inline SmallVector<int64_t> contiguousStrides(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t i = (int64_t)shape.size() - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

inline RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

class TileBuilder {
public:
  /// `knobs`: neuron-lower-to-nisa's tuning options (Passes.td documents
  /// each default).
  TileBuilder(ImplicitLocOpBuilder &builder, ModuleOp module,
              const ::neuron::target::Target &target,
              const NeuronLowerToNisaOptions &knobs)
      : b(builder), target(target), knobs(knobs),
        tileBytes(knobs.freeTileBytes), module(module) {}

  /// Builds at `loc` for its lifetime: the ops a nested op (a modifier's,
  /// a lazy view's copy) becomes carry that op's location.
  class LocScope {
  public:
    LocScope(ImplicitLocOpBuilder &b, Location loc) : b(b), saved(b.getLoc()) {
      b.setLoc(loc);
    }
    ~LocScope() { b.setLoc(saved); }

  private:
    ImplicitLocOpBuilder &b;
    Location saved;
  };

  ImplicitLocOpBuilder &b;
  const ::neuron::target::Target &target;
  const NeuronLowerToNisaOptions knobs;
  /// Bytes per partition a streamed tile may take (neuron-lower-to-nisa's
  /// free-tile-bytes).
  const int64_t tileBytes;

  // --- index arithmetic ---------------------------------------------------
  Value index(int64_t v) { return b.create<arith::ConstantIndexOp>(v); }
  Value addOffset(Value offset, int64_t c) {
    if (c == 0)
      return offset;
    return b.create<arith::AddIOp>(offset, index(c));
  }
  Value addOffsets(Value a, Value c) { return b.create<arith::AddIOp>(a, c); }
  Value scale(Value v, int64_t c) {
    if (c == 1)
      return v;
    return b.create<arith::MulIOp>(v, index(c));
  }
  /// v / d for an index each of whose terms d divides (a step's first row),
  /// kept affine in the loop ivs (a program's indices are): constants, sums
  /// and multiples of d divided term by term.
  Value divideExactly(Value v, int64_t d) {
    if (d == 1)
      return v;
    if (auto c = v.getDefiningOp<arith::ConstantIndexOp>();
        c && c.value() % d == 0)
      return index(c.value() / d);
    if (auto add = v.getDefiningOp<arith::AddIOp>())
      return addOffsets(divideExactly(add.getLhs(), d),
                        divideExactly(add.getRhs(), d));
    if (auto mul = v.getDefiningOp<arith::MulIOp>())
      if (auto c = mul.getRhs().getDefiningOp<arith::ConstantIndexOp>();
          c && c.value() % d == 0)
        return scale(mul.getLhs(), c.value() / d);
    return b.create<arith::FloorDivSIOp>(v, index(d));
  }

  /// An access pattern into a base buffer: element offset, static sizes and
  /// strides. Operands of every instruction are built this way.
  Value view(Value base, Value offset, ArrayRef<int64_t> shape,
             ArrayRef<int64_t> strides);
  /// A view whose sizes may be index values (a size-generic function's).
  Value view(Value base, Value offset, ArrayRef<OpFoldResult> shape,
             ArrayRef<int64_t> strides);
  /// `tileView` (a view or a whole tile) with its first dim `rows`: the
  /// part of a step's tile a shortened last step moves.
  Value withRows(Value tileView, Value rows);
  /// `tileView` (a view or a whole tile, 2-D) narrowed to `cols` columns
  /// from column `col0`.
  Value withColumns(Value tileView, int64_t col0, int64_t cols);
  Value rowView(Value base, Value offset, int64_t rows, int64_t cols,
                int64_t rowStride) {
    return view(base, offset, {rows, cols}, {rowStride, 1});
  }

  // --- sizes of a size-generic function (issue #16) -----------------------
  /// Dim `d` of `tensor` as an index: a constant, or computed from the size
  /// arguments; null when the lowering cannot tell it from what it has.
  Value dimOf(Value tensor, int64_t d);
  /// Dim `d` of a reshape's result, its only dynamic one.
  Value reshapedDim(ReshapeOp op, int64_t d);
  Value stampedDim(Operation *op, int64_t d);
  /// Dim `d` of an HBM buffer: its alloc's size operand, or its kernel
  /// argument's `neuron.dims` over the size arguments.
  Value bufferDim(Value buffer, int64_t d);
  /// `e` (over the size arguments as symbols) as arith ops.
  Value sizeValue(AffineExpr e, ValueRange sizes);
  /// Calls `body` `count` times in a loop (a count known at run time).
  void forEachDynamic(Value count, llvm::function_ref<void(Value)> body);

  // --- tiles and loops ----------------------------------------------------
  /// An on-chip tile, released at the end of the enclosing TileScope.
  Value tile(MemorySpace space, ArrayRef<int64_t> shape, Type elementType);
  /// The [n, n] identity (p - j == 0) in `elementType`: TensorE transposes
  /// a tile as its product with it.
  Value identity(int64_t n, Type elementType);
  struct TileScope {
    TileBuilder &k;
    explicit TileScope(TileBuilder &k) : k(k) { k.scopeTiles.emplace_back(); }
    ~TileScope() {
      for (Value t : llvm::reverse(k.scopeTiles.back()))
        k.b.create<memref::DeallocOp>(t);
      k.scopeTiles.pop_back();
    }
  };

  /// Calls `body` for [0, total) in chunks of `tileSize`: a loop over the
  /// full chunks, then the remainder once.
  void forTiles(int64_t total, int64_t tileSize, TileBody body);
  void forEach(int64_t count, llvm::function_ref<void(Value)> body);
  void forEachRotating(int64_t first, int64_t count, int64_t slots,
                       llvm::function_ref<void(Value, int64_t)> body);
  /// A sequence of `count` x `per` steps (step t = i * per + j, in slot t %
  /// slots) whose step t issues work for step t + ahead: a loop over i whose
  /// body unrolls its `per` steps (over as many i as the slots take to come
  /// round to the same one), then unrolled the last i, whose steps reach
  /// within `ahead` of the end. `body(i, j, slot, left)` gets the steps of
  /// the sequence from this one on (more than `ahead` in the loop);
  /// stepAfter gives a later step's i and j.
  void forEachStep(
      int64_t count, int64_t per, int64_t slots, int64_t ahead,
      llvm::function_ref<void(Value i, int64_t j, int64_t slot, int64_t left)>
          body);
  std::pair<Value, int64_t> stepAfter(Value i, int64_t j, int64_t per,
                                      int64_t d) {
    return {addOffset(i, (j + d) / per), (j + d) % per};
  }
  /// forEachPipelined with a count known at run time (issue #16): the
  /// same order of loads and computes; the steps that do not fill a group
  /// of `slots` run in loops of zero or one iteration. `firstLoads` false:
  /// the caller issued the loads of steps [0, slots - 1) earlier
  /// (pipelinedDynamicFirstLoads), ahead of other work. `compute(step,
  /// slot, after)`: `after` counts the steps that follow as a value of the
  /// size arguments, null in the loop, where slots - 1 or more follow.
  void forEachPipelinedDynamic(
      Value count, int64_t slots, llvm::function_ref<void(Value, int64_t)> load,
      llvm::function_ref<void(Value, int64_t, Value)> compute,
      bool firstLoads = true);
  void
  pipelinedDynamicFirstLoads(Value count, int64_t slots,
                             llvm::function_ref<void(Value, int64_t)> load);
  /// A loop of one iteration if `count` > `first`, else none.
  void ifMore(Value count, int64_t first, llvm::function_ref<void()> body);
  int64_t streamSlots(double transferNs, double computeNs) const;
  void forEachPipelined(int64_t count, int64_t slots,
                        llvm::function_ref<void(Value, int64_t)> load,
                        llvm::function_ref<void(Value, int64_t)> compute);

  /// Where the padding is in each plane of an on-chip tile: `planes`
  /// planes of `plane` elements side by side in each of `parts` partitions
  /// from `part0`; a plane's interior is columns [left, left + width) of its
  /// rows [rowBegin, rowEnd), rows of `rowLength` elements from its element
  /// `start`.
  struct Borders {
    int64_t part0, parts, planes, plane, start, rowLength, rowBegin, rowEnd,
        left, width;
  };
  /// `value` (GpSimd) before the interior's first row, between its rows (a
  /// row's right border runs on into the next one's left) and after its
  /// last: a padded image's border, written once where each image writes
  /// only the interior.
  void fillBorders(Value tile, const Borders &borders, double value);

  void dma(Value src, Value dst) { b.create<nisa::DmaCopyOp>(src, dst); }
  /// One DMA of `shape` elements between two windows of HBM buffers, its
  /// dims of one element dropped and the dims merged where both sides run
  /// on across them: an HBM-to-HBM copy splits over the DMA engines by its
  /// leading dim, so a [1, H, L, D] window copies as H * L rows of D.
  void copyMerged(Value src, int64_t srcOffset, ArrayRef<int64_t> srcStrides,
                  Value dst, Value dstOffset, ArrayRef<int64_t> dstStrides,
                  ArrayRef<int64_t> shape);
  Value load(Value base, Value offset, int64_t rows, int64_t cols,
             int64_t rowStride) {
    auto elt = cast<MemRefType>(base.getType()).getElementType();
    Value t = tile(MemorySpace::sbuf, {rows, cols}, elt);
    dma(rowView(base, offset, rows, cols, rowStride), t);
    return t;
  }

  // --- tensors and buffers ------------------------------------------------
  /// Where a tensor's elements are: a buffer, an element offset and a
  /// stride per dim (a layout op's result is such a window of its input
  /// until a consumer needs it contiguous).
  struct Window {
    Value buffer;
    int64_t offset = 0;
    SmallVector<int64_t> strides;
    /// Strides known only at run time (issue #16; kDynamic in `strides`),
    /// null for the others; empty when there are none.
    SmallVector<Value> dynamicStrides;
    bool hasDynamicStrides() const {
      return llvm::any_of(strides, ShapedType::isDynamic);
    }
    /// Stride `d` as an index value.
    Value stride(TileBuilder &k, int64_t d) const {
      return ShapedType::isDynamic(strides[d]) ? dynamicStrides[d]
                                               : k.index(strides[d]);
    }
  };
  static MemRefType hbmType(RankedTensorType t) {
    return MemRefType::get(t.getShape(), t.getElementType());
  }
  /// The contiguous buffer of a tensor computed so far (a window is copied,
  /// a constant materialized, on first use).
  Value bufferOf(Value tensor);
  Window windowOf(Value tensor);
  /// A row-major window of `tensor` (dynamic sizes: strides from its dims;
  /// size-1 dims stride 0).
  Window rowMajorWindow(Value tensor, Value buffer);
  /// Why a window of `tensor` with dynamic sizes cannot be copied by
  /// copyWindow, or "" when it can.
  std::string whyNotCopyable(const Window &window, Value tensor);
  /// dst = src, windows of `tensor`'s dynamic sizes: one DMA per index of
  /// the dims whose stride is known only at run time (unrolled).
  void copyWindow(const Window &src, const Window &dst, Value tensor,
                  Value dstOffset = {});
  /// Dim sizes of `tensor`, run-time ones as index values.
  SmallVector<OpFoldResult> mixedShape(Value tensor);
  /// The buffer a result is computed into: its output argument if the
  /// function returns it, else a new HBM buffer.
  Value resultBuffer(Value result);
  void bind(Value tensor, Value buffer) { buffers[tensor] = buffer; }
  bool isBound(Value tensor) const { return buffers.count(tensor); }
  Value boundBuffer(Value tensor) const { return buffers.lookup(tensor); }
  /// The function returns `result` in an output argument.
  void setDestination(Value result, Value argument) {
    destinations[result] = argument;
  }
  bool hasDestination(Value result) const { return destinations.count(result); }
  /// `result` is `window`, copied at `loc` only if a consumer needs it
  /// contiguous.
  void bindWindow(Value result, Window window, Location loc) {
    lazyViews.try_emplace(result, LazyView{std::move(window), loc});
  }
  bool isWindow(Value tensor) const { return lazyViews.count(tensor); }
  /// A window a group of elementwise ops reads in place: rows of its
  /// buffer (rowStride > 0), element (r, c) of the tensor as [R, C] (C its
  /// last dim, rowLength) at offset + r * rowStride + c; or a block
  /// repeated (period > 0), element e of the flat tensor at
  /// offset + e mod period.
  struct GroupWindow {
    Value buffer;
    int64_t offset = 0, rowStride = 0, rowLength = 0, period = 0;
  };
  /// `tensor` as rows when it is a window of static shape with at least
  /// `minRows` rows apart (a column slice, such as `chunk`'s halves); a row
  /// is its last `rowDims` dims, contiguous.
  std::optional<GroupWindow> rowWindow(Value tensor, int64_t minRows,
                                       int64_t rowDims = 1);
  /// `tensor` as a repeated block when it is a window of static shape that
  /// broadcasts a contiguous block over its leading dims (rotary cos/sin
  /// over the heads).
  std::optional<GroupWindow> repeatWindow(Value tensor);

  /// Where the constants materialized on first use go.
  void setEntry(Block *block) { entry = block; }

private:
  /// body(src, dst) for every index of `dims` (outermost first, a loop
  /// each), src and dst advanced by the dims' strides on each side.
  void forEachIndex(ArrayRef<int64_t> dims, ArrayRef<int64_t> shape,
                    ArrayRef<int64_t> srcStrides, ArrayRef<int64_t> dstStrides,
                    Value src, Value dst,
                    llvm::function_ref<void(Value, Value)> body);
  bool expandThroughSbuf(const Window &window, ArrayRef<int64_t> shape,
                         Value out);
  bool broadcastThroughSbuf(const Window &window, ArrayRef<int64_t> shape,
                            Value out);
  bool transposeThroughSbuf(const Window &window, ArrayRef<int64_t> shape,
                            Value out);
  /// transposeThroughSbuf's rotating buffers and most tiles it unrolls.
  static constexpr int64_t kTransposeSlots = 3, kMaxTransposeTiles = 256;
  bool stridedThroughSbuf(const Window &window, ArrayRef<int64_t> shape,
                          Value out);
  bool permuteThroughSbuf(const Window &window, ArrayRef<int64_t> shape,
                          Value out);

  ModuleOp module;
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
  /// Broadcasts whose dims dimOf is looking for among their users.
  llvm::SmallPtrSet<Operation *, 4> resolving;
  unsigned constantCount = 0;
};

} // namespace mlir::neuron

#endif // PASSES_TILE_TILEBUILDER_H
