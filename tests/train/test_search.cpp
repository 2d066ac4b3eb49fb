// Tests of train/search_space.hpp and train/search.hpp: sampling (bounds, the log-uniform median,
// integer and choice frequencies, determinism by seed), parser errors, ASHA's decisions on a
// hand-computed case, synchronous successive halving giving the same table at any parallelism,
// thread trials finding a synthetic objective's optimum, a search killed with SIGKILL and run
// again ending on the same table, refusal of a changed space or seed, damaged search.json files,
// process trials (metrics read from metrics.jsonl, a failing command, SIGTERM on stop), and
// TensorBoard's HPARAMS records read back by the Python tensorboard package when available.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/core/rng.hpp>
#include <trainkit/error.hpp>
#include <trainkit/io/json.hpp>
#include <trainkit/train/search.hpp>
#include <trainkit/train/search_space.hpp>

#include "support/temp_dir.hpp"

namespace {
namespace tk = trainkit;
namespace train = trainkit::train;
namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

/// The message of the trainkit::Error `f` throws ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const tk::Error& e) {
    return e.what();
  }
  return "";
}

/// (id, status, budget, metric) per trial, best first: what the results table shows.
std::vector<std::string> summary(const train::SearchResult& r) {
  std::vector<std::string> out;
  for (const train::Trial& t : r.trials) {
    char metric[32];
    std::snprintf(metric, sizeof metric, "%.6g", t.metric);
    out.push_back(std::to_string(t.id) + " " + train::trial_status_name(t.status) + " " +
                  std::to_string(t.budget()) + " " + metric);
  }
  return out;
}

train::SearchOptions quiet(const fs::path& dir, train::SearchOptions o = {}) {
  o.dir = dir;
  o.print = false;
  o.tensorboard = false;
  o.durable = false;
  return o;
}

}  // namespace

TEST_CASE("search space: samples stay in bounds, log-uniform median, frequencies") {
  train::SearchSpace space;
  space.uniform("u", -2.0, 3.0)
      .log_uniform("lr", 1e-4, 1e-1)
      .integer("n", 2, 5)
      .integer("w", 1, 7, /*log=*/true)
      .choice("act", {"relu", "gelu", 2.5});
  const int kDraws = 4000;
  std::vector<double> lrs;
  std::map<std::int64_t, int> n_count, w_count;
  std::map<std::string, int> act_count;
  double u_sum = 0.0;
  for (int i = 0; i < kDraws; ++i) {
    const train::Params p = space.sample(42, static_cast<std::uint64_t>(i));
    REQUIRE(p.size() == 5);
    const double u = p.get_double("u");
    CHECK((u >= -2.0 && u < 3.0));
    u_sum += u;
    const double lr = p.get_double("lr");
    CHECK((lr >= 1e-4 && lr < 1e-1));
    lrs.push_back(lr);
    const std::int64_t n = p.get_int("n");
    CHECK((n >= 2 && n <= 5));
    ++n_count[n];
    const std::int64_t w = p.get_int("w");
    CHECK((w >= 1 && w <= 7));
    ++w_count[w];
    ++act_count[p.at("act").text()];
  }
  CHECK(u_sum / kDraws == doctest::Approx(0.5).epsilon(0.06));
  std::sort(lrs.begin(), lrs.end());
  // The median of log-uniform [a, b) is sqrt(a * b) = 0.00316; a uniform [a, b) would give 0.05.
  CHECK(lrs[kDraws / 2] == doctest::Approx(std::sqrt(1e-4 * 1e-1)).epsilon(0.12));
  CHECK(lrs.front() < 1.5e-4);
  CHECK(lrs.back() > 0.09);
  REQUIRE(n_count.size() == 4);  // both ends included
  for (const auto& [v, c] : n_count) CHECK(c == doctest::Approx(kDraws / 4.0).epsilon(0.12));
  // logint(1,7): P(k) = log((k+1)/k) / log(8).
  REQUIRE(w_count.size() == 7);
  for (const auto& [k, c] : w_count) {
    const double p = std::log((k + 1.0) / k) / std::log(8.0);
    CHECK(c == doctest::Approx(p * kDraws).epsilon(0.2));
  }
  CHECK(act_count.size() == 3);
  CHECK(act_count.count("2.5") == 1);
  // A choice keeps each value's type.
  const train::Params p = space.sample(42, 0);
  CHECK(p.at("n").is_int());
  CHECK(p.at("u").is_float());
  CHECK_THROWS_AS(p.get_int("u"), tk::Error);
  CHECK(error_of([&] { (void)p.at("nope"); }).find("'nope' is not in this trial's parameters") !=
        std::string::npos);
}

TEST_CASE("search space: the same seed gives the same trials, in any order") {
  const auto space = train::SearchSpace::parse(
      {"lr=loguniform(1e-4,1e-1)", "hidden=choice(32,64,128)", "epochs=int(2,8)"});
  std::vector<train::Params> forward, backward(50);
  for (int i = 0; i < 50; ++i) forward.push_back(space.sample(7, static_cast<std::uint64_t>(i)));
  for (int i = 49; i >= 0; --i) backward[static_cast<std::size_t>(i)] = space.sample(7, i);
  CHECK(forward == backward);
  int same = 0;
  std::set<std::string> distinct;
  for (int i = 0; i < 50; ++i) {
    same += space.sample(8, static_cast<std::uint64_t>(i)) == forward[static_cast<std::size_t>(i)];
    distinct.insert(forward[static_cast<std::size_t>(i)].to_string());
  }
  CHECK(same == 0);  // another seed: other trials
  CHECK(distinct.size() == 50);
  CHECK(train::SearchSpace::trial_seed(7, 3) == train::SearchSpace::trial_seed(7, 3));
  CHECK(train::SearchSpace::trial_seed(7, 3) != train::SearchSpace::trial_seed(7, 4));
  CHECK(train::SearchSpace::trial_seed(7, 3) < (std::uint64_t{1} << 63));
  // The values come from Philox words 2d, 2d+1 of stream `trial`: an independent reference.
  const std::uint64_t hi = tk::philox_u32(7, 5, 0), lo = tk::philox_u32(7, 5, 1);
  const double u = static_cast<double>(((hi << 32) | lo) >> 11) * 0x1p-53;
  CHECK(space.sample(7, 5).get_double("lr") ==
        doctest::Approx(std::exp(std::log(1e-4) + u * (std::log(1e-1) - std::log(1e-4)))));
}

TEST_CASE("search space: parsing, canonical text, errors naming the bad text") {
  const auto space = train::SearchSpace::parse({" lr = loguniform( 1e-4 , 0.1 ) ",
                                                "drop=uniform(0,0.5)", "hidden=choice(64,128,256)",
                                                "act=choice(relu,gelu)", "layers=logint(1,16)"});
  const std::vector<std::string> canonical = {"lr=loguniform(1e-04,0.1)", "drop=uniform(0,0.5)",
                                              "hidden=choice(64,128,256)", "act=choice(relu,gelu)",
                                              "layers=logint(1,16)"};
  CHECK(space.specs() == canonical);
  CHECK(train::SearchSpace::parse(canonical).specs() == canonical);  // reads back
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"lr", "expected name=kind(args)"},
      {"lr=loguniform", "expected kind(args)"},
      {"lr=normal(0,1)", "unknown kind 'normal'"},
      {"lr=loguniform(0,1)", "needs finite 0 < low < high"},
      {"lr=uniform(1,1)", "needs finite low < high"},
      {"lr=uniform(a,1)", "'a' is not a finite number"},
      {"lr=uniform(1)", "takes two arguments (low,high), got 1"},
      {"lr=uniform(0,1,2)", "takes two arguments"},
      {"n=int(1.5,4)", "'1.5' is not an integer"},
      {"n=int(5,4)", "needs low <= high"},
      {"n=logint(0,4)", "needs low >= 1"},
      {"h=choice()", "an empty argument"},
      {"h=choice(1,,2)", "an empty argument"},
      {"h=choice(64,64)", "lists '64' twice"},
      {"h=choice(1,1.0)", "lists '1' twice"},  // the same text: a trial could not tell them apart
      {"9lr=uniform(0,1)", "'9lr' is not a usable name"},
      {"=uniform(0,1)", "'' is not a usable name"},
      {"lr=uniform(nan,1)", "'nan' is not a finite number"},
  };
  for (const auto& [spec, expected] : bad) {
    const std::string message = error_of([&] { train::SearchSpace().add(spec); });
    INFO(spec << " -> " << message);
    CHECK(message.find("search space '" + spec + "'") != std::string::npos);
    CHECK(message.find(expected) != std::string::npos);
  }
  CHECK(error_of([] {
          train::SearchSpace::parse({"a=uniform(0,1)", "a=int(1,2)"});
        }).find("'a' is defined twice") != std::string::npos);
  // A range wider than the largest double (high - low overflows) still samples across it.
  const auto wide = train::SearchSpace::parse({"x=uniform(-1e308,1e308)"});
  int negative = 0;
  for (std::uint64_t trial = 0; trial < 200; ++trial) {
    const double x = wide.sample(5, trial).get_double("x");
    CHECK(std::isfinite(x));
    CHECK(x >= -1e308);
    CHECK(x < 1e308);
    negative += x < 0;
  }
  CHECK(negative > 50);
  CHECK(negative < 150);
  CHECK(wide.dimensions()[0].sample(0.0).as_double() == -1e308);
}

TEST_CASE("ASHA: the promotion rule and a hand-computed search") {
  using train::detail::search_promotable;
  CHECK(search_promotable(0.5, {0.5}, 3, true));                 // alone: kept
  CHECK_FALSE(search_promotable(0.4, {0.5, 0.4}, 2, true));      // top 1 of 2
  CHECK(search_promotable(0.4, {0.5, 0.4}, 2, false));           // lower is better
  CHECK(search_promotable(0.6, {0.9, 0.6, 0.3, 0.1}, 2, true));  // top 2 of 4
  CHECK_FALSE(search_promotable(0.3, {0.9, 0.6, 0.3, 0.1}, 2, true));
  CHECK(search_promotable(0.6, {0.6, 0.6, 0.1}, 3, true));   // a tie with the cut is kept
  CHECK_FALSE(search_promotable(NAN, {NAN, 0.2}, 2, true));  // NaN ranks last
  CHECK(search_promotable(0.2, {NAN, 0.2}, 2, false));

  // eta 2, budgets 1..4: rungs at 1 and 2. Trials run one at a time in id order, reporting
  // base[id] + 0.01 * budget. By hand (rung values so far -> keep the best max(1, n/2)):
  //   0: rung 1 {.51} kept; rung 2 {.52} kept; completes at 4.
  //   1: rung 1 {.51,.71} best .71 kept; rung 2 {.52,.72} kept; completes.
  //   2: rung 1 {.51,.71,.41}: top 1 is .71: stopped at 1.
  //   3: rung 1 +.61, top 2 of 4 {.71,.61}: kept; rung 2 {.52,.72,.62}: top 1: stopped at 2.
  //   4: rung 1 +.81 (top 2 of 5) kept; rung 2 +.82 (top 2 of 4) kept; completes.
  //   5: rung 1 +.31, top 3 of 6 are .81 .71 .61: stopped at 1.
  const double base[] = {0.5, 0.7, 0.4, 0.6, 0.8, 0.3};
  trainkit_test::TempDir dir;
  train::Search search(
      train::SearchSpace::parse({"x=uniform(0,1)"}),
      quiet(dir.path(),
            {.trials = 6, .strategy = train::SearchStrategy::kAsha, .max_budget = 4, .eta = 2}));
  CHECK(search.rung_budgets() == std::vector<std::int64_t>{1, 2});
  std::map<int, std::int64_t> told_to_stop;
  const auto result = search.run([&](const train::Params&, train::TrialContext& ctx) {
    for (std::int64_t b = 1; b <= 6; ++b)
      if (!ctx.report(b, base[ctx.id()] + 0.01 * static_cast<double>(b))) {
        told_to_stop[ctx.id()] = b;
        break;
      }
    return -1.0;  // ignored: the trial reported
  });
  CHECK(told_to_stop ==
        std::map<int, std::int64_t>{{0, 4}, {1, 4}, {2, 1}, {3, 2}, {4, 4}, {5, 1}});
  const std::vector<std::string> expected = {"4 completed 4 0.84", "1 completed 4 0.74",
                                             "3 stopped 2 0.62",   "0 completed 4 0.54",
                                             "2 stopped 1 0.41",   "5 stopped 1 0.31"};
  INFO(result.table);
  CHECK(summary(result) == expected);
  REQUIRE(result.best() != nullptr);
  CHECK(result.best()->id == 4);
  CHECK(result.table.find("trial  metric  budget  status     x") == 0);
}

namespace {

/// A noisy objective over (lr, x) whose value at budget b approaches g = quality(lr, x):
/// loss(b) = g + 1 / b + noise. The noise is a function of (trial seed, budget) only, and each
/// report waits a little (seeded) so threads finish in a mixed order.
double quality(const train::Params& p) {
  const double l = std::log10(p.get_double("lr")) + 2.0;
  const double x = p.get_double("x") - 0.5;
  return l * l + x * x;
}
double noisy_run(const train::Params& p, train::TrialContext& ctx, bool sleep) {
  double loss = NAN;
  for (std::int64_t b = 1; b <= ctx.max_budget(); ++b) {
    const double noise =
        0.01 * (tk::philox_uniform(ctx.seed(), 0, static_cast<std::uint64_t>(b)) - 0.5);
    loss = quality(p) + 1.0 / static_cast<double>(b) + noise;
    if (sleep)
      std::this_thread::sleep_for(std::chrono::microseconds(
          200 + tk::philox_u32(ctx.seed(), 1, static_cast<std::uint64_t>(b)) % 1500));
    if (!ctx.report(b, loss)) break;
  }
  return loss;
}
const std::vector<std::string> kNoisySpace = {"lr=loguniform(1e-4,1)", "x=uniform(-2,2)"};

}  // namespace

TEST_CASE("synchronous successive halving: the same table at any parallelism") {
  std::vector<std::vector<std::string>> tables;
  std::vector<double> rung0;  // the budget-1 values, to check round 0's cut independently
  for (int parallel : {1, 4}) {
    trainkit_test::TempDir dir;
    train::Search search(train::SearchSpace::parse(kNoisySpace),
                         quiet(dir.path(), {.seed = 3,
                                            .trials = 9,
                                            .parallel = parallel,
                                            .strategy = train::SearchStrategy::kSyncHalving,
                                            .mode = tk::ckpt::MetricMode::kMin,
                                            .max_budget = 9,
                                            .eta = 3}));
    CHECK(search.rung_budgets() == std::vector<std::int64_t>{1, 3});
    const auto result = search.run(
        [](const train::Params& p, train::TrialContext& ctx) { return noisy_run(p, ctx, true); });
    INFO(result.table);
    tables.push_back(summary(result));
    std::map<std::string, int> counts;
    for (const train::Trial& t : result.trials)
      ++counts[std::string(train::trial_status_name(t.status)) + "@" + std::to_string(t.budget())];
    CHECK(counts ==
          std::map<std::string, int>{{"completed@9", 1}, {"stopped@3", 2}, {"stopped@1", 6}});
    if (parallel == 1) {
      // Independently: the three best budget-1 values are the ones that went on.
      std::vector<std::pair<double, int>> first;
      for (const train::Trial& t : result.trials) first.emplace_back(t.reports.front().value, t.id);
      std::sort(first.begin(), first.end());
      for (const train::Trial& t : result.trials) {
        const bool went_on = t.budget() > 1;
        const bool top3 =
            t.id == first[0].second || t.id == first[1].second || t.id == first[2].second;
        CHECK(went_on == top3);
      }
    }
  }
  CHECK(tables[0] == tables[1]);
}

TEST_CASE("synchronous successive halving: every round runs `parallel` thread trials at once") {
  // Each run does some work after report() says stop (a checkpoint, say). The workers used to
  // give up while such runs were still returning, so rounds after the first ran one at a time.
  trainkit_test::TempDir dir;
  std::mutex m;
  std::map<int, int> calls;
  int later = 0, most_later = 0;
  train::Search search(train::SearchSpace::parse(kNoisySpace),
                       quiet(dir.path(), {.seed = 5,
                                          .trials = 9,
                                          .parallel = 3,
                                          .strategy = train::SearchStrategy::kSyncHalving,
                                          .mode = tk::ckpt::MetricMode::kMin,
                                          .max_budget = 9,
                                          .eta = 3}));
  const auto result = search.run([&](const train::Params& p, train::TrialContext& ctx) {
    bool resumed = false;
    {
      std::lock_guard<std::mutex> lock(m);
      resumed = ++calls[ctx.id()] > 1;
      if (resumed) most_later = std::max(most_later, ++later);
    }
    double loss = NAN;
    for (std::int64_t b = 1; b <= ctx.max_budget(); ++b) {
      loss = quality(p) + 1.0 / static_cast<double>(b);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!ctx.report(b, loss)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(60));  // work after the last report
    if (resumed) {
      std::lock_guard<std::mutex> lock(m);
      --later;
    }
    return loss;
  });
  INFO(result.table);
  CHECK(most_later == 3);  // round 1: the three trials that went on, together
}

TEST_CASE("thread trials: ASHA finds the optimum region of a synthetic objective") {
  trainkit_test::TempDir dir;
  const int kTrials = 40;
  train::Search search(train::SearchSpace::parse(kNoisySpace),
                       quiet(dir.path(), {.seed = 11,
                                          .trials = kTrials,
                                          .parallel = 4,
                                          .strategy = train::SearchStrategy::kAsha,
                                          .mode = tk::ckpt::MetricMode::kMin,
                                          .max_budget = 9,
                                          .eta = 3}));
  const auto result = search.run(
      [](const train::Params& p, train::TrialContext& ctx) { return noisy_run(p, ctx, false); });
  REQUIRE(result.trials.size() == kTrials);
  REQUIRE(result.best() != nullptr);
  const train::Trial& best = *result.best();
  std::vector<double> q;
  std::int64_t spent = 0;
  for (const train::Trial& t : result.trials) {
    q.push_back(quality(t.params));
    spent += t.budget();
    CHECK(t.finished());
    CHECK(t.status != train::TrialStatus::kFailed);
  }
  std::sort(q.begin(), q.end());
  INFO(result.table);
  CHECK(best.status == train::TrialStatus::kCompleted);
  CHECK(best.budget() == 9);
  CHECK(quality(best.params) <= q[2]);  // one of the three best sampled points
  CHECK((best.params.get_double("lr") > 1e-3 && best.params.get_double("lr") < 1e-1));
  CHECK(std::abs(best.params.get_double("x") - 0.5) < 0.75);
  CHECK(spent < kTrials * 9 / 2);  // early stopping saved more than half the budget
  // results.json holds every trial, best first.
  const tk::io::Json results = tk::io::Json::parse(read_text(dir / "results.json"));
  REQUIRE(results.at("trials").size() == kTrials);
  CHECK(results.at("best").as_int() == best.id);
  CHECK(results.at("trials").as_array()[0].at("trial").as_int() == best.id);
}

namespace {

/// Runs `search` in a child process that SIGKILLs itself when trial `kill_trial` reports budget
/// `kill_budget`; returns the child's wait status.
int run_killed(const fs::path& dir, const train::SearchOptions& options, int kill_trial,
               std::int64_t kill_budget) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      train::Search search(train::SearchSpace::parse(kNoisySpace), quiet(dir, options));
      search.run([&](const train::Params& p, train::TrialContext& ctx) {
        double loss = NAN;
        for (std::int64_t b = 1; b <= ctx.max_budget(); ++b) {
          if (ctx.id() == kill_trial && b == kill_budget) ::raise(SIGKILL);
          loss = quality(p) + 1.0 / static_cast<double>(b);
          if (!ctx.report(b, loss)) break;
        }
        return loss;
      });
    } catch (...) {
    }
    ::_exit(3);  // not killed: the test fails on the status
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

}  // namespace

TEST_CASE("a search killed with SIGKILL continues to the same table") {
  for (const auto strategy : {train::SearchStrategy::kAsha, train::SearchStrategy::kSyncHalving}) {
    INFO(train::strategy_name(strategy));
    const train::SearchOptions options{.seed = 5,
                                       .trials = 9,
                                       .parallel = strategy == train::SearchStrategy::kAsha ? 1 : 3,
                                       .strategy = strategy,
                                       .mode = tk::ckpt::MetricMode::kMin,
                                       .max_budget = 9,
                                       .eta = 3};
    const auto objective = [](const train::Params& p, train::TrialContext& ctx) {
      double loss = NAN;
      for (std::int64_t b = 1; b <= ctx.max_budget(); ++b) {
        loss = quality(p) + 1.0 / static_cast<double>(b);
        if (!ctx.report(b, loss)) break;
      }
      return loss;
    };
    trainkit_test::TempDir straight_dir, killed_dir;
    train::Search straight(train::SearchSpace::parse(kNoisySpace),
                           quiet(straight_dir.path(), options));
    const auto expected = straight.run(objective);

    // Killed when trial 4 starts (ASHA: trials 0-3 done; sh: inside round 0, others running).
    const int status = run_killed(killed_dir.path(), options, 4, 1);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    const tk::io::Json saved = tk::io::Json::parse(read_text(killed_dir / "search.json"));
    CHECK(saved.at("trials").as_array()[4].at("status").as_string() == "running");
    CHECK_FALSE(fs::exists(killed_dir / "results.json"));

    std::map<int, int> calls;
    std::mutex m;
    train::Search again(train::SearchSpace::parse(kNoisySpace), quiet(killed_dir.path(), options));
    const auto resumed = again.run([&](const train::Params& p, train::TrialContext& ctx) {
      {
        std::lock_guard<std::mutex> lock(m);
        ++calls[ctx.id()];
      }
      return objective(p, ctx);
    });
    CHECK(summary(resumed) == summary(expected));
    CHECK(resumed.table == expected.table);
    for (const train::Trial& t : resumed.trials) {
      // The trials that were running when the search died were started once more; finished
      // ones were not run again.
      const auto& e = *std::find_if(expected.trials.begin(), expected.trials.end(),
                                    [&](const train::Trial& x) { return x.id == t.id; });
      const std::string was =
          saved.at("trials").as_array()[static_cast<std::size_t>(t.id)].at("status").as_string();
      CHECK(t.starts == e.starts + (was == "running" ? 1 : 0));
      if (was == "completed" || was == "stopped") CHECK(calls.count(t.id) == 0);
      CHECK(t.reports == e.reports);
    }
    // A third run has nothing left to do.
    train::Search third(train::SearchSpace::parse(kNoisySpace), quiet(killed_dir.path(), options));
    int more = 0;
    CHECK(summary(third.run([&](const train::Params&, train::TrialContext&) {
            ++more;
            return 0.0;
          })) == summary(expected));
    CHECK(more == 0);
  }
}

TEST_CASE("SIGTERM stops a thread search, leaving it to continue to the same table") {
  const train::SearchOptions options{.seed = 4,
                                     .trials = 6,
                                     .parallel = 2,
                                     .strategy = train::SearchStrategy::kSyncHalving,
                                     .mode = tk::ckpt::MetricMode::kMin,
                                     .max_budget = 4,
                                     .eta = 2};
  const auto objective = [](bool signal) {
    return [signal](const train::Params& p, train::TrialContext& ctx) {
      double loss = NAN;
      for (std::int64_t b = 1; b <= ctx.max_budget(); ++b) {
        if (signal && ctx.id() == 3 && b == 1) ::raise(SIGTERM);
        loss = quality(p) + 1.0 / static_cast<double>(b);
        if (!ctx.report(b, loss)) break;
      }
      return loss;
    };
  };
  trainkit_test::TempDir straight_dir, stopped_dir;
  train::Search straight(train::SearchSpace::parse(kNoisySpace),
                         quiet(straight_dir.path(), options));
  const auto expected = straight.run(objective(false));
  CHECK_FALSE(expected.interrupted);
  train::Search stopped(train::SearchSpace::parse(kNoisySpace), quiet(stopped_dir.path(), options));
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  const auto first = stopped.run(objective(true));
  CHECK(first.interrupted);
  CHECK_FALSE(fs::exists(stopped_dir / "results.json"));
  int left = 0;
  for (const train::Trial& t : first.trials) left += !t.finished();
  CHECK(left > 0);
  const tk::io::Json saved = tk::io::Json::parse(read_text(stopped_dir / "search.json"));
  // Trial 3 reported once more after the signal (its round-0 report, so paused), the others
  // were left running or pending.
  CHECK(saved.at("trials").as_array()[3].at("status").as_string() == "paused");
  // The handler was the search's only while it ran: SIGTERM's handler is the one from before.
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  CHECK((now.sa_handler == before.sa_handler));
  train::Search again(train::SearchSpace::parse(kNoisySpace), quiet(stopped_dir.path(), options));
  const auto resumed = again.run(objective(false));
  CHECK_FALSE(resumed.interrupted);
  CHECK(resumed.table == expected.table);
}

TEST_CASE("a changed space, seed or strategy is refused, listing each difference") {
  trainkit_test::TempDir dir;
  const auto run_with = [&](const std::vector<std::string>& space, train::SearchOptions o) {
    train::Search s(train::SearchSpace::parse(space), quiet(dir.path(), o));
    return s.run([](const train::Params& p, train::TrialContext&) { return p.get_double("lr"); });
  };
  const std::vector<std::string> space = {"lr=loguniform(1e-4,1e-1)", "hidden=choice(32,64)"};
  run_with(space, {.seed = 0, .trials = 3});
  const std::string before = read_text(dir / "search.json");
  const std::string message = error_of([&] {
    run_with({"lr=loguniform(1e-3,1e-1)", "depth=int(1,3)"},
             {.seed = 1, .trials = 3, .strategy = train::SearchStrategy::kAsha, .max_budget = 3});
  });
  INFO(message);
  CHECK(message.find("cannot continue the search in " + (dir / "search.json").string()) !=
        std::string::npos);
  CHECK(message.find("space: the search has lr=loguniform(1e-04,0.1), now "
                     "lr=loguniform(0.001,0.1)") != std::string::npos);
  CHECK(message.find("space: the search has hidden=choice(32,64), now it is gone") !=
        std::string::npos);
  CHECK(message.find("space: depth=int(1,3) is new") != std::string::npos);
  CHECK(message.find("seed: the search has '0', now '1'") != std::string::npos);
  CHECK(message.find("strategy: the search has 'random', now 'asha'") != std::string::npos);
  CHECK(message.find("max_budget: the search has '0', now '3'") != std::string::npos);
  CHECK(read_text(dir / "search.json") == before);  // untouched
  // parallel is not a setting of the search: another value continues it.
  CHECK(summary(run_with(space, {.seed = 0, .trials = 3, .parallel = 2})).size() == 3);
}

TEST_CASE("a damaged search.json is an error naming the file, never a crash") {
  trainkit_test::TempDir dir;
  const train::SearchOptions options{
      .seed = 2, .trials = 4, .strategy = train::SearchStrategy::kAsha, .max_budget = 4, .eta = 2};
  const auto objective = [](const train::Params& p, train::TrialContext& ctx) {
    for (std::int64_t b = 1; b <= 4; ++b)
      if (!ctx.report(b, p.get_double("x") * static_cast<double>(b))) break;
    return 0.0;
  };
  const std::vector<std::string> space = {"x=uniform(0,1)"};
  {
    train::Search s(train::SearchSpace::parse(space), quiet(dir.path(), options));
    s.run(objective);
  }
  const fs::path state = dir / "search.json";
  const std::string good = read_text(state);
  const auto load = [&](const std::string& text) {
    write_text(state, text);
    fs::remove(dir / "results.json");
    train::Search s(train::SearchSpace::parse(space), quiet(dir.path(), options));
    return error_of([&] { s.run(objective); });
  };
  const auto replace = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const std::size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "invalid JSON at byte 0"},
      {good.substr(0, good.size() / 2), "invalid JSON"},
      {"[1, 2]", "not a JSON object"},
      {"{}", "not a search state file"},
      {replace("\"trainkit.search\"", "\"other\""), "not a search state file"},
      {replace("\"version\": 1", "\"version\": 7"), "unknown version"},
      {replace("\"status\": \"completed\"", "\"status\": \"done\""), "unknown status 'done'"},
      {replace("\"status\": \"completed\"", "\"status\": 3"), "has no valid 'status'"},
      {replace("\"id\": 1", "\"id\": 9"), "trial 1's id is out of range"},
      {replace("\"round\": 0", "\"round\": -1"), "round is out of range"},
      {replace("\"starts\": 1", "\"starts\": 1.5"), "has no valid 'starts'"},
      {replace("\"x\": \"", "\"x\": \"1"), "params are not the ones its seed gives"},
      {replace("\"reports\": [", "\"reports\": [[0, 1], "), "report budget is out of range"},
      {replace("\"reports\": [", "\"reports\": [[2, 1], "), "report budgets do not increase"},
      {replace("\"rungs\": [", "\"rungs\": [[[17, 1]], "), "more rungs"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string message = load(text);
    INFO(expected << " -> " << message);
    CHECK(message.find("train::Search: " + state.string() + " is damaged: ") != std::string::npos);
    CHECK(message.find(expected) != std::string::npos);
  }
  // Seeded random damage: byte flips, truncations and insertions either load (a harmless change)
  // or fail with the same kind of message.
  tk::PhiloxStream rng(99);
  int refused = 0;
  for (int i = 0; i < 150; ++i) {
    std::string t = good;
    const std::size_t at = rng.next_u32() % t.size();
    switch (rng.next_u32() % 3) {
      case 0: t[at] = static_cast<char>(rng.next_u32()); break;
      case 1: t.resize(at); break;
      default: t.insert(at, 1, "{}[],:\"0-e9"[rng.next_u32() % 11]); break;
    }
    const std::string message = load(t);
    if (!message.empty()) {
      ++refused;
      INFO(message);
      CHECK(message.find(state.string()) != std::string::npos);
    }
  }
  CHECK(refused > 100);
  CHECK(load(good).empty());  // and the intact file still continues
}

TEST_CASE("process trials: metrics from metrics.jsonl, stop by SIGTERM, a failing command") {
  trainkit_test::TempDir dir;
  // Trial k writes {"step": b, "m": <x>.<b>} once per "epoch" b = 1..4; x = 4 fails with a
  // message on stderr. Higher is better, so ASHA keeps large x.
  const std::string script =
      "x={x}; if [ $x = 4 ]; then echo 'bad x' >&2; echo 'really bad' >&2; exit 3; fi; "
      "trap 'echo term >> {dir}/signals; exit 0' TERM; "
      "for b in 1 2 3 4; do echo \"{\\\"step\\\": $b, \\\"m\\\": $x.$b}\" >> {dir}/metrics.jsonl; "
      "sleep 0.15; done";
  train::Search search(train::SearchSpace::parse({"x=choice(1,2,3,4)"}),
                       quiet(dir.path(), {.seed = 1,
                                          .trials = 8,
                                          .parallel = 3,
                                          .strategy = train::SearchStrategy::kAsha,
                                          .metric = "m",
                                          .max_budget = 4,
                                          .eta = 2,
                                          .poll_seconds = 0.01}));
  const auto result = search.run_command({"/bin/sh", "-c", script});
  INFO(result.table);
  REQUIRE(result.trials.size() == 8);
  int failed = 0, completed = 0;
  for (const train::Trial& t : result.trials) {
    const std::int64_t x = t.params.get_int("x");
    if (x == 4) {
      ++failed;
      CHECK(t.status == train::TrialStatus::kFailed);
      CHECK(t.error.find("exited with status 3") != std::string::npos);
      CHECK(t.error.find("bad x\nreally bad") != std::string::npos);
      CHECK(t.reports.empty());
      continue;
    }
    CHECK(t.finished());
    REQUIRE_FALSE(t.reports.empty());
    // The reports are what the file held, one per line: x.1, x.2, ...
    for (const train::TrialReport& r : t.reports)
      CHECK(r.value ==
            doctest::Approx(static_cast<double>(x) + 0.1 * static_cast<double>(r.budget)));
    if (t.status == train::TrialStatus::kCompleted) {
      ++completed;
      CHECK(t.budget() == 4);
    } else {
      CHECK(t.status == train::TrialStatus::kStopped);
      CHECK(t.budget() < 4);
      CHECK(read_text(t.dir / "signals").find("term") != std::string::npos);  // got SIGTERM
    }
  }
  CHECK(failed >= 1);
  CHECK(completed >= 1);
  CHECK(result.trials.back().status == train::TrialStatus::kFailed);  // failed ones last
  CHECK(result.table.find("failed: exited with status 3") != std::string::npos);
  // Every trial got its own directory and placeholders.
  std::set<fs::path> dirs;
  for (const train::Trial& t : result.trials) dirs.insert(t.dir);
  CHECK(dirs.size() == 8);

  // Template errors.
  trainkit_test::TempDir other;
  train::Search s2(train::SearchSpace::parse({"x=choice(1,2)"}), quiet(other.path()));
  CHECK(error_of([&] {
          s2.run_command({"prog", "--out", "{dir}"});
        }).find("does not pass hyper-parameter 'x' (add an argument with {x})") !=
        std::string::npos);
  CHECK(error_of([&] {
          s2.run_command({"prog", "--x={x}", "--y={y}", "{dir}"});
        }).find("names {y}, which is not a placeholder") != std::string::npos);
  CHECK(error_of([&] { s2.run_command({"prog", "--x={x}"}); }).find("{dir}") != std::string::npos);
  // A hyper-parameter named like a built-in placeholder would silently replace it.
  train::Search s3(train::SearchSpace::parse({"dir=choice(a,b)"}), quiet(other.path() / "s3"));
  CHECK(error_of([&] {
          s3.run_command({"prog", "{dir}"});
        }).find("hyper-parameter 'dir' has the name of a built-in placeholder") !=
        std::string::npos);
  // A trial whose stderr is not UTF-8 (or whose tail cuts a character) fails with a readable
  // error; search.json is still written and the search finishes (it stopped for good).
  trainkit_test::TempDir bytes_dir;
  train::Search s4(train::SearchSpace::parse({"x=choice(1,2)"}), quiet(bytes_dir.path()));
  const auto odd =
      s4.run_command({"/bin/sh", "-c", "printf 'bad \\377 byte' >&2; exit 2 # {x} {dir}"});
  for (const train::Trial& t : odd.trials) {
    CHECK(t.status == train::TrialStatus::kFailed);
    CHECK(t.error.find("bad \xef\xbf\xbd byte") != std::string::npos);
  }
  // A wrapper's own children are stopped with it (its process group gets the SIGTERM).
  trainkit_test::TempDir group_dir;
  train::Search s5(
      train::SearchSpace::parse({"x=choice(1,2)"}),
      quiet(group_dir.path(), {.trials = 1, .metric = "m", .max_budget = 1, .poll_seconds = 0.01}));
  const auto wrapped = s5.run_command(
      {"/bin/sh", "-c",
       "echo '{\"m\": {x}}' > {dir}/metrics.jsonl; sh -c 'echo $$ > {dir}/child; sleep 30'"});
  REQUIRE(wrapped.trials.size() == 1);
  const pid_t child = static_cast<pid_t>(std::stol(read_text(wrapped.trials[0].dir / "child")));
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = ::kill(child, 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(gone);
  // A program that does not exist fails each trial, not the search.
  const auto missing = s2.run_command({"/nonexistent/prog", "{x}", "{dir}"});
  for (const train::Trial& t : missing.trials) {
    CHECK(t.status == train::TrialStatus::kFailed);
    CHECK(t.error.find("cannot run /nonexistent/prog") != std::string::npos);
  }
}

namespace {

std::string python() {
  const char* env = std::getenv("TRAINKIT_PYTHON");
  return env != nullptr && *env != '\0' ? env : "python3";
}

// Reads <tb> the way TensorBoard's HPARAMS tab does (the plugin's tags in every run) and checks
// it against results.json: the experiment (hparam names and types, metric tags) and, per trial
// run, the session's values, its end status and the last value of the metric's scalar.
const char* kCheckScript = R"PY(
import json, sys
from tensorboard.backend.event_processing import plugin_event_multiplexer as pem
from tensorboard.plugins.hparams import plugin_data_pb2
tb, results_path = sys.argv[1], sys.argv[2]
results = json.load(open(results_path))
mux = pem.EventMultiplexer()
mux.AddRunsFromDirectory(tb)
mux.Reload()
content = mux.PluginRunToTagToContent("hparams")
bad = []
exp = [r for r, tags in content.items() if "_hparams_/experiment" in tags]
if len(exp) != 1:
    bad.append("experiment runs: %r" % exp)
else:
    e = plugin_data_pb2.HParamsPluginData.FromString(content[exp[0]]["_hparams_/experiment"]).experiment
    names = sorted(h.name for h in e.hparam_infos)
    want = sorted(results["trials"][0]["params"])
    if names != want: bad.append("hparam names %r, want %r" % (names, want))
    types = {h.name: h.type for h in e.hparam_infos}
    if types.get("act") != 1 or types.get("lr") != 3: bad.append("types %r" % types)
    tags = sorted(m.name.tag for m in e.metric_infos)
    if tags != sorted([results["metric"], "budget"]): bad.append("metric tags %r" % tags)
for t in results["trials"]:
    run = "trial_%03d" % t["trial"]
    tags = content.get(run, {})
    if "_hparams_/session_start_info" not in tags:
        bad.append(run + ": no session start"); continue
    s = plugin_data_pb2.HParamsPluginData.FromString(tags["_hparams_/session_start_info"]).session_start_info
    for name, value in t["params"].items():
        v = s.hparams[name]
        got = v.string_value if v.WhichOneof("kind") == "string_value" else v.number_value
        if (got != value) and not (isinstance(value, (int, float)) and abs(got - value) <= 1e-12 * abs(value)):
            bad.append("%s: %s = %r, want %r" % (run, name, got, value))
    end = plugin_data_pb2.HParamsPluginData.FromString(tags["_hparams_/session_end_info"]).session_end_info
    if end.status != (2 if t["status"] == "failed" else 1): bad.append(run + ": status %d" % end.status)
    if t["metric"] is not None:
        points = mux.GetAccumulator(run).Tensors(results["metric"])
        from tensorboard.util import tensor_util
        last = float(tensor_util.make_ndarray(points[-1].tensor_proto))
        if abs(last - t["metric"]) > 1e-6 * abs(t["metric"]): bad.append("%s: last %r, want %r" % (run, last, t["metric"]))
        if points[-1].step != t["budget"]: bad.append("%s: last step %d" % (run, points[-1].step))
print("\n".join(bad) if bad else "hparams OK: %d sessions" % len(results["trials"]))
sys.exit(1 if bad else 0)
)PY";

}  // namespace

TEST_CASE("TensorBoard HPARAMS records (read back by the tensorboard package)") {
  trainkit_test::TempDir dir;
  train::SearchOptions o = quiet(dir.path(), {.trials = 5,
                                              .strategy = train::SearchStrategy::kAsha,
                                              .metric = "val_accuracy",
                                              .max_budget = 3});
  o.tensorboard = true;
  train::Search search(train::SearchSpace::parse(
                           {"lr=loguniform(1e-4,1e-1)", "act=choice(relu,gelu)", "n=int(1,9)"}),
                       o);
  const auto result = search.run([](const train::Params& p, train::TrialContext& ctx) {
    if (ctx.id() == 2) throw std::runtime_error("trial 2 breaks");
    for (std::int64_t b = 1; b <= 3; ++b)
      if (!ctx.report(b, p.get_double("lr") * static_cast<double>(b + p.get_int("n")))) break;
    return 0.0;
  });
  CHECK(result.trials.back().id == 2);
  CHECK(result.trials.back().error == "trial 2 breaks");
  REQUIRE(fs::exists(dir / "tb"));
  int runs = 0;
  for (const auto& e : fs::directory_iterator(dir / "tb")) runs += e.is_directory();
  CHECK(runs == 5);
  const std::string check = (dir / "check.py").string();
  write_text(check, kCheckScript);
  const std::string probe = "\"" + python() + "\" -c \"import tensorboard\" >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    if (std::getenv("CI") != nullptr || std::getenv("TRAINKIT_REQUIRE_TENSORBOARD") != nullptr)
      FAIL_CHECK("CI requires `import tensorboard` to work for " << python());
    else
      MESSAGE("skipped the tensorboard read-back: "
              << python() << " cannot import tensorboard (set TRAINKIT_PYTHON)");
    return;
  }
  const std::string cmd = "\"" + python() + "\" \"" + check + "\" \"" + (dir / "tb").string() +
                          "\" \"" + (dir / "results.json").string() + "\" 2>&1";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  INFO(output);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(output.find("hparams OK: 5 sessions") != std::string::npos);
}

TEST_CASE("process trials: metrics.jsonl is read incrementally, partial lines and rewrites too") {
  trainkit_test::TempDir dir;
  const fs::path file = dir.path() / "metrics.jsonl";
  tk::train::detail::SearchMetricsReader reader(file, "m");
  reader.poll();  // no file yet
  CHECK(reader.values().empty());
  const auto append = [&](const std::string& text) {
    std::ofstream out(file, std::ios::binary | std::ios::app);
    out << text;
  };
  // Many polls of a file that grows a line at a time (some written in two halves, the metric
  // only on some lines): each byte is read about once, not once per poll.
  std::vector<double> expected;
  std::uint64_t size = 0;
  for (int i = 1; i <= 300; ++i) {
    const std::string line =
        i % 3 == 0 ? "{\"step\": " + std::to_string(i) + ", \"loss\": 1}\n"
                   : "{\"step\": " + std::to_string(i) + ", \"m\": " + std::to_string(i) + ".5}\n";
    if (i % 3 != 0) expected.push_back(i + 0.5);
    append(line.substr(0, line.size() / 2));
    reader.poll();  // half a line: not read as a line yet
    append(line.substr(line.size() / 2));
    size += line.size();
    reader.poll();
    REQUIRE(reader.values() == expected);
  }
  // Re-reading the file whole at every poll would read ~600 * size / 2 bytes.
  CHECK(reader.bytes_read() < 2 * size);
  // A line that is not JSON, or has a non-number, is skipped / NaN; huge lines span chunks.
  append("not json\n{\"m\": \"text\"}\n{\"m\": 7, \"pad\": \"" +
         std::string(tk::train::detail::SearchMetricsReader::kChunk + 10, 'x') + "\"}\n");
  reader.poll();
  REQUIRE(reader.values().size() == expected.size() + 2);
  CHECK(std::isnan(reader.values()[expected.size()]));
  CHECK(reader.values().back() == 7.0);

  // Replaced by a shorter file (a resumed Loop drops lines past its checkpoint): read afresh.
  const fs::path tmp = dir.path() / "new.jsonl";
  write_text(tmp, "{\"m\": 1}\n{\"m\": 2}\n");
  fs::rename(tmp, file);
  reader.poll();
  CHECK(reader.values() == std::vector<double>{1.0, 2.0});
  // Truncated in place and rewritten longer than before (a fresh run's O_TRUNC): read afresh.
  write_text(file, "{\"m\": 5}\n{\"m\": 6}\n{\"m\": 7}\n{\"m\": 8}\n");
  reader.poll();
  CHECK(reader.values() == std::vector<double>{5.0, 6.0, 7.0, 8.0});
  // Shrunk in place.
  write_text(file, "{\"m\": 9}\n");
  reader.poll();
  CHECK(reader.values() == std::vector<double>{9.0});
  // Removed.
  fs::remove(file);
  reader.poll();
  CHECK(reader.values().empty());
}
