//===- CollectiveCost.cpp - Modeled time of a collective ------------------===//

#include "runtime/timing/CollectiveCost.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

namespace neuron::distributed {

Collective parseCollective(const std::string &name) {
  if (std::optional<Collective> c = runtime::parseCollective(name))
    return *c;
  throw std::invalid_argument("unknown collective '" + name + "'");
}

Topology Topology::of(const target::Target &t) {
  Topology topo;
  topo.coresPerChip = t.coresPerChip;
  topo.chipsPerInstance = static_cast<int>(t.value("chips_per_instance"));
  topo.coreBytesPerNs = t.value("core_to_core_bytes_per_ns");
  topo.coreLatencyNs = t.value("core_to_core_latency_ns");
  double chip = t.value("neuronlink_bytes_per_ns_per_chip");
  // The chip's figure counts both directions: half of it leaves the chip.
  topo.chipSendBytesPerNs = chip / 2;
  topo.linkBytesPerNs =
      topo.chipSendBytesPerNs / t.value("neuronlink_links_per_chip");
  topo.linkLatencyNs = t.value("neuronlink_latency_ns");
  if (topo.coresPerChip <= 0 || topo.chipsPerInstance <= 0 ||
      !(topo.coreBytesPerNs > 0) || !(topo.linkBytesPerNs > 0) ||
      topo.coreLatencyNs < 0 || topo.linkLatencyNs < 0)
    throw std::invalid_argument("target '" + t.name +
                                "' has no usable collective topology");
  return topo;
}

CollectiveCost collectiveCost(const Topology &topo, Collective c, int64_t bytes,
                              const std::vector<int64_t> &ranks) {
  if (bytes < 0)
    throw std::invalid_argument("a collective cannot move negative bytes");
  if (ranks.empty())
    throw std::invalid_argument("a collective needs at least one rank");
  if (c == Collective::SendRecv && ranks.size() != 2)
    throw std::invalid_argument(
        "send/recv is modeled between two ranks, the sender and the receiver");
  std::set<int64_t> seen;
  std::map<int, int64_t> ranksOnChip;
  for (int64_t r : ranks) {
    if (r < 0 || r >= topo.cores())
      throw std::invalid_argument(
          "rank " + std::to_string(r) + " is outside the instance's " +
          std::to_string(topo.cores()) + " NeuronCores (" +
          std::to_string(topo.chipsPerInstance) + " chips of " +
          std::to_string(topo.coresPerChip) +
          "): collectives across instances are not modeled");
    if (!seen.insert(r).second)
      throw std::invalid_argument("rank " + std::to_string(r) +
                                  " appears twice in the group");
    ++ranksOnChip[topo.chipOf(r)];
  }

  CollectiveCost cost;
  cost.crossesChips = ranksOnChip.size() > 1;
  auto n = static_cast<double>(ranks.size());
  auto b = static_cast<double>(bytes);
  // A ring step goes at its slowest hop: a core's DMA engines, and the
  // chip's NeuronLink once the ring leaves the chip (one rank per chip sends
  // across at each step, so the chip's links carry one chunk at a time).
  double bw = topo.coreBytesPerNs;
  if (cost.crossesChips)
    bw = std::min(bw, topo.chipSendBytesPerNs);
  double latency = cost.crossesChips ? topo.linkLatencyNs : topo.coreLatencyNs;
  cost.busBytesPerNs = bw;
  if (ranks.size() == 1) // nothing leaves the core
    return cost;

  // A tree is ceil(log2 n) steps deep.
  double depth = std::ceil(std::log2(n));
  auto use = [&cost](const char *algorithm, double ns) {
    cost.algorithm = algorithm;
    cost.durationNs = ns;
  };
  switch (c) {
  case Collective::AllReduce: {
    double ring = 2 * (n - 1) / n * b / bw + 2 * (n - 1) * latency;
    double tree = 2 * (b / bw + depth * latency);
    if (tree < ring)
      use("tree", tree);
    else
      use("ring", ring);
    break;
  }
  case Collective::AllGather:
  case Collective::ReduceScatter:
    use("ring", (n - 1) / n * b / bw + (n - 1) * latency);
    break;
  case Collective::Broadcast:
  case Collective::Reduce:
    use("tree", b / bw + depth * latency);
    break;
  case Collective::Gather:
  case Collective::Scatter:
    use("tree", (n - 1) / n * b / bw + depth * latency);
    break;
  case Collective::AllToAll: {
    double own = (n - 1) / n * b / topo.coreBytesPerNs;
    double offChip = 0;
    for (const auto &[chip, m] : ranksOnChip) {
      auto here = static_cast<double>(m);
      offChip = std::max(offChip,
                         here * (n - here) / n * b / topo.chipSendBytesPerNs);
    }
    use("direct", std::max(own, offChip) + (n - 1) * latency);
    break;
  }
  case Collective::SendRecv: {
    // One hop: a single NeuronLink link when the peers are on two chips.
    double hop = cost.crossesChips
                     ? std::min(topo.coreBytesPerNs, topo.linkBytesPerNs)
                     : topo.coreBytesPerNs;
    cost.busBytesPerNs = hop;
    use("direct", b / hop + latency);
    break;
  }
  case Collective::Barrier:
    use("tree", depth * latency);
    break;
  }
  return cost;
}

} // namespace neuron::distributed
