// SPDX-License-Identifier: MIT
// trainkit/train/loop.hpp: `train::Loop`, the training loop every trainer repeats, owned by the
// library. The user supplies the step (forward, loss, backward: a `step(StepContext&)` member
// returning the loss) and optionally `evaluate()`; the loop owns the rest:
//   - resume: the newest checkpoint of <dir>/ckpt that verifies is restored (model, optimizer,
//     schedule, scaler, every registered component, counters), and the run's configuration
//     (Flags::run_config()) stored with it is adopted or checked: a differing flag is an error
//     listing every difference;
//   - cadence: evaluation every `eval_every` steps and at the end, checkpoints every
//     `ckpt_every` steps / `ckpt_every_seconds`, a final save, logging through a Monitor
//     (progress, TensorBoard in <dir>/tb, <dir>/metrics.jsonl) that continues a resumed run's;
//   - the optimizer's fused step with gradient clipping and the loss scaler, then the schedule;
//   - a non-finite loss stops the run with an error naming the step (nothing is saved for it);
//   - SIGINT / SIGTERM finish the current step, save a checkpoint and return.
// Hooks are found at compile time (a task without evaluate() has no evaluation), so the step
// costs no virtual call. Everything the loop does is public API of ckpt/, optim/ and monitor/:
// a trainer that needs another order writes its own loop from the same pieces (the low-level
// tier); Loop is the high-level one.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/amp/scaler_fwd.hpp"
#include "trainkit/ckpt/checkpointer.hpp"
#include "trainkit/ckpt/train_state.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/error.hpp"
#include "trainkit/monitor/monitor.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/lr_schedule.hpp"
#include "trainkit/optim/optimizer.hpp"
#include "trainkit/train/flags.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace train {

/// What a Loop does; `steps` and `dir` are required.
struct LoopOptions {
  std::int64_t steps = 0;       ///< train until this many optimizer steps are completed
  std::filesystem::path dir;    ///< the run directory: ckpt/, tb/, metrics.jsonl
  std::int64_t eval_every = 0;  ///< evaluate after every N steps (0: only after the last one)
  /// Also evaluate before the first step of a fresh run, logged as step 0 (the untrained
  /// model's metrics; kept in the checkpoints, so a resumed run reports them too).
  bool eval_at_start = false;
  /// Print each evaluation through the monitor: "step N: train loss L | <metric> V ... | lr X"
  /// (the lr of step N), and "step 0: <metric> V ..." for eval_at_start.
  bool print_evals = false;
  std::int64_t ckpt_every = 0;      ///< checkpoint after every N steps (0: only the final save)
  double ckpt_every_seconds = 0.0;  ///< also after this many seconds since the last save
  int keep_last = 3;                ///< checkpoints kept besides the best (see Checkpointer)
  /// The evaluate() metric that picks the best checkpoint (kept besides the last ones) and
  /// `best_mode` says whether lower or higher is better; empty: no best checkpoint.
  std::string best_metric = {};
  ckpt::MetricMode best_mode = ckpt::MetricMode::kMin;
  double clip_grad_norm = 0.0;  ///< > 0: clip by global norm inside the optimizer's step
  /// Log the global gradient norm (train/grad_norm); it comes from the optimizer's step (no
  /// extra pass when clipping or a loss scaler computes it, one read pass otherwise). Read every
  /// step for a host arena; for a device arena (the read waits for the GPU) every
  /// monitor.log_every steps, and a non-finite norm is noticed on those steps.
  bool log_grad_norm = true;
  /// Continue from the newest usable checkpoint of dir/ckpt when there is one (false: refuse to
  /// start in a directory that holds checkpoints).
  bool resume = true;
  /// When only damaged checkpoints remain: start from scratch instead of failing.
  bool allow_fresh_start = false;
  /// How the error of a resume that found only damaged checkpoints names allow_fresh_start (a
  /// program's flag, e.g. "--allow-fresh-start").
  std::string fresh_start_setting = "LoopOptions::allow_fresh_start";
  /// SIGINT / SIGTERM end the run after the current step with a checkpoint.
  bool handle_signals = true;
  /// Write checkpoints on a background thread, which also makes the snapshot's copies of the
  /// parameters and optimizer state while the next step's forward and backward run (the
  /// optimizer step waits for them; CheckpointerOptions::overlap_snapshot).
  bool async_checkpoints = true;
  /// Monitor settings; total_steps, resume_step, log_dir ("<dir>/tb") and metrics_file
  /// ("<dir>/metrics.jsonl") are filled in by the loop where left at their defaults.
  monitor::MonitorOptions monitor = {};
  /// Data parallelism: this process's (or thread's) communicator; every rank runs its own Loop
  /// over the same dir with the same options. Rank 0 prints and writes the logs (the others'
  /// monitors are silent), every rank writes its part of each checkpoint (rank 0 commits it),
  /// and the ranks agree on stopping (a signal seen by one rank stops all after the same step).
  /// The task averages the gradients (e.g. CausalLmTask's comm). null: a single process.
  dist::Comm* comm = nullptr;
  /// With `comm`: a second communicator over the same ranks for the checkpoints' barriers, so
  /// that async_checkpoints can write on a background thread; null: checkpoints are written
  /// synchronously (one communicator cannot serve two threads).
  dist::Comm* checkpoint_comm = nullptr;
};

/// A loss left in the memory it was computed in (e.g. a float in device memory that the loss
/// kernel wrote). task.step() may return one instead of a float: the loop then reads it only on
/// the first step and the steps that log (monitor.log_every), evaluate or checkpoint
/// (ckpt_every) and the last one, so a GPU step needs no host synchronisation; a non-finite loss is
/// noticed on those steps, and on_step_end() gets NaN on the others. The memory must hold the loss
/// until the next step.
struct LossHandle {
  const float* data = nullptr;
  Space space = Space::kHost;
  /// The value (on the device: waits for the work that writes it).
  float get() const {
    TRAINKIT_CHECK(data != nullptr, "train::LossHandle::get on an empty handle");
    return read_value(data, space, "train::LossHandle");
  }
};

/// What the task's step sees.
struct StepContext {
  std::int64_t step = 0;                ///< steps completed before this one (0 for the first step)
  monitor::Monitor* monitor = nullptr;  ///< for spans (data wait, forward, backward)
};

/// How run() ended.
struct LoopResult {
  std::int64_t step = 0;            ///< steps completed (the checkpoint's number)
  std::int64_t steps_this_run = 0;  ///< steps this process trained
  double seconds = 0.0;             ///< wall time of those steps (evaluations and saves included)
  float last_loss = NAN;            ///< loss of the last step (NaN when none ran)
  float first_loss = NAN;  ///< loss of the run's first step (kept in checkpoints: also on resume)
  /// Mean of the last (up to 10) losses this process read, and how many: every step's for a
  /// float loss, the logging steps' for a LossHandle.
  double recent_loss = NAN;
  int recent_count = 0;
  ckpt::Metrics last_eval;   ///< the last evaluate() result
  ckpt::Metrics first_eval;  ///< the step-0 evaluation (eval_at_start), also after resume
  bool interrupted = false;  ///< stopped by SIGINT / SIGTERM (after a checkpoint)
  std::optional<ckpt::CheckpointInfo> resumed_from;  ///< the checkpoint this run continued
};

namespace detail {

/// The signal a running Loop was asked to stop by (0: none). One Loop runs at a time.
inline std::atomic<int>& stop_signal() noexcept {
  static std::atomic<int> value{0};
  return value;
}
extern "C" inline void loop_signal_handler(int sig) { stop_signal().store(sig); }

/// Installs the handlers for the lifetime of a run and restores the previous ones.
class SignalScope {
 public:
  explicit SignalScope(bool enabled) : enabled_(enabled) {
    stop_signal().store(0);
    if (!enabled_) return;
    previous_int_ = std::signal(SIGINT, loop_signal_handler);
    previous_term_ = std::signal(SIGTERM, loop_signal_handler);
  }
  ~SignalScope() {
    if (!enabled_) return;
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  bool enabled_;
  void (*previous_int_)(int) = SIG_DFL;
  void (*previous_term_)(int) = SIG_DFL;
};

template <class T>
concept HasEvaluate = requires(T& t) {
  { t.evaluate() } -> std::convertible_to<ckpt::Metrics>;
};
template <class T>
concept HasStepEnd = requires(T& t, std::int64_t step, float loss) {
  t.on_step_end(step, loss);
};
template <class T>
concept HasOptimizerStepHook = requires(T& t, std::int64_t step) {
  t.on_optimizer_step(step);
};
template <class T>
concept HasOnResume = requires(T& t, const ckpt::CheckpointInfo& info) {
  t.on_resume(info);
};

inline constexpr std::string_view kConfigPrefix = "config.";
inline constexpr std::string_view kFirstEvalPrefix = "eval_at_start.";
inline constexpr const char* kFirstLossKey = "loop.first_loss";

}  // namespace detail

/// A task made of callables, for trainers that keep their model in local variables:
/// `loop.run(exec, arena, opt, train::task([&](train::StepContext&) { ...; return loss; },
/// [&] { return ckpt::Metrics{...}; }), schedule)`. The evaluation is optional.
template <class StepFn, class EvalFn = std::nullptr_t, class ResumeFn = std::nullptr_t>
struct FunctionTask {
  StepFn step_fn;
  EvalFn eval_fn = nullptr;
  ResumeFn resume_fn = nullptr;
  float step(StepContext& ctx) { return step_fn(ctx); }
  ckpt::Metrics evaluate() requires(!std::is_null_pointer_v<EvalFn>) { return eval_fn(); }
  void on_resume(const ckpt::CheckpointInfo& info) requires(!std::is_null_pointer_v<ResumeFn>) {
    resume_fn(info);
  }
};
/// The evaluation and the resume hook (see Loop::run) are optional.
template <class StepFn, class EvalFn = std::nullptr_t, class ResumeFn = std::nullptr_t>
FunctionTask<StepFn, EvalFn, ResumeFn> task(StepFn step, EvalFn evaluate = nullptr,
                                            ResumeFn on_resume = nullptr) {
  return {std::move(step), std::move(evaluate), std::move(on_resume)};
}

/// The training loop. Construct it before building the model: on resume it adopts the saved
/// run configuration into `flags` (so the model is built with the checkpoint's sizes). Register
/// everything that has state with state() (the model arena, the optimizer and the schedule are
/// registered by run()), then call run().
class Loop {
 public:
  /// Opens <dir>/ckpt. With `flags`, the kRun flags are saved into every checkpoint and, on
  /// resume, adopted from the newest usable one (a flag given with another value is an error
  /// listing each difference). Throws when options.resume is false and checkpoints exist.
  explicit Loop(LoopOptions options, Flags* flags = nullptr)
      : options_(std::move(options)),
        flags_(flags),
        checkpointer_((options_.dir / "ckpt").string(), checkpointer_options(options_)) {
    TRAINKIT_CHECK(options_.steps > 0, "train::Loop: steps must be > 0 (got ", options_.steps, ")");
    TRAINKIT_CHECK(!options_.dir.empty(), "train::Loop: the run directory (dir) is empty");
    TRAINKIT_CHECK(options_.eval_every >= 0 && options_.ckpt_every >= 0,
                   "train::Loop: eval_every and ckpt_every must be >= 0");
    if (options_.resume) {
      resume_from_ = checkpointer_.newest_usable(fresh_start_options());
    } else {
      const auto existing = checkpointer_.list();
      TRAINKIT_CHECK(existing.empty(), "train::Loop: ", checkpointer_.root().string(),
                     " holds checkpoints already (newest: step ",
                     existing.empty() ? 0 : existing.back().step,
                     "); resume that run, or give the new one another directory");
    }
    if (resume_from_ && flags_ != nullptr)
      flags_->adopt(saved_flags(*resume_from_), resume_from_->path.string());
  }

  /// Adopts into `flags` the kRun flags saved with the newest checkpoint under <dir>/ckpt whose
  /// manifest reads, as the constructor does on resume (a flag given with another value is an
  /// error), without creating, verifying or moving anything on disk; false when there is none.
  /// For what a program must know before it can build its Loop, such as how many ranks to
  /// start; the Loop then adopts from the checkpoint it verifies (the same one unless that is
  /// damaged: an older one's settings then replace these, and a rank count that differs from the
  /// one started fails the resume).
  static bool adopt_saved_flags(Flags& flags, const std::filesystem::path& dir) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir / "ckpt", ec)) return false;
    const ckpt::Checkpointer reader((dir / "ckpt").string(), {.remove_stale = false});
    const std::vector<ckpt::CheckpointInfo> found = reader.list();
    if (found.empty()) return false;
    flags.adopt(saved_flags(found.back()), found.back().path.string());
    return true;
  }

  /// The checkpoint run() will continue from (nullopt: a fresh run).
  const std::optional<ckpt::CheckpointInfo>& resuming() const noexcept { return resume_from_; }
  /// What checkpoints hold besides the model, optimizer and schedule: add the data loader,
  /// samplers, RNG streams, dropout, EMA, ... here before run().
  ckpt::TrainState& state() noexcept { return state_; }
  ckpt::Checkpointer& checkpointer() noexcept { return checkpointer_; }
  /// The Monitor of the running run() (for print() and spans in hooks); null outside run().
  monitor::Monitor* monitor() noexcept { return monitor_; }
  const LoopOptions& options() const noexcept { return options_; }
  /// The settings of the Monitor run() will create (throughput, FLOPs, peak, trace file): for
  /// what is only known once the model is built (after a resume adopted its sizes).
  monitor::MonitorOptions& monitor_options() noexcept { return options_.monitor; }

  /// Trains until options.steps steps are completed (continuing a resumed run), a signal, or
  /// an error. `task.step(StepContext&)` runs forward, loss and backward and returns the loss,
  /// as a float or a LossHandle (gradients are zeroed before it); optional `task.evaluate()`
  /// returns metrics (ckpt::Metrics), optional `task.on_optimizer_step(step)` right after each
  /// optimizer (and schedule) step, before evaluation and checkpoint (`step`: the steps now
  /// completed; e.g. to re-apply pruning masks), optional `task.on_step_end(step, loss)` after each
  /// step and optional `task.on_resume(const ckpt::CheckpointInfo&)` once a checkpoint has been
  /// restored, before the first step (to adapt restored state, e.g. a schedule for a longer run).
  /// `schedule` (any type with `step()` and state_dict members, e.g. an LRScheduler; nullptr: none)
  /// is stepped after each optimizer step; `scaler` is passed to the optimizer's fused step.
  template <class E, Space S, class Opt, class Task, class Sched = optim::LRScheduler,
            class Scaler = amp::NoScaler>
  LoopResult run(const E& exec, nn::ParamArena<S>& arena, Opt& opt, Task&& task,
                 Sched* schedule = nullptr, Scaler&& scaler = {}) {
    LoopResult result;
    register_parts(arena, opt, schedule, scaler);
    if (resume_from_) {
      const auto info = checkpointer_.resume(state_, fresh_start_options());
      const bool quiet = rank() != 0;
      TRAINKIT_CHECK(info.has_value() && info->step == resume_from_->step,
                     "train::Loop: the checkpoint of step ", resume_from_->step,
                     " verified when the loop was built but could not be restored now (",
                     info ? "restored step " + std::to_string(info->step) : "nothing restored",
                     "; see the log above)");
      result.resumed_from = info;
      if (!quiet)
        std::printf("train::Loop: resumed from %s (step %lld)\n", info->path.string().c_str(),
                    static_cast<long long>(info->step));
      // Read as they were written (StateDict::number_to_string): exactly, denormals included.
      StateDict saved;
      saved.values.insert(state_.metadata.begin(), state_.metadata.end());
      for (const auto& [key, value] : state_.metadata)
        if (key.starts_with(detail::kFirstEvalPrefix))
          result.first_eval[key.substr(detail::kFirstEvalPrefix.size())] = saved.get_double(key);
      if (saved.values.count(std::string(detail::kFirstLossKey)))
        result.first_loss = static_cast<float>(saved.get_double(detail::kFirstLossKey));
      if constexpr (detail::HasOnResume<std::remove_cvref_t<Task>>) task.on_resume(*info);
    }
    // After the resume, which replaced the metadata with the checkpoint's: a kRun flag added to
    // the program since that checkpoint is saved from now on (and checked by the next resume).
    if (flags_ != nullptr)
      for (const auto& [key, value] : flags_->run_config())
        state_.metadata[std::string(detail::kConfigPrefix) + key] = value;
    result.step = state_.step;

    monitor::MonitorOptions mo = options_.monitor;
    if (mo.total_steps == 0) mo.total_steps = options_.steps;
    if (resume_from_ && mo.resume_step < 0) mo.resume_step = state_.step;
    if (mo.log_dir.empty()) mo.log_dir = (options_.dir / "tb").string();
    if (mo.metrics_file.empty()) mo.metrics_file = (options_.dir / "metrics.jsonl").string();
    if (rank() != 0) {  // rank 0 speaks for the run
      mo.console = nullptr;
      mo.log_dir.clear();
      mo.metrics_file.clear();
      mo.chrome_trace.clear();
    }
    monitor::Monitor monitor(mo);
    monitor_ = &monitor;
    struct Unset {
      monitor::Monitor*& m;
      ~Unset() { m = nullptr; }
    } unset{monitor_};

    if constexpr (detail::HasEvaluate<std::remove_cvref_t<Task>>) {
      if (options_.eval_at_start && !resume_from_) {
        result.first_eval = task.evaluate();
        monitor.log_metrics(0, result.first_eval);
        if (options_.print_evals) print_eval(monitor, 0, NAN, result.first_eval, NAN);
        for (const auto& [k, v] : result.first_eval)
          state_.metadata[std::string(detail::kFirstEvalPrefix) + k] =
              StateDict::number_to_string(v);
      }
    }
    detail::SignalScope signals(options_.handle_signals);
    const auto started = std::chrono::steady_clock::now();
    std::array<float, 10> recent{};  // the last losses read, a ring
    std::int64_t recent_count = 0;   // losses read (may pass 2^31 in a long run)
    while (state_.step < options_.steps) {
      const std::int64_t step = state_.step;
      monitor.begin_step(step);
      // The lr this step uses (the schedule's last_lr() is that of the next step after step()).
      const double lr = schedule != nullptr && !schedule->last_lr().empty()
                            ? schedule->last_lr().front()
                            : std::numeric_limits<double>::quiet_NaN();
      arena.zero_grad();
      StepContext ctx{step, &monitor};
      const bool last = step + 1 == options_.steps;
      const bool evaluating =
          detail::HasEvaluate<std::remove_cvref_t<Task>> &&
          (last || (options_.eval_every > 0 && (step + 1) % options_.eval_every == 0));
      const auto out = task.step(ctx);
      float loss = std::numeric_limits<float>::quiet_NaN();  // NaN: a handle left unread
      bool read = true;
      if constexpr (std::is_convertible_v<decltype(out), float>) {
        loss = static_cast<float>(out);
      } else {
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(out)>, LossHandle>,
                      "train::Loop: task.step() returns the loss as a float or a LossHandle");
        read = step == 0 || last || evaluating ||
               (step + 1) % std::max<std::int64_t>(1, mo.log_every) == 0 ||
               (options_.ckpt_every > 0 && (step + 1) % options_.ckpt_every == 0);
        if (read) loss = out.get();
      }
      if (read && !std::isfinite(loss)) fail_diverged(monitor, step + 1, "loss", loss);
      optim::StepResult stepped;
      {
        auto span = monitor.span(monitor::Phase::kOptimizer);
        stepped = opt.step(exec, scaler,
                           optim::ClipGradNorm{.max_norm = options_.clip_grad_norm,
                                               .report_norm = options_.log_grad_norm});
        // PyTorch's scaler.update(): backoff or growth of the scale from this step's check.
        if constexpr (amp::is_loss_scaler_v<Scaler>) scaler.update(exec);
        if (schedule != nullptr) schedule->step();
        if constexpr (detail::HasOptimizerStepHook<std::remove_cvref_t<Task>>)
          task.on_optimizer_step(step + 1);
      }
      // Reading the norm and the skip flag of a device arena waits for the GPU: only then every
      // log_every steps; a host arena's are plain loads, read every step.
      if (S == Space::kHost || (step + 1) % std::max<std::int64_t>(1, mo.log_every) == 0) {
        if (stepped.grad_norm.valid()) {
          const float norm = stepped.grad_norm.get();
          // With a loss scaler an inf/NaN gradient only skips the step; without one it diverged.
          if (!std::isfinite(norm) && stepped.found_inf == nullptr)
            fail_diverged(monitor, step + 1, "gradient norm", norm);
          monitor.log_scalar("train/grad_norm", norm);
        }
        if (stepped.found_inf != nullptr) monitor.log_scalar("train/skipped", stepped.skipped());
      }
      ++state_.step;
      ++result.steps_this_run;
      if (read) {
        result.last_loss = loss;
        if (step == 0) {
          result.first_loss = loss;
          state_.metadata[detail::kFirstLossKey] = StateDict::number_to_string(loss);
        }
        recent[static_cast<std::size_t>(recent_count++) % recent.size()] = loss;
      }
      if (std::isfinite(lr)) monitor.log_scalar("train/lr", lr);

      ckpt::Metrics metrics;
      if (read) metrics["train_loss"] = static_cast<double>(loss);
      if constexpr (detail::HasEvaluate<std::remove_cvref_t<Task>>) {
        if (evaluating) {
          result.last_eval = task.evaluate();
          monitor.log_metrics(state_.step, result.last_eval);
          if (options_.print_evals) print_eval(monitor, state_.step, loss, result.last_eval, lr);
          for (const auto& [k, v] : result.last_eval) metrics[k] = v;
        }
      }
      // Ranks stop together: a signal one of them saw is shared at the next point where the
      // ranks synchronise anyway (every step on the host, the loss-reading steps on the device).
      // Between those points a rank keeps going: stopping alone, it would save (a collective)
      // and leave while the others train on, and the job would hang.
      const bool ranks = options_.comm != nullptr && options_.comm->world_size() > 1;
      const bool agree_now = !ranks || S == Space::kHost || read || last;
      bool stop = agree_now && detail::stop_signal().load() != 0;
      if (ranks && agree_now) stop = any_rank(stop);
      {
        auto span = monitor.span(monitor::Phase::kCheckpoint);
        bool saved = checkpointer_.maybe_save(state_, metrics);
        if (!saved && (last || stop)) {
          checkpointer_.save(state_, metrics);
          saved = true;
        }
        // The points up to a checkpoint go to disk with it: a run killed before TensorBoard's
        // next flush would lose them for good (its resume starts after the checkpoint).
        if (saved) monitor.flush();
      }
      monitor.end_step({.loss = read ? std::optional<double>(loss) : std::nullopt});
      if constexpr (detail::HasStepEnd<std::remove_cvref_t<Task>>)
        task.on_step_end(state_.step, loss);
      if (stop) {
        result.interrupted = true;
        monitor.print("train::Loop: stopped by signal " +
                      std::to_string(detail::stop_signal().load()) + " after step " +
                      std::to_string(state_.step) + " (checkpoint saved)");
        break;
      }
    }
    checkpointer_.wait();
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    result.recent_count = static_cast<int>(
        std::min<std::int64_t>(recent_count, static_cast<std::int64_t>(recent.size())));
    if (result.recent_count > 0) {
      double sum = 0.0;
      for (int i = 0; i < result.recent_count; ++i) sum += static_cast<double>(recent[i]);
      result.recent_loss = sum / result.recent_count;
    }
    monitor.close();
    result.step = state_.step;
    return result;
  }

  /// This rank (0 without a communicator).
  int rank() const noexcept { return options_.comm != nullptr ? options_.comm->rank() : 0; }

 private:
  /// The flags a checkpoint's metadata carries (their kConfigPrefix removed).
  static std::map<std::string, std::string> saved_flags(const ckpt::CheckpointInfo& info) {
    std::map<std::string, std::string> saved;
    for (const auto& [key, value] : info.metadata)
      if (key.starts_with(detail::kConfigPrefix))
        saved[key.substr(detail::kConfigPrefix.size())] = value;
    return saved;
  }

  ckpt::LoadOptions fresh_start_options() const {
    return {.allow_fresh_start = options_.allow_fresh_start,
            .fresh_start_setting = options_.fresh_start_setting};
  }

  static ckpt::CheckpointerOptions checkpointer_options(const LoopOptions& o) {
    ckpt::CheckpointerOptions c{.every_steps = o.ckpt_every,
                                .every_seconds = o.ckpt_every_seconds,
                                .keep_last = o.keep_last,
                                .best_metric = o.best_metric,
                                .best_mode = o.best_mode,
                                .keep_best = o.best_metric.empty() ? 0 : 1,
                                .async = o.async_checkpoints,
                                .overlap_snapshot = o.async_checkpoints};
    if (o.comm != nullptr && o.comm->world_size() > 1) {
      TRAINKIT_CHECK(o.checkpoint_comm == nullptr ||
                         (o.checkpoint_comm->world_size() == o.comm->world_size() &&
                          o.checkpoint_comm->rank() == o.comm->rank()),
                     "train::Loop: checkpoint_comm (rank ", o.checkpoint_comm->rank(), " of ",
                     o.checkpoint_comm->world_size(), ") must span the ranks of comm (rank ",
                     o.comm->rank(), " of ", o.comm->world_size(), ")");
      TRAINKIT_CHECK(o.ckpt_every_seconds == 0.0,
                     "train::Loop: ckpt_every_seconds needs a single process (the ranks' clocks "
                     "would disagree on when to save); use ckpt_every");
      c.rank = o.comm->rank();
      c.world_size = o.comm->world_size();
      dist::Comm* barrier = o.checkpoint_comm != nullptr ? o.checkpoint_comm : o.comm;
      c.async = o.async_checkpoints && o.checkpoint_comm != nullptr;
      c.overlap_snapshot = c.async;
      c.barrier = ckpt::comm_barrier(*barrier);
    }
    return c;
  }

  /// True on every rank when `mine` is true on any.
  bool any_rank(bool mine) {
    dist::Comm& comm = *options_.comm;
    const std::int32_t flag = mine ? 1 : 0;
    if (comm.space() == Space::kHost) {
      std::int32_t v = flag;
      comm.all_reduce(dist::Buffer(&v, 1, DType::kI32, Space::kHost), dist::ReduceOp::kMax).wait();
      return v != 0;
    }
    if (stop_flag_.numel() == 0) stop_flag_ = Tensor<std::int32_t, Space::kDevice>(Shape{1});
    copy_bytes(stop_flag_.data(), Space::kDevice, &flag, Space::kHost, sizeof flag,
               "train::Loop stop flag");
    comm.all_reduce(dist::Buffer(stop_flag_.data(), 1, DType::kI32, Space::kDevice),
                    dist::ReduceOp::kMax)
        .wait();
    return read_value(stop_flag_.data(), Space::kDevice, "train::Loop stop flag") != 0;
  }

  static void print_eval(monitor::Monitor& monitor, std::int64_t step, float loss,
                         const ckpt::Metrics& metrics, double lr) {
    std::string line = "step " + std::to_string(step) + ":";
    const char* separator = " ";
    const auto part = [&](const std::string& name, double value, const char* format) {
      char text[48];
      std::snprintf(text, sizeof text, format, value);
      line.append(separator).append(name).append(" ").append(text);
      separator = " | ";
    };
    if (std::isfinite(loss)) part("train loss", static_cast<double>(loss), "%.4f");
    for (const auto& [key, value] : metrics) part(key, value, "%.4f");
    if (std::isfinite(lr)) part("lr", lr, "%.3g");
    monitor.print(line);
  }

  /// Ends a run whose step `step` produced a non-finite `what`: closes the logs, lets a
  /// checkpoint in flight finish and throws, naming the newest checkpoint.
  [[noreturn]] void fail_diverged(monitor::Monitor& monitor, std::int64_t step, const char* what,
                                  float value) {
    monitor.close();
    checkpointer_.wait();
    const std::vector<ckpt::CheckpointInfo> saved = checkpointer_.list();
    TRAINKIT_FAIL("train::Loop: step ", step, ": the ", what, " is ", value,
                  "; training diverged (try a lower learning rate or gradient clipping); the "
                  "newest checkpoint is ",
                  saved.empty() ? std::string("none") : saved.back().path.string());
  }

  template <Space S, class Opt, class Sched, class Scaler>
  void register_parts(nn::ParamArena<S>& arena, Opt& opt, Sched* schedule, Scaler& scaler) {
    if (registered_) return;
    registered_ = true;
    state_.model(arena).add("optimizer", opt);
    if (schedule != nullptr) state_.add("schedule", *schedule);
    if constexpr (amp::is_loss_scaler_v<Scaler>) state_.add("scaler", scaler);
  }

  LoopOptions options_;
  Flags* flags_;
  ckpt::Checkpointer checkpointer_;
  ckpt::TrainState state_;
  std::optional<ckpt::CheckpointInfo> resume_from_;
  monitor::Monitor* monitor_ = nullptr;
  bool registered_ = false;
  Tensor<std::int32_t, Space::kDevice> stop_flag_;  // any_rank over device memory
};

}  // namespace train
TRAINKIT_NAMESPACE_END
