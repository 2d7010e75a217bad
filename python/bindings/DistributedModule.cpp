//===- DistributedModule.cpp - torchneuron._distributed -------------------===//
//
// The `neuron` torch.distributed backend (runtime/distributed) for Python:
// torchneuron.distributed's creator hands over the transport backend (a
// ProcessGroupGloo) and gets a c10d::Backend back. Process-group objects
// cross the boundary as torch's own pybind11 types, so this module is built
// with the pybind11 headers torch ships and links libtorch_python, as a
// torch C++ extension is; torchneuron._device links neither. The device is
// reached through its CollectiveTimeline capsule.
//
//===----------------------------------------------------------------------===//

#include "python/bindings/TorchErrors.h"
#include "runtime/device/CollectiveTimeline.h"
#include "runtime/distributed/NeuronBackend.h"
#include "runtime/distributed/ProcessGroupCollectives.h"
#include "runtime/target/Target.h"
#include "runtime/timing/CollectiveCost.h"

#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <chrono>
#include <cmath>

namespace py = pybind11;
using namespace neuron;
using namespace neuron::distributed;

namespace {

Topology topologyOf(const std::string &targetName) {
  return Topology::of(target::getTarget(targetName));
}

} // namespace

PYBIND11_MODULE(_distributed, m) {
  neuron::bindings::registerTorchErrors();
  m.doc() = "The neuron torch.distributed backend; see torchneuron.distributed";

  m.def(
      "_create_backend",
      [](c10::intrusive_ptr<c10d::Backend> transport, int rank, int size,
         std::vector<int64_t> globalRanks, const py::capsule &timeline,
         double timeoutSeconds) -> c10::intrusive_ptr<c10d::Backend> {
        auto *table = timeline.get_pointer<device::CollectiveTimeline>();
        if (std::string(timeline.name()) !=
            device::CollectiveTimeline::kCapsuleName)
          throw py::type_error("not the device's CollectiveTimeline capsule");
        Topology topology = topologyOf(table->target());
        auto timeout = std::chrono::milliseconds(
            static_cast<int64_t>(std::llround(timeoutSeconds * 1000)));
        return c10::make_intrusive<NeuronBackend>(std::move(transport), rank,
                                                  size, std::move(globalRanks),
                                                  topology, table, timeout);
      },
      py::arg("transport"), py::arg("rank"), py::arg("size"),
      py::arg("global_ranks"), py::arg("timeline"), py::arg("timeout"));

  m.def(
      "_collective_cost",
      [](const std::string &collective, int64_t bytes,
         const std::vector<int64_t> &ranks, const std::string &target) {
        CollectiveCost cost = collectiveCost(
            topologyOf(target), parseCollective(collective), bytes, ranks);
        py::dict d;
        d["duration_ns"] = cost.durationNs;
        d["bus_bytes_per_ns"] = cost.busBytesPerNs;
        d["crosses_chips"] = cost.crossesChips;
        d["algorithm"] = cost.algorithm;
        return d;
      },
      py::arg("collective"), py::arg("bytes"), py::arg("ranks"),
      py::arg("target"));

  m.def(
      "_collective_handler",
      [] {
        // The handler is static; the capsule only lends it.
        const runtime::CollectiveHandler &handler = processGroupCollectives();
        return py::capsule(static_cast<const void *>(&handler),
                           runtime::CollectiveHandler::kCapsuleName);
      },
      "The handler compiled kernels run collective instructions through "
      "(the c10d process group of each instruction's group name).");

  m.def(
      "_topology",
      [](const std::string &target) {
        Topology t = topologyOf(target);
        py::dict d;
        d["cores_per_chip"] = t.coresPerChip;
        d["chips_per_instance"] = t.chipsPerInstance;
        d["core_bytes_per_ns"] = t.coreBytesPerNs;
        d["core_latency_ns"] = t.coreLatencyNs;
        d["chip_send_bytes_per_ns"] = t.chipSendBytesPerNs;
        d["link_bytes_per_ns"] = t.linkBytesPerNs;
        d["link_latency_ns"] = t.linkLatencyNs;
        return d;
      },
      py::arg("target"));
}
