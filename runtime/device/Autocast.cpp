//===- Autocast.cpp - torch.autocast("neuron") ----------------------------===//
//
// Autocast on the neuron device follows PyTorch's CUDA policy lists (the
// AT_FORALL_* lists of ATen/autocast_mode.h, which CUDA's own registration
// uses): matmuls, convolutions and linear layers run in the autocast dtype,
// reductions, norms, softmax and losses in float32, mixed-dtype ops like
// addcmul at the widest input dtype. The wrappers only cast and redispatch:
// the casts and the ops then run as eager device kernels like any other op.
//
// The default autocast dtype is bfloat16, Trainium's native matmul type,
// instead of PyTorch's float16 default for PrivateUse1. PyTorch keeps that
// default per thread: it is set here for the thread that loads the device
// (the one importing torch); threads started later begin at float16 unless
// they call torch.set_autocast_dtype("neuron", ...) or pass dtype=.
//
//===----------------------------------------------------------------------===//

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace neuron::device {

namespace {

// As on CUDA: binary_cross_entropy is not autocast-safe (a float16 or bf16
// probability near 0 or 1 rounds badly); callers are pointed at the fused
// with_logits form, which autocast runs in float32.
at::Tensor binaryCrossEntropyRefused(const at::Tensor &, const at::Tensor &,
                                     const std::optional<at::Tensor> &,
                                     int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss "
              "are not autocast-safe on neuron (as on CUDA): use "
              "binary_cross_entropy_with_logits / BCEWithLogitsLoss, which "
              "autocast runs in float32, or leave the autocast region for the "
              "loss.");
}

struct DefaultAutocastDType {
  DefaultAutocastDType() {
    at::autocast::set_autocast_dtype(at::kPrivateUse1, at::kBFloat16);
  }
} defaultAutocastDType;

} // namespace

// Ops without a policy run unchanged at their inputs' dtypes.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define NEURON_LOWER_PRECISION(...)                                            \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION)
#undef NEURON_LOWER_PRECISION

#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(NEURON_FP32)
#undef NEURON_FP32

#define NEURON_FP32_SET_OPT_DTYPE(...)                                         \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
#undef NEURON_FP32_SET_OPT_DTYPE

  // norm does not promote by itself: the float32 dtype is appended. The
  // list spells its signatures with ATen's unqualified type names.
  using at::IntArrayRef;
  using at::Scalar;
  using at::ScalarType;
  using at::Tensor;
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(
      KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
#undef NEURON_PROMOTE

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(binaryCrossEntropyRefused));
}

} // namespace neuron::device
