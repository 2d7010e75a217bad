//===- Allocator.cpp - Caching allocator over modeled HBM -----------------===//

#include "runtime/device/Allocator.h"

#include "runtime/device/Device.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

namespace neuron::device {

namespace {

using c10::CachingAllocator::StatType;

constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);
constexpr size_t kLarge = static_cast<size_t>(StatType::LARGE_POOL);

void increase(c10::CachingAllocator::StatArray &stat, size_t amount) {
  stat[kAggregate].increase(amount);
  stat[kLarge].increase(amount);
}

void decrease(c10::CachingAllocator::StatArray &stat, size_t amount) {
  stat[kAggregate].decrease(amount);
  stat[kLarge].decrease(amount);
}

std::string formatBytes(size_t bytes) {
  static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  std::ostringstream os;
  if (unit == 0)
    os << bytes << " bytes";
  else
    os << std::fixed << std::setprecision(2) << value << " " << units[unit];
  return os.str();
}

void deleteBlock(void *ptr) { allocator().free(ptr); }

} // namespace

NeuronAllocator &allocator() {
  // Never destroyed: tensors may outlive static destruction at exit.
  static NeuronAllocator *instance = new NeuronAllocator();
  return *instance;
}

NeuronAllocator::DeviceState &NeuronAllocator::state(c10::DeviceIndex device) {
  if (devices_.empty())
    devices_.resize(std::max<int>(deviceCount(), 1));
  DeviceState &s = devices_.at(device);
  if (!s.capacitySet) {
    s.capacity = static_cast<size_t>(config().hbmBytesPerCore);
    s.capacitySet = true;
  }
  return s;
}

c10::DataPtr NeuronAllocator::allocate(size_t nbytes) {
  c10::DeviceIndex device = currentDevice();
  checkDeviceIndex(device);
  c10::Device dev(kDeviceType, device);
  if (nbytes == 0)
    return {nullptr, nullptr, &deleteBlock, dev};
  size_t size = (nbytes + kBlockRounding - 1) / kBlockRounding * kBlockRounding;

  std::lock_guard<std::mutex> lock(mutex_);
  DeviceState &s = state(device);
  void *ptr = nullptr;
  auto cached = s.cache.find(size);
  if (cached != s.cache.end() && !cached->second.empty()) {
    ptr = cached->second.back();
    cached->second.pop_back();
  } else {
    size_t reserved = s.stats.reserved_bytes[kAggregate].current;
    if (reserved + size > s.capacity && !s.cache.empty()) {
      // Give the cache back and try again, as the CUDA allocator does.
      ++s.stats.num_alloc_retries;
      releaseCache(s);
      reserved = s.stats.reserved_bytes[kAggregate].current;
    }
    if (reserved + size <= s.capacity)
      ptr = std::aligned_alloc(kBlockRounding, size);
    if (!ptr) {
      ++s.stats.num_ooms;
      size_t inUse = s.stats.allocated_bytes[kAggregate].current;
      std::ostringstream msg;
      msg << "neuron:" << static_cast<int>(device)
          << " is out of memory: tried to allocate " << formatBytes(nbytes)
          << "; " << formatBytes(inUse) << " in use by tensors, "
          << formatBytes(reserved) << " reserved (in use plus cached)"
          << ", capacity " << formatBytes(s.capacity);
      if (s.capacity != static_cast<size_t>(config().hbmBytesPerCore))
        msg << " (set_per_process_memory_fraction of the core's "
            << formatBytes(config().hbmBytesPerCore) << " HBM share on "
            << config().target << ")";
      else
        msg << " (the " << config().target << " core's HBM share)";
      if (reserved + size <= s.capacity)
        msg << "; the host refused the allocation";
      msg << ". Existing tensors are unchanged.";
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
    }
    increase(s.stats.reserved_bytes, size);
    increase(s.stats.segment, 1);
    ++s.stats.num_device_alloc;
  }
  live_[ptr] = Block{size, nbytes, device};
  increase(s.stats.allocated_bytes, size);
  increase(s.stats.active_bytes, size);
  increase(s.stats.requested_bytes, nbytes);
  increase(s.stats.allocation, 1);
  increase(s.stats.active, 1);
  return {ptr, ptr, &deleteBlock, dev};
}

void NeuronAllocator::free(void *ptr) {
  if (!ptr)
    return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  TORCH_INTERNAL_ASSERT(it != live_.end(), "neuron allocator: freeing ", ptr,
                        ", which it did not allocate");
  Block block = it->second;
  live_.erase(it);
  DeviceState &s = state(block.device);
  decrease(s.stats.allocated_bytes, block.size);
  decrease(s.stats.active_bytes, block.size);
  decrease(s.stats.requested_bytes, block.requested);
  decrease(s.stats.allocation, 1);
  decrease(s.stats.active, 1);
  s.cache[block.size].push_back(ptr);
}

void NeuronAllocator::releaseCache(DeviceState &s) {
  for (auto &[size, blocks] : s.cache) {
    for (void *ptr : blocks) {
      std::free(ptr);
      decrease(s.stats.reserved_bytes, size);
      decrease(s.stats.segment, 1);
      ++s.stats.num_device_free;
    }
  }
  s.cache.clear();
}

c10::DeleterFnPtr NeuronAllocator::raw_deleter() const { return &deleteBlock; }

void NeuronAllocator::copy_data(void *dest, const void *src,
                                std::size_t count) const {
  if (count)
    std::memcpy(dest, src, count);
}

void NeuronAllocator::emptyCache(c10::MempoolId_t) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (c10::DeviceIndex d = 0; d < deviceCount(); ++d)
    releaseCache(state(d));
}

void NeuronAllocator::recordStream(const c10::DataPtr &, c10::Stream) {
  // Streams are host-ordered queues today: a block is free for reuse as soon
  // as its last tensor dies.
}

namespace {
/// Every counter of `stats` kept per pool (allocation, segment, bytes, ...).
template <typename Fn>
void forEachStat(c10::CachingDeviceAllocator::DeviceStats &stats, Fn fn) {
  for (auto *array :
       {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split,
        &stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
        &stats.inactive_split_bytes, &stats.requested_bytes})
    for (auto &stat : *array)
      fn(stat);
}
} // namespace

c10::CachingDeviceAllocator::DeviceStats
NeuronAllocator::getDeviceStats(c10::DeviceIndex device) {
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(mutex_);
  return state(device).stats;
}

void NeuronAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(mutex_);
  auto &stats = state(device).stats;
  forEachStat(stats, [](auto &s) { s.reset_accumulated(); });
  stats.num_alloc_retries = 0;
  stats.num_ooms = 0;
  stats.num_device_alloc = 0;
  stats.num_device_free = 0;
}

void NeuronAllocator::resetPeakStats(c10::DeviceIndex device) {
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(mutex_);
  forEachStat(state(device).stats, [](auto &s) { s.reset_peak(); });
}

std::pair<size_t, size_t>
NeuronAllocator::getMemoryInfo(c10::DeviceIndex device) {
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceState &s = state(device);
  size_t reserved = s.stats.reserved_bytes[kAggregate].current;
  return {s.capacity > reserved ? s.capacity - reserved : 0, s.capacity};
}

size_t NeuronAllocator::capacity(c10::DeviceIndex device) {
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(mutex_);
  return state(device).capacity;
}

void NeuronAllocator::setMemoryFraction(double fraction,
                                        c10::DeviceIndex device) {
  TORCH_CHECK(fraction > 0 && fraction <= 1,
              "set_per_process_memory_fraction: fraction must be in (0, 1], "
              "got ",
              fraction);
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(mutex_);
  state(device).capacity = static_cast<size_t>(
      fraction * static_cast<double>(config().hbmBytesPerCore));
}

c10::DeviceIndex NeuronAllocator::deviceOf(const void *ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The block whose bytes hold ptr (a tensor's data may start inside one).
  auto it = live_.upper_bound(const_cast<void *>(ptr));
  if (it == live_.begin())
    return -1;
  --it;
  auto base = static_cast<const char *>(it->first);
  auto p = static_cast<const char *>(ptr);
  return p < base + it->second.size ? it->second.device : -1;
}

REGISTER_ALLOCATOR(kDeviceType, &allocator());

} // namespace neuron::device
