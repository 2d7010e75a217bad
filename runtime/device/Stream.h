//===- Stream.h - Streams, events and the modeled timeline ------*- C++ -*-===//
//
// A neuron stream is a queue on the device's modeled timeline. Its work runs
// synchronously on the host when it is issued, so a stream is host-ordered:
// query() is always true and synchronize() returns at once. What a stream
// keeps is a modeled-time cursor, in nanoseconds, and what the device keeps
// is when each of its resources (TensorE, VectorE, ScalarE, GpSimd, the DMA
// queues, HBM, the host link) is next free. placeWork(stream, work) starts a
// piece of work at the stream's cursor; it ends after its own duration, or
// later if a resource it needs is still busy with earlier work of another
// stream: then it takes that resource's time after the other work (as if
// its use of each resource came first in its span: an approximation of how
// the engines' queues interleave, exact for one stream and for work that
// shares nothing). So kernels on two streams overlap where the engines
// allow: a matmul kernel and a copy overlap, two matmul kernels mostly not.
//
// An event records a stream's cursor, a stream waiting for an event moves its
// cursor to the event's time, and elapsed_time is the difference of two
// events' times, in milliseconds. Eager device kernels (EagerKernels.cpp)
// and copies (Ops.cpp, planCopy) place their modeled time on the current
// stream; CPU fallbacks place nothing. torch.neuron._place_modeled_work
// places work explicitly (tests).
//
// Stream ids: 0 is each device's default stream; torch.Stream(device=...)
// gets a new id (1, 2, ...) every time, and a cursor at the end of the
// device's latest work. The current stream is per thread and
// per device, as for CUDA.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_STREAM_H
#define NEURON_RUNTIME_DEVICE_STREAM_H

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace neuron::device {

c10::Stream defaultStream(c10::DeviceIndex device);
c10::Stream currentStream(c10::DeviceIndex device);
/// Makes `stream` current for its device on this thread; returns the old one.
c10::Stream exchangeStream(c10::Stream stream);
c10::Stream newStream(c10::DeviceIndex device);

/// A stream of the device's pool (torch's getStreamFromGlobalPool, which
/// c10 futures use for their callbacks): 32 per device, handed out in turn,
/// so the pool does not grow with every callback.
c10::Stream poolStream(c10::DeviceIndex device);
/// The device's queue for collectives, made on first use. A collective
/// starts there after the work issued before it on the issuing stream, and
/// the issuing stream does not wait for it: later kernels overlap it until
/// the collective's result is waited for (as NCCL's internal stream).
c10::Stream collectiveStream(c10::DeviceIndex device);

/// The stream's modeled-time cursor (ns since the process started the
/// device's timeline).
double streamCursorNs(c10::Stream stream);
/// A piece of device work: its duration on an idle device and the busy time
/// of each resource it uses, by the timing model's names ("tensor", "dma",
/// "hbm", ...; "host_link" for the host's PCIe link).
struct Work {
  double durationNs = 0;
  std::map<std::string, double> busyNs;
};

/// Places `work` at the stream's cursor (see above); returns its [start, end)
/// in ns and moves the cursor to the end.
std::pair<double, double> placeWork(c10::Stream stream, const Work &work);

/// A copy to, from or between neuron devices, as the timeline sees it: the
/// current stream of the neuron side (the destination's if both are) and the
/// modeled work: over the host link when one side is the CPU, else by the
/// DMA engines through HBM.
struct PlannedCopy {
  c10::Stream stream;
  Work work;
  int64_t bytes = 0;
  const char *kind = ""; ///< "host_to_device", "device_to_host", ...
};

/// The plan of copying `src` into `dst`; nothing for an empty or CPU-to-CPU
/// copy. Placing it is the caller's (placeCopy, KernelProvider.h).
std::optional<PlannedCopy> planCopy(const at::Tensor &src,
                                    const at::Tensor &dst);

/// A recorded point on the timeline (the backend object behind c10::Event).
struct Event {
  c10::DeviceIndex device = 0;
  bool timing = false;
  bool recorded = false;
  double timeNs = 0;
};

void recordEvent(Event &event, c10::Stream stream);
/// The stream's later work starts no earlier than the event's time.
void streamWaitEvent(c10::Stream stream, const Event &event);
/// The stream's later work starts no earlier than `timeNs`.
void streamWaitUntil(c10::Stream stream, double timeNs);
/// Runs `fn` with the calling thread's current stream of `device` set to a
/// stream of its own whose cursor is `timeNs`: the events `fn` records
/// (a c10 future's completion events) mark that time.
void runAtTime(c10::DeviceIndex device, double timeNs,
               const std::function<void()> &fn);
/// Modeled milliseconds from `start` to `end`.
double elapsedMs(const Event &start, const Event &end);

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_STREAM_H
