//===- CollectiveHandler.h - Who runs collective instructions --*- C++ -*-===//
//
// A kernel program's collective instructions move bytes between the ranks
// of a process group; the runtime does not link a transport (nor libtorch),
// so whoever runs the program hands the executor a handler that does. The
// libtorch side installs one that calls the c10d process group named by the
// instruction (torchneuron._distributed). The handler is a table of plain
// functions: it crosses shared objects that each carry their own copy of the
// runtime (torchneuron._C and torchneuron._distributed), like
// runtime/device/CollectiveTimeline.h; kVersion guards against mixed builds.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_EXEC_COLLECTIVEHANDLER_H
#define NEURON_RUNTIME_EXEC_COLLECTIVEHANDLER_H

#include "runtime/program/DType.h"
#include "runtime/program/Program.h"

#include <cstddef>
#include <cstdint>

namespace neuron::runtime {

/// One collective instruction instance: contiguous host arrays of one dtype.
struct CollectiveCall {
  Collective kind = Collective::AllReduce;
  /// all_reduce and reduce_scatter: add, max or min.
  AluOp reduce = AluOp::Add;
  /// The process group's name (Program::groups) and its size.
  const char *group = "";
  int64_t groupSize = 1;
  DType dtype = DType::F32;
  const void *src = nullptr;
  int64_t srcElements = 0;
  void *dst = nullptr;
  int64_t dstElements = 0;
};

struct CollectiveHandler {
  static constexpr int kVersion = 1;
  static constexpr const char *kCapsuleName = "torchneuron.CollectiveHandler";
  int version = kVersion;
  void *context = nullptr;
  /// Runs `call` to completion on this rank (every rank of the group runs
  /// the same program). Returns 0, or non-zero with a NUL-terminated
  /// message in `error` (at most `errorSize` bytes).
  int (*run)(void *context, const CollectiveCall *call, char *error,
             size_t errorSize) = nullptr;
};

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_EXEC_COLLECTIVEHANDLER_H
