// SPDX-License-Identifier: MIT
// trainkit/core/copy.hpp: copies between tensor views in any pair of memory spaces. Host-to-host
// copies accept any strides; copies that touch the device need contiguous views (one cudaMemcpy).
// `copy` is synchronous; `copy_async` (cuda/copy.hpp) queues the transfer on a stream instead.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN

namespace detail {

template <class TD, class TS, int Rank, Space SD, Space SS>
void check_copy(const TensorView<TD, Rank, SD>& dst, const TensorView<TS, Rank, SS>& src) {
  static_assert(
      std::is_same_v<std::remove_const_t<TS>, TD>,
      "trainkit: copy needs the same element type on both sides and a non-const destination");
  TRAINKIT_CHECK(dst.sizes() == src.sizes(), "copy: destination shape ", dst.shape().to_string(),
                 " differs from source shape ", src.shape().to_string());
  if constexpr (SD == Space::kDevice || SS == Space::kDevice) {
    TRAINKIT_CHECK(dst.is_contiguous() && src.is_contiguous(),
                   "copy to or from device memory needs contiguous views (", space_name(SS), " -> ",
                   space_name(SD), ", shape ", src.shape().to_string(), ")");
  }
}

/// Strided host copy: walks the index space in row-major order, innermost dimension in a tight
/// loop.
template <class T, int Rank>
void copy_host_strided(const TensorView<T, Rank, Space::kHost>& dst,
                       const TensorView<const T, Rank, Space::kHost>& src) {
  if constexpr (Rank == 0) {
    *dst.data() = *src.data();
  } else {
    const std::int64_t inner = dst.size(Rank - 1);
    const std::int64_t ds = dst.stride(Rank - 1), ss = src.stride(Rank - 1);
    const std::int64_t outer = inner == 0 ? 0 : dst.numel() / inner;
    std::int64_t idx[Rank] = {};
    for (std::int64_t o = 0; o < outer; ++o) {
      std::int64_t doff = 0, soff = 0;
      for (int d = 0; d + 1 < Rank; ++d) {
        doff += idx[d] * dst.stride(d);
        soff += idx[d] * src.stride(d);
      }
      T* dp = dst.data() + doff;
      const T* sp = src.data() + soff;
      for (std::int64_t i = 0; i < inner; ++i) dp[i * ds] = sp[i * ss];
      for (int d = Rank - 2; d >= 0; --d) {
        if (++idx[d] < dst.size(d)) break;
        idx[d] = 0;
      }
    }
  }
}

}  // namespace detail

/// Copies src into dst (same shape and element type), synchronously. Throws trainkit::Error for a
/// shape mismatch, a non-contiguous view on a device transfer, or a CUDA failure.
template <class TD, class TS, int Rank, Space SD, Space SS>
void copy(const TensorView<TD, Rank, SD>& dst, const TensorView<TS, Rank, SS>& src) {
  detail::check_copy(dst, src);
  if (dst.numel() == 0) return;
  if constexpr (SD == Space::kHost && SS == Space::kHost) {
    if (dst.is_contiguous() && src.is_contiguous()) {
      std::memmove(dst.data(), src.data(), std::size_t(dst.numel()) * sizeof(TD));
    } else {
      detail::copy_host_strided<TD, Rank>(dst, TensorView<const TD, Rank, Space::kHost>(src));
    }
  } else {
    copy_bytes(dst.data(), SD, src.data(), SS, std::size_t(dst.numel()) * sizeof(TD), "copy");
  }
}

/// Whole-tensor copy (shapes must match).
template <class T, Space SD, Space SS>
void copy(Tensor<T, SD>& dst, const Tensor<T, SS>& src) {
  TRAINKIT_CHECK(dst.shape() == src.shape(), "copy: destination shape ", dst.shape().to_string(),
                 " differs from source shape ", src.shape().to_string());
  copy(dst.flat(), src.flat());
}

/// A new tensor in space S holding a copy of `src` (e.g. `to_space<Space::kDevice>(host_tensor)`).
template <Space S, class T, Space SS>
Tensor<T, S> to_space(const Tensor<T, SS>& src) {
  Tensor<T, S> dst(src.shape());
  copy(dst, src);
  return dst;
}

TRAINKIT_NAMESPACE_END
