// Runs the fused attention core's block bodies (trainkit/nn/fused_attention.hpp) on the host: one
// std::thread per CUDA thread of a block, a std::barrier for __syncthreads, and the row-group
// reductions through shared slots in the same butterfly order as the warp shuffles. Slow (a
// block is 128 threads), so for small shapes only; it tests the GPU code's tiling, masking and
// arithmetic where no GPU is.
#pragma once

#include <barrier>
#include <cstdint>
#include <thread>
#include <vector>

#include <trainkit/nn/fused_attention.hpp>

namespace nntest {

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

   private:
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
  }

 private:
  std::vector<float> shared_;
  std::barrier<> barrier_;
  float slots_[trainkit::nn::detail::kFusedThreads][4] = {};
};

/// The fused forward (out, lse) of a.hs <= D, every tile of every head, on the host.
template <int D, class T>
void emulate_fused_forward(const trainkit::nn::detail::FusedAttentionArgs<T>& a) {
  namespace d = trainkit::nn::detail;
  const std::int64_t tiles = (a.T_ + d::kFusedTile - 1) / d::kFusedTile;
  for (std::int64_t bh = 0; bh < a.B * a.H; ++bh)
    for (std::int64_t t = 0; t < tiles; ++t) {
      EmulatedBlock block(d::fused_attention_smem_floats<D>());
      block.run(
          [&](EmulatedBlock::Thread& th) { d::fused_attention_forward_block<D>(th, a, t, bh); });
    }
}

/// The fused backward (dqkv) on the host: delta, then the dK/dV and dQ blocks.
template <int D, class T>
void emulate_fused_backward(const trainkit::nn::detail::FusedAttentionArgs<T>& a) {
  namespace d = trainkit::nn::detail;
  const std::int64_t tiles = (a.T_ + d::kFusedTile - 1) / d::kFusedTile;
  for (std::int64_t row = 0; row < a.B * a.H * a.T_; ++row) d::fused_attention_delta_row(a, row);
  for (std::int64_t bh = 0; bh < a.B * a.H; ++bh)
    for (std::int64_t t = 0; t < tiles; ++t) {
      EmulatedBlock kv(d::fused_attention_smem_floats<D>());
      kv.run([&](EmulatedBlock::Thread& th) {
        d::fused_attention_backward_kv_block<D>(th, a, t, bh);
      });
      EmulatedBlock q(d::fused_attention_smem_floats<D>());
      q.run(
          [&](EmulatedBlock::Thread& th) { d::fused_attention_backward_q_block<D>(th, a, t, bh); });
    }
}

}  // namespace nntest
