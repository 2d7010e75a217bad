//===- EmitProgram.h - nisa kernel -> kernel program -----------*- C++ -*-===//
#ifndef COMPILER_EMIT_EMITPROGRAM_H
#define COMPILER_EMIT_EMITPROGRAM_H

#include "mlir/Support/LogicalResult.h"

#include <string>

namespace mlir {
class ModuleOp;
namespace func {
class FuncOp;
}
} // namespace mlir

namespace neuron::compiler {
/// Writes a lowered kernel (`nisa.kernel` function) as a kernel program in
/// the JSON format of docs/PROGRAM_FORMAT.md. Errors are emitted as
/// diagnostics at the offending op.
mlir::FailureOr<std::string> emitProgram(mlir::func::FuncOp kernel);
/// The same for the one kernel function of `module`.
mlir::FailureOr<std::string> emitProgram(mlir::ModuleOp module);
} // namespace neuron::compiler

#endif // COMPILER_EMIT_EMITPROGRAM_H
