//===- KernelProvider.h - Device kernels for eager ops ----------*- C++ -*-===//
//
// Eager ops on neuron tensors run as device kernels when a kernel provider
// can give the program of the op at the call's sizes, dtypes and strides.
// The device library defines the interface and never links the compiler: the
// compiler side implements it and registers it when it loads (today a Python
// provider, python/torchneuron/eager.py, over the torch.compile pipeline).
//
// The dispatcher (EagerKernels.cpp) keys each call by its operator and, per
// argument, the tensor's device kind, dtype, sizes and strides (of each
// element of a tensor list), or the value of a non-tensor argument (a number
// the provider made a kernel input, or a generator: its kind only); it asks the provider once per key and keeps the
// answer in memory (a loaded program with its executor, or "no kernel", which
// sends the op to the counted CPU fallback). A later call with the same key
// costs the key, one hash lookup, the output allocations and the run.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_KERNELPROVIDER_H
#define NEURON_RUNTIME_DEVICE_KERNELPROVIDER_H

#include "runtime/device/Stream.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace neuron::device {

/// Where a program input's data comes from: op argument `argument` (a
/// tensor, a number, or element `element` of a tensor list; a CPU 0-d float64
/// tensor is passed as float32), or, for kSeed, two int32 words drawn from the
/// op's generator (its generator argument, or the device's default one) on
/// every run: the seed of the program's Philox `rand` numbers.
struct KernelInput {
  static constexpr int kSeed = -1;
  int argument = 0;
  int element = -1; ///< in a tensor-list argument; -1: the whole argument
};

/// The program of one eager op call, and where its buffers come from.
struct ProvidedKernel {
  std::string name;    ///< for profiles
  std::string program; ///< kernel program JSON (docs/PROGRAM_FORMAT.md)
  /// One run's modeled time, and the busy time of each engine, the DMA and
  /// HBM in it ("tensor", "dma", ...): what kernels on other streams compete
  /// for (Stream.h).
  Work work;
  /// Per program input, where its data comes from.
  std::vector<KernelInput> inputs;
  /// Per program output: the argument it is written into (out=, in-place),
  /// or -1 for a new neuron tensor.
  std::vector<int> outputs;
  /// Per program output written into a tensor-list argument: its element
  /// (-1: the whole argument). Empty: no output goes into a list.
  std::vector<int> outputElements;
  /// Per op return: an argument index (>= 0), -(program output) - 1, or
  /// kUndefinedReturn (an undefined tensor: a result the op leaves out, as a
  /// backward's output_mask does).
  std::vector<int> returns;
  static constexpr int kUndefinedReturn = std::numeric_limits<int>::min();
  int64_t id = -1; ///< the provider's handle, passed back to the recorder
  /// Arguments (numbers) that the program takes as 0-d inputs instead of
  /// constants: later calls of the op key them by kind, not value, so one
  /// kernel serves every value (an optimizer's step size).
  std::vector<int> scalarArgs;
};

class KernelProvider {
public:
  virtual ~KernelProvider() = default;
  /// The kernel of `op` called with `args` for `target`, or nullopt when the
  /// op cannot run on the device at these arguments. Tensor arguments are
  /// neuron tensors, undefined, or CPU 0-d tensors; the provider reads only
  /// their metadata. Called once per call key.
  virtual std::optional<ProvidedKernel>
  kernelFor(const c10::OperatorHandle &op, c10::ArrayRef<c10::IValue> args,
            const std::string &target) = 0;
  /// Called after every run of kernel `id` while profiling is on, with when
  /// it started on the device's timeline (ns).
  virtual void recordRun(int64_t id, double startNs) = 0;
  /// Called after every copy to, from or between neuron devices and every
  /// collective of the `neuron` process-group backend (runtime/distributed)
  /// while profiling is on: its name ("copy_host_to_device", "all_reduce",
  /// ...), the resource that carries it ("host_link", "dma", "neuronlink"),
  /// the bytes it moves, its modeled time and when it started.
  virtual void recordTransfer(const std::string &name,
                              const std::string &resource, int64_t bytes,
                              double deviceNs, double startNs) = 0;
};

/// Installs the provider (nullptr: none; every op falls back to the CPU) and
/// forgets every cached kernel.
void setKernelProvider(std::shared_ptr<KernelProvider> provider);
/// Device kernels on or off (TORCHNEURON_EAGER_KERNELS=0 starts off).
void setEagerKernelsEnabled(bool enabled);
bool eagerKernelsEnabled();
/// Call KernelProvider::recordRun after every run and recordTransfer after
/// every copy and collective.
void setEagerProfiling(bool enabled);
/// Places a planned copy (Stream.h) on the timeline and reports it to
/// torchneuron profiles.
void placeCopy(const std::optional<PlannedCopy> &copy);
/// Places a collective's modeled work on the collective stream of `device`
/// (Stream.h: after the work issued before it on the current stream, which
/// does not wait for it) and
/// shows it to the profilers as a copy is shown: a range "neuron::<name>"
/// with its bytes and a device event for torch.profiler, a run in
/// torchneuron profiles. Returns its [start, end) in ns.
std::pair<double, double> placeCollective(c10::DeviceIndex device,
                                          const std::string &name,
                                          int64_t bytes, const Work &work);
void clearEagerKernelCache();

/// Runs the op on `stack` as a device kernel if there is one (popping the
/// arguments and pushing the returns); false leaves the stack untouched.
bool runEagerKernel(const c10::OperatorHandle &op, torch::jit::Stack *stack);

/// Counters since the last reset: "runs" (device kernel runs), "compiles"
/// (provider calls that gave a kernel), "rejected" (that gave none),
/// "cached_kernels".
std::map<std::string, int64_t> eagerKernelCounts();
void resetEagerKernelCounts();

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_KERNELPROVIDER_H
