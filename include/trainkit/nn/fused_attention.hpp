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
// threads of a row group are neighbouring lanes of one warp. Two kinds of bodies share that
// layout: for f32 activations each thread multiplies its entries itself from f32 tiles stored
// transposed with a padded row of 65 floats (element (r, x) at [x * 65 + r]: reads along x by the
// 8 column threads, and along r, are both free of bank conflicts); for bf16 / f16 activations
// the products run on the tensor cores (WMMA, a 16-row strip per warp) from 16-bit tiles, and the
// threads take their entries from the f32 results in shared memory.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/layer.hpp"

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
#include <mma.h>
#endif

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

/// A thread's 4 x 8 entries of a 64 x 64 tile, (row0 + r, cg + 8 c), into a shared tile of
/// element type U (rounded to it): row-major with rows ld apart, or (Transposed) column-major,
/// (row, column) at [column * ld + row].
template <bool Transposed = false, class U>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_put_entries(const float (&v)[4][8], U* tile,
                                                                 int ld, int row0, int cg) {
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    TRAINKIT_UNROLL
    for (int c = 0; c < 8; ++c) {
      const int at = Transposed ? (cg + 8 * c) * ld + row0 + r : (row0 + r) * ld + cg + 8 * c;
      tile[at] = store<U>(v[r][c]);
    }
  }
}

/// The same entries read from a row-major f32 shared tile.
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_get_entries(float (&v)[4][8],
                                                                 const float* tile, int ld,
                                                                 int row0, int cg) {
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    TRAINKIT_UNROLL
    for (int c = 0; c < 8; ++c) v[r][c] = tile[(row0 + r) * ld + cg + 8 * c];
  }
}

/// A thread's 4 x E results (rows row0 + r, head columns cg + 8 e) to dst (the tile's row 0 at
/// the head's first column, rows ld apart): rows below `rows`, columns below hs.
template <int E, class T>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_put_rows(const float (&v)[4][E], T* dst,
                                                              std::int64_t ld, std::int64_t rows,
                                                              std::int64_t hs, int row0, int cg) {
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    if (row0 + r >= rows) continue;
    TRAINKIT_UNROLL
    for (int e = 0; e < E; ++e) {
      const int d = cg + 8 * e;
      if (d < hs) dst[(row0 + r) * ld + d] = store<T>(v[r][e]);
    }
  }
}

/// One key tile of the online softmax for a thread's 4 x 8 scores: s holds the raw dot products
/// of queries q_base + r with keys k_base + 8 c; on return the masked probabilities exp2(c2 s -
/// m) against the rows' running maximum m, which moves up, l the denominator rescaled to it and
/// grown by the tile, and corr what the rows' earlier output must be multiplied by.
template <class Ctx>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_online_softmax(
    const Ctx& ctx, float (&s)[4][8], std::int64_t q_base, std::int64_t k_base, float c2,
    float (&m)[4], float (&l)[4], float (&corr)[4]) {
  float mx[4], sum[4];
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    mx[r] = -INFINITY;
    TRAINKIT_UNROLL
    for (int c = 0; c < 8; ++c) {
      // Causal mask: keys after the query (keys past T are after every real query).
      s[r][c] = k_base + 8 * c > q_base + r ? -INFINITY : s[r][c] * c2;
      mx[r] = fmaxf(mx[r], s[r][c]);
    }
  }
  ctx.row_max(mx);
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    // A tile's first key precedes all its queries, so every row has a finite maximum.
    const float m_new = fmaxf(m[r], mx[r]);
    corr[r] = exp2f(m[r] - m_new);  // 0 on the first tile (m = -inf)
    sum[r] = 0.0f;
    TRAINKIT_UNROLL
    for (int c = 0; c < 8; ++c) {
      s[r][c] = exp2f(s[r][c] - m_new);
      sum[r] += s[r][c];
    }
    m[r] = m_new;
  }
  ctx.row_sum(sum);
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) l[r] = l[r] * corr[r] + sum[r];
}

/// Forward's end for a thread's rows i0 + row0 + r: out[i, cg + 8 e] = o(r, e) / l (columns below
/// hs, rows below T), and lse = m + log2(l) from the row group's first thread.
template <int E, class T, class O>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_write_output(const FusedAttentionArgs<T>& a,
                                                                  std::int64_t bh, std::int64_t i0,
                                                                  int row0, int cg,
                                                                  const float (&m)[4],
                                                                  const float (&l)[4], const O& o) {
  T* out = a.out + fused_out_offset(a, bh);
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    const std::int64_t i = i0 + row0 + r;
    if (i >= a.T_) continue;
    const float inv = 1.0f / l[r];
    TRAINKIT_UNROLL
    for (int e = 0; e < E; ++e) {
      const int d = cg + 8 * e;
      if (d < a.hs) out[i * a.C + d] = store<T>(o(r, e) * inv);
    }
    if (cg == 0) a.lse[bh * a.T_ + i] = m[r] + log2f(l[r]);
  }
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
    float corr[4];
    fused_online_softmax(ctx, s, i0 + row0, j0 + cg, c2, m, l, corr);
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      TRAINKIT_UNROLL
      for (int e = 0; e < E; ++e) o[r][e] *= corr[r];
    }
    fused_put_entries<true>(s, pt, kFusedLd, row0, cg);
    ctx.sync();
    fused_mma<E>(o, pt, kFusedLd, row0, vt, 1, kFusedLd, cg, kFusedTile);
  }
  fused_write_output<E>(a, bh, i0, row0, cg, m, l, [&](int r, int e) { return o[r][e]; });
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

/// lse and delta of a thread's queries: its rows row_base + r (r < 4) or, for RowIsKey, its
/// columns col_base + 8 c (c < 8), at [r] or [c]; 0 for queries past T.
template <bool RowIsKey, class T>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_query_stats(
    const FusedAttentionArgs<T>& a, std::int64_t bh, std::int64_t row_base, std::int64_t col_base,
    float (&lse)[8], float (&delta)[8]) {
  TRAINKIT_UNROLL
  for (int q = 0; q < (RowIsKey ? 8 : 4); ++q) {
    const std::int64_t i = RowIsKey ? col_base + 8 * q : row_base + q;
    lse[q] = i < a.T_ ? a.lse[bh * a.T_ + i] : 0.0f;
    delta[q] = i < a.T_ ? a.delta[bh * a.T_ + i] : 0.0f;
  }
}

/// P and dS of one tile pair for a thread's 4 x 8 entries, whose rows are keys (RowIsKey) or
/// queries. s holds the raw dot products Q.K, dp the dO.V products; on return s = P, dp = dS (with
/// respect to the raw dot products, i.e. scaled by `scale`).
template <bool RowIsKey>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_tile_probs(
    float (&s)[4][8], float (&dp)[4][8], std::int64_t row_base, std::int64_t col_base,
    std::int64_t Tn, const float (&lse)[8], const float (&delta)[8], float c2, float scale) {
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    TRAINKIT_UNROLL
    for (int c = 0; c < 8; ++c) {
      const std::int64_t row = row_base + r, col = col_base + 8 * c;
      const std::int64_t qi = RowIsKey ? col : row, kj = RowIsKey ? row : col;
      const bool live = kj <= qi && qi < Tn;
      const int q = RowIsKey ? c : r;  // where this entry's query keeps its statistics
      const float p = live ? exp2f(s[r][c] * c2 - lse[q]) : 0.0f;
      s[r][c] = p;
      dp[r][c] = p * (dp[r][c] - delta[q]) * scale;
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
    float lse[8], delta[8];
    fused_query_stats<true>(a, bh, 0, i0 + cg, lse, delta);
    ctx.sync();
    float s[4][8] = {}, dp[4][8] = {};
    fused_mma<8>(s, kt, kFusedLd, row0, qt, kFusedLd, 1, cg, D);    // S^T = K Q^T
    fused_mma<8>(dp, vt, kFusedLd, row0, dot, kFusedLd, 1, cg, D);  // dP^T = V dO^T
    fused_tile_probs<true>(s, dp, j0 + row0, i0 + cg, Tn, lse, delta, c2, a.scale);
    fused_put_entries<true>(s, ps, kFusedLd, row0, cg);
    ctx.sync();
    fused_mma<E>(dv, ps, kFusedLd, row0, dot, 1, kFusedLd, cg, kFusedTile);  // dV += P^T dO
    ctx.sync();
    fused_put_entries<true>(dp, ps, kFusedLd, row0, cg);
    ctx.sync();
    fused_mma<E>(dk, ps, kFusedLd, row0, qt, 1, kFusedLd, cg, kFusedTile);  // dK += dS^T Q
  }
  T* dk_rows = a.dqkv + fused_qkv_offset(a, bh) + j0 * ld + a.C;
  fused_put_rows<E>(dk, dk_rows, ld, Tn - j0, a.hs, row0, cg);
  fused_put_rows<E>(dv, dk_rows + a.C, ld, Tn - j0, a.hs, row0, cg);
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
  float lse[8], delta[8];
  fused_query_stats<false>(a, bh, i0 + row0, 0, lse, delta);
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
    fused_put_entries<true>(dp, dst, kFusedLd, row0, cg);
    ctx.sync();
    fused_mma<E>(dq, dst, kFusedLd, row0, kt, 1, kFusedLd, cg, kFusedTile);  // dQ += dS K
  }
  fused_put_rows<E>(dq, a.dqkv + fused_qkv_offset(a, bh) + i0 * ld, ld, Tn - i0, a.hs, row0, cg);
}

// ---- Tensor-core block bodies (16-bit activations) ----------------------------------------------
// The same tiles, with the products on the tensor cores: each warp computes a 16-row strip of a
// product from 16-bit tiles in shared memory (Ctx::Strip<N>: 16 x N f32 accumulators, WMMA
// fragments on the GPU), while the softmax, masking and rescaling stay on each thread's 4 x 8
// entries in f32, through shared memory. Q, K, V and dO tiles keep the activation type (rows of
// D + 8 elements), scores f32 (rows of 68), probabilities and dS rounded to the activation type
// (rows of 72) before their products, as the materialised core rounds P.

template <int D>
struct FusedTcLayout {
  static constexpr int kLt = D + 8;                     // 16-bit Q / K / V / dO tile row (elements)
  static constexpr int kLs = kFusedTile + 4;            // f32 score row
  static constexpr int kLp = kFusedTile + 8;            // 16-bit P / dS row
  static constexpr int kLo = D + 4;                     // f32 output row
  static constexpr int kTile16 = kFusedTile * kLt * 2;  // bytes of a 16-bit tile
  static constexpr int kScores = kFusedTile * kLs * 4;  // bytes of an f32 score tile
  static constexpr int kProbs = kFusedTile * kLp * 2;   // bytes of a 16-bit P tile
  static constexpr int kOut = kFusedTile * kLo * 4;     // bytes of an f32 D-wide output tile
  /// Shared bytes of the forward block (Q, K, V, S, P, O) and of either backward block (four
  /// 16-bit tiles, two score tiles, two P / dS tiles). Every piece is a multiple of 32 bytes, so
  /// every strip the products read or write starts 32-byte aligned.
  static constexpr int kForwardBytes = 3 * kTile16 + kScores + kProbs + kOut;
  static constexpr int kBackwardBytes = 4 * kTile16 + 2 * kScores + 2 * kProbs;
  static_assert(kTile16 % 32 == 0 && kScores % 32 == 0 && kProbs % 32 == 0 && kOut % 32 == 0 &&
                    kOut <= 2 * kScores,
                "fused attention: shared tiles must stay 32-byte aligned, and an f32 D-wide "
                "tile must fit the two score tiles");
};

/// Consecutive pieces of a block's shared memory, in the order they are taken.
struct FusedSmemCarver {
  char* at;
  template <class U>
  TRAINKIT_HOST_DEVICE U* take(int bytes) {
    U* piece = reinterpret_cast<U*>(at);
    at += bytes;
    return piece;
  }
};

/// 16 bytes from src to dst, both 16-byte aligned (one vector load and store on the GPU).
TRAINKIT_HOST_DEVICE inline void fused_copy16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__)
  *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#else
  std::memcpy(dst, src, 16);
#endif
}

/// Rows [r0, r0 + 64) of one head (src: row r0, row stride ld, `rows` valid) into dst[r * (D + 8)
/// + d] in the activation type, zero past `rows` and past hs. Eight elements per thread and step
/// when the head's rows allow (hs and ld multiples of 8, src 16-byte aligned), else one.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE inline void fused_tc_load_tile(const Ctx& ctx, const T* src, std::int64_t ld,
                                                    std::int64_t rows, std::int64_t hs, T* dst) {
  static_assert(sizeof(T) == 2, "the tensor-core tiles hold 16-bit elements");
  constexpr int kLt = FusedTcLayout<D>::kLt;
  if (hs % 8 == 0 && ld % 8 == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0) {
    constexpr int kChunks = D / 8;
    for (int x = ctx.tid(); x < kFusedTile * kChunks; x += kFusedThreads) {
      const int r = x / kChunks, d = (x % kChunks) * 8;
      T* to = dst + r * kLt + d;
      if (r < rows && d < hs) {
        fused_copy16(to, src + r * ld + d);
      } else {
        for (int e = 0; e < 8; ++e) to[e] = store<T>(0.0f);
      }
    }
    return;
  }
  for (int x = ctx.tid(); x < kFusedTile * D; x += kFusedThreads) {
    const int r = x / D, d = x % D;
    dst[r * kLt + d] = (r < rows && d < hs) ? src[r * ld + d] : store<T>(0.0f);
  }
}

/// Forward of query tile `q_tile` of head bh on the tensor cores: out and lse of its rows.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE void fused_tc_forward_block(Ctx& ctx, const FusedAttentionArgs<T>& a,
                                                 std::int64_t q_tile, std::int64_t bh) {
  using L = FusedTcLayout<D>;
  constexpr int E = D / 8;
  const int tid = ctx.tid(), w = tid / 32, row0 = 4 * (tid / 8), cg = tid % 8;
  const std::int64_t Tn = a.T_, ld = 3 * a.C, i0 = q_tile * kFusedTile;
  const T* q = a.qkv + fused_qkv_offset(a, bh);
  FusedSmemCarver smem{reinterpret_cast<char*>(ctx.smem())};
  T* qs = smem.take<T>(L::kTile16);
  T* ks = smem.take<T>(L::kTile16);
  T* vs = smem.take<T>(L::kTile16);
  float* ss = smem.take<float>(L::kScores);
  T* ps = smem.take<T>(L::kProbs);
  float* os = smem.take<float>(L::kOut);
  const float c2 = a.scale * kFusedLog2e;
  fused_tc_load_tile<D>(ctx, q + i0 * ld, ld, Tn - i0, a.hs, qs);
  for (int x = tid; x < kFusedTile * L::kLo; x += kFusedThreads) os[x] = 0.0f;
  float m[4], l[4];
  TRAINKIT_UNROLL
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  for (std::int64_t kt_i = 0; kt_i <= q_tile; ++kt_i) {
    const std::int64_t j0 = kt_i * kFusedTile;
    ctx.sync();  // the previous tile's K, V, S and P are read, O written
    fused_tc_load_tile<D>(ctx, q + a.C + j0 * ld, ld, Tn - j0, a.hs, ks);
    fused_tc_load_tile<D>(ctx, q + 2 * a.C + j0 * ld, ld, Tn - j0, a.hs, vs);
    ctx.sync();
    {
      typename Ctx::template Strip<kFusedTile> s;  // S = Q K^T, this warp's 16 rows
      ctx.strip_zero(s);
      ctx.template strip_mma<D, true>(s, qs + 16 * w * L::kLt, L::kLt, ks, L::kLt);
      ctx.strip_store(s, ss + 16 * w * L::kLs, L::kLs);
    }
    ctx.sync();
    float sv[4][8], corr[4];
    fused_get_entries(sv, ss, L::kLs, row0, cg);
    fused_online_softmax(ctx, sv, i0 + row0, j0 + cg, c2, m, l, corr);
    fused_put_entries(sv, ps, L::kLp, row0, cg);
    TRAINKIT_UNROLL
    for (int r = 0; r < 4; ++r) {
      TRAINKIT_UNROLL
      for (int e = 0; e < E; ++e) os[(row0 + r) * L::kLo + cg + 8 * e] *= corr[r];
    }
    ctx.sync();
    {
      typename Ctx::template Strip<D> o;  // O = O * corr + P V, this warp's 16 rows
      ctx.strip_load(o, os + 16 * w * L::kLo, L::kLo);
      ctx.template strip_mma<kFusedTile, false>(o, ps + 16 * w * L::kLp, L::kLp, vs, L::kLt);
      ctx.strip_store(o, os + 16 * w * L::kLo, L::kLo);
    }
  }
  ctx.sync();
  fused_write_output<E>(a, bh, i0, row0, cg, m, l,
                        [&](int r, int e) { return os[(row0 + r) * L::kLo + cg + 8 * e]; });
}

/// Writes a block's 64 x D f32 result (gathered in `scratch`, rows of D + 4) to rows [r0, r0 +
/// 64) of dst (row stride ld), those below Tn and columns below hs.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE inline void fused_tc_write_rows(const Ctx& ctx, const float* scratch, T* dst,
                                                     std::int64_t ld, std::int64_t rows,
                                                     std::int64_t hs) {
  constexpr int kLo = FusedTcLayout<D>::kLo;
  for (int x = ctx.tid(); x < kFusedTile * D; x += kFusedThreads) {
    const int r = x / D, d = x % D;
    if (r < rows && d < hs) dst[r * ld + d] = store<T>(scratch[r * kLo + d]);
  }
}

/// S = X Y^T and dP = U V^T for four 64-row 16-bit tiles (each warp its 16-row strips, through
/// the f32 score tiles ss and dps), then the calling thread's 4 x 8 entries of both: backward's
/// two products of a tile pair.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE inline void fused_tc_score_pair(Ctx& ctx, const T* x, const T* y, const T* u,
                                                     const T* v, float* ss, float* dps,
                                                     float (&s)[4][8], float (&dp)[4][8]) {
  using L = FusedTcLayout<D>;
  const int tid = ctx.tid(), w = tid / 32, row0 = 4 * (tid / 8), cg = tid % 8;
  {
    typename Ctx::template Strip<kFusedTile> st;
    ctx.strip_zero(st);
    ctx.template strip_mma<D, true>(st, x + 16 * w * L::kLt, L::kLt, y, L::kLt);
    ctx.strip_store(st, ss + 16 * w * L::kLs, L::kLs);
    ctx.strip_zero(st);
    ctx.template strip_mma<D, true>(st, u + 16 * w * L::kLt, L::kLt, v, L::kLt);
    ctx.strip_store(st, dps + 16 * w * L::kLs, L::kLs);
  }
  ctx.sync();
  fused_get_entries(s, ss, L::kLs, row0, cg);
  fused_get_entries(dp, dps, L::kLs, row0, cg);
}

/// Backward of key tile `k_tile` of head bh on the tensor cores: dK and dV of its keys.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE void fused_tc_backward_kv_block(Ctx& ctx, const FusedAttentionArgs<T>& a,
                                                     std::int64_t k_tile, std::int64_t bh) {
  using L = FusedTcLayout<D>;
  const int tid = ctx.tid(), w = tid / 32, row0 = 4 * (tid / 8), cg = tid % 8;
  const std::int64_t Tn = a.T_, ld = 3 * a.C, j0 = k_tile * kFusedTile;
  const std::int64_t tiles = (Tn + kFusedTile - 1) / kFusedTile;
  const T* q = a.qkv + fused_qkv_offset(a, bh);
  const T* dout = a.dout + fused_out_offset(a, bh);
  FusedSmemCarver smem{reinterpret_cast<char*>(ctx.smem())};
  T* ks = smem.take<T>(L::kTile16);
  T* vs = smem.take<T>(L::kTile16);
  T* qs = smem.take<T>(L::kTile16);
  T* dos = smem.take<T>(L::kTile16);
  float* ss = smem.take<float>(L::kScores);  // S^T, then the results
  float* dps = smem.take<float>(L::kScores);
  T* pt = smem.take<T>(L::kProbs);
  T* dst = smem.take<T>(L::kProbs);
  const float c2 = a.scale * kFusedLog2e;
  fused_tc_load_tile<D>(ctx, q + a.C + j0 * ld, ld, Tn - j0, a.hs, ks);
  fused_tc_load_tile<D>(ctx, q + 2 * a.C + j0 * ld, ld, Tn - j0, a.hs, vs);
  typename Ctx::template Strip<D> dk, dv;
  ctx.strip_zero(dk);
  ctx.strip_zero(dv);
  for (std::int64_t qi = k_tile; qi < tiles; ++qi) {
    const std::int64_t i0 = qi * kFusedTile;
    ctx.sync();  // the previous tile's Q, dO, P and dS are read
    fused_tc_load_tile<D>(ctx, q + i0 * ld, ld, Tn - i0, a.hs, qs);
    fused_tc_load_tile<D>(ctx, dout + i0 * a.C, a.C, Tn - i0, a.hs, dos);
    ctx.sync();
    float lse[8], delta[8], s[4][8], dp[4][8];
    // S^T = K Q^T and dP^T = V dO^T: rows are this block's keys.
    fused_tc_score_pair<D>(ctx, ks, qs, vs, dos, ss, dps, s, dp);
    fused_query_stats<true>(a, bh, 0, i0 + cg, lse, delta);
    fused_tile_probs<true>(s, dp, j0 + row0, i0 + cg, Tn, lse, delta, c2, a.scale);
    fused_put_entries(s, pt, L::kLp, row0, cg);
    fused_put_entries(dp, dst, L::kLp, row0, cg);
    ctx.sync();
    ctx.template strip_mma<kFusedTile, false>(dv, pt + 16 * w * L::kLp, L::kLp, dos, L::kLt);
    ctx.template strip_mma<kFusedTile, false>(dk, dst + 16 * w * L::kLp, L::kLp, qs, L::kLt);
  }
  ctx.sync();  // the score tiles are free: gather dK there, write it, then dV
  T* dq = a.dqkv + fused_qkv_offset(a, bh) + j0 * ld;
  ctx.strip_store(dk, ss + 16 * w * L::kLo, L::kLo);
  ctx.sync();
  fused_tc_write_rows<D>(ctx, ss, dq + a.C, ld, Tn - j0, a.hs);
  ctx.sync();
  ctx.strip_store(dv, ss + 16 * w * L::kLo, L::kLo);
  ctx.sync();
  fused_tc_write_rows<D>(ctx, ss, dq + 2 * a.C, ld, Tn - j0, a.hs);
}

/// Backward of query tile `q_tile` of head bh on the tensor cores: dQ of its rows.
template <int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE void fused_tc_backward_q_block(Ctx& ctx, const FusedAttentionArgs<T>& a,
                                                    std::int64_t q_tile, std::int64_t bh) {
  using L = FusedTcLayout<D>;
  const int tid = ctx.tid(), w = tid / 32, row0 = 4 * (tid / 8), cg = tid % 8;
  const std::int64_t Tn = a.T_, ld = 3 * a.C, i0 = q_tile * kFusedTile;
  const T* q = a.qkv + fused_qkv_offset(a, bh);
  FusedSmemCarver smem{reinterpret_cast<char*>(ctx.smem())};
  T* qs = smem.take<T>(L::kTile16);
  T* dos = smem.take<T>(L::kTile16);
  T* ks = smem.take<T>(L::kTile16);
  T* vs = smem.take<T>(L::kTile16);
  float* ss = smem.take<float>(L::kScores);  // S, then the result
  float* dps = smem.take<float>(L::kScores);
  T* dsq = smem.take<T>(L::kProbs);
  const float c2 = a.scale * kFusedLog2e;
  fused_tc_load_tile<D>(ctx, q + i0 * ld, ld, Tn - i0, a.hs, qs);
  fused_tc_load_tile<D>(ctx, a.dout + fused_out_offset(a, bh) + i0 * a.C, a.C, Tn - i0, a.hs, dos);
  float lse[8], delta[8];
  fused_query_stats<false>(a, bh, i0 + row0, 0, lse, delta);
  typename Ctx::template Strip<D> dq;
  ctx.strip_zero(dq);
  for (std::int64_t kt_i = 0; kt_i <= q_tile; ++kt_i) {
    const std::int64_t j0 = kt_i * kFusedTile;
    ctx.sync();  // the previous tile's K, V and dS are read
    fused_tc_load_tile<D>(ctx, q + a.C + j0 * ld, ld, Tn - j0, a.hs, ks);
    fused_tc_load_tile<D>(ctx, q + 2 * a.C + j0 * ld, ld, Tn - j0, a.hs, vs);
    ctx.sync();
    float s[4][8], dp[4][8];
    // S = Q K^T and dP = dO V^T: rows are this block's queries.
    fused_tc_score_pair<D>(ctx, qs, ks, dos, vs, ss, dps, s, dp);
    fused_tile_probs<false>(s, dp, i0 + row0, j0 + cg, Tn, lse, delta, c2, a.scale);
    fused_put_entries(dp, dsq, L::kLp, row0, cg);
    ctx.sync();
    ctx.template strip_mma<kFusedTile, false>(dq, dsq + 16 * w * L::kLp, L::kLp, ks, L::kLt);
  }
  ctx.sync();
  ctx.strip_store(dq, ss + 16 * w * L::kLo, L::kLo);
  ctx.sync();
  fused_tc_write_rows<D>(ctx, ss, a.dqkv + fused_qkv_offset(a, bh) + i0 * ld, ld, Tn - i0, a.hs);
}

// ---- The three passes -----------------------------------------------------------------------

/// The fused core's block kernels: forward (a query tile), backward dK / dV (a key tile) and
/// backward dQ (a query tile).
enum class FusedPass { kForward, kBackwardKv, kBackwardQ };

/// The tensor-core bodies for 16-bit activations, the f32 ones otherwise.
template <class T>
inline constexpr bool fused_uses_tensor_cores_v = sizeof(T) == 2;

/// Shared memory bytes of a block of pass `Pass`, depth D, tensor-core bodies or not.
template <FusedPass Pass, bool TensorCores, int D>
inline constexpr int fused_attention_smem_bytes() noexcept {
  if constexpr (TensorCores) {
    return Pass == FusedPass::kForward ? FusedTcLayout<D>::kForwardBytes
                                       : FusedTcLayout<D>::kBackwardBytes;
  } else {
    return fused_attention_smem_floats<D>() * static_cast<int>(sizeof(float));
  }
}

/// Block `tile` of head bh of pass `Pass`: what a kernel's block runs (and the host emulation's).
template <FusedPass Pass, bool TensorCores, int D, class T, class Ctx>
TRAINKIT_HOST_DEVICE inline void fused_attention_block(Ctx& ctx, const FusedAttentionArgs<T>& a,
                                                       std::int64_t tile, std::int64_t bh) {
  if constexpr (TensorCores) {
    if constexpr (Pass == FusedPass::kForward) {
      fused_tc_forward_block<D>(ctx, a, tile, bh);
    } else if constexpr (Pass == FusedPass::kBackwardKv) {
      fused_tc_backward_kv_block<D>(ctx, a, tile, bh);
    } else {
      fused_tc_backward_q_block<D>(ctx, a, tile, bh);
    }
  } else {
    if constexpr (Pass == FusedPass::kForward) {
      fused_attention_forward_block<D>(ctx, a, tile, bh);
    } else if constexpr (Pass == FusedPass::kBackwardKv) {
      fused_attention_backward_kv_block<D>(ctx, a, tile, bh);
    } else {
      fused_attention_backward_q_block<D>(ctx, a, tile, bh);
    }
  }
}

/// Calls f.template operator()<D>() with D the tile depth of head size hs (32, 64 or 128).
template <class F>
inline void fused_with_depth(std::int64_t hs, const F& f) {
  if (hs <= 32) {
    f.template operator()<32>();
  } else if (hs <= 64) {
    f.template operator()<64>();
  } else {
    f.template operator()<128>();
  }
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

/// The CUDA element type WMMA takes for an activation type (same layout).
template <class T>
struct FusedWmmaElem;
template <>
struct FusedWmmaElem<bf16> {
  using type = __nv_bfloat16;
};
template <>
struct FusedWmmaElem<f16> {
  using type = __half;
};

/// The block context of the fused kernels on the GPU.
struct FusedBlockCuda {
  /// A warp's 16 x N f32 accumulators: N / 16 WMMA fragments.
  template <int N>
  struct Strip {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f[N / 16];
  };

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
  template <int N>
  __device__ void strip_zero(Strip<N>& s) const {
    for (int j = 0; j < N / 16; ++j) nvcuda::wmma::fill_fragment(s.f[j], 0.0f);
  }
  /// s += A B: A the warp's 16 x K rows (row-major, row stride lda), B K x N, element (k, n) at
  /// b[n * ldb + k] (BCol) or b[k * ldb + n]; 16-bit operands, 32-byte aligned strips.
  template <int K, bool BCol, int N, class T>
  __device__ void strip_mma(Strip<N>& s, const T* a, int lda, const T* b, int ldb) const {
    namespace wmma = nvcuda::wmma;
    using W = typename FusedWmmaElem<T>::type;
    using LayoutB = std::conditional_t<BCol, wmma::col_major, wmma::row_major>;
    const W* aw = reinterpret_cast<const W*>(a);
    const W* bw = reinterpret_cast<const W*>(b);
    for (int k = 0; k < K; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> fa;
      wmma::load_matrix_sync(fa, aw + k, static_cast<unsigned>(lda));
      for (int j = 0; j < N / 16; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, LayoutB> fb;
        wmma::load_matrix_sync(fb, BCol ? bw + j * 16 * ldb + k : bw + k * ldb + j * 16,
                               static_cast<unsigned>(ldb));
        wmma::mma_sync(s.f[j], fa, fb, s.f[j]);
      }
    }
  }
  /// The strip to / from f32 rows (row stride ldc, 32-byte aligned).
  template <int N>
  __device__ void strip_store(const Strip<N>& s, float* c, int ldc) const {
    for (int j = 0; j < N / 16; ++j)
      nvcuda::wmma::store_matrix_sync(c + 16 * j, s.f[j], static_cast<unsigned>(ldc),
                                      nvcuda::wmma::mem_row_major);
  }
  template <int N>
  __device__ void strip_load(Strip<N>& s, const float* c, int ldc) const {
    for (int j = 0; j < N / 16; ++j)
      nvcuda::wmma::load_matrix_sync(s.f[j], c + 16 * j, static_cast<unsigned>(ldc),
                                     nvcuda::wmma::mem_row_major);
  }
};

/// The block kernel of a pass. Grid: x = b * H + h, y = the tile, the blocks with the most tiles
/// to visit first (the last query tiles; for dK / dV the first key tiles).
template <FusedPass Pass, bool TensorCores, int D, class T>
__global__ void __launch_bounds__(kFusedThreads) fused_attention_kernel(FusedAttentionArgs<T> a) {
  extern __shared__ __align__(128) float fused_smem[];
  FusedBlockCuda ctx{fused_smem};
  const std::int64_t tile =
      Pass == FusedPass::kBackwardKv ? blockIdx.y : gridDim.y - 1 - blockIdx.y;
  fused_attention_block<Pass, TensorCores, D>(ctx, a, tile, static_cast<std::int64_t>(blockIdx.x));
}
template <class T>
__global__ void __launch_bounds__(256)
    fused_attention_delta_kernel(FusedAttentionArgs<T> a, std::int64_t rows) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row < rows) fused_attention_delta_row(a, row);
}

/// Launches pass `Pass` over every tile of every head, with its shared memory; reports a launch
/// failure with the pass and the shape.
template <FusedPass Pass, int D, class T>
void fused_attention_launch(const exec::Cuda& exec, const FusedAttentionArgs<T>& a) {
  constexpr bool tc = fused_uses_tensor_cores_v<T>;
  constexpr int bytes = fused_attention_smem_bytes<Pass, tc, D>();
  const char* name = Pass == FusedPass::kForward      ? "fused attention forward"
                     : Pass == FusedPass::kBackwardKv ? "fused attention backward (dK, dV)"
                                                      : "fused attention backward (dQ)";
  const std::int64_t heads = a.B * a.H, tiles = (a.T_ + kFusedTile - 1) / kFusedTile;
  TRAINKIT_CHECK(heads <= 0x7fffffff && tiles <= 65535, "nn::CausalSelfAttention: ", name,
                 " cannot launch for B * H = ", heads, " and T = ", a.T_,
                 " (at most 2^31 - 1 heads and 65535 tiles of 64 positions)");
  auto* kernel = &fused_attention_kernel<Pass, tc, D, T>;
  const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (attr != cudaSuccess) (void)cudaGetLastError();  // reported here, not by a later launch
  TRAINKIT_CHECK(attr == cudaSuccess, "nn::CausalSelfAttention: ", name, " (head size ", a.hs,
                 ") needs ", bytes, " bytes of shared memory per block, which this GPU refuses: ",
                 cudaGetErrorString(attr));
  kernel<<<dim3(static_cast<unsigned>(heads), static_cast<unsigned>(tiles)), kFusedThreads, bytes,
           exec.stream().get()>>>(a);
  const cudaError_t err = cudaGetLastError();
  TRAINKIT_CHECK(err == cudaSuccess, "nn::CausalSelfAttention: ", name, " (B ", a.B, ", H ", a.H,
                 ", T ", a.T_, ", head size ", a.hs, ", ", bytes,
                 " bytes of shared memory) failed to launch: ", cudaGetErrorString(err));
}

/// out and lse from qkv (a.hs <= 128): the tensor-core bodies for 16-bit activations, the f32
/// (CUDA core) ones for f32.
template <class T>
void fused_attention_forward(const exec::Cuda& exec, const FusedAttentionArgs<T>& a) {
  if (a.B * a.H * a.T_ == 0) return;
  fused_with_depth(a.hs, [&]<int D>() { fused_attention_launch<FusedPass::kForward, D>(exec, a); });
}

/// dqkv (overwritten) from dout, qkv, out and lse; delta is scratch.
template <class T>
void fused_attention_backward(const exec::Cuda& exec, const FusedAttentionArgs<T>& a) {
  if (a.B * a.H * a.T_ == 0) return;
  const std::int64_t rows = a.B * a.H * a.T_;
  constexpr const char* kDelta = "nn::CausalSelfAttention: fused attention backward (delta)";
  fused_attention_delta_kernel<T>
      <<<exec::detail::grid_blocks_x(rows, 256, kDelta), 256, 0, exec.stream().get()>>>(a, rows);
  exec::detail::check_kernel_launch(kDelta, "B ", a.B, ", H ", a.H, ", T ", a.T_, ", head size ",
                                    a.hs);
  fused_with_depth(a.hs, [&]<int D>() {
    fused_attention_launch<FusedPass::kBackwardKv, D>(exec, a);
    fused_attention_launch<FusedPass::kBackwardQ, D>(exec, a);
  });
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#endif

}  // namespace detail
}  // namespace nn
TRAINKIT_NAMESPACE_END
