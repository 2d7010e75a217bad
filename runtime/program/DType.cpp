//===- DType.cpp - Element types of the kernel program --------------------===//

#include "runtime/program/DType.h"

namespace neuron::runtime {

int64_t dtypeSize(DType dtype) {
  switch (dtype) {
  case DType::F32:
  case DType::I32:
    return 4;
  case DType::BF16:
  case DType::F16:
    return 2;
  case DType::I64:
    return 8;
  case DType::I8:
  case DType::U8:
  case DType::Bool:
  case DType::F8E4M3FN:
  case DType::F8E5M2:
    return 1;
  }
  return 0;
}

const char *dtypeName(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "f32";
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::I32:
    return "i32";
  case DType::I64:
    return "i64";
  case DType::I8:
    return "i8";
  case DType::U8:
    return "u8";
  case DType::Bool:
    return "bool";
  case DType::F8E4M3FN:
    return "f8e4m3fn";
  case DType::F8E5M2:
    return "f8e5m2";
  }
  return "?";
}

std::optional<DType> parseDType(std::string_view name) {
  for (DType dtype : kAllDTypes)
    if (name == dtypeName(dtype))
      return dtype;
  return std::nullopt;
}

bool isFloatDType(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 ||
         isFloat8DType(dtype);
}

bool isFloat8DType(DType dtype) {
  return dtype == DType::F8E4M3FN || dtype == DType::F8E5M2;
}

bool isIntegerDType(DType dtype) {
  return dtype == DType::I32 || dtype == DType::I64 || dtype == DType::I8 ||
         dtype == DType::U8;
}

} // namespace neuron::runtime
