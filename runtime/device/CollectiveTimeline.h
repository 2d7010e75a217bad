//===- CollectiveTimeline.h - The device for the c10d backend -*- C++ -*-===//
//
// torchneuron._distributed (the `neuron` torch.distributed backend) is its
// own shared object: it links libtorch_python, which torchneuron._device
// does not. Both must share one device (one timeline, one profiler), so the
// device hands the backend this table of functions in a capsule
// (torchneuron._device._collective_timeline()) rather than each module
// carrying its own copy of runtime/device. Both are built from one source
// tree by one compiler, so C++ types cross it; kVersion guards against
// mixing builds.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_COLLECTIVETIMELINE_H
#define NEURON_RUNTIME_DEVICE_COLLECTIVETIMELINE_H

#include "runtime/device/Stream.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace neuron::device {

struct CollectiveTimeline {
  static constexpr int kVersion = 2;
  static constexpr const char *kCapsuleName =
      "torchneuron._device.CollectiveTimeline";
  int version = kVersion;
  /// The target the device models (TORCHNEURON_TARGET).
  std::string (*target)() = nullptr;
  /// The calling thread's current neuron device.
  c10::DeviceIndex (*currentDevice)() = nullptr;
  /// placeCollective (KernelProvider.h).
  std::pair<double, double> (*place)(c10::DeviceIndex device,
                                     const std::string &name, int64_t bytes,
                                     const Work &work) = nullptr;
  /// The calling thread's current stream of `device` waits until `timeNs`
  /// (a collective's Work::wait()).
  void (*waitUntil)(c10::DeviceIndex device, double timeNs) = nullptr;
  /// runAtTime (Stream.h): completes a collective's future at its end.
  void (*runAtTime)(c10::DeviceIndex device, double timeNs,
                    const std::function<void()> &fn) = nullptr;
};

/// The device's table (EagerKernels.cpp), one per process.
const CollectiveTimeline &collectiveTimeline();

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_COLLECTIVETIMELINE_H
