// SPDX-License-Identifier: MIT
// trainkit/optim/grad_scaler.hpp: loss scalers for f16 training. `DynamicScaler` (alias
// `GradScaler`) is PyTorch's torch.amp.GradScaler with the same numbers and state_dict; its scale,
// growth tracker and found_inf flag live in the executor's memory (device memory for exec::Cuda),
// its update is a one-thread kernel and the fused optimizers read the flag themselves, so a step
// never waits for the GPU. `StaticScaler` keeps a fixed scale. The "no scaling" tag `NoScaler`
// is in amp/scaler_fwd.hpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include "trainkit/amp/scaler_fwd.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/allocator.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/exec/reduce.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/grad_norm.hpp"
#include "trainkit/core/state_dict.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// What an optimizer step reads from a loss scaler: pointers into the scaler's memory (device
/// memory for a CUDA scaler), never values, so reading them needs no host sync.
struct ScalerView {
  const float* inv_scale = nullptr;  ///< multiply each gradient by *inv_scale; null: no unscale
  const float* found_inf = nullptr;  ///< skip the step when *found_inf != 0; null: never skip
  const float* grad_norm = nullptr;  ///< L2 norm of the unscaled gradients; null: not computed
};

/// torch.amp.GradScaler's constructor arguments, with its defaults.
struct DynamicScalerOptions {
  double init_scale = 65536.0;          ///< 2^16
  double growth_factor = 2.0;           ///< > 1
  double backoff_factor = 0.5;          ///< < 1
  std::int64_t growth_interval = 2000;  ///< clean steps before the scale grows, >= 1
  bool enabled = true;  ///< false: scale 1, no checks, no skipping (PyTorch's enabled)
};

namespace detail {

/// A scaler's state, in the scaler's memory space.
struct ScalerBlock {
  double grad_sumsq;            ///< squared L2 norm of the unscaled gradients (last check)
  float scale;                  ///< the loss scale
  float inv_scale;              ///< float(1 / double(scale)), as GradScaler.unscale_ computes it
  float found_inf;              ///< 1 when the last check saw an inf/NaN gradient, else 0
  float grad_norm;              ///< sqrt(grad_sumsq)
  std::int32_t growth_tracker;  ///< clean steps since the last growth or backoff
  std::int32_t pad;
};

/// True when `scale` converted to float is finite and at least FLT_MIN (the smallest normal
/// float, about 1.2e-38), so that 1 / scale is a finite float too.
inline bool is_usable_scale(double scale) {
  return scale > 0.0 && scale <= std::numeric_limits<float>::max() &&
         static_cast<float>(scale) >= std::numeric_limits<float>::min();
}

/// The terms of the scaler's passes over the gradients (kWrite: unscale_, which also writes
/// g * inv in f32 like _amp_foreach_non_finite_check_and_unscale_; otherwise the read-only check
/// of a step without unscale_). `inv` is the f32 inverse scale: read in the kernel on the device
/// (inv_ptr), once before the pass on the host (inv_value).
///
/// A finite inv: the term is (double(g) * inv)^2, exact, so the sum is non-finite exactly when
/// some g is, and it is the squared norm of the unscaled gradients. An inv that overflowed to
/// inf (scale below ~2.9e-39, or 0): PyTorch still sets found_inf only from the incoming
/// gradients, while every unscaled gradient is inf or NaN (0 * inf, NaN * inf). The term is
/// then NaN for a NaN g, +inf for an infinite g, -inf for a zero g (unscaled to NaN) and 0 for
/// the others (unscaled to +-inf), so that the sum is NaN (a NaN g, or an infinite and a zero
/// one), +inf, -inf or 0, and FinishCheck reads found_inf (NaN or +inf) and the norm (inf, or
/// NaN when an unscaled gradient is NaN) off it. The padding counts 0 and stays 0.
template <bool kWrite>
struct ScalerTerm {
  float* g;
  const float* inv_ptr;
  float inv_value;
  nn::PaddingMask mask;

  TRAINKIT_HOST_DEVICE double operator()(std::int64_t i) const {
    const float inv = inv_ptr != nullptr ? *inv_ptr : inv_value;
    return inv - inv == 0.0f ? finite(i, inv) : overflowed(i, inv);
  }
  TRAINKIT_HOST_DEVICE double finite(std::int64_t i, float inv) const {
    const float x = g[i];
    if constexpr (kWrite) g[i] = x * inv;
    const double d = static_cast<double>(x) * static_cast<double>(inv);
    return d * d;
  }
  TRAINKIT_HOST_DEVICE double overflowed(std::int64_t i, float inv) const {
    if (!mask.real(i)) {
      if constexpr (kWrite) g[i] = 0.0f;
      return 0.0;
    }
    const float x = g[i];
    const float y = x * inv;  // +-inf, or NaN for a zero or NaN x
    if constexpr (kWrite) g[i] = y;
    if (x != x) return static_cast<double>(x);              // NaN
    if (y != y) return -static_cast<double>(inv);           // a zero x: -inf
    return x - x == 0.0f ? 0.0 : static_cast<double>(inv);  // finite: 0, infinite: +inf
  }
};

/// found_inf and grad_norm from the reduction's sum (ScalerTerm; x - x is 0 exactly for finite x).
struct FinishCheck {
  ScalerBlock* b;
  bool has_elements;  ///< the arena has parameter elements (an all-inf norm needs one)
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t) const {
    const double s = b->grad_sumsq;
    const float inv = b->inv_scale;
    if (inv - inv == 0.0f) {
      b->found_inf = (s - s == 0.0) ? 0.0f : 1.0f;
      b->grad_norm = static_cast<float>(sqrt(s));
    } else {
      // See ScalerTerm: NaN or +inf when an incoming gradient was not finite; NaN or -inf when
      // an unscaled one is NaN (inv * 0 is NaN here, inv itself +inf).
      b->found_inf = (s != s || s > 0.0) ? 1.0f : 0.0f;
      b->grad_norm = (s != s || s < 0.0) ? inv * 0.0f : (has_elements ? inv : 0.0f);
    }
  }
};

/// PyTorch's _amp_update_scale_ (aten AmpGradScalerKernels.cpp), then the new inverse scale.
struct UpdateScale {
  ScalerBlock* b;
  double growth_factor;
  double backoff_factor;
  std::int64_t growth_interval;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t) const {
    if (b->found_inf != 0.0f) {
      b->scale = static_cast<float>(static_cast<double>(b->scale) * backoff_factor);
      b->growth_tracker = 0;
    } else {
      const std::int64_t successful = static_cast<std::int64_t>(b->growth_tracker) + 1;
      if (successful == growth_interval) {
        const float grown = static_cast<float>(static_cast<double>(b->scale) * growth_factor);
        if (grown - grown == 0.0f) b->scale = grown;  // never grows to inf
        b->growth_tracker = 0;
      } else {
        b->growth_tracker = static_cast<std::int32_t>(successful);
      }
    }
    b->inv_scale = static_cast<float>(1.0 / static_cast<double>(b->scale));
  }
};

/// Sets scale and inv_scale (update(new_scale), load_state_dict).
struct SetScale {
  ScalerBlock* b;
  float scale;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t) const {
    b->scale = scale;
    b->inv_scale = static_cast<float>(1.0 / static_cast<double>(scale));
  }
};

/// The memory and the passes shared by DynamicScaler and StaticScaler, plus PyTorch's per-step
/// stage machine (unscale_ at most once, step once, then update).
class ScalerCore {
 public:
  enum class Stage : std::uint8_t { kReady, kUnscaled, kStepped };

  TRAINKIT_INLINE ScalerCore(Space space, float init_scale);

  Space space() const noexcept { return space_; }
  ScalerBlock* block() const noexcept { return static_cast<ScalerBlock*>(memory_.get()); }
  Stage stage() const noexcept { return stage_; }
  void set_stage(Stage s) noexcept { stage_ = s; }

  /// The block's current contents (on the device: waits for the GPU).
  ScalerBlock read() const {
    ScalerBlock b{};
    copy_bytes(&b, Space::kHost, block(), space_, sizeof b);
    return b;
  }
  void write(const ScalerBlock& b) { copy_bytes(block(), space_, &b, Space::kHost, sizeof b); }

  template <class E, Space S>
  void check_arena(const char* what, const nn::ParamArena<S>& arena) const {
    static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                  "amp scaler: a host ParamArena needs exec::Host, a device ParamArena exec::Cuda");
    TRAINKIT_CHECK(S == space_, "amp scaler ", what, ": the scaler lives in ", space_name(space_),
                   " memory but the ParamArena in ", space_name(S),
                   " memory; construct the scaler with the arena's executor");
    TRAINKIT_CHECK(arena.finalized(), "amp scaler ", what, ": the ParamArena is not finalized");
  }

  /// Read-only pass: found_inf and the norm of the gradients times inv_scale.
  template <class E, Space S>
  void check(const E& exec, const nn::ParamArena<S>& arena) {
    check_arena<E, S>("check", arena);
    pass<false>(exec, arena, const_cast<float*>(arena.grads_data()));
  }

  /// The fused pass: gradients *= inv_scale in place, found_inf, and their norm.
  template <class E, Space S>
  void unscale(const E& exec, nn::ParamArena<S>& arena) {
    check_arena<E, S>("unscale_", arena);
    pass<true>(exec, arena, arena.grads_data());
  }

 private:
  template <bool kWrite, class E, Space S>
  void pass(const E& exec, const nn::ParamArena<S>& arena, float* grads) {
    ScalerBlock* b = block();
    const std::int64_t n = arena.buffer_numel();
    ScalerTerm<kWrite> term{grads, nullptr, 1.0f, arena.padding_mask()};
    if constexpr (S == Space::kHost) {
      // The branch of ScalerTerm taken once for the whole pass.
      const float inv = b->inv_scale;
      term.inv_value = inv;
      if (inv - inv == 0.0f) {
        detail::sum_into(
            exec, n, [term, inv](std::int64_t i) { return term.finite(i, inv); }, &b->grad_sumsq);
      } else {
        detail::sum_into(
            exec, n, [term, inv](std::int64_t i) { return term.overflowed(i, inv); },
            &b->grad_sumsq);
      }
    } else {
      term.inv_ptr = &b->inv_scale;
      detail::sum_into(exec, n, term, &b->grad_sumsq);
    }
    exec::launch(exec, 1, FinishCheck{b, arena.num_parameters() > 0});
  }

  Space space_;
  Allocation memory_;
  Stage stage_ = Stage::kReady;
};

template <class E>
constexpr Space space_of() {
  static_assert(exec::Executor<E>, "amp scaler: construct it with an exec::Host or exec::Cuda");
  return exec::is_host_executor_v<E> ? Space::kHost : Space::kDevice;
}

#if TRAINKIT_IMPL

TRAINKIT_INLINE ScalerCore::ScalerCore(Space space, float init_scale)
    : space_(space),
      memory_(sizeof(ScalerBlock),
              space == Space::kHost ? MemoryKind::kHost : MemoryKind::kDevice) {
  ScalerBlock b{};
  b.scale = init_scale;
  b.inv_scale = static_cast<float>(1.0 / static_cast<double>(init_scale));
  write(b);
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// PyTorch's torch.amp.GradScaler: dynamic loss scaling. Per step: multiply the loss gradient by
/// the scale (scale_data(), a pointer in the scaler's memory), run backward, optionally
/// `unscale_` (to clip or inspect gradients), `opt.step(exec, scaler)` (checks for inf/NaN and
/// skips the update on the device when it finds one; unscales in the optimizer's pass when
/// unscale_ was not called), then `update(exec)`: backoff x0.5 and tracker reset after an
/// overflow, x2 growth after growth_interval clean steps (never to inf). No host sync anywhere.
/// One scaler serves one ParamArena per step. Host scalers live in host memory, CUDA scalers in
/// device memory; both work with the ParamArena of the same space. Move-only.
class DynamicScaler {
 public:
  static constexpr bool scales_loss = true;
  static constexpr bool dynamic = true;

  /// A scaler in the memory of `exec` (host memory for exec::Host, device memory on the current
  /// device for exec::Cuda). Throws for growth_factor <= 1, backoff_factor >= 1,
  /// growth_interval outside 1 .. 2^31 - 1, or an init_scale that is not a float in
  /// [1.2e-38, 3.4e38] (FLT_MIN to FLT_MAX).
  template <class E>
  explicit DynamicScaler(const E&, DynamicScalerOptions options = {})
      : options_(validated(options)),
        core_(detail::space_of<E>(),
              static_cast<float>(options.enabled ? options.init_scale : 1.0)) {}

  DynamicScaler(DynamicScaler&&) noexcept = default;
  DynamicScaler& operator=(DynamicScaler&&) noexcept = default;

  bool enabled() const noexcept { return options_.enabled; }
  Space space() const noexcept { return core_.space(); }
  const DynamicScalerOptions& options() const noexcept { return options_; }

  /// The loss scale (f32) in the scaler's memory: multiply the loss gradient by it (on the
  /// device, without reading it back).
  const float* scale_data() const noexcept { return &core_.block()->scale; }
  /// The found_inf flag (0 or 1, f32) of the last check, in the scaler's memory.
  const float* found_inf_data() const noexcept { return &core_.block()->found_inf; }

  /// The current scale (reads device memory: a host sync for a CUDA scaler). 1 when disabled.
  float scale() const { return core_.read().scale; }
  /// The growth tracker (clean steps since the last change).
  std::int32_t growth_tracker() const { return core_.read().growth_tracker; }
  /// True when the last check found an inf/NaN gradient (in the gradients as they came in).
  bool found_inf() const { return core_.read().found_inf != 0.0f; }

  /// PyTorch's unscale_: in one pass multiplies every gradient by 1/scale, sets found_inf and
  /// measures the norm of the unscaled gradients (deterministic reduction), returned for
  /// clip_grad_norm_ (it points into the scaler: valid until the next check). As PyTorch's,
  /// found_inf looks at the incoming gradients only: when 1/scale overflows to inf (scale below
  /// ~2.9e-39, or 0) finite gradients become inf (NaN for 0) and the step is not skipped. A
  /// disabled scaler leaves the gradients as they are and returns their norm (grad_norm, one read
  /// pass), so that `clip_grad_norm_(exec, arena, max_norm, scaler.unscale_(exec, arena))` clips
  /// with and without loss scaling alike, as PyTorch's unscale_ + clip_grad_norm_ do. Throws
  /// when called twice before update() or after step.
  template <class E, Space S>
  GradNorm unscale_(const E& exec, nn::ParamArena<S>& arena) {
    using Stage = detail::ScalerCore::Stage;
    TRAINKIT_CHECK(core_.stage() != Stage::kUnscaled,
                   "DynamicScaler::unscale_() has already been called since the last update()");
    TRAINKIT_CHECK(core_.stage() != Stage::kStepped,
                   "DynamicScaler::unscale_() is being called after step()");
    if (!enabled()) {
      core_.check_arena<E, S>("unscale_", arena);
      GradNorm norm = grad_norm(exec, arena);
      core_.set_stage(Stage::kUnscaled);
      return norm;
    }
    core_.unscale(exec, arena);
    core_.set_stage(Stage::kUnscaled);
    return GradNorm(&core_.block()->grad_norm, space());
  }

  /// For optimizers (step(exec, scaler) calls it): checks the gradients for inf/NaN (a read-only
  /// pass) unless unscale_ did, and says what the optimizer must multiply by and read.
  template <class E, Space S>
  ScalerView prepare_step(const E& exec, const nn::ParamArena<S>& arena) {
    using Stage = detail::ScalerCore::Stage;
    TRAINKIT_CHECK(core_.stage() != Stage::kStepped,
                   "DynamicScaler: step() has already been called since the last update()");
    if (!enabled()) return {};
    detail::ScalerBlock* b = core_.block();
    if (core_.stage() == Stage::kReady) {
      core_.check(exec, arena);
      return {&b->inv_scale, &b->found_inf, &b->grad_norm};
    }
    return {nullptr, &b->found_inf, &b->grad_norm};
  }
  /// For optimizers: records that the step happened (the next is update()).
  void mark_stepped() noexcept { core_.set_stage(detail::ScalerCore::Stage::kStepped); }

  /// PyTorch's update(): one-thread kernel applying the backoff/growth rule to the scale and
  /// tracker from found_inf, then ready for the next step. Throws when no step or unscale_ has
  /// checked the gradients since the last update.
  template <class E>
  void update(const E& exec) {
    static_assert(exec::Executor<E>, "DynamicScaler::update: pass an exec::Host or exec::Cuda");
    if (!enabled()) {
      core_.set_stage(detail::ScalerCore::Stage::kReady);
      return;
    }
    TRAINKIT_CHECK(core_.stage() != detail::ScalerCore::Stage::kReady,
                   "DynamicScaler::update(): no inf checks were recorded prior to update "
                   "(call opt.step(exec, scaler) or unscale_ first)");
    exec::launch(exec, 1,
                 detail::UpdateScale{core_.block(), options_.growth_factor, options_.backoff_factor,
                                     options_.growth_interval});
    core_.set_stage(detail::ScalerCore::Stage::kReady);
  }

  /// PyTorch's update(new_scale): sets the scale instead (tracker unchanged). 0 is accepted, as
  /// there (every inverse scale is then inf); a negative or NaN scale throws.
  template <class E>
  void update(const E& exec, double new_scale) {
    static_assert(exec::Executor<E>, "DynamicScaler::update: pass an exec::Host or exec::Cuda");
    if (!enabled()) return;
    TRAINKIT_CHECK(new_scale >= 0.0 && new_scale <= std::numeric_limits<float>::max(),
                   "DynamicScaler::update: new_scale must be >= 0 and a finite float (<= 3.4e38), "
                   "got ",
                   new_scale);
    exec::launch(exec, 1, detail::SetScale{core_.block(), static_cast<float>(new_scale)});
    core_.set_stage(detail::ScalerCore::Stage::kReady);
  }

  /// PyTorch's five keys: scale, growth_factor, backoff_factor, growth_interval,
  /// _growth_tracker. Empty when disabled. Reads device memory (sync); call it after update().
  TRAINKIT_INLINE StateDict state_dict() const;

  /// Restores a state_dict(). A scale of 0 loads, as in PyTorch (backoff can reach it; the
  /// inverse scale is then inf, see unscale_). Throws for an empty state dict (saved from a
  /// disabled scaler), missing keys, a negative or NaN scale, and when this scaler is disabled.
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd);

 private:
  TRAINKIT_INLINE static DynamicScalerOptions validated(const DynamicScalerOptions& o);

  DynamicScalerOptions options_;
  detail::ScalerCore core_;
};

/// The name the precision policies use: `amp::Precision<amp::Fp16, optim::GradScaler>`.
using GradScaler = DynamicScaler;

/// A fixed loss scale (apex's static loss scaling): gradients are unscaled and a step with an
/// inf/NaN gradient is skipped, but the scale never changes. Same protocol as DynamicScaler
/// (update() only ends the step). state_dict: {"scale"}.
class StaticScaler {
 public:
  static constexpr bool scales_loss = true;
  static constexpr bool dynamic = false;

  /// Throws unless scale, converted to float, is finite and >= FLT_MIN (1.2e-38 <= scale <=
  /// 3.4e38), so that its inverse is finite too.
  template <class E>
  StaticScaler(const E&, double scale) : core_(detail::space_of<E>(), checked(scale)) {}

  Space space() const noexcept { return core_.space(); }
  const float* scale_data() const noexcept { return &core_.block()->scale; }
  const float* found_inf_data() const noexcept { return &core_.block()->found_inf; }
  float scale() const { return core_.read().scale; }
  bool found_inf() const { return core_.read().found_inf != 0.0f; }

  template <class E, Space S>
  GradNorm unscale_(const E& exec, nn::ParamArena<S>& arena) {
    TRAINKIT_CHECK(core_.stage() == detail::ScalerCore::Stage::kReady,
                   "StaticScaler::unscale_() called twice or after step() before update()");
    core_.unscale(exec, arena);
    core_.set_stage(detail::ScalerCore::Stage::kUnscaled);
    return GradNorm(&core_.block()->grad_norm, space());
  }
  template <class E, Space S>
  ScalerView prepare_step(const E& exec, const nn::ParamArena<S>& arena) {
    TRAINKIT_CHECK(core_.stage() != detail::ScalerCore::Stage::kStepped,
                   "StaticScaler: step() has already been called since the last update()");
    detail::ScalerBlock* b = core_.block();
    if (core_.stage() == detail::ScalerCore::Stage::kReady) {
      core_.check(exec, arena);
      return {&b->inv_scale, &b->found_inf, &b->grad_norm};
    }
    return {nullptr, &b->found_inf, &b->grad_norm};
  }
  void mark_stepped() noexcept { core_.set_stage(detail::ScalerCore::Stage::kStepped); }
  /// Ends the step (the scale stays).
  template <class E>
  void update(const E&) {
    core_.set_stage(detail::ScalerCore::Stage::kReady);
  }

  StateDict state_dict() const {
    StateDict sd;
    sd.set("scale", static_cast<double>(core_.read().scale));
    return sd;
  }
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd);

 private:
  static float checked(double scale) {
    TRAINKIT_CHECK(detail::is_usable_scale(scale),
                   "StaticScaler: scale must be a finite float >= 1.2e-38 (FLT_MIN, so that its "
                   "inverse is finite) and <= 3.4e38, got ",
                   scale);
    return static_cast<float>(scale);
  }

  detail::ScalerCore core_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE StateDict DynamicScaler::state_dict() const {
  StateDict sd;
  if (!enabled()) return sd;
  const detail::ScalerBlock b = core_.read();
  sd.set("scale", static_cast<double>(b.scale));
  sd.set("growth_factor", options_.growth_factor);
  sd.set("backoff_factor", options_.backoff_factor);
  sd.set("growth_interval", options_.growth_interval);
  sd.set("_growth_tracker", std::int64_t{b.growth_tracker});
  return sd;
}

TRAINKIT_INLINE void DynamicScaler::load_state_dict(const StateDict& sd) {
  TRAINKIT_CHECK(enabled(), "DynamicScaler::load_state_dict on a disabled scaler");
  TRAINKIT_CHECK(!sd.empty(),
                 "DynamicScaler::load_state_dict: the state dict is empty, "
                 "possibly because it was saved from a disabled scaler");
  DynamicScalerOptions o = options_;
  o.growth_factor = sd.get_double("growth_factor");
  o.backoff_factor = sd.get_double("backoff_factor");
  o.growth_interval = sd.get_int("growth_interval");
  try {  // the message says the state holds the bad setting, not this scaler's options
    o = validated(o);
  } catch (const Error& e) {
    std::string_view why = e.what();
    if (why.starts_with("trainkit: DynamicScaler: ")) why.remove_prefix(25);
    TRAINKIT_FAIL("DynamicScaler::load_state_dict: the state's settings are not valid (", why, ")");
  }
  detail::ScalerBlock b = core_.read();
  const double scale = sd.get_double("scale");
  TRAINKIT_CHECK(scale >= 0.0 && scale <= std::numeric_limits<float>::max(),
                 "DynamicScaler::load_state_dict: 'scale' is ", scale,
                 ", expected a number >= 0 that is a finite float (<= 3.4e38)");
  // The clean steps since the last change of scale: at or past the interval (or negative) the
  // scale would not grow again for a very long time.
  const std::int64_t tracker = sd.get_int("_growth_tracker");
  TRAINKIT_CHECK(tracker >= 0 && tracker < o.growth_interval,
                 "DynamicScaler::load_state_dict: '_growth_tracker' is ", tracker,
                 ", expected 0 to growth_interval - 1 = ", o.growth_interval - 1);
  options_ = o;
  b.scale = static_cast<float>(scale);
  b.inv_scale = static_cast<float>(1.0 / static_cast<double>(b.scale));
  b.growth_tracker = static_cast<std::int32_t>(tracker);
  core_.write(b);
  core_.set_stage(detail::ScalerCore::Stage::kReady);
}

TRAINKIT_INLINE DynamicScalerOptions DynamicScaler::validated(const DynamicScalerOptions& o) {
  TRAINKIT_CHECK(o.growth_factor > 1.0, "DynamicScaler: growth_factor must be > 1, got ",
                 o.growth_factor);
  TRAINKIT_CHECK(o.backoff_factor < 1.0 && o.backoff_factor > 0.0,
                 "DynamicScaler: backoff_factor must be in (0, 1), got ", o.backoff_factor);
  TRAINKIT_CHECK(o.growth_interval >= 1 && o.growth_interval <= 0x7fffffff,
                 "DynamicScaler: growth_interval must be in 1 .. 2^31 - 1 (2147483647), got ",
                 o.growth_interval);
  TRAINKIT_CHECK(detail::is_usable_scale(o.init_scale),
                 "DynamicScaler: init_scale must be a finite float >= 1.2e-38 (FLT_MIN, so that "
                 "its inverse is finite) and <= 3.4e38, got ",
                 o.init_scale);
  return o;
}

TRAINKIT_INLINE void StaticScaler::load_state_dict(const StateDict& sd) {
  detail::ScalerBlock b = core_.read();
  const double scale = sd.get_double("scale");
  TRAINKIT_CHECK(detail::is_usable_scale(scale), "StaticScaler::load_state_dict: 'scale' is ",
                 scale,
                 ", expected a finite float >= 1.2e-38 (FLT_MIN, so that its inverse is finite) "
                 "and <= 3.4e38");
  b.scale = static_cast<float>(scale);
  b.inv_scale = static_cast<float>(1.0 / static_cast<double>(b.scale));
  core_.write(b);
  core_.set_stage(detail::ScalerCore::Stage::kReady);  // a new step begins, as DynamicScaler's
}

#endif  // TRAINKIT_IMPL

}  // namespace optim
TRAINKIT_NAMESPACE_END
