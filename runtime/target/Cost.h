//===- Cost.h - What one engine instruction costs ---------------*- C++ -*-===//
//
// The per-instruction cost formulas of a NeuronCore and the target figures
// they use, in one place: the timing model (runtime/timing) charges them on
// its timeline and the compiler (passes/tile, passes/flex_attention) sizes
// its engine assignment and buffer rotation with them, so the compiler
// optimises the clock the profile reports. MLIR-free; the figures come from
// the target file (trn2.json, trn3.json) with their sources.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_TARGET_COST_H
#define NEURON_RUNTIME_TARGET_COST_H

#include "runtime/program/Program.h"
#include "runtime/target/Target.h"

namespace neuron::target {

/// How many engines the instruction set has (InstructionSet.def).
inline constexpr int kNumEngines = 0
#define NEURON_ENGINE(Name, Spelling) +1
#include "runtime/program/InstructionSet.def"
    ;

/// What a compute instruction's cost depends on beside its opcode and
/// engine: how much it streams and from where.
struct ComputeShape {
  /// Elements per partition of each streamed input: the destination's free
  /// elements (the source's for tensor_reduce, bn_stats and bn_aggr).
  double elements = 1;
  /// Inputs read element by element; [P, 1] scalar, bias and scale operands
  /// are per-partition registers and do not count.
  int streamed = 0;
  /// The destination and every streamed input are 16-bit (bf16, fp16).
  bool all16Bit = false;
  /// The destination and every streamed input have unit innermost stride.
  bool contiguous = true;
  /// Streamed inputs that are in PSUM, and whether the destination is.
  int streamedInPsum = 0;
  bool dstInPsum = false;
  /// The largest innermost stride, in bytes, of the destination and the
  /// streamed inputs (0 when all are contiguous).
  double widestStrideBytes = 0;
};

/// The cost formulas of one target. Cheap to build (a few figure look-ups);
/// throws neuron::runtime::Error naming a figure the target lacks or has out
/// of range.
class CostModel {
public:
  explicit CostModel(const Target &target);

  const Target &target() const { return *target_; }

  /// Clock of an engine's queue (GHz); Sync's for DMA triggers.
  double clockGHz(runtime::Engine engine) const;
  double cyclesToNs(runtime::Engine engine, double cycles) const {
    return cycles / clockGHz(engine);
  }

  //--- VectorE, ScalarE, GpSimd -------------------------------------------//

  /// Cycles `engine` is busy with `op` (a compute instruction other than
  /// matmul): the streamed elements over its perf mode, at least the
  /// engine's minimum initiation interval.
  double computeCycles(runtime::Opcode op, runtime::Engine engine,
                       const ComputeShape &shape) const;
  double computeNs(runtime::Opcode op, runtime::Engine engine,
                   const ComputeShape &shape) const {
    return cyclesToNs(engine, computeCycles(op, engine, shape));
  }
  /// Extra cycles an instruction waits when it depends on the one before it
  /// on the same queue (0 for engines without a documented overhead).
  double dependentOverheadCycles(runtime::Engine engine) const;

  //--- TensorE ------------------------------------------------------------//

  /// Cycles of one matmul: max(min(MIN_II, stationary free), moving free),
  /// times the fp32 factor when either input is fp32.
  double matmulCycles(double stationaryFree, double movingFree,
                      bool fp32) const;
  /// Cycles to load a stationary operand of `stationaryFree` columns.
  double loadStationaryCycles(double stationaryFree) const;
  /// Fixed cycles from a matmul's last moving column to its PSUM result.
  double matmulCompletionCycles() const { return matmulCompletionCycles_; }

  //--- DMA ----------------------------------------------------------------//

  /// Engine time (ns, summed over the DMA engines that share the work) to
  /// move `bytes` as `descriptors` contiguous chunks of `chunkBytes`: the
  /// bytes at one engine's rate plus a per-descriptor overhead that chunks
  /// of dma_descriptor_overhead_hidden_bytes hide.
  double dmaTransferNs(double bytes, double chunkBytes,
                       double descriptors) const;
  /// One engine's rate (bytes/ns) for a transposing DMA into SBUF.
  double dmaTransposeBytesPerNs(bool fromSbuf) const;
  /// GpSimd's time generating the descriptors of a software-DGE transfer
  /// (an indirect DMA, or a copy GpSimd's queue triggers).
  double swdgeNs(double descriptors) const {
    return swdgeIssueNs_ + swdgePerDescriptorNs_ * descriptors;
  }
  /// Whether a copy whose sides are contiguous over `srcRun` and `dstRun`
  /// elements of `eltBytes` is a DMA transpose [D S6]: one side walks units
  /// the other has contiguous, the units 2 or 4 bytes. The DMA moves units,
  /// not values: fp8 elements in pairs or fours are 2- or 4-byte units.
  static bool isDmaTranspose(int64_t eltBytes, int64_t srcRun, int64_t dstRun);

private:
  const Target *target_;
  double clockGHz_[kNumEngines] = {};

  double matmulMinIICycles_ = 0;
  double matmulFp32Factor_ = 0;
  double loadStationaryColumnsPerCycle_ = 0;
  double matmulCompletionCycles_ = 0;

  double minIICycles_ = 0;
  double dependentOverheadCycles_[kNumEngines] = {};
  double bnAggrCyclesPerTriple_ = 0;
  double gatherCyclesPerElement_ = 0;
  double vectorPerfSpeedup_ = 0;
  double vectorPerfStridedSpeedup_ = 0;
  double scalarPerfSpeedup_ = 0;
  double stridePenaltyBytes_ = 0;
  double stridePenaltyFactor_ = 0;

  double dmaBytesPerNs_ = 0;
  double descriptorOverheadNs_ = 0;
  double descriptorHiddenBytes_ = 0;
  double transposeEfficiencyFromHbm_ = 0;
  double swdgeIssueNs_ = 0;
  double swdgePerDescriptorNs_ = 0;
  double transposeEfficiencyFromSbuf_ = 0;
};

} // namespace neuron::target

#endif // NEURON_RUNTIME_TARGET_COST_H
