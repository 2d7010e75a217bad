//===- Device.cpp - The neuron devices of this process --------------------===//

#include "runtime/device/Device.h"

#include "runtime/target/Target.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <stdexcept>

namespace neuron::device {

namespace {

int parseCore(const std::string &text, const std::string &spec) {
  size_t used = 0;
  int value = -1;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (used != text.size() || text.empty() || value < 0)
    throw std::invalid_argument("TORCHNEURON_VISIBLE_CORES=\"" + spec +
                                "\": \"" + text + "\" is not a core number");
  return value;
}

std::string trim(const std::string &s) {
  size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos)
    return "";
  size_t end = s.find_last_not_of(" \t");
  return s.substr(begin, end - begin + 1);
}

DeviceConfig loadConfig() {
  DeviceConfig result;
  const char *targetEnv = std::getenv("TORCHNEURON_TARGET");
  result.target = targetEnv && *targetEnv ? targetEnv : "trn2";
  try {
    const target::Target &t = target::getTarget(result.target);
    result.hbmBytesPerCore = t.hbmBytesPerCore;
    result.coresPerChip = t.coresPerChip;
    const char *visible = std::getenv("TORCHNEURON_VISIBLE_CORES");
    if (visible) {
      result.coreIds = parseVisibleCores(visible);
    } else {
      for (int i = 0; i < t.coresPerChip; ++i)
        result.coreIds.push_back(i);
    }
    // DeviceIndex is int8_t.
    if (result.coreIds.size() > 64)
      throw std::invalid_argument("at most 64 neuron devices are supported");
  } catch (const std::exception &e) {
    result.coreIds.clear();
    result.error = e.what();
  }
  return result;
}

thread_local c10::DeviceIndex tlsCurrentDevice = 0;

} // namespace

std::vector<int> parseVisibleCores(const std::string &spec) {
  std::vector<int> cores;
  std::set<int> seen;
  size_t start = 0;
  std::string text = trim(spec);
  if (text.empty())
    return cores;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = trim(text.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start));
    size_t dash = item.find('-');
    int first, last;
    if (dash == std::string::npos) {
      first = last = parseCore(item, spec);
    } else {
      first = parseCore(trim(item.substr(0, dash)), spec);
      last = parseCore(trim(item.substr(dash + 1)), spec);
      if (last < first)
        throw std::invalid_argument("TORCHNEURON_VISIBLE_CORES=\"" + spec +
                                    "\": empty range \"" + item + "\"");
    }
    for (int core = first; core <= last; ++core) {
      if (!seen.insert(core).second)
        throw std::invalid_argument("TORCHNEURON_VISIBLE_CORES=\"" + spec +
                                    "\": core " + std::to_string(core) +
                                    " listed twice");
      cores.push_back(core);
    }
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  return cores;
}

const DeviceConfig &config() {
  static const DeviceConfig cfg = loadConfig();
  return cfg;
}

c10::DeviceIndex deviceCount() noexcept {
  return static_cast<c10::DeviceIndex>(config().coreIds.size());
}

void checkDeviceIndex(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < deviceCount(), "neuron device index ",
              static_cast<int>(index),
              " is out of range: ", static_cast<int>(deviceCount()),
              " neuron device(s)",
              config().error.empty() ? "" : " (" + config().error + ")");
}

c10::DeviceIndex resolveDevice(c10::DeviceIndex index) {
  if (index == -1)
    return currentDevice();
  checkDeviceIndex(index);
  return index;
}

c10::DeviceIndex currentDevice() { return tlsCurrentDevice; }

void setCurrentDevice(c10::DeviceIndex index) {
  checkDeviceIndex(index);
  tlsCurrentDevice = index;
}

c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) {
  c10::DeviceIndex previous = tlsCurrentDevice;
  if (index != previous)
    setCurrentDevice(index);
  return previous;
}

} // namespace neuron::device
