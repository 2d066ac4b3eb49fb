// SPDX-License-Identifier: MIT
// trainkit/core/shape.hpp: `Shape`, the runtime list of extents of an owning or type-erased tensor
// (rank ≤ 8, stored inline: no allocation), and `Space`, where a tensor's memory lives. Views carry
// their rank in the type instead (core/tensor_view.hpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN

/// Where a tensor's memory lives. Part of the view type, so handing device memory to host code is
/// a compile error rather than a segfault.
enum class Space : std::uint8_t { kHost, kDevice };
inline constexpr Space host = Space::kHost;
inline constexpr Space device = Space::kDevice;

inline constexpr const char* space_name(Space s) noexcept {
  return s == Space::kHost ? "host" : "device";
}

/// The largest rank a Shape (and so a Tensor or AnyTensor) can have.
inline constexpr int kMaxRank = 8;

/// The extents of a tensor, outermost first (row-major). A default Shape has rank 0 (a scalar,
/// one element). Extents are non-negative; a zero extent makes an empty tensor.
class Shape {
 public:
  Shape() noexcept = default;
  Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.size()); }
  explicit Shape(std::span<const std::int64_t> dims) { assign(dims.data(), dims.size()); }

  int rank() const noexcept { return rank_; }
  std::int64_t operator[](int d) const noexcept { return dims_[d]; }

  /// Bounds-checked extent; throws trainkit::Error for a bad dimension.
  std::int64_t at(int d) const {
    TRAINKIT_CHECK(d >= 0 && d < rank_, "dimension ", d, " out of range for shape ", to_string());
    return dims_[d];
  }

  /// Sets extent d; throws for a bad dimension, a negative extent or an element count past
  /// 2^63 - 1 (the shape is then unchanged).
  void set(int d, std::int64_t extent) {
    TRAINKIT_CHECK(d >= 0 && d < rank_, "dimension ", d, " out of range for shape ", to_string());
    TRAINKIT_CHECK(extent >= 0, "negative extent ", extent, " for dimension ", d);
    std::int64_t dims[kMaxRank];
    for (int k = 0; k < rank_; ++k) dims[k] = k == d ? extent : dims_[k];
    *this = Shape(std::span<const std::int64_t>(dims, std::size_t(rank_)));
  }

  const std::int64_t* begin() const noexcept { return dims_; }
  const std::int64_t* end() const noexcept { return dims_ + rank_; }
  std::span<const std::int64_t> dims() const noexcept { return {dims_, std::size_t(rank_)}; }

  /// Number of elements (1 for rank 0). Overflow was rejected at construction; with a zero
  /// extent the other extents' product may not fit, and the count is 0 whatever their order.
  std::int64_t numel() const noexcept {
    for (int d = 0; d < rank_; ++d)
      if (dims_[d] == 0) return 0;
    std::int64_t n = 1;
    for (int d = 0; d < rank_; ++d) n *= dims_[d];
    return n;
  }

  /// "[2, 3, 4]" (and "[]" for a scalar), for messages and metadata.
  std::string to_string() const { return describe(dims_, std::size_t(rank_)); }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (int d = 0; d < a.rank_; ++d)
      if (a.dims_[d] != b.dims_[d]) return false;
    return true;
  }

 private:
  // Refuses negative extents and element counts past 2^63 - 1. The count is a function of the
  // extents, not of their order: a zero extent anywhere makes it 0 (so [0, 2^40, 2^40] and
  // [2^40, 2^40, 0], its transpose, are both accepted).
  void assign(const std::int64_t* dims, std::size_t n) {
    TRAINKIT_CHECK(n <= std::size_t(kMaxRank), "rank ", n,
                   " exceeds trainkit::kMaxRank = ", kMaxRank);
    bool empty = false;
    for (std::size_t d = 0; d < n; ++d) {
      TRAINKIT_CHECK(dims[d] >= 0, "negative extent ", dims[d], " in dimension ", d);
      empty = empty || dims[d] == 0;
    }
    std::int64_t total = 1;
    for (std::size_t d = 0; d < n && !empty; ++d) {
      TRAINKIT_CHECK(total <= std::numeric_limits<std::int64_t>::max() / dims[d], "shape ",
                     Shape::describe(dims, n), " overflows the 64-bit element count (",
                     "more than 2^63 - 1 elements)");
      total *= dims[d];
    }
    rank_ = int(n);
    for (std::size_t d = 0; d < n; ++d) dims_[d] = dims[d];
  }

  static std::string describe(const std::int64_t* dims, std::size_t n) {
    std::string s = "[";
    for (std::size_t d = 0; d < n; ++d) {
      if (d) s += ", ";
      s += std::to_string(dims[d]);
    }
    return s + "]";
  }

  std::int64_t dims_[kMaxRank] = {};
  int rank_ = 0;
};

namespace detail {
/// Shape [0]: what default-constructed and moved-from tensors have (a default Shape, [], would be
/// a scalar of one element, which they hold no memory for).
inline Shape empty_shape() noexcept { return Shape{0}; }  // cannot throw
}  // namespace detail

TRAINKIT_NAMESPACE_END
