//===- Generator.cpp - The neuron random number generator -----------------===//

#include "runtime/device/Generator.h"

#include "runtime/device/Device.h"

#include <ATen/ATen.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace neuron::device {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

} // namespace

uint64_t philoxSubstreamSeed(uint64_t seed, uint64_t offset) {
  return splitmix64(splitmix64(seed) ^ offset);
}

NeuronGenerator::NeuronGenerator(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kDeviceType, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NeuronGenerator::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t NeuronGenerator::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom();
  set_current_seed(s);
  return s;
}

void NeuronGenerator::set_state(const c10::TensorImpl &state) {
  TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  state.numel() == 16 && state.is_contiguous() &&
                  state.device().is_cpu(),
              "a neuron generator state is a contiguous CPU uint8 tensor of "
              "16 bytes (seed, offset)");
  const auto *bytes = static_cast<const uint8_t *>(state.data());
  uint64_t seed, offset;
  std::memcpy(&seed, bytes, 8);
  std::memcpy(&offset, bytes + 8, 8);
  seed_ = seed;
  offset_ = offset;
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGenerator::get_state() const {
  at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  auto *bytes = state.data_ptr<uint8_t>();
  std::memcpy(bytes, &seed_, 8);
  std::memcpy(bytes + 8, &offset_, 8);
  return state.getIntrusivePtr();
}

uint64_t NeuronGenerator::nextSubstreamSeed() {
  return philoxSubstreamSeed(seed_, offset_++);
}

NeuronGenerator *NeuronGenerator::clone_impl() const {
  auto *copy = new NeuronGenerator(device().index(), seed_);
  copy->offset_ = offset_;
  return copy;
}

const at::Generator &defaultGenerator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::vector<at::Generator> generators;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i)
      generators.push_back(at::make_generator<NeuronGenerator>(i));
  });
  device = resolveDevice(device);
  return generators.at(device);
}

at::Generator newGenerator(c10::DeviceIndex device) {
  device = resolveDevice(device);
  return at::make_generator<NeuronGenerator>(device);
}

} // namespace neuron::device
