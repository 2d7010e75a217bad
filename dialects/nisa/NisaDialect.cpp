//===- NisaDialect.cpp - verifiers of `nisa` instructions -----------------===//
#include "dialects/nisa/NisaDialect.h"

#include "runtime/target/Target.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h" // the generated attribute printer

#include <functional>

using namespace mlir;
using namespace mlir::nisa;

#include "dialects/nisa/NisaDialect.cpp.inc"
#include "dialects/nisa/NisaEnums.cpp.inc"
#include "dialects/nisa/NisaInterfaces.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/nisa/NisaAttrs.cpp.inc"

void NisaDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/nisa/NisaAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialects/nisa/NisaOps.cpp.inc"
      >();
}

const ::neuron::target::Target *mlir::nisa::lookupTarget(Operation *op) {
  std::string name = "trn2";
  for (Operation *p = op; p; p = p->getParentOp())
    if (auto attr = p->getAttrOfType<StringAttr>(kTargetAttrName)) {
      name = attr.str();
      break;
    }
  try {
    return &::neuron::target::getTarget(name);
  } catch (const std::exception &e) {
    op->emitError(e.what());
    return nullptr;
  }
}

MemorySpace mlir::nisa::getMemorySpace(MemRefType type) {
  if (auto attr = dyn_cast_or_null<MemorySpaceAttr>(type.getMemorySpace()))
    return attr.getValue();
  return MemorySpace::hbm;
}

MemRefType mlir::nisa::withMemorySpace(MemRefType type, MemorySpace space) {
  Attribute attr = space == MemorySpace::hbm
                       ? Attribute()
                       : MemorySpaceAttr::get(type.getContext(), space);
  return MemRefType::get(type.getShape(), type.getElementType(),
                         type.getLayout(), attr);
}

//===----------------------------------------------------------------------===//
// The instruction set (runtime/program/InstructionSet.def)
//===----------------------------------------------------------------------===//

namespace rt = ::neuron::runtime;

/// Whether the op name `opName` is "nisa." followed by `mnemonic`.
static constexpr bool isNamed(llvm::StringRef opName,
                              std::string_view mnemonic) {
  std::string_view name(opName.data(), opName.size());
  return name.substr(0, 5) == "nisa." && name.substr(5) == mnemonic;
}
#define NEURON_OPCODE(Name, Mnemonic, IsDma, Engines)                          \
  static_assert(isNamed(Name##Op::getOperationName(), Mnemonic),               \
                "nisa::" #Name "Op must be named nisa." Mnemonic);
#include "runtime/program/InstructionSet.def"

/// Every op of the dialect is an instruction of the table.
template <typename... Ops> static constexpr size_t countOps() {
  return sizeof...(Ops);
}
static_assert(countOps<
#define GET_OP_LIST
#include "dialects/nisa/NisaOps.cpp.inc"
                  >() == std::size(rt::kAllOpcodes),
              "every nisa op needs an entry in InstructionSet.def");

static_assert(getMaxEnumValForEngine() + 1 == std::size(rt::kAllEngines));
static_assert(getMaxEnumValForActivationFn() + 1 ==
              std::size(rt::kAllActFuncs));
static_assert(getMaxEnumValForAluOp() + 1 == std::size(rt::kAllAluOps));
static_assert(getMaxEnumValForMemorySpace() + 1 == std::size(rt::kAllSpaces));
static_assert(getMaxEnumValForCollective() + 1 ==
              std::size(rt::kAllCollectives));

rt::Engine mlir::nisa::toProgram(Engine engine) {
  return static_cast<rt::Engine>(engine);
}
rt::Space mlir::nisa::toProgram(MemorySpace space) {
  return static_cast<rt::Space>(space);
}
rt::ActFunc mlir::nisa::toProgram(ActivationFn func) {
  return static_cast<rt::ActFunc>(func);
}
rt::AluOp mlir::nisa::toProgram(AluOp op) { return static_cast<rt::AluOp>(op); }
rt::Collective mlir::nisa::toProgram(Collective kind) {
  return static_cast<rt::Collective>(kind);
}

bool mlir::nisa::canIssue(rt::Opcode op, Engine engine) {
  return rt::canIssue(op, toProgram(engine));
}

/// The engine an instruction names must be one the table allows.
static LogicalResult verifyEngine(Operation *op, Engine engine) {
  rt::Opcode opcode = cast<InstructionOpInterface>(op).getOpcode();
  if (canIssue(opcode, engine))
    return success();
  SmallVector<StringRef> allowed;
  for (rt::Engine e : rt::kAllEngines)
    if (rt::canIssue(opcode, e))
      allowed.push_back(stringifyEngine(static_cast<Engine>(e)));
  InFlightDiagnostic diag = op->emitOpError("runs on ");
  for (auto [i, name] : llvm::enumerate(allowed))
    diag << (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") << name;
  return diag << ", not " << stringifyEngine(engine);
}

/// The operands whose memory the instruction writes (Nisa_Out or Nisa_InOut
/// in NisaOps.td), in operand order, each once.
SmallVector<Value, 2> mlir::nisa::detail::writtenOperands(Operation *op) {
  SmallVector<MemoryEffects::EffectInstance, 4> effects;
  cast<MemoryEffectOpInterface>(op).getEffects(effects);
  SmallVector<Value, 2> written;
  for (const MemoryEffects::EffectInstance &effect : effects)
    if (isa<MemoryEffects::Write>(effect.getEffect()) && effect.getValue() &&
        !llvm::is_contained(written, effect.getValue()))
      written.push_back(effect.getValue());
  return written;
}

std::optional<AffineIndex> mlir::nisa::affineIndexOf(Value index) {
  AffineIndex out;
  std::function<bool(Value, int64_t)> walk = [&](Value x, int64_t k) {
    if (auto c = x.getDefiningOp<arith::ConstantIndexOp>()) {
      out.constant += k * c.value();
      return true;
    }
    if (auto add = x.getDefiningOp<arith::AddIOp>())
      return walk(add.getLhs(), k) && walk(add.getRhs(), k);
    if (auto mul = x.getDefiningOp<arith::MulIOp>()) {
      for (auto [y, z] : {std::pair(mul.getLhs(), mul.getRhs()),
                          std::pair(mul.getRhs(), mul.getLhs())})
        if (auto c = z.getDefiningOp<arith::ConstantIndexOp>())
          return walk(y, k * c.value());
      return false;
    }
    if (!scf::getForInductionVarOwner(x))
      return false;
    for (auto &[iv, coeff] : out.terms)
      if (iv == x) {
        coeff += k;
        return true;
      }
    out.terms.push_back({x, k});
    return true;
  };
  if (!walk(index, 1))
    return std::nullopt;
  return out;
}

/// Whether `index` is a size expression: index constants and the kernel's
/// index arguments (its sizes) under the arith ops sizeFunctionOf names; no
/// loop iv.
static bool isSizeExpression(Value index) {
  if (auto arg = dyn_cast<BlockArgument>(index))
    return isa<FunctionOpInterface>(arg.getOwner()->getParentOp());
  Operation *def = index.getDefiningOp();
  if (isa_and_nonnull<arith::ConstantIndexOp>(def))
    return true;
  return mlir::nisa::sizeFunctionOf(def) &&
         llvm::all_of(def->getOperands(), isSizeExpression);
}

/// Whether an iota's or rand's offset has the program's affine form: a sum
/// of scf.for ivs times constants and size expressions (a size-generic
/// kernel's; docs/PROGRAM_FORMAT.md).
static bool isOffsetForm(Value index) {
  if (mlir::nisa::affineIndexOf(index) || isSizeExpression(index))
    return true;
  if (auto add = index.getDefiningOp<arith::AddIOp>())
    return isOffsetForm(add.getLhs()) && isOffsetForm(add.getRhs());
  if (auto mul = index.getDefiningOp<arith::MulIOp>())
    for (auto [x, c] : {std::pair(mul.getLhs(), mul.getRhs()),
                        std::pair(mul.getRhs(), mul.getLhs())})
      if (c.getDefiningOp<arith::ConstantIndexOp>())
        return isOffsetForm(x);
  return false;
}

std::optional<::neuron::runtime::SizeExpr::Kind>
mlir::nisa::sizeFunctionOf(Operation *op) {
  using Kind = ::neuron::runtime::SizeExpr::Kind;
  if (isa_and_nonnull<arith::AddIOp>(op))
    return Kind::Add;
  if (isa_and_nonnull<arith::SubIOp>(op))
    return Kind::Sub;
  if (isa_and_nonnull<arith::MulIOp>(op))
    return Kind::Mul;
  if (isa_and_nonnull<arith::FloorDivSIOp, arith::DivSIOp>(op))
    return Kind::FloorDiv;
  if (isa_and_nonnull<arith::CeilDivSIOp>(op))
    return Kind::CeilDiv;
  if (isa_and_nonnull<arith::RemSIOp>(op))
    return Kind::Mod;
  if (isa_and_nonnull<arith::MinSIOp>(op))
    return Kind::Min;
  if (isa_and_nonnull<arith::MaxSIOp>(op))
    return Kind::Max;
  return std::nullopt;
}

SmallVector<int64_t> mlir::nisa::viewStrides(Operation *op) {
  SmallVector<int64_t> strides;
  for (OpFoldResult s : cast<memref::ReinterpretCastOp>(op).getMixedStrides())
    strides.push_back(getConstantIntValue(s).value_or(ShapedType::kDynamic));
  return strides;
}

int64_t mlir::nisa::bytesPerPartition(MemRefType tile) {
  int64_t bytes = std::max<int64_t>(1, tile.getElementTypeBitWidth() / 8);
  for (int64_t d : tile.getShape().drop_front())
    bytes *= d;
  return bytes;
}

//===----------------------------------------------------------------------===//
// Pass attributes
//===----------------------------------------------------------------------===//

/// A tile's address must keep it inside its memory, and a PSUM tile that
/// fits in one bank inside that bank (matmul accumulates within a bank).
static LogicalResult verifyAddress(Operation *op, Attribute value) {
  auto address = dyn_cast<IntegerAttr>(value);
  if (!address || address.getInt() < 0)
    return op->emitError("'nisa.address' must be a non-negative integer");
  auto alloc = dyn_cast<memref::AllocOp>(op);
  MemorySpace space =
      alloc ? getMemorySpace(alloc.getType()) : MemorySpace::hbm;
  if (space == MemorySpace::hbm || !alloc.getType().hasStaticShape() ||
      alloc.getType().getRank() < 1)
    return op->emitError("'nisa.address' belongs on the memref.alloc of a "
                         "static SBUF or PSUM tile");
  const auto *target = lookupTarget(op);
  if (!target)
    return failure();
  int64_t begin = address.getInt();
  int64_t bytes = bytesPerPartition(alloc.getType());
  int64_t capacity = space == MemorySpace::sbuf ? target->sbufBytesPerPartition
                                                : target->psumBytesPerPartition;
  if (begin + bytes > capacity)
    return op->emitError("tile at byte ")
           << begin << " needs " << bytes << " bytes per partition; "
           << stringifyMemorySpace(space) << " has " << capacity;
  int64_t bank = target->psumBankBytes;
  if (space == MemorySpace::psum && bytes <= bank &&
      begin / bank != (begin + bytes - 1) / bank)
    return op->emitError("PSUM tile at byte ")
           << begin << " (" << bytes << " bytes) crosses a " << bank
           << "-byte bank boundary";
  return success();
}

LogicalResult NisaDialect::verifyOperationAttribute(Operation *op,
                                                    NamedAttribute attr) {
  StringRef name = attr.getName().strref();
  if (name == kAddressAttrName)
    return verifyAddress(op, attr.getValue());
  if (name == kIdAttrName || name == kWaitsAttrName) {
    if (!isa<InstructionOpInterface>(op))
      return op->emitError("'") << name << "' belongs on a nisa instruction";
    if (name == kWaitsAttrName && !isa<DenseI64ArrayAttr>(attr.getValue()))
      return op->emitError("'nisa.waits' must be an array<i64> of ids");
    auto id = dyn_cast<IntegerAttr>(attr.getValue());
    if (name == kIdAttrName && (!id || id.getInt() < 0))
      return op->emitError("'nisa.id' must be a non-negative integer");
    return success();
  }
  if (name == kWaitWhenAttrName) {
    auto when = dyn_cast<ArrayAttr>(attr.getValue());
    auto waits = op->getAttrOfType<DenseI64ArrayAttr>(kWaitsAttrName);
    if (!isa<InstructionOpInterface>(op) || !when || !waits ||
        when.size() != waits.size() ||
        !llvm::all_of(when, [](Attribute a) { return isa<StringAttr>(a); }))
      return op->emitError("'nisa.wait_when' is one size expression (or \"\") "
                           "per entry of nisa.waits");
    return success();
  }
  if (name == kSynchronizedAttrName) {
    if (!isa<func::FuncOp>(op) || !isa<UnitAttr>(attr.getValue()))
      return op->emitError("'nisa.synchronized' is a unit attribute of a "
                           "kernel function");
    return success();
  }
  if (name == kReuseAttrName) {
    auto value = dyn_cast<StringAttr>(attr.getValue());
    if (!isa<func::FuncOp>(op) || !value ||
        (value.getValue() != "lowest" && value.getValue() != "least_recent"))
      return op->emitError("'nisa.reuse' is \"lowest\" or \"least_recent\" "
                           "on a kernel function");
    return success();
  }
  if (name == kTargetAttrName || name == "nisa.kernel" ||
      name == "nisa.num_inputs")
    return success(); // read where they are used

  return op->emitError("unknown nisa attribute '") << name << "'";
}

//===----------------------------------------------------------------------===//
// Shared operand rules
//===----------------------------------------------------------------------===//

static MemRefType memrefType(Value v) { return cast<MemRefType>(v.getType()); }

/// Compute engines read and write on-chip tiles only: [partitions, free...]
/// with the partition count within the target's.
static LogicalResult verifyTile(Operation *op, Value v, StringRef name,
                                bool allowPsum = true) {
  MemRefType type = memrefType(v);
  MemorySpace space = getMemorySpace(type);
  if (space == MemorySpace::hbm)
    return op->emitOpError(name) << " must be in SBUF or PSUM, not HBM";
  if (!allowPsum && space == MemorySpace::psum)
    return op->emitOpError(name) << " must be in SBUF (engine cannot "
                                    "access PSUM)";
  if (type.getRank() < 1)
    return op->emitOpError(name) << " must have a partition dim";
  const auto *target = lookupTarget(op);
  if (!target)
    return failure();
  if (type.getDimSize(0) > target->partitions)
    return op->emitOpError(name)
           << " uses " << type.getDimSize(0) << " partitions; " << target->name
           << " has " << target->partitions;
  return success();
}

static LogicalResult verifySameShape(Operation *op, Value a, Value b,
                                     StringRef what) {
  if (memrefType(a).getShape() != memrefType(b).getShape())
    return op->emitOpError(what) << " must have the same shape";
  return success();
}

/// A [P, 1...] column with one value per partition, matching `rows`.
static LogicalResult verifyColumn(Operation *op, Value column, Value rows,
                                  StringRef name) {
  MemRefType c = memrefType(column);
  if (c.getDimSize(0) != memrefType(rows).getDimSize(0) ||
      c.getNumElements() != c.getDimSize(0))
    return op->emitOpError(name) << " must be a [P, 1] column matching the "
                                    "partitions of the data";
  return success();
}

//===----------------------------------------------------------------------===//
// DMA
//===----------------------------------------------------------------------===//

LogicalResult DmaCopyOp::verify() {
  if (failed(verifyEngine(*this, getEngine())))
    return failure();
  if (failed(verifySameShape(*this, getSrc(), getDst(),
                             "source and "
                             "destination")))
    return failure();
  for (Value v : {getSrc(), getDst()})
    if (getMemorySpace(memrefType(v)) != MemorySpace::hbm &&
        failed(verifyTile(*this, v, "on-chip operand")))
      return failure();
  return success();
}

/// An indirect DMA: `table` [V, D] in HBM, one row of `rows` (an SBUF tile
/// [P, D]) per index of the [P, 1] integer column `indices`.
static LogicalResult verifyIndirectDma(Operation *op, Value table,
                                       StringRef tableName, Value rows,
                                       StringRef rowsName, Value indices) {
  MemRefType t = memrefType(table), r = memrefType(rows);
  if (getMemorySpace(t) != MemorySpace::hbm)
    return op->emitOpError(tableName) << " must be in HBM";
  if (failed(verifyTile(op, indices, "indices", false)) ||
      failed(verifyTile(op, rows, rowsName, false)))
    return failure();
  if (!memrefType(indices).getElementType().isSignlessInteger())
    return op->emitOpError("indices must be integers");
  if (failed(verifyColumn(op, indices, rows, "indices")))
    return failure();
  if (t.getRank() != 2 || r.getRank() != 2 ||
      t.getDimSize(1) != r.getDimSize(1))
    return op->emitOpError(tableName)
           << " [V, D] and " << rowsName << " [P, D] must agree on D";
  return success();
}

LogicalResult DmaGatherOp::verify() {
  return verifyIndirectDma(*this, getTable(), "table", getDst(), "destination",
                           getIndices());
}

LogicalResult DmaScatterOp::verify() {
  if (getDisjoint() && getAccumulate())
    return emitOpError("disjoint scatters overwrite rows: no accumulate");
  return verifyIndirectDma(*this, getDst(), "destination", getSrc(), "source",
                           getIndices());
}

//===----------------------------------------------------------------------===//
// TensorE
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::verify() {
  MemRefType s = memrefType(getStationary()), m = memrefType(getMoving()),
             d = memrefType(getDst());
  bool mx = getStationaryScale() || getMovingScale();
  int64_t operandRank = getDoubleRow() || mx ? 3 : 2;
  // A plain matmul's moving operand may have up to three free dims (a
  // convolution's window: images, rows, columns), N their product.
  bool plain = operandRank == 2 && !getIsTranspose();
  bool movingOk = m.getRank() == operandRank ||
                  (plain && m.getRank() >= 2 && m.getRank() <= 4);
  if (s.getRank() != operandRank || !movingOk || d.getRank() != 2)
    return emitOpError(operandRank == 3
                           ? "double_row and MX operands must be [K, R, M] "
                             "and [K, R, N], the destination 2-d"
                           : "operands must be 2-d tiles");
  if (getMemorySpace(s) != MemorySpace::sbuf ||
      getMemorySpace(m) != MemorySpace::sbuf)
    return emitOpError("stationary and moving operands must be in SBUF");
  if (getMemorySpace(d) != MemorySpace::psum)
    return emitOpError("destination must be in PSUM");
  if (!d.getElementType().isF32())
    return emitOpError("PSUM accumulates in f32");
  auto isFp8 = [](Type t) { return isa<Float8E4M3FNType, Float8E5M2Type>(t); };
  bool fp8 = isFp8(s.getElementType()) && isFp8(m.getElementType());
  if (s.getElementType() != m.getElementType() && !fp8)
    return emitOpError("stationary and moving must have the same dtype "
                       "(or both be fp8)");
  // The PE array multiplies floating-point numbers only (fp8, bf16, fp16,
  // fp32 in its tf32/fp32 modes), whatever the chip.
  if (!isa<FloatType>(s.getElementType()) ||
      s.getElementType().getIntOrFloatBitWidth() > 32)
    return emitOpError("TensorE takes fp8, bf16, fp16 or fp32 operands, not ")
           << s.getElementType();
  const auto *target = lookupTarget(*this);
  if (!target)
    return failure();
  if (getDoubleRow() || mx) {
    StringRef mode = mx ? "an MX matmul" : "double_row";
    if (getDoubleRow() && mx)
      return emitOpError("double_row and MX scales exclude each other");
    if (!fp8)
      return emitOpError(mode)
             << " takes fp8 operands, not " << s.getElementType() << " and "
             << m.getElementType();
    int64_t rows = mx ? target->matmulMxKFactor() : target->matmulFp8KFactor();
    if (rows < 2)
      return emitOpError("target '")
             << target->name << "' has no " << (mx ? "MX matmul" : mode);
    if (s.getDimSize(1) != rows || m.getDimSize(1) != rows)
      return emitOpError(mode)
             << " operands must have " << rows << " rows per partition (dim 1)";
  }
  if (getIsTranspose() && (getDoubleRow() || mx || getAccumulate() ||
                           m.getDimSize(0) != m.getDimSize(1)))
    return emitOpError("an is_transpose matmul takes a square moving "
                       "identity [K, K], without accumulate, double_row or "
                       "scales");
  if (mx) {
    // [D S11, S29] one scale per 32 values: 8 partitions x 4 rows.
    if (!getStationaryScale() || !getMovingScale())
      return emitOpError("an MX matmul takes both scales");
    int64_t k = s.getDimSize(0);
    if (k % 32)
      return emitOpError("an MX matmul contracts a multiple of 32 "
                         "partitions, not ")
             << k;
    int64_t perScale = neuron::target::kMxBlock / s.getDimSize(1);
    for (auto [scale, free] :
         {std::pair{getStationaryScale(), s.getShape().back()},
          std::pair{getMovingScale(), m.getShape().back()}}) {
      MemRefType t = memrefType(scale);
      if (getMemorySpace(t) != MemorySpace::sbuf ||
          !t.getElementType().isUnsignedInteger(8))
        return emitOpError("MX scales must be ui8 tiles in SBUF");
      if (t.getRank() != 2 || t.getDimSize(0) != k / perScale ||
          t.getDimSize(1) != free)
        return emitOpError("MX scales must be [")
               << k / perScale << ", " << free << "] (one per " << perScale
               << " partitions), got " << t;
    }
  }
  int64_t k = s.getDimSize(0), mSize = s.getShape().back(),
          n = m.getShape().back();
  if (plain && m.getRank() > 2)
    n = llvm::any_of(m.getShape(), ShapedType::isDynamic)
            ? ShapedType::kDynamic
            : m.getNumElements() / m.getDimSize(0);
  if (m.getDimSize(0) != k)
    return emitOpError("contraction (partition) sizes differ: ")
           << k << " vs " << m.getDimSize(0);
  if (k > target->matmulMaxK)
    return emitOpError("contraction size ")
           << k << " exceeds " << target->matmulMaxK;
  if (mSize > target->matmulMaxStationaryFree)
    return emitOpError("stationary free size ")
           << mSize << " exceeds " << target->matmulMaxStationaryFree;
  if (n > target->matmulMaxMovingFree)
    return emitOpError("moving free size ")
           << n << " exceeds " << target->matmulMaxMovingFree;
  if (d.getDimSize(0) != mSize || d.getDimSize(1) != n)
    return emitOpError("destination must be [M, N] = [")
           << mSize << ", " << n << "]";
  return success();
}

//===----------------------------------------------------------------------===//
// ScalarE / VectorE / GpSimd
//===----------------------------------------------------------------------===//

LogicalResult ActivationOp::verify() {
  if (failed(verifyTile(*this, getSrc(), "source")) ||
      failed(verifyTile(*this, getDst(), "destination")) ||
      failed(
          verifySameShape(*this, getSrc(), getDst(), "source and destination")))
    return failure();
  if (getBias() && (failed(verifyTile(*this, getBias(), "bias")) ||
                    failed(verifyColumn(*this, getBias(), getSrc(), "bias"))))
    return failure();
  // ScalarE keeps the per-partition scale and the row sums in fp32
  // registers; other dtypes would need a conversion the engine lacks.
  for (auto [v, name] : {std::pair{getScaleCol(), "scale_col"},
                         {getReduceRes(), "accumulate"}}) {
    if (!v)
      continue;
    if (failed(verifyTile(*this, v, name)) ||
        failed(verifyColumn(*this, v, getSrc(), name)))
      return failure();
    if (!memrefType(v).getElementType().isF32())
      return emitOpError(name) << " must be f32";
  }
  return success();
}

/// ALU instructions run where the table says; GpSimd cannot reach PSUM.
static LogicalResult verifyAluEngine(Operation *op, Engine engine) {
  if (failed(verifyEngine(op, engine)))
    return failure();
  if (engine == Engine::gpsimd)
    for (Value v : op->getOperands())
      if (getMemorySpace(memrefType(v)) == MemorySpace::psum)
        return op->emitOpError("on GpSimd cannot access PSUM");
  return success();
}

/// An ALU op on two same-shape tensors `a` and `b` into `dst`; the engine
/// streams at most one of them from PSUM.
template <typename OpTy> static LogicalResult verifyTwoTensorAlu(OpTy op) {
  if (failed(verifyAluEngine(op, op.getEngine())))
    return failure();
  if (failed(verifyTile(op, op.getA(), "first operand")) ||
      failed(verifyTile(op, op.getB(), "second operand")) ||
      failed(verifyTile(op, op.getDst(), "destination")) ||
      failed(verifySameShape(op, op.getA(), op.getB(), "operands")) ||
      failed(verifySameShape(op, op.getA(), op.getDst(),
                             "operands and destination")))
    return failure();
  if (getMemorySpace(memrefType(op.getA())) == MemorySpace::psum &&
      getMemorySpace(memrefType(op.getB())) == MemorySpace::psum)
    return op.emitOpError("at most one operand may be in PSUM");
  return success();
}

LogicalResult TensorTensorOp::verify() { return verifyTwoTensorAlu(*this); }

LogicalResult ScalarTensorTensorOp::verify() {
  if (failed(verifyTwoTensorAlu(*this)))
    return failure();
  if (getScalar() &&
      (failed(verifyTile(*this, getScalar(), "scalar")) ||
       failed(verifyColumn(*this, getScalar(), getA(), "scalar"))))
    return failure();
  return success();
}

LogicalResult TensorScalarOp::verify() {
  if (failed(verifyAluEngine(*this, getEngine())))
    return failure();
  if (failed(verifyTile(*this, getSrc(), "source")) ||
      failed(verifyTile(*this, getDst(), "destination")) ||
      failed(
          verifySameShape(*this, getSrc(), getDst(), "source and destination")))
    return failure();
  if (getScalar() &&
      (failed(verifyTile(*this, getScalar(), "scalar")) ||
       failed(verifyColumn(*this, getScalar(), getSrc(), "scalar"))))
    return failure();
  return success();
}

LogicalResult TensorReduceOp::verify() {
  if (failed(verifyAluEngine(*this, getEngine())))
    return failure();
  if (failed(verifyTile(*this, getSrc(), "source")) ||
      failed(verifyTile(*this, getDst(), "destination")) ||
      failed(verifyColumn(*this, getDst(), getSrc(), "destination")))
    return failure();
  switch (getOp()) {
  case AluOp::add:
  case AluOp::max:
  case AluOp::min:
  case AluOp::multiply:
    return success();
  default:
    return emitOpError("reduction must be add, max, min or multiply");
  }
}

/// bn_stats and bn_aggr: float tiles of one partition count, `outputs` free
/// elements per partition in the destination.
static LogicalResult verifyStatistics(Operation *op, Value src, Value dst,
                                      int64_t outputs) {
  if (failed(verifyTile(op, src, "source")) ||
      failed(verifyTile(op, dst, "destination")))
    return failure();
  MemRefType in = memrefType(src), out = memrefType(dst);
  if (!isa<FloatType>(in.getElementType()) ||
      !isa<FloatType>(out.getElementType()))
    return op->emitOpError("source and destination must be float tiles");
  if (in.getDimSize(0) != out.getDimSize(0))
    return op->emitOpError("source and destination must have one partition "
                           "count");
  if (out.getNumElements() != out.getDimSize(0) * outputs)
    return op->emitOpError("destination must have ")
           << outputs << " elements per partition";
  return success();
}

static int64_t freeElements(MemRefType type) {
  return type.getNumElements() / std::max<int64_t>(1, type.getDimSize(0));
}

LogicalResult BnStatsOp::verify() {
  if (failed(verifyStatistics(*this, getSrc(), getDst(), 6)))
    return failure();
  const auto *target = lookupTarget(*this);
  if (!target)
    return failure();
  int64_t limit = target->value("bn_stats_max_free_elements");
  int64_t n = freeElements(memrefType(getSrc()));
  if (n < 1 || n > limit)
    return emitOpError("source has ")
           << n << " elements per partition; bn_stats takes 1 to " << limit;
  return success();
}

LogicalResult BnAggrOp::verify() {
  if (failed(verifyStatistics(*this, getSrc(), getDst(), 2)))
    return failure();
  int64_t n = freeElements(memrefType(getSrc()));
  if (n < 3 || n % 3 != 0)
    return emitOpError("source must hold (count, mean, count * variance) "
                       "triples: a positive multiple of 3 elements per "
                       "partition, not ")
           << n;
  return success();
}

LogicalResult SelectOp::verify() {
  if (failed(verifyAluEngine(*this, getEngine())))
    return failure();
  for (auto [v, name] : {std::pair{getPred(), "predicate"},
                         {getOnTrue(), "on_true"},
                         {getOnFalse(), "on_false"},
                         {getDst(), "destination"}})
    if (failed(verifyTile(*this, v, name)) ||
        failed(verifySameShape(*this, v, getDst(), "operands")))
      return failure();
  return success();
}

LogicalResult CopyOp::verify() {
  bool gpsimd = getEngine() == Engine::gpsimd;
  if (failed(verifyEngine(*this, getEngine())))
    return failure();
  if (failed(verifyTile(*this, getSrc(), "source", !gpsimd)) ||
      failed(verifyTile(*this, getDst(), "destination", !gpsimd)) ||
      failed(
          verifySameShape(*this, getSrc(), getDst(), "source and destination")))
    return failure();
  return success();
}

LogicalResult MemsetOp::verify() {
  if (failed(verifyAluEngine(*this, getEngine())))
    return failure();
  return verifyTile(*this, getDst(), "destination");
}

LogicalResult IotaOp::verify() {
  if (failed(verifyTile(*this, getDst(), "destination", false)))
    return failure();
  if ((int64_t)getMultipliers().size() != memrefType(getDst()).getRank() - 1)
    return emitOpError("needs one multiplier per free dim");
  // The program format stores the offset as an affine form, like a view's.
  if (getOffset() && !isOffsetForm(getOffset()))
    return emitOpError("offset must be built from index constants, "
                       "arith.addi, arith.muli by a constant, scf.for ivs "
                       "and size expressions");
  return success();
}

LogicalResult NGatherOp::verify() {
  if (failed(verifyTile(*this, getSrc(), "source", false)) ||
      failed(verifyTile(*this, getIndices(), "indices", false)) ||
      failed(verifyTile(*this, getDst(), "destination", false)))
    return failure();
  MemRefType src = memrefType(getSrc()), idx = memrefType(getIndices()),
             dst = memrefType(getDst());
  if (idx.getDimSize(0) != src.getDimSize(0) ||
      dst.getDimSize(0) != src.getDimSize(0))
    return emitOpError("source, indices and destination must have one "
                       "partition count");
  if (!idx.getElementType().isSignlessInteger(32))
    return emitOpError("indices must be i32");
  if (dst.getElementType() != src.getElementType())
    return emitOpError("destination must have the source's element type");
  if (idx.getNumElements() != dst.getNumElements())
    return emitOpError("needs one index per destination element");
  return success();
}

LogicalResult RandOp::verify() {
  if (failed(verifyTile(*this, getDst(), "destination", false)) ||
      failed(verifyTile(*this, getSeed(), "seed", false)))
    return failure();
  MemRefType dst = memrefType(getDst()), seed = memrefType(getSeed());
  if (!isa<FloatType>(dst.getElementType()))
    return emitOpError("destination must have a float element type");
  if (seed.getRank() != 2 || seed.getDimSize(0) != dst.getDimSize(0) ||
      seed.getDimSize(1) != 2 || !seed.getElementType().isInteger(32))
    return emitOpError("seed must be an i32 [P, 2] tile matching the "
                       "destination's partitions");
  if ((int64_t)getMultipliers().size() != dst.getRank() - 1)
    return emitOpError("needs one multiplier per free dim");
  if (getStream() < 0 || getStream() > 0xFFFFFFFFll)
    return emitOpError("stream must fit in 32 unsigned bits");
  if (getOffset() && !isOffsetForm(getOffset()))
    return emitOpError("offset must be built from index constants, "
                       "arith.addi, arith.muli by a constant, scf.for ivs "
                       "and size expressions");
  return success();
}

//===----------------------------------------------------------------------===//
// Custom assembly
//===----------------------------------------------------------------------===//

/// `, type` for each optional operand that was parsed (activation's bias,
/// scale_col and accumulate), in operand order.
static ParseResult parseOptionalTypes(
    OpAsmParser &parser, std::optional<OpAsmParser::UnresolvedOperand> first,
    Type &firstType, std::optional<OpAsmParser::UnresolvedOperand> second,
    Type &secondType, std::optional<OpAsmParser::UnresolvedOperand> third,
    Type &thirdType) {
  for (auto [operand, type] : {std::pair{&first, &firstType},
                               {&second, &secondType},
                               {&third, &thirdType}})
    if (operand->has_value() &&
        (parser.parseComma() || parser.parseType(*type)))
      return failure();
  return success();
}

static void printOptionalTypes(OpAsmPrinter &printer, Operation *, Value first,
                               Type firstType, Value second, Type secondType,
                               Value third, Type thirdType) {
  for (auto [operand, type] :
       {std::pair{first, firstType}, {second, secondType}, {third, thirdType}})
    if (operand)
      printer << ", " << type;
}

#define GET_OP_CLASSES
#include "dialects/nisa/NisaOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

LogicalResult CollectiveOp::verify() {
  MemRefType src = memrefType(getSrc()), dst = memrefType(getDst());
  if (getMemorySpace(src) != MemorySpace::hbm ||
      getMemorySpace(dst) != MemorySpace::hbm)
    return emitOpError("source and destination must be in HBM");
  if (src.getElementType() != dst.getElementType())
    return emitOpError("source and destination must have one element type");
  if (!src.hasStaticShape() || !dst.hasStaticShape())
    return emitOpError("needs static shapes");
  ArrayRef<int64_t> ranks = getRanks();
  if (ranks.empty())
    return emitOpError("needs the group's ranks");
  llvm::SmallDenseSet<int64_t> seen;
  for (int64_t r : ranks)
    if (r < 0 || !seen.insert(r).second)
      return emitOpError("rank ") << r << " is negative or listed twice";
  auto n = static_cast<int64_t>(ranks.size());
  int64_t in = src.getNumElements(), out = dst.getNumElements();
  switch (getKind()) {
  case Collective::all_reduce:
    if (in != out)
      return emitOpError("all_reduce needs as many destination elements as "
                         "source elements");
    break;
  case Collective::all_gather:
    if (out != in * n)
      return emitOpError("all_gather needs ")
             << n << " (the group's size) times the source's elements in "
             << "the destination";
    break;
  case Collective::reduce_scatter:
    if (in != out * n)
      return emitOpError("reduce_scatter needs ")
             << n << " (the group's size) times the destination's elements "
             << "in the source";
    break;
  default:
    return emitOpError("kind must be all_reduce, all_gather or "
                       "reduce_scatter, not ")
           << stringifyCollective(getKind());
  }
  std::optional<AluOp> reduce = getOp();
  if (getKind() == Collective::all_gather) {
    if (reduce)
      return emitOpError("all_gather reduces nothing; it takes no 'op'");
    return success();
  }
  if (!reduce)
    return emitOpError(stringifyCollective(getKind()))
           << " needs its reduction 'op' (add, max or min)";
  if (*reduce != AluOp::add && *reduce != AluOp::max && *reduce != AluOp::min)
    return emitOpError("reduces with add, max or min, not ")
           << stringifyAluOp(*reduce);
  return success();
}
