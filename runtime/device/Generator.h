//===- Generator.h - The neuron random number generator ---------*- C++ -*-===//
//
// A counter-based generator in the style of CUDA's and the engine's Philox
// `rand` instruction: its state is (seed, offset), 16 bytes, and every random
// op consumes one offset step, so a seed and an offset name one stream of
// numbers exactly. torch.manual_seed seeds every device's default generator
// (torch calls torch.neuron.manual_seed_all).
//
// Today random ops run as CPU fallbacks: each call draws from a CPU generator
// seeded with philoxSubstreamSeed(seed, offset) and then advances the offset.
// When the device runs its own `rand` kernels they take (seed, offset) as is.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_GENERATOR_H
#define NEURON_RUNTIME_DEVICE_GENERATOR_H

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstdint>

namespace neuron::device {

class NeuronGenerator final : public c10::GeneratorImpl {
public:
  explicit NeuronGenerator(c10::DeviceIndex device,
                           uint64_t seed = 67280421310721ULL);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override;
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  /// 16 bytes: seed then offset, little-endian uint64 (a CPU uint8 tensor).
  void set_state(const c10::TensorImpl &state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  /// The seed of the next random op's numbers; advances the offset by one.
  /// Call with `mutex_` held.
  uint64_t nextSubstreamSeed();

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

private:
  NeuronGenerator *clone_impl() const override;

  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// Mixes (seed, offset) into one 64-bit seed (splitmix64 of both words).
uint64_t philoxSubstreamSeed(uint64_t seed, uint64_t offset);

/// The default generator of `device` (-1: the current device).
const at::Generator &defaultGenerator(c10::DeviceIndex device);
at::Generator newGenerator(c10::DeviceIndex device);

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_GENERATOR_H
