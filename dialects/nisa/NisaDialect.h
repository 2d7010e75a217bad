//===- NisaDialect.h - kernel-level Neuron ISA dialect ---------*- C++ -*-===//
#ifndef DIALECTS_NISA_NISADIALECT_H
#define DIALECTS_NISA_NISADIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/bit.h"

#include "runtime/program/Program.h"
#include "runtime/program/SizeExpr.h"

#include "dialects/nisa/NisaDialect.h.inc"
#include "dialects/nisa/NisaEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/nisa/NisaAttrs.h.inc"

namespace mlir::nisa {
/// The program opcode of nisa::<Name>Op, for each entry of
/// runtime/program/InstructionSet.def (specialised below).
template <typename OpTy> struct OpcodeOf;
namespace detail {
// InstructionOpInterface's default methods (NisaInterfaces.td).
template <typename OpTy> Engine issuingEngine(OpTy op);
SmallVector<Value, 2> writtenOperands(Operation *op);
} // namespace detail
} // namespace mlir::nisa

#include "dialects/nisa/NisaInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/nisa/NisaOps.h.inc"

namespace mlir::nisa {
#define NEURON_OPCODE(Name, Mnemonic, IsDma, Engines)                          \
  template <> struct OpcodeOf<Name##Op> {                                      \
    static constexpr ::neuron::runtime::Opcode value =                         \
        ::neuron::runtime::Opcode::Name;                                       \
  };
#include "runtime/program/InstructionSet.def"

namespace detail {
template <typename OpTy, typename = void>
struct HasEngineAttr : std::false_type {};
template <typename OpTy>
struct HasEngineAttr<OpTy,
                     std::void_t<decltype(std::declval<OpTy>().getEngine())>>
    : std::true_type {};

/// Instructions with an `engine` attribute run where it says; the others
/// have one engine that may issue them (InstructionSet.def).
template <typename OpTy> Engine issuingEngine(OpTy op) {
  if constexpr (HasEngineAttr<OpTy>::value) {
    return op.getEngine();
  } else {
    constexpr ::neuron::runtime::EngineSet engines =
        ::neuron::runtime::issuingEngines(OpcodeOf<OpTy>::value);
    static_assert(engines && !(engines & (engines - 1)),
                  "an op without an engine attribute has one legal engine");
    return static_cast<Engine>(llvm::countr_zero(engines));
  }
}
} // namespace detail
} // namespace mlir::nisa

namespace neuron::target {
struct Target;
}

namespace mlir::nisa {
/// Name of the module attribute that selects the target ("trn2", "trn3").
constexpr llvm::StringLiteral kTargetAttrName = "nisa.target";

/// The target an op is compiled for: its module's `nisa.target`, or trn2.
/// Emits an error and returns null when the module names an unknown target.
const ::neuron::target::Target *lookupTarget(Operation *op);

/// The memory a memref lives in; memrefs without a memory space are HBM.
MemorySpace getMemorySpace(MemRefType type);
MemRefType withMemorySpace(MemRefType type, MemorySpace space);

/// Attributes of the allocation and synchronisation passes (NisaOps.td).
constexpr llvm::StringLiteral kAddressAttrName = "nisa.address";
constexpr llvm::StringLiteral kIdAttrName = "nisa.id";
constexpr llvm::StringLiteral kWaitsAttrName = "nisa.waits";
/// Issue #16: per wait, the sizes at which it holds (a size expression,
/// positive there; "" for every size).
constexpr llvm::StringLiteral kWaitWhenAttrName = "nisa.wait_when";
constexpr llvm::StringLiteral kSynchronizedAttrName = "nisa.synchronized";
/// A kernel's choice of free addresses in nisa-allocate: "least_recent" or
/// "lowest" (without it: least recent, lowest where that does not fit).
constexpr llvm::StringLiteral kReuseAttrName = "nisa.reuse";

/// The runtime's value of a dialect enum: both are generated from
/// InstructionSet.def, in the same order.
::neuron::runtime::Engine toProgram(Engine engine);
::neuron::runtime::Space toProgram(MemorySpace space);
::neuron::runtime::ActFunc toProgram(ActivationFn func);
::neuron::runtime::AluOp toProgram(AluOp op);
::neuron::runtime::Collective toProgram(Collective kind);

/// Whether `engine` may issue `op` (InstructionSet.def).
bool canIssue(::neuron::runtime::Opcode op, Engine engine);

/// An index as constant + sum(coeff * iv) over scf.for induction variables.
struct AffineIndex {
  int64_t constant = 0;
  SmallVector<std::pair<Value, int64_t>, 2> terms; // (iv, coefficient)
};
/// The affine form of an index built from index constants, addi, muli by a
/// constant and scf.for ivs (how kernels compute view offsets), or
/// std::nullopt.
std::optional<AffineIndex> affineIndexOf(Value index);

/// The strides of a view, constant operands included; ShapedType::kDynamic
/// where a stride is not a constant.
SmallVector<int64_t> viewStrides(Operation *reinterpretCast);

/// Bytes one partition of an on-chip tile holds (bool: one byte).
int64_t bytesPerPartition(MemRefType tile);

/// The size-expression function (runtime/program/SizeExpr.h) an arith op on
/// the indices of a size-generic kernel computes, or std::nullopt: sizes are
/// non-negative, so divsi and remsi are floordiv and mod (issue #16).
std::optional<::neuron::runtime::SizeExpr::Kind> sizeFunctionOf(Operation *op);
} // namespace mlir::nisa

#endif // DIALECTS_NISA_NISADIALECT_H
