//===- Device.h - The neuron devices of this process ------------*- C++ -*-===//
//
// One PyTorch device `neuron:i` per visible NeuronCore of the chosen target
// (TORCHNEURON_TARGET, default trn2). By default every physical core of one
// chip is visible (the target's cores_per_chip: 8 on trn2 and trn3);
// TORCHNEURON_VISIBLE_CORES="0,1" or "0-3" picks cores, and device i is the
// i-th listed core. Each device's memory is host memory standing for the
// core's HBM share (the target's hbm_bytes_per_core).
//
// This file is the configuration every other piece of runtime/device reads;
// it is read once, on first use, and never changes afterwards.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_DEVICE_H
#define NEURON_RUNTIME_DEVICE_DEVICE_H

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace neuron::device {

constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;

struct DeviceConfig {
  std::string target;          ///< target name, e.g. "trn2"
  std::vector<int> coreIds;    ///< physical core of each device
  int64_t hbmBytesPerCore = 0; ///< the target's HBM share of one core
  int coresPerChip = 0;
  /// Why the configuration is empty, if it is (bad environment variable or
  /// target): device_count() is then 0 instead of an exception.
  std::string error;
};

/// The process's configuration (parsed on first call).
const DeviceConfig &config();

/// Parses a TORCHNEURON_VISIBLE_CORES value ("0,2,3", "0-3", "0-1,4").
/// Throws std::invalid_argument for malformed or repeated entries.
std::vector<int> parseVisibleCores(const std::string &spec);

/// Number of neuron devices; 0 if the configuration failed (never throws).
c10::DeviceIndex deviceCount() noexcept;

/// The calling thread's current device (0 until set_device).
c10::DeviceIndex currentDevice();
void setCurrentDevice(c10::DeviceIndex index);
/// Sets the current device and returns the previous one.
c10::DeviceIndex exchangeDevice(c10::DeviceIndex index);

/// Throws c10::Error unless 0 <= index < deviceCount().
void checkDeviceIndex(c10::DeviceIndex index);

/// `index`, or the current device for -1.
c10::DeviceIndex resolveDevice(c10::DeviceIndex index);

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_DEVICE_H
