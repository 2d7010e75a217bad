//===- Program.h - Kernel program data model --------------------*- C++ -*-===//
//
// The in-memory form of a kernel program (docs/PROGRAM_FORMAT.md): buffers,
// views with affine offsets, a tree of loops and engine instructions, and the
// source locations instructions came from.
//
// Program::parse checks syntax: JSON types, required and unknown fields, and
// enum names. Program::verify checks meaning against a target: references,
// shapes, dtypes, memory spaces, bounds of every view over every loop
// iteration, partition counts, on-chip capacity and addresses, and the
// instruction indices of `waits`. Both throw neuron::runtime::Error with a
// message naming the offending field or instruction; neither crashes on any
// input.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_PROGRAM_PROGRAM_H
#define NEURON_RUNTIME_PROGRAM_PROGRAM_H

#include "runtime/program/DType.h"
#include "runtime/program/Error.h"
#include "runtime/program/SizeExpr.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace neuron::target {
struct Target;
} // namespace neuron::target

namespace neuron::runtime {

inline constexpr const char *kProgramFormat = "torchneuron-kernel-program";
inline constexpr int kProgramVersion = 1;

enum class Space {
#define NEURON_MEMORY_SPACE(Name, Spelling) Name,
#include "runtime/program/InstructionSet.def"
};
enum class BufferKind { Input, Output, Internal, Constant, Scratch };

// The instruction set: runtime/program/InstructionSet.def.
enum class Opcode {
#define NEURON_OPCODE(Name, Mnemonic, IsDma, Engines) Name,
#include "runtime/program/InstructionSet.def"
};

enum class Engine {
#define NEURON_ENGINE(Name, Spelling) Name,
#include "runtime/program/InstructionSet.def"
};

/// ScalarE activation functions.
enum class ActFunc {
#define NEURON_ACT_FUNC(Name, Spelling) Name,
#include "runtime/program/InstructionSet.def"
};

/// VectorE/GpSimd ALU operations.
enum class AluOp {
#define NEURON_ALU_OP(Name, Spelling) Name,
#include "runtime/program/InstructionSet.def"
};

/// Collectives among the ranks of a process group.
enum class Collective {
#define NEURON_COLLECTIVE(Name, Spelling) Name,
#include "runtime/program/InstructionSet.def"
};

/// Every value of each enum, in declaration order.
inline constexpr Space kAllSpaces[] = {
#define NEURON_MEMORY_SPACE(Name, Spelling) Space::Name,
#include "runtime/program/InstructionSet.def"
};
inline constexpr Opcode kAllOpcodes[] = {
#define NEURON_OPCODE(Name, Mnemonic, IsDma, Engines) Opcode::Name,
#include "runtime/program/InstructionSet.def"
};
inline constexpr Engine kAllEngines[] = {
#define NEURON_ENGINE(Name, Spelling) Engine::Name,
#include "runtime/program/InstructionSet.def"
};
inline constexpr ActFunc kAllActFuncs[] = {
#define NEURON_ACT_FUNC(Name, Spelling) ActFunc::Name,
#include "runtime/program/InstructionSet.def"
};
inline constexpr AluOp kAllAluOps[] = {
#define NEURON_ALU_OP(Name, Spelling) AluOp::Name,
#include "runtime/program/InstructionSet.def"
};
inline constexpr Collective kAllCollectives[] = {
#define NEURON_COLLECTIVE(Name, Spelling) Collective::Name,
#include "runtime/program/InstructionSet.def"
};

/// A set of engines, one bit per Engine.
using EngineSet = unsigned;
constexpr EngineSet engineBit(Engine engine) {
  return 1u << static_cast<unsigned>(engine);
}

/// The engines that may issue `op`.
constexpr EngineSet issuingEngines(Opcode op) {
#define NEURON_ENGINE(Name, Spelling)                                          \
  constexpr EngineSet Name = engineBit(Engine::Name);
#include "runtime/program/InstructionSet.def"
  switch (op) {
#define NEURON_OPCODE(Name, Mnemonic, IsDma, Engines)                          \
  case Opcode::Name:                                                           \
    return Engines;
#include "runtime/program/InstructionSet.def"
  }
  return 0;
}

/// Whether `engine` may issue `op` (for a DMA: trigger it).
constexpr bool canIssue(Opcode op, Engine engine) {
  return (issuingEngines(op) & engineBit(engine)) != 0;
}

/// Whether `op` is a DMA (between any memories) rather than a compute
/// instruction (on SBUF/PSUM tiles).
constexpr bool isDma(Opcode op) {
  switch (op) {
#define NEURON_OPCODE(Name, Mnemonic, IsDma, Engines)                          \
  case Opcode::Name:                                                           \
    return IsDma;
#include "runtime/program/InstructionSet.def"
  }
  return false;
}

const char *spaceName(Space space);
const char *bufferKindName(BufferKind kind);
const char *opcodeName(Opcode op);
const char *engineName(Engine engine);
const char *actFuncName(ActFunc func);
const char *aluOpName(AluOp op);
const char *collectiveName(Collective c);
std::optional<Space> parseSpace(std::string_view name);
std::optional<BufferKind> parseBufferKind(std::string_view name);
std::optional<Opcode> parseOpcode(std::string_view name);
std::optional<Engine> parseEngine(std::string_view name);
std::optional<ActFunc> parseActFunc(std::string_view name);
std::optional<AluOp> parseAluOp(std::string_view name);
std::optional<Collective> parseCollective(std::string_view name);

/// Returns the product of `shape` (1 for rank 0), or std::nullopt on int64
/// overflow or a negative dimension.
std::optional<int64_t> shapeElements(const std::vector<int64_t> &shape);

struct Buffer {
  int64_t id = 0;
  std::string name;
  Space space = Space::HBM;
  BufferKind kind = BufferKind::Internal;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  /// Constants: the little-endian element bytes (decoded from base64), or a
  /// splat value when `splat` is set.
  std::vector<uint8_t> data;
  std::optional<double> splat;
  /// On-chip buffers: byte offset inside each partition. Buffers may share
  /// bytes (the compiler time-multiplexes them); either every on-chip buffer
  /// of a program has one or none does.
  std::optional<int64_t> address;

  bool isOnChip() const { return space != Space::HBM; }
  /// Total elements; only meaningful on a verified program (no overflow).
  int64_t numElements() const;
  /// Bytes one partition holds: the product of shape[1:] times the element
  /// size (on-chip buffers only).
  int64_t bytesPerPartition() const;
};

/// const + sum(coeff * iv) over `terms` of (loop id, coeff).
struct AffineExpr {
  int64_t constant = 0;
  std::vector<std::pair<int64_t, int64_t>> terms;
};

/// A strided window of one buffer, in elements.
struct View {
  int64_t buffer = 0;
  AffineExpr offset;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  int64_t numElements() const;
};

struct Instruction {
  Opcode op = Opcode::Copy;
  Engine engine = Engine::Vector;
  /// Index into Program::locations, or -1 when the instruction has none.
  int64_t loc = -1;
  /// "waits" (explicit sync only): static instruction indices (pre-order,
  /// loops not counted) whose every earlier dynamic instance must have
  /// completed before this instruction issues.
  std::vector<int64_t> waits;

  // Operands (kOperandFields); which ones an op takes is listed in
  // PROGRAM_FORMAT.md.
  std::optional<View> src, dst;
  std::optional<View> table, indices;     // dma_gather
  std::optional<View> stationary, moving; // matmul
  /// "stationary_scale", "moving_scale" (matmul, both or neither): an MX
  /// matmul (NKI's nc_matmul_mx, NC-v4). The fp8 operands are [K, R, M] and
  /// [K, R, N] (R: the target's matmul_mx_k_factor, R values of K packed per
  /// partition); the scales are u8 [K / 8, M] and [K / 8, N], the E8M0
  /// exponent of each group of 8 partitions x R values.
  std::optional<View> stationaryScale, movingScale;
  std::optional<View> a, b;               // (scalar_)tensor_tensor
  std::optional<View> bias;               // activation
  std::optional<View> scaleCol;           // "scale_col" (activation)
  /// "reduce_res" (activation): [P, 1] f32, written with the row sums of
  /// the fp32 results (NKI's reduce_res).
  std::optional<View> reduceRes;
  std::optional<View> scalar; // tensor_scalar, scalar_tensor_tensor
  std::optional<View> pred, onTrue, onFalse; // select
  /// "seed" (rand): [P, 2] int32, the Philox key of each partition's row.
  std::optional<View> seed;

  // Attributes (file names in comments).
  bool accumulate = false;          // "accumulate" (matmul)
  /// "double_row" (matmul, fp8 operands): stationary [K, R, M] and moving
  /// [K, R, N] contract over K x R rows (NKI's perf_mode=double_row).
  bool doubleRow = false;
  /// "is_transpose" (matmul): dst = stationary^T exactly, moving the [K, K]
  /// identity the engine streams (NKI's is_transpose: bit-accurate, NaN and
  /// infinities too, from NC-v3 on).
  bool isTranspose = false;
  /// "disjoint" (dma_scatter): no row it writes is written by another
  /// disjoint scatter of the program (parts of one permutation): no order
  /// among them; a row written twice in a run is an error.
  bool disjoint = false;
  /// "dge": "hwdge" (dma_copy on sync or scalar): the hardware DGE block
  /// generates its descriptors at issue (S15). Default "none": descriptors
  /// precomputed with the program; a copy issued by gpsimd is software DGE.
  bool hwdge = false;
  ActFunc func = ActFunc::Identity; // "func" (activation)
  /// "scale" (activation), times scale_col[p] when that is given.
  double scale = 1.0;
  /// "bias_imm" (activation): added to bias[p] when a bias operand is given.
  double biasImm = 0.0;
  /// "alu_op": the ALU operation of tensor_tensor, tensor_scalar and
  /// tensor_reduce (the format table calls it `op`, which JSON cannot hold
  /// next to the instruction's own "op"). "mul", the format's name for the
  /// product reduction, parses as multiply. scalar_tensor_tensor's first
  /// operation, "alu_op0", is kept here too.
  AluOp aluOp = AluOp::Add;
  AluOp aluOp1 = AluOp::Add; // "alu_op1" (scalar_tensor_tensor)
  std::optional<double> imm; // "imm" (tensor_scalar, scalar_tensor_tensor)
  bool reverse = false;      // "reverse" (tensor_scalar)
  double base = 0.0;         // "base" (iota)
  /// "offset" (iota, rand): added to base; affine in the loop ivs like a
  /// view's offset, so each iteration numbers its own elements.
  std::optional<AffineExpr> offset;
  double channelMultiplier = 0.0;  // "channel_multiplier" (iota, rand)
  std::vector<double> multipliers; // "multipliers" (iota, rand)
  int64_t stream = 0;              // "stream" (rand): Philox counter word 2
  double value = 0.0;              // "value" (memset)
  /// "kind" (collective): all_reduce, all_gather or reduce_scatter; the
  /// reduction of all_reduce and reduce_scatter is "alu_op" (add, max, min).
  Collective collective = Collective::AllReduce;
  /// "group" (collective): index into Program::groups.
  int64_t group = 0;

  /// Operands written by the instruction (dst, reduce_res) and read by it,
  /// in a fixed order (written ones first), with their file names; absent
  /// operands are skipped.
  std::vector<std::pair<const char *, const View *>> operands() const;
  /// Whether the operand named `field` (a name operands() returns) is
  /// written: dst and reduce_res are, every other operand is read.
  static bool writes(std::string_view field);
};

/// The sizes of a matmul instruction: contraction rows per partition
/// (double_row and MX: the operands' dim 1, else 1), K in partitions, and the
/// stationary (M) and moving (N) free sizes.
struct MatmulShape {
  int64_t k = 0, rowsPerPartition = 1, m = 0, n = 0;
  /// The contraction length: k x rowsPerPartition.
  int64_t contraction() const { return k * rowsPerPartition; }
};
MatmulShape matmulShape(const Instruction &inst);

/// An operand field of instructions (InstructionSet.def).
struct OperandField {
  const char *name;
  std::optional<View> Instruction::*member;
  bool written;
};
/// Every operand field, in the order Instruction::operands() lists them.
inline constexpr OperandField kOperandFields[] = {
#define NEURON_OPERAND(Member, Spelling, Written)                              \
  {Spelling, &Instruction::Member, Written},
#include "runtime/program/InstructionSet.def"
};

/// How an attribute's value is written in a program (InstructionSet.def).
enum class AttributeKind {
  Bool,       // true or false
  Number,     // a number (JSON's non-finite values as {"float": "inf"})
  Immediate,  // a number that stands in for the `scalar` operand: written
              // only by instructions without one
  Int,        // an integer
  NumberList, // a list of numbers
  Affine,     // an index affine in the loop ivs, like a view's offset
  ActFunc,    // an activation function's name
  AluOp,      // an ALU operation's name
  Collective, // a collective's name
  Dge,        // "none" (left out) or "hwdge"
  Group,      // an index into Program::groups
};

/// An attribute field of instructions (InstructionSet.def).
struct AttributeField {
  const char *name;
  AttributeKind kind;
  /// The `nisa` op attribute (or index operand) the emitter reads; "" when
  /// the compiler never writes the field.
  const char *source;
};
/// Every attribute field, in table order.
inline constexpr AttributeField kAttributeFields[] = {
#define NEURON_ATTRIBUTE(Member, Spelling, Kind, Source)                       \
  {Spelling, AttributeKind::Kind, Source},
#include "runtime/program/InstructionSet.def"
};

/// A size parameter of a size-generic program ("params"): the integers of
/// loop counts, views and HBM buffer shapes may be expressions over these
/// (SizeExpr.h), given values when the program is parsed.
struct SizeParam {
  std::string name;
  int64_t min = 0;
  std::optional<int64_t> max; // none: no upper bound was known
};

/// A process group collective instructions run among (Program::groups).
struct CollectiveGroup {
  /// The name that resolves the group at run time (torch.distributed's
  /// group name, as functional collectives carry it).
  std::string name;
  /// Its members' global ranks, in group order: where they sit in the
  /// instance, for the cost model.
  std::vector<int64_t> ranks;
};

struct Node {
  enum class Kind { Loop, Instruction };
  Kind kind = Kind::Instruction;

  // Kind::Loop: the iv `loopId` runs 0 .. count-1 over `body`.
  int64_t loopId = 0;
  int64_t count = 0;
  std::vector<Node> body;

  // Kind::Instruction.
  Instruction inst;

  bool isLoop() const { return kind == Kind::Loop; }
  static Node makeLoop(int64_t loopId, int64_t count, std::vector<Node> body);
  static Node makeInstruction(Instruction inst);
};

class Program {
public:
  int version = kProgramVersion;
  std::string name;
  std::string target;
  /// "params": the size parameters the program was compiled for (empty for
  /// a static program). A parsed program has every integer evaluated, so
  /// toJson writes the static instance, without params.
  std::vector<SizeParam> params;
  std::vector<Buffer> buffers;
  std::vector<int64_t> inputs;  // buffer ids, argument order
  std::vector<int64_t> outputs; // buffer ids, result order
  std::vector<std::string> locations;
  /// "groups": the process groups of collective instructions.
  std::vector<CollectiveGroup> groups;
  std::vector<Node> body;
  /// "sync": "explicit": instructions carry the compiler's `waits`; absent,
  /// the timing model derives the waits from data hazards.
  bool explicitSync = false;

  /// Parses a program document. Throws Error on malformed JSON, a wrong
  /// format or version, unknown fields, ops, engines, dtypes, spaces, funcs
  /// or ALU ops, and wrongly typed values. A size-generic program needs
  /// `sizes`, a value for each of its params within its range; its size
  /// expressions are evaluated with them (an instance per tuple of sizes).
  static Program parse(const std::string &json, const SizeEnv *sizes = nullptr);
  /// The params of a program document, without instantiating it.
  static std::vector<SizeParam> readParams(const std::string &json);
  /// Reads and parses a file; a missing or unreadable file is an Error.
  static Program loadFile(const std::string &path);

  /// Checks the program against `target` (see file comment). Throws Error.
  void verify(const neuron::target::Target &target) const;

  /// Serializes to the program format; parse(toJson()) round-trips.
  std::string toJson() const;

  /// The buffer with `id`, or nullptr.
  const Buffer *findBuffer(int64_t id) const;
  /// Instructions in the tree, counted once each (not per loop iteration).
  int64_t numInstructions() const;
  /// Whether any instruction is a collective (running the program needs a
  /// CollectiveHandler).
  bool hasCollectives() const;
};

/// Deepest loop nesting parse accepts; keeps recursion bounded.
inline constexpr int kMaxLoopDepth = 64;
/// Most dims a view may have (hardware access patterns have at most 5:
/// partition + 4 free); bounds the executor's fixed-size index arrays.
inline constexpr int kMaxViewRank = 12;

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_PROGRAM_PROGRAM_H
