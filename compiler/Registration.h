//===- Registration.h - the one registration point -------------*- C++ -*-===//
#ifndef COMPILER_REGISTRATION_H
#define COMPILER_REGISTRATION_H

namespace mlir {
class DialectRegistry;
}

namespace neuron::compiler {
/// Every dialect a TorchNeuron module may hold (ours and the upstream ones
/// the lowering produces). neuron-opt, the Python module and tests use it.
void registerDialects(mlir::DialectRegistry &registry);
/// Our passes plus the upstream cleanups the pipeline runs.
void registerPasses();
} // namespace neuron::compiler

#endif // COMPILER_REGISTRATION_H
