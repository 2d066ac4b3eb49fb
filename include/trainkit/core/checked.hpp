// SPDX-License-Identifier: MIT
// trainkit/core/checked.hpp: overflow-checked integer arithmetic for sizes computed from
// untrusted values (file headers, shapes, declared lengths). checked_add / checked_mul /
// checked_cast return std::nullopt on overflow; the overloads taking a description throw a
// trainkit::Error that names what was being computed instead. Both operands must have the same
// signedness (mixing them is a compile error, so no silent conversion hides an overflow).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN

namespace detail {

template <class T>
concept CheckedInteger = std::is_integral_v<T> && !std::is_same_v<T, bool>;

template <class A, class B>
concept SameSignedness = std::is_signed_v<A>
== std::is_signed_v<B>;

template <class A, class B>
using CheckedResult = std::common_type_t<A, B>;

}  // namespace detail

/// a + b, or std::nullopt when the sum does not fit the common type of A and B.
template <detail::CheckedInteger A, detail::CheckedInteger B>
requires detail::SameSignedness<A, B>
constexpr std::optional<detail::CheckedResult<A, B>> checked_add(A a, B b) noexcept {
  using T = detail::CheckedResult<A, B>;
  const T x = static_cast<T>(a), y = static_cast<T>(b);
  if constexpr (std::is_unsigned_v<T>) {
    if (x > std::numeric_limits<T>::max() - y) return std::nullopt;
  } else {
    if (y > 0 && x > std::numeric_limits<T>::max() - y) return std::nullopt;
    if (y < 0 && x < std::numeric_limits<T>::min() - y) return std::nullopt;
  }
  return static_cast<T>(x + y);
}

/// a * b, or std::nullopt when the product does not fit the common type of A and B.
template <detail::CheckedInteger A, detail::CheckedInteger B>
requires detail::SameSignedness<A, B>
constexpr std::optional<detail::CheckedResult<A, B>> checked_mul(A a, B b) noexcept {
  using T = detail::CheckedResult<A, B>;
  const T x = static_cast<T>(a), y = static_cast<T>(b);
  if (x == 0 || y == 0) return T{0};
  if constexpr (std::is_unsigned_v<T>) {
    if (x > std::numeric_limits<T>::max() / y) return std::nullopt;
  } else {
    constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
    if (x > 0 ? (y > 0 ? x > hi / y : y < lo / x) : (y > 0 ? x < lo / y : x < hi / y))
      return std::nullopt;
  }
  return static_cast<T>(x * y);
}

/// `v` as a To, or std::nullopt when it is out of To's range (negative into unsigned included).
template <detail::CheckedInteger To, detail::CheckedInteger From>
constexpr std::optional<To> checked_cast(From v) noexcept {
  if (!std::in_range<To>(v)) return std::nullopt;
  return static_cast<To>(v);
}

/// The product of `values` (1 for none), or std::nullopt when it overflows T. Like numpy and
/// the safetensors reference, the first overflowing partial product counts even if a later
/// value is zero.
template <detail::CheckedInteger T>
constexpr std::optional<T> checked_product(std::span<const T> values) noexcept {
  T n = 1;
  for (T v : values) {
    const std::optional<T> next = checked_mul(n, v);
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

namespace detail {
/// *r, or throws trainkit::Error "size overflow: <what...>: a <op> b does not fit in N bits".
template <class R, class A, class B, class... What>
constexpr R value_or_overflow(const std::optional<R>& r, A a, const char* op, B b,
                              const What&... what) {
  if (!r)
    TRAINKIT_FAIL("size overflow: ", what..., ": ", +a, op, +b, " does not fit in ",
                  std::numeric_limits<R>::digits, " bits");
  return *r;
}
}  // namespace detail

/// a + b; throws trainkit::Error "size overflow: <what...>: a + b does not fit ..." otherwise.
/// `what` describes the value (and the file it comes from) for the message.
template <detail::CheckedInteger A, detail::CheckedInteger B, class... What>
requires(detail::SameSignedness<A, B> &&
         sizeof...(What) >
             0) constexpr detail::CheckedResult<A, B> checked_add(A a, B b, const What&... what) {
  return detail::value_or_overflow(checked_add(a, b), a, " + ", b, what...);
}

/// a * b; throws trainkit::Error "size overflow: <what...>: a * b does not fit ..." otherwise.
template <detail::CheckedInteger A, detail::CheckedInteger B, class... What>
requires(detail::SameSignedness<A, B> &&
         sizeof...(What) >
             0) constexpr detail::CheckedResult<A, B> checked_mul(A a, B b, const What&... what) {
  return detail::value_or_overflow(checked_mul(a, b), a, " * ", b, what...);
}

/// `v` as a To; throws trainkit::Error "size overflow: <what...>: v does not fit ..." otherwise.
template <detail::CheckedInteger To, detail::CheckedInteger From, class... What>
requires(sizeof...(What) > 0) constexpr To checked_cast(From v, const What&... what) {
  const std::optional<To> r = checked_cast<To>(v);
  if (!r)
    TRAINKIT_FAIL("size overflow: ", what..., ": ", +v, " is outside [",
                  +std::numeric_limits<To>::min(), ", ", +std::numeric_limits<To>::max(), "]");
  return *r;
}

TRAINKIT_NAMESPACE_END
