// SPDX-License-Identifier: MIT
// trainkit/optim/detail/host_simd.hpp (internal): a minimal float vector for the host loops of
// the fused optimizers. Compilers do not vectorise sqrtf without -fno-math-errno, which a
// header-only library cannot demand, and a scalar sqrt makes AdamW compute-bound (measured 4x
// below the memory bandwidth on a 2-vCPU AVX-512 VM). The widest of AVX-512 / AVX / SSE2 that the
// TU is compiled for is used, else one lane. Every operation is correctly rounded IEEE
// arithmetic, so a vector lane computes exactly what the scalar code computes.
#pragma once

#include <cmath>
#include <cstdint>

#include "trainkit/config.hpp"

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace optim {
namespace detail {

// The vector type differs with the instruction set a TU is compiled for; an inline namespace
// per ISA keeps TUs built with different -m flags from sharing (ODR-merging) these symbols.
#if defined(__AVX512F__)
inline namespace simd_avx512 {
struct VecF {
  static constexpr int kWidth = 16;
  __m512 v;
  static VecF load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static VecF set1(float x) { return {_mm512_set1_ps(x)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  friend VecF operator+(VecF a, VecF b) { return {_mm512_add_ps(a.v, b.v)}; }
  friend VecF operator-(VecF a, VecF b) { return {_mm512_sub_ps(a.v, b.v)}; }
  friend VecF operator*(VecF a, VecF b) { return {_mm512_mul_ps(a.v, b.v)}; }
  friend VecF operator/(VecF a, VecF b) { return {_mm512_div_ps(a.v, b.v)}; }
  friend VecF vsqrt(VecF a) { return {_mm512_sqrt_ps(a.v)}; }
  // max(a, b) as std::fmax would NOT give: NaN in `b` wins, like torch.maximum's propagation.
  friend VecF vmax(VecF a, VecF b) {
    const __mmask16 unordered = _mm512_cmp_ps_mask(b.v, b.v, _CMP_UNORD_Q);
    return {_mm512_mask_blend_ps(unordered, _mm512_max_ps(b.v, a.v), b.v)};
  }
};
}  // namespace simd_avx512
#elif defined(__AVX__)
inline namespace simd_avx {
struct VecF {
  static constexpr int kWidth = 8;
  __m256 v;
  static VecF load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static VecF set1(float x) { return {_mm256_set1_ps(x)}; }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  friend VecF operator+(VecF a, VecF b) { return {_mm256_add_ps(a.v, b.v)}; }
  friend VecF operator-(VecF a, VecF b) { return {_mm256_sub_ps(a.v, b.v)}; }
  friend VecF operator*(VecF a, VecF b) { return {_mm256_mul_ps(a.v, b.v)}; }
  friend VecF operator/(VecF a, VecF b) { return {_mm256_div_ps(a.v, b.v)}; }
  friend VecF vsqrt(VecF a) { return {_mm256_sqrt_ps(a.v)}; }
  friend VecF vmax(VecF a, VecF b) {
    const __m256 unordered = _mm256_cmp_ps(b.v, b.v, _CMP_UNORD_Q);
    return {_mm256_blendv_ps(_mm256_max_ps(b.v, a.v), b.v, unordered)};
  }
};
}  // namespace simd_avx
#elif defined(__SSE2__)
inline namespace simd_sse2 {
struct VecF {
  static constexpr int kWidth = 4;
  __m128 v;
  static VecF load(const float* p) { return {_mm_loadu_ps(p)}; }
  static VecF set1(float x) { return {_mm_set1_ps(x)}; }
  void store(float* p) const { _mm_storeu_ps(p, v); }
  friend VecF operator+(VecF a, VecF b) { return {_mm_add_ps(a.v, b.v)}; }
  friend VecF operator-(VecF a, VecF b) { return {_mm_sub_ps(a.v, b.v)}; }
  friend VecF operator*(VecF a, VecF b) { return {_mm_mul_ps(a.v, b.v)}; }
  friend VecF operator/(VecF a, VecF b) { return {_mm_div_ps(a.v, b.v)}; }
  friend VecF vsqrt(VecF a) { return {_mm_sqrt_ps(a.v)}; }
  friend VecF vmax(VecF a, VecF b) {
    const __m128 unordered = _mm_cmpunord_ps(b.v, b.v);
    const __m128 m = _mm_max_ps(b.v, a.v);
    return {_mm_or_ps(_mm_and_ps(unordered, b.v), _mm_andnot_ps(unordered, m))};
  }
};
}  // namespace simd_sse2
#else
inline namespace simd_scalar {
struct VecF {
  static constexpr int kWidth = 1;
  float v;
  static VecF load(const float* p) { return {*p}; }
  static VecF set1(float x) { return {x}; }
  void store(float* p) const { *p = v; }
  friend VecF operator+(VecF a, VecF b) { return {a.v + b.v}; }
  friend VecF operator-(VecF a, VecF b) { return {a.v - b.v}; }
  friend VecF operator*(VecF a, VecF b) { return {a.v * b.v}; }
  friend VecF operator/(VecF a, VecF b) { return {a.v / b.v}; }
  friend VecF vsqrt(VecF a) { return {std::sqrt(a.v)}; }
  friend VecF vmax(VecF a, VecF b) { return {(b.v != b.v || b.v > a.v) ? b.v : a.v}; }
};
}  // namespace simd_scalar
#endif

/// Scalar twins of VecF's vsqrt / vmax, for the tails of host loops and for device code.
TRAINKIT_HOST_DEVICE inline float vsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
/// max(a, b) propagating a NaN from either side (torch.maximum).
TRAINKIT_HOST_DEVICE inline float vmax(float a, float b) { return (b != b || b > a) ? b : a; }

}  // namespace detail
}  // namespace optim
TRAINKIT_NAMESPACE_END
