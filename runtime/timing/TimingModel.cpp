//===- TimingModel.cpp - Static timeline of a kernel program --------------===//
//
// Construction (Model) turns every static instruction into a StaticInst:
// its resources, its cost in ns and the affine form of each operand's
// bounding box. simulate() then walks the flattened loop tree once and, per
// dynamic instance, evaluates the boxes, finds the dependences against the
// access records (per buffer, or per space for addressed on-chip buffers),
// waits for them (derived sync) or checks that the program's waits cover
// them (explicit sync), places the work on its queues and records its
// accesses. See TimingModel.h for the model itself.
//
//===----------------------------------------------------------------------===//

#include "runtime/timing/TimingModel.h"
#include "runtime/program/Program.h"
#include "runtime/target/Cost.h"
#include "runtime/target/Target.h"
#include "runtime/timing/CollectiveCost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace neuron::runtime {

// An instruction's queue is the timing unit of its engine.
#define NEURON_ENGINE(Name, Spelling)                                          \
  static_assert(static_cast<int>(TimingUnit::Name) ==                          \
                static_cast<int>(Engine::Name));
#include "runtime/program/InstructionSet.def"

const char *timingUnitName(TimingUnit unit) {
  switch (unit) {
  case TimingUnit::Tensor:
    return "tensor";
  case TimingUnit::Vector:
    return "vector";
  case TimingUnit::Scalar:
    return "scalar";
  case TimingUnit::GpSimd:
    return "gpsimd";
  case TimingUnit::Sync:
    return "sync";
  case TimingUnit::Dma:
    return "dma";
  case TimingUnit::Neuronlink:
    return "neuronlink";
  }
  return "?";
}

namespace {

using neuron::target::ComputeShape;
using neuron::target::CostModel;
using neuron::target::Target;

/// Most DMA engines per core the model supports (bounds stack arrays).
constexpr int kMaxDmaEngines = 64;

//===----------------------------------------------------------------------===//
// Figures
//===----------------------------------------------------------------------===//

/// Every figure the model uses, read once from the target (trn2.json,
/// trn3.json carry the values and their sources): an instruction's own cost
/// from the cost model (runtime/target/Cost.h), the rest (queues, HBM,
/// throttling) here.
struct Params {
  CostModel cost;
  int partitions = 0;
  double clockGHz[kNumTimingUnits] = {};

  // TensorE.
  double throttleWindowNs = 0;
  double throttleStartUtilization = 0;
  double throttleRampNs = 0;
  double throttleReengageUtilization = 0;

  // ScalarE.
  double activationTableSwitchNs = 0;

  // DMA and HBM.
  int dmaEngines = 0;
  int partitionsPerDmaEngine = 0;
  double dmaBytesPerNs = 0;
  double dmaFixedLatencyNs = 0;
  double dmaTriggerNs = 0;
  double hwdgeIssueNs = 0;
  double hbmBytesPerNs = 0;

  double semaphoreLatencyNs = 0;
  double boundMinUtilization = 0;

  explicit Params(const Target &t) : cost(t) {
    auto positive = [&](const char *key) {
      double v = t.value(key);
      if (!(v > 0))
        throw Error("target '" + t.name + "': figure '" + key +
                    "' must be positive for the timing model");
      return v;
    };
    auto nonNegative = [&](const char *key) {
      double v = t.value(key);
      if (!(v >= 0))
        throw Error("target '" + t.name + "': figure '" + key +
                    "' must not be negative for the timing model");
      return v;
    };
    partitions = t.partitions;
    clockGHz[int(TimingUnit::Tensor)] = t.tensorClockGHz;
    clockGHz[int(TimingUnit::Vector)] = t.vectorClockGHz;
    clockGHz[int(TimingUnit::Scalar)] = t.scalarClockGHz;
    clockGHz[int(TimingUnit::GpSimd)] = t.gpsimdClockGHz;
    clockGHz[int(TimingUnit::Sync)] = t.syncClockGHz;

    throttleWindowNs = positive("tensor_throttle_window_ns");
    throttleStartUtilization = positive("tensor_throttle_start_utilization");
    throttleRampNs = nonNegative("tensor_throttle_ramp_ns");
    throttleReengageUtilization =
        nonNegative("tensor_throttle_reengage_utilization");
    if (throttleStartUtilization > 1)
      throw Error("target '" + t.name +
                  "': tensor_throttle_start_utilization must be <= 1");

    activationTableSwitchNs = nonNegative("activation_table_switch_ns");

    dmaEngines = t.dmaEngines;
    partitionsPerDmaEngine =
        static_cast<int>(positive("dma_partitions_per_engine"));
    if (dmaEngines < 1 || partitionsPerDmaEngine < 1)
      throw Error("target '" + t.name +
                  "': dma_engines and dma_partitions_per_engine must be >= 1");
    if (dmaEngines > kMaxDmaEngines)
      throw Error("target '" + t.name +
                  "': the timing model supports at most " +
                  std::to_string(kMaxDmaEngines) + " DMA engines");
    dmaBytesPerNs = t.dmaBytesPerNsPerEngine;
    dmaFixedLatencyNs = nonNegative("dma_fixed_latency_ns");
    dmaTriggerNs = nonNegative("dma_trigger_ns");
    hwdgeIssueNs = nonNegative("dma_hwdge_issue_ns");
    hbmBytesPerNs = t.hbmChipBytesPerNs / positive("hbm_sharing_cores");

    semaphoreLatencyNs = nonNegative("semaphore_latency_ns");
    boundMinUtilization = nonNegative("timing_bound_min_utilization");
  }

  double cyclesToNs(TimingUnit unit, double cycles) const {
    return cycles / clockGHz[int(unit)];
  }
};

//===----------------------------------------------------------------------===//
// Access boxes and records
//===----------------------------------------------------------------------===//

/// A rectangle of a buffer seen as rows x columns (a row is one partition of
/// an on-chip buffer, one run of the innermost dim in HBM),
/// and the span [l0, l1] of the buffer's flattened elements (bytes when
/// addressed) the access reaches, which is what separates views that wrap
/// rows. Spans compare only within one buffer. In HBM the rows may be every
/// rs-th one from r0 (a view of interleaved rows, as nisa-insert-sync sees
/// it: one query head's rows of a [B, L, H, D] result).
struct Box {
  int64_t r0, r1, c0, c1; // inclusive
  int64_t l0, l1;         // inclusive
  int64_t rs = 1;         // row step
  /// In HBM, the same rectangle over rows of the buffer's last two dims
  /// (as nisa-insert-sync also compares them: a block of channels and whole
  /// rows of H of a [N, O, H, W] result), where the view has one.
  bool plane = false;
  int64_t pr0 = 0, pr1 = 0, pc0 = 0, pc1 = 0;
  int64_t prs = 1; // plane row step, as rs
};

inline bool planesApart(const Box &a, const Box &b) {
  return a.plane && b.plane &&
         (a.pr1 < b.pr0 || b.pr1 < a.pr0 || a.pc1 < b.pc0 || b.pc1 < a.pc0 ||
          (a.prs > 1 && a.prs == b.prs && (a.pr0 - b.pr0) % a.prs != 0));
}

/// Whether `a` and `b` have rows in common: always, unless both step over
/// rows alike from different phases.
inline bool rowsInterleave(const Box &a, const Box &b) {
  return a.rs > 1 && a.rs == b.rs && (a.r0 - b.r0) % a.rs != 0;
}

inline bool overlaps(const Box &a, const Box &b, bool sameBuffer) {
  return a.r0 <= b.r1 && b.r0 <= a.r1 && a.c0 <= b.c1 && b.c0 <= a.c1 &&
         (!sameBuffer || (a.l0 <= b.l1 && b.l0 <= a.l1)) &&
         !rowsInterleave(a, b) && !planesApart(a, b);
}

inline bool containsBox(const Box &outer, const Box &inner) {
  return outer.r0 <= inner.r0 && inner.r1 <= outer.r1 && outer.c0 <= inner.c0 &&
         inner.c1 <= outer.c1 && outer.l0 <= inner.l0 && inner.l1 <= outer.l1 &&
         (outer.rs == 1 ||
          (inner.rs == outer.rs && (inner.r0 - outer.r0) % outer.rs == 0)) &&
         (!outer.plane ||
          (inner.plane && outer.pr0 <= inner.pr0 && inner.pr1 <= outer.pr1 &&
           outer.pc0 <= inner.pc0 && inner.pc1 <= outer.pc1 &&
           (outer.prs == 1 || (inner.prs == outer.prs &&
                               (inner.pr0 - outer.pr0) % outer.prs == 0))));
}

inline Box unionBox(const Box &a, const Box &b) {
  bool samePhase = a.rs == b.rs && (a.r0 - b.r0) % a.rs == 0;
  Box u{std::min(a.r0, b.r0), std::max(a.r1, b.r1), std::min(a.c0, b.c0),
        std::max(a.c1, b.c1), std::min(a.l0, b.l0), std::max(a.l1, b.l1),
        samePhase ? a.rs : 1};
  if (a.plane && b.plane) {
    u.plane = true;
    u.pr0 = std::min(a.pr0, b.pr0);
    u.pr1 = std::max(a.pr1, b.pr1);
    u.pc0 = std::min(a.pc0, b.pc0);
    u.pc1 = std::max(a.pc1, b.pc1);
    u.prs = a.prs == b.prs && (a.pr0 - b.pr0) % a.prs == 0 ? a.prs : 1;
  }
  return u;
}

constexpr uint8_t kMergedUnit = 0xff; // summary of merged records

/// One earlier read or write of a buffer region (of an on-chip space, for
/// addressed buffers).
struct Access {
  Box box;
  double end;   // the accessing instruction left its queue
  double ready; // its result is visible (end + pipeline latency)
  uint64_t seq; // dynamic instance number (0 for merged summaries)
  int32_t node; // static instruction index (-1 for merged summaries)
  uint8_t unit; // TimingUnit, or kMergedUnit
  bool write;
  /// A disjoint scatter's rows: never another disjoint scatter's.
  bool disjointRows = false;
};

/// Most events reserved up front (about 1 GB of InstructionTiming).
constexpr double kMaxReservedEvents = 2e7;

/// Records per key beyond which the oldest half is merged. Not a hardware
/// figure: it bounds the model's own work per instruction.
constexpr size_t kMaxRecordsPerBuffer = 48;

//===----------------------------------------------------------------------===//
// Busy calendars (DMA engines, HBM)
//===----------------------------------------------------------------------===//

/// Busy intervals of one resource, sorted and disjoint. A job ready at some
/// time fills every idle gap from then on until its work is done (it may be
/// split over several gaps), so the resource never idles while booked work
/// is ready. Jobs are booked in program order, so this is a preemptive
/// priority by program order: a stand-in for the round-robin arbitration
/// between DMA queues that keeps each engine work-conserving.
class Calendar {
public:
  struct Placement {
    double start, end; // first and last moment of work
  };

  Placement fill(double earliest, double duration) {
    double cur = std::max(earliest, floor_);
    if (duration <= 0)
      return {cur, cur};
    // Common case: after everything booked.
    if (busy_.empty() || cur >= busy_.back().second) {
      if (!busy_.empty() && cur == busy_.back().second)
        busy_.back().second = cur + duration;
      else
        busy_.emplace_back(cur, cur + duration);
      trim();
      return {cur, cur + duration};
    }
    // Only intervals ending after `cur` can change: take them out, then
    // put them back interleaved with the new work.
    size_t i = busy_.size();
    while (i > 0 && busy_[i - 1].second > cur)
      --i;
    tail_.assign(busy_.begin() + static_cast<std::ptrdiff_t>(i), busy_.end());
    busy_.resize(i);
    Placement placed{-1, -1};
    double remaining = duration;
    size_t j = 0;
    while (remaining > 0) {
      if (j < tail_.size() && tail_[j].first <= cur) {
        append(tail_[j]);
        cur = std::max(cur, tail_[j].second);
        ++j;
        continue;
      }
      double gapEnd = j < tail_.size()
                          ? tail_[j].first
                          : std::numeric_limits<double>::infinity();
      double take = std::min(remaining, gapEnd - cur);
      if (placed.start < 0)
        placed.start = cur;
      append({cur, cur + take});
      remaining -= take;
      cur += take;
    }
    placed.end = cur;
    for (; j < tail_.size(); ++j)
      append(tail_[j]);
    trim();
    return placed;
  }

private:
  /// Appends an interval at or after the last one, joining if they touch.
  void append(const std::pair<double, double> &interval) {
    if (!busy_.empty() && busy_.back().second >= interval.first)
      busy_.back().second = std::max(busy_.back().second, interval.second);
    else
      busy_.push_back(interval);
  }

  void trim() {
    if (busy_.size() <= kMaxIntervals)
      return;
    // Forget the oldest half; nothing may be placed before their end.
    size_t drop = busy_.size() - kMaxIntervals / 2;
    floor_ = busy_[drop - 1].second;
    busy_.erase(busy_.begin(),
                busy_.begin() + static_cast<std::ptrdiff_t>(drop));
  }

  /// Bounds the model's own work; not a hardware figure.
  static constexpr size_t kMaxIntervals = 32;
  std::vector<std::pair<double, double>> busy_, tail_;
  double floor_ = 0;
};

/// The DMA engines' calendars. Engines that received exactly the same work
/// share one calendar (copy on write), so a 128-partition transfer, which
/// gives all 16 engines the same share, is placed once instead of 16 times.
class DmaEngineSet {
public:
  struct Share {
    int engine;
    double duration;
  };

  explicit DmaEngineSet(int engines)
      : calendarOf_(static_cast<size_t>(engines), 0),
        busy_(static_cast<size_t>(engines), 0.0) {
    pool_.emplace_back();
    refs_.push_back(engines);
  }

  /// Books each share on its engine from `ready` on; returns the first
  /// start and the last end over the shares.
  Calendar::Placement fill(double ready, const Share *shares, int count) {
    struct Group {
      int calendar;
      double duration;
      int members;
    };
    Group groups[kMaxDmaEngines];
    int groupOf[kMaxDmaEngines];
    int numGroups = 0;
    for (int k = 0; k < count; ++k) {
      int calendar = calendarOf_[shares[k].engine];
      int g = 0;
      while (g < numGroups && !(groups[g].calendar == calendar &&
                                groups[g].duration == shares[k].duration))
        ++g;
      if (g == numGroups)
        groups[numGroups++] = Group{calendar, shares[k].duration, 0};
      ++groups[g].members;
      groupOf[k] = g;
      busy_[shares[k].engine] += shares[k].duration;
    }
    Calendar::Placement placed{std::numeric_limits<double>::infinity(), ready};
    for (int g = 0; g < numGroups; ++g) {
      int calendar = groups[g].calendar;
      if (refs_[calendar] != groups[g].members) {
        // Only some of the engines sharing this calendar get this work.
        int copy = allocate(calendar);
        refs_[calendar] -= groups[g].members;
        refs_[copy] = groups[g].members;
        for (int k = 0; k < count; ++k)
          if (groupOf[k] == g)
            calendarOf_[shares[k].engine] = copy;
        calendar = copy;
      }
      Calendar::Placement p = pool_[calendar].fill(ready, groups[g].duration);
      placed.start = std::min(placed.start, p.start);
      placed.end = std::max(placed.end, p.end);
    }
    return placed;
  }

  const std::vector<double> &busy() const { return busy_; }

private:
  int allocate(int cloneOf) {
    if (!free_.empty()) {
      int slot = free_.back();
      free_.pop_back();
      pool_[slot] = pool_[cloneOf];
      return slot;
    }
    pool_.push_back(pool_[cloneOf]);
    refs_.push_back(0);
    return static_cast<int>(pool_.size()) - 1;
  }

  std::vector<Calendar> pool_;
  std::vector<int> refs_; // engines sharing each calendar
  std::vector<int> free_; // unused pool slots
  std::vector<int> calendarOf_;
  std::vector<double> busy_;
};

//===----------------------------------------------------------------------===//
// Static instructions
//===----------------------------------------------------------------------===//

struct Term {
  int32_t slot;
  int64_t coeff;
};

/// One operand: where its accesses are recorded and the affine form of its
/// bounding box.
struct Operand {
  /// Records slot: the index into Program::buffers, or for addressed
  /// on-chip buffers, which alias physically, one slot per space.
  int32_t key = 0;
  bool tracked = false; // the key is written somewhere in the program
  bool onChip = false;
  int64_t constant = 0;
  uint32_t termBegin = 0, termEnd = 0;
  int64_t rowSize = 1;
  int64_t rowExtent = 0, colExtent = 0, totalExtent = 0;
  int64_t linearExtent = 0; // to the last element (byte when addressed)
  bool separable = true;
  int64_t rowStep = 1; // in HBM, a view's one row-moving dim's step
  /// In HBM, rows of the last two dims (Box::plane): 0 when not compared.
  int64_t planeRowSize = 0, planeRowExtent = 0, planeColExtent = 0;
  int64_t planeRowStep = 1;
  /// Added to box columns: for addressed buffers, whose boxes are in bytes,
  /// the address; 0 otherwise.
  int64_t colBase = 0;
};

/// An entry of an instruction's "waits".
struct Wait {
  int32_t node;
  /// `node` is a compute instruction on the waiter's queue: queue order,
  /// not a semaphore, orders them.
  bool sameQueue;
};

constexpr int kMaxOperands = 8;

struct StaticInst {
  int64_t node = 0;
  int64_t loc = -1;
  Opcode op = Opcode::Copy;
  TimingUnit unit = TimingUnit::Vector;
  uint32_t operandBegin = 0;
  uint32_t numReads = 0;   // operands [begin, begin + numReads) are read,
  uint32_t numWrites = 1;  // the next numWrites are written: dst first, then
                           // an activation's reduce_res
  int stationaryRead = -1; // matmul: index of the stationary among the reads
  uint32_t waitBegin = 0, waitEnd = 0; // range of Model::waits

  // Compute instructions.
  double costNs = 0;
  double dependentOverheadNs = 0;
  bool readsPsum = false;
  int activationTable = -1; // -1: none; otherwise a table set id

  // Matmul.
  double loadStationaryNs = 0;
  double completionNs = 0;
  double flops = 0;

  // Collective (also isDma: it completes asynchronously).
  bool isCollective = false;
  double collectiveNs = 0; // on the collective path

  // DMA.
  bool isDma = false;
  bool disjointRows = false;  // a disjoint dma_scatter: its writes
  double triggerNs = 0;       // on the issuing queue
  double descriptorGenNs = 0; // on GpSimd, after the trigger (gathers only)
  double dgeNs = 0; // hardware DGE: descriptors ready this long after issue
  int partitionOperand = -1; // operand whose partitions pick the engines
  int64_t rows = 1;          // partitions (or leading-dim rows in HBM)
  double perRowNs = 0;       // DMA engine time per row
  double hbmNs = 0;          // HBM occupancy
  double hbmRead = 0, hbmWritten = 0, dmaBytes = 0;
};

struct FlatNode {
  bool isLoop = false;
  int32_t slot = 0;  // loop: iv slot
  int64_t count = 0; // loop: trip count
  size_t end = 0;    // loop: index one past its body
  uint32_t inst = 0; // instruction: index into insts
};

bool is16Bit(DType dtype) {
  return dtype == DType::BF16 || dtype == DType::F16;
}

int64_t freeElements(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d)
    n *= shape[d];
  return n;
}

/// Elements of the longest contiguous run at the end of the view; on-chip
/// views never run across partitions (dim 0).
int64_t contiguousRun(const View &view, bool onChip) {
  int64_t run = 1;
  size_t stop = onChip ? 1 : 0;
  for (size_t d = view.shape.size(); d-- > stop;) {
    if (view.shape[d] == 1)
      continue;
    if (view.strides[d] != run)
      break;
    run *= view.shape[d];
  }
  return run;
}

/// Stride in elements of the innermost free dim that has extent > 1 (1 if
/// there is none).
int64_t innermostStride(const View &view) {
  for (size_t d = view.shape.size(); d-- > 1;)
    if (view.shape[d] > 1)
      return view.strides[d];
  return 1;
}

bool hasBroadcast(const View &view) {
  for (size_t d = 0; d < view.shape.size(); ++d)
    if (view.shape[d] > 1 && view.strides[d] == 0)
      return true;
  return false;
}

/// ScalarE activation table sets [E]: functions that need no table load
/// (assumed resident in every set) return 0; every other function is
/// assumed to be its own set.
int activationTableOf(ActFunc func) {
  switch (func) {
  case ActFunc::Identity:
  case ActFunc::Neg:
  case ActFunc::Abs:
  case ActFunc::Relu:
  case ActFunc::Square:
    return 0;
  default:
    return 1 + static_cast<int>(func);
  }
}

class Model {
public:
  Model(const Program &source, const Target &target)
      : program(source), params(target) {
    if (program.hasCollectives()) {
      try {
        topology = distributed::Topology::of(target);
      } catch (const std::invalid_argument &e) {
        throw Error(e.what());
      }
    }
    for (size_t i = 0; i < program.buffers.size(); ++i)
      bufferIndex[program.buffers[i].id] = static_cast<int32_t>(i);
    numKeys = static_cast<int32_t>(program.buffers.size());
    std::map<int64_t, int32_t> slots;
    compileNodes(program.body, slots, 1);
    findAliases();
    std::vector<bool> written(static_cast<size_t>(numKeys), false);
    for (const StaticInst &inst : insts)
      for (uint32_t w = 0; w < inst.numWrites; ++w)
        written[operands[inst.operandBegin + inst.numReads + w].key] = true;
    for (Operand &op : operands)
      for (int32_t k : aliases[op.key])
        op.tracked = op.tracked || written[k];
    numSlots = static_cast<int32_t>(slots.size());
    for (const StaticInst &si : insts)
      for (uint32_t w = si.waitBegin; w < si.waitEnd; ++w) {
        const StaticInst &k = insts[static_cast<size_t>(waits[w].node)];
        waits[w].sameQueue = !k.isDma && k.unit == si.unit;
      }
  }

  const Program &program;
  const Params params;
  /// The instance's topology, for programs with collectives.
  std::optional<distributed::Topology> topology;
  std::map<int64_t, int32_t> bufferIndex;
  std::vector<StaticInst> insts;
  std::vector<Operand> operands;
  std::vector<Term> terms;
  std::vector<Wait> waits;
  std::vector<FlatNode> nodes;
  int32_t numSlots = 0;
  /// Records slots: one per buffer, then SBUF and PSUM (addressed buffers).
  int32_t numKeys = 0;
  /// Per buffer, the buffers whose records its accesses must be compared
  /// with: itself, and the addressed buffers of its space sharing bytes.
  std::vector<std::vector<int32_t>> aliases;

  void findAliases() {
    const auto &buffers = program.buffers;
    aliases.assign(buffers.size(), {});
    for (size_t i = 0; i < buffers.size(); ++i) {
      aliases[i].push_back(static_cast<int32_t>(i));
      if (!buffers[i].address)
        continue;
      int64_t lo = *buffers[i].address,
              hi = lo + buffers[i].bytesPerPartition();
      for (size_t j = 0; j < buffers.size(); ++j) {
        const Buffer &other = buffers[j];
        if (j == i || !other.address || other.space != buffers[i].space)
          continue;
        if (*other.address < hi &&
            lo < *other.address + other.bytesPerPartition())
          aliases[i].push_back(static_cast<int32_t>(j));
      }
    }
  }
  double dynamicInstances = 0; // sum over instructions of their trip counts
  double dynamicEvents = 0;    // events simulate() emits when keeping them

private:
  void compileNodes(const std::vector<Node> &body,
                    std::map<int64_t, int32_t> &slots, double trips) {
    for (const Node &node : body) {
      if (node.isLoop()) {
        int32_t slot = static_cast<int32_t>(slots.size());
        slots[node.loopId] = slot; // loop ids are unique (verified)
        size_t index = nodes.size();
        FlatNode loop;
        loop.isLoop = true;
        loop.slot = slot;
        loop.count = node.count;
        nodes.push_back(loop);
        compileNodes(node.body, slots, trips * static_cast<double>(node.count));
        nodes[index].end = nodes.size();
        continue;
      }
      FlatNode leaf;
      leaf.inst = static_cast<uint32_t>(insts.size());
      nodes.push_back(leaf);
      insts.push_back(compileInst(node.inst, slots));
      const StaticInst &si = insts.back();
      dynamicInstances += trips;
      dynamicEvents +=
          trips * (si.isDma ? 2 + (si.descriptorGenNs > 0 ? 1 : 0) : 1);
    }
  }

  const Buffer &bufferOf(const View &view) const {
    return program.buffers[bufferIndex.at(view.buffer)];
  }

  void addOperand(const View &view, const std::map<int64_t, int32_t> &slots) {
    const Buffer &buffer = bufferOf(view);
    Operand op;
    op.key = bufferIndex.at(view.buffer);
    op.onChip = buffer.isOnChip();
    op.constant = view.offset.constant;
    op.termBegin = static_cast<uint32_t>(terms.size());
    for (const auto &[iv, coeff] : view.offset.terms)
      if (coeff != 0)
        terms.push_back(Term{slots.at(iv), coeff});
    op.termEnd = static_cast<uint32_t>(terms.size());
    // On chip a row is a partition. In HBM it is the innermost dim, as in
    // nisa-insert-sync: views that write disjoint columns of the same rows
    // (the pieces of a cat) must be apart here whenever the pass found them
    // apart, or a program it left without a wait would be flagged.
    int64_t rowSize = 1;
    if (buffer.address) {
      for (size_t d = 1; d < buffer.shape.size(); ++d)
        rowSize *= buffer.shape[d];
    } else if (!buffer.shape.empty()) {
      rowSize = buffer.shape.back();
    }
    op.rowSize = std::max<int64_t>(rowSize, 1);
    int rowDims = 0;
    for (size_t d = 0; d < view.shape.size(); ++d) {
      int64_t n = view.shape[d] - 1, s = view.strides[d];
      if (n == 0 || s == 0)
        continue;
      op.totalExtent += n * s;
      if (s % op.rowSize == 0) {
        op.rowExtent += n * (s / op.rowSize);
        op.rowStep = s / op.rowSize;
        ++rowDims;
      } else if (s < op.rowSize)
        op.colExtent += n * s;
      else
        op.separable = false;
    }
    op.linearExtent = op.totalExtent;
    if (rowDims != 1 || buffer.address)
      op.rowStep = 1;
    size_t rank = buffer.shape.size();
    if (!buffer.address && rank > 2 && buffer.shape[rank - 2] > 0 &&
        buffer.shape[rank - 1] > 0) {
      int64_t planeRow = buffer.shape[rank - 2] * buffer.shape[rank - 1];
      bool separable = planeRow > 1;
      int planeRowDims = 0;
      for (size_t d = 0; d < view.shape.size() && separable; ++d) {
        int64_t n = view.shape[d] - 1, s = view.strides[d];
        if (n == 0 || s == 0)
          continue;
        if (s % planeRow == 0) {
          op.planeRowExtent += n * (s / planeRow);
          op.planeRowStep = s / planeRow;
          ++planeRowDims;
        } else if (s < planeRow)
          op.planeColExtent += n * s;
        else
          separable = false;
      }
      if (separable)
        op.planeRowSize = planeRow;
      if (planeRowDims != 1)
        op.planeRowStep = 1;
    }
    if (buffer.address) {
      // Rows are partitions and columns bytes of the space, so the boxes of
      // buffers that share bytes (their aliases) compare. Scaled here, the
      // boxes come out in bytes at no cost per instance.
      const int64_t size = dtypeSize(buffer.dtype);
      op.colBase = *buffer.address;
      op.constant *= size;
      for (uint32_t t = op.termBegin; t < op.termEnd; ++t)
        terms[t].coeff *= size;
      op.rowSize *= size;
      op.totalExtent *= size;
      op.linearExtent = op.totalExtent + size - 1;
      op.colExtent = op.colExtent * size + size - 1; // to the last byte
    }
    operands.push_back(op);
  }

  StaticInst compileInst(const Instruction &inst,
                         const std::map<int64_t, int32_t> &slots) {
    StaticInst si;
    si.node = static_cast<int64_t>(insts.size());
    si.loc = inst.loc;
    si.op = inst.op;
    si.unit = static_cast<TimingUnit>(inst.engine);
    si.waitBegin = static_cast<uint32_t>(waits.size());
    for (int64_t k : inst.waits) // queue flags are set once all are compiled
      waits.push_back(Wait{static_cast<int32_t>(k), false});
    si.waitEnd = static_cast<uint32_t>(waits.size());
    si.operandBegin = static_cast<uint32_t>(operands.size());
    // Reads first, then the written operands (dst first).
    const auto named = inst.operands();
    for (const auto &[name, view] : named) {
      if (Instruction::writes(name))
        continue;
      if (inst.stationary && view == &*inst.stationary)
        si.stationaryRead = static_cast<int>(si.numReads);
      addOperand(*view, slots);
      ++si.numReads;
    }
    si.numWrites = 0;
    for (const auto &[name, view] : named)
      if (Instruction::writes(name)) {
        addOperand(*view, slots);
        ++si.numWrites;
      }

    switch (inst.op) {
    case Opcode::DmaCopy:
    case Opcode::DmaGather:
    case Opcode::DmaScatter:
      costDma(inst, si);
      break;
    case Opcode::Matmul:
      costMatmul(inst, si);
      break;
    case Opcode::Activation:
    case Opcode::TensorTensor:
    case Opcode::ScalarTensorTensor:
    case Opcode::TensorScalar:
    case Opcode::TensorReduce:
    case Opcode::BnStats:
    case Opcode::BnAggr:
    case Opcode::Select:
    case Opcode::Iota:
    case Opcode::Memset:
    case Opcode::Copy:
    case Opcode::Rand:
    case Opcode::NGather:
      costCompute(inst, si);
      break;
    case Opcode::Collective:
      costCollective(inst, si);
      break;
    }
    return si;
  }

  void costMatmul(const Instruction &inst, StaticInst &si) {
    const Params &p = params;
    const View &stat = *inst.stationary, &mov = *inst.moving;
    // A double_row matmul contracts over R rows per partition in the
    // cycles of one [D S6, S11].
    MatmulShape shape = matmulShape(inst);
    double k = static_cast<double>(shape.contraction());
    double m = static_cast<double>(shape.m);
    double n = static_cast<double>(shape.n);
    bool fp32 =
        bufferOf(stat).dtype == DType::F32 || bufferOf(mov).dtype == DType::F32;
    si.costNs =
        p.cyclesToNs(TimingUnit::Tensor, p.cost.matmulCycles(m, n, fp32));
    si.loadStationaryNs =
        p.cyclesToNs(TimingUnit::Tensor, p.cost.loadStationaryCycles(m));
    si.completionNs =
        p.cyclesToNs(TimingUnit::Tensor, p.cost.matmulCompletionCycles());
    si.flops = 2 * k * m * n;
  }

  void costCompute(const Instruction &inst, StaticInst &si) {
    const Params &p = params;
    const View &dst = *inst.dst;
    // Streamed inputs: full tensors the engine reads element by element
    // ([P, 1] bias/scalar operands are per-partition registers).
    std::vector<const View *> streamed;
    switch (inst.op) {
    case Opcode::TensorTensor:
    case Opcode::ScalarTensorTensor: // its scalar is a per-partition register
      streamed = {&*inst.a, &*inst.b};
      break;
    case Opcode::Select:
      streamed = {&*inst.pred, &*inst.onTrue, &*inst.onFalse};
      break;
    case Opcode::Activation: // scale_col, bias, reduce_res: registers (free)
    case Opcode::TensorScalar:
    case Opcode::TensorReduce:
    case Opcode::BnStats:
    case Opcode::BnAggr:
    case Opcode::Copy:
      streamed = {&*inst.src};
      break;
    case Opcode::NGather: // src is read at random, not streamed
      streamed = {&*inst.indices};
      break;
    case Opcode::Iota:
    case Opcode::Memset:
    case Opcode::Rand: // output only (rand's seed is a register)
      break;
    case Opcode::DmaCopy:
    case Opcode::DmaGather:
    case Opcode::DmaScatter:
    case Opcode::Matmul:
    case Opcode::Collective:
      break; // costed by costDma and costMatmul
    }
    ComputeShape shape;
    // Reductions stream their source; their destination is a few columns.
    bool reduces = inst.op == Opcode::TensorReduce ||
                   inst.op == Opcode::BnStats || inst.op == Opcode::BnAggr;
    shape.elements = static_cast<double>(
        freeElements(reduces ? inst.src->shape : dst.shape));
    shape.streamed = static_cast<int>(streamed.size());
    shape.all16Bit = is16Bit(bufferOf(dst).dtype);
    shape.contiguous = innermostStride(dst) == 1;
    auto strideBytes = [&](const View &view) {
      return static_cast<double>(innermostStride(view)) *
             static_cast<double>(dtypeSize(bufferOf(view).dtype));
    };
    shape.widestStrideBytes = strideBytes(dst);
    shape.dstInPsum = bufferOf(dst).space == Space::PSUM;
    for (const View *view : streamed) {
      const Buffer &buffer = bufferOf(*view);
      shape.all16Bit &= is16Bit(buffer.dtype);
      shape.contiguous &= innermostStride(*view) == 1;
      shape.streamedInPsum += buffer.space == Space::PSUM;
      shape.widestStrideBytes =
          std::max(shape.widestStrideBytes, strideBytes(*view));
    }
    si.readsPsum = shape.streamedInPsum > 0;
    Engine engine = inst.engine;
    si.costNs = p.cost.computeNs(inst.op, engine, shape);
    si.dependentOverheadNs =
        p.cost.cyclesToNs(engine, p.cost.dependentOverheadCycles(engine));
    if (inst.op == Opcode::Activation)
      si.activationTable = activationTableOf(inst.func);
  }

  /// The ring cost of the collective among its group's ranks: B is the
  /// tensor for all_reduce, the gathered output for all_gather, the
  /// scattered input for reduce_scatter (CollectiveCost.h).
  void costCollective(const Instruction &inst, StaticInst &si) {
    si.isDma = true;
    si.isCollective = true;
    const Buffer &srcBuf = bufferOf(*inst.src), &dstBuf = bufferOf(*inst.dst);
    double in = static_cast<double>(inst.src->numElements()) *
                static_cast<double>(dtypeSize(srcBuf.dtype));
    double out = static_cast<double>(inst.dst->numElements()) *
                 static_cast<double>(dtypeSize(dstBuf.dtype));
    double bytes = inst.collective == Collective::AllGather ? out : in;
    const CollectiveGroup &group =
        program.groups[static_cast<size_t>(inst.group)];
    try {
      si.collectiveNs =
          distributed::collectiveCost(*topology, inst.collective,
                                      static_cast<int64_t>(bytes), group.ranks)
              .durationNs;
    } catch (const std::invalid_argument &e) {
      throw Error("collective in group '" + group.name + "': " + e.what());
    }
    si.triggerNs = params.dmaTriggerNs;
    si.hbmRead = in;
    si.hbmWritten = out;
  }

  void costDma(const Instruction &inst, StaticInst &si) {
    const Params &p = params;
    si.isDma = true;
    si.disjointRows = inst.disjoint;
    const View &dst = *inst.dst;
    const Buffer &dstBuf = bufferOf(dst);
    // Indirect DMAs address rows of an HBM table by index: the table side's
    // chunks never span two rows, nor the other side's.
    bool gather = inst.op == Opcode::DmaGather;
    bool scatter = inst.op == Opcode::DmaScatter;
    const View &src = gather ? *inst.table : *inst.src;
    const Buffer &srcBuf = bufferOf(src);

    // The side holding one row per index moves every element (a scatter's
    // table has rows it does not touch).
    const View &moved = scatter ? src : dst;
    double elements = static_cast<double>(moved.numElements());
    int64_t srcSize = dtypeSize(srcBuf.dtype),
            dstSize = dtypeSize(dstBuf.dtype);
    double bytes = elements * static_cast<double>(std::max(srcSize, dstSize));
    // A scatter's accumulate reads each destination row before writing it
    // (DMA compute's read-add-write): twice the bytes through the engines.
    bool readsDst = scatter && inst.accumulate;

    // Descriptors: contiguous chunks common to both sides.
    int64_t srcRun = contiguousRun(src, srcBuf.isOnChip() || gather);
    int64_t dstRun = contiguousRun(dst, dstBuf.isOnChip() || scatter);
    if (gather)
      dstRun = std::min<int64_t>(dstRun, freeElements(dst.shape));
    if (scatter)
      srcRun = std::min<int64_t>(srcRun, freeElements(src.shape));
    int64_t chunk = std::max<int64_t>(1, std::min(srcRun, dstRun));
    double chunkBytes = static_cast<double>(chunk) *
                        static_cast<double>(std::max(srcSize, dstSize));
    double descriptors = std::ceil(elements / static_cast<double>(chunk));

    // Rows split over the engines: SBUF partitions, or leading-dim rows
    // when both sides are in HBM.
    const View *mapped = nullptr;
    int operandOfMapped = -1;
    auto operandIndexOf = [&](const View &view) -> int {
      int i = 0;
      for (const auto &[name, v] : inst.operands()) {
        if (Instruction::writes(name))
          continue;
        if (v == &view)
          return i;
        ++i;
      }
      return static_cast<int>(si.numReads); // the destination
    };
    if (dstBuf.isOnChip()) {
      mapped = &dst;
      operandOfMapped = static_cast<int>(si.numReads);
    } else if (!gather && srcBuf.isOnChip()) {
      mapped = &src;
      operandOfMapped = operandIndexOf(src);
    }
    si.partitionOperand = operandOfMapped;
    si.rows = moved.shape.empty() ? 1 : std::max<int64_t>(1, moved.shape[0]);
    if (mapped)
      si.rows = std::max<int64_t>(1, mapped->shape[0]);
    double rows = static_cast<double>(si.rows);

    // DMA transpose [D S6] into SBUF: one side walks 2- or 4-byte units
    // (elements, or fp8 pairs) the other has contiguous.
    bool transpose = !gather && !scatter && srcSize == dstSize &&
                     dstBuf.isOnChip() && !hasBroadcast(src) &&
                     !hasBroadcast(dst) &&
                     p.cost.isDmaTranspose(srcSize, srcRun, dstRun);
    if (transpose) {
      si.perRowNs =
          bytes / rows / p.cost.dmaTransposeBytesPerNs(srcBuf.isOnChip());
    } else {
      si.perRowNs =
          p.cost.dmaTransferNs(readsDst ? 2 * bytes : bytes, chunkBytes,
                               readsDst ? 2 * descriptors : descriptors) /
          rows;
    }

    // HBM traffic.
    if (!srcBuf.isOnChip())
      si.hbmRead += elements * static_cast<double>(srcSize);
    if ((gather || scatter) && !bufferOf(*inst.indices).isOnChip())
      si.hbmRead +=
          static_cast<double>(inst.indices->numElements()) *
          static_cast<double>(dtypeSize(bufferOf(*inst.indices).dtype));
    if (!dstBuf.isOnChip())
      si.hbmWritten += elements * static_cast<double>(dstSize);
    if (readsDst && !dstBuf.isOnChip())
      si.hbmRead += elements * static_cast<double>(dstSize);
    si.hbmNs = (si.hbmRead + si.hbmWritten) / p.hbmBytesPerNs;
    si.dmaBytes = bytes;

    // Issue: a sequencer trigger with precomputed descriptors, or software
    // descriptor generation on GpSimd (gathers, and GpSimd-issued copies).
    double swdge = p.cost.swdgeNs(descriptors);
    if (si.unit == TimingUnit::GpSimd) {
      si.triggerNs = swdge;
    } else if (inst.hwdge) {
      // Hardware DGE [D S6, S15]: ~600 ns per instruction before its
      // descriptors exist. SyncE's sequencer is held for it; ScalarE's data
      // path is a separate resource and keeps computing [D S6], so its queue
      // pays only the trigger. The two DGE blocks' contention is not modelled.
      si.dgeNs = p.hwdgeIssueNs;
      si.triggerNs =
          si.unit == TimingUnit::Sync ? p.hwdgeIssueNs : p.dmaTriggerNs;
    } else {
      si.triggerNs = p.dmaTriggerNs;
      if (gather || scatter)
        si.descriptorGenNs = swdge;
    }
  }
};

//===----------------------------------------------------------------------===//
// Simulation
//===----------------------------------------------------------------------===//

constexpr double kInfinity = std::numeric_limits<double>::infinity();

class Simulator {
public:
  Simulator(const Model &model, bool withEvents)
      : m(model), p(model.params), keepEvents(withEvents),
        records(static_cast<size_t>(model.numKeys)), ivs(model.numSlots, 0),
        doneEnd(model.insts.size(), -kInfinity),
        doneReady(model.insts.size(), -kInfinity), dmaEngines(p.dmaEngines) {
    // Reserve exactly, unless that is so large that growing on demand (and
    // failing late, if at all) is the better deal.
    if (withEvents && m.dynamicEvents <= kMaxReservedEvents)
      timeline.events.reserve(static_cast<size_t>(m.dynamicEvents));
  }

  Timeline run() {
    // One instantiation per mode keeps the mode test out of the inner loops.
    if (m.program.explicitSync)
      runRange<true>(0, m.nodes.size());
    else
      runRange<false>(0, m.nodes.size());
    finish();
    return std::move(timeline);
  }

private:
  const Model &m;
  const Params &p;
  bool keepEvents;
  Timeline timeline;

  std::vector<std::vector<Access>> records; // per Operand::key
  std::vector<int64_t> ivs;
  uint64_t seq = 0;
  // Per static instruction, the latest end and ready time of its instances
  // so far (-inf before the first): what a wait on it waits for.
  std::vector<double> doneEnd, doneReady;

  double queueFree[kNumTimingUnits] = {};
  uint64_t lastSeq[kNumTimingUnits] = {};
  double busy[kNumTimingUnits] = {};
  double endTime = 0;

  DmaEngineSet dmaEngines;
  Calendar hbmCalendar;
  double hbmBusy = 0;

  // TensorE: background LoadStationary and the power throttle.
  double previousMatmulStart = 0;
  double throttleRamp = 0;    // active ns since the throttle engaged
  double throttleEngaged = 0; // when it last engaged
  std::vector<std::pair<double, double>> window; // recent matmul intervals
  size_t windowHead = 0;
  double windowSum = 0;

  int activeTable = -1; // ScalarE activation table set loaded

  /// Explicit: waits come from the program and are checked against the
  /// records; otherwise the records give the waits.
  template <bool Explicit> void runRange(size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      const FlatNode &node = m.nodes[i];
      if (!node.isLoop) {
        execute<Explicit>(m.insts[node.inst]);
        ++i;
        continue;
      }
      for (int64_t iv = 0; iv < node.count; ++iv) {
        ivs[node.slot] = iv;
        runRange<Explicit>(i + 1, node.end);
      }
      i = node.end;
    }
  }

  Box boxOf(const Operand &op) const {
    int64_t offset = op.constant;
    for (uint32_t t = op.termBegin; t < op.termEnd; ++t)
      offset += m.terms[t].coeff * ivs[m.terms[t].slot];
    const int64_t rowSize = op.rowSize, base = op.colBase;
    const int64_t l0 = offset, l1 = offset + op.linearExtent;
    Box box{offset / rowSize,
            (offset + op.totalExtent) / rowSize,
            base,
            base + rowSize - 1,
            l0,
            l1};
    if (op.separable) {
      int64_t r = offset / rowSize, c = offset - r * rowSize;
      if (c + op.colExtent < rowSize)
        box = {r,  r + op.rowExtent, base + c, base + c + op.colExtent, l0,
               l1, op.rowStep};
    }
    if (int64_t planeRow = op.planeRowSize) {
      int64_t r = offset / planeRow, c = offset - r * planeRow;
      if (c + op.planeColExtent < planeRow) {
        box.plane = true;
        box.pr0 = r;
        box.pr1 = r + op.planeRowExtent;
        box.pc0 = c;
        box.pc1 = c + op.planeColExtent;
        box.prs = op.planeRowStep;
      }
    }
    return box;
  }

  /// When an earlier access stops blocking a consumer on `unit`: its queue
  /// order covers the same queue, a semaphore any other.
  double waitFor(const Access &a, uint8_t unit) const {
    return a.unit == unit ? a.end : a.ready + p.semaphoreLatencyNs;
  }

  /// `a` makes `old` redundant: every later access that conflicts with `old`
  /// conflicts with `a` and waits at least as long for it.
  bool dominates(const Access &a, const Access &old) const {
    // A later disjoint scatter may conflict with `old` and not with `a`.
    if ((!a.write && old.write) || (a.disjointRows && !old.disjointRows))
      return false;
    if (!containsBox(a.box, old.box))
      return false;
    if (a.unit == old.unit)
      return a.end >= old.end && a.ready >= old.ready;
    double sem = p.semaphoreLatencyNs;
    return a.ready >= old.ready && a.end >= old.ready + sem &&
           (old.unit == kMergedUnit || a.ready + sem >= old.end);
  }

  void record(int32_t key, const Access &access) {
    std::vector<Access> &list = records[key];
    size_t out = 0;
    for (size_t i = 0; i < list.size(); ++i)
      if (!dominates(access, list[i]))
        list[out++] = list[i];
    list.resize(out);
    list.push_back(access);
    if (list.size() > kMaxRecordsPerBuffer)
      mergeOldest(list);
  }

  /// Replaces the oldest half of the records by one write and one read
  /// summary (union box, latest times, waited on by every queue).
  static void mergeOldest(std::vector<Access> &list) {
    size_t half = list.size() / 2;
    Access merged[2];
    bool have[2] = {false, false};
    for (size_t i = 0; i < half; ++i) {
      const Access &a = list[i];
      Access &s = merged[a.write];
      if (!have[a.write]) {
        s = a;
        s.unit = kMergedUnit;
        s.seq = 0;
        s.node = -1;
        have[a.write] = true;
        continue;
      }
      s.box = unionBox(s.box, a.box);
      s.disjointRows = s.disjointRows && a.disjointRows;
      s.end = std::max(s.end, a.end);
      s.ready = std::max(s.ready, a.ready);
    }
    std::vector<Access> rest;
    rest.reserve(list.size() - half + 2);
    for (int w = 0; w < 2; ++w)
      if (have[w])
        rest.push_back(merged[w]);
    rest.insert(rest.end(), list.begin() + half, list.end());
    list.swap(rest);
  }

  void event(const StaticInst &si, TimingUnit unit, double start, double end,
             int queue = 0, int queueCount = 1) {
    if (keepEvents)
      timeline.events.push_back(InstructionTiming{
          si.node, unit, queue, queueCount, start, end, si.loc});
  }

  template <bool Explicit> void execute(const StaticInst &si) {
    ++seq;
    ++timeline.instructions;
    const Operand *ops = &m.operands[si.operandBegin];
    const uint32_t numOps = si.numReads + si.numWrites;
    Box boxes[kMaxOperands];
    for (uint32_t i = 0; i < numOps; ++i)
      boxes[i] = boxOf(ops[i]);

    // Data dependences: the waits themselves under derived sync (a stand-in
    // for semaphores); under explicit sync, the instance must not start
    // before any of them is done (checked once its start is known).
    const uint8_t unit = static_cast<uint8_t>(si.unit);
    const int32_t node = static_cast<int32_t>(si.node);
    double waitStationary = 0, waitOther = 0;
    bool dependent = false;
    for (uint32_t i = 0; i < si.numReads; ++i) {
      if (!ops[i].tracked)
        continue;
      double wait = 0;
      for (int32_t key : m.aliases[ops[i].key])
        for (const Access &a : records[key]) {
          if (!a.write || !overlaps(a.box, boxes[i], key == ops[i].key))
            continue;
          if constexpr (Explicit)
            hazards.note(si, a, false, key, boxes[i]);
          else
            wait = std::max(wait, waitFor(a, unit));
          dependent |= a.unit == unit && a.seq == lastSeq[unit];
        }
      if (static_cast<int>(i) == si.stationaryRead)
        waitStationary = std::max(waitStationary, wait);
      else
        waitOther = std::max(waitOther, wait);
    }
    // Every written operand (an activation's reduce_res as much as its dst)
    // conflicts with any earlier access to its bytes.
    for (uint32_t i = si.numReads; i < numOps; ++i)
      for (int32_t key : m.aliases[ops[i].key])
        for (const Access &a : records[key]) {
          if (!overlaps(a.box, boxes[i], key == ops[i].key) ||
              (si.disjointRows && a.disjointRows))
            continue;
          if constexpr (Explicit)
            hazards.note(si, a, true, key, boxes[i]);
          else
            waitOther = std::max(waitOther, waitFor(a, unit));
        }
    if constexpr (Explicit) {
      waitStationary = waitOther = explicitWait(si);
      // A DMA's semaphore gates its trigger; a compute instruction starts
      // no earlier than its queue and its waits allow.
      double start = std::max(queueFree[unit], waitOther);
      if (si.op == Opcode::Matmul)
        start = std::max(start, std::max(previousMatmulStart, waitOther) +
                                    si.loadStationaryNs);
      if (start < hazards.required)
        throw Error(missingSync(si, hazards));
      hazards = Hazards();
    }

    double end, ready;
    if (si.isDma) {
      double wait = std::max(waitOther, waitStationary);
      if (si.isCollective)
        executeCollective(si, wait, end);
      else
        executeDma(si, boxes, wait, end);
      ready = end;
      lastSeq[unit] = seq;
      doneEnd[node] = std::max(doneEnd[node], end);
      doneReady[node] = std::max(doneReady[node], end);
      const uint8_t transferUnit =
          uint8_t(si.isCollective ? TimingUnit::Neuronlink : TimingUnit::Dma);
      for (uint32_t i = 0; i < si.numReads; ++i)
        if (ops[i].tracked)
          record(ops[i].key,
                 Access{boxes[i], end, end, seq, node, transferUnit, false});
      for (uint32_t i = si.numReads; i < numOps; ++i)
        record(ops[i].key, Access{boxes[i], end, end, seq, node, transferUnit,
                                  true, si.disjointRows});
      return;
    }

    double start;
    if (si.op == Opcode::Matmul) {
      // Background LoadStationary: after the previous matmul started and the
      // stationary data is ready; the matmul waits for it.
      double lsEnd =
          std::max(previousMatmulStart, waitStationary) + si.loadStationaryNs;
      start = std::max({queueFree[unit], waitOther, lsEnd});
      double duration = throttledDuration(start, si.costNs);
      timeline.flops += si.flops;
      timeline.tensorThrottleNs += duration - si.costNs;
      end = start + duration;
      ready = end + si.completionNs;
      previousMatmulStart = start;
      pushWindow(start, end);
    } else {
      start = std::max(queueFree[unit], waitOther);
      double duration = si.costNs;
      if (dependent)
        duration += si.dependentOverheadNs;
      if (si.activationTable > 0 && si.activationTable != activeTable) {
        duration += p.activationTableSwitchNs;
        timeline.activationTableNs += p.activationTableSwitchNs;
        activeTable = si.activationTable;
      }
      if (si.readsPsum)
        timeline.psumEvictionNs += duration;
      end = start + duration;
      ready = end;
    }
    queueFree[unit] = end;
    lastSeq[unit] = seq;
    busy[unit] += end - start;
    endTime = std::max(endTime, ready);
    doneEnd[node] = std::max(doneEnd[node], end);
    doneReady[node] = std::max(doneReady[node], ready);
    event(si, si.unit, start, end);

    for (uint32_t i = 0; i < si.numReads; ++i)
      if (ops[i].tracked)
        record(ops[i].key, Access{boxes[i], end, end, seq, node, unit, false});
    for (uint32_t i = si.numReads; i < numOps; ++i)
      record(ops[i].key, Access{boxes[i], end, ready, seq, node, unit, true});
  }

  /// Explicit sync: when every earlier instance of each instruction `si`
  /// waits for is done (its end on the same compute queue, else its ready
  /// time plus a semaphore). No instance yet: no wait.
  double explicitWait(const StaticInst &si) const {
    double wait = 0;
    for (uint32_t w = si.waitBegin; w < si.waitEnd; ++w) {
      const Wait &k = m.waits[w];
      wait = std::max(wait, k.sameQueue
                                ? doneEnd[k.node]
                                : doneReady[k.node] + p.semaphoreLatencyNs);
    }
    return wait;
  }

  /// Explicit sync: the latest moment an earlier conflicting access is
  /// done (a write visible, a read finished), and which access that is. Its
  /// instance must not start before then: the program's waits, directly or
  /// through other instructions, must have ordered it after. Compute
  /// instructions of one queue are ordered by the queue (DMAs never are:
  /// they complete out of order). Merged records are checked by their
  /// latest times.
  struct Hazards {
    double required = 0;
    Access access{};
    bool writes = false;
    int32_t key = 0;
    Box box{};

    void note(const StaticInst &si, const Access &a, bool isWrite, int32_t k,
              const Box &b) {
      // Merged summaries over-approximate (union boxes, latest times).
      if (a.unit == kMergedUnit || (!si.isDma && a.unit == uint8_t(si.unit)))
        return;
      double done = a.write ? a.ready : a.end;
      if (done <= required)
        return;
      required = done;
      access = a;
      writes = isWrite;
      key = k;
      box = b;
    }
  };
  Hazards hazards;

  std::string describe(const StaticInst &si) const {
    std::string text = "instruction " + std::to_string(si.node) + " (" +
                       opcodeName(si.op) + " on " + timingUnitName(si.unit);
    if (si.loc >= 0)
      text += ", " + m.program.locations[static_cast<size_t>(si.loc)];
    return text + ")";
  }

  std::string missingSync(const StaticInst &si, const Hazards &h) const {
    const Access &a = h.access;
    const Box &box = h.box;
    const int32_t key = h.key;
    const bool writes = h.writes;
    std::string what;
    const Buffer &buffer = m.program.buffers[static_cast<size_t>(key)];
    if (!buffer.address) {
      what = std::string(spaceName(buffer.space)) + " buffer " +
             std::to_string(buffer.id) + " ('" + buffer.name + "')";
    } else {
      auto range = [](int64_t lo, int64_t hi) {
        return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
      };
      what = std::string(spaceName(buffer.space)) + " bytes " +
             range(std::max(box.c0, a.box.c0), std::min(box.c1, a.box.c1)) +
             " of partitions " +
             range(std::max(box.r0, a.box.r0), std::min(box.r1, a.box.r1));
    }
    return "missing synchronisation: " + describe(si) +
           (writes ? " writes " : " reads ") + what +
           (a.write ? " written by " : " read by ") +
           (a.node >= 0 ? describe(m.insts[static_cast<size_t>(a.node)])
                        : std::string("earlier instructions")) +
           " before that is done (a wait is missing)";
  }

  /// A trigger on the issuing queue, then the transfer on the collective
  /// path once the previous collective is done.
  void executeCollective(const StaticInst &si, double wait,
                         double &completion) {
    const uint8_t unit = static_cast<uint8_t>(si.unit);
    double triggerStart = std::max(queueFree[unit], wait);
    double triggerEnd = triggerStart + si.triggerNs;
    queueFree[unit] = triggerEnd;
    busy[unit] += si.triggerNs;
    event(si, si.unit, triggerStart, triggerEnd);

    const int link = int(TimingUnit::Neuronlink);
    double start = std::max(queueFree[link], triggerEnd);
    completion = start + si.collectiveNs;
    queueFree[link] = completion;
    busy[link] += si.collectiveNs;
    endTime = std::max(endTime, completion);
    timeline.hbmBytesRead += si.hbmRead;
    timeline.hbmBytesWritten += si.hbmWritten;
    event(si, TimingUnit::Neuronlink, start, completion);
  }

  void executeDma(const StaticInst &si, const Box *boxes, double wait,
                  double &completion) {
    const uint8_t unit = static_cast<uint8_t>(si.unit);
    double triggerStart = std::max(queueFree[unit], wait);
    double triggerEnd = triggerStart + si.triggerNs;
    queueFree[unit] = triggerEnd;
    busy[unit] += si.triggerNs;
    event(si, si.unit, triggerStart, triggerEnd);

    double issued = std::max(triggerEnd, triggerStart + si.dgeNs);
    if (si.descriptorGenNs > 0) {
      const int g = int(TimingUnit::GpSimd);
      double genStart = std::max(queueFree[g], triggerEnd);
      issued = genStart + si.descriptorGenNs;
      queueFree[g] = issued;
      busy[g] += si.descriptorGenNs;
      event(si, TimingUnit::GpSimd, genStart, issued);
    }
    double dataReady = issued + p.dmaFixedLatencyNs;

    // Split over the DMA engines by row.
    const int64_t ppe = p.partitionsPerDmaEngine;
    const int64_t engines = p.dmaEngines;
    int64_t firstEngine, lastEngine, rowBegin;
    if (si.partitionOperand >= 0) {
      rowBegin = std::max<int64_t>(0, boxes[si.partitionOperand].r0);
      firstEngine = std::min(engines - 1, rowBegin / ppe);
      lastEngine = std::min(engines - 1, (rowBegin + si.rows - 1) / ppe);
    } else {
      rowBegin = 0;
      firstEngine = 0;
      lastEngine = std::min(engines, (si.rows + ppe - 1) / ppe) - 1;
    }
    const int64_t used = lastEngine - firstEngine + 1;
    DmaEngineSet::Share shares[kMaxDmaEngines];
    int numShares = 0;
    for (int64_t e = firstEngine; e <= lastEngine; ++e) {
      double rows;
      if (si.partitionOperand >= 0) {
        int64_t lo = std::max(rowBegin, e * ppe);
        int64_t hi = e == lastEngine
                         ? rowBegin + si.rows
                         : std::min(rowBegin + si.rows, (e + 1) * ppe);
        rows = static_cast<double>(std::max<int64_t>(hi - lo, 0));
      } else {
        rows = static_cast<double>(si.rows) / static_cast<double>(used);
      }
      double duration = rows * si.perRowNs;
      if (duration > 0)
        shares[numShares++] = {static_cast<int>(e), duration};
    }
    Calendar::Placement placed = dmaEngines.fill(dataReady, shares, numShares);
    double dataStart = placed.start;
    double dataEnd = std::max(dataReady, placed.end);
    if (!(dataStart < dataEnd))
      dataStart = dataReady;
    if (si.hbmNs > 0) {
      Calendar::Placement hbm = hbmCalendar.fill(dataStart, si.hbmNs);
      hbmBusy += si.hbmNs;
      dataEnd = std::max(dataEnd, hbm.end);
    }
    completion = dataEnd;
    endTime = std::max(endTime, completion);
    timeline.hbmBytesRead += si.hbmRead;
    timeline.hbmBytesWritten += si.hbmWritten;
    timeline.dmaBytes += si.dmaBytes;
    event(si, TimingUnit::Dma, dataStart, completion,
          static_cast<int>(firstEngine), static_cast<int>(used));
  }

  //===--------------------------------------------------------------------===//
  // TensorE power throttle
  //===--------------------------------------------------------------------===//

  void pushWindow(double start, double end) {
    window.emplace_back(start, end);
    windowSum += end - start;
  }

  /// TensorE busy time within [t - window, t].
  double busyInWindow(double t) {
    double from = t - p.throttleWindowNs;
    while (windowHead < window.size() && window[windowHead].second <= from) {
      windowSum -= window[windowHead].second - window[windowHead].first;
      ++windowHead;
    }
    if (windowHead > 1024 && windowHead * 2 > window.size()) {
      window.erase(window.begin(), window.begin() + windowHead);
      windowHead = 0;
    }
    double sum = windowSum;
    if (windowHead < window.size() && window[windowHead].first < from)
      sum -= from - window[windowHead].first;
    return sum;
  }

  /// Wall time of `work` ns of full-rate matmul starting at `start`: the
  /// throttle re-engages after a window of low utilization, then the rate
  /// ramps linearly from the start utilization to 1 over the ramp time.
  double throttledDuration(double start, double work) {
    const double w = p.throttleWindowNs;
    if (start - throttleEngaged >= w &&
        busyInWindow(start) < p.throttleReengageUtilization * w) {
      throttleRamp = 0;
      throttleEngaged = start;
    }
    const double r0 = p.throttleStartUtilization, ramp = p.throttleRampNs;
    if (throttleRamp >= ramp || r0 >= 1)
      return work;
    const double x = throttleRamp;
    const double slope = (1 - r0) / ramp; // rate gained per active ns
    const double rate = r0 + slope * x;
    // Work done while finishing the ramp.
    const double rest = ramp - x;
    const double rampWork = rate * rest + 0.5 * slope * rest * rest;
    if (work >= rampWork) {
      throttleRamp = ramp;
      return rest + (work - rampWork);
    }
    // rate * T + slope / 2 * T^2 = work.
    const double a = 0.5 * slope;
    double t = (-rate + std::sqrt(rate * rate + 4 * a * work)) / (2 * a);
    throttleRamp += t;
    return t;
  }

  void finish() {
    Timeline &tl = timeline;
    tl.totalNs = endTime;
    tl.hbmBytes = tl.hbmBytesRead + tl.hbmBytesWritten;
    double dmaMax = 0, dmaSum = 0;
    const std::vector<double> &dmaBusy = dmaEngines.busy();
    for (double b : dmaBusy) {
      dmaMax = std::max(dmaMax, b);
      dmaSum += b;
    }
    for (int u = 0; u < int(TimingUnit::Dma); ++u)
      tl.engineBusyNs[timingUnitName(TimingUnit(u))] = busy[u];
    tl.engineBusyNs["dma"] = dmaMax;
    tl.engineBusyNs["dma_avg"] = dmaSum / static_cast<double>(dmaBusy.size());
    tl.engineBusyNs["hbm"] = hbmBusy;
    tl.engineBusyNs["neuronlink"] = busy[int(TimingUnit::Neuronlink)];

    std::string bound = "latency";
    double most = 0;
    for (const char *name : {"tensor", "vector", "scalar", "gpsimd", "sync",
                             "dma", "hbm", "neuronlink"}) {
      double b = tl.engineBusyNs[name];
      if (b > most) {
        most = b;
        bound = name;
      }
    }
    if (tl.totalNs <= 0 || most < p.boundMinUtilization * tl.totalNs)
      bound = "latency";
    tl.bound = bound;
  }
};

} // namespace

Timeline simulate(const Program &program, const Target &target,
                  bool keepEvents) {
  program.verify(target);
  Model model(program, target);
  Simulator simulator(model, keepEvents);
  return simulator.run();
}

} // namespace neuron::runtime
