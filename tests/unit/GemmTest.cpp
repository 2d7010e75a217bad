//===- GemmTest.cpp - Host matmul kernels and the worker pool -------------===//

#include "runtime/exec/Gemm.h"
#include "runtime/exec/Numerics.h"
#include "runtime/exec/WorkerPool.h"
#include "runtime/program/Error.h"
#include "tests/unit/CatchCompat.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace neuron::runtime;

namespace {

/// A [rows, cols] bf16 operand stored with a row pitch and a column step
/// larger than dense, so the kernels' strided paths run too.
struct Operand {
  std::vector<uint16_t> storage;
  StridedMatrix<uint16_t> matrix;
  double at(int64_t r, int64_t c) const {
    return bf16BitsToF32(
        matrix.data[r * matrix.rowStride + c * matrix.colStride]);
  }
};

Operand makeOperand(int64_t rows, int64_t cols, int64_t colStride,
                    const std::function<uint16_t()> &next) {
  Operand op;
  int64_t rowStride = cols * colStride + 3;
  op.storage.assign(static_cast<size_t>(rows * rowStride), 0xffff); // NaN
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      op.storage[r * rowStride + c * colStride] = next();
  op.matrix = {op.storage.data(), rows, cols, rowStride, colStride};
  return op;
}

/// Runs matmulBf16 on columns [begin, end) of a [m, n] output (leading
/// dimension n + 5) that starts as `initial`, and checks every element: the
/// fp64 sum of the exact products within fp32 accumulation error (plus the
/// K * 2^-126 the dot-product instructions may flush), and the columns
/// outside the range untouched.
void checkMatmul(Bf16Kernel kernel, const Operand &a, const Operand &b,
                 bool accumulate, int64_t begin, int64_t end, double initial) {
  INFO("kernel " << bf16KernelName(kernel));
  int64_t k = a.matrix.rows, m = a.matrix.cols, n = b.matrix.cols;
  int64_t ld = n + 5;
  std::vector<float> out(static_cast<size_t>(m * ld),
                         static_cast<float>(initial));
  matmulBf16(kernel, a.matrix, b.matrix, out.data(), ld, accumulate, begin,
             end);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ld; ++j) {
      float got = out[i * ld + j];
      if (j < begin || j >= end) {
        REQUIRE(got == static_cast<float>(initial));
        continue;
      }
      double ref = accumulate ? initial : 0.0, mag = std::fabs(ref);
      for (int64_t p = 0; p < k; ++p) {
        double product = a.at(p, i) * b.at(p, j);
        ref += product;
        mag += std::fabs(product);
      }
      double bound = (k + 1) * std::ldexp(mag, -24) + k * std::ldexp(1.0, -126);
      REQUIRE(std::fabs(got - ref) <= bound);
    }
}

uint16_t bf16Of(double value) {
  return f32ToBf16Bits(static_cast<float>(value));
}

} // namespace

TEST_CASE("bf16 matmul sums exact products in fp32", "[gemm]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  auto random = [&] { return bf16Of(dist(rng)); };
  struct Shape {
    int64_t k, m, n;
  };
  // Full tiles, and every kind of edge: odd K, K past a 32-value AMX block,
  // partial 8- and 16-row and 16- and 32-column register and AMX tiles,
  // single elements.
  for (Bf16Kernel kernel : bf16Kernels())
    for (Shape s :
         {Shape{128, 128, 512}, Shape{7, 5, 3}, Shape{33, 17, 70},
          Shape{1, 1, 1}, Shape{128, 9, 33}, Shape{64, 32, 32},
          Shape{95, 48, 17}, Shape{31, 33, 49}, Shape{160, 100, 96}}) {
      for (int64_t colStride : {1, 2}) {
        Operand a = makeOperand(s.k, s.m, colStride, random);
        Operand b = makeOperand(s.k, s.n, colStride, random);
        checkMatmul(kernel, a, b, false, 0, s.n, 0.0);
        checkMatmul(kernel, a, b, true, 0, s.n, 0.75);
        if (s.n > 40) // A column range starting mid-way, as a thread's share.
          checkMatmul(kernel, a, b, true, 32, s.n - 3, -1.5);
        if (s.n > 20) // One that starts inside a 16-column tile.
          checkMatmul(kernel, a, b, false, 7, s.n - 1, 0.0);
      }
    }
}

TEST_CASE("the bf16 matmul kernels are listed fastest first", "[gemm]") {
  const std::vector<Bf16Kernel> &kernels = bf16Kernels();
  REQUIRE(!kernels.empty());
  CHECK(kernels.back() == Bf16Kernel::Widened);
  CHECK(std::is_sorted(kernels.begin(), kernels.end()));
  CHECK(matmulBf16ColumnsIndependent() ==
        (kernels.front() != Bf16Kernel::Widened ||
         matmulF32ColumnsIndependent()));
}

TEST_CASE("bf16 matmul columns do not depend on the column range", "[gemm]") {
  // Threads split a matmul by columns: each column's bits must be the same
  // whichever range computes it (and wherever the output lives).
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  auto random = [&] { return bf16Of(dist(rng)); };
  Operand a = makeOperand(128, 40, 1, random);
  Operand b = makeOperand(128, 200, 1, random);
  for (Bf16Kernel kernel : bf16Kernels()) {
    if (kernel == Bf16Kernel::Widened && !matmulF32ColumnsIndependent())
      continue; // Eigen blocks by width: callers cut it by shape.
    INFO("kernel " << bf16KernelName(kernel));
    std::vector<float> whole(40 * 200, 0.5f), parts(40 * 203, 0.5f);
    matmulBf16(kernel, a.matrix, b.matrix, whole.data(), 200, true, 0, 200);
    for (auto [begin, end] :
         {std::pair<int64_t, int64_t>{0, 64}, {64, 77}, {77, 160}, {160, 200}})
      matmulBf16(kernel, a.matrix, b.matrix, parts.data() + 3, 203, true, begin,
                 end);
    for (int64_t i = 0; i < 40; ++i)
      for (int64_t j = 0; j < 200; ++j)
        REQUIRE(whole[i * 200 + j] == parts[i * 203 + 3 + j]);
  }
}

TEST_CASE("bf16 matmul is exact where fp32 sums are", "[gemm]") {
  // Small integers: every partial sum is exact in any order.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> dist(-3, 3);
  auto random = [&] { return bf16Of(dist(rng)); };
  Operand a = makeOperand(65, 19, 1, random);
  Operand b = makeOperand(65, 45, 1, random);
  for (Bf16Kernel kernel : bf16Kernels()) {
    INFO("kernel " << bf16KernelName(kernel));
    std::vector<float> out(19 * 45, 2.0f);
    matmulBf16(kernel, a.matrix, b.matrix, out.data(), 45, true, 0, 45);
    for (int64_t i = 0; i < 19; ++i)
      for (int64_t j = 0; j < 45; ++j) {
        double ref = 2.0;
        for (int64_t p = 0; p < 65; ++p)
          ref += a.at(p, i) * b.at(p, j);
        REQUIRE(out[i * 45 + j] == ref);
      }
  }
}

TEST_CASE("bf16 matmul with subnormal inputs stays within K * 2^-126",
          "[gemm]") {
  // Softmax probabilities reach bf16's subnormal range; the dot-product
  // instructions read those as zero.
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> pick(0, 3);
  std::uniform_int_distribution<int> mantissa(1, 0x7f);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  auto mixed = [&]() -> uint16_t {
    switch (pick(rng)) {
    case 0:
      return static_cast<uint16_t>(mantissa(rng)); // subnormal
    case 1:
      return bf16Of(std::ldexp(dist(rng), -120)); // tiny products
    default:
      return bf16Of(dist(rng));
    }
  };
  Operand a = makeOperand(128, 16, 1, mixed);
  Operand b = makeOperand(128, 64, 1, mixed);
  for (Bf16Kernel kernel : bf16Kernels())
    checkMatmul(kernel, a, b, false, 0, 64, 0.0);
}

TEST_CASE("fp32 matmul on column ranges", "[gemm]") {
  // Row and column counts on and off the register tiles' multiples.
  const int64_t shapes[][3] = {{20, 6, 50}, {130, 19, 70}, {128, 128, 64}};
  for (const auto &[k, m, n] : shapes) {
    INFO("k " << k << " m " << m << " n " << n);
    std::mt19937 rng(8);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> a(k * m), b(k * n * 2);
    for (float &v : a)
      v = dist(rng);
    for (float &v : b)
      v = dist(rng);
    for (int64_t colStride : {1, 2}) {
      std::vector<float> out(m * n, 1.0f);
      StridedMatrix<float> lhs{a.data(), k, m, m, 1};
      StridedMatrix<float> rhs{b.data(), k, n, n * colStride, colStride};
      matmulF32(lhs, rhs, out.data(), n, true, 10, 40);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double ref = 1.0;
          if (j >= 10 && j < 40)
            for (int64_t p = 0; p < k; ++p)
              ref +=
                  double(a[p * m + i]) * b[p * n * colStride + j * colStride];
          REQUIRE(std::fabs(out[i * n + j] - ref) <= 1e-5 * k);
        }
    }
  }
}

TEST_CASE("fp32 matmul columns do not depend on the column range", "[gemm]") {
  if (!matmulF32ColumnsIndependent())
    return; // Eigen (a portable build's) blocks by width.
  const int64_t k = 128, m = 21, n = 100;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> a(k * m), b(k * n);
  for (float &v : a)
    v = dist(rng);
  for (float &v : b)
    v = dist(rng);
  StridedMatrix<float> lhs{a.data(), k, m, m, 1}, rhs{b.data(), k, n, n, 1};
  std::vector<float> whole(m * n, 0.5f), parts(m * (n + 3), 0.5f);
  matmulF32(lhs, rhs, whole.data(), n, true, 0, n);
  for (auto [begin, end] :
       {std::pair<int64_t, int64_t>{0, 16}, {16, 33}, {33, 96}, {96, 100}})
    matmulF32(lhs, rhs, parts.data() + 3, n + 3, true, begin, end);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      REQUIRE(whole[i * n + j] == parts[i * (n + 3) + 3 + j]);
}

TEST_CASE("the worker pool runs every chunk once", "[pool]") {
  WorkerPool pool(4);
  REQUIRE(pool.threads() == 4);
  for (int64_t count : {0, 1, 3, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
    pool.run(count, [&](int64_t i) { hits[i].fetch_add(1); });
    for (auto &h : hits)
      REQUIRE(h.load() == 1);
  }
  // A run inside a run executes on the calling thread instead of waiting
  // for workers that are busy with the outer one.
  std::atomic<int> inner{0};
  pool.run(
      4, [&](int64_t) { pool.run(10, [&](int64_t) { inner.fetch_add(1); }); });
  CHECK(inner.load() == 40);
}

TEST_CASE("TORCHNEURON_HOST_THREADS must be a positive integer", "[pool]") {
  CHECK(parseHostThreads("3") == 3);
  for (const char *bad : {"0", "-2", "", "two", "2x"})
    CHECK_THROWS_AS(parseHostThreads(bad), Error);
}

TEST_CASE("bf16 matmul reuses a packed moving operand only under its key",
          "[gemm]") {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  auto random = [&] { return bf16Of(dist(rng)); };
  Operand a = makeOperand(96, 40, 1, random);
  Operand b = makeOperand(96, 70, 1, random);
  Operand other = makeOperand(96, 70, 1, random);
  for (Bf16Kernel kernel : bf16Kernels()) {
    INFO("kernel " << bf16KernelName(kernel));
    auto run = [&](const Operand &moving, uint64_t key) {
      std::vector<float> out(40 * 70, 0.0f);
      matmulBf16(kernel, a.matrix, moving.matrix, out.data(), 70, false, 0, 70,
                 key);
      return out;
    };
    std::vector<float> plain = run(b, 0);
    CHECK(run(b, 1001) == plain);
    CHECK(run(b, 1001) == plain); // packed copy reused: same bits
    // Same key, another matrix: packed afresh.
    CHECK(run(other, 1001) == run(other, 0));
    // The same storage with new values under a new key: packed afresh.
    Operand changed = b;
    changed.matrix.data = changed.storage.data();
    CHECK(run(changed, 1002) == plain);
    for (uint16_t &v : changed.storage)
      v = static_cast<uint16_t>(v ^ 0x8000); // negate
    std::vector<float> negated = run(changed, 1003);
    for (size_t i = 0; i < plain.size(); ++i)
      REQUIRE(negated[i] == -plain[i]);
    if (kernel == Bf16Kernel::Widened && !matmulF32ColumnsIndependent())
      continue; // Its columns depend on the range (see above).
    // One key, column ranges in turn, more than a thread keeps (a thread
    // running every chunk of the instructions): the same bits.
    std::vector<float> parts(40 * 70, 0.0f);
    for (int round = 0; round < 2; ++round)
      for (auto [from, to] : {std::pair<int64_t, int64_t>{0, 32},
                              {32, 64},
                              {64, 70},
                              {0, 32},
                              {32, 64}})
        matmulBf16(kernel, a.matrix, b.matrix, parts.data(), 70, false, from,
                   to, 2001);
    CHECK(parts == plain);
  }
}

TEST_CASE("fp32 matmul reuses a packed moving operand only under its key",
          "[gemm]") {
  const int64_t k = 64, m = 13, n = 45;
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> a(k * m), b(k * n);
  for (float &v : a)
    v = dist(rng);
  for (float &v : b)
    v = dist(rng);
  auto run = [&](uint64_t key, int64_t from, int64_t to) {
    std::vector<float> out(m * n, 0.0f);
    matmulF32({a.data(), k, m, m, 1}, {b.data(), k, n, n, 1}, out.data(), n,
              false, from, to, key);
    return out;
  };
  std::vector<float> plain = run(0, 0, n);
  CHECK(run(7001, 0, n) == plain);
  CHECK(run(7001, 0, n) == plain); // packed copy reused: same bits
  // Other columns under the same key: packed for those columns (the same
  // bits where columns do not depend on the range).
  std::vector<float> tail = run(7001, 16, n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 16; j < n; ++j)
      if (matmulF32ColumnsIndependent())
        REQUIRE(tail[i * n + j] == plain[i * n + j]);
      else
        REQUIRE(std::fabs(tail[i * n + j] - plain[i * n + j]) <= 1e-4f);
  // The same storage with new values under a new key: packed afresh.
  for (float &v : b)
    v = -v;
  std::vector<float> negated = run(7002, 0, n);
  for (size_t i = 0; i < plain.size(); ++i)
    REQUIRE(negated[i] == -plain[i]);
}
