//===- Passes.h - TorchNeuron compiler passes ------------------*- C++ -*-===//
#ifndef PASSES_PASSES_H
#define PASSES_PASSES_H

#include "mlir/Pass/Pass.h"

namespace mlir::nisa {
class NisaDialect;
}
namespace mlir::neuron {
class NeuronDialect;
}
namespace mlir::scf {
class SCFDialect;
}
namespace mlir::memref {
class MemRefDialect;
}
namespace mlir::arith {
class ArithDialect;
}

namespace mlir::neuron {
#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

#endif // PASSES_PASSES_H
