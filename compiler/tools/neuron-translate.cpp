//===- neuron-translate.cpp - FX JSON <-> MLIR <-> kernel program ---------===//
//
//   --import-fx      FX graph document (JSON) -> `neuron` module
//   --emit-program   lowered `nisa` module -> kernel program (JSON)
//
//===----------------------------------------------------------------------===//
#include "compiler/Registration.h"
#include "compiler/emit/EmitProgram.h"
#include "compiler/importer/FxImporter.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/Support/SourceMgr.h"

using namespace mlir;

int main(int argc, char **argv) {
  TranslateToMLIRRegistration importFx(
      "import-fx", "import an FX graph document as a neuron module",
      [](llvm::SourceMgr &sources, MLIRContext *ctx) -> OwningOpRef<Operation *> {
        const llvm::MemoryBuffer *buffer =
            sources.getMemoryBuffer(sources.getMainFileID());
        std::string error;
        auto module =
            neuron::compiler::importFxGraph(*ctx, buffer->getBuffer().str(), error);
        if (!module) {
          emitError(UnknownLoc::get(ctx)) << error;
          return nullptr;
        }
        return OwningOpRef<Operation *>(module.release());
      },
      [](DialectRegistry &registry) {
        neuron::compiler::registerDialects(registry);
      });
  TranslateFromMLIRRegistration emitProgram(
      "emit-program", "write a lowered nisa module as a kernel program",
      [](Operation *op, llvm::raw_ostream &os) -> LogicalResult {
        auto module = dyn_cast<ModuleOp>(op);
        if (!module)
          return op->emitError("expected a module");
        auto program = neuron::compiler::emitProgram(module);
        if (failed(program))
          return failure();
        os << *program << "\n";
        return success();
      },
      [](DialectRegistry &registry) {
        neuron::compiler::registerDialects(registry);
      });
  return failed(mlirTranslateMain(argc, argv, "TorchNeuron translation tool"));
}
