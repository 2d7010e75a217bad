//===- FxImporter.cpp - FX graph document -> `neuron` IR ------------------===//
//
// One handler per ATen overload. A handler builds `neuron` ops from the
// node's arguments and result types, or throws Unsupported with a reason:
// the partitioner then leaves that node to eager PyTorch. Result types come
// from the document (what PyTorch computed), so handlers only decide how,
// never what shape.
//
//===----------------------------------------------------------------------===//

#include "compiler/importer/FxImporter.h"

#include "dialects/neuron/NeuronDialect.h"
#include "runtime/program/Error.h"
#include "runtime/program/SizeExpr.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/Base64.h"

#include <array>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

using namespace mlir;
using namespace mlir::neuron;
using json = nlohmann::json;
namespace rt = ::neuron::runtime;

namespace {

/// A node the device cannot run; the reason is shown to the user.
struct Unsupported {
  std::string reason;
};

[[noreturn]] void unsupported(const std::string &reason) {
  throw Unsupported{reason};
}
void require(bool condition, const std::string &reason) {
  if (!condition)
    unsupported(reason);
}

/// Whether `type` has no elements whatever its sizes (a dynamic dim is at
/// least 1: getNumElements() of a dynamic shape is meaningless).
bool isEmpty(RankedTensorType type) {
  return llvm::is_contained(type.getShape(), 0);
}

/// Integer field `key` of `object`, or `fallback` when it is absent. Any
/// other number is refused: nlohmann converts a float with a C++ cast, which
/// is undefined when it is out of range (found by tests/fuzz/FuzzFxImport).
int64_t intField(const json &object, const char *key, int64_t fallback) {
  auto it = object.find(key);
  if (it == object.end())
    return fallback;
  require(it->is_number_integer(),
          std::string("expected an integer '") + key + "' in the document");
  return it->get<int64_t>();
}

using Values = SmallVector<Value, 2>;

/// The size parameters of a size-generic document (its "symbols"), in
/// order: each is an index argument of the function after the tensors.
using Symbols = std::map<std::string, unsigned, std::less<>>;

class Importer;
using Handler = std::function<Values(Importer &)>;
const std::unordered_map<std::string, Handler> &handlers();

class Importer {
public:
  Importer(MLIRContext &context) : ctx(context), b(&context) {
    context.loadDialect<NeuronDialect, func::FuncDialect>();
  }

  /// Imports the document; unsupported nodes are recorded in `failures`
  /// and stand in as placeholders so that later nodes are still checked.
  OwningOpRef<ModuleOp> run(const json &doc,
                            std::map<std::string, std::string> &failures,
                            bool stopAtFirst);

  // --- what handlers use ---------------------------------------------------
  const json &arg(size_t i) const {
    static const json null;
    auto args = node->find("args");
    if (args == node->end() || !args->is_array())
      return null;
    return i < args->size() ? (*args)[i] : null;
  }
  const json &kwarg(const char *name) const {
    static const json null;
    auto kwargs = node->find("kwargs");
    if (kwargs == node->end() || !kwargs->is_object())
      return null;
    auto it = kwargs->find(name);
    return it == kwargs->end() ? null : *it;
  }
  /// Positional argument i, or keyword `name`.
  const json &param(size_t i, const char *name) const {
    const json &a = arg(i);
    return a.is_null() ? kwarg(name) : a;
  }
  bool isTensor(const json &v) const { return v.is_object() && v.contains("ref"); }
  /// Argument i cast to `elt`, or null when it is None (an optional weight).
  Value optionalTensor(int i, Type elt) {
    return isTensor(arg(i)) ? castTo(tensor(arg(i)), elt) : Value();
  }
  Value tensor(const json &v);
  int64_t integer(const json &v) const {
    if (v.is_object() && v.contains("size"))
      unsupported("not size-generic: a symbolic integer argument (" +
                  v.at("size").dump() + ")");
    require(v.is_number_integer(), "expected an integer argument");
    return v.get<int64_t>();
  }
  double number(const json &v) const;
  std::vector<int64_t> ints(const json &v) const {
    if (v.is_number_integer())
      return {v.get<int64_t>()};
    require(v.is_array(), "expected a list of integers");
    std::vector<int64_t> out;
    for (const json &e : v)
      out.push_back(integer(e));
    return out;
  }
  RankedTensorType resultType(size_t i = 0);
  /// A reduction's `dim` argument (position 1; empty: every dim).
  std::vector<int64_t> reductionDims() const {
    const json &dim = param(1, "dim");
    return dim.is_null() ? std::vector<int64_t>{} : ints(dim);
  }
  /// A dimension argument at position `i` (or keyword "dim"), normalized for
  /// `rank`; `fallback` when absent.
  int64_t dimParam(size_t i, int64_t rank, int64_t fallback = 0) const {
    const json &v = param(i, "dim");
    return normDim(v.is_null() ? fallback : integer(v), rank);
  }
  /// A boolean flag at position `i` or keyword `name`, false when absent.
  bool flag(size_t i, const char *name) const {
    const json &v = param(i, name);
    return v.is_boolean() && v.get<bool>();
  }
  /// The index argument of size parameter `name`, null when the document
  /// has none of that name.
  Value symbolValue(const std::string &name) {
    auto it = symbols.find(name);
    if (it == symbols.end())
      return {};
    Block *block = b.getInsertionBlock();
    unsigned first = block->getNumArguments() - symbols.size();
    return block->getArgument(first + it->second);
  }
  size_t numResults() const { return node->value("outputs", json::array()).size(); }
  Location loc() const { return currentLoc; }
  const json &current() const { return *node; }
  /// Whether any node or the graph output reads result `index` of the node.
  bool isUsed(int64_t index) const {
    return used.count({node->at("name").get<std::string>(), index}) != 0;
  }

  Type elementType(const std::string &dtype) const;
  int64_t normDim(int64_t dim, int64_t rank) const {
    int64_t r = std::max<int64_t>(rank, 1);
    require(dim >= -r && dim < r, "dimension out of range");
    return dim < 0 ? dim + r : dim;
  }

  // Op builders with the graph's conventions.
  Value splat(double value, RankedTensorType type);
  Value castTo(Value v, Type elementType);
  Value broadcastTo(Value v, ArrayRef<int64_t> shape);
  Value reshape(Value v, ArrayRef<int64_t> shape);
  Value transpose(Value v, ArrayRef<int64_t> perm);
  Value unary(UnaryFn fn, Value v);
  Value binary(BinaryFn fn, Value lhs, Value rhs, RankedTensorType type);
  /// Binary op on two arguments that may be tensors or scalars, promoted to
  /// `computeElt` and broadcast to `shape`.
  Value binaryArgs(BinaryFn fn, const json &lhs, const json &rhs,
                   Type computeElt, ArrayRef<int64_t> shape);
  Value operandAs(const json &v, Type elt, ArrayRef<int64_t> shape);
  Value reduce(ReduceFn fn, Value v, std::vector<int64_t> dims, bool keepdim);
  Value sumOfSlices(ReduceFn fn, Value v, ArrayRef<bool> reduced);
  Value matmul(Value lhs, Value rhs);
  Type promote(const json &a, const json &b) const;

  /// Imports a FlexAttention modifier (a nested document) into `block`,
  /// whose arguments stand for its inputs, ending in neuron.yield.
  void importModifier(const json &doc, Block *block);

  MLIRContext &ctx;
  OpBuilder b;
  /// The document's size parameters (empty: a static document).
  Symbols symbols;
  /// Importing a FlexAttention modifier, whose values are 0-d tensors.
  bool inModifier = false;

private:
  /// The document's inputs: the tensor types of those the device can hold,
  /// their sizes over the symbols, and which inputs those are.
  struct Inputs {
    SmallVector<Type> types;
    SmallVector<AffineMapAttr> dims;
    std::vector<bool> usable;
  };
  // The steps of run().
  LogicalResult readSymbols(const json &doc, SmallVector<DictionaryAttr> &attrs,
                            std::map<std::string, std::string> &failures);
  LogicalResult readInputs(const json &doc, Inputs &inputs,
                           std::map<std::string, std::string> &failures,
                           bool stopAtFirst);
  func::FuncOp createFunction(ModuleOp module, const json &doc, Inputs &inputs,
                              ArrayRef<DictionaryAttr> symbolAttrs);
  LogicalResult importBody(const json &doc,
                           std::map<std::string, std::string> &failures,
                           bool stopAtFirst);
  LogicalResult returnOutputs(func::FuncOp func, const json &doc,
                              std::map<std::string, std::string> &failures);

  void importNode(const json &n);
  void placeholders(const json &n);
  void stampDims(Value v, size_t i);
  Value importConstant(const json &c);

  const json *node = nullptr;
  Location currentLoc = UnknownLoc::get(&ctx);
  std::map<std::pair<std::string, int64_t>, Value> values;
  /// The document's shape of each value (graph outputs' sizes).
  std::map<std::pair<std::string, int64_t>, const json *> shapes;
  std::set<std::pair<std::string, int64_t>> used;
  std::map<std::string, std::string> hostReasons; // unusable inputs -> why
  /// Values of dtype float8_e8m0fnu: ui8 tensors of E8M0 bits, which only
  /// torch._scaled_mm reads (as MX scales); anything else would take them
  /// for integers.
  std::set<std::string> e8m0Values;
  void noteE8m0(const std::string &name, const json &spec) {
    if (spec.is_object() && spec.value("dtype", "") == "float8_e8m0fnu")
      e8m0Values.insert(name);
  }
  void collectUses(const json &v) {
    if (v.is_object() && v.contains("ref"))
      used.insert({v.at("ref").get<std::string>(), intField(v, "index", 0)});
    else if (v.is_array() || v.is_object())
      for (const json &e : v)
        collectUses(e);
  }
};

//===----------------------------------------------------------------------===//
// Argument decoding
//===----------------------------------------------------------------------===//

/// A size expression of the document, parsed by the runtime's one parser.
rt::SizeExpr sizeExpr(const std::string &text) {
  try {
    return rt::parseSizeExpr(text);
  } catch (const rt::Error &e) {
    unsupported(e.what());
  }
}

/// Whether `e` names a size parameter; unknown names are refused.
bool usesSymbols(const rt::SizeExpr &e, const Symbols &symbols) {
  if (e.kind == rt::SizeExpr::Kind::Param) {
    require(symbols.count(e.name),
            "size '" + e.name + "' is not among the document's symbols");
    return true;
  }
  bool any = false;
  for (const rt::SizeExpr &o : e.operands)
    any |= usesSymbols(o, symbols);
  return any;
}

/// A tensor shape from the document: non-negative sizes whose product fits
/// comfortably in memory arithmetic; an expression over the symbols is a
/// dynamic dim (`?`), its value known only at run time.
SmallVector<int64_t> shapeOf(const json &v, const Symbols &symbols = {}) {
  require(v.is_array(), "shape must be a list");
  SmallVector<int64_t> shape;
  int64_t elements = 1;
  for (const json &d : v) {
    if (d.is_string()) {
      rt::SizeExpr e = sizeExpr(d.get<std::string>());
      if (usesSymbols(e, symbols)) {
        shape.push_back(ShapedType::kDynamic);
        continue;
      }
      int64_t value = -1;
      try {
        value = rt::evaluate(e, {});
      } catch (const rt::Error &err) {
        unsupported(err.what());
      }
      require(value >= 0, "shape sizes must be non-negative integers");
      shape.push_back(value);
    } else {
      require(d.is_number_integer() && d.get<int64_t>() >= 0,
              "shape sizes must be non-negative integers");
      shape.push_back(d.get<int64_t>());
    }
    require(shape.back() == 0 || elements <= (int64_t(1) << 40) / shape.back(),
            "tensor too large for the device");
    elements *= shape.back();
  }
  return shape;
}

/// A size expression as an affine expression over the symbols (symbol i is
/// the i-th size argument): how the lowering computes a dynamic dim.
AffineExpr affineOf(const rt::SizeExpr &e, const Symbols &symbols,
                    MLIRContext *ctx) {
  using Kind = rt::SizeExpr::Kind;
  auto arg = [&](size_t i) { return affineOf(e.operands[i], symbols, ctx); };
  switch (e.kind) {
  case Kind::Const:
    return getAffineConstantExpr(e.value, ctx);
  case Kind::Param:
    return getAffineSymbolExpr(symbols.find(e.name)->second, ctx);
  case Kind::Add:
    return arg(0) + arg(1);
  case Kind::Sub:
    return arg(0) - arg(1);
  case Kind::Mul:
    return arg(0) * arg(1);
  case Kind::Neg:
    return -arg(0);
  case Kind::FloorDiv:
    return arg(0).floorDiv(arg(1));
  case Kind::CeilDiv:
    return arg(0).ceilDiv(arg(1));
  case Kind::Mod:
    return arg(0) % arg(1);
  case Kind::Min:
  case Kind::Max:
    break;
  }
  unsupported("not size-generic: min/max in a tensor's shape (" +
              rt::toString(e) + ")");
}

/// The sizes of a tensor with dynamic dims as a map from the symbols
/// (`neuron.dims`), or null for a static shape.
AffineMapAttr dimsAttr(const json &shape, const Symbols &symbols,
                       MLIRContext *ctx) {
  SmallVector<AffineExpr> dims;
  bool dynamic = false;
  for (const json &d : shape) {
    if (d.is_string()) {
      rt::SizeExpr e = sizeExpr(d.get<std::string>());
      dynamic |= usesSymbols(e, symbols);
      dims.push_back(affineOf(e, symbols, ctx));
    } else {
      dims.push_back(getAffineConstantExpr(d.get<int64_t>(), ctx));
    }
  }
  if (!dynamic)
    return nullptr;
  return AffineMapAttr::get(AffineMap::get(0, symbols.size(), dims, ctx));
}

Type Importer::elementType(const std::string &dtype) const {
  MLIRContext *c = const_cast<MLIRContext *>(&ctx);
  if (dtype == "float32")
    return Float32Type::get(c);
  if (dtype == "bfloat16")
    return BFloat16Type::get(c);
  if (dtype == "float16")
    return Float16Type::get(c);
  if (dtype == "float8_e4m3fn")
    return Float8E4M3FNType::get(c);
  if (dtype == "float8_e5m2")
    return Float8E5M2Type::get(c);
  if (dtype == "int64")
    return IntegerType::get(c, 64);
  if (dtype == "int32")
    return IntegerType::get(c, 32);
  if (dtype == "int8")
    return IntegerType::get(c, 8);
  if (dtype == "uint8")
    return IntegerType::get(c, 8, IntegerType::Unsigned);
  // E8M0 scales as their bits (MLIR 19 has no such float type); only
  // _scaled_mm reads them (Importer::e8m0Values).
  if (dtype == "float8_e8m0fnu")
    return IntegerType::get(c, 8, IntegerType::Unsigned);
  if (dtype == "bool")
    return IntegerType::get(c, 1);
  unsupported("dtype " + dtype + " is not supported by the device");
}

Value Importer::tensor(const json &v) {
  require(isTensor(v), "expected a tensor argument");
  std::string name = v.at("ref").get<std::string>();
  int64_t index = intField(v, "index", 0);
  auto it = values.find({name, index});
  if (it == values.end())
    unsupported("refers to unknown value '" + name + "'");
  if (!it->second) {
    auto why = hostReasons.find(name);
    unsupported("depends on '" + name + "', which stays on the host" +
                (why == hostReasons.end() ? "" : " (" + why->second + ")"));
  }
  if (e8m0Values.count(name) && node &&
      node->at("target") != "aten._scaled_mm.default" &&
      node->at("target") != "aten._scaled_mm_v2.default")
    unsupported("reads '" + name +
                "', a float8_e8m0fnu tensor: the device takes those only as "
                "torch._scaled_mm's MX block scales");
  return it->second;
}

double Importer::number(const json &v) const {
  if (v.is_number())
    return v.get<double>();
  if (v.is_boolean())
    return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_object() && v.contains("float")) {
    std::string s = v.at("float").get<std::string>();
    if (s == "inf")
      return INFINITY;
    if (s == "-inf")
      return -INFINITY;
    if (s == "nan")
      return NAN;
  }
  unsupported("expected a number argument");
}

RankedTensorType Importer::resultType(size_t i) {
  const json &outs = node->at("outputs");
  require(i < outs.size(), "node lacks result metadata");
  const json &o = outs.at(i);
  require(o.is_object() && o.contains("shape") && o.contains("dtype"),
          "node result is not a tensor");
  return RankedTensorType::get(shapeOf(o.at("shape"), symbols),
                               elementType(o.at("dtype").get<std::string>()));
}

//===----------------------------------------------------------------------===//
// Builders
//===----------------------------------------------------------------------===//

Value Importer::splat(double value, RankedTensorType type) {
  if (!type.hasStaticShape()) {
    // A constant has static sizes: one element, broadcast (a splat along
    // every dim, which a fused group takes as an immediate).
    SmallVector<int64_t> one(type.getRank(), 1);
    return b.create<BroadcastOp>(currentLoc, type,
                                 splat(value, type.clone(one)));
  }
  Type elt = type.getElementType();
  Attribute scalar;
  if (auto f = dyn_cast<FloatType>(elt)) {
    scalar = FloatAttr::get(f, value);
  } else {
    require(std::isfinite(value), "non-finite value for an integer tensor");
    scalar = IntegerAttr::get(elt, elt.isInteger(1) ? (value != 0)
                                                    : (int64_t)value);
  }
  return b.create<ConstantOp>(currentLoc, type,
                              DenseElementsAttr::get(type, scalar));
}

Value Importer::castTo(Value v, Type elt) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getElementType() == elt)
    return v;
  return b.create<CastOp>(currentLoc, type.clone(elt), v);
}

Value Importer::broadcastTo(Value v, ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getShape() == shape)
    return v;
  require(type.getRank() <= (int64_t)shape.size(), "cannot broadcast");
  int64_t shift = shape.size() - type.getRank();
  for (int64_t i = 0; i < type.getRank(); ++i)
    require(type.getDimSize(i) == 1 || type.getDimSize(i) == shape[i + shift],
            "shapes do not broadcast");
  return b.create<BroadcastOp>(currentLoc, type.clone(shape), v);
}

Value Importer::reshape(Value v, ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getShape() == shape)
    return v;
  return b.create<ReshapeOp>(currentLoc, type.clone(shape), v);
}

Value Importer::transpose(Value v, ArrayRef<int64_t> perm) {
  auto type = cast<RankedTensorType>(v.getType());
  bool identity = true;
  SmallVector<int64_t> shape;
  for (auto [i, p] : llvm::enumerate(perm)) {
    identity &= (int64_t)i == p;
    shape.push_back(type.getDimSize(p));
  }
  if (identity)
    return v;
  return b.create<TransposeOp>(currentLoc, type.clone(shape), v,
                               b.getDenseI64ArrayAttr(perm));
}

Value Importer::unary(UnaryFn fn, Value v) {
  auto type = cast<RankedTensorType>(v.getType());
  auto out = fn == UnaryFn::logical_not ? type.clone(b.getI1Type()) : type;
  return b.create<UnaryOp>(currentLoc, out, fn, v);
}

Value Importer::binary(BinaryFn fn, Value lhs, Value rhs,
                       RankedTensorType type) {
  return b.create<BinaryOp>(currentLoc, type, fn, lhs, rhs);
}

Type Importer::promote(const json &a, const json &bArg) const {
  // Tensors decide; Python scalars are "weak" unless both are scalars.
  auto eltOf = [&](const json &v) -> Type {
    if (!isTensor(v))
      return {};
    return cast<RankedTensorType>(const_cast<Importer *>(this)->tensor(v).getType())
        .getElementType();
  };
  Type ta = eltOf(a), tb = eltOf(bArg);
  if (!ta && !tb) {
    bool anyFloat = !a.is_number_integer() || !bArg.is_number_integer();
    return anyFloat ? Type(Float32Type::get(b.getContext()))
                    : Type(IntegerType::get(b.getContext(), 64));
  }
  if (!ta || !tb) {
    Type t = ta ? ta : tb;
    const json &scalar = ta ? bArg : a;
    if (isa<IntegerType>(t) && !scalar.is_number_integer() &&
        !scalar.is_boolean())
      return Float32Type::get(b.getContext());
    return t;
  }
  if (ta == tb)
    return ta;
  bool fa = isa<FloatType>(ta), fb = isa<FloatType>(tb);
  if (fa != fb)
    return fa ? ta : tb;
  if (fa) // bf16 with f16 or f32: f32 holds both
    return Float32Type::get(b.getContext());
  return ta.getIntOrFloatBitWidth() >= tb.getIntOrFloatBitWidth() ? ta : tb;
}

Value Importer::operandAs(const json &v, Type elt, ArrayRef<int64_t> shape) {
  if (isTensor(v))
    return broadcastTo(castTo(tensor(v), elt), shape);
  return splat(number(v), RankedTensorType::get(shape, elt));
}

Value Importer::binaryArgs(BinaryFn fn, const json &lhs, const json &rhs,
                           Type computeElt, ArrayRef<int64_t> shape) {
  Value l = operandAs(lhs, computeElt, shape);
  Value r = operandAs(rhs, computeElt, shape);
  Type outElt = isPredicate(fn) ? b.getI1Type() : computeElt;
  return binary(fn, l, r, RankedTensorType::get(shape, outElt));
}

/// A sum over one dim of a few slices with larger dims after it (an MoE
/// layer's top-k sum over [tokens, k, hidden]) as adds of its slices, where
/// moving the dim innermost would transpose the whole tensor; null when the
/// reduction is not one. Over the leading dim, up to 4 slices, and floats of
/// more than two in float32 only (each add rounds, a reduction once): more
/// are one column sum on TensorE, reading the rows in place. Behind outer
/// dims that sum is one per outer index (each a matmul of k rows: a top-8
/// sum over 1024 tokens took 3.1 ms), so there up to 8 slices add (top-8 in
/// Qwen3-MoE, OLMoE and DeepSeek-V3), narrow floats in float32, rounded once
/// at the end as a reduction rounds.
Value Importer::sumOfSlices(ReduceFn fn, Value v, ArrayRef<bool> reduced) {
  auto type = cast<RankedTensorType>(v.getType());
  int64_t rank = type.getRank();
  if (fn != ReduceFn::sum || llvm::count(reduced, true) != 1)
    return Value();
  int64_t dim = llvm::find(reduced, true) - reduced.begin();
  int64_t n = type.getDimSize(dim);
  int64_t inner = 1;
  for (int64_t i = dim + 1; i < rank; ++i)
    inner *= type.getDimSize(i);
  bool perOuter = false; // more than one index before the dim
  for (int64_t i = 0; i < dim; ++i)
    perOuter |= type.isDynamicDim(i) || type.getDimSize(i) > 1;
  Type elt = type.getElementType();
  // Floats of more than two slices add in float32.
  bool inF32 = isa<FloatType>(elt) && n > 2;
  bool narrow = inF32 && elt.getIntOrFloatBitWidth() < 32;
  if (inner <= 1 || n < 2 || n > (perOuter ? 8 : 4) || elt.isInteger(1) ||
      (inF32 && !elt.isF32() && !(perOuter && narrow)))
    return Value();
  Type addElt = inF32 ? b.getF32Type() : elt;
  SmallVector<int64_t> shape(type.getShape()), kept;
  shape[dim] = 1;
  for (int64_t i = 0; i < rank; ++i)
    if (i != dim)
      kept.push_back(type.getDimSize(i));
  auto keptType = RankedTensorType::get(kept, addElt);
  Value sum;
  for (int64_t i = 0; i < n; ++i) {
    SmallVector<int64_t> offsets(rank, 0), strides(rank, 1);
    offsets[dim] = i;
    Value s = b.create<SliceOp>(currentLoc, type.clone(shape), v,
                                b.getDenseI64ArrayAttr(offsets),
                                b.getDenseI64ArrayAttr(strides));
    s = castTo(reshape(s, kept), addElt);
    sum = sum ? binary(BinaryFn::add, sum, s, keptType) : s;
  }
  return castTo(sum, elt);
}

Value Importer::reduce(ReduceFn fn, Value v, std::vector<int64_t> dims,
                       bool keepdim) {
  auto type = cast<RankedTensorType>(v.getType());
  int64_t rank = type.getRank();
  if (rank == 0)
    return v;
  if (dims.empty())
    for (int64_t i = 0; i < rank; ++i)
      dims.push_back(i);
  SmallVector<bool> reduced(rank, false);
  for (int64_t d : dims)
    reduced[normDim(d, rank)] = true;
  // Kept dims first, reduced dims last: reductions run along the free axis.
  SmallVector<int64_t> perm, kept, keptShape;
  for (int64_t i = 0; i < rank; ++i)
    if (!reduced[i]) {
      perm.push_back(i);
      keptShape.push_back(type.getDimSize(i));
    }
  int64_t count = 0;
  for (int64_t i = 0; i < rank; ++i)
    if (reduced[i]) {
      perm.push_back(i);
      ++count;
    }
  for (int64_t i = 0; i < rank; ++i) {
    require(!reduced[i] || !type.isDynamicDim(i),
            "not size-generic: a reduction over a dynamic dim");
    require(!reduced[i] || type.getDimSize(i) > 0,
            "reduction over an empty dimension");
  }
  Value r = sumOfSlices(fn, v, reduced);
  if (!r) {
    Value t = transpose(v, perm);
    r = b.create<ReduceOp>(currentLoc, type.clone(keptShape), fn, t,
                           (uint64_t)count);
  }
  if (!keepdim)
    return r;
  SmallVector<int64_t> shape;
  for (int64_t i = 0; i < rank; ++i)
    shape.push_back(reduced[i] ? 1 : type.getDimSize(i));
  return reshape(r, shape);
}

Value Importer::matmul(Value lhs, Value rhs) {
  auto l = cast<RankedTensorType>(lhs.getType());
  auto r = cast<RankedTensorType>(rhs.getType());
  require(isa<FloatType>(l.getElementType()),
          "integer matmul is not supported on TensorE");
  require(l.getRank() >= 1 && r.getRank() >= 1,
          "a matmul operand is 0-d (found by tests/fuzz/FuzzFxImport)");
  Type elt = l.getElementType();
  if (elt != r.getElementType())
    elt = b.getF32Type();
  lhs = castTo(lhs, elt);
  rhs = castTo(rhs, elt);
  SmallVector<int64_t> shape(l.getShape().drop_back());
  shape.push_back(r.getShape().back());
  auto type = RankedTensorType::get(shape, elt);
  if (l.getShape().back() == 0) // an empty sum
    return splat(0.0, type);
  return b.create<MatmulOp>(currentLoc, type, lhs, rhs);
}

//===----------------------------------------------------------------------===//
// Graph walk
//===----------------------------------------------------------------------===//

void Importer::placeholders(const json &n) {
  std::string name = n.at("name").get<std::string>();
  const json &outs = n.value("outputs", json::array());
  for (size_t i = 0; i < std::max<size_t>(1, outs.size()); ++i) {
    Value stand;
    try {
      node = &n;
      stand = b.create<UnrealizedConversionCastOp>(currentLoc,
                                                   TypeRange{resultType(i)},
                                                   ValueRange{})
                  .getResult(0);
    } catch (const Unsupported &u) {
      // A result the device cannot hold: its users stay on the host too.
      hostReasons[name] = u.reason;
    }
    values[{name, (int64_t)i}] = stand;
  }
}

Value Importer::importConstant(const json &c) {
  auto type = RankedTensorType::get(shapeOf(c.at("shape")),
                                    elementType(c.at("dtype").get<std::string>()));
  std::vector<char> bytes;
  if (auto err = llvm::decodeBase64(c.at("data").get<std::string>(), bytes))
    unsupported("constant '" + c.at("name").get<std::string>() +
                "' has corrupt data: " + llvm::toString(std::move(err)));
  DenseElementsAttr attr;
  int64_t n = type.getNumElements();
  if (type.getElementType().isInteger(1)) {
    require((int64_t)bytes.size() == n, "constant has the wrong size");
    SmallVector<bool> bits;
    for (char byte : bytes)
      bits.push_back(byte != 0);
    attr = DenseElementsAttr::get(type, bits);
  } else {
    int64_t width = type.getElementTypeBitWidth() / 8;
    require((int64_t)bytes.size() == n * width, "constant has the wrong size");
    bool splat = false;
    require(DenseElementsAttr::isValidRawBuffer(type, bytes, splat),
            "constant data does not fit its type");
    attr = DenseElementsAttr::getFromRawBuffer(type, bytes);
  }
  return b.create<ConstantOp>(currentLoc, type, attr);
}

void Importer::importNode(const json &n) {
  node = &n;
  std::string name = n.at("name").get<std::string>();
  std::string target = n.at("target").get<std::string>();
  currentLoc = NameLoc::get(b.getStringAttr(name), UnknownLoc::get(&ctx));
  if (auto it = n.find("loc"); it != n.end() && it->is_object())
    currentLoc = NameLoc::get(
        b.getStringAttr(name),
        FileLineColLoc::get(&ctx, (*it).value("file", std::string("?")),
                            intField(*it, "line", 0), intField(*it, "col", 0)));
  auto handler = handlers().find(target);
  if (handler == handlers().end())
    unsupported(target + " has no lowering to the device yet");
  Values results = handler->second(*this);
  require(results.size() == numResults() || numResults() == 0,
          "internal: handler produced the wrong number of results");
  for (auto [i, v] : llvm::enumerate(results)) {
    RankedTensorType expected = resultType(i);
    if (v.getType() != expected) {
      // Handlers compute in the promoted type; match PyTorch's result.
      auto got = cast<RankedTensorType>(v.getType());
      require(got.getShape() == expected.getShape(),
              "internal: shape mismatch for " + target);
      v = castTo(v, expected.getElementType());
    }
    stampDims(v, i);
    values[{name, (int64_t)i}] = v;
  }
}

/// A dynamic result's sizes as the document gives them, on the op that
/// computes it (`neuron.dims`): the lowering cannot always tell them from
/// the op's operands (a view that splits rows into [B, S]).
void Importer::stampDims(Value v, size_t i) {
  Operation *def = v.getDefiningOp();
  if (cast<RankedTensorType>(v.getType()).hasStaticShape() || !def ||
      def->getNumResults() != 1 || def->hasAttr(kDimsAttrName))
    return;
  auto it = shapes.find({node->at("name").get<std::string>(), (int64_t)i});
  if (it == shapes.end())
    return;
  try {
    if (AffineMapAttr dims = dimsAttr(*it->second, symbols, &ctx))
      def->setAttr(kDimsAttrName, dims);
  } catch (const Unsupported &) {
    // min/max sizes: the lowering says what it cannot size.
  }
}

OwningOpRef<ModuleOp> Importer::run(const json &doc,
                                    std::map<std::string, std::string> &failures,
                                    bool stopAtFirst) {
  if (doc.value("format", "") != "torchneuron-fx-graph" ||
      intField(doc, "version", 0) != 1) {
    failures[""] = "not a version-1 torchneuron FX graph document";
    return nullptr;
  }
  for (const json &n : doc.at("nodes")) {
    collectUses(n.value("args", json::array()));
    collectUses(n.value("kwargs", json::object()));
  }
  collectUses(doc.at("outputs"));
  OwningOpRef<ModuleOp> module = ModuleOp::create(b.getUnknownLoc());
  SmallVector<DictionaryAttr> symbolAttrs;
  Inputs inputs;
  if (failed(readSymbols(doc, symbolAttrs, failures)) ||
      failed(readInputs(doc, inputs, failures, stopAtFirst)))
    return nullptr;
  func::FuncOp func = createFunction(*module, doc, inputs, symbolAttrs);
  if (failed(importBody(doc, failures, stopAtFirst)) ||
      failed(returnOutputs(func, doc, failures)))
    return nullptr;
  return module;
}

LogicalResult
Importer::readSymbols(const json &doc, SmallVector<DictionaryAttr> &attrs,
                      std::map<std::string, std::string> &failures) {
  // Size parameters: index arguments after the tensors, named and bounded
  // by an argument attribute (Dynamo's range; no max when unbounded).
  try {
    const json &syms = doc.value("symbols", json::array());
    require(syms.is_array(), "'symbols' must be a list");
    for (const json &sym : syms) {
      require(sym.is_object() && sym.contains("name") &&
                  sym.at("name").is_string(),
              "a symbol needs a name");
      std::string name = sym.at("name").get<std::string>();
      rt::SizeExpr e = sizeExpr(name);
      require(e.kind == rt::SizeExpr::Kind::Param && e.name == name,
              "symbol name '" + name + "' is not a size parameter name");
      require(!symbols.count(name), "symbol '" + name + "' is listed twice");
      int64_t lo = intField(sym, "min", 0);
      require(lo >= 0, "symbol '" + name + "' has a negative minimum");
      SmallVector<NamedAttribute> fields{
          b.getNamedAttr("name", b.getStringAttr(name)),
          b.getNamedAttr("min", b.getI64IntegerAttr(lo))};
      if (sym.contains("max") && !sym.at("max").is_null()) {
        int64_t hi = intField(sym, "max", 0);
        require(hi >= lo, "symbol '" + name + "' has max < min");
        fields.push_back(b.getNamedAttr("max", b.getI64IntegerAttr(hi)));
      }
      symbols.emplace(name, symbols.size());
      attrs.push_back(b.getDictionaryAttr(fields));
    }
  } catch (const Unsupported &u) {
    failures[""] = u.reason;
    return failure();
  }
  return success();
}

LogicalResult Importer::readInputs(const json &doc, Inputs &inputs,
                                   std::map<std::string, std::string> &failures,
                                   bool stopAtFirst) {
  // An input the device cannot hold makes its users unsupported (checked
  // one by one); compiling a graph that reads it is an error.
  for (const json &in : doc.at("inputs")) {
    if (in.is_object() && in.contains("name") && in.contains("shape"))
      shapes[{in.at("name").get<std::string>(), 0}] = &in.at("shape");
    try {
      auto type =
          RankedTensorType::get(shapeOf(in.at("shape"), symbols),
                                elementType(in.at("dtype").get<std::string>()));
      // A dynamic input's sizes over the symbols: the lowering computes its
      // dims from the size arguments.
      AffineMapAttr dims = dimsAttr(in.at("shape"), symbols, &ctx);
      inputs.types.push_back(type);
      inputs.dims.push_back(dims);
      inputs.usable.push_back(true);
    } catch (const Unsupported &u) {
      if (stopAtFirst) {
        failures[""] = "input '" + in.at("name").get<std::string>() +
                       "': " + u.reason;
        return failure();
      }
      inputs.usable.push_back(false);
      hostReasons[in.at("name").get<std::string>()] = u.reason;
    }
  }
  return success();
}

func::FuncOp Importer::createFunction(ModuleOp module, const json &doc,
                                      Inputs &inputs,
                                      ArrayRef<DictionaryAttr> symbolAttrs) {
  unsigned numTensors = inputs.types.size();
  inputs.types.append(symbols.size(), b.getIndexType());
  b.setInsertionPointToEnd(module.getBody());
  auto func = b.create<func::FuncOp>(b.getUnknownLoc(),
                                     doc.value("name", std::string("graph")),
                                     b.getFunctionType(inputs.types, {}));
  Block *block = func.addEntryBlock();
  b.setInsertionPointToStart(block);
  for (unsigned i = 0, arg = 0; i < inputs.usable.size(); ++i) {
    if (!inputs.usable[i]) {
      values[{doc.at("inputs").at(i).at("name").get<std::string>(), 0}] =
          Value();
      continue;
    }
    const json &in = doc.at("inputs").at(i);
    if (AffineMapAttr dims = inputs.dims[arg])
      func.setArgAttr(arg, kDimsAttrName, dims);
    noteE8m0(in.at("name").get<std::string>(), in);
    values[{in.at("name").get<std::string>(), 0}] = block->getArgument(arg++);
  }
  for (auto [i, attr] : llvm::enumerate(symbolAttrs))
    func.setArgAttr(numTensors + i, kSizeAttrName, attr);
  return func;
}

LogicalResult Importer::importBody(const json &doc,
                                   std::map<std::string, std::string> &failures,
                                   bool stopAtFirst) {
  for (const json &c : doc.value("constants", json::array())) {
    std::string name = c.at("name").get<std::string>();
    noteE8m0(name, c);
    try {
      values[{name, 0}] = importConstant(c);
    } catch (const Unsupported &u) {
      failures[name] = u.reason;
      values[{name, 0}] = Value();
      if (stopAtFirst)
        return failure();
    }
  }
  for (const json &n : doc.at("nodes")) {
    std::string name = n.at("name").get<std::string>();
    if (auto outs = n.find("outputs"); outs != n.end() && outs->is_array())
      for (auto [i, o] : llvm::enumerate(*outs))
        if (o.is_object() && o.contains("shape")) {
          shapes[{name, (int64_t)i}] = &o.at("shape");
          noteE8m0(name, o);
        }
    try {
      importNode(n);
    } catch (const Unsupported &u) {
      std::string where;
      if (auto l = dyn_cast<FileLineColLoc>(
              cast<NameLoc>(currentLoc).getChildLoc()))
        where = " (at " + l.getFilename().str() + ":" +
                std::to_string(l.getLine()) + ")";
      // The partitioner reports target and source line itself.
      failures[name] = stopAtFirst ? n.at("target").get<std::string>() +
                                         ": " + u.reason + where
                                   : u.reason;
      if (stopAtFirst)
        return failure();
      // Later nodes are checked against a stand-in of the same type: on the
      // device they would receive this node's results as kernel inputs.
      placeholders(n);
    }
  }
  // Outputs of rejected nodes are not failures of their own.
  return success(failures.empty());
}

LogicalResult
Importer::returnOutputs(func::FuncOp func, const json &doc,
                        std::map<std::string, std::string> &failures) {
  SmallVector<Value> results;
  node = nullptr;
  for (const json &o : doc.at("outputs")) {
    try {
      results.push_back(tensor(o));
    } catch (const Unsupported &u) {
      failures["output"] = u.reason;
      return failure();
    }
  }
  b.create<func::ReturnOp>(b.getUnknownLoc(), results);
  func.setFunctionType(b.getFunctionType(func.getArgumentTypes(),
                                         ValueRange(results).getTypes()));
  // A dynamic result's sizes, as the document gives them: its output buffer
  // is shaped by them.
  for (auto [i, o] : llvm::enumerate(doc.at("outputs"))) {
    auto it =
        shapes.find({o.at("ref").get<std::string>(), intField(o, "index", 0)});
    if (it == shapes.end())
      continue;
    try {
      if (auto dims = dimsAttr(*it->second, symbols, &ctx))
        func.setResultAttr(i, kDimsAttrName, dims);
    } catch (const Unsupported &u) {
      failures["output"] = u.reason;
      return failure();
    }
  }
  return success();
}

void Importer::importModifier(const json &doc, Block *block) {
  Importer sub(ctx);
  sub.inModifier = true;
  sub.b.setInsertionPointToStart(block);
  const json &inputs = doc.at("inputs");
  require(inputs.is_array() && inputs.size() == block->getNumArguments(),
          "modifier has the wrong number of inputs");
  for (auto [i, in] : llvm::enumerate(inputs)) {
    auto type = RankedTensorType::get(
        shapeOf(in.at("shape")), elementType(in.at("dtype").get<std::string>()));
    require(type.getShape() ==
                cast<RankedTensorType>(block->getArgument(i).getType())
                    .getShape(),
            "modifier input " + std::to_string(i) + " has the wrong shape");
    block->getArgument(i).setType(type);
    sub.values[{in.at("name").get<std::string>(), 0}] = block->getArgument(i);
  }
  for (const json &n : doc.at("nodes")) {
    sub.collectUses(n.value("args", json::array()));
    sub.collectUses(n.value("kwargs", json::object()));
  }
  for (const json &c : doc.value("constants", json::array()))
    sub.values[{c.at("name").get<std::string>(), 0}] = sub.importConstant(c);
  for (const json &n : doc.at("nodes"))
    sub.importNode(n);
  const json &outputs = doc.at("outputs");
  require(outputs.is_array() && outputs.size() == 1,
          "modifier must return one value");
  sub.node = nullptr;
  sub.b.create<YieldOp>(currentLoc, ValueRange{sub.tensor(outputs[0])});
}

//===----------------------------------------------------------------------===//
// Handlers
//===----------------------------------------------------------------------===//

/// What the FlexAttention forward and backward nodes share: query, key and
/// value (arguments 0-2), the scale, the block size and classes, and the
/// tensors the modifiers capture.
struct FlexOperands {
  Value q, k, v;
  double scale = 0;
  std::vector<int64_t> blockSize;
  DenseElementsAttr blocks;
  SmallVector<Value> scoreBuffers, maskBuffers;
};

FlexOperands flexOperands(Importer &im) {
  FlexOperands f;
  f.q = im.tensor(im.arg(0));
  f.k = im.tensor(im.arg(1));
  f.v = im.tensor(im.arg(2));
  auto qType = cast<RankedTensorType>(f.q.getType());
  auto kType = cast<RankedTensorType>(f.k.getType());
  auto vType = cast<RankedTensorType>(f.v.getType());
  require(qType.getRank() == 4 && kType.getRank() == 4 && vType.getRank() == 4,
          "query, key and value must be [batch, heads, rows, dim]");
  require(isa<FloatType>(qType.getElementType()) &&
              qType.getElementType() == kType.getElementType() &&
              qType.getElementType() == vType.getElementType(),
          "query, key and value must have one float type");
  int64_t batch = qType.getDimSize(0), heads = qType.getDimSize(1);
  require(kType.getDimSize(1) > 0 && heads % kType.getDimSize(1) == 0,
          "key heads must divide query heads");
  f.scale = im.number(im.kwarg("scale"));
  f.blockSize = im.ints(im.kwarg("block_size"));
  require(f.blockSize.size() == 2 && f.blockSize[0] > 0 && f.blockSize[1] > 0,
          "block sizes must be positive");
  // A length known at run time only has one class for all its blocks.
  auto blocksOf = [](int64_t len, int64_t block) {
    return ShapedType::isDynamic(len) ? 1 : (len + block - 1) / block;
  };
  int64_t qBlocks = blocksOf(qType.getDimSize(2), f.blockSize[0]);
  int64_t kvBlocks = blocksOf(kType.getDimSize(2), f.blockSize[1]);
  auto i8 = IntegerType::get(&im.ctx, 8);
  const json &bj = im.kwarg("blocks");
  if (bj.is_null()) { // content unknown when compiled: every block partial
    auto type = RankedTensorType::get({1, 1, qBlocks, kvBlocks}, i8);
    f.blocks = DenseElementsAttr::get(type, APInt(8, 1));
  } else {
    require(bj.is_object() && bj.contains("shape") && bj.contains("data"),
            "malformed block classes");
    SmallVector<int64_t> shape = shapeOf(bj.at("shape"));
    require(shape.size() == 4 && (shape[0] == 1 || shape[0] == batch) &&
                (shape[1] == 1 || shape[1] == heads) && shape[2] == qBlocks &&
                shape[3] == kvBlocks,
            "block classes do not match the BlockMask's block counts");
    std::vector<char> bytes;
    if (auto err = llvm::decodeBase64(bj.at("data").get<std::string>(), bytes))
      unsupported("corrupt block classes: " + llvm::toString(std::move(err)));
    auto type = RankedTensorType::get(shape, i8);
    require((int64_t)bytes.size() == type.getNumElements(),
            "block classes have the wrong size");
    for (char c : bytes)
      require(c >= 0 && c <= 2, "block classes must be 0, 1 or 2");
    bool splat = false;
    require(DenseElementsAttr::isValidRawBuffer(type, bytes, splat),
            "block classes do not fit their type");
    f.blocks = DenseElementsAttr::getFromRawBuffer(type, bytes);
  }
  for (const json &t : im.kwarg("score_buffers"))
    f.scoreBuffers.push_back(im.tensor(t));
  for (const json &t : im.kwarg("mask_buffers"))
    f.maskBuffers.push_back(im.tensor(t));
  return f;
}

/// Imports the document `key` of the current node into `region`: `scalars`
/// 0-d arguments (fp32 at `floats`, i32 elsewhere; the document gives the
/// real types), then one per buffer.
void importModifierRegion(Importer &im, const char *key, Region &region,
                          unsigned scalars, ArrayRef<unsigned> floats,
                          ValueRange buffers) {
  Block *block = new Block();
  region.push_back(block);
  Type f32 = Float32Type::get(&im.ctx), i32 = IntegerType::get(&im.ctx, 32);
  for (unsigned i = 0; i < scalars; ++i)
    block->addArgument(
        RankedTensorType::get({}, llvm::is_contained(floats, i) ? f32 : i32),
        im.loc());
  for (Value buffer : buffers)
    block->addArgument(buffer.getType(), im.loc());
  try {
    im.importModifier(im.current().at(key), block);
  } catch (const Unsupported &u) {
    unsupported(std::string(key) + ": " + u.reason);
  }
}

/// `flex_attention(q, k, v, ...)`: one neuron.flex_attention op. The HOP's
/// log-sum-exp is in base 2; the op's is natural.
Values flexAttentionHandler(Importer &im) {
  FlexOperands f = flexOperands(im);
  RankedTensorType outType = im.resultType(0);
  auto lseType = RankedTensorType::get(im.resultType(1).getShape(),
                                       Float32Type::get(&im.ctx));
  auto op = im.b.create<FlexAttentionOp>(
      im.loc(), outType, lseType, f.q, f.k, f.v, f.scoreBuffers,
      f.maskBuffers, im.b.getF64FloatAttr(f.scale),
      im.b.getDenseI64ArrayAttr(f.blockSize), f.blocks);
  importModifierRegion(im, "score_mod", op.getScoreMod(), 5, {0},
                       f.scoreBuffers);
  importModifierRegion(im, "mask_mod", op.getMaskMod(), 4, {}, f.maskBuffers);
  if (failed(mlir::verify(op, /*verifyRecursively=*/false)))
    unsupported("the FlexAttention call is malformed (see the diagnostic)");
  Value lse = op.getLse();
  auto log2e = im.splat(1.0 / std::log(2.0), lseType);
  return {op.getOut(), im.binary(BinaryFn::mul, lse, log2e, lseType)};
}

/// `flex_attention_backward(q, k, v, out, lse, grad_out, ...)`: one
/// neuron.flex_attention_backward op; the joint graph (score_mod's
/// gradient) becomes its score_grad region. The HOP's lse is in base 2.
Values flexAttentionBackwardHandler(Importer &im) {
  FlexOperands f = flexOperands(im);
  Value out = im.tensor(im.arg(3)), lse2 = im.tensor(im.arg(4)),
        gradOut = im.tensor(im.arg(5));
  auto lseType = dyn_cast<RankedTensorType>(lse2.getType());
  require(lseType && lseType.getElementType().isF32(),
          "the log-sum-exp must be float32");
  Value lse = im.binary(BinaryFn::mul, lse2, im.splat(std::log(2.0), lseType),
                        lseType);
  auto op = im.b.create<FlexAttentionBackwardOp>(
      im.loc(), im.resultType(0), im.resultType(1), im.resultType(2), f.q,
      f.k, f.v, out, lse, gradOut, f.scoreBuffers, f.maskBuffers,
      im.b.getF64FloatAttr(f.scale), im.b.getDenseI64ArrayAttr(f.blockSize),
      f.blocks);
  importModifierRegion(im, "score_mod", op.getScoreMod(), 5, {0},
                       f.scoreBuffers);
  importModifierRegion(im, "score_grad", op.getScoreGrad(), 6, {0, 5},
                       f.scoreBuffers);
  importModifierRegion(im, "mask_mod", op.getMaskMod(), 4, {}, f.maskBuffers);
  if (failed(mlir::verify(op, /*verifyRecursively=*/false)))
    unsupported("the FlexAttention backward call is malformed (see the "
                "diagnostic)");
  return {op.getGradQuery(), op.getGradKey(), op.getGradValue()};
}

/// `table[i0, i1, ...]` with one 0-d index per dim, inside a FlexAttention
/// modifier: a gather from the flattened table.
Values modifierIndexHandler(Importer &im) {
  require(im.inModifier, "advanced indexing is supported inside FlexAttention "
                         "score_mod/mask_mod only");
  Value table = im.tensor(im.arg(0));
  auto tableType = cast<RankedTensorType>(table.getType());
  const json &indices = im.arg(1);
  require(indices.is_array() &&
              (int64_t)indices.size() == tableType.getRank() &&
              tableType.getRank() > 0,
          "index a captured tensor with one index per dimension");
  auto i64 = IntegerType::get(&im.ctx, 64);
  auto scalarI64 = RankedTensorType::get({}, i64);
  Value flat;
  int64_t stride = 1;
  for (int64_t d = tableType.getRank() - 1; d >= 0; --d) {
    require(im.isTensor(indices[d]), "index a captured tensor with tensors");
    Value idx = im.tensor(indices[d]);
    auto idxType = cast<RankedTensorType>(idx.getType());
    require(idxType.getRank() == 0 && idxType.getElementType().isSignlessInteger(),
            "indices into a captured tensor must be 0-d integers");
    Value term = im.castTo(idx, i64);
    if (stride != 1)
      term = im.binary(BinaryFn::mul, term, im.splat(stride, scalarI64),
                       scalarI64);
    flat = flat ? im.binary(BinaryFn::add, flat, term, scalarI64) : term;
    stride *= tableType.getDimSize(d);
  }
  Value rows = im.reshape(table, {tableType.getNumElements()});
  return {im.b.create<GatherOp>(im.loc(), im.resultType(), rows, flat)};
}

/// torch's functional collectives. The document gives each one the
/// process group its name resolves to ("group": {"name", "ranks"}; see
/// fx_json.py); avg is a sum divided by the group's size.
Values collectiveHandler(Importer &im, CollectiveKind kind) {
  const json &node = im.current();
  auto groupIt = node.find("group");
  require(groupIt != node.end() && groupIt->is_object() &&
              groupIt->contains("name") && (*groupIt)["name"].is_string() &&
              groupIt->contains("ranks"),
          "the document does not say which process group this collective "
          "runs in");
  std::string group = (*groupIt)["name"].get<std::string>();
  std::vector<int64_t> ranks = im.ints((*groupIt)["ranks"]);
  require(!ranks.empty(), "the collective's process group has no ranks");
  auto n = static_cast<int64_t>(ranks.size());
  // Arguments: (input, [reduce_op,] [group_size,] group_name).
  bool reduces = kind != CollectiveKind::all_gather;
  size_t next = 1;
  std::string reduceOp = "sum";
  if (reduces) {
    const json &op = im.arg(next++);
    require(op.is_string(), "expected the reduce op as a string");
    reduceOp = op.get<std::string>();
  }
  if (kind != CollectiveKind::all_reduce) {
    require(im.integer(im.arg(next++)) == n,
            "group_size differs from the size of group '" + group + "'");
  }
  const json &name = im.arg(next);
  require(name.is_string() && name.get<std::string>() == group,
          "the collective's group name differs from its document group");
  ReduceFn reduce = ReduceFn::sum;
  bool average = false;
  if (reduceOp == "max")
    reduce = ReduceFn::max;
  else if (reduceOp == "min")
    reduce = ReduceFn::min;
  else if (reduceOp == "avg")
    average = true;
  else
    require(reduceOp == "sum", "reduce op '" + reduceOp +
                                   "' is not supported on the device (sum, "
                                   "avg, max, min)");
  Value input = im.tensor(im.arg(0));
  auto inType = cast<RankedTensorType>(input.getType());
  RankedTensorType out = im.resultType();
  require(inType.getElementType() == out.getElementType(),
          "internal: collective changes the dtype");
  require(!inType.getElementType().isInteger(1),
          "collectives of bool tensors are not supported on the device");
  require(kind == CollectiveKind::all_reduce || inType.getRank() >= 1,
          "all_gather and reduce_scatter of a 0-d tensor");
  require(!average || isa<FloatType>(inType.getElementType()),
          "avg of an integer tensor is not supported on the device");
  Value result = im.b.create<CollectiveOp>(im.loc(), out, input, kind, reduce,
                                           im.b.getStringAttr(group),
                                           im.b.getDenseI64ArrayAttr(ranks));
  if (average)
    result = im.binary(BinaryFn::div, result, im.splat(double(n), out), out);
  return {result};
}

Values unaryHandler(Importer &im, UnaryFn fn) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  Type elt = out.getElementType();
  if (fn == UnaryFn::logical_not)
    return {im.unary(fn, x)};
  // Integer inputs of float functions compute in the result's float type.
  return {im.unary(fn, im.castTo(x, elt))};
}

Values binaryHandler(Importer &im, BinaryFn fn, bool withAlpha = false,
                     bool reversed = false) {
  RankedTensorType out = im.resultType();
  const json &lhs = im.arg(reversed ? 1 : 0), &rhs = im.arg(reversed ? 0 : 1);
  Type compute = isPredicate(fn) ? im.promote(lhs, rhs) : out.getElementType();
  if (isPredicate(fn) && (fn == BinaryFn::logical_and ||
                          fn == BinaryFn::logical_or ||
                          fn == BinaryFn::logical_xor))
    compute = im.b.getI1Type();
  if (withAlpha) {
    const json &alpha = im.param(2, "alpha");
    if (!alpha.is_null() && im.number(alpha) != 1.0) {
      Value scaled = im.binaryArgs(BinaryFn::mul, rhs, alpha, compute,
                                   out.getShape());
      Value l = im.operandAs(lhs, compute, out.getShape());
      return {im.binary(fn, l, scaled, out.clone(compute))};
    }
  }
  return {im.binaryArgs(fn, lhs, rhs, compute, out.getShape())};
}

Values viewHandler(Importer &im) {
  return {im.reshape(im.tensor(im.arg(0)), im.resultType().getShape())};
}

Values castHandler(Importer &im) {
  return {im.castTo(im.tensor(im.arg(0)), im.resultType().getElementType())};
}

Values reduceHandler(Importer &im, ReduceFn fn) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  std::vector<int64_t> dims = im.reductionDims();
  bool keepdim = im.flag(2, "keepdim");
  Type elt = out.getElementType();
  if (fn == ReduceFn::sum && elt.isInteger(64) &&
      cast<RankedTensorType>(x.getType()).getElementType().isInteger(1))
    elt = im.b.getI64Type();
  return {im.reduce(fn, im.castTo(x, elt), dims, keepdim)};
}

/// any/all: a max/min reduction of the values as 0/1, compared with 0.
Values anyAllHandler(Importer &im, bool isAny) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  std::vector<int64_t> dims = im.reductionDims();
  auto xt = cast<RankedTensorType>(x.getType());
  Value flags = x;
  if (!xt.getElementType().isInteger(1))
    flags = im.binary(BinaryFn::ne, x,
                      im.splat(0.0, xt), xt.clone(im.b.getI1Type()));
  Value values = im.castTo(flags, im.b.getF32Type());
  Value r = im.reduce(isAny ? ReduceFn::max : ReduceFn::min, values, dims,
                      im.flag(2, "keepdim"));
  auto rt = cast<RankedTensorType>(r.getType());
  require(rt.getShape() == out.getShape(), "unexpected any/all result shape");
  return {im.binary(BinaryFn::ne, r, im.splat(0.0, rt), out)};
}

/// Elements each output of a reduction over `dims` (all when empty) sums.
int64_t reducedCount(Importer &im, RankedTensorType in,
                     const std::vector<int64_t> &dims) {
  if (dims.empty() || in.getRank() == 0)
    return in.getNumElements(); // a 0-d tensor reduces to itself
  int64_t count = 1;
  for (int64_t d : dims)
    count *= in.getDimSize(im.normDim(d, in.getRank()));
  return count;
}

Values meanHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  auto in = cast<RankedTensorType>(x.getType());
  std::vector<int64_t> dims = im.reductionDims();
  int64_t count = reducedCount(im, in, dims);
  require(isa<FloatType>(out.getElementType()), "mean of integers");
  Value sum = im.reduce(ReduceFn::sum, im.castTo(x, out.getElementType()), dims,
                        im.flag(2, "keepdim"));
  auto sumType = cast<RankedTensorType>(sum.getType());
  return {im.binary(BinaryFn::mul, sum, im.splat(1.0 / count, sumType),
                    sumType)};
}

/// var (and mean, for var_mean): mean, centered squares, sum / (n - corr).
Values varHandler(Importer &im, bool withMean) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  auto in = cast<RankedTensorType>(x.getType());
  Type elt = out.getElementType();
  require(isa<FloatType>(elt), "variance of integers");
  std::vector<int64_t> dims = im.reductionDims();
  const json &corr = im.kwarg("correction");
  double correction = corr.is_null() ? 1.0 : im.number(corr);
  bool keepdim = im.flag(2, "keepdim"); // keyword-only in var.correction
  int64_t count = reducedCount(im, in, dims);
  x = im.castTo(x, elt);
  auto xt = cast<RankedTensorType>(x.getType());
  auto scaled = [&](Value v, double factor) {
    auto t = cast<RankedTensorType>(v.getType());
    return im.binary(BinaryFn::mul, v, im.splat(factor, t), t);
  };
  Value mean = scaled(im.reduce(ReduceFn::sum, x, dims, true), 1.0 / count);
  Value centered = im.binary(BinaryFn::sub, x,
                             im.broadcastTo(mean, xt.getShape()), xt);
  Value sq = im.binary(BinaryFn::mul, centered, centered, xt);
  double denom = std::max(0.0, count - correction);
  Value var = scaled(im.reduce(ReduceFn::sum, sq, dims, keepdim), 1.0 / denom);
  if (!withMean)
    return {var};
  return {var, im.reshape(mean, cast<RankedTensorType>(var.getType()).getShape())};
}

Values matmulHandler(Importer &im) {
  Value a = im.tensor(im.arg(0)), c = im.tensor(im.arg(1));
  return {im.matmul(a, c)};
}

Values addmmHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  Value prod = im.matmul(im.tensor(im.arg(1)), im.tensor(im.arg(2)));
  auto pt = cast<RankedTensorType>(prod.getType());
  const json &alpha = im.kwarg("alpha"), &beta = im.kwarg("beta");
  if (!alpha.is_null() && im.number(alpha) != 1.0)
    prod = im.binary(BinaryFn::mul, prod, im.splat(im.number(alpha), pt), pt);
  Value bias = im.operandAs(im.arg(0), pt.getElementType(), out.getShape());
  if (!beta.is_null() && im.number(beta) != 1.0)
    bias = im.binary(BinaryFn::mul, bias, im.splat(im.number(beta), pt), pt);
  return {im.binary(BinaryFn::add, bias, prod, pt)};
}

/// neuron.scaled_matmul of fp8 a [M, K] and c [K, N] as torch._scaled_mm and
/// _scaled_mm_v2 (`op`, in messages) define it: float32 scales tensorwise (one
/// element) or rowwise (M for a, N for c), or MX block scales
/// (float8_e8m0fnu, one per 32 values of K: [M, K / 32] for a and [N, K / 32]
/// for c, as MXTensor keeps them, not cuBLAS's swizzled layout); a bias [N]
/// (not with MX). use_fast_accum changes nothing (TensorE sums in fp32).
static Value scaledMatmul(Importer &im, const std::string &op, Value a, Value c,
                          Value scaleA, Value scaleB, const json &biasArg) {
  auto at = cast<RankedTensorType>(a.getType());
  auto ct = cast<RankedTensorType>(c.getType());
  auto isFp8 = [](Type t) { return isa<Float8E4M3FNType, Float8E5M2Type>(t); };
  require(at.getRank() == 2 && ct.getRank() == 2, op + " takes 2-d operands");
  require(isFp8(at.getElementType()) && isFp8(ct.getElementType()),
          op + " takes float8_e4m3fn or float8_e5m2 operands");
  int64_t m = at.getDimSize(0), k = at.getDimSize(1), n = ct.getDimSize(1);
  auto shapeText = [](RankedTensorType t) {
    std::string s = "[";
    for (int64_t i = 0; i < t.getRank(); ++i)
      s += (i ? ", " : "") + std::to_string(t.getDimSize(i));
    return s + "]";
  };
  auto isE8m0 = [](Value v) {
    return cast<RankedTensorType>(v.getType())
        .getElementType()
        .isUnsignedInteger(8);
  };
  if (isE8m0(scaleA) || isE8m0(scaleB)) {
    require(k % 32 == 0, op +
                             " with MX block scales needs K a multiple of "
                             "32, not " +
                             std::to_string(k));
    for (auto [s, rows, name] :
         {std::tuple{scaleA, m, "scale_a"}, std::tuple{scaleB, n, "scale_b"}}) {
      auto st = cast<RankedTensorType>(s.getType());
      require(isE8m0(s) && st.getShape() == ArrayRef<int64_t>{rows, k / 32},
              op + ": " + name + " of shape " + shapeText(st) +
                  " is not a supported MX block-scale layout (float8_e8m0fnu "
                  "[" +
                  std::to_string(rows) + ", " + std::to_string(k / 32) +
                  "], one scale per 32 values of K)");
    }
    require(biasArg.is_null(),
            op + " with MX block scales and a bias is not supported");
    return im.b.create<ScaledMatmulOp>(im.loc(), im.resultType(), a, c, scaleA,
                                       scaleB, Value());
  }
  // A scale as the vector neuron.scaled_matmul takes: [1] or [size].
  auto vector = [&](Value s, const char *name, int64_t size) {
    auto st = cast<RankedTensorType>(s.getType());
    require(st.getElementType().isF32(), op + ": " + name + " must be float32");
    if (st.getNumElements() == 1)
      return im.reshape(s, {1});
    require(st.getNumElements() == size &&
                llvm::count_if(st.getShape(),
                               [](int64_t d) { return d != 1; }) == 1,
            op + ": " + name + " of shape " + shapeText(st) +
                " is not a supported scale layout (tensorwise: one element; "
                "rowwise: " +
                std::to_string(size) + " elements)");
    return im.reshape(s, {size});
  };
  Value rowScale = vector(scaleA, "scale_a", m);
  Value colScale = vector(scaleB, "scale_b", n);
  Value bias;
  if (!biasArg.is_null()) {
    bias = im.tensor(biasArg);
    require(cast<RankedTensorType>(bias.getType()).getShape() ==
                ArrayRef<int64_t>{n},
            op + ": bias must be [N]");
  }
  return im.b.create<ScaledMatmulOp>(im.loc(), im.resultType(), a, c, rowScale,
                                     colScale, bias);
}

/// torch._scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result,
/// out_dtype, use_fast_accum): scaledMatmul's forms, without scale_result.
Values scaledMmHandler(Importer &im) {
  require(im.param(5, "scale_result").is_null(),
          "_scaled_mm with scale_result (an fp8 output's scale) is not "
          "supported");
  return {scaledMatmul(im, "_scaled_mm", im.tensor(im.param(0, "self")),
                       im.tensor(im.param(1, "mat2")),
                       im.tensor(im.param(2, "scale_a")),
                       im.tensor(im.param(3, "scale_b")), im.param(4, "bias"))};
}

/// torch.nn.functional.scaled_mm's op, _scaled_mm_v2(self, mat2, scale_a[],
/// recipe_a[], swizzle_a[], scale_b[], recipe_b[], swizzle_b[], bias,
/// out_dtype, contraction_dim, use_fast_accum): one scale per operand whose
/// recipe (torch's ScalingType) is TensorWise, RowWise or BlockWise1x32,
/// unswizzled; scaledMatmul's forms.
Values scaledMmV2Handler(Importer &im) {
  enum Recipe : int64_t { TensorWise = 0, RowWise = 1, BlockWise1x32 = 3 };
  const char *op = "scaled_mm";
  auto one = [&](size_t scaleIndex, const char *scaleName, size_t recipeIndex,
                 const char *recipeName, size_t swizzleIndex,
                 const char *swizzleName) {
    const json &scales = im.param(scaleIndex, scaleName);
    std::vector<int64_t> recipes = im.ints(im.param(recipeIndex, recipeName));
    std::vector<int64_t> swizzles =
        im.ints(im.param(swizzleIndex, swizzleName));
    require(scales.is_array() && scales.size() == 1 && recipes.size() == 1,
            std::string(op) + ": " + scaleName +
                " with more than one scale (nested scaling) is not supported");
    require(swizzles.empty() || (swizzles.size() == 1 && swizzles[0] == 0),
            std::string(op) + ": " + scaleName +
                " swizzled (SWIZZLE_32_4_4, cuBLAS's layout) is not "
                "supported; pass NO_SWIZZLE scales [rows, K / 32]");
    Value s = im.tensor(scales[0]);
    bool e8m0 = cast<RankedTensorType>(s.getType())
                    .getElementType()
                    .isUnsignedInteger(8);
    int64_t recipe = recipes[0];
    require(recipe == TensorWise || recipe == RowWise ||
                recipe == BlockWise1x32,
            std::string(op) + ": " + recipeName + " " + std::to_string(recipe) +
                " is not supported (TensorWise, RowWise, BlockWise1x32)");
    require((recipe == BlockWise1x32) == e8m0,
            std::string(op) + ": " + scaleName +
                (e8m0 ? " is float8_e8m0fnu, which only BlockWise1x32 takes"
                      : " must be float8_e8m0fnu for BlockWise1x32"));
    require(recipe != TensorWise ||
                cast<RankedTensorType>(s.getType()).getNumElements() == 1,
            std::string(op) + ": a TensorWise " + scaleName +
                " has one element");
    return s;
  };
  Value scaleA = one(2, "scale_a", 3, "recipe_a", 4, "swizzle_a");
  Value scaleB = one(5, "scale_b", 6, "recipe_b", 7, "swizzle_b");
  const json &dims = im.param(10, "contraction_dim");
  require(dims.is_null() || im.ints(dims).empty() ||
              im.ints(dims) == std::vector<int64_t>{1, 0},
          std::string(op) + ": only contraction_dim (1, 0) is supported");
  return {scaledMatmul(im, op, im.tensor(im.param(0, "self")),
                       im.tensor(im.param(1, "mat2")), scaleA, scaleB,
                       im.param(8, "bias"))};
}

/// torch._grouped_mm(self, mat2, offs, bias, out_dtype) with rows in groups:
/// [M, K] x [G, K, N]. The offsets' values are size parameters the document
/// names `<offs>__end<g>` (fx_json.py binds them from the offsets input at
/// each call), so the program serves every routing.
Values groupedMmHandler(Importer &im) {
  Value a = im.tensor(im.param(0, "self")), w = im.tensor(im.param(1, "mat2"));
  auto at = cast<RankedTensorType>(a.getType());
  auto wt = cast<RankedTensorType>(w.getType());
  require(at.getRank() == 2 && wt.getRank() == 3,
          "_grouped_mm: only [M, K] x [G, K, N] (rows in groups)");
  require(at.getElementType() == wt.getElementType(),
          "_grouped_mm: operands of different dtypes");
  require(im.param(3, "bias").is_null(), "_grouped_mm with a bias");
  const json &offs = im.param(2, "offs");
  require(im.isTensor(offs), "_grouped_mm without offsets");
  std::string base = offs.at("ref").get<std::string>();
  SmallVector<Value> ends;
  for (int64_t g = 0; g < wt.getDimSize(0); ++g) {
    Value end = im.symbolValue(base + "__end" + std::to_string(g));
    require(bool(end), "_grouped_mm: offsets that are not a kernel input "
                       "(their values bind the groups' row counts)");
    ends.push_back(end);
  }
  return {im.b.create<GroupedMatmulOp>(im.loc(), im.resultType(), a, w, ends)};
}

Values permuteHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  int64_t rank = cast<RankedTensorType>(x.getType()).getRank();
  std::vector<int64_t> perm = im.ints(im.arg(1));
  for (int64_t &p : perm)
    p = im.normDim(p, rank);
  return {im.transpose(x, perm)};
}

Values transposeHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  int64_t rank = cast<RankedTensorType>(x.getType()).getRank();
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i)
    perm.push_back(i);
  if (rank >= 2) {
    int64_t d0 = im.normDim(im.arg(1).is_null() ? 0 : im.integer(im.arg(1)), rank);
    int64_t d1 = im.normDim(im.arg(2).is_null() ? 1 : im.integer(im.arg(2)), rank);
    std::swap(perm[d0], perm[d1]);
  }
  return {im.transpose(x, perm)};
}

Values expandHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  return {im.broadcastTo(x, im.resultType().getShape())};
}

Values sliceHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  auto type = cast<RankedTensorType>(x.getType());
  int64_t rank = type.getRank();
  int64_t dim = im.dimParam(1, rank);
  const json &startArg = im.param(2, "start"), &endArg = im.param(3, "end"),
             &stepArg = im.param(4, "step");
  if (type.isDynamicDim(dim)) {
    // All of a dynamic dim (`x[:, 0:]`, Transformers' `logits_to_keep=0`) is
    // the tensor itself; any other part of it has a run-time offset or size.
    auto isInt = [](const json &v, int64_t value) {
      return v.is_number_integer() && v.get<int64_t>() == value;
    };
    bool toTheEnd = endArg.is_null() || (endArg.is_number_integer() &&
                                         endArg.get<int64_t>() >= (1LL << 62));
    require((startArg.is_null() || isInt(startArg, 0)) && toTheEnd &&
                (stepArg.is_null() || isInt(stepArg, 1)),
            "not size-generic: a slice along a dynamic dim");
    return {x};
  }
  int64_t size = type.getDimSize(dim);
  int64_t start = startArg.is_null() ? 0 : im.integer(startArg);
  int64_t step = stepArg.is_null() ? 1 : im.integer(stepArg);
  require(step > 0, "slice step must be positive");
  if (start < 0)
    start += size;
  start = std::clamp<int64_t>(start, 0, size);
  RankedTensorType out = im.resultType();
  if (isEmpty(out))
    start = 0;
  SmallVector<int64_t> offsets(rank, 0), strides(rank, 1);
  offsets[dim] = start;
  strides[dim] = step;
  return {im.b.create<SliceOp>(im.loc(), out, x,
                               im.b.getDenseI64ArrayAttr(offsets),
                               im.b.getDenseI64ArrayAttr(strides))};
}

Values selectHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  auto type = cast<RankedTensorType>(x.getType());
  int64_t rank = type.getRank();
  int64_t dim = im.normDim(im.integer(im.arg(1)), rank);
  int64_t index = im.integer(im.arg(2));
  if (index < 0)
    index += type.getDimSize(dim);
  require(index >= 0 && index < type.getDimSize(dim), "index out of range");
  SmallVector<int64_t> offsets(rank, 0), strides(rank, 1),
      shape(type.getShape());
  offsets[dim] = index;
  shape[dim] = 1;
  Value s = im.b.create<SliceOp>(im.loc(), type.clone(shape), x,
                                 im.b.getDenseI64ArrayAttr(offsets),
                                 im.b.getDenseI64ArrayAttr(strides));
  return {im.reshape(s, im.resultType().getShape())};
}

Values catHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  const json &list = im.arg(0);
  require(list.is_array(), "expected a list of tensors");
  int64_t dim = im.dimParam(1, out.getRank());
  SmallVector<Value> inputs;
  for (const json &t : list) {
    Value v = im.castTo(im.tensor(t), out.getElementType());
    auto vt = cast<RankedTensorType>(v.getType());
    // Legacy cat accepts 1-d empty tensors next to anything.
    if (isEmpty(vt) && vt.getRank() != out.getRank())
      continue;
    inputs.push_back(v);
  }
  require(!inputs.empty(), "cat of nothing");
  if (inputs.size() == 1)
    return {inputs[0]};
  return {im.b.create<ConcatOp>(im.loc(), out, inputs,
                                im.b.getI64IntegerAttr(dim))};
}

Values fullHandler(Importer &im, size_t valueArg) {
  return {im.splat(im.number(im.arg(valueArg)), im.resultType())};
}

Values arangeHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  // aten.arange.default(end) or arange.start(_step)(start, end, step)
  double start = 0, step = 1;
  if (!im.arg(1).is_null() && !im.arg(1).is_object()) {
    start = im.number(im.arg(0));
    if (!im.arg(2).is_null() && !im.arg(2).is_object())
      step = im.number(im.arg(2));
  }
  require(
      out.hasStaticShape(),
      "not size-generic: torch.arange over a length known only at run time");
  int64_t n = out.getNumElements();
  Type elt = out.getElementType();
  // Index sequences are folded to constants.
  SmallVector<Attribute> elements;
  for (int64_t i = 0; i < n; ++i) {
    double v = start + step * (double)i;
    elements.push_back(isa<FloatType>(elt)
                           ? Attribute(FloatAttr::get(elt, v))
                           : Attribute(IntegerAttr::get(elt, (int64_t)v)));
  }
  return {im.b.create<ConstantOp>(im.loc(), out,
                                  DenseElementsAttr::get(out, elements))};
}

Values whereHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  Value cond = im.operandAs(im.arg(0), im.b.getI1Type(), out.getShape());
  Value t = im.operandAs(im.arg(1), out.getElementType(), out.getShape());
  Value f = im.operandAs(im.arg(2), out.getElementType(), out.getShape());
  return {im.b.create<SelectOp>(im.loc(), out, cond, t, f)};
}

Values clampHandler(Importer &im, const json &lo, const json &hi) {
  RankedTensorType out = im.resultType();
  Value x = im.operandAs(im.arg(0), out.getElementType(), out.getShape());
  if (!lo.is_null())
    x = im.binary(BinaryFn::max, x,
                  im.operandAs(lo, out.getElementType(), out.getShape()), out);
  if (!hi.is_null())
    x = im.binary(BinaryFn::min, x,
                  im.operandAs(hi, out.getElementType(), out.getShape()), out);
  return {x};
}

Values gatherRowsHandler(Importer &im, Value table, Value indices) {
  RankedTensorType out = im.resultType();
  return {im.b.create<GatherOp>(im.loc(), out, table, indices)};
}

/// Integers the engines' fp32 arithmetic holds exactly: below 2^24.
constexpr int64_t kExactIntegers = int64_t(1) << 24;

/// table[..., i_0, ..., i_{j-1}, ...] with integer index tensors (of one
/// broadcast shape) on the adjacent dims [first, first + j): the indexed dims
/// move to the front and flatten into the rows of a table, the indices into
/// one row number (with `wrapNegative`, negative ones count from the end, as
/// advanced indexing does; index_select rejects them at run time), and
/// one gather (rows by indirect DMA) picks them. The result is the dims
/// before `first`, the index shape, then the dims after.
Value gatherDims(Importer &im, Value table, int64_t first,
                 ArrayRef<Value> indices, ArrayRef<int64_t> indexShape,
                 bool wrapNegative) {
  auto tableType = cast<RankedTensorType>(table.getType());
  ArrayRef<int64_t> shape = tableType.getShape();
  int64_t rank = tableType.getRank(), count = indices.size();
  auto i64 = IntegerType::get(&im.ctx, 64);
  auto indexType = RankedTensorType::get(indexShape, i64);
  auto predType = RankedTensorType::get(indexShape, im.b.getI1Type());
  int64_t stride = 1;
  for (int64_t k = 0; k < count; ++k)
    stride *= shape[first + k];
  // The engines compute in fp32: integers are exact below 2^24. A row
  // number beyond (x[arange(B), labels] of B x V logits) is found in two
  // gathers: of blocks of `block` rows (block | the last indexed dim, so
  // the block's number and the row within it are exact), then of the row
  // within each gathered block.
  int64_t block = 1, picks = 1;
  for (int64_t d : indexShape)
    picks *= d;
  if (count > 1 && stride > kExactIntegers) {
    int64_t last = shape[first + count - 1];
    while (stride / block > kExactIntegers && last % (2 * block) == 0)
      block *= 2;
    require(stride / block <= kExactIntegers && picks * block <= kExactIntegers,
            "indexing " + std::to_string(stride) +
                " positions: row numbers past 2^24 are not exact on the "
                "engines");
  }
  Value row, within;
  int64_t at = 1;
  for (int64_t k = count - 1; k >= 0; --k) {
    int64_t size = shape[first + k];
    Value idx = im.broadcastTo(im.castTo(indices[k], i64), indexShape);
    if (wrapNegative) {
      Value negative =
          im.binary(BinaryFn::lt, idx, im.splat(0, indexType), predType);
      Value wrapped =
          im.binary(BinaryFn::add, idx, im.splat(size, indexType), indexType);
      idx = im.b.create<SelectOp>(im.loc(), indexType, negative, wrapped, idx);
    }
    if (k == count - 1 && block > 1) {
      // idx = block * (idx / block) + within: the row within its block.
      within = im.binary(BinaryFn::remainder, idx, im.splat(block, indexType),
                         indexType);
      idx = im.binary(BinaryFn::div,
                      im.binary(BinaryFn::sub, idx, within, indexType),
                      im.splat(block, indexType), indexType);
    } else if (at / block != 1) {
      idx = im.binary(BinaryFn::mul, idx, im.splat(at / block, indexType),
                      indexType);
    }
    row = row ? im.binary(BinaryFn::add, row, idx, indexType) : idx;
    at *= size;
  }
  SmallVector<int64_t> perm, rows = {stride};
  for (int64_t d = first; d < first + count; ++d)
    perm.push_back(d);
  for (int64_t d = 0; d < rank; ++d)
    if (d < first || d >= first + count) {
      perm.push_back(d);
      rows.push_back(shape[d]);
    }
  Value flat = im.reshape(im.transpose(table, perm), rows);
  SmallVector<int64_t> gathered(indexShape);
  llvm::append_range(gathered, ArrayRef<int64_t>(rows).drop_front());
  Value result;
  if (block == 1) {
    result =
        im.b.create<GatherOp>(im.loc(), tableType.clone(gathered), flat, row);
  } else {
    // Blocks of `block` rows, then in the [picks * block] rows they make,
    // pick p's row p * block + within.
    SmallVector<int64_t> blocks = {stride / block, block},
                         blockRows(indexShape);
    llvm::append_range(blocks, ArrayRef<int64_t>(rows).drop_front());
    llvm::append_range(blockRows, ArrayRef<int64_t>(blocks).drop_front());
    Value chosen = im.b.create<GatherOp>(im.loc(), tableType.clone(blockRows),
                                         im.reshape(flat, blocks), row);
    SmallVector<int64_t> pickedRows = {picks * block};
    llvm::append_range(pickedRows, ArrayRef<int64_t>(rows).drop_front());
    SmallVector<int64_t> starts;
    for (int64_t p = 0; p < picks; ++p)
      starts.push_back(p * block);
    Value first = im.b.create<ConstantOp>(
        im.loc(), indexType,
        DenseElementsAttr::get(indexType, ArrayRef<int64_t>(starts)));
    result = im.b.create<GatherOp>(
        im.loc(), tableType.clone(gathered), im.reshape(chosen, pickedRows),
        im.binary(BinaryFn::add, first, within, indexType));
  }
  if (first == 0)
    return result;
  // [index..., before..., after...] -> [before..., index..., after...]
  int64_t ir = indexShape.size();
  SmallVector<int64_t> back;
  for (int64_t d = 0; d < first; ++d)
    back.push_back(ir + d);
  for (int64_t d = 0; d < ir; ++d)
    back.push_back(d);
  for (int64_t d = ir + first; d < (int64_t)gathered.size(); ++d)
    back.push_back(d);
  return im.transpose(result, back);
}

/// aten.index.Tensor: advanced indexing by integer tensors on adjacent dims
/// (a run of non-None indices; None keeps a dim whole).
Values indexHandler(Importer &im) {
  if (im.inModifier)
    return modifierIndexHandler(im);
  Value table = im.tensor(im.arg(0));
  auto tableType = cast<RankedTensorType>(table.getType());
  const json &list = im.arg(1);
  require(list.is_array() && !list.empty() &&
              (int64_t)list.size() <= tableType.getRank(),
          "index with at most one index per dimension");
  int64_t first = -1, last = -1;
  for (int64_t d = 0; d < (int64_t)list.size(); ++d)
    if (!list[d].is_null()) {
      if (first < 0)
        first = d;
      last = d;
    }
  require(first >= 0, "index without index tensors");
  SmallVector<Value> indices;
  SmallVector<int64_t> shape;
  for (int64_t d = first; d <= last; ++d) {
    require(!list[d].is_null(),
            "index tensors separated by a full slice (their dims go first "
            "in the result)");
    require(im.isTensor(list[d]), "index with tensors");
    Value idx = im.tensor(list[d]);
    auto idxType = cast<RankedTensorType>(idx.getType());
    require(idxType.getElementType().isSignlessInteger() &&
                !idxType.getElementType().isInteger(1),
            "indexing by a boolean mask has a data-dependent shape");
    // numpy broadcasting of the index shapes
    ArrayRef<int64_t> s = idxType.getShape();
    SmallVector<int64_t> merged(std::max(shape.size(), s.size()), 1);
    for (size_t i = 0; i < merged.size(); ++i) {
      int64_t a = i < merged.size() - shape.size()
                      ? 1
                      : shape[i - (merged.size() - shape.size())];
      int64_t c =
          i < merged.size() - s.size() ? 1 : s[i - (merged.size() - s.size())];
      require(a == c || a == 1 || c == 1, "index shapes do not broadcast");
      merged[i] = a == 1 ? c : a;
    }
    shape = merged;
    indices.push_back(idx);
  }
  RankedTensorType out = im.resultType();
  Value result = gatherDims(im, table, first, indices, shape,
                            /*wrapNegative=*/true);
  require(cast<RankedTensorType>(result.getType()).getShape() == out.getShape(),
          "internal: index result shape differs from the graph's");
  return {result};
}

/// aten.index_put in the row form the decompositions leave it in
/// (decompositions.index_put): input[idx] = values (+= with accumulate) with
/// one integer index tensor on dim 0, values broadcast to idx.shape ++
/// input.shape[1:]. Negative indices count from the end. An indirect DMA
/// writes the rows (neuron.scatter).
Values indexPutHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  Value input = im.tensor(im.arg(0));
  const json &list = im.arg(1);
  require(list.is_array() && list.size() == 1 && im.isTensor(list[0]),
          "index_put with one index tensor on dim 0 (the decompositions "
          "bring the others to this form)");
  require(out.getRank() >= 1, "index_put into a 0-d tensor");
  Value idx = im.tensor(list[0]);
  auto idxType = cast<RankedTensorType>(idx.getType());
  require(idxType.getElementType().isSignlessInteger() &&
              !idxType.getElementType().isInteger(1),
          "index_put by a boolean mask");
  auto i64 = IntegerType::get(&im.ctx, 64);
  auto indexType = RankedTensorType::get(idxType.getShape(), i64);
  idx = im.castTo(idx, i64);
  Value negative =
      im.binary(BinaryFn::lt, idx, im.splat(0, indexType),
                RankedTensorType::get(idxType.getShape(), im.b.getI1Type()));
  Value wrapped = im.binary(BinaryFn::add, idx,
                            im.splat(out.getDimSize(0), indexType), indexType);
  idx = im.b.create<SelectOp>(im.loc(), indexType, negative, wrapped, idx);
  SmallVector<int64_t> valuesShape(idxType.getShape());
  llvm::append_range(valuesShape, out.getShape().drop_front());
  Value values = im.operandAs(im.arg(2), out.getElementType(), valuesShape);
  auto scatter = im.b.create<ScatterOp>(
      im.loc(), out, im.castTo(input, out.getElementType()), idx, values);
  if (im.flag(3, "accumulate")) {
    require(!out.getElementType().isInteger(1),
            "index_put accumulating booleans");
    scatter.setAccumulate(true);
  }
  return {scatter.getResult()};
}

/// torchneuron.unpermute_rows(rows, perm): out[perm[i]] = rows[i], perm a
/// permutation of the rows (python/torchneuron/rewrite.py puts it where the
/// graph inverts a sort's indices to put its rows back).
Values unpermuteRowsHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  Value rows = im.tensor(im.arg(0));
  Value perm = im.tensor(im.arg(1));
  auto permType = cast<RankedTensorType>(perm.getType());
  require(out.getRank() >= 1 && permType.getRank() == 1 &&
              permType.getDimSize(0) == out.getDimSize(0) &&
              permType.getElementType().isSignlessInteger() &&
              !permType.getElementType().isInteger(1),
          "unpermute_rows takes one integer index per row");
  perm = im.castTo(perm, IntegerType::get(&im.ctx, 64));
  rows = im.castTo(rows, out.getElementType());
  auto scatter = im.b.create<ScatterOp>(im.loc(), out, rows, perm, rows);
  scatter.setPermutation(true);
  return {scatter.getResult()};
}

/// The cumulative sum (aten.cumsum): the `dtype` argument, or integers and
/// booleans widening to int64, is the result type; the input is converted
/// first where PyTorch converts it (booleans, another float type).
Values cumsumHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  Value x = im.tensor(im.arg(0));
  auto xType = cast<RankedTensorType>(x.getType());
  Type elt = out.getElementType();
  Type in = xType.getElementType();
  if (in.isInteger(1) || (isa<FloatType>(in) && in != elt))
    x = im.castTo(x, elt);
  int64_t dim = im.normDim(im.integer(im.arg(1)), xType.getRank());
  if (xType.getRank() == 0)
    return {im.castTo(x, elt)};
  return {im.b.create<CumsumOp>(im.loc(), out, x, dim)};
}

/// topk(x, k, dim, largest) and sort(x, dim, descending) (k = the whole
/// dim) as neuron.topk along the last dim; another dim is transposed there
/// and back.
Values selectionHandler(Importer &im, Value x, int64_t k, int64_t dim,
                        bool largest) {
  using ::neuron::compiler::kMaxSelectRow, ::neuron::compiler::kMaxSelectWork;
  auto xType = cast<RankedTensorType>(x.getType());
  RankedTensorType values = im.resultType(0), indices = im.resultType(1);
  require(!xType.getElementType().isInteger(1),
          "sorting booleans is not supported on the device");
  if (xType.getRank() == 0) // one element: itself, at index 0
    return {x, im.splat(0, indices)};
  int64_t rank = xType.getRank();
  int64_t n = xType.getDimSize(dim);
  require(n <= kMaxSelectRow && k * n <= kMaxSelectWork,
          "selecting " + std::to_string(k) + " of " + std::to_string(n) +
              " elements is more than the device's select rounds take (k * "
              "n <= " +
              std::to_string(kMaxSelectWork) + ")");
  SmallVector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    if (d != dim)
      perm.push_back(d);
  perm.push_back(dim);
  Value moved = im.transpose(x, perm);
  SmallVector<int64_t> shape(
      cast<RankedTensorType>(moved.getType()).getShape());
  shape.back() = k;
  auto op = im.b.create<TopKOp>(
      im.loc(), values.clone(shape), indices.clone(shape), moved,
      im.b.getI64IntegerAttr(k), im.b.getBoolAttr(largest));
  SmallVector<int64_t> back(rank);
  for (int64_t d = 0; d < rank; ++d)
    back[perm[d]] = d;
  return {im.transpose(op.getValues(), back),
          im.transpose(op.getIndices(), back)};
}

Values topkHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  int64_t rank = cast<RankedTensorType>(x.getType()).getRank();
  int64_t k = im.integer(im.arg(1));
  const json &largest = im.param(3, "largest");
  return selectionHandler(im, x, k, im.dimParam(2, rank, -1),
                          largest.is_null() || largest.get<bool>());
}

/// sort.default(x, dim, descending) and sort.stable(x, *, stable, dim,
/// descending): the device's sort is stable either way.
Values sortHandler(Importer &im, bool stableOverload) {
  Value x = im.tensor(im.arg(0));
  auto xType = cast<RankedTensorType>(x.getType());
  int64_t rank = xType.getRank();
  int64_t dim = stableOverload ? im.normDim(im.kwarg("dim").is_null()
                                                ? -1
                                                : im.integer(im.kwarg("dim")),
                                            rank)
                               : im.dimParam(1, rank, -1);
  bool descending = stableOverload ? im.kwarg("descending").is_boolean() &&
                                         im.kwarg("descending").get<bool>()
                                   : im.flag(2, "descending");
  int64_t n = rank == 0 ? 1 : xType.getDimSize(dim);
  return selectionHandler(im, x, n, dim, descending);
}

Values divModeHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  const json &mode = im.kwarg("rounding_mode");
  // Eager floors the f32 quotient of 16-bit floats but truncates the
  // quotient already rounded to the result dtype: do the same.
  Type compute = out.getElementType();
  bool floorMode = mode.is_string() && mode.get<std::string>() == "floor";
  if (isa<IntegerType>(compute) || (floorMode && !compute.isF32()))
    compute = im.b.getF32Type();
  Value q = im.binaryArgs(BinaryFn::div, im.arg(0), im.arg(1), compute,
                          out.getShape());
  if (mode.is_string()) {
    std::string m = mode.get<std::string>();
    require(m == "trunc" || m == "floor", "unknown rounding mode " + m);
    q = im.unary(m == "trunc" ? UnaryFn::trunc : UnaryFn::floor, q);
  }
  return {im.castTo(q, out.getElementType())};
}

Values powHandler(Importer &im) {
  RankedTensorType out = im.resultType();
  const json &e = im.arg(1);
  if (!im.isTensor(e) && e.is_number()) {
    double p = im.number(e);
    Value x = im.castTo(im.tensor(im.arg(0)), out.getElementType());
    if (p == 1.0)
      return {x};
    if (p == 2.0)
      return {im.binary(BinaryFn::mul, x, x, out)};
    if (p == 0.5)
      return {im.unary(UnaryFn::sqrt, x)};
    if (p == -0.5)
      return {im.unary(UnaryFn::rsqrt, x)};
    if (p == -1.0)
      return {im.unary(UnaryFn::reciprocal, x)};
  }
  return binaryHandler(im, BinaryFn::pow);
}

Values geluHandler(Importer &im) {
  const json &approx = im.kwarg("approximate");
  bool tanh = approx.is_string() && approx.get<std::string>() == "tanh";
  return unaryHandler(im, tanh ? UnaryFn::gelu_tanh : UnaryFn::gelu);
}

Values splitHandler(Importer &im, bool withSizes) {
  Value x = im.tensor(im.arg(0));
  auto type = cast<RankedTensorType>(x.getType());
  int64_t dim = im.dimParam(2, type.getRank());
  int64_t size = type.getDimSize(dim);
  std::vector<int64_t> sizes;
  if (withSizes) {
    sizes = im.ints(im.arg(1));
  } else {
    int64_t chunk = im.integer(im.arg(1));
    require(chunk > 0, "split size must be positive");
    for (int64_t at = 0; at < size; at += chunk)
      sizes.push_back(std::min(chunk, size - at));
  }
  Values parts;
  int64_t offset = 0;
  for (int64_t part : sizes) {
    SmallVector<int64_t> offsets(type.getRank(), 0), strides(type.getRank(), 1),
        shape(type.getShape());
    offsets[dim] = offset;
    shape[dim] = part;
    require(part >= 0 && offset + part <= size, "split sizes exceed the dim");
    parts.push_back(im.b.create<SliceOp>(im.loc(), type.clone(shape), x,
                                         im.b.getDenseI64ArrayAttr(offsets),
                                         im.b.getDenseI64ArrayAttr(strides)));
    offset += part;
  }
  return parts;
}

/// Bitwise ops exist on the device for booleans only (masks).
Values boolHandler(Importer &im, std::optional<BinaryFn> fn) {
  RankedTensorType out = im.resultType();
  require(out.getElementType().isInteger(1),
          "bitwise ops on integers are not supported on the device");
  if (!fn)
    return {im.unary(UnaryFn::logical_not, im.tensor(im.arg(0)))};
  return {im.binaryArgs(*fn, im.arg(0), im.arg(1), im.b.getI1Type(),
                        out.getShape())};
}

Values squeezeHandler(Importer &im) {
  return viewHandler(im);
}

//===----------------------------------------------------------------------===//
// Convolution and pooling, as windows (strided slices) of a padded input
//===----------------------------------------------------------------------===//

/// Two spatial parameters from an int list of length 1 or 2 (or empty,
/// meaning `fallback`).
std::array<int64_t, 2> pair(Importer &im, const json &v,
                            std::array<int64_t, 2> fallback) {
  if (v.is_null())
    return fallback;
  std::vector<int64_t> xs = im.ints(v);
  if (xs.empty())
    return fallback;
  require(xs.size() <= 2, "only 2-d windows are supported");
  return {xs[0], xs.size() == 2 ? xs[1] : xs[0]};
}

/// x padded by `pad` on both sides of its two trailing dims with `fill`.
/// x with `before`/`after` elements of `fill` around dim `dim` (negative
/// amounts crop).
Value padDim(Importer &im, Value x, int64_t dim, int64_t before,
             int64_t after, double fill) {
  auto type = cast<RankedTensorType>(x.getType());
  if (before < 0 || after < 0) {
    int64_t lo = std::max<int64_t>(0, -before), hi = std::max<int64_t>(0, -after);
    int64_t size = type.getDimSize(dim) - lo - hi;
    require(size >= 0, "padding crops more than the dim holds");
    SmallVector<int64_t> offsets(type.getRank(), 0), strides(type.getRank(), 1),
        shape(type.getShape());
    offsets[dim] = lo;
    shape[dim] = size;
    x = im.b.create<SliceOp>(im.loc(), type.clone(shape), x,
                             im.b.getDenseI64ArrayAttr(offsets),
                             im.b.getDenseI64ArrayAttr(strides));
    return padDim(im, x, dim, std::max<int64_t>(0, before),
                  std::max<int64_t>(0, after), fill);
  }
  if (before == 0 && after == 0)
    return x;
  SmallVector<Value> parts;
  SmallVector<int64_t> shape(type.getShape());
  for (int64_t amount : {before, int64_t(-1), after}) {
    if (amount == -1) {
      parts.push_back(x);
      continue;
    }
    if (amount == 0)
      continue;
    SmallVector<int64_t> edge(type.getShape());
    edge[dim] = amount;
    parts.push_back(im.splat(fill, type.clone(edge)));
    shape[dim] += amount;
  }
  return im.b.create<ConcatOp>(im.loc(), type.clone(shape), parts,
                               im.b.getI64IntegerAttr(dim));
}

/// x padded by `pad` on both sides of its two trailing dims with `fill`.
Value padSpatial(Importer &im, Value x, std::array<int64_t, 2> pad,
                 double fill) {
  int64_t rank = cast<RankedTensorType>(x.getType()).getRank();
  for (int d = 0; d < 2; ++d)
    x = padDim(im, x, rank - 2 + d, pad[d], pad[d], fill);
  return x;
}

/// The [.., Ho, Wo] window of x at kernel position (i, j).
Value window(Importer &im, Value x, int64_t i, int64_t j,
             std::array<int64_t, 2> stride, std::array<int64_t, 2> dilation,
             std::array<int64_t, 2> outSize) {
  auto type = cast<RankedTensorType>(x.getType());
  int64_t rank = type.getRank();
  SmallVector<int64_t> offsets(rank, 0), strides(rank, 1),
      shape(type.getShape());
  offsets[rank - 2] = i * dilation[0];
  offsets[rank - 1] = j * dilation[1];
  strides[rank - 2] = stride[0];
  strides[rank - 1] = stride[1];
  shape[rank - 2] = outSize[0];
  shape[rank - 1] = outSize[1];
  return im.b.create<SliceOp>(im.loc(), type.clone(shape), x,
                              im.b.getDenseI64ArrayAttr(offsets),
                              im.b.getDenseI64ArrayAttr(strides));
}

/// A convolution's stride, padding or dilation as (height, width): a 1-d
/// convolution runs as a 2-d one of unit height, so its value goes to the
/// width and the height gets `unit`.
std::array<int64_t, 2> convParam(Importer &im, const json &v, int64_t spatial,
                                 int64_t unit) {
  if (spatial == 2)
    return pair(im, v, {unit, unit});
  std::array<int64_t, 2> p = pair(im, v, {unit, unit});
  return {unit, p[1]};
}

/// Depthwise convolution (one input channel per group, `multiplier` outputs
/// for each): out[n, o] = sum over the window of w[o, i, j] * x[n, o / m].
/// On VectorE, as kh * kw multiply-accumulates of a window by its per-channel
/// weight: each output element costs one multiply and one add per tap,
/// where the im2col matmul would give TensorE a contraction of only kh * kw
/// rows per group (kh * kw of its 128 rows busy, one group at a time) and
/// move every window through PSUM. Accumulates in fp32 like PSUM does.
Value depthwiseConvolution(Importer &im, Value x, Value w,
                           std::array<int64_t, 2> stride,
                           std::array<int64_t, 2> padding,
                           std::array<int64_t, 2> dilation,
                           std::array<int64_t, 2> outSize, Type elt) {
  auto xt = cast<RankedTensorType>(x.getType());
  auto wt = cast<RankedTensorType>(w.getType());
  int64_t n = xt.getDimSize(0), c = xt.getDimSize(1), h = xt.getDimSize(2),
          wd = xt.getDimSize(3);
  int64_t o = wt.getDimSize(0), kh = wt.getDimSize(2), kw = wt.getDimSize(3);
  Type acc = elt.getIntOrFloatBitWidth() < 32 ? im.b.getF32Type() : elt;
  x = im.castTo(x, acc);
  w = im.castTo(w, acc);
  if (o != c) // channel c feeds outputs c * m .. c * m + m - 1
    x = im.reshape(
        im.broadcastTo(im.reshape(x, {n, c, 1, h, wd}), {n, c, o / c, h, wd}),
        {n, o, h, wd});
  Value xp = padSpatial(im, x, padding, 0.0);
  auto yt = RankedTensorType::get({n, o, outSize[0], outSize[1]}, acc);
  Value weights = im.reshape(w, {o, kh * kw});
  Value y;
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j) {
      Value tap = im.b.create<SliceOp>(
          im.loc(), RankedTensorType::get({o, 1}, acc), weights,
          im.b.getDenseI64ArrayAttr({0, i * kw + j}),
          im.b.getDenseI64ArrayAttr({1, 1}));
      Value scale =
          im.broadcastTo(im.reshape(tap, {1, o, 1, 1}), yt.getShape());
      Value term =
          im.binary(BinaryFn::mul,
                    window(im, xp, i, j, stride, dilation, outSize), scale, yt);
      y = y ? im.binary(BinaryFn::add, y, term, yt) : term;
    }
  return im.castTo(y, elt);
}

/// The fewest input channels a convolution of more than one tap takes the
/// direct kernel with, unless its kernel rows stack on the partitions: each
/// tap is then a matmul contracting the channels, where im2col contracts
/// channels x taps at once.
constexpr int64_t kDirectConvMinChannels = 8;

/// neuron.conv2d, TensorE's direct convolution, for one group and more than
/// one tap, of at least kDirectConvMinChannels channels or whose kernel rows
/// the kernel stacks (ConvLayout::rowStacked: a 3-channel stem, a ViT's
/// patch embedding, an RGB or latent input layer), where its layout fits
/// kConvResidentBudget; null otherwise.
Value directConvolution(Importer &im, Value x, Value w, Value bias,
                        int64_t groups, std::array<int64_t, 2> stride,
                        std::array<int64_t, 2> padding,
                        std::array<int64_t, 2> dilation,
                        std::array<int64_t, 2> outSize) {
  auto xt = cast<RankedTensorType>(x.getType());
  auto wt = cast<RankedTensorType>(w.getType());
  // Depthwise: groups = C = O (one weight a channel and tap).
  bool depthwise = groups > 1 && groups == xt.getDimSize(1) &&
                   wt.getDimSize(0) == groups && wt.getDimSize(1) == 1;
  if ((groups != 1 && !depthwise) || wt.getDimSize(2) * wt.getDimSize(3) == 1 ||
      !xt.hasStaticShape())
    return {};
  auto type = RankedTensorType::get(
      {xt.getDimSize(0), wt.getDimSize(0), outSize[0], outSize[1]},
      xt.getElementType());
  auto conv = im.b.create<Conv2dOp>(
      im.loc(), type, x, w, bias, /*scale=*/Value(),
      im.b.getDenseI64ArrayAttr(stride), im.b.getDenseI64ArrayAttr(padding),
      im.b.getDenseI64ArrayAttr(dilation),
      depthwise ? im.b.getUnitAttr() : nullptr, /*relu=*/nullptr);
  ConvLayout layout = conv.layout();
  if ((xt.getDimSize(1) >= kDirectConvMinChannels || layout.rowStacked) &&
      layout.residentBytes <= kConvResidentBudget)
    return conv;
  conv.erase();
  return {};
}

/// 1-d and 2-d convolutions, grouped or not (a 1-d one as a 2-d one of unit
/// height). Ungrouped or depthwise (groups = C = O): the direct kernel
/// (directConvolution) where it fits; else ungrouped, one im2col matmul.
/// Grouped: the same matmul batched over groups, [N, G, O/G, C/G*K] x [N, G,
/// C/G*K, HoWo], so each group contracts only its own channels (a
/// block-diagonal weight would multiply G times the zeros). Depthwise that
/// the direct kernel does not take (a channel multiplier, too large):
/// VectorE (depthwiseConvolution).
Values convolutionHandler(Importer &im) {
  Value x = im.tensor(im.arg(0)), w = im.tensor(im.arg(1));
  RankedTensorType out = im.resultType();
  auto xt = cast<RankedTensorType>(x.getType());
  auto wt = cast<RankedTensorType>(w.getType());
  int64_t spatial = xt.getRank() - 2;
  require((spatial == 1 || spatial == 2) && wt.getRank() == xt.getRank(),
          "only 1-d and 2-d convolution");
  require(!im.flag(6, "transposed"), "transposed convolution");
  int64_t groups = im.arg(8).is_null() ? 1 : im.integer(im.arg(8));
  auto stride = convParam(im, im.arg(3), spatial, 1);
  auto padding = convParam(im, im.arg(4), spatial, 0);
  auto dilation = convParam(im, im.arg(5), spatial, 1);
  int64_t n = xt.getDimSize(0), c = xt.getDimSize(1);
  int64_t o = wt.getDimSize(0);
  require(groups >= 1 && c % groups == 0 && o % groups == 0 &&
              wt.getDimSize(1) * groups == c,
          "convolution groups do not divide the channels");
  if (spatial == 1) {
    x = im.reshape(x, {n, c, 1, xt.getDimSize(2)});
    w = im.reshape(w, {o, wt.getDimSize(1), 1, wt.getDimSize(2)});
    wt = cast<RankedTensorType>(w.getType());
  }
  int64_t kh = wt.getDimSize(2), kw = wt.getDimSize(3);
  std::array<int64_t, 2> outSize = {spatial == 2 ? out.getDimSize(2) : 1,
                                    out.getDimSize(spatial + 1)};
  Type elt = out.getElementType();
  x = im.castTo(x, elt);
  w = im.castTo(w, elt);
  auto withBias = [&](Value y) -> Values {
    // y is [N, O, Ho * Wo] or [N, O, Ho, Wo].
    auto yt = cast<RankedTensorType>(y.getType());
    if (im.isTensor(im.arg(2))) {
      SmallVector<int64_t> shape(yt.getRank(), 1);
      shape[1] = o;
      Value bias = im.reshape(im.castTo(im.tensor(im.arg(2)), elt), shape);
      y = im.binary(BinaryFn::add, y, im.broadcastTo(bias, yt.getShape()), yt);
    }
    return {im.reshape(y, out.getShape())};
  };
  // The direct kernel's bias is added to the sums as they leave PSUM.
  Value bias =
      im.isTensor(im.arg(2)) ? im.castTo(im.tensor(im.arg(2)), elt) : Value();
  if (Value direct = directConvolution(im, x, w, bias, groups, stride, padding,
                                       dilation, outSize))
    return {im.reshape(direct, out.getShape())};
  if (groups > 1 && groups == c)
    return withBias(depthwiseConvolution(im, x, w, stride, padding, dilation,
                                         outSize, elt));
  int64_t cg = c / groups, og = o / groups;
  int64_t ckk = cg * kh * kw, hw = outSize[0] * outSize[1];
  Value patches;
  bool patchify =
      stride[0] == kh && stride[1] == kw && padding[0] == 0 &&
      padding[1] == 0 && dilation[0] == 1 && dilation[1] == 1 &&
      cast<RankedTensorType>(x.getType()).getDimSize(2) == outSize[0] * kh &&
      cast<RankedTensorType>(x.getType()).getDimSize(3) == outSize[1] * kw;
  if (patchify) {
    // Non-overlapping windows (ViT patches): one transpose gathers them.
    Value r = im.reshape(x, {n, c, outSize[0], kh, outSize[1], kw});
    Value t = im.transpose(r, {0, 1, 3, 5, 2, 4});
    patches = im.reshape(t, {n, groups, ckk, hw});
  } else {
    Value xp = padSpatial(im, x, padding, 0.0);
    SmallVector<Value> cols;
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j)
        cols.push_back(im.reshape(
            window(im, xp, i, j, stride, dilation, outSize), {n, c, 1, hw}));
    Value stacked =
        cols.size() == 1
            ? cols[0]
            : im.b.create<ConcatOp>(
                  im.loc(), RankedTensorType::get({n, c, kh * kw, hw}, elt),
                  cols, im.b.getI64IntegerAttr(2));
    patches = im.reshape(stacked, {n, groups, ckk, hw});
  }
  // [N, G, O/G, CKK] x [N, G, CKK, HoWo]: the weights are shared by every
  // image.
  Value wm;
  if (groups == 1) {
    patches = im.reshape(patches, {n, ckk, hw});
    wm = im.broadcastTo(im.reshape(w, {o, ckk}), {n, o, ckk});
  } else {
    wm = im.broadcastTo(im.reshape(w, {groups, og, ckk}), {n, groups, og, ckk});
  }
  Value y = im.reshape(im.matmul(wm, patches), {n, o, hw});
  return withBias(y);
}

/// x without the symmetric padding of `fill` (concats of splat constants,
/// as constant_pad_nd imports) around its last two dims, that padding added
/// to `pad`: pooling takes it as its own, where the padded copy went through
/// HBM an element per descriptor.
Value unpadded(Value x, double fill, std::array<int64_t, 2> &pad) {
  int64_t rank = cast<RankedTensorType>(x.getType()).getRank();
  auto isFill = [&](Value v) {
    auto c = v.getDefiningOp<ConstantOp>();
    auto dense = c ? dyn_cast<DenseElementsAttr>(c.getValue()) : nullptr;
    return dense && dense.isSplat() && isa<FloatType>(dense.getElementType()) &&
           dense.getSplatValue<APFloat>().convertToDouble() == fill;
  };
  for (int pass = 0; pass < 2; ++pass) {
    auto cat = x.getDefiningOp<ConcatOp>();
    if (!cat || cat.getInputs().size() != 3)
      break;
    int64_t dim = cat.getDim();
    Value before = cat.getInputs()[0], after = cat.getInputs()[2];
    int64_t amount = cast<RankedTensorType>(before.getType()).getDimSize(dim);
    if (dim < rank - 2 || !isFill(before) || !isFill(after) ||
        cast<RankedTensorType>(after.getType()).getDimSize(dim) != amount)
      break;
    pad[dim - (rank - 2)] += amount;
    x = cat.getInputs()[1];
  }
  return x;
}

Values poolHandler(Importer &im, bool isMax) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  auto kernel = pair(im, im.arg(1), {1, 1});
  auto stride = pair(im, im.arg(2), kernel);
  auto padding = pair(im, im.arg(3), {0, 0});
  std::array<int64_t, 2> dilation = {1, 1};
  std::array<int64_t, 2> outSize = {out.getDimSize(out.getRank() - 2),
                                    out.getDimSize(out.getRank() - 1)};
  auto xt = cast<RankedTensorType>(x.getType());
  for (int d = 0; d < 2; ++d) {
    int64_t in = xt.getDimSize(xt.getRank() - 2 + d) + 2 * padding[d];
    // ceil_mode windows that run past the padded input read nothing extra.
    require((outSize[d] - 1) * stride[d] + kernel[d] <= in,
            "pooling windows past the padded input (ceil_mode)");
  }
  if (isMax) {
    dilation = pair(im, im.arg(4), {1, 1});
    require(!im.isUsed(1), "max_pool2d indices are not computed on the device");
  } else {
    const json &includePad = im.param(5, "count_include_pad");
    require(padding == std::array<int64_t, 2>{0, 0} || includePad.is_null() ||
                includePad.get<bool>(),
            "avg_pool2d with count_include_pad=False and padding");
  }
  Type elt = out.getElementType();
  x = im.castTo(x, elt);
  double divisor = 1.0;
  if (!isMax) {
    const json &over = im.param(6, "divisor_override");
    divisor = over.is_null() ? double(kernel[0] * kernel[1]) : im.number(over);
  }
  // Every window in SBUF where the planes fit (neuron.pool2d), else as
  // slices of the padded input.
  if (xt.getRank() >= 3 && xt.hasStaticShape()) {
    // The padding folded in where the planes then fit, else as it comes.
    std::array<int64_t, 2> inner = padding;
    Value source = unpadded(x, isMax ? -INFINITY : 0.0, inner);
    for (auto [input, pad] :
         {std::pair{source, inner}, std::pair{x, padding}}) {
      auto pool = im.b.create<Pool2dOp>(
          im.loc(), out, input, isMax ? ReduceFn::max : ReduceFn::sum,
          im.b.getDenseI64ArrayAttr(kernel), im.b.getDenseI64ArrayAttr(stride),
          im.b.getDenseI64ArrayAttr(pad), im.b.getDenseI64ArrayAttr(dilation),
          APFloat(1.0 / divisor));
      if (pool.residentBytes() <= kConvResidentBudget) {
        if (isMax && im.numResults() == 2) // never read (checked above)
          return {pool, im.splat(0, im.resultType(1))};
        return {pool};
      }
      pool.erase();
    }
  }
  Value xp = padSpatial(im, x, padding, isMax ? -INFINITY : 0.0);
  RankedTensorType acc = out;
  Value result;
  for (int64_t i = 0; i < kernel[0]; ++i)
    for (int64_t j = 0; j < kernel[1]; ++j) {
      Value win = window(im, xp, i, j, stride, dilation, outSize);
      result = result ? im.binary(isMax ? BinaryFn::max : BinaryFn::add, result,
                                  win, acc)
                      : win;
    }
  if (!isMax)
    result =
        im.binary(BinaryFn::mul, result, im.splat(1.0 / divisor, acc), acc);
  if (isMax && im.numResults() == 2) {
    // Index result stand-in: never read (checked above).
    RankedTensorType idx = im.resultType(1);
    return {result, im.splat(0, idx)};
  }
  return {result};
}

/// `native_group_norm(input, weight, bias, N, C, HxW, group, eps)`: one
/// neuron.group_norm. The decomposition table keeps it whole only where its
/// groups have at most kGroupNormMaxChannels channels (else it is the
/// reductions and elementwise ops it decomposes to).
Values groupNormHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType(0);
  auto xt = cast<RankedTensorType>(x.getType());
  require(xt.getRank() >= 2 && xt.hasStaticShape(),
          "group_norm of a static [N, C, ...] input");
  int64_t groups = im.integer(im.arg(6));
  require(groups >= 1 && xt.getDimSize(1) % groups == 0 &&
              xt.getDimSize(1) / groups <= kGroupNormMaxChannels,
          "group_norm with more than 128 channels per group");
  Type elt = out.getElementType();
  x = im.castTo(x, elt);
  auto op = im.b.create<GroupNormOp>(
      im.loc(), TypeRange{out, im.resultType(1), im.resultType(2)}, x,
      im.optionalTensor(1, elt), im.optionalTensor(2, elt),
      im.b.getI64IntegerAttr(groups),
      im.b.getF64FloatAttr(im.number(im.arg(7))), /*silu=*/nullptr);
  if (failed(mlir::verify(op, /*verifyRecursively=*/false)))
    unsupported("the group_norm call is malformed (see the diagnostic)");
  return {op.getResult(), op.getMean(), op.getRstd()};
}

/// `torchneuron::channel_norm(input, weight, bias, eps)`: the
/// decomposition of a LayerNorm over the channels of a channels-first
/// tensor (python/torchneuron/norms.py).
Values channelNormHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType(0);
  auto xt = cast<RankedTensorType>(x.getType());
  require(xt.getRank() >= 3 && xt.hasStaticShape(),
          "channel_norm of a static [N, C, ...] input");
  require(xt.getDimSize(1) <= kChannelNormMaxChannels,
          "channel_norm with more than 1024 channels");
  Type elt = out.getElementType();
  x = im.castTo(x, elt);
  auto op = im.b.create<ChannelNormOp>(
      im.loc(), TypeRange{out, im.resultType(1), im.resultType(2)}, x,
      im.optionalTensor(1, elt), im.optionalTensor(2, elt),
      im.b.getF64FloatAttr(im.number(im.arg(3))));
  if (failed(mlir::verify(op, /*verifyRecursively=*/false)))
    unsupported("the channel_norm call is malformed (see the diagnostic)");
  return {op.getResult(), op.getMean(), op.getRstd()};
}

Values constantPadHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  std::vector<int64_t> pad = im.ints(im.arg(1));
  const json &value = im.param(2, "value");
  int64_t rank = out.getRank();
  require(pad.size() % 2 == 0 && (int64_t)pad.size() <= 2 * rank,
          "pad needs (before, after) pairs for at most every dim");
  x = im.castTo(x, out.getElementType());
  // Pairs run from the last dim backwards.
  for (size_t i = 0; i < pad.size(); i += 2)
    x = padDim(im, x, rank - 1 - i / 2, pad[i], pad[i + 1],
               value.is_null() ? 0.0 : im.number(value));
  return {x};
}

Values repeatHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  std::vector<int64_t> repeats = im.ints(im.arg(1));
  auto type = cast<RankedTensorType>(x.getType());
  int64_t lead = (int64_t)repeats.size() - type.getRank();
  require(lead >= 0, "repeat needs a count for every dim");
  // [a, b] repeated [r, s]: view as [1, a, 1, b], broadcast to [r, a, s, b].
  SmallVector<int64_t> unit, wide;
  for (int64_t i = 0; i < (int64_t)repeats.size(); ++i) {
    int64_t size = i < lead ? 1 : type.getDimSize(i - lead);
    unit.append({1, size});
    wide.append({repeats[i], size});
  }
  Value b = im.broadcastTo(im.reshape(x, unit), wide);
  return {im.reshape(b, out.getShape())};
}

/// x where x > 0, else negative(x): leaky_relu and elu.
Values rectifierHandler(Importer &im, bool elu) {
  RankedTensorType out = im.resultType();
  require(isa<FloatType>(out.getElementType()), "rectifier of integers");
  Value x = im.castTo(im.tensor(im.arg(0)), out.getElementType());
  Value positive = im.binary(BinaryFn::gt, x, im.splat(0.0, out),
                             out.clone(im.b.getI1Type()));
  auto scaled = [&](Value v, double k) {
    return k == 1.0 ? v : im.binary(BinaryFn::mul, v, im.splat(k, out), out);
  };
  auto number = [&](size_t i, const char *name, double fallback) {
    const json &v = im.param(i, name);
    return v.is_null() ? fallback : im.number(v);
  };
  Value onTrue = x, onFalse;
  if (elu) {
    double alpha = number(1, "alpha", 1.0), scale = number(2, "scale", 1.0);
    double inputScale = number(3, "input_scale", 1.0);
    onTrue = scaled(x, scale);
    Value e = im.unary(UnaryFn::expm1, scaled(x, inputScale));
    onFalse = scaled(e, scale * alpha);
  } else {
    onFalse = scaled(x, number(1, "negative_slope", 0.01));
  }
  return {im.b.create<SelectOp>(im.loc(), out, positive, onTrue, onFalse)};
}

Values maxDimHandler(Importer &im) {
  require(!im.isUsed(1), "max.dim indices are not computed on the device");
  Values values = reduceHandler(im, ReduceFn::max);
  return {values[0], im.splat(0, im.resultType(1))};
}

Values adaptiveAvgPoolHandler(Importer &im) {
  Value x = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  auto xt = cast<RankedTensorType>(x.getType());
  int64_t rank = xt.getRank();
  require(rank >= 2, "adaptive pooling needs two spatial dims");
  std::array<int64_t, 2> kernel;
  for (int d = 0; d < 2; ++d) {
    int64_t in = xt.getDimSize(rank - 2 + d), o = out.getDimSize(rank - 2 + d);
    require(o > 0 && in % o == 0,
            "adaptive pooling with windows of different sizes");
    kernel[d] = in / o;
  }
  // Equal windows: an average pool with kernel = stride = in / out.
  Type elt = out.getElementType();
  x = im.castTo(x, elt);
  Value result;
  for (int64_t i = 0; i < kernel[0]; ++i)
    for (int64_t j = 0; j < kernel[1]; ++j) {
      Value win = window(im, x, i, j, kernel, {1, 1},
                         {out.getDimSize(rank - 2), out.getDimSize(rank - 1)});
      result = result ? im.binary(BinaryFn::add, result, win, out) : win;
    }
  return {im.binary(BinaryFn::mul, result,
                    im.splat(1.0 / (kernel[0] * kernel[1]), out), out)};
}

/// torchneuron.philox_rand(seed, stream, size, dtype):
/// python/torchneuron/rng.py puts it where a graph drew random numbers; the
/// seed is a graph input.
Values philoxRandHandler(Importer &im) {
  Value seed = im.tensor(im.arg(0));
  RankedTensorType out = im.resultType();
  auto seedType = cast<RankedTensorType>(seed.getType());
  require(seedType.getShape() == ArrayRef<int64_t>{2} &&
              seedType.getElementType().isInteger(32),
          "the seed must be an int32 tensor of 2 elements");
  require(isa<FloatType>(out.getElementType()),
          "random numbers of a non-float dtype");
  int64_t stream = im.integer(im.arg(1));
  require(stream >= 0 && stream <= 0xFFFFFFFFll,
          "the stream must fit in 32 unsigned bits");
  return {
      im.b.create<RandOp>(im.loc(), out, seed, im.b.getI64IntegerAttr(stream))};
}

/// A handler that calls `fn(im, args...)`: one function serves several ops.
template <typename Fn, typename... Args>
Handler with(Fn fn, Args... args) {
  return [=](Importer &im) { return fn(im, args...); };
}

/// ATen operator -> its handler, one line per operator (a few short
/// lambdas bind a handler's arguments). Long on purpose: it is the list of
/// what the importer accepts, read (and grepped) as a table; split by family
/// it would only scatter the list across functions.
const std::unordered_map<std::string, Handler> &handlers() {
  static const std::unordered_map<std::string, Handler> table = [] {
    std::unordered_map<std::string, Handler> t;
    auto un = [&](const char *name, UnaryFn fn) {
      t[name] = [fn](Importer &im) { return unaryHandler(im, fn); };
    };
    un("aten.neg.default", UnaryFn::neg);
    un("aten.abs.default", UnaryFn::abs);
    un("aten.exp.default", UnaryFn::exp);
    un("aten.log.default", UnaryFn::log);
    un("aten.sqrt.default", UnaryFn::sqrt);
    un("aten.rsqrt.default", UnaryFn::rsqrt);
    un("aten.reciprocal.default", UnaryFn::reciprocal);
    un("aten.tanh.default", UnaryFn::tanh);
    un("aten.sigmoid.default", UnaryFn::sigmoid);
    un("aten.relu.default", UnaryFn::relu);
    un("aten.silu.default", UnaryFn::silu);
    un("aten.erf.default", UnaryFn::erf);
    un("aten.sin.default", UnaryFn::sin);
    un("aten.cos.default", UnaryFn::cos);
    un("aten.sign.default", UnaryFn::sign);
    un("aten.floor.default", UnaryFn::floor);
    un("aten.ceil.default", UnaryFn::ceil);
    un("aten.round.default", UnaryFn::round);
    un("aten.trunc.default", UnaryFn::trunc);
    un("aten.log1p.default", UnaryFn::log1p);
    un("aten.expm1.default", UnaryFn::expm1);
    // 2^x as pow, not e^(x ln 2): exact at integers (a power-of-two scale).
    t["aten.exp2.default"] = [](Importer &im) {
      RankedTensorType type = im.resultType();
      Value x = im.operandAs(im.arg(0), type.getElementType(), type.getShape());
      return Values{im.binary(BinaryFn::pow, im.splat(2.0, type), x, type)};
    };
    un("aten.logical_not.default", UnaryFn::logical_not);
    t["aten.gelu.default"] = geluHandler;

    auto bin = [&](const char *name, BinaryFn fn, bool alpha = false,
                   bool reversed = false) {
      t[name] = [=](Importer &im) {
        return binaryHandler(im, fn, alpha, reversed);
      };
    };
    bin("aten.add.Tensor", BinaryFn::add, true);
    bin("aten.add.Scalar", BinaryFn::add, true);
    bin("aten.sub.Tensor", BinaryFn::sub, true);
    bin("aten.sub.Scalar", BinaryFn::sub, true);
    bin("aten.rsub.Scalar", BinaryFn::sub, true, true);
    bin("aten.rsub.Tensor", BinaryFn::sub, true, true);
    bin("aten.mul.Tensor", BinaryFn::mul);
    bin("aten.mul.Scalar", BinaryFn::mul);
    bin("aten.div.Tensor", BinaryFn::div);
    bin("aten.div.Scalar", BinaryFn::div);
    bin("aten.true_divide.Tensor", BinaryFn::div);
    bin("aten.true_divide.Scalar", BinaryFn::div);
    bin("aten.maximum.default", BinaryFn::max);
    bin("aten.minimum.default", BinaryFn::min);
    bin("aten.fmod.Tensor", BinaryFn::fmod);
    bin("aten.fmod.Scalar", BinaryFn::fmod);
    bin("aten.remainder.Tensor", BinaryFn::remainder);
    bin("aten.remainder.Scalar", BinaryFn::remainder);
    bin("aten.logical_and.default", BinaryFn::logical_and);
    bin("aten.logical_or.default", BinaryFn::logical_or);
    bin("aten.logical_xor.default", BinaryFn::logical_xor);
    for (auto [op, fn] : {std::pair{"eq", BinaryFn::eq},
                          {"ne", BinaryFn::ne},
                          {"lt", BinaryFn::lt},
                          {"le", BinaryFn::le},
                          {"gt", BinaryFn::gt},
                          {"ge", BinaryFn::ge}}) {
      bin(("aten." + std::string(op) + ".Tensor").c_str(), fn);
      bin(("aten." + std::string(op) + ".Scalar").c_str(), fn);
    }
    t["aten.div.Tensor_mode"] = divModeHandler;
    t["aten.div.Scalar_mode"] = divModeHandler;
    t["aten.pow.Tensor_Scalar"] = powHandler;
    t["aten.pow.Tensor_Tensor"] = powHandler;
    bin("aten.pow.Scalar", BinaryFn::pow);
    t["aten.where.self"] = whereHandler;
    t["aten.clamp.default"] = [](Importer &im) {
      return clampHandler(im, im.param(1, "min"), im.param(2, "max"));
    };
    t["aten.clamp.Tensor"] = t["aten.clamp.default"];
    t["aten.clamp_min.default"] = [](Importer &im) {
      return clampHandler(im, im.arg(1), nullptr);
    };
    t["aten.clamp_max.default"] = [](Importer &im) {
      return clampHandler(im, nullptr, im.arg(1));
    };

    t["aten._to_copy.default"] = castHandler;
    t["prims.convert_element_type.default"] = castHandler;
    t["aten.clone.default"] = castHandler;
    t["aten.alias.default"] = castHandler;
    t["aten.detach.default"] = castHandler;
    t["aten.lift_fresh_copy.default"] = castHandler;

    t["_c10d_functional.all_reduce.default"] = [](Importer &im) {
      return collectiveHandler(im, CollectiveKind::all_reduce);
    };
    t["_c10d_functional.all_gather_into_tensor.default"] = [](Importer &im) {
      return collectiveHandler(im, CollectiveKind::all_gather);
    };
    t["_c10d_functional.reduce_scatter_tensor.default"] = [](Importer &im) {
      return collectiveHandler(im, CollectiveKind::reduce_scatter);
    };
    // The point where a collective's result is needed: a data dependence,
    // which the kernel's synchronisation already honours.
    t["_c10d_functional.wait_tensor.default"] = [](Importer &im) {
      return Values{im.tensor(im.arg(0))};
    };

    t["aten.mm.default"] = matmulHandler;
    t["aten.bmm.default"] = matmulHandler;
    t["aten.addmm.default"] = addmmHandler;
    t["aten._scaled_mm.default"] = scaledMmHandler;
    t["aten._scaled_mm_v2.default"] = scaledMmV2Handler;
    t["aten._grouped_mm.default"] = groupedMmHandler;

    t["aten.sum.dim_IntList"] = with(reduceHandler, ReduceFn::sum);
    t["aten.sum.default"] = t["aten.sum.dim_IntList"];
    t["aten.amax.default"] = with(reduceHandler, ReduceFn::max);
    t["aten.amin.default"] = with(reduceHandler, ReduceFn::min);
    t["aten.prod.dim_int"] = with(reduceHandler, ReduceFn::prod);
    for (const char *name : {"aten.any.dim", "aten.any.dims", "aten.any.default"})
      t[name] = [](Importer &im) { return anyAllHandler(im, true); };
    for (const char *name : {"aten.all.dim", "aten.all.dims", "aten.all.default"})
      t[name] = [](Importer &im) { return anyAllHandler(im, false); };
    t["aten.mean.dim"] = meanHandler;
    t["aten.mean.default"] = meanHandler;
    t["aten.var.correction"] = with(varHandler, false);
    t["aten.var_mean.correction"] = with(varHandler, true);

    t["aten.view.default"] = viewHandler;
    t["aten._unsafe_view.default"] = viewHandler;
    t["aten.reshape.default"] = viewHandler;
    t["aten.unsqueeze.default"] = viewHandler;
    t["aten.squeeze.dim"] = squeezeHandler;
    t["aten.squeeze.dims"] = squeezeHandler;
    t["aten.squeeze.default"] = squeezeHandler;
    t["aten.permute.default"] = permuteHandler;
    t["aten.transpose.int"] = transposeHandler;
    t["aten.t.default"] = transposeHandler;
    t["aten.expand.default"] = expandHandler;
    t["aten.slice.Tensor"] = sliceHandler;
    t["aten.select.int"] = selectHandler;
    t["aten.cat.default"] = catHandler;
    t["aten.split_with_sizes.default"] = with(splitHandler, true);
    t["aten.split.Tensor"] = with(splitHandler, false);
    t["aten.bitwise_not.default"] = with(boolHandler, std::nullopt);
    t["aten.bitwise_and.Tensor"] = with(boolHandler, BinaryFn::logical_and);
    t["aten.bitwise_or.Tensor"] = with(boolHandler, BinaryFn::logical_or);
    t["aten.bitwise_xor.Tensor"] = with(boolHandler, BinaryFn::logical_xor);

    t["aten.full.default"] = with(fullHandler, 1);
    t["aten.full_like.default"] = with(fullHandler, 1);
    t["aten.scalar_tensor.default"] = with(fullHandler, 0);
    t["aten.zeros.default"] = [](Importer &im) {
      return Values{im.splat(0.0, im.resultType())};
    };
    t["aten.ones.default"] = [](Importer &im) {
      return Values{im.splat(1.0, im.resultType())};
    };
    // Uninitialized memory may hold anything; zeros. (Backward graphs build
    // full_like(empty_permuted(...)) for a shape.)
    t["aten.empty_permuted.default"] = t["aten.zeros.default"];
    t["aten.empty.memory_format"] = t["aten.zeros.default"];
    t["aten.arange.default"] = arangeHandler;
    t["aten.arange.start"] = arangeHandler;
    t["aten.arange.start_step"] = arangeHandler;

    t["aten.convolution.default"] = convolutionHandler;
    t["aten.max_pool2d_with_indices.default"] = with(poolHandler, true);
    t["aten._adaptive_avg_pool2d.default"] = adaptiveAvgPoolHandler;
    t["aten.constant_pad_nd.default"] = constantPadHandler;
    t["aten.repeat.default"] = repeatHandler;
    t["aten.leaky_relu.default"] = with(rectifierHandler, false);
    t["aten.elu.default"] = with(rectifierHandler, true);
    t["aten.max.dim"] = maxDimHandler;
    t["aten.prod.default"] = with(reduceHandler, ReduceFn::prod);
    t["aten.hardtanh.default"] = [](Importer &im) {
      const json &lo = im.param(1, "min_val"), &hi = im.param(2, "max_val");
      return clampHandler(im, lo.is_null() ? json(-1.0) : lo,
                          hi.is_null() ? json(1.0) : hi);
    };
    t["aten.isnan.default"] = [](Importer &im) {
      return Values{im.binaryArgs(BinaryFn::ne, im.arg(0), im.arg(0),
                                  im.promote(im.arg(0), im.arg(0)),
                                  im.resultType().getShape())};
    };
    t["aten.avg_pool2d.default"] = with(poolHandler, false);
    t["aten.native_group_norm.default"] = groupNormHandler;
    t["higher_order.flex_attention"] = flexAttentionHandler;
    t["higher_order.flex_attention_backward"] = flexAttentionBackwardHandler;
    t["aten.tanh_backward.default"] = [](Importer &im) { // g * (1 - y^2)
      RankedTensorType type = im.resultType();
      Value g = im.operandAs(im.arg(0), type.getElementType(), type.getShape());
      Value y = im.operandAs(im.arg(1), type.getElementType(), type.getShape());
      Value y2 = im.binary(BinaryFn::mul, y, y, type);
      Value d = im.binary(BinaryFn::sub, im.splat(1.0, type), y2, type);
      return Values{im.binary(BinaryFn::mul, g, d, type)};
    };
    t["torchneuron.philox_rand.default"] = philoxRandHandler;
    t["torchneuron.unpermute_rows.default"] = unpermuteRowsHandler;
    t["torchneuron.channel_norm.default"] = channelNormHandler;
    t["aten.index.Tensor"] = indexHandler;
    t["aten.index_put.default"] = indexPutHandler;
    t["aten.cumsum.default"] = cumsumHandler;
    t["aten.topk.default"] = topkHandler;
    t["aten.sort.default"] = [](Importer &im) {
      return sortHandler(im, false);
    };
    t["aten.sort.stable"] = [](Importer &im) { return sortHandler(im, true); };
    t["aten.embedding.default"] = [](Importer &im) {
      return gatherRowsHandler(im, im.tensor(im.arg(0)), im.tensor(im.arg(1)));
    };
    // A 0-d index selects like a 1-element one (the result keeps the dim),
    // and a 0-d input is a 1-row table whose row is the result (its index
    // holds one element, 0): both gather [1]-shaped indices and reshape. Gather
    // itself keeps indices' shape, so passing them through would build a
    // module that fails verification, and the whole graph would stay eager.
    t["aten.index_select.default"] = [](Importer &im) {
      Value table = im.tensor(im.arg(0));
      Value indices = im.tensor(im.arg(2));
      auto tableType = cast<RankedTensorType>(table.getType());
      auto indexType = cast<RankedTensorType>(indices.getType());
      int64_t rank = tableType.getRank();
      int64_t dim = im.normDim(im.integer(im.arg(1)), rank);
      require(indexType.getRank() <= 1, "index_select with a multi-dim index");
      RankedTensorType out = im.resultType();
      if (rank == 0) {
        require(indexType.getNumElements() == 1,
                "index_select of a 0-d tensor takes exactly one index");
        table = im.reshape(table, {1});
      }
      int64_t count = indexType.getNumElements();
      Value rows = gatherDims(im, table, dim, {im.reshape(indices, {count})},
                              {count}, /*wrapNegative=*/false);
      return Values{im.reshape(rows, out.getShape())};
    };
    return t;
  }();
  return table;
}

std::map<std::string, std::string>
importDocument(MLIRContext &context, const std::string &document,
               bool stopAtFirst, OwningOpRef<ModuleOp> *out) {
  std::map<std::string, std::string> failures;
  json doc = json::parse(document, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    failures[""] = "the FX graph document is not valid JSON";
    return failures;
  }
  try {
    Importer importer(context);
    OwningOpRef<ModuleOp> module = importer.run(doc, failures, stopAtFirst);
    if (module && failures.empty() && failed(verify(*module))) {
      failures[""] = "the imported module does not verify";
      return failures;
    }
    if (out)
      *out = std::move(module);
  } catch (const json::exception &e) {
    failures[""] = std::string("malformed FX graph document: ") + e.what();
  } catch (const Unsupported &u) {
    failures[""] = u.reason;
  }
  return failures;
}

} // namespace

namespace neuron::compiler {

std::map<std::string, std::string>
checkFxGraph(MLIRContext &context, const std::string &document) {
  return importDocument(context, document, /*stopAtFirst=*/false, nullptr);
}

OwningOpRef<ModuleOp> importFxGraph(MLIRContext &context,
                                    const std::string &document,
                                    std::string &error) {
  OwningOpRef<ModuleOp> module;
  auto failures = importDocument(context, document, /*stopAtFirst=*/true,
                                 &module);
  if (!failures.empty()) {
    auto &[name, reason] = *failures.begin();
    error = name.empty() ? reason : "node '" + name + "': " + reason;
    return nullptr;
  }
  return module;
}

} // namespace neuron::compiler
