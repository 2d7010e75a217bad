//===- Stream.h - Streams, events and the modeled timeline ------*- C++ -*-===//
//
// A neuron stream is a queue on the device's modeled timeline. Its work runs
// synchronously on the host when it is issued, so a stream is host-ordered:
// query() is always true and synchronize() returns at once. What a stream
// keeps is a modeled-time
// cursor, in nanoseconds: placeWork(stream, ns) puts a piece of modeled work
// at the cursor and moves it on. An event records a stream's cursor, a
// stream waiting for an event moves its cursor to the event's time, and
// elapsed_time is the difference of two events' times, in milliseconds.
// Every eager device kernel (EagerKernels.cpp) places its modeled duration
// on the current stream; CPU fallbacks and copies place nothing yet.
// torch.neuron._place_modeled_work places work explicitly (tests).
//
// Stream ids: 0 is each device's default stream; torch.Stream(device=...)
// gets a new id (1, 2, ...) every time. The current stream is per thread and
// per device, as for CUDA.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_STREAM_H
#define NEURON_RUNTIME_DEVICE_STREAM_H

#include <c10/core/Stream.h>

#include <utility>

namespace neuron::device {

c10::Stream defaultStream(c10::DeviceIndex device);
c10::Stream currentStream(c10::DeviceIndex device);
/// Makes `stream` current for its device on this thread; returns the old one.
c10::Stream exchangeStream(c10::Stream stream);
c10::Stream newStream(c10::DeviceIndex device);

/// The stream's modeled-time cursor (ns since the process started the
/// device's timeline).
double streamCursorNs(c10::Stream stream);
/// Places `durationNs` of modeled work at the stream's cursor; returns its
/// [start, end) in ns and moves the cursor to the end.
std::pair<double, double> placeWork(c10::Stream stream, double durationNs);

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
/// Modeled milliseconds from `start` to `end`.
double elapsedMs(const Event &start, const Event &end);

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_STREAM_H
