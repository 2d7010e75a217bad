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
#include <vector>

namespace neuron::device {

/// A CPU tensor over the same bytes as the neuron tensor `t` (same sizes
/// and strides); writes through it change `t`.
at::Tensor cpuAlias(const at::Tensor &t);

/// Calls of the CPU fallback since the last reset, by operator
/// ("aten::add.Tensor").
std::map<std::string, int64_t> fallbackCounts();
void resetFallbackCounts();

/// Sends the ops that have both a CPU kernel and a CompositeExplicitAutograd
/// kernel (native_layer_norm, native_group_norm, addr, any.dims...) to the
/// CPU fallback, which would otherwise lose to the composite kernel: the
/// composite decomposes differently (math_native_layer_norm rounds unlike
/// CPU's fused kernel), and eager on neuron must match CPU eager bit for bit
/// until the op has a device kernel. Call once all libraries are loaded
/// (torchneuron._device does at import); returns the ops it routed.
std::vector<std::string> routeCpuKernelsThroughFallback();

} // namespace neuron::device

#endif // NEURON_RUNTIME_DEVICE_OPS_H
