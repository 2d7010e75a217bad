//===- neuron-run.cpp - run an MLIR file on the engine model --------------===//
//
// For compiler engineers working below PyTorch: takes a `neuron` module (it
// is lowered) or a lowered `nisa` module, runs it on the engine model with
// random inputs and prints where the modeled device time goes.
//
//   neuron-run kernel.mlir [--target=trn3] [--seed=1] [--top=10]
//
//===----------------------------------------------------------------------===//

#include "compiler/Registration.h"
#include "compiler/pipeline/Pipeline.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/Numerics.h"
#include "runtime/program/Program.h"
#include "runtime/target/Target.h"
#include "runtime/timing/TimingModel.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

using namespace neuron;
namespace cl = llvm::cl;

static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<input.mlir>"),
                                      cl::Required);
static cl::opt<std::string> targetName("target", cl::desc("trn2 or trn3"),
                                       cl::init("trn2"));
static cl::opt<unsigned> seed("seed", cl::desc("random input seed"),
                              cl::init(0));
static cl::opt<unsigned> top("top", cl::desc("source lines to list"),
                             cl::init(10));

/// Host memory for one program argument, filled with random values.
static std::vector<uint8_t> randomBuffer(const runtime::Buffer &b,
                                         std::mt19937 &rng) {
  int64_t n = b.numElements();
  std::vector<uint8_t> bytes(n * runtime::dtypeSize(b.dtype));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    // Integer inputs are indices: 0 is in range of every table.
    float v = runtime::isFloatDType(b.dtype) ? uniform(rng)
              : b.dtype == runtime::DType::Bool ? float(i % 2)
                                                 : 0.0f;
    runtime::storeFromF32(v, bytes.data() + i * runtime::dtypeSize(b.dtype),
                          b.dtype);
  }
  return bytes;
}

static int run() {
  mlir::DialectRegistry registry;
  compiler::registerDialects(registry);
  compiler::registerPasses();
  mlir::MLIRContext ctx(registry);
  llvm::SourceMgr sources;
  mlir::SourceMgrDiagnosticHandler diagnostics(sources, &ctx);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceFile<mlir::ModuleOp>(inputFile, sources, &ctx);
  if (!module)
    return 1; // the parser reported the error with its location
  compiler::CompileOptions options;
  options.target = targetName;
  compiler::CompileResult compiled = compiler::compileModule(*module, options);
  if (!compiled.ok) {
    fprintf(stderr, "%s", compiled.error.c_str());
    return 1;
  }
  const target::Target &target = target::getTarget(targetName);
  runtime::Program program = runtime::Program::parse(compiled.program);
  runtime::Executor executor(program, target);

  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<runtime::HostTensor> inputs, outputs;
  for (auto [ids, tensors] : {std::pair{&program.inputs, &inputs},
                              std::pair{&program.outputs, &outputs}})
    for (int64_t id : *ids) {
      const runtime::Buffer *b = program.findBuffer(id);
      storage.push_back(randomBuffer(*b, rng));
      tensors->push_back({storage.back().data(), b->dtype, b->shape});
    }
  executor.run(inputs, outputs);
  runtime::Timeline t = runtime::simulate(program, target, true);

  double us = t.totalNs / 1e3, seconds = std::max(t.totalNs, 1e-9) * 1e-9;
  printf("%s on %s: %lld static / %lld dynamic instructions\n",
         program.name.c_str(), target.name.c_str(),
         (long long)program.numInstructions(), (long long)t.instructions);
  printf("modeled device time: %.3f us, bound by %s\n", us, t.bound.c_str());
  printf("matmul: %.3g FLOP, %.2f TFLOP/s (%.1f%% of TensorE peak)\n", t.flops,
         t.flops / seconds / 1e12,
         100 * t.flops / seconds / target.peakFlopsPerSecond());
  printf("HBM: %.3g bytes, %.1f GB/s (%.1f%% of the roofline)\n", t.hbmBytes,
         t.hbmBytes / seconds / 1e9,
         100 * t.hbmBytes / seconds / target.peakHbmBytesPerSecond());
  printf("%-8s %12s %6s\n", "engine", "busy (us)", "util");
  for (auto &[engine, ns] : t.engineBusyNs)
    printf("%-8s %12.3f %5.1f%%\n", engine.c_str(), ns / 1e3,
           100 * ns / std::max(t.totalNs, 1e-9));

  // Busy time per Python/MLIR source line, summed over its instructions.
  std::map<int64_t, double> perLine;
  for (const runtime::InstructionTiming &e : t.events)
    perLine[e.loc] += e.endNs - e.startNs;
  std::vector<std::pair<double, int64_t>> lines;
  for (auto &[loc, ns] : perLine)
    lines.push_back({ns, loc});
  std::sort(lines.rbegin(), lines.rend());
  printf("busiest source lines (engine time, summed):\n");
  for (size_t i = 0; i < lines.size() && i < top; ++i) {
    int64_t loc = lines[i].second;
    printf("  %12.3f us  %s\n", lines[i].first / 1e3,
           loc >= 0 ? program.locations[loc].c_str() : "<no location>");
  }
  return 0;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(argc, argv, "Run an MLIR kernel on the engine model\n");
  try {
    return run();
  } catch (const std::exception &e) {
    fprintf(stderr, "neuron-run: error: %s\n", e.what());
    return 1;
  }
}
