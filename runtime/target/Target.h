//===- Target.h - Hardware figures of one Trainium core ---------*- C++ -*-===//
//
// One Target per chip generation (trn2 = NeuronCore-v3, trn3 = NeuronCore-v4).
// The figures live in data files next to this header (trn2.json, trn3.json),
// each value with its kind and source (keys S1-S32 of
// shared/reference/trainium.md; docs/FIDELITY.md lists them and how close
// the model comes to each published figure). The files are embedded into
// the library at build time so the runtime is self-contained; setting
// TORCHNEURON_TARGET_DIR makes the runtime read <dir>/<name>.json instead.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_TARGET_TARGET_H
#define NEURON_RUNTIME_TARGET_TARGET_H

#include "runtime/program/Error.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace neuron::target {

/// Thrown by getTarget for a name with no data file.
class UnknownTarget : public neuron::runtime::Error {
public:
  using neuron::runtime::Error::Error;
};

/// What a figure rests on. Calibration reports (scripts/fidelity.py) and
/// reviewers read it; the model itself treats every kind alike.
enum class FigureKind {
  Documented, ///< stated in the cited source
  Derived,    ///< arithmetic on documented figures
  Fitted,     ///< chosen so the model reproduces a published figure (fitTo)
  Estimated,  ///< undocumented: an assumption, configurable
};

/// "documented", "derived", "fitted" or "estimated".
const char *figureKindName(FigureKind kind);

/// One entry of a target data file:
///   {"value": 23, "kind": "documented", "source": "S8, S9: ..."}
///   {"value": 30, "kind": "fitted", "source": "...", "fit_to": "S9 ..."}
struct Figure {
  double value = 0;
  FigureKind kind = FigureKind::Estimated;
  std::string source;
  /// Fitted figures only: the published figure the value was chosen to
  /// reproduce (so a test of that figure confirms the fit, nothing more).
  std::string fitTo;
};

struct Target {
  std::string name;
  std::string description;
  /// What torch.neuron.get_device_name() says ("AWS Trainium2 NeuronCore-v3").
  std::string deviceName;

  // Geometry and on-chip memory. sbufBytesPerPartition is what a program may
  // allocate (the total minus the runtime's reservations).
  int partitions = 0;
  int64_t sbufBytesPerPartition = 0;
  int64_t sbufTotalBytesPerPartition = 0;
  int64_t psumBytesPerPartition = 0;
  int psumBanks = 0;
  int64_t psumBankBytes = 0;

  // TensorE tile limits (one matmul instruction).
  int64_t matmulMaxK = 0;
  int64_t matmulMaxStationaryFree = 0;
  int64_t matmulMaxMovingFree = 0;

  // DMA efficiency knees (bytes per partition per transfer).
  int64_t dmaPreferredBytesPerPartition = 0;
  int64_t dmaSaturationBytesPerPartition = 0;

  // Clocks.
  double tensorClockGHz = 0;
  double vectorClockGHz = 0;
  double scalarClockGHz = 0;
  double gpsimdClockGHz = 0;
  double syncClockGHz = 0;

  // DMA engines and HBM.
  int dmaEngines = 0;
  int dmaQueuesPerEngine = 0;
  double dmaBytesPerNsPerEngine = 0;
  double dmaFixedLatencyNs = 0;
  double dmaHwdgeIssueNs = 0;
  double hbmChipBytesPerNs = 0;
  int64_t hbmBytesPerCore = 0;
  int coresPerChip = 0;

  /// Every entry of the data file (including the ones above), for figures
  /// that only the timing model needs (cost formulas, throttling, ...).
  std::map<std::string, Figure> figures;

  bool hasFigure(const std::string &key) const;
  /// Throws neuron::runtime::Error naming the key if the file lacks it.
  const Figure &figure(const std::string &key) const;
  double value(const std::string &key) const { return figure(key).value; }

  /// Dense bf16 TensorE peak of one core: a partitions x stationary-free PE
  /// array, 2 FLOPs per MAC per cycle.
  double peakFlopsPerSecond() const;
  /// Contraction rows one TensorE instruction takes per partition for fp8
  /// operands (FP8 double_row: 2), 1 on a target without such a mode; the
  /// FP8 peak is peakFlopsPerSecond() times this.
  int64_t matmulFp8KFactor() const;
  /// Contraction rows per partition of an MX matmul (MXFP8 quad mode: 4),
  /// 0 on a target without MX; the MXFP8 peak is peakFlopsPerSecond() times
  /// this.
  int64_t matmulMxKFactor() const;
  /// The core's HBM roofline: its DMA engines, capped by its HBM share.
  double peakHbmBytesPerSecond() const;
};

/// OCP MX: the values of K that share one E8M0 scale. An MX matmul packs
/// matmulMxKFactor() of them per partition, so a scale covers kMxBlock /
/// matmulMxKFactor() partitions (NKI: 8 x 4 values).
inline constexpr int64_t kMxBlock = 32;

/// Parses a target data file. `origin` names the file in error messages.
/// Throws neuron::runtime::Error on malformed JSON, a missing required
/// figure, a figure without "kind" or "source" (or a fitted one without
/// "fit_to"), or a non-integral integer figure.
Target parseTarget(const std::string &json, const std::string &origin);

/// The target called `name` (e.g. "trn2"). Loaded once and cached; the
/// reference stays valid for the life of the process. Throws UnknownTarget.
const Target &getTarget(const std::string &name);

/// Names of the available targets, sorted.
std::vector<std::string> targetNames();

} // namespace neuron::target

#endif // NEURON_RUNTIME_TARGET_TARGET_H
