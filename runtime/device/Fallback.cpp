//===- Fallback.cpp - The counted CPU fallback of the neuron device -------===//
//
// Every ATen op without a neuron kernel lands here (a boxed fallback for the
// PrivateUse1 key). It first asks for a device kernel compiled for the call
// (runEagerKernel, KernelProvider.h); only ops without one are counted and
// run on the CPU. Most of those go through ATen's cpu_fallback: neuron inputs are
// copied to the CPU, the CPU kernel runs, and results are copied back; inputs
// the op mutates (in-place, out=) are written back into the neuron tensors.
// Two cases need more:
//
//  - View ops (a return aliases an input without writing it, e.g. unfold,
//    view_as_real) must return views of the neuron tensor, not copies: the
//    CPU kernel runs on a CPU alias of the input's whole storage, and each
//    result becomes a neuron tensor over the same storage with the result's
//    sizes, strides, offset and dtype.
//  - Random ops take the neuron generator: a missing or neuron generator
//    argument is replaced by a CPU generator seeded from the neuron
//    generator's (seed, offset), whose offset then advances by one.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/Device.h"
#include "runtime/device/Generator.h"
#include "runtime/device/KernelProvider.h"
#include "runtime/device/Ops.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace neuron::device {

namespace {

std::mutex countsMutex;
std::unordered_map<std::string, int64_t> counts;
std::unordered_set<std::string> warned;

void recordFallback(const c10::OperatorName &name) {
  std::string key = name.name;
  if (!name.overload_name.empty())
    key += "." + name.overload_name;
  bool first;
  {
    std::lock_guard<std::mutex> lock(countsMutex);
    ++counts[key];
    first = warned.insert(key).second;
  }
  if (first)
    TORCH_WARN("neuron: ", key,
               " runs as a CPU fallback (no device kernel yet); counted in "
               "torchneuron.stats()['ops_fallback'], warned once per op");
}

bool isNeuron(const c10::IValue &v) {
  return v.isTensor() && v.toTensor().defined() &&
         v.toTensor().device().type() == kDeviceType;
}

bool isGeneratorType(const c10::TypePtr &type) {
  if (type->kind() == c10::TypeKind::GeneratorType)
    return true;
  if (auto optional = type->cast<c10::OptionalType>())
    return optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
  return false;
}

// The neuron device the op works on: its first neuron tensor argument's, or
// the current device.
c10::DeviceIndex opDevice(c10::ArrayRef<c10::IValue> args) {
  for (const c10::IValue &v : args) {
    if (isNeuron(v))
      return v.toTensor().device().index();
    if (v.isTensorList())
      for (const at::Tensor &t : v.toTensorList().vec())
        if (t.defined() && t.device().type() == kDeviceType)
          return t.device().index();
    if (v.isDevice() && v.toDevice().type() == kDeviceType &&
        v.toDevice().has_index())
      return v.toDevice().index();
  }
  return currentDevice();
}

void substituteGenerators(const c10::FunctionSchema &schema,
                          torch::jit::Stack *stack) {
  size_t nargs = schema.arguments().size();
  size_t base = stack->size() - nargs;
  for (size_t i = 0; i < nargs; ++i) {
    if (!isGeneratorType(schema.arguments()[i].type()))
      continue;
    c10::IValue &arg = (*stack)[base + i];
    at::Generator gen;
    if (arg.isNone())
      gen = defaultGenerator(
          opDevice(c10::ArrayRef<c10::IValue>(stack->data() + base, nargs)));
    else
      gen = arg.toGenerator();
    if (gen.device().type() != kDeviceType)
      continue;
    uint64_t seed;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      seed = at::check_generator<NeuronGenerator>(gen)->nextSubstreamSeed();
    }
    arg = c10::IValue(at::detail::createCPUGenerator(seed));
  }
}

bool returnsView(const c10::FunctionSchema &schema) {
  for (const c10::Argument &ret : schema.returns())
    if (ret.alias_info() && !ret.alias_info()->isWrite())
      return true;
  return false;
}

// A CPU tensor viewing `t` inside a CPU alias of its whole storage, so the
// storage offsets of the CPU op's results mean the same bytes.
at::Tensor storageAlias(const at::Tensor &t) {
  const c10::Storage &storage = t.storage();
  int64_t itemsize = static_cast<int64_t>(t.element_size());
  int64_t elements = static_cast<int64_t>(storage.nbytes()) / itemsize;
  if (elements == 0 || storage.data() == nullptr)
    return cpuAlias(t);
  at::Tensor whole = at::from_blob(storage.mutable_data(), {elements},
                                   t.options().device(at::kCPU));
  return whole.as_strided(t.sizes(), t.strides(), t.storage_offset());
}

// The neuron tensor `base`'s storage seen as the CPU result `result`; or, if
// the CPU op did not return a view of that storage, a neuron copy.
at::Tensor rewrapView(const at::Tensor &result, const at::Tensor &base) {
  const c10::Storage &storage = base.storage();
  auto *begin = static_cast<const char *>(storage.data());
  auto *data = static_cast<const char *>(result.data_ptr());
  int64_t itemsize = static_cast<int64_t>(result.element_size());
  if (begin == nullptr || data < begin || data >= begin + storage.nbytes() ||
      (data - begin) % itemsize != 0)
    return result.to(base.device());
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(storage), base.key_set(),
      result.dtype());
  impl->set_sizes_and_strides(result.sizes(), result.strides(),
                              (data - begin) / itemsize);
  return at::Tensor(std::move(impl));
}

void viewFallback(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  const c10::FunctionSchema &schema = op.schema();
  size_t nargs = schema.arguments().size();
  size_t base = stack->size() - nargs;
  at::Tensor neuronBase;
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue &arg = (*stack)[base + i];
    TORCH_CHECK(!arg.isTensorList(), "neuron: view op ", schema.name(),
                " with a tensor list argument has no fallback");
    if (!isNeuron(arg))
      continue;
    const at::Tensor t = arg.toTensor();
    if (!neuronBase.defined())
      neuronBase = t;
    TORCH_CHECK(t.storage().is_alias_of(neuronBase.storage()),
                "neuron: view op ", schema.name(),
                " of two tensors has no fallback");
    arg = c10::IValue(storageAlias(t));
  }
  TORCH_CHECK(neuronBase.defined(), "neuron: view op ", schema.name(),
              " without a neuron input");
  op.callBoxed(stack);
  size_t nrets = schema.returns().size();
  for (size_t j = stack->size() - nrets; j < stack->size(); ++j) {
    c10::IValue &ret = (*stack)[j];
    if (ret.isTensor()) {
      ret = c10::IValue(rewrapView(ret.toTensor(), neuronBase));
    } else if (ret.isTensorList()) {
      std::vector<at::Tensor> views;
      for (const at::Tensor &t : ret.toTensorList().vec())
        views.push_back(rewrapView(t, neuronBase));
      ret = c10::IValue(views);
    }
  }
}

// As on CUDA, an op's tensors live on one device: neuron tensors of one core,
// and CPU tensors only as 0-d numbers or as indices (a List[Optional[Tensor]]
// argument, e.g. x[cpu_index]). Without this check the CPU fallback would
// quietly compute with whatever it was given.
void checkSameDevice(const c10::FunctionSchema &schema,
                     c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> first;
  auto check = [&](const at::Tensor &t, size_t i, bool indices) {
    if (!t.defined())
      return;
    c10::Device d = t.device();
    if (d.is_cpu() && (t.dim() == 0 || indices))
      return;
    if (!first) {
      first = d;
      return;
    }
    TORCH_CHECK(d == *first,
                "Expected all tensors to be on the same device, but found at "
                "least two devices, ",
                *first, " and ", d, "! (when checking argument for argument ",
                schema.arguments()[i].name(), " in method ", schema.name(),
                ")");
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue &v = args[i];
    if (v.isTensor()) {
      check(v.toTensor(), i, false);
    } else if (v.isTensorList()) {
      for (const at::Tensor &t : v.toTensorList().vec())
        check(t, i, false);
    } else if (v.isList()) {
      for (const c10::IValue &e : v.toListRef())
        if (e.isTensor())
          check(e.toTensor(), i, true);
    }
  }
}

void neuronFallback(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  const c10::FunctionSchema &schema = op.schema();
  size_t nargs = schema.arguments().size();
  checkSameDevice(schema, c10::ArrayRef<c10::IValue>(
                              stack->data() + stack->size() - nargs, nargs));
  if (runEagerKernel(op, stack))
    return; // a device kernel compiled for this call (EagerKernels.cpp)
  recordFallback(schema.operator_name());
  substituteGenerators(schema, stack);
  if (returnsView(schema))
    viewFallback(op, stack);
  else
    at::native::cpu_fallback(op, stack);
}

} // namespace

std::map<std::string, int64_t> fallbackCounts() {
  std::lock_guard<std::mutex> lock(countsMutex);
  return {counts.begin(), counts.end()};
}

void resetFallbackCounts() {
  std::lock_guard<std::mutex> lock(countsMutex);
  counts.clear();
}

std::vector<std::string> routeCpuKernelsThroughFallback() {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  static std::deque<std::string> names; // the libraries keep pointers to them
  static std::vector<std::string> routed;
  std::lock_guard<std::mutex> lock(mutex);
  if (!libraries.empty())
    return routed;
  auto &dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName &name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        !op->hasKernelForDispatchKey(
            c10::DispatchKey::CompositeExplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
      continue;
    size_t sep = name.name.find("::");
    if (sep == std::string::npos)
      continue;
    std::string ns = name.name.substr(0, sep);
    names.push_back(
        name.name.substr(sep + 2) +
        (name.overload_name.empty() ? "" : "." + name.overload_name));
    libraries.push_back(std::make_unique<torch::Library>(
        torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__,
        __LINE__));
    libraries.back()->impl(
        names.back().c_str(),
        torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
    routed.push_back(name.name + (name.overload_name.empty()
                                      ? ""
                                      : "." + name.overload_name));
  }
  if (libraries.empty())
    libraries.push_back(nullptr); // done, nothing to route
  return routed;
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
}

// Convolutions have no CPU kernel to route: their composite kernels lead a
// backend that is not CPU or CUDA to convolution_overrideable, which throws.
// The fallback takes them whole: a device kernel, or the CPU's convolution.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution",
         torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
  m.impl("convolution_backward",
         torch::CppFunction::makeFromBoxedFunction<&neuronFallback>());
}

} // namespace neuron::device
