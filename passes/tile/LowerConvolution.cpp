//===- LowerConvolution.cpp - neuron.conv2d as a direct convolution -------===//
//
// A convolution on TensorE without im2col: the image stays in SBUF (zero
// padded, its channels on the partitions) and each kernel tap is a matmul of
// that tap's weights, [C, O] stationary, by the window of the image the tap
// sees, moving as a [C, images, rows, columns] access pattern (strided for a
// strided convolution). The taps and channel tiles accumulate in one PSUM bank
// per 128 output channels and up to 512 output positions. im2col wrote and read
// kh * kw shifted copies of the input through HBM in runs of one image row.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

namespace {

/// The kernel (ConvLayout says how it holds the convolution on chip), per
/// panel of output tiles whose weights fit (all of them, mostly): load the
/// panel's weights, as rows of [O, C * kh * kw], reorder them on GpSimd
/// where taps share a matmul, and turn them to [C, O] per tap group by
/// TensorE transposes; then per group of `images` images (the next groups'
/// loads in flight while this one computes) load each image's channels,
/// and for each tile of output positions (whole output rows up to a PSUM
/// bank, or a bank's columns of one row) and each 128 output channels,
/// cTiles x tapGroups accumulating matmuls, one eviction (VectorE and
/// ScalarE in turn, the bias added) and one store. An image loads in one
/// of three ways: a 128-channel tile per partition block in one DMA of
/// whole rows, copied on GpSimd into the interior of a tile of the padded
/// size whose border stays zero; the same, then `copies` times onto the
/// partitions by SBUF-to-SBUF DMAs, copy r shifted back by r tap columns
/// (the window of tap (i, j) on copy r is that of tap (i, j + r), so one
/// matmul contracts several taps); or row-stacked, each copy (r, q) the
/// image rows kernel row r reads, shifted back q tap columns, straight
/// from HBM. An image too large for SBUF goes through in bands of output
/// rows (ConvLayout::bands), each loading the input rows its windows read.
/// Depthwise, each tap's stationary is diagonal and an output tile sums only
/// its own channel tile. A folded epilogue (scale, bias, relu) is applied as
/// the sums leave PSUM.
class DirectConv {
public:
  DirectConv(KernelLowering &k, Conv2dOp op)
      : k(k), x(k.bufferOf(op.getInput())), w(k.bufferOf(op.getWeight())),
        out(k.resultBuffer(op.getResult())),
        bias(op.getBias() ? k.bufferOf(op.getBias()) : Value()),
        scale(op.getScale() ? k.bufferOf(op.getScale()) : Value()),
        stride(op.getStride()), padding(op.getPadding()),
        dilation(op.getDilation()), depthwise(op.getDepthwise()),
        relu(op.getRelu()), l(op.layout()) {
    auto in = tensorType(op.getInput()), wt = tensorType(op.getWeight());
    auto res = tensorType(op.getResult());
    n = in.getDimSize(0);
    c = in.getDimSize(1);
    h = in.getDimSize(2);
    wd = in.getDimSize(3);
    o = wt.getDimSize(0);
    kh = wt.getDimSize(2);
    kw = wt.getDimSize(3);
    ho = res.getDimSize(2);
    wo = res.getDimSize(3);
    elt = in.getElementType();
    wp = wd + 2 * padding[1];
    taps = kh * kw;
    padded = padding[0] || padding[1];
    chunks = (wo + l.chunkCols - 1) / l.chunkCols;
    planes = l.images * l.cTiles;
    // PSUM banks (and staging slots) per set, a bank per output tile, and
    // sets in turn, at least four banks in all: a set's next eviction waits
    // for its store, whose DMA takes ~1.3 us to start.
    banksPerSet = std::min(l.oPanel, kConvStageSlots / 2);
    sets = std::max<int64_t>(2, kConvStageSlots / 2 / banksPerSet);
  }

  void lower() {
    TileScope scope(k);
    weights = k.tile(MemorySpace::sbuf, {kConvTile, weightsRow()}, elt);
    for (int64_t i = 0; i < l.imageSlots; ++i) {
      image.push_back(
          k.tile(MemorySpace::sbuf, {kConvTile, planes * l.plane}, elt));
      if (padded && !l.rowStacked)
        loaded.push_back(k.tile(MemorySpace::sbuf,
                                {kConvTile, planes * l.loadedRows * wd}, elt));
    }
    acc = k.tile(MemorySpace::psum, {kConvTile, accStride()}, k.b.getF32Type());
    staged = k.tile(MemorySpace::sbuf, {kConvTile, accStride()}, elt);
    // A copy's partitions past the channels (a DMA engine's worth for
    // few channels) contract zeros: the tile is zeroed whole, once per
    // slot, on GpSimd and VectorE in turn.
    if (l.copyParts > c)
      for (auto [i, t] : llvm::enumerate(image))
        k.b.create<nisa::MemsetOp>(t, APFloat(0.0),
                                   i % 2 ? nisa::Engine::vector
                                         : nisa::Engine::gpsimd);
    else if (padded)
      // Bands zero their rows of padding as they load (a slot holds other
      // bands' rows there before).
      for (Value t : image) {
        if (!l.rowStacked) {
          if (l.bands == 1)
            zeroBorders(t, 0, kConvTile, padding[0], padding[0] + h, padding[1],
                        wd);
          else
            zeroBorders(t, 0, kConvTile, 0, l.bandIn, padding[1], wd);
          continue;
        }
        for (int64_t q = 0; q < l.colCopies; ++q)
          for (int64_t r = 0; r < kh; ++r) {
            auto [first, end] =
                l.bands == 1 ? stackedRows(r, 0)
                             : std::pair<int64_t, int64_t>{0, l.bandRows};
            auto [left, width] = stackedColumns(q);
            zeroBorders(t, (q * kh + r) * c, c, first, end, left, width);
          }
      }
    // Each output tile's bias and scale as fp32 columns (the DMA widens
    // them).
    for (auto [from, to] :
         {std::pair{bias, &biasColumns}, std::pair{scale, &scaleColumns}}) {
      if (!from)
        continue;
      *to = k.tile(MemorySpace::sbuf, {kConvTile, l.oTiles}, k.b.getF32Type());
      for (int64_t ot = 0; ot < l.oTiles; ++ot) {
        int64_t oRows = std::min(kConvTile, o - ot * kConvTile);
        k.dma(k.view(from, k.index(ot * kConvTile), {oRows, 1}, {1, 1}),
              k.view(*to, k.index(ot), {oRows, 1}, {l.oTiles, 1}));
      }
    }
    for (panelBegin = 0; panelBegin < l.oTiles; panelBegin += l.oPanel) {
      panelEnd = std::min(l.oTiles, panelBegin + l.oPanel);
      if (depthwise)
        loadDepthwiseWeights();
      else
        loadWeights();
      convolvePanel();
    }
  }

private:
  using TileScope = TileBuilder::TileScope;

  /// Every image's output channels of the panel's output tiles, a group of
  /// images (or a band of one) a step: step t + ahead loads while step t
  /// computes; its copies' DMA is issued a step later than its load, when
  /// SyncE's queue (which waits in order) no longer has to wait for the
  /// GpSimd copy it reads.
  void convolvePanel() {
    // Step t: band j of image group i (one band a group but for a single
    // image too large for SBUF).
    int64_t per = l.bands, total = n / l.images * per, slots = l.imageSlots;
    int64_t ahead = std::min(slots - 1, total);
    for (int64_t t = 0; t < ahead; ++t)
      loadImages(k.index(t / per), t % per, t % slots);
    copyImages(0);
    k.forEachStep(total / per, per, slots, ahead,
                  [&](Value i, int64_t j, int64_t slot, int64_t left) {
                    if (left > ahead) {
                      auto [i2, j2] = k.stepAfter(i, j, per, ahead);
                      loadImages(i2, j2, (slot + ahead) % slots);
                    }
                    if (left > 1)
                      copyImages((slot + 1) % slots);
                    computeImages(i, j, slot);
                  });
  }

  int64_t accStride() const { return sets * banksPerSet * kConvTileColumns; }
  int64_t rowLength() const { return planes * l.plane; }
  /// Where copy r's padded image starts in its plane.
  int64_t copyStart(int64_t r) const { return l.lead - r * dilation[1]; }
  /// Partitions of channel tile ct (one copy).
  int64_t channels(int64_t ct) const {
    return std::min(kConvTile, c - ct * kConvTile);
  }

  /// Zeroes what is padding in every plane of `t` on `parts` partitions
  /// from `part0`, whose interior is columns [left, left + width) of rows
  /// [rowBegin, rowEnd) of the plane (the copies of a plane take theirs
  /// from copy 0's; a row-stacked copy has its own).
  void zeroBorders(Value t, int64_t part0, int64_t parts, int64_t rowBegin,
                   int64_t rowEnd, int64_t left, int64_t width) {
    k.fillBorders(t,
                  {part0, parts, planes, l.plane, l.lead, wp, rowBegin, rowEnd,
                   left, width},
                  0.0);
  }

  /// Row-stacked: the rows of copy r's plane in band `band` that hold
  /// image rows, [first, end): plane row y is output row y0 + y, image row
  /// (y0 + y) * stride + r * dilation - padding.
  std::pair<int64_t, int64_t> stackedRows(int64_t r, int64_t band) const {
    auto [y0, y1] = bandOutput(band);
    int64_t shift = padding[0] - r * dilation[0]; // image row = s * y - shift
    int64_t first =
        std::max(y0, shift > 0 ? llvm::divideCeilSigned(shift, stride[0]) : 0);
    int64_t end =
        std::min(y1, llvm::divideFloorSigned(h - 1 + shift, stride[0]) + 1);
    return {first - y0, std::max(first, end) - y0};
  }

  /// The output rows of a band, [y0, y1).
  std::pair<int64_t, int64_t> bandOutput(int64_t band) const {
    int64_t y0 = band * l.bandRows;
    return {y0, std::min(ho, y0 + l.bandRows)};
  }

  /// Zeroes plane rows [first, end) of channel tile ct's planes on
  /// partitions [part0, part0 + parts) (rows a band reads as padding, a slot
  /// having held image rows there).
  void zeroRows(Value t, int64_t part0, int64_t parts, int64_t ct,
                int64_t first, int64_t end) {
    if (first >= end)
      return;
    k.b.create<nisa::MemsetOp>(
        k.view(
            t,
            k.index(part0 * rowLength() + ct * l.plane + l.lead + first * wp),
            {parts, l.images, (end - first) * wp},
            {rowLength(), l.cTiles * l.plane, 1}),
        APFloat(0.0), nisa::Engine::gpsimd);
  }

  /// Row-stacked: where copy column q's image columns are in its plane
  /// rows (shifted back q tap columns, those before the plane cut), and
  /// how many: [left, left + width).
  std::pair<int64_t, int64_t> stackedColumns(int64_t q) const {
    int64_t shift = q * dilation[1] - padding[1];
    return {std::max<int64_t>(0, -shift), wd - std::max<int64_t>(0, shift)};
  }

  /// The weights of tap group g of channel tile ct, [copy r's channel,
  /// (ct * tapGroups + g) * o + oo] = w[oo, ct * 128 + channel, tap r of
  /// the group]: per 128 output channels, their rows of w (contiguous) by
  /// one DMA; with copies, reordered on GpSimd so that a group's taps'
  /// channels are one run, in the copies' order; then each group's block
  /// transposed on TensorE into PSUM and copied out (exact: the values are
  /// the weights').
  void loadWeights() {
    TileScope scope(k);
    auto &b = k.b;
    int64_t rowLen = c * taps, cp = l.copyParts, orderedLen = cp * taps;
    Value raw = k.tile(MemorySpace::sbuf, {kConvTile, rowLen}, elt);
    Value ordered = raw;
    if (l.copies > 1) {
      ordered = k.tile(MemorySpace::sbuf, {kConvTile, orderedLen}, elt);
      // A copy's partitions past the channels contract zeros.
      if (cp > c)
        b.create<nisa::MemsetOp>(ordered, APFloat(0.0), nisa::Engine::gpsimd);
    }
    Value ident = k.identity(kConvTile, elt);
    int64_t perBank = kConvTileColumns / kConvTile;
    int64_t block = 0;
    for (int64_t ot = panelBegin; ot < panelEnd; ++ot) {
      int64_t oRows = std::min(kConvTile, o - ot * kConvTile);
      k.dma(
          k.rowView(w, k.index(ot * kConvTile * rowLen), oRows, rowLen, rowLen),
          k.view(raw, k.index(0), {oRows, rowLen}, {rowLen, 1}));
      if (l.copies > 1) {
        // [o, i, j, c] for column copies, [o, j, i, c] row-stacked.
        int64_t outer = l.rowStacked ? kw : kh, inner = l.rowStacked ? kh : kw;
        int64_t outerStride = l.rowStacked ? 1 : kw;
        int64_t innerStride = l.rowStacked ? kw : 1;
        SmallVector<int64_t> shape{oRows, outer, inner, c};
        b.create<nisa::CopyOp>(
            k.view(raw, k.index(0), shape,
                   {rowLen, outerStride, innerStride, taps}),
            k.view(ordered, k.index(0), shape, {orderedLen, inner * cp, cp, 1}),
            nisa::Engine::gpsimd);
      }
      for (int64_t ct = 0; ct < l.cTiles; ++ct)
        forEachTapGroup([&](int64_t g, int64_t i, int64_t j, int64_t used) {
          int64_t rows = groupParts(ct, used);
          // Blocks go through the PSUM banks in turn, a bank holding
          // perBank of them side by side.
          int64_t col = (block % (sets * banksPerSet * perBank)) * kConvTile;
          Value sums =
              k.view(acc, k.index(col), {rows, oRows}, {accStride(), 1});
          Value groupTaps =
              l.copies > 1
                  ? k.view(ordered, k.index(groupStart(g, i, j)), {oRows, rows},
                           {orderedLen, 1})
                  : k.view(raw, k.index(ct * kConvTile * taps + i * kw + j),
                           {oRows, rows}, {rowLen, taps});
          b.create<nisa::MatmulOp>(
               groupTaps,
               k.view(ident, k.index(0), {oRows, oRows}, {kConvTile, 1}), sums)
              .setIsTranspose(true);
          b.create<nisa::CopyOp>(sums, groupWeights(ct, g, ot, oRows, used),
                                 block % 2 ? nisa::Engine::scalar
                                           : nisa::Engine::vector);
          ++block;
        });
    }
  }

  /// Depthwise, each tap group's stationary [copies' channels, oRows]:
  /// diagonal, copy u's block w[channel, tap u of the group] times the
  /// identity (a view of it at row and column u * copyParts), the rest
  /// zero. w's rows (channels, their taps along the free axis) load once per
  /// copy onto its partitions.
  void loadDepthwiseWeights() {
    TileScope scope(k);
    auto &b = k.b;
    int64_t cp = l.copyParts, copies = l.copies > 1 ? l.copies : 1;
    // A copy's partitions past the channels contract zeros.
    if (cp > c)
      b.create<nisa::MemsetOp>(weights, APFloat(0.0), nisa::Engine::gpsimd);
    Value raw = k.tile(MemorySpace::sbuf, {kConvTile, taps}, elt);
    Value ident = k.identity(kConvTile, elt);
    int64_t instruction = 0;
    for (int64_t ot = panelBegin; ot < panelEnd; ++ot) {
      int64_t oRows = std::min(kConvTile, o - ot * kConvTile);
      for (int64_t u = 0; u < copies; ++u)
        k.dma(
            k.view(w, k.index(ot * kConvTile * taps), {oRows, taps}, {taps, 1}),
            k.view(raw, k.index(u * cp * taps), {oRows, taps}, {taps, 1}));
      forEachTapGroup([&](int64_t g, int64_t i, int64_t j, int64_t used) {
        int64_t column = groupColumn(ot, g, ot);
        for (int64_t u = 0; u < (l.copies > 1 ? used : 1); ++u) {
          // Copy u's tap: row-stacked, kernel row u % kh of column shift
          // u / kh; else column j + u of row i.
          int64_t ti = l.rowStacked ? u % kh : i;
          int64_t tj = j + (l.rowStacked ? u / kh : u);
          b.create<nisa::TensorScalarOp>(
              nisa::AluOp::multiply,
              k.view(ident, k.index(u * cp * kConvTile + u * cp),
                     {oRows, oRows}, {kConvTile, 1}),
              k.view(weights, k.index(u * cp * weightsRow() + column),
                     {oRows, oRows}, {weightsRow(), 1}),
              k.view(raw, k.index(u * cp * taps + ti * kw + tj), {oRows, 1},
                     {taps, 1}),
              APFloat(0.0), false,
              instruction++ % 2 ? nisa::Engine::gpsimd : nisa::Engine::vector);
        }
      });
    }
  }

  /// Where tap group g (taps from (i, j)) starts in the reordered weights.
  int64_t groupStart(int64_t g, int64_t i, int64_t j) const {
    return (l.rowStacked ? j * kh : i * kw + j) * l.copyParts;
  }
  /// The partitions tap group g of channel tile ct contracts: `used`
  /// copies', or one channel tile's.
  int64_t groupParts(int64_t ct, int64_t used) const {
    return l.copies > 1 ? used * l.copyParts : channels(ct);
  }

  /// Columns of the weights tile: [C, O] per channel tile and tap group
  /// (depthwise: per tap group, each output tile's from its own channels).
  int64_t weightsRow() const {
    return (depthwise ? 1 : l.cTiles) * l.tapGroups * panelColumns();
  }
  /// Output channels of a panel (the last may have fewer).
  int64_t panelColumns() const { return std::min(o, l.oPanel * kConvTile); }

  /// `body(group, i, j, used)` for each tap group: taps (i, j) to (i, j +
  /// used - 1), or row-stacked, (i, j) to (i + used - 1, j).
  void forEachTapGroup(
      llvm::function_ref<void(int64_t, int64_t, int64_t, int64_t)> body) {
    if (l.rowStacked) {
      for (int64_t j = 0, g = 0; j < kw; j += l.colCopies, ++g)
        body(g, 0, j, std::min(l.colCopies, kw - j) * kh);
      return;
    }
    int64_t g = 0;
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; j += l.copies, ++g)
        body(g, i, j, std::min(l.copies, kw - j));
  }

  /// The stationary weights of tap group g of channel tile ct and output
  /// tile ot (`oRows` of them): [used copies' channels, oRows].
  Value groupWeights(int64_t ct, int64_t g, int64_t ot, int64_t oRows,
                     int64_t used) {
    return k.view(weights, k.index(groupColumn(ct, g, ot)),
                  {groupParts(ct, used), oRows}, {weightsRow(), 1});
  }
  /// Where groupWeights' block starts in the weights tile's rows.
  int64_t groupColumn(int64_t ct, int64_t g, int64_t ot) const {
    return ((depthwise ? 0 : ct) * l.tapGroups + g) * panelColumns() +
           (ot - panelBegin) * kConvTile;
  }

  /// Band `band` of the images of group `group` into image tile `slot`:
  /// [copy r's channel, (b * cTiles + ct) * plane + copyStart(r) + row * wp +
  /// column], the interior from (padding[0], padding[1]) of a whole image;
  /// a band's plane starts at padded row y0 * stride.
  void loadImages(Value group, int64_t band, int64_t slot) {
    int64_t hw = h * wd;
    Value first = k.scale(group, l.images * c * hw);
    if (l.rowStacked) {
      // Copy (r, q): the image rows kernel row r reads, one run each,
      // shifted back q tap columns.
      int64_t y0 = bandOutput(band).first;
      for (int64_t q = 0; q < l.colCopies; ++q)
        for (int64_t r = 0; r < kh; ++r) {
          auto [y, yEnd] = stackedRows(r, band);
          auto [left, width] = stackedColumns(q);
          int64_t part = (q * kh + r) * l.copyParts;
          if (l.bands > 1) {
            zeroRows(image[slot], part, c, 0, 0, y);
            zeroRows(image[slot], part, c, 0, yEnd,
                     bandOutput(band).second - y0);
          }
          if (y == yEnd || width <= 0)
            continue;
          int64_t row = (y0 + y) * stride[0] + r * dilation[0] - padding[0];
          int64_t col = wd - width; // the columns cut
          SmallVector<int64_t> shape{c, l.images, yEnd - y, width};
          k.dma(k.view(x, k.addOffset(first, row * wd + col), shape,
                       {hw, c * hw, stride[0] * wd, 1}),
                k.view(image[slot], k.index(part * rowLength() + y * wp + left),
                       shape, {rowLength(), l.plane, wp, 1}));
        }
      return;
    }
    // Plane rows [top, bottom) hold image rows from `imageRow`; a band's
    // others are padding.
    auto [y0, y1] = bandOutput(band);
    int64_t planeRow0 = y0 * stride[0];
    int64_t rowsIn =
        l.bands == 1 ? l.bandIn
                     : (y1 - y0 - 1) * stride[0] + (kh - 1) * dilation[0] + 1;
    int64_t top = std::max<int64_t>(0, padding[0] - planeRow0);
    int64_t bottom = std::min(rowsIn, h + padding[0] - planeRow0);
    int64_t imageRow = planeRow0 + top - padding[0], rows = bottom - top;
    int64_t run = rows * wd;
    for (int64_t ct = 0; ct < l.cTiles; ++ct) {
      int64_t parts = channels(ct);
      if (l.bands > 1) {
        zeroRows(image[slot], 0, parts, ct, 0, top);
        zeroRows(image[slot], 0, parts, ct, bottom, rowsIn);
      }
      // [channel, image, position] of the group's images' rows.
      Value src =
          k.view(x, k.addOffset(first, ct * kConvTile * hw + imageRow * wd),
                 {parts, l.images, run}, {hw, c * hw, 1});
      int64_t at = ct * l.plane + l.lead + top * wp + padding[1];
      if (!padded) {
        k.dma(src, k.view(image[slot], k.index(at), {parts, l.images, run},
                          {rowLength(), l.cTiles * l.plane, 1}));
        continue;
      }
      int64_t loadedPlane = l.loadedRows * wd, from = ct * loadedPlane;
      k.dma(src, k.view(loaded[slot], k.index(from), {parts, l.images, run},
                        {planes * loadedPlane, l.cTiles * loadedPlane, 1}));
      k.b.create<nisa::CopyOp>(
          k.view(loaded[slot], k.index(from), {parts, l.images, rows, wd},
                 {planes * loadedPlane, l.cTiles * loadedPlane, wd, 1}),
          k.view(image[slot], k.index(at), {parts, l.images, rows, wd},
                 {rowLength(), l.cTiles * l.plane, wp, 1}),
          nisa::Engine::gpsimd);
    }
  }

  /// The copies of image tile `slot`: each plane of copy 0 (padding
  /// included) moved whole to copy r's partitions, r tap columns further
  /// back.
  void copyImages(int64_t slot) {
    if (l.rowStacked)
      return;
    int64_t paddedPlane = l.plane - l.lead;
    for (int64_t r = 1; r < l.copies; ++r)
      k.dma(k.view(image[slot], k.index(l.lead), {c, planes, paddedPlane},
                   {rowLength(), l.plane, 1}),
            k.view(image[slot], k.index(r * c * rowLength() + copyStart(r)),
                   {c, planes, paddedPlane}, {rowLength(), l.plane, 1}));
  }

  /// Every tile of the output positions of band `band` of image group
  /// `group`.
  void computeImages(Value group, int64_t band, int64_t slot) {
    auto [y0, y1] = bandOutput(band);
    int64_t bandRows = y1 - y0;
    auto tile = [&](Value row, int64_t rows, int64_t col0, int64_t cols,
                    int64_t set) {
      computeTile(group, slot, row, y0, rows, col0, cols, set);
    };
    if (chunks == 1) {
      int64_t full = bandRows / l.rowsPerTile, rest = bandRows % l.rowsPerTile;
      k.forEachRotating(0, full, sets, [&](Value i, int64_t set) {
        tile(k.scale(i, l.rowsPerTile), l.rowsPerTile, 0, wo, set);
      });
      if (rest)
        tile(k.index(full * l.rowsPerTile), rest, 0, wo, full % sets);
      return;
    }
    // One row in chunks of a bank's columns; consecutive tiles take the
    // sets in turn across rows too.
    k.forEachRotating(0, bandRows, sets, [&](Value row, int64_t rowSet) {
      for (int64_t ch = 0; ch < chunks; ++ch)
        tile(row, 1, ch * l.chunkCols,
             std::min(l.chunkCols, wo - ch * l.chunkCols),
             (rowSet * chunks + ch) % sets);
    });
  }

  /// Output rows [y0 + row0, y0 + row0 + rows) x columns [col0, col0 +
  /// cols) of the group's images (rows from row0 of the band in `slot`), in
  /// PSUM bank set `set`.
  void computeTile(Value group, int64_t slot, Value row0, int64_t y0,
                   int64_t rows, int64_t col0, int64_t cols, int64_t set) {
    auto &b = k.b;
    int64_t positions = l.images * rows * cols;
    // The window of tap (i, j) starts at padded row row0 * s + i * d and
    // column col0 * s + j * d; a row-stacked plane holds only the rows its
    // kernel row reads, one per output row.
    int64_t rowStep = l.rowStacked ? wp : stride[0] * wp;
    Value firstRow = k.scale(row0, rowStep);
    for (int64_t ot = panelBegin; ot < panelEnd; ++ot) {
      int64_t oRows = std::min(kConvTile, o - ot * kConvTile);
      int64_t bank = set * banksPerSet + (ot - panelBegin) % banksPerSet;
      Value sums = k.view(acc, k.index(bank * kConvTileColumns),
                          {oRows, positions}, {accStride(), 1});
      bool first = true;
      for (int64_t ct = 0; ct < l.cTiles; ++ct) {
        if (depthwise && ct != ot)
          continue;
        forEachTapGroup([&](int64_t g, int64_t i, int64_t j, int64_t used) {
          Value at = k.addOffset(firstRow,
                                 ct * l.plane + l.lead + i * dilation[0] * wp +
                                     col0 * stride[1] + j * dilation[1]);
          Value window = k.view(
              image[slot], at, {groupParts(ct, used), l.images, rows, cols},
              {rowLength(), l.cTiles * l.plane, rowStep, stride[1]});
          auto mm = b.create<nisa::MatmulOp>(
              groupWeights(ct, g, ot, oRows, used), window, sums);
          if (!first)
            mm.setAccumulate(true);
          first = false;
        });
      }
      Value part = k.view(staged, k.index(bank * kConvTileColumns),
                          {oRows, positions}, {accStride(), 1});
      evict(sums, part, ot, oRows, (set + ot) % 2);
      // out[image, ot * 128 + oo, row0 + r, col0 + cc]: a run of rows *
      // cols per channel and image where the tile is whole rows.
      Value dst =
          k.addOffsets(k.scale(group, l.images * o * ho * wo),
                       k.addOffset(k.scale(row0, wo),
                                   ot * kConvTile * ho * wo + y0 * wo + col0));
      // From ScalarE's queue: on SyncE's a store would hold up the loads.
      b.create<nisa::DmaCopyOp>(k.view(staged, k.index(bank * kConvTileColumns),
                                       {oRows, l.images, rows, cols},
                                       {accStride(), rows * cols, cols, 1}),
                                k.view(out, dst, {oRows, l.images, rows, cols},
                                       {ho * wo, o * ho * wo, wo, 1}),
                                nisa::Engine::scalar);
    }
  }

  /// PSUM's sums of output tile ot into `part`, times the scale and plus
  /// the bias where there are, through the relu where there is one, rounded
  /// once; on ScalarE (one instruction) or VectorE.
  void evict(Value sums, Value part, int64_t ot, int64_t oRows, bool scalar) {
    auto &b = k.b;
    auto columnOf = [&](Value t) {
      return t ? k.view(t, k.index(ot), {oRows, 1}, {l.oTiles, 1}) : Value();
    };
    Value biasCol = columnOf(biasColumns), scaleCol = columnOf(scaleColumns);
    if (scalar) {
      if (!biasCol && !scaleCol && !relu) {
        b.create<nisa::CopyOp>(sums, part, nisa::Engine::scalar);
        return;
      }
      b.create<nisa::ActivationOp>(sums, part, biasCol, scaleCol, Value(),
                                   relu ? nisa::ActivationFn::relu
                                        : nisa::ActivationFn::identity,
                                   APFloat(1.0), APFloat(0.0));
      return;
    }
    // VectorE: sums * scale + bias in one instruction (the bias a column
    // read at every position), rounded into `part`; then max(0, .) there
    // (the same as before rounding: rounding keeps order and 0).
    auto shape = cast<MemRefType>(sums.getType()).getShape();
    if (scaleCol && biasCol)
      b.create<nisa::ScalarTensorTensorOp>(
          nisa::AluOp::multiply, nisa::AluOp::add, sums,
          k.view(biasColumns, k.index(ot), shape, {l.oTiles, 0}), part,
          scaleCol, APFloat(0.0), nisa::Engine::vector);
    else if (scaleCol || biasCol)
      b.create<nisa::TensorScalarOp>(
          scaleCol ? nisa::AluOp::multiply : nisa::AluOp::add, sums, part,
          scaleCol ? scaleCol : biasCol, APFloat(0.0), false);
    else
      b.create<nisa::CopyOp>(sums, part, nisa::Engine::vector);
    if (relu)
      b.create<nisa::TensorScalarOp>(nisa::AluOp::max, part, part, Value(),
                                     APFloat(0.0), false);
  }

  KernelLowering &k;
  Value x, w, out, bias, scale;
  ArrayRef<int64_t> stride, padding, dilation;
  /// Each output tile from its own channel tile, diagonal stationaries.
  bool depthwise;
  /// max(0, .) as the sums leave PSUM.
  bool relu;
  ConvLayout l;
  int64_t n, c, h, wd, o, kh, kw, ho, wo, wp, taps, chunks, planes, banksPerSet,
      sets;
  /// The output tiles [panelBegin, panelEnd) whose weights are on chip.
  int64_t panelBegin = 0, panelEnd = 0;
  bool padded;
  Type elt;
  Value weights, acc, staged, biasColumns, scaleColumns;
  /// Per image slot, the image padded and (where it pads) as loaded:
  /// separate tiles, not slots of one, which the synchronisation tells
  /// apart.
  SmallVector<Value, 3> image, loaded;
};

struct Conv2dPattern : OpTilePattern<Conv2dPattern, Conv2dOp> {
  LogicalResult lowerOp(Conv2dOp op, KernelLowering &k) const {
    const auto &t = k.target;
    if (t.partitions < kConvTile || t.psumBankBytes / 4 < kConvTileColumns ||
        t.matmulMaxMovingFree < kConvTileColumns)
      return op->emitOpError("the direct convolution needs ")
             << kConvTile << " partitions and PSUM banks of "
             << kConvTileColumns << " fp32 sums";
    int64_t resident = op.layout().residentBytes;
    if (resident + k.tileBytes > t.sbufBytesPerPartition)
      return op->emitOpError("keeps ")
             << resident << " bytes per partition resident, more "
             << "than target '" << t.name << "' has";
    DirectConv(k, op).lower();
    return success();
  }
};

} // namespace

void populateConvolutionPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<Conv2dPattern>());
}

} // namespace mlir::neuron
