// SPDX-License-Identifier: MIT
// trainkit/cuda/copy.hpp: `copy_async`, the stream-ordered form of core/copy.hpp's `copy`: it
// queues the transfer on a stream and returns at once (truly asynchronous only for pinned host
// memory, as with cudaMemcpyAsync). Empty in builds without CUDA.
#pragma once

#include <cstddef>

#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/copy.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/cuda/stream.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

TRAINKIT_NAMESPACE_BEGIN

/// Queues the copy on `stream` and returns; the caller keeps both buffers alive until the stream
/// has passed this point. Host-to-host copies are done immediately.
template <class TD, class TS, int Rank, Space SD, Space SS>
void copy_async(const TensorView<TD, Rank, SD>& dst, const TensorView<TS, Rank, SS>& src,
                cuda::StreamRef stream) {
  detail::check_copy(dst, src);
  if (dst.numel() == 0) return;
  if constexpr (SD == Space::kHost && SS == Space::kHost) {
    copy(dst, src);
  } else {
    TRAINKIT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(),
                                        std::size_t(dst.numel()) * sizeof(TD),
                                        detail::memcpy_kind(SD, SS), stream.get()));
  }
}

template <class T, Space SD, Space SS>
void copy_async(Tensor<T, SD>& dst, const Tensor<T, SS>& src, cuda::StreamRef stream) {
  TRAINKIT_CHECK(dst.shape() == src.shape(), "copy_async: destination shape ",
                 dst.shape().to_string(), " differs from source shape ", src.shape().to_string());
  copy_async(dst.flat(), src.flat(), stream);
}

TRAINKIT_NAMESPACE_END

#endif  // TRAINKIT_WITH_CUDA
