//===- NisaDialect.h - kernel-level Neuron ISA dialect ---------*- C++ -*-===//
#ifndef DIALECTS_NISA_NISADIALECT_H
#define DIALECTS_NISA_NISADIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"

#include "dialects/nisa/NisaDialect.h.inc"
#include "dialects/nisa/NisaEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/nisa/NisaAttrs.h.inc"

#define GET_OP_CLASSES
#include "dialects/nisa/NisaOps.h.inc"

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
} // namespace mlir::nisa

#endif // DIALECTS_NISA_NISADIALECT_H
