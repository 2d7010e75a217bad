//===- TargetTest.cpp - Target figures and data files ---------------------===//

#include "runtime/target/Target.h"
#include "tests/unit/CatchCompat.h"
#include "tests/unit/TestUtil.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

using neuron::target::FigureKind;
using neuron::target::figureKindName;
using neuron::target::getTarget;
using neuron::target::parseTarget;
using neuron::target::Target;
using neuron::target::targetNames;
using neuron::target::UnknownTarget;
using neuron::test::contains;
using neuron::test::errorOf;

namespace {

/// Sets TORCHNEURON_TARGET_DIR for one scope.
class ScopedTargetDir {
public:
  explicit ScopedTargetDir(const std::string &dir) {
    ::setenv("TORCHNEURON_TARGET_DIR", dir.c_str(), 1);
  }
  ~ScopedTargetDir() { ::unsetenv("TORCHNEURON_TARGET_DIR"); }
};

/// A target file with every figure of `from`, renamed, with overrides.
std::string targetFile(const Target &from, const std::string &name,
                       const std::map<std::string, double> &overrides = {}) {
  nlohmann::json doc;
  doc["name"] = name;
  doc["description"] = "test target";
  for (const auto &[key, figure] : from.figures) {
    double value = overrides.count(key) ? overrides.at(key) : figure.value;
    doc[key] = {{"value", value},
                {"kind", figureKindName(figure.kind)},
                {"source", figure.source}};
    if (!figure.fitTo.empty())
      doc[key]["fit_to"] = figure.fitTo;
  }
  return doc.dump(2);
}

std::filesystem::path makeTempDir(const std::string &tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("neuron-target-test-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

} // namespace

TEST_CASE("built-in targets are listed", "[target]") {
  std::vector<std::string> names = targetNames();
  CHECK(std::find(names.begin(), names.end(), "trn2") != names.end());
  CHECK(std::find(names.begin(), names.end(), "trn3") != names.end());
  CHECK(std::is_sorted(names.begin(), names.end()));
}

TEST_CASE("trn2 figures follow trainium.md", "[target]") {
  const Target &t = getTarget("trn2");
  CHECK(t.name == "trn2");
  CHECK(t.partitions == 128);
  CHECK(t.sbufBytesPerPartition == 212728); // 224 KiB minus reservations
  CHECK(t.sbufTotalBytesPerPartition == 224 * 1024);
  CHECK(t.psumBytesPerPartition == 16 * 1024);
  CHECK(t.psumBanks == 8);
  CHECK(t.psumBankBytes == 2048);
  CHECK(t.matmulMaxK == 128);
  CHECK(t.matmulMaxStationaryFree == 128);
  CHECK(t.matmulMaxMovingFree == 512);
  CHECK(t.dmaPreferredBytesPerPartition == 2048);
  CHECK(t.dmaEngines == 16);
  CHECK(t.dmaQueuesPerEngine == 16);
  CHECK(t.dmaBytesPerNsPerEngine == 23);
  CHECK(t.dmaFixedLatencyNs == 1300);
  CHECK(t.tensorClockGHz == 2.4);
  CHECK(t.vectorClockGHz == 0.96);
  CHECK(t.scalarClockGHz == 1.2);
  CHECK(t.hbmBytesPerCore == 12LL * 1024 * 1024 * 1024);
  CHECK(t.figure("sbuf_bytes_per_partition").kind == FigureKind::Documented);
  CHECK(contains(t.figure("sbuf_bytes_per_partition").source, "S24"));
  // Fitted to the S9 efficiency curve; the tests of that curve are fit
  // points (tests/python/test_fidelity.py), not validation.
  CHECK(t.figure("dma_descriptor_overhead_ns").kind == FigureKind::Fitted);
  CHECK(contains(t.figure("dma_descriptor_overhead_ns").fitTo, "S9"));
  CHECK(t.value("matmul_min_ii_cycles") == 64);
  CHECK(!t.hasFigure("no_such_figure"));
  CHECK(
      contains(errorOf([&] { t.figure("no_such_figure"); }), "no_such_figure"));
}

TEST_CASE("trn3 figures follow trainium.md", "[target]") {
  const Target &t = getTarget("trn3");
  CHECK(t.partitions == 128);
  CHECK(t.sbufTotalBytesPerPartition == 256 * 1024);
  CHECK(t.sbufBytesPerPartition < t.sbufTotalBytesPerPartition);
  CHECK(t.psumBytesPerPartition == 16 * 1024);
  CHECK(t.matmulMaxMovingFree == 4096);
  CHECK(t.dmaBytesPerNsPerEngine == 33);
  CHECK(t.vectorClockGHz == 1.2);
  CHECK(t.figure("sbuf_bytes_per_partition").kind == FigureKind::Estimated);
}

TEST_CASE("every figure says its kind and source", "[target]") {
  for (const std::string &name : targetNames()) {
    const Target &t = getTarget(name);
    CHECK(t.figures.size() > 40);
    for (const auto &[key, figure] : t.figures) {
      INFO(name << "." << key << ": " << figure.source);
      CHECK(!figure.source.empty());
      // Documented and derived figures cite a source key of trainium.md
      // section 0 (S1-S32), listed with its address in docs/FIDELITY.md.
      if (figure.kind == FigureKind::Documented ||
          figure.kind == FigureKind::Derived)
        CHECK((figure.source.size() > 1 && figure.source[0] == 'S' &&
               figure.source[1] >= '1' && figure.source[1] <= '9'));
      CHECK((figure.kind == FigureKind::Fitted) == !figure.fitTo.empty());
    }
  }
}

TEST_CASE("targets are cached", "[target]") {
  CHECK(&getTarget("trn2") == &getTarget("trn2"));
}

TEST_CASE("unknown targets throw UnknownTarget", "[target]") {
  CHECK_THROWS_AS(getTarget("trn9"), UnknownTarget);
  CHECK_THROWS_AS(getTarget("../trn2"), UnknownTarget);
  CHECK_THROWS_AS(getTarget(""), UnknownTarget);
  std::string message = errorOf([] { getTarget("trn9"); });
  CHECK(contains(message, "trn9"));
  CHECK(contains(message, "trn2")); // lists what is available
}

TEST_CASE("TORCHNEURON_TARGET_DIR overrides the built-in files", "[target]") {
  std::filesystem::path dir = makeTempDir("override");
  {
    std::ofstream out(dir / "tiny.json");
    out << targetFile(getTarget("trn2"), "tiny", {{"partitions", 64}});
  }
  {
    std::ofstream out(dir / "wrongname.json");
    out << targetFile(getTarget("trn2"), "other");
  }
  {
    std::ofstream out(dir / "broken.json");
    out << "{\"name\": \"broken\", ";
  }
  {
    ScopedTargetDir scoped(dir.string());
    std::vector<std::string> names = targetNames();
    CHECK(names == std::vector<std::string>{"broken", "tiny", "wrongname"});
    const Target &tiny = getTarget("tiny");
    CHECK(tiny.partitions == 64);
    CHECK(tiny.sbufBytesPerPartition == 212728);
    CHECK_THROWS_AS(getTarget("trn2"), UnknownTarget);
    CHECK(contains(errorOf([] { getTarget("wrongname"); }), "expected"));
    CHECK(contains(errorOf([] { getTarget("broken"); }), "malformed"));
  }
  CHECK(getTarget("trn2").partitions == 128);
  std::filesystem::remove_all(dir);
}

TEST_CASE("malformed target files are rejected", "[target]") {
  const Target &trn2 = getTarget("trn2");
  CHECK(contains(errorOf([] { parseTarget("{", "x.json"); }), "x.json"));
  CHECK(contains(errorOf([] { parseTarget("[1, 2]", "x.json"); }), "object"));
  CHECK(contains(errorOf([&] {
                   parseTarget(targetFile(trn2, "t", {{"partitions", 128.5}}),
                               "x.json");
                 }),
                 "partitions"));
  CHECK(contains(errorOf([&] {
                   parseTarget(targetFile(trn2, "t", {{"psum_banks", 7}}),
                               "x.json");
                 }),
                 "psum_banks"));
  nlohmann::json noSource = nlohmann::json::parse(targetFile(trn2, "t"));
  noSource["partitions"].erase("source");
  CHECK(contains(errorOf([&] { parseTarget(noSource.dump(), "x.json"); }),
                 "source"));
  nlohmann::json noKind = nlohmann::json::parse(targetFile(trn2, "t"));
  noKind["partitions"].erase("kind");
  CHECK(contains(errorOf([&] { parseTarget(noKind.dump(), "x.json"); }),
                 "kind"));
  nlohmann::json badKind = nlohmann::json::parse(targetFile(trn2, "t"));
  badKind["partitions"]["kind"] = "guessed";
  CHECK(contains(errorOf([&] { parseTarget(badKind.dump(), "x.json"); }),
                 "guessed"));
  nlohmann::json unfitted = nlohmann::json::parse(targetFile(trn2, "t"));
  unfitted["dma_descriptor_overhead_ns"].erase("fit_to");
  CHECK(contains(errorOf([&] { parseTarget(unfitted.dump(), "x.json"); }),
                 "fit_to"));
  nlohmann::json strayFit = nlohmann::json::parse(targetFile(trn2, "t"));
  strayFit["partitions"]["fit_to"] = "S5";
  CHECK(contains(errorOf([&] { parseTarget(strayFit.dump(), "x.json"); }),
                 "only a fitted figure"));
  nlohmann::json extra = nlohmann::json::parse(targetFile(trn2, "t"));
  extra["partitions"]["tag"] = "D";
  CHECK(contains(errorOf([&] { parseTarget(extra.dump(), "x.json"); }),
                 "unknown field 'tag'"));
  nlohmann::json missing = nlohmann::json::parse(targetFile(trn2, "t"));
  missing.erase("matmul_max_k");
  CHECK(contains(errorOf([&] { parseTarget(missing.dump(), "x.json"); }),
                 "matmul_max_k"));
  Target parsed = parseTarget(targetFile(trn2, "t"), "x.json");
  CHECK(parsed.matmulMaxMovingFree == 512);
  CHECK(parsed.figure("dma_descriptor_overhead_ns").fitTo ==
        trn2.figure("dma_descriptor_overhead_ns").fitTo);
}
