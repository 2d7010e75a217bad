//===- Pipeline.h - FX graph -> kernel program, in named stages -*- C++ -*-===//
#ifndef COMPILER_PIPELINE_PIPELINE_H
#define COMPILER_PIPELINE_PIPELINE_H

#include <map>

namespace mlir {
class ModuleOp;
}
#include <string>

namespace neuron::compiler {

struct CompileOptions {
  std::string target = "trn2";
  /// When set, every stage writes its module here as NN-<stage>.mlir
  /// (00-import ... 05-schedule), and the emitted program as
  /// 06-program.json.
  std::string dumpDir;
};

struct CompileResult {
  bool ok = false;
  std::string program; // kernel program (docs/PROGRAM_FORMAT.md) when ok
  std::string error;   // diagnostics with Python source lines otherwise
};

/// The named stages, in order: import, canonicalize, fuse, lower-to-nisa,
/// cleanup, schedule (allocation and sync insertion), emit.
CompileResult compileFxGraph(const std::string &document,
                             const CompileOptions &options);

/// The same stages for a parsed module: a `neuron` module is lowered; an
/// already lowered `nisa` module is only cleaned up and emitted.
CompileResult compileModule(mlir::ModuleOp module,
                            const CompileOptions &options);

/// Parses `text` (a `nisa` kernel module, e.g. traced from an NKI kernel;
/// `bufferName` names it in diagnostics when its ops carry no locations),
/// verifies it and runs the stages from cleanup on: allocation of the tiles
/// that have no address, sync insertion and emission. Parse and verifier
/// errors are reported at the ops' locations like every other stage's.
CompileResult compileKernelText(const std::string &text,
                                const std::string &bufferName,
                                const CompileOptions &options);

/// Node name -> why it cannot run on the device (see checkFxGraph).
std::map<std::string, std::string> checkFxGraph(const std::string &document);

} // namespace neuron::compiler

#endif // COMPILER_PIPELINE_PIPELINE_H
