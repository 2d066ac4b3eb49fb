// Tests for optim/{sgd,adamw,lamb,optimizer}.hpp: 200-step trajectories of SGD (every flag) and
// AdamW (AMSGrad, small beta1, parameter groups by name pattern) match torch.optim's f32
// trajectories (make_reference.py); LAMB matches the published (apex FusedLAMB) formula computed
// in double; a step skipped for inf/NaN leaves parameters, state and step counter bit-identical;
// state_dict round-trips resume the exact trajectory (the bf16 rounding seed included, every
// option that changes the update saved); a state holding tensors of parameters or states the
// optimizer does not have is refused; bf16 state with stochastic rounding stays close to f32 and
// is deterministic; results do not depend on the thread count.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <trainkit/optim/grad_scaler.hpp>
#include <trainkit/core/rng.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/lamb.hpp>
#include <trainkit/optim/sgd.hpp>

#include "optim_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace optim = trainkit::optim;
using optest::Reference;
using Arena = tk::nn::ParamArena<tk::Space::kHost>;

// f32 PyTorch vs our f32 code: the same operations in the same order; only FMA contraction in
// either build can differ by an ulp per operation. 1e-6 of the largest |value| of the tensor.
constexpr double kTol = 1e-6;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}

// Runs `opt` over the 200 reference steps, checking every stored snapshot; returns the worst
// relative error seen.
template <class Opt>
double run_trajectory(Arena& arena, Opt& opt, const std::string& c) {
  double worst = 0.0;
  for (int t = 1; t <= optest::kSteps; ++t) {
    optest::load_grads(arena, t);
    opt.step(pool());
    if (optest::snapshot_row(t) >= 0) {
      const double e = optest::param_error(arena, c, t);
      worst = std::max(worst, e);
      if (e > kTol) {
        INFO(c << " step " << t);
        CHECK(e <= kTol);
        return e;
      }
    }
  }
  return worst;
}

// The final optimizer state against torch's.
void check_state(Arena& arena, const std::string& c, const std::vector<std::string>& names) {
  const Reference& ref = Reference::get();
  for (const std::string& s : names)
    for (const auto& [name, shape] : optest::model_shapes()) {
      const optest::RefTensor& r = ref[c + "/state/" + name + "." + s];
      const float* a = arena.state(s).data() + arena.info(arena.at(name)).offset;
      INFO(c << " state " << name << "." << s);
      CHECK(optest::rel_error(a, r.values.data(), r.numel()) <= kTol);
    }
}

struct Fixture {
  Arena arena;
  Fixture() {
    optest::build_model(arena);
    optest::load_init(arena);
  }
};

/// Steps `opt` on f with the gradients of steps [1, steps].
template <class O>
void run_steps(Fixture& f, O& opt, int steps) {
  for (int t = 1; t <= steps; ++t) {
    optest::load_grads(f.arena, t);
    opt.step(pool());
  }
}

/// g's parameters become f's (a resumed run starts from the saved weights).
void copy_params(const Fixture& f, Fixture& g) {
  std::memcpy(g.arena.params_data(), f.arena.params_data(),
              static_cast<std::size_t>(f.arena.buffer_numel()) * sizeof(float));
}

/// Steps `a` on f and `b` on g with the gradients of steps [first, last]; true when the two
/// arenas' parameters then hold the same bits (a resumed optimizer continues the original).
template <class A, class B>
bool continue_alike(Fixture& f, A& a, Fixture& g, B& b, int first, int last) {
  for (int t = first; t <= last; ++t) {
    optest::load_grads(f.arena, t);
    optest::load_grads(g.arena, t);
    a.step(pool());
    b.step(pool());
  }
  return std::memcmp(f.arena.params_data(), g.arena.params_data(),
                     static_cast<std::size_t>(f.arena.buffer_numel()) * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("SGD matches torch.optim.SGD over 200 steps (every flag)") {
  SUBCASE("plain") {
    Fixture f;
    optim::SGD opt(f.arena, {.lr = 0.1});
    MESSAGE("sgd_plain worst rel error " << run_trajectory(f.arena, opt, "sgd_plain"));
  }
  SUBCASE("momentum") {
    Fixture f;
    optim::SGD opt(f.arena, {.lr = 0.05, .momentum = 0.9});
    MESSAGE("sgd_momentum worst rel error " << run_trajectory(f.arena, opt, "sgd_momentum"));
    check_state(f.arena, "sgd_momentum", {"momentum_buffer"});
  }
  SUBCASE("momentum, dampening, weight decay") {
    Fixture f;
    optim::SGD opt(f.arena, {.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01});
    MESSAGE("sgd_dampening_wd worst " << run_trajectory(f.arena, opt, "sgd_dampening_wd"));
    check_state(f.arena, "sgd_dampening_wd", {"momentum_buffer"});
  }
  SUBCASE("nesterov, weight decay, groups by name pattern") {
    Fixture f;
    optim::SGD opt(f.arena, {.lr = 0.03, .momentum = 0.9, .weight_decay = 0.05, .nesterov = true},
                   {optim::no_weight_decay({"*.bias", "*ln*"})});
    CHECK(opt.num_groups() == 2);
    CHECK(opt.group_of("layer.bias") == 1);
    CHECK(opt.group_of("ln.weight") == 1);
    CHECK(opt.group_of("layer.weight") == 0);
    CHECK(opt.weight_decay(1) == 0.0);
    MESSAGE("sgd_nesterov worst " << run_trajectory(f.arena, opt, "sgd_nesterov_wd_groups"));
    check_state(f.arena, "sgd_nesterov_wd_groups", {"momentum_buffer"});
  }
}

TEST_CASE("AdamW matches torch.optim.AdamW over 200 steps") {
  SUBCASE("defaults") {
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 1e-3});
    MESSAGE("adamw_default worst " << run_trajectory(f.arena, opt, "adamw_default"));
    check_state(f.arena, "adamw_default", {"exp_avg", "exp_avg_sq"});
    CHECK(opt.step_count() == 200);
  }
  SUBCASE("amsgrad") {
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 1e-2, .amsgrad = true});
    MESSAGE("adamw_amsgrad worst " << run_trajectory(f.arena, opt, "adamw_amsgrad"));
    check_state(f.arena, "adamw_amsgrad", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
  }
  SUBCASE("betas, eps, weight decay, no decay for *.bias and *ln*") {
    Fixture f;
    optim::AdamW opt(f.arena,
                     {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1},
                     {optim::no_weight_decay({"*.bias", "*ln*"})});
    MESSAGE("adamw_groups worst " << run_trajectory(f.arena, opt, "adamw_groups"));
    check_state(f.arena, "adamw_groups", {"exp_avg", "exp_avg_sq"});
  }
  SUBCASE("beta1 < 0.5 (lerp's large-weight form)") {
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 1e-2, .beta1 = 0.3, .beta2 = 0.9, .weight_decay = 0.02});
    MESSAGE("adamw_beta1_small worst " << run_trajectory(f.arena, opt, "adamw_beta1_small"));
    check_state(f.arena, "adamw_beta1_small", {"exp_avg", "exp_avg_sq"});
  }
}

TEST_CASE("AdamW: identical bits for 1 and 2 threads and a long arena (vector body + tails)") {
  // 3 parameters of odd sizes spanning several host chunks, so the chunk/segment/tail logic runs.
  auto run = [](int threads) {
    tk::exec::Host host(threads);
    Arena arena;
    arena.add("a", tk::Shape{70001});
    arena.add("b.bias", tk::Shape{3});
    arena.add("c", tk::Shape{40000, 2});
    arena.finalize();
    for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) {
      arena.params_data()[i] = std::sin(0.001f * static_cast<float>(i));
      arena.grads_data()[i] = std::cos(0.002f * static_cast<float>(i));
    }
    optim::AdamW opt(arena, {.lr = 1e-2, .amsgrad = true}, {optim::no_weight_decay({"*.bias"})});
    for (int s = 0; s < 3; ++s) opt.step(host);
    return std::vector<float>(arena.params_data(), arena.params_data() + arena.buffer_numel());
  };
  const std::vector<float> one = run(1);
  const std::vector<float> two = run(2);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
  // Element 70000 (tail of a vector loop) against a scalar double computation of 3 steps.
  double p = std::sin(0.001 * 70000.0f), m = 0, v = 0, vmax = 0;
  const double g = static_cast<float>(std::cos(0.002f * 70000.0f));
  for (int s = 1; s <= 3; ++s) {
    p *= 1 - 1e-2 * 1e-2;
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    vmax = std::max(vmax, v);
    p -= 1e-2 / (1 - std::pow(0.9, s)) * m /
         (std::sqrt(vmax) / std::sqrt(1 - std::pow(0.999, s)) + 1e-8);
  }
  CHECK(one[70000] == doctest::Approx(p).epsilon(1e-6));
}

namespace {

// LAMB in double, apex FusedLAMB's formula (adam_w_mode, grad_averaging, bias correction,
// global-norm clipping by max_grad_norm, trust ratio when weight_decay != 0 or nvlamb).
struct LambRef {
  std::vector<std::vector<double>> p, m, v;
  double lr, b1, b2, eps, wd, max_norm;
  bool nvlamb;
  int step = 0;
  void run(const std::vector<std::vector<double>>& g) {
    ++step;
    double sum = 0;
    for (const auto& t : g)
      for (double x : t) sum += x * x;
    const double norm = std::sqrt(sum);
    const double clip = (max_norm > 0 && norm > max_norm) ? norm / max_norm : 1.0;
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (std::size_t k = 0; k < p.size(); ++k) {
      std::vector<double> u(p[k].size());
      double pn = 0, un = 0;
      for (std::size_t i = 0; i < p[k].size(); ++i) {
        const double sg = g[k][i] / clip;
        m[k][i] = m[k][i] * b1 + (1 - b1) * sg;
        v[k][i] = v[k][i] * b2 + (1 - b2) * sg * sg;
        u[i] = (m[k][i] / bc1) / (std::sqrt(v[k][i] / bc2) + eps) + wd * p[k][i];
        pn += p[k][i] * p[k][i];
        un += u[i] * u[i];
      }
      pn = std::sqrt(pn);
      un = std::sqrt(un);
      const double ratio = (nvlamb || wd != 0) && pn != 0 && un != 0 ? lr * pn / un : lr;
      for (std::size_t i = 0; i < p[k].size(); ++i) p[k][i] -= ratio * u[i];
    }
  }
};

}  // namespace

TEST_CASE("LAMB matches the published formula (f64 reference) step by step and over 200 steps") {
  for (const double wd : {0.01, 0.0}) {
    for (const double max_norm : {1.0, 0.0}) {
      CAPTURE(wd);
      CAPTURE(max_norm);
      Fixture f;
      optim::LAMB opt(f.arena, {.lr = 2e-3,
                                .eps = 1e-6,
                                .weight_decay = wd,
                                .max_grad_norm = max_norm,
                                .use_nvlamb = wd == 0.0});
      LambRef traj{{}, {}, {}, 2e-3, 0.9, 0.999, 1e-6, wd, max_norm, wd == 0.0};
      for (const auto& [name, shape] : optest::model_shapes()) {
        const float* p = f.arena.params_data() + f.arena.info(f.arena.at(name)).offset;
        traj.p.emplace_back(p, p + shape.numel());
        traj.m.emplace_back(shape.numel(), 0.0);
        traj.v.emplace_back(shape.numel(), 0.0);
      }
      double worst_step = 0.0, worst_traj = 0.0;
      for (int t = 1; t <= optest::kSteps; ++t) {
        optest::load_grads(f.arena, t);
        // One-step reference from OUR current f32 state: checks the formula without f32 drift.
        LambRef one = traj;
        one.p.clear();
        one.m.clear();
        one.v.clear();
        std::vector<std::vector<double>> g;
        for (const auto& [name, shape] : optest::model_shapes()) {
          const auto off = f.arena.info(f.arena.at(name)).offset;
          const std::int64_t n = shape.numel();
          one.p.emplace_back(f.arena.params_data() + off, f.arena.params_data() + off + n);
          one.m.emplace_back(f.arena.state("exp_avg").data() + off,
                             f.arena.state("exp_avg").data() + off + n);
          one.v.emplace_back(f.arena.state("exp_avg_sq").data() + off,
                             f.arena.state("exp_avg_sq").data() + off + n);
          g.emplace_back(f.arena.grads_data() + off, f.arena.grads_data() + off + n);
        }
        one.step = t - 1;
        one.run(g);
        traj.run(g);
        opt.step(pool());
        std::size_t k = 0;
        for (const auto& [name, shape] : optest::model_shapes()) {
          const float* p = f.arena.params_data() + f.arena.info(f.arena.at(name)).offset;
          worst_step = std::max(worst_step, optest::rel_error(p, one.p[k].data(), shape.numel()));
          worst_traj = std::max(worst_traj, optest::rel_error(p, traj.p[k].data(), shape.numel()));
          ++k;
        }
      }
      MESSAGE("LAMB wd=" << wd << " max_norm=" << max_norm << ": worst one-step error "
                         << worst_step << ", trajectory vs f64 " << worst_traj);
      CHECK(worst_step <= kTol);
      // Over 200 steps f32 rounding accumulates (torch's own f32 AdamW drifts 2.6e-6 from f64).
      CHECK(worst_traj <= 2e-6);
    }
  }
}

TEST_CASE("a step with inf/NaN gradients leaves parameters, state and step count bit-identical") {
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 1e-2, .amsgrad = true});
    tk::optim::DynamicScaler scaler(pool());
    for (int t = 1; t <= 3; ++t) {
      optest::load_grads(f.arena, t, scaler.scale());
      opt.step(pool(), scaler);
      scaler.update(pool());
    }
    const std::int64_t n = f.arena.buffer_numel();
    auto snapshot = [&] {
      std::vector<float> s(f.arena.params_data(), f.arena.params_data() + n);
      for (const char* name : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
        s.insert(s.end(), f.arena.state(name).data(), f.arena.state(name).data() + n);
      return s;
    };
    const std::vector<float> before = snapshot();
    optest::load_grads(f.arena, 4, scaler.scale());
    f.arena.grads_data()[f.arena.info(f.arena.at("ln.weight")).offset + 2] = bad;
    opt.step(pool(), scaler);
    CHECK(opt.last_step_skipped());
    CHECK(opt.step_count() == 3);
    const std::vector<float> after = snapshot();
    CHECK(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0);
    scaler.update(pool());
    CHECK(scaler.scale() == 32768.0f);
    // The next clean step is step 4 for the bias correction.
    optest::load_grads(f.arena, 4, scaler.scale());
    opt.step(pool(), scaler);
    CHECK_FALSE(opt.last_step_skipped());
    CHECK(opt.step_count() == 4);
  }
}

TEST_CASE("SGD: a skipped first step does not initialise the momentum buffer") {
  Fixture f;
  Fixture g;
  optim::SGD a(f.arena, {.lr = 0.05, .momentum = 0.9});
  optim::SGD b(g.arena, {.lr = 0.05, .momentum = 0.9});
  tk::optim::StaticScaler scaler(pool(), 4.0);
  optest::load_grads(f.arena, 1, 4.0f);
  f.arena.grads_data()[0] = std::numeric_limits<float>::quiet_NaN();
  a.step(pool(), scaler);
  scaler.update(pool());
  CHECK(a.step_count() == 0);
  for (int t = 1; t <= 5; ++t) {
    optest::load_grads(f.arena, t, 4.0f);
    optest::load_grads(g.arena, t, 1.0f);
    a.step(pool(), scaler);
    scaler.update(pool());
    b.step(pool());
  }
  CHECK(std::memcmp(f.arena.params_data(), g.arena.params_data(),
                    static_cast<std::size_t>(f.arena.buffer_numel()) * sizeof(float)) == 0);
}

TEST_CASE("state_dict round trip resumes the exact trajectory") {
  SUBCASE("AdamW") {
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 3e-3, .amsgrad = true}, {optim::no_weight_decay({"*ln*"})});
    run_steps(f, opt, 10);
    opt.set_lr(1, 7e-4);
    const tk::StateDict sd = opt.state_dict();
    CHECK(sd.get_double("step") == 10.0);
    CHECK(sd.tensors.count("layer.weight.exp_avg") == 1);
    CHECK(sd.tensors.count("ln.weight.max_exp_avg_sq") == 1);
    CHECK(sd.tensor("head.weight.exp_avg_sq").shape() == tk::Shape{3, 4});
    CHECK(sd.tensor("head.weight.step").shape().rank() == 0);
    CHECK(sd.get_double("group.1.lr") == 7e-4);

    Fixture g;
    copy_params(f, g);
    optim::AdamW resumed(g.arena, {.lr = 1.0, .amsgrad = true}, {optim::no_weight_decay({"*ln*"})});
    resumed.load_state_dict(sd);
    CHECK(resumed.lr(1) == 7e-4);
    CHECK(resumed.step_count() == 10);
    CHECK(continue_alike(f, opt, g, resumed, 11, 20));
    // A state of another optimizer, or one with a different layout, is refused.
    optim::AdamW plain(g.arena, {.lr = 1.0});
    CHECK_THROWS_AS(plain.load_state_dict(sd), tk::Error);
  }
  SUBCASE("SGD with momentum") {
    Fixture f;
    optim::SGD opt(f.arena, {.lr = 0.05, .momentum = 0.9, .nesterov = true});
    run_steps(f, opt, 7);
    const tk::StateDict sd = opt.state_dict();
    Fixture g;
    copy_params(f, g);
    optim::SGD resumed(g.arena, {.lr = 0.05, .momentum = 0.9, .nesterov = true});
    resumed.load_state_dict(sd);
    CHECK(continue_alike(f, opt, g, resumed, 8, 12));
    tk::StateDict broken = sd;
    broken.tensors.erase("ln.weight.momentum_buffer");
    CHECK_THROWS_AS(resumed.load_state_dict(broken), tk::Error);
  }
}

TEST_CASE("LAMB: a resume keeps the saved flags, whatever the new optimizer was built with") {
  // Every flag that changes the update, saved and restored: the trajectory is the same bits.
  tk::PhiloxStream rng(0x1a3b, 7);
  for (int trial = 0; trial < 8; ++trial) {
    const auto flag = [&] { return (rng.next_u32() & 1) != 0; };
    const optim::LAMBOptions saved{.lr = 2e-3,
                                   .weight_decay = flag() ? 0.01 : 0.0,
                                   .bias_correction = flag(),
                                   .adam_w_mode = flag(),
                                   .grad_averaging = flag(),
                                   .use_nvlamb = flag()};
    CAPTURE(trial);
    Fixture f;
    optim::LAMB opt(f.arena, saved);
    run_steps(f, opt, 4);
    const tk::StateDict sd = opt.state_dict();
    Fixture g;
    copy_params(f, g);
    optim::LAMBOptions other = saved;  // each flag the other way
    other.bias_correction = !saved.bias_correction;
    other.adam_w_mode = !saved.adam_w_mode;
    other.grad_averaging = !saved.grad_averaging;
    other.use_nvlamb = !saved.use_nvlamb;
    optim::LAMB resumed(g.arena, other);
    resumed.load_state_dict(sd);
    CHECK(continue_alike(f, opt, g, resumed, 5, 8));
  }
}

TEST_CASE("load_state_dict refuses NaN in a state and a negative second moment, naming them") {
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 3e-3, .amsgrad = !bf16, .bf16_state = bf16});
    run_steps(f, opt, 3);
    const tk::StateDict sd = opt.state_dict();
    struct Case {
      const char* tensor;
      float value;
      const char* message;
    };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    const Case cases[] = {
        {"head.weight.exp_avg", nan,
         "'head.weight.exp_avg' holds nan at element 5; expected numbers"},
        {"layer.weight.exp_avg_sq", -0.25f,
         "'layer.weight.exp_avg_sq' holds -0.25 at element 5; expected values >= 0"},
        {"ln.weight.exp_avg_sq", -inf, "'ln.weight.exp_avg_sq' holds -inf at element 5"},
        {"ln.weight.exp_avg_sq", nan, "'ln.weight.exp_avg_sq' holds nan at element 5"},
        {"head.weight.max_exp_avg_sq", -1.0f, "'head.weight.max_exp_avg_sq' holds -1"}};
    Fixture g;
    optim::AdamW fresh(g.arena, {.lr = 1.0, .amsgrad = !bf16, .bf16_state = bf16});
    for (const Case& c : cases) {
      if (sd.tensors.count(c.tensor) == 0) continue;  // no max_exp_avg_sq without amsgrad
      CAPTURE(c.tensor);
      tk::StateDict d = sd;
      tk::AnyTensor& t = d.tensors.at(c.tensor);
      REQUIRE(t.numel() > 5);
      if (bf16) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &c.value, sizeof bits);
        const auto half = static_cast<std::uint16_t>(bits >> 16);
        std::memcpy(t.data() + 5 * sizeof half, &half, sizeof half);
      } else {
        std::memcpy(t.data() + 5 * sizeof c.value, &c.value, sizeof c.value);
      }
      CHECK_THROWS_WITH_AS(fresh.load_state_dict(d), doctest::Contains(c.message), tk::Error);
      CHECK(fresh.step_count() == 0);  // nothing changed
    }
    tk::StateDict fine = sd;  // -0 and +inf are numbers a second moment may hold
    tk::AnyTensor& v = fine.tensors.at("layer.weight.exp_avg_sq");
    if (bf16) {
      const std::uint16_t minus_zero = 0x8000, plus_inf = 0x7f80;
      std::memcpy(v.data() + 2, &minus_zero, 2);
      std::memcpy(v.data() + 4, &plus_inf, 2);
    } else {
      const float minus_zero = -0.0f;
      std::memcpy(v.data() + 4, &minus_zero, 4);
      std::memcpy(v.data() + 8, &inf, 4);
    }
    CHECK_NOTHROW(fresh.load_state_dict(fine));
    CHECK(fresh.step_count() == 3);
  }
}

TEST_CASE("AdamW with bf16 state: stochastic rounding is unbiased, deterministic, close to f32") {
  // Unbiased: x halfway-ish between two bf16 values rounds up with probability = its fraction.
  const float x = 1.0f + 0.3f * 0x1p-7f;  // 30% of the way from 1 to the next bf16 (1 + 2^-7)
  double sum = 0.0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i)
    sum += static_cast<float>(optim::detail::bf16_round_stochastic(
        x, tk::philox_u32(7, 0, static_cast<std::uint64_t>(i))));
  CHECK(sum / draws == doctest::Approx(x).epsilon(2e-4));
  CHECK(static_cast<float>(
            optim::detail::bf16_round_stochastic(std::numeric_limits<float>::infinity(), 123)) ==
        std::numeric_limits<float>::infinity());

  auto run = [](bool bf16) {
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 1e-3, .bf16_state = bf16, .seed = 11});
    for (int t = 1; t <= optest::kSteps; ++t) {
      optest::load_grads(f.arena, t);
      opt.step(pool());
    }
    if (bf16) {
      const tk::StateDict sd = opt.state_dict();
      CHECK(sd.tensor("layer.weight.exp_avg").dtype() == tk::DType::kBF16);
    }
    return std::vector<float>(f.arena.params_data(),
                              f.arena.params_data() + f.arena.buffer_numel());
  };
  const std::vector<float> a = run(true);
  const std::vector<float> b = run(true);
  const std::vector<float> ref = run(false);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::abs(a[i] - ref[i])));
    den = std::max(den, static_cast<double>(std::abs(ref[i])));
  }
  MESSAGE("bf16-state AdamW vs f32 after 200 steps: " << num / den);
  CHECK(num > 0.0);
  CHECK(num / den < 2e-3);
}

TEST_CASE("load_state_dict refuses damaged counts, rates and options, and changes nothing then") {
  Fixture f;
  optim::AdamW opt(f.arena, {.lr = 3e-3}, {optim::no_weight_decay({"*ln*"})});
  for (int t = 1; t <= 3; ++t) {
    optest::load_grads(f.arena, t);
    opt.step(pool());
  }
  const tk::StateDict sd = opt.state_dict();
  const auto damaged = [&](const char* key, double value) {
    tk::StateDict d = sd;
    d.set(key, value);
    return d;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    const char* key;
    double value;
    const char* message;
  };
  const Case cases[] = {{"step", nan, "'step' is nan"},
                        {"step", -1.0, "'step' is -1; expected a whole number >= 0"},
                        {"step", 0.5, "'step' is 0.5"},
                        {"step", 1e300, "'step' is 1e+300"},
                        {"beta1", 1.0, "options are not valid (optim::AdamW: invalid beta1 1"},
                        {"beta2", nan, "invalid beta2"},
                        {"eps", -1.0, "invalid epsilon"},
                        {"group.0.lr", nan, "'group.0.lr' is nan"},
                        {"group.0.lr", -1.0, "'group.0.lr' is -1; expected a finite number >= 0"},
                        {"group.1.weight_decay", -5.0, "'group.1.weight_decay' is -5"}};
  Fixture g;
  optim::AdamW fresh(g.arena, {.lr = 1.0}, {optim::no_weight_decay({"*ln*"})});
  for (const Case& c : cases) {
    CAPTURE(c.key);
    CAPTURE(c.value);
    CHECK_THROWS_WITH_AS(fresh.load_state_dict(damaged(c.key, c.value)),
                         doctest::Contains(c.message), tk::Error);
    CHECK(fresh.step_count() == 0);  // nothing changed
    CHECK(fresh.lr(0) == 1.0);
  }
  tk::StateDict odd = sd;  // a parameter's own step count that disagrees
  const float seven = 7.0f;
  std::memcpy(odd.tensors.at("head.weight.step").data(), &seven, sizeof seven);
  CHECK_THROWS_WITH_AS(fresh.load_state_dict(odd),
                       doctest::Contains("'head.weight.step' is 7 but the state's step is 3"),
                       tk::Error);
  CHECK_NOTHROW(fresh.load_state_dict(sd));
  CHECK(fresh.step_count() == 3);
}

TEST_CASE("clipping: a NaN max_norm is refused, a tiny one still clips") {
  Fixture f;
  optim::SGD opt(f.arena, {.lr = 1.0});
  optest::load_grads(f.arena, 1);
  CHECK_THROWS_WITH_AS(
      opt.step(pool(), optim::ClipGradNorm{.max_norm = std::numeric_limits<double>::quiet_NaN()}),
      doctest::Contains("max_norm is NaN"), tk::Error);
  const std::vector<float> before(f.arena.params_data(),
                                  f.arena.params_data() + f.arena.buffer_numel());
  opt.step(pool(), optim::ClipGradNorm{.max_norm = 1e-50});  // rounds to 0 in f32: still clips
  double moved = 0.0;
  for (std::int64_t i = 0; i < f.arena.buffer_numel(); ++i)
    moved = std::max(moved, double(std::abs(f.arena.params_data()[i] - before[std::size_t(i)])));
  CHECK(moved < 1e-30);
}

TEST_CASE("optimizer options are validated") {
  Fixture f;
  CHECK_THROWS_AS(optim::AdamW(f.arena, {.lr = -1.0}), tk::Error);
  CHECK_THROWS_AS(optim::AdamW(f.arena, {.beta1 = 1.0}), tk::Error);
  CHECK_THROWS_AS(optim::SGD(f.arena, {.nesterov = true}), tk::Error);
  CHECK_THROWS_AS(optim::SGD(f.arena, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                  tk::Error);
  // A group's own lr and weight decay are held to the same rules as the base options.
  CHECK_THROWS_WITH_AS(optim::AdamW(f.arena, {}, {optim::GroupRule{{"*ln*"}, -1.0, std::nullopt}}),
                       doctest::Contains("parameter group 1 has lr -1"), tk::Error);
  CHECK_THROWS_AS(optim::AdamW(f.arena, {}, {optim::GroupRule{{"*ln*"}, std::nullopt, -2.0}}),
                  tk::Error);
  CHECK_THROWS_AS(optim::SGD(f.arena, {.dampening = std::numeric_limits<double>::quiet_NaN()}),
                  tk::Error);
  CHECK_THROWS_AS(optim::LAMB(f.arena, {.max_grad_norm = std::numeric_limits<double>::quiet_NaN()}),
                  tk::Error);
  std::vector<optim::GroupRule> many(optim::kMaxParamGroups, optim::no_weight_decay({"x"}));
  CHECK_THROWS_AS(optim::SGD(f.arena, {}, many), tk::Error);
  Arena unfinished;
  unfinished.add("w", tk::Shape{2});
  CHECK_THROWS_AS(optim::SGD<>(unfinished, {}), tk::Error);
}

TEST_CASE("a non-finite base lr or weight_decay and a bad set_lr are refused") {
  Fixture f;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(optim::AdamW(f.arena, {.lr = kInf}),
                       doctest::Contains("lr must be finite and >= 0, got inf"), tk::Error);
  CHECK_THROWS_WITH_AS(optim::SGD(f.arena, {.lr = kNaN}), doctest::Contains("lr must be finite"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(optim::AdamW(f.arena, {.weight_decay = kInf}),
                       doctest::Contains("weight_decay must be finite and >= 0, got inf"),
                       tk::Error);
  optim::SGD opt(f.arena, {.lr = 0.1});
  CHECK_THROWS_WITH_AS(opt.set_lr(kNaN), doctest::Contains("must be finite and >= 0, got nan"),
                       tk::Error);
  CHECK_THROWS_AS(opt.set_lr(-0.1), tk::Error);
  CHECK_THROWS_AS(opt.set_lr(kInf), tk::Error);
  CHECK_THROWS_WITH_AS(opt.set_lr(0, kNaN), doctest::Contains("group 0 must be finite"), tk::Error);
  CHECK_THROWS_WITH_AS(opt.set_lr(5, 0.1), doctest::Contains("group 5 does not exist"), tk::Error);
  CHECK_THROWS_WITH_AS(opt.set_lr(-1, 0.1), doctest::Contains("group -1 does not exist"),
                       tk::Error);
  CHECK(opt.lr() == 0.1);
  opt.set_lr(0, 0.0);
  CHECK(opt.lr() == 0.0);
  opt.set_lr(0.2);
  CHECK(opt.lr() == 0.2);
}

TEST_CASE("AdamW: the bf16 rounding seed is saved and restored (random seeds, above INT64_MAX)") {
  tk::PhiloxStream rng(0x5eed, 3);
  const auto u64 = [&] { return (std::uint64_t{rng.next_u32()} << 32) | rng.next_u32(); };
  std::vector<std::uint64_t> seeds = {0, 1, std::uint64_t{1} << 63,
                                      std::numeric_limits<std::uint64_t>::max()};
  for (int i = 0; i < 6; ++i) seeds.push_back(u64());
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    const bool amsgrad = (rng.next_u32() & 1) != 0;
    Fixture f;
    optim::AdamW opt(f.arena, {.lr = 3e-3, .amsgrad = amsgrad, .bf16_state = true, .seed = seed});
    run_steps(f, opt, 3);
    const tk::StateDict sd = opt.state_dict();
    CHECK(sd.get_string("seed") == std::to_string(seed));  // exact, as decimal text
    CHECK(sd.get_u64("seed") == seed);
    // A resume built with another seed continues the saved run's rounding stream, bit for bit.
    Fixture g;
    copy_params(f, g);
    const std::uint64_t other = seed ^ (u64() | 1);
    optim::AdamW resumed(g.arena,
                         {.lr = 1.0, .amsgrad = amsgrad, .bf16_state = true, .seed = other});
    resumed.load_state_dict(sd);
    CHECK(resumed.options().seed == seed);
    CHECK(continue_alike(f, opt, g, resumed, 4, 7));

    // A state saved before the seed was saved has no "seed": it loads keeping this one's.
    tk::StateDict old = sd;
    old.values.erase("seed");
    optim::AdamW keeps(g.arena, {.lr = 1.0, .amsgrad = amsgrad, .bf16_state = true, .seed = other});
    keeps.load_state_dict(old);
    CHECK(keeps.options().seed == other);
    CHECK(keeps.step_count() == 3);

    // A seed that is not an unsigned 64-bit integer is refused, naming it; nothing changes.
    for (const char* bad : {"-1", "18446744073709551616", "1e3", "", "0x10"}) {
      CAPTURE(bad);
      tk::StateDict d = sd;
      d.values["seed"] = bad;
      optim::AdamW fresh(g.arena, {.lr = 1.0, .amsgrad = amsgrad, .bf16_state = true, .seed = 9});
      CHECK_THROWS_WITH_AS(fresh.load_state_dict(d), doctest::Contains("'seed' is"), tk::Error);
      CHECK(fresh.options().seed == 9);
      CHECK(fresh.step_count() == 0);
    }
  }
  // With f32 state the seed changes nothing, but is saved all the same.
  Fixture f;
  optim::AdamW opt(f.arena, {.seed = 77});
  CHECK(opt.state_dict().get_u64("seed") == 77);
}

TEST_CASE("every option that changes an SGD, AdamW or LAMB update is in its state_dict") {
  // lr and weight_decay are saved per group; the rest as the rule's saved options.
  Fixture f;
  const tk::StateDict sgd = optim::SGD(f.arena, {.momentum = 0.5}).state_dict();
  for (const char* key :
       {"group.0.lr", "group.0.weight_decay", "momentum", "dampening", "nesterov"})
    CHECK_MESSAGE(sgd.values.count(key) == 1, key);
  Fixture g;
  const tk::StateDict adamw = optim::AdamW(g.arena).state_dict();
  for (const char* key : {"group.0.lr", "group.0.weight_decay", "beta1", "beta2", "eps", "amsgrad",
                          "bf16_state", "seed"})
    CHECK_MESSAGE(adamw.values.count(key) == 1, key);
  Fixture h;
  const tk::StateDict lamb = optim::LAMB(h.arena).state_dict();
  for (const char* key :
       {"group.0.lr", "group.0.weight_decay", "beta1", "beta2", "eps", "max_grad_norm",
        "bias_correction", "grad_averaging", "adam_w_mode", "use_nvlamb"})
    CHECK_MESSAGE(lamb.values.count(key) == 1, key);
}

namespace {

// `count` random GPT-like parameter names (dots in them).
std::vector<std::string> random_names(tk::PhiloxStream& rng, int count) {
  const char* leaves[] = {"attn.c_attn.weight", "attn.c_proj.bias", "ln_1.weight",
                          "mlp.c_fc.weight"};
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i)
    names.push_back("h." + std::to_string(i) + "." + leaves[rng.next_u32() % 4]);
  return names;
}

// Registers `names` (each of the size `sizes` gives it), finalizes the arena and fills it.
void build(Arena& arena, const std::vector<std::string>& names,
           const std::map<std::string, std::int64_t>& sizes) {
  for (const std::string& n : names) arena.add(n, tk::Shape{sizes.at(n)});
  arena.finalize();
  for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) {
    arena.params_data()[i] = 0.01f * static_cast<float>(i % 13);
    arena.grads_data()[i] = 0.1f - 0.003f * static_cast<float>(i % 17);
  }
}

// Calls f with a new optimizer of `kind` (0 SGD with momentum, 1 AdamW, 2 AdamW with AMSGrad,
// 3 LAMB) over `arena`.
template <class F>
void with_optimizer(int kind, Arena& arena, const F& f) {
  switch (kind) {
    case 0: {
      optim::SGD opt(arena, {.lr = 0.1, .momentum = 0.9});
      f(opt);
      break;
    }
    case 1: {
      optim::AdamW opt(arena, {.lr = 1e-2});
      f(opt);
      break;
    }
    case 2: {
      optim::AdamW opt(arena, {.lr = 1e-2, .amsgrad = true});
      f(opt);
      break;
    }
    default: {
      optim::LAMB opt(arena, {.lr = 1e-2});
      f(opt);
      break;
    }
  }
}

}  // namespace

TEST_CASE("load_state_dict refuses tensors of parameters or states it does not have (random)") {
  tk::PhiloxStream rng(0xb16, 5);
  for (int trial = 0; trial < 24; ++trial) {
    const int kind = trial % 4;
    const int n = 1 + static_cast<int>(rng.next_u32() % 5);
    CAPTURE(trial);
    CAPTURE(kind);
    CAPTURE(n);
    const std::vector<std::string> names = random_names(rng, n);
    // A bigger model: the same parameters plus one, at a random place, its name with dots.
    std::vector<std::string> bigger = names;
    const std::string extra = "h." + std::to_string(n + 3) + ".attn.c_attn.weight";
    bigger.insert(bigger.begin() + static_cast<std::ptrdiff_t>(rng.next_u32() % (n + 1)), extra);
    std::map<std::string, std::int64_t> sizes;
    for (const std::string& name : bigger)
      sizes[name] = static_cast<std::int64_t>(1 + rng.next_u32() % 9);
    Arena small_arena, big_arena;
    build(small_arena, names, sizes);
    build(big_arena, bigger, sizes);

    tk::StateDict big_sd, small_sd;
    with_optimizer(kind, big_arena, [&](auto& opt) {
      opt.step(pool());
      opt.step(pool());
      big_sd = opt.state_dict();
    });
    with_optimizer(kind, small_arena, [&](auto& opt) {
      opt.step(pool());
      small_sd = opt.state_dict();
    });
    with_optimizer(kind, small_arena, [&](auto& opt) {
      const tk::StateDict before = opt.state_dict();
      const auto unchanged = [&] {
        const tk::StateDict now = opt.state_dict();
        CHECK(now.values == before.values);
        for (const auto& [key, t] : before.tensors)
          CHECK(std::memcmp(now.tensor(key).data(), t.data(), t.bytes()) == 0);
      };
      // The bigger model's state holds the extra parameter's states: refused, naming it.
      const std::string first_state = kind == 0 ? "momentum_buffer" : "exp_avg";
      const std::string want = "'" + extra + "." + first_state + "', the " + first_state +
                               " of a parameter '" + extra +
                               "' that this optimizer's arena does not have";
      CHECK_THROWS_WITH_AS(opt.load_state_dict(big_sd), doctest::Contains(want.c_str()), tk::Error);
      unchanged();
      // One stray tensor: a parameter the arena lacks (only its step), a state this optimizer
      // does not keep, or a key with bytes a message must escape.
      struct Stray {
        std::string key;
        const char* message;
      };
      const std::string some = names[rng.next_u32() % names.size()];
      const Stray strays[] = {
          {"ghost.step", "'ghost.step', the step of a parameter 'ghost'"},
          {some + ".bogus", "which is not '<parameter>.<state>' for a state this optimizer keeps"},
          {some + ".exp_avg_sqq", "which is not '<parameter>.<state>'"},
          {"h.0\n.exp_avg\x01", "'h.0\\x0a.exp_avg\\x01', which is not"},
          {some.substr(0, some.rfind('.')) + ".step", "the step of a parameter 'h."}};
      for (const Stray& s : strays) {
        CAPTURE(s.key);
        tk::StateDict d = small_sd;
        d.tensors.emplace(s.key, tk::AnyTensor(tk::DType::kF32, tk::Shape{}));
        CHECK_THROWS_WITH_AS(opt.load_state_dict(d), doctest::Contains(s.message), tk::Error);
        unchanged();
      }
      // Its own state, dots in every name, loads.
      CHECK_NOTHROW(opt.load_state_dict(small_sd));
      CHECK(opt.step_count() == 1);
    });
  }
}

namespace {
/// The largest |x - y| over the arena's buffers divided by the largest |y| (0 for all-zero y).
double buffer_error(const float* x, const float* y, std::int64_t n) {
  double worst = 0.0, largest = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(double(x[i]) - y[i]));
    largest = std::max(largest, std::abs(double(y[i])));
  }
  return largest == 0.0 ? worst : worst / largest;
}
}  // namespace

TEST_CASE("LAMB: folded clipping and unscale_ + clip_grad_norm_ equal clipping first (random)") {
  // apex's FusedLAMB measures the gradients it is given: after torch's clip_grad_norm_ its own
  // max_grad_norm sees the clipped norm. The reference here clips first (clip_grad_norm_, no
  // scaler), then steps. Folded clipping (ClipGradNorm, with or without a loss scaler) and a step
  // after scaler.unscale_ + clip_grad_norm_ must agree with it; both used to divide the clipped
  // gradients once more by the unclipped norm / max_grad_norm.
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> dim(1, 40);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const double max_grad_norms[] = {0.0, 0.5, 1.0, 4.0};
  const double clip_norms[] = {0.3, 1.0, 3.0};
  for (int trial = 0; trial < 12; ++trial) {
    const double max_grad_norm = max_grad_norms[trial % 4];
    const double clip = clip_norms[trial % 3];
    const bool scaled = trial % 2 == 1;
    CAPTURE(trial);
    CAPTURE(max_grad_norm);
    CAPTURE(clip);
    Arena a, b, c;  // folded, unscale_ + clip_grad_norm_ (scaled trials), reference
    const int count = 1 + trial % 4;
    for (int k = 0; k < count; ++k) {
      const tk::Shape shape{dim(gen), dim(gen)};
      for (Arena* x : {&a, &b, &c}) x->add("w" + std::to_string(k), shape);
    }
    for (Arena* x : {&a, &b, &c}) {
      x->add("bias", tk::Shape{5});
      x->finalize();
    }
    for (std::int64_t i = 0; i < a.buffer_numel(); ++i)
      a.params_data()[i] = b.params_data()[i] = c.params_data()[i] =
          a.padding_mask().real(i) ? uniform(gen) : 0.0f;
    const optim::LAMBOptions o{.lr = 1e-2, .weight_decay = 0.1, .max_grad_norm = max_grad_norm};
    const std::vector<optim::GroupRule> groups{optim::no_weight_decay({"bias"})};
    optim::LAMB folded(a, o, groups), unscaled_first(b, o, groups), reference(c, o, groups);
    // A power of two: the scaled gradients unscale exactly to the reference's.
    constexpr float kScale = 1024.0f;
    optim::DynamicScaler sa(pool(), {.init_scale = kScale});
    optim::DynamicScaler sb(pool(), {.init_scale = kScale});
    for (int t = 0; t < 10; ++t) {
      // Gradient norms from far below to far above both thresholds.
      const float magnitude = std::pow(10.0f, static_cast<float>(t % 5) - 2.0f);
      for (std::int64_t i = 0; i < a.buffer_numel(); ++i) {
        c.grads_data()[i] = a.padding_mask().real(i) ? uniform(gen) * magnitude : 0.0f;
        a.grads_data()[i] = b.grads_data()[i] = c.grads_data()[i] * (scaled ? kScale : 1.0f);
      }
      optim::clip_grad_norm_(pool(), c, clip);
      reference.step(pool());
      if (scaled) {
        folded.step(pool(), sa, {.max_norm = clip});
        optim::clip_grad_norm_(pool(), b, clip, sb.unscale_(pool(), b));
        unscaled_first.step(pool(), sb);
        sa.update(pool());
        sb.update(pool());
      } else {
        folded.step(pool(), {.max_norm = clip});
      }
    }
    const std::int64_t n = a.buffer_numel();
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      CAPTURE(state);
      CHECK(buffer_error(a.state(state).data(), c.state(state).data(), n) <= 1e-5);
      if (scaled) CHECK(buffer_error(b.state(state).data(), c.state(state).data(), n) <= 1e-5);
    }
    CHECK(buffer_error(a.params_data(), c.params_data(), n) <= 1e-5);
    if (scaled) CHECK(buffer_error(b.params_data(), c.params_data(), n) <= 1e-5);
  }
}

TEST_CASE("SGD: an infinite momentum is refused by the constructor and by load_state_dict") {
  Fixture f;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(optim::SGD(f.arena, {.momentum = kInf}),
                       doctest::Contains("momentum must be finite and >= 0, got inf"), tk::Error);
  CHECK_THROWS_WITH_AS(optim::SGD(f.arena, {.momentum = -0.5}),
                       doctest::Contains("momentum must be finite and >= 0, got -0.5"), tk::Error);
  optim::SGD opt(f.arena, {.lr = 0.1, .momentum = 0.9});
  run_steps(f, opt, 3);
  const std::vector<float> before(f.arena.params_data(),
                                  f.arena.params_data() + f.arena.buffer_numel());
  for (const double bad : {kInf, -kInf, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    tk::StateDict sd = opt.state_dict();
    sd.set("momentum", bad);
    CHECK_THROWS_WITH_AS(opt.load_state_dict(sd), doctest::Contains("momentum"), tk::Error);
  }
  CHECK(opt.step_count() == 3);
  optest::load_grads(f.arena, 4);
  opt.step(pool());
  for (std::int64_t i = 0; i < f.arena.buffer_numel(); ++i)
    REQUIRE(std::isfinite(f.arena.params_data()[i]));
  CHECK(f.arena.params_data()[0] != before[0]);
}

TEST_CASE("load_state_dict shows names and keys from a file escaped and bounded (random)") {
  Fixture f;
  optim::AdamW opt(f.arena, {});
  run_steps(f, opt, 2);
  const tk::StateDict good = opt.state_dict();
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> byte(1, 255);
  const auto text = [&](std::size_t n) {
    std::string s = "\n\x1b[1m";
    while (s.size() < n) s += static_cast<char>(byte(gen));
    return s;
  };
  const auto message_of = [&](const tk::StateDict& sd) {
    std::string message;
    try {
      opt.load_state_dict(sd);
    } catch (const tk::Error& e) {
      message = e.what();
    }
    return message;
  };
  // At most 200 bytes of each string from the file, each byte at most 4 characters (\xNN).
  const auto readable = [](const std::string& m) {
    return !m.empty() && m.size() < 2500 && std::none_of(m.begin(), m.end(), [](char c) {
      return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f;
    });
  };
  for (const std::size_t n : {std::size_t{8}, std::size_t{300}, std::size_t{6000}}) {
    CAPTURE(n);
    tk::StateDict sd = good;
    sd.set("optimizer", text(n));
    std::string m = message_of(sd);
    CHECK(m.find("the state is from \\x0a\\x1b[1m") != std::string::npos);
    CHECK(readable(m));
    for (const char* suffix : {".exp_avg", ".unknown"}) {
      sd = good;
      sd.tensors.emplace(text(n) + suffix, tk::AnyTensor(tk::DType::kF32, tk::Shape{1}));
      m = message_of(sd);
      CHECK(m.find("the state holds tensor '\\x0a\\x1b[1m") != std::string::npos);
      CHECK(readable(m));
    }
  }
  CHECK(opt.step_count() == 2);
}
