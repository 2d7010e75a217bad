//===- DeviceModule.cpp - torchneuron._device: the neuron PyTorch device --===//
//
// Loading this module registers the `neuron` device with PyTorch (allocator,
// device guard, hooks, generator, eager kernels and CPU fallback: static
// registrations in runtime/device). The functions below are the private API
// of torchneuron.device (torch.neuron). Links libtorch, never MLIR; it does
// not use libtorch_python either: tensors never cross this boundary.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/Allocator.h"
#include "runtime/device/Device.h"
#include "runtime/device/Generator.h"
#include "runtime/device/Ops.h"
#include "runtime/device/Stream.h"

#include <ATen/core/Generator.h>
#include <c10/core/DeviceGuard.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

namespace py = pybind11;
using namespace neuron::device;

namespace {

NeuronGenerator *generatorOf(const at::Generator &gen) {
  return at::check_generator<NeuronGenerator>(gen);
}

c10::Stream streamOf(int device, int64_t streamId) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(kDeviceType, resolveDevice(device)), streamId);
}

} // namespace

PYBIND11_MODULE(_device, m) {
  m.doc() = "The neuron PyTorch device (PrivateUse1); see torchneuron.device";
  routeCpuKernelsThroughFallback();

  // Configuration.
  m.def("_device_count", [] { return static_cast<int>(deviceCount()); });
  m.def("_config_error", [] { return config().error; });
  m.def("_target", [] { return config().target; });
  m.def("_visible_cores", [] { return config().coreIds; });
  m.def("_hbm_bytes_per_core", [] { return config().hbmBytesPerCore; });
  m.def("_parse_visible_cores", &parseVisibleCores);
  m.def("_current_device", [] { return static_cast<int>(currentDevice()); });
  m.def("_set_device", [](int d) { setCurrentDevice(d); });
  m.def("_exchange_device", [](int d) {
    if (d < 0)
      return static_cast<int>(currentDevice());
    return static_cast<int>(exchangeDevice(d));
  });

  // Memory.
  m.def("_capacity", [](int d) { return allocator().capacity(d); });
  m.def("_set_memory_fraction", [](double fraction, int d) {
    allocator().setMemoryFraction(fraction, d);
  });

  // Eager fallback counters.
  m.def("_fallback_counts", &fallbackCounts);
  m.def("_reset_fallback_counts", &resetFallbackCounts);
  m.def("_cpu_numerics_ops", &routeCpuKernelsThroughFallback);

  // Generators (the default generator of each device).
  m.def("_manual_seed", [](int d, uint64_t seed) {
    at::Generator gen = defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    generatorOf(gen)->set_current_seed(seed);
  });
  m.def("_seed", [](int d) {
    at::Generator gen = defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return generatorOf(gen)->seed();
  });
  m.def("_initial_seed",
        [](int d) { return generatorOf(defaultGenerator(d))->current_seed(); });
  m.def("_get_rng_state", [](int d) {
    at::Generator gen = defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    uint64_t words[2] = {generatorOf(gen)->current_seed(),
                         generatorOf(gen)->get_offset()};
    return py::bytes(reinterpret_cast<const char *>(words), sizeof(words));
  });
  m.def("_set_rng_state", [](int d, const py::bytes &state) {
    std::string bytes = state;
    if (bytes.size() != 16)
      throw py::value_error("a neuron RNG state is 16 bytes (seed, offset)");
    uint64_t words[2];
    std::memcpy(words, bytes.data(), 16);
    at::Generator gen = defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    generatorOf(gen)->set_current_seed(words[0]);
    generatorOf(gen)->set_offset(words[1]);
  });

  // The modeled timeline.
  m.def(
      "_stream_cursor_ns",
      [](int d, int64_t stream) { return streamCursorNs(streamOf(d, stream)); },
      py::arg("device"), py::arg("stream"));
  m.def(
      "_place_modeled_work",
      [](double ns, int d, int64_t stream) {
        return placeWork(streamOf(d, stream), ns);
      },
      py::arg("ns"), py::arg("device"), py::arg("stream"));
}
