//===- NeuronBackend.h - The `neuron` torch.distributed backend -*- C++ -*-===//
//
// A c10d::Backend for neuron tensors. Device memory is host memory, so the
// bytes move between processes through a transport backend it owns (Gloo's,
// which torch ships: torchneuron.distributed creates it), run on CPU tensors
// that alias the neuron tensors' memory: results land in the neuron tensors
// with no copy. What the backend adds is the device's view: every
// collective's modeled duration on the instance's topology (CollectiveCost.h)
// is placed on the collective stream of the tensors' device when it is
// issued (after the current stream's earlier work, which does not wait for
// it), so events and profilers see it and kernels overlap it; its Work hands
// back the neuron tensors, and waiting for the Work or its future holds the
// waiter's current stream back until the collective ends (DDP's reducer
// waits on the future at the end of the backward).
//
// ReduceOp.AVG, which Gloo lacks, is a sum divided by the group size once
// the sum has arrived. A transport failure (a peer that died, a timeout)
// surfaces from wait() as a DistBackendError naming the collective and rank.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DISTRIBUTED_NEURONBACKEND_H
#define NEURON_RUNTIME_DISTRIBUTED_NEURONBACKEND_H

#include "runtime/device/CollectiveTimeline.h"
#include "runtime/timing/CollectiveCost.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace neuron::distributed {

class NeuronBackend final : public c10d::Backend {
public:
  /// `transport` moves the bytes among the same `size` ranks; `globalRanks`
  /// are the group's ranks in the instance (empty: 0..size-1), which place
  /// them on chips; `timeline` is the device's (it must outlive the backend).
  NeuronBackend(c10::intrusive_ptr<c10d::Backend> transport, int rank, int size,
                std::vector<int64_t> globalRanks, Topology topology,
                const device::CollectiveTimeline *timeline,
                std::chrono::milliseconds timeout);

  const std::string getBackendName() const override { return "neuron"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  /// The group's ranks in the instance, in group order.
  const std::vector<int64_t> &globalRanks() const { return globalRanks_; }

  c10::intrusive_ptr<c10d::Work>
  broadcast(std::vector<at::Tensor> &tensors,
            const c10d::BroadcastOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  allreduce(std::vector<at::Tensor> &tensors,
            const c10d::AllreduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  allreduce_coalesced(std::vector<at::Tensor> &tensors,
                      const c10d::AllreduceCoalescedOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  reduce(std::vector<at::Tensor> &tensors,
         const c10d::ReduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  gather(std::vector<std::vector<at::Tensor>> &outputs,
         std::vector<at::Tensor> &inputs,
         const c10d::GatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  scatter(std::vector<at::Tensor> &outputs,
          std::vector<std::vector<at::Tensor>> &inputs,
          const c10d::ScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  allgather(std::vector<std::vector<at::Tensor>> &outputs,
            std::vector<at::Tensor> &inputs,
            const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  _allgather_base(at::Tensor &output, at::Tensor &input,
                  const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                  std::vector<at::Tensor> &inputs,
                                  const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  reduce_scatter(std::vector<at::Tensor> &outputs,
                 std::vector<std::vector<at::Tensor>> &inputs,
                 const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                       const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  reduce_scatter_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                  std::vector<at::Tensor> &inputs,
                                  const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  alltoall_base(at::Tensor &output, at::Tensor &input,
                std::vector<int64_t> &outputSplits,
                std::vector<int64_t> &inputSplits,
                const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
           const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors,
                                      int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors,
                                      int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work>
  barrier(const c10d::BarrierOptions &opts) override;

private:
  /// Charges `c` moving `bytes` among `ranks` (global) on `device`'s
  /// current stream, then issues it through `issue` and wraps its Work.
  /// `finish` runs once after the transport's work succeeded.
  c10::intrusive_ptr<c10d::Work>
  run(Collective c, c10d::OpType op, int64_t bytes,
      const std::vector<int64_t> &ranks, c10::DeviceIndex device,
      std::vector<at::Tensor> outputs,
      const std::function<c10::intrusive_ptr<c10d::Work>()> &issue,
      std::function<void()> finish = {});
  /// The device of `tensors` (all on one neuron device).
  c10::DeviceIndex deviceOf(const std::vector<at::Tensor> &tensors,
                            const char *collective) const;
  /// The group's global ranks, or this rank and `peer`'s.
  std::vector<int64_t> pair(int peer) const;

  c10::intrusive_ptr<c10d::Backend> transport_;
  std::vector<int64_t> globalRanks_;
  Topology topology_;
  const device::CollectiveTimeline *timeline_;
  std::chrono::milliseconds timeout_;
};

/// A CPU tensor over the bytes of neuron tensor `t` (same sizes, strides and
/// dtype), keeping its storage alive: writes through it change `t`.
at::Tensor hostAlias(const at::Tensor &t);

} // namespace neuron::distributed

#endif // NEURON_RUNTIME_DISTRIBUTED_NEURONBACKEND_H
