//===- LowerPool.cpp - neuron.pool2d: windows taken in SBUF ---------------===//
//
// Max and average pooling with the planes on the partitions: 128 planes
// (an image's channel each) load at a time, and each window offset is one
// VectorE or GpSimd instruction over a strided access pattern of all of
// them. As slices, each of the kh x kw windows was a strided copy through
// HBM before an elementwise pass read them all again.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"
#include "runtime/target/Cost.h"

namespace mlir::neuron {

namespace {

/// Per step of 128 planes (the next step's load in flight while this one
/// computes): one DMA of their rows, then the window offsets (taps) on
/// VectorE and GpSimd, each engine into a partial result of its own,
/// combined, scaled and stored (the DMA rounds). A tap reads only the
/// outputs whose window position is inside the plane, a sub-rectangle of
/// them: padding is never materialized (its values, -inf or 0, change no
/// result). Max pooling keeps 16-bit partials (a max is exact in them:
/// VectorE streams 16-bit operands at twice fp32's rate); sums are fp32.
class WindowPool {
public:
  WindowPool(KernelLowering &k, Pool2dOp op)
      : k(k), x(k.bufferOf(op.getInput())), out(k.resultBuffer(op.getResult())),
        kernel(op.getKernel()), stride(op.getStride()),
        padding(op.getPadding()), dilation(op.getDilation()),
        scale(op.getScale().convertToDouble()),
        alu(op.getFn() == ReduceFn::max ? nisa::AluOp::max : nisa::AluOp::add),
        identity(op.getFn() == ReduceFn::max ? -INFINITY : 0.0) {
    auto in = tensorType(op.getInput()), res = tensorType(op.getResult());
    int64_t rank = in.getRank();
    planes = product(in.getShape().drop_back(2));
    h = in.getDimSize(rank - 2);
    w = in.getDimSize(rank - 1);
    ho = res.getDimSize(rank - 2);
    wo = res.getDimSize(rank - 1);
    elt = in.getElementType();
    accElt = op.getFn() == ReduceFn::max && elt.getIntOrFloatBitWidth() == 16
                 ? elt
                 : k.b.getF32Type();
    stepPlanes = k.target.partitions;
    planTaps();
  }

  void lower() {
    TileScope scope(k);
    for (int64_t s = 0; s < kSlots; ++s) {
      image[s] = k.tile(MemorySpace::sbuf, {stepPlanes, h * w}, elt);
      for (int64_t e = 0; e < kEngines; ++e)
        if (used(e))
          partial[s][e] =
              k.tile(MemorySpace::sbuf, {stepPlanes, ho * wo}, accElt);
    }
    int64_t full = planes / stepPlanes, rest = planes % stepPlanes;
    k.forEachPipelined(
        full, kSlots,
        [&](Value step, int64_t slot) { load(step, slot, stepPlanes); },
        [&](Value step, int64_t slot) { compute(step, slot, stepPlanes); });
    if (rest) {
      load(k.index(full), full % kSlots, rest);
      compute(k.index(full), full % kSlots, rest);
    }
  }

private:
  using TileScope = TileBuilder::TileScope;
  static constexpr int64_t kSlots = 2, kEngines = 2;
  static constexpr nisa::Engine kEngineOf[kEngines] = {nisa::Engine::vector,
                                                       nisa::Engine::gpsimd};

  bool used(int64_t e) const { return !tapsOf[e].empty(); }

  /// A window offset (i, j) and the outputs [row0, row1) x [col0, col1)
  /// whose window position at that offset is inside the plane.
  struct Tap {
    int64_t i, j, row0, row1, col0, col1;
    int64_t outputs() const { return (row1 - row0) * (col1 - col0); }
  };

  /// The outputs [first, last) along one dim whose input index o * s - p +
  /// t * d lies in [0, n).
  static std::pair<int64_t, int64_t>
  inside(int64_t t, int64_t s, int64_t p, int64_t d, int64_t n, int64_t outs) {
    int64_t off = t * d - p; // input index of output 0
    int64_t first = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t last = off >= n ? 0 : std::min(outs, (n - 1 - off) / s + 1);
    return {first, std::max(first, last)};
  }

  /// Each engine's taps in order, by the target's costs (the one of less
  /// work so far takes the next tap, VectorE's work counting the partials'
  /// combination); each engine's first tap covers every output and copies
  /// (the others accumulate), else its partial starts as the identity (a
  /// memset).
  void planTaps() {
    SmallVector<Tap> taps;
    for (int64_t i = 0; i < kernel[0]; ++i)
      for (int64_t j = 0; j < kernel[1]; ++j) {
        auto [r0, r1] = inside(i, stride[0], padding[0], dilation[0], h, ho);
        auto [c0, c1] = inside(j, stride[1], padding[1], dilation[1], w, wo);
        if (r1 > r0 && c1 > c0)
          taps.push_back({i, j, r0, r1, c0, c1});
      }
    // Whole taps first: the engines' partials start from them.
    llvm::stable_sort(taps, [&](const Tap &a, const Tap &b) {
      return a.outputs() > b.outputs();
    });
    const ::neuron::target::CostModel cost(k.target);
    bool all16 = accElt.getIntOrFloatBitWidth() == 16;
    auto ns = [&](int64_t e, const Tap &t, bool first) {
      ::neuron::target::ComputeShape shape;
      shape.elements = double(t.outputs());
      shape.streamed = first ? 1 : 2;
      shape.all16Bit = all16;
      shape.contiguous = stride[1] == 1;
      return cost.computeNs(first ? ::neuron::runtime::Opcode::Copy
                                  : ::neuron::runtime::Opcode::TensorTensor,
                            nisa::toProgram(kEngineOf[e]), shape);
    };
    // VectorE also combines the partials (when GpSimd has one).
    Tap all{0, 0, 0, ho, 0, wo};
    double load[kEngines] = {taps.size() > 1 ? ns(0, all, false) : 0, 0};
    for (const Tap &t : taps) {
      bool whole = t.outputs() == ho * wo;
      int64_t best = 0;
      double bestNs = 0;
      for (int64_t e = 0; e < kEngines; ++e) {
        bool first = tapsOf[e].empty() && whole;
        double done = load[e] + ns(e, t, first);
        if (e == 0 || done < bestNs) {
          best = e;
          bestNs = done;
        }
      }
      if (tapsOf[best].empty() && !whole)
        initialized[best] = true; // a memset, then this tap accumulates
      load[best] = bestNs;
      tapsOf[best].push_back(t);
    }
  }

  void load(Value step, int64_t slot, int64_t parts) {
    k.dma(k.view(x, k.scale(step, stepPlanes * h * w), {parts, h * w},
                 {h * w, 1}),
          k.view(image[slot], k.index(0), {parts, h * w}, {h * w, 1}));
  }

  void compute(Value step, int64_t slot, int64_t parts) {
    auto &b = k.b;
    auto outputs = [&](int64_t e, const Tap &t) {
      return k.view(partial[slot][e], k.index(t.row0 * wo + t.col0),
                    {parts, t.row1 - t.row0, t.col1 - t.col0},
                    {ho * wo, wo, 1});
    };
    for (int64_t e = 0; e < kEngines; ++e) {
      if (initialized[e])
        b.create<nisa::MemsetOp>(k.view(partial[slot][e], k.index(0),
                                        {parts, ho * wo}, {ho * wo, 1}),
                                 APFloat(identity), kEngineOf[e]);
      for (auto [n, t] : llvm::enumerate(tapsOf[e])) {
        int64_t r = t.row0 * stride[0] - padding[0] + t.i * dilation[0];
        int64_t c = t.col0 * stride[1] - padding[1] + t.j * dilation[1];
        Value window = k.view(image[slot], k.index(r * w + c),
                              {parts, t.row1 - t.row0, t.col1 - t.col0},
                              {h * w, stride[0] * w, stride[1]});
        Value into = outputs(e, t);
        if (n == 0 && !initialized[e])
          b.create<nisa::CopyOp>(window, into, kEngineOf[e]);
        else
          b.create<nisa::TensorTensorOp>(alu, into, window, into, kEngineOf[e]);
      }
    }
    Value result = k.view(partial[slot][used(0) ? 0 : 1], k.index(0),
                          {parts, ho * wo}, {ho * wo, 1});
    if (used(0) && used(1))
      b.create<nisa::TensorTensorOp>(
          alu, result,
          k.view(partial[slot][1], k.index(0), {parts, ho * wo}, {ho * wo, 1}),
          result, nisa::Engine::vector);
    if (scale != 1.0)
      b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, result, result,
                                     Value(), APFloat(scale), false);
    // From ScalarE's queue: on SyncE's a store would hold up the loads.
    b.create<nisa::DmaCopyOp>(result,
                              k.view(out, k.scale(step, stepPlanes * ho * wo),
                                     {parts, ho * wo}, {ho * wo, 1}),
                              nisa::Engine::scalar);
  }

  KernelLowering &k;
  Value x, out;
  ArrayRef<int64_t> kernel, stride, padding, dilation;
  double scale;
  nisa::AluOp alu;
  double identity;
  /// Planes a step: one a partition.
  int64_t planes, stepPlanes, h, w, ho, wo;
  Type elt, accElt;
  SmallVector<Tap> tapsOf[kEngines];
  /// Whether an engine's partial starts as a memset of the identity (no tap
  /// covers every output to copy first).
  bool initialized[kEngines] = {false, false};
  Value image[kSlots], partial[kSlots][kEngines];
};

struct Pool2dPattern : OpTilePattern<Pool2dPattern, Pool2dOp> {
  LogicalResult lowerOp(Pool2dOp op, KernelLowering &k) const {
    int64_t resident = op.residentBytes();
    if (resident + k.tileBytes > k.target.sbufBytesPerPartition)
      return op->emitOpError("keeps ")
             << resident << " bytes per partition resident, more than target '"
             << k.target.name << "' has";
    WindowPool(k, op).lower();
    return success();
  }
};

} // namespace

void populatePoolPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<Pool2dPattern>());
}

} // namespace mlir::neuron
