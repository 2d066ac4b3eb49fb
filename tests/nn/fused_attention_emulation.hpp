// A float64 causal attention (forward and backward) to test the fused core against, and the host
// emulation that runs the fused attention core's block bodies (trainkit/nn/fused_attention.hpp):
// one std::thread per CUDA thread of a block, a std::barrier for __syncthreads, and the row-group
// reductions through shared slots in the same butterfly order as the warp shuffles. Slow (a
// block is 128 threads), so for small shapes only; it tests the GPU code's tiling, masking and
// arithmetic where no GPU is. Every 16 x 16 fragment the tensor-core bodies load or store is
// checked against WMMA's rules (load_matrix_sync / store_matrix_sync: a 32-byte aligned address,
// a leading dimension of a multiple of 16 bytes) and against the block's shared memory bounds:
// what the GPU would answer with a misaligned-address error or garbage.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/error.hpp>
#include <trainkit/nn/fused_attention.hpp>

namespace nntest {

struct AttentionShape {
  std::int64_t B, H, T, hs;
};

/// float64 causal attention of one [B, T, 3C] qkv: out [B, T, C], lse2 [B, H, T] (log2 of each
/// row's sum of exp(scale * q.k)), and, given dout, dqkv [B, T, 3C].
struct AttentionExpected {
  std::vector<double> out, lse2, dqkv;
};

inline AttentionExpected attention_reference(const AttentionShape& s,
                                             const std::vector<double>& qkv,
                                             const std::vector<double>& dout) {
  const std::int64_t C = s.H * s.hs, T = s.T;
  const double scale = 1.0 / std::sqrt(double(s.hs));
  AttentionExpected r;
  r.out.assign(std::size_t(s.B * T * C), 0.0);
  r.lse2.assign(std::size_t(s.B * s.H * T), 0.0);
  r.dqkv.assign(std::size_t(s.B * T * 3 * C), 0.0);
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t col) {
    return std::size_t((b * T + t) * 3 * C + col);
  };
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.H; ++h) {
      const std::int64_t q0 = h * s.hs, k0 = C + h * s.hs, v0 = 2 * C + h * s.hs;
      std::vector<double> P(std::size_t(T * T), 0.0), dP(std::size_t(T * T), 0.0);
      for (std::int64_t i = 0; i < T; ++i) {
        double m = -1e300;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < s.hs; ++d)
            dot += qkv[at(b, i, q0 + d)] * qkv[at(b, j, k0 + d)];
          P[std::size_t(i * T + j)] = scale * dot;
          m = std::max(m, scale * dot);
        }
        double z = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) z += std::exp(P[std::size_t(i * T + j)] - m);
        r.lse2[std::size_t((b * s.H + h) * T + i)] = (m + std::log(z)) / std::log(2.0);
        for (std::int64_t j = 0; j <= i; ++j) {
          double& p = P[std::size_t(i * T + j)];
          p = std::exp(p - m) / z;
          for (std::int64_t d = 0; d < s.hs; ++d)
            r.out[std::size_t((b * T + i) * C + h * s.hs + d)] += p * qkv[at(b, j, v0 + d)];
        }
      }
      for (std::int64_t i = 0; i < T; ++i) {
        auto dO = [&](std::int64_t d) { return dout[std::size_t((b * T + i) * C + h * s.hs + d)]; };
        double rowdot = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dp = 0.0;
          for (std::int64_t d = 0; d < s.hs; ++d) dp += dO(d) * qkv[at(b, j, v0 + d)];
          dP[std::size_t(i * T + j)] = dp;
          rowdot += P[std::size_t(i * T + j)] * dp;
          for (std::int64_t d = 0; d < s.hs; ++d)
            r.dqkv[at(b, j, v0 + d)] += P[std::size_t(i * T + j)] * dO(d);
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const double ds =
              scale * P[std::size_t(i * T + j)] * (dP[std::size_t(i * T + j)] - rowdot);
          for (std::int64_t d = 0; d < s.hs; ++d) {
            r.dqkv[at(b, i, q0 + d)] += ds * qkv[at(b, j, k0 + d)];
            r.dqkv[at(b, j, k0 + d)] += ds * qkv[at(b, i, q0 + d)];
          }
        }
      }
    }
  return r;
}

template <class T>
std::vector<double> widen(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(static_cast<float>(v[i]));
  return out;
}

class EmulatedBlock {
 public:
  explicit EmulatedBlock(int smem_floats)
      : shared_(static_cast<std::size_t>(smem_floats), -12345.0f),  // garbage, as on a GPU
        barrier_(trainkit::nn::detail::kFusedThreads) {}

  /// One thread's view of the block: what the kernels call on their context.
  class Thread {
   public:
    Thread(EmulatedBlock& block, int tid) : block_(block), tid_(tid) {}
    int tid() const { return tid_; }
    float* smem() const { return block_.shared_.data(); }
    void sync() const { block_.barrier_.arrive_and_wait(); }
    void row_max(float (&v)[4]) const {
      reduce(v, [](float x, float y) { return x > y ? x : y; });
    }
    void row_sum(float (&v)[4]) const {
      reduce(v, [](float x, float y) { return x + y; });
    }

    /// A warp's 16 x N accumulators. Every thread of the warp computes the whole strip (the
    /// GPU spreads it over the lanes as WMMA fragments); lane 0 stores it.
    template <int N>
    struct Strip {
      float v[16][N];
    };
    template <int N>
    void strip_zero(Strip<N>& s) const {
      for (auto& row : s.v)
        for (float& x : row) x = 0.0f;
    }
    template <int K, bool BCol, int N, class T>
    void strip_mma(Strip<N>& s, const T* a, int lda, const T* b, int ldb) const {
      // The fragments the CUDA body loads (FusedBlockCuda::strip_mma).
      for (int k = 0; k < K; k += 16) {
        fragment("strip_mma operand A", a + k, lda);
        for (int j = 0; j < N / 16; ++j)
          fragment("strip_mma operand B", BCol ? b + j * 16 * ldb + k : b + k * ldb + j * 16, ldb);
      }
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < N; ++n) {
          float acc = s.v[r][n];
          for (int k = 0; k < K; ++k)
            acc += static_cast<float>(a[r * lda + k]) *
                   static_cast<float>(BCol ? b[n * ldb + k] : b[k * ldb + n]);
          s.v[r][n] = acc;
        }
    }
    template <int N>
    void strip_store(const Strip<N>& s, float* c, int ldc) const {
      // The GPU's store is one warp-wide operation; here the lanes that may still be reading
      // the rows (strip_load) finish first, and nobody reads them before the store is done.
      for (int j = 0; j < N / 16; ++j) fragment("strip_store", c + 16 * j, ldc);
      sync();
      if (tid_ % 32 == 0)
        for (int r = 0; r < 16; ++r)
          for (int n = 0; n < N; ++n) c[r * ldc + n] = s.v[r][n];
      sync();
    }
    template <int N>
    void strip_load(Strip<N>& s, const float* c, int ldc) const {
      for (int j = 0; j < N / 16; ++j) fragment("strip_load", c + 16 * j, ldc);
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < N; ++n) s.v[r][n] = c[r * ldc + n];
    }

   private:
    /// A 16 x 16 fragment at p, rows ld elements apart, as WMMA requires it.
    template <class T>
    void fragment(const char* what, const T* p, int ld) const {
      const auto* base = reinterpret_cast<const unsigned char*>(block_.shared_.data());
      const std::ptrdiff_t offset = reinterpret_cast<const unsigned char*>(p) - base;
      const std::ptrdiff_t end =
          offset + static_cast<std::ptrdiff_t>((15 * ld + 16) * static_cast<int>(sizeof(T)));
      const std::ptrdiff_t bytes =
          static_cast<std::ptrdiff_t>(block_.shared_.size() * sizeof(float));
      if (offset < 0 || end > bytes) {
        block_.fail(what, ": a fragment at shared byte ", offset, " with leading dimension ", ld,
                    " reaches past the block's ", bytes, " bytes");
      } else if (offset % 32 != 0) {
        block_.fail(what, ": a fragment at shared byte ", offset, " is not 32-byte aligned");
      } else if ((ld * static_cast<int>(sizeof(T))) % 16 != 0) {
        block_.fail(what, ": leading dimension ", ld, " of ", sizeof(T),
                    "-byte elements is not a multiple of 16 bytes");
      }
    }
    template <class Op>
    void reduce(float (&v)[4], Op op) const {
      for (int o = 1; o < 8; o <<= 1) {
        for (int r = 0; r < 4; ++r) block_.slots_[tid_][r] = v[r];
        sync();
        for (int r = 0; r < 4; ++r) v[r] = op(v[r], block_.slots_[tid_ ^ o][r]);
        sync();
      }
    }
    EmulatedBlock& block_;
    int tid_;
  };

  /// body(thread) on every thread of the block, concurrently; returns when all have.
  template <class Body>
  void run(const Body& body) {
    std::vector<std::thread> threads;
    threads.reserve(trainkit::nn::detail::kFusedThreads);
    for (int t = 0; t < trainkit::nn::detail::kFusedThreads; ++t)
      threads.emplace_back([this, t, &body] {
        Thread self(*this, t);
        body(self);
      });
    for (auto& th : threads) th.join();
    if (!failure_.empty()) throw std::runtime_error("emulated fused attention block: " + failure_);
  }

 private:
  /// Records the first broken rule (any thread); run() throws it once the block is done.
  template <class... Parts>
  void fail(const Parts&... parts) {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_.empty()) failure_ = trainkit::detail::concat(parts...);
  }

  std::vector<float> shared_;
  std::barrier<> barrier_;
  float slots_[trainkit::nn::detail::kFusedThreads][4] = {};
  std::mutex failure_mutex_;
  std::string failure_;
};

/// The fused core's arguments for shape s over the given buffers (host or device).
template <class T>
trainkit::nn::detail::FusedAttentionArgs<T> fused_args(const AttentionShape& s, const T* qkv,
                                                       T* out, float* lse, float* delta,
                                                       const T* dout, T* dqkv) {
  trainkit::nn::detail::FusedAttentionArgs<T> a;
  a.qkv = qkv;
  a.out = out;
  a.lse = lse;
  a.delta = delta;
  a.dout = dout;
  a.dqkv = dqkv;
  a.B = s.B;
  a.T_ = s.T;
  a.C = s.H * s.hs;
  a.H = s.H;
  a.hs = s.hs;
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  return a;
}

/// Every block of pass `Pass` (all tiles of all heads) on the host, one after the other.
template <trainkit::nn::detail::FusedPass Pass, bool TensorCores, int D, class T>
void emulate_fused_pass(const trainkit::nn::detail::FusedAttentionArgs<T>& a) {
  namespace d = trainkit::nn::detail;
  const std::int64_t tiles = (a.T_ + d::kFusedTile - 1) / d::kFusedTile;
  for (std::int64_t bh = 0; bh < a.B * a.H; ++bh)
    for (std::int64_t t = 0; t < tiles; ++t) {
      EmulatedBlock block(d::fused_attention_smem_bytes<Pass, TensorCores, D>() / 4);
      block.run([&](EmulatedBlock::Thread& th) {
        d::fused_attention_block<Pass, TensorCores, D>(th, a, t, bh);
      });
    }
}

/// The fused core's forward (out, lse) and backward (delta, dqkv) on the host, as the GPU runs
/// them: the tensor-core bodies or the f32 ones.
template <bool TensorCores, class T>
void emulate_fused_attention(const trainkit::nn::detail::FusedAttentionArgs<T>& a) {
  namespace d = trainkit::nn::detail;
  d::fused_with_depth(a.hs, [&]<int D>() {
    emulate_fused_pass<d::FusedPass::kForward, TensorCores, D>(a);
    for (std::int64_t row = 0; row < a.B * a.H * a.T_; ++row) d::fused_attention_delta_row(a, row);
    emulate_fused_pass<d::FusedPass::kBackwardKv, TensorCores, D>(a);
    emulate_fused_pass<d::FusedPass::kBackwardQ, TensorCores, D>(a);
  });
}

}  // namespace nntest
