//===- FxImporter.h - FX graph document -> `neuron` IR ---------*- C++ -*-===//
#ifndef COMPILER_IMPORTER_FXIMPORTER_H
#define COMPILER_IMPORTER_FXIMPORTER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <map>
#include <string>

namespace neuron::compiler {

/// Why each node of an FX graph document (docs/FX_GRAPH_FORMAT.md) cannot be
/// imported, keyed by node name; empty when all of them can. A malformed
/// document is reported under the key "" (no node has that name).
std::map<std::string, std::string> checkFxGraph(mlir::MLIRContext &context,
                                                const std::string &document);

/// Imports an FX graph document as a module holding one `func.func` of
/// `neuron` ops, each located at its Python source line. On failure returns
/// null and describes the first unsupported node (with its source line) in
/// `error`.
mlir::OwningOpRef<mlir::ModuleOp> importFxGraph(mlir::MLIRContext &context,
                                                const std::string &document,
                                                std::string &error);

} // namespace neuron::compiler

#endif // COMPILER_IMPORTER_FXIMPORTER_H
