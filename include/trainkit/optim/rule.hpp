// SPDX-License-Identifier: MIT
// trainkit/optim/rule.hpp: what an optimizer RULE declares, and what the generic fused optimizer
// (optim::FusedOptimizer<Rule, S>, optimizer.hpp) reads from it. A rule is a struct of static
// members; everything else (the step prologue, the host SIMD loop, the CUDA multi-tensor launch,
// the state buffers, state_dict / load_state_dict) is generated from it. docs/optimizers.md
// shows a complete rule.
//
// Required:
//   using Options = ...;    the public options struct: trivially copyable, with `double lr` and
//                           `double weight_decay` (parameter groups override those two); each
//                           group keeps a copy, which derive() reads on the host or the device
//   kName                   `static constexpr const char* kName = "AdamW";` (messages, state)
//   kStates                 `static constexpr std::array kStates{"exp_avg", ...}`: PyTorch's state
//                           names, each one buffer with the arena's layout, zero at the start;
//                           load_state_dict refuses NaN in any, and values below zero in one
//                           whose name holds "_sq" (a second moment: a sum of squares)
//   struct Scalars          the per-group f32 values the element update reads (trivially copyable)
//   derive(group, head, s)  TRAINKIT_HOST_DEVICE static void(const Options&, const StepHeader&,
//                           Scalars&): this step's Scalars from the group's options and the step
//                           header (step counter already advanced; grad_norm; first)
//   update<V>(s, p, g, state...)  TRAINKIT_HOST_DEVICE static, templated on the variant V and on
//                           the value type T (float, or the host VecF): one element, `T& p`, the
//                           gradient `T g` (already multiplied by the inverse loss scale and the
//                           clip coefficient), then one `T&` per entry of kStates
// Optional:
//   kVariants, variant(o)   compile-time variants (a flag word < kVariants chosen by the options;
//                           default: one variant, 0); each is a separately instantiated pass
//   num_states(V)           constexpr: how many of kStates (a prefix) variant V keeps (default all)
//   state_dtype(V)          constexpr DType::kF32 (default) or DType::kBF16: bf16 state is
//                           rounded stochastically (Philox keyed by rounding_seed(o), the step and
//                           the flat element index); then also rounding_seed(o)
//   validate(o)             throws trainkit::Error for invalid options (lr >= 0 and
//                           weight_decay >= 0 are checked for every rule)
//   needs_grad_norm(o)      true: the global gradient norm is measured before the prologue
//   kSavedOptions           `std::tuple{saved_option("beta1", &Options::beta1), ...}`: options
//                           that state_dict() stores and load_state_dict() restores (double,
//                           bool or integer members; unsigned ones as decimal text, so every
//                           64-bit value round-trips)
//   trust_ratio(s, pn, un)  declares a per-tensor phase: update() then RETURNS the step direction
//                           u (p stays; u is written over the gradient), the driver reduces
//                           ||p|| and ||u|| per parameter tensor (deterministically) and moves
//                           each tensor by p -= trust_ratio(s, ||p||, ||u||) * u (LAMB, LARS)
//   kInlineUpdate           `static constexpr bool kInlineUpdate = true;` when update() is
//                           TRAINKIT_FORCEINLINE: a build for SSE2 only (plain -O2) then also runs
//                           it on 8-lane AVX2 vectors where CPUID reports AVX2 (the same bits).
//                           Only for an update that is always inlined: a call between code built
//                           for SSE2 and for AVX2 cannot pass those vectors (default false)
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/optim/detail/host_simd.hpp"
#include "trainkit/optim/detail/state_fields.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// Per-optimizer step state in the executor's memory space, written by the step prologue and
/// read by derive() and the passes.
struct StepHeader {
  double step;           ///< applied (not skipped) steps so far, this one included
  double own_sumsq;      ///< the optimizer's own gradient-norm pass (when no scaler measured it)
  float own_norm;        ///< sqrt(own_sumsq)
  float inv_loss_scale;  ///< this step's inverse loss scale (1 without a scaler or after unscale_)
  float clip_coef;       ///< this step's clip coefficient (1 without clipping)
  /// The global norm of the unscaled gradients this step, before clip_coef (0 if unknown): the
  /// gradients update() sees have the norm grad_norm * clip_coef (LAMB's max_grad_norm reads it).
  float grad_norm;
  std::int32_t skip;   ///< 1: this step was skipped (found_inf)
  std::int32_t first;  ///< 1: this is the first applied step
};

/// One entry of a rule's kSavedOptions: the state-dict key and the option member it holds.
template <class O, class M>
constexpr detail::StateField<O, M> saved_option(const char* key, M O::*member) {
  return detail::state_field(key, member);
}

namespace detail {

/// What FusedOptimizer reads from a rule, with the defaults of the optional members.
template <class Rule>
struct RuleTraits {
  using Options = typename Rule::Options;
  using Scalars = typename Rule::Scalars;
  static_assert(std::is_trivially_copyable_v<Options> && std::is_trivially_copyable_v<Scalars>,
                "optim rule: Options and Scalars travel as kernel arguments and must be "
                "trivially copyable");

  static constexpr int kMaxStates = static_cast<int>(Rule::kStates.size());
  static constexpr unsigned kVariants = [] {
    if constexpr (requires { Rule::kVariants; }) return Rule::kVariants;
    else return 1u;
  }();
  static constexpr bool kTrustRatio = requires(const Scalars& s) {
    { Rule::trust_ratio(s, 1.0f, 1.0f) } -> std::convertible_to<float>;
  };
  static constexpr bool kInlineUpdate = [] {
    if constexpr (requires { Rule::kInlineUpdate; }) return static_cast<bool>(Rule::kInlineUpdate);
    else return false;
  }();

  static unsigned variant(const Options& o) {
    if constexpr (requires { Rule::variant(o); }) return Rule::variant(o);
    else return 0;
  }
  static constexpr int num_states(unsigned v) {
    if constexpr (requires { Rule::num_states(v); }) return Rule::num_states(v);
    else return kMaxStates;
  }
  static constexpr DType state_dtype(unsigned v) {
    if constexpr (requires { Rule::state_dtype(v); }) return Rule::state_dtype(v);
    else return DType::kF32;
  }
  static std::uint64_t rounding_seed(const Options& o) {
    if constexpr (requires { Rule::rounding_seed(o); }) return Rule::rounding_seed(o);
    else return 0;
  }
  static void validate(const Options& o) {
    if constexpr (requires { Rule::validate(o); }) Rule::validate(o);
  }
  static bool needs_grad_norm(const Options& o) {
    if constexpr (requires { Rule::needs_grad_norm(o); }) return Rule::needs_grad_norm(o);
    else return false;
  }
  static constexpr auto saved_options() {
    if constexpr (requires { Rule::kSavedOptions; }) return Rule::kSavedOptions;
    else return std::tuple<>{};
  }
};

/// The element type of variant V's state buffers.
template <class Rule, unsigned V>
using StateStorage =
    std::conditional_t<RuleTraits<Rule>::state_dtype(V) == DType::kBF16, bf16, float>;

/// Calls f(std::integral_constant<unsigned, V>{}) for the V == v among 0 .. N - 1.
template <unsigned N, class F>
void dispatch_variant(unsigned v, F&& f) {
  [&]<unsigned... V>(std::integer_sequence<unsigned, V...>) {
    ((v == V ? (f(std::integral_constant<unsigned, V>{}), true) : false) || ...);
  }
  (std::make_integer_sequence<unsigned, N>{});
}

}  // namespace detail
}  // namespace optim
TRAINKIT_NAMESPACE_END
