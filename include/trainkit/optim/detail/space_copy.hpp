// SPDX-License-Identifier: MIT
// trainkit/optim/detail/space_copy.hpp (internal): byte copies between host memory and the
// memory of a space (host or device), for the small state blocks of optimizers and scalers
// (uploading tables once, reading a flag for a state_dict). A device copy is a synchronous
// cudaMemcpy: only setup, checkpoints and explicit reads use it, never a training step.
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
namespace optim {
namespace detail {

/// Copies `bytes` from host memory `src` to `dst` in `space`. On the device it first waits for
/// all queued work (kernels on non-blocking streams may still read `dst`), then copies.
inline void upload(void* dst, Space space, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (space == Space::kHost) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if TRAINKIT_WITH_CUDA
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  TRAINKIT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
#else
  TRAINKIT_FAIL("optim: device memory but trainkit was built without CUDA");
#endif
}

/// Copies `bytes` from `src` in `space` to host memory `dst`. On the device it waits for all
/// queued work first (cudaDeviceSynchronize): call it outside the step.
inline void download(void* dst, const void* src, Space space, std::size_t bytes) {
  if (bytes == 0) return;
  if (space == Space::kHost) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if TRAINKIT_WITH_CUDA
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  TRAINKIT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
#else
  TRAINKIT_FAIL("optim: device memory but trainkit was built without CUDA");
#endif
}

/// Copies `bytes` within one space (on the device after all queued work, and waiting for it).
inline void copy_within(void* dst, const void* src, Space space, std::size_t bytes) {
  if (bytes == 0) return;
  if (space == Space::kHost) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if TRAINKIT_WITH_CUDA
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
  TRAINKIT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
  TRAINKIT_CUDA_CHECK(cudaDeviceSynchronize());
#else
  TRAINKIT_FAIL("optim: device memory but trainkit was built without CUDA");
#endif
}

}  // namespace detail
}  // namespace optim
TRAINKIT_NAMESPACE_END
