//===- Target.cpp - Hardware figures of one Trainium core -----------------===//

#include "runtime/target/Target.h"
#include "runtime/target/EmbeddedTargets.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>

namespace neuron::target {

using neuron::runtime::Error;
using json = nlohmann::json;

const char *figureKindName(FigureKind kind) {
  switch (kind) {
  case FigureKind::Documented:
    return "documented";
  case FigureKind::Derived:
    return "derived";
  case FigureKind::Fitted:
    return "fitted";
  case FigureKind::Estimated:
    return "estimated";
  }
  return "estimated";
}

bool Target::hasFigure(const std::string &key) const {
  return figures.count(key) != 0;
}

const Figure &Target::figure(const std::string &key) const {
  auto it = figures.find(key);
  if (it == figures.end())
    throw Error("target '" + name + "' has no figure '" + key + "'");
  return it->second;
}

namespace {

const Figure &required(const Target &target, const std::string &key,
                       const std::string &origin) {
  auto it = target.figures.find(key);
  if (it == target.figures.end())
    throw Error(origin + ": missing required figure '" + key + "'");
  return it->second;
}

int64_t requiredInt(const Target &target, const std::string &key,
                    const std::string &origin) {
  double value = required(target, key, origin).value;
  // 2^62 keeps the cast exact and far from overflow.
  if (value != std::floor(value) || value < 0 || value > 4.6e18)
    throw Error(origin + ": figure '" + key +
                "' must be a non-negative integer");
  return static_cast<int64_t>(value);
}

int requiredSmallInt(const Target &target, const std::string &key,
                     const std::string &origin) {
  int64_t value = requiredInt(target, key, origin);
  if (value > std::numeric_limits<int>::max())
    throw Error(origin + ": figure '" + key + "' is too large");
  return static_cast<int>(value);
}

double requiredPositive(const Target &target, const std::string &key,
                        const std::string &origin) {
  double value = required(target, key, origin).value;
  if (!(value > 0))
    throw Error(origin + ": figure '" + key + "' must be positive");
  return value;
}

Target parseTargetJson(const json &doc, const std::string &origin) {
  if (!doc.is_object())
    throw Error(origin + ": target file must be a JSON object");
  Target target;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string &key = it.key();
    const json &entry = it.value();
    if (key == "name" || key == "description" || key == "device_name") {
      if (!entry.is_string())
        throw Error(origin + ": '" + key + "' must be a string");
      (key == "name"          ? target.name
       : key == "description" ? target.description
                              : target.deviceName) = entry.get<std::string>();
      continue;
    }
    // Every figure says what it rests on, so the provenance survives into
    // the runtime and the fidelity report.
    if (!entry.is_object() || !entry.contains("value") ||
        !entry.contains("kind") || !entry.contains("source"))
      throw Error(origin + ": figure '" + key +
                  "' must be {\"value\": number, \"kind\": string, "
                  "\"source\": string}");
    for (auto field = entry.begin(); field != entry.end(); ++field)
      if (field.key() != "value" && field.key() != "kind" &&
          field.key() != "source" && field.key() != "fit_to")
        throw Error(origin + ": figure '" + key + "' has unknown field '" +
                    field.key() + "'");
    const json &value = entry["value"];
    const json &kind = entry["kind"];
    const json &source = entry["source"];
    if (!value.is_number() || !kind.is_string() || !source.is_string())
      throw Error(origin + ": figure '" + key +
                  "' needs a numeric value, a string kind and a string source");
    double number = value.get<double>();
    if (!std::isfinite(number))
      throw Error(origin + ": figure '" + key + "' is not finite");
    Figure figure{number, FigureKind::Estimated, source.get<std::string>(),
                  ""};
    std::string kindName = kind.get<std::string>();
    const FigureKind kinds[] = {FigureKind::Documented, FigureKind::Derived,
                                FigureKind::Fitted, FigureKind::Estimated};
    bool known = false;
    for (FigureKind k : kinds)
      if (kindName == figureKindName(k)) {
        figure.kind = k;
        known = true;
      }
    if (!known)
      throw Error(origin + ": figure '" + key + "' has kind '" + kindName +
                  "' (expected documented, derived, fitted or estimated)");
    if (figure.source.empty())
      throw Error(origin + ": figure '" + key + "' has an empty source");
    // A fitted figure names what it was fitted to: a test of that figure
    // only confirms the fit, and the report must be able to say so.
    bool fitted = figure.kind == FigureKind::Fitted;
    if (fitted != entry.contains("fit_to"))
      throw Error(origin + ": figure '" + key + "': " +
                  (fitted ? "a fitted figure needs \"fit_to\" (the published "
                            "figure it reproduces)"
                          : "only a fitted figure has \"fit_to\""));
    if (fitted) {
      if (!entry["fit_to"].is_string() ||
          entry["fit_to"].get<std::string>().empty())
        throw Error(origin + ": figure '" + key +
                    "': \"fit_to\" must be a non-empty string");
      figure.fitTo = entry["fit_to"].get<std::string>();
    }
    target.figures[key] = std::move(figure);
  }
  if (target.name.empty())
    throw Error(origin + ": missing 'name'");

  target.partitions = requiredSmallInt(target, "partitions", origin);
  target.sbufBytesPerPartition =
      requiredInt(target, "sbuf_bytes_per_partition", origin);
  target.sbufTotalBytesPerPartition =
      requiredInt(target, "sbuf_total_bytes_per_partition", origin);
  target.psumBytesPerPartition =
      requiredInt(target, "psum_bytes_per_partition", origin);
  target.psumBanks = requiredSmallInt(target, "psum_banks", origin);
  target.psumBankBytes = requiredInt(target, "psum_bank_bytes", origin);
  target.matmulMaxK = requiredInt(target, "matmul_max_k", origin);
  target.matmulMaxStationaryFree =
      requiredInt(target, "matmul_max_stationary_free", origin);
  target.matmulMaxMovingFree =
      requiredInt(target, "matmul_max_moving_free", origin);
  target.dmaPreferredBytesPerPartition =
      requiredInt(target, "dma_preferred_bytes_per_partition", origin);
  target.dmaSaturationBytesPerPartition =
      requiredInt(target, "dma_saturation_bytes_per_partition", origin);
  target.tensorClockGHz = requiredPositive(target, "tensor_clock_ghz", origin);
  target.vectorClockGHz = requiredPositive(target, "vector_clock_ghz", origin);
  target.scalarClockGHz = requiredPositive(target, "scalar_clock_ghz", origin);
  target.gpsimdClockGHz = requiredPositive(target, "gpsimd_clock_ghz", origin);
  target.syncClockGHz = requiredPositive(target, "sync_clock_ghz", origin);
  target.dmaEngines = requiredSmallInt(target, "dma_engines", origin);
  target.dmaQueuesPerEngine =
      requiredSmallInt(target, "dma_queues_per_engine", origin);
  target.dmaBytesPerNsPerEngine =
      requiredPositive(target, "dma_bytes_per_ns_per_engine", origin);
  target.dmaFixedLatencyNs =
      required(target, "dma_fixed_latency_ns", origin).value;
  target.dmaHwdgeIssueNs = required(target, "dma_hwdge_issue_ns", origin).value;
  target.hbmChipBytesPerNs =
      requiredPositive(target, "hbm_chip_bytes_per_ns", origin);
  target.hbmBytesPerCore = requiredInt(target, "hbm_bytes_per_core", origin);
  target.coresPerChip = requiredSmallInt(target, "cores_per_chip", origin);

  if (target.partitions < 1)
    throw Error(origin + ": 'partitions' must be at least 1");
  if (target.psumBanks < 1 ||
      target.psumBanks * target.psumBankBytes != target.psumBytesPerPartition)
    throw Error(origin + ": psum_banks * psum_bank_bytes must equal "
                         "psum_bytes_per_partition");
  if (target.sbufBytesPerPartition > target.sbufTotalBytesPerPartition)
    throw Error(origin + ": sbuf_bytes_per_partition exceeds "
                         "sbuf_total_bytes_per_partition");
  return target;
}

/// A target name is a file stem; refusing separators keeps
/// TORCHNEURON_TARGET_DIR lookups inside that directory.
bool isValidTargetName(const std::string &name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

std::string overrideDir() {
  const char *dir = std::getenv("TORCHNEURON_TARGET_DIR");
  return dir ? std::string(dir) : std::string();
}

std::string joinNames(const std::vector<std::string> &names) {
  std::string out;
  for (const std::string &name : names)
    out += (out.empty() ? "" : ", ") + name;
  return out;
}

} // namespace

Target parseTarget(const std::string &text, const std::string &origin) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception &e) {
    throw Error(origin + ": malformed target file: " + e.what());
  }
  return parseTargetJson(doc, origin);
}

std::vector<std::string> targetNames() {
  std::vector<std::string> names;
  std::string dir = overrideDir();
  if (dir.empty()) {
    for (size_t i = 0; i < detail::kNumEmbeddedTargets; ++i)
      names.push_back(detail::kEmbeddedTargets[i].name);
  } else {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::filesystem::path &path = it->path();
      if (path.extension() == ".json" &&
          isValidTargetName(path.stem().string()))
        names.push_back(path.stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

const Target &getTarget(const std::string &name) {
  // Targets are never evicted, so returned references stay valid.
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Target>> cache;

  std::string dir = overrideDir();
  std::string key =
      (dir.empty() ? std::string("<embedded>") : dir) + "\n" + name;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end())
    return *it->second;

  auto unknown = [&]() {
    std::string where = dir.empty() ? std::string("built-in targets")
                                    : "TORCHNEURON_TARGET_DIR=" + dir;
    return UnknownTarget("unknown target '" + name + "' (" + where +
                         "; available: " + joinNames(targetNames()) + ")");
  };
  if (!isValidTargetName(name))
    throw unknown();

  std::string text;
  std::string origin;
  if (dir.empty()) {
    const detail::EmbeddedTarget *found = nullptr;
    for (size_t i = 0; i < detail::kNumEmbeddedTargets; ++i)
      if (name == detail::kEmbeddedTargets[i].name)
        found = &detail::kEmbeddedTargets[i];
    if (!found)
      throw unknown();
    text = found->json;
    origin = "built-in target " + name + ".json";
  } else {
    std::filesystem::path path = std::filesystem::path(dir) / (name + ".json");
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw unknown();
    std::ostringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
    origin = path.string();
  }

  Target target = parseTarget(text, origin);
  if (target.name != name)
    throw Error(origin + ": 'name' is '" + target.name + "', expected '" +
                name + "'");
  auto inserted =
      cache.emplace(key, std::make_unique<Target>(std::move(target)));
  return *inserted.first->second;
}

double Target::peakFlopsPerSecond() const {
  return 2.0 * partitions * matmulMaxStationaryFree * tensorClockGHz * 1e9;
}

int64_t Target::matmulFp8KFactor() const {
  return hasFigure("matmul_fp8_k_factor")
             ? static_cast<int64_t>(value("matmul_fp8_k_factor"))
             : 1;
}

int64_t Target::matmulMxKFactor() const {
  return hasFigure("matmul_mx_k_factor")
             ? static_cast<int64_t>(value("matmul_mx_k_factor"))
             : 0;
}

double Target::peakHbmBytesPerSecond() const {
  double dma = dmaEngines * dmaBytesPerNsPerEngine;
  double hbm = hbmChipBytesPerNs / value("hbm_sharing_cores");
  return std::min(dma, hbm) * 1e9;
}

} // namespace neuron::target
