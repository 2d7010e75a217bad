//===- NeuronBackend.cpp - The `neuron` torch.distributed backend ---------===//

#include "runtime/distributed/NeuronBackend.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <exception>
#include <mutex>
#include <numeric>
#include <utility>

namespace neuron::distributed {

namespace {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

int64_t bytesOf(const std::vector<at::Tensor> &tensors) {
  int64_t total = 0;
  for (const at::Tensor &t : tensors)
    total += static_cast<int64_t>(t.nbytes());
  return total;
}

std::vector<at::Tensor> hostAliases(const std::vector<at::Tensor> &tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor &t : tensors)
    out.push_back(hostAlias(t));
  return out;
}

std::vector<std::vector<at::Tensor>>
hostAliases(const std::vector<std::vector<at::Tensor>> &lists) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto &list : lists)
    out.push_back(hostAliases(list));
  return out;
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>> &v) {
  std::vector<at::Tensor> out;
  for (const auto &list : v)
    out.insert(out.end(), list.begin(), list.end());
  return out;
}

/// AVG is SUM then a division by the group size (Gloo has no AVG); returns
/// whether the caller must divide.
bool sumForAverage(c10d::ReduceOp &op, const std::vector<at::Tensor> &outputs,
                   const char *collective) {
  if (op.op_ != c10d::ReduceOp::AVG)
    return false;
  for (const at::Tensor &t : outputs)
    TORCH_CHECK(at::isFloatingType(t.scalar_type()) ||
                    at::isComplexType(t.scalar_type()),
                "neuron ", collective, ": ReduceOp.AVG needs floating-point ",
                "tensors, got ", t.scalar_type());
  op = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return true;
}

std::function<void()> divideBy(std::vector<at::Tensor> hostOutputs, int size) {
  return [hostOutputs = std::move(hostOutputs), size]() mutable {
    for (at::Tensor &t : hostOutputs)
      t.div_(size);
  };
}

/// The transport's Work, seen from the device: wait() and the future give
/// the neuron tensors back, after `finish` (the AVG division) ran once; a
/// transport error is rethrown naming the collective. The collective ends at
/// `endNs` on the device's collective stream: wait() makes the waiting
/// thread's current stream wait until then, and the future completes there
/// (its completion events mark `endNs`), so whoever waits on either sees the
/// collective done, and kernels issued before that overlap it.
class NeuronWork final : public c10d::Work {
public:
  NeuronWork(c10::intrusive_ptr<c10d::Work> inner, int rank, int size,
             c10d::OpType op, const char *collective,
             std::vector<at::Tensor> outputs, std::function<void()> finish,
             const device::CollectiveTimeline *timeline,
             c10::DeviceIndex device, double endNs)
      : c10d::Work(rank, op), inner_(std::move(inner)), size_(size),
        collective_(collective), outputs_(std::move(outputs)),
        finish_(std::move(finish)), timeline_(timeline), device_(device),
        endNs_(endNs) {}

  bool isCompleted() override {
    bool done = inner_->isCompleted();
    if (done && inner_->isSuccess())
      finishOnce();
    return done;
  }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }

  bool wait(std::chrono::milliseconds timeout) override {
    bool done = false;
    try {
      done = inner_->wait(timeout);
    } catch (const std::exception &e) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("neuron ", collective_, " on rank ", rank_,
                               " of ", size_, " failed: ", e.what()));
    }
    if (done) {
      finishOnce();
      timeline_->waitUntil(device_, endNs_);
    }
    return done;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(futureMutex_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()),
          std::vector<c10::Device>{c10::Device(kNeuron, device_)});
      auto self =
          c10::intrusive_ptr<NeuronWork>::unsafe_reclaim_from_nonowning(this);
      inner_->getFuture()->addCallback([self](c10::ivalue::Future &inner) {
        if (inner.hasError()) {
          self->future_->setError(inner.exception_ptr());
          return;
        }
        self->finishOnce();
        self->timeline_->runAtTime(self->device_, self->endNs_, [&self] {
          self->future_->markCompleted(c10::IValue(self->outputs_));
        });
      });
    }
    return future_;
  }

private:
  void finishOnce() {
    if (finish_)
      std::call_once(finished_, finish_);
  }

  c10::intrusive_ptr<c10d::Work> inner_;
  int size_;
  const char *collective_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> finish_;
  std::once_flag finished_;
  const device::CollectiveTimeline *timeline_;
  c10::DeviceIndex device_;
  double endNs_;
  std::mutex futureMutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

} // namespace

at::Tensor hostAlias(const at::Tensor &t) {
  TORCH_CHECK(t.device().type() == kNeuron,
              "the neuron process-group backend takes neuron tensors, got a "
              "tensor on ",
              t.device());
  // The deleter holds the storage: the transport may write after the
  // caller dropped its last reference.
  c10::Storage storage = t.storage();
  return at::from_blob(
      t.data_ptr(), t.sizes(), t.strides(),
      [storage](void *) mutable { storage = {}; },
      t.options().device(c10::kCPU));
}

NeuronBackend::NeuronBackend(c10::intrusive_ptr<c10d::Backend> transport,
                             int rank, int size,
                             std::vector<int64_t> globalRanks,
                             Topology topology,
                             const device::CollectiveTimeline *timeline,
                             std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), transport_(std::move(transport)),
      globalRanks_(std::move(globalRanks)), topology_(topology),
      timeline_(timeline), timeout_(timeout) {
  TORCH_CHECK(transport_, "the neuron backend needs a transport backend");
  TORCH_CHECK(transport_->getRank() == rank && transport_->getSize() == size,
              "the transport backend is rank ", transport_->getRank(), " of ",
              transport_->getSize(), ", not ", rank, " of ", size);
  TORCH_CHECK(timeline_ &&
                  timeline_->version == device::CollectiveTimeline::kVersion,
              "torchneuron._device and torchneuron._distributed come from "
              "different builds");
  if (globalRanks_.empty()) {
    globalRanks_.resize(size);
    std::iota(globalRanks_.begin(), globalRanks_.end(), 0);
  }
  TORCH_CHECK(static_cast<int>(globalRanks_.size()) == size, "a group of ",
              size, " ranks cannot have ", globalRanks_.size(),
              " global ranks");
  try { // every rank must sit on a core of the instance
    collectiveCost(topology_, Collective::Barrier, 0, globalRanks_);
  } catch (const std::invalid_argument &e) {
    TORCH_CHECK(false, "neuron process group: ", e.what());
  }
}

c10::intrusive_ptr<c10d::Backend::Options> NeuronBackend::getBackendOptions() {
  auto options = c10::make_intrusive<Options>("neuron", timeout_);
  options->global_ranks_in_group.assign(globalRanks_.begin(),
                                        globalRanks_.end());
  return options;
}

c10::DeviceIndex NeuronBackend::deviceOf(const std::vector<at::Tensor> &tensors,
                                         const char *collective) const {
  TORCH_CHECK(!tensors.empty(), "neuron ", collective, ": no tensors");
  c10::Device device = tensors.front().device();
  for (const at::Tensor &t : tensors) {
    TORCH_CHECK(t.device().type() == kNeuron, "neuron ", collective,
                ": the neuron process-group backend takes neuron tensors, "
                "got a tensor on ",
                t.device());
    TORCH_CHECK(t.device() == device, "neuron ", collective, ": tensors on ",
                device, " and ", t.device(),
                "; one collective runs on one device");
  }
  return device.index();
}

std::vector<int64_t> NeuronBackend::pair(int peer) const {
  TORCH_CHECK(peer >= 0 && peer < getSize(), "peer rank ", peer,
              " is outside the group of ", getSize());
  return {globalRanks_.at(getRank()), globalRanks_.at(peer)};
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::run(Collective c, c10d::OpType op, int64_t bytes,
                   const std::vector<int64_t> &ranks, c10::DeviceIndex device,
                   std::vector<at::Tensor> outputs,
                   const std::function<c10::intrusive_ptr<c10d::Work>()> &issue,
                   std::function<void()> finish) {
  const char *name = collectiveName(c);
  CollectiveCost cost = collectiveCost(topology_, c, bytes, ranks);
  // Issued first: a collective the transport refuses charges nothing.
  c10::intrusive_ptr<c10d::Work> inner = issue();
  // The collective path (links and collective engines) is the resource:
  // two collectives of one device queue, kernels overlap them.
  double end = timeline_->place(
      device, name, bytes,
      {cost.durationNs, {{"neuronlink", cost.durationNs}}}).second;
  return c10::make_intrusive<NeuronWork>(
      std::move(inner), getRank(), getSize(), op, name, std::move(outputs),
      std::move(finish), timeline_, device, end);
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::broadcast(std::vector<at::Tensor> &tensors,
                         const c10d::BroadcastOptions &opts) {
  c10::DeviceIndex device = deviceOf(tensors, "broadcast");
  auto host = hostAliases(tensors);
  return run(Collective::Broadcast, c10d::OpType::BROADCAST, bytesOf(tensors),
             globalRanks_, device, tensors,
             [&] { return transport_->broadcast(host, opts); });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::allreduce(std::vector<at::Tensor> &tensors,
                         const c10d::AllreduceOptions &opts) {
  c10::DeviceIndex device = deviceOf(tensors, "all_reduce");
  auto host = hostAliases(tensors);
  c10d::AllreduceOptions o = opts;
  bool average = sumForAverage(o.reduceOp, tensors, "all_reduce");
  return run(
      Collective::AllReduce, c10d::OpType::ALLREDUCE, bytesOf(tensors),
      globalRanks_, device, tensors,
      [&] { return transport_->allreduce(host, o); },
      average ? divideBy(host, getSize()) : nullptr);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allreduce_coalesced(
    std::vector<at::Tensor> &tensors,
    const c10d::AllreduceCoalescedOptions &opts) {
  c10::DeviceIndex device = deviceOf(tensors, "all_reduce");
  auto host = hostAliases(tensors);
  c10d::AllreduceCoalescedOptions o = opts;
  bool average = sumForAverage(o.reduceOp, tensors, "all_reduce");
  return run(
      Collective::AllReduce, c10d::OpType::ALLREDUCE_COALESCED,
      bytesOf(tensors), globalRanks_, device, tensors,
      [&] { return transport_->allreduce_coalesced(host, o); },
      average ? divideBy(host, getSize()) : nullptr);
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::reduce(std::vector<at::Tensor> &tensors,
                      const c10d::ReduceOptions &opts) {
  c10::DeviceIndex device = deviceOf(tensors, "reduce");
  auto host = hostAliases(tensors);
  c10d::ReduceOptions o = opts;
  bool average = sumForAverage(o.reduceOp, tensors, "reduce");
  // Only the root's result is defined, so only the root divides.
  bool rootDivides = average && opts.rootRank == getRank();
  return run(
      Collective::Reduce, c10d::OpType::REDUCE, bytesOf(tensors), globalRanks_,
      device, tensors, [&] { return transport_->reduce(host, o); },
      rootDivides ? divideBy(host, getSize()) : nullptr);
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::gather(std::vector<std::vector<at::Tensor>> &outputs,
                      std::vector<at::Tensor> &inputs,
                      const c10d::GatherOptions &opts) {
  // Only the root has outputs: the gathered bytes are the input's n times.
  std::vector<at::Tensor> flat = flatten(outputs);
  c10::DeviceIndex device = deviceOf(inputs, "gather");
  if (!flat.empty())
    deviceOf(flat, "gather");
  auto hostOut = hostAliases(outputs);
  auto hostIn = hostAliases(inputs);
  return run(Collective::Gather, c10d::OpType::GATHER,
             bytesOf(inputs) * getSize(), globalRanks_, device, flat,
             [&] { return transport_->gather(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::scatter(std::vector<at::Tensor> &outputs,
                       std::vector<std::vector<at::Tensor>> &inputs,
                       const c10d::ScatterOptions &opts) {
  // Only the root has inputs: the scattered bytes are the output's n times.
  std::vector<at::Tensor> flat = flatten(inputs);
  c10::DeviceIndex device = deviceOf(outputs, "scatter");
  if (!flat.empty())
    deviceOf(flat, "scatter");
  auto hostOut = hostAliases(outputs);
  auto hostIn = hostAliases(inputs);
  return run(Collective::Scatter, c10d::OpType::SCATTER,
             bytesOf(outputs) * getSize(), globalRanks_, device, outputs,
             [&] { return transport_->scatter(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                         std::vector<at::Tensor> &inputs,
                         const c10d::AllgatherOptions &opts) {
  std::vector<at::Tensor> flat = flatten(outputs);
  c10::DeviceIndex device = deviceOf(inputs, "all_gather");
  deviceOf(flat, "all_gather");
  auto hostOut = hostAliases(outputs);
  auto hostIn = hostAliases(inputs);
  return run(Collective::AllGather, c10d::OpType::ALLGATHER, bytesOf(flat),
             globalRanks_, device, flat,
             [&] { return transport_->allgather(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::_allgather_base(at::Tensor &output, at::Tensor &input,
                               const c10d::AllgatherOptions &opts) {
  c10::DeviceIndex device = deviceOf({output, input}, "all_gather");
  at::Tensor hostOut = hostAlias(output);
  at::Tensor hostIn = hostAlias(input);
  return run(
      Collective::AllGather, c10d::OpType::_ALLGATHER_BASE,
      static_cast<int64_t>(output.nbytes()), globalRanks_, device, {output},
      [&] { return transport_->_allgather_base(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &opts) {
  c10::DeviceIndex device = deviceOf(inputs, "all_gather");
  deviceOf(outputs, "all_gather");
  auto hostOut = hostAliases(outputs);
  auto hostIn = hostAliases(inputs);
  return run(Collective::AllGather, c10d::OpType::COALESCED, bytesOf(outputs),
             globalRanks_, device, outputs, [&] {
               return transport_->allgather_into_tensor_coalesced(
                   hostOut, hostIn, opts);
             });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::reduce_scatter(std::vector<at::Tensor> &outputs,
                              std::vector<std::vector<at::Tensor>> &inputs,
                              const c10d::ReduceScatterOptions &opts) {
  std::vector<at::Tensor> flat = flatten(inputs);
  c10::DeviceIndex device = deviceOf(outputs, "reduce_scatter");
  deviceOf(flat, "reduce_scatter");
  auto hostOut = hostAliases(outputs);
  auto hostIn = hostAliases(inputs);
  c10d::ReduceScatterOptions o = opts;
  bool average = sumForAverage(o.reduceOp, outputs, "reduce_scatter");
  return run(
      Collective::ReduceScatter, c10d::OpType::REDUCE_SCATTER, bytesOf(flat),
      globalRanks_, device, outputs,
      [&] { return transport_->reduce_scatter(hostOut, hostIn, o); },
      average ? divideBy(hostOut, getSize()) : nullptr);
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                    const c10d::ReduceScatterOptions &opts) {
  c10::DeviceIndex device = deviceOf({output, input}, "reduce_scatter");
  at::Tensor hostOut = hostAlias(output);
  at::Tensor hostIn = hostAlias(input);
  c10d::ReduceScatterOptions o = opts;
  bool average = sumForAverage(o.reduceOp, {output}, "reduce_scatter");
  return run(
      Collective::ReduceScatter, c10d::OpType::_REDUCE_SCATTER_BASE,
      static_cast<int64_t>(input.nbytes()), globalRanks_, device, {output},
      [&] { return transport_->_reduce_scatter_base(hostOut, hostIn, o); },
      average ? divideBy({hostOut}, getSize()) : nullptr);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::ReduceScatterOptions &opts) {
  c10::DeviceIndex device = deviceOf(outputs, "reduce_scatter");
  deviceOf(inputs, "reduce_scatter");
  auto hostOut = hostAliases(outputs);
  auto hostIn = hostAliases(inputs);
  c10d::ReduceScatterOptions o = opts;
  bool average = sumForAverage(o.reduceOp, outputs, "reduce_scatter");
  return run(
      Collective::ReduceScatter, c10d::OpType::COALESCED, bytesOf(inputs),
      globalRanks_, device, outputs,
      [&] {
        return transport_->reduce_scatter_tensor_coalesced(hostOut, hostIn, o);
      },
      average ? divideBy(hostOut, getSize()) : nullptr);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::alltoall_base(
    at::Tensor &output, at::Tensor &input, std::vector<int64_t> &outputSplits,
    std::vector<int64_t> &inputSplits, const c10d::AllToAllOptions &opts) {
  c10::DeviceIndex device = deviceOf({output, input}, "all_to_all");
  at::Tensor hostOut = hostAlias(output);
  at::Tensor hostIn = hostAlias(input);
  return run(Collective::AllToAll, c10d::OpType::ALLTOALL_BASE,
             static_cast<int64_t>(input.nbytes()), globalRanks_, device,
             {output}, [&] {
               return transport_->alltoall_base(hostOut, hostIn, outputSplits,
                                                inputSplits, opts);
             });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::alltoall(std::vector<at::Tensor> &outputs,
                        std::vector<at::Tensor> &inputs,
                        const c10d::AllToAllOptions &opts) {
  c10::DeviceIndex device = deviceOf(inputs, "all_to_all");
  deviceOf(outputs, "all_to_all");
  auto hostOut = hostAliases(outputs);
  auto hostIn = hostAliases(inputs);
  return run(Collective::AllToAll, c10d::OpType::ALLTOALL, bytesOf(inputs),
             globalRanks_, device, outputs,
             [&] { return transport_->alltoall(hostOut, hostIn, opts); });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::send(std::vector<at::Tensor> &tensors, int dstRank, int tag) {
  c10::DeviceIndex device = deviceOf(tensors, "send");
  auto host = hostAliases(tensors);
  return run(Collective::SendRecv, c10d::OpType::SEND, bytesOf(tensors),
             pair(dstRank), device, tensors,
             [&] { return transport_->send(host, dstRank, tag); });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::recv(std::vector<at::Tensor> &tensors, int srcRank, int tag) {
  c10::DeviceIndex device = deviceOf(tensors, "recv");
  auto host = hostAliases(tensors);
  return run(Collective::SendRecv, c10d::OpType::RECV, bytesOf(tensors),
             pair(srcRank), device, tensors,
             [&] { return transport_->recv(host, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work>
NeuronBackend::barrier(const c10d::BarrierOptions &opts) {
  c10::DeviceIndex device =
      opts.device && opts.device->type() == kNeuron && opts.device->has_index()
          ? opts.device->index()
          : timeline_->currentDevice();
  return run(Collective::Barrier, c10d::OpType::BARRIER, 0, globalRanks_,
             device, {}, [&] { return transport_->barrier(opts); });
}

} // namespace neuron::distributed
