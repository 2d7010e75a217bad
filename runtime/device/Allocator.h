//===- Allocator.h - Caching allocator over modeled HBM ---------*- C++ -*-===//
//
// Device memory is host memory standing for each core's HBM. The allocator
// gives every device a capacity (the target's hbm_bytes_per_core, optionally
// scaled by setMemoryFraction), keeps freed blocks in a per-device cache for
// reuse by a request of the same rounded size, and refuses a request that
// would take the reserved bytes (live plus cached) past the capacity, after
// first returning the cache to the host: c10::OutOfMemoryError
// (torch.OutOfMemoryError) naming the request, the bytes in use and the
// capacity. A refused request changes nothing, so every tensor stays intact.
//
// Statistics follow the CUDA caching allocator's names (allocated_bytes,
// reserved_bytes, active_bytes, requested_bytes, allocation, segment,
// num_ooms, num_alloc_retries...), so torch.accelerator.memory_stats reads
// them unchanged. Pools are not split: every block counts as LARGE_POOL.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_ALLOCATOR_H
#define NEURON_RUNTIME_DEVICE_ALLOCATOR_H

#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace neuron::device {

/// Requests are rounded up to this many bytes (and aligned to it).
constexpr size_t kBlockRounding = 512;

class NeuronAllocator final : public c10::DeviceAllocator {
public:
  NeuronAllocator() = default;

  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void *dest, const void *src, std::size_t count) const final;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempoolId = {0, 0}) override;
  void recordStream(const c10::DataPtr &ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats
  getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  /// (free, total): capacity minus reserved bytes, and the capacity.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  /// The device's capacity in bytes.
  size_t capacity(c10::DeviceIndex device);
  /// Limits the device to fraction * its HBM share (0 < fraction <= 1).
  void setMemoryFraction(double fraction, c10::DeviceIndex device);
  /// The device whose live block holds `ptr`, or -1.
  c10::DeviceIndex deviceOf(const void *ptr);

  /// Returns a block to the cache (the DataPtr deleter's work).
  void free(void *ptr);

private:
  struct Block {
    size_t size = 0;      // rounded
    size_t requested = 0; // as asked
    c10::DeviceIndex device = 0;
  };
  struct DeviceState {
    size_t capacity = 0;
    bool capacitySet = false;
    c10::CachingDeviceAllocator::DeviceStats stats;
    std::unordered_map<size_t, std::vector<void *>> cache; // size -> blocks
  };

  DeviceState &state(c10::DeviceIndex device); // caller holds mutex_
  void releaseCache(DeviceState &s);           // caller holds mutex_

  std::mutex mutex_;
  std::vector<DeviceState> devices_;
  std::map<void *, Block> live_; // by address, for deviceOf
};

/// The process's allocator (also registered for PrivateUse1).
NeuronAllocator &allocator();

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_ALLOCATOR_H
