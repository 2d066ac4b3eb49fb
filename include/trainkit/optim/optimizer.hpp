// SPDX-License-Identifier: MIT
// trainkit/optim/optimizer.hpp: what the fused optimizers (SGD, AdamW, LAMB) share. A step is a
// one-thread "prologue" that reads the loss scaler's found_inf flag and inverse scale, advances
// the step counter (not on a skipped step, as GradScaler skips optimizer.step()), and derives the
// per-group scalars (bias corrections, clip coefficient) in the executor's memory; then ONE pass
// over the whole ParamArena (Host: thread pool over fixed chunks; CUDA: one multi_tensor_apply)
// that unscales each gradient as it reads it and does nothing when the step is skipped. No value
// ever travels back to the host, so a CUDA step never waits for the GPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/amp/scaler_fwd.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/exec/multi_tensor_apply.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/grad_norm.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/core/state_dict.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// Clip the gradients by their global L2 norm inside the optimizer's pass (PyTorch's
/// clip_grad_norm_ folded into the step: each gradient is multiplied by
/// min(1, max_norm / (norm + 1e-6)) as it is read, so clipping costs no extra pass over the
/// gradients). max_norm <= 0: no clipping.
struct ClipGradNorm {
  double max_norm = 0.0;
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

/// Per-optimizer step state in the executor's memory space.
struct StepHeader {
  double step;         ///< applied (not skipped) steps so far: PyTorch's `step` state
  double own_sumsq;    ///< the optimizer's own gradient-norm pass (when no scaler measured it)
  float own_norm;      ///< sqrt(own_sumsq)
  float grad_mult_a;   ///< this step's inverse loss scale (1 without a scaler or after unscale_)
  float grad_mult_b;   ///< this step's clip coefficient (1 without clipping)
  float grad_norm;     ///< the global norm of the unscaled gradients this step (0 if unknown)
  std::int32_t skip;   ///< 1: this step was skipped (found_inf)
  std::int32_t first;  ///< 1: this is the first applied step
};

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
/// entries and longer host loops); otherwise one per parameter (LAMB's per-tensor trust ratio).
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
/// `Rule` provides Hyper (host doubles per group), Scalars (floats per group the pass reads) and
/// `static void derive(const Hyper&, const StepHeader&, Scalars&)`.
template <class Rule>
struct Prologue {
  StepHeader* header;
  typename Rule::Scalars* scalars;
  StepInputs in;
  typename Rule::Hyper hyper[kMaxParamGroups];
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
    h.grad_mult_a = in.inv_scale != nullptr ? *in.inv_scale : 1.0f;
    h.grad_norm = in.grad_norm != nullptr ? *in.grad_norm : 0.0f;
    h.grad_mult_b = in.max_norm > 0.0f ? clip_coefficient(h.grad_norm, in.max_norm) : 1.0f;
    for (int g = 0; g < num_groups; ++g) Rule::derive(hyper[g], h, scalars[g]);
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

}  // namespace detail

/// Base of the fused optimizers (CRTP: Derived provides `launch_update(exec)` and
/// `state_buffers()`). Holds the parameter groups, their learning rates (LrGroups, which LR
/// schedules write), the step header and the per-group scalars in the arena's memory space.
/// One optimizer per ParamArena: its state buffers are the arena's named states.
template <class Derived, Space S, class Rule>
class FusedOptimizer {
 public:
  using Hyper = typename Rule::Hyper;
  using Scalars = typename Rule::Scalars;
  static constexpr Space space = S;

  FusedOptimizer(const FusedOptimizer&) = delete;
  FusedOptimizer& operator=(const FusedOptimizer&) = delete;
  FusedOptimizer(FusedOptimizer&&) noexcept = default;
  FusedOptimizer& operator=(FusedOptimizer&&) noexcept = default;

  // ---- groups and learning rates ---------------------------------------------------------

  /// Number of parameter groups (1 + number of GroupRules).
  int num_groups() const noexcept { return static_cast<int>(hyper_.size()); }
  /// The group of parameter `name` (0 = default, i + 1 = rule i); throws for an unknown name.
  int group_of(std::string_view name) const {
    return param_group_[static_cast<std::size_t>(arena_->at(name).index)];
  }
  /// The learning rates schedules read and write (PyTorch's param_groups[g]["lr"]).
  LrGroups& lr_groups() noexcept { return *lr_; }
  const LrGroups& lr_groups() const noexcept { return *lr_; }
  double lr(int group = 0) const { return lr_->lr.at(static_cast<std::size_t>(group)); }
  /// Sets every group's learning rate.
  void set_lr(double lr) { lr_->set_all(lr); }
  void set_lr(int group, double lr) { lr_->lr.at(static_cast<std::size_t>(group)) = lr; }
  double weight_decay(int group = 0) const {
    return hyper_.at(static_cast<std::size_t>(group)).weight_decay;
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
  void step(const E& exec, ClipGradNorm clip = {}) {
    step(exec, amp::NoScaler{}, clip);
  }

  /// One optimizer step with a loss scaler (optim::DynamicScaler, optim::StaticScaler or
  /// amp::NoScaler): unless the scaler's unscale_ ran, the gradients are checked for inf/NaN
  /// (one read pass) and unscaled as the update reads them; on inf/NaN the parameters, the
  /// state and the step counter stay bit-identical. With `clip`, gradients are clipped by the
  /// global norm of the unscaled gradients in the same pass. Asynchronous on a CUDA stream.
  template <class E, class Sc>
  void step(const E& exec, Sc&& scaler, ClipGradNorm clip = {}) {
    static_assert(exec::Executor<E>, "optim: step needs an exec::Host or exec::Cuda");
    static_assert((S == Space::kHost) == exec::is_host_executor_v<E>,
                  "optim: a host ParamArena steps with exec::Host, a device ParamArena with "
                  "exec::Cuda");
    static_assert(amp::Scaler<Sc>,
                  "optim: the second argument of step() must be a loss scaler "
                  "(optim::DynamicScaler, optim::StaticScaler or amp::NoScaler)");
    using Scaler = std::remove_cvref_t<Sc>;
    StepInputs in;
    in.max_norm = clip.max_norm > 0.0 ? static_cast<float>(clip.max_norm) : 0.0f;
    const bool want_norm =
        in.max_norm > 0.0f || static_cast<const Derived*>(this)->needs_grad_norm();
    if constexpr (amp::is_loss_scaler_v<Scaler>) {
      TRAINKIT_CHECK(scaler.space() == S, "optim: the loss scaler lives in ",
                     space_name(scaler.space()), " memory, the ParamArena in ", space_name(S),
                     " memory");
      const auto view = scaler.prepare_step(exec, *arena_);
      in.inv_scale = view.inv_scale;
      in.found_inf = view.found_inf;
      in.grad_norm = view.grad_norm;
    }
    if (want_norm && in.grad_norm == nullptr) {
      detail::StepHeader* h = header_.data();
      optim::detail::sum_into(exec, arena_->buffer_numel(),
                              optim::detail::SquaredTerm{arena_->grads_data(), nullptr},
                              &h->own_sumsq);
      exec::launch(exec, 1, detail::FinishOwnNorm{h});
      in.grad_norm = &h->own_norm;
    }
    launch_prologue(exec, in);
    static_cast<Derived*>(this)->launch_update(exec);
    if constexpr (amp::is_loss_scaler_v<Scaler>) scaler.mark_stepped();
  }

  // ---- state -----------------------------------------------------------------------------

  /// PyTorch-named state: tensors "<param>.<state>" (exp_avg, exp_avg_sq, max_exp_avg_sq,
  /// momentum_buffer; f32, or bf16 for AdamW's bf16 state) and "<param>.step" (f32 scalar, as
  /// PyTorch keeps it), values "step", "num_groups", "group.<g>.lr", "group.<g>.initial_lr",
  /// "group.<g>.weight_decay" plus the derived optimizer's options. Downloads device state (sync).
  StateDict state_dict() const {
    StateDict sd;
    const detail::StepHeader h = read_header();
    sd.set("step", h.step);
    sd.set("num_groups", num_groups());
    for (int g = 0; g < num_groups(); ++g) {
      const std::string key = "group." + std::to_string(g);
      sd.set(key + ".lr", lr_->lr[static_cast<std::size_t>(g)]);
      if (lr_->initial_lr.size() == lr_->lr.size())
        sd.set(key + ".initial_lr", lr_->initial_lr[static_cast<std::size_t>(g)]);
      sd.set(key + ".weight_decay", hyper_[static_cast<std::size_t>(g)].weight_decay);
    }
    const auto& infos = arena_->infos();
    for (const detail::StateBuffer& b : static_cast<const Derived*>(this)->state_buffers()) {
      const std::size_t esize = dtype_size(b.dtype);
      std::vector<unsigned char> host(static_cast<std::size_t>(arena_->buffer_numel()) * esize);
      copy_bytes(host.data(), Space::kHost, b.data, S, host.size());
      for (const nn::ParamInfo& p : infos) {
        AnyTensor t(b.dtype, p.shape);
        if (t.bytes() != 0)
          std::memcpy(t.data(), host.data() + static_cast<std::size_t>(p.offset) * esize,
                      t.bytes());
        sd.tensors[p.name + "." + b.name] = std::move(t);
      }
    }
    for (const nn::ParamInfo& p : infos) {
      AnyTensor t(DType::kF32, Shape{});
      const float step = static_cast<float>(h.step);
      std::memcpy(t.data(), &step, sizeof step);
      sd.tensors[p.name + ".step"] = std::move(t);
    }
    static_cast<const Derived*>(this)->save_options(sd);
    return sd;
  }

  /// Restores a state_dict() of an optimizer of the same kind over the same parameters. Throws
  /// naming the first missing or mismatched entry (nothing is changed then).
  void load_state_dict(const StateDict& sd) {
    TRAINKIT_CHECK(sd.get_int("num_groups") == num_groups(),
                   "optim::load_state_dict: the state "
                   "has ",
                   sd.get_int("num_groups"), " parameter groups, this optimizer ", num_groups());
    const auto& infos = arena_->infos();
    const auto buffers = static_cast<const Derived*>(this)->state_buffers();
    for (const detail::StateBuffer& b : buffers)
      for (const nn::ParamInfo& p : infos) {
        const AnyTensor& t = sd.tensor(p.name + "." + b.name);
        TRAINKIT_CHECK(t.dtype() == b.dtype && t.shape() == p.shape, "optim::load_state_dict: '",
                       p.name, ".", b.name, "' is ", dtype_name(t.dtype()), " ",
                       t.shape().to_string(), ", expected ", dtype_name(b.dtype), " ",
                       p.shape.to_string());
      }
    std::vector<double> lrs, initial, wds;
    for (int g = 0; g < num_groups(); ++g) {
      const std::string key = "group." + std::to_string(g);
      lrs.push_back(sd.get_double(key + ".lr"));
      if (sd.values.count(key + ".initial_lr"))
        initial.push_back(sd.get_double(key + ".initial_lr"));
      wds.push_back(sd.get_double(key + ".weight_decay"));
    }
    const double step = sd.get_double("step");
    static_cast<Derived*>(this)->load_options(sd);
    for (const detail::StateBuffer& b : buffers) {
      const std::size_t esize = dtype_size(b.dtype);
      std::vector<unsigned char> host(static_cast<std::size_t>(arena_->buffer_numel()) * esize, 0);
      for (const nn::ParamInfo& p : infos) {
        const AnyTensor& t = sd.tensor(p.name + "." + b.name);
        if (t.bytes() != 0)
          std::memcpy(host.data() + static_cast<std::size_t>(p.offset) * esize, t.data(),
                      t.bytes());
      }
      copy_bytes(b.data, S, host.data(), Space::kHost, host.size());
    }
    lr_->lr = lrs;
    if (initial.size() == lrs.size()) lr_->initial_lr = initial;
    for (std::size_t g = 0; g < wds.size(); ++g) hyper_[g].weight_decay = wds[g];
    detail::StepHeader h = read_header();
    h.step = step;
    h.skip = 0;
    h.first = 0;
    copy_bytes(header_.data(), S, &h, Space::kHost, sizeof h);
  }

 protected:
  /// `defaults` are the optimizer's hyper-parameters (lr and weight_decay included); `rules`
  /// override lr / weight_decay per group. Throws when the arena is not finalized or there are
  /// more than kMaxParamGroups groups.
  FusedOptimizer(nn::ParamArena<S>& arena, const Hyper& defaults, std::vector<GroupRule> rules,
                 bool merge_segments)
      : arena_(&arena), rules_(std::move(rules)) {
    TRAINKIT_CHECK(arena.finalized(),
                   "optim: the ParamArena must be finalized before the "
                   "optimizer is created");
    std::vector<std::string> names;
    for (const nn::ParamInfo& p : arena.infos()) names.push_back(p.name);
    param_group_ = assign_groups(names, rules_);
    hyper_.assign(rules_.size() + 1, defaults);
    for (std::size_t r = 0; r < rules_.size(); ++r) {
      if (rules_[r].lr) hyper_[r + 1].lr = *rules_[r].lr;
      if (rules_[r].weight_decay) hyper_[r + 1].weight_decay = *rules_[r].weight_decay;
    }
    for (const Hyper& h : hyper_) lr_->lr.push_back(h.lr);
    segments_ = detail::make_segments(arena, param_group_, merge_segments);

    header_ = Tensor<detail::StepHeader, S>(Shape{1});
    scalars_ = Tensor<Scalars, S>(Shape{kMaxParamGroups});
    const detail::StepHeader h0{};
    copy_bytes(header_.data(), S, &h0, Space::kHost, sizeof h0);
    std::vector<Scalars> zeros(static_cast<std::size_t>(kMaxParamGroups));
    copy_bytes(scalars_.data(), S, zeros.data(), Space::kHost, zeros.size() * sizeof(Scalars));
    std::vector<std::int32_t> seg_group;
    for (const detail::Segment& s : segments_) seg_group.push_back(s.group);
    segment_group_ = Tensor<std::int32_t, S>(Shape{static_cast<std::int64_t>(seg_group.size())});
    copy_bytes(segment_group_.data(), S, seg_group.data(), Space::kHost,
               seg_group.size() * sizeof(std::int32_t));
  }

  /// A zero-filled f32 state buffer `name` of the arena (reused and zeroed if it exists).
  float* arena_state(const std::string& name) {
    float* data =
        arena_->has_state(name) ? arena_->state(name).data() : arena_->add_state(name).data();
    zero_bytes(data, S, static_cast<std::size_t>(arena_->buffer_numel()) * sizeof(float));
    return data;
  }

  detail::StepHeader read_header() const {
    detail::StepHeader h{};
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
    for (int g = 0; g < num_groups(); ++g) {
      pro.hyper[g] = hyper_[static_cast<std::size_t>(g)];
      pro.hyper[g].lr = lr_->lr.at(static_cast<std::size_t>(g));
    }
    exec::launch(exec, 1, pro);
  }

  // Host passes read the header and scalars directly (host memory).
  const detail::StepHeader& host_header() const { return *header_.data(); }
  const Scalars& host_scalars(int group) const { return scalars_.data()[group]; }

  nn::ParamArena<S>* arena_;
  std::vector<GroupRule> rules_;
  std::vector<int> param_group_;
  std::vector<Hyper> hyper_;
  // On the heap so that LR schedules holding a reference survive moves of the optimizer.
  std::unique_ptr<LrGroups> lr_ = std::make_unique<LrGroups>();
  std::vector<detail::Segment> segments_;
  Tensor<detail::StepHeader, S> header_;
  Tensor<Scalars, S> scalars_;
  Tensor<std::int32_t, S> segment_group_;
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
