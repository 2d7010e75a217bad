//===- DeviceModule.cpp - torchneuron._device: the neuron PyTorch device --===//
//
// Loading this module registers the `neuron` device with PyTorch (allocator,
// device guard, hooks, generator, eager kernels and CPU fallback: static
// registrations in runtime/device). The functions below are the private API
// of torchneuron.device (torch.neuron). Links libtorch, never MLIR; it does
// not use libtorch_python either: tensors never cross this boundary.
//
//===----------------------------------------------------------------------===//

#include "python/bindings/TorchErrors.h"
#include "runtime/device/Allocator.h"
#include "runtime/device/CollectiveTimeline.h"
#include "runtime/device/Device.h"
#include "runtime/device/Generator.h"
#include "runtime/device/KernelProvider.h"
#include "runtime/device/Ops.h"
#include "runtime/device/Stream.h"
#include "runtime/target/Target.h"

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

const char *dtypeName(at::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return "float32";
  case at::kBFloat16:
    return "bfloat16";
  case at::kHalf:
    return "float16";
  case at::kDouble:
    return "float64";
  case at::kInt:
    return "int32";
  case at::kLong:
    return "int64";
  case at::kShort:
    return "int16";
  case at::kChar:
    return "int8";
  case at::kByte:
    return "uint8";
  case at::kBool:
    return "bool";
  default:
    return "unsupported";
  }
}

/// An argument as the Python provider sees it: a tensor is ("tensor", dtype,
/// sizes, strides, is_cpu_scalar), with a CPU 0-d float64 tensor (a wrapped
/// Python number) given as float32, the way the kernel receives it; a tensor
/// list a list of those (None for the absent ones of a Tensor?[]); a
/// generator ("generator",).
py::object describe(const c10::IValue &v) {
  if (v.isTensor()) {
    const at::Tensor &t = v.toTensor();
    if (!t.defined())
      return py::none();
    bool cpuScalar = t.device().is_cpu();
    at::ScalarType dtype = t.scalar_type();
    if (cpuScalar && dtype == at::kDouble)
      dtype = at::kFloat;
    return py::make_tuple("tensor", dtypeName(dtype), t.sizes().vec(),
                          t.strides().vec(), cpuScalar);
  }
  if (v.isTensorList()) {
    py::list tensors;
    for (const at::Tensor &t : v.toTensorList().vec())
      tensors.append(describe(c10::IValue(t)));
    return tensors;
  }
  if (v.isGenerator())
    return py::make_tuple("generator");
  if (v.isNone())
    return py::none();
  if (v.isBool())
    return py::bool_(v.toBool());
  if (v.isInt())
    return py::int_(v.toInt());
  if (v.isDouble())
    return py::float_(v.toDouble());
  if (v.isString())
    return py::str(v.toStringRef());
  if (v.isIntList())
    return py::cast(v.toIntList().vec());
  if (v.isDoubleList())
    return py::cast(v.toDoubleList().vec());
  if (v.isBoolList())
    return py::cast(v.toBoolList().vec());
  // Tensor?[] (after the typed lists, which are lists too): None or a tensor
  // each.
  if (v.isList()) {
    py::list elements;
    for (const c10::IValue &e : v.toListRef())
      elements.append(describe(e));
    return elements;
  }
  throw std::invalid_argument("no Python description for this argument");
}

/// The compiler side, in Python (torchneuron.eager): provider(op, overload,
/// args, target) -> None or a torchneuron.eager.Provided (the fields of
/// ProvidedKernel); recorder(id) after each run and transferRecorder(name,
/// resource, bytes, device_ns) after each copy or collective while
/// profiling.
class PythonKernelProvider : public KernelProvider {
public:
  PythonKernelProvider(py::function provider, py::function recorder,
                       py::function transferRecorder)
      : provider(provider.release().ptr()), recorder(recorder.release().ptr()),
        transferRecorder(transferRecorder.release().ptr()) {}
  // The functions are never released: the provider can outlive the
  // interpreter (a static shared_ptr destroyed at exit).
  ~PythonKernelProvider() override = default;

  std::optional<ProvidedKernel> kernelFor(const c10::OperatorHandle &op,
                                          c10::ArrayRef<c10::IValue> args,
                                          const std::string &target) override {
    if (!Py_IsInitialized())
      return std::nullopt;
    py::gil_scoped_acquire gil;
    py::list described;
    for (const c10::IValue &v : args)
      described.append(describe(v));
    const c10::OperatorName &name = op.schema().operator_name();
    py::object answer = py::reinterpret_borrow<py::function>(provider)(
        name.name, name.overload_name, described, target);
    if (answer.is_none())
      return std::nullopt;
    ProvidedKernel k;
    k.name = answer.attr("name").cast<std::string>();
    k.program = answer.attr("program").cast<std::string>();
    k.work.durationNs = answer.attr("device_ns").cast<double>();
    k.work.busyNs =
        answer.attr("engine_busy_ns").cast<std::map<std::string, double>>();
    for (auto [argument, element] :
         answer.attr("inputs").cast<std::vector<std::pair<int, int>>>())
      k.inputs.push_back({argument, element});
    k.outputs = answer.attr("outputs").cast<std::vector<int>>();
    k.outputElements =
        answer.attr("output_elements").cast<std::vector<int>>();
    for (std::optional<int> r :
         answer.attr("returns").cast<std::vector<std::optional<int>>>())
      k.returns.push_back(r.value_or(ProvidedKernel::kUndefinedReturn));
    k.id = answer.attr("id").cast<int64_t>();
    k.scalarArgs = answer.attr("scalar_args").cast<std::vector<int>>();
    return k;
  }

  void recordRun(int64_t id, double startNs) override {
    if (!Py_IsInitialized())
      return;
    py::gil_scoped_acquire gil;
    py::reinterpret_borrow<py::function>(recorder)(id, startNs);
  }

  void recordTransfer(const std::string &name, const std::string &resource,
                      int64_t bytes, double deviceNs, double startNs) override {
    if (!Py_IsInitialized())
      return;
    py::gil_scoped_acquire gil;
    py::reinterpret_borrow<py::function>(transferRecorder)(
        name, resource, bytes, deviceNs, startNs);
  }

private:
  PyObject *provider;
  PyObject *recorder;
  PyObject *transferRecorder;
};

} // namespace

PYBIND11_MODULE(_device, m) {
  neuron::bindings::registerTorchErrors();
  m.doc() = "The neuron PyTorch device (PrivateUse1); see torchneuron.device";
  routeCpuKernelsThroughFallback();

  // Configuration.
  m.def("_device_count", [] { return static_cast<int>(deviceCount()); });
  m.def("_config_error", [] { return config().error; });
  m.def("_target", [] { return config().target; });
  m.def("_device_name",
        [] { return neuron::target::getTarget(config().target).deviceName; });
  m.def("_neuron_core_version", [] {
    return static_cast<int>(
        neuron::target::getTarget(config().target).value("neuron_core_version"));
  });
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

  // Eager ops as device kernels (KernelProvider.h).
  m.def("_set_kernel_provider",
        [](py::object provider, py::object recorder,
           py::object transferRecorder) {
          if (provider.is_none()) {
            setKernelProvider(nullptr);
            return;
          }
          setKernelProvider(std::make_shared<PythonKernelProvider>(
              provider.cast<py::function>(), recorder.cast<py::function>(),
              transferRecorder.cast<py::function>()));
        });
  m.def("_set_eager_kernels", &setEagerKernelsEnabled);
  m.def("_eager_kernels_enabled", &eagerKernelsEnabled);
  m.def("_set_eager_profiling", &setEagerProfiling);
  m.def("_clear_eager_kernel_cache", &clearEagerKernelCache);
  m.def("_eager_kernel_counts", &eagerKernelCounts);
  m.def("_reset_eager_kernel_counts", &resetEagerKernelCounts);

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
  m.def("_collective_timeline", [] {
    // Not owned: the table is static and outlives every module.
    return py::capsule(const_cast<CollectiveTimeline *>(&collectiveTimeline()),
                       CollectiveTimeline::kCapsuleName);
  });
  m.def(
      "_stream_cursor_ns",
      [](int d, int64_t stream) { return streamCursorNs(streamOf(d, stream)); },
      py::arg("device"), py::arg("stream"));
  m.def(
      "_place_modeled_work",
      [](double ns, int d, int64_t stream,
         std::map<std::string, double> busy) {
        return placeWork(streamOf(d, stream), {ns, std::move(busy)});
      },
      py::arg("ns"), py::arg("device"), py::arg("stream"), py::arg("busy"));
}
