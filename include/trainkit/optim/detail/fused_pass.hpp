// SPDX-License-Identifier: MIT
// trainkit/optim/detail/fused_pass.hpp (internal): the passes FusedOptimizer generates from a
// rule (optim/rule.hpp). One element step (load, unscale and clip the gradient, the rule's
// update, store; bf16 state rounded stochastically), run by the host loop over a contiguous range
// (VecF body, float tail), by the multi_tensor_apply functor on CUDA, and, for rules with a
// per-tensor trust ratio, by the three-pass scheme of apex's FusedLAMB: stage 1 (update direction
// into the gradient buffer, per-chunk partial norms), the per-tensor ratios, stage 2.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/optim/detail/host_simd.hpp"
#include "trainkit/optim/rule.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {
namespace detail {

/// float -> bf16 rounding up with probability (dropped bits) / 2^16: unbiased in expectation.
/// Inf stays inf, NaN becomes the canonical NaN.
TRAINKIT_HOST_DEVICE inline bf16 bf16_round_stochastic(float x, std::uint32_t random) {
  const std::uint32_t bits = trainkit::detail::f32_to_u32(x);
  const std::uint32_t magnitude = bits & 0x7fffffffU;
  if (magnitude > 0x7f800000U) return bf16::from_bits(kBF16CanonicalNaN);
  if (magnitude == 0x7f800000U) return bf16::from_bits(static_cast<std::uint16_t>(bits >> 16));
  return bf16::from_bits(static_cast<std::uint16_t>((bits + (random & 0xffffU)) >> 16));
}

/// The Philox key of stochastically rounded (bf16) state: (seed, stream = step).
struct Rounding {
  std::uint64_t seed;
  double step;
};

template <class T, class Store>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE T load_state(const Store* p) {
  if constexpr (std::is_same_v<Store, float>) {
    return load_as<T>(p);
  } else {
    static_assert(std::is_same_v<T, float>, "optim: bf16 state is updated one element at a time");
    return static_cast<float>(*p);
  }
}

template <class Rule, unsigned V, class T, std::size_t... K>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE auto call_update(const typename Rule::Scalars& s, T& p,
                                                           T g, T* state,
                                                           std::index_sequence<K...>) {
  return Rule::template update<V>(s, p, g, state[K]...);
}

/// Element i of the arena (`flat` in the whole buffer, the stochastic-rounding counter): g is
/// multiplied by grad_scale and then clip (in that order, as PyTorch's unscale_ and clipping
/// do), the rule updates p and the states, everything is stored back. A trust-ratio rule leaves
/// p and writes its returned update direction over the gradient instead.
template <class Rule, unsigned V, class T, class G, class... St>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void fused_element(
    const typename Rule::Scalars& s, T grad_scale, T clip, float* p, G* g, std::int64_t i,
    [[maybe_unused]] std::int64_t flat, [[maybe_unused]] const Rounding& rounding, St*... st) {
  constexpr int kMax = RuleTraits<Rule>::kMaxStates;
  T x = load_as<T>(p + i);
  const T gi = (load_as<T>(g + i) * grad_scale) * clip;
  T state[kMax > 0 ? kMax : 1] = {};
  [[maybe_unused]] int k = 0;
  ((state[k++] = load_state<T>(st + i)), ...);
  if constexpr (RuleTraits<Rule>::kTrustRatio) {
    store_to(call_update<Rule, V>(s, x, gi, state, std::make_index_sequence<kMax>{}), g + i);
  } else {
    call_update<Rule, V>(s, x, gi, state, std::make_index_sequence<kMax>{});
    store_to(x, p + i);
  }
  k = 0;
  if constexpr ((std::is_same_v<St, float> && ...)) {
    ((store_to(state[k++], st + i)), ...);
  } else {
    const U32x4 r = Philox4x32::generate(rounding.seed, static_cast<std::uint64_t>(rounding.step),
                                         static_cast<std::uint64_t>(flat));
    ((st[i] = bf16_round_stochastic(state[k], r.v[k]), ++k), ...);
  }
}

/// The host loops' streams (parameters, gradients, states) come from the outer caches: at each
/// 16th element, the line 256 elements ahead of every stream is requested.
template <class G, class... St>
TRAINKIT_FORCEINLINE void fetch_ahead(std::int64_t i, const float* p, const G* g, const St*... st) {
  constexpr std::int64_t kAhead = 256;
  if (i % 16 != 0) return;
  __builtin_prefetch(p + i + kAhead, 1);
  __builtin_prefetch(g + i + kAhead, 0);
  (__builtin_prefetch(st + i + kAhead, 1), ...);
}

#if TRAINKIT_OPTIM_RUNTIME_AVX2
/// host_range's vector body on 8 lanes, compiled for AVX2 (called where CPUID reports it, by a
/// build for SSE2 only): the elements [i, i + 8k) it reaches, the same bits; returns where it
/// stopped.
template <class Rule, unsigned V, class G, class... St>
TRAINKIT_OPTIM_AVX2 std::int64_t host_range_avx2(typename Rule::Scalars s, float scale, float clip,
                                                 const Rounding& rounding,
                                                 float* TRAINKIT_RESTRICT p, G* TRAINKIT_RESTRICT g,
                                                 std::int64_t i, std::int64_t end, St*... st) {
  const VecF8 vscale(scale);
  const VecF8 vclip(clip);
  for (; i + kLanes<VecF8> <= end; i += kLanes<VecF8>) {
    fetch_ahead(i, p, g, st...);
    fused_element<Rule, V, VecF8>(s, vscale, vclip, p, g, i, i, rounding, st...);
  }
  return i;
}
#endif

/// The host loop over [begin, end) of the arena (pointers to the whole buffers): VecF body (the
/// AVX2 one first where a build for SSE2 only runs on a CPU with AVX2 and the rule's update is
/// always inlined, RuleTraits::kInlineUpdate), float tail. `s` is
/// copied, so the loop reads its scalars from registers, not through memory that the stores could
/// alias.
template <class Rule, unsigned V, class G, class... St>
void host_range(typename Rule::Scalars s, const StepHeader& h, const Rounding& rounding,
                float* TRAINKIT_RESTRICT p, G* TRAINKIT_RESTRICT g, std::int64_t begin,
                std::int64_t end, St*... st) {
  const float scale = h.inv_loss_scale;
  const float clip = h.clip_coef;
  std::int64_t i = begin;
  // nvcc's device pass must not instantiate the (host-only) vector code through the
  // __host__ __device__ element template; the host pass always compiles it.
#if !defined(__CUDA_ARCH__)
  if constexpr ((std::is_same_v<St, float> && ...)) {
#if TRAINKIT_OPTIM_RUNTIME_AVX2
    if constexpr (RuleTraits<Rule>::kInlineUpdate) {
      if (cpu_runs_vecf8())
        i = host_range_avx2<Rule, V>(s, scale, clip, rounding, p, g, i, end, st...);
    }
#endif
    const VecF vscale(scale);
    const VecF vclip(clip);
    for (; i + kLanes<VecF> <= end; i += kLanes<VecF>) {
      fetch_ahead(i, p, g, st...);
      fused_element<Rule, V, VecF>(s, vscale, vclip, p, g, i, i, rounding, st...);
    }
  }
#endif
  for (; i < end; ++i) fused_element<Rule, V, float>(s, scale, clip, p, g, i, i, rounding, st...);
}

/// The multi_tensor_apply functor (CUDA): tensor t of the list is segment t of the arena.
template <class Rule, unsigned V>
struct FusedFunctor {
  const StepHeader* header;
  const typename Rule::Scalars* scalars;
  const std::int32_t* segment_group;
  const std::int64_t* segment_begin;
  std::uint64_t seed;

  template <class... St>
  TRAINKIT_HOST_DEVICE void operator()(int t, std::int64_t i, float* p, const float* g,
                                       St*... st) const {
    const StepHeader& h = *header;
    if (h.skip != 0) return;
    fused_element<Rule, V, float>(scalars[segment_group[t]], h.inv_loss_scale, h.clip_coef, p, g, i,
                                  segment_begin[t] + i, Rounding{seed, h.step}, st...);
  }
};

// ---- rules with a per-tensor trust ratio -------------------------------------------------------

/// A chunk of one parameter's range: the unit of the per-tensor norm partial sums.
struct TensorChunk {
  std::int64_t begin;
  std::int64_t end;
  std::int32_t param;
  std::int32_t group;
};

/// Elements per trust-ratio chunk (also one CUDA block's share).
inline constexpr std::int64_t kTrustChunk = std::int64_t{1} << 14;

/// The partial sums of p^2 and u^2 (double) over one chunk.
struct NormPartial {
  double p2;
  double u2;
};

/// Sums p^2 and u^2 over [begin, end) in element order.
inline NormPartial norm_partial(const float* p, const float* u, std::int64_t begin,
                                std::int64_t end) {
  NormPartial out{0.0, 0.0};
  for (std::int64_t i = begin; i < end; ++i) {
    out.p2 += static_cast<double>(p[i]) * p[i];
    out.u2 += static_cast<double>(u[i]) * u[i];
  }
  return out;
}

/// The trust ratio of tensor t from its chunks' partials (folded in chunk order).
template <class Rule>
TRAINKIT_HOST_DEVICE float tensor_ratio(const typename Rule::Scalars& s, const NormPartial* parts,
                                        int first, int last) {
  double p2 = 0.0;
  double u2 = 0.0;
  for (int c = first; c < last; ++c) {
    p2 += parts[c].p2;
    u2 += parts[c].u2;
  }
  return Rule::trust_ratio(s, static_cast<float>(sqrt(p2)), static_cast<float>(sqrt(u2)));
}

#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
inline namespace TRAINKIT_DETAIL_EXEC_ARCH_NS {

inline constexpr int kTrustThreads = 256;

template <class Rule>
struct TrustRatioArgs {
  const StepHeader* header;
  const typename Rule::Scalars* scalars;
  const TensorChunk* chunks;
  const std::int32_t* param_first_chunk;  // num_params + 1 entries
  NormPartial* partials;
  float* ratio;
  float* p;
  float* g;
  float* states[RuleTraits<Rule>::kMaxStates > 0 ? RuleTraits<Rule>::kMaxStates : 1];
  int num_params;
};

template <class Rule, unsigned V, std::size_t... K>
__device__ TRAINKIT_FORCEINLINE void trust_stage1_element(const TrustRatioArgs<Rule>& a,
                                                          const typename Rule::Scalars& s,
                                                          std::int64_t i,
                                                          std::index_sequence<K...>) {
  fused_element<Rule, V, float>(s, a.header->inv_loss_scale, a.header->clip_coef, a.p, a.g, i, i,
                                Rounding{0, 0.0}, a.states[K]...);
}

template <class Rule, unsigned V>
__global__ void __launch_bounds__(kTrustThreads) trust_stage1_kernel(TrustRatioArgs<Rule> a) {
  __shared__ double sp[kTrustThreads];
  __shared__ double su[kTrustThreads];
  if (a.header->skip != 0) return;
  const TensorChunk c = a.chunks[blockIdx.x];
  const typename Rule::Scalars s = a.scalars[c.group];
  double p2 = 0.0;
  double u2 = 0.0;
  for (std::int64_t i = c.begin + threadIdx.x; i < c.end; i += kTrustThreads) {
    const float pi = a.p[i];
    trust_stage1_element<Rule, V>(a, s, i,
                                  std::make_index_sequence<RuleTraits<Rule>::num_states(V)>{});
    const float u = a.g[i];
    p2 += static_cast<double>(pi) * pi;
    u2 += static_cast<double>(u) * u;
  }
  const int tid = static_cast<int>(threadIdx.x);
  sp[tid] = p2;
  su[tid] = u2;
  for (int width = kTrustThreads / 2; width > 0; width /= 2) {
    __syncthreads();
    if (tid < width) {
      sp[tid] += sp[tid + width];
      su[tid] += su[tid + width];
    }
  }
  if (tid == 0) a.partials[blockIdx.x] = NormPartial{sp[0], su[0]};
}

template <class Rule>
__global__ void __launch_bounds__(kTrustThreads) trust_ratio_kernel(TrustRatioArgs<Rule> a) {
  if (a.header->skip != 0) return;
  const int t = static_cast<int>(blockIdx.x) * kTrustThreads + static_cast<int>(threadIdx.x);
  if (t >= a.num_params) return;
  const int first = a.param_first_chunk[t];
  const int last = a.param_first_chunk[t + 1];
  if (first == last) return;
  a.ratio[t] = tensor_ratio<Rule>(a.scalars[a.chunks[first].group], a.partials, first, last);
}

template <class Rule>
__global__ void __launch_bounds__(kTrustThreads) trust_stage2_kernel(TrustRatioArgs<Rule> a) {
  if (a.header->skip != 0) return;
  const TensorChunk c = a.chunks[blockIdx.x];
  const float r = a.ratio[c.param];
  for (std::int64_t i = c.begin + threadIdx.x; i < c.end; i += kTrustThreads)
    a.p[i] = a.p[i] - r * a.g[i];
}

/// Enqueues the three trust-ratio passes on `stream` (stage 1 and stage 2: a block per chunk,
/// num_chunks > 0; the ratios: a thread per parameter). Each launch is checked as the other
/// kernels' are: a failure throws trainkit::Error naming the pass, the rule and the sizes, with
/// CUDA's reason.
template <class Rule, unsigned V>
void launch_trust_ratio_kernels(const TrustRatioArgs<Rule>& args, std::int64_t num_chunks,
                                cudaStream_t stream) {
  static constexpr const char* kStage1 = "optim trust-ratio stage 1 (update and norm partials)";
  static constexpr const char* kRatio = "optim trust-ratio per-tensor ratios";
  static constexpr const char* kStage2 = "optim trust-ratio stage 2 (p -= ratio * u)";
  const unsigned chunk_blocks = exec::detail::grid_blocks_x(num_chunks, 1, kStage1);
  trust_stage1_kernel<Rule, V><<<chunk_blocks, kTrustThreads, 0, stream>>>(args);
  exec::detail::check_kernel_launch(kStage1, Rule::kName, ", ", num_chunks, " chunks of ",
                                    kTrustChunk, " elements");
  const unsigned ratio_blocks = exec::detail::grid_blocks_x(args.num_params, kTrustThreads, kRatio);
  trust_ratio_kernel<Rule><<<ratio_blocks, kTrustThreads, 0, stream>>>(args);
  exec::detail::check_kernel_launch(kRatio, Rule::kName, ", ", args.num_params, " tensors");
  trust_stage2_kernel<Rule><<<chunk_blocks, kTrustThreads, 0, stream>>>(args);
  exec::detail::check_kernel_launch(kStage2, Rule::kName, ", ", num_chunks, " chunks of ",
                                    kTrustChunk, " elements");
}

}  // namespace TRAINKIT_DETAIL_EXEC_ARCH_NS
#endif

}  // namespace detail
}  // namespace optim
TRAINKIT_NAMESPACE_END
