// SPDX-License-Identifier: MIT
// trainkit/optim/lr_schedule.hpp: learning-rate schedules equal to torch.optim.lr_scheduler step
// for step: ConstantLR, LinearLR (linear warmup), CosineAnnealingLR, StepLR, MultiStepLR,
// ExponentialLR, SequentialLR (composition, e.g. warmup then cosine) and ReduceLROnPlateau. Like
// PyTorch's they are stateful and recursive (each step scales the CURRENT group lr; closed forms
// only where PyTorch uses them, at SequentialLR milestones), in double precision with PyTorch's
// expression order, so the values agree to the last bit. Past its end a schedule holds its final
// value (PyTorch's cosine alone rises again: CosineAnnealingLROptions::periodic). They write an
// optimizer's LrGroups.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/optim/detail/state_fields.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/core/state_dict.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

namespace detail {
/// Python's a % b for b > 0 (never negative).
inline std::int64_t py_mod(std::int64_t a, std::int64_t b) { return ((a % b) + b) % b; }
inline constexpr double kPi = 3.141592653589793;  // math.pi
/// The largest step count a schedule accepts (saved or as t_max): the optimizers' step limit,
/// 2^53, so counting on from it cannot overflow.
inline constexpr std::int64_t kMaxScheduleSteps = std::int64_t{1} << 53;

/// Records which schedule saved a state: "schedule" (its type name) and "num_groups".
inline void save_schedule_kind(StateDict& sd, const char* name, std::size_t groups) {
  sd.set("schedule", name);
  sd.set("num_groups", static_cast<std::int64_t>(groups));
}
/// Throws unless the schedule type and group count a state records (save_schedule_kind) are
/// `name` and `groups`: a state of another schedule, or of a schedule over another number of
/// parameter groups, would continue as something else without a word. A state without these
/// entries (saved before they were recorded) is not checked here.
TRAINKIT_INLINE void check_schedule_kind(const StateDict& sd, const char* name, std::size_t groups);
}  // namespace detail

class SequentialLR;
struct WarmupCosineOptions;

/// Base of the epoch/step schedules (PyTorch's LRScheduler): call `step()` once after each
/// optimizer step; the optimizer reads the group learning rates it writes. Constructing a
/// schedule performs PyTorch's initial step (it sets the lr for step 0). Not copyable (other
/// schedules and the optimizer share the LrGroups by reference); it must not outlive them.
class LRScheduler {
 public:
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;
  virtual ~LRScheduler() = default;

  /// Advances one step and writes the new learning rates into the groups.
  virtual void step() {
    ++step_count_;
    update_lr(std::nullopt);
  }

  /// The learning rates set by the last step (PyTorch's get_last_lr()).
  const std::vector<double>& last_lr() const noexcept { return last_lr_; }
  /// PyTorch's last_epoch: the number of step() calls since construction.
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }
  LrGroups& groups() noexcept { return *groups_; }
  /// The schedule's type ("CosineAnnealingLR", ...), which state_dict() records and
  /// load_state_dict() checks. A schedule derived outside trainkit that does not override it is
  /// "LRScheduler".
  virtual const char* name() const { return "LRScheduler"; }

  /// schedule (the type name) and num_groups, last_epoch, _step_count, base_lrs.<g>,
  /// _last_lr.<g> and the schedule's options.
  TRAINKIT_INLINE virtual StateDict state_dict() const;
  /// Restores state_dict(), the schedule's saved settings included (as PyTorch's does: a schedule
  /// built with other settings continues the saved one). The group learning rates themselves
  /// belong to the optimizer's state. Throws naming the entry when a count or rate is out of range
  /// or a setting is one the constructor would refuse, and for the state of another schedule
  /// type or of a schedule over another number of groups (nothing is changed then). A state
  /// saved without the type and group count (by an older trainkit) loads unchecked.
  TRAINKIT_INLINE virtual void load_state_dict(const StateDict& sd);

 protected:
  explicit LRScheduler(LrGroups& groups) : groups_(&groups) {
    TRAINKIT_CHECK(!groups.lr.empty(), "optim LR schedule: the optimizer has no parameter groups");
    if (groups.initial_lr.size() != groups.lr.size()) groups.initial_lr = groups.lr;
    base_lrs_ = groups.initial_lr;
  }
  /// For SequentialLR, which has no base_lrs of its own.
  struct NoInit {};
  LRScheduler(LrGroups& groups, NoInit) : groups_(&groups) {}

  /// PyTorch's _initial_step(): _step_count = 0, then step() in "initial mode".
  TRAINKIT_INLINE void initial_step();

  /// PyTorch's _update_lr(epoch): the recursive get_lr(), or with an explicit epoch the closed
  /// form where one exists.
  TRAINKIT_INLINE void update_lr(std::optional<std::int64_t> epoch);

  virtual std::vector<double> get_lr() = 0;
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  virtual void save_options(StateDict&) const {}
  /// Reads and checks the saved settings, then adopts them (throws before changing anything).
  virtual void load_options(const StateDict&) {}

  const std::vector<double>& lrs() const noexcept { return groups_->lr; }
  template <class F>
  std::vector<double> map_lr(F f) const {
    std::vector<double> out;
    for (std::size_t g = 0; g < groups_->lr.size(); ++g) out.push_back(f(groups_->lr[g], g));
    return out;
  }
  template <class F>
  std::vector<double> map_base(F f) const {
    std::vector<double> out;
    for (double b : base_lrs_) out.push_back(f(b));
    return out;
  }

  LrGroups* groups_;
  std::vector<double> base_lrs_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;
  bool is_initial_ = false;
  std::vector<double> last_lr_;

  friend class SequentialLR;
};

/// torch.optim.lr_scheduler.ConstantLR: lr * factor for the first total_iters steps, then lr.
/// factor = 1 gives a constant learning rate.
struct ConstantLROptions {
  double factor = 1.0 / 3;
  std::int64_t total_iters = 5;
};
class ConstantLR final : public LRScheduler {
 public:
  /// Throws unless 0 < factor <= 1 (a factor of 0 would divide by zero at total_iters, as
  /// PyTorch's does) and total_iters >= 0.
  explicit ConstantLR(LrGroups& groups, ConstantLROptions o = {})
      : LRScheduler(groups), o_(checked(o)) {
    initial_step();
  }

  const char* name() const override { return "ConstantLR"; }

 private:
  std::vector<double> get_lr() override {
    if (last_epoch_ == 0) return map_lr([&](double lr, std::size_t) { return lr * o_.factor; });
    if (last_epoch_ != o_.total_iters) return lrs();
    return map_lr([&](double lr, std::size_t) { return lr * (1.0 / o_.factor); });
  }
  std::optional<std::vector<double>> closed_form_lr() const override {
    return map_base([&](double b) {
      return b * (o_.factor + static_cast<double>(last_epoch_ >= o_.total_iters) * (1 - o_.factor));
    });
  }
  void save_options(StateDict& sd) const override {
    detail::set_values(sd, "factor", o_.factor, "total_iters", o_.total_iters);
  }
  void load_options(const StateDict& sd) override {
    o_ = checked({sd.get_double("factor"), sd.get_int("total_iters")});
  }
  static ConstantLROptions checked(const ConstantLROptions& o) {
    TRAINKIT_CHECK(o.factor > 0.0 && o.factor <= 1.0,
                   "ConstantLR: the factor must be in (0, 1], got ", o.factor);
    TRAINKIT_CHECK(o.total_iters >= 0, "ConstantLR: total_iters must be >= 0, got ", o.total_iters);
    return o;
  }
  ConstantLROptions o_;
};

/// torch.optim.lr_scheduler.LinearLR: the factor goes linearly from start_factor to end_factor
/// over total_iters steps (linear warmup with end_factor = 1).
struct LinearLROptions {
  double start_factor = 1.0 / 3;
  double end_factor = 1.0;
  std::int64_t total_iters = 5;
};
class LinearLR final : public LRScheduler {
 public:
  /// Throws unless 0 < start_factor <= 1 and 0 <= end_factor <= 1.
  TRAINKIT_INLINE explicit LinearLR(LrGroups& groups, LinearLROptions o = {});

  const char* name() const override { return "LinearLR"; }

 private:
  TRAINKIT_INLINE std::vector<double> get_lr() override;
  TRAINKIT_INLINE std::optional<std::vector<double>> closed_form_lr() const override;
  void save_options(StateDict& sd) const override {
    detail::set_values(sd, "start_factor", o_.start_factor, "end_factor", o_.end_factor,
                       "total_iters", o_.total_iters);
  }
  void load_options(const StateDict& sd) override {
    o_ = checked(
        {sd.get_double("start_factor"), sd.get_double("end_factor"), sd.get_int("total_iters")});
  }
  TRAINKIT_INLINE static LinearLROptions checked(const LinearLROptions& o);
  LinearLROptions o_;

  friend std::unique_ptr<SequentialLR> warmup_cosine(LrGroups& groups, WarmupCosineOptions o);
};

/// torch.optim.lr_scheduler.CosineAnnealingLR(T_max, eta_min), in PyTorch's recursive form (so
/// it composes with other schedules exactly as PyTorch's does). Up to T_max the values are
/// PyTorch's to the last bit. Past T_max it holds its final value (eta_min) unless `periodic`:
/// PyTorch's cosine rises again towards the base lr there, which a run longer than T_max (e.g.
/// resumed with more steps) would follow without a word.
struct CosineAnnealingLROptions {
  std::int64_t t_max = 100;
  double eta_min = 0.0;
  bool periodic = false;  ///< true: PyTorch's continuation past T_max (rising, period 2 T_max)
};
class CosineAnnealingLR final : public LRScheduler {
 public:
  /// Throws unless 1 <= t_max <= 2^53 and eta_min is finite and >= 0.
  explicit CosineAnnealingLR(LrGroups& groups, CosineAnnealingLROptions o)
      : LRScheduler(groups), o_(checked(o)) {
    initial_step();
  }

  const char* name() const override { return "CosineAnnealingLR"; }

 private:
  TRAINKIT_INLINE std::vector<double> get_lr() override;
  TRAINKIT_INLINE std::optional<std::vector<double>> closed_form_lr() const override;
  void save_options(StateDict& sd) const override {
    detail::set_values(sd, "T_max", o_.t_max, "eta_min", o_.eta_min, "periodic", o_.periodic);
  }
  void load_options(const StateDict& sd) override {
    o_ = checked({sd.get_int("T_max"), sd.get_double("eta_min"),
                  sd.contains("periodic") ? sd.get_int("periodic") != 0 : o_.periodic});
  }
  static CosineAnnealingLROptions checked(const CosineAnnealingLROptions& o) {
    TRAINKIT_CHECK(o.t_max >= 1 && o.t_max <= detail::kMaxScheduleSteps,
                   "CosineAnnealingLR: t_max must be in [1, 2^53], got ", o.t_max);
    TRAINKIT_CHECK(std::isfinite(o.eta_min) && o.eta_min >= 0.0,
                   "CosineAnnealingLR: eta_min must be finite and >= 0, got ", o.eta_min);
    return o;
  }
  CosineAnnealingLROptions o_;

  friend std::unique_ptr<SequentialLR> warmup_cosine(LrGroups& groups, WarmupCosineOptions o);
};

/// torch.optim.lr_scheduler.StepLR: lr *= gamma every step_size steps.
struct StepLROptions {
  std::int64_t step_size = 1;
  double gamma = 0.1;
};
class StepLR final : public LRScheduler {
 public:
  /// Throws unless step_size >= 1.
  explicit StepLR(LrGroups& groups, StepLROptions o) : LRScheduler(groups), o_(checked(o)) {
    initial_step();
  }

  const char* name() const override { return "StepLR"; }

 private:
  std::vector<double> get_lr() override {
    if (last_epoch_ == 0 || detail::py_mod(last_epoch_, o_.step_size) != 0) return lrs();
    return map_lr([&](double lr, std::size_t) { return lr * o_.gamma; });
  }
  std::optional<std::vector<double>> closed_form_lr() const override {
    const std::int64_t k = last_epoch_ >= 0 ? last_epoch_ / o_.step_size
                                            : -((-last_epoch_ + o_.step_size - 1) / o_.step_size);
    return map_base([&](double b) { return b * std::pow(o_.gamma, static_cast<double>(k)); });
  }
  void save_options(StateDict& sd) const override {
    detail::set_values(sd, "step_size", o_.step_size, "gamma", o_.gamma);
  }
  void load_options(const StateDict& sd) override {
    o_ = checked({sd.get_int("step_size"), sd.get_double("gamma")});
  }
  static StepLROptions checked(const StepLROptions& o) {
    TRAINKIT_CHECK(o.step_size >= 1, "StepLR: step_size must be >= 1, got ", o.step_size);
    TRAINKIT_CHECK(std::isfinite(o.gamma) && o.gamma >= 0.0,
                   "StepLR: gamma must be finite and >= 0, got ", o.gamma);
    return o;
  }
  StepLROptions o_;
};

/// torch.optim.lr_scheduler.MultiStepLR: lr *= gamma at each milestone (repeated milestones
/// multiply repeatedly, as PyTorch's Counter does).
struct MultiStepLROptions {
  std::vector<std::int64_t> milestones;
  double gamma = 0.1;
};
class MultiStepLR final : public LRScheduler {
 public:
  /// Throws unless gamma is finite and >= 0.
  explicit MultiStepLR(LrGroups& groups, MultiStepLROptions o)
      : LRScheduler(groups), o_(checked(std::move(o))) {
    initial_step();
  }

  const char* name() const override { return "MultiStepLR"; }

 private:
  /// `o` with its milestones sorted; throws unless gamma is finite and >= 0.
  static MultiStepLROptions checked(MultiStepLROptions o) {
    TRAINKIT_CHECK(std::isfinite(o.gamma) && o.gamma >= 0.0,
                   "MultiStepLR: gamma must be finite and >= 0, got ", o.gamma);
    std::sort(o.milestones.begin(), o.milestones.end());
    return o;
  }
  TRAINKIT_INLINE std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override {
    const auto k = std::upper_bound(o_.milestones.begin(), o_.milestones.end(), last_epoch_) -
                   o_.milestones.begin();
    return map_base([&](double b) { return b * std::pow(o_.gamma, static_cast<double>(k)); });
  }
  TRAINKIT_INLINE void save_options(StateDict& sd) const override;
  TRAINKIT_INLINE void load_options(const StateDict& sd) override;
  MultiStepLROptions o_;
};

/// torch.optim.lr_scheduler.ExponentialLR: lr *= gamma every step.
struct ExponentialLROptions {
  double gamma = 0.99;
};
class ExponentialLR final : public LRScheduler {
 public:
  /// Throws unless gamma is finite and >= 0.
  explicit ExponentialLR(LrGroups& groups, ExponentialLROptions o)
      : LRScheduler(groups), o_(checked(o)) {
    initial_step();
  }

  const char* name() const override { return "ExponentialLR"; }

 private:
  std::vector<double> get_lr() override {
    if (is_initial_) return lrs();
    return map_lr([&](double lr, std::size_t) { return lr * o_.gamma; });
  }
  std::optional<std::vector<double>> closed_form_lr() const override {
    return map_base(
        [&](double b) { return b * std::pow(o_.gamma, static_cast<double>(last_epoch_)); });
  }
  void save_options(StateDict& sd) const override { sd.set("gamma", o_.gamma); }
  void load_options(const StateDict& sd) override { o_ = checked({sd.get_double("gamma")}); }
  static ExponentialLROptions checked(const ExponentialLROptions& o) {
    TRAINKIT_CHECK(std::isfinite(o.gamma) && o.gamma >= 0.0,
                   "ExponentialLR: gamma must be finite and >= 0, got ", o.gamma);
    return o;
  }
  ExponentialLROptions o_;
};

/// torch.optim.lr_scheduler.SequentialLR: schedules[i] runs from milestones[i-1] on; at a
/// milestone the next schedule restarts from its closed form at epoch 0. All schedules must
/// write the same LrGroups. Takes ownership of them.
class SequentialLR final : public LRScheduler {
 public:
  /// Throws unless there is one milestone fewer than schedules, the milestones increase, and
  /// every schedule writes `groups`.
  TRAINKIT_INLINE SequentialLR(LrGroups& groups,
                               std::vector<std::unique_ptr<LRScheduler>> schedules,
                               std::vector<std::int64_t> milestones);

  TRAINKIT_INLINE void step() override;

  /// Its type, group count and number of schedules (num_schedulers), its own last_epoch,
  /// _last_lr and milestones, and each schedule's state under "_schedulers.<i>" (with that
  /// schedule's type). A load refuses a state of another number of schedules.
  TRAINKIT_INLINE StateDict state_dict() const override;
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd) override;

  const char* name() const override { return "SequentialLR"; }

 private:
  std::vector<double> get_lr() override {
    TRAINKIT_FAIL("SequentialLR has no get_lr (it delegates to its schedules)");
  }
  std::size_t index_of(std::int64_t epoch) const {
    return static_cast<std::size_t>(
        std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  }
  std::vector<std::unique_ptr<LRScheduler>> schedules_;
  std::vector<std::int64_t> milestones_;
};

/// Linear warmup then cosine decay, the usual LLM schedule, as PyTorch users write it:
/// SequentialLR([LinearLR(start_factor, 1, warmup_steps), CosineAnnealingLR(total_steps -
/// warmup_steps, eta_min)], milestones = [warmup_steps]), PyTorch's values to the last bit up to
/// total_steps. Past total_steps the lr stays at eta_min (PyTorch's would climb back up).
struct WarmupCosineOptions {
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  double warmup_start_factor = 1e-3;
  double eta_min = 0.0;
};
/// Throws unless 0 < warmup_steps < total_steps.
TRAINKIT_INLINE std::unique_ptr<SequentialLR> warmup_cosine(LrGroups& groups,
                                                            WarmupCosineOptions o);

/// Puts `schedule` and the groups' learning rates where a schedule made by `make(groups)` is
/// after `steps` steps from the groups' initial lr: replayed on a copy of the groups, so the
/// result equals that schedule followed from step 0, bit for bit. For a resumed run that switches
/// schedules, e.g. to a longer one: the restored `schedule` must be of the type `make` returns.
template <class Make>
void replay_schedule(LRScheduler& schedule, LrGroups& groups, std::int64_t steps, Make&& make) {
  LrGroups copy = groups;
  copy.lr = copy.initial_lr;
  auto fresh = make(copy);
  for (std::int64_t s = 0; s < steps; ++s) fresh->step();
  schedule.load_state_dict(fresh->state_dict());
  groups.lr = copy.lr;
}

/// torch.optim.lr_scheduler.ReduceLROnPlateau: step(metric) after each evaluation; after more
/// than `patience` evaluations without improvement (beyond `threshold`, relative or absolute)
/// every group's lr becomes max(lr * factor, min_lr) if that changes it by more than eps; then
/// `cooldown` evaluations are not counted.
struct ReduceLROnPlateauOptions {
  enum class Mode : std::uint8_t { kMin, kMax };
  enum class ThresholdMode : std::uint8_t { kRel, kAbs };
  Mode mode = Mode::kMin;
  double factor = 0.1;
  std::int64_t patience = 10;
  double threshold = 1e-4;
  ThresholdMode threshold_mode = ThresholdMode::kRel;
  std::int64_t cooldown = 0;
  std::vector<double> min_lr = {0.0};  ///< one value for all groups, or one per group
  double eps = 1e-8;
};
class ReduceLROnPlateau {
 public:
  using Options = ReduceLROnPlateauOptions;

 private:
  // What state_dict() saves besides schedule, num_groups, mode, threshold_mode, min_lrs.<g> and
  // _last_lr.<g> ("eps" is optional: states saved before it was saved keep the constructor's).
  static constexpr auto counters() {
    return std::tuple{
        detail::state_field("best", &ReduceLROnPlateau::best_),
        detail::state_field("num_bad_epochs", &ReduceLROnPlateau::num_bad_epochs_),
        detail::state_field("cooldown_counter", &ReduceLROnPlateau::cooldown_counter_),
        detail::state_field("last_epoch", &ReduceLROnPlateau::last_epoch_)};
  }
  static constexpr auto saved_options() {
    return std::tuple{detail::state_field("factor", &Options::factor),
                      detail::state_field("patience", &Options::patience),
                      detail::state_field("threshold", &Options::threshold),
                      detail::state_field("cooldown", &Options::cooldown),
                      detail::optional_state_field("eps", &Options::eps)};
  }

 public:
  /// Throws unless 0 <= factor < 1, patience and cooldown are >= 0, threshold is finite and
  /// every min_lr and eps are finite and >= 0, or for a min_lr list whose length is neither 1 nor
  /// the group count.
  TRAINKIT_INLINE explicit ReduceLROnPlateau(LrGroups& groups, Options o = {});

  /// One evaluation's metric (e.g. validation loss).
  TRAINKIT_INLINE void step(double metric);

  const std::vector<double>& last_lr() const noexcept { return last_lr_; }
  double best() const noexcept { return best_; }
  std::int64_t num_bad_epochs() const noexcept { return num_bad_epochs_; }
  std::int64_t cooldown_counter() const noexcept { return cooldown_counter_; }
  std::int64_t last_epoch() const noexcept { return last_epoch_; }

  /// schedule ("ReduceLROnPlateau") and num_groups, the counters, best, the options PyTorch's
  /// holds (factor, patience, threshold, cooldown, mode, threshold_mode, eps, min_lrs.<g>) and
  /// _last_lr.<g>.
  TRAINKIT_INLINE StateDict state_dict() const;
  /// Restores state_dict(), the saved options included (a state without eps or min_lrs, saved by
  /// an older trainkit, keeps this schedule's). Throws for the state of another schedule type or
  /// group count, or a value the constructor would refuse (nothing is changed then).
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd);

 private:
  TRAINKIT_INLINE void reset();
  TRAINKIT_INLINE bool is_better(double a, double best) const;
  /// Throws, naming `who`, unless the options state_dict() saves are in range.
  TRAINKIT_INLINE static void check_options(const Options& o, const char* who);

  LrGroups* groups_;
  Options o_;
  double best_ = 0.0;
  std::int64_t num_bad_epochs_ = 0;
  std::int64_t cooldown_counter_ = 0;
  std::int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE void detail::check_schedule_kind(const StateDict& sd, const char* name,
                                                 std::size_t groups) {
  const bool has_name = sd.values.count("schedule") != 0;
  const bool has_groups = sd.values.count("num_groups") != 0;
  const std::string saved_name = has_name ? sd.get_string("schedule") : std::string();
  const std::int64_t saved_groups = has_groups ? sd.get_int("num_groups") : 0;
  const auto plural = [](std::int64_t n) { return n == 1 ? " group" : " groups"; };
  TRAINKIT_CHECK(
      (!has_name || saved_name == name) &&
          (!has_groups || saved_groups == static_cast<std::int64_t>(groups)),
      name, " state: the state is from ",
      has_name ? StateDict::shown(saved_name) : std::string("a schedule"),
      has_groups ? " over " + std::to_string(saved_groups) + plural(saved_groups) : std::string(),
      "; this schedule is ", name, " over ", groups, plural(static_cast<std::int64_t>(groups)),
      " (a state loads into the schedule type that saved it, over as many parameter "
      "groups)");
}

TRAINKIT_INLINE StateDict LRScheduler::state_dict() const {
  StateDict sd;
  detail::save_schedule_kind(sd, name(), groups_->lr.size());
  detail::set_values(sd, "last_epoch", last_epoch_, "_step_count", step_count_);
  detail::save_list(sd, "base_lrs", base_lrs_);
  detail::save_list(sd, "_last_lr", last_lr_);
  save_options(sd);
  return sd;
}

TRAINKIT_INLINE void LRScheduler::load_state_dict(const StateDict& sd) {
  detail::check_schedule_kind(sd, name(), groups_->lr.size());
  const std::int64_t last_epoch = sd.get_int("last_epoch");
  const std::int64_t step_count = sd.get_int("_step_count");
  TRAINKIT_CHECK(last_epoch >= -1 && last_epoch <= detail::kMaxScheduleSteps && step_count >= 0 &&
                     step_count <= detail::kMaxScheduleSteps,
                 "LR schedule state: last_epoch ", last_epoch, " and _step_count ", step_count,
                 " must be in [-1, 2^53] and [0, 2^53]");
  std::vector<double> base = base_lrs_, last = last_lr_;
  last.resize(groups_->lr.size());
  detail::load_rates(sd, "LR schedule", "base_lrs", base);
  detail::load_rates(sd, "LR schedule", "_last_lr", last);
  load_options(sd);  // the last check: it adopts the settings when they pass
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = std::move(base);
  last_lr_ = std::move(last);
}

TRAINKIT_INLINE void LRScheduler::initial_step() {
  step_count_ = 0;
  is_initial_ = true;
  step();
  is_initial_ = false;
}

TRAINKIT_INLINE void LRScheduler::update_lr(std::optional<std::int64_t> epoch) {
  std::vector<double> values;
  if (!epoch) {
    ++last_epoch_;
    values = get_lr();
  } else {
    last_epoch_ = *epoch;
    std::optional<std::vector<double>> closed = closed_form_lr();
    values = closed ? std::move(*closed) : get_lr();
  }
  groups_->lr = values;
  last_lr_ = groups_->lr;
}

TRAINKIT_INLINE LinearLR::LinearLR(LrGroups& groups, LinearLROptions o)
    : LRScheduler(groups), o_(checked(o)) {
  initial_step();
}

TRAINKIT_INLINE LinearLROptions LinearLR::checked(const LinearLROptions& o) {
  TRAINKIT_CHECK(o.start_factor > 0.0 && o.start_factor <= 1.0,
                 "LinearLR: start_factor must be in (0, 1], got ", o.start_factor);
  TRAINKIT_CHECK(o.end_factor >= 0.0 && o.end_factor <= 1.0,
                 "LinearLR: end_factor must be in [0, 1], got ", o.end_factor);
  TRAINKIT_CHECK(o.total_iters >= 1, "LinearLR: total_iters must be >= 1, got ", o.total_iters);
  return o;
}

TRAINKIT_INLINE std::vector<double> LinearLR::get_lr() {
  if (last_epoch_ == 0) return map_lr([&](double lr, std::size_t) { return lr * o_.start_factor; });
  if (is_initial_ || last_epoch_ > o_.total_iters) return lrs();
  const double d = o_.end_factor - o_.start_factor;
  return map_lr([&](double lr, std::size_t) {
    return lr * (1.0 + d / (static_cast<double>(o_.total_iters) * o_.start_factor +
                            static_cast<double>(last_epoch_ - 1) * d));
  });
}

TRAINKIT_INLINE std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  return map_base([&](double b) {
    return b * (o_.start_factor + (o_.end_factor - o_.start_factor) *
                                      static_cast<double>(std::min(o_.total_iters, last_epoch_)) /
                                      static_cast<double>(o_.total_iters));
  });
}

TRAINKIT_INLINE std::vector<double> CosineAnnealingLR::get_lr() {
  using detail::kPi;
  const double t = static_cast<double>(o_.t_max);
  const double e = static_cast<double>(last_epoch_);
  const double eta = o_.eta_min;
  if (is_initial_) return lrs();
  if (!o_.periodic && last_epoch_ > o_.t_max) return lrs();  // holds the value of T_max
  if (step_count_ == 1 && last_epoch_ > 0) {
    return map_lr([&](double, std::size_t g) {
      return eta + (base_lrs_[g] - eta) * (1 + std::cos(e * kPi / t)) / 2;
    });
  }
  if (detail::py_mod(last_epoch_ - 1 - o_.t_max, 2 * o_.t_max) == 0) {
    return map_lr([&](double lr, std::size_t g) {
      return lr + (base_lrs_[g] - eta) * (1 - std::cos(kPi / t)) / 2;
    });
  }
  return map_lr([&](double lr, std::size_t) {
    return (1 + std::cos(kPi * e / t)) / (1 + std::cos(kPi * (e - 1) / t)) * (lr - eta) + eta;
  });
}

TRAINKIT_INLINE std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  const double e = static_cast<double>(o_.periodic ? last_epoch_ : std::min(last_epoch_, o_.t_max));
  const double t = static_cast<double>(o_.t_max);
  return map_base([&](double b) {
    return o_.eta_min + (b - o_.eta_min) * (1 + std::cos(detail::kPi * e / t)) / 2;
  });
}

TRAINKIT_INLINE std::vector<double> MultiStepLR::get_lr() {
  const auto count = std::count(o_.milestones.begin(), o_.milestones.end(), last_epoch_);
  if (count == 0) return lrs();
  return map_lr(
      [&](double lr, std::size_t) { return lr * std::pow(o_.gamma, static_cast<double>(count)); });
}

TRAINKIT_INLINE void MultiStepLR::save_options(StateDict& sd) const {
  detail::set_values(sd, "gamma", o_.gamma, "milestones",
                     static_cast<std::int64_t>(o_.milestones.size()));
  for (std::size_t i = 0; i < o_.milestones.size(); ++i)
    sd.set("milestones." + std::to_string(i), o_.milestones[i]);
}

TRAINKIT_INLINE void MultiStepLR::load_options(const StateDict& sd) {
  MultiStepLROptions o{{}, sd.get_double("gamma")};
  const std::int64_t n = sd.get_int("milestones");
  // Each milestone is an entry of its own: a count beyond the entries is damage, not a size.
  TRAINKIT_CHECK(n >= 0 && static_cast<std::uint64_t>(n) <= sd.values.size(),
                 "MultiStepLR: the state claims ", n, " milestones");
  for (std::int64_t i = 0; i < n; ++i)
    o.milestones.push_back(sd.get_int("milestones." + std::to_string(i)));
  o_ = checked(std::move(o));
}

TRAINKIT_INLINE SequentialLR::SequentialLR(LrGroups& groups,
                                           std::vector<std::unique_ptr<LRScheduler>> schedules,
                                           std::vector<std::int64_t> milestones)
    : LRScheduler(groups, NoInit{}),
      schedules_(std::move(schedules)),
      milestones_(std::move(milestones)) {
  TRAINKIT_CHECK(!schedules_.empty(), "SequentialLR expects at least one schedule");
  TRAINKIT_CHECK(milestones_.size() + 1 == schedules_.size(), "SequentialLR: ", schedules_.size(),
                 " schedules need ", schedules_.size() - 1, " milestones, got ",
                 milestones_.size());
  TRAINKIT_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()),
                 "SequentialLR: the milestones must be non-decreasing");
  for (const auto& s : schedules_) {
    TRAINKIT_CHECK(s != nullptr && s->groups_ == &groups,
                   "SequentialLR: every schedule must belong to the same optimizer (LrGroups)");
    TRAINKIT_CHECK(dynamic_cast<const SequentialLR*>(s.get()) == nullptr,
                   "SequentialLR: nested SequentialLR is not supported");
  }
  last_epoch_ = 0;
  groups.lr = groups.initial_lr;
  for (auto& s : schedules_) s->last_epoch_ -= 1;
  LRScheduler& first = *schedules_[index_of(0)];
  first.initial_step();
  last_lr_ = first.last_lr();
}

TRAINKIT_INLINE void SequentialLR::step() {
  ++last_epoch_;
  const std::size_t idx = index_of(last_epoch_);
  LRScheduler& s = *schedules_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_) {
    s.update_lr(0);
  } else {
    s.step();
  }
  last_lr_ = s.last_lr();
}

TRAINKIT_INLINE StateDict SequentialLR::state_dict() const {
  StateDict sd;
  detail::save_schedule_kind(sd, name(), groups_->lr.size());
  sd.set("num_schedulers", static_cast<std::int64_t>(schedules_.size()));
  sd.set("last_epoch", last_epoch_);
  detail::save_list(sd, "_last_lr", last_lr_);
  for (std::size_t i = 0; i < milestones_.size(); ++i)
    sd.set("_milestones." + std::to_string(i), milestones_[i]);
  for (std::size_t i = 0; i < schedules_.size(); ++i)
    sd.merge("_schedulers." + std::to_string(i), schedules_[i]->state_dict());
  return sd;
}

TRAINKIT_INLINE void SequentialLR::load_state_dict(const StateDict& sd) {
  detail::check_schedule_kind(sd, name(), groups_->lr.size());
  if (sd.values.count("num_schedulers") != 0) {  // absent in states of older trainkits
    const std::int64_t saved = sd.get_int("num_schedulers");
    TRAINKIT_CHECK(saved == static_cast<std::int64_t>(schedules_.size()),
                   "SequentialLR state: the state is from a SequentialLR of ", saved,
                   " schedules; this one has ", schedules_.size());
  }
  const std::int64_t last_epoch = sd.get_int("last_epoch");
  TRAINKIT_CHECK(last_epoch >= 0 && last_epoch <= detail::kMaxScheduleSteps,
                 "SequentialLR state: last_epoch ", last_epoch, " must be in [0, 2^53]");
  std::vector<double> last(groups_->lr.size(), 0.0);
  detail::load_rates(sd, "SequentialLR", "_last_lr", last);
  std::vector<std::int64_t> milestones;  // the saved ones, as PyTorch restores _milestones
  for (std::size_t i = 0; i < milestones_.size(); ++i)
    milestones.push_back(sd.get_int("_milestones." + std::to_string(i)));
  TRAINKIT_CHECK(std::is_sorted(milestones.begin(), milestones.end()),
                 "SequentialLR state: the saved milestones are not in order");
  // Each schedule checks its part before it changes; when a later one throws, the earlier ones
  // go back to their own states (which always load), so nothing has changed.
  std::vector<StateDict> before;
  for (const auto& schedule : schedules_) before.push_back(schedule->state_dict());
  std::size_t i = 0;
  try {
    for (; i < schedules_.size(); ++i)
      schedules_[i]->load_state_dict(sd.sub("_schedulers." + std::to_string(i)));
  } catch (...) {
    for (std::size_t k = 0; k < i; ++k) schedules_[k]->load_state_dict(before[k]);
    throw;
  }
  last_epoch_ = last_epoch;
  last_lr_ = std::move(last);
  milestones_ = std::move(milestones);
}

TRAINKIT_INLINE std::unique_ptr<SequentialLR> warmup_cosine(LrGroups& groups,
                                                            WarmupCosineOptions o) {
  TRAINKIT_CHECK(o.warmup_steps > 0 && o.warmup_steps < o.total_steps,
                 "warmup_cosine: need 0 < warmup_steps < total_steps, got ", o.warmup_steps,
                 " and ", o.total_steps);
  // Both schedules' options are checked before the first one scales the groups' lr.
  const LinearLROptions warmup = LinearLR::checked({o.warmup_start_factor, 1.0, o.warmup_steps});
  const CosineAnnealingLROptions decay =
      CosineAnnealingLR::checked({o.total_steps - o.warmup_steps, o.eta_min});
  std::vector<std::unique_ptr<LRScheduler>> s;
  s.push_back(std::make_unique<LinearLR>(groups, warmup));
  s.push_back(std::make_unique<CosineAnnealingLR>(groups, decay));
  return std::make_unique<SequentialLR>(groups, std::move(s),
                                        std::vector<std::int64_t>{o.warmup_steps});
}

TRAINKIT_INLINE ReduceLROnPlateau::ReduceLROnPlateau(LrGroups& groups, Options o)
    : groups_(&groups), o_(std::move(o)) {
  check_options(o_, "ReduceLROnPlateau");
  TRAINKIT_CHECK(o_.min_lr.size() == 1 || o_.min_lr.size() == groups.lr.size(),
                 "ReduceLROnPlateau: expected 1 or ", groups.lr.size(), " min_lr values, got ",
                 o_.min_lr.size());
  if (o_.min_lr.size() == 1) o_.min_lr.assign(groups.lr.size(), o_.min_lr[0]);
  last_lr_ = groups.lr;
  reset();
}

TRAINKIT_INLINE void ReduceLROnPlateau::step(double metric) {
  const double current = metric;
  last_epoch_ += 1;
  if (is_better(current, best_)) {
    best_ = current;
    num_bad_epochs_ = 0;
  } else {
    num_bad_epochs_ += 1;
  }
  if (cooldown_counter_ > 0) {
    cooldown_counter_ -= 1;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ > o_.patience) {
    for (std::size_t g = 0; g < groups_->lr.size(); ++g) {
      const double old_lr = groups_->lr[g];
      const double new_lr = std::max(old_lr * o_.factor, o_.min_lr[g]);
      if (old_lr - new_lr > o_.eps) groups_->lr[g] = new_lr;
    }
    cooldown_counter_ = o_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_ = groups_->lr;
}

TRAINKIT_INLINE StateDict ReduceLROnPlateau::state_dict() const {
  StateDict sd;
  detail::save_schedule_kind(sd, "ReduceLROnPlateau", groups_->lr.size());
  detail::save_fields(sd, *this, counters());
  detail::save_fields(sd, o_, saved_options());
  detail::save_list(sd, "min_lrs", o_.min_lr);  // PyTorch's names: min_lrs, eps
  sd.set("mode", o_.mode == Options::Mode::kMin ? "min" : "max");
  sd.set("threshold_mode", o_.threshold_mode == Options::ThresholdMode::kRel ? "rel" : "abs");
  detail::save_list(sd, "_last_lr", last_lr_);
  return sd;
}

TRAINKIT_INLINE void ReduceLROnPlateau::load_state_dict(const StateDict& sd) {
  detail::check_schedule_kind(sd, "ReduceLROnPlateau", groups_->lr.size());
  ReduceLROnPlateau loaded(*this);  // checked whole before anything here changes
  detail::load_fields(sd, loaded, counters());
  detail::load_fields(sd, loaded.o_, saved_options());  // eps: kept when the state has none
  // min_lrs.<g>, checked with the other options below; a state saved without them keeps ours.
  if (sd.values.count("min_lrs.0") != 0) detail::load_list(sd, "min_lrs", loaded.o_.min_lr);
  const std::string mode = sd.get_string("mode"), threshold_mode = sd.get_string("threshold_mode");
  TRAINKIT_CHECK(mode == "min" || mode == "max", "ReduceLROnPlateau state: mode '",
                 StateDict::shown(mode), "' is not min or max");
  TRAINKIT_CHECK(threshold_mode == "rel" || threshold_mode == "abs",
                 "ReduceLROnPlateau state: threshold_mode '", StateDict::shown(threshold_mode),
                 "' is not rel or abs");
  loaded.o_.mode = mode == "min" ? Options::Mode::kMin : Options::Mode::kMax;
  loaded.o_.threshold_mode =
      threshold_mode == "rel" ? Options::ThresholdMode::kRel : Options::ThresholdMode::kAbs;
  check_options(loaded.o_, "ReduceLROnPlateau state");
  const auto count_ok = [](std::int64_t c) { return c >= 0 && c <= detail::kMaxScheduleSteps; };
  TRAINKIT_CHECK(count_ok(loaded.num_bad_epochs_) && count_ok(loaded.cooldown_counter_) &&
                     count_ok(loaded.last_epoch_) && !std::isnan(loaded.best_),
                 "ReduceLROnPlateau state: num_bad_epochs ", loaded.num_bad_epochs_,
                 ", cooldown_counter ", loaded.cooldown_counter_, ", last_epoch ",
                 loaded.last_epoch_, ", best ", loaded.best_,
                 " (expected counts in [0, 2^53] and a best value that is a number)");
  detail::load_rates(sd, "ReduceLROnPlateau", "_last_lr", loaded.last_lr_);
  *this = std::move(loaded);
}

TRAINKIT_INLINE void ReduceLROnPlateau::check_options(const Options& o, const char* who) {
  TRAINKIT_CHECK(o.factor >= 0.0 && o.factor < 1.0 && o.patience >= 0 && o.cooldown >= 0 &&
                     std::isfinite(o.threshold),
                 who, ": factor ", o.factor, ", patience ", o.patience, ", cooldown ", o.cooldown,
                 ", threshold ", o.threshold,
                 " (expected factor in [0, 1), patience and cooldown >= 0, a finite threshold)");
  // A NaN or infinite floor or eps would freeze or blow up the learning rates.
  for (std::size_t g = 0; g < o.min_lr.size(); ++g)
    TRAINKIT_CHECK(std::isfinite(o.min_lr[g]) && o.min_lr[g] >= 0.0, who, ": min_lr ", g, " is ",
                   o.min_lr[g], "; expected a learning rate, finite and >= 0");
  TRAINKIT_CHECK(std::isfinite(o.eps) && o.eps >= 0.0, who, ": eps is ", o.eps,
                 "; expected a finite number >= 0");
}

TRAINKIT_INLINE void ReduceLROnPlateau::reset() {
  best_ = o_.mode == Options::Mode::kMin ? std::numeric_limits<double>::infinity()
                                         : -std::numeric_limits<double>::infinity();
  cooldown_counter_ = 0;
  num_bad_epochs_ = 0;
}

TRAINKIT_INLINE bool ReduceLROnPlateau::is_better(double a, double best) const {
  const bool rel = o_.threshold_mode == Options::ThresholdMode::kRel;
  if (o_.mode == Options::Mode::kMin)
    return rel ? a < best * (1.0 - o_.threshold) : a < best - o_.threshold;
  return rel ? a > best * (o_.threshold + 1.0) : a > best + o_.threshold;
}

#endif  // TRAINKIT_IMPL

}  // namespace optim
TRAINKIT_NAMESPACE_END
