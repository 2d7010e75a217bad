//===- FxImporter.h - FX graph document -> `neuron` IR ---------*- C++ -*-===//
#ifndef COMPILER_IMPORTER_FXIMPORTER_H
#define COMPILER_IMPORTER_FXIMPORTER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <cstdint>
#include <map>
#include <string>

namespace neuron::compiler {

/// The work topk/sort costs on the device: k rounds over each row of n
/// (passes/tile/LowerTopK.cpp), seven fp32 rows of n per partition in SBUF.
/// Larger selections are refused here; the Python front end sorts longer rows
/// by rank (decompositions.py), and reads these limits from `_C.MAX_SELECT`.
constexpr int64_t kMaxSelectRow = 4096;
constexpr int64_t kMaxSelectWork = 65536; // k * n

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
