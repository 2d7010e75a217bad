//===- LowerGroupNorm.cpp - neuron.group_norm: whole groups a step --------===//
//
// Group normalization with an image's channels on the partitions, whole
// groups a step (rows of H x W positions, one a channel): each row's mean
// and variance by VectorE's bn_stats and bn_aggr; a group's combined on
// TensorE, a matmul with a 0/1 row-to-group membership matrix summing the
// rows of each group and one with its transpose handing each row its
// group's values back (the variance exactly: the rows' variances plus their
// means' squared deviations from the group's); then one ScalarE pass, x *
// scale + shift per row (scale = rstd * weight, shift = bias - mean *
// scale), computed in fp32 and rounded once. Rows that fit SBUF are read
// once, the next step's load and statistics issued before this step's
// normalization; longer rows go through in chunks twice (statistics, then
// normalization). Decomposed, each reduction over a group (rows of C / G x
// H x W elements) wrote a float32 copy of the input through HBM.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

#include <limits>
#include <numeric>

namespace mlir::neuron {

namespace {

class GroupNormKernel {
public:
  GroupNormKernel(KernelLowering &k, GroupNormOp op)
      : k(k), x(k.bufferOf(op.getInput())),
        weight(op.getWeight() ? k.bufferOf(op.getWeight()) : Value()),
        bias(op.getBias() ? k.bufferOf(op.getBias()) : Value()),
        out(k.resultBuffer(op.getResult())), mean(k.resultBuffer(op.getMean())),
        rstd(k.resultBuffer(op.getRstd())), eps(op.getEps().convertToDouble()),
        fn(op.getSilu() ? nisa::ActivationFn::silu
                        : nisa::ActivationFn::identity) {
    auto in = tensorType(op.getInput());
    elt = in.getElementType();
    n = in.getDimSize(0);
    c = in.getDimSize(1);
    hw = product(in.getShape().drop_front(2));
    groups = op.getGroups();
    cg = c / groups;
    groupsPerStep = std::min(groups, k.target.partitions / cg);
    stepRows = groupsPerStep * cg;
    steps = (groups + groupsPerStep - 1) / groupsPerStep;
    bnMax = static_cast<int64_t>(k.target.value("bn_stats_max_free_elements"));
    int64_t eltBytes = in.getElementTypeBitWidth() / 8;
    // Columns a chunk: the whole row where kMinSlots of them fit
    // kRowBudget; then as many slots as fit, up to kMaxSlots.
    cols = hw;
    if (kMinSlots * hw * eltBytes > kRowBudget)
      cols = std::max<int64_t>(bnMax, kRowBudget / (kMinSlots * eltBytes) /
                                          bnMax * bnMax);
    slots = std::clamp<int64_t>(kRowBudget / (cols * eltBytes), kMinSlots,
                                kMaxSlots);
    chunks = (hw + cols - 1) / cols;
    statsCols = 6 * ((cols + bnMax - 1) / bnMax);
  }

  /// SBUF bytes per partition the kernel keeps: the row tiles, their
  /// statistics, a chunked row's per chunk, and [rows, 1] values.
  int64_t residentBytes() const {
    return kRowBudget + 4 * (slots * (statsCols + kSmallCols) + 3 * chunks +
                             2 * steps + 2 * groupsPerStep + 2 * stepRows);
  }

  void lower() {
    TileScope scope(k);
    auto f32 = k.b.getF32Type();
    for (int64_t s = 0; s < slots; ++s) {
      rows.push_back(k.tile(MemorySpace::sbuf, {stepRows, cols}, elt));
      stats.push_back(k.tile(MemorySpace::sbuf, {stepRows, statsCols}, f32));
      small.push_back(k.tile(MemorySpace::sbuf, {stepRows, kSmallCols}, f32));
    }
    if (chunks > 1)
      triples = k.tile(MemorySpace::sbuf, {stepRows, 3 * chunks}, f32);
    psum = k.tile(MemorySpace::psum, {stepRows, slots * kPsumCols}, f32);
    makeMembership();
    loadAffine();
    if (chunks == 1)
      pipelined();
    else
      k.forEach(n, [&](Value image) {
        for (int64_t j = 0; j < steps; ++j)
          chunked(image, j);
      });
  }

private:
  using TileScope = TileBuilder::TileScope;
  /// Row tiles (and statistics) the steps rotate over: the loads of the
  /// next slots - 2 steps in flight while this step finishes and the one
  /// before's store completes.
  static constexpr int64_t kMinSlots = 3, kMaxSlots = 8;
  /// SBUF bytes per partition the row tiles may take.
  static constexpr int64_t kRowBudget = 96 * 1024;
  /// Per slot, fp32 columns of [rows, 1] values (small) and PSUM sums.
  static constexpr int64_t kSmallCols = 8, kPsumCols = 8;
  /// Small's columns: a row's mean and variance, its variance plus its
  /// mean's squared deviation, its group's mean and rstd, scale and shift.
  enum Small { RowMean, RowVar, RowSpread, GroupMean, GroupRstd, Scale, NegScale, Shift };

  /// Rows and groups of step j (the last may have fewer groups).
  int64_t groupsOf(int64_t j) const {
    return std::min(groupsPerStep, groups - j * groupsPerStep);
  }
  int64_t rowsOf(int64_t j) const { return groupsOf(j) * cg; }

  Value column(Value t, int64_t col, int64_t rows) {
    int64_t width = cast<MemRefType>(t.getType()).getShape()[1];
    return k.view(t, k.index(col), {rows, 1}, {width, 1});
  }
  Value smallCol(int64_t slot, int64_t col, int64_t rows) {
    return column(small[slot], col, rows);
  }
  Value psumCols(int64_t slot, int64_t col, int64_t rows, int64_t width) {
    return k.view(psum, k.index(slot * kPsumCols + col), {rows, width},
                  {slots * kPsumCols, 1});
  }

  /// member[p, g] = 1 / cg where row p is in group g (p / cg == g), so
  /// that a matmul by it averages each group's rows, and memberT[g, p] = 1,
  /// which hands each row its group's value: from iota's p - cg * g,
  /// 0 <= v < cg.
  void makeMembership() {
    auto f32 = k.b.getF32Type();
    auto build = [&](int64_t rows, int64_t width, double partStep,
                     double freeStep, double value) {
      Value v = k.tile(MemorySpace::sbuf, {rows, width}, f32);
      k.b.create<nisa::IotaOp>(v, APFloat(0.0), APFloat(partStep),
                               k.b.getDenseF64ArrayAttr({freeStep}));
      Value lo = k.tile(MemorySpace::sbuf, {rows, width}, f32);
      Value m = k.tile(MemorySpace::sbuf, {rows, width}, f32);
      k.b.create<nisa::TensorScalarOp>(nisa::AluOp::ge, v, lo, Value(),
                                       APFloat(0.0), false);
      k.b.create<nisa::TensorScalarOp>(nisa::AluOp::lt, v, m, Value(),
                                       APFloat(double(cg)), false);
      k.b.create<nisa::ScalarTensorTensorOp>(
          nisa::AluOp::multiply, nisa::AluOp::multiply, lo, m, m, Value(),
          APFloat(value), nisa::Engine::vector);
      return m;
    };
    member = build(stepRows, groupsPerStep, 1.0, -double(cg), 1.0 / cg);
    memberT = build(groupsPerStep, stepRows, -double(cg), 1.0, 1.0);
  }

  /// Per step, the weight and bias of its rows' channels as fp32 columns
  /// (the DMA widens them).
  void loadAffine() {
    auto f32 = k.b.getF32Type();
    for (auto [buffer, tile] : {std::pair{weight, &weightCols},
                                std::pair{bias, &biasCols}}) {
      if (!buffer)
        continue;
      *tile = k.tile(MemorySpace::sbuf, {stepRows, steps}, f32);
      for (int64_t j = 0; j < steps; ++j)
        k.dma(k.view(buffer, k.index(j * stepRows), {rowsOf(j), 1}, {1, 1}),
              column(*tile, j, rowsOf(j)));
    }
  }

  /// Columns [col0, col0 + width) of step j's rows of `image`.
  Value rowsIn(Value buffer, Value image, int64_t j, int64_t col0,
               int64_t width) {
    Value first = k.addOffset(k.scale(image, c * hw), j * stepRows * hw + col0);
    return k.view(buffer, first, {rowsOf(j), width}, {hw, 1});
  }
  Value rowTile(int64_t slot, int64_t j, int64_t width) {
    return k.view(rows[slot], k.index(0), {rowsOf(j), width}, {cols, 1});
  }

  /// The mean and variance of the first `width` columns of the rows in
  /// `slot`, into small[statsSlot]'s RowMean and RowVar: bn_stats a bnMax
  /// columns, combined by bn_aggr.
  void rowStats(int64_t slot, int64_t statsSlot, int64_t j, int64_t width) {
    int64_t r = rowsOf(j), used = 0;
    for (int64_t at = 0; at < width; at += bnMax, used += 6)
      k.b.create<nisa::BnStatsOp>(
          k.view(rows[slot], k.index(at), {r, std::min(bnMax, width - at)},
                 {cols, 1}),
          k.view(stats[statsSlot], k.index(used), {r, 6}, {statsCols, 1}));
    k.b.create<nisa::BnAggrOp>(
        k.view(stats[statsSlot], k.index(0), {r, used}, {statsCols, 1}),
        k.view(small[statsSlot], k.index(RowMean), {r, 2}, {kSmallCols, 1}));
  }

  /// From the rows' statistics in `slot`: each group's mean and rstd (kept
  /// and stored), then each row's scale and shift.
  void groupStats(Value image, int64_t j, int64_t slot) {
    auto &b = k.b;
    int64_t r = rowsOf(j), g = groupsOf(j);
    Value m = k.view(member, k.index(0), {r, g}, {groupsPerStep, 1});
    Value mt = k.view(memberT, k.index(0), {g, r}, {stepRows, 1});
    // The group means: the rows' averaged.
    Value means = psumCols(slot, 0, g, 1);
    b.create<nisa::MatmulOp>(m, smallCol(slot, RowMean, r), means);
    b.create<nisa::CopyOp>(means, smallCol(slot, GroupMean, g),
                           nisa::Engine::vector);
    // Each row's variance plus its mean's squared deviation from the
    // group's, averaged per group: the group's variance.
    Value rowGroupMean = psumCols(slot, 1, r, 1);
    b.create<nisa::MatmulOp>(mt, smallCol(slot, GroupMean, g), rowGroupMean);
    Value spread = smallCol(slot, RowSpread, r);
    b.create<nisa::TensorTensorOp>(nisa::AluOp::subtract,
                                   smallCol(slot, RowMean, r), rowGroupMean,
                                   spread);
    b.create<nisa::ScalarTensorTensorOp>(
        nisa::AluOp::multiply, nisa::AluOp::add, spread,
        smallCol(slot, RowVar, r), spread, spread, APFloat(0.0),
        nisa::Engine::vector);
    Value variances = psumCols(slot, 2, g, 1);
    b.create<nisa::MatmulOp>(m, spread, variances);
    // rstd = (variance + eps) ^ -0.5: ScalarE's rsqrt, or with SiLU (whose
    // activation table ScalarE would otherwise switch to and from at every
    // step) two VectorE instructions.
    Value rstdCol = smallCol(slot, GroupRstd, g);
    if (fn == nisa::ActivationFn::identity) {
      b.create<nisa::ActivationOp>(variances, rstdCol, Value(),
                                   nisa::ActivationFn::rsqrt, APFloat(1.0),
                                   APFloat(eps));
    } else {
      b.create<nisa::TensorScalarOp>(nisa::AluOp::add, variances, rstdCol,
                                     Value(), APFloat(eps), false);
      b.create<nisa::TensorScalarOp>(nisa::AluOp::pow, rstdCol, rstdCol,
                                     Value(), APFloat(-0.5), false);
    }
    // mean and rstd are [N, groups]: the step's groups are a run of each.
    Value at = k.addOffset(k.scale(image, groups), j * groupsPerStep);
    // From ScalarE's queue, after its rsqrt: on SyncE's, the stores would
    // hold up the next steps' loads behind them.
    for (auto [col, buffer] :
         {std::pair{GroupMean, mean}, std::pair{GroupRstd, rstd}})
      b.create<nisa::DmaCopyOp>(smallCol(slot, col, g),
                                k.view(buffer, at, {g, 1}, {1, 1}),
                                nisa::Engine::scalar);
    // Each row's mean and rstd, then on ScalarE (which normalizes next)
    // scale = rstd * weight and shift = bias - mean * scale.
    Value rowMean = psumCols(slot, 4, r, 1), rowRstd = psumCols(slot, 5, r, 1);
    b.create<nisa::MatmulOp>(mt,
                             k.view(small[slot], k.index(GroupMean), {g, 2},
                                    {kSmallCols, 1}),
                             psumCols(slot, 4, r, 2));
    Value w = weightCols ? column(weightCols, j, r) : Value();
    Value negScale = smallCol(slot, NegScale, r);
    for (auto [dst, sign] : {std::pair{smallCol(slot, Scale, r), 1.0},
                             std::pair{negScale, -1.0}})
      b.create<nisa::ActivationOp>(rowRstd, dst, Value(), w, Value(),
                                   nisa::ActivationFn::identity,
                                   APFloat(sign), APFloat(0.0));
    b.create<nisa::ActivationOp>(
        rowMean, smallCol(slot, Shift, r),
        biasCols ? column(biasCols, j, r) : Value(), negScale, Value(),
        nisa::ActivationFn::identity, APFloat(1.0), APFloat(0.0));
  }

  /// x * scale + shift of the rows in `slot`, in place, and their store.
  void normalize(Value image, int64_t j, int64_t slot, int64_t statsSlot,
                 int64_t col0, int64_t width) {
    int64_t r = rowsOf(j);
    Value t = rowTile(slot, j, width);
    k.b.create<nisa::ActivationOp>(t, t, smallCol(statsSlot, Shift, r),
                                   smallCol(statsSlot, Scale, r), Value(), fn,
                                   APFloat(1.0), APFloat(0.0));
    k.b.create<nisa::DmaCopyOp>(t, rowsIn(out, image, j, col0, width),
                                nisa::Engine::scalar);
  }

  /// Rows that fit: step t = image * steps + j in slot t % slots; step t +
  /// 1's statistics and step t + ahead's load are issued before step t's
  /// normalization. The images run in a loop whose body holds their steps,
  /// unrolled over as many images as the slots take to come round to the
  /// same one.
  void pipelined() {
    int64_t ahead = slots - 2, total = n * steps;
    // Step t + d of the sequence, for step j of `image`.
    auto later = [&](Value image, int64_t j, int64_t d) {
      return std::pair{k.addOffset(image, (j + d) / steps), (j + d) % steps};
    };
    auto load = [&](Value image, int64_t j, int64_t slot) {
      k.dma(rowsIn(x, image, j, 0, hw), rowTile(slot, j, hw));
    };
    for (int64_t t = 0; t < std::min(ahead, total); ++t)
      load(k.index(t / steps), t % steps, t % slots);
    rowStats(0, 0, 0, hw);
    // `left`: the steps of the sequence from this image's first on.
    auto stepsOf = [&](Value image, int64_t phase, int64_t left) {
      for (int64_t j = 0; j < steps; ++j) {
        int64_t t = phase * steps + j, slot = t % slots;
        if (left - j > ahead) {
          auto [image2, j2] = later(image, j, ahead);
          load(image2, j2, (t + ahead) % slots);
        }
        groupStats(image, j, slot);
        if (left - j > 1)
          rowStats((t + 1) % slots, (t + 1) % slots, (j + 1) % steps, hw);
        normalize(image, j, slot, slot, 0, hw);
      }
    };
    int64_t period = slots / std::gcd(steps, slots);
    // Images whose steps all load ahead within the sequence run in the
    // loop; the last ones (the loads stop `ahead` steps before the end)
    // after.
    int64_t tail = std::min(n, (ahead + steps - 1) / steps);
    k.forEachRotating(0, n - tail, period, [&](Value image, int64_t phase) {
      stepsOf(image, phase, std::numeric_limits<int64_t>::max());
    });
    for (int64_t i = n - tail; i < n; ++i)
      stepsOf(k.index(i), i % period, (n - i) * steps);
  }

  /// Rows longer than a chunk: each chunk's mean and variance, as the
  /// (count, mean, count * variance) triple bn_aggr combines into the row's;
  /// then each chunk loaded again and normalized (the next chunk's load
  /// issued first).
  void chunked(Value image, int64_t j) {
    auto &b = k.b;
    int64_t r = rowsOf(j);
    auto load = [&](int64_t q) {
      int64_t width = std::min(cols, hw - q * cols);
      k.dma(rowsIn(x, image, j, q * cols, width),
            rowTile(q % slots, j, width));
    };
    auto triple = [&](int64_t q, int64_t i) {
      return k.view(triples, k.index(3 * q + i), {r, 1}, {3 * chunks, 1});
    };
    load(0);
    for (int64_t q = 0; q < chunks; ++q) {
      if (q + 1 < chunks)
        load(q + 1);
      int64_t width = std::min(cols, hw - q * cols);
      rowStats(q % slots, 0, j, width);
      b.create<nisa::MemsetOp>(triple(q, 0), APFloat(double(width)),
                               nisa::Engine::gpsimd);
      b.create<nisa::CopyOp>(smallCol(0, RowMean, r), triple(q, 1),
                             nisa::Engine::gpsimd);
      b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply,
                                     smallCol(0, RowVar, r), triple(q, 2),
                                     Value(), APFloat(double(width)), false,
                                     nisa::Engine::gpsimd);
    }
    b.create<nisa::BnAggrOp>(
        k.view(triples, k.index(0), {r, 3 * chunks}, {3 * chunks, 1}),
        k.view(small[0], k.index(RowMean), {r, 2}, {kSmallCols, 1}));
    groupStats(image, j, 0);
    // The chunks again, from the next slot on.
    for (int64_t q = 0; q < chunks; ++q) {
      int64_t slot = (chunks + q) % slots, width = std::min(cols, hw - q * cols);
      if (q == 0)
        k.dma(rowsIn(x, image, j, 0, width), rowTile(slot, j, width));
      if (q + 1 < chunks) {
        int64_t nextWidth = std::min(cols, hw - (q + 1) * cols);
        k.dma(rowsIn(x, image, j, (q + 1) * cols, nextWidth),
              rowTile((chunks + q + 1) % slots, j, nextWidth));
      }
      normalize(image, j, slot, 0, q * cols, width);
    }
  }

  KernelLowering &k;
  Value x, weight, bias, out, mean, rstd;
  double eps;
  /// Identity, or SiLU folded in.
  nisa::ActivationFn fn;
  Type elt;
  int64_t n, c, hw, groups, cg, groupsPerStep, stepRows, steps, bnMax, cols,
      chunks, statsCols;
  int64_t slots;
  SmallVector<Value, kMaxSlots> rows, stats, small;
  Value psum, member, memberT, weightCols, biasCols, triples;
};

struct GroupNormPattern : OpTilePattern<GroupNormPattern, GroupNormOp> {
  LogicalResult lowerOp(GroupNormOp op, KernelLowering &k) const {
    int64_t cg = tensorType(op.getInput()).getDimSize(1) / op.getGroups();
    if (cg > k.target.partitions)
      return op->emitOpError("takes at most ")
             << k.target.partitions << " channels per group on target '"
             << k.target.name << "'";
    GroupNormKernel kernel(k, op);
    int64_t resident = kernel.residentBytes();
    if (resident + k.tileBytes > k.target.sbufBytesPerPartition)
      return op->emitOpError("keeps ")
             << resident << " bytes per partition resident, more than target '"
             << k.target.name << "' has";
    kernel.lower();
    return success();
  }
};

} // namespace

void populateGroupNormPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<GroupNormPattern>());
}

} // namespace mlir::neuron
