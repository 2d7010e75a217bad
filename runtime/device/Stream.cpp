//===- Stream.cpp - Streams, events and the modeled timeline --------------===//

#include "runtime/device/Stream.h"

#include "runtime/device/Device.h"
#include "runtime/target/Cost.h"
#include "runtime/target/Target.h"
#include "runtime/timing/TimingModel.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

namespace neuron::device {

namespace {

std::mutex timelineMutex;
// cursors[device][stream id], ns.
std::vector<std::vector<double>> cursors;
// resourceFree[device][resource]: when the resource is next free, ns.
std::vector<std::map<std::string, double>> resourceFree;

std::vector<double> &deviceCursors(c10::DeviceIndex device) {
  if (cursors.empty()) {
    cursors.resize(std::max<int>(deviceCount(), 1), std::vector<double>(1));
    resourceFree.resize(cursors.size());
  }
  return cursors.at(device);
}

double &cursor(c10::Stream stream) {
  auto &streams = deviceCursors(stream.device_index());
  TORCH_CHECK(stream.id() >= 0 &&
                  static_cast<size_t>(stream.id()) < streams.size(),
              "unknown neuron stream ", stream.id(),
              " on neuron:", static_cast<int>(stream.device_index()));
  return streams[stream.id()];
}

thread_local std::vector<c10::StreamId> tlsCurrentStreams;

c10::StreamId &currentStreamId(c10::DeviceIndex device) {
  if (tlsCurrentStreams.empty())
    tlsCurrentStreams.resize(std::max<int>(deviceCount(), 1), 0);
  return tlsCurrentStreams.at(device);
}

c10::Stream makeStream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDeviceType, device), id);
}

} // namespace

c10::Stream defaultStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  return makeStream(device, 0);
}

c10::Stream currentStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  return makeStream(device, currentStreamId(device));
}

c10::Stream exchangeStream(c10::Stream stream) {
  c10::DeviceIndex device = resolveDevice(stream.device_index());
  c10::StreamId &current = currentStreamId(device);
  c10::Stream previous = makeStream(device, current);
  current = stream.id();
  return previous;
}

c10::Stream newStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(timelineMutex);
  // A new stream starts where the device's latest work ends, so that it
  // neither goes back in time nor waits for resources it never shared.
  auto &streams = deviceCursors(device);
  streams.push_back(*std::max_element(streams.begin(), streams.end()));
  return makeStream(device, static_cast<c10::StreamId>(streams.size() - 1));
}

c10::Stream poolStream(c10::DeviceIndex device) {
  constexpr size_t kPoolSize = 32;
  device = resolveDevice(device);
  static std::mutex poolMutex;
  static std::map<c10::DeviceIndex, std::pair<std::vector<c10::Stream>, size_t>>
      pools;
  std::lock_guard<std::mutex> lock(poolMutex);
  auto &[streams, next] = pools[device];
  if (streams.size() < kPoolSize)
    streams.push_back(newStream(device));
  return streams.at(next++ % streams.size());
}

c10::Stream collectiveStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  static std::mutex collectiveMutex;
  static std::map<c10::DeviceIndex, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(collectiveMutex);
  auto it = streams.find(device);
  if (it == streams.end())
    it = streams.emplace(device, newStream(device)).first;
  return it->second;
}

double streamCursorNs(c10::Stream stream) {
  std::lock_guard<std::mutex> lock(timelineMutex);
  return cursor(stream);
}

std::pair<double, double> placeWork(c10::Stream stream, const Work &work) {
  TORCH_CHECK(work.durationNs >= 0, "modeled work cannot take negative time");
  std::lock_guard<std::mutex> lock(timelineMutex);
  double &at = cursor(stream);
  std::map<std::string, double> &free = resourceFree.at(stream.device_index());
  double start = at;
  double end = start + work.durationNs;
  for (const auto &[resource, busy] : work.busyNs) {
    TORCH_CHECK(busy >= 0, "modeled work cannot keep ", resource,
                " busy for negative time");
    double &freeAt = free[resource];
    freeAt = std::max(freeAt, start) + busy;
    end = std::max(end, freeAt);
  }
  at = end;
  return {start, end};
}

/// Elements of `t`, innermost first, that lie contiguously in memory.
static int64_t contiguousRun(const at::Tensor &t) {
  int64_t run = 1;
  for (int64_t d = t.dim(); d-- > 0;) {
    if (t.size(d) == 1)
      continue;
    if (t.stride(d) != run)
      break;
    run *= t.size(d);
  }
  return run;
}

std::optional<PlannedCopy> planCopy(const at::Tensor &src,
                                    const at::Tensor &dst) {
  bool toDevice = dst.device().type() == kDeviceType;
  bool fromDevice = src.device().type() == kDeviceType;
  auto bytes = static_cast<int64_t>(dst.nbytes());
  if (bytes == 0 || !(toDevice || fromDevice))
    return std::nullopt;
  const target::Target &t = target::getTarget(config().target);
  double hbmBytesPerNs = t.hbmChipBytesPerNs / t.value("hbm_sharing_cores");
  auto n = static_cast<double>(bytes);
  PlannedCopy copy{
      currentStream(toDevice ? dst.device().index() : src.device().index()),
      {},
      bytes,
      !fromDevice ? "host_to_device"
      : !toDevice ? "device_to_host"
                  : "device_to_device"};
  Work &work = copy.work;
  if (!(toDevice && fromDevice)) {
    double link = n / t.value("host_link_bytes_per_ns");
    work.busyNs = {{"host_link", link}, {"hbm", n / hbmBytesPerNs}};
    work.durationNs = t.dmaFixedLatencyNs + link;
  } else { // read and write HBM, through the core's DMA engines
    // One descriptor per run both sides have contiguous. A transpose of 2-
    // or 4-byte units (runs of one unit on one side) goes through SBUF
    // instead, as a kernel would move it: a transposing DMA in [D S6], then a
    // contiguous store; element-sized descriptors would cost far more.
    int64_t srcRun = contiguousRun(src), dstRun = contiguousRun(dst);
    int64_t size = dst.element_size();
    const target::CostModel cost(t);
    double rate = static_cast<double>(t.dmaEngines) * t.dmaBytesPerNsPerEngine;
    double dma;
    if (src.element_size() == size &&
        target::CostModel::isDmaTranspose(size, srcRun, dstRun)) {
      dma = n / (static_cast<double>(t.dmaEngines) *
                 cost.dmaTransposeBytesPerNs(false)) +
            n / rate;
    } else {
      int64_t chunk = std::min(srcRun, dstRun);
      double descriptors = std::ceil(static_cast<double>(dst.numel()) /
                                     static_cast<double>(chunk));
      dma = cost.dmaTransferNs(n, static_cast<double>(chunk * size),
                               descriptors) /
            static_cast<double>(t.dmaEngines);
    }
    double hbm = 2 * n / hbmBytesPerNs;
    work.busyNs = {{"dma", dma}, {"hbm", hbm}};
    work.durationNs = t.dmaFixedLatencyNs + std::max(dma, hbm);
  }
  return copy;
}

void recordEvent(Event &event, c10::Stream stream) {
  std::lock_guard<std::mutex> lock(timelineMutex);
  event.timeNs = cursor(stream);
  event.device = stream.device_index();
  event.recorded = true;
}

void streamWaitEvent(c10::Stream stream, const Event &event) {
  if (!event.recorded)
    return;
  std::lock_guard<std::mutex> lock(timelineMutex);
  double &at = cursor(stream);
  at = std::max(at, event.timeNs);
}

void streamWaitUntil(c10::Stream stream, double timeNs) {
  std::lock_guard<std::mutex> lock(timelineMutex);
  double &at = cursor(stream);
  at = std::max(at, timeNs);
}

void runAtTime(c10::DeviceIndex device, double timeNs,
               const std::function<void()> &fn) {
  device = resolveDevice(device);
  // One marker stream per thread and device: nothing else queues on it, and
  // fn may complete futures whose callbacks come back here.
  thread_local std::map<c10::DeviceIndex, c10::Stream> markers;
  auto it = markers.find(device);
  if (it == markers.end())
    it = markers.emplace(device, newStream(device)).first;
  c10::Stream marker = it->second;
  {
    std::lock_guard<std::mutex> lock(timelineMutex);
    cursor(marker) = timeNs;
  }
  c10::Stream previous = exchangeStream(marker);
  try {
    fn();
  } catch (...) {
    exchangeStream(previous);
    throw;
  }
  exchangeStream(previous);
}

double elapsedMs(const Event &start, const Event &end) {
  TORCH_CHECK(start.timing && end.timing,
              "elapsed_time needs both events created with "
              "enable_timing=True");
  TORCH_CHECK(start.recorded && end.recorded,
              "elapsed_time needs both events recorded first");
  TORCH_CHECK(start.device == end.device,
              "elapsed_time needs events of one device, got neuron:",
              static_cast<int>(start.device),
              " and neuron:", static_cast<int>(end.device));
  return (end.timeNs - start.timeNs) / 1e6;
}

} // namespace neuron::device
