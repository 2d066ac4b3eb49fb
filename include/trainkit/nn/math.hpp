// SPDX-License-Identifier: MIT
// trainkit/nn/math.hpp: branch-free exp, sigmoid and tanh-GELU for the host layers. libm's
// expf/tanhf are scalar calls the compiler cannot vectorise; these are straight-line float code
// (Cephes' expf polynomial, ~1 ulp) that g++/clang++ turn into SIMD loops, which is what makes
// softmax, GELU and cross-entropy run at memory speed on the CPU. Device code uses CUDA's own.
// The element functions are force-inlined: g++ -O2 otherwise calls exp_approx out of line from
// the element loops (it was ~18% of a train_gpt step), which also keeps those loops scalar.
#pragma once

#include <cstdint>

#include "trainkit/config.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !TRAINKIT_CUDA_COMPILER
#define TRAINKIT_DETAIL_HOST_AVX2 1
#include <immintrin.h>
#else
#define TRAINKIT_DETAIL_HOST_AVX2 0
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

/// sqrt(2 / pi) and the cubic coefficient of GPT-2's tanh-approximated GELU.
inline constexpr float kGeluC = 0.7978845608028654f;
inline constexpr float kGeluA = 0.044715f;

/// Float bits mapped to an int whose order is the float order (for non-NaN values).
TRAINKIT_HOST_DEVICE inline constexpr int ordered_bits(int bits) noexcept {
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

/// e^x for float x, relative error < 1e-7 on [-87, 88.7]; smaller x underflow gracefully
/// through the subnormals to 0 (e^-inf = 0), larger x saturate at ~3.3e38 (no inf); NaN gives
/// NaN. Only integer selects and IEEE arithmetic: float compares would block if-conversion
/// under the default -ftrapping-math, and this loop must vectorise.
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE float exp_approx(float x) noexcept {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // Clamp to [-104, 88.7] on the ordered integer image of the bits (integer min/max vectorise).
  const int bits = __builtin_bit_cast(int, x);
  int key = ordered_bits(bits);
  constexpr int kLo = ordered_bits(__builtin_bit_cast(int, -104.0f));
  constexpr int kHi = ordered_bits(__builtin_bit_cast(int, 88.7f));
  key = key < kLo ? kLo : key;
  key = key > kHi ? kHi : key;
  const float xc = __builtin_bit_cast(float, ordered_bits(key));
  // k = round(x / ln 2); its integer value sits in the low mantissa bits of the shifted sum.
  const float shifted = xc * kLog2e + kRound;
  const float k = shifted - kRound;
  const int ki = __builtin_bit_cast(int, shifted) - 0x4B400000;
  const float r = (xc - k * kLn2Hi) - k * kLn2Lo;  // |r| <= ln2 / 2
  float p = 1.9875691500e-4f;                      // Cephes expf
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^k as two normal factors (k in [-150, 128]): the second product rounds into the
  // subnormals exactly as e^x does.
  const int k1 = ki >> 1;
  const int k2 = ki - k1;
  const float e =
      p * __builtin_bit_cast(float, (k1 + 127) << 23) * __builtin_bit_cast(float, (k2 + 127) << 23);
  const int nan = -static_cast<int>((bits & 0x7fffffff) > 0x7f800000);  // all ones for NaN
  return __builtin_bit_cast(float, (__builtin_bit_cast(int, e) & ~nan) | (bits & nan));
}

/// 1 / (1 + e^-x).
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE float sigmoid_approx(float x) noexcept {
  return 1.0f / (1.0f + exp_approx(-x));
}

/// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed
/// as x * sigmoid(2u) (the same function; no cancellation near 0, no tanh call). Below x = -12
/// the result is gelu(-12) (~ -4e-38; the exact value is below f32's range), and u is taken at
/// min(x, 12) (sigmoid(2u) is 1 there already), so x^3 never overflows; NaN stays NaN.
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE float gelu_approx(float x) noexcept {
  x = x < -12.0f ? -12.0f : x;
  const float xd = x > 12.0f ? 12.0f : x;
  const float u = kGeluC * (xd + kGeluA * xd * xd * xd);
  return x * sigmoid_approx(2.0f * u);
}

/// d gelu / dx = s + 2 x s (1 - s) u'(x), s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2),
/// taken at x clamped to [-12, 12]: 1 above, ~0 below (x^2 would overflow into inf * 0 = NaN or
/// huge values where the slope is 0 or 1 to f32 precision); NaN stays NaN.
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE float gelu_grad_approx(float x) noexcept {
  x = x < -12.0f ? -12.0f : (x > 12.0f ? 12.0f : x);
  const float x2 = x * x;
  const float u = kGeluC * (x + kGeluA * x2 * x);
  const float s = sigmoid_approx(2.0f * u);
  return s + 2.0f * x * s * (1.0f - s) * kGeluC * (1.0f + 3.0f * kGeluA * x2);
}

#if TRAINKIT_DETAIL_HOST_AVX2
inline bool cpu_has_avx2() noexcept {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

/// ordered_bits and exp_approx on 8 lanes: the scalar function's operations in its order
/// (multiplies and adds, no FMA), so every lane has the scalar function's bits.
__attribute__((target("avx2"))) TRAINKIT_FORCEINLINE __m256i ordered_bits8(__m256i b) noexcept {
  return _mm256_xor_si256(
      b, _mm256_and_si256(_mm256_srai_epi32(b, 31), _mm256_set1_epi32(0x7fffffff)));
}
__attribute__((target("avx2"))) TRAINKIT_FORCEINLINE __m256 exp_approx8(__m256 x) noexcept {
  const __m256i bits = _mm256_castps_si256(x);
  __m256i key = ordered_bits8(bits);
  key = _mm256_max_epi32(key, _mm256_set1_epi32(ordered_bits(__builtin_bit_cast(int, -104.0f))));
  key = _mm256_min_epi32(key, _mm256_set1_epi32(ordered_bits(__builtin_bit_cast(int, 88.7f))));
  const __m256 xc = _mm256_castsi256_ps(ordered_bits8(key));
  const __m256 round = _mm256_set1_ps(12582912.0f);
  const __m256 shifted =
      _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), round);
  const __m256 k = _mm256_sub_ps(shifted, round);
  const __m256i ki = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x4B400000));
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(k, _mm256_set1_ps(0.693359375f))),
                                 _mm256_mul_ps(k, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  const __m256i k1 = _mm256_srai_epi32(ki, 1);
  const __m256i k2 = _mm256_sub_epi32(ki, k1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 e = _mm256_mul_ps(
      _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23))),
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23)));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_castps_si256(e), bits, nan));
}

/// The AVX2 rows' 8-lane helpers. first_lanes8: lanes [0, n) all ones, the mask of a row's last
/// partial block. lane_tree8: lane_sum's final tree over the 8 lanes. load8 / store8: 8 floats at
/// p + c, masked past `len` (those lanes read as 0 and are not written).
__attribute__((target("avx2"))) TRAINKIT_FORCEINLINE __m256i first_lanes8(std::int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
__attribute__((target("avx2"))) TRAINKIT_FORCEINLINE float lane_tree8(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
__attribute__((target("avx2"))) TRAINKIT_FORCEINLINE __m256 load8(const float* p, std::int64_t c,
                                                                  std::int64_t len, __m256i tail) {
  return c + 8 > len ? _mm256_maskload_ps(p + c, tail) : _mm256_loadu_ps(p + c);
}
__attribute__((target("avx2"))) TRAINKIT_FORCEINLINE void store8(float* p, std::int64_t c,
                                                                 std::int64_t len, __m256i tail,
                                                                 __m256 v) {
  if (c + 8 > len) {
    _mm256_maskstore_ps(p + c, tail, v);
  } else {
    _mm256_storeu_ps(p + c, v);
  }
}

/// f() compiled for AVX2: f and the row body it calls are TRAINKIT_INLINE_LAMBDAs, and the lane
/// helpers and element functions are force-inlined, so all of it is compiled for this target
/// and the 8-lane blocks of lane_sum / lane_map / lane_max become one ymm register each. FMA is
/// not enabled, so no multiply-add is contracted that the build's own code rounds twice: the
/// same bits.
template <class F>
__attribute__((target("avx2"))) void host_simd_avx2(const F& f) {
  f();
}
#endif

/// Runs f() compiled for AVX2 when the CPU has it (decided by CPUID, whatever the build flags:
/// a plain -O2 build otherwise runs the element loops as SSE2), else as the build compiled it.
/// For the host layers' row loops; f's arithmetic gives the same bits either way. f must be a
/// TRAINKIT_INLINE_LAMBDA that calls only inlined code in its hot loops.
template <class F>
inline void host_simd(const F& f) {
#if TRAINKIT_DETAIL_HOST_AVX2
  if (cpu_has_avx2()) {
    host_simd_avx2(f);
    return;
  }
#endif
  f();
}

/// sum_{j < n} term(j) in 8 interleaved f32 lanes combined pairwise: a fixed order (so the bits do
/// not depend on anything but n) that the compiler can keep in one SIMD register, where a plain
/// `s += term(j)` loop must stay scalar (FP addition is not associative).
#if TRAINKIT_CUDA_COMPILER
#pragma nv_exec_check_disable  // instantiated with host-only lambdas by the CPU paths
#endif
template <class F>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE float lane_sum(std::int64_t n, const F& term) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += term(j + l);
  for (int l = 0; j < n; ++j, ++l) acc[l] += term(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// store_at(j, value(j)) for every j < n, 8 elements at a time: a block's values are all computed
/// (its loads done) before any of them is stored, so g++ -O2 vectorises the block without proving
/// that the output does not alias the inputs, and without a remainder loop: its default cost
/// model at -O2 ("very cheap") does neither, and leaves a plain `for (j < n) out[j] = f(j)`
/// scalar. Each element sees the same arithmetic as in the plain loop (the same bits).
#if TRAINKIT_CUDA_COMPILER
#pragma nv_exec_check_disable  // instantiated with host-only lambdas by the CPU paths
#endif
template <class V, class St>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void lane_map(std::int64_t n, const V& value,
                                                        const St& store_at) {
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    float v[8];
    for (int l = 0; l < 8; ++l) v[l] = value(j + l);
    for (int l = 0; l < 8; ++l) store_at(j + l, v[l]);
  }
  for (; j < n; ++j) store_at(j, value(j));
}

/// max_{j < n} term(j) (n >= 1) in 8 lanes; NaN terms are skipped.
#if TRAINKIT_CUDA_COMPILER
#pragma nv_exec_check_disable  // instantiated with host-only lambdas by the CPU paths
#endif
template <class F>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE float lane_max(std::int64_t n, const F& term) {
  const float first = term(0);
  float acc[8] = {first, first, first, first, first, first, first, first};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) {
      const float v = term(j + l);
      acc[l] = v > acc[l] ? v : acc[l];
    }
  for (int l = 0; j < n; ++j, ++l) {
    const float v = term(j);
    acc[l] = v > acc[l] ? v : acc[l];
  }
  float m = acc[0];
  for (int l = 1; l < 8; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

}  // namespace detail
}  // namespace nn
TRAINKIT_NAMESPACE_END
