//===- Profiler.h - The device's eager work in torch.profiler ---*- C++ -*-===//
//
// The device runs its work when it is issued, so a profiler sees it from the
// host: each eager kernel run and each copy is wrapped in a scope object that
// shows it to PyTorch's profilers (Profiler.cpp says how). Both scopes cost a
// thread-local check when no profiler is on.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_PROFILER_H
#define NEURON_RUNTIME_DEVICE_PROFILER_H

#include "runtime/device/Stream.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <optional>
#include <string>

namespace neuron::device {

/// One eager kernel run, from before its inputs are prepared until it
/// returns: a range "neuron::<kernel>" for torch.profiler and, when the
/// profiler records the PrivateUse1 activity, a device event of the
/// kernel's modeled duration on its stream's track.
class ProfiledKernelRun {
public:
  ProfiledKernelRun(const std::string &kernel, c10::Stream stream,
                    double modeledNs, int64_t bytes = -1);
  ~ProfiledKernelRun();
  ProfiledKernelRun(const ProfiledKernelRun &) = delete;
  ProfiledKernelRun &operator=(const ProfiledKernelRun &) = delete;

private:
  std::optional<at::RecordFunction> range;
  std::string name;
  c10::Stream stream;
  double modeledNs;
  int64_t issuedNs = 0;
  uint64_t correlation = 0;
};

/// One copy into or out of neuron memory (planCopy, Stream.h): a range
/// "neuron::copy_host_to_device" (device_to_host, device_to_device) with its
/// bytes and a device event of its modeled time, like a kernel's.
class ProfiledCopy {
public:
  explicit ProfiledCopy(const std::optional<PlannedCopy> &copy);

private:
  std::optional<ProfiledKernelRun> run;
};

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_PROFILER_H
