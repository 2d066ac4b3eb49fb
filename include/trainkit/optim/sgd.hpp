// SPDX-License-Identifier: MIT
// trainkit/optim/sgd.hpp: `SGD`, torch.optim.SGD (momentum, dampening, Nesterov, L2 weight
// decay) as one fused pass over a ParamArena, in PyTorch's f32 operation order. The momentum
// buffer starts as a copy of the first applied gradient, as PyTorch's does; a step skipped for
// inf/NaN gradients is not "the first".
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/optimizer.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/optim/rule.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// torch.optim.SGD's arguments (PyTorch requires lr; 1e-3 here).
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  ///< L2: g += weight_decay * p
  bool nesterov = false;      ///< needs momentum > 0 and dampening == 0
};

namespace detail {

struct SGDRule {
  using Options = SGDOptions;
  static constexpr const char* kName = "SGD";
  static constexpr std::array kStates{"momentum_buffer"};
  static constexpr unsigned kMomentum = 1, kNesterov = 2, kVariants = 4;
  static unsigned variant(const Options& o) {
    return (o.momentum != 0.0 ? kMomentum : 0u) | (o.nesterov ? kNesterov : 0u);
  }
  static constexpr int num_states(unsigned v) { return (v & kMomentum) != 0 ? 1 : 0; }
  static void validate(const Options& o) {
    // An infinite momentum (e.g. from a damaged state) would make every parameter inf or NaN.
    TRAINKIT_CHECK(std::isfinite(o.momentum) && o.momentum >= 0.0,
                   "optim::SGD: momentum must be finite and >= 0, got ", o.momentum);
    TRAINKIT_CHECK(std::isfinite(o.dampening), "optim::SGD: invalid dampening ", o.dampening);
    TRAINKIT_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
                   "optim::SGD: Nesterov momentum requires a momentum and zero dampening");
  }
  static constexpr std::tuple kSavedOptions{saved_option("momentum", &Options::momentum),
                                            saved_option("dampening", &Options::dampening),
                                            saved_option("nesterov", &Options::nesterov)};

  struct Scalars {
    float neg_lr;
    float weight_decay;
    float momentum;
    float one_minus_dampening;
    std::int32_t has_weight_decay;
    std::int32_t first;  ///< the momentum buffer is initialised from the gradient
  };
  TRAINKIT_HOST_DEVICE static void derive(const Options& o, const StepHeader& head, Scalars& s) {
    s.neg_lr = static_cast<float>(-o.lr);
    s.weight_decay = static_cast<float>(o.weight_decay);
    s.has_weight_decay = o.weight_decay != 0.0 ? 1 : 0;
    s.momentum = static_cast<float>(o.momentum);
    s.one_minus_dampening = static_cast<float>(1.0 - o.dampening);
    s.first = head.first;
  }

  /// update() is force-inlined: the host loop may also run it on run-time AVX2 vectors.
  static constexpr bool kInlineUpdate = true;

  /// torch/optim/sgd.py's order: g = g + wd * p; buf = g (first) or buf * momentum +
  /// (1 - dampening) * g; g = nesterov ? g + momentum * buf : buf; p = p + (-lr) * g.
  template <unsigned V, class T>
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE static void update(const Scalars& s, T& p, T g,
                                                               T& buf) {
    if (s.has_weight_decay != 0) g = g + s.weight_decay * p;
    if constexpr ((V & kMomentum) != 0) {
      if (s.first != 0) {
        buf = g;
      } else {
        buf = buf * s.momentum;
        buf = buf + s.one_minus_dampening * g;
      }
      g = (V & kNesterov) != 0 ? g + s.momentum * buf : buf;
    }
    p = p + s.neg_lr * g;
  }
};

}  // namespace detail

/// torch.optim.SGD over a ParamArena. With momentum the arena gets a "momentum_buffer" state.
/// Throws for invalid hyper-parameters (negative or non-finite lr/momentum/weight_decay, a
/// non-finite dampening, Nesterov without momentum or with dampening).
template <Space S = Space::kHost>
class SGD : public FusedOptimizer<detail::SGDRule, S> {
 public:
  explicit SGD(nn::ParamArena<S>& arena, SGDOptions options = {},
               std::vector<GroupRule> groups = {})
      : FusedOptimizer<detail::SGDRule, S>(arena, options, std::move(groups)) {}
};

#if TRAINKIT_SEPARATE_COMPILATION
// The host optimizer's out-of-class members (construction, state) are instantiated once, in
// the compiled library (src/trainkit.cpp); the step is compiled where it is used.
extern template FusedOptimizer<detail::SGDRule, Space::kHost>::FusedOptimizer(
    nn::ParamArena<Space::kHost>&, SGDOptions, std::vector<GroupRule>);
extern template void FusedOptimizer<detail::SGDRule, Space::kHost>::state_dict_into(
    StateDict&) const;
extern template void FusedOptimizer<detail::SGDRule, Space::kHost>::load_state_dict(
    const StateDict&);
extern template std::string FusedOptimizer<detail::SGDRule, Space::kHost>::state_layout(
    const SGDOptions&);
extern template void FusedOptimizer<detail::SGDRule, Space::kHost>::allocate_states();
extern template std::vector<detail::StateBuffer>
FusedOptimizer<detail::SGDRule, Space::kHost>::state_buffers() const;
#endif

}  // namespace optim
TRAINKIT_NAMESPACE_END
