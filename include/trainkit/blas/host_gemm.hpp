// SPDX-License-Identifier: MIT
// trainkit/blas/host_gemm.hpp: the built-in CPU gemm. A Goto/BLIS-style blocked kernel: op(B) is
// packed once into 16-column panels; each task runs a register-tile micro-kernel over a block of
// op(A) (12x32 AVX-512 or 6x16 AVX2+FMA, chosen by CPUID at run time so a plain -O2 build is fast
// too; portable C++ elsewhere), reading a row-major f32 A in place and packing other A into
// row panels. f16/bf16 operands are widened to f32 while packing; accumulation is f32. Tasks own
// disjoint tiles of C and every element sums k in one fixed order, one FMA chain per k block, so
// results are the same bits for any thread count and either vector kernel. host_gemm_band serves
// the causal products of attention. Reached through blas::gemm (gemm.hpp); this header is
// internals.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#if __has_include(<unistd.h>)
#include <unistd.h>  // sysconf: the L2 size
#endif

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
// The AVX-512 register tile: 12 rows x 32 columns (two B panels) = 24 zmm accumulators.
inline constexpr int kGemmAvx512Rows = 2 * kGemmMR;
// Cache blocking: a row tile of A (12 x KC <= 18 KiB) stays in L1 while the micro-kernel walks a
// column block of packed B that stays in L2 (gemm_l2_block_panels); the task's A block (MC x KC
// <= 288 KiB) is read from L2 once per column block. KC and MC are maxima: k and m
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

/// Where a gemm packs op(B): the calling thread's buffer, or a private one while that is in use
/// (a gemm run from inside another on the same thread); given back at the end of the scope.
class PackedBBuffer {
 public:
  PackedBBuffer() : ws_(gemm_workspace()), own_(!ws_.b_busy) { ws_.b_busy = true; }
  PackedBBuffer(const PackedBBuffer&) = delete;
  PackedBBuffer& operator=(const PackedBBuffer&) = delete;
  ~PackedBBuffer() {
    if (own_) ws_.b_busy = false;
  }
  float* get(std::int64_t floats) { return (own_ ? ws_.b : private_).get(floats); }

 private:
  GemmWorkspace& ws_;
  bool own_;
  GemmBuffer private_;
};

/// The epilogue a micro-kernel applies to its tile on the last k block (f32 C only): `bias`
/// points at the tile's first column, `aux` at its (row 0, column 0) element.
struct GemmTileEpilogue {
  Epilogue kind;
  const float* bias;
  float* aux;
  std::int64_t aux_ld;
  bool slope = false;  // GeluAux::kSlope
};

/// One micro-kernel call: c[0:mr, 0:nr] = epi(alpha * A @ B + beta * c) over kc products, where
/// A(r, p) = a[r * a_rs + p * a_ks] (every row the kernel reads readable: a packed panel is
/// zero-padded, an operand read in place gives full tiles, or a last tile of one of the kernel's
/// exact_rows) and B(p, j) = b[(j / NR) * b_panel + p * b_ks + j % NR] (packed 16-column
/// panels: b_ks = NR, 64-byte aligned; or a small row-major B read in place, b_panel = NR and
/// b_ks its row stride, which host_gemm_band does for attention's heads: for the large products
/// it was tried and lost, power-of-two row strides put a panel's k rows in a few L1 sets); c has
/// row stride ldc and is not read when beta == 0; epi == nullptr: no epilogue. Each
/// element of c is one chain of fused multiply-adds over p ascending, so every kernel gives the
/// same bits.
struct GemmTileArgs {
  std::int64_t kc;
  const float* a;
  std::int64_t a_rs;
  std::int64_t a_ks;
  const float* b;
  std::int64_t b_panel;
  std::int64_t b_ks = kGemmNR;
  float* c;
  std::int64_t ldc;
  float alpha;
  float beta;
  int mr;
  int nr;
  const GemmTileEpilogue* epi;
  /// The next call's A (same layout, rows a_rs apart, k contiguous) when it is read in place for
  /// the first time, else nullptr: the AVX-512 kernel pulls its kc columns towards L2, a line of
  /// each row per 16 k steps, while this call computes (the first pass over an activation reads
  /// it from L3); the other kernels ignore it.
  const float* a_next = nullptr;
  /// The rows beta multiplies (row stride ldc) when they are not c's own (GemmOptions::c_in),
  /// else nullptr.
  const float* c_in = nullptr;

  /// What beta multiplies: c_in, or c itself.
  const float* beta_rows() const noexcept { return c_in != nullptr ? c_in : c; }
};

using GemmMicroKernel = void (*)(const GemmTileArgs&);

/// A micro-kernel and its register tile: `rows` (a multiple of kGemmMR) by `cols` (a multiple of
/// kGemmNR, i.e. whole B panels) elements of C per call.
struct GemmKernel {
  GemmMicroKernel run;
  int rows;
  int cols;
  const char* name;
  /// Bit r set: a tile of exactly r < rows rows reads only those r rows of A, so such a last
  /// tile can read A in place (a full tile always can).
  unsigned exact_rows = 0;
};

/// How many of `rows` rows of a row-major f32 A the kernel reads in place: the full tiles, and
/// the last partial one when the kernel reads exactly its rows; the rest is packed.
inline std::int64_t gemm_in_place_rows(const GemmKernel& kernel, std::int64_t rows) {
  const std::int64_t rem = rows % kernel.rows;
  return rows - (((kernel.exact_rows >> rem) & 1u) != 0 ? 0 : rem);
}

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

/// Where a tile's store goes: C itself (full tile) or the scratch copies (partial tile); `src`
/// is what beta multiplies (same row stride).
struct GemmTileTarget {
  float* c;
  const float* src;
  std::int64_t ldc;
  const float* bias;
  float* aux;
  std::int64_t aux_ld;
  bool full;

  GemmTileTarget(GemmTileScratch& s, const GemmTileArgs& g)
      : c(g.c),
        src(g.beta_rows()),
        ldc(g.ldc),
        bias(nullptr),
        aux(nullptr),
        aux_ld(0),
        full(g.mr == kGemmMR && g.nr == kGemmNR) {
    const int mr = g.mr, nr = g.nr;
    const GemmTileEpilogue* epi = g.epi;
    if (epi != nullptr) {
      bias = epi->bias;
      aux = epi->aux;
      aux_ld = epi->aux_ld;
    }
    if (full) return;
    if (g.beta != 0.0f) {
      s.load(src, ldc, mr, nr, s.c);
    } else {
      std::fill(s.c, s.c + kGemmMR * kGemmNR, 0.0f);
    }
    c = s.c;
    src = s.c;
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

/// What a vector kernel's register epilogue reads of a tile's arguments, as locals: a float store
/// may alias `g`, which would otherwise be read again after each store. `light`: the epilogue is
/// none, a bias, or dGELU from a saved slope, which the kernels apply on the registers of a whole
/// tile (alpha, beta, + bias (0 without one), times the slope: the general loop's operations in
/// its order; alpha == 1 and beta == 0 skip operations that would not change a bit).
struct GemmRegisterEpilogue {
  bool light;
  float* c;
  std::int64_t ldc;
  float alpha, beta;
  const float* src;
  const float* bias;
  const float* slope;
  std::int64_t slope_ld;
};
inline GemmRegisterEpilogue gemm_register_epilogue(const GemmTileArgs& g) noexcept {
  const Epilogue kind = g.epi == nullptr ? Epilogue::kNone : g.epi->kind;
  const bool slope = kind == Epilogue::kDGelu && g.epi->slope;
  return {kind == Epilogue::kNone || kind == Epilogue::kBias || slope,
          g.c,
          g.ldc,
          g.alpha,
          g.beta,
          g.beta_rows(),
          kind == Epilogue::kNone ? nullptr : g.epi->bias,
          slope ? g.epi->aux : nullptr,
          slope ? g.epi->aux_ld : 0};
}

/// Portable micro-kernel (any CPU; the compiler vectorises what its target allows).
inline void gemm_kernel_portable(const GemmTileArgs& g) {
  alignas(64) float acc[kGemmMR * kGemmNR] = {};
  for (std::int64_t p = 0; p < g.kc; ++p) {
    const float* bp = g.b + p * g.b_ks;
    const float* ap = g.a + p * g.a_ks;
    for (int i = 0; i < kGemmMR; ++i) {
      const float ai = ap[i * g.a_rs];
      for (int j = 0; j < kGemmNR; ++j) acc[i * kGemmNR + j] += ai * bp[j];
    }
  }
  GemmTileScratch scratch;
  const GemmTileTarget t(scratch, g);
  const Epilogue kind = g.epi == nullptr ? Epilogue::kNone : g.epi->kind;
  for (int i = 0; i < kGemmMR; ++i) {
    float* row = t.c + i * t.ldc;
    const float* src = t.src + i * t.ldc;
    for (int j = 0; j < kGemmNR; ++j) {
      float v = g.alpha * acc[i * kGemmNR + j];
      if (g.beta != 0.0f) v += g.beta * src[j];
      if (t.bias != nullptr) v += t.bias[j];
      if (kind == Epilogue::kGelu || kind == Epilogue::kBiasGelu) {
        if (g.epi->slope) {
          float slope;
          v = gelu_tanh_slope(v, &slope);
          if (t.aux != nullptr) t.aux[i * t.aux_ld + j] = slope;
        } else {
          if (t.aux != nullptr) t.aux[i * t.aux_ld + j] = v;
          v = gelu_tanh(v);
        }
      } else if (kind == Epilogue::kDGelu) {
        const float x = t.aux[i * t.aux_ld + j];
        v *= g.epi->slope ? x : gelu_tanh_grad(x);
      }
      row[j] = v;
    }
  }
  t.finish(scratch, g.c, g.ldc, g.mr, g.nr, g.epi);
}

inline constexpr GemmKernel kGemmPortable{&gemm_kernel_portable, kGemmMR, kGemmNR, "portable-6x16"};

#if TRAINKIT_DETAIL_GEMM_X86
inline bool cpu_has_avx2_fma() noexcept {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// The epilogue's exp and GELU for the AVX2 (8 lanes) and AVX-512 (16 lanes) kernels, written once
// (TRAINKIT_DETAIL_GEMM_GELU_MATH): the same operations in the same order, so both give the same
// bits. The few operations whose intrinsics differ beyond their prefix are overloads:
__attribute__((target("avx2,fma"))) inline __m256 gemm_vmin(__m256 a, __m256 b) {
  return _mm256_min_ps(a, b);
}
__attribute__((target("avx2,fma"))) inline __m256 gemm_vmax(__m256 a, __m256 b) {
  return _mm256_max_ps(a, b);
}
__attribute__((target("avx2,fma"))) inline __m256 gemm_vfloor(__m256 a) {
  return _mm256_floor_ps(a);
}
/// p * 2^n for integral n with 2^n a normal float: p times 2^n built in the exponent field.
__attribute__((target("avx2,fma"))) inline __m256 gemm_vldexp(__m256 p, __m256 n) {
  return _mm256_mul_ps(p,
                       _mm256_castsi256_ps(_mm256_slli_epi32(
                           _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)));
}
// AVX-512: GCC 12's unmasked forms of these intrinsics start from an uninitialised vector and
// warn under -Wall at -O2 (GCC bug 105593); the all-lanes masked forms are the same instructions.
inline constexpr __mmask16 kAllLanes = 0xFFFF;
__attribute__((target("avx512f"))) inline __m512 gemm_vmin(__m512 a, __m512 b) {
  return _mm512_mask_min_ps(a, kAllLanes, a, b);
}
__attribute__((target("avx512f"))) inline __m512 gemm_vmax(__m512 a, __m512 b) {
  return _mm512_mask_max_ps(a, kAllLanes, a, b);
}
__attribute__((target("avx512f"))) inline __m512 gemm_vfloor(__m512 a) {
  return _mm512_mask_roundscale_ps(a, kAllLanes, a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
/// v itself, as a value the compiler must hold in a register: a product kept this way is never
/// contracted with a later add into one fused multiply-add (GCC contracts intrinsics in C++
/// unless -ffp-contract=off), which would round once where the scalar and AVX2 forms round twice.
__attribute__((target("avx512f"))) inline __m512 gemm_keep(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}
/// AVX-512 does it in one instruction (vscalefps): the same exact product, rounded once, so the
/// same bits as the AVX2 form.
__attribute__((target("avx512f"))) inline __m512 gemm_vldexp(__m512 p, __m512 n) {
  return _mm512_mask_scalef_ps(p, kAllLanes, p, n);
}

// gemm_exp_in_range_<isa>: exp(x) (Cephes expf: Cody-Waite reduction by ln 2, degree-6
// polynomial, about 1 ulp) for x in [-87.3, 88.7], where expf neither overflows nor goes
// subnormal; gemm_exp_minus2_<isa>(u): exp(-2u) with -2u clamped to [-87.3, 80]. Operand order
// in min/max keeps NaN (the second operand is returned when one is NaN).
// gemm_gelu_<isa> / gemm_gelu_grad_<isa> / gemm_gelu_slope_<isa>: gelu_tanh / gelu_tanh_grad /
// gelu_tanh_slope, the scalar functions' formulas and clamps.
#define TRAINKIT_DETAIL_GEMM_GELU_MATH(ISA, TARGET, V, P)                                         \
  __attribute__((target(TARGET))) inline V gemm_exp_in_range_##ISA(V x) {                         \
    const V n =                                                                                   \
        gemm_vfloor(P##_fmadd_ps(x, P##_set1_ps(1.44269504088896341f), P##_set1_ps(0.5f)));       \
    V r = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                                         \
    r = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), r);                                        \
    V p = P##_set1_ps(1.9875691500e-4f);                                                          \
    p = P##_fmadd_ps(p, r, P##_set1_ps(1.3981999507e-3f));                                        \
    p = P##_fmadd_ps(p, r, P##_set1_ps(8.3334519073e-3f));                                        \
    p = P##_fmadd_ps(p, r, P##_set1_ps(4.1665795894e-2f));                                        \
    p = P##_fmadd_ps(p, r, P##_set1_ps(1.6666665459e-1f));                                        \
    p = P##_fmadd_ps(p, r, P##_set1_ps(5.0000001201e-1f));                                        \
    p = P##_fmadd_ps(p, P##_mul_ps(r, r), P##_add_ps(r, P##_set1_ps(1.0f)));                      \
    return gemm_vldexp(p, n);                                                                     \
  }                                                                                               \
  /* exp(-2 u) for the GELU's tanh, the argument clamped to [-87.3, 80] */                        \
  __attribute__((target(TARGET))) inline V gemm_exp_minus2_##ISA(V u) {                           \
    return gemm_exp_in_range_##ISA(gemm_vmax(                                                     \
        P##_set1_ps(-87.33f), gemm_vmin(P##_set1_ps(80.0f), P##_mul_ps(P##_set1_ps(-2.0f), u)))); \
  }                                                                                               \
  __attribute__((target(TARGET))) inline V gemm_gelu_##ISA(V x) {                                 \
    x = gemm_vmax(P##_set1_ps(-12.0f), x);                                                        \
    const V x2 = P##_mul_ps(x, x);                                                                \
    const V u = P##_mul_ps(P##_set1_ps(0.7978845608028654f),                                      \
                           P##_fmadd_ps(P##_mul_ps(P##_set1_ps(0.044715f), x2), x, x));           \
    const V e = gemm_exp_minus2_##ISA(u);                                                         \
    return P##_div_ps(x, P##_add_ps(P##_set1_ps(1.0f), e));                                       \
  }                                                                                               \
  __attribute__((target(TARGET))) inline V gemm_gelu_slope_##ISA(V x, V* slope) {                 \
    const V one = P##_set1_ps(1.0f), c0 = P##_set1_ps(0.7978845608028654f);                       \
    x = gemm_vmax(P##_set1_ps(-12.0f), x);                                                        \
    const V xd = gemm_vmin(P##_set1_ps(12.0f), x);                                                \
    const V x2 = P##_mul_ps(xd, xd);                                                              \
    const V u = P##_mul_ps(c0, P##_fmadd_ps(P##_mul_ps(P##_set1_ps(0.044715f), x2), xd, xd));     \
    const V e = gemm_exp_minus2_##ISA(u);                                                         \
    const V s = P##_div_ps(one, P##_add_ps(one, e));                                              \
    const V du = P##_mul_ps(c0, P##_fmadd_ps(P##_set1_ps(3.0f * 0.044715f), x2, one));            \
    const V t = P##_mul_ps(P##_mul_ps(P##_mul_ps(xd, du), s), P##_mul_ps(e, s));                  \
    *slope = P##_fmadd_ps(P##_set1_ps(2.0f), t, s);                                               \
    return P##_mul_ps(x, s);                                                                      \
  }                                                                                               \
  __attribute__((target(TARGET))) inline V gemm_gelu_grad_##ISA(V x) {                            \
    V slope; /* the same clamps and formula; the unused GELU value is dropped */                  \
    (void)gemm_gelu_slope_##ISA(x, &slope);                                                       \
    return slope;                                                                                 \
  }
TRAINKIT_DETAIL_GEMM_GELU_MATH(avx2, "avx2,fma", __m256, _mm256)
TRAINKIT_DETAIL_GEMM_GELU_MATH(avx512, "avx512f", __m512, _mm512)
#undef TRAINKIT_DETAIL_GEMM_GELU_MATH

/// gemm_gelu_avx2 (Slope: gemm_gelu_slope_avx2, the slopes into `slope`) of a 6 x 16 tile's 12
/// vectors v, in place, in three passes over them: the same operations in the same order, so
/// the same bits. One vector's GELU is a chain of ~60 dependent operations; the passes make each
/// pass's vectors independent, so the core overlaps them instead of waiting on one chain.
template <bool Slope>
__attribute__((target("avx2,fma"))) inline void gemm_gelu_passes_avx2(__m256* v, __m256* slope) {
  constexpr int n = 2 * kGemmMR;
  __m256 xd[n], x2[n], e[n];
  const __m256 one = _mm256_set1_ps(1.0f), c0 = _mm256_set1_ps(0.7978845608028654f);
  for (int i = 0; i < n; ++i) {
    const __m256 x = gemm_vmax(_mm256_set1_ps(-12.0f), v[i]);
    v[i] = x;
    xd[i] = Slope ? gemm_vmin(_mm256_set1_ps(12.0f), x) : x;
    x2[i] = _mm256_mul_ps(xd[i], xd[i]);
    const __m256 u = _mm256_mul_ps(
        c0, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x2[i]), xd[i], xd[i]));
    e[i] = gemm_vmax(_mm256_set1_ps(-87.33f),
                     gemm_vmin(_mm256_set1_ps(80.0f), _mm256_mul_ps(_mm256_set1_ps(-2.0f), u)));
  }
  for (int i = 0; i < n; ++i) e[i] = gemm_exp_in_range_avx2(e[i]);
  for (int i = 0; i < n; ++i) {
    if constexpr (Slope) {
      const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e[i]));
      const __m256 du =
          _mm256_mul_ps(c0, _mm256_fmadd_ps(_mm256_set1_ps(3.0f * 0.044715f), x2[i], one));
      const __m256 t =
          _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(xd[i], du), s), _mm256_mul_ps(e[i], s));
      slope[i] = _mm256_fmadd_ps(_mm256_set1_ps(2.0f), t, s);
      v[i] = _mm256_mul_ps(v[i], s);
    } else {
      v[i] = _mm256_div_ps(v[i], _mm256_add_ps(one, e[i]));
    }
  }
}
#endif

#if TRAINKIT_DETAIL_GEMM_X86
/// v itself, held in a register: a product kept this way is never contracted with a later add
/// (see the AVX-512 gemm_keep).
__attribute__((target("avx2,fma"))) inline __m256 gemm_keep(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

/// AVX2+FMA micro-kernel (6 x 16), compiled for that target whatever the TU's flags and only
/// called after a CPUID check (gemm_kernel_for_this_cpu).
__attribute__((target("avx2,fma"))) inline void gemm_kernel_avx2(const GemmTileArgs& g) {
  // Warm the C rows (and c_in's, and the epilogue's aux rows) the tile will use while the k
  // loop runs: the first and last float of each row.
  const int mr = g.mr;
  const auto warm = [mr](const float* rows, std::int64_t ld) {
    for (int i = 0; i < mr; ++i, rows += ld) {
      _mm_prefetch(reinterpret_cast<const char*>(rows), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(rows + kGemmNR - 1), _MM_HINT_T0);
    }
  };
  warm(g.c, g.ldc);
  if (g.c_in != nullptr) warm(g.c_in, g.ldc);
  if (g.epi != nullptr && g.epi->aux != nullptr) warm(g.epi->aux, g.epi->aux_ld);
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  // Row r of A is read at p[r / 3] + (r % 3) * rs: two pointers and the scaled-index addressing
  // modes (0, rs, 2 rs) instead of six row pointers, so a k step updates three pointers, not
  // seven. The rows are written out (a macro, not a loop): each accumulator pair stays a named
  // register (an array indexed in a loop is what compilers spill).
  const std::int64_t rs = g.a_rs, rs2 = 2 * g.a_rs, ks = g.a_ks;
  const float* p0 = g.a;
  const float* p1 = p0 + 3 * rs;
  const float* b = g.b;
#define TRAINKIT_DETAIL_AVX2_ROW(acc0, acc1, base, offset)    \
  {                                                           \
    const __m256 av = _mm256_broadcast_ss((base) + (offset)); \
    acc0 = _mm256_fmadd_ps(av, bv0, acc0);                    \
    acc1 = _mm256_fmadd_ps(av, bv1, acc1);                    \
  }
#define TRAINKIT_DETAIL_AVX2_K(bks)             \
  {                                             \
    const __m256 bv0 = _mm256_loadu_ps(b);      \
    const __m256 bv1 = _mm256_loadu_ps(b + 8);  \
    TRAINKIT_DETAIL_AVX2_ROW(c00, c01, p0, 0)   \
    TRAINKIT_DETAIL_AVX2_ROW(c10, c11, p0, rs)  \
    TRAINKIT_DETAIL_AVX2_ROW(c20, c21, p0, rs2) \
    TRAINKIT_DETAIL_AVX2_ROW(c30, c31, p1, 0)   \
    TRAINKIT_DETAIL_AVX2_ROW(c40, c41, p1, rs)  \
    TRAINKIT_DETAIL_AVX2_ROW(c50, c51, p1, rs2) \
    p0 += ks;                                   \
    p1 += ks;                                   \
    b += (bks);                                 \
  }
  const std::int64_t kc = g.kc;
  std::int64_t p = 0;
  if (g.b_ks != kGemmNR) {
    // B read in place (host_gemm_band): rows b_ks apart.
    const std::int64_t b_ks = g.b_ks;
    for (; p < kc; ++p) TRAINKIT_DETAIL_AVX2_K(b_ks)
  } else {
    if (g.a_next != nullptr) {
      // The next tile's A (k contiguous) towards L2, a line of each row per 16 k steps, issued
      // between the blocks of 16 so the k loop itself keeps its registers.
      for (; p + kGemmNR <= kc; p += kGemmNR) {
        const float* next = g.a_next + p;
        for (int r = 0; r < kGemmMR; ++r, next += rs)
          _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T1);
        for (int u = 0; u < kGemmNR; ++u) TRAINKIT_DETAIL_AVX2_K(kGemmNR)
      }
    }
    for (; p < kc; ++p) TRAINKIT_DETAIL_AVX2_K(kGemmNR)
  }
#undef TRAINKIT_DETAIL_AVX2_K
#undef TRAINKIT_DETAIL_AVX2_ROW
  const Epilogue kind = g.epi == nullptr ? Epilogue::kNone : g.epi->kind;
  // A whole tile with a light epilogue (most calls) goes straight from the registers, one pass
  // over them per operation.
  const auto [light, c, ldc, alpha, beta, src, bias, slope, slope_ld] = gemm_register_epilogue(g);
  if (light && g.mr == kGemmMR && g.nr == kGemmNR) {
#define TRAINKIT_DETAIL_AVX2_TILE_PASS(OP) \
  OP(0, c00, c01) OP(1, c10, c11) OP(2, c20, c21) OP(3, c30, c31) OP(4, c40, c41) OP(5, c50, c51)
#define TRAINKIT_DETAIL_AVX2_SCALE(r, acc0, acc1) \
  acc0 = gemm_keep(_mm256_mul_ps(va, acc0));      \
  acc1 = gemm_keep(_mm256_mul_ps(va, acc1));
#define TRAINKIT_DETAIL_AVX2_BETA(r, acc0, acc1)                    \
  acc0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(src + (r)*ldc), acc0); \
  acc1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(src + (r)*ldc + 8), acc1);
#define TRAINKIT_DETAIL_AVX2_BIAS(r, acc0, acc1) \
  acc0 = _mm256_add_ps(acc0, bias0);             \
  acc1 = _mm256_add_ps(acc1, bias1);
#define TRAINKIT_DETAIL_AVX2_SLOPE(r, acc0, acc1)                    \
  acc0 = _mm256_mul_ps(acc0, _mm256_loadu_ps(slope + (r)*slope_ld)); \
  acc1 = _mm256_mul_ps(acc1, _mm256_loadu_ps(slope + (r)*slope_ld + 8));
#define TRAINKIT_DETAIL_AVX2_STORE(r, acc0, acc1) \
  _mm256_storeu_ps(c + (r)*ldc, acc0);            \
  _mm256_storeu_ps(c + (r)*ldc + 8, acc1);
    if (alpha != 1.0f) {
      const __m256 va = _mm256_set1_ps(alpha);
      TRAINKIT_DETAIL_AVX2_TILE_PASS(TRAINKIT_DETAIL_AVX2_SCALE)
    }
    if (beta != 0.0f) {
      const __m256 vb = _mm256_set1_ps(beta);
      TRAINKIT_DETAIL_AVX2_TILE_PASS(TRAINKIT_DETAIL_AVX2_BETA)
    }
    if (kind != Epilogue::kNone) {  // + bias, or + 0 without one (the same bits as the loop's)
      const __m256 bias0 = bias == nullptr ? _mm256_setzero_ps() : _mm256_loadu_ps(bias);
      const __m256 bias1 = bias == nullptr ? _mm256_setzero_ps() : _mm256_loadu_ps(bias + 8);
      TRAINKIT_DETAIL_AVX2_TILE_PASS(TRAINKIT_DETAIL_AVX2_BIAS)
    }
    if (slope != nullptr) {
      TRAINKIT_DETAIL_AVX2_TILE_PASS(TRAINKIT_DETAIL_AVX2_SLOPE)
    }
    TRAINKIT_DETAIL_AVX2_TILE_PASS(TRAINKIT_DETAIL_AVX2_STORE)
#undef TRAINKIT_DETAIL_AVX2_STORE
#undef TRAINKIT_DETAIL_AVX2_SLOPE
#undef TRAINKIT_DETAIL_AVX2_BIAS
#undef TRAINKIT_DETAIL_AVX2_BETA
#undef TRAINKIT_DETAIL_AVX2_SCALE
#undef TRAINKIT_DETAIL_AVX2_TILE_PASS
    return;
  }
  // Otherwise (the GELU epilogues, partial tiles) one loop over the rows, through scratch
  // copies of a partial tile's C, bias and aux.
  const __m256 acc[kGemmMR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                                  {c30, c31}, {c40, c41}, {c50, c51}};
  GemmTileScratch scratch;
  const GemmTileTarget t(scratch, g);
  const __m256 va = _mm256_set1_ps(g.alpha);
  const __m256 vb = _mm256_set1_ps(g.beta);
  const __m256 bias0 = t.bias == nullptr ? _mm256_setzero_ps() : _mm256_loadu_ps(t.bias);
  const __m256 bias1 = t.bias == nullptr ? _mm256_setzero_ps() : _mm256_loadu_ps(t.bias + 8);
  const bool gelu = kind == Epilogue::kGelu || kind == Epilogue::kBiasGelu;
  alignas(32) __m256 pre[kGemmMR][2];  // the GELU's inputs, rows first
  for (int i = 0; i < kGemmMR; ++i) {
    float* row = t.c + i * t.ldc;
    __m256 r0 = _mm256_mul_ps(va, acc[i][0]);
    __m256 r1 = _mm256_mul_ps(va, acc[i][1]);
    if (g.beta != 0.0f) {
      const float* src = t.src + i * t.ldc;
      r0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(src), r0);
      r1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(src + 8), r1);
    }
    if (kind != Epilogue::kNone) {
      r0 = _mm256_add_ps(r0, bias0);  // zero without a bias
      r1 = _mm256_add_ps(r1, bias1);
      if (gelu) {
        pre[i][0] = r0;
        pre[i][1] = r1;
        continue;
      }
      if (kind == Epilogue::kDGelu) {
        const __m256 x0 = _mm256_loadu_ps(t.aux + i * t.aux_ld);
        const __m256 x1 = _mm256_loadu_ps(t.aux + i * t.aux_ld + 8);
        r0 = _mm256_mul_ps(r0, g.epi->slope ? x0 : gemm_gelu_grad_avx2(x0));
        r1 = _mm256_mul_ps(r1, g.epi->slope ? x1 : gemm_gelu_grad_avx2(x1));
      }
    }
    _mm256_storeu_ps(row, r0);
    _mm256_storeu_ps(row + 8, r1);
  }
  if (gelu) {
    // All 12 vectors at once (gemm_gelu_passes_avx2), then the rows out: aux gets the slope
    // (GeluAux::kSlope) or the GELU's input.
    alignas(32) __m256 slope[kGemmMR][2];
    if (g.epi->slope) {
      gemm_gelu_passes_avx2<true>(&pre[0][0], &slope[0][0]);
    } else {
      if (t.aux != nullptr) {
        for (int i = 0; i < kGemmMR; ++i) {
          _mm256_storeu_ps(t.aux + i * t.aux_ld, pre[i][0]);
          _mm256_storeu_ps(t.aux + i * t.aux_ld + 8, pre[i][1]);
        }
      }
      gemm_gelu_passes_avx2<false>(&pre[0][0], nullptr);
    }
    for (int i = 0; i < kGemmMR; ++i) {
      _mm256_storeu_ps(t.c + i * t.ldc, pre[i][0]);
      _mm256_storeu_ps(t.c + i * t.ldc + 8, pre[i][1]);
      if (t.aux != nullptr && g.epi->slope) {
        _mm256_storeu_ps(t.aux + i * t.aux_ld, slope[i][0]);
        _mm256_storeu_ps(t.aux + i * t.aux_ld + 8, slope[i][1]);
      }
    }
  }
  t.finish(scratch, g.c, g.ldc, g.mr, g.nr, g.epi);
}

inline constexpr GemmKernel kGemmAvx2{&gemm_kernel_avx2, kGemmMR, kGemmNR, "avx2-fma-6x16"};

inline bool cpu_has_avx512f() noexcept {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

/// The AVX-512 kernel's epilogue over the summed tile (rows r < mr, columns masked by `mask`),
/// for one kind K: kNone (alpha, beta), kBias (+ bias), kGelu (+ bias, aux = v, gelu) or kDGelu
/// (+ bias, times gelu'(aux)); with Slope (GeluAux::kSlope) kGelu keeps gelu'(v) in aux and
/// kDGelu multiplies by aux.
template <int Panels, Epilogue K, bool Slope = false>
__attribute__((target("avx512f"))) TRAINKIT_FORCEINLINE void gemm_avx512_epilogue_rows(
    const GemmTileArgs& g, const float (*tile)[Panels * kGemmNR], const __mmask16* mask,
    const __m512* bias_v, float* aux, std::int64_t aux_ld) {
  // The arguments in locals: a float store may alias `g`, which would be read again after each.
  const float alpha = g.alpha, beta = g.beta;
  const __m512 va = _mm512_set1_ps(alpha);
  const __m512 vb = _mm512_set1_ps(beta);
  const int mr = g.mr;
  const std::int64_t ldc = g.ldc;
  float* row = g.c;
  const float* src = g.beta_rows();
  for (int r = 0; r < mr; ++r, row += ldc, src += ldc) {
    for (int h = 0; h < Panels; ++h) {
      const __mmask16 m = mask[h];
      __m512 v = _mm512_load_ps(tile[r] + h * kGemmNR);
      if (alpha != 1.0f) v = gemm_keep(_mm512_mul_ps(va, v));  // 1 * v would change no bit
      if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, src + h * kGemmNR), v);
      if constexpr (K != Epilogue::kNone) {
        v = _mm512_add_ps(v, bias_v[h]);  // zero without a bias
        float* x = aux == nullptr ? nullptr : aux + r * aux_ld + h * kGemmNR;
        if constexpr (K == Epilogue::kGelu && Slope) {
          __m512 d;
          v = gemm_gelu_slope_avx512(v, &d);
          if (x != nullptr) _mm512_mask_storeu_ps(x, m, d);
        } else if constexpr (K == Epilogue::kGelu) {
          if (x != nullptr) _mm512_mask_storeu_ps(x, m, v);
          v = gemm_gelu_avx512(v);
        } else if constexpr (K == Epilogue::kDGelu && Slope) {
          v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, x));
        } else if constexpr (K == Epilogue::kDGelu) {
          v = _mm512_mul_ps(v, gemm_gelu_grad_avx512(_mm512_maskz_loadu_ps(m, x)));
        }
      }
      _mm512_mask_storeu_ps(row + h * kGemmNR, m, v);
    }
  }
}

/// The epilogue of a tile whose sums were spilled to `tile` (rows r < mr, columns past nr masked
/// off in loads and stores): one function for every row count of the tile (not inlined, so the
/// GELU code is compiled once per panel count).
template <int Panels>
__attribute__((target("avx512f"), noinline)) void gemm_avx512_finish_tile(
    const GemmTileArgs& g, const float (*tile)[Panels * kGemmNR]) {
  const Epilogue kind = g.epi == nullptr ? Epilogue::kNone : g.epi->kind;
  const float* bias = g.epi == nullptr ? nullptr : g.epi->bias;
  float* aux = g.epi == nullptr ? nullptr : g.epi->aux;
  const std::int64_t aux_ld = g.epi == nullptr ? 0 : g.epi->aux_ld;
  __mmask16 mask[Panels];
  __m512 bias_v[Panels];
  for (int h = 0; h < Panels; ++h) {
    const int cols = std::min(kGemmNR, std::max(0, g.nr - h * kGemmNR));
    mask[h] = static_cast<__mmask16>(cols == kGemmNR ? 0xFFFFu : (1u << cols) - 1u);
    bias_v[h] =
        bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[h], bias + h * kGemmNR);
  }
  // One loop per kind of epilogue, so its branches and constants stay out of the element loop.
  if (kind == Epilogue::kNone) {
    gemm_avx512_epilogue_rows<Panels, Epilogue::kNone>(g, tile, mask, bias_v, aux, aux_ld);
  } else if ((kind == Epilogue::kGelu || kind == Epilogue::kBiasGelu) && g.epi->slope) {
    gemm_avx512_epilogue_rows<Panels, Epilogue::kGelu, true>(g, tile, mask, bias_v, aux, aux_ld);
  } else if (kind == Epilogue::kGelu || kind == Epilogue::kBiasGelu) {
    gemm_avx512_epilogue_rows<Panels, Epilogue::kGelu>(g, tile, mask, bias_v, aux, aux_ld);
  } else if (kind == Epilogue::kDGelu && g.epi->slope) {
    gemm_avx512_epilogue_rows<Panels, Epilogue::kDGelu, true>(g, tile, mask, bias_v, aux, aux_ld);
  } else if (kind == Epilogue::kDGelu) {
    gemm_avx512_epilogue_rows<Panels, Epilogue::kDGelu>(g, tile, mask, bias_v, aux, aux_ld);
  } else {
    gemm_avx512_epilogue_rows<Panels, Epilogue::kBias>(g, tile, mask, bias_v, aux, aux_ld);
  }
}

/// AVX-512 micro-kernel body for `Panels` (1 or 2) B panels and `Rows` (4, 8 or 12) rows of A;
/// edges are masked, not copied.
template <int Panels, int Rows>
__attribute__((target("avx512f"))) inline void gemm_kernel_avx512_tile(const GemmTileArgs& g) {
  constexpr int R = Rows;
  constexpr int W = Panels * kGemmNR;
  // Warm the C rows (and the epilogue's aux rows, and c_in's) we will use while the k loop runs:
  // the first and last line of each row of the tile.
  const int mr = g.mr;
  const auto warm = [mr](const float* rows, std::int64_t ld) {
    for (int i = 0; i < mr; ++i, rows += ld) {
      _mm_prefetch(reinterpret_cast<const char*>(rows), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(rows + W - 1), _MM_HINT_T0);
    }
  };
  warm(g.c, g.ldc);
  if (g.c_in != nullptr) warm(g.c_in, g.ldc);
  if (g.epi != nullptr && g.epi->aux != nullptr) warm(g.epi->aux, g.epi->aux_ld);
  // Row r of A is read at p[r / 3] + (r % 3) * rs: four pointers and one index register (the
  // scaled-index addressing modes give 0, rs and 2 rs) instead of twelve row pointers, which
  // would not fit the general registers. The rows are written out (a macro, not a loop) so the
  // 12 x Panels accumulators stay registers under every compiler, pragmas or not.
  const std::int64_t rs = g.a_rs, rs2 = 2 * g.a_rs, ks = g.a_ks;
  const float* p0 = g.a;
  const float* p1 = R > 3 ? p0 + 3 * rs : p0;
  const float* p2 = R > 6 ? p0 + 6 * rs : p0;
  const float* p3 = R > 9 ? p0 + 9 * rs : p0;
  const float* b0 = g.b;
  const float* b1 = g.b + g.b_panel;
  __m512 acc[R][Panels] = {};
#define TRAINKIT_DETAIL_AVX512_ROW(r, base, offset)                                               \
  if constexpr ((r) < R) {                                                                        \
    const __m512 av = _mm512_set1_ps((base)[offset]);                                             \
    acc[r][0] = _mm512_fmadd_ps(av, bv0, acc[r][0]);                                              \
    if constexpr (Panels == 2) acc[r][Panels - 1] = _mm512_fmadd_ps(av, bv1, acc[r][Panels - 1]); \
  }
#define TRAINKIT_DETAIL_AVX512_ROWS3(r, base) \
  TRAINKIT_DETAIL_AVX512_ROW(r, base, 0)      \
  TRAINKIT_DETAIL_AVX512_ROW(r + 1, base, rs) \
  TRAINKIT_DETAIL_AVX512_ROW(r + 2, base, rs2)
#define TRAINKIT_DETAIL_AVX512_K(bks)                           \
  {                                                             \
    const __m512 bv0 = _mm512_loadu_ps(b0);                     \
    const __m512 bv1 = Panels == 2 ? _mm512_loadu_ps(b1) : bv0; \
    TRAINKIT_DETAIL_AVX512_ROWS3(0, p0)                         \
    TRAINKIT_DETAIL_AVX512_ROWS3(3, p1)                         \
    TRAINKIT_DETAIL_AVX512_ROWS3(6, p2)                         \
    TRAINKIT_DETAIL_AVX512_ROWS3(9, p3)                         \
    p0 += ks;                                                   \
    p1 += ks;                                                   \
    p2 += ks;                                                   \
    p3 += ks;                                                   \
    b0 += bks;                                                  \
    b1 += bks;                                                  \
  }
  std::int64_t p = 0;
  if (g.b_ks != kGemmNR) {
    // B read in place (host_gemm_band): rows b_ks apart. Packed panels (below) step by a
    // constant, which keeps the pointer updates to one shared index.
    const std::int64_t b_ks = g.b_ks;
    for (; p < g.kc; ++p) TRAINKIT_DETAIL_AVX512_K(b_ks)
  } else {
    if (g.a_next != nullptr) {
      // The next tile's A (g.a_next: k contiguous) a line of each row per 16 k steps, issued
      // between the blocks of 16 so the k loop itself keeps its registers.
      for (; p + kGemmNR <= g.kc; p += kGemmNR) {
        const float* next = g.a_next + p;
        for (int r = 0; r < R; ++r, next += rs)
          _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T1);
        for (int u = 0; u < kGemmNR; ++u) TRAINKIT_DETAIL_AVX512_K(kGemmNR)
      }
    }
    for (; p < g.kc; ++p) TRAINKIT_DETAIL_AVX512_K(kGemmNR)
  }
#undef TRAINKIT_DETAIL_AVX512_K
#undef TRAINKIT_DETAIL_AVX512_ROWS3
#undef TRAINKIT_DETAIL_AVX512_ROW
  const Epilogue kind = g.epi == nullptr ? Epilogue::kNone : g.epi->kind;
  // A whole tile with a light epilogue (most calls) goes straight from the registers. Each
  // operation is one pass over the tile's registers under one test, on arguments read into
  // locals: tested per store, and read back from `g` after each store, they cost more than the
  // k loop of a short product.
  const auto [light, c, ldc, alpha, beta, src, bias, slope, slope_ld] = gemm_register_epilogue(g);
  if (light && g.mr == R && g.nr == W) {
#define TRAINKIT_DETAIL_AVX512_TILE_PASS(OP) \
  OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)
#define TRAINKIT_DETAIL_AVX512_EACH(r, h, EXPR) \
  if constexpr ((r) < R && (h) < Panels) acc[r][h] = EXPR;
#define TRAINKIT_DETAIL_AVX512_SCALE(r)                                      \
  TRAINKIT_DETAIL_AVX512_EACH(r, 0, gemm_keep(_mm512_mul_ps(va, acc[r][0]))) \
  TRAINKIT_DETAIL_AVX512_EACH(r, 1, gemm_keep(_mm512_mul_ps(va, acc[r][1])))
#define TRAINKIT_DETAIL_AVX512_BETA(r)                                                        \
  TRAINKIT_DETAIL_AVX512_EACH(r, 0,                                                           \
                              _mm512_fmadd_ps(vb, _mm512_loadu_ps(src + (r)*ldc), acc[r][0])) \
  TRAINKIT_DETAIL_AVX512_EACH(                                                                \
      r, 1, _mm512_fmadd_ps(vb, _mm512_loadu_ps(src + (r)*ldc + kGemmNR), acc[r][1]))
#define TRAINKIT_DETAIL_AVX512_BIAS(r)                                   \
  TRAINKIT_DETAIL_AVX512_EACH(r, 0, _mm512_add_ps(acc[r][0], bias_v[0])) \
  TRAINKIT_DETAIL_AVX512_EACH(r, 1, _mm512_add_ps(acc[r][1], bias_v[Panels - 1]))
#define TRAINKIT_DETAIL_AVX512_SLOPE(r)                                                        \
  TRAINKIT_DETAIL_AVX512_EACH(r, 0,                                                            \
                              _mm512_mul_ps(acc[r][0], _mm512_loadu_ps(slope + (r)*slope_ld))) \
  TRAINKIT_DETAIL_AVX512_EACH(                                                                 \
      r, 1, _mm512_mul_ps(acc[r][1], _mm512_loadu_ps(slope + (r)*slope_ld + kGemmNR)))
#define TRAINKIT_DETAIL_AVX512_STORE(r)                                                     \
  if constexpr ((r) < R) {                                                                  \
    _mm512_storeu_ps(c + (r)*ldc, acc[r][0]);                                               \
    if constexpr (Panels == 2) _mm512_storeu_ps(c + (r)*ldc + kGemmNR, acc[r][Panels - 1]); \
  }
    if (alpha != 1.0f) {
      const __m512 va = _mm512_set1_ps(alpha);
      TRAINKIT_DETAIL_AVX512_TILE_PASS(TRAINKIT_DETAIL_AVX512_SCALE)
    }
    if (beta != 0.0f) {
      const __m512 vb = _mm512_set1_ps(beta);
      TRAINKIT_DETAIL_AVX512_TILE_PASS(TRAINKIT_DETAIL_AVX512_BETA)
    }
    if (kind != Epilogue::kNone) {  // + bias, or + 0 without one (the same bits as the loop's)
      __m512 bias_v[Panels];
      for (int h = 0; h < Panels; ++h)
        bias_v[h] = bias == nullptr ? _mm512_setzero_ps() : _mm512_loadu_ps(bias + h * kGemmNR);
      TRAINKIT_DETAIL_AVX512_TILE_PASS(TRAINKIT_DETAIL_AVX512_BIAS)
    }
    if (slope != nullptr) {
      TRAINKIT_DETAIL_AVX512_TILE_PASS(TRAINKIT_DETAIL_AVX512_SLOPE)
    }
    TRAINKIT_DETAIL_AVX512_TILE_PASS(TRAINKIT_DETAIL_AVX512_STORE)
#undef TRAINKIT_DETAIL_AVX512_STORE
#undef TRAINKIT_DETAIL_AVX512_SLOPE
#undef TRAINKIT_DETAIL_AVX512_BIAS
#undef TRAINKIT_DETAIL_AVX512_BETA
#undef TRAINKIT_DETAIL_AVX512_SCALE
#undef TRAINKIT_DETAIL_AVX512_EACH
#undef TRAINKIT_DETAIL_AVX512_TILE_PASS
    return;
  }
  // Otherwise the sums go through an L1 tile, so the epilogue (whose GELU needs many registers
  // of its own) runs as a plain loop without keeping 24 accumulators alive.
  alignas(64) float tile[R][W];
#define TRAINKIT_DETAIL_AVX512_SPILL(r)                                                \
  if constexpr ((r) < R) {                                                             \
    _mm512_store_ps(tile[r], acc[r][0]);                                               \
    if constexpr (Panels == 2) _mm512_store_ps(tile[r] + kGemmNR, acc[r][Panels - 1]); \
  }
  TRAINKIT_DETAIL_AVX512_SPILL(0)
  TRAINKIT_DETAIL_AVX512_SPILL(1)
  TRAINKIT_DETAIL_AVX512_SPILL(2)
  TRAINKIT_DETAIL_AVX512_SPILL(3)
  TRAINKIT_DETAIL_AVX512_SPILL(4)
  TRAINKIT_DETAIL_AVX512_SPILL(5)
  TRAINKIT_DETAIL_AVX512_SPILL(6)
  TRAINKIT_DETAIL_AVX512_SPILL(7)
  TRAINKIT_DETAIL_AVX512_SPILL(8)
  TRAINKIT_DETAIL_AVX512_SPILL(9)
  TRAINKIT_DETAIL_AVX512_SPILL(10)
  TRAINKIT_DETAIL_AVX512_SPILL(11)
#undef TRAINKIT_DETAIL_AVX512_SPILL
  gemm_avx512_finish_tile<Panels>(g, tile);
}

/// AVX-512 micro-kernel (12 x 32), compiled for that target and only called after a CPUID
/// check. Its sums are the AVX2 kernel's chains, so it gives the same bits. A tile of at most 4
/// or 8 rows (the last of 64, 128 or 1024 rows) runs a 4- or 8-row body instead of 12 rows of
/// which most would be padding.
template <int Panels>
__attribute__((target("avx512f"))) inline void gemm_kernel_avx512_panels(const GemmTileArgs& g) {
  if (g.mr > 8) {
    gemm_kernel_avx512_tile<Panels, kGemmAvx512Rows>(g);
  } else if (g.mr > 4) {
    gemm_kernel_avx512_tile<Panels, 8>(g);
  } else {
    gemm_kernel_avx512_tile<Panels, 4>(g);
  }
}
__attribute__((target("avx512f"))) inline void gemm_kernel_avx512(const GemmTileArgs& g) {
  if (g.nr > kGemmNR) {
    gemm_kernel_avx512_panels<2>(g);
  } else {
    gemm_kernel_avx512_panels<1>(g);
  }
}

inline constexpr GemmKernel kGemmAvx512{&gemm_kernel_avx512, kGemmAvx512Rows, 2 * kGemmNR,
                                        "avx512-12x32", (1u << 4) | (1u << 8)};
#endif

/// The fastest micro-kernel this CPU runs (decided once, by CPUID, not by compiler flags).
inline const GemmKernel& gemm_kernel_for_this_cpu() noexcept {
#if TRAINKIT_DETAIL_GEMM_X86
  if (cpu_has_avx512f()) return kGemmAvx512;
  if (cpu_has_avx2_fma()) return kGemmAvx2;
#endif
  return kGemmPortable;
}

/// Every micro-kernel this CPU can run, the portable one first (tests run them all).
inline std::vector<const GemmKernel*> gemm_kernels_for_this_cpu() {
  std::vector<const GemmKernel*> kernels{&kGemmPortable};
#if TRAINKIT_DETAIL_GEMM_X86
  if (cpu_has_avx2_fma()) kernels.push_back(&kGemmAvx2);
  if (cpu_has_avx512f()) kernels.push_back(&kGemmAvx512);
#endif
  return kernels;
}

/// Name of the micro-kernel gemm_kernel_for_this_cpu() picks, for logs and benchmarks.
inline const char* gemm_kernel_name() noexcept { return gemm_kernel_for_this_cpu().name; }

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

#if TRAINKIT_DETAIL_GEMM_X86
__attribute__((target("avx512f"))) inline void gemm_add_row_avx512(float* acc, const float* s,
                                                                   std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), _mm512_loadu_ps(s + i)));
  for (; i < n; ++i) acc[i] += s[i];
}
__attribute__((target("avx2,fma"))) inline void gemm_add_row_avx2(float* acc, const float* s,
                                                                  std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(s + i)));
  for (; i < n; ++i) acc[i] += s[i];
}
#endif

/// acc[i] += s[i] for i < n (element by element: the same bits whatever the vector width).
template <class T>
void gemm_add_row(float* TRAINKIT_RESTRICT acc, const T* TRAINKIT_RESTRICT s, std::int64_t n) {
#if TRAINKIT_DETAIL_GEMM_X86
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx512f()) {
      gemm_add_row_avx512(acc, s, n);
      return;
    }
    if (cpu_has_avx2_fma()) {
      gemm_add_row_avx2(acc, s, n);
      return;
    }
  }
#endif
  for (std::int64_t i = 0; i < n; ++i) acc[i] += to_f32(s[i]);
}

/// Packs rows [i0, i0 + mc) x columns [k0, k0 + kc) of op(A) into mr-row panels (panel p at
/// dst + p * mr * kc, element (r, k) at [k * mr + r]); rows past mc are zero.
template <class T>
void gemm_pack_a(const OperandRef<T>& a, std::int64_t i0, std::int64_t mc, std::int64_t k0,
                 std::int64_t kc, int mr, float* TRAINKIT_RESTRICT dst,
                 float* TRAINKIT_RESTRICT row_sums = nullptr) {
  if (a.rs == 1) {
    // op(A) = A^T, A stored [k, m]: row k of A holds column k of every panel, so walk k and
    // scatter each row's mc contiguous elements (one sequential read of A). row_sums[i] +=
    // op(A)[i0 + i, k] for k ascending when given (the bias gradient, in host_bias_grad's order).
    const std::int64_t full = mc / mr, tail = mc - full * mr;
    // The row pieces are a row stride apart (often a power of two: the hardware streams do not
    // follow), so each is fetched into L1 kAhead rows before its turn.
    constexpr std::int64_t kAhead = 8;
    const std::int64_t line_elems = 64 / static_cast<std::int64_t>(sizeof(T));
    for (std::int64_t k = 0; k < kc; ++k) {
      const T* s = a.data + (k0 + k) * a.cs + i0;
      if (k + kAhead < kc) {
        const T* ahead = s + kAhead * a.cs;
        for (std::int64_t e = 0; e < mc; e += line_elems) __builtin_prefetch(ahead + e, 0, 3);
        __builtin_prefetch(ahead + mc - 1, 0, 3);
      }
      if (row_sums != nullptr) gemm_add_row(row_sums, s, mc);
      float* d = dst + k * mr;
      for (std::int64_t p = 0; p < full; ++p, s += mr, d += mr * kc) {
        if constexpr (std::is_same_v<T, float>) {
          // Fixed sizes, so the copies are inlined moves rather than calls to memcpy.
          if (mr == kGemmAvx512Rows) {
            std::memcpy(d, s, kGemmAvx512Rows * sizeof(float));
          } else if (mr == kGemmMR) {
            std::memcpy(d, s, kGemmMR * sizeof(float));
          } else {
            std::memcpy(d, s, static_cast<std::size_t>(mr) * sizeof(float));
          }
        } else {
          for (int r = 0; r < mr; ++r) d[r] = to_f32(s[r]);
        }
      }
      if (tail > 0) {
        for (int r = 0; r < tail; ++r) d[r] = to_f32(s[r]);
        std::fill(d + tail, d + mr, 0.0f);
      }
    }
    return;
  }
  for (std::int64_t p = 0; p < mc; p += mr, dst += mr * kc) {
    const int rows = static_cast<int>(std::min<std::int64_t>(mr, mc - p));
    if (a.cs == 1 && rows == kGemmMR && mr == kGemmMR) {
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
    } else if (a.cs == 1) {
      // Row-major A, a partial panel (or another tile height): the zero rows by one contiguous
      // fill of the panel (not mr - rows strided streams), then row by row.
      if (rows < mr) std::fill(dst, dst + kc * mr, 0.0f);
      for (int r = 0; r < rows; ++r) {
        const T* s = a.data + (i0 + p + r) * a.rs + k0;
        for (std::int64_t k = 0; k < kc; ++k) dst[k * mr + r] = to_f32(s[k]);
      }
    } else {
      for (std::int64_t k = 0; k < kc; ++k)
        for (int r = 0; r < mr; ++r)
          dst[k * mr + r] = r < rows ? to_f32(a.data[(i0 + p + r) * a.rs + (k0 + k) * a.cs]) : 0.0f;
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

#if TRAINKIT_DETAIL_GEMM_X86
/// Rows [p0, p1) of panels [q0, q1) (all 16 wide) of a row-major f32 op(B) starting at b (row
/// stride rs), k rows in all, into bp (panel q at bp + q * NR * k): each row read once, left to
/// right.
__attribute__((target("avx512f"))) inline void gemm_pack_b_rows_avx512(
    const float* b, std::int64_t rs, std::int64_t k, std::int64_t q0, std::int64_t q1, float* bp,
    std::int64_t p0, std::int64_t p1) {
  for (std::int64_t p = p0; p < p1; ++p) {
    const float* s = b + p * rs;
    float* d = bp + p * kGemmNR;
    for (std::int64_t q = q0; q < q1; ++q)
      _mm512_store_ps(d + q * kGemmNR * k, _mm512_loadu_ps(s + q * kGemmNR));
  }
}
/// The same with two ymm loads and aligned stores per panel row.
__attribute__((target("avx2,fma"))) inline void gemm_pack_b_rows_avx2(
    const float* b, std::int64_t rs, std::int64_t k, std::int64_t q0, std::int64_t q1, float* bp,
    std::int64_t p0, std::int64_t p1) {
  for (std::int64_t p = p0; p < p1; ++p) {
    const float* s = b + p * rs;
    float* d = bp + p * kGemmNR;
    for (std::int64_t q = q0; q < q1; ++q) {
      _mm256_store_ps(d + q * kGemmNR * k, _mm256_loadu_ps(s + q * kGemmNR));
      _mm256_store_ps(d + q * kGemmNR * k + 8, _mm256_loadu_ps(s + q * kGemmNR + 8));
    }
  }
}
#endif

/// Packs panels [q0, q1) of op(B)[:, jc:jc+nc] into bp (panel q at bp + q * NR * k). When
/// op(B)'s rows are contiguous (Op::kN), walks a few rows at a time across all panels, so the
/// source is read sequentially instead of one 64-byte piece per row and page, and packs only
/// rows [p0, p1) (p1 < 0: all k): threads share such a B by ranges of rows, each reading whole
/// rows (a task per panel would read a 64-byte piece of every row). A transposed op(B) is packed
/// whole panels (all k rows) whatever p0 and p1 say.
template <class T>
void gemm_pack_b(const OperandRef<T>& b, std::int64_t k, std::int64_t jc, std::int64_t nc,
                 std::int64_t q0, std::int64_t q1, float* bp, std::int64_t p0 = 0,
                 std::int64_t p1 = -1) {
  if (p1 < 0) p1 = k;
  if (q0 >= q1 || p0 >= p1) return;
  auto cols_of = [&](std::int64_t q) {
    return static_cast<int>(std::min<std::int64_t>(kGemmNR, nc - q * kGemmNR));
  };
  if (b.cs != 1) {
    for (std::int64_t q = q0; q < q1; ++q)
      gemm_pack_b_panel(b, k, jc + q * kGemmNR, cols_of(q), bp + q * kGemmNR * k);
    return;
  }
#if TRAINKIT_DETAIL_GEMM_X86
  if constexpr (std::is_same_v<T, float>) {
    // Whole panels: one zmm load and one aligned full-line store per panel row.
    const std::int64_t full_end = cols_of(q1 - 1) == kGemmNR ? q1 : q1 - 1;
    if (full_end > q0 && (cpu_has_avx512f() || cpu_has_avx2_fma())) {
      if (cpu_has_avx512f()) {
        gemm_pack_b_rows_avx512(b.data + jc, b.rs, k, q0, full_end, bp, p0, p1);
      } else {
        gemm_pack_b_rows_avx2(b.data + jc, b.rs, k, q0, full_end, bp, p0, p1);
      }
      q0 = full_end;
      if (q0 == q1) return;
    }
  }
#endif
  constexpr std::int64_t kRows = 16;
  for (std::int64_t r0 = p0; r0 < p1; r0 += kRows) {
    const std::int64_t rows = std::min(kRows, p1 - r0);
    const OperandRef<T> block{b.data + r0 * b.rs, b.rs, 1};
    for (std::int64_t q = q0; q < q1; ++q)
      gemm_pack_b_panel(block, rows, jc + q * kGemmNR, cols_of(q),
                        bp + q * kGemmNR * k + r0 * kGemmNR);
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
  /// kBiasGrad fused into the packing of a transposed A (see host_gemm_2d), else nullptr.
  TC* bias_grad = nullptr;
  /// GeluAux::kSlope: the GELU epilogues keep gelu'(v) in aux, kDGelu multiplies by it.
  bool aux_slope = false;
  /// What beta multiplies when it is not C (GemmOptions::c_in; C's row stride), else nullptr.
  const TC* c_in = nullptr;
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

#if TRAINKIT_DETAIL_GEMM_X86
/// v[j] = gelu_tanh_slope(v[j], &slope[j]), 8 lanes at a time; the tail through the scalar one.
__attribute__((target("avx2,fma"))) inline void gemm_gelu_slope_span_avx2(float* v, float* slope,
                                                                          std::int64_t n) {
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 d;
    _mm256_storeu_ps(v + j, gemm_gelu_slope_avx2(_mm256_loadu_ps(v + j), &d));
    _mm256_storeu_ps(slope + j, d);
  }
  for (; j < n; ++j) v[j] = gelu_tanh_slope(v[j], slope + j);
}
#endif

/// In place over n floats: v = gelu_tanh(v) and slope = gelu_tanh_grad(v), from one exponential.
inline void gemm_gelu_slope_span(float* v, float* slope, std::int64_t n) {
#if TRAINKIT_DETAIL_GEMM_X86
  if (cpu_has_avx2_fma()) {
    gemm_gelu_slope_span_avx2(v, slope, n);
    return;
  }
#endif
  for (std::int64_t j = 0; j < n; ++j) v[j] = gelu_tanh_slope(v[j], slope + j);
}

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
  const TC* src = out.c_in != nullptr ? out.c_in + i * out.ldc : c;
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
      for (std::int64_t j = 0; j < w; ++j) v[j] = a[j] + beta * to_f32(src[c0 + j]);
    } else {
      for (std::int64_t j = 0; j < w; ++j) v[j] = a[j];
    }
    if (has_bias)
      for (std::int64_t j = 0; j < w; ++j) v[j] += to_f32(out.bias[c0 + j]);
    if ((e == Epilogue::kGelu || e == Epilogue::kBiasGelu) && out.aux_slope) {
      gemm_gelu_slope_span(v, x, w);
      if (aux != nullptr)
        for (std::int64_t j = 0; j < w; ++j) aux[c0 + j] = from_f32<TC>(x[j]);
    } else if (e == Epilogue::kGelu || e == Epilogue::kBiasGelu) {
      if (aux != nullptr)
        for (std::int64_t j = 0; j < w; ++j) aux[c0 + j] = from_f32<TC>(v[j]);
      gemm_gelu_span(v, nullptr, w);
    } else if (e == Epilogue::kDGelu && out.aux_slope) {
      for (std::int64_t j = 0; j < w; ++j) v[j] *= to_f32(aux[c0 + j]);
    } else if (e == Epilogue::kDGelu) {
      for (std::int64_t j = 0; j < w; ++j) x[j] = to_f32(aux[c0 + j]);
      gemm_gelu_span(v, x, w);
    }
    for (std::int64_t j = 0; j < w; ++j) cc[j] = from_f32<TC>(v[j]);
  }
}

/// How many 16-column panels of packed B (kc rows each) one column block of a task holds: a
/// quarter of this CPU's L2 cache (at least two register tiles' worth), so that the block stays
/// in L2 while every row tile of A passes over it. The blocking only orders the tiles; it never
/// changes a sum.
inline std::int64_t gemm_l2_block_panels(std::int64_t kc, std::int64_t tile_panels) {
  static const std::int64_t budget = [] {
    long l2 = 0;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    if (l2 <= 0) l2 = 1L << 20;
    return std::clamp<std::int64_t>(l2 / 4, std::int64_t{128} << 10, std::int64_t{2} << 20);
  }();
  const std::int64_t panel_bytes = kc * kGemmNR * std::int64_t{sizeof(float)};
  const std::int64_t panels = std::max<std::int64_t>(2 * tile_panels, budget / panel_bytes);
  return panels / tile_panels * tile_panels;
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
/// everything on the calling thread (used for the items of a batch run in parallel). An f32 A
/// with contiguous rows is read in place (the micro-kernel broadcasts from it); only the rows
/// that do not fill a register tile, and other A, are packed.
template <class TA, class TB, class TC>
void host_gemm_2d(const exec::Host* host, const GemmShape& s, const OperandRef<TA>& a,
                  const OperandRef<TB>& b, const GemmOutput<TC>& out,
                  const GemmKernel& kernel = gemm_kernel_for_this_cpu()) {
  const std::int64_t m = s.m, n = s.n, k = s.k;
  if (m <= 0 || n <= 0) return;
  if (host != nullptr &&
      (host->num_threads() <= 1 || 2.0 * double(m) * double(n) * double(k) < kGemmParallelFlops))
    host = nullptr;
  const int threads = host == nullptr ? 1 : host->num_threads();

  // No products: C = epilogue(beta * C). alpha == 0 reads neither A nor B, as in BLAS (an inf
  // or NaN there does not reach C).
  if (k == 0 || out.alpha == 0.0f) {
    gemm_run_tasks(host, m, [&](std::int64_t i) {
      float* zeros = gemm_workspace().c.get(n);
      std::fill(zeros, zeros + n, 0.0f);
      gemm_finish_row(out, i, 0, n, zeros, false);
    });
    return;
  }

  // Row blocks of (nearly) equal height, a multiple of the tile's rows, at most about MC. With
  // several threads, as many blocks as a multiple of the thread count when the rows allow two
  // tiles per block: the 3 blocks of a 512-row product would leave one thread idle for a third
  // of it (row blocks never change a sum's order, so the bits do not depend on this).
  const std::int64_t tile_rows = kernel.rows;
  const std::int64_t tile_panels = kernel.cols / kGemmNR;
  std::int64_t blocks_m = (m + kGemmMC - 1) / kGemmMC;
  if (threads > 1 && blocks_m % threads != 0) {
    const std::int64_t balanced = (blocks_m + threads - 1) / threads * threads;
    if (m >= balanced * 2 * tile_rows) blocks_m = balanced;
  }
  const std::int64_t mc = ((m + blocks_m - 1) / blocks_m + tile_rows - 1) / tile_rows * tile_rows;
  blocks_m = (m + mc - 1) / mc;
  const std::int64_t blocks_k = (k + kGemmKC - 1) / kGemmKC;
  const std::int64_t kc_max = (k + blocks_k - 1) / blocks_k;
  constexpr bool a_is_f32 = std::is_same_v<TA, float>;
  // Only a row-major A is read in place: the columns of a transposed one are a cache line
  // apart per k, which the micro-kernel would wait on; it is packed, one sequential pass.
  const bool a_in_place = a_is_f32 && a.cs == 1;

  PackedBBuffer b_buffer;

  const std::int64_t chunk_cols = std::max<std::int64_t>(
      kGemmNR,
      std::min<std::int64_t>((n + kGemmNR - 1) / kGemmNR, kGemmPackedBFloats / (k * kGemmNR)) *
          kGemmNR);
  for (std::int64_t jc = 0; jc < n; jc += chunk_cols) {
    const std::int64_t nc = std::min(chunk_cols, n - jc);
    const std::int64_t panels = (nc + kGemmNR - 1) / kGemmNR;
    float* bp = b_buffer.get(panels * kGemmNR * k);

    // Pack op(B)[:, jc:jc+nc]: a few panels per task, or a range of rows per task when op(B)'s
    // rows are contiguous (each task then reads whole rows).
    if (threads > 1 && b.cs == 1) {
      const std::int64_t rows_per_pack =
          std::max<std::int64_t>(16, (k + 4 * threads - 1) / (4 * threads));
      gemm_run_tasks(host, (k + rows_per_pack - 1) / rows_per_pack, [&](std::int64_t t) {
        gemm_pack_b(b, k, jc, nc, 0, panels, bp, t * rows_per_pack,
                    std::min(k, (t + 1) * rows_per_pack));
      });
    } else {
      const std::int64_t pack_tasks =
          threads == 1 ? 1 : std::min<std::int64_t>(panels, std::int64_t{4} * threads);
      const std::int64_t panels_per_pack = (panels + pack_tasks - 1) / pack_tasks;
      gemm_run_tasks(host, (panels + panels_per_pack - 1) / panels_per_pack, [&](std::int64_t t) {
        gemm_pack_b(b, k, jc, nc, t * panels_per_pack, std::min(panels, (t + 1) * panels_per_pack),
                    bp);
      });
    }

    // Tiles of C: row blocks x column segments (whole register tiles). Split columns only when
    // there are too few row blocks to keep every thread busy, and never below 8 panels.
    std::int64_t segments = 1;
    if (threads > 1 && blocks_m < 2 * threads) {
      segments = std::min<std::int64_t>((2 * threads + blocks_m - 1) / blocks_m,
                                        std::max<std::int64_t>(1, panels / 8));
    }
    std::int64_t panels_per_segment = (panels + segments - 1) / segments;
    panels_per_segment = (panels_per_segment + tile_panels - 1) / tile_panels * tile_panels;
    segments = (panels + panels_per_segment - 1) / panels_per_segment;

    gemm_run_tasks(host, blocks_m * segments, [&](std::int64_t t) {
      const std::int64_t i0 = (t / segments) * mc;
      const std::int64_t rows = std::min(mc, m - i0);
      const std::int64_t q0 = (t % segments) * panels_per_segment;
      const std::int64_t q1 = std::min(panels, q0 + panels_per_segment);
      const std::int64_t j0 = jc + q0 * kGemmNR;
      const std::int64_t j1 = std::min(jc + nc, jc + q1 * kGemmNR);
      // Rows [0, in_place_rows) of the block are read from A itself, the rest packed.
      const std::int64_t in_place_rows = a_in_place ? gemm_in_place_rows(kernel, rows) : 0;

      GemmWorkspace& tws = gemm_workspace();
      float* ap =
          tws.a.get(((rows - in_place_rows + tile_rows - 1) / tile_rows) * tile_rows * kc_max);
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
      // kBiasGrad fused: the first column segment of a row block sums its rows of A^T while it
      // packs them (A is read once, for both), k ascending as host_bias_grad does. The caller
      // sets out.bias_grad only for an f32 A stored [k, m] (packed, never read in place).
      float* sums = nullptr;
      if constexpr (c_is_f32) {  // tws.c is free: an f32 C is written in place
        if (out.bias_grad != nullptr && jc == 0 && t % segments == 0 && in_place_rows == 0) {
          sums = tws.c.get(rows);
          std::fill(sums, sums + rows, 0.0f);
        }
      }
      for (std::int64_t pc = 0; pc < k; pc += kc_max) {
        const std::int64_t kc = std::min(kc_max, k - pc);
        if (in_place_rows < rows)
          gemm_pack_a(a, i0 + in_place_rows, rows - in_place_rows, pc, kc, kernel.rows, ap, sums);
        const float beta = pc == 0 ? first_beta : 1.0f;
        const bool last_k_block = pc + kc == k;
        // Column blocks of packed B that stay in L2; in each, a row tile of A (12 x kc, in L1
        // after its first call) meets every panel group of the block in turn, so the panels
        // stream from L2 in order and C is written a few whole rows at a time. What a row tile's
        // calls share is set once per row tile; each call then moves B, C and the epilogue's
        // columns (the first call also pulls the next row tile's A towards L2).
        const std::int64_t block_panels = gemm_l2_block_panels(kc, tile_panels);
        for (std::int64_t qb = q0; qb < q1; qb += block_panels) {
          const std::int64_t qb1 = std::min(q1, qb + block_panels);
          for (std::int64_t ir = 0; ir < rows; ir += tile_rows) {
            GemmTileArgs g;
            g.kc = kc;
            const float* a_next = nullptr;
            if constexpr (a_is_f32) {
              if (ir < in_place_rows) {
                g.a = a.data + (i0 + ir) * a.rs + pc * a.cs;
                g.a_rs = a.rs;
                g.a_ks = a.cs;
                if (ir + 2 * tile_rows <= in_place_rows)
                  a_next = a.data + (i0 + ir + tile_rows) * a.rs + pc * a.cs;
              }
            }
            if (ir >= in_place_rows) {
              g.a = ap + (ir - in_place_rows) * kc;
              g.a_rs = 1;
              g.a_ks = tile_rows;
            }
            g.b_panel = kGemmNR * k;
            g.ldc = ldd;
            g.alpha = out.alpha;
            g.beta = beta;
            g.mr = static_cast<int>(std::min<std::int64_t>(tile_rows, rows - ir));
            g.epi = nullptr;
            GemmTileEpilogue tile;
            if constexpr (c_is_f32) {
              if (tile_epilogue && last_k_block) {
                tile = {out.epilogue, nullptr, nullptr, out.aux_ld, out.aux_slope};
                g.epi = &tile;
              }
            }
            for (std::int64_t q = qb; q < qb1; q += tile_panels) {
              const std::int64_t jj = jc + q * kGemmNR;
              g.a_next = q == qb ? a_next : nullptr;
              g.b = bp + q * kGemmNR * k + pc * kGemmNR;
              g.c = dst + ir * ldd + (jj - j0);
              if constexpr (c_is_f32) {
                if (pc == 0 && out.c_in != nullptr) g.c_in = out.c_in + (i0 + ir) * out.ldc + jj;
                if (g.epi != nullptr) {
                  tile.bias = tile_bias ? out.bias + jj : nullptr;
                  tile.aux = out.aux == nullptr ? nullptr : out.aux + (i0 + ir) * out.aux_ld + jj;
                }
              }
              g.nr = static_cast<int>(std::min<std::int64_t>(kernel.cols, j1 - jj));
              kernel.run(g);
            }
          }
        }
      }
      if constexpr (!c_is_f32) {
        for (std::int64_t r = 0; r < rows; ++r)
          gemm_finish_row(out, i0 + r, j0, j1, dst + r * ldd, false);
      }
      if constexpr (c_is_f32) {
        if (sums != nullptr) std::copy(sums, sums + rows, out.bias_grad + i0);
      }
    });
  }
}

/// The part of a product a triangular (causal) caller needs: row tile [i0, i1) of C takes
/// columns [0, cols) and sums k in [k_begin, k_end), where
///   kFull:       cols = n,  k in [0, k)
///   kColsToRow:  cols = i1 (rounded up to the tile: C[i, j] is needed for j <= i only)
///   kSumToRow:   k in [0, i1)   (op(A)[i, k] == 0 for k > i, e.g. causal probabilities P)
///   kSumFromRow: k in [i0, k)   (op(A)[i, k] == 0 for k < i, e.g. P^T)
/// Skipped products are exact zeros, so the sums are the full product's.
enum class GemmBand { kFull, kColsToRow, kSumToRow, kSumFromRow };

/// C[m, n] = alpha * op(A) @ op(B) (f32 C, no epilogue) on the calling thread, computing only the
/// tiles `band` needs (columns of a tile past `cols` are left as they were). For the small
/// per-head products of attention: op(B) is packed once, a row-major f32 A is read in place,
/// the micro-kernel is called directly (no blocking: k and n are small).
template <class TA, class TB>
void host_gemm_band(const GemmShape& s, const OperandRef<TA>& a, const OperandRef<TB>& b, float* c,
                    std::int64_t ldc, float alpha, GemmBand band,
                    const GemmKernel& kernel = gemm_kernel_for_this_cpu()) {
  const std::int64_t m = s.m, n = s.n, k = s.k;
  if (m <= 0 || n <= 0) return;
  const std::int64_t tile_rows = kernel.rows;
  PackedBBuffer b_buffer;
  GemmWorkspace& ws = gemm_workspace();
  const std::int64_t panels = (n + kGemmNR - 1) / kGemmNR;
  const std::int64_t kk = std::max<std::int64_t>(k, 1);
  // A row-major f32 op(B) of whole register tiles (a head's V, K, Q or dO: k <= T rows of hs
  // floats) is read in place: the kernel reads each k row's tile columns, no more.
  const bool b_in_place = std::is_same_v<TB, float> && b.cs == 1 && n % kernel.cols == 0;
  float* bp = b_in_place ? nullptr : b_buffer.get(panels * kGemmNR * kk);
  if (k > 0 && !b_in_place) gemm_pack_b(b, k, 0, n, 0, panels, bp);
  // A: rows read in place where the kernel reads only them, the rest packed. An f32 A with
  // contiguous rows, or a transposed one of at most 64 KiB (a head's P^T or dS^T up to T = 128):
  // the kernel's rows are then neighbours in each of its k rows, and a tile's k rows stay in L1
  // (measured faster than packing at T = 64 and 128).
  constexpr bool a_is_f32 = std::is_same_v<TA, float>;
  constexpr std::int64_t kSmallFloats = 16384;
  const bool a_readable = a_is_f32 && (a.cs == 1 || (a.rs == 1 && m * k <= kSmallFloats));
  const std::int64_t in_place_rows = a_readable ? gemm_in_place_rows(kernel, m) : 0;
  float* ap = ws.a.get(((m - in_place_rows + tile_rows - 1) / tile_rows) * tile_rows * kk);
  if (in_place_rows < m && k > 0)
    gemm_pack_a(a, in_place_rows, m - in_place_rows, 0, k, kernel.rows, ap);
  for (std::int64_t i0 = 0; i0 < m; i0 += tile_rows) {
    const std::int64_t i1 = std::min(m, i0 + tile_rows);
    const std::int64_t cols = band == GemmBand::kColsToRow ? std::min(n, i1) : n;
    const std::int64_t k_begin = band == GemmBand::kSumFromRow ? std::min(i0, k) : 0;
    const std::int64_t k_end = band == GemmBand::kSumToRow ? std::min(i1, k) : k;
    for (std::int64_t jj = 0; jj < cols; jj += kernel.cols) {
      GemmTileArgs g;
      g.kc = k_end - k_begin;
      if constexpr (a_is_f32) {
        if (i0 < in_place_rows) {
          g.a = a.data + i0 * a.rs + k_begin * a.cs;
          g.a_rs = a.rs;
          g.a_ks = a.cs;
        }
      }
      if (i0 >= in_place_rows) {
        g.a = ap + (i0 - in_place_rows) * kk + k_begin * tile_rows;
        g.a_rs = 1;
        g.a_ks = tile_rows;
      }
      if (b_in_place) {  // bp is null then: no offset is applied to it
        if constexpr (std::is_same_v<TB, float>) g.b = b.data + k_begin * b.rs + jj;
        g.b_panel = kGemmNR;
        g.b_ks = b.rs;
      } else {
        g.b = bp + (jj / kGemmNR) * kGemmNR * kk + k_begin * kGemmNR;
        g.b_panel = kGemmNR * kk;
      }
      g.c = c + i0 * ldc + jj;
      g.ldc = ldc;
      g.alpha = alpha;
      g.beta = 0.0f;
      g.mr = static_cast<int>(i1 - i0);
      g.nr = static_cast<int>(std::min<std::int64_t>(kernel.cols, cols - jj));
      g.epi = nullptr;
      kernel.run(g);
    }
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
                                                       const GemmOutput<float>&, const GemmKernel&);
extern template void host_bias_grad<float, float>(const exec::Host*, const OperandRef<float>&,
                                                  std::int64_t, std::int64_t, float*);
#endif

}  // namespace detail
}  // namespace blas
TRAINKIT_NAMESPACE_END
