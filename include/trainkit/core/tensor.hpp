// SPDX-License-Identifier: MIT
// trainkit/core/tensor.hpp: `Tensor<T, Space>`, an owning, contiguous, row-major tensor with a
// runtime Shape. It allocates through core/allocator.hpp (64-byte aligned host, pinned host or
// device memory) and hands out TensorViews of a compile-time rank for kernels and layers.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/core/allocator.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN

/// An owning tensor of trivially copyable T in memory space S. Contents are uninitialised after
/// construction (like torch.empty); use `zeros()`/`fill()` for values. Move-only: copies between
/// tensors are explicit (`clone()`, trainkit::copy).
template <class T, Space S = Space::kHost>
class Tensor {
  static_assert(std::is_trivially_copyable_v<T>,
                "trainkit: Tensor elements must be trivially copyable");
  static_assert(!std::is_const_v<T>,
                "trainkit: Tensor<const T> makes no sense; take a view of const T");

 public:
  using value_type = T;
  static constexpr Space space = S;

  /// An empty tensor: shape [0], no memory (like torch.Tensor()), so numel() and bytes() are 0
  /// and empty() is true. A moved-from tensor is left in the same state.
  Tensor() = default;

  /// Allocates shape.numel() elements: host tensors in 64-byte aligned memory, device tensors in
  /// device memory on the current device.
  explicit Tensor(const Shape& shape)
      : Tensor(shape, S == Space::kDevice ? MemoryKind::kDevice : MemoryKind::kHost) {}

  /// Allocates host memory of the given kind (kHost or kPinned) — only for host tensors.
  Tensor(const Shape& shape, MemoryKind kind) : shape_(shape) {
    if constexpr (S == Space::kHost) {
      TRAINKIT_CHECK(kind != MemoryKind::kDevice, "a host Tensor cannot hold device memory");
    } else {
      TRAINKIT_CHECK(kind == MemoryKind::kDevice, "a device Tensor needs MemoryKind::kDevice");
    }
    const auto n = static_cast<std::size_t>(shape.numel());
    TRAINKIT_CHECK(n <= SIZE_MAX / sizeof(T), "tensor of shape ", shape.to_string(),
                   " is too large");
    memory_ = Allocation(n * sizeof(T), kind);
  }

  /// A host tensor filled with zeros (all-zero bytes, which is +0 for every float type).
  static Tensor zeros(const Shape& shape) {
    static_assert(S == Space::kHost, "trainkit: Tensor::zeros is host-only; use a device memset");
    Tensor t(shape);
    if (t.bytes() != 0) std::memset(t.data(), 0, t.bytes());
    return t;
  }

  /// A host tensor with every element set to `value`.
  static Tensor full(const Shape& shape, const T& value) {
    Tensor t(shape);
    t.fill(value);
    return t;
  }

  Tensor(Tensor&& other) noexcept
      : shape_(std::exchange(other.shape_, detail::empty_shape())),
        memory_(std::move(other.memory_)) {}
  Tensor& operator=(Tensor&& other) noexcept {
    if (this != &other) {
      shape_ = std::exchange(other.shape_, detail::empty_shape());
      memory_ = std::move(other.memory_);
    }
    return *this;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  T* data() noexcept { return static_cast<T*>(memory_.get()); }
  const T* data() const noexcept { return static_cast<const T*>(memory_.get()); }
  const Shape& shape() const noexcept { return shape_; }
  int rank() const noexcept { return shape_.rank(); }
  std::int64_t size(int d) const { return shape_.at(d); }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel()) * sizeof(T); }
  bool empty() const noexcept { return numel() == 0; }
  DType dtype() const noexcept { return dtype_of<T>; }
  /// The memory actually obtained (a kPinned request falls back to kHost without a device).
  MemoryKind memory_kind() const noexcept { return memory_.kind(); }

  /// A view of rank R; throws unless R equals the tensor's rank.
  template <int R>
  TensorView<T, R, S> view() {
    return TensorView<T, R, S>(data(), extents<R>());
  }
  template <int R>
  TensorView<const T, R, S> view() const {
    return TensorView<const T, R, S>(data(), extents<R>());
  }
  /// All elements as a rank-1 view.
  TensorView<T, 1, S> flat() { return TensorView<T, 1, S>(data(), Extents<1>{{numel()}}); }
  TensorView<const T, 1, S> flat() const {
    return TensorView<const T, 1, S>(data(), Extents<1>{{numel()}});
  }

  /// Changes the shape in place; the element count must stay the same.
  void reshape(const Shape& shape) {
    TRAINKIT_CHECK(shape.numel() == numel(), "reshape from ", shape_.to_string(), " to ",
                   shape.to_string(), " changes the element count");
    shape_ = shape;
  }

  /// Sets every element (host tensors only).
  void fill(const T& value) {
    static_assert(S == Space::kHost, "trainkit: Tensor::fill is host-only");
    T* p = data();
    for (std::int64_t i = 0, n = numel(); i < n; ++i) p[i] = value;
  }

  /// A deep copy in the same space and memory kind.
  Tensor clone() const {
    Tensor t = S == Space::kHost ? Tensor(shape_, memory_.kind()) : Tensor(shape_);
    copy_bytes(t.data(), S, data(), S, bytes(), "Tensor::clone");
    return t;
  }

 private:
  template <int R>
  Extents<R> extents() const {
    TRAINKIT_CHECK(R == shape_.rank(), "view<", R, ">() of a tensor of rank ", shape_.rank(),
                   " (shape ", shape_.to_string(), ")");
    Extents<R> e;
    for (int d = 0; d < R; ++d) e[d] = shape_[d];
    return e;
  }

  Shape shape_ = detail::empty_shape();  // never claims elements it has no memory for
  Allocation memory_;
};

template <class T>
using HostTensor = Tensor<T, Space::kHost>;
template <class T>
using DeviceTensor = Tensor<T, Space::kDevice>;

TRAINKIT_NAMESPACE_END
