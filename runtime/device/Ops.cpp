//===- Ops.cpp - Eager ATen kernels of the neuron device ------------------===//
//
// Device memory is host-addressable, so the kernels here work on CPU tensors
// that alias it (cpuAlias): creating, viewing, resizing and copying tensors,
// fill_/zero_/arange and .item(). Every other ATen op goes to the boxed fallback
// (Fallback.cpp), which runs it on the CPU.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/Ops.h"
#include "runtime/device/Device.h"
#include "runtime/device/KernelProvider.h"
#include "runtime/device/Profiler.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace neuron::device {

at::Tensor cpuAlias(const at::Tensor &t) {
  if (t.numel() == 0 || t.data_ptr() == nullptr)
    return at::empty_strided(t.sizes(), t.strides(),
                             t.options().device(at::kCPU));
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                       t.options().device(at::kCPU));
}

namespace {

constexpr c10::DispatchKeySet kNeuronKeys(c10::DispatchKey::PrivateUse1);

c10::Device checkedDevice(std::optional<c10::Device> deviceOpt) {
  c10::Device device = c10::device_or_default(deviceOpt);
  TORCH_CHECK(device.type() == kDeviceType, "expected a neuron device, got ",
              device);
  return device;
}

void checkOptions(std::optional<c10::Layout> layout,
                  std::optional<bool> pinMemory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "neuron tensors are strided (dense) only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pinMemory),
              "only CPU tensors can be pinned");
}

at::Tensor emptyMemoryFormat(c10::IntArrayRef size,
                             std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout> layout,
                             std::optional<c10::Device> device,
                             std::optional<bool> pinMemory,
                             std::optional<c10::MemoryFormat> memoryFormat) {
  c10::Device dev = checkedDevice(device);
  checkOptions(layout, pinMemory);
  c10::DeviceGuard guard(dev);
  return at::detail::empty_generic(size, at::GetAllocator(kDeviceType),
                                   kNeuronKeys, c10::dtype_or_default(dtype),
                                   memoryFormat);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout> layout,
                        std::optional<c10::Device> device,
                        std::optional<bool> pinMemory) {
  c10::Device dev = checkedDevice(device);
  checkOptions(layout, pinMemory);
  c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(
      size, stride, at::GetAllocator(kDeviceType), kNeuronKeys,
      c10::dtype_or_default(dtype));
}

at::Tensor asStrided(const at::Tensor &self, c10::IntArrayRef size,
                     c10::IntArrayRef stride,
                     std::optional<int64_t> storageOffset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storageOffset);
}

at::Tensor view(const at::Tensor &self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshapeAlias(const at::Tensor &self, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor &resizeNeuron(const at::Tensor &self, c10::IntArrayRef size,
                               std::optional<c10::MemoryFormat> memoryFormat) {
  // Growing reallocates through the storage's allocator (ours) on the
  // tensor's device and copies the old bytes: host memory, so memcpy.
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memoryFormat);
}

at::Tensor copyFrom(const at::Tensor &self, const at::Tensor &dst,
                    bool nonBlocking) {
  // self is the source. Both sides may be neuron (same or another core) or
  // one may be a CPU tensor; neuron memory is host memory, so every case is
  // a host copy (with dtype conversion and broadcasting by ATen's CPU copy),
  // charged to the modeled timeline at the link's speed (placeCopy).
  TORCH_CHECK(self.defined() && dst.defined(), "copy_ of an undefined tensor");
  if (dst.numel() == 0)
    return dst;
  std::optional<PlannedCopy> copy = planCopy(self, dst);
  ProfiledCopy profiled(copy);
  placeCopy(copy);
  at::Tensor src = self.device().type() == kDeviceType ? cpuAlias(self) : self;
  if (dst.device().type() == kDeviceType) {
    at::Tensor target = cpuAlias(dst);
    at::native::copy_(target, src, nonBlocking);
  } else {
    at::Tensor target = dst;
    at::native::copy_(target, src, nonBlocking);
  }
  return dst;
}

at::Tensor copyFromAndResize(const at::Tensor &self, const at::Tensor &dst) {
  if (dst.sizes() != self.sizes())
    resizeNeuron(dst, self.sizes(), std::nullopt);
  return copyFrom(self, dst, false);
}

at::Scalar localScalarDense(const at::Tensor &self) {
  at::Tensor alias = cpuAlias(self);
  std::optional<PlannedCopy> copy = planCopy(self, alias); // a device read
  ProfiledCopy profiled(copy);
  placeCopy(copy);
  return at::native::_local_scalar_dense_cpu(alias);
}

at::Tensor &fillScalar(at::Tensor &self, const at::Scalar &value) {
  if (self.numel() != 0)
    cpuAlias(self).fill_(value);
  return self;
}

at::Tensor &fillTensor(at::Tensor &self, const at::Tensor &value) {
  TORCH_CHECK(value.dim() == 0,
              "fill_ only supports 0-dimension value tensor but got tensor "
              "with ",
              value.dim(), " dimensions");
  at::Scalar scalar = value.device().type() == kDeviceType
                          ? localScalarDense(value)
                          : value.item();
  return fillScalar(self, scalar);
}

at::Tensor &zero(at::Tensor &self) { return fillScalar(self, 0); }

// Positions (torch.arange(n, device="neuron")) are written like a fill: the
// values computed on the host, resized into and copied to the device.
at::Tensor &arangeOut(const at::Scalar &start, const at::Scalar &end,
                      const at::Scalar &step, at::Tensor &out) {
  at::Tensor values = at::empty({0}, out.options().device(at::kCPU));
  at::arange_out(values, start, end, step);
  if (out.sizes() != values.sizes())
    at::native::resize_output(out, values.sizes());
  if (out.numel() != 0)
    cpuAlias(out).copy_(values);
  return out;
}

at::Tensor &setStorageOffset(at::Tensor &self, c10::Storage source,
                             int64_t storageOffset, c10::IntArrayRef size,
                             c10::IntArrayRef stride) {
  c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), storageOffset,
                                      size, stride);
}

at::Tensor &setStorage(at::Tensor &self, c10::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor &setTensor(at::Tensor &self, const at::Tensor &source) {
  return at::native::set_tensor_(self, source);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", emptyMemoryFormat);
  m.impl("empty_strided", emptyStrided);
  m.impl("as_strided", asStrided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshapeAlias);
  m.impl("resize_", resizeNeuron);
  m.impl("_copy_from", copyFrom);
  m.impl("_copy_from_and_resize", copyFromAndResize);
  m.impl("_local_scalar_dense", localScalarDense);
  m.impl("fill_.Scalar", fillScalar);
  m.impl("fill_.Tensor", fillTensor);
  m.impl("zero_", zero);
  m.impl("arange.start_out", arangeOut);
  m.impl("set_.source_Storage_storage_offset", setStorageOffset);
  m.impl("set_.source_Storage", setStorage);
  m.impl("set_.source_Tensor", setTensor);
}

} // namespace neuron::device
