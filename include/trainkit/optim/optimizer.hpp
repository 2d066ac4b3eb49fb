// SPDX-License-Identifier: MIT
// trainkit/optim/optimizer.hpp: `FusedOptimizer<Rule, S>`, the one optimizer class; SGD, AdamW,
// LAMB (and any rule written as in docs/optimizers.md) are instantiations of it with a rule
// (optim/rule.hpp). A step is a one-thread "prologue" that reads the loss scaler's found_inf flag
// and inverse scale, advances the step counter (not on a skipped step, as GradScaler skips
// optimizer.step()), and derives the per-group scalars (rule.derive, clip coefficient) in the
// executor's memory; then ONE pass over the whole ParamArena (Host: thread pool over fixed
// chunks, VecF body; CUDA: one multi_tensor_apply) that unscales each gradient as it reads it
// and does nothing when the step is skipped. No value ever travels back to the host, so a CUDA
// step never waits for the GPU. Rules with a per-tensor trust ratio get three passes instead.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/amp/scaler_fwd.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/exec/multi_tensor_apply.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/detail/fused_pass.hpp"
#include "trainkit/optim/detail/state_fields.hpp"
#include "trainkit/optim/grad_norm.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/optim/rule.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// Clip the gradients by their global L2 norm inside the optimizer's pass (PyTorch's
/// clip_grad_norm_ folded into the step: each gradient is multiplied by
/// min(1, max_norm / (norm + 1e-6)) as it is read, so clipping costs no extra pass over the
/// gradients). max_norm <= 0: no clipping.
struct ClipGradNorm {
  double max_norm = 0.0;
  /// Also compute the global norm when nothing needs it (no clipping, no scaler that computes
  /// it), so StepResult::grad_norm can be logged: one extra read pass over the gradients.
  bool report_norm = false;
};

/// What one step computed, as handles into the executor's memory: nothing is read back unless
/// asked (on a device arena each read waits for the GPU). Valid until the next step.
struct StepResult {
  /// Global L2 norm of the unscaled gradients when the step computed it (clipping, a loss
  /// scaler's check, or ClipGradNorm::report_norm); an empty handle otherwise.
  GradNorm grad_norm;
  /// The loss scaler's inf/NaN flag for this step (null without a scaler).
  const float* found_inf = nullptr;
  Space space = Space::kHost;

  /// True when the step changed nothing because the gradients held inf/NaN (reads the flag:
  /// a sync on the device). Always false without a loss scaler.
  bool skipped() const {
    return found_inf != nullptr && read_value(found_inf, space, "optim::StepResult") != 0.0f;
  }
};

/// What one fused step reads, as pointers in the executor's memory space (never values: reading
/// them on the host would be a sync). All may be null.
struct StepInputs {
  const float* inv_scale = nullptr;  ///< gradients are multiplied by *inv_scale
  const float* found_inf = nullptr;  ///< *found_inf != 0: the step changes nothing
  const float* grad_norm = nullptr;  ///< global norm of the unscaled gradients
  float max_norm = 0.0f;             ///< > 0: clip by global norm using *grad_norm
};

namespace detail {

/// One contiguous range [begin, end) of the arena's buffers updated with group `group`'s
/// scalars. `param` is the parameter index for per-parameter segments, -1 for merged runs.
struct Segment {
  std::int64_t begin;
  std::int64_t end;
  std::int32_t group;
  std::int32_t param;
};

/// Segments covering the parameters' elements, never the alignment padding after them (which
/// thus stays zero whatever the gradients and the clip coefficient hold). Merged: maximal runs
/// of consecutive parameters of the same group with no padding between them (fewer CUDA table
/// entries and longer host loops); otherwise one per parameter (per-tensor trust ratios).
template <Space S>
std::vector<Segment> make_segments(const nn::ParamArena<S>& arena, const std::vector<int>& group,
                                   bool merge) {
  std::vector<Segment> segments;
  const auto& infos = arena.infos();
  for (std::size_t p = 0; p < infos.size(); ++p) {
    const std::int64_t begin = infos[p].offset;
    const std::int64_t end = begin + infos[p].numel;
    if (merge && !segments.empty() && segments.back().group == group[p] &&
        segments.back().end == begin) {
      segments.back().end = end;
      continue;
    }
    if (end > begin)
      segments.push_back({begin, end, group[p], merge ? -1 : static_cast<std::int32_t>(p)});
  }
  return segments;
}

/// Elements per task of the host passes. Fixed (never derived from the thread count), so every
/// element is always computed by the same code path (vector body or scalar tail): the bits do
/// not depend on the number of threads.
inline constexpr std::int64_t kHostChunk = std::int64_t{1} << 15;

/// Runs body(segment, begin, end) over every (segment ∩ chunk) of [0, total) on the pool.
template <class Body>
void for_each_segment_range(const exec::Host& host, const std::vector<Segment>& segments,
                            std::int64_t total, const Body& body) {
  if (total <= 0 || segments.empty()) return;
  const std::int64_t tasks = (total + kHostChunk - 1) / kHostChunk;
  host.parallel_for(tasks, [&](std::int64_t task) {
    const std::int64_t b = task * kHostChunk;
    const std::int64_t e = std::min(total, b + kHostChunk);
    auto it = std::upper_bound(segments.begin(), segments.end(), b,
                               [](std::int64_t x, const Segment& s) { return x < s.end; });
    for (; it != segments.end() && it->begin < e; ++it) {
      const std::int64_t sb = std::max(b, it->begin);
      const std::int64_t se = std::min(e, it->end);
      if (sb < se) body(*it, sb, se);
    }
  });
}

/// The prologue: skip decision, step counter, gradient multipliers and per-group scalars.
template <class Rule>
struct Prologue {
  StepHeader* header;
  typename Rule::Scalars* scalars;
  StepInputs in;
  typename Rule::Options group[kMaxParamGroups];
  int num_groups;

  TRAINKIT_HOST_DEVICE void operator()(std::int64_t) const {
    StepHeader& h = *header;
    const bool skip = in.found_inf != nullptr && *in.found_inf != 0.0f;
    h.skip = skip ? 1 : 0;
    if (skip) {
      h.first = 0;
      return;
    }
    h.step += 1.0;
    h.first = h.step == 1.0 ? 1 : 0;
    h.inv_loss_scale = in.inv_scale != nullptr ? *in.inv_scale : 1.0f;
    h.grad_norm = in.grad_norm != nullptr ? *in.grad_norm : 0.0f;
    h.clip_coef = in.max_norm > 0.0f ? clip_coefficient(h.grad_norm, in.max_norm) : 1.0f;
    for (int g = 0; g < num_groups; ++g) Rule::derive(group[g], h, scalars[g]);
  }
};

/// header->own_norm = sqrt(own_sumsq).
struct FinishOwnNorm {
  StepHeader* header;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t) const {
    header->own_norm = static_cast<float>(sqrt(header->own_sumsq));
  }
};

/// One optimizer state buffer with the arena's layout, for state_dict.
struct StateBuffer {
  std::string name;  ///< PyTorch's state name ("exp_avg", ...)
  void* data;        ///< buffer_numel() elements of `dtype` in the arena's space
  DType dtype;
};

/// A table of the executor's memory space holding `values`.
template <Space S, class T>
Tensor<T, S> upload_table(const std::vector<T>& values) {
  Tensor<T, S> t(Shape{static_cast<std::int64_t>(values.size())});
  copy_bytes(t.data(), S, values.data(), Space::kHost, values.size() * sizeof(T));
  return t;
}

/// Checks beta1, beta2 and eps as torch.optim's Adam family does.
template <class O>
void check_adam_options(const char* name, const O& o) {
  TRAINKIT_CHECK(o.eps >= 0.0, "optim::", name, ": invalid epsilon ", o.eps);
  TRAINKIT_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, "optim::", name, ": invalid beta1 ", o.beta1);
  TRAINKIT_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, "optim::", name, ": invalid beta2 ", o.beta2);
}

template <std::size_t, class T>
using Repeat = T;

/// The multi_tensor_apply list of variant V: (param, grad, state...) per segment.
template <class Rule, unsigned V,
          class Seq =
              std::make_index_sequence<static_cast<std::size_t>(RuleTraits<Rule>::num_states(V))>>
struct ListOf;
template <class Rule, unsigned V, std::size_t... K>
struct ListOf<Rule, V, std::index_sequence<K...>> {
  using type = exec::TensorList<float, const float, Repeat<K, StateStorage<Rule, V>>...>;
};

/// One list per variant, each filled when its variant first steps on the device.
template <class Rule, class Seq = std::make_integer_sequence<unsigned, RuleTraits<Rule>::kVariants>>
struct ListsOf;
template <class Rule, unsigned... V>
struct ListsOf<Rule, std::integer_sequence<unsigned, V...>> {
  using type = std::tuple<typename ListOf<Rule, V>::type...>;
};

}  // namespace detail

/// The fused optimizer of `Rule` over a ParamArena in memory space S (see optim/rule.hpp for
/// what a rule declares). Holds the parameter groups (each a copy of the options with its own
/// lr / weight_decay), their learning rates (LrGroups, which LR schedules write), the step header,
/// the per-group scalars and the state buffers (f32 state: the arena's named states; bf16
/// state: buffers of the optimizer). One optimizer per ParamArena. Move-only.
template <class Rule, Space S>
class FusedOptimizer {
  using Traits = detail::RuleTraits<Rule>;

 public:
  using Options = typename Rule::Options;
  using Scalars = typename Rule::Scalars;
  static constexpr Space space = S;

  /// `options` are the optimizer's hyper-parameters; `groups` override lr / weight_decay per
  /// group. Throws for invalid options (as torch.optim does), when the arena is not finalized or
  /// there are more than kMaxParamGroups groups.
  TRAINKIT_INLINE explicit FusedOptimizer(nn::ParamArena<S>& arena, Options options = {},
                                          std::vector<GroupRule> groups = {});

  FusedOptimizer(const FusedOptimizer&) = delete;
  FusedOptimizer& operator=(const FusedOptimizer&) = delete;
  FusedOptimizer(FusedOptimizer&&) noexcept = default;
  FusedOptimizer& operator=(FusedOptimizer&&) noexcept = default;

  const Options& options() const noexcept { return options_; }

  // ---- groups and learning rates ---------------------------------------------------------

  /// Number of parameter groups (1 + number of GroupRules).
  int num_groups() const noexcept { return static_cast<int>(group_.size()); }
  /// The group of parameter `name` (0 = default, i + 1 = rule i); throws for an unknown name.
  int group_of(std::string_view name) const {
    return param_group_[static_cast<std::size_t>(arena_->at(name).index)];
  }
  /// The learning rates schedules read and write (PyTorch's param_groups[g]["lr"]).
  LrGroups& lr_groups() noexcept { return *lr_; }
  const LrGroups& lr_groups() const noexcept { return *lr_; }
  double lr(int group = 0) const { return lr_->lr.at(static_cast<std::size_t>(group)); }
  /// Sets every group's learning rate. Throws unless `lr` is finite and >= 0.
  void set_lr(double lr) {
    TRAINKIT_CHECK(std::isfinite(lr) && lr >= 0.0, "optim::", Rule::kName,
                   "::set_lr: the learning rate must be finite and >= 0, got ", lr);
    lr_->set_all(lr);
  }
  /// Sets the learning rate of `group`. Throws unless the group exists and `lr` is finite and
  /// >= 0.
  void set_lr(int group, double lr) {
    TRAINKIT_CHECK(group >= 0 && group < num_groups(), "optim::", Rule::kName, "::set_lr: group ",
                   group, " does not exist; the optimizer has groups 0 .. ", num_groups() - 1);
    TRAINKIT_CHECK(std::isfinite(lr) && lr >= 0.0, "optim::", Rule::kName,
                   "::set_lr: the learning rate of group ", group, " must be finite and >= 0, got ",
                   lr);
    lr_->lr[static_cast<std::size_t>(group)] = lr;
  }
  double weight_decay(int group = 0) const {
    return group_.at(static_cast<std::size_t>(group)).weight_decay;
  }

  nn::ParamArena<S>& arena() noexcept { return *arena_; }

  /// Applied steps so far (skipped steps do not count). Reads the step header: a host sync on
  /// the device.
  std::int64_t step_count() const { return static_cast<std::int64_t>(read_header().step); }
  /// True when the last step was skipped because found_inf was set (host sync on the device).
  bool last_step_skipped() const { return read_header().skip != 0; }

  // ---- the step --------------------------------------------------------------------------

  /// One optimizer step with the gradients as they are (no scaler).
  template <class E>
  StepResult step(const E& exec, ClipGradNorm clip = {}) {
    return step(exec, amp::NoScaler{}, clip);
  }

  /// One optimizer step with a loss scaler (optim::DynamicScaler, optim::StaticScaler or
  /// amp::NoScaler): unless the scaler's unscale_ ran, the gradients are checked for inf/NaN
  /// (one read pass) and unscaled as the update reads them; on inf/NaN the parameters, the
  /// state and the step counter stay bit-identical. With `clip`, gradients are clipped by the
  /// global norm of the unscaled gradients in the same pass. Asynchronous on a CUDA stream.
  /// Returns handles to the norm it computed and to the skip flag (StepResult).
  template <class E, class Sc>
  StepResult step(const E& exec, Sc&& scaler, ClipGradNorm clip = {}) {
    static_assert(exec::Executor<E>, "optim: step needs an exec::Host or exec::Cuda");
    static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                  "optim: a host ParamArena steps with exec::Host, a device ParamArena with "
                  "exec::Cuda");
    static_assert(amp::Scaler<Sc>,
                  "optim: the second argument of step() must be a loss scaler "
                  "(optim::DynamicScaler, optim::StaticScaler or amp::NoScaler)");
    using Scaler = std::remove_cvref_t<Sc>;
    // A checkpoint snapshot may still be copying the parameters and this state (host memory).
    if constexpr (S == Space::kHost) trainkit::detail::wait_for_snapshot_copies();
    StepInputs in;
    TRAINKIT_CHECK(!std::isnan(clip.max_norm), "optim: ClipGradNorm::max_norm is NaN");
    // Any positive max_norm clips (one below the smallest f32 acts as the smallest f32).
    in.max_norm = clip.max_norm > 0.0 ? std::max(static_cast<float>(clip.max_norm),
                                                 std::numeric_limits<float>::denorm_min())
                                      : 0.0f;
    const bool want_norm =
        in.max_norm > 0.0f || clip.report_norm || Traits::needs_grad_norm(options_);
    if constexpr (amp::is_loss_scaler_v<Scaler>) {
      TRAINKIT_CHECK(scaler.space() == S, "optim: the loss scaler lives in ",
                     space_name(scaler.space()), " memory, the ParamArena in ", space_name(S),
                     " memory");
      const auto view = scaler.prepare_step(exec, *arena_);
      in.inv_scale = view.inv_scale;
      in.found_inf = view.found_inf;
      in.grad_norm = view.grad_norm;
      // After an earlier unscale_ the gradients may have changed since the scaler measured them
      // (clip_grad_norm_ most often): a rule that reads the norm (LAMB) measures them as they are
      // now, as apex's FusedLAMB does, not the stale norm of the unclipped gradients.
      if (view.inv_scale == nullptr && Traits::needs_grad_norm(options_)) in.grad_norm = nullptr;
    }
    if (want_norm && in.grad_norm == nullptr) {
      StepHeader* h = header_.data();
      detail::sum_into(exec, arena_->buffer_numel(),
                       detail::SquaredTerm{arena_->grads_data(), nullptr}, &h->own_sumsq);
      exec::launch(exec, 1, detail::FinishOwnNorm{h});
      in.grad_norm = &h->own_norm;
    }
    launch_prologue(exec, in);
    detail::dispatch_variant<Traits::kVariants>(
        Traits::variant(options_), [&](auto v) { launch_pass<decltype(v)::value>(exec); });
    if constexpr (amp::is_loss_scaler_v<Scaler>) scaler.mark_stepped();
    StepResult result;
    if (in.grad_norm != nullptr) result.grad_norm = GradNorm(in.grad_norm, S);
    result.found_inf = in.found_inf;
    result.space = S;
    return result;
  }

  // ---- state -----------------------------------------------------------------------------

  /// PyTorch-named state: tensors "<param>.<state>" (the rule's kStates; f32, or bf16 for bf16
  /// state) and "<param>.step" (f32 scalar, as PyTorch keeps it), values "optimizer" (the rule's
  /// name), "step", "num_groups", "group.<g>.lr", "group.<g>.initial_lr",
  /// "group.<g>.weight_decay" and the rule's saved options. Downloads device state (sync).
  StateDict state_dict() const {
    StateDict sd;
    state_dict_into(sd);
    return sd;
  }
  /// state_dict() written into `sd` (empty, or what an earlier call wrote), reusing its tensors:
  /// a checkpoint snapshot that copies the state once into memory already mapped.
  TRAINKIT_INLINE void state_dict_into(StateDict& sd) const;

  /// Restores a state_dict() of an optimizer of the same rule and state layout over the same
  /// parameters. Throws naming the first missing or mismatched entry, or a tensor that is not a
  /// state of this optimizer (a parameter its arena does not have, e.g. a bigger model's, or a
  /// state it does not keep), as PyTorch refuses parameter groups that do not match; nothing is
  /// changed then.
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd);

 private:
  static Options validated(const Options& o) {
    TRAINKIT_CHECK(std::isfinite(o.lr) && o.lr >= 0.0, "optim::", Rule::kName,
                   ": lr must be finite and >= 0, got ", o.lr);
    TRAINKIT_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, "optim::", Rule::kName,
                   ": weight_decay must be finite and >= 0, got ", o.weight_decay);
    Traits::validate(o);
    return o;
  }

  /// Throws unless every tensor of `sd` is "<param>.<state>" for a parameter of the arena and
  /// a state of `buffers`, or "<param>.step" (a state of another model or layout is refused).
  TRAINKIT_INLINE void check_known_tensors(const StateDict& sd,
                                           const std::vector<detail::StateBuffer>& buffers,
                                           const std::string& prefix) const;

  /// "exp_avg, exp_avg_sq (f32)": the state buffers options `o` keep, for messages.
  TRAINKIT_INLINE static std::string state_layout(const Options& o);

  TRAINKIT_INLINE void allocate_states();

  TRAINKIT_INLINE std::vector<detail::StateBuffer> state_buffers() const;

  StepHeader read_header() const {
    StepHeader h{};
    copy_bytes(&h, Space::kHost, header_.data(), S, sizeof h);
    return h;
  }

  template <class E>
  void launch_prologue(const E& exec, const StepInputs& in) {
    detail::Prologue<Rule> pro{};
    pro.header = header_.data();
    pro.scalars = scalars_.data();
    pro.in = in;
    pro.num_groups = num_groups();
    // assign_groups guarantees at most kMaxParamGroups groups.
    for (int g = 0; g < num_groups() && g < kMaxParamGroups; ++g) {
      pro.group[g] = group_[static_cast<std::size_t>(g)];
      pro.group[g].lr = lr_->lr.at(static_cast<std::size_t>(g));
    }
    exec::launch(exec, 1, pro);
  }

  /// f(state pointers of variant V as StateStorage<Rule, V>*...).
  template <unsigned V, class F>
  void with_states(F&& f) const {
    using Store = detail::StateStorage<Rule, V>;
    [&]<std::size_t... K>(std::index_sequence<K...>) { f(static_cast<Store*>(state_[K])...); }
    (std::make_index_sequence<static_cast<std::size_t>(Traits::num_states(V))>{});
  }

  template <unsigned V, class E>
  void launch_pass(const E& exec) {
    if constexpr (Traits::kTrustRatio) {
      launch_trust_ratio<V>(exec);
    } else if constexpr (exec::is_host_executor_v<E>) {
      const StepHeader& h = *header_.data();  // host memory
      if (h.skip != 0) return;
      float* p = arena_->params_data();
      const float* g = arena_->grads_data();
      const detail::Rounding rounding{Traits::rounding_seed(options_), h.step};
      const Scalars* scalars = scalars_.data();
      with_states<V>([&](auto*... st) {
        detail::for_each_segment_range(
            exec, segments_, arena_->buffer_numel(),
            [&](const detail::Segment& s, std::int64_t begin, std::int64_t end) {
              detail::host_range<Rule, V>(scalars[s.group], h, rounding, p, g, begin, end, st...);
            });
      });
    } else {
      auto& list = std::get<V>(lists_);
      if (list.empty()) {
        float* p = arena_->params_data();
        const float* g = arena_->grads_data();
        with_states<V>([&](auto*... st) {
          for (const detail::Segment& s : segments_)
            list.add(s.end - s.begin, p + s.begin, g + s.begin, (st + s.begin)...);
        });
      }
      exec::multi_tensor_apply(
          exec, list,
          detail::FusedFunctor<Rule, V>{header_.data(), scalars_.data(), segment_group_.data(),
                                        segment_begin_.data(), Traits::rounding_seed(options_)});
    }
  }

  // ---- rules with a per-tensor trust ratio -----------------------------------------------

  void build_chunks() {
    static_assert(Traits::state_dtype(0) == DType::kF32,
                  "optim: rules with a trust ratio keep f32 state");
    const int num_params = static_cast<int>(arena_->size());
    std::vector<std::int32_t> first(static_cast<std::size_t>(num_params) + 1, 0);
    std::vector<bool> has(static_cast<std::size_t>(num_params), false);
    for (const detail::Segment& s : segments_) {
      has[static_cast<std::size_t>(s.param)] = true;
      first[static_cast<std::size_t>(s.param)] = static_cast<std::int32_t>(chunks_.size());
      for (std::int64_t b = s.begin; b < s.end; b += detail::kTrustChunk)
        chunks_.push_back({b, std::min(s.end, b + detail::kTrustChunk), s.param, s.group});
    }
    // Parameters without elements own no chunk: they point at the next parameter's first.
    first[static_cast<std::size_t>(num_params)] = static_cast<std::int32_t>(chunks_.size());
    for (int t = num_params - 1; t >= 0; --t)
      if (!has[static_cast<std::size_t>(t)])
        first[static_cast<std::size_t>(t)] = first[static_cast<std::size_t>(t) + 1];
    param_first_chunk_ = first;
    chunk_table_ = detail::upload_table<S>(chunks_);
    first_table_ = detail::upload_table<S>(first);
    partials_ = Tensor<detail::NormPartial, S>(Shape{static_cast<std::int64_t>(chunks_.size())});
    ratio_ = Tensor<float, S>(Shape{std::max<std::int64_t>(num_params, 1)});
  }

  /// Stage 1 (the rule's update direction into the gradient buffer, per-chunk norm partials),
  /// the per-tensor ratios, stage 2 (p -= ratio * u).
  template <unsigned V, class E>
  void launch_trust_ratio(const E& exec) {
    float* p = arena_->params_data();
    float* g = arena_->grads_data();
    if constexpr (exec::is_host_executor_v<E>) {
      const StepHeader& h = *header_.data();
      if (h.skip != 0) return;
      const detail::TensorChunk* chunks = chunks_.data();
      detail::NormPartial* partials = partials_.data();
      const Scalars* scalars = scalars_.data();
      with_states<V>([&](auto*... st) {
        exec.parallel_for(static_cast<std::int64_t>(chunks_.size()), [&](std::int64_t c) {
          const detail::TensorChunk& ch = chunks[c];
          detail::host_range<Rule, V>(scalars[ch.group], h, detail::Rounding{0, 0.0}, p, g,
                                      ch.begin, ch.end, st...);
          partials[c] = detail::norm_partial(p, g, ch.begin, ch.end);
        });
      });
      float* ratio = ratio_.data();
      for (std::size_t t = 0; t + 1 < param_first_chunk_.size(); ++t) {
        const int first = param_first_chunk_[t];
        const int last = param_first_chunk_[t + 1];
        if (first != last)
          ratio[t] =
              detail::tensor_ratio<Rule>(scalars[chunks[first].group], partials, first, last);
      }
      exec.parallel_for(static_cast<std::int64_t>(chunks_.size()), [&](std::int64_t c) {
        const detail::TensorChunk& ch = chunks[c];
        const float r = ratio[ch.param];
        for (std::int64_t i = ch.begin; i < ch.end; ++i) p[i] = p[i] - r * g[i];
      });
    } else {
#if TRAINKIT_CUDA_COMPILER && TRAINKIT_WITH_CUDA
      const auto num_chunks = static_cast<unsigned>(chunks_.size());
      if (num_chunks == 0) return;
      const int num_params = static_cast<int>(arena_->size());
      detail::TrustRatioArgs<Rule> args{header_.data(),
                                        scalars_.data(),
                                        chunk_table_.data(),
                                        first_table_.data(),
                                        partials_.data(),
                                        ratio_.data(),
                                        p,
                                        g,
                                        {},
                                        num_params};
      for (int k = 0; k < Traits::kMaxStates; ++k) args.states[k] = static_cast<float*>(state_[k]);
      detail::launch_trust_ratio_kernels<Rule, V>(args, num_chunks, exec.stream().get());
#else
      static_assert(exec::detail::dependent_false<E>,
                    "optim: a trust-ratio optimizer (LAMB) stepping with exec::Cuda launches CUDA "
                    "kernels: compile this TU with nvcc (a .cu file)");
#endif
    }
  }

  nn::ParamArena<S>* arena_;
  Options options_;
  std::vector<int> param_group_;
  std::vector<Options> group_;
  // On the heap so that LR schedules holding a reference survive moves of the optimizer.
  std::unique_ptr<LrGroups> lr_ = std::make_unique<LrGroups>();
  std::vector<detail::Segment> segments_;
  Tensor<StepHeader, S> header_;
  Tensor<Scalars, S> scalars_;
  Tensor<std::int32_t, S> segment_group_;
  Tensor<std::int64_t, S> segment_begin_;  ///< the flat index of each segment's first element
  void* state_[Traits::kMaxStates > 0 ? Traits::kMaxStates : 1] = {};
  std::vector<Tensor<bf16, S>> owned_;  ///< bf16 state buffers
  typename detail::ListsOf<Rule>::type lists_;
  // Trust-ratio rules only.
  std::vector<detail::TensorChunk> chunks_;
  std::vector<std::int32_t> param_first_chunk_;
  Tensor<detail::TensorChunk, S> chunk_table_;
  Tensor<std::int32_t, S> first_table_;
  Tensor<detail::NormPartial, S> partials_;
  Tensor<float, S> ratio_;
};

template <class Rule, Space S>
TRAINKIT_INLINE FusedOptimizer<Rule, S>::FusedOptimizer(nn::ParamArena<S>& arena, Options options,
                                                        std::vector<GroupRule> groups)
    : arena_(&arena), options_(validated(options)) {
  TRAINKIT_CHECK(arena.finalized(), "optim::", Rule::kName,
                 ": the ParamArena must be finalized before the optimizer is created");
  std::vector<std::string> names;
  for (const nn::ParamInfo& p : arena.infos()) names.push_back(p.name);
  param_group_ = assign_groups(names, groups);
  group_.assign(groups.size() + 1, options_);
  for (std::size_t r = 0; r < groups.size(); ++r) {
    if (groups[r].lr) group_[r + 1].lr = *groups[r].lr;
    if (groups[r].weight_decay) group_[r + 1].weight_decay = *groups[r].weight_decay;
    TRAINKIT_CHECK(group_[r + 1].lr >= 0.0 && group_[r + 1].weight_decay >= 0.0 &&
                       std::isfinite(group_[r + 1].lr) && std::isfinite(group_[r + 1].weight_decay),
                   "optim::", Rule::kName, ": parameter group ", r + 1, " has lr ",
                   group_[r + 1].lr, " and weight_decay ", group_[r + 1].weight_decay,
                   "; both must be finite and >= 0");
  }
  for (const Options& g : group_) lr_->lr.push_back(g.lr);
  segments_ = detail::make_segments(arena, param_group_, !Traits::kTrustRatio);

  header_ = Tensor<StepHeader, S>(Shape{1});
  zero_bytes(header_.data(), S, header_.bytes());
  scalars_ = Tensor<Scalars, S>(Shape{kMaxParamGroups});
  zero_bytes(scalars_.data(), S, scalars_.bytes());
  std::vector<std::int32_t> seg_group;
  std::vector<std::int64_t> seg_begin;
  for (const detail::Segment& s : segments_) {
    seg_group.push_back(s.group);
    seg_begin.push_back(s.begin);
  }
  segment_group_ = detail::upload_table<S>(seg_group);
  segment_begin_ = detail::upload_table<S>(seg_begin);
  allocate_states();
  if constexpr (Traits::kTrustRatio) build_chunks();
}

template <class Rule, Space S>
TRAINKIT_INLINE void FusedOptimizer<Rule, S>::state_dict_into(StateDict& sd) const {
  StateDictRefill refill(sd);
  const StepHeader h = read_header();
  sd.set("optimizer", Rule::kName);
  sd.set("step", h.step);
  sd.set("num_groups", num_groups());
  for (int g = 0; g < num_groups(); ++g) {
    const std::string key = "group." + std::to_string(g);
    sd.set(key + ".lr", lr_->lr[static_cast<std::size_t>(g)]);
    if (lr_->initial_lr.size() == lr_->lr.size())
      sd.set(key + ".initial_lr", lr_->initial_lr[static_cast<std::size_t>(g)]);
    sd.set(key + ".weight_decay", group_[static_cast<std::size_t>(g)].weight_decay);
  }
  for (const detail::StateBuffer& b : state_buffers())
    detail::save_by_param(refill, *arena_, b.data, b.dtype, "." + b.name);
  const float step = static_cast<float>(h.step);
  for (const nn::ParamInfo& p : arena_->infos())
    std::memcpy(refill.tensor(p.name + ".step", DType::kF32, Shape{}).data(), &step, sizeof step);
  detail::save_fields(sd, options_, Traits::saved_options());
}

template <class Rule, Space S>
TRAINKIT_INLINE void FusedOptimizer<Rule, S>::load_state_dict(const StateDict& sd) {
  const std::string prefix = std::string("optim::") + Rule::kName + "::load_state_dict: ";
  TRAINKIT_CHECK(sd.get_string("optimizer") == Rule::kName, prefix, "the state is from ",
                 StateDict::shown(sd.get_string("optimizer")));
  TRAINKIT_CHECK(sd.get_int("num_groups") == num_groups(), prefix, "the state has ",
                 sd.get_int("num_groups"), " parameter groups, this optimizer ", num_groups());
  Options loaded = options_;
  detail::load_fields(sd, loaded, Traits::saved_options());
  try {  // a damaged state must not pass what the constructor would refuse
    (void)validated(loaded);
  } catch (const Error& e) {
    std::string_view why = e.what();
    if (why.starts_with("trainkit: ")) why.remove_prefix(10);
    TRAINKIT_FAIL(prefix, "the state's options are not valid (", why, ")");
  }
  // Counts and rates: finite, >= 0 (a NaN or negative one made every later step NaN).
  const auto number = [&](const std::string& key, bool whole) {
    const double v = sd.get_double(key);
    TRAINKIT_CHECK(std::isfinite(v) && v >= 0.0 && (!whole || (v == std::floor(v) && v < 0x1p53)),
                   prefix, "'", key, "' is ", v, "; expected a ",
                   whole ? "whole number >= 0" : "finite number >= 0");
    return v;
  };
  TRAINKIT_CHECK(state_layout(loaded) == state_layout(options_), prefix,
                 "the state's options keep the state ", state_layout(loaded),
                 ", this optimizer's keep ", state_layout(options_));
  const auto buffers = state_buffers();
  for (const detail::StateBuffer& b : buffers)  // a second moment ("..._sq") is never negative
    detail::check_by_param(sd, *arena_, b.dtype, "." + b.name, prefix,
                           b.name.find("_sq") != std::string::npos
                               ? detail::StateValues::kNonNegative
                               : detail::StateValues::kNumbers);
  check_known_tensors(sd, buffers, prefix);
  std::vector<double> lrs, initial, wds;
  for (int g = 0; g < num_groups(); ++g) {
    const std::string key = "group." + std::to_string(g);
    lrs.push_back(number(key + ".lr", false));
    if (sd.values.count(key + ".initial_lr")) initial.push_back(number(key + ".initial_lr", false));
    wds.push_back(number(key + ".weight_decay", false));
  }
  const double step = number("step", true);
  // The per-parameter step counts (PyTorch's layout) must say the same.
  for (const nn::ParamInfo& p : arena_->infos()) {
    const auto it = sd.tensors.find(p.name + ".step");
    if (it == sd.tensors.end()) continue;
    float saved = 0.0f;
    TRAINKIT_CHECK(it->second.dtype() == DType::kF32 && it->second.numel() == 1, prefix, "'",
                   p.name, ".step' is not one F32 value");
    std::memcpy(&saved, it->second.data(), sizeof saved);
    TRAINKIT_CHECK(saved == static_cast<float>(step), prefix, "'", p.name, ".step' is ", saved,
                   " but the state's step is ", step);
  }
  for (const detail::StateBuffer& b : buffers)
    detail::load_by_param(sd, *arena_, b.data, b.dtype, "." + b.name);
  options_ = loaded;
  for (std::size_t g = 0; g < group_.size(); ++g) {
    group_[g] = loaded;
    group_[g].weight_decay = wds[g];
  }
  lr_->lr = lrs;
  if (initial.size() == lrs.size()) lr_->initial_lr = initial;
  StepHeader h = read_header();
  h.step = step;
  h.skip = 0;
  h.first = 0;
  copy_bytes(header_.data(), S, &h, Space::kHost, sizeof h);
}

template <class Rule, Space S>
TRAINKIT_INLINE void FusedOptimizer<Rule, S>::check_known_tensors(
    const StateDict& sd, const std::vector<detail::StateBuffer>& buffers,
    const std::string& prefix) const {
  std::vector<std::string> states;  // the state names a key may end in, "step" last
  for (const detail::StateBuffer& b : buffers) states.push_back(b.name);
  states.push_back("step");
  // Whole keys: a parameter's name may hold dots ("h.0.attn.weight.exp_avg").
  std::set<std::string> known;
  for (const nn::ParamInfo& p : arena_->infos())
    for (const std::string& state : states) known.insert(p.name + "." + state);
  std::string expected;
  for (std::size_t k = 0; k < states.size(); ++k)
    expected += std::string(k == 0 ? "" : k + 1 == states.size() ? " or " : ", ") + states[k];
  for (const auto& entry : sd.tensors) {
    const std::string& key = entry.first;
    if (known.count(key) != 0) continue;
    const std::string shown = StateDict::shown(key);
    for (const std::string& state : states) {
      const std::string suffix = "." + state;
      if (key.size() > suffix.size() && key.ends_with(suffix))
        TRAINKIT_FAIL(
            prefix, "the state holds tensor '", shown, "', the ", state, " of a parameter '",
            StateDict::shown(std::string_view(key).substr(0, key.size() - suffix.size())),
            "' that this optimizer's arena does not have; expected the states of the arena's ",
            arena_->size(), " parameter(s) only (is it the state of another model?)");
    }
    TRAINKIT_FAIL(prefix, "the state holds tensor '", shown,
                  "', which is not '<parameter>.<state>' for a state this optimizer keeps (",
                  expected, ")");
  }
}

template <class Rule, Space S>
TRAINKIT_INLINE std::string FusedOptimizer<Rule, S>::state_layout(const Options& o) {
  const unsigned v = Traits::variant(o);
  std::string out;
  for (int k = 0; k < Traits::num_states(v); ++k)
    out += std::string(k == 0 ? "" : ", ") + Rule::kStates[static_cast<std::size_t>(k)];
  return (out.empty() ? "(none)" : out) + " (" + std::string(dtype_name(Traits::state_dtype(v))) +
         ")";
}

template <class Rule, Space S>
TRAINKIT_INLINE void FusedOptimizer<Rule, S>::allocate_states() {
  const unsigned v = Traits::variant(options_);
  const std::int64_t n = arena_->buffer_numel();
  for (int k = 0; k < Traits::num_states(v); ++k) {
    const std::string name = Rule::kStates[static_cast<std::size_t>(k)];
    if (Traits::state_dtype(v) == DType::kBF16) {
      owned_.emplace_back(Shape{n});
      zero_bytes(owned_.back().data(), S, owned_.back().bytes());
      state_[k] = owned_.back().data();
    } else {
      float* data =
          arena_->has_state(name) ? arena_->state(name).data() : arena_->add_state(name).data();
      zero_bytes(data, S, static_cast<std::size_t>(n) * sizeof(float));
      state_[k] = data;
    }
  }
}

template <class Rule, Space S>
TRAINKIT_INLINE std::vector<detail::StateBuffer> FusedOptimizer<Rule, S>::state_buffers() const {
  const unsigned v = Traits::variant(options_);
  std::vector<detail::StateBuffer> out;
  for (int k = 0; k < Traits::num_states(v); ++k)
    out.push_back({Rule::kStates[static_cast<std::size_t>(k)], state_[k], Traits::state_dtype(v)});
  return out;
}

}  // namespace optim
TRAINKIT_NAMESPACE_END
