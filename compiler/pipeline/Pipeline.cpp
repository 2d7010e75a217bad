//===- Pipeline.cpp - FX graph -> kernel program, in named stages ---------===//
#include "compiler/pipeline/Pipeline.h"

#include "compiler/Registration.h"
#include "compiler/emit/EmitProgram.h"
#include "compiler/importer/FxImporter.h"
#include "runtime/target/Target.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <atomic>
#include <unistd.h>

using namespace mlir;

namespace {

struct Stage {
  const char *name;
  const char *passes; // textual pipeline, as neuron-opt takes it
};

/// "file:line: error: message" for every diagnostic, like a C compiler.
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(MLIRContext &ctx)
      : handler(&ctx, [this](Diagnostic &d) {
          llvm::raw_string_ostream os(text);
          os << location(d.getLocation()) << ": "
             << (d.getSeverity() == DiagnosticSeverity::Error ? "error"
                                                               : "note")
             << ": " << d << "\n";
          for (Diagnostic &note : d.getNotes())
            os << location(note.getLocation()) << ": note: " << note << "\n";
          return success();
        }) {}
  std::string text;

private:
  static std::string location(Location loc) {
    if (auto f = dyn_cast<FileLineColLoc>(loc))
      return f.getFilename().str() + ":" + std::to_string(f.getLine());
    if (auto n = dyn_cast<NameLoc>(loc)) {
      std::string inner = location(n.getChildLoc());
      return inner + " (" + n.getName().str() + ")";
    }
    if (auto fused = dyn_cast<FusedLoc>(loc))
      if (!fused.getLocations().empty())
        return location(fused.getLocations().front());
    return "<unknown>";
  }
  ScopedDiagnosticHandler handler;
};

std::string writeModule(ModuleOp module, const std::string &dir,
                        const std::string &file) {
  llvm::sys::fs::create_directories(dir);
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, file);
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  if (ec)
    return "";
  module->print(os, OpPrintingFlags().enableDebugInfo(true, false));
  return std::string(path);
}

std::string failureDir(const neuron::compiler::CompileOptions &options) {
  if (!options.dumpDir.empty())
    return options.dumpDir;
  static std::atomic<int> counter{0};
  llvm::SmallString<128> tmp;
  llvm::sys::path::system_temp_directory(true, tmp);
  llvm::sys::path::append(tmp, "torchneuron-" + std::to_string(getpid()) +
                                   "-" + std::to_string(counter++));
  return std::string(tmp);
}

MLIRContext &threadContext() {
  // One context per thread: creating one costs more than a small compile.
  thread_local std::unique_ptr<MLIRContext> ctx = [] {
    DialectRegistry registry;
    neuron::compiler::registerDialects(registry);
    neuron::compiler::registerPasses();
    auto c = std::make_unique<MLIRContext>(registry,
                                           MLIRContext::Threading::DISABLED);
    c->loadAllAvailableDialects();
    return c;
  }();
  return *ctx;
}

} // namespace

std::map<std::string, std::string>
neuron::compiler::checkFxGraph(const std::string &document) {
  MLIRContext &ctx = threadContext();
  DiagnosticCollector diagnostics(ctx);
  return neuron::compiler::checkFxGraph(ctx, document);
}

/// Lowers and emits `module` (a `neuron` module, or an already lowered
/// `nisa` one), dumping each stage; diagnostics go to `diagnostics`.
static neuron::compiler::CompileResult
runStages(ModuleOp module, const neuron::compiler::CompileOptions &options,
          DiagnosticCollector &diagnostics, bool imported) {
  neuron::compiler::CompileResult result;
  MLIRContext &ctx = *module.getContext();
  try {
    ::neuron::target::getTarget(options.target);
  } catch (const std::exception &e) {
    result.error = std::string("error: ") + e.what() + "\n";
    return result;
  }
  bool lowered = llvm::any_of(module.getOps<func::FuncOp>(), [](func::FuncOp f) {
    return f->hasAttr("nisa.kernel");
  });
  if (!lowered || !module->hasAttr("nisa.target"))
    module->setAttr("nisa.target", StringAttr::get(&ctx, options.target));
  int index = 0;
  auto dump = [&](const char *stage) {
    if (!options.dumpDir.empty()) {
      char name[64];
      snprintf(name, sizeof(name), "%02d-%s.mlir", index, stage);
      writeModule(module, options.dumpDir, name);
    }
    ++index;
  };
  dump(imported ? "import" : "input");

  std::string lower = "neuron-lower-to-nisa{target=" + options.target + "}";
  const Stage stages[] = {{"canonicalize", "canonicalize"},
                          {"fuse", "neuron-fuse-elementwise"},
                          {"lower-to-nisa", lower.c_str()},
                          {"cleanup", "canonicalize,cse"},
                          {"schedule", "nisa-allocate,nisa-insert-sync"}};
  for (const Stage &stage : stages) {
    // A module that arrives lowered is still cleaned up and scheduled.
    llvm::StringRef name = stage.name;
    if (lowered &&
        (name == "canonicalize" || name == "fuse" || name == "lower-to-nisa"))
      continue;
    PassManager pm(&ctx, ModuleOp::getOperationName());
    std::string pipeline = std::string("builtin.module(") + stage.passes + ")";
    if (failed(parsePassPipeline(stage.passes, pm))) {
      result.error = "internal: bad pipeline " + pipeline;
      return result;
    }
    OwningOpRef<ModuleOp> snapshot(cast<ModuleOp>(module->clone()));
    if (failed(pm.run(module))) {
      std::string dir = failureDir(options);
      std::string file = writeModule(
          *snapshot, dir, std::string("failed-") + stage.name + ".mlir");
      result.error = diagnostics.text + "stage '" + stage.name +
                     "' failed; reproduce with:\n  neuron-opt " + file +
                     " --pass-pipeline='" + pipeline + "'\n";
      return result;
    }
    dump(stage.name);
  }
  auto program = neuron::compiler::emitProgram(module);
  if (failed(program)) {
    std::string dir = failureDir(options);
    std::string file = writeModule(module, dir, "failed-emit.mlir");
    result.error = diagnostics.text +
                   "stage 'emit' failed; reproduce with:\n  neuron-translate "
                   "--emit-program " +
                   file + "\n";
    return result;
  }
  if (!options.dumpDir.empty()) {
    llvm::SmallString<256> path(options.dumpDir);
    char name[64];
    snprintf(name, sizeof(name), "%02d-program.json", index);
    llvm::sys::path::append(path, name);
    std::error_code ec;
    llvm::raw_fd_ostream os(path, ec);
    if (!ec)
      os << *program << "\n";
  }
  result.ok = true;
  result.program = std::move(*program);
  return result;
}

neuron::compiler::CompileResult
neuron::compiler::compileFxGraph(const std::string &document,
                                 const CompileOptions &options) {
  MLIRContext &ctx = threadContext();
  DiagnosticCollector diagnostics(ctx);
  std::string importError;
  OwningOpRef<ModuleOp> module = importFxGraph(ctx, document, importError);
  if (!module) {
    CompileResult result;
    result.error = importError + "\n" + diagnostics.text;
    return result;
  }
  return runStages(*module, options, diagnostics, /*imported=*/true);
}

neuron::compiler::CompileResult
neuron::compiler::compileModule(ModuleOp module, const CompileOptions &options) {
  DiagnosticCollector diagnostics(*module.getContext());
  return runStages(module, options, diagnostics, /*imported=*/false);
}

neuron::compiler::CompileResult
neuron::compiler::compileKernelText(const std::string &text,
                                    const std::string &bufferName,
                                    const CompileOptions &options) {
  MLIRContext &ctx = threadContext();
  DiagnosticCollector diagnostics(ctx);
  ParserConfig config(&ctx);
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(text, config, bufferName);
  if (!module) {
    CompileResult result;
    result.error = diagnostics.text;
    if (result.error.empty())
      result.error = bufferName + ": error: not a kernel module\n";
    return result;
  }
  return runStages(*module, options, diagnostics, /*imported=*/false);
}
