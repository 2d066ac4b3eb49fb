// SPDX-License-Identifier: MIT
// trainkit/optim/lamb.hpp: `LAMB` (You et al. 2019) as NVIDIA apex's FusedLAMB computes it: the
// gradients are divided by max(1, ||g|| / max_grad_norm) (global norm), Adam moments with bias
// correction give the update u = m_hat / (sqrt(v_hat) + eps) + wd * p (adam_w_mode), and each
// parameter tensor moves by lr * ||p|| / ||u|| (its trust ratio) times u. Per-tensor norms are
// deterministic: fixed chunks, each folded in a fixed order, then the chunks of a tensor in order.
// Like apex, the update is written into the gradient buffer between the two passes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/detail/host_simd.hpp"
#include "trainkit/optim/optimizer.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/core/state_dict.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// apex.optimizers.FusedLAMB's arguments, with its (code) defaults.
struct LAMBOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  bool bias_correction = true;
  bool adam_w_mode = true;     ///< decoupled decay in the update; false: L2 added to the gradient
  bool grad_averaging = true;  ///< m = beta1 m + (1 - beta1) g; false: m = beta1 m + g
  double max_grad_norm = 1.0;  ///< global-norm clipping of the gradients first; <= 0: none
  bool use_nvlamb = false;     ///< trust ratio also for groups without weight decay
};

namespace detail {

struct LAMBRule {
  struct Hyper {
    double lr;
    double weight_decay;
    double beta1;
    double beta2;
    double eps;
    double max_grad_norm;
    std::int32_t bias_correction;
    std::int32_t grad_averaging;
    std::int32_t adam_w_mode;
    std::int32_t use_nvlamb;
  };
  struct Scalars {
    float lr;
    float decay;
    float beta1;
    float beta2;
    float beta3;
    float omb2;
    float bc1;
    float bc2;
    float eps;
    float clip_div;  ///< the gradients are divided by this (apex's clipped_global_grad_norm)
    std::int32_t adam_w_mode;
    std::int32_t use_ratio;
  };
  /// apex multi_tensor_lamb_cuda's host arithmetic (f32 scalars, std::pow in double).
  TRAINKIT_HOST_DEVICE static void derive(const Hyper& h, const StepHeader& head, Scalars& s) {
    s.lr = static_cast<float>(h.lr);
    s.decay = static_cast<float>(h.weight_decay);
    s.beta1 = static_cast<float>(h.beta1);
    s.beta2 = static_cast<float>(h.beta2);
    s.beta3 = h.grad_averaging != 0 ? 1.0f - s.beta1 : 1.0f;
    s.omb2 = 1.0f - s.beta2;
    s.bc1 = 1.0f;
    s.bc2 = 1.0f;
    if (h.bias_correction != 0) {
      s.bc1 = static_cast<float>(1.0 - pow(static_cast<double>(s.beta1), head.step));
      s.bc2 = static_cast<float>(1.0 - pow(static_cast<double>(s.beta2), head.step));
    }
    s.eps = static_cast<float>(h.eps);
    const float max_norm = static_cast<float>(h.max_grad_norm);
    s.clip_div =
        (h.max_grad_norm > 0.0 && head.grad_norm > max_norm) ? head.grad_norm / max_norm : 1.0f;
    s.adam_w_mode = h.adam_w_mode;
    s.use_ratio = (h.use_nvlamb != 0 || h.weight_decay != 0.0) ? 1 : 0;
  }
};

/// A chunk of one parameter's range: the unit of the per-tensor norm partial sums.
struct LambChunk {
  std::int64_t begin;
  std::int64_t end;
  std::int32_t param;
  std::int32_t group;
};

/// Elements per LAMB chunk (also the CUDA block's share).
inline constexpr std::int64_t kLambChunk = std::int64_t{1} << 14;

/// Stage 1 for one element: Adam moments and the update u (returned; written over g by callers).
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE float lamb_stage1(float p, float g, float& m, float& v,
                                                            float a, float b,
                                                            const LAMBRule::Scalars& s) {
  g = (g * a) * b;
  const float pv = s.decay != 0.0f ? p : 0.0f;
  float sg = g / s.clip_div;
  if (s.adam_w_mode == 0) sg = sg + s.decay * pv;
  m = m * s.beta1 + s.beta3 * sg;
  v = v * s.beta2 + (s.omb2 * sg) * sg;
  const float mh = m / s.bc1;
  const float vh = v / s.bc2;
  const float denom = vsqrt(vh) + s.eps;
  return s.adam_w_mode != 0 ? (mh / denom) + (s.decay * pv) : mh / denom;
}

/// The trust-ratio step size of one tensor from its norms (apex LAMBStage2Functor).
TRAINKIT_HOST_DEVICE inline float lamb_ratio(const LAMBRule::Scalars& s, float param_norm,
                                             float update_norm) {
  if (s.use_ratio == 0) return s.lr;
  return (update_norm != 0.0f && param_norm != 0.0f) ? s.lr * (param_norm / update_norm) : s.lr;
}

/// Stage 1 over one chunk [begin, end): returns the partial sums of p^2 and u^2 (double).
struct LambPartial {
  double p2;
  double u2;
};

inline LambPartial lamb_stage1_range(float* p, float* g, float* m, float* v, std::int64_t begin,
                                     std::int64_t end, float a, float b,
                                     const LAMBRule::Scalars& s) {
  LambPartial out{0.0, 0.0};
  for (std::int64_t i = begin; i < end; ++i) {
    const float pi = p[i];
    const float u = lamb_stage1(pi, g[i], m[i], v[i], a, b, s);
    g[i] = u;
    out.p2 += static_cast<double>(pi) * pi;
    out.u2 += static_cast<double>(u) * u;
  }
  return out;
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

inline constexpr int kLambThreads = 256;

struct LambDeviceArgs {
  const StepHeader* header;
  const LAMBRule::Scalars* scalars;
  const LambChunk* chunks;
  const std::int32_t* param_first_chunk;  // num_params + 1 entries
  LambPartial* partials;
  float* ratio;
  float* p;
  float* g;
  float* m;
  float* v;
  int num_params;
};

template <int Unused = 0>
__global__ void __launch_bounds__(kLambThreads) lamb_stage1_kernel(LambDeviceArgs a) {
  __shared__ double sp[kLambThreads];
  __shared__ double su[kLambThreads];
  if (a.header->skip != 0) return;
  const LambChunk c = a.chunks[blockIdx.x];
  const LAMBRule::Scalars s = a.scalars[c.group];
  const float ma = a.header->grad_mult_a;
  const float mb = a.header->grad_mult_b;
  double p2 = 0.0;
  double u2 = 0.0;
  for (std::int64_t i = c.begin + threadIdx.x; i < c.end; i += kLambThreads) {
    const float pi = a.p[i];
    const float u = lamb_stage1(pi, a.g[i], a.m[i], a.v[i], ma, mb, s);
    a.g[i] = u;
    p2 += static_cast<double>(pi) * pi;
    u2 += static_cast<double>(u) * u;
  }
  const int tid = static_cast<int>(threadIdx.x);
  sp[tid] = p2;
  su[tid] = u2;
  for (int width = kLambThreads / 2; width > 0; width /= 2) {
    __syncthreads();
    if (tid < width) {
      sp[tid] += sp[tid + width];
      su[tid] += su[tid + width];
    }
  }
  if (tid == 0) a.partials[blockIdx.x] = LambPartial{sp[0], su[0]};
}

template <int Unused = 0>
__global__ void __launch_bounds__(kLambThreads) lamb_ratio_kernel(LambDeviceArgs a) {
  if (a.header->skip != 0) return;
  const int t = static_cast<int>(blockIdx.x) * kLambThreads + static_cast<int>(threadIdx.x);
  if (t >= a.num_params) return;
  const int first = a.param_first_chunk[t];
  const int last = a.param_first_chunk[t + 1];
  if (first == last) return;
  double p2 = 0.0;
  double u2 = 0.0;
  for (int c = first; c < last; ++c) {
    p2 += a.partials[c].p2;
    u2 += a.partials[c].u2;
  }
  a.ratio[t] = lamb_ratio(a.scalars[a.chunks[first].group], static_cast<float>(sqrt(p2)),
                          static_cast<float>(sqrt(u2)));
}

template <int Unused = 0>
__global__ void __launch_bounds__(kLambThreads) lamb_stage2_kernel(LambDeviceArgs a) {
  if (a.header->skip != 0) return;
  const LambChunk c = a.chunks[blockIdx.x];
  const float r = a.ratio[c.param];
  for (std::int64_t i = c.begin + threadIdx.x; i < c.end; i += kLambThreads)
    a.p[i] = a.p[i] - r * a.g[i];
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#endif

}  // namespace detail

/// LAMB over a ParamArena (apex FusedLAMB semantics; state "exp_avg", "exp_avg_sq"). Four
/// passes per step: the global gradient norm (skipped when a loss scaler measured it), stage 1
/// (moments, update into the gradient buffer, per-chunk norm partials), the per-tensor trust
/// ratios, stage 2 (p -= ratio * u). No host sync. Note: the gradients hold the update after a
/// (non-skipped) step, as with apex.
template <Space S = Space::kHost>
class LAMB : public FusedOptimizer<LAMB<S>, S, detail::LAMBRule> {
  using Base = FusedOptimizer<LAMB<S>, S, detail::LAMBRule>;
  friend Base;

 public:
  explicit LAMB(nn::ParamArena<S>& arena, LAMBOptions options = {},
                std::vector<GroupRule> groups = {})
      : Base(arena, hyper_of(validated(options)), std::move(groups), /*merge_segments=*/false),
        options_(options) {
    m_ = this->arena_state("exp_avg");
    v_ = this->arena_state("exp_avg_sq");
    const int num_params = static_cast<int>(arena.size());
    std::vector<std::int32_t> first(static_cast<std::size_t>(num_params) + 1, 0);
    std::vector<bool> has(static_cast<std::size_t>(num_params), false);
    for (const detail::Segment& s : this->segments_) {
      has[static_cast<std::size_t>(s.param)] = true;
      first[static_cast<std::size_t>(s.param)] = static_cast<std::int32_t>(chunks_.size());
      for (std::int64_t b = s.begin; b < s.end; b += detail::kLambChunk)
        chunks_.push_back({b, std::min(s.end, b + detail::kLambChunk), s.param, s.group});
    }
    // Parameters without elements own no chunk: they point at the next parameter's first.
    first[static_cast<std::size_t>(num_params)] = static_cast<std::int32_t>(chunks_.size());
    for (int t = num_params - 1; t >= 0; --t)
      if (!has[static_cast<std::size_t>(t)])
        first[static_cast<std::size_t>(t)] = first[static_cast<std::size_t>(t) + 1];
    param_first_chunk_host_ = first;
    const auto nc = static_cast<std::int64_t>(chunks_.size());
    chunk_table_ = Tensor<detail::LambChunk, S>(Shape{nc});
    copy_bytes(chunk_table_.data(), S, chunks_.data(), Space::kHost,
               chunks_.size() * sizeof(detail::LambChunk));
    first_table_ = Tensor<std::int32_t, S>(Shape{static_cast<std::int64_t>(first.size())});
    copy_bytes(first_table_.data(), S, first.data(), Space::kHost,
               first.size() * sizeof(std::int32_t));
    partials_ = Tensor<detail::LambPartial, S>(Shape{nc});
    ratio_ = Tensor<float, S>(Shape{std::max<std::int64_t>(num_params, 1)});
  }

  const LAMBOptions& options() const noexcept { return options_; }

 private:
  bool needs_grad_norm() const noexcept { return options_.max_grad_norm > 0.0; }

  static LAMBOptions validated(const LAMBOptions& o) {
    TRAINKIT_CHECK(o.lr >= 0.0, "optim::LAMB: invalid learning rate ", o.lr);
    TRAINKIT_CHECK(o.eps >= 0.0, "optim::LAMB: invalid epsilon ", o.eps);
    TRAINKIT_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, "optim::LAMB: invalid beta1 ", o.beta1);
    TRAINKIT_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, "optim::LAMB: invalid beta2 ", o.beta2);
    TRAINKIT_CHECK(o.weight_decay >= 0.0, "optim::LAMB: invalid weight_decay ", o.weight_decay);
    return o;
  }
  static detail::LAMBRule::Hyper hyper_of(const LAMBOptions& o) {
    return {o.lr,
            o.weight_decay,
            o.beta1,
            o.beta2,
            o.eps,
            o.max_grad_norm,
            o.bias_correction ? 1 : 0,
            o.grad_averaging ? 1 : 0,
            o.adam_w_mode ? 1 : 0,
            o.use_nvlamb ? 1 : 0};
  }

  template <class E>
  void launch_update(const E& exec) {
    float* p = this->arena_->params_data();
    float* g = this->arena_->grads_data();
    if constexpr (exec::is_host_executor_v<E>) {
      const detail::StepHeader& h = this->host_header();
      if (h.skip != 0) return;
      const float a = h.grad_mult_a;
      const float b = h.grad_mult_b;
      const detail::LambChunk* chunks = chunks_.data();
      detail::LambPartial* partials = partials_.data();
      float* m = m_;
      float* v = v_;
      exec.parallel_for(static_cast<std::int64_t>(chunks_.size()), [&](std::int64_t c) {
        const detail::LambChunk& ch = chunks[c];
        partials[c] = detail::lamb_stage1_range(p, g, m, v, ch.begin, ch.end, a, b,
                                                this->host_scalars(ch.group));
      });
      float* ratio = ratio_.data();
      const int num_params = static_cast<int>(this->arena_->size());
      for (int t = 0; t < num_params; ++t) {
        const int first = param_first_chunk_host_[static_cast<std::size_t>(t)];
        const int last = param_first_chunk_host_[static_cast<std::size_t>(t) + 1];
        if (first == last) continue;
        double p2 = 0.0;
        double u2 = 0.0;
        for (int c = first; c < last; ++c) {
          p2 += partials[c].p2;
          u2 += partials[c].u2;
        }
        ratio[t] = detail::lamb_ratio(this->host_scalars(chunks[first].group),
                                      static_cast<float>(std::sqrt(p2)),
                                      static_cast<float>(std::sqrt(u2)));
      }
      exec.parallel_for(static_cast<std::int64_t>(chunks_.size()), [&](std::int64_t c) {
        const detail::LambChunk& ch = chunks[c];
        const float r = ratio[ch.param];
        for (std::int64_t i = ch.begin; i < ch.end; ++i) p[i] = p[i] - r * g[i];
      });
    } else {
#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
      const auto num_chunks = static_cast<unsigned>(chunks_.size());
      if (num_chunks == 0) return;
      const int num_params = static_cast<int>(this->arena_->size());
      const detail::LambDeviceArgs args{this->header_.data(),
                                        this->scalars_.data(),
                                        chunk_table_.data(),
                                        first_table_.data(),
                                        partials_.data(),
                                        ratio_.data(),
                                        p,
                                        g,
                                        m_,
                                        v_,
                                        num_params};
      const cudaStream_t stream = exec.stream().get();
      detail::lamb_stage1_kernel<<<num_chunks, detail::kLambThreads, 0, stream>>>(args);
      TRAINKIT_CUDA_CHECK(cudaGetLastError());
      const auto ratio_blocks =
          static_cast<unsigned>((num_params + detail::kLambThreads - 1) / detail::kLambThreads);
      detail::lamb_ratio_kernel<<<ratio_blocks, detail::kLambThreads, 0, stream>>>(args);
      TRAINKIT_CUDA_CHECK(cudaGetLastError());
      detail::lamb_stage2_kernel<<<num_chunks, detail::kLambThreads, 0, stream>>>(args);
      TRAINKIT_CUDA_CHECK(cudaGetLastError());
#else
      static_assert(exec::detail::dependent_false<E>,
                    "optim::LAMB::step with exec::Cuda launches CUDA kernels: compile this TU "
                    "with nvcc (a .cu file)");
#endif
    }
  }

  std::vector<detail::StateBuffer> state_buffers() const {
    return {{"exp_avg", m_, DType::kF32}, {"exp_avg_sq", v_, DType::kF32}};
  }
  void save_options(StateDict& sd) const {
    sd.set("optimizer", "LAMB");
    sd.set("beta1", options_.beta1);
    sd.set("beta2", options_.beta2);
    sd.set("eps", options_.eps);
    sd.set("max_grad_norm", options_.max_grad_norm);
  }
  void load_options(const StateDict& sd) {
    TRAINKIT_CHECK(sd.get_string("optimizer") == "LAMB",
                   "optim::LAMB::load_state_dict: the "
                   "state is from ",
                   sd.get_string("optimizer"));
    options_.beta1 = sd.get_double("beta1");
    options_.beta2 = sd.get_double("beta2");
    options_.eps = sd.get_double("eps");
    options_.max_grad_norm = sd.get_double("max_grad_norm");
    for (auto& h : this->hyper_) {
      h.beta1 = options_.beta1;
      h.beta2 = options_.beta2;
      h.eps = options_.eps;
      h.max_grad_norm = options_.max_grad_norm;
    }
  }

  LAMBOptions options_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  std::vector<detail::LambChunk> chunks_;
  std::vector<std::int32_t> param_first_chunk_host_;
  Tensor<detail::LambChunk, S> chunk_table_;
  Tensor<std::int32_t, S> first_table_;
  Tensor<detail::LambPartial, S> partials_;
  Tensor<float, S> ratio_;
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
