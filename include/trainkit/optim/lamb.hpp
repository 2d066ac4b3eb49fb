// SPDX-License-Identifier: MIT
// trainkit/optim/lamb.hpp: `LAMB` (You et al. 2019) as NVIDIA apex's FusedLAMB computes it: the
// gradients are divided by max(1, ||g|| / max_grad_norm) (global norm of the gradients the step
// reads: after ClipGradNorm, or after unscale_ + clip_grad_norm_), Adam moments with bias
// correction give the update u = m_hat / (sqrt(v_hat) + eps) + wd * p (adam_w_mode), and each
// parameter tensor moves by lr * ||p|| / ||u|| (its trust ratio) times u. Per-tensor norms are
// deterministic: fixed chunks, each folded in a fixed order, then the chunks of a tensor in order.
// Like apex, the update is written into the gradient buffer between the two passes.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/optimizer.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/optim/rule.hpp"

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
  using Options = LAMBOptions;
  static constexpr const char* kName = "LAMB";
  static constexpr std::array kStates{"exp_avg", "exp_avg_sq"};
  static void validate(const Options& o) {
    check_adam_options(kName, o);
    TRAINKIT_CHECK(!std::isnan(o.max_grad_norm), "optim::LAMB: max_grad_norm is NaN");
  }
  static bool needs_grad_norm(const Options& o) { return o.max_grad_norm > 0.0; }
  static constexpr std::tuple kSavedOptions{
      saved_option("beta1", &Options::beta1),
      saved_option("beta2", &Options::beta2),
      saved_option("eps", &Options::eps),
      saved_option("max_grad_norm", &Options::max_grad_norm),
      saved_option("bias_correction", &Options::bias_correction),
      saved_option("grad_averaging", &Options::grad_averaging),
      saved_option("adam_w_mode", &Options::adam_w_mode),
      saved_option("use_nvlamb", &Options::use_nvlamb)};

  struct Scalars {
    float lr;
    float decay;
    float beta1;
    float beta2;
    float beta3;
    float one_minus_beta2;
    float bc1;
    float bc2;
    float eps;
    float clip_div;  ///< the gradients are divided by this (apex's clipped_global_grad_norm)
    std::int32_t adam_w_mode;
    std::int32_t use_ratio;
  };
  /// apex multi_tensor_lamb_cuda's host arithmetic (f32 scalars, std::pow in double).
  TRAINKIT_HOST_DEVICE static void derive(const Options& o, const StepHeader& head, Scalars& s) {
    s.lr = static_cast<float>(o.lr);
    s.decay = static_cast<float>(o.weight_decay);
    s.beta1 = static_cast<float>(o.beta1);
    s.beta2 = static_cast<float>(o.beta2);
    s.beta3 = o.grad_averaging ? 1.0f - s.beta1 : 1.0f;
    s.one_minus_beta2 = 1.0f - s.beta2;
    s.bc1 = o.bias_correction ? static_cast<float>(1.0 - pow(double{s.beta1}, head.step)) : 1.0f;
    s.bc2 = o.bias_correction ? static_cast<float>(1.0 - pow(double{s.beta2}, head.step)) : 1.0f;
    s.eps = static_cast<float>(o.eps);
    const float max_norm = static_cast<float>(o.max_grad_norm);
    // The norm of the gradients this update reads: after the step's ClipGradNorm coefficient (1
    // without clipping), as apex measures the gradients it is given after clip_grad_norm_.
    const float norm = head.grad_norm * head.clip_coef;
    s.clip_div = (o.max_grad_norm > 0.0 && norm > max_norm) ? norm / max_norm : 1.0f;
    s.adam_w_mode = o.adam_w_mode ? 1 : 0;
    s.use_ratio = (o.use_nvlamb || o.weight_decay != 0.0) ? 1 : 0;
  }

  /// update() is force-inlined: the host loop may also run it on run-time AVX2 vectors.
  static constexpr bool kInlineUpdate = true;

  /// Stage 1 (apex LAMBStage1Functor): Adam moments and the update direction u (returned).
  template <unsigned V, class T>
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE static T update(const Scalars& s, T p, T g, T& m,
                                                            T& v) {
    const T pv = s.decay != 0.0f ? p : T(0.0f);
    T sg = g / s.clip_div;
    if (s.adam_w_mode == 0) sg = sg + s.decay * pv;
    m = m * s.beta1 + s.beta3 * sg;
    v = v * s.beta2 + (s.one_minus_beta2 * sg) * sg;
    const T denom = vsqrt(v / s.bc2) + s.eps;
    return s.adam_w_mode != 0 ? ((m / s.bc1) / denom) + (s.decay * pv) : (m / s.bc1) / denom;
  }
  /// The trust-ratio step size of one tensor from its norms (apex LAMBStage2Functor).
  TRAINKIT_HOST_DEVICE static float trust_ratio(const Scalars& s, float param_norm,
                                                float update_norm) {
    if (s.use_ratio == 0) return s.lr;
    return (update_norm != 0.0f && param_norm != 0.0f) ? s.lr * (param_norm / update_norm) : s.lr;
  }
};

}  // namespace detail

/// LAMB over a ParamArena (apex FusedLAMB semantics; state "exp_avg", "exp_avg_sq"). Four
/// passes per step: the global gradient norm (skipped when the loss scaler's check in this step
/// measured it; after an explicit unscale_ the gradients may have been clipped since), stage 1
/// (moments, update into the gradient buffer, per-chunk norm partials), the per-tensor trust
/// ratios, stage 2 (p -= ratio * u). No host sync. Note: the gradients hold the update after a
/// (non-skipped) step, as with apex.
template <Space S = Space::kHost>
class LAMB : public FusedOptimizer<detail::LAMBRule, S> {
 public:
  explicit LAMB(nn::ParamArena<S>& arena, LAMBOptions options = {},
                std::vector<GroupRule> groups = {})
      : FusedOptimizer<detail::LAMBRule, S>(arena, options, std::move(groups)) {}
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
