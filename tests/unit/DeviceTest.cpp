//===- DeviceTest.cpp - The neuron device library without Python ----------===//
//
// The device (runtime/device) as C++ code embedding libtorch sees it: the
// PrivateUse1 registrations, the allocator's capacity and out-of-memory
// error, the modeled timeline of streams and copies, the device-mismatch
// check and the counted CPU fallback. No kernel provider is installed, so
// every compute op takes the fallback.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/Allocator.h"
#include "runtime/device/Device.h"
#include "runtime/device/Generator.h"
#include "runtime/device/Ops.h"
#include "runtime/device/Stream.h"
#include "runtime/target/Target.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

// c10's logging defines glog-style CHECK macros; the tests use Catch2's.
#undef CHECK
#include "CatchCompat.h"

#include <functional>
#include <optional>
#include <string>

using namespace neuron::device;

namespace {

const c10::Device kNeuron(kDeviceType, 0);

void registerName() {
  static bool done = [] {
    c10::register_privateuse1_backend("neuron");
    return true;
  }();
  (void)done;
}

std::string messageOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("the device has one neuron device per core of the target chip",
          "[device]") {
  registerName();
  const DeviceConfig &c = config();
  REQUIRE(c.error.empty());
  const auto &t = neuron::target::getTarget(c.target);
  CHECK(deviceCount() == t.coresPerChip);
  CHECK(c.hbmBytesPerCore == t.hbmBytesPerCore);
  CHECK(parseVisibleCores("0-2,5") == std::vector<int>({0, 1, 2, 5}));
  CHECK(contains(messageOf([] { parseVisibleCores("3-1"); }), "empty range"));
}

TEST_CASE("tensors live in device memory and round-trip exactly", "[device]") {
  registerName();
  at::Tensor cpu = at::arange(12, at::kFloat).reshape({3, 4});
  at::Tensor dev = cpu.to(kNeuron);
  CHECK(dev.device() == kNeuron);
  CHECK(allocator().deviceOf(dev.data_ptr()) == 0);
  CHECK(at::equal(dev.cpu(), cpu));
  CHECK(at::equal(dev.t().contiguous().cpu(), cpu.t().contiguous()));
}

TEST_CASE("an allocation over capacity is an OutOfMemoryError that says why",
          "[device]") {
  registerName();
  at::Tensor kept = at::ones({1024}, at::TensorOptions().device(kNeuron));
  allocator().setMemoryFraction(1e-6, 0); // about 12 KiB of 12 GiB
  std::string message;
  try {
    at::empty({1 << 20}, at::TensorOptions().device(kNeuron));
  } catch (const c10::OutOfMemoryError &e) {
    message = e.what();
  }
  allocator().setMemoryFraction(1.0, 0);
  CHECK(contains(message, "4.00 MiB")); // what was asked for
  CHECK(contains(message, "capacity"));
  CHECK(at::equal(kept.cpu(), at::ones({1024}))); // nothing lost
}

TEST_CASE("tensors of two devices in one op are refused", "[device]") {
  registerName();
  at::Tensor dev = at::ones({4}, at::TensorOptions().device(kNeuron));
  std::string message = messageOf([&] { at::atan2(dev, at::ones({4})); });
  CHECK(contains(message, "Expected all tensors to be on the same device"));
  // A CPU number is fine, and the op without a device kernel is counted.
  resetFallbackCounts();
  at::Tensor r = at::atan2(dev, at::scalar_tensor(1.0));
  CHECK(r.device() == kNeuron);
  CHECK(fallbackCounts().at("aten::atan2.out") == 1);
}

TEST_CASE("streams overlap where the engines allow, copies take link time",
          "[device]") {
  registerName();
  c10::Stream a = newStream(0), b = newStream(0);
  double start = streamCursorNs(a);
  CHECK(streamCursorNs(b) == start);
  auto [s1, e1] = placeWork(a, {10e3, {{"tensor", 8e3}}});
  auto [s2, e2] = placeWork(b, {10e3, {{"tensor", 8e3}}});
  CHECK(s1 == start);
  CHECK(e1 - start == Approx(10e3));
  CHECK(e2 - start == Approx(16e3)); // waited for TensorE
  c10::Stream c = newStream(0);
  CHECK(streamCursorNs(c) == Approx(start + 16e3)); // after the latest work

  at::Tensor host = at::ones({256, 256});
  std::optional<PlannedCopy> copy = planCopy(host, host.to(kNeuron));
  REQUIRE(copy);
  const auto &t = neuron::target::getTarget(config().target);
  CHECK(std::string(copy->kind) == "host_to_device");
  CHECK(copy->bytes == 256 * 256 * 4);
  CHECK(copy->work.durationNs ==
        Approx(t.dmaFixedLatencyNs +
               copy->bytes / t.value("host_link_bytes_per_ns")));
  at::Tensor dev = host.to(kNeuron);
  std::optional<PlannedCopy> onChip = planCopy(dev, dev);
  REQUIRE(onChip);
  CHECK(std::string(onChip->kind) == "device_to_device");
  CHECK(onChip->work.durationNs < copy->work.durationNs);
  CHECK_FALSE(planCopy(host, host)); // CPU to CPU: not the device's
}

TEST_CASE("events measure modeled time", "[device]") {
  registerName();
  c10::Stream s = newStream(0);
  Event begin, end;
  begin.timing = end.timing = true;
  recordEvent(begin, s);
  placeWork(s, {2.5e6, {}});
  recordEvent(end, s);
  CHECK(elapsedMs(begin, end) == Approx(2.5));
  Event untimed;
  recordEvent(untimed, s);
  CHECK(contains(messageOf([&] { elapsedMs(begin, untimed); }),
                 "enable_timing"));
}

TEST_CASE("the generator's substream seeds are reproducible", "[device]") {
  CHECK(philoxSubstreamSeed(1, 0) == philoxSubstreamSeed(1, 0));
  CHECK(philoxSubstreamSeed(1, 0) != philoxSubstreamSeed(1, 1));
  CHECK(philoxSubstreamSeed(1, 0) != philoxSubstreamSeed(2, 0));
}
