//===- Profiler.cpp - The device's eager work in torch.profiler -----------===//
//
// PyTorch offers a PrivateUse1 device three ways into its profilers; the
// device uses all three, because each reaches a different profiler call:
//
//  - A range per kernel run ("neuron::<kernel>") and per copy
//    ("neuron::copy_host_to_device", ...), a RecordFunction of function
//    scope: every torch.profiler trace shows it, activities=[CPU] included;
//    with record_shapes=True its args carry the modeled ns and the stream.
//  - A Kineto plugin (REGISTER_PRIVATEUSE1_PROFILER): when the profiler
//    records ProfilerActivity.PrivateUse1 (torch.profiler.profile()'s
//    default activities include it once `neuron` is registered), each kernel
//    run and copy is also a device event on a track per stream, linked to its range
//    so key_averages() counts it as device time. It starts when the kernel
//    was issued (no earlier than the stream's previous event ends) and lasts
//    the kernel's modeled time, so the track reads like an asynchronous
//    device's whose work the host issues one op at a time.
//  - The legacy stubs (registerPrivateUse1Methods) behind
//    torch.autograd.profiler.profile(use_device="neuron"): each op's device
//    time is how far its stream's modeled-time cursor moved during the op.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/Profiler.h"

#include "runtime/device/Device.h"
#include "runtime/device/Stream.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace neuron::device {

namespace {

// ---- Kineto plugin --------------------------------------------------------

struct KernelRecord {
  std::string name;
  c10::DeviceIndex device;
  c10::StreamId stream;
  int64_t issuedNs;
  double modeledNs;
  uint64_t correlation;
};

class Session;

std::mutex sessionMutex;
Session *recordingSession = nullptr; // guarded by sessionMutex
std::atomic<bool> recording{false};

// The correlation id of the innermost profiled op on this thread: Kineto
// passes them to every session, and a kernel run's device event links to it.
thread_local std::vector<uint64_t> correlationStack;

// Activities keep a pointer to their span; the trace that holds copies of
// them may outlive the session.
const libkineto::TraceSpan &deviceSpan() {
  static const libkineto::TraceSpan span(0, 0, "neuron");
  return span;
}

class Session : public libkineto::IActivityProfilerSession {
public:
  ~Session() override {
    std::lock_guard<std::mutex> lock(sessionMutex);
    if (recordingSession == this) {
      recordingSession = nullptr;
      recording = false;
    }
  }

  void start() override {
    std::lock_guard<std::mutex> lock(sessionMutex);
    recordingSession = this;
    recording = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    std::lock_guard<std::mutex> lock(sessionMutex);
    if (recordingSession == this) {
      recordingSession = nullptr;
      recording = false;
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger &logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger &logger,
                    libkineto::getLinkedActivityCallback linkedActivity,
                    int64_t, int64_t) override {
    std::lock_guard<std::mutex> lock(sessionMutex);
    // Runs are recorded as they finish; threads sharing a stream (the
    // autograd engine's and the caller's) are placed in the order they issued.
    std::stable_sort(runs.begin(), runs.end(),
                     [](const KernelRecord &a, const KernelRecord &b) {
                       return a.issuedNs < b.issuedNs;
                     });
    std::map<std::pair<c10::DeviceIndex, c10::StreamId>, int64_t> trackEnd;
    int32_t id = 0;
    for (const KernelRecord &run : runs) {
      int64_t &end = trackEnd[{run.device, run.stream}];
      libkineto::GenericTraceActivity activity(
          deviceSpan(), libkineto::ActivityType::CONCURRENT_KERNEL, run.name);
      activity.startTime = std::max(run.issuedNs, end);
      activity.endTime = activity.startTime +
                         static_cast<int64_t>(std::llround(run.modeledNs));
      end = activity.endTime;
      activity.id = ++id;
      activity.device = run.device;
      activity.resource = static_cast<int32_t>(run.stream);
      activity.threadId = static_cast<int32_t>(run.stream);
      if (linkedActivity && run.correlation != 0)
        activity.linked = linkedActivity(static_cast<int32_t>(run.correlation));
      activity.addMetadata("device_ns", run.modeledNs);
      activity.addMetadata("stream", run.stream);
      activity.addMetadata("device", static_cast<int>(run.device));
      activity.log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    std::lock_guard<std::mutex> lock(sessionMutex);
    int64_t device = runs.empty() ? 0 : runs.front().device;
    // Sorted after the host's rows, as GPU rows are.
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, device + 1000000, "neuron",
        "neuron:" + std::to_string(device) + " (modeled time)"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::lock_guard<std::mutex> lock(sessionMutex);
    std::set<std::pair<c10::DeviceIndex, c10::StreamId>> tracks;
    for (const KernelRecord &run : runs)
      tracks.insert({run.device, run.stream});
    std::vector<libkineto::ResourceInfo> infos;
    for (const auto &[device, stream] : tracks)
      infos.push_back(libkineto::ResourceInfo{
          stream, stream, device, "stream " + std::to_string(stream)});
    return infos;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return nullptr; // processTrace logs the device events itself
  }

  void pushCorrelationId(uint64_t id) override {
    correlationStack.push_back(id);
  }

  void popCorrelationId() override {
    if (!correlationStack.empty())
      correlationStack.pop_back();
  }

  /// Called with sessionMutex held.
  void add(KernelRecord run) { runs.push_back(std::move(run)); }

private:
  std::vector<KernelRecord> runs; // guarded by sessionMutex
};

class NeuronActivityProfiler : public libkineto::IActivityProfiler {
public:
  const std::string &name() const override { return profilerName; }

  const std::set<libkineto::ActivityType> &
  availableActivities() const override {
    return activities;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession>
  configure(const std::set<libkineto::ActivityType> &types,
            const libkineto::Config &) override {
    // activities=[CPU] asks for no device kernels: no session.
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL))
      return nullptr;
    return std::make_unique<Session>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession>
  configure(int64_t, int64_t, const std::set<libkineto::ActivityType> &types,
            const libkineto::Config &config) override {
    return configure(types, config);
  }

private:
  std::string profilerName = "neuron";
  std::set<libkineto::ActivityType> activities{
      libkineto::ActivityType::CONCURRENT_KERNEL};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

// ---- legacy stubs ---------------------------------------------------------

struct CursorEvent {
  double ns;
};

struct NeuronProfilerStubs : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex *device,
              torch::profiler::impl::ProfilerVoidEventStub *event,
              int64_t *cpuNs) const override {
    if (cpuNs)
      *cpuNs = c10::getTime();
    if (deviceCount() == 0) { // no visible cores: nothing is modeled
      *event = nullptr;
      return;
    }
    c10::DeviceIndex current = currentDevice();
    if (device)
      *device = current;
    *event = std::make_shared<CursorEvent>(
        CursorEvent{streamCursorNs(currentStream(current))});
  }

  float elapsed(
      const torch::profiler::impl::ProfilerVoidEventStub *start,
      const torch::profiler::impl::ProfilerVoidEventStub *end) const override {
    if (!start || !end || !*start || !*end)
      return 0;
    auto *a = static_cast<const CursorEvent *>(start->get());
    auto *b = static_cast<const CursorEvent *>(end->get());
    return static_cast<float>((b->ns - a->ns) / 1e3); // microseconds
  }

  // The modeled device has no annotation track to mark.
  void mark(const char *) const override {}
  void rangePush(const char *) const override {}
  void rangePop() const override {}

  void onEachDevice(std::function<void(int)> op) const override {
    c10::OptionalDeviceGuard guard;
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
      guard.reset_device(c10::Device(kDeviceType, i));
      op(i);
    }
  }

  void synchronize() const override {} // work runs when it is issued
  bool enabled() const override { return true; }
};

struct RegisterStubs {
  RegisterStubs() {
    static NeuronProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} registerStubs;

// ---- ranges ---------------------------------------------------------------

// RecordFunction cannot move: the range is built in place.
void openRange(std::optional<at::RecordFunction> &range,
               const std::string &name,
               const std::unordered_map<std::string, c10::IValue> &args) {
  std::optional<at::StepCallbacks> callbacks =
      at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION);
  if (!callbacks)
    return;
  range.emplace(std::move(*callbacks));
  if (range->needsInputs())
    range->before(name, &args);
  else
    range->before(name);
}


} // namespace

ProfiledKernelRun::ProfiledKernelRun(const std::string &kernel,
                                     c10::Stream stream, double modeledNs,
                                     int64_t bytes)
    : stream(stream), modeledNs(modeledNs) {
  if (!at::hasCallbacks() && !recording)
    return;
  name = "neuron::" + kernel;
  std::unordered_map<std::string, c10::IValue> args = {
      {"device_ns", modeledNs}, {"stream", static_cast<int64_t>(stream.id())}};
  if (bytes >= 0)
    args.emplace("bytes", bytes);
  openRange(range, name, args);
  if (recording) {
    issuedNs = c10::getTime();
    if (!correlationStack.empty())
      correlation = correlationStack.back();
  }
}

ProfiledKernelRun::~ProfiledKernelRun() {
  if (issuedNs == 0)
    return;
  std::lock_guard<std::mutex> lock(sessionMutex);
  if (recordingSession)
    recordingSession->add({std::move(name), stream.device_index(), stream.id(),
                           issuedNs, modeledNs, correlation});
}

ProfiledCopy::ProfiledCopy(const std::optional<PlannedCopy> &copy) {
  if (copy)
    run.emplace(std::string("copy_") + copy->kind, copy->stream,
                copy->work.durationNs, copy->bytes);
}

} // namespace neuron::device
