//===- Program.cpp - Kernel program parser, verifier and writer -----------===//

#include "runtime/program/Program.h"
#include "runtime/program/SizeExpr.h"
#include "runtime/target/Target.h"

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>

namespace neuron::runtime {

using json = nlohmann::json;

//===----------------------------------------------------------------------===//
// Enum names
//===----------------------------------------------------------------------===//

namespace {

/// The value of `values` whose name is `name`.
template <typename Enum, size_t N>
std::optional<Enum> parseName(const Enum (&values)[N],
                              const char *(*nameOf)(Enum),
                              std::string_view name) {
  for (Enum value : values)
    if (name == nameOf(value))
      return value;
  return std::nullopt;
}

constexpr BufferKind kAllBufferKinds[] = {
    BufferKind::Input, BufferKind::Output, BufferKind::Internal,
    BufferKind::Constant, BufferKind::Scratch};

} // namespace

const char *spaceName(Space v) {
  switch (v) {
#define NEURON_MEMORY_SPACE(Name, Spelling)                                    \
  case Space::Name:                                                            \
    return Spelling;
#include "runtime/program/InstructionSet.def"
  }
  return "?";
}
const char *bufferKindName(BufferKind v) {
  switch (v) {
  case BufferKind::Input:
    return "input";
  case BufferKind::Output:
    return "output";
  case BufferKind::Internal:
    return "internal";
  case BufferKind::Constant:
    return "constant";
  case BufferKind::Scratch:
    return "scratch";
  }
  return "?";
}
const char *opcodeName(Opcode v) {
  switch (v) {
#define NEURON_OPCODE(Name, Mnemonic, IsDma, Engines)                          \
  case Opcode::Name:                                                           \
    return Mnemonic;
#include "runtime/program/InstructionSet.def"
  }
  return "?";
}
const char *engineName(Engine v) {
  switch (v) {
#define NEURON_ENGINE(Name, Spelling)                                          \
  case Engine::Name:                                                           \
    return Spelling;
#include "runtime/program/InstructionSet.def"
  }
  return "?";
}
const char *actFuncName(ActFunc v) {
  switch (v) {
#define NEURON_ACT_FUNC(Name, Spelling)                                        \
  case ActFunc::Name:                                                          \
    return Spelling;
#include "runtime/program/InstructionSet.def"
  }
  return "?";
}
const char *aluOpName(AluOp v) {
  switch (v) {
#define NEURON_ALU_OP(Name, Spelling)                                          \
  case AluOp::Name:                                                            \
    return Spelling;
#include "runtime/program/InstructionSet.def"
  }
  return "?";
}
const char *collectiveName(Collective v) {
  switch (v) {
#define NEURON_COLLECTIVE(Name, Spelling)                                      \
  case Collective::Name:                                                       \
    return Spelling;
#include "runtime/program/InstructionSet.def"
  }
  return "?";
}
std::optional<Space> parseSpace(std::string_view n) {
  return parseName(kAllSpaces, spaceName, n);
}
std::optional<BufferKind> parseBufferKind(std::string_view n) {
  return parseName(kAllBufferKinds, bufferKindName, n);
}
std::optional<Opcode> parseOpcode(std::string_view n) {
  return parseName(kAllOpcodes, opcodeName, n);
}
std::optional<Engine> parseEngine(std::string_view n) {
  return parseName(kAllEngines, engineName, n);
}
std::optional<ActFunc> parseActFunc(std::string_view n) {
  return parseName(kAllActFuncs, actFuncName, n);
}
std::optional<AluOp> parseAluOp(std::string_view n) {
  return parseName(kAllAluOps, aluOpName, n);
}
std::optional<Collective> parseCollective(std::string_view n) {
  return parseName(kAllCollectives, collectiveName, n);
}

//===----------------------------------------------------------------------===//
// Data model helpers
//===----------------------------------------------------------------------===//

std::optional<int64_t> shapeElements(const std::vector<int64_t> &shape) {
  int64_t total = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(total, dim, &total))
      return std::nullopt;
  }
  return total;
}

int64_t Buffer::numElements() const { return shapeElements(shape).value_or(0); }

int64_t Buffer::bytesPerPartition() const {
  if (shape.empty())
    return dtypeSize(dtype);
  std::vector<int64_t> freeDims(shape.begin() + 1, shape.end());
  return shapeElements(freeDims).value_or(0) * dtypeSize(dtype);
}

int64_t View::numElements() const { return shapeElements(shape).value_or(0); }

std::vector<std::pair<const char *, const View *>>
Instruction::operands() const {
  std::vector<std::pair<const char *, const View *>> result;
  for (const OperandField &field : kOperandFields)
    if (const std::optional<View> &view = this->*field.member)
      result.emplace_back(field.name, &*view);
  return result;
}

namespace {
const OperandField *findOperandField(std::string_view name) {
  for (const OperandField &field : kOperandFields)
    if (name == field.name)
      return &field;
  return nullptr;
}
} // namespace

bool Instruction::writes(std::string_view field) {
  const OperandField *found = findOperandField(field);
  return found && found->written;
}

Node Node::makeLoop(int64_t loopId, int64_t count, std::vector<Node> body) {
  Node node;
  node.kind = Kind::Loop;
  node.loopId = loopId;
  node.count = count;
  node.body = std::move(body);
  return node;
}

Node Node::makeInstruction(Instruction inst) {
  Node node;
  node.kind = Kind::Instruction;
  node.inst = std::move(inst);
  return node;
}

const Buffer *Program::findBuffer(int64_t id) const {
  for (const Buffer &buffer : buffers)
    if (buffer.id == id)
      return &buffer;
  return nullptr;
}

namespace {
int64_t countInstructions(const std::vector<Node> &nodes) {
  int64_t count = 0;
  for (const Node &node : nodes)
    count += node.isLoop() ? countInstructions(node.body) : 1;
  return count;
}
} // namespace

int64_t Program::numInstructions() const { return countInstructions(body); }

bool Program::hasCollectives() const {
  std::function<bool(const std::vector<Node> &)> any =
      [&](const std::vector<Node> &nodes) {
        for (const Node &node : nodes)
          if (node.isLoop() ? any(node.body)
                            : node.inst.op == Opcode::Collective)
            return true;
        return false;
      };
  return any(body);
}

//===----------------------------------------------------------------------===//
// Base64
//===----------------------------------------------------------------------===//

namespace {

const char kBase64Chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string encodeBase64(const std::vector<uint8_t> &bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t word = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    for (int shift = 18; shift >= 0; shift -= 6)
      out += kBase64Chars[(word >> shift) & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest) {
    uint32_t word = bytes[i] << 16;
    if (rest == 2)
      word |= bytes[i + 1] << 8;
    out += kBase64Chars[(word >> 18) & 63];
    out += kBase64Chars[(word >> 12) & 63];
    out += rest == 2 ? kBase64Chars[(word >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

/// Strict decoder: standard alphabet, '=' padding to a multiple of 4.
std::optional<std::vector<uint8_t>> decodeBase64(const std::string &text) {
  if (text.size() % 4 != 0)
    return std::nullopt;
  int8_t table[256];
  std::fill(std::begin(table), std::end(table), -1);
  for (int i = 0; i < 64; ++i)
    table[static_cast<uint8_t>(kBase64Chars[i])] = static_cast<int8_t>(i);
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    int pad = 0;
    uint32_t word = 0;
    for (int j = 0; j < 4; ++j) {
      char c = text[i + j];
      if (c == '=' && last && j >= 2) {
        ++pad;
        word <<= 6;
        continue;
      }
      int8_t v = table[static_cast<uint8_t>(c)];
      if (v < 0 || pad)
        return std::nullopt;
      word = (word << 6) | static_cast<uint32_t>(v);
    }
    out.push_back(static_cast<uint8_t>(word >> 16));
    if (pad < 2)
      out.push_back(static_cast<uint8_t>(word >> 8));
    if (pad < 1)
      out.push_back(static_cast<uint8_t>(word));
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Parser
//===----------------------------------------------------------------------===//

/// A value of a program document being read. Programs are read with simdjson
/// and written with nlohmann_json: a compile-cache hit loads every program of
/// the graph, and building nlohmann's DOM took three quarters of a load.
struct Json {
  Json(simdjson::dom::element element) : element(element) {}

  bool is_object() const { return element.is_object(); }
  bool is_string() const { return element.is_string(); }
  bool is_null() const { return element.is_null(); }
  /// The object's fields (empty for any other value).
  simdjson::dom::object members() const {
    simdjson::dom::object object;
    if (element.get_object().get(object))
      return {};
    return object;
  }
  /// The object's field `key`, if it is an object that has one.
  std::optional<Json> find(std::string_view key) const {
    simdjson::dom::element value;
    if (element.at_key(key).get(value))
      return std::nullopt;
    return Json(value);
  }
  bool contains(std::string_view key) const { return find(key).has_value(); }
  /// The field `key`, which the caller has checked is there.
  Json operator[](std::string_view key) const { return *find(key); }
  /// The type's name in errors (the names JSON Schema uses).
  std::string typeName() const {
    switch (element.type()) {
    case simdjson::dom::element_type::ARRAY:
      return "array";
    case simdjson::dom::element_type::OBJECT:
      return "object";
    case simdjson::dom::element_type::STRING:
      return "string";
    case simdjson::dom::element_type::BOOL:
      return "boolean";
    case simdjson::dom::element_type::NULL_VALUE:
      return "null";
    default:
      return "number";
    }
  }
  std::string dump() const { return simdjson::minify(element); }

  simdjson::dom::element element;
};

/// Where a value sits in the program document, for error messages: a chain
/// of pieces that live on the parser's stack, spelled out only when an error
/// is reported (spelling it for every value cost more than the parse).
class Where {
public:
  /// A top-level place: "program", "buffers", "body".
  explicit Where(const char *root) : pre(root) {}
  /// `<this> field '<key>'`.
  Where field(std::string_view key) const {
    return Where(this, " field '", key, "'");
  }
  /// `<this>[<i>]`.
  Where index(size_t i) const {
    Where item(this, "[", {}, "]");
    item.number = i;
    return item;
  }
  /// `<this><pre><text><post>`.
  Where append(const char *pre, std::string_view text = {},
               const char *post = "") const {
    return Where(this, pre, text, post);
  }
  std::string str() const {
    std::string out = parent ? parent->str() : std::string();
    out += pre;
    out += text;
    if (number)
      out += std::to_string(*number);
    return out + post;
  }

private:
  Where(const Where *parent, const char *pre, std::string_view text,
        const char *post)
      : parent(parent), pre(pre), text(text), post(post) {}

  const Where *parent = nullptr;
  const char *pre;
  std::string_view text;
  const char *post = "";
  std::optional<size_t> number;
};

[[noreturn]] void fail(const Where &where, const std::string &what) {
  throw Error(where.str() + ": " + what);
}

template <typename Keys>
void checkKeysIn(const Json &object, const Keys &allowed, const Where &where) {
  for (simdjson::dom::key_value_pair member : object.members())
    if (std::find(allowed.begin(), allowed.end(), member.key) == allowed.end())
      fail(where, "unknown field '" + std::string(member.key) + "'");
}

void checkKeys(const Json &object,
               std::initializer_list<std::string_view> allowed,
               const Where &where) {
  checkKeysIn(object, allowed, where);
}

Json requireKey(const Json &object, std::string_view key, const Where &where) {
  std::optional<Json> value = object.find(key);
  if (!value)
    fail(where, "missing field '" + std::string(key) + "'");
  return *value;
}

int64_t asInt(const Json &value, const Where &where) {
  int64_t result;
  if (!value.element.get_int64().get(result))
    return result;
  if (value.element.is_uint64())
    fail(where, "integer out of range");
  fail(where, "expected an integer, got " + value.typeName());
}

/// A JSON number, or {"float": "inf" | "-inf" | "nan"} for the values JSON
/// cannot spell (same encoding as FX_GRAPH_FORMAT.md).
double asNumber(const Json &value, const Where &where) {
  double result;
  if (value.element.is_number() && !value.element.get_double().get(result))
    return result;
  std::string_view text;
  if (value.is_object() && value.members().size() == 1)
    if (std::optional<Json> spelled = value.find("float"))
      if (!spelled->element.get_string().get(text)) {
        if (text == "inf")
          return std::numeric_limits<double>::infinity();
        if (text == "-inf")
          return -std::numeric_limits<double>::infinity();
        if (text == "nan")
          return std::numeric_limits<double>::quiet_NaN();
      }
  fail(where, "expected a number or {\"float\": \"inf\"|\"-inf\"|\"nan\"}, "
              "got " +
                  value.dump());
}

bool asBool(const Json &value, const Where &where) {
  bool result;
  if (value.element.get_bool().get(result))
    fail(where, "expected a boolean, got " + value.typeName());
  return result;
}

std::string asString(const Json &value, const Where &where) {
  std::string_view result;
  if (value.element.get_string().get(result))
    fail(where, "expected a string, got " + value.typeName());
  return std::string(result);
}

/// The elements of an array, in order (simdjson's arrays are walked, not
/// indexed).
std::vector<Json> asArray(const Json &value, const Where &where) {
  simdjson::dom::array array;
  if (value.element.get_array().get(array))
    fail(where, "expected an array, got " + value.typeName());
  std::vector<Json> items;
  items.reserve(array.size());
  for (simdjson::dom::element item : array)
    items.emplace_back(item);
  return items;
}

void requireObject(const Json &value, const Where &where) {
  if (!value.is_object())
    fail(where, "expected an object, got " + value.typeName());
}

std::vector<int64_t> asIntList(const Json &value, const Where &where) {
  std::vector<int64_t> result;
  const std::vector<Json> array = asArray(value, where);
  for (size_t i = 0; i < array.size(); ++i)
    result.push_back(asInt(array[i], where.index(i)));
  return result;
}

struct OpSpec {
  Opcode op;
  std::vector<std::string_view> required;
  std::vector<std::string_view> optional;
  /// Every field the op may have: op, engine, loc, waits, required, optional.
  std::vector<std::string_view> allowed;

  bool takes(std::string_view name) const {
    auto in = [&](const std::vector<std::string_view> &names) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    return in(required) || in(optional);
  }
};

/// The fields of each instruction besides op, engine, loc and waits.
OpSpec makeOpSpec(Opcode op) {
  switch (op) {
  case Opcode::DmaCopy:
    return {op, {"src", "dst"}, {"dge"}};
  case Opcode::DmaGather:
    return {op, {"table", "indices", "dst"}, {}};
  case Opcode::DmaScatter:
    return {op, {"src", "indices", "dst"}, {"accumulate", "disjoint"}};
  case Opcode::Matmul:
    return {op,
            {"stationary", "moving", "dst"},
            {"accumulate", "double_row", "is_transpose", "stationary_scale",
             "moving_scale"}};
  case Opcode::Activation:
    return {op,
            {"src", "dst", "func"},
            {"bias", "scale_col", "reduce_res", "scale", "bias_imm"}};
  case Opcode::TensorTensor:
    return {op, {"a", "b", "dst", "alu_op"}, {}};
  case Opcode::ScalarTensorTensor:
    return {op, {"a", "b", "dst", "alu_op0", "alu_op1"}, {"scalar", "imm"}};
  case Opcode::TensorScalar:
    return {op, {"src", "dst", "alu_op"}, {"scalar", "imm", "reverse"}};
  case Opcode::TensorReduce:
    return {op, {"src", "dst", "alu_op"}, {}};
  case Opcode::BnStats:
  case Opcode::BnAggr:
    return {op, {"src", "dst"}, {}};
  case Opcode::Select:
    return {op, {"pred", "on_true", "on_false", "dst"}, {}};
  case Opcode::Iota:
    return {
        op, {"dst"}, {"offset", "base", "channel_multiplier", "multipliers"}};
  case Opcode::Memset:
    return {op, {"dst", "value"}, {}};
  case Opcode::Rand:
    return {op,
            {"dst", "seed"},
            {"offset", "stream", "channel_multiplier", "multipliers"}};
  case Opcode::Copy:
    return {op, {"src", "dst"}, {}};
  case Opcode::NGather:
    return {op, {"src", "indices", "dst"}, {}};
  case Opcode::Collective:
    return {op, {"src", "dst", "kind", "group"}, {"alu_op"}};
  }
  throw Error("internal error: no spec for op");
}

const OpSpec &opSpec(Opcode op) {
  static const std::vector<OpSpec> specs = [] {
    std::vector<OpSpec> all;
    for (Opcode each : kAllOpcodes) {
      OpSpec spec = makeOpSpec(each);
      spec.allowed = {"op", "engine", "loc", "waits"};
      spec.allowed.insert(spec.allowed.end(), spec.required.begin(),
                          spec.required.end());
      spec.allowed.insert(spec.allowed.end(), spec.optional.begin(),
                          spec.optional.end());
      all.push_back(std::move(spec));
    }
    return all;
  }();
  return specs.at(static_cast<size_t>(op));
}

// Attribute values by kind (InstructionSet.def's NEURON_ATTRIBUTE): one
// reader and one writer per AttributeKind, chosen at compile time, so the
// parser and the writer follow the table instead of naming attributes.
template <AttributeKind K>
using KindTag = std::integral_constant<AttributeKind, K>;
using AK = AttributeKind;
/// Reads an affine index: the parser's, which evaluates size expressions.
using AffineReader = std::function<AffineExpr(const Json &, const Where &)>;

AluOp parseAluOpValue(const Json &value, const Where &where) {
  std::string name = asString(value, where);
  // PROGRAM_FORMAT.md spells the product reduction "mul".
  std::optional<AluOp> op =
      name == "mul" ? std::optional<AluOp>(AluOp::Multiply) : parseAluOp(name);
  if (!op)
    fail(where, "unknown ALU op '" + name + "'");
  return *op;
}

void readAttribute(KindTag<AK::Bool>, bool &out, const Json &value,
                   const Where &where, const AffineReader &affine) {
  out = asBool(value, where);
}
void readAttribute(KindTag<AK::Number>, double &out, const Json &value,
                   const Where &where, const AffineReader &affine) {
  out = asNumber(value, where);
}
void readAttribute(KindTag<AK::Immediate>, std::optional<double> &out,
                   const Json &value, const Where &where,
                   const AffineReader &affine) {
  out = asNumber(value, where);
}
void readAttribute(KindTag<AK::Int>, int64_t &out, const Json &value,
                   const Where &where, const AffineReader &affine) {
  out = asInt(value, where);
}
void readAttribute(KindTag<AK::Group>, int64_t &out, const Json &value,
                   const Where &where, const AffineReader &affine) {
  out = asInt(value, where);
}
void readAttribute(KindTag<AK::NumberList>, std::vector<double> &out,
                   const Json &value, const Where &where,
                   const AffineReader &affine) {
  const std::vector<Json> array = asArray(value, where);
  out.clear();
  for (size_t i = 0; i < array.size(); ++i)
    out.push_back(asNumber(array[i], where.index(i)));
}
void readAttribute(KindTag<AK::Affine>, std::optional<AffineExpr> &out,
                   const Json &value, const Where &where,
                   const AffineReader &affine) {
  out = affine(value, where);
}
void readAttribute(KindTag<AK::ActFunc>, ActFunc &out, const Json &value,
                   const Where &where, const AffineReader &affine) {
  std::string name = asString(value, where);
  std::optional<ActFunc> func = parseActFunc(name);
  if (!func)
    fail(where, "unknown activation function '" + name + "'");
  out = *func;
}
void readAttribute(KindTag<AK::AluOp>, AluOp &out, const Json &value,
                   const Where &where, const AffineReader &affine) {
  out = parseAluOpValue(value, where);
}
void readAttribute(KindTag<AK::Collective>, Collective &out, const Json &value,
                   const Where &where, const AffineReader &affine) {
  std::string name = asString(value, where);
  std::optional<Collective> kind = parseCollective(name);
  if (!kind)
    fail(where, "unknown collective '" + name + "'");
  out = *kind;
}
void readAttribute(KindTag<AK::Dge>, bool &out, const Json &value,
                   const Where &where, const AffineReader &affine) {
  std::string mode = asString(value, where);
  if (mode != "none" && mode != "hwdge")
    fail(where, "must be \"none\" or \"hwdge\" (software DGE is a "
                "dma_copy issued by gpsimd), got '" +
                    mode + "'");
  out = mode == "hwdge";
}

/// Reads one attribute into its Instruction member.
using AttributeReader = void (*)(Instruction &, const Json &, const Where &,
                                 const AffineReader &);

/// The reader of the attribute spelled `key` (null for op, engine, loc, waits
/// and the operands, which parseInstruction reads itself).
AttributeReader findAttributeReader(std::string_view key) {
  static const std::unordered_map<std::string_view, AttributeReader> readers = {
#define NEURON_ATTRIBUTE(Member, Spelling, Kind, Source)                       \
  {Spelling, [](Instruction &inst, const Json &value, const Where &where,      \
                const AffineReader &affine) {                                  \
     readAttribute(KindTag<AK::Kind>(), inst.Member, value, where, affine);    \
   }},
#include "runtime/program/InstructionSet.def"
  };
  auto it = readers.find(key);
  return it == readers.end() ? nullptr : it->second;
}

/// Removes the loops an instance of a size-generic program runs zero times
/// (a last tile that is not there at these sizes; their views may be empty)
/// and renumbers `waits`, which count instructions in pre-order: waiting for
/// an instruction that never runs is no wait at all.
void dropEmptyLoops(Program &program) {
  std::vector<int64_t> renumbered; // old index -> new index, or -1
  int64_t kept = 0;
  std::function<void(const std::vector<Node> &, bool)> number =
      [&](const std::vector<Node> &nodes, bool dead) {
        for (const Node &node : nodes) {
          if (node.isLoop())
            number(node.body, dead || node.count == 0);
          else
            renumbered.push_back(dead ? -1 : kept++);
        }
      };
  number(program.body, false);
  if (kept == static_cast<int64_t>(renumbered.size()))
    return;
  std::function<void(std::vector<Node> &)> rewrite =
      [&](std::vector<Node> &nodes) {
        nodes.erase(std::remove_if(nodes.begin(), nodes.end(),
                                   [](const Node &node) {
                                     return node.isLoop() && node.count == 0;
                                   }),
                    nodes.end());
        for (Node &node : nodes) {
          if (node.isLoop()) {
            rewrite(node.body);
            continue;
          }
          std::vector<int64_t> waits;
          for (int64_t old : node.inst.waits)
            if (old >= static_cast<int64_t>(renumbered.size()))
              waits.push_back(old); // out of range: the verifier reports it
            else if (renumbered[old] >= 0)
              waits.push_back(renumbered[old]);
          node.inst.waits = std::move(waits);
        }
      };
  rewrite(program.body);
}

class Parser {
public:
  /// `sizes`: the values of a size-generic program's parameters (null for a
  /// static program, whose integers are all literals).
  explicit Parser(const SizeEnv *sizes) : sizes(sizes) {}
  Program parseDocument(const Json &doc);
  std::vector<SizeParam> parseParams(const Json &value) const;

private:
  const SizeEnv *sizes;

  /// An integer that may be a size expression (PROGRAM_FORMAT.md, "Size
  /// parameters"), evaluated with `sizes`.
  int64_t asSize(const Json &value, const Where &where) const;
  std::vector<int64_t> asSizeList(const Json &value, const Where &where) const;
  AffineExpr parseAffine(const Json &value, const Where &where);
  View parseView(const Json &value, const Where &where);
  Buffer parseBuffer(const Json &value, const Where &where);
  std::vector<Node> parseNodes(const Json &value, const Where &where,
                               int depth);
  Instruction parseInstruction(const Json &value, const Where &where);
};

/// {"const": c, "terms": [[iv, coeff], ...]}, both fields optional.
AffineExpr Parser::parseAffine(const Json &value, const Where &where) {
  requireObject(value, where);
  checkKeys(value, {"const", "terms"}, where);
  AffineExpr expr;
  if (value.contains("const"))
    expr.constant = asSize(value["const"], where.field("const"));
  if (value.contains("terms")) {
    Where termsWhere = where.field("terms");
    const std::vector<Json> terms = asArray(value["terms"], termsWhere);
    for (size_t i = 0; i < terms.size(); ++i) {
      Where termWhere = termsWhere.index(i);
      const std::vector<Json> term = asArray(terms[i], termWhere);
      if (term.size() != 2)
        fail(termWhere, "a term is [iv, coeff]");
      expr.terms.emplace_back(asInt(term[0], termWhere),
                              asSize(term[1], termWhere));
    }
  }
  return expr;
}

View Parser::parseView(const Json &value, const Where &where) {
  requireObject(value, where);
  checkKeys(value, {"buf", "offset", "shape", "strides"}, where);
  View view;
  view.buffer = asInt(requireKey(value, "buf", where), where.field("buf"));
  view.shape =
      asSizeList(requireKey(value, "shape", where), where.field("shape"));
  view.strides =
      asSizeList(requireKey(value, "strides", where), where.field("strides"));
  if (value.contains("offset"))
    view.offset = parseAffine(value["offset"], where.field("offset"));
  return view;
}

int64_t Parser::asSize(const Json &value, const Where &where) const {
  if (!value.is_string())
    return asInt(value, where);
  std::string text = asString(value, where);
  if (!sizes)
    fail(where, "size expression '" + text +
                    "' in a program without size parameters' values");
  try {
    return evaluate(parseSizeExpr(text), *sizes);
  } catch (const Error &e) {
    fail(where, e.what());
  }
}

std::vector<int64_t> Parser::asSizeList(const Json &value,
                                        const Where &where) const {
  std::vector<int64_t> result;
  const std::vector<Json> array = asArray(value, where);
  for (size_t i = 0; i < array.size(); ++i)
    result.push_back(asSize(array[i], where.index(i)));
  return result;
}

/// "params": [{"name": "s0", "min": 1, "max": 4096}, ...]; with `sizes`, each
/// must be given and in its range, and `sizes` names no other.
std::vector<SizeParam> Parser::parseParams(const Json &value) const {
  const Where where("params");
  const std::vector<Json> array = asArray(value, where);
  std::vector<SizeParam> params;
  for (size_t i = 0; i < array.size(); ++i) {
    Where paramWhere = where.index(i);
    requireObject(array[i], paramWhere);
    checkKeys(array[i], {"name", "min", "max"}, paramWhere);
    SizeParam param;
    param.name = asString(requireKey(array[i], "name", paramWhere),
                          paramWhere.field("name"));
    if (!isSizeParamName(param.name))
      fail(paramWhere.field("name"), "'" + param.name + "' is not a name");
    for (const SizeParam &other : params)
      if (other.name == param.name)
        fail(paramWhere.field("name"), "duplicate '" + param.name + "'");
    if (array[i].contains("min"))
      param.min = asInt(array[i]["min"], paramWhere.field("min"));
    if (array[i].contains("max") && !array[i]["max"].is_null())
      param.max = asInt(array[i]["max"], paramWhere.field("max"));
    if (param.max && *param.max < param.min)
      fail(paramWhere, "max is below min");
    params.push_back(std::move(param));
  }
  if (!sizes)
    return params;
  for (const SizeParam &param : params) {
    auto it = sizes->find(param.name);
    if (it == sizes->end())
      fail(where, "no value for size parameter '" + param.name + "'");
    if (it->second < param.min || (param.max && it->second > *param.max))
      fail(where, "size parameter '" + param.name +
                      "' = " + std::to_string(it->second) + " is outside [" +
                      std::to_string(param.min) + ", " +
                      (param.max ? std::to_string(*param.max) : "inf") +
                      "], the range the program was compiled for");
  }
  for (const auto &[name, value] : *sizes)
    if (std::none_of(params.begin(), params.end(),
                     [&](const SizeParam &p) { return p.name == name; }))
      fail(where, "the program has no size parameter '" + name + "'");
  return params;
}

Program Parser::parseDocument(const Json &doc) {
  const Where where("program");
  requireObject(doc, where);
  checkKeys(doc,
            {"format", "version", "name", "target", "sync", "params", "buffers",
             "inputs", "outputs", "locations", "groups", "body"},
            where);
  std::string format =
      asString(requireKey(doc, "format", where), where.field("format"));
  if (format != kProgramFormat)
    fail(where.field("format"), "expected '" + std::string(kProgramFormat) +
                                    "', got '" + format + "'");
  const Json versionValue = requireKey(doc, "version", where);
  if (!versionValue.element.is_int64() ||
      asInt(versionValue, where.field("version")) != kProgramVersion)
    fail(where.field("version"), "unsupported version " + versionValue.dump() +
                                     " (this runtime reads version " +
                                     std::to_string(kProgramVersion) + ")");

  Program program;
  program.version = kProgramVersion;
  if (doc.contains("name"))
    program.name = asString(doc["name"], where.field("name"));
  program.target =
      asString(requireKey(doc, "target", where), where.field("target"));
  if (doc.contains("sync")) {
    // Derived sync is spelled by leaving the field out.
    std::string sync = asString(doc["sync"], where.field("sync"));
    if (sync != "explicit")
      fail(where.field("sync"),
           "expected \"explicit\" (omit the field for derived sync), got '" +
               sync + "'");
    program.explicitSync = true;
  }

  if (doc.contains("params"))
    program.params = parseParams(doc["params"]);
  else if (sizes && !sizes->empty())
    fail(where, "size values given for a program without size parameters");

  const std::vector<Json> buffers =
      asArray(requireKey(doc, "buffers", where), where.field("buffers"));
  const Where buffersWhere("buffers");
  for (size_t i = 0; i < buffers.size(); ++i)
    program.buffers.push_back(parseBuffer(buffers[i], buffersWhere.index(i)));

  program.inputs =
      asIntList(requireKey(doc, "inputs", where), where.field("inputs"));
  program.outputs =
      asIntList(requireKey(doc, "outputs", where), where.field("outputs"));

  if (doc.contains("locations")) {
    const std::vector<Json> locs =
        asArray(doc["locations"], where.field("locations"));
    for (size_t i = 0; i < locs.size(); ++i)
      program.locations.push_back(
          asString(locs[i], Where("locations").index(i)));
  }

  if (doc.contains("groups")) {
    const std::vector<Json> groups =
        asArray(doc["groups"], where.field("groups"));
    const Where groupsWhere("groups");
    for (size_t i = 0; i < groups.size(); ++i) {
      Where groupWhere = groupsWhere.index(i);
      requireObject(groups[i], groupWhere);
      checkKeys(groups[i], {"name", "ranks"}, groupWhere);
      CollectiveGroup group;
      group.name = asString(requireKey(groups[i], "name", groupWhere),
                            groupWhere.field("name"));
      group.ranks = asIntList(requireKey(groups[i], "ranks", groupWhere),
                              groupWhere.field("ranks"));
      program.groups.push_back(std::move(group));
    }
  }

  program.body = parseNodes(requireKey(doc, "body", where), Where("body"), 0);
  if (!program.params.empty())
    dropEmptyLoops(program);
  return program;
}

Buffer Parser::parseBuffer(const Json &value, const Where &where) {
  requireObject(value, where);
  checkKeys(value,
            {"id", "name", "space", "kind", "dtype", "shape", "data", "splat",
             "address"},
            where);
  Buffer buffer;
  buffer.id = asInt(requireKey(value, "id", where), where.field("id"));
  if (value.contains("name"))
    buffer.name = asString(value["name"], where.field("name"));

  std::string space =
      asString(requireKey(value, "space", where), where.field("space"));
  std::optional<Space> parsedSpace = parseSpace(space);
  if (!parsedSpace)
    fail(where.field("space"), "unknown space '" + space + "'");
  buffer.space = *parsedSpace;

  std::string kind =
      asString(requireKey(value, "kind", where), where.field("kind"));
  std::optional<BufferKind> parsedKind = parseBufferKind(kind);
  if (!parsedKind)
    fail(where.field("kind"), "unknown kind '" + kind + "'");
  buffer.kind = *parsedKind;

  std::string dtype =
      asString(requireKey(value, "dtype", where), where.field("dtype"));
  std::optional<DType> parsedDType = parseDType(dtype);
  if (!parsedDType)
    fail(where.field("dtype"), "unknown dtype '" + dtype + "'");
  buffer.dtype = *parsedDType;

  Json shape = requireKey(value, "shape", where);
  buffer.shape = asSizeList(shape, where.field("shape"));
  if (buffer.isOnChip())
    for (const Json &dim : asArray(shape, where.field("shape")))
      if (dim.is_string())
        fail(where.field("shape"), "an on-chip buffer's shape is static "
                                   "(sized for the parameters' maxima)");

  if (value.contains("data")) {
    std::string text = asString(value["data"], where.field("data"));
    std::optional<std::vector<uint8_t>> bytes = decodeBase64(text);
    if (!bytes)
      fail(where.field("data"), "invalid base64");
    buffer.data = std::move(*bytes);
  }
  if (value.contains("splat"))
    buffer.splat = asNumber(value["splat"], where.field("splat"));
  if (value.contains("address")) {
    buffer.address = asInt(value["address"], where.field("address"));
    if (*buffer.address < 0)
      fail(where.field("address"), "must be a non-negative byte offset");
  }
  return buffer;
}

std::vector<Node> Parser::parseNodes(const Json &value, const Where &where,
                                     int depth) {
  if (depth > kMaxLoopDepth)
    fail(where, "loops nested deeper than " + std::to_string(kMaxLoopDepth));
  const std::vector<Json> array = asArray(value, where);
  std::vector<Node> nodes;
  nodes.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    Where nodeWhere = where.index(i);
    const Json &item = array[i];
    requireObject(item, nodeWhere);
    if (item.contains("loop")) {
      checkKeys(item, {"loop", "count", "body"}, nodeWhere);
      int64_t id = asInt(item["loop"], nodeWhere.field("loop"));
      int64_t count = asSize(requireKey(item, "count", nodeWhere),
                             nodeWhere.field("count"));
      std::vector<Node> body = parseNodes(requireKey(item, "body", nodeWhere),
                                          nodeWhere.append(".body"), depth + 1);
      nodes.push_back(Node::makeLoop(id, count, std::move(body)));
    } else if (item.contains("op")) {
      nodes.push_back(Node::makeInstruction(parseInstruction(item, nodeWhere)));
    } else {
      fail(nodeWhere, "a node needs 'loop' or 'op'");
    }
  }
  return nodes;
}

Instruction Parser::parseInstruction(const Json &value,
                                     const Where &nodeWhere) {
  Instruction inst;
  std::string opName = asString(value["op"], nodeWhere.field("op"));
  std::optional<Opcode> op = parseOpcode(opName);
  if (!op)
    fail(nodeWhere.field("op"), "unknown op '" + opName + "'");
  inst.op = *op;
  Where where = nodeWhere.append(" (", opName, ")");

  const OpSpec &spec = opSpec(inst.op);
  checkKeysIn(value, spec.allowed, where);
  for (std::string_view key : spec.required)
    requireKey(value, key, where);

  std::string engine =
      asString(requireKey(value, "engine", where), where.field("engine"));
  std::optional<Engine> parsedEngine = parseEngine(engine);
  if (!parsedEngine)
    fail(where.field("engine"), "unknown engine '" + engine + "'");
  inst.engine = *parsedEngine;

  if (value.contains("loc")) {
    inst.loc = asInt(value["loc"], where.field("loc"));
    if (inst.loc < 0)
      fail(where.field("loc"), "must be a non-negative index");
  }
  if (value.contains("waits")) {
    Where waitsWhere = where.field("waits");
    const std::vector<Json> waits = asArray(value["waits"], waitsWhere);
    for (size_t i = 0; i < waits.size(); ++i) {
      Where itemWhere = waitsWhere.index(i);
      // {"on": k, "when": size expression}: a wait at the sizes where the
      // expression is positive (size-generic programs).
      Json on = waits[i];
      if (waits[i].is_object()) {
        checkKeys(waits[i], {"on", "when"}, itemWhere);
        on = requireKey(waits[i], "on", itemWhere);
        if (asSize(requireKey(waits[i], "when", itemWhere),
                   itemWhere.field("when")) <= 0)
          continue;
      }
      int64_t k = asInt(on, itemWhere);
      if (k < 0)
        fail(itemWhere, "must be a non-negative instruction index");
      inst.waits.push_back(k);
    }
  }

  AffineReader affine = [&](const Json &item, const Where &where) {
    return parseAffine(item, where);
  };
  for (simdjson::dom::key_value_pair member : value.members()) {
    Where keyWhere = where.field(member.key);
    if (const OperandField *operand = findOperandField(member.key))
      inst.*(operand->member) = parseView(member.value, keyWhere);
    else if (AttributeReader read = findAttributeReader(member.key))
      read(inst, member.value, keyWhere, affine);
  }
  return inst;
}

} // namespace

namespace {

/// The document `text`, which lives as long as `parser`.
Json parseProgramJson(simdjson::dom::parser &parser, const std::string &text) {
  simdjson::dom::element doc;
  if (simdjson::error_code error = parser.parse(text).get(doc))
    throw Error(std::string("malformed program JSON: ") +
                simdjson::error_message(error));
  return doc;
}

} // namespace

Program Program::parse(const std::string &text, const SizeEnv *sizes) {
  simdjson::dom::parser parser;
  return Parser(sizes).parseDocument(parseProgramJson(parser, text));
}

std::vector<SizeParam> Program::readParams(const std::string &text) {
  simdjson::dom::parser parser;
  Json doc = parseProgramJson(parser, text);
  std::optional<Json> params =
      doc.is_object() ? doc.find("params") : std::nullopt;
  return params ? Parser(nullptr).parseParams(*params)
                : std::vector<SizeParam>{};
}

Program Program::loadFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error("cannot open program file '" + path + "'");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad())
    throw Error("cannot read program file '" + path + "'");
  try {
    return parse(buffer.str());
  } catch (const Error &e) {
    throw Error(path + ": " + e.what());
  }
}

//===----------------------------------------------------------------------===//
// Verifier
//===----------------------------------------------------------------------===//

namespace {

using Int128 = __int128;

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

int64_t product(const std::vector<int64_t> &shape, size_t from) {
  int64_t total = 1;
  for (size_t i = from; i < shape.size(); ++i)
    total *= shape[i]; // Bounded: view element counts are checked first.
  return total;
}

/// Whether `view` walks its elements in row-major order without gaps
/// (strides of size-1 dims do not matter).
bool isContiguous(const View &view) {
  int64_t expected = 1;
  for (size_t d = view.shape.size(); d-- > 0;) {
    if (view.shape[d] != 1 && view.strides[d] != expected)
      return false;
    expected *= view.shape[d];
  }
  return true;
}

// Views larger than this are rejected so scratch allocation stays sane.
constexpr int64_t kMaxViewElements = int64_t(1) << 34;

class Verifier {
public:
  Verifier(const Program &program, const neuron::target::Target &target)
      : program(program), target(target) {}
  void run();

private:
  void verifyBuffers();
  void verifyGroups();
  void verifyArguments(const std::vector<int64_t> &ids, BufferKind kind,
                       const char *fieldName);
  void verifyNodes(const std::vector<Node> &nodes, const std::string &where);
  void verifyInstruction(const Instruction &inst, const std::string &where);
  void verifyCollective(const Instruction &inst,
                        const std::map<std::string, const Buffer *> &buffers);
  void verifyStatistics(const Instruction &inst,
                        const std::map<std::string, const Buffer *> &buffers);
  const Buffer &verifyView(const View &view, const std::string &where);
  void verifyIotaOffset(const Instruction &inst, const AffineExpr &offset);
  [[noreturn]] void failInst(const Instruction &inst, const std::string &what);
  std::string instName(const Instruction &inst) const;

  const Program &program;
  const neuron::target::Target &target;
  std::map<int64_t, const Buffer *> bufferById;
  // Loops enclosing the current node: id -> count.
  std::map<int64_t, int64_t> scope;
  std::set<int64_t> usedLoopIds;
  int64_t instIndex = 0;
  int64_t numInstructions = 0;
  std::string instWhere;
};

void Verifier::run() {
  if (program.version != kProgramVersion)
    throw Error("program: unsupported version " +
                std::to_string(program.version));
  if (program.target != target.name)
    throw Error("program field 'target': program is for '" + program.target +
                "', not '" + target.name + "'");
  verifyBuffers();
  verifyGroups();
  verifyArguments(program.inputs, BufferKind::Input, "inputs");
  verifyArguments(program.outputs, BufferKind::Output, "outputs");
  numInstructions = program.numInstructions();
  verifyNodes(program.body, "body");
}

void Verifier::verifyGroups() {
  std::set<std::string> names;
  for (size_t i = 0; i < program.groups.size(); ++i) {
    const CollectiveGroup &group = program.groups[i];
    std::string where = "program field 'groups[" + std::to_string(i) + "]'";
    if (!names.insert(group.name).second)
      throw Error(where + ": group '" + group.name + "' is listed twice");
    if (group.ranks.empty())
      throw Error(where + ": group '" + group.name + "' has no ranks");
    std::set<int64_t> ranks;
    for (int64_t r : group.ranks)
      if (r < 0 || !ranks.insert(r).second)
        throw Error(where + ": rank " + std::to_string(r) +
                    " is negative or listed twice");
  }
}

void Verifier::verifyBuffers() {
  Int128 sbufBytes = 0, psumBytes = 0, hbmBytes = 0;
  // The first on-chip buffer with and the first without an address.
  std::string addressed, unaddressed;
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    const Buffer &buffer = program.buffers[i];
    std::string where = "buffers[" + std::to_string(i) + "] ('" + buffer.name +
                        "', id " + std::to_string(buffer.id) + ")";
    if (!bufferById.emplace(buffer.id, &buffer).second)
      throw Error(where + " field 'id': duplicate buffer id");

    bool onChip = buffer.isOnChip();
    if (onChip != (buffer.kind == BufferKind::Scratch))
      throw Error(where + " field 'space': a " + bufferKindName(buffer.kind) +
                  " buffer cannot live in " + spaceName(buffer.space) +
                  " (scratch buffers are on-chip, all others in hbm)");

    // Empty HBM tensors exist (and have no instructions); tiles never are.
    for (int64_t dim : buffer.shape)
      if (dim < (onChip ? 1 : 0))
        throw Error(where + " field 'shape': dimensions must be >= " +
                    (onChip ? "1" : "0") + ", got " +
                    shapeString(buffer.shape));
    std::optional<int64_t> elements = shapeElements(buffer.shape);
    Int128 bytes = 0;
    if (!elements ||
        __builtin_mul_overflow(*elements, dtypeSize(buffer.dtype), &bytes))
      throw Error(where + " field 'shape': buffer size overflows");

    if (onChip) {
      if (buffer.shape.empty())
        throw Error(where + " field 'shape': on-chip buffers are "
                            "[partitions, free...]");
      if (buffer.shape[0] > target.partitions)
        throw Error(where + " field 'shape': partition dim " +
                    std::to_string(buffer.shape[0]) + " exceeds the " +
                    std::to_string(target.partitions) + " partitions of " +
                    target.name);
      (buffer.space == Space::SBUF ? sbufBytes : psumBytes) +=
          buffer.bytesPerPartition();
      if (buffer.address) {
        // Addressed buffers may overlap; each must fit on its own.
        bool sbuf = buffer.space == Space::SBUF;
        int64_t capacity =
            sbuf ? target.sbufBytesPerPartition : target.psumBytesPerPartition;
        Int128 end =
            static_cast<Int128>(*buffer.address) + buffer.bytesPerPartition();
        if (*buffer.address < 0 || end > capacity)
          throw Error(where + " field 'address': bytes [" +
                      std::to_string(*buffer.address) + ", " +
                      std::to_string(static_cast<int64_t>(end)) +
                      ") per partition do not fit the " +
                      std::to_string(capacity) + " bytes of " +
                      (sbuf ? "SBUF" : "PSUM") + " per partition of " +
                      target.name);
        if (addressed.empty())
          addressed = where;
      } else if (unaddressed.empty()) {
        unaddressed = where;
      }
    } else {
      if (buffer.address)
        throw Error(where + " field 'address': only sbuf and psum buffers "
                            "have an address");
      hbmBytes += bytes;
    }

    if (buffer.kind == BufferKind::Constant) {
      bool hasData = !buffer.data.empty();
      if (hasData == buffer.splat.has_value())
        throw Error(where + ": a constant needs exactly one of 'data' and "
                            "'splat'");
      if (hasData && static_cast<Int128>(buffer.data.size()) != bytes)
        throw Error(
            where + " field 'data': " + std::to_string(buffer.data.size()) +
            " bytes, expected " + std::to_string(static_cast<int64_t>(bytes)) +
            " (" + shapeString(buffer.shape) + " x " + dtypeName(buffer.dtype) +
            ")");
    } else if (!buffer.data.empty() || buffer.splat) {
      throw Error(where + ": only constant buffers may have 'data' or 'splat'");
    }
  }
  if (!addressed.empty() && !unaddressed.empty())
    throw Error("buffers: either every on-chip buffer has an 'address' or "
                "none does; " +
                addressed + " has one, " + unaddressed + " has none");
  // Without addresses every buffer needs bytes of its own.
  if (addressed.empty() && sbufBytes > target.sbufBytesPerPartition)
    throw Error("buffers: SBUF scratch needs " +
                std::to_string(static_cast<int64_t>(sbufBytes)) +
                " bytes per partition, " + target.name + " has " +
                std::to_string(target.sbufBytesPerPartition));
  if (addressed.empty() && psumBytes > target.psumBytesPerPartition)
    throw Error("buffers: PSUM scratch needs " +
                std::to_string(static_cast<int64_t>(psumBytes)) +
                " bytes per partition, " + target.name + " has " +
                std::to_string(target.psumBytesPerPartition));
  if (hbmBytes > target.hbmBytesPerCore)
    throw Error("buffers: HBM buffers need " +
                std::to_string(static_cast<int64_t>(hbmBytes)) + " bytes, " +
                target.name + " has " + std::to_string(target.hbmBytesPerCore) +
                " per core");
}

void Verifier::verifyArguments(const std::vector<int64_t> &ids, BufferKind kind,
                               const char *fieldName) {
  std::set<int64_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string where = std::string("program field '") + fieldName + "'[" +
                        std::to_string(i) + "]";
    auto it = bufferById.find(ids[i]);
    if (it == bufferById.end())
      throw Error(where + ": no buffer with id " + std::to_string(ids[i]));
    if (it->second->kind != kind)
      throw Error(where + ": buffer " + std::to_string(ids[i]) + " is " +
                  bufferKindName(it->second->kind) + ", expected " +
                  bufferKindName(kind));
    if (!seen.insert(ids[i]).second)
      throw Error(where + ": buffer " + std::to_string(ids[i]) +
                  " listed twice");
  }
  for (const Buffer &buffer : program.buffers)
    if (buffer.kind == kind && !seen.count(buffer.id))
      throw Error(std::string("program field '") + fieldName +
                  "': " + bufferKindName(kind) + " buffer " +
                  std::to_string(buffer.id) + " ('" + buffer.name +
                  "') is not listed");
}

void Verifier::verifyNodes(const std::vector<Node> &nodes,
                           const std::string &where) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node &node = nodes[i];
    std::string nodeWhere = where + "[" + std::to_string(i) + "]";
    if (!node.isLoop()) {
      verifyInstruction(node.inst, nodeWhere);
      continue;
    }
    if (scope.count(node.loopId))
      throw Error(nodeWhere + " field 'loop': iv " +
                  std::to_string(node.loopId) +
                  " is already used by an enclosing loop");
    if (!usedLoopIds.insert(node.loopId).second)
      throw Error(nodeWhere + " field 'loop': loop id " +
                  std::to_string(node.loopId) +
                  " is not unique in the program");
    if (node.count < 1)
      throw Error(nodeWhere + " field 'count': must be >= 1, got " +
                  std::to_string(node.count));
    if (scope.size() >= static_cast<size_t>(kMaxLoopDepth))
      throw Error(nodeWhere + ": loops nested deeper than " +
                  std::to_string(kMaxLoopDepth));
    scope[node.loopId] = node.count;
    verifyNodes(node.body, nodeWhere + ".body");
    scope.erase(node.loopId);
  }
}

std::string Verifier::instName(const Instruction &inst) const {
  std::string name = instWhere + " (instruction #" + std::to_string(instIndex) +
                     ", " + opcodeName(inst.op);
  if (inst.loc >= 0 &&
      inst.loc < static_cast<int64_t>(program.locations.size()))
    name += " at " + program.locations[inst.loc];
  return name + ")";
}

void Verifier::failInst(const Instruction &inst, const std::string &what) {
  throw Error(instName(inst) + ": " + what);
}

const Buffer &Verifier::verifyView(const View &view, const std::string &where) {
  auto it = bufferById.find(view.buffer);
  if (it == bufferById.end())
    throw Error(where + " field 'buf': no buffer with id " +
                std::to_string(view.buffer));
  const Buffer &buffer = *it->second;
  if (view.shape.size() != view.strides.size())
    throw Error(where + ": shape " + shapeString(view.shape) + " and strides " +
                shapeString(view.strides) + " differ in rank");
  if (view.shape.size() > static_cast<size_t>(kMaxViewRank))
    throw Error(where + " field 'shape': more than " +
                std::to_string(kMaxViewRank) + " dims");
  for (int64_t dim : view.shape)
    if (dim < 1)
      throw Error(where + " field 'shape': dimensions must be >= 1, got " +
                  shapeString(view.shape));
  for (int64_t stride : view.strides)
    if (stride < 0)
      throw Error(where + " field 'strides': strides must be >= 0, got " +
                  shapeString(view.strides));
  std::optional<int64_t> elements = shapeElements(view.shape);
  if (!elements || *elements > kMaxViewElements)
    throw Error(where + " field 'shape': view too large " +
                shapeString(view.shape));
  if (buffer.isOnChip()) {
    if (view.shape.empty())
      throw Error(where + ": on-chip views need a partition dim");
    if (view.shape[0] > target.partitions)
      throw Error(where + " field 'shape': partition dim " +
                  std::to_string(view.shape[0]) + " exceeds the " +
                  std::to_string(target.partitions) + " partitions of " +
                  target.name);
  }

  // Extremes of the offset over the whole iteration space, from the sign of
  // each coefficient; int128 cannot overflow for int64 inputs of this size.
  // Each product is below 2^126; stopping once a sum leaves +-2^100 keeps
  // the int128 sums from overflowing (such a view is out of bounds anyway).
  const Int128 limit = static_cast<Int128>(1) << 100;
  Int128 low = view.offset.constant, high = view.offset.constant;
  bool overflow = false;
  for (const auto &[iv, coeff] : view.offset.terms) {
    auto found = scope.find(iv);
    if (found == scope.end())
      throw Error(where + " field 'offset': iv " + std::to_string(iv) +
                  " is not an enclosing loop");
    Int128 span = static_cast<Int128>(coeff) * (found->second - 1);
    (span < 0 ? low : high) += span;
    overflow |= low < -limit || high > limit;
  }
  for (size_t d = 0; d < view.shape.size() && !overflow; ++d) {
    high += static_cast<Int128>(view.shape[d] - 1) * view.strides[d];
    overflow |= high > limit;
  }
  int64_t size = buffer.numElements();
  if (overflow || low < 0 || high >= size) {
    auto str = [](Int128 v) {
      return std::to_string(static_cast<long long>(v));
    };
    bool fits = !overflow && low >= std::numeric_limits<long long>::min() &&
                high <= std::numeric_limits<long long>::max();
    throw Error(where + ": view out of bounds of buffer " +
                std::to_string(buffer.id) + " ('" + buffer.name + "', " +
                std::to_string(size) + " elements): element offsets span " +
                (fits ? "[" + str(low) + ", " + str(high) + "]"
                      : std::string("beyond int64")) +
                " over the loop iterations");
  }
  return buffer;
}

/// An iota's offset names enclosing loops and stays within int64 on every
/// iteration, so the executor can evaluate it without overflow.
void Verifier::verifyIotaOffset(const Instruction &inst,
                                const AffineExpr &offset) {
  const Int128 limit = std::numeric_limits<int64_t>::max();
  Int128 low = offset.constant, high = offset.constant;
  for (const auto &[iv, coeff] : offset.terms) {
    auto found = scope.find(iv);
    if (found == scope.end())
      failInst(inst, "field 'offset': iv " + std::to_string(iv) +
                         " is not an enclosing loop");
    Int128 span = static_cast<Int128>(coeff) * (found->second - 1);
    (span < 0 ? low : high) += span;
    // Each span is below 2^126 in magnitude; stopping here keeps the sums
    // within int128, and every partial sum (and each term) of the value
    // lies between low and high.
    if (span < -limit || span > limit || low < -limit || high > limit)
      failInst(inst, "field 'offset': its value leaves int64 over the loop "
                     "iterations");
  }
}

void Verifier::verifyInstruction(const Instruction &inst,
                                 const std::string &where) {
  instWhere = where;
  ++instIndex;
  std::string name = instName(inst);

  if (inst.loc >= static_cast<int64_t>(program.locations.size()))
    failInst(inst, "field 'loc': index " + std::to_string(inst.loc) +
                       " is past the " +
                       std::to_string(program.locations.size()) + " locations");

  if (!inst.waits.empty() && !program.explicitSync)
    failInst(inst, "field 'waits': waits need \"sync\": \"explicit\"");
  std::set<int64_t> waited;
  for (int64_t k : inst.waits) {
    if (k < 0 || k >= numInstructions)
      failInst(inst, "field 'waits': " + std::to_string(k) +
                         " is not an instruction index (the program's " +
                         std::to_string(numInstructions) +
                         " instructions are numbered from 0 in pre-order)");
    if (!waited.insert(k).second)
      failInst(inst, "field 'waits': instruction " + std::to_string(k) +
                         " is listed twice");
  }

  // Operand presence (parse enforces this for files; programs built in
  // memory get the same check here).
  const OpSpec &spec = opSpec(inst.op);
  std::map<std::string, const View *> views;
  for (const auto &[fieldName, view] : inst.operands())
    views[fieldName] = view;
  for (const auto &[fieldName, view] : views)
    if (!spec.takes(fieldName))
      failInst(inst, "unexpected operand '" + fieldName + "'");
  for (std::string_view key : spec.required)
    if (findOperandField(key) && !views.count(std::string(key)))
      failInst(inst, "missing operand '" + std::string(key) + "'");
  // The one attribute that names loops: verified below for iota and rand.
  if (inst.offset && inst.op != Opcode::Iota && inst.op != Opcode::Rand)
    failInst(inst, "unexpected field 'offset'");

  std::map<std::string, const Buffer *> buffers;
  for (const auto &[fieldName, view] : views)
    buffers[fieldName] =
        &verifyView(*view, name + " field '" + fieldName + "'");

  // Which engines may issue which instruction: InstructionSet.def.
  Engine engine = inst.engine;
  bool dma = isDma(inst.op);
  if (!canIssue(inst.op, engine))
    failInst(inst, std::string("engine '") + engineName(engine) +
                       "' cannot issue " + opcodeName(inst.op));

  // Compute engines address only SBUF and PSUM; GpSimd cannot reach PSUM.
  if (!dma) {
    for (const auto &[fieldName, buffer] : buffers) {
      if (!buffer->isOnChip())
        failInst(inst, "operand '" + fieldName + "' is in hbm; " +
                           engineName(engine) +
                           " reads and writes only sbuf/psum");
      if (engine == Engine::GpSimd && buffer->space == Space::PSUM)
        failInst(inst,
                 "operand '" + fieldName + "': gpsimd cannot access psum");
    }
  }

  for (const auto &[fieldName, buffer] : buffers)
    if (Instruction::writes(fieldName) &&
        (buffer->kind == BufferKind::Input ||
         buffer->kind == BufferKind::Constant))
      failInst(inst, "field '" + fieldName + "' writes " +
                         bufferKindName(buffer->kind) + " buffer " +
                         std::to_string(buffer->id) + " ('" + buffer->name +
                         "'), which is read-only");
  const Buffer &dstBuffer = *buffers.at("dst");

  auto sameShape = [&](const char *lhs, const char *rhs) {
    const View &l = *views.at(lhs), &r = *views.at(rhs);
    if (l.shape != r.shape)
      failInst(inst, std::string("shape mismatch: '") + lhs + "' is " +
                         shapeString(l.shape) + " but '" + rhs + "' is " +
                         shapeString(r.shape));
  };
  auto perPartition = [&](const char *fieldName, const View &of) {
    const View &view = *views.at(fieldName);
    if (of.shape.empty())
      failInst(inst, "needs a partition dim");
    std::vector<int64_t> expected = {of.shape[0], 1};
    if (view.shape != expected)
      failInst(inst, std::string("operand '") + fieldName + "' must be " +
                         shapeString(expected) + ", got " +
                         shapeString(view.shape));
  };

  const View &dst = *inst.dst;
  switch (inst.op) {
  case Opcode::DmaCopy:
    // The DGE block is driven by the SyncE or ScalarE sequencer [D S15].
    if (inst.hwdge && inst.engine == Engine::GpSimd)
      failInst(inst, "a hardware-DGE dma_copy (\"dge\": \"hwdge\") is "
                     "issued by sync or scalar, not gpsimd");
    sameShape("src", "dst");
    break;
  case Opcode::Copy:
    sameShape("src", "dst");
    break;
  case Opcode::DmaGather:
  case Opcode::DmaScatter: {
    // One side is the table [V, D] rows are picked from (gather) or written
    // to (scatter), the other holds one row per index.
    bool gather = inst.op == Opcode::DmaGather;
    const char *tableName = gather ? "table" : "dst";
    const char *rowsName = gather ? "dst" : "src";
    const View &table = gather ? *inst.table : dst, &rows = *views.at(rowsName),
               &indices = *inst.indices;
    if (table.shape.size() != 2)
      failInst(inst, std::string("'") + tableName + "' must be [V, D], got " +
                         shapeString(table.shape));
    if (indices.shape.size() != 2 || indices.shape[1] != 1)
      failInst(inst,
               "'indices' must be [P, 1], got " + shapeString(indices.shape));
    if (!isIntegerDType(buffers.at("indices")->dtype))
      failInst(inst, std::string("'indices' must have an integer dtype, got ") +
                         dtypeName(buffers.at("indices")->dtype));
    std::vector<int64_t> expected = {indices.shape[0], table.shape[1]};
    if (rows.shape != expected)
      failInst(inst, std::string("'") + rowsName + "' must be " +
                         shapeString(expected) + ", got " +
                         shapeString(rows.shape));
    if (inst.disjoint && inst.accumulate)
      failInst(inst, "'disjoint' scatters overwrite rows: no 'accumulate'");
    break;
  }
  case Opcode::Matmul: {
    const View &stat = *inst.stationary, &mov = *inst.moving;
    if (buffers.at("stationary")->space != Space::SBUF ||
        buffers.at("moving")->space != Space::SBUF)
      failInst(inst, "'stationary' and 'moving' must be in sbuf");
    if (dstBuffer.space != Space::PSUM || dstBuffer.dtype != DType::F32)
      failInst(inst, "'dst' must be an f32 psum buffer");
    for (const char *fieldName : {"stationary", "moving"})
      if (!isFloatDType(buffers.at(fieldName)->dtype))
        failInst(inst, std::string("'") + fieldName +
                           "' must be f32, bf16, f16 or fp8, got " +
                           dtypeName(buffers.at(fieldName)->dtype));
    bool mx = inst.stationaryScale || inst.movingScale;
    if (inst.doubleRow || mx) {
      std::string mode = mx ? "an MX matmul" : "double_row";
      bool fp8 = isFloat8DType(buffers.at("stationary")->dtype) &&
                 isFloat8DType(buffers.at("moving")->dtype);
      int64_t rows = mx ? target.matmulMxKFactor() : target.matmulFp8KFactor();
      if (inst.doubleRow && mx)
        failInst(inst, "double_row and MX scales exclude each other");
      if (!fp8)
        failInst(inst, mode + " takes fp8 operands");
      if (rows < 2)
        failInst(inst, "target '" + target.name + "' has no " +
                           (mx ? "MX matmul" : "double_row"));
      if (stat.shape.size() < 3 || mov.shape.size() < 3 ||
          stat.shape[1] != rows || mov.shape[1] != rows)
        failInst(inst, mode + " operands must be [K, " + std::to_string(rows) +
                           ", M] and [K, " + std::to_string(rows) +
                           ", N], got " + shapeString(stat.shape) + " and " +
                           shapeString(mov.shape));
    } else if (buffers.at("stationary")->dtype != buffers.at("moving")->dtype &&
               !(isFloat8DType(buffers.at("stationary")->dtype) &&
                 isFloat8DType(buffers.at("moving")->dtype))) {
      failInst(inst, "'stationary' and 'moving' must have the same dtype "
                     "(or both be fp8)");
    }
    if (mx) {
      // [D S11, S29] a scale per 32 values: 8 partitions x 4 rows; K in
      // partitions a multiple of 32.
      if (!inst.stationaryScale || !inst.movingScale)
        failInst(inst, "an MX matmul takes both 'stationary_scale' and "
                       "'moving_scale'");
      int64_t k = stat.shape[0];
      if (k % 32)
        failInst(inst, "an MX matmul contracts a multiple of 32 partitions, "
                       "not " +
                           std::to_string(k));
      for (auto [fieldName, scale, operand] :
           {std::tuple{"stationary_scale", &*inst.stationaryScale, &stat},
            std::tuple{"moving_scale", &*inst.movingScale, &mov}}) {
        const Buffer &buffer = *buffers.at(fieldName);
        if (buffer.space != Space::SBUF || buffer.dtype != DType::U8)
          failInst(inst,
                   std::string("'") + fieldName + "' must be a u8 sbuf buffer");
        int64_t perScale = neuron::target::kMxBlock / stat.shape[1];
        if (scale->shape.size() != 2 || scale->shape[0] != k / perScale ||
            scale->shape[1] != operand->shape.back())
          failInst(inst, std::string("'") + fieldName + "' must be [" +
                             std::to_string(k / perScale) + ", " +
                             std::to_string(operand->shape.back()) +
                             "] (a scale per " + std::to_string(perScale) +
                             " partitions), got " + shapeString(scale->shape));
      }
    }
    MatmulShape mm = matmulShape(inst);
    int64_t k = mm.k, m = mm.m, n = mm.n;
    if (inst.isTranspose &&
        (inst.doubleRow || mx || inst.accumulate || mov.shape.size() != 2 ||
         mov.shape[1] != mov.shape[0]))
      failInst(inst, "an is_transpose matmul takes a square moving identity "
                     "[K, K], without accumulate, double_row or scales");
    if (mov.shape[0] != k)
      failInst(inst, "contraction mismatch: 'stationary' is " +
                         shapeString(stat.shape) + " but 'moving' is " +
                         shapeString(mov.shape));
    if (dst.shape.empty() || dst.shape[0] != m || product(dst.shape, 1) != n)
      failInst(inst, "'dst' " + shapeString(dst.shape) + " must be [" +
                         std::to_string(m) + ", " + std::to_string(n) +
                         "] for 'stationary' " + shapeString(stat.shape) +
                         " and 'moving' " + shapeString(mov.shape));
    if (k > target.matmulMaxK)
      failInst(inst, "K = " + std::to_string(k) + " exceeds " +
                         std::to_string(target.matmulMaxK));
    if (m > target.matmulMaxStationaryFree)
      failInst(inst, "stationary free size " + std::to_string(m) + " exceeds " +
                         std::to_string(target.matmulMaxStationaryFree));
    if (n > target.matmulMaxMovingFree)
      failInst(inst, "moving free size " + std::to_string(n) + " exceeds " +
                         std::to_string(target.matmulMaxMovingFree));
    break;
  }
  case Opcode::Activation:
    sameShape("src", "dst");
    if (inst.bias)
      perPartition("bias", *inst.src);
    // ScalarE holds the per-partition scale and the row sums in fp32.
    for (const char *fieldName : {"scale_col", "reduce_res"}) {
      if (!views.count(fieldName))
        continue;
      perPartition(fieldName, *inst.src);
      if (buffers.at(fieldName)->dtype != DType::F32)
        failInst(inst, std::string("'") + fieldName + "' must be f32, got " +
                           dtypeName(buffers.at(fieldName)->dtype));
    }
    break;
  case Opcode::TensorTensor:
    sameShape("a", "dst");
    sameShape("b", "dst");
    break;
  case Opcode::ScalarTensorTensor:
    sameShape("a", "dst");
    sameShape("b", "dst");
    if (inst.scalar.has_value() == inst.imm.has_value())
      failInst(inst, "needs exactly one of 'scalar' and 'imm'");
    if (inst.scalar)
      perPartition("scalar", *inst.a);
    break;
  case Opcode::TensorScalar:
    sameShape("src", "dst");
    if (inst.scalar.has_value() == inst.imm.has_value())
      failInst(inst, "needs exactly one of 'scalar' and 'imm'");
    if (inst.scalar)
      perPartition("scalar", *inst.src);
    break;
  case Opcode::TensorReduce:
    if (inst.aluOp != AluOp::Add && inst.aluOp != AluOp::Max &&
        inst.aluOp != AluOp::Min && inst.aluOp != AluOp::Multiply)
      failInst(inst, std::string("field 'alu_op': '") + aluOpName(inst.aluOp) +
                         "' is not a reduction (add, max, min, multiply)");
    perPartition("dst", *inst.src);
    break;
  case Opcode::BnStats:
  case Opcode::BnAggr:
    verifyStatistics(inst, buffers);
    break;
  case Opcode::Select:
    sameShape("pred", "dst");
    sameShape("on_true", "dst");
    sameShape("on_false", "dst");
    break;
  case Opcode::Rand: {
    std::vector<int64_t> seedShape = {dst.shape.empty() ? 0 : dst.shape[0], 2};
    if (inst.seed->shape != seedShape)
      failInst(inst, "'seed' must be " + shapeString(seedShape) + ", got " +
                         shapeString(inst.seed->shape));
    if (buffers.at("seed")->dtype != DType::I32)
      failInst(inst, std::string("'seed' must be i32, got ") +
                         dtypeName(buffers.at("seed")->dtype));
    if (!isFloatDType(dstBuffer.dtype))
      failInst(inst, std::string("'dst' must be f32, bf16 or f16, got ") +
                         dtypeName(dstBuffer.dtype));
    if (inst.stream < 0 || inst.stream > 0xFFFFFFFFll)
      failInst(inst, "field 'stream' must fit in 32 unsigned bits");
    [[fallthrough]];
  }
  case Opcode::Iota:
    if (inst.multipliers.size() + 1 != dst.shape.size())
      failInst(inst, "field 'multipliers' has " +
                         std::to_string(inst.multipliers.size()) +
                         " entries; 'dst' " + shapeString(dst.shape) + " has " +
                         std::to_string(dst.shape.size() - 1) + " free dims");
    if (inst.offset)
      verifyIotaOffset(inst, *inst.offset);
    break;
  case Opcode::Memset:
    break;
  case Opcode::NGather: {
    const View &src = *inst.src, &indices = *inst.indices;
    if (src.shape.empty() || indices.shape.empty() || dst.shape.empty() ||
        src.shape[0] != dst.shape[0] || indices.shape[0] != dst.shape[0])
      failInst(inst, "'src' " + shapeString(src.shape) + ", 'indices' " +
                         shapeString(indices.shape) + " and 'dst' " +
                         shapeString(dst.shape) +
                         " must have one partition count");
    if (buffers.at("indices")->dtype != DType::I32)
      failInst(inst, std::string("'indices' must be i32, got ") +
                         dtypeName(buffers.at("indices")->dtype));
    if (buffers.at("src")->dtype != dstBuffer.dtype)
      failInst(inst, "'src' and 'dst' must have one dtype");
    if (product(indices.shape, 1) != product(dst.shape, 1))
      failInst(inst, "'indices' " + shapeString(indices.shape) +
                         " must have one element per element of 'dst' " +
                         shapeString(dst.shape));
    break;
  }
  case Opcode::Collective:
    verifyCollective(inst, buffers);
    break;
  }
}

// bn_stats: [P, F] -> [P, 6], 1 <= F <= bn_stats_max_free_elements;
// bn_aggr: [P, 3k] (count, mean, count * variance) triples -> [P, 2].
void Verifier::verifyStatistics(
    const Instruction &inst,
    const std::map<std::string, const Buffer *> &buffers) {
  const View &src = *inst.src, &dst = *inst.dst;
  for (const char *fieldName : {"src", "dst"})
    if (!isFloatDType(buffers.at(fieldName)->dtype))
      failInst(inst, std::string("'") + fieldName +
                         "' must be f32, bf16 or f16, got " +
                         dtypeName(buffers.at(fieldName)->dtype));
  if (src.shape.empty() || dst.shape.empty() || src.shape[0] != dst.shape[0])
    failInst(inst, "'src' " + shapeString(src.shape) + " and 'dst' " +
                       shapeString(dst.shape) +
                       " must have one partition count");
  int64_t in = product(src.shape, 1), out = product(dst.shape, 1);
  bool stats = inst.op == Opcode::BnStats;
  int64_t expected = stats ? 6 : 2;
  if (out != expected)
    failInst(inst, "'dst' must have " + std::to_string(expected) +
                       " free elements per partition, got " +
                       std::to_string(out));
  if (stats) {
    auto limit =
        static_cast<int64_t>(target.value("bn_stats_max_free_elements"));
    if (in < 1 || in > limit)
      failInst(inst, "'src' has " + std::to_string(in) +
                         " free elements per partition; bn_stats takes 1 to " +
                         std::to_string(limit));
  } else if (in < 3 || in % 3 != 0) {
    failInst(inst, "'src' must hold (count, mean, count * variance) "
                   "triples: a positive multiple of 3 free elements, got " +
                       std::to_string(in));
  }
}

void Verifier::verifyCollective(
    const Instruction &inst,
    const std::map<std::string, const Buffer *> &buffers) {
  if (inst.group < 0 ||
      inst.group >= static_cast<int64_t>(program.groups.size()))
    failInst(inst, "field 'group': " + std::to_string(inst.group) +
                       " is not an index into the program's " +
                       std::to_string(program.groups.size()) + " groups");
  auto n = static_cast<int64_t>(program.groups[inst.group].ranks.size());
  const Buffer &src = *buffers.at("src"), &dst = *buffers.at("dst");
  if (src.isOnChip() || dst.isOnChip())
    failInst(inst, "'src' and 'dst' must be in hbm");
  if (src.dtype != dst.dtype)
    failInst(inst, "'src' and 'dst' must have one dtype");
  // The handler sees flat host arrays: every element once, in order.
  for (const char *fieldName : {"src", "dst"}) {
    const View &view = fieldName[0] == 's' ? *inst.src : *inst.dst;
    if (!isContiguous(view) || !view.offset.terms.empty())
      failInst(inst, std::string("'") + fieldName +
                         "' must be a contiguous view at a fixed offset");
  }
  int64_t in = inst.src->numElements(), out = inst.dst->numElements();
  switch (inst.collective) {
  case Collective::AllReduce:
    if (in != out)
      failInst(inst, "all_reduce: 'src' and 'dst' must have as many elements");
    break;
  case Collective::AllGather:
    if (out != in * n)
      failInst(inst, "all_gather: 'dst' must have " + std::to_string(n) +
                         " times the elements of 'src' (the group's size)");
    break;
  case Collective::ReduceScatter:
    if (in != out * n)
      failInst(inst, "reduce_scatter: 'src' must have " + std::to_string(n) +
                         " times the elements of 'dst' (the group's size)");
    break;
  case Collective::Broadcast:
  case Collective::AllToAll:
  case Collective::SendRecv:
  case Collective::Barrier:
  case Collective::Reduce:
  case Collective::Gather:
  case Collective::Scatter:
    failInst(inst, std::string("field 'kind': ") +
                       collectiveName(inst.collective) +
                       " is not a collective instruction (all_reduce, "
                       "all_gather, reduce_scatter)");
  }
  bool reduces = inst.collective != Collective::AllGather;
  if (reduces && inst.aluOp != AluOp::Add && inst.aluOp != AluOp::Max &&
      inst.aluOp != AluOp::Min)
    failInst(inst, std::string("field 'alu_op': '") + aluOpName(inst.aluOp) +
                       "' is not a collective reduction (add, max, min)");
}

} // namespace

void Program::verify(const neuron::target::Target &target) const {
  Verifier(*this, target).run();
}

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

namespace {

json numberJson(double value) {
  if (std::isnan(value))
    return json{{"float", "nan"}};
  if (std::isinf(value))
    return json{{"float", value > 0 ? "inf" : "-inf"}};
  return value;
}

json affineJson(const AffineExpr &expr) {
  json terms = json::array();
  for (const auto &[iv, coeff] : expr.terms)
    terms.push_back(json::array({iv, coeff}));
  return json{{"const", expr.constant}, {"terms", terms}};
}

json viewJson(const View &view) {
  return json{{"buf", view.buffer},
              {"offset", affineJson(view.offset)},
              {"shape", view.shape},
              {"strides", view.strides}};
}

// Attribute values as written; std::nullopt leaves the field out (an unset
// optional value, the default DGE mode).
std::optional<json> attributeJson(KindTag<AK::Bool>, bool value) {
  return json(value);
}
std::optional<json> attributeJson(KindTag<AK::Number>, double value) {
  return numberJson(value);
}
std::optional<json> attributeJson(KindTag<AK::Immediate>,
                                  const std::optional<double> &value) {
  return value ? std::optional<json>(numberJson(*value)) : std::nullopt;
}
std::optional<json> attributeJson(KindTag<AK::Int>, int64_t value) {
  return json(value);
}
std::optional<json> attributeJson(KindTag<AK::Group>, int64_t value) {
  return json(value);
}
std::optional<json> attributeJson(KindTag<AK::NumberList>,
                                  const std::vector<double> &values) {
  json list = json::array();
  for (double v : values)
    list.push_back(numberJson(v));
  return list;
}
std::optional<json> attributeJson(KindTag<AK::Affine>,
                                  const std::optional<AffineExpr> &value) {
  return value ? std::optional<json>(affineJson(*value)) : std::nullopt;
}
std::optional<json> attributeJson(KindTag<AK::ActFunc>, ActFunc value) {
  return json(actFuncName(value));
}
std::optional<json> attributeJson(KindTag<AK::AluOp>, AluOp value) {
  return json(aluOpName(value));
}
std::optional<json> attributeJson(KindTag<AK::Collective>, Collective value) {
  return json(collectiveName(value));
}
std::optional<json> attributeJson(KindTag<AK::Dge>, bool hwdge) {
  // Absent means "none": older programs read back (and hash) unchanged.
  return hwdge ? std::optional<json>("hwdge") : std::nullopt;
}

json instructionJson(const Instruction &inst) {
  json out;
  out["op"] = opcodeName(inst.op);
  out["engine"] = engineName(inst.engine);
  if (inst.loc >= 0)
    out["loc"] = inst.loc;
  if (!inst.waits.empty())
    out["waits"] = inst.waits;
  for (const auto &[fieldName, view] : inst.operands())
    out[fieldName] = viewJson(*view);
  // Every attribute the op's spec lists, by the table.
  const OpSpec &spec = opSpec(inst.op);
#define NEURON_ATTRIBUTE(Member, Spelling, Kind, Source)                       \
  if (spec.takes(Spelling))                                                    \
    if (std::optional<json> value =                                            \
            attributeJson(KindTag<AK::Kind>(), inst.Member))                   \
      out[Spelling] = std::move(*value);
#include "runtime/program/InstructionSet.def"
  return out;
}

json nodesJson(const std::vector<Node> &nodes) {
  json out = json::array();
  for (const Node &node : nodes) {
    if (node.isLoop())
      out.push_back(json{{"loop", node.loopId},
                         {"count", node.count},
                         {"body", nodesJson(node.body)}});
    else
      out.push_back(instructionJson(node.inst));
  }
  return out;
}

} // namespace

std::string Program::toJson() const {
  json doc;
  doc["format"] = kProgramFormat;
  doc["version"] = version;
  doc["name"] = name;
  doc["target"] = target;
  if (explicitSync)
    doc["sync"] = "explicit";
  json bufferList = json::array();
  for (const Buffer &buffer : buffers) {
    json entry = {{"id", buffer.id},
                  {"name", buffer.name},
                  {"space", spaceName(buffer.space)},
                  {"kind", bufferKindName(buffer.kind)},
                  {"dtype", dtypeName(buffer.dtype)},
                  {"shape", buffer.shape}};
    if (!buffer.data.empty())
      entry["data"] = encodeBase64(buffer.data);
    if (buffer.splat)
      entry["splat"] = numberJson(*buffer.splat);
    if (buffer.address)
      entry["address"] = *buffer.address;
    bufferList.push_back(entry);
  }
  doc["buffers"] = bufferList;
  doc["inputs"] = inputs;
  doc["outputs"] = outputs;
  doc["locations"] = locations;
  if (!groups.empty()) {
    json groupList = json::array();
    for (const CollectiveGroup &group : groups)
      groupList.push_back(json{{"name", group.name}, {"ranks", group.ranks}});
    doc["groups"] = groupList;
  }
  doc["body"] = nodesJson(body);
  return doc.dump();
}

MatmulShape matmulShape(const Instruction &inst) {
  const View &stat = *inst.stationary, &mov = *inst.moving;
  MatmulShape s;
  size_t free = 1;
  if (inst.doubleRow || inst.stationaryScale) {
    s.rowsPerPartition = stat.shape.size() > 1 ? stat.shape[1] : 1;
    free = 2;
  }
  s.k = stat.shape.empty() ? 0 : stat.shape[0];
  s.m = product(stat.shape, free);
  s.n = product(mov.shape, free);
  return s;
}

} // namespace neuron::runtime
