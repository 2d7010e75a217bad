//===- CostTest.cpp - The per-instruction cost model ----------------------===//
//
// The formulas of runtime/target/Cost.h on their own, by the target's
// figures (TimingTest.cpp checks that the timing model charges them).
//
//===----------------------------------------------------------------------===//

#include "runtime/target/Cost.h"
#include "tests/unit/CatchCompat.h"
#include "tests/unit/TestUtil.h"

#include <cmath>

using neuron::runtime::Engine;
using neuron::runtime::Opcode;
using neuron::target::ComputeShape;
using neuron::target::CostModel;
using neuron::target::getTarget;
using neuron::target::Target;
using neuron::test::contains;
using neuron::test::errorOf;

namespace {

ComputeShape shape(double elements, int streamed, bool all16) {
  ComputeShape s;
  s.elements = elements;
  s.streamed = streamed;
  s.all16Bit = all16;
  return s;
}

} // namespace

TEST_CASE("compute instructions stream their inputs, at least MIN_II",
          "[cost]") {
  const Target &t = getTarget("trn2");
  CostModel cost(t);
  const double minII = t.value("engine_min_ii_cycles");
  // fp32 tensor_tensor on VectorE: two passes over 512 elements.
  CHECK(cost.computeCycles(Opcode::TensorTensor, Engine::Vector,
                           shape(512, 2, false)) == 1024);
  // 16-bit in SBUF: both inputs stream together.
  CHECK(cost.computeCycles(Opcode::TensorTensor, Engine::Vector,
                           shape(512, 2, true)) == 512);
  // ... and so does one input in PSUM, whatever the dtypes.
  ComputeShape psum = shape(512, 2, false);
  psum.streamedInPsum = 1;
  CHECK(cost.computeCycles(Opcode::TensorTensor, Engine::Vector, psum) == 512);
  // Tiny instructions cost the engine's minimum initiation interval.
  CHECK(cost.computeCycles(Opcode::Activation, Engine::Scalar,
                           shape(1, 1, false)) == minII);
  CHECK(cost.computeCycles(Opcode::TensorReduce, Engine::GpSimd,
                           shape(8, 1, false)) == minII);
  CHECK(cost.computeNs(Opcode::Activation, Engine::Scalar,
                       shape(1200, 1, false)) == 1200 / t.scalarClockGHz);
}

TEST_CASE("bn_stats streams its source, bn_aggr costs 13 cycles a triple",
          "[cost]") {
  for (const char *name : {"trn2", "trn3"}) {
    const Target &t = getTarget(name);
    CostModel cost(t);
    // One fp32 pass over 512 elements, 16-bit or not.
    CHECK(cost.computeCycles(Opcode::BnStats, Engine::Vector,
                             shape(512, 1, true)) == 512);
    // [S23] max(MIN_II, 13 * N / 3): 8 bn_stats results (48 elements).
    CHECK(cost.computeCycles(Opcode::BnAggr, Engine::Vector,
                             shape(48, 1, false)) == 13 * 16);
    CHECK(cost.computeCycles(Opcode::BnAggr, Engine::Vector,
                             shape(6, 1, false)) ==
          t.value("engine_min_ii_cycles"));
  }
}

TEST_CASE("n_gather costs 2 GpSimd cycles an element, at least MIN_II",
          "[cost]") {
  for (const char *name : {"trn2", "trn3"}) {
    const Target &t = getTarget(name);
    CostModel cost(t);
    CHECK(cost.computeCycles(Opcode::NGather, Engine::GpSimd,
                             shape(128, 1, false)) == 256);
    CHECK(cost.computeCycles(Opcode::NGather, Engine::GpSimd,
                             shape(16, 1, true)) ==
          t.value("engine_min_ii_cycles"));
  }
}

TEST_CASE("16-bit perf modes follow the target", "[cost]") {
  for (const char *name : {"trn2", "trn3"}) {
    const Target &t = getTarget(name);
    CostModel cost(t);
    double vector = t.value("vector_elems_per_cycle_16bit") / t.partitions;
    double scalar = t.value("scalar_elems_per_cycle_16bit") / t.partitions;
    CHECK(cost.computeCycles(Opcode::Copy, Engine::Vector,
                             shape(4096, 1, true)) == 4096 / vector);
    CHECK(cost.computeCycles(Opcode::TensorScalar, Engine::Scalar,
                             shape(4096, 1, true)) == 4096 / scalar);
    // Not a perf-mode instruction, or not 16-bit: one element per cycle.
    CHECK(cost.computeCycles(Opcode::Activation, Engine::Scalar,
                             shape(4096, 1, true)) == 4096);
    CHECK(cost.computeCycles(Opcode::Copy, Engine::Vector,
                             shape(4096, 1, false)) == 4096);
    // Strided or in PSUM, VectorE's perf mode is the lesser one.
    ComputeShape strided = shape(4096, 1, true);
    strided.contiguous = false;
    CHECK(cost.computeCycles(Opcode::Copy, Engine::Vector, strided) ==
          4096 / t.value("vector_perf_mode_strided_speedup"));
  }
  // ScalarE's 16-bit speed-up exists on NC-v4 only [S7].
  CostModel trn2(getTarget("trn2")), trn3(getTarget("trn3"));
  CHECK(trn3.computeCycles(Opcode::Copy, Engine::Scalar, shape(4096, 1, true)) <
        trn2.computeCycles(Opcode::Copy, Engine::Scalar, shape(4096, 1, true)));
}

TEST_CASE("a wide innermost stride pays the port penalty", "[cost]") {
  const Target &t = getTarget("trn2");
  CostModel cost(t);
  ComputeShape s = shape(1024, 1, false);
  s.widestStrideBytes = t.value("stride_penalty_bytes");
  CHECK(cost.computeCycles(Opcode::Activation, Engine::Scalar, s) == 1024);
  s.widestStrideBytes += 4;
  CHECK(cost.computeCycles(Opcode::Activation, Engine::Scalar, s) ==
        1024 * t.value("stride_penalty_factor"));
}

TEST_CASE("matmuls cost max(min(MIN_II, stationary), moving) cycles",
          "[cost]") {
  const Target &t = getTarget("trn2");
  CostModel cost(t);
  const double minII = t.value("matmul_min_ii_cycles");
  CHECK(cost.matmulCycles(128, 512, false) == 512);
  CHECK(cost.matmulCycles(128, 8, false) == minII);
  CHECK(cost.matmulCycles(16, 8, false) == 16);
  CHECK(cost.matmulCycles(128, 512, true) ==
        512 * t.value("matmul_fp32_cost_factor"));
  CHECK(cost.loadStationaryCycles(128) ==
        std::ceil(128 / t.value("matmul_load_stationary_columns_per_cycle")));
}

TEST_CASE("DMA transfers pay a descriptor overhead large chunks hide",
          "[cost]") {
  const Target &t = getTarget("trn2");
  CostModel cost(t);
  const double hidden = t.value("dma_descriptor_overhead_hidden_bytes");
  const double rate = t.dmaBytesPerNsPerEngine;
  CHECK(cost.dmaTransferNs(65536, hidden, 65536 / hidden) == 65536 / rate);
  double small = cost.dmaTransferNs(65536, 256, 256);
  CHECK(small == 65536 / rate + 256 * t.value("dma_descriptor_overhead_ns") *
                                    (1 - 256 / hidden));
  CHECK(cost.dmaTransposeBytesPerNs(false) ==
        rate * t.value("dma_transpose_efficiency_hbm_to_sbuf"));
  CHECK(cost.dmaTransposeBytesPerNs(true) ==
        rate * t.value("dma_transpose_efficiency_sbuf_to_sbuf"));
}

TEST_CASE("a DMA transposes 2- and 4-byte units, fp8 in pairs or fours",
          "[cost]") {
  // One side walks single 2- or 4-byte elements the other has contiguous.
  CHECK(CostModel::isDmaTranspose(2, 1, 128));
  CHECK(CostModel::isDmaTranspose(4, 512, 1));
  // fp8 alone is no transpose: one element per descriptor.
  CHECK_FALSE(CostModel::isDmaTranspose(1, 1, 128));
  // fp8 pairs and fours are 2- and 4-byte units; eights are not.
  CHECK(CostModel::isDmaTranspose(1, 2, 256));
  CHECK(CostModel::isDmaTranspose(1, 1024, 4));
  CHECK_FALSE(CostModel::isDmaTranspose(1, 8, 256));
  // Wider elements in runs, and copies contiguous the same way on both
  // sides, are plain transfers.
  CHECK_FALSE(CostModel::isDmaTranspose(2, 2, 128));
  CHECK_FALSE(CostModel::isDmaTranspose(2, 1, 1));
  CHECK_FALSE(CostModel::isDmaTranspose(1, 2, 2));
}

TEST_CASE("a figure out of range is an error naming it", "[cost]") {
  Target t = getTarget("trn2");
  t.figures["engine_min_ii_cycles"].value = -1;
  CHECK(contains(errorOf([&] { CostModel cost(t); }), "engine_min_ii_cycles"));
  t = getTarget("trn2");
  t.figures.erase("matmul_fp32_cost_factor");
  CHECK(
      contains(errorOf([&] { CostModel cost(t); }), "matmul_fp32_cost_factor"));
}
