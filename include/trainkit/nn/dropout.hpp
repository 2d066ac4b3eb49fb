// SPDX-License-Identifier: MIT
// trainkit/nn/dropout.hpp: inverted dropout whose mask is a pure function of (seed, step, site,
// element): element i is kept when philox_uniform(seed, rng_stream_id(step, site), i) >= p. So
// the mask is identical on CPU and GPU, independent of threads, and backward recomputes it
// instead of storing it (no mask memory, like PyTorch's fused CUDA dropout).
#pragma once

#include <cstdint>

#include "trainkit/amp/policy.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/layer.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

/// y[i] = x[i] * (keep(i) ? scale : 0), keep(i) = uniform(seed, stream, offset + i) >= p: a
/// dropped inf or NaN stays NaN, as torch's x * mask does (a gradient overflow stays visible).
/// Draws 4 uniforms per Philox block; each element uses word (offset + i) % 4 of its block.
template <class T, bool Accumulate>
struct DropoutApply {
  const T* x;
  T* y;
  std::uint64_t seed;
  std::uint64_t stream;
  float p;
  float scale;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const {
    const bool keep = p <= 0.0f || philox_uniform(seed, stream, static_cast<std::uint64_t>(i)) >= p;
    float v = load(x[i]) * (keep ? scale : 0.0f);
    if constexpr (Accumulate) v += load(y[i]);
    y[i] = store<T>(v);
  }
};

/// The one check of a dropout probability (nn::Dropout's p, and the options that become one, such
/// as GptOptions::dropout, checked before anything is built): p in [0, 1], NaN refused. `who` and
/// `option` name the setting in the message.
inline void check_dropout_probability(float p, const char* who, const char* option) {
  TRAINKIT_CHECK(p >= 0.0f && p <= 1.0f, who, ": ", option, " ", p,
                 " is not a probability in [0, 1]");
}

}  // namespace detail

/// Options of nn::Dropout.
struct DropoutOptions {
  /// Probability of zeroing an element, in [0, 1].
  float p = 0.1f;
  /// Key of the mask generator (the run's seed).
  std::uint64_t seed = 0;
  /// Distinguishes this dropout layer from others drawing at the same step.
  std::uint32_t site = 0;
};

/// Inverted dropout (torch.nn.Dropout): in training y = x * mask / (1 - p), mask_i ~ Bernoulli(1-p)
/// keyed by (seed, step, site, i); in eval (or p == 0) y = x. p == 1 gives zeros.
/// Shapes: any rank, x and y alike (contiguous; element i is the row-major index).
/// Set the step before each forward (`set_step`): the mask changes with it, and backward must
/// see the same step as its forward. backward reads dy only: dx = dy * mask / (1 - p).
class Dropout {
 public:
  Dropout() = default;
  explicit Dropout(DropoutOptions options) : options_(options) {
    detail::check_dropout_probability(options.p, "nn::Dropout", "p");
  }

  std::int64_t out_features(std::int64_t in) const noexcept { return in; }

  /// Training mode (the default) drops; eval mode is the identity.
  void train(bool on = true) noexcept { training_ = on; }
  void eval() noexcept { training_ = false; }
  bool training() const noexcept { return training_; }
  /// The step the next forward/backward draws its mask for.
  void set_step(std::uint32_t step) noexcept { step_ = step; }
  std::uint32_t step() const noexcept { return step_; }
  const DropoutOptions& options() const noexcept { return options_; }

  /// The mask is keyed by (seed, step, site): the step and training flag are saved; p, seed and
  /// site come from the model's construction and are checked on load.
  StateDict state_dict() const {
    StateDict sd;
    sd.set("p", static_cast<double>(options_.p));
    sd.set_u64("seed", options_.seed);
    sd.set_u64("site", options_.site);
    sd.set_u64("step", step_);
    sd.set("training", training_);
    return sd;
  }
  void load_state_dict(const StateDict& sd) {
    const char* who = "restoring nn::Dropout";
    check_saved_setting<double>(who, "p", sd.get_double("p"), double(options_.p));
    check_saved_setting<std::uint64_t>(who, "seed", sd.get_u64("seed"), options_.seed);
    check_saved_setting<std::uint64_t>(who, "site", sd.get_u64("site"), options_.site);
    const std::uint64_t step = sd.get_u64("step");
    TRAINKIT_CHECK(step <= 0xffffffffu, who, ": step ", step, " does not fit 32 bits");
    step_ = static_cast<std::uint32_t>(step);
    training_ = sd.get_int("training") != 0;
  }

  /// True when element i is kept at the current step (what the mask is; for tests).
  bool kept(std::int64_t i) const noexcept {
    return philox_uniform(options_.seed, rng_stream_id(step_, options_.site),
                          static_cast<std::uint64_t>(i)) >= options_.p;
  }

  template <amp::Policy P = amp::Fp32, class E, class TX, class TY, int R, Space S>
  void forward(const E& exec, TensorView<TX, R, S> x, TensorView<TY, R, S> y) const {
    apply<P>("nn::Dropout::forward", exec, x, y, Write::kOverwrite);
  }

  /// dx = dy * mask / (1 - p) (or dx += ..., Write::kAccumulate). `x` is unused (kept for
  /// the uniform layer signature).
  template <amp::Policy P = amp::Fp32, class E, class TX, class TD, class TG, int R, Space S>
  void backward(const E& exec, TensorView<TX, R, S> /*x*/, TensorView<TD, R, S> dy,
                TensorView<TG, R, S> dx, Write mode = Write::kOverwrite) const {
    if (detail::absent(dx)) return;
    apply<P>("nn::Dropout::backward", exec, dy, dx, mode);
  }

 private:
  template <class P, class E, class TX, class TY, int R, Space S>
  void apply(const char* who, const E& exec, TensorView<TX, R, S> x, TensorView<TY, R, S> y,
             Write mode) const {
    using T = std::remove_const_t<TX>;
    detail::check_call<P, E, S, TX, TY>();
    static_assert(std::is_same_v<T, TY>, "trainkit::nn::Dropout: x and y need one element type");
    detail::check_same_shape(who, "input", x, "output", y);
    const bool identity = !training_ || options_.p == 0.0f;
    const float p = identity ? 0.0f : options_.p;
    const float scale = p >= 1.0f ? 0.0f : 1.0f / (1.0f - p);
    // Identity (eval or p == 0): the functor sees p = -1, keeps everything and draws nothing.
    const std::uint64_t stream = rng_stream_id(step_, options_.site);
    detail::with_write_mode(mode, [&](auto accumulate) {
      exec::launch(exec, x.numel(),
                   detail::DropoutApply<T, decltype(accumulate)::value>{
                       x.data(), y.data(), options_.seed, stream, identity ? -1.0f : p, scale});
    });
  }

  DropoutOptions options_{};
  std::uint32_t step_ = 0;
  bool training_ = true;
};

}  // namespace nn
TRAINKIT_NAMESPACE_END
