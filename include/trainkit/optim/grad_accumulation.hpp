// SPDX-License-Identifier: MIT
// trainkit/optim/grad_accumulation.hpp: `GradAccumulation`, the bookkeeping of gradient
// accumulation over N micro-batches. trainkit layers ADD their parameter gradients into the
// ParamArena, so micro-batches sum up by themselves; this says when to step (and zero), which
// micro-batch is the last (the one whose backward a DDP bucketer should all-reduce), and the
// factor 1/N that makes the sum a mean (fold it into the loss gradient, as `loss / N` in PyTorch).
#pragma once

#include <cstdint>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/optim/detail/state_fields.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// Counts micro-batches: `for (...) { backward with dloss * acc.loss_scale(); if
/// (acc.micro_step()) { opt.step(exec); arena.zero_grad(); } }`.
class GradAccumulation {
 public:
  /// Throws unless micro_batches >= 1.
  explicit GradAccumulation(std::int64_t micro_batches) : n_(micro_batches) {
    TRAINKIT_CHECK(micro_batches >= 1,
                   "optim::GradAccumulation: micro_batches must be >= 1, "
                   "got ",
                   micro_batches);
  }

  std::int64_t micro_batches() const noexcept { return n_; }
  /// 1 / micro_batches: multiply the loss gradient by it so the accumulated gradient is the
  /// mean over all micro-batches (what one big batch would give).
  float loss_scale() const noexcept { return static_cast<float>(1.0 / static_cast<double>(n_)); }
  /// Index of the micro-batch about to run, 0 .. micro_batches - 1.
  std::int64_t index() const noexcept { return index_; }
  /// True while the micro-batch about to run is the last before a step (DDP: all-reduce its
  /// gradients; the earlier ones are "no_sync").
  bool is_last() const noexcept { return index_ + 1 == n_; }
  /// Records one finished micro-batch; true when it completed a group of micro_batches: step
  /// the optimizer and zero the gradients now.
  bool micro_step() noexcept {
    if (++index_ < n_) return false;
    index_ = 0;
    ++steps_;
    return true;
  }
  /// Optimizer steps completed so far.
  std::int64_t steps() const noexcept { return steps_; }

  StateDict state_dict() const {
    StateDict sd;
    detail::set_values(sd, "micro_batches", n_, "index", index_, "steps", steps_);
    return sd;
  }
  /// Throws when the state was saved with a different micro-batch count, or its "index" is
  /// outside [0, micro_batches) or its "steps" is negative (nothing changed then).
  void load_state_dict(const StateDict& sd) {
    TRAINKIT_CHECK(sd.get_int("micro_batches") == n_, "optim::GradAccumulation: the state has ",
                   sd.get_int("micro_batches"), " micro-batches, this object ", n_);
    const std::int64_t index = sd.get_int("index");
    const std::int64_t steps = sd.get_int("steps");
    TRAINKIT_CHECK(index >= 0 && index < n_,
                   "optim::GradAccumulation::load_state_dict: 'index' is ", index,
                   "; expected 0 .. ", n_ - 1);
    TRAINKIT_CHECK(steps >= 0, "optim::GradAccumulation::load_state_dict: 'steps' is ", steps,
                   "; expected a count >= 0");
    index_ = index;
    steps_ = steps;
  }

 private:
  std::int64_t n_;
  std::int64_t index_ = 0;
  std::int64_t steps_ = 0;
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
