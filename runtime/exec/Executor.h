//===- Executor.h - Functional executor of kernel programs ------*- C++ -*-===//
//
// Runs a verified kernel program on host memory with Trainium's numerics:
// operands widened to fp32, fp32 compute (Eigen tile kernels), rounding on
// store to the destination dtype, fp32 accumulation for matmul.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_EXEC_EXECUTOR_H
#define NEURON_RUNTIME_EXEC_EXECUTOR_H

#include "runtime/program/DType.h"
#include "runtime/program/Error.h"
#include "runtime/program/Program.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace neuron::target {
struct Target;
} // namespace neuron::target

namespace neuron::runtime {

class WorkerPool;
struct CollectiveHandler;

/// A contiguous row-major host array owned by the caller.
struct HostTensor {
  void *data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

class Executor {
public:
  /// Verifies `program` against `target` (throws Error if it is invalid),
  /// compiles its views and allocates internal, scratch and constant buffers
  /// once. The executor keeps no reference to `program` or `target`.
  Executor(const Program &program, const neuron::target::Target &target);
  /// The same, splitting large instructions between `pool`'s threads instead
  /// of the process's (WorkerPool::shared()). `pool` must outlive the
  /// executor. The results do not depend on the pool's size.
  Executor(const Program &program, const neuron::target::Target &target,
           WorkerPool &pool);
  ~Executor();
  Executor(Executor &&) noexcept;
  Executor &operator=(Executor &&) noexcept;
  Executor(const Executor &) = delete;
  Executor &operator=(const Executor &) = delete;

  /// Runs the program once. `inputs` and `outputs` follow the program's
  /// argument and result order; each must match its buffer's dtype and shape
  /// exactly (Error otherwise). Runtime faults (an out-of-range gather index)
  /// throw Error; the executor stays usable. Not reentrant: one run() at a
  /// time per executor. Scratch and internal buffers keep their contents
  /// between runs, as on-chip memory would. Collective instructions run
  /// through `collectives` (which must outlive the call); a program with
  /// collectives run without a handler is an Error.
  void run(const std::vector<HostTensor> &inputs,
           const std::vector<HostTensor> &outputs,
           const CollectiveHandler *collectives = nullptr);

  /// Instructions executed by the most recent run() (each loop iteration
  /// counts its body again).
  uint64_t instructionsExecuted() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl;
};

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_EXEC_EXECUTOR_H
