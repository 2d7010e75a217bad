//===- timing_model_bench.cpp - Throughput of the timing model ------------===//
//
// Prints how many dynamic instruction instances per second
// neuron::runtime::simulate() processes on large programs, with and without
// keeping events.
//
//   neuron-timing-bench [target] [scale]
//
// Two workloads: a tiled GEMM (`scale` M tiles; default 256: ~9.5 million
// dynamic instructions) and softmax-like rows (8192 * `scale` tiles; ~10.5
// million), the latter also with explicit sync (the model then checks the
// program's waits). A benchmark prints a figure; it asserts nothing.
//
//===----------------------------------------------------------------------===//

#include "runtime/program/Program.h"
#include "runtime/target/Target.h"
#include "runtime/timing/TimingModel.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>

using namespace neuron::runtime;

namespace {

std::string view(int buf, const std::string &shape, const std::string &strides,
                 long long offset, const std::string &terms) {
  return "{\"buf\": " + std::to_string(buf) +
         ", \"offset\": {\"const\": " + std::to_string(offset) +
         ", \"terms\": " + terms + "}, \"shape\": " + shape +
         ", \"strides\": " + strides + "}";
}

std::string buffer(int id, const char *space, const char *kind,
                   const char *dtype, const std::string &shape) {
  return "{\"id\": " + std::to_string(id) + ", \"name\": \"b" +
         std::to_string(id) + "\", \"space\": \"" + space + "\", \"kind\": \"" +
         kind + "\", \"dtype\": \"" + dtype + "\", \"shape\": " + shape + "}";
}

/// C[M, N] = A[K, M]^T B[K, N] in bf16, tiles 128 (M) x 512 (N) x 128 (K),
/// operand tiles double-buffered over K. A naive kernel (no operand reuse,
/// shallow buffering): its simulated figures show DMA latency exposure;
/// what this benchmark measures is simulation speed.
std::string gemmProgram(const std::string &target, long long mTiles,
                        long long nTiles, long long kTiles) {
  const long long M = 128 * mTiles, N = 512 * nTiles, K = 128 * kTiles;
  auto s = [](long long v) { return std::to_string(v); };
  std::string buffers =
      buffer(0, "hbm", "input", "bf16", "[" + s(K) + ", " + s(M) + "]") + "," +
      buffer(1, "hbm", "input", "bf16", "[" + s(K) + ", " + s(N) + "]") + "," +
      buffer(2, "hbm", "output", "bf16", "[" + s(M) + ", " + s(N) + "]") + "," +
      buffer(3, "sbuf", "scratch", "bf16", "[128, 256]") + "," +
      buffer(4, "sbuf", "scratch", "bf16", "[128, 1024]") + "," +
      buffer(5, "psum", "scratch", "f32", "[128, 1024]") + "," +
      buffer(6, "sbuf", "scratch", "bf16", "[128, 1024]");
  // Loop ids: 0 = i (M tile), 1 = j (N tile pair), 2 = jj, 3 = k (pair), 4 =
  // kk.
  std::string aTile =
      view(0, "[128, 128]", "[" + s(M) + ", 1]", 0,
           "[[0, 128], [3, " + s(2 * 128 * M) + "], [4, " + s(128 * M) + "]]");
  std::string bTile = view(1, "[128, 512]", "[" + s(N) + ", 1]", 0,
                           "[[1, 1024], [2, 512], [3, " + s(2 * 128 * N) +
                               "], [4, " + s(128 * N) + "]]");
  std::string sA = view(3, "[128, 128]", "[256, 1]", 0, "[[4, 128]]");
  std::string sB = view(4, "[128, 512]", "[1024, 1]", 0, "[[4, 512]]");
  std::string ps = view(5, "[128, 512]", "[1024, 1]", 0, "[[2, 512]]");
  std::string out = view(6, "[128, 512]", "[1024, 1]", 0, "[[2, 512]]");
  std::string cTile = view(2, "[128, 512]", "[" + s(N) + ", 1]", 0,
                           "[[0, " + s(128 * N) + "], [1, 1024], [2, 512]]");
  std::string kBody =
      "{\"op\": \"dma_copy\", \"engine\": \"sync\", \"loc\": 0, \"src\": " +
      aTile + ", \"dst\": " + sA +
      "}, {\"op\": \"dma_copy\", \"engine\": \"scalar\", \"loc\": 0, "
      "\"src\": " +
      bTile + ", \"dst\": " + sB +
      "}, {\"op\": \"matmul\", \"engine\": \"tensor\", \"loc\": 1, "
      "\"accumulate\": true, \"stationary\": " +
      sA + ", \"moving\": " + sB + ", \"dst\": " + ps + "}";
  std::string body =
      "{\"loop\": 0, \"count\": " + s(mTiles) +
      ", \"body\": [{\"loop\": 1, \"count\": " + s(nTiles / 2) +
      ", \"body\": [{\"loop\": 2, \"count\": 2, \"body\": ["
      "{\"loop\": 3, \"count\": " +
      s(kTiles / 2) + ", \"body\": [{\"loop\": 4, \"count\": 2, \"body\": [" +
      kBody +
      "]}]}, {\"op\": \"copy\", \"engine\": \"vector\", \"loc\": 2, "
      "\"src\": " +
      ps + ", \"dst\": " + out +
      "}, {\"op\": \"dma_copy\", \"engine\": \"sync\", \"loc\": 2, "
      "\"src\": " +
      out + ", \"dst\": " + cTile + "}]}]}]}";
  return "{\"format\": \"torchneuron-kernel-program\", \"version\": 1, "
         "\"name\": \"gemm\", \"target\": \"" +
         target + "\", \"buffers\": [" + buffers +
         "], \"inputs\": [0, 1], \"outputs\": [2], \"locations\": "
         "[\"gemm.py:1\", \"gemm.py:2\", \"gemm.py:3\"], \"body\": [" +
         body + "]}";
}

/// Softmax-like rows: per [128, 512] f32 tile, load, exp (ScalarE), row
/// sum (VectorE), divide by it (VectorE), store. `passes` passes over 4096
/// tiles (2 GiB of HBM), double-buffered in SBUF. With `explicitSync` the
/// program carries its waits; a wait covers every earlier instance of an
/// instruction, so each buffer gets instructions of its own (the pair loop
/// unrolled) to keep the two buffers overlapping.
std::string softmaxProgram(const std::string &target, long long passes,
                           bool explicitSync = false) {
  auto s = [](long long v) { return std::to_string(v); };
  const long long tiles = 4096, width = 512 * tiles;
  std::string buffers =
      buffer(0, "hbm", "input", "f32", "[128, " + s(width) + "]") + "," +
      buffer(1, "hbm", "output", "f32", "[128, " + s(width) + "]") + "," +
      buffer(2, "sbuf", "scratch", "f32", "[128, 1024]") + "," +
      buffer(3, "sbuf", "scratch", "f32", "[128, 1024]") + "," +
      buffer(4, "sbuf", "scratch", "f32", "[128, 2]");
  // Loop ids: 0 = pass, 1 = tile pair, 2 = tile within the pair (when not
  // unrolled). The body for tile `slot` of the pair, or with `looped` for
  // both (iv 2); `first` is its load's static index.
  auto tileBody = [&](long long slot, bool looped, long long first) {
    auto waits = [&](std::initializer_list<long long> list) {
      if (!explicitSync)
        return std::string();
      std::string out = "\"waits\": [";
      for (long long k : list)
        out += (out.back() == '[' ? "" : ", ") + s(first + k);
      return out + "], ";
    };
    std::string hbm = looped ? "[[1, 1024], [2, 512]]" : "[[1, 1024]]";
    std::string tileTerms = looped ? "[[2, 512]]" : "[]";
    std::string x = view(2, "[128, 512]", "[1024, 1]", 512 * slot, tileTerms);
    std::string e = view(3, "[128, 512]", "[1024, 1]", 512 * slot, tileTerms);
    std::string sum =
        view(4, "[128, 1]", "[2, 1]", slot, looped ? "[[2, 1]]" : "[]");
    // Each waits for its producers, the earlier readers and writers of what
    // it writes on other queues, and (DMAs) its own earlier instances.
    return "{" + waits({0, 1}) +
           "\"op\": \"dma_copy\", \"engine\": \"sync\", \"loc\": 0, "
           "\"src\": " +
           view(0, "[128, 512]", "[" + s(width) + ", 1]", 512 * slot, hbm) +
           ", \"dst\": " + x + "}, {" + waits({0, 2, 3, 4}) +
           "\"op\": \"activation\", \"engine\": \"scalar\", \"loc\": 1, "
           "\"func\": \"exp\", \"src\": " +
           x + ", \"dst\": " + e + "}, {" + waits({1}) +
           "\"op\": \"tensor_reduce\", \"engine\": \"vector\", \"loc\": 1, "
           "\"alu_op\": \"add\", \"src\": " +
           e + ", \"dst\": " + sum + "}, {" + waits({1, 4}) +
           "\"op\": \"tensor_scalar\", \"engine\": \"vector\", \"loc\": 2, "
           "\"alu_op\": \"divide\", \"src\": " +
           e + ", \"scalar\": " + sum + ", \"dst\": " + e + "}, {" +
           waits({3, 4}) +
           "\"op\": \"dma_copy\", \"engine\": \"scalar\", \"loc\": 2, "
           "\"src\": " +
           e + ", \"dst\": " +
           view(1, "[128, 512]", "[" + s(width) + ", 1]", 512 * slot, hbm) +
           "}";
  };
  std::string pair = explicitSync
                         ? tileBody(0, false, 0) + ", " + tileBody(1, false, 5)
                         : "{\"loop\": 2, \"count\": 2, \"body\": [" +
                               tileBody(0, true, 0) + "]}";
  return "{\"format\": \"torchneuron-kernel-program\", \"version\": 1, "
         "\"name\": \"softmax\", \"target\": \"" +
         target + "\", " + (explicitSync ? "\"sync\": \"explicit\", " : "") +
         "\"buffers\": [" + buffers +
         "], \"inputs\": [0], \"outputs\": [1], \"locations\": "
         "[\"softmax.py:1\", \"softmax.py:2\", \"softmax.py:3\"], "
         "\"body\": [{\"loop\": 0, \"count\": " +
         s(passes) + ", \"body\": [{\"loop\": 1, \"count\": " + s(tiles / 2) +
         ", \"body\": [" + pair + "]}]}]}";
}

/// Simulates `json` three times with and without events; prints the best.
void bench(const std::string &title, const std::string &json,
           const neuron::target::Target &target) {
  Program program = Program::parse(json);
  program.verify(target);
  std::printf("%s on %s: %lld static instructions\n", title.c_str(),
              target.name.c_str(),
              static_cast<long long>(program.numInstructions()));
  for (bool keepEvents : {false, true}) {
    double best = 1e300;
    Timeline timeline;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      timeline = simulate(program, target, keepEvents);
      auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    }
    double perSecond = static_cast<double>(timeline.instructions) / best;
    std::printf("  keepEvents=%d: %lld dynamic instructions, %zu events in "
                "%.3f s: %.2f million instructions/s\n",
                keepEvents ? 1 : 0,
                static_cast<long long>(timeline.instructions),
                timeline.events.size(), best, perSecond / 1e6);
    if (!keepEvents) {
      const auto &busy = timeline.engineBusyNs;
      std::printf("  simulated: %.3f ms device time, %.1f TFLOPS, %.1f GB/s "
                  "HBM, bound by %s (tensor %.0f%%, vector %.0f%%, scalar "
                  "%.0f%%, dma %.0f%%, hbm %.0f%%)\n",
                  timeline.totalNs / 1e6,
                  timeline.flops / timeline.totalNs / 1e3,
                  timeline.hbmBytes / timeline.totalNs, timeline.bound.c_str(),
                  100 * busy.at("tensor") / timeline.totalNs,
                  100 * busy.at("vector") / timeline.totalNs,
                  100 * busy.at("scalar") / timeline.totalNs,
                  100 * busy.at("dma") / timeline.totalNs,
                  100 * busy.at("hbm") / timeline.totalNs);
    }
  }
}

} // namespace

int main(int argc, char **argv) {
  std::string targetName = argc > 1 ? argv[1] : "trn2";
  long long scale = argc > 2 ? std::atoll(argv[2]) : 256;
  if (scale < 1)
    scale = 1;
  const long long nTiles = 128, kTiles = 96;
  try {
    const neuron::target::Target &target =
        neuron::target::getTarget(targetName);
    bench("tiled GEMM M=" + std::to_string(128 * scale) +
              " N=" + std::to_string(512 * nTiles) +
              " K=" + std::to_string(128 * kTiles) + " bf16",
          gemmProgram(targetName, scale, nTiles, kTiles), target);
    const long long passes = 2 * scale;
    bench("softmax rows, " + std::to_string(passes * 4096) +
              " tiles of [128, 512] f32",
          softmaxProgram(targetName, passes), target);
    bench("softmax rows, explicit sync",
          softmaxProgram(targetName, passes, true), target);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "neuron-timing-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
