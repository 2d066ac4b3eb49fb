// SPDX-License-Identifier: MIT
// trainkit/nn/fused_attention.hpp: the GPU's fused causal attention core (flash-attention
// style). softmax(Q K^T * scale) V is computed by 64 x 64 tiles in shared memory with an online
// softmax, so the [B, H, T, T] scores and probabilities never exist in memory: forward saves one
// log-sum-exp per row, backward recomputes each tile's probabilities from it. Backward is two
// kernels, one per key tile (dK, dV) and one per query tile (dQ), so every gradient element is
// summed by one thread in a fixed order: no atomics, the same bits on every run.
//
// The block bodies are plain C++ written against a small block context (thread index, shared
// memory, barrier, reductions over a row's 8 threads). The CUDA kernels run them with the
// hardware's; the CPU tests run the same bodies under a host emulation of a block (one
// std::thread per CUDA thread), so the tiling, masking and online-softmax arithmetic of the GPU
// code is tested on every machine.
//
// Layout of a block (128 threads, kFusedThreads): thread t owns rows 4 * (t / 8) .. + 3 of the
// block's 64-row tile and columns t % 8 + 8 c of every 64-column (or D-column) tile, so the 8
// threads of a row group are neighbouring lanes of one warp. Tiles sit in shared memory
// transposed with a padded row of 65 floats (element (r, x) at [x * 65 + r]): reads along x by
// the 8 column threads, and along r, are both free of bank conflicts.
#pragma once

#include <cmath>
#include <cstdint>

#include "trainkit/config.hpp"
#include "trainkit/nn/layer.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

/// Arguments of the fused core. qkv [B, T, 3C] (Q | K | V per token, head h at columns h * hs of
/// each third), out [B, T, C]; lse [B, H, T]: log2 of each row's softmax denominator in the
/// scores' exp2 domain (forward writes it, backward reads it); delta [B, H, T]: backward's
/// scratch, rowsum(dO * O).
template <class T>
struct FusedAttentionArgs {
  const T* qkv = nullptr;
  T* out = nullptr;
  float* lse = nullptr;
  float* delta = nullptr;
  const T* dout = nullptr;
  T* dqkv = nullptr;
  std::int64_t B = 0, T_ = 0, C = 0, H = 0, hs = 0;
  float scale = 0.0f;  ///< 1 / sqrt(hs)
};

inline constexpr int kFusedTile = 64;            ///< rows and columns of a tile
inline constexpr int kFusedThreads = 128;        ///< threads of a block
inline constexpr int kFusedLd = kFusedTile + 1;  ///< padded row of a shared tile
inline constexpr float kFusedLog2e = 1.4426950408889634f;

/// The head sizes the fused core supports (hs <= 128); D, the tile depth, is hs rounded up to
/// 32, 64 or 128.
inline constexpr bool fused_attention_supports(std::int64_t hs) noexcept {
  return hs >= 1 && hs <= 128;
}

/// Floats of shared memory a block of depth D uses: four D x 65 tiles and one 64 x 65 tile
/// (forward uses three of the four).
template <int D>
inline constexpr int fused_attention_smem_floats() noexcept {
  return 4 * D * kFusedLd + kFusedTile * kFusedLd;
}

/// Rows [r0, r0 + 64) of one head of qkv (src: row r0, the head's first column, row stride ld;
/// `rows` of them valid) into dst[d * 65 + r] as f32, zero past `rows` and past hs.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE inline void fused_load_tile(const Ctx& ctx, const T* src, std::int64_t ld,
                                                 std::int64_t rows, std::int64_t hs, float* dst) {
  for (int x = ctx.tid(); x < kFusedTile * D; x += kFusedThreads) {
    const int r = x / D, d = x % D;
    dst[d * kFusedLd + r] = (r < rows && d < hs) ? load(src[r * ld + d]) : 0.0f;
  }
}

/// acc[r][c] += sum_x a[x * a_x + row0 + r] * b[x * b_x + (col0 + 8 c) * b_c] for x < inner: a
/// thread's 4 rows by N columns of a product of two shared tiles.
template <int N>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_mma(float (&acc)[4][N], const float* a,
                                                         int a_x, int row0, const float* b, int b_x,
                                                         int b_c, int col0, int inner) {
  const float* ap = a + row0;
  const float* bp = b + col0 * b_c;
  for (int x = 0; x < inner; ++x, ap += a_x, bp += b_x) {
    float av[4], bv[N];
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) av[r] = ap[r];
    TRAINKIT_UNROLL
    for (int c = 0; c < N; ++c) bv[c] = bp[8 * c * b_c];
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      TRAINKIT_UNROLL
      for (int c = 0; c < N; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
    }
  }
}

/// Where head h of batch item b starts in a [B, T, 3C] qkv (Q; K is + C, V + 2C) or a [B, T, C]
/// output.
template <class T>
TRAINKIT_HOST_DEVICE inline std::int64_t fused_qkv_offset(const FusedAttentionArgs<T>& a,
                                                          std::int64_t bh) {
  return (bh / a.H) * a.T_ * 3 * a.C + (bh % a.H) * a.hs;
}
template <class T>
TRAINKIT_HOST_DEVICE inline std::int64_t fused_out_offset(const FusedAttentionArgs<T>& a,
                                                          std::int64_t bh) {
  return (bh / a.H) * a.T_ * a.C + (bh % a.H) * a.hs;
}

/// Forward of query tile `q_tile` of head bh (= b * H + h): out and lse of its rows.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE void fused_attention_forward_block(Ctx& ctx, const FusedAttentionArgs<T>& a,
                                                        std::int64_t q_tile, std::int64_t bh) {
  constexpr int E = D / 8;  // output columns per thread
  const int tid = ctx.tid(), row0 = 4 * (tid / 8), cg = tid % 8;
  const std::int64_t Tn = a.T_, ld = 3 * a.C, i0 = q_tile * kFusedTile;
  const T* q = a.qkv + fused_qkv_offset(a, bh);
  float* qt = ctx.smem();
  float* kt = qt + D * kFusedLd;
  float* vt = kt + D * kFusedLd;
  float* pt = vt + D * kFusedLd;           // P, keys-major: (query i, key j) at [j * 65 + i]
  const float c2 = a.scale * kFusedLog2e;  // scores in the exp2 domain
  fused_load_tile<D>(ctx, q + i0 * ld, ld, Tn - i0, a.hs, qt);
  float m[4], l[4], o[4][E];
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    TRAINKIT_UNROLL
    for (int e = 0; e < E; ++e) o[r][e] = 0.0f;
  }
  for (std::int64_t kt_i = 0; kt_i <= q_tile; ++kt_i) {
    const std::int64_t j0 = kt_i * kFusedTile;
    ctx.sync();  // the previous tile's K, V and P are read
    fused_load_tile<D>(ctx, q + a.C + j0 * ld, ld, Tn - j0, a.hs, kt);
    fused_load_tile<D>(ctx, q + 2 * a.C + j0 * ld, ld, Tn - j0, a.hs, vt);
    ctx.sync();
    float s[4][8] = {};
    fused_mma<8>(s, qt, kFusedLd, row0, kt, kFusedLd, 1, cg, D);
    float mx[4], sum[4];
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      mx[r] = -INFINITY;
      TRAINKIT_UNROLL
      for (int c = 0; c < 8; ++c) {
        // Causal mask: key j0 + cg + 8c after query i0 + row0 + r (keys past T are after
        // every real query).
        s[r][c] = j0 + cg + 8 * c > i0 + row0 + r ? -INFINITY : s[r][c] * c2;
        mx[r] = fmaxf(mx[r], s[r][c]);
      }
    }
    ctx.row_max(mx);
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      // Key j0 <= every query of the tile, so the row has a finite maximum.
      const float m_new = fmaxf(m[r], mx[r]);
      const float corr = exp2f(m[r] - m_new);  // 0 on the first tile (m = -inf)
      sum[r] = 0.0f;
      TRAINKIT_UNROLL
      for (int c = 0; c < 8; ++c) {
        s[r][c] = exp2f(s[r][c] - m_new);
        sum[r] += s[r][c];
      }
      l[r] *= corr;
      TRAINKIT_UNROLL
      for (int e = 0; e < E; ++e) o[r][e] *= corr;
      m[r] = m_new;
    }
    ctx.row_sum(sum);
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      l[r] += sum[r];
      TRAINKIT_UNROLL
      for (int c = 0; c < 8; ++c) pt[(cg + 8 * c) * kFusedLd + row0 + r] = s[r][c];
    }
    ctx.sync();
    fused_mma<E>(o, pt, kFusedLd, row0, vt, 1, kFusedLd, cg, kFusedTile);
  }
  T* out = a.out + fused_out_offset(a, bh);
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    const std::int64_t i = i0 + row0 + r;
    if (i >= Tn) continue;
    const float inv = 1.0f / l[r];
    TRAINKIT_UNROLL
    for (int e = 0; e < E; ++e) {
      const int d = cg + 8 * e;
      if (d < a.hs) out[i * a.C + d] = store<T>(o[r][e] * inv);
    }
    if (cg == 0) a.lse[bh * Tn + i] = m[r] + log2f(l[r]);
  }
}

/// delta[row] = sum_d dO[row, d] * O[row, d] for row = bh * T + i (backward's first pass).
template <class T>
TRAINKIT_HOST_DEVICE inline void fused_attention_delta_row(const FusedAttentionArgs<T>& a,
                                                           std::int64_t row) {
  const std::int64_t bh = row / a.T_, i = row % a.T_;
  const std::int64_t at = fused_out_offset(a, bh) + i * a.C;
  float sum = 0.0f;
  for (std::int64_t d = 0; d < a.hs; ++d) sum += load(a.dout[at + d]) * load(a.out[at + d]);
  a.delta[row] = sum;
}

/// P and dS of one tile pair for a thread's 4 x 8 entries: rows `row_is_key` ? keys : queries.
/// s holds the raw dot products Q.K, dp the dO.V products; on return s = P, dp = dS (with
/// respect to the raw dot products, i.e. scaled by `scale`).
template <bool RowIsKey>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_tile_probs(
    float (&s)[4][8], float (&dp)[4][8], std::int64_t row_base, std::int64_t col_base,
    std::int64_t Tn, const float (&lse)[4][8], const float (&delta)[4][8], float c2, float scale) {
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    TRAINKIT_UNROLL
    for (int c = 0; c < 8; ++c) {
      const std::int64_t row = row_base + r, col = col_base + 8 * c;
      const std::int64_t qi = RowIsKey ? col : row, kj = RowIsKey ? row : col;
      const bool live = kj <= qi && qi < Tn;
      const float p = live ? exp2f(s[r][c] * c2 - lse[r][c]) : 0.0f;
      s[r][c] = p;
      dp[r][c] = p * (dp[r][c] - delta[r][c]) * scale;
    }
  }
}

/// Backward of key tile `k_tile` of head bh: dK and dV of its keys, summed over the query tiles
/// that see them (q_tile >= k_tile), written to dqkv's K and V columns.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE void fused_attention_backward_kv_block(Ctx& ctx,
                                                            const FusedAttentionArgs<T>& a,
                                                            std::int64_t k_tile, std::int64_t bh) {
  constexpr int E = D / 8;
  const int tid = ctx.tid(), row0 = 4 * (tid / 8), cg = tid % 8;
  const std::int64_t Tn = a.T_, ld = 3 * a.C, j0 = k_tile * kFusedTile;
  const std::int64_t tiles = (Tn + kFusedTile - 1) / kFusedTile;
  const T* q = a.qkv + fused_qkv_offset(a, bh);
  const T* dout = a.dout + fused_out_offset(a, bh);
  float* kt = ctx.smem();
  float* vt = kt + D * kFusedLd;
  float* qt = vt + D * kFusedLd;
  float* dot = qt + D * kFusedLd;
  float* ps = dot + D * kFusedLd;  // P then dS, queries-major: (key j, query i) at [i * 65 + j]
  const float c2 = a.scale * kFusedLog2e;
  fused_load_tile<D>(ctx, q + a.C + j0 * ld, ld, Tn - j0, a.hs, kt);
  fused_load_tile<D>(ctx, q + 2 * a.C + j0 * ld, ld, Tn - j0, a.hs, vt);
  float dk[4][E] = {}, dv[4][E] = {};
  for (std::int64_t qi = k_tile; qi < tiles; ++qi) {
    const std::int64_t i0 = qi * kFusedTile;
    ctx.sync();  // the previous tile's Q, dO and P / dS are read
    fused_load_tile<D>(ctx, q + i0 * ld, ld, Tn - i0, a.hs, qt);
    fused_load_tile<D>(ctx, dout + i0 * a.C, a.C, Tn - i0, a.hs, dot);
    float lse[4][8], delta[4][8];
    TRAINKIT_UNROLL
    for (int c = 0; c < 8; ++c) {
      const std::int64_t i = i0 + cg + 8 * c;
      const float li = i < Tn ? a.lse[bh * Tn + i] : 0.0f;
      const float di = i < Tn ? a.delta[bh * Tn + i] : 0.0f;
      TRAINKIT_UNROLL
      for (int r = 0; r < 4; ++r) {
        lse[r][c] = li;
        delta[r][c] = di;
      }
    }
    ctx.sync();
    float s[4][8] = {}, dp[4][8] = {};
    fused_mma<8>(s, kt, kFusedLd, row0, qt, kFusedLd, 1, cg, D);    // S^T = K Q^T
    fused_mma<8>(dp, vt, kFusedLd, row0, dot, kFusedLd, 1, cg, D);  // dP^T = V dO^T
    fused_tile_probs<true>(s, dp, j0 + row0, i0 + cg, Tn, lse, delta, c2, a.scale);
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      TRAINKIT_UNROLL
      for (int c = 0; c < 8; ++c) ps[(cg + 8 * c) * kFusedLd + row0 + r] = s[r][c];
    }
    ctx.sync();
    fused_mma<E>(dv, ps, kFusedLd, row0, dot, 1, kFusedLd, cg, kFusedTile);  // dV += P^T dO
    ctx.sync();
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      TRAINKIT_UNROLL
      for (int c = 0; c < 8; ++c) ps[(cg + 8 * c) * kFusedLd + row0 + r] = dp[r][c];
    }
    ctx.sync();
    fused_mma<E>(dk, ps, kFusedLd, row0, qt, 1, kFusedLd, cg, kFusedTile);  // dK += dS^T Q
  }
  T* dq = a.dqkv + fused_qkv_offset(a, bh);
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    const std::int64_t j = j0 + row0 + r;
    if (j >= Tn) continue;
    TRAINKIT_UNROLL
    for (int e = 0; e < E; ++e) {
      const int d = cg + 8 * e;
      if (d >= a.hs) continue;
      dq[j * ld + a.C + d] = store<T>(dk[r][e]);
      dq[j * ld + 2 * a.C + d] = store<T>(dv[r][e]);
    }
  }
}

/// Backward of query tile `q_tile` of head bh: dQ of its rows, summed over the key tiles they see
/// (k_tile <= q_tile), written to dqkv's Q columns.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE void fused_attention_backward_q_block(Ctx& ctx, const FusedAttentionArgs<T>& a,
                                                           std::int64_t q_tile, std::int64_t bh) {
  constexpr int E = D / 8;
  const int tid = ctx.tid(), row0 = 4 * (tid / 8), cg = tid % 8;
  const std::int64_t Tn = a.T_, ld = 3 * a.C, i0 = q_tile * kFusedTile;
  const T* q = a.qkv + fused_qkv_offset(a, bh);
  float* qt = ctx.smem();
  float* dot = qt + D * kFusedLd;
  float* kt = dot + D * kFusedLd;
  float* vt = kt + D * kFusedLd;
  float* dst = vt + D * kFusedLd;  // dS, keys-major: (query i, key j) at [j * 65 + i]
  const float c2 = a.scale * kFusedLog2e;
  fused_load_tile<D>(ctx, q + i0 * ld, ld, Tn - i0, a.hs, qt);
  fused_load_tile<D>(ctx, a.dout + fused_out_offset(a, bh) + i0 * a.C, a.C, Tn - i0, a.hs, dot);
  float lse[4][8], delta[4][8];
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    const std::int64_t i = i0 + row0 + r;
    const float li = i < Tn ? a.lse[bh * Tn + i] : 0.0f;
    const float di = i < Tn ? a.delta[bh * Tn + i] : 0.0f;
    TRAINKIT_UNROLL
    for (int c = 0; c < 8; ++c) {
      lse[r][c] = li;
      delta[r][c] = di;
    }
  }
  float dq[4][E] = {};
  for (std::int64_t kt_i = 0; kt_i <= q_tile; ++kt_i) {
    const std::int64_t j0 = kt_i * kFusedTile;
    ctx.sync();  // the previous tile's K, V and dS are read
    fused_load_tile<D>(ctx, q + a.C + j0 * ld, ld, Tn - j0, a.hs, kt);
    fused_load_tile<D>(ctx, q + 2 * a.C + j0 * ld, ld, Tn - j0, a.hs, vt);
    ctx.sync();
    float s[4][8] = {}, dp[4][8] = {};
    fused_mma<8>(s, qt, kFusedLd, row0, kt, kFusedLd, 1, cg, D);    // S = Q K^T
    fused_mma<8>(dp, dot, kFusedLd, row0, vt, kFusedLd, 1, cg, D);  // dP = dO V^T
    fused_tile_probs<false>(s, dp, i0 + row0, j0 + cg, Tn, lse, delta, c2, a.scale);
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      TRAINKIT_UNROLL
      for (int c = 0; c < 8; ++c) dst[(cg + 8 * c) * kFusedLd + row0 + r] = dp[r][c];
    }
    ctx.sync();
    fused_mma<E>(dq, dst, kFusedLd, row0, kt, 1, kFusedLd, cg, kFusedTile);  // dQ += dS K
  }
  T* dqkv = a.dqkv + fused_qkv_offset(a, bh);
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    const std::int64_t i = i0 + row0 + r;
    if (i >= Tn) continue;
    TRAINKIT_UNROLL
    for (int e = 0; e < E; ++e) {
      const int d = cg + 8 * e;
      if (d < a.hs) dqkv[i * ld + d] = store<T>(dq[r][e]);
    }
  }
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// The block context of the fused kernels on the GPU.
struct FusedBlockCuda {
  float* shared;
  __device__ int tid() const { return static_cast<int>(threadIdx.x); }
  __device__ float* smem() const { return shared; }
  __device__ void sync() const { __syncthreads(); }
  /// v[r] = max / sum of v[r] over the 8 threads of the caller's row group (lanes 8g .. 8g + 7).
  __device__ void row_max(float (&v)[4]) const {
    for (int o = 1; o < 8; o <<= 1)
      for (int r = 0; r < 4; ++r) v[r] = fmaxf(v[r], __shfl_xor_sync(0xffffffffU, v[r], o));
  }
  __device__ void row_sum(float (&v)[4]) const {
    for (int o = 1; o < 8; o <<= 1)
      for (int r = 0; r < 4; ++r) v[r] += __shfl_xor_sync(0xffffffffU, v[r], o);
  }
};

// Grid: x = b * H + h, y = the tile, heaviest (most tiles to visit) first.
template <int D, class T>
__global__ void __launch_bounds__(kFusedThreads)
    fused_attention_forward_kernel(FusedAttentionArgs<T> a) {
  extern __shared__ float fused_smem[];
  FusedBlockCuda ctx{fused_smem};
  fused_attention_forward_block<D>(ctx, a, static_cast<std::int64_t>(gridDim.y - 1 - blockIdx.y),
                                   static_cast<std::int64_t>(blockIdx.x));
}
template <int D, class T>
__global__ void __launch_bounds__(kFusedThreads)
    fused_attention_backward_kv_kernel(FusedAttentionArgs<T> a) {
  extern __shared__ float fused_smem[];
  FusedBlockCuda ctx{fused_smem};
  fused_attention_backward_kv_block<D>(ctx, a, static_cast<std::int64_t>(blockIdx.y),
                                       static_cast<std::int64_t>(blockIdx.x));
}
template <int D, class T>
__global__ void __launch_bounds__(kFusedThreads)
    fused_attention_backward_q_kernel(FusedAttentionArgs<T> a) {
  extern __shared__ float fused_smem[];
  FusedBlockCuda ctx{fused_smem};
  fused_attention_backward_q_block<D>(ctx, a, static_cast<std::int64_t>(gridDim.y - 1 - blockIdx.y),
                                      static_cast<std::int64_t>(blockIdx.x));
}
template <class T>
__global__ void fused_attention_delta_kernel(FusedAttentionArgs<T> a, std::int64_t rows) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row < rows) fused_attention_delta_row(a, row);
}

/// Launches `kernel` (one of the three block kernels of depth D) over every tile of every head,
/// with its shared memory; reports a launch failure with the kernel's name and shape.
template <int D, class T>
void fused_attention_launch(const exec::Cuda& exec, void (*kernel)(FusedAttentionArgs<T>),
                            const char* name, const FusedAttentionArgs<T>& a) {
  const std::int64_t heads = a.B * a.H, tiles = (a.T_ + kFusedTile - 1) / kFusedTile;
  TRAINKIT_CHECK(heads <= 0x7fffffff && tiles <= 65535, "nn::CausalSelfAttention: ", name,
                 " cannot launch for B * H = ", heads, " and T = ", a.T_,
                 " (at most 2^31 - 1 heads and 65535 tiles of 64 positions)");
  constexpr int bytes = fused_attention_smem_floats<D>() * static_cast<int>(sizeof(float));
  TRAINKIT_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<dim3(static_cast<unsigned>(heads), static_cast<unsigned>(tiles)), kFusedThreads, bytes,
           exec.stream().get()>>>(a);
  const cudaError_t err = cudaGetLastError();
  TRAINKIT_CHECK(err == cudaSuccess, "nn::CausalSelfAttention: ", name, " (B ", a.B, ", H ", a.H,
                 ", T ", a.T_, ", head size ", a.hs, ", ", bytes,
                 " bytes of shared memory) failed to launch: ", cudaGetErrorString(err));
}

template <int D, class T>
void fused_attention_forward_d(const exec::Cuda& exec, const FusedAttentionArgs<T>& a) {
  fused_attention_launch<D, T>(exec, &fused_attention_forward_kernel<D, T>,
                               "fused attention forward", a);
}
template <int D, class T>
void fused_attention_backward_d(const exec::Cuda& exec, const FusedAttentionArgs<T>& a) {
  const std::int64_t rows = a.B * a.H * a.T_;
  fused_attention_delta_kernel<T>
      <<<static_cast<unsigned>((rows + 255) / 256), 256, 0, exec.stream().get()>>>(a, rows);
  TRAINKIT_CUDA_CHECK(cudaGetLastError());
  fused_attention_launch<D, T>(exec, &fused_attention_backward_kv_kernel<D, T>,
                               "fused attention backward (dK, dV)", a);
  fused_attention_launch<D, T>(exec, &fused_attention_backward_q_kernel<D, T>,
                               "fused attention backward (dQ)", a);
}

/// out and lse from qkv (a.hs <= 128).
template <class T>
void fused_attention_forward(const exec::Cuda& exec, const FusedAttentionArgs<T>& a) {
  if (a.B * a.H * a.T_ == 0) return;
  if (a.hs <= 32) {
    fused_attention_forward_d<32>(exec, a);
  } else if (a.hs <= 64) {
    fused_attention_forward_d<64>(exec, a);
  } else {
    fused_attention_forward_d<128>(exec, a);
  }
}

/// dqkv (overwritten) from dout, qkv, out and lse; delta is scratch.
template <class T>
void fused_attention_backward(const exec::Cuda& exec, const FusedAttentionArgs<T>& a) {
  if (a.B * a.H * a.T_ == 0) return;
  if (a.hs <= 32) {
    fused_attention_backward_d<32>(exec, a);
  } else if (a.hs <= 64) {
    fused_attention_backward_d<64>(exec, a);
  } else {
    fused_attention_backward_d<128>(exec, a);
  }
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#endif

}  // namespace detail
}  // namespace nn
TRAINKIT_NAMESPACE_END
