//===- Philox.h - the counter-based PRNG behind the rand instruction ------===//
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11): a keyed bijection of a 128-bit counter, so element i of a
// random tensor is a pure function of (seed, i) whatever the tiling, the
// engine or the order of the instructions. torchneuron's Python reference
// (python/torchneuron/rng.py) computes the same numbers.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_EXEC_PHILOX_H
#define NEURON_RUNTIME_EXEC_PHILOX_H

#include <array>
#include <cstdint>

namespace neuron::runtime {

using PhiloxBlock = std::array<uint32_t, 4>;

/// Ten rounds of Philox4x32 on `counter` under `key`.
inline PhiloxBlock philox4x32(PhiloxBlock counter,
                              std::array<uint32_t, 2> key) {
  constexpr uint64_t kMul0 = 0xD2511F53, kMul1 = 0xCD9E8D57;
  constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    uint64_t p0 = kMul0 * counter[0], p1 = kMul1 * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0],
               static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1],
               static_cast<uint32_t>(p0)};
  }
  return counter;
}

/// The rand instruction's value for element `index` of stream `stream`: the
/// first output word's top 24 bits as a float in [0, 1) (exact in fp32).
inline float philoxUniform(uint32_t seedLo, uint32_t seedHi, uint64_t index,
                           uint32_t stream) {
  PhiloxBlock out = philox4x32({static_cast<uint32_t>(index),
                                static_cast<uint32_t>(index >> 32), stream, 0},
                               {seedLo, seedHi});
  return static_cast<float>(out[0] >> 8) * (1.0f / 16777216.0f);
}

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_EXEC_PHILOX_H
