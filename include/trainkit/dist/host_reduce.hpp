// SPDX-License-Identifier: MIT
// trainkit/dist/host_reduce.hpp: the element-wise combine step of host collectives,
// dst[i] = a[i] (+|max|min) b[i] for every reducible dtype, used by ThreadComm's ring and by
// MpiComm's BF16/F16 reduction operators and averaging. 16-bit floats are combined in f32 and
// rounded once per step (what NCCL does), integers wrap on overflow instead of being undefined.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace dist {
namespace detail {

/// The type a step computes in: f32 for the 16-bit floats, T otherwise.
template <class T>
using combine_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

template <class T>
inline T add_values(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    // Two's-complement wrap-around, as NCCL and MPI do, without signed-overflow UB.
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <class T>
inline bool is_nan_value(T x) noexcept {
  if constexpr (std::is_integral_v<T>) {
    return false;
  } else {
    return !(x == x);
  }
}

/// max/min that return NaN when either operand is NaN (a NaN gradient is never hidden).
template <class T>
inline T max_value(T a, T b) noexcept {
  return (b > a || is_nan_value(b)) ? b : a;
}
template <class T>
inline T min_value(T a, T b) noexcept {
  return (b < a || is_nan_value(b)) ? b : a;
}

/// dst[i] = a[i] op b[i] for i < n; with `divisor` > 1 the sum is then divided by it (the last
/// step of an average). `op` must not be kAvg here: callers pass kSum plus the divisor. dst may
/// alias a or b (element i is read before it is written).
template <class T>
inline void combine_typed(ReduceOp op, T* dst, const T* a, const T* b, std::int64_t n,
                          int divisor) {
  using C = combine_t<T>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if (divisor > 1) {
        const C d = static_cast<C>(divisor);
        for (std::int64_t i = 0; i < n; ++i)
          dst[i] = T(add_values(static_cast<C>(a[i]), static_cast<C>(b[i])) / d);
      } else {
        for (std::int64_t i = 0; i < n; ++i)
          dst[i] = T(add_values(static_cast<C>(a[i]), static_cast<C>(b[i])));
      }
      return;
    case ReduceOp::kMax:
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] = T(max_value(static_cast<C>(a[i]), static_cast<C>(b[i])));
      return;
    case ReduceOp::kMin:
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] = T(min_value(static_cast<C>(a[i]), static_cast<C>(b[i])));
      return;
  }
}

/// data[i] /= divisor (the averaging of backends that reduce with a sum first).
template <class T>
inline void divide_typed(T* data, std::int64_t n, int divisor) {
  using C = combine_t<T>;
  const C d = static_cast<C>(divisor);
  for (std::int64_t i = 0; i < n; ++i) data[i] = T(static_cast<C>(data[i]) / d);
}

/// Calls f(T{}) with the C++ type of a reducible dtype.
template <class F>
inline void visit_reducible(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); return;
    case DType::kF64: f(double{}); return;
    case DType::kBF16: f(bf16{}); return;
    case DType::kF16: f(f16{}); return;
    case DType::kI32: f(std::int32_t{}); return;
    case DType::kI64: f(std::int64_t{}); return;
    default: break;
  }
  TRAINKIT_FAIL("dist: cannot reduce ", dtype_name(t),
                " (supported: F32, BF16, F16, F64, I32, I64)");
}

/// Type-erased combine_typed over `n` elements of `dtype`.
inline void combine(DType dtype, ReduceOp op, void* dst, const void* a, const void* b,
                    std::int64_t n, int divisor) {
  if (n <= 0) return;
  visit_reducible(dtype, [&](auto tag) {
    using T = decltype(tag);
    combine_typed<T>(op, static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b),
                     n, divisor);
  });
}

/// Type-erased divide_typed.
inline void divide(DType dtype, void* data, std::int64_t n, int divisor) {
  if (n <= 0 || divisor <= 1) return;
  visit_reducible(dtype, [&](auto tag) {
    using T = decltype(tag);
    divide_typed<T>(static_cast<T*>(data), n, divisor);
  });
}

/// memcpy that tolerates n == 0 with null pointers and dst == src.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
}

}  // namespace detail
}  // namespace dist
TRAINKIT_NAMESPACE_END
