// SPDX-License-Identifier: MIT
// trainkit/optim/adamw.hpp: `AdamW`, torch.optim.AdamW as one fused pass over a ParamArena:
// decoupled weight decay, bias correction, optional AMSGrad, reading PyTorch's 28 bytes per
// parameter (p, g, m, v read; p, m, v written) and nothing else. The element arithmetic is
// PyTorch's single-tensor AdamW in the same f32 operation order (lerp for exp_avg, addcmul for
// exp_avg_sq, addcdiv), except that sqrt(v) is multiplied by 1 / sqrt(bias_correction2) instead
// of divided by its square root (as PyTorch's CUDA scalar division does): one f32 division less,
// which is what keeps the CPU loop at memory speed. Optional bf16 moments with stochastic rounding
// (llm.c) halve the optimizer state.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/error.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/optimizer.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/optim/rule.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// torch.optim.AdamW's arguments, with its defaults.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  ///< decoupled: p *= 1 - lr * weight_decay before the Adam update
  bool amsgrad = false;        ///< keep max_exp_avg_sq and normalise by it
  /// Keep exp_avg / exp_avg_sq (/ max_exp_avg_sq) in bf16, rounded stochastically with Philox
  /// keyed by (seed, step, element): unbiased, deterministic, half the state memory (llm.c #772).
  bool bf16_state = false;
  /// The stochastic-rounding key (bf16_state only). Saved in state_dict(); a load restores it.
  std::uint64_t seed = 0;
};

namespace detail {

struct AdamWRule {
  using Options = AdamWOptions;
  static constexpr const char* kName = "AdamW";
  static constexpr std::array kStates{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  static constexpr unsigned kAmsgrad = 1, kBf16 = 2, kVariants = 4;
  static unsigned variant(const Options& o) {
    return (o.amsgrad ? kAmsgrad : 0u) | (o.bf16_state ? kBf16 : 0u);
  }
  static constexpr int num_states(unsigned v) { return (v & kAmsgrad) != 0 ? 3 : 2; }
  static constexpr DType state_dtype(unsigned v) {
    return (v & kBf16) != 0 ? DType::kBF16 : DType::kF32;
  }
  static std::uint64_t rounding_seed(const Options& o) { return o.seed; }
  static void validate(const Options& o) { check_adam_options(kName, o); }
  // The seed keys the stochastic rounding of bf16 state, so a resume needs the saved one to
  // continue bit for bit; it is saved (as decimal text: every std::uint64_t round-trips) with
  // f32 state too, where it changes nothing. States saved before it was a saved option have no
  // "seed": they load keeping this optimizer's own seed, as they did then.
  static constexpr std::tuple kSavedOptions{saved_option("beta1", &Options::beta1),
                                            saved_option("beta2", &Options::beta2),
                                            saved_option("eps", &Options::eps),
                                            saved_option("amsgrad", &Options::amsgrad),
                                            saved_option("bf16_state", &Options::bf16_state),
                                            optional_state_field("seed", &Options::seed)};

  struct Scalars {
    float decay;         ///< 1 - lr * weight_decay (1 when weight_decay is 0)
    float w1;            ///< lerp weight 1 - beta1
    float one_minus_w1;  ///< 1 - w1 in f32 (lerp's large-weight form)
    float beta2;
    float one_minus_beta2;
    float inv_bc2_sqrt;  ///< 1 / sqrt(1 - beta2^step), rounded once from double
    float eps;
    float neg_step_size;      ///< -lr / (1 - beta1^step)
    std::int32_t lerp_small;  ///< |w1| < 0.5: lerp's small-weight form
  };
  /// Python-float (double) arithmetic of torch/optim/adam.py, rounded to f32 where the tensor ops
  /// take the scalars.
  TRAINKIT_HOST_DEVICE static void derive(const Options& o, const StepHeader& head, Scalars& s) {
    const double bc1 = 1.0 - pow(o.beta1, head.step);
    const double bc2 = 1.0 - pow(o.beta2, head.step);
    s.decay = o.weight_decay != 0.0 ? static_cast<float>(1.0 - o.lr * o.weight_decay) : 1.0f;
    s.w1 = static_cast<float>(1.0 - o.beta1);
    s.one_minus_w1 = 1.0f - s.w1;
    s.lerp_small = (s.w1 < 0.5f && s.w1 > -0.5f) ? 1 : 0;
    s.beta2 = static_cast<float>(o.beta2);
    s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
    s.inv_bc2_sqrt = static_cast<float>(1.0 / pow(bc2, 0.5));
    s.eps = static_cast<float>(o.eps);
    s.neg_step_size = static_cast<float>(-(o.lr / bc1));
  }

  /// update() is force-inlined: the host loop may also run it on run-time AVX2 vectors.
  static constexpr bool kInlineUpdate = true;

  /// PyTorch's order: p *= decay; m = lerp(m, g, 1 - beta1); v = v * beta2 + ((1 - beta2) * g)
  /// * g; (AMSGrad: vmax = max(vmax, v)); p += (-step_size * m) / (sqrt(v) / sqrt(bc2) + eps).
  template <unsigned V, class T>
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE static void update(const Scalars& s, T& p, T g, T& m,
                                                               T& v, T& v_max) {
    p = p * s.decay;
    m = s.lerp_small != 0 ? m + s.w1 * (g - m) : g - (g - m) * s.one_minus_w1;
    v = v * s.beta2;
    v = v + (s.one_minus_beta2 * g) * g;
    if constexpr ((V & kAmsgrad) != 0) v_max = vmax(v_max, v);
    const T denom = vsqrt((V & kAmsgrad) != 0 ? v_max : v) * s.inv_bc2_sqrt + s.eps;
    p = p + (s.neg_step_size * m) / denom;
  }
};

}  // namespace detail

/// torch.optim.AdamW over a ParamArena: `optim::AdamW opt(arena, {.lr = 3e-4, .weight_decay =
/// 0.1}, {optim::no_weight_decay({"*.bias", "*ln*"})});` then `opt.step(exec)` or
/// `opt.step(exec, scaler)` each iteration. The state (exp_avg, exp_avg_sq, max_exp_avg_sq) is
/// kept in the arena's named state buffers (f32), or in bf16 buffers of the optimizer with
/// bf16_state. Throws for invalid hyper-parameters (as torch.optim does) or an unfinalized arena.
/// (SGD, AdamW and LAMB are classes deriving from FusedOptimizer, alike but for the rule, rather
/// than alias templates, so that `optim::AdamW opt(arena, ...)` deduces the memory space on
/// every compiler: class template argument deduction through an alias template is C++20 that
/// not all supported compilers implement.)
template <Space S = Space::kHost>
class AdamW : public FusedOptimizer<detail::AdamWRule, S> {
 public:
  explicit AdamW(nn::ParamArena<S>& arena, AdamWOptions options = {},
                 std::vector<GroupRule> groups = {})
      : FusedOptimizer<detail::AdamWRule, S>(arena, options, std::move(groups)) {}
};

#if TRAINKIT_SEPARATE_COMPILATION
// The host optimizer's out-of-class members (construction, state) are instantiated once, in
// the compiled library (src/trainkit.cpp); the step is compiled where it is used.
extern template FusedOptimizer<detail::AdamWRule, Space::kHost>::FusedOptimizer(
    nn::ParamArena<Space::kHost>&, AdamWOptions, std::vector<GroupRule>);
extern template void FusedOptimizer<detail::AdamWRule, Space::kHost>::state_dict_into(
    StateDict&) const;
extern template void FusedOptimizer<detail::AdamWRule, Space::kHost>::load_state_dict(
    const StateDict&);
extern template std::string FusedOptimizer<detail::AdamWRule, Space::kHost>::state_layout(
    const AdamWOptions&);
extern template void FusedOptimizer<detail::AdamWRule, Space::kHost>::allocate_states();
extern template std::vector<detail::StateBuffer>
FusedOptimizer<detail::AdamWRule, Space::kHost>::state_buffers() const;
#endif

}  // namespace optim
TRAINKIT_NAMESPACE_END
