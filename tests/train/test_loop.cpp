// Tests of train/loop.hpp on a small noisy quadratic task (a Philox stream draws the noise, so a
// resume must restore it too): a run cut into pieces, or killed with SIGKILL in the middle and
// resumed, ends bit for bit where the uninterrupted run does; evaluation and checkpoint cadence;
// a non-finite loss stops with an error naming the step; SIGTERM ends the run after a
// checkpoint; a resume with a differing run setting is refused, listing the difference.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <trainkit/core/rng.hpp>
#include <trainkit/error.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/io/tfevents.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/lr_schedule.hpp>
#include <trainkit/train/flags.hpp>
#include <trainkit/train/loop.hpp>

#include "support/temp_dir.hpp"

namespace {
namespace tk = trainkit;
namespace train = trainkit::train;
namespace fs = std::filesystem;

/// 0.5 * |w - (target + noise)|^2 over 37 weights; the noise comes from `rng`.
struct Quadratic {
  tk::nn::ParamArena<>* arena = nullptr;
  tk::nn::ParamId id{};
  tk::PhiloxStream rng{5};
  std::int64_t nan_at = -1, grad_nan_at = -1, term_at = -1, kill_at = -1;  // 1-based steps
  int evaluations = 0;
  std::vector<std::int64_t> ended;

  float step(train::StepContext& ctx) {
    auto w = arena->param<1>(id);
    auto g = arena->grad<1>(id);
    double loss = 0.0;
    for (std::int64_t i = 0; i < w.size(0); ++i) {
      const float target = std::sin(0.3f * static_cast<float>(i)) + 0.1f * rng.next_normal();
      const float d = w(i) - target;
      loss += 0.5 * static_cast<double>(d) * d;
      g(i) += d;
    }
    const std::int64_t number = ctx.step + 1;
    if (number == kill_at) ::raise(SIGKILL);
    if (number == term_at) ::raise(SIGTERM);
    if (number == nan_at) return NAN;
    if (number == grad_nan_at) g(3) = NAN;
    return static_cast<float>(loss);
  }
  tk::ckpt::Metrics evaluate() {
    ++evaluations;
    auto w = arena->param<1>(id);
    double d = 0.0;
    for (std::int64_t i = 0; i < w.size(0); ++i) d += std::fabs(w(i) - std::sin(0.3f * i));
    return {{"val_dist", d}};
  }
  std::function<void(std::int64_t)> at_step_end;  // called by on_step_end when set
  void on_step_end(std::int64_t step, float) {
    ended.push_back(step);
    if (at_step_end) at_step_end(step);
  }
  // (step, evaluations done by then): the hook runs after the update, before that step's eval.
  std::vector<std::pair<std::int64_t, int>> updated;
  void on_optimizer_step(std::int64_t step) { updated.emplace_back(step, evaluations); }
};

struct Run {
  double lr = 0.05;
  std::int64_t seed = 3;
};

/// One process's run: builds the model and optimizer, runs the loop, returns the weights.
std::vector<float> train_run(const fs::path& dir, std::int64_t steps, Quadratic& task,
                             train::LoopResult* out = nullptr, std::int64_t ckpt_every = 3,
                             std::vector<std::string_view> args = {},
                             const tk::exec::Host& exec = tk::exec::Host::default_instance()) {
  Run r;
  train::Flags flags("quadratic", "test");
  flags.add("lr", r.lr, "learning rate").add("seed", r.seed, "init seed");
  REQUIRE(flags.parse(args));
  train::Loop loop({.steps = steps,
                    .dir = dir,
                    .eval_every = 4,
                    .ckpt_every = ckpt_every,
                    .best_metric = "val_dist",
                    .clip_grad_norm = 1.0,
                    .monitor = {.console = nullptr}},
                   &flags);
  tk::nn::ParamArena<> arena;
  task.arena = &arena;
  task.id = arena.add("w", tk::Shape{37}, tk::nn::Init::normal(0.0f, 1.0f));
  arena.finalize();
  arena.initialize(static_cast<std::uint64_t>(r.seed));
  tk::optim::AdamW<> opt(arena, {.lr = r.lr, .weight_decay = 0.01});
  auto schedule = tk::optim::warmup_cosine(opt.lr_groups(), {.warmup_steps = 2, .total_steps = 20});
  loop.state().add("noise", task.rng);
  const train::LoopResult res = loop.run(exec, arena, opt, task, schedule.get());
  if (out) *out = res;
  auto w = arena.param<1>(task.id);
  return std::vector<float>(w.data(), w.data() + w.size(0));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("Loop: a run cut into pieces ends bit for bit where one run does") {
  Quadratic whole_task;
  train::LoopResult whole;
  const trainkit_test::TempDir whole_dir;
  const std::vector<float> straight = train_run(whole_dir.path(), 20, whole_task, &whole);
  CHECK(whole.step == 20);
  CHECK_FALSE(whole.resumed_from.has_value());
  CHECK(std::isfinite(whole.last_loss));

  for (const std::int64_t cut : {1, 3, 7, 12, 19}) {
    CAPTURE(cut);
    const trainkit_test::TempDir tmp;
    const fs::path& dir = tmp.path();
    Quadratic a;
    train_run(dir, cut, a);
    Quadratic b;
    train::LoopResult res;
    const std::vector<float> resumed = train_run(dir, 20, b, &res);
    REQUIRE(res.resumed_from.has_value());
    CHECK(res.resumed_from->step == cut);
    CHECK(res.steps_this_run == 20 - cut);
    CHECK(same_bits(resumed, straight));
    CHECK(res.last_loss == whole.last_loss);
    CHECK(res.first_loss == whole.first_loss);  // kept in the checkpoint
  }
}

TEST_CASE("Loop: killed with SIGKILL mid-run, the resumed run is bitwise the uninterrupted one") {
  Quadratic whole_task;
  const trainkit_test::TempDir whole_dir;
  const std::vector<float> straight = train_run(whole_dir.path(), 20, whole_task);
  for (const std::int64_t kill_at : {2, 9, 17}) {
    CAPTURE(kill_at);
    const trainkit_test::TempDir tmp;
    const fs::path& dir = tmp.path();
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // A fresh executor: the parent's thread pool does not exist in the child.
      const tk::exec::Host exec(1);
      Quadratic t;
      t.kill_at = kill_at;
      try {
        train_run(dir, 20, t, nullptr, 1, {}, exec);
      } catch (...) {
      }
      ::_exit(0);  // not reached: the task kills the process
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    Quadratic b;
    train::LoopResult res;
    const std::vector<float> resumed = train_run(dir, 20, b, &res);
    // Checkpoints every step, written in the background one at a time: when step k starts,
    // the save of step k - 1 may still be in flight, but that of step k - 2 has committed.
    if (kill_at >= 3) {
      REQUIRE(res.resumed_from.has_value());
      CHECK(res.resumed_from->step >= kill_at - 2);
    }
    if (res.resumed_from) CHECK(res.resumed_from->step <= kill_at - 1);
    CHECK(same_bits(resumed, straight));
  }
}

TEST_CASE("Loop: TensorBoard's points up to a checkpoint are on disk when it is saved") {
  // A summary (log_every 50) or an evaluation flushes TensorBoard's buffer; a checkpoint must
  // too, or a run killed after it loses the points of the steps before it for good. Records on
  // disk after each step, checkpointing every 1, 2 and 3 steps:
  std::map<std::int64_t, std::vector<std::size_t>> on_disk;
  for (const std::int64_t ckpt_every : {1, 2, 3}) {
    const trainkit_test::TempDir dir;
    Quadratic task;
    task.at_step_end = [&](std::int64_t) {
      std::size_t n = 0;
      for (const auto& f : fs::directory_iterator(dir.path() / "tb"))
        n += tk::io::read_tfrecords(f.path().string()).records.size();
      on_disk[ckpt_every].push_back(n);
    };
    train_run(dir.path(), 7, task, nullptr, ckpt_every);
    REQUIRE(on_disk[ckpt_every].size() == 7);
  }
  // Saving every step, every step's points (train/loss, train/lr) are on disk after it.
  for (std::size_t k = 1; k < 7; ++k) CHECK(on_disk[1][k] >= on_disk[1][k - 1] + 2);
  // Saving less often, the same as that after each checkpoint step.
  for (const std::int64_t every : {2, 3})
    for (std::int64_t step = every; step <= 7; step += every) {
      CAPTURE(every);
      CAPTURE(step);
      CHECK(on_disk[every][static_cast<std::size_t>(step - 1)] ==
            on_disk[1][static_cast<std::size_t>(step - 1)]);
    }
}

TEST_CASE("Loop: evaluation, checkpoint and hook cadence") {
  const trainkit_test::TempDir tmp;
  const fs::path& dir = tmp.path();
  Quadratic t;
  train_run(dir, 10, t, nullptr, 3);
  CHECK(t.evaluations == 3);  // after steps 4, 8 and the last (10)
  CHECK(t.ended == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  REQUIRE(t.updated.size() == 10);
  for (std::size_t i = 0; i < t.updated.size(); ++i) {
    CHECK(t.updated[i].first == std::int64_t(i) + 1);
    CHECK(t.updated[i].second == int(i) / 4);  // step 4's evaluation comes after its hook
  }
  tk::ckpt::Checkpointer ck((dir / "ckpt").string(), {.remove_stale = false});
  std::vector<std::int64_t> steps;
  for (const auto& c : ck.list()) steps.push_back(c.step);
  // Every 3 steps, the final one, keep_last 3 plus the best by val_dist.
  CHECK(steps.back() == 10);
  CHECK(steps.size() <= 4);
  CHECK(std::find(steps.begin(), steps.end(), 9) != steps.end());
  const auto newest = ck.latest();
  REQUIRE(newest.has_value());
  CHECK(newest->metadata.at("config.lr") == "0.05");
  CHECK(newest->metrics.count("val_dist") == 1);
  CHECK(fs::exists(dir / "metrics.jsonl"));
  CHECK(fs::exists(dir / "tb"));
}

/// Runs `t` (which diverges at step `at`) checkpointing every step; the run must fail with
/// `message` and the newest checkpoint be the one before the diverged step.
void expect_divergence(Quadratic t, std::int64_t at, const char* message) {
  const trainkit_test::TempDir tmp;
  const fs::path& dir = tmp.path();
  CHECK_THROWS_WITH_AS(train_run(dir, 10, t, nullptr, 1), doctest::Contains(message), tk::Error);
  tk::ckpt::Checkpointer ck((dir / "ckpt").string(), {.remove_stale = false});
  REQUIRE_FALSE(ck.list().empty());
  CHECK(ck.list().back().step == at - 1);  // nothing saved for the diverged step
}

TEST_CASE("Loop: a non-finite loss or gradient norm stops the run with an error naming the step") {
  Quadratic loss_nan;
  loss_nan.nan_at = 5;
  expect_divergence(loss_nan, 5, "step 5: the loss is nan; training diverged");
  Quadratic grad_nan;  // a finite loss, NaN gradients and no loss scaler
  grad_nan.grad_nan_at = 3;
  expect_divergence(grad_nan, 3, "step 3: the gradient norm is nan; training diverged");
}

TEST_CASE("Loop: SIGTERM ends the run after the step, with a checkpoint, and restores handlers") {
  const trainkit_test::TempDir tmp;
  const fs::path& dir = tmp.path();
  Quadratic t;
  t.term_at = 6;
  train::LoopResult res;
  const auto before = std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGTERM, before);
  train_run(dir, 20, t, &res, 0);
  const bool restored = std::signal(SIGTERM, before) == before;  // the loop's handler is gone
  CHECK(restored);
  CHECK(res.interrupted);
  CHECK(res.step == 6);
  tk::ckpt::Checkpointer ck((dir / "ckpt").string(), {.remove_stale = false});
  REQUIRE_FALSE(ck.list().empty());
  CHECK(ck.list().back().step == 6);

  Quadratic whole_task;
  const trainkit_test::TempDir whole_dir;
  const std::vector<float> straight = train_run(whole_dir.path(), 20, whole_task);
  Quadratic b;
  CHECK(same_bits(train_run(dir, 20, b), straight));
}

TEST_CASE("Loop: a resume with a differing run setting is refused, listing it") {
  const trainkit_test::TempDir tmp;
  const fs::path& dir = tmp.path();
  Quadratic a;
  train_run(dir, 4, a, nullptr, 2, {"--lr", "0.1"});
  Quadratic b;
  CHECK_THROWS_WITH_AS(train_run(dir, 8, b, nullptr, 2, {"--lr", "0.2", "--seed", "3"}),
                       doctest::Contains("--lr: the run has 0.1, the command line 0.2"), tk::Error);
  // Not given: the saved value is adopted, and the run continues.
  Quadratic c;
  train::LoopResult res;
  train_run(dir, 8, c, &res, 2);
  CHECK(res.resumed_from.has_value());
  CHECK(res.step == 8);
}

/// A run of the quadratic whose program has gained the kRun flag --width since `dir`'s first
/// checkpoints (`with_width`: this program defines it); returns the newest checkpoint's settings.
std::map<std::string, std::string> run_with_width(const fs::path& dir, std::int64_t steps,
                                                  bool with_width,
                                                  std::vector<std::string_view> args) {
  Run r;
  std::int64_t width = 1;
  train::Flags flags("quadratic", "test");
  flags.add("lr", r.lr, "learning rate").add("seed", r.seed, "init seed");
  if (with_width) flags.add("width", width, "a setting added later");
  REQUIRE(flags.parse(args));
  train::Loop loop({.steps = steps, .dir = dir, .ckpt_every = 2, .monitor = {.console = nullptr}},
                   &flags);
  Quadratic task;
  tk::nn::ParamArena<> arena;
  task.arena = &arena;
  task.id = arena.add("w", tk::Shape{37}, tk::nn::Init::normal(0.0f, 1.0f));
  arena.finalize();
  arena.initialize(static_cast<std::uint64_t>(r.seed));
  tk::optim::AdamW<> opt(arena, {.lr = r.lr});
  loop.state().add("noise", task.rng);
  loop.run(tk::exec::Host::default_instance(), arena, opt, task);
  const auto saved = loop.checkpointer().list();
  REQUIRE_FALSE(saved.empty());
  return saved.back().metadata;
}

TEST_CASE("Loop: a run flag added since the checkpoint is saved by the resumed run and checked") {
  const trainkit_test::TempDir tmp;
  const fs::path& dir = tmp.path();
  CHECK(run_with_width(dir, 2, false, {}).count("config.width") == 0);
  // The program now defines --width: the resume keeps the given value and saves it.
  const auto resumed = run_with_width(dir, 4, true, {"--width", "5"});
  CHECK(resumed.count("config.lr") == 1);
  REQUIRE(resumed.count("config.width") == 1);
  CHECK(resumed.at("config.width") == "5");
  // So a later resume with another width is refused, and one without it adopts 5.
  CHECK_THROWS_WITH_AS(run_with_width(dir, 6, true, {"--width", "7"}),
                       doctest::Contains("--width: the run has 5, the command line 7"), tk::Error);
  CHECK(run_with_width(dir, 6, true, {}).at("config.width") == "5");
}

/// A Quadratic that also records what the resume hook and the evaluations saw.
struct Hooked : Quadratic {
  train::Loop* loop = nullptr;
  std::vector<std::int64_t> resumed_at;
  int evaluations_with_monitor = 0;
  void on_resume(const tk::ckpt::CheckpointInfo& info) { resumed_at.push_back(info.step); }
  tk::ckpt::Metrics evaluate() {
    if (loop->monitor() != nullptr) ++evaluations_with_monitor;
    return Quadratic::evaluate();
  }
};

/// A run of `steps` steps of `t` with eval_at_start and printed evaluations into `console`;
/// returns the lr values of the schedule each step used.
std::vector<double> hooked_run(const fs::path& dir, std::int64_t steps, Hooked& t,
                               train::LoopResult& res, std::FILE* console) {
  train::Loop loop({.steps = steps,
                    .dir = dir,
                    .eval_every = 3,
                    .eval_at_start = true,
                    .print_evals = true,
                    .ckpt_every = 2,
                    .monitor = {.progress = tk::monitor::ProgressStyle::kOff, .console = console}});
  t.loop = &loop;
  tk::nn::ParamArena<> arena;
  t.arena = &arena;
  t.id = arena.add("w", tk::Shape{37}, tk::nn::Init::normal(0.0f, 1.0f));
  arena.finalize();
  arena.initialize(3);
  tk::optim::AdamW<> opt(arena, {.lr = 0.05});
  auto schedule = tk::optim::warmup_cosine(opt.lr_groups(), {.warmup_steps = 2, .total_steps = 9});
  loop.state().add("noise", t.rng);
  std::vector<double> lrs;
  struct Task {
    Hooked& t;
    std::vector<double>& lrs;
    tk::optim::AdamW<>& opt;
    float step(train::StepContext& c) {
      lrs.push_back(opt.lr());
      return t.step(c);
    }
    tk::ckpt::Metrics evaluate() { return t.evaluate(); }
    void on_resume(const tk::ckpt::CheckpointInfo& info) { t.on_resume(info); }
  } task{t, lrs, opt};
  res = loop.run(tk::exec::Host::default_instance(), arena, opt, task, schedule.get());
  t.loop = nullptr;
  return lrs;
}

std::string read_back(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  for (int ch = std::fgetc(f); ch != EOF; ch = std::fgetc(f)) text.push_back(char(ch));
  return text;
}

TEST_CASE("Loop: eval_at_start, printed evaluations, the lr of each step, on_resume") {
  const trainkit_test::TempDir tmp;
  Hooked a;
  train::LoopResult first;
  std::FILE* console = std::tmpfile();
  REQUIRE(console != nullptr);
  const std::vector<double> lrs = hooked_run(tmp.path(), 5, a, first, console);
  const std::string printed = read_back(console);
  std::fclose(console);
  CHECK(a.evaluations == 3);  // step 0, 3 and the last (5)
  CHECK(a.evaluations_with_monitor == 3);
  CHECK(a.resumed_at.empty());
  REQUIRE(first.first_eval.count("val_dist") == 1);
  CHECK(first.seconds > 0.0);
  CHECK(printed.find("step 0: val_dist ") != std::string::npos);
  CHECK(printed.find("step 0: train loss") == std::string::npos);
  CHECK(printed.find("step 3: train loss ") != std::string::npos);
  CHECK(printed.find("step 5: train loss ") != std::string::npos);
  // train/lr in metrics.jsonl is the lr each step used: the optimizer's lr during that step.
  std::ifstream metrics(tmp.path() / "metrics.jsonl");
  std::string line, all;
  while (std::getline(metrics, line)) all += line + "\n";
  CHECK(all.find("\"step\":0") != std::string::npos);
  char want[64];
  std::snprintf(want, sizeof want, "%.3g", lrs[2]);
  CHECK(printed.find(std::string("| lr ") + want) != std::string::npos);  // step 3 used lrs[2]

  // The resumed run: the hook sees the checkpoint, no second start evaluation, first_eval kept.
  Hooked b;
  train::LoopResult second;
  std::FILE* quiet = std::tmpfile();
  hooked_run(tmp.path(), 7, b, second, quiet);
  std::fclose(quiet);
  CHECK(b.resumed_at == std::vector<std::int64_t>{5});
  CHECK(b.evaluations == 2);  // step 6 and the last (7)
  REQUIRE(second.first_eval.count("val_dist") == 1);
  CHECK(second.first_eval.at("val_dist") == first.first_eval.at("val_dist"));
}

/// A first loss and a start evaluation below the normal floats' range.
struct Subnormal : Quadratic {
  float step(train::StepContext& ctx) {
    const float loss = Quadratic::step(ctx);
    return ctx.step == 0 ? 1e-40f : loss;
  }
  tk::ckpt::Metrics evaluate() { return {{"val_dist", 1e-310}}; }
};

/// Runs `loop` over `t` (a Quadratic) with its weights drawn from seed 3 and AdamW (lr 0.05);
/// returns the weights after the run (and the result in *out).
template <class Task>
std::vector<float> run_task(train::Loop& loop, Task& t, train::LoopResult* out = nullptr) {
  tk::nn::ParamArena<> arena;
  t.arena = &arena;
  t.id = arena.add("w", tk::Shape{37}, tk::nn::Init::normal(0.0f, 1.0f));
  arena.finalize();
  arena.initialize(3);
  tk::optim::AdamW<> opt(arena, {.lr = 0.05});
  loop.state().add("noise", t.rng);
  const train::LoopResult r = loop.run(tk::exec::Host::default_instance(), arena, opt, t);
  if (out != nullptr) *out = r;
  auto w = arena.param<1>(t.id);
  return std::vector<float>(w.data(), w.data() + w.size(0));
}

TEST_CASE("Loop: a subnormal first loss and start evaluation read back exactly on resume") {
  const trainkit_test::TempDir tmp;
  const auto run = [&](std::int64_t steps) {
    train::Loop loop({.steps = steps,
                      .dir = tmp.path(),
                      .eval_at_start = true,
                      .print_evals = false,
                      .ckpt_every = 2,
                      .monitor = {.console = nullptr}});
    Subnormal t;
    train::LoopResult r;
    run_task(loop, t, &r);
    return r;
  };
  const train::LoopResult first = run(4);
  CHECK(first.first_loss == 1e-40f);
  const train::LoopResult resumed = run(6);
  REQUIRE(resumed.resumed_from.has_value());
  CHECK(resumed.first_loss == 1e-40f);
  REQUIRE(resumed.first_eval.count("val_dist") == 1);
  CHECK(resumed.first_eval.at("val_dist") == 1e-310);
}

/// The Quadratic task returning its loss as a LossHandle (as a GPU task would).
struct Deferred : Quadratic {
  float value = 0.0f;
  std::vector<std::int64_t> read_at;  // steps whose loss on_step_end saw
  train::LossHandle step(train::StepContext& ctx) {
    value = Quadratic::step(ctx);
    return {&value, tk::Space::kHost};
  }
  void on_step_end(std::int64_t step, float loss) {
    if (!std::isnan(loss)) read_at.push_back(step);
  }
};

/// 12 steps of `t` (a Quadratic returning its loss as a float or a LossHandle), logging every 4
/// and checkpointing every 5 steps; returns the weights (and the result in *out).
template <class Task>
std::vector<float> deferred_run(const fs::path& dir, Task& t, train::LoopResult* out = nullptr) {
  train::Loop loop({.steps = 12,
                    .dir = dir,
                    .ckpt_every = 5,
                    .clip_grad_norm = 1.0,
                    .monitor = {.log_every = 4, .console = nullptr}});
  return run_task(loop, t, out);
}

TEST_CASE("Loop: a LossHandle is read only on the first, logging, checkpoint and last steps") {
  const trainkit_test::TempDir a_dir, b_dir, c_dir;
  Deferred a;
  const std::vector<float> deferred = deferred_run(a_dir.path(), a);
  CHECK(a.read_at == std::vector<std::int64_t>{1, 4, 5, 8, 10, 12});
  // The same training as a task returning floats (read every step).
  struct Eager : Quadratic {
    float step(train::StepContext& ctx) { return Quadratic::step(ctx); }
  };
  Eager e;
  train::LoopResult r;
  CHECK(same_bits(deferred, deferred_run(b_dir.path(), e, &r)));
  CHECK(std::isfinite(r.last_loss));
  // first_loss and the mean of the last 10 losses read (all 12 read here, float losses).
  REQUIRE(r.recent_count == 10);
  CHECK(std::isfinite(r.first_loss));
  CHECK(r.recent_loss < r.first_loss);
  // A NaN loss is noticed on the next step that reads it: step 7's is not read, step 8's is.
  Deferred nan7;
  nan7.nan_at = 7;
  deferred_run(c_dir.path(), nan7);
  CHECK(nan7.read_at == std::vector<std::int64_t>{1, 4, 5, 8, 10, 12});
  const trainkit_test::TempDir d_dir;
  Deferred nan8;
  nan8.nan_at = 8;
  CHECK_THROWS_WITH_AS(deferred_run(d_dir.path(), nan8),
                       doctest::Contains("step 8: the loss is nan"), tk::Error);
}

TEST_CASE("Loop: bad options and refusing to overwrite a run") {
  CHECK_THROWS_WITH_AS(train::Loop({.steps = 0, .dir = "x"}),
                       doctest::Contains("steps must be > 0"), tk::Error);
  const trainkit_test::TempDir tmp;
  const fs::path& dir = tmp.path();
  Quadratic a;
  train_run(dir, 2, a);
  CHECK_THROWS_WITH_AS(train::Loop({.steps = 4, .dir = dir, .resume = false}),
                       doctest::Contains("holds checkpoints already"), tk::Error);
}

}  // namespace
