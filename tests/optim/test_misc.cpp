// Tests for the smaller optim/ pieces: glob patterns and group assignment, StateDict (exact
// number round trips, prefixes, deep copies), the state-field plumbing (unsigned 64-bit values,
// optional fields), Ema against a float64 lerp (and its state_dict), GradAccumulation (N
// micro-batches of loss / N give the full-batch step), and the optimizers' LrGroups being what
// schedules drive; the host squared-norm fold (AVX2) against exec::reduce;
// the optimizers' host vector bodies against their scalar update.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <trainkit/exec/host.hpp>
#include <trainkit/exec/reduce.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/ema.hpp>
#include <trainkit/optim/grad_accumulation.hpp>
#include <trainkit/optim/grad_norm.hpp>
#include <trainkit/optim/lr_schedule.hpp>
#include <trainkit/optim/param_groups.hpp>
#include <trainkit/optim/sgd.hpp>
#include <trainkit/core/state_dict.hpp>

namespace {
namespace tk = trainkit;
namespace optim = trainkit::optim;
using Arena = tk::nn::ParamArena<tk::Space::kHost>;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}
}  // namespace

TEST_CASE("glob_match and assign_groups") {
  CHECK(optim::glob_match("*.bias", "blocks.0.attn.bias"));
  CHECK_FALSE(optim::glob_match("*.bias", "blocks.0.attn.bias_x"));
  CHECK(optim::glob_match("*ln*", "blocks.3.ln_1.weight"));
  CHECK_FALSE(optim::glob_match("*ln*", "layer.weight"));
  CHECK(optim::glob_match("blocks.?.mlp.*", "blocks.7.mlp.c_fc.weight"));
  CHECK_FALSE(optim::glob_match("blocks.?.mlp.*", "blocks.11.mlp.c_fc.weight"));
  CHECK(optim::glob_match("*", ""));
  CHECK(optim::glob_match("a*b*c", "aXbYbZc"));
  CHECK_FALSE(optim::glob_match("a*b*c", "aXbYbZ"));
  CHECK(optim::glob_match("exact", "exact"));
  const std::vector<std::string> names = {"wte.weight", "h.0.ln_1.weight", "h.0.attn.bias",
                                          "h.0.attn.weight", "lm_head.weight"};
  const std::vector<int> g = optim::assign_groups(
      names, {optim::no_weight_decay({"*.bias", "*ln*"}), {{"lm_head.*"}, 1e-4, std::nullopt}});
  CHECK(g == std::vector<int>{0, 1, 1, 0, 2});
}

TEST_CASE("StateDict: numbers round-trip exactly, prefixes compose, copies are deep") {
  tk::StateDict sd;
  sd.set("a", 0.1);
  sd.set("b", std::numeric_limits<double>::infinity());
  sd.set("c", std::int64_t{-42});
  sd.set("d", "min");
  sd.set("e", 1.0 / 3.0);
  CHECK(sd.get_double("a") == 0.1);
  CHECK(sd.get_double("b") == std::numeric_limits<double>::infinity());
  CHECK(sd.get_int("c") == -42);
  CHECK(sd.get_string("d") == "min");
  CHECK(sd.get_double("e") == 1.0 / 3.0);
  CHECK_THROWS_AS(sd.get_int("d"), tk::Error);
  CHECK_THROWS_AS(sd.get_double("missing"), tk::Error);
  tk::AnyTensor t(tk::DType::kF32, tk::Shape{2});
  const float v[2] = {1.5f, -2.0f};
  std::memcpy(t.data(), v, sizeof v);
  sd.tensors["w"] = std::move(t);
  tk::StateDict outer;
  outer.merge("inner", sd);
  CHECK(outer.get_double("inner.a") == 0.1);
  const tk::StateDict back = outer.sub("inner");
  CHECK(back.values == sd.values);
  const tk::StateDict copy = back;
  CHECK(copy.tensor("w").data() != back.tensor("w").data());
  CHECK(copy.tensor("w").as<float, 1>()(1) == -2.0f);
}

namespace {
struct Fields {
  double rate = 0.0;
  std::int64_t count = 0;
  bool flag = false;
  std::uint64_t key = 0;
  std::uint32_t small = 0;
  std::uint64_t added = 0;  // saved optionally: older states lack it
};
constexpr auto kFields = std::tuple{optim::detail::state_field("rate", &Fields::rate),
                                    optim::detail::state_field("count", &Fields::count),
                                    optim::detail::state_field("flag", &Fields::flag),
                                    optim::detail::state_field("key", &Fields::key),
                                    optim::detail::state_field("small", &Fields::small),
                                    optim::detail::optional_state_field("added", &Fields::added)};
}  // namespace

TEST_CASE("optim state fields: unsigned 64-bit values round-trip, optional ones may be missing") {
  std::mt19937_64 rng(20261207);
  for (int trial = 0; trial < 50; ++trial) {
    Fields in{0.1 * trial, -trial, trial % 2 == 0, rng(), static_cast<std::uint32_t>(rng()), rng()};
    if (trial == 0) in.key = std::numeric_limits<std::uint64_t>::max();
    if (trial == 1) in.key = std::uint64_t{1} << 63;  // INT64_MAX + 1
    tk::StateDict sd;
    optim::detail::save_fields(sd, in, kFields);
    CHECK(sd.get_string("key") == std::to_string(in.key));
    Fields out{};
    optim::detail::load_fields(sd, out, kFields);
    CHECK(out.rate == in.rate);
    CHECK(out.count == in.count);
    CHECK(out.flag == in.flag);
    CHECK(out.key == in.key);
    CHECK(out.small == in.small);
    CHECK(out.added == in.added);
    // Without the optional key the member keeps its value; without another key: refused.
    sd.values.erase("added");
    Fields kept{};
    kept.added = 5;
    optim::detail::load_fields(sd, kept, kFields);
    CHECK(kept.added == 5);
    CHECK(kept.key == in.key);
    sd.values.erase("key");
    CHECK_THROWS_WITH_AS(optim::detail::load_fields(sd, kept, kFields),
                         doctest::Contains("missing value 'key'"), tk::Error);
  }
  tk::StateDict sd;
  optim::detail::save_fields(sd, Fields{}, kFields);
  sd.set_u64("small", std::uint64_t{1} << 32);  // above a std::uint32_t
  Fields out{};
  CHECK_THROWS_WITH_AS(optim::detail::load_fields(sd, out, kFields),
                       doctest::Contains("'small' is 4294967296, above the largest value"),
                       tk::Error);
  sd.set("small", std::int64_t{-1});
  CHECK_THROWS_WITH_AS(optim::detail::load_fields(sd, out, kFields),
                       doctest::Contains("'small' is '-1', not an unsigned integer"), tk::Error);
}

TEST_CASE("Ema: first update copies, then lerps with weight 1 - decay (float64 reference)") {
  Arena arena;
  arena.add("w", tk::Shape{50000});
  arena.add("b", tk::Shape{3});
  arena.finalize();
  optim::Ema ema(arena, {.decay = 0.9});
  std::vector<double> ref(static_cast<std::size_t>(arena.buffer_numel()));
  for (int step = 0; step < 5; ++step) {
    for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
      arena.params_data()[i] = std::sin(0.01f * static_cast<float>(i) + static_cast<float>(step));
    ema.update(pool());
    for (std::size_t i = 0; i < ref.size(); ++i)
      ref[i] = step == 0 ? arena.params_data()[i] : 0.9 * ref[i] + 0.1 * arena.params_data()[i];
  }
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::abs(ema.data()[i] - ref[i]));
  CHECK(worst < 1e-6);
  CHECK(ema.num_updates() == 5);
  const tk::StateDict sd = ema.state_dict();
  CHECK(sd.tensor("w").shape() == tk::Shape{50000});
  optim::Ema other(arena, {.decay = 0.5});
  other.load_state_dict(sd);
  CHECK(other.decay() == 0.9);
  CHECK(std::memcmp(other.data(), ema.data(), 50000 * sizeof(float)) == 0);
  Arena eval;
  eval.add("w", tk::Shape{50000});
  eval.add("b", tk::Shape{3});
  eval.finalize();
  ema.copy_to(pool(), eval);
  CHECK(eval.params_data()[123] == ema.data()[123]);
}

TEST_CASE("GradAccumulation: 4 micro-batches of loss / 4 give the full-batch SGD step") {
  optim::GradAccumulation acc(4);
  CHECK(acc.loss_scale() == 0.25f);
  Arena a, b;
  for (Arena* x : {&a, &b}) {
    x->add("w", tk::Shape{8});
    x->finalize();
  }
  optim::SGD opt_a(a, {.lr = 0.5});
  optim::SGD opt_b(b, {.lr = 0.5});
  // Per-sample gradients k * (i + 1); the full batch's mean gradient is their average.
  int steps = 0;
  for (int k = 1; k <= 4; ++k) {
    CHECK(acc.index() == k - 1);
    CHECK(acc.is_last() == (k == 4));
    for (int i = 0; i < 8; ++i) a.grads_data()[i] += acc.loss_scale() * float(k * (i + 1));
    if (acc.micro_step()) {
      opt_a.step(pool());
      a.zero_grad();
      ++steps;
    }
  }
  for (int i = 0; i < 8; ++i) b.grads_data()[i] = 2.5f * float(i + 1);
  opt_b.step(pool());
  CHECK(steps == 1);
  CHECK(acc.steps() == 1);
  CHECK(std::memcmp(a.params_data(), b.params_data(), 8 * sizeof(float)) == 0);
  optim::GradAccumulation r(4);
  r.load_state_dict(acc.state_dict());
  CHECK(r.steps() == 1);
  CHECK_THROWS_AS(optim::GradAccumulation(0), tk::Error);
  CHECK_THROWS_AS(optim::GradAccumulation(3).load_state_dict(acc.state_dict()), tk::Error);
}

TEST_CASE("GradAccumulation::load_state_dict refuses an index or step count out of range") {
  optim::GradAccumulation acc(4);
  acc.micro_step();
  const tk::StateDict good = acc.state_dict();
  for (const std::int64_t index :
       {std::int64_t{4}, std::int64_t{-1}, std::numeric_limits<std::int64_t>::max()}) {
    tk::StateDict sd = good;
    sd.set("index", index);
    optim::GradAccumulation r(4);
    CHECK_THROWS_WITH_AS(r.load_state_dict(sd), doctest::Contains("'index' is"), tk::Error);
    CHECK(r.index() == 0);
  }
  tk::StateDict sd = good;
  sd.set("steps", std::int64_t{-1});
  optim::GradAccumulation r(4);
  CHECK_THROWS_WITH_AS(r.load_state_dict(sd), doctest::Contains("'steps' is -1"), tk::Error);
  CHECK(r.index() == 0);
  r.load_state_dict(good);
  CHECK(r.index() == 1);
}

TEST_CASE("Ema::load_state_dict refuses a decay outside [0, 1] or a negative n_averaged") {
  Arena arena;
  arena.add("w", tk::Shape{8});
  arena.finalize();
  for (int i = 0; i < 8; ++i) arena.params_data()[i] = float(i);
  optim::Ema ema(arena, {.decay = 0.9});
  ema.update(pool());
  const tk::StateDict good = ema.state_dict();
  for (const double decay : {std::numeric_limits<double>::quiet_NaN(), 5.0, -0.1}) {
    tk::StateDict sd = good;
    sd.set("decay", decay);
    optim::Ema other(arena, {.decay = 0.5});
    CHECK_THROWS_WITH_AS(other.load_state_dict(sd), doctest::Contains("'decay' is"), tk::Error);
    CHECK(other.decay() == 0.5);
    CHECK(other.num_updates() == 0);
  }
  tk::StateDict sd = good;
  sd.set("n_averaged", std::int64_t{-3});
  optim::Ema other(arena, {.decay = 0.5});
  CHECK_THROWS_WITH_AS(other.load_state_dict(sd), doctest::Contains("'n_averaged' is -3"),
                       tk::Error);
  CHECK(other.num_updates() == 0);
  other.load_state_dict(good);
  CHECK(other.num_updates() == 1);
}

TEST_CASE("Ema::load_state_dict refuses the average of a parameter the arena does not have") {
  Arena big;
  big.add("w", tk::Shape{8});
  big.add("extra", tk::Shape{3});
  big.finalize();
  optim::Ema from_big(big, {.decay = 0.9});
  from_big.update(pool());
  Arena arena;
  arena.add("w", tk::Shape{8});
  arena.finalize();
  optim::Ema ema(arena, {.decay = 0.5});
  CHECK_THROWS_WITH_AS(ema.load_state_dict(from_big.state_dict()),
                       doctest::Contains("tensor 'extra', the average of a parameter"), tk::Error);
  CHECK(ema.num_updates() == 0);
  CHECK(ema.decay() == 0.5);
}

TEST_CASE("a schedule drives an optimizer's group learning rates") {
  Arena arena;
  arena.add("w", tk::Shape{4});
  arena.add("b.bias", tk::Shape{4});
  arena.finalize();
  optim::AdamW opt(arena, {.lr = 1e-3}, {{{"*.bias"}, 2e-3, 0.0}});
  optim::StepLR sched(opt.lr_groups(), {.step_size = 2, .gamma = 0.5});
  for (int t = 0; t < 4; ++t) {
    opt.step(pool());
    sched.step();
  }
  CHECK(opt.lr(0) == 2.5e-4);
  CHECK(opt.lr(1) == 5e-4);
  // The schedule holds the optimizer's LrGroups, which stay put when the optimizer moves.
  optim::AdamW<> moved(std::move(opt));
  sched.step();
  sched.step();
  CHECK(moved.lr(0) == 1.25e-4);
  CHECK(moved.weight_decay(1) == 0.0);
  const tk::StateDict sd = moved.state_dict();
  CHECK(sd.get_double("group.1.initial_lr") == 2e-3);
}

TEST_CASE("the host's squared gradient norm has exec::reduce's bits, random sizes and values") {
  // sum_into dispatches SquaredTerm to an AVX2 fold where the CPU has one; its value must be
  // the scalar reduce's, bit for bit, whatever n (chunk tails, chunks shorter than the lanes),
  // the scale, the thread count and the non-finite values in g.
  std::uint64_t state = 0x9e3779b97f4a7c15ULL;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  tk::exec::Host one(1);
  for (int trial = 0; trial < 60; ++trial) {
    const std::int64_t n = trial < 20 ? trial : static_cast<std::int64_t>(next() % 200000);
    std::vector<float> g(static_cast<std::size_t>(n) + 1);
    for (float& v : g) {
      const float mag = std::ldexp(1.0f, static_cast<int>(next() % 60) - 30);
      v = (static_cast<float>(next() % 2001) - 1000.0f) * mag;
    }
    if (trial % 7 == 3 && n > 0) g[next() % n] = std::numeric_limits<float>::infinity();
    if (trial % 11 == 5 && n > 0) g[next() % n] = std::numeric_limits<float>::quiet_NaN();
    const float scale = 0.37f;
    for (const float* s : {static_cast<const float*>(nullptr), &scale}) {
      const optim::detail::SquaredTerm term{g.data(), s};
      for (tk::exec::Host* host : {&one, &pool()}) {
        double got = -1.0;
        optim::detail::sum_into(*host, n, term, &got);
        const double want = tk::exec::reduce(*host, n, term, tk::exec::Sum{}, 0.0);
        CAPTURE(n);
        CAPTURE(trial);
        CHECK(std::memcmp(&got, &want, sizeof got) == 0);
      }
    }
  }
}

namespace {

// The scalar update of a rule, element by element, for `steps` steps with the same gradient (no
// loss scale, no clipping): what every host vector body must reproduce bit for bit.
template <class Rule, unsigned V>
std::vector<float> scalar_steps(const typename Rule::Options& o, std::vector<float> p,
                                const std::vector<float>& g, int steps) {
  std::vector<std::vector<float>> st(3, std::vector<float>(p.size(), 0.0f));
  for (int s = 1; s <= steps; ++s) {
    optim::StepHeader head{};
    head.step = s;
    head.first = s == 1 ? 1 : 0;
    head.inv_loss_scale = 1.0f;
    head.clip_coef = 1.0f;
    typename Rule::Scalars sc{};
    Rule::derive(o, head, sc);
    for (std::size_t i = 0; i < p.size(); ++i) {
      float x = p[i];
      const float gi = (g[i] * 1.0f) * 1.0f;
      if constexpr (std::is_same_v<Rule, optim::detail::AdamWRule>) {
        Rule::template update<V, float>(sc, x, gi, st[0][i], st[1][i], st[2][i]);
      } else {
        Rule::template update<V, float>(sc, x, gi, st[0][i]);
      }
      p[i] = x;
    }
  }
  return p;
}

}  // namespace

TEST_CASE(
    "host optimizer passes: the vector bodies (VecF, and AVX2 chosen at run time) give the "
    "scalar update's bits") {
  // An SSE2-only build runs the built-in rules on 8-lane AVX2 vectors where CPUID reports AVX2,
  // then on its own VecF, then element by element: lengths around the vector widths put every
  // element through each of these paths; all must be the scalar update's bits.
  std::mt19937 rng(20261206);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{5}, std::int64_t{8}, std::int64_t{13},
                               std::int64_t{31}, std::int64_t{4099}}) {
    CAPTURE(n);
    std::vector<float> p0(static_cast<std::size_t>(n)), g0(p0.size());
    for (std::size_t i = 0; i < p0.size(); ++i) {
      const float scale = i % 7 == 0 ? 1e-20f : (i % 11 == 0 ? 1e6f : 1.0f);
      p0[i] = uni(rng);
      g0[i] = scale * uni(rng);
    }
    // Three steps of the optimizer make(arena) returns, on an arena holding p0 with gradient g0:
    // the parameters after them.
    auto stepped = [&](const auto& make) {
      Arena arena;
      arena.add("w", tk::Shape{n});
      arena.finalize();
      std::copy(p0.begin(), p0.end(), arena.params_data());
      std::copy(g0.begin(), g0.end(), arena.grads_data());
      auto opt = make(arena);
      for (int s = 0; s < 3; ++s) opt.step(pool());
      return std::vector<float>(arena.params_data(), arena.params_data() + n);
    };
    auto same_bits = [](const std::vector<float>& got, const std::vector<float>& want) {
      return std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0;
    };
    for (const bool amsgrad : {false, true}) {
      CAPTURE(amsgrad);
      const optim::AdamWOptions o{.lr = 3e-3, .weight_decay = 0.1, .amsgrad = amsgrad};
      const std::vector<float> want = amsgrad
                                          ? scalar_steps<optim::detail::AdamWRule, 1>(o, p0, g0, 3)
                                          : scalar_steps<optim::detail::AdamWRule, 0>(o, p0, g0, 3);
      CHECK(same_bits(stepped([&](Arena& a) { return optim::AdamW(a, o); }), want));
    }
    for (const bool nesterov : {false, true}) {
      CAPTURE(nesterov);
      const optim::SGDOptions o{
          .lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = nesterov};
      const std::vector<float> want = nesterov
                                          ? scalar_steps<optim::detail::SGDRule, 3>(o, p0, g0, 3)
                                          : scalar_steps<optim::detail::SGDRule, 1>(o, p0, g0, 3);
      CHECK(same_bits(stepped([&](Arena& a) { return optim::SGD(a, o); }), want));
    }
  }
}
