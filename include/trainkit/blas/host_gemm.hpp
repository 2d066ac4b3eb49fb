// SPDX-License-Identifier: MIT
// trainkit/blas/host_gemm.hpp: the built-in CPU gemm. A Goto/BLIS-style blocked kernel: op(B) is
// packed once into 16-column panels, each task packs a block of op(A) into 6-row panels and runs a
// 6x16 register-tile micro-kernel (AVX2+FMA, chosen at run time so a plain -O2 build is fast too;
// portable C++ elsewhere). f16/bf16 operands are widened to f32 while packing; accumulation is f32.
// Tasks own disjoint tiles of C and every element sums k in one fixed order, so results are the
// same bits for any thread count. Reached through blas::gemm (gemm.hpp); this header is internals.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "trainkit/blas/gemm_options.hpp"
#include "trainkit/config.hpp"
#include "trainkit/exec/host.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TRAINKIT_DETAIL_GEMM_X86 1
#include <immintrin.h>
#else
#define TRAINKIT_DETAIL_GEMM_X86 0
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace blas {
namespace detail {

// Register tile: 6 rows x 16 columns = 12 ymm accumulators + 2 for B + 1 broadcast of A, which
// fits the 16 AVX2 registers and hides the FMA latency (4 cycles x 2 pipes needs >= 8 chains).
inline constexpr int kGemmMR = 6;
inline constexpr int kGemmNR = 16;
// Cache blocking: a 16-column B panel of KC rows (<= 24 KiB) stays in L1 while the micro-kernel
// walks the task's A block (MC x KC <= 288 KiB), which stays in L2. Both are maxima: k and m
// are cut into equal blocks (k = 784 gives 3 x 262, not 384 + 384 + 16), which depend only on
// the shape, so the summation order never depends on the thread count.
inline constexpr std::int64_t kGemmKC = 384;
inline constexpr std::int64_t kGemmMC = 192;
// Packed op(B) is made for at most this many floats (16 MiB) at a time: wide B goes in chunks.
inline constexpr std::int64_t kGemmPackedBFloats = std::int64_t{4} << 20;
// Below this many flops (2mnk) a gemm runs on the calling thread: fork/join would cost more.
inline constexpr double kGemmParallelFlops = 1 << 20;

/// op(X)(i, j) = data[i * rs + j * cs]: an operand as the product sees it.
template <class T>
struct OperandRef {
  const T* data;
  std::int64_t rs;
  std::int64_t cs;
};

/// A 64-byte aligned float scratch buffer that only grows (kept per thread, see gemm_workspace).
class GemmBuffer {
 public:
  GemmBuffer() = default;
  GemmBuffer(const GemmBuffer&) = delete;
  GemmBuffer& operator=(const GemmBuffer&) = delete;
  ~GemmBuffer() { std::free(data_); }

  float* get(std::int64_t floats) {
    const auto n = static_cast<std::size_t>(floats);
    if (n > capacity_) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = 0;
      const std::size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
      data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
      capacity_ = n;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  std::size_t capacity_ = 0;
};

/// Per-thread packing buffers, reused across calls so steady-state gemms do not allocate:
/// `a` (the task's A block), `c` (an f32 tile when C is f16/bf16), `b` (packed op(B), owned by
/// the thread that runs the gemm; `b_busy` guards against re-entrant use).
struct GemmWorkspace {
  GemmBuffer a, b, c;
  bool b_busy = false;
};

inline GemmWorkspace& gemm_workspace() {
  thread_local GemmWorkspace workspace;
  return workspace;
}

/// The epilogue a micro-kernel applies to its tile on the last k block (f32 C only): `bias`
/// points at the tile's first column, `aux` at its (row 0, column 0) element.
struct GemmTileEpilogue {
  Epilogue kind;
  const float* bias;
  float* aux;
  std::int64_t aux_ld;
};

/// c[0:mr, 0:nr] = epi(alpha * (a-panel @ b-panel) + beta * c) (c not read when beta == 0;
/// epi == nullptr: no epilogue). a: kc x MR floats (k-major), b: kc x NR floats (k-major,
/// 64-byte aligned), c: row stride ldc.
using GemmMicroKernel = void (*)(std::int64_t kc, const float* a, const float* b, float* c,
                                 std::int64_t ldc, float alpha, float beta, int mr, int nr,
                                 const GemmTileEpilogue* epi);

/// A partial tile (mr < MR or nr < NR) is computed in full-size scratch copies of its C, bias
/// and aux, so its elements see exactly the arithmetic of a full tile; this sets them up.
struct GemmTileScratch {
  alignas(64) float c[kGemmMR * kGemmNR];
  alignas(64) float aux[kGemmMR * kGemmNR];
  alignas(64) float bias[kGemmNR];

  static void load(const float* src, std::int64_t ld, int mr, int nr, float* dst) {
    std::fill(dst, dst + kGemmMR * kGemmNR, 0.0f);
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < nr; ++j) dst[i * kGemmNR + j] = src[i * ld + j];
  }
  static void store(const float* src, float* dst, std::int64_t ld, int mr, int nr) {
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < nr; ++j) dst[i * ld + j] = src[i * kGemmNR + j];
  }
};

/// Where a tile's store goes: C itself (full tile) or the scratch copies (partial tile).
struct GemmTileTarget {
  float* c;
  std::int64_t ldc;
  const float* bias;
  float* aux;
  std::int64_t aux_ld;
  bool full;

  GemmTileTarget(GemmTileScratch& s, float* c_in, std::int64_t ldc_in, float beta, int mr, int nr,
                 const GemmTileEpilogue* epi)
      : c(c_in),
        ldc(ldc_in),
        bias(nullptr),
        aux(nullptr),
        aux_ld(0),
        full(mr == kGemmMR && nr == kGemmNR) {
    if (epi != nullptr) {
      bias = epi->bias;
      aux = epi->aux;
      aux_ld = epi->aux_ld;
    }
    if (full) return;
    if (beta != 0.0f) {
      s.load(c, ldc, mr, nr, s.c);
    } else {
      std::fill(s.c, s.c + kGemmMR * kGemmNR, 0.0f);
    }
    c = s.c;
    ldc = kGemmNR;
    if (bias != nullptr) {
      for (int j = 0; j < kGemmNR; ++j) s.bias[j] = j < nr ? bias[j] : 0.0f;
      bias = s.bias;
    }
    if (aux != nullptr) {
      if (epi->kind == Epilogue::kDGelu) {
        s.load(aux, aux_ld, mr, nr, s.aux);
      } else {
        std::fill(s.aux, s.aux + kGemmMR * kGemmNR, 0.0f);
      }
      aux = s.aux;
      aux_ld = kGemmNR;
    }
  }

  /// Copies a partial tile's results back (C, and aux when the epilogue wrote it).
  void finish(const GemmTileScratch& s, float* c_out, std::int64_t ldc_out, int mr, int nr,
              const GemmTileEpilogue* epi) const {
    if (full) return;
    GemmTileScratch::store(s.c, c_out, ldc_out, mr, nr);
    if (epi != nullptr && epi->aux != nullptr && epi->kind != Epilogue::kDGelu)
      GemmTileScratch::store(s.aux, epi->aux, epi->aux_ld, mr, nr);
  }
};

/// Portable micro-kernel (any CPU; the compiler vectorises what its target allows).
inline void gemm_kernel_portable(std::int64_t kc, const float* a, const float* b, float* c,
                                 std::int64_t ldc, float alpha, float beta, int mr, int nr,
                                 const GemmTileEpilogue* epi) {
  alignas(64) float acc[kGemmMR * kGemmNR] = {};
  for (std::int64_t p = 0; p < kc; ++p) {
    const float* bp = b + p * kGemmNR;
    const float* ap = a + p * kGemmMR;
    for (int i = 0; i < kGemmMR; ++i) {
      const float ai = ap[i];
      for (int j = 0; j < kGemmNR; ++j) acc[i * kGemmNR + j] += ai * bp[j];
    }
  }
  GemmTileScratch scratch;
  const GemmTileTarget t(scratch, c, ldc, beta, mr, nr, epi);
  const Epilogue kind = epi == nullptr ? Epilogue::kNone : epi->kind;
  for (int i = 0; i < kGemmMR; ++i) {
    float* row = t.c + i * t.ldc;
    for (int j = 0; j < kGemmNR; ++j) {
      float v = alpha * acc[i * kGemmNR + j];
      if (beta != 0.0f) v += beta * row[j];
      if (t.bias != nullptr) v += t.bias[j];
      if (kind == Epilogue::kGelu || kind == Epilogue::kBiasGelu) {
        if (t.aux != nullptr) t.aux[i * t.aux_ld + j] = v;
        v = gelu_tanh(v);
      } else if (kind == Epilogue::kDGelu) {
        v *= gelu_tanh_grad(t.aux[i * t.aux_ld + j]);
      }
      row[j] = v;
    }
  }
  t.finish(scratch, c, ldc, mr, nr, epi);
}

#if TRAINKIT_DETAIL_GEMM_X86
inline bool cpu_has_avx2_fma() noexcept {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

/// exp(x) for 8 floats (Cephes expf: Cody-Waite reduction by ln 2, degree-6 polynomial, about
/// 1 ulp); x is clamped to [-87.3, 88.7], where expf neither overflows nor goes subnormal.
/// Operand order in min/max keeps NaN (the second operand is returned when one is NaN).
__attribute__((target("avx2,fma"))) inline __m256 gemm_exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.72f), _mm256_max_ps(_mm256_set1_ps(-87.33f), x));
  const __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/// gelu_tanh for 8 floats: the scalar function's formula and clamps.
__attribute__((target("avx2,fma"))) inline __m256 gemm_gelu_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-12.0f), x);
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 u =
      _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                    _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x2), x, x));
  const __m256 e =
      gemm_exp_avx2(_mm256_min_ps(_mm256_set1_ps(80.0f), _mm256_mul_ps(_mm256_set1_ps(-2.0f), u)));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/// gelu_tanh_grad for 8 floats: the scalar function's formula and clamps.
__attribute__((target("avx2,fma"))) inline __m256 gemm_gelu_grad_avx2(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f), c0 = _mm256_set1_ps(0.7978845608028654f);
  x = _mm256_min_ps(_mm256_set1_ps(12.0f), _mm256_max_ps(_mm256_set1_ps(-12.0f), x));
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 u =
      _mm256_mul_ps(c0, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x2), x, x));
  const __m256 e =
      gemm_exp_avx2(_mm256_min_ps(_mm256_set1_ps(80.0f), _mm256_mul_ps(_mm256_set1_ps(-2.0f), u)));
  const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
  const __m256 du = _mm256_mul_ps(c0, _mm256_fmadd_ps(_mm256_set1_ps(3.0f * 0.044715f), x2, one));
  const __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(x, du), s), _mm256_mul_ps(e, s));
  return _mm256_fmadd_ps(_mm256_set1_ps(2.0f), t, s);
}
#endif

#if TRAINKIT_DETAIL_GEMM_X86
/// AVX2+FMA micro-kernel, compiled for that target whatever the TU's flags and only called
/// after a CPUID check (gemm_kernel_for_this_cpu).
__attribute__((target("avx2,fma"))) inline void gemm_kernel_avx2(std::int64_t kc, const float* a,
                                                                 const float* b, float* c,
                                                                 std::int64_t ldc, float alpha,
                                                                 float beta, int mr, int nr,
                                                                 const GemmTileEpilogue* epi) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  // Warm the C rows we will write while the k loop runs.
  for (int i = 0; i < mr; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + kGemmNR - 1), _MM_HINT_T0);
  }
  // The six rows are written out: each accumulator pair stays a named register (an array indexed in
  // a loop is what compilers spill).
  for (std::int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
    _mm_prefetch(reinterpret_cast<const char*>(a + 8 * kGemmMR), _MM_HINT_T0);
    __m256 av = _mm256_broadcast_ss(a + 0);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a + 1);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a + 2);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a + 3);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(a + 4);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(a + 5);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
    a += kGemmMR;
    b += kGemmNR;
  }
  const __m256 acc[kGemmMR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                                  {c30, c31}, {c40, c41}, {c50, c51}};
  GemmTileScratch scratch;
  const GemmTileTarget t(scratch, c, ldc, beta, mr, nr, epi);
  const Epilogue kind = epi == nullptr ? Epilogue::kNone : epi->kind;
  const __m256 va = _mm256_set1_ps(alpha);
  const __m256 vb = _mm256_set1_ps(beta);
  const __m256 bias0 = t.bias == nullptr ? _mm256_setzero_ps() : _mm256_loadu_ps(t.bias);
  const __m256 bias1 = t.bias == nullptr ? _mm256_setzero_ps() : _mm256_loadu_ps(t.bias + 8);
  for (int i = 0; i < kGemmMR; ++i) {
    float* row = t.c + i * t.ldc;
    __m256 r0 = _mm256_mul_ps(va, acc[i][0]);
    __m256 r1 = _mm256_mul_ps(va, acc[i][1]);
    if (beta != 0.0f) {
      r0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(row), r0);
      r1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(row + 8), r1);
    }
    if (kind != Epilogue::kNone) {
      r0 = _mm256_add_ps(r0, bias0);  // zero without a bias
      r1 = _mm256_add_ps(r1, bias1);
      if (kind == Epilogue::kGelu || kind == Epilogue::kBiasGelu) {
        if (t.aux != nullptr) {
          _mm256_storeu_ps(t.aux + i * t.aux_ld, r0);
          _mm256_storeu_ps(t.aux + i * t.aux_ld + 8, r1);
        }
        r0 = gemm_gelu_avx2(r0);
        r1 = gemm_gelu_avx2(r1);
      } else if (kind == Epilogue::kDGelu) {
        r0 = _mm256_mul_ps(r0, gemm_gelu_grad_avx2(_mm256_loadu_ps(t.aux + i * t.aux_ld)));
        r1 = _mm256_mul_ps(r1, gemm_gelu_grad_avx2(_mm256_loadu_ps(t.aux + i * t.aux_ld + 8)));
      }
    }
    _mm256_storeu_ps(row, r0);
    _mm256_storeu_ps(row + 8, r1);
  }
  t.finish(scratch, c, ldc, mr, nr, epi);
}
#endif

/// The fastest micro-kernel this CPU runs (decided once, by CPUID, not by compiler flags).
inline GemmMicroKernel gemm_kernel_for_this_cpu() noexcept {
#if TRAINKIT_DETAIL_GEMM_X86
  if (cpu_has_avx2_fma()) return &gemm_kernel_avx2;
#endif
  return &gemm_kernel_portable;
}

/// Name of the micro-kernel gemm_kernel_for_this_cpu() picks, for logs and benchmarks.
inline const char* gemm_kernel_name() noexcept {
  return gemm_kernel_for_this_cpu() == &gemm_kernel_portable ? "portable-6x16" : "avx2-fma-6x16";
}

#if TRAINKIT_DETAIL_GEMM_X86
/// In-register transpose of the 8x8 block r0..r7 (rows) into columns c0..c7.
__attribute__((target("avx2,fma"))) inline void gemm_transpose8(__m256& r0, __m256& r1, __m256& r2,
                                                                __m256& r3, __m256& r4, __m256& r5,
                                                                __m256& r6, __m256& r7) {
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r0 = _mm256_permute2f128_ps(u0, u4, 0x20);
  r1 = _mm256_permute2f128_ps(u1, u5, 0x20);
  r2 = _mm256_permute2f128_ps(u2, u6, 0x20);
  r3 = _mm256_permute2f128_ps(u3, u7, 0x20);
  r4 = _mm256_permute2f128_ps(u0, u4, 0x31);
  r5 = _mm256_permute2f128_ps(u1, u5, 0x31);
  r6 = _mm256_permute2f128_ps(u2, u6, 0x31);
  r7 = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/// A panel of 6 f32 rows s[0..5], each contiguous in k, into dst[k * 6 + r] (k < kc8, a
/// multiple of 8): 8x8 transposes instead of 6 strided scalar streams.
__attribute__((target("avx2,fma"))) inline void gemm_pack_a_rows_avx2(const float* const* s,
                                                                      std::int64_t kc8,
                                                                      float* dst) {
  const __m256 zero = _mm256_setzero_ps();
  for (std::int64_t k = 0; k < kc8; k += 8, dst += 8 * kGemmMR) {
    __m256 r0 = _mm256_loadu_ps(s[0] + k), r1 = _mm256_loadu_ps(s[1] + k);
    __m256 r2 = _mm256_loadu_ps(s[2] + k), r3 = _mm256_loadu_ps(s[3] + k);
    __m256 r4 = _mm256_loadu_ps(s[4] + k), r5 = _mm256_loadu_ps(s[5] + k);
    __m256 r6 = zero, r7 = zero;
    gemm_transpose8(r0, r1, r2, r3, r4, r5, r6, r7);
    // Column j goes to dst + 6j; 8-wide stores overlap the next column, which is stored after
    // and overwrites the 2 spare lanes. The last one stores exactly 6.
    _mm256_storeu_ps(dst + 0, r0);
    _mm256_storeu_ps(dst + 6, r1);
    _mm256_storeu_ps(dst + 12, r2);
    _mm256_storeu_ps(dst + 18, r3);
    _mm256_storeu_ps(dst + 24, r4);
    _mm256_storeu_ps(dst + 30, r5);
    _mm256_storeu_ps(dst + 36, r6);
    _mm_storeu_ps(dst + 42, _mm256_castps256_ps128(r7));
    _mm_storel_pi(reinterpret_cast<__m64*>(dst + 46), _mm256_extractf128_ps(r7, 1));
  }
}

/// 16 f32 rows s[0..15] (columns of op(B)), each contiguous in k, into dst[k * 16 + j] for
/// k < k8 (a multiple of 8).
__attribute__((target("avx2,fma"))) inline void gemm_pack_b_cols_avx2(const float* const* s,
                                                                      std::int64_t k8, float* dst) {
  for (std::int64_t k = 0; k < k8; k += 8) {
    for (int half = 0; half < 2; ++half) {
      const float* const* h = s + 8 * half;
      __m256 r0 = _mm256_loadu_ps(h[0] + k), r1 = _mm256_loadu_ps(h[1] + k);
      __m256 r2 = _mm256_loadu_ps(h[2] + k), r3 = _mm256_loadu_ps(h[3] + k);
      __m256 r4 = _mm256_loadu_ps(h[4] + k), r5 = _mm256_loadu_ps(h[5] + k);
      __m256 r6 = _mm256_loadu_ps(h[6] + k), r7 = _mm256_loadu_ps(h[7] + k);
      gemm_transpose8(r0, r1, r2, r3, r4, r5, r6, r7);
      float* d = dst + k * kGemmNR + 8 * half;
      _mm256_store_ps(d + 0 * kGemmNR, r0);
      _mm256_store_ps(d + 1 * kGemmNR, r1);
      _mm256_store_ps(d + 2 * kGemmNR, r2);
      _mm256_store_ps(d + 3 * kGemmNR, r3);
      _mm256_store_ps(d + 4 * kGemmNR, r4);
      _mm256_store_ps(d + 5 * kGemmNR, r5);
      _mm256_store_ps(d + 6 * kGemmNR, r6);
      _mm256_store_ps(d + 7 * kGemmNR, r7);
    }
  }
}
#endif

/// Packs rows [i0, i0 + mc) x columns [k0, k0 + kc) of op(A) into MR-row panels (panel p at
/// dst + p * MR * kc, element (r, k) at [k * MR + r]); rows past mc are zero.
template <class T>
void gemm_pack_a(const OperandRef<T>& a, std::int64_t i0, std::int64_t mc, std::int64_t k0,
                 std::int64_t kc, float* TRAINKIT_RESTRICT dst) {
  for (std::int64_t p = 0; p < mc; p += kGemmMR, dst += kGemmMR * kc) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kGemmMR, mc - p));
    if (a.cs == 1 && rows == kGemmMR) {
      const T* s[kGemmMR];
      for (int r = 0; r < kGemmMR; ++r) s[r] = a.data + (i0 + p + r) * a.rs + k0;
      std::int64_t k = 0;
#if TRAINKIT_DETAIL_GEMM_X86
      if constexpr (std::is_same_v<T, float>) {
        if (cpu_has_avx2_fma()) {
          k = kc / 8 * 8;
          gemm_pack_a_rows_avx2(s, k, dst);
        }
      }
#endif
      for (; k < kc; ++k)
        for (int r = 0; r < kGemmMR; ++r) dst[k * kGemmMR + r] = to_f32(s[r][k]);
    } else if (a.rs == 1 && rows == kGemmMR) {
      for (std::int64_t k = 0; k < kc; ++k) {
        const T* s = a.data + (k0 + k) * a.cs + i0 + p;
        if constexpr (std::is_same_v<T, float>) {
          std::memcpy(dst + k * kGemmMR, s, kGemmMR * sizeof(float));
        } else {
          for (int r = 0; r < kGemmMR; ++r) dst[k * kGemmMR + r] = to_f32(s[r]);
        }
      }
    } else {
      for (std::int64_t k = 0; k < kc; ++k)
        for (int r = 0; r < kGemmMR; ++r)
          dst[k * kGemmMR + r] =
              r < rows ? to_f32(a.data[(i0 + p + r) * a.rs + (k0 + k) * a.cs]) : 0.0f;
    }
  }
}

/// Packs columns [j0, j0 + cols) (cols <= NR) of op(B), all k rows, into one NR-wide panel
/// (element (k, j) at [k * NR + j], 64-byte aligned); columns past cols are zero.
template <class T>
void gemm_pack_b_panel(const OperandRef<T>& b, std::int64_t k, std::int64_t j0, int cols,
                       float* TRAINKIT_RESTRICT dst) {
  if (b.cs == 1) {
    for (std::int64_t p = 0; p < k; ++p) {
      const T* s = b.data + p * b.rs + j0;
      float* d = dst + p * kGemmNR;
      if constexpr (std::is_same_v<T, float>) {
        if (cols == kGemmNR) {
          std::memcpy(d, s, kGemmNR * sizeof(float));
          continue;
        }
      }
      for (int j = 0; j < kGemmNR; ++j) d[j] = j < cols ? to_f32(s[j]) : 0.0f;
    }
    return;
  }
  // Columns of op(B) are rows in memory (Op::kT): read each one sequentially, in k blocks that
  // keep the panel's destination lines in L1.
  std::int64_t k0 = 0;
#if TRAINKIT_DETAIL_GEMM_X86
  if constexpr (std::is_same_v<T, float>) {
    if (b.rs == 1 && cols == kGemmNR && cpu_has_avx2_fma()) {
      const T* s[kGemmNR];
      for (int j = 0; j < kGemmNR; ++j) s[j] = b.data + (j0 + j) * b.cs;
      k0 = k / 8 * 8;
      gemm_pack_b_cols_avx2(s, k0, dst);
    }
  }
#endif
  constexpr std::int64_t kBlock = 128;
  for (std::int64_t p0 = k0; p0 < k; p0 += kBlock) {
    const std::int64_t p1 = std::min(k, p0 + kBlock);
    for (int j = 0; j < kGemmNR; ++j) {
      if (j < cols) {
        const T* s = b.data + (j0 + j) * b.cs;
        for (std::int64_t p = p0; p < p1; ++p) dst[p * kGemmNR + j] = to_f32(s[p * b.rs]);
      } else {
        for (std::int64_t p = p0; p < p1; ++p) dst[p * kGemmNR + j] = 0.0f;
      }
    }
  }
}

/// Packs panels [q0, q1) of op(B)[:, jc:jc+nc] into bp (panel q at bp + q * NR * k). When
/// op(B)'s rows are contiguous (Op::kN), walks a few rows at a time across all panels, so the
/// source is read sequentially instead of one 64-byte piece per row and page.
template <class T>
void gemm_pack_b(const OperandRef<T>& b, std::int64_t k, std::int64_t jc, std::int64_t nc,
                 std::int64_t q0, std::int64_t q1, float* bp) {
  auto cols_of = [&](std::int64_t q) {
    return static_cast<int>(std::min<std::int64_t>(kGemmNR, nc - q * kGemmNR));
  };
  if (b.cs != 1) {
    for (std::int64_t q = q0; q < q1; ++q)
      gemm_pack_b_panel(b, k, jc + q * kGemmNR, cols_of(q), bp + q * kGemmNR * k);
    return;
  }
  constexpr std::int64_t kRows = 16;
  for (std::int64_t p0 = 0; p0 < k; p0 += kRows) {
    const std::int64_t rows = std::min(kRows, k - p0);
    const OperandRef<T> block{b.data + p0 * b.rs, b.rs, 1};
    for (std::int64_t q = q0; q < q1; ++q)
      gemm_pack_b_panel(block, rows, jc + q * kGemmNR, cols_of(q),
                        bp + q * kGemmNR * k + p0 * kGemmNR);
  }
}

/// Everything the driver needs besides the operands: where C is and what the epilogue does.
template <class TC>
struct GemmOutput {
  TC* c;
  std::int64_t ldc;
  float alpha;
  float beta;
  Epilogue epilogue;
  const TC* bias;
  TC* aux;
  std::int64_t aux_ld;
};

/// True when the epilogue touches C's values (kBiasGrad only adds a separate reduction).
template <class TC>
bool gemm_has_epilogue(const GemmOutput<TC>& out) noexcept {
  return out.epilogue != Epilogue::kNone && out.epilogue != Epilogue::kBiasGrad;
}

#if TRAINKIT_DETAIL_GEMM_X86
/// v[j] = gelu_tanh(v[j]) (x == nullptr) or v[j] *= gelu_tanh_grad(x[j]), 8 lanes at a time;
/// the tail goes through the scalar functions.
__attribute__((target("avx2,fma"))) inline void gemm_gelu_span_avx2(float* v, const float* x,
                                                                    std::int64_t n) {
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 r = _mm256_loadu_ps(v + j);
    _mm256_storeu_ps(v + j, x == nullptr
                                ? gemm_gelu_avx2(r)
                                : _mm256_mul_ps(r, gemm_gelu_grad_avx2(_mm256_loadu_ps(x + j))));
  }
  for (; j < n; ++j) v[j] = x == nullptr ? gelu_tanh(v[j]) : v[j] * gelu_tanh_grad(x[j]);
}
#endif

/// In place over n floats: v = gelu_tanh(v) when x == nullptr, else v *= gelu_tanh_grad(x).
inline void gemm_gelu_span(float* v, const float* x, std::int64_t n) {
#if TRAINKIT_DETAIL_GEMM_X86
  if (cpu_has_avx2_fma()) {
    gemm_gelu_span_avx2(v, x, n);
    return;
  }
#endif
  for (std::int64_t j = 0; j < n; ++j)
    v[j] = x == nullptr ? gelu_tanh(v[j]) : v[j] * gelu_tanh_grad(x[j]);
}

/// Finishes row i, columns [j0, j1), of C. `acc[j - j0]` holds alpha * op(A) @ op(B), plus
/// beta * C when `beta_applied` (then acc may be C itself).
template <class TC>
void gemm_finish_row(const GemmOutput<TC>& out, std::int64_t i, std::int64_t j0, std::int64_t j1,
                     const float* acc, bool beta_applied) {
  TC* c = out.c + i * out.ldc;
  const float beta = beta_applied ? 0.0f : out.beta;
  const Epilogue e = out.epilogue;
  const bool has_bias = e == Epilogue::kBias || e == Epilogue::kBiasGelu;
  TC* aux = out.aux == nullptr ? nullptr : out.aux + i * out.aux_ld;
  // In chunks through an f32 scratch row, so the activation runs over contiguous floats.
  constexpr std::int64_t kChunk = 256;
  alignas(64) float v[kChunk];
  alignas(64) float x[kChunk];
  for (std::int64_t c0 = j0; c0 < j1; c0 += kChunk) {
    const std::int64_t w = std::min(kChunk, j1 - c0);
    const float* a = acc + (c0 - j0);
    TC* cc = c + c0;
    if (beta != 0.0f) {
      for (std::int64_t j = 0; j < w; ++j) v[j] = a[j] + beta * to_f32(cc[j]);
    } else {
      for (std::int64_t j = 0; j < w; ++j) v[j] = a[j];
    }
    if (has_bias)
      for (std::int64_t j = 0; j < w; ++j) v[j] += to_f32(out.bias[c0 + j]);
    if (e == Epilogue::kGelu || e == Epilogue::kBiasGelu) {
      if (aux != nullptr)
        for (std::int64_t j = 0; j < w; ++j) aux[c0 + j] = from_f32<TC>(v[j]);
      gemm_gelu_span(v, nullptr, w);
    } else if (e == Epilogue::kDGelu) {
      for (std::int64_t j = 0; j < w; ++j) x[j] = to_f32(aux[c0 + j]);
      gemm_gelu_span(v, x, w);
    }
    for (std::int64_t j = 0; j < w; ++j) cc[j] = from_f32<TC>(v[j]);
  }
}

/// Runs f(task) for task in [0, n): on the pool when `host` is given, else inline in order.
template <class F>
void gemm_run_tasks(const exec::Host* host, std::int64_t n, F&& f) {
  if (host != nullptr && n > 1) {
    host->parallel_for(n, f);
  } else {
    for (std::int64_t t = 0; t < n; ++t) f(t);
  }
}

/// C[m, n] = epilogue(alpha * op(A) @ op(B) + beta * C) for one matrix. `host` == nullptr runs
/// everything on the calling thread (used for the items of a batch run in parallel).
template <class TA, class TB, class TC>
void host_gemm_2d(const exec::Host* host, const GemmShape& s, const OperandRef<TA>& a,
                  const OperandRef<TB>& b, const GemmOutput<TC>& out,
                  GemmMicroKernel kernel = gemm_kernel_for_this_cpu()) {
  const std::int64_t m = s.m, n = s.n, k = s.k;
  if (m <= 0 || n <= 0) return;
  if (host != nullptr &&
      (host->num_threads() <= 1 || 2.0 * double(m) * double(n) * double(k) < kGemmParallelFlops))
    host = nullptr;
  const int threads = host == nullptr ? 1 : host->num_threads();

  if (k == 0) {  // No products: C = epilogue(beta * C).
    gemm_run_tasks(host, m, [&](std::int64_t i) {
      float* zeros = gemm_workspace().c.get(n);
      std::fill(zeros, zeros + n, 0.0f);
      gemm_finish_row(out, i, 0, n, zeros, false);
    });
    return;
  }

  // Row blocks of (nearly) equal height, a multiple of MR, at most MC.
  std::int64_t blocks_m = (m + kGemmMC - 1) / kGemmMC;
  const std::int64_t mc = ((m + blocks_m - 1) / blocks_m + kGemmMR - 1) / kGemmMR * kGemmMR;
  blocks_m = (m + mc - 1) / mc;
  const std::int64_t blocks_k = (k + kGemmKC - 1) / kGemmKC;
  const std::int64_t kc_max = (k + blocks_k - 1) / blocks_k;

  // Packed op(B) lives in the calling thread's buffer (a private one if that is in use).
  GemmWorkspace& ws = gemm_workspace();
  GemmBuffer private_b;
  const bool own_b = !ws.b_busy;
  GemmBuffer& b_buffer = own_b ? ws.b : private_b;
  ws.b_busy = true;
  struct Release {
    GemmWorkspace& ws;
    bool own;
    ~Release() {
      if (own) ws.b_busy = false;
    }
  } release{ws, own_b};

  const std::int64_t chunk_cols = std::max<std::int64_t>(
      kGemmNR,
      std::min<std::int64_t>((n + kGemmNR - 1) / kGemmNR, kGemmPackedBFloats / (k * kGemmNR)) *
          kGemmNR);
  for (std::int64_t jc = 0; jc < n; jc += chunk_cols) {
    const std::int64_t nc = std::min(chunk_cols, n - jc);
    const std::int64_t panels = (nc + kGemmNR - 1) / kGemmNR;
    float* bp = b_buffer.get(panels * kGemmNR * k);

    // Pack op(B)[:, jc:jc+nc], a few panels per task.
    const std::int64_t pack_tasks =
        threads == 1 ? 1 : std::min<std::int64_t>(panels, std::int64_t{4} * threads);
    const std::int64_t panels_per_pack = (panels + pack_tasks - 1) / pack_tasks;
    gemm_run_tasks(host, (panels + panels_per_pack - 1) / panels_per_pack, [&](std::int64_t t) {
      gemm_pack_b(b, k, jc, nc, t * panels_per_pack, std::min(panels, (t + 1) * panels_per_pack),
                  bp);
    });

    // Tiles of C: row blocks x column segments. Split columns only when there are too few row
    // blocks to keep every thread busy, and never below 8 panels (A is re-packed per segment).
    std::int64_t segments = 1;
    if (threads > 1 && blocks_m < 2 * threads) {
      segments = std::min<std::int64_t>((2 * threads + blocks_m - 1) / blocks_m,
                                        std::max<std::int64_t>(1, panels / 8));
    }
    const std::int64_t panels_per_segment = (panels + segments - 1) / segments;
    segments = (panels + panels_per_segment - 1) / panels_per_segment;

    gemm_run_tasks(host, blocks_m * segments, [&](std::int64_t t) {
      const std::int64_t i0 = (t / segments) * mc;
      const std::int64_t rows = std::min(mc, m - i0);
      const std::int64_t q0 = (t % segments) * panels_per_segment;
      const std::int64_t q1 = std::min(panels, q0 + panels_per_segment);
      const std::int64_t j0 = jc + q0 * kGemmNR;
      const std::int64_t j1 = std::min(jc + nc, jc + q1 * kGemmNR);

      GemmWorkspace& tws = gemm_workspace();
      float* ap = tws.a.get(((rows + kGemmMR - 1) / kGemmMR) * kGemmMR * kc_max);
      constexpr bool c_is_f32 = std::is_same_v<TC, float>;
      float* dst;
      std::int64_t ldd;
      float first_beta;
      if constexpr (c_is_f32) {
        dst = out.c + i0 * out.ldc + j0;
        ldd = out.ldc;
        first_beta = out.beta;
      } else {
        ldd = j1 - j0;
        dst = tws.c.get(rows * ldd);
        first_beta = 0.0f;
      }
      // f32 C: the micro-kernel applies the epilogue on the last k block, on registers.
      const bool tile_epilogue = c_is_f32 && gemm_has_epilogue(out);
      const bool tile_bias = out.epilogue == Epilogue::kBias || out.epilogue == Epilogue::kBiasGelu;
      for (std::int64_t pc = 0; pc < k; pc += kc_max) {
        const std::int64_t kc = std::min(kc_max, k - pc);
        gemm_pack_a(a, i0, rows, pc, kc, ap);
        const float beta = pc == 0 ? first_beta : 1.0f;
        for (std::int64_t q = q0; q < q1; ++q) {
          const std::int64_t jj = jc + q * kGemmNR;
          const int cols = static_cast<int>(std::min<std::int64_t>(kGemmNR, j1 - jj));
          const float* panel = bp + q * kGemmNR * k + pc * kGemmNR;
          // Pull the next panel towards L2 a slice per micro-kernel call, so the first pass
          // over it does not wait on L3 (it is read MC / MR times, the first read is the cost).
          const char* next = reinterpret_cast<const char*>(panel + kGemmNR * k);
          const std::int64_t next_bytes =
              q + 1 < q1 ? kc * kGemmNR * std::int64_t{sizeof(float)} : 0;
          const std::int64_t slice = (next_bytes / 64 + rows / kGemmMR) / (rows / kGemmMR + 1) * 64;
          std::int64_t prefetched = 0;
          for (std::int64_t ir = 0; ir < rows; ir += kGemmMR) {
            for (std::int64_t end = std::min(next_bytes, prefetched + slice); prefetched < end;
                 prefetched += 64)
              __builtin_prefetch(next + prefetched, 0, 2);
            const int mr = static_cast<int>(std::min<std::int64_t>(kGemmMR, rows - ir));
            const GemmTileEpilogue* epi = nullptr;
            GemmTileEpilogue tile;
            if constexpr (c_is_f32) {
              if (tile_epilogue && pc + kc == k) {
                tile = {out.epilogue, tile_bias ? out.bias + jj : nullptr,
                        out.aux == nullptr ? nullptr : out.aux + (i0 + ir) * out.aux_ld + jj,
                        out.aux_ld};
                epi = &tile;
              }
            }
            kernel(kc, ap + ir * kc, panel, dst + ir * ldd + (jj - j0), ldd, out.alpha, beta, mr,
                   cols, epi);
          }
        }
      }
      if constexpr (!c_is_f32) {
        for (std::int64_t r = 0; r < rows; ++r)
          gemm_finish_row(out, i0 + r, j0, j1, dst + r * ldd, false);
      }
    });
  }
}

/// bias_grad[i] = sum_k op(A)[i, k] in f32, each element summed in one fixed order (k ascending
/// in 8 interleaved partial sums, combined pairwise), independent of the thread count.
template <class TA, class TG>
void host_bias_grad(const exec::Host* host, const OperandRef<TA>& a, std::int64_t m, std::int64_t k,
                    TG* bias_grad) {
  if (m <= 0) return;
  if (host != nullptr && (host->num_threads() <= 1 || double(m) * double(k) < (1 << 16)))
    host = nullptr;
  constexpr std::int64_t kRowsPerTask = 256;
  const std::int64_t tasks = (m + kRowsPerTask - 1) / kRowsPerTask;
  gemm_run_tasks(host, tasks, [&](std::int64_t t) {
    const std::int64_t i0 = t * kRowsPerTask, i1 = std::min(m, i0 + kRowsPerTask);
    if (a.cs == 1 || k <= 1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const TA* row = a.data + i * a.rs;
        float lane[8] = {};
        std::int64_t p = 0;
        for (; p + 8 <= k; p += 8)
          for (int l = 0; l < 8; ++l) lane[l] += to_f32(row[p + l]);
        for (int l = 0; p < k; ++p, ++l) lane[l] += to_f32(row[p]);
        const float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                          ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        bias_grad[i] = from_f32<TG>(sum);
      }
    } else {
      // op(A) = A^T with A stored [k, m]: sum rows of A into a vector, k ascending.
      float acc[kRowsPerTask] = {};
      const std::int64_t w = i1 - i0;
      for (std::int64_t p = 0; p < k; ++p) {
        const TA* row = a.data + p * a.cs + i0 * a.rs;
        if (a.rs == 1) {
          for (std::int64_t i = 0; i < w; ++i) acc[i] += to_f32(row[i]);
        } else {
          for (std::int64_t i = 0; i < w; ++i) acc[i] += to_f32(row[i * a.rs]);
        }
      }
      for (std::int64_t i = 0; i < w; ++i) bias_grad[i0 + i] = from_f32<TG>(acc[i]);
    }
  });
}

#if TRAINKIT_SEPARATE_COMPILATION
// The all-f32 paths, the ones every f32 layer takes, are instantiated once, in the compiled
// library (src/trainkit.cpp); other element types are still instantiated where they are used.
extern template void host_gemm_2d<float, float, float>(const exec::Host*, const GemmShape&,
                                                       const OperandRef<float>&,
                                                       const OperandRef<float>&,
                                                       const GemmOutput<float>&, GemmMicroKernel);
extern template void host_bias_grad<float, float>(const exec::Host*, const OperandRef<float>&,
                                                  std::int64_t, std::int64_t, float*);
#endif

}  // namespace detail
}  // namespace blas
TRAINKIT_NAMESPACE_END
