// SPDX-License-Identifier: MIT
// trainkit/core/any_tensor.hpp: type-erased host tensors for checkpoints and file formats, where
// the element type is only known at run time. `AnyTensorView` is a non-owning (dtype, shape, bytes)
// triple — e.g. a zero-copy window into an mmapped file; `AnyTensor` owns 64-byte aligned bytes.
// Both are contiguous and row-major; `as<T, Rank>()` recovers a typed view after checking the
// dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/core/allocator.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN

namespace detail {
template <class T, int Rank>
TensorView<T, Rank, Space::kHost> typed_view(T* data, DType dtype, const Shape& shape) {
  TRAINKIT_CHECK(dtype == dtype_of<std::remove_const_t<T>>, "tensor holds ", dtype_name(dtype),
                 ", requested ", dtype_name(dtype_of<std::remove_const_t<T>>));
  TRAINKIT_CHECK(shape.rank() == Rank, "tensor has rank ", shape.rank(), " (shape ",
                 shape.to_string(), "), requested rank ", Rank);
  Extents<Rank> e;
  for (int d = 0; d < Rank; ++d) e[d] = shape[d];
  return TensorView<T, Rank, Space::kHost>(data, e);
}
/// The bytes of `shape` elements of `dtype`; throws trainkit::Error past 2^63 - 1.
inline std::size_t checked_bytes(DType dtype, const Shape& shape) {
  const auto size = static_cast<std::int64_t>(dtype_size(dtype));
  TRAINKIT_CHECK(size == 0 || shape.numel() <= std::numeric_limits<std::int64_t>::max() / size,
                 "a tensor of shape ", shape.to_string(), " and dtype ", dtype_name(dtype),
                 " would hold more than 2^63 - 1 bytes");
  return std::size_t(shape.numel()) * std::size_t(size);
}
}  // namespace detail

/// A non-owning, read-only, contiguous host tensor of run-time dtype.
class AnyTensorView {
 public:
  /// An empty view: F32, shape [0], no data.
  AnyTensorView() = default;
  /// Throws trainkit::Error when the shape's bytes pass 2^63 - 1.
  AnyTensorView(DType dtype, const Shape& shape, const void* data)
      : dtype_(dtype), shape_(shape), data_(static_cast<const std::byte*>(data)) {
    detail::checked_bytes(dtype, shape);
  }

  /// Wraps a typed host view; throws unless it is contiguous.
  template <class T, int Rank>
  static AnyTensorView of(TensorView<T, Rank, Space::kHost> view) {
    TRAINKIT_CHECK(view.is_contiguous(), "AnyTensorView::of needs a contiguous view, got shape ",
                   view.shape().to_string());
    return AnyTensorView(dtype_of<std::remove_const_t<T>>, view.shape(), view.data());
  }

  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  const std::byte* data() const noexcept { return data_; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::size_t bytes() const noexcept { return std::size_t(numel()) * dtype_size(dtype_); }

  /// A typed view; throws trainkit::Error when T or Rank do not match.
  template <class T, int Rank>
  TensorView<const T, Rank, Space::kHost> as() const {
    return detail::typed_view<const T, Rank>(reinterpret_cast<const T*>(data_), dtype_, shape_);
  }

 private:
  DType dtype_ = DType::kF32;
  Shape shape_ = detail::empty_shape();  // not [], a scalar: there are no bytes to view
  const std::byte* data_ = nullptr;
};

/// An owning, contiguous host tensor of run-time dtype (64-byte aligned).
class AnyTensor {
 public:
  /// An empty tensor: F32, shape [0], no memory. A moved-from tensor is left in the same state.
  AnyTensor() = default;
  /// Uninitialised storage for `shape` elements of `dtype`.
  AnyTensor(DType dtype, const Shape& shape)
      : dtype_(dtype),
        shape_(shape),
        memory_(detail::checked_bytes(dtype, shape), MemoryKind::kHost) {}

  AnyTensor(AnyTensor&& other) noexcept
      : dtype_(other.dtype_),
        shape_(std::exchange(other.shape_, detail::empty_shape())),
        memory_(std::move(other.memory_)) {}
  AnyTensor& operator=(AnyTensor&& other) noexcept {
    if (this != &other) {
      dtype_ = other.dtype_;
      shape_ = std::exchange(other.shape_, detail::empty_shape());
      memory_ = std::move(other.memory_);
    }
    return *this;
  }

  /// A deep copy of a view's bytes.
  static AnyTensor copy_of(const AnyTensorView& view) {
    AnyTensor t(view.dtype(), view.shape());
    if (t.bytes() != 0) std::memcpy(t.data(), view.data(), t.bytes());
    return t;
  }

  /// A deep copy of a typed host view (any strides).
  template <class T, int Rank>
  static AnyTensor copy_of(TensorView<T, Rank, Space::kHost> view) {
    using V = std::remove_const_t<T>;
    AnyTensor t(dtype_of<V>, view.shape());
    auto dst = t.as<V, Rank>();
    if (view.is_contiguous()) {
      if (t.bytes() != 0) std::memcpy(dst.data(), view.data(), t.bytes());
    } else {
      std::int64_t idx[Rank > 0 ? Rank : 1] = {};
      V* out = dst.data();
      for (std::int64_t n = 0, total = view.numel(); n < total; ++n) {
        std::int64_t off = 0;
        for (int d = 0; d < Rank; ++d) off += idx[d] * view.stride(d);
        out[n] = view.data()[off];
        for (int d = Rank - 1; d >= 0; --d) {
          if (++idx[d] < view.size(d)) break;
          idx[d] = 0;
        }
      }
    }
    return t;
  }

  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  std::byte* data() noexcept { return static_cast<std::byte*>(memory_.get()); }
  const std::byte* data() const noexcept { return static_cast<const std::byte*>(memory_.get()); }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::size_t bytes() const noexcept { return std::size_t(numel()) * dtype_size(dtype_); }

  AnyTensorView view() const noexcept { return AnyTensorView(dtype_, shape_, data()); }
  operator AnyTensorView() const noexcept { return view(); }  // NOLINT: owning → view

  template <class T, int Rank>
  TensorView<T, Rank, Space::kHost> as() {
    return detail::typed_view<T, Rank>(reinterpret_cast<T*>(data()), dtype_, shape_);
  }
  template <class T, int Rank>
  TensorView<const T, Rank, Space::kHost> as() const {
    return detail::typed_view<const T, Rank>(reinterpret_cast<const T*>(data()), dtype_, shape_);
  }

 private:
  DType dtype_ = DType::kF32;
  Shape shape_ = detail::empty_shape();  // never claims bytes it has no memory for
  Allocation memory_;
};

TRAINKIT_NAMESPACE_END
