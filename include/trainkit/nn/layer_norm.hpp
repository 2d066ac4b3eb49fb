// SPDX-License-Identifier: MIT
// trainkit/nn/layer_norm.hpp: `LayerNorm` over the last dimension (torch.nn.LayerNorm(C)),
// always computed in f32 (autocast's f32 list). Forward saves each row's mean and 1/std in the
// caller's LayerNorm::Context for backward, as llm.c does. The weight/bias gradients are reduced in
// fixed row chunks and then in chunk order, so they are bitwise reproducible for any thread count
// and grid.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "trainkit/amp/policy.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/math.hpp"
#include "trainkit/nn/param_arena.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

/// Rows per partial sum of the weight/bias gradients (fixed: results do not depend on threads).
inline constexpr std::int64_t kLayerNormChunk = 32;

/// Threads per block of the device backward's partial-sum kernel (one column each).
inline constexpr int kLayerNormPartialThreads = 128;

/// The grid of the device backward's partial-sum kernel: x covers the columns in blocks of
/// kLayerNormPartialThreads, y the chunks of kLayerNormChunk rows, at most 65535 of them (a grid's
/// y limit: 2,097,120 rows); block y then takes chunks y, y + grid.y, ... Host code (testable).
struct LayerNormPartialGrid {
  unsigned x, y;
};
inline LayerNormPartialGrid layer_norm_partial_grid(std::int64_t rows, std::int64_t cols) {
  return {exec::detail::grid_blocks_x(cols, kLayerNormPartialThreads,
                                      "nn::LayerNorm backward (weight and bias partial sums)"),
          exec::detail::grid_dim_yz(exec::detail::ceil_div(rows, kLayerNormChunk))};
}

/// Arguments of the LayerNorm kernels (host and device).
template <class T>
struct LayerNormArgs {
  const T* x;
  T* y;               // forward output
  const T* dy;        // backward input
  T* dx;              // backward output
  const T* residual;  // backward: added to dx (the residual stream's gradient), may be null
  const float* w;
  const float* b;  // may be null
  float* mean;
  float* rstd;
  float* partial;  // [chunks, 2, C] backward scratch
  float* dw;
  float* db;  // may be null
  std::int64_t rows;
  std::int64_t cols;
  float eps;
  bool accumulate;
};

/// Column c of the weight/bias gradients: the chunk partials of pass 1 added in chunk order
/// (host and device).
template <class T>
TRAINKIT_HOST_DEVICE inline void add_chunk_partials(const LayerNormArgs<T>& a, std::int64_t chunks,
                                                    std::int64_t c) {
  const std::int64_t C = a.cols;
  float w = 0.0f, b = 0.0f;
  for (std::int64_t k = 0; k < chunks; ++k) {
    w += a.partial[k * 2 * C + c];
    b += a.partial[k * 2 * C + C + c];
  }
  a.dw[c] += w;
  if (a.db != nullptr) a.db[c] += b;
}

/// Chunk k of the backward's pass 1: its partial sums of dw and db (zeroed here) and its rows.
struct LayerNormChunk {
  float* pw;
  float* pb;
  std::int64_t r0, r1;
};
template <class T>
TRAINKIT_FORCEINLINE LayerNormChunk layer_norm_chunk(const LayerNormArgs<T>& a, std::int64_t k) {
  const std::int64_t C = a.cols;
  float* pw = a.partial + k * 2 * C;
  float* pb = pw + C;
  for (std::int64_t c = 0; c < C; ++c) pw[c] = pb[c] = 0.0f;
  return {pw, pb, k * kLayerNormChunk, std::min(a.rows, (k + 1) * kLayerNormChunk)};
}

/// A row's mean and variance from m0 (the plain mean: one f32 sum / n) and the sums of
/// d = x - m0 and of d^2 over the row: m = m0 + sum(d) / n and var = (sum(d^2) - sum(d)^2 / n) / n,
/// which remove the rounding error of m0 (the corrected two-pass algorithm). Without it a row of
/// equal values (or a large offset with a small spread) normalises m0's rounding error,
/// multiplied by up to 1/sqrt(eps), instead of 0. Shared by the host rows (scalar and AVX2: the
/// same bits) and the CUDA kernel.
struct RowMoments {
  float mean, var;
};
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE RowMoments row_moments(float m0, float sum_d,
                                                                 float sum_d2, std::int64_t n) {
  const float shift = sum_d / static_cast<float>(n);
  // d^2 past f32 (|x| >~ 1.8e19): an infinite variance (rstd 0), not inf - inf; NaN stays NaN.
  if (sum_d2 - sum_d2 != 0.0f) return {m0 + shift, sum_d2};
  const float var = (sum_d2 - sum_d * shift) / static_cast<float>(n);
  return {m0 + shift, var < 0.0f ? 0.0f : var};
}

#if TRAINKIT_DETAIL_HOST_AVX2
/// Rows [r0, r1) of the f32 forward in AVX2: lane_sum's lanes and tree, the element formulas'
/// operations in their order (no FMA), so the bits of the generic row loop.
__attribute__((target("avx2"))) inline void layer_norm_forward_rows_avx2(
    const LayerNormArgs<float>& a, std::int64_t r0, std::int64_t r1) {
  const std::int64_t C = a.cols, full = C / 8 * 8;
  const __m256 tail = _mm256_castsi256_ps(first_lanes8(C - full)), zero = _mm256_setzero_ps();
  const __m256i tail_i = _mm256_castps_si256(tail);
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * C;
    float* y = a.y + r * C;
    __m256 acc = zero;
    std::int64_t c = 0;
    for (; c < full; c += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + c));
    if (c < C) acc = _mm256_add_ps(acc, _mm256_maskload_ps(x + c, tail_i));
    const float m0 = lane_tree8(acc) / static_cast<float>(C);
    const __m256 vm0 = _mm256_set1_ps(m0);
    acc = zero;
    __m256 acc2 = zero;
    for (c = 0; c < full; c += 8) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + c), vm0);
      acc = _mm256_add_ps(acc, d);
      acc2 = _mm256_add_ps(acc2, _mm256_mul_ps(d, d));
    }
    if (c < C) {
      const __m256 d = _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(x + c, tail_i), vm0), tail);
      acc = _mm256_add_ps(acc, d);
      acc2 = _mm256_add_ps(acc2, _mm256_mul_ps(d, d));
    }
    const RowMoments mo = row_moments(m0, lane_tree8(acc), lane_tree8(acc2), C);
    const float m = mo.mean;
    const __m256 vm = _mm256_set1_ps(m);
    const float sd = 1.0f / std::sqrt(mo.var + a.eps);
    const __m256 vs = _mm256_set1_ps(sd);
    for (c = 0; c < C; c += 8) {
      const bool part = c + 8 > C;
      const __m256 xv = part ? _mm256_maskload_ps(x + c, tail_i) : _mm256_loadu_ps(x + c);
      const __m256 wv = part ? _mm256_maskload_ps(a.w + c, tail_i) : _mm256_loadu_ps(a.w + c);
      __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(xv, vm), vs), wv);
      if (a.b != nullptr)
        v = _mm256_add_ps(v, part ? _mm256_maskload_ps(a.b + c, tail_i) : _mm256_loadu_ps(a.b + c));
      if (part) {
        _mm256_maskstore_ps(y + c, tail_i, v);
      } else {
        _mm256_storeu_ps(y + c, v);
      }
    }
    a.mean[r] = m;
    a.rstd[r] = sd;
  }
}

/// Chunk k of the f32 backward's pass 1 in AVX2 (the generic chunk loop's bits, as above).
__attribute__((target("avx2"))) inline void layer_norm_backward_chunk_avx2(
    const LayerNormArgs<float>& a, std::int64_t k) {
  const std::int64_t C = a.cols, full = C / 8 * 8;
  const __m256 tail = _mm256_castsi256_ps(first_lanes8(C - full)), zero = _mm256_setzero_ps();
  const __m256i tail_i = _mm256_castps_si256(tail);
  const LayerNormChunk ch = layer_norm_chunk(a, k);
  float* pw = ch.pw;
  float* pb = ch.pb;
  for (std::int64_t r = ch.r0; r < ch.r1; ++r) {
    const float* x = a.x + r * C;
    const float* dy = a.dy + r * C;
    float* dx = a.dx == nullptr ? nullptr : a.dx + r * C;
    const float* res = a.residual == nullptr ? nullptr : a.residual + r * C;
    // x (saved by the forward) comes from the outer caches: fetch two rows ahead of their turn.
    if (r + 2 < ch.r1) {
      for (std::int64_t c = 0; c < C; c += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(x + 2 * C + c), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(dy + 2 * C + c), _MM_HINT_T0);
        if (res != nullptr)
          _mm_prefetch(reinterpret_cast<const char*>(res + 2 * C + c), _MM_HINT_T0);
        if (dx != nullptr) _mm_prefetch(reinterpret_cast<const char*>(dx + 2 * C + c), _MM_HINT_T0);
      }
    }
    const __m256 vm = _mm256_set1_ps(a.mean[r]), vs = _mm256_set1_ps(a.rstd[r]);
    __m256 acc_g = zero, acc_gx = zero;
    for (std::int64_t c = 0; c < C; c += 8) {
      const __m256 g = load8(dy, c, C, tail_i);
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(load8(x, c, C, tail_i), vm), vs);
      __m256 gw = _mm256_mul_ps(g, load8(a.w, c, C, tail_i));
      __m256 gx = _mm256_mul_ps(gw, xhat);
      if (c + 8 > C) {  // + 0 in the lanes past C
        gw = _mm256_and_ps(gw, tail);
        gx = _mm256_and_ps(gx, tail);
      }
      acc_g = _mm256_add_ps(acc_g, gw);
      acc_gx = _mm256_add_ps(acc_gx, gx);
      store8(pw, c, C, tail_i, _mm256_add_ps(load8(pw, c, C, tail_i), _mm256_mul_ps(g, xhat)));
      store8(pb, c, C, tail_i, _mm256_add_ps(load8(pb, c, C, tail_i), g));
    }
    if (dx == nullptr) continue;
    const __m256 mg = _mm256_set1_ps(lane_tree8(acc_g) / static_cast<float>(C));
    const __m256 mgx = _mm256_set1_ps(lane_tree8(acc_gx) / static_cast<float>(C));
    for (std::int64_t c = 0; c < C; c += 8) {
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(load8(x, c, C, tail_i), vm), vs);
      const __m256 gw = _mm256_mul_ps(load8(dy, c, C, tail_i), load8(a.w, c, C, tail_i));
      __m256 v = _mm256_mul_ps(vs, _mm256_sub_ps(_mm256_sub_ps(gw, mg), _mm256_mul_ps(xhat, mgx)));
      if (a.accumulate && res != nullptr) {
        v = _mm256_add_ps(_mm256_add_ps(load8(dx, c, C, tail_i), load8(res, c, C, tail_i)), v);
      } else if (a.accumulate) {
        v = _mm256_add_ps(load8(dx, c, C, tail_i), v);
      } else if (res != nullptr) {
        v = _mm256_add_ps(load8(res, c, C, tail_i), v);
      }
      store8(dx, c, C, tail_i, v);
    }
  }
}
#endif

/// Rows [r0, r1) of the host forward, element loops in 8 lanes (lane_sum / lane_map).
template <class T>
TRAINKIT_FORCEINLINE void layer_norm_forward_rows(const LayerNormArgs<T>& a, std::int64_t r0,
                                                  std::int64_t r1) {
  const std::int64_t C = a.cols;
  for (std::int64_t r = r0; r < r1; ++r) {
    const T* x = a.x + r * C;
    T* y = a.y + r * C;
    const float m0 =
        lane_sum(C, [&](std::int64_t c) { return load(x[c]); }) / static_cast<float>(C);
    const float sum_d = lane_sum(C, [&](std::int64_t c) { return load(x[c]) - m0; });
    const float sum_d2 = lane_sum(C, [&](std::int64_t c) {
      const float d = load(x[c]) - m0;
      return d * d;
    });
    const RowMoments mo = row_moments(m0, sum_d, sum_d2, C);
    const float m = mo.mean;
    const float s = 1.0f / std::sqrt(mo.var + a.eps);
    const auto put = [&](std::int64_t c, float v) { y[c] = store<T>(v); };
    if (a.b != nullptr) {
      lane_map(
          C, [&](std::int64_t c) { return (load(x[c]) - m) * s * a.w[c] + a.b[c]; }, put);
    } else {
      lane_map(
          C, [&](std::int64_t c) { return (load(x[c]) - m) * s * a.w[c]; }, put);
    }
    a.mean[r] = m;
    a.rstd[r] = s;
  }
}

/// Chunk k of the host backward's pass 1: dx of its rows, and the chunk's partial sums of
/// dy * xhat (dw) and dy (db).
template <class T>
TRAINKIT_FORCEINLINE void layer_norm_backward_chunk(const LayerNormArgs<T>& a, std::int64_t k) {
  const std::int64_t C = a.cols;
  const LayerNormChunk ch = layer_norm_chunk(a, k);
  float* pw = ch.pw;
  float* pb = ch.pb;
  for (std::int64_t r = ch.r0; r < ch.r1; ++r) {
    const T* x = a.x + r * C;
    const T* dy = a.dy + r * C;
    T* dx = a.dx == nullptr ? nullptr : a.dx + r * C;
    const float m = a.mean[r], s = a.rstd[r];
    // dxhat = dy * w; dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    const float sum_g = lane_sum(C, [&](std::int64_t c) { return load(dy[c]) * a.w[c]; });
    const float sum_gx =
        lane_sum(C, [&](std::int64_t c) { return load(dy[c]) * a.w[c] * ((load(x[c]) - m) * s); });
    lane_map(
        C, [&](std::int64_t c) { return pw[c] + load(dy[c]) * ((load(x[c]) - m) * s); },
        [&](std::int64_t c, float v) { pw[c] = v; });
    lane_map(
        C, [&](std::int64_t c) { return pb[c] + load(dy[c]); },
        [&](std::int64_t c, float v) { pb[c] = v; });
    const float mg = sum_g / static_cast<float>(C), mgx = sum_gx / static_cast<float>(C);
    if (dx == nullptr) continue;
    const auto dx_of = [&](std::int64_t c) {
      const float xhat = (load(x[c]) - m) * s;
      return s * (load(dy[c]) * a.w[c] - mg - xhat * mgx);
    };
    const auto put = [&](std::int64_t c, float v) { dx[c] = store<T>(v); };
    const T* res = a.residual == nullptr ? nullptr : a.residual + r * C;
    if (a.accumulate && res != nullptr) {
      lane_map(
          C, [&](std::int64_t c) { return (load(dx[c]) + load(res[c])) + dx_of(c); }, put);
    } else if (a.accumulate || res != nullptr) {
      const T* add = a.accumulate ? dx : res;
      lane_map(
          C, [&](std::int64_t c) { return load(add[c]) + dx_of(c); }, put);
    } else {
      lane_map(C, dx_of, put);
    }
  }
}

template <class T>
void layer_norm_forward(const exec::Host& host, const LayerNormArgs<T>& a) {
  for_rows(host, a.rows, 3 * a.cols, [&](std::int64_t r0, std::int64_t r1) TRAINKIT_INLINE_LAMBDA {
#if TRAINKIT_DETAIL_HOST_AVX2
    if constexpr (std::is_same_v<T, float>) {
      if (cpu_has_avx2()) {
        layer_norm_forward_rows_avx2(a, r0, r1);
        return;
      }
    }
#endif
    layer_norm_forward_rows(a, r0, r1);
  });
}

template <class T>
void layer_norm_backward(const exec::Host& host, const LayerNormArgs<T>& a) {
  const std::int64_t C = a.cols;
  const std::int64_t chunks = (a.rows + kLayerNormChunk - 1) / kLayerNormChunk;
  // Pass 1: dx per row, and per chunk the partial sums of dy * xhat (dw) and dy (db).
  for_rows(host, chunks, kLayerNormChunk * 4 * C,
           [&](std::int64_t k0, std::int64_t k1) TRAINKIT_INLINE_LAMBDA {
             for (std::int64_t k = k0; k < k1; ++k) {
#if TRAINKIT_DETAIL_HOST_AVX2
               if constexpr (std::is_same_v<T, float>) {
                 if (cpu_has_avx2()) {
                   layer_norm_backward_chunk_avx2(a, k);
                   continue;
                 }
               }
#endif
               layer_norm_backward_chunk(a, k);
             }
           });
  // Pass 2: add the chunk partials in chunk order, columns split among tasks.
  for_rows(host, C, 2 * chunks, [&](std::int64_t c0, std::int64_t c1) TRAINKIT_INLINE_LAMBDA {
    for (std::int64_t c = c0; c < c1; ++c) add_chunk_partials(a, chunks, c);
  });
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// One warp per row: the plain mean, then the corrected moments (row_moments; two passes over
/// the row, from cache).
template <class T>
__global__ void __launch_bounds__(kRowWarps * 32) layer_norm_forward_kernel(LayerNormArgs<T> a) {
  const std::int64_t row = warp_row();
  const int lane = warp_lane();
  if (row >= a.rows) return;
  const std::int64_t C = a.cols;
  const T* x = a.x + row * C;
  T* y = a.y + row * C;
  float sum = 0.0f;
  for (std::int64_t c = lane; c < C; c += 32) sum += load(x[c]);
  const float m0 = warp_sum(sum) / static_cast<float>(C);
  float sum_d = 0.0f, sum_d2 = 0.0f;
  for (std::int64_t c = lane; c < C; c += 32) {
    const float d = load(x[c]) - m0;
    sum_d += d;
    sum_d2 += d * d;
  }
  const RowMoments mo = row_moments(m0, warp_sum(sum_d), warp_sum(sum_d2), C);
  const float m = mo.mean;
  const float s = 1.0f / sqrtf(mo.var + a.eps);  // the host's 1 / sqrt (rsqrtf is 2 ulp off)
  for (std::int64_t c = lane; c < C; c += 32) {
    float v = (load(x[c]) - m) * s * a.w[c];
    if (a.b != nullptr) v += a.b[c];
    y[c] = store<T>(v);
  }
  if (lane == 0) {
    a.mean[row] = m;
    a.rstd[row] = s;
  }
}

/// One warp per row: dx.
template <class T>
__global__ void __launch_bounds__(kRowWarps * 32)
    layer_norm_backward_dx_kernel(LayerNormArgs<T> a) {
  const std::int64_t row = warp_row();
  const int lane = warp_lane();
  if (row >= a.rows) return;
  const std::int64_t C = a.cols;
  const T* x = a.x + row * C;
  const T* dy = a.dy + row * C;
  T* dx = a.dx + row * C;
  const float m = a.mean[row], s = a.rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (std::int64_t c = lane; c < C; c += 32) {
    const float gw = load(dy[c]) * a.w[c];
    sum_g += gw;
    sum_gx += gw * ((load(x[c]) - m) * s);  // dxhat * xhat, as the host
  }
  const float mg = warp_sum(sum_g) / static_cast<float>(C);
  const float mgx = warp_sum(sum_gx) / static_cast<float>(C);
  for (std::int64_t c = lane; c < C; c += 32) {
    const float xhat = (load(x[c]) - m) * s;
    float v = s * (load(dy[c]) * a.w[c] - mg - xhat * mgx);
    // The host's (old + residual) + v: float addition commutes, so the same bits.
    if (a.residual != nullptr) {
      v += a.accumulate ? load(dx[c]) + load(a.residual[row * C + c])
                        : load(a.residual[row * C + c]);
    } else if (a.accumulate) {
      v += load(dx[c]);
    }
    dx[c] = store<T>(v);
  }
}

/// One warp per row, the row held in registers (kPerLane elements a lane, C <= 32 * kPerLane):
/// every load of x, dy and dx is issued before the first use and nothing is read twice. The
/// arithmetic and its order are layer_norm_backward_dx_kernel's: the same bits.
template <class T, int kPerLane>
__global__ void __launch_bounds__(kRowWarps * 32)
    layer_norm_backward_dx_cached_kernel(LayerNormArgs<T> a) {
  const std::int64_t row = warp_row();
  const int lane = warp_lane();
  if (row >= a.rows) return;
  const std::int64_t C = a.cols;
  const T* __restrict__ x = a.x + row * C;
  const T* __restrict__ dy = a.dy + row * C;
  const float* __restrict__ w = a.w;
  T* __restrict__ dx = a.dx + row * C;
  const float m = a.mean[row], s = a.rstd[row];
  float xv[kPerLane], gw[kPerLane], old[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const std::int64_t c = lane + 32 * k;
    xv[k] = c < C ? load(x[c]) : 0.0f;
    gw[k] = c < C ? load(dy[c]) * w[c] : 0.0f;
    old[k] = c < C && a.accumulate ? load(dx[c]) : 0.0f;
    if (c < C && a.residual != nullptr)
      old[k] =
          a.accumulate ? old[k] + load(a.residual[row * C + c]) : load(a.residual[row * C + c]);
  }
  float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    if (lane + 32 * k < C) {
      sum_g += gw[k];
      sum_gx += gw[k] * ((xv[k] - m) * s);
    }
  }
  const float mg = warp_sum(sum_g) / static_cast<float>(C);
  const float mgx = warp_sum(sum_gx) / static_cast<float>(C);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const std::int64_t c = lane + 32 * k;
    if (c < C) {
      const float xhat = (xv[k] - m) * s;
      float v = s * (gw[k] - mg - xhat * mgx);
      if (a.accumulate || a.residual != nullptr) v += old[k];
      dx[c] = store<T>(v);
    }
  }
}

/// Thread per (column, chunk): partial sums of dy * xhat and dy over the chunk's rows in order,
/// with the host's operations (xhat = (x - mean) * rstd first). Block y takes chunks y,
/// y + gridDim.y, ... (layer_norm_partial_grid: the grid's y is at most 65535).
template <class T>
__global__ void __launch_bounds__(kLayerNormPartialThreads)
    layer_norm_backward_partial_kernel(LayerNormArgs<T> a, std::int64_t chunks) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t C = a.cols;
  if (c >= C) return;
  for (std::int64_t k = blockIdx.y; k < chunks; k += gridDim.y) {
    float w = 0.0f, b = 0.0f;
    const std::int64_t r1 = min(a.rows, (k + 1) * kLayerNormChunk);
    for (std::int64_t r = k * kLayerNormChunk; r < r1; ++r) {
      const float g = load(a.dy[r * C + c]);
      w += g * ((load(a.x[r * C + c]) - a.mean[r]) * a.rstd[r]);
      b += g;
    }
    a.partial[k * 2 * C + c] = w;
    a.partial[k * 2 * C + C + c] = b;
  }
}

/// Thread per column: chunk partials in chunk order, added to the gradients.
template <class T>
__global__ void layer_norm_backward_reduce_kernel(LayerNormArgs<T> a, std::int64_t chunks) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < a.cols) add_chunk_partials(a, chunks, c);
}

template <class T>
void layer_norm_forward(const exec::Cuda& exec, const LayerNormArgs<T>& a) {
  if (a.rows == 0) return;
  const unsigned blocks = exec::detail::grid_blocks_x(a.rows, kRowWarps, "nn::LayerNorm forward");
  layer_norm_forward_kernel<T><<<blocks, kRowWarps * 32, 0, exec.stream().get()>>>(a);
  exec::detail::check_kernel_launch("nn::LayerNorm forward", "rows ", a.rows, ", cols ", a.cols);
}

template <class T>
void layer_norm_backward(const exec::Cuda& exec, const LayerNormArgs<T>& a) {
  if (a.rows == 0) return;
  cudaStream_t stream = exec.stream().get();
  // The weight and bias sums first: they read x and dy, which dx may lie over (a block's
  // backward writes dx over x), and the dx kernel overwrites them. The host path reads a row's
  // x and dy before it writes that row's dx, so both orders give the same sums.
  const std::int64_t chunks = exec::detail::ceil_div(a.rows, kLayerNormChunk);
  const LayerNormPartialGrid g = layer_norm_partial_grid(a.rows, a.cols);
  layer_norm_backward_partial_kernel<T>
      <<<dim3(g.x, g.y), kLayerNormPartialThreads, 0, stream>>>(a, chunks);
  exec::detail::check_kernel_launch("nn::LayerNorm backward (weight and bias partial sums)",
                                    "rows ", a.rows, ", cols ", a.cols, ", grid ", g.x, " x ", g.y);
  layer_norm_backward_reduce_kernel<T><<<g.x, kLayerNormPartialThreads, 0, stream>>>(a, chunks);
  exec::detail::check_kernel_launch("nn::LayerNorm backward (weight and bias)", "rows ", a.rows,
                                    ", cols ", a.cols);
  if (a.dx != nullptr) {
    const unsigned blocks =
        exec::detail::grid_blocks_x(a.rows, kRowWarps, "nn::LayerNorm backward (dx)");
    constexpr unsigned threads = kRowWarps * 32;
    if (a.cols <= 32 * 8) {
      layer_norm_backward_dx_cached_kernel<T, 8><<<blocks, threads, 0, stream>>>(a);
    } else if (a.cols <= 32 * 16) {
      layer_norm_backward_dx_cached_kernel<T, 16><<<blocks, threads, 0, stream>>>(a);
    } else if (a.cols <= 32 * 32) {
      layer_norm_backward_dx_cached_kernel<T, 32><<<blocks, threads, 0, stream>>>(a);
    } else {
      layer_norm_backward_dx_kernel<T><<<blocks, threads, 0, stream>>>(a);
    }
    exec::detail::check_kernel_launch("nn::LayerNorm backward (dx)", "rows ", a.rows, ", cols ",
                                      a.cols);
  }
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#else
TRAINKIT_DETAIL_NN_CUDA_ONLY(layer_norm_forward)
TRAINKIT_DETAIL_NN_CUDA_ONLY(layer_norm_backward)
#endif
}  // namespace detail

/// Options of nn::LayerNorm.
struct LayerNormOptions {
  std::int64_t features = 0;  ///< C, the normalised (last) dimension
  float eps = 1e-5f;
  bool bias = true;
};

/// Layer normalisation over the last dimension: y = (x - mean) / sqrt(var + eps) * w + b, with
/// the biased variance (torch.nn.LayerNorm(C)). Parameters "<name>.weight" [C] (ones) and
/// "<name>.bias" [C] (zeros), always used in f32 (autocast runs layer_norm in f32; activations
/// may be bf16/f16 and are widened on load).
///
/// Shapes: x, y [N, C]. forward writes y and saves mean and rstd (= 1/std) of every row in the
/// caller's Context; backward reads x, dy, w and that context, adds to dw and db, and writes dx
/// (or adds it, Write::kAccumulate). An absent dx still accumulates dw, db. A pre-LN block's
/// residual stream passes its gradient as `residual`: dx = residual + dL/dx in the same pass,
/// instead of a copy of it into dx first.
template <Space S = Space::kHost>
class LayerNorm {
 public:
  /// What forward saves for backward: the f32 mean and 1/std of each row, in space S. Keep one
  /// per forward whose backward is still to come; refilling it reuses its memory.
  class Context : public detail::RowStatsContext<S> {
   public:
    const float* mean() const noexcept { return this->stats_.template data<float>(); }
    const float* rstd() const noexcept { return mean() + this->rows(); }

   private:
    friend class LayerNorm;
  };

  LayerNorm(ParamArena<S>& arena, const std::string& name, LayerNormOptions options)
      : arena_(&arena), features_(options.features), eps_(options.eps) {
    TRAINKIT_CHECK(features_ > 0, "nn::LayerNorm '", name, "': features must be positive");
    weight_ = arena.add(detail::child_name(name, "weight"), Shape{features_}, Init::ones());
    if (options.bias)
      bias_ = arena.add(detail::child_name(name, "bias"), Shape{features_}, Init::zeros());
  }

  ParamId weight() const noexcept { return weight_; }
  ParamId bias() const noexcept { return bias_; }
  std::int64_t features() const noexcept { return features_; }
  float eps() const noexcept { return eps_; }
  std::int64_t out_features(std::int64_t in) const {
    TRAINKIT_CHECK(in == features_, "nn::LayerNorm: input has ", in, " features, expected ",
                   features_);
    return in;
  }

  /// y = layer_norm(x); saves mean/rstd in ctx for backward.
  template <amp::Policy P = amp::Fp32, class E, class TX, class TY>
  void forward(const E& exec, Context& ctx, TensorView<TX, 2, S> x, TensorView<TY, 2, S> y) const {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TY>();
    detail::check_same_io("nn::LayerNorm::forward", x, y, features_);
    const std::int64_t rows = x.size(0);
    ctx.rec_.template set<T>(rows, features_);
    detail::LayerNormArgs<T> a =
        args<T>(x.data(), ctx.stats_.template get<float>(2 * rows + 1), rows);
    a.y = y.data();
    detail::layer_norm_forward(exec, a);
  }

  /// dw += sum dy * xhat, db += sum dy, dx = dL/dx (written or accumulated; absent: skipped),
  /// from the forward of x that filled ctx.
  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TG>
  void backward(const E& exec, const Context& ctx, TensorView<TX, 2, S> x, TensorView<TD, 2, S> dy,
                TensorView<TG, 2, S> dx, Write mode = Write::kOverwrite) {
    backward<P>(exec, ctx, x, dy, dx, TensorView<const std::remove_const_t<TX>, 2, S>(), mode);
  }

  /// The same, with dx = residual + dL/dx (kOverwrite) or dx += residual + dL/dx (kAccumulate):
  /// the gradient that reaches a pre-LN block's input through its skip connection, added in the
  /// pass that writes dx. residual [N, C] like dx (it may be absent).
  ///
  /// A dx that overlaps x, dy or residual only in part throws before dw and db are touched: a
  /// row of dx would overwrite another row still to be read. (dx may be x itself, as when
  /// TransformerBlock writes its input gradient over its input.)
  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TG, class TR>
  void backward(const E& exec, const Context& ctx, TensorView<TX, 2, S> x, TensorView<TD, 2, S> dy,
                TensorView<TG, 2, S> dx, TensorView<TR, 2, S> residual,
                Write mode = Write::kOverwrite) {
    using T = std::remove_const_t<TX>;
    constexpr const char* kWho = "nn::LayerNorm::backward";
    detail::check_call<P, E, S, TX, TD, TG, TR>();
    TRAINKIT_CHECK(x.size(1) == features_, kWho, ": x ", detail::shape_of(x), " must be [N, ",
                   features_, "]");
    detail::check_contiguous(kWho, "x", x);
    check_like_x(kWho, "dy", dy, x);
    if (!detail::absent(dx)) {
      check_like_x(kWho, "dx", dx, x);
      detail::check_not_partly_over(kWho, "dx", dx, "x", x);
      detail::check_not_partly_over(kWho, "dx", dx, "dy", dy);
    }
    if (!detail::absent(residual)) {
      TRAINKIT_CHECK(!detail::absent(dx), kWho, ": a residual gradient needs dx");
      check_like_x(kWho, "residual", residual, x);
      detail::check_not_partly_over(kWho, "dx", dx, "residual", residual);
    }
    ctx.rec_.template check<T>(kWho, x.size(0), x.size(1));
    const std::int64_t rows = x.size(0);
    const std::int64_t chunks = (rows + detail::kLayerNormChunk - 1) / detail::kLayerNormChunk;
    // The kernels' argument block is shared with forward; backward only reads the statistics.
    detail::LayerNormArgs<T> a = args<T>(x.data(), const_cast<float*>(ctx.mean()), rows);
    a.dy = dy.data();
    a.dx = detail::absent(dx) ? nullptr : dx.data();
    a.residual = detail::absent(residual) ? nullptr : residual.data();
    a.partial = partial_.template get<float>(chunks * 2 * features_);
    a.dw = arena_->grad_flat(weight_).data();
    a.db = bias_.valid() ? arena_->grad_flat(bias_).data() : nullptr;
    a.accumulate = mode == Write::kAccumulate;
    detail::layer_norm_backward(exec, a);
  }

 private:
  template <class T>
  detail::LayerNormArgs<T> args(const T* x, float* stats, std::int64_t rows) const {
    detail::LayerNormArgs<T> a{};
    a.x = x;
    a.w = arena_->params_data() + arena_->info(weight_).offset;
    a.b = bias_.valid() ? arena_->params_data() + arena_->info(bias_).offset : nullptr;
    a.mean = stats;
    a.rstd = stats + rows;
    a.rows = rows;
    a.cols = features_;
    a.eps = eps_;
    return a;
  }

  /// Throws unless v (dy, dx or residual) has x's shape and is contiguous.
  template <class V, class VX>
  static void check_like_x(const char* who, const char* name, const V& v, const VX& x) {
    TRAINKIT_CHECK(v.sizes() == x.sizes(), who, ": ", name, " ", detail::shape_of(v),
                   " differs from x ", detail::shape_of(x));
    detail::check_contiguous(who, name, v);
  }

  ParamArena<S>* arena_;
  std::int64_t features_;
  float eps_;
  ParamId weight_;
  ParamId bias_;
  detail::Bytes<S> partial_;  // backward scratch: per-chunk partial sums of dw, db
};

template <Space S>
LayerNorm(ParamArena<S>&, const std::string&, LayerNormOptions) -> LayerNorm<S>;

}  // namespace nn
TRAINKIT_NAMESPACE_END
