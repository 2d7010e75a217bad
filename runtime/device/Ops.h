//===- Ops.h - Eager execution on neuron tensors ----------------*- C++ -*-===//
//
// The ATen kernels the device registers itself (Ops.cpp: tensor creation,
// views, resize, copies, fill_, .item()) and the boxed CPU fallback for every
// other op (Fallback.cpp): inputs copied to the CPU, the CPU kernel run,
// results copied back (in-place and out= arguments written back into the
// neuron tensors; view ops return views of the neuron tensor). Each fallback
// call is counted per operator and warned about once per operator.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DEVICE_OPS_H
#define NEURON_RUNTIME_DEVICE_OPS_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace neuron::device {

/// A CPU tensor over the same bytes as the neuron tensor `t` (same sizes
/// and strides); writes through it change `t`.
at::Tensor cpuAlias(const at::Tensor &t);

/// Calls of the CPU fallback since the last reset, by operator
/// ("aten::add.Tensor").
std::map<std::string, int64_t> fallbackCounts();
void resetFallbackCounts();

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_OPS_H
