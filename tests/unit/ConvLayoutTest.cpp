//===- ConvLayoutTest.cpp - neuron.conv2d's on-chip layout ----------------===//
//
// Conv2dOp::layout alone: what the direct kernel stacks on the partitions,
// which images share a PSUM tile, and the SBUF it keeps resident, which
// the importer compares with kConvResidentBudget.
//
//===----------------------------------------------------------------------===//

#include "dialects/neuron/NeuronDialect.h"

#include "compiler/Registration.h"
#include "tests/unit/CatchCompat.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <string>

using namespace mlir;
using namespace mlir::neuron;

namespace {

/// The layout of `conv2d x : [n, c, h, w], weight [o, c, k, k]` in bf16.
ConvLayout layoutOf(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
                    int64_t k, int64_t stride, int64_t pad) {
  MLIRContext context;
  DialectRegistry registry;
  ::neuron::compiler::registerDialects(registry);
  context.appendDialectRegistry(registry);
  context.loadAllAvailableDialects();
  auto dims = [](std::initializer_list<int64_t> d) {
    std::string s;
    for (int64_t v : d)
      s += std::to_string(v) + "x";
    return "tensor<" + s + "bf16>";
  };
  int64_t ho = (h + 2 * pad - k) / stride + 1,
          wo = (w + 2 * pad - k) / stride + 1;
  std::string x = dims({n, c, h, w}), wt = dims({o, c, k, k}),
              y = dims({n, o, ho, wo});
  std::string s = std::to_string(stride), p = std::to_string(pad);
  std::string body = "func.func @f(%x: " + x + ", %w: " + wt + ") -> " + y +
                     " {\n  %0 = neuron.conv2d %x, %w stride [" + s + ", " + s +
                     "] padding [" + p + ", " + p + "] dilation [1, 1] : " + x +
                     ", " + wt + " -> " + y + "\n  return %0 : " + y + "\n}\n";
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(body, &context);
  REQUIRE(module);
  Conv2dOp conv;
  module->walk([&](Conv2dOp op) { conv = op; });
  REQUIRE(conv);
  return conv.layout();
}

} // namespace

TEST_CASE("64 channels stack two copies, two taps a matmul", "[conv-layout]") {
  ConvLayout l = layoutOf(8, 64, 56, 56, 64, 3, 1, 1);
  CHECK(l.cTiles == 1);
  CHECK(!l.rowStacked);
  CHECK(l.copies == 2);
  CHECK(l.copyParts == 64);
  CHECK(l.tapGroups == 6); // (i, 0..1) and (i, 2) for each kernel row
  CHECK(l.images == 1);    // 56 x 56 outputs fill bank after bank
  CHECK(l.lead == 1);
  CHECK(l.plane == 1 + 58 * 58);
  CHECK(l.rowsPerTile == 9); // 9 x 56 = 504 of a bank's 512 columns
  CHECK(l.imageSlots == 3);
  CHECK(l.residentBytes <= kConvResidentBudget);
}

TEST_CASE("Wide channels take no copies; small images share a tile",
          "[conv-layout]") {
  ConvLayout l = layoutOf(8, 512, 7, 7, 512, 3, 1, 1);
  CHECK(l.cTiles == 4);
  CHECK(l.oTiles == 4);
  CHECK(l.copies == 1);
  CHECK(l.tapGroups == 9);
  CHECK(l.images == 8); // 8 x 49 positions in one bank
  CHECK(l.rowsPerTile == 7);
  CHECK(l.imageSlots == 2); // one group of images
  // The weights dominate: 4 channel tiles x 9 taps x 512 outputs, bf16.
  CHECK(l.residentBytes > 4 * 9 * 512 * 2);
}

TEST_CASE("Few channels stack up to a kernel row of copies", "[conv-layout]") {
  ConvLayout l = layoutOf(2, 16, 20, 20, 16, 5, 1, 2);
  CHECK(l.copies == 5);
  CHECK(l.tapGroups == 5); // one matmul per kernel row
  CHECK(l.lead == 4);
  CHECK(l.images == 1); // 400 positions: two images would not fit a bank
}

TEST_CASE("A strided stem stacks its kernel rows, a DMA engine's "
          "partitions each",
          "[conv-layout]") {
  ConvLayout l = layoutOf(8, 3, 224, 224, 64, 7, 2, 3);
  CHECK(l.rowStacked);
  CHECK(l.copyParts == 8); // 56 partitions a column shift, 7 DMA engines
  CHECK(l.colCopies == 2); // and two column shifts: 112 partitions
  CHECK(l.copies == 14);
  CHECK(l.tapGroups == 4); // kernel columns 0-1, 2-3, 4-5, 6
  CHECK(l.lead == 0);
  CHECK(l.plane == 112 * 230); // the rows kernel row r reads, padded
  CHECK(l.residentBytes <= kConvResidentBudget);
}

TEST_CASE("A ViT's patch embedding stacks its 16 kernel rows",
          "[conv-layout]") {
  ConvLayout l = layoutOf(8, 3, 224, 224, 768, 16, 16, 0);
  CHECK(l.rowStacked);
  CHECK(l.copies * l.copyParts == 128);
  CHECK(l.tapGroups == 16);
  CHECK(l.images == 2); // 2 x 196 patches in a bank
  CHECK(l.plane == 14 * 224);
}

TEST_CASE("An RGB input layer stacks rows and columns at stride 1",
          "[conv-layout]") {
  ConvLayout l = layoutOf(2, 4, 64, 64, 320, 3, 1, 1);
  CHECK(l.rowStacked);
  CHECK(l.colCopies == 3);
  CHECK(l.tapGroups == 1); // all nine taps in one matmul of 72 partitions
  CHECK(l.plane == 64 * 66);
}

TEST_CASE("Rows longer than a bank go one row a tile, in chunks",
          "[conv-layout]") {
  ConvLayout l = layoutOf(1, 80, 1, 3000, 384, 1, 1, 0);
  CHECK(l.rowsPerTile == 1);
  CHECK(l.chunkCols == 512);
}

TEST_CASE("Weights too large for SBUF go in panels of output tiles",
          "[conv-layout]") {
  // Stable Diffusion's 1280-channel 3 x 3: 29 MB of weights.
  ConvLayout l = layoutOf(2, 1280, 8, 8, 1280, 3, 1, 1);
  CHECK(l.oTiles == 10);
  CHECK(l.oPanel >= 1);
  CHECK(l.oPanel < l.oTiles);
  CHECK(l.residentBytes <= kConvResidentBudget);
  CHECK(layoutOf(8, 512, 7, 7, 512, 3, 1, 1).oPanel == 4); // all of them
}

TEST_CASE("A whole image is one band", "[conv-layout]") {
  ConvLayout l = layoutOf(8, 64, 56, 56, 64, 3, 1, 1);
  CHECK(l.bands == 1);
  CHECK(l.bandRows == 56);
  CHECK(l.bandIn == 58); // every padded row
  CHECK(l.loadedRows == 56);
}

TEST_CASE("An image too large for SBUF goes through in bands of rows",
          "[conv-layout]") {
  // Stable Diffusion's VAE decoder: 128 channels at 256 x 256.
  ConvLayout l = layoutOf(1, 128, 256, 256, 128, 3, 1, 1);
  CHECK(l.bands > 1);
  CHECK(l.bandRows % l.rowsPerTile == 0); // whole tiles of output rows
  CHECK(l.bands * l.bandRows >= 256);
  CHECK((l.bands - 1) * l.bandRows < 256);
  CHECK(l.bandIn == l.bandRows + 2); // the rows its windows read
  CHECK(l.loadedRows == l.bandIn);
  CHECK(l.oPanel == l.oTiles);
  CHECK(l.residentBytes <= kConvResidentBudget);
  // The fewest bands that fit: 2 x 514 x 2 bytes per padded row of a slot
  // beside 13.3 KB of weights and staging leave 73 rows, so 4 bands of 64
  // (3 of 86 would not fit).
  CHECK(l.bands == 4);
  CHECK(l.bandRows == 64);
  // Strided: a band of r output rows reads (r - 1) * 2 + 3 rows.
  ConvLayout s = layoutOf(1, 128, 300, 300, 128, 3, 2, 1);
  CHECK(s.bands > 1);
  CHECK(s.bandIn == (s.bandRows - 1) * 2 + 3);
  CHECK(s.residentBytes <= kConvResidentBudget);
}

TEST_CASE("Row-stacked bands hold one row per output row", "[conv-layout]") {
  // VGG's first layer: 3 channels at 224 x 224, stride 1.
  ConvLayout l = layoutOf(8, 3, 224, 224, 64, 3, 1, 1);
  CHECK(l.rowStacked);
  CHECK(l.bands > 1);
  CHECK(l.bandIn == l.bandRows);
  CHECK(l.residentBytes <= kConvResidentBudget);
}

TEST_CASE("A row too long for SBUF exceeds the importer's budget",
          "[conv-layout]") {
  ConvLayout l = layoutOf(1, 512, 4, 60000, 64, 3, 1, 1);
  CHECK(l.bandRows == 1);
  CHECK(l.residentBytes > kConvResidentBudget);
}
