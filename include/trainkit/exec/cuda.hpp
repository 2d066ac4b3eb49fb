// SPDX-License-Identifier: MIT
// trainkit/exec/cuda.hpp: exec::Cuda, the GPU executor: the CUDA stream that launch, reduce and
// multi_tensor_apply enqueue their kernels on (asynchronously, like any CUDA launch). The type
// exists when TRAINKIT_WITH_CUDA; the launching overloads exist only in TUs compiled by nvcc.
// Also: cached per-device launch parameters and the arch-tagged namespace kernels live in.
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <atomic>

#include "trainkit/cuda/stream.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace exec {

/// The CUDA executor: a non-owning stream handle. Kernels go to the device that is current on
/// the calling thread, which must be the stream's device. Cheap to copy; pass by value or ref.
class Cuda {
 public:
  /// Work goes to the legacy default stream.
  constexpr Cuda() noexcept = default;
  /// Work goes to `stream` (a cuda::Stream converts to cuda::StreamRef).
  constexpr explicit Cuda(cuda::StreamRef stream) noexcept : stream_(stream) {}

  constexpr cuda::StreamRef stream() const noexcept { return stream_; }

  /// Blocks the calling thread until everything queued on the stream has finished.
  void synchronize() const { stream_.synchronize(); }

 private:
  cuda::StreamRef stream_;
};

namespace detail {

inline constexpr int kMaxCachedDevices = 64;

/// The device current on the calling thread.
inline int current_device() {
  int device = 0;
  TRAINKIT_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

/// cudaDeviceGetAttribute, cached per (slot, device): launches query the SM count every time,
/// and the driver call costs more than the launch arithmetic around it.
template <int Slot>
inline int cached_device_attribute(cudaDeviceAttr attribute, int device) {
  static std::atomic<int> cache[kMaxCachedDevices];  // 0 = not queried yet (all values are > 0)
  const bool cacheable = device >= 0 && device < kMaxCachedDevices;
  if (cacheable) {
    const int value = cache[device].load(std::memory_order_relaxed);
    if (value > 0) return value;
  }
  int value = 0;
  TRAINKIT_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  if (cacheable && value > 0) cache[device].store(value, std::memory_order_relaxed);
  return value;
}

/// Streaming multiprocessors of `device`.
inline int sm_count(int device) {
  return cached_device_attribute<0>(cudaDevAttrMultiProcessorCount, device);
}

/// Compute capability major of `device` (9 on Hopper).
inline int compute_capability_major(int device) {
  return cached_device_attribute<1>(cudaDevAttrComputeCapabilityMajor, device);
}

/// The driver's CUDA version (1000 * major + 10 * minor), queried once.
inline int driver_version() {
  static const int version = [] {
    int value = 0;
    TRAINKIT_CUDA_CHECK(cudaDriverGetVersion(&value));
    return value;
  }();
  return version;
}

}  // namespace detail
}  // namespace exec
TRAINKIT_NAMESPACE_END

#endif  // TRAINKIT_WITH_CUDA

// Kernels and their launchers live in an inline namespace named after the architectures the TU
// is compiled for (CUB's trick): two TUs built with different -arch lists then instantiate
// different symbols, and the linker cannot pair one TU's launcher with the other's fatbin.
#if TRAINKIT_CUDA_COMPILER && !defined(TRAINKIT_DETAIL_EXEC_ARCH_NS)
#define TRAINKIT_DETAIL_EXEC_CAT_(a, b) a##b
#define TRAINKIT_DETAIL_EXEC_CAT(a, b) TRAINKIT_DETAIL_EXEC_CAT_(a, b)
#define TRAINKIT_DETAIL_EXEC_COUNT_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, n, ...) n
#define TRAINKIT_DETAIL_EXEC_COUNT(...) \
  TRAINKIT_DETAIL_EXEC_COUNT_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
// The preprocessor cannot recurse: one macro per list length, up to 12 architectures.
#define TRAINKIT_DETAIL_EXEC_NS_1(a) a
#define TRAINKIT_DETAIL_EXEC_NS_2(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_1(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_3(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_2(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_4(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_3(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_5(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_4(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_6(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_5(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_7(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_6(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_8(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_7(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_9(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_8(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_10(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_9(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_11(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_10(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS_12(a, ...) \
  TRAINKIT_DETAIL_EXEC_CAT(a##_, TRAINKIT_DETAIL_EXEC_NS_11(__VA_ARGS__))
#define TRAINKIT_DETAIL_EXEC_NS(...)                          \
  TRAINKIT_DETAIL_EXEC_CAT(                                   \
      sm_, TRAINKIT_DETAIL_EXEC_CAT(TRAINKIT_DETAIL_EXEC_NS_, \
                                    TRAINKIT_DETAIL_EXEC_COUNT(__VA_ARGS__))(__VA_ARGS__))
#if defined(__CUDA_ARCH_LIST__)
/// The inline namespace of trainkit's kernels in this TU, e.g. `sm_900` or `sm_800_900`.
#define TRAINKIT_DETAIL_EXEC_ARCH_NS TRAINKIT_DETAIL_EXEC_NS(__CUDA_ARCH_LIST__)
#else
#define TRAINKIT_DETAIL_EXEC_ARCH_NS sm_unknown
#endif
#endif
