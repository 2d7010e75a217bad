//===- Guard.cpp - Device guard and accelerator hooks for neuron ----------===//
//
// The DeviceGuardImpl lets c10 switch devices and streams and manage events
// for PrivateUse1 (torch.accelerator, torch.Stream, torch.Event and the
// autograd engine all go through it); the PrivateUse1 hooks answer
// torch.accelerator's availability, generator and pointer questions.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/Allocator.h"
#include "runtime/device/Device.h"
#include "runtime/device/Generator.h"
#include "runtime/device/Stream.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace neuron::device {

namespace {

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDeviceType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDeviceType, "expected a neuron device, got ", d);
    return {kDeviceType, device::exchangeDevice(d.index())};
  }
  c10::Device getDevice() const override {
    return {kDeviceType, currentDevice()};
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDeviceType, "expected a neuron device, got ", d);
    setCurrentDevice(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < deviceCount())
      setCurrentDevice(d.index());
  }

  c10::Stream getStream(c10::Device d) const override {
    return currentStream(d.index());
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return defaultStream(d.index());
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return newStream(d.index());
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return poolStream(d.index());
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return device::exchangeStream(s);
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device::deviceCount();
  }

  void record(void **event, const c10::Stream &stream,
              const c10::DeviceIndex deviceIndex,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(deviceIndex == -1 || deviceIndex == stream.device_index(),
                "event of neuron:", static_cast<int>(deviceIndex),
                " recorded on a stream of neuron:",
                static_cast<int>(stream.device_index()));
    auto *e = static_cast<Event *>(*event);
    if (!e) {
      e = new Event();
      e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = e;
    }
    recordEvent(*e, stream);
  }
  void block(void *event, const c10::Stream &stream) const override {
    if (event)
      streamWaitEvent(stream, *static_cast<Event *>(event));
  }
  bool queryEvent(void *) const override { return true; }
  void destroyEvent(void *event,
                    const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event *>(event);
  }
  void synchronizeEvent(void *) const override {}
  double elapsedTime(void *start, void *end,
                     const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "elapsed_time needs both events recorded first");
    return elapsedMs(*static_cast<Event *>(start), *static_cast<Event *>(end));
  }

  bool queryStream(const c10::Stream &) const override { return true; }
  void synchronizeStream(const c10::Stream &) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr &,
                             const c10::Stream &) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return deviceCount() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override {
    return device::deviceCount();
  }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    device::setCurrentDevice(d);
  }
  c10::DeviceIndex getCurrentDevice() const override { return currentDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return device::exchangeDevice(d);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    if (d < 0 || d >= device::deviceCount())
      return currentDevice();
    return device::exchangeDevice(d);
  }
  const at::Generator &getDefaultGenerator(c10::DeviceIndex d) const override {
    return defaultGenerator(d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return newGenerator(d);
  }
  at::Device getDeviceFromPtr(void *data) const override {
    c10::DeviceIndex d = allocator().deviceOf(data);
    TORCH_CHECK(d >= 0, "pointer ", data, " is not neuron device memory");
    return {kDeviceType, d};
  }
  // Device memory is host memory: pinning is a no-op, and "pinned" host
  // tensors come from the ordinary CPU allocator.
  bool isPinnedPtr(const void *) const override { return false; }
  at::Allocator *getPinnedMemoryAllocator() const override {
    return c10::GetCPUAllocator();
  }
  void resizePrivateUse1Bytes(const c10::Storage &storage,
                              size_t newsize) const override {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

// Registered when the library loads (torch keeps the pointer for good).
const bool hooksRegistered = [] {
  at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
  return true;
}();

} // namespace

} // namespace neuron::device
