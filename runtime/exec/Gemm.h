//===- Gemm.h - TensorE matrix multiply on the host -------------*- C++ -*-===//
//
// The tile kernels behind the executor's matmul: out[M, N] (+)= a[K, M]^T @
// b[K, N] with fp32 accumulation, over a range of output columns so that
// the executor can split one instruction between threads.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_EXEC_GEMM_H
#define NEURON_RUNTIME_EXEC_GEMM_H

#include <cstdint>
#include <vector>

namespace neuron::runtime {

/// A [rows, cols] matrix whose element (r, c) is data[r * rowStride + c *
/// colStride].
template <typename T> struct StridedMatrix {
  const T *data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t rowStride = 0, colStride = 0;
};

/// out[i, j] = (accumulate ? out[i, j] : 0) + sum_k a[k, i] * b[k, j] for the
/// columns j in [begin, end); out is row-major fp32 with leading dimension
/// ldOut. The sum is formed in fp32 and then added to out, as the PE array
/// adds its column sums into PSUM. A nonzero `movingKey` is the caller's
/// promise that b holds the same values as in this thread's last call with
/// that key and the same b and columns: the kernel may reuse its packed copy
/// of b.
void matmulF32(const StridedMatrix<float> &a, const StridedMatrix<float> &b,
               float *out, int64_t ldOut, bool accumulate, int64_t begin,
               int64_t end, uint64_t movingKey = 0);

/// True when matmulF32 computes each output column the same way whatever
/// [begin, end) it is called with (its AVX2 / AVX-512 kernel; not Eigen's
/// GEMM of a portable build, which blocks each call by its width).
bool matmulF32ColumnsIndependent();

/// The host kernels of a bf16 matmul. Each multiplies bf16 values exactly
/// and accumulates in fp32. Amx (AMX-BF16 tiles) and Dot (AVX512-BF16 dot
/// products) read subnormal inputs as zero and flush subnormal products and
/// sums: each output may then differ from the IEEE fp32 sum by up to
/// K * 2^-126 beyond the usual rounding, far below the rounding error of any
/// sum above 2^-100. Widened is matmulF32's kernel on widened values.
enum class Bf16Kernel { Amx, Dot, Widened };

/// "amx-bf16", "avx512-bf16" or "fp32".
const char *bf16KernelName(Bf16Kernel kernel);

/// The kernels this build can run on this CPU, fastest first; matmulBf16
/// uses the first (Widened is always there).
const std::vector<Bf16Kernel> &bf16Kernels();

/// The same as matmulF32 for bf16 operands given as bit patterns, on the
/// fastest kernel.
void matmulBf16(const StridedMatrix<uint16_t> &a,
                const StridedMatrix<uint16_t> &b, float *out, int64_t ldOut,
                bool accumulate, int64_t begin, int64_t end,
                uint64_t movingKey = 0);

/// The same on a given kernel (Error if it is not in bf16Kernels()).
void matmulBf16(Bf16Kernel kernel, const StridedMatrix<uint16_t> &a,
                const StridedMatrix<uint16_t> &b, float *out, int64_t ldOut,
                bool accumulate, int64_t begin, int64_t end,
                uint64_t movingKey = 0);

/// True when matmulBf16 computes each output column the same way whatever
/// [begin, end) it is called with (the Amx and Dot kernels). Otherwise, as
/// for matmulF32 (Eigen's GEMM, which blocks each call by its width), a
/// column's result can depend on the range: callers that split a matmul
/// between threads must then cut it the same way every time.
bool matmulBf16ColumnsIndependent();

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_EXEC_GEMM_H
