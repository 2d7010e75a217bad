//===- LowerToNisa.cpp - tile `neuron` ops into engine instructions -------===//
//
// Every tensor lives in an HBM buffer in row-major order. Each `neuron` op
// becomes loops over tiles: DMA loads into SBUF, engine instructions, DMA
// stores. Tiles belong to the op that allocates them and are released when
// it is done, so on-chip memory is reused op after op.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "dialects/neuron/NeuronDialect.h"
#include "dialects/nisa/NisaDialect.h"
#include "runtime/target/Target.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::neuron {
#define GEN_PASS_DEF_NEURONLOWERTONISA
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

using namespace mlir;
using namespace mlir::neuron;
using nisa::MemorySpace;

namespace {

using TileBody = llvm::function_ref<void(Value offset, int64_t size)>;

int64_t product(ArrayRef<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    n *= d;
  return n;
}

SmallVector<int64_t> contiguousStrides(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t i = (int64_t)shape.size() - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// Lowers the ops of one function; owns the tensor -> HBM buffer mapping.
class KernelLowering {
public:
  KernelLowering(OpBuilder &builder, ModuleOp module,
                 const ::neuron::target::Target &target, int64_t tileBytes)
      : b(builder), module(module), target(target), tileBytes(tileBytes),
        loc(builder.getUnknownLoc()) {}

  LogicalResult lowerFunction(func::FuncOp func);

private:
  // --- building blocks --------------------------------------------------
  Value index(int64_t v) {
    return b.create<arith::ConstantIndexOp>(loc, v);
  }
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
    auto layout = StridedLayoutAttr::get(b.getContext(), ShapedType::kDynamic,
                                         strides);
    auto type = MemRefType::get(shape, baseType.getElementType(), layout,
                                baseType.getMemorySpace());
    SmallVector<OpFoldResult> sizes, strideValues;
    for (int64_t s : shape)
      sizes.push_back(b.getIndexAttr(s));
    for (int64_t s : strides)
      strideValues.push_back(b.getIndexAttr(s));
    return b.create<memref::ReinterpretCastOp>(loc, type, base, offset, sizes,
                                               strideValues);
  }
  Value rowView(Value base, Value offset, int64_t rows, int64_t cols,
                int64_t rowStride) {
    return view(base, offset, {rows, cols}, {rowStride, 1});
  }

  /// An on-chip tile, released at the end of the enclosing TileScope.
  Value tile(MemorySpace space, ArrayRef<int64_t> shape, Type elementType) {
    auto type = MemRefType::get(
        shape, elementType, MemRefLayoutAttrInterface(),
        nisa::MemorySpaceAttr::get(b.getContext(), space));
    Value t = b.create<memref::AllocOp>(loc, type);
    scopeTiles.back().push_back(t);
    return t;
  }
  struct TileScope {
    KernelLowering &k;
    explicit TileScope(KernelLowering &k) : k(k) { k.scopeTiles.emplace_back(); }
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

  /// Walks `n` contiguous elements as [rows, cols] tiles (rows on the
  /// partitions): full [P, F] tiles in a loop, then the rest.
  void forFlatTiles(int64_t n,
                    llvm::function_ref<void(Value, int64_t, int64_t)> body) {
    int64_t p = target.partitions;
    int64_t freeMax = std::max<int64_t>(1, tileBytes / 4);
    int64_t cols = n >= p * freeMax ? freeMax : std::max<int64_t>(1, n / p);
    int64_t chunk = p * cols, full = n / chunk, rem = n % chunk;
    if (full == 1) {
      body(index(0), p, cols);
    } else if (full > 1) {
      auto loop = b.create<scf::ForOp>(loc, index(0), index(full * chunk),
                                       index(chunk));
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPoint(loop.getBody()->getTerminator());
      body(loop.getInductionVar(), p, cols);
    }
    int64_t base = full * chunk;
    if (rem / cols)
      body(index(base), rem / cols, cols);
    if (rem % cols)
      body(index(base + rem / cols * cols), 1, rem % cols);
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
  Value resultBuffer(Value result) {
    auto it = destinations.find(result);
    Value buffer = it != destinations.end()
                       ? it->second
                       : b.create<memref::AllocOp>(loc,
                                                   hbmType(tensorType(result)))
                             .getResult();
    buffers[result] = buffer;
    return buffer;
  }
  std::optional<double> splatValue(Value tensor);

  // --- op lowerings -------------------------------------------------------
  LogicalResult lower(Operation *op);
  void lowerElementwise(Operation *op, ValueRange inputs,
                        llvm::function_ref<void(ArrayRef<Value>, Value)> tileFn);
  void lowerBinary(BinaryOp op);
  void lowerMatmul(MatmulOp op);
  void lowerReduce(ReduceOp op);
  void lowerStridedCopy(Value input, Value result, ArrayRef<int64_t> shape,
                        ArrayRef<int64_t> strides, int64_t offset);
  void lowerConcat(ConcatOp op);
  void lowerGather(GatherOp op);

  OpBuilder &b;
  ModuleOp module;
  const ::neuron::target::Target &target;
  int64_t tileBytes;
  Location loc;
  Block *entry = nullptr;
  DenseMap<Value, Value> buffers;      // tensor -> HBM base buffer
  DenseMap<Value, Value> destinations; // returned tensor -> output argument
  SmallVector<SmallVector<Value>> scopeTiles;
  unsigned constantCount = 0;
};

Value KernelLowering::bufferOf(Value tensor) {
  if (Value buffer = buffers.lookup(tensor))
    return buffer;
  // Only constants are materialized on first use: splats feeding
  // tensor_scalar instructions never need a buffer.
  auto constant = tensor.getDefiningOp<ConstantOp>();
  assert(constant && "operand lowered before its producer");
  auto type = hbmType(tensorType(tensor));
  std::string name = "__constant_" + std::to_string(constantCount++);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(module.getBody());
  auto global = b.create<memref::GlobalOp>(
      constant.getLoc(), name, b.getStringAttr("private"), type,
      cast<ElementsAttr>(constant.getValue()), /*constant=*/true,
      /*alignment=*/nullptr);
  b.setInsertionPointToStart(entry);
  Value buffer =
      b.create<memref::GetGlobalOp>(constant.getLoc(), type, global.getName());
  buffers[tensor] = buffer;
  return buffer;
}

std::optional<double> KernelLowering::splatValue(Value tensor) {
  auto constant = tensor.getDefiningOp<ConstantOp>();
  if (!constant)
    return std::nullopt;
  auto splat = dyn_cast<SplatElementsAttr>(constant.getValue());
  if (!splat)
    return std::nullopt;
  Type elt = splat.getElementType();
  if (isa<FloatType>(elt))
    return splat.getSplatValue<APFloat>().convertToDouble();
  if (elt.isInteger(1))
    return splat.getSplatValue<bool>() ? 1.0 : 0.0;
  return (double)splat.getSplatValue<APInt>().getSExtValue();
}

nisa::ActivationFn activationFor(UnaryFn fn) {
  // The enums share spellings; ScalarE's table has every neuron function.
  return *nisa::symbolizeActivationFn(stringifyUnaryFn(fn));
}

nisa::AluOp aluFor(BinaryFn fn) {
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

nisa::AluOp aluFor(ReduceFn fn) {
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

void KernelLowering::lowerElementwise(
    Operation *op, ValueRange inputs,
    llvm::function_ref<void(ArrayRef<Value>, Value)> tileFn) {
  Value result = op->getResult(0);
  auto type = tensorType(result);
  SmallVector<Value> inBuffers;
  for (Value in : inputs)
    inBuffers.push_back(bufferOf(in));
  Value out = resultBuffer(result);
  forFlatTiles(type.getNumElements(), [&](Value off, int64_t rows,
                                          int64_t cols) {
    TileScope scope(*this);
    SmallVector<Value> tiles;
    for (Value in : inBuffers)
      tiles.push_back(load(in, off, rows, cols, cols));
    Value o = tile(MemorySpace::sbuf, {rows, cols}, type.getElementType());
    tileFn(tiles, o);
    dma(o, rowView(out, off, rows, cols, cols));
  });
}

void KernelLowering::lowerBinary(BinaryOp op) {
  nisa::AluOp alu = aluFor(op.getFn());
  std::optional<double> lhsSplat = splatValue(op.getLhs());
  std::optional<double> rhsSplat = splatValue(op.getRhs());
  if (rhsSplat || lhsSplat) {
    // A splat operand rides along as the instruction's immediate.
    bool reverse = !rhsSplat;
    double imm = reverse ? *lhsSplat : *rhsSplat;
    Value data = reverse ? op.getRhs() : op.getLhs();
    lowerElementwise(op, data, [&](ArrayRef<Value> in, Value out) {
      b.create<nisa::TensorScalarOp>(loc, alu, in[0], out, Value(),
                                     APFloat(imm), reverse);
    });
    return;
  }
  lowerElementwise(op, {op.getLhs(), op.getRhs()},
                   [&](ArrayRef<Value> in, Value out) {
                     b.create<nisa::TensorTensorOp>(loc, alu, in[0], in[1],
                                                    out);
                   });
}

void KernelLowering::lowerMatmul(MatmulOp op) {
  auto lhsType = tensorType(op.getLhs()), rhsType = tensorType(op.getRhs());
  auto outType = op.getType();
  int64_t rank = lhsType.getRank();
  int64_t m = lhsType.getDimSize(rank - 2), k = lhsType.getDimSize(rank - 1);
  int64_t n = rhsType.getDimSize(rank - 1);
  int64_t batch = product(lhsType.getShape().drop_back(2));
  Value lhs = bufferOf(op.getLhs()), rhs = bufferOf(op.getRhs());
  Value out = resultBuffer(op.getResult());
  Type inElt = lhsType.getElementType(), f32 = b.getF32Type();

  auto body = [&](Value bOff) {
    Value lhsBase = scale(bOff, m * k), rhsBase = scale(bOff, k * n);
    Value outBase = scale(bOff, m * n);
    forTiles(m, target.matmulMaxStationaryFree, [&](Value m0, int64_t mt) {
      forTiles(n, target.matmulMaxMovingFree, [&](Value n0, int64_t nt) {
        TileScope scope(*this);
        Value acc = tile(MemorySpace::psum, {mt, nt}, f32);
        // K tiles accumulate in one PSUM bank; the first one overwrites it.
        auto kTile = [&](Value k0, int64_t kt, bool accumulate) {
          TileScope kScope(*this);
          Value stationary = tile(MemorySpace::sbuf, {kt, mt}, inElt);
          Value moving = tile(MemorySpace::sbuf, {kt, nt}, inElt);
          // A^T tile [kt, mt]: contraction on the partitions.
          dma(view(lhs, addOffsets(addOffsets(lhsBase, scale(m0, k)), k0),
                   {kt, mt}, {1, k}),
              stationary);
          dma(view(rhs, addOffsets(addOffsets(rhsBase, scale(k0, n)), n0),
                   {kt, nt}, {n, 1}),
              moving);
          auto mm = b.create<nisa::MatmulOp>(loc, stationary, moving, acc);
          if (accumulate)
            mm.setAccumulate(true);
        };
        int64_t kMax = target.matmulMaxK;
        int64_t first = std::min(k, kMax);
        kTile(index(0), first, false);
        if (k > first)
          forTiles(k - first, kMax, [&](Value k0, int64_t kt) {
            kTile(addOffset(k0, first), kt, true);
          });
        Value result = tile(MemorySpace::sbuf, {mt, nt},
                            outType.getElementType());
        b.create<nisa::CopyOp>(loc, acc, result);
        dma(result, view(out, addOffsets(addOffsets(outBase, scale(m0, n)), n0),
                         {mt, nt}, {n, 1}));
      });
    });
  };
  if (batch == 1) {
    body(index(0));
  } else {
    auto loop = b.create<scf::ForOp>(loc, index(0), index(batch), index(1));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(loop.getBody()->getTerminator());
    body(loop.getInductionVar());
  }
}

void KernelLowering::lowerReduce(ReduceOp op) {
  auto inType = tensorType(op.getInput());
  int64_t cols = product(inType.getShape().take_back(op.getCount()));
  int64_t rows = product(inType.getShape().drop_back(op.getCount()));
  Value in = bufferOf(op.getInput()), out = resultBuffer(op.getResult());
  nisa::AluOp alu = aluFor(op.getFn());
  Type f32 = b.getF32Type();
  int64_t chunk = std::max<int64_t>(1, tileBytes / 4);
  forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
    TileScope scope(*this);
    Value acc = tile(MemorySpace::sbuf, {rt, 1}, f32);
    Value rowBase = scale(r0, cols);
    int64_t first = std::min(cols, chunk);
    {
      TileScope s(*this);
      Value t = load(in, rowBase, rt, first, cols);
      b.create<nisa::TensorReduceOp>(loc, alu, t, acc);
    }
    if (cols > first)
      forTiles(cols - first, chunk, [&](Value c0, int64_t ct) {
        TileScope s(*this);
        Value t = load(in, addOffsets(rowBase, addOffset(c0, first)), rt, ct,
                       cols);
        Value part = tile(MemorySpace::sbuf, {rt, 1}, f32);
        b.create<nisa::TensorReduceOp>(loc, alu, t, part);
        b.create<nisa::TensorTensorOp>(loc, alu, acc, part, acc);
      });
    Value result = tile(MemorySpace::sbuf, {rt, 1}, inType.getElementType());
    b.create<nisa::CopyOp>(loc, acc, result);
    dma(result, view(out, r0, {rt, 1}, {1, 1}));
  });
}

void KernelLowering::lowerStridedCopy(Value input, Value result,
                                      ArrayRef<int64_t> shape,
                                      ArrayRef<int64_t> strides,
                                      int64_t offset) {
  // One DMA moves the whole tensor HBM -> HBM through an access pattern.
  Value in = bufferOf(input), out = resultBuffer(result);
  if (shape.empty()) {
    dma(view(in, index(offset), {1}, {1}), view(out, index(0), {1}, {1}));
    return;
  }
  dma(view(in, index(offset), shape, strides),
      view(out, index(0), shape, contiguousStrides(shape)));
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

void KernelLowering::lowerGather(GatherOp op) {
  auto tableType = tensorType(op.getTable());
  auto idxType = tensorType(op.getIndices());
  int64_t rows = idxType.getNumElements();
  int64_t width = product(tableType.getShape().drop_front());
  int64_t vocab = tableType.getDimSize(0);
  Value table = bufferOf(op.getTable()), idx = bufferOf(op.getIndices());
  Value out = resultBuffer(op.getResult());
  // Gathered rows land in SBUF; keep each chunk within a few tiles' bytes.
  int64_t eltBytes = std::max<int64_t>(1, tableType.getElementTypeBitWidth() / 8);
  int64_t chunk = std::max<int64_t>(1, 4 * tileBytes / eltBytes);
  forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
    TileScope scope(*this);
    Value indices = load(idx, r0, rt, 1, 1);
    forTiles(width, chunk, [&](Value c0, int64_t ct) {
      TileScope s(*this);
      Value rowsTile =
          tile(MemorySpace::sbuf, {rt, ct}, tableType.getElementType());
      b.create<nisa::DmaGatherOp>(loc, view(table, c0, {vocab, ct}, {width, 1}),
                                  indices, rowsTile);
      dma(rowsTile, view(out, addOffsets(scale(r0, width), c0), {rt, ct},
                         {width, 1}));
    });
  });
}

LogicalResult KernelLowering::lower(Operation *op) {
  loc = op->getLoc();
  // An empty result needs a buffer but no instructions.
  if (op->getNumResults() == 1 && !isa<ConstantOp, ReshapeOp>(op) &&
      tensorType(op->getResult(0)).getNumElements() == 0) {
    resultBuffer(op->getResult(0));
    return success();
  }
  if (auto mm = dyn_cast<MatmulOp>(op))
    if (tensorType(mm.getLhs()).getShape().back() == 0)
      return op->emitOpError("has an empty contraction (the importer folds "
                             "it to zeros)");
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<ConstantOp>([&](auto) { return success(); })
      .Case<UnaryOp>([&](UnaryOp u) {
        auto fn = activationFor(u.getFn());
        lowerElementwise(u, u.getInput(), [&](ArrayRef<Value> in, Value out) {
          b.create<nisa::ActivationOp>(loc, in[0], out, Value(), fn,
                                      APFloat(1.0), APFloat(0.0));
        });
        return success();
      })
      .Case<BinaryOp>([&](BinaryOp bin) {
        lowerBinary(bin);
        return success();
      })
      .Case<SelectOp>([&](SelectOp s) {
        lowerElementwise(s, {s.getCond(), s.getOnTrue(), s.getOnFalse()},
                         [&](ArrayRef<Value> in, Value out) {
                           b.create<nisa::SelectOp>(loc, in[0], in[1], in[2],
                                                    out);
                         });
        return success();
      })
      .Case<CastOp>([&](CastOp c) {
        lowerElementwise(c, c.getInput(), [&](ArrayRef<Value> in, Value out) {
          b.create<nisa::CopyOp>(loc, in[0], out);
        });
        return success();
      })
      .Case<MatmulOp>([&](MatmulOp m) {
        lowerMatmul(m);
        return success();
      })
      .Case<ReduceOp>([&](ReduceOp r) {
        lowerReduce(r);
        return success();
      })
      .Case<ReshapeOp>([&](ReshapeOp r) {
        // Row-major order is unchanged: the result aliases the input.
        buffers[r.getResult()] = bufferOf(r.getInput());
        return success();
      })
      .Case<TransposeOp>([&](TransposeOp t) {
        auto inStrides = contiguousStrides(tensorType(t.getInput()).getShape());
        SmallVector<int64_t> strides;
        for (int64_t p : t.getPermutation())
          strides.push_back(inStrides[p]);
        lowerStridedCopy(t.getInput(), t.getResult(), t.getType().getShape(),
                         strides, 0);
        return success();
      })
      .Case<BroadcastOp>([&](BroadcastOp br) {
        auto inType = tensorType(br.getInput());
        auto inStrides = contiguousStrides(inType.getShape());
        int64_t shift = br.getType().getRank() - inType.getRank();
        SmallVector<int64_t> strides(br.getType().getRank(), 0);
        for (int64_t i = 0; i < inType.getRank(); ++i)
          if (inType.getDimSize(i) != 1)
            strides[i + shift] = inStrides[i];
        lowerStridedCopy(br.getInput(), br.getResult(),
                         br.getType().getShape(), strides, 0);
        return success();
      })
      .Case<SliceOp>([&](SliceOp s) {
        auto inStrides = contiguousStrides(tensorType(s.getInput()).getShape());
        SmallVector<int64_t> strides;
        int64_t offset = 0;
        for (auto [i, st] : llvm::enumerate(inStrides)) {
          strides.push_back(st * s.getStrides()[i]);
          offset += st * s.getOffsets()[i];
        }
        lowerStridedCopy(s.getInput(), s.getResult(), s.getType().getShape(),
                         strides, offset);
        return success();
      })
      .Case<ConcatOp>([&](ConcatOp c) {
        lowerConcat(c);
        return success();
      })
      .Case<GatherOp>([&](GatherOp g) {
        lowerGather(g);
        return success();
      })
      .Default([&](Operation *other) {
        return other->emitOpError("has no lowering to nisa");
      });
}

LogicalResult KernelLowering::lowerFunction(func::FuncOp func) {
  FunctionType fnType = func.getFunctionType();
  SmallVector<Type> argTypes;
  for (Type t : llvm::concat<const Type>(fnType.getInputs(),
                                         fnType.getResults())) {
    auto tensor = dyn_cast<RankedTensorType>(t);
    if (!tensor)
      return func.emitOpError("kernel arguments and results must be ranked "
                              "tensors, got ")
             << t;
    argTypes.push_back(hbmType(tensor));
  }
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(func);
  auto kernel = b.create<func::FuncOp>(func.getLoc(), func.getName(),
                                       b.getFunctionType(argTypes, {}));
  kernel->setAttr("nisa.kernel", b.getUnitAttr());
  kernel->setAttr("nisa.num_inputs",
                  b.getI64IntegerAttr(fnType.getNumInputs()));
  entry = kernel.addEntryBlock();
  b.setInsertionPointToStart(entry);

  Block &body = func.getBody().front();
  unsigned numInputs = fnType.getNumInputs();
  for (auto [i, arg] : llvm::enumerate(body.getArguments()))
    buffers[arg] = entry->getArgument(i);

  // Results computed by an op are written straight into their output buffer.
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Operation *def = v.getDefiningOp();
    if (def && !isa<ConstantOp, ReshapeOp>(def) && !destinations.count(v))
      destinations[v] = entry->getArgument(numInputs + i);
  }

  for (Operation &op : body.without_terminator())
    if (failed(lower(&op)))
      return failure();

  loc = ret.getLoc();
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Value dst = entry->getArgument(numInputs + i);
    Value src = bufferOf(v);
    if (src == dst || tensorType(v).getNumElements() == 0)
      continue;
    auto shape = tensorType(v).getShape();
    SmallVector<int64_t> dims(shape);
    if (dims.empty())
      dims.push_back(1);
    auto strides = contiguousStrides(dims);
    dma(view(src, index(0), dims, strides), view(dst, index(0), dims, strides));
  }
  b.create<func::ReturnOp>(ret.getLoc());
  kernel->setLoc(func.getLoc());
  func.erase();
  return success();
}

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
    SmallVector<func::FuncOp> funcs(module.getOps<func::FuncOp>());
    OpBuilder builder(&getContext());
    for (func::FuncOp func : funcs) {
      if (func->hasAttr("nisa.kernel") || func.isExternal())
        continue;
      KernelLowering lowering(builder, module, *chip, freeTileBytes);
      if (failed(lowering.lowerFunction(func)))
        return signalPassFailure();
    }
  }
};

} // namespace
