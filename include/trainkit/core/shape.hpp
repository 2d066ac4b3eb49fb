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

  /// Number of elements (1 for rank 0). Overflow was rejected at construction.
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int d = 0; d < rank_; ++d) n *= dims_[d];
    return n;
  }

  /// "[2, 3, 4]" (and "[]" for a scalar), for messages and metadata.
  std::string to_string() const {
    std::string s = "[";
    for (int d = 0; d < rank_; ++d) {
      if (d) s += ", ";
      s += std::to_string(dims_[d]);
    }
    return s + "]";
  }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (int d = 0; d < a.rank_; ++d)
      if (a.dims_[d] != b.dims_[d]) return false;
    return true;
  }

 private:
  void assign(const std::int64_t* dims, std::size_t n) {
    TRAINKIT_CHECK(n <= std::size_t(kMaxRank), "rank ", n,
                   " exceeds trainkit::kMaxRank = ", kMaxRank);
    rank_ = int(n);
    std::int64_t total = 1;
    for (std::size_t d = 0; d < n; ++d) {
      TRAINKIT_CHECK(dims[d] >= 0, "negative extent ", dims[d], " in dimension ", d);
      dims_[d] = dims[d];
      TRAINKIT_CHECK(dims[d] == 0 || total <= std::numeric_limits<std::int64_t>::max() / dims[d],
                     "shape overflows 64-bit element count");
      total *= dims[d];
    }
  }

  std::int64_t dims_[kMaxRank] = {};
  int rank_ = 0;
};

TRAINKIT_NAMESPACE_END
