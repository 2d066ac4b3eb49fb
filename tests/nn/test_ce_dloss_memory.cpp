// Tests of SoftmaxCrossEntropy::backward with dloss read from memory (a loss scaler's
// scale_data()): the same bits as the value overload for random shapes, scales and ignored rows,
// the value the memory holds when the backward runs (not when it was set up), and a null pointer
// is an error.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <trainkit/core/tensor_view.hpp>
#include <trainkit/error.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/cross_entropy.hpp>
#include <trainkit/optim/grad_scaler.hpp>

namespace {
namespace tk = trainkit;
namespace nn = trainkit::nn;

TEST_CASE("SoftmaxCrossEntropy::backward: dloss from memory equals dloss by value") {
  const tk::exec::Host& exec = tk::exec::Host::default_instance();
  std::mt19937 rng(12);
  for (int trial = 0; trial < 100; ++trial) {
    const std::int64_t n = 1 + rng() % 33, v = 1 + rng() % 70;
    std::vector<float> logits(static_cast<std::size_t>(n * v));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& x : logits) x = normal(rng);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(n));
    for (auto& t : targets) t = rng() % 7 == 0 ? -100 : std::int32_t(rng() % v);
    const float dloss = std::ldexp(1.0f, int(rng() % 30) - 5) * (0.5f + float(rng() % 100) / 99);
    nn::SoftmaxCrossEntropy<> ce;
    nn::SoftmaxCrossEntropy<>::Context ctx;
    float loss = 0.0f;
    const auto lv = tk::make_view(logits.data(), {n, v});
    const auto tv = tk::make_view(targets.data(), {n});
    ce.forward(exec, ctx, lv, tv, tk::make_view(&loss, {1}));
    std::vector<float> by_value(logits.size()), from_memory(logits.size(), 7.0f);
    ce.backward(exec, ctx, lv, tv, tk::make_view(by_value.data(), {n, v}), dloss);
    ce.backward(exec, ctx, lv, tv, tk::make_view(from_memory.data(), {n, v}), &dloss);
    CHECK(std::memcmp(by_value.data(), from_memory.data(), by_value.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("SoftmaxCrossEntropy::backward: a loss scaler's scale_data(), and a null pointer") {
  const tk::exec::Host& exec = tk::exec::Host::default_instance();
  std::vector<float> logits = {0.1f, -2.0f, 3.0f, 0.5f, 0.5f, 0.5f};
  std::vector<std::int64_t> targets = {2, 0};
  const auto lv = tk::make_view(logits.data(), {2, 3});
  const auto tv = tk::make_view(targets.data(), {2});
  nn::SoftmaxCrossEntropy<> ce;
  nn::SoftmaxCrossEntropy<>::Context ctx;
  float loss = 0.0f;
  ce.forward(exec, ctx, lv, tv, tk::make_view(&loss, {1}));
  tk::optim::DynamicScaler scaler(exec, {.init_scale = 1024.0});
  std::vector<float> a(6), b(6);
  ce.backward(exec, ctx, lv, tv, tk::make_view(a.data(), {2, 3}), scaler.scale_data());
  ce.backward(exec, ctx, lv, tv, tk::make_view(b.data(), {2, 3}), 1024.0f);
  CHECK(a == b);
  CHECK_THROWS_WITH_AS(ce.backward(exec, ctx, lv, tv, tk::make_view(a.data(), {2, 3}),
                                   static_cast<const float*>(nullptr)),
                       doctest::Contains("dloss is a null pointer"), tk::Error);
}

}  // namespace
