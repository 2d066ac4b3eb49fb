// SPDX-License-Identifier: MIT
// trainkit/core/tensor_view.hpp: `TensorView<T, Rank, Space>`, the non-owning strided view every
// kernel and layer takes. It is a plain struct of (pointer, extents, strides) that is trivially
// copyable into CUDA kernels; rank and memory space are in the type, so a device view cannot be
// passed where host memory is expected. Strides are in elements, row-major by default.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN

/// A fixed-size list of Rank indices, usable in device code (std::array is not, without flags).
template <int Rank>
struct Extents {
  std::int64_t v[Rank > 0 ? Rank : 1] = {};

  TRAINKIT_HOST_DEVICE constexpr std::int64_t& operator[](int d) noexcept { return v[d]; }
  TRAINKIT_HOST_DEVICE constexpr std::int64_t operator[](int d) const noexcept { return v[d]; }

  friend constexpr bool operator==(const Extents& a, const Extents& b) noexcept {
    for (int d = 0; d < Rank; ++d)
      if (a.v[d] != b.v[d]) return false;
    return true;
  }
};

/// Row-major strides for the given extents (the last dimension has stride 1).
template <int Rank>
TRAINKIT_HOST_DEVICE constexpr Extents<Rank> contiguous_strides(
    const Extents<Rank>& sizes) noexcept {
  Extents<Rank> strides;
  // Unsigned: with a zero extent a product past 2^63 is possible (and never used as an offset).
  std::uint64_t s = 1;
  for (int d = Rank - 1; d >= 0; --d) {
    strides[d] = static_cast<std::int64_t>(s);
    s *= static_cast<std::uint64_t>(sizes[d]);
  }
  return strides;
}

namespace detail {
[[noreturn]] TRAINKIT_HOST_DEVICE inline void index_out_of_bounds(int dim, std::int64_t index,
                                                                  std::int64_t size) {
#if defined(__CUDA_ARCH__)
  printf("trainkit: index %lld out of bounds for dimension %d of size %lld\n", (long long)index,
         dim, (long long)size);
  __trap();
#else
  std::fprintf(stderr, "trainkit: index %lld out of bounds for dimension %d of size %lld\n",
               (long long)index, dim, (long long)size);
  std::abort();
#endif
}
}  // namespace detail

/// A non-owning view of Rank-dimensional data of type T (const T for read-only) in memory space S.
/// Element (i0, i1, ...) lives at data()[i0*stride(0) + i1*stride(1) + ...]. Element access is
/// unchecked in release builds and bounds-checked (abort/trap) when TRAINKIT_DEBUG is 1; `at()` is
/// always checked and throws on the host.
template <class T, int Rank, Space S = Space::kHost>
class TensorView {
  static_assert(Rank >= 0 && Rank <= kMaxRank, "trainkit: TensorView rank must be in [0, 8]");

 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  static constexpr int rank = Rank;
  static constexpr Space space = S;

  TensorView() = default;

  /// A contiguous row-major view of `sizes` elements starting at `data`.
  TRAINKIT_HOST_DEVICE TensorView(T* data, const Extents<Rank>& sizes) noexcept
      : data_(data), sizes_(sizes), strides_(contiguous_strides(sizes)) {}

  /// A strided view; strides are in elements and may be zero (broadcast) but not negative.
  TRAINKIT_HOST_DEVICE TensorView(T* data, const Extents<Rank>& sizes,
                                  const Extents<Rank>& strides) noexcept
      : data_(data), sizes_(sizes), strides_(strides) {}

  /// Views of T convert to views of const T.
  template <class U, std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>, int> = 0>
  TRAINKIT_HOST_DEVICE TensorView(const TensorView<U, Rank, S>& other) noexcept
      : data_(other.data()), sizes_(other.sizes()), strides_(other.strides()) {}

  TRAINKIT_HOST_DEVICE T* data() const noexcept { return data_; }
  TRAINKIT_HOST_DEVICE std::int64_t size(int d) const noexcept { return sizes_[d]; }
  TRAINKIT_HOST_DEVICE std::int64_t stride(int d) const noexcept { return strides_[d]; }
  TRAINKIT_HOST_DEVICE const Extents<Rank>& sizes() const noexcept { return sizes_; }
  TRAINKIT_HOST_DEVICE const Extents<Rank>& strides() const noexcept { return strides_; }

  /// The number of elements; 0 when an extent is 0, whatever the others (an empty view's other
  /// extents need not have a product that fits in 64 bits, e.g. a transposed Shape{0, 2^40, 2^40}).
  TRAINKIT_HOST_DEVICE std::int64_t numel() const noexcept {
    for (int d = 0; d < Rank; ++d)
      if (sizes_[d] == 0) return 0;
    std::int64_t n = 1;
    for (int d = 0; d < Rank; ++d) n *= sizes_[d];
    return n;
  }
  TRAINKIT_HOST_DEVICE bool empty() const noexcept { return numel() == 0; }

  /// True when the elements are densely packed in row-major order (extent-1 dims may have any
  /// stride, and an empty view is contiguous whatever its strides, as in PyTorch).
  TRAINKIT_HOST_DEVICE bool is_contiguous() const noexcept {
    if (empty()) return true;
    std::int64_t expected = 1;
    for (int d = Rank - 1; d >= 0; --d) {
      if (sizes_[d] != 1 && strides_[d] != expected) return false;
      expected *= sizes_[d];
    }
    return true;
  }

  Shape shape() const {
    std::int64_t dims[Rank > 0 ? Rank : 1];
    for (int d = 0; d < Rank; ++d) dims[d] = sizes_[d];
    return Shape(std::span<const std::int64_t>(dims, std::size_t(Rank)));
  }

  /// Element access: `view(i, j)`.
  template <class... I>
  TRAINKIT_HOST_DEVICE T& operator()(I... index) const noexcept {
    static_assert(sizeof...(I) == std::size_t(Rank),
                  "trainkit: wrong number of indices for this rank");
    return data_[offset_of(static_cast<std::int64_t>(index)...)];
  }

  /// For rank 1: `view[i]`.
  TRAINKIT_HOST_DEVICE T& operator[](std::int64_t i) const noexcept {
    static_assert(Rank == 1, "trainkit: operator[] needs a rank-1 view; use view(i, j, ...)");
    return data_[offset_of(i)];
  }

  /// Always bounds-checked element access on the host; throws trainkit::Error.
  template <class... I>
  T& at(I... index) const {
    static_assert(S == Space::kHost,
                  "trainkit: at() dereferences on the host; this is a device view");
    static_assert(sizeof...(I) == std::size_t(Rank),
                  "trainkit: wrong number of indices for this rank");
    const std::int64_t idx[] = {static_cast<std::int64_t>(index)..., 0};
    std::int64_t off = 0;
    for (int d = 0; d < Rank; ++d) {
      TRAINKIT_CHECK(idx[d] >= 0 && idx[d] < sizes_[d], "index ", idx[d],
                     " out of bounds for dimension ", d, " of a view with shape ",
                     shape().to_string());
      off += idx[d] * strides_[d];
    }
    return data_[off];
  }

  /// The sub-range [begin, end) of dimension `dim` (same rank, shares memory).
  TensorView slice(int dim, std::int64_t begin, std::int64_t end) const {
    check_dim(dim, "slice");
    TRAINKIT_CHECK(0 <= begin && begin <= end && end <= sizes_[dim], "slice [", begin, ", ", end,
                   ") out of range for dimension ", dim, " of size ", sizes_[dim]);
    TensorView out = *this;
    out.data_ = data_ + begin * strides_[dim];
    out.sizes_[dim] = end - begin;
    return out;
  }

  /// Fixes dimension `dim` at `index`, dropping it: rank Rank-1.
  TensorView<T, Rank - 1, S> select(int dim, std::int64_t index) const {
    static_assert(Rank >= 1, "trainkit: select() needs rank >= 1");
    check_dim(dim, "select");
    TRAINKIT_CHECK(0 <= index && index < sizes_[dim], "select index ", index,
                   " out of range for dimension ", dim, " of size ", sizes_[dim]);
    Extents<Rank - 1> sizes, strides;
    for (int d = 0, o = 0; d < Rank; ++d) {
      if (d == dim) continue;
      sizes[o] = sizes_[d];
      strides[o] = strides_[d];
      ++o;
    }
    return TensorView<T, Rank - 1, S>(data_ + index * strides_[dim], sizes, strides);
  }

  /// The view with dimensions d0 and d1 swapped (no copy; the result is usually non-contiguous).
  TensorView transposed(int d0 = Rank - 2, int d1 = Rank - 1) const {
    check_dim(d0, "transposed");
    check_dim(d1, "transposed");
    TensorView out = *this;
    out.sizes_[d0] = sizes_[d1];
    out.sizes_[d1] = sizes_[d0];
    out.strides_[d0] = strides_[d1];
    out.strides_[d1] = strides_[d0];
    return out;
  }

  /// The same contiguous memory seen with other extents; throws unless contiguous and numel agrees.
  template <int NewRank>
  TensorView<T, NewRank, S> reshape(const Extents<NewRank>& sizes) const {
    TRAINKIT_CHECK(is_contiguous(), "reshape of a non-contiguous view with shape ",
                   shape().to_string(), "; copy it first");
    // Through Shape: negative extents and element counts past 2^63 - 1 are refused.
    const std::int64_t n = Shape(std::span<const std::int64_t>(sizes.v, NewRank)).numel();
    TRAINKIT_CHECK(n == numel(), "reshape from ", shape().to_string(), " (", numel(),
                   " elements) to ", n, " elements");
    return TensorView<T, NewRank, S>(data_, sizes);
  }

  /// All elements as one contiguous rank-1 view; throws unless contiguous.
  TensorView<T, 1, S> flatten() const { return reshape<1>(Extents<1>{{numel()}}); }

 private:
  template <class... I>
  TRAINKIT_HOST_DEVICE std::int64_t offset_of(I... index) const noexcept {
    const std::int64_t idx[] = {index..., 0};
    std::int64_t off = 0;
    for (int d = 0; d < Rank; ++d) {
#if TRAINKIT_DEBUG
      if (idx[d] < 0 || idx[d] >= sizes_[d]) detail::index_out_of_bounds(d, idx[d], sizes_[d]);
#endif
      off += idx[d] * strides_[d];
    }
    return off;
  }

  void check_dim(int dim, const char* what) const {
    TRAINKIT_CHECK(dim >= 0 && dim < Rank, what, ": dimension ", dim, " out of range for rank ",
                   Rank);
  }

  T* data_ = nullptr;
  Extents<Rank> sizes_{};
  Extents<Rank> strides_{};
};

/// Shorthands: HostView<float, 2>, DeviceView<const bf16, 1>.
template <class T, int Rank>
using HostView = TensorView<T, Rank, Space::kHost>;
template <class T, int Rank>
using DeviceView = TensorView<T, Rank, Space::kDevice>;

/// A contiguous view from a pointer and extents: `make_view(p, {rows, cols})`.
template <Space S = Space::kHost, class T, int Rank>
TensorView<T, Rank, S> make_view(T* data, const std::int64_t (&sizes)[Rank]) {
  (void)Shape(std::span<const std::int64_t>(sizes, Rank));  // negative or overflowing: throws
  Extents<Rank> e;
  for (int d = 0; d < Rank; ++d) e[d] = sizes[d];
  return TensorView<T, Rank, S>(data, e);
}

TRAINKIT_NAMESPACE_END
