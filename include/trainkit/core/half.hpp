// SPDX-License-Identifier: MIT
// trainkit/core/half.hpp: the 16-bit float value types `f16` (IEEE binary16) and `bf16` (bfloat16),
// usable in host and device code and layout-compatible with CUDA's `__half` / `__nv_bfloat16`.
// Conversions are round-to-nearest-even and bit-exact with CUDA's host conversion functions
// (including their canonical NaNs), so a tensor converted on the CPU and on the GPU holds the same
// bits. Arithmetic is done in float and rounded back, which equals correctly rounded 16-bit math.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

TRAINKIT_NAMESPACE_BEGIN

namespace detail {

// __builtin_bit_cast rather than std::bit_cast: the std one is a host function, which nvcc does
// not let device code call without --expt-relaxed-constexpr; the builtin works in both.
TRAINKIT_HOST_DEVICE inline constexpr std::uint32_t f32_to_u32(float f) noexcept {
  return __builtin_bit_cast(std::uint32_t, f);
}
TRAINKIT_HOST_DEVICE inline constexpr float u32_to_f32(std::uint32_t u) noexcept {
  return __builtin_bit_cast(float, u);
}

// Round-to-nearest-even of `value >> shift`, given the bits shifted out (`rest`) and `half`, the
// weight of the highest shifted-out bit. A carry out of the mantissa correctly bumps the exponent.
TRAINKIT_HOST_DEVICE inline constexpr std::uint32_t round_shifted_rne(std::uint32_t kept,
                                                                      std::uint32_t rest,
                                                                      std::uint32_t half) noexcept {
  return kept + ((rest > half || (rest == half && (kept & 1U) != 0U)) ? 1U : 0U);
}

}  // namespace detail

/// The bits CUDA produces for every NaN converted to f16 or bf16 (sign and payload dropped).
inline constexpr std::uint16_t kF16CanonicalNaN = 0x7fff;
inline constexpr std::uint16_t kBF16CanonicalNaN = 0x7fff;

/// float -> IEEE binary16 bits, round-to-nearest-even. Overflow (|x| >= 65520) gives ±Inf, values
/// below half the smallest subnormal give ±0, every NaN gives kF16CanonicalNaN (0x7fff). Identical
/// to CUDA's host `__float2half_rn`; device code uses `cvt.rn.f16.f32`, NaNs canonicalised alike.
TRAINKIT_HOST_DEVICE inline constexpr std::uint16_t float_to_f16_bits(float f) noexcept {
  const std::uint32_t x = detail::f32_to_u32(f);
  const std::uint32_t u = x & 0x7fffffffU;
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) {
    // One instruction; the NaN test keeps the bits identical to the host path by construction.
    std::uint16_t r = 0;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return u > 0x7f800000U ? kF16CanonicalNaN : r;
  }
#endif
  const std::uint32_t sign = (x >> 16) & 0x8000U;
  if (u >= 0x7f800000U)
    return u == 0x7f800000U ? static_cast<std::uint16_t>(sign | 0x7c00U) : kF16CanonicalNaN;
  if (u >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // >= 65520: Inf
  if (u >= 0x38800000U) {  // >= 2^-14: a normal f16; rebias the exponent by 127 - 15
    const std::uint32_t r =
        detail::round_shifted_rne((u - 0x38000000U) >> 13, u & 0x1fffU, 0x1000U);
    return static_cast<std::uint16_t>(sign | r);
  }
  if (u <= 0x33000000U) return static_cast<std::uint16_t>(sign);  // <= 2^-25: ties to even zero
  // Subnormal f16: the value is mantissa * 2^(exponent - 150); f16's unit is 2^-24.
  const std::uint32_t mantissa = (u & 0x7fffffU) | 0x800000U;
  const std::uint32_t shift = 0x7eU - (u >> 23);  // 14..24
  const std::uint32_t r = detail::round_shifted_rne(
      mantissa >> shift, mantissa & ((1U << shift) - 1U), 1U << (shift - 1U));
  return static_cast<std::uint16_t>(sign | r);
}

/// IEEE binary16 bits -> float (exact). Every NaN gives the float 0x7fffffff, as CUDA's
/// `__half2float` does on the host; the device path is made to agree.
TRAINKIT_HOST_DEVICE inline constexpr float f16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t magnitude = h & 0x7fffU;
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) {
    float r = 0.0f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return magnitude > 0x7c00U ? detail::u32_to_f32(0x7fffffffU) : r;
  }
#endif
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  if (magnitude >= 0x7c00U)
    return detail::u32_to_f32(magnitude == 0x7c00U ? (sign | 0x7f800000U) : 0x7fffffffU);
  if (magnitude >= 0x0400U) return detail::u32_to_f32(sign | ((magnitude + 0x1c000U) << 13));
  // Zero or subnormal: magnitude * 2^-24 is exact in float and a normal float (no FTZ/DAZ issue).
  const float value = static_cast<float>(magnitude) * 0x1p-24f;
  return detail::u32_to_f32(sign | detail::f32_to_u32(value));
}

/// float -> bfloat16 bits, round-to-nearest-even (overflow rounds to ±Inf), every NaN gives
/// kBF16CanonicalNaN (0x7fff). Identical to CUDA's host `__float2bfloat16_rn`; device code for
/// sm_80+ uses `cvt.rn.bf16.f32`, NaNs canonicalised alike.
TRAINKIT_HOST_DEVICE inline constexpr std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t x = detail::f32_to_u32(f);
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
  if (!__builtin_is_constant_evaluated()) {
    std::uint16_t r = 0;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return (x & 0x7fffffffU) > 0x7f800000U ? kBF16CanonicalNaN : r;
  }
#endif
#endif
  if ((x & 0x7fffffffU) > 0x7f800000U) return kBF16CanonicalNaN;
  return static_cast<std::uint16_t>(detail::round_shifted_rne(x >> 16, x & 0xffffU, 0x8000U));
}

/// bfloat16 bits -> float (exact; NaN payloads are kept, as in CUDA).
TRAINKIT_HOST_DEVICE inline constexpr float bf16_bits_to_float(std::uint16_t h) noexcept {
  return detail::u32_to_f32(static_cast<std::uint32_t>(h) << 16);
}

namespace detail {

/// The value-type machinery f16 and bf16 share; they differ only in the encoding, given by
/// Encoding::to_bits(float) and Encoding::to_float(bits). Construction from float rounds to
/// nearest even; from double it goes through float (two roundings: rarely 1 ulp off the directly
/// rounded value); from an integer, through float. Arithmetic converts to float, computes, and
/// rounds back: for + - * / this is exactly the correctly rounded 16-bit result, so it matches
/// native half/bfloat16 arithmetic on the GPU. Comparisons follow float: -0 == +0, NaN compares
/// unequal to everything. Unary minus flips the sign bit only (exact, also for NaN and zero), as
/// __hneg does.
/// T is the derived value type (f16 or bf16): every operator takes and returns T.
template <class Encoding, class T>
struct Float16 {
  Float16() = default;
  TRAINKIT_HOST_DEVICE explicit constexpr Float16(float v) noexcept : bits_(Encoding::to_bits(v)) {}
  TRAINKIT_HOST_DEVICE explicit constexpr Float16(double v) noexcept
      : bits_(Encoding::to_bits(static_cast<float>(v))) {}
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  TRAINKIT_HOST_DEVICE explicit constexpr Float16(I v) noexcept
      : bits_(Encoding::to_bits(static_cast<float>(v))) {}

  /// The value whose encoding is `bits` (no rounding; NaN payloads are kept as given).
  TRAINKIT_HOST_DEVICE static constexpr T from_bits(std::uint16_t bits) noexcept {
    T h;
    static_cast<Float16&>(h).bits_ = bits;
    return h;
  }
  TRAINKIT_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  TRAINKIT_HOST_DEVICE explicit constexpr operator float() const noexcept {
    return Encoding::to_float(bits_);
  }
  TRAINKIT_HOST_DEVICE explicit constexpr operator double() const noexcept {
    return static_cast<double>(Encoding::to_float(bits_));
  }

  TRAINKIT_HOST_DEVICE constexpr T& operator+=(T o) noexcept {
    T& self = static_cast<T&>(*this);
    return self = self + o;
  }
  TRAINKIT_HOST_DEVICE constexpr T& operator-=(T o) noexcept {
    T& self = static_cast<T&>(*this);
    return self = self - o;
  }
  TRAINKIT_HOST_DEVICE constexpr T& operator*=(T o) noexcept {
    T& self = static_cast<T&>(*this);
    return self = self * o;
  }
  TRAINKIT_HOST_DEVICE constexpr T& operator/=(T o) noexcept {
    T& self = static_cast<T&>(*this);
    return self = self / o;
  }

  TRAINKIT_HOST_DEVICE friend constexpr T operator-(T a) noexcept {
    return from_bits(static_cast<std::uint16_t>(a.bits() ^ 0x8000U));
  }
  TRAINKIT_HOST_DEVICE friend constexpr T operator+(T a) noexcept { return a; }
  TRAINKIT_HOST_DEVICE friend constexpr T operator+(T a, T b) noexcept {
    return T(static_cast<float>(a) + static_cast<float>(b));
  }
  TRAINKIT_HOST_DEVICE friend constexpr T operator-(T a, T b) noexcept {
    return T(static_cast<float>(a) - static_cast<float>(b));
  }
  TRAINKIT_HOST_DEVICE friend constexpr T operator*(T a, T b) noexcept {
    return T(static_cast<float>(a) * static_cast<float>(b));
  }
  TRAINKIT_HOST_DEVICE friend constexpr T operator/(T a, T b) noexcept {
    return T(static_cast<float>(a) / static_cast<float>(b));
  }

  TRAINKIT_HOST_DEVICE friend constexpr bool operator==(T a, T b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }
  TRAINKIT_HOST_DEVICE friend constexpr bool operator!=(T a, T b) noexcept {
    return static_cast<float>(a) != static_cast<float>(b);
  }
  TRAINKIT_HOST_DEVICE friend constexpr bool operator<(T a, T b) noexcept {
    return static_cast<float>(a) < static_cast<float>(b);
  }
  TRAINKIT_HOST_DEVICE friend constexpr bool operator<=(T a, T b) noexcept {
    return static_cast<float>(a) <= static_cast<float>(b);
  }
  TRAINKIT_HOST_DEVICE friend constexpr bool operator>(T a, T b) noexcept {
    return static_cast<float>(a) > static_cast<float>(b);
  }
  TRAINKIT_HOST_DEVICE friend constexpr bool operator>=(T a, T b) noexcept {
    return static_cast<float>(a) >= static_cast<float>(b);
  }

 private:
  std::uint16_t bits_;
};

struct F16Encoding {
  TRAINKIT_HOST_DEVICE static constexpr std::uint16_t to_bits(float v) noexcept {
    return float_to_f16_bits(v);
  }
  TRAINKIT_HOST_DEVICE static constexpr float to_float(std::uint16_t b) noexcept {
    return f16_bits_to_float(b);
  }
};
struct BF16Encoding {
  TRAINKIT_HOST_DEVICE static constexpr std::uint16_t to_bits(float v) noexcept {
    return float_to_bf16_bits(v);
  }
  TRAINKIT_HOST_DEVICE static constexpr float to_float(std::uint16_t b) noexcept {
    return bf16_bits_to_float(b);
  }
};

}  // namespace detail

/// IEEE binary16 value type: 2 bytes, the same layout as `__half`; trivial default construction.
/// Semantics in detail::Float16.
struct f16 : detail::Float16<detail::F16Encoding, f16> {
  using Float16::Float16;
  f16() = default;
};

/// bfloat16 value type (8-bit exponent like float, 8-bit significand): 2 bytes, the same layout as
/// `__nv_bfloat16`; trivial default construction. Semantics in detail::Float16.
struct bf16 : detail::Float16<detail::BF16Encoding, bf16> {
  using Float16::Float16;
  bf16() = default;
};

static_assert(sizeof(f16) == 2 && alignof(f16) == 2, "f16 must match __half's layout");
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2, "bf16 must match __nv_bfloat16's layout");
static_assert(std::is_standard_layout_v<f16> && std::is_trivially_copyable_v<f16> &&
              std::is_trivially_default_constructible_v<f16>);
static_assert(std::is_standard_layout_v<bf16> && std::is_trivially_copyable_v<bf16> &&
              std::is_trivially_default_constructible_v<bf16>);

namespace detail {
/// The exponent bits of a 16-bit float type (all set: infinity or NaN).
template <class H>
inline constexpr std::uint16_t kExponentMask = std::is_same_v<H, f16> ? 0x7c00 : 0x7f80;
template <class H>
concept Float16Type = std::is_same_v<H, f16> || std::is_same_v<H, bf16>;
}  // namespace detail

/// Classification of f16 and bf16 by bits (exact, and unaffected by -ffast-math's finite-math
/// assumptions).
// Three one-line bit tests of the same shape, one per predicate.
template <detail::Float16Type H>
TRAINKIT_HOST_DEVICE inline constexpr bool is_nan(H h) noexcept {
  return (h.bits() & 0x7fffU) > detail::kExponentMask<H>;
}
template <detail::Float16Type H>
TRAINKIT_HOST_DEVICE inline constexpr bool is_inf(H h) noexcept {
  return (h.bits() & 0x7fffU) == detail::kExponentMask<H>;
}
template <detail::Float16Type H>
TRAINKIT_HOST_DEVICE inline constexpr bool is_finite(H h) noexcept {
  return (h.bits() & detail::kExponentMask<H>) != detail::kExponentMask<H>;
}

#if TRAINKIT_WITH_CUDA
/// Bit copies between trainkit's and CUDA's 16-bit types (no rounding, NaN payloads kept).
TRAINKIT_HOST_DEVICE inline __half to_cuda(f16 h) noexcept {
  __half_raw raw;
  raw.x = h.bits();
  return __half(raw);
}
TRAINKIT_HOST_DEVICE inline f16 from_cuda(__half h) noexcept {
  return f16::from_bits(static_cast<__half_raw>(h).x);
}
TRAINKIT_HOST_DEVICE inline __nv_bfloat16 to_cuda(bf16 h) noexcept {
  __nv_bfloat16_raw raw;
  raw.x = h.bits();
  return __nv_bfloat16(raw);
}
TRAINKIT_HOST_DEVICE inline bf16 from_cuda(__nv_bfloat16 h) noexcept {
  return bf16::from_bits(static_cast<__nv_bfloat16_raw>(h).x);
}
#endif

namespace detail {
/// The std::numeric_limits members of a 16-bit binary float type T: what f16 and bf16 share, with
/// their format-specific numbers and bit patterns as parameters (the values of min(), lowest(),
/// max(), epsilon(), round_error(), infinity(), quiet_NaN(), signaling_NaN(), denorm_min()).
struct Float16Format {
  bool is_iec559;
  int digits, digits10, max_digits10, min_exponent, min_exponent10, max_exponent, max_exponent10;
  std::uint16_t min, lowest, max, epsilon, round_error, infinity, quiet_nan, signaling_nan,
      denorm_min;
};

template <class T, Float16Format F>
struct Float16Limits {  // `struct` as in libstdc++'s primary template
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = F.is_iec559;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = F.digits;
  static constexpr int digits10 = F.digits10;
  static constexpr int max_digits10 = F.max_digits10;
  static constexpr int radix = 2;
  static constexpr int min_exponent = F.min_exponent;
  static constexpr int min_exponent10 = F.min_exponent10;
  static constexpr int max_exponent = F.max_exponent;
  static constexpr int max_exponent10 = F.max_exponent10;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  TRAINKIT_HOST_DEVICE static constexpr T min() noexcept { return T::from_bits(F.min); }
  TRAINKIT_HOST_DEVICE static constexpr T lowest() noexcept { return T::from_bits(F.lowest); }
  TRAINKIT_HOST_DEVICE static constexpr T max() noexcept { return T::from_bits(F.max); }
  TRAINKIT_HOST_DEVICE static constexpr T epsilon() noexcept { return T::from_bits(F.epsilon); }
  TRAINKIT_HOST_DEVICE static constexpr T round_error() noexcept {
    return T::from_bits(F.round_error);
  }
  TRAINKIT_HOST_DEVICE static constexpr T infinity() noexcept { return T::from_bits(F.infinity); }
  TRAINKIT_HOST_DEVICE static constexpr T quiet_NaN() noexcept { return T::from_bits(F.quiet_nan); }
  TRAINKIT_HOST_DEVICE static constexpr T signaling_NaN() noexcept {
    return T::from_bits(F.signaling_nan);
  }
  TRAINKIT_HOST_DEVICE static constexpr T denorm_min() noexcept {
    return T::from_bits(F.denorm_min);
  }
};

// One format per block of lines (the formatter would put each field on a line of its own).
// clang-format off
// IEEE binary16: 11 significand digits, exponents [-13, 16].
inline constexpr Float16Format kF16Format{
    .is_iec559 = true, .digits = 11, .digits10 = 3, .max_digits10 = 5, .min_exponent = -13,
    .min_exponent10 = -4, .max_exponent = 16, .max_exponent10 = 4,
    .min = 0x0400, .lowest = 0xfbff, .max = 0x7bff, .epsilon = 0x1400, .round_error = 0x3800,
    .infinity = 0x7c00, .quiet_nan = 0x7fff, .signaling_nan = 0x7d00, .denorm_min = 0x0001};
// bfloat16: float's exponent range with 8 significand digits; IEEE-style semantics, but not an
// IEEE 754 format.
inline constexpr Float16Format kBF16Format{
    .is_iec559 = false, .digits = 8, .digits10 = 2, .max_digits10 = 4, .min_exponent = -125,
    .min_exponent10 = -37, .max_exponent = 128, .max_exponent10 = 38,
    .min = 0x0080, .lowest = 0xff7f, .max = 0x7f7f, .epsilon = 0x3c00, .round_error = 0x3f00,
    .infinity = 0x7f80, .quiet_nan = 0x7fff, .signaling_nan = 0x7f81, .denorm_min = 0x0001};
// clang-format on
}  // namespace detail

TRAINKIT_NAMESPACE_END

namespace std {

template <>
struct numeric_limits<::trainkit::f16>
    : ::trainkit::detail::Float16Limits<::trainkit::f16, ::trainkit::detail::kF16Format> {};

template <>
struct numeric_limits<::trainkit::bf16>
    : ::trainkit::detail::Float16Limits<::trainkit::bf16, ::trainkit::detail::kBF16Format> {};

}  // namespace std
