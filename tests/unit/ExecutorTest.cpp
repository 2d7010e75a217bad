//===- ExecutorTest.cpp - Op semantics and numerics of the executor -------===//

#include "runtime/exec/Executor.h"
#include "runtime/exec/CollectiveHandler.h"
#include "runtime/exec/Philox.h"
#include "runtime/exec/WorkerPool.h"
#include "tests/unit/CatchCompat.h"
#include "tests/unit/TestUtil.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <random>

using namespace neuron::runtime;
using neuron::test::base64;
using neuron::test::buffer;
using neuron::test::contains;
using neuron::test::errorOf;
using neuron::test::programJson;
using neuron::test::trn2;
using neuron::test::view;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

/// A host tensor of any dtype that owns its bytes.
struct Tensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  static Tensor zeros(DType dtype, std::vector<int64_t> shape) {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    int64_t n = 1;
    for (int64_t d : t.shape)
      n *= d;
    t.bytes.assign(n * dtypeSize(dtype), 0);
    return t;
  }
  /// Values are stored with the runtime's own store rule.
  static Tensor of(DType dtype, std::vector<int64_t> shape,
                   const std::vector<double> &values) {
    Tensor t = zeros(dtype, std::move(shape));
    REQUIRE(values.size() == t.size());
    for (size_t i = 0; i < values.size(); ++i)
      storeFromF64(values[i], t.bytes.data() + i * dtypeSize(dtype), dtype);
    return t;
  }
  size_t size() const { return bytes.size() / dtypeSize(dtype); }
  float at(size_t i) const {
    return loadAsF32(bytes.data() + i * dtypeSize(dtype), dtype);
  }
  template <typename T> T raw(size_t i) const {
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    return v;
  }
  HostTensor host() { return HostTensor{bytes.data(), dtype, shape}; }
};

std::string shapeJson(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string rowMajorStrides(const std::vector<int64_t> &shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    strides[i - 1] = strides[i] * shape[i];
  return shapeJson(strides);
}

/// A dense view of a whole buffer.
std::string full(int buf, const std::vector<int64_t> &shape) {
  return view(buf, shapeJson(shape), rowMajorStrides(shape));
}

/// Tile programs: input i lives in hbm buffer i and is DMA'd into sbuf
/// scratch 100+i; `compute` (JSON nodes) works on the scratch tiles; sbuf
/// scratch 200+j is DMA'd to hbm output 50+j.
struct TileArg {
  std::string dtype;
  std::vector<int64_t> shape;
};

std::string tileProgram(const std::vector<TileArg> &ins,
                        const std::vector<TileArg> &outs,
                        const std::string &compute,
                        const std::string &extraBuffers = "") {
  std::string buffers, inputs, outputs, body;
  auto sep = [](std::string &s) {
    if (!s.empty())
      s += ", ";
  };
  for (size_t i = 0; i < ins.size(); ++i) {
    int id = static_cast<int>(i);
    sep(buffers);
    buffers +=
        buffer(id, "hbm", "input", ins[i].dtype, shapeJson(ins[i].shape)) +
        ", " +
        buffer(100 + id, "sbuf", "scratch", ins[i].dtype,
               shapeJson(ins[i].shape));
    sep(inputs);
    inputs += std::to_string(id);
    sep(body);
    body += R"({"op": "dma_copy", "engine": "sync", "src": )" +
            full(id, ins[i].shape) + R"(, "dst": )" +
            full(100 + id, ins[i].shape) + "}";
  }
  sep(body);
  body += compute;
  for (size_t j = 0; j < outs.size(); ++j) {
    int id = static_cast<int>(j);
    sep(buffers);
    buffers += buffer(50 + id, "hbm", "output", outs[j].dtype,
                      shapeJson(outs[j].shape)) +
               ", " +
               buffer(200 + id, "sbuf", "scratch", outs[j].dtype,
                      shapeJson(outs[j].shape));
    sep(outputs);
    outputs += std::to_string(50 + id);
    body += R"(, {"op": "dma_copy", "engine": "sync", "src": )" +
            full(200 + id, outs[j].shape) + R"(, "dst": )" +
            full(50 + id, outs[j].shape) + "}";
  }
  if (!extraBuffers.empty())
    buffers += ", " + extraBuffers;
  return programJson(buffers, inputs, outputs, body);
}

void run(const std::string &json, std::vector<Tensor *> ins,
         std::vector<Tensor *> outs) {
  std::vector<HostTensor> in, out;
  for (Tensor *t : ins)
    in.push_back(t->host());
  for (Tensor *t : outs)
    out.push_back(t->host());
  neuron::test::runProgram(json, in, out);
}

bool close(double actual, double expected, double rel = 2e-6,
           double abs = 1e-6) {
  if (std::isnan(expected))
    return std::isnan(actual);
  if (std::isinf(expected))
    return actual == expected;
  return std::fabs(actual - expected) <= abs + rel * std::fabs(expected);
}

} // namespace

//===----------------------------------------------------------------------===//
// DMA
//===----------------------------------------------------------------------===//

TEST_CASE("dma_copy moves data, broadcasts and transposes", "[exec][dma]") {
  Tensor in = Tensor::zeros(DType::F32, {4, 8});
  for (size_t i = 0; i < 32; ++i)
    storeFromF32(static_cast<float>(i), in.bytes.data() + 4 * i, DType::F32);

  SECTION("transposed strides") {
    Tensor out = Tensor::zeros(DType::F32, {8, 4});
    std::string json = programJson(
        buffer(0, "hbm", "input", "f32", "[4, 8]") + "," +
            buffer(1, "hbm", "output", "f32", "[8, 4]") + "," +
            buffer(2, "sbuf", "scratch", "f32", "[8, 4]"),
        "0", "1",
        R"({"op": "dma_copy", "engine": "sync", "src": )" +
            view(0, "[8, 4]", "[1, 8]") + R"(, "dst": )" + full(2, {8, 4}) +
            R"(}, {"op": "dma_copy", "engine": "gpsimd", "src": )" +
            full(2, {8, 4}) + R"(, "dst": )" + full(1, {8, 4}) + "}");
    run(json, {&in}, {&out});
    for (int j = 0; j < 8; ++j)
      for (int i = 0; i < 4; ++i)
        CHECK(out.at(j * 4 + i) == in.at(i * 8 + j));
  }

  SECTION("broadcast with stride 0") {
    Tensor out = Tensor::zeros(DType::F32, {3, 4, 8});
    // Row 1 of the input, repeated over 3 x 4 with two zero strides.
    std::string json =
        programJson(buffer(0, "hbm", "input", "f32", "[4, 8]") + "," +
                        buffer(1, "hbm", "output", "f32", "[3, 4, 8]"),
                    "0", "1",
                    R"({"op": "dma_copy", "engine": "sync", "src": )" +
                        view(0, "[3, 4, 8]", "[0, 0, 1]", 8) + R"(, "dst": )" +
                        full(1, {3, 4, 8}) + "}");
    run(json, {&in}, {&out});
    for (size_t i = 0; i < out.size(); ++i)
      REQUIRE(out.at(i) == 8.0f + static_cast<float>(i % 8));
  }

  SECTION("dtype conversion rounds to nearest even") {
    std::vector<double> values = {1.0,
                                  bitsToFloat(0x3f808000u),
                                  bitsToFloat(0x3f818000u),
                                  -3.9,
                                  1e10,
                                  kNaN,
                                  -kInf,
                                  65520.0};
    Tensor src = Tensor::of(DType::F32, {8}, values);
    Tensor bf = Tensor::zeros(DType::BF16, {8});
    Tensor f16 = Tensor::zeros(DType::F16, {8});
    Tensor i32 = Tensor::zeros(DType::I32, {8});
    std::string json =
        programJson(buffer(0, "hbm", "input", "f32", "[8]") + "," +
                        buffer(1, "hbm", "output", "bf16", "[8]") + "," +
                        buffer(2, "hbm", "output", "f16", "[8]") + "," +
                        buffer(3, "hbm", "output", "i32", "[8]"),
                    "0", "1, 2, 3",
                    R"({"op": "dma_copy", "engine": "sync", "src": )" +
                        full(0, {8}) + R"(, "dst": )" + full(1, {8}) +
                        R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
                        full(0, {8}) + R"(, "dst": )" + full(2, {8}) +
                        R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
                        full(0, {8}) + R"(, "dst": )" + full(3, {8}) + "}");
    run(json, {&src}, {&bf, &f16, &i32});
    for (size_t i = 0; i < values.size(); ++i) {
      float v = src.at(i);
      uint16_t expectBf = f32ToBf16Bits(v), expectF16 = f32ToF16Bits(v);
      CHECK(bf.raw<uint16_t>(i) == expectBf);
      CHECK(f16.raw<uint16_t>(i) == expectF16);
      CHECK(i32.raw<int32_t>(i) == f32ToInt<int32_t>(v));
    }
    CHECK(bf.raw<uint16_t>(1) == 0x3f80);
    CHECK(bf.raw<uint16_t>(2) == 0x3f82);
    CHECK(f16.raw<uint16_t>(7) == 0x7c00);
    CHECK(i32.raw<int32_t>(3) == -3);
    CHECK(i32.raw<int32_t>(4) == std::numeric_limits<int32_t>::max());
    CHECK(i32.raw<int32_t>(5) == 0);
  }

  SECTION("same-dtype copies are bit exact") {
    int64_t big = (int64_t(1) << 53) + 1; // not representable in fp32
    Tensor src = Tensor::zeros(DType::I64, {2});
    std::memcpy(src.bytes.data(), &big, 8);
    Tensor out = Tensor::zeros(DType::I64, {2});
    std::string json = programJson(
        buffer(0, "hbm", "input", "i64", "[2]") + "," +
            buffer(1, "hbm", "output", "i64", "[2]") + "," +
            buffer(2, "sbuf", "scratch", "i64", "[2, 1]"),
        "0", "1",
        R"({"op": "dma_copy", "engine": "sync", "src": )" +
            view(0, "[2, 1]", "[1, 1]") + R"(, "dst": )" + full(2, {2, 1}) +
            R"(}, {"op": "copy", "engine": "vector", "src": )" +
            full(2, {2, 1}) + R"(, "dst": )" + full(2, {2, 1}) +
            R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
            view(2, "[2]", "[1]") + R"(, "dst": )" + full(1, {2}) + "}");
    run(json, {&src}, {&out});
    CHECK(out.raw<int64_t>(0) == big);
  }
}

TEST_CASE("large copies and transposes are split between threads",
          "[exec][dma]") {
  // 128 KiB per copy, past the size where the executor splits a copy: a
  // transposing load, a converting store and a plain store.
  const int64_t rows = 512, cols = 128;
  std::vector<double> values(rows * cols);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<double>(i % 4099) - 2000.0;
  Tensor in = Tensor::of(DType::BF16, {rows, cols}, values);
  Tensor same = Tensor::zeros(DType::BF16, {cols, rows});
  Tensor wide = Tensor::zeros(DType::F32, {cols, rows});
  std::string json = programJson(
      buffer(0, "hbm", "input", "bf16", "[512, 128]") + "," +
          buffer(1, "hbm", "output", "bf16", "[128, 512]") + "," +
          buffer(2, "hbm", "output", "f32", "[128, 512]") + "," +
          buffer(3, "sbuf", "scratch", "bf16", "[128, 512]"),
      "0", "1, 2",
      R"({"op": "dma_copy", "engine": "sync", "src": )" +
          view(0, "[128, 512]", "[1, 128]") + R"(, "dst": )" +
          full(3, {cols, rows}) +
          R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
          full(3, {cols, rows}) + R"(, "dst": )" + full(1, {cols, rows}) +
          R"(}, {"op": "dma_copy", "engine": "gpsimd", "src": )" +
          full(3, {cols, rows}) + R"(, "dst": )" + full(2, {cols, rows}) + "}");
  run(json, {&in}, {&same, &wide});
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = 0; j < rows; ++j) {
      REQUIRE(same.raw<uint16_t>(i * rows + j) ==
              in.raw<uint16_t>(j * cols + i));
      REQUIRE(wide.at(i * rows + j) == in.at(j * cols + i));
    }
}

TEST_CASE("4-byte transposing loads keep every bit on awkward shapes",
          "[exec][dma]") {
  // Whole 8 x 8 and 32 x 32 blocks go through registers, the rest element
  // by element: odd sizes, a padded source pitch, partial tiles, and a copy
  // large enough to be split between threads mid-tile (100 rows).
  std::mt19937 rng(7);
  struct Shape {
    int64_t rows, cols, pitch; // dst [rows, cols]; src [cols, pitch]
  };
  for (Shape s : {Shape{70, 45, 73}, Shape{128, 100, 128}, Shape{33, 97, 40},
                  Shape{64, 64, 64}, Shape{100, 250, 103}, Shape{8, 8, 9}}) {
    INFO("rows " << s.rows << " cols " << s.cols << " pitch " << s.pitch);
    // Raw bit patterns: NaN payloads, infinities, subnormals, -0.
    Tensor in = Tensor::zeros(DType::F32, {s.cols, s.pitch});
    for (size_t i = 0; i < in.size(); ++i) {
      uint32_t bits = rng();
      std::memcpy(in.bytes.data() + 4 * i, &bits, 4);
    }
    Tensor out = Tensor::zeros(DType::F32, {s.rows, s.cols});
    std::string dstShape = shapeJson({s.rows, s.cols});
    std::string json = programJson(
        buffer(0, "hbm", "input", "f32", shapeJson({s.cols, s.pitch})) + "," +
            buffer(1, "hbm", "output", "f32", dstShape) + "," +
            buffer(2, "sbuf", "scratch", "f32", dstShape),
        "0", "1",
        R"({"op": "dma_copy", "engine": "sync", "src": )" +
            view(0, dstShape, shapeJson({1, s.pitch})) + R"(, "dst": )" +
            full(2, {s.rows, s.cols}) +
            R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
            full(2, {s.rows, s.cols}) + R"(, "dst": )" +
            full(1, {s.rows, s.cols}) + "}");
    run(json, {&in}, {&out});
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t c = 0; c < s.cols; ++c)
        REQUIRE(out.raw<uint32_t>(r * s.cols + c) ==
                in.raw<uint32_t>(c * s.pitch + r));
  }
}

TEST_CASE("loops evaluate affine offsets", "[exec][loop]") {
  Tensor in = Tensor::zeros(DType::F32, {4, 8});
  for (size_t i = 0; i < 32; ++i)
    storeFromF32(static_cast<float>(i), in.bytes.data() + 4 * i, DType::F32);
  std::string io = buffer(0, "hbm", "input", "f32", "[4, 8]") + "," +
                   buffer(1, "hbm", "output", "f32", "[4, 8]");

  SECTION("row reversal with a negative coefficient") {
    Tensor out = Tensor::zeros(DType::F32, {4, 8});
    std::string json = programJson(
        io, "0", "1",
        R"({"loop": 3, "count": 4, "body": [{"op": "dma_copy",
            "engine": "sync", "src": )" +
            view(0, "[1, 8]", "[8, 1]", 0, "[[3, 8]]") + R"(, "dst": )" +
            view(1, "[1, 8]", "[8, 1]", 24, "[[3, -8]]") + "}]}");
    run(json, {&in}, {&out});
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 8; ++c)
        CHECK(out.at(r * 8 + c) == in.at((3 - r) * 8 + c));
  }

  SECTION("nested tile loops through SBUF") {
    Tensor out = Tensor::zeros(DType::F32, {4, 8});
    // 2 x 2 tiles of [2, 4]: tile (i, j) starts at 16 i + 4 j.
    std::string terms = "[[0, 16], [1, 4]]";
    std::string tile = view(0, "[2, 4]", "[8, 1]", 0, terms);
    std::string outTile = view(1, "[2, 4]", "[8, 1]", 0, terms);
    std::string sb = full(2, {2, 4});
    std::string json = programJson(
        io + "," + buffer(2, "sbuf", "scratch", "f32", "[2, 4]"), "0", "1",
        R"({"loop": 0, "count": 2, "body": [
             {"loop": 1, "count": 2, "body": [
               {"op": "dma_copy", "engine": "sync", "src": )" +
            tile + R"(, "dst": )" + sb + R"(},
               {"op": "activation", "engine": "scalar", "func": "identity",
                "scale": 2.0, "bias_imm": 1.0, "src": )" +
            sb + R"(, "dst": )" + sb + R"(},
               {"op": "dma_copy", "engine": "sync", "src": )" +
            sb + R"(, "dst": )" + outTile + "}]}]}");
    Program program = Program::parse(json);
    Executor executor(program, trn2());
    std::vector<HostTensor> ins = {in.host()}, outs = {out.host()};
    executor.run(ins, outs);
    CHECK(executor.instructionsExecuted() == 12);
    for (size_t i = 0; i < 32; ++i)
      CHECK(out.at(i) == 2.0f * in.at(i) + 1.0f);
    // A second run reuses everything and gives the same answer.
    std::fill(out.bytes.begin(), out.bytes.end(), 0);
    executor.run(ins, outs);
    CHECK(executor.instructionsExecuted() == 12);
    CHECK(out.at(31) == 63.0f);
  }
}

//===----------------------------------------------------------------------===//
// TensorE
//===----------------------------------------------------------------------===//

namespace {

/// stationary [K, M] and moving [K, N] (bf16 in HBM) -> SBUF -> matmul(s)
/// into PSUM -> f32 output [M, N]. `matmuls` is the matmul node list built
/// from the three views.
std::string matmulProgram(
    int64_t k, int64_t m, int64_t n,
    const std::function<std::string(const std::string &, const std::string &,
                                    const std::string &)> &matmuls,
    const std::string &dtype = "bf16") {
  std::string buffers =
      buffer(0, "hbm", "input", dtype, shapeJson({k, m})) + "," +
      buffer(1, "hbm", "input", dtype, shapeJson({k, n})) + "," +
      buffer(2, "hbm", "output", "f32", shapeJson({m, n})) + "," +
      buffer(3, "sbuf", "scratch", dtype, shapeJson({k, m})) + "," +
      buffer(4, "sbuf", "scratch", dtype, shapeJson({k, n})) + "," +
      buffer(5, "psum", "scratch", "f32", shapeJson({m, n}));
  std::string body =
      R"({"op": "dma_copy", "engine": "sync", "src": )" + full(0, {k, m}) +
      R"(, "dst": )" + full(3, {k, m}) +
      R"(}, {"op": "dma_copy", "engine": "scalar", "src": )" + full(1, {k, n}) +
      R"(, "dst": )" + full(4, {k, n}) + "}, " +
      matmuls(full(3, {k, m}), full(4, {k, n}), full(5, {m, n})) +
      R"(, {"op": "dma_copy", "engine": "sync", "src": )" + full(5, {m, n}) +
      R"(, "dst": )" + full(2, {m, n}) + "}";
  return programJson(buffers, "0, 1", "2", body);
}

std::string matmulNode(const std::string &s, const std::string &mv,
                       const std::string &d, bool accumulate) {
  return R"({"op": "matmul", "engine": "tensor", "accumulate": )" +
         std::string(accumulate ? "true" : "false") + R"(, "stationary": )" +
         s + R"(, "moving": )" + mv + R"(, "dst": )" + d + "}";
}

} // namespace

TEST_CASE("matmul multiplies bf16 exactly and accumulates in fp32",
          "[exec][matmul]") {
  const int64_t k = 128, m = 64, n = 96;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> a(k * m), b(k * n);
  for (double &v : a)
    v = dist(rng);
  for (double &v : b)
    v = dist(rng);
  Tensor sa = Tensor::of(DType::BF16, {k, m}, a);
  Tensor sb = Tensor::of(DType::BF16, {k, n}, b);
  Tensor out = Tensor::zeros(DType::F32, {m, n});
  run(matmulProgram(
          k, m, n,
          [](const std::string &s, const std::string &mv,
             const std::string &d) { return matmulNode(s, mv, d, false); }),
      {&sa, &sb}, {&out});

  // Reference in double from the stored bf16 values. fp32 accumulation of
  // K terms errs by at most about K * 2^-24 * sum|a*b|; bf16 accumulation
  // would be ~2^16 times worse.
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        double prod = double(sa.at(p * m + i)) * double(sb.at(p * n + j));
        ref += prod;
        mag += std::fabs(prod);
      }
      double err = std::fabs(double(out.at(i * n + j)) - ref);
      REQUIRE(err <= k * std::ldexp(1.0, -24) * mag);
      worst = std::max(worst, err / mag);
    }
  }
  CHECK(worst < 1e-6);
}

TEST_CASE("an is_transpose matmul moves values bit for bit", "[exec][matmul]") {
  // A product with the identity would turn inf * 0 into NaN; the engine's
  // transpose mode keeps infinities, NaN and -0 (the moving identity is
  // only streamed: the executor does not read it).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> values = {1.5, -inf, 3, inf, std::nan(""), -0.0};
  Tensor x = Tensor::of(DType::BF16, {2, 3}, values);
  Tensor out = Tensor::zeros(DType::F32, {3, 2});
  std::string json = tileProgram(
      {{"bf16", {2, 3}}}, {{"f32", {3, 2}}},
      R"({"op": "matmul", "engine": "tensor", "is_transpose": true, )"
      R"("stationary": )" +
          full(100, {2, 3}) + R"(, "moving": )" + full(101, {2, 2}) +
          R"(, "dst": )" + full(102, {3, 2}) +
          R"(}, {"op": "copy", "engine": "vector", "src": )" +
          full(102, {3, 2}) + R"(, "dst": )" + full(200, {3, 2}) + "}",
      buffer(101, "sbuf", "scratch", "bf16", "[2, 2]") + ", " +
          buffer(102, "psum", "scratch", "f32", "[3, 2]"));
  run(json, {&x}, {&out});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      float want = x.at(j * 3 + i), got = out.at(i * 2 + j);
      INFO("element " << i << ", " << j);
      CHECK(std::memcmp(&want, &got, 4) == 0);
    }
}

TEST_CASE("matmul sums beyond bf16 precision exactly", "[exec][matmul]") {
  // 1 + 127 * 2^-10 needs 11 mantissa bits: exact in fp32 whatever the
  // summation order, not representable in bf16.
  const int64_t k = 128;
  std::vector<double> ones(k, 1.0), moving(k, std::ldexp(1.0, -10));
  moving[0] = 1.0;
  Tensor sa = Tensor::of(DType::BF16, {k, 1}, ones);
  Tensor sb = Tensor::of(DType::BF16, {k, 1}, moving);
  Tensor out = Tensor::zeros(DType::F32, {1, 1});
  run(matmulProgram(
          k, 1, 1,
          [](const std::string &s, const std::string &mv,
             const std::string &d) { return matmulNode(s, mv, d, false); }),
      {&sa, &sb}, {&out});
  CHECK(out.at(0) == 1.0f + 127.0f / 1024.0f);
}

TEST_CASE("matmul accumulate adds into PSUM, otherwise overwrites",
          "[exec][matmul]") {
  const int64_t k = 16, m = 8, n = 12;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> dist(-2, 2); // sums stay exact
  std::vector<double> a(k * m), b(k * n);
  for (double &v : a)
    v = dist(rng);
  for (double &v : b)
    v = dist(rng);
  Tensor sa = Tensor::of(DType::BF16, {k, m}, a);
  Tensor sb = Tensor::of(DType::BF16, {k, n}, b);
  std::vector<double> product(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        product[i * n + j] += a[p * m + i] * b[p * n + j];

  Tensor twice = Tensor::zeros(DType::F32, {m, n});
  run(matmulProgram(k, m, n,
                    [](const std::string &s, const std::string &mv,
                       const std::string &d) {
                      return matmulNode(s, mv, d, false) + ", " +
                             matmulNode(s, mv, d, true);
                    }),
      {&sa, &sb}, {&twice});
  Tensor once = Tensor::zeros(DType::F32, {m, n});
  run(matmulProgram(k, m, n,
                    [](const std::string &s, const std::string &mv,
                       const std::string &d) {
                      return matmulNode(s, mv, d, true) + ", " +
                             matmulNode(s, mv, d, false);
                    }),
      {&sa, &sb}, {&once});
  for (size_t i = 0; i < product.size(); ++i) {
    CHECK(twice.at(i) == 2 * product[i]);
    CHECK(once.at(i) == product[i]);
  }
}

TEST_CASE("matmul accumulates K tiles over a loop", "[exec][matmul]") {
  // K = 256 in two tiles of 128: psum = memset 0, then accumulate per tile.
  const int64_t k = 256, kt = 128, m = 32, n = 48;
  std::mt19937 rng(13);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> a(k * m), b(k * n);
  for (double &v : a)
    v = dist(rng);
  for (double &v : b)
    v = dist(rng);
  Tensor sa = Tensor::of(DType::F16, {k, m}, a);
  Tensor sb = Tensor::of(DType::F16, {k, n}, b);
  Tensor out = Tensor::zeros(DType::F32, {m, n});
  std::string buffers =
      buffer(0, "hbm", "input", "f16", shapeJson({k, m})) + "," +
      buffer(1, "hbm", "input", "f16", shapeJson({k, n})) + "," +
      buffer(2, "hbm", "output", "f32", shapeJson({m, n})) + "," +
      buffer(3, "sbuf", "scratch", "f16", shapeJson({kt, m})) + "," +
      buffer(4, "sbuf", "scratch", "f16", shapeJson({kt, n})) + "," +
      buffer(5, "psum", "scratch", "f32", shapeJson({m, n}));
  std::string body =
      R"({"op": "memset", "engine": "vector", "value": 0, "dst": )" +
      full(5, {m, n}) + R"(}, {"loop": 0, "count": 2, "body": [
        {"op": "dma_copy", "engine": "sync", "src": )" +
      view(0, shapeJson({kt, m}), rowMajorStrides({kt, m}), 0,
           "[[0, " + std::to_string(kt * m) + "]]") +
      R"(, "dst": )" + full(3, {kt, m}) +
      R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
      view(1, shapeJson({kt, n}), rowMajorStrides({kt, n}), 0,
           "[[0, " + std::to_string(kt * n) + "]]") +
      R"(, "dst": )" + full(4, {kt, n}) + "}, " +
      matmulNode(full(3, {kt, m}), full(4, {kt, n}), full(5, {m, n}), true) +
      R"(]}, {"op": "dma_copy", "engine": "sync", "src": )" + full(5, {m, n}) +
      R"(, "dst": )" + full(2, {m, n}) + "}";
  run(programJson(buffers, "0, 1", "2", body), {&sa, &sb}, {&out});
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        double prod = double(sa.at(p * m + i)) * double(sb.at(p * n + j));
        ref += prod;
        mag += std::fabs(prod);
      }
      REQUIRE(std::fabs(out.at(i * n + j) - ref) <=
              k * std::ldexp(1.0, -24) * mag);
    }
  }
}

//===----------------------------------------------------------------------===//
// ScalarE
//===----------------------------------------------------------------------===//

TEST_CASE("activation functions", "[exec][activation]") {
  const std::vector<double> general = {-3, -1.5, -0.5, -0.1, 0, 0.3, 1, 2.5};
  const std::vector<double> positive = {0.01, 0.1, 0.5, 1, 2, 3, 7, 10};
  const std::vector<double> halves = {0.5,  1.5, 2.5,  -0.5,
                                      -1.5, 2.4, -2.6, 3.5};
  auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  struct Case {
    const char *name;
    const std::vector<double> *inputs;
    std::function<double(double)> ref;
  };
  const std::vector<Case> cases = {
      {"identity", &general, [](double x) { return x; }},
      {"neg", &general, [](double x) { return -x; }},
      {"abs", &general, [](double x) { return std::fabs(x); }},
      {"exp", &general, [](double x) { return std::exp(x); }},
      {"log", &positive, [](double x) { return std::log(x); }},
      {"sqrt", &positive, [](double x) { return std::sqrt(x); }},
      {"rsqrt", &positive, [](double x) { return 1 / std::sqrt(x); }},
      {"reciprocal", &positive, [](double x) { return 1 / x; }},
      {"tanh", &general, [](double x) { return std::tanh(x); }},
      {"sigmoid", &general, sigmoid},
      {"relu", &general, [](double x) { return x > 0 ? x : 0; }},
      {"gelu", &general,
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {"gelu_tanh", &general,
       [](double x) {
         return 0.5 * x *
                (1 +
                 std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
       }},
      {"silu", &general, [&](double x) { return x * sigmoid(x); }},
      {"erf", &general, [](double x) { return std::erf(x); }},
      {"sin", &general, [](double x) { return std::sin(x); }},
      {"cos", &general, [](double x) { return std::cos(x); }},
      {"sign", &general,
       [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }},
      {"square", &general, [](double x) { return x * x; }},
      {"floor", &halves, [](double x) { return std::floor(x); }},
      {"ceil", &halves, [](double x) { return std::ceil(x); }},
      {"round", &halves, [](double x) { return std::nearbyint(x); }},
      {"trunc", &halves, [](double x) { return std::trunc(x); }},
      {"log1p", &positive, [](double x) { return std::log1p(x); }},
      {"expm1", &general, [](double x) { return std::expm1(x); }},
      {"logical_not", &general, [](double x) { return x == 0 ? 1.0 : 0.0; }},
  };
  for (const Case &c : cases) {
    INFO("func " << c.name);
    Tensor in = Tensor::of(DType::F32, {2, 4}, *c.inputs);
    Tensor out = Tensor::zeros(DType::F32, {2, 4});
    run(tileProgram({{"f32", {2, 4}}}, {{"f32", {2, 4}}},
                    R"({"op": "activation", "engine": "scalar", "func": ")" +
                        std::string(c.name) + R"(", "src": )" +
                        full(100, {2, 4}) + R"(, "dst": )" + full(200, {2, 4}) +
                        "}"),
        {&in}, {&out});
    for (size_t i = 0; i < in.size(); ++i) {
      INFO("x = " << in.at(i) << ", got " << out.at(i));
      CHECK(close(out.at(i), c.ref(in.at(i)), 4e-6, 1e-6));
    }
  }
}

TEST_CASE("gelu is the erf form, gelu_tanh the tanh approximation",
          "[exec][activation]") {
  Tensor in = Tensor::of(DType::F32, {1, 1}, {1.0});
  Tensor exact = Tensor::zeros(DType::F32, {1, 1});
  Tensor approx = Tensor::zeros(DType::F32, {1, 1});
  std::string body = R"({"op": "activation", "engine": "scalar",
      "func": "gelu", "src": )" +
                     full(100, {1, 1}) + R"(, "dst": )" + full(200, {1, 1}) +
                     R"(}, {"op": "activation", "engine": "scalar",
      "func": "gelu_tanh", "src": )" +
                     full(100, {1, 1}) + R"(, "dst": )" + full(201, {1, 1}) +
                     "}";
  run(tileProgram({{"f32", {1, 1}}}, {{"f32", {1, 1}}, {"f32", {1, 1}}}, body),
      {&in}, {&exact, &approx});
  CHECK(close(exact.at(0), 0.8413447460685429, 1e-6));
  CHECK(close(approx.at(0), 0.8411919906082768, 1e-6));
}

TEST_CASE("activation applies scale, per-partition bias and bias_imm",
          "[exec][activation]") {
  Tensor in =
      Tensor::of(DType::F32, {3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor bias = Tensor::of(DType::F32, {3, 1}, {100, -100, 0.5});
  Tensor out = Tensor::zeros(DType::BF16, {3, 4});
  run(tileProgram({{"f32", {3, 4}}, {"f32", {3, 1}}}, {{"bf16", {3, 4}}},
                  R"({"op": "activation", "engine": "scalar",
                      "func": "identity", "scale": -2, "bias_imm": 0.25,
                      "src": )" +
                      full(100, {3, 4}) + R"(, "bias": )" + full(101, {3, 1}) +
                      R"(, "dst": )" + full(200, {3, 4}) + "}"),
      {&in, &bias}, {&out});
  for (int p = 0; p < 3; ++p)
    for (int f = 0; f < 4; ++f) {
      float expected = -2.0f * in.at(p * 4 + f) + bias.at(p) + 0.25f;
      CHECK(out.raw<uint16_t>(p * 4 + f) == f32ToBf16Bits(expected));
    }
  // exp(0.5 x + 1) without a bias operand.
  Tensor expOut = Tensor::zeros(DType::F32, {3, 4});
  run(tileProgram({{"f32", {3, 4}}}, {{"f32", {3, 4}}},
                  R"({"op": "activation", "engine": "scalar", "func": "exp",
                      "scale": 0.5, "bias_imm": 1, "src": )" +
                      full(100, {3, 4}) + R"(, "dst": )" + full(200, {3, 4}) +
                      "}"),
      {&in}, {&expOut});
  for (size_t i = 0; i < 12; ++i)
    CHECK(close(expOut.at(i), std::exp(0.5 * in.at(i) + 1), 4e-6));
}

TEST_CASE("activation scales by a per-partition column times scale",
          "[exec][activation]") {
  Tensor in = Tensor::of(DType::F32, {3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor scales = Tensor::of(DType::F32, {3, 1}, {2, -4, 0});
  Tensor bias = Tensor::of(DType::F32, {3, 1}, {10, 20, 30});
  Tensor out = Tensor::zeros(DType::F32, {3, 2});
  run(tileProgram({{"f32", {3, 2}}, {"f32", {3, 1}}, {"f32", {3, 1}}},
                  {{"f32", {3, 2}}},
                  R"({"op": "activation", "engine": "scalar",
                      "func": "identity", "scale": 0.5, "bias_imm": 1,
                      "src": )" +
                      full(100, {3, 2}) + R"(, "scale_col": )" +
                      full(101, {3, 1}) + R"(, "bias": )" + full(102, {3, 1}) +
                      R"(, "dst": )" + full(200, {3, 2}) + "}"),
      {&in, &scales, &bias}, {&out});
  // x * (scale_col[p] * 0.5) + bias[p] + 1.
  CHECK(out.at(0) == 1 * 1.0f + 11);
  CHECK(out.at(1) == 2 * 1.0f + 11);
  CHECK(out.at(2) == 3 * -2.0f + 21);
  CHECK(out.at(3) == 4 * -2.0f + 21);
  CHECK(out.at(4) == 31);
  CHECK(out.at(5) == 31);
}

TEST_CASE("large activations split their rows between threads",
          "[exec][activation]") {
  // [128, 512]: past the size where the executor splits an activation's
  // rows. exp(x * scale_col[p] * 0.5 + bias[p]) with row sums, then tanh in
  // place.
  const int64_t p = 128, f = 512;
  std::mt19937 rng(13);
  std::uniform_real_distribution<double> dist(-2, 2);
  std::vector<double> values(p * f), scaleValues(p), biasValues(p);
  for (double &v : values)
    v = dist(rng);
  for (int64_t i = 0; i < p; ++i) {
    scaleValues[i] = dist(rng);
    biasValues[i] = dist(rng);
  }
  Tensor in = Tensor::of(DType::F32, {p, f}, values);
  Tensor scales = Tensor::of(DType::F32, {p, 1}, scaleValues);
  Tensor bias = Tensor::of(DType::F32, {p, 1}, biasValues);
  Tensor out = Tensor::zeros(DType::F32, {p, f});
  Tensor sums = Tensor::zeros(DType::F32, {p, 1});
  std::string body =
      R"({"op": "activation", "engine": "scalar", "func": "exp",
          "scale": 0.5, "src": )" +
      full(100, {p, f}) + R"(, "scale_col": )" + full(101, {p, 1}) +
      R"(, "bias": )" + full(102, {p, 1}) + R"(, "dst": )" + full(200, {p, f}) +
      R"(, "reduce_res": )" + full(201, {p, 1}) +
      R"(}, {"op": "activation", "engine": "scalar", "func": "tanh", "src": )" +
      full(200, {p, f}) + R"(, "dst": )" + full(200, {p, f}) + "}";
  run(tileProgram({{"f32", {p, f}}, {"f32", {p, 1}}, {"f32", {p, 1}}},
                  {{"f32", {p, f}}, {"f32", {p, 1}}}, body),
      {&in, &scales, &bias}, {&out, &sums});
  for (int64_t row = 0; row < p; ++row) {
    double rowSum = 0;
    for (int64_t col = 0; col < f; ++col) {
      double e = std::exp(double(in.at(row * f + col)) *
                              (double(scales.at(row)) * 0.5) +
                          double(bias.at(row)));
      rowSum += e;
      REQUIRE(close(out.at(row * f + col), std::tanh(e), 1e-5, 1e-6));
    }
    REQUIRE(close(sums.at(row), rowSum, 1e-5, 1e-5));
  }
}

TEST_CASE("activation writes fp32 row sums of its results to reduce_res",
          "[exec][activation]") {
  // 1 + 2^-8 rounds to 1 in bf16 (ties to even), so sums of the rounded
  // results would lose what the fp32 sums keep.
  const double eps = 1.0 / 256;
  std::vector<double> values = {1 + eps, 1 + eps, 1 + eps, 1 + eps,
                                2,       -1,      0.5,     0.25,
                                -3,      3,       -3,      3 + 2 * eps};
  Tensor in = Tensor::of(DType::F32, {3, 4}, values);
  Tensor out = Tensor::zeros(DType::BF16, {3, 4});
  Tensor sums = Tensor::zeros(DType::F32, {3, 1});
  Tensor expSums = Tensor::zeros(DType::F32, {3, 1});
  // The row sums overwrite their tile: it holds 1000 before each
  // activation.
  std::string body =
      R"({"op": "memset", "engine": "gpsimd", "value": 1000, "dst": )" +
      full(201, {3, 1}) + R"(},
      {"op": "activation", "engine": "scalar", "func": "identity", "src": )" +
      full(100, {3, 4}) + R"(, "dst": )" + full(200, {3, 4}) +
      R"(, "reduce_res": )" + full(201, {3, 1}) + R"(},
      {"op": "memset", "engine": "vector", "value": 1000, "dst": )" +
      full(202, {3, 1}) + R"(},
      {"op": "activation", "engine": "scalar", "func": "exp",
       "scale": -1, "src": )" +
      full(100, {3, 4}) + R"(, "dst": )" + full(203, {3, 4}) +
      R"(, "reduce_res": )" + full(202, {3, 1}) + "}";
  Tensor expOut = Tensor::zeros(DType::BF16, {3, 4});
  run(tileProgram({{"f32", {3, 4}}},
                  {{"bf16", {3, 4}},
                   {"f32", {3, 1}},
                   {"f32", {3, 1}},
                   {"bf16", {3, 4}}},
                  body),
      {&in}, {&out, &sums, &expSums, &expOut});
  for (int p = 0; p < 3; ++p) {
    double sum = 0, expSum = 0;
    for (int f = 0; f < 4; ++f) {
      float x = in.at(p * 4 + f);
      CHECK(out.raw<uint16_t>(p * 4 + f) == f32ToBf16Bits(x));
      sum += x;
      expSum += std::exp(-static_cast<double>(x));
      CHECK(expOut.raw<uint16_t>(p * 4 + f) == f32ToBf16Bits(std::exp(-x)));
    }
    INFO("partition " << p);
    CHECK(sums.at(p) == static_cast<float>(sum));
    CHECK(close(expSums.at(p), expSum, 1e-6));
  }
  CHECK(sums.at(0) == static_cast<float>(4 + 4 * eps));
  CHECK(sums.at(2) == static_cast<float>(2 * eps));
}

//===----------------------------------------------------------------------===//
// VectorE / GpSimd
//===----------------------------------------------------------------------===//

namespace {

/// Runs tensor_scalar on src [P, F] with either a [P, 1] scalar tile or imm.
std::vector<float> tensorScalar(const std::string &op, bool reverse,
                                const std::vector<double> &src, int64_t p,
                                const std::vector<double> *scalar, double imm,
                                const std::string &engine = "vector") {
  int64_t f = static_cast<int64_t>(src.size()) / p;
  Tensor in = Tensor::of(DType::F32, {p, f}, src);
  Tensor out = Tensor::zeros(DType::F32, {p, f});
  std::string node = R"({"op": "tensor_scalar", "engine": ")" + engine +
                     R"(", "alu_op": ")" + op + R"(", "reverse": )" +
                     (reverse ? "true" : "false") + R"(, "src": )" +
                     full(100, {p, f}) + R"(, "dst": )" + full(200, {p, f});
  std::vector<TileArg> ins = {{"f32", {p, f}}};
  Tensor s;
  std::vector<Tensor *> inPtrs = {&in};
  if (scalar) {
    s = Tensor::of(DType::F32, {p, 1}, *scalar);
    ins.push_back({"f32", {p, 1}});
    inPtrs.push_back(&s);
    node += R"(, "scalar": )" + full(101, {p, 1});
  } else {
    node += R"(, "imm": )" + std::to_string(imm);
  }
  node += "}";
  run(tileProgram(ins, {{"f32", {p, f}}}, node), inPtrs, {&out});
  std::vector<float> result;
  for (size_t i = 0; i < out.size(); ++i)
    result.push_back(out.at(i));
  return result;
}

} // namespace

TEST_CASE("tensor_scalar with a [P, 1] scalar and reverse", "[exec][alu]") {
  std::vector<double> src = {1, 2, 3, 4, 5, 6};
  std::vector<double> scalar = {10, 100};
  CHECK(tensorScalar("subtract", false, src, 2, &scalar, 0) ==
        std::vector<float>{-9, -8, -7, -96, -95, -94});
  CHECK(tensorScalar("subtract", true, src, 2, &scalar, 0) ==
        std::vector<float>{9, 8, 7, 96, 95, 94});
  CHECK(tensorScalar("divide", true, src, 2, &scalar, 0, "gpsimd") ==
        std::vector<float>{10, 5, 10.0f / 3, 25, 20, 100.0f / 6});
  CHECK(tensorScalar("multiply", false, src, 2, nullptr, 0.5, "scalar") ==
        std::vector<float>{0.5, 1, 1.5, 2, 2.5, 3});
  CHECK(tensorScalar("pow", false, src, 2, nullptr, 2) ==
        std::vector<float>{1, 4, 9, 16, 25, 36});
  CHECK(tensorScalar("pow", true, {1, 2, 3, 0}, 1, nullptr, 2) ==
        std::vector<float>{2, 4, 8, 1});
  // fmod keeps the dividend's sign; Python's % the divisor's.
  CHECK(tensorScalar("mod", false, {-7, 7, -6, 5.5}, 1, nullptr, 3) ==
        std::vector<float>{-1, 1, -0.0f, 2.5});
  CHECK(tensorScalar("remainder", false, {-7, 7, -6, 5.5}, 1, nullptr, 3) ==
        std::vector<float>{2, 1, 0, 2.5});
  CHECK(tensorScalar("remainder", false, {-7, 7, 6, 5.5}, 1, nullptr, -3) ==
        std::vector<float>{-1, -2, 0, -0.5});
  CHECK(tensorScalar("lt", false, {1, 2, 3, 4}, 1, nullptr, 2.5) ==
        std::vector<float>{1, 1, 0, 0});
  CHECK(tensorScalar("ge", true, {1, 2, 3, 4}, 1, nullptr, 2) ==
        std::vector<float>{1, 1, 0, 0});
  CHECK(tensorScalar("logical_and", false, {0, 2, 3, 0}, 1, nullptr, 0) ==
        std::vector<float>{0, 0, 0, 0});
  CHECK(tensorScalar("logical_or", false, {0, 2, -3, 0}, 1, nullptr, 0) ==
        std::vector<float>{0, 1, 1, 0});
  CHECK(tensorScalar("max", false, {-1, 2, -3, 4}, 1, nullptr, 0) ==
        std::vector<float>{0, 2, 0, 4});
  CHECK(tensorScalar("bypass", false, {-1, 2, -3, 4}, 1, nullptr, 9) ==
        std::vector<float>{-1, 2, -3, 4});
  CHECK(tensorScalar("bypass", true, {-1, 2, -3, 4}, 1, nullptr, 9) ==
        std::vector<float>{9, 9, 9, 9});
}

TEST_CASE("tensor_tensor ops", "[exec][alu]") {
  std::vector<double> a = {1, -2, 3.5, 0, kNaN, 6, -7, 8};
  std::vector<double> b = {2, 2, -1.5, 0, 1, 0, 3, 8};
  struct Case {
    const char *op;
    std::function<double(double, double)> ref;
  };
  const std::vector<Case> cases = {
      {"add", [](double x, double y) { return x + y; }},
      {"subtract", [](double x, double y) { return x - y; }},
      {"multiply", [](double x, double y) { return x * y; }},
      {"divide", [](double x, double y) { return float(x) / float(y); }},
      {"max",
       [](double x, double y) {
         return std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y);
       }},
      {"min",
       [](double x, double y) {
         return std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y);
       }},
      {"eq", [](double x, double y) { return x == y ? 1.0 : 0.0; }},
      {"ne", [](double x, double y) { return x != y ? 1.0 : 0.0; }},
      {"le", [](double x, double y) { return x <= y ? 1.0 : 0.0; }},
      {"gt", [](double x, double y) { return x > y ? 1.0 : 0.0; }},
      {"logical_xor",
       [](double x, double y) { return (x != 0) != (y != 0) ? 1.0 : 0.0; }},
      {"bypass", [](double x, double) { return x; }},
  };
  for (const Case &c : cases) {
    INFO("op " << c.op);
    Tensor ta = Tensor::of(DType::F32, {2, 4}, a);
    Tensor tb = Tensor::of(DType::F32, {2, 4}, b);
    Tensor out = Tensor::zeros(DType::F32, {2, 4});
    run(tileProgram({{"f32", {2, 4}}, {"f32", {2, 4}}}, {{"f32", {2, 4}}},
                    R"({"op": "tensor_tensor", "engine": "vector",
                        "alu_op": ")" +
                        std::string(c.op) + R"(", "a": )" + full(100, {2, 4}) +
                        R"(, "b": )" + full(101, {2, 4}) + R"(, "dst": )" +
                        full(200, {2, 4}) + "}"),
        {&ta, &tb}, {&out});
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("a = " << a[i] << ", b = " << b[i] << ", got " << out.at(i));
      CHECK(close(out.at(i), c.ref(ta.at(i), tb.at(i)), 1e-7, 0));
    }
  }
}

namespace {

/// Runs scalar_tensor_tensor on a and b [P, F] with either a [P, 1] scalar
/// tile or imm, into a dst of `dstType`.
Tensor scalarTensorTensor(const std::string &op0, const std::string &op1,
                          const std::vector<double> &a,
                          const std::vector<double> &b, int64_t p,
                          const std::vector<double> *scalar, double imm,
                          const std::string &engine = "vector",
                          DType dstType = DType::F32) {
  int64_t f = static_cast<int64_t>(a.size()) / p;
  Tensor ta = Tensor::of(DType::F32, {p, f}, a);
  Tensor tb = Tensor::of(DType::F32, {p, f}, b);
  Tensor out = Tensor::zeros(dstType, {p, f});
  std::string node = R"({"op": "scalar_tensor_tensor", "engine": ")" + engine +
                     R"(", "alu_op0": ")" + op0 + R"(", "alu_op1": ")" + op1 +
                     R"(", "a": )" + full(100, {p, f}) + R"(, "b": )" +
                     full(101, {p, f}) + R"(, "dst": )" + full(200, {p, f});
  std::vector<TileArg> ins = {{"f32", {p, f}}, {"f32", {p, f}}};
  std::vector<Tensor *> inPtrs = {&ta, &tb};
  Tensor s;
  if (scalar) {
    s = Tensor::of(DType::F32, {p, 1}, *scalar);
    ins.push_back({"f32", {p, 1}});
    inPtrs.push_back(&s);
    node += R"(, "scalar": )" + full(102, {p, 1});
  } else {
    node += R"(, "imm": )" + std::to_string(imm);
  }
  node += "}";
  run(tileProgram(ins, {{dtypeName(dstType), {p, f}}}, node), inPtrs, {&out});
  return out;
}

std::vector<float> values(const Tensor &t) {
  std::vector<float> out;
  for (size_t i = 0; i < t.size(); ++i)
    out.push_back(t.at(i));
  return out;
}

} // namespace

TEST_CASE("scalar_tensor_tensor computes (a op0 s) op1 b", "[exec][alu][stt]") {
  std::vector<double> a = {1, 2, 3, 4, 5, 6};
  std::vector<double> b = {10, 20, 30, -1, -2, -3};
  std::vector<double> column = {1, 10};
  // A [P, 1] column: (a - s[p]) * b.
  CHECK(
      values(scalarTensorTensor("subtract", "multiply", a, b, 2, &column, 0)) ==
      std::vector<float>{0, 20, 60, 6, 10, 12});
  // An immediate: (a * 0.5) + b, on GpSimd.
  CHECK(values(scalarTensorTensor("multiply", "add", a, b, 2, nullptr, 0.5,
                                  "gpsimd")) ==
        std::vector<float>{10.5, 21, 31.5, 1, 0.5, 0});
  // A comparison as op0 makes a mask: (a > s[p]) * b.
  CHECK(values(scalarTensorTensor("gt", "multiply", a, b, 2, &column, 0)) ==
        std::vector<float>{0, 20, 30, 0, 0, 0});
  // op1 may be any ALU op, here max(a - 3, b).
  CHECK(values(scalarTensorTensor("subtract", "max", a, b, 2, nullptr, 3)) ==
        std::vector<float>{10, 20, 30, 1, 2, 3});
}

TEST_CASE("scalar_tensor_tensor keeps its intermediate in fp32",
          "[exec][alu][stt]") {
  // (1 + 2^-8) * 1 - 1 = 2^-8, which bf16 holds; had the intermediate been
  // rounded to bf16 (to 1) the result would be 0.
  const double eps = 1.0 / 256;
  std::vector<double> a = {1 + eps, 1 + eps}, b = {1, 1};
  Tensor out = scalarTensorTensor("multiply", "subtract", a, b, 1, nullptr, 1,
                                  "vector", DType::BF16);
  CHECK(out.at(0) == static_cast<float>(eps));
  CHECK(out.at(1) == static_cast<float>(eps));
  // With a column the result is rounded once, to the destination dtype:
  // 1 + 0 + 3 * 2^-9 is 1 + 2^-7 in bf16.
  std::vector<double> zero = {0};
  Tensor rounded = scalarTensorTensor("add", "add", {1}, {3 * eps / 2}, 1,
                                      &zero, 0, "vector", DType::BF16);
  CHECK(rounded.at(0) == 1 + 2 * static_cast<float>(eps));
}

TEST_CASE("bn_stats and bn_aggr give each row's mean and variance",
          "[exec][reduce]") {
  // 3 rows of 7: bn_stats of the whole row (4 even, 3 odd elements) and of
  // its first 2 (1 and 1) side by side; bn_aggr of the first triple alone
  // ([3, 3] view) and of all four.
  std::vector<double> values;
  for (int i = 0; i < 21; ++i)
    values.push_back(std::sin(i * 1.7) * 3 + i % 4 + 100);
  Tensor in = Tensor::of(DType::F32, {3, 7}, values);
  Tensor stats = Tensor::zeros(DType::F32, {3, 12});
  Tensor first = Tensor::zeros(DType::F32, {3, 2});
  Tensor all = Tensor::zeros(DType::F32, {3, 2});
  std::string body =
      R"({"op": "bn_stats", "engine": "vector", "src": )" + full(100, {3, 7}) +
      R"(, "dst": )" + view(200, "[3, 6]", "[12, 1]") +
      R"(}, {"op": "bn_stats", "engine": "vector", "src": )" +
      view(100, "[3, 2]", "[7, 1]") + R"(, "dst": )" +
      view(200, "[3, 6]", "[12, 1]", 6) +
      R"(}, {"op": "bn_aggr", "engine": "vector", "src": )" +
      view(200, "[3, 3]", "[12, 1]") + R"(, "dst": )" + full(201, {3, 2}) +
      R"(}, {"op": "bn_aggr", "engine": "vector", "src": )" +
      full(200, {3, 12}) + R"(, "dst": )" + full(202, {3, 2}) + "}";
  run(tileProgram({{"f32", {3, 7}}},
                  {{"f32", {3, 12}}, {"f32", {3, 2}}, {"f32", {3, 2}}}, body),
      {&in}, {&stats, &first, &all});
  auto moments = [](const std::vector<double> &x) {
    double mean = 0, m2 = 0;
    for (double v : x)
      mean += v / static_cast<double>(x.size());
    for (double v : x)
      m2 += (v - mean) * (v - mean);
    return std::pair{mean, m2};
  };
  for (int p = 0; p < 3; ++p) {
    INFO("partition " << p);
    std::vector<double> row, even, odd;
    for (int f = 0; f < 7; ++f) {
      row.push_back(in.at(p * 7 + f));
      (f % 2 ? odd : even).push_back(row.back());
    }
    auto [evenMean, evenM2] = moments(even);
    auto [oddMean, oddM2] = moments(odd);
    CHECK(stats.at(p * 12 + 0) == 4);
    CHECK(close(stats.at(p * 12 + 1), evenMean, 1e-6));
    CHECK(close(stats.at(p * 12 + 2), evenM2, 1e-4));
    CHECK(stats.at(p * 12 + 3) == 3);
    CHECK(close(stats.at(p * 12 + 4), oddMean, 1e-6));
    CHECK(close(stats.at(p * 12 + 5), oddM2, 1e-4));
    // The 2-element chunk: one element per half, no deviation.
    CHECK(stats.at(p * 12 + 6) == 1);
    CHECK(stats.at(p * 12 + 7) == static_cast<float>(row[0]));
    CHECK(stats.at(p * 12 + 8) == 0);
    CHECK(close(first.at(p * 2), evenMean, 1e-6));
    CHECK(close(first.at(p * 2 + 1), evenM2 / 4, 1e-4));
    // All four triples: the row counted with its first two elements twice.
    std::vector<double> twice = row;
    twice.push_back(row[0]);
    twice.push_back(row[1]);
    auto [mean, m2] = moments(twice);
    CHECK(close(all.at(p * 2), mean, 1e-6));
    CHECK(close(all.at(p * 2 + 1), m2 / 9, 1e-4));
  }
}

TEST_CASE("tensor_reduce over all free elements", "[exec][reduce]") {
  // src is [3, 2, 4] per partition; a second view reads every other element.
  std::vector<double> values;
  for (int i = 0; i < 24; ++i)
    values.push_back(i % 5 - 1.5);
  values[9] = kNaN;
  Tensor in = Tensor::of(DType::F32, {3, 8}, values);
  auto reduce = [&](const std::string &op, const std::string &srcView) {
    Tensor out = Tensor::zeros(DType::F32, {3, 1});
    run(tileProgram({{"f32", {3, 8}}}, {{"f32", {3, 1}}},
                    R"({"op": "tensor_reduce", "engine": "vector",
                        "alu_op": ")" +
                        op + R"(", "src": )" + srcView + R"(, "dst": )" +
                        full(200, {3, 1}) + "}"),
        {&in}, {&out});
    return out;
  };
  std::string all = view(100, "[3, 2, 4]", "[8, 4, 1]");
  std::string evens = view(100, "[3, 4]", "[8, 2]");
  for (int p = 0; p < 3; ++p) {
    double sum = 0, prod = 1, mx = -INFINITY, mn = INFINITY, evenSum = 0;
    bool nan = false;
    for (int f = 0; f < 8; ++f) {
      double v = in.at(p * 8 + f);
      nan |= std::isnan(v);
      sum += v;
      prod *= v;
      mx = std::max(mx, v);
      mn = std::min(mn, v);
      if (f % 2 == 0)
        evenSum += v;
    }
    INFO("partition " << p);
    CHECK(close(reduce("add", all).at(p), sum));
    CHECK(close(reduce("multiply", all).at(p), prod));
    CHECK(close(reduce("mul", all).at(p), prod)); // the format's spelling
    CHECK(close(reduce("max", all).at(p), nan ? NAN : mx));
    CHECK(close(reduce("min", all).at(p), nan ? NAN : mn));
    CHECK(close(reduce("add", evens).at(p), evenSum));
  }
}

TEST_CASE("select picks by predicate", "[exec][select]") {
  Tensor pred = Tensor::of(DType::U8, {2, 3}, {0, 1, 2, 0, 0, 255});
  Tensor onTrue = Tensor::of(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor onFalse = Tensor::of(DType::BF16, {2, 3}, {-1, -2, -3, -4, -5, -6});
  Tensor out = Tensor::zeros(DType::F32, {2, 3});
  run(tileProgram({{"u8", {2, 3}}, {"f32", {2, 3}}, {"bf16", {2, 3}}},
                  {{"f32", {2, 3}}},
                  R"({"op": "select", "engine": "gpsimd", "pred": )" +
                      full(100, {2, 3}) + R"(, "on_true": )" +
                      full(101, {2, 3}) + R"(, "on_false": )" +
                      full(102, {2, 3}) + R"(, "dst": )" + full(200, {2, 3}) +
                      "}"),
      {&pred, &onTrue, &onFalse}, {&out});
  std::vector<float> expected = {-1, 2, 3, -4, -5, 6};
  for (size_t i = 0; i < 6; ++i)
    CHECK(out.at(i) == expected[i]);
}

TEST_CASE("iota fills base + p * channel + sum(i_k * m_k)", "[exec][iota]") {
  Tensor i32 = Tensor::zeros(DType::I32, {4, 2, 3});
  Tensor f32 = Tensor::zeros(DType::F32, {4, 6});
  Tensor i64 = Tensor::zeros(DType::I64, {4, 1});
  std::string body =
      R"({"op": "iota", "engine": "gpsimd", "base": 1,
          "channel_multiplier": 100, "multipliers": [10, 1], "dst": )" +
      full(200, {4, 2, 3}) +
      R"(}, {"op": "iota", "engine": "gpsimd", "base": -1,
          "channel_multiplier": 0.25, "multipliers": [0.5], "dst": )" +
      full(201, {4, 6}) +
      R"(}, {"op": "iota", "engine": "gpsimd", "base": 1099511627776,
          "channel_multiplier": 1, "multipliers": [1], "dst": )" +
      full(202, {4, 1}) + "}";
  run(tileProgram({}, {{"i32", {4, 2, 3}}, {"f32", {4, 6}}, {"i64", {4, 1}}},
                  body),
      {}, {&i32, &f32, &i64});
  for (int p = 0; p < 4; ++p) {
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        CHECK(i32.raw<int32_t>(p * 6 + i * 3 + j) == 1 + 100 * p + 10 * i + j);
    for (int e = 0; e < 6; ++e)
      CHECK(f32.at(p * 6 + e) == -1.0f + 0.25f * p + 0.5f * e);
    // Exact beyond fp32's 24-bit mantissa.
    CHECK(i64.raw<int64_t>(p) == (int64_t(1) << 40) + p);
  }
}

TEST_CASE("Philox4x32-10 matches the Random123 known answers", "[exec][rand]") {
  // kat_vectors of Random123: counter, key -> output.
  CHECK(philox4x32({0, 0, 0, 0}, {0, 0}) ==
        PhiloxBlock{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}) ==
        PhiloxBlock{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                   {0xa4093822, 0x299f31d0}) ==
        PhiloxBlock{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
  // The uniform is the first word's top 24 bits over 2^24.
  CHECK(philoxUniform(0, 0, 0, 0) == float(0x6627e8d5u >> 8) / 16777216.0f);
}

TEST_CASE("rand numbers element p * channel + sum(i_k * m_k) under each "
          "partition's seed",
          "[exec][rand]") {
  // Partitions get different keys; stream 7 is the counter's third word.
  std::vector<double> keys = {1, 2, -3, 4, 5, 2147483647, 0, -1};
  Tensor seed = Tensor::of(DType::I32, {4, 2}, keys);
  Tensor out = Tensor::zeros(DType::F32, {4, 2, 3});
  Tensor narrow = Tensor::zeros(DType::BF16, {4, 6});
  std::string body =
      R"({"op": "rand", "engine": "gpsimd", "stream": 7,
          "channel_multiplier": 6, "multipliers": [3, 1], "seed": )" +
      full(100, {4, 2}) + R"(, "dst": )" + full(200, {4, 2, 3}) +
      R"(}, {"op": "rand", "engine": "gpsimd", "stream": 7,
          "channel_multiplier": 6, "multipliers": [1], "seed": )" +
      full(100, {4, 2}) + R"(, "dst": )" + full(201, {4, 6}) + "}";
  run(tileProgram({{"i32", {4, 2}}}, {{"f32", {4, 2, 3}}, {"bf16", {4, 6}}},
                  body),
      {&seed}, {&out, &narrow});
  float lo = 1, hi = 0;
  for (int p = 0; p < 4; ++p)
    for (int e = 0; e < 6; ++e) {
      float want = philoxUniform(
          static_cast<uint32_t>(int32_t(keys[2 * p])),
          static_cast<uint32_t>(int32_t(keys[2 * p + 1])), p * 6 + e, 7);
      CHECK(out.at(p * 6 + e) == want);
      // Stored with the destination's rounding (round to nearest even).
      CHECK(narrow.at(p * 6 + e) ==
            loadAsF32(Tensor::of(DType::BF16, {1}, {want}).bytes.data(),
                      DType::BF16));
      lo = std::min(lo, want);
      hi = std::max(hi, want);
    }
  CHECK(lo >= 0.0f);
  CHECK(hi < 1.0f);
  CHECK(hi - lo > 0.5f); // 24 numbers spread over [0, 1)
}

TEST_CASE("rand is a function of the element's number, not of the tiling",
          "[exec][rand]") {
  // A [4, 8] block in one instruction, and the same numbers as two [4, 4]
  // column blocks of a loop whose offset moves by 4 per iteration.
  Tensor seed = Tensor::of(DType::I32, {4, 2}, {9, 8, 9, 8, 9, 8, 9, 8});
  Tensor whole = Tensor::zeros(DType::F32, {4, 8});
  Tensor tiled = Tensor::zeros(DType::F32, {4, 8});
  std::string buffers = buffer(0, "hbm", "input", "i32", "[4, 2]") + "," +
                        buffer(1, "hbm", "output", "f32", "[4, 8]") + "," +
                        buffer(2, "hbm", "output", "f32", "[4, 8]") + "," +
                        buffer(3, "sbuf", "scratch", "i32", "[4, 2]") + "," +
                        buffer(4, "sbuf", "scratch", "f32", "[4, 8]") + "," +
                        buffer(5, "sbuf", "scratch", "f32", "[4, 4]");
  std::string body =
      R"({"op": "dma_copy", "engine": "sync", "src": )" + full(0, {4, 2}) +
      R"(, "dst": )" + full(3, {4, 2}) +
      R"(}, {"op": "rand", "engine": "gpsimd", "channel_multiplier": 8,
          "multipliers": [1], "seed": )" +
      full(3, {4, 2}) + R"(, "dst": )" + full(4, {4, 8}) +
      R"(}, {"op": "dma_copy", "engine": "sync", "src": )" + full(4, {4, 8}) +
      R"(, "dst": )" + full(1, {4, 8}) +
      R"(}, {"loop": 0, "count": 2, "body": [
           {"op": "rand", "engine": "gpsimd", "channel_multiplier": 8,
            "multipliers": [1], "offset": {"const": 0, "terms": [[0, 4]]},
            "seed": )" +
      full(3, {4, 2}) + R"(, "dst": )" + full(5, {4, 4}) +
      R"(}, {"op": "dma_copy", "engine": "sync", "src": )" + full(5, {4, 4}) +
      R"(, "dst": )" + view(2, "[4, 4]", "[8, 1]", 0, "[[0, 4]]") + "}]}";
  run(programJson(buffers, "0", "1, 2", body), {&seed}, {&whole, &tiled});
  for (size_t i = 0; i < 32; ++i) {
    CHECK(tiled.at(i) == whole.at(i));
    CHECK(whole.at(i) == philoxUniform(9, 8, i, 0));
  }
}

TEST_CASE("iota's offset takes each loop iteration's value", "[exec][iota]") {
  // Loop 0 writes column block j of a [4, 24] output: element (p, j * 8 + i)
  // = 1 + 5 + 8 j + 100 p + i. A nested loop pair adds two terms.
  Tensor out = Tensor::zeros(DType::I32, {4, 24});
  Tensor nested = Tensor::zeros(DType::F32, {2, 3});
  std::string buffers = buffer(0, "hbm", "output", "i32", "[4, 24]") + "," +
                        buffer(1, "hbm", "output", "f32", "[2, 3]") + "," +
                        buffer(2, "sbuf", "scratch", "i32", "[4, 8]") + "," +
                        buffer(3, "sbuf", "scratch", "f32", "[1, 1]");
  std::string body =
      R"({"loop": 0, "count": 3, "body": [
           {"op": "iota", "engine": "gpsimd", "base": 1,
            "channel_multiplier": 100, "multipliers": [1],
            "offset": {"const": 5, "terms": [[0, 8]]}, "dst": )" +
      full(2, {4, 8}) + R"(},
           {"op": "dma_copy", "engine": "sync", "src": )" +
      full(2, {4, 8}) + R"(, "dst": )" +
      view(0, "[4, 8]", "[24, 1]", 0, "[[0, 8]]") + R"(}]},
         {"loop": 1, "count": 2, "body": [
           {"loop": 2, "count": 3, "body": [
             {"op": "iota", "engine": "gpsimd", "base": 0.5,
              "channel_multiplier": 0, "multipliers": [0],
              "offset": {"const": -3, "terms": [[1, 1000], [2, -10]]},
              "dst": )" +
      full(3, {1, 1}) + R"(},
             {"op": "dma_copy", "engine": "sync", "src": )" +
      full(3, {1, 1}) + R"(, "dst": )" +
      view(1, "[1, 1]", "[3, 1]", 0, "[[1, 3], [2, 1]]") + "}]}]}";
  run(programJson(buffers, "", "0, 1", body), {}, {&out, &nested});
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 8; ++i)
        CHECK(out.raw<int32_t>(p * 24 + j * 8 + i) == 6 + 8 * j + 100 * p + i);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 3; ++k)
      CHECK(nested.at(i * 3 + k) == 0.5f - 3 + 1000 * i - 10 * k);
}

TEST_CASE("memset stores the value rounded to the destination dtype",
          "[exec][memset]") {
  Tensor f32 = Tensor::zeros(DType::F32, {2, 4});
  Tensor bf16 = Tensor::zeros(DType::BF16, {2, 4});
  Tensor i64 = Tensor::zeros(DType::I64, {2, 4});
  Tensor u8 = Tensor::zeros(DType::U8, {2, 4});
  std::string body =
      R"({"op": "memset", "engine": "vector", "value": {"float": "-inf"},
          "dst": )" +
      full(200, {2, 4}) +
      R"(}, {"op": "memset", "engine": "vector", "value": 7,
          "dst": )" +
      view(200, "[2, 2]", "[4, 2]") +
      R"(}, {"op": "memset", "engine": "gpsimd", "value": 0.333333333333,
          "dst": )" +
      full(201, {2, 4}) +
      R"(}, {"op": "memset", "engine": "gpsimd", "value": 1099511627777,
          "dst": )" +
      full(202, {2, 4}) +
      R"(}, {"op": "memset", "engine": "vector", "value": 300,
          "dst": )" +
      full(203, {2, 4}) + "}";
  run(tileProgram(
          {},
          {{"f32", {2, 4}}, {"bf16", {2, 4}}, {"i64", {2, 4}}, {"u8", {2, 4}}},
          body),
      {}, {&f32, &bf16, &i64, &u8});
  for (int i = 0; i < 8; ++i) {
    CHECK(f32.at(i) == (i % 2 == 0 ? 7.0f : -kInf));
    CHECK(bf16.raw<uint16_t>(i) == f32ToBf16Bits(0.333333333333f));
    CHECK(i64.raw<int64_t>(i) == 1099511627777LL);
    CHECK(u8.raw<uint8_t>(i) == 255);
  }
}

TEST_CASE("copy converts dtypes with the store rules", "[exec][copy]") {
  std::vector<double> values = {3.9, -3.9, 1e10, kNaN, -0.0, 0.5, 300, -200};
  Tensor in = Tensor::of(DType::F32, {1, 8}, values);
  Tensor i32 = Tensor::zeros(DType::I32, {1, 8});
  Tensor b = Tensor::zeros(DType::Bool, {1, 8});
  Tensor u8 = Tensor::zeros(DType::U8, {1, 8});
  Tensor i8 = Tensor::zeros(DType::I8, {1, 8});
  std::string src = full(100, {1, 8});
  std::string body;
  for (int j = 0; j < 4; ++j)
    body += std::string(j ? ", " : "") +
            R"({"op": "copy", "engine": "vector", "src": )" + src +
            R"(, "dst": )" + full(200 + j, {1, 8}) + "}";
  run(tileProgram(
          {{"f32", {1, 8}}},
          {{"i32", {1, 8}}, {"bool", {1, 8}}, {"u8", {1, 8}}, {"i8", {1, 8}}},
          body),
      {&in}, {&i32, &b, &u8, &i8});
  std::vector<int32_t> expectI32 = {3, -3, 2147483647, 0, 0, 0, 300, -200};
  std::vector<uint8_t> expectBool = {1, 1, 1, 1, 0, 1, 1, 1};
  std::vector<uint8_t> expectU8 = {3, 0, 255, 0, 0, 0, 255, 0};
  std::vector<int8_t> expectI8 = {3, -3, 127, 0, 0, 0, 127, -128};
  for (int i = 0; i < 8; ++i) {
    INFO("element " << i);
    CHECK(i32.raw<int32_t>(i) == expectI32[i]);
    CHECK(b.raw<uint8_t>(i) == expectBool[i]);
    CHECK(u8.raw<uint8_t>(i) == expectU8[i]);
    CHECK(i8.raw<int8_t>(i) == expectI8[i]);
  }
}

//===----------------------------------------------------------------------===//
// Gather, constants, run() contract
//===----------------------------------------------------------------------===//

TEST_CASE("dma_gather reads rows by index and rejects bad indices",
          "[exec][gather]") {
  std::vector<double> rows;
  for (int i = 0; i < 24; ++i)
    rows.push_back(i + 0.5);
  Tensor table = Tensor::of(DType::BF16, {6, 4}, rows);
  Tensor indices = Tensor::of(DType::I64, {3, 1}, {5, 0, 2});
  Tensor out = Tensor::zeros(DType::F32, {3, 4});
  std::string json = programJson(
      buffer(0, "hbm", "input", "bf16", "[6, 4]") + "," +
          buffer(1, "hbm", "input", "i64", "[3, 1]") + "," +
          buffer(2, "hbm", "output", "f32", "[3, 4]") + "," +
          buffer(3, "sbuf", "scratch", "f32", "[3, 4]"),
      "0, 1", "2",
      R"({"op": "dma_gather", "engine": "gpsimd", "loc": 0, "table": )" +
          full(0, {6, 4}) + R"(, "indices": )" + full(1, {3, 1}) +
          R"(, "dst": )" + full(3, {3, 4}) +
          R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
          full(3, {3, 4}) + R"(, "dst": )" + full(2, {3, 4}) + "}",
      "trn2", R"(["embed.py:7"])");
  Executor executor(Program::parse(json), trn2());
  std::vector<HostTensor> ins = {table.host(), indices.host()};
  std::vector<HostTensor> outs = {out.host()};
  executor.run(ins, outs);
  std::vector<int> picked = {5, 0, 2};
  for (int p = 0; p < 3; ++p)
    for (int d = 0; d < 4; ++d)
      CHECK(out.at(p * 4 + d) == table.at(picked[p] * 4 + d));

  for (int64_t bad : {int64_t(6), int64_t(-1)}) {
    std::memcpy(indices.bytes.data() + 8, &bad, 8);
    std::string message = errorOf([&] { executor.run(ins, outs); });
    INFO(message);
    CHECK(contains(message, "index " + std::to_string(bad) +
                                " at partition 1 is out of range [0, 6)"));
    CHECK(contains(message, "embed.py:7"));
  }
  // The executor is still usable.
  int64_t good = 3;
  std::memcpy(indices.bytes.data() + 8, &good, 8);
  executor.run(ins, outs);
  CHECK(out.at(4) == table.at(12));
}

TEST_CASE("n_gather picks each partition's own elements and rejects bad "
          "indices",
          "[exec][gather]") {
  // Partition p holds 10p + 0..7 as a [2, 4] free block; dst [3, 5] is
  // src[p, idx[p, j]] over the flattened block, with repeats and any order.
  std::vector<double> values;
  for (int p = 0; p < 3; ++p)
    for (int i = 0; i < 8; ++i)
      values.push_back(10 * p + i);
  Tensor src = Tensor::of(DType::BF16, {3, 2, 4}, values);
  std::vector<double> picks = {7, 0, 3, 3, 5, 1, 1, 6, 2, 0, 4, 7, 7, 0, 2};
  Tensor indices = Tensor::of(DType::I32, {3, 5}, picks);
  Tensor out = Tensor::zeros(DType::BF16, {3, 5});
  std::string json = tileProgram(
      {{"bf16", {3, 2, 4}}, {"i32", {3, 5}}}, {{"bf16", {3, 5}}},
      R"({"op": "n_gather", "engine": "gpsimd", "src": )" +
          full(100, {3, 2, 4}) + R"(, "indices": )" + full(101, {3, 5}) +
          R"(, "dst": )" + full(200, {3, 5}) + "}");
  run(json, {&src, &indices}, {&out});
  for (int p = 0; p < 3; ++p)
    for (int j = 0; j < 5; ++j)
      CHECK(out.at(p * 5 + j) == 10 * p + picks[p * 5 + j]);

  for (int32_t bad : {8, -1}) {
    std::memcpy(indices.bytes.data() + 4 * 6, &bad, 4);
    std::string message = errorOf([&] { run(json, {&src, &indices}, {&out}); });
    INFO(message);
    CHECK(contains(message, "index " + std::to_string(bad) +
                                " at partition 1 is out of range [0, 8)"));
  }
}

TEST_CASE("dma_scatter writes or adds rows by index", "[exec][gather]") {
  // dst starts as the input table; rows 4 and 1 are written, row 4 twice:
  // the last write wins, or with accumulate both add (rounded to bf16 per
  // row, as eager PyTorch's sequential index_put does).
  std::vector<double> start;
  for (int i = 0; i < 12; ++i)
    start.push_back(i);
  Tensor table = Tensor::of(DType::BF16, {6, 2}, start);
  Tensor indices = Tensor::of(DType::I32, {3, 1}, {4, 1, 4});
  Tensor values = Tensor::of(DType::BF16, {3, 2}, {256, 0.5, -3, 7, 1, 2});
  for (bool accumulate : {false, true}) {
    INFO("accumulate " << accumulate);
    Tensor out = Tensor::zeros(DType::BF16, {6, 2});
    std::string json = programJson(
        buffer(0, "hbm", "input", "bf16", "[6, 2]") + "," +
            buffer(1, "hbm", "input", "i32", "[3, 1]") + "," +
            buffer(2, "hbm", "input", "bf16", "[3, 2]") + "," +
            buffer(3, "hbm", "output", "bf16", "[6, 2]") + "," +
            buffer(4, "sbuf", "scratch", "i32", "[3, 1]") + "," +
            buffer(5, "sbuf", "scratch", "bf16", "[3, 2]"),
        "0, 1, 2", "3",
        R"({"op": "dma_copy", "engine": "sync", "src": )" + full(0, {6, 2}) +
            R"(, "dst": )" + full(3, {6, 2}) +
            R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
            full(1, {3, 1}) + R"(, "dst": )" + full(4, {3, 1}) +
            R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
            full(2, {3, 2}) + R"(, "dst": )" + full(5, {3, 2}) +
            R"(}, {"op": "dma_scatter", "engine": "gpsimd", "accumulate": )" +
            (accumulate ? "true" : "false") + R"(, "src": )" + full(5, {3, 2}) +
            R"(, "indices": )" + full(4, {3, 1}) + R"(, "dst": )" +
            full(3, {6, 2}) + "}");
    run(json, {&table, &indices, &values}, {&out});
    std::vector<double> want = start;
    if (accumulate) {
      // 8 + 256 = 264, then + 1 = 265 rounds to 264 in bf16 (8 bits).
      want[8] = 264, want[9] = 9 + 0.5 + 2, want[2] = 2 - 3, want[3] = 3 + 7;
    } else {
      want[8] = 1, want[9] = 2, want[2] = -3, want[3] = 7;
    }
    for (int i = 0; i < 12; ++i) {
      INFO("element " << i);
      CHECK(out.at(i) == want[i]);
    }
  }
}

TEST_CASE("disjoint scatters write each row once", "[exec][gather]") {
  // Two disjoint scatters of two rows each into a 4-row table: a
  // permutation writes every row; indices that repeat across them are an
  // error, where plain scatters would let the last write win.
  auto program = [](bool disjoint) {
    std::string flag = disjoint ? "true" : "false";
    auto load = [](int from, int to, std::vector<int64_t> shape) {
      return R"({"op": "dma_copy", "engine": "sync", "src": )" +
             full(from, shape) + R"(, "dst": )" + full(to, shape) + "}";
    };
    return programJson(
        buffer(0, "hbm", "input", "i32", "[4, 1]") + "," +
            buffer(1, "hbm", "input", "bf16", "[4, 2]") + "," +
            buffer(2, "sbuf", "scratch", "bf16", "[4, 2]") + "," +
            buffer(3, "hbm", "output", "bf16", "[4, 2]") + "," +
            buffer(4, "sbuf", "scratch", "i32", "[4, 1]"),
        "0, 1", "3",
        load(0, 4, {4, 1}) + "," + load(1, 2, {4, 2}) + "," +
            R"({"op": "dma_scatter", "engine": "gpsimd", "disjoint": )" + flag +
            R"(, "src": )" + view(2, "[2, 2]", "[2, 1]") + R"(, "indices": )" +
            view(4, "[2, 1]", "[1, 1]") + R"(, "dst": )" + full(3, {4, 2}) +
            "}" +
            R"(, {"op": "dma_scatter", "engine": "gpsimd", "disjoint": )" +
            flag + R"(, "src": )" + view(2, "[2, 2]", "[2, 1]", 4) +
            R"(, "indices": )" + view(4, "[2, 1]", "[1, 1]", 2) +
            R"(, "dst": )" + full(3, {4, 2}) + "}");
  };
  Tensor rows = Tensor::of(DType::BF16, {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor out = Tensor::zeros(DType::BF16, {4, 2});
  Tensor perm = Tensor::of(DType::I32, {4, 1}, {2, 0, 3, 1});
  run(program(true), {&perm, &rows}, {&out});
  std::vector<double> want = {3, 4, 7, 8, 1, 2, 5, 6};
  for (int i = 0; i < 8; ++i)
    CHECK(out.at(i) == want[i]);
  // Row 2 named by both scatters.
  Tensor repeated = Tensor::of(DType::I32, {4, 1}, {2, 0, 2, 1});
  std::string message =
      errorOf([&] { run(program(true), {&repeated, &rows}, {&out}); });
  INFO(message);
  CHECK(contains(message, "row 2 written twice"));
  // The same program without the promise: the last write wins.
  run(program(false), {&repeated, &rows}, {&out});
  CHECK(out.at(4) == 5);
}

TEST_CASE("constants come from base64 data or a splat", "[exec][constant]") {
  float data[4] = {1.5f, -2.0f, 3.25f, 1e-3f};
  std::string buffers =
      buffer(0, "hbm", "constant", "f32", "[4]",
             R"(, "data": ")" + base64(data, sizeof(data)) + "\"") +
      "," +
      buffer(1, "hbm", "constant", "bf16", "[2, 2]", R"(, "splat": 0.1)") +
      "," + buffer(2, "hbm", "output", "f32", "[4]") + "," +
      buffer(3, "hbm", "output", "f32", "[2, 2]");
  std::string body = R"({"op": "dma_copy", "engine": "sync", "src": )" +
                     full(0, {4}) + R"(, "dst": )" + full(2, {4}) +
                     R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
                     full(1, {2, 2}) + R"(, "dst": )" + full(3, {2, 2}) + "}";
  Tensor a = Tensor::zeros(DType::F32, {4});
  Tensor b = Tensor::zeros(DType::F32, {2, 2});
  run(programJson(buffers, "", "2, 3", body), {}, {&a, &b});
  for (int i = 0; i < 4; ++i) {
    CHECK(a.at(i) == data[i]);
    CHECK(b.at(i) == bf16BitsToF32(f32ToBf16Bits(0.1f)));
  }
}

TEST_CASE("internal buffers start zeroed, from the heap or mapped",
          "[exec][constant]") {
  // 16 floats come from the heap, 64 Ki (256 KiB) from a mapping, 1 Mi
  // (4 MiB) from one on huge-page boundaries: each reads as zero before
  // anything writes it.
  for (int64_t n : {int64_t{16}, int64_t{1} << 16, int64_t{1} << 20}) {
    INFO(n << " elements");
    std::string buffers = buffer(0, "hbm", "internal", "f32", shapeJson({n})) +
                          "," + buffer(1, "hbm", "output", "f32", "[4]");
    std::string body = R"({"op": "dma_copy", "engine": "sync", "src": )" +
                       view(0, "[4]", "[1]", n - 4) + R"(, "dst": )" +
                       full(1, {4}) + "}";
    Tensor out = Tensor::of(DType::F32, {4}, {1, 2, 3, 4});
    run(programJson(buffers, "", "1", body), {}, {&out});
    for (int i = 0; i < 4; ++i)
      CHECK(out.at(i) == 0.0f);
  }
}

TEST_CASE("run() checks its arguments", "[exec][run]") {
  std::string json =
      programJson(buffer(0, "hbm", "input", "f32", "[4, 8]") + "," +
                      buffer(1, "hbm", "output", "bf16", "[4, 8]"),
                  "0", "1",
                  R"({"op": "dma_copy", "engine": "sync", "src": )" +
                      full(0, {4, 8}) + R"(, "dst": )" + full(1, {4, 8}) + "}");
  Executor executor(Program::parse(json), trn2());
  Tensor in = Tensor::zeros(DType::F32, {4, 8});
  Tensor out = Tensor::zeros(DType::BF16, {4, 8});
  Tensor wrongType = Tensor::zeros(DType::F16, {4, 8});
  Tensor wrongShape = Tensor::zeros(DType::F32, {8, 4});
  CHECK(contains(errorOf([&] { executor.run({}, {out.host()}); }),
                 "expected 1 inputs, got 0"));
  CHECK(
      contains(errorOf([&] { executor.run({in.host()}, {wrongType.host()}); }),
               "dtype f16, expected bf16"));
  CHECK(contains(
      errorOf([&] { executor.run({wrongShape.host()}, {out.host()}); }),
      "shape [8, 4], expected [4, 8]"));
  HostTensor null = in.host();
  null.data = nullptr;
  CHECK(contains(errorOf([&] { executor.run({null}, {out.host()}); }),
                 "null data"));
  // Still fine afterwards, and repeatable with new data.
  for (float scale : {1.0f, -3.0f}) {
    for (int i = 0; i < 32; ++i)
      storeFromF32(scale * i, in.bytes.data() + 4 * i, DType::F32);
    executor.run({in.host()}, {out.host()});
    CHECK(executor.instructionsExecuted() == 1);
    CHECK(out.at(31) == bf16BitsToF32(f32ToBf16Bits(scale * 31)));
  }
}

TEST_CASE("an invalid program cannot build an executor", "[exec][run]") {
  std::string json =
      programJson(buffer(0, "hbm", "input", "f32", "[4, 8]") + "," +
                      buffer(1, "hbm", "output", "f32", "[4, 8]"),
                  "0", "1",
                  R"({"op": "dma_copy", "engine": "sync", "src": )" +
                      view(0, "[4, 8]", "[8, 1]", 1) + R"(, "dst": )" +
                      full(1, {4, 8}) + "}");
  Program program = Program::parse(json);
  CHECK(contains(errorOf([&] { Executor executor(program, trn2()); }),
                 "out of bounds"));
}

TEST_CASE("full-size tiles run through the fast paths", "[exec][tile]") {
  // A [128, 512] bf16 tile: load, silu, add itself, reduce, store; checks
  // the contiguous fast paths against per-element math.
  const int64_t p = 128, f = 512;
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> dist(-4, 4);
  std::vector<double> values(p * f);
  for (double &v : values)
    v = dist(rng);
  Tensor in = Tensor::of(DType::BF16, {p, f}, values);
  Tensor act = Tensor::zeros(DType::BF16, {p, f});
  Tensor sum = Tensor::zeros(DType::F32, {p, 1});
  std::string body =
      R"({"op": "activation", "engine": "scalar", "func": "silu", "src": )" +
      full(100, {p, f}) + R"(, "dst": )" + full(200, {p, f}) +
      R"(}, {"op": "tensor_tensor", "engine": "vector", "alu_op": "add",
          "a": )" +
      full(200, {p, f}) + R"(, "b": )" + full(200, {p, f}) + R"(, "dst": )" +
      full(200, {p, f}) +
      R"(}, {"op": "tensor_reduce", "engine": "vector", "alu_op": "add",
          "src": )" +
      full(200, {p, f}) + R"(, "dst": )" + full(201, {p, 1}) + "}";
  run(tileProgram({{"bf16", {p, f}}}, {{"bf16", {p, f}}, {"f32", {p, 1}}},
                  body),
      {&in}, {&act, &sum});
  for (int64_t row = 0; row < p; row += 17) {
    double rowSum = 0;
    for (int64_t col = 0; col < f; ++col) {
      float x = in.at(row * f + col);
      float silu = bf16BitsToF32(
          f32ToBf16Bits(static_cast<float>(x / (1 + std::exp(-double(x))))));
      float doubled = bf16BitsToF32(f32ToBf16Bits(silu + silu));
      float got = act.at(row * f + col);
      // silu may differ by one bf16 ulp where Eigen's fp32 exp rounds the
      // other way than the double reference.
      REQUIRE(std::fabs(got - doubled) <=
              std::fabs(doubled) * 0x1p-7f + 1e-30f);
      rowSum += got;
    }
    CHECK(close(sum.at(row), rowSum, 1e-5, 1e-4));
  }
}

//===----------------------------------------------------------------------===//
// Reproducibility
//===----------------------------------------------------------------------===//

namespace {

/// Runs `json` on a new executor splitting work between `pool`'s threads,
/// with every input and output placed `shift` floats into a larger host
/// array, and returns the outputs' bytes. `filler` small allocations are
/// live while the executor is built, so its buffers and scratch land at
/// other heap addresses (and alignments) than in another call.
std::vector<std::vector<uint8_t>>
runPlaced(const std::string &json, std::vector<Tensor *> ins,
          std::vector<Tensor *> outs, WorkerPool &pool, int shift, int filler) {
  std::vector<std::unique_ptr<uint8_t[]>> fill;
  for (int i = 0; i < filler; ++i)
    fill.emplace_back(new uint8_t[16 + 8 * i]);
  Program program = Program::parse(json);
  Executor executor(program, trn2(), pool);
  fill.clear();
  std::vector<std::vector<uint8_t>> inStore, outStore;
  std::vector<HostTensor> in, out;
  auto place = [&](Tensor *t, std::vector<std::vector<uint8_t>> &store,
                   std::vector<HostTensor> &hosts) {
    store.emplace_back(t->bytes.size() + 64, 0xA5);
    uint8_t *at = store.back().data() + shift * 4;
    std::memcpy(at, t->bytes.data(), t->bytes.size());
    hosts.push_back(HostTensor{at, t->dtype, t->shape});
  };
  inStore.reserve(ins.size());
  outStore.reserve(outs.size());
  for (Tensor *t : ins)
    place(t, inStore, in);
  for (Tensor *t : outs)
    place(t, outStore, out);
  executor.run(in, out);
  std::vector<std::vector<uint8_t>> result;
  for (size_t i = 0; i < outs.size(); ++i) {
    const uint8_t *at = outStore[i].data() + shift * 4;
    result.emplace_back(at, at + outs[i]->bytes.size());
  }
  return result;
}

/// How many 4-byte words of two runs' output differ (0: bit-identical).
int64_t differingWords(const std::vector<uint8_t> &a,
                       const std::vector<uint8_t> &b) {
  REQUIRE(a.size() == b.size());
  int64_t count = 0;
  for (size_t i = 0; i < a.size(); i += 4)
    count += std::memcmp(a.data() + i, b.data() + i, 4) != 0;
  return count;
}

Tensor randomTensor(std::mt19937 &rng, std::vector<int64_t> shape,
                    DType dtype = DType::F32) {
  std::uniform_real_distribution<double> dist(-3, 3);
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  std::vector<double> values(n);
  for (double &v : values)
    v = dist(rng);
  return Tensor::of(dtype, std::move(shape), values);
}

} // namespace

TEST_CASE("results do not depend on host addresses or thread counts",
          "[exec][determinism]") {
  // The same program and inputs must give the same bits whatever the
  // addresses (and so the alignments) of the host arrays, of the executor's
  // buffers and scratch, and however many host threads split its large
  // instructions: vectorized kernels must not peel differently, sum in
  // another order or take their scalar path for other elements.
  std::mt19937 rng(29);
  WorkerPool one(1), two(2), three(3);
  WorkerPool *pools[] = {&one, &two, &three};

  SECTION("small tiles (LayerNorm-like row statistics, activations, a tiny "
          "fp32 matmul)") {
    const int64_t p = 8, f = 37;
    Tensor x = randomTensor(rng, {p, f});
    Tensor col = randomTensor(rng, {p, 1});
    Tensor stat = randomTensor(rng, {4, p});
    Tensor mov = randomTensor(rng, {4, 5});
    std::vector<Tensor> outs = {
        Tensor::zeros(DType::F32, {p, f}), Tensor::zeros(DType::F32, {p, 1}),
        Tensor::zeros(DType::F32, {p, f}), Tensor::zeros(DType::F32, {p, 1}),
        Tensor::zeros(DType::F32, {p, 1}), Tensor::zeros(DType::F32, {p, f}),
        Tensor::zeros(DType::F32, {p, 5}), Tensor::zeros(DType::F32, {p, f})};
    std::string body =
        R"({"op": "activation", "engine": "scalar", "func": "square",
            "src": )" +
        full(100, {p, f}) + R"(, "dst": )" + full(300, {p, f}) +
        R"(, "reduce_res": )" + full(201, {p, 1}) +
        R"(}, {"op": "activation", "engine": "scalar", "func": "rsqrt",
            "scale": 0.5, "bias_imm": 0.25, "src": )" +
        full(300, {p, f}) + R"(, "dst": )" + full(200, {p, f}) +
        R"(}, {"op": "activation", "engine": "scalar", "func": "gelu",
            "src": )" +
        full(100, {p, f}) + R"(, "bias": )" + full(101, {p, 1}) +
        R"(, "dst": )" + full(202, {p, f}) +
        R"(}, {"op": "tensor_reduce", "engine": "vector", "alu_op": "add",
            "src": )" +
        full(202, {p, f}) + R"(, "dst": )" + full(203, {p, 1}) +
        R"(}, {"op": "tensor_reduce", "engine": "vector", "alu_op": "max",
            "src": )" +
        full(100, {p, f}) + R"(, "dst": )" + full(204, {p, 1}) +
        R"(}, {"op": "scalar_tensor_tensor", "engine": "vector",
            "alu_op0": "multiply", "alu_op1": "add", "a": )" +
        full(100, {p, f}) + R"(, "scalar": )" + full(101, {p, 1}) +
        R"(, "b": )" + full(202, {p, f}) + R"(, "dst": )" + full(205, {p, f}) +
        R"(}, {"op": "matmul", "engine": "tensor", "accumulate": false,
            "stationary": )" +
        full(102, {4, p}) + R"(, "moving": )" + full(103, {4, 5}) +
        R"(, "dst": )" + full(301, {p, 5}) +
        R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
        full(301, {p, 5}) + R"(, "dst": )" + full(206, {p, 5}) +
        R"(}, {"op": "activation", "engine": "scalar", "func": "tanh",
            "src": )" +
        full(202, {p, f}) + R"(, "dst": )" + full(207, {p, f}) + "}";
    std::vector<TileArg> outArgs;
    std::vector<Tensor *> outPtrs;
    for (Tensor &t : outs) {
      outArgs.push_back({"f32", t.shape});
      outPtrs.push_back(&t);
    }
    std::string json = tileProgram(
        {{"f32", {p, f}}, {"f32", {p, 1}}, {"f32", {4, p}}, {"f32", {4, 5}}},
        outArgs, body,
        buffer(300, "sbuf", "scratch", "f32", shapeJson({p, f})) + ", " +
            buffer(301, "psum", "scratch", "f32", shapeJson({p, 5})));
    auto reference =
        runPlaced(json, {&x, &col, &stat, &mov}, outPtrs, one, 0, 0);
    for (int trial = 1; trial < 24; ++trial) {
      INFO("threads " << pools[trial % 3]->threads() << ", shift " << trial % 16
                      << " floats, filler " << trial);
      auto got = runPlaced(json, {&x, &col, &stat, &mov}, outPtrs,
                           *pools[trial % 3], trial % 16, trial);
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("output " << i);
        CHECK(differingWords(got[i], reference[i]) == 0);
      }
    }
  }

  SECTION("large instructions split between threads") {
    // [128, 520] activations (split by rows) and a 128 x 128 x 129 fp32
    // matmul (split by columns): 1, 2 and 3 threads cut them differently.
    const int64_t p = 128, f = 520, n = 129;
    Tensor x = randomTensor(rng, {p, f});
    Tensor stat = randomTensor(rng, {p, p});
    Tensor mov = randomTensor(rng, {p, n});
    Tensor movBf16 = randomTensor(rng, {p, n}, DType::BF16);
    Tensor statBf16 = randomTensor(rng, {p, p}, DType::BF16);
    Tensor act = Tensor::zeros(DType::F32, {p, f});
    Tensor sums = Tensor::zeros(DType::F32, {p, 1});
    Tensor prod = Tensor::zeros(DType::F32, {p, n});
    Tensor prodBf16 = Tensor::zeros(DType::F32, {p, n});
    std::string body =
        R"({"op": "activation", "engine": "scalar", "func": "gelu_tanh",
            "scale": 0.75, "src": )" +
        full(100, {p, f}) + R"(, "dst": )" + full(200, {p, f}) +
        R"(, "reduce_res": )" + full(201, {p, 1}) +
        R"(}, {"op": "matmul", "engine": "tensor", "accumulate": false,
            "stationary": )" +
        full(101, {p, p}) + R"(, "moving": )" + full(102, {p, n}) +
        R"(, "dst": )" + full(300, {p, n}) +
        R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
        full(300, {p, n}) + R"(, "dst": )" + full(202, {p, n}) +
        R"(}, {"op": "matmul", "engine": "tensor", "accumulate": false,
            "stationary": )" +
        full(104, {p, p}) + R"(, "moving": )" + full(103, {p, n}) +
        R"(, "dst": )" + full(300, {p, n}) +
        R"(}, {"op": "dma_copy", "engine": "sync", "src": )" +
        full(300, {p, n}) + R"(, "dst": )" + full(203, {p, n}) + "}";
    std::string json = tileProgram(
        {{"f32", {p, f}},
         {"f32", {p, p}},
         {"f32", {p, n}},
         {"bf16", {p, n}},
         {"bf16", {p, p}}},
        {{"f32", {p, f}}, {"f32", {p, 1}}, {"f32", {p, n}}, {"f32", {p, n}}},
        body, buffer(300, "psum", "scratch", "f32", shapeJson({p, n})));
    std::vector<Tensor *> ins = {&x, &stat, &mov, &movBf16, &statBf16};
    std::vector<Tensor *> outs = {&act, &sums, &prod, &prodBf16};
    auto reference = runPlaced(json, ins, outs, one, 0, 0);
    for (int trial = 1; trial < 6; ++trial) {
      INFO("threads " << pools[trial % 3]->threads() << ", shift "
                      << trial % 4);
      auto got =
          runPlaced(json, ins, outs, *pools[trial % 3], trial % 4, trial);
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("output " << i);
        CHECK(differingWords(got[i], reference[i]) == 0);
      }
    }
  }
}

TEST_CASE("fp32 matmul: the same bits from any layout of the moving operand",
          "[exec][matmul][determinism]") {
  // A moving operand with contiguous rows is gathered by each thread's
  // chunk of columns; a strided one on the caller's thread before the
  // product. Both must give the bits of the same product, on shapes split
  // between threads (K * M * N >= 2^21) with partial register tiles and
  // chunks, and on one too small to split.
  std::mt19937 rng(37);
  struct Shape {
    int64_t k, m, n;
  };
  for (Shape s : {Shape{128, 128, 512}, Shape{128, 77, 333},
                  Shape{100, 128, 257}, Shape{128, 128, 129}, Shape{7, 5, 3}}) {
    INFO("k " << s.k << " m " << s.m << " n " << s.n);
    Tensor stat = randomTensor(rng, {s.k, s.m});
    Tensor mov = randomTensor(rng, {s.k, s.n});
    std::vector<Tensor> outs(4, Tensor::zeros(DType::F32, {s.m, s.n}));
    int64_t pitch = s.n + 5;
    std::string dense = shapeJson({s.k, s.n});
    std::string pitched = view(110, dense, shapeJson({pitch, 1}));
    std::string strided = view(111, dense, shapeJson({2 * s.n, 2}));
    std::string body;
    for (int i = 0; i < 2; ++i) { // contiguous rows, then every other column
      const std::string &moving = i == 0 ? pitched : strided;
      body += R"({"op": "dma_copy", "engine": "sync", "src": )" +
              full(101, {s.k, s.n}) + R"(, "dst": )" + moving + "}, " +
              matmulNode(full(100, {s.k, s.m}), moving, full(300, {s.m, s.n}),
                         false) +
              R"(, {"op": "dma_copy", "engine": "sync", "src": )" +
              full(300, {s.m, s.n}) + R"(, "dst": )" +
              full(200 + 2 * i, {s.m, s.n}) + "}, " +
              matmulNode(full(100, {s.k, s.m}), moving, full(300, {s.m, s.n}),
                         true) +
              R"(, {"op": "dma_copy", "engine": "sync", "src": )" +
              full(300, {s.m, s.n}) + R"(, "dst": )" +
              full(201 + 2 * i, {s.m, s.n}) + (i == 0 ? "}, " : "}");
    }
    std::vector<TileArg> outArgs(4, {"f32", {s.m, s.n}});
    std::string json = tileProgram(
        {{"f32", {s.k, s.m}}, {"f32", {s.k, s.n}}}, outArgs, body,
        buffer(110, "sbuf", "scratch", "f32", shapeJson({s.k, pitch})) + ", " +
            buffer(111, "sbuf", "scratch", "f32", shapeJson({s.k, 2 * s.n})) +
            ", " +
            buffer(300, "psum", "scratch", "f32", shapeJson({s.m, s.n})));
    run(json, {&stat, &mov}, {&outs[0], &outs[1], &outs[2], &outs[3]});
    CHECK(differingWords(outs[0].bytes, outs[2].bytes) == 0);
    CHECK(differingWords(outs[1].bytes, outs[3].bytes) == 0);
    // Not all zeros: the products ran.
    CHECK(outs[1].at(0) != 0.0f);
    CHECK(outs[1].at(0) == 2.0f * outs[0].at(0));
  }
}

namespace {
/// A collective handler that plays a two-rank group whose other rank holds
/// `peerScale` times this rank's data; it records what it was asked.
struct FakeCollectives {
  CollectiveCall last;
  std::string group;
  int calls = 0;
  float peerScale = 10;
  const char *failWith = nullptr;

  static int run(void *context, const CollectiveCall *call, char *error,
                 size_t errorSize) {
    auto &self = *static_cast<FakeCollectives *>(context);
    ++self.calls;
    self.last = *call;
    self.group = call->group;
    if (self.failWith) {
      std::snprintf(error, errorSize, "%s", self.failWith);
      return 1;
    }
    const auto *src = static_cast<const float *>(call->src);
    auto *dst = static_cast<float *>(call->dst);
    for (int64_t i = 0; i < call->srcElements; ++i) // all_gather of 2 ranks
      dst[i] = src[i], dst[call->srcElements + i] = src[i] * self.peerScale;
    return 0;
  }
  CollectiveHandler handler() {
    CollectiveHandler h;
    h.context = this;
    h.run = &FakeCollectives::run;
    return h;
  }
};

std::string gatherProgram() {
  std::string buffers = buffer(0, "hbm", "input", "f32", "[4, 8]") + "," +
                        buffer(1, "hbm", "output", "f32", "[8, 8]");
  std::string inst =
      R"({"op": "collective", "engine": "gpsimd", "kind": "all_gather",
          "group": 0, "src": )" +
      view(0, "[4, 8]", "[8, 1]") + R"(, "dst": )" +
      view(1, "[8, 8]", "[8, 1]") + "}";
  return neuron::test::withGroups(programJson(buffers, "0", "1", inst),
                                  R"([{"name": "tp", "ranks": [4, 5]}])");
}
} // namespace

TEST_CASE("collective instructions run through the handler",
          "[exec][collective]") {
  Program program = Program::parse(gatherProgram());
  Executor executor(program, trn2());
  std::vector<float> in(32), out(64, -1);
  for (int i = 0; i < 32; ++i)
    in[i] = float(i);
  FakeCollectives fake;
  CollectiveHandler handler = fake.handler();
  executor.run({neuron::test::host(in, DType::F32, {4, 8})},
               {neuron::test::host(out, DType::F32, {8, 8})}, &handler);
  CHECK(fake.calls == 1);
  CHECK(fake.group == "tp");
  CHECK(fake.last.kind == Collective::AllGather);
  CHECK(fake.last.groupSize == 2);
  CHECK(fake.last.dtype == DType::F32);
  CHECK(fake.last.src == in.data());
  CHECK(fake.last.dst == out.data());
  CHECK(fake.last.srcElements == 32);
  CHECK(fake.last.dstElements == 64);
  for (int i = 0; i < 32; ++i) {
    CHECK(out[i] == float(i));
    CHECK(out[32 + i] == float(i) * 10);
  }
}

TEST_CASE("a collective without a handler, or failing, is an error",
          "[exec][collective]") {
  Program program = Program::parse(gatherProgram());
  Executor executor(program, trn2());
  std::vector<float> in(32), out(64);
  std::vector<HostTensor> ins{neuron::test::host(in, DType::F32, {4, 8})};
  std::vector<HostTensor> outs{neuron::test::host(out, DType::F32, {8, 8})};
  CHECK(contains(errorOf([&] { executor.run(ins, outs); }),
                 "no collective handler"));
  FakeCollectives fake;
  fake.failWith = "peer went away";
  CollectiveHandler handler = fake.handler();
  std::string error = errorOf([&] { executor.run(ins, outs, &handler); });
  CHECK(contains(error, "all_gather in group 'tp' failed: peer went away"));
  // The executor stays usable.
  fake.failWith = nullptr;
  executor.run(ins, outs, &handler);
  CHECK(fake.calls == 2);
}

TEST_CASE("the program verifier checks collective instructions",
          "[program][collective]") {
  std::string good = gatherProgram();
  auto replaced = [&](const std::string &from, const std::string &to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return errorOf([&] { Program::parse(s).verify(trn2()); });
  };
  CHECK(contains(replaced(R"("ranks": [4, 5])", R"("ranks": [4, 5, 6])"),
                 "all_gather: 'dst' must have 3 times the elements of 'src'"));
  CHECK(contains(replaced(R"("group": 0)", R"("group": 1)"),
                 "field 'group': 1 is not an index"));
  CHECK(contains(replaced(R"("kind": "all_gather")", R"("kind": "barrier")"),
                 "barrier is not a collective instruction"));
  CHECK(contains(replaced(R"("ranks": [4, 5])", R"("ranks": [4, 4])"),
                 "rank 4 is negative or listed twice"));
}

namespace {

/// A size-generic program: y = 2x + 1 over [s0, 8] f32 rows, full tiles of
/// 4 rows in a loop, then the shortened last tile (PROGRAM_FORMAT.md, "Size
/// parameters").
std::string rowsProgram() {
  auto io = [](int id, const char *kind) {
    return buffer(id, "hbm", kind, "f32", R"(["s0", 8])");
  };
  auto tile = [](int buf, const std::string &rows, const std::string &offset,
                 const std::string &terms) {
    return R"({"buf": )" + std::to_string(buf) + R"(, "offset": {"const": )" +
           offset + R"(, "terms": )" + terms + R"(}, "shape": [)" + rows +
           R"(, 8], "strides": [8, 1]})";
  };
  auto step = [&](const std::string &rows, const std::string &offset,
                  const std::string &terms) {
    std::string sb = tile(2, rows, "0", "[]");
    return R"({"op": "dma_copy", "engine": "sync", "src": )" +
           tile(0, rows, offset, terms) + R"(, "dst": )" + sb + R"(},
           {"op": "activation", "engine": "scalar", "func": "identity",
            "scale": 2.0, "bias_imm": 1.0, "src": )" +
           sb + R"(, "dst": )" + sb + R"(},
           {"op": "dma_copy", "engine": "sync", "src": )" +
           sb + R"(, "dst": )" + tile(1, rows, offset, terms) + "}";
  };
  std::string body =
      R"x({"loop": 0, "count": "floordiv(s0, 4)", "body": [)x" +
      step("4", "0", "[[0, 32]]") +
      R"x(]}, {"loop": 1, "count": "min(mod(s0, 4), 1)", "body": [)x" +
      step(R"x("mod(s0, 4)")x", R"x("8*(s0 - mod(s0, 4))")x", "[]") + "]}";
  std::string json =
      programJson(io(0, "input") + "," + io(1, "output") + "," +
                      buffer(2, "sbuf", "scratch", "f32", "[4, 8]"),
                  "0", "1", body);
  return json.insert(1, R"("params": [{"name": "s0", "min": 1, "max": 64}], )");
}

} // namespace

TEST_CASE("a size-generic program runs at every size in its range",
          "[executor][sizes]") {
  std::string json = rowsProgram();
  for (int64_t rows : {1, 3, 4, 5, 8, 13, 64}) {
    CAPTURE(rows);
    SizeEnv sizes = {{"s0", rows}};
    Program program = Program::parse(json, &sizes);
    CHECK(program.buffers[0].shape == std::vector<int64_t>{rows, 8});
    std::vector<double> values(rows * 8);
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = double(i) - 7.0;
    Tensor in = Tensor::of(DType::F32, {rows, 8}, values);
    Tensor out = Tensor::zeros(DType::F32, {rows, 8});
    Executor executor(program, trn2());
    std::vector<HostTensor> ins = {in.host()}, outs = {out.host()};
    executor.run(ins, outs);
    int64_t tiles = rows / 4 + (rows % 4 ? 1 : 0);
    CHECK(executor.instructionsExecuted() == 3 * tiles);
    for (size_t i = 0; i < values.size(); ++i)
      CHECK(out.at(i) == float(2 * values[i] + 1));
  }
}
