//===- TimingModel.h - Static timeline of a kernel program ------*- C++ -*-===//
//
// How long one Trainium2/Trainium3 NeuronCore would take to run a kernel
// program, and why. Numerics live in exec/Executor; this file only computes
// time (DESIGN.md: "numerics and time are separate concerns").
//
// The program has no data-dependent control flow, so its timeline is fixed:
// simulate() walks every dynamic instruction instance once, in program order
// (loops are unrolled logically; nothing is materialized unless events are
// requested), and schedules it on the core's resources:
//
//   * one in-order queue per sequencer: TensorE, VectorE, ScalarE, GpSimdE
//     and SyncE (SyncE only triggers DMAs);
//   * the target's DMA engines (16 per core). A transfer is split over the
//     engines by SBUF partition (8 partitions per engine, so a 4-partition
//     load uses one engine). Each engine is work-conserving: a transfer uses
//     every idle moment of its engines from the time it is ready, with
//     priority by program order (a stand-in for the round-robin arbitration
//     between an engine's 16 queues);
//   * the core's share of HBM bandwidth (chip bandwidth / cores sharing it),
//     booked the same way, so a transfer finishes no earlier than its HBM
//     bytes allow (HBM-to-HBM copies count their bytes twice).
//
// Costs (trainium.md sections 2 and 6, figures from the target file; no
// number in the code is a hardware figure):
//
//   * TensorE matmul: II = max(min(64, M), N) cycles at the TensorE clock
//     (x4 when an input is fp32). LoadStationary (ceil(M / 4) cycles) runs in
//     the background during the previous matmul; the matmul waits for it.
//     Results reach PSUM a fixed pipeline latency after the II. Power
//     throttling: TensorE starts at 50% throughput and ramps linearly to 100%
//     over 3 us of activity; when its utilization over the trailing 3 us
//     window drops below 50% the throttle re-engages.
//   * VectorE/ScalarE/GpSimd: max(64 cycles, passes * N / speedup) with N the
//     elements per partition, passes the streamed input tensors (2 for
//     tensor_tensor and scalar_tensor_tensor, 1 when one input is in PSUM
//     or all are 16-bit in SBUF; [P, 1] columns are per-partition registers
//     and cost nothing, so an activation's scale column, bias and row sums
//     are free [D S5]),
//     perf-mode speedups for 16-bit tensor_copy/tensor_scalar, x2 for an
//     innermost stride above 16 B, plus a static overhead when the
//     instruction reads the result of the instruction just before it on the
//     same engine, plus an activation-table load when ScalarE switches
//     function tables. Reading PSUM costs the same as reading SBUF (PSUM
//     evictions are ordinary VectorE/ScalarE instructions; their time is
//     reported separately as psumEvictionNs).
//   * DMA: the issuing queue spends a trigger cost (descriptors are assumed
//     precomputed, since programs are static; GpSimd-issued copies and all
//     gathers pay software descriptor generation on GpSimd; a "dge": "hwdge"
//     copy waits dma_hwdge_issue_ns for the hardware DGE, holding SyncE's
//     queue that long but not ScalarE's, whose data path is separate), data
//     starts a fixed latency later, and each engine moves its share at the
//     per-engine bandwidth plus a per-descriptor overhead that is hidden for
//     large descriptors (256 B/partition ~28%, 2 KiB ~80%, 4 KiB ~92%,
//     >= 8 KiB 100% of peak; docs/FIDELITY.md). DMA transposes run at the
//     documented efficiency.
//   * Collective (all_reduce, all_gather, reduce_scatter among a process
//     group's ranks): the issuing queue spends a DMA trigger, then the
//     transfer occupies the core's collective path ("neuronlink", one
//     collective at a time, in program order) for the ring cost of
//     CollectiveCost.h, the same figure eager collectives are charged. Like
//     a DMA it completes asynchronously: instructions that do not depend on
//     it run meanwhile, which is how compute overlaps communication. Its
//     HBM and DMA-engine traffic is not booked against the core's (a
//     documented limit: it would slow overlapping loads slightly).
//
// Dependencies. Every dynamic instance's accesses are recorded as bounding
// boxes of its views (rows x columns: exact for row/column tiles,
// conservative otherwise), keyed by buffer, or, for on-chip buffers with an
// "address", by space with columns in bytes of the partition, so buffers
// that share bytes (of any dtypes) conflict. Against these records an
// instruction has a data dependence on every earlier instruction (program
// order) that wrote bytes it reads (RAW), or read or wrote bytes it writes
// (WAR, WAW). An activation with reduce_res writes two operands; both are
// writes here. What the model does with them depends on the program's sync:
//
//   * derived (no "sync" field): the dependences are the waits, a stand-in
//     for the semaphores a compiler would insert. A wait on another queue's
//     instruction adds the target's semaphore latency; a wait on the same
//     queue is free (queues are in order).
//   * explicit ("sync": "explicit"): only each instruction's "waits" delay
//     it: for every listed instruction k, until every earlier instance of k
//     is done (its end when k is a compute instruction on the same queue,
//     else its ready time, a DMA's completion, plus the semaphore latency).
//     A matmul's LoadStationary waits for the same. A checker then demands
//     that the schedule has no race: no instance starts (a DMA: triggers)
//     before every conflicting earlier access is done (a write visible, a
//     read finished), unless both are compute instructions of one in-order
//     queue. Ordering may come from the instruction's own waits or through
//     other instructions' (the compiler drops waits others imply). A race
//     is an Error ("missing synchronisation: ..."). The check is on the
//     modeled schedule: a missing wait whose race this timeline happens
//     not to contain goes unreported, but a reported time never rests on
//     one.
//
// Records that a newer access makes redundant are dropped (waiting for it
// waits at least as long). When a key accumulates many disjoint records the
// oldest are merged conservatively: derived sync may then wait falsely on
// long-finished work, and the checker skips the summaries (their union
// boxes and latest times over-approximate). Records are kept per buffer;
// an addressed buffer's accesses are compared with the records of every
// buffer sharing its bytes. DMA and HBM calendars likewise remember only their
// recent busy intervals and never place work before the forgotten ones. Records
// also drive the dependent-instruction overhead in both modes.
//
// Not modelled yet (documented limits): port conflicts (VectorE and ScalarE
// on one PSUM bank, VectorE perf mode sharing the SBUF bus with GpSimd),
// TensorE row/column tiling and Trn3 background transposes, DMA QoS,
// contention for the two hardware DGE blocks, instruction fetch. Estimates to
// revisit: fp32 VectorE ops stream one element per lane per cycle
// (trainium.md 6.3 and the 6.5 eviction arithmetic, not the 256 el/cycle peak
// figure); divide costs like any ALU op; every activation function except
// identity/neg/abs/relu/square is its own table set; HBM-to-HBM copies are
// split by leading-dim rows (a one-row copy uses one engine).
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_TIMING_TIMINGMODEL_H
#define NEURON_RUNTIME_TIMING_TIMINGMODEL_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace neuron::target {
struct Target;
} // namespace neuron::target

namespace neuron::runtime {

class Program;

/// A resource that executes timed work: the sequencer queues of the four
/// compute engines and SyncE (same order as Engine), the DMA engines, and
/// the collective path to the other ranks (collective instructions).
enum class TimingUnit : uint8_t {
  Tensor,
  Vector,
  Scalar,
  GpSimd,
  Sync,
  Dma,
  Neuronlink
};
inline constexpr int kNumTimingUnits = 7;

/// "tensor", "vector", "scalar", "gpsimd", "sync", "dma" or "neuronlink".
const char *timingUnitName(TimingUnit unit);

/// One scheduled piece of work of one dynamic instruction instance. Compute
/// instructions have one event. A collective has a trigger event on its
/// issuing queue and a transfer event on "neuronlink". A DMA has a trigger
/// event on its issuing queue, a descriptor-generation event on GpSimd when
/// software DGE is used, and a transfer event on the DMA engines (start: first
/// byte on any engine; end: the last engine done, i.e. the completion
/// semaphore).
struct InstructionTiming {
  /// Static instruction index: position among the program's instructions in
  /// pre-order (loops not counted), as Program::numInstructions counts them.
  int64_t node = 0;
  TimingUnit unit = TimingUnit::Tensor;
  /// Dma: first DMA engine of the transfer; otherwise 0.
  int queue = 0;
  /// Dma: number of DMA engines the transfer uses; otherwise 1.
  int queueCount = 1;
  double startNs = 0;
  double endNs = 0;
  /// Index into Program::locations (the Python line), or -1.
  int64_t loc = -1;
};

struct Timeline {
  /// Device time from the first instruction's issue to the last completion.
  double totalNs = 0;
  /// Busy time per resource: "tensor", "vector", "scalar", "gpsimd", "sync"
  /// (queue occupancy), "dma" (the busiest DMA engine), "dma_avg" (mean over
  /// the DMA engines), "hbm" (HBM bytes / the core's HBM bandwidth) and
  /// "neuronlink" (collective instructions in flight).
  std::map<std::string, double> engineBusyNs;
  /// The resource with the most busy time; "latency" when even that one is
  /// busy less than the target's timing_bound_min_utilization of totalNs
  /// (the run is bound by dependencies and fixed latencies).
  std::string bound;
  /// Matmul FLOPs (2 * K * M * N per instruction).
  double flops = 0;
  double hbmBytesRead = 0;
  double hbmBytesWritten = 0;
  double hbmBytes = 0; // read + written
  /// Bytes moved by DMA transfers (any memory to any memory).
  double dmaBytes = 0;
  /// Dynamic instruction instances simulated.
  int64_t instructions = 0;
  /// VectorE/ScalarE time spent in instructions that read PSUM.
  double psumEvictionNs = 0;
  /// TensorE time lost to power throttling (included in its busy time).
  double tensorThrottleNs = 0;
  /// Time spent loading ScalarE activation tables (included in its busy).
  double activationTableNs = 0;
  /// Every event in program order; filled only when requested.
  std::vector<InstructionTiming> events;
};

/// Computes the timeline of `program` on `target`. Verifies the program
/// first (throws Error if it is invalid); throws Error if the target lacks a
/// figure the model needs. Pure function of its inputs: callers cache the
/// result (a run that does not ask for a profile need not call it).
Timeline simulate(const Program &program, const neuron::target::Target &target,
                  bool keepEvents = false);

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_TIMING_TIMINGMODEL_H
