// Tests of optim::StepResult, what an optimizer step returns: the gradient norm it computed
// (the same bits as a separate optim::grad_norm pass, with no second pass) and whether a loss
// scaler made it skip; random sizes, scales and injected inf/NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <trainkit/exec/host.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/grad_norm.hpp>
#include <trainkit/optim/grad_scaler.hpp>
#include <trainkit/optim/sgd.hpp>

namespace {
namespace tk = trainkit;
namespace optim = trainkit::optim;

const tk::exec::Host& pool() { return tk::exec::Host::default_instance(); }

struct Model {
  tk::nn::ParamArena<> arena;
  std::vector<tk::nn::ParamId> ids;
  Model(std::mt19937& rng, int tensors) {
    for (int t = 0; t < tensors; ++t)
      ids.push_back(arena.add(tk::detail::concat("p", t), tk::Shape{1 + std::int64_t(rng() % 300)},
                              tk::nn::Init::normal()));
    arena.finalize();
    arena.initialize(rng());
  }
  /// Random gradients times `scale`; returns the float64 norm of the unscaled ones.
  double fill_grads(std::mt19937& rng, float scale) {
    std::normal_distribution<float> n;
    double sumsq = 0.0;
    for (auto id : ids) {
      auto g = arena.grad<1>(id);
      for (std::int64_t i = 0; i < g.size(0); ++i) {
        const float v = n(rng);
        g(i) = v * scale;
        sumsq += double(v) * v;
      }
    }
    return std::sqrt(sumsq);
  }
  std::vector<float> params() const {
    const float* p = arena.params_data();
    return std::vector<float>(p, p + arena.buffer_numel());
  }
};

TEST_CASE("StepResult: the norm of the step, bit for bit what a separate pass computes") {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 40; ++trial) {
    Model m(rng, 1 + int(rng() % 6));
    optim::AdamW<> opt(m.arena, {.lr = 1e-3});
    const double want = m.fill_grads(rng, 1.0f);
    const float separate = optim::grad_norm(pool(), m.arena).get();
    const bool clip = trial % 2 == 0;
    const optim::StepResult r =
        opt.step(pool(), optim::ClipGradNorm{.max_norm = clip ? 0.5 : 0.0, .report_norm = !clip});
    REQUIRE(r.grad_norm.valid());
    const float got = r.grad_norm.get();
    CHECK(std::memcmp(&got, &separate, sizeof got) == 0);
    CHECK(std::fabs(got - want) <= 1e-5 * want);
    CHECK_FALSE(r.skipped());
  }
}

TEST_CASE("StepResult: no norm is computed when nothing asks for one") {
  std::mt19937 rng(3);
  Model m(rng, 3);
  optim::SGD<> opt(m.arena, {.lr = 0.1});
  m.fill_grads(rng, 1.0f);
  const optim::StepResult r = opt.step(pool());
  CHECK_FALSE(r.grad_norm.valid());
  CHECK(r.found_inf == nullptr);
  CHECK_FALSE(r.skipped());
}

TEST_CASE("StepResult: a loss scaler's skipped steps are reported, with the unscaled norm") {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 30; ++trial) {
    Model m(rng, 1 + int(rng() % 4));
    optim::AdamW<> opt(m.arena, {.lr = 1e-2});
    optim::DynamicScaler scaler(pool(), {.init_scale = std::ldexp(1.0, int(rng() % 20))});
    const double want = m.fill_grads(rng, scaler.scale());
    const bool poison = trial % 3 == 0;
    if (poison) {
      auto g = m.arena.grad<1>(m.ids[rng() % m.ids.size()]);
      g(0) = trial % 2 ? std::numeric_limits<float>::infinity()
                       : std::numeric_limits<float>::quiet_NaN();
    }
    const std::vector<float> before = m.params();
    const optim::StepResult r = opt.step(pool(), scaler, optim::ClipGradNorm{.max_norm = 1.0});
    CHECK(r.skipped() == poison);
    CHECK((m.params() == before) == poison);
    REQUIRE(r.grad_norm.valid());
    if (!poison) CHECK(std::fabs(r.grad_norm.get() - want) <= 1e-5 * want);
    scaler.update(pool());
  }
}

}  // namespace
