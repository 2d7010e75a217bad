//===- Cost.cpp - What one engine instruction costs -----------------------===//
//
// Bracketed tags cite the figure's kind and source (keys of
// shared/reference/trainium.md): [D S23] documented in S23, [E] estimated.
//
//===----------------------------------------------------------------------===//

#include "runtime/target/Cost.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace neuron::target {

using runtime::Engine;
using runtime::Error;
using runtime::Opcode;

CostModel::CostModel(const Target &t) : target_(&t) {
  auto positive = [&](const char *key) {
    double v = t.value(key);
    if (!(v > 0))
      throw Error("target '" + t.name + "': figure '" + key +
                  "' must be positive for the cost model");
    return v;
  };
  auto nonNegative = [&](const char *key) {
    double v = t.value(key);
    if (!(v >= 0))
      throw Error("target '" + t.name + "': figure '" + key +
                  "' must not be negative for the cost model");
    return v;
  };
  if (t.partitions < 1)
    throw Error("target '" + t.name + "': partitions must be >= 1");
  clockGHz_[int(Engine::Tensor)] = t.tensorClockGHz;
  clockGHz_[int(Engine::Vector)] = t.vectorClockGHz;
  clockGHz_[int(Engine::Scalar)] = t.scalarClockGHz;
  clockGHz_[int(Engine::GpSimd)] = t.gpsimdClockGHz;
  clockGHz_[int(Engine::Sync)] = t.syncClockGHz;

  matmulMinIICycles_ = nonNegative("matmul_min_ii_cycles");
  matmulFp32Factor_ = positive("matmul_fp32_cost_factor");
  loadStationaryColumnsPerCycle_ =
      positive("matmul_load_stationary_columns_per_cycle");
  matmulCompletionCycles_ = nonNegative("matmul_completion_fixed_cycles");

  minIICycles_ = nonNegative("engine_min_ii_cycles");
  bnAggrCyclesPerTriple_ = positive("vector_bn_aggr_cycles_per_triple");
  gatherCyclesPerElement_ = positive("gpsimd_gather_cycles_per_element");
  dependentOverheadCycles_[int(Engine::Vector)] =
      nonNegative("vector_dependent_overhead_cycles");
  // [Dv] a dependent 1-element ScalarE chain issues every
  // scalar_dependent_ii_cycles, of which MIN_II is the instruction itself.
  dependentOverheadCycles_[int(Engine::Scalar)] =
      std::max(0.0, nonNegative("scalar_dependent_ii_cycles") - minIICycles_);
  dependentOverheadCycles_[int(Engine::GpSimd)] =
      nonNegative("gpsimd_dependent_overhead_cycles");
  // 16-bit perf modes: elements per cycle over the lanes, i.e. elements per
  // lane per cycle (VectorE 512 / 128 = 4x [D S6, S7]; ScalarE 1x on NC-v3,
  // 256 / 128 = 2x on NC-v4 [D S7]).
  vectorPerfSpeedup_ = positive("vector_elems_per_cycle_16bit") / t.partitions;
  vectorPerfStridedSpeedup_ = positive("vector_perf_mode_strided_speedup");
  scalarPerfSpeedup_ = positive("scalar_elems_per_cycle_16bit") / t.partitions;
  stridePenaltyBytes_ = nonNegative("stride_penalty_bytes");
  stridePenaltyFactor_ = positive("stride_penalty_factor");

  dmaBytesPerNs_ = t.dmaBytesPerNsPerEngine;
  if (!(dmaBytesPerNs_ > 0))
    throw Error("target '" + t.name +
                "': dma_bytes_per_ns_per_engine must be positive");
  descriptorOverheadNs_ = nonNegative("dma_descriptor_overhead_ns");
  descriptorHiddenBytes_ = positive("dma_descriptor_overhead_hidden_bytes");
  transposeEfficiencyFromHbm_ =
      positive("dma_transpose_efficiency_hbm_to_sbuf");
  transposeEfficiencyFromSbuf_ =
      positive("dma_transpose_efficiency_sbuf_to_sbuf");
  swdgeIssueNs_ = nonNegative("dma_swdge_issue_ns");
  swdgePerDescriptorNs_ = nonNegative("dma_swdge_per_descriptor_ns");
}

double CostModel::clockGHz(Engine engine) const {
  return clockGHz_[static_cast<int>(engine)];
}

double CostModel::dependentOverheadCycles(Engine engine) const {
  return dependentOverheadCycles_[static_cast<int>(engine)];
}

double CostModel::computeCycles(Opcode op, Engine engine,
                                const ComputeShape &s) const {
  double passes = std::max(1, s.streamed);
  double speedup = 1;
  if (engine == Engine::Vector) {
    // [D S5, S23] a 2-input op takes N instead of 2N cycles with one input
    // in PSUM; [D S6] also when all tensors are 16-bit in SBUF.
    if (s.streamed == 2 &&
        (s.streamedInPsum == 1 ||
         (s.all16Bit && s.streamedInPsum == 0 && !s.dstInPsum)))
      passes = 1;
    // [D S6] perf mode for 16-bit tensor_copy / tensor_scalar (and memset,
    // a copy of an immediate [E]): 4x in SBUF and contiguous, else 2x.
    bool perfOp = op == Opcode::Copy || op == Opcode::TensorScalar ||
                  op == Opcode::Memset;
    if (perfOp && s.all16Bit)
      speedup = (s.contiguous && s.streamedInPsum == 0 && !s.dstInPsum)
                    ? vectorPerfSpeedup_
                    : vectorPerfStridedSpeedup_;
  } else if (engine == Engine::Scalar) {
    // [D S7] NC-v4 ScalarE runs 16-bit tensor_copy / tensor_scalar at 2x
    // (the speedup is 1 on NC-v3).
    if ((op == Opcode::Copy || op == Opcode::TensorScalar) && s.all16Bit)
      speedup = scalarPerfSpeedup_;
  }
  double streamCycles = passes * s.elements / speedup;
  // [D S23] bn_aggr: 13 cycles per (count, mean, count * variance) triple
  // it combines. bn_stats streams its source once in fp32 [E: like
  // tensor_reduce; no 16-bit perf mode, as it computes in fp32 S11].
  if (op == Opcode::BnAggr)
    streamCycles = bnAggrCyclesPerTriple_ * s.elements / 3;
  // [E] n_gather: GpSimd gathers cost max(MIN_II, 2N) for N gathered
  // elements per partition.
  if (op == Opcode::NGather)
    streamCycles = gatherCyclesPerElement_ * s.elements;
  // [D S5] an innermost stride past stride_penalty_bytes halves the port.
  if (s.widestStrideBytes > stridePenaltyBytes_)
    streamCycles *= stridePenaltyFactor_;
  return std::max(minIICycles_, streamCycles);
}

double CostModel::matmulCycles(double stationaryFree, double movingFree,
                               bool fp32) const {
  // [D S23] max(min(64, N_stationary), N_moving) cycles; fp32 inputs 4x.
  double cycles =
      std::max(std::min(matmulMinIICycles_, stationaryFree), movingFree);
  return fp32 ? cycles * matmulFp32Factor_ : cycles;
}

double CostModel::loadStationaryCycles(double stationaryFree) const {
  return std::ceil(stationaryFree / loadStationaryColumnsPerCycle_);
}

double CostModel::dmaTransferNs(double bytes, double chunkBytes,
                                double descriptors) const {
  // Per-descriptor overhead, hidden once descriptors are large (fitted to
  // the S9 efficiency curve and the S8 1,416 ns measurement).
  double overhead = descriptorOverheadNs_ *
                    std::max(0.0, 1.0 - chunkBytes / descriptorHiddenBytes_);
  return bytes / dmaBytesPerNs_ + descriptors * overhead;
}

double CostModel::dmaTransposeBytesPerNs(bool fromSbuf) const {
  // [D S6] a DMA transpose runs at a fraction of the engine's rate.
  return dmaBytesPerNs_ * (fromSbuf ? transposeEfficiencyFromSbuf_
                                    : transposeEfficiencyFromHbm_);
}

bool CostModel::isDmaTranspose(int64_t eltBytes, int64_t srcRun,
                               int64_t dstRun) {
  int64_t unit = std::min(srcRun, dstRun);
  int64_t unitBytes = unit * eltBytes;
  // Units of one 2- or 4-byte element, or of 2 or 4 one-byte elements.
  return (unit == 1 || eltBytes == 1) && (unitBytes == 2 || unitBytes == 4) &&
         std::max(srcRun, dstRun) > unit;
}

} // namespace neuron::target
