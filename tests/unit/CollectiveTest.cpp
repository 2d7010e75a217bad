//===- CollectiveTest.cpp - Collective cost model and neuron backend ------===//
//
// The modeled cost of collectives on the target's topology (CollectiveCost)
// against the ring formulas, and the `neuron` c10d backend over a fake
// transport: results land in the neuron tensors, AVG divides, the modeled
// time lands on the current stream, transport errors name the collective.
// Part of neuron-device-tests (it links libtorch and the device library).
//
//===----------------------------------------------------------------------===//

#include "runtime/device/CollectiveTimeline.h"
#include "runtime/device/Device.h"
#include "runtime/device/KernelProvider.h"
#include "runtime/device/Stream.h"
#include "runtime/distributed/NeuronBackend.h"
#include "runtime/target/Target.h"
#include "runtime/timing/CollectiveCost.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

// c10's logging defines glog-style CHECK macros; the tests use Catch2's.
#undef CHECK
#include "CatchCompat.h"
#ifdef NEURON_USE_CATCH2_V3
using Catch::Approx;
#endif

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

using namespace neuron;
using namespace neuron::distributed;

namespace {

Topology trn2() { return Topology::of(target::getTarget("trn2")); }

double costNs(Collective c, int64_t bytes, const std::vector<int64_t> &ranks,
              const Topology &t = trn2()) {
  return collectiveCost(t, c, bytes, ranks).durationNs;
}

std::vector<int64_t> firstRanks(int n) {
  std::vector<int64_t> r(n);
  for (int i = 0; i < n; ++i)
    r[i] = i;
  return r;
}

} // namespace

TEST_CASE("the trn2 topology comes from the target file", "[collective]") {
  Topology t = trn2();
  CHECK(t.coresPerChip == 8);
  CHECK(t.chipsPerInstance == 16);
  CHECK(t.cores() == 128);
  CHECK(t.coreBytesPerNs == 368);
  CHECK(t.chipSendBytesPerNs == 512); // half of 1,024 GB/s per chip
  CHECK(t.linkBytesPerNs == 128);     // over 4 links
  CHECK(t.chipOf(7) == 0);
  CHECK(t.chipOf(8) == 1);
}

TEST_CASE("ring all-reduce within a chip: 2(n-1)/n B/bw + 2(n-1) steps",
          "[collective]") {
  Topology t = trn2();
  const int64_t b = int64_t(64) << 20; // large: the ring wins
  for (int n : {2, 4, 8}) {
    CollectiveCost c =
        collectiveCost(t, Collective::AllReduce, b, firstRanks(n));
    CHECK_FALSE(c.crossesChips);
    double want = 2.0 * (n - 1) / n * b / t.coreBytesPerNs +
                  2.0 * (n - 1) * t.coreLatencyNs;
    CHECK(c.durationNs == Approx(want));
    CHECK(c.busBytesPerNs == t.coreBytesPerNs);
  }
  // All-gather and reduce-scatter move half of all-reduce's bytes.
  double ag = costNs(Collective::AllGather, b, firstRanks(4));
  double rs = costNs(Collective::ReduceScatter, b, firstRanks(4));
  CHECK(ag == rs);
  CHECK(ag == Approx(0.75 * b / t.coreBytesPerNs + 3 * t.coreLatencyNs));
  // One rank moves nothing.
  CHECK(costNs(Collective::AllReduce, b, {3}) == 0);
}

TEST_CASE("large messages reach the ring's link peak", "[collective]") {
  Topology t = trn2();
  const int64_t b = int64_t(256) << 20;
  for (int n : {2, 4, 8}) {
    double ns = costNs(Collective::AllReduce, b, firstRanks(n));
    double busBw = 2.0 * (n - 1) / n * b / ns;
    CHECK(busBw >= 0.9 * t.coreBytesPerNs);
    CHECK(busBw <= t.coreBytesPerNs);
  }
}

TEST_CASE("a group that spans chips pays NeuronLink's latency and bandwidth",
          "[collective]") {
  Topology t = trn2();
  const int64_t b = 1 << 20;
  CollectiveCost across = collectiveCost(t, Collective::AllReduce, b, {0, 8});
  CHECK(across.crossesChips);
  double bw = std::min(t.coreBytesPerNs, t.chipSendBytesPerNs);
  CHECK(across.durationNs == Approx(1.0 * b / bw + 2 * t.linkLatencyNs));
  CHECK(across.durationNs > costNs(Collective::AllReduce, b, {0, 1}));
  // Rank order decides the chip: 9 ranks need two chips.
  CHECK_FALSE(
      collectiveCost(t, Collective::Broadcast, b, firstRanks(8)).crossesChips);
  CHECK(
      collectiveCost(t, Collective::Broadcast, b, firstRanks(9)).crossesChips);
  // A point-to-point message between chips uses one link.
  CHECK(costNs(Collective::SendRecv, b, {0, 8}) ==
        Approx(1.0 * b / t.linkBytesPerNs + t.linkLatencyNs));
  CHECK(costNs(Collective::SendRecv, b, {0, 1}) ==
        Approx(1.0 * b / t.coreBytesPerNs + t.coreLatencyNs));
}

TEST_CASE("all-to-all across chips is bound by the chips' NeuronLink share",
          "[collective]") {
  Topology t = trn2();
  const int64_t b = 1 << 24;
  // One chip: each rank sends (n-1)/n of its bytes through its DMA.
  CHECK(costNs(Collective::AllToAll, b, firstRanks(8)) ==
        Approx(7.0 / 8 * b / t.coreBytesPerNs + 7 * t.coreLatencyNs));
  // Two full chips: 8 ranks send half their bytes off the chip.
  double offChip = 8.0 * 8 / 16 * b / t.chipSendBytesPerNs;
  CHECK(costNs(Collective::AllToAll, b, firstRanks(16)) ==
        Approx(offChip + 15 * t.linkLatencyNs));
}

TEST_CASE("broadcast, reduce, gather, scatter and barrier go along trees",
          "[collective]") {
  Topology t = trn2();
  for (Collective c : {Collective::Broadcast, Collective::Reduce})
    CHECK(costNs(c, 4096, firstRanks(4)) ==
          Approx(4096 / t.coreBytesPerNs + 2 * t.coreLatencyNs));
  // The root takes in (or sends out) the other ranks' share.
  for (Collective c : {Collective::Gather, Collective::Scatter})
    CHECK(costNs(c, 4096, firstRanks(4)) ==
          Approx(0.75 * 4096 / t.coreBytesPerNs + 2 * t.coreLatencyNs));
  CHECK(costNs(Collective::Barrier, 0, firstRanks(8)) ==
        Approx(3 * t.coreLatencyNs));
  CHECK(costNs(Collective::Barrier, 0, firstRanks(5)) ==
        Approx(3 * t.coreLatencyNs));
}

TEST_CASE("all-reduce takes a tree for small messages, a ring for large ones",
          "[collective]") {
  Topology t = trn2();
  auto ranks = firstRanks(8);
  CollectiveCost small = collectiveCost(t, Collective::AllReduce, 1024, ranks);
  CHECK(std::string(small.algorithm) == "tree");
  CHECK(small.durationNs ==
        Approx(2 * (1024 / t.coreBytesPerNs + 3 * t.coreLatencyNs)));
  CollectiveCost large =
      collectiveCost(t, Collective::AllReduce, 64 << 20, ranks);
  CHECK(std::string(large.algorithm) == "ring");
  // Two ranks: the ring is never worse.
  CHECK(std::string(
            collectiveCost(t, Collective::AllReduce, 8, {0, 1}).algorithm) ==
        "ring");
  CHECK(std::string(collectiveCost(t, Collective::AllReduce, 8, {3}).algorithm) ==
        "none");
}

TEST_CASE("trn3's faster DMA and links make collectives faster",
          "[collective]") {
  Topology t3 = Topology::of(target::getTarget("trn3"));
  const int64_t b = int64_t(64) << 20;
  for (auto ranks : {firstRanks(8), std::vector<int64_t>{0, 8, 16, 24}})
    CHECK(costNs(Collective::AllReduce, b, ranks, t3) <
          costNs(Collective::AllReduce, b, ranks));
}

TEST_CASE("ranks outside the instance and malformed groups are refused",
          "[collective]") {
  Topology t = trn2();
  CHECK_THROWS_AS(collectiveCost(t, Collective::AllReduce, 4, {0, 128}),
                  std::invalid_argument);
  CHECK_THROWS_AS(collectiveCost(t, Collective::AllReduce, 4, {1, 1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(collectiveCost(t, Collective::AllReduce, -1, {0, 1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(collectiveCost(t, Collective::SendRecv, 4, {0, 1, 2}),
                  std::invalid_argument);
  CHECK_THROWS_AS(parseCollective("all_reduce_twice"), std::invalid_argument);
  CHECK(parseCollective("reduce_scatter") == Collective::ReduceScatter);
}

// --- the backend over a fake transport --------------------------------------

namespace {

/// A finished transport Work, or one whose wait() fails like a lost peer.
class FakeWork : public c10d::Work {
public:
  FakeWork(std::vector<at::Tensor> outputs, bool fail)
      : outputs(std::move(outputs)), fail(fail) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return !fail; }
  bool wait(std::chrono::milliseconds) override {
    if (fail)
      throw std::runtime_error("Connection closed by peer");
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(outputs));
    return f;
  }
  std::vector<at::Tensor> outputs;
  bool fail;
};

/// Rank 0 of 2 whose peer always contributes `peer` to a sum. It sees the
/// CPU aliases, and checks they are CPU tensors.
class FakeTransport : public c10d::Backend {
public:
  explicit FakeTransport(float peer, bool fail = false)
      : c10d::Backend(0, 2), peer(peer), fail(fail) {}
  const std::string getBackendName() const override { return "fake"; }
  c10::intrusive_ptr<c10d::Work>
  allreduce(std::vector<at::Tensor> &tensors,
            const c10d::AllreduceOptions &opts) override {
    REQUIRE(opts.reduceOp.op_ == c10d::ReduceOp::SUM);
    if (refuse)
      throw std::invalid_argument("the transport refuses this tensor");
    for (at::Tensor &t : tensors) {
      REQUIRE(t.device().is_cpu());
      t.add_(peer);
    }
    return c10::make_intrusive<FakeWork>(tensors, fail);
  }
  float peer;
  bool fail;
  bool refuse = false;
};

c10::intrusive_ptr<NeuronBackend> backendOver(float peer, bool fail = false) {
  return c10::make_intrusive<NeuronBackend>(
      c10::make_intrusive<FakeTransport>(peer, fail), 0, 2,
      std::vector<int64_t>{}, trn2(), &device::collectiveTimeline(),
      std::chrono::milliseconds(1000));
}

} // namespace

TEST_CASE("the neuron backend reduces into neuron tensors and charges the "
          "stream",
          "[collective]") {
  if (c10::get_privateuse1_backend() != "neuron")
    c10::register_privateuse1_backend("neuron");
  const c10::Device neuron(device::kDeviceType, 0);
  at::Tensor x = at::arange(8, at::kFloat).to(neuron);
  auto backend = backendOver(10.0f);
  c10::Stream stream = device::currentStream(0);
  // Earlier tests' collectives may end later than this stream's work.
  device::streamWaitUntil(
      stream, device::streamCursorNs(device::collectiveStream(0)));
  double before = device::streamCursorNs(stream);

  std::vector<at::Tensor> tensors{x};
  c10d::AllreduceOptions avg;
  avg.reduceOp = c10d::ReduceOp(c10d::ReduceOp::AVG);
  auto work = backend->allreduce(tensors, avg);
  work->wait();
  double after = device::streamCursorNs(stream);
  // (x + 10) / 2 in place, on the device.
  at::Tensor want = (at::arange(8, at::kFloat) + 10) / 2;
  CHECK(at::equal(x.cpu(), want));
  REQUIRE(work->result().size() == 1);
  CHECK(work->result()[0].device() == neuron);
  CHECK(work->getFuture()->value().toTensorVector()[0].is_same(x));
  // Waiting again or reading the future does not divide twice.
  work->wait();
  CHECK(at::equal(x.cpu(), want));

  double modeled =
      collectiveCost(trn2(), Collective::AllReduce, 32, {0, 1}).durationNs;
  CHECK(after - before == Approx(modeled));
}

TEST_CASE("the neuron backend names the collective when the transport fails",
          "[collective]") {
  const c10::Device neuron(device::kDeviceType, 0);
  std::vector<at::Tensor> tensors{at::ones({4}, at::kFloat).to(neuron)};
  auto work = backendOver(1.0f, /*fail=*/true)
                  ->allreduce(tensors, c10d::AllreduceOptions());
  try {
    work->wait();
    FAIL("wait() should have thrown");
  } catch (const c10::DistBackendError &e) {
    std::string what = e.what();
    CHECK(what.find("neuron all_reduce on rank 0 of 2 failed") !=
          std::string::npos);
    CHECK(what.find("Connection closed by peer") != std::string::npos);
  }
  // A collective the transport refuses is not charged.
  auto refusing = c10::make_intrusive<FakeTransport>(1.0f);
  refusing->refuse = true;
  auto backend = c10::make_intrusive<NeuronBackend>(
      refusing, 0, 2, std::vector<int64_t>{}, trn2(), &device::collectiveTimeline(),
      std::chrono::milliseconds(1000));
  double before = device::streamCursorNs(device::currentStream(0));
  CHECK_THROWS_AS(backend->allreduce(tensors, {}), std::invalid_argument);
  CHECK(device::streamCursorNs(device::currentStream(0)) == before);
  // CPU tensors are not the neuron backend's.
  std::vector<at::Tensor> cpu{at::ones({4})};
  CHECK_THROWS_AS(backendOver(1.0f)->allreduce(cpu, {}), c10::Error);
}

TEST_CASE("collectives queue on the collective stream and overlap compute",
          "[collective]") {
  using namespace neuron::device;
  c10::Stream a = newStream(0), b = newStream(0);
  streamWaitUntil(a, streamCursorNs(collectiveStream(0)));
  double start = streamCursorNs(a);
  Work collective{5e3, {{"neuronlink", 5e3}}};
  // A collective starts after the work its stream issued before it; the
  // stream goes on without it, so a kernel issued next overlaps it.
  c10::Stream previous = exchangeStream(a);
  auto [s1, e1] = placeCollective(0, "all_reduce", 1024, collective);
  CHECK(s1 == start);
  CHECK(streamCursorNs(a) == start);
  auto [s2, e2] = placeWork(a, {4e3, {{"tensor", 4e3}}});
  CHECK(s2 == start);
  // A second collective, from another stream, queues behind the first.
  exchangeStream(b);
  auto [s3, e3] = placeCollective(0, "all_gather", 1024, collective);
  exchangeStream(previous);
  CHECK(s3 == e1);
  CHECK(e3 - start == Approx(10e3));
  // Waiting for it moves the waiting stream to its end.
  streamWaitUntil(a, e3);
  CHECK(streamCursorNs(a) == e3);
}

TEST_CASE("a collective's wait and future hold back only their waiter",
          "[collective]") {
  using namespace neuron::device;
  const c10::Device neuron(kDeviceType, 0);
  std::vector<at::Tensor> tensors{at::ones({1024}, at::kFloat).to(neuron)};
  auto backend = backendOver(1.0f);
  c10::Stream stream = currentStream(0);
  streamWaitUntil(stream, streamCursorNs(collectiveStream(0)));
  double before = streamCursorNs(stream);
  double modeled =
      collectiveCost(trn2(), Collective::AllReduce, 4096, {0, 1}).durationNs;

  auto work = backend->allreduce(tensors, {});
  CHECK(streamCursorNs(stream) == before); // issued, not waited for
  // A c10 future waits through its device events, as DDP's reducer does.
  auto future = work->getFuture();
  future->wait();
  CHECK(streamCursorNs(stream) == Approx(before + modeled));
  CHECK(future->value().toTensorVector()[0].is_same(tensors[0]));

  auto second = backend->allreduce(tensors, {});
  second->wait();
  CHECK(streamCursorNs(stream) == Approx(before + 2 * modeled));
  CHECK(at::equal(tensors[0].cpu(), at::full({1024}, 3.0f)));
}
