//===- GroupPlanTest.cpp - a fused group's plan, checked without emitting -===//
//
// GroupPlan::decide alone: which ops fold into others' instructions, the
// tile geometry and slots, and the engines, for groups written in the
// neuron dialect.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/GroupPlan.h"

#include "compiler/Registration.h"
#include "tests/unit/CatchCompat.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <map>
#include <string>

using namespace mlir;
using namespace mlir::neuron;
using ::neuron::runtime::Opcode;

namespace {

/// The bytes per partition of a flat tile: neuron-lower-to-nisa's default.
constexpr int64_t kTileBytes = 8192;

/// A parsed function's first neuron.fusion: its ops by result name (the
/// `loc("name")` each op carries) and its plan.
struct Group {
  MLIRContext context;
  OwningOpRef<ModuleOp> module;
  FusionOp fusion;
  SmallVector<Operation *> ops;
  std::map<std::string, Operation *> byName;
  std::string reason;
  FailureOr<GroupPlan> plan = failure();

  explicit Group(const std::string &body, const std::string &target = "trn2") {
    DialectRegistry registry;
    ::neuron::compiler::registerDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
    module = parseSourceString<ModuleOp>(body, &context);
    REQUIRE(module);
    module->walk([&](FusionOp f) {
      if (!fusion)
        fusion = f;
    });
    REQUIRE(fusion);
    Block &block = fusion.getBody().front();
    for (Operation &op : block.without_terminator()) {
      ops.push_back(&op);
      if (auto name = dyn_cast<NameLoc>(op.getLoc()))
        byName[name.getName().str()] = &op;
    }
    SmallVector<Value> inputs(block.getArguments());
    SmallVector<Value> outputs(
        cast<YieldOp>(block.getTerminator()).getValues());
    mlir::neuron::NeuronLowerToNisaOptions knobs;
    knobs.freeTileBytes = kTileBytes;
    plan =
        GroupPlan::decide(ops, inputs, outputs,
                          ::neuron::target::getTarget(target), knobs, reason);
  }

  Operation *op(const std::string &name) const {
    auto it = byName.find(name);
    REQUIRE(it != byName.end());
    return it->second;
  }
};

const char *kSoftmax = R"mlir(
func.func @softmax_bf16(%x: tensor<256x64xbf16>) -> tensor<256x64xbf16> {
  %r = neuron.fusion(%x) : (tensor<256x64xbf16>) -> tensor<256x64xbf16> {
  ^bb0(%a: tensor<256x64xbf16>):
    %w = neuron.cast %a : tensor<256x64xbf16> -> tensor<256x64xf32> loc("widen")
    %m = neuron.reduce max %w {count = 1} : tensor<256x64xf32> -> tensor<256xf32> loc("max")
    %r1 = neuron.reshape %m : tensor<256xf32> -> tensor<256x1xf32>
    %b = neuron.broadcast %r1 : tensor<256x1xf32> -> tensor<256x64xf32>
    %d = neuron.binary sub %w, %b : tensor<256x64xf32>, tensor<256x64xf32> -> tensor<256x64xf32> loc("sub")
    %e = neuron.unary exp %d : tensor<256x64xf32> -> tensor<256x64xf32> loc("exp")
    %s = neuron.reduce sum %e {count = 1} : tensor<256x64xf32> -> tensor<256xf32> loc("sum")
    %r2 = neuron.reshape %s : tensor<256xf32> -> tensor<256x1xf32>
    %b2 = neuron.broadcast %r2 : tensor<256x1xf32> -> tensor<256x64xf32>
    %y = neuron.binary div %e, %b2 : tensor<256x64xf32>, tensor<256x64xf32> -> tensor<256x64xf32> loc("div")
    %n = neuron.cast %y : tensor<256x64xf32> -> tensor<256x64xbf16> loc("narrow")
    neuron.yield %n : tensor<256x64xbf16>
  }
  return %r : tensor<256x64xbf16>
}
)mlir";

const char *kRmsNorm = R"mlir(
func.func @rms_norm(%x: tensor<256x512xbf16>, %w: tensor<512xbf16>) -> tensor<256x512xbf16> {
  %r = neuron.fusion(%x, %w) : (tensor<256x512xbf16>, tensor<512xbf16>) -> tensor<256x512xbf16> {
  ^bb0(%a: tensor<256x512xbf16>, %g: tensor<512xbf16>):
    %inv = neuron.constant dense<1.953130e-03> : tensor<256x1xbf16>
    %eps = neuron.constant dense<9.983770e-07> : tensor<256x1xbf16>
    %sq = neuron.binary mul %a, %a : tensor<256x512xbf16>, tensor<256x512xbf16> -> tensor<256x512xbf16> loc("square")
    %s = neuron.reduce sum %sq {count = 1} : tensor<256x512xbf16> -> tensor<256xbf16> loc("sum")
    %s1 = neuron.reshape %s : tensor<256xbf16> -> tensor<256x1xbf16>
    %m = neuron.binary mul %s1, %inv : tensor<256x1xbf16>, tensor<256x1xbf16> -> tensor<256x1xbf16> loc("mean")
    %e = neuron.binary add %m, %eps : tensor<256x1xbf16>, tensor<256x1xbf16> -> tensor<256x1xbf16> loc("eps")
    %rs = neuron.unary rsqrt %e : tensor<256x1xbf16> -> tensor<256x1xbf16> loc("rsqrt")
    %b = neuron.broadcast %rs : tensor<256x1xbf16> -> tensor<256x512xbf16>
    %n = neuron.binary mul %a, %b : tensor<256x512xbf16>, tensor<256x512xbf16> -> tensor<256x512xbf16> loc("normalize")
    %gb = neuron.broadcast %g : tensor<512xbf16> -> tensor<256x512xbf16>
    %y = neuron.binary mul %n, %gb : tensor<256x512xbf16>, tensor<256x512xbf16> -> tensor<256x512xbf16> loc("scale")
    neuron.yield %y : tensor<256x512xbf16>
  }
  return %r : tensor<256x512xbf16>
}
)mlir";

/// A flat group: x * 2 + y over a million fp32 elements.
const char *kFlat = R"mlir(
func.func @axpy(%x: tensor<1048576xf32>, %y: tensor<1048576xf32>) -> tensor<1048576xf32> {
  %r = neuron.fusion(%x, %y) : (tensor<1048576xf32>, tensor<1048576xf32>) -> tensor<1048576xf32> {
  ^bb0(%a: tensor<1048576xf32>, %b: tensor<1048576xf32>):
    %two = neuron.constant dense<2.0> : tensor<1048576xf32>
    %ax = neuron.binary mul %a, %two : tensor<1048576xf32>, tensor<1048576xf32> -> tensor<1048576xf32> loc("ax")
    %s = neuron.binary add %ax, %b : tensor<1048576xf32>, tensor<1048576xf32> -> tensor<1048576xf32> loc("add")
    neuron.yield %s : tensor<1048576xf32>
  }
  return %r : tensor<1048576xf32>
}
)mlir";

/// Every op that becomes an instruction runs on an engine that may issue
/// it.
void checkEnginesCanIssue(const Group &g) {
  const GroupPlan &plan = *g.plan;
  for (Operation *op : g.ops) {
    if (isa<ConstantOp, BroadcastOp, ReshapeOp>(op) ||
        plan.folded.contains(op) || plan.summed.contains(op))
      continue;
    INFO(op->getName().getStringRef().str());
    REQUIRE(plan.engines.front().count(op));
    nisa::Engine engine = plan.engines.front().lookup(op);
    // A row sum on ScalarE is an identity activation that accumulates.
    Opcode instruction =
        engine == nisa::Engine::scalar && plan.scalarSums.contains(op)
            ? Opcode::Activation
            : plan.instructionOf(op);
    CHECK(nisa::canIssue(instruction, engine));
  }
}

} // namespace

TEST_CASE("softmax: casts, x - max and the row sum fold into exp",
          "[group-plan]") {
  Group g(kSoftmax);
  REQUIRE(succeeded(g.plan));
  const GroupPlan &plan = *g.plan;
  // The widening cast is exact; sub becomes exp's bias; exp sums its rows;
  // the divide stores bf16 directly (the narrowing cast folds).
  CHECK(plan.folded.contains(g.op("widen")));
  CHECK(plan.folded.contains(g.op("sub")));
  CHECK(plan.biasOf.lookup(g.op("exp")) == g.op("sub"));
  CHECK(plan.summed.contains(g.op("sum")));
  CHECK(plan.rowSumOf.lookup(g.op("exp")).getOperation() == g.op("sum"));
  CHECK(plan.folded.contains(g.op("narrow")));
  CHECK(plan.narrowedBy.lookup(g.op("div")->getResult(0)) ==
        g.op("narrow")->getResult(0));
  CHECK_FALSE(plan.folded.contains(g.op("max")));
  CHECK_FALSE(plan.folded.contains(g.op("div")));

  CHECK(plan.instructionOf(g.op("exp")) == Opcode::Activation);
  CHECK(plan.instructionOf(g.op("div")) == Opcode::TensorScalar);
  CHECK(plan.instructionOf(g.op("max")) == Opcode::TensorReduce);
  CHECK(plan.engines.front().lookup(g.op("exp")) == nisa::Engine::scalar);
  checkEnginesCanIssue(g);

  // By rows: a row of 64 per partition, two steps of 128 rows, each
  // loaded and stored tile in two slots.
  CHECK(plan.fusion.byRows);
  CHECK(plan.cols == 64);
  CHECK(plan.steps == 2);
  CHECK(plan.numSlots == 2);
  CHECK(plan.innerSlots == 2);
  // The row max, exp's result and the sums it accumulates get tiles of
  // their own; the folded ops and the output (stored from its slot) none.
  REQUIRE(plan.intermediates.size() == 3);
  CHECK(plan.intermediates[0].first == g.op("max")->getResult(0));
  CHECK(plan.intermediates[1].first == g.op("exp")->getResult(0));
  CHECK(plan.intermediates[2].first == g.op("sum")->getResult(0));
}

TEST_CASE("RMSNorm: a square activation summing rows, one "
          "scalar_tensor_tensor",
          "[group-plan]") {
  Group g(kRmsNorm);
  REQUIRE(succeeded(g.plan));
  const GroupPlan &plan = *g.plan;
  CHECK(plan.activations.contains(g.op("square")));
  CHECK(plan.instructionOf(g.op("square")) == Opcode::Activation);
  CHECK(plan.rowSumOf.lookup(g.op("square")).getOperation() == g.op("sum"));
  CHECK(plan.summed.contains(g.op("sum")));
  CHECK(plan.scaledBy.lookup(g.op("scale")).getOperation() ==
        g.op("normalize"));
  CHECK(plan.folded.contains(g.op("normalize")));
  CHECK(plan.instructionOf(g.op("scale")) == Opcode::ScalarTensorTensor);
  CHECK(plan.instructionOf(g.op("rsqrt")) == Opcode::Activation);
  // The squares are kept only for their sums: stored in 16 bits.
  bool squaresNarrow = false;
  for (auto [v, storage] : plan.intermediates)
    if (v == g.op("square")->getResult(0))
      squaresNarrow = storage.isBF16();
  CHECK(squaresNarrow);
  // The weight is a row broadcast to every partition (a column of the
  // plan), loaded once; the constants are splats (immediates).
  CHECK(plan.rep(g.fusion.getBody().front().getArgument(1)) == Rep::Col);
  REQUIRE(plan.loaded.size() == 4);
  CHECK(plan.rep(plan.loaded[2]) == Rep::Splat);
  CHECK(plan.rep(plan.loaded[3]) == Rep::Splat);
  checkEnginesCanIssue(g);
}

TEST_CASE("flat group: tiles of free-tile-bytes, slots within half of SBUF",
          "[group-plan]") {
  Group g(kFlat);
  REQUIRE(succeeded(g.plan));
  const GroupPlan &plan = *g.plan;
  CHECK_FALSE(plan.fusion.byRows);
  // fp32: 8 KiB per partition is 2048 columns; 2^20 elements are four
  // [128, 2048] steps.
  CHECK(plan.cols == kTileBytes / 4);
  CHECK(plan.steps == 4);
  // Up to four slots of the streamed tiles (two inputs, one output) within
  // half of SBUF, a tile counted as cols * (bits + 7) / 8 bytes (an
  // over-estimate that keeps programs as they were): three slots here.
  int64_t sbuf = ::neuron::target::getTarget("trn2").sbufBytesPerPartition;
  int64_t perSlot = 3 * (plan.cols * (32 + 7) / 8), slots = 4;
  while (slots * perSlot > sbuf / 2)
    --slots;
  CHECK(plan.numSlots == slots);
  CHECK(plan.numSlots == 3);
  CHECK(plan.innerSlots == 2);
  CHECK(plan.instructionOf(g.op("ax")) == Opcode::TensorScalar);
  CHECK(plan.instructionOf(g.op("add")) == Opcode::TensorTensor);
  CHECK(plan.folded.empty());
  // The constant is an immediate (a splat), not a stream.
  REQUIRE(plan.loaded.size() == 3);
  CHECK(plan.rep(plan.loaded[2]) == Rep::Splat);
  checkEnginesCanIssue(g);
}

TEST_CASE("a group that cannot be tiled says why", "[group-plan]") {
  // Two reductions over different row counts: no common tiling.
  Group g(R"mlir(
func.func @two_shapes(%x: tensor<4x8xf32>, %y: tensor<8x4xf32>) -> (tensor<4xf32>, tensor<8xf32>) {
  %r:2 = neuron.fusion(%x, %y) : (tensor<4x8xf32>, tensor<8x4xf32>) -> (tensor<4xf32>, tensor<8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>):
    %s = neuron.reduce sum %a {count = 1} : tensor<4x8xf32> -> tensor<4xf32>
    %t = neuron.reduce sum %b {count = 1} : tensor<8x4xf32> -> tensor<8xf32>
    neuron.yield %s, %t : tensor<4xf32>, tensor<8xf32>
  }
  return %r#0, %r#1 : tensor<4xf32>, tensor<8xf32>
}
)mlir");
  CHECK(failed(g.plan));
  CHECK_FALSE(g.reason.empty());
}
