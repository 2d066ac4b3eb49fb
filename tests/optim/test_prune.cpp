// SPDX-License-Identifier: MIT
// Tests of optim/prune.hpp and ckpt/pruned_model.hpp: masks against an independent sort-based
// reference (random shapes and targets, 0 and 1 included, ties, NaN, global and per tensor), the
// N:M pattern (exactly N kept of every M, the largest), masks that never grow under the gradual
// schedule, pruned weights that stay exactly zero through AdamW steps with weight decay, the
// schedule against the float64 formula, a train::Loop run cut in two ending bit for bit where one
// run does, damaged or mismatched mask state, and the export read back (and by Python's
// safetensors/numpy when $TRAINKIT_PYTHON is set).
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <trainkit/ckpt/pruned_model.hpp>
#include <trainkit/core/rng.hpp>
#include <trainkit/error.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/io/safetensors.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/lamb.hpp>
#include <trainkit/optim/lr_schedule.hpp>
#include <trainkit/optim/prune.hpp>
#include <trainkit/optim/sgd.hpp>
#include <trainkit/train/loop.hpp>

#include "support/temp_dir.hpp"

namespace {
namespace tk = trainkit;
namespace optim = trainkit::optim;
namespace fs = std::filesystem;
using Arena = tk::nn::ParamArena<>;

const tk::exec::Host& host() { return tk::exec::Host::default_instance(); }

/// The elements of parameter `name`.
std::vector<float> values(const Arena& a, const std::string& name) {
  const tk::nn::ParamInfo& p = a.info(a.at(name));
  return {a.params_data() + p.offset, a.params_data() + p.offset + p.numel};
}
void set_values(Arena& a, const std::string& name, const std::vector<float>& v) {
  const tk::nn::ParamInfo& p = a.info(a.at(name));
  std::copy(v.begin(), v.end(), a.params_data() + p.offset);
}
std::vector<std::uint8_t> mask_of(const optim::Pruner<>& pr, const std::string& name) {
  const tk::nn::ParamInfo& p = pr.arena().info(pr.arena().at(name));
  return {pr.host_mask() + p.offset, pr.host_mask() + p.offset + p.numel};
}

/// The reference order: by magnitude with NaN above everything, then by position.
bool prunes_before(float a, std::size_t ia, float b, std::size_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return nb;
  if (!na && std::fabs(a) != std::fabs(b)) return std::fabs(a) < std::fabs(b);
  return ia < ib;
}
/// Reference masks: the round(s * n) (ties to even) first in that order are 0.
std::vector<std::uint8_t> reference_mask(const std::vector<float>& w, double s) {
  std::vector<std::size_t> idx(w.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::sort(idx.begin(), idx.end(),
            [&](std::size_t a, std::size_t b) { return prunes_before(w[a], a, w[b], b); });
  const double k_exact = s * static_cast<double>(w.size());
  auto k = static_cast<std::size_t>(std::floor(k_exact));
  const double frac = k_exact - std::floor(k_exact);
  if (frac > 0.5 || (frac == 0.5 && k % 2 == 1)) ++k;  // half to even
  std::vector<std::uint8_t> m(w.size(), 1);
  for (std::size_t i = 0; i < k; ++i) m[idx[i]] = 0;
  return m;
}

/// An arena of random matrices (and a bias and a norm weight that must not be pruned).
struct RandomModel {
  Arena arena;
  std::vector<std::string> matrices;
  RandomModel(std::mt19937& gen, int count, bool with_ties = false) {
    std::uniform_int_distribution<int> dim(1, 9);
    for (int i = 0; i < count; ++i) {
      matrices.push_back("l" + std::to_string(i) + ".weight");
      arena.add(matrices.back(), tk::Shape{dim(gen), dim(gen)});
    }
    arena.add("l0.bias", tk::Shape{5});
    arena.add("ln.weight", tk::Shape{4});
    arena.finalize();
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> level(-3, 3);
    for (const tk::nn::ParamInfo& p : arena.infos())
      for (std::int64_t i = 0; i < p.numel; ++i)
        arena.params_data()[p.offset + i] = with_ties ? 0.25f * level(gen) : normal(gen);
  }
};

}  // namespace

TEST_CASE("Pruner: per-tensor and global masks equal a sort-based reference, 0 and 1 included") {
  std::mt19937 gen(11);
  for (int trial = 0; trial < 12; ++trial) {
    CAPTURE(trial);
    RandomModel m(gen, 1 + trial % 4, /*with_ties=*/trial % 3 == 0);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (const double s : {0.0, 1.0, 0.5, uniform(gen), uniform(gen)}) {
      CAPTURE(s);
      optim::Pruner<> per(m.arena);
      per.update(host(), s);
      std::int64_t expected_pruned = 0;
      for (const std::string& name : m.matrices) {
        const std::vector<std::uint8_t> ref = reference_mask(values(m.arena, name), s);
        CHECK(mask_of(per, name) == ref);
        expected_pruned += std::count(ref.begin(), ref.end(), std::uint8_t{0});
      }
      CHECK(per.num_pruned() == expected_pruned);
      CHECK(mask_of(per, "l0.bias") == std::vector<std::uint8_t>(5, 1));

      optim::Pruner<> global(m.arena, {.scope = optim::PruneScope::kGlobal});
      global.update(host(), s);
      std::vector<float> all;
      for (const std::string& name : m.matrices) {
        const std::vector<float> v = values(m.arena, name);
        all.insert(all.end(), v.begin(), v.end());
      }
      const std::vector<std::uint8_t> ref = reference_mask(all, s);
      std::vector<std::uint8_t> got;
      for (const std::string& name : m.matrices) {
        const std::vector<std::uint8_t> g = mask_of(global, name);
        got.insert(got.end(), g.begin(), g.end());
      }
      CHECK(got == ref);
      const optim::PruneReport r = global.report();
      CHECK(r.numel == std::int64_t(all.size()));
      CHECK(r.pruned == std::count(ref.begin(), ref.end(), std::uint8_t{0}));
      CHECK(r.model_numel == m.arena.num_parameters());
    }
  }
}

TEST_CASE("Pruner: ties by position, -0 and +0 alike, NaN pruned last and zeroed by apply") {
  Arena a;
  a.add("w.weight", tk::Shape{2, 4});
  a.finalize();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  set_values(a, "w.weight", {0.5f, -0.5f, nan, -0.0f, 0.0f, 0.5f, -inf, nan});
  optim::Pruner<> p(a);
  p.update(host(), 0.25);  // 2: the two zeros, -0 (earlier) first
  CHECK(mask_of(p, "w.weight") == std::vector<std::uint8_t>{1, 1, 1, 0, 0, 1, 1, 1});
  p.update(host(), 0.5);  // 4: then the first two of the three 0.5s
  CHECK(mask_of(p, "w.weight") == std::vector<std::uint8_t>{0, 0, 1, 0, 0, 1, 1, 1});
  p.update(host(), 0.75);  // 6: then the last 0.5 and -inf; the NaNs stay
  CHECK(mask_of(p, "w.weight") == std::vector<std::uint8_t>{0, 0, 1, 0, 0, 0, 0, 1});
  p.update(host(), 0.875);  // 7: the first NaN
  CHECK(mask_of(p, "w.weight") == std::vector<std::uint8_t>{0, 0, 0, 0, 0, 0, 0, 1});
  p.apply(host());
  const std::vector<float> w = values(a, "w.weight");
  for (int i = 0; i < 7; ++i) {
    CAPTURE(i);
    CHECK(w[i] == 0.0f);
    CHECK_FALSE(std::signbit(w[i]));  // +0 (a select, not PyTorch's product)
  }
  CHECK(std::isnan(w[7]));
  CHECK(p.num_pruned() == 7);
  CHECK(p.report().to_string() ==
        "  w.weight [2, 4]: 7 of 8 pruned (87.50%)\n"
        "  total: 87.50% of the pruned tensors, 87.50% of the model\n");
  // Rounding of the count: ties to even (0.3125 * 8 = 2.5 -> 2; 0.4375 * 8 = 3.5 -> 4).
  p.update(host(), 0.3125);
  CHECK(p.num_pruned() == 2);
  p.update(host(), 0.4375);
  CHECK(p.num_pruned() == 4);
}

TEST_CASE("Pruner: global pruning takes the small-magnitude tensor first; one-element and empty") {
  Arena a;
  a.add("small.weight", tk::Shape{3, 4});
  a.add("big.weight", tk::Shape{4, 4});
  a.add("one.weight", tk::Shape{1, 1});
  a.add("empty.weight", tk::Shape{0, 4});
  a.finalize();
  std::vector<float> small(12), big(16);
  for (int i = 0; i < 12; ++i) small[i] = 0.01f * float(i + 1);
  for (int i = 0; i < 16; ++i) big[i] = 1.0f + float(i);
  set_values(a, "small.weight", small);
  set_values(a, "big.weight", big);
  set_values(a, "one.weight", {0.5f});
  optim::Pruner<> g(a, {.scope = optim::PruneScope::kGlobal});
  g.update(host(), 13.0 / 29.0);  // 13 of 29: all of small, then one.weight (0.5)
  CHECK(mask_of(g, "small.weight") == std::vector<std::uint8_t>(12, 0));
  CHECK(mask_of(g, "one.weight") == std::vector<std::uint8_t>{0});
  CHECK(mask_of(g, "big.weight") == std::vector<std::uint8_t>(16, 1));
  optim::Pruner<> per(a);
  per.update(host(), 0.5);
  CHECK(mask_of(per, "one.weight") == std::vector<std::uint8_t>{1});  // round(0.5) = 0
  CHECK(per.num_pruned() == 6 + 8);
  per.update(host(), 1.0);
  CHECK(per.num_pruned() == 29);
  CHECK(per.sparsity() == 1.0);
}

TEST_CASE("Pruner: N:M keeps exactly the N largest of every M along the input dimension") {
  std::mt19937 gen(5);
  for (const std::pair<int, int>& nm :
       {std::pair{2, 4}, std::pair{1, 4}, std::pair{3, 8}, std::pair{1, 2}}) {
    const int n = nm.first, m = nm.second;  // (not a structured binding: CAPTURE is a lambda)
    CAPTURE(n);
    CAPTURE(m);
    Arena a;
    a.add("fc.weight", tk::Shape{6, 4 * m});
    a.add("fc.bias", tk::Shape{6});  // rank 1: not pruned, so its size need not divide
    a.finalize();
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<std::size_t>(24 * m));
    for (float& v : w) v = normal(gen);
    w[3] = w[1];  // a tie inside a group
    set_values(a, "fc.weight", w);
    optim::Pruner<> p(a, {.n = n, .m = m});
    CHECK(p.pattern() == std::to_string(n) + ":" + std::to_string(m));
    p.update(host(), p.max_sparsity());
    const std::vector<std::uint8_t> mask = mask_of(p, "fc.weight");
    for (std::size_t g = 0; g < w.size(); g += static_cast<std::size_t>(m)) {
      const std::vector<float> group(w.begin() + long(g), w.begin() + long(g) + m);
      std::vector<std::uint8_t> ref = reference_mask(group, double(m - n) / m);
      CHECK(std::vector<std::uint8_t>(mask.begin() + long(g), mask.begin() + long(g) + m) == ref);
      CHECK(std::count(mask.begin() + long(g), mask.begin() + long(g) + m, 1) == n);
    }
    CHECK(p.sparsity() == doctest::Approx(double(m - n) / m));
    CHECK_THROWS_WITH_AS(p.update(host(), p.max_sparsity() + 0.01),
                         doctest::Contains("is outside [0, "), tk::Error);
  }
  // Gradual N:M: at sparsity 0.25 one of every 4 goes, at 0.5 two (masks only shrink).
  Arena a;
  a.add("fc.weight", tk::Shape{2, 8});
  a.finalize();
  set_values(a, "fc.weight", {8, 7, 6, 5, 4, 3, 2, 1, -1, 2, -3, 4, 0.5f, 6, -7, 8});
  optim::Pruner<> p(a, {.n = 2, .m = 4});
  p.update(host(), 0.25, {.keep_pruned = true});
  CHECK(mask_of(p, "fc.weight") ==
        std::vector<std::uint8_t>{1, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1});
  p.update(host(), 0.5, {.keep_pruned = true});
  CHECK(mask_of(p, "fc.weight") ==
        std::vector<std::uint8_t>{1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1});
}

TEST_CASE("Pruner: construction errors name the tensor, the pattern or the schedule") {
  Arena a;
  a.add("fc1.weight", tk::Shape{4, 30});
  a.add("fc1.bias", tk::Shape{4});
  a.add("wte.weight", tk::Shape{10, 8});
  a.finalize();
  // Contains: a debug build appends the failed condition and the source location.
  CHECK_THROWS_WITH_AS((optim::Pruner<>(a, {.n = 2, .m = 4})),
                       doctest::Contains("trainkit: optim::Pruner: 'fc1.weight' has shape [4, 30]: "
                                         "its last (input) dimension 30 is not a multiple of M = "
                                         "4 for the 2:4 pattern (leave it out with "
                                         "PrunerOptions::exclude)"),
                       tk::Error);
  // The embedding is excluded by default; with the matrix left out nothing remains.
  CHECK_THROWS_WITH_AS((optim::Pruner<>(a, {.exclude = {"*emb*", "*wte*", "fc1.*"}})),
                       doctest::Contains("no parameter of the arena matches"), tk::Error);
  CHECK_THROWS_WITH_AS((optim::Pruner<>(a, {.n = 4, .m = 4})),
                       doctest::Contains("needs 1 <= N < M <= 256"), tk::Error);
  CHECK_THROWS_WITH_AS((optim::Pruner<>(a, {.exclude = {"*wte*"}, .n = 1, .m = 512})),
                       doctest::Contains("the N:M pattern 1:512 needs 1 <= N < M <= 256"),
                       tk::Error);
  optim::Pruner<> def(a);
  REQUIRE(def.targets().size() == 1);
  CHECK(a.info(def.targets()[0]).name == "fc1.weight");
  optim::Pruner<> with_emb(a, {.exclude = {}});
  CHECK(with_emb.targets().size() == 2);
  optim::Pruner<> by_name(a, {.include = {"*.bias"}});
  REQUIRE(by_name.targets().size() == 1);
  CHECK(a.info(by_name.targets()[0]).name == "fc1.bias");
  CHECK_THROWS_WITH_AS(def.update(host(), 1.5), doctest::Contains("target 1.5 is outside [0, 1]"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(def.update(host(), std::nan("")), doctest::Contains("is outside"),
                       tk::Error);
  Arena b;
  b.add("fc.weight", tk::Shape{2, 8});
  b.finalize();
  CHECK_THROWS_WITH_AS(
      (optim::Pruner<>(b, {.n = 2, .m = 4}, optim::SparsitySchedule::gradual(0.9, 0, 10, 2))),
      doctest::Contains("trainkit: optim::Pruner: the schedule's sparsity 0.9 is above 0.5, the "
                        "most a 2:4 pattern prunes"),
      tk::Error);
  CHECK_THROWS_WITH_AS((optim::Pruner<>(b, {}, {.final_sparsity = 1.5})),
                       doctest::Contains("sparsities must be in [0, 1]"), tk::Error);
  CHECK_THROWS_WITH_AS((optim::Pruner<>(b, {}, {.every = 0})), doctest::Contains("every >= 1"),
                       tk::Error);
  Arena unfinished;
  unfinished.add("x.weight", tk::Shape{2, 2});
  CHECK_THROWS_WITH_AS(optim::Pruner<>{unfinished}, doctest::Contains("not finalized"), tk::Error);
}

TEST_CASE("SparsitySchedule: Zhu & Gupta's cubic values against the float64 formula") {
  std::mt19937 gen(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const double si = trial % 2 == 0 ? 0.0 : 0.3 * u(gen), sf = si + (1.0 - si) * u(gen);
    const std::int64_t t0 = trial % 7, dt = 1 + trial % 5, n = 1 + trial % 9;
    const optim::SparsitySchedule s{si, sf, t0, dt, n};
    CHECK(s.end_step() == t0 + n * dt);
    double last = 0.0;
    for (std::int64_t t = 0; t <= t0 + n * dt + 2 * dt; ++t) {
      CAPTURE(t);
      const bool grid = t >= t0 && (t - t0) % dt == 0 && t <= t0 + n * dt;
      CHECK(s.updates_at(t) == grid);
      double expected;
      if (t < t0) {
        expected = 0.0;
      } else {
        const std::int64_t u_step = std::min(t0 + n * dt, t0 + (t - t0) / dt * dt);
        expected = sf + (si - sf) * std::pow(1.0 - double(u_step - t0) / double(n * dt), 3.0);
      }
      CHECK(std::fabs(s.at(t) - expected) <= 1e-15);
      if (grid) last = s.at(t);
      if (t >= t0) CHECK(s.at(t) == last);  // held between updates
      if (t == t0) CHECK(s.at(t) == si);
      if (t >= t0 + n * dt) CHECK(s.at(t) == sf);
    }
  }
  const optim::SparsitySchedule once = optim::SparsitySchedule::one_shot(5, 0.7);
  CHECK(once.at(4) == 0.0);
  CHECK(once.at(5) == 0.7);
  CHECK(once.at(500) == 0.7);
  CHECK(once.updates_at(5));
  CHECK_FALSE(once.updates_at(6));
  CHECK_FALSE(once.updates_at(4));
  const optim::SparsitySchedule g = optim::SparsitySchedule::gradual(0.9, 10, 31, 5);
  CHECK(g.num_updates == 4);  // updates at 10, 15, 20, 25, 30
  CHECK(g.end_step() == 30);
  CHECK_THROWS_AS(optim::SparsitySchedule::gradual(0.9, 10, 5, 1), tk::Error);
}

TEST_CASE("Pruner::step: masks only shrink and follow the schedule while the weights move") {
  std::mt19937 gen(17);
  RandomModel m(gen, 3);
  const optim::SparsitySchedule schedule = optim::SparsitySchedule::gradual(0.85, 3, 40, 4, 0.1);
  for (const bool global : {false, true}) {
    CAPTURE(global);
    optim::Pruner<> p(
        m.arena, {.scope = global ? optim::PruneScope::kGlobal : optim::PruneScope::kPerTensor},
        schedule);
    std::vector<std::uint8_t> before(p.host_mask(), p.host_mask() + m.arena.buffer_numel());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::int64_t t = 1; t <= 45; ++t) {
      CAPTURE(t);
      // Training moves every weight, the pruned ones included (apply() puts those back to 0).
      for (std::int64_t i = 0; i < m.arena.buffer_numel(); ++i)
        m.arena.params_data()[i] += 0.5f * normal(gen);
      CHECK(p.step(host(), t) == schedule.updates_at(t));
      const std::uint8_t* now = p.host_mask();
      for (std::int64_t i = 0; i < m.arena.buffer_numel(); ++i) {
        if (before[std::size_t(i)] == 0) REQUIRE(now[i] == 0);
        if (now[i] == 0) REQUIRE(m.arena.params_data()[i] == 0.0f);
      }
      before.assign(now, now + m.arena.buffer_numel());
      // The targets rise, so each update prunes exactly round(s * n) (per tensor or overall).
      const double s = schedule.at(t);
      if (global) {
        CHECK(p.num_pruned() == optim::detail::prune_count(s, p.report().numel));
      } else {
        for (const optim::PruneReport::Entry& e : p.report().tensors)
          CHECK(e.pruned == optim::detail::prune_count(s, e.numel));
      }
    }
    CHECK(p.target() == schedule.final_sparsity);
  }
}

namespace {

/// 60 steps of random gradients through `opt`, pruning to 60% (one shot) after step 10; checks
/// the pruned weights and moments are exactly zero from then on and every kept weight trained.
/// mask_grads: the gradients are masked and step() applies only at the update; otherwise the
/// pruned entries get gradients every step and step() applies after each.
template <class Opt>
void train_pruned(RandomModel& m, Opt& opt, bool mask_grads, std::mt19937& gen) {
  optim::Pruner<> p(m.arena, {.apply_every_step = !mask_grads},
                    optim::SparsitySchedule::one_shot(10, 0.6));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<float> start(m.arena.params_data(),
                                 m.arena.params_data() + m.arena.buffer_numel());
  for (int t = 1; t <= 60; ++t) {
    m.arena.zero_grad();
    for (const tk::nn::ParamInfo& info : m.arena.infos())
      for (std::int64_t i = 0; i < info.numel; ++i)
        m.arena.grads_data()[info.offset + i] = normal(gen);
    if (mask_grads) p.mask_gradients(host());
    opt.step(host());
    CHECK(p.step(host(), t) == (t == 10));
    if (t < 10) continue;
    for (std::int64_t i = 0; i < m.arena.buffer_numel(); ++i)
      if (p.host_mask()[i] == 0) {
        REQUIRE(m.arena.params_data()[i] == 0.0f);
        for (const std::string& state : m.arena.state_names())
          REQUIRE(m.arena.state(state).data()[i] == 0.0f);
      }
  }
  std::int64_t kept = 0, moved = 0;
  for (const tk::nn::ParamInfo& info : m.arena.infos())
    for (std::int64_t i = info.offset; i < info.offset + info.numel; ++i) {
      kept += p.host_mask()[i];
      moved += p.host_mask()[i] == 1 && m.arena.params_data()[i] != start[std::size_t(i)];
    }
  CHECK(kept == m.arena.num_parameters() - p.num_pruned());
  CHECK(p.num_pruned() > 0);
  CHECK(moved == kept);
}

}  // namespace

TEST_CASE("Pruner: pruned weights stay exactly zero through SGD, AdamW and LAMB steps") {
  std::mt19937 gen(23);
  for (const bool mask_grads : {false, true}) {
    CAPTURE(mask_grads);
    {
      RandomModel m(gen, 3);
      tk::optim::AdamW<> opt(m.arena, {.lr = 1e-2, .weight_decay = 0.1});
      train_pruned(m, opt, mask_grads, gen);
    }
    {
      RandomModel m(gen, 3);
      tk::optim::SGD<> opt(m.arena, {.lr = 1e-2, .momentum = 0.9, .weight_decay = 0.1});
      train_pruned(m, opt, mask_grads, gen);
    }
    {
      RandomModel m(gen, 3);
      tk::optim::LAMB<> opt(m.arena, {.lr = 1e-2, .weight_decay = 0.1});
      train_pruned(m, opt, mask_grads, gen);
    }
  }
}

namespace {

/// A two-layer linear regression on inputs drawn from Philox by step (no state of its own).
struct Regression {
  Arena* arena = nullptr;
  optim::Pruner<>* pruner = nullptr;
  float step(tk::train::StepContext& ctx) {
    const tk::nn::ParamInfo& w1 = arena->info(arena->at("fc1.weight"));
    const tk::nn::ParamInfo& w2 = arena->info(arena->at("fc2.weight"));
    float* p = arena->params_data();
    float* g = arena->grads_data();
    tk::PhiloxStream rng(9, static_cast<std::uint64_t>(ctx.step));
    float x[8], h[8], y[2];
    for (float& v : x) v = rng.next_normal();
    for (int o = 0; o < 8; ++o) {
      h[o] = 0.0f;
      for (int i = 0; i < 8; ++i) h[o] += p[w1.offset + o * 8 + i] * x[i];
    }
    float loss = 0.0f, dy[2], dh[8] = {};
    for (int o = 0; o < 2; ++o) {
      y[o] = 0.0f;
      for (int i = 0; i < 8; ++i) y[o] += p[w2.offset + o * 8 + i] * h[i];
      const float target = o == 0 ? x[0] - x[3] : 0.5f * x[5];
      dy[o] = y[o] - target;
      loss += 0.5f * dy[o] * dy[o];
      for (int i = 0; i < 8; ++i) {
        g[w2.offset + o * 8 + i] += dy[o] * h[i];
        dh[i] += dy[o] * p[w2.offset + o * 8 + i];
      }
    }
    for (int o = 0; o < 8; ++o)
      for (int i = 0; i < 8; ++i) g[w1.offset + o * 8 + i] += dh[o] * x[i];
    pruner->mask_gradients(host());
    return loss;
  }
  void on_optimizer_step(std::int64_t n) { pruner->step(host(), n); }
};

struct RunOut {
  std::vector<float> params;
  std::vector<std::uint8_t> masks;
};

RunOut regression_run(const fs::path& dir, std::int64_t steps, double final_sparsity = 0.8) {
  tk::train::Loop loop(
      {.steps = steps, .dir = dir, .ckpt_every = 5, .monitor = {.console = nullptr}});
  Arena arena;
  arena.add("fc1.weight", tk::Shape{8, 8}, tk::nn::Init::normal(0.0f, 0.4f));
  arena.add("fc1.bias", tk::Shape{8}, tk::nn::Init::normal(0.0f, 1.0f));
  arena.add("fc2.weight", tk::Shape{2, 8}, tk::nn::Init::normal(0.0f, 0.4f));
  arena.finalize();
  arena.initialize(4);
  tk::optim::AdamW<> opt(arena, {.lr = 0.02, .weight_decay = 0.05});
  optim::Pruner<> pruner(arena, {.scope = optim::PruneScope::kGlobal},
                         optim::SparsitySchedule::gradual(final_sparsity, 2, 14, 3));
  loop.state().add("pruner", pruner);
  Regression task{&arena, &pruner};
  loop.run(host(), arena, opt, task);
  return {std::vector<float>(arena.params_data(), arena.params_data() + arena.buffer_numel()),
          std::vector<std::uint8_t>(pruner.host_mask(), pruner.host_mask() + arena.buffer_numel())};
}

}  // namespace

TEST_CASE("Pruner in train::Loop: a run cut in two ends bit for bit where one run does") {
  const trainkit_test::TempDir whole_dir;
  const RunOut whole = regression_run(whole_dir.path(), 20);
  CHECK(std::count(whole.masks.begin(), whole.masks.end(), std::uint8_t{0}) ==
        optim::detail::prune_count(0.8, 64 + 16));
  for (const std::int64_t cut : {1, 5, 7, 8, 14, 17}) {
    CAPTURE(cut);
    const trainkit_test::TempDir tmp;
    regression_run(tmp.path(), cut);
    const RunOut resumed = regression_run(tmp.path(), 20);
    CHECK(resumed.masks == whole.masks);
    CHECK(std::memcmp(resumed.params.data(), whole.params.data(),
                      whole.params.size() * sizeof(float)) == 0);
  }
  // A resume with another schedule is refused, naming the setting.
  const trainkit_test::TempDir tmp;
  regression_run(tmp.path(), 6);
  CHECK_THROWS_WITH_AS(regression_run(tmp.path(), 20, 0.7),
                       doctest::Contains("schedule.final_sparsity = 0.8 but this one has "
                                         "schedule.final_sparsity = 0.7"),
                       tk::Error);
}

TEST_CASE("Pruner::load_state_dict: mismatched or damaged masks are refused, nothing changed") {
  Arena a;
  a.add("fc1.weight", tk::Shape{3, 4});
  a.add("fc2.weight", tk::Shape{2, 3});
  a.finalize();
  std::mt19937 gen(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < a.buffer_numel(); ++i) a.params_data()[i] = normal(gen);
  optim::Pruner<> src(a);
  src.update(host(), 0.5);
  const tk::StateDict good = src.state_dict();
  CHECK(good.tensors.count("fc1.weight_mask") == 1);
  CHECK(good.get_string("pattern") == "unstructured");
  CHECK(good.get_string("targets") == "fc1.weight,fc2.weight");

  optim::Pruner<> dst(a);
  dst.load_state_dict(good);
  CHECK(mask_of(dst, "fc1.weight") == mask_of(src, "fc1.weight"));
  CHECK(dst.num_pruned() == src.num_pruned());
  CHECK(dst.target() == 0.5);

  const auto refused = [&](tk::StateDict sd, const std::string& message) {
    CAPTURE(message);
    optim::Pruner<> fresh(a);
    CHECK_THROWS_WITH_AS(fresh.load_state_dict(sd), doctest::Contains(message.c_str()), tk::Error);
    CHECK(fresh.num_pruned() == 0);
    CHECK(mask_of(fresh, "fc1.weight") == std::vector<std::uint8_t>(12, 1));
  };
  {
    tk::StateDict sd = good;
    reinterpret_cast<std::uint8_t*>(sd.tensors.at("fc2.weight_mask").data())[4] = 7;
    refused(std::move(sd), "mask 'fc2.weight_mask' holds 7 at element 4; a mask holds 0");
  }
  {
    tk::StateDict sd = good;
    sd.tensors.at("fc1.weight_mask") = tk::AnyTensor(tk::DType::kU8, tk::Shape{4, 3});
    refused(std::move(sd), "mask 'fc1.weight_mask' is U8 [4, 3], expected U8 [3, 4]");
  }
  {
    tk::StateDict sd = good;
    sd.tensors.at("fc1.weight_mask") = tk::AnyTensor(tk::DType::kF32, tk::Shape{3, 4});
    refused(std::move(sd), "is F32 [3, 4], expected U8 [3, 4]");
  }
  {
    tk::StateDict sd = good;
    sd.tensors.erase("fc2.weight_mask");
    refused(std::move(sd), "the state has no mask 'fc2.weight_mask'");
  }
  {
    tk::StateDict sd = good;
    sd.tensors.emplace("fc3.weight_mask", tk::AnyTensor(tk::DType::kU8, tk::Shape{1}));
    refused(std::move(sd), "holds 'fc3.weight_mask', which is not the mask of a parameter");
  }
  {
    tk::StateDict sd = good;
    sd.set("pattern", "2:4");
    refused(std::move(sd),
            "saved with the pattern = 2:4 but this one has the pattern = "
            "unstructured");
  }
  {
    tk::StateDict sd = good;
    sd.set("targets", "fc1.weight");
    refused(std::move(sd), "the pruned parameters = fc1.weight but this one has");
  }
  {
    tk::StateDict sd = good;
    sd.set("scope", "global");
    refused(std::move(sd), "the scope = global");
  }
  {
    tk::StateDict sd = good;
    sd.values.erase("last_update_step");
    refused(std::move(sd), "missing value 'last_update_step'");
  }
}

namespace {

const char* python() {
  const char* p = std::getenv("TRAINKIT_PYTHON");
  return p != nullptr && *p != '\0' ? p : nullptr;
}

}  // namespace

TEST_CASE("Export: dense weights with zeros where pruned and <param>_mask masks, read back") {
  Arena a;
  a.add("fc1.weight", tk::Shape{4, 8}, tk::nn::Init::normal(0.0f, 1.0f));
  a.add("fc1.bias", tk::Shape{4}, tk::nn::Init::normal(0.0f, 1.0f));
  a.add("fc2.weight", tk::Shape{3, 4}, tk::nn::Init::normal(0.0f, 1.0f));
  a.finalize();
  a.initialize(8);
  optim::Pruner<> p(a, {.n = 2, .m = 4});
  p.update(host(), 0.5);  // masks only: the arena's weights are not zeroed before the export
  const std::vector<float> arena_before(a.params_data(), a.params_data() + a.buffer_numel());
  const trainkit_test::TempDir tmp;
  tk::ckpt::save_pruned_model(tmp / "pruned.safetensors", p);
  tk::ckpt::save_pruning_masks(tmp / "masks.safetensors", p);
  CHECK(std::memcmp(arena_before.data(), a.params_data(), arena_before.size() * 4) == 0);

  const auto weights = tk::io::load_safetensors(tmp / "pruned.safetensors");
  const auto masks = tk::io::load_safetensors(tmp / "masks.safetensors");
  CHECK(weights.size() == 3);
  CHECK(masks.size() == 2);
  for (const std::string name : {"fc1.weight", "fc1.bias", "fc2.weight"}) {
    CAPTURE(name);
    const tk::AnyTensor& w = weights.at(name);
    REQUIRE(w.dtype() == tk::DType::kF32);
    CHECK(w.shape() == a.info(a.at(name)).shape);
    const std::vector<float> v = values(a, name);
    const auto* got = reinterpret_cast<const float*>(w.data());
    const bool pruned = name != "fc1.bias";
    std::vector<std::uint8_t> m(v.size(), 1);
    if (pruned) {
      const tk::AnyTensor& mt = masks.at(name + "_mask");
      REQUIRE(mt.dtype() == tk::DType::kF32);
      CHECK(mt.shape() == w.shape());
      m = mask_of(p, name);
      const auto* mf = reinterpret_cast<const float*>(mt.data());
      for (std::size_t i = 0; i < v.size(); ++i) CHECK(mf[i] == (m[i] ? 1.0f : 0.0f));
    }
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(got[i] == (m[i] ? v[i] : 0.0f));
  }
  const tk::io::SafetensorsFile file(tmp / "masks.safetensors");
  CHECK(file.metadata().at("pattern") == "2:4");
  CHECK(file.metadata().at("sparsity") == "0.5");

  // Python reads both files (safetensors.numpy) when $TRAINKIT_PYTHON is set.
  const char* py = python();
  if (py == nullptr) return;
  std::ofstream(tmp / "check.py") << R"(import sys
try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError:
    sys.exit(77)
w = load_file(sys.argv[1] + "/pruned.safetensors")
m = load_file(sys.argv[1] + "/masks.safetensors")
assert sorted(w) == ["fc1.bias", "fc1.weight", "fc2.weight"], sorted(w)
assert sorted(m) == ["fc1.weight_mask", "fc2.weight_mask"], sorted(m)
for k, mask in m.items():
    p = w[k[:-len("_mask")]]
    assert mask.dtype == np.float32 and mask.shape == p.shape
    assert set(np.unique(mask)) <= {0.0, 1.0}
    assert (p[mask == 0] == 0).all() and (p[mask == 1] != 0).all()
    groups = mask.reshape(-1, 4).sum(axis=1)
    assert (groups == 2).all(), groups
print("python ok")
)";
  const std::string cmd = std::string("'") + py + "' '" + (tmp / "check.py").string() + "' '" +
                          tmp.path().string() + "'";
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const char* required = std::getenv("TRAINKIT_REQUIRE_PYTHON_INTEROP");
  if (rc == 77 && !(required != nullptr && std::string(required) == "1")) {
    MESSAGE("numpy/safetensors not importable by $TRAINKIT_PYTHON: Python check skipped");
    return;
  }
  CHECK(rc == 0);
}

TEST_CASE("Pruner: keep_pruned keeps every pruned element when the target falls") {
  for (const optim::PruneScope scope :
       {optim::PruneScope::kPerTensor, optim::PruneScope::kGlobal}) {
    CAPTURE(int(scope));
    Arena a;
    a.add("w", tk::Shape{4, 4});
    a.finalize();
    for (int i = 0; i < 16; ++i) a.params_data()[i] = float(i + 1);
    optim::Pruner<> p(a, {.scope = scope});
    p.update(host(), 0.5);
    REQUIRE(p.num_pruned() == 8);
    const std::vector<std::uint8_t> before(p.host_mask(), p.host_mask() + 16);
    p.update(host(), 0.25, {.keep_pruned = true});
    CHECK(p.num_pruned() == 8);
    CHECK(std::equal(before.begin(), before.end(), p.host_mask()));
    p.update(host(), 0.25);  // recomputed from scratch: the lower target
    CHECK(p.num_pruned() == 4);
  }
  // Through a falling schedule (0.8 down to 0.2): the masks never grow back.
  Arena b;
  b.add("w", tk::Shape{4, 4});
  b.finalize();
  for (int i = 0; i < 16; ++i) b.params_data()[i] = float(i + 1);
  optim::Pruner<> q(b, {}, optim::SparsitySchedule::gradual(0.2, 0, 4, 2, 0.8));
  std::int64_t pruned = 0;
  for (int t = 0; t <= 4; ++t) {
    q.step(host(), t);
    CHECK(q.num_pruned() >= pruned);
    pruned = q.num_pruned();
  }
  CHECK(pruned == 13);
}

TEST_CASE("Pruner::load_state_dict refuses a bad target, last_update_step or N:M mask") {
  Arena a;
  a.add("w", tk::Shape{4, 8});
  a.finalize();
  for (int i = 0; i < 32; ++i) a.params_data()[i] = float(i + 1);
  optim::Pruner<> p(a, {.n = 2, .m = 4});
  p.update(host(), 0.5);
  const tk::StateDict good = p.state_dict();
  const std::vector<std::uint8_t> before(p.host_mask(), p.host_mask() + 32);
  const auto refused = [&](const tk::StateDict& sd, const char* message) {
    CHECK_THROWS_WITH_AS(p.load_state_dict(sd), doctest::Contains(message), tk::Error);
    CHECK(std::equal(before.begin(), before.end(), p.host_mask()));
    CHECK(p.target() == 0.5);
  };
  for (const double bad : {std::numeric_limits<double>::quiet_NaN(), -0.1, 0.75, 1.0}) {
    CAPTURE(bad);
    tk::StateDict sd = good;
    sd.set("target", bad);
    refused(sd, "'target' is");
  }
  tk::StateDict sd = good;
  sd.set("last_update_step", std::int64_t{-2});
  refused(sd, "'last_update_step' is -2");
  sd = good;
  tk::AnyTensor& t = sd.tensors.at("w_mask");
  t.data()[6] = std::byte{0};  // the second group of 4 (4 and 5 pruned) now prunes 3
  refused(sd, "prunes 3 of the 4 elements from element 4");
  std::memset(t.data(), 0, t.bytes());
  refused(sd, "prunes at most 2 of every 4");
  p.load_state_dict(good);
  CHECK(p.sparsity() == 0.5);
}

TEST_CASE("Pruner::load_state_dict shows an unknown key from the file escaped and bounded") {
  Arena a;
  a.add("w", tk::Shape{2, 4});
  a.finalize();
  optim::Pruner<> p(a);
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 20; ++trial) {
    // A key of random bytes (control characters, a newline, bytes above 0x7f), sometimes long.
    std::string key = "x\n\x1b[31m";
    const int extra = trial % 2 == 0 ? 10 : 5000;
    for (int i = 0; i < extra; ++i) key += static_cast<char>(byte(gen));
    tk::StateDict sd = p.state_dict();
    sd.tensors.emplace(key, tk::AnyTensor(tk::DType::kU8, tk::Shape{1}));
    std::string message;
    try {
      p.load_state_dict(sd);
    } catch (const tk::Error& e) {
      message = e.what();
    }
    CAPTURE(message.size());
    CHECK(message.find("which is not the mask of a parameter this pruner prunes") !=
          std::string::npos);
    CHECK(message.find("x\\x0a\\x1b[31m") != std::string::npos);
    CHECK(std::none_of(message.begin(), message.end(), [](char c) {
      return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f;
    }));
    CHECK(message.size() < 1200);
  }
}

TEST_CASE(
    "SparsitySchedule: a negative begin or a last update beyond 2^63 - 1 is refused (random)") {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  // end - begin used to overflow for a negative begin (undefined behaviour).
  CHECK_THROWS_WITH_AS(optim::SparsitySchedule::gradual(0.5, -1, kMax, 1),
                       doctest::Contains("0 <= begin <= end, got begin -1"), tk::Error);
  CHECK_THROWS_AS(
      optim::SparsitySchedule::gradual(0.5, std::numeric_limits<std::int64_t>::min(), kMax, 3),
      tk::Error);
  const optim::SparsitySchedule whole = optim::SparsitySchedule::gradual(0.5, 0, kMax, 1);
  CHECK_NOTHROW(whole.validate());
  CHECK(whole.end_step() == kMax);
  // begin_step + num_updates * every must fit in 64 bits (end_step() computes it).
  std::mt19937_64 gen(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::int64_t begin = static_cast<std::int64_t>(gen() >> (1 + gen() % 63));
    const std::int64_t every = 1 + static_cast<std::int64_t>(gen() >> (1 + gen() % 63)) % kMax;
    const std::int64_t limit = (kMax - begin) / every;  // the largest n that fits
    std::int64_t n = 0;  // limit - 2 .. limit + 2, where that is an int64
    if (__builtin_add_overflow(limit, static_cast<std::int64_t>(gen() % 5) - 2, &n) || n < 0)
      continue;
    CAPTURE(begin);
    CAPTURE(every);
    CAPTURE(n);
    const optim::SparsitySchedule s{0.0, 0.5, begin, every, n};
    std::int64_t product = 0, end = 0;
    const bool fits = !__builtin_mul_overflow(n, every, &product) &&
                      !__builtin_add_overflow(begin, product, &end);
    if (fits) {
      CHECK_NOTHROW(s.validate());
      CHECK(s.end_step() == begin + n * every);
    } else {
      CHECK_THROWS_WITH_AS(s.validate(), doctest::Contains("is beyond step 2^63 - 1"), tk::Error);
    }
  }
}
