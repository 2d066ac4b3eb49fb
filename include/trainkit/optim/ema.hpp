// SPDX-License-Identifier: MIT
// trainkit/optim/ema.hpp: `Ema`, an exponential moving average of a ParamArena's parameters
// (torch.optim.swa_utils.AveragedModel with get_ema_multi_avg_fn): one fused lerp over the flat
// parameter buffer per update, on the host pool or a CUDA stream, so evaluating with averaged
// weights costs one extra f32 copy of the parameters and no per-tensor launches.
#pragma once

#include <cstdint>

#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/optim/detail/state_fields.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

struct EmaOptions {
  double decay =
      0.999;  ///< ema = decay * ema + (1 - decay) * param, as a lerp with weight 1 - decay
};

namespace detail {
/// ema = lerp(ema, p, w) in PyTorch's f32 form (small weight: ema + w * (p - ema)).
struct EmaLerp {
  float* ema;
  const float* p;
  float w;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const {
    const float e = ema[i];
    const float x = p[i];
    ema[i] = (w < 0.5f && w > -0.5f) ? e + w * (x - e) : x - (x - e) * (1.0f - w);
  }
};
struct CopyF32 {
  float* dst;
  const float* src;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const { dst[i] = src[i]; }
};
}  // namespace detail

/// The averaged copy of all parameters of an arena (same layout, same memory space). The first
/// update() copies the parameters (AveragedModel with n_averaged == 0); later ones lerp towards
/// them. copy_to() writes the average into an arena (e.g. for evaluation; keep a copy of the
/// training weights yourself if you want them back). Move-only; the arena must outlive it.
template <Space S = Space::kHost>
class Ema {
 public:
  /// Throws unless the arena is finalized and 0 <= decay <= 1.
  explicit Ema(const nn::ParamArena<S>& arena, EmaOptions options = {})
      : arena_(&arena), options_(options) {
    TRAINKIT_CHECK(arena.finalized(), "optim::Ema: the ParamArena is not finalized");
    TRAINKIT_CHECK(options.decay >= 0.0 && options.decay <= 1.0,
                   "optim::Ema: decay must be in [0, 1], got ", options.decay);
    shadow_ = Tensor<float, S>(Shape{arena.buffer_numel()});
    copy_bytes(shadow_.data(), S, arena.params_data(), S, shadow_.bytes());
  }

  /// Folds the current parameters into the average (one pass; asynchronous on a CUDA stream).
  template <class E>
  void update(const E& exec) {
    static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                  "optim::Ema: a host arena needs exec::Host, a device arena exec::Cuda");
    const std::int64_t n = arena_->buffer_numel();
    if constexpr (S == Space::kHost) trainkit::detail::wait_for_snapshot_copies();
    if (num_updates_ == 0) {
      exec::launch(exec, n, detail::CopyF32{shadow_.data(), arena_->params_data()});
    } else {
      exec::launch(exec, n,
                   detail::EmaLerp{shadow_.data(), arena_->params_data(),
                                   static_cast<float>(1.0 - options_.decay)});
    }
    ++num_updates_;
  }

  /// Writes the averaged parameters into `arena` (which must have this arena's layout).
  template <class E>
  void copy_to(const E& exec, nn::ParamArena<S>& arena) const {
    TRAINKIT_CHECK(arena.buffer_numel() == arena_->buffer_numel() && arena.size() == arena_->size(),
                   "optim::Ema::copy_to: the arena has a different layout");
    if constexpr (S == Space::kHost) trainkit::detail::wait_for_snapshot_copies();
    exec::launch(exec, arena.buffer_numel(), detail::CopyF32{arena.params_data(), shadow_.data()});
  }

  /// The averaged parameters, flat, with the arena's layout.
  const float* data() const noexcept { return shadow_.data(); }
  std::int64_t num_updates() const noexcept { return num_updates_; }
  double decay() const noexcept { return options_.decay; }

  /// Tensors "<param>" (the averages, f32, host copies), values "n_averaged" and "decay".
  StateDict state_dict() const {
    StateDict sd;
    state_dict_into(sd);
    return sd;
  }
  /// state_dict() written into `sd` (empty, or what an earlier call wrote), reusing its tensors.
  void state_dict_into(StateDict& sd) const {
    StateDictRefill refill(sd);
    detail::save_by_param(refill, *arena_, shadow_.data(), DType::kF32, "");
    detail::set_values(sd, "n_averaged", num_updates_, "decay", options_.decay);
  }
  /// Throws naming the first missing, mis-shaped or unknown tensor (the average of a parameter
  /// this arena does not have: another model's state), or a "decay" outside [0, 1] or a
  /// negative "n_averaged" (nothing changed then).
  void load_state_dict(const StateDict& sd) {
    detail::check_by_param(sd, *arena_, DType::kF32, "", "optim::Ema::load_state_dict: ");
    for (const auto& entry : sd.tensors)
      TRAINKIT_CHECK(arena_->find(entry.first).has_value(),
                     "optim::Ema::load_state_dict: the state holds tensor '",
                     StateDict::shown(entry.first),
                     "', the average of a parameter this arena does not have (is it the state of "
                     "another model?)");
    const std::int64_t num_updates = sd.get_int("n_averaged");
    const double decay = sd.get_double("decay");
    TRAINKIT_CHECK(decay >= 0.0 && decay <= 1.0, "optim::Ema::load_state_dict: 'decay' is ", decay,
                   "; expected a number in [0, 1]");
    TRAINKIT_CHECK(num_updates >= 0, "optim::Ema::load_state_dict: 'n_averaged' is ", num_updates,
                   "; expected a count >= 0");
    detail::load_by_param(sd, *arena_, shadow_.data(), DType::kF32, "");
    num_updates_ = num_updates;
    options_.decay = decay;
  }

 private:
  const nn::ParamArena<S>* arena_;
  EmaOptions options_;
  Tensor<float, S> shadow_;
  std::int64_t num_updates_ = 0;
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
