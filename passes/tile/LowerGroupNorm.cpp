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
    int64_t cg = c / groups;
    int64_t eltBytes = in.getElementTypeBitWidth() / 8;
    // Channels a partition row: one, or where a channel's positions are few
    // (a DMA of few bytes a partition, steps of little work each), the
    // fewest of a group's that make kMinRowBytes and fit, at most
    // kMaxPerRow (each its own ScalarE instructions).
    perRow = 1;
    for (int64_t d = 1; d <= std::min(cg, kMaxPerRow); ++d)
      if (cg % d == 0 && kMinSlots * d * hw * eltBytes <= kRowBudget) {
        perRow = d;
        if (d * hw * eltBytes >= kMinRowBytes)
          break;
      }
    rowLen = perRow * hw;
    partsPerGroup = cg / perRow;
    groupsPerStep = std::min(groups, k.target.partitions / partsPerGroup);
    stepRows = groupsPerStep * partsPerGroup;
    steps = (groups + groupsPerStep - 1) / groupsPerStep;
    bnMax = static_cast<int64_t>(k.target.value("bn_stats_max_free_elements"));
    // Columns a chunk: the whole row where kMinSlots of them fit
    // kRowBudget; then as many slots as fit, up to kMaxSlots.
    cols = rowLen;
    if (kMinSlots * rowLen * eltBytes > kRowBudget)
      cols = std::max<int64_t>(bnMax, kRowBudget / (kMinSlots * eltBytes) /
                                          bnMax * bnMax);
    slots = std::clamp<int64_t>(kRowBudget / (cols * eltBytes), kMinSlots,
                                kMaxSlots);
    chunks = (rowLen + cols - 1) / cols;
    statsCols = 6 * ((cols + bnMax - 1) / bnMax);
    smallCols = Scale + 3 * perRow;
  }

  /// SBUF bytes per partition the kernel keeps: the row tiles, their
  /// statistics, a chunked row's per chunk, and [rows, 1] values.
  int64_t residentBytes() const {
    return kRowBudget +
           4 * (slots * (statsCols + smallCols) + 3 * chunks +
                3 * steps * perRow + 2 * groupsPerStep + 2 * stepRows);
  }

  void lower() {
    TileScope scope(k);
    auto f32 = k.b.getF32Type();
    for (int64_t s = 0; s < slots; ++s) {
      rows.push_back(k.tile(MemorySpace::sbuf, {stepRows, cols}, elt));
      stats.push_back(k.tile(MemorySpace::sbuf, {stepRows, statsCols}, f32));
      small.push_back(k.tile(MemorySpace::sbuf, {stepRows, smallCols}, f32));
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
  /// A partition row's bytes the channels a row reach where they can, and
  /// the most channels a row.
  static constexpr int64_t kMinRowBytes = 4096, kMaxPerRow = 8;
  /// Per slot, fp32 PSUM columns of sums.
  static constexpr int64_t kPsumCols = 8;
  /// Per slot, small's fp32 columns: a row's mean and variance, its
  /// variance plus its mean's squared deviation; its group's mean and rstd
  /// (groups on the partitions); then perRow columns each of scale, -scale
  /// and shift (one a channel).
  enum Small { RowMean, RowVar, RowSpread, GroupMean, GroupRstd, Scale };

  /// Rows and groups of step j (the last may have fewer groups).
  int64_t groupsOf(int64_t j) const {
    return std::min(groupsPerStep, groups - j * groupsPerStep);
  }
  int64_t rowsOf(int64_t j) const { return groupsOf(j) * partsPerGroup; }

  Value column(Value t, int64_t col, int64_t rows) {
    int64_t width = cast<MemRefType>(t.getType()).getShape()[1];
    return k.view(t, k.index(col), {rows, 1}, {width, 1});
  }
  Value smallCol(int64_t slot, int64_t col, int64_t rows) {
    return column(small[slot], col, rows);
  }
  /// The perRow columns of scale (block 0), -scale (1) or shift (2).
  Value smallBlock(int64_t slot, int64_t block, int64_t rows) {
    return k.view(small[slot], k.index(Scale + block * perRow), {rows, perRow},
                  {smallCols, 1});
  }
  Value psumCols(int64_t slot, int64_t col, int64_t rows, int64_t width) {
    return k.view(psum, k.index(slot * kPsumCols + col), {rows, width},
                  {slots * kPsumCols, 1});
  }

  /// member[p, g] = 1 / n where row p is in group g (p / n == g, n rows a
  /// group), so that a matmul by it averages each group's rows, and
  /// memberT[g, p] = 1, which hands each row its group's value: from iota's
  /// p - n * g, 0 <= v < n.
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
                                       APFloat(double(partsPerGroup)), false);
      k.b.create<nisa::ScalarTensorTensorOp>(
          nisa::AluOp::multiply, nisa::AluOp::multiply, lo, m, m, Value(),
          APFloat(value), nisa::Engine::vector);
      return m;
    };
    double n = double(partsPerGroup);
    member = build(stepRows, groupsPerStep, 1.0, -n, 1.0 / n);
    memberT = build(groupsPerStep, stepRows, -n, 1.0, 1.0);
  }

  /// Per step, the weight and bias of its rows' channels as fp32, perRow
  /// columns a step (the DMA widens them); without a weight, ones.
  void loadAffine() {
    auto f32 = k.b.getF32Type();
    for (auto [buffer, tile] : {std::pair{weight, &weightCols},
                                std::pair{bias, &biasCols}}) {
      if (!buffer && tile == &biasCols)
        continue;
      *tile = k.tile(MemorySpace::sbuf, {stepRows, steps * perRow}, f32);
      if (!buffer) {
        k.b.create<nisa::MemsetOp>(*tile, APFloat(1.0), nisa::Engine::gpsimd);
        continue;
      }
      for (int64_t j = 0; j < steps; ++j)
        k.dma(k.view(buffer, k.index(j * stepRows * perRow),
                     {rowsOf(j), perRow}, {perRow, 1}),
              affine(*tile, j));
    }
  }
  /// Step j's perRow columns of weightCols or biasCols.
  Value affine(Value tile, int64_t j) {
    return k.view(tile, k.index(j * perRow), {rowsOf(j), perRow},
                  {steps * perRow, 1});
  }

  /// Columns [col0, col0 + width) of step j's rows of `image`.
  Value rowsIn(Value buffer, Value image, int64_t j, int64_t col0,
               int64_t width) {
    Value first =
        k.addOffset(k.scale(image, c * hw), j * stepRows * rowLen + col0);
    return k.view(buffer, first, {rowsOf(j), width}, {rowLen, 1});
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
        k.view(small[statsSlot], k.index(RowMean), {r, 2}, {smallCols, 1}));
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
    // Each row's group's mean and rstd, then on ScalarE (which normalizes
    // next) per channel scale = rstd * weight, -scale and shift = bias -
    // mean * scale.
    Value rowMean = psumCols(slot, 4, r, 1), rowRstd = psumCols(slot, 5, r, 1);
    b.create<nisa::MatmulOp>(
        mt, k.view(small[slot], k.index(GroupMean), {g, 2}, {smallCols, 1}),
        psumCols(slot, 4, r, 2));
    for (auto [block, sign] : {std::pair{0, 1.0}, std::pair{1, -1.0}})
      b.create<nisa::ActivationOp>(
          affine(weightCols, j), smallBlock(slot, block, r), Value(), rowRstd,
          Value(), nisa::ActivationFn::identity, APFloat(sign), APFloat(0.0));
    for (int64_t i = 0; i < perRow; ++i)
      b.create<nisa::ActivationOp>(
          rowMean, smallCol(slot, Scale + 2 * perRow + i, r),
          biasCols ? k.view(biasCols, k.index(j * perRow + i), {r, 1},
                            {steps * perRow, 1})
                   : Value(),
          smallCol(slot, Scale + perRow + i, r), Value(),
          nisa::ActivationFn::identity, APFloat(1.0), APFloat(0.0));
  }

  /// x * scale + shift of the rows in `slot`, in place, a channel of each
  /// row at a time, and their store.
  void normalize(Value image, int64_t j, int64_t slot, int64_t statsSlot,
                 int64_t col0, int64_t width) {
    int64_t r = rowsOf(j);
    for (int64_t i = 0; i < perRow; ++i) {
      int64_t len = perRow == 1 ? width : hw;
      Value t = k.view(rows[slot], k.index(i * hw), {r, len}, {cols, 1});
      k.b.create<nisa::ActivationOp>(
          t, t, smallCol(statsSlot, Scale + 2 * perRow + i, r),
          smallCol(statsSlot, Scale + i, r), Value(), fn, APFloat(1.0),
          APFloat(0.0));
    }
    k.b.create<nisa::DmaCopyOp>(rowTile(slot, j, width),
                                rowsIn(out, image, j, col0, width),
                                nisa::Engine::scalar);
  }

  /// Rows that fit: step t = image * steps + j in slot t % slots; step t +
  /// 1's statistics and step t + ahead's load are issued before step t's
  /// normalization (TileBuilder::forEachStep).
  void pipelined() {
    int64_t ahead = slots - 2;
    auto load = [&](Value image, int64_t j, int64_t slot) {
      k.dma(rowsIn(x, image, j, 0, rowLen), rowTile(slot, j, rowLen));
    };
    for (int64_t t = 0; t < std::min(ahead, n * steps); ++t)
      load(k.index(t / steps), t % steps, t % slots);
    rowStats(0, 0, 0, rowLen);
    k.forEachStep(n, steps, slots, ahead,
                  [&](Value image, int64_t j, int64_t slot, int64_t left) {
                    if (left > ahead) {
                      auto [image2, j2] = k.stepAfter(image, j, steps, ahead);
                      load(image2, j2, (slot + ahead) % slots);
                    }
                    groupStats(image, j, slot);
                    if (left > 1)
                      rowStats((slot + 1) % slots, (slot + 1) % slots,
                               (j + 1) % steps, rowLen);
                    normalize(image, j, slot, slot, 0, rowLen);
                  });
  }

  /// Rows longer than a chunk: each chunk's mean and variance, as the
  /// (count, mean, count * variance) triple bn_aggr combines into the row's;
  /// then each chunk loaded again and normalized (the next chunk's load
  /// issued first).
  void chunked(Value image, int64_t j) {
    auto &b = k.b;
    int64_t r = rowsOf(j);
    auto load = [&](int64_t q) {
      int64_t width = std::min(cols, rowLen - q * cols);
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
      int64_t width = std::min(cols, rowLen - q * cols);
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
        k.view(small[0], k.index(RowMean), {r, 2}, {smallCols, 1}));
    groupStats(image, j, 0);
    // The chunks again, from the next slot on.
    for (int64_t q = 0; q < chunks; ++q) {
      int64_t slot = (chunks + q) % slots;
      int64_t width = std::min(cols, rowLen - q * cols);
      if (q == 0)
        k.dma(rowsIn(x, image, j, 0, width), rowTile(slot, j, width));
      if (q + 1 < chunks) {
        int64_t nextWidth = std::min(cols, rowLen - (q + 1) * cols);
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
  /// Channels a partition row (rowLen elements: perRow x hw), rows a
  /// group.
  int64_t perRow, rowLen, partsPerGroup, smallCols;
  int64_t n, c, hw, groups, groupsPerStep, stepRows, steps, bnMax, cols, chunks,
      statsCols;
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
