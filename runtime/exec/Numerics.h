//===- Numerics.h - Trainium element conversions ----------------*- C++ -*-===//
//
// How the engines read and write each dtype (PROGRAM_FORMAT.md, "Numerics"):
// every operand is widened to fp32 exactly (integers converted), results are
// rounded on store: round-to-nearest-even for bf16/f16/fp8 with NaN kept NaN
// (fp8 overflow as torch's CPU casts do it: f8e4m3fn saturates, f8e5m2 goes
// to infinity), truncation toward zero with saturation for integers (NaN stores
// 0), and value != 0 for bool.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_EXEC_NUMERICS_H
#define NEURON_RUNTIME_EXEC_NUMERICS_H

#include "runtime/program/DType.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace neuron::runtime {

inline uint32_t floatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float bitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

/// fp32 -> bf16 with round-to-nearest-even. Overflow rounds to infinity as
/// RNE does; NaN stays NaN (quieted, sign and top payload bits kept).
inline uint16_t f32ToBf16Bits(float value) {
  uint32_t bits = floatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

inline float bf16BitsToF32(uint16_t bits) {
  return bitsToFloat(static_cast<uint32_t>(bits) << 16);
}

/// fp32 -> IEEE binary16 with round-to-nearest-even, including subnormals;
/// values >= 65520 round to infinity; NaN stays NaN (quieted).
inline uint16_t f32ToF16Bits(float value) {
  uint32_t bits = floatBits(value);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  uint16_t out;
  if (magnitude >= 0x47800000u) { // >= 2^16, inf or NaN: no rounding needed
    if (magnitude > 0x7f800000u)
      out = static_cast<uint16_t>(0x7e00u | ((magnitude >> 13) & 0x3ffu));
    else
      out = 0x7c00u;
  } else if (magnitude < 0x38800000u) {
    // Below 2^-14 the result is subnormal: adding 0.5 aligns the 10 mantissa
    // bits at the bottom of the float, and the FPU's own RNE does the rest.
    float aligned = bitsToFloat(magnitude) + 0.5f;
    out = static_cast<uint16_t>(floatBits(aligned) - 0x3f000000u);
  } else {
    uint32_t mantissaOdd = (magnitude >> 13) & 1u;
    magnitude += 0xc8000fffu + mantissaOdd; // rebias exponent, round half up
    out = static_cast<uint16_t>(magnitude >> 13); // carries into exponent ok
  }
  return static_cast<uint16_t>(out | sign);
}

inline float f16BitsToF32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) // inf / NaN, payload kept
    return bitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in fp32.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return bitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// fp32 -> OCP float8_e4m3fn (bias 7, no infinity, 0x7f/0xff NaN, max 448)
/// with round-to-nearest-even, including subnormals, exactly as torch's
/// c10::Float8_e4m3fn: finite values past 448 (after rounding) and
/// infinities saturate to +-448, NaN stores NaN with its sign.
inline uint8_t f32ToF8E4M3FNBits(float value) {
  uint32_t bits = floatBits(value);
  uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  uint32_t magnitude = bits & 0x7fffffffu;
  uint8_t out;
  if (magnitude > 0x7f800000u) {
    out = 0x7f;
  } else if (magnitude >= 0x43f00000u) { // >= 480: rounds past 448
    out = 0x7e;
  } else if (magnitude < 0x3c800000u) { // < 2^-6: subnormal (or zero)
    // Adding 2^14 (whose fp32 ulp is 2^-9, the smallest subnormal) aligns
    // the 3 mantissa bits at the bottom of the float, as f32ToF16Bits does;
    // the FPU's own RNE rounds.
    float aligned = bitsToFloat(magnitude) + bitsToFloat(141u << 23);
    out = static_cast<uint8_t>(floatBits(aligned) - (141u << 23));
  } else {
    uint32_t mantissaOdd = (magnitude >> 20) & 1u;
    magnitude +=
        (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + mantissaOdd;
    out = static_cast<uint8_t>(magnitude >> 20);
    if (out == 0x7f) // 464 <= x < 480 rounds up into the NaN encoding
      out = 0x7e;
  }
  return static_cast<uint8_t>(out | sign);
}

inline float f8E4M3FNBitsToF32(uint8_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  uint32_t exponent = (bits >> 3) & 0xfu;
  uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xf && mantissa == 0x7)
    return bitsToFloat(sign | 0x7fc00000u);
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-9 is exact in fp32.
    float magnitude = static_cast<float>(mantissa) * 0.001953125f;
    return sign ? -magnitude : magnitude;
  }
  return bitsToFloat(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

/// fp32 -> OCP float8_e5m2 (IEEE-style, bias 15, max 57344) with
/// round-to-nearest-even, including subnormals, exactly as torch's
/// c10::Float8_e5m2: values >= 61440 round to infinity, NaN stays NaN.
inline uint8_t f32ToF8E5M2Bits(float value) {
  uint32_t bits = floatBits(value);
  uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  uint32_t magnitude = bits & 0x7fffffffu;
  uint8_t out;
  if (magnitude >= 0x47800000u) { // >= 65536, inf or NaN
    out = magnitude > 0x7f800000u ? 0x7f : 0x7c;
  } else if (magnitude < 0x38800000u) { // < 2^-14: subnormal (or zero)
    // 2^7's fp32 ulp is 2^-16, the smallest subnormal.
    float aligned = bitsToFloat(magnitude) + bitsToFloat(134u << 23);
    out = static_cast<uint8_t>(floatBits(aligned) - (134u << 23));
  } else {
    uint32_t mantissaOdd = (magnitude >> 21) & 1u;
    magnitude +=
        (static_cast<uint32_t>(15 - 127) << 23) + 0xfffffu + mantissaOdd;
    out = static_cast<uint8_t>(magnitude >> 21); // may carry into infinity
  }
  return static_cast<uint8_t>(out | sign);
}

/// float8_e5m2 is the top byte of an IEEE binary16.
inline float f8E5M2BitsToF32(uint8_t bits) {
  return f16BitsToF32(static_cast<uint16_t>(bits << 8));
}

/// Truncation toward zero with saturation; NaN stores 0.
template <typename IntT> inline IntT f32ToInt(float value) {
  if (std::isnan(value))
    return 0;
  // The bounds are powers of two, exact in float.
  constexpr float upper =
      static_cast<float>(std::numeric_limits<IntT>::max()) + 1.0f;
  constexpr float lower = static_cast<float>(std::numeric_limits<IntT>::min());
  if (value >= upper)
    return std::numeric_limits<IntT>::max();
  if (value <= lower)
    return std::numeric_limits<IntT>::min();
  return static_cast<IntT>(value);
}

/// Same rule from double (memset/iota fills and splats, which must be exact
/// for integers beyond fp32's 24-bit mantissa).
template <typename IntT> inline IntT f64ToInt(double value) {
  if (std::isnan(value))
    return 0;
  constexpr double upper =
      static_cast<double>(std::numeric_limits<IntT>::max()) + 1.0;
  constexpr double lower =
      static_cast<double>(std::numeric_limits<IntT>::min());
  if (value >= upper)
    return std::numeric_limits<IntT>::max();
  if (value <= lower)
    return std::numeric_limits<IntT>::min();
  return static_cast<IntT>(value);
}

/// Per-dtype storage type and conversions, for kernels templated on dtype.
template <DType D> struct DTypeTraits;

template <> struct DTypeTraits<DType::F32> {
  using Storage = float;
  static float load(Storage v) { return v; }
  static Storage store(float v) { return v; }
};
template <> struct DTypeTraits<DType::BF16> {
  using Storage = uint16_t;
  static float load(Storage v) { return bf16BitsToF32(v); }
  static Storage store(float v) { return f32ToBf16Bits(v); }
};
template <> struct DTypeTraits<DType::F16> {
  using Storage = uint16_t;
  static float load(Storage v) { return f16BitsToF32(v); }
  static Storage store(float v) { return f32ToF16Bits(v); }
};
template <> struct DTypeTraits<DType::F8E4M3FN> {
  using Storage = uint8_t;
  static float load(Storage v) { return f8E4M3FNBitsToF32(v); }
  static Storage store(float v) { return f32ToF8E4M3FNBits(v); }
};
template <> struct DTypeTraits<DType::F8E5M2> {
  using Storage = uint8_t;
  static float load(Storage v) { return f8E5M2BitsToF32(v); }
  static Storage store(float v) { return f32ToF8E5M2Bits(v); }
};
template <> struct DTypeTraits<DType::I32> {
  using Storage = int32_t;
  static float load(Storage v) { return static_cast<float>(v); }
  static Storage store(float v) { return f32ToInt<int32_t>(v); }
};
template <> struct DTypeTraits<DType::I64> {
  using Storage = int64_t;
  static float load(Storage v) { return static_cast<float>(v); }
  static Storage store(float v) { return f32ToInt<int64_t>(v); }
};
template <> struct DTypeTraits<DType::I8> {
  using Storage = int8_t;
  static float load(Storage v) { return static_cast<float>(v); }
  static Storage store(float v) { return f32ToInt<int8_t>(v); }
};
template <> struct DTypeTraits<DType::U8> {
  using Storage = uint8_t;
  static float load(Storage v) { return static_cast<float>(v); }
  static Storage store(float v) { return f32ToInt<uint8_t>(v); }
};
template <> struct DTypeTraits<DType::Bool> {
  using Storage = uint8_t;
  static float load(Storage v) { return v != 0 ? 1.0f : 0.0f; }
  static Storage store(float v) { return v != 0.0f ? 1 : 0; }
};

/// Calls fn(std::integral_constant-like tag) with the DType as a template
/// argument, so per-element loops are instantiated per dtype instead of
/// switching per element.
template <DType D> struct DTypeTag {
  static constexpr DType value = D;
};

template <typename Fn>
inline decltype(auto) dispatchDType(DType dtype, Fn &&fn) {
  switch (dtype) {
  case DType::F32:
    return fn(DTypeTag<DType::F32>{});
  case DType::BF16:
    return fn(DTypeTag<DType::BF16>{});
  case DType::F16:
    return fn(DTypeTag<DType::F16>{});
  case DType::I32:
    return fn(DTypeTag<DType::I32>{});
  case DType::I64:
    return fn(DTypeTag<DType::I64>{});
  case DType::I8:
    return fn(DTypeTag<DType::I8>{});
  case DType::U8:
    return fn(DTypeTag<DType::U8>{});
  case DType::F8E4M3FN:
    return fn(DTypeTag<DType::F8E4M3FN>{});
  case DType::F8E5M2:
    return fn(DTypeTag<DType::F8E5M2>{});
  case DType::Bool:
    break;
  }
  return fn(DTypeTag<DType::Bool>{});
}

/// Reads one element at `p` (any alignment) widened to fp32.
inline float loadAsF32(const void *p, DType dtype) {
  return dispatchDType(dtype, [p](auto tag) {
    using Traits = DTypeTraits<decltype(tag)::value>;
    typename Traits::Storage v;
    std::memcpy(&v, p, sizeof(v));
    return Traits::load(v);
  });
}

/// Rounds an fp32 value to `dtype` and writes it at `p` (any alignment).
inline void storeFromF32(float value, void *p, DType dtype) {
  dispatchDType(dtype, [p, value](auto tag) {
    using Traits = DTypeTraits<decltype(tag)::value>;
    typename Traits::Storage v = Traits::store(value);
    std::memcpy(p, &v, sizeof(v));
  });
}

/// Stores a double: integers and bool convert exactly from the double, floats
/// go through fp32 as the compute datapath does.
inline void storeFromF64(double value, void *p, DType dtype) {
  switch (dtype) {
  case DType::I32: {
    int32_t v = f64ToInt<int32_t>(value);
    std::memcpy(p, &v, sizeof(v));
    return;
  }
  case DType::I64: {
    int64_t v = f64ToInt<int64_t>(value);
    std::memcpy(p, &v, sizeof(v));
    return;
  }
  case DType::I8: {
    int8_t v = f64ToInt<int8_t>(value);
    std::memcpy(p, &v, sizeof(v));
    return;
  }
  case DType::U8: {
    uint8_t v = f64ToInt<uint8_t>(value);
    std::memcpy(p, &v, sizeof(v));
    return;
  }
  case DType::Bool: {
    uint8_t v = value != 0.0 ? 1 : 0;
    std::memcpy(p, &v, sizeof(v));
    return;
  }
  default:
    storeFromF32(static_cast<float>(value), p, dtype);
  }
}

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_EXEC_NUMERICS_H
