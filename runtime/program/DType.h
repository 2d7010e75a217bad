//===- DType.h - Element types of the kernel program ------------*- C++ -*-===//
//
// The element types a kernel program buffer can hold (PROGRAM_FORMAT.md,
// "Buffers"). Names are the ones used in the program file.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_PROGRAM_DTYPE_H
#define NEURON_RUNTIME_PROGRAM_DTYPE_H

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace neuron::runtime {

enum class DType : uint8_t {
  F32,
  BF16,
  F16,
  I32,
  I64,
  I8,
  U8,
  Bool,
  F8E4M3FN,
  F8E5M2
};

inline constexpr DType kAllDTypes[] = {
    DType::F32, DType::BF16, DType::F16,  DType::I32,      DType::I64,
    DType::I8,  DType::U8,   DType::Bool, DType::F8E4M3FN, DType::F8E5M2};

/// Size of one element in bytes (bool is one byte holding 0 or 1).
int64_t dtypeSize(DType dtype);

/// The program-file name: "f32", "bf16", "f16", "i32", "i64", "i8", "u8",
/// "bool", "f8e4m3fn", "f8e5m2".
const char *dtypeName(DType dtype);

/// Parses a program-file name; std::nullopt for anything else.
std::optional<DType> parseDType(std::string_view name);

bool isFloatDType(DType dtype);
/// True for the 8-bit floats (OCP float8_e4m3fn and float8_e5m2).
bool isFloat8DType(DType dtype);
/// True for i32, i64, i8 and u8 (not bool).
bool isIntegerDType(DType dtype);

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_PROGRAM_DTYPE_H
