//===- EmitProgram.cpp - nisa kernel -> kernel program (JSON) -------------===//
//
// Walks a lowered kernel function and writes the program format of
// docs/PROGRAM_FORMAT.md. Index arithmetic on scf.for ivs is folded into
// affine view offsets; on-chip tiles whose lifetimes do not overlap share a
// buffer, so the program's scratch memory is what is live at once. Opcodes,
// operand and attribute fields and the spellings of enums come from
// runtime/program/InstructionSet.def: an instruction's operands by their
// ODS names (InstructionOpInterface::getNamedOperands) and its attributes
// by the table's sources, so a new instruction needs no code here.
//
//===----------------------------------------------------------------------===//

#include "compiler/emit/EmitProgram.h"

#include "dialects/neuron/NeuronDialect.h"
#include "dialects/nisa/NisaDialect.h"
#include "runtime/program/Error.h"
#include "runtime/program/Program.h"
#include "runtime/program/SizeExpr.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Base64.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

using namespace mlir;
using json = nlohmann::json;
namespace rt = ::neuron::runtime;

namespace {

/// An integer of a size-generic program (issue #16): a constant, or an
/// expression over the params in the runtime's grammar (SizeExpr.h).
struct Size {
  int64_t constant = 0;
  std::string expr; // empty: the constant

  bool isConstant() const { return expr.empty(); }
  std::string text() const {
    return isConstant() ? std::to_string(constant) : expr;
  }
  json toJson() const { return isConstant() ? json(constant) : json(expr); }
  static Size of(int64_t c) { return Size{c, {}}; }
  /// `fn(a, b)` (fn a function of the grammar) or `(a op b)`; constants
  /// fold by the runtime's evaluator, the one definition of the semantics.
  static Size combine(const std::string &fn, const Size &a, const Size &b) {
    // x + 0, x - 0, x * 1 and divisions by 1 are x.
    if (b.isConstant() && b.constant == (fn == "+" || fn == "-" ? 0 : 1) &&
        fn != "mod" && fn != "min" && fn != "max")
      return a;
    // 0 + x and 1 * x are x; 0 * x is 0.
    if (a.isConstant() && a.constant == (fn == "+" ? 0 : 1) &&
        (fn == "+" || fn == "*"))
      return b;
    if (fn == "*" && ((a.isConstant() && a.constant == 0) ||
                      (b.isConstant() && b.constant == 0)))
      return of(0);
    std::string text = fn.size() == 1
                           ? "(" + a.text() + fn + b.text() + ")"
                           : fn + "(" + a.text() + "," + b.text() + ")";
    if (a.isConstant() && b.isConstant()) {
      try {
        return of(rt::evaluate(rt::parseSizeExpr(text), {}));
      } catch (const rt::Error &) {
        // a division by zero is left to the runtime to report
      }
    }
    return Size{0, text};
  }
};

struct Affine {
  int64_t constant = 0;
  /// (loop id, coefficient): a number, or a size expression (a loop over a
  /// dim whose stride is known only at run time).
  std::vector<std::pair<int, Size>> terms;
  /// A part that is an expression over the params (empty: none).
  std::string symbolic;

  Affine operator+(const Affine &o) const {
    Affine r = *this;
    r.constant += o.constant;
    if (!o.symbolic.empty())
      r.symbolic = r.symbolic.empty()
                       ? o.symbolic
                       : "(" + r.symbolic + "+" + o.symbolic + ")";
    for (const auto &[id, c] : o.terms) {
      auto it = llvm::find_if(r.terms, [&](auto &t) { return t.first == id; });
      if (it == r.terms.end())
        r.terms.push_back({id, c});
      else if (it->second.isConstant() && c.isConstant())
        it->second.constant += c.constant;
      else
        it->second = Size::combine("+", it->second, c);
    }
    return r;
  }
  Affine operator*(int64_t k) const {
    Affine r = *this;
    r.constant *= k;
    for (auto &t : r.terms) {
      if (t.second.isConstant())
        t.second.constant *= k;
      else
        t.second = Size::combine("*", t.second, Size::of(k));
    }
    if (!r.symbolic.empty())
      r.symbolic = "(" + r.symbolic + "*" + std::to_string(k) + ")";
    return r;
  }
  /// This times a size expression.
  Affine operator*(const Size &k) const {
    if (k.isConstant())
      return *this * k.constant;
    Affine r;
    for (const auto &[id, c] : terms)
      r.terms.push_back({id, Size::combine("*", c, k)});
    Size rest = Size::of(constant);
    if (!symbolic.empty())
      rest = Size::combine("+", Size{0, symbolic}, rest);
    rest = Size::combine("*", rest, k);
    r.constant = rest.constant;
    r.symbolic = rest.expr;
    return r;
  }
  bool isConstant() const {
    return symbolic.empty() && llvm::all_of(terms, [](auto &t) {
             return t.second.isConstant() && t.second.constant == 0;
           });
  }
  json toJson() const {
    json t = json::array();
    for (const auto &[id, c] : terms)
      if (!c.isConstant() || c.constant != 0)
        t.push_back({id, c.toJson()});
    json c = constant;
    if (!symbolic.empty())
      c = constant == 0 ? symbolic
                        : "(" + symbolic + "+" + std::to_string(constant) + ")";
    return {{"const", c}, {"terms", t}};
  }
};

struct View {
  int buffer;
  Affine offset;
  json shape; // integers, or size expressions of a size-generic program
  std::vector<int64_t> strides;
};

std::optional<rt::DType> dtypeOf(Type t) {
  if (t.isF32())
    return rt::DType::F32;
  if (t.isBF16())
    return rt::DType::BF16;
  if (t.isF16())
    return rt::DType::F16;
  if (t.isFloat8E4M3FN())
    return rt::DType::F8E4M3FN;
  if (t.isFloat8E5M2())
    return rt::DType::F8E5M2;
  if (t.isInteger(1))
    return rt::DType::Bool;
  if (t.isUnsignedInteger(8))
    return rt::DType::U8;
  if (t.isInteger(8))
    return rt::DType::I8;
  if (t.isInteger(32))
    return rt::DType::I32;
  if (t.isInteger(64))
    return rt::DType::I64;
  return std::nullopt;
}

/// A double as the program format writes it: JSON has no inf or nan.
json number(double v) {
  if (std::isnan(v))
    return {{"float", "nan"}};
  if (std::isinf(v))
    return {{"float", v > 0 ? "inf" : "-inf"}};
  return v;
}

const char *spaceName(nisa::MemorySpace space) {
  return rt::spaceName(nisa::toProgram(space));
}

/// The attribute of a collective that holds its group's ranks (the group
/// field's second half).
constexpr StringLiteral kGroupRanks = "ranks";

/// "file:line" of the innermost source position in `loc`, if any.
std::optional<std::string> sourceLine(Location loc) {
  if (auto f = dyn_cast<FileLineColLoc>(loc))
    return f.getFilename().str() + ":" + std::to_string(f.getLine());
  if (auto n = dyn_cast<NameLoc>(loc))
    return sourceLine(n.getChildLoc());
  if (auto c = dyn_cast<CallSiteLoc>(loc))
    return sourceLine(c.getCallee());
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location l : fused.getLocations())
      if (auto s = sourceLine(l))
        return s;
  return std::nullopt;
}

/// An on-chip tile's program buffer: space, byte address, dtype and free
/// size (tiles that share all four share a buffer).
using TileKey = std::tuple<int, int64_t, rt::DType, int64_t>;
TileKey tileKey(memref::AllocOp alloc) {
  MemRefType type = alloc.getType();
  auto address = alloc->getAttrOfType<IntegerAttr>(nisa::kAddressAttrName);
  return {(int)nisa::getMemorySpace(type), address.getInt(),
          *dtypeOf(type.getElementType()),
          type.getNumElements() / std::max<int64_t>(1, type.getDimSize(0))};
}

class ProgramEmitter {
public:
  explicit ProgramEmitter(func::FuncOp kernel)
      : kernel(kernel),
        synchronized(kernel->hasAttr(nisa::kSynchronizedAttrName)) {}
  FailureOr<json> emit();

private:
  LogicalResult emitBlock(Block &block, json &out);
  LogicalResult emitOp(Operation *op, json &out);
  // emitOp's cases: a loop node, an on-chip tile or HBM temporary, a
  // constant, a view (access pattern) of a buffer.
  LogicalResult emitLoop(scf::ForOp loop, json &out);
  LogicalResult emitAlloc(memref::AllocOp alloc);
  LogicalResult emitGlobal(memref::GetGlobalOp get);
  LogicalResult emitView(memref::ReinterpretCastOp rc);
  LogicalResult emitInstruction(Operation *op, json &out);
  /// The program value of one attribute (std::nullopt: left out).
  FailureOr<std::optional<json>> attributeValue(Operation *op,
                                                const rt::AttributeField &field,
                                                Attribute attr, bool hasScalar);
  FailureOr<Affine> affineOf(Value v, Operation *user);
  FailureOr<Size> sizeOf(Value v, Operation *user);
  /// `v` as a size: constants and params combined by arith ops, else none.
  std::optional<Size> sizeExprOf(Value v);
  FailureOr<json> shapeOf(Value base, MemRefType type);
  FailureOr<json> viewOf(Value v, Operation *user);
  FailureOr<int> addBuffer(Value base, rt::BufferKind kind, StringRef name);
  FailureOr<json> constantBuffer(memref::GetGlobalOp get);

  func::FuncOp kernel;
  json buffers = json::array();
  std::vector<std::string> locations;
  std::map<std::string, int> locationIds;
  /// The program's "groups": the process groups of collective instructions
  /// by name, in order of first use.
  json groups = json::array();
  std::map<std::string, int64_t> groupIds;
  llvm::DenseMap<Value, Affine> ivs; // scf.for iv -> lb + step * counter
  /// Size-generic kernels: the size arguments, their param names in order.
  llvm::DenseMap<Value, std::string> params;
  SmallVector<std::string> paramNames;
  llvm::DenseMap<Value, int> bufferIds;
  llvm::DenseMap<Value, View> views;
  /// On-chip tiles with one TileKey share a program buffer with the most
  /// partitions any of them has; nisa-allocate made their lifetimes
  /// disjoint. Buffers of different keys may share bytes at other times.
  struct TileBuffer {
    int64_t partitions = 0;
    int id = -1;
  };
  std::map<TileKey, TileBuffer> tileBuffers;
  /// Synchronized kernels: nisa.id -> static instruction index.
  llvm::DenseMap<int64_t, int64_t> instructionIndex;
  bool synchronized = false;
  LogicalResult planTiles();
  LogicalResult numberInstructions();
  std::map<std::string, int> globals;
  int nextLoop = 0;
};

FailureOr<int> ProgramEmitter::addBuffer(Value base, rt::BufferKind kind,
                                         StringRef name) {
  auto type = dyn_cast<MemRefType>(base.getType());
  if (!type)
    return emitError(base.getLoc(), "kernel buffers must be memrefs, got ")
           << base.getType();
  auto dtype = dtypeOf(type.getElementType());
  if (!dtype)
    return emitError(base.getLoc(), "unsupported element type ")
           << type.getElementType();
  auto shape = shapeOf(base, type);
  if (failed(shape))
    return failure();
  int id = buffers.size();
  buffers.push_back({{"id", id},
                     {"name", name.str()},
                     {"space", spaceName(nisa::getMemorySpace(type))},
                     {"kind", rt::bufferKindName(kind)},
                     {"dtype", rt::dtypeName(*dtype)},
                     {"shape", *shape}});
  bufferIds[base] = id;
  return id;
}

/// An HBM buffer's shape: a dynamic dim is an expression over the params,
/// from the kernel argument's `neuron.dims` or the alloc's size operands.
FailureOr<json> ProgramEmitter::shapeOf(Value base, MemRefType type) {
  json shape = json::array();
  if (type.hasStaticShape()) {
    for (int64_t d : type.getShape())
      shape.push_back(d);
    return shape;
  }
  if (auto alloc = base.getDefiningOp<memref::AllocOp>()) {
    auto dynamic = alloc.getDynamicSizes();
    for (int64_t i = 0, k = 0; i < type.getRank(); ++i) {
      if (!type.isDynamicDim(i)) {
        shape.push_back(type.getDimSize(i));
        continue;
      }
      auto size = sizeOf(dynamic[k++], alloc);
      if (failed(size))
        return failure();
      shape.push_back(size->toJson());
    }
    return shape;
  }
  auto arg = dyn_cast<BlockArgument>(base);
  auto dims = arg ? kernel.getArgAttrOfType<AffineMapAttr>(
                        arg.getArgNumber(), mlir::neuron::kDimsAttrName)
                  : AffineMapAttr();
  if (!dims || dims.getValue().getNumResults() != type.getRank() ||
      dims.getValue().getNumSymbols() != paramNames.size())
    return emitError(base.getLoc(),
                     "a kernel buffer with dynamic dims needs "
                     "their sizes (neuron.dims over the params)");
  std::function<std::string(AffineExpr)> print = [&](AffineExpr e) {
    if (auto c = dyn_cast<AffineConstantExpr>(e))
      return Size::of(c.getValue()).text();
    if (auto sym = dyn_cast<AffineSymbolExpr>(e))
      return paramNames[sym.getPosition()];
    auto bin = cast<AffineBinaryOpExpr>(e);
    std::string l = print(bin.getLHS()), r = print(bin.getRHS());
    switch (e.getKind()) {
    case AffineExprKind::Add:
      return "(" + l + "+" + r + ")";
    case AffineExprKind::Mul:
      return "(" + l + "*" + r + ")";
    case AffineExprKind::FloorDiv:
      return "floordiv(" + l + "," + r + ")";
    case AffineExprKind::CeilDiv:
      return "ceildiv(" + l + "," + r + ")";
    default:
      return "mod(" + l + "," + r + ")";
    }
  };
  for (auto [i, e] : llvm::enumerate(dims.getValue().getResults())) {
    if (auto c = dyn_cast<AffineConstantExpr>(e))
      shape.push_back(c.getValue());
    else
      shape.push_back(print(e));
  }
  return shape;
}

/// An index of a size-generic kernel: constants and size arguments combined
/// by arith ops (sizes are non-negative, so divsi and remsi are floordiv
/// and mod).
std::optional<Size> ProgramEmitter::sizeExprOf(Value v) {
  if (auto c = v.getDefiningOp<arith::ConstantIndexOp>())
    return Size::of(c.value());
  if (auto it = params.find(v); it != params.end())
    return Size{0, it->second};
  Operation *def = v.getDefiningOp();
  const char *fn = nullptr;
  using Kind = rt::SizeExpr::Kind;
  switch (nisa::sizeFunctionOf(def).value_or(Kind::Const)) {
  case Kind::Add:
    fn = "+";
    break;
  case Kind::Sub:
    fn = "-";
    break;
  case Kind::Mul:
    fn = "*";
    break;
  case Kind::FloorDiv:
    fn = "floordiv";
    break;
  case Kind::CeilDiv:
    fn = "ceildiv";
    break;
  case Kind::Mod:
    fn = "mod";
    break;
  case Kind::Min:
    fn = "min";
    break;
  case Kind::Max:
    fn = "max";
    break;
  case Kind::Const:
  case Kind::Param:
  case Kind::Neg:
    break;
  }
  if (!fn)
    return std::nullopt;
  auto l = sizeExprOf(def->getOperand(0));
  auto r = sizeExprOf(def->getOperand(1));
  if (!l || !r)
    return std::nullopt;
  return Size::combine(fn, *l, *r);
}

FailureOr<Size> ProgramEmitter::sizeOf(Value v, Operation *user) {
  if (std::optional<Size> size = sizeExprOf(v))
    return *size;
  return user->emitError("index is neither a constant nor a size "
                         "expression of the kernel's params");
}

FailureOr<Affine> ProgramEmitter::affineOf(Value v, Operation *user) {
  std::optional<nisa::AffineIndex> index = nisa::affineIndexOf(v);
  if (!index && !params.empty()) {
    // A size-generic kernel: a sum of loop terms and expressions of the
    // params.
    if (auto add = v.getDefiningOp<arith::AddIOp>()) {
      auto l = affineOf(add.getLhs(), user), r = affineOf(add.getRhs(), user);
      if (failed(l) || failed(r))
        return failure();
      return *l + *r;
    }
    if (auto mul = v.getDefiningOp<arith::MulIOp>())
      for (auto [x, c] : {std::pair(mul.getLhs(), mul.getRhs()),
                          std::pair(mul.getRhs(), mul.getLhs())}) {
        if (auto k = c.getDefiningOp<arith::ConstantIndexOp>()) {
          auto a = affineOf(x, user);
          if (failed(a))
            return failure();
          return *a * k.value();
        }
        // A loop iv times a stride known only at run time.
        if (std::optional<Size> k = sizeExprOf(c); k && !sizeExprOf(x)) {
          auto a = affineOf(x, user);
          if (failed(a))
            return failure();
          return *a * *k;
        }
      }
    auto size = sizeOf(v, user);
    if (failed(size))
      return failure();
    Affine a;
    a.constant = size->constant;
    a.symbolic = size->expr;
    return a;
  }
  if (!index)
    return user->emitError("index is not affine in the enclosing loop ivs");
  // Each iv is its loop's lower bound plus step times the loop's counter.
  Affine a;
  a.constant = index->constant;
  for (auto [iv, coeff] : index->terms) {
    auto it = ivs.find(iv);
    if (it == ivs.end())
      return user->emitError("index uses a loop iv outside its loop");
    a = a + it->second * coeff;
  }
  return a;
}

FailureOr<json> ProgramEmitter::viewOf(Value v, Operation *user) {
  View view;
  if (auto it = views.find(v); it != views.end()) {
    view = it->second;
  } else if (auto id = bufferIds.find(v); id != bufferIds.end()) {
    auto type = cast<MemRefType>(v.getType());
    if (!type.hasStaticShape())
      return user->emitError("a buffer with dynamic dims is read or written "
                             "only through views");
    view.buffer = id->second;
    view.shape =
        std::vector<int64_t>(type.getShape().begin(), type.getShape().end());
    view.strides.assign(type.getRank(), 1);
    for (int64_t i = type.getRank() - 2; i >= 0; --i)
      view.strides[i] = view.strides[i + 1] * type.getDimSize(i + 1);
  } else {
    return user->emitError("operand is neither a buffer nor a view of one");
  }
  return json{{"buf", view.buffer},
              {"offset", view.offset.toJson()},
              {"shape", view.shape},
              {"strides", view.strides}};
}

FailureOr<json> ProgramEmitter::constantBuffer(memref::GetGlobalOp get) {
  auto module = kernel->getParentOfType<ModuleOp>();
  auto global = module.lookupSymbol<memref::GlobalOp>(get.getNameAttr());
  if (!global || !global.getInitialValue())
    return get.emitError("constant has no initial value");
  auto attr = dyn_cast<DenseElementsAttr>(*global.getInitialValue());
  if (!attr)
    return get.emitError("constant must be a dense elements attribute");
  Type elt = attr.getElementType();
  auto scalar = [&](auto value) -> json {
    if (isa<FloatType>(elt))
      return number(value.template getSplatValue<APFloat>().convertToDouble());
    if (elt.isInteger(1))
      return value.template getSplatValue<bool>() ? 1 : 0;
    return value.template getSplatValue<APInt>().getSExtValue();
  };
  if (attr.isSplat())
    return json{{"splat", scalar(attr)}};
  // Little-endian element bytes, one byte per bool.
  std::vector<char> bytes;
  auto append = [&](const APInt &bits) {
    if (bits.getBitWidth() == 1) {
      bytes.push_back(bits.getBoolValue() ? 1 : 0);
      return;
    }
    for (unsigned i = 0; i < bits.getBitWidth(); i += 8)
      bytes.push_back((char)bits.extractBitsAsZExtValue(8, i));
  };
  if (isa<FloatType>(elt)) {
    for (APFloat f : attr.getValues<APFloat>())
      append(f.bitcastToAPInt());
  } else {
    for (APInt i : attr.getValues<APInt>())
      append(i);
  }
  return json{{"data", llvm::encodeBase64(bytes)}};
}

LogicalResult ProgramEmitter::emitBlock(Block &block, json &out) {
  for (Operation &op : block)
    if (failed(emitOp(&op, out)))
      return failure();
  return success();
}

LogicalResult ProgramEmitter::emitOp(Operation *op, json &out) {
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<arith::ConstantIndexOp, arith::AddIOp, arith::MulIOp, arith::SubIOp,
            arith::FloorDivSIOp, arith::DivSIOp, arith::CeilDivSIOp,
            arith::RemSIOp, arith::MinSIOp, arith::MaxSIOp>(
          [&](Operation *) { return success(); }) // folded into views lazily
      .Case<scf::ForOp>([&](scf::ForOp loop) { return emitLoop(loop, out); })
      .Case<scf::YieldOp, func::ReturnOp, memref::DeallocOp>(
          [&](Operation *) { return success(); })
      .Case<memref::AllocOp>(
          [&](memref::AllocOp alloc) { return emitAlloc(alloc); })
      .Case<memref::GetGlobalOp>(
          [&](memref::GetGlobalOp get) { return emitGlobal(get); })
      .Case<memref::ReinterpretCastOp>(
          [&](memref::ReinterpretCastOp rc) { return emitView(rc); })
      .Default([&](Operation *other) -> LogicalResult {
        if (isa<nisa::NisaDialect>(other->getDialect()))
          return emitInstruction(other, out);
        return other->emitOpError("cannot be emitted into a kernel program");
      });
}

LogicalResult ProgramEmitter::emitLoop(scf::ForOp loop, json &out) {
  auto lb = affineOf(loop.getLowerBound(), loop);
  auto step = affineOf(loop.getStep(), loop);
  if (failed(lb) || failed(step))
    return failure();
  if (!lb->isConstant() || !step->isConstant() || step->constant <= 0)
    return loop.emitError("loop bounds must be constants");
  // A size-generic loop's upper bound may be a size expression.
  FailureOr<Size> ub = Size();
  if (params.empty()) {
    auto affine = affineOf(loop.getUpperBound(), loop);
    if (failed(affine))
      return failure();
    if (!affine->isConstant())
      return loop.emitError("loop bounds must be constants");
    ub = Size::of(affine->constant);
  } else {
    ub = sizeOf(loop.getUpperBound(), loop);
    if (failed(ub))
      return failure();
  }
  if (loop.getNumRegionIterArgs() != 0)
    return loop.emitError("loops with iteration arguments are not "
                          "kernel loops");
  int id = nextLoop++;
  json count;
  if (ub->isConstant())
    count = std::max<int64_t>(
        0, (ub->constant - lb->constant + step->constant - 1) / step->constant);
  else
    count = Size::combine("ceildiv",
                          Size::combine("-", *ub, Size::of(lb->constant)),
                          Size::of(step->constant))
                .toJson();
  Affine iv;
  iv.constant = lb->constant;
  iv.terms.push_back({id, Size::of(step->constant)});
  ivs[loop.getInductionVar()] = iv;
  json body = json::array();
  if (failed(emitBlock(*loop.getBody(), body)))
    return failure();
  out.push_back({{"loop", id}, {"count", count}, {"body", body}});
  return success();
}

LogicalResult ProgramEmitter::emitAlloc(memref::AllocOp alloc) {
  auto type = alloc.getType();
  if (nisa::getMemorySpace(type) == nisa::MemorySpace::hbm)
    return addBuffer(alloc, rt::BufferKind::Internal,
                     "t" + std::to_string(buffers.size()));
  TileBuffer &tb = tileBuffers[tileKey(alloc)];
  if (tb.id < 0) {
    tb.id = buffers.size();
    auto [space, address, dtype, freeElements] = tileKey(alloc);
    buffers.push_back(
        {{"id", tb.id},
         {"name", "tile" + std::to_string(tb.id)},
         {"space", spaceName(nisa::getMemorySpace(type))},
         {"kind", rt::bufferKindName(rt::BufferKind::Scratch)},
         {"dtype", rt::dtypeName(dtype)},
         {"address", address},
         {"shape", std::vector<int64_t>{tb.partitions, freeElements}}});
  }
  bufferIds[alloc] = tb.id;
  return success();
}

LogicalResult ProgramEmitter::emitGlobal(memref::GetGlobalOp get) {
  std::string name = get.getName().str();
  if (auto it = globals.find(name); it != globals.end()) {
    bufferIds[get] = it->second;
    return success();
  }
  auto data = constantBuffer(get);
  auto id = addBuffer(get, rt::BufferKind::Constant, name);
  if (failed(data) || failed(id))
    return failure();
  buffers[*id].update(*data);
  globals[name] = *id;
  return success();
}

LogicalResult ProgramEmitter::emitView(memref::ReinterpretCastOp rc) {
  auto base = bufferIds.find(rc.getSource());
  if (base == bufferIds.end())
    return rc.emitError("views must be taken of a buffer");
  View view;
  view.buffer = base->second;
  auto offsets = rc.getMixedOffsets();
  if (offsets.size() != 1)
    return rc.emitError("expected one offset");
  if (auto attr = dyn_cast<Attribute>(offsets[0])) {
    view.offset.constant = cast_or_null<IntegerAttr>(attr).getInt();
  } else {
    auto off = affineOf(cast<Value>(offsets[0]), rc);
    if (failed(off))
      return failure();
    view.offset = *off;
  }
  view.shape = json::array();
  for (OpFoldResult s : rc.getMixedSizes()) {
    if (auto attr = dyn_cast<Attribute>(s)) {
      view.shape.push_back(cast<IntegerAttr>(attr).getInt());
      continue;
    }
    auto size = sizeOf(cast<Value>(s), rc);
    if (failed(size))
      return failure();
    view.shape.push_back(size->toJson());
  }
  for (int64_t s : nisa::viewStrides(rc))
    view.strides.push_back(s);
  if (llvm::any_of(view.strides, ShapedType::isDynamic))
    return rc.emitError("views need static strides");
  views[rc.getResult()] = view;
  return success();
}

/// The table entry (InstructionSet.def) of the program field that `source`,
/// a nisa op's attribute or index operand, is written as.
const rt::AttributeField *attributeFrom(StringRef source) {
  for (const rt::AttributeField &field : rt::kAttributeFields)
    if (source == field.source)
      return &field;
  return nullptr;
}

bool isOperandField(StringRef name) {
  return llvm::any_of(rt::kOperandFields, [&](const rt::OperandField &f) {
    return name == f.name;
  });
}

FailureOr<std::optional<json>>
ProgramEmitter::attributeValue(Operation *op, const rt::AttributeField &field,
                               Attribute attr, bool hasScalar) {
  auto missing = [&]() -> FailureOr<std::optional<json>> {
    return op->emitError("attribute '")
           << field.source << "' has no value for program field '" << field.name
           << "'";
  };
  switch (field.kind) {
  case rt::AttributeKind::Bool: // a unit attribute: present or not
    if (auto b = dyn_cast_or_null<BoolAttr>(attr))
      return std::optional<json>(b.getValue());
    return std::optional<json>(bool(attr));
  case rt::AttributeKind::Immediate:
    if (hasScalar) // the scalar operand stands in for it
      return std::optional<json>();
    [[fallthrough]];
  case rt::AttributeKind::Number:
    if (auto f = dyn_cast_or_null<FloatAttr>(attr))
      return std::optional<json>(number(f.getValueAsDouble()));
    return missing();
  case rt::AttributeKind::Int:
    if (auto i = dyn_cast_or_null<IntegerAttr>(attr))
      return std::optional<json>(i.getInt());
    return missing();
  case rt::AttributeKind::NumberList: {
    auto list = dyn_cast_or_null<DenseF64ArrayAttr>(attr);
    if (!list)
      return missing();
    json values = json::array();
    for (double v : list.asArrayRef())
      values.push_back(number(v));
    return std::optional<json>(values);
  }
  case rt::AttributeKind::ActFunc:
    if (auto f = dyn_cast_or_null<nisa::ActivationFnAttr>(attr))
      return std::optional<json>(
          rt::actFuncName(nisa::toProgram(f.getValue())));
    return missing();
  case rt::AttributeKind::AluOp:
    if (!attr) // an optional reduction left out (all_gather)
      return std::optional<json>();
    if (auto a = dyn_cast<nisa::AluOpAttr>(attr))
      return std::optional<json>(rt::aluOpName(nisa::toProgram(a.getValue())));
    return missing();
  case rt::AttributeKind::Collective:
    if (auto c = dyn_cast_or_null<nisa::CollectiveAttr>(attr))
      return std::optional<json>(
          rt::collectiveName(nisa::toProgram(c.getValue())));
    return missing();
  case rt::AttributeKind::Group: {
    // A process group by name and ranks: its index in the program's table.
    auto name = dyn_cast_or_null<StringAttr>(attr);
    auto ranksAttr = dyn_cast_or_null<DenseI64ArrayAttr>(
        op->getInherentAttr(kGroupRanks).value_or(Attribute()));
    if (!name || !ranksAttr)
      return missing();
    std::string group = name.str();
    std::vector<int64_t> ranks(ranksAttr.asArrayRef().begin(),
                               ranksAttr.asArrayRef().end());
    auto [it, inserted] = groupIds.try_emplace(group, groupIds.size());
    if (inserted)
      groups.push_back(json{{"name", group}, {"ranks", ranks}});
    else if (groups[it->second]["ranks"] != json(ranks))
      return op->emitError("group '")
             << group << "' has other ranks elsewhere in the kernel";
    return std::optional<json>(it->second);
  }
  case rt::AttributeKind::Affine: // index operands, written with the views
  case rt::AttributeKind::Dge:    // the compiler never asks for hardware DGE
    break;
  }
  return op->emitError("attribute '")
         << field.source << "' cannot be written as program field '"
         << field.name << "'";
}

LogicalResult ProgramEmitter::emitInstruction(Operation *op, json &out) {
  auto instruction = dyn_cast<nisa::InstructionOpInterface>(op);
  if (!instruction)
    return op->emitError("has no kernel program encoding");
  json inst{{"op", rt::opcodeName(instruction.getOpcode())}};
  if (auto line = sourceLine(op->getLoc())) {
    auto [it, inserted] = locationIds.try_emplace(*line, locations.size());
    if (inserted)
      locations.push_back(*line);
    inst["loc"] = it->second;
  }
  // Operands by name (InstructionSet.def): memrefs as views, index operands
  // (iota's and rand's offset) as the affine attribute they are the source
  // of.
  bool hasScalar = false;
  for (auto [name, value] : instruction.getNamedOperands()) {
    hasScalar |= name == "scalar";
    if (isa<MemRefType>(value.getType())) {
      if (!isOperandField(name))
        return op->emitError("operand '")
               << name << "' is no program operand (NEURON_OPERAND in "
               << "InstructionSet.def)";
      auto view = viewOf(value, op);
      if (failed(view))
        return failure();
      inst[name.str()] = *view;
      continue;
    }
    const rt::AttributeField *field = attributeFrom(name);
    if (!field || field->kind != rt::AttributeKind::Affine)
      return op->emitError("operand '")
             << name << "' is no affine program field (NEURON_ATTRIBUTE in "
             << "InstructionSet.def)";
    auto affine = affineOf(value, op);
    if (failed(affine))
      return failure();
    inst[field->name] = affine->toJson();
  }
  // Attributes by the table; every attribute of the op has its place.
  for (StringAttr nameAttr : op->getName().getAttributeNames()) {
    StringRef name = nameAttr.getValue();
    // The issuing engine is written below, operand segments are the
    // operands above, a group's ranks go with its name.
    if (name == "engine" || name == "operandSegmentSizes" ||
        name == kGroupRanks)
      continue;
    const rt::AttributeField *field = attributeFrom(name);
    if (!field)
      return op->emitError("attribute '")
             << name << "' is no program field (NEURON_ATTRIBUTE in "
             << "InstructionSet.def)";
    auto value = attributeValue(
        op, *field, op->getInherentAttr(name).value_or(Attribute()), hasScalar);
    if (failed(value))
      return failure();
    if (*value)
      inst[field->name] = std::move(**value);
  }
  if (auto waits = op->getAttrOfType<DenseI64ArrayAttr>(nisa::kWaitsAttrName);
      waits && synchronized) {
    // A wait that holds at some sizes only (issue #16) names them.
    auto when = op->getAttrOfType<ArrayAttr>(nisa::kWaitWhenAttrName);
    if (when && when.size() != waits.size())
      return op->emitError("needs one nisa.wait_when per wait");
    json indices = json::array();
    for (auto [i, id] : llvm::enumerate(waits.asArrayRef())) {
      auto it = instructionIndex.find(id);
      if (it == instructionIndex.end())
        return op->emitError("waits for unknown instruction id ") << id;
      auto where = when ? dyn_cast<StringAttr>(when[i]) : StringAttr();
      if (where && !where.getValue().empty())
        indices.push_back({{"on", it->second}, {"when", where.str()}});
      else
        indices.push_back(it->second);
    }
    inst["waits"] = indices;
  }
  inst["engine"] =
      rt::engineName(nisa::toProgram(instruction.getIssuingEngine()));
  out.push_back(std::move(inst));
  return success();
}

LogicalResult ProgramEmitter::planTiles() {
  WalkResult walk = kernel.walk([&](memref::AllocOp alloc) {
    MemRefType type = alloc.getType();
    if (nisa::getMemorySpace(type) == nisa::MemorySpace::hbm)
      return WalkResult::advance();
    if (!dtypeOf(type.getElementType()) || type.getRank() < 1 ||
        !type.hasStaticShape()) {
      alloc.emitError("on-chip tiles need a static [partitions, free...] "
                      "shape and a supported dtype");
      return WalkResult::interrupt();
    }
    if (!alloc->hasAttr(nisa::kAddressAttrName)) {
      alloc.emitError("on-chip tile has no nisa.address (run nisa-allocate)");
      return WalkResult::interrupt();
    }
    TileBuffer &tb = tileBuffers[tileKey(alloc)];
    tb.partitions = std::max(tb.partitions, type.getDimSize(0));
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

LogicalResult ProgramEmitter::numberInstructions() {
  int64_t next = 0;
  WalkResult walk = kernel.walk<WalkOrder::PreOrder>([&](Operation *op) {
    if (!isa<nisa::InstructionOpInterface>(op))
      return WalkResult::advance();
    auto id = op->getAttrOfType<IntegerAttr>(nisa::kIdAttrName);
    if (!id || !instructionIndex.try_emplace(id.getInt(), next++).second) {
      op->emitError("instruction of a synchronized kernel needs a unique "
                    "nisa.id (run nisa-insert-sync after changing "
                    "instructions)");
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

FailureOr<json> ProgramEmitter::emit() {
  if (!kernel->hasAttr("nisa.kernel"))
    return kernel.emitError("not a lowered kernel (run neuron-lower-to-nisa)");
  auto numInputs = kernel->getAttrOfType<IntegerAttr>("nisa.num_inputs");
  if (!numInputs)
    return kernel.emitError("kernel lacks nisa.num_inputs");
  json inputs = json::array(), outputs = json::array();
  // Size parameters (issue #16): index arguments after the buffers.
  json paramList = json::array();
  for (BlockArgument arg : kernel.getArguments()) {
    auto size = kernel.getArgAttrOfType<DictionaryAttr>(
        arg.getArgNumber(), mlir::neuron::kSizeAttrName);
    if (!arg.getType().isIndex())
      continue;
    auto name = size ? size.getAs<StringAttr>("name") : StringAttr();
    auto lo = size ? size.getAs<IntegerAttr>("min") : IntegerAttr();
    if (!name || !lo)
      return kernel.emitError("an index argument of a kernel is a size "
                              "parameter with a name and a min");
    json param{{"name", name.str()}, {"min", lo.getInt()}};
    if (auto hi = size.getAs<IntegerAttr>("max"))
      param["max"] = hi.getInt();
    params[arg] = name.str();
    paramNames.push_back(name.str());
    paramList.push_back(param);
  }
  for (auto [i, arg] : llvm::enumerate(kernel.getArguments())) {
    if (params.count(arg))
      continue;
    bool isInput = (int64_t)i < numInputs.getInt();
    std::string name = isInput ? "in" + std::to_string(i)
                               : "out" + std::to_string(i - numInputs.getInt());
    auto id = addBuffer(
        arg, isInput ? rt::BufferKind::Input : rt::BufferKind::Output, name);
    if (failed(id))
      return failure();
    (isInput ? inputs : outputs).push_back(*id);
  }
  if (failed(planTiles()) || (synchronized && failed(numberInstructions())))
    return failure();
  json body = json::array();
  if (failed(emitBlock(kernel.getBody().front(), body)))
    return failure();
  auto module = kernel->getParentOfType<ModuleOp>();
  std::string target = "trn2";
  if (auto attr = module->getAttrOfType<StringAttr>(nisa::kTargetAttrName))
    target = attr.str();
  json program{{"format", rt::kProgramFormat},
               {"version", rt::kProgramVersion},
               {"name", kernel.getSymName().str()},
               {"target", target},
               {"buffers", buffers},
               {"inputs", inputs},
               {"outputs", outputs},
               {"locations", locations},
               {"body", body}};
  if (synchronized)
    program["sync"] = "explicit";
  if (!groups.empty())
    program["groups"] = groups;
  if (!paramList.empty())
    program["params"] = paramList;
  return program;
}

} // namespace

namespace neuron::compiler {

FailureOr<std::string> emitProgram(func::FuncOp kernel) {
  auto program = ProgramEmitter(kernel).emit();
  if (failed(program))
    return failure();
  return program->dump();
}

FailureOr<std::string> emitProgram(ModuleOp module) {
  func::FuncOp kernel;
  for (auto f : module.getOps<func::FuncOp>()) {
    if (!f->hasAttr("nisa.kernel"))
      continue;
    if (kernel)
      return module.emitError("expected one kernel function, found several");
    kernel = f;
  }
  if (!kernel)
    return module.emitError("no kernel function (run neuron-lower-to-nisa)");
  return emitProgram(kernel);
}

} // namespace neuron::compiler
