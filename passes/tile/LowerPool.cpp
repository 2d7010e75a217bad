//===- LowerPool.cpp - neuron.pool2d: windows taken in SBUF ---------------===//
//
// Max and average pooling with the planes on the partitions: 128 planes
// (an image's channel each) load at a time, padded in SBUF, and each window
// offset is one VectorE or GpSimd instruction over a strided access pattern
// of all of them. As slices, each of the kh x kw windows was a strided copy
// through HBM before an elementwise pass read them all again.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

namespace {

/// Per step of 128 planes (the next step's load in flight while this one
/// computes): one DMA of their rows, where the pooling pads a GpSimd copy
/// into the interior of a plane whose border holds fn's identity, then the
/// window offsets in turn on VectorE (even ones) and GpSimd (odd ones) into
/// two fp32 partial results, combined, scaled and stored (the DMA rounds).
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
    hp = h + 2 * padding[0];
    wp = w + 2 * padding[1];
    padded = padding[0] || padding[1];
    elt = in.getElementType();
    stepPlanes = k.target.partitions;
  }

  void lower() {
    TileScope scope(k);
    for (int64_t s = 0; s < kSlots; ++s) {
      image[s] = k.tile(MemorySpace::sbuf, {stepPlanes, hp * wp}, elt);
      if (padded) {
        loaded[s] = k.tile(MemorySpace::sbuf, {stepPlanes, h * w}, elt);
        k.fillBorders(image[s],
                      {0, stepPlanes, 1, hp * wp, 0, wp, padding[0],
                       padding[0] + h, padding[1], w},
                      identity);
      }
      for (Value &acc : partial[s])
        acc =
            k.tile(MemorySpace::sbuf, {stepPlanes, ho * wo}, k.b.getF32Type());
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
  static constexpr int64_t kSlots = 2;

  void load(Value step, int64_t slot, int64_t parts) {
    Value src = k.view(x, k.scale(step, stepPlanes * h * w), {parts, h * w},
                       {h * w, 1});
    if (!padded) {
      k.dma(src, k.view(image[slot], k.index(0), {parts, h * w}, {hp * wp, 1}));
      return;
    }
    k.dma(src, k.view(loaded[slot], k.index(0), {parts, h * w}, {h * w, 1}));
    k.b.create<nisa::CopyOp>(
        k.view(loaded[slot], k.index(0), {parts, h, w}, {h * w, w, 1}),
        k.view(image[slot], k.index(padding[0] * wp + padding[1]),
               {parts, h, w}, {hp * wp, wp, 1}),
        nisa::Engine::gpsimd);
  }

  void compute(Value step, int64_t slot, int64_t parts) {
    auto &b = k.b;
    auto acc = [&](int64_t which) {
      return k.view(partial[slot][which], k.index(0), {parts, ho, wo},
                    {ho * wo, wo, 1});
    };
    int64_t t = 0;
    for (int64_t i = 0; i < kernel[0]; ++i)
      for (int64_t j = 0; j < kernel[1]; ++j, ++t) {
        Value window =
            k.view(image[slot], k.index(i * dilation[0] * wp + j * dilation[1]),
                   {parts, ho, wo}, {hp * wp, stride[0] * wp, stride[1]});
        // Even offsets on VectorE, odd ones on GpSimd, each into its own
        // partial result.
        nisa::Engine engine =
            t % 2 ? nisa::Engine::gpsimd : nisa::Engine::vector;
        Value into = acc(t % 2);
        if (t < 2)
          b.create<nisa::CopyOp>(window, into, engine);
        else
          b.create<nisa::TensorTensorOp>(alu, into, window, into, engine);
      }
    if (t > 1)
      b.create<nisa::TensorTensorOp>(alu, acc(0), acc(1), acc(0),
                                     nisa::Engine::vector);
    if (scale != 1.0)
      b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, acc(0), acc(0),
                                     Value(), APFloat(scale), false);
    // From ScalarE's queue: on SyncE's a store would hold up the loads.
    b.create<nisa::DmaCopyOp>(
        k.view(partial[slot][0], k.index(0), {parts, ho * wo}, {ho * wo, 1}),
        k.view(out, k.scale(step, stepPlanes * ho * wo), {parts, ho * wo},
               {ho * wo, 1}),
        nisa::Engine::scalar);
  }

  KernelLowering &k;
  Value x, out;
  ArrayRef<int64_t> kernel, stride, padding, dilation;
  double scale;
  nisa::AluOp alu;
  double identity;
  /// Planes a step: one a partition.
  int64_t planes, stepPlanes, h, w, ho, wo, hp, wp;
  bool padded;
  Type elt;
  Value image[kSlots], loaded[kSlots], partial[kSlots][2];
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
