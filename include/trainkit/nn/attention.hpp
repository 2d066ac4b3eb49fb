// SPDX-License-Identifier: MIT
// trainkit/nn/attention.hpp: `CausalSelfAttention`, GPT-2's multi-head masked self-attention
// (nanoGPT's module: c_attn [3C, C] -> per-head softmax(Q K^T / sqrt(hs)) V -> c_proj [C, C]).
// On the CPU the core materialises the [B, H, T, T] attention matrix, which the caller's
// CausalSelfAttention::Context keeps for backward: each (batch, head) is one task (small products
// straight on the gemm micro-kernel, skipping what the causal mask zeroes, and a fused masked
// softmax, all in cache). On the GPU the fused core (nn/fused_attention.hpp) computes it by tiles
// in shared memory and keeps one log-sum-exp per row instead (head sizes up to 128); the
// materialised form there (batched cuBLASLt gemms over heads plus warp-per-row softmax kernels)
// remains for larger heads or when AttentionOptions::fused_core is off.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "trainkit/amp/policy.hpp"
#include "trainkit/blas/gemm.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/fused_attention.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/math.hpp"
#include "trainkit/nn/param_arena.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

/// The buffers of the attention core. qkv [B, T, 3C] holds Q | K | V per token (head h uses
/// columns h*hs .. (h+1)*hs of each third); out [B, T, C] the heads side by side.
template <class T>
struct AttentionArgs {
  const T* qkv;
  T* out;         // forward output
  T* probs;       // [B, H, T, T] softmax probabilities (zero above the diagonal), saved
  float* scores;  // [B, H, T, T] f32 scratch: Q K^T / sqrt(hs) (forward), dP (backward);
                  // unused (null) by the host's f32 core, which keeps one head's in L1
  T* dscores;     // [B, H, T, T] scratch of the operand type: dS (backward)
  const T* dout;  // backward input [B, T, C]
  T* dqkv;        // backward output [B, T, 3C]
  std::int64_t B, T_, C, H;
  std::int64_t hs;            // head size C / H
  float scale;                // 1 / sqrt(hs), the scale of the scores
  blas::ComputeType compute;  // TF32 products for f32 operands under amp::Tf32 (device only)
  // The fused GPU core instead of probs / scores / dscores when lse is set: lse [B, H, T] saved
  // by forward, delta [B, H, T] backward's scratch (fused_attention.hpp).
  float* lse;
  float* delta;

  FusedAttentionArgs<T> fused() const noexcept {
    FusedAttentionArgs<T> f;
    f.qkv = qkv;
    f.out = out;
    f.lse = lse;
    f.delta = delta;
    f.dout = dout;
    f.dqkv = dqkv;
    f.B = B;
    f.T_ = T_;
    f.C = C;
    f.H = H;
    f.hs = hs;
    f.scale = scale;
    return f;
  }
};

/// Masked, max-shifted softmax of row i (entries 0..i) from f32 scores into probs (zeros above).
/// The scores are overwritten with exp(s - max) (computed once, summed in lane_sum's order).
template <class T>
TRAINKIT_FORCEINLINE void causal_softmax_row(float* s, T* p, std::int64_t i, std::int64_t len) {
  const std::int64_t n = i + 1;
  const float m = lane_max(n, [&](std::int64_t j) { return s[j]; });
  lane_map(
      n, [&](std::int64_t j) { return exp_approx(s[j] - m); },
      [&](std::int64_t j, float e) { s[j] = e; });
  const float sum = lane_sum(n, [&](std::int64_t j) { return s[j]; });
  const float inv = 1.0f / sum;
  lane_map(
      n, [&](std::int64_t j) { return s[j] * inv; },
      [&](std::int64_t j, float v) { p[j] = store<T>(v); });
  for (std::int64_t j = n; j < len; ++j) p[j] = store<T>(0.0f);
}

/// Row i of dS = scale * P * (dP - sum_j P dP) on the triangle (entries 0..i), 0 above. ds may
/// alias dp (f32): every element is read before it is written.
template <class T>
TRAINKIT_FORCEINLINE void causal_softmax_backward_row(const T* p, const float* dp, T* ds,
                                                      std::int64_t i, std::int64_t len,
                                                      float scale) {
  const float dot = lane_sum(i + 1, [&](std::int64_t j) { return load(p[j]) * dp[j]; });
  lane_map(
      i + 1, [&](std::int64_t j) { return scale * load(p[j]) * (dp[j] - dot); },
      [&](std::int64_t j, float v) { ds[j] = store<T>(v); });
  for (std::int64_t j = i + 1; j < len; ++j) ds[j] = store<T>(0.0f);
}

#if TRAINKIT_DETAIL_HOST_AVX2
/// Rows per pass of the AVX2 softmax rows below (their per-row scalars live on the stack).
inline constexpr std::int64_t kSoftmaxRowBatch = 64;

/// Ends a row of `len` floats whose values stop at n: columns [j, n) (fewer than 8; none when
/// j == n) come from the lanes of v that `tail` selects, every column after them is 0. The lanes
/// past n are zeroed after the arithmetic, so a NaN computed there never reaches the row.
__attribute__((target("avx2"))) TRAINKIT_FORCEINLINE void store_row_end8(float* out, std::int64_t j,
                                                                         std::int64_t n,
                                                                         std::int64_t len,
                                                                         __m256i tail, __m256 v) {
  if (j < n) {
    if (j + 8 <= len) {  // the whole block
      _mm256_storeu_ps(out + j, _mm256_and_ps(v, _mm256_castsi256_ps(tail)));
      j += 8;
    } else {
      _mm256_maskstore_ps(out + j, tail, v);
      j = n;
    }
  }
  for (; j + 8 <= len; j += 8) _mm256_storeu_ps(out + j, _mm256_setzero_ps());
  for (; j < len; ++j) out[j] = 0.0f;
}

/// causal_softmax_row<float> for rows 0..rows-1 of a [rows, len] block (rows <= len), in AVX2:
/// the same lanes, orders and operations as the scalar row (lane_max / lane_map / lane_sum over
/// 8 lanes, the last partial block masked instead of scalar), so the same bits. The work runs in
/// passes over a batch of rows (maxima, then exponentials and their sums, then the scaling):
/// within a pass the rows are independent, so one row's chain of dependent operations (a
/// horizontal max or sum, the division) overlaps the next row's instead of stalling it.
__attribute__((target("avx2"))) inline void causal_softmax_rows_avx2(float* s, float* p,
                                                                     std::int64_t rows,
                                                                     std::int64_t len) {
  const __m256 zero = _mm256_setzero_ps();
  alignas(32) float maxes[kSoftmaxRowBatch];
  alignas(32) float sums[kSoftmaxRowBatch][8];
  for (std::int64_t i0 = 0; i0 < rows; i0 += kSoftmaxRowBatch) {
    const std::int64_t i1 = std::min(rows, i0 + kSoftmaxRowBatch);
    for (std::int64_t i = i0; i < i1; ++i) {  // row maxima
      const float* row = s + i * len;
      const std::int64_t n = i + 1, full = n / 8 * 8;
      __m256 mx = _mm256_set1_ps(row[0]);
      std::int64_t j = 0;
      for (; j < full; j += 8)
        mx = _mm256_max_ps(_mm256_loadu_ps(row + j), mx);  // v > acc ? v : acc
      if (j < n) {
        const __m256i tail = first_lanes8(n - full);
        const __m256 v = _mm256_maskload_ps(row + j, tail);
        mx = _mm256_blendv_ps(mx, _mm256_max_ps(v, mx), _mm256_castsi256_ps(tail));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, mx);
      float m = lanes[0];
      for (int l = 1; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
      maxes[i - i0] = m;
    }
    for (std::int64_t i = i0; i < i1; ++i) {  // s = exp(s - max) and its 8 lane sums
      float* row = s + i * len;
      const std::int64_t n = i + 1, full = n / 8 * 8;
      const __m256 vm = _mm256_set1_ps(maxes[i - i0]);
      __m256 acc = zero;
      std::int64_t j = 0;
      for (; j < full; j += 8) {
        const __m256 e = exp_approx8(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
        _mm256_storeu_ps(row + j, e);
        acc = _mm256_add_ps(acc, e);
      }
      if (j < n) {
        const __m256i tail = first_lanes8(n - full);
        const __m256 e =
            _mm256_and_ps(exp_approx8(_mm256_sub_ps(_mm256_maskload_ps(row + j, tail), vm)),
                          _mm256_castsi256_ps(tail));
        _mm256_maskstore_ps(row + j, tail, e);
        acc = _mm256_add_ps(acc, e);  // + 0 in the lanes past n: the same bits
      }
      _mm256_store_ps(sums[i - i0], acc);
    }
    for (std::int64_t i = i0; i < i1; ++i) {  // p = e / sum, zeros past the diagonal
      const float* row = s + i * len;
      float* out = p + i * len;
      const std::int64_t n = i + 1, full = n / 8 * 8;
      const __m256 inv = _mm256_set1_ps(1.0f / lane_tree8(_mm256_load_ps(sums[i - i0])));
      std::int64_t j = 0;
      for (; j < full; j += 8)
        _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
      const __m256i tail = first_lanes8(n - full);  // no lane when n == full
      store_row_end8(out, j, n, len, tail, _mm256_mul_ps(_mm256_maskload_ps(row + j, tail), inv));
    }
  }
}

/// causal_softmax_backward_row<float> for rows 0..rows-1 in AVX2, the scalar row's bits; the
/// rows' dot products in one pass, then the outputs (as in causal_softmax_rows_avx2).
__attribute__((target("avx2"))) inline void causal_softmax_backward_rows_avx2(
    const float* p, const float* dp, float* ds, std::int64_t rows, std::int64_t len, float scale) {
  const __m256 zero = _mm256_setzero_ps(), vs = _mm256_set1_ps(scale);
  alignas(32) float dots[kSoftmaxRowBatch][8];
  for (std::int64_t i0 = 0; i0 < rows; i0 += kSoftmaxRowBatch) {
    const std::int64_t i1 = std::min(rows, i0 + kSoftmaxRowBatch);
    for (std::int64_t i = i0; i < i1; ++i) {
      const float* pr = p + i * len;
      const float* dr = dp + i * len;
      const std::int64_t n = i + 1, full = n / 8 * 8;
      __m256 acc = zero;
      std::int64_t j = 0;
      for (; j < full; j += 8)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(pr + j), _mm256_loadu_ps(dr + j)));
      if (j < n) {  // masked loads give 0 past n: + 0 * 0
        const __m256i tail = first_lanes8(n - full);
        acc = _mm256_add_ps(
            acc, _mm256_mul_ps(_mm256_maskload_ps(pr + j, tail), _mm256_maskload_ps(dr + j, tail)));
      }
      _mm256_store_ps(dots[i - i0], acc);
    }
    for (std::int64_t i = i0; i < i1; ++i) {
      const float* pr = p + i * len;
      const float* dr = dp + i * len;
      float* out = ds + i * len;  // may alias dp: each block is read before it is written
      const std::int64_t n = i + 1, full = n / 8 * 8;
      const __m256 dot = _mm256_set1_ps(lane_tree8(_mm256_load_ps(dots[i - i0])));
      std::int64_t j = 0;
      for (; j < full; j += 8)
        _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(pr + j)),
                                                _mm256_sub_ps(_mm256_loadu_ps(dr + j), dot)));
      const __m256i tail = first_lanes8(n - full);
      store_row_end8(out, j, n, len, tail,
                     _mm256_mul_ps(_mm256_mul_ps(vs, _mm256_maskload_ps(pr + j, tail)),
                                   _mm256_sub_ps(_mm256_maskload_ps(dr + j, tail), dot)));
    }
  }
}
#endif

/// Rows per causal block of the host attention for 16-bit operands: block r of queries only
/// meets keys of blocks <= r, so whole blocks above the diagonal are never multiplied.
inline constexpr std::int64_t kAttentionBlock = 64;

/// Runs f(task, b, h) on the Host pool for every batch item b and head h (task = b * H + h), as
/// AVX2 code where the CPU has it (host_simd; f is a TRAINKIT_INLINE_LAMBDA).
template <class T, class F>
void for_each_head(const exec::Host& host, const AttentionArgs<T>& a, F&& f) {
  host.parallel_for(a.B * a.H, [&](std::int64_t task) {
    host_simd([&]() TRAINKIT_INLINE_LAMBDA { f(task, task / a.H, task % a.H); });
  });
}

/// The [T, T] softmax of one head's scores (f32), AVX2 where the CPU has it.
inline void causal_softmax_rows(float* s, float* p, std::int64_t Tn) {
#if TRAINKIT_DETAIL_HOST_AVX2
  if (cpu_has_avx2()) {
    causal_softmax_rows_avx2(s, p, Tn, Tn);
    return;
  }
#endif
  for (std::int64_t i = 0; i < Tn; ++i) causal_softmax_row<float>(s + i * Tn, p + i * Tn, i, Tn);
}

/// The [T, T] softmax backward of one head (f32), AVX2 where the CPU has it.
inline void causal_softmax_backward_rows(const float* p, const float* dp, float* ds,
                                         std::int64_t Tn, float scale) {
#if TRAINKIT_DETAIL_HOST_AVX2
  if (cpu_has_avx2()) {
    causal_softmax_backward_rows_avx2(p, dp, ds, Tn, Tn, scale);
    return;
  }
#endif
  for (std::int64_t i = 0; i < Tn; ++i)
    causal_softmax_backward_row<float>(p + i * Tn, dp + i * Tn, ds + i * Tn, i, Tn, scale);
}

/// The calling thread's f32 scratch for one head's [T, T] block: the host f32 attention keeps a
/// head's scores (forward), dP and dS (backward) there while they are in L1, instead of in
/// [B, H, T, T] buffers whose lines would come and go through the outer caches.
inline float* head_scratch(std::int64_t floats) {
  thread_local blas::detail::GemmBuffer buffer;
  return buffer.get(floats);
}

/// The f32 host attention: each head's products go straight to the gemm micro-kernel through
/// blas::detail::host_gemm_band, which skips the tiles above the diagonal of S and dP and the
/// zero ends of the rows of P and dS (about half the multiply-adds of the full products).
inline void attention_forward_f32(const exec::Host& host, const AttentionArgs<float>& a) {
  using blas::detail::GemmBand;
  using blas::detail::host_gemm_band;
  using Ref = blas::detail::OperandRef<float>;
  const std::int64_t Tn = a.T_, C = a.C, hs = a.hs;
  for_each_head(host, a,
                [&](std::int64_t task, std::int64_t b, std::int64_t h) TRAINKIT_INLINE_LAMBDA {
                  const float* q = a.qkv + b * Tn * 3 * C + h * hs;
                  const float* k = q + C;
                  const float* v = q + 2 * C;
                  float* s = head_scratch(Tn * Tn);
                  float* p = a.probs + task * Tn * Tn;
                  // S = scale * Q K^T on and below the diagonal, softmax by rows, O = P V.
                  host_gemm_band({Tn, Tn, hs}, Ref{q, 3 * C, 1}, Ref{k, 1, 3 * C}, s, Tn, a.scale,
                                 GemmBand::kColsToRow);
                  causal_softmax_rows(s, p, Tn);
                  host_gemm_band({Tn, hs, Tn}, Ref{p, Tn, 1}, Ref{v, 3 * C, 1},
                                 a.out + b * Tn * C + h * hs, C, 1.0f, GemmBand::kSumToRow);
                });
}

inline void attention_backward_f32(const exec::Host& host, const AttentionArgs<float>& a) {
  using blas::detail::GemmBand;
  using blas::detail::host_gemm_band;
  using Ref = blas::detail::OperandRef<float>;
  const std::int64_t Tn = a.T_, C = a.C, hs = a.hs;
  for_each_head(host, a,
                [&](std::int64_t task, std::int64_t b, std::int64_t h) TRAINKIT_INLINE_LAMBDA {
                  const float* q = a.qkv + b * Tn * 3 * C + h * hs;
                  const float* k = q + C;
                  const float* v = q + 2 * C;
                  float* dq = a.dqkv + b * Tn * 3 * C + h * hs;
                  const float* dout = a.dout + b * Tn * C + h * hs;
                  const float* p = a.probs + task * Tn * Tn;
                  float* dp = head_scratch(Tn * Tn);
                  float* ds = dp;  // each element of dP is read, then overwritten by dS
                  // dP = dO V^T, dS = scale * P * (dP - rowsum(P dP)) (0 above the diagonal), then
                  // dQ = dS K, dK = dS^T Q, dV = P^T dO.
                  host_gemm_band({Tn, Tn, hs}, Ref{dout, C, 1}, Ref{v, 1, 3 * C}, dp, Tn, 1.0f,
                                 GemmBand::kColsToRow);
                  causal_softmax_backward_rows(p, dp, ds, Tn, a.scale);
                  host_gemm_band({Tn, hs, Tn}, Ref{ds, Tn, 1}, Ref{k, 3 * C, 1}, dq, 3 * C, 1.0f,
                                 GemmBand::kSumToRow);
                  host_gemm_band({Tn, hs, Tn}, Ref{ds, 1, Tn}, Ref{q, 3 * C, 1}, dq + C, 3 * C,
                                 1.0f, GemmBand::kSumFromRow);
                  host_gemm_band({Tn, hs, Tn}, Ref{p, 1, Tn}, Ref{dout, C, 1}, dq + 2 * C, 3 * C,
                                 1.0f, GemmBand::kSumFromRow);
                });
}

/// Other operand types (f16/bf16 on the host): query blocks through blas::gemm.
template <class T>
void attention_forward_blocked(const exec::Host& host, const AttentionArgs<T>& a) {
  const std::int64_t Tn = a.T_, C = a.C, hs = a.hs;
  for_each_head(
      host, a, [&](std::int64_t task, std::int64_t b, std::int64_t h) TRAINKIT_INLINE_LAMBDA {
        const T* base = a.qkv + b * Tn * 3 * C;
        const Extents<2> qkv_strides{{3 * C, 1}};
        float* s = a.scores + task * Tn * Tn;
        T* p = a.probs + task * Tn * Tn;
        blas::GemmOptions<float> so;
        so.alpha = a.scale;
        for (std::int64_t r0 = 0; r0 < Tn; r0 += kAttentionBlock) {
          const std::int64_t r1 = std::min(Tn, r0 + kAttentionBlock), rows = r1 - r0;
          const TensorView<const T, 2> q(base + r0 * 3 * C + h * hs, Extents<2>{{rows, hs}},
                                         qkv_strides);
          const TensorView<const T, 2> k(base + C + h * hs, Extents<2>{{r1, hs}}, qkv_strides);
          const TensorView<const T, 2> v(base + 2 * C + h * hs, Extents<2>{{r1, hs}}, qkv_strides);
          // Nested inside a pool task, gemm runs on this thread (exec::Host runs nested work
          // inline).
          blas::gemm(host, blas::Op::kN, blas::Op::kT, q, k,
                     TensorView<float, 2>(s + r0 * Tn, Extents<2>{{rows, r1}}, Extents<2>{{Tn, 1}}),
                     so);
          for (std::int64_t i = r0; i < r1; ++i)
            causal_softmax_row<T>(s + i * Tn, p + i * Tn, i, Tn);
          const TensorView<const T, 2> pv(p + r0 * Tn, Extents<2>{{rows, r1}}, Extents<2>{{Tn, 1}});
          const TensorView<T, 2> o(a.out + (b * Tn + r0) * C + h * hs, Extents<2>{{rows, hs}},
                                   Extents<2>{{C, 1}});
          blas::gemm(host, blas::Op::kN, blas::Op::kN, pv, v, o);
        }
      });
}

template <class T>
void attention_backward_blocked(const exec::Host& host, const AttentionArgs<T>& a) {
  const std::int64_t Tn = a.T_, C = a.C, hs = a.hs;
  for_each_head(
      host, a, [&](std::int64_t task, std::int64_t b, std::int64_t h) TRAINKIT_INLINE_LAMBDA {
        const T* base = a.qkv + b * Tn * 3 * C;
        T* dbase = a.dqkv + b * Tn * 3 * C;
        const T* dobase = a.dout + b * Tn * C + h * hs;
        const Extents<2> qkv_strides{{3 * C, 1}};
        const Extents<2> sq_strides{{Tn, 1}};
        const T* p = a.probs + task * Tn * Tn;
        float* dp = a.scores + task * Tn * Tn;
        T* ds = a.dscores + task * Tn * Tn;
        auto rows_of = [&](const T* m, std::int64_t r0, std::int64_t r1, std::int64_t ld,
                           std::int64_t width) {
          return TensorView<const T, 2>(m + r0 * ld, Extents<2>{{r1 - r0, width}},
                                        Extents<2>{{ld, 1}});
        };
        // Query blocks: dP = dO V^T, dS = scale * P * (dP - rowsum(P dP)), dQ = dS K.
        for (std::int64_t r0 = 0; r0 < Tn; r0 += kAttentionBlock) {
          const std::int64_t r1 = std::min(Tn, r0 + kAttentionBlock), rows = r1 - r0;
          const auto dout = rows_of(dobase, r0, r1, C, hs);
          blas::gemm(host, blas::Op::kN, blas::Op::kT, dout,
                     rows_of(base + 2 * C + h * hs, 0, r1, 3 * C, hs),
                     TensorView<float, 2>(dp + r0 * Tn, Extents<2>{{rows, r1}}, sq_strides));
          for (std::int64_t i = r0; i < r1; ++i)
            causal_softmax_backward_row<T>(p + i * Tn, dp + i * Tn, ds + i * Tn, i, Tn, a.scale);
          blas::gemm(
              host, blas::Op::kN, blas::Op::kN, rows_of(ds, r0, r1, Tn, r1),
              rows_of(base + C + h * hs, 0, r1, 3 * C, hs),
              TensorView<T, 2>(dbase + r0 * 3 * C + h * hs, Extents<2>{{rows, hs}}, qkv_strides));
        }
        // Key blocks: keys [k0, k1) are attended by queries [k0, T): dK = dS^T Q, dV = P^T dO.
        for (std::int64_t k0 = 0; k0 < Tn; k0 += kAttentionBlock) {
          const std::int64_t k1 = std::min(Tn, k0 + kAttentionBlock), keys = k1 - k0;
          const TensorView<const T, 2> dsv(ds + k0 * Tn + k0, Extents<2>{{Tn - k0, keys}},
                                           sq_strides);
          const TensorView<const T, 2> pv(p + k0 * Tn + k0, Extents<2>{{Tn - k0, keys}},
                                          sq_strides);
          blas::gemm(host, blas::Op::kT, blas::Op::kN, dsv,
                     rows_of(base + h * hs, k0, Tn, 3 * C, hs),
                     TensorView<T, 2>(dbase + k0 * 3 * C + C + h * hs, Extents<2>{{keys, hs}},
                                      qkv_strides));
          blas::gemm(host, blas::Op::kT, blas::Op::kN, pv, rows_of(dobase, k0, Tn, C, hs),
                     TensorView<T, 2>(dbase + k0 * 3 * C + 2 * C + h * hs, Extents<2>{{keys, hs}},
                                      qkv_strides));
        }
      });
}

template <class T>
void attention_forward(const exec::Host& host, const AttentionArgs<T>& a) {
  if constexpr (std::is_same_v<T, float>) {
    attention_forward_f32(host, a);
  } else {
    attention_forward_blocked(host, a);
  }
}

template <class T>
void attention_backward(const exec::Host& host, const AttentionArgs<T>& a) {
  if constexpr (std::is_same_v<T, float>) {
    attention_backward_f32(host, a);
  } else {
    attention_backward_blocked(host, a);
  }
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// One warp per row (b, h, i): masked softmax of the scaled scores into probs.
template <class T>
__global__ void __launch_bounds__(kRowWarps * 32)
    causal_softmax_kernel(const float* __restrict__ scores, T* __restrict__ probs,
                          std::int64_t rows, std::int64_t Tn) {
  const std::int64_t row = warp_row();
  const int lane = warp_lane();
  if (row >= rows) return;
  const std::int64_t i = row % Tn;
  const float* s = scores + row * Tn;
  T* p = probs + row * Tn;
  float m = -INFINITY;
  for (std::int64_t j = lane; j <= i; j += 32) m = fmaxf(m, s[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (std::int64_t j = lane; j <= i; j += 32) sum += expf(s[j] - m);
  const float inv = 1.0f / warp_sum(sum);
  for (std::int64_t j = lane; j < Tn; j += 32)
    p[j] = store<T>(j <= i ? expf(s[j] - m) * inv : 0.0f);
}

/// One warp per row: dS = scale * P * (dP - sum_j P dP) on the triangle, 0 above. dscores may
/// alias dprobs (f32): each lane reads its element before writing it.
template <class T>
__global__ void __launch_bounds__(kRowWarps * 32)
    causal_softmax_backward_kernel(const T* __restrict__ probs, const float* dprobs, T* dscores,
                                   std::int64_t rows, std::int64_t Tn, float scale) {
  const std::int64_t row = warp_row();
  const int lane = warp_lane();
  if (row >= rows) return;
  const std::int64_t i = row % Tn;
  const T* p = probs + row * Tn;
  const float* dp = dprobs + row * Tn;
  T* ds = dscores + row * Tn;
  float dot = 0.0f;
  for (std::int64_t j = lane; j <= i; j += 32) dot += load(p[j]) * dp[j];
  dot = warp_sum(dot);
  for (std::int64_t j = lane; j < Tn; j += 32)
    ds[j] = store<T>(j <= i ? scale * load(p[j]) * (dp[j] - dot) : 0.0f);
}

/// Gemm options of the attention products: TF32 only where the operands are f32.
template <class C>
blas::GemmOptions<C> options(blas::ComputeType compute) {
  blas::GemmOptions<C> o;
  o.compute = compute;
  return o;
}

template <class T>
void attention_forward(const exec::Cuda& exec, const AttentionArgs<T>& a) {
  if (a.lse != nullptr) {
    fused_attention_forward(exec, a.fused());
    return;
  }
  const std::int64_t Tn = a.T_, C = a.C, H = a.H, hs = a.hs;
  // Per batch item b, heads are a strided batch: head h starts hs elements after head h-1.
  const Extents<3> head{{H, Tn, hs}};
  const Extents<3> qkv_strides{{hs, 3 * C, 1}};
  const Extents<3> sq{{H, Tn, Tn}};
  for (std::int64_t b = 0; b < a.B; ++b) {
    const T* base = a.qkv + b * Tn * 3 * C;
    const DeviceView<const T, 3> q(base, head, qkv_strides);
    const DeviceView<const T, 3> k(base + C, head, qkv_strides);
    blas::GemmOptions<float> so = options<float>(a.compute);
    so.alpha = a.scale;
    gemm_on(exec, blas::Op::kN, blas::Op::kT, q, k,
            DeviceView<float, 3>(a.scores + b * H * Tn * Tn, sq), so);
  }
  const std::int64_t rows = a.B * H * Tn;
  constexpr const char* kSoftmax = "nn::CausalSelfAttention forward (causal softmax)";
  causal_softmax_kernel<T><<<exec::detail::grid_blocks_x(rows, kRowWarps, kSoftmax), kRowWarps * 32,
                             0, exec.stream().get()>>>(a.scores, a.probs, rows, Tn);
  exec::detail::check_kernel_launch(kSoftmax, "B ", a.B, ", H ", H, ", T ", Tn);
  for (std::int64_t b = 0; b < a.B; ++b) {
    const DeviceView<const T, 3> v(a.qkv + b * Tn * 3 * C + 2 * C, head, qkv_strides);
    const DeviceView<const T, 3> p(a.probs + b * H * Tn * Tn, sq);
    const DeviceView<T, 3> o(a.out + b * Tn * C, head, Extents<3>{{hs, C, 1}});
    gemm_on(exec, blas::Op::kN, blas::Op::kN, p, v, o, options<T>(a.compute));
  }
}

template <class T>
void attention_backward(const exec::Cuda& exec, const AttentionArgs<T>& a) {
  if (a.lse != nullptr) {
    fused_attention_backward(exec, a.fused());
    return;
  }
  const std::int64_t Tn = a.T_, C = a.C, H = a.H, hs = a.hs;
  const Extents<3> head{{H, Tn, hs}};
  const Extents<3> qkv_strides{{hs, 3 * C, 1}};
  const Extents<3> out_strides{{hs, C, 1}};
  const Extents<3> sq{{H, Tn, Tn}};
  for (std::int64_t b = 0; b < a.B; ++b) {
    const T* base = a.qkv + b * Tn * 3 * C;
    T* dbase = a.dqkv + b * Tn * 3 * C;
    const DeviceView<const T, 3> v(base + 2 * C, head, qkv_strides);
    const DeviceView<const T, 3> dout(a.dout + b * Tn * C, head, out_strides);
    const DeviceView<const T, 3> p(a.probs + b * H * Tn * Tn, sq);
    gemm_on(exec, blas::Op::kN, blas::Op::kT, dout, v,
            DeviceView<float, 3>(a.scores + b * H * Tn * Tn, sq), options<float>(a.compute));
    gemm_on(exec, blas::Op::kT, blas::Op::kN, p, dout,
            DeviceView<T, 3>(dbase + 2 * C, head, qkv_strides), options<T>(a.compute));
  }
  const std::int64_t rows = a.B * H * Tn;
  constexpr const char* kSoftmax = "nn::CausalSelfAttention backward (causal softmax)";
  causal_softmax_backward_kernel<T>
      <<<exec::detail::grid_blocks_x(rows, kRowWarps, kSoftmax), kRowWarps * 32, 0,
         exec.stream().get()>>>(a.probs, a.scores, a.dscores, rows, Tn, a.scale);
  exec::detail::check_kernel_launch(kSoftmax, "B ", a.B, ", H ", H, ", T ", Tn);
  for (std::int64_t b = 0; b < a.B; ++b) {
    const T* base = a.qkv + b * Tn * 3 * C;
    T* dbase = a.dqkv + b * Tn * 3 * C;
    const DeviceView<const T, 3> q(base, head, qkv_strides);
    const DeviceView<const T, 3> k(base + C, head, qkv_strides);
    const DeviceView<const T, 3> ds(a.dscores + b * H * Tn * Tn, sq);
    gemm_on(exec, blas::Op::kN, blas::Op::kN, ds, k, DeviceView<T, 3>(dbase, head, qkv_strides),
            options<T>(a.compute));
    gemm_on(exec, blas::Op::kT, blas::Op::kN, ds, q, DeviceView<T, 3>(dbase + C, head, qkv_strides),
            options<T>(a.compute));
  }
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#else
TRAINKIT_DETAIL_NN_CUDA_ONLY(attention_forward)
TRAINKIT_DETAIL_NN_CUDA_ONLY(attention_backward)
#endif
}  // namespace detail

/// Options of nn::CausalSelfAttention.
struct AttentionOptions {
  std::int64_t n_embd = 0;  ///< C
  std::int64_t n_head = 0;  ///< H; C must be a multiple of H (head size hs = C / H)
  bool bias = true;
  /// Initialisers of c_attn/c_proj weights (default: torch.nn.Linear's) and biases.
  Init weight_init = Init::kaiming_uniform(kTorchLinearKaimingA);
  std::optional<Init> bias_init = std::nullopt;
  /// c_proj's weight init if set (GPT-2 scales it by 1/sqrt(2 * n_layer)).
  std::optional<Init> proj_weight_init = std::nullopt;
  /// On the GPU, the fused core (tiles in shared memory, no [B, H, T, T] in memory) for head
  /// sizes up to 128; false: the materialised one (cuBLASLt products and softmax kernels). The
  /// host always materialises (per head, in cache).
  bool fused_core = true;
};

/// Causal multi-head self-attention with input and output projections, as nanoGPT's
/// CausalSelfAttention: parameters "<name>.c_attn.weight" [3C, C], "<name>.c_attn.bias" [3C],
/// "<name>.c_proj.weight" [C, C], "<name>.c_proj.bias" [C]. No attention dropout.
///
/// Shapes: x, y [B, T, C]. forward writes y and saves, in the caller's Context, qkv [B, T, 3C],
/// the heads' output [B, T, C] and either the probabilities [B, H, T, T] (host, and the GPU's
/// materialised core: memory O(B H T^2)) or, with the GPU's fused core, one log-sum-exp per row
/// [B, H, T]. backward reads x, dy and that context, accumulates the four parameter gradients
/// and writes dx (or adds it, Write::kAccumulate; absent: skipped).
/// Softmax is f32 under every policy; Q K^T is accumulated in f32, P V in the activation type.
template <Space S = Space::kHost>
class CausalSelfAttention {
 public:
  /// What forward saves for backward, in the activation type of its policy and in space S. Keep
  /// one per forward whose backward is still to come; refilling it reuses its memory.
  class Context {
   public:
    /// qkv [B, T, 3C]: Q | K | V of each token (c_attn's output).
    template <class T>
    const T* qkv() const noexcept {
      return qkv_.template data<T>();
    }
    /// The heads side by side [B, T, C] (c_proj's input).
    template <class T>
    const T* heads() const noexcept {
      return heads_.template data<T>();
    }
    /// The softmax probabilities [B, H, T, T] (zero above the diagonal); null after the GPU's
    /// fused core, which saves lse() instead.
    template <class T>
    const T* probs() const noexcept {
      return probs_.template data<T>();
    }
    /// The GPU's fused core: log2 of each row's softmax denominator [B, H, T], in the scores'
    /// exp2 domain (scale * log2(e) * q.k); null after a materialised core.
    const float* lse() const noexcept { return lse_.template data<float>(); }

   private:
    friend class CausalSelfAttention;
    detail::ForwardRecord rec_;
    detail::Bytes<S> qkv_, heads_, probs_, lse_;
  };

  CausalSelfAttention(ParamArena<S>& arena, const std::string& name, AttentionOptions o)
      : c_attn_(arena, detail::child_name(name, "c_attn"),
                linear_options(check_options(o, name), 3 * o.n_embd, o.weight_init)),
        c_proj_(arena, detail::child_name(name, "c_proj"),
                linear_options(o, o.n_embd, o.proj_weight_init.value_or(o.weight_init))),
        C_(o.n_embd),
        H_(o.n_head),
        fused_(S == Space::kDevice && o.fused_core && o.n_head > 0 &&
               detail::fused_attention_supports(o.n_embd / o.n_head)) {}

  /// Returns `o`; throws trainkit::Error naming the layer `name` unless n_embd and n_head are
  /// > 0 and n_embd is a multiple of n_head (checked before any parameter is registered).
  static const AttentionOptions& check_options(const AttentionOptions& o, const std::string& name) {
    TRAINKIT_CHECK(o.n_embd > 0 && o.n_head > 0, "nn::CausalSelfAttention '", name,
                   "': n_embd and n_head must be > 0, got ", o.n_embd, " and ", o.n_head);
    TRAINKIT_CHECK(o.n_embd % o.n_head == 0, "nn::CausalSelfAttention '", name, "': n_embd ",
                   o.n_embd, " is not a multiple of n_head ", o.n_head);
    return o;
  }

  Linear<S>& c_attn() noexcept { return c_attn_; }
  Linear<S>& c_proj() noexcept { return c_proj_; }
  std::int64_t n_embd() const noexcept { return C_; }
  std::int64_t n_head() const noexcept { return H_; }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TY>
  void forward(const E& exec, Context& ctx, TensorView<TX, 3, S> x, TensorView<TY, 3, S> y) {
    detail::check_call<P, E, S, TX, TY>();
    detail::check_same_io("nn::CausalSelfAttention::forward", x, y, C_);
    c_proj_.template forward<P>(exec, heads_of<P>(exec, ctx, x), detail::flat2(y));
  }

  /// y = residual + attention(x): a skip connection added by c_proj's gemm (see Linear::forward
  /// with a residual) instead of a separate pass. residual is [B, T, C], contiguous; it may be y.
  template <amp::Policy P = amp::Fp32, class E, class TX, class TY, class TR>
  void forward(const E& exec, Context& ctx, TensorView<TX, 3, S> x, TensorView<TY, 3, S> y,
               TensorView<TR, 3, S> residual) {
    detail::check_call<P, E, S, TX, TY, TR>();
    detail::check_same_io("nn::CausalSelfAttention::forward", x, y, C_);
    detail::check_same_io("nn::CausalSelfAttention::forward", residual, y, C_);
    c_proj_.template forward<P>(exec, heads_of<P>(exec, ctx, x), detail::flat2(y),
                                detail::flat2(residual));
  }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TG>
  void backward(const E& exec, const Context& ctx, TensorView<TX, 3, S> x, TensorView<TD, 3, S> dy,
                TensorView<TG, 3, S> dx, Write mode = Write::kOverwrite) {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TD, TG>();
    detail::check_backward_views("nn::CausalSelfAttention::backward", x, dy, dx, C_);
    const std::int64_t B = x.size(0), Tn = x.size(1), N = B * Tn;
    ctx.rec_.template check<T>("nn::CausalSelfAttention::backward", B, Tn, C_);
    T* dheads = dheads_.template get<T>(N * C_);
    T* dqkv = dqkv_.template get<T>(N * 3 * C_);
    // The core's argument block is shared with forward; backward only reads what forward saved.
    detail::AttentionArgs<T> a;
    if (fused_) {
      a = args<P, T>(ctx.template qkv<T>(), const_cast<T*>(ctx.template heads<T>()), nullptr, B,
                     Tn);
      a.lse = const_cast<float*>(ctx.lse());
      a.delta = scores_.template get<float>(B * H_ * Tn);
    } else {
      a = args<P, T>(ctx.template qkv<T>(), nullptr, const_cast<T*>(ctx.template probs<T>()), B,
                     Tn);
      // f32 operands: dS reuses the f32 scores scratch (each element is read before written).
      a.dscores = std::is_same_v<T, float> ? reinterpret_cast<T*>(a.scores)
                                           : dscores_.template get<T>(B * H_ * Tn * Tn);
    }
    a.dout = dheads;
    a.dqkv = dqkv;
    c_proj_.template backward<P>(exec, detail::mat<S>(ctx.template heads<T>(), N, C_),
                                 detail::flat2(dy), detail::mat<S>(dheads, N, C_));
    detail::attention_backward(exec, a);
    TensorView<T, 2, S> dx2;
    if (!detail::absent(dx)) dx2 = detail::flat2(dx);
    c_attn_.template backward<P>(exec, detail::flat2(x),
                                 detail::mat<S>(static_cast<const T*>(dqkv), N, 3 * C_), dx2, mode);
  }

 private:
  static LinearOptions linear_options(const AttentionOptions& o, std::int64_t out, Init w) {
    LinearOptions l;
    l.in_features = o.n_embd;
    l.out_features = out;
    l.bias = o.bias;
    l.weight_init = w;
    l.bias_init = o.bias_init;
    return l;
  }

  /// Forward up to c_proj: qkv = c_attn(x) and the attention core, saved in ctx; returns the
  /// heads side by side [N, C] (c_proj's input).
  template <amp::Policy P, class E, class TX>
  TensorView<const std::remove_const_t<TX>, 2, S> heads_of(const E& exec, Context& ctx,
                                                           TensorView<TX, 3, S> x) {
    using T = std::remove_const_t<TX>;
    const std::int64_t B = x.size(0), Tn = x.size(1), N = B * Tn;
    ctx.rec_.template set<T>(B, Tn, C_);
    T* qkv = ctx.qkv_.template get<T>(N * 3 * C_);
    T* heads = ctx.heads_.template get<T>(N * C_);
    detail::AttentionArgs<T> a;
    if (fused_) {
      a = args<P, T>(qkv, heads, nullptr, B, Tn);
      a.lse = ctx.lse_.template get<float>(B * H_ * Tn);
    } else {
      a = args<P, T>(qkv, heads, ctx.probs_.template get<T>(B * H_ * Tn * Tn), B, Tn);
    }
    c_attn_.template forward<P>(exec, detail::flat2(x), detail::mat<S>(qkv, N, 3 * C_));
    detail::attention_forward(exec, a);
    return detail::mat<S>(static_cast<const T*>(heads), N, C_);
  }

  /// The arguments of the attention core common to forward and backward (the saved tensors, the
  /// f32 scores scratch, the sizes and the compute type of policy P).
  template <class P, class T>
  detail::AttentionArgs<T> args(const T* qkv, T* heads, T* probs, std::int64_t B, std::int64_t Tn) {
    detail::AttentionArgs<T> a{};
    a.qkv = qkv;
    a.out = heads;
    a.probs = probs;
    // The host's f32 core keeps each head's scores in a per-thread scratch (head_scratch); the
    // fused GPU core has none.
    if constexpr (S != Space::kHost || !std::is_same_v<T, float>) {
      if (!fused_) a.scores = scores_.template get<float>(B * H_ * Tn * Tn);
    }
    a.B = B;
    a.T_ = Tn;
    a.C = C_;
    a.H = H_;
    a.hs = C_ / H_;
    a.scale = 1.0f / std::sqrt(static_cast<float>(a.hs));
    a.compute = std::is_same_v<T, float> ? P::gemm_compute : blas::ComputeType::kF32;
    return a;
  }

  Linear<S> c_attn_;
  Linear<S> c_proj_;
  std::int64_t C_;
  std::int64_t H_;
  bool fused_;  // the GPU's fused core (AttentionOptions::fused_core and a supported head size)
  // Scratch of one call: the f32 scores (forward: Q K^T / sqrt(hs); backward: dP), and the
  // backward's dheads, dqkv and (low-precision operands) dS.
  detail::Bytes<S> scores_, dheads_, dqkv_, dscores_;
};

template <Space S>
CausalSelfAttention(ParamArena<S>&, const std::string&, AttentionOptions) -> CausalSelfAttention<S>;

}  // namespace nn
TRAINKIT_NAMESPACE_END
