// SPDX-License-Identifier: MIT
// trainkit/core/bytes.hpp: untyped, synchronous byte copies and zero fills in any memory space
// (host or device), for the places that move whole buffers outside a training step: uploading
// tables, reading a flag or a norm, saving and restoring state. A device copy first waits for all
// queued work (kernels on non-blocking streams may still use the memory) and returns when the
// bytes have arrived, so the caller may reuse or read either side at once. Typed, shaped copies
// are in core/copy.hpp.
#pragma once

#include <cstddef>
#include <cstring>

#include "trainkit/config.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

TRAINKIT_NAMESPACE_BEGIN

#if TRAINKIT_WITH_CUDA
namespace detail {
inline constexpr cudaMemcpyKind memcpy_kind(Space dst, Space src) noexcept {
  if (dst == Space::kHost)
    return src == Space::kHost ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost;
  return src == Space::kHost ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
}
}  // namespace detail
#endif

/// Copies `bytes` from `src` (in `src_space`) to `dst` (in `dst_space`); host to host is a
/// memcpy. `what` names the caller in the error thrown when device memory is involved but
/// trainkit was built without CUDA.
inline void copy_bytes(void* dst, Space dst_space, const void* src, Space src_space,
                       std::size_t bytes, const char* what = "copy_bytes") {
  if (bytes == 0) return;
  if (dst_space == Space::kHost && src_space == Space::kHost) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if TRAINKIT_WITH_CUDA
  (void)what;
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  TRAINKIT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, detail::memcpy_kind(dst_space, src_space)));
  // cudaMemcpy returns once the bytes left `src` for a staging buffer, not once they reached
  // device memory (from pageable host memory), and a device-to-device copy is only queued; neither
  // orders kernels on non-blocking streams after it. Waiting here keeps the promise above.
  if (dst_space == Space::kDevice) TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
#else
  TRAINKIT_FAIL_WITHOUT_CUDA(what, ": copying device memory");
#endif
}

/// The value of type T at `src` in `space` (a plain load on the host; on the device it waits for
/// the queued work, then copies sizeof(T) bytes): one read of a device-resident scalar such as a
/// loss, a norm or a flag.
template <class T>
T read_value(const T* src, Space space, const char* what = "read_value") {
  if (space == Space::kHost) return *src;
  T value{};
  copy_bytes(&value, Space::kHost, src, space, sizeof value, what);
  return value;
}

/// Sets `bytes` bytes at `dst` (in `space`) to zero.
inline void zero_bytes(void* dst, Space space, std::size_t bytes, const char* what = "zero_bytes") {
  if (bytes == 0) return;
  if (space == Space::kHost) {
    std::memset(dst, 0, bytes);
    return;
  }
#if TRAINKIT_WITH_CUDA
  (void)what;
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  TRAINKIT_CUDA_CHECK(cudaMemset(dst, 0, bytes));
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
#else
  TRAINKIT_FAIL_WITHOUT_CUDA(what, ": zeroing device memory");
#endif
}

TRAINKIT_NAMESPACE_END
