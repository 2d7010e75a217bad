//===- LowerChannelNorm.cpp - neuron.channel_norm over the partitions ----===//
//
// A LayerNorm over the channels of [N, C, positions] (ConvNeXt's
// LayerNorm2d) with the channels on the partitions and the positions along
// the free axis, so the input loads and the output stores as rows of a
// channel's positions, in place: no transposes. The sums over the channels
// (over the partitions) are TensorE matmuls, a chunk of up to 512 positions
// (a PSUM bank of fp32) at a time:
//  - D = (C I - J) x, each position's deviations from its mean times C,
//    straight into PSUM (the products with the integer matrix are exact: C I
//    - J in the input's dtype where C - 1 is exact in it, else -J and C I in
//    exact parts, accumulated);
//  - d^2 = (D / C)^2 by ScalarE from PSUM (16-bit inputs: rounded to bf16,
//    whose range holds any square of an fp16), then V = ones^T d^2, each
//    position's sum of squares on every partition;
//  - R = rsqrt(V C + C^2 eps) = rstd / C (ScalarE), y = (D * weight) * R
//    (VectorE, one streamed input: D is in PSUM), + bias (GpSimd), rounded
//    once into the input's tile, which is stored.
// Per chunk of two channel tiles: TensorE 6 matmuls, ScalarE 3 passes,
// VectorE 2, GpSimd 2, each under the chunk's DMA time for 16-bit inputs.
// Blocks of positions (whole images where they fit) load two blocks ahead;
// the chunks go through 2 to 4 sets of PSUM and SBUF buffers in turn, D and
// d^2 of a chunk issued sets - 1 chunks ahead of its V, R and y (a chunk's
// D is held until y reads it). Decomposed, the norm read a transposed
// float32 copy of the input through HBM (8x the bytes).
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

namespace {

class ChannelNormKernel {
public:
  ChannelNormKernel(KernelLowering &k, ChannelNormOp op)
      : k(k), x(k.bufferOf(op.getInput())),
        weight(op.getWeight() ? k.bufferOf(op.getWeight()) : Value()),
        bias(op.getBias() ? k.bufferOf(op.getBias()) : Value()),
        out(k.resultBuffer(op.getResult())),
        withStats(!op.getMean().use_empty() || !op.getRstd().use_empty()),
        eps(op.getEps().convertToDouble()) {
    if (withStats) {
      mean = k.resultBuffer(op.getMean());
      rstd = k.resultBuffer(op.getRstd());
    }
    auto in = tensorType(op.getInput());
    elt = in.getElementType();
    f32 = k.b.getF32Type();
    sqElt = elt.isF32() ? f32 : Type(k.b.getBF16Type());
    n = in.getDimSize(0);
    c = in.getDimSize(1);
    positions = product(in.getShape().drop_front(2));
    parts = k.target.partitions;
    tiles = (c + parts - 1) / parts;
    int64_t eltBytes = in.getElementTypeBitWidth() / 8;
    // A chunk's PSUM: D of every channel tile and the mean's sums, in
    // `sets` sets, and V once. A chunk's D is held from its matmuls to its
    // last use (y), so sets bound the chunks in flight: the most chunk
    // positions in flight, a chunk a bank (512 fp32) or an even share of
    // one, with 2 to 4 sets.
    int64_t perSet = tiles + (withStats ? 1 : 0);
    for (int64_t cols = kChunkMax; cols >= 64; cols /= 2)
      for (int64_t s = 4; s >= 2; --s)
        if ((s * perSet + 1) * cols <= psumColumns() &&
            s * cols > sets * chunkMax)
          sets = s, chunkMax = cols;
    setCols = perSet * chunkMax;
    // Blocks of positions: an image's, or an even split of it where its
    // tiles would not fit kSlots slots of kBlockBudget.
    int64_t widest =
        std::max<int64_t>(chunkMax, kBlockBudget / (kSlots * tiles * eltBytes));
    blocks = (positions + widest - 1) / widest;
    width = (positions + blocks - 1) / blocks;
    // Chunk u of a block takes set u % sets: every block's chunks a
    // multiple of sets, else (blocks of fewer positions than sets) one set
    // and no overlap.
    for (int64_t j = 0; j < blocks; ++j)
      if (blockWidth(j) < sets)
        sets = 1;
  }

  /// Whether the kernel fits: its PSUM sets and SBUF tiles.
  bool fits() const {
    return sets >= 1 && sets * setCols + chunkMax <= psumColumns() &&
           residentBytes() + k.tileBytes <= k.target.sbufBytesPerPartition;
  }

  /// The block slots, each set's squares, R, scaled rows and statistics
  /// rows, the [128, 128] constants (-J, the identity, up to three diagonal
  /// parts; ones), the affine columns and the ones column.
  int64_t residentBytes() const {
    int64_t eltBytes = elt.getIntOrFloatBitWidth() / 8;
    int64_t sqBytes = sqElt.getIntOrFloatBitWidth() / 8;
    return kSlots * tiles * width * eltBytes +
           sets * chunkMax * (tiles * (sqBytes + 4) + 4 + (withStats ? 8 : 0)) +
           parts * (5 * eltBytes + sqBytes) + 8 * tiles + eltBytes;
  }

  void lower() {
    TileBuilder::TileScope scope(k);
    for (int64_t s = 0; s < kSlots; ++s)
      blockTiles.push_back(
          k.tile(MemorySpace::sbuf, {parts, tiles * width}, elt));
    for (int64_t set = 0; set < sets; ++set) {
      squares.push_back(
          k.tile(MemorySpace::sbuf, {parts, tiles * chunkMax}, sqElt));
      rstdTiles.push_back(k.tile(MemorySpace::sbuf, {parts, chunkMax}, f32));
      if (bias)
        scaled.push_back(
            k.tile(MemorySpace::sbuf, {parts, tiles * chunkMax}, f32));
      if (withStats)
        statRows.push_back(k.tile(MemorySpace::sbuf, {1, 2 * chunkMax}, f32));
    }
    psum = k.tile(MemorySpace::psum, {parts, psumColumns()}, f32);
    makeConstants();
    pipelined();
  }

private:
  /// Positions a chunk at most: a PSUM bank of fp32 (a matmul's most
  /// moving columns).
  static constexpr int64_t kChunkMax = 512;
  /// Block slots and how many blocks load ahead.
  static constexpr int64_t kSlots = 4, kAhead = 2;
  /// SBUF bytes per partition the block tiles may take.
  static constexpr int64_t kBlockBudget = 96 * 1024;

  int64_t rowsOf(int64_t t) const { return std::min(parts, c - t * parts); }
  int64_t blockWidth(int64_t j) const {
    return std::min(width, positions - j * width);
  }
  /// Chunks of block j: a multiple of `sets` (chunk u takes set u % sets,
  /// and the next block's first chunk never that of this block's last), of
  /// nearly equal widths.
  int64_t chunksOf(int64_t j) const {
    int64_t count = (blockWidth(j) + chunkMax - 1) / chunkMax;
    return (count + sets - 1) / sets * sets;
  }
  int64_t chunkStart(int64_t j, int64_t u) const {
    return u * blockWidth(j) / chunksOf(j);
  }
  int64_t chunkWidth(int64_t j, int64_t u) const {
    return chunkStart(j, u + 1) - chunkStart(j, u);
  }
  int64_t psumColumns() const {
    return k.target.psumBankBytes * k.target.psumBanks / 4;
  }

  Value psumView(int64_t col, int64_t rows, int64_t cols) {
    return k.view(psum, k.index(col), {rows, cols}, {psumColumns(), 1});
  }
  /// D of channel tile t in a set, or (t == tiles) the set's channel sums.
  Value dView(int64_t set, int64_t t, int64_t rows, int64_t cols) {
    return psumView(set * setCols + t * chunkMax, rows, cols);
  }
  Value vView(int64_t rows, int64_t cols) {
    return psumView(sets * setCols, rows, cols);
  }
  /// Channel tile t's columns [col, col + cols) of the block in `slot`.
  Value blockView(int64_t slot, int64_t t, int64_t col, int64_t cols) {
    return k.view(blockTiles[slot], k.index(t * width + col), {rowsOf(t), cols},
                  {tiles * width, 1});
  }
  Value setView(Value tile, int64_t t, int64_t rows, int64_t cols) {
    int64_t stride = cast<MemRefType>(tile.getType()).getShape()[1];
    return k.view(tile, k.index(t * chunkMax), {rows, cols}, {stride, 1});
  }
  Value constView(Value tile, int64_t rows, int64_t cols) {
    int64_t stride = cast<MemRefType>(tile.getType()).getShape()[1];
    return k.view(tile, k.index(0), {rows, cols}, {stride, 1});
  }

  /// The stationary matrices: -J, the diagonal blocks' parts of C I, ones
  /// for V (and a ones column for the channel sums), and the affine's
  /// per-channel columns as fp32.
  void makeConstants() {
    auto &b = k.b;
    const llvm::fltSemantics &sem = cast<FloatType>(elt).getFloatSemantics();
    auto exact = [&](double v) {
      APFloat f(v);
      bool lost = false;
      f.convert(sem, APFloat::rmNearestTiesToEven, &lost);
      return !lost;
    };
    negOnes = k.tile(MemorySpace::sbuf, {parts, parts}, elt);
    b.create<nisa::MemsetOp>(negOnes, APFloat(-1.0), nisa::Engine::gpsimd);
    Value identity = k.identity(parts, elt);
    // s I, or s I - J: computed in fp32 and rounded once (C itself may not
    // be exact where C - 1 is).
    auto scaledIdentity = [&](double scale, bool minusOnes) {
      Value m = k.tile(MemorySpace::sbuf, {parts, parts}, elt);
      if (minusOnes)
        b.create<nisa::ScalarTensorTensorOp>(
            nisa::AluOp::multiply, nisa::AluOp::add, identity, negOnes, m,
            Value(), APFloat(scale), nisa::Engine::vector);
      else
        b.create<nisa::TensorScalarOp>(nisa::AluOp::multiply, identity, m,
                                       Value(), APFloat(scale), false);
      return m;
    };
    if (exact(double(c - 1))) {
      diagonal.push_back(scaledIdentity(double(c), true));
    } else {
      diagonal.push_back(negOnes);
      // C in parts each exact in the dtype (C <= 1024 takes two in bf16).
      for (double rest = double(c); rest != 0.0;) {
        APFloat part(rest);
        bool lost = false;
        part.convert(sem, APFloat::rmTowardZero, &lost);
        double p = part.convertToDouble();
        diagonal.push_back(scaledIdentity(p, false));
        rest -= p;
      }
    }
    ones = k.tile(MemorySpace::sbuf, {parts, parts}, sqElt);
    b.create<nisa::MemsetOp>(ones, APFloat(1.0), nisa::Engine::gpsimd);
    if (withStats) {
      onesCol = k.tile(MemorySpace::sbuf, {parts, 1}, elt);
      b.create<nisa::MemsetOp>(onesCol, APFloat(1.0), nisa::Engine::gpsimd);
    }
    for (auto [buffer, tile] :
         {std::pair{weight, &weightCols}, std::pair{bias, &biasCols}}) {
      if (!buffer)
        continue;
      *tile = k.tile(MemorySpace::sbuf, {parts, tiles}, f32);
      for (int64_t t = 0; t < tiles; ++t)
        k.dma(k.view(buffer, k.index(t * parts), {rowsOf(t), 1}, {1, 1}),
              k.view(*tile, k.index(t), {rowsOf(t), 1}, {tiles, 1}));
    }
  }

  /// Block j of `image` (its positions [j * width, + blockWidth(j)) of
  /// every channel) in `buffer` (x or out).
  Value hbmBlock(Value buffer, Value image, int64_t j, int64_t t) {
    Value first = k.addOffset(k.scale(image, c * positions),
                              t * parts * positions + j * width);
    return k.view(buffer, first, {rowsOf(t), blockWidth(j)}, {positions, 1});
  }
  void load(Value image, int64_t j, int64_t slot) {
    for (int64_t t = 0; t < tiles; ++t)
      k.dma(hbmBlock(x, image, j, t), blockView(slot, t, 0, blockWidth(j)));
  }
  void store(Value image, int64_t j, int64_t slot) {
    for (int64_t t = 0; t < tiles; ++t)
      k.dma(blockView(slot, t, 0, blockWidth(j)), hbmBlock(out, image, j, t));
  }

  /// Stage one of chunk u of the block in `slot`: D on TensorE (and the
  /// channel sums for the mean), then d^2 on ScalarE.
  void deviations(int64_t slot, int64_t j, int64_t u) {
    auto &b = k.b;
    int64_t set = u % sets, col = chunkStart(j, u);
    int64_t cols = chunkWidth(j, u);
    for (int64_t m = 0; m < tiles; ++m) {
      Value d = dView(set, m, rowsOf(m), cols);
      bool first = true;
      for (int64_t t = 0; t < tiles; ++t)
        for (Value s : t == m ? ArrayRef<Value>(diagonal) : ArrayRef(negOnes)) {
          auto mm = b.create<nisa::MatmulOp>(constView(s, rowsOf(t), rowsOf(m)),
                                             blockView(slot, t, col, cols), d);
          if (!first)
            mm.setAccumulate(true);
          first = false;
        }
    }
    if (withStats)
      for (int64_t t = 0; t < tiles; ++t) {
        auto mm = b.create<nisa::MatmulOp>(constView(onesCol, rowsOf(t), 1),
                                           blockView(slot, t, col, cols),
                                           dView(set, tiles, 1, cols));
        if (t > 0)
          mm.setAccumulate(true);
      }
    for (int64_t m = 0; m < tiles; ++m)
      b.create<nisa::ActivationOp>(dView(set, m, rowsOf(m), cols),
                                   setView(squares[set], m, rowsOf(m), cols),
                                   Value(), nisa::ActivationFn::square,
                                   APFloat(1.0 / double(c)), APFloat(0.0));
  }

  /// Stage two: V (TensorE) and R (ScalarE) of chunk u.
  void sums(int64_t j, int64_t u) {
    auto &b = k.b;
    int64_t set = u % sets, cols = chunkWidth(j, u), all = rowsOf(0);
    Value v = vView(all, cols);
    for (int64_t m = 0; m < tiles; ++m) {
      auto mm = b.create<nisa::MatmulOp>(
          constView(ones, rowsOf(m), all),
          setView(squares[set], m, rowsOf(m), cols), v);
      if (m > 0)
        mm.setAccumulate(true);
    }
    double cd = double(c);
    b.create<nisa::ActivationOp>(v, setView(rstdTiles[set], 0, all, cols),
                                 Value(), nisa::ActivationFn::rsqrt,
                                 APFloat(cd), APFloat(cd * cd * eps));
  }

  /// Stage three: the normalized chunk into the block's tile (VectorE, then
  /// GpSimd with a bias), and the statistics' stores.
  void scale(Value image, int64_t slot, int64_t j, int64_t u) {
    auto &b = k.b;
    int64_t set = u % sets, col = chunkStart(j, u), cols = chunkWidth(j, u);
    for (int64_t m = 0; m < tiles; ++m) {
      int64_t rows = rowsOf(m);
      Value y = blockView(slot, m, col, cols);
      Value dst = bias ? setView(scaled[set], m, rows, cols) : y;
      b.create<nisa::ScalarTensorTensorOp>(
          nisa::AluOp::multiply, nisa::AluOp::multiply,
          dView(set, m, rows, cols), setView(rstdTiles[set], 0, rows, cols),
          dst,
          weight ? k.view(weightCols, k.index(m), {rows, 1}, {tiles, 1})
                 : Value(),
          APFloat(1.0), nisa::Engine::vector);
      if (bias)
        b.create<nisa::TensorScalarOp>(
            nisa::AluOp::add, dst, y,
            k.view(biasCols, k.index(m), {rows, 1}, {tiles, 1}), APFloat(0.0),
            false, nisa::Engine::gpsimd);
    }
    if (!withStats)
      return;
    // mean = sums / C and rstd = R C, rows of [N, 1, positions].
    double cd = double(c);
    Value row = statRows[set];
    Value meanRow = k.view(row, k.index(0), {1, cols}, {2 * chunkMax, 1});
    Value rstdRow =
        k.view(row, k.index(chunkMax), {1, cols}, {2 * chunkMax, 1});
    b.create<nisa::ActivationOp>(dView(set, tiles, 1, cols), meanRow, Value(),
                                 nisa::ActivationFn::identity,
                                 APFloat(1.0 / cd), APFloat(0.0));
    b.create<nisa::TensorScalarOp>(
        nisa::AluOp::multiply, setView(rstdTiles[set], 0, 1, cols), rstdRow,
        Value(), APFloat(cd), false, nisa::Engine::gpsimd);
    Value at = k.addOffset(k.scale(image, positions), j * width + col);
    for (auto [src, buffer] : {std::pair{meanRow, mean}, {rstdRow, rstd}})
      k.dma(src, k.view(buffer, at, {1, cols}, {cols, 1}));
  }

  /// Block t = image * blocks + j in slot t % kSlots, loaded kAhead blocks
  /// ahead. With sets to spare, stage one runs sets - 1 chunks ahead,
  /// between a chunk's stages two and three: TensorE computes the next D
  /// while VectorE scales, and ScalarE has the next squares to do while
  /// TensorE sums this chunk's (every block has at least `sets` chunks, so
  /// a chunk ahead is in this block or the next).
  void pipelined() {
    int64_t total = n * blocks, lead = sets - 1;
    for (int64_t t = 0; t < std::min(kAhead, total); ++t)
      load(k.index(t / blocks), t % blocks, t % kSlots);
    for (int64_t u = 0; u < lead; ++u)
      deviations(0, 0, u);
    k.forEachStep(n, blocks, kSlots, kAhead,
                  [&](Value image, int64_t j, int64_t slot, int64_t left) {
                    if (left > kAhead) {
                      auto [image2, j2] = k.stepAfter(image, j, blocks, kAhead);
                      load(image2, j2, (slot + kAhead) % kSlots);
                    }
                    int64_t chunks = chunksOf(j);
                    for (int64_t u = 0; u < chunks; ++u) {
                      if (!lead)
                        deviations(slot, j, u);
                      sums(j, u);
                      if (lead && u + lead < chunks)
                        deviations(slot, j, u + lead);
                      else if (lead && left > 1)
                        deviations((slot + 1) % kSlots, (j + 1) % blocks,
                                   u + lead - chunks);
                      scale(image, slot, j, u);
                    }
                    store(image, j, slot);
                  });
  }

  KernelLowering &k;
  Value x, weight, bias, out, mean, rstd;
  bool withStats;
  double eps;
  Type elt, f32, sqElt;
  int64_t n = 0, c = 0, positions = 0, parts = 0, tiles = 0;
  int64_t sets = 0, chunkMax = 0, setCols = 0, blocks = 0, width = 0;
  SmallVector<Value, kSlots> blockTiles;
  SmallVector<Value, 2> squares, rstdTiles, scaled, statRows;
  SmallVector<Value, 3> diagonal;
  Value psum, negOnes, ones, onesCol, weightCols, biasCols;
};

struct ChannelNormPattern : OpTilePattern<ChannelNormPattern, ChannelNormOp> {
  LogicalResult lowerOp(ChannelNormOp op, KernelLowering &k) const {
    ChannelNormKernel kernel(k, op);
    if (!kernel.fits())
      return op->emitOpError("keeps ")
             << kernel.residentBytes()
             << " bytes per partition resident, more than target '"
             << k.target.name << "' has";
    kernel.lower();
    return success();
  }
};

} // namespace

void populateChannelNormPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<ChannelNormPattern>());
}

} // namespace mlir::neuron
