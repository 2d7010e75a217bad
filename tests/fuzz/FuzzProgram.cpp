//===- FuzzProgram.cpp - libFuzzer target: the kernel-program loader ------===//
//
// Any byte string given to the loader either becomes a verified program or
// is refused with neuron::runtime::Error; anything else (another exception,
// a crash, a sanitizer report) is a bug. Small verified programs are also
// run on zeroed buffers and timed, so the executor and the timing model see
// every program the loader accepts.
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/Executor.h"
#include "runtime/program/Error.h"
#include "runtime/program/Program.h"
#include "runtime/target/Target.h"
#include "runtime/timing/TimingModel.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

using namespace neuron;

namespace {

/// Dynamic instructions (loop trips multiplied out), capped at `limit`.
int64_t dynamicCount(const std::vector<runtime::Node> &body, int64_t limit) {
  int64_t total = 0;
  for (const runtime::Node &n : body) {
    int64_t here = 1;
    if (n.isLoop()) {
      int64_t inner = dynamicCount(n.body, limit);
      here = n.count > 0 && inner > limit / n.count ? limit : n.count * inner;
    }
    total += here;
    if (total >= limit)
      return limit;
  }
  return total;
}

constexpr int64_t kMaxDynamicInstructions = 20000;
constexpr int64_t kMaxBufferBytes = 8 << 20;

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  try {
    runtime::Program program = runtime::Program::parse(text);
    const target::Target &target = target::getTarget(program.target);
    runtime::Executor executor(program, target); // verifies
    if (dynamicCount(program.body, kMaxDynamicInstructions) >=
        kMaxDynamicInstructions)
      return 0;
    std::vector<std::vector<uint8_t>> storage;
    std::vector<runtime::HostTensor> inputs, outputs;
    for (auto *ids : {&program.inputs, &program.outputs}) {
      for (int64_t id : *ids) {
        const runtime::Buffer *buffer = program.findBuffer(id);
        int64_t bytes = runtime::dtypeSize(buffer->dtype);
        for (int64_t d : buffer->shape)
          bytes = d > 0 && bytes <= kMaxBufferBytes / d ? bytes * d
                                                         : kMaxBufferBytes + 1;
        if (bytes > kMaxBufferBytes)
          return 0;
        storage.emplace_back(static_cast<size_t>(bytes));
        (ids == &program.inputs ? inputs : outputs)
            .push_back({storage.back().data(), buffer->dtype, buffer->shape});
      }
    }
    executor.run(inputs, outputs);
    runtime::simulate(program, target, /*keepEvents=*/false);
  } catch (const runtime::Error &) {
    // A clear refusal is the expected outcome for most inputs.
  }
  return 0;
}
