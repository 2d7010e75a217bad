//===- FuzzMlirInput.cpp - libFuzzer target: neuron-opt's input -----------===//
//
// What neuron-opt does with a file before any pass: parse it with every
// TorchNeuron dialect registered, verify it (the `neuron` and `nisa`
// verifiers) and print it back (the custom printers). Invalid input must end
// in a diagnostic; a crash or a sanitizer report is a bug.
//
//===----------------------------------------------------------------------===//

#include "compiler/Registration.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/raw_ostream.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static mlir::DialectRegistry *registry = [] {
    auto *r = new mlir::DialectRegistry;
    neuron::compiler::registerDialects(*r);
    return r;
  }();
  mlir::MLIRContext context(*registry, mlir::MLIRContext::Threading::DISABLED);
  context.loadAllAvailableDialects();
  // Diagnostics are the expected outcome; keep them off the fuzzer's output.
  mlir::ScopedDiagnosticHandler quiet(&context,
                                      [](mlir::Diagnostic &) { return mlir::success(); });
  std::string source(reinterpret_cast<const char *>(data), size);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(source, &context);
  if (!module || mlir::failed(mlir::verify(*module)))
    return 0;
  std::string printed;
  llvm::raw_string_ostream os(printed);
  module->print(os);
  return 0;
}
