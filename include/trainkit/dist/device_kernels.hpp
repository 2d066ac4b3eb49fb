// SPDX-License-Identifier: MIT
// trainkit/dist/device_kernels.hpp: the few element-wise kernels the device side of dist needs
// (f32 <-> bf16 for compressed gradient buckets, the division of an average where NCCL has no
// ncclAvg). Kernels exist only in TUs compiled by nvcc, but NcclComm and GradBucketer are used
// from plain .cpp files too: so the launchers are reached through function pointers that any nvcc
// TU including this header registers at start-up. The registry is the same in every TU (ODR-safe);
// only the registering variable, a distinct entity per architecture list, is nvcc-only.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/launch.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace dist {
namespace detail {

/// Launchers of dist's device kernels; null until an nvcc TU registered them.
struct DeviceKernels {
  /// dst[i] = bf16(src[i]) (round to nearest even) for i < n, on `stream`.
  void (*f32_to_bf16)(const float* src, bf16* dst, std::int64_t n, cudaStream_t stream) = nullptr;
  /// dst[i] = float(src[i]) for i < n, on `stream`.
  void (*bf16_to_f32)(const bf16* src, float* dst, std::int64_t n, cudaStream_t stream) = nullptr;
  /// data[i] /= divisor for n elements of a reducible dtype (integers truncate), on `stream`.
  void (*divide)(DType dtype, void* data, std::int64_t n, int divisor,
                 cudaStream_t stream) = nullptr;
};

inline DeviceKernels& device_kernels() noexcept {
  static DeviceKernels kernels;
  return kernels;
}

/// The registered kernels; throws trainkit::Error naming `who` when no nvcc TU registered them.
inline const DeviceKernels& require_device_kernels(const char* who) {
  const DeviceKernels& k = device_kernels();
  TRAINKIT_CHECK(k.f32_to_bf16 != nullptr, who,
                 " needs a CUDA kernel, "
                 "and no translation unit of this program compiled by nvcc includes "
                 "trainkit/dist/device_kernels.hpp "
                 "(include trainkit/dist/bucketer.hpp or trainkit/trainkit.hpp from one .cu file)");
  return k;
}

}  // namespace detail
}  // namespace dist
TRAINKIT_NAMESPACE_END

#if TRAINKIT_CUDA_COMPILER
TRAINKIT_NAMESPACE_BEGIN
namespace dist {
namespace detail {
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

struct F32ToBf16 {
  const float* src;
  bf16* dst;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const { dst[i] = bf16(src[i]); }
};

struct Bf16ToF32 {
  const bf16* src;
  float* dst;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const {
    dst[i] = static_cast<float>(src[i]);
  }
};

template <class T, class C>
struct DivideBy {
  T* data;
  int divisor;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const {
    data[i] = T(static_cast<C>(data[i]) / static_cast<C>(divisor));
  }
};

inline void launch_f32_to_bf16(const float* src, bf16* dst, std::int64_t n, cudaStream_t stream) {
  exec::launch(exec::Cuda(cuda::StreamRef(stream)), n, F32ToBf16{src, dst});
}

inline void launch_bf16_to_f32(const bf16* src, float* dst, std::int64_t n, cudaStream_t stream) {
  exec::launch(exec::Cuda(cuda::StreamRef(stream)), n, Bf16ToF32{src, dst});
}

// One case per reducible dtype, each naming its element and compute types (the dispatch of
// host_reduce.hpp's combine has the same shape for the same reason).
inline void launch_divide(DType dtype, void* data, std::int64_t n, int divisor,
                          cudaStream_t stream) {
  const exec::Cuda on{cuda::StreamRef(stream)};
  switch (dtype) {
    case DType::kF32:
      exec::launch(on, n, DivideBy<float, float>{static_cast<float*>(data), divisor});
      return;
    case DType::kF64:
      exec::launch(on, n, DivideBy<double, double>{static_cast<double*>(data), divisor});
      return;
    case DType::kBF16:
      exec::launch(on, n, DivideBy<bf16, float>{static_cast<bf16*>(data), divisor});
      return;
    case DType::kF16:
      exec::launch(on, n, DivideBy<f16, float>{static_cast<f16*>(data), divisor});
      return;
    case DType::kI32:
      exec::launch(on, n,
                   DivideBy<std::int32_t, std::int32_t>{static_cast<std::int32_t*>(data), divisor});
      return;
    case DType::kI64:
      exec::launch(on, n,
                   DivideBy<std::int64_t, std::int64_t>{static_cast<std::int64_t*>(data), divisor});
      return;
    default: break;
  }
  TRAINKIT_FAIL("dist: cannot divide ", dtype_name(dtype), " on the device");
}

/// Registers the launchers above when the program starts (one per architecture list).
inline const bool device_kernels_registered = [] {
  DeviceKernels& k = device_kernels();
  k.f32_to_bf16 = &launch_f32_to_bf16;
  k.bf16_to_f32 = &launch_bf16_to_f32;
  k.divide = &launch_divide;
  return true;
}();

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
}  // namespace detail
}  // namespace dist
TRAINKIT_NAMESPACE_END
#endif  // TRAINKIT_CUDA_COMPILER

#endif  // TRAINKIT_WITH_CUDA
