// Tests for optim/lr_schedule.hpp: every schedule reproduces torch.optim.lr_scheduler's learning
// rates bit for bit over 200 steps on a 2-group optimizer (make_reference.py), including the
// recursive cosine past T_max (CosineAnnealingLR's `periodic` option), SequentialLR milestones
// (closed-form restarts) and ReduceLROnPlateau in all four mode/threshold combinations with
// cooldown and per-group min_lr; every schedule with an end (cosine, warmup + cosine, linear
// warmup / decay, ...) holds its final value past it by default; state_dict resumes a schedule
// exactly, and a state of another schedule type, group count or SequentialLR composition is
// refused (older states without those entries still load); ReduceLROnPlateau saves and restores
// min_lrs and eps; bad arguments throw.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <trainkit/core/rng.hpp>
#include <trainkit/optim/lr_schedule.hpp>

#include "optim_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace optim = trainkit::optim;
using optest::Reference;

optim::LrGroups two_groups() {
  optim::LrGroups g;
  g.lr = {0.1, 0.05};
  return g;
}

using Factory = std::function<std::unique_ptr<optim::LRScheduler>(optim::LrGroups&)>;

// Compares the groups' lr after construction and after every step with the reference rows.
void check_schedule(const std::string& c, const Factory& make) {
  const optest::RefTensor& r = Reference::get()["lr/" + c];
  optim::LrGroups groups = two_groups();
  const std::unique_ptr<optim::LRScheduler> s = make(groups);
  int mismatches = 0;
  for (int t = 0; t <= optest::kSteps; ++t) {
    if (t > 0) s->step();
    for (int g = 0; g < 2; ++g) {
      const double want = r.values[static_cast<std::size_t>(t * 2 + g)];
      if (groups.lr[static_cast<std::size_t>(g)] != want && mismatches++ < 3) {
        INFO(c << " step " << t << " group " << g);
        CHECK(groups.lr[static_cast<std::size_t>(g)] == want);
      }
    }
    CHECK(s->last_lr() == groups.lr);
  }
  CHECK(mismatches == 0);
  CHECK(s->last_epoch() == optest::kSteps);
}

}  // namespace

TEST_CASE("LR schedules equal torch.optim.lr_scheduler step for step (bitwise)") {
  using namespace optim;
  check_schedule("constant", [](LrGroups& g) {
    return std::make_unique<ConstantLR>(g, ConstantLROptions{.factor = 1.0, .total_iters = 10});
  });
  check_schedule("constant_factor", [](LrGroups& g) {
    return std::make_unique<ConstantLR>(g, ConstantLROptions{.factor = 0.5, .total_iters = 10});
  });
  check_schedule("linear", [](LrGroups& g) {
    return std::make_unique<LinearLR>(g, LinearLROptions{0.1, 1.0, 20});
  });
  check_schedule("linear_decay", [](LrGroups& g) {
    return std::make_unique<LinearLR>(g, LinearLROptions{1.0, 0.05, 150});
  });
  check_schedule("cosine", [](LrGroups& g) {
    return std::make_unique<CosineAnnealingLR>(
        g, CosineAnnealingLROptions{.t_max = 50, .eta_min = 0.001, .periodic = true});
  });
  check_schedule("step", [](LrGroups& g) {
    return std::make_unique<StepLR>(g, StepLROptions{30, 0.5});
  });
  check_schedule("multistep", [](LrGroups& g) {
    return std::make_unique<MultiStepLR>(g, MultiStepLROptions{{50, 20, 120, 50}, 0.3});
  });
  check_schedule("exponential", [](LrGroups& g) {
    return std::make_unique<ExponentialLR>(g, ExponentialLROptions{0.98});
  });
  check_schedule("warmup_cosine", [](LrGroups& g) {
    return warmup_cosine(
        g, {.warmup_steps = 10, .total_steps = 200, .warmup_start_factor = 1e-3, .eta_min = 1e-4});
  });
  check_schedule("sequential3", [](LrGroups& g) {
    std::vector<std::unique_ptr<LRScheduler>> s;
    s.push_back(std::make_unique<ConstantLR>(g, ConstantLROptions{0.25, 3}));
    s.push_back(std::make_unique<ExponentialLR>(g, ExponentialLROptions{0.97}));
    s.push_back(std::make_unique<StepLR>(g, StepLROptions{25, 0.5}));
    return std::make_unique<SequentialLR>(g, std::move(s), std::vector<std::int64_t>{5, 60});
  });
}

TEST_CASE("ReduceLROnPlateau equals PyTorch's for every mode, threshold mode and option") {
  using Opt = optim::ReduceLROnPlateauOptions;
  const optest::RefTensor& metric = Reference::get()["lr/metric"];
  auto run = [&](const std::string& c, Opt o, double sign) {
    const optest::RefTensor& r = Reference::get()["lr/" + c];
    optim::LrGroups groups = two_groups();
    optim::ReduceLROnPlateau s(groups, o);
    int mismatches = 0;
    for (int t = 0; t <= optest::kSteps; ++t) {
      if (t > 0) s.step(sign * metric.values[static_cast<std::size_t>(t - 1)]);
      for (int g = 0; g < 2; ++g)
        if (groups.lr[static_cast<std::size_t>(g)] != r.values[static_cast<std::size_t>(t * 2 + g)])
          ++mismatches;
    }
    INFO(c);
    CHECK(mismatches == 0);
    CHECK(groups.lr[0] < 0.1);  // it did reduce
  };
  run("plateau_min_rel",
      {.mode = Opt::Mode::kMin,
       .factor = 0.5,
       .patience = 3,
       .threshold = 1e-3,
       .threshold_mode = Opt::ThresholdMode::kRel,
       .cooldown = 2,
       .min_lr = {0.01}},
      1.0);
  run("plateau_max_abs",
      {.mode = Opt::Mode::kMax,
       .factor = 0.7,
       .patience = 0,
       .threshold = 0.05,
       .threshold_mode = Opt::ThresholdMode::kAbs,
       .cooldown = 0,
       .min_lr = {0.02, 0.001},
       .eps = 1e-3},
      -1.0);
  run("plateau_min_abs",
      {.mode = Opt::Mode::kMin,
       .factor = 0.1,
       .patience = 10,
       .threshold = 0.01,
       .threshold_mode = Opt::ThresholdMode::kAbs,
       .cooldown = 5},
      1.0);
  run("plateau_max_rel", {.mode = Opt::Mode::kMax, .factor = 0.5, .patience = 5, .threshold = 1e-4},
      -1.0);
  optim::LrGroups g = two_groups();
  CHECK_THROWS_AS(optim::ReduceLROnPlateau(g, {.factor = 1.0}), tk::Error);
  CHECK_THROWS_AS(optim::ReduceLROnPlateau(g, {.min_lr = {0.1, 0.2, 0.3}}), tk::Error);
}

TEST_CASE("LR schedules: state_dict resumes exactly (SequentialLR and plateau included)") {
  SUBCASE("warmup + cosine") {
    optim::LrGroups a = two_groups();
    auto s = optim::warmup_cosine(a, {.warmup_steps = 10, .total_steps = 200, .eta_min = 1e-4});
    for (int t = 0; t < 77; ++t) s->step();
    const tk::StateDict sd = s->state_dict();
    CHECK(sd.get_int("last_epoch") == 77);
    CHECK(sd.get_int("_schedulers.1.T_max") == 190);
    // Resume: a fresh optimizer gets its lrs from the optimizer's state, the schedule its own.
    optim::LrGroups b = two_groups();
    auto r = optim::warmup_cosine(b, {.warmup_steps = 10, .total_steps = 200, .eta_min = 1e-4});
    b.lr = a.lr;
    r->load_state_dict(sd);
    for (int t = 0; t < 100; ++t) {
      s->step();
      r->step();
      REQUIRE(a.lr == b.lr);
    }
  }
  SUBCASE("plateau") {
    optim::LrGroups a = two_groups();
    optim::ReduceLROnPlateau s(a, {.patience = 2, .cooldown = 1});
    const double m[] = {5, 4, 4, 4, 4, 3, 3, 3};
    for (double x : m) s.step(x);
    optim::LrGroups b = two_groups();
    optim::ReduceLROnPlateau r(b);
    b.lr = a.lr;
    r.load_state_dict(s.state_dict());
    for (int t = 0; t < 20; ++t) {
      s.step(3.0);
      r.step(3.0);
      REQUIRE(a.lr == b.lr);
    }
    CHECK(a.lr[0] < 0.001);
  }
}

TEST_CASE("LR schedules: a load restores the saved settings; damaged states are refused") {
  // As PyTorch's: a schedule built with other settings continues the saved one.
  optim::LrGroups a = two_groups();
  auto s = optim::warmup_cosine(a, {.warmup_steps = 3, .total_steps = 100});
  for (int t = 0; t < 50; ++t) s->step();
  optim::LrGroups b = two_groups();
  auto r = optim::warmup_cosine(b, {.warmup_steps = 3, .total_steps = 10});
  b.lr = a.lr;
  r->load_state_dict(s->state_dict());
  for (int t = 0; t < 60; ++t) {
    s->step();
    r->step();
    REQUIRE(a.lr == b.lr);
  }
  optim::LrGroups c = two_groups();
  optim::CosineAnnealingLR cos100(c, {.t_max = 100});
  for (int t = 0; t < 30; ++t) cos100.step();
  optim::LrGroups d = two_groups();
  optim::CosineAnnealingLR cos20(d, {.t_max = 20});
  d.lr = c.lr;
  cos20.load_state_dict(cos100.state_dict());
  cos100.step();
  cos20.step();
  CHECK(c.lr == d.lr);

  // Damage: each refused naming the entry, the schedule unchanged.
  const tk::StateDict good = cos100.state_dict();
  const auto refused = [&](optim::LRScheduler& target, const tk::StateDict& sd,
                           const char* message) {
    const tk::StateDict before = target.state_dict();
    CHECK_THROWS_WITH_AS(target.load_state_dict(sd), doctest::Contains(message), tk::Error);
    CHECK(target.state_dict().values == before.values);
  };
  tk::StateDict bad = good;
  bad.set("last_epoch", std::int64_t{-7});
  refused(cos20, bad, "last_epoch -7");
  bad = good;
  bad.set("base_lrs.0", std::numeric_limits<double>::quiet_NaN());
  refused(cos20, bad, "base_lrs.0 is nan");
  bad = good;
  bad.set("T_max", std::int64_t{0});
  refused(cos20, bad, "t_max must be in [1, 2^53]");
  tk::StateDict seq = s->state_dict();
  seq.set("_schedulers.1.eta_min", std::numeric_limits<double>::infinity());
  refused(*r, seq, "eta_min must be finite");
  optim::LrGroups e = two_groups();
  optim::MultiStepLR ms(e, {.milestones = {3, 5}});
  tk::StateDict many = ms.state_dict();
  many.set("milestones", std::int64_t{1} << 40);
  refused(ms, many, "claims 1099511627776 milestones");

  optim::LrGroups p = two_groups();
  optim::ReduceLROnPlateau plateau(p, {.patience = 2});
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"mode", "bogus"},
                                                        {"threshold_mode", "x"},
                                                        {"patience", "-5"},
                                                        {"num_bad_epochs", "-1"},
                                                        {"_last_lr.0", "nan"}}) {
    CAPTURE(key);
    tk::StateDict sd = plateau.state_dict();
    sd.values[key] = value;
    CHECK_THROWS_AS(plateau.load_state_dict(sd), tk::Error);
  }
  CHECK_NOTHROW(plateau.load_state_dict(plateau.state_dict()));
}

TEST_CASE("LR schedule arguments are validated") {
  optim::LrGroups g = two_groups();
  CHECK_THROWS_AS(optim::LinearLR(g, {.start_factor = 0.0}), tk::Error);
  CHECK_THROWS_AS(optim::ConstantLR(g, {.factor = 2.0}), tk::Error);
  // factor 0 would divide by zero at total_iters (NaN learning rates from then on).
  CHECK_THROWS_WITH_AS(optim::ConstantLR(g, {.factor = 0.0}), doctest::Contains("(0, 1]"),
                       tk::Error);
  CHECK_THROWS_AS(optim::StepLR(g, {.step_size = 2, .gamma = std::nan("")}), tk::Error);
  CHECK_THROWS_AS(optim::CosineAnnealingLR(g, {.t_max = 0}), tk::Error);
  CHECK_THROWS_AS(optim::warmup_cosine(g, {.warmup_steps = 10, .total_steps = 10}), tk::Error);
  optim::LrGroups other = two_groups();
  std::vector<std::unique_ptr<optim::LRScheduler>> s;
  s.push_back(std::make_unique<optim::StepLR>(g, optim::StepLROptions{5, 0.5}));
  s.push_back(std::make_unique<optim::StepLR>(other, optim::StepLROptions{5, 0.5}));
  CHECK_THROWS_AS(optim::SequentialLR(g, std::move(s), {3}), tk::Error);
  optim::LrGroups empty;
  CHECK_THROWS_AS(optim::StepLR(empty, {5, 0.5}), tk::Error);
}

namespace {

// Steps `s` to 3x `length` and checks that from step `length` on the groups' lr never changes
// (bitwise), and that it had reached `final_lr(g)` there.
void check_holds(optim::LRScheduler& s, optim::LrGroups& groups, std::int64_t length,
                 const std::function<double(std::size_t)>& final_lr) {
  std::vector<double> at_end;
  int changed = 0;
  for (std::int64_t t = 1; t <= 3 * length; ++t) {
    s.step();
    if (t == length) {
      at_end = groups.lr;
      for (std::size_t g = 0; g < groups.lr.size(); ++g)
        CHECK(groups.lr[g] == doctest::Approx(final_lr(g)).epsilon(1e-12));
    }
    if (t > length && groups.lr != at_end && changed++ < 3) {
      INFO("step " << t << " of a schedule of " << length);
      CHECK(groups.lr == at_end);
    }
  }
  CHECK(changed == 0);
}

}  // namespace

TEST_CASE("LR schedules with an end hold their final value past it (random lengths)") {
  tk::PhiloxStream rng(99, 4);
  for (int c = 0; c < 10; ++c) {
    const auto length = static_cast<std::int64_t>(2 + rng.next_u32() % 300);
    const auto warmup = static_cast<std::int64_t>(1 + rng.next_u32() % (length - 1));
    const double eta = 1e-4 * static_cast<double>(rng.next_u32() % 10);
    CAPTURE(length);
    CAPTURE(warmup);
    const std::vector<double> base = {0.1, 0.05};
    SUBCASE("warmup_cosine") {
      optim::LrGroups g = two_groups();
      auto s =
          optim::warmup_cosine(g, {.warmup_steps = warmup, .total_steps = length, .eta_min = eta});
      check_holds(*s, g, length, [&](std::size_t) { return eta; });
    }
    SUBCASE("CosineAnnealingLR") {
      optim::LrGroups g = two_groups();
      optim::CosineAnnealingLR s(g, {.t_max = length, .eta_min = eta});
      check_holds(s, g, length, [&](std::size_t) { return eta; });
    }
    SUBCASE("LinearLR decay and warmup") {
      optim::LrGroups g = two_groups();
      optim::LinearLR s(g, {.start_factor = 1.0, .end_factor = 0.05, .total_iters = length});
      check_holds(s, g, length, [&](std::size_t i) { return base[i] * 0.05; });
      optim::LrGroups w = two_groups();
      optim::LinearLR u(w, {.start_factor = 0.01, .end_factor = 1.0, .total_iters = length});
      check_holds(u, w, length, [&](std::size_t i) { return base[i]; });
    }
    SUBCASE("ConstantLR") {
      optim::LrGroups g = two_groups();
      optim::ConstantLR s(g, {.factor = 0.5, .total_iters = length});
      check_holds(s, g, length, [&](std::size_t i) { return base[i]; });
    }
    SUBCASE("MultiStepLR after its last milestone") {
      optim::LrGroups g = two_groups();
      optim::MultiStepLR s(g, {.milestones = {warmup, length}, .gamma = 0.5});
      check_holds(s, g, length, [&](std::size_t i) { return base[i] * 0.25; });
    }
    SUBCASE("SequentialLR ending in a cosine") {
      optim::LrGroups g = two_groups();
      std::vector<std::unique_ptr<optim::LRScheduler>> parts;
      parts.push_back(
          std::make_unique<optim::ConstantLR>(g, optim::ConstantLROptions{0.3, warmup}));
      parts.push_back(std::make_unique<optim::CosineAnnealingLR>(
          g, optim::CosineAnnealingLROptions{.t_max = length - warmup, .eta_min = eta}));
      optim::SequentialLR s(g, std::move(parts), {warmup});
      check_holds(s, g, length, [&](std::size_t) { return eta; });
    }
  }
}

TEST_CASE("CosineAnnealingLR: PyTorch's rise past T_max only when asked for") {
  optim::LrGroups a = two_groups(), b = two_groups();
  optim::CosineAnnealingLR held(a, {.t_max = 10, .eta_min = 0.001});
  optim::CosineAnnealingLR periodic(b, {.t_max = 10, .eta_min = 0.001, .periodic = true});
  for (int t = 1; t <= 20; ++t) {
    held.step();
    periodic.step();
    if (t <= 10) CHECK(a.lr == b.lr);  // identical up to T_max
  }
  CHECK(a.lr[0] == doctest::Approx(0.001));
  CHECK(b.lr[0] == doctest::Approx(0.1));  // back at the base lr after 2 T_max, as PyTorch's
}

TEST_CASE("replay_schedule: a restored schedule switched to another equals it run from step 0") {
  tk::PhiloxStream rng(41);
  for (int trial = 0; trial < 20; ++trial) {
    const auto warmup = std::int64_t(1 + rng.next_u32() % 5);
    const std::int64_t old_total = warmup + 2 + rng.next_u32() % 20;
    const std::int64_t new_total = old_total + 1 + rng.next_u32() % 30;
    const std::int64_t at = 1 + rng.next_u32() % old_total;  // the checkpoint's step
    INFO("warmup ", warmup, " totals ", old_total, " -> ", new_total, " at ", at);
    const auto make = [&](std::int64_t total) {
      return [=](optim::LrGroups& g) {
        return optim::warmup_cosine(
            g, {.warmup_steps = warmup, .total_steps = total, .eta_min = 1e-4});
      };
    };
    // The run that followed the longer schedule from the start.
    optim::LrGroups straight_groups = two_groups();
    auto straight = make(new_total)(straight_groups);
    for (std::int64_t s = 0; s < at; ++s) straight->step();
    // The resumed run: the old schedule restored at `at`, then switched.
    optim::LrGroups groups = two_groups();
    auto old = make(old_total)(groups);
    for (std::int64_t s = 0; s < at; ++s) old->step();
    auto resumed = make(new_total)(groups);
    resumed->load_state_dict(old->state_dict());
    optim::replay_schedule(*resumed, groups, at, make(new_total));
    for (std::int64_t s = at; s < new_total + 3; ++s) {
      REQUIRE(groups.lr == straight_groups.lr);  // bit for bit
      resumed->step();
      straight->step();
    }
    CHECK(groups.lr == straight_groups.lr);
  }
}

TEST_CASE("LR schedule constructors refuse what their loaders refuse; counts stop at 2^53") {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t k2p53 = std::int64_t{1} << 53;
  optim::LrGroups g = two_groups();
  CHECK_THROWS_WITH_AS(optim::CosineAnnealingLR(g, {.t_max = 10, .eta_min = -0.01}),
                       doctest::Contains("eta_min must be finite and >= 0, got -0.01"), tk::Error);
  CHECK_THROWS_WITH_AS(optim::CosineAnnealingLR(g, {.t_max = kMax}),
                       doctest::Contains("t_max must be in [1, 2^53]"), tk::Error);
  CHECK_THROWS_WITH_AS(optim::MultiStepLR(g, {.milestones = {2}, .gamma = kNaN}),
                       doctest::Contains("MultiStepLR: gamma must be finite and >= 0, got nan"),
                       tk::Error);
  CHECK_THROWS_AS(optim::MultiStepLR(g, {.milestones = {2}, .gamma = -0.5}), tk::Error);
  using Plateau = optim::ReduceLROnPlateauOptions;
  for (const Plateau& o :
       {Plateau{.factor = -1.0}, Plateau{.factor = kNaN}, Plateau{.patience = -1},
        Plateau{.threshold = kNaN}, Plateau{.cooldown = -1}}) {
    CHECK_THROWS_WITH_AS(optim::ReduceLROnPlateau(g, o),
                         doctest::Contains("expected factor in [0, 1)"), tk::Error);
  }
  CHECK(g.lr == two_groups().lr);

  // warmup_cosine checks every option before the warmup scales the groups' lr.
  optim::LrGroups w = two_groups();
  CHECK_THROWS_WITH_AS(
      optim::warmup_cosine(w, {.warmup_steps = 10, .total_steps = 100, .eta_min = kNaN}),
      doctest::Contains("eta_min must be finite"), tk::Error);
  CHECK_THROWS_AS(
      optim::warmup_cosine(w, {.warmup_steps = 10, .total_steps = 100, .warmup_start_factor = 0.0}),
      tk::Error);
  CHECK(w.lr == two_groups().lr);

  // A saved count above 2^53 is refused (the next step would overflow), 2^53 itself loads.
  optim::LrGroups s = two_groups();
  optim::StepLR step(s, {.step_size = 3, .gamma = 0.5});
  const tk::StateDict good = step.state_dict();
  for (const char* key : {"last_epoch", "_step_count"}) {
    CAPTURE(key);
    tk::StateDict sd = good;
    sd.set(key, kMax);
    CHECK_THROWS_WITH_AS(step.load_state_dict(sd), doctest::Contains("[0, 2^53]"), tk::Error);
    CHECK(step.last_epoch() == 0);
    sd.set(key, k2p53 + 1);
    CHECK_THROWS_AS(step.load_state_dict(sd), tk::Error);
  }
  tk::StateDict edge = good;
  edge.set("last_epoch", k2p53);
  step.load_state_dict(edge);
  step.step();
  CHECK(step.last_epoch() == k2p53 + 1);

  auto seq = optim::warmup_cosine(w, {.warmup_steps = 2, .total_steps = 10});
  tk::StateDict seq_sd = seq->state_dict();
  seq_sd.set("last_epoch", kMax);
  CHECK_THROWS_WITH_AS(seq->load_state_dict(seq_sd), doctest::Contains("[0, 2^53]"), tk::Error);

  optim::LrGroups p = two_groups();
  optim::ReduceLROnPlateau plateau(p, {.patience = 2});
  for (const char* key : {"num_bad_epochs", "cooldown_counter", "last_epoch"}) {
    CAPTURE(key);
    tk::StateDict sd = plateau.state_dict();
    sd.set(key, kMax);
    CHECK_THROWS_WITH_AS(plateau.load_state_dict(sd), doctest::Contains("[0, 2^53]"), tk::Error);
  }
  CHECK(plateau.last_epoch() == 0);
}

namespace {

// Every schedule type, over `groups`; `k` picks the type.
constexpr int kScheduleKinds = 8;
std::unique_ptr<optim::LRScheduler> make_kind(int k, optim::LrGroups& g) {
  using namespace optim;
  switch (k) {
    case 0: return std::make_unique<ConstantLR>(g, ConstantLROptions{0.5, 4});
    case 1: return std::make_unique<LinearLR>(g, LinearLROptions{0.2, 1.0, 6});
    case 2: return std::make_unique<CosineAnnealingLR>(g, CosineAnnealingLROptions{.t_max = 9});
    case 3: return std::make_unique<StepLR>(g, StepLROptions{3, 0.5});
    case 4: return std::make_unique<MultiStepLR>(g, MultiStepLROptions{{2, 5}, 0.5});
    case 5: return std::make_unique<ExponentialLR>(g, ExponentialLROptions{0.9});
    case 6: return warmup_cosine(g, {.warmup_steps = 3, .total_steps = 12});
    default: {
      std::vector<std::unique_ptr<LRScheduler>> s;
      s.push_back(std::make_unique<ConstantLR>(g, ConstantLROptions{0.25, 3}));
      s.push_back(std::make_unique<StepLR>(g, StepLROptions{2, 0.5}));
      return std::make_unique<SequentialLR>(g, std::move(s), std::vector<std::int64_t>{4});
    }
  }
}
const char* kind_name(int k) {
  const char* names[] = {"ConstantLR",  "LinearLR",      "CosineAnnealingLR", "StepLR",
                         "MultiStepLR", "ExponentialLR", "SequentialLR",      "SequentialLR"};
  return names[k];
}

optim::LrGroups random_groups(tk::PhiloxStream& rng, std::size_t n) {
  optim::LrGroups g;
  for (std::size_t i = 0; i < n; ++i) g.lr.push_back(1e-3 * (1 + rng.next_u32() % 100));
  return g;
}

// The state without the entries a state saved before the type and group count has.
tk::StateDict without_kind(tk::StateDict sd) {
  for (auto it = sd.values.begin(); it != sd.values.end();) {
    const std::string& k = it->first;
    const bool kind = k == "schedule" || k == "num_groups" || k == "num_schedulers" ||
                      k.ends_with(".schedule") || k.ends_with(".num_groups");
    it = kind ? sd.values.erase(it) : std::next(it);
  }
  return sd;
}

}  // namespace

TEST_CASE("LR schedules: a state of another schedule type or group count is refused (random)") {
  // First the pairs whose states used to load without a word (the target reads only entries the
  // state has: gamma; the first groups' rates), then random ones.
  struct Pair {
    int from, to;
    std::size_t n, m;
  };
  const Pair known[] = {{3, 5, 2, 2}, {4, 5, 2, 2}, {2, 2, 3, 2}, {6, 6, 2, 1}, {7, 7, 4, 3}};
  tk::PhiloxStream rng(0x5c4ed, 2);
  for (int trial = 0; trial < 60; ++trial) {
    const bool fixed = trial < static_cast<int>(std::size(known));
    const int from = fixed ? known[trial].from : static_cast<int>(rng.next_u32() % kScheduleKinds);
    const int to = fixed            ? known[trial].to
                   : trial % 4 == 0 ? from
                                    : static_cast<int>(rng.next_u32() % kScheduleKinds);
    const std::size_t n = fixed ? known[trial].n : 1 + rng.next_u32() % 4;
    const std::size_t m = fixed ? known[trial].m : trial % 3 == 0 ? n : 1 + rng.next_u32() % 4;
    CAPTURE(from);
    CAPTURE(to);
    CAPTURE(n);
    CAPTURE(m);
    optim::LrGroups a = random_groups(rng, n), b = random_groups(rng, m);
    auto saved = make_kind(from, a);
    const int steps = static_cast<int>(rng.next_u32() % 10);
    for (int t = 0; t < steps; ++t) saved->step();
    const tk::StateDict sd = saved->state_dict();
    CHECK(sd.get_string("schedule") == kind_name(from));
    CHECK(sd.get_int("num_groups") == static_cast<std::int64_t>(n));
    auto target = make_kind(to, b);
    const tk::StateDict before = target->state_dict();
    const std::vector<double> lr_before = b.lr;
    if (from == to && n == m) {
      // The same schedule over as many groups: it continues the saved one.
      target->load_state_dict(sd);
      b.lr = a.lr;
      for (int t = 0; t < 12; ++t) {
        saved->step();
        target->step();
        REQUIRE(a.lr == b.lr);
      }
      continue;
    }
    const std::string plural_n = n == 1 ? " group" : " groups";
    const std::string plural_m = m == 1 ? " group" : " groups";
    const std::string want = std::string("the state is from ") + kind_name(from) + " over " +
                             std::to_string(n) + plural_n + "; this schedule is " + kind_name(to) +
                             " over " + std::to_string(m) + plural_m;
    if (std::string(kind_name(from)) == kind_name(to) && n == m) {
      // Two SequentialLRs of other parts: the first part that differs refuses its state.
      CHECK_THROWS_WITH_AS(target->load_state_dict(sd), doctest::Contains("the state is from"),
                           tk::Error);
    } else {
      CHECK_THROWS_WITH_AS(target->load_state_dict(sd), doctest::Contains(want.c_str()), tk::Error);
    }
    CHECK(target->state_dict().values == before.values);  // nothing changed
    CHECK(b.lr == lr_before);
  }
}

TEST_CASE("LR schedules: states saved without the type and group count still load") {
  // Every type round-trips; the same state without "schedule" / "num_groups" (an older
  // checkpoint's) loads as before and continues alike.
  for (int k = 0; k < kScheduleKinds; ++k) {
    CAPTURE(k);
    optim::LrGroups a = two_groups(), b = two_groups(), c = two_groups();
    auto s = make_kind(k, a);
    for (int t = 0; t < 5; ++t) s->step();
    auto r = make_kind(k, b);
    auto old = make_kind(k, c);
    r->load_state_dict(s->state_dict());
    const tk::StateDict stripped = without_kind(s->state_dict());
    REQUIRE(!stripped.contains("schedule"));
    old->load_state_dict(stripped);
    b.lr = a.lr;
    c.lr = a.lr;
    for (int t = 0; t < 10; ++t) {
      s->step();
      r->step();
      old->step();
      REQUIRE(a.lr == b.lr);
      REQUIRE(a.lr == c.lr);
    }
    CHECK(r->state_dict().values == s->state_dict().values);
  }
  // A damaged type or group count is refused, escaped.
  optim::LrGroups g = two_groups();
  optim::StepLR step(g, {3, 0.5});
  tk::StateDict sd = step.state_dict();
  sd.set("schedule", "Step\nLR");
  CHECK_THROWS_WITH_AS(step.load_state_dict(sd), doctest::Contains("from Step\\x0aLR over 2"),
                       tk::Error);
  sd = step.state_dict();
  sd.set("num_groups", "two");
  CHECK_THROWS_WITH_AS(step.load_state_dict(sd), doctest::Contains("'num_groups' is 'two'"),
                       tk::Error);
  // A SequentialLR of another number of schedules.
  optim::LrGroups h = two_groups();
  auto two = optim::warmup_cosine(h, {.warmup_steps = 2, .total_steps = 10});
  std::vector<std::unique_ptr<optim::LRScheduler>> parts;
  parts.push_back(std::make_unique<optim::LinearLR>(h, optim::LinearLROptions{0.2, 1.0, 2}));
  parts.push_back(
      std::make_unique<optim::CosineAnnealingLR>(h, optim::CosineAnnealingLROptions{.t_max = 8}));
  parts.push_back(std::make_unique<optim::ConstantLR>(h, optim::ConstantLROptions{0.5, 3}));
  optim::SequentialLR three_parts(h, std::move(parts), {2, 10});
  CHECK(three_parts.state_dict().get_int("num_schedulers") == 3);
  CHECK_THROWS_WITH_AS(two->load_state_dict(three_parts.state_dict()),
                       doctest::Contains("from a SequentialLR of 3 schedules; this one has 2"),
                       tk::Error);
  CHECK_NOTHROW(two->load_state_dict(two->state_dict()));
  // A plateau's state and an epoch schedule's do not load into each other.
  optim::ReduceLROnPlateau plateau(g);
  CHECK_THROWS_WITH_AS(
      step.load_state_dict(plateau.state_dict()),
      doctest::Contains(
          "the state is from ReduceLROnPlateau over 2 groups; this schedule is StepLR"),
      tk::Error);
  CHECK_THROWS_WITH_AS(plateau.load_state_dict(step.state_dict()),
                       doctest::Contains("the state is from StepLR over 2 groups"), tk::Error);
  optim::LrGroups three = two_groups();
  three.lr.push_back(0.025);
  optim::ReduceLROnPlateau plateau3(three);
  CHECK_THROWS_WITH_AS(plateau3.load_state_dict(plateau.state_dict()),
                       doctest::Contains("over 2 groups; this schedule is ReduceLROnPlateau over "
                                         "3 groups"),
                       tk::Error);
}

TEST_CASE("ReduceLROnPlateau saves min_lrs and eps (PyTorch's names) and restores them (random)") {
  using Plateau = optim::ReduceLROnPlateauOptions;
  tk::PhiloxStream rng(0x91a7, 1);
  for (int trial = 0; trial < 20; ++trial) {
    CAPTURE(trial);
    const std::size_t n = 1 + rng.next_u32() % 4;
    Plateau o{.factor = 0.5, .patience = static_cast<std::int64_t>(rng.next_u32() % 3)};
    o.min_lr.clear();
    for (std::size_t g = 0; g < n; ++g) o.min_lr.push_back(1e-4 * (rng.next_u32() % 200));
    o.eps = (rng.next_u32() % 2) != 0 ? 0.0 : 1e-5 * (rng.next_u32() % 100);
    optim::LrGroups a = random_groups(rng, n);
    optim::ReduceLROnPlateau s(a, o);
    for (int t = 0; t < 6; ++t) s.step(static_cast<double>(rng.next_u32() % 4));
    const tk::StateDict sd = s.state_dict();
    for (std::size_t g = 0; g < n; ++g)
      CHECK(sd.get_double("min_lrs." + std::to_string(g)) == o.min_lr[g]);
    CHECK(sd.get_double("eps") == o.eps);
    // A plateau built with the defaults continues the saved one: its floor and eps included.
    optim::LrGroups b = random_groups(rng, n);
    optim::ReduceLROnPlateau r(b);
    r.load_state_dict(sd);
    CHECK(r.state_dict().values == sd.values);
    b.lr = a.lr;
    for (int t = 0; t < 40; ++t) {
      const double metric = static_cast<double>(rng.next_u32() % 5);
      s.step(metric);
      r.step(metric);
      REQUIRE(a.lr == b.lr);
    }

    // A state saved without them (older) keeps the constructor's values.
    tk::StateDict old = sd;
    for (std::size_t g = 0; g < n; ++g) old.values.erase("min_lrs." + std::to_string(g));
    old.values.erase("eps");
    optim::LrGroups c = random_groups(rng, n);
    optim::ReduceLROnPlateau kept(c, {.min_lr = {0.125}, .eps = 0.25});
    kept.load_state_dict(old);
    const tk::StateDict after = kept.state_dict();
    CHECK(after.get_double("eps") == 0.25);
    for (std::size_t g = 0; g < n; ++g)
      CHECK(after.get_double("min_lrs." + std::to_string(g)) == 0.125);
    CHECK(after.get_int("last_epoch") == 6);

    // Out of range: refused as the constructor refuses it, nothing changed.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    const std::string last = "min_lrs." + std::to_string(n - 1);
    for (const auto& entry : std::vector<std::pair<std::string, double>>{
             {last, nan}, {last, -0.5}, {last, inf}, {"eps", nan}, {"eps", -1e-3}, {"eps", inf}}) {
      const std::string& key = entry.first;
      CAPTURE(key);
      CAPTURE(entry.second);
      tk::StateDict bad = sd;
      bad.set(key, entry.second);
      const std::string what = key == "eps" ? "eps is" : "min_lr " + std::to_string(n - 1) + " is";
      const tk::StateDict before = kept.state_dict();
      CHECK_THROWS_WITH_AS(kept.load_state_dict(bad), doctest::Contains(what.c_str()), tk::Error);
      CHECK(kept.state_dict().values == before.values);
    }
    tk::StateDict missing = sd;  // one group's floor missing: damage, not an older state
    missing.values.erase(last);
    if (n > 1)
      CHECK_THROWS_WITH_AS(kept.load_state_dict(missing),
                           doctest::Contains(("missing value '" + last + "'").c_str()), tk::Error);
  }
  // The constructor refuses the same values.
  optim::LrGroups g = two_groups();
  CHECK_THROWS_WITH_AS(
      optim::ReduceLROnPlateau(g, {.min_lr = {0.1, std::numeric_limits<double>::quiet_NaN()}}),
      doctest::Contains("min_lr 1 is nan"), tk::Error);
  CHECK_THROWS_WITH_AS(optim::ReduceLROnPlateau(g, {.min_lr = {-1.0}}),
                       doctest::Contains("min_lr 0 is -1"), tk::Error);
  CHECK_THROWS_WITH_AS(optim::ReduceLROnPlateau(g, {.eps = -1e-9}), doctest::Contains("eps is"),
                       tk::Error);
}

TEST_CASE("ReduceLROnPlateau::load_state_dict shows a damaged mode escaped and bounded") {
  optim::LrGroups g = two_groups();
  optim::ReduceLROnPlateau s(g);
  const tk::StateDict good = s.state_dict();
  for (const char* key : {"mode", "threshold_mode"}) {
    for (const std::size_t extra : {std::size_t{3}, std::size_t{4000}}) {
      CAPTURE(key);
      CAPTURE(extra);
      tk::StateDict sd = good;
      sd.set(key, "m\n\x1b[2J" + std::string(extra, '\x7f'));
      std::string message;
      try {
        s.load_state_dict(sd);
      } catch (const tk::Error& e) {
        message = e.what();
      }
      CHECK(message.find(std::string(key) + " 'm\\x0a\\x1b[2J\\x7f") != std::string::npos);
      CHECK(std::none_of(message.begin(), message.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f;
      }));
      CHECK(message.size() < 1200);
    }
  }
  CHECK(s.last_epoch() == 0);  // nothing changed
}

TEST_CASE("LR schedules: a saved schedule name from a file is shown escaped and bounded") {
  optim::LrGroups g = two_groups();
  optim::StepLR s(g, {.step_size = 2});
  for (const std::size_t extra : {std::size_t{3}, std::size_t{5000}}) {
    CAPTURE(extra);
    tk::StateDict sd = s.state_dict();
    sd.set("schedule", "S\r\n\x1b" + std::string(extra, '\xff'));
    std::string message;
    try {
      s.load_state_dict(sd);
    } catch (const tk::Error& e) {
      message = e.what();
    }
    CHECK(message.find("the state is from S\\x0d\\x0a\\x1b\\xff") != std::string::npos);
    CHECK(message.size() < 1200);
  }
}
