// SPDX-License-Identifier: MIT
// trainkit/optim/detail/host_simd.hpp: `optim::VecF`, the float vector that an optimizer rule's
// per-element update is instantiated with in the host loops (the same template also runs with
// T = float for loop tails and in CUDA kernels). Compilers do not vectorise sqrtf without
// -fno-math-errno, which a header-only library cannot demand, and a scalar sqrt makes AdamW
// compute-bound (measured 4x below the memory bandwidth on a 2-vCPU AVX-512 VM). The widest of
// AVX-512 / AVX / SSE2 that the TU is compiled for is used, else VecF is plain float. Every
// operation is correctly rounded IEEE arithmetic, so a vector lane computes exactly what the
// scalar code computes. A float converts implicitly to a VecF (all lanes), so a rule writes
// `s.beta2 * v` for either T. vsqrt / vmax are namespace functions for both types.
#pragma once

#include <cmath>
#include <cstdint>

#include "trainkit/config.hpp"

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

// One vector type for the ISA of prefix P (the intrinsics are P##_add_ps etc.), W lanes in
// register type R; SQRT is the expression of vsqrt(a) and the trailing arguments the body of
// vmax(a, b), which differ per ISA.
// The vector type differs with the instruction set a TU is compiled for; an inline namespace per
// ISA keeps TUs built with different -m flags from sharing (ODR-merging) these symbols.
#define TRAINKIT_OPTIM_DEFINE_VECF(NS, W, R, P, SQRT, ...)                          \
  inline namespace NS {                                                             \
  struct VecF {                                                                     \
    static constexpr int kWidth = W;                                                \
    R v;                                                                            \
    VecF() = default;                                                               \
    VecF(R x) : v(x) {}                                                             \
    VecF(float x) : v(P##_set1_ps(x)) {}                                            \
    static VecF load(const float* p) { return P##_loadu_ps(p); }                    \
    void store(float* p) const { P##_storeu_ps(p, v); }                             \
    friend VecF operator+(VecF a, VecF b) { return P##_add_ps(a.v, b.v); }          \
    friend VecF operator-(VecF a, VecF b) { return P##_sub_ps(a.v, b.v); }          \
    friend VecF operator*(VecF a, VecF b) { return P##_mul_ps(a.v, b.v); }          \
    friend VecF operator/(VecF a, VecF b) { return P##_div_ps(a.v, b.v); }          \
  };                                                                                \
  inline VecF vsqrt(VecF a) { return SQRT; }                                        \
  /* max(a, b) as std::fmax would NOT give: NaN in `b` wins, like torch.maximum. */ \
  inline VecF vmax(VecF a, VecF b) { __VA_ARGS__ }                                  \
  }

#if defined(__AVX512F__)
// The all-lanes masked forms: GCC 12's unmasked _mm512_sqrt_ps / _mm512_max_ps start from an
// uninitialised vector and warn under -Wall (GCC bug 105593); the same instructions.
TRAINKIT_OPTIM_DEFINE_VECF(simd_avx512, 16, __m512, _mm512,
                           _mm512_mask_sqrt_ps(a.v, static_cast<__mmask16>(0xFFFF), a.v),
                           const __mmask16 nan = _mm512_cmp_ps_mask(b.v, b.v, _CMP_UNORD_Q);
                           const __m512 m = _mm512_mask_max_ps(b.v, static_cast<__mmask16>(0xFFFF),
                                                               b.v, a.v);
                           return _mm512_mask_blend_ps(nan, m, b.v);)
#elif defined(__AVX__)
TRAINKIT_OPTIM_DEFINE_VECF(simd_avx, 8, __m256, _mm256, _mm256_sqrt_ps(a.v),
                           const __m256 nan = _mm256_cmp_ps(b.v, b.v, _CMP_UNORD_Q);
                           return _mm256_blendv_ps(_mm256_max_ps(b.v, a.v), b.v, nan);)
#elif defined(__SSE2__)
TRAINKIT_OPTIM_DEFINE_VECF(simd_sse2, 4, __m128, _mm, _mm_sqrt_ps(a.v),
                           const __m128 nan = _mm_cmpunord_ps(b.v, b.v);
                           const __m128 m = _mm_max_ps(b.v, a.v);
                           return _mm_or_ps(_mm_and_ps(nan, b.v), _mm_andnot_ps(nan, m));)
#else
/// No vector ISA: the "vector" loop runs on floats.
using VecF = float;
#endif
#undef TRAINKIT_OPTIM_DEFINE_VECF

// A TU compiled for SSE2 only (a plain -O2 build) also gets VecF8: 8 lanes in AVX registers, its
// operations compiled for AVX2 by function attributes, for the host loops to run where CPUID
// reports AVX2 (FusedOptimizer's pass: fused_pass.hpp). Every operation is still one correctly
// rounded IEEE operation (no FMA is enabled, so nothing is contracted): the same bits as VecF
// and float. Only SSE2-only TUs define it (in their inline namespace), so no TU compiled with
// other -m flags shares its symbols.
#if !defined(__AVX512F__) && !defined(__AVX__) && defined(__SSE2__) && !defined(__CUDA_ARCH__) && \
    (defined(__GNUC__) || defined(__clang__))
#define TRAINKIT_OPTIM_RUNTIME_AVX2 1
#define TRAINKIT_OPTIM_AVX2 __attribute__((target("avx2")))
inline namespace simd_sse2 {
// The register type with 16-byte alignment: a rule's `T g` parameter is then not a 32-byte
// aligned by-value argument, whose ABI note g++ would print in every SSE2 build (the functions
// are inlined into the AVX2 loop, where the value lives in a ymm register).
typedef float VecF8Reg __attribute__((vector_size(32), aligned(16)));
struct VecF8 {
  static constexpr int kWidth = 8;
  VecF8Reg v;
  VecF8() = default;
  TRAINKIT_OPTIM_AVX2 VecF8(__m256 x) : v(reinterpret_cast<VecF8Reg>(x)) {}
  TRAINKIT_OPTIM_AVX2 VecF8(float x) : VecF8(_mm256_set1_ps(x)) {}
  TRAINKIT_OPTIM_AVX2 __m256 reg() const { return reinterpret_cast<__m256>(v); }
  TRAINKIT_OPTIM_AVX2 static VecF8 load(const float* p) { return _mm256_loadu_ps(p); }
  TRAINKIT_OPTIM_AVX2 void store(float* p) const { _mm256_storeu_ps(p, reg()); }
  TRAINKIT_OPTIM_AVX2 friend VecF8 operator+(VecF8 a, VecF8 b) {
    return _mm256_add_ps(a.reg(), b.reg());
  }
  TRAINKIT_OPTIM_AVX2 friend VecF8 operator-(VecF8 a, VecF8 b) {
    return _mm256_sub_ps(a.reg(), b.reg());
  }
  TRAINKIT_OPTIM_AVX2 friend VecF8 operator*(VecF8 a, VecF8 b) {
    return _mm256_mul_ps(a.reg(), b.reg());
  }
  TRAINKIT_OPTIM_AVX2 friend VecF8 operator/(VecF8 a, VecF8 b) {
    return _mm256_div_ps(a.reg(), b.reg());
  }
};
TRAINKIT_OPTIM_AVX2 inline VecF8 vsqrt(VecF8 a) { return _mm256_sqrt_ps(a.reg()); }
/* max(a, b) with NaN in `b` winning, as VecF's. */
TRAINKIT_OPTIM_AVX2 inline VecF8 vmax(VecF8 a, VecF8 b) {
  const __m256 nan = _mm256_cmp_ps(b.reg(), b.reg(), _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_max_ps(b.reg(), a.reg()), b.reg(), nan);
}
/// Whether this CPU runs VecF8 (decided once, by CPUID).
inline bool cpu_runs_vecf8() noexcept {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
}  // namespace simd_sse2
#else
#define TRAINKIT_OPTIM_RUNTIME_AVX2 0
#endif

/// Lanes of VecF (1 when it is float).
template <class T>
inline constexpr int kLanes = 1;
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
template <>
inline constexpr int kLanes<VecF> = VecF::kWidth;
#endif
#if TRAINKIT_OPTIM_RUNTIME_AVX2
template <>
inline constexpr int kLanes<VecF8> = VecF8::kWidth;
#endif

/// sqrt in f32 (the scalar twin of vsqrt(VecF), also for device code).
TRAINKIT_HOST_DEVICE inline float vsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
/// max(a, b) propagating a NaN from either side (torch.maximum).
TRAINKIT_HOST_DEVICE inline float vmax(float a, float b) { return (b != b || b > a) ? b : a; }

namespace detail {

/// The T (float or VecF) at p, and back.
template <class T>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE T load_as(const float* p) {
  if constexpr (kLanes<T> == 1) {
    return *p;
  } else {
    return T::load(p);
  }
}
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void store_to(float x, float* p) { *p = x; }
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
inline void store_to(VecF x, float* p) { x.store(p); }
#endif
#if TRAINKIT_OPTIM_RUNTIME_AVX2
TRAINKIT_OPTIM_AVX2 inline void store_to(VecF8 x, float* p) { x.store(p); }
#endif

}  // namespace detail
}  // namespace optim
TRAINKIT_NAMESPACE_END
