// Tests for optim/grad_scaler.hpp and optim/grad_norm.hpp: DynamicScaler against
// torch.amp.GradScaler with inf/NaN gradients injected at chosen steps (scale and growth tracker
// exactly, parameters within 1e-6, with AdamW, with SGD + clip_grad_norm_ after unscale_, and
// with clipping folded into the step), PyTorch's update rule (init 65536, growth after
// growth_interval clean steps including the default 2000, backoff, never inf), the five-key
// state_dict, the per-step protocol errors, StaticScaler, and the gradient norm / clipping passes
// against float64; at scales whose inverse overflows to inf (and a loaded scale of 0) found_inf,
// the unscaled gradients, their norm, skipping and the update rule follow torch.amp.GradScaler.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <trainkit/optim/grad_scaler.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/grad_norm.hpp>
#include <trainkit/optim/sgd.hpp>

#include "optim_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace optim = trainkit::optim;
namespace amp = trainkit::amp;
using optest::Reference;
using Arena = tk::nn::ParamArena<tk::Space::kHost>;
constexpr double kTol = 1e-6;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}

enum class ClipMode { kNone, kUnscaleThenClip, kFolded };

// Replays make_reference.py's run_scaled: scaled gradients (grad * scale in f32) with inf/NaN
// written into layer.bias[1] at the reference's inf steps.
template <class Opt>
void run_scaled(const std::string& c, Arena& arena, Opt& opt, std::int64_t growth_interval,
                ClipMode clip, double max_norm) {
  const Reference& ref = Reference::get();
  optim::DynamicScaler scaler(pool(), {.growth_interval = growth_interval});
  const optest::RefTensor& infs = ref[c + "/inf_steps"];
  const std::int64_t bias = arena.info(arena.at("layer.bias")).offset;
  double worst = 0.0;
  int skipped = 0;
  for (int t = 1; t <= optest::kSteps; ++t) {
    arena.zero_grad();  // as a training loop does
    optest::load_grads(arena, t, scaler.scale());
    for (std::size_t k = 0; k < infs.values.size(); ++k)
      if (static_cast<int>(infs.values[k]) == t) {
        // The same injected values as the generator: inf, -inf, nan, inf, nan, inf, nan.
        static const float kBad[] = {
            std::numeric_limits<float>::infinity(),  -std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN()};
        arena.grads_data()[bias + 1] = kBad[k];
      }
    if (clip == ClipMode::kUnscaleThenClip) {
      const optim::GradNorm norm = scaler.unscale_(pool(), arena);
      optim::clip_grad_norm_(pool(), arena, max_norm, norm);
      opt.step(pool(), scaler);
    } else if (clip == ClipMode::kFolded) {
      opt.step(pool(), scaler, {.max_norm = max_norm});
    } else {
      opt.step(pool(), scaler);
    }
    INFO(c << " step " << t);
    CHECK(opt.last_step_skipped() == (ref[c + "/skipped"].values[t - 1] != 0.0));
    skipped += opt.last_step_skipped() ? 1 : 0;
    scaler.update(pool());
    REQUIRE(scaler.scale() == ref[c + "/scale"].values[t - 1]);
    REQUIRE(scaler.growth_tracker() ==
            static_cast<std::int32_t>(ref[c + "/growth_tracker"].values[t - 1]));
    if (optest::snapshot_row(t) >= 0) {
      worst = std::max(worst, optest::param_error(arena, c, t));
      REQUIRE(worst <= kTol);
    }
  }
  CHECK(skipped == static_cast<int>(infs.values.size()));
  CHECK(opt.step_count() == optest::kSteps - skipped);
  MESSAGE(c << ": worst rel error " << worst << ", final scale " << scaler.scale());
}

struct Fixture {
  Arena arena;
  Fixture() {
    optest::build_model(arena);
    optest::load_init(arena);
  }
};

}  // namespace

TEST_CASE("DynamicScaler + fused optimizer match torch.amp.GradScaler with injected inf/NaN") {
  SUBCASE("AdamW, growth_interval 5") {
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 1e-3, .weight_decay = 0.05});
    run_scaled("scaler_adamw", f.arena, opt, 5, ClipMode::kNone, 0.0);
    const Reference& ref = Reference::get();
    for (const char* s : {"exp_avg", "exp_avg_sq"})
      for (const auto& [name, shape] : optest::model_shapes()) {
        const auto& r = ref[std::string("scaler_adamw/state/") + name + "." + s];
        CHECK(optest::rel_error(f.arena.state(s).data() + f.arena.info(f.arena.at(name)).offset,
                                r.values.data(), r.numel()) <= kTol);
      }
  }
  SUBCASE("SGD momentum, unscale_ then clip_grad_norm_(1.0), growth_interval 7") {
    Fixture f;
    optim::SGD opt(f.arena, {.lr = 0.02, .momentum = 0.9});
    run_scaled("scaler_sgd_clip", f.arena, opt, 7, ClipMode::kUnscaleThenClip, 1.0);
  }
  SUBCASE("SGD momentum, clipping folded into the step") {
    Fixture f;
    optim::SGD opt(f.arena, {.lr = 0.02, .momentum = 0.9});
    run_scaled("scaler_sgd_clip", f.arena, opt, 7, ClipMode::kFolded, 1.0);
  }
  SUBCASE("AdamW, clip 0.5 via unscale_, growth_interval 3") {
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 1e-3});
    run_scaled("scaler_adamw_clip", f.arena, opt, 3, ClipMode::kUnscaleThenClip, 0.5);
  }
  SUBCASE("AdamW, clip 0.5 folded into the step") {
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 1e-3});
    run_scaled("scaler_adamw_clip", f.arena, opt, 3, ClipMode::kFolded, 0.5);
  }
}

TEST_CASE("DynamicScaler update rule: PyTorch's numbers") {
  Arena arena;
  arena.add("w", tk::Shape{33});
  arena.finalize();
  auto clean_step = [&](optim::DynamicScaler& s) {
    s.unscale_(pool(), arena);
    s.update(pool());
  };
  auto inf_step = [&](optim::DynamicScaler& s) {
    arena.grads_data()[5] = std::numeric_limits<float>::infinity();
    s.unscale_(pool(), arena);
    CHECK(s.found_inf());
    s.update(pool());
    arena.zero_grad();
  };
  SUBCASE("defaults: 65536, x2 at the 2000th clean step, /2 on overflow") {
    optim::DynamicScaler s(pool());
    CHECK(s.scale() == 65536.0f);
    inf_step(s);
    CHECK(s.scale() == 32768.0f);
    CHECK(s.growth_tracker() == 0);
    for (int i = 0; i < 1999; ++i) clean_step(s);
    CHECK(s.scale() == 32768.0f);
    CHECK(s.growth_tracker() == 1999);
    clean_step(s);
    CHECK(s.scale() == 65536.0f);
    CHECK(s.growth_tracker() == 0);
    for (int i = 0; i < 10; ++i) clean_step(s);
    inf_step(s);
    CHECK(s.scale() == 32768.0f);
    CHECK(s.growth_tracker() == 0);
  }
  SUBCASE("growth_interval 1 doubles every clean step and never reaches inf") {
    optim::DynamicScaler s(pool(), {.init_scale = 0x1p120, .growth_interval = 1});
    for (int i = 0; i < 20; ++i) {
      clean_step(s);
      CHECK(std::isfinite(s.scale()));
    }
    CHECK(s.scale() == 0x1p127f);
    CHECK(s.growth_tracker() == 0);
    inf_step(s);
    CHECK(s.scale() == 0x1p126f);
  }
  SUBCASE("update(new_scale) and custom factors") {
    optim::DynamicScaler s(
        pool(),
        {.init_scale = 8.0, .growth_factor = 3.0, .backoff_factor = 0.25, .growth_interval = 2});
    clean_step(s);
    clean_step(s);
    CHECK(s.scale() == 24.0f);
    inf_step(s);
    CHECK(s.scale() == 6.0f);
    s.unscale_(pool(), arena);
    s.update(pool(), 1024.0);
    CHECK(s.scale() == 1024.0f);
  }
  SUBCASE("unscale_ multiplies by the f32 inverse scale and measures the unscaled norm") {
    optim::DynamicScaler s(pool(), {.init_scale = 1024.0});
    double sum = 0.0;
    for (int i = 0; i < 33; ++i) {
      arena.grads_data()[i] = 1024.0f * (0.25f * static_cast<float>(i) - 3.0f);
      sum += std::pow(0.25 * i - 3.0, 2);
    }
    const optim::GradNorm n = s.unscale_(pool(), arena);
    CHECK(n.get() == doctest::Approx(std::sqrt(sum)).epsilon(1e-7));
    for (int i = 0; i < 33; ++i)
      CHECK(arena.grads_data()[i] == 0.25f * static_cast<float>(i) - 3.0f);
    CHECK_FALSE(s.found_inf());
    arena.zero_grad();
  }
}

TEST_CASE("DynamicScaler: state_dict has PyTorch's five keys and round-trips") {
  Arena arena;
  arena.add("w", tk::Shape{4});
  arena.finalize();
  optim::DynamicScaler s(pool(), {.growth_interval = 10});
  for (int i = 0; i < 3; ++i) {
    s.unscale_(pool(), arena);
    s.update(pool());
  }
  const tk::StateDict sd = s.state_dict();
  CHECK(sd.values.size() == 5);
  CHECK(sd.tensors.empty());
  CHECK(sd.get_double("scale") == 65536.0);
  CHECK(sd.get_double("growth_factor") == 2.0);
  CHECK(sd.get_double("backoff_factor") == 0.5);
  CHECK(sd.get_int("growth_interval") == 10);
  CHECK(sd.get_int("_growth_tracker") == 3);
  optim::DynamicScaler r(pool());
  r.load_state_dict(sd);
  CHECK(r.growth_tracker() == 3);
  CHECK(r.options().growth_interval == 10);
  CHECK_THROWS_AS(r.load_state_dict(tk::StateDict{}), tk::Error);
  // A growth tracker outside [0, growth_interval) would hold the scale back for a long time.
  for (const std::int64_t tracker :
       {std::int64_t{-1000}, std::int64_t{10}, std::int64_t{5000000000}}) {
    tk::StateDict bad = sd;
    bad.set("_growth_tracker", tracker);
    const std::string expected = "'_growth_tracker' is " + std::to_string(tracker);
    CHECK_THROWS_WITH_AS(r.load_state_dict(bad), doctest::Contains(expected.c_str()), tk::Error);
    CHECK(r.growth_tracker() == 3);  // unchanged
  }
  optim::DynamicScaler off(pool(), {.enabled = false});
  CHECK(off.state_dict().empty());
  CHECK(off.scale() == 1.0f);
  // A disabled scaler is PyTorch's enabled=False: plain steps, no checks, no skipping.
  optim::SGD opt(arena, {.lr = 1.0});
  arena.grads_data()[0] = 2.0f;
  for (int i = 0; i < 2; ++i) {
    opt.step(pool(), off);
    off.update(pool());
  }
  CHECK(arena.params_data()[0] == -4.0f);
}

TEST_CASE("DynamicScaler: per-step protocol as PyTorch's (errors instead of silent misuse)") {
  Arena arena;
  arena.add("w", tk::Shape{4});
  arena.finalize();
  optim::SGD opt(arena, {.lr = 0.1});
  optim::DynamicScaler s(pool());
  CHECK_THROWS_AS(s.update(pool()), tk::Error);  // no inf check recorded
  s.unscale_(pool(), arena);
  CHECK_THROWS_AS(s.unscale_(pool(), arena), tk::Error);  // twice
  opt.step(pool(), s);
  CHECK_THROWS_AS(opt.step(pool(), s), tk::Error);        // step twice
  CHECK_THROWS_AS(s.unscale_(pool(), arena), tk::Error);  // after step
  s.update(pool());
  opt.step(pool(), s);
  s.update(pool());
  CHECK(opt.step_count() == 2);
  CHECK_THROWS_AS(optim::DynamicScaler(pool(), {.growth_factor = 1.0}), tk::Error);
  CHECK_THROWS_AS(optim::DynamicScaler(pool(), {.backoff_factor = 1.0}), tk::Error);
  CHECK_THROWS_AS(optim::DynamicScaler(pool(), {.growth_interval = 0}), tk::Error);
  static_assert(amp::is_dynamic_loss_scaler_v<optim::GradScaler>);
  static_assert(amp::is_loss_scaler_v<optim::StaticScaler>);
  static_assert(!amp::is_dynamic_loss_scaler_v<optim::StaticScaler>);
}

TEST_CASE("StaticScaler: fixed scale, still skips inf/NaN steps") {
  Arena arena;
  arena.add("w", tk::Shape{4});
  arena.finalize();
  optim::SGD opt(arena, {.lr = 0.5});
  optim::StaticScaler s(pool(), 128.0);
  for (int i = 0; i < 4; ++i) arena.grads_data()[i] = 128.0f * static_cast<float>(i);
  opt.step(pool(), s);
  s.update(pool());
  CHECK(arena.params_data()[3] == -1.5f);
  arena.grads_data()[0] = std::numeric_limits<float>::quiet_NaN();
  opt.step(pool(), s);
  s.update(pool());
  CHECK(opt.last_step_skipped());
  CHECK(arena.params_data()[3] == -1.5f);
  CHECK(s.scale() == 128.0f);
  CHECK(s.state_dict().get_double("scale") == 128.0);
  // load_state_dict begins a new step, as DynamicScaler's does: a step abandoned after
  // unscale_ (an exception, say) does not make the resumed run's unscale_ "called twice".
  (void)s.unscale_(pool(), arena);
  s.load_state_dict(s.state_dict());
  CHECK_NOTHROW((void)s.unscale_(pool(), arena));
}

TEST_CASE("grad_norm / clip_grad_norm_ / clip_grad_value_ against float64, any thread count") {
  auto make = [](Arena& a) {
    a.add("a", tk::Shape{100003});
    a.add("b", tk::Shape{7});
    a.finalize();
    for (std::int64_t i = 0; i < a.buffer_numel(); ++i)
      a.grads_data()[i] = std::sin(0.37f * static_cast<float>(i)) * 0.01f;
  };
  Arena a, b;
  make(a);
  make(b);
  double sum = 0.0;
  for (std::int64_t i = 0; i < a.buffer_numel(); ++i)
    sum += double(a.grads_data()[i]) * a.grads_data()[i];
  const double norm = std::sqrt(sum);
  tk::exec::Host one(1);
  const optim::GradNorm n1 = optim::clip_grad_norm_(one, a, 0.5);
  const optim::GradNorm n2 = optim::clip_grad_norm_(pool(), b, 0.5);
  CHECK(n1.get() == doctest::Approx(norm).epsilon(1e-7));
  CHECK(n1.get() == n2.get());  // deterministic: same bits for 1 and 2 threads
  CHECK(std::memcmp(a.grads_data(), b.grads_data(),
                    static_cast<std::size_t>(a.buffer_numel()) * sizeof(float)) == 0);
  const double coef = 0.5 / (norm + 1e-6);
  CHECK(a.grads_data()[1] == doctest::Approx(std::sin(0.37f) * 0.01f * coef).epsilon(1e-6));
  CHECK(optim::grad_norm(pool(), a).get() == doctest::Approx(0.5).epsilon(1e-6));
  // A norm below max_norm leaves the gradients alone (coefficient clamped to 1).
  const float g1 = a.grads_data()[1];
  optim::clip_grad_norm_(pool(), a, 10.0);
  CHECK(a.grads_data()[1] == g1);
  optim::clip_grad_value_(pool(), a, 1e-3);
  float biggest = 0.0f;
  for (std::int64_t i = 0; i < a.buffer_numel(); ++i)
    biggest = std::max(biggest, std::abs(a.grads_data()[i]));
  CHECK(biggest == 1e-3f);
  CHECK_THROWS_AS(optim::clip_grad_norm_(pool(), a, 0.0), tk::Error);
}

namespace {

// torch.amp.GradScaler's arithmetic, written out: unscale_ is
// _amp_foreach_non_finite_check_and_unscale_ (found_inf from the incoming gradients, g * inv in
// f32 with inv = float(1 / double(scale))), update is _amp_update_scale_.
struct TorchScaler {
  float scale;
  std::int32_t tracker = 0;
  double growth = 2.0, backoff = 0.5;
  std::int64_t interval = 2;
  float inv() const { return static_cast<float>(1.0 / static_cast<double>(scale)); }
  bool unscale(std::vector<float>& g) const {
    bool found = false;
    for (float& x : g) {
      if (!std::isfinite(x)) found = true;
      x = x * inv();
    }
    return found;
  }
  void update(bool found) {
    if (found) {
      scale = static_cast<float>(static_cast<double>(scale) * backoff);
      tracker = 0;
      return;
    }
    const std::int64_t successful = tracker + 1;
    if (successful == interval) {
      const auto grown = static_cast<float>(static_cast<double>(scale) * growth);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    } else {
      tracker = static_cast<std::int32_t>(successful);
    }
  }
};

// The parameter elements of the arena's gradient buffer, in order.
std::vector<float> real_grads(const Arena& arena) {
  std::vector<float> g;
  for (const auto& info : arena.infos())
    g.insert(g.end(), arena.grads_data() + info.offset,
             arena.grads_data() + info.offset + info.numel);
  return g;
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

}  // namespace

TEST_CASE(
    "DynamicScaler at scales whose inverse overflows to inf behaves as torch.amp.GradScaler") {
  // 1/scale is inf below ~2.9e-39 (and at 0): PyTorch still sets found_inf only from the incoming
  // gradients, so finite gradients become inf / NaN (0 * inf) and the step is taken.
  tk::PhiloxStream rng(777, 2);
  const double scales[] = {0.0, 1e-45, 1e-40, 2.8e-39, 3e-39, 1e-38, 1.0, 65536.0};
  for (int c = 0; c < 48; ++c) {
    const double init = scales[c % 8];
    const bool via_unscale = (c / 8) % 2 == 0;
    CAPTURE(init);
    CAPTURE(via_unscale);
    Arena arena;
    const int np = 1 + static_cast<int>(rng.next_u32() % 3);
    for (int k = 0; k < np; ++k) {
      std::string name = "w";
      name += std::to_string(k);
      arena.add(name, tk::Shape{static_cast<std::int64_t>(1 + rng.next_u32() % 40)});
    }
    arena.finalize();
    optim::SGD opt(arena, {.lr = 1e-3});
    const std::int64_t interval = 1 + rng.next_u32() % 3;
    // A scale below FLT_MIN (0 included), which backoff reaches, is refused as init_scale; it
    // comes from a checkpoint.
    const bool tiny = static_cast<float>(init) < std::numeric_limits<float>::min();
    optim::DynamicScaler s(pool(), {.init_scale = tiny ? 1.0 : init, .growth_interval = interval});
    if (tiny) {
      tk::StateDict sd = s.state_dict();
      sd.set("scale", init);
      s.load_state_dict(sd);
    }
    TorchScaler ref{static_cast<float>(init)};
    ref.interval = interval;
    REQUIRE(s.scale() == ref.scale);
    std::int64_t applied = 0;
    for (int t = 0; t < 8; ++t) {
      CAPTURE(t);
      for (const auto& info : arena.infos())
        for (std::int64_t i = 0; i < info.numel; ++i) {
          const std::uint32_t r = rng.next_u32() % 16;
          arena.grads_data()[info.offset + i] =
              r == 0 ? 0.0f : (r == 1 ? -0.0f : 4.0f * rng.next_uniform() - 2.0f);
        }
      if (t % 3 == 2) {
        const auto& info = arena.infos()[rng.next_u32() % arena.size()];
        arena.grads_data()[info.offset + rng.next_u32() % info.numel] =
            t % 2 == 0 ? std::numeric_limits<float>::quiet_NaN()
                       : std::numeric_limits<float>::infinity();
      }
      std::vector<float> want = real_grads(arena);
      const bool found = ref.unscale(want);
      if (via_unscale) {
        const optim::GradNorm norm = s.unscale_(pool(), arena);
        const std::vector<float> got = real_grads(arena);
        int differ = 0;
        bool any_nan = false, any_inf = false;
        double sum = 0.0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          differ += same_float(got[i], want[i]) ? 0 : 1;
          any_nan = any_nan || std::isnan(want[i]);
          any_inf = any_inf || std::isinf(want[i]);
          sum += static_cast<double>(want[i]) * want[i];
        }
        CHECK(differ == 0);
        // The norm of the unscaled gradients, as clip_grad_norm_ would measure them.
        if (any_nan) CHECK(std::isnan(norm.get()));
        else if (any_inf) CHECK(std::isinf(norm.get()));
        else if (std::isinf(static_cast<float>(std::sqrt(sum)))) CHECK(std::isinf(norm.get()));
        else CHECK(norm.get() == doctest::Approx(std::sqrt(sum)).epsilon(1e-6));
      }
      opt.step(pool(), s);
      CHECK(s.found_inf() == found);
      CHECK(opt.last_step_skipped() == found);
      applied += found ? 0 : 1;
      s.update(pool());
      ref.update(found);
      CHECK(s.scale() == ref.scale);
      CHECK(s.growth_tracker() == ref.tracker);
    }
    CHECK(opt.step_count() == applied);
  }
}

TEST_CASE("DynamicScaler: a saved scale of 0 loads and round-trips, as in PyTorch") {
  optim::DynamicScaler s(pool(), {.growth_interval = 3});
  tk::StateDict sd = s.state_dict();
  sd.set("scale", 0.0);
  sd.set("_growth_tracker", std::int64_t{2});
  optim::DynamicScaler r(pool());
  r.load_state_dict(sd);
  CHECK(r.scale() == 0.0f);
  CHECK(r.growth_tracker() == 2);
  CHECK(r.state_dict().get_double("scale") == 0.0);
  // Growth from 0 stays 0 (0 * 2), the tracker still counts, as _amp_update_scale_ does.
  Arena arena;
  arena.add("w", tk::Shape{5});
  arena.finalize();
  r.unscale_(pool(), arena);
  CHECK_FALSE(r.found_inf());
  r.update(pool());
  CHECK(r.scale() == 0.0f);
  CHECK(r.growth_tracker() == 0);
  r.unscale_(pool(), arena);
  r.update(pool(), 0.0);  // update(new_scale) takes 0 too
  CHECK(r.scale() == 0.0f);
  // Negative, NaN, or beyond f32 (it would become an inf scale that backoff never leaves, so
  // every later step would be skipped): refused wherever a scale enters.
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad : {-1.0, std::numeric_limits<double>::quiet_NaN(), 1e39, inf}) {
    CAPTURE(bad);
    sd.set("scale", bad);
    CHECK_THROWS_AS(r.load_state_dict(sd), tk::Error);
    if (bad > 0.0) {
      CHECK_THROWS_AS(optim::DynamicScaler(pool(), {.init_scale = bad}), tk::Error);
      CHECK_THROWS_AS(optim::StaticScaler(pool(), bad), tk::Error);
    }
  }
  r.unscale_(pool(), arena);
  CHECK_THROWS_AS(r.update(pool(), -2.0), tk::Error);
  CHECK_THROWS_AS(r.update(pool(), 1e39), tk::Error);
  CHECK(optim::DynamicScaler(pool(), {.init_scale = std::numeric_limits<float>::max()}).scale() ==
        std::numeric_limits<float>::max());
}

TEST_CASE("loss scalers refuse a scale that is 0 or subnormal as a float (inverse not finite)") {
  constexpr float kMin = std::numeric_limits<float>::min();
  for (const double bad : {1e-50, 1e-40, double(kMin) / 2}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(optim::DynamicScaler(pool(), {.init_scale = bad}),
                         doctest::Contains("init_scale must be a finite float >= 1.2e-38"),
                         tk::Error);
    CHECK_THROWS_WITH_AS(optim::StaticScaler(pool(), bad),
                         doctest::Contains("scale must be a finite float >= 1.2e-38"), tk::Error);
    optim::StaticScaler s(pool(), 2.0);
    tk::StateDict sd = s.state_dict();
    sd.set("scale", bad);
    CHECK_THROWS_WITH_AS(s.load_state_dict(sd), doctest::Contains("'scale' is"), tk::Error);
    CHECK(s.scale() == 2.0f);
  }
  CHECK_THROWS_AS(optim::StaticScaler(pool(), -1e300), tk::Error);
  CHECK_THROWS_AS(optim::StaticScaler(pool(), std::numeric_limits<double>::infinity()), tk::Error);
  // The smallest normal float is accepted, and its inverse is finite.
  optim::StaticScaler smallest(pool(), double(kMin));
  CHECK(smallest.scale() == kMin);
  CHECK(std::isfinite(1.0f / smallest.scale()));
  CHECK(optim::DynamicScaler(pool(), {.init_scale = double(kMin)}).scale() == kMin);
  CHECK_THROWS_WITH_AS(optim::DynamicScaler(pool(), {.growth_interval = 3000000000LL}),
                       doctest::Contains("growth_interval must be in 1 .. 2^31 - 1"), tk::Error);
  CHECK_THROWS_WITH_AS(optim::DynamicScaler(pool(), {.growth_interval = 0}),
                       doctest::Contains("got 0"), tk::Error);
  CHECK(optim::DynamicScaler(pool(), {.growth_interval = 0x7fffffff}).scale() == 65536.0f);
}

TEST_CASE("DynamicScaler::load_state_dict names itself and the setting when a saved one is bad") {
  optim::DynamicScaler s(pool(), {.growth_interval = 10});
  const tk::StateDict good = s.state_dict();
  struct Bad {
    const char* key;
    double value;
    const char* expected;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Bad& b : {Bad{"growth_factor", 0.5, "growth_factor must be > 1, got 0.5"},
                       Bad{"growth_factor", nan, "growth_factor must be > 1, got nan"},
                       Bad{"backoff_factor", 1.0, "backoff_factor must be in (0, 1), got 1"},
                       Bad{"backoff_factor", 0.0, "backoff_factor must be in (0, 1), got 0"},
                       Bad{"growth_interval", 0.0, "growth_interval must be in 1 .. 2^31 - 1"}}) {
    CAPTURE(b.key);
    CAPTURE(b.value);
    tk::StateDict sd = good;
    if (std::string(b.key) == "growth_interval") {
      sd.set(b.key, std::int64_t{0});
    } else {
      sd.set(b.key, b.value);
    }
    std::string message;
    try {
      s.load_state_dict(sd);
    } catch (const tk::Error& e) {
      message = e.what();
    }
    CHECK(message.find("DynamicScaler::load_state_dict: the state's settings are not valid (") !=
          std::string::npos);
    CHECK(message.find(b.expected) != std::string::npos);
    CHECK(s.options().growth_factor == 2.0);  // unchanged
    CHECK(s.options().growth_interval == 10);
  }
}

TEST_CASE("a disabled DynamicScaler's unscale_ returns the gradients' norm, so clipping works") {
  // PyTorch: GradScaler(enabled=False).unscale_ does nothing and clip_grad_norm_ measures the
  // gradients itself; here clip_grad_norm_ takes the norm unscale_ returns, which used to be an
  // empty handle (clip_grad_norm_ then threw) for a disabled scaler.
  std::mt19937 gen(9);
  std::uniform_int_distribution<int> dim(1, 30);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 10; ++trial) {
    CAPTURE(trial);
    Arena arena;
    for (int k = 0; k < 1 + trial % 3; ++k)
      arena.add("w" + std::to_string(k), tk::Shape{dim(gen), dim(gen)});
    arena.finalize();
    std::vector<float> grads(static_cast<std::size_t>(arena.buffer_numel()), 0.0f);
    double sumsq = 0.0;
    for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
      if (arena.padding_mask().real(i)) {
        grads[static_cast<std::size_t>(i)] = normal(gen);
        sumsq += double(grads[static_cast<std::size_t>(i)]) * grads[static_cast<std::size_t>(i)];
      }
    std::copy(grads.begin(), grads.end(), arena.grads_data());
    optim::DynamicScaler off(pool(), {.enabled = false});
    const optim::GradNorm n = off.unscale_(pool(), arena);
    REQUIRE(n.valid());
    CHECK(n.get() == optim::grad_norm(pool(), arena).get());
    CHECK(std::abs(n.get() - std::sqrt(sumsq)) <= 1e-6 * std::sqrt(sumsq));
    CHECK(std::equal(grads.begin(), grads.end(), arena.grads_data()));  // not scaled
    const double max_norm = 0.5 * std::sqrt(sumsq);
    optim::clip_grad_norm_(pool(), arena, max_norm, n);
    CHECK(optim::grad_norm(pool(), arena).get() == doctest::Approx(max_norm).epsilon(1e-5));
    // The protocol is the enabled one's: a second unscale_ before update() is refused.
    CHECK_THROWS_AS(off.unscale_(pool(), arena), tk::Error);
    optim::SGD opt(arena, {.lr = 1.0});
    opt.step(pool(), off);
    off.update(pool());
    CHECK(opt.step_count() == 1);
  }
}
