//===- CollectiveCost.h - Modeled time of a collective ----------*- C++ -*-===//
//
// How long a collective would take on the instance's NeuronCores, from the
// target's topology figures (cores per chip, chips per instance, the cores'
// DMA path within a chip, NeuronLink between chips). Rank r of the process
// group sits on core r % cores_per_chip of chip r / cores_per_chip, so the
// model knows whether a group stays on one chip.
//
// The algorithms are those of the collective engines: rings, where each of
// the n ranks sends to the next one in rank order, one chunk per step, and
// for small messages trees (two binary trees each carrying half the bytes, as
// NCCL's double binary tree: B/bw per pass, ceil(log2 n) steps deep). A step
// goes as fast as its slowest hop: within a chip the sending core's DMA
// engines (core_to_core_bytes_per_ns); across chips also the chip's
// NeuronLink (half of neuronlink_bytes_per_ns_per_chip out of each chip,
// spread over its links). With B the bytes, bw that hop bandwidth and
// d = ceil(log2 n):
//   all_reduce      the cheaper of a ring, 2(n-1) steps of B/n:
//                     2(n-1)/n * B/bw + 2(n-1) * latency,
//                   and a tree (reduce up, broadcast down):
//                     2 * (B/bw + d * latency)
//   all_gather      ring, (n-1) steps of B/n: (n-1)/n * B/bw + (n-1) * latency
//                   (B: the gathered output)
//   reduce_scatter  as all_gather, B the input that is scattered
//   broadcast       tree: B/bw + d * latency; reduce likewise, up the tree
//   gather          the root takes in (n-1)/n of B (the gathered output)
//                   through its DMA along a tree: (n-1)/n * B/bw + d * latency;
//                   scatter likewise, B the scattered input
//   all_to_all      every rank sends (n-1)/n of its B: the larger of its own
//                   DMA time and its chip's share of the NeuronLink traffic,
//                   + (n-1) * latency
//   send / recv     B over one hop (one NeuronLink link across chips)
//   barrier         a dissemination barrier: d * latency
// where latency is a step's fixed cost: core_to_core_latency_ns within a
// chip, neuronlink_latency_ns when the group spans chips. It depends on the
// runtime's target only (no libtorch, no MLIR), so the `neuron` process-group
// backend (eager collectives) and the timing model (collective instructions
// of compiled kernels) charge the same time.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_TIMING_COLLECTIVECOST_H
#define NEURON_RUNTIME_TIMING_COLLECTIVECOST_H

#include "runtime/program/Program.h"
#include "runtime/target/Target.h"

#include <cstdint>
#include <string>
#include <vector>

namespace neuron::distributed {

/// The collectives: runtime/program/InstructionSet.def.
using runtime::Collective;

/// "all_reduce", "all_gather", ...: the names profiles show.
using runtime::collectiveName;
/// The inverse of collectiveName; throws std::invalid_argument.
Collective parseCollective(const std::string &name);

/// The target's topology figures, read once.
struct Topology {
  int coresPerChip = 0;
  int chipsPerInstance = 0;
  double coreBytesPerNs = 0;     ///< one core to another of its chip
  double coreLatencyNs = 0;      ///< a step within a chip
  double chipSendBytesPerNs = 0; ///< out of one chip, all links
  double linkBytesPerNs = 0;     ///< one link, one direction
  double linkLatencyNs = 0;      ///< a step across chips

  static Topology of(const target::Target &t);
  int cores() const { return coresPerChip * chipsPerInstance; }
  int chipOf(int64_t rank) const {
    return static_cast<int>(rank / coresPerChip);
  }
};

struct CollectiveCost {
  double durationNs = 0;
  /// The ring's bottleneck hop (bytes/ns): the bus bandwidth that large
  /// messages approach (the link peak of benchmarks/collectives.py).
  double busBytesPerNs = 0;
  bool crossesChips = false;
  /// "ring", "tree", "direct" (all_to_all, send/recv) or "none" (one rank).
  const char *algorithm = "none";
};

/// The modeled cost of `c` moving `bytes` (see above for what B is) among
/// `ranks`, the group's ranks in the instance (global ranks, in group
/// order; for send/recv the sender and the receiver). Throws
/// std::invalid_argument for a rank outside the instance, a repeated rank,
/// a send/recv not between two ranks, or negative bytes.
CollectiveCost collectiveCost(const Topology &topology, Collective c,
                              int64_t bytes, const std::vector<int64_t> &ranks);

} // namespace neuron::distributed

#endif // NEURON_RUNTIME_TIMING_COLLECTIVECOST_H
