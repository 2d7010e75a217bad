//===- NumericsTest.cpp - bf16/f16/integer conversions --------------------===//

#include "runtime/exec/Numerics.h"
#include "tests/unit/CatchCompat.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

using namespace neuron::runtime;

namespace {

float fromBits(uint32_t bits) { return bitsToFloat(bits); }
bool isNan16(uint16_t bits, int exponentMask, int mantissaMask) {
  return (bits & exponentMask) == exponentMask && (bits & mantissaMask) != 0;
}

} // namespace

TEST_CASE("bf16 rounds to nearest even", "[numerics][bf16]") {
  CHECK(f32ToBf16Bits(1.0f) == 0x3f80);
  CHECK(f32ToBf16Bits(-2.0f) == 0xc000);
  // Exact ties go to the even neighbour: 0x3f80|8000 -> 0x3f80 (even),
  // 0x3f81|8000 -> 0x3f82.
  CHECK(f32ToBf16Bits(fromBits(0x3f808000u)) == 0x3f80);
  CHECK(f32ToBf16Bits(fromBits(0x3f818000u)) == 0x3f82);
  CHECK(f32ToBf16Bits(fromBits(0xbf818000u)) == 0xbf82);
  // Just above and below a tie.
  CHECK(f32ToBf16Bits(fromBits(0x3f808001u)) == 0x3f81);
  CHECK(f32ToBf16Bits(fromBits(0x3f817fffu)) == 0x3f81);
  // Subnormals round like normals.
  CHECK(f32ToBf16Bits(fromBits(0x00018000u)) == 0x0002);
  CHECK(f32ToBf16Bits(fromBits(0x00008000u)) == 0x0000);
  // Signed zero survives.
  CHECK(f32ToBf16Bits(-0.0f) == 0x8000);
}

TEST_CASE("bf16 keeps infinities and NaN, overflows to infinity",
          "[numerics][bf16]") {
  float inf = std::numeric_limits<float>::infinity();
  CHECK(f32ToBf16Bits(inf) == 0x7f80);
  CHECK(f32ToBf16Bits(-inf) == 0xff80);
  // FLT_MAX is above the largest bf16 (0x7f7f) by more than half an ulp.
  CHECK(f32ToBf16Bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(f32ToBf16Bits(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(f32ToBf16Bits(fromBits(0x7f7f7fffu)) == 0x7f7f);
  // A NaN whose payload sits only in the low bits must not become infinity.
  uint16_t snan = f32ToBf16Bits(fromBits(0x7f800001u));
  CHECK(isNan16(snan, 0x7f80, 0x007f));
  uint16_t negNan = f32ToBf16Bits(fromBits(0xffc00000u));
  CHECK(isNan16(negNan, 0x7f80, 0x007f));
  CHECK((negNan & 0x8000) != 0);
  CHECK(std::isnan(bf16BitsToF32(0x7fc0)));
}

TEST_CASE("bf16 round-trips every bit pattern", "[numerics][bf16]") {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    float value = bf16BitsToF32(static_cast<uint16_t>(bits));
    uint16_t back = f32ToBf16Bits(value);
    if (std::isnan(value))
      REQUIRE(isNan16(back, 0x7f80, 0x007f));
    else
      REQUIRE(back == bits);
  }
}

TEST_CASE("bf16 rounding matches a double-precision reference",
          "[numerics][bf16]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bitsDist;
  for (int i = 0; i < 200000; ++i) {
    float value = fromBits(bitsDist(rng));
    if (!std::isfinite(value))
      continue;
    uint16_t rounded = f32ToBf16Bits(value);
    float result = bf16BitsToF32(rounded);
    // The neighbours one bf16 ulp down/up must be no closer.
    uint16_t down = static_cast<uint16_t>(rounded - 1);
    uint16_t up = static_cast<uint16_t>(rounded + 1);
    double err = std::fabs(static_cast<double>(result) - value);
    for (uint16_t other : {down, up}) {
      float alt = bf16BitsToF32(other);
      if (!std::isfinite(alt) || std::isinf(result))
        continue;
      double altErr = std::fabs(static_cast<double>(alt) - value);
      REQUIRE(err <= altErr);
      if (err == altErr) // A tie: the chosen one has an even mantissa.
        REQUIRE((rounded & 1) == 0);
    }
  }
}

TEST_CASE("f16 conversion", "[numerics][f16]") {
  CHECK(f32ToF16Bits(1.0f) == 0x3c00);
  CHECK(f32ToF16Bits(-2.0f) == 0xc000);
  CHECK(f32ToF16Bits(65504.0f) == 0x7bff);
  CHECK(f32ToF16Bits(65519.0f) == 0x7bff); // below the rounding midpoint
  CHECK(f32ToF16Bits(65520.0f) == 0x7c00); // midpoint rounds to infinity
  CHECK(f32ToF16Bits(1e10f) == 0x7c00);
  CHECK(f32ToF16Bits(-1e10f) == 0xfc00);
  // Ties to even in the normal range: 1 + 2^-11 -> 1, 1 + 3*2^-11 -> 1+2^-9.
  CHECK(f32ToF16Bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(f32ToF16Bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  // Subnormals: 2^-24 is the smallest; 2^-25 ties to 0; 3*2^-25 ties to 2.
  CHECK(f32ToF16Bits(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(f32ToF16Bits(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(f32ToF16Bits(1.5f * std::ldexp(1.0f, -25)) == 0x0001);
  CHECK(f32ToF16Bits(3.0f * std::ldexp(1.0f, -25)) == 0x0002);
  CHECK(f32ToF16Bits(std::ldexp(1.0f, -14)) == 0x0400); // smallest normal
  CHECK(f32ToF16Bits(-0.0f) == 0x8000);
  CHECK(f32ToF16Bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(isNan16(f32ToF16Bits(std::nanf("")), 0x7c00, 0x03ff));
  CHECK(isNan16(f32ToF16Bits(fromBits(0x7f800001u)), 0x7c00, 0x03ff));
  CHECK(f16BitsToF32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16BitsToF32(0x7bff) == 65504.0f);
  CHECK(f16BitsToF32(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(f16BitsToF32(0x7e00)));
}

TEST_CASE("f16 round-trips every bit pattern and matches exact values",
          "[numerics][f16]") {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    uint16_t h = static_cast<uint16_t>(bits);
    float value = f16BitsToF32(h);
    int exponent = (h >> 10) & 0x1f;
    int mantissa = h & 0x3ff;
    double expected = exponent == 0
                          ? std::ldexp(mantissa, -24)
                          : std::ldexp(1024 + mantissa, exponent - 25);
    if (h & 0x8000)
      expected = -expected;
    if (exponent == 0x1f) {
      REQUIRE((mantissa ? std::isnan(value) : std::isinf(value)));
      continue;
    }
    REQUIRE(static_cast<double>(value) == expected);
    REQUIRE(f32ToF16Bits(value) == h);
  }
}

#ifdef __FLT16_MANT_DIG__
TEST_CASE("f16 rounding matches the compiler's _Float16", "[numerics][f16]") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bitsDist;
  // Exponents from far below the f16 subnormals to beyond its overflow.
  std::uniform_int_distribution<uint32_t> exponentDist(127 - 30, 127 + 18);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = bitsDist(rng);
    float value = fromBits((bits & 0x807fffffu) | (exponentDist(rng) << 23));
    _Float16 reference = static_cast<_Float16>(value);
    uint16_t referenceBits;
    std::memcpy(&referenceBits, &reference, 2);
    REQUIRE(f32ToF16Bits(value) == referenceBits);
  }
}
#endif

TEST_CASE("integer stores truncate toward zero and saturate",
          "[numerics][int]") {
  CHECK(f32ToInt<int32_t>(3.9f) == 3);
  CHECK(f32ToInt<int32_t>(-3.9f) == -3);
  CHECK(f32ToInt<int32_t>(1e10f) == std::numeric_limits<int32_t>::max());
  CHECK(f32ToInt<int32_t>(-1e10f) == std::numeric_limits<int32_t>::min());
  CHECK(f32ToInt<int32_t>(2147483648.0f) ==
        std::numeric_limits<int32_t>::max());
  CHECK(f32ToInt<int32_t>(-2147483648.0f) ==
        std::numeric_limits<int32_t>::min());
  CHECK(f32ToInt<int32_t>(std::nanf("")) == 0);
  CHECK(f32ToInt<int32_t>(std::numeric_limits<float>::infinity()) ==
        std::numeric_limits<int32_t>::max());
  CHECK(f32ToInt<int64_t>(1e19f) == std::numeric_limits<int64_t>::max());
  CHECK(f32ToInt<int64_t>(-1e19f) == std::numeric_limits<int64_t>::min());
  CHECK(f32ToInt<int64_t>(16777216.0f) == 16777216);
  CHECK(f32ToInt<int8_t>(-200.0f) == -128);
  CHECK(f32ToInt<int8_t>(127.9f) == 127);
  CHECK(f32ToInt<uint8_t>(300.0f) == 255);
  CHECK(f32ToInt<uint8_t>(-5.0f) == 0);
  CHECK(f32ToInt<uint8_t>(-0.5f) == 0);
  CHECK(f64ToInt<int64_t>(1099511627777.0) == 1099511627777LL);
  CHECK(f64ToInt<int32_t>(-7.99) == -7);
}

TEST_CASE("bool stores value != 0 and loads 0 or 1", "[numerics][bool]") {
  uint8_t byte = 7;
  storeFromF32(0.5f, &byte, DType::Bool);
  CHECK(byte == 1);
  storeFromF32(-0.0f, &byte, DType::Bool);
  CHECK(byte == 0);
  storeFromF32(std::nanf(""), &byte, DType::Bool);
  CHECK(byte == 1);
  byte = 42;
  CHECK(loadAsF32(&byte, DType::Bool) == 1.0f);
}

TEST_CASE("loads widen every dtype exactly", "[numerics]") {
  uint8_t storage[8];
  for (DType dtype : kAllDTypes) {
    // -96 is exact in every signed dtype, fp8 (1.5 x 2^6) included.
    float value = dtype == DType::U8 ? 200.0f : -96.0f;
    if (dtype == DType::Bool)
      value = 1.0f;
    storeFromF32(value, storage, dtype);
    CHECK(loadAsF32(storage, dtype) == value);
  }
  int64_t big = (int64_t(1) << 40) + 1;
  storeFromF64(static_cast<double>(big), storage, DType::I64);
  int64_t back;
  std::memcpy(&back, storage, 8);
  CHECK(back == big);
}

TEST_CASE("dtype names round-trip", "[numerics][dtype]") {
  for (DType dtype : kAllDTypes) {
    REQUIRE(parseDType(dtypeName(dtype)) == dtype);
    CHECK(dtypeSize(dtype) >= 1);
  }
  CHECK(dtypeSize(DType::BF16) == 2);
  CHECK(dtypeSize(DType::I64) == 8);
  CHECK(!parseDType("float32"));
  CHECK(isIntegerDType(DType::U8));
  CHECK(!isIntegerDType(DType::Bool));
  CHECK(isFloatDType(DType::F16));
}
