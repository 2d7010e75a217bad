//===- NeuronDialect.h - graph-level Neuron dialect ------------*- C++ -*-===//
#ifndef DIALECTS_NEURON_NEURONDIALECT_H
#define DIALECTS_NEURON_NEURONDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/neuron/NeuronDialect.h.inc"
#include "dialects/neuron/NeuronEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/neuron/NeuronAttrs.h.inc"

#define GET_OP_CLASSES
#include "dialects/neuron/NeuronOps.h.inc"

namespace mlir::neuron {
/// True for functions whose result is a predicate (i1) rather than a value.
bool isPredicate(BinaryFn fn);

/// Size-generic functions (issue #16): a size parameter is an `index`
/// argument with {name, min, max} under kSizeAttrName; a tensor argument or
/// result with dynamic dims has its sizes as an affine map from the size
/// arguments (symbol i is the i-th of them) under kDimsAttrName, and so
/// may an op with one dynamic result (the importer's, from the document;
/// passes that change the result's type must change it too or drop it).
constexpr llvm::StringLiteral kSizeAttrName = "neuron.size";
constexpr llvm::StringLiteral kDimsAttrName = "neuron.dims";

/// The longest rotated dim canonicalization makes a neuron.rotary of (heads
/// of RoPE are 64 to 256): its lowering keeps twelve rows of it per
/// partition on chip.
constexpr int64_t kMaxRotaryDim = 1024;
} // namespace mlir::neuron

#endif // DIALECTS_NEURON_NEURONDIALECT_H
