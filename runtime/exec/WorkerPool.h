//===- WorkerPool.h - Host threads for large instructions -------*- C++ -*-===//
//
// The executor runs a program's instructions in order, one at a time; a
// large matmul or DMA copy is split into chunks that the host threads share:
// the caller's thread and the workers claim chunks as they come, so a worker
// the system has not scheduled delays nothing. Instructions arrive
// microseconds apart, so workers spin briefly between tasks before they
// sleep.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_EXEC_WORKERPOOL_H
#define NEURON_RUNTIME_EXEC_WORKERPOOL_H

#include <cstdint>
#include <functional>
#include <memory>

namespace neuron::runtime {

class WorkerPool {
public:
  /// The process's pool. Its size is TORCHNEURON_HOST_THREADS (the caller's
  /// thread included), by default the machine's hardware threads; an
  /// invalid value throws Error.
  static WorkerPool &shared();

  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool &) = delete;
  WorkerPool &operator=(const WorkerPool &) = delete;

  int threads() const { return numThreads; }

  /// Calls fn(i) for every i in [0, count) and returns when all calls have
  /// returned. fn must not throw. The calls run on the caller's thread alone
  /// when another run() is in flight (an executor on another thread, or a
  /// run() inside fn) or in a forked child, which has no workers.
  void run(int64_t count, const std::function<void(int64_t)> &fn);

private:
  struct State;
  int numThreads;
  std::unique_ptr<State> state;
};

/// Parses a TORCHNEURON_HOST_THREADS value; throws Error unless it is a
/// positive integer.
int parseHostThreads(const char *value);

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_EXEC_WORKERPOOL_H
