//===- EagerKernels.cpp - Eager ops as cached device kernels --------------===//
//
// The boxed fallback (Fallback.cpp) calls runEagerKernel first. A call is
// eligible when its tensors are neuron tensors of one device (or CPU 0-d
// tensors, e.g. wrapped Python numbers) of dtypes the engine model has, it
// takes no generator or tensor list, and it returns no view. Its key is the
// operator and, per argument, the tensor metadata or the non-tensor value;
// the first call of a key asks the provider, later calls find the loaded
// program in the cache. A run makes its inputs contiguous, allocates the
// outputs (or writes into out= / in-place arguments: directly when they are
// contiguous, of the right dtype and share no storage with an input, else
// through a temporary and a copy), runs the executor and places the kernel's
// modeled time on the current stream.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/KernelProvider.h"

#include "runtime/device/CollectiveTimeline.h"
#include "runtime/device/Device.h"
#include "runtime/device/Generator.h"
#include "runtime/device/Profiler.h"
#include "runtime/device/Stream.h"
#include "runtime/exec/Executor.h"
#include "runtime/program/Error.h"
#include "runtime/program/Program.h"
#include "runtime/target/Target.h"

#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace neuron::device {

namespace {

std::optional<runtime::DType> programDType(at::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return runtime::DType::F32;
  case at::kBFloat16:
    return runtime::DType::BF16;
  case at::kHalf:
    return runtime::DType::F16;
  case at::kInt:
    return runtime::DType::I32;
  case at::kLong:
    return runtime::DType::I64;
  case at::kChar:
    return runtime::DType::I8;
  case at::kByte:
    return runtime::DType::U8;
  case at::kBool:
    return runtime::DType::Bool;
  case at::kFloat8_e4m3fn:
    return runtime::DType::F8E4M3FN;
  case at::kFloat8_e5m2:
    return runtime::DType::F8E5M2;
  default:
    return std::nullopt;
  }
}

at::ScalarType torchDType(runtime::DType t) {
  switch (t) {
  case runtime::DType::F32:
    return at::kFloat;
  case runtime::DType::BF16:
    return at::kBFloat16;
  case runtime::DType::F16:
    return at::kHalf;
  case runtime::DType::I32:
    return at::kInt;
  case runtime::DType::I64:
    return at::kLong;
  case runtime::DType::I8:
    return at::kChar;
  case runtime::DType::U8:
    return at::kByte;
  case runtime::DType::Bool:
    return at::kBool;
  case runtime::DType::F8E4M3FN:
    return at::kFloat8_e4m3fn;
  case runtime::DType::F8E5M2:
    return at::kFloat8_e5m2;
  }
  return at::kFloat;
}

struct Spec {
  at::ScalarType dtype;
  runtime::DType programDType;
  std::vector<int64_t> shape;
};

/// A loaded kernel (or, with no executor, the provider's "no kernel").
struct Entry {
  ProvidedKernel provided;
  std::optional<runtime::Program> program;
  std::unique_ptr<runtime::Executor> executor;
  std::vector<Spec> inputs, outputs;
  std::mutex runMutex; // an executor's scratch memory is its own
};

std::shared_mutex cacheMutex;
std::unordered_map<std::string, std::shared_ptr<Entry>> cache;
// Per operator: which arguments are runtime scalars (ProvidedKernel::scalarArgs).
std::unordered_map<const c10::FunctionSchema *, std::vector<char>> runtimeScalars;
std::mutex providerMutex; // one provider call at a time
std::shared_ptr<KernelProvider> provider;
std::atomic<bool> enabled{[] {
  const char *env = std::getenv("TORCHNEURON_EAGER_KERNELS");
  return !(env && std::strcmp(env, "0") == 0);
}()};
std::atomic<bool> profiling{false};
std::atomic<int64_t> runs{0}, compiles{0}, rejected{0};
thread_local bool inProvider = false;

template <typename T> void append(std::string &key, const T &value) {
  key.append(reinterpret_cast<const char *>(&value), sizeof(T));
}

void appendInts(std::string &key, c10::IntArrayRef values) {
  append(key, static_cast<uint32_t>(values.size()));
  key.append(reinterpret_cast<const char *>(values.data()),
             values.size() * sizeof(int64_t));
}

/// Appends a tensor argument's part of a call key; false when the tensor
/// cannot be a kernel operand (`device`, `anyNeuron` as in callKey).
bool appendTensor(std::string &key, const at::Tensor &t,
                  c10::DeviceIndex &device, bool &anyNeuron) {
  if (!t.defined()) {
    key.push_back('u');
    return true;
  }
  if (!programDType(t.scalar_type()) &&
      !(t.scalar_type() == at::kDouble && t.device().is_cpu()))
    return false;
  if (t.device().type() == kDeviceType) {
    if (anyNeuron && t.device().index() != device)
      return false; // the fallback reports the mismatch
    anyNeuron = true;
    device = t.device().index();
    key.push_back('t');
    append(key, t.scalar_type());
    appendInts(key, t.sizes());
    appendInts(key, t.strides());
    return true;
  }
  if (t.device().is_cpu() && t.dim() == 0) {
    key.push_back('c');
    append(key, t.scalar_type());
    return true;
  }
  return false;
}

/// The call's key, or nullopt when it cannot run as a device kernel.
/// `device` is the neuron device of its tensors.
std::optional<std::string> callKey(const c10::OperatorHandle &op,
                                   c10::ArrayRef<c10::IValue> args,
                                   const std::vector<char> &scalars,
                                   c10::DeviceIndex &device) {
  std::string key;
  key.reserve(160);
  append(key, &op.schema());
  bool anyNeuron = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue &v = args[i];
    if (i < scalars.size() && scalars[i] && v.isDouble()) {
      key.push_back('S');
    } else if (v.isTensor()) {
      if (!appendTensor(key, v.toTensor(), device, anyNeuron))
        return std::nullopt;
    } else if (v.isTensorList()) {
      key.push_back('L');
      for (const at::Tensor &t : v.toTensorList().vec())
        if (!appendTensor(key, t, device, anyNeuron))
          return std::nullopt;
      key.push_back(';');
    } else if (v.isGenerator()) {
      // Its numbers are drawn on each run (KernelInput::kSeed): its kind is
      // the key. The CPU fallback takes CPU generators.
      if (v.toGenerator().device().type() != kDeviceType)
        return std::nullopt;
      key.push_back('G');
    } else if (v.isNone()) {
      key.push_back('N');
    } else if (v.isBool()) {
      key.push_back('b');
      append(key, v.toBool());
    } else if (v.isInt()) {
      key.push_back('i');
      append(key, v.toInt());
    } else if (v.isDouble()) {
      key.push_back('d');
      append(key, v.toDouble());
    } else if (v.isString()) {
      key.push_back('s');
      const std::string &s = v.toStringRef();
      append(key, static_cast<uint32_t>(s.size()));
      key.append(s);
    } else if (v.isIntList()) {
      key.push_back('I');
      appendInts(key, v.toIntList().vec());
    } else if (v.isDoubleList()) {
      key.push_back('D');
      for (double d : v.toDoubleList().vec())
        append(key, d);
      key.push_back(';');
    } else if (v.isBoolList()) {
      key.push_back('B');
      for (bool b : v.toBoolList().vec())
        append(key, b);
      key.push_back(';');
    } else if (v.isList()) {
      // Tensor?[] (advanced indexing's indices; after the typed lists,
      // which are lists too): None or a tensor each.
      key.push_back('O');
      for (const c10::IValue &e : v.toListRef()) {
        if (e.isNone())
          key.push_back('N');
        else if (!e.isTensor() ||
                 !appendTensor(key, e.toTensor(), device, anyNeuron))
          return std::nullopt;
      }
      key.push_back(';');
    } else {
      return std::nullopt; // devices, ...
    }
  }
  if (!anyNeuron)
    return std::nullopt;
  return key;
}

bool returnsView(const c10::FunctionSchema &schema) {
  for (const c10::Argument &ret : schema.returns())
    if (ret.alias_info() && !ret.alias_info()->isWrite())
      return true;
  return false;
}

std::shared_ptr<Entry> load(ProvidedKernel provided, const std::string &target) {
  auto entry = std::make_shared<Entry>();
  entry->program = runtime::Program::parse(provided.program);
  entry->executor = std::make_unique<runtime::Executor>(
      *entry->program, target::getTarget(target));
  auto specs = [&](const std::vector<int64_t> &ids) {
    std::vector<Spec> out;
    for (int64_t id : ids) {
      const runtime::Buffer *buffer = entry->program->findBuffer(id);
      out.push_back({torchDType(buffer->dtype), buffer->dtype, buffer->shape});
    }
    return out;
  };
  entry->inputs = specs(entry->program->inputs);
  entry->outputs = specs(entry->program->outputs);
  TORCH_CHECK(entry->inputs.size() == provided.inputs.size() &&
                  entry->outputs.size() == provided.outputs.size(),
              "neuron: the kernel provider's program for ", provided.name,
              " has ", entry->inputs.size(), " inputs and ",
              entry->outputs.size(), " outputs, its answer names ",
              provided.inputs.size(), " and ", provided.outputs.size());
  entry->provided = std::move(provided);
  return entry;
}

std::vector<char> scalarsOf(const c10::OperatorHandle &op) {
  std::shared_lock<std::shared_mutex> lock(cacheMutex);
  auto it = runtimeScalars.find(&op.schema());
  return it == runtimeScalars.end() ? std::vector<char>() : it->second;
}

std::shared_ptr<Entry> lookup(const c10::OperatorHandle &op,
                              c10::ArrayRef<c10::IValue> args,
                              std::string key) {
  {
    std::shared_lock<std::shared_mutex> lock(cacheMutex);
    auto it = cache.find(key);
    if (it != cache.end())
      return it->second;
  }
  std::lock_guard<std::mutex> compileLock(providerMutex);
  {
    std::shared_lock<std::shared_mutex> lock(cacheMutex);
    auto it = cache.find(key);
    if (it != cache.end())
      return it->second;
  }
  std::shared_ptr<KernelProvider> p = provider;
  if (!p)
    return nullptr;
  std::shared_ptr<Entry> entry = std::make_shared<Entry>(); // "no kernel"
  inProvider = true;
  try {
    const std::string &target = config().target;
    std::optional<ProvidedKernel> provided = p->kernelFor(op, args, target);
    inProvider = false;
    if (provided) {
      entry = load(std::move(*provided), target);
      ++compiles;
    } else {
      ++rejected;
    }
  } catch (...) {
    inProvider = false;
    throw;
  }
  std::unique_lock<std::shared_mutex> lock(cacheMutex);
  if (entry->executor && !entry->provided.scalarArgs.empty()) {
    std::vector<char> &marks = runtimeScalars[&op.schema()];
    marks.resize(args.size(), 0);
    for (int i : entry->provided.scalarArgs)
      marks.at(i) = 1;
    c10::DeviceIndex device = 0;
    if (std::optional<std::string> general = callKey(op, args, marks, device))
      key = std::move(*general);
  }
  cache.emplace(key, entry);
  return entry;
}

/// The seed of one run of a random op's kernel: two int32 words drawn from
/// its generator argument, or from the device's default generator.
at::Tensor seedWords(c10::ArrayRef<c10::IValue> args,
                     c10::DeviceIndex device) {
  at::Generator gen;
  for (const c10::IValue &v : args)
    if (v.isGenerator())
      gen = v.toGenerator();
  if (!gen.defined())
    gen = defaultGenerator(device);
  uint64_t seed;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    seed = at::check_generator<NeuronGenerator>(gen)->nextSubstreamSeed();
  }
  at::Tensor words = at::empty({2}, at::TensorOptions().dtype(at::kInt));
  std::memcpy(words.data_ptr(), &seed, sizeof(seed));
  return words;
}

bool overlapsAny(const at::Tensor &t, const std::vector<at::Tensor> &others) {
  for (const at::Tensor &o : others)
    if (t.storage().is_alias_of(o.storage()))
      return true;
  return false;
}

} // namespace

void setKernelProvider(std::shared_ptr<KernelProvider> p) {
  std::lock_guard<std::mutex> compileLock(providerMutex);
  provider = std::move(p);
  std::unique_lock<std::shared_mutex> lock(cacheMutex);
  cache.clear();
  runtimeScalars.clear();
}

void setEagerKernelsEnabled(bool on) { enabled = on; }
bool eagerKernelsEnabled() { return enabled; }
void setEagerProfiling(bool on) { profiling = on; }

void placeCopy(const std::optional<PlannedCopy> &copy) {
  if (!copy)
    return;
  double start = placeWork(copy->stream, copy->work).first;
  if (profiling)
    if (std::shared_ptr<KernelProvider> p = provider)
      p->recordTransfer(std::string("copy_") + copy->kind,
                        std::string(copy->kind) == "device_to_device"
                            ? "dma"
                            : "host_link",
                        copy->bytes, copy->work.durationNs, start);
}

std::pair<double, double> placeCollective(c10::DeviceIndex device,
                                          const std::string &name,
                                          int64_t bytes, const Work &work) {
  // The collective queues after what its stream issued before it.
  Event issued;
  recordEvent(issued, currentStream(device));
  c10::Stream stream = collectiveStream(device);
  streamWaitEvent(stream, issued);
  ProfiledKernelRun profiled(name, stream, work.durationNs, bytes);
  std::pair<double, double> span = placeWork(stream, work);
  if (profiling)
    if (std::shared_ptr<KernelProvider> p = provider)
      p->recordTransfer(name, "neuronlink", bytes, work.durationNs,
                        span.first);
  return span;
}

const CollectiveTimeline &collectiveTimeline() {
  static const CollectiveTimeline table = [] {
    CollectiveTimeline t;
    t.target = [] { return config().target; };
    t.currentDevice = [] { return currentDevice(); };
    t.place = &placeCollective;
    t.waitUntil = [](c10::DeviceIndex device, double timeNs) {
      streamWaitUntil(currentStream(device), timeNs);
    };
    t.runAtTime = &runAtTime;
    return t;
  }();
  return table;
}

void clearEagerKernelCache() {
  std::lock_guard<std::mutex> compileLock(providerMutex);
  std::unique_lock<std::shared_mutex> lock(cacheMutex);
  cache.clear();
  runtimeScalars.clear();
}

std::map<std::string, int64_t> eagerKernelCounts() {
  std::shared_lock<std::shared_mutex> lock(cacheMutex);
  int64_t cached = 0;
  for (auto &[key, entry] : cache)
    cached += entry->executor != nullptr;
  return {{"runs", runs.load()},
          {"compiles", compiles.load()},
          {"rejected", rejected.load()},
          {"cached_kernels", cached}};
}

void resetEagerKernelCounts() {
  runs = 0;
  compiles = 0;
  rejected = 0;
}

bool runEagerKernel(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  if (!enabled || inProvider || !provider)
    return false;
  const c10::FunctionSchema &schema = op.schema();
  if (schema.is_vararg() || returnsView(schema))
    return false;
  size_t nargs = schema.arguments().size();
  size_t base = stack->size() - nargs;
  c10::ArrayRef<c10::IValue> args(stack->data() + base, nargs);
  c10::DeviceIndex device = 0;
  std::optional<std::string> key =
      callKey(op, args, scalarsOf(op), device);
  if (!key)
    return false;
  std::shared_ptr<Entry> entry = lookup(op, args, std::move(*key));
  if (!entry || !entry->executor)
    return false;
  const ProvidedKernel &k = entry->provided;

  c10::DeviceGuard guard(c10::Device(kDeviceType, device));
  ProfiledKernelRun profiled(k.name, currentStream(device), k.work.durationNs);
  std::vector<at::Tensor> inputs;
  std::vector<runtime::HostTensor> in, out;
  inputs.reserve(k.inputs.size());
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    const KernelInput &source = k.inputs[i];
    if (source.argument == KernelInput::kSeed) {
      at::Tensor t = seedWords(args, device);
      in.push_back({t.data_ptr(), entry->inputs[i].programDType,
                    entry->inputs[i].shape});
      inputs.push_back(std::move(t));
      continue;
    }
    const c10::IValue &whole = args[source.argument];
    const c10::IValue arg =
        source.element < 0 ? whole
        : whole.isTensorList()
            ? c10::IValue(whole.toTensorList().get(source.element))
            : whole.toListRef()[source.element];
    if (!arg.isTensor()) { // a runtime scalar
      at::Tensor t = at::scalar_tensor(
          arg.toScalar(), at::TensorOptions().dtype(entry->inputs[i].dtype));
      in.push_back({t.data_ptr(), entry->inputs[i].programDType, {}});
      inputs.push_back(std::move(t));
      continue;
    }
    at::Tensor t = arg.toTensor();
    if (t.scalar_type() != entry->inputs[i].dtype)
      t = t.to(entry->inputs[i].dtype); // a CPU 0-d float64 number
    if (!t.is_contiguous())
      t = t.contiguous();
    in.push_back({t.data_ptr(), entry->inputs[i].programDType,
                  entry->inputs[i].shape});
    inputs.push_back(std::move(t));
  }
  // Program output j lands in results[j]; written[j] is the argument it is
  // copied into afterwards (a temporary stood for it), if any.
  std::vector<at::Tensor> results(k.outputs.size()), written(k.outputs.size());
  for (size_t j = 0; j < k.outputs.size(); ++j) {
    const Spec &spec = entry->outputs[j];
    at::Tensor target;
    if (k.outputs[j] >= 0) {
      const c10::IValue &arg = args[k.outputs[j]];
      int element = j < k.outputElements.size() ? k.outputElements[j] : -1;
      target = element >= 0 ? arg.toTensorList().get(element) : arg.toTensor();
      if (target.sizes() != c10::IntArrayRef(spec.shape))
        at::native::resize_output(target, spec.shape);
      if (target.scalar_type() == spec.dtype && target.is_contiguous() &&
          !overlapsAny(target, inputs)) {
        results[j] = target;
      } else {
        written[j] = target;
      }
    }
    if (!results[j].defined())
      results[j] = at::empty(spec.shape, at::TensorOptions()
                                             .dtype(spec.dtype)
                                             .device(kDeviceType, device));
    out.push_back({results[j].data_ptr(), spec.programDType, spec.shape});
  }
  {
    std::lock_guard<std::mutex> lock(entry->runMutex);
    try {
      entry->executor->run(in, out);
    } catch (const runtime::IndexError &e) {
      TORCH_CHECK_INDEX(false, e.what()); // IndexError, as eager raises
    }
  }
  for (size_t j = 0; j < k.outputs.size(); ++j)
    if (written[j].defined())
      written[j].copy_(results[j]);
  double start = placeWork(currentStream(device), k.work).first;
  ++runs;
  if (profiling)
    if (std::shared_ptr<KernelProvider> p = provider)
      p->recordRun(k.id, start);

  std::vector<c10::IValue> returns;
  returns.reserve(k.returns.size());
  for (int r : k.returns)
    returns.push_back(r == ProvidedKernel::kUndefinedReturn
                          ? c10::IValue(at::Tensor())
                          : r >= 0 ? args[r]
                                   : c10::IValue(results[-r - 1]));
  torch::jit::drop(*stack, nargs);
  for (c10::IValue &r : returns)
    stack->push_back(std::move(r));
  return true;
}

} // namespace neuron::device
